"""`fsmc migrate` (contract section 6, issue 4) against the real PostgreSQL.

For each pair of specs in tests/migrate_cases/: a database built from OLD's `.sql`
(its own schema, owned by its own non-superuser role, tests/pg_scratch.py), filled
through `<machine>_apply` with a row that took each of OLD's transitions and a row
in each state, so the log has history; the migration run as that owner with
`psql -v ON_ERROR_STOP=1`; then

1. the catalog equals a fresh build of NEW's `.sql`: tables, columns, constraints
   with their definitions, indexes, functions with their definitions, triggers,
   sequences, owners and grants (schema and role names normalised; which
   constraints are NOT VALID is compared apart, against what the history allows),
   and holds the schema model of NEW as it held OLD's before the script, what the
   plan renamed there under its new name only (one database a case for both);
2. contract 4.2 holds on the migrated database: tests/test_postgres.py's own tests
   run on it, the old rows move on under NEW, and the log, read OLD-then-NEW,
   replays to every row;
3. every row and every event is still there, unchanged, and each cap's count
   column holds as many firings as the row's event rows of that event.

The refusals leave the catalog and the data exactly as they were: a state removed
that rows are in, a cap added or lowered that rows are already past, another
machine or version, a lock not granted. Needs
FSMC_PG_DSN (see tests/conftest.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import decimal
import inspect
import os
import re
import shutil
import subprocess
import sys
import time
import typing
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import jinja2.nodes
import psycopg
import pytest

from fsmc import migrate as migrate_module
from fsmc.digest import machine_digest
from fsmc.escape import sql_ident
from fsmc.facts import logged_moves
from fsmc.migrate import (
    LOCK_TIMEOUT,
    Unsupported,
    contract,
    expand,
    identity_sequence,
    macro_name,
    mid_machine,
    migrate,
    renames,
    replace,
)
from fsmc.model import Machine
from fsmc.targets.postgres import operations
from fsmc.targets.postgres.build import Build, build
from fsmc.targets.postgres.formats import UpgradeFormat
from fsmc.targets.postgres.model import Column, Parameter, Schema, View
from fsmc.targets.postgres.names import Names
from fsmc.targets.postgres.operations import (
    Begin,
    CapChange,
    ClearClaims,
    Commit,
    ContractTable,
    CreateDomains,
    CreateTable,
    DropDomains,
    DropObjects,
    DropTables,
    DropUnreplaceableFunctions,
    ExpandTable,
    FillCountColumns,
    FillLimits,
    GrantMovers,
    Guard,
    NewCheck,
    Operation,
    PinFunctions,
    PrepareWriterRole,
    RecordDigest,
    RecreatedTrigger,
    RecreateTriggers,
    RefuseIfPastCaps,
    RefuseIfPastLimits,
    RefuseIfRowsIn,
    RefuseOutsideTransaction,
    RememberMovers,
    Renames,
    ReplaceConstraints,
    ReplaceFunctions,
    ReplaceIndexes,
    ReplaceViews,
    RequireValues,
    RetypeColumns,
    RetypedColumn,
    SetDueTimes,
    SetLockTimeout,
    StartHeartbeats,
    ValidateCheck,
    ValidateHistoryCheck,
)
from fsmc.templating import environment
from tests import harness
from tests.migrating import (
    CASES,
    Catalog,
    Data,
    Migrated,
    assert_same_schema,
    behaves_as_contract_4_2,
    built,
    catalog,
    data,
    fill,
    migrate_ok,
    migrated,
    plan_of,
    psql,
    refused,
    refused_changing_nothing,
    snapshot,
    spec,
)
from tests.pg_scratch import Scratch, count_column, machine_from_text, shortest_walk, writer_of


def old_rows_move_on(db: Migrated, before: Data) -> None:
    """Every row from before the migration takes each of NEW's transitions out of its
    state (rolled back), then one for good (committed); an undeclared event is refused."""
    m = db.machine
    moved = 0
    with db.connect() as conn:
        for row_id, (state, version, *_claims) in before.rows.items():
            if state in m.timed_states:
                # The migration gave a row in a timed state its due time, as its entry says
                # (the generated tests hold the backoff; a state waiting for a given time
                # is due at once); made due now, so that its timed event can fire.
                got = conn.execute(db.q("SELECT due_at - entered_at, due_at <= now() FROM {table} WHERE id = %s"),
                                   (row_id,)).fetchone()  # fmt: skip
                assert got is not None and got[0] is not None, (row_id, state)
                timer = m.timed_states[state][1]
                if timer.kind == "delay":
                    assert got[0] == timedelta(milliseconds=timer.ms), (state, got)
                elif timer.kind == "due_at":
                    assert got[1], (state, got)
                conn.rollback()
                db.make_due(row_id)
            events = [e for (s, e) in m.targets if s == state]
            for event in events:
                for target in m.targets[state, event]:
                    to_state = db.to_state(state, event, target)
                    assert db.apply(conn, row_id, event, version, actor="after", to_state=to_state) == version + 1
                    assert db.row(conn, row_id) == (target, version + 1)
                    conn.rollback()
            for event in (e for e in m.event_names if (state, e) not in m.targets):
                with pytest.raises(psycopg.IntegrityError):
                    db.apply(conn, row_id, event, version)
                conn.rollback()
            if events:
                last = events[-1]
                to_state = db.to_state(state, last, m.targets[state, last][0])
                assert db.apply(conn, row_id, last, version, actor="after", to_state=to_state) == version + 1
                conn.commit()
                moved += 1
        assert moved > 0
        assert db.replay_problems(conn) == []


def old_triples_are_refused_as_new_events(db: Migrated, old: Machine) -> None:
    """Where NEW dropped a transition, the (possibly NOT VALID) CHECK still refuses it."""
    gone = [t for t in logged_moves(old) if t not in set(logged_moves(db.machine))]
    with db.connect() as conn:
        row_id, version = db.row_at(conn, str(db.machine.initial))
        for triple in gone:
            error = harness.refused(conn, db.q(
                "INSERT INTO {events} ({id_col}, version, from_state, event, to_state, actor)"
                " VALUES (%s, %s, %s, %s, %s, 'dba')"), (row_id, version + 1, *triple))  # fmt: skip
            assert harness.sqlstate_of(error) == "23514", (triple, error)


def claims_after(old: Machine, new: Machine, before: Data, after: Data, started: Any) -> None:
    """The claim columns: kept where the state's lease status is kept, cleared where
    it ends, a heartbeat from the migration where it starts (see fsmc.migrate)."""
    held_before = {str(s) for s in old.lease.states} if old.lease else set()
    held_after = {str(s) for s in new.lease.states} if new.lease else set()
    for row_id, (state, _version, *claims) in before.rows.items():
        now = after.rows[row_id][2:]
        if not new.lease:
            assert now == (None, None, None)
        elif state not in held_after:
            assert now == (None, None, None) if state in held_before else tuple(claims), state
        elif state in held_before:
            assert now == tuple(claims), state
        else:
            assert now[:2] == (None, None) and now[2] is not None and now[2] >= started, state


# --- the migrations -------------------------------------------------------------------

MIGRATING = [
    "added_state", "removed_transition", "retargeted_transition", "made_terminal",
    "changed_initial", "added_event", "removed_event", "removed_state", "lease_added",
    "lease_removed", "lease_changed", "renamed_tables", "renamed_to_awkward_names",
    "caps_added", "caps_raised", "caps_lowered", "caps_removed", "choice_added", "choice_removed",
    "reordered_and_changed", "initials_and_purgeable", "budgets", "timed",
    "limits_added", "limits_changed", "limits_removed",
    "columns_added", "columns_removed", "column_retyped", "column_defaults_changed", "column_made_not_null",
    "claim_changed", "notify_added", "notify_removed",
]  # fmt: skip


@pytest.mark.parametrize("case", MIGRATING)
def test_a_migrated_database_is_a_fresh_build_of_new_holding_every_row_and_event(
    pg_dsn: str, case: str
) -> None:
    old, new = spec(case, "old"), spec(case, "new")
    old_build, new_model = build(old), build(new).schema
    script = migrate(old, new)
    with built(pg_dsn, old) as db, built(pg_dsn, new) as fresh:
        # (0) The catalog holds the model of OLD, and the comparison can tell: not NEW's.
        assert_holds(db, old_build.schema)
        assert database_objects(db) != model_objects(db, new_model)
        fill(db, keep=set(new.state_names))
        before, unmigrated = data(db, old), catalog(db)
        with db.connect() as conn:
            started = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        notices = migrate_ok(db, script)
        holds_the_model_of_new_renamed(db, old_build, old, new)

        # (1) The schema is NEW's, and the comparison can tell: OLD's was not.
        got, want = catalog(db), catalog(fresh)
        assert_same_schema(got, want)
        assert unmigrated.objects != want.objects
        assert want.not_valid == frozenset()
        history = {(e[2], e[3], e[4]) for e in before.events}
        spared = [e for e in before.events if (e[2], e[3], e[4]) not in set(logged_moves(new))]
        triple_check = Names.of(new).triple_check
        assert got.not_valid == ({triple_check} if spared else set()), (history - set(logged_moves(new)))
        if spared:
            assert f"NOTICE:  fsmc migrate: {len(spared)} events of" in notices, notices
        else:
            assert "NOTICE" not in notices, notices

        # (3) Every row and every event, unchanged (the claim columns as documented).
        after = data(db, new)
        assert after.events == before.events
        assert {r: row[:2] for r, row in after.rows.items()} == {r: row[:2] for r, row in before.rows.items()}
        claims_after(old, new, before, after, started)
        now, logged = counts(db, new, old)
        assert now == logged  # each cap's count, as many as its event rows
        assert limit_counters(db, new) == limit_rows(db, new)  # each limit's slots held, the rows in its state

        # (2) Contract 4.2 on the migrated database, old rows included.
        db2 = migrated(db, new, (old, before.versions))
        old_triples_are_refused_as_new_events(db2, old)
        old_rows_move_on(db2, before)
        behaves_as_contract_4_2(db2)


def test_the_cases_cover_what_migrate_must_handle() -> None:
    # Each case does what its name says (so a spec edit cannot quietly empty one).
    from fsmc.diff import compare

    def changes(case: str) -> Any:
        return compare(spec(case, "old"), spec(case, "new"))

    assert [n.name for n in changes("added_state").states.added] == ["cancelled"]
    assert [(e.source, e.event) for e in changes("removed_transition").removed] == [("paused", "abandon")]
    assert [(r.old_target, r.new_target) for r in changes("retargeted_transition").retargeted] == [("queued", "claimed")]
    assert [n.name for n in changes("made_terminal").terminals.added] == ["failed"]
    assert changes("changed_initial").initial is not None
    assert [n.name for n in changes("added_event").events.added] == ["expedite"]
    assert [n.name for n in changes("removed_event").events.removed] == ["retry"]
    assert [n.name for n in changes("removed_state").states.removed] == ["paused"]
    assert spec("lease_added").lease is None and spec("lease_added", "new").lease is not None
    assert spec("lease_removed").lease is not None and spec("lease_removed", "new").lease is None
    assert spec("lease_removed").postgres.id_type == "text"
    assert {o.name for o in changes("lease_changed").options} == {"lease.states"}
    assert {o.name for o in changes("renamed_tables").options} == {"postgres.table", "postgres.events_table"}
    assert spec("renamed_tables").postgres.id_type == "bigint"
    awkward = spec("renamed_to_awkward_names", "new").postgres
    assert (len(awkward.table), awkward.events_table) == (63, "user")
    caps = {case: {(o.name, o.old, o.new) for o in changes(case).options}
            for case in ("caps_added", "caps_raised", "caps_lowered", "caps_removed")}  # fmt: skip
    assert caps == {"caps_added": {("caps.retry", None, 2), ("caps.reclaim", None, 3)},
                    "caps_raised": {("caps.retry", 2, 5)}, "caps_lowered": {("caps.retry", 5, 2)},
                    "caps_removed": {("caps.retry", 2, None)}}  # fmt: skip
    assert [(c.old_targets, c.new_targets) for c in changes("choice_added").choices] == [
        (("completed",), ("completed", "failed"))]  # fmt: skip
    assert [(c.old_targets, c.new_targets) for c in changes("choice_removed").choices] == [
        (("completed", "failed"), ("completed",))]  # fmt: skip
    assert spec("wildcard_sources", "new").wildcards and not spec("wildcard_sources", "old").wildcards
    columns = {case: {(o.name.removeprefix("postgres.columns."), o.old is None, o.new is None, o.breaking)
                      for o in changes(case).options}
               for case in ("columns_added", "columns_removed", "column_retyped", "column_defaults_changed",
                            "column_made_not_null")}  # fmt: skip
    assert columns == {
        "columns_added": {("args", True, False, False), ("queue", True, False, False),
                          ("attempts", True, False, False), ("urgent", True, False, False)},
        "columns_removed": {("args", False, True, True), ("priority", False, True, True)},
        "column_retyped": {("priority", False, False, True), ("score", False, False, True), ("body", False, False, True)},
        "column_defaults_changed": {("queue", False, False, False), ("priority", False, False, False),
                                    ("label", False, False, False), ("owner", False, False, False)},
        "column_made_not_null": {("note", False, False, True), ("attempts", False, False, True)},
    }  # fmt: skip
    assert {(o.name, o.new) for o in changes("claim_changed").options} == {
        ("postgres.claim.by", ("queue",)), ("postgres.claim.order", "priority")}  # fmt: skip
    notify = {case: {(o.name, o.old, o.new, o.breaking) for o in changes(case).options}
              for case in ("notify_added", "notify_removed")}  # fmt: skip
    assert notify == {"notify_added": {("postgres.notify", (), ("claim", "retry"), False)},
                      "notify_removed": {("postgres.notify", ("claim", "retry"), (), False)}}  # fmt: skip
    for case in MIGRATING:
        assert migrate(spec(case, "old"), spec(case, "new")), case


# --- no migration -----------------------------------------------------------------------


@pytest.mark.parametrize("case", ["identical", "reordered", "wildcard_sources"])
def test_specs_that_build_the_same_schema_need_no_migration(pg_dsn: str, case: str) -> None:
    old, new = spec(case, "old"), spec(case, "new")
    assert migrate(old, new) == ""
    assert machine_digest(old) == machine_digest(new)
    # The database OLD built already is NEW's: its digest, and NEW's behaviour.
    with built(pg_dsn, old) as db:
        fill(db)
        before = data(db, old)
        behaves_as_contract_4_2(migrated(db, new, (old, before.versions)))


def test_reordered_is_more_than_identical() -> None:
    old, new = (CASES / "reordered" / f"{n}.yaml" for n in ("old", "new"))
    assert old.read_text() != new.read_text()
    assert spec("reordered", "old").state_names != spec("reordered", "new").state_names


# --- refusals -----------------------------------------------------------------------------


def test_removing_a_state_rows_are_in_is_refused_naming_state_and_count(pg_dsn: str) -> None:
    old, new = spec("removed_state", "old"), spec("removed_state", "new")
    with built(pg_dsn, old) as db:
        fill(db)  # rows stay in paused: the one in it, and the one that paused
        before = snapshot(db, old)
        in_paused = sum(1 for state, *_ in before[1].rows.values() if state == "paused")
        assert in_paused == 2
        error = refused(db, migrate(old, new))
        assert f'rows of jobs are still in: state "paused" ({in_paused} rows); nothing was changed' in error
        assert "job_apply" in error  # the hint says how to empty the state
        assert snapshot(db, old) == before
        # Once the rows have moved on, the same script runs.
        with db.connect() as conn:
            for row_id, (state, version, *_claims) in before[1].rows.items():
                if state == "paused":
                    assert db.apply(conn, row_id, "resume", version) == version + 1
            conn.commit()
        migrate_ok(db, migrate(old, new))
        assert catalog(db).objects == catalog_of(pg_dsn, new).objects


TWO_STATES_GONE = """\
fsmc: 1
machine: job
initial: queued
states: [queued, claimed, running, completed, abandoned]
terminals: [completed, abandoned]
events: [claim, start, finish, reclaim, abandon]
transitions:
  - {from: queued, event: claim, to: claimed}
  - {from: queued, event: abandon, to: abandoned}
  - {from: claimed, event: start, to: running}
  - {from: [claimed, running], event: reclaim, to: queued}
  - {from: running, event: finish, to: completed}
