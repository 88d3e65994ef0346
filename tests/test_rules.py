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
    found = sorted((str(d.code), d.line, d.col) for d in result.diagnostics)
    codes = {str(d.code) for d in result.diagnostics}
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
        "transitions[1].to: expected a string or a list, got integer 5",
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


def test_an_isolated_state_is_one_diagnostic_not_also_a_dead_end() -> None:
    # Issue 23: no transition in or out is one mistake (a leftover, or a state not
    # wired in yet); "add a way out, or list it in terminals" would not help.
    assert_only(
        "unreachable-state",
        BASE.replace("  done:\n", "  done:\n  @spare:\n"),
        "state 'spare' is isolated: no transition enters or leaves it, so it cannot be "
        "reached from the initial state 'queued'; remove it, or add transitions into and "
        "out of it",
    )
    assert_only(
        "unreachable-state",
        BASE.replace("  done:\n", "  done:\n  @gone:\n").replace("[done]", "[done, gone]"),
        "state 'gone' is isolated",
        "remove it, or add a transition into it",
    )
    # A state with a way in but none out is still a dead end, and one with a way out
    # but none in is still merely unreachable.
    assert_only(
        "dead-end",
        BASE.replace("  done:\n", "  done:\n  @stuck:\n")
        + "  - {from: queued, event: finish, to: stuck}\n",
        "has no outgoing transition",
    )
    messages = assert_only(
        "unreachable-state",
        BASE.replace("  done:\n", "  done:\n  @island:\n")
        + "  - {from: island, event: finish, to: done}\n",
    )
    assert not any("isolated" in m for m in messages)


@pytest.mark.parametrize(
    ("written", "declared", "suggested"),
    [
        ("processed", "being_processed", None),  # another state that contains the word
        ("process", "processing", None),
        ("claim", "claimed", None),
        ("procesed", "processed", "processed"),  # a letter missing
        ("strat", "start", "start"),  # two letters swapped
        ("pasued", "paused", "paused"),
        ("hel", "held", "held"),
        ("compelted", "completed", "completed"),
    ],
)
def test_did_you_mean_names_only_what_looks_like_a_typo(
    written: str, declared: str, suggested: str | None
) -> None:
    spec = BASE.replace("  done:\n", f"  done:\n  {declared}:\n")
    spec += f"  - {{from: running, event: start, to: @{written}}}\n"
    messages = assert_only("unknown-state", spec, f"'{written}' is not a declared state")
    hint = f"; did you mean '{suggested}'?" if suggested else ""
    assert messages[0].endswith(f"'{written}' is not a declared state{hint}"), messages


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


