"""Invalid-spec goldens: for each tests/invalid/NAME.yaml, `fsmc check` prints exactly
tests/invalid/NAME.out on stdout (as mypy and ruff print theirs), nothing on stderr,
and exits 1. The .out files are the reviewable record of what users see; regenerate
them with FSMC_UPDATE_GOLDEN=1 and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

INVALID = Path(__file__).resolve().parent / "invalid"
CASES = sorted(p.stem for p in INVALID.glob("*.yaml"))


def test_there_are_cases() -> None:
    assert len(CASES) >= 8


@pytest.mark.parametrize("name", CASES)
def test_check_prints_exactly_the_golden_output(name: str, fsmc, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(INVALID)
    ran = fsmc("check", f"{name}.yaml")
    golden = INVALID / f"{name}.out"
    if os.environ.get("FSMC_UPDATE_GOLDEN"):
        golden.write_text(ran.out)
    assert ran.code == 1
    assert ran.err == ""
    assert ran.out == golden.read_text()
    # Build refuses the same spec, writes nothing, and says the same things.
    built = fsmc("build", f"{name}.yaml", "--out", str(INVALID / "never"))
    assert built.code == 1 and built.out == ran.out
    assert built.err == "fsmc: nothing written: the specs have errors\n"
    assert not (INVALID / "never").exists()
