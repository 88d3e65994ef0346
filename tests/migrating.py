"""What the migration tests share (tests/test_migrate.py, tests/test_migrate_format.py):
the cases' specs and the plans `fsmc migrate` makes for them, scratch installations
built from them and migrated, running a script as the owner with psql, filling a
database with history, and reading back its catalog and its data.

Contract 4.2's checks are tests/test_postgres.py's own tests, run here on a migrated
database (BEHAVIOURS): the one import of a test module left in the suite, until those
checks move into a helper module of their own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fsmc.migrate import mid_machine, plan, renames
from fsmc.model import Machine
from fsmc.targets.postgres.build import build
from fsmc.targets.postgres.names import Names
from fsmc.targets.postgres.operations import Plan
from tests import test_postgres as tp
from tests.pg_scratch import (
    Scratch,
    default_writer_role,
    machine_from_text,
    shortest_walk,
    states_reachable,
    without_writer_role,
    writer_of,
)

CASES = Path(__file__).resolve().parent / "migrate_cases"


def spec(case: str, name: str = "old") -> Machine:
    """A case's spec; without a writer role under FSMC_TEST_WRITER_ROLE=0 (both sides
    alike: migrate refuses to change the mode)."""
    path = CASES / case / f"{name}.yaml"
    machine = machine_from_text(path.read_text(encoding="utf-8"), f"tests/migrate_cases/{case}/{name}.yaml")
    return machine if default_writer_role() else without_writer_role(machine)


def plan_of(case: str, *, transaction: bool = True) -> Plan:
    """The plan `fsmc migrate` makes for a case, over the three builds it makes."""
    old, new = spec(case, "old"), spec(case, "new")
    before, mid = build(old), build(mid_machine(old, new))
    return plan(before, mid, build(new), renames(before, mid), transaction=transaction)


@contextmanager
def built(dsn: str, machine: Machine) -> Iterator[Scratch]:
    scratch = Scratch.create(dsn, machine)
    try:
        yield scratch
    finally:
        scratch.drop()


@dataclass
class Migrated(Scratch):
    """A scratch schema migrated to `machine` from earlier ones. `past` holds, for each
    earlier machine in order, the version each row had when the database left it:
    the log replays a row under each machine in turn (test_postgres's tests call
    `replay_problems` on it)."""

    past: tuple[tuple[Machine, dict[Any, int]], ...] = ()

    def eras_of(self, row_id: Any, version: int) -> list[tuple[Machine, int]]:
        eras = [(m, versions[row_id]) for m, versions in self.past if row_id in versions]
        return [*eras, (self.machine, version)]


def migrated(db: Scratch, new: Machine, *past: tuple[Machine, dict[Any, int]]) -> Migrated:
    # Shares the connection list, so db.drop() closes its connections too.
    return Migrated(db.dsn, new, db.role, db.schema, db.sql_text, db.app_role, db._open, past)


# --- running a script ---------------------------------------------------------------


def psql(db: Scratch, script: str, *, search_path: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `script` as the schema's owner, as the module docstring says to."""
    if shutil.which("psql") is None:
        if os.environ.get("FSMC_REQUIRE_PG"):
            pytest.fail("FSMC_REQUIRE_PG is set but psql is not installed")
        pytest.skip("psql is not installed")
    conninfo = make_conninfo(db.dsn, user=db.role, options=f"-c search_path={search_path or db.schema}")
    return subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", conninfo],
                          input=script, capture_output=True, text=True, timeout=60)  # fmt: skip


def migrate_ok(db: Scratch, script: str) -> str:
    ran = psql(db, script)
    assert ran.returncode == 0, ran.stderr
    assert "ERROR" not in ran.stderr and "WARNING" not in ran.stderr, ran.stderr
    return ran.stderr


def refused(db: Scratch, script: str, **kwargs: Any) -> str:
    ran = psql(db, script, **kwargs)
    assert ran.returncode != 0, ran.stderr
    assert "ERROR" in ran.stderr, ran.stderr
    return ran.stderr


def refused_changing_nothing(db: Scratch, machine: Machine, script: str, **kwargs: Any) -> str:
    """The error of a refused `script`, after which catalog and data are as they were."""
    before = snapshot(db, machine)
    error = refused(db, script, **kwargs)
    assert snapshot(db, machine) == before
    return error


