"""The documentation site (README.md as its landing page, docs/ its pages) against
fsmc: it builds with `mkdocs build --strict` (a broken link, a missing anchor or a page
left out of the nav fails), every fenced block is either read by a test or marked as
not run, and the tables that restate a registry (SQLSTATEs, the command line, the
module's names) say what the registry says. The spec examples on the pages are run
here; the other blocks by the tests of what they show (the tests that call
`docs.block`)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fsmc import pipeline, source
from fsmc.digest import machine_digest
from tests import docs
from tests.conftest import GENERATED, ROOT, SPECS
from tests.harness import render_markdown

# --- the site -----------------------------------------------------------------------


def mkdocs_build(top: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=top, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.slow
def test_the_site_builds_strictly_with_the_readme_as_its_landing_page(tmp_path: Path) -> None:
    done = mkdocs_build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "A short tour" in index and 'href="spec/"' in index  # the README, its docs/ links rewritten
    for page in sorted(docs.DOCS.glob("*.md")):
        assert (tmp_path / "site" / page.stem / "index.html").is_file(), page.name

    # and --strict fails on a link to an anchor no page has
    copy_ = tmp_path / "copy"
    shutil.copytree(docs.DOCS, copy_ / "docs")
    for name in ("mkdocs.yml", "mkdocs_hooks.py", "README.md"):
        shutil.copy(ROOT / name, copy_ / name)
    with (copy_ / "docs" / "cli.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the caps](spec.md#no-such-key).\n")
    broken = mkdocs_build(copy_, tmp_path / "broken")
    assert broken.returncode != 0 and "no-such-key" in broken.stderr, broken.stderr


def test_the_landing_page_is_the_readme_with_its_links_made_relative_to_docs() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(ROOT))
    page = mkdocs_hooks.landing_page((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "](docs/" not in page and "](spec.md)" in page
    assert not (docs.DOCS / "index.md").exists()  # the README is the one source


def test_the_readme_is_a_landing_page() -> None:
    readme = docs.text_of("README.md")
    assert len(readme.splitlines()) <= 300
    linked = set(re.findall(r"\]\(docs/([a-z_]+\.md)", readme))
    assert linked == {p.name for p in docs.DOCS.glob("*.md")}, linked


# --- every block is read by a test, or marked as not run ------------------------------


def names_read_by_tests() -> set[str]:
    """The string given to every `block(...)` / `docs.block(...)` call under tests/,
    and every string in a tuple, list or dict a test hands to such a call by name."""
    read: set[str] = set()
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name == "docs.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "block":
                for arg in node.args[:1]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        read.add(arg.value)
            # a table of names a test loops over: `EXAMPLES = {"spec-job": ..., ...}`
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("_BLOCKS")
                                                    for t in node.targets):  # fmt: skip
                for const in ast.walk(node.value):
                    if isinstance(const, ast.Constant) and isinstance(const.value, str) and const.value in {
                        b.name for b in docs.blocks()
                    }:
                        read.add(const.value)
    return read


def test_every_block_is_marked_and_every_marked_block_is_read_by_a_test() -> None:
    blocks = docs.blocks()
    assert len(blocks) >= 30
    unmarked = [f"{b.page}:{b.line}" for b in blocks if b.name is None and b.reason is None]
    assert not unmarked, f"mark these blocks `<!-- test: NAME -->` or `<!-- not run: REASON -->`: {unmarked}"
    names = [b.name for b in blocks if b.name is not None]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    read = names_read_by_tests()
    unread, missing = sorted(set(names) - read), sorted(read - set(names))
    assert not unread, f"blocks no test reads: {unread}"
    assert not missing, f"tests read blocks no page has: {missing}"


def test_the_check_of_marks_sees_an_unread_block(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = docs.Block("docs/x.md", 1, "sh", "true\n", "nobody-reads-this", None)
    every = docs.blocks()
    monkeypatch.setattr(docs, "blocks", lambda: (*every, extra))
    with pytest.raises(AssertionError, match="nobody-reads-this"):
        test_every_block_is_marked_and_every_marked_block_is_read_by_a_test()


# --- tables that restate a registry ---------------------------------------------------


def test_the_sqlstate_table_has_every_code_of_fsmc_targets_sqlstate() -> None:
    from fsmc.targets.sqlstate import Codes

    codes = [getattr(Codes(), f.name) for f in dataclasses.fields(Codes)]
    (table,) = [t for t in render_markdown(docs.section("docs/postgres.md", "SQLSTATEs")).tables
                if t[0] == ["SQLSTATE", "when"]]  # fmt: skip
    listed = [row[0] for row in table[1:]]
    assert [c for c in listed if c.startswith("23F")] == codes  # each once, in order, no other
    assert len(set(listed)) == len(listed)
    assert {"23514", "22004", "22023", "40001", "42501"} <= set(listed)


def test_the_cli_synopsis_has_every_command_and_option_and_no_other() -> None:
    import argparse

    from fsmc import cli

    parser, commands = cli._parser()
    synopsis = docs.block("cli-synopsis").splitlines()
    shown = {line.split()[1]: line for line in synopsis if not line.startswith("fsmc --")}
    assert sorted(shown) == sorted(commands)
    assert "fsmc --version" in synopsis
    for name, sub in commands.items():
        line = shown[name]
        options: set[str] = set()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                options.add(action.option_strings[0])
                if action.choices:
                    assert f"{action.option_strings[0]} {'|'.join(action.choices)}" in line, (name, action.choices)
            else:
                shown_as = f"{action.metavar}..." if action.nargs == "+" else action.metavar
                assert shown_as in line.split(), (name, shown_as)
        assert set(re.findall(r"--[a-z-]+", line)) == options, (name, line)


def test_the_python_page_names_everything_a_generated_module_exports() -> None:
    tree = ast.parse((GENERATED / "queue" / "fsm_queue.py").read_text(encoding="utf-8"))
    (exported,) = [ast.literal_eval(n.value) for n in tree.body
                   if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "__all__"]  # fmt: skip
    page = docs.text_of("docs/python.md")
    missing = [name for name in exported if not re.search(rf"`{name}[`(]", page)]
    assert not missing, missing


# --- the spec examples -----------------------------------------------------------------

# Each example of the spec page, and the spec it is a piece of (or, for spec-job,
# the spec it means the same as).
SPEC_BLOCKS = {
    "spec-states-list": "job", "spec-initial": "queue", "spec-wildcard": "breaker",
    "spec-choice": "review", "spec-after": "queue", "spec-budgets": "queue", "spec-caps": "task",
    "spec-lease": "job", "spec-purgeable": "queue", "spec-limits": "queue",
    "spec-writer-role": "job", "spec-columns": "queue", "spec-claim": "queue",
    "spec-notify": "queue",
}  # fmt: skip


def checked(text: str, path: str = "spec.yaml") -> pipeline.Checked:
    return pipeline.check(source.Source(path, path, text.encode()))


def within(part: Any, whole: Any) -> bool:
    """`part`'s keys all in `whole`, with the same values (recursively)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and within(v, whole[k]) for k, v in part.items())
    return bool(part == whole)


