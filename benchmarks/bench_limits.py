"""Capacity limits (issue 22): what `limits: {running: 50}` costs a move into the state.

Three schemas of one small machine (queued -> running -> queued or done), each in
its own PostgreSQL schema, measured side by side in interleaved rounds through a
Python client (psycopg), at 1 and 8 clients:

- `limited`: the spec with `limits: {running: 50}` (its slots, the trigger);
- `unlimited`: the same spec without limits (its `.sql` has no table, no trigger);
- `advisory`: the unlimited schema, with the limit kept by hand as people write it
  today: `pg_advisory_xact_lock` on the state, then `count(*)` of its rows, then the
  move, in one transaction.

The moves: each client owns its rows and loops `start` (queued -> running, one
transaction) then `requeue` (running -> queued, another), by `<machine>_apply`, so
each round trip enters and leaves `running` once; with 8 clients at most 8 rows are
in `running`, so nothing is ever refused and the figure is the cost of keeping the
limit. The claims: 8 workers loop `_claim('start', max_rows => 1)` then `requeue`
over a shared pool of rows, limited (50) beside unlimited; the issue's target is at
least 80% of the unlimited throughput.

Figures are transitions per second (each start or requeue counts one), the median
of the per-round ratios with the lowest and highest round. `--quick` is a smoke run;
`--claims-only` measures only the claims (the issue's target), in as many rounds.
Run: `python benchmarks/bench_limits.py [--dsn DSN] [--seconds 3] [--rounds 3] [--claims-only]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_db  # noqa: E402

from fsmc import pipeline, source  # noqa: E402
from fsmc.model import Machine  # noqa: E402
from fsmc.targets.postgres.build import build, emit  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
SPEC = """\
fsmc: 1
machine: lim
initial: queued
states: [queued, running, done]
terminals: [done]
events: [start, requeue, finish]
transitions:
  - {from: queued, event: start, to: running}
  - {from: running, event: requeue, to: queued}
  - {from: running, event: finish, to: done}
postgres: {id_type: bigint}
"""
LIMIT = 50
ROWS_PER_CLIENT = 20
POOL = 400  # rows the claim workers share


def machine(limited: bool) -> Machine:
    text = SPEC + (f"limits:\n  running: {LIMIT}\n" if limited else "")
    checked = pipeline.check(source.Source("lim.yaml", "lim.yaml", text.encode()))
    assert checked.machine is not None and checked.ok(), checked.diagnostics
    return checked.machine


def setup(dsn: str, schema: str, m: Machine) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"'.encode())
    with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        conn.execute(emit(build(m)).encode())
        conn.commit()


def teardown(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        writer = admin.execute(f'SELECT "{schema}".lim_fsmc_writer()'.encode()).fetchone()
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE'.encode())
        if writer is not None:
            admin.execute(f'DROP OWNED BY "{writer[0]}"'.encode())
            admin.execute(f'DROP ROLE "{writer[0]}"'.encode())


Step = Callable[[psycopg.Connection[Any], list[list[int]]], int]


def apply_step(advisory: bool) -> Step:
    """One client's loop body over its own rows: start then requeue each; moves made."""

    def step(conn: psycopg.Connection[Any], rows: list[list[int]]) -> int:
        for row in rows:
            row_id, version = row
            if advisory:
                conn.execute(b"SELECT pg_advisory_xact_lock(hashtext('lim:running'))")
                held = conn.execute(b"SELECT count(*) FROM lims WHERE state = 'running'").fetchone()
                assert held is not None and held[0] < LIMIT
            got = conn.execute(b"SELECT lim_apply(%s, 'start', %s, 'bench')", (row_id, version)).fetchone()
            conn.commit()
            assert got is not None and got[0] == version + 1
            got = conn.execute(b"SELECT lim_apply(%s, 'requeue', %s, 'bench')", (row_id, version + 1)).fetchone()
            conn.commit()
            assert got is not None
            row[1] = version + 2
        return 2 * len(rows)

    return step


def claim_step(conn: psycopg.Connection[Any], rows: list[list[int]]) -> int:
    claimed = conn.execute(b"SELECT id, state_version FROM lim_claim('start', 'bench', 1)").fetchall()
    conn.commit()
    for row_id, version in claimed:
        conn.execute(b"SELECT lim_apply(%s, 'requeue', %s, 'bench')", (row_id, version))
        conn.commit()
    return 2 * len(claimed)


