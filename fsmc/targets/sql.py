"""The PostgreSQL file (contract 4.2): the database itself enforces the spec.

In: a checked `Machine`. Out: the text of `<machine>/<machine>.sql`, which applies
with `psql -v ON_ERROR_STOP=1 -1 -f FILE` to an empty schema as a non-superuser
owner (PostgreSQL 15 or later; nothing beyond plpgsql and core functions).

What the file builds, and why it is shaped so:

- T (the machine's table): `state` is `text` with a CHECK over the declared states,
  never an ENUM (an enum value can never be dropped; a CHECK can be replaced).
  A BEFORE INSERT trigger refuses a row born anywhere but the initial state at
  version 0. An AFTER UPDATE trigger (BEFORE for a machine with caps, so that a
  move past a cap gets its own SQLSTATE before the count's CHECK), which fires only for an UPDATE that sets
  `state`, `state_version` or a count (`UPDATE OF`: heartbeat writes never reach it,
  so they pay nothing; one that sets them to what they were returns at once), refuses an edge the spec lacks, a move out of a terminal, and
  a version that is not the old one plus one; an undeclared state is left to the
  CHECK (23514), as the contract says. A DEFERRABLE INITIALLY DEFERRED constraint
  trigger checks at COMMIT that every state change has its event row. The spec's
  lists live in PL/pgSQL, which keeps compiled expressions for the session, and in
  two domains the CHECKs cast to (`spec_domains`): PostgreSQL rebuilds a table's
  CHECK or WHEN clause for every statement, so a list there, even as one constant,
  was the dearest part of a write, and it grew with the spec.
- E (the event log): every column NOT NULL but `payload`, primary key
  (<machine>_id, version), a CHECK casting each (from, event, to) triple, as a
  text[], to the domain holding the spec's moves as nested jsonb objects (the
  shortest CHECK text found: PostgreSQL parses it for every INSERT), UPDATE /
  DELETE / TRUNCATE refused by triggers, and a deferred
  trigger that refuses at COMMIT an event row recording a move its row did not
  make. No foreign key (its check cost `_apply` a tenth of its time): triggers on T
  refuse deleting or truncating rows that have history, but through purge. Together
  with the check on T, the log and the row's version history match one to one,
  which is what makes the log replay to the row.
- `<machine>_apply`: one round trip. It reads the row's state, looks its move on
  the event up in the spec's moves (`moves_jsonb`: a choice's `to_state` or the
  single target, in a binary search, whatever the spec's size), then UPDATEs the row
  by id at `expected_version` and in that state, under the event's cap, and inserts
  the event row. Joining the UPDATE to the spec's transitions as a VALUES list, one
  statement, scanned every transition of the spec on every call: a spec of 308
  (wildcards over 47 states) cost 45% more CPU per call than one of 11, and now
  costs the same; for the 11 this is a little cheaper too. Under READ COMMITTED a
  concurrent mover makes the UPDATE wait, then re-check its WHERE on the row the
  winner left (EvalPlanQual), whose version no longer matches: of two calls at one
  version exactly one wins. Only when nothing moved does it read the row again to
  say why, in the contract's order: no row (23F03), another version (NULL, nothing
  changed), an unknown event (23F02), no move or a wrong `to_state` (23F01), a
  spent cap (23F07); a move found legal then (the row reached the version after the
  UPDATE looked) is tried again.
- The writer role: `_apply`, `_claim` and `_reclaim` are SECURITY DEFINER functions
  owned by a NOLOGIN role of this installation alone (`writer_prepare`,
  `writer_setup`), and the triggers on T and E skip the writes that role makes,
  naming it as a text literal in their WHEN clauses (`CURRENT_USER <> 'role'::text`:
  a `name` constant would be 64 bytes to parse per statement). Those writes keep to the spec by
  construction; everyone else's still get every check. No application can become
  the role, and EXECUTE on these functions is granted, not PUBLIC's.
- With `lease`: the claim bookkeeping is part of that same UPDATE; the partial index
  for reclaim is keyed on `state` over the lease states only, so a heartbeat (which
  changes only `heartbeat_at`) touches no indexed column and stays a HOT update; the
  table keeps 10% of each page free for those HOT updates. `<machine>_reclaim`
  locks stale rows with FOR UPDATE SKIP LOCKED (the lock re-checks the staleness
  predicate on the newest row version, so a refreshed heartbeat saves its row; two
  supervisors never wait for or deadlock on each other, and each row is reclaimed
  once), then moves them and appends their events, all in one statement.
- `<machine>_fsmc_digest()` returns `fsmc.digest.machine_digest` (see there).
- Every function's `search_path` is pinned to `pg_catalog`, the schema it was
  created in and `pg_temp` last (`pin_search_path`, the file's last statement), so
  it finds its own tables whatever the caller's path is and nothing a caller
  creates changes what it does; those that look rows up by key also set
  `enable_seqscan = off`, since a session keeps the plan it made while a fresh
  table was nearly empty.

How it is made: `schema(machine)` builds the file's objects as a
`fsmc.targets.pgschema.Schema` (function bodies rendered from
templates/machine_bodies.sql.j2 with a `BodyContext`), and `emit` renders that
model into templates/machine.sql.j2 with a `FileContext`. `fsmc migrate` compares
the models of two machines; nothing reads the text back.

SQLSTATEs are `fsmc.targets.sqlstate`'s. Every state and event name reaches SQL as a
literal through `sql_str`; every identifier through `sql_ident`, derived names
(`sql_name`) kept within 63 bytes and distinct. Function bodies are dollar-quoted
and hold only names, which the naming rule limits to `[a-z0-9_]`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from functools import cache, partial

import jinja2

from fsmc import facts
from fsmc.digest import machine_digest
from fsmc.escape import (
    sql_comment,
    sql_ident,
    sql_jsonb_keys,
    sql_jsonb_paths,
    sql_name,
    sql_str,
    sql_text_array,
)
from fsmc.facts import CLAIM_COLUMNS, CLAIM_RULE, Action
from fsmc.model import Machine
from fsmc.targets import sqlstate
from fsmc.targets.common import Paths, header_context
from fsmc.targets.pgschema import (
    Column,
    Constraint,
    Domain,
    Function,
    Index,
    Parameter,
    Schema,
    Table,
    Trigger,
    View,
    unquote,
)
from fsmc.templating import environment, render

# The id column per id_type: (type, default, identity).
# The shape of the schema this fsmc builds, recorded by `<machine>_fsmc_format()`.
# 1: before it existed (no created_at/entered_at, claim, purge, intervals); 2: with them;
# 3: the writer role owns the moving functions, and `_apply` takes `to_state`; 4: the
# state and triple CHECKs cast to domains holding the lists (format 3: the triples in a
# function); 5: the triple CHECK casts a text[] to a domain of nested moves (format 4:
# the three columns joined into one text), and the triggers skipping the writer's
# writes compare CURRENT_USER with a text (format 4: a name); 6: the writer role owns
# the heartbeat and the update guard too, which stamps a direct move's times, and the
# application's grants are column by column (format 5: whole tables).
# `fsmc migrate` brings a database of an older format to this one first.
SCHEMA_FORMAT = 6

ID_COLUMNS = {
    "uuid": ("uuid", "pg_catalog.gen_random_uuid()", False),
    "bigint": ("bigint", None, True),
    "text": ("text", None, False),
}


@dataclass(frozen=True)
class Names:
    """Every identifier the file uses, already quoted for SQL."""

    table: str
    events_table: str
    id_column: str
    apply: str
    heartbeat: str
    reclaim: str
    claim: str
    purge: str
    intervals: str
    purge_tickets: str
    claim_index: str
    purge_index: str
    digest: str
    format: str
    guard_insert: str
    guard_update: str
    check_logged: str
    logged_check: str  # check_logged's trigger: named to fire after guard_update's (below)
    append_only: str
    append_only_truncate: str
    check_event: str
    guard_delete: str
    guard_delete_truncate: str
    table_pkey: str
    state_check: str
    lease_index: str
    events_pkey: str
    events_fkey: str
    triple_check: str
    version_check: str  # the log's CHECK (version > 0) before format 4, now the commit-time check's
    writer: str  # the function naming this installation's writer role (writer_prepare)

    @staticmethod
    def of(machine: Machine) -> Names:
        m, table, events = str(machine.name), str(machine.postgres.table), str(
            machine.postgres.events_table
        )

        def fn(*suffix: str) -> str:
            return sql_ident(sql_name(m, *suffix))

        return Names(
            table=sql_ident(table),
            events_table=sql_ident(events),
            id_column=sql_ident(id_column(machine)),
            apply=fn("apply"),
            heartbeat=fn("heartbeat"),
            reclaim=fn("reclaim"),
            claim=fn("claim"),
            purge=fn("purge"),
            intervals=fn("intervals"),
            purge_tickets=fn("purge_tickets"),
            claim_index=sql_ident(sql_name(table, "claim_idx")),
            purge_index=sql_ident(sql_name(table, "purge_idx")),
            digest=fn("fsmc_digest"),
            format=fn("fsmc_format"),
            guard_insert=fn("guard_insert"),
            guard_update=fn("guard_update"),
            check_logged=fn("check_logged"),
            logged_check=fn("logged_check"),
            append_only=fn("events_append_only"),
            append_only_truncate=fn("events_append_only_truncate"),
            check_event=fn("check_event"),
            guard_delete=fn("guard_delete"),
            guard_delete_truncate=fn("guard_delete_truncate"),
            table_pkey=sql_ident(sql_name(table, "pkey")),
            state_check=sql_ident(sql_name(table, "state_check")),
            lease_index=sql_ident(sql_name(table, "lease_idx")),
            events_pkey=sql_ident(sql_name(events, "pkey")),
            events_fkey=sql_ident(sql_name(events, "fkey")),
            triple_check=sql_ident(sql_name(events, "transition_check")),
            version_check=sql_ident(sql_name(events, "version_check")),
            writer=fn("fsmc_writer"),
        )


def pin_search_path(functions: Iterable[str]) -> str:
    """The statement that pins each named function of the current schema to
    `pg_catalog, <that schema>, pg_temp` (CVE-2018-1058).

    The schema's name is known only when the file is installed, so a DO block reads
    it and sets each function's search_path; `SET search_path FROM CURRENT` would
    not do: it leaves pg_temp out, and PostgreSQL then searches the caller's
    temporary schema first, where anyone may create a table named like ours.
    Everything the block itself calls is named through pg_catalog, since it runs
    with the installer's search_path. `fsmc migrate` runs it again after replacing
    functions: CREATE OR REPLACE drops a function's settings."""
    return f"""\
-- Pin every function's search_path to pg_catalog, this schema, and pg_temp last.
DO $fsmc$
DECLARE
    v_function record;
BEGIN
    FOR v_function IN
        SELECT n.nspname, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid) AS args
        FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
          AND p.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY ({_pg_text_array(functions)})
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %I.%I(%s) SET search_path = pg_catalog, %I, pg_temp',
                                  v_function.nspname, v_function.proname, v_function.args,
                                  v_function.nspname);
    END LOOP;
END
$fsmc$;"""


