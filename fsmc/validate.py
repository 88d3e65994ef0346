"""Validate: the rules of the spec language, one function per diagnostic code.

`validate(machine)` runs every rule and returns all diagnostics (unsorted; the
printer sorts). Reference rules run first; the graph rules run only on a machine
whose names all resolve, so one misspelt state is one diagnostic, not five.
Each rule points at the node at fault: the misspelt name, the second declaration,
the transition that breaks the rule, or (for rules about a state) its declaration.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fsmc import columns
from fsmc import diagnostics as codes
from fsmc.diagnostics import Code, Diagnostic
from fsmc.escape import sql_name
from fsmc.load import Pos, Text
from fsmc.model import Machine, Transition, camel
from fsmc.typos import typo_of

NAME = re.compile(r"[a-z][a-z0-9_]*")
NAME_MAX = 48
TABLE = re.compile(r"[a-z_][a-z0-9_]*")
TABLE_MAX = 63
# The names the generated module (templates/module.py.j2) defines that a CamelCase
# class name could be: a machine's class must not replace one. A test parses a
# generated module and holds this list to it.
RESERVED_CAMEL = frozenset(
    {"State", "Event", "IllegalTransition", "CapReached", "Connection", "AsyncConnection",
     "UnknownRow", "StateName", "EventName", "INITIAL", "INITIALS", "PURGEABLE", "TERMINAL", "NotDue", "NOT_DUE_SQLSTATE", "LimitReached", "LIMITS", "LIMIT_REACHED_SQLSTATE", "TRANSITIONS", "CHOICES", "CAPS",
     "SCHEMA", "NOTIFIED", "ListeningConnection", "AsyncListeningConnection",
     "ILLEGAL_TRANSITION_SQLSTATE", "CAP_REACHED_SQLSTATE", "UNKNOWN_ROW_SQLSTATE"}
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


def _at(m: Machine, where: Text | tuple[int, int], code: Code, message: str) -> Diagnostic:
    line, col = where.pos if isinstance(where, Text) else where
    return Diagnostic(m.file, line, col, code, message)


def _where(first: Text, again: Text) -> str:
    if first.line == again.line:
        return f"line {first.line}, column {first.col}"
    return f"line {first.line}"


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = typo_of(word, choices)
    return f"; did you mean '{close}'?" if close else ""


def bad_name(m: Machine) -> Iterator[Diagnostic]:
    name = m.name
    problem = _name_problem(name, NAME, NAME_MAX)
    if problem is None:
        problem = _machine_name_problem(name)
    if problem:
        yield _at(m, name, codes.BAD_NAME, f"machine name '{name}' {problem}")
    for kind, decls in (("state", m.states), ("event", m.events)):
        for d in decls:
            problem = _name_problem(d.name, NAME, NAME_MAX)
            if problem:
                yield _at(m, d.name, codes.BAD_NAME, f"{kind} name '{d.name}' {problem}")
    names = [("table", m.postgres.table), ("events_table", m.postgres.events_table)]
    if isinstance(m.postgres.schema, Text):
        names.append(("schema", m.postgres.schema))
    for key, table in names:
        if key not in m.postgres.given:
            continue  # derived from the machine name, whose own diagnostic says it all
        problem = _name_problem(table, TABLE, TABLE_MAX)
        if problem:
            yield _at(m, table, codes.BAD_NAME, f"postgres.{key} '{table}' {problem}")
    if m.postgres.table == m.postgres.events_table:
        yield _at(
            m, m.postgres.events_table, codes.BAD_NAME,
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


def bad_column(m: Machine) -> Iterator[Diagnostic]:
    """1.2's declared columns: a type of `fsmc.columns.TYPES`, a name fsmc's columns,
    parameters and keywords leave free, and a default of the column's type."""
    own = frozenset(sql_name(e, kind) for e in m.event_names for kind in ("count", "cap"))
    for column in m.postgres.columns:
        problem = columns.name_problem(column.name, own)
        if problem:
            yield _at(m, column.name, codes.BAD_COLUMN, f"postgres.columns: '{column.name}' {problem}")
        problem = columns.null_problem(column.nullable, column.has_default)
        if problem:
            yield _at(m, column.name, codes.BAD_COLUMN, f"postgres.columns.{column.name}: {problem}")
        kind = columns.TYPES.get(column.type)
        if kind is None:
            yield _at(m, column.name, codes.BAD_COLUMN,
                      f"postgres.columns.{column.name}: '{column.type}' is not a column type fsmc knows"
                      f"{_did_you_mean(column.type, columns.TYPES)} (the types: {', '.join(columns.TYPES)})")  # fmt: skip
        elif column.has_default:
            problem = columns.default_problem(kind, column.default)
            if problem:
                yield _at(m, column.name, codes.BAD_COLUMN, f"postgres.columns.{column.name}: {problem}")


