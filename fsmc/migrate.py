"""Migrate: two versions of one machine -> the SQL script that moves a database built
from OLD's `.sql` to what NEW's `.sql` builds (contract section 6).

`migrate(old, new)` is pure: two checked machines in, the script's text out; the
empty string when both specs build the same schema (the same machine digest:
formatting, descriptions and order change nothing a database holds). It raises
`Unsupported` for a pair it will not script (below); the CLI makes that exit 2.

How the script is made: from models, never from SQL text, over finished builds, in
one direction: three `Build`s -> a plan of typed operations -> SQL.
`fsmc.targets.postgres.build.build` makes the `Build` of OLD, of mid (OLD's machine
under NEW's `postgres` names: what the database is once renamed) and of NEW, each
once; their `Schema`s are the model `fsmc build` renders, so the migration always
builds what the SQL target builds. `plan` turns them into a tuple of operations
(`fsmc.targets.postgres.operations`), in the order the script runs them: the guard
(digests, and the row checks from the machines, through `fsmc.facts`); the steps an
older schema format needs (`fsmc.targets.postgres.formats`, from OLD's build alone,
apart from any spec change); the renames (the raw `Names` of OLD's and mid's builds
compared field by field, each name that differs renamed as a table, constraint or
index, whichever OLD's schema has under it); then mid's schema compared with NEW's:
columns added or dropped, defaults, CHECK constraints, storage parameters, indexes,
views, functions, triggers, with the data steps (counts, claims) where their columns
exist. Every function is replaced (CREATE OR REPLACE keeps its grants and owner; one
whose result type or parameter names change is dropped first; one whose argument
types change is another function: NEW's is created, OLD's dropped with the other
objects NEW lacks) and every view replaced, every trigger dropped and created again
(a constraint trigger cannot be replaced), not only those whose text changed: the
result is then NEW's, whichever fsmc version built the database's functions. Last,
`script` renders the plan, each operation by its macro in templates/migrate.sql.j2.

What the script does, in one transaction (BEGIN ... COMMIT; `psql -v
ON_ERROR_STOP=1 -f FILE`, as the schema's owner, search_path set to the schema as
for the build):

1. `SET LOCAL lock_timeout` (`LOCK_TIMEOUT`): a migration waiting for a lock makes
   every writer of the tables queue behind it, so it gives up instead, changing
   nothing; run it again at a quieter moment.
2. Guard, before any change. It refuses (SQLSTATE 55000,
   object_not_in_prerequisite_state, with a message saying "nothing was changed"):
   a schema without `<machine>_fsmc_digest()` (built from another machine, or the
   wrong search_path); a search_path whose first schema is not the machine's (new
   objects would be created elsewhere); a digest other than OLD's (built from
   another version of the spec, or already migrated: the hint says which). Then it
   locks both tables (ACCESS EXCLUSIVE, the table before its log, as `_apply` does)
   and reads the digest again, so of two migrations run at once the second refuses.
   Then, if NEW removes states, it counts the rows still in them and refuses,
   naming each such state and its row count. Then, if NEW adds a cap or lowers
   one, it counts from the event log the rows that have fired that event more
   times than NEW's cap, and refuses, naming the event, the cap, the row count and
   the most firings (the least cap that would keep them).
3. The writer role made or checked; then, in a schema an older fsmc built, what each
   later format added (`fsmc.targets.postgres.formats`), under OLD's names.
   Expand: renames (tables, and the constraint, index and identity-sequence names
   derived from them), new columns, defaults, columns that may now be NULL,
   storage parameters; columns of another type (1.2's declared columns: each value
   cast, `USING column::type`, in one ALTER TABLE that rewrites the table; a value
   that does not convert aborts the script, changing nothing, saying so); columns
   that may no longer be NULL (their NULLs get NEW's default, then SET NOT NULL);
   the count column of each cap NEW adds filled from each row's history, new or
   changed indexes, and the claim columns of rows whose state gains or loses its lease.
4. The domains of NEW's lists created (the state and triple CHECKs cast to them,
   and each is named after a hash of its list, so other lists make other domains
   and other CHECKs); functions replaced; CHECK constraints whose definition
   changed dropped and added again `NOT VALID`; views replaced; triggers recreated.
5. Validation: a CHECK on the machine's table is validated (every row is in a
   state NEW declares: step 2 made sure). The event log's triple CHECK is validated
   only where its history allows: when old events record transitions NEW no longer
   has, validation fails, the CHECK stays `NOT VALID` (it still checks every new
   event), and a NOTICE says how many old events it spares. History is never
   rewritten: no statement of the script touches an event row.
6. Contract: triggers, functions, views, indexes, constraints, columns and domains NEW
   lacks are dropped (a dependent object of the user's makes that fail, changing nothing).
7. NEW's digest is recorded last, by replacing `<machine>_fsmc_digest()`.

Caps. The event log is the truth of how often a row fired an event (a count
column always equals its row's event rows of that event: `_apply`, claim, reclaim
and the triggers keep it so). A cap NEW adds gets its column (`NOT NULL DEFAULT 0`,
no rewrite), then one UPDATE sets it from the log for the rows that have history
of that event; OLD's triggers are still installed then, and none fires on it:
they fire only for writes of state, state_version and OLD's own counts. A cap
NEW adds or lowers is checked against the log first (above); one kept or raised
needs no look, its count being within OLD's smaller or equal cap. Raising or
lowering a cap replaces its CHECK; removing one drops its CHECK and column.

Options. Table and events-table names may change: the tables, their derived
constraint and index names and the id sequence are renamed (metadata only; code
that names the old tables must ship with NEW). Adding a lease adds the claim
columns (NULL, no table rewrite), the fillfactor, the partial index and the
heartbeat and reclaim functions; removing one drops them (the claim columns hold
only the current holder, whose claim is also the actor and time of the event that
moved the row into the lease). Changing the lease states or reclaim event
rebuilds the index and the functions. A row already in a state that becomes a
lease state gets `heartbeat_at = now()` (claimed_by and claimed_at stay NULL: no
worker claimed it through `_apply`), so reclaim takes it once stale, where a NULL
heartbeat would never be; a row in a state that stops being one has its claim
cleared, as a move out of the lease would. Refused (`Unsupported`): a renamed
machine (a new machine: new module, functions, tables), a changed `id_type` (it
would rewrite both tables under an exclusive lock and change the signature of
every function taking an id, breaking their callers and grants: do it by hand),
1.2's `postgres.writer_role` changed (the functions' owner, three triggers and the
roles would change: it needs a fresh install), and names that trade places (the
table taking the old events table's name, ...: rename in two releases).

Renaming a state, safely. A state cannot be renamed in place: the rows' log says
they entered the old name, an UPDATE to the new name has no edge and no event row
(the database refuses it, 23F04 and 23F05), and rewriting the log is refused too
(23F06). So a rename is two releases made of ordinary transitions:

  1. Add the new state with the old one's outgoing transitions, and an event
     (`rename_paused`, say) from the old state to the new one; migrate. Then move
     every row with that event through `<machine>_apply`: `SELECT job_apply(id,
     'rename_paused', state_version, 'release 1.5') FROM jobs WHERE state =
     'paused';`.
  2. Remove the old state and that event, pointing the old state's incoming
     transitions at the new one; migrate. The migration refuses, changing nothing,
     if a row entered the old state since the sweep: sweep again and rerun.

It is safe for the event log because nothing in it is rewritten and it still
replays: each row's move is itself an event row (from the old name, the rename
event, to the new name, with its actor and time), so the history up to it is in
the old vocabulary and the history after it in the new one; after step 2 the
triple CHECK stays NOT VALID over the old events it no longer admits, and still
refuses every new event that is not one of NEW's transitions.

Cost and locks: the whole script holds ACCESS EXCLUSIVE locks on both tables, and
each replaced CHECK scans its table (VALIDATE, inside this one transaction, buys no
lighter lock); a new index scans the table. Adding or dropping columns rewrites
nothing; a column of another type rewrites the table (a smallint widened to an
integer too), and a column made NOT NULL costs one UPDATE of the rows where it (or
another made so with it) is NULL, then a scan (measured, 100,000 jobs rows all NULL:
2.2 s, against 0.6 s for a rewrite by a change of type; the UPDATE writes each row
and its index entries anew).

Declared columns (1.2). A column added is added with its default (a NOT NULL one
fills every row, without a rewrite), one removed is dropped with its data at the
contract step, a default changed is set. Another type is refused (`Unsupported`)
where PostgreSQL has no cast between the two (`fsmc.columns.CONVERTS`): the script
could only fail. The roles that move rows get exactly NEW's column privileges at the
end (`GrantMovers`), so the application may write a column added, and a column
dropped takes its privileges with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fsmc import columns, facts
from fsmc.diff import compare
from fsmc.diff_render import rows
from fsmc.digest import machine_digest
from fsmc.escape import SQL_NAME_MAX, sql_ident
from fsmc.model import Machine
from fsmc.targets.common import migration_header
from fsmc.targets.postgres.build import Build, build
from fsmc.targets.postgres.encode import due_from_entry
from fsmc.targets.postgres.formats import upgrade_format
from fsmc.targets.postgres.install import app_writes
from fsmc.targets.postgres.model import Schema, Table
from fsmc.targets.postgres.names import Names, count_column
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
    Plan,
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
from fsmc.templating import as_variables, environment

LOCK_TIMEOUT = "5s"


class Unsupported(Exception):
    """A change `fsmc migrate` will not script; the message says why and what to do."""


def migrate(
    old: Machine, new: Machine, *, lock_timeout: str = LOCK_TIMEOUT, transaction: bool = True
) -> str:
    """The script that moves a database built from `old`'s `.sql` to `new`'s; empty
    when both build the same schema. Raises `Unsupported` (see the module doc).
    `transaction=False` (`--no-transaction`) leaves out BEGIN and COMMIT, for a
    migration framework's own transaction; every setting is SET LOCAL either way, so
    nothing outlives that transaction, and a refusal still aborts it whole."""
    refused = refusals(old, new)
    if refused:
        raise Unsupported("\n".join(refused))
    if machine_digest(old) == machine_digest(new):
        return ""
    # Each built once: everything below takes these builds, never a machine.
    before, mid, after = build(old), build(mid_machine(old, new)), build(new)
    names = renames(before, mid)
    refused = traded_names(names)
    if refused:
        raise Unsupported("\n".join(refused))
    steps = plan(before, mid, after, names, lock_timeout=lock_timeout, transaction=transaction)
    return script(header(before, after, steps), steps)


def refusals(old: Machine, new: Machine) -> list[str]:
    """Why `fsmc migrate` will not script this pair, as far as the machines tell
    (empty: it may; `traded_names` asks their builds the rest)."""
    out: list[str] = []
    if old.name != new.name:
        return [
            f"OLD defines machine '{old.name}' but NEW defines '{new.name}': a renamed "
            "machine is a new one (new module, tables and functions), not a migration"
        ]
    if old.postgres.id_type != new.postgres.id_type:
        out.append(
            f"postgres.id_type changes from {old.postgres.id_type} to {new.postgres.id_type}: "
            "fsmc migrate does not change id types (it would rewrite both tables under an "
            "exclusive lock and change the signature of every function that takes an id, "
            "breaking their callers and grants); keep the id type, or migrate by hand"
        )
        return out
    was = {str(c.name): c.type for c in old.postgres.columns}
    for column in new.postgres.columns:
        before = was.get(str(column.name), column.type)
        if before != column.type and column.type not in columns.CONVERTS[before]:
            out.append(
                f"postgres.columns.{column.name} changes type from {before} to {column.type}: PostgreSQL "
                "has no cast from one to the other, so the migration could only fail; add a column of "
                "the new type (fill it from the old one yourself), and drop the old one in a later release"
            )
    if old.postgres.writer_role != new.postgres.writer_role:
        out.append(
            f"postgres.writer_role changes from {str(old.postgres.writer_role).lower()} to "
            f"{str(new.postgres.writer_role).lower()}: fsmc migrate does not move an installation "
            "between a writer role and none (the functions' owner, three triggers and the roles "
            "would change): it needs a fresh install of NEW's .sql, in a new schema; or keep the "
            "setting"
        )
    return out


def traded_names(renamed: Renames) -> list[str]:
    """Refused: NEW giving a name OLD used to another object (empty: none)."""
    traded = sorted(set(renamed.old_names) & set(renamed.new_names))
    if not traded:
        return []
    return [
        "NEW gives names OLD used to other objects "
        f"({', '.join(traded)}): fsmc migrate does not "
        "trade names between objects; rename in two releases (first to unused names)"
    ]


def mid_machine(old: Machine, new: Machine) -> Machine:
    """OLD's machine under NEW's PostgreSQL names: what the database is once renamed.
    Only the names are NEW's: every other postgres option (1.2's declared columns, what
    a claim may be limited to and ordered by) is OLD's, what the database holds."""
    p = new.postgres
    return dataclasses.replace(old, postgres=dataclasses.replace(old.postgres, table=p.table, events_table=p.events_table))