lease: {states: [claimed, running], reclaim: reclaim}
postgres: {table: jobs, events_table: job_events, id_type: uuid}
"""


def test_the_refusal_names_each_removed_state_with_its_count(pg_dsn: str) -> None:
    # One row: "1 row", not "1 rows"; two states, in OLD's order.
    old = spec("removed_state", "old")
    new = machine_from_text(TWO_STATES_GONE)
    assert set(old.state_names) - set(new.state_names) == {"paused", "failed"}
    with built(pg_dsn, old) as db:
        with db.connect() as conn:
            db.row_at(conn, "failed")
            db.row_at(conn, "paused")
            db.row_at(conn, "paused")
        error = refused_changing_nothing(db, old, migrate(old, new))
        assert 'still in: state "paused" (2 rows), state "failed" (1 row); nothing was changed' in error


def catalog_of(dsn: str, machine: Machine) -> Catalog:
    with built(dsn, machine) as fresh:
        return catalog(fresh)


def test_a_database_built_from_another_machine_is_refused(pg_dsn: str) -> None:
    other = machine_from_text((CASES / "added_state" / "old.yaml").read_text().replace("machine: job", "machine: jab")
                              .replace("table: jobs", "table: jabs").replace("events_table: job_events", "events_table: jab_events"))  # fmt: skip
    with built(pg_dsn, other) as db:
        error = refused_changing_nothing(db, other, migrate(spec("added_state"), spec("added_state", "new")))
        assert 'no job_fsmc_digest() on the search_path' in error and 'machine "job"' in error, error
        assert "nothing was changed" in error


def test_refusals_are_sqlstate_55000_through_psycopg_too(pg_dsn: str) -> None:
    old, new = spec("removed_state"), spec("removed_state", "new")
    with built(pg_dsn, old) as db:
        fill(db)
        before = snapshot(db, old)
        with db.owner(autocommit=True) as conn:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as raised:
                conn.execute(migrate(old, new).encode())
            conn.execute("ROLLBACK")
        assert raised.value.sqlstate == "55000"
        assert 'state "paused" (2 rows)' in str(raised.value)
        assert snapshot(db, old) == before


def test_a_database_built_from_another_version_of_the_spec_is_refused(pg_dsn: str) -> None:
    built_from = spec("removed_transition", "new")
    old, new = spec("added_state"), spec("added_state", "new")
    with built(pg_dsn, built_from) as db:
        fill(db)
        error = refused_changing_nothing(db, built_from, migrate(old, new))
        assert f"built from machine digest {machine_digest(built_from)}, not from the old spec's" \
               f" ({machine_digest(old)}); nothing was changed" in error  # fmt: skip
        assert "generate the migration from the spec this database was built from" in error


def test_running_a_migration_twice_refuses_the_second_time(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    with built(pg_dsn, old) as db:
        fill(db)
        migrate_ok(db, migrate(old, new))
        error = refused_changing_nothing(db, new, migrate(old, new))
        assert "already at the new spec: there is nothing to migrate" in error


def test_a_search_path_that_would_create_objects_elsewhere_is_refused(pg_dsn: str) -> None:
    old, new = spec("lease_added"), spec("lease_added", "new")
    with built(pg_dsn, old) as db:
        error = refused_changing_nothing(db, old, migrate(old, new), search_path=f"public,{db.schema}")
        assert f"machine is in schema {db.schema}, but new objects would be created in public" in error


def test_a_lock_not_granted_in_time_changes_nothing(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    assert f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';" in migrate(old, new)
    with built(pg_dsn, old) as db:
        fill(db)
        before = snapshot(db, old)
        with db.connect() as reader:
            reader.execute(db.q("SELECT count(*) FROM {table}"))  # holds ACCESS SHARE
            # The reader lets go only after this returns, and psql's session has no
            # lock_timeout of its own: without the script's, it would wait until
            # psql() gives up (a failure), so an answer at all is the script's timeout.
            error = refused(db, migrate(old, new, lock_timeout="200ms"))
            reader.rollback()
        assert "canceling statement due to lock timeout" in error
        assert snapshot(db, old) == before


def test_of_two_migrations_run_at_once_the_second_refuses(pg_dsn: str) -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    script = migrate(old, new)
    with built(pg_dsn, old) as db:
        fill(db)
        with db.connect() as blocker, concurrent.futures.ThreadPoolExecutor(2) as pool:
            blocker.execute(db.q("LOCK TABLE {table} IN ACCESS SHARE MODE"))
            runs = [pool.submit(psql, db, script) for _ in range(2)]
            deadline = time.monotonic() + 60  # a guard against hanging, not a claim
            while waiting(db) < 2:  # both past the first digest check, waiting for the lock
                assert time.monotonic() < deadline
                time.sleep(0.02)
            blocker.rollback()
            results = sorted((r.result(timeout=90) for r in runs), key=lambda r: r.returncode)
        assert [r.returncode for r in results][0] == 0 and results[1].returncode != 0
        assert "already at the new spec" in results[1].stderr, results[1].stderr
        assert catalog(db).objects == catalog_of(pg_dsn, new).objects


def waiting(db: Scratch) -> int:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s"
                           " AND wait_event_type = 'Lock'", (db.role,)).fetchone()  # fmt: skip
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("case, message", [
    ("id_type_changed", "postgres.id_type changes from uuid to text"),
    ("swapped_tables", "NEW gives names OLD used to other objects (job_events, job_events_pkey, jobs, jobs_pkey)"),
])  # fmt: skip
def test_unsupported_option_changes_are_refused_before_any_sql(case: str, message: str) -> None:
    with pytest.raises(Unsupported, match=re.escape(message)):
        migrate(spec(case, "old"), spec(case, "new"))


# --- caps: counts from history, and rows past a new cap ----------------------------------


def fired(db: Scratch, conn: psycopg.Connection[Any], event: str, times: int) -> tuple[Any, int]:
    """A row that has fired `event` `times` times, back in the event's first source state
    (so it may fire it again); (id, version), committed."""
    m = db.machine
    source, target = next((s, t) for s, e, t in m.edges if e == event)
    row_id, version = db.row_at(conn, source)
    for _ in range(times):
        version = db.walk(conn, row_id, source, version, [event, *shortest_walk(m, target, {source})])
    conn.commit()
    return row_id, version


def counts(db: Scratch, machine: Machine, old: Machine | None = None) -> tuple[dict[Any, dict[str, int]], dict[Any, dict[str, int]]]:
    """Per row, each capped event's count column, and the number of its event rows (1.2:
    since the last move that reset it, and not counting a move to a spent budget's
    otherwise)."""
    n, caps = Names.of(machine).sql, list(machine.cap_limits)
    columns = "".join(f", {count_column(e)}" for e in caps)
    with psycopg.connect(db.dsn, options=f"-c search_path={db.schema}") as conn:
        rows = conn.execute(f"SELECT id{columns} FROM {n.table}".encode()).fetchall()
        history = conn.execute(f"SELECT {n.id_column}, from_state, event, to_state FROM {n.events_table}"
                               f" ORDER BY {n.id_column}, version".encode()).fetchall()  # fmt: skip
    kept = {r[0]: dict(zip(caps, r[1:], strict=True)) for r in rows}
    logged: dict[Any, dict[str, int]] = {r[0]: dict.fromkeys(caps, 0) for r in rows}
    # The history was written under OLD: its resets count as well as NEW's.
    resets = {**machine.resets, **(old.resets if old is not None else {})}
    for row_id, source, event, target in history:
        if event in logged[row_id] and target != machine.otherwise.get((source, event), ("",))[0]:
            logged[row_id][event] += 1
        for reset in resets.get((source, event), ()):
            if reset in logged[row_id]:
                logged[row_id][reset] = 0
    return kept, logged


def fire_until_refused(db: Scratch, row_id: Any, event: str) -> int:
    """Fire `event` on the row (round the loop back to its source) until the database
    refuses it with 23F07; how many more times it fired."""
    m = db.machine
    source, target = next((s, t) for s, e, t in m.edges if e == event)
    more = 0
    with db.connect() as conn:
        state, version = db.row(conn, row_id)
        assert state == source
        while True:
            try:
                version = db.walk(conn, row_id, source, version, [event])
            except psycopg.Error as error:
                assert harness.sqlstate_of(error) == "23F07", error
                assert f'event "{event}" has fired {m.cap_limits[event]} times, its cap' in str(error)
                conn.rollback()
                return more
            version = db.walk(conn, row_id, target, version, shortest_walk(m, target, {source}))
            conn.commit()
            more += 1
            assert more <= 1000


@pytest.mark.parametrize("case, over, message", [
    ("caps_added", {"retry": [3, 4], "reclaim": [4]},
     'event "reclaim" (cap 3): 1 row, with up to 4 firings, event "retry" (cap 2): 2 rows, with up to 4 firings'),
    ("caps_lowered", {"retry": [3, 5, 5]}, 'event "retry" (cap 2): 3 rows, with up to 5 firings'),
])  # fmt: skip
def test_adding_or_lowering_a_cap_refuses_rows_past_it_and_fills_counts_from_history(
    pg_dsn: str, case: str, over: dict[str, list[int]], message: str
) -> None:
    old, new = spec(case, "old"), spec(case, "new")
    script = migrate(old, new)
    with built(pg_dsn, old) as db:
        fill(db)
        with db.connect() as conn:
            # Under and at each cap of NEW, and past it.
            kept = {(e, k): fired(db, conn, e, k)[0] for e, cap in new.cap_limits.items() for k in (cap - 1, cap)}
            past = [fired(db, conn, e, k)[0] for e, times in over.items() for k in times]
        error = refused_changing_nothing(db, old, script)
        assert f"fsmc migrate: rows of jobs have already fired an event more times than the new spec's cap on it:" \
               f" {message}; nothing was changed" in error, error  # fmt: skip
        assert "make each cap at least the most firings named, or purge those rows" in error and "job_purge" in error
        # As the hint says: once those rows are finished and purged, the same script runs.
        with db.connect() as conn:
            for row_id in past:
                state, version = db.row(conn, row_id)
                db.walk(conn, row_id, state, version, shortest_walk(old, state, set(old.terminals)))
            conn.commit()
            assert conn.execute(db.q("SELECT {purge}('1 microsecond', 1000)")).fetchone()[0] >= len(past)  # type: ignore[index]
            conn.commit()
        migrate_ok(db, script)
        assert catalog(db).objects == catalog_of(pg_dsn, new).objects
        now, logged = counts(db, new)
        assert now == logged and any(c for row in now.values() for c in row.values())
        db2 = migrated(db, new)
        for (event, k), row_id in kept.items():
            assert now[row_id][event] == k
            assert fire_until_refused(db2, row_id, event) == new.cap_limits[event] - k


# --- limits (1.2): slots from the rows, and states past a new limit ---------------------


def limit_counters(db: Scratch, machine: Machine) -> dict[str, tuple[int, int]]:
    """Limited state -> (its limit, the slots held), as the database holds them."""
    if not machine.state_limits:
        return {}
    with psycopg.connect(db.dsn, options=f"-c search_path={db.schema}") as conn:
        rows = conn.execute(f"SELECT state, count(*), count(holder) FROM {Names.of(machine).sql.limits}"
                            " GROUP BY state".encode()).fetchall()  # fmt: skip
    return {r[0]: (r[1], r[2]) for r in rows}


def limit_rows(db: Scratch, machine: Machine) -> dict[str, tuple[int, int]]:
    """Limited state -> (NEW's limit, the rows in it)."""
    with psycopg.connect(db.dsn, options=f"-c search_path={db.schema}") as conn:
        return {
            s: (most, conn.execute(f"SELECT count(*) FROM {Names.of(machine).sql.table} WHERE state = %s".encode(),
                                   (s,)).fetchone()[0])  # type: ignore[index]  # fmt: skip
            for s, most in machine.state_limits.items()
        }


def test_a_limit_below_the_rows_already_in_its_state_is_refused_changing_nothing(pg_dsn: str) -> None:
    old, new = spec("limits_changed", "old"), spec("limits_changed", "new")
    new = dataclasses.replace(new, limits=tuple(dataclasses.replace(lim, most=2) for lim in new.limits))
    script = migrate(old, new)
    with built(pg_dsn, old) as db:
        fill(db)
        with db.connect() as conn:
            for _ in range(3):
                row_id, version = db.row_at(conn, "running")
            conn.commit()
            running = conn.execute(db.q("SELECT count(*) FROM {table} WHERE state = 'running'")).fetchone()[0]  # type: ignore[index]
        assert running > 2
        error = refused_changing_nothing(db, old, script)
        assert ("fsmc migrate: states of jobs already hold more rows than the new spec's limit on them: "
                f'state "running" (limit 2) holds {running} rows; nothing was changed') in error, error  # fmt: skip
        assert limit_counters(db, old) == {"claimed": (40, limit_rows(db, old)["claimed"][1]),
                                           "running": (50, running)}  # fmt: skip


@pytest.mark.parametrize("case", ["caps_raised", "caps_removed"])
def test_raising_or_removing_a_cap_lets_rows_at_the_old_cap_fire_again(pg_dsn: str, case: str) -> None:
    old, new = spec(case, "old"), spec(case, "new")
    with built(pg_dsn, old) as db:
        fill(db)
        with db.connect() as conn:
            rows = {k: fired(db, conn, "retry", k)[0] for k in range(old.cap_limits["retry"] + 1)}
        assert fire_until_refused(db, rows[2], "retry") == 0  # at OLD's cap
        migrate_ok(db, migrate(old, new))
        assert catalog(db).objects == catalog_of(pg_dsn, new).objects
        now, logged = counts(db, new)
        assert now == logged
        db2 = migrated(db, new)
        if "retry" in new.cap_limits:
            for k, row_id in rows.items():
                assert now[row_id]["retry"] == k
                assert fire_until_refused(db2, row_id, "retry") == new.cap_limits["retry"] - k
        else:
            assert "retry_count" not in {r[1] for r in catalog(db).objects["columns"]}
            with db2.connect() as conn:
                source_version = db2.row(conn, rows[2])[1]
                assert db2.walk(conn, rows[2], "failed", source_version, ["retry"]) == source_version + 1
                conn.commit()


# --- renaming a state, as the module docstring says --------------------------------------


# --- declared columns (1.2): each value kept, cast or filled; the application's grants NEW's ----

# case -> (what one row is given before the migration, what it holds after; what a row
# left alone holds after; what a row the application inserts after it holds), by NEW's
# columns (a column NEW drops is gone: the catalog test holds that).
COLUMN_VALUES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "columns_added": (
        {},
        {"args": None, "queue": "default", "attempts": 3, "urgent": False},
        {"args": None, "queue": "default", "attempts": 3, "urgent": False},
        {"args": None, "queue": "default", "attempts": 3, "urgent": False},
    ),
    "columns_removed": (
        {"args": {"to": "a@example.com"}, "queue": "emails", "priority": 3},
        {"queue": "emails"}, {"queue": "default"}, {"queue": "default"},
    ),
    "column_retyped": (
        {"priority": 7, "score": 2, "body": '{"a": [1, "b"]}', "queue": "emails"},
        {"priority": 7, "score": decimal.Decimal(2), "body": {"a": [1, "b"]}, "queue": "emails"},
        {"priority": 0, "score": decimal.Decimal(1), "body": None, "queue": "default"},
        {"priority": 0, "score": decimal.Decimal("1.5"), "body": None, "queue": "default"},
    ),
    "column_defaults_changed": (
        {"queue": "emails", "label": "mine", "owner": "ops"},
        {"queue": "emails", "priority": 0, "label": "mine", "owner": "ops"},
        {"queue": "default", "priority": 0, "label": None, "owner": "nobody"},
        {"queue": "emails", "priority": 5, "label": "none yet", "owner": "nobody"},
    ),
    "column_made_not_null": (
        {"note": "kept", "attempts": 4},
        {"note": "kept", "attempts": 4, "queue": "default"},
        {"note": "", "attempts": 0, "queue": "default"},
        {"note": "", "attempts": 0, "queue": "default"},
    ),
}  # fmt: skip


