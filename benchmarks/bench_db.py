"""What the database's enforcement costs: `<machine>_apply` against two hand-written paths.

Run: `python benchmarks/bench_db.py [--dsn DSN] [--seconds S] [--rounds R]`
(DSN defaults to $FSMC_PG_DSN, then postgresql://postgres@127.0.0.1:5432/postgres).
It uses this checkout's fsmc, builds specs/job.yaml, loads the .sql into a scratch
schema (dropped at the end) and needs psycopg 3.

Three ways to make one transition of the job machine, each its own transaction,
timed side by side in one run at 1 and at 8 connections (one process per
connection, so the client's GIL is not what is measured):

- apply:  `SELECT job_apply(id, event, expected_version, actor)`, autocommit: one
          round trip, every check and trigger of the generated schema on;
- cte:    one hand-written statement doing the same UPDATE (version check, lease
          columns) and INSERT as a data-modifying CTE, autocommit, on copies of the
          tables with no triggers, no CHECKs and no foreign key: the cost of
          enforcement is apply against this;
- seed:   seed 000's client-side path on those same bare copies: SELECT the row,
          compute the next state in Python, UPDATE with the version check, INSERT
          the event, COMMIT; separate statements in one transaction.

Every connection cycles its own rows (claim, start, reclaim: into the lease, within
it, out of it), so no call loses a race and all three do the same writes. psycopg
prepares each statement after its fifth use, for all three alike. A round times
each (method, connections) pair for S seconds, in an order rotated round by round,
after VACUUM; figures are medians over rounds, ratios are medians of per-round
ratios with the lowest and highest round after them. When the server runs on this
machine, each method's server CPU time per transition (from /proc) is printed too:
on a shared machine it moves far less than throughput does.

Targets (issue 3): apply >= 0.8x cte (enforcement costs at most 25%), apply >= 1.5x
seed, apply at 8 connections >= 1.6x apply at 1.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from fsmc import facts, pipeline, source  # noqa: E402
from fsmc.model import Machine  # noqa: E402
from fsmc.targets import sql as sql_target  # noqa: E402

METHODS = ("apply", "cte", "seed")
CONNECTIONS = (1, 8)
ROWS_PER_CONNECTION = 64
WARMUP = 30  # transitions per connection before timing: psycopg prepares after 5

# The cycle each row runs through, and what each step does to the lease columns.
NEXT = {"queued": ("claim", "claimed"), "claimed": ("start", "running"),
        "running": ("reclaim", "queued")}  # fmt: skip

# The same UPDATE apply makes (version check, lease bookkeeping): the claim rule's
# SET clauses from fsmc.facts, as the SQL target writes them, over a parameter.
LEASE_SET = ",\n    ".join(sql_target.claim_assignments("%(lease)s", "%(actor)s"))
CTE_SQL = f"""
WITH moved AS (
    UPDATE jobs_bare SET state = %(to)s, state_version = state_version + 1, {LEASE_SET}
    WHERE id = %(id)s AND state_version = %(version)s
    RETURNING state_version
)
INSERT INTO job_events_bare (job_id, version, from_state, event, to_state, actor)
SELECT %(id)s, state_version, %(from)s, %(event)s, %(to)s, %(actor)s FROM moved
RETURNING version"""
SEED_SELECT = "SELECT state, state_version FROM jobs_bare WHERE id = %(id)s"
SEED_UPDATE = f"""
UPDATE jobs_bare SET state = %(to)s, state_version = state_version + 1, {LEASE_SET}
WHERE id = %(id)s AND state_version = %(version)s AND state = %(from)s
RETURNING state_version"""
SEED_INSERT = """
INSERT INTO job_events_bare (job_id, version, from_state, event, to_state, actor)
VALUES (%(id)s, %(new_version)s, %(from)s, %(event)s, %(to)s, %(actor)s)"""
APPLY_SQL = "SELECT job_apply(%(id)s, %(event)s, %(version)s, %(actor)s)"


def job_machine() -> Machine:
    checked = pipeline.check(source.read(str(ROOT / "specs" / "job.yaml")))
    if not checked.ok() or checked.machine is None:
        raise SystemExit(f"specs/job.yaml does not check: {checked.diagnostics}")
    return checked.machine


JOB = job_machine()


def setup(dsn: str, schema: str, machine: Machine) -> None:
    """The generated schema, bare copies of its tables, and rows for every connection."""
    rows = ROWS_PER_CONNECTION * max(CONNECTIONS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path TO {schema}")
        conn.execute(sql_target.emit(machine))
        # Bare copies: same columns, defaults, primary keys, reclaim index and
        # fillfactor; no CHECK, no trigger, no foreign key.
        conn.execute("CREATE TABLE jobs_bare (LIKE jobs INCLUDING DEFAULTS INCLUDING INDEXES)"
                     " WITH (fillfactor = 90)")  # fmt: skip
        conn.execute("CREATE TABLE job_events_bare"
                     " (LIKE job_events INCLUDING DEFAULTS INCLUDING INDEXES)")  # fmt: skip
        for table in ("jobs", "jobs_bare"):
            conn.execute(f"INSERT INTO {table} (state) SELECT 'queued' FROM generate_series(1, {rows})")
        conn.execute("VACUUM ANALYZE")


def rows_of(conn: psycopg.Connection[Any], table: str, worker: int) -> list[list[Any]]:
    """[id, state, version] of this worker's share of `table`'s rows, in a fixed order."""
    got = conn.execute(
        f"SELECT id, state, state_version FROM {table} ORDER BY id"
        f" OFFSET {worker * ROWS_PER_CONNECTION} LIMIT {ROWS_PER_CONNECTION}"
    ).fetchall()
    return [list(r) for r in got]


def lease_change(source_state: str, target: str) -> str:
    """What a step does to the claim columns: the claim rule of fsmc.facts."""
    return facts.lease_change(JOB, source_state, target).value


def worker(dsn: str, schema: str, method: str, index: int, seconds: float,
           barrier: Barrier, results: Any) -> None:  # fmt: skip
    """One connection: warm up, wait for the others, run `method` for `seconds`."""
    with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
        table = "jobs" if method == "apply" else "jobs_bare"
        rows = rows_of(conn, table, index)
        actor = f"worker-{index}"
        cur = conn.cursor()

        def step(row: list[Any]) -> None:
            row_id, state, version = row
            event, target = NEXT[state]
            args = {"id": row_id, "event": event, "version": version, "actor": actor,
                    "from": state, "to": target, "lease": lease_change(state, target)}  # fmt: skip
            if method == "apply":
                got = cur.execute(APPLY_SQL, args).fetchone()
            elif method == "cte":
                got = cur.execute(CTE_SQL, args).fetchone()
            else:
                with conn.transaction():
                    read = cur.execute(SEED_SELECT, args).fetchone()
                    assert read is not None and tuple(read) == (state, version), read
                    got = cur.execute(SEED_UPDATE, args).fetchone()
                    assert got is not None
                    cur.execute(SEED_INSERT, {**args, "new_version": got[0]})
            if got is None or got[0] != version + 1:
                raise RuntimeError(f"{method}: transition of {row_id} at {version} got {got}")
            row[1], row[2] = target, version + 1

        for i in range(WARMUP):
            step(rows[i % len(rows)])
        backend = conn.info.backend_pid
        barrier.wait()
        done, start, cpu = 0, time.perf_counter(), backend_cpu(backend)
        deadline = start + seconds
        while time.perf_counter() < deadline:
            step(rows[done % len(rows)])
            done += 1
        elapsed, used = time.perf_counter() - start, backend_cpu(backend)
        results.put((done, elapsed, None if cpu is None or used is None else used - cpu))


def backend_cpu(pid: int) -> float | None:
    """CPU seconds a server process has used, when the server runs on this machine and
    /proc shows it (on a shared, noisy machine this varies far less than throughput)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def measure(dsn: str, schema: str, method: str, connections: int,
            seconds: float) -> tuple[float, float | None]:  # fmt: skip
    """Transitions per second of `connections` processes running `method` at once, and
    the server's CPU microseconds per transition (None when it cannot be read)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(connections)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(dsn, schema, method, i, seconds, barrier, results))
        for i in range(connections)
    ]
    for p in procs:
        p.start()
    got: list[tuple[int, float, float | None]] = []
    deadline = time.monotonic() + seconds + 120
    while len(got) < len(procs):
        try:
            got.append(results.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit(f"{method} x{connections}: a worker failed") from None
    for p in procs:
        p.join()
    done = sum(n for n, _t, _c in got)
    cpus = [c for _n, _t, c in got]
    cpu = None if None in cpus else sum(c for c in cpus if c is not None) / done * 1e6
    return done / max(t for _n, t, _c in got), cpu


def check_consistent(dsn: str, schema: str) -> None:
    """Every row's version equals its number of event rows, in all three table pairs."""
    with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        for table, events in (("jobs", "job_events"), ("jobs_bare", "job_events_bare")):
            bad = conn.execute(
                f"SELECT count(*) FROM {table} t WHERE t.state_version <>"
                f" (SELECT count(*) FROM {events} e WHERE e.job_id = t.id)"
            ).fetchone()
            assert bad is not None and bad[0] == 0, f"{table}: {bad[0] if bad else '?'} rows off"