# --- the plan ----------------------------------------------------------------------------


def plan(
    old: Build, mid: Build, new: Build, renamed: Renames,
    *, lock_timeout: str = LOCK_TIMEOUT, transaction: bool = True,
) -> Plan:  # fmt: skip
    """Every operation of the script, in the order it runs them (the module doc says
    why): from the builds of OLD, mid (OLD under NEW's names) and NEW, and the names
    `renames` found between OLD's and mid's."""
    # The digest function is replaced last, apart: it records that the migration is done.
    digest = next(f for f in new.schema.functions if f.name == new.names.sql.digest)
    was, now = without_function(mid.schema, digest.name), without_function(new.schema, digest.name)
    caps = cap_changes(old, new)
    return (
        Begin() if transaction else RefuseOutsideTransaction(),
        SetLockTimeout(lock_timeout),
        guard(old, new, caps),
        PrepareWriterRole(new.install.prepare),
        upgrade_format(old),
        *remember_movers(mid, new),
        *([renamed] if renamed else []),
        *expand(was, now),
        *data(old, new, caps),
        *replace(was, now),
        *contract(was, now),
        RecordDigest(digest),
        # CREATE OR REPLACE drops a function's settings: pin every function again.
        PinFunctions(new.install.finish),
        grant_movers(new),
        *([Commit()] if transaction else []),
    )


