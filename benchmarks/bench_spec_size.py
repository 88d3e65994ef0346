"""Whether `job_apply` costs more in a bigger spec: the job spec beside a wide one.

Run: `python benchmarks/bench_spec_size.py [--dsn DSN] [--seconds S] [--rounds R]`
(DSN defaults to $FSMC_PG_DSN, then postgresql://postgres@127.0.0.1:5432/postgres).
Needs psycopg 3 and `pgbench`.

The wide spec is specs/job.yaml with 40 more states, chained by a `step` event, and
five events that lead from any state but the lease states (`from: "*"` with
`except`): 266 transitions once expanded, against the job spec's 11, with
the same tables, lease and cycle. Each is installed as bench_db.py installs one,
and pgbench runs bench_db.py's `apply` script (claim, start, reclaim) on each, at
one client, in an order rotated round by round. Figures are medians; the ratio is
the median of per-round ratios of server CPU per transition, with the lowest and
highest round.

Target: the wide spec's `job_apply` within 1.15x the job spec's. Before ab60332,
`_apply` joined the row to all of the spec's transitions as a VALUES list, scanned
on every call: 1.33x (rounds 1.31-1.39) with this script; at ab60332, 1.00x
(0.94-1.01).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_db  # noqa: E402

from fsmc import pipeline, source  # noqa: E402
from fsmc.model import Machine  # noqa: E402

EXTRA_STATES = 40
WILDCARDS = {"nudge": "queued", "hold": "s01", "kick": "s02", "poke": "s03", "note": "s04"}
TARGET = 1.15


def wide_spec(extra: int = EXTRA_STATES) -> str:
    """specs/job.yaml with `extra` more states chained by `step` (the last leads back
    to queued) and WILDCARDS, each from every state but the lease states."""
    base = (ROOT / "specs" / "job.yaml").read_text(encoding="utf-8")
    states = [f"s{i:02d}" for i in range(1, extra + 1)]
    text = base.rstrip("\n") + "\n"
    state_lines = "".join(f"  {s}: a filler state\n" for s in states)
    text = text.replace("\nterminals:", "\n" + state_lines.rstrip("\n") + "\nterminals:", 1)
    event_lines = "".join(f"  {e}: a filler event\n" for e in ["step", *WILDCARDS])
    text = text.replace("\nevents:\n", "\nevents:\n" + event_lines, 1)
    moves = [f"  - {{from: {a}, event: step, to: {b}}}" for a, b in zip(states, [*states[1:], "queued"], strict=True)]
    moves += [f"  - {{from: \"*\", except: [claimed, running], event: {e}, to: {t}}}" for e, t in WILDCARDS.items()]
    return text.replace("\ntransitions:\n", "\ntransitions:\n" + "\n".join(moves) + "\n", 1)


def machine_of(text: str, name: str) -> Machine:
    checked = pipeline.check(source.Source(name, name, text.encode()))
    if not checked.ok() or checked.machine is None:
        raise SystemExit(f"the {name} spec does not check: {checked.diagnostics}")
    return checked.machine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=bench_db.DEFAULT_DSN)
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    program = bench_db.pgbench_or_exit()

    machines = {"job": bench_db.JOB, "wide": machine_of(wide_spec(), "wide.yaml")}
    sizes = {name: len(m.edges) for name, m in machines.items()}
    run = uuid.uuid4().hex[:8]
    print(f"{bench_db.machine_line()}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())};"
          f" {args.rounds} round(s) of {args.seconds:g} s per spec, pgbench -M prepared, 1 client,"
          f" synchronous_commit=on\n")  # fmt: skip
    made: list[str] = []
    tps: dict[str, list[float]] = {name: [] for name in machines}
    cpu: dict[str, list[float]] = {name: [] for name in machines}
    try:
        with tempfile.TemporaryDirectory(prefix="fsmc_size_") as folder:
            benches = {}
            for name, machine in machines.items():
                schema = f"fsmc_size_{run}_{name}"
                bench_db.setup(args.dsn, schema, machine)
                made.append(schema)
                benches[name] = bench_db.Pgbench(args.dsn, schema, Path(folder), program)
            names = list(machines)
            for r in range(args.rounds):
                for name in names[r % 2:] + names[: r % 2]:
                    rate, used = benches[name].run("apply", 1, args.seconds)
                    tps[name].append(rate)
                    if used is not None:
                        cpu[name].append(used)
    finally:
        for schema in made:
            bench_db.teardown(args.dsn, schema)

    for name in machines:
        line = f"{name:<6}{sizes[name]:>5} transitions {statistics.median(tps[name]):>8,.0f} tps"
        if len(cpu[name]) == args.rounds:
            line += f"  {statistics.median(cpu[name]):>6.1f} us CPU/transition"
        print(line)
    if len(cpu["wide"]) != args.rounds or len(cpu["job"]) != args.rounds:
        print("\n(server CPU not readable here: the server is not on this machine)")
        rs = bench_db.ratios(tps["job"], tps["wide"])
        label = "throughput, job / wide"
    else:
        rs = bench_db.ratios(cpu["wide"], cpu["job"])
        label = "server CPU per transition, wide / job"
    ok = statistics.median(rs) <= TARGET
    print(f"\n{label}: {statistics.median(rs):.2f}x (rounds {min(rs):.2f}-{max(rs):.2f})"
          f"   target <= {TARGET}x  {'PASS' if ok else 'MISS'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
