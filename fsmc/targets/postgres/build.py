"""The PostgreSQL target's builder (contract 4.2): the database itself enforces the spec.

In: a checked `Machine`. Out: a `Build`, everything the target derives from it, made
once: its `Names`, its `Schema` (the model), its `Install` statements, and the
typed contexts of its templates; `emit` renders the text of
`<machine>/<machine>.sql`, which applies
with `psql -v ON_ERROR_STOP=1 -1 -f FILE` to an empty schema as a non-superuser
owner (PostgreSQL 15 or later; nothing beyond plpgsql and core functions).

What the file builds, and why it is shaped so:

- T (the machine's table): `state` is `text` with a CHECK over the declared states,
  never an ENUM (an enum value can never be dropped; a CHECK can be replaced).
  A BEFORE INSERT trigger refuses a row born anywhere but an initial state at
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
  owned by a NOLOGIN role of this installation alone (`install`), and the triggers on T and E skip the writes that role makes,
  naming it as a text literal in their WHEN clauses (`CURRENT_USER <> 'role'::text`:
  a `name` constant would be 64 bytes to parse per statement). Those writes keep to the spec by
  construction; everyone else's still get every check. No application can become
  the role, and EXECUTE on these functions is granted, not PUBLIC's. Without one
  (1.2's `postgres.writer_role: false`, for hosts where nobody can create a role) the
  functions stay the installer's and the triggers skip no one: the functions' moves
  are checked too, and the update guard leaves what they stamped as they wrote it.
- With `lease`: the claim bookkeeping is part of that same UPDATE; the partial index
  for reclaim is keyed on `state` over the lease states only, so a heartbeat (which
  changes only `heartbeat_at`) touches no indexed column and stays a HOT update; the
  table keeps 10% of each page free for those HOT updates. `<machine>_reclaim`
  locks stale rows with FOR UPDATE SKIP LOCKED (the lock re-checks the staleness
  predicate on the newest row version, so a refreshed heartbeat saves its row; two
  supervisors never wait for or deadlock on each other, and each row is reclaimed
  once), then moves them and appends their events, all in one statement.
- With `limits` (1.2): `<machine>_limits`, one row per place (a limit of 50 is 50
  slots), and triggers on T for every role, the writer's included: a row entering a
  limited state takes a free slot no other transaction holds (FOR UPDATE SKIP LOCKED)
  or is refused (23F09), a row leaving frees its own. Two transactions never hold one
  slot, so no commit exceeds the limit under READ COMMITTED, and movers into one state
  do not queue behind each other (a counter row per state did: every mover held it to
  its commit). `_claim` locks free slots first and picks no more rows than it got.
- `<machine>_fsmc_digest()` returns `fsmc.digest.machine_digest` (see there).
- Every function's `search_path` is pinned to `pg_catalog`, the schema it was
  created in and `pg_temp` last (`install`'s pin, the file's last statement), so
  it finds its own tables whatever the caller's path is and nothing a caller
  creates changes what it does; those that look rows up by key also set
  `enable_seqscan = off`, since a session keeps the plan it made while a fresh
  table was nearly empty.

How it is made: this module is the only one that knows every room of
`fsmc.targets.postgres`. `build(machine)` takes the identifiers from `names`, the
SQL expressions and constants from `encode`, and builds the file's objects as a
`model.Schema` (function bodies rendered from templates/machine_bodies.sql.j2 with a
`BodyContext`) and the installation's statements (`install`, from
templates/install.sql.j2); `emit` renders the model into templates/machine.sql.j2
with a `FileContext`. `fsmc migrate` takes finished builds and compares their models;
nothing reads the text back. Every context is a dataclass whose fields are exactly
its template's variables.

SQLSTATEs are `fsmc.targets.sqlstate`'s and reach the templates one way: its `Codes`.
Every state and event name reaches SQL as a literal through `sql_str`; every
identifier through `sql_ident` (`Names.sql`), derived names (`sql_name`) kept within
63 bytes and distinct. Function bodies are dollar-quoted and hold only names, which
the naming rule limits to `[a-z0-9_]`.

A lease state whose reclaim event is a choice cannot be reclaimed (reclaim names no
target): `_reclaim` leaves such rows where they are, and the build says so in its
`warnings`, rather than pick one of the targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import jinja2

from fsmc import columns, facts
from fsmc.digest import machine_digest
from fsmc.escape import (
    sql_comment,
    sql_ident,
    sql_jsonb_keys,
    sql_jsonb_paths,
    sql_str,
    sql_text_array,
)
from fsmc.facts import CLAIM_COLUMNS
from fsmc.model import DeclaredColumn, Machine
from fsmc.targets.common import ID_TYPES, Header, Paths
from fsmc.targets.postgres import comments
from fsmc.targets.postgres.encode import (
    backoff_exponent,
    change_sql,
    claim_assignments,
    claim_values,
    claims_settled,
    joined,
    moves_jsonb,
    short_hash,
    sources_jsonb,
    sql_among,
    sql_any,
    sql_entered_or_left,
    sql_in,
    sql_one_of,
    targets_array,
    triples,
)
from fsmc.targets.postgres.formats import SCHEMA_FORMAT
from fsmc.targets.postgres.install import Install, install
from fsmc.targets.postgres.model import (
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
)
from fsmc.targets.postgres.names import (
    Names,
    Quoted,
    cap_check,
    cap_column,
    count_check,
    count_column,
    domain_names,
    wake_channel_sql,
)
from fsmc.targets.sqlstate import Codes
from fsmc.templating import as_variables, environment, render

TRIPLE = "ARRAY[from_state, event, to_state]"  # what the log's CHECK casts to the moves domain
STAMP = "pg_catalog.clock_timestamp()"  # a time the database writes: the write's moment


# --- typed template contexts ---------------------------------------------------------


@dataclass(frozen=True)
class LeaseContext:
    reclaim: str
    in_lease: str  # t.state in a lease state
    apply_claims: list[str]  # _apply's claim assignments
    reclaim_claims: list[str]  # _reclaim's claim assignments
    moves: list[tuple[str, str, str]]  # (lease state, target, change) of the reclaim event
    guard_change: str  # the lease change (`facts.Change`) of a direct move from OLD.state to NEW.state
    guard_claims: list[tuple[str, str]]  # the guard's claim columns and their values (`claim_values`)
    settled: str  # NEW's claim columns already hold what the lease rule leaves (`claims_settled`)


@dataclass(frozen=True)
class CapContext:
    event: str
    column: str  # `<event>_count`, as SQL spells it
    limit: int  # the cap; for a cap per row (1.2), the default a row gets
    pair_declared: str  # (OLD.state, NEW.state) is one of the event's edges
    cap_column: str = ""  # 1.2: the row's own cap (`<event>_cap`, as SQL spells it), or ""
    reset_pairs: str = ""  # 1.2: (OLD.state, NEW.state) is a move that gives this budget back, or ""
    most: int = 0  # 1.2: the largest cap a row may have (for a cap per row)


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
    # 1.2's `postgres.claim`: (column, claim's parameter) a claim may be limited to, and
    # the ORDER BY of a claim of an untimed event (the lowest `order` first, then the oldest).
    by: list[tuple[str, str]]
    order: str


@dataclass(frozen=True)
class TimedState:
    """A state a timed transition leaves: how its row's due_at is set on entry."""

    state: str
    kind: str  # delay | backoff | due_at
    ms: int
    factor: float
    most_ms: int
    most_exponent: int  # past it the backoff is at its max: power() never overflows
    count: str  # the timed event's count column (a backoff), as SQL spells it, or ""
    event: str  # the timed event