def test_lease_reclaim_refuses_a_choice() -> None:
    # Reclaim fires in bulk, with nobody to pick a target: a choice there would take
    # its first target silently (River's rescuer would have retried, not discarded).
    assert_only(
        "lease-reclaim",
        BASE.replace("[start, finish]", "[start, finish, reclaim]")
        + "  - @{from: running, event: reclaim, to: [queued, done]}\n"
        + "lease: {states: [running], reclaim: reclaim}\n",
        "is a choice from lease state 'running'",
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


# --- spec language 1.1 ---------------------------------------------------------------

LOOP = """\
fsmc: 1
machine: light
initial: green
states: [green, yellow, red]
terminals: []
events: [next, panic]
transitions:
  - {from: green, event: next, to: yellow}
  - {from: yellow, event: next, to: red}
  - {from: red, event: next, to: green}
"""


def test_a_machine_that_never_ends_is_clean() -> None:
    assert run(LOOP)[0] == [("unused-event", 6, 16)]  # panic
    assert run(LOOP + '  - {from: "*", except: [red], event: panic, to: red}\n')[0] == []


def test_a_machine_that_never_ends_still_has_unreachable_states_and_dead_ends() -> None:
    assert_only(
        "unreachable-state",
        LOOP.replace("[green, yellow, red]", "[green, yellow, red, @lost]")
        + "  - {from: lost, event: panic, to: red}\n",
    )
    assert_only(
        "dead-end",
        LOOP.replace("[green, yellow, red]", "[green, yellow, red, @off]")
        + "  - {from: red, event: panic, to: off}\n",
    )


def test_a_wildcard_covers_every_non_terminal_state() -> None:
    spec = BASE.replace("[start, finish]", "[start, finish, kill]") + (
        '  - {from: "*", event: kill, to: done}\n'
    )
    result = check(Source("s", "s", spec.encode()))
    assert result.diagnostics == [] and result.machine is not None
    assert [(s, t) for s, e, t in result.machine.edges if e == "kill"] == [
        ("queued", "done"), ("running", "done"),
    ]  # fmt: skip


def test_duplicate_transition_between_a_wildcard_and_an_explicit_one_says_which_except() -> None:
    kill = BASE.replace("[start, finish]", "[start, finish, kill]")
    assert_only(
        "duplicate-transition",
        kill + '  - {from: "*", event: kill, to: done}\n'
        + "  - {from: @running, event: kill, to: queued}\n",
        "(running, kill) is already declared by transitions[2]; "
        "add 'running' to transitions[2].except",
    )
    assert_only(
        "duplicate-transition",
        kill + "  - {from: running, event: kill, to: queued}\n"
        + '  - {from: @"*", event: kill, to: done}\n',
        "add 'running' to transitions[3].except",
    )


def test_except_without_a_wildcard_is_a_schema_error() -> None:
    assert_only(
        "schema",
        BASE.replace("{from: running, event: finish", "{from: running, @except: [queued], event: finish"),
        "transitions[1].except: only a wildcard source",
    )


def test_except_naming_an_unknown_or_terminal_state() -> None:
    kill = BASE.replace("[start, finish]", "[start, finish, kill]")
    assert_only(
        "unknown-state",
        kill + '  - {from: "*", except: [@runing], event: kill, to: done}\n',
        "transitions[2].except: 'runing' is not a declared state; did you mean 'running'?",
    )
    assert_only(
        "unknown-state",
        kill + '  - {from: "*", except: [@done], event: kill, to: done}\n',
        "'done' is a terminal state",
    )


def test_a_wildcard_inside_a_list_is_a_schema_error() -> None:
    assert_only(
        "schema",
        BASE + '  - {from: [queued, @"*"], event: finish, to: done}\n',
        'transitions[2].from[1]: "*" stands alone',
    )


def test_a_choice_of_nothing_or_with_a_repeat_is_a_schema_error() -> None:
    assert_only("schema", BASE.replace("to: done}", "to: @[]}"), "transitions[1].to: the list must not be empty")
    assert_only(
        "schema",
        BASE.replace("to: done}", "to: [done, queued, @done]}"),
        "transitions[1].to[2]: string 'done' is already in the list",
    )


def test_a_choice_counts_every_target_in_the_graph_rules() -> None:
    spec = BASE.replace("  done:\n", "  done:\n  failed:\n").replace(
        "to: done}", "to: [done, failed]}"
    ) + "  - {from: failed, event: start, to: running}\n"
    result = check(Source("s", "s", spec.encode()))
    assert result.diagnostics == [] and result.machine is not None
    assert result.machine.choices == {("running", "finish"): ("done", "failed")}
    assert result.machine.single == {("queued", "start"): "running", ("failed", "start"): "running"}
    # A `to` list of one is a plain `to`.
    one = check(Source("s", "s", BASE.replace("to: done}", "to: [done]}").encode()))
    assert one.diagnostics == [] and one.machine is not None and one.machine.choices == {}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("0", "got integer 0"),
        ("-3", "got integer -3"),
        ("2.5", "expected an integer, got number 2.5"),
        ("true", "expected an integer, got boolean true"),
        ("'5'", "expected an integer, got string '5'"),
        ("1000001", "got integer 1000001"),
    ],
)
def test_a_cap_is_an_integer_from_1_to_a_million(value: str, fragment: str) -> None:
    assert_only("schema", BASE + f"caps: {{start: @{value}}}\n", "caps.start", fragment, "1 to 1,000,000")


