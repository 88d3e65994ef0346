"""The command line: exit codes, output formats, build, --check, graph, schema, REV:PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import SPECS

JOB = SPECS / "job.yaml"
TYPO = JOB.read_text().replace("event: start, to: running", "event: strat, to: running")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_check_accepts_the_example_specs(fsmc) -> None:  # type: ignore[no-untyped-def]
    ran = fsmc("check", *sorted(SPECS.glob("*.yaml")))
    assert (ran.code, ran.out, ran.err) == (0, "", "")


def test_check_reports_errors_on_stdout_with_exit_1(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # On stdout, as mypy and ruff print theirs: `fsmc check x.yaml | grep unknown` works.
    spec = write(tmp_path, "job.yaml", TYPO)
    ran = fsmc("check", spec)
    assert ran.code == 1 and ran.err == ""
    assert ran.out == (
        f"{spec}:28:28: error: transitions[1].event: 'strat' is not a declared event; "
        "did you mean 'start'? [unknown-event]\n"
    )


def test_json_and_github_formats(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = write(tmp_path, "job.yaml", TYPO)
    ran = fsmc("check", spec, "--format", "json")
    assert ran.code == 1 and ran.err == ""
    assert json.loads(ran.out) == [
        {
            "file": str(spec),
            "line": 28,
            "col": 28,
            "severity": "error",
            "code": "unknown-event",
            "message": "transitions[1].event: 'strat' is not a declared event; "
            "did you mean 'start'?",
        }
    ]
    ran = fsmc("check", spec, "--format", "github")
    assert ran.code == 1
    assert ran.out == (
        f"::error file={spec},line=28,col=28,title=unknown-event::transitions[1].event: "
        "'strat' is not a declared event; did you mean 'start'?\n"
    )


def test_json_format_prints_an_empty_array_for_a_clean_spec(fsmc) -> None:  # type: ignore[no-untyped-def]
    ran = fsmc("check", JOB, "--format", "json")
    assert (ran.code, json.loads(ran.out)) == (0, [])


def test_warnings_pass_unless_strict(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = write(tmp_path, "job.yaml", JOB.read_text().replace("  abandon: stop", "  spare:\n  abandon: stop"))
    assert fsmc("check", spec).code == 0
    ran = fsmc("check", spec, "--strict")
    assert ran.code == 1 and "[unused-event]" in ran.out and ran.err == ""


@pytest.mark.parametrize("problem", ["missing", "directory"])
def test_io_trouble_is_exit_2(fsmc, tmp_path, problem) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "nope.yaml" if problem == "missing" else tmp_path
    ran = fsmc("check", target)
    assert ran.code == 2
    assert ran.err.startswith("fsmc: error: ") and "Traceback" not in ran.err


def test_usage_errors_are_exit_2(fsmc) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as raised:
        fsmc("check")
    assert raised.value.code == 2
    with pytest.raises(SystemExit) as raised:
        fsmc("frobnicate")
    assert raised.value.code == 2


def test_version() -> None:
    from fsmc import __version__

    done = subprocess.run([sys.executable, "-m", "fsmc", "--version"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, f"fsmc {__version__}\n")


def test_schema_is_the_json_schema_the_examples_satisfy(fsmc) -> None:  # type: ignore[no-untyped-def]
    ran = fsmc("schema")
    schema = json.loads(ran.out)
    jsonschema.Draft202012Validator.check_schema(schema)
    for spec in SPECS.glob("*.yaml"):
        jsonschema.validate(yaml.safe_load(spec.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"fsmc": 1, "machine": "x"}, schema)


def test_build_writes_every_file_and_nothing_else(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    ran = fsmc("build", JOB, "--out", out)
    assert (ran.code, ran.out, ran.err) == (0, "", "")
    assert sorted(p.name for p in (out / "job").iterdir()) == [
        "README.md", "fsm_job.py", "job.mmd", "job.sql", "test_fsm_job.py",
    ]  # fmt: skip
    assert [p.name for p in out.iterdir()] == ["job"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".fsmc-")]


def test_build_writes_nothing_for_a_spec_with_errors(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = write(tmp_path, "runner.yaml", (SPECS / "runner.yaml").read_text())
    bad = write(tmp_path, "job.yaml", TYPO)
    out = tmp_path / "out"
    ran = fsmc("build", good, bad, "--out", out)
    assert ran.code == 1 and "[unknown-event]" in ran.out and "[unknown-event]" not in ran.err
    assert ran.err == "fsmc: nothing written: the specs have errors\n"
    assert not out.exists()


def test_build_refuses_two_specs_for_one_machine(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    copy = write(tmp_path, "copy.yaml", JOB.read_text())
    ran = fsmc("build", JOB, copy, "--out", tmp_path / "out")
    assert ran.code == 2 and "both define machine 'job'" in ran.err
    assert not (tmp_path / "out").exists()


def test_build_check_is_silent_when_current(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    assert fsmc("build", JOB, "--out", out).code == 0
    ran = fsmc("build", JOB, "--out", out, "--check")
    assert (ran.code, ran.out, ran.err) == (0, "", "")


def test_build_check_shows_a_diff_for_a_stale_file_and_writes_nothing(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    fsmc("build", JOB, "--out", out)
    module = out / "job" / "fsm_job.py"
    edited = module.read_text().replace("State.CLAIMED,\n", "State.RUNNING,\n", 1)
    module.write_text(edited)
    ran = fsmc("build", JOB, "--out", out, "--check")
    assert ran.code == 1
    assert f"--- a/{out.as_posix()}/job/fsm_job.py" in ran.out
    assert "-            (State.QUEUED, Event.CLAIM): State.RUNNING,\n" in ran.out
    assert "+            (State.QUEUED, Event.CLAIM): State.CLAIMED,\n" in ran.out
    assert f"stale: {out.as_posix()}/job/fsm_job.py" in ran.err
    assert module.read_text() == edited


def test_build_check_reports_missing_and_orphan_files(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    fsmc("build", JOB, "--out", out)
    (out / "job" / "job.mmd").unlink()
    orphan = out / "job" / "fsm_old_name.py"
    orphan.write_text("# Code generated by fsmc from specs/job.yaml. DO NOT EDIT.\n")
    notes = out / "job" / "NOTES.txt"
    notes.write_text("my own notes, not generated\n")
    ran = fsmc("build", JOB, "--out", out, "--check")
    assert ran.code == 1
    assert f"missing: {out.as_posix()}/job/job.mmd" in ran.err
    assert f"orphan: {out.as_posix()}/job/fsm_old_name.py" in ran.err
    assert "NOTES.txt" not in ran.err
    assert "+++ /dev/null" in ran.out and "--- /dev/null" in ran.out
    # A real build restores the missing file, removes the orphan, keeps the notes.
    assert fsmc("build", JOB, "--out", out).code == 0
    assert (out / "job" / "job.mmd").exists() and not orphan.exists() and notes.exists()
    assert fsmc("build", JOB, "--out", out, "--check").code == 0


def test_build_check_of_a_missing_directory(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ran = fsmc("build", JOB, "--out", tmp_path / "none", "--check")
    assert ran.code == 1 and ran.err.count("missing: ") == 5
    assert not (tmp_path / "none").exists()


def test_build_leaves_unchanged_files_untouched(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    fsmc("build", JOB, "--out", out)
    module = out / "job" / "fsm_job.py"
    before = module.stat().st_mtime_ns
    os.utime(module, ns=(before - 10**9, before - 10**9))
    fsmc("build", JOB, "--out", out)
    assert module.stat().st_mtime_ns == before - 10**9


def test_graph_prints_mermaid_and_dot(fsmc) -> None:  # type: ignore[no-untyped-def]
    ran = fsmc("graph", JOB)
    assert ran.code == 0 and ran.out.startswith("stateDiagram-v2\n")
    assert "    queued --> claimed: claim\n" in ran.out
    ran = fsmc("graph", JOB, "--format", "dot")
    assert ran.code == 0 and ran.out.startswith('digraph "job" {')
    assert '"queued" -> "claimed" [label="claim"];' in ran.out


def test_graph_draws_a_spec_with_graph_errors_but_not_unresolved_names(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    trap = JOB.read_text().replace("  - {from: failed, event: abandon, to: abandoned}\n", "")
    trap = trap.replace("  - {from: paused, event: abandon, to: abandoned}\n", "")
    for fmt, start in (("mermaid", "stateDiagram-v2\n"), ("dot", 'digraph "job" {')):
        ran = fsmc("graph", write(tmp_path, "trap.yaml", trap), "--format", fmt)
        # Drawn, so the picture shows the problem; but exit 1, as `check` does (issue
        # 23: `fsmc graph spec.yaml > spec.mmd` in a script must be able to tell).
        assert ran.code == 1 and ran.out.startswith(start)
        assert "[unreachable-state]" in ran.err
        assert ran.err.endswith("fsmc: the spec has errors; the diagram draws it as written\n")
    ran = fsmc("graph", write(tmp_path, "typo.yaml", TYPO))
    assert ran.code == 1 and ran.out == ""
    # Warnings alone are no failure.
    unused = JOB.read_text().replace("  abandon: stop", "  spare:\n  abandon: stop")
    ran = fsmc("graph", write(tmp_path, "unused.yaml", unused))
    assert ran.code == 0 and "[unused-event]" in ran.err and ran.out.startswith("stateDiagram-v2\n")
    assert "fsmc: the spec has errors" not in ran.err


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_specs_can_be_read_from_git_revisions(tmp_path, monkeypatch, fsmc) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("git") is None:
        pytest.fail("git is required")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "job.yaml").write_text(JOB.read_text())
    _git(tmp_path, "add", "job.yaml")
    _git(tmp_path, "commit", "-qm", "v1")
    (tmp_path / "job.yaml").write_text(TYPO)
    monkeypatch.chdir(tmp_path)
    assert fsmc("check", "HEAD:job.yaml").code == 0
    ran = fsmc("check", "job.yaml")
    assert ran.code == 1 and ran.out.startswith("job.yaml:28:28:")
    ran = fsmc("check", "HEAD~5:job.yaml")
    assert ran.code == 2 and ran.err.startswith("fsmc: error: HEAD~5:job.yaml:")
    ran = fsmc("build", "HEAD:job.yaml", "--out", "out")
    assert ran.code == 0
    header = (tmp_path / "out" / "job" / "fsm_job.py").read_text().splitlines()[0]
    assert header == "# Code generated by fsmc from job.yaml. DO NOT EDIT."


@pytest.mark.slow
def test_the_installed_entry_point_runs_without_a_traceback(tmp_path) -> None:
    spec = write(tmp_path, "job.yaml", TYPO)
    done = subprocess.run(
        [sys.executable, "-m", "fsmc", "check", str(spec)], capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.endswith("[unknown-event]\n")


def test_graph_refuses_names_that_would_become_diagram_syntax(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = JOB.read_text().replace("  queued: accepted", '  "x --> y: hacked": accepted')
    spec = spec.replace("initial: queued", 'initial: "x --> y: hacked"')
    spec = spec.replace("{from: queued,", '{from: "x --> y: hacked",')
    spec = spec.replace("to: queued", 'to: "x --> y: hacked"')
    for fmt in ("mermaid", "dot"):
        ran = fsmc("graph", write(tmp_path, "evil.yaml", spec), "--format", fmt)
        assert ran.code == 1 and ran.out == "" and "[bad-name]" in ran.err


def test_a_renamed_or_deleted_specs_folder_is_an_orphan(fsmc, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "job.yaml", JOB.read_text())
    write(tmp_path, "runner.yaml", (SPECS / "runner.yaml").read_text())
    write(tmp_path, "task.yaml", (SPECS / "task.yaml").read_text())
    assert fsmc("build", "job.yaml", "runner.yaml", "task.yaml").code == 0
    # A partial build leaves the other machines alone.
    assert fsmc("build", "job.yaml", "--check").code == 0
    # Renamed: task.yaml now defines `chore`; generated/task/ is no longer anyone's.
    write(tmp_path, "task.yaml", (SPECS / "task.yaml").read_text().replace("machine: task", "machine: chore"))
    ran = fsmc("build", "job.yaml", "runner.yaml", "task.yaml", "--check")
    assert ran.code == 1 and "orphan: generated/task/fsm_task.py" in ran.err
    assert fsmc("build", "job.yaml", "runner.yaml", "task.yaml").code == 0
    assert not (tmp_path / "generated" / "task" / "fsm_task.py").exists()
    # Deleted: runner.yaml is gone. Whether a spec still exists cannot be judged
    # safely (another repository, a git revision...), so its folder is kept, with a
    # warning, and never deleted.
    (tmp_path / "runner.yaml").unlink()
    ran = fsmc("build", "job.yaml", "task.yaml")
    assert ran.code == 0 and "generated/runner/ (from runner.yaml) was generated from a spec" in ran.err
    assert (tmp_path / "generated" / "runner" / "fsm_runner.py").exists()
    assert fsmc("build", "job.yaml", "task.yaml", "--check").code == 0


def test_build_never_deletes_what_it_did_not_generate_for_a_machine_folder(fsmc, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "job.yaml", JOB.read_text())
    # Nested output folders, a template that mentions the phrase, an outside spec.
    assert fsmc("build", "job.yaml", "--out", "generated/v2").code == 0
    (tmp_path / "generated" / "tmpl").mkdir(parents=True)
    template = tmp_path / "generated" / "tmpl" / "x.py.j2"
    template.write_text("# Code generated by fsmc from {{ spec_path }}. DO NOT EDIT.\n")
    note = tmp_path / "generated" / "job" / "notes.md"
    assert fsmc("build", "job.yaml", "--out", "generated").code == 0
    note.write_text("mine; it says: Code generated by fsmc from nowhere. DO NOT EDIT.\n")
    assert fsmc("build", "job.yaml", "--out", "generated").code == 0
    assert (tmp_path / "generated" / "v2" / "job" / "fsm_job.py").exists()
    assert template.exists() and note.exists()


@pytest.mark.parametrize("path", ["specs/job.yaml", "a. DO NOT EDIT. -->.yaml", "x -- y\nz.yaml", ""])
def test_each_targets_header_is_recognised_and_names_its_spec(path: str) -> None:
    from fsmc.targets.common import HTML, MERMAID, PYTHON, SQL, header, header_spec

    for comment in (PYTHON, SQL, MERMAID, HTML):
        first, second = header(comment, path, "0" * 64).split("\n")
        assert header_spec(first) == comment.escape(path), (comment, first)
        assert header_spec(second) is None
    assert header_spec("<!-- Code generated by fsmc from x.yaml. DO NOT EDIT.") is None  # unclosed
    assert header_spec("#Code generated by fsmc from x.yaml. DO NOT EDIT.") is None


def test_build_check_in_json_keeps_stdout_parseable(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    fsmc("build", JOB, "--out", out)
    (out / "job" / "job.mmd").write_text("stale\n")
    ran = fsmc("build", JOB, "--out", out, "--check", "--format", "json")
    assert ran.code == 1 and json.loads(ran.out) == [] and "+++ b/" in ran.err


def test_the_same_spec_named_twice_builds_once(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert fsmc("build", JOB, JOB, "--out", tmp_path / "out").code == 0


# --- fitting the toolchain (issue 12) ----------------------------------------------


def test_build_check_in_github_format_annotates_every_stale_missing_or_orphan_file(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    fsmc("build", JOB, "--out", out)
    (out / "job" / "job.mmd").write_text("stale\n")
    (out / "job" / "job.sql").unlink()
    (out / "job" / "fsm_old.py").write_text("# Code generated by fsmc from specs/job.yaml. DO NOT EDIT.\n")
    ran = fsmc("build", JOB, "--out", out, "--check", "--format", "github")
    assert ran.code == 1
    shown = out.as_posix().replace(":", "%3A").replace(",", "%2C")
    assert sorted(ran.out.splitlines()) == [
        f"::error file={shown}/job/fsm_old.py,title=fsmc build --check%3A orphan::"
        f"{out.as_posix()}/job/fsm_old.py was generated for a machine the specs no longer "
        "define; run fsmc build to remove it",
        f"::error file={shown}/job/job.mmd,title=fsmc build --check%3A stale::"
        f"{out.as_posix()}/job/job.mmd differs from what fsmc build generates; run fsmc build",
        f"::error file={shown}/job/job.sql,title=fsmc build --check%3A missing::"
        f"{out.as_posix()}/job/job.sql is missing; run fsmc build",
    ]
    assert "+++ b/" in ran.err  # the diff is still there, for people reading the log


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["chek", "x.yaml"], "fsmc: error: unknown command 'chek'; did you mean 'check'?"),
        (["biuld"], "fsmc: error: unknown command 'biuld'; did you mean 'build'?"),
        (["zzz"], "fsmc: error: unknown command 'zzz' (commands: check, build, graph, diff, migrate, roles, schema)"),
    ],
)
def test_an_unknown_command_is_named_with_the_closest_one(argv, message, capsys) -> None:  # type: ignore[no-untyped-def]
    from fsmc.cli import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err
    assert raised.value.code == 2 and err.splitlines()[-1] == message, err


@pytest.mark.parametrize("command", ["check", "build", "graph"])
def test_an_unknown_option_prints_the_commands_usage(command, capsys) -> None:  # type: ignore[no-untyped-def]
    from fsmc.cli import main

    with pytest.raises(SystemExit) as raised:
        main([command, str(JOB), "--bogus"])
    err = capsys.readouterr().err
    assert raised.value.code == 2
    assert err.startswith(f"usage: fsmc {command} "), err
    assert err.splitlines()[-1] == f"fsmc {command}: error: unrecognized arguments: --bogus"


@pytest.mark.slow
def test_a_read_only_output_folder_names_the_file_not_a_temporary_one(tmp_path) -> None:
    out = tmp_path / "out"
    spec = write(tmp_path, "job.yaml", JOB.read_text())
    run = [sys.executable, "-m", "fsmc", "build", "job.yaml", "--out", "out"]
    assert subprocess.run(run, cwd=tmp_path, check=False).returncode == 0
    spec.write_text(JOB.read_text().replace("  queued: accepted", "  queued: accepted, waiting"))
    if os.geteuid() == 0:  # root ignores file modes unless it gives up that power
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a folder read-only")
        run = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *run]
    (out / "job").chmod(0o555)
    out.chmod(0o555)
    try:
        done = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, check=False)
    finally:
        out.chmod(0o755)
        (out / "job").chmod(0o755)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr.startswith("fsmc: error: cannot write out/job/"), done.stderr
    assert done.stderr.endswith(": Permission denied\n") and ".fsmc-" not in done.stderr, done.stderr


def test_a_file_that_is_not_a_spec_gets_one_short_diagnostic(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    passwd = write(tmp_path, "passwd", "".join(
        f"user{i}:x:{1000 + i}:{1000 + i}:User {i}:/home/user{i}:/bin/bash\n" for i in range(300)
    ))  # fmt: skip
    for target in (passwd, Path("/etc/passwd")):
        if not target.exists():
            continue
        ran = fsmc("check", target)
        assert ran.code == 1 and ran.err == "", ran
        (line,) = ran.out.splitlines()
        assert line.startswith(f"{target}:1:1: error: ") and line.endswith("[schema]"), line
        assert "expected a mapping" in line and "characters)" in line and len(line) < 250, line


def test_renaming_a_machine_removes_the_folder_build_emptied(fsmc, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    task = (SPECS / "task.yaml").read_text()
    write(tmp_path, "task.yaml", task)
    write(tmp_path, "job.yaml", JOB.read_text())
    assert fsmc("build", "task.yaml", "job.yaml").code == 0
    (tmp_path / "generated" / "task" / "__pycache__").mkdir()  # pytest ran there
    (tmp_path / "generated" / "task" / "__pycache__" / "fsm_task.cpython-311.pyc").write_bytes(b"")
    (tmp_path / "generated" / "job" / "NOTES.md").write_text("mine\n")
    write(tmp_path, "task.yaml", task.replace("machine: task", "machine: chore"))
    write(tmp_path, "job.yaml", JOB.read_text().replace("machine: job", "machine: work"))
    ran = fsmc("build", "task.yaml", "job.yaml")
    assert (ran.code, ran.out, ran.err) == (0, "", ""), ran
    # Build emptied generated/task/ (caches aside): gone. generated/job/ still holds
    # the user's note: kept, with only the note in it.
    assert sorted(p.name for p in (tmp_path / "generated").iterdir()) == ["chore", "job", "work"]
    assert [p.name for p in (tmp_path / "generated" / "job").iterdir()] == ["NOTES.md"]
    assert fsmc("build", "task.yaml", "job.yaml", "--check").code == 0


@pytest.mark.parametrize("where", ["specs", "elsewhere"])
def test_building_outside_the_specs_repository_does_not_call_earlier_specs_gone(  # type: ignore[no-untyped-def]
    fsmc, tmp_path, monkeypatch, where
) -> None:
    # Issue 23: headers record a spec's path relative to its repository's root; the
    # warning judged it against the output's repository, or the working directory.
    repo, out = tmp_path / "repo", tmp_path / "out"
    (repo / ".git").mkdir(parents=True)
    (repo / "specs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    write(repo / "specs", "job.yaml", JOB.read_text())
    write(repo / "specs", "runner.yaml", (SPECS / "runner.yaml").read_text())
    monkeypatch.chdir(repo / "specs" if where == "specs" else tmp_path / "elsewhere")
    job, runner = repo / "specs" / "job.yaml", repo / "specs" / "runner.yaml"
    assert fsmc("build", job, "--out", out).code == 0
    assert (out / "job" / "fsm_job.py").read_text().startswith(
        "# Code generated by fsmc from specs/job.yaml. DO NOT EDIT."
    )
    for argv in (("build", runner, "--out", out), ("build", runner, "--out", out, "--check")):
        ran = fsmc(*argv)
        assert (ran.code, ran.err) == (0, ""), argv
    # A spec that is really gone is still named.
    job.unlink()
    ran = fsmc("build", runner, "--out", out)
    assert ran.code == 0
    assert "job/ (from specs/job.yaml) was generated from a spec that no longer exists" in ran.err


def test_the_migrate_scripts_header_keeps_the_revisions_of_its_arguments(tmp_path, monkeypatch, fsmc) -> None:  # type: ignore[no-untyped-def]
    # Issue 23: `fsmc migrate HEAD~1:specs/job.yaml specs/job.yaml` said "from
    # specs/job.yaml to specs/job.yaml".
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs" / "job.yaml"
    spec.write_text(JOB.read_text())
    _git(tmp_path, "add", "specs/job.yaml")
    _git(tmp_path, "commit", "-qm", "v1")
    # v2 adds a transition, so the two specs build different schemas.
    added = "  - {from: queued, event: abandon, to: abandoned}\nlease:\n"
    spec.write_text(JOB.read_text().replace("lease:\n", added))
    _git(tmp_path, "add", "specs/job.yaml")
    _git(tmp_path, "commit", "-qm", "v2")
    monkeypatch.chdir(tmp_path / "specs")
    for old, new, shown in (
        ("HEAD~1:specs/job.yaml", "job.yaml", "from HEAD~1:specs/job.yaml to specs/job.yaml."),
        ("HEAD~1:specs/job.yaml", "HEAD:specs/job.yaml", "from HEAD~1:specs/job.yaml to HEAD:specs/job.yaml."),
    ):
        ran = fsmc("migrate", old, new)
        assert ran.code == 0, ran.err
        assert ran.out.splitlines()[0] == f"-- Code generated by fsmc migrate {shown} DO NOT EDIT.", ran.out[:300]
    # A file keeps the path its build's headers record (relative to the repository).
    ran = fsmc("migrate", "HEAD~1:specs/job.yaml", str(spec))
    assert ran.out.startswith("-- Code generated by fsmc migrate from HEAD~1:specs/job.yaml to specs/job.yaml.")
