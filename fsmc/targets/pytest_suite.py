"""The pytest file (contract 4.4): the spec's table as its own literal data, and tests
that hold the generated module to it. It shares no code with the module, so an edit
to the module's table by hand makes it fail."""

from __future__ import annotations

from fsmc.model import Machine
from fsmc.targets import python, sqlstate
from fsmc.targets.common import header_context, module_name
from fsmc.targets.postgres.build import Build, suite_context
from fsmc.templating import render


def emit(machine: Machine, pg: Build) -> str:
    m = machine
    return render(
        "test_module.py.j2",
        **header_context(m),
        machine=str(m.name),
        module=module_name(m.name),
        class_name=m.camel_name,
        states=list(m.state_names),
        events=list(m.event_names),
        initial=str(m.initial),
        terminals=list(m.terminals_in_order),
        transitions=[(s, e, t) for (s, e), t in m.single.items()],
        choices=[(s, e, sorted(ts)) for (s, e), ts in m.choices.items()],
        caps=list(m.cap_limits.items()),
        sample_id=python.SAMPLE_IDS[m.postgres.id_type],
        uses_uuid=m.postgres.id_type == "uuid",
        sql=suite_context(pg),
        cap_sqlstate=sqlstate.CAP_REACHED,
    )