def test_a_cap_on_an_undeclared_event() -> None:
    assert_only("unknown-event", BASE + "caps: {@strat: 3}\n", "caps: 'strat' is not a declared event; did you mean 'start'?")


def test_a_cap_on_an_event_no_transition_uses_is_a_warning() -> None:
    spec = BASE.replace("[start, finish]", "[start, finish, spare]") + "caps: {@spare: 3}\n"
    found, want, messages = run(spec)
    assert found == want == [("unused-event", 13, 8)], messages
    assert "capped but used by no transition" in messages[0]


def test_cap_trap() -> None:
    assert_only(
        "cap-trap",
        BASE.replace("  done:\n", "  done:\n  @failed:\n").replace("[start, finish]", "[start, finish, retry]")
        + "  - {from: running, event: retry, to: failed}\n"
        + "  - {from: failed, event: retry, to: queued}\n"
        + "caps: {retry: 5}\n",
        "state 'failed' can only be left by capped events ('retry' (5))",
    )


def test_trap_says_when_every_path_ends_in_a_dead_end() -> None:
    # XState's fetch machine, misread: `success` forgotten in terminals.
    spec = (
        "fsmc: 1\nmachine: fetch\ninitial: idle\n"
        "states: [@idle, @loading, success, @failure, gone]\nterminals: [gone]\n"
        "events: [fetch, resolve, reject, retry, drop]\n"
        "transitions:\n"
        "  - {from: idle, event: fetch, to: loading}\n"
        "  - {from: loading, event: resolve, to: success}\n"
        "  - {from: loading, event: reject, to: failure}\n"
        "  - {from: failure, event: retry, to: loading}\n"
        "  - {from: gone, event: drop, to: gone}\n"
    )
    found, _, messages = run(spec)
    traps = [m for m in messages if "cannot reach any terminal" in m]
    assert len(traps) == 3, messages
    assert all("either cycles forever or ends in a dead end ('success')" in m for m in traps[1:])
    assert "every path from it ends in a dead end" not in " ".join(traps[1:])
    line_spec = spec.replace("[@idle, @loading, success, @failure, gone]", "[idle, loading, success, failure, gone]")
    line = check(Source("s", "s", line_spec.replace("  - {from: failure, event: retry, to: loading}\n", "  - {from: failure, event: retry, to: success}\n").encode()))
    assert any(
        "every path from it ends in a dead end ('success')" in d.message for d in line.diagnostics if d.code == "trap"
    ), [d.message for d in line.diagnostics]


def test_a_duplicate_pair_does_not_make_its_second_target_unreachable() -> None:
    # python-statemachine's guess-the-number, mistranslated: one cause, one diagnostic.
    assert_only(
        "duplicate-transition",
        BASE.replace("  done:\n", "  done:\n  low:\n").replace("[start, finish]", "[start, finish, back]")
        + "  - {from: @running, event: finish, to: low}\n"
        + "  - {from: low, event: back, to: running}\n",
    )


def test_a_wildcard_in_a_to_or_except_list_is_one_diagnostic() -> None:
    kill = BASE.replace("[start, finish]", "[start, finish, kill]")
    assert_only("schema", kill + '  - {from: "*", event: kill, to: [@"*", done]}\n', "transitions[2].to[0]")
    assert_only("schema", kill + '  - {from: "*", except: [@"*"], event: kill, to: done}\n')


def test_an_infinite_cap_is_one_diagnostic() -> None:
    assert_only("schema", BASE + "caps: {start: @.inf}\n", "expected an integer, got number inf")


