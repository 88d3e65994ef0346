"""Installations without a writer role (issue 23, item 10): 1.2's `postgres: {writer_role:
false}`, for hosts where nobody can create a role (Heroku Postgres).

There no role is made or needed, the functions that move rows stay the installer's
(SECURITY DEFINER, EXECUTE not PUBLIC's, search_path pinned), and the triggers skip no
one: every write is checked, the functions' own included. The database tests of
contract 4.2, the security tests and the worker's tests run in this mode too (their
fixtures take `pg_scratch.installs`); here, what is the mode's own:

- installing: the psql command of docs/postgres.md, run as written, as an owner with NOCREATEROLE and no role
  made beforehand, makes no role and no writer function; the functions are the
  owner's, the triggers name no role;
- checking: a function's write is checked like any other (an owner's trigger that
  rewrites `_apply`'s move is refused, where with a writer it passes);
- stamping: the guard leaves what a function stamped (its actor as `claimed_by`, in
  the BEFORE guard of a machine with caps and the AFTER one of a machine without),
  and makes no second UPDATE for a function's move, while a move by hand is stamped
  as ever, in a transaction where a function moved the row first too;
- releases: `fsmc migrate` between two such specs works as the same owner, between
  the modes it refuses (exit 2), and `fsmc diff` calls the change breaking;
  `fsmc roles` prints no role to make;
- every example spec's generated suites pass, pytest's and node's, database half
  included, built so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from fsmc.migrate import migrate
from fsmc.targets import generate, sqlstate
from fsmc.targets.postgres.build import build, emit
from fsmc.targets.postgres.names import Names
from tests import docs
from tests import migrating as tm
from tests.conftest import SPECS
from tests.harness import refused, run_pytest, sqlstate_of
from tests.pg_scratch import Scratch, machine_from_text, machine_of, without_writer_role, writer_of
from tests.typescript_tools import Missing, compile_folders, node_test

# Every spec in specs/, as a user would write it with the key.
EXAMPLES = sorted(p.stem for p in SPECS.glob("*.yaml"))

TIMED = """\
fsmc: 1
machine: timed
initial: a
states: [a, b, c, d]
terminals: [d]
events: [go, wait, fire, stop]
transitions:
  - {from: a, event: go, to: b}
  - {from: b, event: wait, to: c}
  - {from: c, event: fire, to: d, after: 1h}
  - {from: [a, b, c], event: stop, to: d}
caps:
  go: 5  # (caps: the guard runs before the write)
postgres:
  id_type: bigint
  writer_role: false
