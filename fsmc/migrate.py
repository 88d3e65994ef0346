"""Migrate: two versions of one machine -> the SQL script that moves a database built
from OLD's `.sql` to what NEW's `.sql` builds (contract section 6).

`migrate(old, new)` is pure: two checked machines in, the script's text out; the
empty string when both specs build the same schema (the same machine digest:
formatting, descriptions and order change nothing a database holds). It raises
`Unsupported` for a pair it will not script (below); the CLI makes that exit 2.

How the script is made: OLD's and NEW's `.sql` files are cut into statements
(`fsmc.sqlparts`) and compared object by object, so the migration always builds
what the SQL target builds, whatever the target's template says. First the names:
`mid` is OLD's machine under NEW's `postgres` names; OLD's file and mid's file
differ only in names, and each name that differs is renamed. Then mid is compared
with NEW: columns added or dropped, defaults, CHECK constraints, storage
parameters, indexes. Every function is replaced (CREATE OR REPLACE keeps its
grants and owner) and every trigger dropped and created again (a constraint
trigger cannot be replaced), not only those whose text changed: the result is
then NEW's, whichever fsmc version built the database's functions.

What the script does, in one transaction (BEGIN ... COMMIT; `psql -v
ON_ERROR_STOP=1 -f FILE`, as the schema's owner, search_path set to the schema as
for the build):

1. `SET LOCAL lock_timeout` (`LOCK_TIMEOUT`): a migration waiting for a lock makes
   every writer of the tables queue behind it, so it gives up instead, changing
   nothing; run it again at a quieter moment.
2. Guard, before any change. It refuses (SQLSTATE 55000,
   object_not_in_prerequisite_state, with a message saying "nothing was changed"):
   a schema without `<machine>_fsmc_digest()` (built from another machine, or the
   wrong search_path); a search_path whose first schema is not the machine's (new
   objects would be created elsewhere); a digest other than OLD's (built from
   another version of the spec, or already migrated: the hint says which). Then it
   locks both tables (ACCESS EXCLUSIVE, the table before its log, as `_apply` does)
   and reads the digest again, so of two migrations run at once the second refuses.
   Then, if NEW removes states, it counts the rows still in them and refuses,
   naming each such state and its row count.
3. Expand: renames (tables, and the constraint, index and identity-sequence names
   derived from them), new columns, defaults, storage parameters, new or changed
   indexes, and the claim columns of rows whose state gains or loses its lease.
4. CHECK constraints whose definition changed are dropped and added again `NOT
   VALID`; functions replaced; triggers recreated.
5. Validation: a CHECK on the machine's table is validated (every row is in a
   state NEW declares: step 2 made sure). The event log's triple CHECK is validated
   only where its history allows: when old events record transitions NEW no longer
   has, validation fails, the CHECK stays `NOT VALID` (it still checks every new
   event), and a NOTICE says how many old events it spares. History is never
   rewritten: no statement of the script touches an event row.
6. Contract: functions, triggers, indexes, constraints and columns NEW lacks are
   dropped (a dependent object of the user's makes that fail, changing nothing).
7. NEW's digest is recorded last, by replacing `<machine>_fsmc_digest()`.

Options. Table and events-table names may change: the tables, their derived
constraint and index names and the id sequence are renamed (metadata only; code
that names the old tables must ship with NEW). Adding a lease adds the claim
columns (NULL, no table rewrite), the fillfactor, the partial index and the
heartbeat and reclaim functions; removing one drops them (the claim columns hold
only the current holder, whose claim is also the actor and time of the event that
moved the row into the lease). Changing the lease states or reclaim event
rebuilds the index and the functions. A row already in a state that becomes a
lease state gets `heartbeat_at = now()` (claimed_by and claimed_at stay NULL: no
worker claimed it through `_apply`), so reclaim takes it once stale, where a NULL
heartbeat would never be; a row in a state that stops being one has its claim
cleared, as a move out of the lease would. Refused (`Unsupported`): a renamed
machine (a new machine: new module, functions, tables), a changed `id_type` (it
would rewrite both tables under an exclusive lock and change the signature of
every function taking an id, breaking their callers and grants: do it by hand),
and names that trade places (the table taking the old events table's name, ...:
rename in two releases).

Renaming a state, safely. A state cannot be renamed in place: the rows' log says
they entered the old name, an UPDATE to the new name has no edge and no event row
(the database refuses it, 23F04 and 23F05), and rewriting the log is refused too
(23F06). So a rename is two releases made of ordinary transitions:

  1. Add the new state with the old one's outgoing transitions, and an event
     (`rename_paused`, say) from the old state to the new one; migrate. Then move
     every row with that event through `<machine>_apply`: `SELECT job_apply(id,
     'rename_paused', state_version, 'release 1.5') FROM jobs WHERE state =
     'paused';`.
  2. Remove the old state and that event, pointing the old state's incoming
     transitions at the new one; migrate. The migration refuses, changing nothing,
     if a row entered the old state since the sweep: sweep again and rerun.

It is safe for the event log because nothing in it is rewritten and it still
replays: each row's move is itself an event row (from the old name, the rename
event, to the new name, with its actor and time), so the history up to it is in
the old vocabulary and the history after it in the new one; after step 2 the
triple CHECK stays NOT VALID over the old events it no longer admits, and still
refuses every new event that is not one of NEW's transitions.

Cost and locks: the whole script holds ACCESS EXCLUSIVE locks on both tables, and
each replaced CHECK scans its table (VALIDATE, inside this one transaction, buys no
lighter lock); a new index scans the table. Adding or dropping columns rewrites
nothing.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from fsmc import sqlparts
from fsmc.diff import compare
from fsmc.diff_render import rows
from fsmc.digest import machine_digest
from fsmc.escape import SQL_NAME_MAX, sql_ident, sql_text_array
from fsmc.model import Machine
from fsmc.sqlparts import Statement, Table
from fsmc.targets import sql as sql_target
from fsmc.targets.common import migration_header
from fsmc.templating import render

LOCK_TIMEOUT = "5s"

_DEFAULT = re.compile(r" DEFAULT ('(?:[^']|'')*'|[^ ]+\(\)|-?[0-9]+)")


class Unsupported(Exception):
    """A change `fsmc migrate` will not script; the message says why and what to do."""


def migrate(old: Machine, new: Machine, *, lock_timeout: str = LOCK_TIMEOUT) -> str:
    """The script that moves a database built from `old`'s `.sql` to `new`'s; empty
    when both build the same schema. Raises `Unsupported` (see the module doc)."""
    refused = refusals(old, new)
    if refused:
        raise Unsupported("\n".join(refused))
    if machine_digest(old) == machine_digest(new):
        return ""
    return render("migrate.sql.j2", **context(old, new, lock_timeout))


def refusals(old: Machine, new: Machine) -> list[str]:
    """Why `fsmc migrate` will not script this pair (empty: it will)."""
    out: list[str] = []
    if old.name != new.name:
        return [
            f"OLD defines machine '{old.name}' but NEW defines '{new.name}': a renamed "
            "machine is a new one (new module, tables and functions), not a migration"
        ]
    if old.postgres.id_type != new.postgres.id_type:
        out.append(
            f"postgres.id_type changes from {old.postgres.id_type} to {new.postgres.id_type}: "
            "fsmc migrate does not change id types (it would rewrite both tables under an "
            "exclusive lock and change the signature of every function that takes an id, "
            "breaking their callers and grants); keep the id type, or migrate by hand"
        )
        return out
    renames = Renames.of(old, new)
    traded = sorted(set(renames.old_names) & set(renames.new_names))
    if traded:
        out.append(
            "NEW gives names OLD used to other objects "
            f"({', '.join(sqlparts.unquote(n) for n in traded)}): fsmc migrate does not "
            "trade names between objects; rename in two releases (first to unused names)"
        )
    return out


def mid_machine(old: Machine, new: Machine) -> Machine:
    """OLD's machine under NEW's PostgreSQL names: what the database is once renamed."""
    return dataclasses.replace(old, postgres=new.postgres)


@dataclass(frozen=True)
class Renames:
    """Every name OLD's file gives that mid's gives otherwise (as SQL spells them)."""

    tables: tuple[tuple[str, str], ...]  # (old, new)
    constraints: tuple[tuple[str, str, str], ...]  # (table as renamed, old, new)
    indexes: tuple[tuple[str, str], ...]
    sequences: tuple[tuple[str, str, str], ...]  # (table as renamed, column, new sequence name)

    @property
    def old_names(self) -> list[str]:
        return [o for o, _ in self.tables + self.indexes] + [o for _, o, _ in self.constraints]

    @property
    def new_names(self) -> list[str]:
        return (
            [n for _, n in self.tables + self.indexes]
            + [n for _, _, n in self.constraints]
            + [sql_ident(s) for _, _, s in self.sequences]
        )

    def __bool__(self) -> bool:
        return bool(self.tables or self.constraints or self.indexes or self.sequences)

    @staticmethod
    def of(old: Machine, new: Machine) -> Renames:
        before = sqlparts.statements(sql_target.emit(old))
        after = sqlparts.statements(sql_target.emit(mid_machine(old, new)))
        tables: list[tuple[str, str]] = []
        constraints: list[tuple[str, str, str]] = []
        indexes: list[tuple[str, str]] = []
        sequences: list[tuple[str, str, str]] = []
        for b, a in zip(before, after, strict=True):
            assert b.kind == a.kind, (b.text[:80], a.text[:80])
            if b.kind == "index" and b.name != a.name:
                indexes.append((b.name, a.name))
            elif b.kind == "table":
                tb, ta = sqlparts.table(b), sqlparts.table(a)
                if tb.name != ta.name:
                    tables.append((tb.name, ta.name))
                    for column, definition in ta.columns:
                        if "AS IDENTITY" in definition:
                            name = identity_sequence(sqlparts.unquote(ta.name), column)
                            sequences.append((ta.name, column, name))
                for (cb, _), (ca, _) in zip(tb.constraints, ta.constraints, strict=True):
                    if cb != ca:
                        constraints.append((ta.name, cb, ca))
                assert [c for c, _ in tb.columns] == [c for c, _ in ta.columns]
            else:
                assert b.name == a.name, (b.name, a.name)  # named after the machine
        return Renames(tuple(tables), tuple(constraints), tuple(indexes), tuple(sequences))


def identity_sequence(table: str, column: str) -> str:
    """The name PostgreSQL gives the sequence of an identity column when it creates
    the table (makeObjectName: `<table>_<column>_seq`, the longer part cut to fit)."""
    label = "seq"
    available = SQL_NAME_MAX - 1 - (len(label) + 1)  # the two underscores and the label
    t, c = len(table), len(column)
    while t + c > available:
        if t > c:
            t -= 1
        else:
            c -= 1
    return f"{table[:t]}_{column[:c]}_{label}"


@dataclass(frozen=True)
class Check:
    """A CHECK constraint NEW defines differently from the database (or anew)."""

    table: str
    name: str
    definition: str
    existed: bool
    history: bool  # on the event log: may stay NOT VALID over old events

    @property
    def expression(self) -> str:
        return sqlparts.check_expression(self.definition)


@dataclass(frozen=True)
class TableChanges:
    name: str
    add_columns: tuple[str, ...]  # definitions
    defaults: tuple[tuple[str, str | None], ...]  # (column, new default or None: drop it)
    set_options: tuple[tuple[str, str], ...]
    reset_options: tuple[str, ...]
    checks: tuple[Check, ...]
    add_constraints: tuple[tuple[str, str], ...]  # non-CHECK constraints NEW adds
    drop_constraints: tuple[str, ...]
    drop_columns: tuple[str, ...]


def table_changes(mid: Table, new: Table, *, history: bool) -> TableChanges:
    assert mid.name == new.name, (mid.name, new.name)
    mid_columns, new_columns = dict(mid.columns), dict(new.columns)
    defaults: list[tuple[str, str | None]] = []
    for column, definition in new.columns:
        was = mid_columns.get(column)
        if was is None or was == definition:
            continue
        old_default, new_default = _default(was), _default(definition)
        if _DEFAULT.sub("", was) != _DEFAULT.sub("", definition) or old_default == new_default:
            raise AssertionError(f"fsmc migrate cannot change column {was!r} to {definition!r}")
        defaults.append((column, new_default))
    mid_constraints, new_constraints = dict(mid.constraints), dict(new.constraints)
    checks: list[Check] = []
    add_constraints: list[tuple[str, str]] = []
    for name, definition in new.constraints:
        was = mid_constraints.get(name)
        if was == definition:
            continue
        if definition.startswith("CHECK ("):
            checks.append(Check(new.name, name, definition, was is not None, history))
        else:
            assert was is None, f"fsmc migrate cannot change constraint {name}: {was!r}"
            add_constraints.append((name, definition))
    mid_options, new_options = dict(mid.options), dict(new.options)
    return TableChanges(
        name=new.name,
        add_columns=tuple(d for c, d in new.columns if c not in mid_columns),
        defaults=tuple(defaults),
        set_options=tuple((k, v) for k, v in new.options if mid_options.get(k) != v),
        reset_options=tuple(k for k, _ in mid.options if k not in new_options),
        checks=tuple(checks),
        add_constraints=tuple(add_constraints),
        drop_constraints=tuple(c for c, _ in mid.constraints if c not in new_constraints),
        drop_columns=tuple(c for c, _ in mid.columns if c not in new_columns),
    )


def _default(definition: str) -> str | None:
    found = _DEFAULT.search(definition)
    return None if found is None else found.group(1)


def _by_kind(parts: list[Statement], kind: str) -> dict[str, Statement]:
    return {s.name: s for s in parts if s.kind == kind}


def context(old: Machine, new: Machine, lock_timeout: str) -> dict[str, object]:
    mid = mid_machine(old, new)
    names_old, names = sql_target.Names.of(old), sql_target.Names.of(new)
    renames = Renames.of(old, new)
    before = sqlparts.statements(sql_target.emit(mid))
    after = sqlparts.statements(sql_target.emit(new))

    tables = [
        table_changes(
            sqlparts.table(m), sqlparts.table(n), history=n.name == names.events_table
        )
        for m, n in zip(
            [s for s in before if s.kind == "table"],
            [s for s in after if s.kind == "table"],
            strict=True,
        )
    ]
    mid_indexes, new_indexes = _by_kind(before, "index"), _by_kind(after, "index")
    mid_functions, new_functions = _by_kind(before, "function"), _by_kind(after, "function")
    mid_triggers, new_triggers = _by_kind(before, "trigger"), _by_kind(after, "trigger")
    digest = new_functions.pop(names.digest)

    held_before = {str(s) for s in old.lease.states} if old.lease else set()
    held_after = {str(s) for s in new.lease.states} if new.lease else set()
    kept = [s for s in old.state_names if s in new.state_names]
    lease_start = [s for s in kept if s in held_after and s not in held_before]
    lease_end = [s for s in kept if s in held_before and s not in held_after] if new.lease else []

    removed_states = [s for s in old.state_names if s not in new.state_names]
    changes = []
    for r in rows(compare(old, new)):
        line = f"{r.mark} {r.kind} {r.subject}" + (f" ({r.note})" if r.note else "")
        changes.append(line + ("  BREAKING" if r.breaking else ""))

    return {
        "machine": str(new.name),
        "header": migration_header(old, new),
        "old_digest": machine_digest(old),
        "new_digest": machine_digest(new),
        "changes": changes,
        "lock_timeout": lock_timeout,
        "old": names_old,
        "n": names,
        "digest_signature": f"{names.digest}()",
        "digest_query": f"SELECT {names.digest}()",
        "removed_states": sql_text_array(removed_states) if removed_states else None,
        "renames": renames,
        "tables": tables,
        # An index NEW defines otherwise is dropped and built again (a predicate cannot change).
        "drop_indexes_first": [i for i, s in mid_indexes.items() if new_indexes.get(i, s) != s],
        "create_indexes": [s.text for i, s in new_indexes.items() if mid_indexes.get(i) != s],
        "lease_start": sql_text_array(lease_start) if lease_start else None,
        "lease_end": sql_text_array(lease_end) if lease_end else None,
        "functions": [_or_replace(s.text) for s in new_functions.values()],
        "triggers": [
            (s.name, s.trigger_table, s.text, s.name in mid_triggers) for s in new_triggers.values()
        ],
        "drop_functions": [f for f in mid_functions if f not in new_functions and f != names.digest],
        "drop_triggers": [
            (t, s.trigger_table) for t, s in mid_triggers.items() if t not in new_triggers
        ],
        "drop_indexes": [i for i in mid_indexes if i not in new_indexes],
        "digest_function": _or_replace(digest.text),
        # CREATE OR REPLACE drops a function's settings: pin every function again.
        "pin": sql_target.pin_search_path(sql_target.function_names(new)),
    }


def _or_replace(text: str) -> str:
    assert text.startswith("CREATE FUNCTION "), text[:80]
    return "CREATE OR REPLACE FUNCTION " + text.removeprefix("CREATE FUNCTION ")