# --- filling a database ---------------------------------------------------------------


def fill(db: Scratch, *, keep: set[str] | None = None) -> None:
    """A row that took each transition, a row in each state, a newborn row; then, with
    `keep`, rows outside it walked on until they are in it (through _apply: history)."""
    m = db.machine
    with db.connect() as conn:
        for source, event, target in m.edges:
            row_id, version = db.row_at(conn, source)
            assert db.apply(conn, row_id, event, version, actor="history", payload=f'{{"edge": "{source} {event}"}}',
                            to_state=db.to_state(source, event, target)) == version + 1  # fmt: skip
            conn.commit()
        for state in states_reachable(m):
            db.row_at(conn, state)
        db.new_row(conn)
        conn.commit()
        if keep is None:
            return
        for row_id, state, version in conn.execute(db.q("SELECT id, state, state_version FROM {table}")).fetchall():
            db.walk(conn, row_id, state, version, shortest_walk(m, state, keep), actor="history")
        conn.commit()


@dataclass(frozen=True)
class Data:
    rows: dict[Any, tuple[Any, ...]]  # id -> (state, state_version, claimed_by, claimed_at, heartbeat_at)
    events: list[tuple[Any, ...]]  # every column, in key order

    @property
    def versions(self) -> dict[Any, int]:
        return {row_id: row[1] for row_id, row in self.rows.items()}


def data(db: Scratch, machine: Machine) -> Data:
    n = Names.of(machine).sql
    claims = "claimed_by, claimed_at, heartbeat_at" if machine.lease else "NULL, NULL, NULL"
    with psycopg.connect(db.dsn, options=f"-c search_path={db.schema}") as conn:
        rows = conn.execute(f"SELECT id, state, state_version, {claims} FROM {n.table}".encode()).fetchall()
        events = conn.execute(f"SELECT {n.id_column}, version, from_state, event, to_state, actor, at,"
                              f" payload FROM {n.events_table} ORDER BY 1, 2".encode()).fetchall()  # fmt: skip
    return Data({r[0]: tuple(r[1:]) for r in rows}, [tuple(e) for e in events])


# --- the catalog ----------------------------------------------------------------------

CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions, pg_get_userbyid(c.relowner),
               (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(c.relacl) a)::text
        FROM pg_class c WHERE c.relnamespace = %(ns)s::regnamespace""",
    # By name, not position: a migration appends the columns it adds (ALTER TABLE can
    # do no other), where a fresh build may have placed them among the others.
    "columns": """
        SELECT c.relname, a.attname,
               format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
               a.attidentity, a.attgenerated, a.attcollation::regcollation::text,
               (SELECT array_agg(x::text ORDER BY x::text) FROM unnest(a.attacl) x)::text
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = %(ns)s::regnamespace AND c.relkind = 'r'
          AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable,
               k.condeferred, k.connoinherit
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE k.connamespace = %(ns)s::regnamespace""",
    "indexes": """
        SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisvalid
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE c.relnamespace = %(ns)s::regnamespace""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               pg_get_userbyid(p.proowner),
               (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(p.proacl) a)::text
        FROM pg_proc p WHERE p.pronamespace = %(ns)s::regnamespace""",
    "domains": """
        SELECT t.typname, pg_catalog.format_type(t.typbasetype, t.typtypmod), k.conname,
               pg_catalog.pg_get_constraintdef(k.oid), t.typacl::text[]
        FROM pg_catalog.pg_type t JOIN pg_catalog.pg_constraint k ON k.contypid = t.oid
        WHERE t.typnamespace = %(ns)s::regnamespace AND t.typtype = 'd'""",
    "triggers": """
        SELECT t.tgname, c.relname, pg_get_triggerdef(t.oid), t.tgenabled, t.tgdeferrable,
               t.tginitdeferred
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = %(ns)s::regnamespace AND NOT t.tgisinternal""",
    "sequences": """
        SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmax,
               s.seqmin, s.seqcache, s.seqcycle, t.relname, a.attname, d.deptype
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
                        AND d.refclassid = 'pg_class'::regclass
        JOIN pg_class t ON t.oid = d.refobjid
        JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid
        WHERE c.relnamespace = %(ns)s::regnamespace""",
    "types": """
        SELECT t.typname, t.typtype FROM pg_type t
        WHERE t.typnamespace = %(ns)s::regnamespace AND t.typtype NOT IN ('c', 'b')""",
}


@dataclass(frozen=True)
class Catalog:
    objects: dict[str, list[tuple[Any, ...]]]
    not_valid: frozenset[str]  # constraints not validated


def catalog(db: Scratch) -> Catalog:
    """The schema as the catalog describes it, with schema and role names normalised
    (a search_path that does not reach the schema makes every name qualified), and each
    object's grants sorted (an ACL's order depends on the order of the GRANTs, not on
    who may do what)."""

    with psycopg.connect(db.dsn) as conn:
        writer = writer_of(conn, db.schema, db.machine) or "no writer"

    def normal(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(writer, "WRITER").replace(db.schema, "SCHEMA").replace(db.role, "OWNER").replace(db.app_role, "APP").removesuffix(" NOT VALID")
        if isinstance(value, list):
            return [normal(v) for v in value]
        return value

    objects: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(db.dsn, options="-c search_path=pg_catalog") as conn:
        for kind, query in CATALOG.items():
            rows = conn.execute(query.encode(), {"ns": db.schema}).fetchall()
            objects[kind] = sorted((tuple(normal(v) for v in r) for r in rows), key=repr)
        not_valid = conn.execute("SELECT conname FROM pg_constraint WHERE NOT convalidated"
                                 " AND connamespace = %s::regnamespace", (db.schema,)).fetchall()  # fmt: skip
    return Catalog(objects, frozenset(n for (n,) in not_valid))


def assert_same_schema(got: Catalog, want: Catalog) -> None:
    for kind in CATALOG:
        assert got.objects[kind] == want.objects[kind], kind


# --- the behaviours of contract 4.2, from tests/test_postgres.py -----------------------

BEHAVIOURS: list[Callable[[Scratch], None]] = [
    tp.test_no_enum_type_states_are_text_with_a_check,
    tp.test_every_event_column_is_not_null_but_payload,
    tp.test_a_row_is_born_in_the_initial_state_at_version_0,
    tp.test_a_row_cannot_be_born_in_any_other_state_or_version,
    tp.test_apply_moves_along_every_transition_and_appends_its_event,
    tp.test_apply_refuses_every_illegal_pair_naming_state_and_event,
    tp.test_apply_raises_on_an_unknown_event_and_an_unknown_id,
    tp.test_apply_checks_the_version_before_the_event,
    tp.test_a_direct_update_to_an_undeclared_state_fails_the_check,
    tp.test_a_direct_update_along_an_edge_the_spec_lacks_fails,
    tp.test_a_direct_update_out_of_a_terminal_state_fails,
    tp.test_a_state_change_must_bump_state_version_by_exactly_one,
    tp.test_a_state_change_without_its_event_row_fails_at_commit,
    tp.test_an_event_row_without_its_state_change_fails_at_commit,
    tp.test_the_event_log_admits_only_the_specs_triples,
    tp.test_the_event_log_is_unique_per_row_and_version,
    tp.test_the_event_log_refuses_update_delete_and_truncate,
    tp.test_writes_that_leave_the_state_alone_pass_untouched,
    tp.test_the_schema_records_the_machine_digest,
]
LEASE_BEHAVIOURS: list[Callable[[Scratch], None]] = [
    tp.test_lease_bookkeeping_on_every_transition,
    tp.test_heartbeat_is_fenced_by_version_and_lease_state,
    tp.test_reclaim_moves_every_stale_lease_row_and_nothing_else,
    tp.test_the_reclaim_index_is_partial_over_the_lease_states_and_does_not_cover_heartbeat,
]


def behaves_as_contract_4_2(db: Migrated) -> None:
    for behaviour in BEHAVIOURS + (LEASE_BEHAVIOURS if db.machine.lease else []):
        behaviour(db)
    with db.connect() as conn:
        assert db.replay_problems(conn) == []


def snapshot(db: Scratch, machine: Machine) -> tuple[Catalog, Data]:
    return catalog(db), data(db, machine)
