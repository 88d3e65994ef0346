"""Diff: two versions of one machine -> what changed between them (contract section 5).

`compare(old, new)` is pure: it takes two checked machines (the CLI refuses specs
with errors and machines of different names before calling it) and returns
`Changes`, frozen data that the renderers in `fsmc.diff_render` print.

What counts as a change is what running code and stored rows can observe: states,
events and terminals added or removed, the initial state, and the transition table
as (from, event) -> its targets, wildcards expanded. Transitions are compared as
that table, so splitting a `from` list, writing it as `"*"`, reordering the YAML or
re-quoting a name is no change; a (from, event) pair present in both with another
single `to` is one retargeting, not a removal plus an addition. Every other
(from, event, to) triple one side's expanded table has and the other's lacks is
an added or removed transition, one per target: a pair only one side has, and each
target a choice gains or loses (`in_review --decide--> rejected` is added when
`to: approved` becomes `to: [approved, rejected]`, so a reviewer who reads only
the transitions sees the new edge). A pair whose targets changed where either side
is a choice is also one `Choice` change, which says what callers must now do.
Descriptions are listed apart in `descriptions` and are never changes:
they alter no behaviour. The lease and postgres options are compared too, as
`options` (`fsmc migrate` acts on them, so a diff that called such a pair "the
same" would hide a schema change): each option by its effective value, defaults
applied, so writing out a default is no change; caps are options `caps.<event>`, and
1.2's declared columns options `postgres.columns.<name>`, each as its table declares
it (`smallint NOT NULL DEFAULT 0`; None where a side has no such column) and compared
by name, so reordering them is no change. An option's value is data, never display
text (`Value`): a list of names stays a tuple (a set-like one, `initials`, `purgeable`,
`lease.states`, `postgres.notify` or a `reset`, compared as a set, so listing it in
another order is no change; `postgres.claim.by` as listed), a wait is its `Timer`, a cap
per row a `PerRowCap`, a column its `Column`; `fsmc.diff_render` decides how each reads.

Each change says whether it is `breaking`: removing a state, an event or a
transition, retargeting, changing the initial state, making a state that OLD
already had terminal, a choice losing a target or a single target becoming a
choice, and adding or lowering a cap are breaking; additions, and a terminal that stops being one
(it only gains transitions), are compatible. A declared column removed (its data is
dropped, and code that reads it breaks), given another type, or made NOT NULL is
breaking; one added, given another default, or allowed NULL is not.

A change that is compatible for the database may still ask something of the rollout:
`notes` says so, and is never a change. An added state is one: code built from OLD
cannot read a row in it (the old module's `get()` raises `ValueError: unknown job
state 'paused'`), so the new code goes out everywhere first and the migration after
it (rows can enter the state only once the migration has run); where the same diff
also needs the migration before the new code can read a row (a cap added, a table
renamed, a column added), the state needs a release of its own first. A declared
column asks the same of the rollout either way round, since each module reads the
columns it names: one added needs the migration before the new code (whose get() and
claim() read it), and code built from OLD runs on the migrated table unchanged; one
removed needs the new code everywhere before the migration drops it.

Order is deterministic: added and retargeted items in NEW's spec order, removed
items in OLD's spec order. `Changes.same` (no change, whatever the descriptions say)
is what makes `fsmc diff` exit 0, as diff(1) does for equal files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from fsmc.model import Declaration, DeclaredColumn, Machine, Timer
from fsmc.targets.postgres.build import declared_column
from fsmc.targets.postgres.model import Column

K = TypeVar("K", str, tuple[str, str])


@dataclass(frozen=True)
class Name:
    """A state, event or terminal added or removed."""

    name: str
    breaking: bool


@dataclass(frozen=True)
class Names:
    added: tuple[Name, ...]
    removed: tuple[Name, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


@dataclass(frozen=True)
class Edge:
    """A transition added or removed."""

    source: str
    event: str
    target: str
    breaking: bool


@dataclass(frozen=True)
class Retarget:
    """The same (from, event) pair leading elsewhere: always breaking, since code and
    rows that took the old edge now land in another state."""

    source: str
    event: str
    old_target: str
    new_target: str
    breaking: bool = True


@dataclass(frozen=True)
class Choice:
    """A (from, event) pair in both machines whose targets changed where either side
    is a choice (two single targets are a `Retarget`). Breaking when a target goes
    away, or when a single target becomes a choice (callers must now say `to`);
    adding a target to a choice is compatible."""

    source: str
    event: str
    old_targets: tuple[str, ...]
    new_targets: tuple[str, ...]
    breaking: bool


@dataclass(frozen=True)
class Initial:
    old: str
    new: str
    breaking: bool = True  # rows are born elsewhere; code creating them changes meaning


@dataclass(frozen=True)
class PerRowCap:
    """1.2's cap per row (`caps: {event: {default, max}}`): the cap a row gets unless
    it is given one, and the most it may be given."""

    default: int
    most: int


# An option's effective value, as data: a name or a number (`postgres.table`,
# `limits.<state>`, a plain cap), a bool (`postgres.writer_role`), a list of names
# (`initials`, `purgeable`, `lease.states`, `postgres.notify`, `postgres.claim.by`,
# `<from>.<event>.reset`; () where it names none), a wait (`<from>.<event>.after`), a
# cap per row, or a declared column as its table declares it; None where the side has
# none (no lease, no cap, no wait, no such column). The renderers choose how each reads.
Value = str | int | bool | tuple[str, ...] | Timer | PerRowCap | Column | None


@dataclass(frozen=True)
class Option:
    """A lease, postgres or caps option whose effective value changed (`Value`).

    Adding a lease where there was none is compatible (columns and functions are
    added). A cap (`caps.<event>`: its number, or a `PerRowCap`) added or lowered is breaking (rows that
    could still fire the event no longer can), raised or removed is not;
    `postgres.notify` changes are compatible (`_COMPATIBLE`). A declared
    column (`postgres.columns.<name>`) follows `_column_options`. Every other
    option change is breaking: a table or id type that code and rows rely on moves,
    the heartbeat and reclaim contract changes, or (1.2's `postgres.claim.order`)
    which rows a claim takes first; columns added after `postgres.claim.by`'s own
    are compatible (claim() takes more keywords, each None unless given)."""

    name: str  # lease.states, lease.reclaim, postgres.table, postgres.columns.args, caps.retry, ...
    old: Value
    new: Value
    breaking: bool


@dataclass(frozen=True)
class Described:
    """The description of the machine, a state or an event, where it differs. None
    means no description."""

    name: str
    old: str | None
    new: str | None


@dataclass(frozen=True)
class EdgeDescribed:
    """The description of a transition present in both, where it differs."""

    source: str
    event: str
    old: str | None
    new: str | None


@dataclass(frozen=True)
class Descriptions:
    machine: Described | None
    states: tuple[Described, ...]
    events: tuple[Described, ...]
    transitions: tuple[EdgeDescribed, ...]

    def __bool__(self) -> bool:
        return bool(self.machine or self.states or self.events or self.transitions)


@dataclass(frozen=True)
class Note:
    """What a change asks of a rollout beyond its `breaking` mark, about the named
    items of one kind of change (`about`: `states.added`); never a change itself."""

    about: str
    names: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Shape:
    """NEW as the comparison saw it (what a diagram of the result draws), in spec order."""

    states: tuple[str, ...]
    initials: tuple[str, ...]  # the default first
    terminals: tuple[str, ...]
    edges: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class Changes:
    machine: str
    new: Shape
    states: Names
    events: Names
    terminals: Names
    initial: Initial | None
    added: tuple[Edge, ...]
    removed: tuple[Edge, ...]
    retargeted: tuple[Retarget, ...]
    choices: tuple[Choice, ...]
    options: tuple[Option, ...]
    descriptions: Descriptions
    notes: tuple[Note, ...] = ()

    @property
    def count(self) -> int:
        """How many changes to the machine (descriptions are not changes)."""
        return len(self._all())

    @property
    def breaking_count(self) -> int:
        return sum(1 for c in self._all() if c.breaking)

    @property
    def same(self) -> bool:
        return self.count == 0

    @property
    def breaking(self) -> bool:
        return self.breaking_count > 0

    def _all(self) -> list[Name | Edge | Retarget | Choice | Initial | Option]:
        out: list[Name | Edge | Retarget | Choice | Initial | Option] = []
        for names in (self.states, self.events, self.terminals):
            out += names.added + names.removed
        out += self.added + self.removed + self.retargeted + self.choices + self.options
        if self.initial is not None:
            out.append(self.initial)
        return out


def compare(old: Machine, new: Machine) -> Changes:
    """What changed from `old` to `new`; both must be machines without errors."""
    old_states, new_states = set(old.state_names), set(new.state_names)
    old_terminals, new_terminals = old.terminal_names, new.terminal_names
    old_table, new_table = old.targets, new.targets
    options = _options(old, new)
    added_states = tuple(s for s in new.state_names if s not in old_states)
    return Changes(
        machine=str(new.name),
        new=Shape(
            new.state_names,
            new.initial_names,
            new.terminals_in_order,
            new.edges,
        ),
        states=Names(
            tuple(Name(s, False) for s in added_states),
            tuple(Name(s, True) for s in old.state_names if s not in new_states),
        ),
        events=Names(
            tuple(Name(e, False) for e in new.event_names if e not in old.event_names),
            tuple(Name(e, True) for e in old.event_names if e not in new.event_names),
        ),
        terminals=Names(
            # A new terminal state is compatible; an existing state made terminal
            # strands the rows and code that still move it on.
            tuple(
                Name(s, s in old_states)
                for s in new.state_names
                if s in new_terminals and s not in old_terminals
            ),
            tuple(
                Name(s, False)
                for s in old.state_names
                if s in old_terminals and s not in new_terminals
            ),
        ),
        initial=(
            Initial(str(old.initial), str(new.initial)) if old.initial != new.initial else None
        ),
        added=tuple(Edge(s, e, t, False) for s, e, t in _gained(new.edges, old_table, new_table)),
        removed=tuple(Edge(s, e, t, True) for s, e, t in _gained(old.edges, new_table, old_table)),
        retargeted=tuple(
            Retarget(s, e, old_table[s, e][0], targets[0])
            for (s, e), targets in new_table.items()
            if len(targets) == 1 == len(old_table.get((s, e), ())) and old_table[s, e] != targets
        ),
        choices=_choices(old_table, new_table),
        options=options,
        descriptions=_descriptions(old, new),
        notes=_added_state_note(str(new.name), added_states, options) + _column_notes(options),
    )


def _added_state_note(
    machine: str, added: tuple[str, ...], options: tuple[Option, ...]
) -> tuple[Note, ...]:
    """The rollout an added state needs (see the module doc): compatible for the
    database, not for code already deployed."""
    if not added:
        return ()
    one = len(added) == 1
    named = f"{'the new state' if one else 'the new states'} {_listed(added, 'or')}"
    text = (
        f"code built from the old spec cannot read a row in {named} (its get() raises "
        f"ValueError: unknown {machine} state '{added[0]}'): roll out the new code "
        "everywhere first, then the migration, which is what lets rows enter "
        f"{'it' if one else 'them'}"
    )
    # The new code reads a new cap's count column and the tables by their new names,
    # so those changes need the migration before the new code: the opposite order.
    first = [
        o.name
        for o in options
        if (o.name.startswith(("caps.", COLUMNS)) and o.old is None)
        or o.name in ("postgres.table", "postgres.events_table")
    ]
    if first:
        text += (
            f"; but {_listed(tuple(first), 'and')} {'needs' if len(first) == 1 else 'need'} "
            "the migration before the new code can read a row, so release "
            f"{'the new state' if one else 'the new states'} on {'its' if one else 'their'} "
            "own first"
        )
    return (Note("states.added", added, text),)


def _column_notes(options: tuple[Option, ...]) -> tuple[Note, ...]:
    """The rollout a declared column added or removed needs (see the module doc): each
    module reads the columns it names, so a column must exist before the code that
    reads it, and outlive the code that does."""
    added = tuple(o.name.removeprefix(COLUMNS) for o in options if o.name.startswith(COLUMNS) and o.old is None)
    removed = tuple(o.name.removeprefix(COLUMNS) for o in options if o.name.startswith(COLUMNS) and o.new is None)
    out = []
    if added:
        one = len(added) == 1
        out.append(Note("columns.added", added, (
            f"the new code reads {'the new column' if one else 'the new columns'} {_listed(added, 'and')} "
            "(its get() and claim() name every column): run the migration first, then roll out the new "
            "code; code built from the old spec names only the columns it knows, so it keeps working "
            f"on the migrated table, and rows it creates get {'the column' if one else 'each column'}'s "
            "default (NULL without one)"
        )))  # fmt: skip
    if removed:
        one = len(removed) == 1
        out.append(Note("columns.removed", removed, (
            f"code built from the old spec reads {'the column' if one else 'the columns'} "
            f"{_listed(removed, 'and')} (its get() and claim() fail with UndefinedColumn once "
            f"{'it is' if one else 'they are'} gone): roll out the new code everywhere first, then the "
            f"migration, which drops {'it' if one else 'them'} with the data {'it holds' if one else 'they hold'}"
        )))  # fmt: skip
    return tuple(out)


def _listed(names: tuple[str, ...], word: str) -> str:
    """`'a'`, `'a' and 'b'`, `'a', 'b' and 'c'` (or with `or`)."""
    quoted = [f"'{n}'" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} {word} {quoted[-1]}"


def _gained(
    edges: tuple[tuple[str, str, str], ...],
    other: dict[tuple[str, str], tuple[str, ...]],
    table: dict[tuple[str, str], tuple[str, ...]],
) -> Iterator[tuple[str, str, str]]:
    """The (from, event, to) triples of `edges` (one side's expanded table) that the
    `other` side lacks: every target of a pair it does not have, and each target a
    choice gained. A single target replaced by another single target is a
    `Retarget`, not an edge removed and one added."""
    for s, e, t in edges:
        before = other.get((s, e), ())
        if t in before or len(before) == 1 == len(table[s, e]):
            continue
        yield s, e, t


def _choices(
    old: dict[tuple[str, str], tuple[str, ...]], new: dict[tuple[str, str], tuple[str, ...]]
) -> tuple[Choice, ...]:
    out = []
    for pair, targets in new.items():
        before = old.get(pair)
        if before is None or len(before) == len(targets) == 1 or set(before) == set(targets):
            continue  # added (an edge each), retargeted, or the same choice reordered
        breaking = len(before) == 1 or not set(before) <= set(targets)
        out.append(Choice(*pair, before, targets, breaking))
    return tuple(out)


def _option_values(m: Machine) -> dict[str, tuple[Value, object]]:
    """Each option's value, and the key it is compared by."""
    lease = m.lease
    # The lease states are a set: listing them in another order changes nothing
    # (and `fsmc migrate` agrees: the machine digest sorts them).
    listed = _names(lease.states) if lease else None
    states = (listed, None if listed is None else frozenset(listed))
    reclaim = str(lease.reclaim) if lease else None
    out: dict[str, tuple[Value, object]] = {
        "lease.states": states,
        "lease.reclaim": (reclaim, reclaim),
        "postgres.table": (str(m.postgres.table),) * 2,
        "postgres.events_table": (str(m.postgres.events_table),) * 2,
        "postgres.id_type": (m.postgres.id_type,) * 2,
        # 1.2: the schema the module names by default (its callers' calls move with it)
        "postgres.schema": (str(m.postgres.schema),) * 2,
        # The events that send wake-ups, a set; () without any.
        "postgres.notify": (_names(m.notified), frozenset(m.notified)),
        # 1.2: the columns a claim may be limited to (as listed: they key its index) and
        # the one it takes the lowest of first
        "postgres.claim.by": (_names(m.postgres.claim_by),) * 2,
        "postgres.claim.order": (None if m.postgres.claim_order is None else str(m.postgres.claim_order),) * 2,
        # 1.2: a writer role or none: another installation, which `fsmc migrate` refuses
        "postgres.writer_role": (m.postgres.writer_role,) * 2,
    }
    return out


def _names(names: Iterable[str]) -> tuple[str, ...]:
    """Names as plain strings, in the order given (a `Text` keeps its marks otherwise)."""
    return tuple(str(n) for n in names)


# Options whose every change is compatible. `postgres.notify`: wake-ups added or taken
# away change no row, no move and no call but the waiting one; a worker of the old code
# whose event no longer notifies still wakes at its timeout, as a poll would.
_COMPATIBLE = frozenset({"postgres.notify"})


def _options(old: Machine, new: Machine) -> tuple[Option, ...]:
    before, after = _option_values(old), _option_values(new)
    gained_lease = old.lease is None and new.lease is not None
    options = [
        Option(name, before[name][0], shown, not (gained_lease and name.startswith("lease.")) and
               not (name == "postgres.claim.by" and _more_by(old, new)) and name not in _COMPATIBLE)
        for name, (shown, key) in after.items()
        if before[name][1] != key
    ]  # fmt: skip
    options += _set_options(old, new)
    old_caps, new_caps = old.cap_limits, new.cap_limits
    for event in dict.fromkeys([*new_caps, *old_caps]):
        was, now = _cap(old, event), _cap(new, event)
        if was != now:
            # Lowered: the default or (for a cap per row) the max a row may be given.
            lowered = now is not None and (was is None or now[0] < was[0] or now[1] < was[1])
            options.append(Option(f"caps.{event}", _cap_value(old, event), _cap_value(new, event), lowered))
    options += _budget_options(old, new)
    options += _column_options(old, new)
    for state in dict.fromkeys([*new.state_limits, *old.state_limits]):
        had, has = old.state_limits.get(state), new.state_limits.get(state)
        if had != has:
            # Added or lowered: moves (and inserts) that passed may now be refused.
            options.append(Option(f"limits.{state}", had, has, has is not None and (had is None or has < had)))
    return tuple(options)


def _more_by(old: Machine, new: Machine) -> bool:
    """Whether NEW's claim may be limited to every column OLD's could, in the same
    places, and more after them. A column dropped from `claim.by` breaks the callers
    that pass it; one put before OLD's, or OLD's reordered, breaks them too: the
    claim function takes its columns by position, after its own parameters, so the
    old module's call would pass its `queue` as the new `kind`."""
    was, now = old.postgres.claim_by, new.postgres.claim_by
    return tuple(now[: len(was)]) == tuple(was)


def _cap(m: Machine, event: str) -> tuple[int, int] | None:
    """A cap as compared: (its default, the largest a row may have)."""
    if event not in m.cap_limits:
        return None
    return m.cap_limits[event], m.per_row_caps.get(event, m.cap_limits[event])


def _cap_value(m: Machine, event: str) -> int | PerRowCap | None:
    """A cap as the spec gives it: the number, or (1.2) a cap per row."""
    if event in m.per_row_caps:
        return PerRowCap(m.cap_limits[event], m.per_row_caps[event])
    return m.cap_limits.get(event)


def _budget_options(old: Machine, new: Machine) -> list[Option]:
    """1.2's budgets of each transition, named `<from>.<event>.otherwise`, `.spent`
    and `.reset`. A new, changed or removed otherwise changes where rows go once
    a budget is spent (or makes the move refused then): breaking, as is watching
    another budget; a reset added only gives budgets back, one removed no longer does."""
    out: list[Option] = []
    for s, e in dict.fromkeys([*new.first, *old.first]):
        was, now = old.otherwise.get((s, e)), new.otherwise.get((s, e))
        if (was and was[0]) != (now and now[0]):
            out.append(Option(f"{s}.{e}.otherwise", was and was[0], now and now[0], True))
        elif was and now and was[1] != now[1]:
            out.append(Option(f"{s}.{e}.spent", was[1], now[1], True))
        wait, now_wait = old.timers.get((s, e)), new.timers.get((s, e))
        if wait != now_wait:  # a Timer compares by its wait alone
            out.append(Option(f"{s}.{e}.after", wait, now_wait, _longer(wait, now_wait)))
        was_reset, reset = _names(old.resets.get((s, e), ())), _names(new.resets.get((s, e), ()))
        if set(was_reset) != set(reset):  # a set: listed in another order is no change
            out.append(Option(f"{s}.{e}.reset", was_reset, reset, bool(set(was_reset) - set(reset))))
    return out


COLUMNS = "postgres.columns."  # the options of 1.2's declared columns: postgres.columns.<name>


def _column_options(old: Machine, new: Machine) -> list[Option]:
    """1.2's declared columns, each by name, as its table declares it. Breaking: a
    column removed (its data is dropped, and code reading it breaks), another type
    (a value may not convert, and code reads values of the other type), and a column
    that may no longer be NULL (code that stores NULL there is refused). Compatible: a
    column added (code built from OLD names the columns it reads), another default,
    and a column that may now be NULL."""
    was = {str(c.name): c for c in old.postgres.columns}
    now = {str(c.name): c for c in new.postgres.columns}
    out: list[Option] = []
    for name in dict.fromkeys([*now, *was]):
        before, after = _declared_as(was.get(name)), _declared_as(now.get(name))
        if before == after:
            continue
        a, b = was.get(name), now.get(name)
        breaking = b is None or (a is not None and (a.type != b.type or (a.nullable and not b.nullable)))
        out.append(Option(COLUMNS + name, before, after, breaking))
    return out


def _declared_as(column: DeclaredColumn | None) -> Column | None:
    """A declared column as its table declares it (`smallint NOT NULL DEFAULT 0`)."""
    return None if column is None else declared_column(column)


def _set_options(old: Machine, new: Machine) -> list[Option]:
    """1.2's lists of states: `initials` (a state added is compatible; one removed
    breaks the code that inserts rows there) and `purgeable` (a state added is
    breaking: purge then deletes rows it kept). Reported only where a spec uses the
    1.2 form: a 1.1 spec's initial and terminals have changes of their own."""
    out: list[Option] = []
    if len(old.initial_names) > 1 or len(new.initial_names) > 1:
        # A set: the default (listed first) is `initial`'s to compare, so listing the
        # same states in another order changes the default alone.
        was, now = set(old.initial_names), set(new.initial_names)
        if was != now:
            out.append(Option("initials", old.initial_names, new.initial_names, bool(was - now)))
    if old.purgeable is not None or new.purgeable is not None:
        was, now = set(old.purgeable_names), set(new.purgeable_names)
        if was != now:
            out.append(Option("purgeable", old.purgeable_names, new.purgeable_names, bool(now - was)))
    return out


def _longer(old: Timer | None, new: Timer | None) -> bool:
    """A new wait, or a longer one (at start or at most), or one of another kind, is
    breaking: callers that fired the event at will now meet NotDue. A wait removed or
    shortened only lets rows go sooner."""
    if new is None:
        return False
    if old is None or old.kind != new.kind:
        return True
    return new.ms > old.ms or new.most_ms > old.most_ms or new.factor > old.factor


def _descriptions(old: Machine, new: Machine) -> Descriptions:
    machine = None
    if _norm(old.description) != _norm(new.description):
        machine = Described(str(new.name), _norm(old.description), _norm(new.description))
    states = _changed(_declared(old.states), _declared(new.states))
    events = _changed(_declared(old.events), _declared(new.events))
    edges = _changed(_edge_descriptions(old), _edge_descriptions(new))
    return Descriptions(
        machine,
        tuple(Described(*c) for c in states),
        tuple(Described(*c) for c in events),
        tuple(EdgeDescribed(s, e, a, b) for (s, e), a, b in edges),
    )


def _declared(declarations: Iterable[Declaration]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for d in declarations:
        out.setdefault(str(d.name), _norm(d.description))
    return out


def _edge_descriptions(m: Machine) -> dict[tuple[str, str], str | None]:
    """(from, event) -> the description of its declaration (`Machine.first`; a `from`
    list or a wildcard shares one description among its pairs)."""
    return {pair: _norm(t.description) for pair, t in m.first.items()}


def _changed(
    old: dict[K, str | None], new: dict[K, str | None]
) -> list[tuple[K, str | None, str | None]]:
    """(key, old, new) for each key in both whose description differs, in NEW's order."""
    return [(k, old[k], text) for k, text in new.items() if k in old and old[k] != text]


def _norm(text: str | None) -> str | None:
    # `queued:` and `queued: ""` both say "no description"; neither is a change.
    return text or None
