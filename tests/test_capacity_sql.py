"""Language 1.2's capacity limits in the database (issue 22): `limits: {running: 3}`.

Every test plays the application as `Scratch.connect()` does (the grants of docs/postgres.md
only). The races run 16 threads, each on its own connection under READ COMMITTED,
moving rows through `running` (limit 3) by `_apply`, by `_claim` (max_rows 5; also
under REPEATABLE READ, with a snapshot taken before the claim), by direct writes with
their event rows, and all of them mixed, while a sampler counts the rows in `running`
in a loop: no sample ever sees more than 3, no call fails but with the documented
23F09 (and 40001 under REPEATABLE READ, tried again), and every row ends in `done`
with a log that replays to it.
A READ COMMITTED statement sees every transaction committed before it began, so each
sample is the table as of some commit; the slots held are checked against the rows
at the end.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness import refused, sqlstate_of
from tests.pg_scratch import Scratch, machine_from_text, module_of

POOL = """\
fsmc: 1
machine: pool
initial: queued
states: [queued, running, stalled, failed, done, dead]
terminals: [done, dead]
events: [start, finish, requeue, rescue, resume, fail, retry, give_up]
transitions:
  - {from: queued, event: start, to: running}
  - {from: running, event: finish, to: done}
  - {from: running, event: requeue, to: queued}
  - {from: running, event: rescue, to: stalled}
  - {from: stalled, event: resume, to: queued}
  - {from: running, event: fail, to: failed}
  - {from: failed, event: retry, to: queued, otherwise: stalled}
  - {from: [failed, stalled], event: give_up, to: dead}
caps: {retry: 1}
lease: {states: [running], reclaim: rescue}
limits: {running: 3, stalled: 1}
postgres: {id_type: bigint}
"""

GATE = """\
fsmc: 1
machine: gate
initial: waiting
states: [waiting, done]
terminals: [done]
events: [finish]
transitions:
  - {from: waiting, event: finish, to: done}
limits: {waiting: 2}
postgres: {id_type: bigint}
"""

LIMIT = 3
THREADS = 16
ROWS = 2000
LIMIT_REACHED = "23F09"


@pytest.fixture(scope="module")
def pool(pg_dsn: str) -> Iterator[Scratch]:
    scratch = Scratch.create(pg_dsn, machine_from_text(POOL, "pool.yaml"))
    yield scratch
    scratch.drop()


def fresh(db: Scratch, count: int) -> list[int]:
    """`count` new rows in queued, once every earlier test's row is done or dead (moved
    there legally, so the slots stay true)."""
    with db.connect() as app:
        for row_id, state, version in app.execute(db.q(
                "SELECT id, state, state_version FROM {table} WHERE state IN ('running', 'stalled', 'failed')")).fetchall():
            assert db.apply(app, row_id, "finish" if state == "running" else "give_up", version) == version + 1
        app.commit()
        drain(db, app)
        ids = [r[0] for r in app.execute(db.q(
            "INSERT INTO {table} SELECT FROM pg_catalog.generate_series(1, %s) RETURNING id"), (count,))]  # fmt: skip
        app.commit()
        assert held(app) == {"running": 0, "stalled": 0}
    return ids


def drain(db: Scratch, conn: psycopg.Connection[Any]) -> None:
    """Claim every row left in queued and finish it."""
    while claimed := conn.execute(db.q("SELECT id, state_version FROM {claim}('start', 'w', 3)")).fetchall():
        conn.commit()
        for row_id, version in claimed:
            finish(db, conn, row_id, version)
    conn.commit()


def held(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Each limited state's slots held (a row in the state holds one)."""
    return dict(conn.execute(b"SELECT state, count(holder)::int FROM pool_limits GROUP BY state").fetchall())


