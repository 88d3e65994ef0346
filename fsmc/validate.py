"""Validate: the rules of the spec language, one function per diagnostic code.

`validate(machine)` runs every rule and returns all diagnostics (unsorted; the
printer sorts). Reference rules run first; the graph rules run only on a machine
whose names all resolve, so one misspelt state is one diagnostic, not five.
Each rule points at the node at fault: the misspelt name, the second declaration,
the transition that breaks the rule, or (for rules about a state) its declaration.
"""

from __future__ import annotations

import builtins
import difflib
import keyword
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fsmc.diagnostics import Diagnostic
from fsmc.load import Text
from fsmc.model import Machine, camel

NAME = re.compile(r"[a-z][a-z0-9_]*")
NAME_MAX = 48
TABLE = re.compile(r"[a-z_][a-z0-9_]*")
TABLE_MAX = 63
# The names the generated module (templates/module.py.j2) defines that a CamelCase
# class name could be: a machine's class must not replace one. A test parses a
# generated module and holds this list to it.
RESERVED_CAMEL = frozenset(
    {"State", "Event", "IllegalTransition", "Connection", "AsyncConnection", "UnknownRow",
     "INITIAL", "TERMINAL", "TRANSITIONS", "ILLEGAL_TRANSITION_SQLSTATE", "UNKNOWN_ROW_SQLSTATE"}
)  # fmt: skip
# Built-ins a class of that name would shadow in the module, which catches KeyError,
# raises ValueError and subclasses Exception (`machine: key_error` broke apply()).
BUILTIN_CAMEL = frozenset(n for n in dir(builtins) if n[:1].isupper())

# A suggestion compares a name with every declared one. Past this many comparisons
# per rule the rest of the unknown names get none: thousands of typos among
# thousands of states cost seconds, not hours (it was quadratic).
SUGGESTION_BUDGET = 50_000

Rule = Callable[[Machine], Iterator[Diagnostic]]
GraphRule = Callable[[Machine, Any], Iterator[Diagnostic]]


def _at(m: Machine, where: Text | tuple[int, int], code: str, message: str) -> Diagnostic:
    line, col = where.pos if isinstance(where, Text) else where
    return Diagnostic(m.file, line, col, code, message)


def _where(first: Text, again: Text) -> str:
    if first.line == again.line:
        return f"line {first.line}, column {first.col}"
    return f"line {first.line}"


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def bad_name(m: Machine) -> Iterator[Diagnostic]:
    name = m.name
    problem = _name_problem(name, NAME, NAME_MAX)
    if problem is None:
        problem = _machine_name_problem(name)
    if problem:
        yield _at(m, name, "bad-name", f"machine name '{name}' {problem}")
    for kind, decls in (("state", m.states), ("event", m.events)):
        for d in decls:
            problem = _name_problem(d.name, NAME, NAME_MAX)
            if problem:
                yield _at(m, d.name, "bad-name", f"{kind} name '{d.name}' {problem}")
    for key, table in (("table", m.postgres.table), ("events_table", m.postgres.events_table)):
        if key not in m.postgres.given:
            continue  # derived from the machine name, whose own diagnostic says it all
        problem = _name_problem(table, TABLE, TABLE_MAX)
        if problem:
            yield _at(m, table, "bad-name", f"postgres.{key} '{table}' {problem}")
    if m.postgres.table == m.postgres.events_table:
        yield _at(
            m, m.postgres.events_table, "bad-name",
            f"postgres.events_table '{m.postgres.events_table}' is the same as postgres.table",
        )  # fmt: skip


def _machine_name_problem(name: str) -> str | None:
    """Why a well-formed machine name still cannot name a generated module's class."""
    cls = camel(name)
    if keyword.iskeyword(name) or keyword.iskeyword(cls):
        return f"cannot be used: '{name}' or its class name '{cls}' is a Python keyword"
    if cls in RESERVED_CAMEL:
        return f"cannot be used: its class name '{cls}' collides with the generated module's own {cls}"
    if cls in BUILTIN_CAMEL:
        return (
            f"cannot be used: its class name '{cls}' would shadow Python's built-in {cls} "
            "in the generated module"
        )
    return None


