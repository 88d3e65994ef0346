"""The Mermaid diagram (contract 4.3): a stateDiagram-v2 that real Mermaid parses.

A state's id in the diagram is its own name, so the .mmd file reads like the spec,
except for the few names real Mermaid (11.x, checked by tests/test_mermaid.py)
takes for something else. Those get an id no spec name can be (names are
lower-case, so an upper-case `S_` prefix never collides) and a
`state "name" as S_name` line, so they still show their own name:

- words the stateDiagram lexer matches at the start of a token, whole (they end in
  `\\s+`, `\\b` or `:` there, so `statement`, `notes`, `default_x` are safe):
  `state` and `note` (then read as a declaration or a note, silently dropping an
  arrow or failing), `class`, `classdef`, `style`, `scale`, `click`, `href`,
  `default`, `statediagram`, `acctitle`, `accdescr`;
- ids the state db uses itself: `root` (the document, never drawn), `root_start`
  and `root_end` (the `[*]` pseudo-states, which such a state would merge with);
- the lexer reads `direction` followed by any whitespace (newlines too) and
  `TB`/`BT`/`RL`/`LR`, case-insensitively, as a direction statement that swallows
  both lines. A line can end in `...direction` only if some name does; in such a
  machine a state whose name starts with `tb`, `bt`, `rl` or `lr` may begin the
  next line, so there it is aliased too. Elsewhere those names stay plain.

Event names are edge labels (`a --> b: event`, `event (max N)` for a capped one): the
lexer takes the rest of the line as the label, so every event name is safe there. The
lease states are drawn in a `lease` class (`classDef`, then `class a,b lease`). A limited
state (1.2) carries a note: `note right of running : at most 50 rows at once`.

Mermaid refuses to draw text longer than its maxTextSize (50,000 by default),
measured without the `%%` comment lines; `mermaid.parse` does not check it, so the
file still parses. `build` warns past that size.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from fsmc.model import Machine
from fsmc.targets.common import Header
from fsmc.templating import as_variables, render

RESERVED = frozenset(
    """state note class classdef style scale click href default statediagram acctitle
    accdescr root root_start root_end""".split()
)
DIRECTIONS = ("tb", "bt", "rl", "lr")
MAX_TEXT = 50_000  # Mermaid's default maxTextSize: longer text is refused, not drawn
_COMMENT_LINE = re.compile(r"^\s*%%(?!\{)[^\n]+\n?", re.MULTILINE)


def state_id(name: str, *, after_direction: bool = False) -> str:
    """The diagram id of state `name`; `after_direction` when a line may end in
    `direction` (see `state_ids`)."""
    if name in RESERVED or (after_direction and name.startswith(DIRECTIONS)):
        return "S_" + name
    return name


def state_ids(states: Iterable[str], events: Iterable[str]) -> dict[str, str]:
    """The diagram id of each state, in order, for a diagram whose lines end in
    these states' and events' names."""
    states = tuple(states)
    after_direction = any(n.endswith("direction") for n in (*states, *events))
    return {s: state_id(s, after_direction=after_direction) for s in states}


@dataclass(frozen=True)
class DiagramContext:
    """What templates/diagram.mmd.j2 fills in (its fields are its variables)."""

    aliases: list[tuple[str, str]]  # (id, state) where a state's id is not its name
    initials: list[str]  # ids: every state a row may be born in
    transitions: list[tuple[str, str, str]]  # (source id, label: the event, and a cap's limit, target id)
    terminals: list[str]  # ids
    lease: list[str]  # the lease states' ids, drawn in the lease class
    lone: list[str]  # a state on no arrow (only in a spec with errors, drawn by `fsmc graph`)
    limits: list[tuple[str, int]]  # 1.2: (id, the most rows the state may hold), drawn as a note


@dataclass(frozen=True)
class FileContext:
    """What templates/machine.mmd.j2 fills in (its fields are its variables)."""

    header: Header
    diagram: str  # `diagram`'s text


def diagram(machine: Machine) -> str:
    """The stateDiagram-v2 body, shared by the .mmd file and the README."""
    m = machine
    ids = state_ids(m.state_names, m.event_names)
    mentioned = {*m.initial_names, *m.terminal_names, *(s for s, _, _ in m.edges), *(t for *_, t in m.edges)}
    return render("diagram.mmd.j2", **as_variables(DiagramContext(
        aliases=[(i, s) for s, i in ids.items() if i != s],
        initials=[ids.get(s, s) for s in m.initial_names],
        transitions=[
            *((ids[s], edge_label(e, m.cap_limits.get(e), e in m.per_row_caps, m.resets.get((s, e), ()),
                                  m.timers[s, e].describe() if (s, e) in m.timers else None), ids[t])
              for s, e, t in m.edges),
            # 1.2: where a spent budget sends the row, drawn as its own arrow.
            *((ids[s], f"{e} (otherwise, {budget} spent)", ids[to]) for (s, e), (to, budget) in m.otherwise.items()),
        ],  # fmt: skip
        terminals=[ids[s] for s in m.terminals_in_order],
        lease=[ids[s] for s in m.lease.states] if m.lease is not None else [],
        lone=[i for s, i in ids.items() if s not in mentioned and i == s],
        limits=[(ids[s], most) for s, most in m.state_limits.items()],
    )))  # fmt: skip


def edge_label(
    event: str, cap: int | None, per_row: bool = False, resets: tuple[str, ...] = (), after: str | None = None
) -> str:
    """An arrow's label: its event, and a capped event's limit (`retry (max 5)`; for a
    cap per row, its default: `fetch (max 25 per row)`), so a reviewer sees the budget
    on the drawing, and the budgets a move gives back (`revive (resets fetch)`). The
    lexer takes the rest of the line as the label, so the parentheses are plain text."""
    # A timed arrow says when (1.2): `at due_at`, `after 30s`, `after 1s x2 up to 1h`.
    notes = [] if after is None else ["at due_at" if after == "due_at" else f"after {after}"]
    notes += [] if cap is None else [f"max {cap}{' per row' if per_row else ''}"]
    notes += [f"resets {', '.join(resets)}"] if resets else []
    return f"{event} ({', '.join(notes)})" if notes else event


def emit(machine: Machine, body: str) -> str:
    return render("machine.mmd.j2", **as_variables(FileContext(Header.of(machine), body)))


def measured(text: str) -> int:
    """The length Mermaid holds against maxTextSize: the text without its `%%`
    comment lines (Mermaid's `cleanupComments`, applied before the check)."""
    return len(_COMMENT_LINE.sub("", text.replace("\r\n", "\n")).lstrip())


def warnings(machine: Machine, text: str, path: str) -> list[str]:
    size = measured(text)
    if size <= MAX_TEXT:
        return []
    return [
        f"{path}: the diagram is {size:,} characters; Mermaid's default maxTextSize is "
        f"{MAX_TEXT:,}, so viewers will refuse to draw it (the file still parses)"
    ]
