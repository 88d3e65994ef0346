"""The generated module's worker side (contract 4.1, issue 11): `get`, `claim`, `purge`,
`heartbeat`, `reclaim` and their asyncio twins, `UnknownRow`, SQLSTATEs found through
`__cause__`, and mypy telling a sync connection from an async one.

The database tests play the application (`Scratch.connect()`: the grants of docs/postgres.md)."""

from __future__ import annotations

import asyncio
import datetime
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from fsmc.targets import generate
from fsmc.targets.common import Paths
from tests import harness
from tests.pg_scratch import Scratch, machine_of, module_of


def test_the_sync_functions_run_a_job_in_the_callers_transaction(db: Scratch, job: ModuleType) -> None:
    with db.connect() as conn:
        ids = [db.new_row(conn) for _ in range(3)]
        conn.commit()
        assert job.get(conn, ids[0], schema=db.schema) == job.Job(ids[0], job.State.QUEUED, 0)
        got = job.claim(conn, "claim", actor="w1", limit=2, schema=db.schema)
        assert got == [job.Job(ids[0], job.State.CLAIMED, 1), job.Job(ids[1], job.State.CLAIMED, 1)]
        conn.rollback()  # never committed: the rollback undoes it
        assert job.get(conn, ids[0], schema=db.schema).state is job.State.QUEUED
        (first,) = job.claim(conn, job.Event.CLAIM, actor="w1", schema=db.schema)
        assert job.heartbeat(conn, first.id, expected_version=1, schema=db.schema) is True
        assert job.heartbeat(conn, first.id, expected_version=0, schema=db.schema) is False
        assert job.transition(conn, first.id, "start", expected_version=1, actor="w1", schema=db.schema) == 2
        conn.commit()
        assert job.reclaim(conn, older_than=timedelta(hours=1), actor="sup", schema=db.schema) == []
        with db.owner() as owner:  # the worker died an hour ago
            owner.execute(db.q("UPDATE {table} SET heartbeat_at = now() - interval '2 hours'"))
            owner.commit()
        assert job.reclaim(conn, older_than=timedelta(minutes=1), actor="sup", schema=db.schema) == [first.id]
        assert job.get(conn, first.id, schema=db.schema) == job.Job(first.id, job.State.QUEUED, 3)
        assert job.purge(conn, older_than=timedelta(microseconds=1), limit=10, schema=db.schema) == 0
        conn.commit()
        assert job.get(conn, ids[0] if ids[0] != first.id else ids[1], schema=db.schema) is not None


def test_an_unknown_id_is_unknown_row_and_a_missing_one_is_none(db: Scratch, job: ModuleType) -> None:
    missing = __import__("uuid").uuid4()
    with db.connect() as conn:
        assert job.get(conn, missing, schema=db.schema) is None
        with pytest.raises(job.UnknownRow) as caught:
            job.transition(conn, missing, "claim", expected_version=0, actor="w", schema=db.schema)
        assert isinstance(caught.value, LookupError) and caught.value.id == missing
        assert getattr(caught.value.__cause__, "sqlstate", None) == "23F03"
        conn.rollback()
        with pytest.raises(job.UnknownRow):
            job.heartbeat(conn, missing, expected_version=0, schema=db.schema)


class WrappedError(Exception):
    """An error as Django raises it: its own class, the driver's error as __cause__."""


class WrappingCursor:
    """A cursor as Django's wrapper is: every driver error re-raised as its own."""

    def __init__(self, cursor: Any) -> None:
        self.inner = cursor

    def execute(self, query: Any, params: Any = None) -> object:
        try:
            return self.inner.execute(query, params)
        except psycopg.Error as error:
            raise WrappedError(str(error)) from error

    def fetchone(self) -> Any:
        return self.inner.fetchone()

    def fetchall(self) -> Any:
        return self.inner.fetchall()

    def close(self) -> None:
        self.inner.close()


class WrappingConnection:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def cursor(self) -> WrappingCursor:
        return WrappingCursor(self.conn.cursor())