def _pg_text_array(names: Iterable[str]) -> str:
    """A text[] literal whose type is named through pg_catalog (for DO blocks, which
    run with the installer's search_path)."""
    return sql_text_array(names).replace("::text[]", "::pg_catalog.text[]")


def writer_functions(machine: Machine) -> list[str]:
    """The functions the writer role owns (names as SQL spells them): those that move
    rows, the heartbeat, and the guard, which stamps a direct move's times. They write
    the columns the database keeps (`entered_at`, the claim columns), on which the
    application role has no grant: their values are the database's, never a caller's."""
    n = Names.of(machine)
    return [*_movers(machine), n.guard_update]


def _movers(machine: Machine) -> list[str]:
    n = Names.of(machine)
    return [n.apply, n.claim] + ([n.heartbeat, n.reclaim] if machine.lease else [])


def callable_functions(machine: Machine) -> list[str]:
    """The SECURITY DEFINER functions an application calls: EXECUTE on them is granted,
    never PUBLIC's (the writer's, and purge, which the owner keeps)."""
    return [*_movers(machine), Names.of(machine).purge]


def app_grants(machine: Machine, schema: str, role: str) -> list[str]:
    """What an application role needs, and all it gets (the README's list; the tests'
    application role gets exactly these). `schema` and `role` are raw names.

    Column by column: the application may give a new row its id and (an initial) state,
    and move a row by hand (state, state_version and a capped event's count, which the
    guard checks); every other column is the database's. So a row's id and
    `created_at` never change, `entered_at` and the claim columns are stamped by the
    functions and the guard, and an event row's `at` is its transaction's time: no
    caller can forge history, dwell times, leases or retention. Grants cost nothing
    per statement; a trigger checking the same would cost every write."""
    return grant_statements(machine, sql_ident(schema), sql_ident(role))