@dataclass(frozen=True)
class TimingContext:
    states: list[TimedState]
    given: bool  # some state waits for the caller's due_at: _apply and _claim take one
    due_events: list[str]  # events timed at every source: a claim reads the due index
    in_timed: str  # t.state in a timed state (the due index's predicate, for t)
    index_predicate: str


@dataclass(frozen=True)
class PlainMoves:
    """The events whose moves have no `otherwise`, `reset` or timer (1.2): `_apply` and
    `_claim` move them by statements without those expressions."""

    events: str  # a text[] literal
    enter_timed: bool  # some of them lead into a timed state (else due_at is NULL after them)


@dataclass(frozen=True)
class PurgeContext:
    in_purgeable: str
    index_predicate: str


@dataclass(frozen=True)
class LimitsContext:
    """1.2's `limits`: what the counting trigger and `_claim` need."""

    new_limited: str  # NEW.state is a limited state
    old_limited: str  # OLD.state is a limited state
    # The counting triggers' WHEN clauses, as short as they can be (`sql_one_of`): the
    # row is born in a limited state, moves into or out of one, is deleted from one.
    inserted: str
    moved: str
    deleted: str
    # (event, the limited states among its targets and otherwise, a text[]): where
    # `_claim` locks free slots before it picks rows
    claim_targets: list[tuple[str, str]]


@dataclass(frozen=True)
class WakeEvent:
    """An event of `postgres.notify`, as `_claimable_in` looks for its rows."""

    event: str
    untimed: str  # its sources without a timer, a text[] ("" for none)
    claimable: bool  # those sources are all claimable: the claim index has their rows
    timed: str  # its timed sources, a text[] ("" for none): the due index has their rows
    limited: str  # the limited states it may move rows into, a text[] ("" for none)
    under_cap: str  # `AND (...)`: a capped event's budget lets it fire on t ("" uncapped)


@dataclass(frozen=True)
class WakeContext:
    """`postgres.notify`: what the wake-up trigger function and `_claimable_in` need."""

    channel: str  # the installation's channel, an SQL expression over TG_TABLE_SCHEMA
    events: list[WakeEvent]
    notified: str  # the events that notify, as a message lists them
    # 1.2's `postgres.claim.by`: (column, `_claimable_in`'s parameter), as a claim is
    # limited (NULL: any), and the ORDER BY of the claim index an untimed event reads
    by: list[tuple[str, str]]
    order: str


