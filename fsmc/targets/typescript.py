"""The TypeScript module and its node:test suite (`fsmc build --typescript`): the
Python module's design (contract 4.1) for Node workers on the same tables.

`fsm_<machine>.ts` holds the states and events as string-literal unions beside
frozen value objects, the read-only tables, `apply`, the row class with its cap
counts, and async calls of the database functions over a node-postgres client or pool.
It imports nothing, not even types: its `Connection` is the one method of `pg` it
calls, so `pg.Client`, `pg.Pool` and `pg.PoolClient` fit it structurally.
`fsm_<machine>.test.ts` holds the spec's table as its own data (as the pytest file
does) and checks the module against it, and the database half when FSMC_PG_DSN is set.

The option is off by default: the files of contract 4 stay the whole default output.
`problems` says what the TypeScript target cannot generate for a machine that is
otherwise fine (a class name that would hide a global the module uses).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeVar

from fsmc import columns
from fsmc import diagnostics as codes
from fsmc.diagnostics import Diagnostic
from fsmc.escape import ts_str
from fsmc.model import DeclaredColumn, Machine
from fsmc.targets.common import ID_TYPES, Header, module_name
from fsmc.targets.postgres.build import Build, SuiteContext, suite_context
from fsmc.targets.postgres.names import Names, cap_column, count_column
from fsmc.targets.pytest_suite import SpecTable, spec_table
from fsmc.targets.sqlstate import Codes
from fsmc.templating import as_variables, render

# The globals the generated module and suite refer to, and the CamelCase names the
# module defines beside the Python module's (`validate.RESERVED_CAMEL`): a machine
# whose class had one of these names would hide it (`machine: date` makes `class
# Date`, and every timestamp field would have that type). A test reads the generated
# files and holds this list to every capitalised name they use.
RESERVED_CAMEL = frozenset(
    {"Array", "Date", "Error", "Iterable", "JSON", "Map", "Number", "Object", "Omit", "Promise",
     "RangeError", "Readonly", "ReadonlyMap", "Row", "Set", "Statements", "String",
     "TypeError", "Uint8Array"}
)  # fmt: skip
# A property the row class cannot have: a class field named `constructor` is an error.
RESERVED_FIELDS = frozenset({"constructor"})


def problems(machine: Machine) -> list[Diagnostic]:
    """What keeps the TypeScript target from generating `machine` (a checked one)."""
    m = machine
    found = []
    if m.camel_name in RESERVED_CAMEL:
        found.append(Diagnostic(
            m.file, m.name.line, m.name.col, codes.BAD_NAME,
            f"machine name '{m.name}' cannot be used with --typescript: its class name "
            f"'{m.camel_name}' would hide JavaScript's {m.camel_name} in {module_name(m.name)}.ts",
        ))  # fmt: skip
    for c in m.postgres.columns:
        if c.name in RESERVED_FIELDS:
            found.append(Diagnostic(
                m.file, c.name.line, c.name.col, codes.BAD_COLUMN,
                f"postgres.columns: '{c.name}' cannot be used with --typescript: a class "
                "cannot have a field of that name",
            ))  # fmt: skip
    return found


@dataclass(frozen=True)
class TsType:
    """How the module types, reads and sends a column of one declared type."""

    annotation: str  # the row field's type, without null
    given: str  # what create() and claim() accept for it
    as_text: bool  # read as `::pg_catalog.text`: exact whatever node-postgres's parsers are
    read: str  # the expression of a non-NULL value read as `{v}`


V = TypeVar("V")

# One entry a type of `fsmc.columns.TYPES` (a test holds the keys to its keys).
TS_TYPES: dict[str, TsType] = {
    "text": TsType("string", "string", False, "{v} as string"),
    "jsonb": TsType("unknown", "unknown", True, "JSON.parse({v} as string) as unknown"),
    "boolean": TsType("boolean", "boolean", True, '{v} === "true"'),
    "smallint": TsType("number", "number", False, "Number({v})"),
    "integer": TsType("number", "number", False, "Number({v})"),
    # int8 and numeric as their decimal digits (node-postgres's own choice): exact.
    "bigint": TsType("string", "string | number | bigint", True, "{v} as string"),
    "double precision": TsType("number", "number", True, "Number({v})"),
    "numeric": TsType("string", "string | number", True, "{v} as string"),
    "timestamptz": TsType("Date", "Date", False, "time({v}) as Date"),
    # A date as 'YYYY-MM-DD': a Date would be midnight in the process's time zone.
    "date": TsType("string", "string", True, "{v} as string"),
    "uuid": TsType("string", "string", False, "{v} as string"),
    "bytea": TsType("Uint8Array", "Uint8Array", False, "{v} as Uint8Array"),
}
assert TS_TYPES.keys() == columns.TYPES.keys()


@dataclass(frozen=True)
class Field:
    """A property of the row class after id, state and version."""

    name: str
    annotation: str  # its type, `| null` included
    default: str  # a TypeScript expression
    read: str  # the expression that reads it from a result row `r`
    carried: bool  # apply() keeps it (data, counts, caps, created_at); else None on a move


@dataclass(frozen=True)
class Given:
    """A key create() takes (beside id and state) or a column claim() may be limited to."""

    name: str
    annotation: str
    cast: str
    json: bool  # sent as JSON text, cast to jsonb in SQL


@dataclass(frozen=True)
class Cap:
    event: str
    count: str  # the count field
    cap: int  # the cap, or a per-row cap's default
    own: str  # the row's own cap field ("" for a fixed cap)
    most: int  # the largest own cap (0 for a fixed cap)


@dataclass(frozen=True)
class ModuleContext:
    """What templates/module.ts.j2 fills in (its fields are its variables)."""

    header: Header
    machine: str
    class_name: str
    description: str | None
    states: list[tuple[str, str, str | None]]  # (member, name, description)
    events: list[tuple[str, str, str | None]]
    initial: str
    initials: list[str]
    terminals: list[str]
    purgeable: list[str]
    table: list[tuple[str, list[tuple[str, str]]]]  # state -> [(event, target)]
    choices: list[tuple[str, list[tuple[str, list[str]]]]]  # state -> [(event, targets)]
    targets: list[tuple[str, list[tuple[str, list[str]]]]]  # both: every legal `to`
    available: list[tuple[str, list[str]]]  # state -> its events in spec order
    caps: list[Cap]
    otherwise: list[tuple[str, list[tuple[str, str, str]]]]  # state -> [(event, target, budget)]
    resets: list[tuple[str, list[tuple[str, list[str]]]]]  # state -> [(event, events)]
    limits: list[tuple[str, int]]
    timed: bool
    due_given: bool
    id_arg: str  # the TypeScript type an id is given as
    pg_id_type: str
    id_given: bool  # create() may give a new row its id (`common.ID_TYPES`' `given`)
    schema: str
    codes: Codes
    sql_table: str
    apply_function: str
    claim_function: str
    purge_function: str
    heartbeat_function: str
    reclaim_function: str
    select: str  # what get(), claim() and create() read of a row, each column as `r` names it
    fields: list[Field]
    inserted: list[Given]  # what create() may give, beside id and state, in INSERT order
    claim_by: list[Given]
    lease: bool
    reclaim_event: str


def _by_state(pairs: dict[tuple[str, str], V], states: tuple[str, ...]) -> list[tuple[str, list[tuple[str, V]]]]:
    """(state, [(event, value)]) in state order, then in the pairs' order."""
    out: list[tuple[str, list[tuple[str, V]]]] = []
    for s in states:
        row = [(e, v) for (source, e), v in pairs.items() if source == s]
        if row:
            out.append((s, row))
    return out


