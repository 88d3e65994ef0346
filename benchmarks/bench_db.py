"""What the database's enforcement costs: `<machine>_apply` against hand-written paths.

Run: `python benchmarks/bench_db.py [--dsn DSN] [--seconds S] [--rounds R] [--quick]
[--pgbench-only | --python-only] [--synchronous-commit off]` (DSN defaults to $FSMC_PG_DSN, then
postgresql://postgres@127.0.0.1:5432/postgres). It uses this checkout's fsmc, builds
specs/job.yaml and needs psycopg 3 and, for the pgbench figures, `pgbench` on PATH.

The schema is installed as the README says: a scratch schema owned by a fresh
non-superuser role (with CREATEROLE, so that the `.sql` creates its installation's
NOLOGIN writer role), the generated `.sql` run as that owner, and an application
role with only the README's grants (`install.app_grants`, as tests/pg_scratch.py has them).
Every timed call runs as the application role, with synchronous_commit on (unless
--synchronous-commit off), each transition its own transaction. Schema and roles,
the writer included, are dropped at the end.

Beside the generated tables, the owner makes bare copies (same columns, defaults,
indexes and fillfactor; no CHECK, no trigger, no foreign key) and an unchecked
function on them. Two families of figures are timed side by side in one run, at 1
and at 8 connections.

Python client (psycopg, one process per connection, so the client's GIL is not what
is measured; psycopg prepares each statement after its fifth use):

- apply: `SELECT job_apply(id, event, expected_version, actor)`, autocommit;
- cte:   one hand-written data-modifying CTE doing the same UPDATE (version check,
         lease columns, entered_at) and INSERT on the bare copies, autocommit;
- seed:  seed 000's client-side path on the bare copies: SELECT the row, compute
         the next state in Python, UPDATE with the version check, INSERT the event,
         COMMIT; separate statements in one transaction.

pgbench (`pgbench -n -M prepared -T S -c C -j C`, a custom script per path):

- apply:    `SELECT job_apply(...)` of the generated schema, every check on;
- function: `job_apply_unchecked(...)`, the same signature and the same work in a
            hand-written PL/pgSQL function on the bare copies: read the row's state,
            the spec's table to the target, the lease change, the UPDATE under the
            version check (lease columns, entered_at), the INSERT of the event row;
            no argument checks, no refusals, no SET clauses, no triggers;
- raw:      the same work as one statement (read the row in a CTE, UPDATE under the
            version check, INSERT the event from its RETURNING), no function;
- seed:     the seed's client-side path: BEGIN, SELECT, UPDATE with the version
            check and the state read, INSERT, COMMIT (five round trips, the row's
            id, state and version carried from the SELECT by `\\gset`).

Every connection cycles its own rows through claim, start, reclaim (into the lease,
within it, out of it), so no call loses a race and every path makes the same
writes. The Python workers read their rows' state first. A pgbench client knows its
rows' versions without reading them: each run gets fresh rows (queued, version 0),
client c owns rows base + c*K .. base + c*K + K-1, and its n-th transaction (a
counter kept in a pgbench variable) moves row n % K from version n / K, by the
event of phase (n / K) % 3. Row ids are uuids made from those numbers in SQL
(`lpad(to_hex(n), 32, '0')::uuid`), once per transaction in every path. After each
run, the run's event rows must number exactly the transactions pgbench counted, and
every row's version its event rows: a call that moved nothing would show.

A round times each (family, method, connections) triple for S seconds, in an order
rotated round by round, after VACUUM ANALYZE; figures are medians over rounds,
ratios medians of per-round ratios with the lowest and highest round. When the
server runs on this machine, server CPU time per transition is printed too (from
/proc): for Python workers, each one's own backend; for pgbench, the backends of
the application role, found in pg_stat_activity during the run and read every
20 ms (the last reading before a backend exits is what counts; background processes
such as the WAL writer are not included). On a shared machine CPU per transition
moves far less than throughput does.

Targets (issue 13, pgbench): apply >= 0.85x function and >= 0.65x raw at 1 and at 8
connections, apply >= 1.5x seed. Python client (issue 3): apply >= 1.5x seed, apply
at 8 connections >= 1.6x apply at 1; apply / cte is printed for information (issue
13 replaced issue 3's 0.8x target on it with the pgbench ones).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import conninfo  # noqa: E402

from fsmc import facts, pipeline, source  # noqa: E402
from fsmc.escape import sql_str  # noqa: E402
from fsmc.model import Machine  # noqa: E402
from fsmc.targets.postgres.build import build, emit  # noqa: E402
from fsmc.targets.postgres.encode import claim_assignments  # noqa: E402
from fsmc.targets.postgres.install import app_grants  # noqa: E402
from fsmc.targets.postgres.names import Names  # noqa: E402

# Where every benchmark script connects unless told otherwise (`--dsn`).
DEFAULT_DSN = os.environ.get("FSMC_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

METHODS = ("apply", "cte", "seed")  # Python client
PGBENCH_METHODS = ("apply", "function", "raw", "seed")
CONNECTIONS = (1, 8)
ROWS_PER_CONNECTION = 64
WARMUP = 30  # transitions per connection before timing: psycopg prepares after 5
FIRST_PGBENCH_ROW = 1_000_000  # the Python workers' rows are 1 .. 8 * ROWS_PER_CONNECTION

# The cycle each row runs through, and what each step does to the lease columns.
NEXT = {"queued": ("claim", "claimed"), "claimed": ("start", "running"),
        "running": ("reclaim", "queued")}  # fmt: skip

# What an application role needs, and all it gets: `install.app_grants`, the README's list.



def row_id(number: str) -> str:
    """The SQL expression of the uuid of row `number` (an SQL integer expression)."""
    return f"pg_catalog.lpad(pg_catalog.to_hex(({number})::bigint), 32, '0')::uuid"


# The same UPDATE apply makes (version check, lease bookkeeping): the claim rule's
# SET clauses from fsmc.facts, as the SQL target writes them, over a parameter.
LEASE_SET = ",\n    ".join(claim_assignments("%(lease)s", "%(actor)s", "pg_catalog.now()"))
CTE_SQL = f"""
WITH moved AS (
    UPDATE jobs_bare SET state = %(to)s, entered_at = pg_catalog.now(),
    state_version = state_version + 1, {LEASE_SET}
    WHERE id = %(id)s AND state_version = %(version)s
    RETURNING state_version
)
INSERT INTO job_events_bare (job_id, version, from_state, event, to_state, actor)
SELECT %(id)s, state_version, %(from)s, %(event)s, %(to)s, %(actor)s FROM moved
RETURNING version"""
SEED_SELECT = "SELECT state, state_version FROM jobs_bare WHERE id = %(id)s"
SEED_UPDATE = f"""
UPDATE jobs_bare SET state = %(to)s, entered_at = pg_catalog.now(),
    state_version = state_version + 1, {LEASE_SET}