def counted(db: Scratch, conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(db.q("SELECT state, count(*) FROM {table} WHERE state IN ('running', 'stalled') GROUP BY state"))
    return {"running": 0, "stalled": 0} | dict(rows.fetchall())


class Sampler(threading.Thread):
    """Counts the rows in `running` in a loop until stopped; `most` is the largest count."""

    def __init__(self, db: Scratch) -> None:
        super().__init__(daemon=True)
        self.db, self.most, self.samples, self.stop = db, 0, 0, threading.Event()

    def run(self) -> None:
        with self.db.connect(autocommit=True) as conn:
            query = self.db.q("SELECT count(*) FROM {table} WHERE state = 'running'")
            while not self.stop.is_set():
                row = conn.execute(query).fetchone()
                assert row is not None
                self.most, self.samples = max(self.most, int(row[0])), self.samples + 1
                time.sleep(0.0005)  # leave the two cores to the movers too


Move = Callable[[Scratch, psycopg.Connection[Any], int, random.Random], None]


def race(db: Scratch, ids: list[int], move: Move) -> None:
    """THREADS threads, each on its own connection, take row ids off one shared list and
    `move` each from queued through running to done (a claim may take other rows than
    its ticket's, and finishes those); the sampler watches `running` meanwhile."""
    todo = list(ids)
    lock = threading.Lock()
    errors: list[BaseException] = []
    sampler = Sampler(db)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with db.connect() as conn:
                # The race is about locks and snapshots, not durability: commits that
                # skip the WAL flush make each stay in running shorter, the test faster.
                conn.execute(b"SET synchronous_commit = off")
                conn.commit()
                while True:
                    with lock:
                        if not todo:
                            break
                        row_id = todo.pop()
                    move(db, conn, row_id, rng)
                drain(db, conn)  # what the claims' tickets left (their rows were claimed by others)
        except BaseException as error:  # reported by the test, not lost in a thread
            errors.append(error)

    sampler.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sampler.stop.set()
    sampler.join()
    assert not errors, errors[:3]
    assert sampler.samples > 0
    assert sampler.most <= LIMIT, f"a sample saw {sampler.most} rows in running (limit {LIMIT})"
    with db.connect() as conn:
        states = dict(conn.execute(db.q("SELECT state, count(*) FROM {table} WHERE id = ANY (%s) GROUP BY state"),
                                   (ids,)).fetchall())  # fmt: skip
        assert states == {"done": len(ids)}, states
        assert held(conn) == counted(db, conn) == {"running": 0, "stalled": 0}
        # Each row's log replays to it: versions 1..n without a gap, chained from
        # queued, the last one the row's state and version (one query for them all).
        broken = conn.execute(db.q("""
            SELECT t.id FROM {table} AS t
            JOIN LATERAL (SELECT pg_catalog.count(*) AS n, pg_catalog.max(e.version) AS last,
                                 pg_catalog.bool_and(e.from_state = coalesce(p.to_state, 'queued')) AS chained
                          FROM {events} AS e
                          LEFT JOIN {events} AS p ON p.{id_col} = e.{id_col} AND p.version = e.version - 1
                          WHERE e.{id_col} = t.id) AS h ON true
            WHERE t.id = ANY (%s) AND NOT (h.n = t.state_version AND h.last = t.state_version AND h.chained)
        """), (ids,)).fetchall()  # fmt: skip
        assert broken == []


class Gone(Exception):
    """The ticket's row left queued meanwhile: another worker's claim took it."""


def until_moved(conn: psycopg.Connection[Any], attempt: Callable[[], None], rng: random.Random) -> bool:
    """Run `attempt` in a transaction until it commits; only 23F09 (the state is full)
    may refuse it, and then the transaction is tried again. False when the row was
    gone (a claim took it)."""
    while True:
        try:
            attempt()
            conn.commit()
            return True
        except Gone:
            conn.rollback()
            return False
        except psycopg.Error as error:
            conn.rollback()
            assert sqlstate_of(error) == LIMIT_REACHED, error
            time.sleep(rng.uniform(0.001, 0.004))  # the state is full: let the others finish


def finish(db: Scratch, conn: psycopg.Connection[Any], row_id: int, version: int) -> None:
    assert db.apply(conn, row_id, "finish", version) == version + 1
    conn.commit()


def by_apply(db: Scratch, conn: psycopg.Connection[Any], row_id: int, rng: random.Random) -> None:
    def start() -> None:
        version = db.apply(conn, row_id, "start", 0)
        if version is None:
            raise Gone
        assert version == 1

    if until_moved(conn, start, rng):
        finish(db, conn, row_id, 1)


def by_direct_write(db: Scratch, conn: psycopg.Connection[Any], row_id: int, rng: random.Random) -> None:
    def start() -> None:
        moved = conn.execute(db.q("UPDATE {table} SET state = 'running', state_version = 1"
                                  " WHERE id = %s AND state = 'queued'"), (row_id,)).rowcount  # fmt: skip
        if moved == 0:
            raise Gone
        conn.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                          " VALUES (%s, 1, 'queued', 'start', 'running', 'by hand')"), (row_id,))  # fmt: skip

    if until_moved(conn, start, rng):
        conn.execute(db.q("UPDATE {table} SET state = 'done', state_version = 2 WHERE id = %s"), (row_id,))
        conn.execute(db.q("INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                          " VALUES (%s, 2, 'running', 'finish', 'done', 'by hand')"), (row_id,))  # fmt: skip
        conn.commit()


def by_claim(db: Scratch, conn: psycopg.Connection[Any], row_id: int, rng: random.Random) -> None:
    # The ticket only paces the worker: the claim takes the oldest rows (up to 5, at
    # most the free places), never fails for want of them, and this worker finishes them.
    claimed = conn.execute(db.q("SELECT id, state_version FROM {claim}('start', 'w', 5)")).fetchall()
    row = conn.execute(db.q("SELECT count(*) FROM {table} WHERE state = 'running'")).fetchone()
    assert row is not None and int(row[0]) <= LIMIT
    conn.commit()
    for other, version in claimed:
        finish(db, conn, other, version)
    if not claimed:
        time.sleep(rng.uniform(0, 0.002))


def by_claim_under_repeatable_read(db: Scratch, conn: psycopg.Connection[Any], row_id: int,
                                   rng: random.Random) -> None:  # fmt: skip
    """A claim whose snapshot is taken before it locks its slots (REPEATABLE READ): a
    slot taken or freed by a commit since then is a lost race (40001), tried again."""
    while True:
        try:
            conn.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute(db.q("SELECT count(*) FROM {table}"))  # the snapshot, before the claim
            time.sleep(rng.uniform(0, 0.001))  # others commit meanwhile
            claimed = conn.execute(db.q("SELECT id, state_version FROM {claim}('start', 'w', 5)")).fetchall()
            conn.commit()
            break
        except psycopg.Error as error:
            conn.rollback()
            assert sqlstate_of(error) == "40001", error
    for other, version in claimed:
        finish(db, conn, other, version)
    if not claimed:
        time.sleep(rng.uniform(0, 0.002))


def mixed(db: Scratch, conn: psycopg.Connection[Any], row_id: int, rng: random.Random) -> None:
    rng.choice((by_apply, by_direct_write, by_claim, by_claim_under_repeatable_read))(db, conn, row_id, rng)


@pytest.mark.parametrize("move", [by_apply, by_claim, by_claim_under_repeatable_read, by_direct_write, mixed],
                         ids=lambda f: f.__name__)  # fmt: skip
def test_no_commit_ever_leaves_more_rows_in_a_state_than_its_limit(pool: Scratch, move: Move) -> None:
    race(pool, fresh(pool, ROWS // 5), move)  # 2,000 rows across the five races


def holders(conn: psycopg.Connection[Any], state: str) -> set[int]:
    return {r[0] for r in conn.execute(b"SELECT holder FROM pool_limits WHERE state = %s AND holder IS NOT NULL",
                                       (state,))}  # fmt: skip


def test_each_row_a_claim_moves_holds_one_slot_into_and_between_limited_states(pool: Scratch) -> None:
    """A claim into running (max_rows 5, 3 places) moves 3 rows, and the slots of
    running are held by exactly those; a claim out of running into stalled (limit 1)
    moves one, which frees its slot of running and takes stalled's."""
    db = pool
    fresh(db, 0)
    with db.connect() as app:
        [walk_to(db, app, []) for _ in range(5)]
        claimed = app.execute(db.q("SELECT id, state_version FROM {claim}('start', 'w', 5)")).fetchall()
        assert len(claimed) == LIMIT  # the free places, not max_rows
        assert holders(app, "running") == {r[0] for r in claimed}
        assert held(app) == counted(db, app) == {"running": 3, "stalled": 0}
        app.commit()
        rescued = app.execute(db.q("SELECT id, state_version FROM {claim}('rescue', 'w', 5)")).fetchall()
        assert len(rescued) == 1  # stalled's one place
        assert holders(app, "stalled") == {rescued[0][0]}
        assert holders(app, "running") == {r[0] for r in claimed} - {rescued[0][0]}
        assert held(app) == counted(db, app) == {"running": 2, "stalled": 1}
        app.commit()


def walk_to(db: Scratch, conn: psycopg.Connection[Any], events: list[str]) -> int:
    row_id = db.new_row(conn)
    for version, event in enumerate(events):
        assert db.apply(conn, row_id, event, version) == version + 1
    conn.commit()
    return int(row_id)


def test_a_move_into_a_full_state_is_refused_and_changes_nothing(pool: Scratch, tmp_path: Path) -> None:
    db = pool
    fresh(db, 0)
    module = module_of(db.machine, tmp_path)
    with db.connect() as app:
        running = [walk_to(db, app, ["start"]) for _ in range(LIMIT)]
        waiting = walk_to(db, app, [])
        error = refused(app, db.q("SELECT {apply}(%s, 'start', 0, 'tester')"), (waiting,))
        assert sqlstate_of(error) == LIMIT_REACHED
        assert 'state "running" already holds 3 rows, its limit' in str(error)
        assert error.diag.message_detail == "state=queued to=running limit=3"
        # In Python: LimitReached, an IllegalTransition naming the full state and its limit.
        with pytest.raises(module.LimitReached) as raised:
            module.transition(app, waiting, "start", expected_version=0, actor="tester", schema=db.schema)
        app.rollback()
        assert isinstance(raised.value, module.IllegalTransition)
        assert (raised.value.state, raised.value.event, raised.value.full, raised.value.limit) == (
            module.State.QUEUED, module.Event.START, module.State.RUNNING, 3)  # fmt: skip
        assert module.LIMITS == {module.State.RUNNING: 3, module.State.STALLED: 1}
        # A direct write too, with its event row or without.
        error = refused(app, db.q("UPDATE {table} SET state = 'running', state_version = 1 WHERE id = %s"), (waiting,))
        assert sqlstate_of(error) == LIMIT_REACHED
        assert db.row(app, waiting) == ("queued", 0)
        assert held(app) == counted(db, app) == {"running": 3, "stalled": 0}
        # A claim into the full state moves nothing and does not fail.
        assert app.execute(db.q("SELECT * FROM {claim}('start', 'w', 5)")).fetchall() == []
        assert module.claim(app, "start", actor="w", limit=5, schema=db.schema) == []
        app.commit()
        # A move that stays among the limited states' own counts: running -> stalled
        # takes stalled's one place and frees one of running's.
        assert db.apply(app, running[0], "rescue", 1) == 2
        assert held(app) == {"running": 2, "stalled": 1}
        app.commit()
        assert db.apply(app, waiting, "start", 0) == 1
        app.commit()
        assert held(app) == counted(db, app) == {"running": 3, "stalled": 1}


def test_the_slots_cannot_be_written_by_the_application(pool: Scratch) -> None:
    with pool.connect() as app:
        assert sqlstate_of(refused(app, b"UPDATE pool_limits SET holder = NULL")) == "42501"
        assert sqlstate_of(refused(app, b"INSERT INTO pool_limits (state, slot) VALUES ('running', 99)")) == "42501"
        assert sqlstate_of(refused(app, b"DELETE FROM pool_limits")) == "42501"


def test_a_slot_the_application_forges_lets_no_row_into_a_full_state(pool: Scratch) -> None:
    """The slots keep the limit, and the application cannot write them (above) nor stand
    in for them: a temporary table named like them, holding the waiting row, first on
    its search_path, is not what the schema's pinned functions read."""
    db = pool
    fresh(db, 0)
    with db.connect() as app:
        [walk_to(db, app, ["start"]) for _ in range(LIMIT)]
        waiting = walk_to(db, app, [])
        app.execute(b"CREATE TEMP TABLE pool_limits (state text, slot integer, holder bigint)")
        app.execute(b"INSERT INTO pg_temp.pool_limits VALUES ('running', 1, %s), ('running', 4, %s)",
                    (waiting, waiting))  # fmt: skip
        app.execute(f"SET search_path = pg_temp, {db.schema}".encode())
        app.commit()
        write = db.q("UPDATE {table} SET state = 'running', state_version = 1 WHERE id = %s")
        assert sqlstate_of(refused(app, write, (waiting,))) == LIMIT_REACHED
        assert sqlstate_of(refused(app, db.q("SELECT {apply}(%s, 'start', 0, 'tester')"), (waiting,))) == LIMIT_REACHED
        assert app.execute(db.q("SELECT * FROM {claim}('start', 'w', 5)")).fetchall() == []
        app.execute(b"DROP TABLE pg_temp.pool_limits")
        app.execute(f"SET search_path = {db.schema}".encode())
        assert db.row(app, waiting) == ("queued", 0)
        assert held(app) == counted(db, app) == {"running": 3, "stalled": 0}
        app.commit()


def test_an_otherwise_and_a_reclaim_into_a_full_state_are_refused(pool: Scratch, tmp_path: Path) -> None:
    db = pool
    fresh(db, 0)
    module = module_of(db.machine, tmp_path)
    with db.connect() as app:
        walk_to(db, app, ["start", "rescue"])  # stalled is full (limit 1)
        # retry's budget (1) spent: the otherwise sends the row to stalled, which is full.
        spent = walk_to(db, app, ["start", "fail", "retry", "start", "fail"])
        error = refused(app, db.q("SELECT {apply}(%s, 'retry', 5, 'tester')"), (spent,))
        assert sqlstate_of(error) == LIMIT_REACHED
        assert error.diag.message_detail == "state=failed to=stalled limit=1"
        with pytest.raises(module.LimitReached) as raised:
            module.transition(app, spent, "retry", expected_version=5, actor="tester", schema=db.schema)
        app.rollback()
        assert raised.value.full == module.State.STALLED
        assert db.row(app, spent) == ("failed", 5)
        # A stale running row: reclaiming it into the full stalled is refused, whole.
        stale = walk_to(db, app, ["start"])
        db.as_owner("UPDATE {table} SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (stale,))
        error = refused(app, db.q("SELECT * FROM {reclaim}(interval '1 minute', 'supervisor')"))
        assert sqlstate_of(error) == LIMIT_REACHED
        with pytest.raises(module.LimitReached):
            module.reclaim(app, older_than=__import__("datetime").timedelta(minutes=1), actor="s", schema=db.schema)
        app.rollback()
        assert db.row(app, stale) == ("running", 1)
        assert held(app) == counted(db, app) == {"running": 1, "stalled": 1}


def test_a_place_is_free_when_the_leaving_transaction_commits_and_not_before(pool: Scratch) -> None:
    db = pool
    fresh(db, 0)
    with db.connect() as app, db.connect() as leaver:
        running = [walk_to(db, app, ["start"]) for _ in range(LIMIT)]
        entering = walk_to(db, app, [])
        for outcome in ("rollback", "commit"):
            version = db.row(leaver, running[0])[1]
            assert db.apply(leaver, running[0], "requeue", version) == version + 1  # leaving, not committed
            # The state is full as far as any commit says: refused at once, no waiting.
            assert sqlstate_of(refused(app, db.q("SELECT {apply}(%s, 'start', 0, 'tester')"), (entering,))) == LIMIT_REACHED
            getattr(leaver, outcome)()
            if outcome == "rollback":
                assert sqlstate_of(refused(app, db.q("SELECT {apply}(%s, 'start', 0, 'tester')"), (entering,))) == LIMIT_REACHED
        assert db.apply(app, entering, "start", 0) == 1  # the committed leave freed its place
        app.commit()
        assert held(app) == counted(db, app) == {"running": 3, "stalled": 0}


def test_a_mover_into_the_last_place_is_refused_while_another_takes_it(pool: Scratch) -> None:
    """Two movers racing for the last place: the second finds its slot taken (SKIP
    LOCKED: it does not wait) and is refused at once, whether the first then commits or
    rolls back; once the first rolled back, the place is free again."""
    db = pool
    fresh(db, 0)
    with db.connect() as app, db.connect() as first:
        [walk_to(db, app, ["start"]) for _ in range(LIMIT - 1)]
        a, b = walk_to(db, app, []), walk_to(db, app, [])
        assert db.apply(first, a, "start", 0) == 1  # the last place, not committed
        started = time.monotonic()
        assert sqlstate_of(refused(app, db.q("SELECT {apply}(%s, 'start', 0, 'tester')"), (b,))) == LIMIT_REACHED
        assert time.monotonic() - started < 5, "the second mover must not wait for the first"
        first.rollback()
        assert db.apply(app, b, "start", 0) == 1
        app.commit()
        assert held(app) == counted(db, app) == {"running": 3, "stalled": 0}


def test_rows_leaving_concurrently_each_free_one_place(pool: Scratch) -> None:
    db = pool
    fresh(db, 0)
    with db.connect() as app:
        running = [walk_to(db, app, ["start"]) for _ in range(LIMIT)]
    barrier = threading.Barrier(LIMIT)
    errors: list[BaseException] = []

    def leave(row_id: int) -> None:
        try:
            with db.connect() as conn:
                barrier.wait()
                assert db.apply(conn, row_id, "finish", 1) == 2
                conn.commit()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=leave, args=(r,)) for r in running]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with db.connect() as app:
        assert held(app) == counted(db, app) == {"running": 0, "stalled": 0}
        # All three places are free again, at once, for a claim.
        [walk_to(db, app, []) for _ in range(5)]
        assert len(app.execute(db.q("SELECT * FROM {claim}('start', 'w', 5)")).fetchall()) == LIMIT
        app.commit()


def test_under_repeatable_read_a_lost_race_for_the_last_place_is_40001(pool: Scratch) -> None:
    db = pool
    fresh(db, 0)
    with db.connect() as app:
        [walk_to(db, app, ["start"]) for _ in range(LIMIT - 1)]
        a, b = walk_to(db, app, []), walk_to(db, app, [])
    with db.connect() as first, db.connect() as second:
        second.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        second.execute(db.q("SELECT count(*) FROM {table}"))  # its snapshot: the last place free
        assert db.apply(first, a, "start", 0) == 1
        first.commit()  # taken, after second's snapshot
        assert sqlstate_of(refused(second, db.q("SELECT {apply}(%s, 'start', 0, 'tester')"), (b,))) == "40001"
    with db.connect() as app:
        assert held(app) == counted(db, app) == {"running": 3, "stalled": 0}


def test_an_insert_into_a_full_initial_state_is_refused(pg_dsn: str) -> None:
    db = Scratch.create(pg_dsn, machine_from_text(GATE, "gate.yaml"))
    try:
        with db.connect() as app:
            first, _ = db.new_row(app), db.new_row(app)
            app.commit()
            error = refused(app, db.q("INSERT INTO {table} DEFAULT VALUES"))
            assert sqlstate_of(error) == LIMIT_REACHED
            assert "refusing to insert a row there" in str(error)
            assert error.diag.message_detail == "state= to=waiting limit=2"
            assert db.apply(app, first, "finish", 0) == 1
            db.new_row(app)  # the finished row's place, in the same transaction
            app.commit()
            assert app.execute(b"SELECT count(holder) FROM gate_limits").fetchone() == (2,)
        # A TRUNCATE (the owner's, of rows without history: the guard refuses the others)
        # empties the state, and frees its slots.
        with db.owner() as owner:
            assert sqlstate_of(refused(owner, db.q("TRUNCATE {table}"))) == "23F06"  # a row has history
        with db.connect() as app:
            assert app.execute(db.q("SELECT {purge}('1 microsecond', 100)")).fetchone() == (1,)
            app.commit()
        with db.owner() as owner:
            owner.execute(db.q("TRUNCATE {table}"))
            owner.commit()
            assert owner.execute(b"SELECT count(holder) FROM gate_limits").fetchone() == (0,)
    finally:
        db.drop()
