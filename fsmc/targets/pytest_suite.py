"""The pytest file (contract 4.4): the spec's table as its own literal data, and tests
that hold the generated module to it. It shares no code with the module, so an edit
to the module's table by hand makes it fail."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fsmc.facts import wake_sources
from fsmc.model import Machine
from fsmc.targets.common import ID_TYPES, Header, module_name
from fsmc.targets.postgres.build import Build, SuiteContext, suite_context
from fsmc.templating import as_variables, render


@dataclass(frozen=True)
class TestFileContext:
    """What templates/test_module.py.j2 fills in (its fields are its variables)."""

    __test__ = False  # not a test class, whatever pytest makes of the name

    header: Header
    machine: str
    module: str
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
    timers: list[tuple[str, str, str, int, float, int]]  # 1.2: (state, event, kind, ms, factor, max ms)
    limits: list[tuple[str, int]]  # 1.2: (state, the most rows it may hold)
    sample_id: str  # a Python expression
    sql: SuiteContext  # the database's side, SQLSTATEs included (`sql.codes`)
    # postgres.notify: (event, its sources where it fires at once, its timed sources)
    notified: list[tuple[str, list[str], list[str]]] = dataclasses.field(default_factory=list)


def emit(machine: Machine, pg: Build) -> str:
    m = machine
    return render("test_module.py.j2", **as_variables(TestFileContext(
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
        timers=[(s, e, t.kind, t.ms, t.factor, t.most_ms) for (s, e), t in m.timers.items()],
        limits=list(m.state_limits.items()),
        sample_id=ID_TYPES[m.postgres.id_type].sample,
        sql=suite_context(pg),
        notified=[(e, *wake_sources(m, e)) for e in m.notified],
    )))