@dataclass(frozen=True)
class BodyContext:
    """What templates/machine_bodies.sql.j2 fills in (its fields are its variables)."""

    machine: str
    n: Quoted
    born_elsewhere: str  # NEW.state is none of the initial states
    born_in: str  # where a row is born, as the refusal says it
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
    budgets: bool  # 1.2: some move has an `otherwise` or a `reset`, which `moves` holds
    # With budgets: the events none of whose moves has an `otherwise`, a `reset` or a
    # timer, which `_apply` and `_claim` move by plainer statements (None: no such event).
    plain_moves: PlainMoves | None
    timing: TimingContext | None  # 1.2: the timed transitions (`after`), or None
    digest: str  # the machine's digest, which a body checks is still the schema's
    limits: LimitsContext | None  # 1.2: with `limits`
    # 1.2's `postgres.writer_role`: false, the guard sees the functions' moves too, and
    # leaves what they stamped as it is.
    writer_role: bool
    waking: WakeContext | None = None  # with `postgres.notify`


@dataclass(frozen=True)
class FileContext:
    """What templates/machine.sql.j2 fills in (its fields are its variables)."""

    header: Header
    machine: str
    description: str
    states: list[tuple[str, str]]
    events: list[tuple[str, str]]
    codes: Codes
    statements: list[tuple[tuple[str, ...], str]]  # (comment lines, escaped; statement)
    prepare: str  # the first statement (`Install.prepare`)
    pin: str  # the last ones (`Install.finish`)


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
    limits_table: str  # 1.2: the limits' slots ("" without limits)
    writer_role: bool  # 1.2's `postgres.writer_role`: false, no writer role (nor its name function) to drop


