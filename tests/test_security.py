"""The database against its application role (contract 4.2's first bullet, issue 8).

Every test plays an attacker with a psql prompt, connected as the application role
with exactly the grants docs/postgres.md lists (tests/pg_scratch.py: APP_GRANTS) and
PostgreSQL's defaults (TEMPORARY on the database, EXECUTE on functions), for every
example spec, and proves the attack fails or changes nothing:

- A: a temporary table named like the event log, holding a matching row, does not
  let a direct UPDATE pass the commit-time check;
- B: the same temporary table does not take `_apply`'s event rows;
- C: a temporary table named like the machine's table, holding a fake row, does
  not let `_apply` forge history (and `_apply` and `_reclaim` keep working);
- a pooled server session (PgBouncer's transaction mode) where one client left such
  a table behind changes nothing for the next client's `transition()` calls;
- operators in a schema the attacker controls, put before pg_catalog on the
  caller's search_path, do not switch the guards off;
- with the schema installed into `public` under the default search_path, and the
  pre-15 `CREATE ON SCHEMA public` grant, an exact-type overload of `format` is
  never called, by any caller, superuser included;
- every function and trigger function the `.sql` or a migrate script creates is
  pinned to `pg_catalog, <its schema>, pg_temp` (pg_temp last).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from fsmc.digest import machine_digest
from fsmc.migrate import migrate
from fsmc.model import Machine
from fsmc.targets import sqlstate
from fsmc.targets.postgres.build import build, emit
from fsmc.targets.postgres.names import Names, wake_channel
from tests import migrating as tm
from tests.harness import refused, snapshot, sqlstate_of
from tests.pg_scratch import (
    LEASE_SPEC_NAMES,
    SPEC_NAMES,
    TIMEOUTS,
    Scratch,
    count_column,
    drop_writer,
    installs,
    machine_of,
    module_of,
    path_to,
    without_writer_role,
    writer_of,
)


@pytest.fixture(params=installs(SPEC_NAMES))
def db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    name, writer_role = request.param
    scratch = Scratch.create(pg_dsn, machine_of(name), writer_role=writer_role)
    yield scratch
    scratch.drop()


def real(db: Scratch, name: str) -> str:
    """A table of the scratch schema, named so that no temporary table can stand in."""
    return f"{sql.Identifier(db.schema).as_string()}.{name}"


def real_events(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(
        f"SELECT version, from_state, event, to_state, actor FROM {real(db, db.names.events_table)}"
        f" WHERE {db.names.id_column} = %s ORDER BY version", (row_id,)).fetchall()]  # fmt: skip


def real_row(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> tuple[str, int]:
    got = conn.execute(f"SELECT state, state_version FROM {real(db, db.names.table)} WHERE id = %s",
                       (row_id,)).fetchone()  # fmt: skip
    assert got is not None
    return str(got[0]), int(got[1])


def forgeable(machine: Machine) -> tuple[str, str]:
    """A state other than the initial one, and an event legal there but not initially."""
    for (state, event), _target in machine.targets.items():
        if state != machine.initial and (str(machine.initial), event) not in machine.targets:
            return state, event
    raise AssertionError("every event is legal in the initial state")


def test_the_application_role_has_exactly_the_readme_grants(db: Scratch) -> None:
    with db.connect() as app:
        got = app.execute(
            "SELECT c.relname, p.privilege_type FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace,"
            " LATERAL aclexplode(c.relacl) AS p"
            " WHERE n.nspname = %s AND p.grantee = %s::regrole ORDER BY 1, 2",
            (db.schema, db.app_role)).fetchall()  # fmt: skip
        names = db.names
        table, events = names.table.strip('"'), names.events_table.strip('"')
        assert got == sorted([(table, "SELECT"), (events, "SELECT"), (names.intervals.strip('"'), "SELECT")])
        # Writes column by column: a new row's id and state, a move by hand (state,
        # version, a capped event's count), an event row but its time. Every other
        # column (created_at, entered_at, the claim columns, the log's `at`) is the
        # database's.
        columns = app.execute(
            "SELECT c.relname, a.attname, p.privilege_type FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " JOIN pg_attribute AS a ON a.attrelid = c.oid,"
            " LATERAL aclexplode(a.attacl) AS p"
            " WHERE n.nspname = %s AND p.grantee = %s::regrole ORDER BY 1, 2, 3",
            (db.schema, db.app_role)).fetchall()  # fmt: skip
        counts = [f"{cap.event}_count" for cap in db.machine.caps]
        logged = [f"{db.machine.name}_id", "version", "from_state", "event", "to_state", "actor", "payload"]
        assert columns == sorted([(table, "id", "INSERT"), (table, "state", "INSERT")]
                                 + [(table, c, "UPDATE") for c in ["state", "state_version", *counts]]
                                 + [(events, c, "INSERT") for c in logged])  # fmt: skip
        flags = app.execute("SELECT rolsuper, rolcreaterole, rolbypassrls FROM pg_roles"
                            " WHERE rolname = current_user").fetchone()  # fmt: skip
        assert flags == (False, False, False)
        # ... and that is enough to run the machine: create a row, move it, read its log.
        row_id, version = db.row_at(app, str(db.machine.initial))
        source, event, _target = db.machine.edges[0]
        row_id, version = db.row_at(app, source)
        assert db.apply(app, row_id, event, version) == version + 1
        app.commit()


# --- temporary tables named like ours ---------------------------------------------------


def test_a_temp_event_log_does_not_hide_a_direct_write_attack_a(db: Scratch) -> None:
    n, (source, event, target) = db.names, db.machine.edges[0]
    with db.connect() as app:
        row_id, version = db.row_at(app, source)
        app.execute(f"CREATE TEMP TABLE {n.events_table} (LIKE {real(db, n.events_table)}"
                    " INCLUDING DEFAULTS)")  # fmt: skip
        app.execute(f"INSERT INTO {n.events_table} ({n.id_column}, version, from_state, event,"
                    " to_state, actor) VALUES (%s, %s, %s, %s, %s, 'attacker')",
                    (row_id, version + 1, source, event, target))  # fmt: skip
        app.execute(f"UPDATE {n.table} SET state = %s, state_version = state_version + 1"
                    " WHERE id = %s", (target, row_id))  # fmt: skip
        with pytest.raises(psycopg.Error) as raised:
            app.commit()
        assert sqlstate_of(raised.value) == sqlstate.UNLOGGED_CHANGE
        assert real_row(db, app, row_id) == (source, version)
        assert [e[2] for e in real_events(db, app, row_id)] == path_to(db.machine, source)


def test_a_temp_event_log_does_not_take_applys_event_rows_attack_b(db: Scratch) -> None:
    n, m = db.names, db.machine
    with db.connect() as app:
        row_id = db.new_row(app)
        app.execute(f"CREATE TEMP TABLE {n.events_table} (LIKE {real(db, n.events_table)})")
        app.commit()
        walk = path_to(m, next(t for s, _e, t in m.edges if s != m.initial))
        for version, event in enumerate(walk):
            assert db.apply(app, row_id, event, version, actor="worker") == version + 1
        app.commit()
        assert [e[2] for e in real_events(db, app, row_id)] == walk
        assert app.execute(f"SELECT count(*) FROM pg_temp.{n.events_table}").fetchone() == (0,)


def test_a_temp_table_like_the_machines_does_not_forge_history_attack_c(db: Scratch) -> None:
    n, m = db.names, db.machine
    fake_state, event = forgeable(m)
    with db.connect() as app:
        row_id = db.new_row(app)
        if m.lease is not None:
            held_id, held_version = db.row_at(app, str(m.lease.states[0]))
        app.commit()
        # From here on, the attacker's unqualified name for the table is the fake one.
        app.execute(f"CREATE TEMP TABLE {n.table} (LIKE {real(db, n.table)} INCLUDING DEFAULTS)")
        app.execute(f"INSERT INTO {n.table} (id, state, state_version) VALUES (%s, %s, 0)",
                    (row_id, fake_state))  # fmt: skip
        app.commit()
        error = refused(app, db.q("SELECT {apply}(%s, %s, 0, 'attacker')"), (row_id,  event))
        assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION, error
        assert f'state "{m.initial}"' in str(error)  # the real row's state, not the fake one
        assert real_events(db, app, row_id) == []
        # The row still moves, and its log still grows, next to the fake table.
        first = next(e for s, e, _t in m.edges if s == m.initial)
        assert db.apply(app, row_id, first, 0) == 1
        app.commit()
        assert [e[2] for e in real_events(db, app, row_id)] == [first]
        if m.lease is not None:
            # A stale fake row in a lease state does not stop reclaim for the real rows.
            app.execute(f"UPDATE {n.table} SET state = %s, state_version = 7", (str(m.lease.states[0]),))
            app.commit()
            reclaimed = app.execute(db.q("SELECT {reclaim}('1 microsecond', 'supervisor')")).fetchall()
            app.commit()
            assert (held_id,) in reclaimed
            assert real_row(db, app, held_id)[1] == held_version + 1
            assert real_events(db, app, held_id)[-1][2] == str(m.lease.reclaim)


def test_a_pooled_session_with_a_leftover_temp_table_changes_nothing(db: Scratch, tmp_path: Path) -> None:
    # PgBouncer in transaction mode hands one server session to client after client:
    # one connection, two clients taking turns, the first leaving temp tables behind.
    module = module_of(db.machine, tmp_path)
    n, m = db.names, db.machine
    with db.connect() as pooled:
        pooled.execute(f"CREATE TEMP TABLE {n.events_table} (LIKE {real(db, n.events_table)})")
        pooled.execute(f"CREATE TEMP TABLE {n.table} (LIKE {real(db, n.table)} INCLUDING DEFAULTS)")
        pooled.commit()  # the first client is done; its session lives on in the pool
        target = next(t for s, _e, t in m.edges if s != m.initial)
        row_id = pooled.execute(
            f"INSERT INTO {real(db, n.table)} (id) VALUES (%s) RETURNING id"
            if m.postgres.id_type == "text" else
            f"INSERT INTO {real(db, n.table)} DEFAULT VALUES RETURNING id",
            (f"id-{uuid.uuid4().hex}",) if m.postgres.id_type == "text" else ()).fetchone()[0]  # type: ignore[index]  # fmt: skip
        pooled.commit()
        walk = path_to(m, target)
        for version, event in enumerate(walk):
            got = module.transition(pooled, row_id, event, expected_version=version, actor="client2", schema=db.schema)
            assert got == version + 1
            pooled.commit()
        assert [e[2] for e in real_events(db, pooled, row_id)] == walk
        assert real_row(db, pooled, row_id) == (target, len(walk))
        assert pooled.execute(f"SELECT count(*) FROM pg_temp.{n.events_table}").fetchone() == (0,)


# --- objects in schemas on the caller's search_path ----------------------------------------


@pytest.fixture
def evil_schema(db: Scratch) -> Iterator[str]:
    """A schema the application role controls (as the pre-15 public schema was)."""
    name = f"evil_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
            sql.Identifier(name), sql.Identifier(db.app_role)))  # fmt: skip
    yield name
    with psycopg.connect(db.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def test_operators_before_pg_catalog_do_not_switch_the_guards_off(db: Scratch, evil_schema: str) -> None:
    m, evil = db.machine, evil_schema
    terminal = next(s for s in m.state_names if s in m.terminal_names)
    with db.connect() as app:
        done_id, done_version = db.row_at(app, terminal)
        source, _event, target = m.edges[0]
        row_id, version = db.row_at(app, source)
        for kind in ("text", "bigint", "integer"):
            app.execute(f"CREATE FUNCTION {evil}.always_{kind}({kind}, {kind}) RETURNS boolean"
                        " LANGUAGE sql IMMUTABLE AS 'SELECT true'")  # fmt: skip
            for op in ("=", "<>"):
                app.execute(f"CREATE OPERATOR {evil}.{op} (LEFTARG = {kind}, RIGHTARG = {kind},"
                            f" FUNCTION = {evil}.always_{kind})")  # fmt: skip
        app.execute(f"SET search_path = {evil}, pg_catalog, {db.schema}")
        app.commit()
        assert app.execute("SELECT 'a'::text = 'b'::text").fetchone() == (True,)  # the trap works
        back = "UPDATE {table} SET state = %s, state_version = state_version + 1 WHERE id = %s"
        error = refused(app, db.q(back), (str(m.initial), done_id))
        assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error
        jump = "UPDATE {table} SET state = %s, state_version = state_version + 100 WHERE id = %s"
        error = refused(app, db.q(jump), (target, row_id))
        assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error
        illegal = next(e for e in m.event_names if (terminal, e) not in m.targets)
        error = refused(app, db.q("SELECT {apply}(%s, %s, %s, 'attacker')"),
                        (done_id, illegal, done_version))  # fmt: skip
        assert sqlstate_of(error) == sqlstate.ILLEGAL_TRANSITION, error
        app.execute("RESET search_path")
        assert db.row(app, done_id) == (terminal, done_version)
        assert db.row(app, row_id) == (source, version)


# Every format() call shape the generated functions make, for each id type.
FORMAT_SHAPES = ["{id}", "{id}, text", "{id}, text, text", "{id}, text, text, bigint, bigint",
                 "text", "text, text", "interval"]  # fmt: skip
# Operators an attacker creates in `public` for both operands of one type. Where
# pg_catalog has no operator for exactly those types (`->>` of jsonb and jsonb, `<@`
# of text[] and text[]: the built-ins take text, or anyarray), PostgreSQL takes the
# attacker's for `x OP 'literal'`, since an untyped literal is taken for x's type.
TRAP_OPERATORS = {"=": "boolean", "<>": "boolean", "<": "boolean", ">": "boolean", "<=": "boolean",
                  ">=": "boolean", "?": "boolean", "<@": "boolean", "@>": "boolean", "~~": "boolean",
                  "||": None, "+": None, "-": None, "->": "jsonb", "->>": "text"}  # fmt: skip
TRAP_TYPES = ["text", "jsonb", "bigint", "integer", "uuid", "timestamptz", "interval", "text[]",
              "name", "boolean"]  # fmt: skip


# And where an operand would need a cast to reach the built-in (1.2's due times:
# `integer * interval` has no operator of its own; `float8 * interval` has).
TRAP_MIXED = [("*", "integer", "interval", "interval"), ("*", "integer", "double precision", "double precision"),
              ("*", "bigint", "interval", "interval"), ("+", "timestamptz", "integer", "timestamptz"),
              # the wake-up's channel: TG_TABLE_SCHEMA is a `name`, cast to text before `||`
              ("||", "name", "text", "text")]  # fmt: skip


def plant_trap_operators(evil: psycopg.Connection[Any]) -> None:
    """Every TRAP_OPERATORS name for every TRAP_TYPES pair, and TRAP_MIXED, in public,
    each calling nextval('public.marker') (a call survives the rollback of the statement)."""
    for k, (op, left, right, result) in enumerate(TRAP_MIXED):
        function = f"public.trap_mixed_{k}"
        evil.execute(f"CREATE FUNCTION {function}(a {left}, b {right}) RETURNS {result}"
                     f" LANGUAGE sql AS $$ SELECT NULL::{result} FROM (SELECT nextval('public.marker')) AS s $$".encode())  # fmt: skip
        evil.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right},"
                     f" FUNCTION = {function})".encode())  # fmt: skip
    for i, kind in enumerate(TRAP_TYPES):
        for j, (op, result) in enumerate(TRAP_OPERATORS.items()):
            function = f"public.trap_{i}_{j}"
            evil.execute(f"CREATE FUNCTION {function}(a {kind}, b {kind}) RETURNS {result or kind}"
                         f" LANGUAGE sql AS $$ SELECT NULL::{result or kind}"
                         " FROM (SELECT nextval('public.marker')) AS s $$".encode())  # fmt: skip
            evil.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {kind}, RIGHTARG = {kind},"
                         f" FUNCTION = {function})".encode())  # fmt: skip


@pytest.mark.parametrize("spec", installs((*SPEC_NAMES, "queue")))  # queue: 1.2's budgets, timers and limits
def test_a_format_overload_or_operator_in_public_is_never_called(pg_dsn: str, spec: tuple[str, bool],
                                                                 tmp_path: Path) -> None:  # fmt: skip
    # The schema installed into `public` with the default search_path ("$user", public),
    # in a database that still grants CREATE on public to everyone (PostgreSQL < 15).
    name, writer_role = spec
    machine = machine_of(name) if writer_role else without_writer_role(machine_of(name))
    tag = uuid.uuid4().hex[:12]
    database, owner, attacker = f"fsmc_sec_{tag}", f"fsmc_owner_{tag}", f"fsmc_evil_{tag}"
    id_type = machine.postgres.id_type
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN " + ("CREATEROLE" if writer_role else "NOCREATEROLE"))
                      .format(sql.Identifier(owner)))  # fmt: skip
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(attacker)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
            sql.Identifier(database), sql.Identifier(owner)))  # fmt: skip
    dsn = make_conninfo(pg_dsn, dbname=database)
    writer = None
    try:
        with psycopg.connect(dsn, autocommit=True) as su:
            su.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        with psycopg.connect(dsn, user=attacker, autocommit=True) as evil:
            # A sequence: its nextval survives the rollback of the refused statement.
            evil.execute("CREATE SEQUENCE public.marker")
            evil.execute("GRANT USAGE, SELECT ON SEQUENCE public.marker TO PUBLIC")
        with psycopg.connect(dsn, user=owner) as conn:
            assert conn.execute("SHOW search_path").fetchone() == ('"$user", public',)
            conn.execute(emit(build(machine)).encode())
            conn.commit()
        with psycopg.connect(dsn, autocommit=True) as su:  # before the traps: its query uses LIKE
            writer = writer_of(su, "public", machine)
        with psycopg.connect(dsn, user=attacker, autocommit=True) as evil:
            for args in dict.fromkeys(shape.format(id=id_type) for shape in FORMAT_SHAPES):
                evil.execute(f"CREATE FUNCTION public.format(text, {args}) RETURNS text"
                             " LANGUAGE sql AS $$ SELECT 'PWNED ' || nextval('public.marker') $$")  # fmt: skip
            plant_trap_operators(evil)
        # The wake-ups the moves below send, on the channel the module computes.
        listener = psycopg.connect(dsn, autocommit=True)
        listener.execute(f'LISTEN "{wake_channel(name, "public")}"')
        victims = [psycopg.connect(dsn, user=owner, options=TIMEOUTS), psycopg.connect(dsn, options=TIMEOUTS)]
        fsm = module_of(machine, tmp_path)
        n = Names.of(machine).sql
        nobody: Any = {"uuid": uuid.uuid4(), "bigint": 10**12, "text": "nobody"}[id_type]
        for conn in victims:  # the owner, then a superuser
            with conn:
                error = refused(conn, f"SELECT {n.apply}(%s, %s, 0, 'x')".encode(),
                                (nobody, machine.edges[0][1]))  # fmt: skip
                assert sqlstate_of(error) == sqlstate.UNKNOWN_ID
                insert = (f"INSERT INTO {n.table} (id) VALUES ('r1') RETURNING id" if id_type == "text"
                          else f"INSERT INTO {n.table} DEFAULT VALUES RETURNING id")  # fmt: skip
                row_id = conn.execute(insert.encode()).fetchone()[0]  # type: ignore[index]
                error = refused(conn, f"SELECT {n.apply}(%s, 'no_such_event', 0, 'x')".encode(), (row_id,))
                assert sqlstate_of(error) == sqlstate.UNKNOWN_EVENT
                # A terminal (or, in a machine that never ends, a state no row is born in
                # and the first move cannot reach).
                reached = {t for s, _e, t in machine.edges if s == machine.initial}
                terminal = next((s for s in machine.state_names if s in machine.terminal_names), None) or next(
                    s for s in machine.state_names if s not in machine.initial_names and s not in reached)
                error = refused(conn, f"INSERT INTO {n.table} (id, state) VALUES ('r2', %s)".encode()
                                if id_type == "text" else
                                f"INSERT INTO {n.table} (state) VALUES (%s)".encode(), (terminal,))  # fmt: skip
                assert sqlstate_of(error) == sqlstate.BYPASS_WRITE
                row_id = conn.execute(insert.encode()).fetchone()[0]  # type: ignore[index]
                error = refused(conn, f"UPDATE {n.table} SET state = %s, state_version = 1 WHERE id = %s".encode(),
                                (terminal, row_id))  # fmt: skip
                assert sqlstate_of(error) in (sqlstate.BYPASS_WRITE, sqlstate.UNLOGGED_CHANGE)
                if machine.lease is not None:
                    error = refused(conn, f"SELECT {n.reclaim}('0', 'x')".encode())
                    assert sqlstate_of(error) == "22023"
                # And the calls that succeed: a move, a claim, a heartbeat, a reclaim, a purge.
                source, event, target = next(e for e in machine.edges if e[0] == machine.initial)
                fresh = (f"INSERT INTO {n.table} (id) VALUES (gen_random_uuid()::text) RETURNING id"
                         if id_type == "text" else insert)  # fmt: skip
                row_id = conn.execute(fresh.encode()).fetchone()[0]  # type: ignore[index]
                moved = conn.execute(f"SELECT {n.apply}(%s, %s, 0, 'x', NULL, %s)".encode(),
                                     (row_id, event, target)).fetchone()  # fmt: skip
                assert moved == (1,)
                # (1.2) on into a timed state, whose due time the move computes.
                timed = next(((e, t) for s, e, t in machine.edges if s == target and t in machine.timed_states), None)
                if timed is not None:
                    waiting = conn.execute(fresh.encode()).fetchone()[0]  # type: ignore[index]
                    for version, (step, to) in enumerate([(event, target), timed]):
                        got = conn.execute(f"SELECT {n.apply}(%s, %s, %s, 'x', NULL, %s)".encode(),
                                           (waiting, step, version, to)).fetchone()  # fmt: skip
                        assert got == (version + 1,)
                    due = conn.execute(f"SELECT due_at > now() FROM {n.table} WHERE id = %s".encode(), (waiting,))
                    assert due.fetchone() == (True,)
                other = conn.execute(fresh.encode()).fetchone()[0]  # type: ignore[index]
                claimed = conn.execute(f"SELECT id, state_version FROM {n.claim}(%s, 'x', 1, %s)".encode(), (event, target)).fetchall()
                assert [tuple(r) for r in claimed] == [(other, 1)]
                if machine.lease is not None and target in machine.lease.states:
                    beat = conn.execute(f"SELECT {n.heartbeat}(%s, 1)".encode(), (row_id,)).fetchone()
                    assert beat == (True,)
                if machine.lease is not None:
                    assert conn.execute(f"SELECT * FROM {n.reclaim}('1 hour', 'x')".encode()).fetchall() == []
                assert conn.execute(f"SELECT {n.purge}('1 hour', 10)".encode()).fetchone() == (0,)
                for waited in machine.notified:  # the question a waiter asks (its wake-ups were sent above)
                    conn.execute(f"SELECT {n.claimable_in}(%s)".encode(), (waited,))
                # The module's own statements (issue 24): a batch insert, a move at whatever
                # version the row has, a claim limited to a declared column's value.
                given = {"id": str(uuid.uuid4())} if id_type == "text" else {}
                (made,) = fsm.create_many(conn, [given], schema="public")  # moved on at once: claim takes none
                assert fsm.transition(conn, made.id, event, expected_version=None, actor="x", to=target,
                                      schema="public") == 1  # fmt: skip
                if machine.postgres.claim_by:
                    limited = {str(c): "nobody's" for c in machine.postgres.claim_by}
                    assert fsm.claim(conn, event, actor="x", to=target, schema="public", **limited) == []
                conn.commit()
                assert conn.execute("SELECT is_called FROM public.marker").fetchone() == (False,)
        with listener:
            woken = {note.payload for note in listener.notifies(timeout=0.5)}
        # queue: jobs born available, one moved on into retryable
        assert woken == ({"available", "retryable"} if machine.notified else set()), woken
    finally:
        if writer is None:  # the file may have made it and failed after
            with contextlib.suppress(psycopg.OperationalError), psycopg.connect(dsn, autocommit=True) as su:
                writer = writer_of(su, "public", machine)
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                          (database,))  # fmt: skip
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(database)))
            drop_writer(admin, writer)
            for role in (attacker, owner):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# --- every function pinned ---------------------------------------------------------------


def pins(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[str] | None]:
    """Each function of `schema` -> its settings (proconfig)."""
    return {f"{name}({args})": config for name, args, config in conn.execute(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.proconfig"
        " FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s", (schema,)).fetchall()}  # fmt: skip


def assert_all_pinned(conn: psycopg.Connection[Any], schema: str, machine: Machine) -> None:
    found = pins(conn, schema)
    assert sorted(f.split("(")[0] for f in found) == sorted(build(machine).functions)
    expected = f"search_path=pg_catalog, {schema}, pg_temp"  # scratch names need no quotes
    for function, config in found.items():
        assert config is not None and expected in config, (function, config)


def test_every_function_and_trigger_function_is_pinned_with_pg_temp_last(db: Scratch) -> None:
    with db.connect() as conn:
        assert_all_pinned(conn, db.schema, db.machine)
        triggers = conn.execute(
            "SELECT DISTINCT t.tgfoid::regproc::text FROM pg_trigger AS t"
            " JOIN pg_class AS c ON c.oid = t.tgrelid JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND NOT t.tgisinternal", (db.schema,)).fetchall()  # fmt: skip
        assert triggers and all(f.split(".")[-1] in {k.split("(")[0] for k in pins(conn, db.schema)}
                                for (f,) in triggers)  # fmt: skip


@pytest.mark.parametrize("case", ["lease_added", "renamed_tables", "added_state"])
def test_a_migrate_script_leaves_every_function_pinned(pg_dsn: str, case: str) -> None:
    old, new = tm.spec(case, "old"), tm.spec(case, "new")
    with tm.built(pg_dsn, old) as db:
        tm.migrate_ok(db, migrate(old, new))
        with db.owner() as conn:
            assert_all_pinned(conn, db.schema, new)


# --- _reclaim's interval -----------------------------------------------------------------


@pytest.mark.parametrize("name", LEASE_SPEC_NAMES)
def test_reclaim_refuses_a_zero_or_negative_interval(pg_dsn: str, name: str) -> None:
    db = Scratch.create(pg_dsn, machine_of(name))
    try:
        with db.connect() as app:
            assert db.machine.lease is not None
            row_id, version = db.row_at(app, str(db.machine.lease.states[0]))
            for interval in ("0", "-1 minute", "1 month -31 days"):
                error = refused(app, db.q("SELECT {reclaim}(%s::interval, 'supervisor')"), (interval,))
                assert sqlstate_of(error) == "22023", (interval, error)
                assert "must reach into the past" in str(error)
            assert db.row(app, row_id) == (str(db.machine.lease.states[0]), version)
    finally:
        db.drop()


# --- What the rows say is the database's (issue 19) ---------------------------------------


def test_an_id_cannot_be_rewritten_so_a_finished_row_gets_no_fresh_life(db: Scratch) -> None:
    # T1: renaming a finished row's id away and a fresh row's id to it would make one
    # job finish twice (and, with caps, give a spent budget a fresh count).
    m = db.machine
    terminal = next(s for s in m.state_names if s in m.terminal_names)
    with db.connect() as app:
        done_id, _ = db.row_at(app, terminal)
        fresh = db.new_row(app)
        app.commit()
        before = snapshot(db, app)
        for write, params in (("UPDATE {table} SET id = %s WHERE id = %s", (fresh, done_id)),
                              ("UPDATE {table} SET id = id WHERE id = %s", (fresh,)),
                              ("UPDATE {table} SET created_at = now() - interval '1 day' WHERE id = %s", (fresh,))):  # fmt: skip
            assert sqlstate_of(refused(app, db.q(write), params)) == "42501", write
        assert snapshot(db, app) == before


def test_no_time_is_the_callers_choice(db: Scratch) -> None:
    # entered_at in 1970 would purge a just-finished row at once; an INSERT dated
    # -infinity would jump every queue; an event row dated 2100 would show a stay of a
    # century in the intervals view; heartbeat_at = 'infinity' would hold a dead
    # worker's lease forever, and NULL would let a live one be reclaimed.
    m = db.machine
    terminal = next(s for s in m.state_names if s in m.terminal_names)
    text_id = m.postgres.id_type == "text"
    with db.connect() as app:
        done_id, version = db.row_at(app, terminal)
        before = snapshot(db, app)
        forged = [
            ("UPDATE {table} SET entered_at = '1970-01-01' WHERE id = %s", (done_id,)),
            ("INSERT INTO {table} (id, entered_at) VALUES ('forged', '-infinity')" if text_id
             else "INSERT INTO {table} (entered_at) VALUES ('-infinity')", ()),
            ("INSERT INTO {table} (id, created_at) VALUES ('forged', '-infinity')" if text_id
             else "INSERT INTO {table} (created_at) VALUES ('-infinity')", ()),
            ("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor, at)"
             " SELECT {id_col}, version + 1, to_state, 'x', to_state, 'x', '2100-01-01'"
             " FROM {events} WHERE {id_col} = %s AND version = %s", (done_id, version)),
        ]  # fmt: skip
        if m.lease is not None:
            for value in ("'infinity'", "NULL", "now()"):
                forged.append((f"UPDATE {{table}} SET heartbeat_at = {value} WHERE id = %s", (done_id,)))
            forged.append(("UPDATE {table} SET claimed_at = now(), claimed_by = 'x' WHERE id = %s", (done_id,)))
        for cap in m.caps:  # a count only moves with its event (the guard), never by hand alone
            column = count_column(cap.event)
            forged.append((f"UPDATE {{table}} SET {column} = {column} + 1 WHERE id = %s", (done_id,)))
        for write, params in forged:
            error = refused(app, db.q(write), params)
            assert sqlstate_of(error) in ("42501", sqlstate.BYPASS_WRITE), (write, error)
        assert snapshot(db, app) == before
        assert app.execute(db.q("SELECT {purge}('30 days', 1000)")).fetchone() == (0,)
        app.commit()
        assert db.row(app, done_id)[0] == terminal


def test_a_move_by_hand_is_stamped_with_the_databases_times(db: Scratch) -> None:
    # The guard stamps entered_at (and, into or out of a lease, the claim columns) on a
    # direct move along an edge: the event log and the row agree on when it happened.
    m = db.machine
    held = set(m.lease.states) if m.lease else set()
    for source, event, target in {(s, e, t) for s, e, t in m.edges if s != t}:
        with db.connect() as app:
            row_id, version = db.row_at(app, source)
            if held:  # the worker that held it, a while ago
                db.as_owner("UPDATE {table} SET claimed_by = 'w', claimed_at = now() - interval '1 hour',"
                            " heartbeat_at = now() - interval '1 hour', entered_at = now() - interval '1 hour'"
                            " WHERE id = %s", (row_id,))  # fmt: skip
            app.execute(db.q("UPDATE {table} SET state = %s, state_version = state_version + 1"
                             + "".join(f", {count_column(c.event)} = {count_column(c.event)} + 1"
                                       for c in m.caps if c.event == event) + " WHERE id = %s"),
                        (target, row_id))  # fmt: skip
            app.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                             " VALUES (%s, %s, %s, %s, %s, 'operator')"), (row_id, version + 1, source, event, target))  # fmt: skip
            now = app.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            app.commit()
            got = app.execute(db.q("SELECT entered_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()
            at = app.execute(db.q("SELECT at FROM {events} WHERE {id_col} = %s AND version = %s"),
                             (row_id, version + 1)).fetchone()  # fmt: skip
            assert got == (now,) and at == (now,), (source, event, target)
            if held:
                claim = app.execute(db.q("SELECT claimed_by, claimed_at, heartbeat_at FROM {table} WHERE id = %s"),
                                    (row_id,)).fetchone()  # fmt: skip
                if target in held and source not in held:
                    assert claim == (db.app_role, now, now), (source, target)
                elif target in held:
                    assert claim is not None and claim[0] == "w" and claim[2] == now, (source, target)
                elif source in held:
                    assert claim == (None, None, None), (source, target)
            assert db.replay_problems(app) == []


def test_a_row_born_with_a_misspelled_or_missing_state_gets_the_checks_own_answer(db: Scratch) -> None:
    # NOT NULL and the state CHECK answer first (23502, 23514), as docs/postgres.md orders
    # them, not the guard that refuses a row born outside its initial state (23F04).
    text_id = db.machine.postgres.id_type == "text"
    insert = "INSERT INTO {table} (id, state) VALUES ('born', %s)" if text_id else "INSERT INTO {table} (state) VALUES (%s)"
    with db.connect() as app:
        assert sqlstate_of(refused(app, db.q(insert), (str(db.machine.initial).capitalize(),))) == "23514"
        assert sqlstate_of(refused(app, db.q(insert), (None,))) == "23502"


@pytest.mark.parametrize("name", LEASE_SPEC_NAMES)
def test_an_interval_is_judged_by_the_time_it_reaches_back_to(pg_dsn: str, name: str) -> None:
    # '-1 year +361 days' is "positive" (PostgreSQL's months are 30 days) but reaches 4
    # days ahead: it reclaimed a lease 0.01 s old, and purged a row that finished in
    # the same transaction.
    db = Scratch.create(pg_dsn, machine_of(name))
    try:
        m = db.machine
        assert m.lease is not None
        terminal = next(s for s in m.state_names if s in m.terminal_names)
        with db.connect() as app:
            held_id, held_version = db.row_at(app, str(m.lease.states[0]))
            done_id, _ = db.row_at(app, terminal)
            assert app.execute(db.q("SELECT '-1 year +361 days'::interval > interval '0'")).fetchone() == (True,)
            for call in ("SELECT {reclaim}(%s::interval, 'supervisor')", "SELECT {purge}(%s::interval, 100)"):
                for interval in ("-1 year +361 days", "0", "1 month -31 days"):
                    error = refused(app, db.q(call), (interval,))
                    assert sqlstate_of(error) == "22023", (call, interval, error)
                    assert "must reach into the past" in str(error)
            assert db.row(app, held_id) == (str(m.lease.states[0]), held_version)
            assert db.row(app, done_id)[0] == terminal
    finally:
        db.drop()


def test_the_module_names_its_schema_and_types_so_no_overload_redirects_it(pg_dsn: str, tmp_path: Path) -> None:
    # Another role that may create in a schema on the connection's search_path (here
    # `public`, ahead of the install schema) plants functions named like ours, taking a
    # smallint (what psycopg sends for a small int) or the exact types, and a table
    # named like ours. The module names the install schema and casts every argument:
    # none of it is ever reached.
    machine = machine_of("job")
    db = Scratch.create(pg_dsn, machine)
    evil = f"fsmc_evil_{uuid.uuid4().hex[:12]}"
    module = module_of(machine, tmp_path)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(evil)))
            admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(evil)))
        with psycopg.connect(pg_dsn, user=evil, autocommit=True) as attacker:
            for args in ("uuid, text, smallint, text, jsonb", "uuid, text, bigint, text, jsonb",
                         "uuid, text, bigint, text, jsonb, text"):  # fmt: skip
                attacker.execute(f"CREATE FUNCTION public.job_apply({args}) RETURNS bigint LANGUAGE sql"
                                 " AS 'SELECT 999::bigint'")  # fmt: skip
            for args in ("uuid, smallint", "uuid, bigint"):
                attacker.execute(f"CREATE FUNCTION public.job_heartbeat({args}) RETURNS boolean LANGUAGE sql"
                                 " AS 'SELECT true'")  # fmt: skip
            attacker.execute("CREATE FUNCTION public.job_claim(text, text, integer, text)"
                             " RETURNS TABLE (id uuid, state_version bigint) LANGUAGE sql"
                             " AS 'SELECT gen_random_uuid(), 999::bigint'")  # fmt: skip
            attacker.execute("CREATE TABLE public.jobs (id uuid, state text, state_version bigint)")
            attacker.execute("GRANT SELECT ON public.jobs TO PUBLIC")
        options = f"-c search_path=public,{db.schema} {TIMEOUTS}"
        with psycopg.connect(pg_dsn, user=db.app_role, options=options) as app:
            row_id = app.execute(db.q(f"INSERT INTO {db.schema}.{{table}} DEFAULT VALUES RETURNING id")).fetchone()[0]  # type: ignore[index]
            app.commit()
            with psycopg.connect(pg_dsn, user=evil, autocommit=True) as attacker:  # a completed look-alike
                attacker.execute("INSERT INTO public.jobs VALUES (%s, 'completed', 7)", (row_id,))
            (claimed,) = module.claim(app, "claim", actor="w", schema=db.schema)
            assert claimed == module.Job(row_id, module.State.CLAIMED, 1)
            assert module.transition(app, row_id, "start", expected_version=1, actor="w", schema=db.schema) == 2
            assert module.heartbeat(app, row_id, expected_version=1, schema=db.schema) is False  # stale
            assert module.heartbeat(app, row_id, expected_version=2, schema=db.schema) is True
            assert module.get(app, row_id, schema=db.schema) == module.Job(row_id, module.State.RUNNING, 2)
            app.commit()
            assert real_events(db, app, row_id) == [(1, "queued", "claim", "claimed", "w"),
                                                    (2, "claimed", "start", "running", "w")]  # fmt: skip
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(evil)))
        db.drop()


def test_a_call_that_waited_behind_a_migration_cannot_write_under_the_old_rules(pg_dsn: str) -> None:
    # A reader holds jobs; `fsmc migrate` (adding a retry cap of 2) queues for its lock;
    # a job_apply(.., 'retry', ..) queues behind it, its old body already compiled.
    # When the migration commits, that call runs on: it must refuse (40001), not log a
    # third retry that no trigger checks (it runs as the writer).
    old, new = tm.spec("caps_added"), tm.spec("caps_added", "new")
    db = Scratch.create(pg_dsn, old)
    try:
        with db.connect() as app:
            row_id = db.new_row(app)
            version = 0
            for event in ["claim", "start", "error", "retry"] * 2 + ["claim", "start", "error"]:
                version = db.apply(app, row_id, event, version) or -1
            app.commit()
            assert db.row(app, row_id) == ("failed", 11)
        script = migrate(old, new)
        reader = db.connect()
        reader.execute(db.q("SELECT count(*) FROM {table}"))  # holds ACCESS SHARE until it ends
        caller = db.connect()
        caller_pid = caller.info.backend_pid
        results: dict[str, Any] = {}

        def migration() -> None:
            results["migrate"] = tm.psql(db, script)

        def late_call() -> None:
            try:
                results["apply"] = db.apply(caller, row_id, "retry", 11, actor="late")
                caller.commit()
            except psycopg.Error as error:
                results["apply"] = error
                caller.rollback()

        migrating = threading.Thread(target=migration)
        migrating.start()
        with db.superuser(autocommit=True) as su:
            def waiting(query: str) -> bool:
                return bool(su.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                       " AND query LIKE %s", (query,)).fetchone()[0])  # type: ignore[index]

            for _ in range(300):
                if waiting("%LOCK TABLE%") or waiting("%DO $fsmc$%"):
                    break
                time.sleep(0.02)
            calling = threading.Thread(target=late_call)
            calling.start()
            for _ in range(300):
                row = su.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                 (caller_pid,)).fetchone()  # fmt: skip
                if row is not None and row[0] == "Lock":
                    break
                time.sleep(0.02)
            else:
                raise AssertionError("the late call never queued behind the migration")
        reader.rollback()  # the migration goes through, then the queued call runs on
        migrating.join(60)
        calling.join(60)
        assert results["migrate"].returncode == 0, results["migrate"].stderr
        assert isinstance(results["apply"], psycopg.Error), results["apply"]
        assert sqlstate_of(results["apply"]) == "40001", results["apply"]
        assert "migrated" in str(results["apply"])
        with db.connect() as app:
            assert db.row(app, row_id) == ("failed", 11)
            retries = [e for e in db.events_of(app, row_id) if e[2] == "retry"]
            assert len(retries) == 2
            # Retried, the call runs under the new spec: the cap of 2 is spent.
            error = refused(app, db.q("SELECT {apply}(%s, 'retry', 11, 'late')"), (row_id,))
            assert sqlstate_of(error) == sqlstate.CAP_REACHED, error
        reader.close()
        caller.close()
    finally:
        db.drop()


def test_a_no_transaction_script_run_outside_a_transaction_changes_nothing(pg_dsn: str) -> None:
    # `fsmc migrate --no-transaction` run with plain `psql -f` (autocommit, and no
    # ON_ERROR_STOP: psql goes on past errors): it refuses at its first statement, and
    # every later statement fails too, in a session left read-only.
    old, new = tm.spec("caps_added"), tm.spec("caps_added", "new")
    db = Scratch.create(pg_dsn, old)
    try:
        before = tm.catalog(db).objects
        script = migrate(old, new, transaction=False)
        assert shutil.which("psql") is not None
        conninfo = make_conninfo(db.dsn, user=db.role, options=f"-c search_path={db.schema}")
        ran = subprocess.run(["psql", "-X", "-q", "-f", "-", conninfo], input=script,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        first_error = next(line for line in ran.stderr.splitlines() if "ERROR" in line)
        assert "--no-transaction and runs outside a transaction; nothing was changed" in first_error, ran.stderr
        assert tm.catalog(db).objects == before
        with db.owner() as owner:
            assert owner.execute("SELECT job_fsmc_digest()").fetchone()[0] != ""  # type: ignore[index]
            digest = owner.execute("SELECT job_fsmc_digest()").fetchone()
        assert digest == (machine_digest(old),)
        # Inside a transaction (BEGIN sent first, as drivers do), the same script runs.
        ran = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", "BEGIN", "-f", "-",
                              "-c", "COMMIT", conninfo], input=script, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert ran.returncode == 0 and "ERROR" not in ran.stderr, ran.stderr
        with db.owner() as owner:
            assert owner.execute("SELECT job_fsmc_digest()").fetchone() == (machine_digest(new),)
    finally:
        db.drop()