WHERE id = %(id)s AND state_version = %(version)s AND state = %(from)s
RETURNING state_version"""
SEED_INSERT = """
INSERT INTO job_events_bare (job_id, version, from_state, event, to_state, actor)
VALUES (%(id)s, %(new_version)s, %(from)s, %(event)s, %(to)s, %(actor)s)"""
APPLY_SQL = "SELECT job_apply(%(id)s, %(event)s, %(version)s, %(actor)s)"


def machine_of_spec(name: str) -> Machine:
    """specs/<name>.yaml, checked."""
    checked = pipeline.check(source.read(str(ROOT / "specs" / f"{name}.yaml")))
    if not checked.ok() or checked.machine is None:
        raise SystemExit(f"specs/{name}.yaml does not check: {checked.diagnostics}")
    return checked.machine


def job_machine() -> Machine:
    return machine_of_spec("job")


JOB = job_machine()


def cycle() -> list[tuple[str, str, str, str]]:
    """(from, event, to, lease change) of each step of a row's cycle, from the initial state."""
    steps: list[tuple[str, str, str, str]] = []
    state = str(JOB.initial)
    while not steps or state != str(JOB.initial):
        event, target = NEXT[state]
        assert JOB.single.get((state, event)) == target, (state, event)
        steps.append((state, event, target, facts.lease_change(JOB, state, target).value))
        state = target
    return steps