# --- the build -------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    """Everything the PostgreSQL target derives from one machine, made once (`build`):
    what `emit`, `fsmc migrate`, the other targets, the tests and the benchmarks take."""

    machine: Machine
    names: Names  # raw; `names.sql` as SQL spells them
    schema: Schema
    functions: tuple[str, ...]  # every function the file creates (raw), the writer's name function included
    install: Install
    body: BodyContext
    triples_hash: str  # names the moves domain (and the domains of formats 3 and 4)
    warnings: tuple[str, ...]  # what the build could not do as the spec asks (see the module doc)


def build(machine: Machine) -> Build:
    """Every object `<machine>.sql` creates (contract 4.2; the module doc says why)."""
    m, names = machine, Names.of(machine)
    n = names.sql
    c = body_context(m, n)
    bodies = _bodies_template().make_module(vars=as_variables(c))

    def body(function: str) -> str:
        """The body of `function`: the macro of that name in machine_bodies.sql.j2."""
        return str(getattr(bodies, function)())

    ids = ID_TYPES[m.postgres.id_type]
    id_type = ids.sql
    declared_types = {str(c.name): c.type for c in m.postgres.columns}
    triples_hash = short_hash(triples(m))
    domains = spec_domains(m, triples_hash)
    state_domain, transition_domain = domains
    claim = [Column(col, "timestamptz" if col.endswith("_at") else "text") for col in CLAIM_COLUMNS]
    table = Table(
        name=n.table,
        columns=(
            Column("id", id_type, not_null=True, default=ids.default, identity=ids.identity),
            Column("state", "text", not_null=True, default=sql_str(str(m.initial))),
            Column("state_version", "bigint", not_null=True, default="0"),
            # When the row was born, and when it entered its current state (every move
            # sets it): the first stay of the intervals view, the order of claim and purge.
            # The moment the row is written, not its transaction's start: no stamp lies
            # before its write, however long the writer's transaction has been open.
            Column("created_at", "timestamptz", not_null=True, default=STAMP),
            Column("entered_at", "timestamptz", not_null=True, default=STAMP),
            *(claim if m.lease else ()),
            *(Column(cap.column, "integer", not_null=True, default="0") for cap in c.caps),
            *(Column(cap.cap_column, "integer", not_null=True, default=str(cap.limit))
              for cap in c.caps if cap.cap_column),  # fmt: skip
            # 1.2: when a row in a timed state is due (set on entry: NULL elsewhere).
            *((Column("due_at", "timestamptz"),) if c.timing else ()),
            # 1.2: the row's own data, as the spec declares it (`fsmc.columns`).
            *map(declared_column, m.postgres.columns),
        ),
        constraints=(
            Constraint(n.table_pkey, "PRIMARY KEY (id)"),
            state_domain.check_of(n.state_check, "state"),
            *(
                Constraint.of_check(sql_ident(count_check(m, cap.event)),
                                    f"{cap.column} BETWEEN 0 AND {cap.most or cap.limit}")  # fmt: skip
                for cap in c.caps
            ),
            *(
                Constraint.of_check(sql_ident(cap_check(m, cap.event)), f"{cap.cap_column} BETWEEN 0 AND {cap.most}")
                for cap in c.caps
                if cap.cap_column
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
            # The functions give their moves' time; an event row written by hand gets the
            # moment it is written.
            Column("at", "timestamptz", not_null=True, default=STAMP),
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
        indexes = (Index(n.lease_index, n.table, "(state)", where, comments.LEASE_INDEX),)
    if c.timing is not None:
        indexes += (Index(n.due_index, n.table, "(due_at)", c.timing.index_predicate),)
    indexes += (
        Index(n.claim_index, n.table, f"({', '.join(claim_key(m))})", c.claiming.index_predicate, comments.CLAIM_INDEX),
        *((Index(n.claim_by_index, n.table, f"({', '.join([*m.postgres.claim_by, *claim_key(m)])})",
                 c.claiming.index_predicate, comments.CLAIM_BY_INDEX),) if m.postgres.claim_by else ()),
        Index(n.purge_index, n.table, "(entered_at)", c.purging.index_predicate),
    )
    tickets = Table(
        name=n.purge_tickets,
        columns=(Column("xid", "xid8", not_null=True),),
        constraints=(Constraint(n.purge_tickets_pkey, "PRIMARY KEY (xid)"),),
        comment=comments.PURGE_TICKETS,
    )
    views = (View(n.intervals, body("intervals"), comments.INTERVALS),)
    tables: tuple[Table, ...] = (table, events, tickets)
    if m.state_limits:
        tables += (limits_table(m, n, id_type),)
        indexes += (Index(n.limits_free, n.limits, "(state, slot)", "holder IS NULL", comments.LIMITS_FREE),)

    # Each function with its raw name, which the search_path pin takes (`install`).
    functions: list[tuple[str, Function]] = []

    def function(raw: str, *args: Parameter, returns: str, body: str, language: str = "plpgsql",
                 attributes: tuple[str, ...] = (), settings: tuple[tuple[str, str], ...] = (),
                 comment: tuple[str, ...] = ()) -> None:  # fmt: skip
        functions.append((raw, Function(sql_ident(raw), args, returns, language, body, attributes, settings, comment)))

    def trigger_function(raw: str, macro: str, *settings: tuple[str, str], comment: tuple[str, ...] = (),
                         attributes: tuple[str, ...] = ()) -> None:  # fmt: skip
        function(raw, returns="trigger", body=body(macro), attributes=attributes, settings=settings,
                 comment=comment)  # fmt: skip

    function(names.digest, returns="text", language="sql", body=sql_str(machine_digest(m)),
             attributes=("IMMUTABLE", "PARALLEL SAFE"), comment=comments.FUNCTIONS)  # fmt: skip
    function(names.format, returns="integer", language="sql", body=str(SCHEMA_FORMAT),
             attributes=("IMMUTABLE", "PARALLEL SAFE"), comment=comments.FORMAT)  # fmt: skip
    function(
        names.apply,
        Parameter("id", id_type),
        Parameter("event", "text"),
        Parameter("expected_version", "bigint"),
        Parameter("actor", "text"),
        Parameter("payload", "jsonb", "NULL"),
        Parameter("to_state", "text", "NULL"),
        *((Parameter("due_at", "timestamptz", "NULL"),) if c.timing and c.timing.given else ()),
        returns="bigint", body=body("apply"), attributes=_WRITER, settings=_SEQSCAN_OFF,
        comment=comments.WRITER_FUNCTIONS if m.postgres.writer_role else comments.CHECKED_FUNCTIONS,
    )  # fmt: skip
    if m.lease is not None:
        function(names.heartbeat, Parameter("id", id_type), Parameter("expected_version", "bigint"),
                 returns="boolean", body=body("heartbeat"), attributes=_WRITER, settings=_SEQSCAN_OFF)  # fmt: skip
        function(names.reclaim, Parameter("older_than", "interval"), Parameter("actor", "text"),
                 returns=f"SETOF {id_type}", body=body("reclaim"), attributes=_WRITER)  # fmt: skip
    function(
        names.claim,
        Parameter("event", "text"),
        Parameter("actor", "text"),
        Parameter("max_rows", "integer", "1"),
        Parameter("to_state", "text", "NULL"),
        *((Parameter("due_at", "timestamptz", "NULL"),) if c.timing and c.timing.given else ()),
        *(Parameter(str(name), columns.TYPES[declared_types[name]].sql, "NULL") for name in m.postgres.claim_by),
        returns=f"SETOF {n.table}", body=body("claim"), attributes=_WRITER, settings=_PLANNED_ONCE,
    )  # fmt: skip
    function(names.purge, Parameter("older_than", "interval"), Parameter("max_rows", "integer"),
             returns="bigint", body=body("purge"), attributes=("SECURITY DEFINER",),
             settings=_SEQSCAN_OFF, comment=comments.PURGE)  # fmt: skip
    trigger_function(names.guard_insert, "guard_insert", comment=(
        f"Defense in depth: writes that bypass {m.name}_apply (a manual UPDATE during an",
        "incident) still keep to the spec. Each trigger's column list or WHEN clause keeps",
        "from its function the writes its rule has nothing to say about.",
    ))  # fmt: skip
    trigger_function(names.guard_update, "guard_update", *_SEQSCAN_OFF, attributes=_WRITER,
                     comment=comments.GUARD_UPDATE)  # fmt: skip
    trigger_function(names.check_logged, "check_logged", *_SEQSCAN_OFF)
    trigger_function(names.check_event, "check_event", *_SEQSCAN_OFF)
    trigger_function(names.append_only, "append_only", attributes=("SECURITY DEFINER",),
                     comment=comments.APPEND_ONLY)  # fmt: skip
    trigger_function(names.guard_delete, "guard_delete", attributes=("SECURITY DEFINER",),
                     comment=comments.GUARD_DELETE)  # fmt: skip
    if c.limits is not None:
        # The owner's, for every writer: the writer role's moves count like any other.
        trigger_function(names.count_limits, "count_limits", attributes=("SECURITY DEFINER",),
                         comment=comments.COUNT_LIMITS)  # fmt: skip
    if c.waking is not None:
        # The caller's: sending a notification needs no privilege.
        trigger_function(names.notify, "notify", comment=comments.NOTIFY)
        function(names.claimable_in, Parameter("event", "text"),
                 *(Parameter(str(name), columns.TYPES[declared_types[name]].sql, "NULL") for name in m.postgres.claim_by),
                 returns="double precision", body=body("claimable_in"), attributes=_WRITER,
                 settings=_SEQSCAN_OFF, comment=comments.CLAIMABLE_IN)  # fmt: skip

    born_elsewhere = " OR ".join(
        [
            _born_elsewhere(m),
            "NEW.state_version IS DISTINCT FROM 0",
            *(f"NEW.{cap.column} IS DISTINCT FROM 0" for cap in c.caps),
        ]
    )
    # A trigger's checks are for writes the writer role's functions did not make: those
    # moved the row along the spec and logged it in the same statement sequence.
    # The functions return at once for a write that sets these columns to what they were.
    moved = "UPDATE OF " + ", ".join(["state", "state_version", *(cap.column for cap in c.caps),
                                      *(cap.cap_column for cap in c.caps if cap.cap_column)])  # fmt: skip
    if c.timing is not None:
        # A row born in a timed state gets its due time here (and nowhere else one).
        born_elsewhere += " OR " + c.timing.in_timed.replace("t.state", "NEW.state") + " OR NEW.due_at IS NOT NULL"
    # Without a writer role (1.2's `postgres.writer_role: false`) they skip no one.
    writer = n.writer if m.postgres.writer_role else None
    triggers: tuple[Trigger, ...] = (
        Trigger(n.guard_insert, n.table, "BEFORE", "INSERT", n.guard_insert, when=born_elsewhere),
        Trigger(n.guard_update, n.table, "BEFORE" if c.caps else "AFTER", moved, n.guard_update,
                comment=comments.guard_update(before=bool(c.caps), writer_role=m.postgres.writer_role),
                writer=writer),  # fmt: skip
        Trigger(n.logged_check, n.table, "AFTER", _STATE_MOVED, n.check_logged,
                deferred=True, comment=comments.CHECK_LOGGED, writer=writer),  # fmt: skip
        Trigger(n.check_event, n.events_table, "AFTER", "INSERT", n.check_event, deferred=True,
                writer=writer),  # fmt: skip
        Trigger(n.guard_delete, n.table, "BEFORE", "DELETE", n.guard_delete),
        Trigger(n.guard_delete_truncate, n.table, "BEFORE", "TRUNCATE", n.guard_delete, for_each="STATEMENT"),
        Trigger(n.append_only, n.events_table, "BEFORE", "UPDATE OR DELETE", n.append_only),
        Trigger(n.append_only_truncate, n.events_table, "BEFORE", "TRUNCATE", n.append_only,
                for_each="STATEMENT"),  # fmt: skip
    )
    if c.limits is not None:
        # No `writer`: these fire for the writer role's moves too. The WHEN clauses keep
        # every write that neither enters nor leaves a limited state from the function.
        triggers += (
            Trigger(n.limits_insert, n.table, "AFTER", "INSERT", n.count_limits, when=c.limits.inserted),
            Trigger(n.limits_update, n.table, "AFTER", "UPDATE OF state", n.count_limits, when=c.limits.moved,
                    comment=comments.LIMITS_TRIGGERS),  # fmt: skip
            Trigger(n.limits_delete, n.table, "AFTER", "DELETE", n.count_limits, when=c.limits.deleted),
            # A TRUNCATE of rows without history (the guard refuses the others) empties every state.
            Trigger(n.limits_truncate, n.table, "AFTER", "TRUNCATE", n.count_limits, for_each="STATEMENT"),
        )
    if c.waking is not None:
        # No `writer`: the writer role's moves (a claim of a retry, say) wake workers too.
        entered = sql_any("NEW.state", facts.wake_states(m))
        triggers += (
            Trigger(n.notify_insert, n.table, "AFTER", "INSERT", n.notify, when=entered,
                    comment=comments.NOTIFY_TRIGGERS),  # fmt: skip
            # A row moved into a queue a waiter waits on (a claim.by column set) is new
            # work there too.
            Trigger(n.notify_update, n.table, "AFTER", "UPDATE OF " + ", ".join(["state", *m.postgres.claim_by]),
                    n.notify, when=entered),  # fmt: skip
        )
    schema = Schema(tables, indexes, tuple(f for _, f in functions), triggers, views, domains)
    every = (*dict.fromkeys(raw for raw, _ in functions), *([names.writer] if m.postgres.writer_role else []))
    signatures = {raw: f.key for raw, f in functions} | ({names.writer: f"{n.writer}()"} if m.postgres.writer_role else {})
    return Build(
        machine=m,
        names=names,
        schema=schema,
        functions=every,
        install=install(m, names, signatures),
        body=c,
        triples_hash=triples_hash,
        warnings=tuple(
            f"{m.path}: lease state '{s}': the reclaim event '{m.lease.reclaim}' is a choice "
            f"({', '.join(ts)}), and reclaim names no target, so {m.name}_reclaim leaves such rows "
            "where they are"
            for s, ts in facts.reclaim_choices(m)
            if m.lease is not None
        ),
    )


_STATE_MOVED = "UPDATE OF state, state_version"
_SEQSCAN_OFF = (("enable_seqscan", "off"),)
# The claim's statements, planned once a session rather than on every call. PL/pgSQL
# keeps each statement's plan, but by default it plans again for each call's values
# until a plan for any values looks as cheap, and to the planner `LIMIT max_rows`
# might be a tenth of the table: it re-planned every call, and the planning was most
# of what a claim cost (a claim of one job, 355 -> 136 us of server time; with
# queue.yaml's budgets and timers, 547 -> 192 us). The plan made for any values is
# kept on the claim's indexes, whatever the table's size and order: no sequential
# scan, sort, hash or merge join (each only made dear; a plan with no other way still
# uses it), and no JIT, whose compiling cost a claim over a million rows 20 ms.
# The settings hold for all the claim runs, the triggers its writes fire included (a
# trigger of the user's on the table too): fsmc's own look rows up by key.
_PLANNED_ONCE = (("plan_cache_mode", "force_generic_plan"), ("enable_seqscan", "off"), ("enable_sort", "off"),
                 ("enable_hashjoin", "off"), ("enable_mergejoin", "off"), ("jit", "off"))  # fmt: skip
_WRITER = ("SECURITY DEFINER",)


def plain_moves(m: Machine) -> PlainMoves | None:
    """With budgets or timers (1.2): the events none of whose moves has an `otherwise`,
    a `reset` or a timer. None without budgets (every statement is plain then) or
    without such an event."""
    special = {e for s, e in (*m.otherwise, *m.resets, *m.timers)}
    plain = [e for e in m.event_names if e not in special]
    if not special or not plain:
        return None
    timed = {s for s, _ in m.timers}
    enter_timed = any(t in timed for s, e, t in m.edges if e in plain)
    return PlainMoves(sql_text_array(plain), enter_timed)


def claim_key(m: Machine) -> list[str]:
    """The columns a claim of an untimed event orders by: 1.2's `postgres.claim.order`
    (the lowest first), then `entered_at` (the oldest)."""
    order = m.postgres.claim_order
    return [*([str(order)] if order is not None else []), "entered_at"]


def declared_column(column: DeclaredColumn) -> Column:
    """A column of the row's own data (1.2), as `fsmc.columns` declares it."""
    sql_type, not_null, default = columns.sql_parts(column)
    return Column(str(column.name), sql_type, not_null=not_null, default=default)


