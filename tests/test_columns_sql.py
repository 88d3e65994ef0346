"""What a job carries (issue 24), in the database and through the generated module:
declared columns (`postgres: {columns: ...}`), `create` and `create_many`, whole rows
from `claim` (the lease and time columns included), and moves without a version.

Every test plays the application as `Scratch.connect()` does (the grants of docs/postgres.md
only), on specs/queue.yaml, whose jobs carry `args`, `kind`, `queue` and `priority`.
"""

from __future__ import annotations

import decimal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from fsmc.columns import CONVERTS, TYPES
from fsmc.model import Machine
from fsmc.pipeline import check
from fsmc.source import Source
from fsmc.targets import generate
from tests.harness import explained, refused, run_pytest, sqlstate_of
from tests.pg_scratch import Scratch, machine_of, module_of


@pytest.fixture(scope="module")
def queue(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Scratch, ModuleType]]:
    machine = machine_of("queue")
    scratch = Scratch.create(pg_dsn, machine)
    yield scratch, module_of(machine, tmp_path_factory.mktemp("queue"))
    scratch.drop()


class Counting:
    """A connection whose cursors count the statements they run."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn, self.statements = conn, 0

    def cursor(self) -> Any:
        real, outer = self.conn.cursor(), self

        class Cursor:
            def execute(self, query: Any, params: Any = None, /) -> object:
                outer.statements += 1
                return real.execute(query, params)

            def fetchone(self) -> Any:
                return real.fetchone()

            def fetchall(self) -> Any:
                return real.fetchall()

            def close(self) -> None:
                real.close()

        return Cursor()


def test_create_gives_each_row_its_data_and_the_columns_defaults(queue: tuple[Scratch, ModuleType]) -> None:
    db, fsm = queue
    with db.connect() as app:
        one = fsm.create(app, schema=db.schema, args={"to": "a@example.com", "n": [1, 2]}, kind="email")
        assert (one.state, one.version, one.args, one.kind, one.queue, one.priority) == (
            fsm.State.AVAILABLE, 0, {"to": "a@example.com", "n": [1, 2]}, "email", "default", 0)  # fmt: skip
        assert one.created_at is not None and one.entered_at == one.created_at
        assert fsm.get(app, one.id, schema=db.schema) == one
        # Many in one statement a set of keys, returned in the order given.
        counted = Counting(app)
        rows = [{"priority": n, "queue": "bulk"} for n in range(500)]
        rows.insert(250, {"state": "scheduled", "due_at": one.created_at, "fetch_cap": 3})
        made = fsm.create_many(counted, rows, schema=db.schema)
        assert counted.statements == 2
        assert [m.priority for m in made[:250]] == list(range(250))
        assert (made[250].state, made[250].fetch_cap, made[250].queue) == (fsm.State.SCHEDULED, 3, "default")
        assert len({m.id for m in made}) == 501
        # What create() refuses before the database sees it.
        with pytest.raises(ValueError, match="born in available, scheduled, not running"):
            fsm.create(app, schema=db.schema, state="running")
        with pytest.raises(TypeError, match="takes no claimed_by"):
            fsm.create(app, schema=db.schema, claimed_by="me")  # type: ignore[call-arg]
        app.rollback()


def test_the_application_writes_its_data_never_fsmc_columns(queue: tuple[Scratch, ModuleType]) -> None:
    # Data is the application's to change at will (no event, no guard, no check at
    # commit); the columns fsmc owns stay the database's.
    db, fsm = queue
    with db.connect() as app:
        row = fsm.create(app, schema=db.schema, kind="report")
        app.commit()
        app.execute(db.q("UPDATE {table} SET priority = 9, args = '[1]', queue = 'q2' WHERE id = %s"), (row.id,))
        app.commit()
        got = fsm.get(app, row.id, schema=db.schema)
        assert (got.priority, got.args, got.queue, got.version) == (9, [1], "q2", 0)
        for write in ("UPDATE {table} SET created_at = now() WHERE id = %s", "UPDATE {table} SET entered_at = now() WHERE id = %s"):
            assert sqlstate_of(refused(app, db.q(write), (row.id,))) == "42501"


def test_claim_returns_whole_rows_in_one_round_trip(queue: tuple[Scratch, ModuleType]) -> None:
    db, fsm = queue
    with db.connect() as app:
        made = fsm.create(app, schema=db.schema, args={"id": 7}, kind="resize", priority=3)
        app.commit()
        counted = Counting(app)
        claimed = [c for c in fsm.claim(counted, "fetch", actor="worker-1", limit=1000, schema=db.schema) if c.id == made.id]
        assert counted.statements == 1
        (job,) = claimed
        assert (job.state, job.version, job.args, job.kind, job.priority, job.fetch_count) == (
            fsm.State.RUNNING, 1, {"id": 7}, "resize", 3, 1)  # fmt: skip
        assert job.claimed_by == "worker-1" and job.claimed_at == job.heartbeat_at == job.entered_at
        assert job.created_at == made.created_at and job.entered_at is not None and job.entered_at >= made.created_at
        assert fsm.get(app, job.id, schema=db.schema) == job
        # What apply() makes carries the data; what only the database stamps is None.
        done = job.apply("complete")
        assert (done.args, done.kind) == (job.args, job.kind)
        assert (done.created_at, done.entered_at, done.claimed_by, done.heartbeat_at) == (None, None, None, None)
        app.rollback()


def test_a_move_without_a_version_fires_on_the_row_as_it_is(queue: tuple[Scratch, ModuleType]) -> None:
    db, fsm = queue
    with db.connect() as app:
        row = fsm.create(app, schema=db.schema)
        app.commit()
        assert fsm.transition(app, row.id, "cancel", expected_version=None, actor="operator", schema=db.schema) == 1
        with pytest.raises(fsm.IllegalTransition):  # cancelled: cancel no longer applies
            fsm.transition(app, row.id, "cancel", expected_version=None, actor="operator", schema=db.schema)
        app.rollback()
        with pytest.raises(fsm.UnknownRow):
            fsm.transition(app, -1, "cancel", expected_version=None, actor="operator", schema=db.schema)


@pytest.mark.parametrize("worker_commits", [True, False])
def test_a_cancel_without_a_version_races_a_worker(queue: tuple[Scratch, ModuleType], worker_commits: bool) -> None:
    # The operator's cancel waits for the worker's transaction on the row, then judges
    # from what it left: after the worker's fetch commits the job runs (cancel is
    # refused); after a rollback the cancel wins. One wins, both logged, nothing lost.
    db, fsm = queue
    with db.connect() as setup:
        row = fsm.create(setup, schema=db.schema, queue=f"race-{uuid.uuid4().hex[:8]}")
        setup.commit()
    outcome: list[object] = []
    with db.connect() as worker, db.connect() as operator:
        worker.execute(db.q("SELECT {apply}(%s, 'fetch', 0, 'worker', NULL, NULL)"), (row.id,))

        def cancel() -> None:
            try:
                outcome.append(fsm.transition(operator, row.id, "cancel", expected_version=None, actor="op", schema=db.schema))
                operator.commit()
            except fsm.IllegalTransition as error:
                operator.rollback()
                outcome.append(error)

        racer = threading.Thread(target=cancel)
        racer.start()
        waited = worker.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = %s", (operator.info.backend_pid,))  # fmt: skip
        for _ in range(200):
            if waited.fetchone() == (1,):
                break
            waited = worker.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = %s", (operator.info.backend_pid,))  # fmt: skip
            threading.Event().wait(0.01)
        else:
            pytest.fail("the operator's cancel never waited for the worker's row lock")
        worker.commit() if worker_commits else worker.rollback()
        racer.join(10)
    with db.connect() as app:
        log = app.execute(db.q("SELECT version, event, actor FROM {events} WHERE {id_col} = %s ORDER BY version"),
                          (row.id,)).fetchall()  # fmt: skip
        state = fsm.get(app, row.id, schema=db.schema).state
    if worker_commits:
        assert isinstance(outcome[0], fsm.IllegalTransition) and outcome[0].state == fsm.State.RUNNING
        assert (state, log) == (fsm.State.RUNNING, [(1, "fetch", "worker")])
    else:
        assert outcome == [1]
        assert (state, log) == (fsm.State.CANCELLED, [(1, "cancel", "op")])


# specs/job.yaml with a column of each type a spec may give one.
EVERY_TYPE = (Path(__file__).parent.parent / "specs" / "job.yaml").read_text(encoding="utf-8") + r"""  columns:
    born: date
    parent: uuid
    blob: bytea
    weight: {type: numeric, default: 1.5}
    ratio: {type: double precision, default: 0.25}
    urgent: {type: boolean, default: false}
    run_after: timestamptz
    options: {type: jsonb, default: {retries: [1, 2]}}
    note: {type: text, default: "note é\n\t'\\\e[31m\u202e\U0001F600\x7f\r"}
    tags: {type: jsonb, default: {"a\nb": ["\e", "'"]}}
    rank: {type: bigint, default: 7, nullable: true}
    size: integer
    level: {type: smallint, default: -8}
