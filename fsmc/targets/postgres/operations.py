"""The operations a migration script is made of, as frozen data.

In: what `fsmc.migrate` decided from the builds of OLD, mid and NEW: model objects
(`fsmc.targets.postgres.model`), names and spec facts. Out: nothing but these records;
a migration's plan is a tuple of them in the order the script runs them, and
templates/migrate.sql.j2 renders each with the macro named after its class
(`SetLockTimeout` -> `set_lock_timeout`), at the end, in one place (`fsmc.migrate.script`).
Tests read a plan as data: which operations, in what order, holding what.

Identifiers are as SQL spells them, as in the model (`Names.sql`), except where a
field says raw. An operation that holds model objects renders their statements
through the model (`statements`), never by hand. Nothing here decides anything: what
a database needs, and why, is `fsmc.migrate`'s (and `formats`', for the history of
the schema's shape). The guard's row checks (`RefuseIfRowsIn`, `RefuseIfPastCaps`)
are parts of `Guard`, rendered inside its one block.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsmc.targets.postgres.formats import UpgradeFormat
from fsmc.targets.postgres.model import Column, Constraint, Domain, Function, Index, Trigger, View

# --- the frame: one transaction, a lock timeout -------------------------------------------


@dataclass(frozen=True)
class Begin:
    """BEGIN: the script is its own transaction."""


@dataclass(frozen=True)
class RefuseOutsideTransaction:
    """With --no-transaction, instead of BEGIN: refuse, changing nothing, when run
    outside a transaction (where each statement would commit alone)."""


@dataclass(frozen=True)
class SetLockTimeout:
    timeout: str  # an interval, as `SET LOCAL lock_timeout` takes it ('5s')


@dataclass(frozen=True)
class Commit:
    """COMMIT: the end of the script's own transaction."""


# --- the guard: the script changes nothing unless these hold --------------------------------


@dataclass(frozen=True)
class RefuseIfRowsIn:
    """Refuse while rows are in states NEW removes, naming each state and its count."""

    states: tuple[str, ...]  # raw, in OLD's order


@dataclass(frozen=True)
class CapChange:
    """A cap of NEW that rows may already be past: the guard counts them from history."""

    event: str  # raw
    cap: int
    column: str  # its count column
    added: bool  # OLD has no such cap: the column is added, then filled from history
    # 1.2: what history counts as NEW counts it: not a move to a spent budget's otherwise
    # ("from event to"), and only since the last move that reset it ("from event").
    uncounted: tuple[str, ...] = ()
    resets: tuple[str, ...] = ()


@dataclass(frozen=True)
class RefuseIfPastCaps:
    """Refuse while rows have fired an event more times than NEW's cap on it, naming
    the event, the cap, how many rows and their most firings."""

    caps: tuple[CapChange, ...]  # in NEW's event order


@dataclass(frozen=True)
class RefuseIfPastLimits:
    """Refuse while a state NEW limits anew or lower already holds more rows than its
    limit, naming the state, the limit and the count."""

    limits: tuple[tuple[str, int], ...]  # (state, limit), raw, in NEW's state order


@dataclass(frozen=True)
class Guard:
    """The script's first block: the schema must be the one OLD built, on the
    search_path first; both tables are locked and the digest read again; then the
    row checks. Under OLD's names (nothing is renamed yet)."""

    machine: str  # raw, for messages
    digest: str  # the digest function's signature: `job_fsmc_digest()`
    old_digest: str
    new_digest: str
    table: str
    events_table: str
    id_column: str
    rows_in: RefuseIfRowsIn | None
    past_caps: RefuseIfPastCaps | None
    past_limits: RefuseIfPastLimits | None = None


@dataclass(frozen=True)
class PrepareWriterRole:
    """The installation's writer role made or checked (NEW's `install.prepare`), before
    any trigger that names it is created."""

    statements: str


# --- expand: names, columns, data ---------------------------------------------------------


@dataclass(frozen=True)
class RememberMovers:
    """NEW's `_apply` takes other parameters (1.2's `due_at`): a new function, whose
    grants start empty, so the roles that may call OLD's are remembered (the setting
    `fsmc.movers`, which `GrantMovers` reads) before OLD's is dropped."""

    apply: str  # OLD's `_apply`, as `regprocedure` spells it