def test_the_sqlstate_is_found_on_the_wrapped_error(db: Scratch, job: ModuleType) -> None:
    with db.connect() as raw:
        row_id = db.new_row(raw)
        raw.commit()
        conn = WrappingConnection(raw)
        with pytest.raises(job.IllegalTransition) as caught:
            job.transition(conn, row_id, "finish", expected_version=0, actor="w", schema=db.schema)
        assert caught.value.state is job.State.QUEUED and caught.value.event is job.Event.FINISH
        assert isinstance(caught.value.__cause__, WrappedError)
        raw.rollback()
        with pytest.raises(job.UnknownRow):
            job.transition(conn, __import__("uuid").uuid4(), "claim", expected_version=0, actor="w", schema=db.schema)


def test_the_async_twins_do_what_the_sync_functions_do(db: Scratch, job: ModuleType) -> None:
    async def run() -> None:
        conn = await psycopg.AsyncConnection.connect(
            db.dsn, user=db.app_role, options=f"-c search_path={db.schema}")  # fmt: skip
        try:
            cur = await conn.execute(db.q("INSERT INTO {table} DEFAULT VALUES RETURNING id"))
            (row_id,) = await cur.fetchone()  # type: ignore[misc]
            assert await job.aget(conn, row_id, schema=db.schema) == job.Job(row_id, job.State.QUEUED, 0)
            (claimed,) = await job.aclaim(conn, "claim", actor="aw", schema=db.schema)
            assert claimed == job.Job(row_id, job.State.CLAIMED, 1)
            assert await job.aheartbeat(conn, row_id, expected_version=1, schema=db.schema) is True
            assert await job.atransition(conn, row_id, "start", expected_version=1, actor="aw", schema=db.schema) == 2
            assert await job.atransition(conn, row_id, "start", expected_version=1, actor="aw", schema=db.schema) is None
            assert await job.areclaim(conn, older_than=timedelta(hours=1), actor="s", schema=db.schema) == []
            assert await job.atransition(conn, row_id, "finish", expected_version=2, actor="aw", schema=db.schema) == 3
            await conn.commit()
            with pytest.raises(job.IllegalTransition):
                await job.atransition(conn, row_id, "start", expected_version=3, actor="aw", schema=db.schema)
            await conn.rollback()
            # Finished in an earlier transaction: older than a microsecond.
            assert await job.apurge(conn, older_than=timedelta(microseconds=1), limit=5, schema=db.schema) == 1
            assert await job.aget(conn, row_id, schema=db.schema) is None
            await conn.commit()
            with pytest.raises(job.UnknownRow):
                await job.aheartbeat(conn, __import__("uuid").uuid4(), expected_version=0, schema=db.schema)
            await conn.rollback()
        finally:
            await conn.close()

    asyncio.run(run())


class RowsCursor:
    """A DB-API cursor that answers a query with the rows of the first key of
    `answers` found in it, and records the queries."""

    def __init__(self, answers: dict[str, list[tuple[Any, ...]]], seen: list[str]) -> None:
        self.answers, self.seen = answers, seen
        self.rows: list[tuple[Any, ...]] = []

    def execute(self, query: str, params: Any = None) -> None:
        self.seen.append(query)
        self.rows = next(rows for key, rows in self.answers.items() if key in query)

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> Any:
        return self.rows

    def close(self) -> None:
        pass


def test_get_and_claim_fill_the_counts_from_the_row(tmp_path: Path) -> None:
    # What a capped machine's get() and claim() read, without a database: the counts
    # come from the row, so a fetched Task whose retries are spent is moved to dead by
    # its next retry (the `otherwise`, language 1.2) as the database would move it.
    task = module_of(machine_of("task"), tmp_path)
    seen: list[str] = []
    # After the counts: when the row was born and entered its state, then its lease
    # (and, where the spec times a state, its due time): read, not compared.
    born = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    stamped = sum(isinstance(v, property) for v in vars(task.Task).values())  # what the database stamps
    times = (born, born, "w1", born, born, None)[:stamped]
    answers = {"task_claim(": [("id-1", "acquired", 8, 5, *times)],
               ".tasks WHERE id OPERATOR(pg_catalog.=) %s": [("failed", 7, 5, *times)]}  # fmt: skip
    conn = type("Conn", (), {"cursor": lambda self: RowsCursor(answers, seen)})()
    fetched = task.get(conn, "id-1")
    assert fetched == task.Task("id-1", task.State.FAILED, 7, retry_count=5)
    assert (fetched.created_at, fetched.claimed_by) == (born, "w1")
    assert fetched.apply("retry") == task.Task("id-1", task.State.DEAD, 8, retry_count=5)
    assert task.Task("id-1", task.State.FAILED, 7, retry_count=4).apply("retry").state == task.State.NEW
    assert task.claim(conn, "acquire", actor="w") == [task.Task("id-1", task.State.ACQUIRED, 8, retry_count=5)]
    assert all("retry_count" in q for q in seen if "task" in q), seen
    assert sum("task_claim(" in q for q in seen) == 1 and len(seen) == 2, seen  # the claim reads no row back


