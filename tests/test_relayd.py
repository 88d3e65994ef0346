"""The relayd example (examples/relayd/, on specs/queue.yaml) under chaos (issues 11
and 21): hundreds of jobs, workers killed at random moments (tasks cancelled,
connections terminated mid-transaction), and still every job ends completed or
discarded, none is completed twice, every reclaim took a dead worker's job, a job is
discarded exactly when its attempts are spent, every retry waited for its backoff,
every history replays, nothing is left locked. And (issue 22) relayd with more workers
than places in `running` (the spec's limit lowered to 2): a sampler never sees more
jobs running than the limit, the limit is reached, and every job still finishes.

Workers connect as the application role (the grants of docs/postgres.md); the chaos monkey as
the superuser, who may terminate their backends."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT
from tests.pg_scratch import Scratch, machine_from_text, machine_of

LIMIT = 2  # places in running for the narrow queue: fewer than relayd's workers


def relayd() -> Any:
    spec = importlib.util.spec_from_file_location("relayd", ROOT / "examples" / "relayd" / "relayd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["relayd"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def queue(pg_dsn: str) -> Any:
    scratch = Scratch.create(pg_dsn, machine_of("queue"))
    yield scratch
    scratch.drop()


def test_relayd_under_chaos_loses_nothing_and_does_nothing_twice(queue: Scratch) -> None:
    db, r = queue, relayd()
    options = f"-c search_path={db.schema} -c lock_timeout=10s"

    async def app() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(db.dsn, user=db.app_role, options=options)

    async def admin() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(db.dsn, options=options)

    settings = r.Settings(schema=db.schema, workers=8, lease=timedelta(seconds=3), beat=0.1, work=(0.0, 0.05),
                          fail_rate=0.15, max_tries=2, keep=timedelta(days=1), chaos=0.15,
                          quiet=True)  # fmt: skip
    pool = asyncio.run(asyncio.wait_for(r.run(app, 300, settings, admin=admin), timeout=120))
    assert pool.dead, "the chaos killed no worker: the test proved nothing"
    assert pool.limit == 50 and pool.most_running <= pool.limit  # specs/queue.yaml's limit

    with db.connect() as conn:
        states = dict(conn.execute(db.q("SELECT state, count(*) FROM {table} GROUP BY 1")).fetchall())
        assert sum(states.values()) == 300
        assert set(states) <= {"completed", "discarded"}, states
        finishers = dict(conn.execute(
            db.q("SELECT {id_col}, actor FROM {events} WHERE event = 'complete'")).fetchall())  # fmt: skip
        finishes = Counter(r[0] for r in conn.execute(
            db.q("SELECT {id_col} FROM {events} WHERE event = 'complete'")).fetchall())  # fmt: skip
        assert finishes and max(finishes.values()) == 1
        assert sum(finishes.values()) == states.get("completed", 0)
        # Every finish a worker saw happened once; one it did not see was committed by a
        # worker killed before it heard back (the commit's reply lost with it).
        assert Counter(pool.finished) <= finishes
        assert {finishers[j] for j in set(finishes) - set(pool.finished)} <= pool.dead
        # Every reclaim took the job of a worker that had died: the actor of the claim
        # that put the job in the lease is one the chaos killed.
        reclaims = conn.execute(db.q(
            "SELECT r.{id_col}, (SELECT c.actor FROM {events} AS c WHERE c.{id_col} = r.{id_col}"
            "   AND c.version < r.version AND c.event = 'fetch' ORDER BY c.version DESC LIMIT 1)"
            " FROM {events} AS r WHERE r.event = 'rescue'")).fetchall()  # fmt: skip
        assert reclaims, "no job was ever reclaimed: the test proved nothing"
        assert {actor for _id, actor in reclaims} <= pool.dead
        # Discarded exactly when its attempts were spent (the database's budget, max_tries
        # each), and never before; every retry waited its backoff (at least 1 s).
        attempts = dict(conn.execute(db.q("SELECT id, fetch_count FROM {table} WHERE state = 'discarded'")).fetchall())
        assert set(attempts.values()) <= {settings.max_tries}, attempts
        early = conn.execute(db.q(
            "SELECT count(*) FROM {events} AS t JOIN {events} AS f ON f.{id_col} = t.{id_col}"
            " AND f.version = t.version - 1 WHERE t.event = 'retry' AND t.at - f.at < interval '1 second'")).fetchone()  # fmt: skip
        assert early == (0,)
        retried = conn.execute(db.q("SELECT count(*) FROM {events} WHERE event = 'retry'")).fetchone()
        assert retried is not None and retried[0] > 0, "no job was ever retried: the test proved nothing"
        assert attempts, "no job was ever discarded: the test proved nothing"
        assert db.replay_problems(conn) == []
        conn.commit()
        # Nothing left locked: every row can be locked at once, without waiting.
        got = conn.execute(db.q("SELECT count(*) FROM (SELECT id FROM {table}"
                                " FOR UPDATE SKIP LOCKED) AS l")).fetchone()  # fmt: skip
        assert got == (300,)
        conn.rollback()


@pytest.fixture
def narrow_queue(pg_dsn: str) -> Any:
    """specs/queue.yaml with its limit on running lowered to LIMIT."""
    text = (ROOT / "specs" / "queue.yaml").read_text(encoding="utf-8")
    narrowed = text.replace("limits:\n  running: 50\n", f"limits:\n  running: {LIMIT}\n")
    assert narrowed != text, "specs/queue.yaml's limit on running is not 50 any more: update this test"
    scratch = Scratch.create(pg_dsn, machine_from_text(narrowed, "queue.yaml"))
    yield scratch
    scratch.drop()


class Sampler(threading.Thread):
    """Counts the jobs in running in a loop, on a connection of its own, until stopped:
    `most`, the largest count; `full`, how many samples found running at its limit."""

    def __init__(self, db: Scratch) -> None:
        super().__init__(daemon=True)
        self.db, self.most, self.full, self.samples, self.stop = db, 0, 0, 0, threading.Event()

    def run(self) -> None:
        with self.db.connect(autocommit=True) as conn:
            query = self.db.q("SELECT count(*) FROM {table} WHERE state = 'running'")
            while not self.stop.is_set():
                row = conn.execute(query).fetchone()
                assert row is not None
                self.most, self.samples = max(self.most, int(row[0])), self.samples + 1
                self.full += int(row[0]) == LIMIT
                time.sleep(0.001)


def test_relayd_with_more_workers_than_places_keeps_the_limit_and_finishes_every_job(narrow_queue: Scratch) -> None:
    db, r = narrow_queue, relayd()
    options = f"-c search_path={db.schema} -c lock_timeout=10s"

    async def app() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(db.dsn, user=db.app_role, options=options)

    async def admin() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(db.dsn, options=options)

    # Workers die too (a dead worker's job keeps its place until it is reclaimed, a
    # lease later): the places still free up, and no job waits for ever.
    settings = r.Settings(schema=db.schema, workers=3 * LIMIT, lease=timedelta(seconds=1), beat=0.1,
                          work=(0.01, 0.05), fail_rate=0.15, max_tries=2, keep=timedelta(days=1), chaos=0.5,
                          quiet=True)  # fmt: skip
    jobs = 80
    sampler = Sampler(db)
    sampler.start()
    try:
        pool = asyncio.run(asyncio.wait_for(r.run(app, jobs, settings, admin=admin), timeout=120))
    finally:
        sampler.stop.set()
        sampler.join()
    assert pool.limit == LIMIT < settings.workers
    assert sampler.most <= LIMIT, f"a sample saw {sampler.most} jobs running (limit {LIMIT})"
    assert pool.most_running <= LIMIT
    assert sampler.full > 0, "running never reached its limit: the test proved nothing"

    with db.connect() as conn:
        states = dict(conn.execute(db.q("SELECT state, count(*) FROM {table} GROUP BY 1")).fetchall())
        assert sum(states.values()) == jobs
        assert set(states) <= {"completed", "discarded"}, states
        finishes = Counter(r[0] for r in conn.execute(
            db.q("SELECT {id_col} FROM {events} WHERE event = 'complete'")).fetchall())  # fmt: skip
        assert finishes and max(finishes.values()) == 1
        assert sum(finishes.values()) == states.get("completed", 0)
        attempts = conn.execute(db.q("SELECT fetch_count FROM {table} WHERE state = 'discarded'")).fetchall()
        assert {a for (a,) in attempts} <= {settings.max_tries}
        assert db.replay_problems(conn) == []
        # Every place is free again: the slots hold nothing, and none is left locked (a
        # superuser's lock: the application may only read them).
        assert conn.execute(b"SELECT count(*), count(holder) FROM queue_limits").fetchone() == (LIMIT, 0)
        conn.rollback()
    with db.superuser() as su:
        got = su.execute(b"SELECT count(*) FROM (SELECT slot FROM queue_limits FOR UPDATE SKIP LOCKED) AS l")
        assert got.fetchone() == (LIMIT,)
        su.rollback()
