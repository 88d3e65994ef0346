"""Scratch databases for the PostgreSQL tests: one fresh schema, owned by one fresh
non-superuser role, per test, so tests run in parallel under pytest-xdist.

`Scratch.create(dsn, machine)` makes a LOGIN role (not a superuser), a schema it
owns, and loads the machine's generated `.sql` into it *as that role*: every test
is first a proof that the file applies cleanly as a non-superuser owner. It also
makes the application's role, with exactly the grants docs/postgres.md lists
(`install.app_grants`) and PostgreSQL's defaults (TEMPORARY on the database, EXECUTE on
functions): applications never connect as the owner, and neither do the tests that
play one. `scratch.connect()` opens a connection as the application role,
`scratch.owner()` one as the owner (for DDL and migrations), both with
`search_path` set to the schema; `scratch.superuser()` one as the DSN's user (for
auto_explain and the statistics views). `scratch.drop()` removes schema and roles.

Two modes (issue 23, item 10): with a writer role (the default; the owner has
CREATEROLE and the file makes the role), or without one (`writer_role=False`: the
machine built with 1.2's `postgres.writer_role: false`, installed by an owner with
NOCREATEROLE, no role made beforehand; every write is checked). A database test
module runs both in one process by parametrizing its fixture with `installs(...)`;
FSMC_TEST_WRITER_ROLE=0 makes the second the default of every scratch (for a whole
run of the database suite in that mode).

Also: reading machines from specs/, walking a row to a state through `_apply`,
replaying the event log, and importing the generated Python module.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fsmc import pipeline, source
from fsmc.escape import sql_ident
from fsmc.model import Machine
from fsmc.targets import generate
from fsmc.targets.common import Paths
from fsmc.targets.postgres import names
from fsmc.targets.postgres.build import build, emit
from fsmc.targets.postgres.install import app_grants
from fsmc.targets.postgres.names import Names, Quoted
from tests.conftest import SPECS
from tests.harness import drop_roles, writer_role

# "capped_task" is specs/task.yaml as language 1.1 wrote it (`capped_task_spec`): the
# machine with a cap that refuses past its limit, text ids and a lease that these
# tests were written against, whose retry any caller may fire at once.
# specs/task.yaml itself makes a failed task wait out a backoff first and moves a
# spent retry to dead (1.2), which its generated suite proves, database part included.
SPEC_NAMES = ("job", "runner", "capped_task")
LEASE_SPEC_NAMES = ("job", "capped_task")  # runner has no lease
# Guards against a hang, not claims about speed: a test that waits for a lock on
# purpose holds it for milliseconds, but on a loaded shared machine those can last.
TIMEOUTS = "-c lock_timeout=30s -c statement_timeout=120s"

# What an application role needs, and all it gets: `install.app_grants`, docs/postgres.md's list.


def installs(spec_names: tuple[str, ...]) -> list[Any]:
    """Fixture params: each spec (id: its name) with a writer role, then each without
    one (id: `<name>-no-writer`); a fixture passes `request.param` on as
    `Scratch.create(dsn, machine_of(name), writer_role=writer_role)`."""
    return [pytest.param((name, writer_role), id=name if writer_role else f"{name}-no-writer")
            for writer_role in (True, False) for name in spec_names]  # fmt: skip


def without_writer_role(machine: Machine) -> Machine:
    """`machine` as if its spec said `postgres: {writer_role: false}`."""
    return dataclasses.replace(machine, postgres=dataclasses.replace(machine.postgres, writer_role=False))


def default_writer_role() -> bool:
    """Whether a scratch has a writer role unless told: yes, but under FSMC_TEST_WRITER_ROLE=0."""
    return os.environ.get("FSMC_TEST_WRITER_ROLE", "1") != "0"


def count_column(event: str) -> str:
    """A capped event's count column, as SQL spells it."""
    return sql_ident(names.count_column(event))


def writer_of(conn: psycopg.Connection[Any], schema: str, machine: Machine) -> str | None:
    """The writer role of `machine`'s installation in `schema` (None: not installed)."""
    return writer_role(conn, schema, Names.of(machine).writer)


