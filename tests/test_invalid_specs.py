"""Invalid-spec goldens: for each tests/invalid/NAME.yaml, `fsmc check` prints exactly
tests/invalid/NAME.stderr and exits 1. The .stderr files are the reviewable record
of what users see; regenerate them with FSMC_UPDATE_GOLDEN=1 and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

INVALID = Path(__file__).resolve().parent / "invalid"
CASES = sorted(p.stem for p in INVALID.glob("*.yaml"))


def test_there_are_cases() -> None:
    assert len(CASES) >= 8


@pytest.mark.parametrize("name", CASES)
def test_check_prints_exactly_the_golden_stderr(name: str, fsmc, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(INVALID)
    ran = fsmc("check", f"{name}.yaml")
    golden = INVALID / f"{name}.stderr"
    if os.environ.get("FSMC_UPDATE_GOLDEN"):
        golden.write_text(ran.err)
    assert ran.code == 1
    assert ran.out == ""
    assert ran.err == golden.read_text()
    assert "Traceback" not in ran.err
    # Build refuses the same spec, writes nothing, and says the same things first.
    built = fsmc("build", f"{name}.yaml", "--out", str(INVALID / "never"))
    assert built.code == 1 and built.err.startswith(ran.err)
    assert not (INVALID / "never").exists()
