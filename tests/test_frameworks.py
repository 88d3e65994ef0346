"""The generated module and `fsmc migrate --no-transaction` inside the frameworks users
run them in, installed for real (issue 11): SQLAlchemy 2 (a Connection and a
Session), Django (psycopg 3 backend: its `connection`, its wrapped errors), Alembic
(a migration running the script, rolled back). Each recipe of the worker's guide
(docs/worker.md, "In SQLAlchemy, Django and Alembic") runs here as written, beside
the tests of what it relies on.

Applications connect as the application role (the grants of docs/postgres.md);
migrations as the schema's owner."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from fsmc.migrate import migrate
from tests import docs
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


def test_the_sqlalchemy_recipe_runs_as_written(db: Scratch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    job = docs.example_module("job", docs.example_build("job", db.schema, tmp_path), monkeypatch)
    with db.connect() as conn:
        (row_id,) = conn.execute("INSERT INTO jobs DEFAULT VALUES RETURNING id").fetchone()  # type: ignore[misc]
        conn.commit()
    engine = create_engine(sqlalchemy_url(db, db.app_role))
    try:
        names: dict[str, Any] = {"engine": engine, "job": job, "Session": Session}
        exec(compile(docs.block("frameworks-sqlalchemy"), "docs/worker.md", "exec"), names)  # noqa: S102
    finally:
        engine.dispose()
    with db.connect() as conn:
        assert job.get(conn, row_id) == job.Job(row_id, job.State.COMPLETED, 3)


def test_django_connection_and_its_wrapped_errors(db: Scratch, job: ModuleType, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
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
        # The recipe of docs/worker.md, as written, with a module whose SCHEMA is the scratch's.
        recipe = docs.example_module("job", docs.example_build("job", db.schema, tmp_path), monkeypatch)
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO jobs DEFAULT VALUES RETURNING id")
            (job_id,) = cursor.fetchone()
        exec(compile(docs.block("frameworks-django"), "docs/worker.md", "exec"),  # noqa: S102
             {"job": recipe, "job_id": job_id})  # fmt: skip
        assert recipe.get(connection, job_id) == recipe.Job(job_id, recipe.State.CLAIMED, 1)
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


def test_alembic_runs_the_script_in_its_migration_and_rolls_back(pg_dsn: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    import sqlalchemy as sa
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import create_engine, text

    old, new = case("added_state", "old"), case("added_state", "new")
    # The page's command, in a project whose v1 tag holds OLD and whose tree holds NEW.
    project = tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    (project / "migrations").mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    (project / "specs" / "job.yaml").write_bytes((CASES / "added_state" / "old.yaml").read_bytes())
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], cwd=project, check=True)
    subprocess.run([*git, "tag", "v1"], cwd=project, check=True)
    (project / "specs" / "job.yaml").write_bytes((CASES / "added_state" / "new.yaml").read_bytes())
    (command,) = docs.block("frameworks-alembic-script").splitlines()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run(["bash", "-c", command], cwd=project, env=env, capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    script = (project / "migrations" / "job_v2.sql").read_text(encoding="utf-8")
    # the script for OLD and NEW, its header naming them as the command did
    assert script.split("\n", 1)[1] == migrate(old, new, transaction=False).split("\n", 1)[1]
    revision: dict[str, Any] = {"sa": sa, "Path": Path, "__file__": str(project / "migrations" / "v2_job.py")}
    exec(compile(docs.block("frameworks-alembic-upgrade"), "docs/worker.md", "exec"), revision)  # noqa: S102
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
            revision["op"] = Operations(MigrationContext.configure(conn))
            revision["upgrade"]()
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