def unchecked_function(machine: Machine) -> str:
    """`job_apply_unchecked`: job_apply's signature and work on the bare copies, with
    no checks: read the state, the spec's table to the target and the lease change,
    the UPDATE under the version check, the event row. Nothing else: no NULL checks, no
    refusals (an unknown move sets state NULL, which NOT NULL refuses), no SET clauses
    (job_apply pins search_path and turns seq scans off), not SECURITY DEFINER."""

    def by_move(value: Any) -> str:
        """The spec's table as a CASE over v_state and v_event, of value(from, to)."""
        return "\n".join(
            f"        WHEN {sql_str(s)} THEN CASE v_event"
            + "".join(f" WHEN {sql_str(e)} THEN {sql_str(value(s, t))}" for e, t in moves) + " END"
            for s, moves in facts.by_state(machine)
        )  # fmt: skip

    claims = ",\n        ".join(claim_assignments("v_lease", "job_apply_unchecked.actor", "pg_catalog.now()", "t"))
    return f"""
CREATE FUNCTION job_apply_unchecked(
    id uuid, event text, expected_version bigint, actor text, payload jsonb DEFAULT NULL,
    to_state text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $bench$
#variable_conflict use_column
DECLARE
    v_event text := job_apply_unchecked.event;
    v_state text;
    v_to text;
    v_lease text;
BEGIN
    SELECT t.state INTO v_state FROM jobs_bare AS t WHERE t.id = job_apply_unchecked.id;
    v_to := CASE v_state
{by_move(lambda _s, t: t)}
    END;
    v_lease := CASE v_state
{by_move(lambda s, t: facts.lease_change(machine, s, t).value)}
    END;
    UPDATE jobs_bare AS t
    SET state = v_to,
        entered_at = pg_catalog.now(),
        state_version = t.state_version + 1,
        {claims}
    WHERE t.id = job_apply_unchecked.id
      AND t.state_version = job_apply_unchecked.expected_version;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO job_events_bare (job_id, version, from_state, event, to_state, actor, payload)
    VALUES (job_apply_unchecked.id, job_apply_unchecked.expected_version + 1, v_state, v_event,
            v_to, job_apply_unchecked.actor, job_apply_unchecked.payload);
    RETURN job_apply_unchecked.expected_version + 1;
END
$bench$;
"""


# --- the scratch schema and its roles ---------------------------------------------------


def owner_of(schema: str) -> str:
    return f"{schema}_owner"


def app_of(schema: str) -> str:
    return f"{schema}_app"


def options(schema: str, sync: str = "on") -> str:
    """Session settings of every timed connection."""
    return f"-c search_path={schema} -c synchronous_commit={sync}"


def install(dsn: str, schema: str, machine: Machine) -> None:
    """Roles and the generated schema as the README installs one: a fresh non-superuser
    owner (with CREATEROLE, so that the `.sql` creates its installation's writer role)
    runs it, and the application role gets the README's grants (`app_of(schema)`)."""
    owner, app = owner_of(schema), app_of(schema)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {owner} LOGIN NOSUPERUSER NOCREATEDB CREATEROLE")
        admin.execute(f"CREATE ROLE {app} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {owner}")
    with psycopg.connect(dsn, user=owner, options=f"-c search_path={schema}") as conn:
        pg = build(machine)
        conn.execute(emit(pg).encode())  # one script, as psql -1 -f would
        conn.execute("\n".join(app_grants(pg.install, schema, app)).encode())


