"""A database an older fsmc built (schema format 1: no created_at/entered_at, claim,
purge, intervals; no `<machine>_fsmc_format()`) is migrated, not taken for current
(contract 6, issue 11).

tests/format_cases/added_state_old.format1.sql is what fsmc built for
tests/migrate_cases/added_state/old.yaml before format 2 (the SQL template of that
release, rendered for that spec)."""

from __future__ import annotations

from typing import Any

import psycopg

from fsmc.migrate import migrate
from fsmc.targets.sql import SCHEMA_FORMAT, Names
from tests.conftest import ROOT
from tests.pg_scratch import Scratch
from tests.test_migrate import (
    CATALOG,
    behaves_as_contract_4_2,
    built,
    catalog,
    data,
    migrate_ok,
    migrated,
    spec,
)

FORMAT1 = ROOT / "tests" / "format_cases" / "added_state_old.format1.sql"


def without_column_order(objects: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """Added columns come last; a fresh build has them in place. Everything else equal."""
    out = dict(objects)
    out["columns"] = sorted(((r[0],) + r[2:] for r in objects["columns"]), key=repr)
    return out


def test_a_format_1_database_is_brought_to_the_current_format_by_the_migration(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    db = Scratch.create(pg_dsn, old, FORMAT1.read_text(encoding="utf-8"))
    try:
        n = Names.of(old)
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
            owner.execute(f"GRANT SELECT ON {Names.of(new).intervals} TO {db.app_role}".encode())
            owner.commit()
            assert owner.execute("SELECT job_fsmc_format()").fetchone() == (SCHEMA_FORMAT,)
        with db.connect() as app:
            entered = dict(app.execute(db.q("SELECT id, entered_at FROM {table}")).fetchall())
            for row_id in moved:
                if row_id in last:
                    assert entered[row_id] == last[row_id]
            stays = app.execute(db.q("SELECT count(*) FROM {intervals}")).fetchone()
            assert stays == (len(before.events) + len(before.rows),)
            claimed = app.execute(db.q("SELECT * FROM {claim}('claim', 'w', 100)")).fetchall()
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
