"""One test per diagnostic code: the code, the line and the column of every finding.

Each case is a spec in which `@` marks where a diagnostic must point; the marks
are removed before the spec is checked, and their positions are the expectation.
"""

from __future__ import annotations

import pytest

from fsmc.pipeline import check
from fsmc.source import Source

BASE = """\
fsmc: 1
machine: job
initial: queued
states:
  queued: waiting
  running:
  done:
terminals: [done]
events: [start, finish]
transitions:
  - {from: queued, event: start, to: running}
  - {from: running, event: finish, to: done}
"""


def run(marked: str) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]], list[str]]:
    """(found, expected, messages) for a spec with `@` marks."""
    expected: list[tuple[int, int]] = []
    lines = []
    for number, line in enumerate(marked.split("\n"), start=1):
        while "@" in line:
            col = line.index("@")
            expected.append((number, col + 1))
            line = line[:col] + line[col + 1 :]
        lines.append(line)
    text = "\n".join(lines)
    result = check(Source("spec.yaml", "spec.yaml", text.encode()))
    found = sorted((d.code, d.line, d.col) for d in result.diagnostics)
    codes = {d.code for d in result.diagnostics}
    want = sorted((code, line, col) for code in codes for line, col in expected)
    return found, want, [d.message for d in sorted(result.diagnostics)]


def assert_only(code: str, marked: str, *fragments: str) -> list[str]:
    found, want, messages = run(marked)
    assert {c for c, _, _ in found} == {code}, messages
    assert found == want, messages
    for fragment in fragments:
        assert any(fragment in m for m in messages), (fragment, messages)
    return messages


def test_the_base_spec_is_clean() -> None:
    assert run(BASE)[0] == []


def test_schema_names_the_json_path() -> None:
    assert_only(
        "schema",
        BASE.replace("to: done}", "to: @5}"),
        "transitions[1].to: expected a string, got integer 5",
    )


def test_schema_refuses_a_boolean_where_a_name_belongs() -> None:
    assert_only("schema", BASE.replace("[done]", "[@true]"), "terminals[0]", "quote it")


def test_schema_unknown_key_suggests_the_right_one() -> None:
    assert_only("schema", BASE + "@termnals: []\n", "unknown key 'termnals'")
    assert_only(
        "schema", BASE.replace("event: finish,", "@evnt: finish,"),
        "did you mean 'event'?",
    )  # fmt: skip


def test_schema_missing_key_and_version() -> None:
    assert_only("schema", "@" + BASE.replace("initial: queued\n", ""), "missing required key 'initial'")
    assert_only("schema", BASE.replace("fsmc: 1", "fsmc: @2"), "unsupported spec format version 2")


def test_schema_refuses_nul_in_descriptions() -> None:
    assert_only("schema", BASE.replace("waiting", '@"wait\\0ing"'), "NUL")


def test_yaml_syntax() -> None:
    assert_only(
        "yaml-syntax", BASE.replace("queued: waiting", "queued: wait@: ing"),
        "mapping values are not allowed",
    )  # fmt: skip


def test_duplicate_key() -> None:
    assert_only("duplicate-key", BASE.replace("  running:\n", "  running:\n  @queued: again\n"))


def test_bad_name() -> None:
    messages = assert_only(
        "bad-name",
        BASE.replace("machine: job", "machine: @Job").replace("  running:", "  @Running:")
        .replace("running}", "Running}").replace("from: running", "from: Running"),
    )  # fmt: skip
    assert any("[a-z][a-z0-9_]*" in m for m in messages)


@pytest.mark.parametrize("name", ["class", "none", "state", "event", "illegal_transition", "state_"])
def test_bad_machine_names_that_fight_the_module(name: str) -> None:
    assert_only("bad-name", BASE.replace("machine: job", f"machine: @{name}"))


def test_bad_name_length_and_table_names() -> None:
    long = "a" * 49
    assert_only("bad-name", BASE.replace("machine: job", f"machine: @{long}"), "49 characters")
    assert_only("bad-name", BASE + "postgres: {table: @Jobs}\n", "postgres.table")


def test_duplicate_name() -> None:
    assert_only(
        "duplicate-name", BASE.replace("[start, finish]", "[start, finish, @start]"),
        "event 'start' is declared twice",
    )  # fmt: skip