@pytest.mark.parametrize("states", ["{}", "[]"])
def test_no_states_is_a_schema_error_not_a_crash(states: str) -> None:
    # Found by hypothesis: `states: {}` with an initial state crashed the graph rules.
    text = ("fsmc: 1\nmachine: m\ninitial: a\nstates: " + states
            + "\nterminals: [a]\nevents: {a: null}\ntransitions: []\n")  # fmt: skip
    result = check(Source("spec.yaml", "spec.yaml", text.encode()))
    assert [(d.code, d.line, d.col) for d in result.diagnostics] == [("schema", 4, 9)]
    assert "must not be empty" in result.diagnostics[0].message


# --- language 1.2: several initial states, purgeable states, budgets --------------------

QUEUE = """\
fsmc: 1
machine: queue
initial: [available, scheduled]
states: [available, scheduled, running, retryable, completed, discarded]
terminals: []
purgeable: [completed, discarded]
events: [schedule, fetch, complete, error, retry, revive]
transitions:
  - {from: scheduled, event: schedule, to: available}
  - {from: available, event: fetch, to: running}
  - {from: running, event: complete, to: completed}
  - {from: running, event: error, to: retryable, otherwise: discarded, spent: fetch}
  - {from: retryable, event: retry, to: available, otherwise: discarded}
  - {from: [completed, discarded], event: revive, to: available, reset: [fetch, retry]}
caps:
  fetch: {default: 25, max: 1000}
  retry: 5
"""


def test_the_queue_spec_of_1_2_is_clean() -> None:
    assert run(QUEUE)[0] == []


def test_a_state_only_another_initial_state_reaches_is_reachable() -> None:
    # `scheduled` is reached by nothing but being born there: no unreachable-state.
    assert run(QUEUE)[0] == []
    one_initial = QUEUE.replace("initial: [available, scheduled]", "initial: available")
    assert_only("unreachable-state", one_initial.replace("[available, scheduled, running", "[available, @scheduled, running"),
                "state 'scheduled' cannot be reached from the initial state 'available'")


def test_every_initial_state_must_be_declared() -> None:
    assert_only("unknown-state", QUEUE.replace("[available, scheduled]", "[available, @schedueld]"),
                "initial: 'schedueld' is not a declared state; did you mean 'scheduled'?")


def test_an_initial_state_is_listed_once() -> None:
    assert_only("schema", QUEUE.replace("[available, scheduled]", "[available, @available]"), "initial[1]")


def test_a_purgeable_state_must_be_declared() -> None:
    assert_only("unknown-state", QUEUE.replace("purgeable: [completed, discarded]", "purgeable: [completed, @discardd]"),
                "purgeable: 'discardd' is not a declared state; did you mean 'discarded'?")


def test_a_limit_names_a_declared_state_and_is_1_to_a_million() -> None:
    limited = QUEUE + "limits:\n  running: 10\n"
    assert run(limited)[0] == []
    assert_only("unknown-state", limited.replace("  running: 10", "  @runing: 10"),
                "limits: 'runing' is not a declared state; did you mean 'running'?")
    assert_only("schema", limited.replace("running: 10", "running: @0"), "limits.running: 0 is less than the minimum of 1")
    assert_only("schema", limited.replace("running: 10", "running: @1000001"), "limits.running")
    assert_only("schema", limited.replace("running: 10", "running: @ten"), "limits.running: expected an integer")


def test_an_otherwise_names_a_declared_state_and_a_spent_a_declared_event() -> None:
    assert_only("unknown-state", QUEUE.replace("otherwise: discarded, spent", "otherwise: @discard, spent"),
                "transitions[3].otherwise: 'discard' is not a declared state")
    assert_only("unknown-event", QUEUE.replace("spent: fetch", "spent: @fetc"),
                "transitions[3].spent: 'fetc' is not a declared event; did you mean 'fetch'?")


def test_a_spent_needs_an_otherwise() -> None:
    assert_only("schema", QUEUE.replace("@", "").replace("{from: running, event: error, to: retryable, otherwise: discarded, spent: fetch}",
                                                         "@{from: running, event: error, to: retryable, spent: fetch}"),
                "transitions[3]", "'otherwise'")


