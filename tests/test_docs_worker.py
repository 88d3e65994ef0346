"""The worker's guide and the TypeScript page, run as written against PostgreSQL: the
synchronous worker, the asyncio worker and its supervisor, `create`, the wake-up
loop, and the Node worker. Each block imports the generated module by the name the
page uses (`fsm_job`, `fsm_queue`), built from the example spec with
`postgres.schema` set to the scratch schema, so that the calls the page writes without
`schema=` reach the installation (the page says `schema=` defaults to the spec's
`postgres.schema`). The application connects as the application role, with the
grants of the PostgreSQL page."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests import docs
from tests.pg_scratch import Scratch, machine_of


def app_dsn(db: Scratch) -> str:
    return make_conninfo(db.dsn, user=db.app_role)


@pytest.fixture
def queue_db(pg_dsn: str) -> Iterator[Scratch]:
    scratch = Scratch.create(pg_dsn, machine_of("queue"))
    yield scratch
    scratch.drop()


def test_the_synchronous_worker_runs_as_written(db: Scratch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = docs.example_module("job", docs.example_build("job", db.schema, tmp_path), monkeypatch)
    with db.connect() as conn:
        (waiting,) = conn.execute("INSERT INTO jobs DEFAULT VALUES RETURNING id").fetchone()  # type: ignore[misc]
        conn.commit()
        names: dict[str, Any] = {"conn": conn}
        exec(compile(docs.block("worker-sync"), "docs/worker.md", "exec"), names)  # noqa: S102
        conn.commit()
        assert names["row"].id == waiting and names["version"] == 2
        got = job.get(conn, waiting)
        assert got is not None and (got.state, got.version, got.claimed_by) == (job.State.RUNNING, 2, "worker-1")
        # With nothing waiting, the block's first line fails: it claims one row, and says so.
        with pytest.raises(ValueError, match="not enough values"):
            exec(compile(docs.block("worker-sync"), "docs/worker.md", "exec"), {"conn": conn})  # noqa: S102


def test_the_asyncio_worker_and_supervisor_run_as_written(db: Scratch, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    job = docs.example_module("job", docs.example_build("job", db.schema, tmp_path), monkeypatch)
    with db.connect() as conn:
        (fresh,) = conn.execute("INSERT INTO jobs DEFAULT VALUES RETURNING id").fetchone()  # type: ignore[misc]
        conn.commit()
        stale, _ = db.row_at(conn, "running")
        old, _ = db.row_at(conn, "completed")
    db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (stale,))
    db.as_owner("UPDATE {table} SET entered_at = now() - interval '31 days' WHERE id = %s", (old,))
    names: dict[str, Any] = {}
    exec(compile(docs.block("worker-asyncio"), "docs/worker.md", "exec"), names)  # noqa: S102

    def done(conn: Any) -> bool:
        rows = {r.id: r.state for r in (job.get(conn, i) for i in (fresh, stale, old)) if r is not None}
        return rows == {fresh: job.State.COMPLETED, stale: job.State.COMPLETED}

    async def run() -> None:
        tasks = [asyncio.create_task(names["worker"](app_dsn(db), "worker-1")),
                 asyncio.create_task(names["supervisor"](app_dsn(db)))]  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            with db.connect(autocommit=True) as conn:
                while not done(conn):
                    assert time.monotonic() < deadline, "the worker and the supervisor did not finish"
                    for task in tasks:
                        if task.done():
                            task.result()  # a worker that died says why
                    await asyncio.sleep(0.1)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    with db.connect() as conn:  # the stale lease was reclaimed, then claimed again and finished
        moves = conn.execute("SELECT event, actor FROM job_events WHERE job_id = %s ORDER BY version",
                             (stale,)).fetchall()  # fmt: skip
        assert ("reclaim", "supervisor") in moves and moves[-1] == ("finish", "worker-1")


def test_create_runs_as_written(queue_db: Scratch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = docs.example_module("queue", docs.example_build("queue", queue_db.schema, tmp_path), monkeypatch)
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    with queue_db.connect() as conn:
        names: dict[str, Any] = {"queue": queue, "conn": conn, "batch": [{"n": 1}, {"n": 2}], "tomorrow": tomorrow}
        exec(compile(docs.block("worker-create"), "docs/worker.md", "exec"), names)  # noqa: S102
        conn.commit()
        made = names["job"]
        assert (made.state, made.args, made.queue, made.priority) == (queue.State.AVAILABLE, {"to": "a@example.com"}, "emails", 5)
        assert [j.args for j in names["jobs"]] == [{"n": 1}, {"n": 2}]
        (scheduled,) = conn.execute("SELECT state, due_at, fetch_cap FROM queue_jobs WHERE state = 'scheduled'").fetchall()
        assert scheduled == ("scheduled", tomorrow, 3)


def test_the_wake_up_loop_runs_as_written(queue_db: Scratch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = docs.example_module("queue", docs.example_build("queue", queue_db.schema, tmp_path), monkeypatch)
    loop = docs.block("worker-wait")
    # The page's loop runs forever; here it runs four rounds: two claims, a wait that a
    # job inserted meanwhile ends, and the claim of that job.
    assert loop.count("while True:") == 1
    bounded = loop.replace("while True:", "for _ in range(4):")
    with queue_db.connect() as app:
        for _ in range(2):
            queue.create(app)
        app.commit()

    def insert_later() -> None:
        time.sleep(1.0)
        with queue_db.connect() as other:
            queue.create(other, args={"late": True})
            other.commit()

    with queue_db.connect(autocommit=True) as conn:
        later = threading.Thread(target=insert_later)
        started = time.monotonic()
        later.start()
        try:
            exec(compile(bounded, "docs/worker.md", "exec"), {"conn": conn})  # noqa: S102
        finally:
            later.join()
        took = time.monotonic() - started
        running = conn.execute("SELECT args, claimed_by FROM queue_jobs WHERE state = 'running' ORDER BY id").fetchall()
    assert running == [(None, "worker-1"), (None, "worker-1"), ({"late": True}, "worker-1")]
    assert took < 4.5, f"the wait took its whole timeout ({took:.1f} s): no wake-up"


@pytest.mark.slow
def test_the_node_worker_runs_as_written(db: Scratch, tmp_path: Path) -> None:
    from tests.typescript_tools import compile_folders

    folder = docs.example_build("job", db.schema, tmp_path / "build", typescript=True)
    app = tmp_path / "app"
    (app / "generated" / "job").mkdir(parents=True)
    (app / "generated" / "job" / "fsm_job.ts").write_bytes((folder / "fsm_job.ts").read_bytes())
    (app / "worker.ts").write_text(docs.block("typescript-worker"), encoding="utf-8")
    compiled = compile_folders({"app": app}, tmp_path / "ts")
    assert compiled.code == 0, compiled.output
    with db.connect() as conn:
        (waiting,) = conn.execute("INSERT INTO jobs DEFAULT VALUES RETURNING id").fetchone()  # type: ignore[misc]
        conn.commit()
    params = conninfo_to_dict(db.dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PGUSER=db.app_role, PGHOST=str(params.get("host", "127.0.0.1")),
               PGPORT=str(params.get("port", 5432)), PGDATABASE=str(params.get("dbname", "postgres")))  # fmt: skip
    import subprocess

    ran = subprocess.run(["node", str(compiled.root / "out" / "app" / "worker.js")], env=env,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    with db.connect() as conn:
        row = conn.execute("SELECT state, state_version, claimed_by, heartbeat_at IS NOT NULL FROM jobs"
                           " WHERE id = %s", (waiting,)).fetchone()  # fmt: skip
    assert row == ("running", 2, "node-1", True)