def declared_values(conn: psycopg.Connection[Any], row_id: Any, names: Iterable[str]) -> dict[str, Any]:
    listed = list(names)
    row = conn.execute(f"SELECT {', '.join(listed)} FROM jobs WHERE id = %s".encode(), (row_id,)).fetchone()
    assert row is not None
    return dict(zip(listed, row, strict=True))


def set_values(conn: psycopg.Connection[Any], row_id: Any, values: dict[str, Any]) -> None:
    """UPDATE the row's declared columns, as whoever `conn` is (the application: its grants)."""
    from psycopg.types.json import Jsonb

    sets = ", ".join(f"{k} = %s" for k in values)
    params = [Jsonb(v) if isinstance(v, dict | list) else v for v in values.values()]
    conn.execute(f"UPDATE jobs SET {sets} WHERE id = %s".encode(), (*params, row_id))


@pytest.mark.parametrize("case", sorted(COLUMN_VALUES))
def test_declared_columns_keep_their_values_and_the_application_writes_new_ones(pg_dsn: str, case: str) -> None:
    old, new = spec(case, "old"), spec(case, "new")
    given, kept, untouched, born = COLUMN_VALUES[case]
    assert sorted(kept) == sorted(str(c.name) for c in new.postgres.columns)
    with built(pg_dsn, old) as db:
        with db.connect() as app:
            one, other = db.new_row(app), db.new_row(app)
            if given:
                set_values(app, one, given)
            app.commit()
        migrate_ok(db, migrate(old, new))
        with db.owner() as owner:
            assert declared_values(owner, one, kept) == kept
            assert declared_values(owner, other, kept) == untouched
        # NEW's grants: the application inserts a row (NEW's defaults), writes every
        # column NEW declares, and NULL only where NEW allows it.
        with migrated(db, new).connect() as app:
            third = db.new_row(app)
            assert declared_values(app, third, kept) == born
            set_values(app, third, {k: v for k, v in kept.items()})
            assert declared_values(app, third, kept) == kept
            app.rollback()
            for column in new.postgres.columns:
                query = f"UPDATE jobs SET {column.name} = NULL WHERE id = %s".encode()
                if column.nullable:
                    app.execute(query, (one,))
                else:
                    assert harness.sqlstate_of(harness.refused(app, query, (one,))) == "23502", column.name
            app.rollback()


