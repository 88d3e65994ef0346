"""The PostgreSQL target against a real server (contract 4.2, issue 3), for every spec.

Each sentence of 4.2 is its own test, run for job (uuid ids, lease), runner (bigint
ids, no lease) and task (text ids, lease), each test in its own schema owned by its
own non-superuser role (tests/pg_scratch.py). Needs FSMC_PG_DSN; without it these
skip, and fail when FSMC_REQUIRE_PG is set (.ci/run).
"""

from __future__ import annotations

import concurrent.futures
import random
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.conninfo import make_conninfo

from fsmc.digest import canonical, machine_digest
from fsmc.escape import sql_ident, sql_name
from fsmc.facts import logged_moves
from fsmc.targets import sqlstate
from fsmc.targets.postgres.build import build, emit
from tests.conftest import SPECS
from tests.harness import explained, refused, refused_at_commit, snapshot, sqlstate_of
from tests.pg_scratch import (
    LEASE_SPEC_NAMES,
    SPEC_NAMES,
    Scratch,
    count_column,
    installs,
    lease_states,
    machine_from_text,
    machine_of,
    module_of,
    states_reachable,
    walk_of_length,
)

RACERS = 8
RACE_ROWS = 50


# Each spec with its writer role, and without one (issue 23, item 10: every write checked).
@pytest.fixture(params=installs(SPEC_NAMES))
def db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    name, writer_role = request.param
    scratch = Scratch.create(pg_dsn, machine_of(name), writer_role=writer_role)
    yield scratch
    scratch.drop()


@pytest.fixture(params=installs(LEASE_SPEC_NAMES))
def lease_db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    name, writer_role = request.param
    scratch = Scratch.create(pg_dsn, machine_of(name), writer_role=writer_role)
    yield scratch
    scratch.drop()


