"""Running the schema in production: what the worker's guide promises operators
(docs/worker.md, "Running it in production").

- A worker idle in a transaction holds its row's lock, so `_reclaim` skips the row
  until the transaction ends; `idle_in_transaction_session_timeout` ends it, and the
  next reclaim takes the row.
- A data-only restore into a fresh schema built from the same `.sql`, by the
  guide's recipe, run as written (pg_dump --data-only, restored by the owner with the schema's
  user triggers switched off inside the restore's one transaction), gives back every
  row and event: the log replays, ids continue, and the rules hold again afterwards.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests import docs
from tests.harness import refused, sqlstate_of
from tests.pg_scratch import LEASE_SPEC_NAMES, SPEC_NAMES, Scratch, machine_of


def need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if os.environ.get("FSMC_REQUIRE_PG"):
            pytest.fail(f"FSMC_REQUIRE_PG is set but {tool} is not installed")
        pytest.skip(f"{tool} is not installed")
    return found


@pytest.fixture(params=LEASE_SPEC_NAMES)
def lease_db(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Scratch]:
    scratch = Scratch.create(pg_dsn, machine_of(request.param))
    yield scratch
    scratch.drop()


def test_a_worker_idle_in_a_transaction_keeps_its_row_until_the_timeout_ends_it(lease_db: Scratch) -> None:
    db = lease_db
    assert db.machine.lease is not None
    held = str(db.machine.lease.states[0])
    with db.connect() as app:
        row_id, version = db.row_at(app, held)
    worker = db.connect()
    # The supervisor's first reclaim must come before the timeout ends the worker's
    # session. Its connection is open beforehand, so that is two statements later:
    # milliseconds, against 2 s (500 ms was close to what a loaded machine can stall).
    worker.execute("SET idle_in_transaction_session_timeout = '2s'")
    worker.commit()
    with db.connect(autocommit=True) as supervisor:
        reclaim = db.q("SELECT {reclaim}('1 microsecond', 'supervisor')")
        # The worker heartbeats, then sits in its open transaction holding the row's lock.
        assert worker.execute(db.q("SELECT {heartbeat}(%s, %s)"), (row_id, version)).fetchone() == (True,)
        assert (row_id,) not in supervisor.execute(reclaim).fetchall()  # skipped, not waited on
        deadline = time.monotonic() + 30
        while (row_id,) not in supervisor.execute(reclaim).fetchall():
            assert time.monotonic() < deadline, "the idle transaction was never ended"
            time.sleep(0.2)
        assert db.row(supervisor, row_id) == (db.machine.single[held, str(db.machine.lease.reclaim)],
                                              version + 1)  # fmt: skip
    with pytest.raises(psycopg.Error) as raised:  # the server ended the idle session
        worker.execute("SELECT 1")
    assert raised.value.sqlstate == "25P03" or worker.closed, raised.value


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_a_data_only_restore_into_a_fresh_schema_by_the_guides_recipe(pg_dsn: str, name: str,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    need("pg_dump"), need("psql")
    db = Scratch.create(pg_dsn, machine_of(name))
    try:
        m, n = db.machine, db.names
        with db.connect() as app:
            rows = [db.row_at(app, s)[0] for s in m.state_names if s != m.initial] + [db.new_row(app)]
            app.commit()
            before_rows = app.execute(db.q("SELECT * FROM {table} ORDER BY id")).fetchall()
            before_events = app.execute(db.q("SELECT * FROM {events} ORDER BY 1, 2")).fetchall()
        owner = make_conninfo(db.dsn, user=db.role)
        table, events = f"{db.schema}.{n.table}", f"{db.schema}.{n.events_table}"
        # The recipe, with this installation's tables and the owner's connection string
        # for the page's `app.jobs`, `app.job_events`, OLD_DATABASE and NEW_DATABASE.
        recipe = docs.block("operations-restore")
        for shown, real in (("app.job_events", events), ("app.jobs", table),
                            ("OLD_DATABASE", shlex.quote(owner)), ("NEW_DATABASE", shlex.quote(owner))):  # fmt: skip
            assert shown in recipe, shown
            recipe = recipe.replace(shown, real)
        dump_command, restore_command = recipe.split("\npsql ", 1)
        assert dump_command.startswith("pg_dump --data-only ")
        done = subprocess.run(["bash", "-c", dump_command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        # A fresh schema of the same name, from the same .sql (as after a disaster).
        with psycopg.connect(db.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {0} CASCADE; CREATE SCHEMA {0} AUTHORIZATION {1}").format(
                sql.Identifier(db.schema), sql.Identifier(db.role)))  # fmt: skip
        with db.owner(autocommit=True) as conn:
            conn.execute(db.sql_text.encode())
            conn.execute(db.grants())
        done = subprocess.run(["bash", "-c", "psql " + restore_command], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        with db.connect() as app:
            assert app.execute(db.q("SELECT * FROM {table} ORDER BY id")).fetchall() == before_rows
            assert app.execute(db.q("SELECT * FROM {events} ORDER BY 1, 2")).fetchall() == before_events
            assert db.replay_problems(app) == []
            # New rows get new ids, the machine moves on, and the guards are back.
            fresh = db.new_row(app)
            assert fresh not in rows
            source, event, target = m.edges[0]
            row_id, version = db.row_at(app, source)
            assert db.apply(app, row_id, event, version) == version + 1
            app.commit()
            terminal = next(s for s in m.state_names if s in m.terminal_names)
            error = refused(app, db.q("UPDATE {table} SET state = %s, state_version = state_version + 1"
                                      " WHERE id = %s"), (terminal, fresh))  # fmt: skip
            assert sqlstate_of(error) in ("23F04", "23514"), error
            assert target
    finally:
        db.drop()


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_under_repeatable_read_and_serializable_a_lost_race_raises_40001(pg_dsn: str, level: str) -> None:
    db = Scratch.create(pg_dsn, machine_of("job"))
    try:
        source, event, target = db.machine.edges[0]
        with db.connect() as winner, db.connect() as loser:
            row_id, version = db.row_at(winner, source)
            loser.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            loser.execute("SELECT 1")  # the loser's snapshot is taken now
            assert db.apply(winner, row_id, event, version, actor="winner") == version + 1
            winner.commit()
            with pytest.raises(psycopg.errors.SerializationFailure) as raised:
                db.apply(loser, row_id, event, version, actor="loser")
            loser.rollback()
            assert raised.value.sqlstate == "40001"
            # Retried, the transaction sees the winner's move and learns it lost.
            loser.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            assert db.apply(loser, row_id, event, version, actor="loser") is None
            loser.rollback()
            assert db.row(winner, row_id) == (target, version + 1)
    finally:
        db.drop()
