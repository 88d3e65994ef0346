"""relayd: seed 000's job runner, on fsmc's generated `queue` module and schema
(specs/queue.yaml, a River-style queue in spec language 1.2).

    python examples/relayd/relayd.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

creates the schema `relayd` (once, from generated/queue/queue.sql, or the build of
another spec's: --sql), enqueues --jobs no-op jobs, each with a budget of --max-tries
attempts, and runs until every one is completed or discarded, printing what it does:

- an asyncio worker pool: each worker fetches the oldest available job
  (`queue.aclaim(FETCH)`, SKIP LOCKED: two workers never get one job; the database
  counts the attempt), heartbeats while it works (`queue.aheartbeat`; False means the
  job was taken from it: it stops), and completes it, or records an error (a job fails
  at random, --fail-rate): the database sends it to `retryable`, or to `discarded` once
  its attempts are spent;
- a supervisor: reclaims jobs whose heartbeat is older than the lease
  (`queue.areclaim`: their worker died; again retryable or discarded by their budget),
  makes the retries that are due available again (`queue.aclaim(RETRY)`: the spec's
  backoff, 1 s doubling, is the database's, so there is no retry loop or poller here),
  and purges finished jobs older than --keep (`queue.apurge`);
- a monitor: counts the jobs in `running` every 10 ms. The spec limits them (`limits:
  {running: 50}`), and the database keeps that limit whatever the number of workers:
  a claim takes no more jobs than there are free places, so with more workers than
  places the others find nothing to fetch and wait. relayd prints the most it saw.

Nobody polls: a worker with nothing to do sleeps in `queue.await_for(FETCH)` until the
database's NOTIFY says a job is available (the spec's `postgres.notify`), and the
supervisor in `queue.await_for(RETRY)` until a retry falls due (or its round comes).

Every move goes through the database function, in its own short transaction: the
event log (`queue_job_events`) is the whole story, and `queue_intervals` answers how
long each stay took. `--chaos` kills workers at random moments (tasks cancelled,
connections terminated mid-transaction), as tests/test_relayd.py does, to show
nothing is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "generated" / "queue"
RESTING = ("completed", "discarded")  # where a job ends up, done or given up on


def load_queue_module() -> ModuleType:
    """The generated module, imported from generated/queue/ (no install needed)."""
    spec = importlib.util.spec_from_file_location("fsm_queue", GENERATED / "fsm_queue.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fsm_queue"] = module
    spec.loader.exec_module(module)
    return module


queue = load_queue_module()

Connect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]


@dataclass
class Settings:
    schema: str = "relayd"  # where queue.sql is installed: every generated call names it
    workers: int = 8
    lease: timedelta = timedelta(seconds=3)  # a heartbeat older than this: the worker is dead
    beat: float = 0.2  # seconds between heartbeats
    work: tuple[float, float] = (0.01, 0.1)  # a job's duration, seconds (uniform)
    fail_rate: float = 0.1
    max_tries: int = 3  # each job's budget of attempts (its fetch_cap): then it is discarded
    keep: timedelta = timedelta(hours=1)  # finished jobs older than this are purged
    chaos: float = 0.0  # seconds between kills (0: no chaos)
    quiet: bool = False


@dataclass
class Pool:
    """The running system: who is alive, who died, what was done."""

    settings: Settings
    connect: Connect
    dead: set[str] = field(default_factory=set)
    live: dict[str, tuple[asyncio.Task[None], list[int]]] = field(default_factory=dict)
    finished: list[Any] = field(default_factory=list)
    incarnations: int = 0
    limit: int | None = None  # the database's limit on running (its slots), if the spec has one
    most_running: int = 0  # the most jobs the monitor saw in running at once

    def say(self, who: str, text: str) -> None:
        if not self.settings.quiet:
            print(f"{who:>12}  {text}", flush=True)


async def work_one(pool: Pool, conn: psycopg.AsyncConnection[Any], name: str) -> bool:
    """Fetch, run with heartbeats, complete or error one job; False: nothing available."""
    s = pool.settings
    async with conn.transaction():
        claimed = await queue.aclaim(conn, queue.Event.FETCH, actor=name, schema=s.schema)
    if not claimed:
        return False
    row = claimed[0]
    version = row.version
    pool.say(name, f"running {row.id} (attempt {row.fetch_count} of {row.fetch_cap})")
    deadline = asyncio.get_running_loop().time() + random.uniform(*s.work)
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        await asyncio.sleep(min(left, s.beat))
        async with conn.transaction():
            alive = await queue.aheartbeat(conn, row.id, expected_version=version, schema=s.schema)
        if not alive:
            pool.say(name, f"lost {row.id} while running (reclaimed)")
            return True
    event = queue.Event.ERROR if random.random() < s.fail_rate else queue.Event.COMPLETE
    async with conn.transaction():
        done = await queue.atransition(conn, row.id, event, expected_version=version, actor=name,
                                       payload={"worker": name}, schema=s.schema)  # fmt: skip
    if done is None:
        pool.say(name, f"lost {row.id} at the end (reclaimed)")
    else:
        if event is queue.Event.COMPLETE:
            pool.finished.append(row.id)
        pool.say(name, f"{'completed' if event is queue.Event.COMPLETE else 'error on'} {row.id}")
    return True


async def worker(pool: Pool, name: str, pid: list[int], stop: asyncio.Event) -> None:
    try:
        async with await pool.connect() as conn:
            pid.append(conn.info.backend_pid)
            while not stop.is_set():
                if not await work_one(pool, conn, name):
                    # Nothing available: sleep until the database says a job may be
                    # (postgres.notify), or half a second passed (to see `stop`).
                    await queue.await_for(conn, queue.Event.FETCH, timeout=0.5, schema=pool.settings.schema)
    except asyncio.CancelledError:
        pool.dead.add(name)
        pool.say(name, "cancelled")
        raise
    except psycopg.Error as error:  # its connection was closed under it
        pool.dead.add(name)
        pool.say(name, f"died: {type(error).__name__}")
    finally:
        pool.live.pop(name, None)


def spawn(pool: Pool, stop: asyncio.Event) -> None:
    """Start workers until the pool is full again (a dead one is replaced)."""
    while len(pool.live) < pool.settings.workers:
        pool.incarnations += 1
        name = f"worker-{pool.incarnations}"
        pid: list[int] = []
        pool.live[name] = (asyncio.create_task(worker(pool, name, pid, stop)), pid)


async def supervise(pool: Pool, conn: psycopg.AsyncConnection[Any]) -> None:
    """One round: reclaim stale leases, make due retries available, purge old jobs.
    Whether a job is retried or discarded, and when a retry is due, is the spec's."""
    s = pool.settings
    async with conn.transaction():
        for row_id in await queue.areclaim(conn, older_than=s.lease, actor="supervisor", schema=s.schema):
            pool.say("supervisor", f"reclaimed {row_id} (stale heartbeat)")
    async with conn.transaction():
        for row in await queue.aclaim(conn, queue.Event.RETRY, actor="supervisor", limit=100, schema=s.schema):
            pool.say("supervisor", f"retry {row.id} after {row.fetch_count} attempt(s)")
    async with conn.transaction():
        purged = await queue.apurge(conn, older_than=s.keep, limit=1000, schema=s.schema)
    if purged:
        pool.say("supervisor", f"purged {purged} old finished job(s)")


