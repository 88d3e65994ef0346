"""Facts derived from a machine, each computed once, here, for every target, the tests
and the benchmarks.

In: a checked `Machine`. Out: plain values (names as `str`, in spec order). Nothing
here renders text for any language: a target encodes a fact (the SQL target turns
the claim rule into SET clauses), it never re-derives it.

The claim rule (contract 4.2, "With lease") is the one fact with behaviour in it: a
transition into a lease state from outside them claims the row for the actor; one
between two lease states keeps the claim and refreshes the heartbeat; one out of
them clears the claim; any other touches nothing. `lease_change` classifies a move,
`CLAIM_RULE` says what each class does to each claim column.
"""

from __future__ import annotations

from enum import Enum

from fsmc.model import Machine


class Change(Enum):
    """What a transition does to the claim columns (its value is what SQL compares)."""

    ENTER = "enter"
    LEAVE = "leave"
    STAY = "stay"
    NONE = "none"


class Action(Enum):
    """What a change does to one claim column."""

    KEEP = "keep"
    ACTOR = "actor"  # the actor of the transition
    NOW = "now"
    CLEAR = "clear"


# The claim columns, in table order, and the claim rule over them.
CLAIM_COLUMNS = ("claimed_by", "claimed_at", "heartbeat_at")
CLAIM_RULE: dict[Change, tuple[Action, Action, Action]] = {
    Change.ENTER: (Action.ACTOR, Action.NOW, Action.NOW),
    Change.STAY: (Action.KEEP, Action.KEEP, Action.NOW),
    Change.LEAVE: (Action.CLEAR, Action.CLEAR, Action.CLEAR),
    Change.NONE: (Action.KEEP, Action.KEEP, Action.KEEP),
}


def change_of(from_held: bool, to_held: bool) -> Change:
    """The class of a move from a state (held or not) to a state (held or not)."""
    if to_held:
        return Change.STAY if from_held else Change.ENTER
    return Change.LEAVE if from_held else Change.NONE


def lease_states(machine: Machine) -> list[str]:
    """The lease states, in the spec's order (empty without a lease)."""
    return [] if machine.lease is None else [str(s) for s in machine.lease.states]


def lease_change(machine: Machine, source: str, target: str) -> Change:
    """What a transition from `source` to `target` does to the claim columns."""
    held = set(lease_states(machine))
    return change_of(source in held, target in held)


def reclaim_moves(machine: Machine) -> list[tuple[str, str, Change]]:
    """(lease state, target, change) for each lease state the reclaim event leaves by
    one transition. A lease state whose reclaim move is a choice has none: reclaim
    names no target, so it cannot pick one (`reclaim_choices`)."""
    if machine.lease is None:
        return []
    reclaim, single = str(machine.lease.reclaim), machine.single
    return [
        (s, single[s, reclaim], lease_change(machine, s, single[s, reclaim]))
        for s in lease_states(machine)
        if (s, reclaim) in single
    ]


def reclaim_choices(machine: Machine) -> list[tuple[str, tuple[str, ...]]]:
    """(lease state, its targets) for each lease state where the reclaim event is a
    choice: reclaim cannot move those rows (it names no target), so they stay put."""
    if machine.lease is None:
        return []
    reclaim, choices = str(machine.lease.reclaim), machine.choices
    return [(s, choices[s, reclaim]) for s in lease_states(machine) if (s, reclaim) in choices]


def pairs(machine: Machine) -> list[tuple[str, str]]:
    """The (from, to) pairs of the transitions, each once, at its first declaration
    (an `otherwise` after the edges: a move the event log records too)."""
    return list(dict.fromkeys((s, t) for s, _e, t in logged_moves(machine)))


def logged_moves(machine: Machine) -> tuple[tuple[str, str, str], ...]:
    """Every (from, event, to) the event log may record: the expanded table, then
    (1.2) each `otherwise`, where a spent budget sends the row."""
    if not machine.otherwise_edges:
        return machine.edges
    return tuple(dict.fromkeys((*machine.edges, *machine.otherwise_edges)))


def by_state(machine: Machine) -> list[tuple[str, list[tuple[str, str]]]]:
    """The transitions grouped by source state, in spec order: [(state, [(event, target)])]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for source, event, target in machine.edges:
        out.setdefault(source, []).append((event, target))
    return list(out.items())


def lease_starts_and_ends(old: Machine, new: Machine) -> tuple[list[str], list[str]]:
    """States both machines have that become lease states in `new` (starts), and those
    that stop being ones while `new` still has a lease (ends; without one, the claim
    columns go altogether), in `old`'s order."""
    before, after = set(lease_states(old)), set(lease_states(new))
    kept = [s for s in old.state_names if s in new.state_names]
    starts = [s for s in kept if s in after and s not in before]
    ends = [s for s in kept if s in before and s not in after] if new.lease else []
    return starts, ends


def removed_states(old: Machine, new: Machine) -> list[str]:
    """The states of `old` that `new` lacks, in `old`'s order."""
    return [s for s in old.state_names if s not in new.state_names]


def tightened_caps(old: Machine, new: Machine) -> list[tuple[str, int, bool]]:
    """`new`'s caps that rows of `old` may already be past: (event, cap, added) for
    each cap `old` lacks (added: its count starts from the row's history) or sets
    higher, in `new`'s event order. A cap kept or raised needs no look: its count
    is already within `old`'s cap."""
    was = old.cap_limits
    return [(e, cap, e not in was) for e, cap in new.cap_limits.items() if e not in was or was[e] > cap]


def tightened_limits(old: Machine, new: Machine) -> list[tuple[str, int]]:
    """`new`'s limits that `old`'s rows may already be past: (state, limit) for each
    limit `old` lacks or sets higher, in `new`'s state order."""
    was = old.state_limits
    return [(s, most) for s, most in new.state_limits.items() if s not in was or was[s] > most]


def wake_sources(machine: Machine, event: str) -> tuple[list[str], list[str]]:
    """`postgres.notify`: the states `event` takes rows from, in `states` order, split
    into those where it fires at once and those where it waits for a due time (a row
    entering one of either sends a wake-up; only the first are claimable at once)."""
    sources = [s for s in machine.state_names if (s, event) in machine.targets]
    return [s for s in sources if (s, event) not in machine.timers], [s for s in sources if (s, event) in machine.timers]


def wake_states(machine: Machine) -> list[str]:
    """The states whose entry sends a wake-up: every source of a `postgres.notify`
    event, in `states` order."""
    entered = {s for e in machine.notified for part in wake_sources(machine, e) for s in part}
    return [s for s in machine.state_names if s in entered]
