"""The worker's side of the PostgreSQL file (contract 4.2, issue 11): `<machine>_claim`,
`<machine>_purge`, the `<machine>_intervals` view, `created_at` and `entered_at`.

Every test plays the application as `Scratch.connect()` does (the grants of docs/postgres.md
only); bulk loads and DDL run as the owner.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.conftest import SPECS
from tests.harness import nested_plans
from tests.pg_scratch import Scratch, installs, machine_from_text, machine_of, path_to


# The job machine with its writer role, and without one (issue 23, item 10: every write checked).
@pytest.fixture(params=installs(("job",)))
def db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    name, writer_role = request.param
    scratch = Scratch.create(pg_dsn, machine_of(name), writer_role=writer_role)
    yield scratch
    scratch.drop()


def sqlstate(error: BaseException) -> str | None:
    return getattr(error, "sqlstate", None)


def queued(db: Scratch, n: int) -> list[Any]:
    with db.connect() as conn:
        ids = [db.new_row(conn) for _ in range(n)]
        conn.commit()
    return ids


# --- claim ----------------------------------------------------------------------------


def test_claim_is_planned_once_a_session_and_its_plan_stays_on_the_claim_index(db: Scratch) -> None:
    # PL/pgSQL re-planned each claim for its call's values (to the planner `LIMIT
    # max_rows` may be a tenth of the table), and a plan made for any values, unguided,
    # hash-joined the moved rows to a scan of the whole table. The claim keeps the plan
    # made for any values (its parameters, `$n`, where a call's plan shows its values),
    # on the claim index: here over 20,000 rows whose age runs against their order on disk.
    with db.superuser() as su:
        su.execute("SET session_replication_role = replica")  # backdated rows, as the guard would not allow
        su.execute(db.q("INSERT INTO {table} (state, entered_at)"
                        " SELECT 'queued', now() - g * interval '1 second' FROM generate_series(1, 20000) AS g"))  # fmt: skip
        su.commit()
        su.autocommit = True
        su.execute(db.q("ANALYZE {table}"))
        oldest = [r[0] for r in su.execute(db.q("SELECT id FROM {table} ORDER BY entered_at LIMIT 3")).fetchall()]
    for _ in range(2):  # the second call in the session runs the plan the first made
        plans = [p for p in nested_plans(db, db.q("SELECT id FROM {claim}('claim', 'w', 3)")) if "SKIP LOCKED" in p]
        assert len(plans) == 1, plans
        assert re.search(rf"Index Scan using {re.escape(db.names.claim_index)}\b", plans[0]), plans[0]
        assert not re.search(r"Seq Scan|Hash Join|Merge Join|\bSort\b", plans[0]), plans[0]
        assert re.search(r"ANY \(\$\d+\)", plans[0]), plans[0]  # the sources as a parameter: the generic plan
    with db.connect() as app:
        taken = [r[0] for r in app.execute(db.q("SELECT id FROM {claim}('claim', 'w', 3)")).fetchall()]
        app.commit()
    assert taken == oldest


def test_claim_moves_the_oldest_rows_of_its_source_states_and_logs_them(db: Scratch) -> None:
    ids = []
    with db.connect() as conn:
        for _ in range(3):  # one transaction each: distinct entered_at, oldest first
            ids.append(db.new_row(conn))
            conn.commit()
        running, _ = db.row_at(conn, "running")  # not a source of claim
        started = db.clock(conn)
        got = conn.execute(db.q("SELECT id, state_version FROM {claim}('claim', 'w1', 2)")).fetchall()
        ended = db.clock(conn)
        assert got == [(ids[0], 1), (ids[1], 1)]
        assert db.row(conn, ids[0]) == ("claimed", 1)
        assert db.row(conn, ids[2]) == ("queued", 0)
        assert db.row(conn, running)[0] == "running"
        assert db.events_of(conn, ids[0]) == [(1, "queued", "claim", "claimed", "w1")]
        holder = conn.execute(db.q("SELECT claimed_by, claimed_at, heartbeat_at, entered_at FROM {table}"
                                   " WHERE id = %s"), (ids[0],)).fetchone()  # fmt: skip
        at = conn.execute(db.q("SELECT at FROM {events} WHERE {id_col} = %s"), (ids[0],)).fetchone()
        # Claimed, its lease begun and its event logged at one moment: the claim's.
        assert holder is not None and at is not None and holder[0] == "w1"
        assert started <= holder[1] == holder[2] == holder[3] == at[0] <= ended
        conn.commit()  # the deferred checks agree: every move has its event row
        assert db.replay_problems(conn) == []


def test_claim_refuses_unknown_events_a_wrong_target_and_bad_arguments(db: Scratch) -> None:
    with db.connect() as conn:
        for query, params, code in [
            ("SELECT * FROM {claim}('nope', 'w')", (), "23F02"),
            ("SELECT * FROM {claim}('claim', 'w', 1, 'running')", (), "23F01"),
            ("SELECT * FROM {claim}('claim', 'w', -1)", (), "22023"),
            ("SELECT * FROM {claim}('claim', NULL)", (), "22004"),
        ]:
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(db.q(query), params)
            assert sqlstate(caught.value) == code, query
            conn.rollback()
        assert conn.execute(db.q("SELECT * FROM {claim}('claim', 'w', 1, 'claimed')")).fetchall() == []


def test_eight_concurrent_claimers_over_1000_rows_claim_each_exactly_once(db: Scratch) -> None:
    ids = set(queued(db, 1000))
    claimed: list[Any] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            with db.connect() as conn:
                while True:
                    rows = conn.execute(db.q("SELECT id FROM {claim}('claim', %s, 7)"),
                                        (f"w{n}",)).fetchall()  # fmt: skip
                    conn.commit()
                    if not rows:
                        return
                    with lock:
                        claimed.extend(r[0] for r in rows)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Counter(claimed).most_common(1)[0][1] == 1
    assert set(claimed) == ids
    with db.connect() as conn:
        counts = conn.execute(db.q("SELECT count(*), count(DISTINCT {id_col}) FROM {events}")).fetchone()
        assert counts == (1000, 1000)
        assert db.replay_problems(conn) == []


def bulk_mostly_terminal(db: Scratch, n: int = 100_000) -> None:
    """n rows, 1% queued and the rest completed, loaded by the owner with the insert
    guard off (it refuses rows born terminal; the planner's choice is under test)."""
    with db.owner() as conn:
        conn.execute(db.q("ALTER TABLE {table} DISABLE TRIGGER job_guard_insert"))
        conn.execute(db.q(
            "INSERT INTO {table} (state, state_version, created_at, entered_at)"
            " SELECT CASE WHEN g %% 100 = 0 THEN 'queued' ELSE 'completed' END,"
            "        CASE WHEN g %% 100 = 0 THEN 0 ELSE 4 END,"
            "        now() - interval '2 days', now() - make_interval(secs => g)"
            " FROM generate_series(1, %s) AS g"), (n,))  # fmt: skip
        conn.execute(db.q("ALTER TABLE {table} ENABLE TRIGGER job_guard_insert"))
        conn.commit()
        conn.autocommit = True
        conn.execute(db.q("ANALYZE {table}"))


def test_claim_over_100k_mostly_terminal_rows_reads_the_claim_index(db: Scratch) -> None:
    bulk_mostly_terminal(db)
    plans = [p for p in nested_plans(db, db.q("SELECT * FROM {claim}('claim', 'w', 10)"))
             if "SKIP LOCKED" in p]  # fmt: skip
    assert len(plans) == 1, plans
    index = db.names.claim_index
    assert re.search(rf"Index Scan (Backward )?using {re.escape(index)}\b", plans[0]), plans[0]
    assert "Seq Scan" not in plans[0], plans[0]


def many_claimable_states(extra: int) -> str:
    """specs/job.yaml with `extra` more states a worker may claim from (a `step` event
    leads from queued through them and back), each with `claim` to claimed."""
    text = (SPECS / "job.yaml").read_text(encoding="utf-8")
    states = [f"s{i:04d}" for i in range(extra)]
    text = text.replace("\nterminals:", "\n" + "".join(f"  {s}: waiting\n" for s in states) + "terminals:", 1)
    text = text.replace("\nevents:\n", "\nevents:\n  step: next\n", 1)
    moves = [f"  - {{from: {a}, event: step, to: {b}}}\n" for a, b in zip(["queued", *states], [*states, "queued"], strict=True)]
    moves.append(f"  - {{from: [{', '.join(states)}], event: claim, to: claimed}}\n")
    return text.replace("\ntransitions:\n", "\ntransitions:\n" + "".join(moves), 1)


def test_a_spec_with_a_thousand_claimable_states_installs_and_claim_reads_its_index(pg_dsn: str) -> None:
    # pg_index has no TOAST table: the claim index's predicate as a list of a thousand
    # states made the CREATE INDEX fail ("row is too big"); past LONG_STATE_LIST it
    # names the other states instead, and the claim query the same way.
    machine = machine_from_text(many_claimable_states(1000))
    assert len(machine.state_names) > 1000
    db = Scratch.create(pg_dsn, machine)
    try:
        bulk_mostly_terminal(db)
        plans = [p for p in nested_plans(db, db.q("SELECT * FROM {claim}('claim', 'w', 10)"))
                 if "SKIP LOCKED" in p]  # fmt: skip
        assert len(plans) == 1, plans
        assert re.search(rf"Index Scan (Backward )?using {re.escape(db.names.claim_index)}\b", plans[0]), plans[0]
        with db.connect() as conn:
            claimed = conn.execute(db.q("SELECT id, state_version FROM {claim}('claim', 'w', 3)")).fetchall()
            assert [version for _id, version in claimed] == [1, 1, 1]
            conn.commit()
            predicate = conn.execute(db.q(
                "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i"
                " JOIN pg_class AS c ON c.oid = i.indexrelid"
                " WHERE c.relname = %s AND c.relnamespace = %s::regnamespace"),
                (db.names.claim_index, db.schema)).fetchone()  # fmt: skip
        assert predicate is not None and "NOT (state = ANY" in predicate[0], predicate
    finally:
        db.drop()


def test_the_claim_index_is_partial_and_leaves_heartbeat_at_alone(db: Scratch) -> None:
    with db.connect() as conn:
        row = conn.execute(db.q(
            "SELECT pg_get_indexdef(i.indexrelid), pg_get_expr(i.indpred, i.indrelid)"
            " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " WHERE c.relname = %s AND c.relnamespace = %s::regnamespace"),
            (db.names.claim_index, db.schema)).fetchone()  # fmt: skip
    assert row is not None
    definition, predicate = row
    assert "(entered_at)" in definition and "heartbeat_at" not in definition
    for state in ("queued", "paused", "failed"):
        assert state in predicate
    for state in ("completed", "abandoned", "claimed", "running"):
        assert state not in predicate


def test_heartbeats_after_a_claim_stay_hot_updates(db: Scratch) -> None:
    queued(db, 1)
    with db.connect() as conn:
        (row_id, version), = conn.execute(db.q("SELECT id, state_version FROM {claim}('claim', 'w')")).fetchall()
        conn.commit()
    with db.superuser(autocommit=True) as su:
        def hot() -> tuple[int, int]:
            su.execute("SELECT pg_stat_force_next_flush()")
            got = su.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                             " WHERE relid = %s::regclass", (f"{db.schema}.jobs",)).fetchone()  # fmt: skip
            assert got is not None
            return int(got[0]), int(got[1])

        def reported(updates: int) -> tuple[int, int]:
            """The counts once `updates` updates are in them: a connection reports its
            own when it exits, a moment after it closes, not when it commits."""
            deadline = time.monotonic() + 10
            while (got := hot())[0] < updates and time.monotonic() < deadline:
                time.sleep(0.05)
            return got

        before = reported(1)  # the claim's
        assert before[0] == 1, before
        with db.connect() as conn:
            for _ in range(20):
                got = conn.execute(db.q("SELECT {heartbeat}(%s, %s)"), (row_id, version)).fetchone()
                assert got == (True,)
                conn.commit()
        after = reported(21)
    assert after[0] - before[0] == 20
    assert after[1] - before[1] == 20


# --- purge ----------------------------------------------------------------------------


def finished(db: Scratch, conn: psycopg.Connection[Any], age: timedelta, state: str = "completed") -> Any:
    """A row walked to `state`, its terminal stay backdated by `age` (as the owner:
    entered_at is not a state change, the guards let it through)."""
    row_id, _ = db.row_at(conn, state)
    with db.owner() as owner:
        owner.execute(db.q("UPDATE {table} SET entered_at = now() - %s WHERE id = %s"), (age, row_id))
        owner.commit()
    return row_id


def test_purge_removes_exactly_the_rows_terminal_longer_than_asked_with_their_history(db: Scratch) -> None:
    with db.connect() as conn:
        old = [finished(db, conn, timedelta(days=d), s)
               for d, s in [(10, "completed"), (9, "abandoned"), (8, "completed")]]  # fmt: skip
        young = finished(db, conn, timedelta(hours=1))
        live = [db.row_at(conn, s)[0] for s in ("queued", "running", "failed", "paused")]
        with db.owner() as owner:  # old, but not terminal: never purged
            owner.execute(db.q("UPDATE {table} SET entered_at = now() - interval '30 days'"
                               " WHERE state <> 'completed' AND state <> 'abandoned'"))  # fmt: skip
            owner.commit()
        # In batches, oldest first.
        assert conn.execute(db.q("SELECT {purge}('1 day', 2)")).fetchone() == (2,)
        left = {r[0] for r in conn.execute(db.q("SELECT id FROM {table}")).fetchall()}
        assert old[0] not in left and old[1] not in left and old[2] in left
        assert conn.execute(db.q("SELECT {purge}('1 day', 2)")).fetchone() == (1,)
        assert conn.execute(db.q("SELECT {purge}('1 day', 2)")).fetchone() == (0,)
        conn.commit()
        left = {r[0] for r in conn.execute(db.q("SELECT id FROM {table}")).fetchall()}
        assert left == {young, *live}
        orphans = conn.execute(db.q("SELECT count(*) FROM {events} WHERE {id_col} <> ALL (%s)"),
                               (list(left),)).fetchone()  # fmt: skip
        assert orphans == (0,)
        for row_id in old:
            assert db.events_of(conn, row_id) == []
        assert db.replay_problems(conn) == []


def test_purge_refuses_negative_and_null_arguments(db: Scratch) -> None:
    with db.connect() as conn:
        for query, code in [("SELECT {purge}('-1 day', 1)", "22023"), ("SELECT {purge}('1 day', -1)", "22023"),
                            ("SELECT {purge}(NULL, 1)", "22004")]:  # fmt: skip
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(db.q(query))
            assert sqlstate(caught.value) == code
            conn.rollback()


def test_a_row_finished_in_this_transaction_is_not_purged_even_at_the_least_age(db: Scratch) -> None:
    with db.connect() as conn:
        row_id = db.new_row(conn)
        for version, event in enumerate(path_to(db.machine, "completed")):
            db.apply(conn, row_id, event, version)
        assert conn.execute(db.q("SELECT {purge}('1 microsecond', 10)")).fetchone() == (0,)
        conn.commit()
        # An age that reaches no further back than now is refused: it would purge what
        # just finished ('-1 year +361 days' is "positive", PostgreSQL's months being
        # 30 days, and reaches 4 days ahead).
        for age in ("0", "-1 second", "-1 year +361 days"):
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(db.q("SELECT {purge}(%s::interval, 10)"), (age,))
            assert sqlstate(caught.value) == "22023", age
            conn.rollback()
        assert db.row(conn, row_id)[0] == "completed"


def test_delete_outside_purge_still_fails_and_the_ticket_cannot_be_forged(db: Scratch) -> None:
    with db.connect() as conn:
        row_id = finished(db, conn, timedelta(days=2))
        # The application role: DELETE on the log, on the row, and a forged ticket.
        for query in ("DELETE FROM {events} WHERE {id_col} = %s", "DELETE FROM {table} WHERE id = %s"):
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(db.q(query), (row_id,))
            assert sqlstate(caught.value) == "42501"  # no DELETE grant at all
            conn.rollback()
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(db.q("INSERT INTO job_purge_tickets VALUES (pg_current_xact_id())"))
        assert sqlstate(caught.value) == "42501"
        conn.rollback()
        for setting in ("fsmc.purging", "job.purge"):  # a setting opens nothing
            conn.execute("SELECT set_config(%s, 'on', true)", (setting,))
        conn.rollback()
    # Even the owner, who has every grant, cannot delete history by hand: the
    # append-only trigger refuses, and the row's history holds it in place (a DELETE
    # or TRUNCATE of the table is refused while the log refers to it).
    with db.owner() as owner:
        with pytest.raises(psycopg.Error) as caught:
            owner.execute(db.q("DELETE FROM {events} WHERE {id_col} = %s"), (row_id,))
        assert sqlstate(caught.value) == "23F06"
        owner.rollback()
        with pytest.raises(psycopg.Error) as caught:
            owner.execute(db.q("DELETE FROM {table} WHERE id = %s"), (row_id,))
        assert sqlstate(caught.value) == "23F06"
        owner.rollback()
        with pytest.raises(psycopg.Error) as caught:
            owner.execute(db.q("TRUNCATE {table}"))
        assert sqlstate(caught.value) == "23F06"
        owner.rollback()
        # A ticket of another transaction opens nothing in this one.
        owner.execute(db.q("INSERT INTO job_purge_tickets VALUES ('1'::xid8)"))
        with pytest.raises(psycopg.Error) as caught:
            owner.execute(db.q("DELETE FROM {events} WHERE {id_col} = %s"), (row_id,))
        assert sqlstate(caught.value) == "23F06"
        owner.rollback()
    with db.connect() as conn:
        assert conn.execute(db.q("SELECT {purge}('1 day', 5)")).fetchone() == (1,)
        conn.commit()
    with db.owner() as owner:  # purge leaves no ticket behind
        assert owner.execute(db.q("SELECT count(*) FROM job_purge_tickets")).fetchone() == (0,)


# --- intervals ------------------------------------------------------------------------


def test_intervals_gives_every_stay_exactly_from_the_first_to_the_current(db: Scratch) -> None:
    """Each move in its own transaction, stamped with the moment it was written (the
    row's created_at, then its entered_at after each move): the view's entered/left/
    duration must be those times exactly, the current stay measured to the clock."""
    events = ["claim", "start", "reclaim", "claim", "start", "error"]
    stamp = db.q("SELECT entered_at FROM {table} WHERE id = %s")
    with db.connect() as conn:
        row_id = db.new_row(conn)
        born = conn.execute(db.q("SELECT created_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()[0]  # type: ignore[index]
        conn.commit()
        times = [born]
        for version, event in enumerate(events):
            db.apply(conn, row_id, event, version, actor=f"a{version}")
            times.append(conn.execute(stamp, (row_id,)).fetchone()[0])  # type: ignore[index]
            conn.commit()
        before = db.clock(conn)
        rows = conn.execute(db.q(
            "SELECT state, version, entered_at, left_at, duration, entered_event, left_event,"
            " entered_actor, left_actor, left_at IS NULL"
            " FROM {intervals} WHERE id = %s ORDER BY version"), (row_id,)).fetchall()  # fmt: skip
        after = db.clock(conn)
    states = ["queued", "claimed", "running", "queued", "claimed", "running", "failed"]
    assert [r[0] for r in rows] == states
    assert [r[1] for r in rows] == list(range(len(states)))
    for i, row in enumerate(rows):
        state, version, entered, left, duration, e_in, e_out, a_in, a_out, current = row
        assert entered == times[i]
        assert e_in == (None if i == 0 else events[i - 1])
        assert a_in == (None if i == 0 else f"a{i - 1}")
        if i < len(events):
            assert (left, duration, e_out, a_out) == (times[i + 1], times[i + 1] - times[i], events[i], f"a{i}")
            assert current is False
        else:  # the current stay: open, measured to the clock
            assert (left, e_out, a_out) == (None, None, None)
            assert before - entered <= duration <= after - entered and current is True


def test_a_row_that_never_moved_has_one_stay_from_created_at(db: Scratch) -> None:
    with db.connect() as conn:
        row_id = db.new_row(conn)
        conn.commit()
        rows = conn.execute(db.q(
            "SELECT i.state, i.entered_at = t.created_at, i.left_at, i.entered_event"
            " FROM {intervals} AS i JOIN {table} AS t USING (id) WHERE id = %s"), (row_id,)).fetchall()  # fmt: skip
    assert rows == [("queued", True, None, None)]


def test_the_dwell_question_is_one_query_on_the_view(db: Scratch) -> None:
    """Seed 000: the longest a job has spent in claimed without progressing to running."""
    with db.connect() as conn:
        slow, _ = db.row_at(conn, "claimed")
        db.row_at(conn, "running")
        # `slow` is still in claimed, since an earlier transaction; the other row went
        # from claimed to running within one (a stay of zero).
        got = conn.execute(db.q(
            "SELECT id, duration FROM {intervals}"
            " WHERE state = 'claimed' AND left_event IS DISTINCT FROM 'start'"
            " ORDER BY duration DESC LIMIT 1")).fetchone()  # fmt: skip
    assert got is not None and got[0] == slow


def test_claim_out_of_a_lease_state_keeps_the_claim_and_refreshes_the_heartbeat(db: Scratch) -> None:
    """Sources inside the lease take claim's other branch (no claim index there)."""
    queued(db, 2)
    with db.connect() as conn:
        first = conn.execute(db.q("SELECT id, state_version FROM {claim}('claim', 'w1', 2)")).fetchall()
        conn.commit()
        got = conn.execute(db.q("SELECT id, state_version FROM {claim}('start', 'w2', 5)")).fetchall()
        assert sorted(got) == sorted((i, 2) for i, _v in first)
        rows = conn.execute(db.q("SELECT state, claimed_by, heartbeat_at = entered_at FROM {table}")).fetchall()
        assert rows == [("running", "w1", True)] * 2  # claimed by w1, started by w2's call
        conn.commit()
        assert db.replay_problems(conn) == []


def test_claim_on_a_machine_without_lease(pg_dsn: str) -> None:
    runner = Scratch.create(pg_dsn, machine_of("runner"))
    try:
        m = runner.machine
        event = next(e for (s, e) in m.targets if s == str(m.initial))
        with runner.connect() as conn:
            ids = [runner.new_row(conn) for _ in range(3)]
            conn.commit()
            got = conn.execute(runner.q("SELECT id, state_version FROM {claim}(%s, 'w', 10)"), (event,)).fetchall()
            assert sorted(got) == sorted((i, 1) for i in ids)
            conn.commit()
            assert runner.replay_problems(conn) == []
    finally:
        runner.drop()
