"""What each of the schema's promises costs `job_apply`, one by one (issue 13).

Run: `python benchmarks/bench_enforcement.py [--dsn DSN] [--seconds S] [--rounds R]
[--connections C]` (DSN defaults to $FSMC_PG_DSN, then
postgresql://postgres@127.0.0.1:5432/postgres). Needs psycopg 3 and `pgbench`.

bench_db.py sets `job_apply` against a hand-written function doing the same work
with no checks. This script says where the difference goes. Each variant below is
its own scratch schema, installed as bench_db.py installs one (a non-superuser
owner, the application role with the README's grants, the writer role). A
superuser then takes one piece of enforcement out of it. The pieces are:

- as built: nothing taken out;
- the state CHECK on the table;
- the triple CHECK on the event log;
- the guard (the BEFORE UPDATE trigger refusing edges the spec lacks);
- the commit-time checks (the deferred triggers on both tables);
- `job_apply`'s settings (its pinned search_path and enable_seqscan);
- all of the above at once.

A copy without a piece breaks a promise, so these copies are for measuring only.
pgbench then runs `job_apply` on each (bench_db.py's script, at C clients) in an
order rotated round by round, and `job_apply_unchecked` on the as-built schema's
bare tables as the floor. Each line gives transactions per second and server CPU
per transition, as medians over rounds, and what taking the piece out saves
against as built (the median of per-round differences).

The pieces do not add up: whatever a table costs for having any CHECK or any
trigger at all is saved only when the last one goes. Nothing here is a target.
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
import psycopg  # noqa: E402

from fsmc.targets.postgres.names import Names  # noqa: E402

N = Names.of(bench_db.JOB).sql
APPLY = f"{N.apply}(uuid, text, bigint, text, jsonb, text)"

# What each variant takes out, as statements run by a superuser in its schema.
STATE_CHECK = [f"ALTER TABLE {N.table} DROP CONSTRAINT {N.state_check}"]
TRIPLE_CHECK = [f"ALTER TABLE {N.events_table} DROP CONSTRAINT {N.triple_check}"]
GUARD = [f"DROP TRIGGER {N.guard_update} ON {N.table}"]
COMMIT_CHECKS = [f"DROP TRIGGER {N.logged_check} ON {N.table}",
                 f"DROP TRIGGER {N.check_event} ON {N.events_table}"]  # fmt: skip
SETTINGS = [f"ALTER FUNCTION {APPLY} RESET ALL"]
VARIANTS = {
    "as built": [],
    "- state CHECK": STATE_CHECK,
    "- triple CHECK": TRIPLE_CHECK,
    "- guard trigger": GUARD,
    "- commit-time checks": COMMIT_CHECKS,
    "- apply's settings": SETTINGS,
    "- all of these": STATE_CHECK + TRIPLE_CHECK + GUARD + COMMIT_CHECKS + SETTINGS,
}
FLOOR = "unchecked function"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=bench_db.DEFAULT_DSN)
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=1)
    args = parser.parse_args(argv)
    program = bench_db.pgbench_or_exit()

    run = uuid.uuid4().hex[:8]
    schemas = {name: f"fsmc_enf_{run}_{i}" for i, name in enumerate(VARIANTS)}
    print(f"{bench_db.machine_line()}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())};"
          f" {args.rounds} round(s) of {args.seconds:g} s per variant, pgbench -M prepared,"
          f" {args.connections} client(s), synchronous_commit=on\n")  # fmt: skip
    made: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="fsmc_enf_") as folder:
            benches = {}
            for name, statements in VARIANTS.items():
                schema = schemas[name]
                bench_db.setup(args.dsn, schema, bench_db.JOB)
                made.append(schema)
                with psycopg.connect(args.dsn, autocommit=True) as conn:
                    conn.execute(f"SET search_path TO {schema}")
                    for statement in statements:
                        conn.execute(statement.encode())
                benches[name] = bench_db.Pgbench(args.dsn, schema, Path(folder), program)
            runs = [(name, "apply") for name in VARIANTS] + [(FLOOR, "function")]
            tps: dict[str, list[float]] = {name: [] for name, _ in runs}
            cpu: dict[str, list[float]] = {name: [] for name, _ in runs}
            for r in range(args.rounds):
                for name, method in runs[r % len(runs):] + runs[: r % len(runs)]:
                    bench = benches["as built" if name == FLOOR else name]
                    rate, used = bench.run(method, args.connections, args.seconds)
                    tps[name].append(rate)
                    if used is not None:
                        cpu[name].append(used)
    finally:
        for schema in made:
            bench_db.teardown(args.dsn, schema)

    has_cpu = all(len(v) == args.rounds for v in cpu.values())
    print(f"{'':<24}{'tps':>8}" + (f"{'CPU us/tr':>12}{'saves':>16}" if has_cpu else ""))
    for name, _ in runs:
        line = f"{name:<24}{statistics.median(tps[name]):>8,.0f}"
        if has_cpu:
            line += f"{statistics.median(cpu[name]):>12.1f}"
            if name != "as built":
                saved = [b - a for a, b in zip(cpu[name], cpu["as built"], strict=True)]
                share = statistics.median(saved) / statistics.median(cpu["as built"])
                line += f"{statistics.median(saved):>9.1f} us{share:>5.0%}"
        print(line)
    print(f"\n(load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