def remember_movers(mid: Build, new: Build) -> list[RememberMovers]:
    """Where `_apply`'s parameters change, the roles that may call it now (`RememberMovers`)."""
    was = next(f for f in mid.schema.functions if f.name == mid.names.sql.apply)
    now = next(f for f in new.schema.functions if f.name == new.names.sql.apply)
    return [RememberMovers(was.key)] if was.key != now.key else []


def without_function(schema: Schema, name: str) -> Schema:
    return dataclasses.replace(schema, functions=tuple(f for f in schema.functions if f.name != name))


def guard(old: Build, new: Build, caps: tuple[CapChange, ...]) -> Guard:
    """Under OLD's names: nothing is renamed yet when it runs."""
    n = old.names.sql
    removed = facts.removed_states(old.machine, new.machine)
    return Guard(
        machine=str(new.machine.name),
        digest=f"{n.digest}()",
        old_digest=machine_digest(old.machine),
        new_digest=machine_digest(new.machine),
        table=n.table,
        events_table=n.events_table,
        id_column=n.id_column,
        rows_in=RefuseIfRowsIn(tuple(removed)) if removed else None,
        past_caps=RefuseIfPastCaps(caps) if caps else None,
        past_limits=RefuseIfPastLimits(tuple(limits)) if (limits := facts.tightened_limits(old.machine, new.machine))
        else None,
    )