# --- applying the file ------------------------------------------------------------


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
@pytest.mark.parametrize("name", SPEC_NAMES)
def test_the_file_applies_with_psql_on_error_stop_as_a_non_superuser(pg_dsn: str, name: str,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    # Scratch.create loads the file through psycopg; this is the contract's own command.
    machine = machine_of(name)
    scratch = Scratch.create(pg_dsn, machine, sql_text="SELECT 1;")  # role and schema only
    try:
        path = tmp_path / f"{name}.sql"
        path.write_text(emit(build(machine)), encoding="utf-8")
        conninfo = make_conninfo(pg_dsn, user=scratch.role, options=f"-c search_path={scratch.schema}")
        done = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-1", "-f", str(path), conninfo],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "ERROR" not in done.stderr and "WARNING" not in done.stderr, done.stderr
        with scratch.owner() as conn:
            owner = conn.execute(scratch.q(
                "SELECT pg_get_userbyid(relowner), rolsuper FROM pg_class"
                " JOIN pg_roles ON pg_roles.oid = relowner WHERE pg_class.oid = '{table}'::regclass"
            )).fetchone()  # fmt: skip
            assert owner == (scratch.role, False)
            assert scratch.apply(conn, scratch.row_at(conn, str(machine.initial))[0],
                                 machine.edges[0][1], 0) == 1  # fmt: skip
    finally:
        scratch.drop()


def test_no_enum_type_states_are_text_with_a_check(db: Scratch) -> None:
    with db.connect() as conn:
        enums = conn.execute("SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid ="
                             " t.typnamespace WHERE n.nspname = %s AND t.typtype = 'e'",
                             (db.schema,)).fetchone()  # fmt: skip
        assert enums == (0,)
        kind = conn.execute(db.q(
            "SELECT format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
            " WHERE attrelid = '{table}'::regclass AND attname = 'state'")).fetchone()  # fmt: skip
        assert kind == ("text", True)


def test_every_event_column_is_not_null_but_payload(db: Scratch) -> None:
    with db.connect() as conn:
        cols = dict(conn.execute(db.q(
            "SELECT attname, attnotnull FROM pg_attribute WHERE attrelid = '{events}'::regclass"
            " AND attnum > 0 AND NOT attisdropped")).fetchall())  # fmt: skip
    id_col = f"{db.machine.name}_id"
    assert set(cols) == {id_col, "from_state", "event", "to_state", "actor", "at", "payload", "version"}
    assert {c for c, not_null in cols.items() if not not_null} == {"payload"}


# --- born in the initial state ------------------------------------------------------


def test_a_row_is_born_in_the_initial_state_at_version_0(db: Scratch) -> None:
    with db.connect() as conn:
        row_id = db.new_row(conn)
        assert db.row(conn, row_id) == (str(db.machine.initial), 0)
        if db.machine.lease:
            held = conn.execute(db.q("SELECT claimed_by, claimed_at, heartbeat_at FROM {table}"
                                     " WHERE id = %s"), (row_id,)).fetchone()  # fmt: skip
            assert held == (None, None, None)
        conn.commit()
        if db.machine.postgres.id_type != "text":
            # `INSERT INTO T DEFAULT VALUES`, literally: uuid and bigint ids have defaults.
            got = conn.execute(db.q("INSERT INTO {table} DEFAULT VALUES RETURNING state, state_version"))
            assert got.fetchone() == (str(db.machine.initial), 0)
            conn.commit()


def test_a_row_cannot_be_born_in_any_other_state_or_version(db: Scratch) -> None:
    m = db.machine
    text_id = m.postgres.id_type == "text"

    def insert(conn: psycopg.Connection[Any], state: str, version: int | None) -> Exception:
        columns = ["id"] * text_id + ["state"] + ["state_version"] * (version is not None)
        params: list[Any] = ["born-" + state] * text_id + [state] + [version] * (version is not None)
        marks = ", ".join(["%s"] * len(params))
        return refused(conn, db.q(f"INSERT INTO {{table}} ({', '.join(columns)}) VALUES ({marks})"), params)

    with db.connect() as conn:
        before = snapshot(db, conn)
        for state in (s for s in m.state_names if s not in m.initial_names):
            error = insert(conn, state, None)
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error
            assert f'"{state}"' in str(error)
        # The version is the database's: the application has no grant on it at all.
        assert sqlstate_of(insert(conn, str(m.initial), 1)) == "42501"
        assert snapshot(db, conn) == before
    with db.owner() as owner:  # the guard refuses it whoever writes, but the writer
        error = insert(owner, str(m.initial), 1)
        assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error


# --- _apply -------------------------------------------------------------------------


def test_apply_moves_along_every_transition_and_appends_its_event(db: Scratch) -> None:
    with db.connect() as conn:
        for source_state, event, target in db.machine.edges:
            row_id, version = db.row_at(conn, source_state)
            started = db.clock(conn)
            got = db.apply(conn, row_id, event, version, actor="alice", payload='{"k": [1, "two"]}',
                           to_state=db.to_state(source_state, event, target))  # fmt: skip
            ended = db.clock(conn)
            assert got == version + 1
            assert db.row(conn, row_id) == (target, version + 1)
            last = conn.execute(db.q(
                "SELECT e.version, e.from_state, e.event, e.to_state, e.actor, e.payload, e.at, t.entered_at"
                " FROM {events} AS e JOIN {table} AS t ON t.id = e.{id_col}"
                " WHERE e.{id_col} = %s ORDER BY e.version DESC LIMIT 1"),
                (row_id,)).fetchone()  # fmt: skip
            assert last is not None
            assert last[:6] == (version + 1, source_state, event, target, "alice", {"k": [1, "two"]})
            # The move's moment, not its transaction's start: the row and its log agree.
            assert started <= last[6] == last[7] <= ended
            conn.commit()
        assert db.replay_problems(conn) == []


def test_apply_refuses_every_illegal_pair_naming_state_and_event(db: Scratch) -> None:
    m = db.machine
    with db.connect() as conn:
        for state in states_reachable(m):
            row_id, version = db.row_at(conn, state)
            before = snapshot(db, conn)
            for event in m.event_names:
                if (state, event) in m.targets:
                    continue
                with pytest.raises(psycopg.IntegrityError) as raised:
                    db.apply(conn, row_id, event, version)
                conn.rollback()
                error = raised.value
                assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION
                assert f'state "{state}"' in str(error) and f'event "{event}"' in str(error)
                assert error.diag.message_detail == f"state={state} event={event}"
                assert ("terminal" in str(error)) == (state in m.terminal_names)
            assert snapshot(db, conn) == before


def test_apply_raises_on_an_unknown_event_and_an_unknown_id(db: Scratch) -> None:
    with db.connect() as conn:
        row_id, version = db.row_at(conn, str(db.machine.initial))
        before = snapshot(db, conn)
        with pytest.raises(psycopg.IntegrityError) as raised:
            db.apply(conn, row_id, "no_such_event", version)
        conn.rollback()
        assert sqlstate_of(raised.value) == sqlstate.UNKNOWN_EVENT
        assert 'event "no_such_event"' in str(raised.value)

        other_id: Any = {"uuid": "00000000-0000-0000-0000-0000000000ff", "bigint": 10**12,
                         "text": "nobody"}[db.machine.postgres.id_type]  # fmt: skip
        for event in (db.machine.edges[0][1], "no_such_event"):
            with pytest.raises(psycopg.IntegrityError) as raised:
                db.apply(conn, other_id, event, 0)
            conn.rollback()
            assert sqlstate_of(raised.value) == sqlstate.UNKNOWN_ID
            assert str(other_id) in str(raised.value)
        assert snapshot(db, conn) == before


def test_apply_checks_the_version_before_the_event(db: Scratch) -> None:
    m = db.machine
    with db.connect() as conn:
        row_id, version = db.row_at(conn, str(m.initial))
        legal = next(e for (s, e) in m.targets if s == m.initial)
        illegal = next(e for e in m.event_names if (str(m.initial), e) not in m.targets)
        before = snapshot(db, conn)
        for stale in (version + 1, version - 1, 99):
            for event in (legal, illegal, "no_such_event"):
                assert db.apply(conn, row_id, event, stale) is None, (stale, event)
        conn.commit()
        assert snapshot(db, conn) == before


def test_apply_refuses_null_arguments(db: Scratch) -> None:
    with db.connect() as conn:
        row_id, version = db.row_at(conn, str(db.machine.initial))
        event = db.machine.edges[0][1]
        for args in ((None, event, version, "a"), (row_id, None, version, "a"),
                     (row_id, event, None, "a"), (row_id, event, version, None)):  # fmt: skip
            error = refused(conn, db.q("SELECT {apply}(%s, %s, %s, %s)"), args)
            assert sqlstate_of(error) == "22004", args
        assert db.row(conn, row_id) == (str(db.machine.initial), version)


def test_apply_finds_its_tables_whatever_the_callers_search_path(db: Scratch) -> None:
    with db.connect() as conn:
        row_id, version = db.row_at(conn, str(db.machine.initial))
        conn.execute("SET search_path TO public")
        event = db.machine.edges[0][1]
        got = conn.execute(f"SELECT {sql_ident(db.schema)}.{db.names.apply}(%s, %s, %s, %s)".encode(),
                           (row_id, event, version, "a")).fetchone()  # fmt: skip
        conn.commit()  # the deferred checks run at COMMIT, still with search_path = public
        assert got == (version + 1,)


# --- bypass writes --------------------------------------------------------------------


def some_edge_and_non_edge(db: Scratch) -> Iterator[tuple[str, str, bool]]:
    """(from, to, is_edge) pairs: every state pair that is, and every one that is not,
    an edge of the spec (from non-terminal, reachable states; a spent budget's
    otherwise is an edge too)."""
    m = db.machine
    pairs = {(s, t) for s, _e, t in logged_moves(m)}
    for state in states_reachable(m):
        if state in m.terminal_names:
            continue
        for target in m.state_names:
            yield state, target, (state, target) in pairs


def test_a_direct_update_to_an_undeclared_state_fails_the_check(db: Scratch) -> None:
    with db.connect() as conn:
        row_id, version = db.row_at(conn, str(db.machine.initial))
        for bump in (0, 1):
            error = refused(conn, db.q("UPDATE {table} SET state = 'nonsense', state_version ="
                                       " state_version + %s WHERE id = %s"), (bump, row_id))  # fmt: skip
            assert sqlstate_of(error) == "23514", error
            assert isinstance(error, errors.CheckViolation)
        assert db.row(conn, row_id) == (str(db.machine.initial), version)


def test_a_direct_update_along_an_edge_the_spec_lacks_fails(db: Scratch) -> None:
    checked = 0
    with db.connect() as conn:
        for state, target, is_edge in some_edge_and_non_edge(db):
            if is_edge:
                continue
            row_id, version = db.row_at(conn, state)
            error = refused(conn, db.q("UPDATE {table} SET state = %s, state_version = state_version + 1"
                                       " WHERE id = %s"), (target, row_id))  # fmt: skip
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, (state, target, error)
            assert f'"{state}"' in str(error) and f'"{target}"' in str(error)
            assert db.row(conn, row_id) == (state, version)
            checked += 1
    assert checked > 0


def test_a_direct_update_along_an_edge_the_spec_lacks_fails_with_constraints_immediate(db: Scratch) -> None:
    # SET CONSTRAINTS ALL IMMEDIATE (any role may) runs the commit-time check at the
    # end of the statement too, beside the guard, in the order of their names: the
    # check's trigger is named to come after the guard's, so a move along no edge is
    # still the guard's 23F04, not the missing event row's 23F05.
    checked = 0
    with db.connect() as conn:
        for state, target, is_edge in some_edge_and_non_edge(db):
            if is_edge:
                continue
            row_id, version = db.row_at(conn, state)
            conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
            error = refused(conn, db.q("UPDATE {table} SET state = %s, state_version = state_version + 1"
                                       " WHERE id = %s"), (target, row_id))  # fmt: skip
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, (state, target, error)
            assert db.row(conn, row_id) == (state, version)
            checked += 1
    assert checked > 0


def test_a_direct_update_out_of_a_terminal_state_fails(db: Scratch) -> None:
    m = db.machine
    with db.connect() as conn:
        for terminal in sorted(m.terminal_names):
            row_id, version = db.row_at(conn, terminal)
            for target in m.state_names:
                for bump in (1, 0):
                    if target == terminal and bump == 0:
                        continue  # that write changes nothing: not a move
                    error = refused(conn, db.q("UPDATE {table} SET state = %s, state_version ="
                                               " state_version + %s WHERE id = %s"),
                                    (target, bump, row_id))  # fmt: skip
                    assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, (terminal, target, error)
                    assert "terminal" in str(error)
            assert db.row(conn, row_id) == (terminal, version)


def test_a_state_change_must_bump_state_version_by_exactly_one(db: Scratch) -> None:
    with db.connect() as conn:
        source_state, _event, target = db.machine.edges[0]
        row_id, version = db.row_at(conn, source_state)
        for new_version in (version, version + 2, version - 1, version + 100):
            error = refused(conn, db.q("UPDATE {table} SET state = %s, state_version = %s WHERE id = %s"),
                            (target, new_version, row_id))  # fmt: skip
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, (new_version, error)
            assert f"must set state_version to {version + 1}" in str(error)
        # The version alone may not move either, unless the spec has a self-loop here.
        if (source_state, source_state) not in {(s, t) for s, _e, t in logged_moves(db.machine)}:
            error = refused(conn, db.q("UPDATE {table} SET state_version = state_version + 1"
                                       " WHERE id = %s"), (row_id,))  # fmt: skip
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE
        assert db.row(conn, row_id) == (source_state, version)


def test_a_state_change_without_its_event_row_fails_at_commit(db: Scratch) -> None:
    source_state, event, target = db.machine.edges[0]
    with db.connect() as conn:
        row_id, version = db.row_at(conn, source_state)
        move = db.q("UPDATE {table} SET state = %s, state_version = state_version + 1 WHERE id = %s")
        error = refused_at_commit(conn, (move, (target, row_id)))
        assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE, error
        assert f'"{source_state}"' in str(error) and f'"{target}"' in str(error)
        assert db.row(conn, row_id) == (source_state, version)

        # A wrong event row does not count: another version, or another edge's triple.
        wrong = db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                     " VALUES (%s, %s, %s, %s, %s, 'dba')")  # fmt: skip
        error = refused_at_commit(conn, (move, (target, row_id)),
                                  (wrong, (row_id, version + 2, source_state, event, target)))
        assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE

        # With its event row, in either order, the same manual move commits.
        log = (wrong, (row_id, version + 1, source_state, event, target))
        conn.execute(*log)
        conn.execute(move, (target, row_id))
        conn.commit()
        assert db.row(conn, row_id) == (target, version + 1)
        other_id, other_version = db.row_at(conn, source_state)
        conn.execute(move, (target, other_id))
        conn.execute(wrong, (other_id, other_version + 1, source_state, event, target))
        conn.commit()
        assert db.row(conn, other_id) == (target, other_version + 1)
        assert db.replay_problems(conn) == []


