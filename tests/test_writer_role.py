"""An installation's writer role (issue 13, contract 4.2): installing it, and why
neither the application nor another installation's owner can use it.

`<machine>_apply`, `_claim` and `_reclaim` are SECURITY DEFINER functions owned by a
NOLOGIN role of their installation alone, `<schema>_<machine>` cut to 40 bytes, then
`_writer_` and the first 10 hex digits of sha256(format('%I.%I.%I', database, schema, machine));
`<machine>_fsmc_writer()` returns the name, and the triggers skip their checks for
that role's writes only. The file's first statement makes or checks the role, so a
refused install has created nothing, with or without `psql -1`. Every test drops the
roles, schemas and databases it made (`Cluster.drop` checks no writer is left).

- installing: an owner with CREATEROLE makes the role and is granted it; one without
  gets 42501 naming the role and the statements an administrator must run, before
  anything is made (the hint, run, then lets the install through); a role the owner
  is not a member of, or one that can log in, is a superuser or bypasses row
  security, is refused the same way; the name is the one documented, cut on a
  character boundary, its hash over the quoted names;
- isolation: two schemas, or one schema name in two databases, get two roles; the
  owner of one installation can neither become the other's writer, nor write its
  rows past the checks (its own writer is an application there), nor replace its
  functions;
- using: the application role cannot become the writer, the functions belong to it
  and run as it, EXECUTE on them is not PUBLIC's, and the fast path cannot be forged
  (the application's own writes get every check); an owner-added trigger runs as the
  writer inside `_apply`, which is the known price of the fast path.

Kept as a strict xfail, so that a change turns it into a failure to unmark: on
PostgreSQL before 16 an owner with CREATEROLE can grant itself another installation's
writer (a property of CREATEROLE there, which only owners without it avoid; the
docs/postgres.md says so).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fsmc.escape import sql_ident
from fsmc.model import Machine
from fsmc.targets import sqlstate
from fsmc.targets.postgres.build import build, emit
from fsmc.targets.postgres.names import Names
from tests import docs
from tests.harness import refused, refused_at_commit, snapshot, sqlstate_of
from tests.pg_scratch import TIMEOUTS, Scratch, machine_from_text, writer_of

INSUFFICIENT_PRIVILEGE = "42501"

TINY = """\
fsmc: 1
machine: {name}
initial: a
states: [a, b, c]
terminals: [c]
events: [go, back, stop]
transitions:
  - {{from: a, event: go, to: b}}
  - {{from: b, event: back, to: a}}
  - {{from: b, event: stop, to: c}}
lease:
  states: [b]
  reclaim: back
postgres:
  id_type: bigint
"""

MACHINE = machine_from_text(TINY.format(name="tiny"))


def quote_ident(name: str) -> str:
    """format('%I'), for names that are no SQL keyword (every name here)."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


def writer_name(database: str, schema: str, machine: Machine) -> str:
    """The writer role's documented name, computed here independently of the SQL."""
    head = f"{schema}_{machine.name}"
    while len(head.encode()) > 40:
        head = head[:-1]
    triple = f"{quote_ident(database)}.{quote_ident(schema)}.{quote_ident(str(machine.name))}"
    digest = hashlib.sha256(triple.encode()).hexdigest()
    return f"{head}_writer_{digest[:10]}"


@dataclass(frozen=True)
class Installation:
    owner: str
    schema: str
    writer: str
    dsn: str


