"""`fsmc graph`: the diagram alone, as Mermaid (the .mmd body) or Graphviz DOT.

A spec with rule errors (a trap, an unreachable state) still draws: the picture is
how one sees the problem. Only a spec whose names do not resolve cannot be drawn.
"""

from __future__ import annotations

from fsmc.model import Machine
from fsmc.targets import mermaid

BLOCKING = frozenset(
    {"yaml-syntax", "limit", "duplicate-key", "schema", "duplicate-name", "unknown-state",
     "unknown-event"}
)  # fmt: skip


def render(machine: Machine, fmt: str) -> str:
    if fmt == "dot":
        return dot(machine)
    return mermaid.diagram(machine)


def dot(machine: Machine) -> str:
    m = machine
    lines = [f"digraph {m.name} {{", "    rankdir=LR;", '    "[*]" [shape=point];']
    for s in m.state_names:
        shape = "doublecircle" if s in m.terminal_names else "ellipse"
        lines.append(f'    "{s}" [shape={shape}];')
    lines.append(f'    "[*]" -> "{m.initial}";')
    for s, e, t in m.edges:
        lines.append(f'    "{s}" -> "{t}" [label="{e}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