def setup(dsn: str, schema: str, machine: Machine) -> None:
    """`install`, then bare copies of its tables, the unchecked function, and rows for
    every Python worker. `teardown` undoes it."""
    owner, app = owner_of(schema), app_of(schema)
    rows = ROWS_PER_CONNECTION * max(CONNECTIONS)
    try:
        install(dsn, schema, machine)
        with psycopg.connect(dsn, user=owner, options=f"-c search_path={schema}") as conn:
            # Bare copies: same columns, defaults, primary keys, partial indexes and
            # fillfactor; no CHECK, no trigger, no foreign key.
            conn.execute("CREATE TABLE jobs_bare (LIKE jobs INCLUDING DEFAULTS INCLUDING INDEXES)"
                         " WITH (fillfactor = 90)")  # fmt: skip
            conn.execute("CREATE TABLE job_events_bare"
                         " (LIKE job_events INCLUDING DEFAULTS INCLUDING INDEXES)")  # fmt: skip
            conn.execute(unchecked_function(machine).encode())
            conn.execute(f"GRANT SELECT, INSERT, UPDATE ON jobs_bare TO {app};"
                         f" GRANT SELECT, INSERT ON job_events_bare TO {app}".encode())  # fmt: skip
            for table in ("jobs", "jobs_bare"):
                conn.execute(f"INSERT INTO {table} (id) SELECT {row_id('i')}"
                             f" FROM generate_series(1, {rows}) AS i")  # fmt: skip
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
            conn.execute("VACUUM ANALYZE")
    except BaseException:
        teardown(dsn, schema)
        raise


def teardown(dsn: str, schema: str) -> None:
    """Drop the schema, its two roles and the writer role its installation made."""
    roles = [app_of(schema), owner_of(schema)]
    with psycopg.connect(dsn, autocommit=True) as admin:
        name_of = f"{schema}.{Names.of(JOB).sql.writer}()"  # the writer's name
        if admin.execute("SELECT to_regprocedure(%s)", (name_of,)).fetchone() != (None,):
            found = admin.execute(f"SELECT {name_of}").fetchone()
            roles += [] if found is None else [str(found[0])]
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE usename = ANY (%s) AND pid <> pg_backend_pid()", (roles,))  # fmt: skip
        admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        for role in roles:
            if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


# --- the Python client --------------------------------------------------------------------


def rows_of(conn: psycopg.Connection[Any], table: str, worker: int) -> list[list[Any]]:
    """[id, state, version] of this worker's share of `table`'s rows, in a fixed order."""
    first = worker * ROWS_PER_CONNECTION + 1
    got = conn.execute(
        f"SELECT id, state, state_version FROM {table}"
        f" WHERE id BETWEEN {row_id(str(first))} AND {row_id(str(first + ROWS_PER_CONNECTION - 1))}"
        " ORDER BY id"
    ).fetchall()
    assert len(got) == ROWS_PER_CONNECTION, (table, worker, len(got))
    return [list(r) for r in got]


def lease_change(source_state: str, target: str) -> str:
    """What a step does to the claim columns: the claim rule of fsmc.facts."""
    return facts.lease_change(JOB, source_state, target).value