async def chaos(pool: Pool, admin: psycopg.AsyncConnection[Any], stop: asyncio.Event) -> None:
    """Kill a random worker now and then: cancel its task, or terminate its backend."""
    while not stop.is_set():
        await asyncio.sleep(random.uniform(0, 2 * pool.settings.chaos))
        if not pool.live:
            continue
        name = random.choice(sorted(pool.live))
        task, pid = pool.live[name]
        if random.random() < 0.5 or not pid:
            task.cancel()
        else:
            pool.dead.add(name)  # before the kill: its job may be reclaimed at once
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid[0],))
            pool.say("chaos", f"terminated the connection of {name}")


async def running_limit(conn: psycopg.AsyncConnection[Any]) -> int | None:
    """The limit on running that the database keeps: its slots (the application may read
    them), or None when the spec it was built from has no limit on running."""
    async with conn.transaction():
        found = await (await conn.execute("SELECT to_regclass('queue_limits') IS NOT NULL")).fetchone()
        if found is None or not found[0]:
            return None
        row = await (await conn.execute("SELECT count(*) FROM queue_limits WHERE state = 'running'")).fetchone()
    return int(row[0]) if row is not None and row[0] else None


async def monitor(pool: Pool, connect: Connect, stop: asyncio.Event) -> None:
    """Count the jobs in running every 10 ms, on a connection of its own (each count is
    the table as of some commit), and keep the largest."""
    async with await connect() as conn:
        await conn.set_autocommit(True)
        while not stop.is_set():
            row = await (await conn.execute("SELECT count(*) FROM queue_jobs WHERE state = 'running'")).fetchone()
            assert row is not None
            pool.most_running = max(pool.most_running, int(row[0]))
            await asyncio.sleep(0.01)


