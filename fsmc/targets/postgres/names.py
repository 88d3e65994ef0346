"""The identifiers of one installation of a machine in PostgreSQL.

In: a checked `Machine`. Out: `Names`, every name the schema gives an object (table,
log, function, trigger, index, constraint), RAW: the name itself, as PostgreSQL's
catalog stores it and as the writer role's DO blocks pass it to `format('%I')`.
Quoting happens at the edge, once: `Names.sql` is the same names as SQL spells them
(`fsmc.escape.sql_ident`), for templates and the model's statements. Nothing here,
or anywhere, turns a quoted name back into a raw one.

Derived names go through `fsmc.escape.sql_name`: kept within PostgreSQL's 63 bytes
and distinct from each other however long the spec's names are.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, fields
from functools import cached_property

from fsmc.escape import sql_ident, sql_name, sql_str
from fsmc.model import Machine


@dataclass(frozen=True)
class Names:
    """Every identifier the file uses, raw (see the module doc)."""

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
    purge_tickets_pkey: str
    claim_index: str
    claim_by_index: str  # 1.2: the claimable rows by the columns a claim may be limited to
    due_index: str  # 1.2: the timed states' rows by due time, which a claim of a timed event reads
    purge_index: str
    digest: str
    format: str
    guard_insert: str
    guard_update: str
    check_logged: str
    logged_check: str  # check_logged's trigger: named to fire after guard_update's
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
    writer: str  # the function naming this installation's writer role (install.prepare)
    # 1.2, `limits`: the slots table, its keys and index, the function counting and its triggers
    limits: str
    limits_pkey: str
    limits_holder: str
    limits_free: str
    count_limits: str
    limits_insert: str
    limits_update: str
    limits_delete: str
    limits_truncate: str
    # `postgres.notify`: the trigger function sending the wake-ups, its triggers, and
    # the function telling a waiter when a row is next claimable
    notify: str
    notify_insert: str
    notify_update: str
    claimable_in: str

    @staticmethod
    def of(machine: Machine) -> Names:
        m, table, events = str(machine.name), str(machine.postgres.table), str(machine.postgres.events_table)
        return Names(
            table=table,
            events_table=events,
            id_column=id_column(machine),
            apply=sql_name(m, "apply"),
            heartbeat=sql_name(m, "heartbeat"),
            reclaim=sql_name(m, "reclaim"),
            claim=sql_name(m, "claim"),
            purge=sql_name(m, "purge"),
            intervals=sql_name(m, "intervals"),
            purge_tickets=sql_name(m, "purge_tickets"),
            purge_tickets_pkey=sql_name(m, "purge_tickets", "pkey"),
            claim_index=sql_name(table, "claim_idx"),
            claim_by_index=sql_name(table, "claim_by_idx"),
            due_index=sql_name(table, "due_idx"),
            purge_index=sql_name(table, "purge_idx"),
            digest=sql_name(m, "fsmc_digest"),
            format=sql_name(m, "fsmc_format"),
            guard_insert=sql_name(m, "guard_insert"),
            guard_update=sql_name(m, "guard_update"),
            check_logged=sql_name(m, "check_logged"),
            logged_check=sql_name(m, "logged_check"),
            append_only=sql_name(m, "events_append_only"),
            append_only_truncate=sql_name(m, "events_append_only_truncate"),
            check_event=sql_name(m, "check_event"),
            guard_delete=sql_name(m, "guard_delete"),
            guard_delete_truncate=sql_name(m, "guard_delete_truncate"),
            table_pkey=sql_name(table, "pkey"),
            state_check=sql_name(table, "state_check"),
            lease_index=sql_name(table, "lease_idx"),
            events_pkey=sql_name(events, "pkey"),
            events_fkey=sql_name(events, "fkey"),
            triple_check=sql_name(events, "transition_check"),
            version_check=sql_name(events, "version_check"),
            writer=sql_name(m, "fsmc_writer"),
            limits=sql_name(m, "limits"),
            limits_pkey=sql_name(m, "limits", "pkey"),
            limits_holder=sql_name(m, "limits", "holder_key"),
            limits_free=sql_name(m, "limits", "free_idx"),
            count_limits=sql_name(m, "count_limits"),
            limits_insert=sql_name(m, "limits_insert"),
            limits_update=sql_name(m, "limits_update"),
            limits_delete=sql_name(m, "limits_delete"),
            limits_truncate=sql_name(m, "limits_truncate"),
            notify=sql_name(m, "notify"),
            notify_insert=sql_name(m, "notify_insert"),
            notify_update=sql_name(m, "notify_update"),
            claimable_in=sql_name(m, "claimable_in"),
        )

    @cached_property
    def sql(self) -> Quoted:
        """These names as SQL spells them: `n.sql.table`."""
        return Quoted(self)

    def movers(self, lease: bool) -> list[str]:
        """The functions that move rows (raw), in the order they are granted."""
        return [self.apply, self.claim] + ([self.heartbeat, self.reclaim] if lease else [])


class Quoted:
    """A view of `Names` with each name quoted by `sql_ident` (made once per name):
    `Quoted(n).table` is `sql_ident(n.table)`. For templates and model objects, whose
    text is SQL; it has the same attributes as `Names` and nothing else."""

    __slots__ = ("_sql",)

    def __init__(self, names: Names) -> None:
        self._sql = {f.name: sql_ident(getattr(names, f.name)) for f in fields(names)}

    def __getattr__(self, field: str) -> str:
        try:
            return self._sql[field]
        except KeyError:
            raise AttributeError(field) from None


def id_column(machine: Machine) -> str:
    """The event log's reference to the machine's row: `<machine>_id`."""
    return f"{machine.name}_id"


def count_column(event: str) -> str:
    """The column counting a capped event's firings: `<event>_count` (raw)."""
    return sql_name(event, "count")