def test_get_and_claim_read_the_counts_of_a_capped_machine(pg_dsn: str, tmp_path: Path) -> None:
    # Waits on the PostgreSQL side of caps (the retry_count column): a row fetched
    # from the database carries its counts.
    task = module_of(machine_of("task"), tmp_path)
    db = Scratch.create(pg_dsn, machine_of("task"))
    try:
        with db.connect() as conn:
            row_id, version = db.row_at(conn, "failed")
            assert task.transition(conn, row_id, "retry", expected_version=version, actor="w", schema=db.schema) == version + 1
            conn.commit()
            assert task.get(conn, row_id, schema=db.schema) == task.Task(row_id, task.State.NEW, version + 1, retry_count=1)
            (claimed,) = task.claim(conn, "acquire", actor="w", schema=db.schema)
            assert claimed == task.Task(row_id, task.State.ACQUIRED, version + 2, retry_count=1)
            conn.rollback()

        async def run() -> None:
            aconn = await psycopg.AsyncConnection.connect(
                db.dsn, user=db.app_role, options=f"-c search_path={db.schema}")  # fmt: skip
            try:
                got = await task.aget(aconn, row_id, schema=db.schema)
                assert got == task.Task(row_id, task.State.NEW, version + 1, retry_count=1)
                (claimed,) = await task.aclaim(aconn, "acquire", actor="aw", schema=db.schema)
                assert claimed == task.Task(row_id, task.State.ACQUIRED, version + 2, retry_count=1)
            finally:
                await aconn.close()

        asyncio.run(run())
    finally:
        db.drop()


MISUSE = """\
import uuid
from typing import Any

import psycopg

import fsm_job

def sync_given_async(conn: psycopg.AsyncConnection[Any]) -> None:
    fsm_job.get(conn, uuid.UUID(int=1))  # type: ignore[arg-type]


async def async_given_sync(conn: psycopg.Connection[Any]) -> None:
    await fsm_job.aget(conn, uuid.UUID(int=1))  # type: ignore[arg-type]


def misspelled(conn: psycopg.Connection[Any]) -> None:
    fsm_job.transition(conn, uuid.UUID(int=1), "cancle", expected_version=0, actor="w")  # type: ignore[arg-type]


def right(conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]) -> None:
    fsm_job.claim(conn, "claim", actor="w")
    fsm_job.aclaim(aconn, "claim", actor="w").close()
    fsm_job.transition(conn, uuid.UUID(int=1), "finish", expected_version=3, actor="w", to="completed")
    assert fsm_job.can_fire("running", "finish") and fsm_job.available_events(fsm_job.State.RUNNING)
"""


def test_mypy_tells_a_sync_connection_from_an_async_one(tmp_path: Path) -> None:
    """Each misuse carries an `ignore[arg-type]`: mypy with --warn-unused-ignores
    reports an unused ignore if it accepted the call, and the right calls pass. A
    misspelled event name is a misuse too (the module's EventName type)."""
    machine = machine_of("job")
    (tmp_path / "fsm_job.py").write_text(generate(machine).files[Paths.of(machine).module])
    # Once with the ignores (must pass: the misuses are errors, the right calls are
    # not) and once without (exactly the three misuses fail).
    (tmp_path / "use.py").write_text(MISUSE)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "fsm_job.py").write_text((tmp_path / "fsm_job.py").read_text())
    (bare / "use.py").write_text(MISUSE.replace("  # type: ignore[arg-type]", ""))
    for folder, expected in ((tmp_path, 0), (bare, 3)):
        ran = harness.mypy("--warn-unused-ignores", folder / "use.py", cwd=folder)
        errors = [line for line in ran.stdout.splitlines() if ": error:" in line]
        assert len(errors) == expected, ran.stdout
        if expected:
            misuses = {str(n) for n, line in enumerate(MISUSE.splitlines(), 1) if "ignore" in line}
            assert {e.split(":")[1] for e in errors} == misuses, ran.stdout