def timing_context(m: Machine) -> TimingContext | None:
    """How the bodies set and wait for due_at (1.2's `after`), or None without timers."""
    if not m.timers:
        return None
    states = []
    for s, (e, timer) in m.timed_states.items():
        states.append(TimedState(s, timer.kind, timer.ms, timer.factor, timer.most_ms, backoff_exponent(timer),
                                 sql_ident(count_column(e)) if timer.kind == "backoff" else "", e))  # fmt: skip
    timed = list(m.timed_states)
    untimed = [s for s in m.state_names if s not in m.timed_states]
    sources: dict[str, set[bool]] = {}
    for s, e in m.targets:
        sources.setdefault(e, set()).add((s, e) in m.timers)
    return TimingContext(
        states=states,
        given=any(t.kind == "due_at" for t in m.timers.values()),
        due_events=[e for e in m.event_names if sources.get(e) == {True}],
        in_timed=sql_among("t.state", timed, untimed),
        index_predicate=sql_among("state", timed, untimed),
    )


def limits_table(m: Machine, n: Quoted, id_type: str) -> Table:
    """1.2's `limits`: one row per place, `limit` slots per limited state; a row in the
    state holds one (`holder`, its id), taken and freed by the counting trigger. The
    slots are the spec's: the file inserts them free, `fsmc migrate` fills them."""
    values = ", ".join(f"({sql_str(state)}, {most})" for state, most in m.state_limits.items())
    return Table(
        name=n.limits,
        columns=(
            Column("state", "text", not_null=True),
            Column("slot", "integer", not_null=True),
            Column("holder", id_type),
        ),
        constraints=(
            Constraint(n.limits_pkey, "PRIMARY KEY (state, slot)"),
            Constraint(n.limits_holder, "UNIQUE (holder)"),
        ),
        seed=(f"INSERT INTO {n.limits} (state, slot)\n"
              "SELECT v.state, pg_catalog.generate_series(1, v.slots)\n"
              f"FROM (VALUES {values}) AS v (state, slots);"),  # fmt: skip
        comment=comments.LIMITS,
    )


