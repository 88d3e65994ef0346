"""Choices and caps in the PostgreSQL schema (contract 1.1 and 4.2, issue 10), against
the real server, as the application role unless a test says otherwise.

- choices: `_apply(..., to_state => t)` accepts every target of every choice, and
  refuses (23F01, changing nothing) a NULL `to_state` on a choice (the message lists
  the targets) and a state the choice does not list; a single-target pair accepts
  NULL or its own target and refuses any other; `_claim` on a choice needs
  `to_state` and moves the rows it takes to that target;
- caps: a capped event fires N times and the N+1th is refused with 23F07 through
  `_apply` (changing nothing), `_claim` (rows at the cap are skipped) and a direct
  UPDATE; the count columns refuse every other direct edit (23F04 at once, 23F05 at
  COMMIT), and their CHECK holds when the triggers are off (23514);
- random traffic leaves a log that replays to every row's state, version and counts.

The machines are the 1.1 examples of specs/, each installed once per module: tests
make their own rows, and the ones that scan the whole table (`_claim`) get a schema
of their own.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from fsmc.model import Machine
from fsmc.targets import sqlstate
from tests.harness import refused, refused_at_commit, snapshot, sqlstate_of
from tests.pg_scratch import Scratch, count_column, machine_of

CHOICE_MACHINES = ("review", "breaker")  # a choice with a self-loop target; one on a machine with no terminal
CAPPED_MACHINES = ("capped_task", "subscription")  # retry capped at 5 (1.1's task); a capped self-loop (extend_trial: 2)
MACHINES = CHOICE_MACHINES + CAPPED_MACHINES


def machine(name: str) -> Machine:
    m = machine_of(name)
    assert m.choices or m.cap_limits, f"{name} uses neither a choice nor a cap"
    return m


@pytest.fixture(scope="module")
def dbs(pg_dsn: str) -> Iterator[Callable[[str], Scratch]]:
    """One scratch schema per machine for the whole module (rows are per test)."""
    made: dict[str, Scratch] = {}

    def get(name: str) -> Scratch:
        if name not in made:
            made[name] = Scratch.create(pg_dsn, machine(name))
        return made[name]

    yield get
    for scratch in made.values():
        scratch.drop()


@pytest.fixture
def fresh(pg_dsn: str) -> Iterator[Callable[[str], Scratch]]:
    """A schema of the test's own, for functions that scan the whole table."""
    made: list[Scratch] = []

    def get(name: str) -> Scratch:
        made.append(Scratch.create(pg_dsn, machine(name)))
        return made[-1]

    yield get
    for scratch in made:
        scratch.drop()


# --- moving rows -----------------------------------------------------------------


def apply(db: Scratch, conn: psycopg.Connection[Any], row_id: Any, event: str, version: int,
          to_state: str | None = None) -> int | None:  # fmt: skip
    got = conn.execute(db.q("SELECT {apply}(%s, %s, %s, %s, to_state => %s::text)"),
                       (row_id, event, version, "tester", to_state)).fetchone()  # fmt: skip
    assert got is not None
    return None if got[0] is None else int(got[0])


APPLY = "SELECT {apply}(%s, %s, %s, 'tester', to_state => %s::text)"