def grant_statements(machine: Machine, s: str, r: str) -> list[str]:
    """`app_grants` for a schema and a role already written as SQL (or placeholders)."""
    n = Names.of(machine)
    writes, logs = app_writes(machine)
    return [
        f"GRANT USAGE ON SCHEMA {s} TO {r};",
        f"GRANT SELECT, {writes} ON {s}.{n.table} TO {r};",
        f"GRANT SELECT, {logs} ON {s}.{n.events_table} TO {r};",
        f"GRANT SELECT ON {s}.{n.intervals} TO {r};",
        f"GRANT EXECUTE ON FUNCTION {', '.join(f'{s}.{f}' for f in callable_functions(machine))} TO {r};",
    ]


def app_writes(machine: Machine) -> tuple[str, str]:
    """The application's column privileges on the machine's table and on its event log
    (`app_grants`), which `fsmc migrate` grants again to the roles that move rows."""
    n = Names.of(machine)
    counts = [count_column(e) for e in machine.cap_limits]
    logged = [n.id_column, "version", "from_state", "event", "to_state", "actor", "payload"]
    return (
        f"INSERT (id, state), UPDATE ({', '.join(['state', 'state_version', *counts])})",
        f"INSERT ({', '.join(logged)})",
    )


def writer_prepare(machine: Machine) -> str:
    """The file's first statement: the writer role of this installation, made or checked.

    The role is NOLOGIN and one per installation (database, schema and machine): its
    name is `<schema>_<machine>` (cut to 40 bytes) `_writer_<hash>`, the hash over the
    database's, the schema's and the machine's names, so no two installations in one cluster share it and the owner of
    one cannot use another's (an owner is a member of its own writer). It is created
    here when the installer may create roles, and must otherwise exist, granted to the
    installer: the error says exactly what an administrator runs, and it comes first,
    so a refused install has changed nothing even without `psql -1`. A role that can
    log in, is a superuser or bypasses row security is refused: whoever became it
    would write rows past every check. Then `<machine>_fsmc_writer()` is (re)made to
    return the name, which the statements creating the triggers read to put it into
    their WHEN clauses as a literal (`pgschema.Trigger.create`): PostgreSQL prepares a
    WHEN clause for every statement, and folding even an IMMUTABLE SQL function there
    runs the SQL function executor (measured: a tenth of `_apply`'s CPU for three
    triggers). `fsmc migrate` runs this too (before it creates triggers)."""
    n = Names.of(machine)
    return f"""\
-- This installation's writer role: it owns the functions that move rows, and the
-- triggers below skip their checks for its writes (they name it in their WHEN clause). Made here if
-- the installer may create roles; otherwise it must exist (NOLOGIN, granted to the
-- installer), and this refuses before anything is created, saying what to run.
DO $fsmc$
DECLARE
    v_schema pg_catalog.text := pg_catalog.current_schema();
    v_head pg_catalog.text;
    v_role pg_catalog.text;
BEGIN
    IF v_schema IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_schema_name',
            MESSAGE = 'fsmc: no schema to install into: the search_path names no existing schema; nothing was changed',
            HINT = 'set search_path to the schema to install into';
    END IF;
    v_head := v_schema || '_' || {sql_str(str(machine.name))};
    WHILE pg_catalog.octet_length(v_head) > 40 LOOP
        v_head := pg_catalog.left(v_head, -1);
    END LOOP;
    v_role := v_head || '_writer_' || pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
        pg_catalog.format('%I.%I.%I', pg_catalog.current_database(), v_schema, {sql_str(str(machine.name))}), 'UTF8')), 'hex'), 10);
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) v_role) THEN
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                       WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER AND (r.rolcreaterole OR r.rolsuper)) THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = pg_catalog.format('fsmc: role %I does not exist, and %I may not create roles; nothing was changed', v_role, CURRENT_USER),
                HINT = pg_catalog.format('have an administrator run: CREATE ROLE %I NOLOGIN; GRANT %I TO %I;', v_role, v_role, CURRENT_USER);
        END IF;
        EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
        EXECUTE pg_catalog.format('GRANT %I TO %I', v_role, CURRENT_USER);
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) v_role
               AND (r.rolcanlogin OR r.rolsuper OR r.rolbypassrls)) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('fsmc: role %I can log in, is a superuser or bypasses row security: whoever became it would write rows past every check; nothing was changed', v_role),
            HINT = pg_catalog.format('ALTER ROLE %I NOLOGIN NOSUPERUSER NOBYPASSRLS;', v_role);
    END IF;
    IF NOT pg_catalog.pg_has_role(CURRENT_USER, v_role, 'MEMBER') THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format('fsmc: %I is not a member of role %I, so it cannot give it the functions; nothing was changed', CURRENT_USER, v_role),
            HINT = pg_catalog.format('have an administrator run: GRANT %I TO %I;', v_role, CURRENT_USER);
    END IF;
    EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION %I.%I() RETURNS pg_catalog.name LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN %L::pg_catalog.name',
                              v_schema, {sql_str(unquote(n.writer))}, v_role);
END
$fsmc$;"""


def writer_setup(machine: Machine) -> str:
    """The statement, after every function exists, that gives the writer role (see
    `writer_prepare`) what the functions need on this schema (and CREATE on it, which
    PostgreSQL asks of a function's owner), then the functions that move rows; and
    takes EXECUTE on every SECURITY DEFINER function from PUBLIC, so only the roles
    granted it can move rows (the README's grants). `fsmc migrate` runs it again after
    replacing functions."""
    owned, definers = [unquote(f) for f in writer_functions(machine)], [unquote(f) for f in callable_functions(machine)]
    every = list(dict.fromkeys(owned + definers))
    n = Names.of(machine)
    return f"""\
-- The writer role gets what the functions need, then the functions that move rows.
DO $fsmc$
DECLARE
    v_role pg_catalog.text := {n.writer}();
    v_schema pg_catalog.text := pg_catalog.current_schema();
    v_function record;
BEGIN
    EXECUTE pg_catalog.format('GRANT USAGE, CREATE ON SCHEMA %I TO %I', v_schema, v_role);
    EXECUTE pg_catalog.format('GRANT SELECT, UPDATE ON TABLE %I.%I TO %I', v_schema, {sql_str(unquote(n.table))}, v_role);
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON TABLE %I.%I TO %I', v_schema, {sql_str(unquote(n.events_table))}, v_role);
    FOR v_function IN
        SELECT p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid) AS args
        FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(v_schema)
          AND p.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY ({_pg_text_array(every)})
    LOOP
        IF v_function.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY ({_pg_text_array(owned)}) THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %I.%I(%s) OWNER TO %I',
                                      v_schema, v_function.proname, v_function.args, v_role);
        END IF;
        IF v_function.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY ({_pg_text_array(definers)}) THEN
            EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %I.%I(%s) FROM PUBLIC',
                                      v_schema, v_function.proname, v_function.args);
        END IF;
    END LOOP;
END
$fsmc$;"""


