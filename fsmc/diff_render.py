"""Diff rendering: `Changes` -> the text `fsmc diff` prints, in one of three formats.

    text      a summary line, then one line per change, BREAKING ones marked, then
              a `note:` line per note (what a rollout needs, e.g. for an added
              state); ANSI colour only when asked (the CLI asks when stdout is a TTY
              and NO_COLOR is unset); reworded descriptions listed apart, as quoted
              literals
    markdown  for a pull request: a bold summary line, a table of changes, a
              **Note:** paragraph per note, a table of reworded descriptions, and,
              when anything changed, a Mermaid stateDiagram-v2 of NEW with the
              changes marked (removed transitions and states drawn too)
    json      one object: `states`, `events`, `terminals`, `transitions`, `initial`,
              `options`, `choices`, `breaking` and `descriptions` (contract
              section 5's keys), then `notes`: a list of `{about, names, text}`
              (`about` names the change list the note is about: `states.added`)

An option's `old` and `new` in JSON are data, never display text (`_value_json`):
a list of names (`initials`, `purgeable`, `lease.states`, `postgres.notify`,
`postgres.claim.by`, `<from>.<event>.reset`) is a list, `[]` where it names none and
null only for `lease.states` without a lease; a wait (`<from>.<event>.after`) is
`{"kind": "due_at"}`, `{"kind": "delay", "ms": 30000}` or `{"kind": "backoff", "ms":
1000, "factor": 2, "max_ms": 3600000}` (`ms` the first wait); a cap is its number, or
`{"default": 25, "max": 1000}` for a cap per row; a declared column is `{"type":
"smallint", "nullable": false, "default": "0"}` (`default` the SQL expression its
table declares, null for none); `postgres.writer_role` a boolean; other values a
name or a number. Text and Markdown read each as before (`_shown`): `claimed,
running`, `1s x2 up to 1h`, `25 per row, at most 1000`, `smallint NOT NULL DEFAULT
0`, `none`.

Text and Markdown list changes in one order (`rows`): states, events, terminals,
the initial state, transitions added, removed and retargeted, choices, then options
(1.2's declared columns among them as rows of their own, added, removed or changed,
each shown as its table declares it: `+ column  postgres.columns.priority (smallint
NOT NULL DEFAULT 0)`; in JSON they are options like the others); JSON
keys them by kind, in the same order within each list. Every format is
deterministic. Names and option values are safe anywhere (state and event names
match `^[a-z][a-z0-9_]*$`, table names `^[a-z_][a-z0-9_]*$`, id types come from a
fixed set, a declared column's default is a SQL literal on one printable line,
`escape.sql_line_str`; Markdown still escapes its quotes and backslashes); descriptions are free text, so each reaches output through one
escaper: a Python string literal in text (a spec cannot send escape sequences to a
terminal), `md_text` in Markdown, JSON strings in JSON. Nothing here prints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fsmc.diff import COLUMNS, Changes, Edge, Names, Option, PerRowCap, Value
from fsmc.escape import md_text, py_str
from fsmc.model import Timer
from fsmc.targets.mermaid import state_ids
from fsmc.targets.postgres.model import Column
from fsmc.templating import render as render_template


def render(changes: Changes, fmt: str, *, color: bool = False) -> str:
    if fmt == "json":
        return as_json(changes)
    if fmt == "markdown":
        return as_markdown(changes)
    if fmt == "text":
        return as_text(changes, color=color)
    raise ValueError(f"unknown diff format {fmt!r}")


@dataclass(frozen=True)
class Row:
    """One change, as every format lists it."""

    kind: str  # state, event, terminal, initial, transition, choice, option, column
    action: str  # added, removed, changed, retargeted
    subject: str  # a name, or `from --event--> to`
    # What a reviewer needs besides: the old target or initial state, an option's
    # `old -> new` values, a column's declaration, or that an added terminal is an
    # existing state.
    note: str | None
    breaking: bool

    @property
    def mark(self) -> str:
        return {"added": "+", "removed": "-"}.get(self.action, "~")


def rows(changes: Changes) -> list[Row]:
    """Every change as a row, in the order text and Markdown list them."""
    c = changes
    out: list[Row] = []
    for kind, names in (("state", c.states), ("event", c.events), ("terminal", c.terminals)):
        out += _name_rows(kind, names)
    if c.initial is not None:
        i = c.initial
        out.append(Row("initial", "changed", i.new, f"was {i.old}", i.breaking))
    out += [Row("transition", "added", _edge(e), None, e.breaking) for e in c.added]
    out += [Row("transition", "removed", _edge(e), None, e.breaking) for e in c.removed]
    out += [
        Row(
            "transition",
            "retargeted",
            _arrow(r.source, r.event, r.new_target),
            f"was {r.old_target}",
            r.breaking,
        )
        for r in c.retargeted
    ]
    out += [
        Row(
            "choice",
            "changed",
            _arrow(ch.source, ch.event, _targets(ch.new_targets)),
            f"was {_targets(ch.old_targets)}",
            ch.breaking,
        )
        for ch in c.choices
    ]
    out += [
        _column_row(o) if o.name.startswith(COLUMNS)
        else Row("option", "changed", o.name, f"{_shown(o.old)} -> {_shown(o.new)}", o.breaking)
        for o in c.options
    ]  # fmt: skip
    return out


def _column_row(o: Option) -> Row:
    """A declared column added (its declaration), removed (what it was), or changed."""
    if o.old is None:
        return Row("column", "added", o.name, _shown(o.new), o.breaking)
    if o.new is None:
        return Row("column", "removed", o.name, f"was {_shown(o.old)}", o.breaking)
    return Row("column", "changed", o.name, f"{_shown(o.old)} -> {_shown(o.new)}", o.breaking)


def _targets(targets: tuple[str, ...]) -> str:
    """A choice's targets as the spec writes them; one target alone."""
    return targets[0] if len(targets) == 1 else f"[{', '.join(targets)}]"


