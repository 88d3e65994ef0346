"""The Mermaid diagram (contract 4.3): a stateDiagram-v2 that real Mermaid parses.

State ids are the spec's names, except where a name could be read as Mermaid
syntax (`end`, `state`, `note`, ...): such a state gets an id that no spec name
can be (names are lower-case, so an upper-case `S_` prefix never collides) and a
`state "name" as S_name` line, so it still shows its own name.
"""

from __future__ import annotations

from fsmc.model import Machine
from fsmc.targets.common import header_context
from fsmc.templating import render

# Words the stateDiagram lexer treats as syntax, and prefixes it may match greedily.
_KEYWORDS = frozenset(
    """end state note default direction class classdef style click as left right of over
    fork join choice concurrent acctitle accdescr tb bt lr rl hide_empty_description
    scale linkstyle interpolate graph flowchart statediagram""".split()
)
MAX_TEXT = 50_000  # Mermaid's default maxTextSize: longer text is refused, not drawn


def state_id(name: str) -> str:
    if name in _KEYWORDS or any(name.startswith(k) for k in _KEYWORDS):
        return "S_" + name
    return name


def diagram(machine: Machine) -> str:
    """The stateDiagram-v2 body, shared by the .mmd file and the README."""
    m = machine
    return render(
        "diagram.mmd.j2",
        aliases=[(state_id(s), s) for s in m.state_names if state_id(s) != s],
        initial=state_id(str(m.initial)),
        transitions=[(state_id(s), e, state_id(t)) for s, e, t in m.edges],
        terminals=[state_id(s) for s in m.state_names if s in m.terminal_names],
    )


def emit(machine: Machine, body: str) -> str:
    return render("machine.mmd.j2", **header_context(machine), diagram=body)


def warnings(machine: Machine, text: str, path: str) -> list[str]:
    if len(text) <= MAX_TEXT:
        return []
    return [
        f"{path} is {len(text):,} characters; Mermaid's default maxTextSize is "
        f"{MAX_TEXT:,}, so viewers will refuse to draw it (the file still parses)"
    ]