def claim_columns(m: Machine) -> Iterator[Diagnostic]:
    """1.2's `postgres.claim`: `by` and `order` name declared columns a claim can compare
    and sort through a btree index (not jsonb or bytea)."""
    declared = {str(c.name): c.type for c in m.postgres.columns}
    named = [("by", n) for n in m.postgres.claim_by]
    named += [("order", m.postgres.claim_order)] if m.postgres.claim_order is not None else []
    for key, name in named:
        if name not in declared:
            yield _at(m, name, codes.BAD_COLUMN,
                      f"postgres.claim.{key}: '{name}' is not a declared column{_did_you_mean(name, declared)}")  # fmt: skip
        elif declared[name] in ("jsonb", "bytea"):
            yield _at(m, name, codes.BAD_COLUMN,
                      f"postgres.claim.{key}: '{name}' is a {declared[name]} column; a claim compares and orders "
                      "text, numbers, booleans, times, dates and uuids")  # fmt: skip


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
                    m, name, codes.DUPLICATE_NAME,
                    f"{kind} '{name}' is declared twice (first at {_where(first[name], name)})",
                )  # fmt: skip
            else:
                first[name] = name


def unknown_state(m: Machine) -> Iterator[Diagnostic]:
    if not m.states:
        return  # `states` is missing or misshapen: the schema error is the one cause
    declared = m.state_names
    refs: list[tuple[str | tuple[int, str], Text]] = [("initial", s) for s in m.initials]
    refs += [("terminals", t) for t in m.terminals]
    if m.lease:
        refs += [("lease.states", s) for s in m.lease.states]
    refs += [("purgeable", s) for s in m.purgeable or ()]
    refs += [("limits", lim.state) for lim in m.limits]
    for t in m.transitions:
        if not t.wildcard:  # a wildcard's sources are declared states by construction
            refs.append(((t.index, "from"), t.source))
        refs += [((t.index, "to"), target) for target in t.targets]
        if t.otherwise is not None:
            refs.append(((t.index, "otherwise"), t.otherwise))
    for w in m.wildcards:
        refs += [((w.index, "except"), name) for name in w.excepted]
    yield from _unknown(m, refs, declared, codes.UNKNOWN_STATE, "state")
    # `"*"` never covers a terminal state, so excepting one says the author expected
    # it to: a misreading worth one diagnostic, at the name.
    known = set(declared)
    for w in m.wildcards:
        for name in w.excepted:
            if name in m.terminal_names and name in known:
                yield _at(
                    m, name, codes.UNKNOWN_STATE,
                    f"transitions[{w.index}].except: '{name}' is a terminal state, which "
                    '"*" never covers; only non-terminal states can be excepted',
                )  # fmt: skip


