"""Spec facts as SQL: expressions, constants and types the PostgreSQL target writes.

In: a checked `Machine`, or facts derived from one (`fsmc.facts`), and the SQL
expressions they are about (`t.state`, `v_event`). Out: SQL text, each value
escaped by `fsmc.escape` (`sql_str`, `sql_text_array`): membership tests, the
jsonb constants `_apply` and `_claim` look moves up in, the lease rule as SET
clauses, the id column's type. Never a statement, never an identifier of the
installation (`names`), never a fact derived here that `fsmc.facts` could hold:
this module only encodes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from functools import cache, partial

from fsmc import facts
from fsmc.escape import sql_str, sql_text_array
from fsmc.facts import CLAIM_COLUMNS, CLAIM_RULE, Action
from fsmc.model import Machine, Timer
from fsmc.targets.common import ID_TYPES


def id_type(machine: Machine) -> str:
    """The SQL type of the machine's ids (`fsmc.targets.common.ID_TYPES`)."""
    return ID_TYPES[machine.postgres.id_type].sql


def short_hash(parts: Iterable[str]) -> str:
    """8 hex digits naming a set of names (a changed set gets another name)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:8]


def joined(*names: str) -> str:
    """Several names as one text, space-separated: unambiguous, since names hold no space."""
    return " ".join(names)


def triples(m: Machine) -> list[str]:
    """The spec's (from, event, to) triples, each as one text, sorted (what the
    domains of formats 3 to 5 are named after)."""
    return sorted(joined(*e) for e in facts.logged_moves(m))


def sql_in(expression: str, values: Iterable[str]) -> str:
    """`expression IN ('a', 'b')` over literals, or `false` for no values (SQL has no `IN ()`)."""
    literals = [sql_str(v) for v in values]
    if not literals:
        return "false"
    return f"{expression} IN ({', '.join(literals)})"


# An index predicate listing more states than this is written as the complement when
# that is shorter: PostgreSQL keeps a partial index's predicate in pg_index, which has
# no TOAST table, so a list of a thousand states made the CREATE INDEX fail ("row is
# too big"). Below it, every spec keeps the plain list.
LONG_STATE_LIST = 100


def sql_among(expression: str, states: Sequence[str], others: Sequence[str]) -> str:
    """`expression` is one of `states`, where `others` are the rest of the spec's
    states: `sql_in` of them, or `NOT` (`sql_in` of the others) when `states` are
    many and the others fewer (the same rows: the state CHECK admits no other value,
    and NOT NULL no NULL). The index and the query that must use it are written with
    this one function, so the planner sees the same predicate in both."""
    if len(states) > LONG_STATE_LIST and 0 < len(others) < len(states):
        return f"NOT ({sql_in(expression, others)})"
    return sql_in(expression, states)


def sql_any(expression: str, values: Iterable[str]) -> str:
    """`expression = ANY ('{...}'::text[])`: one constant, looked up by hash past a few
    elements. CHECK constraints use this form: PostgreSQL rebuilds a CHECK expression
    for every statement that writes the table, and an `IN` list of n literals costs
    that rebuild n nodes (the spec's 11 triples as a row `IN` list cost more than the
    rest of the INSERT)."""
    return f"{expression} = ANY ({sql_text_array(values)})"


def sql_one_of(expression: str, values: Sequence[str]) -> str:
    """`expression = 'a'` for one value, else `sql_any`. For a trigger's WHEN clause,
    which PostgreSQL parses back from its catalog text for every statement that fires
    the trigger, at about 25 instructions a character: one text constant is a third of
    the text of a one-element array."""
    return f"{expression} = {sql_str(values[0])}" if len(values) == 1 else sql_any(expression, values)


def sql_entered_or_left(old: str, new: str, values: Sequence[str]) -> str:
    """The state went from `old` to `new`, and one of them is among `values`: a trigger's
    WHEN clause (see `sql_one_of`). For one value, `(old = 'a') <> (new = 'a')`: the
    same rows (a change that stays in 'a' is no change) in two-thirds of the text."""
    if len(values) == 1:
        return f"({sql_one_of(old, values)}) <> ({sql_one_of(new, values)})"
    return f"{old} IS DISTINCT FROM {new} AND ({sql_any(old, values)} OR {sql_any(new, values)})"


def pg_text_array(names: Iterable[str]) -> str:
    """A text[] literal whose type is named through pg_catalog (for DO blocks, which
    run with the installer's search_path)."""
    return sql_text_array(names).replace("::text[]", "::pg_catalog.text[]")


# --- the claim rule (fsmc.facts), encoded in SQL ---------------------------------------


def claim_assignments(change: str, actor: str, now: str, row: str = "") -> list[str]:
    """`column = CASE <change> WHEN 'enter' THEN ... ELSE <row>.column END` for each
    claim column, from `facts.CLAIM_RULE`: `change` is an SQL expression whose value
    is a `facts.Change`, `actor` one for the actor, `now` one for the move's time (the
    moment the row was written, which its `entered_at` and event row get too), `row`
    the updated row's alias."""
    return [f"{column} = {value}" for column, value in claim_values(change, actor, now, row)]


def claim_values(change: str, actor: str, now: str, row: str = "") -> list[tuple[str, str]]:
    """(column, `CASE <change> WHEN 'enter' THEN ... ELSE <row>.column END`) for each
    claim column: `claim_assignments`, for a trigger that assigns NEW's fields."""
    out: list[tuple[str, str]] = []
    for i, column in enumerate(CLAIM_COLUMNS):
        kept = f"{row}.{column}" if row else column
        values = {Action.ACTOR: actor, Action.NOW: now, Action.CLEAR: "NULL"}
        branches = [
            f"WHEN {sql_str(c.value)} THEN {values[actions[i]]}"
            for c, actions in CLAIM_RULE.items()
            if actions[i] is not Action.KEEP
        ]
        out.append((column, f"CASE {change} {' '.join(branches)} ELSE {kept} END"))
    return out


def claims_settled(change: str, row: str) -> str:
    """Whether `row`'s claim columns already hold what the claim rule leaves on a move
    of `change` (an SQL expression whose value is a `facts.Change`): the actor's column
    some claimer (whoever moved the row chose it), the times the move's own (its
    `entered_at`), the cleared ones NULL. The guard of a schema without a writer role
    stamps a move only where not (the functions' moves are stamped already)."""
    tests = {Action.ACTOR: "{} IS NOT NULL", Action.NOW: "{} IS NOT DISTINCT FROM " + f"{row}.entered_at",
             Action.CLEAR: "{} IS NULL"}  # fmt: skip
    branches = []
    for c, actions in CLAIM_RULE.items():
        held = [tests[a].format(f"{row}.{column}") for column, a in zip(CLAIM_COLUMNS, actions, strict=True)
                if a is not Action.KEEP]  # fmt: skip
        if held:
            branches.append(f"WHEN {sql_str(c.value)} THEN {' AND '.join(held)}")
    return f"CASE {change} {' '.join(branches)} ELSE true END"


def change_sql(old: str, new: str, held: Sequence[str]) -> str:
    """The `facts.Change` of a move from state `old` to state `new` (SQL expressions),
    as `facts.change_of` tells it, in SQL."""
    c = {change: sql_str(change.value) for change in facts.Change}
    was, now = sql_any(old, held), sql_any(new, held)
    return (
        f"CASE WHEN {was} THEN CASE WHEN {now} THEN {c[facts.change_of(True, True)]} ELSE {c[facts.change_of(True, False)]} END"
        f" WHEN {now} THEN {c[facts.change_of(False, True)]} ELSE {c[facts.change_of(False, False)]} END"
    )


# --- 1.2's timers ---------------------------------------------------------------------------


def due_from_entry(timer: Timer, count: str, row: str = "t") -> str:
    """The due time of a row that entered a timed state at `row.entered_at`, as the
    bodies set it on entry (templates/machine_bodies.sql.j2, `due_of`): what `fsmc
    migrate` gives the rows already in a state that becomes timed. `count` is the
    timed event's count column (a backoff), as SQL spells it. A `due_at` state has no
    time to go by: due at once."""
    if timer.kind == "due_at":
        return "pg_catalog.now()"
    if timer.kind == "delay":
        return f"{row}.entered_at + {timer.ms}::pg_catalog.float8 * '1 millisecond'::pg_catalog.interval"
    exponent = backoff_exponent(timer)
    return (
        f"{row}.entered_at + LEAST({timer.most_ms}::pg_catalog.float8, {timer.ms}::pg_catalog.float8 * pg_catalog.power("
        f"{timer.factor}::pg_catalog.float8, LEAST({exponent}, {row}.{count})::pg_catalog.float8))"
        " * '1 millisecond'::pg_catalog.interval"
    )


def backoff_exponent(timer: Timer) -> int:
    """The count past which a backoff stays at its max: power() is taken no further,
    so it never overflows whatever the count."""
    if timer.kind != "backoff" or timer.factor <= 1:
        return 0
    return max(0, math.ceil(math.log(timer.most_ms / timer.ms) / math.log(timer.factor)))


# --- the spec's moves as jsonb constants -------------------------------------------------

# A name as a JSON string, made once per name. The two jsonb constants below are
# written as text, not built as dicts for json.dumps: for a spec of 20,000 transitions
# the dicts (and the garbage collections they set off) cost a build a tenth of its time.
_json_name = cache(partial(json.dumps, ensure_ascii=False))


# A pair's targets as a text[] literal, made once per set of targets (most pairs of
# a large spec share their one target with others).
targets_array = cache(sql_text_array)


def moves_jsonb(m: Machine) -> str:
    """The spec's moves as `_apply` and `_claim` look them up, a jsonb constant: for
    each (state, event) pair with a transition, under the key "state event", `s` names
    the target when there is one (a choice has none: its caller must name one) and
    `t` maps each target to its lease change. A lookup is a binary search of the keys,
    so a move costs the same in a spec of ten transitions as in one of thousands,
    where scanning the spec's table as rows cost a call time in proportion to its
    size. Keys in the spec's order: jsonb orders them itself."""
    held = set(facts.lease_states(m))
    single: dict[str, str] = {}
    targets: dict[str, str] = {}  # key -> its `t` object's members, as JSON text
    budgets = _budget_members(m, held)
    for s, e, t in m.edges:
        key = f"{s} {e}"  # joined(s, e)
        member = f'{_json_name(t)}: "{facts.change_of(s in held, t in held).value}"'
        if key in targets:
            targets[key] += ", " + member
        else:
            targets[key] = member
            if (s, e) not in m.choices:
                single[key] = t
    pairs = (
        f"{_json_name(key)}: {{" + (f'"s": {_json_name(single[key])}, ' if key in single else "") + f'"t": {{{to}}}'
        + budgets.get(key, "") + "}"
        for key, to in targets.items()
    )
    return sql_str("{" + ", ".join(pairs) + "}") + "::pg_catalog.jsonb"


def _budget_members(m: Machine, held: set[str]) -> dict[str, str]:
    """1.2's further members of a move (as JSON text, each after a comma): where a
    spent budget sends the row (`o`), with its lease change (`ol`) and the event
    whose budget it is (`b`); and the events whose budgets the move gives back (`r`)."""
    out: dict[str, str] = {}
    for (s, e), (to, budget) in m.otherwise.items():
        change = facts.change_of(s in held, to in held).value
        out[f"{s} {e}"] = f', "o": {_json_name(to)}, "ol": "{change}", "b": {_json_name(budget)}'
    for (s, e), events in m.resets.items():
        key = f"{s} {e}"
        out[key] = out.get(key, "") + ', "r": [' + ", ".join(map(_json_name, events)) + "]"
    for s, e in m.timers:  # 1.2: a timed move, which waits for its row's due_at
        key = f"{s} {e}"
        out[key] = out.get(key, "") + ', "d": 1'
    return out


def sources_jsonb(m: Machine) -> str:
    """The states each event leads from, as `_claim` looks them up, a jsonb constant:
    under each event, `s` lists the states where it has one target (which a NULL
    to_state picks) and `t` maps each target to the states it leads there from."""
    single: dict[str, str] = {}  # event -> its `s` array's elements, as JSON text
    targets: dict[str, dict[str, str]] = {}  # event -> target -> its sources, as JSON text
    for s, e, t in m.edges:
        source = _json_name(s)
        by_target = targets.setdefault(e, {})
        by_target[t] = by_target[t] + ", " + source if t in by_target else source
        if (s, e) not in m.choices:
            single[e] = single[e] + ", " + source if e in single else source
    events = (
        f'{_json_name(e)}: {{"s": [{single.get(e, "")}], "t": {{'
        + ", ".join(f"{_json_name(t)}: [{sources}]" for t, sources in by_target.items())
        + "}}"
        for e, by_target in targets.items()
    )
    return sql_str("{" + ", ".join(events) + "}") + "::pg_catalog.jsonb"