def test_a_value_that_does_not_convert_to_a_columns_new_type_changes_nothing(pg_dsn: str) -> None:
    old, new = spec("column_retyped", "old"), spec("column_retyped", "new")
    script = migrate(old, new)
    assert "-- when a value does not convert to the type the new spec gives its column (jobs.priority to integer," in script
    with built(pg_dsn, old) as db:
        with db.connect() as app:
            fine, bad = db.new_row(app), db.new_row(app)
            set_values(app, fine, {"body": '{"a": 1}', "priority": 3})
            set_values(app, bad, {"body": "not json"})
            app.commit()
        error = refused_changing_nothing(db, old, script)
        assert ("fsmc migrate: a value of jobs does not convert to the type the new spec gives its column "
                "(priority to integer, score to numeric, body to jsonb): invalid input syntax for type json") in error
        assert "; nothing was changed" in error
        with db.owner() as owner:
            assert declared_values(owner, bad, ["body"]) == {"body": "not json"}
            assert declared_values(owner, fine, ["body", "priority"]) == {"body": '{"a": 1}', "priority": 3}
            set_values(owner, bad, {"body": '"fixed"'})
            owner.commit()
        migrate_ok(db, script)
        with db.owner() as owner:
            assert declared_values(owner, bad, ["body"]) == {"body": "fixed"}


