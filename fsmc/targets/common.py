"""What every target shares: file names and the generated-file header."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from fsmc.model import Machine


@dataclass(frozen=True)
class Paths:
    """Where each file of a machine goes, relative to the output directory."""

    module: str
    tests: str
    sql: str
    mermaid: str
    readme: str

    @staticmethod
    def of(machine: Machine) -> Paths:
        name = str(machine.name)
        folder = name + "/"
        return Paths(
            module=folder + module_name(name) + ".py",
            tests=folder + "test_" + module_name(name) + ".py",
            sql=folder + name + ".sql",
            mermaid=folder + name + ".mmd",
            readme=folder + "README.md",
        )


def module_name(machine: str) -> str:
    """`fsm_<machine>`: never a standard-library name (machines `email`, `queue`,
    `types` are real lifecycles) and never `test_*` (machine `test`), which pytest
    and the contract take for a test file."""
    name = "fsm_" + machine
    assert name not in sys.stdlib_module_names
    return name


def header_context(machine: Machine) -> dict[str, str]:
    return {"spec_path": machine.path, "spec_sha256": machine.sha256}
