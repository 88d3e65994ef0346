"""fsmc diff (contract section 5): golden cases, exit codes, refusals, REV:PATH, colour.

Each folder of tests/diff_cases/ is one case: old.yaml and new.yaml, and what
`fsmc diff old.yaml new.yaml` prints in each format (expected.txt, expected.md,
expected.json) and its exit status (expected.exit), compared byte for byte.
`FSMC_UPDATE_GOLDEN=1 python -m pytest tests/test_diff.py` rewrites the expected
files from the current output; read `git diff tests/diff_cases` before committing.
The facts a regenerated golden could silently get wrong (exit status, breaking,
which changes a case holds) are also asserted here by hand, in `FACTS`.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fsmc.diff import Changes, Value, compare
from fsmc.diff_render import as_text
from fsmc.model import Machine
from fsmc.pipeline import check
from fsmc.source import read
from fsmc.targets.postgres.model import Column
from tests.conftest import ROOT

CASES = ROOT / "tests" / "diff_cases"
FORMATS = {"text": "expected.txt", "markdown": "expected.md", "json": "expected.json"}
UPDATE = bool(os.environ.get("FSMC_UPDATE_GOLDEN"))

# case -> (exit status, breaking, the kinds of change it holds). Written by hand, so
# that regenerating the goldens cannot quietly change what a case means.
FACTS: dict[str, tuple[int, bool, set[str]]] = {
    "identical": (0, False, set()),
    "reordered_only": (0, False, set()),
    "descriptions_only": (0, False, set()),
    "hostile_descriptions": (0, False, set()),
    "added_state": (1, False, {"states+", "events+", "transitions+"}),
    "new_terminal": (1, False, {"states+", "events+", "terminals+", "transitions+"}),
    "made_terminal": (1, True, {"events-", "terminals+", "transitions-"}),
    "changed_initial": (1, True, {"initial"}),
    "removed_transition": (1, True, {"transitions-"}),
    "retargeted_transition": (1, True, {"transitions~"}),
    "removed_state": (1, True, {"states-", "events-", "transitions-"}),
    "removed_event": (1, True, {"events-", "transitions-"}),
    "renamed_state": (1, True, {"states+", "states-", "terminals+", "terminals-", "transitions~"}),
    "changed_options": (1, True, {"options"}),
    "added_lease": (1, False, {"options"}),
    # Language 1.1: `"*"` for a from list, a `to` list of one, 3.0 for 3: no change.
    "wildcard_rewrite": (0, False, set()),
    "choices_and_caps": (1, True, {"choices", "options", "transitions+"}),
    # Issue 23: `to: approved` becoming `to: [approved, rejected]` adds an edge.
    "became_a_choice": (1, True, {"choices", "transitions+"}),
    # Language 1.2: a row may now be born in `scheduled` too (compatible), and purge
    # now deletes `completed` rows it used to keep (breaking).
    "initials_and_purgeable": (1, True, {"options"}),
    # A cap per row, a spent budget's otherwise (where the old spec discarded at once),
    # and revives that give the budget back.
    "budgets": (1, True, {"transitions~", "options"}),
    # Timed transitions: a due_at, a delay and a backoff (each a new wait: breaking).
    "timed": (1, True, {"events+", "transitions+", "transitions-", "options"}),
    "limits": (1, True, {"options"}),
    # Declared columns (issue 24): removed, retyped or made NOT NULL breaks; added, a
    # default changed or NULL allowed does not; a column moved is no change.
    "columns": (1, True, {"options"}),
    "columns_added": (1, False, {"options"}),
    # 1.2's claim: a column a claim may be limited to added (compatible), an order
    # where claims took the oldest first (breaking).
    "claim": (1, True, {"options"}),
    # Wake-ups: an event added to postgres.notify (compatible, as every notify change).
    "notify": (1, False, {"options"}),
    "mermaid_keywords": (
        1,
        True,
        {"states+", "states-", "transitions+", "transitions-", "transitions~"},
    ),
}


def case_names() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if p.is_dir())


def machine(path: Path | str) -> Machine:
    checked = check(read(str(path)))
    assert checked.ok() and checked.machine is not None, checked.diagnostics
    return checked.machine


def changes_of(case: str) -> Changes:
    return compare(machine(CASES / case / "old.yaml"), machine(CASES / case / "new.yaml"))


def kinds(c: Changes) -> set[str]:
    found = set()
    for kind, names in (("states", c.states), ("events", c.events), ("terminals", c.terminals)):
        found |= {kind + "+"} if names.added else set()
        found |= {kind + "-"} if names.removed else set()
    found |= {"transitions+"} if c.added else set()
    found |= {"transitions-"} if c.removed else set()
    found |= {"transitions~"} if c.retargeted else set()
    found |= {"initial"} if c.initial else set()
    found |= {"options"} if c.options else set()
    found |= {"choices"} if c.choices else set()
    return found


def test_every_case_folder_has_facts_and_every_fact_a_folder() -> None:
    assert case_names() == sorted(FACTS)


@pytest.mark.parametrize("case", sorted(FACTS))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_golden(case: str, fmt: str, fsmc) -> None:  # type: ignore[no-untyped-def]
    folder = CASES / case
    ran = fsmc("diff", folder / "old.yaml", folder / "new.yaml", "--format", fmt)
    assert ran.err == ""
    expected, exit_file = folder / FORMATS[fmt], folder / "expected.exit"
    if UPDATE:
        expected.write_bytes(ran.out.encode())
        exit_file.write_text(f"{ran.code}\n")
    assert ran.out.encode() == expected.read_bytes()
    assert ran.code == int(exit_file.read_text())


@pytest.mark.parametrize("case", sorted(FACTS))
def test_facts(case: str) -> None:
    code, breaking, expected_kinds = FACTS[case]
    c = changes_of(case)
    assert (int(not c.same), c.breaking, kinds(c)) == (code, breaking, expected_kinds)
    assert int((CASES / case / "expected.exit").read_text()) == code
    doc = json.loads((CASES / case / "expected.json").read_text())
    assert doc["breaking"] is breaking


def test_a_limit_added_or_lowered_breaks_one_raised_or_removed_does_not() -> None:
    found = {o.name: (o.old, o.new, o.breaking) for o in changes_of("limits").options}
    assert found == {
        "limits.running": (50, 20, True),
        "limits.paused": (None, 30, True),
        "limits.claimed": (40, None, False),
    }


def test_descriptions_are_listed_apart_and_never_count() -> None:
    c = changes_of("descriptions_only")
    d = c.descriptions
    assert d.machine is not None and d.machine.new == "Lifecycle of a background job in relayd."
    assert [(x.name, x.old, x.new) for x in d.states] == [
        ("running", "actively executing", "a worker is executing it"),
        ("failed", "the machinery broke; may be retried", None),
    ]
    assert [(x.name, x.old, x.new) for x in d.events] == [
        ("finish", None, "the work ran to completion")
    ]
    assert [(x.source, x.event, x.new) for x in d.transitions] == [
        ("running", "pause", "an operator or supervisor halts it")
    ]
    assert c.same and c.count == 0
    assert not changes_of("reordered_only").descriptions


def test_breaking_rules_of_the_contract() -> None:
    # Removing a state, an event or a transition, retargeting, changing the initial
    # state and making an existing state terminal are breaking; additions are not.
    removed = changes_of("removed_state")
    assert all(n.breaking for n in removed.states.removed + removed.events.removed)
    assert all(e.breaking for e in removed.removed)
    assert all(r.breaking for r in changes_of("retargeted_transition").retargeted)
    initial = changes_of("changed_initial").initial
    assert initial is not None and (initial.old, initial.new, initial.breaking) == (
        "queued",
        "running",
        True,
    )
    made = changes_of("made_terminal").terminals.added
    assert [(n.name, n.breaking) for n in made] == [("paused", True)]
    new = changes_of("new_terminal")
    assert [(n.name, n.breaking) for n in new.terminals.added] == [("cancelled", False)]
    added = changes_of("added_state")
    assert not added.breaking and added.count == 4
    # A terminal that stops being one only gains transitions: compatible by itself.
    renamed = changes_of("renamed_state")
    assert [(n.name, n.breaking) for n in renamed.terminals.removed] == [("abandoned", False)]


def test_order_is_new_spec_order_then_old_for_removed() -> None:
    added = changes_of("added_state")
    assert [(e.source, e.event) for e in added.added] == [("queued", "claim"), ("claimed", "start")]
    removed = changes_of("removed_state")
    assert [(e.source, e.event) for e in removed.removed] == [
        ("running", "pause"),
        ("paused", "resume"),
        ("paused", "abandon"),
    ]
    assert [n.name for n in removed.events.removed] == ["pause", "resume"]


@pytest.mark.parametrize("case", sorted(FACTS))
def test_swapping_old_and_new_swaps_every_change(case: str) -> None:
    old, new = machine(CASES / case / "old.yaml"), machine(CASES / case / "new.yaml")
    forth, back = compare(old, new), compare(new, old)
    for a, b in ((forth.states, back.states), (forth.events, back.events)):
        assert [n.name for n in a.added] == [n.name for n in b.removed]
        assert [n.name for n in a.removed] == [n.name for n in b.added]
    assert {n.name for n in forth.terminals.added} == {n.name for n in back.terminals.removed}
    assert {(e.source, e.event, e.target) for e in forth.added} == {
        (e.source, e.event, e.target) for e in back.removed
    }
    assert {(r.source, r.event, r.old_target, r.new_target) for r in forth.retargeted} == {
        (r.source, r.event, r.new_target, r.old_target) for r in back.retargeted
    }
    assert (forth.initial is None) == (back.initial is None)
    assert forth.count == back.count


def test_json_has_exactly_the_contract_keys() -> None:
    for case in FACTS:
        doc = json.loads((CASES / case / "expected.json").read_text())
        assert list(doc) == [
            "states",
            "events",
            "terminals",
            "transitions",
            "initial",
            "options",
            "choices",
            "breaking",
            "descriptions",
            "notes",  # fsmc's own addition, after the contract's keys
        ]
        for item in doc["notes"]:
            assert list(item) == ["about", "names", "text"]
        for key in ("states", "events", "terminals"):
            assert list(doc[key]) == ["added", "removed"]
        assert list(doc["transitions"]) == ["added", "removed", "retargeted"]
        for item in doc["transitions"]["added"] + doc["transitions"]["removed"]:
            assert list(item) == ["from", "event", "to", "breaking"]
        for item in doc["transitions"]["retargeted"]:
            assert list(item) == ["from", "event", "old_to", "new_to", "breaking"]
        assert doc["initial"] is None or list(doc["initial"]) == ["old", "new"]
        for item in doc["options"]:
            assert list(item) == ["name", "old", "new", "breaking"]
        for item in doc["choices"]:
            assert list(item) == ["from", "event", "old_to", "new_to", "breaking"]
    doc = json.loads((CASES / "changed_initial" / "expected.json").read_text())
    assert doc["initial"] == {"old": "queued", "new": "running"}


def test_text_and_markdown_cannot_be_driven_by_descriptions() -> None:
    text = (CASES / "hostile_descriptions" / "expected.txt").read_text()
    assert "\x1b" not in text and "\u202e" not in text
    assert len(text.splitlines()) == 5  # summary, blank, heading, one line per description
    md = (CASES / "hostile_descriptions" / "expected.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    # Each row has exactly four unescaped pipes: a description cannot add a cell.
    assert all(len(re.findall(r"(?<!\\)\|", row)) == 4 for row in rows)
    assert "<script>" not in md and "\x1b" not in md


# --- refusals and exit codes --------------------------------------------------------


def test_a_missing_file_is_trouble(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ran = fsmc("diff", CASES / "identical" / "old.yaml", tmp_path / "nope.yaml")
    assert (ran.code, ran.out) == (2, "")
    assert ran.err == f"fsmc: error: {tmp_path / 'nope.yaml'}: no such file\n"


def test_a_spec_with_errors_is_trouble_and_its_diagnostics_go_to_stderr(  # type: ignore[no-untyped-def]
    fsmc, tmp_path
) -> None:
    good = CASES / "identical" / "old.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("to: completed}", "to: complete}"))
    ran = fsmc("diff", good, bad)
    assert (ran.code, ran.out) == (2, "")
    lines = ran.err.splitlines()
    assert lines[0].startswith(f"{bad}:") and lines[0].endswith("[unknown-state]")
    assert "did you mean 'completed'?" in lines[0]
    assert lines[-1] == f"fsmc: error: cannot compare: {bad} has errors"
    ran = fsmc("diff", bad, bad, "--format", "json")
    assert (ran.code, ran.out) == (2, "")
    assert ran.err.splitlines()[-1] == f"fsmc: error: cannot compare: {bad} and {bad} have errors"


def test_a_renamed_machine_is_an_error_not_a_diff(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    old = CASES / "identical" / "old.yaml"
    new = tmp_path / "task.yaml"
    new.write_text(old.read_text().replace("machine: job", "machine: task"))
    ran = fsmc("diff", old, new, "--format", "json")
    assert (ran.code, ran.out) == (2, "")
    assert ran.err == (
        f"fsmc: error: {old} defines machine 'job' but {new} defines 'task': diff "
        "compares two versions of one machine, and a renamed machine is a new one "
        "(new module, tables and functions)\n"
    )


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_rev_path_reads_old_from_git(tmp_path, monkeypatch, fsmc) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("git") is None:
        pytest.fail("git is required")
    case = CASES / "retargeted_transition"
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "spec.yaml").write_bytes((case / "old.yaml").read_bytes())
    _git(tmp_path, "add", "spec.yaml")
    _git(tmp_path, "commit", "-qm", "v1")
    (tmp_path / "spec.yaml").write_bytes((case / "new.yaml").read_bytes())
    monkeypatch.chdir(tmp_path)
    ran = fsmc("diff", "HEAD:spec.yaml", "spec.yaml", "--format", "json")
    assert (ran.code, ran.err) == (1, "")
    assert ran.out == (case / "expected.json").read_text()
    ran = fsmc("diff", "HEAD:spec.yaml", "HEAD:spec.yaml")
    assert (ran.code, ran.out, ran.err) == (0, "machine job: no changes\n", "")
    ran = fsmc("diff", "HEAD~3:spec.yaml", "spec.yaml")
    assert ran.code == 2 and ran.out == ""
    assert ran.err.startswith("fsmc: error: HEAD~3:spec.yaml:")


@pytest.mark.slow
def test_the_command_as_a_subprocess() -> None:
    case = CASES / "removed_state"
    done = subprocess.run(
        [sys.executable, "-m", "fsmc", "diff", "old.yaml", "new.yaml", "--format", "markdown"],
        cwd=case,
        capture_output=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (1, b"")
    assert done.stdout == (case / "expected.md").read_bytes()


# --- colour -------------------------------------------------------------------------

_ANSI = re.compile("\x1b\\[[0-9;]*m")


def test_colour_only_decorates_the_plain_text() -> None:
    c = changes_of("removed_state")
    coloured = as_text(c, color=True)
    assert "\x1b[" in coloured
    assert _ANSI.sub("", coloured) == as_text(c, color=False)


def _on_a_tty(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run fsmc with stdout on a pseudo-terminal; its exit status and what it wrote."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsmc", *args], stdout=child, stderr=subprocess.PIPE, env=env
    )
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    return proc.wait(timeout=60), b"".join(chunks).decode()


@pytest.mark.slow
def test_colour_on_a_tty_unless_no_color() -> None:
    case = CASES / "removed_state"
    args = ["diff", str(case / "old.yaml"), str(case / "new.yaml")]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    code, out = _on_a_tty(args, env)
    assert code == 1 and "\x1b[31m" in out
    plain = (case / "expected.txt").read_text()
    assert _ANSI.sub("", out).replace("\r\n", "\n") == plain
    code, out = _on_a_tty(args, {**env, "NO_COLOR": "1"})
    assert code == 1 and "\x1b" not in out
    assert out.replace("\r\n", "\n") == plain


# --- real Mermaid -------------------------------------------------------------------


@pytest.mark.slow
def test_the_markdown_diagram_parses_in_real_mermaid_and_draws_the_changes() -> None:
    from tests.mermaid_check import mermaid_blocks, parse_all

    cases = [case for case in sorted(FACTS) if FACTS[case][0] == 1]
    blocks = [mermaid_blocks((CASES / case / "expected.md").read_text()) for case in cases]
    assert all(len(b) == 1 for b in blocks), "one diagram per diff with changes"
    for case, result in zip(cases, parse_all([b[0] for b in blocks]), strict=True):
        assert result.is_state_diagram, (case, result.error)
        c = changes_of(case)
        removed_states = [n.name for n in c.states.removed]
        assert sorted(result.state_labels) == sorted([*c.new.states, *removed_states]), case
        added = {(e.source, e.event, e.target) for e in c.added}
        was = {(r.source, r.event): r.old_target for r in c.retargeted}
        chose = {(x.source, x.event): ", ".join(x.old_targets) for x in c.choices}
        expected = {("[*]", s, "") for s in c.new.initials} | {(s, "[*]", "") for s in c.new.terminals}
        for s, e, t in c.new.edges:
            if (s, e, t) in added:
                expected.add((s, t, f"{e} (added)"))
            elif (s, e) in was:
                expected.add((s, t, f"{e} (retargeted, was {was[s, e]})"))
            elif (s, e) in chose:
                expected.add((s, t, f"{e} (choice, was {chose[s, e]})"))
            else:
                expected.add((s, t, e))
        expected |= {(e.source, e.target, f"{e.event} (removed)") for e in c.removed}
        assert set(result.edges) == expected, case
        assert len(result.edges) == len(expected), case


def test_lease_states_in_another_order_are_no_change(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    job = (ROOT / "specs" / "job.yaml").read_text()
    assert "  states: [claimed, running]\n" in job
    new = tmp_path / "job.yaml"
    new.write_text(job.replace("  states: [claimed, running]\n", "  states: [running, claimed]\n"))
    ran = fsmc("diff", ROOT / "specs" / "job.yaml", new)
    assert (ran.code, ran.out) == (0, "machine job: no changes\n")
    assert fsmc("migrate", ROOT / "specs" / "job.yaml", new).out == ""


def test_choices_and_caps_say_what_breaks() -> None:
    c = changes_of("choices_and_caps")
    assert [(x.source, x.event, x.old_targets, x.new_targets, x.breaking) for x in c.choices] == [
        ("running", "finish", ("done",), ("done", "failed"), True),  # callers must now say `to`
        ("running", "check", ("running", "failed"), ("running", "failed", "dead"), False),
        ("failed", "retry", ("queued",), ("queued", "running"), True),
    ]
    # The expanded table gains one transition per target a choice gains.
    assert [(e.source, e.event, e.target, e.breaking) for e in c.added] == [
        ("running", "finish", "failed", False),
        ("running", "check", "dead", False),
        ("failed", "retry", "running", False),
    ]
    assert (c.removed, c.retargeted) == ((), ())
    assert [(o.name, o.old, o.new, o.breaking) for o in c.options] == [
        ("caps.start", 10, 20, False),  # raised
        ("caps.finish", None, 2, True),  # added
        ("caps.retry", 5, 3, True),  # lowered
        ("caps.give_up", 1, None, False),  # removed
    ]
    doc = json.loads((CASES / "choices_and_caps" / "expected.json").read_text())
    assert doc["choices"][0] == {
        "from": "running", "event": "finish", "old_to": ["done"], "new_to": ["done", "failed"],
        "breaking": True,
    }  # fmt: skip
    assert {"name": "caps.retry", "old": 5, "new": 3, "breaking": True} in doc["options"]


def test_a_choice_losing_a_target_is_breaking_and_back_to_single_too() -> None:
    old = CASES / "choices_and_caps" / "new.yaml"
    back = compare(machine(old), machine(CASES / "choices_and_caps" / "old.yaml"))
    by_pair = {(x.source, x.event): x.breaking for x in back.choices}
    assert by_pair == {("running", "finish"): True, ("running", "check"): True, ("failed", "retry"): True}
    # ... and each target a choice loses is a removed transition, breaking.
    assert [(e.source, e.event, e.target, e.breaking) for e in back.removed] == [
        ("running", "finish", "failed", True),
        ("running", "check", "dead", True),
        ("failed", "retry", "running", True),
    ]
    assert back.added == ()


def test_a_single_target_becoming_a_choice_adds_the_new_edge_in_every_format(fsmc) -> None:  # type: ignore[no-untyped-def]
    # Issue 23: a reviewer who reads only `transitions` must see the new edge.
    folder = CASES / "became_a_choice"
    old, new = folder / "old.yaml", folder / "new.yaml"
    doc = json.loads(fsmc("diff", old, new, "--format", "json").out)
    assert doc["transitions"]["added"] == [
        {"from": "in_review", "event": "decide", "to": "rejected", "breaking": False}
    ]
    assert [(c["old_to"], c["new_to"], c["breaking"]) for c in doc["choices"]] == [
        (["approved"], ["approved", "rejected"], True)
    ]
    text = fsmc("diff", old, new).out
    assert "+ transition  in_review --decide--> rejected\n" in text
    markdown = fsmc("diff", old, new, "--format", "markdown").out
    assert "| transition added | `in_review --decide--> rejected` | compatible |" in markdown
    assert "in_review --> rejected: decide (added)" in markdown
    assert "in_review --> approved: decide (choice, was approved)" in markdown


def test_an_added_state_says_what_it_means_for_code_already_deployed(fsmc) -> None:  # type: ignore[no-untyped-def]
    # Issue 23: compatible for the database, but the old module's get() raises
    # ValueError on a row in the new state; the diff says so, and in which order
    # to roll out code and migration.
    folder = CASES / "added_state"
    old, new = folder / "old.yaml", folder / "new.yaml"
    c = changes_of("added_state")
    assert not c.breaking and [n.name for n in c.states.added] == ["claimed"]
    assert [(n.about, n.names) for n in c.notes] == [("states.added", ("claimed",))]
    text = c.notes[0].text
    assert "ValueError: unknown job state 'claimed'" in text
    assert "roll out the new code everywhere first, then the migration" in text
    assert f"\nnote: {text}\n" in fsmc("diff", old, new).out
    assert f"\n**Note:** {text}\n" in fsmc("diff", old, new, "--format", "markdown").out
    doc = json.loads(fsmc("diff", old, new, "--format", "json").out)
    assert doc["notes"] == [{"about": "states.added", "names": ["claimed"], "text": text}]
    # The notes are not changes: the count and the exit status are the same.
    assert c.count == 4 and fsmc("diff", old, new).code == 1
    # No state added, no note of one.
    assert all(not [n for n in changes_of(case).notes if n.about == "states.added"]
               for case in FACTS if not changes_of(case).states.added)  # fmt: skip
    assert json.loads(fsmc("diff", old, old, "--format", "json").out)["notes"] == []


def test_an_added_state_beside_a_new_cap_is_released_on_its_own_first(tmp_path) -> None:
    # A new cap's count column must exist before the new code reads a row: the
    # opposite order from the added state's, so the note says to split the release.
    folder = CASES / "added_state"
    capped = (folder / "new.yaml").read_text() + "caps: {retry: 3}\n"
    (tmp_path / "new.yaml").write_text(capped)
    c = compare(machine(folder / "old.yaml"), machine(tmp_path / "new.yaml"))
    (note,) = c.notes
    assert note.text.endswith(
        "; but 'caps.retry' needs the migration before the new code can read a row, so "
        "release the new state on its own first"
    )
    two = capped.replace("  claimed: a worker reserved it\n", "  claimed: a worker reserved it\n  held:\n")
    two = two.replace("  - {from: queued, event: claim, to: claimed}\n",
                      "  - {from: queued, event: claim, to: [claimed, held]}\n"
                      "  - {from: held, event: start, to: running}\n")  # fmt: skip
    (tmp_path / "two.yaml").write_text(two)
    (note,) = compare(machine(folder / "old.yaml"), machine(tmp_path / "two.yaml")).notes
    assert note.names == ("claimed", "held")
    assert note.text.startswith("code built from the old spec cannot read a row in the new states 'claimed' or 'held' ")
    assert note.text.endswith("release the new states on their own first")


def test_declared_columns_say_what_breaks_each_as_its_table_declares_it() -> None:
    def declared(value: Value) -> str | None:
        assert value is None or isinstance(value, Column)  # a column's value is its Column
        return None if value is None else value.declaration

    found = {o.name: (declared(o.old), declared(o.new), o.breaking) for o in changes_of("columns").options}
    assert found == {
        "postgres.columns.queue": ("text NOT NULL DEFAULT 'default'", "text NOT NULL DEFAULT 'emails'", False),
        "postgres.columns.priority": ("smallint NOT NULL DEFAULT 0", "integer NOT NULL DEFAULT 0", True),
        "postgres.columns.note": ("text", "text NOT NULL DEFAULT ''", True),
        "postgres.columns.owner": ("text NOT NULL DEFAULT 'nobody'", "text DEFAULT 'nobody'", False),
        "postgres.columns.deadline": (None, "timestamptz", False),
        "postgres.columns.attempts": (None, "integer NOT NULL DEFAULT 3", False),
        "postgres.columns.args": ("jsonb", None, True),
    }
    # `tags` only moved: no change, in the diff as in the digest (the migration's "same").
    old, new = machine(CASES / "columns" / "old.yaml"), machine(CASES / "columns" / "new.yaml")
    assert [str(c.name) for c in old.postgres.columns].index("tags") != [str(c.name) for c in new.postgres.columns].index("tags")
    text = (CASES / "columns" / "expected.txt").read_text()
    assert "+ column  postgres.columns.attempts (integer NOT NULL DEFAULT 3)\n" in text
    assert "- column  postgres.columns.args (was jsonb)" in text and "tags" not in text


def test_declared_columns_added_or_removed_say_which_goes_out_first(fsmc) -> None:  # type: ignore[no-untyped-def]
    # Each module names the columns it reads: a column must exist before the code that
    # reads it, and outlive the code that does.
    (added, removed) = changes_of("columns").notes
    assert (added.about, added.names, removed.about, removed.names) == (
        "columns.added", ("deadline", "attempts"), "columns.removed", ("args",))  # fmt: skip
    assert "run the migration first, then roll out the new code" in added.text
    assert "roll out the new code everywhere first, then the migration, which drops it" in removed.text
    (only,) = changes_of("columns_added").notes
    assert only.about == "columns.added" and only.names == ("args", "queue")
    folder = CASES / "columns_added"
    assert f"\nnote: {only.text}\n" in fsmc("diff", folder / "old.yaml", folder / "new.yaml").out
    # Beside an added state (whose new code must go out first), the state waits for a
    # release of its own.
    state = CASES / "added_state"
    both = compare(machine(state / "old.yaml"), machine(state / "new.yaml"))
    assert [n.about for n in both.notes] == ["states.added"]
    grown = compare(machine(CASES / "columns_added" / "old.yaml"), machine(CASES / "columns_added" / "new.yaml"))
    assert not grown.breaking and grown.count == 2


def test_a_column_added_beside_a_new_state_releases_the_state_on_its_own_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = CASES / "added_state"
    text = (folder / "new.yaml").read_text()
    assert "postgres:" not in text
    (tmp_path / "new.yaml").write_text(text + "postgres:\n  columns:\n    args: jsonb\n")
    c = compare(machine(folder / "old.yaml"), machine(tmp_path / "new.yaml"))
    assert [n.about for n in c.notes] == ["states.added", "columns.added"]
    assert c.notes[0].text.endswith(
        "; but 'postgres.columns.args' needs the migration before the new code can read a row, so "
        "release the new state on its own first"
    )


def test_a_default_cannot_break_a_line_or_drive_a_terminal(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A text default is free text: shown as a SQL literal that escapes what is not
    # printable, in the diff as in a migration script's header (a comment line, which a
    # newline would end, leaving the rest of the default to run as SQL).
    from fsmc.migrate import migrate

    folder = CASES / "columns_added"
    hostile = "a'b\\\nDROP TABLE jobs; --\x1b[31m\u202e"
    text = (folder / "new.yaml").read_text().replace("default: default}", f"default: {json.dumps(hostile)}}}")
    assert hostile not in text and json.dumps(hostile) in text
    (tmp_path / "new.yaml").write_text(text)
    [queue] = [o for o in compare(machine(folder / "old.yaml"), machine(tmp_path / "new.yaml")).options
               if o.name.endswith(".queue")]  # fmt: skip
    assert isinstance(queue.new, Column)
    assert queue.new.declaration == "text NOT NULL DEFAULT E'a''b\\\\\\nDROP TABLE jobs; --\\x1b[31m\\u202e'"
    for fmt in FORMATS:
        out = fsmc("diff", folder / "old.yaml", tmp_path / "new.yaml", "--format", fmt).out
        assert "\x1b" not in out and "\u202e" not in out and "\nDROP" not in out, fmt
    script = migrate(machine(folder / "old.yaml"), machine(tmp_path / "new.yaml"))
    assert "\x1b" not in script and "\nDROP TABLE jobs" not in script
    assert "ADD COLUMN queue text NOT NULL DEFAULT E'a''b\\\\\\nDROP TABLE jobs; --\\x1b[31m\\u202e';" in script
    assert all(line.startswith("--") for line in script.partition("\nBEGIN;\n")[0].splitlines() if line)


def test_a_claim_limited_to_more_columns_is_compatible_one_limited_to_fewer_or_reordered_is_not(tmp_path: Path) -> None:
    found = {o.name: (o.old, o.new, o.breaking) for o in changes_of("claim").options}
    assert found == {"postgres.claim.by": (("queue",), ("queue", "kind"), False),
                     "postgres.claim.order": (None, "priority", True)}  # fmt: skip
    old, new = machine(CASES / "claim" / "old.yaml"), machine(CASES / "claim" / "new.yaml")
    assert {o.name: o.breaking for o in compare(new, old).options} == {
        "postgres.claim.by": True, "postgres.claim.order": True}  # fmt: skip
    # A column put before the others moves theirs, as a reorder does: the old module's
    # positional call would pass its queue as the kind (compared by the diff alone).
    before = tmp_path / "before.yaml"
    before.write_text((CASES / "claim" / "new.yaml").read_text().replace("by: [queue, kind]", "by: [kind, queue]"))
    first = compare(old, machine(before)).options
    assert [(o.name, o.old, o.new, o.breaking) for o in first if o.name == "postgres.claim.by"] == [
        ("postgres.claim.by", ("queue",), ("kind", "queue"), True)]  # fmt: skip



# --- option values in JSON (issue 31) ------------------------------------------------

# Each option whose value is a list of names: (the options it names, the spec, the spec's
# own line, that line with fewer names, with more, and with the more reordered), and
# whether a name added, and one removed, is breaking (contract section 5).
REVIVE = "  - {from: [completed, cancelled, discarded], event: revive, to: available, reset: [fetch]}\n"
LISTS: dict[str, tuple[tuple[str, ...], str, str, list[str], list[str], list[str], bool, bool]] = {
    "initials": (("initials",), "queue", "initial: [available, scheduled]",
                 ["available", "scheduled"], ["available", "scheduled", "retryable"],
                 ["retryable", "available", "scheduled"], False, True),
    "purgeable": (("purgeable",), "queue", "purgeable: [completed, cancelled, discarded]",
                  ["completed", "discarded"], ["completed", "cancelled", "discarded"],
                  ["discarded", "cancelled", "completed"], True, False),
    "lease.states": (("lease.states",), "job", "  states: [claimed, running]",
                     ["running"], ["claimed", "running"], ["running", "claimed"], True, True),
    "postgres.notify": (("postgres.notify",), "queue", "  notify: [fetch, retry]",
                        ["fetch"], ["fetch", "retry"], ["retry", "fetch"], False, False),
    "postgres.claim.by": (("postgres.claim.by",), "queue", "  claim: {by: [queue], order: priority}",
                          ["queue"], ["queue", "kind"], ["kind", "queue"], False, True),
    "reset": (tuple(f"{s}.revive.reset" for s in ("completed", "cancelled", "discarded")), "queue", REVIVE.rstrip(),
              ["fetch"], ["fetch", "retry"], ["retry", "fetch"], False, True),
}  # fmt: skip


def _spec_with(tmp_path: Path, option: str, names: list[str], label: str) -> Path:
    """`specs/<spec>.yaml` with the option's own line listing `names`."""
    _, spec, line, *_ = LISTS[option]
    source = (ROOT / "specs" / f"{spec}.yaml").read_text()
    assert line + "\n" in source, (spec, line)
    head, rest = line.rsplit("[", 1)
    path = tmp_path / label / f"{spec}.yaml"
    path.parent.mkdir()
    path.write_text(source.replace(line + "\n", f"{head}[{', '.join(names)}]{rest.split(']', 1)[1]}\n"))
    return path


