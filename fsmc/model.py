"""The machine model: what a spec means, as frozen data in document order.

`build` turns a loaded tree into a `Machine`. It trusts nothing: it takes every
part that has the right shape and skips the rest (the schema stage has already
reported what was skipped), so the rules can still check a spec with a schema
error elsewhere. Names stay `Text`, so every rule can point at the line and column
the author wrote. Nothing here reports diagnostics; nothing here raises for input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from fsmc.load import Document, Mapping, Pos, Sequence, Text

ID_TYPES = ("uuid", "bigint", "text")


@dataclass(frozen=True)
class Declaration:
    """A declared state or event."""

    name: Text
    description: str | None


@dataclass(frozen=True)
class Transition:
    """One (source, event) -> target edge; a `from` list gives one per source."""

    source: Text
    event: Text
    target: Text
    description: str | None
    index: int  # position in the spec's `transitions` list
    pos: Pos  # the transition's own node, for rules about the whole edge


@dataclass(frozen=True)
class Lease:
    states: tuple[Text, ...]
    reclaim: Text


@dataclass(frozen=True)
class Postgres:
    table: Text
    events_table: Text
    id_type: str
    given: frozenset[str] = frozenset()  # the options the spec wrote (others are defaults)


@dataclass(frozen=True)
class Machine:
    file: str  # as diagnostics name it
    path: str  # as generated headers record it
    sha256: str
    name: Text
    description: str | None
    initial: Text | None
    states: tuple[Declaration, ...]
    events: tuple[Declaration, ...]
    terminals: tuple[Text, ...]
    transitions: tuple[Transition, ...]
    lease: Lease | None
    postgres: Postgres

    @cached_property
    def state_names(self) -> tuple[str, ...]:
        return _unique(d.name for d in self.states)

    @cached_property
    def event_names(self) -> tuple[str, ...]:
        return _unique(d.name for d in self.events)

    @cached_property
    def terminal_names(self) -> frozenset[str]:
        return frozenset(self.terminals)

    @cached_property
    def table(self) -> dict[tuple[str, str], str]:
        """(state, event) -> state, first declaration winning (duplicates are errors)."""
        out: dict[tuple[str, str], str] = {}
        for t in self.transitions:
            out.setdefault((str(t.source), str(t.event)), str(t.target))
        return out

    @cached_property
    def edges(self) -> tuple[tuple[str, str, str], ...]:
        """The table as (from, event, to) triples, in spec order, without duplicates."""
        return tuple((s, e, t) for (s, e), t in self.table.items())

    @property
    def camel_name(self) -> str:
        return camel(self.name)


def camel(name: str) -> str:
    """`background_job` -> `BackgroundJob` (the dataclass the module defines)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _unique(names: Iterator[Text]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(n) for n in names))


def build(doc: Document) -> Machine:
    """The machine `doc` describes, from whatever parts of it are well-shaped."""
    root = doc.root if isinstance(doc.root, Mapping) else Mapping((1, 1))
    name = _name(root.get("machine")) or Text("machine", 1, 1)
    return Machine(
        file=doc.file,
        path=doc.path,
        sha256=doc.sha256,
        name=name,
        description=_text(root.get("description")),
        initial=_name(root.get("initial")),
        states=_declarations(root.get("states")),
        events=_declarations(root.get("events")),
        terminals=_names(root.get("terminals")),
        transitions=_transitions(root.get("transitions")),
        lease=_lease(root.get("lease")),
        postgres=_postgres(root.get("postgres"), name),
    )


def _name(value: Any) -> Text | None:
    return value if isinstance(value, Text) else None


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, str) else None


def _names(value: Any) -> tuple[Text, ...]:
    if not isinstance(value, Sequence):
        return ()
    return tuple(v for v in value if isinstance(v, Text))


def _declarations(value: Any) -> tuple[Declaration, ...]:
    if isinstance(value, Mapping):
        return tuple(Declaration(k, _text(v)) for k, v in value.items() if isinstance(k, Text))
    return tuple(Declaration(n, None) for n in _names(value))


def _transitions(value: Any) -> tuple[Transition, ...]:
    if not isinstance(value, Sequence):
        return ()
    out: list[Transition] = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            continue
        event, target = _name(item.get("event")), _name(item.get("to"))
        source = item.get("from")
        sources = (source,) if isinstance(source, Text) else _names(source)
        if event is None or target is None:
            continue
        for s in sources:
            out.append(
                Transition(s, event, target, _text(item.get("description")), index, item.pos)
            )
    return tuple(out)


def _lease(value: Any) -> Lease | None:
    if not isinstance(value, Mapping):
        return None
    reclaim = _name(value.get("reclaim"))
    states = _names(value.get("states"))
    if reclaim is None or not states:
        return None
    return Lease(states, reclaim)


def _postgres(value: Any, machine: Text) -> Postgres:
    options = value if isinstance(value, Mapping) else Mapping((1, 1))
    table = _name(options.get("table")) or Text(f"{machine}s", *machine.pos)
    events_table = _name(options.get("events_table")) or Text(f"{machine}_events", *machine.pos)
    id_type = options.get("id_type")
    given = frozenset(k for k in ("table", "events_table", "id_type") if _name(options.get(k)))
    return Postgres(table, events_table, id_type if id_type in ID_TYPES else "uuid", given)