def test_a_budget_comes_only_from_a_cap() -> None:
    # `complete` has no cap: an otherwise waiting for its budget, or a reset of it, is a mistake.
    found, _, messages = run(QUEUE.replace("spent: fetch", "spent: complete"))
    # (and, with nothing watching the budget of `fetch` now, `available` is a cap trap)
    assert [(c, line) for c, line, _ in found] == [("cap-trap", 4), ("uncapped-budget", 12)], messages
    assert any("transitions[3].spent" in m and "cap it (caps: {complete: N})" in m for m in messages)
    assert_only("uncapped-budget", QUEUE.replace("{from: running, event: complete, to: completed}",
                                                 "{from: running, event: complete, to: completed, otherwise: @discarded}"),
                "transitions[2].otherwise", "budget of 'complete' is spent")
    assert_only("uncapped-budget", QUEUE.replace("reset: [fetch, retry]", "reset: [fetch, @complete]"),
                "transitions[5].reset", "gives back the budget of 'complete'")


def test_a_cap_per_row_has_a_default_within_its_max() -> None:
    assert_only("schema", QUEUE.replace("  fetch: {default: 25, max: 1000}", "  @fetch: {default: 25, max: 10}"),
                "caps.fetch: the default cap 25 is above the max 10")
    assert_only("schema", QUEUE.replace("{default: 25, max: 1000}", "@{default: 25}"), "caps.fetch", "'max'")
    assert_only("schema", QUEUE.replace("{default: 25, max: 1000}", "{default: 25, max: @0}"),
                "caps.fetch.max", "1 to 1,000,000")


def test_an_otherwise_is_a_way_out_for_the_cap_trap_rule() -> None:
    # `retryable` is left by the capped `retry` only, but its otherwise still moves a
    # row whose budget is spent; `available` by the capped `fetch` only, whose spent
    # budget the otherwise of `error` watches.
    assert run(QUEUE)[0] == []
    no_rescue = QUEUE.replace(", otherwise: discarded}", "}")
    assert_only("cap-trap", no_rescue.replace("states: [available, scheduled, running, retryable,",
                                              "states: [available, scheduled, running, @retryable,"),
                "state 'retryable' can only be left by capped events")


def test_an_otherwise_target_counts_for_reachability() -> None:
    # `discarded` is reached only through otherwise: no unreachable-state.
    assert run(QUEUE)[0] == []
    assert "discarded" not in {m for m in run(QUEUE)[2]}


def test_a_reclaim_with_an_otherwise_is_allowed_but_not_a_choice() -> None:
    leased = QUEUE.replace("{from: running, event: error, to: retryable, otherwise: discarded, spent: fetch}",
                           "{from: running, event: error, to: retryable, otherwise: discarded, spent: fetch}\n"
                           "  - {from: running, event: rescue, to: retryable, otherwise: discarded, spent: fetch}")
    leased = leased.replace("events: [schedule,", "events: [rescue, schedule,") + "lease: {states: [running], reclaim: rescue}\n"
    assert run(leased)[0] == []


def test_a_timed_transition_is_clean_in_each_form() -> None:
    timed = QUEUE.replace("{from: scheduled, event: schedule, to: available}",
                          "{from: scheduled, event: schedule, to: available, after: due_at}")
    timed = timed.replace("{from: retryable, event: retry, to: available, otherwise: discarded}",
                          "{from: retryable, event: retry, to: available, otherwise: discarded,\n"
                          "     after: {backoff: 1s, factor: 2, max: 1h}}")
    assert run(timed)[0] == []
    assert run(timed.replace("after: due_at", "after: 250ms"))[0] == []


@pytest.mark.parametrize("wait", ["0s", "5", "5x", "1.5s", "-1m", "{backoff: 1s, factor: 2}", "{backoff: 1s, factor: 0.5, max: 1m}"])
def test_a_wait_in_another_form_is_a_schema_error(wait: str) -> None:
    spec = QUEUE.replace("{from: scheduled, event: schedule, to: available}",
                         f"{{from: scheduled, event: schedule, to: available, after: @{wait}}}")
    assert_only("schema", spec, "transitions[0].after: a wait is a duration")