def drop_writer(admin: psycopg.Connection[Any], writer: str | None) -> None:
    """Drop an installation's writer role (after its schema): roles outlive schemas."""
    if writer is not None:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(writer)))
    drop_roles(admin, [writer])


def machine_of(name: str) -> Machine:
    """specs/<name>.yaml's machine, or "capped_task" (`capped_task_spec`)."""
    if name == "capped_task":
        return machine_from_text(capped_task_spec(), "capped_task.yaml")
    return machine_from_text((SPECS / f"{name}.yaml").read_text(encoding="utf-8"), f"{name}.yaml")


def capped_task_spec() -> str:
    """specs/task.yaml without its retry's backoff and `otherwise` (language 1.2): the
    task machine of language 1.1, whose retry is refused once its cap of 5 is spent
    (an application gave up by hand). The machine keeps its name, so its SQL names
    are the task machine's."""
    text = (SPECS / "task.yaml").read_text(encoding="utf-8")
    timed = "event: retry, to: new, after: {backoff: 3s, factor: 2, max: 5m}, otherwise: dead}"
    assert text.count(timed) == 1, "specs/task.yaml's retry changed: update capped_task_spec"
    return text.replace(timed, "event: retry, to: new}")


def machine_from_text(text: str, path: str = "spec.yaml") -> Machine:
    checked = pipeline.check(source.Source(path, path, text.encode()))
    assert checked.machine is not None and checked.ok(), checked.diagnostics
    return checked.machine


