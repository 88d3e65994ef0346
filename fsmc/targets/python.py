"""The Python module (contract 4.1): enums, the read-only tables (TRANSITIONS for
single targets, CHOICES, CAPS), apply, the dataclass with its cap counts, and
`transition()`, which calls the database function of the SQL target."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from fsmc import columns
from fsmc.facts import wake_sources
from fsmc.model import DeclaredColumn, Machine
from fsmc.targets.common import ID_TYPES, Header
from fsmc.targets.postgres.names import Names, cap_column, count_column, wake_channel_head
from fsmc.targets.sqlstate import Codes
from fsmc.templating import as_variables, render


def member(name: str) -> str:
    """The enum member name of a state or event: its name upper-cased."""
    return name.upper()


def count_field(event: str) -> str:
    """The dataclass field that counts a capped event: the name of its PostgreSQL
    column (`names.count_column`, one definition for both, long names included)."""
    return count_column(event)


def cap_field(event: str) -> str:
    """The dataclass field holding a row's own cap of an event capped per row: the
    name of its PostgreSQL column (`names.cap_column`)."""
    return cap_column(event)


def exports(class_name: str, lease: bool, timed: bool = False, limits: bool = False,
            notify: bool = False) -> list[str]:  # fmt: skip
    """`__all__`, in the order linters want it: CONSTANTS, Classes, functions."""
    names = ["CAPS", "CHOICES", "INITIAL", "INITIALS", "PURGEABLE", "SCHEMA", "TERMINAL", "TRANSITIONS", "AsyncConnection",
             "CapReached", "Connection", "Event", "IllegalTransition", "State", "UnknownRow",
             class_name, class_name + "New", "EventName", "StateName", "apply", "available_events", "can_fire",
             "transition", "atransition", "get", "aget", "create", "acreate", "create_many", "acreate_many",
             "claim", "aclaim", "purge", "apurge"]  # fmt: skip
    if lease:
        names += ["heartbeat", "aheartbeat", "reclaim", "areclaim"]
    if timed:
        names += ["NotDue"]
    if limits:
        names += ["LIMITS", "LimitReached"]
    if notify:
        names += ["NOTIFIED", "AsyncListeningConnection", "ListeningConnection", "wake_channel", "wait_for", "await_for"]

    def rank(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    return sorted(names, key=rank)


@dataclass(frozen=True)
class ModuleContext:
    """What templates/module.py.j2 fills in (its fields are its variables)."""

    header: Header
    machine: str
    class_name: str
    exports: list[str]
    description: str | None
    states: list[tuple[str, str, str | None]]  # (member, name, description)
    events: list[tuple[str, str, str | None]]
    initial: str  # a member: the default initial state
    initials: list[str]  # members: every state a row may be born in, the default first
    terminals: list[str]  # members
    purgeable: list[str]  # members
    transitions: list[tuple[str, str, str]]  # members: (state, event, target)
    choices: list[tuple[str, str, list[str]]]  # members: (state, event, targets)
    caps: list[tuple[str, str, int, str]]  # (event member, count field, cap, its cap field per row or "")
    # 1.2: (state member, event member) -> where a spent budget sends the row: (target
    # member, the budget's count field, its cap field per row or "", its fixed cap)
    otherwise: list[tuple[str, str, str, str, str, int]]
    resets: list[tuple[str, str, list[str]]]  # (state member, event member, the events whose budgets come back)
    per_row_max: dict[str, int]  # event member -> the largest cap a row may have (1.2)
    timed: bool  # 1.2: some transition waits for time: NotDue
    due_given: bool  # 1.2: some state waits for a time the caller gives: due_at= on transition and claim
    limits: list[tuple[str, int]]  # 1.2: (state member, the most rows it may hold)
    id_type: str  # the Python type of an id
    pg_id_type: str  # the SQL type the module casts an id to
    id_given: bool  # create() may give a new row its id (`common.ID_TYPES`' `given`)
    schema: str
    uses_uuid: bool
    codes: Codes
    table: str  # the database's names, as SQL spells them
    apply_function: str
    claim_function: str
    purge_function: str
    heartbeat_function: str
    reclaim_function: str
    row_columns: str  # what get() and claim() read of a row, in the dataclass's field order
    # 1.2: the row's own data (postgres.columns), keyword-only fields after the counts
    # and caps, in row_columns' order: (name, annotation, default as Python)
    data_fields: list[tuple[str, str, str]]
    # 1.2: what the database stamps, read-only properties over one slot, in row_columns'
    # order after the data: (name, annotation, what it says)
    stamps: list[tuple[str, str, str]]
    # 1.2: what create() may give a row: (key, annotation, the exact type it is cast to)
    insert_fields: list[tuple[str, str, str]]
    uses_decimal: bool
    # 1.2's `postgres.claim.by`: what claim() may be limited to: (name, annotation, cast)
    claim_by: list[tuple[str, str, str]]
    lease: bool
    reclaim_event: str
    # `postgres.notify`: (event member, its sources where it fires at once, its timed
    # sources), the channel's head (`names.wake_channel`) and the function a waiter asks
    notified: list[tuple[str, list[str], list[str]]] = dataclasses.field(default_factory=list)
    wake_head: str = ""
    claimable_in_function: str = ""


def context(machine: Machine) -> ModuleContext:
    m = machine
    names = Names.of(m).sql
    descriptions = {str(d.name): d.description for d in m.states}
    event_descriptions = {str(d.name): d.description for d in m.events}
    return ModuleContext(
        header=Header.of(m),
        machine=str(m.name),
        class_name=m.camel_name,
        exports=exports(m.camel_name, m.lease is not None, bool(m.timers), bool(m.state_limits),
                        bool(m.notified)),  # fmt: skip
        timed=bool(m.timers),
        due_given=any(t.kind == "due_at" for t in m.timers.values()),
        description=m.description,
        states=[(member(s), s, descriptions.get(s)) for s in m.state_names],
        events=[(member(e), e, event_descriptions.get(e)) for e in m.event_names],
        initial=member(str(m.initial)),
        initials=[member(s) for s in m.initial_names],
        terminals=[member(s) for s in m.terminals_in_order],
        purgeable=[member(s) for s in m.purgeable_names],
        transitions=[(member(s), member(e), member(t)) for (s, e), t in m.single.items()],
        choices=[(member(s), member(e), [member(t) for t in ts]) for (s, e), ts in m.choices.items()],
        caps=[(member(e), count_field(e), cap, cap_field(e) if e in m.per_row_caps else "")
              for e, cap in m.cap_limits.items()],  # fmt: skip
        otherwise=[
            (member(s), member(e), member(to), count_field(b), cap_field(b) if b in m.per_row_caps else "",
             m.cap_limits.get(b, 0))
            for (s, e), (to, b) in m.otherwise.items()
        ],  # fmt: skip
        resets=[(member(s), member(e), [member(x) for x in xs]) for (s, e), xs in m.resets.items()],
        per_row_max={member(e): most for e, most in m.per_row_caps.items()},
        limits=[(member(s), most) for s, most in m.state_limits.items()],
        id_type=ID_TYPES[m.postgres.id_type].python,
        pg_id_type=ID_TYPES[m.postgres.id_type].cast,
        id_given=ID_TYPES[m.postgres.id_type].given,
        schema=m.postgres.schema,
        uses_uuid=m.postgres.id_type == "uuid" or any(c.type == "uuid" for c in m.postgres.columns),
        codes=Codes(),
        table=names.table,
        apply_function=names.apply,
        claim_function=names.claim,
        purge_function=names.purge,
        heartbeat_function=names.heartbeat,
        reclaim_function=names.reclaim,
        row_columns=", ".join(["state", "state_version", *map(count_field, m.cap_limits),
                               *map(cap_field, m.per_row_caps), *(f for f, *_ in data_fields(m)),
                               *(f for f, *_ in stamps(m))]),  # fmt: skip
        data_fields=data_fields(m),
        stamps=stamps(m),
        insert_fields=insert_fields(m),
        claim_by=[(name, annotation.removesuffix(" | None") + " | None", cast)
                  for name, annotation, cast in insert_fields(m) if name in m.postgres.claim_by],  # fmt: skip
        uses_decimal=any(columns.TYPES[c.type].python == "decimal.Decimal" for c in m.postgres.columns),
        lease=m.lease is not None,
        reclaim_event=str(m.lease.reclaim) if m.lease is not None else "",
        notified=[(member(e), *wake_sources(m, e)) for e in m.notified],
        wake_head=wake_channel_head(str(m.name)),
        claimable_in_function=names.claimable_in,
    )


def data_fields(m: Machine) -> list[tuple[str, str, str]]:
    """The dataclass's fields after the counts and caps (1.2): the row's own data
    (`postgres.columns`), which apply() carries."""
    return [(str(c.name), *_data_field(c)) for c in m.postgres.columns]


def stamps(m: Machine) -> list[tuple[str, str, str]]:
    """What the database writes on a row and the application only reads (1.2): when it
    was born and entered its state, its lease, its due time. One slot holds them, behind
    properties: apply() empties it with one store, whatever a spec declares (a row it
    makes has no database times), so a field each would not cost apply() a store each."""
    out = [("created_at", "datetime.datetime | None", "When the row was inserted."),
           ("entered_at", "datetime.datetime | None", "When the row entered its state.")]  # fmt: skip
    if m.lease is not None:
        out += [("claimed_by", "str | None", "Who holds the row's lease (the claim's actor)."),
                ("claimed_at", "datetime.datetime | None", "When the lease was taken."),
                ("heartbeat_at", "datetime.datetime | None", "The holder's last heartbeat.")]  # fmt: skip
    if m.timers:
        out.append(("due_at", "datetime.datetime | None", "When the timed way out of its state is due."))
    return out


def _data_field(c: DeclaredColumn) -> tuple[str, str]:
    """A declared column's annotation and default, as the dataclass declares them."""
    kind = columns.TYPES[c.type]
    nullable = c.nullable and kind.python != "typing.Any"
    annotation = kind.python + (" | None" if nullable else "")
    if not c.has_default or c.default is None:
        return annotation, "None"
    if isinstance(c.default, (dict, list)):  # a fresh one for each row, as a mutable default must be
        text = json.dumps(c.default, sort_keys=True, ensure_ascii=False)
        return annotation, f"dataclasses.field(default_factory=lambda: json.loads({text!r}))"
    return annotation, columns.python_default(kind, c.default)


def insert_fields(m: Machine) -> list[tuple[str, str, str]]:
    """What create() may give a new row, beside its id and state: a row's own caps
    (1.2), its due time where a state it may be born in waits for one, its data."""
    out = [(cap_field(e), "int", "pg_catalog.int4") for e in m.per_row_caps]
    if any(t.kind == "due_at" for t in m.timers.values()):
        out.append(("due_at", "datetime.datetime", "pg_catalog.timestamptz"))
    for c in m.postgres.columns:
        kind = columns.TYPES[c.type]
        out.append((str(c.name), kind.python + (" | None" if c.nullable and kind.python != "typing.Any" else ""),
                    kind.cast))  # fmt: skip
    return out


def emit(machine: Machine) -> str:
    return render("module.py.j2", **as_variables(context(machine)))
