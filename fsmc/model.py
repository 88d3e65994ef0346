"""The machine model: what a spec means, as frozen data in document order.

`build` turns a loaded tree into a `Machine`. It trusts nothing: it takes every
part that has the right shape and skips the rest (the schema stage has already
reported what was skipped), so the rules can still check a spec with a schema
error elsewhere. Names stay `Text`, so every rule can point at the line and column
the author wrote. Nothing here reports diagnostics; nothing here raises for input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fsmc.load import Document, Mapping, Pos, Sequence, Text

ID_TYPES = ("uuid", "bigint", "text")
WILDCARD = "*"  # `from: "*"`: every non-terminal state
MAX_CAP = 1_000_000


@dataclass(frozen=True)
class Declaration:
    """A declared state or event."""

    name: Text
    description: str | None


@dataclass(frozen=True)
class Transition:
    """One (source, event) pair of one declaration: a `from` list or `"*"` gives one
    per source. `targets` is the written `to`: one state, or a choice of several (in
    the order written, without repeats)."""

    source: Text  # for a wildcard, the state's name positioned at the `"*"`
    event: Text
    targets: tuple[Text, ...]
    description: str | None
    index: int  # position in the spec's `transitions` list
    pos: Pos  # the transition's own node, for rules about the whole edge
    wildcard: bool = False  # the source came from `from: "*"`
    # 1.2: where the row goes instead once the budget (`spent`, else this event's own
    # cap) is spent, and the capped events whose budgets this move gives back.
    otherwise: Text | None = None
    spent: Text | None = None
    reset: tuple[Text, ...] = ()
    after: Timer | None = None

    @property
    def target(self) -> Text:
        """The first target (the only one, unless this is a choice)."""
        return self.targets[0]

    @property
    def is_choice(self) -> bool:
        return len(self.targets) > 1


@dataclass(frozen=True)
class Timer:
    """1.2's `after`: when time allows a transition's event. `delay` waits `ms` after
    the row entered the state; `backoff` waits min(`most_ms`, `ms` * `factor`^n), n
    the times the event has fired on the row; `due_at` waits for the time the caller
    gave the row (none given: due at once)."""

    kind: str  # delay | backoff | due_at
    ms: int = 0
    factor: float = 1.0
    most_ms: int = 0
    # The `after` node, for rules about it; not part of the wait, so two timers are
    # equal when they wait alike wherever they are written.
    pos: Pos = field(default=(1, 1), compare=False)

    def describe(self) -> str:
        """As a diagram and a diff say it: `30s`, `due_at`, `1s x2 up to 1h`."""
        if self.kind == "due_at":
            return "due_at"
        if self.kind == "delay":
            return _duration_text(self.ms)
        factor = int(self.factor) if self.factor == int(self.factor) else self.factor
        return f"{_duration_text(self.ms)} x{factor} up to {_duration_text(self.most_ms)}"


UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_text(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % UNITS_MS[unit] == 0:
            return f"{ms // UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def duration_ms(text: str) -> int | None:
    """`30s` -> 30000; None for any other form (the schema stage reports it)."""
    for unit in ("ms", "s", "m", "h", "d"):
        number = text[: -len(unit)]
        if text.endswith(unit) and number.isdigit() and number[:1] != "0":
            return int(number) * UNITS_MS[unit]
    return None


@dataclass(frozen=True)
class Wildcard:
    """A `from: "*"` declaration as written: where the `"*"` is, and what `except`
    leaves out (names as written, unknown ones included, for the rules)."""

    index: int
    star: Text
    excepted: tuple[Text, ...]


@dataclass(frozen=True)
class Cap:
    """`caps: {event: limit}`: the event fires at most `limit` times in a row's life.
    1.2's `caps: {event: {default: limit, max: most}}` makes the cap the row's own,
    chosen at insert (at most `most`, `limit` when not given) and fixed from then on."""

    event: Text
    limit: int
    most: int | None = None

    @property
    def per_row(self) -> bool:
        return self.most is not None


@dataclass(frozen=True)
class Limit:
    """1.2's `limits: {state: most}`: at most `most` rows in `state` at once, across
    the table, whoever moves them."""

    state: Text
    most: int


@dataclass(frozen=True)
class Lease:
    states: tuple[Text, ...]
    reclaim: Text


@dataclass(frozen=True)
class DeclaredColumn:
    """1.2's `postgres: {columns: {name: type | {type, default, nullable}}}`: a column of
    the row's own data (`fsmc.columns` has the types). `has_default` tells a default of
    null from none; `nullable` is as written, or its default (true without a default)."""

    name: Text
    type: str  # as written: `validate` refuses one `fsmc.columns.TYPES` lacks
    default: object = None
    has_default: bool = False
    nullable: bool = True

    @property
    def required(self) -> bool:
        """Whether `create` must be given a value: NOT NULL without a default."""
        return not self.nullable and not self.has_default


@dataclass(frozen=True)
class Postgres:
    table: Text
    events_table: Text
    id_type: str
    given: frozenset[str] = frozenset()  # the options the spec wrote (others are defaults)
    # 1.2: the schema the generated module's calls name by default (the database itself
    # is installed into whichever schema the installer's search_path names first).
    schema: str = "public"
    columns: tuple[DeclaredColumn, ...] = ()  # 1.2, in spec order
    # 1.2's `claim: {by, order}`: declared columns a claim may be limited to, and the one
    # it takes the lowest of first (then the oldest). As written: `validate` checks them.
    claim_by: tuple[Text, ...] = ()
    claim_order: Text | None = None
    # The events whose workers wait for a NOTIFY (`postgres.notify`), as written.
    notify: tuple[Text, ...] = ()
    # 1.2's `writer_role: false`: no writer role, so every write is checked, the
    # functions' own included (for hosts where nobody can create a role).
    writer_role: bool = True


@dataclass(frozen=True)
class Machine:
    file: str  # as diagnostics name it
    path: str  # as generated headers record it
    sha256: str
    name: Text
    description: str | None
    initials: tuple[Text, ...]  # the states a row may be born in; the first is the default
    states: tuple[Declaration, ...]
    events: tuple[Declaration, ...]
    terminals: tuple[Text, ...]
    transitions: tuple[Transition, ...]  # every declaration, expanded, duplicates included
    lease: Lease | None
    postgres: Postgres
    caps: tuple[Cap, ...] = ()
    wildcards: tuple[Wildcard, ...] = ()
    purgeable: tuple[Text, ...] | None = None  # as written; None: the terminals
    limits: tuple[Limit, ...] = ()  # 1.2, as written (unknown states included, for the rules)

    @property
    def initial(self) -> Text | None:
        """The default initial state: where `INSERT ... DEFAULT VALUES` puts a row."""
        return self.initials[0] if self.initials else None

    @cached_property
    def initial_names(self) -> tuple[str, ...]:
        return _unique(iter(self.initials))

    @cached_property
    def purgeable_names(self) -> tuple[str, ...]:
        """The states whose rows purge may delete, in spec (`states`) order."""
        if self.purgeable is None:
            return self.terminals_in_order
        given = {str(p) for p in self.purgeable}
        return tuple(s for s in self.state_names if s in given)

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
    def terminals_in_order(self) -> tuple[str, ...]:
        """The terminal states in spec (`states`) order."""
        return tuple(s for s in self.state_names if s in self.terminal_names)

    @cached_property
    def first(self) -> dict[tuple[str, str], Transition]:
        """(state, event) -> the declaration that defines it: the first one (a second
        is a `duplicate-transition` error), in spec order."""
        out: dict[tuple[str, str], Transition] = {}
        for t in self.transitions:
            out.setdefault((str(t.source), str(t.event)), t)
        return out

    @cached_property
    def targets(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(state, event) -> its targets: one state, or a choice's states, in spec order."""
        return {k: tuple(str(x) for x in t.targets) for k, t in self.first.items()}

    @cached_property
    def single(self) -> dict[tuple[str, str], str]:
        """(state, event) -> state for the pairs that are not choices."""
        return {k: ts[0] for k, ts in self.targets.items() if len(ts) == 1}

    @cached_property
    def choices(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(state, event) -> the states a choice may lead to (two or more)."""
        return {k: ts for k, ts in self.targets.items() if len(ts) > 1}

    @cached_property
    def edges(self) -> tuple[tuple[str, str, str], ...]:
        """The expanded table as (from, event, to) triples, in spec order, one per
        target of a choice, without duplicate declarations."""
        return tuple((s, e, t) for (s, e), ts in self.targets.items() for t in ts)

    @cached_property
    def otherwise(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(state, event) -> (the state a spent budget sends the row to, the event
        whose budget it is), for the pairs that name an `otherwise`."""
        return {
            k: (str(t.otherwise), str(t.spent or t.event))
            for k, t in self.first.items()
            if t.otherwise is not None
        }

    @cached_property
    def resets(self) -> dict[tuple[str, str], tuple[str, ...]]:
        """(state, event) -> the capped events whose budgets the move gives back."""
        return {k: _unique(iter(t.reset)) for k, t in self.first.items() if t.reset}

    @cached_property
    def otherwise_edges(self) -> tuple[tuple[str, str, str], ...]:
        """(from, event, otherwise) for each pair with an `otherwise`, in spec order:
        moves the event log records besides `edges`."""
        return tuple((s, e, to) for (s, e), (to, _) in self.otherwise.items())

    @cached_property
    def timers(self) -> dict[tuple[str, str], Timer]:
        """(state, event) -> when time allows it, for the timed transitions (1.2)."""
        return {k: t.after for k, t in self.first.items() if t.after is not None}

    @cached_property
    def timed_states(self) -> dict[str, tuple[str, Timer]]:
        """State -> (its timed event, the timer), for the states a timed transition
        leaves (one each, or `timer-conflict`: the first is kept), in spec order."""
        out: dict[str, tuple[str, Timer]] = {}
        for (s, e), timer in self.timers.items():
            out.setdefault(s, (e, timer))
        return out

    @cached_property
    def per_row_caps(self) -> dict[str, int]:
        """Event -> the largest cap a row may be given, for the caps chosen per row."""
        out: dict[str, int] = {}
        for c in self.caps:
            if c.most is not None and str(c.event) in self.cap_limits:
                out.setdefault(str(c.event), c.most)
        return {e: out[e] for e in self.cap_limits if e in out}

    @cached_property
    def cap_limits(self) -> dict[str, int]:
        """Capped event -> its cap, in `events` order (the first of a repeated key)."""
        given: dict[str, int] = {}
        for c in self.caps:
            given.setdefault(str(c.event), c.limit)
        order = {e: i for i, e in enumerate(self.event_names)}
        return dict(sorted(given.items(), key=lambda item: order.get(item[0], len(order))))

    @cached_property
    def state_limits(self) -> dict[str, int]:
        """Limited state -> the most rows it may hold, in `states` order (declared
        states only; the first of a repeated key)."""
        given: dict[str, int] = {}
        for lim in self.limits:
            given.setdefault(str(lim.state), lim.most)
        return {s: given[s] for s in self.state_names if s in given}

    @cached_property
    def notified(self) -> tuple[str, ...]:
        """The events whose workers wait for a NOTIFY (`postgres.notify`), declared
        ones only, in `events` order."""
        given = {str(e) for e in self.postgres.notify}
        return tuple(e for e in self.event_names if e in given)

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
    states = _declarations(root.get("states"))
    terminals = _names(root.get("terminals"))
    transitions, wildcards = _transitions(root.get("transitions"), states, terminals)
    return Machine(
        file=doc.file,
        path=doc.path,
        sha256=doc.sha256,
        name=name,
        description=_text(root.get("description")),
        initials=_initials(root.get("initial")),
        states=states,
        events=_declarations(root.get("events")),
        terminals=terminals,
        transitions=transitions,
        lease=_lease(root.get("lease")),
        postgres=_postgres(root.get("postgres"), name),
        caps=_caps(root.get("caps")),
        wildcards=wildcards,
        purgeable=_names(root.get("purgeable")) if isinstance(root.get("purgeable"), Sequence) else None,
        limits=_limits(root.get("limits")),
    )


def _limits(value: Any) -> tuple[Limit, ...]:
    if not isinstance(value, Mapping):
        return ()
    out: list[Limit] = []
    for state, given in value.items():
        if isinstance(state, Text) and (most := _cap_value(given)) is not None:
            out.append(Limit(state, most))
    return tuple(out)


def _initials(value: Any) -> tuple[Text, ...]:
    """`initial`: one state, or (1.2) a list of them, the default first."""
    if isinstance(value, Text):
        return (value,)
    return tuple(dict.fromkeys(_names(value)))


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


def _transitions(
    value: Any, states: tuple[Declaration, ...], terminals: tuple[Text, ...]
) -> tuple[tuple[Transition, ...], tuple[Wildcard, ...]]:
    if not isinstance(value, Sequence):
        return (), ()
    out: list[Transition] = []
    wildcards: list[Wildcard] = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            continue
        event, targets = _name(item.get("event")), _targets(item.get("to"))
        source = item.get("from")
        if event is None or not targets:
            continue
        sources: tuple[Text, ...]
        wildcard = False
        if isinstance(source, Text) and source == WILDCARD:
            wildcard = True
            excepted = tuple(n for n in _names(item.get("except")) if n != WILDCARD)
            wildcards.append(Wildcard(index, source, excepted))
            sources = _expand(source, states, terminals, excepted)
        elif isinstance(source, Text):
            sources = (source,)
        else:
            # "*" inside a list is a schema error; it names no state.
            sources = tuple(s for s in _names(source) if s != WILDCARD)
        description = _text(item.get("description"))
        otherwise, spent = _name(item.get("otherwise")), _name(item.get("spent"))
        reset = _names(item.get("reset"))
        after = _timer(item.get("after"), item.value_pos.get("after", item.pos))
        for s in sources:
            out.append(Transition(s, event, targets, description, index, item.pos, wildcard,
                                  otherwise, spent, reset, after))  # fmt: skip
    return tuple(out), tuple(wildcards)


def _timer(value: Any, pos: Pos) -> Timer | None:
    """`after` as the model keeps it; None for a misshapen one (the schema stage says)."""
    if isinstance(value, Text) and value == "due_at":
        return Timer("due_at", pos=pos)
    if isinstance(value, Text):
        ms = duration_ms(value)
        return None if ms is None else Timer("delay", ms, pos=pos)
    if isinstance(value, Mapping):
        backoff, most, factor = value.get("backoff"), value.get("max"), value.get("factor")
        ms = duration_ms(backoff) if isinstance(backoff, Text) else None
        most_ms = duration_ms(most) if isinstance(most, Text) else None
        if ms is None or most_ms is None or isinstance(factor, bool) or not isinstance(factor, (int, float)):
            return None
        if not 1 <= factor <= 100:
            return None
        return Timer("backoff", ms, float(factor), most_ms, pos)
    return None


def _targets(value: Any) -> tuple[Text, ...]:
    """A `to`: one state, or a choice (repeats dropped: a schema error already)."""
    if isinstance(value, Text):
        return (value,)
    seen: dict[str, Text] = {}
    for name in _names(value):
        if name != WILDCARD:  # "*" in a list is a schema error; it names no state
            seen.setdefault(name, name)
    return tuple(seen.values())


def _expand(
    star: Text,
    states: tuple[Declaration, ...],
    terminals: tuple[Text, ...],
    excepted: tuple[Text, ...],
) -> tuple[Text, ...]:
    """`from: "*"`: every non-terminal state in spec order, less `except`, each named
    at the `"*"` so rules about the pair point where the author wrote it."""
    left_out = {*terminals, *excepted}
    names = _unique(d.name for d in states)
    return tuple(Text(n, star.line, star.col) for n in names if n not in left_out)


def _caps(value: Any) -> tuple[Cap, ...]:
    if not isinstance(value, Mapping):
        return ()
    out: list[Cap] = []
    for event, given in value.items():
        if not isinstance(event, Text):
            continue
        if isinstance(given, Mapping):  # 1.2: {default: N, max: M}, a cap per row
            limit, most = _cap_value(given.get("default")), _cap_value(given.get("max"))
            if limit is not None and most is not None:
                out.append(Cap(event, limit, most))  # a default above max: `per_row_cap` says so
        elif (limit := _cap_value(given)) is not None:
            out.append(Cap(event, limit))
    return tuple(out)


def _cap_value(value: Any) -> int | None:
    """A cap as the model keeps it: an integer from 1 to MAX_CAP (2.0 is the integer
    2). The schema stage reports any other value; the model skips it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 1 <= value <= MAX_CAP or value != int(value):
        return None  # (a NaN fails the range test before int() could raise)
    return int(value)


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
    schema = _name(options.get("schema"))
    given = frozenset(k for k in ("table", "events_table", "id_type", "schema") if _name(options.get(k)))
    claim = options.get("claim")
    claim = claim if isinstance(claim, Mapping) else Mapping((1, 1))
    return Postgres(table, events_table, id_type if id_type in ID_TYPES else "uuid", given,
                    schema if schema is not None else "public", _columns(options.get("columns")),
                    _names(claim.get("by")), _name(claim.get("order")),
                    tuple(dict.fromkeys(_names(options.get("notify")))),
                    options.get("writer_role") is not False)  # fmt: skip


def _columns(value: Any) -> tuple[DeclaredColumn, ...]:
    """The declared columns as written; the schema stage reports any of another shape."""
    if not isinstance(value, Mapping):
        return ()
    out: list[DeclaredColumn] = []
    for name, given in value.items():
        if not isinstance(name, Text):
            continue
        if isinstance(given, str):
            out.append(DeclaredColumn(name, str(given)))
        elif isinstance(given, Mapping) and isinstance(given.get("type"), str):
            has_default = "default" in given
            null = given.get("nullable")
            nullable = null if isinstance(null, bool) else not has_default
            out.append(DeclaredColumn(name, str(given["type"]), _plain(given.get("default")), has_default, nullable))
    return tuple(out)


def _plain(value: Any) -> object:
    """A YAML value as plain Python data (a default as JSON would hold it)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [_plain(v) for v in value]
    if isinstance(value, Text):
        return str(value)
    return value