@dataclass
class Scratch:
    dsn: str
    machine: Machine
    role: str
    schema: str
    sql_text: str
    app_role: str
    _open: list[psycopg.Connection[Any]] = field(default_factory=list)

    @staticmethod
    def create(dsn: str, machine: Machine, sql_text: str | None = None, *,
               writer_role: bool | None = None) -> Scratch:  # fmt: skip
        """`machine` installed in a fresh schema; `writer_role=False` (or, when not
        given, FSMC_TEST_WRITER_ROLE=0) installs it without a writer role."""
        if not (default_writer_role() if writer_role is None else writer_role):
            machine = without_writer_role(machine)
        tag = uuid.uuid4().hex[:12]
        text = emit(build(machine)) if sql_text is None else sql_text
        scratch = Scratch(dsn, machine, f"fsmc_owner_{tag}", f"fsmc_test_{tag}", text,
                          f"fsmc_app_{tag}")  # fmt: skip
        # With a writer role the owner may create roles: the file makes its installation's
        # writer role. Without one, it may not (Heroku's owner), and needs none.
        createrole = "CREATEROLE" if machine.postgres.writer_role else "NOCREATEROLE"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB " + createrole)
                          .format(sql.Identifier(scratch.role)))  # fmt: skip
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
                          .format(sql.Identifier(scratch.app_role)))  # fmt: skip
            admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(scratch.schema), sql.Identifier(scratch.role)))  # fmt: skip
        try:
            with scratch.owner() as owner:
                row = owner.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
                assert row == (False,), "the owner must not be a superuser"
                owner.execute(text.encode())  # no parameters: psycopg sends it as one script
                if sql_text is None:
                    owner.execute(scratch.grants())
                owner.commit()
        except BaseException:
            scratch.drop()
            raise
        return scratch

    def grants(self) -> bytes:
        """`install.app_grants` (docs/postgres.md's list) for this schema and application role."""
        return "\n".join(app_grants(build(self.machine).install, self.schema, self.app_role)).encode()

    def as_owner(self, query: str, params: Any = None) -> None:
        """Run `query` (`q`'s placeholders) as the owner and commit: for what the
        application role may not do, such as backdating a heartbeat to make a lease
        stale without waiting for it (the columns of times are the database's)."""
        with self.owner() as owner:
            owner.execute(self.q(query), params)
            owner.commit()

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        """A connection as the application role, search_path = the scratch schema. A
        lock wait past LOCK_TIMEOUT fails the test instead of hanging it."""
        return self._connect(self.app_role, autocommit)

    def owner(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        """A connection as the schema's owner, search_path = the scratch schema."""
        return self._connect(self.role, autocommit)

    def _connect(self, role: str, autocommit: bool) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn, user=role, autocommit=autocommit,
                               options=f"-c search_path={self.schema} {TIMEOUTS}")  # fmt: skip
        self._open.append(conn)
        return conn

    def superuser(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn, autocommit=autocommit,
                               options=f"-c search_path={self.schema} {TIMEOUTS}")  # fmt: skip
        self._open.append(conn)
        return conn

    def drop(self) -> None:
        for conn in self._open:
            conn.close()
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            # Sessions of this role that a failed test left behind would block DROP ROLE.
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE usename IN (%s, %s) AND pid <> pg_backend_pid()",
                          (self.role, self.app_role))  # fmt: skip
            writer = writer_of(admin, self.schema, self.machine)
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
            drop_writer(admin, writer)
            for role in (self.app_role, self.role):
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))

    # --- names, as the generated SQL spells them --------------------------------

    @functools.cached_property
    def names(self) -> Quoted:
        # Once a scratch: `q` reads it for every statement, and Names.of builds them all.
        return Names.of(self.machine).sql

    def q(self, template: str) -> bytes:
        """`template` with {table}, {events}, {id_col}, {apply}, ... filled in."""
        n = self.names
        return template.format(
            table=n.table, events=n.events_table, id_col=n.id_column, apply=n.apply,
            heartbeat=n.heartbeat, reclaim=n.reclaim, claim=n.claim, purge=n.purge,
            intervals=n.intervals, digest=n.digest, lease_idx=n.lease_index,
        ).encode()  # fmt: skip

    # --- rows ---------------------------------------------------------------------

    def new_row(self, conn: psycopg.Connection[Any], state: str | None = None) -> Any:
        """A fresh row in the default initial state, or in `state` (another initial
        one); its id."""
        if self.machine.postgres.id_type == "text":
            row = conn.execute(self.q("INSERT INTO {table} (id, state) VALUES (%s, %s) RETURNING id"),
                               (f"id-{uuid.uuid4().hex}", state or str(self.machine.initial))).fetchone()  # fmt: skip
        elif state is not None:
            row = conn.execute(self.q("INSERT INTO {table} (state) VALUES (%s) RETURNING id"), (state,)).fetchone()
        else:
            row = conn.execute(self.q("INSERT INTO {table} DEFAULT VALUES RETURNING id")).fetchone()
        assert row is not None
        return row[0]

    def apply(self, conn: psycopg.Connection[Any], row_id: Any, event: str, version: int,
              actor: str = "tester", payload: str | None = None, to_state: str | None = None) -> int | None:  # fmt: skip
        """`<machine>_apply`; `to_state` only when given (a choice needs it), so the call
        also reaches a database an older fsmc built, whose `_apply` has no such parameter."""
        if to_state is None:
            got = conn.execute(self.q("SELECT {apply}(%s, %s, %s, %s, %s::jsonb)"),
                               (row_id, event, version, actor, payload)).fetchone()  # fmt: skip
        else:
            got = conn.execute(self.q("SELECT {apply}(%s, %s, %s, %s, %s::jsonb, %s)"),
                               (row_id, event, version, actor, payload, to_state)).fetchone()  # fmt: skip
        assert got is not None
        return None if got[0] is None else int(got[0])

    def to_state(self, source: str, event: str, target: str) -> str | None:
        """What `apply` passes as to_state to move along (source, event, target): the
        target where the pair is a choice (which needs it), else nothing."""
        return target if (source, event) in self.machine.choices else None

    def walk(self, conn: psycopg.Connection[Any], row_id: Any, state: str, version: int, events: list[str],
             actor: str = "tester") -> int:  # fmt: skip
        """Fire `events` from `state` at `version` along the machine's transitions (a choice's first
        target, named in to_state), as `shortest_walk` plans; the version reached."""
        for event in events:
            target = self.machine.targets[state, event][0]
            got = self.apply(conn, row_id, event, version, actor=actor, to_state=self.to_state(state, event, target))
            assert got == version + 1, (state, event, got)
            state, version = target, got
        return version

    def wait_until_blocked(self, conn: psycopg.Connection[Any], call: Any) -> None:
        """Until `conn`'s backend waits on a lock (asked of the server, not slept for);
        `call` is the future running on it, which must not have finished."""
        pid = conn.info.backend_pid
        deadline = time.monotonic() + 60  # a guard against hanging, not a claim
        with psycopg.connect(self.dsn, autocommit=True) as su:
            while True:
                row = su.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                if row is not None and row[0] == "Lock":
                    return
                assert not call.done(), "the call must wait for the lock"
                assert time.monotonic() < deadline, "the call never reached the lock"
                time.sleep(0.01)

    def asleep(self, conn: psycopg.Connection[Any]) -> None:
        """Until `conn`'s backend sleeps in a wait_for() (idle, its last query the
        question `_claimable_in`)."""
        pid = conn.info.backend_pid
        with psycopg.connect(self.dsn, autocommit=True) as su:
            for _ in range(1000):
                row = su.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                if row is not None and row[0] == "idle" and "claimable_in" in row[1]:
                    return
                time.sleep(0.005)
        raise AssertionError("the waiter never went to sleep")

    @staticmethod
    def clock(conn: psycopg.Connection[Any]) -> Any:
        """The server's clock now (`clock_timestamp()`, not the transaction's start): a
        stamp the database writes lies between a reading before the write and one after."""
        got = conn.execute("SELECT pg_catalog.clock_timestamp()").fetchone()
        assert got is not None
        return got[0]

    def row(self, conn: psycopg.Connection[Any], row_id: Any) -> tuple[str, int]:
        got = conn.execute(self.q("SELECT state, state_version FROM {table} WHERE id = %s"),
                           (row_id,)).fetchone()  # fmt: skip
        assert got is not None
        return str(got[0]), int(got[1])

    def events_of(self, conn: psycopg.Connection[Any], row_id: Any) -> list[tuple[Any, ...]]:
        """(version, from_state, event, to_state, actor) of a row, in version order."""
        return [tuple(r) for r in conn.execute(self.q(
            "SELECT version, from_state, event, to_state, actor FROM {events}"
            " WHERE {id_col} = %s ORDER BY version"), (row_id,)).fetchall()]  # fmt: skip

    def row_at(self, conn: psycopg.Connection[Any], state: str) -> tuple[Any, int]:
        """A fresh row walked to `state` through `_apply` (committed); (id, version). A
        state only a spent budget leads to (1.2's `otherwise`): its budget spent by hand."""
        m = self.machine
        if state not in states_reachable(m):
            (source, event), (_, budget) = next(k for k in m.otherwise.items() if k[1][0] == state)
            row_id, version = self.row_at(conn, source)
            self.spend(row_id, budget)
            got = self.apply(conn, row_id, event, version, to_state=self.to_state(source, event, m.targets[source, event][0]))
            conn.commit()
            assert got == version + 1 and self.row(conn, row_id) == (state, got)
            self.make_due(row_id)
            return row_id, got
        born, events = birth(self.machine, state)
        row_id = self.new_row(conn, born)
        version = self.walk(conn, row_id, born, 0, events)
        conn.commit()
        self.make_due(row_id)
        return row_id, version

    def make_due(self, row_id: Any) -> None:
        """A row that waits for time (1.2's `after`) made due, as only the owner can: the
        tests fire timed events without sleeping out their timers."""
        if not self.machine.timers:
            return
        with self.owner() as owner:
            owner.execute(self.q("UPDATE {table} SET due_at = now() - interval '1 second'"
                                 " WHERE id = %s AND due_at IS NOT NULL"), (row_id,))  # fmt: skip
            owner.commit()

    def spend(self, row_id: Any, event: str) -> None:
        """Set a row's count of a capped event to its cap, as only the owner can (the
        table's triggers off for that one write), committed."""
        count = sql_ident(names.count_column(event))
        cap = sql_ident(names.cap_column(event)) if event in self.machine.per_row_caps else str(self.machine.cap_limits[event])
        with self.owner() as owner:
            owner.execute(self.q("ALTER TABLE {table} DISABLE TRIGGER USER"))
            owner.execute(self.q(f"UPDATE {{table}} SET {count} = {cap} WHERE id = %s"), (row_id,))
            owner.execute(self.q("ALTER TABLE {table} ENABLE TRIGGER USER"))
            owner.commit()

    def eras_of(self, row_id: Any, version: int) -> list[tuple[Machine, int]]:
        """The machines a row's events were written under, each with the last version
        it wrote (a migrated database has more than one)."""
        return [(self.machine, version)]

    def replay_problems(self, conn: psycopg.Connection[Any]) -> list[str]:
        """Rows whose event log does not replay to their state and version."""
        problems = []
        rows = conn.execute(self.q("SELECT id, state, state_version FROM {table}")).fetchall()
        for row_id, state, version in rows:
            eras = self.eras_of(row_id, version)
            log = self.events_of(conn, row_id)
            current, at = (log[0][1] if log else state), 0  # where it was born
            if current not in eras[0][0].initial_names:
                problems.append(f"{row_id}: born in {current}, not an initial state")
            for v, frm, event, to, _actor in log:
                m = next(m for m, upto in eras if v <= upto)
                moves = (*m.targets.get((frm, event), ()), *m.otherwise.get((frm, event), ())[:1])
                if v != at + 1 or frm != current or to not in moves:
                    problems.append(f"{row_id}: event {v} {frm}-{event}->{to} after {current}@{at}")
                current, at = to, v
            if (current, at) != (state, version):
                problems.append(f"{row_id}: log replays to {current}@{at}, row is {state}@{version}")
        return problems