def over(base: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """`base` with `fragment`'s keys laid over it (mappings merged, anything else
    replaced); the fragment's transitions must already be the base's."""
    merged = copy.deepcopy(base)
    for key, value in fragment.items():
        if key == "transitions":
            for t in value:
                assert any(within(t, b) for b in base["transitions"]), t
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = over(merged[key], value)
        else:
            merged[key] = value
    return merged


@pytest.mark.parametrize("name", sorted(SPEC_BLOCKS))
def test_every_spec_example_is_a_piece_of_a_spec_that_checks_clean(name: str) -> None:
    base = docs.load_yaml((SPECS / f"{SPEC_BLOCKS[name]}.yaml").read_text(encoding="utf-8"))
    fragment = docs.load_yaml(docs.block(name))
    assert isinstance(fragment, dict) and fragment
    merged = over(base, fragment)
    result = checked(yaml.safe_dump(merged, sort_keys=False))
    assert result.ok() and not result.diagnostics, result.diagnostics


def test_a_spec_example_that_breaks_its_spec_fails() -> None:
    base = docs.load_yaml((SPECS / "queue.yaml").read_text(encoding="utf-8"))
    with pytest.raises(AssertionError):
        over(base, {"transitions": [{"from": "running", "event": "fetch", "to": "running"}]})
    result = checked(yaml.safe_dump(over(base, {"limits": {"runing": 50}}), sort_keys=False))
    assert [d.code for d in result.diagnostics] == ["unknown-state"]


WHOLE_SPEC_BLOCKS = [("spec-job", "job"), ("readme-queue", "queue")]


@pytest.mark.parametrize(("name", "spec"), WHOLE_SPEC_BLOCKS)
def test_the_whole_specs_on_the_pages_mean_what_the_example_specs_mean(name: str, spec: str) -> None:
    shown = checked(docs.block(name), f"{name}.yaml")
    assert shown.ok() and not shown.diagnostics, shown.diagnostics
    if name == "readme-queue":  # its heading says how long it is
        (lines,) = re.findall(r"^## A job queue in (\d+) lines$", docs.text_of("README.md"), re.MULTILINE)
        assert int(lines) == len(docs.block(name).splitlines())
    example = checked((SPECS / f"{spec}.yaml").read_text(encoding="utf-8"), f"specs/{spec}.yaml")
    assert shown.machine is not None and example.machine is not None
    assert machine_digest(shown.machine) == machine_digest(example.machine)


# --- the README's two commands -----------------------------------------------------------


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    (command,) = docs.block("readme-suite").splitlines()
    found = re.fullmatch(r"FSMC_PG_DSN=(\S+) bash tests/run.sh", command)
    assert found is not None, command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f'export FSMC_PG_DSN="${{FSMC_PG_DSN:-{found[1]}}}"' in ci
    assert ci.rstrip().splitlines()[-1] == "bash tests/run.sh"
    assert command in (ROOT / "tests" / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_readmes_install_command_compiles_the_example_specs_into_generated(tmp_path: Path) -> None:
    import tomllib

    (command,) = docs.block("readme-install").splitlines()
    venv, install, build = command.split(" && ")
    assert venv == "python3 -m venv .venv"
    # The suite's own .venv is made the same way, with the test extra, which holds the
    # postgres one: what the command installs is what the suite runs on.
    assert install == ".venv/bin/pip install -q -e '.[postgres]'"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["postgres"]) <= set(extras["test"])
    run_sh = (ROOT / "tests" / "run.sh").read_text(encoding="utf-8")
    assert "python3 -m venv .venv" in run_sh and "-e '.[test]'" in run_sh
    # The build, run as written in a copy of the clone, gives the golden output.
    assert build.startswith(".venv/bin/fsmc ")
    shutil.copytree(SPECS, tmp_path / "specs")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "fsmc").symlink_to(Path(sys.executable).parent / "fsmc")
    done = subprocess.run(["bash", "-c", build], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    made = {p.relative_to(tmp_path / "generated"): p.read_bytes()
            for p in (tmp_path / "generated").rglob("*") if p.is_file()}  # fmt: skip
    golden = {p.relative_to(GENERATED): p.read_bytes() for p in GENERATED.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip
    assert made == golden
