"""Targets: a checked `Machine` in, `{relative path: text}` out, for every generated file.

`generate` is a pure function: no filesystem, no clock, no environment. The same
machine gives the same bytes, which is what `build --check` and the golden tests
compare. Each target module builds its template context in Python; its template
only loops and fills in values, escaped by the filters of `fsmc.escape`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsmc.model import Machine
from fsmc.targets import mermaid, pytest_suite, python, readme, sql
from fsmc.targets.common import Paths


@dataclass
class Output:
    files: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def generate(machine: Machine) -> Output:
    """Every file fsmc generates for `machine`, keyed by path relative to the out dir."""
    paths = Paths.of(machine)
    diagram = mermaid.diagram(machine)
    files = {
        paths.module: python.emit(machine),
        paths.mermaid: mermaid.emit(machine, diagram),
        paths.tests: pytest_suite.emit(machine),
        paths.readme: readme.emit(machine, diagram),
        paths.sql: sql.emit(machine),
    }
    return Output(files, mermaid.warnings(machine, files[paths.mermaid], paths.mermaid))