def _shown(value: Value) -> str:
    """An option's value as text and Markdown read it: `none`, `claimed, running`,
    `1s x2 up to 1m`, `25 per row, at most 1000`, `smallint NOT NULL DEFAULT 0`."""
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ", ".join(value)
    if isinstance(value, Timer):
        return value.describe()
    if isinstance(value, PerRowCap):
        return f"{value.default} per row, at most {value.most}"
    if isinstance(value, Column):
        return value.declaration
    return str(value)


def _name_rows(kind: str, names: Names) -> list[Row]:
    # The only breaking addition is a terminal that OLD had as an ordinary state.
    return [
        Row(kind, "added", n.name, "an existing state" if n.breaking else None, n.breaking)
        for n in names.added
    ] + [Row(kind, "removed", n.name, None, n.breaking) for n in names.removed]


def _edge(e: Edge) -> str:
    return _arrow(e.source, e.event, e.target)


def _arrow(source: str, event: str, target: str) -> str:
    return f"{source} --{event}--> {target}"


def counts(changes: Changes) -> str:
    """`3 changes, 1 breaking`, or `no changes`."""
    n = changes.count
    if n == 0:
        return "no changes"
    return f"{n} {'change' if n == 1 else 'changes'}, {changes.breaking_count} breaking"


def description_rows(changes: Changes) -> list[tuple[str, str, str | None, str | None]]:
    """(kind, name, old, new) for each description that differs."""
    d = changes.descriptions
    out: list[tuple[str, str, str | None, str | None]] = []
    if d.machine is not None:
        out.append(("machine", d.machine.name, d.machine.old, d.machine.new))
    out += [("state", x.name, x.old, x.new) for x in d.states]
    out += [("event", x.name, x.old, x.new) for x in d.events]
    out += [("transition", f"{x.source} --{x.event}-->", x.old, x.new) for x in d.transitions]
    return out


# --- text ---------------------------------------------------------------------------