def test_a_type_postgresql_cannot_cast_to_is_refused_before_any_sql() -> None:
    old = spec("column_retyped", "old")
    text = (CASES / "column_retyped" / "new.yaml").read_text().replace("body: jsonb", "body: uuid")
    assert text.replace("body: uuid", "body: jsonb") == (CASES / "column_retyped" / "new.yaml").read_text()
    migrate(old, machine_from_text(text))  # text -> uuid: a cast (which may fail for a value)
    stuck = machine_from_text(text.replace("score: {type: numeric, default: 1.5}", "score: date"))
    with pytest.raises(Unsupported, match=re.escape("postgres.columns.score changes type from integer to date: "
                                                    "PostgreSQL has no cast from one to the other")):  # fmt: skip
        migrate(old, stuck)


def test_renaming_a_state_in_two_releases_keeps_the_log_replayable(pg_dsn: str) -> None:
    v1, v2, v3 = (spec("rename_state", v) for v in ("v1", "v2", "v3"))
    assert "rename_paused" not in migrate_module.__doc__.split("Renaming a state")[0]  # type: ignore[union-attr]
    with built(pg_dsn, v1) as db:
        fill(db)
        at_v1 = data(db, v1)
        migrate_ok(db, migrate(v1, v2))
        # Release 2 cannot ship while rows are still in paused...
        paused = [r for r, (state, *_rest) in at_v1.rows.items() if state == "paused"]
        assert paused
        error = refused_changing_nothing(db, v2, migrate(v2, v3))
        assert f'state "paused" ({len(paused)} rows)' in error
        # ... so the sweep of the docstring moves them, each with its own event row.
        with psycopg.connect(db.dsn, user=db.role, options=f"-c search_path={db.schema}") as conn:
            moved = conn.execute("SELECT job_apply(id, 'rename_paused', state_version, 'release 1.5')"
                                 " FROM jobs WHERE state = 'paused'").fetchall()  # fmt: skip
        assert len(moved) == len(paused) and all(v is not None for (v,) in moved)
        at_v2 = data(db, v2)
        notices = migrate_ok(db, migrate(v2, v3))
        assert "stays NOT VALID" in notices
        assert catalog(db).objects == catalog_of(pg_dsn, v3).objects
        after = data(db, v3)
        assert after.events == at_v2.events  # the history, as it was
        for row_id in paused:
            assert after.rows[row_id][0] == "on_hold"
            last = [e for e in after.events if e[0] == row_id][-1]
            assert (last[2], last[3], last[4], last[5]) == ("paused", "rename_paused", "on_hold", "release 1.5")
        db3 = migrated(db, v3, (v1, at_v1.versions), (v2, at_v2.versions))
        with db3.connect() as conn:
            assert db3.replay_problems(conn) == []
        old_rows_move_on(db3, after)
        behaves_as_contract_4_2(db3)


def test_a_state_cannot_be_renamed_in_place(pg_dsn: str) -> None:
    # Why the recipe is needed: the database itself refuses the shortcut.
    v2 = spec("rename_state", "v2")
    with built(pg_dsn, v2) as db, db.owner() as conn:  # the triggers, not privileges, refuse
        row_id, _version = db.row_at(conn, "paused")
        error = harness.refused(conn, db.q("UPDATE {table} SET state = 'on_hold' WHERE id = %s"), (row_id,))
        assert harness.sqlstate_of(error) == "23F04"
        error = harness.refused(conn, db.q("UPDATE {events} SET to_state = 'on_hold'"))
        assert harness.sqlstate_of(error) == "23F06"


# --- the plan against the catalog: the models of OLD and NEW ---------------------------------