def cap_changes(old: Build, new: Build) -> tuple[CapChange, ...]:
    """NEW's caps that rows may already be past (`facts.tightened_caps`)."""
    m = new.machine
    return tuple(
        CapChange(e, cap, sql_ident(count_column(e)), added,
                  tuple(" ".join(t) for t in m.otherwise_edges if t[1] == e),
                  tuple(f"{s} {x}" for (s, x), events in m.resets.items() if e in events))  # fmt: skip
        for e, cap, added in facts.tightened_caps(old.machine, new.machine)
    )


def data(old: Build, new: Build, caps: tuple[CapChange, ...]) -> list[Operation]:
    """What the rows' columns NEW adds or gives new meaning must hold, set once the
    columns exist (under NEW's names), and before NEW's triggers are."""
    n = new.names.sql
    out: list[Operation] = []
    if filled := tuple(c for c in caps if c.added):
        out.append(FillCountColumns(n.table, n.events_table, n.id_column, filled))
    if due := due_times(old.machine, new.machine, n.table):
        out.append(due)
    if new.machine.state_limits and new.machine.state_limits != old.machine.state_limits:
        out.append(FillLimits(n.table, n.limits, tuple(new.machine.state_limits.items())))
    starts, ends = facts.lease_starts_and_ends(old.machine, new.machine)
    if starts:
        out.append(StartHeartbeats(str(new.machine.name), n.table, tuple(starts)))
    if ends:
        out.append(ClearClaims(n.table, tuple(ends)))
    return out