def unknown_event(m: Machine) -> Iterator[Diagnostic]:
    if not m.events:
        return  # `events` is missing or misshapen: the schema error is the one cause
    refs: list[tuple[str | tuple[int, str], Text]] = []
    for t in m.transitions:
        refs.append(((t.index, "event"), t.event))
        if t.spent is not None:
            refs.append(((t.index, "spent"), t.spent))
        refs += [((t.index, "reset"), e) for e in t.reset]
    if m.lease:
        refs.append(("lease.reclaim", m.lease.reclaim))
    refs += [("caps", c.event) for c in m.caps]
    refs += [("postgres.notify", e) for e in m.postgres.notify]
    yield from _unknown(m, refs, m.event_names, codes.UNKNOWN_EVENT, "event")


def _unknown(
    m: Machine,
    refs: list[tuple[str | tuple[int, str], Text]],
    declared: tuple[str, ...],
    code: Code,
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


def per_row_cap(m: Machine) -> Iterator[Diagnostic]:
    """A cap per row whose default a row could not have (above its own max)."""
    for c in m.caps:
        if c.most is not None and c.limit > c.most:
            yield _at(
                m, c.event, codes.SCHEMA,
                f"caps.{c.event}: the default cap {c.limit} is above the max {c.most}; "
                "a row's cap is at most max",
            )  # fmt: skip


def uncapped_budget(m: Machine, g: Any) -> Iterator[Diagnostic]:
    """A budget only a cap gives: what an `otherwise` waits for (the `spent` event's,
    else the transition's own), and what a `reset` gives back. Each at the name that
    relies on it; an undeclared event has its own diagnostic. A graph rule only in
    that it runs after the schema holds: a misshapen cap is not also "no cap"."""
    if not m.events:
        return
    capped, known = m.cap_limits, set(m.event_names)
    seen: set[tuple[int, int]] = set()
    for t in m.transitions:
        needs: list[tuple[Text | Pos, str, str]] = []  # (where, key, the event it relies on)
        if t.after is not None and t.after.kind == "backoff":
            needs.append((t.after.pos, "after", str(t.event)))
        if t.otherwise is not None and t.spent is not None:
            needs.append((t.spent, "spent", str(t.spent)))
        elif t.otherwise is not None:
            needs.append((t.otherwise, "otherwise", str(t.event)))
        needs += [(e, "reset", str(e)) for e in t.reset]
        for where, key, event in needs:
            pos = where.pos if isinstance(where, Text) else where
            if event in capped or event not in known or pos in seen:
                continue
            seen.add(pos)
            if key == "reset":
                why = f"gives back the budget of '{event}', which has none"
            elif key == "after":
                why = (f"backs off by how many times '{event}' has fired, which is unbounded "
                       "without a cap")  # fmt: skip
            else:
                why = (f"sends the row to '{t.otherwise}' once the budget of '{event}' "
                       f"is spent, but '{event}' has none")  # fmt: skip
            yield _at(
                m, where, codes.UNCAPPED_BUDGET,
                f"transitions[{t.index}].{key}: {why}; cap it (caps: {{{event}: N}})",
            )  # fmt: skip


def timer_conflict(m: Machine, g: Any) -> Iterator[Diagnostic]:
    """A state is left by one timed transition at most: its row has one due time. The
    message names both events, the first's and the second's (at whose `after` it points)."""
    first: dict[str, Transition] = {}
    for t in m.transitions:
        if t.after is None:
            continue
        earlier = first.setdefault(str(t.source), t)
        if earlier is not t and (earlier.index, earlier.event) != (t.index, t.event):
            yield _at(
                m, t.after.pos, codes.TIMER_CONFLICT,
                f"transitions[{t.index}].after: state '{t.source}' already has a timed transition "
                f"out (transitions[{earlier.index}], on '{earlier.event}'), so the one on '{t.event}' "
                "cannot wait too; a row in a state has one due time, so at most one of its ways out "
                "may wait for it",
            )  # fmt: skip


def timer_range(m: Machine) -> Iterator[Diagnostic]:
    """A backoff whose max is below where it starts."""
    for t in m.transitions:
        if t.after is not None and t.after.kind == "backoff" and t.after.most_ms < t.after.ms:
            yield _at(
                m, t.after.pos, codes.SCHEMA,
                f"transitions[{t.index}].after: the backoff's max ({t.after.describe().split(' up to ')[1]}) "
                f"is below where it starts ({t.after.describe().split(' x')[0]})",
            )  # fmt: skip


def duplicate_transition(m: Machine) -> Iterator[Diagnostic]:
    first = m.first
    for t in m.transitions:
        key = (str(t.source), str(t.event))
        earlier = first[key]
        if earlier is t:
            continue
        yield _at(
            m, t.source, codes.DUPLICATE_TRANSITION,
            f"transitions[{t.index}]: ({t.source}, {t.event}) is already declared by "
            f"transitions[{earlier.index}]{_fix_for(t, earlier)}",
        )  # fmt: skip


def _fix_for(again: Transition, first: Transition) -> str:
    """How to resolve a duplicate pair: with a wildcard in play, which `except` gets
    the state; otherwise, the machine must stay deterministic."""
    wildcard = again if again.wildcard else first if first.wildcard else None
    if wildcard is None:
        return "; the machine must be deterministic"
    if again.wildcard and first.wildcard:
        return f"; add '{again.source}' to the except of one of the two wildcards"
    return f"; add '{again.source}' to transitions[{wildcard.index}].except"


def terminal_exit(m: Machine) -> Iterator[Diagnostic]:
    terminals = m.terminal_names
    for t in m.transitions:
        if t.source in terminals:
            yield _at(
                m, t.source, codes.TERMINAL_EXIT,
                f"transitions[{t.index}]: terminal state '{t.source}' has an outgoing "
                f"transition on '{t.event}' (to '{t.target}')",
            )  # fmt: skip


def graph_of(m: Machine) -> Any:
    """The machine as a networkx DiGraph of states (networkx is untyped): an edge for
    every target of every declaration that names declared states, duplicates
    included, so one duplicate pair does not make its second target look
    unreachable (one mistake, one diagnostic)."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(m.state_names)
    g.add_edges_from(_declared_edges(m))
    return g


def _declared_edges(m: Machine) -> Iterator[tuple[str, str]]:
    """Every way a declaration may move a row: each target, and an `otherwise`."""
    known = set(m.state_names)
    for t in m.transitions:
        if t.source in known:
            ends = (*t.targets, t.otherwise) if t.otherwise is not None else t.targets
            yield from ((str(t.source), str(x)) for x in ends if x in known)


def _sources(m: Machine) -> set[str]:
    """States some declaration leaves (the event need not be the first declaration's)."""
    return {str(t.source) for t in m.transitions}


def _isolated(m: Machine, g: Any) -> set[str]:
    """States no transition enters or leaves (the initial states aside, which rows
    enter by being born). Such a state is one mistake, a leftover or a state not yet
    wired in, so it gets one diagnostic, `unreachable-state`, that says so and how to
    fix it, not also a `dead-end` asking for a way out of a state nothing reaches."""
    sources, born = _sources(m), set(m.initial_names)
    return {s for s in m.state_names if s not in sources and g.in_degree(s) == 0 and s not in born}


def _from_initial(m: Machine) -> str:
    if len(m.initial_names) == 1:
        return f"the initial state '{m.initial}'"
    return "any initial state (" + ", ".join(m.initial_names) + ")"


def unreachable_state(m: Machine, g: Any) -> Iterator[Diagnostic]:
    import networkx as nx

    if not m.initial_names:
        return
    reached = set(m.initial_names)
    for s in m.initial_names:
        reached |= nx.descendants(g, s)
    isolated = _isolated(m, g)
    for d in _first_declarations(m):
        if d in isolated:
            connect = (
                "a transition into it" if d in m.terminal_names
                else "transitions into and out of it"
            )  # fmt: skip
            yield _at(
                m, d, codes.UNREACHABLE_STATE,
                f"state '{d}' is isolated: no transition enters or leaves it, so it cannot "
                f"be reached from {_from_initial(m)}; remove it, or add {connect}",
            )  # fmt: skip
        elif d not in reached:
            yield _at(
                m, d, codes.UNREACHABLE_STATE,
                f"state '{d}' cannot be reached from {_from_initial(m)}",
            )  # fmt: skip


def dead_end(m: Machine, g: Any) -> Iterator[Diagnostic]:
    sources = _sources(m)
    isolated = _isolated(m, g)  # `unreachable-state` says all there is to say
    for d in _first_declarations(m):
        if d not in m.terminal_names and d not in sources and d not in isolated:
            yield _at(
                m, d, codes.DEAD_END,
                f"state '{d}' is not terminal but has no outgoing transition; "
                "add one, or list it in terminals",
            )  # fmt: skip


def trap(m: Machine, g: Any) -> Iterator[Diagnostic]:
    import networkx as nx

    if not m.terminal_names:
        return  # `terminals: []`: the machine never ends, by decision
    # Everything that can reach a terminal: one reverse search from all terminals.
    reverse = g.reverse(copy=False)
    escapes = set(nx.multi_source_dijkstra_path_length(reverse, set(m.terminal_names)))
    sources = _sources(m)
    trapped = [d for d in _first_declarations(m) if d not in escapes and d in sources]
    if not trapped:
        return
    why = _why_trapped(m, g, escapes)
    terminals = ", ".join(m.terminals_in_order)
    for d in trapped:
        # A state with no way out at all is a dead-end; saying "trap" too adds nothing.
        yield _at(
            m, d, codes.TRAP,
            f"state '{d}' cannot reach any terminal state ({terminals}); {why[str(d)]}",
        )  # fmt: skip


def _why_trapped(m: Machine, g: Any, escapes: set[str]) -> dict[str, str]:
    """For each state that cannot escape: why (it can reach a cycle with no way out,
    dead ends, or both). One pass over the condensation, in reverse topological
    order, so a spec with thousands of trapped states costs linear time."""
    import networkx as nx

    stuck = g.subgraph(n for n in g if n not in escapes)
    dag = nx.condensation(stuck)
    order = {s: i for i, s in enumerate(m.state_names)}
    sources = _sources(m)
    cycles: dict[int, bool] = {}
    ends: dict[int, list[str]] = {}
    for c in reversed(list(nx.topological_sort(dag))):
        members = dag.nodes[c]["members"]
        looped = len(members) > 1 or any(stuck.has_edge(n, n) for n in members)
        cycles[c] = looped or any(cycles[d] for d in dag.successors(c))
        found = {n for n in members if n not in sources and n not in m.terminal_names}
        for d in dag.successors(c):
            found.update(ends[d])
        ends[c] = sorted(found, key=lambda n: order.get(n, 0))[:3]
    out: dict[str, str] = {}
    for c in dag:
        named = ", ".join(f"'{n}'" for n in ends[c])
        if ends[c] and cycles[c]:
            text = f"every path from it either cycles forever or ends in a dead end ({named})"
        elif ends[c]:
            text = f"every path from it ends in a dead end ({named})"
        else:
            text = "every path from it cycles forever, with no way out"
        for n in dag.nodes[c]["members"]:
            out[n] = text
    return out


def lease_reclaim(m: Machine, g: Any) -> Iterator[Diagnostic]:
    if m.lease is None:
        return
    held = {str(s) for s in m.lease.states}
    for state in m.lease.states:
        if (str(state), str(m.lease.reclaim)) not in m.targets:
            yield _at(
                m, state, codes.LEASE_RECLAIM,
                f"lease state '{state}' has no transition on the reclaim event "
                f"'{m.lease.reclaim}', so a stale worker's job could never be reclaimed",
            )  # fmt: skip
    # The supervisor reclaims every stale row in one statement: nobody is there to pick
    # a choice's target (it would silently take the first).
    for t in m.transitions:
        if str(t.source) in held and t.event == m.lease.reclaim and len(t.targets) > 1:
            targets = ", ".join(f"'{x}'" for x in t.targets)
            yield _at(
                m, t.pos, codes.LEASE_RECLAIM,
                f"the reclaim event '{t.event}' is a choice from lease state '{t.source}' "
                f"(to {targets}), but reclaim fires in bulk and no caller picks a target: "
                "give it one target",
            )  # fmt: skip


def cap_trap(m: Machine, g: Any) -> Iterator[Diagnostic]:
    capped = m.cap_limits
    if not capped:
        return
    # A capped exit with an `otherwise` still moves the row once its budget is spent;
    # and an event whose budget an `otherwise` watches (`spent: fetch`) has a spent
    # budget handled where it is spent (River's rescuer discards a job once its
    # attempts are spent, so no row waits in `available` with none left).
    ways_out: dict[str, set[str]] = {}
    rescued: set[tuple[str, str]] = set(m.otherwise)
    watched = {budget for _, budget in m.otherwise.values()}
    for t in m.transitions:
        ways_out.setdefault(str(t.source), set()).add(str(t.event))
    for d in _first_declarations(m):
        events = ways_out.get(d)
        if d in m.terminal_names or not events or not events <= capped.keys():
            continue
        if all((str(d), e) in rescued or e in watched for e in events):
            continue
        spent = ", ".join(f"'{e}' ({capped[e]})" for e in m.event_names if e in events)
        yield _at(
            m, d, codes.CAP_TRAP,
            f"state '{d}' can only be left by capped events ({spent}); once the caps are "
            "spent, rows there are stuck: add a way out that is not capped",
        )  # fmt: skip


def unused_event(m: Machine, g: Any) -> Iterator[Diagnostic]:
    used = {str(t.event) for t in m.transitions}
    capped = {str(c.event): c.event for c in m.caps}
    seen: set[str] = set()
    for d in m.events:
        if d.name in used or d.name in seen:
            continue
        seen.add(d.name)
        if d.name in capped:
            # One diagnostic, where it matters: a cap on an event nothing fires.
            where = capped[d.name]
            yield _at(
                m, where, codes.UNUSED_EVENT,
                f"caps.{where}: event '{where}' is capped but used by no transition",
            )  # fmt: skip
        else:
            yield _at(m, d.name, codes.UNUSED_EVENT, f"event '{d.name}' is used by no transition")


def _first_declarations(m: Machine) -> list[Text]:
    out: dict[str, Text] = {}
    for d in m.states:
        out.setdefault(d.name, d.name)
    return list(out.values())


REFERENCE_RULES: tuple[Rule, ...] = (
    bad_name,
    bad_column,
    claim_columns,
    duplicate_name,
    unknown_state,
    unknown_event,
    duplicate_transition,
    terminal_exit,
    per_row_cap,
    timer_range,
)
# These judge the machine as a whole, so they run only on one whose names resolve
# (an event used only by a misspelt transition is not "unused").
GRAPH_RULES: tuple[GraphRule, ...] = (
    unreachable_state, dead_end, trap, lease_reclaim, cap_trap, timer_conflict, uncapped_budget,
    unused_event,
)  # fmt: skip


def validate(m: Machine, *, earlier: Iterable[Diagnostic] = ()) -> list[Diagnostic]:
    """Every diagnostic the rules find in `m`.

    `earlier` are the load and schema stages' diagnostics. The graph rules do not run
    after any diagnostic whose code `blocks_graph` (a schema error may have dropped
    transitions from the model, an unknown name an edge): they would report
    consequences rather than causes.
    """
    found = [d for rule in REFERENCE_RULES for d in rule(m)]
    blocked = any(d.blocks_graph for d in (*earlier, *found))
    if not blocked and m.initial_names and set(m.initial_names) <= set(m.state_names):
        graph = graph_of(m)
        found += [d for rule in GRAPH_RULES for d in rule(m, graph)]
    return found