def _json_diff(fsmc: Any, old: Path, new: Path) -> Any:
    ran = fsmc("diff", old, new, "--format", "json")
    assert ran.err == "" and ran.code in (0, 1), ran
    return json.loads(ran.out)


@pytest.mark.parametrize("option", sorted(LISTS))
def test_a_list_valued_option_is_a_json_list_added_removed_or_reordered(option: str, fsmc: Any, tmp_path: Path) -> None:
    names, _, _, short, long, reordered, added_breaks, removed_breaks = LISTS[option]
    fewer = _spec_with(tmp_path, option, short, "fewer")
    more = _spec_with(tmp_path, option, long, "more")
    for old, new, was, now, breaking in ((fewer, more, short, long, added_breaks),
                                         (more, fewer, long, short, removed_breaks)):  # fmt: skip
        doc = _json_diff(fsmc, old, new)
        assert doc["options"] == [{"name": n, "old": was, "new": now, "breaking": breaking} for n in names]
    doc = _json_diff(fsmc, more, _spec_with(tmp_path, option, reordered, "reordered"))
    if option == "postgres.claim.by":
        # Listed in order, so another order is a change; and a breaking one: the claim
        # function takes its columns by position, so a caller built from OLD would pass
        # its queue as the kind.
        assert doc["options"] == [{"name": option, "old": long, "new": reordered, "breaking": True}]
    elif option == "initials":
        # A set whose first is the default: the same states reordered change the default alone.
        assert (doc["options"], doc["initial"]) == ([], {"old": "available", "new": "retryable"})
    else:
        assert (doc["options"], doc["initial"], doc["breaking"]) == ([], None, False)
    # Text and Markdown read as before: the names joined.
    assert f"{', '.join(short)} -> {', '.join(long)}" in fsmc("diff", fewer, more).out


