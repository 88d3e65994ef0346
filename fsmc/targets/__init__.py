"""Targets: a checked `Machine` in, `{relative path: text}` out, for every generated file.

`generate` is a pure function: no filesystem, no clock, no environment. The same
machine gives the same bytes, which is what `build --check` and the golden tests
compare. Each target module builds its template context in Python; its template
only loops and fills in values, escaped by the filters of `fsmc.escape`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsmc.model import Machine
from fsmc.targets import mermaid, pytest_suite, python, readme
from fsmc.targets.common import Paths
from fsmc.targets.postgres import build as postgres


@dataclass
class Output:
    files: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def generate(machine: Machine) -> Output:
    """Every file fsmc generates for `machine`, keyed by path relative to the out dir."""
    paths = Paths.of(machine)
    diagram = mermaid.diagram(machine)
    pg = postgres.build(machine)  # once: the SQL file, the suite and the README share it
    files = {
        paths.module: python.emit(machine),
        paths.mermaid: mermaid.emit(machine, diagram),
        paths.tests: pytest_suite.emit(machine, pg),
        paths.readme: readme.emit(machine, diagram, pg),
        paths.sql: postgres.emit(pg),
    }
    warnings = mermaid.warnings(machine, files[paths.mermaid], paths.mermaid) + list(pg.warnings)
    return Output(files, warnings)