def function_names(machine: Machine, model: Schema | None = None) -> list[str]:
    """Every function the file creates, trigger functions and the writer role's name
    function (`writer_prepare`) included (names unquoted). `model` is the machine's
    `schema()` when the caller has it (building it renders every body again)."""
    model = schema(machine) if model is None else model
    return [*model.function_names(), unquote(Names.of(machine).writer)]



def _short_hash(parts: Iterable[str]) -> str:
    """8 hex digits naming a set of names (a changed set gets another name)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:8]


def count_column(event: str) -> str:
    """The column counting a capped event's firings: `<event>_count`."""
    return sql_ident(sql_name(event, "count"))


def count_check(machine: Machine, event: str) -> str:
    """The CHECK that keeps a capped event's count within 0..cap."""
    return sql_ident(sql_name(str(machine.postgres.table), event, "count_check"))


def id_column(machine: Machine) -> str:
    """The event log's reference to the machine's row: `<machine>_id`."""
    return f"{machine.name}_id"


def sql_in(expression: str, values: Iterable[str]) -> str:
    """`expression IN ('a', 'b')` over literals, or `false` for no values (SQL has no `IN ()`)."""
    literals = [sql_str(v) for v in values]
    if not literals:
        return "false"
    return f"{expression} IN ({', '.join(literals)})"


# An index predicate listing more states than this is written as the complement when
# that is shorter: PostgreSQL keeps a partial index's predicate in pg_index, which has
# no TOAST table, so a list of a thousand states made the CREATE INDEX fail ("row is
# too big"). Below it, every spec keeps the plain list.
LONG_STATE_LIST = 100


def sql_among(expression: str, states: Sequence[str], others: Sequence[str]) -> str:
    """`expression` is one of `states`, where `others` are the rest of the spec's
    states: `sql_in` of them, or `NOT` (`sql_in` of the others) when `states` are
    many and the others fewer (the same rows: the state CHECK admits no other value,
    and NOT NULL no NULL). The index and the query that must use it are written with
    this one function, so the planner sees the same predicate in both."""
    if len(states) > LONG_STATE_LIST and 0 < len(others) < len(states):
        return f"NOT ({sql_in(expression, others)})"
    return sql_in(expression, states)


def sql_any(expression: str, values: Iterable[str]) -> str:
    """`expression = ANY ('{...}'::text[])`: one constant, looked up by hash past a few
    elements. CHECK constraints use this form: PostgreSQL rebuilds a CHECK expression
    for every statement that writes the table, and an `IN` list of n literals costs
    that rebuild n nodes (the spec's 11 triples as a row `IN` list cost more than the
    rest of the INSERT)."""
    return f"{expression} = ANY ({sql_text_array(values)})"


def joined(*names: str) -> str:
    """Several names as one text, space-separated: unambiguous, since names hold no space."""
    return " ".join(names)


# --- the claim rule (fsmc.facts), encoded in SQL ---------------------------------------


def claim_assignments(change: str, actor: str, row: str = "") -> list[str]:
    """`column = CASE <change> WHEN 'enter' THEN ... ELSE <row>.column END` for each
    claim column, from `facts.CLAIM_RULE`: `change` is an SQL expression whose value
    is a `facts.Change`, `actor` one for the actor, `row` the updated row's alias."""
    return [f"{column} = {value}" for column, value in claim_values(change, actor, row)]


def claim_values(change: str, actor: str, row: str = "") -> list[tuple[str, str]]:
    """(column, `CASE <change> WHEN 'enter' THEN ... ELSE <row>.column END`) for each
    claim column: `claim_assignments`, for a trigger that assigns NEW's fields."""
    out: list[tuple[str, str]] = []
    for i, column in enumerate(CLAIM_COLUMNS):
        kept = f"{row}.{column}" if row else column
        values = {Action.ACTOR: actor, Action.NOW: "pg_catalog.now()", Action.CLEAR: "NULL"}
        branches = [
            f"WHEN {sql_str(c.value)} THEN {values[actions[i]]}"
            for c, actions in CLAIM_RULE.items()
            if actions[i] is not Action.KEEP
        ]
        out.append((column, f"CASE {change} {' '.join(branches)} ELSE {kept} END"))
    return out


# --- typed template contexts ---------------------------------------------------------


@dataclass(frozen=True)
class Codes:
    illegal: str = sqlstate.ILLEGAL_TRANSITION
    unknown_event: str = sqlstate.UNKNOWN_EVENT
    unknown_id: str = sqlstate.UNKNOWN_ID
    bypass: str = sqlstate.BYPASS_WRITE
    unlogged: str = sqlstate.UNLOGGED_CHANGE
    append_only: str = sqlstate.APPEND_ONLY
    cap_reached: str = sqlstate.CAP_REACHED


@dataclass(frozen=True)
class LeaseContext:
    reclaim: str
    in_lease: str  # t.state in a lease state
    apply_claims: list[str]  # _apply's claim assignments
    reclaim_claims: list[str]  # _reclaim's claim assignments
    moves: list[tuple[str, str, str]]  # (lease state, target, change) of the reclaim event
    guard_change: str  # the lease change (`facts.Change`) of a direct move from OLD.state to NEW.state
    guard_claims: list[tuple[str, str]]  # the guard's claim columns and their values (`claim_values`)


@dataclass(frozen=True)
class CapContext:
    event: str
    column: str  # `<event>_count`, unquoted (names are [a-z0-9_])
    limit: int
    pair_declared: str  # (OLD.state, NEW.state) is one of the event's edges


@dataclass(frozen=True)
class ClaimContext:
    sources: str  # the states each event leads from, a jsonb constant (`sources_jsonb`)
    claims: list[str]  # claim's claim assignments (with a lease)
    # Claimable: where a row waits for a worker (neither terminal nor under a lease;
    # the lease states have their own index, which reclaim must keep using). The same
    # literal list in the index and in claim's WHERE, so the planner proves the partial
    # index applies whatever the event's sources are.
    claimable_array: str
    in_claimable: str
    index_predicate: str


@dataclass(frozen=True)
class PurgeContext:
    in_terminal: str
    index_predicate: str