def test_a_list_naming_none_is_an_empty_list_and_null_is_no_lease(fsmc: Any, tmp_path: Path) -> None:
    queue = (ROOT / "specs" / "queue.yaml").read_text()
    assert queue.count("  notify: [fetch, retry]\n") == 1
    quiet = tmp_path / "queue.yaml"
    quiet.write_text(queue.replace("  notify: [fetch, retry]\n", "").replace("purgeable: [completed, cancelled, discarded]",
                                                                           "purgeable: []"))  # fmt: skip
    doc = _json_diff(fsmc, ROOT / "specs" / "queue.yaml", quiet)
    assert {o["name"]: (o["old"], o["new"]) for o in doc["options"]} == {
        "purgeable": (["completed", "cancelled", "discarded"], []),
        "postgres.notify": (["fetch", "retry"], []),
    }
    assert "~ option  purgeable (completed, cancelled, discarded -> none)\n" in fsmc("diff", ROOT / "specs" / "queue.yaml", quiet).out
    lease = {o["name"]: (o["old"], o["new"]) for o in json.loads((CASES / "added_lease" / "expected.json").read_text())["options"]}
    assert lease == {"lease.states": (None, ["claimed", "running"]), "lease.reclaim": (None, "reclaim")}


def test_option_values_are_structured_in_json_and_read_as_before_in_text() -> None:
    def values(case: str) -> dict[str, tuple[object, object]]:
        doc = json.loads((CASES / case / "expected.json").read_text())
        return {o["name"]: (o["old"], o["new"]) for o in doc["options"]}

    timed = values("timed")
    assert timed["scheduled.schedule.after"] == (None, {"kind": "due_at"})
    assert timed["completed.rerun.after"] == (None, {"kind": "delay", "ms": 30_000})
    assert timed["discarded.revive.after"] == (None, {"kind": "backoff", "ms": 1000, "factor": 2, "max_ms": 60_000})
    assert values("budgets")["caps.fetch"] == (None, {"default": 3, "max": 10})
    assert values("choices_and_caps")["caps.retry"] == (5, 3)  # a plain cap stays a number
    assert values("columns")["postgres.columns.note"] == (
        {"type": "text", "nullable": True, "default": None}, {"type": "text", "nullable": False, "default": "''"})
    assert values("limits")["limits.running"] == (50, 20)
    # The same values, as text reads them.
    text = (CASES / "timed" / "expected.txt").read_text() + (CASES / "budgets" / "expected.txt").read_text()
    for shown in ("discarded.revive.after (none -> 1s x2 up to 1m)", "completed.rerun.after (none -> 30s)",
                  "scheduled.schedule.after (none -> due_at)", "caps.fetch (none -> 3 per row, at most 10)"):  # fmt: skip
        assert shown in text, shown


def test_writer_role_is_a_json_boolean(fsmc: Any, tmp_path: Path) -> None:
    job = (ROOT / "specs" / "job.yaml").read_text()
    without = tmp_path / "job.yaml"
    without.write_text(job.replace("\npostgres:\n", "\npostgres:\n  writer_role: false\n"))
    doc = _json_diff(fsmc, ROOT / "specs" / "job.yaml", without)
    assert doc["options"] == [{"name": "postgres.writer_role", "old": True, "new": False, "breaking": True}]
    assert "postgres.writer_role (true -> false)" in fsmc("diff", ROOT / "specs" / "job.yaml", without).out


def test_no_option_value_in_json_is_joined_text() -> None:
    # A list of names is a JSON list in every golden case, never `a, b` to split.
    for case in FACTS:
        for o in json.loads((CASES / case / "expected.json").read_text())["options"]:
            for value in (o["old"], o["new"]):
                assert not (isinstance(value, str) and ", " in value), (case, o)
                assert not isinstance(value, list) or all(isinstance(n, str) for n in value), (case, o)