def path_to(machine: Machine, target: str) -> list[str]:
    """The events of a shortest walk from the default initial state to `target`."""
    return shortest_walk(machine, str(machine.initial), {target})


def birth(machine: Machine, target: str) -> tuple[str, list[str]]:
    """The initial state with the shortest walk to `target` (the default one first,
    on a tie), and that walk's events."""
    ways = []
    for born in machine.initial_names:
        try:
            ways.append((len(events := shortest_walk(machine, born, {target})), born != machine.initial, born, events))
        except AssertionError:
            continue  # not reachable from this one
    assert ways, f"no walk from an initial state into {target}"
    _, _, born, events = min(ways)
    return born, events


def shortest_walk(machine: Machine, start: str, into: set[str]) -> list[str]:
    """The events of a shortest walk from `start` to a state in `into`: one that waits
    for no timer (1.2) where there is one, since a walk does not sleep."""
    try:
        return _walk(machine, start, into, untimed=True)
    except AssertionError:
        return _walk(machine, start, into, untimed=False)


def _walk(machine: Machine, start: str, into: set[str], *, untimed: bool) -> list[str]:
    seen: dict[str, list[str]] = {start: []}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if here in into:
            return seen[here]
        for (state, event), (to, *_) in machine.targets.items():  # a choice: its first target
            if state == here and to not in seen and not (untimed and (state, event) in machine.timers):
                seen[to] = seen[here] + [event]
                queue.append(to)
    raise AssertionError(f"no walk from {start} into {sorted(into)}")