def worker(dsn: str, schema: str, method: str, index: int, seconds: float,
           barrier: Barrier, results: Any, sync: str = "on") -> None:  # fmt: skip
    """One connection: warm up, wait for the others, run `method` for `seconds`."""
    with psycopg.connect(dsn, user=app_of(schema), autocommit=True, options=options(schema, sync)) as conn:
        table = "jobs" if method == "apply" else "jobs_bare"
        rows = rows_of(conn, table, index)
        actor = f"worker-{index}"
        cur = conn.cursor()

        def step(row: list[Any]) -> None:
            ident, state, version = row
            event, target = NEXT[state]
            args = {"id": ident, "event": event, "version": version, "actor": actor,
                    "from": state, "to": target, "lease": lease_change(state, target)}  # fmt: skip
            if method == "apply":
                got = cur.execute(APPLY_SQL, args).fetchone()
            elif method == "cte":
                got = cur.execute(CTE_SQL, args).fetchone()
            else:
                with conn.transaction():
                    read = cur.execute(SEED_SELECT, args).fetchone()
                    assert read is not None and tuple(read) == (state, version), read
                    got = cur.execute(SEED_UPDATE, args).fetchone()
                    assert got is not None
                    cur.execute(SEED_INSERT, {**args, "new_version": got[0]})
            if got is None or got[0] != version + 1:
                raise RuntimeError(f"{method}: transition of {ident} at {version} got {got}")
            row[1], row[2] = target, version + 1

        for i in range(WARMUP):
            step(rows[i % len(rows)])
        backend = conn.info.backend_pid
        barrier.wait()
        done, start, cpu = 0, time.perf_counter(), backend_cpu(backend)
        deadline = start + seconds
        while time.perf_counter() < deadline:
            step(rows[done % len(rows)])
            done += 1
        elapsed, used = time.perf_counter() - start, backend_cpu(backend)
        results.put((done, elapsed, None if cpu is None or used is None else used - cpu))


