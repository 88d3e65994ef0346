"""What pinning every function's search_path costs `job_apply` (issue 8).

Run: `python benchmarks/bench_pin.py [--dsn DSN] [--seconds S] [--rounds R]`
(DSN defaults to $FSMC_PG_DSN, then postgresql://postgres@127.0.0.1:5432/postgres).

Two scratch schemas get the same generated `job.sql` (benchmarks/bench_db.py's
setup: installed by a non-superuser owner, called as an application role). In
one, every function stays as built: pinned to `pg_catalog, <schema>, pg_temp`. In
the other, the pins are taken back to what fsmc built before issue 8: `SET
search_path FROM CURRENT` (the schema alone) on the functions that read tables,
and nothing on the other trigger functions. `job_apply` is then timed on
both, side by side, at 1 and 8 connections, in an order rotated round by round
(bench_db's worker and measure: one process per connection, each transition its
own transaction). Figures are medians; the ratio is the median of per-round
ratios, with the lowest and highest round. When the server runs on this machine,
the server CPU time per transition (from /proc) is compared too: on a shared,
noisy machine it moves far less than throughput. Target: pinning costs at most 3%
(pinned >= 0.97x unpinned in throughput, <= 1.03x in CPU per transition).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
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

CONNECTIONS = (1, 8)
# The functions that carried `SET search_path FROM CURRENT` before issue 8.
PINNED_BEFORE = ("apply", "heartbeat", "reclaim", "check_logged", "check_event")


def unpin(dsn: str, schema: str) -> None:
    """Take the schema's functions back to their settings before issue 8."""
    machine = bench_db.job_machine()
    before = {getattr(Names.of(machine), f) for f in PINNED_BEFORE}  # raw, as pg_proc holds them
    with psycopg.connect(dsn, autocommit=True) as conn:
        functions = conn.execute(
            "SELECT p.oid::regprocedure::text, p.proname FROM pg_proc AS p"
            " JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = %s",
            (schema,)).fetchall()  # fmt: skip
        conn.execute(f"SET search_path TO {schema}")
        for signature, name in functions:
            conn.execute(f"ALTER FUNCTION {signature} RESET search_path")
            if name in before:
                conn.execute(f"ALTER FUNCTION {signature} SET search_path FROM CURRENT")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=bench_db.DEFAULT_DSN)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    tag = uuid.uuid4().hex[:12]
    schemas = {"pinned": f"fsmc_bench_pin_{tag}", "unpinned": f"fsmc_bench_unpin_{tag}"}
    print(f"nproc={os.cpu_count()}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())};"
          f" {args.rounds} rounds of {args.seconds:g} s per (variant, connections)\n")  # fmt: skip
    tps: dict[tuple[str, int], list[float]] = {(v, c): [] for v in schemas for c in CONNECTIONS}
    cpu: dict[tuple[str, int], list[float]] = {(v, c): [] for v in schemas for c in CONNECTIONS}
    try:
        for schema in schemas.values():
            bench_db.setup(args.dsn, schema, bench_db.job_machine())
        unpin(args.dsn, schemas["unpinned"])
        pairs = list(tps)
        for r in range(args.rounds):
            shift = r % len(pairs)
            for variant, conns in pairs[shift:] + pairs[:shift]:
                rate, used = bench_db.measure(args.dsn, schemas[variant], "apply", conns, args.seconds)
                tps[variant, conns].append(rate)
                if used is not None:
                    cpu[variant, conns].append(used)
    finally:
        for schema in schemas.values():
            bench_db.teardown(args.dsn, schema)

    has_cpu = all(len(v) == args.rounds for v in cpu.values())
    print(f"{'job_apply/s':<12}" + "".join(f"{f'{c} conn':>12}" for c in CONNECTIONS)
          + ("   server CPU us/transition" if has_cpu else ""))  # fmt: skip
    for variant in schemas:
        cells = "".join(f"{statistics.median(tps[variant, c]):>12,.0f}" for c in CONNECTIONS)
        if has_cpu:
            cells += "   " + " ".join(f"{statistics.median(cpu[variant, c]):>6.0f}" for c in CONNECTIONS)
        print(f"{variant:<12}{cells}")
    ok = True
    for c in CONNECTIONS:
        rs = [a / b for a, b in zip(tps["pinned", c], tps["unpinned", c], strict=True)]
        print(f"throughput, pinned / unpinned at {c} conn: {statistics.median(rs):.3f}x"
              f" (rounds {min(rs):.2f}-{max(rs):.2f})")  # fmt: skip
        if has_cpu:
            us = [a / b for a, b in zip(cpu["pinned", c], cpu["unpinned", c], strict=True)]
            passed = statistics.median(us) <= 1.03
            print(f"server CPU per transition, pinned / unpinned at {c} conn: {statistics.median(us):.3f}x"
                  f" (rounds {min(us):.2f}-{max(us):.2f})   target <= 1.03x  {'PASS' if passed else 'MISS'}")  # fmt: skip
        else:
            passed = statistics.median(rs) >= 0.97
            print(f"  target >= 0.97x  {'PASS' if passed else 'MISS'}")
        ok = ok and passed
    print(f"(load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