def test_an_event_row_without_its_state_change_fails_at_commit(db: Scratch) -> None:
    source_state, event, target = db.machine.edges[0]
    with db.connect() as conn:
        row_id, version = db.row_at(conn, source_state)
        insert = db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                      " VALUES (%s, %s, %s, %s, %s, 'dba')")  # fmt: skip
        error = refused_at_commit(conn, (insert, (row_id, version + 1, source_state, event, target)))
        assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE, error
        assert len(db.events_of(conn, row_id)) == version
        assert db.row(conn, row_id) == (source_state, version)
        # Nor one at a version no move can reach, below the row's (which its first move
        # would have), however the row has moved since.
        moved_id, moved = db.row_at(conn, target)
        for bogus in (0, -1):
            error = refused_at_commit(conn, (insert, (moved_id, bogus, source_state, event, target)))
            assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE, (bogus, error)
        assert len(db.events_of(conn, moved_id)) == moved


def test_the_event_log_admits_only_the_specs_triples(db: Scratch) -> None:
    m = db.machine
    source_state, event, target = m.edges[0]
    wrong_target = next(s for s in m.state_names if (source_state, event, s) not in set(logged_moves(m)))
    with db.connect() as conn:
        row_id, version = db.row_at(conn, source_state)
        for triple in ((source_state, event, wrong_target), (source_state, "no_such_event", target),
                       ("nonsense", event, target)):  # fmt: skip
            error = refused(conn, db.q(
                "INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                " VALUES (%s, %s, %s, %s, %s, 'dba')"), (row_id, version + 1, *triple))  # fmt: skip
            assert sqlstate_of(error) == "23514", (triple, error)
    # Every column but the payload is NOT NULL, whoever writes (`at` as the owner: the
    # application has no grant on it, its time being the transaction's).
    with db.connect() as conn, db.owner() as owner:
        for who, column in [(conn, c) for c in ("from_state", "event", "to_state", "actor", "version")] + [(owner, "at")]:
            values = {"from_state": source_state, "event": event, "to_state": target,
                      "actor": "dba", "version": version + 1, "at": None}  # fmt: skip
            values[column] = None
            listed = ["version", "from_state", "event", "to_state", "actor"] + ["at"] * (column == "at")
            error = refused(who, db.q(
                f"INSERT INTO {{events}} ({{id_col}}, {', '.join(listed)})"
                f" VALUES (%s{', %s' * len(listed)})"),
                (row_id, *(values[c] for c in listed)))  # fmt: skip
            assert sqlstate_of(error) == "23502", (column, error)


def test_a_write_to_the_table_is_not_preceded_by_a_row_lock_but_with_caps(db: Scratch) -> None:
    # A BEFORE UPDATE row trigger, whatever its columns and WHEN clause, makes
    # PostgreSQL lock each row an UPDATE writes before writing it: a WAL record more
    # for every move and every heartbeat. The guard runs AFTER, except on a machine
    # with caps, where it must refuse a move past a cap before the count's CHECK does.
    with db.connect() as app:
        row_id = db.new_row(app)
        app.commit()
    plans = []
    with db.owner() as owner:
        # The fewest of three tries: now and then a statement also writes a record that
        # is not its own doing (the first xid of a new commit-log page zeroes the page,
        # a prune of the page's dead tuples); only what every try writes is the UPDATE's.
        for _ in range(3):
            plan = owner.execute(db.q("EXPLAIN (ANALYZE, WAL, FORMAT JSON)"
                                      " UPDATE {table} SET created_at = created_at WHERE id = %s"),
                                 (row_id,)).fetchone()  # fmt: skip
            owner.rollback()
            assert plan is not None
            plans.append(plan[0][0]["Plan"]["WAL Records"])
    assert min(plans) == (2 if db.machine.cap_limits else 1), plans


def test_the_application_cannot_use_the_domains_the_checks_cast_to(db: Scratch) -> None:
    # A table or view of its own using one would keep `fsmc migrate` from dropping it.
    with db.connect() as conn:
        for domain in build(db.machine).schema.domains:
            for statement in (f"CREATE TEMP TABLE pin (v {domain.name})",
                              f"CREATE TEMP VIEW pin AS SELECT NULL::{domain.name} AS v"):  # fmt: skip
                error = refused(conn, statement.encode())
                assert sqlstate_of(error) == "42501", (statement, error)  # insufficient_privilege
        row_id, version = db.row_at(conn, db.machine.edges[0][0])  # the CHECKs still work for it
        assert db.apply(conn, row_id, db.machine.edges[0][1], version, to_state=db.machine.edges[0][2]) == version + 1


def test_the_event_log_is_unique_per_row_and_version(db: Scratch) -> None:
    source_state, event, target = db.machine.edges[0]
    with db.connect() as conn:
        row_id, version = db.row_at(conn, source_state)
        assert db.apply(conn, row_id, event, version) == version + 1
        error = refused(conn, db.q(
            "INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
            " VALUES (%s, %s, %s, %s, %s, 'dba')"), (row_id, version + 1, source_state, event, target))  # fmt: skip
        assert sqlstate_of(error) == "23505"


def test_the_event_log_refuses_update_delete_and_truncate(db: Scratch) -> None:
    # The owner holds every privilege on the log, so only the triggers stop it; the
    # application role has no UPDATE, DELETE or TRUNCATE privilege at all.
    queries = ("UPDATE {events} SET actor = 'rewritten'", "UPDATE {events} SET payload = '{{}}'",
               "DELETE FROM {events}", "DELETE FROM {events} WHERE version = 1",
               "TRUNCATE {events}", "TRUNCATE {table} CASCADE")  # fmt: skip
    with db.owner() as conn, db.connect() as app:
        # A row with history: in a state that only a move reaches (not where rows are born).
        moved_to = next(t for _, _, t in db.machine.edges if t not in db.machine.initial_names)
        row_id, _version = db.row_at(conn, moved_to)
        before = snapshot(db, conn)
        for query in queries:
            error = refused(conn, db.q(query))
            assert sqlstate_of(error) == sqlstate.APPEND_ONLY, (query, error)
            assert "append-only" in str(error)
            assert sqlstate_of(refused(app, db.q(query))) == "42501", query  # insufficient_privilege
        assert snapshot(db, conn) == before
        assert db.events_of(conn, row_id)


def test_writes_that_leave_the_state_alone_pass_untouched(db: Scratch) -> None:
    m = db.machine
    with db.connect() as conn:
        state = next(iter(lease_states(m))) if m.lease else str(m.initial)
        row_id, version = db.row_at(conn, state)
        events_before = db.events_of(conn, row_id)
        # An ORM saving the whole row sets every column to what it was: the triggers
        # named on state, state_version and the counts fire and let it through.
        counts = "".join(f", {count_column(cap.event)} = {count_column(cap.event)}"
                         for cap in m.caps)  # fmt: skip
        writes = ["UPDATE {table} SET state = state WHERE id = %s",
                  "UPDATE {table} SET state = state, state_version = state_version WHERE id = %s",
                  "UPDATE {table} SET state_version = state_version" + counts + " WHERE id = %s"]  # fmt: skip
        for write in writes:
            conn.execute(db.q(write), (row_id,))
            conn.commit()  # no event row needed, no trigger refuses
        if m.lease:  # the claim columns are the database's: as the owner
            db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 minute' WHERE id = %s", (row_id,))
            db.as_owner("UPDATE {table} SET claimed_by = 'operator' WHERE id = %s", (row_id,))
        assert db.row(conn, row_id) == (state, version)
        assert db.events_of(conn, row_id) == events_before


# --- concurrency ------------------------------------------------------------------------


def test_eight_connections_racing_on_fifty_rows_give_exactly_one_winner_each(db: Scratch) -> None:
    m = db.machine
    source_state, event, target = next(e for e in m.edges if e[0] == m.initial)
    with db.connect() as conn:
        ids = [db.new_row(conn) for _ in range(RACE_ROWS)]
        conn.commit()
    barrier = threading.Barrier(RACERS)

    def race(racer: int) -> list[tuple[Any, int | None]]:
        order = ids[:]
        random.Random(racer).shuffle(order)  # so racers meet on different rows at once
        with db.connect(autocommit=True) as c:
            barrier.wait()
            return [(row_id, db.apply(c, row_id, event, 0, actor=f"racer-{racer}")) for row_id in order]

    with concurrent.futures.ThreadPoolExecutor(RACERS) as pool:
        results = [r for part in pool.map(race, range(RACERS)) for r in part]
    winners: dict[Any, int] = {}
    for row_id, got in results:
        assert got in (None, 1)
        if got == 1:
            winners[row_id] = winners.get(row_id, 0) + 1
    assert winners == {row_id: 1 for row_id in ids}
    with db.connect() as conn:
        for row_id in ids:
            assert db.row(conn, row_id) == (target, 1)
            (version, frm, ev, to, actor), = db.events_of(conn, row_id)
            assert (version, frm, ev, to) == (1, source_state, event, target)
        assert db.replay_problems(conn) == []


def test_a_blocked_apply_returns_null_once_the_first_commits(db: Scratch) -> None:
    # The same race, deterministically: A holds the row; B waits on it, then loses.
    m = db.machine
    source_state, event, target = next(e for e in m.edges if e[0] == m.initial)
    with db.connect() as a, db.connect() as b:
        row_id, version = db.row_at(a, source_state)
        assert db.apply(a, row_id, event, version, actor="A") == version + 1
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(db.apply, b, row_id, event, version, "B")
            # B's own backend, seen waiting on a lock: no sleep that a loaded machine
            # could outlast before B even starts.
            deadline = time.monotonic() + 60  # a guard against hanging, not a claim
            while not waits_on_a_lock(db, b.info.backend_pid):
                assert not waiting.done(), "B must wait for A's row lock"
                assert time.monotonic() < deadline, "B never reached A's row lock"
                time.sleep(0.02)
            assert not waiting.done(), "B must wait for A's row lock"
            a.commit()
            assert waiting.result(timeout=60) is None
        b.commit()
        assert db.events_of(a, row_id)[-1][-1] == "A"
        assert db.row(a, row_id) == (target, version + 1)


def waits_on_a_lock(db: Scratch, pid: int) -> bool:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                           (pid,)).fetchone()  # fmt: skip
    return row is not None and row[0] == "Lock"


# --- lease ----------------------------------------------------------------------------


def lease_columns(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> tuple[Any, ...]:
    """The claim columns, and when the row entered its state (the time a move stamps)."""
    row = conn.execute(db.q("SELECT claimed_by, claimed_at, heartbeat_at, entered_at FROM {table}"
                            " WHERE id = %s"), (row_id,)).fetchone()  # fmt: skip
    assert row is not None
    return tuple(row)


def test_lease_bookkeeping_on_every_transition(lease_db: Scratch) -> None:
    db, m = lease_db, lease_db.machine
    held = lease_states(m)
    with db.connect() as conn:
        for source_state, event, target in m.edges:
            row_id, version = db.row_at(conn, source_state)
            before = lease_columns(db, conn, row_id)
            conn.commit()
            started = db.clock(conn)
            assert db.apply(conn, row_id, event, version, actor="mover",
                            to_state=db.to_state(source_state, event, target)) == version + 1  # fmt: skip
            by, at, beat, now = lease_columns(db, conn, row_id)
            assert started <= now <= db.clock(conn)
            if target in held and source_state not in held:
                assert (by, at, beat) == ("mover", now, now), (source_state, target)
            elif target in held:
                assert (by, at) == before[:2] and beat == now and before[2] < now, (source_state, target)
            elif source_state in held:
                assert (by, at, beat) == (None, None, None), (source_state, target)
            else:
                assert (by, at, beat) == before[:3], (source_state, target)
            conn.commit()


def test_heartbeat_is_fenced_by_version_and_lease_state(lease_db: Scratch) -> None:
    db, m = lease_db, lease_db.machine
    with db.connect() as conn:
        state = sorted(lease_states(m))[0]
        row_id, version = db.row_at(conn, state)
        conn.commit()
        db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (row_id,))
        stale = lease_columns(db, conn, row_id)[2]
        heartbeat = db.q("SELECT {heartbeat}(%s, %s)")
        for wrong in (version - 1, version + 1):
            assert conn.execute(heartbeat, (row_id, wrong)).fetchone() == (False,)
        assert lease_columns(db, conn, row_id)[2] == stale
        started = db.clock(conn)
        assert conn.execute(heartbeat, (row_id, version)).fetchone() == (True,)
        assert started <= lease_columns(db, conn, row_id)[2] <= db.clock(conn)
        conn.commit()
        # Outside the lease states, even at the right version, nothing is kept alive.
        free_id, free_version = db.row_at(conn, str(m.initial))
        assert conn.execute(heartbeat, (free_id, free_version)).fetchone() == (False,)
        missing: Any = {"uuid": "00000000-0000-0000-0000-0000000000ff", "bigint": 10**12,
                        "text": "nobody"}[m.postgres.id_type]  # fmt: skip
        error = refused(conn, heartbeat, (missing, 0))
        assert sqlstate_of(error) == sqlstate.UNKNOWN_ID


def make_stale(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> None:
    conn.commit()
    db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (row_id,))


def reclaim(db: Scratch, conn: psycopg.Connection[Any], actor: str = "supervisor") -> set[Any]:
    return {r[0] for r in conn.execute(db.q("SELECT {reclaim}('5 minutes', %s)"), (actor,)).fetchall()}


def test_reclaim_moves_every_stale_lease_row_and_nothing_else(lease_db: Scratch) -> None:
    db, m = lease_db, lease_db.machine
    assert m.lease is not None
    reclaim_event = str(m.lease.reclaim)
    with db.connect() as conn:
        # Rows other checks left in a lease state (the migrate tests share one
        # database) get a fresh heartbeat, so that only this test's rows are stale.
        db.as_owner("UPDATE {table} SET heartbeat_at = now() WHERE state = ANY(%s)", (sorted(lease_states(m)),))
        stale, fresh, free = {}, {}, {}
        for state in sorted(lease_states(m)):
            for _ in range(3):
                row_id, version = db.row_at(conn, state)
                make_stale(db, conn, row_id)
                stale[row_id] = (state, version)
            row_id, version = db.row_at(conn, state)
            fresh[row_id] = (state, version)
        for state in m.state_names:
            if state not in lease_states(m) and state in set(states_reachable(m)):
                row_id, version = db.row_at(conn, state)
                free[row_id] = (state, version)
        got = reclaim(db, conn)
        conn.commit()
        assert got == set(stale)
        for row_id, (state, version) in stale.items():
            target = m.single[state, reclaim_event]
            assert db.row(conn, row_id) == (target, version + 1)
            assert db.events_of(conn, row_id)[-1] == (version + 1, state, reclaim_event, target, "supervisor")
        for row_id, before in {**fresh, **free}.items():
            assert db.row(conn, row_id) == before
        assert reclaim(db, conn) == set()  # nothing stale is left
        assert db.replay_problems(conn) == []


def test_a_lease_row_without_any_heartbeat_is_stale(lease_db: Scratch) -> None:
    # A row moved into a lease state by hand (or born in one) has no heartbeat; were
    # NULL "not stale", nothing could ever reclaim it.
    db = lease_db
    with db.connect() as conn:
        held = sorted(lease_states(db.machine))[0]
        row_id, _ = db.row_at(conn, held)
        conn.commit()
        db.as_owner("UPDATE {table} SET heartbeat_at = NULL WHERE id = %s", (row_id,))
        assert reclaim(db, conn) == {row_id}
        conn.commit()
        assert db.replay_problems(conn) == []


def test_the_seeds_stale_worker_is_fenced_out(lease_db: Scratch) -> None:
    """Seed 000: the worker reads version 7, hangs; the supervisor reclaims (version
    8); the worker's late finish returns NULL and changes nothing."""
    db, m = lease_db, lease_db.machine
    assert m.lease is not None
    held = lease_states(m)
    walk = walk_of_length(m, 7, {s for s in held if any(
        src == s and e != m.lease.reclaim for (src, e) in m.targets)})  # fmt: skip
    with db.connect() as worker, db.connect() as supervisor:
        row_id = db.new_row(worker)
        version = 0
        for event in walk:
            version = db.apply(worker, row_id, event, version, actor="worker") or -1
        worker.commit()
        state, read_version = db.row(worker, row_id)  # the worker reads version 7
        assert read_version == 7 and state in held
        worker.commit()
        make_stale(db, supervisor, row_id)
        assert reclaim(db, supervisor) == {row_id}
        supervisor.commit()
        after_reclaim = snapshot(db, supervisor)
        assert db.row(supervisor, row_id)[1] == 8
        late = next(e for (src, e) in m.targets if src == state and e != m.lease.reclaim)
        assert db.apply(worker, row_id, late, read_version, actor="worker") is None
        assert worker.execute(db.q("SELECT {heartbeat}(%s, %s)"), (row_id, read_version)).fetchone() == (False,)
        worker.commit()
        assert snapshot(db, supervisor) == after_reclaim


def stale_lease_rows(db: Scratch, count: int) -> set[Any]:
    held = sorted(lease_states(db.machine))
    with db.connect() as conn:
        ids = {db.row_at(conn, held[i % len(held)])[0] for i in range(count)}
        conn.commit()
        db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 hour' WHERE id = ANY(%s)", (list(ids),))
    return ids


def test_two_supervisors_reclaiming_at_once_reclaim_each_row_once(lease_db: Scratch) -> None:
    db = lease_db
    # Deterministically overlapping: A has reclaimed, uncommitted, when B runs.
    ids = stale_lease_rows(db, 30)
    with db.connect() as a, db.connect() as b:
        got_a = reclaim(db, a, "supervisor-a")
        got_b = reclaim(db, b, "supervisor-b")
        a.commit()
        b.commit()
        assert (got_a, got_b) == (ids, set())
        assert reclaim(db, b, "supervisor-b") == set()  # and after A's commit: nothing stale
        b.commit()
    # Racing freely, released together, several rounds.
    for _round in range(3):
        ids = stale_lease_rows(db, 30)
        barrier = threading.Barrier(2)

        def supervise(name: str, barrier: threading.Barrier = barrier) -> set[Any]:
            with db.connect(autocommit=True) as c:
                barrier.wait()
                return reclaim(db, c, name)

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first, second = pool.map(supervise, ("supervisor-a", "supervisor-b"))
        assert not first & second and first | second == ids
    with db.connect() as conn:
        reclaims = conn.execute(db.q("SELECT {id_col}, count(*) FROM {events} WHERE event = %s"
                                     " GROUP BY 1"), (str(db.machine.lease.reclaim),)).fetchall()  # type: ignore[union-attr]  # fmt: skip
        assert {count for _id, count in reclaims} == {1}
        assert db.replay_problems(conn) == []


def test_a_refreshed_heartbeat_saves_its_row_from_a_concurrent_reclaim(lease_db: Scratch) -> None:
    db, m = lease_db, lease_db.machine
    state = sorted(lease_states(m))[0]
    with db.connect() as worker, db.connect() as supervisor:
        # The heartbeat is in flight (its row locked, not yet committed) when the
        # supervisor's reclaim runs: the row is not reclaimed, and reclaim does not wait
        # (were it to wait for the worker, which commits only after it, the session's
        # lock_timeout would end it in an error).
        row_id, version = db.row_at(worker, state)
        make_stale(db, worker, row_id)
        assert worker.execute(db.q("SELECT {heartbeat}(%s, %s)"), (row_id, version)).fetchone() == (True,)
        assert reclaim(db, supervisor) == set()
        supervisor.commit()
        worker.commit()
        assert db.row(worker, row_id) == (state, version)
        # The heartbeat committed first: the supervisor sees it fresh.
        make_stale(db, worker, row_id)
        assert worker.execute(db.q("SELECT {heartbeat}(%s, %s)"), (row_id, version)).fetchone() == (True,)
        worker.commit()
        assert reclaim(db, supervisor) == set()
        supervisor.commit()
        assert db.row(worker, row_id) == (state, version)
        # The control: without the refresh the same row is reclaimed.
        make_stale(db, worker, row_id)
        assert reclaim(db, supervisor) == {row_id}
        supervisor.commit()
        # ... and the worker's heartbeat, one version late, no longer keeps it.
        assert worker.execute(db.q("SELECT {heartbeat}(%s, %s)"), (row_id, version)).fetchone() == (False,)


def test_reclaim_scans_the_partial_index_over_100k_mostly_terminal_rows(lease_db: Scratch) -> None:
    db, m = lease_db, lease_db.machine
    terminal = sorted(m.terminal_names)[0]
    held = sorted(lease_states(m))[0]
    guard = sql_ident(sql_name(str(m.name), "guard_insert"))
    id_expr = {"uuid": "gen_random_uuid()", "bigint": "g", "text": "'bulk-' || g"}[m.postgres.id_type]
    with db.owner() as conn:  # bulk rows bypass the guard: only the owner may
        # One INSERT of 100k rows, 1% stale in a lease state, the rest terminal. The
        # insert guard would refuse rows born terminal, so it is off for this load: the
        # planner's choice is under test here, not the guard.
        conn.execute(db.q(f"ALTER TABLE {{table}} DISABLE TRIGGER {guard}"))
        conn.execute(db.q(
            f"INSERT INTO {{table}} (id, state, state_version, claimed_by, claimed_at, heartbeat_at)"
            f" SELECT {id_expr}, CASE WHEN g %% 100 = 0 THEN %s ELSE %s END, 3,"
            " CASE WHEN g %% 100 = 0 THEN 'w' END, CASE WHEN g %% 100 = 0 THEN now() END,"
            " CASE WHEN g %% 100 = 0 THEN now() - interval '1 hour' END"
            " FROM generate_series(1, 100000) AS g"), (held, terminal))  # fmt: skip
        conn.execute(db.q(f"ALTER TABLE {{table}} ENABLE TRIGGER {guard}"))
        conn.commit()
        conn.autocommit = True
        conn.execute(db.q("ANALYZE {table}"))
    # auto_explain shows the plan of the statement inside the function, as it ran.
    rows, notices = explained(db, db.q("SELECT count(*) FROM {reclaim}('5 minutes', 'supervisor')"))
    got = tuple(rows[0])
    assert got == (1000,)
    plans = [p for p in notices if "SKIP LOCKED" in p]
    assert len(plans) == 1, notices
    plan = plans[0]
    assert re.search(rf"(Index|Bitmap Index) Scan (using|on) {re.escape(db.names.lease_index)}\b", plan), plan
    assert not re.search(rf"Seq Scan on {re.escape(db.names.table)}\b", plan), plan


def test_the_reclaim_index_is_partial_over_the_lease_states_and_does_not_cover_heartbeat(
    lease_db: Scratch,
) -> None:
    db = lease_db
    with db.connect() as conn:
        rows = conn.execute(db.q(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid), pg_get_expr(i.indpred, i.indrelid)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = '{table}'::regclass")).fetchall()  # fmt: skip
    assert all("heartbeat_at" not in definition for _name, definition, _pred in rows), rows
    (definition, predicate), = [(d, p) for name, d, p in rows if name == db.names.lease_index]
    assert predicate is not None
    for state in db.machine.state_names:
        assert (f"'{state}'::text" in predicate) == (state in lease_states(db.machine)), predicate


def hot_updates(db: Scratch, table_conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = table_conn.execute(db.q("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                                  " WHERE relid = '{table}'::regclass")).fetchone()  # fmt: skip
    assert row is not None
    return int(row[0]), int(row[1])


def count_heartbeat_updates(db: Scratch, beats: int) -> tuple[int, int]:
    """(updates, HOT updates) that `beats` heartbeats add to pg_stat_user_tables."""
    held = sorted(lease_states(db.machine))
    with db.connect(autocommit=True) as conn:
        rows = [db.row_at(conn, held[i % len(held)]) for i in range(5)]
        # A backend sends its counts when it goes idle after this, before it answers:
        # the updates that made the rows are counted before `before` is read.
        conn.execute("SELECT pg_stat_force_next_flush()")
    with db.connect(autocommit=True) as worker, db.superuser(autocommit=True) as stats:
        stats.execute("SET stats_fetch_consistency = none")
        before, again = None, hot_updates(db, stats)
        while again != before:  # an earlier test's session may still be sending its
            time.sleep(0.1)  # counts as it exits: read until they hold still
            before, again = again, hot_updates(db, stats)
        for i in range(beats):
            row_id, version = rows[i % len(rows)]
            assert worker.execute(db.q("SELECT {heartbeat}(%s, %s)"), (row_id, version)).fetchone() == (True,)
        worker.execute("SELECT pg_stat_force_next_flush()")
        deadline = time.monotonic() + 60  # statistics arrive soon; this only bounds a hang
        while True:
            after = hot_updates(db, stats)
            if after[0] - before[0] >= beats or time.monotonic() > deadline:
                return after[0] - before[0], after[1] - before[1]
            time.sleep(0.1)


def test_heartbeats_are_hot_updates(lease_db: Scratch) -> None:
    updates, hot = count_heartbeat_updates(lease_db, 50)
    assert (updates, hot) == (50, 50)


def test_heartbeats_would_not_be_hot_with_the_seeds_heartbeat_index(pg_dsn: str) -> None:
    # The control: the seed's index on heartbeat_at makes the same test fail.
    machine = machine_of("job")
    scratch = Scratch.create(pg_dsn, machine)
    try:
        with scratch.owner() as conn:
            conn.execute(scratch.q("CREATE INDEX seed_live_heartbeat ON {table} (heartbeat_at)"
                                   " WHERE state IN ('claimed', 'running')"))  # fmt: skip
            conn.commit()
        updates, hot = count_heartbeat_updates(scratch, 50)
        assert updates == 50 and hot == 0
    finally:
        scratch.drop()


# --- the log replays ----------------------------------------------------------------


def test_random_traffic_leaves_a_log_that_replays_to_every_row(db: Scratch) -> None:
    m = db.machine
    rng = random.Random(20240601)
    with db.connect(autocommit=True) as conn:
        rows = {db.new_row(conn): (str(m.initial), 0) for _ in range(30)}
        for _ in range(400):
            row_id = rng.choice(list(rows))
            state, version = rows[row_id]
            event = rng.choice(m.event_names)
            expected = version if rng.random() < 0.9 else version - 1
            try:
                got = db.apply(conn, row_id, event, expected)
            except psycopg.IntegrityError as error:
                assert expected == version and (state, event) not in m.single, error
                continue
            if expected != version:
                assert got is None
            else:
                assert got == version + 1
                rows[row_id] = (m.single[state, event], got)
        if m.lease:
            conn.commit()
            db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 hour' WHERE heartbeat_at IS NOT NULL")
            for row_id in reclaim(db, conn):
                state, version = rows[row_id]
                rows[row_id] = (m.single[state, str(m.lease.reclaim)], version + 1)
        assert {r: db.row(conn, r) for r in rows} == rows
        assert db.replay_problems(conn) == []
    # The replay can fail: a row moved behind the log's back (triggers off, as its owner
    # could) is caught.
    with db.owner() as conn:  # only the owner can switch triggers off
        victim = next(iter(rows))
        conn.execute(db.q("ALTER TABLE {table} DISABLE TRIGGER USER"))
        conn.execute(db.q("UPDATE {table} SET state_version = state_version + 1 WHERE id = %s"), (victim,))
        conn.execute(db.q("ALTER TABLE {table} ENABLE TRIGGER USER"))
        assert db.replay_problems(conn)
        conn.rollback()


# --- transition() in the generated module -----------------------------------------


def test_the_modules_transition_calls_apply_and_maps_its_answers(db: Scratch, tmp_path: Path) -> None:
    module = module_of(db.machine, tmp_path)
    m = db.machine
    source_state, event, target = next(e for e in m.edges if e[0] == m.initial)
    illegal = next(e for e in m.event_names if (source_state, e) not in m.targets)
    with db.connect() as conn:
        row_id, version = db.row_at(conn, source_state)
        assert module.transition(conn, row_id, module.Event(event), expected_version=version,
                                 actor="py", payload={"why": "test"}, schema=db.schema) == version + 1  # fmt: skip
        conn.rollback()  # it never commits: rolling back undoes it
        assert db.row(conn, row_id) == (source_state, version)
        assert module.transition(conn, row_id, event, expected_version=version + 5, actor="py", schema=db.schema) is None
        with pytest.raises(module.IllegalTransition) as raised:
            module.transition(conn, row_id, illegal, expected_version=version, actor="py", schema=db.schema)
        conn.rollback()
        assert raised.value.state is module.State(source_state)
        assert raised.value.event is module.Event(illegal)
        assert isinstance(raised.value.__cause__, psycopg.IntegrityError)
        with pytest.raises(ValueError, match="no_such_event"):
            module.transition(conn, row_id, "no_such_event", expected_version=version, actor="py", schema=db.schema)
        assert module.transition(conn, row_id, event, expected_version=version, actor="py", schema=db.schema) == version + 1
        conn.commit()
        assert db.events_of(conn, row_id)[-1] == (version + 1, source_state, event, target, "py")


# --- names and the digest -----------------------------------------------------------

KEYWORD_SPEC = """\
fsmc: 1
machine: select
initial: open
states: [open, closed]
terminals: [closed]
events: [close]
transitions:
  - {from: open, event: close, to: closed}
postgres: {table: TABLE, events_table: EVENTS, id_type: bigint}
"""


@pytest.mark.parametrize("table, events", [("user", "order"), ("t" * 63, "e" * 63),
                                           ("x" * 60, "x" * 60 + "_ev")])  # fmt: skip
def test_keyword_and_63_byte_table_names_work(pg_dsn: str, table: str, events: str) -> None:
    machine = machine_from_text(KEYWORD_SPEC.replace("TABLE", table).replace("EVENTS", events))
    scratch = Scratch.create(pg_dsn, machine)
    try:
        with scratch.connect() as conn:
            row_id, version = scratch.row_at(conn, "open")
            assert scratch.apply(conn, row_id, "close", version) == version + 1
            conn.commit()
            error = refused(conn, scratch.q("UPDATE {table} SET state = 'open',"
                                            " state_version = state_version + 1"))  # fmt: skip
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE
            names = conn.execute("SELECT conname FROM pg_constraint c JOIN pg_namespace n"
                                 " ON n.oid = c.connamespace WHERE n.nspname = %s",
                                 (scratch.schema,)).fetchall()  # fmt: skip
            assert len(names) == len(set(names))
            assert all(len(n.encode()) <= 63 for (n,) in names)
    finally:
        scratch.drop()


def test_sql_name_stays_within_63_bytes_and_distinct() -> None:
    long_a, long_b = "a" * 60 + "_one", "a" * 60 + "_two"
    assert sql_name("jobs", "pkey") == "jobs_pkey"
    for name in (sql_name(long_a, "pkey"), sql_name(long_b, "pkey")):
        assert len(name.encode()) <= 63
    assert sql_name(long_a, "pkey") != sql_name(long_b, "pkey")
    assert sql_name(long_a, "pkey") == sql_name(long_a, "pkey")
    assert sql_ident("user") == '"user"' and sql_ident("order") == '"order"'
    assert sql_ident("jobs") == "jobs" and sql_ident("Odd\"name") == '"Odd""name"'


def test_the_schema_records_the_machine_digest(db: Scratch) -> None:
    with db.connect() as conn:
        got = conn.execute(db.q("SELECT {digest}()")).fetchone()
    assert got == (machine_digest(db.machine),)
    assert re.fullmatch(r"[0-9a-f]{64}", got[0])


JOB = machine_of("job")


def job_spec_text() -> str:
    return (SPECS / "job.yaml").read_text(encoding="utf-8")


def test_the_digest_ignores_formatting_and_sees_every_fact() -> None:
    text = job_spec_text()
    base = machine_digest(machine_from_text(text))
    # The digest the checked-in job.sql records (a golden file, made by an earlier run
    # of fsmc): a change to what the digest covers must come with rebuilt files.
    recorded = re.search(r"job_fsmc_digest\(\) RETURNS text\n.*\nRETURN '([0-9a-f]{64})';",
                         (SPECS.parent / "generated" / "job" / "job.sql").read_text(encoding="utf-8"))
    assert recorded is not None and base == recorded.group(1)
    same = [
        text.replace("description: Lifecycle of a background job in relayd.", "description: other"),
        text.replace("  queued: accepted, waiting for a worker", "  queued:"),
        "# a comment\n" + text.replace("  table: jobs\n", "  table: 'jobs'\n"),
        # a from-list written out as two transitions, and transitions reordered
        text.replace("  - {from: [claimed, running], event: reclaim, to: queued, description: the worker died}\n",
                     "  - {from: running, event: reclaim, to: queued}\n"
                     "  - {from: claimed, event: reclaim, to: queued}\n"),
        text.replace("terminals: [completed, abandoned]", "terminals: [abandoned, completed]"),
    ]  # fmt: skip
    for variant in same:
        assert variant != text
        assert machine_digest(machine_from_text(variant)) == base, variant
    different = [
        text.replace("  - {from: failed, event: retry, to: queued}\n", ""),
        text.replace("{from: failed, event: retry, to: queued}", "{from: failed, event: retry, to: paused}"),
        text.replace("  table: jobs\n", "  table: jobs2\n"),
        text.replace("  id_type: uuid\n", "  id_type: text\n"),
        text.replace("  states: [claimed, running]\n", "  states: [claimed, running, paused]\n")
            .replace("{from: paused, event: resume, to: running}",
                     "{from: paused, event: resume, to: running}\n"
                     "  - {from: paused, event: reclaim, to: queued}"),
        text.replace("abandon: stop trying; the job can be cleaned up", "abandon:\n  spare:"),
    ]  # fmt: skip
    digests = {machine_digest(machine_from_text(v)) for v in different}
    assert base not in digests and len(digests) == len(different)
    assert '"initial":"queued"' in canonical(JOB)