class Cluster:
    """Roles, schemas and databases a test makes as the superuser, all dropped at the
    end, the writer roles of its installations included."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.roles: list[str] = []
        self.writers: list[str] = []
        self.schemas: list[tuple[str, str]] = []  # (dsn, schema)
        self.databases: list[str] = []
        self.scratches: list[Scratch] = []

    def admin(self, dsn: str | None = None) -> psycopg.Connection[Any]:
        return psycopg.connect(dsn or self.dsn, autocommit=True)

    def database_of(self, dsn: str) -> str:
        with self.admin(dsn) as admin:
            row = admin.execute("SELECT current_database()").fetchone()
        assert row is not None
        return str(row[0])

    def writer(self, schema: str, dsn: str | None = None, machine: Machine = MACHINE) -> str:
        """The writer role an install into `schema` makes or needs; dropped at the end."""
        name = writer_name(self.database_of(dsn or self.dsn), schema, machine)
        self.writers.append(name)
        return name

    def role(self, *options: str) -> str:
        name = f"fsmc_w_{uuid.uuid4().hex[:12]}"
        with self.admin() as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER " + " ".join(options))
                          .format(sql.Identifier(name)))  # fmt: skip
        self.roles.append(name)
        return name

    def schema(self, owner: str, dsn: str | None = None, name: str | None = None) -> str:
        name = name or f"fsmc_w_{uuid.uuid4().hex[:12]}"
        with self.admin(dsn) as admin:
            admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(name), sql.Identifier(owner)))  # fmt: skip
        self.schemas.append((dsn or self.dsn, name))
        return name

    def database(self) -> str:
        """A new database; its conninfo."""
        name = f"fsmc_w_{uuid.uuid4().hex[:12]}"
        with self.admin() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.databases.append(name)
        return make_conninfo(self.dsn, dbname=name)

    def connect(self, role: str, schema: str, dsn: str | None = None) -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn or self.dsn, user=role, options=TIMEOUTS)
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.commit()
        return conn

    def install(self, owner: str, schema: str, dsn: str | None = None, machine: Machine = MACHINE) -> None:
        """The machine's `.sql`, applied by `owner` into `schema` in one transaction."""
        with self.connect(owner, schema, dsn) as conn:
            conn.execute(emit(build(machine)).encode())

    def installation(self, *, createrole: bool) -> Installation:
        """The machine installed in a new schema of a new owner: one with CREATEROLE
        makes its writer; for one without, an administrator runs what the hint says."""
        owner = self.role("CREATEROLE" if createrole else "NOCREATEROLE")
        schema = self.schema(owner)
        writer = self.writer(schema)
        if not createrole:
            with self.admin() as admin:
                admin.execute(sql.SQL("CREATE ROLE {w} NOLOGIN; GRANT {w} TO {o}").format(
                    w=sql.Identifier(writer), o=sql.Identifier(owner)))  # fmt: skip
        self.install(owner, schema)
        return Installation(owner, schema, writer, self.dsn)

    def scratch(self) -> Scratch:
        """A scratch schema with its application role (its owner has CREATEROLE and
        makes the writer, as tests/pg_scratch.py does)."""
        self.scratches.append(Scratch.create(self.dsn, MACHINE))
        return self.scratches[-1]

    def role_exists(self, role: str) -> bool:
        with self.admin() as admin:
            return admin.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None

    def objects_in(self, schema: str, dsn: str | None = None) -> list[str]:
        with self.admin(dsn) as admin:
            return [r[0] for r in admin.execute(
                "SELECT relname::text FROM pg_class WHERE relnamespace = %s::regnamespace"
                " UNION ALL SELECT proname::text FROM pg_proc WHERE pronamespace = %s::regnamespace",
                (schema, schema)).fetchall()]  # fmt: skip

    def drop(self) -> None:
        for scratch in self.scratches:
            scratch.drop()
        with self.admin() as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                          " AND (usename = ANY(%s) OR datname = ANY(%s))", (self.roles, self.databases))  # fmt: skip
        for dsn, schema in self.schemas:
            if dsn == self.dsn:  # the others are in this test's databases, dropped below
                with self.admin() as admin:
                    admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        with self.admin() as admin:
            for database in self.databases:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(database)))
            # Writers first: a member's grant does not hold them, objects they own do.
            for role in [*self.writers, *self.roles]:
                if self.role_exists(role):
                    admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                    admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
            prefixes = [schema.replace("_", "\\_") + "\\_%" for _, schema in self.schemas]
            left = admin.execute("SELECT rolname::text FROM pg_roles WHERE rolname LIKE ANY(%s)", (prefixes,)).fetchall()
        assert left == [], f"roles left behind: {left}"


@pytest.fixture
def cluster(pg_dsn: str) -> Iterator[Cluster]:
    made = Cluster(pg_dsn)
    yield made
    made.drop()