def wake_context(m: Machine, n: Quoted, claimable: list[str], limits: LimitsContext | None) -> WakeContext | None:
    if not m.notified:
        return None
    limited = dict(limits.claim_targets) if limits is not None else {}
    events = []
    for event in m.notified:
        untimed, timed = facts.wake_sources(m, event)
        events.append(WakeEvent(
            event=event,
            untimed=sql_text_array(untimed) if untimed else "",
            claimable=all(s in claimable for s in untimed),
            timed=sql_text_array(timed) if timed else "",
            limited=limited.get(event, ""),
            under_cap=_wake_under_cap(m, event),
        ))  # fmt: skip
    return WakeContext(
        channel=wake_channel_sql(str(m.name), "TG_TABLE_SCHEMA::pg_catalog.text"),
        events=events,
        notified=", ".join(m.notified),
        by=[(str(c), f"{n.claimable_in}.{c}") for c in m.postgres.claim_by],
        order=", ".join(f"t.{c}" for c in claim_key(m)),
    )


def _wake_under_cap(m: Machine, event: str) -> str:
    """`AND (...)` when `event` is capped: its count is under its cap, or (1.2) the row
    is where a spent budget sends the move to its `otherwise` instead, and that budget
    is spent: the claim's own test, for this one event."""
    if event not in m.cap_limits:
        return ""

    def compared(budget: str, operator: str) -> str:
        count = sql_ident(count_column(budget))
        cap = f"t.{sql_ident(cap_column(budget))}" if budget in m.per_row_caps else str(m.cap_limits[budget])
        return f"t.{count} {operator} {cap}"

    rescued: dict[str, list[str]] = {}  # budget -> the sources where it sends the move elsewhere
    for (s, e), (_to, budget) in m.otherwise.items():
        if e == event:
            rescued.setdefault(budget, []).append(s)
    either = [compared(event, "<")]
    either += [f"(t.state = ANY ({sql_text_array(states)}) AND {compared(b, '>=')})" for b, states in rescued.items()]
    return "AND (" + " OR ".join(either) + ")"