def _name_problem(name: str, pattern: re.Pattern[str], limit: int) -> str | None:
    if not pattern.fullmatch(name):
        first = "a letter" if pattern is NAME else "a letter or _"
        return (
            f"must match {pattern.pattern} (lower-case letters, digits and _, "
            f"starting with {first})"
        )
    if len(name) > limit:
        return f"is {len(name)} characters long; the limit is {limit}"
    return None


def duplicate_name(m: Machine) -> Iterator[Diagnostic]:
    lists: list[tuple[str, Iterable[Text]]] = [
        ("state", (d.name for d in m.states)),
        ("event", (d.name for d in m.events)),
        ("terminal", m.terminals),
    ]
    if m.lease:
        lists.append(("lease state", m.lease.states))
    for kind, names in lists:
        first: dict[str, Text] = {}
        for name in names:
            if name in first:
                yield _at(
                    m, name, "duplicate-name",
                    f"{kind} '{name}' is declared twice (first at {_where(first[name], name)})",
                )  # fmt: skip
            else:
                first[name] = name


def unknown_state(m: Machine) -> Iterator[Diagnostic]:
    if not m.states:
        return  # `states` is missing or misshapen: the schema error is the one cause
    declared = m.state_names
    refs: list[tuple[str | tuple[int, str], Text]] = []
    if m.initial is not None:
        refs.append(("initial", m.initial))
    refs += [("terminals", t) for t in m.terminals]
    if m.lease:
        refs += [("lease.states", s) for s in m.lease.states]
    for t in m.transitions:
        refs += [((t.index, "from"), t.source), ((t.index, "to"), t.target)]
    yield from _unknown(m, refs, declared, "unknown-state", "state")


def unknown_event(m: Machine) -> Iterator[Diagnostic]:
    if not m.events:
        return  # `events` is missing or misshapen: the schema error is the one cause
    refs: list[tuple[str | tuple[int, str], Text]] = [
        ((t.index, "event"), t.event) for t in m.transitions
    ]
    if m.lease:
        refs.append(("lease.reclaim", m.lease.reclaim))
    yield from _unknown(m, refs, m.event_names, "unknown-event", "event")


def _unknown(
    m: Machine,
    refs: list[tuple[str | tuple[int, str], Text]],
    declared: tuple[str, ...],
    code: str,
    kind: str,
) -> Iterator[Diagnostic]:
    known = set(declared)
    seen: set[tuple[int, int]] = set()
    budget = SUGGESTION_BUDGET
    for where, name in refs:
        # A `from` list yields one transition per source, all sharing the written `to`
        # and `event`: report each written name once.
        if name in known or name.pos in seen:
            continue
        seen.add(name.pos)
        path = where if isinstance(where, str) else f"transitions[{where[0]}].{where[1]}"
        hint = ""
        if budget >= len(declared):
            budget -= len(declared)
            hint = _did_you_mean(name, declared)
        yield _at(m, name, code, f"{path}: '{name}' is not a declared {kind}{hint}")


def duplicate_transition(m: Machine) -> Iterator[Diagnostic]:
    first: dict[tuple[str, str], int] = {}
    for t in m.transitions:
        key = (str(t.source), str(t.event))
        if key in first:
            yield _at(
                m, t.source, "duplicate-transition",
                f"transitions[{t.index}]: ({t.source}, {t.event}) is already declared by "
                f"transitions[{first[key]}]; the machine must be deterministic",
            )  # fmt: skip
        else:
            first[key] = t.index


def terminal_exit(m: Machine) -> Iterator[Diagnostic]:
    terminals = m.terminal_names
    for t in m.transitions:
        if t.source in terminals:
            yield _at(
                m, t.source, "terminal-exit",
                f"transitions[{t.index}]: terminal state '{t.source}' has an outgoing "
                f"transition on '{t.event}' (to '{t.target}')",
            )  # fmt: skip


