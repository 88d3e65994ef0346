"""Language 1.2's budgets in the database (specs/queue.yaml, a River-style queue):
several initial states, caps per row chosen at insert, what a spent budget decides
(`otherwise`, `spent`) in `_apply`, `_claim` and `_reclaim`, and `reset`.

Every test plays the application as `Scratch.connect()` does (the grants of docs/postgres.md
only); what only an owner can do (spend a budget by hand) runs as the owner.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.harness import refused, sqlstate_of
from tests.pg_scratch import Scratch, machine_of


@pytest.fixture(scope="module")
def queue(pg_dsn: str) -> Iterator[Scratch]:
    scratch = Scratch.create(pg_dsn, machine_of("queue"))
    yield scratch
    scratch.drop()


def insert(db: Scratch, conn: psycopg.Connection[Any], state: str = "available", fetch_cap: int | None = None) -> Any:
    if fetch_cap is None:
        row = conn.execute(db.q("INSERT INTO {table} (state) VALUES (%s) RETURNING id"), (state,)).fetchone()
    else:
        row = conn.execute(db.q("INSERT INTO {table} (state, fetch_cap) VALUES (%s, %s) RETURNING id"),
                           (state, fetch_cap)).fetchone()  # fmt: skip
    assert row is not None
    return row[0]


def budget(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> tuple[str, int, int, int]:
    got = conn.execute(db.q("SELECT state, state_version, fetch_count, fetch_cap FROM {table} WHERE id = %s"),
                       (row_id,)).fetchone()  # fmt: skip
    assert got is not None
    return str(got[0]), int(got[1]), int(got[2]), int(got[3])


def test_a_row_is_born_in_any_initial_state_with_the_cap_it_is_given(queue: Scratch) -> None:
    db = queue
    with db.connect() as app:
        default = db.new_row(app)
        later = insert(db, app, "scheduled", fetch_cap=1000)
        assert budget(db, app, default) == ("available", 0, 0, 25)
        assert budget(db, app, later) == ("scheduled", 0, 0, 1000)
        app.commit()
        # Born elsewhere, or with a cap past the spec's max, or with a count: refused.
        assert sqlstate_of(refused(app, db.q("INSERT INTO {table} (state) VALUES ('running')"))) == "23F04"
        assert sqlstate_of(refused(app, db.q("INSERT INTO {table} (fetch_cap) VALUES (1001)"))) == "23514"
        assert sqlstate_of(refused(app, db.q("INSERT INTO {table} (fetch_count) VALUES (1)"))) == "42501"
        # A row's cap is fixed: the application may not change it, the owner's write is refused.
        assert sqlstate_of(refused(app, db.q("UPDATE {table} SET fetch_cap = 5 WHERE id = %s"), (later,))) == "42501"
    with db.owner() as owner:
        error = refused(owner, db.q("UPDATE {table} SET fetch_cap = 5 WHERE id = %s"), (later,))
        assert sqlstate_of(error) == "23F04" and "fixed when the row is inserted" in str(error)


def test_claim_takes_no_row_whose_own_cap_is_spent(queue: Scratch) -> None:
    db = queue
    with db.connect() as app:
        never = insert(db, app, fetch_cap=0)
        once = insert(db, app, fetch_cap=1)
        app.commit()
        claimed = {r[0] for r in app.execute(db.q("SELECT * FROM {claim}('fetch', 'w', 1000)")).fetchall()}
        assert once in claimed and never not in claimed
        assert budget(db, app, once)[:3] == ("running", 1, 1)
        assert budget(db, app, never)[:3] == ("available", 0, 0)
        # By _apply, the refusal names the row's own cap.
        error = refused(app, db.q("SELECT {apply}(%s, 'fetch', 0, 'w')"), (never,))
        assert sqlstate_of(error) == "23F07" and "cap=0" in str(getattr(error.diag, "message_detail", ""))
        app.commit()


def test_reclaim_retries_while_attempts_remain_and_discards_once_they_are_spent(queue: Scratch) -> None:
    # River's rescuer: `{from: running, event: rescue, to: retryable, otherwise: discarded, spent: fetch}`.
    db = queue
    with db.connect() as app:
        left = insert(db, app, fetch_cap=2)
        spent = insert(db, app, fetch_cap=1)
        app.commit()
        for row_id in (left, spent):
            assert db.apply(app, row_id, "fetch", 0, actor="w") == 1
        app.commit()
        reclaimed = {r[0] for r in app.execute(db.q("SELECT * FROM {reclaim}('1 microsecond', 'sup')")).fetchall()}
        assert {left, spent} <= reclaimed
        assert budget(db, app, left) == ("retryable", 2, 1, 2)
        assert budget(db, app, spent) == ("discarded", 2, 1, 1)  # the otherwise counts nothing
        assert db.events_of(app, spent)[-1] == (2, "running", "rescue", "discarded", "sup")
        app.commit()
        assert db.replay_problems(app) == []


def test_apply_goes_to_the_otherwise_once_the_budget_is_spent_and_a_revive_resets_it(queue: Scratch) -> None:
    db = queue
    with db.connect() as app:
        row_id = insert(db, app, fetch_cap=1)
        app.commit()
        assert db.apply(app, row_id, "fetch", 0, actor="w") == 1
        assert db.apply(app, row_id, "error", 1, actor="w") == 2
        assert budget(db, app, row_id) == ("discarded", 2, 1, 1)
        # The operator's revive gives the attempts back: the job runs again.
        assert db.apply(app, row_id, "revive", 2, actor="op") == 3
        assert budget(db, app, row_id) == ("available", 3, 0, 1)
        assert db.apply(app, row_id, "fetch", 3, actor="w") == 4
        app.commit()
        # By hand, a move against the budget (the error of a spent job to retryable)
        # is refused at commit; the right one passes.
        app.execute(db.q("UPDATE {table} SET state = 'retryable', state_version = 5 WHERE id = %s"), (row_id,))
        app.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                         " VALUES (%s, 5, 'running', 'error', 'retryable', 'op')"), (row_id,))  # fmt: skip
        with pytest.raises(psycopg.Error) as raised:
            app.commit()
        assert sqlstate_of(raised.value) == "23F05" and "spent" in str(raised.value)
        app.rollback()
        app.execute(db.q("UPDATE {table} SET state = 'discarded', state_version = 5 WHERE id = %s"), (row_id,))
        app.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                         " VALUES (%s, 5, 'running', 'error', 'discarded', 'op')"), (row_id,))  # fmt: skip
        app.commit()
        assert budget(db, app, row_id) == ("discarded", 5, 1, 1)
        assert db.replay_problems(app) == []


def test_two_supervisors_and_a_worker_race_and_every_row_goes_where_its_budget_says(queue: Scratch) -> None:
    db = queue
    with db.connect() as app:
        # 30 rows: running holds at most 50 (the spec's limit), earlier tests' rows included.
        caps = {insert(db, app, fetch_cap=n % 3 + 1): n % 3 + 1 for n in range(30)}
        app.commit()
        for row_id in caps:
            assert db.apply(app, row_id, "fetch", 0, actor="w") == 1
        app.commit()
    got: list[Any] = []
    errors: list[BaseException] = []

    def supervise() -> None:
        try:
            with db.connect() as conn:
                got.extend(r[0] for r in conn.execute(db.q("SELECT * FROM {reclaim}('1 microsecond', 's')")).fetchall())
                conn.commit()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=supervise) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    mine = [r for r in got if r in caps]
    assert sorted(mine, key=str) == sorted(caps, key=str)  # each row reclaimed exactly once
    with db.connect() as app:
        for row_id, cap in caps.items():
            assert budget(db, app, row_id)[0] == ("discarded" if cap == 1 else "retryable")