def walk_of_length(machine: Machine, length: int, end_in: set[str]) -> list[str]:
    """Events of a walk from the initial state of exactly `length` steps ending in a
    state of `end_in` (dynamic programming over (steps, state))."""
    layers: list[dict[str, list[str]]] = [{str(machine.initial): []}]
    for _ in range(length):
        nxt: dict[str, list[str]] = {}
        for here, events in layers[-1].items():
            for (source_state, event), (to, *_) in machine.targets.items():  # a choice: its first target
                if source_state == here and to not in nxt:
                    nxt[to] = events + [event]
        layers.append(nxt)
    for state, events in layers[-1].items():
        if state in end_in:
            return events
    raise AssertionError(f"no walk of {length} steps ends in {sorted(end_in)}")


def lease_states(machine: Machine) -> set[str]:
    assert machine.lease is not None
    return {str(s) for s in machine.lease.states}


def module_of(machine: Machine, folder: Path) -> ModuleType:
    """The generated Python module of `machine`, written to `folder` and imported."""
    paths = Paths.of(machine)
    path = folder / Path(paths.module).name
    path.write_text(generate(machine).files[paths.module], encoding="utf-8")
    name = f"{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def states_reachable(machine: Machine) -> Iterator[str]:
    for state in machine.state_names:
        try:
            birth(machine, state)
        except AssertionError:
            continue
        yield state