def walk_events(m: Machine, start: str, into: str, avoid: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(event, target) of a shortest walk from `start` to `into` over every target of
    every choice, using no event in `avoid`."""
    seen: dict[str, list[tuple[str, str]]] = {start: []}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if here == into:
            return seen[here]
        for source, event, target in m.edges:
            if source == here and event not in avoid and target not in seen:
                seen[target] = seen[here] + [(event, target)]
                queue.append(target)
    raise AssertionError(f"no walk from {start} to {into}")


def step(db: Scratch, conn: psycopg.Connection[Any], row_id: Any, event: str, version: int,
         to_state: str | None = None) -> int:  # fmt: skip
    """`apply`, which must move the row; the new version."""
    got = apply(db, conn, row_id, event, version, to_state)
    assert got == version + 1, (row_id, event, version, to_state)
    return got


def walk(db: Scratch, conn: psycopg.Connection[Any], row_id: Any, version: int, start: str, into: str,
         avoid: frozenset[str] = frozenset()) -> int:  # fmt: skip
    for event, target in walk_events(db.machine, start, into, avoid):
        version = step(db, conn, row_id, event, version, target)
    return version


def row_in(db: Scratch, conn: psycopg.Connection[Any], state: str) -> tuple[Any, int]:
    """A fresh row walked to `state` (choices included), committed; (id, version)."""
    row_id = db.new_row(conn)
    version = walk(db, conn, row_id, 0, str(db.machine.initial), state)
    conn.commit()
    return row_id, version


def counts(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> dict[str, int]:
    events = list(db.machine.cap_limits)
    got = conn.execute(db.q("SELECT " + ", ".join(count_column(e) for e in events)
                            + " FROM {table} WHERE id = %s"), (row_id,)).fetchone()  # fmt: skip
    assert got is not None
    return dict(zip(events, got, strict=True))


def at_cap(db: Scratch, conn: psycopg.Connection[Any], event: str) -> tuple[Any, int, str]:
    """A fresh row that has fired `event` its cap's worth, back in a source state of
    `event`, committed; (id, version, that state)."""
    m = db.machine
    (source, target), *_ = ((s, t) for s, e, t in m.edges if e == event)
    row_id, version = row_in(db, conn, source)
    for n in range(1, m.cap_limits[event] + 1):
        version = step(db, conn, row_id, event, version, target)
        assert counts(db, conn, row_id)[event] == n
        version = walk(db, conn, row_id, version, target, source, avoid=frozenset(m.cap_limits))
    conn.commit()
    return row_id, version, source


# --- choices ---------------------------------------------------------------------


@pytest.mark.parametrize("name", CHOICE_MACHINES)
def test_every_target_of_every_choice_is_accepted(dbs: Callable[[str], Scratch], name: str) -> None:
    db = dbs(name)
    assert db.machine.choices
    with db.connect() as app:
        for (state, event), targets in db.machine.choices.items():
            for target in targets:
                row_id, version = row_in(db, app, state)
                assert apply(db, app, row_id, event, version, target) == version + 1
                assert db.row(app, row_id) == (target, version + 1)
                assert db.events_of(app, row_id)[-1] == (version + 1, state, event, target, "tester")
                app.commit()


@pytest.mark.parametrize("name", CHOICE_MACHINES)
def test_a_choice_refuses_a_null_target_and_every_state_it_does_not_list(
    dbs: Callable[[str], Scratch], name: str
) -> None:
    db = dbs(name)
    with db.connect() as app:
        for (state, event), targets in db.machine.choices.items():
            row_id, version = row_in(db, app, state)
            before = snapshot(db, app)
            error = refused(app, db.q(APPLY), (row_id, event, version, None))
            assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION
            assert error.diag.message_primary is not None
            assert error.diag.message_primary.endswith("pass to_state, one of " + ", ".join(targets)), error
            others = [s for s in db.machine.state_names if s not in targets] + ["nowhere"]
            for other in others:
                error = refused(app, db.q(APPLY), (row_id, event, version, other))
                assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION, (other, error)
                assert f'not to state "{other}"' in str(error) and ", ".join(targets) in str(error)
            assert snapshot(db, app) == before


@pytest.mark.parametrize("name", MACHINES)
def test_a_single_target_pair_accepts_null_or_its_own_target_and_refuses_another(
    dbs: Callable[[str], Scratch], name: str
) -> None:
    db = dbs(name)
    with db.connect() as app:
        for (state, event), target in db.machine.single.items():
            row_id, version = row_in(db, app, state)
            other = next(s for s in db.machine.state_names if s != target)
            error = refused(app, db.q(APPLY), (row_id, event, version, other))
            assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION, (state, event, other)
            with app.transaction(force_rollback=True):
                assert apply(db, app, row_id, event, version, target) == version + 1
            assert apply(db, app, row_id, event, version) == version + 1
            assert db.row(app, row_id) == (target, version + 1)
            app.commit()


def test_claim_on_a_choice_needs_to_state_and_moves_rows_to_that_target(fresh: Callable[[str], Scratch]) -> None:
    db = fresh("breaker")
    (state, event), targets = next(iter(db.machine.choices.items()))  # half_open --trial--> closed | open
    claim = db.q("SELECT id, state_version FROM {claim}(%s, 'worker', %s, to_state => %s::text)")
    with db.connect() as app:
        waiting = {row_in(db, app, state) for _ in range(3)}
        bystander = row_in(db, app, targets[0])
        before = snapshot(db, app)
        error = refused(app, claim, (event, 10, None))
        assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION and "pass to_state" in str(error)
        elsewhere = next(s for s in db.machine.state_names if s not in targets)
        error = refused(app, claim, (event, 10, elsewhere))
        assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION and f'"{elsewhere}"' in str(error)
        assert snapshot(db, app) == before

        first = set(app.execute(claim, (event, 2, targets[1])).fetchall())
        rest = set(app.execute(claim, (event, 10, targets[0])).fetchall())
        app.commit()
        assert len(first) == 2 and len(rest) == 1
        assert first | rest == {(row_id, version + 1) for row_id, version in waiting}
        for (row_id, version), target in [(r, targets[1]) for r in first] + [(r, targets[0]) for r in rest]:
            assert db.row(app, row_id) == (target, version)
            assert db.events_of(app, row_id)[-1] == (version, state, event, target, "worker")
        assert db.row(app, bystander[0]) == (targets[0], bystander[1])


# --- caps ------------------------------------------------------------------------


@pytest.mark.parametrize("name", CAPPED_MACHINES)
def test_a_capped_event_fires_its_cap_and_apply_refuses_the_next_with_23f07(
    dbs: Callable[[str], Scratch], name: str
) -> None:
    db = dbs(name)
    with db.connect() as app:
        for event, cap in db.machine.cap_limits.items():
            row_id, version, source = at_cap(db, app, event)
            assert counts(db, app, row_id)[event] == cap
            before = snapshot(db, app)
            error = refused(app, db.q(APPLY), (row_id, event, version, None))
            assert sqlstate_of(error) == sqlstate.CAP_REACHED, error
            assert f'event "{event}" has fired {cap} times' in str(error)
            assert snapshot(db, app) == before
            # The version is checked before the event, the cap included: a stale caller
            # learns that someone moved the row, as with any other event.
            assert apply(db, app, row_id, event, version - 1) is None
            app.rollback()
            # The cap stops the event, not the row.
            other = next(e for s, e, _t in db.machine.edges if s == source and e != event)
            assert apply(db, app, row_id, other, version) == version + 1
            app.commit()


def test_claim_skips_rows_at_the_cap(fresh: Callable[[str], Scratch]) -> None:
    db = fresh("capped_task")
    (event, cap), = db.machine.cap_limits.items()  # fmt: skip
    claim = db.q("SELECT id, state_version FROM {claim}(%s, 'worker', %s)")
    with db.connect() as app:
        capped, capped_version, source = at_cap(db, app, event)  # the oldest in `source`
        under, under_version = row_in(db, app, source)
        assert app.execute(claim, (event, 1)).fetchall() == [(under, under_version + 1)]
        assert app.execute(claim, (event, 10)).fetchall() == []
        app.commit()
        assert db.row(app, capped) == (source, capped_version)
        assert counts(db, app, capped) == {event: cap}
        assert counts(db, app, under) == {event: 1}


def test_a_direct_update_past_the_cap_is_refused_with_23f07(dbs: Callable[[str], Scratch]) -> None:
    db = dbs("capped_task")
    (event, cap), = db.machine.cap_limits.items()  # fmt: skip
    (source, target), = ((s, t) for s, e, t in db.machine.edges if e == event)  # fmt: skip
    column = count_column(event)
    move = db.q(f"UPDATE {{table}} SET state = %s, state_version = state_version + 1,"
                f" {column} = {column} + 1 WHERE id = %s")  # fmt: skip
    log = db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
               " VALUES (%s, %s, %s, %s, %s, 'owner')")  # fmt: skip
    with db.connect() as app:
        capped, capped_version, _ = at_cap(db, app, event)
        under, under_version = row_in(db, app, source)
    for conn in (db.owner(), db.connect()):
        with conn:
            error = refused(conn, move, (target, capped))
            assert sqlstate_of(error) == sqlstate.CAP_REACHED, error
            assert f'has fired {cap} times' in str(error)
    # The same statement under the cap, logged, is a legal manual move.
    with db.owner() as owner:
        owner.execute(move, (target, under))
        owner.execute(log, (under, under_version + 1, source, event, target))
        owner.commit()
        assert db.row(owner, under) == (target, under_version + 1)
        assert counts(db, owner, under) == {event: 1}
        assert db.row(owner, capped) == (source, capped_version)


def test_the_count_columns_refuse_direct_edits(dbs: Callable[[str], Scratch]) -> None:
    db = dbs("capped_task")
    m = db.machine
    (event, _cap), = m.cap_limits.items()  # fmt: skip
    (source, target), = ((s, t) for s, e, t in m.edges if e == event)  # fmt: skip
    c = count_column(event)
    # A move along an edge of another event, into the capped event's target (expire:
    # acquired -> new) and out of its source (give_up: failed -> dead).
    into = next((s, e) for s, e, t in m.edges if t == target and e != event)
    out_of = next((e, t) for s, e, t in m.edges if s == source and e != event)
    with db.connect() as app:
        row_id, version = row_in(db, app, source)
        version = step(db, app, row_id, event, version)  # count 1
        version = walk(db, app, row_id, version, target, source, avoid=frozenset({event}))
        app.commit()
        other, other_version = row_in(db, app, into[0])
        before = snapshot(db, app)

        update = "UPDATE {table} SET state = %s, state_version = state_version + %s, " + c + " = " + c + " + %s WHERE id = %s"
        for why, params in [
            ("a count change without a move", (source, 0, 1, row_id)),
            ("a count lowered without a move", (source, 0, -1, row_id)),
            ("+2 on the event's own edge", (target, 1, 2, row_id)),
            ("-1 on the event's own edge", (target, 1, -1, row_id)),
            ("a bump on another event's edge out of its source", (out_of[1], 1, 1, row_id)),
            ("a bump on another event's edge into its target", (target, 1, 1, other)),
        ]:
            error = refused(app, db.q(update), params)
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, (why, error)
        # A count at birth: the application has no grant on it; the guard refuses it
        # for anyone else (the owner, here) but the writer.
        error = refused(app, db.q("INSERT INTO {table} (id, " + c + ") VALUES ('born-counted', 1)"))
        assert sqlstate_of(error) == "42501", error
        with db.owner() as owner:
            error = refused(owner, db.q("INSERT INTO {table} (id, " + c + ") VALUES ('born-counted', 1)"))
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error

        # The move logged with the capped event, the count not bumped: caught at COMMIT.
        error = refused_at_commit(
            app,
            (db.q(update), (target, 1, 0, row_id)),
            (db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                  " VALUES (%s, %s, %s, %s, %s, 'hand')"), (row_id, version + 1, source, event, target)),
        )  # fmt: skip
        assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE, error
        assert snapshot(db, app) == before


def test_the_count_columns_refuse_direct_edits_on_a_capped_self_loop(dbs: Callable[[str], Scratch]) -> None:
    db = dbs("subscription")
    (event, _cap), = db.machine.cap_limits.items()  # fmt: skip
    (state, target), = ((s, t) for s, e, t in db.machine.edges if e == event)  # fmt: skip
    assert state == target  # extend_trial: trialing -> trialing
    c = count_column(event)
    log = db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
               " VALUES (%s, %s, %s, %s, %s, 'hand')")  # fmt: skip
    with db.connect() as app:
        row_id, version = row_in(db, app, state)
        before = snapshot(db, app)
        error = refused(app, db.q("UPDATE {table} SET " + c + " = 1 WHERE id = %s"), (row_id,))
        assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error
        error = refused_at_commit(
            app, (db.q("UPDATE {table} SET state_version = state_version + 1 WHERE id = %s"), (row_id,)),
            (log, (row_id, version + 1, state, event, state)))  # fmt: skip
        assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE, error
        assert snapshot(db, app) == before
        # Bumped with its move and logged: a legal manual move.
        app.execute(db.q("UPDATE {table} SET state_version = state_version + 1, " + c + " = 1 WHERE id = %s"),
                    (row_id,))  # fmt: skip
        app.execute(log, (row_id, version + 1, state, event, state))
        app.commit()
        assert counts(db, app, row_id) == {event: 1}


def test_the_count_check_holds_with_the_triggers_off(dbs: Callable[[str], Scratch]) -> None:
    db = dbs("capped_task")
    (event, cap), = db.machine.cap_limits.items()  # fmt: skip
    c = count_column(event)
    with db.connect() as app:
        row_id, _version = row_in(db, app, str(db.machine.initial))
    set_count = db.q("UPDATE {table} SET " + c + " = %s WHERE id = %s")
    with db.superuser(autocommit=True) as su:
        su.execute("SET session_replication_role = replica")  # no trigger fires
        for value in (cap + 1, -1):
            error = refused(su, set_count, (value, row_id))
            assert sqlstate_of(error) == "23514", error
            assert error.diag.constraint_name == f"{db.machine.postgres.table}_{c}_check"
        with su.transaction(force_rollback=True):  # in range: the CHECK alone lets it in
            assert su.execute(set_count, (cap, row_id)).rowcount == 1
    with db.owner() as owner:
        owner.execute(db.q("ALTER TABLE {table} DISABLE TRIGGER USER"))
        error = refused(owner, set_count, (cap + 1, row_id))  # rolls the ALTER back too
        assert sqlstate_of(error) == "23514", error
        disabled = owner.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgenabled = 'D'",
                                 (db.machine.postgres.table,)).fetchone()  # fmt: skip
        assert disabled == (0,)
    with db.connect() as app:
        assert counts(db, app, row_id) == {event: 0}


# --- the log ---------------------------------------------------------------------


@pytest.mark.parametrize("name", MACHINES)
def test_random_traffic_leaves_a_log_that_replays_to_every_rows_state_and_counts(
    dbs: Callable[[str], Scratch], name: str
) -> None:
    db = dbs(name)
    m = db.machine
    rng = random.Random(f"fsmc {name}")
    cap_sources = {s for s, e, _t in m.edges if e in m.cap_limits}
    with db.connect() as app:
        rows = {db.new_row(app): (str(m.initial), 0, Counter[str]()) for _ in range(4)}
        app.commit()
        refusals = 0
        for step in range(240):
            row_id = rng.choice(sorted(rows, key=str))
            state, version, fired = rows[row_id]
            moves = [(e, t) for s, e, t in m.edges if s == state]
            if not moves:
                continue
            # Capped events first, then moves toward them, terminals last: the caps are reached.
            capped = [(e, t) for e, t in moves if e in m.cap_limits]
            toward = [(e, t) for e, t in moves if t in cap_sources]
            onward = [(e, t) for e, t in moves if t not in m.terminal_names]
            if capped and rng.random() < 0.7:
                moves = capped
            elif toward and rng.random() < 0.6:
                moves = toward
            elif onward and rng.random() < 0.9:
                moves = onward
            event, target = rng.choice(moves)
            if fired[event] >= m.cap_limits.get(event, 1 << 30):
                app.commit()
                error = refused(app, db.q(APPLY), (row_id, event, version, target))
                assert sqlstate_of(error) == sqlstate.CAP_REACHED, error
                refusals += 1
                continue
            single = (state, event) in m.single and rng.random() < 0.5
            assert apply(db, app, row_id, event, version, None if single else target) == version + 1
            fired[event] += 1
            rows[row_id] = (target, version + 1, fired)
            if step % 7 == 0:
                app.commit()
        app.commit()
        assert refusals > 0 or not m.cap_limits  # the caps were reached

        for row_id, (state, version, fired) in rows.items():
            current, at, replayed = str(m.initial), 0, Counter[str]()
            for v, frm, event, to, _actor in db.events_of(app, row_id):
                assert (v, frm) == (at + 1, current) and to in m.targets[(frm, event)], (row_id, v)
                current, at = to, v
                replayed[event] += 1
            assert db.row(app, row_id) == (current, at) == (state, version)
            assert counts(db, app, row_id) == {e: replayed[e] for e in m.cap_limits} == {
                e: fired[e] for e in m.cap_limits}  # fmt: skip
            assert all(replayed[e] <= cap for e, cap in m.cap_limits.items())