def due_times(old: Machine, new: Machine, table: str) -> SetDueTimes | None:
    """Rows in a state whose timer NEW adds or changes, and (where the due_at column
    stays) in one it no longer times (1.2)."""
    was, now = old.timed_states, new.timed_states
    changed = [s for s, (e, t) in now.items() if s not in was or was[s][1].describe() != t.describe()]
    untimed = [s for s in was if s not in now and s in new.state_names] if now else []
    if not changed and not untimed:
        return None
    due = tuple((s, due_from_entry(now[s][1], sql_ident(count_column(now[s][0])))) for s in changed)
    return SetDueTimes(table, due, tuple(untimed))


def grant_movers(new: Build) -> GrantMovers:
    n = new.names
    return GrantMovers(
        apply=next(f for f in new.schema.functions if f.name == n.sql.apply),
        table=n.sql.table,
        events_table=n.sql.events_table,
        functions=tuple(new.install.context.executable),  # by signature, never by name alone
        writes=app_writes(new.machine, n),
        limits_table=n.sql.limits if new.machine.state_limits else "",
    )


# --- the names -----------------------------------------------------------------------------


def renames(old: Build, mid: Build) -> Renames:
    """`Names` of OLD and of mid, field by field; what each differing name is (a table,
    a constraint, an index) OLD's schema says, asked by the name as SQL spells it (the
    model's)."""
    before, after, schema = old.names, mid.names, old.schema
    raw_tables = {sql_ident(t): t for t in (before.table, before.events_table, before.purge_tickets, before.limits)}
    tables = {t.name: t for t in schema.tables}
    constraint_of = {c.name: raw_tables[t.name] for t in schema.tables for c in t.constraints}
    indexes = {i.name for i in schema.indexes}
    others = {f.name for f in schema.functions} | {g.name for g in schema.triggers}
    others |= {c.name for t in schema.tables for c in t.columns}
    changed = [
        (getattr(before, f.name), getattr(after, f.name))
        for f in dataclasses.fields(Names)
        if getattr(before, f.name) != getattr(after, f.name)
    ]
    renamed_table = {was: now for was, now in changed if sql_ident(was) in tables}
    out_constraints: list[tuple[str, str, str]] = []
    out_indexes: list[tuple[str, str]] = []
    for was, now in changed:
        spelled = sql_ident(was)
        if spelled in constraint_of:
            table = constraint_of[spelled]
            out_constraints.append((renamed_table.get(table, table), was, now))
        elif spelled in indexes:
            out_indexes.append((was, now))
        else:
            # Named after the machine (which does not change), or not built by OLD.
            assert spelled in tables or spelled not in others, f"fsmc migrate cannot rename {was}"
    # The identity column is `id`, which SQL spells bare: its model name is its name.
    sequences = [
        (now, c.name, identity_sequence(now, c.name))
        for was, now in renamed_table.items()
        for c in tables[sql_ident(was)].columns
        if c.identity
    ]
    return Renames(tuple(renamed_table.items()), tuple(out_constraints), tuple(out_indexes), tuple(sequences))


