"""fsmc's wheel (built from a clean copy, tests/conftest.py) installed with pip, then
fsmc run outside the source tree: the wheel must carry every package, the templates
and the JSON Schema."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SPECS, Wheel


def test_every_package_directory_is_listed_in_pyproject() -> None:
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "fsmc").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found | {"fsmc.templates"} == listed


@pytest.mark.slow
def test_an_installed_fsmc_builds_outside_the_source_tree(fsmc_wheel: Wheel, tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--disable-pip-version-check",
         "--target", str(site), str(fsmc_wheel.path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(SPECS / "job.yaml", elsewhere / "job.yaml")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "fsmc", "build", "job.yaml", "--out", "out"],
        cwd=elsewhere, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert sorted(p.name for p in (elsewhere / "out" / "job").iterdir()) == [
        "README.md", "fsm_job.py", "job.mmd", "job.sql", "test_fsm_job.py",
    ]  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", "import fsmc; print(fsmc.__file__)"],
                            cwd=elsewhere, env=env, capture_output=True, text=True)  # fmt: skip
    assert loaded.stdout.startswith(str(site))
    schema = subprocess.run([sys.executable, "-m", "fsmc", "schema"], cwd=elsewhere, env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert schema.returncode == 0 and '"$schema"' in schema.stdout