# The objects of one schema as the catalog describes them, by name, with definitions
# as PostgreSQL prints them. Read with search_path set to the schema, so names in
# definitions (a foreign key's table) are unqualified; a trigger's table, which
# pg_get_triggerdef always qualifies, is unqualified by hand.
MODEL_CATALOG = {
    "tables": """
        SELECT c.relname, coalesce(c.reloptions, '{}') FROM pg_catalog.pg_class c
        WHERE c.relnamespace = %(ns)s AND c.relkind = 'r'""",
    "columns": """
        SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_catalog.pg_get_expr(d.adbin, d.adrelid), a.attidentity
        FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = %(ns)s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT c.relname, k.conname, pg_catalog.pg_get_constraintdef(k.oid)
        FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
        WHERE c.relnamespace = %(ns)s""",
    "indexes": """
        SELECT t.relname, c.relname, pg_catalog.pg_get_expr(i.indpred, i.indrelid),
               (SELECT pg_catalog.array_agg(a.attname ORDER BY k.n) FROM pg_catalog.unnest(i.indkey)
                WITH ORDINALITY AS k(attnum, n) JOIN pg_catalog.pg_attribute a
                ON a.attrelid = i.indrelid AND a.attnum = k.attnum)
        FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
        JOIN pg_catalog.pg_class t ON t.oid = i.indrelid
        WHERE c.relnamespace = %(ns)s
          AND NOT EXISTS (SELECT FROM pg_catalog.pg_constraint k WHERE k.conindid = i.indexrelid)""",
    "domains": """
        SELECT t.typname, pg_catalog.format_type(t.typbasetype, t.typtypmod), k.conname,
               pg_catalog.pg_get_constraintdef(k.oid), t.typacl::text[]
        FROM pg_catalog.pg_type t JOIN pg_catalog.pg_constraint k ON k.contypid = t.oid
        WHERE t.typnamespace = %(ns)s AND t.typtype = 'd'""",
    "triggers": """
        SELECT c.relname, t.tgname, p.proname, t.tgtype, t.tgdeferrable, t.tginitdeferred,
               pg_catalog.regexp_replace(pg_catalog.pg_get_triggerdef(t.oid), ' ON [^ .]+[.]', ' ON ')
        FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
        JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
        WHERE c.relnamespace = %(ns)s AND NOT t.tgisinternal""",
}


def objects_in(conn: psycopg.Connection[Any], namespace: int) -> dict[str, set[tuple[Any, ...]]]:
    def row(values: Any) -> tuple[Any, ...]:
        return tuple(tuple(v) if isinstance(v, list) else v for v in values)

    return {kind: {row(r) for r in conn.execute(query.encode(), {"ns": namespace}).fetchall()}
            for kind, query in MODEL_CATALOG.items()}  # fmt: skip


def functions_in(conn: psycopg.Connection[Any], schema: str) -> set[tuple[Any, ...]]:
    rows = conn.execute("""
        SELECT p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid),
               pg_catalog.pg_get_function_result(p.oid), l.lanname, p.prosrc,
               p.proconfig, p.provolatile, p.proparallel
        FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid = p.prolang
        WHERE p.pronamespace = %s::regnamespace""", (schema,)).fetchall()  # fmt: skip
    out = set()
    for name, args, result, language, source, config, volatility, parallel in rows:
        if language == "sql":  # a SQL-standard body: what it returns
            source = str(conn.execute(f"SELECT {schema}.{name}()".encode()).fetchone()[0])  # type: ignore[index]
        # The name as SQL spells it, as the model holds it.
        out.add((sql_ident(name), args, result, language, source, tuple(sorted(config or ())), volatility, parallel))
    return out


def model_functions(conn: psycopg.Connection[Any], model: Schema, schema: str) -> set[tuple[Any, ...]]:
    """The model's functions as `functions_in` reads them (types normalised by PostgreSQL,
    the search_path pin that the file's last block adds included)."""

    def type_name(sql_type: str) -> str:
        if sql_type.startswith("TABLE ("):  # a table result: PostgreSQL prints `TABLE(...)`
            return "TABLE" + sql_type.removeprefix("TABLE ")
        setof = sql_type.startswith("SETOF ")
        row = conn.execute("SELECT %s::regtype::text", (sql_type.removeprefix("SETOF "),)).fetchone()
        assert row is not None
        return ("SETOF " if setof else "") + str(row[0])

    out = set()
    for f in model.functions:
        args = ", ".join(f"{p.name} {type_name(p.type)}" for p in f.parameters)  # fsmc's own, bare
        source = f.source
        if f.language == "sql":
            source = str(conn.execute(f"SELECT {f.body}".encode()).fetchone()[0])  # type: ignore[index]
        config = [f"{k}={v}" for k, v in f.settings] + [f"search_path=pg_catalog, {schema}, pg_temp"]
        out.add((f.name, args, type_name(f.returns), f.language, source, tuple(sorted(config)),
                 "i" if "IMMUTABLE" in f.attributes else "v", "s" if "PARALLEL SAFE" in f.attributes else "u"))  # fmt: skip
    return out


def model_objects(db: Scratch, model: Schema) -> dict[str, set[tuple[Any, ...]]]:
    """The model's tables, indexes and triggers created from the model itself (not from
    the file) as temporary objects in a transaction that is rolled back, and read back
    from the catalog: PostgreSQL prints both sides' definitions alike. The temporary
    tables take the model's names, and pg_temp comes first on the search_path, so the
    model's own references (a foreign key, a trigger's table) resolve to them."""
    with db.owner() as conn:
        for d in model.domains:  # the CHECKs cast to these
            conn.execute(d.create().replace("CREATE DOMAIN ", "CREATE DOMAIN pg_temp.", 1).encode())
        for t in model.tables:
            conn.execute(t.create().replace("CREATE TABLE ", "CREATE TEMP TABLE ", 1).encode())
        # A trigger function the model adds (1.2's limits counting) must exist for its
        # triggers to be created: made here too, and rolled back with the rest.
        existing = {r[0] for r in conn.execute("SELECT p.proname::text FROM pg_proc AS p"
                                               " WHERE p.pronamespace = %s::regnamespace", (db.schema,))}  # fmt: skip
        for f in model.functions:
            if f.name not in existing and any(g.function == f.name for g in model.triggers):
                conn.execute(f.create().encode())
        writer = writer_of(conn, db.schema, db.machine)
        triggers = [g.create(writer_role=writer) for g in model.triggers]
        for statement in [i.create() for i in model.indexes] + triggers:
            conn.execute(statement.encode())
        row = conn.execute("SELECT pg_catalog.pg_my_temp_schema()::oid").fetchone()
        assert row is not None
        objects = objects_in(conn, row[0])
        objects["functions"] = model_functions(conn, model, db.schema)
        conn.rollback()
    return objects


def database_objects(db: Scratch) -> dict[str, set[tuple[Any, ...]]]:
    with db.connect() as conn:
        row = conn.execute("SELECT %s::regnamespace::oid", (db.schema,)).fetchone()
        assert row is not None
        objects = objects_in(conn, row[0])
        objects["functions"] = functions_in(conn, db.schema)
    return objects


def assert_holds(db: Scratch, model: Schema) -> None:
    """The catalog holds `model`'s objects; a CHECK may be NOT VALID only where the model
    says old rows may break it (a history table's)."""
    got, want = database_objects(db), model_objects(db, model)
    # Outside the model: the function naming the installation's writer role, made by
    # the file's first block (its value is known only at install time).
    # (None without a writer role: 1.2's `postgres.writer_role: false`.)
    writer = {f for f in got["functions"] if f[0] == db.names.writer}
    made = [writer_of(db.superuser(), db.schema, db.machine)] if db.machine.postgres.writer_role else []
    assert [f[4] for f in writer] == made, writer
    got["functions"] -= writer
    not_valid = {(sql_ident(t), sql_ident(c)) for t, c, d in got["constraints"] if d.endswith(" NOT VALID")}
    history = {(t.name, c.name) for t in model.tables if t.history
               for c in t.constraints if c.check is not None}  # fmt: skip
    assert not_valid <= history, not_valid
    got["constraints"] = {(t, c, d.removesuffix(" NOT VALID")) for t, c, d in got["constraints"]}
    for kind in want:
        assert got[kind] == want[kind], (kind, got[kind] ^ want[kind])


def holds_the_model_of_new_renamed(db: Scratch, old_build: Build, old: Machine, new: Machine) -> None:
    """After the script, the catalog holds the model of NEW, and what the plan renamed
    is gone under its old name and there under its new one. (The migrated database of
    test_a_migrated_database_is_a_fresh_build_of_new_holding_every_row_and_event, which
    also checks, before the script, that the catalog holds the model of OLD: each case
    is built, filled and migrated once for both.)"""
    assert_holds(db, build(new).schema)
    renamed = renames(old_build, build(mid_machine(old, new)))
    names = {r[1] for rows in database_objects(db).values() for r in rows if len(r) > 1}
    names |= {r[0] for r in database_objects(db)["tables"]}
    assert not set(renamed.old_names) & names
    assert set(renamed.new_names) <= names | {s for _, _, s in renamed.sequences}


