"""Running fsmc in-process on hostile input, and judging what it printed.

`run_fsmc(*argv)` calls `fsmc.cli.main` with stdout and stderr captured (no pytest
fixture, so hypothesis can call it many times per test) and times it.
`assert_well_behaved` holds one run to the contract: exit 0, 1 or 2, every stderr
line a diagnostic in `FILE:LINE:COL: SEVERITY: MESSAGE [CODE]` form or one of the
CLI's own `fsmc: ...` lines, and never a traceback or an internal error.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

from fsmc.cli import main
from fsmc.diagnostics import CODES

DIAGNOSTIC = re.compile(
    r"(?P<file>.+):(?P<line>[1-9][0-9]*):(?P<col>[1-9][0-9]*): (?P<severity>error|warning): "
    r"(?P<message>.+) \[(?P<code>[a-z][a-z-]*)\]"
)
CLI_LINE = re.compile(r"fsmc: (error|warning|stale|missing|orphan|nothing written): .+|"
                      r"fsmc: generated files are out of date; run fsmc build")  # fmt: skip


@dataclass
class Ran:
    code: int
    out: str
    err: str
    seconds: float

    def __repr__(self) -> str:
        return (f"Ran(code={self.code}, {self.seconds:.2f}s, out={self.out[-1500:]!r}, "
                f"err={self.err[-1500:]!r})")  # fmt: skip


def run_fsmc(*argv: str | Path) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return Ran(code, out.getvalue(), err.getvalue(), time.monotonic() - started)


def assert_well_behaved(ran: Ran, *, seconds: float = 5.0) -> list[re.Match[str]]:
    """The run ended as the contract says; returns its diagnostics, parsed."""
    assert ran.code in (0, 1, 2), ran
    assert "Traceback" not in ran.err and "internal error" not in ran.err, ran
    assert ran.seconds < seconds, ran
    found = []
    for line in ran.err.splitlines():
        match = DIAGNOSTIC.fullmatch(line)
        if match:
            assert match["code"] in CODES, (line, ran)
            assert CODES[match["code"]][0] == match["severity"], (line, ran)
            found.append(match)
        else:
            assert CLI_LINE.fullmatch(line), (f"not a diagnostic line: {line!r}", ran)
    if ran.code == 1 and not any(m["severity"] == "error" for m in found):
        # exit 1 without an error diagnostic is only --strict or --check
        assert "fsmc: " in ran.err, ran
    if ran.code == 2:
        assert ran.err.startswith("fsmc: error: ") or "usage:" in ran.err, ran
    return found


def assert_json_diagnostics(ran: Ran) -> list[dict[str, object]]:
    assert ran.code in (0, 1, 2), ran
    if ran.code == 2:
        return []
    items = json.loads(ran.out)
    assert isinstance(items, list)
    for item in items:
        assert set(item) == {"file", "line", "col", "severity", "code", "message"}, item
        assert item["code"] in CODES and item["line"] >= 1 and item["col"] >= 1, item
    return items


def import_file(path: Path, name: str) -> types.ModuleType:
    """Import a generated module from its file, under a name no other test uses."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module