def install_error(cluster: Cluster, owner: str, schema: str, machine: Machine = MACHINE) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as raised:
        cluster.install(owner, schema, machine=machine)
    return raised.value


def functions_owned(admin: psycopg.Connection[Any], schema: str) -> dict[str, str]:
    return {name: role for name, role in admin.execute(
        "SELECT p.proname::text, r.rolname::text FROM pg_proc AS p JOIN pg_roles AS r ON r.oid = p.proowner"
        " WHERE p.pronamespace = %s::regnamespace", (schema,)).fetchall()}  # fmt: skip


# --- installing ------------------------------------------------------------------


def test_an_owner_with_createrole_makes_its_installations_writer_and_is_granted_it(cluster: Cluster) -> None:
    names = Names.of(MACHINE).sql
    owner = cluster.role("CREATEROLE")
    schema = cluster.schema(owner)
    writer = cluster.writer(schema)
    assert not cluster.role_exists(writer)
    cluster.install(owner, schema)
    with cluster.admin() as admin:
        flags = admin.execute("SELECT rolcanlogin, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb"
                              " FROM pg_roles WHERE rolname = %s", (writer,)).fetchone()  # fmt: skip
        assert flags == (False, False, False, False, False)
        member = admin.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (owner, writer)).fetchone()
        assert member == (True,)
        assert writer_of(admin, schema, MACHINE) == writer
        volatility = admin.execute("SELECT provolatile FROM pg_proc WHERE oid = %s::regprocedure",
                                   (f"{schema}.{names.writer}()",)).fetchone()  # fmt: skip
        assert volatility == ("i",)  # folded into a constant in the triggers' WHEN
    with cluster.connect(owner, schema) as conn:  # and the schema works
        row = conn.execute(f"INSERT INTO {names.table} DEFAULT VALUES RETURNING id").fetchone()
        assert row is not None
        assert conn.execute(f"SELECT {names.apply}(%s, 'go', 0, 'owner')", (row[0],)).fetchone() == (1,)


def test_an_owner_without_createrole_gets_42501_naming_the_fix_before_anything_is_made(cluster: Cluster) -> None:
    owner = cluster.role()
    schema = cluster.schema(owner)
    writer = cluster.writer(schema)
    error = install_error(cluster, owner, schema)
    assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, error
    assert error.diag.message_primary == (
        f"fsmc: role {writer} does not exist, and {owner} may not create roles; nothing was changed")
    fix = f"CREATE ROLE {writer} NOLOGIN; GRANT {writer} TO {owner};"
    assert error.diag.message_hint == f"have an administrator run: {fix}"
    assert cluster.objects_in(schema) == [] and not cluster.role_exists(writer)

    # The hint, run by an administrator, is all the install needed.
    with cluster.admin() as admin:
        admin.execute(fix)
    cluster.install(owner, schema)
    with cluster.admin() as admin:
        assert writer_of(admin, schema, MACHINE) == writer


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
@pytest.mark.parametrize("one_transaction", [pytest.param(["-1"], id="docs: -1"),
                                             pytest.param([], id="CONTRACT: no -1")])  # fmt: skip
def test_psql_leaves_nothing_behind_when_the_role_is_missing(
    cluster: Cluster, tmp_path: Path, one_transaction: list[str]
) -> None:
    """The role is checked by the file's first statement, so even without -1 a refused
    install has made nothing; the hint, run, lets the same command through."""
    owner = cluster.role()
    schema = cluster.schema(owner)
    writer = cluster.writer(schema)
    path = tmp_path / "machine.sql"
    path.write_text(emit(build(MACHINE)), encoding="utf-8")
    params = conninfo_to_dict(cluster.dsn)
    env = {"PATH": "/usr/bin:/bin", "PGOPTIONS": f"-c search_path={schema}", "PGUSER": owner,
           "PGHOST": str(params.get("host", "127.0.0.1")), "PGPORT": str(params.get("port", 5432)),
           "PGDATABASE": str(params.get("dbname", "postgres"))}  # fmt: skip
    command = [shutil.which("psql") or "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", *one_transaction, "-f", str(path)]
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 3, ran
    fix = f"CREATE ROLE {writer} NOLOGIN; GRANT {writer} TO {owner};"
    assert fix in ran.stderr
    # What docs/postgres.md shows psql printing, with this writer and owner for its names.
    shown = docs.block("postgres-missing-role")
    (example_writer,) = set(re.findall(r"app_job_writer_[0-9a-f]+", shown))
    for line in shown.replace(example_writer, writer).replace("app_owner", owner).splitlines():
        assert any(printed.endswith(line) for printed in ran.stderr.splitlines()), (line, ran.stderr)
    assert cluster.objects_in(schema) == [] and not cluster.role_exists(writer)

    with cluster.admin() as admin:
        admin.execute(fix)
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran
    with cluster.admin() as admin:
        assert writer_of(admin, schema, MACHINE) == writer
        assert functions_owned(admin, schema)[Names.of(MACHINE).apply] == writer


