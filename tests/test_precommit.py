"""The repository is a pre-commit hook repository: a project that names it in its
`.pre-commit-config.yaml`, as docs/cli.md shows, gets both hooks installed (as
pre-commit installs any `language: python` hook, with pip) and run on a sample
holding a good spec, a bad spec and a stale generated file.

The hook repository is the working tree (committed into a scratch git repository,
since pre-commit clones what it installs), so the test checks what is about to be
committed, not the last commit. pre-commit installs the hooks' one environment once
(`install-hooks`, into a PRE_COMMIT_HOME the module shares); both runs then use it.
`pre-commit try-repo` would install it afresh on every call, into a store of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import docs
from tests.conftest import ROOT, SPECS

# What `pip install` of the hook repository needs, and the manifest.
SHIPPED = [".pre-commit-hooks.yaml", "pyproject.toml", "README.md", "LICENSE", "fsmc", "templates"]
GIT_ID = ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *GIT_ID, *args], cwd=cwd, check=True, capture_output=True)


def test_the_manifest_declares_both_hooks() -> None:
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"fsmc-check", "fsmc-build-check"}
    assert hooks["fsmc-check"]["entry"] == "fsmc check"
    assert hooks["fsmc-build-check"]["entry"] == "fsmc build --check"
    assert all(h["language"] == "python" for h in hooks.values())


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The working tree's shipped files, committed; (the repository, its commit)."""
    repo = tmp_path_factory.mktemp("hook-repo")
    for name in SHIPPED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, repo / name)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "hooks")
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True)
    return repo, rev.stdout.strip()


@pytest.fixture(scope="module")
def project(hook_repo: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A sample project whose config names the hook repository, its hooks installed;
    (the project, the environment pre-commit runs in)."""
    repo, rev = hook_repo
    project = tmp_path_factory.mktemp("project")
    (project / "specs").mkdir(parents=True)
    shutil.copy(SPECS / "job.yaml", project / "specs" / "job.yaml")
    bad = (SPECS / "task.yaml").read_text().replace("to: done}", "to: dnoe}", 1)
    assert "dnoe" in bad
    (project / "specs" / "task.yaml").write_text(bad)
    subprocess.run([sys.executable, "-m", "fsmc", "build", "specs/job.yaml"], cwd=project, check=True)
    stale = project / "generated" / "job" / "job.mmd"
    stale.write_text(stale.read_text().replace("claimed", "clamied"))
    # The command-line page's configuration, with this repository in place of the
    # published one.
    config = yaml.safe_load(docs.block("precommit-config"))
    ((shown,),) = [config["repos"]]
    assert [hook["id"] for hook in shown["hooks"]] == ["fsmc-check", "fsmc-build-check"]
    shown.update(repo=str(repo), rev=rev)
    (project / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "sample")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path_factory.mktemp("pre-commit-home")),
        "PRE_COMMIT_COLOR": "never",
        # pip installs the hook's environment from the configured indexes; offline,
        # an unreachable one is skipped at once rather than retried for minutes.
        "PIP_RETRIES": os.environ.get("PIP_RETRIES", "0"),
        "PIP_NO_COMPILE": "1",
    }
    done = subprocess.run([sys.executable, "-m", "pre_commit", "install-hooks"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project, env


@pytest.mark.slow
def test_pre_commit_runs_both_hooks_with_the_expected_exit_codes(project: tuple[Path, dict[str, str]]) -> None:
    where, env = project
    # Both runs use the environment install-hooks made: side by side, nothing to install.
    runs = {
        which: subprocess.Popen(
            [sys.executable, "-m", "pre_commit", "run", "--verbose", *files],
            cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for which, files in (("all", ["--all-files"]), ("good", ["--files", "specs/job.yaml"]))
    }
    out = {which: run.communicate(timeout=900)[0] for which, run in runs.items()}
    codes = {which: run.returncode for which, run in runs.items()}
    assert codes == {"all": 1, "good": 1}, out
    assert not any("Installing environment" in text for text in out.values()), out

    # Every spec: the bad one fails the check, with its diagnostic; the good one
    # has none. The build check refuses to judge output while a spec has errors.
    check, build = hook_output(out["all"])
    assert check[0].endswith("Failed") and "- exit code: 1" in check, out["all"]
    diagnostics = [line for line in check if line.startswith("specs/")]
    assert len(diagnostics) == 1 and diagnostics[0].startswith("specs/task.yaml:"), out["all"]
    assert diagnostics[0].endswith("did you mean 'done'? [unknown-state]"), out["all"]
    assert build[0].endswith("Failed") and "fsmc: nothing written: the specs have errors" in build

    # The good spec alone: the check passes; its generated folder has a stale file.
    check, build = hook_output(out["good"])
    assert check[0].endswith("Passed"), out["good"]
    assert build[0].endswith("Failed") and "- exit code: 1" in build, out["good"]
    assert "fsmc: stale: generated/job/job.mmd" in build and "+++ b/generated/job/job.mmd" in build


def hook_output(text: str) -> tuple[list[str], list[str]]:
    """The lines pre-commit printed for fsmc-check and for fsmc-build-check (in its
    order, by id), each list starting with the hook's status line."""
    lines = text.splitlines()
    starts = {line.split(".")[0]: i for i, line in enumerate(lines)
              if line.startswith(("fsmc check.", "fsmc build --check."))}  # fmt: skip
    assert set(starts) == {"fsmc check", "fsmc build --check"}, text
    ends = {name: min([i for i in starts.values() if i > start] + [len(lines)])
            for name, start in starts.items()}  # fmt: skip
    check, build = ("fsmc check", "fsmc build --check")
    return lines[starts[check]:ends[check]], lines[starts[build]:ends[build]]