@dataclass(frozen=True)
class Renames:
    """Every name OLD's build gives that mid's gives otherwise. Raw: the template
    quotes them, and passes the sequence's to `format('%I')`."""

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


@dataclass(frozen=True)
class ExpandTable:
    """New columns (NULL or a constant default: no rewrite), defaults, columns that may
    now be NULL, storage parameters."""

    table: str
    columns: tuple[Column, ...]
    defaults: tuple[tuple[str, str | None], ...]  # (column, new default or None: drop it)
    options: tuple[tuple[str, str], ...]  # (name, value) set
    allow_null: tuple[str, ...] = ()  # DROP NOT NULL


@dataclass(frozen=True)
class RetypedColumn:
    column: Column  # NEW's
    had_default: bool  # the table's column has a default (of its old type): dropped first


@dataclass(frozen=True)
class RetypeColumns:
    """Columns NEW gives another type (1.2's declared columns), in one ALTER TABLE: each
    value cast to it (`USING column::type`), which rewrites the table; a value that
    does not convert aborts the script, changing nothing. The old default goes first
    (it is of the old type), NEW's is set after."""

    table: str
    columns: tuple[RetypedColumn, ...]

    @property
    def listed(self) -> str:
        """`priority to integer, note to jsonb`, for the script's error message."""
        return ", ".join(f"{r.column.name} to {r.column.type}" for r in self.columns)


@dataclass(frozen=True)
class RequireValues:
    """Columns NEW no longer lets be NULL: their NULLs get NEW's default, then SET NOT
    NULL (which scans the table)."""

    table: str
    columns: tuple[tuple[str, str], ...]  # (column, NEW's default: an SQL expression)


@dataclass(frozen=True)
class FillCountColumns:
    """The count columns of the caps NEW adds, set from each row's history (the guard
    made sure no row is past its cap)."""

    table: str
    events_table: str
    id_column: str
    caps: tuple[CapChange, ...]


@dataclass(frozen=True)
class SetDueTimes:
    """1.2: rows already in a state whose timer NEW adds or changes get the due time
    their entry and history give (`encode.due_from_entry`); in one NEW no longer times,
    none."""

    table: str
    due: tuple[tuple[str, str], ...]  # (state, raw; its due time, an SQL expression over t)
    untimed: tuple[str, ...]  # raw


@dataclass(frozen=True)
class CreateTable:
    """A table NEW adds (1.2's limits slots), with the rows its file inserts."""

    statement: str


@dataclass(frozen=True)
class FillLimits:
    """1.2's limits slots made NEW's: as many per limited state as NEW's limit, one held by
    each row already in it (the guard made sure none is past its limit), no other slot."""

    table: str
    limits_table: str
    limits: tuple[tuple[str, int], ...]  # (state, limit), raw


@dataclass(frozen=True)
class StartHeartbeats:
    """Rows already in a state NEW leases get `heartbeat_at = now()`, so reclaim takes
    them once stale (a NULL heartbeat never would be)."""

    machine: str  # raw, for the comment
    table: str
    states: tuple[str, ...]  # raw


@dataclass(frozen=True)
class ClearClaims:
    """Rows in a state NEW no longer leases (NEW still has a lease) lose their claim, as
    a move out of the lease would."""

    table: str
    states: tuple[str, ...]  # raw


# --- replace: every object NEW defines, whatever built the database's --------------------------


@dataclass(frozen=True)
class ReplaceIndexes:
    """Indexes NEW adds or defines otherwise (those dropped first, then built)."""

    dropped: tuple[str, ...]
    created: tuple[Index, ...]

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(i.create() for i in self.created)


@dataclass(frozen=True)
class CreateDomains:
    """NEW's domains the database lacks, before the CHECKs that cast to them."""

    domains: tuple[Domain, ...]

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(d.create() for d in self.domains)


@dataclass(frozen=True)
class DropUnreplaceableFunctions:
    """Functions CREATE OR REPLACE cannot turn into NEW's (result type or parameter
    names change), dropped before they are created again."""

    signatures: tuple[str, ...]


@dataclass(frozen=True)
class ReplaceFunctions:
    """Every function of NEW but the digest, CREATE OR REPLACE (owner and grants kept)."""

    functions: tuple[Function, ...]

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(f.create(or_replace=True) for f in self.functions)