def test_a_writer_the_owner_is_not_a_member_of_is_a_clear_42501(cluster: Cluster) -> None:
    owner = cluster.role()
    schema = cluster.schema(owner)
    writer = cluster.writer(schema)
    with cluster.admin() as admin:
        admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(writer)))
    error = install_error(cluster, owner, schema)
    assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, error
    assert error.diag.message_primary == (
        f"fsmc: {owner} is not a member of role {writer}, so it cannot give it the functions;"
        " nothing was changed")  # fmt: skip
    assert error.diag.message_hint == f"have an administrator run: GRANT {writer} TO {owner};"
    assert cluster.objects_in(schema) == []


@pytest.mark.parametrize("power", ["LOGIN", "SUPERUSER", "BYPASSRLS"])
def test_a_writer_that_can_log_in_or_bypass_checks_is_refused(cluster: Cluster, power: str) -> None:
    owner = cluster.role()
    schema = cluster.schema(owner)
    writer = cluster.writer(schema)
    with cluster.admin() as admin:
        admin.execute(sql.SQL("CREATE ROLE {} " + power).format(sql.Identifier(writer)))
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(writer), sql.Identifier(owner)))
    error = install_error(cluster, owner, schema)
    assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, error
    assert "can log in, is a superuser or bypasses row security" in str(error)
    assert error.diag.message_hint == f"ALTER ROLE {writer} NOLOGIN NOSUPERUSER NOBYPASSRLS;"
    assert cluster.objects_in(schema) == []


def test_the_name_is_cut_to_40_bytes_on_a_character_and_hashes_the_quoted_names(cluster: Cluster) -> None:
    """A schema name of two-byte characters, which format('%I') quotes, whose 40th
    byte is the first of one: the role's name keeps whole characters (39 bytes of
    them) and stays within PostgreSQL's 63 bytes."""
    owner = cluster.role("CREATEROLE")
    schema = cluster.schema(owner, name=f"fsmc_w_{uuid.uuid4().hex[:12]}_x" + "é" * 20)
    writer = cluster.writer(schema)
    cluster.install(owner, schema)
    with cluster.admin() as admin:
        assert writer_of(admin, schema, MACHINE) == writer
    head = writer.removesuffix(writer[-len("_writer_0123456789"):])
    assert len(head.encode()) == 39 and schema.startswith(head) and len(writer.encode()) <= 63


def test_two_machines_in_one_long_named_schema_get_two_writers(cluster: Cluster) -> None:
    owner = cluster.role("CREATEROLE")
    schema = cluster.schema(owner, name="fsmc_w_" + uuid.uuid4().hex[:12] + "_long_schema_name_x")
    machines = [machine_from_text(TINY.format(name=name)) for name in ("orders_a", "orders_b")]
    for machine in machines:
        cluster.writer(schema, machine=machine)
        cluster.install(owner, schema, machine=machine)
    with cluster.admin() as admin:
        writers = [writer_of(admin, schema, machine) for machine in machines]
    assert writers[0] != writers[1], writers


# --- isolation -------------------------------------------------------------------


@pytest.mark.parametrize("createrole", [pytest.param(False, id="writers made by an administrator"),
                                        pytest.param(True, id="owners with CREATEROLE")])  # fmt: skip
