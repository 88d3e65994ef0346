"""Digest: one sha256 that names what a machine means to its database, not how it is written.

`machine_digest(machine)` is the sha256 (hex) of a canonical JSON document holding
exactly the facts the generated schema is built from: the machine's name, its
states, events, terminals, initial state, transitions, lease (states and reclaim
event), caps (language 1.1; absent when there are none), the further initial states
and the purgeable states, the caps per row, the otherwise and reset of each transition,
the limits, the declared columns by name, each as its table declares it, and
what a claim may be limited to and ordered by (language 1.2; each absent unless the
spec uses it) and PostgreSQL options (table, events
table, id type, defaults resolved; 1.2's `writer_role` only when false), and the
events that notify (`postgres.notify`, absent unless the spec uses it).
Descriptions, comments, key order, list order, YAML style and `from:` lists versus
one transition per source leave it unchanged; any change to one of those facts
changes it. Sets are sorted, since no order among states, events or transitions
changes what the schema does (and the domains that hold the lists, named after
them, are written sorted).

Where the schema records it: the generated `.sql` defines

    <machine>_fsmc_digest() RETURNS text   -- IMMUTABLE; the 64 hex digits

next to `<machine>_apply`. A migration script reads and checks it with

    SELECT <machine>_fsmc_digest();          -- or, to test that it exists first:
    SELECT to_regprocedure('<machine>_fsmc_digest()') IS NOT NULL;

A function rather than a COMMENT because a comment is documentation that people
and tools rewrite (`COMMENT ON TABLE jobs IS ...` during an incident review would
silently erase it), while replacing a function is a deliberate schema change, which
is what `fsmc migrate` makes when it moves the database to a new machine.

Never raises for a machine that passed validation; reads nothing but the machine.
"""

from __future__ import annotations

import hashlib
import json

from fsmc.columns import sql_parts
from fsmc.model import Machine

# Bump when the canonical document changes shape, so old and new digests never meet.
DIGEST_FORMAT = "fsmc-machine/1"


def canonical(machine: Machine) -> str:
    """The canonical JSON text whose sha256 is the digest (exposed for tests and tools)."""
    m = machine
    facts: dict[str, object] = {
        "format": DIGEST_FORMAT,
        "machine": str(m.name),
        "initial": None if m.initial is None else str(m.initial),
        "states": sorted(m.state_names),
        "events": sorted(m.event_names),
        "terminals": sorted(m.terminal_names),
        "transitions": sorted([s, e, t] for s, e, t in m.edges),
        "lease": None
        if m.lease is None
        else {"states": sorted(str(s) for s in m.lease.states), "reclaim": str(m.lease.reclaim)},
        "postgres": {
            "table": str(m.postgres.table),
            "events_table": str(m.postgres.events_table),
            "id_type": m.postgres.id_type,
        },
    }
    if m.cap_limits:
        # Only when there are caps, so a machine without them (every 1.0 spec) keeps
        # its digest. Choices need no key: `edges` has one triple per target.
        facts["caps"] = dict(sorted(m.cap_limits.items()))
    # 1.2's keys likewise only where they say more than 1.1 could: the initial state is
    # the default one, and the terminals are what purge takes unless `purgeable` says.
    if len(m.initial_names) > 1:
        facts["initials"] = sorted(m.initial_names)
    if m.purgeable_names != m.terminals_in_order:
        facts["purgeable"] = sorted(m.purgeable_names)
    if m.per_row_caps:
        facts["per_row_caps"] = dict(sorted(m.per_row_caps.items()))
    if m.otherwise:
        facts["otherwise"] = sorted([s, e, to, budget] for (s, e), (to, budget) in m.otherwise.items())
    if m.state_limits:
        facts["limits"] = dict(sorted(m.state_limits.items()))
    if m.resets:
        facts["resets"] = sorted([s, e, sorted(events)] for (s, e), events in m.resets.items())
    if m.timers:
        facts["timers"] = sorted([s, e, t.kind, t.ms, t.factor, t.most_ms] for (s, e), t in m.timers.items())
    if m.postgres.columns:
        # By name: their order changes no statement (the module names what it reads).
        facts["columns"] = {str(c.name): list(sql_parts(c)) for c in m.postgres.columns}
    if m.postgres.claim_by or m.postgres.claim_order is not None:
        # In order: the claim index is keyed on the `by` columns as listed.
        order = m.postgres.claim_order
        facts["claim"] = {"by": [str(c) for c in m.postgres.claim_by], "order": None if order is None else str(order)}
    if not m.postgres.writer_role:
        # Every write checked, no writer role: another database, which `fsmc migrate`
        # must not take for one built with a writer (absent otherwise, so digests stay).
        facts["writer_role"] = False
    if m.notified:
        facts["notify"] = sorted(m.notified)
    return json.dumps(facts, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def machine_digest(machine: Machine) -> str:
    """sha256 hex of `canonical(machine)`."""
    return hashlib.sha256(canonical(machine).encode("ascii")).hexdigest()