def context(machine: Machine) -> ModuleContext:
    m = machine
    names = Names.of(m).sql
    descriptions = {str(d.name): d.description for d in m.states}
    event_descriptions = {str(d.name): d.description for d in m.events}
    states = m.state_names
    targets: dict[tuple[str, str], list[str]] = {}
    for (s, e), t in m.single.items():
        targets[s, e] = [t]
    for (s, e), ts in m.choices.items():
        targets[s, e] = list(ts)
    targets = {k: targets[k] for k in sorted(targets, key=lambda k: (states.index(k[0]), m.event_names.index(k[1])))}
    caps = [Cap(e, count_column(e), cap, cap_column(e) if e in m.per_row_caps else "", m.per_row_caps.get(e, 0))
            for e, cap in m.cap_limits.items()]  # fmt: skip
    return ModuleContext(
        header=Header.of(m),
        machine=str(m.name),
        class_name=m.camel_name,
        description=m.description,
        states=[(s.upper(), s, descriptions.get(s)) for s in states],
        events=[(e.upper(), e, event_descriptions.get(e)) for e in m.event_names],
        initial=str(m.initial),
        initials=list(m.initial_names),
        terminals=list(m.terminals_in_order),
        purgeable=list(m.purgeable_names),
        table=_by_state(dict(m.single), states),
        choices=_by_state({k: list(v) for k, v in m.choices.items()}, states),
        targets=_by_state(dict(targets), states),
        available=[(s, [e for e in m.event_names if (s, e) in targets]) for s in states],
        caps=caps,
        otherwise=[(s, [(e, to, budget) for e, (to, budget) in row])
                   for s, row in _by_state(dict(m.otherwise), states)],  # fmt: skip
        resets=_by_state({k: list(v) for k, v in m.resets.items()}, states),
        limits=list(m.state_limits.items()),
        timed=bool(m.timers),
        due_given=any(t.kind == "due_at" for t in m.timers.values()),
        id_arg="string | number | bigint" if m.postgres.id_type == "bigint" else "string",
        pg_id_type=ID_TYPES[m.postgres.id_type].cast,
        id_given=ID_TYPES[m.postgres.id_type].given,
        schema=m.postgres.schema,
        codes=Codes(),
        sql_table=names.table,
        apply_function=names.apply,
        claim_function=names.claim,
        purge_function=names.purge,
        heartbeat_function=names.heartbeat,
        reclaim_function=names.reclaim,
        select=select_list(m),
        fields=fields(m, caps),
        inserted=inserted(m),
        claim_by=[g for g in inserted(m) if g.name in m.postgres.claim_by],
        lease=m.lease is not None,
        reclaim_event=str(m.lease.reclaim) if m.lease is not None else "",
    )