def test_the_owner_of_one_schema_cannot_use_anothers_writer(cluster: Cluster, createrole: bool) -> None:
    """Two installs of one machine get two writers, each its owner's alone. Another
    installation's writer is an application there: its writes get every check."""
    mine, theirs = cluster.installation(createrole=createrole), cluster.installation(createrole=createrole)
    raw = Names.of(MACHINE)
    n = raw.sql
    assert mine.writer != theirs.writer
    with cluster.admin() as admin:
        for who, writer, member in [(mine.owner, theirs.writer, False), (theirs.owner, mine.writer, False),
                                    (mine.owner, mine.writer, True), (theirs.owner, theirs.writer, True)]:  # fmt: skip
            assert admin.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (who, writer)).fetchone() == (member,)
        assert functions_owned(admin, theirs.schema)[raw.apply] == theirs.writer
    with cluster.connect(theirs.owner, theirs.schema) as conn:  # a row, and grants as to an application
        row = conn.execute(f"INSERT INTO {n.table} DEFAULT VALUES RETURNING id").fetchone()
        assert row is not None
        row_id = row[0]
        for grantee in (mine.owner, mine.writer):
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {s} TO {g}; GRANT SELECT, UPDATE ON {t} TO {g}").format(
                s=sql.Identifier(theirs.schema), g=sql.Identifier(grantee), t=sql.SQL(n.table)))  # fmt: skip
        conn.commit()

    theirs_ = sql.Identifier(theirs.schema).as_string()
    with cluster.connect(mine.owner, mine.schema) as owner:
        owner.autocommit = True  # SET ROLE outlives the refusals' rollbacks
        for attempt in (sql.SQL("SET ROLE {}"), sql.SQL("SET SESSION AUTHORIZATION {}")):
            error = refused(owner, attempt.format(sql.Identifier(theirs.writer)).as_bytes(owner))
            assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, (attempt, error)
        for as_writer in (False, True):  # as itself, and as its own writer
            if as_writer:
                owner.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(mine.writer)))
            error = refused(owner, f"UPDATE {theirs_}.{n.table} SET state = 'c', state_version = 1"
                                   " WHERE id = %s".encode(), (row_id,))  # fmt: skip
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, (as_writer, error)
            replace = [
                f"CREATE OR REPLACE FUNCTION {theirs_}.{n.apply}(id bigint, event text, expected_version bigint,"
                " actor text, payload jsonb DEFAULT NULL, to_state text DEFAULT NULL) RETURNS bigint"
                " LANGUAGE sql AS 'SELECT 42::bigint'",
                f"CREATE OR REPLACE FUNCTION {theirs_}.{n.writer}() RETURNS name LANGUAGE sql IMMUTABLE"
                " RETURN current_user",
            ]  # fmt: skip
            for attack in replace:
                error = refused(owner, attack.encode())
                assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, (as_writer, attack, error)
    with cluster.admin() as admin:
        assert writer_of(admin, theirs.schema, MACHINE) == theirs.writer
        assert admin.execute(f"SELECT state, state_version FROM {theirs_}.{n.table}".encode()).fetchall() == [("a", 0)]


def test_an_owner_with_createrole_cannot_grant_itself_anothers_writer(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """From PostgreSQL 16, CREATEROLE grants only the roles one holds with ADMIN
    OPTION. Before, it grants (and alters) every role but superusers: an owner who
    made its writer can take any other installation's, so there isolation needs owners
    without CREATEROLE, whose writers an administrator makes (the hint)."""
    with cluster.admin() as admin:
        version = admin.execute("SHOW server_version_num").fetchone()
    assert version is not None
    if int(version[0]) < 160000:
        request.applymarker(pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=(
            "PostgreSQL < 16: CREATEROLE grants any non-superuser role, so an owner that may"
            " make its writer may also take another installation's")))  # fmt: skip
    mine, theirs = cluster.installation(createrole=True), cluster.installation(createrole=True)
    with cluster.connect(mine.owner, mine.schema) as owner:
        error = refused(owner, sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(theirs.writer)).as_bytes(owner))
        assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, error
        error = refused(owner, sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(theirs.writer)).as_bytes(owner))
        assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, error