def backend_cpu(pid: int) -> float | None:
    """CPU seconds a server process has used, when the server runs on this machine and
    /proc shows it (on a shared, noisy machine this varies far less than throughput)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def measure(dsn: str, schema: str, method: str, connections: int,
            seconds: float, sync: str = "on") -> tuple[float, float | None]:  # fmt: skip
    """Transitions per second of `connections` processes running `method` at once, and
    the server's CPU microseconds per transition (None when it cannot be read)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(connections)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(dsn, schema, method, i, seconds, barrier, results, sync))
        for i in range(connections)
    ]
    for p in procs:
        p.start()
    got: list[tuple[int, float, float | None]] = []
    deadline = time.monotonic() + seconds + 120
    while len(got) < len(procs):
        try:
            got.append(results.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit(f"{method} x{connections}: a worker failed") from None
    for p in procs:
        p.join()
    done = sum(n for n, _t, _c in got)
    cpus = [c for _n, _t, c in got]
    cpu = None if None in cpus else sum(c for c in cpus if c is not None) / done * 1e6
    return done / max(t for _n, t, _c in got), cpu


# --- pgbench ------------------------------------------------------------------------------


def pgbench_step(method: str, step: tuple[str, str, str, str]) -> str:
    """The SQL of one step of the cycle for `method`, over pgbench variables :row (the
    row's number) and :v (its version before the step)."""
    frm, event, to, change = step
    ident = row_id(":row")
    if method == "apply":
        return f"SELECT job_apply({ident}, {sql_str(event)}, :v, 'bench');"
    if method == "function":
        return f"SELECT job_apply_unchecked({ident}, {sql_str(event)}, :v, 'bench');"
    claims = ", ".join(claim_assignments(sql_str(change), "'bench'", "pg_catalog.now()", "t"))
    move = (f"UPDATE jobs_bare AS t SET state = {sql_str(to)}, entered_at = pg_catalog.now(),"
            f" state_version = t.state_version + 1, {claims}")  # fmt: skip
    insert = "INSERT INTO job_events_bare (job_id, version, from_state, event, to_state, actor)"
    if method == "raw":
        return (f"WITH cur AS (SELECT t.id, t.state FROM jobs_bare AS t WHERE t.id = {ident}),"
                f" moved AS ({move} FROM cur WHERE t.id = cur.id AND t.state_version = :v"
                f" RETURNING t.id, t.state_version, cur.state AS from_state)"
                f" {insert} SELECT m.id, m.state_version, m.from_state, {sql_str(event)},"
                f" {sql_str(to)}, 'bench' FROM moved AS m;")  # fmt: skip
    assert method == "seed", method
    return "\n".join((
        "BEGIN;",
        f"SELECT t.id, t.state, t.state_version FROM jobs_bare AS t WHERE t.id = {ident} \\gset",
        f"{move} WHERE t.id = :id AND t.state_version = :state_version AND t.state = :state"
        " RETURNING t.state_version AS new_version \\gset",
        f"{insert} VALUES (:id, :new_version, :state, {sql_str(event)}, {sql_str(to)}, 'bench');",
        "COMMIT;",
    ))  # fmt: skip


def pgbench_script(method: str) -> str:
    """The pgbench script of `method`: client c's n-th transaction moves its row
    base + c*K + n % K from version n / K by the step (n / K) % len(cycle)."""
    steps = cycle()
    k = ROWS_PER_CONNECTION
    lines = [f"\\set row :base + :client_id * {k} + :n % {k}", f"\\set v :n / {k}",
             f"\\set phase :v % {len(steps)}"]  # fmt: skip
    for i, step in enumerate(steps):
        if i == 0:
            lines.append(f"\\if :phase = {i}")
        elif i < len(steps) - 1:
            lines.append(f"\\elif :phase = {i}")
        else:
            lines.append("\\else")
        lines.append(pgbench_step(method, step))
    lines += ["\\endif", "\\set n :n + 1"]
    return "\n".join(lines) + "\n"


@dataclass
class Pgbench:
    """pgbench runs against one scratch schema; each run gets fresh rows."""

    dsn: str
    schema: str
    folder: Path
    program: str
    sync: str = "on"
    next_row: int = FIRST_PGBENCH_ROW

    def run(self, method: str, clients: int, seconds: float) -> tuple[float, float | None]:
        """Transactions per second of `clients` pgbench clients running `method`, and the
        backends' CPU microseconds per transition (None when it cannot be read)."""
        table, events = ("jobs", "job_events") if method == "apply" else ("jobs_bare", "job_events_bare")
        base, count = self.next_row, clients * ROWS_PER_CONNECTION
        self.next_row += count
        first, last = row_id(str(base)), row_id(str(base + count - 1))
        with psycopg.connect(self.dsn, autocommit=True, options=f"-c search_path={self.schema}") as admin:
            admin.execute(f"INSERT INTO {table} (id) SELECT {row_id('i')}"
                          f" FROM generate_series({base}, {base + count - 1}) AS i")  # fmt: skip
            script = self.folder / f"{method}.sql"
            script.write_text(pgbench_script(method), encoding="utf-8")
            target = conninfo.make_conninfo(self.dsn, user=app_of(self.schema),
                                            options=options(self.schema, self.sync))  # fmt: skip
            proc = subprocess.Popen(
                [self.program, "-n", "-M", "prepared", "-T", f"{seconds:g}", "-c", str(clients),
                 "-j", str(clients), "-D", "n=0", "-D", f"base={base}", "-f", str(script), target],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
            cpu = self.backends_cpu(admin, proc)
            out, _ = proc.communicate()
            processed = re.search(r"number of transactions actually processed: (\d+)", out)
            tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
            if proc.returncode != 0 or processed is None or tps is None:
                raise SystemExit(f"pgbench {method} x{clients} failed:\n{out}")
            done = int(processed.group(1))
            moved = admin.execute(
                f"SELECT (SELECT count(*) FROM {events} WHERE job_id BETWEEN {first} AND {last}),"
                f" (SELECT sum(state_version) FROM {table} WHERE id BETWEEN {first} AND {last})"
            ).fetchone()  # fmt: skip
            if moved is None or moved[0] != done or moved[1] != done:
                raise SystemExit(f"pgbench {method} x{clients}: {done} transactions but"
                                 f" (event rows, versions) = {moved}")  # fmt: skip
        return float(tps.group(1)), None if cpu is None else cpu / done * 1e6

    def backends_cpu(self, admin: psycopg.Connection[Any], proc: subprocess.Popen[str]) -> float | None:
        """CPU seconds of the application role's backends while `proc` runs: their pids
        from pg_stat_activity (every 100 ms), their /proc stat every 20 ms, the last
        reading of each summed (pgbench's first connection, which it closes before the
        clients connect, counts too: a millisecond or so)."""
        last: dict[int, float | None] = {}
        polls = 0
        while proc.poll() is None:
            if polls % 5 == 0:
                for (pid,) in admin.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s",
                                            (app_of(self.schema),)).fetchall():  # fmt: skip
                    last.setdefault(pid, None)
            for pid in last:
                used = backend_cpu(pid)
                if used is not None:
                    last[pid] = used
            polls += 1
            time.sleep(0.02)
        if not last or None in last.values():
            return None
        return sum(v for v in last.values() if v is not None)


# --- the run ------------------------------------------------------------------------------


def check_consistent(dsn: str, schema: str) -> None:
    """Every row's version equals its number of event rows, in both table pairs."""
    with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        for table, events in (("jobs", "job_events"), ("jobs_bare", "job_events_bare")):
            bad = conn.execute(
                f"SELECT count(*) FROM {table} t WHERE t.state_version <>"
                f" (SELECT count(*) FROM {events} e WHERE e.job_id = t.id)"
            ).fetchone()
            assert bad is not None and bad[0] == 0, f"{table}: {bad[0] if bad else '?'} rows off"


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def median_ratio(a: Sequence[float], b: Sequence[float]) -> str:
    rs = ratios(a, b)
    return f"{statistics.median(rs):.2f}x (rounds {min(rs):.2f}-{max(rs):.2f})"


def table(title: str, methods: Sequence[str], tps: dict[tuple[str, int], list[float]],
          cpu: dict[tuple[str, int], list[float]]) -> None:  # fmt: skip
    has_cpu = all(cpu[m, c] and len(cpu[m, c]) == len(tps[m, c]) for m in methods for c in CONNECTIONS)
    print(f"{title:<14}" + "".join(f"{f'{c} conn':>12}" for c in CONNECTIONS)
          + (f"   server CPU us/transition at {' and '.join(map(str, CONNECTIONS))} conn"
             if has_cpu else ""))  # fmt: skip
    for method in methods:
        cells = "".join(f"{statistics.median(tps[method, c]):>12,.0f}" for c in CONNECTIONS)
        if has_cpu:
            cells += "   " + " ".join(f"{statistics.median(cpu[method, c]):>6.0f}" for c in CONNECTIONS)
        print(f"{method:<14}{cells}")


def verdict(label: str, a: Sequence[float], b: Sequence[float], target: float | None) -> bool:
    line = f"{label:<42}{median_ratio(a, b):<28}"
    if target is None:
        print(line + "   (info)")
        return True
    ok = statistics.median(ratios(a, b)) >= target
    print(f"{line}   target >= {target}x  {'PASS' if ok else 'MISS'}")
    return ok


def pgbench_or_exit() -> str:
    """pgbench's path, or exit saying where it comes from."""
    program = shutil.which("pgbench")
    if program is None:
        raise SystemExit("pgbench is not on PATH (it ships with PostgreSQL's client tools)")
    return program


def machine_line() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    except OSError:
        model = None
    return f"{model.group(1).strip() if model else 'CPU ?'}, nproc={os.cpu_count()}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="3 s runs, 1 round: a smoke run whose figures are not worth quoting")  # fmt: skip
    parser.add_argument("--synchronous-commit", choices=("on", "off"), default="on",
                        help="of every timed connection (the targets are set with it on)")  # fmt: skip
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--pgbench-only", action="store_true", help="skip the Python-client figures")
    only.add_argument("--python-only", action="store_true", help="skip the pgbench figures")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 3.0, 1

    families = [f for f, skip in (("python", args.pgbench_only), ("pgbench", args.python_only)) if not skip]
    program = shutil.which("pgbench")
    if "pgbench" in families and program is None:
        raise SystemExit("pgbench is not on PATH (it ships with PostgreSQL's client tools);"
                         " or pass --python-only")  # fmt: skip

    schema = f"fsmc_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'),"
            " current_setting('shared_buffers'), current_setting('wal_sync_method')"
        ).fetchone()
    assert row is not None
    print(f"PostgreSQL {row[0]} (synchronous_commit={args.synchronous_commit} for every timed"
          f" connection, fsync={row[1]},"
          f" wal_sync_method={row[3]}, shared_buffers={row[2]}); {machine_line()},"
          f" load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"{args.rounds} round(s) of {args.seconds:g} s per (client, method, connections);"
          f" each transition its own transaction, as the application role\n")  # fmt: skip

    methods = {"python": METHODS, "pgbench": PGBENCH_METHODS}
    triples = [(f, m, c) for f in families for m in methods[f] for c in CONNECTIONS]
    tps: dict[tuple[str, str, int], list[float]] = {t: [] for t in triples}
    cpu: dict[tuple[str, str, int], list[float]] = {t: [] for t in triples}
    setup(args.dsn, schema, JOB)
    try:
        with tempfile.TemporaryDirectory(prefix="fsmc_bench_") as folder:
            bench = Pgbench(args.dsn, schema, Path(folder), program or "pgbench", args.synchronous_commit)
            for r in range(args.rounds):
                with psycopg.connect(args.dsn, autocommit=True) as conn:
                    conn.execute(f"SET search_path TO {schema}")
                    conn.execute("VACUUM ANALYZE")
                shift = (r * 3) % len(triples)
                for family, method, conns in triples[shift:] + triples[:shift]:
                    if family == "python":
                        rate, used = measure(args.dsn, schema, method, conns, args.seconds,
                                             args.synchronous_commit)  # fmt: skip
                    else:
                        rate, used = bench.run(method, conns, args.seconds)
                    tps[family, method, conns].append(rate)
                    if used is not None:
                        cpu[family, method, conns].append(used)
        check_consistent(args.dsn, schema)
    finally:
        teardown(args.dsn, schema)

    verdicts = []
    for family in families:
        ftps = {(m, c): v for (f, m, c), v in tps.items() if f == family}
        fcpu = {(m, c): v for (f, m, c), v in cpu.items() if f == family}
        if family == "python":
            print("Python client (psycopg, one process per connection), transitions/s:")
            table("", METHODS, ftps, fcpu)
            print()
            for c in CONNECTIONS:
                verdict(f"apply / cte at {c} conn", ftps["apply", c], ftps["cte", c], None)
                verdicts.append(verdict(f"apply / seed at {c} conn", ftps["apply", c], ftps["seed", c], 1.5))
            lo, hi = CONNECTIONS[0], CONNECTIONS[-1]
            for method in METHODS:
                verdicts.append(verdict(f"{method} {hi} conn / {lo} conn", ftps[method, hi], ftps[method, lo],
                                        1.6 if method == "apply" else None))  # fmt: skip
        else:
            print("pgbench (-M prepared, one thread per client), transactions/s:")
            table("", PGBENCH_METHODS, ftps, fcpu)
            print()
            for other, target in (("function", 0.85), ("raw", 0.65), ("seed", 1.5)):
                for c in CONNECTIONS:
                    verdicts.append(verdict(f"apply / {other} at {c} conn", ftps["apply", c],
                                            ftps[other, c], target))  # fmt: skip
            if all(len(fcpu[m, c]) == args.rounds for m in PGBENCH_METHODS for c in CONNECTIONS):
                for other in ("function", "raw"):
                    for c in CONNECTIONS:
                        verdict(f"server CPU apply / {other} at {c} conn", fcpu["apply", c],
                                fcpu[other, c], None)  # fmt: skip
        print()
    print(f"(load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)")
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