@dataclass(frozen=True)
class BodyContext:
    """What templates/machine_bodies.sql.j2 fills in (its fields are its variables)."""

    machine: str
    n: Names
    initial: str
    by_state: list[tuple[str, list[tuple[str, str]]]]  # (state, [(event, its targets as text[])])
    event_declared: str
    state_terminal: str
    new_state_declared: str
    pair_declared: str
    old_state_terminal: str
    event_list: str
    lease: LeaseContext | None
    codes: Codes
    id_type: str
    claiming: ClaimContext  # not `claim`: the macros are named after the functions
    purging: PurgeContext
    caps: list[CapContext]
    moves: str  # `_apply`'s table of moves, a jsonb constant (`moves_jsonb`)
    digest: str  # the machine's digest, which a body checks is still the schema's


@dataclass(frozen=True)
class FileContext:
    """What templates/machine.sql.j2 fills in (besides the generated-file header)."""

    machine: str
    description: str
    states: list[tuple[str, str]]
    events: list[tuple[str, str]]
    codes: Codes
    statements: list[tuple[tuple[str, ...], str]]  # (comment lines, escaped; statement)
    prepare: str  # the first statement (writer_prepare)
    pin: str


def as_variables(context: object) -> dict[str, object]:
    """A typed context's fields as template variables (shallow: values stay typed)."""
    return {f.name: getattr(context, f.name) for f in fields(context)}  # type: ignore[arg-type]


# A name as a JSON string, made once per name. The two jsonb constants below are
# written as text, not built as dicts for json.dumps: for a spec of 20,000 transitions
# the dicts (and the garbage collections they set off) cost a build a tenth of its time.
_json_name = cache(partial(json.dumps, ensure_ascii=False))


# A pair's targets as a text[] literal, made once per set of targets (most pairs of
# a large spec share their one target with others).
_targets_array = cache(sql_text_array)


def moves_jsonb(m: Machine) -> str:
    """The spec's moves as `_apply` and `_claim` look them up, a jsonb constant: for
    each (state, event) pair with a transition, under the key "state event", `s` names
    the target when there is one (a choice has none: its caller must name one) and
    `t` maps each target to its lease change. A lookup is a binary search of the keys,
    so a move costs the same in a spec of ten transitions as in one of thousands,
    where scanning the spec's table as rows cost a call time in proportion to its
    size. Keys in the spec's order: jsonb orders them itself."""
    held = set(facts.lease_states(m))
    single: dict[str, str] = {}
    targets: dict[str, str] = {}  # key -> its `t` object's members, as JSON text
    for s, e, t in m.edges:
        key = f"{s} {e}"  # joined(s, e)
        member = f'{_json_name(t)}: "{facts.change_of(s in held, t in held).value}"'
        if key in targets:
            targets[key] += ", " + member
        else:
            targets[key] = member
            if (s, e) not in m.choices:
                single[key] = t
    pairs = (
        f"{_json_name(key)}: {{" + (f'"s": {_json_name(single[key])}, ' if key in single else "") + f'"t": {{{to}}}}}'
        for key, to in targets.items()
    )
    return sql_str("{" + ", ".join(pairs) + "}") + "::pg_catalog.jsonb"


def sources_jsonb(m: Machine) -> str:
    """The states each event leads from, as `_claim` looks them up, a jsonb constant:
    under each event, `s` lists the states where it has one target (which a NULL
    to_state picks) and `t` maps each target to the states it leads there from."""
    single: dict[str, str] = {}  # event -> its `s` array's elements, as JSON text
    targets: dict[str, dict[str, str]] = {}  # event -> target -> its sources, as JSON text
    for s, e, t in m.edges:
        source = _json_name(s)
        by_target = targets.setdefault(e, {})
        by_target[t] = by_target[t] + ", " + source if t in by_target else source
        if (s, e) not in m.choices:
            single[e] = single[e] + ", " + source if e in single else source
    events = (
        f'{_json_name(e)}: {{"s": [{single.get(e, "")}], "t": {{'
        + ", ".join(f"{_json_name(t)}: [{sources}]" for t, sources in by_target.items())
        + "}}"
        for e, by_target in targets.items()
    )
    return sql_str("{" + ", ".join(events) + "}") + "::pg_catalog.jsonb"


def _change_sql(old: str, new: str, held: Sequence[str]) -> str:
    """The `facts.Change` of a move from state `old` to state `new` (SQL expressions),
    as `facts.change_of` tells it, in SQL."""
    c = {change: sql_str(change.value) for change in facts.Change}
    was, now = sql_any(old, held), sql_any(new, held)
    return (
        f"CASE WHEN {was} THEN CASE WHEN {now} THEN {c[facts.change_of(True, True)]} ELSE {c[facts.change_of(True, False)]} END"
        f" WHEN {now} THEN {c[facts.change_of(False, True)]} ELSE {c[facts.change_of(False, False)]} END"
    )


def body_context(machine: Machine, names: Names) -> BodyContext:
    m = machine
    leased = set(facts.lease_states(m))
    states = [str(s) for s in m.state_names]
    claimable = [s for s in states if s not in m.terminal_names and s not in leased]
    unclaimable = [s for s in states if s not in claimable]
    terminals = [str(s) for s in facts.terminals(m)]
    lease = None
    if m.lease is not None:
        held = facts.lease_states(m)
        lease = LeaseContext(
            reclaim=str(m.lease.reclaim),
            in_lease=sql_in("t.state", held),
            apply_claims=claim_assignments("v_lease", f"{names.apply}.actor", "t"),
            reclaim_claims=claim_assignments("x.lease", f"{names.reclaim}.actor", "t"),
            moves=[(s, t, c.value) for s, t, c in facts.reclaim_moves(m)],
            guard_change=_change_sql("OLD.state", "NEW.state", held),
            # BEFORE (with caps) the guard assigns NEW's fields; AFTER it updates the row.
            guard_claims=claim_values("v_lease", "SESSION_USER::pg_catalog.text", "OLD" if m.cap_limits else "t"),
        )
    return BodyContext(
        machine=str(m.name),
        n=names,
        initial=str(m.initial),
        by_state=[
            (source, [(event, _targets_array(m.targets[source, event])) for event in dict.fromkeys(e for e, _ in moves)])
            for source, moves in facts.by_state(m)
        ],
        event_declared=sql_any("v_event", m.event_names),
        state_terminal=sql_any("v_state", facts.terminals(m)),
        new_state_declared=sql_any("NEW.state", m.state_names),
        pair_declared=sql_any("(OLD.state || ' ' || NEW.state)", (joined(*p) for p in facts.pairs(m))),
        old_state_terminal=sql_any("OLD.state", facts.terminals(m)),
        event_list=", ".join(m.event_names),
        lease=lease,
        codes=Codes(),
        id_type=ID_COLUMNS[m.postgres.id_type][0],
        claiming=ClaimContext(
            sources=sources_jsonb(m),
            claims=claim_assignments("x.lease", f"{names.claim}.actor", "t") if m.lease else [],
            claimable_array=sql_text_array(claimable),
            in_claimable=sql_among("t.state", claimable, unclaimable),
            index_predicate=sql_among("state", claimable, unclaimable),
        ),
        purging=PurgeContext(
            in_terminal=sql_among("t.state", terminals, [s for s in states if s not in terminals]),
            index_predicate=sql_among("state", terminals, [s for s in states if s not in terminals]),
        ),
        moves=moves_jsonb(m),
        digest=machine_digest(m),
        caps=[
            CapContext(
                event=event,
                column=count_column(event),
                limit=limit,
                pair_declared=sql_any(
                    "(OLD.state || ' ' || NEW.state)",
                    dict.fromkeys(joined(s, t) for s, e, t in m.edges if e == event),
                ),
            )
            for event, limit in m.cap_limits.items()
        ],
    )