def test_one_schema_name_in_two_databases_gets_two_writers(cluster: Cluster) -> None:
    owner = cluster.role("CREATEROLE")
    schema = cluster.schema(owner)
    other = cluster.database()
    cluster.schema(owner, dsn=other, name=schema)
    writers = [cluster.writer(schema), cluster.writer(schema, dsn=other)]
    assert writers[0] != writers[1]
    for dsn in (cluster.dsn, other):
        cluster.install(owner, schema, dsn=dsn)
    n = Names.of(MACHINE)
    for dsn, writer in zip((cluster.dsn, other), writers, strict=True):
        with cluster.admin(dsn) as admin:
            assert writer_of(admin, schema, MACHINE) == writer
            assert functions_owned(admin, schema)[n.apply] == writer


# --- using -----------------------------------------------------------------------


def test_the_application_role_cannot_become_the_writer(cluster: Cluster) -> None:
    db = cluster.scratch()
    with db.superuser() as admin:
        writer = writer_of(admin, db.schema, db.machine)
    assert writer is not None
    with db.connect(autocommit=True) as app:
        assert app.execute("SELECT pg_has_role(%s, 'MEMBER')", (writer,)).fetchone() == (False,)
        for attempt in (sql.SQL("SET ROLE {}"), sql.SQL("SET SESSION AUTHORIZATION {}"),
                        sql.SQL("GRANT {} TO CURRENT_USER")):  # fmt: skip
            error = refused(app, attempt.format(sql.Identifier(writer)).as_bytes(app))
            assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, (attempt, error)
        assert app.execute("SELECT current_user").fetchone() == (db.app_role,)


def assert_owned_as_documented(conn: psycopg.Connection[Any], schema: str, owner: str, writer: str) -> None:
    """The functions of the installation in `schema` belong to its `writer` or to `owner`,
    run as the one they should, and EXECUTE on each is PUBLIC's only where it should be."""
    n = Names.of(MACHINE)  # raw: pg_proc holds names themselves
    got = {name: (role, definer, public) for name, role, definer, public in conn.execute(
        "SELECT p.proname::text, r.rolname::text, p.prosecdef,"
        "       EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a"
        "               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')"
        " FROM pg_proc AS p JOIN pg_roles AS r ON r.oid = p.proowner"
        " WHERE p.pronamespace = %s::regnamespace", (sql_ident(schema),)).fetchall()}  # fmt: skip
    for mover in (n.apply, n.claim, n.reclaim, n.heartbeat):  # the heartbeat writes heartbeat_at for its caller
        assert got[mover] == (writer, True, False), mover
    # The update guard stamps a hand-made move's times as the writer; a trigger
    # function cannot be called directly, so EXECUTE stays as PostgreSQL makes it.
    assert got[n.guard_update][:2] == (writer, True)
    assert got[n.purge] == (owner, True, False)  # SECURITY DEFINER for its ticket table
    # Every writer's triggers call it: it stays PUBLIC's, runs as its caller, and is the owner's.
    assert got[n.writer] == (owner, False, True)


def test_the_moving_functions_belong_to_the_writer_and_no_one_may_call_them_by_default(
    cluster: Cluster,
) -> None:
    db = cluster.scratch()
    with db.owner() as owner:
        writer = writer_of(owner, db.schema, db.machine)
        assert writer is not None
        assert_owned_as_documented(owner, db.schema, db.role, writer)

    # A role with USAGE on the schema and nothing else cannot call them.
    stranger = cluster.role()
    with cluster.admin() as admin:
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(db.schema), sql.Identifier(stranger)))  # fmt: skip
    with cluster.connect(stranger, db.schema) as conn:
        for call in [db.q("SELECT {apply}(1, 'go', 0, 'x')"), db.q("SELECT * FROM {claim}('go', 'x')"),
                     db.q("SELECT * FROM {reclaim}('1 minute', 'x')"), db.q("SELECT {purge}('1 day', 10)"),
                     db.q("SELECT {heartbeat}(1, 0)")]:  # fmt: skip
            error = refused(conn, call)
            assert sqlstate_of(error) == INSUFFICIENT_PRIVILEGE, (call, error)
            assert "permission denied for function" in str(error)


