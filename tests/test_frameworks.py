"""The generated module and `fsmc migrate --no-transaction` inside the frameworks users
run them in, installed for real (issue 11): SQLAlchemy 2 (a Connection and a
Session), Django (psycopg 3 backend: its `connection`, its wrapped errors), Alembic
(a migration running the script, rolled back). Each test is the README's recipe.

Applications connect as the application role (the README's grants); migrations as
the schema's owner."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from fsmc.migrate import migrate
from tests.conftest import ROOT
from tests.pg_scratch import Scratch, machine_from_text

CASES = ROOT / "tests" / "migrate_cases"


def sqlalchemy_url(db: Scratch, role: str) -> Any:
    from sqlalchemy.engine import URL

    params = conninfo_to_dict(db.dsn)
    return URL.create("postgresql+psycopg", username=role, host=str(params.get("host", "127.0.0.1")),
                      port=int(params.get("port", 5432)), database=str(params.get("dbname", "postgres")))  # fmt: skip


def test_sqlalchemy_connection_and_session(db: Scratch, job: ModuleType) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    engine = create_engine(sqlalchemy_url(db, db.app_role),
                           connect_args={"options": f"-c search_path={db.schema}"})  # fmt: skip
    try:
        # A Connection: hand the module its DB-API connection, `conn.connection`.
        with engine.connect() as conn:
            row_id = conn.execute(text("INSERT INTO jobs DEFAULT VALUES RETURNING id")).scalar_one()
            (claimed,) = job.claim(conn.connection, "claim", actor="sa-worker", schema=db.schema)
            assert claimed == job.Job(row_id, job.State.CLAIMED, 1)
            assert job.transition(conn.connection, row_id, "start", expected_version=1, actor="sa", schema=db.schema) == 2
            conn.commit()
            with pytest.raises(job.IllegalTransition):
                job.transition(conn.connection, row_id, "claim", expected_version=2, actor="sa", schema=db.schema)
            conn.rollback()
        # A Session: the same, through `session.connection().connection`.
        with Session(engine) as session:
            raw = session.connection().connection
            assert job.transition(raw, row_id, "finish", expected_version=2, actor="sa", schema=db.schema) == 3
            session.commit()
            assert job.get(session.connection().connection, row_id, schema=db.schema) == job.Job(row_id, job.State.COMPLETED, 3)
            with pytest.raises(job.UnknownRow):
                job.transition(session.connection().connection, __import__("uuid").uuid4(), "claim",
                               expected_version=0, actor="sa", schema=db.schema)  # fmt: skip
            session.rollback()
        with engine.connect() as conn:
            assert db.replay_problems(conn.connection.driver_connection) == []  # type: ignore[arg-type]
    finally:
        engine.dispose()


def test_django_connection_and_its_wrapped_errors(db: Scratch, job: ModuleType) -> None:
    import django
    from django.conf import settings

    params = conninfo_to_dict(db.dsn)
    if settings.configured:
        pytest.skip("Django is configured once per process")
    settings.configure(DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": params.get("dbname", "postgres"),
        "USER": db.app_role, "HOST": params.get("host", "127.0.0.1"), "PORT": params.get("port", 5432),
        "OPTIONS": {"options": f"-c search_path={db.schema}"},
    }})  # fmt: skip
    django.setup()
    from django.db import IntegrityError, connection, transaction

    try:
        assert connection.vendor == "postgresql" and connection.Database.__name__ == "psycopg"
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO jobs DEFAULT VALUES RETURNING id")
                (row_id,) = cursor.fetchone()
            assert job.transition(connection, row_id, "claim", expected_version=0, actor="dj", schema=db.schema) == 1
        assert job.get(connection, row_id, schema=db.schema) == job.Job(row_id, job.State.CLAIMED, 1)
        # Django re-raises the driver's error as its own IntegrityError: still ours.
        with pytest.raises(job.IllegalTransition) as caught, transaction.atomic():
            job.transition(connection, row_id, "finish", expected_version=1, actor="dj", schema=db.schema)
        assert isinstance(caught.value.__cause__, IntegrityError)
        assert caught.value.state is job.State.CLAIMED
        with pytest.raises(job.UnknownRow), transaction.atomic():
            job.transition(connection, __import__("uuid").uuid4(), "claim", expected_version=0, actor="dj", schema=db.schema)
        with transaction.atomic():
            assert [r.id for r in job.claim(connection, "claim", actor="dj", schema=db.schema)] == []
    finally:
        connection.close()


def case(name: str, which: str) -> Any:
    path = CASES / name / f"{which}.yaml"
    return machine_from_text(path.read_text(encoding="utf-8"), f"tests/migrate_cases/{name}/{which}.yaml")


def schema_state(conn: psycopg.Connection[Any], db: Scratch) -> tuple[Any, ...]:
    """What a migration may change, and the data it must keep."""
    return (
        conn.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                     " WHERE connamespace = %s::regnamespace ORDER BY 1", (db.schema,)).fetchall(),
        conn.execute("SELECT p.proname, md5(p.prosrc) FROM pg_proc AS p"
                     " WHERE p.pronamespace = %s::regnamespace ORDER BY 1", (db.schema,)).fetchall(),
        conn.execute("SELECT job_fsmc_digest()").fetchone(),
        conn.execute("SELECT id, state, state_version FROM jobs ORDER BY id").fetchall(),
        conn.execute("SELECT * FROM job_events ORDER BY job_id, version").fetchall(),
    )  # fmt: skip


def test_no_transaction_script_has_no_begin_or_commit_and_rolls_back_whole(pg_dsn: str) -> None:
    old, new = case("added_state", "old"), case("added_state", "new")
    script = migrate(old, new, transaction=False)
    assert "\nBEGIN;" not in script and "\nCOMMIT;" not in script
    assert "SET LOCAL lock_timeout" in script
    assert migrate(old, new, transaction=True).count("\nBEGIN;") == 1
    db = Scratch.create(pg_dsn, old)
    try:
        with db.connect() as app:
            db.row_at(app, "running")
        with db.owner() as owner:
            before = schema_state(owner, db)
            owner.execute(script.encode())
            assert owner.execute("SELECT job_fsmc_digest()").fetchone() != before[2]
            owner.rollback()
            assert schema_state(owner, db) == before
            # A refusal inside the framework's transaction aborts it whole.
            wrong = migrate(new, old, transaction=False)
            with pytest.raises(psycopg.Error) as caught:
                owner.execute(wrong.encode())
            assert caught.value.sqlstate == "55000"
            owner.rollback()
            assert schema_state(owner, db) == before
    finally:
        db.drop()


def test_alembic_runs_the_script_in_its_migration_and_rolls_back(pg_dsn: str) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import create_engine, text

    old, new = case("added_state", "old"), case("added_state", "new")
    script = migrate(old, new, transaction=False)
    db = Scratch.create(pg_dsn, old)
    engine = create_engine(sqlalchemy_url(db, db.role),
                           connect_args={"options": f"-c search_path={db.schema}"})  # fmt: skip
    try:
        with db.connect() as app:
            db.row_at(app, "claimed")
            db.row_at(app, "completed")
        with db.owner() as owner:
            before = schema_state(owner, db)
        with engine.connect() as conn:
            transaction = conn.begin()
            # The migration's upgrade(): what an Alembic revision file holds.
            op = Operations(MigrationContext.configure(conn))
            op.execute(text(script))
            digest = conn.execute(text("SELECT job_fsmc_digest()")).scalar_one()
            assert digest != before[2][0]
            transaction.rollback()
        with db.owner() as owner:
            assert schema_state(owner, db) == before
    finally:
        engine.dispose()
        db.drop()


def test_the_cli_prints_the_no_transaction_script() -> None:
    import subprocess
    import sys

    paths = [str(CASES / "added_state" / f"{w}.yaml") for w in ("old", "new")]
    ran = subprocess.run([sys.executable, "-m", "fsmc", "migrate", *paths, "--no-transaction"],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "SET LOCAL lock_timeout" in ran.stdout and "\nBEGIN;" not in ran.stdout
    assert "\nCOMMIT;" not in ran.stdout
