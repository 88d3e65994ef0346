"""fsmc's own code passes the checks it holds generated code to: `ruff check` over the
package, the tests and the benchmarks, and `mypy --strict` over the package (the
settings are pyproject.toml's). Run here so that CI, which runs only the test
command, fails on them too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.harness import mypy


@pytest.mark.slow
def test_ruff_passes_on_the_package_tests_and_benchmarks() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "fsmc", "tests", "benchmarks", "examples", "mkdocs_hooks.py"],
                          cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_strict_passes_on_the_package() -> None:
    done = mypy(cwd=ROOT, kind="package")
    assert done.returncode == 0, done.stdout + done.stderr
