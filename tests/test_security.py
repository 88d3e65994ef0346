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

import concurrent.futures
import contextlib
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
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
from fsmc.targets.common import ID_TYPES
from fsmc.targets.postgres.build import build, emit
from fsmc.targets.postgres.install import app_grants
from fsmc.targets.postgres.names import Names, wake_channel
from tests import migrating as tm
from tests.conftest import SPECS as SPECS_DIR
from tests.harness import refused, snapshot, sqlstate_of
from tests.pg_scratch import (
    LEASE_SPEC_NAMES,
    SPEC_NAMES,
    TIMEOUTS,
    Scratch,
    count_column,
    drop_writer,
    installs,
    machine_from_text,
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
        # (A bigint id is the database's sequence's: the application gives none.)
        given = [(table, "id", "INSERT")] if ID_TYPES[db.machine.postgres.id_type].given else []
        assert columns == sorted([*given, (table, "state", "INSERT")]
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
            # N20: an overload of every function the file makes, by name, the attacker's
            # (before the install): naming a function by its name alone would make the
            # install's ALTERs fail ("must be owner") and the grants ambiguous (42725).
            for raw in build(machine).functions:
                evil.execute(f"CREATE FUNCTION public.{raw}(a text) RETURNS text LANGUAGE sql"
                             " AS $$ SELECT 'PWNED ' || nextval('public.marker') $$".encode())  # fmt: skip
        app_role = f"fsmc_app_{tag}"
        with psycopg.connect(dsn, user=owner) as conn:
            assert conn.execute("SHOW search_path").fetchone() == ('"$user", public',)
            conn.execute(emit(build(machine)).encode())
            conn.commit()
        with psycopg.connect(dsn, autocommit=True) as su:
            su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(app_role)))
        with psycopg.connect(dsn, user=owner) as conn:  # the README's grants, as the owner types them
            for grant in app_grants(build(machine).install, "public", app_role):
                conn.execute(grant.encode())
            conn.commit()
        with psycopg.connect(dsn, user=app_role) as app:  # and they run the machine
            (tmp_path / "app").mkdir()
            fsm_app = module_of(machine, tmp_path / "app")
            given = {"id": str(uuid.uuid4())} if id_type == "text" else {}
            (row,) = fsm_app.create_many(app, [given], schema="public")
            source, event, target = next(e for e in machine.edges if e[0] == machine.initial)
            assert fsm_app.transition(app, row.id, event, expected_version=0, actor="app", to=target,
                                      schema="public") == 1  # fmt: skip
            app.commit()
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
                    # Every argument given, each cast (as the module sends it): with fewer, the
                    # attacker's one-argument overload would be as good a match as ours (N21).
                    by = ", NULL::text" * len(machine.postgres.claim_by)
                    conn.execute(f"SELECT {n.claimable_in}(%s::text{by})".encode(), (waited,))
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
            for role in (attacker, owner, f"fsmc_app_{tag}"):
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
    # direct move along an edge: the event log and the row agree on when it happened,
    # which is when it was written (the clock), not when its transaction began.
    m = db.machine
    held = set(m.lease.states) if m.lease else set()
    for source, event, target in {(s, e, t) for s, e, t in m.edges if s != t}:
        with db.connect() as app:
            row_id, version = db.row_at(app, source)
            app.execute("SELECT pg_sleep(0.05)")  # a transaction open a while before its move
            started = db.clock(app)
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
            ended = db.clock(app)
            app.commit()
            got = app.execute(db.q("SELECT entered_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()
            at = app.execute(db.q("SELECT at FROM {events} WHERE {id_col} = %s AND version = %s"),
                             (row_id, version + 1)).fetchone()  # fmt: skip
            assert got is not None and at is not None, (source, event, target)
            now = got[0]
            # The row's move, then its event row: each the moment it was written.
            assert started <= now <= at[0] <= ended, (source, event, target)
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


# --- Issue 35: timers no direct write skips, stamps no transaction backdates ------------

TIMED_SPECS = ("queue", "task")  # 1.2's timers: a time given, a backoff (queue: limits, wake-ups)


@pytest.fixture(params=installs(TIMED_SPECS))
def timed_db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    name, writer_role = request.param
    scratch = Scratch.create(pg_dsn, machine_of(name), writer_role=writer_role)
    yield scratch
    scratch.drop()


@pytest.fixture(params=installs(("queue",)))
def queue_db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    _, writer_role = request.param
    scratch = Scratch.create(pg_dsn, machine_of("queue"), writer_role=writer_role)
    yield scratch
    scratch.drop()


def move_by_hand(db: Scratch, app: psycopg.Connection[Any], row_id: Any, version: int, source: str,
                 event: str, target: str, *, event_first: bool = False) -> None:  # fmt: skip
    """The move an application role may write itself: the row's UPDATE (and the count
    of a capped event) and its event row, in either order; not committed."""
    counts = "".join(f", {count_column(c.event)} = {count_column(c.event)} + 1" for c in db.machine.caps if c.event == event)
    update = (db.q("UPDATE {table} SET state = %s, state_version = %s" + counts + " WHERE id = %s"),
              (target, version + 1, row_id))  # fmt: skip
    insert = (db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                   " VALUES (%s, %s, %s, %s, %s, 'by hand')"), (row_id, version + 1, source, event, target))  # fmt: skip
    for query, params in (insert, update) if event_first else (update, insert):
        app.execute(query, params)


def stamps(db: Scratch, conn: psycopg.Connection[Any], row_id: Any) -> tuple[Any, Any]:
    """When the row entered its state, and the time its last event row was logged."""
    got = conn.execute(db.q("SELECT t.entered_at, e.at FROM {table} AS t JOIN {events} AS e"
                            " ON e.{id_col} = t.id AND e.version = t.state_version WHERE t.id = %s"),
                       (row_id,)).fetchone()  # fmt: skip
    assert got is not None
    return got[0], got[1]


def test_a_timed_event_by_hand_before_its_row_is_due_is_refused_n1(timed_db: Scratch) -> None:
    # N1: `_apply` refused a timed event before due_at (23F08), but a direct UPDATE and
    # its event row committed a day early (a scheduled job), or skipped a backoff.
    db, m = timed_db, timed_db.machine
    for (source, event), _timer in m.timers.items():
        target = m.targets[source, event][0]
        for event_first in (False, True):
            with db.connect() as app:
                row_id, version = db.row_at(app, source)
                db.as_owner("UPDATE {table} SET due_at = now() + interval '1 day' WHERE id = %s", (row_id,))
                before = snapshot(db, app)
                move_by_hand(db, app, row_id, version, source, event, target, event_first=event_first)
                with pytest.raises(psycopg.Error) as raised:
                    app.commit()
                assert sqlstate_of(raised.value) == sqlstate.NOT_DUE, (source, event, raised.value)
                assert "is not due until" in str(raised.value)
                assert snapshot(db, app) == before
                # Once it is due, the same write commits: what was refused was its time.
                db.make_due(row_id)
                move_by_hand(db, app, row_id, version, source, event, target, event_first=event_first)
                app.commit()
                assert db.row(app, row_id) == (target, version + 1)
                assert db.replay_problems(app) == []


def test_a_long_transaction_does_not_backdate_a_retrys_backoff_n2(queue_db: Scratch) -> None:
    # N2: with every stamp its transaction's start, a transaction open 1.2 s before it
    # failed a job made the 1 s backoff due at its COMMIT, and retry took the job at once.
    db = queue_db
    with db.connect() as app:
        row_id = db.new_row(app)
        app.commit()
        app.execute("SELECT pg_sleep(1.2)")
        started = db.clock(app)
        claimed = app.execute(db.q("SELECT id, state_version FROM {claim}('fetch', 'w', 1)")).fetchall()
        assert [tuple(r) for r in claimed] == [(row_id, 1)]
        assert db.apply(app, row_id, "error", 1, actor="w") == 2
        app.commit()
        got = app.execute(db.q("SELECT entered_at, due_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()
        assert got is not None
        entered, due = got
        assert started <= entered and due - entered == timedelta(seconds=1)
        assert stamps(db, app, row_id) == (entered, entered)
        taken = app.execute(db.q("SELECT id FROM {claim}('retry', 'supervisor', 10)")).fetchall()
        early = app.execute("SELECT clock_timestamp() < %s", (due,)).fetchone()
        if early == (True,):  # asked before the due time, the claim found nothing due
            assert taken == []
        app.rollback()


def test_every_stamp_of_a_move_is_its_writes_moment_not_its_transactions_start_n2(db: Scratch) -> None:
    # N2: a job completed in a long transaction was purged by `_purge('5 seconds')`
    # right after its commit; an event's `at`, a claim and a heartbeat likewise. Every
    # stamp a move makes, by `_apply`, a claim or by hand, lies after a clock reading
    # taken once the transaction had been open a while.
    m = db.machine
    held = set(m.lease.states) if m.lease else set()
    source, event, target = next(e for e in m.edges if e[0] == m.initial)
    follow = next(e for e in m.edges if e[0] == target and e[2] != target)
    with db.connect() as app:
        for how in ("apply", "claim", "by hand"):
            row_id, version = db.row_at(app, source)
            app.execute("SELECT pg_sleep(0.2)")  # the transaction's start is long past
            started = db.clock(app)
            if how == "apply":
                assert db.apply(app, row_id, event, version, to_state=db.to_state(source, event, target)) == version + 1
            elif how == "claim":
                app.execute(db.q("UPDATE {table} SET state = state WHERE state = %s AND id <> %s"), (source, row_id))
                claimed = app.execute(db.q("SELECT id FROM {claim}(%s, 'w', 1000, %s)"),
                                      (event, db.to_state(source, event, target))).fetchall()  # fmt: skip
                assert (row_id,) in [tuple(r) for r in claimed]
            else:
                move_by_hand(db, app, row_id, version, source, event, target)
            app.commit()
            entered, at = stamps(db, app, row_id)
            # The functions stamp a move and its event row at one moment; by hand, the
            # event row is written after the row here, and gets its own later moment.
            assert started <= entered == at if how != "by hand" else started <= entered <= at, how
            if target in held:
                claim = app.execute(db.q("SELECT claimed_at, heartbeat_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()
                assert claim == (entered, entered), how
            # And the move after it, in another long transaction, is later still.
            app.execute("SELECT pg_sleep(0.05)")
            later = db.clock(app)
            assert db.apply(app, row_id, follow[1], version + 1, to_state=db.to_state(*follow)) == version + 2
            app.commit()
            assert later <= stamps(db, app, row_id)[0]
        assert db.replay_problems(app) == []


def test_an_event_row_written_before_the_move_it_follows_is_refused_n2(db: Scratch) -> None:
    # By hand, the event row first: A logs version v + 2 before B moves the row to
    # v + 1, then moves the row on from there. A's event row says the row left B's
    # state before B's move put it there: a stay of less than nothing.
    m = db.machine
    source, event, target = next(e for e in m.edges if e[0] == m.initial)
    step, after = next((e, t) for s, e, t in m.edges if s == target and t != target)
    with db.connect() as a, db.connect() as b:
        row_id, version = db.row_at(a, source)
        a.commit()
        a.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                       " VALUES (%s, %s, %s, %s, %s, 'A')"), (row_id, version + 2, target, step, after))  # fmt: skip
        time.sleep(0.01)
        assert db.apply(b, row_id, event, version, actor="B", to_state=db.to_state(source, event, target)) == version + 1
        b.commit()
        counts = "".join(f", {count_column(c.event)} = {count_column(c.event)} + 1" for c in m.caps if c.event == step)
        a.execute(db.q("UPDATE {table} SET state = %s, state_version = %s" + counts + " WHERE id = %s"),
                  (after, version + 2, row_id))  # fmt: skip
        with pytest.raises(psycopg.Error) as raised:
            a.commit()
        assert sqlstate_of(raised.value) == "40001", raised.value
        assert "before the row entered state" in str(raised.value)
        assert db.row(a, row_id) == (target, version + 1)


def test_no_stay_is_negative_when_transactions_overlap_n2(db: Scratch) -> None:
    # N2: A's transaction began before B's; B moved the row and committed, then A moved
    # it on: stamped with A's start, the stay B began lasted -1 s in the intervals view.
    m = db.machine
    source, event, target = next(e for e in m.edges if e[0] == m.initial)
    step, after = next((e, t) for s, e, t in m.edges if s == target and t != target)
    for by_hand in (False, True):
        with db.connect() as a, db.connect() as b:
            row_id, version = db.row_at(a, source)
            a.execute("SELECT 1")  # A's transaction (and its now()) begins here
            a.execute("SELECT pg_sleep(0.05)")
            assert db.apply(b, row_id, event, version, actor="B", to_state=db.to_state(source, event, target)) == version + 1
            b.commit()
            if by_hand:
                move_by_hand(db, a, row_id, version + 1, target, step, after)
            else:
                assert db.apply(a, row_id, step, version + 1, actor="A", to_state=db.to_state(target, step, after)) == version + 2
            a.commit()
            stays = a.execute(db.q("SELECT version, duration FROM {intervals} WHERE id = %s ORDER BY version"),
                              (row_id,)).fetchall()  # fmt: skip
            assert len(stays) == version + 3 and all(d >= timedelta(0) for _, d in stays), stays


def moved_after_a_held_lock(db: Scratch, holder: psycopg.Connection[Any], mover: psycopg.Connection[Any],
                            call: Any, *args: Any, commit: bool = False) -> tuple[Any, Any]:  # fmt: skip
    """Run `call(*args)` on `mover` while `holder`'s transaction holds the row; end
    that transaction (roll back, or commit) 0.2 s after the call began waiting for it;
    (when it ended, the result)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(call, *args)
        db.wait_until_blocked(mover, waiting)
        time.sleep(0.2)
        released = db.clock(holder)
        holder.commit() if commit else holder.rollback()
        return released, waiting.result(timeout=60)


def test_a_move_that_waited_for_another_transactions_lock_is_stamped_after_the_wait_n2(db: Scratch) -> None:
    # A stamp read before a wait for the row would lie by the wait: whoever holds the
    # row (a SELECT ... FOR UPDATE, or an event row logged by hand and left open,
    # which makes `_apply`'s own event row wait) would choose the time.
    m = db.machine
    source, event, target = next(e for e in m.edges if e[0] == m.initial)
    holds = {
        "a row lock": "SELECT FROM {table} WHERE id = %s FOR NO KEY UPDATE",
        "an event row": "INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                        " SELECT id, state_version + 1, %s, %s, %s, 'holder' FROM {table} WHERE id = %s",
    }  # fmt: skip
    for hold, query in holds.items():
        with db.connect() as holder, db.connect() as mover:
            row_id, version = db.row_at(mover, source)
            mover.commit()
            holder.execute(db.q(query), (row_id,) if hold == "a row lock" else (source, event, target, row_id))

            def move(row_id: Any, version: int) -> int | str | None:
                try:
                    return db.apply(mover, row_id, event, version, "mover", None, db.to_state(source, event, target))
                except psycopg.Error as error:
                    mover.rollback()
                    return sqlstate_of(error)

            released, got = moved_after_a_held_lock(db, holder, mover, move, row_id, version)
            if hold == "a row lock":  # the row waited for, then stamped
                assert got == version + 1, hold
                mover.commit()
                entered, at = stamps(db, mover, row_id)
                assert released <= entered == at, hold
            else:  # it waited for the event row after reading the clock: refused, to retry
                assert got == "40001", hold
                assert db.row(mover, row_id) == (source, version)
                assert db.apply(mover, row_id, event, version, "mover", None, db.to_state(source, event, target)) == version + 1
                mover.commit()


@pytest.mark.parametrize("spec", installs(LEASE_SPEC_NAMES))
def test_a_heartbeat_that_waited_for_the_row_is_stamped_after_the_wait_n2(pg_dsn: str, spec: tuple[str, bool]) -> None:
    name, writer_role = spec
    db = Scratch.create(pg_dsn, machine_of(name), writer_role=writer_role)
    try:
        assert db.machine.lease is not None
        with db.connect() as holder, db.connect() as worker:
            row_id, version = db.row_at(worker, str(db.machine.lease.states[0]))
            # A write that leaves the state alone (an ORM saving the row), committed
            # while the heartbeat waits for it: the beat is the time it was written.
            holder.execute(db.q("UPDATE {table} SET state = state WHERE id = %s"), (row_id,))
            beat = db.q("SELECT {heartbeat}(%s, %s)")
            released, got = moved_after_a_held_lock(
                db, holder, worker, lambda: worker.execute(beat, (row_id, version)).fetchone(), commit=True)
            assert got == (True,)
            worker.commit()
            (stamped,) = worker.execute(db.q("SELECT heartbeat_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()  # type: ignore[misc]
            assert released <= stamped
    finally:
        db.drop()


def test_a_waiter_sleeps_while_the_only_job_is_held_by_another_transaction_n3(queue_db: Scratch,
                                                                              tmp_path: Path) -> None:  # fmt: skip
    # N3: the only available job locked by another transaction: wait_for() said True at
    # once and the claim found nothing, 1,593 empty claims in 5 s with one idle worker.
    db = queue_db
    fsm = module_of(db.machine, tmp_path)
    with db.connect(autocommit=True) as producer:
        job = fsm.create(producer, schema=db.schema)
    for lock in ("FOR UPDATE", "FOR NO KEY UPDATE"):
        with db.connect() as holder, db.connect(autocommit=True) as worker:
            holder.execute(db.q(f"SELECT FROM {{table}} WHERE id = %s {lock}"), (job.id,))
            empty, deadline = 0, time.monotonic() + 1.0
            while time.monotonic() < deadline:
                assert fsm.claim(worker, "fetch", actor="w", schema=db.schema) == [], lock
                empty += 1
                fsm.wait_for(worker, "fetch", timeout=max(0.01, deadline - time.monotonic()), schema=db.schema)
            assert empty <= 2, (lock, empty)
            holder.rollback()
            assert fsm.wait_for(worker, "fetch", timeout=5, schema=db.schema) is True
    # X2: a lock that does not stop a move (a foreign key's, FOR KEY SHARE) stops no
    # claim either: the claim takes the row, as a move would.
    with db.connect() as holder, db.connect(autocommit=True) as worker:
        holder.execute(db.q("SELECT FROM {table} WHERE id = %s FOR KEY SHARE"), (job.id,))
        assert [r.id for r in fsm.claim(worker, "fetch", actor="w", schema=db.schema)] == [job.id]
        holder.rollback()


def test_a_waiter_sleeps_while_the_last_free_place_is_being_taken_n3(pg_dsn: str, tmp_path: Path) -> None:
    # N3: the last free place of a limited state taken by an open transaction: the
    # question saw it free, the claim skipped it, and the worker spun (15,809 empty
    # claims in 5 s). queue.yaml with `running: 1`.
    text = (SPECS_DIR / "queue.yaml").read_text(encoding="utf-8")
    assert text.count("  running: 50\n") == 1
    machine = machine_from_text(text.replace("  running: 50\n", "  running: 1\n"), "queue.yaml")
    db = Scratch.create(pg_dsn, machine)
    try:
        fsm = module_of(machine, tmp_path)
        with db.connect(autocommit=True) as producer:
            fsm.create_many(producer, [{}, {}], schema=db.schema)
        with db.connect() as holder, db.connect(autocommit=True) as worker:
            assert len(fsm.claim(holder, "fetch", actor="holder", schema=db.schema)) == 1  # the place, uncommitted
            empty, deadline = 0, time.monotonic() + 1.0
            while time.monotonic() < deadline:
                assert fsm.claim(worker, "fetch", actor="w", schema=db.schema) == []
                empty += 1
                fsm.wait_for(worker, "fetch", timeout=max(0.01, deadline - time.monotonic()), schema=db.schema)
            assert empty <= 2, empty
            holder.rollback()  # the place is free again
            assert fsm.wait_for(worker, "fetch", timeout=5, schema=db.schema) is True
            assert len(fsm.claim(worker, "fetch", actor="w", schema=db.schema)) == 1
    finally:
        db.drop()


def test_a_row_held_for_key_share_is_still_reclaimed_x2(pg_dsn: str) -> None:
    # X2: FOR KEY SHARE on live rows (what a foreign key to the table takes) starved
    # `_reclaim`, whose FOR UPDATE waited for nothing but skipped them all.
    db = Scratch.create(pg_dsn, machine_of("job"))
    try:
        with db.connect() as holder, db.connect() as supervisor:
            row_id, _ = db.row_at(supervisor, "running")
            db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (row_id,))
            holder.execute(db.q("SELECT FROM {table} WHERE id = %s FOR KEY SHARE"), (row_id,))
            got = supervisor.execute(db.q("SELECT * FROM {reclaim}('1 minute', 'supervisor')")).fetchall()
            assert [tuple(r) for r in got] == [(row_id,)]
            supervisor.commit()
            holder.rollback()
    finally:
        db.drop()


def test_a_job_moved_into_the_waited_queue_wakes_the_waiter_n6(queue_db: Scratch, tmp_path: Path) -> None:
    # N6: a job moved into a queue by updating its claim.by column sent no wake-up: a
    # waiter on that queue slept out its timeout.
    db = queue_db
    fsm = module_of(db.machine, tmp_path)
    with db.connect(autocommit=True) as app:
        job = fsm.create(app, queue="reports", schema=db.schema)
    with db.connect(autocommit=True) as worker, db.connect() as app:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(fsm.wait_for, worker, "fetch", timeout=10, queue="emails", schema=db.schema)
            db.asleep(worker)
            app.execute(db.q("UPDATE {table} SET queue = 'emails' WHERE id = %s"), (job.id,))
            moved = time.monotonic()
            app.commit()
            assert waiting.result(timeout=15) is True
            assert time.monotonic() - moved < 5  # woken, not timed out
        assert [r.id for r in fsm.claim(worker, "fetch", actor="w", queue="emails", schema=db.schema)] == [job.id]


def test_the_application_gives_no_id_where_the_database_makes_them_n14(queue_db: Scratch, tmp_path: Path) -> None:
    # N14: ids planted ahead of the identity sequence made the next id-less inserts and
    # create() fail (23505). A bigint id is the sequence's: the application has no
    # grant to give one, and create() takes none.
    db = queue_db
    fsm = module_of(db.machine, tmp_path)
    with db.connect() as app:
        error = refused(app, db.q("INSERT INTO {table} (id) SELECT coalesce(max(id), 0) + g FROM {table},"
                                  " generate_series(1, 5) AS g GROUP BY g"))  # fmt: skip
        assert sqlstate_of(error) == "42501", error
        assert "id" not in fsm.QueueNew.__annotations__
        with pytest.raises(TypeError):
            fsm.create(app, id=10**9, schema=db.schema)
        app.rollback()
        made = fsm.create_many(app, [{}, {}], schema=db.schema)
        assert len({r.id for r in made}) == 2
        app.commit()