def cap_column(event: str) -> str:
    """The column holding a row's own cap of an event capped per row (1.2): `<event>_cap` (raw)."""
    return sql_name(event, "cap")


def cap_check(machine: Machine, event: str) -> str:
    """The CHECK that keeps a row's own cap within 0..max (raw)."""
    return sql_name(str(machine.postgres.table), event, "cap_check")


def count_check(machine: Machine, event: str) -> str:
    """The CHECK that keeps a capped event's count within 0..cap (raw)."""
    return sql_name(str(machine.postgres.table), event, "count_check")


def domain_names(machine: Machine, states_hash: str, moves_hash: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """(domain, its CHECK) for the states domain and the moves domain, each named
    after a hash of its list (`encode.short_hash`)."""
    m = str(machine.name)
    return (
        (sql_name(m, "state", states_hash), sql_name(m, "state_check")),
        (sql_name(m, "moves", moves_hash), sql_name(m, "transition_check")),
    )


# The keywords PostgreSQL's quote_ident() quotes: every category but unreserved
# (`SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'` on 15; a test holds the
# two together on the test server). Not `escape.sql_ident`'s list, which quotes every
# keyword: harmless for naming an object, wrong for reproducing a hash over format('%I').
_QUOTED_KEYWORDS = frozenset(
    """
    all analyse analyze and any array as asc asymmetric authorization between bigint binary
    bit boolean both case cast char character check coalesce collate collation column
    concurrently constraint create cross current_catalog current_date current_role
    current_schema current_time current_timestamp current_user dec decimal default
    deferrable desc distinct do else end except exists extract false fetch float for
    foreign freeze from full grant greatest group grouping having ilike in initially inner
    inout int integer intersect interval into is isnull join lateral leading least left
    like limit localtime localtimestamp national natural nchar none normalize not notnull
    null nullif numeric offset on only or order out outer overlaps overlay placing position
    precision primary real references returning right row select session_user setof similar
    smallint some substring symmetric table tablesample then time timestamp to trailing
    treat trim true union unique user using values varchar variadic verbose when where
    window with xmlattributes xmlconcat xmlelement xmlexists xmlforest xmlnamespaces
    xmlparse xmlpi xmlroot xmlserialize xmltable
    """.split()
)
_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")
WRITER_HEAD_BYTES = 40  # the writer role's name: <schema>_<machine>, cut to this, then _writer_<hash>


def quote_ident(name: str) -> str:
    """PostgreSQL's quote_ident(): `name` bare when it is lower-case plain and no keyword
    quote_ident quotes, double-quoted otherwise."""
    if _PLAIN.fullmatch(name) and name not in _QUOTED_KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def writer_role(machine: str, database: str, schema: str) -> str:
    """The writer role the `.sql` file makes or asks for when installed into `schema`
    of `database` (templates/install.sql.j2, `prepare`, computes the same in SQL):
    `<schema>_<machine>` cut to 40 bytes, then `_writer_` and 10 hex digits of the
    sha256 of the three names as `format('%I.%I.%I')` writes them. So an administrator
    can make it before the install (`fsmc roles`)."""
    head = f"{schema}_{machine}"
    while len(head.encode()) > WRITER_HEAD_BYTES:
        head = head[:-1]
    qualified = ".".join(quote_ident(n) for n in (database, schema, machine))
    return f"{head}_writer_{hashlib.sha256(qualified.encode()).hexdigest()[:10]}"


WAKE_HEAD_BYTES = 40  # the wake-up channel's name: <machine> cut to this, then _wake_<hash>


def wake_channel_head(machine: str) -> str:
    """What every wake-up channel of `machine` starts with (`wake_channel`)."""
    return f"{machine.encode()[:WAKE_HEAD_BYTES].decode(errors='ignore')}_wake_"


def wake_channel(machine: str, schema: str) -> str:
    """The channel the installation of `machine` in `schema` sends its wake-ups on
    (`postgres.notify`): `<machine>` cut to 40 bytes, `_wake_`, and 10 hex digits of
    the sha256 of `<schema>.<machine>` (unambiguous: a machine's name has no dot).
    Notifications never leave their database, so the database is not in it (the
    writer role's name has it: roles are the cluster's). 56 bytes at most, within
    PostgreSQL's 63 for a channel; the trigger function computes the same in SQL
    (`wake_channel_sql`), and the generated module in Python."""
    digest = hashlib.sha256(f"{schema}.{machine}".encode()).hexdigest()[:10]
    return wake_channel_head(machine) + digest


def wake_channel_sql(machine: str, schema: str) -> str:
    """`wake_channel` as an SQL expression over `schema`, an SQL text expression (the
    trigger's TG_TABLE_SCHEMA, cast): the head is a literal, the hash is computed."""
    return (
        f"{sql_str(wake_channel_head(machine))} || pg_catalog.left(pg_catalog.encode(pg_catalog.sha256("
        f"pg_catalog.convert_to({schema} || {sql_str('.' + machine)}, 'UTF8')), 'hex'), 10)"
    )
