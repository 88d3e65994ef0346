"""What wake-ups (`postgres.notify`) cost the writes that do not wait: pgbench on
specs/queue.yaml as built (notify: fetch, retry) beside the same spec without notify,
and beside a statement trigger, the other way to send them.

    python benchmarks/bench_wakeups.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

Three writes, one transaction each, pgbench -M prepared, one client:

- enqueue: `INSERT INTO queue_jobs DEFAULT VALUES`, a row entering `available`: the
  row trigger's WHEN clause holds, its function sends one NOTIFY, and the COMMIT
  writes it to PostgreSQL's notification queue (under a lock every notifying
  commit of the database takes in turn);
- fetch + complete: `queue_claim('fetch')` and `queue_apply(... 'complete' ...)`, two
  moves into states no listed event takes rows from: the WHEN clause is false, the
  function never runs;
- heartbeat: `queue_heartbeat`, an UPDATE that sets no state: the triggers (UPDATE OF
  state) are not even considered.

"statement" is the alternative a statement trigger gives: AFTER INSERT OR UPDATE ...
FOR EACH STATEMENT with a transition table (PostgreSQL refuses a column list beside
one), which must then hold every row every UPDATE writes, heartbeats included, to
find the states entered.

By default the figure is instructions per transaction, counted by valgrind in a
scratch cluster as bench_instructions.py counts them (the difference of a run of N and
one of 6N transactions, one backend each): on a shared two-core machine timed rounds
spread by 20%, more than what is measured here. `--timed` prints pgbench's
transactions per second on --dsn instead, the best of --rounds. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_worker import options, queue_variant  # noqa: E402

STATEMENT_TRIGGER = """
CREATE FUNCTION queue_notify_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('queue_wake_statement', e.state)
    FROM (SELECT DISTINCT n.state FROM entered AS n WHERE n.state = ANY ('{available,retryable}')) AS e;
    RETURN NULL;
END
$$;
CREATE TRIGGER queue_notify_insert_statement AFTER INSERT ON queue_jobs
REFERENCING NEW TABLE AS entered FOR EACH STATEMENT EXECUTE FUNCTION queue_notify_statement();
CREATE TRIGGER queue_notify_update_statement AFTER UPDATE ON queue_jobs
REFERENCING NEW TABLE AS entered FOR EACH STATEMENT EXECUTE FUNCTION queue_notify_statement();
"""

SCRIPTS = {
    "enqueue": "INSERT INTO queue_jobs DEFAULT VALUES;\n",
    "fetch + complete": (
        "SELECT id, state_version FROM queue_claim('fetch', 'bench', 1) \\gset\n"
        "SELECT queue_apply(:id, 'complete', :state_version, 'bench');\n"
    ),
    "heartbeat": (
        "SELECT id, state_version FROM queue_jobs WHERE state = 'running' ORDER BY random() LIMIT 1 \\gset\n"
        "SELECT queue_heartbeat(:id, :state_version);\n"
    ),
}


def install(dsn: str, schema: str, variant: str, rows: int = 300_000) -> int:
    """`variant` of the queue in a fresh `schema`, filled; the pid of the one backend
    that did it (whose count, under callgrind, must be written before a run's)."""
    _module, text = queue_variant(plain=False, notify=variant == "notify (as built)")
    with psycopg.connect(dsn, options=options(schema)) as conn:
        pid = conn.info.backend_pid
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {0} CASCADE; CREATE SCHEMA {0}").format(sql.Identifier(schema)))
        conn.execute(text.encode())
        if variant == "statement":
            conn.execute(STATEMENT_TRIGGER.encode())
        # Enough available rows for every fetch, and 200 running ones to heartbeat.
        conn.execute("INSERT INTO queue_jobs SELECT FROM generate_series(1, %s)", (rows,))
        conn.execute("SELECT queue_claim('fetch', 'bench', 200)")
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE queue_jobs")
    return pid


def tps(dsn: str, schema: str, script: str, seconds: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script)
        f.flush()
        done = subprocess.run(
            ["pgbench", "-n", "-M", "prepared", "-c", "1", "-T", str(seconds), "-f", f.name, dsn],
            env={"PGOPTIONS": options(schema), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    line = next(x for x in done.stdout.splitlines() if x.startswith("tps"))
    return float(line.split()[2])


VARIANTS = ["no notify", "notify (as built)", "statement"]


def instructions(transactions: int) -> None:
    """Instructions per transaction of each write and variant, in a scratch cluster
    under callgrind (bench_instructions.Cluster)."""
    import bench_instructions as bi

    with tempfile.TemporaryDirectory(prefix="fsmc-wake-") as folder:
        cluster = bi.Cluster(Path(folder), bi.bindir())
        server = cluster.start()
        try:
            schemas = {v: "bench_wake_" + str(i) for i, v in enumerate(VARIANTS)}
            for v in VARIANTS:
                bi.wait_for(cluster.counts / f"cg.{install(cluster.dsn, schemas[v], v, rows=8 * transactions + 400)}")
            pgbench = str(cluster.bin / "pgbench") if (cluster.bin / "pgbench").exists() else "pgbench"
            print(f"# instructions per transaction (valgrind; runs of {transactions} and {6 * transactions})")
            print(f"{'write':<18}" + "".join(f"{v:>20}" for v in VARIANTS))
            for name, script in SCRIPTS.items():
                cells = []
                for v in VARIANTS:
                    runs = [_backend(cluster, bi, pgbench, schemas[v], script, n) for n in (transactions, 6 * transactions)]
                    cells.append((bi.total(runs[1]) - bi.total(runs[0])) / (5 * transactions))
                print(f"{name:<18}" + "".join(f"{c:>20,.0f}" for c in cells), flush=True)
        finally:
            server.terminate()
            server.wait(timeout=300)


def _backend(cluster: Any, bi: Any, pgbench: str, schema: str, script: str, transactions: int) -> Path:
    """The callgrind file of the backend that ran `transactions` of `script`."""
    counts: Path = cluster.counts
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script)
        f.flush()
        before = set(counts.glob("cg.*"))
        subprocess.run([pgbench, "-n", "-M", "prepared", "-c", "1", "-t", str(transactions), "-f", f.name,
                        cluster.dsn],
                       env={"PGOPTIONS": options(schema), "PATH": "/usr/bin:/bin"}, check=True, capture_output=True)  # fmt: skip
    return Path(bi.new_backend(counts, before))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--timed", action="store_true", help="pgbench's transactions per second on --dsn")
    parser.add_argument("--transactions", type=int, default=100, help="N, without --timed")
    parser.add_argument("--seconds", type=int, default=5, help="per round, with --timed")
    parser.add_argument("--rounds", type=int, default=3, help="with --timed")
    args = parser.parse_args(argv)
    if not args.timed:
        instructions(args.transactions)
        return 0
    variants = VARIANTS
    schemas = {v: "bench_wake_" + str(i) for i, v in enumerate(variants)}
    for v in variants:
        install(args.dsn, schemas[v], v)
    print(f"# transactions per second, one client, best of {args.rounds} rounds of {args.seconds} s")
    print(f"{'write':<18}" + "".join(f"{v:>20}" for v in variants))
    for name, script in SCRIPTS.items():
        best = dict.fromkeys(variants, 0.0)
        for _ in range(args.rounds):
            for v in variants:
                best[v] = max(best[v], tps(args.dsn, schemas[v], script, args.seconds))
        print(f"{name:<18}" + "".join(f"{best[v]:>20,.0f}" for v in variants), flush=True)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        for schema in schemas.values():
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
