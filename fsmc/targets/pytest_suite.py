"""The pytest file (contract 4.4): the spec's table as its own literal data, and tests
that hold the generated module to it. It shares no code with the module, so an edit
to the module's table by hand makes it fail."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fsmc import columns
from fsmc.escape import py_str
from fsmc.facts import wake_sources
from fsmc.model import DeclaredColumn, Machine
from fsmc.targets.common import ID_TYPES, Header, module_name
from fsmc.targets.postgres.build import Build, SuiteContext, suite_context
from fsmc.templating import as_variables, render


@dataclass(frozen=True)
class SpecTable:
    """The spec's table as a generated suite holds it, literal data of its own: what the
    pytest file and the TypeScript suite (`fsmc.targets.typescript`) both fill in."""

    __test__ = False  # not a test class, whatever pytest makes of the name

    header: Header
    machine: str
    module: str  # the module's file name, without its extension
    class_name: str
    states: list[str]
    events: list[str]
    initial: str
    initials: list[str]
    terminals: list[str]
    purgeable: list[str]
    transitions: list[tuple[str, str, str]]
    choices: list[tuple[str, str, list[str]]]
    caps: list[tuple[str, int]]
    otherwise: list[tuple[str, str, str, str]]  # 1.2: (state, event, otherwise, the budget's event)
    resets: list[tuple[str, str, list[str]]]  # 1.2: (state, event, the events whose budgets come back)
    per_row: list[tuple[str, int]]  # 1.2: (event, the largest cap a row may have)
    limits: list[tuple[str, int]]  # 1.2: (state, the most rows it may hold)


def spec_table(m: Machine) -> dict[str, object]:
    """`SpecTable`'s fields for `m`, to fill a suite's context with."""
    return dict(
        header=Header.of(m),
        machine=str(m.name),
        module=module_name(m.name),
        class_name=m.camel_name,
        states=list(m.state_names),
        events=list(m.event_names),
        initial=str(m.initial),
        initials=list(m.initial_names),
        terminals=list(m.terminals_in_order),
        purgeable=list(m.purgeable_names),
        transitions=[(s, e, t) for (s, e), t in m.single.items()],
        choices=[(s, e, sorted(ts)) for (s, e), ts in m.choices.items()],
        caps=list(m.cap_limits.items()),
        otherwise=[(s, e, to, budget) for (s, e), (to, budget) in m.otherwise.items()],
        resets=[(s, e, list(events)) for (s, e), events in m.resets.items()],
        per_row=list(m.per_row_caps.items()),
        limits=list(m.state_limits.items()),
    )


@dataclass(frozen=True)
class TestFileContext(SpecTable):
    """What templates/test_module.py.j2 fills in (its fields are its variables)."""

    timers: list[tuple[str, str, str, int, float, int]]  # 1.2: (state, event, kind, ms, factor, max ms)
    # 1.2: the row's own data: (column, its default as Python, None for NULL; a value
    # of its type to give it, not its default), in spec order
    columns: list[tuple[str, str, str]]
    uses_decimal: bool  # a numeric column: its values are decimal.Decimal
    sample_id: str  # a Python expression
    sql: SuiteContext  # the database's side, SQLSTATEs included (`sql.codes`)
    # postgres.notify: (event, its sources where it fires at once, its timed sources)
    notified: list[tuple[str, list[str], list[str]]] = dataclasses.field(default_factory=list)


def emit(machine: Machine, pg: Build) -> str:
    m = machine
    return render("test_module.py.j2", **as_variables(TestFileContext(
        **spec_table(m),  # type: ignore[arg-type]
        timers=[(s, e, t.kind, t.ms, t.factor, t.most_ms) for (s, e), t in m.timers.items()],
        columns=[(str(c.name), default_of(c), given_for(c, i)) for i, c in enumerate(m.postgres.columns)],
        uses_decimal=any(columns.TYPES[c.type].python == "decimal.Decimal" for c in m.postgres.columns),
        sample_id=ID_TYPES[m.postgres.id_type].sample,
        sql=suite_context(pg),
        notified=[(e, *wake_sources(m, e)) for e in m.notified],
    )))



def default_of(c: DeclaredColumn) -> str:
    """A declared column's default as the generated test expects it read back."""
    if not c.has_default or c.default is None:
        return "None"
    return columns.python_default(columns.TYPES[c.type], c.default)


def given_for(c: DeclaredColumn, index: int) -> str:
    """A value of the column's type, as Python writes it, that is neither its default
    nor any other column's value (`index`: its place among the declared columns, of
    which a spec has at most 100), so a value read back can only be the one given."""
    n, name = 7 + index, str(c.name)
    first, second = {
        "text": (py_str(f"{name} é"), py_str(f"{name} ü")),
        "jsonb": (repr({name: [n, "two", None]}), repr([name])),
        "boolean": ("True", "False"),
        "smallint": (str(n), str(-n)),
        "integer": (str(n), str(-n)),
        "bigint": (str(n), str(-n)),
        "double precision": (repr(n + 0.5), repr(-n - 0.5)),
        "numeric": (f'decimal.Decimal("{n}.5")', f'decimal.Decimal("-{n}.5")'),
        # No default can be written for these: the first is never one.
        "timestamptz": (f"datetime.datetime({2000 + n}, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)", ""),
        "date": (f"datetime.date({2000 + n}, 1, 2)", ""),
        "uuid": (f"uuid.UUID(int={n})", ""),
        "bytea": (f'b"\\x00{name}\\xff"', ""),
    }[c.type]
    return second if first == default_of(c) else first