async def remaining(conn: psycopg.AsyncConnection[Any]) -> int:
    async with conn.transaction():
        row = await (await conn.execute(
            "SELECT count(*) FROM queue_jobs WHERE state <> ALL (%s)", (list(RESTING),))).fetchone()  # fmt: skip
    assert row is not None
    return int(row[0])


async def run(connect: Connect, jobs: int, settings: Settings,
              admin: Connect | None = None) -> Pool:  # fmt: skip
    """Enqueue `jobs`, run the pool and the supervisor until every job is completed or
    discarded."""
    pool = Pool(settings, connect)
    stop = asyncio.Event()
    async with await connect() as conn:
        async with conn.transaction():
            # One INSERT for the batch; each job its own budget of attempts (the spec's cap
            # per row, fetch_cap) and its arguments (a declared column, args).
            await queue.acreate_many(conn, [{"fetch_cap": settings.max_tries, "args": {"n": n}} for n in range(jobs)],
                                     schema=settings.schema)  # fmt: skip
        pool.limit = await running_limit(conn)
        limited = f", at most {pool.limit} running at once (the spec's limit)" if pool.limit else ""
        pool.say("relayd", f"enqueued {jobs} jobs; {settings.workers} workers{limited}")
        watcher = asyncio.create_task(monitor(pool, connect, stop))
        killer = None
        if settings.chaos:
            admin_conn = await (admin or connect)()
            await admin_conn.set_autocommit(True)
            killer = asyncio.create_task(chaos(pool, admin_conn, stop))
        try:
            while await remaining(conn):
                spawn(pool, stop)
                await supervise(pool, conn)
                # Until a retry falls due, or 0.2 s for the leases and the pool.
                await queue.await_for(conn, queue.Event.RETRY, timeout=0.2, schema=settings.schema)
        finally:
            stop.set()
            if killer is not None:
                killer.cancel()
                await asyncio.gather(killer, return_exceptions=True)
                await admin_conn.close()
            tasks = [t for t, _ in pool.live.values()]
            await asyncio.gather(*tasks, watcher, return_exceptions=True)
    pool.say("relayd", f"all {jobs} jobs completed or discarded; {len(pool.dead)} worker(s) died on the way")
    limited = f" (limit {pool.limit})" if pool.limit else ""
    pool.say("relayd", f"at most {pool.most_running} job(s) running at once, {settings.workers} workers{limited}")
    return pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--schema", default="relayd")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fail-rate", type=float, default=0.2)
    parser.add_argument("--max-tries", type=int, default=3)
    parser.add_argument("--chaos", type=float, default=0.0, help="seconds between kills (0: none)")
    parser.add_argument("--sql", type=Path, default=GENERATED / "queue.sql",
                        help="the schema to create when it does not exist: a build of specs/queue.yaml"
                             " (another limit on running, say)")  # fmt: skip
    args = parser.parse_args(argv)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (args.schema,)).fetchone()
        if not exists:
            print(f"creating schema {args.schema} from {args.sql}")
            with conn.transaction():
                conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(args.schema)))
                conn.execute(psycopg.sql.SQL("SET LOCAL search_path = {}").format(
                    psycopg.sql.Identifier(args.schema)))  # fmt: skip
                conn.execute(args.sql.read_bytes())

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(args.dsn, options=f"-c search_path={args.schema}")

    settings = Settings(schema=args.schema, workers=args.workers, fail_rate=args.fail_rate,
                        max_tries=args.max_tries, chaos=args.chaos)  # fmt: skip
    asyncio.run(run(connect, args.jobs, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