def limits_context(m: Machine) -> LimitsContext | None:
    if not m.state_limits:
        return None
    limited = list(m.state_limits)
    full: list[tuple[str, str]] = []
    for event in m.event_names:
        entered = {t for (s, e), ts in m.targets.items() if e == event for t in ts}
        entered |= {to for (s, e), (to, _) in m.otherwise.items() if e == event}
        if any(s in entered for s in limited):
            full.append((event, sql_text_array([s for s in limited if s in entered])))
    return LimitsContext(
        new_limited=sql_any("NEW.state", limited),
        old_limited=sql_any("OLD.state", limited),
        inserted=sql_one_of("NEW.state", limited),
        moved=sql_entered_or_left("OLD.state", "NEW.state", limited),
        deleted=sql_one_of("OLD.state", limited),
        claim_targets=full,
    )


def _reset_pairs(m: Machine, event: str) -> str:
    """(OLD.state, NEW.state) is the move of a transition that resets `event`'s budget."""
    pairs = list(dict.fromkeys(joined(s, t) for (s, e), events in m.resets.items() if event in events
                               for t in m.targets[s, e]))  # fmt: skip
    return sql_any("(OLD.state || ' ' || NEW.state)", pairs) if pairs else ""


def _born_elsewhere(m: Machine) -> str:
    """NEW.state is none of the states a row may be born in."""
    return " AND ".join(f"NEW.state IS DISTINCT FROM {sql_str(s)}" for s in m.initial_names)


def spec_domains(m: Machine, triples_hash: str) -> tuple[Domain, Domain]:
    """The domains holding the spec's states (keys of a jsonb) and its moves (from,
    event, to: paths through nested objects), which the two tables' CHECKs cast to.
    Each is named after a hash of its list: a spec with other states or moves makes
    another domain and so another CHECK, which `fsmc migrate` adds NOT VALID and
    validates where history allows. The log's CHECK casts `ARRAY[from_state, event,
    to_state]`: PostgreSQL parses a table's CHECK for every statement, and that array
    is half the text of the concatenation format 4 cast."""
    states = sorted(str(s) for s in m.state_names)  # sorted once: both uses sort them
    (state, state_check), (moves, moves_check) = domain_names(m, short_hash(states), triples_hash)
    return (
        Domain(sql_ident(state), "text", sql_ident(state_check), sql_jsonb_keys(states), comments.DOMAINS),
        Domain(sql_ident(moves), "text[]", sql_ident(moves_check), sql_jsonb_paths(facts.logged_moves(m)),
               paths=True),  # fmt: skip
    )


