"""The review README: the diagram and the tables of states, events and transitions
(wildcards expanded, a choice as its targets), and the caps, as GitHub renders them. Every spec text goes through the Markdown escaper, so a
description cannot add a row, a heading or HTML."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fsmc.facts import wake_sources
from fsmc.model import Lease, Machine
from fsmc.targets.common import Header, Paths
from fsmc.targets.postgres.build import Build, declared_column
from fsmc.targets.postgres.install import app_grants
from fsmc.targets.postgres.names import wake_channel
from fsmc.templating import as_variables, render


@dataclass(frozen=True)
class ReadmeContext:
    """What templates/README.md.j2 fills in (its fields are its variables)."""

    header: Header
    machine: str
    description: str
    diagram: str
    states: list[tuple[str, str, str]]  # (state, notes, description)
    events: list[tuple[str, str]]  # (event, description)
    transitions: list[tuple[str, str, str, str]]  # (from, event, targets, description)
    choices: bool
    never_ends: bool
    caps: list[tuple[str, str]]  # (event, its cap as the table says it)
    lease: Lease | None
    columns: list[tuple[str, str, str]]  # 1.2: (name, type as declared, what a claim does with it)
    files: list[str]
    schema: str
    grants: list[str]
    sql_file: str
    test_file: str
    # postgres.notify: (event, the states whose entry wakes its workers), and the channel
    # of the installation in `schema`
    wakes: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    channel: str = ""


def _declared(m: Machine) -> list[tuple[str, str]]:
    """Each declared column and its type as the table declares it (`fsmc.columns`)."""
    return [(str(c.name), declared_column(c).declaration) for c in m.postgres.columns]


def _claims_by(m: Machine, name: str) -> str:
    notes = []
    if name in m.postgres.claim_by:
        notes.append("a claim may be limited to a value of it")
    if name == m.postgres.claim_order:
        notes.append("a claim takes the lowest first")
    return "; ".join(notes)


def _goes_to(m: Machine, source: str, event: str) -> str:
    """A transition's `to` as a reviewer reads it: its targets, and (1.2) when time
    allows it, where a spent budget sends the row instead, the budgets it gives back."""
    text = " or ".join(f"`{x}`" for x in m.targets[source, event])
    if (source, event) in m.timers:
        when = m.timers[source, event].describe()
        text += "; at the row's `due_at`" if when == "due_at" else f"; after {when}"
    if (source, event) in m.otherwise:
        to, budget = m.otherwise[source, event]
        text += f"; `{to}` once `{budget}`'s budget is spent"
    if (source, event) in m.resets:
        text += "; gives back " + ", ".join(f"`{e}`" for e in m.resets[source, event]) + "'s budget"
    return text


def emit(machine: Machine, diagram: str, pg: Build) -> str:
    m = machine
    paths = Paths.of(m)
    states = []
    for d in m.states:
        notes = []
        if d.name in m.initial_names:
            notes.append("initial" if len(m.initial_names) == 1 or d.name != m.initial else "initial, the default")
        if d.name in m.purgeable_names and m.purgeable is not None:
            notes.append("purgeable")
        if d.name in m.terminal_names:
            notes.append("terminal")
        if m.lease and d.name in m.lease.states:
            notes.append("lease")
        if d.name in m.state_limits:
            notes.append(f"at most {m.state_limits[d.name]} rows")
        states.append((str(d.name), ", ".join(notes), d.description or ""))
    return render("README.md.j2", **as_variables(ReadmeContext(
        header=Header.of(m),
        machine=str(m.name),
        description=m.description or "",
        diagram=diagram,
        states=states,
        events=[(str(d.name), d.description or "") for d in m.events],
        transitions=[(s, e, _goes_to(m, s, e), t.description or "") for (s, e), t in m.first.items()],
        choices=bool(m.choices),
        never_ends=not m.terminals,
        caps=[(e, f"{cap} per row, at most {m.per_row_caps[e]}" if e in m.per_row_caps else str(cap))
              for e, cap in m.cap_limits.items()],  # fmt: skip
        lease=m.lease,
        columns=[(name, column_type, _claims_by(m, name)) for name, column_type in _declared(m)],
        files=[p.split("/", 1)[1] for p in (paths.module, paths.sql, paths.mermaid, paths.tests)],
        schema=m.postgres.schema,
        grants=app_grants(pg.install, m.postgres.schema, "app_worker"),
        sql_file=paths.sql.split("/", 1)[1],
        test_file=paths.tests.split("/", 1)[1],
        wakes=[(e, ", ".join(f"`{s}`" for part in wake_sources(m, e) for s in part)) for e in m.notified],
        channel=wake_channel(str(m.name), m.postgres.schema) if m.notified else "",
    )))