def identity_sequence(table: str, column: str) -> str:
    """The name PostgreSQL gives the sequence of an identity column when it creates
    the table (makeObjectName: `<table>_<column>_seq`, the longer part cut to fit)."""
    label = "seq"
    available = SQL_NAME_MAX - 1 - (len(label) + 1)  # the two underscores and the label
    t, c = len(table), len(column)
    while t + c > available:
        if t > c:
            t -= 1
        else:
            c -= 1
    return f"{table[:t]}_{column[:c]}_{label}"


# --- the difference of two schemas (mid's and NEW's, under the same names) -----------------
# Tables are the same ones, but for 1.2's limits slots, which a spec's first limit
# adds (CreateTable) and its last one drops (DropTables).


def expand(mid: Schema, new: Schema) -> list[Operation]:
    """Tables and columns NEW adds, defaults it changes, columns it lets be NULL, storage
    parameters it sets; then columns of another type (1.2's declared columns), and
    columns it no longer lets be NULL, their NULLs given NEW's default first."""
    out: list[Operation] = [CreateTable(t.create()) for t in new.tables if t.name not in _names(mid.tables)]
    retyped: list[Operation] = []
    required: list[Operation] = []
    for was, now in kept_tables(mid, new):
        options = dict(was.options)
        changed = changed_columns(was, now)
        out.append(ExpandTable(
            table=now.name,
            columns=tuple(c for c in now.columns if was.column(c.name) is None),
            defaults=changed.defaults,
            options=tuple((k, v) for k, v in now.options if options.get(k) != v),
            allow_null=changed.allow_null,
        ))  # fmt: skip
        retyped.append(RetypeColumns(now.name, changed.retyped))
        required.append(RequireValues(now.name, changed.required))
    return [step for step in out + retyped + required if not empty(step)]


def kept_tables(mid: Schema, new: Schema) -> list[tuple[Table, Table]]:
    """(mid's, NEW's) of each table both have, in NEW's order: the machine's table, its
    log and the purge tickets always, the limits slots (1.2) when both limit."""
    had = {t.name: t for t in mid.tables}
    return [(had[t.name], t) for t in new.tables if t.name in had]


def _names(tables: tuple[Table, ...]) -> set[str]:
    return {t.name for t in tables}


@dataclasses.dataclass(frozen=True)
class ColumnChanges:
    """What becomes of a table's columns that both schemas have, NEW's otherwise."""

    defaults: tuple[tuple[str, str | None], ...]  # (column, NEW's default or None: dropped)
    allow_null: tuple[str, ...]  # NOT NULL dropped
    retyped: tuple[RetypedColumn, ...]  # another type (its default set with it)
    required: tuple[tuple[str, str], ...]  # NOT NULL set, NULLs given NEW's default first