"""


@pytest.fixture(params=["job", "task"])  # the AFTER guard (no caps), the BEFORE one (caps)
def db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    scratch = Scratch.create(pg_dsn, machine_of(request.param), writer_role=False)
    yield scratch
    scratch.drop()


def functions_of(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, bool, bool]]:
    """Each function of `schema` -> (its owner, SECURITY DEFINER, EXECUTE is PUBLIC's)."""
    return {name: (owner, definer, public) for name, owner, definer, public in conn.execute(
        "SELECT p.proname::text, r.rolname::text, p.prosecdef,"
        "       EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a"
        "               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')"
        " FROM pg_proc AS p JOIN pg_roles AS r ON r.oid = p.proowner"
        " WHERE p.pronamespace = %s::regnamespace", (schema,)).fetchall()}  # fmt: skip


def updates_so_far(db: Scratch, conn: psycopg.Connection[Any]) -> int:
    """How many row versions this session's UPDATEs of the machine's table wrote since
    its counts were last reported (PostgreSQL 15's `xact` view holds those of earlier
    transactions too, until it flushes them when idle: compare two readings taken in
    one transaction)."""
    got = conn.execute("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = %s::regclass",
                       (f"{db.schema}.{db.names.table}",)).fetchone()  # fmt: skip
    assert got is not None
    return int(got[0])


# --- installing ----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
@pytest.mark.parametrize("name", ["job", "queue"])
def test_an_owner_that_may_not_create_roles_installs_it_with_the_pages_command(
    pg_dsn: str, name: str, tmp_path: Path
) -> None:
    machine = without_writer_role(machine_of(name))
    scratch = Scratch.create(pg_dsn, machine, sql_text="SELECT 1;")  # the roles and the schema only
    try:
        path = tmp_path / f"{name}.sql"
        path.write_text(emit(build(machine)), encoding="utf-8")
        # No role made: none named after the schema (as a writer would be), and the
        # owner was granted none (other tests' roles come and go meanwhile).
        made = ("SELECT (SELECT count(*) FROM pg_roles WHERE starts_with(rolname, %s)),"
                " (SELECT count(*) FROM pg_auth_members WHERE member = %s::regrole)")  # fmt: skip
        with scratch.superuser() as admin:
            assert admin.execute("SELECT rolcreaterole FROM pg_roles WHERE rolname = %s",
                                 (scratch.role,)).fetchone() == (False,)  # fmt: skip
            assert admin.execute(made, (scratch.schema, scratch.role)).fetchone() == (0, 0)
        # The page's command, as the owner, with this schema and file for `app` and its path.
        (command,) = docs.block("postgres-install").splitlines()
        for shown, real in (("search_path=app'", f"search_path={scratch.schema}'"),
                            ("generated/job/job.sql", str(path))):  # fmt: skip
            assert shown in command, shown
            command = command.replace(shown, real)
        params = conninfo_to_dict(pg_dsn)
        env = {"PATH": "/usr/bin:/bin", "PGUSER": scratch.role, "PGHOST": str(params.get("host", "127.0.0.1")),
               "PGPORT": str(params.get("port", 5432)), "PGDATABASE": str(params.get("dbname", "postgres"))}  # fmt: skip
        done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "ERROR" not in done.stderr and "WARNING" not in done.stderr, done.stderr
        raw = Names.of(machine)
        with scratch.superuser() as admin:
            assert admin.execute(made, (scratch.schema, scratch.role)).fetchone() == (0, 0)
            assert writer_of(admin, scratch.schema, machine) is None
            functions = functions_of(admin, scratch.schema)
            assert raw.writer not in functions
            assert {owner for owner, _, _ in functions.values()} == {scratch.role}
            for mover in (*raw.movers(machine.lease is not None), raw.purge):
                assert functions[mover] == (scratch.role, True, False), mover
            definitions = [d for (d,) in admin.execute(
                "SELECT pg_get_triggerdef(t.oid) FROM pg_trigger AS t"
                " WHERE t.tgrelid IN (%s::regclass, %s::regclass) AND NOT t.tgisinternal",
                (f"{scratch.schema}.{raw.table}", f"{scratch.schema}.{raw.events_table}")).fetchall()]  # fmt: skip
            assert len(definitions) >= 8 and not any("CURRENT_USER" in d.upper() for d in definitions), definitions
        with scratch.owner() as owner:  # and the application runs on the grants of docs/postgres.md
            owner.execute(scratch.grants())
            owner.commit()
        with scratch.connect() as app:
            source, event, target = machine.edges[0]
            row_id, version = scratch.row_at(app, source)
            assert scratch.apply(app, row_id, event, version, to_state=scratch.to_state(source, event, target)) == version + 1
            app.commit()
    finally:
        scratch.drop()


# --- every write checked ---------------------------------------------------------------


def test_a_functions_write_is_checked_like_any_other(pg_dsn: str) -> None:
    """With a writer role an owner-added trigger rewriting `_apply`'s move goes
    unchecked (tests/test_writer_role.py); without one, the guard refuses it."""
    db = Scratch.create(pg_dsn, machine_of("job"), writer_role=False)
    try:
        with db.owner() as owner:
            owner.execute(db.q(
                "CREATE FUNCTION rewrite() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                "  IF NEW.state = 'claimed' AND NEW.claimed_by = 'rewrite-me' THEN NEW.state := 'completed'; END IF;"
                "  RETURN NEW; END $$;"
                "CREATE TRIGGER rewrite BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION rewrite()"))  # fmt: skip
            owner.commit()
        with db.connect() as app:
            row_id = db.new_row(app)
            app.commit()
            error = refused(app, db.q("SELECT {apply}(%s, 'claim', 0, 'rewrite-me')"), (row_id,))
            assert sqlstate_of(error) == sqlstate.BYPASS_WRITE, error  # queued -> completed: no such edge
            assert db.row(app, row_id) == ("queued", 0) and db.events_of(app, row_id) == []
            assert db.apply(app, row_id, "claim", 0, actor="worker") == 1  # a legal move passes
            app.commit()
    finally:
        db.drop()


def test_the_guard_keeps_what_a_function_stamped_and_stamps_a_move_by_hand(db: Scratch) -> None:
    m = db.machine
    assert m.lease is not None
    held = str(m.lease.states[0])
    source, event = next((s, e) for (s, e), ts in m.targets.items() if ts == (held,) and s not in m.lease.states)
    # The claim begun when the row entered the lease, by this transaction's move.
    stamped = db.q("SELECT claimed_by, claimed_at = entered_at, entered_at >= %s FROM {table} WHERE id = %s")
    with db.connect() as app:
        moved, by_hand = db.row_at(app, source), db.row_at(app, source)
        app.commit()
        started = db.clock(app)
        before = updates_so_far(db, app)
        assert db.apply(app, moved[0], event, moved[1], actor="worker-7") == moved[1] + 1
        # The actor the function wrote, not the session's role; and one row version
        # written, the AFTER guard's stamp included (none: the function stamped it).
        assert app.execute(stamped, (started, moved[0])).fetchone() == ("worker-7", True, True)
        assert updates_so_far(db, app) - before == 1
        app.commit()
        # A move by hand, its event row beside it: stamped by the guard, as ever.
        started = db.clock(app)
        before = updates_so_far(db, app)
        app.execute(db.q("UPDATE {table} SET state = %s, state_version = state_version + 1 WHERE id = %s"),
                    (held, by_hand[0]))  # fmt: skip
        app.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                         " VALUES (%s, %s, %s, %s, %s, 'by hand')"), (by_hand[0], by_hand[1] + 1, source, event, held))  # fmt: skip
        assert app.execute(stamped, (started, by_hand[0])).fetchone() == (db.app_role, True, True)
        # The AFTER guard stamps it with an UPDATE of its own (what the count above sees).
        assert updates_so_far(db, app) - before == (1 if m.caps else 2)
        app.commit()