@dataclass(frozen=True)
class NewCheck:
    constraint: Constraint  # a CHECK
    replaces: bool  # the table has one of that name: dropped in the same statement


@dataclass(frozen=True)
class ReplaceConstraints:
    """A table's CHECKs NEW defines otherwise, added NOT VALID (validated later), and
    the other constraints NEW adds."""

    table: str
    checks: tuple[NewCheck, ...]
    added: tuple[Constraint, ...]


@dataclass(frozen=True)
class ReplaceViews:
    """Every view of NEW, CREATE OR REPLACE; one NEW defines otherwise dropped first
    (its columns may change)."""

    dropped: tuple[str, ...]
    views: tuple[View, ...]

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(v.create(or_replace=True) for v in self.views)


@dataclass(frozen=True)
class RecreatedTrigger:
    trigger: Trigger
    existed: bool  # the database has one of that name on that table: dropped first

    @property
    def statement(self) -> str:
        return self.trigger.create()


@dataclass(frozen=True)
class RecreateTriggers:
    """Every trigger of NEW, created again (a constraint trigger cannot be replaced)."""

    triggers: tuple[RecreatedTrigger, ...]


@dataclass(frozen=True)
class ValidateCheck:
    """A CHECK every row meets (the guard made sure)."""

    table: str
    name: str


@dataclass(frozen=True)
class ValidateHistoryCheck:
    """A history table's CHECK, validated where its history allows: old rows that
    break it stay, the CHECK then stays NOT VALID and a NOTICE counts them."""

    table: str
    constraint: Constraint


# --- contract: what NEW lacks -------------------------------------------------------------


@dataclass(frozen=True)
class DropObjects:
    """Triggers, functions, views and indexes NEW lacks."""

    triggers: tuple[tuple[str, str], ...]  # (name, table)
    functions: tuple[str, ...]  # signatures
    views: tuple[str, ...]
    indexes: tuple[str, ...]


@dataclass(frozen=True)
class ContractTable:
    """A table's constraints, columns and storage parameters NEW lacks."""

    table: str
    constraints: tuple[str, ...]
    columns: tuple[str, ...]
    options: tuple[str, ...]  # reset


@dataclass(frozen=True)
class DropTables:
    """Tables NEW lacks (1.2's limits slots, once no limit is left), after the
    triggers and functions that used them."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class DropDomains:
    """OLD's domains NEW lacks, once no CHECK casts to them."""

    names: tuple[str, ...]


# --- finish: the record of NEW, the pin, the grants -----------------------------------------


@dataclass(frozen=True)
class RecordDigest:
    """NEW's digest function, replaced last: it records that the migration is done."""

    function: Function

    @property
    def statement(self) -> str:
        return self.function.create(or_replace=True)


@dataclass(frozen=True)
class PinFunctions:
    """NEW's install setup and search_path pin (`install.finish`): CREATE OR REPLACE
    drops a function's settings, so every function is pinned again."""

    statements: str


@dataclass(frozen=True)
class GrantMovers:
    """The roles that may move rows (EXECUTE on `_apply`, or, from format 2, UPDATE on
    the table) get EXECUTE on every function an application calls, and exactly the
    application's column privileges on both tables."""

    apply: Function  # NEW's `_apply`
    table: str
    events_table: str
    functions: tuple[str, ...]  # `install.callable_functions`, each by its signature
    writes: tuple[str, str]  # `install.app_writes`
    limits_table: str = ""  # 1.2: the limits' slots, which the movers may read ("" without limits)


Operation = (
    Begin | RefuseOutsideTransaction | SetLockTimeout | Guard | PrepareWriterRole | UpgradeFormat | Renames
    | RememberMovers | ExpandTable | RetypeColumns | RequireValues | CreateTable | FillLimits | DropTables | FillCountColumns | SetDueTimes | StartHeartbeats | ClearClaims | ReplaceIndexes | CreateDomains
    | DropUnreplaceableFunctions | ReplaceFunctions | ReplaceConstraints | ReplaceViews | RecreateTriggers
    | ValidateCheck | ValidateHistoryCheck | DropObjects | ContractTable | DropDomains | RecordDigest
    | PinFunctions | GrantMovers | Commit
)  # fmt: skip
Plan = tuple[Operation, ...]