def median_ratio(a: Sequence[float], b: Sequence[float]) -> str:
    rs = [x / y for x, y in zip(a, b, strict=True)]
    return f"{statistics.median(rs):.2f}x (rounds {min(rs):.2f}-{max(rs):.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "FSMC_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))  # fmt: skip
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    schema = f"fsmc_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
            " current_setting('fsync'), current_setting('shared_buffers')"
        ).fetchone()
    assert row is not None
    print(f"PostgreSQL {row[0]} (synchronous_commit={row[1]}, fsync={row[2]},"
          f" shared_buffers={row[3]}); nproc={os.cpu_count()},"
          f" load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"{args.rounds} rounds of {args.seconds:g} s per (method, connections);"
          f" each transition its own transaction\n")  # fmt: skip

    setup(args.dsn, schema, JOB)
    tps: dict[tuple[str, int], list[float]] = {(m, c): [] for m in METHODS for c in CONNECTIONS}
    cpu: dict[tuple[str, int], list[float]] = {(m, c): [] for m in METHODS for c in CONNECTIONS}
    try:
        pairs = list(tps)
        for r in range(args.rounds):
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                conn.execute(f"SET search_path TO {schema}")
                conn.execute("VACUUM ANALYZE")
            shift = (r * 2) % len(pairs)
            for method, conns in pairs[shift:] + pairs[:shift]:
                rate, used = measure(args.dsn, schema, method, conns, args.seconds)
                tps[method, conns].append(rate)
                if used is not None:
                    cpu[method, conns].append(used)
        check_consistent(args.dsn, schema)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")

    print(f"{'transitions/s':<14}" + "".join(f"{f'{c} conn':>12}" for c in CONNECTIONS)
          + (f"   server CPU us/transition at {CONNECTIONS[0]} and {CONNECTIONS[-1]} conn"
             if all(cpu.values()) else ""))  # fmt: skip
    for method in METHODS:
        cells = "".join(f"{statistics.median(tps[method, c]):>12,.0f}" for c in CONNECTIONS)
        if all(cpu.values()):
            cells += "   " + " ".join(f"{statistics.median(cpu[method, c]):>6.0f}" for c in CONNECTIONS)
        print(f"{method:<14}{cells}")
    print(f"(load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)\n")
    verdicts = []
    for c in CONNECTIONS:
        for other, target in (("cte", 0.8), ("seed", 1.5)):
            rs = [a / b for a, b in zip(tps["apply", c], tps[other, c], strict=True)]
            ok = statistics.median(rs) >= target
            verdicts.append(ok)
            print(f"apply / {other:<4} at {c} conn: {median_ratio(tps['apply', c], tps[other, c])}"
                  f"   target >= {target}x  {'PASS' if ok else 'MISS'}")  # fmt: skip
    for method in METHODS:
        lo, hi = CONNECTIONS[0], CONNECTIONS[-1]
        rs = [a / b for a, b in zip(tps[method, hi], tps[method, lo], strict=True)]
        line = f"{method:<5} {hi} conn / {lo} conn: {median_ratio(tps[method, hi], tps[method, lo])}"
        if method == "apply":
            ok = statistics.median(rs) >= 1.6
            verdicts.append(ok)
            line += f"   target >= 1.6x  {'PASS' if ok else 'MISS'}"
        print(line)
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