T = typing.TypeVar("T")


def the(kind: type[T], steps: Iterable[Operation]) -> T:
    """The one operation of `kind` among `steps`."""
    [found] = [s for s in steps if isinstance(s, kind)]
    return found


def test_the_plan_of_two_schemas_covers_what_the_next_spec_features_add() -> None:
    # What no migration case has yet, built on a real model: a view added, changed
    # and dropped, a parameter added to a function, a result type changed, a
    # column with a default, a default changed, a function removed.
    mid = build(spec("added_state", "old")).schema
    n = Names.of(spec("added_state", "old")).sql
    apply = next(f for f in mid.functions if f.name == n.apply)
    claim = next(f for f in mid.functions if f.name == n.claim)
    jobs = mid.tables[0]
    view = View("job_intervals", "SELECT id FROM jobs")
    mid = dataclasses.replace(mid, views=(view, View("job_old_view", "SELECT 1 AS one")))
    new_apply = dataclasses.replace(apply, parameters=(*apply.parameters, Parameter("note", "text", "NULL")))
    new_claim = dataclasses.replace(claim, returns="TABLE (id uuid, state_version bigint)")
    new_jobs = dataclasses.replace(jobs, columns=(
        *(dataclasses.replace(c, default="'claimed'") if c.name == "state" else c for c in jobs.columns),
        Column("deadline_at", "timestamptz", not_null=True, default="pg_catalog.now()")))  # fmt: skip
    new = dataclasses.replace(
        mid,
        tables=(new_jobs, *mid.tables[1:]),
        views=(dataclasses.replace(view, query="SELECT id, state FROM jobs"),),
        functions=tuple(new_apply if f is apply else new_claim if f is claim else f
                        for f in mid.functions if f.name != n.guard_insert),  # fmt: skip
    )
    [expanded] = expand(mid, new)  # the event log: nothing
    assert expanded == ExpandTable(
        "jobs", (Column("deadline_at", "timestamptz", not_null=True, default="pg_catalog.now()"),),
        (("state", "'claimed'"),), ())  # fmt: skip
    replaced = replace(mid, new)
    assert the(ReplaceViews, replaced) == ReplaceViews(("job_intervals",), new.views)
    assert the(ReplaceViews, replaced).statements == ("CREATE OR REPLACE VIEW job_intervals AS\nSELECT id, state FROM jobs;",)
    # CREATE OR REPLACE cannot change a result type; a new parameter makes another function.
    assert the(DropUnreplaceableFunctions, replaced) == DropUnreplaceableFunctions((new_claim.key,))
    assert the(ReplaceFunctions, replaced) == ReplaceFunctions(new.functions)
    assert contract(mid, new) == [DropObjects(
        triggers=(), functions=("job_apply(uuid, text, bigint, text, jsonb, text)", "job_guard_insert()"),
        views=("job_old_view",), indexes=())]  # fmt: skip
    unchanged = replace(mid, mid)
    assert expand(mid, mid) == contract(mid, mid) == []
    assert [type(s) for s in unchanged] == [ReplaceFunctions, ReplaceViews, RecreateTriggers]
    assert all(t.existed for t in the(RecreateTriggers, unchanged).triggers)
    # A column of another type is cast in place, its default dropped first and set again;
    # a column made NOT NULL has its NULLs filled with its default; an identity that
    # changes is a bug of ours.
    def jobs_with(**changed: Any) -> Schema:
        return dataclasses.replace(mid, tables=(dataclasses.replace(jobs, columns=tuple(
            dataclasses.replace(c, **changed) if c.name == "state" else c for c in jobs.columns)), *mid.tables[1:]))  # fmt: skip

    state = jobs.column("state")
    assert state is not None and state.not_null and state.default is not None
    assert expand(mid, jobs_with(type="varchar")) == [
        RetypeColumns("jobs", (RetypedColumn(dataclasses.replace(state, type="varchar"), True),))]  # fmt: skip
    assert expand(jobs_with(not_null=False), mid) == [RequireValues("jobs", (("state", state.default),))]
    assert expand(mid, jobs_with(not_null=False)) == [ExpandTable("jobs", (), (), (), ("state",))]
    with pytest.raises(AssertionError, match="without a default"):
        expand(jobs_with(not_null=False, default=None), jobs_with(default=None))
    with pytest.raises(AssertionError, match="cannot change column"):
        expand(mid, jobs_with(identity=True))


# --- the plan: what the script does, in what order ------------------------------------------

# The order the module docstring gives (operations of one rank may alternate).
ORDER: list[tuple[type, ...]] = [
    (Begin, RefuseOutsideTransaction), (SetLockTimeout,), (Guard,), (PrepareWriterRole,), (UpgradeFormat,),
    (RememberMovers,), (Renames,), (CreateTable, ExpandTable), (RetypeColumns,), (RequireValues,), (FillCountColumns,), (SetDueTimes,), (FillLimits,), (StartHeartbeats,), (ClearClaims,), (ReplaceIndexes,),
    (CreateDomains,), (DropUnreplaceableFunctions,), (ReplaceFunctions,), (ReplaceConstraints,),
    (ReplaceViews,), (RecreateTriggers,), (ValidateCheck, ValidateHistoryCheck), (DropObjects,),
    (ContractTable,), (DropTables,), (DropDomains,), (RecordDigest,), (PinFunctions,), (GrantMovers,), (Commit,),
]  # fmt: skip


def rank(step: Operation) -> int:
    return next(i for i, kinds in enumerate(ORDER) if isinstance(step, kinds))


@pytest.mark.parametrize("case", MIGRATING)
def test_the_plan_guards_expands_then_contracts_and_records_new_last(case: str) -> None:
    steps = plan_of(case)
    assert [rank(s) for s in steps] == sorted(rank(s) for s in steps), [type(s).__name__ for s in steps]
    assert isinstance(steps[0], Begin) and isinstance(steps[-1], Commit)
    assert sum(isinstance(s, Guard) for s in steps) == 1
    # Every CHECK added NOT VALID is validated once NEW's triggers are in place; the
    # event log's (history) where its history allows, the table's outright.
    added = [(s.table, c.constraint.name) for s in steps if isinstance(s, ReplaceConstraints) for c in s.checks]
    validated = [(s.table, s.name) if isinstance(s, ValidateCheck) else (s.table, s.constraint.name)
                 for s in steps if isinstance(s, ValidateCheck | ValidateHistoryCheck)]  # fmt: skip
    assert validated == added
    events = Names.of(spec(case, "new")).sql.events_table
    assert all((s.table == events) == isinstance(s, ValidateHistoryCheck)
               for s in steps if isinstance(s, ValidateCheck | ValidateHistoryCheck))  # fmt: skip
    # A CHECK casts to a domain created before it; a domain is dropped after the CHECKs
    # stop casting to it, and never one a CHECK of NEW casts to.
    created = [d.name for s in steps if isinstance(s, CreateDomains) for d in s.domains]
    casting = " ".join(c.constraint.definition for s in steps if isinstance(s, ReplaceConstraints) for c in s.checks)
    assert all(name in casting for name in created)
    dropped = [n for s in steps if isinstance(s, DropDomains) for n in s.names]
    assert not any(name in casting for name in dropped)
    # The count columns filled are the ones just added.
    columns = {c.name for s in steps if isinstance(s, ExpandTable) for c in s.columns}
    assert {c.column for s in steps if isinstance(s, FillCountColumns) for c in s.caps} <= columns
    # The digest function is NEW's only after every other function is.
    digest = the(RecordDigest, steps)
    assert all(f.name != digest.function.name for s in steps if isinstance(s, ReplaceFunctions) for f in s.functions)


