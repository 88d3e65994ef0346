"""Language 1.2's timed transitions in the database (specs/queue.yaml, a River-style
queue): `after: due_at` (a scheduled job), a backoff on a capped event (a retried
job), the due time the database keeps, NotDue, and a claim of a timed event that
reads the due index and takes only due rows, earliest first.

No test sleeps out a timer: a row is made due by setting its due_at as the owner.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from fsmc.pipeline import check
from fsmc.source import Source
from tests.harness import nested_plans, refused, sqlstate_of
from tests.pg_scratch import Scratch, machine_of

NOT_DUE = "23F08"


@pytest.fixture
def queue(pg_dsn: str) -> Iterator[Scratch]:
    scratch = Scratch.create(pg_dsn, machine_of("queue"))
    yield scratch
    scratch.drop()


def due_at(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> tuple[str, datetime | None, datetime]:
    got = conn.execute(db.q("SELECT state, due_at, entered_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()
    assert got is not None
    return got[0], got[1], got[2]


def make_due(db: Scratch, row_id: Any, when: str = "now() - interval '1 second'") -> None:
    with db.owner() as owner:
        owner.execute(db.q(f"UPDATE {{table}} SET due_at = {when} WHERE id = %s"), (row_id,))
        owner.commit()


def test_a_scheduled_job_waits_for_the_time_it_was_given(queue: Scratch) -> None:
    db, later = queue, datetime(2100, 1, 1, tzinfo=UTC)
    with db.connect() as app:
        row = app.execute(db.q("INSERT INTO {table} (state, due_at) VALUES ('scheduled', %s) RETURNING id"),
                          (later,)).fetchone()  # fmt: skip
        assert row is not None
        job = row[0]
        at_once = app.execute(db.q("INSERT INTO {table} (state) VALUES ('scheduled') RETURNING id")).fetchone()
        assert at_once is not None
        # A state that waits for nothing has no due time, whatever the insert says.
        ready = app.execute(db.q("INSERT INTO {table} (due_at) VALUES (%s) RETURNING id"), (later,)).fetchone()
        assert ready is not None
        app.commit()
        assert due_at(db, app, job)[1] == later
        assert due_at(db, app, at_once[0])[1] == due_at(db, app, at_once[0])[2]  # no time given: due at once
        assert due_at(db, app, ready[0])[1] is None
        # Before its time: refused with 23F08, and a claim of `schedule` leaves it.
        error = refused(app, db.q("SELECT {apply}(%s, 'schedule', 0, 'w')"), (job,))
        assert sqlstate_of(error) == NOT_DUE and "is not due until" in str(error)
        taken = {r[0] for r in app.execute(db.q("SELECT * FROM {claim}('schedule', 'w', 100)")).fetchall()}
        assert at_once[0] in taken and job not in taken
        app.commit()
        # The application cannot bring its time forward; the owner can.
        assert sqlstate_of(refused(app, db.q("UPDATE {table} SET due_at = now() WHERE id = %s"), (job,))) == "42501"
    make_due(db, job)
    with db.connect() as app:
        assert db.apply(app, job, "schedule", 0, actor="w") == 1
        assert due_at(db, app, job)[:2] == ("available", None)
        app.commit()


def test_a_retry_backs_off_doubling_up_to_its_max(queue: Scratch) -> None:
    # `{from: retryable, event: retry, to: available, after: {backoff: 1s, factor: 2, max: 1h}}`
    db = queue
    waits = []
    with db.connect() as app:
        job = db.new_row(app)
        app.commit()
        version = 0
        for _ in range(14):
            version = db.apply(app, job, "fetch", version, actor="w") or -1
            version = db.apply(app, job, "error", version, actor="w") or -1
            app.commit()
            state, due, entered = due_at(db, app, job)
            assert state == "retryable" and due is not None
            waits.append(due - entered)
            error = refused(app, db.q("SELECT {apply}(%s, 'retry', %s, 'w')"), (job, version))
            assert sqlstate_of(error) == NOT_DUE
            make_due(db, job)
            version = db.apply(app, job, "retry", version, actor="w") or -1
            app.commit()
    assert waits == [min(timedelta(hours=1), timedelta(seconds=2**n)) for n in range(14)]


def test_a_claim_of_a_timed_event_reads_the_due_index_and_takes_the_earliest_due_first(queue: Scratch) -> None:
    db, later = queue, datetime(2100, 1, 1, tzinfo=UTC)
    with db.owner() as owner:
        owner.execute(db.q("INSERT INTO {table} (state, due_at)"
                           " SELECT 'scheduled', %s + g * interval '1 second' FROM generate_series(1, 20000) AS g"),
                      (later,))  # fmt: skip
        due = [r[0] for r in owner.execute(db.q(
            "INSERT INTO {table} (state, due_at)"
            " SELECT 'scheduled', now() - g * interval '1 minute' FROM generate_series(1, 5) AS g RETURNING id"
        )).fetchall()]  # fmt: skip
        owner.commit()
        owner.autocommit = True
        owner.execute(db.q("ANALYZE {table}"))
    plans = [p for p in nested_plans(db, db.q("SELECT * FROM {claim}('schedule', 'w', 3)")) if "SKIP LOCKED" in p]
    assert len(plans) == 1, plans
    assert re.search(rf"Index Scan using {re.escape(db.names.due_index)}\b", plans[0]), plans[0]
    assert "Seq Scan" not in plans[0], plans[0]
    with db.connect() as app:
        taken = [r[0] for r in app.execute(db.q("SELECT * FROM {claim}('schedule', 'w', 10)")).fetchall()]
        assert taken == list(reversed(due))  # the earliest due first; none of the 20,000 later ones
        app.commit()


def test_a_move_by_hand_gets_the_due_time_the_spec_gives(queue: Scratch) -> None:
    # Defense in depth: a direct write into a timed state (with its event row) is due
    # as a move by the function would be, not when the writer says.
    db = queue
    with db.connect() as app:
        job, version = db.row_at(app, "running")
        app.execute(db.q("UPDATE {table} SET state = 'retryable', state_version = %s WHERE id = %s"),
                    (version + 1, job))  # fmt: skip
        app.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                         " VALUES (%s, %s, 'running', 'error', 'retryable', 'op')"), (job, version + 1))  # fmt: skip
        app.commit()
        state, due, entered = due_at(db, app, job)
        assert state == "retryable" and due is not None and due - entered == timedelta(seconds=1)


def test_a_delay_on_a_machine_without_caps_installs_and_waits(pg_dsn: str) -> None:
    # A timed edge with no cap anywhere (no budget to count): the budget parts of the
    # functions and of the commit-time check have nothing to say, and were once
    # written anyway (a CASE with no WHEN, a DECLARE missing), so the .sql did not install.
    text = b"""fsmc: 1
machine: remind
initial: waiting
states: [waiting, sent]
terminals: [sent]
events: [send]
transitions:
  - {from: waiting, event: send, to: sent, after: 30s}
"""
    result = check(Source("remind.yaml", "remind.yaml", text))
    assert result.machine is not None and not result.diagnostics
    db = Scratch.create(pg_dsn, result.machine)
    try:
        with db.connect() as app:
            row_id = db.new_row(app)
            app.commit()
            assert sqlstate_of(refused(app, db.q("SELECT {apply}(%s, 'send', 0, 'w', NULL, NULL)"), (row_id,))) == NOT_DUE
            make_due(db, row_id)
            assert app.execute(db.q("SELECT {apply}(%s, 'send', 0, 'w', NULL, NULL)"), (row_id,)).fetchone() == (1,)
            app.commit()
            assert due_at(db, app, row_id)[:2] == ("sent", None)
    finally:
        db.drop()