_GREEN, _RED, _YELLOW, _BOLD, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[33m", "\x1b[1m", "\x1b[0m"


def as_text(changes: Changes, *, color: bool = False) -> str:
    def paint(code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    lines = [paint(_BOLD, f"machine {changes.machine}: {counts(changes)}")]
    table = rows(changes)
    kind_width = max((len(r.kind) for r in table), default=0)
    body = [f"{r.subject} ({r.note})" if r.note else r.subject for r in table]
    body_width = max((len(b) for b in body), default=0)
    for r, text in zip(table, body, strict=True):
        tone = {"+": _GREEN, "-": _RED}.get(r.mark, _YELLOW)
        line = paint(tone, f"{r.mark} {r.kind.ljust(kind_width)}  {text}")
        if r.breaking:
            line += " " * (body_width - len(text)) + "  " + paint(_BOLD + _RED, "BREAKING")
        lines.append(line)
    if changes.notes:
        lines += [""] + [f"note: {n.text}" for n in changes.notes]
    described = description_rows(changes)
    if described:
        lines += ["", "descriptions changed (not changes to the machine):"]
        lines += [
            f"~ {kind} {name}: {_quoted(old)} => {_quoted(new)}"
            for kind, name, old, new in described
        ]
    return "\n".join(lines) + "\n"


def _quoted(text: str | None) -> str:
    # A Python literal escapes newlines, ESC and other non-printables, so a
    # description can neither break the line layout nor drive the terminal.
    return "(none)" if text is None else py_str(text)


# --- markdown -----------------------------------------------------------------------


def as_markdown(changes: Changes) -> str:
    out = [f"**Machine `{changes.machine}`: {counts(changes)}.**", ""]
    table = rows(changes)
    if table:
        out += ["| change | what | impact |", "| --- | --- | --- |"]
        for r in table:
            what = f"`{r.subject}`" + (f" ({md_text(r.note)})" if r.note else "")
            impact = "**breaking**" if r.breaking else "compatible"
            out.append(f"| {r.kind} {r.action} | {what} | {impact} |")
        out.append("")
    for n in changes.notes:
        out += [f"**Note:** {md_text(n.text)}", ""]
    described = description_rows(changes)
    if described:
        out += [
            "Descriptions changed (not counted as changes):",
            "",
            "| of | old | new |",
            "| --- | --- | --- |",
        ]
        out += [
            f"| {kind} `{name}` | {_md_desc(old)} | {_md_desc(new)} |"
            for kind, name, old, new in described
        ]
        out.append("")
    if table:
        out += [
            f"The new `{changes.machine}` machine; changed transitions are labelled "
            "(added), (retargeted, was ...), (choice, was ...) or (removed), and states drawn in colour "
            "were added (green), removed (red, dashed) or changed role (amber).",
            "",
            "```mermaid",
            diagram(changes).rstrip("\n"),
            "```",
            "",
        ]
    return "\n".join(out).rstrip("\n") + "\n"


def _md_desc(text: str | None) -> str:
    return "*none*" if text is None else md_text(text)


# --- the Mermaid diagram ------------------------------------------------------------

_CLASSES = (
    ("added", "stroke:#1a7f37,stroke-width:3px"),
    ("removed", "stroke:#cf222e,stroke-width:2px,stroke-dasharray:5 5,color:#cf222e"),
    ("changed", "stroke:#9a6700,stroke-width:3px"),
)


def diagram(changes: Changes) -> str:
    """A stateDiagram-v2 of NEW with the changes marked, for the Markdown.

    State diagrams cannot style an edge, so changed edges say so in their label;
    removed edges (and the removed states they need) are drawn as well, so a
    reviewer sees what went away. Everything comes from `Changes`: the edges are
    NEW's own (`changes.new`), labelled where added or retargeted, plus the removed
    ones; states are marked by class as added, removed, or changed in role (made or
    no longer terminal, or the new initial state).
    """
    c, new = changes, changes.new
    removed_states = [n.name for n in c.states.removed]
    added = {(e.source, e.event, e.target) for e in c.added}
    was = {(r.source, r.event): r.old_target for r in c.retargeted}
    chose = {(ch.source, ch.event): ", ".join(ch.old_targets) for ch in c.choices}
    labelled: list[tuple[str, str, str]] = []
    for s, e, t in new.edges:
        label = e
        if (s, e, t) in added:  # a new pair's target, or one a choice gained
            label = f"{e} (added)"
        elif (s, e) in was:
            label = f"{e} (retargeted, was {was[s, e]})"
        elif (s, e) in chose:
            label = f"{e} (choice, was {chose[s, e]})"
        labelled.append((s, label, t))
    labelled += [(e.source, f"{e.event} (removed)", e.target) for e in c.removed]
    # Lines end in state names, in unchanged edges' event names, or in `)`.
    ids = state_ids(
        (*new.states, *removed_states),
        (*(e for _, e, _ in new.edges), *(e.event for e in c.removed)),
    )
    drawn = {s for s, _, _ in labelled} | {t for _, _, t in labelled}
    body = render_template(
        "diagram.mmd.j2",
        aliases=[(i, s) for s, i in ids.items() if i != s],
        # A removed state whose only edge in was retargeted has no edge left to show
        # it; declare it, so its `class` line marks a state that is drawn.
        lone=[s for s in removed_states if s not in drawn and ids[s] == s],
        initials=[ids[s] for s in new.initials],
        transitions=[(ids[s], label, ids[t]) for s, label, t in labelled],
        terminals=[ids[s] for s in new.terminals],
        lease=[],  # the change marks are this diagram's classes
        limits=[],  # the diff's rows say what limits changed
    )
    added_states = [n.name for n in c.states.added]
    # A state whose role changed: it became or stopped being terminal, or is the new
    # initial state. Added and removed states already have their own mark.
    role = [n.name for n in c.terminals.added + c.terminals.removed]
    role += [c.initial.new] if c.initial is not None else []
    marks = [(s, "added") for s in added_states] + [(s, "removed") for s in removed_states]
    marks += [
        (s, "changed") for s in dict.fromkeys(role) if s in new.states and s not in added_states
    ]
    lines = [f"    classDef {name} {style}" for name, style in _CLASSES]
    lines += [f"    class {ids[s]} {cls}" for s, cls in marks]
    return body + "\n".join(lines) + "\n"


# --- json ---------------------------------------------------------------------------


def as_json(changes: Changes) -> str:
    c = changes
    d = c.descriptions
    doc = {
        "states": _names(c.states),
        "events": _names(c.events),
        "terminals": _names(c.terminals),
        "transitions": {
            "added": [_edge_json(e) for e in c.added],
            "removed": [_edge_json(e) for e in c.removed],
            "retargeted": [
                {
                    "from": r.source,
                    "event": r.event,
                    "old_to": r.old_target,
                    "new_to": r.new_target,
                    "breaking": r.breaking,
                }
                for r in c.retargeted
            ],
        },
        "initial": None if c.initial is None else {"old": c.initial.old, "new": c.initial.new},
        "options": [
            {"name": o.name, "old": _value_json(o.old), "new": _value_json(o.new), "breaking": o.breaking}
            for o in c.options
        ],
        "choices": [
            {
                "from": ch.source,
                "event": ch.event,
                "old_to": list(ch.old_targets),
                "new_to": list(ch.new_targets),
                "breaking": ch.breaking,
            }
            for ch in c.choices
        ],
        "breaking": c.breaking,
        "descriptions": {
            "machine": None if d.machine is None else {"old": d.machine.old, "new": d.machine.new},
            "states": [{"name": x.name, "old": x.old, "new": x.new} for x in d.states],
            "events": [{"name": x.name, "old": x.old, "new": x.new} for x in d.events],
            "transitions": [
                {"from": x.source, "event": x.event, "old": x.old, "new": x.new}
                for x in d.transitions
            ],
        },
        "notes": [{"about": n.about, "names": list(n.names), "text": n.text} for n in c.notes],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _names(names: Names) -> dict[str, list[str]]:
    return {"added": [n.name for n in names.added], "removed": [n.name for n in names.removed]}


def _edge_json(e: Edge) -> dict[str, object]:
    return {"from": e.source, "event": e.event, "to": e.target, "breaking": e.breaking}


def _value_json(value: Value) -> object:
    """An option's value as JSON holds it (the shapes the module doc lists): a list of
    names is a list, a wait or a cap per row or a column an object; never display text."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Timer):
        return _wait_json(value)
    if isinstance(value, PerRowCap):
        return {"default": value.default, "max": value.most}
    if isinstance(value, Column):
        return {"type": value.type, "nullable": not value.not_null, "default": value.default}
    return value


def _wait_json(t: Timer) -> dict[str, object]:
    """`{"kind": "due_at"}`, `{"kind": "delay", "ms": 30000}`, or `{"kind": "backoff",
    "ms": 1000, "factor": 2, "max_ms": 60000}` (`ms`: the first wait)."""
    if t.kind == "due_at":
        return {"kind": "due_at"}
    if t.kind == "delay":
        return {"kind": "delay", "ms": t.ms}
    factor = int(t.factor) if t.factor == int(t.factor) else t.factor
    return {"kind": "backoff", "ms": t.ms, "factor": factor, "max_ms": t.most_ms}