@cache
def _bodies_template() -> jinja2.Template:
    return environment().get_template("machine_bodies.sql.j2")


# --- the model -------------------------------------------------------------------------

# Why the objects are as they are, printed above them in the file.
_LEASE_INDEX = (
    "The reclaim scan reads only rows in a lease state. Keyed on state, not heartbeat_at:",
    "a heartbeat then changes no indexed column and stays a HOT update.",
)
_FUNCTIONS = (
    "Every function, trigger functions included, runs with its search_path pinned to",
    "pg_catalog, the schema it was created in, and pg_temp last (the block at the end of",
    "this file): nothing a caller creates (a temporary table named like a table here, a",
    "function or operator in a schema on the caller's search_path) changes what it does,",
    "and built-ins are called by their pg_catalog names, since an exact-type overload in",
    "a schema others may create in would win over them whatever the order. Those that",
    "look rows up by key also turn seq scans off: PL/pgSQL keeps a session's plan, and",
    "one made while a table was nearly empty (a fresh deployment) would scan it whole",
    "until the next ANALYZE.",
    "",
    "The machine this schema was built from (fsmc.digest): read by `fsmc migrate`.",
)
_GUARD_UPDATE = (
    "The rules live in the function, not in the WHEN clause: PostgreSQL rebuilds a",
    "WHEN clause for every statement, but keeps a PL/pgSQL function's expressions for",
    "the session, and the spec's lists are the costly part.",
)
_GUARD_UPDATE_COLUMNS = (
    "Only an UPDATE that sets state, state_version or a count reaches the function (a",
    "heartbeat does not), and none the writer role's functions make. The columns are",
    "named in the trigger, not compared in its WHEN clause: PostgreSQL rebuilds a WHEN",
    "clause for every statement, and tests a column list against the statement's SET",
    "list. What an earlier BEFORE trigger of the owner's changes in them is not seen.",
)
_GUARD_UPDATE_AFTER = (
    *_GUARD_UPDATE_COLUMNS,
    "It runs AFTER the row is written, so the statement fails all the same: a BEFORE",
    "UPDATE row trigger, whatever its columns and WHEN clause, makes PostgreSQL lock",
    "every row any UPDATE of the table writes before writing it, a WAL record more for",
    "each move and each heartbeat.",
)
_GUARD_UPDATE_BEFORE = (
    *_GUARD_UPDATE_COLUMNS,
    "It runs BEFORE the row is written, because the machine has caps: after, the count's",
    "CHECK would refuse a move past the cap first, with 23514 instead of the cap's code.",
)
_CHECK_LOGGED = (
    "Checked at COMMIT, so a transaction may update the row and insert its event row in",
    "either order, in separate statements. Under SET CONSTRAINTS ALL IMMEDIATE it runs",
    "at the end of each statement, beside the guard, and PostgreSQL runs triggers in the",
    "order of their names: this one's sorts after the guard's, so a move along no edge",
    "is answered by the guard (23F04), not by this check's missing event row (23F05).",
)
_STATE_MOVED = "UPDATE OF state, state_version"
_SEQSCAN_OFF = (("enable_seqscan", "off"),)
_WRITER = ("SECURITY DEFINER",)
_WRITER_FUNCTIONS = (
    "The functions that move rows run as the machine's writer role (SECURITY DEFINER; the",
    "block at the end of this file creates the role if needed and gives it these functions).",
    "It is NOLOGIN and granted to no application, so the triggers below can tell these",
    "functions' writes, which keep to the spec by construction, from everyone else's, and",
    "skip their checks for them: enforcement then costs these calls almost nothing.",
)
_CLAIM_INDEX = (
    "Claim takes the oldest rows of the claimable states and purge the oldest terminal",
    "ones: over a table of mostly finished rows, each scan reads only its own states.",
    "Neither covers heartbeat_at, so heartbeats stay HOT updates.",
)
_PURGE_TICKETS = (
    "Purge's permit to delete history, one row per purging transaction: owned by the",
    "schema's owner and granted to no one, so only the SECURITY DEFINER purge function",
    "can write it, and the append-only trigger lets a DELETE through only while its",
    "transaction holds one (a setting or an advisory lock the caller could forge).",
)
_INTERVALS = (
    "Every stay of every row in a state: the first from created_at (no event brought it",
    "in), each later one from the event that brought it in, to the event that took it out",
    "(the next version's), or to now() while the row is still there.",
)
_FORMAT = (
    "The format of the schema fsmc built (fsmc.targets.sql.SCHEMA_FORMAT): `fsmc migrate`",
    "upgrades a database an older fsmc built (no such function: format 1) before it",
    "compares machines, so an old database is migrated, never taken for current.",
)
_PURGE = (
    "The only way history is deleted. SECURITY DEFINER, to write the owner's ticket table",
    "(the application role has no grant on it, so it cannot forge a ticket).",
)
_DOMAINS = (
    "The spec's states and its (from, event, to) triples, for the tables' CHECKs, which",
    "cast to these domains. PostgreSQL reads a table's CHECK back from the catalog for",
    "every statement that writes the table, but keeps a domain's CHECK parsed for the",
    "session: the lists are read once, and each lookup is a search of a jsonb's keys (for",
    "a move, one level per name).",
)
_APPEND_ONLY = ("SECURITY DEFINER only to read the ticket table, which the caller cannot.",)
_GUARD_DELETE = (
    "The event log refers to its rows by id without a foreign key: checking one on every",
    "event row cost _apply a tenth of its time, and the commit-time check already refuses",
    "an event row its row did not make. What the key also did, keeping a row that has",
    "history from being deleted or truncated away, this does (purge, holding a ticket,",
    "excepted). SECURITY DEFINER only to read the ticket table.",
)


