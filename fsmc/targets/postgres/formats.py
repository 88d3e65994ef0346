"""The history of the schema's shape, and what `fsmc migrate` does first to bring a
database an older fsmc built up to the current one.

In: the `Build` of OLD (the spec the database was built from). Out: `Upgrades`, what
each older format lacks, as statements and names under OLD's names, for
templates/migrate.sql.j2's first block (which reads `<machine>_fsmc_format()` and
applies the steps the database's format needs). Nothing here compares two specs:
after these steps the database is OLD's build in the current format, and the plan
of `fsmc.migrate` takes it from there.

`SCHEMA_FORMAT` is what `<machine>_fsmc_format()` returns:
1: before it existed (no created_at/entered_at, claim, purge, intervals); 2: with
them; 3: the writer role owns the moving functions, and `_apply` takes `to_state`;
4: the state and triple CHECKs cast to domains holding the lists (format 3: the
triples in a function); 5: the triple CHECK casts a text[] to a domain of nested
moves (format 4: the three columns joined into one text), and the triggers skipping
the writer's writes compare CURRENT_USER with a text (format 4: a name); 6: the
writer role owns the heartbeat and the update guard too, which stamps a direct
move's times, and the application's grants are column by column (format 5: whole
tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsmc.escape import sql_ident, sql_name
from fsmc.targets.postgres.encode import id_type

if TYPE_CHECKING:
    from fsmc.targets.postgres.build import Build

SCHEMA_FORMAT = 6


@dataclass(frozen=True)
class Upgrades:
    """What formats before the current one lack, under OLD's names."""

    format2: list[str]  # what format 2 added (CREATE statements), after its two columns
    format3_dropped: str  # format 2's `_apply`, without to_state (its signature)
    format4_domains: list[str]  # OLD's domains (CREATE DOMAIN), which format 4's CHECKs cast to
    format4_checks: list[tuple[str, str, str, bool]]  # (table, name, definition, history): the CHECKs casting to them
    format4_dropped: str  # the function format 3's triple CHECK called (its signature)
    format5_domain: str  # OLD's moves domain (CREATE DOMAIN), which format 5's triple CHECK casts to
    format5_check: str  # that CHECK's definition
    format5_dropped: str  # the domain format 4's triple CHECK cast to


def upgrades(old: Build) -> Upgrades:
    n, schema, machine = old.names.sql, old.schema, str(old.machine.name)
    _, moves = schema.domains
    return Upgrades(
        format2=format2(old),
        format3_dropped=f"{n.apply}({id_type(old.machine)}, text, bigint, text, jsonb)",
        format4_domains=[d.create() for d in schema.domains],
        format4_checks=[
            (t.name, c.name, c.definition, t.history)
            for t in schema.tables
            for c in t.constraints
            if c.name in (n.state_check, n.triple_check)
        ],
        # The function format 3's CHECK called, and the domain format 4's cast
        # `from_state || ' ' || event || ' ' || to_state` to: each named, as the
        # domains are now, after a hash of the triples.
        format4_dropped=sql_ident(sql_name(machine, "transitions", old.triples_hash)) + "(text, text, text)",
        format5_domain=moves.create(),
        format5_check=next(c.definition for c in schema.table(n.events_table).constraints if c.name == n.triple_check),
        format5_dropped=sql_ident(sql_name(machine, "transition", old.triples_hash)),
    )


def format2(old: Build) -> list[str]:
    """What format 2 added to a schema, as OLD's model builds it under OLD's names:
    the claim and purge indexes, the purge ticket table, the intervals view. The
    script creates them in a database that has no `<machine>_fsmc_format()` (built by
    an fsmc before format 2), after adding and filling the two timestamp columns, so
    every later step finds what it expects."""
    n, schema = old.names.sql, old.schema
    indexes = [i.create() for i in schema.indexes if i.name in (n.claim_index, n.purge_index)]
    tickets = [t.create() for t in schema.tables if t.name == n.purge_tickets]
    views = [v.create() for v in schema.views if v.name == n.intervals]
    return indexes + tickets + views