def body_context(machine: Machine, n: Quoted) -> BodyContext:
    m = machine
    leased = set(facts.lease_states(m))
    states = [str(s) for s in m.state_names]
    claimable = [s for s in states if s not in m.terminal_names and s not in leased]
    unclaimable = [s for s in states if s in m.terminal_names or s in leased]  # a set's test, not a list's
    terminals = list(m.terminals_in_order)
    purgeable = list(m.purgeable_names)
    lease = None
    if m.lease is not None:
        held = facts.lease_states(m)
        lease = LeaseContext(
            reclaim=str(m.lease.reclaim),
            in_lease=sql_in("t.state", held),
            apply_claims=claim_assignments("v_lease", f"{n.apply}.actor", "v_now", "t"),
            reclaim_claims=claim_assignments("x.lease", f"{n.reclaim}.actor", "GREATEST(v_now, s.entered_at)", "t"),
            moves=[(s, t, c.value) for s, t, c in facts.reclaim_moves(m)],
            guard_change=change_sql("OLD.state", "NEW.state", held),
            # BEFORE (with caps) the guard assigns NEW's fields; AFTER it updates the row.
            guard_claims=claim_values("v_lease", "SESSION_USER::pg_catalog.text", "v_at", "OLD" if m.cap_limits else "t"),
            settled=claims_settled("v_lease", "NEW"),
        )
    return BodyContext(
        machine=str(m.name),
        n=n,
        born_elsewhere=_born_elsewhere(m),
        born_in=(
            f'state "{m.initial}"' if len(m.initial_names) == 1
            else "one of the states " + ", ".join(f'"{s}"' for s in m.initial_names)
        ),  # fmt: skip
        by_state=[
            (source, [(event, targets_array(m.targets[source, event])) for event in dict.fromkeys(e for e, _ in moves)])
            for source, moves in facts.by_state(m)
        ],
        event_declared=sql_any("v_event", m.event_names),
        state_terminal=sql_any("v_state", terminals),
        new_state_declared=sql_any("NEW.state", m.state_names),
        pair_declared=sql_any("(OLD.state || ' ' || NEW.state)", (joined(*p) for p in facts.pairs(m))),
        old_state_terminal=sql_any("OLD.state", terminals),
        event_list=", ".join(m.event_names),
        lease=lease,
        codes=Codes(),
        id_type=ID_TYPES[m.postgres.id_type].sql,
        claiming=ClaimContext(
            sources=sources_jsonb(m),
            claims=claim_assignments("x.lease", f"{n.claim}.actor", "x.at", "t") if m.lease else [],
            claimable_array=sql_text_array(claimable),
            in_claimable=sql_among("t.state", claimable, unclaimable),
            index_predicate=sql_among("state", claimable, unclaimable),
            by=[(str(c), f"{n.claim}.{c}") for c in m.postgres.claim_by],
            order=", ".join(f"t.{c}" for c in claim_key(m)),
        ),
        purging=PurgeContext(
            in_purgeable=sql_among("t.state", purgeable, [s for s in states if s not in purgeable]),
            index_predicate=sql_among("state", purgeable, [s for s in states if s not in purgeable]),
        ),
        moves=moves_jsonb(m),
        budgets=bool(m.otherwise or m.resets or m.timers),
        plain_moves=plain_moves(m),
        timing=timing_context(m),
        digest=machine_digest(m),
        limits=limits_context(m),
        writer_role=m.postgres.writer_role,
        waking=wake_context(m, n, claimable, limits_context(m)),
        caps=[
            CapContext(
                event=event,
                column=sql_ident(count_column(event)),
                limit=limit,
                pair_declared=sql_any(
                    "(OLD.state || ' ' || NEW.state)",
                    dict.fromkeys(joined(s, t) for s, e, t in m.edges if e == event),
                ),
                cap_column=sql_ident(cap_column(event)) if event in m.per_row_caps else "",
                reset_pairs=_reset_pairs(m, event),
                most=m.per_row_caps.get(event, 0),
            )
            for event, limit in m.cap_limits.items()
        ],
    )


@cache
def _bodies_template() -> jinja2.Template:
    return environment().get_template("machine_bodies.sql.j2")


# The file's comment lines are fsmc's own sentences (a machine's name at most), the
# same for every machine: each is escaped once per process.
_comment = cache(sql_comment)


def file_context(b: Build) -> FileContext:
    m = b.machine
    descriptions = {str(d.name): d.description or "" for d in m.states}
    event_descriptions = {str(d.name): d.description or "" for d in m.events}
    return FileContext(
        header=Header.of(m),
        machine=str(m.name),
        description=m.description or "",
        states=[(s, descriptions.get(s, "")) for s in m.state_names],
        events=[(e, event_descriptions.get(e, "")) for e in m.event_names],
        codes=Codes(),
        statements=[(tuple(_comment(line) for line in c), s) for c, s in b.schema.statements()],
        prepare=b.install.prepare,
        pin=b.install.finish,
    )


def suite_context(b: Build) -> SuiteContext:
    n = b.names.sql
    return SuiteContext(
        file=Paths.of(b.machine).sql.rsplit("/", 1)[-1],
        table=n.table,
        events_table=n.events_table,
        id_column=n.id_column,
        apply=n.apply,
        writer=n.writer,
        id_type=b.machine.postgres.id_type,
        codes=Codes(),
        lease=b.machine.lease is not None,
        grants=list(b.install.grants),
        limits_table=n.limits if b.machine.state_limits else "",
        writer_role=b.machine.postgres.writer_role,
    )


def emit(b: Build) -> str:
    return render("machine.sql.j2", **as_variables(file_context(b)))