def spec_domains(m: Machine) -> tuple[Domain, Domain]:
    """The domains holding the spec's states (keys of a jsonb) and its moves (from,
    event, to: paths through nested objects), which the two tables' CHECKs cast to.
    Each is named after a hash of its list: a spec with other states or moves makes
    another domain and so another CHECK, which `fsmc migrate` adds NOT VALID and
    validates where history allows. The log's CHECK casts `ARRAY[from_state, event,
    to_state]`: PostgreSQL parses a table's CHECK for every statement, and that array
    is half the text of the concatenation format 4 cast (`format4_transition_domain`)."""
    states = sorted(str(s) for s in m.state_names)  # sorted once: both uses sort them
    triples = sorted(_triples(m))
    return (
        Domain(sql_ident(sql_name(str(m.name), "state", _short_hash(states))), "text",
               sql_ident(sql_name(str(m.name), "state_check")), sql_jsonb_keys(states), _DOMAINS),
        Domain(sql_ident(sql_name(str(m.name), "moves", _short_hash(triples))), "text[]",
               sql_ident(sql_name(str(m.name), "transition_check")), sql_jsonb_paths(m.edges), paths=True),
    )  # fmt: skip


TRIPLE = "ARRAY[from_state, event, to_state]"  # what the log's CHECK casts to the moves domain


def format4_transition_domain(m: Machine) -> str:
    """The domain format 4's triple CHECK cast `from_state || ' ' || event || ' ' ||
    to_state` to (its name): `fsmc migrate` drops it when it moves that CHECK to the
    moves domain."""
    return sql_ident(sql_name(str(m.name), "transition", _short_hash(sorted(_triples(m)))))


def format3_transitions(m: Machine) -> str:
    """The signature of the function format 3 kept the triples in (its CHECK called it):
    `fsmc migrate` drops it when it moves that CHECK to the domain."""
    return sql_ident(sql_name(str(m.name), "transitions", _short_hash(sorted(_triples(m))))) + "(text, text, text)"


def _triples(m: Machine) -> list[str]:
    """The spec's (from, event, to) triples, each as one text."""
    return [joined(*e) for e in m.edges]


