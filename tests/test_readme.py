"""The README's tour, run as written: every command of its console blocks with the
output it shows, its spec, and its Python session (as a doctest, from the folder the
README says to run it in); and the application's grants of the PostgreSQL page,
which are the ones every database test gives its application role. A page that
drifts from fsmc fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs
from tests.harness import render_markdown

TOUR_BLOCKS = ["tour-spec", "tour-check", "tour-build", "tour-session", "tour-ci"]
END = "\x1e"  # printed after each command, so one shell runs a block and `$?` carries over


def console(block: str) -> list[tuple[str, str]]:
    """(command, the output shown under it) for each `$ ` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return [(command, "".join(line + "\n" for line in shown)) for command, shown in steps]


def run_console(block: str, cwd: Path, env: dict[str, str]) -> None:
    steps = console(block)
    script = "exec 2>&1\n" + "".join(
        f"{command}\n__s=$?; printf '{END}'; (exit $__s)\n" for command, _ in steps
    )
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    outputs = done.stdout.split(END)
    assert len(outputs) == len(steps) + 1 and outputs[-1] == "", done.stdout
    for (command, shown), printed in zip(steps, outputs, strict=False):
        if command.startswith("ls "):  # a terminal prints columns, a pipe one name a line
            assert printed.split() == shown.split(), (command, printed)
        else:
            assert printed == shown, (command, printed)


@pytest.mark.slow
def test_the_tour_runs_exactly_as_written(tmp_path: Path) -> None:
    tour = docs.section("README.md", "A short tour")
    spec, check, build, session, ci = (docs.block(name) for name in TOUR_BLOCKS)
    assert [text for _, text in render_markdown(tour).fences] == [spec, check, build, session, ci]
    # fsmc on PATH, as the tour asks; C collation, so `ls` sorts as the tour shows.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "LC_ALL": "C", "NO_COLOR": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    env.pop("FSMC_PG_DSN", None)

    assert "write a spec, `light.yaml`:" in tour
    (tmp_path / "light.yaml").write_text(spec)
    run_console(check, tmp_path, env)
    typo, fix = re.search(r"Fix the typo \(`(\w+)` to `(\w+)`\)", tour).groups()  # type: ignore[union-attr]
    (tmp_path / "light.yaml").write_text(spec.replace(typo, fix))
    run_console(build, tmp_path, env)

    folder = re.search(r"Try it from that folder\s+\(`cd (\S+) && python3`\)", tour)
    assert folder is not None
    (tmp_path / "session.txt").write_text(session)
    doctest = (
        "import doctest, sys\n"
        "text = open(sys.argv[1]).read()\n"
        "test = doctest.DocTestParser().get_doctest(text, {}, 'README', 'README.md', 0)\n"
        "runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)\n"
        "runner.run(test)\n"
        "sys.exit(1 if runner.failures or not runner.tries else 0)\n"
    )
    # `python3 -c` puts the working directory first on sys.path, as `python3` does.
    done = subprocess.run([sys.executable, "-c", doctest, str(tmp_path / "session.txt")],
                          cwd=tmp_path / folder.group(1), env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    run_console(ci, tmp_path, env)


def test_the_tour_fails_when_its_output_drifts(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        run_console("$ echo one\ntwo\n", tmp_path, env)
    except AssertionError:
        return
    raise AssertionError("a console block whose output differs passed")


def test_the_grants_on_the_postgres_page_are_exactly_the_ones_the_tests_give_the_application() -> None:
    # The page's list is what users type; install.app_grants is what every database
    # test's application role gets (tests/pg_scratch.py). They are one list.
    from fsmc.targets.postgres.build import build
    from fsmc.targets.postgres.install import app_grants
    from tests.pg_scratch import machine_of

    assert "with exactly these grants" in docs.section("docs/postgres.md", "The application's grants")
    block = docs.block("grants")
    statements = [line for line in block.splitlines() if line and not line.startswith("--")]
    assert statements == app_grants(build(machine_of("job")).install, "app", "app_worker")
    # and the grants are on one page only, so there is one place to change them
    pages = [p for p in docs.pages() if "GRANT SELECT, INSERT (" in p.read_text(encoding="utf-8")]
    assert [p.name for p in pages] == ["postgres.md"]
