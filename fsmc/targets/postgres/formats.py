"""The history of the schema's shape, and the operation `fsmc migrate` runs first to
bring a database an older fsmc built up to the current one.

In: the `Build` of OLD (the spec the database was built from). Out: `UpgradeFormat`,
the first change of a migration's plan (`fsmc.targets.postgres.operations`): what
each older format lacks, one step a format, under OLD's names. The script reads
`<machine>_fsmc_format()` and runs the steps the database's format needs
(templates/migrate.sql.j2, `upgrade_format`). Nothing here compares two specs: after
these steps the database is OLD's build in the current format, and the rest of the
plan (`fsmc.migrate`) takes it from there.

`SCHEMA_FORMAT` is what `<machine>_fsmc_format()` returns:
1: before it existed (no created_at/entered_at, claim, purge, intervals); 2: with
them; 3: the writer role owns the moving functions, and `_apply` takes `to_state`;
4: the state and triple CHECKs cast to domains holding the lists (format 3: the
triples in a function); 5: the triple CHECK casts a text[] to a domain of nested
moves (format 4: the three columns joined into one text), and the triggers skipping
the writer's writes compare CURRENT_USER with a text (format 4: a name); 6: the
writer role owns the heartbeat and the update guard too, which stamps a direct
move's times, and the application's grants are column by column (format 5: whole
tables); 7: `_claim` returns the claimed rows whole, as the table's row type (format 6:
their ids and versions); 8: the times the database writes are the moment of the write
(`clock_timestamp()`), not the transaction's start, the columns' defaults included, and
the event log's own trigger stamps a move by hand (format 7: `now()`).

Identifiers are as SQL spells them (`Names.sql`), as in the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsmc.escape import sql_ident, sql_name
from fsmc.targets.postgres.encode import id_type
from fsmc.targets.postgres.model import Constraint, Domain, Index, Table, View

if TYPE_CHECKING:
    from fsmc.targets.postgres.build import Build

SCHEMA_FORMAT = 8


@dataclass(frozen=True)
class Format2:
    """What format 2 added: `created_at` and `entered_at` (filled from each row's first
    and last event, or now), then the claim and purge indexes, the purge ticket table
    and the intervals view, as OLD's model builds them."""

    created: tuple[Index | Table | View, ...]

    @property
    def statements(self) -> tuple[str, ...]:
        """Without their semicolons: the script EXECUTEs each."""
        return tuple(o.create().removesuffix(";") for o in self.created)


@dataclass(frozen=True)
class Format3:
    """Format 3: `_apply` takes to_state, so format 2's (without it) goes, or every call
    would be ambiguous; the event log's foreign key goes (triggers keep what it kept);
    the roles that could UPDATE the table are remembered, to be granted EXECUTE."""

    apply: str  # format 2's `_apply`, its signature
    events_fkey: str


@dataclass(frozen=True)
class FormatCheck:
    table: str
    constraint: Constraint
    history: bool  # on a history table: may stay NOT VALID over old rows


@dataclass(frozen=True)
class Format4:
    """Format 4: the state and triple CHECKs cast to domains holding the spec's lists,
    validated where history allows; format 3's triples function goes, and the log's
    CHECK of version > 0 (the commit-time check of each event row does it)."""

    domains: tuple[Domain, ...]
    checks: tuple[FormatCheck, ...]  # the CHECKs casting to them
    function: str  # the function format 3's triple CHECK called, its signature
    version_check: str

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(d.create() for d in self.domains)


@dataclass(frozen=True)
class Format5:
    """Format 5 (from format 4 only: format 4's step makes today's CHECKs already): the
    log's CHECK casts a text[] to a domain of nested moves, and the domain format 4's
    cast one joined text to goes. From any format before 5: the commit-time check on
    the table is a trigger of another name (the triggers are made again later)."""

    domain: Domain
    check: Constraint  # the log's triple CHECK
    dropped_domain: str
    check_logged: str  # the commit-time check's trigger before format 5

    @property
    def statement(self) -> str:
        return self.domain.create()


@dataclass(frozen=True)
class UpgradeFormat:
    """Bring a schema an older fsmc built to the current format, under OLD's names;
    nothing happens on a current one."""

    function: str  # `<machine>_fsmc_format()`: none is format 1
    table: str
    events_table: str
    id_column: str
    apply: str  # OLD's `_apply`, which the comment names
    format2: Format2
    format3: Format3
    format4: Format4
    format5: Format5
    claim: str  # OLD's `_claim`, its signature: before format 7 it returned (id, state_version)
    stamp: str  # format 8: what the columns of times default to (`build.STAMP`)


def upgrade_format(old: Build) -> UpgradeFormat:
    n, schema, machine = old.names.sql, old.schema, str(old.machine.name)
    _, moves = schema.domains
    return UpgradeFormat(
        function=f"{n.format}()",
        table=n.table,
        events_table=n.events_table,
        id_column=n.id_column,
        apply=n.apply,
        format2=Format2(format2_objects(old)),
        format3=Format3(apply=f"{n.apply}({id_type(old.machine)}, text, bigint, text, jsonb)", events_fkey=n.events_fkey),
        format4=Format4(
            domains=schema.domains,
            checks=tuple(
                FormatCheck(t.name, c, t.history)
                for t in schema.tables
                for c in t.constraints
                if c.name in (n.state_check, n.triple_check)
            ),
            # The function format 3's CHECK called, and the domain format 4's cast
            # `from_state || ' ' || event || ' ' || to_state` to: each named, as the
            # domains are now, after a hash of the triples.
            function=sql_ident(sql_name(machine, "transitions", old.triples_hash)) + "(text, text, text)",
            version_check=n.version_check,
        ),
        format5=Format5(
            domain=moves,
            check=next(c for c in schema.table(n.events_table).constraints if c.name == n.triple_check),
            dropped_domain=sql_ident(sql_name(machine, "transition", old.triples_hash)),
            check_logged=n.check_logged,
        ),
        claim=next(f.key for f in schema.functions if f.name == n.claim),
        stamp=next(c.default for c in schema.table(n.table).columns if c.name == "entered_at") or "",
    )


def format2_objects(old: Build) -> tuple[Index | Table | View, ...]:
    """What format 2 added to a schema, as OLD's model builds it under OLD's names:
    the claim and purge indexes, the purge ticket table, the intervals view. The
    script creates them in a database that has no `<machine>_fsmc_format()` (built by
    an fsmc before format 2), after adding and filling the two timestamp columns, so
    every later step finds what it expects."""
    n, schema = old.names.sql, old.schema
    indexes = [i for i in schema.indexes if i.name in (n.claim_index, n.purge_index)]
    tickets = [t for t in schema.tables if t.name == n.purge_tickets]
    views = [v for v in schema.views if v.name == n.intervals]
    return (*indexes, *tickets, *views)
