"""The generated pytest file runs however a user's pytest imports it (CONTRACT 4.4):
pytest's default mode, `--import-mode=importlib`, and with the generated folder a
package inside the user's project, from the project's root."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import GENERATED
from tests.harness import run_pytest

MACHINE = "runner"  # the smallest example: each run imports and runs its suite


def layout(tmp_path: Path, where: str) -> tuple[Path, Path]:
    """(project root, generated folder) for one way of keeping the generated files."""
    project = tmp_path / "project"
    if where == "plain folder":
        folder = project / "generated" / MACHINE
    else:  # the user's package `app`, with the generated code at app/fsm/runner
        folder = project / "app" / "fsm" / MACHINE
    shutil.copytree(GENERATED / MACHINE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    if where == "package":
        for package in (project / "app", project / "app" / "fsm", folder):
            (package / "__init__.py").write_text("")
    return project, folder


@pytest.mark.slow
@pytest.mark.parametrize("where", ["plain folder", "package"])
@pytest.mark.parametrize("mode", ["prepend", "append", "importlib"])
def test_the_generated_suite_runs_in_every_import_mode(where: str, mode: str, tmp_path: Path) -> None:
    project, folder = layout(tmp_path, where)
    done = run_pytest(f"--import-mode={mode}", folder.relative_to(project), cwd=project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " error" not in done.stdout, done.stdout[-3000:]