def test_unknown_state_suggests_the_closest() -> None:
    assert_only(
        "unknown-state", BASE.replace("to: running}", "to: @runing}"),
        "transitions[0].to: 'runing' is not a declared state; did you mean 'running'?",
    )  # fmt: skip
    assert_only("unknown-state", BASE.replace("initial: queued", "initial: @queue"), "initial")
    assert_only("unknown-state", BASE.replace("[done]", "[@don]"), "terminals")


def test_unknown_event_and_lease_reclaim_name() -> None:
    assert_only(
        "unknown-event", BASE.replace("event: start", "event: @strat"),
        "did you mean 'start'?",
    )  # fmt: skip
    assert_only(
        "unknown-event",
        BASE.replace("[start, finish]", "[start, finish, reclaim]")
        + "  - {from: running, event: reclaim, to: queued}\n"
        + "lease: {states: [running], reclaim: @reclaiim}\n",
    )


def test_a_from_list_reports_each_unknown_source() -> None:
    assert_only(
        "unknown-state",
        BASE + "  - {from: [@runing, @queud], event: finish, to: done}\n",
    )


def test_duplicate_transition() -> None:
    assert_only(
        "duplicate-transition",
        BASE + "  - {from: @running, event: finish, to: queued}\n",
        "(running, finish) is already declared by transitions[1]",
    )


def test_terminal_exit() -> None:
    assert_only(
        "terminal-exit",
        BASE + "  - {from: @done, event: start, to: running}\n",
        "terminal state 'done'",
    )


def test_unreachable_state() -> None:
    assert_only(
        "unreachable-state",
        BASE.replace("  done:\n", "  done:\n  @island:\n")
        + "  - {from: island, event: finish, to: done}\n",
        "'island' cannot be reached from the initial state 'queued'",
    )


def test_dead_end() -> None:
    assert_only(
        "dead-end",
        BASE.replace("  done:\n", "  done:\n  @stuck:\n")
        + "  - {from: queued, event: finish, to: stuck}\n",
    )


def test_trap_gives_one_diagnostic_per_state() -> None:
    assert_only(
        "trap",
        BASE.replace("  done:\n", "  done:\n  @spin_a:\n  @spin_b:\n")
        + "  - {from: queued, event: finish, to: spin_a}\n"
        + "  - {from: spin_a, event: start, to: spin_b}\n"
        + "  - {from: spin_b, event: start, to: spin_a}\n",
        "cannot reach any terminal state",
    )


def test_lease_reclaim() -> None:
    assert_only(
        "lease-reclaim",
        BASE.replace("[start, finish]", "[start, finish, reclaim]")
        + "  - {from: running, event: reclaim, to: queued}\n"
        + "lease: {states: [running, @queued], reclaim: reclaim}\n",
    )


def test_unused_event_is_a_warning() -> None:
    found, want, messages = run(BASE.replace("[start, finish]", "[start, finish, @spare]"))
    assert found == want == [("unused-event", 9, 25)]
    result = check(Source("s", "s", BASE.replace("finish]", "finish, spare]").encode()))
    assert result.ok() and not result.ok(strict=True)


def test_one_typo_is_one_diagnostic_not_a_cascade() -> None:
    # With `runing` unresolved, the graph rules would see `running` as a dead end,
    # `done` as unreachable, and so on; they do not run.
    assert_only("unknown-state", BASE.replace("to: running}", "to: @runing}"))


def test_every_problem_is_reported_in_one_run() -> None:
    spec = (
        BASE.replace("event: start", "event: strat")
        .replace("[done]", "[don]")
        .replace("machine: job", "machine: Job")
        .replace("  done:\n", "  done:\n  done:\n")
    )
    found, _, _ = run(spec)
    assert found == [
        ("bad-name", 2, 10),
        ("duplicate-key", 8, 3),
        ("unknown-event", 12, 27),
        ("unknown-state", 9, 13),
    ]


def test_a_misspelt_top_level_key_is_one_diagnostic_not_a_flood() -> None:
    found, _, messages = run(BASE.replace("states:", "@stats:"))
    assert [c for c, _, _ in found] == ["schema"], messages  # "missing states" is implied
    assert any("did you mean 'states'" in m for m in messages)
    found, _, messages = run(BASE.replace("events:", "@evnts:"))
    assert [c for c, _, _ in found] == ["schema"], messages