def changed_columns(mid: Table, new: Table) -> ColumnChanges:
    """Each column both have that NEW declares otherwise, in NEW's order: another type
    (which takes its default along: the old one is of the old type), another default,
    NULL allowed, or NULL refused (the spec gives such a column a default, which its
    NULL rows get). An identity column changing is a bug of ours (the model doc)."""
    defaults: list[tuple[str, str | None]] = []
    allow_null: list[str] = []
    retyped: list[RetypedColumn] = []
    required: list[tuple[str, str]] = []
    for column in new.columns:
        was = mid.column(column.name)
        if was is None or was == column:
            continue
        if was.identity != column.identity:
            raise AssertionError(f"fsmc migrate cannot change column {was} to {column}")
        if was.type != column.type:
            retyped.append(RetypedColumn(column, was.default is not None))
        elif was.default != column.default:
            defaults.append((column.name, column.default))
        if was.not_null and not column.not_null:
            allow_null.append(column.name)
        elif column.not_null and not was.not_null:
            if column.default is None:
                raise AssertionError(f"fsmc migrate cannot fill the NULLs of {column} without a default")
            required.append((column.name, column.default))
    return ColumnChanges(tuple(defaults), tuple(allow_null), tuple(retyped), tuple(required))


def replace(mid: Schema, new: Schema) -> list[Operation]:
    """Every object NEW defines, made NEW's whatever the database holds: indexes and
    domains NEW adds, every function, CHECKs that change (NOT VALID, then validated),
    every view and trigger."""
    mid_indexes, new_indexes = {i.name: i for i in mid.indexes}, {i.name: i for i in new.indexes}
    mid_views, new_views = {v.name: v for v in mid.views}, {v.name: v for v in new.views}
    mid_functions = {f.key: f for f in mid.functions}
    mid_triggers = {g.key for g in mid.triggers}
    out: list[Operation] = [
        ReplaceIndexes(
            dropped=tuple(i for i, x in mid_indexes.items() if new_indexes.get(i, x) != x),
            created=tuple(x for i, x in new_indexes.items() if mid_indexes.get(i) != x),
        ),
        CreateDomains(tuple(d for d in new.domains if d not in mid.domains)),
        DropUnreplaceableFunctions(tuple(
            f.key for f in new.functions
            if f.key in mid_functions and not mid_functions[f.key].replaceable_by(f)
        )),  # fmt: skip
        ReplaceFunctions(new.functions),
        *(constraints(was, now) for was, now in kept_tables(mid, new)),
        ReplaceViews(tuple(v for v, x in mid_views.items() if new_views.get(v, x) != x), new.views),
        RecreateTriggers(tuple(RecreatedTrigger(g, g.key in mid_triggers) for g in new.triggers)),
    ]
    for step in [s for s in out if isinstance(s, ReplaceConstraints)]:
        out += [
            ValidateHistoryCheck(step.table, c.constraint) if history(new, step.table)
            else ValidateCheck(step.table, c.constraint.name)
            for c in step.checks
        ]  # fmt: skip
    return [step for step in out if not empty(step)]


def constraints(mid: Table, new: Table) -> ReplaceConstraints:
    had = {c.name: c for c in mid.constraints}
    changed = [c for c in new.constraints if had.get(c.name) != c]
    for c in changed:
        assert c.check is not None or c.name not in had, f"fsmc migrate cannot change constraint {c.name}: {had[c.name]}"
    return ReplaceConstraints(
        table=new.name,
        checks=tuple(NewCheck(c, c.name in had) for c in changed if c.check is not None),
        added=tuple(c for c in changed if c.check is None),
    )


def history(schema: Schema, table: str) -> bool:
    """Whether `table` is append-only history: a CHECK old rows break stays NOT VALID."""
    return schema.table(table).history