def _text(column: str) -> str:
    return f"{column}::pg_catalog.text AS {column}"


def select_list(m: Machine) -> str:
    """The columns of a row as the module reads them: the id, the version and every
    column node-postgres would parse into something inexact (int8, numeric, a date in
    the process's zone) or configurable (jsonb) come as text, which the module parses."""
    out = [_text("id"), "state", _text("state_version")]
    out += [count_column(e) for e in m.cap_limits]
    out += [cap_column(e) for e in m.per_row_caps]
    out += [_text(str(c.name)) if TS_TYPES[c.type].as_text else str(c.name) for c in m.postgres.columns]
    out += ["created_at", "entered_at"]
    if m.lease is not None:
        out += ["claimed_by", "claimed_at", "heartbeat_at"]
    if m.timers:
        out.append("due_at")
    return ", ".join(out)


def _nullable(c: DeclaredColumn) -> bool:
    return c.nullable and c.type != "jsonb"  # `unknown` holds null already


def _data_field(c: DeclaredColumn) -> Field:
    kind = TS_TYPES[c.type]
    value = f'r["{c.name}"]'
    read = kind.read.format(v=value)
    if c.nullable:
        read = f"{value} === null ? null : {read}"
    return Field(str(c.name), kind.annotation + (" | null" if _nullable(c) else ""), _default(c), read, True)