def graph_of(m: Machine) -> Any:
    """The machine as a networkx DiGraph of states (networkx is untyped)."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(m.state_names)
    g.add_edges_from((s, t) for s, _, t in m.edges)
    return g


def unreachable_state(m: Machine, g: Any) -> Iterator[Diagnostic]:
    import networkx as nx

    if m.initial is None:
        return
    reached = nx.descendants(g, str(m.initial)) | {str(m.initial)}
    for d in _first_declarations(m):
        if d not in reached:
            yield _at(
                m, d, "unreachable-state",
                f"state '{d}' cannot be reached from the initial state '{m.initial}'",
            )  # fmt: skip


def dead_end(m: Machine, g: Any) -> Iterator[Diagnostic]:
    sources = {s for s, _, _ in m.edges}
    for d in _first_declarations(m):
        if d not in m.terminal_names and d not in sources:
            yield _at(
                m, d, "dead-end",
                f"state '{d}' is not terminal but has no outgoing transition; "
                "add one, or list it in terminals",
            )  # fmt: skip


def trap(m: Machine, g: Any) -> Iterator[Diagnostic]:
    import networkx as nx

    # Everything that can reach a terminal: one reverse search from all terminals.
    reverse = g.reverse(copy=False)
    terminals = set(m.terminal_names)  # networkx refuses an empty set of sources
    escapes = set(nx.multi_source_dijkstra_path_length(reverse, terminals)) if terminals else set()
    sources = {s for s, _, _ in m.edges}
    for d in _first_declarations(m):
        # A state with no way out at all is a dead-end; saying "trap" too adds nothing.
        if d not in escapes and d in sources:
            yield _at(
                m, d, "trap",
                f"state '{d}' cannot reach any terminal state "
                f"({', '.join(sorted(m.terminal_names)) or 'none declared'}); "
                "every path from it cycles forever",
            )  # fmt: skip


def lease_reclaim(m: Machine, g: Any) -> Iterator[Diagnostic]:
    if m.lease is None:
        return
    for state in m.lease.states:
        if (str(state), str(m.lease.reclaim)) not in m.table:
            yield _at(
                m, state, "lease-reclaim",
                f"lease state '{state}' has no transition on the reclaim event "
                f"'{m.lease.reclaim}', so a stale worker's job could never be reclaimed",
            )  # fmt: skip


def unused_event(m: Machine, g: Any) -> Iterator[Diagnostic]:
    used = {e for _, e, _ in m.edges}
    seen: set[str] = set()
    for d in m.events:
        if d.name not in used and d.name not in seen:
            seen.add(d.name)
            yield _at(m, d.name, "unused-event", f"event '{d.name}' is used by no transition")


def _first_declarations(m: Machine) -> list[Text]:
    out: dict[str, Text] = {}
    for d in m.states:
        out.setdefault(d.name, d.name)
    return list(out.values())


REFERENCE_RULES: tuple[Rule, ...] = (
    bad_name,
    duplicate_name,
    unknown_state,
    unknown_event,
    duplicate_transition,
    terminal_exit,
)
# These judge the machine as a whole, so they run only on one whose names resolve
# (an event used only by a misspelt transition is not "unused").
GRAPH_RULES: tuple[GraphRule, ...] = (unreachable_state, dead_end, trap, lease_reclaim, unused_event)
# Codes that make the graph meaningless: names that do not resolve.
_BLOCKING = {"duplicate-name", "unknown-state", "unknown-event"}


def validate(m: Machine, *, shape_ok: bool = True) -> list[Diagnostic]:
    """Every diagnostic the rules find in `m`.

    `shape_ok` is False when the schema stage found errors: the model may then miss
    transitions, and graph rules would report consequences rather than causes.
    """
    found = [d for rule in REFERENCE_RULES for d in rule(m)]
    if shape_ok and m.initial is not None and not any(d.code in _BLOCKING for d in found):
        graph = graph_of(m)
        found += [d for rule in GRAPH_RULES for d in rule(m, graph)]
    return found