def test_a_move_by_hand_after_a_functions_move_in_one_transaction_gets_its_due_time(pg_dsn: str) -> None:
    """The row's entered_at was stamped already (the function's move, in this very
    transaction): the guard must still stamp the due time of the timed state a move by
    hand enters."""
    db = Scratch.create(pg_dsn, machine_from_text(TIMED, "timed.yaml"))
    try:
        with db.connect() as app:
            row_id = db.new_row(app)
            app.commit()
            assert db.apply(app, row_id, "go", 0) == 1
            app.execute(db.q("UPDATE {table} SET state = 'c', state_version = 2 WHERE id = %s"), (row_id,))
            app.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                             " VALUES (%s, 2, 'b', 'wait', 'c', 'by hand')"), (row_id,))  # fmt: skip
            due = app.execute(db.q("SELECT due_at - entered_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()
            assert due is not None and due[0] is not None and due[0].total_seconds() == 3600
            app.commit()
            error = refused(app, db.q("SELECT {apply}(%s, 'fire', 2, 'early')"), (row_id,))
            assert sqlstate_of(error) == sqlstate.NOT_DUE, error
    finally:
        db.drop()


# --- releases ----------------------------------------------------------------------------


def test_a_migration_between_two_such_specs_runs_as_an_owner_that_may_not_create_roles(pg_dsn: str) -> None:
    old, new = (without_writer_role(tm.spec("added_state", side)) for side in ("old", "new"))
    with tm.built(pg_dsn, old) as db:
        tm.fill(db)
        tm.migrate_ok(db, migrate(old, new))
        migrated = tm.migrated(db, new)
        with db.superuser() as admin:
            assert writer_of(admin, db.schema, new) is None
            assert {owner for owner, _, _ in functions_of(admin, db.schema).values()} == {db.role}
        for behaviour in tm.BEHAVIOURS:
            behaviour(migrated)


def test_migrate_refuses_to_change_the_mode_and_diff_calls_it_breaking(fsmc: Any, tmp_path: Path) -> None:
    text = (SPECS / "job.yaml").read_text(encoding="utf-8")
    with_writer, without = tmp_path / "with.yaml", tmp_path / "without.yaml"
    with_writer.write_text(text, encoding="utf-8")
    without.write_text(text.replace("\npostgres:\n", "\npostgres:\n  writer_role: false\n"), encoding="utf-8")
    assert not machine_from_text(without.read_text(), "without.yaml").postgres.writer_role
    for old, new in ((with_writer, without), (without, with_writer)):
        ran = fsmc("migrate", old, new)
        assert ran.code == 2 and ran.out == "", ran
        assert "postgres.writer_role changes from" in ran.err and "fresh install" in ran.err, ran.err
    ran = fsmc("diff", with_writer, without, "--format", "json")
    assert ran.code == 1, ran
    assert '"name": "postgres.writer_role"' in ran.out and '"breaking": true' in ran.out, ran.out
    ran = fsmc("roles", without, "--database", "d", "--schema", "app", "--owner", "o", "--app", "a")
    assert ran.code == 0 and "CREATE ROLE" not in ran.out and "GRANT USAGE ON SCHEMA app TO a;" in ran.out, ran


def test_writer_role_takes_a_boolean_only(fsmc: Any, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text((SPECS / "job.yaml").read_text().replace("\npostgres:\n", "\npostgres:\n  writer_role: no\n"))
    ran = fsmc("check", spec)
    assert ran.code == 1 and "postgres.writer_role: expected boolean" in ran.out and "[schema]" in ran.out, ran


# --- the generated suites ----------------------------------------------------------------


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every example built with --typescript as if its spec said `writer_role: false`."""
    root = tmp_path_factory.mktemp("no_writer_examples")
    for name in EXAMPLES:
        for path, text in generate(without_writer_role(machine_of(name)), typescript=True).files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        assert "_fsmc_writer" not in (root / name / f"{name}.sql").read_text(encoding="utf-8")
    return root


def test_every_examples_generated_suite_passes_without_a_writer_role(pg_dsn: str, examples: Path) -> None:
    # One pytest process for all of them, as tests/test_generated_code.py runs the
    # generated/ ones.
    done = run_pytest(*EXAMPLES, "-rps", cwd=examples, dsn=pg_dsn)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout
    passed = {line.split()[1].split("/")[0] for line in done.stdout.splitlines() if line.startswith("PASSED ")}
    assert passed == set(EXAMPLES), done.stdout


@pytest.mark.slow
def test_every_examples_typescript_suite_passes_without_a_writer_role(
    pg_dsn: str, examples: Path, tmp_path: Path
) -> None:
    # One tsc and one node for all of them, as tests/test_typescript.py runs generated/'s.
    try:
        compiled = compile_folders({name: examples / name for name in EXAMPLES}, tmp_path / "build")
    except Missing as exc:
        pytest.fail(str(exc))
    assert (compiled.code, compiled.output) == (0, "")
    ran = node_test(compiled.suites(), {"FSMC_PG_DSN": pg_dsn, "FSMC_PYTHON": sys.executable})
    assert ran.code == 0 and ran.count("fail") == 0 and ran.count("skipped") == 0, ran.output[-6000:]
    assert ran.count("pass") >= 12 * len(EXAMPLES) and "Python claim racing" in ran.output