"""


def every_type() -> Machine:
    assert "\npostgres:" in EVERY_TYPE
    result = check(Source("job.yaml", "job.yaml", EVERY_TYPE.encode()))
    assert result.machine is not None and not result.diagnostics, result.diagnostics
    assert {c.type for c in result.machine.postgres.columns} == set(TYPES)
    return result.machine


def test_types_round_trip(pg_dsn: str, tmp_path: Path) -> None:
    # Each type a spec may give a column, through create() and get().
    machine = every_type()
    fsm = module_of(machine, tmp_path)
    db = Scratch.create(pg_dsn, machine)
    try:
        with db.connect() as app:
            plain = fsm.create(app, schema=db.schema)
            assert (plain.weight, plain.ratio, plain.urgent, plain.options, plain.born) == (
                decimal.Decimal("1.5"), 0.25, False, {"retries": [1, 2]}, None)  # fmt: skip
            assert fsm.Job(plain.id).options == {"retries": [1, 2]} and fsm.Job(plain.id).options is not fsm.Job(plain.id).options
            given = dict(born=plain.created_at.date(), parent=uuid.uuid4(), blob=b"\x00\xff", weight=decimal.Decimal("2.25"),
                         ratio=1e-3, urgent=True, run_after=plain.created_at, options=[3])  # fmt: skip
            full = fsm.create(app, schema=db.schema, **given)
            assert {k: getattr(full, k) for k in given} == given
    finally:
        db.drop()


def test_claim_by_queue_takes_that_queues_lowest_priority_first_through_an_index(pg_dsn: str, tmp_path: Path) -> None:
    # specs/queue.yaml: `claim: {by: [queue], order: priority}`. Among many rows of other
    # queues, a claim limited to one queue takes its rows by priority, then age; an
    # unlimited claim takes the lowest priority of all; each reads an index, no table scan.
    machine = machine_of("queue")
    fsm = module_of(machine, tmp_path)
    db = Scratch.create(pg_dsn, machine)
    try:
        with db.connect() as app:
            fsm.create_many(app, [{"queue": f"other-{n % 50}", "priority": n % 7 + 1} for n in range(3000)], schema=db.schema)
            mine = fsm.create_many(app, [{"queue": "mine", "priority": p} for p in (5, 2, 9, 2)], schema=db.schema)
            urgent = fsm.create(app, queue="other-1", priority=0, schema=db.schema)
            app.commit()
        with db.owner() as owner:
            owner.execute(db.q("ANALYZE {table}"))
            owner.commit()
        with db.connect() as app:
            got = fsm.claim(app, "fetch", actor="w", limit=3, queue="mine", schema=db.schema)
            assert [j.id for j in got] == [mine[1].id, mine[3].id, mine[0].id]  # 2, 2 (the older first), 5
            assert {j.queue for j in got} == {"mine"}
            (first,) = fsm.claim(app, "fetch", actor="w", schema=db.schema)
            assert first.id == urgent.id
            app.rollback()
        for query, index in ((f"SELECT * FROM {db.schema}.queue_claim('fetch', 'w', 3, queue => 'mine')", "queue_jobs_claim_by_idx"),
                             (f"SELECT * FROM {db.schema}.queue_claim('fetch', 'w', 3)", "queue_jobs_claim_idx")):  # fmt: skip
            rows, plans = explained(db, query.encode())
            picking = [p for p in plans if "LockRows" in p and "queue_jobs" in p]
            assert rows and picking, plans
            assert all(index in p and "Seq Scan on queue_jobs" not in p for p in picking), picking
    finally:
        db.drop()


def test_the_changes_of_type_migrate_scripts_are_the_casts_postgresql_has(pg_dsn: str) -> None:
    # `fsmc.columns.CONVERTS`: `fsmc migrate` casts a column's values in place (USING
    # column::type) for these pairs, and refuses every other, for which PostgreSQL has no cast.
    assert set(CONVERTS) == set(TYPES) and all(to <= set(TYPES) - {was} for was, to in CONVERTS.items())
    found: dict[str, set[str]] = {was: set() for was in TYPES}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for was in TYPES:
            for to in TYPES:
                if was == to:
                    continue
                try:
                    conn.execute(f"SELECT NULL::{was}::{to}".encode())
                except psycopg.errors.CannotCoerce:
                    continue
                found[was].add(to)
    assert found == {was: set(to) for was, to in CONVERTS.items()}


def test_the_generated_suite_round_trips_a_column_of_every_type(pg_dsn: str, tmp_path: Path) -> None:
    # Its create() and claim() tests, each column given a value that is not its default
    # (and no other column's), and ruff clean (a numeric column makes it import decimal).
    machine = every_type()
    for path, text in generate(machine).files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    [folder] = {p.parent for p in tmp_path.rglob("test_*.py")}
    suite = next(folder.glob("test_*.py")).read_text(encoding="utf-8")
    assert "\nimport decimal\n" in suite and '"level": (-8, 19),' in suite
    # A default of any text is one Python literal, which escapes what is not printable.
    assert '"note": ("note é\\x0a\\x09\'\\\\\\x1b[31m\\u202e😀\\x7f\\x0d", "note é"),' in suite
    done = run_pytest(folder, "-k", "column or claimed_row", cwd=folder, dsn=pg_dsn)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
    linted = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "."], cwd=folder,
                            capture_output=True, text=True)  # fmt: skip
    assert linted.returncode == 0, linted.stdout + linted.stderr