@pytest.mark.parametrize("case", MIGRATING)
def test_the_script_is_one_transaction_with_nothing_but_comments_before_it(case: str) -> None:
    script = migrate(spec(case, "old"), spec(case, "new"))
    assert len(re.findall(r"^(BEGIN|COMMIT);$", script, re.MULTILINE)) == 2
    head, _, _ = script.partition("\nBEGIN;\n")
    assert all(line.startswith("--") for line in head.splitlines() if line), head
    assert script.endswith("\nCOMMIT;\n")


def test_without_its_own_transaction_the_plan_refuses_to_run_outside_one() -> None:
    steps = plan_of("added_state", transaction=False)
    assert isinstance(steps[0], RefuseOutsideTransaction) and not any(isinstance(s, Begin | Commit) for s in steps)
    assert plan_of("added_state")[1:-1] == steps[1:]


def test_every_operation_renders_by_the_macro_named_after_it() -> None:
    env = environment()
    source, _, _ = env.loader.get_source(env, "migrate.sql.j2")  # type: ignore[union-attr]
    macros = {m.name for m in env.parse(source).find_all(jinja2.nodes.Macro) if not m.name.startswith("_")}
    kinds = {*typing.get_args(Operation), RefuseIfRowsIn, RefuseIfPastCaps, RefuseIfPastLimits}  # the guard's parts
    assert {macro_name(k) for k in kinds} == macros
    # Every record of the operations module is an operation or a part of one (the
    # format's steps are fsmc.targets.postgres.formats').
    defined = {k for _, k in inspect.getmembers(operations, inspect.isclass) if k.__module__ == operations.__name__}
    assert defined == kinds - {UpgradeFormat} | {CapChange, NewCheck, RecreatedTrigger, RetypedColumn}


def test_every_step_of_the_script_is_exercised_by_some_case() -> None:
    steps = [s for case in MIGRATING for t in (True, False) for s in plan_of(case, transaction=t)]
    # Functions CREATE OR REPLACE cannot change: no spec change makes one yet (the test above).
    assert {type(s) for s in steps} == set(typing.get_args(Operation)) - {DropUnreplaceableFunctions}

    def some(kind: type[Operation], has: Callable[[Any], object]) -> bool:
        return any(isinstance(s, kind) and has(s) for s in steps)

    assert some(Guard, lambda g: g.rows_in) and some(Guard, lambda g: g.past_caps)
    assert some(Renames, lambda r: r.constraints) and some(Renames, lambda r: r.indexes) and some(Renames, lambda r: r.sequences)
    assert some(ExpandTable, lambda t: t.defaults) and some(ExpandTable, lambda t: ("fillfactor", "90") in t.options)
    assert some(ExpandTable, lambda t: t.allow_null) and some(RetypeColumns, lambda r: any(c.had_default for c in r.columns))
    assert some(RetypeColumns, lambda r: any(not c.had_default for c in r.columns))
    assert some(ReplaceIndexes, lambda i: i.dropped) and some(RecreateTriggers, lambda g: g.triggers)
    assert some(ReplaceConstraints, lambda c: any(not k.replaces for k in c.checks))
    assert some(DropObjects, lambda d: d.functions) and some(DropObjects, lambda d: d.indexes)
    for field in ("constraints", "columns", "options"):
        assert some(ContractTable, lambda t: getattr(t, field)), field  # noqa: B023 (called here)


@pytest.mark.slow
def test_the_script_is_deterministic_and_records_both_specs() -> None:
    old, new = spec("added_state"), spec("added_state", "new")
    script = migrate(old, new)
    # The same script from two other processes, each with its own string hashing (so
    # its own set and dict-of-set order): nothing in it depends on the process.
    for seed in ("1", "2"):
        ran = subprocess.run(
            [sys.executable, "-m", "fsmc", "migrate", "tests/migrate_cases/added_state/old.yaml",
             "tests/migrate_cases/added_state/new.yaml"],
            cwd=CASES.parent.parent, capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONDONTWRITEBYTECODE": "1"},
        )  # fmt: skip
        assert (ran.returncode, ran.stderr) == (0, ""), ran.stderr
        assert ran.stdout == script, seed
    assert script.startswith("-- Code generated by fsmc migrate from tests/migrate_cases/added_state/old.yaml"
                             " to tests/migrate_cases/added_state/new.yaml. DO NOT EDIT.\n")  # fmt: skip
    for text in (old.sha256, new.sha256, machine_digest(old), machine_digest(new), "+ state cancelled"):
        assert text in script


def test_identity_sequence_names_follow_postgresql(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for table in ("t", "work_items", "x" * 54, "y" * 55, "z" * 63):
            schema = f"fsmc_seq_{uuid.uuid4().hex[:12]}"
            conn.execute(f"CREATE SCHEMA {schema}".encode())
            try:
                conn.execute(f"CREATE TABLE {schema}.{table} (id bigint GENERATED BY DEFAULT AS IDENTITY)".encode())
                got = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", (f"{schema}.{table}",)).fetchone()
                assert got == (f"{schema}.{identity_sequence(table, 'id')}",), table
            finally:
                conn.execute(f"DROP SCHEMA {schema} CASCADE".encode())


# --- the command line ---------------------------------------------------------------------


def test_cli_prints_the_script_and_writes_it_atomically_with_out(
    fsmc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(CASES.parent.parent)  # headers name specs relative to the working directory
    old, new = CASES / "added_state" / "old.yaml", CASES / "added_state" / "new.yaml"
    ran = fsmc("migrate", old, new)
    assert ran.code == 0 and ran.err == ""
    assert ran.out == migrate(spec("added_state"), spec("added_state", "new"))
    target = tmp_path / "migrate.sql"
    target.write_text("stale")
    ran = fsmc("migrate", old, new, "--out", target)
    assert (ran.code, ran.out, ran.err) == (0, "", "")
    assert target.read_text() == fsmc("migrate", old, new).out
    assert os.listdir(tmp_path) == ["migrate.sql"]  # nothing staged beside it
    same = CASES / "identical" / "old.yaml"
    assert (r := fsmc("migrate", same, same)).code == 0 and r.out == "" and r.err == ""
    ran = fsmc("migrate", same, CASES / "reordered" / "new.yaml", "--out", target)
    assert ran.code == 0 and target.read_text() == ""  # the stale script does not survive


def test_cli_exit_codes(fsmc: Any, tmp_path: Path) -> None:
    good = CASES / "added_state" / "old.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("initial: queued", "initial: queud"))
    target = tmp_path / "out.sql"
    ran = fsmc("migrate", good, bad, "--out", target)
    assert ran.code == 1 and "unknown-state" in ran.err and "nothing written" in ran.err
    assert not target.exists()
    for case in ("id_type_changed", "swapped_tables"):
        ran = fsmc("migrate", CASES / case / "old.yaml", CASES / case / "new.yaml", "--out", target)
        assert ran.code == 2 and ran.err.startswith("fsmc: error: cannot migrate"), ran
        assert not target.exists()
    other = tmp_path / "other.yaml"
    other.write_text(good.read_text().replace("machine: job", "machine: jab"))
    ran = fsmc("migrate", good, other)
    assert ran.code == 2 and "a renamed machine is a new one" in ran.err
    assert fsmc("migrate", good, tmp_path / "missing.yaml").code == 2
    assert fsmc("migrate", good, good, "--out", tmp_path / "no" / "dir.sql").code == 2


def test_cli_reads_old_from_git(fsmc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    monkeypatch.chdir(tmp_path)
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text((CASES / "added_state" / "old.yaml").read_text())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(git + ["add", "job.yaml"], check=True)
    subprocess.run(git + ["commit", "-qm", "v1"], check=True)
    spec_path.write_text((CASES / "added_state" / "new.yaml").read_text())
    ran = fsmc("migrate", "HEAD:job.yaml", "job.yaml")
    assert ran.code == 0, ran
    # The header names OLD with its revision (issue 23), NEW by its path.
    assert ran.out == migrate(spec("added_state"), spec("added_state", "new")).replace(
        "tests/migrate_cases/added_state/old.yaml", "HEAD:job.yaml").replace(
        "tests/migrate_cases/added_state/new.yaml", "job.yaml")  # fmt: skip
