"""A database an older fsmc built is migrated, not taken for current (contract 6,
issues 11 and 13): schema format 1 (no created_at/entered_at, claim, purge,
intervals; no `<machine>_fsmc_format()`), format 2 (an `_apply` without
to_state; every function the owner's, EXECUTE on them PUBLIC's), format 3 (the
triple CHECK calling a PL/pgSQL function, the state CHECK holding a text[]) and
format 4 (the triple CHECK casting one joined text, the triggers comparing a name).

tests/format_cases/added_state_old.format1.sql is what fsmc built for
tests/migrate_cases/added_state/old.yaml before format 2 (the SQL template of that
release, rendered for that spec); added_state_old.format2.sql what it built at
format 2 (commit 9830bc5; its first lines say how it was made), and
added_state_old.format3.sql at format 3 (commit 970ec0a, the last before format 4),
added_state_old.format4.sql at format 4 (commit a63c560, the last before format 5),
added_state_old.format5.sql at format 5 (commit 836a4ae, the last before format 6),
added_state_old.format6.sql at format 6 (commit 8cb3727, the last before format 7),
added_state_old.format7.sql at format 7 (commit d8673ce, the last before format 8)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fsmc.migrate import migrate
from fsmc.model import Machine
from fsmc.targets.postgres.build import build
from fsmc.targets.postgres.formats import SCHEMA_FORMAT, UpgradeFormat, upgrade_format
from fsmc.targets.postgres.names import Names
from fsmc.targets.postgres.operations import (
    Begin,
    Guard,
    PrepareWriterRole,
    Renames,
    SetLockTimeout,
)
from tests.conftest import ROOT
from tests.migrating import (
    CATALOG,
    behaves_as_contract_4_2,
    built,
    catalog,
    data,
    migrate_ok,
    migrated,
    plan_of,
    refused_changing_nothing,
    spec,
)
from tests.pg_scratch import Scratch

FORMAT1 = ROOT / "tests" / "format_cases" / "added_state_old.format1.sql"
FORMAT2 = ROOT / "tests" / "format_cases" / "added_state_old.format2.sql"
FORMAT3 = ROOT / "tests" / "format_cases" / "added_state_old.format3.sql"
FORMAT4 = ROOT / "tests" / "format_cases" / "added_state_old.format4.sql"
FORMAT5 = ROOT / "tests" / "format_cases" / "added_state_old.format5.sql"
FORMAT6 = ROOT / "tests" / "format_cases" / "added_state_old.format6.sql"
FORMAT7 = ROOT / "tests" / "format_cases" / "added_state_old.format7.sql"


def without_column_order(objects: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """Added columns come last; a fresh build has them in place. Everything else equal."""
    out = dict(objects)
    out["columns"] = sorted(objects["columns"], key=repr)
    return out


@pytest.mark.parametrize("case", ["added_state", "renamed_tables", "caps_added"])
def test_the_format_steps_are_the_first_change_and_come_from_old_alone(case: str) -> None:
    # Apart from the specs' difference: what older formats lack is OLD's build, under
    # OLD's names, whatever NEW asks; it runs before the renames and every other change.
    steps = plan_of(case)
    changes = [s for s in steps if not isinstance(s, Begin | SetLockTimeout | Guard | PrepareWriterRole)]
    first = changes[0]
    assert isinstance(first, UpgradeFormat) and first == upgrade_format(build(spec(case)))
    assert first.table == "jobs"
    assert isinstance(changes[1], Renames) == (case == "renamed_tables")


def test_a_format_1_database_is_brought_to_the_current_format_by_the_migration(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT1.read_text(encoding="utf-8"))
    try:
        n = Names.of(old).sql
        with db.owner() as owner:  # the grants of that release: no view yet
            owner.execute(f"GRANT USAGE ON SCHEMA {db.schema} TO {db.app_role};"
                          f" GRANT SELECT, INSERT, UPDATE ON {n.table} TO {db.app_role};"
                          f" GRANT SELECT, INSERT ON {n.events_table} TO {db.app_role}".encode())  # fmt: skip
            owner.commit()
            assert owner.execute("SELECT to_regprocedure('job_fsmc_format()')").fetchone() == (None,)
        with db.connect() as app:
            moved = [db.row_at(app, s)[0] for s in ("queued", "running", "completed", "failed")]
        before = data(db, old)
        with db.connect() as app:  # the last event of each row: its entered_at to be
            last = dict(app.execute(db.q("SELECT {id_col}, max(at) FROM {events} GROUP BY 1")).fetchall())

        migrate_ok(db, migrate(old, new))

        with built(pg_dsn, new) as fresh:
            got, want = catalog(db), catalog(fresh)
        for kind in CATALOG:
            if kind != "relations":  # the view's grant is the deployment's (README)
                assert without_column_order(got.objects)[kind] == without_column_order(want.objects)[kind], kind
        after = data(db, new)
        assert after.events == before.events
        assert {r: row[:2] for r, row in after.rows.items()} == {r: row[:2] for r, row in before.rows.items()}
        with db.owner() as owner:
            owner.execute(f"GRANT SELECT ON {Names.of(new).sql.intervals} TO {db.app_role}".encode())
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (SCHEMA_FORMAT,)
        with db.connect() as app:
            entered = dict(app.execute(db.q("SELECT id, entered_at FROM {table}")).fetchall())
            for row_id in moved:
                if row_id in last:
                    assert entered[row_id] == last[row_id]
            stays = app.execute(db.q("SELECT count(*) FROM {intervals}")).fetchone()
            assert stays == (len(before.events) + len(before.rows),)
            claimed = app.execute(db.q("SELECT id, state_version FROM {claim}('claim', 'w', 100)")).fetchall()
            assert [r[1] for r in claimed] == [1]  # the queued row, never moved
            app.rollback()
        behaves_as_contract_4_2(migrated(db, new, (old, before.versions)))
    finally:
        db.drop()


def test_a_current_database_runs_the_same_script_without_the_format_step(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    with built(pg_dsn, old) as db:
        with db.connect() as app:
            db.row_at(app, "running")
        migrate_ok(db, migrate(old, new))
        with built(pg_dsn, new) as fresh:
            assert catalog(db).objects == catalog(fresh).objects
        with psycopg.connect(db.dsn, options=f"-c search_path={db.schema}") as conn:
            assert conn.execute("SELECT job_fsmc_format()").fetchone() == (SCHEMA_FORMAT,)


def test_a_format_2_database_keeps_who_may_move_rows_and_drops_its_old_apply(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT2.read_text(encoding="utf-8"))
    reader = f"fsmc_reader_{uuid.uuid4().hex[:12]}"  # may read the rows, never moved them
    try:
        n = Names.of(old).sql
        with db.owner() as owner:  # the grants of that release's README; EXECUTE was PUBLIC's
            owner.execute(f"GRANT USAGE ON SCHEMA {db.schema} TO {db.app_role};"
                          f" GRANT SELECT, INSERT, UPDATE ON {n.table} TO {db.app_role};"
                          f" GRANT SELECT, INSERT ON {n.events_table} TO {db.app_role};"
                          f" GRANT SELECT ON {n.intervals} TO {db.app_role}".encode())  # fmt: skip
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (2,)
        with db.superuser(autocommit=True) as su:
            su.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(reader)))
            su.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {r}; GRANT SELECT ON {} TO {r}").format(
                sql.Identifier(db.schema), sql.SQL(n.table), r=sql.Identifier(reader)))  # fmt: skip
        with db.connect() as app:  # through format 2's _apply, which has no to_state
            rows = {s: db.row_at(app, s)[0] for s in ("queued", "running", "completed", "failed")}
        before = data(db, old)

        migrate_ok(db, migrate(old, new))

        with db.superuser(autocommit=True) as su:
            applies = su.execute("SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = 'job_apply'"
                                 " AND p.pronamespace = %s::regnamespace", (db.schema,)).fetchall()  # fmt: skip
            assert applies == [("job_apply(uuid,text,bigint,text,jsonb,text)",)]  # search_path: the schema
            may = "SELECT has_function_privilege(%s, %s, 'EXECUTE')"
            for function in ("job_apply(uuid,text,bigint,text,jsonb,text)", "job_claim(text,text,integer,text)",
                             "job_purge(interval,integer)", "job_reclaim(interval,text)"):  # fmt: skip
                assert su.execute(may, (db.app_role, function)).fetchone() == (True,), function
                assert su.execute(may, (reader, function)).fetchone() == (False,), function
            su.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(reader)))
        with built(pg_dsn, new) as fresh:
            got, want = catalog(db), catalog(fresh)
        for kind in CATALOG:  # owners and grants included: the writer's functions, EXECUTE the app's
            assert got.objects[kind] == want.objects[kind], kind
        after = data(db, new)
        assert after.events == before.events
        assert {r: row[:2] for r, row in after.rows.items()} == {r: row[:2] for r, row in before.rows.items()}
        with db.connect() as app:  # the application role moves rows as before, and with to_state
            assert app.execute(db.q("SELECT {purge}('1 microsecond', 100)")).fetchone() == (1,)  # the completed row
            app.commit()
            running = after.rows[rows["running"]][1]
            assert db.apply(app, rows["running"], "pause", running, actor="app") == running + 1
            assert db.apply(app, rows["running"], "resume", running + 1, actor="app", to_state="running") == running + 2
            named = app.execute(db.q("SELECT {apply}(%s, 'finish', %s, 'app', to_state => 'completed')"),
                                (rows["running"], running + 2)).fetchone()  # fmt: skip
            assert named == (running + 3,)
            claimed = app.execute(db.q("SELECT id FROM {claim}('claim', 'w', 100)")).fetchall()
            assert claimed == [(rows["queued"],)]
            app.commit()
        behaves_as_contract_4_2(migrated(db, new, (old, before.versions)))
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            if admin.execute("SELECT FROM pg_roles WHERE rolname = %s", (reader,)).fetchone() is not None:
                admin.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(reader)))
        db.drop()


def test_migrating_a_format_2_database_without_its_writer_role_refuses_saying_what_to_run(
    pg_dsn: str,
) -> None:
    # Format 3 gives the moving functions to the installation's writer role. An owner
    # that may not create roles gets, before anything changes, the role to create.
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT2.read_text(encoding="utf-8"))
    try:
        with db.superuser(autocommit=True) as su:
            su.execute(sql.SQL("ALTER ROLE {} NOCREATEROLE").format(sql.Identifier(db.role)))
        error = refused_changing_nothing(db, old, migrate(old, new))
        assert "does not exist, and " + db.role + " may not create roles; nothing was changed" in error, error
        role = error.split("fsmc: role ", 1)[1].split(" ", 1)[0]
        assert role.startswith(f"{db.schema}_job_writer_"), error
        assert f"CREATE ROLE {role} NOLOGIN; GRANT {role} TO {db.role};" in error, error
        with db.superuser(autocommit=True) as su:  # the administrator runs the hint
            su.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
            su.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(db.role)))
        migrate_ok(db, migrate(old, new))
        with db.superuser() as su:
            assert su.execute(f"SELECT {db.schema}.job_fsmc_writer()".encode()).fetchone() == (role,)
    finally:
        db.drop()


def migrates_to_a_fresh_build(pg_dsn: str, db: Scratch, old: Machine, new: Machine, gone: str) -> None:
    """Migrate `db` (built by an older format from `old`) to `new`: its catalog is then
    a fresh build's (domains, the CHECKs casting to them and the triggers included),
    nothing NOT VALID, the current format, `gone` (a query) answers NULL, every row
    and event is kept, a move works, and the schema behaves as contract 4.2 says."""
    with db.connect() as app:
        rows = {s: db.row_at(app, s)[0] for s in ("queued", "running", "completed")}
    before = data(db, old)

    migrate_ok(db, migrate(old, new))

    with built(pg_dsn, new) as fresh:
        got, want = catalog(db), catalog(fresh)
    for kind in CATALOG:
        assert got.objects[kind] == want.objects[kind], kind
    assert got.not_valid == frozenset()
    with db.owner() as owner:
        assert owner.execute("SELECT job_fsmc_format()").fetchone() == (SCHEMA_FORMAT,)
        assert owner.execute(gone.encode()).fetchone() == (None,)
    after = data(db, new)
    assert after.events == before.events
    assert {r: row[:2] for r, row in after.rows.items()} == {r: row[:2] for r, row in before.rows.items()}
    with db.connect() as app:
        running = after.rows[rows["running"]][1]
        assert db.apply(app, rows["running"], "pause", running, actor="app") == running + 1
        app.commit()
    behaves_as_contract_4_2(migrated(db, new, (old, before.versions)))


def test_a_format_3_database_gets_the_domains_and_loses_its_triples_function(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT3.read_text(encoding="utf-8"))
    try:
        with db.owner() as owner:
            owner.execute(db.grants())  # format 3's grants are today's
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (3,)
            assert owner.execute("SELECT to_regprocedure('job_transitions_51621e28(text, text, text)')"
                                 " IS NOT NULL").fetchone() == (True,)  # fmt: skip
        migrates_to_a_fresh_build(pg_dsn, db, old, new,
                                  "SELECT to_regprocedure('job_transitions_51621e28(text, text, text)')")  # fmt: skip
    finally:
        db.drop()


def test_a_format_4_database_gets_the_moves_domain_and_the_text_when_clauses(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT4.read_text(encoding="utf-8"))
    try:
        with db.owner() as owner:
            owner.execute(db.grants())
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (4,)
            assert owner.execute("SELECT to_regtype('job_transition_51621e28') IS NOT NULL").fetchone() == (True,)
            when = owner.execute("SELECT pg_get_triggerdef(oid) FROM pg_trigger"
                                 " WHERE tgrelid = 'job_events'::regclass AND tgname = 'job_check_event'")  # fmt: skip
            assert "::name" in str(when.fetchone())  # format 4's WHEN clause compares a name
        migrates_to_a_fresh_build(pg_dsn, db, old, new, "SELECT to_regtype('job_transition_51621e28')")
    finally:
        db.drop()


def test_a_format_5_database_takes_the_callers_pen_for_ids_and_times(pg_dsn: str) -> None:
    # Format 5's README granted the application whole tables: it could rewrite a row's
    # id, backdate entered_at, hold a lease with heartbeat_at = 'infinity'. The
    # migration leaves each role that moves rows exactly today's column grants, and the
    # heartbeat and the update guard to the writer.
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT5.read_text(encoding="utf-8"))
    try:
        n = Names.of(old).sql
        with db.owner() as owner:  # the grants of format 5's README
            owner.execute(f"GRANT USAGE ON SCHEMA {db.schema} TO {db.app_role};"
                          f" GRANT SELECT, INSERT, UPDATE ON {n.table} TO {db.app_role};"
                          f" GRANT SELECT, INSERT ON {n.events_table} TO {db.app_role};"
                          f" GRANT SELECT ON {n.intervals} TO {db.app_role};"
                          f" GRANT EXECUTE ON FUNCTION {n.apply}, {n.claim}, {n.reclaim}, {n.purge}"
                          f" TO {db.app_role}".encode())  # fmt: skip
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (5,)
        with db.connect() as app:
            app.execute(db.q("UPDATE {table} SET entered_at = '1970-01-01' WHERE false"))  # allowed, then
            app.rollback()
        migrates_to_a_fresh_build(pg_dsn, db, old, new, "SELECT to_regtype('no_such_type')")
        with db.connect() as app:
            for write in ("UPDATE {table} SET entered_at = '1970-01-01'", "UPDATE {table} SET id = id",
                          "UPDATE {table} SET heartbeat_at = 'infinity'",
                          "INSERT INTO {table} (created_at) VALUES ('-infinity')"):  # fmt: skip
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    app.execute(db.q(write))
                app.rollback()
    finally:
        db.drop()


def test_a_format_6_database_claims_whole_rows_and_keeps_who_may_claim(pg_dsn: str) -> None:
    # Format 6's claim returned (id, state_version), a result type CREATE OR REPLACE
    # cannot change: the migration drops it, makes today's, and the roles that could
    # claim still can, getting whole rows.
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT6.read_text(encoding="utf-8"))
    try:
        with db.owner() as owner:  # format 6's grants are today's
            owner.execute(db.grants())
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (6,)
            assert owner.execute("SELECT pg_get_function_result('job_claim'::regproc)").fetchone() == (
                "TABLE(id uuid, state_version bigint)",
            )
        with db.connect() as app:
            queued = db.new_row(app)
            app.commit()
        migrates_to_a_fresh_build(pg_dsn, db, old, new, "SELECT to_regtype('no_such_type')")
        with db.connect() as app:
            claimed = app.execute(db.q("SELECT id, state, state_version, claimed_by FROM {claim}('claim', 'w', 100)")).fetchall()
            assert (queued, "claimed", 1, "w") in claimed
            app.rollback()
    finally:
        db.drop()


def test_a_format_7_database_gets_the_writes_moment_for_its_times(pg_dsn: str) -> None:
    # Format 7 stamped every time with its transaction's start (now()), defaults too:
    # a row moved in a long transaction looked moved long before (issue 35, N2). The
    # migration sets the defaults to the write's moment and makes every function and
    # trigger again (the event log's own stamping trigger among them).
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT7.read_text(encoding="utf-8"))
    try:
        defaults = ("SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef AS d"
                    " JOIN pg_attribute AS a ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
                    " WHERE d.adrelid = 'job_events'::regclass AND a.attname = 'at'")  # fmt: skip
        with db.owner() as owner:  # format 7's grants are today's
            owner.execute(db.grants())
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (7,)
            assert owner.execute(defaults).fetchone() == ("now()",)
        migrates_to_a_fresh_build(pg_dsn, db, old, new, "SELECT to_regtype('no_such_type')")
        with db.owner() as owner:
            assert owner.execute(defaults).fetchone() == ("clock_timestamp()",)
        with db.connect() as app:
            row_id = db.new_row(app)
            app.commit()
            app.execute("SELECT pg_sleep(0.05)")
            started = db.clock(app)
            assert db.apply(app, row_id, "claim", 0, actor="w") == 1
            stamped = app.execute(db.q("SELECT entered_at, claimed_at FROM {table} WHERE id = %s"), (row_id,)).fetchone()
            assert stamped is not None and started <= stamped[0] == stamped[1]
            app.rollback()
    finally:
        db.drop()