@pytest.mark.parametrize("name", ["Fsmc W {}", "FsmcW_{}"])
def test_a_schema_whose_name_needs_quoting_gets_the_same_owners_and_grants(cluster: Cluster, name: str) -> None:
    """The install finds its functions by the schema's name quoted as an identifier:
    unquoted, a name with a space is refused as a name, and a MixedCase one names
    another schema (folded to lower case), where no function is found, so the
    functions would stay the owner's and PUBLIC's to call."""
    owner = cluster.role("CREATEROLE")
    schema = cluster.schema(owner, name=name.format(uuid.uuid4().hex[:8]))
    writer = cluster.writer(schema)
    cluster.install(owner, schema)
    with cluster.admin() as admin:
        assert_owned_as_documented(admin, schema, owner, writer)


def test_the_fast_path_cannot_be_forged_by_the_application(cluster: Cluster) -> None:
    """The triggers skip their checks for the writer only: the application's own
    writes, even in a transaction where `_apply` ran, get every one."""
    db = cluster.scratch()
    with db.connect() as app:
        moved, other = db.new_row(app), db.new_row(app)
        app.commit()
        before = snapshot(db, app)
        assert db.apply(app, moved, "go", 0) == 1
        error = refused(app, db.q("UPDATE {table} SET state = 'c', state_version = 1 WHERE id = %s"), (other,))
        assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error  # a -> c: no such edge
        assert snapshot(db, app) == before  # the whole transaction, _apply's move included

        assert db.apply(app, moved, "go", 0) == 1
        error = refused_at_commit(app, (db.q("UPDATE {table} SET state = 'b', state_version = 1"
                                             " WHERE id = %s"), (other,)))  # fmt: skip
        assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE, error
        error = refused_at_commit(app, (db.q("INSERT INTO {events} ({id_col}, version, from_state, event,"
                                             " to_state, actor) VALUES (%s, 1, 'a', 'go', 'b', 'forger')"),
                                        (other,)))  # fmt: skip
        assert sqlstate_of(error) == sqlstate.UNLOGGED_CHANGE, error
        assert snapshot(db, app) == before


def test_an_owner_added_trigger_runs_as_the_writer_inside_apply(cluster: Cluster) -> None:
    """The known price of the fast path: inside `_apply`, current_user is the writer,
    so a trigger the owner adds to the table runs as the writer, and whatever it
    writes gets the writer's pass through the checks. Here one rewrites the state
    `_apply` sets, and nothing refuses it: owner-added triggers are trusted like the
    owner, who can switch the checks off anyway. The application's own writes still
    see current_user = the application."""
    db = cluster.scratch()
    with db.owner() as owner:
        writer = writer_of(owner, db.schema, db.machine)
        owner.execute(db.q(
            "CREATE FUNCTION spy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            "  RAISE NOTICE 'current_user=% session_user=%', current_user, session_user;"
            "  IF NEW.state = 'b' AND NEW.claimed_by = 'rewrite-me' THEN NEW.state := 'c'; END IF;"
            "  RETURN NEW; END $$;"
            "CREATE TRIGGER spy BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION spy()"))  # fmt: skip
        owner.commit()
    seen: list[str] = []
    with db.connect() as app:
        app.add_notice_handler(lambda diag: seen.append(diag.message_primary or ""))
        row_id = db.new_row(app)
        assert db.apply(app, row_id, "go", 0) == 1
        assert seen == [f"current_user={writer} session_user={db.app_role}"]
        app.execute(db.q("UPDATE {table} SET state = state WHERE id = %s"), (row_id,))
        assert seen[-1] == f"current_user={db.app_role} session_user={db.app_role}"
        app.commit()

        rewritten = db.new_row(app)
        assert db.apply(app, rewritten, "go", 0, actor="rewrite-me") == 1
        app.commit()  # the checks were skipped: the row is where its log says it is not
        assert db.row(app, rewritten) == ("c", 1)
        assert db.events_of(app, rewritten) == [(1, "a", "go", "b", "rewrite-me")]