def schema(machine: Machine) -> Schema:
    """Every object `<machine>.sql` creates (contract 4.2; the module doc says why)."""
    m, n = machine, Names.of(machine)
    c = body_context(m, n)
    bodies = _bodies_template().make_module(vars=as_variables(c))

    def body(function: str) -> str:
        """The body of `function`: the macro of that name in machine_bodies.sql.j2."""
        return str(getattr(bodies, function)())

    id_type, id_default, identity = ID_COLUMNS[m.postgres.id_type]
    domains = spec_domains(m)
    state_domain, transition_domain = domains
    claim = [Column(col, "timestamptz" if col.endswith("_at") else "text") for col in CLAIM_COLUMNS]
    table = Table(
        name=n.table,
        columns=(
            Column("id", id_type, not_null=True, default=id_default, identity=identity),
            Column("state", "text", not_null=True, default=sql_str(str(m.initial))),
            Column("state_version", "bigint", not_null=True, default="0"),
            # When the row was born, and when it entered its current state (every move
            # sets it): the first stay of the intervals view, the order of claim and purge.
            Column("created_at", "timestamptz", not_null=True, default="pg_catalog.now()"),
            Column("entered_at", "timestamptz", not_null=True, default="pg_catalog.now()"),
            *(claim if m.lease else ()),
            *(Column(cap.column, "integer", not_null=True, default="0") for cap in c.caps),
        ),
        constraints=(
            Constraint(n.table_pkey, "PRIMARY KEY (id)"),
            state_domain.check_of(n.state_check, "state"),
            *(
                Constraint.of_check(count_check(m, cap.event), f"{cap.column} BETWEEN 0 AND {cap.limit}")
                for cap in c.caps
            ),
        ),
        options=(("fillfactor", "90"),) if m.lease else (),
    )
    events = Table(
        name=n.events_table,
        columns=(
            Column(n.id_column, id_type, not_null=True),
            Column("version", "bigint", not_null=True),
            Column("from_state", "text", not_null=True),
            Column("event", "text", not_null=True),
            Column("to_state", "text", not_null=True),
            Column("actor", "text", not_null=True),
            Column("at", "timestamptz", not_null=True, default="pg_catalog.now()"),
            Column("payload", "jsonb"),
        ),
        constraints=(
            Constraint(n.events_pkey, f"PRIMARY KEY ({n.id_column}, version)"),
            transition_domain.check_of(n.triple_check, TRIPLE),
        ),
        history=True,
    )
    indexes: tuple[Index, ...] = ()
    if m.lease is not None:
        where = sql_in("state", facts.lease_states(m))
        indexes = (Index(n.lease_index, n.table, "(state)", where, _LEASE_INDEX),)
    indexes += (
        Index(n.claim_index, n.table, "(entered_at)", c.claiming.index_predicate, _CLAIM_INDEX),
        Index(n.purge_index, n.table, "(entered_at)", c.purging.index_predicate),
    )
    tickets = Table(
        name=n.purge_tickets,
        columns=(Column("xid", "xid8", not_null=True),),
        constraints=(Constraint(sql_ident(sql_name(str(m.name), "purge_tickets", "pkey")), "PRIMARY KEY (xid)"),),
        comment=_PURGE_TICKETS,
    )
    views = (View(n.intervals, body("intervals"), _INTERVALS),)

    def trigger_function(name: str, body: str, *settings: tuple[str, str], comment: tuple[str, ...] = ()) -> Function:
        return Function(name, (), "trigger", "plpgsql", body, settings=settings, comment=comment)

    functions = [
        Function(n.digest, (), "text", "sql", sql_str(machine_digest(m)),
                 attributes=("IMMUTABLE", "PARALLEL SAFE"), comment=_FUNCTIONS),  # fmt: skip
        Function(n.format, (), "integer", "sql", str(SCHEMA_FORMAT),
                 attributes=("IMMUTABLE", "PARALLEL SAFE"), comment=_FORMAT),  # fmt: skip
        Function(
            n.apply,
            (
                Parameter("id", id_type),
                Parameter("event", "text"),
                Parameter("expected_version", "bigint"),
                Parameter("actor", "text"),
                Parameter("payload", "jsonb", "NULL"),
                Parameter("to_state", "text", "NULL"),
            ),
            "bigint", "plpgsql", body("apply"), attributes=_WRITER, settings=_SEQSCAN_OFF,
            comment=_WRITER_FUNCTIONS,
        ),  # fmt: skip
    ]
    if m.lease is not None:
        functions += [
            Function(n.heartbeat, (Parameter("id", id_type), Parameter("expected_version", "bigint")),
                     "boolean", "plpgsql", body("heartbeat"), attributes=_WRITER, settings=_SEQSCAN_OFF),  # fmt: skip
            Function(n.reclaim, (Parameter("older_than", "interval"), Parameter("actor", "text")),
                     f"SETOF {id_type}", "plpgsql", body("reclaim"), attributes=_WRITER),  # fmt: skip
        ]
    functions += [
        Function(
            n.claim,
            (
                Parameter("event", "text"),
                Parameter("actor", "text"),
                Parameter("max_rows", "integer", "1"),
                Parameter("to_state", "text", "NULL"),
            ),
            f"TABLE (id {id_type}, state_version bigint)", "plpgsql", body("claim"), attributes=_WRITER,
        ),  # fmt: skip
        Function(n.purge, (Parameter("older_than", "interval"), Parameter("max_rows", "integer")),
                 "bigint", "plpgsql", body("purge"), attributes=("SECURITY DEFINER",),
                 settings=_SEQSCAN_OFF, comment=_PURGE),  # fmt: skip
    ]
    functions += [
        trigger_function(n.guard_insert, body("guard_insert"), comment=(
            f"Defense in depth: writes that bypass {m.name}_apply (a manual UPDATE during an",
            "incident) still keep to the spec. Each trigger's column list or WHEN clause keeps",
            "from its function the writes its rule has nothing to say about.",
        )),  # fmt: skip
        Function(n.guard_update, (), "trigger", "plpgsql", body("guard_update"), attributes=_WRITER,
                 settings=_SEQSCAN_OFF, comment=_GUARD_UPDATE),  # fmt: skip
        trigger_function(n.check_logged, body("check_logged"), *_SEQSCAN_OFF),
        trigger_function(n.check_event, body("check_event"), *_SEQSCAN_OFF),
        Function(n.append_only, (), "trigger", "plpgsql", body("append_only"),
                 attributes=("SECURITY DEFINER",), comment=_APPEND_ONLY),  # fmt: skip
        Function(n.guard_delete, (), "trigger", "plpgsql", body("guard_delete"),
                 attributes=("SECURITY DEFINER",), comment=_GUARD_DELETE),  # fmt: skip
    ]
    born_elsewhere = " OR ".join(
        [
            f"NEW.state IS DISTINCT FROM {sql_str(str(m.initial))}",
            "NEW.state_version IS DISTINCT FROM 0",
            *(f"NEW.{cap.column} IS DISTINCT FROM 0" for cap in c.caps),
        ]
    )
    # A trigger's checks are for writes the writer role's functions did not make: those
    # moved the row along the spec and logged it in the same statement sequence.
    # The functions return at once for a write that sets these columns to what they were.
    moved = "UPDATE OF " + ", ".join(["state", "state_version", *(cap.column for cap in c.caps)])
    triggers = (
        Trigger(n.guard_insert, n.table, "BEFORE", "INSERT", n.guard_insert, when=born_elsewhere),
        Trigger(n.guard_update, n.table, "BEFORE" if c.caps else "AFTER", moved, n.guard_update,
                comment=_GUARD_UPDATE_BEFORE if c.caps else _GUARD_UPDATE_AFTER, writer=n.writer),  # fmt: skip
        Trigger(n.logged_check, n.table, "AFTER", _STATE_MOVED, n.check_logged,
                deferred=True, comment=_CHECK_LOGGED, writer=n.writer),  # fmt: skip
        Trigger(n.check_event, n.events_table, "AFTER", "INSERT", n.check_event, deferred=True,
                writer=n.writer),  # fmt: skip
        Trigger(n.guard_delete, n.table, "BEFORE", "DELETE", n.guard_delete),
        Trigger(n.guard_delete_truncate, n.table, "BEFORE", "TRUNCATE", n.guard_delete, for_each="STATEMENT"),
        Trigger(n.append_only, n.events_table, "BEFORE", "UPDATE OR DELETE", n.append_only),
        Trigger(n.append_only_truncate, n.events_table, "BEFORE", "TRUNCATE", n.append_only,
                for_each="STATEMENT"),  # fmt: skip
    )
    return Schema((table, events, tickets), indexes, tuple(functions), triggers, views, domains)


# The file's comment lines are fsmc's own sentences (a machine's name at most), the
# same for every machine: each is escaped once per process.
_comment = cache(sql_comment)


def context(machine: Machine) -> FileContext:
    m = machine
    model = schema(m)
    descriptions = {str(d.name): d.description or "" for d in m.states}
    event_descriptions = {str(d.name): d.description or "" for d in m.events}
    return FileContext(
        machine=str(m.name),
        description=m.description or "",
        states=[(s, descriptions.get(s, "")) for s in m.state_names],
        events=[(e, event_descriptions.get(e, "")) for e in m.event_names],
        codes=Codes(),
        statements=[(tuple(_comment(line) for line in c), s) for c, s in model.statements()],
        prepare=writer_prepare(m),
        pin=writer_setup(m) + "\n\n" + pin_search_path(function_names(m, model)),
    )


@dataclass(frozen=True)
class SuiteContext:
    """What the generated pytest file needs to reach the database: the file's name, the
    identifiers as SQL spells them, the id type and the SQLSTATEs."""

    file: str
    table: str
    events_table: str
    id_column: str
    apply: str
    writer: str
    id_type: str
    codes: Codes
    lease: bool
    grants: list[str]  # `app_grants`, with `{schema}` and `{role}` for the quoted names


def test_context(machine: Machine) -> SuiteContext:
    names = Names.of(machine)
    return SuiteContext(
        file=Paths.of(machine).sql.rsplit("/", 1)[-1],
        table=names.table,
        events_table=names.events_table,
        id_column=names.id_column,
        apply=names.apply,
        writer=names.writer,
        id_type=machine.postgres.id_type,
        codes=Codes(),
        lease=machine.lease is not None,
        grants=grant_statements(machine, "{schema}", "{role}"),
    )


def emit(machine: Machine) -> str:
    return render("machine.sql.j2", **header_context(machine), **as_variables(context(machine)))