def contract(mid: Schema, new: Schema) -> list[Operation]:
    """What NEW lacks, dropped once nothing of NEW's needs it: triggers, functions,
    views, indexes; then constraints, columns and storage parameters; then domains
    (once no CHECK casts to them)."""
    new_functions, new_triggers = {f.key for f in new.functions}, {g.key for g in new.triggers}
    new_views, new_indexes = {v.name for v in new.views}, {i.name for i in new.indexes}
    out: list[Operation] = [
        DropObjects(
            triggers=tuple((g.name, g.table) for g in mid.triggers if g.key not in new_triggers),
            functions=tuple(f.key for f in mid.functions if f.key not in new_functions),
            views=tuple(v.name for v in mid.views if v.name not in new_views),
            indexes=tuple(i.name for i in mid.indexes if i.name not in new_indexes),
        )
    ]
    for was, now in kept_tables(mid, new):
        kept, options = {c.name for c in now.constraints}, dict(now.options)
        out.append(ContractTable(
            table=now.name,
            constraints=tuple(c.name for c in was.constraints if c.name not in kept),
            columns=tuple(c.name for c in was.columns if now.column(c.name) is None),
            options=tuple(k for k, _ in was.options if k not in options),
        ))  # fmt: skip
    out.append(DropTables(tuple(t.name for t in mid.tables if t.name not in _names(new.tables))))
    out.append(DropDomains(tuple(d.name for d in mid.domains if d not in new.domains)))
    return [step for step in out if not empty(step)]


def empty(step: Operation) -> bool:
    """An operation of the schema's difference with nothing to do (every field that
    lists objects is empty): the plan leaves it out."""
    listed = [v for f in dataclasses.fields(step) if isinstance(v := getattr(step, f.name), tuple)]
    return bool(listed) and not any(listed)


# --- the script ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MigrateContext:
    """What templates/migrate.sql.j2's header fills in (its fields are its variables);
    the plan's operations are its macros' arguments."""

    transaction: bool  # BEGIN ... COMMIT around the script (not with --no-transaction)
    machine: str
    header: str
    changes: list[str]  # fsmc diff's rows, as the script's header lists them
    lock_timeout: str
    refuses_caps: bool  # whether NEW adds or lowers a cap (the guard then counts firings)
    retyped: str  # the columns NEW gives another type, whose values may not convert ("": none)


def header(old: Build, new: Build, steps: Plan) -> MigrateContext:
    """What the header says of the script: the changes of the specs, and what `steps`,
    its plan, refuses and waits for."""
    refusal = next(s for s in steps if isinstance(s, Guard))
    timeout = next(s for s in steps if isinstance(s, SetLockTimeout))
    changes = []
    for r in rows(compare(old.machine, new.machine)):
        line = f"{r.mark} {r.kind} {r.subject}" + (f" ({r.note})" if r.note else "")
        changes.append(line + ("  BREAKING" if r.breaking else ""))
    return MigrateContext(
        transaction=isinstance(steps[0], Begin),
        machine=str(new.machine.name),
        header=migration_header(old.machine, new.machine),
        changes=changes,
        lock_timeout=timeout.timeout,
        refuses_caps=refusal.past_caps is not None,
        retyped=", ".join(f"{s.table}.{r.column.name} to {r.column.type}"
                          for s in steps if isinstance(s, RetypeColumns) for r in s.columns),  # fmt: skip
    )


def script(context: MigrateContext, steps: Sequence[Operation]) -> str:
    """The script's text: the header, then each operation rendered by the macro of
    templates/migrate.sql.j2 named after its class."""
    macros = environment().get_template("migrate.sql.j2").make_module(vars=as_variables(context))
    return str(macros) + "".join(str(getattr(macros, macro_name(type(step)))(step)) for step in steps)


def macro_name(kind: type) -> str:
    """`SetLockTimeout` -> `set_lock_timeout`."""
    return "".join("_" + c.lower() if c.isupper() else c for c in kind.__name__).lstrip("_")