def measure(dsn: str, schema: str, step: Step, clients: int, seconds: float,
            own_rows: bool) -> tuple[float, float | None]:  # fmt: skip
    """Moves per second of `clients` threads, each on its own connection, running `step`,
    and the server CPU microseconds per move of their backends (None when /proc does not
    show them: a server on another machine). On a shared machine the CPU a move costs
    drifts far less than throughput, which a neighbour's burst or a slow fsync moves."""
    stop = threading.Event()
    done = [0] * clients
    used: list[float | None] = [None] * clients
    ready = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
            rows: list[list[int]] = []
            if own_rows:
                rows = [[r[0], r[1]] for r in conn.execute(
                    b"INSERT INTO lims SELECT FROM generate_series(1, %s) RETURNING id, state_version",
                    (ROWS_PER_CLIENT,))]  # fmt: skip
                conn.commit()
            before = bench_db.backend_cpu(conn.info.backend_pid)
            ready.wait()
            while not stop.is_set():
                done[index] += step(conn, rows)
            after = bench_db.backend_cpu(conn.info.backend_pid)
            used[index] = None if before is None or after is None else after - before

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    rate = sum(done) / (time.perf_counter() - start)
    cpu = None if None in used or not sum(done) else sum(u for u in used if u is not None) / sum(done) * 1e6
    return rate, cpu


def summary(label: str, a: Sequence[float], b: Sequence[float], target: float | None = None,
            unit: str = "/s") -> str:  # fmt: skip
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    line = (f"{label}: {statistics.median(ratios):.2f}x "
            f"(rounds {min(ratios):.2f}-{max(ratios):.2f}; {statistics.median(a):,.0f} vs {statistics.median(b):,.0f}{unit})")  # fmt: skip
    if target is not None:
        line += f"  target >= {target:.2f}x: {'PASS' if statistics.median(ratios) >= target else 'MISS'}"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run (0.5 s, 1 round)")
    parser.add_argument("--claims-only", action="store_true", help="only the 8 claiming workers, limited and not")
    args = parser.parse_args(argv)
    seconds, rounds = (0.5, 1) if args.quick else (args.seconds, args.rounds)
    tag = uuid.uuid4().hex[:8]
    schemas = {"limited": f"bench_limits_l_{tag}", "unlimited": f"bench_limits_u_{tag}"}
    setup(args.dsn, schemas["limited"], machine(True))
    setup(args.dsn, schemas["unlimited"], machine(False))
    try:
        for schema in schemas.values():
            with psycopg.connect(args.dsn, options=f"-c search_path={schema}") as conn:
                conn.execute(b"INSERT INTO lims SELECT FROM generate_series(1, %s)", (POOL,))
                conn.commit()
        runs: dict[tuple[str, int], list[float]] = {}
        cpus: dict[tuple[str, int], list[float | None]] = {}

        def timed(key: tuple[str, int], schema: str, step: Step, own_rows: bool) -> None:
            rate, cpu = measure(args.dsn, schema, step, key[1], seconds, own_rows)
            runs.setdefault(key, []).append(rate)
            cpus.setdefault(key, []).append(cpu)

        methods = {} if args.claims_only else {
            "limited": (schemas["limited"], apply_step(False)),
            "unlimited": (schemas["unlimited"], apply_step(False)),
            "advisory": (schemas["unlimited"], apply_step(True)),
        }
        for round_ in range(rounds):
            for clients in (1, 8):
                for name, (schema, step) in methods.items():
                    timed((name, clients), schema, step, True)
            # Each first in every other round: whatever the first of a pair pays (the
            # server's caches, a neighbour's burst) does not fall on one side only.
            for name in ("limited", "unlimited")[:: 1 if round_ % 2 == 0 else -1]:
                timed((f"claim-{name}", 8), schemas[name], claim_step, False)
        print(f"moves per second (server CPU µs per move), {rounds} round(s) of {seconds:g} s,"
              f" limit {LIMIT} on running")  # fmt: skip
        keys = [(name, clients) for clients in (1, 8) for name in methods]
        keys += [("claim-limited", 8), ("claim-unlimited", 8)]
        for name, clients in keys:
            cpu = [c for c in cpus[name, clients] if c is not None]
            print(f"  {name:>15} x{clients}: {statistics.median(runs[name, clients]):10,.0f}"
                  + (f" ({statistics.median(cpu):,.0f})" if cpu else ""))  # fmt: skip
        for clients in (1, 8) if methods else ():
            print(summary(f"limited / unlimited, {clients} client(s)", runs["limited", clients],
                          runs["unlimited", clients]))  # fmt: skip
            print(summary(f"limited / advisory lock, {clients} client(s)", runs["limited", clients],
                          runs["advisory", clients]))  # fmt: skip
        print(summary("claim into limit 50 / claim unlimited, 8 workers", runs["claim-limited", 8],
                      runs["claim-unlimited", 8], 0.8))  # fmt: skip
        for label, a, b in [(f"limited / unlimited, {clients} client(s)", ("limited", clients), ("unlimited", clients))
                            for clients in ((1, 8) if methods else ())] + [
                ("claim into limit 50 / claim unlimited, 8 workers", ("claim-limited", 8), ("claim-unlimited", 8))]:
            mine, theirs = cpus[a], cpus[b]
            if None not in mine and None not in theirs:
                print(summary(f"server CPU per move, {label}", [float(x) for x in mine if x is not None],
                              [float(x) for x in theirs if x is not None], unit=" µs"))  # fmt: skip
    finally:
        for schema in schemas.values():
            teardown(args.dsn, schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())
