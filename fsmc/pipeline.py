"""Pipeline: source bytes -> load -> shape -> build -> validate, as one call.

Returns the machine (None when the bytes are not a spec tree at all) and every
diagnostic, unsorted. A machine is only fit to generate from when `ok` is true.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsmc.diagnostics import Diagnostic, has_errors
from fsmc.load import load
from fsmc.model import Machine, build
from fsmc.shape import check_shape
from fsmc.source import Source
from fsmc.validate import validate


@dataclass(frozen=True)
class Checked:
    machine: Machine | None
    diagnostics: list[Diagnostic]

    def ok(self, *, strict: bool = False) -> bool:
        return self.machine is not None and not has_errors(self.diagnostics, strict=strict)


def check(source: Source) -> Checked:
    doc, found = load(source.data, source.file, source.path)
    if doc is None:
        return Checked(None, found)
    shape = check_shape(doc)
    machine = build(doc)
    rules = validate(machine, earlier=found + shape)
    return Checked(machine, found + shape + rules)