def test_a_backoff_whose_max_is_below_its_start() -> None:
    spec = QUEUE.replace("{from: retryable, event: retry, to: available, otherwise: discarded}",
                         "{from: retryable, event: retry, to: available, otherwise: discarded, after: @{backoff: 1m, factor: 2, max: 1s}}")
    assert_only("schema", spec, "the backoff's max (1s) is below where it starts (1m)")


def test_a_state_has_one_timed_way_out() -> None:
    spec = QUEUE.replace("{from: retryable, event: retry, to: available, otherwise: discarded}",
                         "{from: retryable, event: retry, to: available, otherwise: discarded, after: 5m}\n"
                         "  - {from: retryable, event: schedule, to: discarded, after: @1h}")
    # Both events by name (issue 31), at the second transition's `after` (the `@` above).
    assert_only("timer-conflict", spec, "transitions[5].after: state 'retryable' already has a timed transition out "
                "(transitions[4], on 'retry'), so the one on 'schedule' cannot wait too; a row in a state has one "
                "due time, so at most one of its ways out may wait for it")


def test_a_backoff_needs_a_capped_event() -> None:
    spec = QUEUE.replace("{from: scheduled, event: schedule, to: available}",
                         "{from: scheduled, event: schedule, to: available, after: @{backoff: 1s, factor: 2, max: 1m}}")
    assert_only("uncapped-budget", spec, "transitions[0].after", "'schedule'", "cap it (caps: {schedule: N})")


# --- bad-column (1.2's declared columns) ---------------------------------------------


@pytest.mark.parametrize(
    ("columns", "fragment"),
    [
        ("  @order: text", "'order' is a PostgreSQL reserved word"),
        ("  @state_version: bigint", "fsmc generates"),
        ("  @start_count: integer", "fsmc generates"),  # the count column a cap on `start` would add
        ("  @finish_cap: integer", "fsmc generates"),
        ("  @v_rows: integer", "starts with v_"),
        ("  @class: text", "Python keyword"),
        ("  @kind: txt", "'txt' is not a column type fsmc knows; did you mean 'text'?"),
        ("  @priority: {type: smallint, default: 70000}", "out of a smallint's range (-32768 to 32767)"),
        ("  @flag: {type: boolean, default: 1}", "must be true or false"),
        ("  @born: {type: date, default: '2020-01-01'}", "a date column cannot have a default"),
        ("  @name: {type: text, nullable: false}", "needs a default"),
        ("  @count: {type: integer, default: '3'}", "must be an integer"),
    ],
)
def test_bad_column_points_at_the_column(columns: str, fragment: str) -> None:
    assert_only("bad-column", BASE + "postgres:\n  columns:\n" + "  " + columns + "\n", fragment)


def test_declared_columns_of_every_type_are_clean() -> None:
    spec = BASE + """postgres:
  columns:
    args: jsonb
    queue: {type: text, default: default}
    priority: {type: smallint, default: 0}
    options: {type: jsonb, default: {retries: [1, 2]}}
    weight: {type: numeric, default: 1.5}
    ratio: {type: double precision, default: 0.25}
    urgent: {type: boolean, default: false}
    total: {type: bigint, default: -9223372036854775808}
    parent: uuid
    born: date
    run_after: timestamptz
    blob: bytea
    note: {type: text, nullable: false, default: ''}
"""
    assert run(spec)[0] == []


def test_claim_by_and_order_name_declared_columns_a_claim_can_compare() -> None:
    spec = BASE + """postgres:
  columns:
    args: jsonb
    queue: {type: text, default: default}
  claim: {by: [@queu, @args], order: @priority}
"""
    assert_only("bad-column", spec, "'queu' is not a declared column; did you mean 'queue'?",
                "'args' is a jsonb column", "postgres.claim.order: 'priority' is not a declared column")  # fmt: skip
