"""Wake-ups (`postgres.notify`) in the database and the generated module
(specs/queue.yaml lists `fetch` and `retry`): a row entering a source state of a
listed event sends a NOTIFY on the installation's channel, and `wait_for()` /
`await_for()` sleep until a row may be claimable, instead of polling.

Every connection is the application role's (`Scratch.connect`), as a worker's is.
Times are measured, never assumed: the bounds are generous for a shared machine
(100 ms for a wake-up, which takes a millisecond or two when the machine is idle).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from fsmc.targets.postgres.names import wake_channel
from tests.harness import nested_plans
from tests.pg_scratch import Scratch, machine_of, module_of


@pytest.fixture
def queue(pg_dsn: str) -> Iterator[Scratch]:
    scratch = Scratch.create(pg_dsn, machine_of("queue"))
    yield scratch
    scratch.drop()


@pytest.fixture
def fsm(queue: Scratch, tmp_path: Path) -> ModuleType:
    return module_of(queue.machine, tmp_path)


def enqueue(db: Scratch, rows: int = 1) -> float:
    """`rows` available jobs, committed by a connection of their own; when the COMMIT
    was sent (no notification can arrive before)."""
    with db.connect() as app:
        app.execute(db.q("INSERT INTO {table} SELECT FROM generate_series(1, %s)"), (rows,))
        committing = time.monotonic()
        app.commit()
    return committing


class Waiter(threading.Thread):
    """`wait_for()` in a thread of its own: what it returned, and when (monotonic)."""

    def __init__(self, fsm: ModuleType, conn: psycopg.Connection[Any], schema: str, event: str,
                 timeout: float) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.fsm, self.conn, self.schema, self.event, self.timeout = fsm, conn, schema, event, timeout
        self.result: bool | None = None
        self.returned = 0.0

    def run(self) -> None:
        self.result = self.fsm.wait_for(self.conn, self.event, timeout=self.timeout, schema=self.schema)
        self.returned = time.monotonic()


def test_a_waiter_is_woken_within_100_ms_of_an_insert_in_another_connection(queue: Scratch, fsm: ModuleType) -> None:
    """Five times: asleep, then woken by the NOTIFY of an insert another connection
    commits. Every one wakes (never the 10 s timeout); the median within 100 ms (one
    wake-up can lose tens of milliseconds to the scheduler of a loaded machine)."""
    db = queue
    delays = []
    with db.connect(autocommit=True) as worker:
        for _ in range(5):
            waiter = Waiter(fsm, worker, db.schema, "fetch", timeout=10)
            waiter.start()
            db.asleep(worker)
            committed = enqueue(db)
            waiter.join(10)
            assert waiter.result is True
            delays.append(waiter.returned - committed)
            claimed = fsm.claim(worker, "fetch", actor="w", schema=db.schema)
            assert [row.state for row in claimed] == ["running"]
    assert all(0 <= d < 1 for d in delays) and sorted(delays)[2] < 0.1, delays


def test_an_asyncio_waiter_is_woken_by_an_insert_in_another_connection(queue: Scratch, fsm: ModuleType) -> None:
    db = queue

    async def main() -> tuple[bool, float]:
        async with await psycopg.AsyncConnection.connect(
            db.dsn, user=db.app_role, autocommit=True, options=f"-c search_path={db.schema}"
        ) as worker:
            waiting = asyncio.create_task(fsm.await_for(worker, fsm.Event.FETCH, timeout=10, schema=db.schema))
            await asyncio.to_thread(db.asleep, worker)
            committed = await asyncio.to_thread(enqueue, db)
            woke = await waiting
            return woke, time.monotonic() - committed

    woke, after = asyncio.run(main())
    assert woke is True and after < 1, after  # woken, not timed out (the 100 ms: the test above)


def test_a_row_committed_before_the_wait_returns_at_once(queue: Scratch, fsm: ModuleType) -> None:
    """No lost wake-up: its notification was sent before the LISTEN, and the question
    asked after the LISTEN sees the row."""
    db = queue
    enqueue(db)
    with db.connect(autocommit=True) as worker:
        start = time.monotonic()
        assert fsm.wait_for(worker, "fetch", timeout=10, schema=db.schema) is True
        assert time.monotonic() - start < 1


def test_no_wake_up_is_lost_whenever_the_insert_commits(queue: Scratch, fsm: ModuleType) -> None:
    """Inserts that commit just before, during or just after the waiter's LISTEN and
    question: every one wakes it (a lost one would sleep out the 10 s timeout)."""
    db = queue
    rng = random.Random(24)
    with db.connect(autocommit=True) as worker:
        for _ in range(15):
            waiter = Waiter(fsm, worker, db.schema, "fetch", timeout=10)
            inserter = threading.Timer(rng.uniform(0, 0.01), enqueue, (db,))
            inserter.start()
            waiter.start()
            waiter.join(10)
            inserter.join()
            assert waiter.result is True
            assert fsm.claim(worker, "fetch", actor="w", schema=db.schema)  # the queue is empty again


def test_the_timeout_returns_false(queue: Scratch, fsm: ModuleType) -> None:
    db = queue
    with db.connect(autocommit=True) as worker:
        start = time.monotonic()
        assert fsm.wait_for(worker, "fetch", timeout=0.2, schema=db.schema) is False
        assert 0.2 <= time.monotonic() - start < 2


def test_a_timed_event_wakes_its_waiter_when_a_row_falls_due(queue: Scratch, fsm: ModuleType) -> None:
    """A retry waits out its backoff: the waiter sleeps until the earliest due time,
    with no notification, and a claim then takes the row."""
    db = queue
    with db.connect() as app:
        row_id, _ = db.row_at(app, "retryable")
    db.as_owner("UPDATE {table} SET due_at = now() + interval '300 milliseconds' WHERE id = %s", (row_id,))
    with db.connect(autocommit=True) as supervisor:
        start = time.monotonic()
        assert fsm.wait_for(supervisor, "retry", timeout=10, schema=db.schema) is True
        waited = time.monotonic() - start
        assert 0.15 <= waited < 2, waited
        assert [r.id for r in fsm.claim(supervisor, "retry", actor="s", schema=db.schema)] == [row_id]


def test_a_row_entering_a_timed_state_makes_the_waiter_wait_for_its_due_time(queue: Scratch, fsm: ModuleType) -> None:
    """An error sends a job to retryable during the wait (a notification): the waiter
    asks again, sleeps out the backoff, and wakes when it is due, not at once."""
    db = queue
    with db.connect() as app:
        row_id, version = db.row_at(app, "running")
    with db.connect(autocommit=True) as supervisor:
        waiter = Waiter(fsm, supervisor, db.schema, "retry", timeout=10)
        waiter.start()
        db.asleep(supervisor)
        with db.connect() as app:
            assert db.apply(app, row_id, "error", version) == version + 1
            app.commit()
        moved = time.monotonic()
        waiter.join(10)
        assert waiter.result is True
        # The backoff is 1 s for a first retry.
        assert 0.8 <= waiter.returned - moved < 3, waiter.returned - moved
        assert [r.id for r in fsm.claim(supervisor, "retry", actor="s", schema=db.schema)] == [row_id]


def test_a_forged_notification_only_wakes_the_waiter_for_nothing(queue: Scratch, fsm: ModuleType) -> None:
    """Any role may NOTIFY any channel: the application role forges a wake-up; the
    waiter returns True, its claim takes nothing, and no row changed."""
    db = queue
    with db.connect(autocommit=True) as worker, db.connect(autocommit=True) as forger:
        waiter = Waiter(fsm, worker, db.schema, "fetch", timeout=10)
        waiter.start()
        db.asleep(worker)
        forger.execute("SELECT pg_notify(%s, 'available')", (fsm.wake_channel(db.schema),))
        waiter.join(10)
        assert waiter.result is True
        assert fsm.claim(worker, "fetch", actor="w", schema=db.schema) == []
        assert worker.execute(db.q("SELECT count(*) FROM {table}")).fetchone() == (0,)


def test_one_channel_per_installation_and_one_notification_per_batch(queue: Scratch, fsm: ModuleType) -> None:
    """The channel is the one `names.wake_channel` and the module compute, the payload
    the state entered, and PostgreSQL folds a batch's repeats into one. A move that
    leaves the sources (a claim) sends none; a retry back into them does."""
    db = queue
    channel = wake_channel("queue", db.schema)
    assert fsm.wake_channel(db.schema) == channel and channel.startswith("queue_wake_")
    with db.connect(autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        enqueue(db, 40)
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=0.5)]
        assert got == [(channel, "available")]
        with db.connect() as app:
            assert len(fsm.claim(app, "fetch", actor="w", limit=40, schema=db.schema)) == 40
            app.commit()
            assert list(listener.notifies(timeout=0.3)) == []
            db.row_at(app, "retryable")  # a run that failed: due, as made here
            assert [(n.payload) for n in listener.notifies(timeout=0.5)] == ["available", "retryable"]
            assert len(fsm.claim(app, "retry", actor="s", schema=db.schema)) == 1
            app.commit()
        assert [(n.payload) for n in listener.notifies(timeout=0.5)] == ["available"]


def test_an_event_that_sends_no_wake_ups_and_a_connection_in_a_transaction_are_refused(
    queue: Scratch, fsm: ModuleType
) -> None:
    db = queue
    with db.connect() as conn:
        with pytest.raises(ValueError, match="'complete' sends no wake-ups.*lists: fetch, retry"):
            fsm.wait_for(conn, "complete", timeout=0.1, schema=db.schema)
        conn.execute("SELECT 1")  # psycopg opened a transaction
        with pytest.raises(ValueError, match="outside any transaction"):
            fsm.wait_for(conn, "fetch", timeout=0.1, schema=db.schema)
        conn.rollback()
        # Idle, not autocommit: it commits its own LISTEN and question, nothing else.
        enqueue(db)
        assert fsm.wait_for(conn, "fetch", timeout=5, schema=db.schema) is True
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_full_limited_state_puts_the_waiter_to_sleep_instead_of_spinning(queue: Scratch, fsm: ModuleType) -> None:
    """queue limits running to 50: with 50 running, available jobs are not claimable,
    so the waiter sleeps out its timeout (a True would make a worker loop on a claim
    that takes nothing)."""
    db = queue
    enqueue(db, 51)
    with db.connect(autocommit=True) as worker:
        assert len(fsm.claim(worker, "fetch", actor="w", limit=60, schema=db.schema)) == 50
        assert fsm.wait_for(worker, "fetch", timeout=0.2, schema=db.schema) is False


def test_the_question_reads_the_claim_and_due_indexes(queue: Scratch) -> None:
    """Over 5,000 jobs scheduled for later and one available (in queue emails): the question about fetch
    reads a claim index (the one led by queue when a queue is given), the one about
    retry the due index; none scans the table."""
    db = queue
    with db.connect() as app:
        app.execute(db.q("INSERT INTO {table} (state, due_at) SELECT 'scheduled', now() + interval '1 day'"
                         " FROM generate_series(1, 5000)"))  # fmt: skip
        app.execute(db.q("INSERT INTO {table} (queue) VALUES ('emails')"))
        app.commit()
    db.as_owner("ANALYZE {table}")
    plans = {
        question: "\n".join(nested_plans(db, db.q(f"SELECT queue_claimable_in({question})")))
        for question in ("'fetch'", "'fetch', 'emails'", "'retry'")
    }
    # (a bitmap scan and a sort of the one available row, or the index in its order)
    def reads(index: str, plan: str) -> bool:
        return f"Scan using {index}" in plan or f"Index Scan on {index}" in plan

    assert reads("queue_jobs_claim", plans["'fetch'"]), plans["'fetch'"]
    assert reads("queue_jobs_claim_by_idx", plans["'fetch', 'emails'"]), plans["'fetch', 'emails'"]
    assert reads("queue_jobs_due_idx", plans["'retry'"]), plans["'retry'"]
    assert not any("Seq Scan on queue_jobs" in plan for plan in plans.values()), plans


def test_a_waiter_for_one_queue_sleeps_through_another_queues_jobs(queue: Scratch, fsm: ModuleType) -> None:
    """claim() may be limited to a queue (postgres.claim.by), and so may the wait: a job
    of another queue wakes the waiter only to ask again (the payload names no queue),
    and it sleeps on; a job of its own queue wakes it."""
    db = queue
    with db.connect(autocommit=True) as worker, db.connect(autocommit=True) as producer:
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(
            fsm.wait_for(worker, "fetch", timeout=10, queue="emails", schema=db.schema)))  # fmt: skip
        waiter.start()
        db.asleep(worker)
        fsm.create(producer, queue="reports", schema=db.schema)
        time.sleep(0.3)
        assert result == [] and waiter.is_alive()
        db.asleep(worker)  # asleep again, after asking
        fsm.create(producer, queue="emails", schema=db.schema)
        waiter.join(10)
        assert result == [True]
        assert [r.queue for r in fsm.claim(worker, "fetch", actor="w", queue="emails", schema=db.schema)] == ["emails"]