def _default(c: DeclaredColumn) -> str:
    """The TypeScript expression of a declared column's default (null without one)."""
    if not c.has_default or c.default is None:
        return "null"
    kind = columns.TYPES[c.type]
    if kind.default_kind == "json":  # a fresh value for each row, as a mutable default must be
        return f"JSON.parse({ts_str(json.dumps(c.default, sort_keys=True, ensure_ascii=False))}) as unknown"
    if kind.default_kind == "bool":
        return "true" if c.default else "false"
    if TS_TYPES[c.type].annotation == "string":  # text, and int8 and numeric as digits
        value = c.default
        return ts_str(repr(value) if isinstance(value, float) else str(value))
    if kind.default_kind == "number":
        return repr(float(c.default))  # type: ignore[arg-type]
    return str(c.default)


def fields(m: Machine, caps: list[Cap]) -> list[Field]:
    out = [Field(cap.count, "number", "0", f'Number(r["{cap.count}"])', True) for cap in caps]
    out += [Field(cap.own, "number", str(cap.cap), f'Number(r["{cap.own}"])', True) for cap in caps if cap.own]
    out += [_data_field(c) for c in m.postgres.columns]

    def stamp(name: str, annotation: str = "Date", carried: bool = False) -> Field:
        read = f'time(r["{name}"])' if annotation == "Date" else f'r["{name}"] as {annotation} | null'
        return Field(name, annotation + " | null", "null", read, carried)

    out.append(stamp("created_at", carried=True))
    out.append(stamp("entered_at"))
    if m.lease is not None:
        out += [stamp("claimed_by", "string"), stamp("claimed_at"), stamp("heartbeat_at")]
    if m.timers:
        out.append(stamp("due_at"))
    return out


def inserted(m: Machine) -> list[Given]:
    """What create() may give a new row beside its id and state, as the Python
    module's `insert_fields`: a row's own caps, its due time, its data."""
    out = [Given(cap_column(e), "number", "pg_catalog.int4", False) for e in m.per_row_caps]
    if any(t.kind == "due_at" for t in m.timers.values()):
        out.append(Given("due_at", "Date", "pg_catalog.timestamptz", False))
    for c in m.postgres.columns:
        kind = TS_TYPES[c.type]
        annotation = kind.given + (" | null" if _nullable(c) else "")
        out.append(Given(str(c.name), annotation, columns.TYPES[c.type].cast, c.type == "jsonb"))
    return out


def emit(machine: Machine) -> str:
    return render("module.ts.j2", **as_variables(context(machine)))


# --- the node:test suite ----------------------------------------------------------------


@dataclass(frozen=True)
class TestFileContext(SpecTable):
    """What templates/test_module.ts.j2 fills in (its fields are its variables)."""

    timers: list[tuple[str, str, str]]  # (state, event, kind)
    sample_id: str  # a TypeScript expression
    no_such_id: str  # one no row has
    sql: SuiteContext


# id_type -> (an id for a row the tests make by hand, an id no row has)
SAMPLE_IDS = {
    "uuid": ("00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-00000000ffff"),
    "bigint": ("1", "9007199254740993"),  # past 2**53: an id read as a number would be another
    "text": ("id-1", "no such id"),
}


def emit_tests(machine: Machine, pg: Build) -> str:
    m = machine
    return render("test_module.ts.j2", **as_variables(TestFileContext(
        **spec_table(m),  # type: ignore[arg-type]
        timers=[(s, e, t.kind) for (s, e), t in m.timers.items()],
        sample_id=ts_str(SAMPLE_IDS[m.postgres.id_type][0]),
        no_such_id=ts_str(SAMPLE_IDS[m.postgres.id_type][1]),
        sql=suite_context(pg),
    )))
