"""Migrate: two versions of one machine -> the SQL script that moves a database built
from OLD's `.sql` to what NEW's `.sql` builds (contract section 6).

`migrate(old, new)` is pure: two checked machines in, the script's text out; the
empty string when both specs build the same schema (the same machine digest:
formatting, descriptions and order change nothing a database holds). It raises
`Unsupported` for a pair it will not script (below); the CLI makes that exit 2.

How the script is made: from models, never from SQL text, over finished builds.
`fsmc.targets.postgres.build.build` makes the `Build` of OLD, of mid (OLD's machine
under NEW's `postgres` names: what the database is once renamed) and of NEW, each
once; their `Schema`s are the model `fsmc build` renders, so the migration always
builds what the SQL target builds. First the names: the raw `Names` of OLD's and
mid's builds are compared field by field, and each name that differs is renamed
(as a table, constraint or index, whichever OLD's schema has under it). Then the
steps an older schema format needs (`fsmc.targets.postgres.formats`, from OLD's
build). Then `plan` compares mid's schema with NEW's: columns added or dropped, defaults, CHECK
constraints, storage parameters, indexes, views, functions, triggers. Every
function is replaced (CREATE OR REPLACE keeps its grants and owner; one whose
result type or parameter names change is dropped first; one whose argument types
change is another function: NEW's is created, OLD's dropped with the other objects
NEW lacks) and every view replaced, every trigger dropped and
created again (a constraint trigger cannot be replaced), not only those whose
text changed: the result is then NEW's, whichever fsmc version built the
database's functions. The data rules (the digest guard, states with rows, the
claim columns, history) come from the machines, through `fsmc.facts`.

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
3. Expand: renames (tables, and the constraint, index and identity-sequence names
   derived from them), new columns, defaults, storage parameters, the count
   column of each cap NEW adds filled from each row's history, new or changed
   indexes, and the claim columns of rows whose state gains or loses its lease.
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
and names that trade places (the table taking the old events table's name, ...:
rename in two releases).

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
nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fsmc import facts
from fsmc.diff import compare
from fsmc.diff_render import rows
from fsmc.digest import machine_digest
from fsmc.escape import SQL_NAME_MAX, sql_ident, sql_text_array
from fsmc.model import Machine
from fsmc.targets.common import migration_header
from fsmc.targets.postgres.build import Build, build
from fsmc.targets.postgres.formats import Upgrades, upgrades
from fsmc.targets.postgres.install import app_writes, callable_functions
from fsmc.targets.postgres.model import Function, Index, Schema, Table, Trigger, View
from fsmc.targets.postgres.names import Names, Quoted, count_column
from fsmc.templating import as_variables, render

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
    refused = traded_names(before, mid)
    if refused:
        raise Unsupported("\n".join(refused))
    return render("migrate.sql.j2", **as_variables(context(before, mid, after, lock_timeout, transaction)))


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
    return out


def traded_names(old: Build, mid: Build) -> list[str]:
    """Refused: NEW giving a name OLD used to another object (empty: none)."""
    renames = Renames.of(old, mid)
    traded = sorted(set(renames.old_names) & set(renames.new_names))
    if not traded:
        return []
    return [
        "NEW gives names OLD used to other objects "
        f"({', '.join(traded)}): fsmc migrate does not "
        "trade names between objects; rename in two releases (first to unused names)"
    ]


def mid_machine(old: Machine, new: Machine) -> Machine:
    """OLD's machine under NEW's PostgreSQL names: what the database is once renamed."""
    return dataclasses.replace(old, postgres=new.postgres)


@dataclass(frozen=True)
class Renames:
    """Every name OLD's build gives that mid's gives otherwise (raw: the template
    quotes them)."""

    tables: tuple[tuple[str, str], ...]  # (old, new)
    constraints: tuple[tuple[str, str, str], ...]  # (table as renamed, old, new)
    indexes: tuple[tuple[str, str], ...]
    sequences: tuple[tuple[str, str, str], ...]  # (table as renamed, column, new sequence name)

    @property
    def old_names(self) -> list[str]:
        return [o for o, _ in self.tables + self.indexes] + [o for _, o, _ in self.constraints]

    @property
    def new_names(self) -> list[str]:
        return (
            [n for _, n in self.tables + self.indexes]
            + [n for _, _, n in self.constraints]
            + [s for _, _, s in self.sequences]
        )

    def __bool__(self) -> bool:
        return bool(self.tables or self.constraints or self.indexes or self.sequences)

    @staticmethod
    def of(old: Build, mid: Build) -> Renames:
        """`Names` of OLD and of mid, field by field; what each differing name is
        (a table, a constraint, an index) OLD's schema says, asked by the name as
        SQL spells it (the model's)."""
        before, after, schema = old.names, mid.names, old.schema
        raw_tables = {sql_ident(t): t for t in (before.table, before.events_table, before.purge_tickets)}
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
        return Renames(
            tuple(renamed_table.items()), tuple(out_constraints), tuple(out_indexes), tuple(sequences)
        )


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


# --- the difference of two schemas -----------------------------------------------------


@dataclass(frozen=True)
class Check:
    """A CHECK constraint NEW defines differently from the database (or anew)."""

    name: str
    definition: str
    expression: str
    existed: bool
    history: bool  # on a history table: may stay NOT VALID over old rows


@dataclass(frozen=True)
class TableChanges:
    name: str
    add_columns: tuple[str, ...]  # definitions
    defaults: tuple[tuple[str, str | None], ...]  # (column, new default or None: drop it)
    set_options: tuple[tuple[str, str], ...]
    reset_options: tuple[str, ...]
    checks: tuple[Check, ...]
    add_constraints: tuple[tuple[str, str], ...]  # non-CHECK constraints NEW adds
    drop_constraints: tuple[str, ...]
    drop_columns: tuple[str, ...]


def table_changes(mid: Table, new: Table) -> TableChanges:
    assert mid.name == new.name, (mid.name, new.name)
    defaults: list[tuple[str, str | None]] = []
    for column in new.columns:
        was = mid.column(column.name)
        if was is None or was == column:
            continue
        if dataclasses.replace(was, default=column.default) != column:
            raise AssertionError(f"fsmc migrate cannot change column {was} to {column}")
        defaults.append((column.name, column.default))
    mid_constraints = {c.name: c for c in mid.constraints}
    new_names = {c.name for c in new.constraints}
    checks: list[Check] = []
    add_constraints: list[tuple[str, str]] = []
    for c in new.constraints:
        had = mid_constraints.get(c.name)
        if had == c:
            continue
        if c.check is not None:
            checks.append(Check(c.name, c.definition, c.check, had is not None, new.history))
        else:
            assert had is None, f"fsmc migrate cannot change constraint {c.name}: {had}"
            add_constraints.append((c.name, c.definition))
    mid_options, new_options = dict(mid.options), dict(new.options)
    return TableChanges(
        name=new.name,
        add_columns=tuple(c.definition for c in new.columns if mid.column(c.name) is None),
        defaults=tuple(defaults),
        set_options=tuple((k, v) for k, v in new.options if mid_options.get(k) != v),
        reset_options=tuple(k for k, _ in mid.options if k not in new_options),
        checks=tuple(checks),
        add_constraints=tuple(add_constraints),
        drop_constraints=tuple(c.name for c in mid.constraints if c.name not in new_names),
        drop_columns=tuple(c.name for c in mid.columns if new.column(c.name) is None),
    )


@dataclass(frozen=True)
class Plan:
    """What turns a database holding `mid` into one holding `new` (both `Schema`s,
    under the same names): the difference, object by object."""

    tables: list[TableChanges]
    drop_indexes_first: list[str]  # an index NEW defines otherwise: dropped, built again
    create_indexes: list[str]  # CREATE INDEX statements
    drop_views_first: list[str]  # a view NEW defines otherwise (its columns may change)
    views: list[str]  # CREATE OR REPLACE VIEW, for every view of NEW
    create_domains: list[str]  # CREATE DOMAIN, for each domain of NEW the database lacks
    drop_domains: list[str]  # names: mid's domains NEW lacks, once no CHECK casts to them
    drop_functions_first: list[str]  # signatures CREATE OR REPLACE cannot turn into NEW's
    functions: list[str]  # CREATE OR REPLACE FUNCTION, for every function of NEW
    triggers: list[tuple[str, str, str, bool]]  # (name, table, CREATE TRIGGER, existed)
    drop_triggers: list[tuple[str, str]]  # (name, table)
    drop_functions: list[str]  # signatures
    drop_views: list[str]
    drop_indexes: list[str]


def plan(mid: Schema, new: Schema) -> Plan:
    """Every object of `new` that `mid` lacks or defines otherwise, and every object of
    `mid` that `new` lacks (tables are the same ones: spec changes never add or drop one)."""
    assert [t.name for t in mid.tables] == [t.name for t in new.tables]
    mid_indexes: dict[str, Index] = {i.name: i for i in mid.indexes}
    new_indexes: dict[str, Index] = {i.name: i for i in new.indexes}
    mid_views: dict[str, View] = {v.name: v for v in mid.views}
    new_views: dict[str, View] = {v.name: v for v in new.views}
    mid_functions: dict[str, Function] = {f.key: f for f in mid.functions}
    new_functions: dict[str, Function] = {f.key: f for f in new.functions}
    mid_triggers: dict[tuple[str, str], Trigger] = {g.key: g for g in mid.triggers}
    new_triggers: dict[tuple[str, str], Trigger] = {g.key: g for g in new.triggers}
    return Plan(
        tables=[table_changes(m, n) for m, n in zip(mid.tables, new.tables, strict=True)],
        drop_indexes_first=[i for i, x in mid_indexes.items() if new_indexes.get(i, x) != x],
        create_indexes=[x.create() for i, x in new_indexes.items() if mid_indexes.get(i) != x],
        drop_views_first=[v for v, x in mid_views.items() if new_views.get(v, x) != x],
        views=[x.create(or_replace=True) for x in new_views.values()],
        create_domains=[d.create() for d in new.domains if d not in mid.domains],
        drop_domains=[d.name for d in mid.domains if d not in new.domains],
        drop_functions_first=[
            k for k, f in mid_functions.items() if k in new_functions and not f.replaceable_by(new_functions[k])
        ],
        functions=[f.create(or_replace=True) for f in new_functions.values()],
        triggers=[(g.name, g.table, g.create(), k in mid_triggers) for k, g in new_triggers.items()],
        drop_triggers=[(g.name, g.table) for k, g in mid_triggers.items() if k not in new_triggers],
        drop_functions=[k for k in mid_functions if k not in new_functions],
        drop_views=[v for v in mid_views if v not in new_views],
        drop_indexes=[i for i in mid_indexes if i not in new_indexes],
    )


# --- the script's context --------------------------------------------------------------


@dataclass(frozen=True)
class MigrateContext:
    """What templates/migrate.sql.j2 fills in (its fields are its variables)."""

    transaction: bool  # BEGIN ... COMMIT around the script (not with --no-transaction)
    machine: str
    header: str
    old_digest: str
    new_digest: str
    changes: list[str]  # fsmc diff's rows, as the script's header lists them
    lock_timeout: str
    old: Quoted  # OLD's names, as SQL spells them
    n: Quoted  # NEW's
    digest_signature: str
    format_signature: str
    formats: Upgrades  # what older schema formats lack, under OLD's names
    writer_functions: str  # the SECURITY DEFINER functions NEW has, comma-separated
    app_writes: tuple[str, str]  # the application's column privileges on NEW's two tables
    apply_signature: str  # NEW's `_apply`, as regprocedure reads it
    digest_query: str
    removed_states: str | None  # a text[] literal
    caps: list[CapChange]  # caps rows may already be past (added or lowered), NEW's event order
    capped_events: str | None  # their events, a text[] literal
    filled: list[CapChange]  # the added ones: their count columns are filled from history
    filled_events: str | None  # their events, a text[] literal
    renames: Renames
    lease_start: str | None  # a text[] literal
    lease_end: str | None  # a text[] literal
    plan: Plan
    digest_function: str  # NEW's digest function, replaced last
    prepare: str  # the writer role made or checked, before triggers are created
    pin: str


@dataclass(frozen=True)
class CapChange:
    """A cap of NEW that rows may already be past: the guard counts them from history."""

    event: str
    cap: int
    column: str  # its count column, as SQL spells it
    added: bool  # OLD has no such cap: the column is added, then filled from history


def context(old: Build, mid: Build, new: Build, lock_timeout: str, transaction: bool = True) -> MigrateContext:
    """The script's context from the builds of OLD, mid (OLD under NEW's names) and NEW."""
    n = new.names.sql
    # The digest function is replaced last: it records that the migration is done.
    digest = next(f for f in new.schema.functions if f.name == n.digest)
    changes_to = dataclasses.replace(
        new.schema, functions=tuple(f for f in new.schema.functions if f is not digest)
    )
    changes_from = dataclasses.replace(
        mid.schema, functions=tuple(f for f in mid.schema.functions if f.name != n.digest)
    )
    lease_start, lease_end = facts.lease_starts_and_ends(old.machine, new.machine)
    removed_states = facts.removed_states(old.machine, new.machine)
    caps = [
        CapChange(e, cap, sql_ident(count_column(e)), added)
        for e, cap, added in facts.tightened_caps(old.machine, new.machine)
    ]
    filled = [c for c in caps if c.added]
    changes = []
    for r in rows(compare(old.machine, new.machine)):
        line = f"{r.mark} {r.kind} {r.subject}" + (f" ({r.note})" if r.note else "")
        changes.append(line + ("  BREAKING" if r.breaking else ""))
    return MigrateContext(
        transaction=transaction,
        machine=str(new.machine.name),
        header=migration_header(old.machine, new.machine),
        old_digest=machine_digest(old.machine),
        new_digest=machine_digest(new.machine),
        changes=changes,
        lock_timeout=lock_timeout,
        old=old.names.sql,
        n=n,
        digest_signature=f"{n.digest}()",
        format_signature=f"{n.format}()",
        formats=upgrades(old),
        apply_signature=next(f.key for f in new.schema.functions if f.name == n.apply),
        writer_functions=", ".join(sql_ident(f) for f in callable_functions(new.machine, new.names)),
        app_writes=app_writes(new.machine, new.names),
        digest_query=f"SELECT {n.digest}()",
        removed_states=sql_text_array(removed_states) if removed_states else None,
        caps=caps,
        capped_events=sql_text_array(c.event for c in caps) if caps else None,
        filled=filled,
        filled_events=sql_text_array(c.event for c in filled) if filled else None,
        renames=Renames.of(old, mid),
        lease_start=sql_text_array(lease_start) if lease_start else None,
        lease_end=sql_text_array(lease_end) if lease_end else None,
        plan=plan(changes_from, changes_to),
        digest_function=digest.create(or_replace=True),
        # CREATE OR REPLACE drops a function's settings: pin every function again.
        prepare=new.install.prepare,
        pin=new.install.finish,
    )
