"""Targets: a checked `Machine` in, `{relative path: text}` out, for every generated file.

`generate` is a pure function: no filesystem, no clock, no environment. The same
machine gives the same bytes, which is what `build --check` and the golden tests
compare. Each target module builds its template context in Python; its template
only loops and fills in values, escaped by the filters of `fsmc.escape`.

The files of contract 4 are the whole default output; the TypeScript module and its
suite are added only when asked for (`typescript=True`, `fsmc build --typescript`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsmc.model import Machine
from fsmc.targets import mermaid, pytest_suite, python, readme
from fsmc.targets import typescript as typescript_target
from fsmc.targets.common import Paths
from fsmc.targets.postgres import build as postgres


@dataclass
class Output:
    files: dict[str, str]
    warnings: list[str] = field(default_factory=list)


# The suffixes of the files an optional target writes: a build without that target
# leaves such files alone (neither writes, compares nor removes them).
OPTIONAL_SUFFIXES = {"typescript": (".ts",)}


def generate(machine: Machine, *, typescript: bool = False) -> Output:
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
    if typescript:
        files[paths.typescript] = typescript_target.emit(machine)
        files[paths.typescript_tests] = typescript_target.emit_tests(machine, pg)
    warnings = mermaid.warnings(machine, files[paths.mermaid], paths.mermaid) + list(pg.warnings)
    return Output(files, warnings)
