"""`fsmc graph`: the diagram alone, as Mermaid (the .mmd body) or Graphviz DOT.

A spec with rule errors (a trap, an unreachable state) still draws: the picture is
how one sees the problem. A spec whose names do not resolve, or break the naming
rule (they would become diagram syntax), is not drawn.
"""

from __future__ import annotations

from fsmc.diagnostics import BLOCKS_GRAPH
from fsmc.escape import dot_id
from fsmc.model import Machine
from fsmc.targets import mermaid

# The codes after which the machine is not drawn: the same ones that stop the
# graph rules (a name that does not resolve, or that would become diagram syntax).
BLOCKING = BLOCKS_GRAPH


def render(machine: Machine, fmt: str) -> str:
    if fmt == "dot":
        return dot(machine)
    return mermaid.diagram(machine)


def dot(machine: Machine) -> str:
    m = machine
    start = dot_id("[*]")
    lines = [f"digraph {dot_id(m.name)} {{", "    rankdir=LR;", f"    {start} [shape=point];"]
    for s in m.state_names:
        shape = "doublecircle" if s in m.terminal_names else "ellipse"
        lines.append(f"    {dot_id(s)} [shape={shape}];")
    lines += [f"    {start} -> {dot_id(s)};" for s in m.initial_names]
    for s, e, t in m.edges:
        lines.append(f"    {dot_id(s)} -> {dot_id(t)} [label={dot_id(e)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
