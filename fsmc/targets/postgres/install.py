"""Installing a machine's schema: the writer role, the grants, the search_path pin.

In: a checked `Machine`, its `Names` and the signature of every function its schema
creates, by raw name (`build` knows them). Out: `Install`, the statements that make or check the
writer role (before anything is created), give it the moving functions and pin every
function's search_path (after), rendered from templates/install.sql.j2 with an
`InstallContext`; and the application's grants. The SQL is the template's: nothing
here writes a statement as text. `fsmc migrate` runs `prepare`, `setup` and `pin`
of NEW's `Install` again.

Why the writer role (contract 4.2): `_apply`, `_claim`, `_reclaim`, the heartbeat
and the update guard are SECURITY DEFINER functions owned by a NOLOGIN role of this
installation alone; the triggers skip the writes that role makes, naming it as a
text literal in their WHEN clauses (`model.Trigger.create`). Those writes keep to
the spec by construction; everyone else's still get every check. No application
can become the role, and EXECUTE on these functions is granted, never PUBLIC's.

The role's name is `<schema>_<machine>` (cut to 40 bytes) `_writer_<hash>`, the hash
over the database's, the schema's and the machine's names, so no two installations in
one cluster share it and the owner of one cannot use another's (an owner is a member
of its own writer). `prepare` creates it when the installer may create roles, and
otherwise it must exist, granted to the installer: the error says exactly what an
administrator runs, and it comes first, so a refused install has changed nothing even
without `psql -1`. A role that can log in, is a superuser or bypasses row security is
refused: whoever became it would write rows past every check. Then
`<machine>_fsmc_writer()` is (re)made to return the name, which the statements
creating the triggers read to put it into their WHEN clauses as a literal:
PostgreSQL prepares a WHEN clause for every statement, and folding even an IMMUTABLE
SQL function there runs the SQL function executor (measured: a tenth of `_apply`'s
CPU for three triggers).

Without a writer role (1.2's `postgres.writer_role: false`, for hosts where nobody
can create a role: Heroku Postgres' plans), `prepare` checks only that there is a
schema to install into, the functions stay the installer's (SECURITY DEFINER,
EXECUTE still granted, never PUBLIC's, their search_path pinned alike), and the
triggers skip no one: every write is checked, the functions' included, which keep to
the spec and so pass. The application's grants are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import jinja2

from fsmc.escape import sql_ident
from fsmc.model import Machine
from fsmc.targets.common import ID_TYPES
from fsmc.targets.postgres.encode import pg_text_array
from fsmc.targets.postgres.names import Names, Quoted, cap_column, count_column
from fsmc.templating import as_variables, environment


@dataclass(frozen=True)
class InstallContext:
    """What templates/install.sql.j2 fills in (its fields are its variables)."""

    machine: str  # raw
    n: Quoted
    writer: str  # the writer's name function, raw (the role's DO block passes it to %I)
    table: str  # raw, for %I
    events_table: str  # raw, for %I
    limits_table: str  # 1.2: the limits' slots table, raw, for %I ("" without limits)
    # Functions by signature (`name(types)`, the name as SQL spells it), never by name
    # alone: in a schema others may create in, a name may be another role's overload too.
    owned: str  # `writer_functions`, a text[]
    definers: str  # `callable_functions`, a text[]
    functions: str  # every function of the schema, a text[]: the pin's
    writes: tuple[str, str]  # `app_writes`
    executable: list[str]  # `callable_functions`' signatures
    writer_role: bool  # 1.2's `postgres.writer_role`: false, no role, nothing owned by one


@dataclass(frozen=True)
class Install:
    """The installation's statements: `prepare` first in the file, `setup` and `pin`
    last (after every function exists); `grants` are the application's (`app_grants`),
    with `{schema}` and `{role}` where the quoted names go."""

    prepare: str
    setup: str
    pin: str
    grants: tuple[str, ...]
    context: InstallContext

    @property
    def finish(self) -> str:
        """`setup` and `pin`, the file's (and a migration's) last statements."""
        return self.setup + "\n\n" + self.pin


def writer_functions(machine: Machine, n: Names) -> list[str]:
    """The functions the writer role owns (raw): those that move rows, the heartbeat,
    the guard, which stamps a direct move's times, and the wake-ups' question, which
    looks at the limits' slots as a claim does. They write the columns the database
    keeps (`entered_at`, the claim columns), on which the application role has no
    grant: their values are the database's, never a caller's. None without a writer
    role: they stay the installer's."""
    if not machine.postgres.writer_role:
        return []
    return [*n.movers(machine.lease is not None), n.guard_update, *_asked(machine, n)]


def callable_functions(machine: Machine, n: Names) -> list[str]:
    """The SECURITY DEFINER functions an application calls (raw): EXECUTE on them is
    granted, never PUBLIC's (the writer's, and purge, which the owner keeps)."""
    return [*n.movers(machine.lease is not None), n.purge, *_asked(machine, n)]


def _asked(machine: Machine, n: Names) -> list[str]:
    """`postgres.notify`'s `_claimable_in`, which a waiting worker asks (raw)."""
    return [n.claimable_in] if machine.notified else []


def app_writes(machine: Machine, n: Names) -> tuple[str, str]:
    """The application's column privileges on the machine's table and on its event log
    (`app_grants`), which `fsmc migrate` grants again to the roles that move rows.

    Column by column: the application may give a new row its id (where the database
    makes none: a bigint id is its sequence's) and (an initial) state,
    and move a row by hand (state, state_version and a capped event's count, which the
    guard checks); every other column is the database's. So a row's id and
    `created_at` never change, `entered_at` and the claim columns are stamped by the
    functions and the guard, and an event row's `at` is its transaction's time: no
    caller can forge history, dwell times, leases or retention. Grants cost nothing
    per statement; a trigger checking the same would cost every write."""
    counts = [sql_ident(count_column(e)) for e in machine.cap_limits]
    # 1.2: a row's own cap is chosen when it is inserted (the CHECK bounds it), then fixed.
    caps = [sql_ident(cap_column(e)) for e in machine.per_row_caps]
    # 1.2: the time a row born in a state that waits for one is due (the guard sets
    # every other due time); nothing else of it is the application's to write.
    caps += ["due_at"] if any(t.kind == "due_at" for t in machine.timers.values()) else []
    logged = [n.sql.id_column, "version", "from_state", "event", "to_state", "actor", "payload"]
    # 1.2: the row's own data is the application's to write, at insert and after.
    data = [str(c.name) for c in machine.postgres.columns]
    # A new row's id, unless the database's sequence makes them (`ID_TYPES`' `given`).
    ids = ["id"] if ID_TYPES[machine.postgres.id_type].given else []
    return (
        f"INSERT ({', '.join([*ids, 'state', *caps, *data])}), UPDATE ({', '.join(['state', 'state_version', *counts, *data])})",
        f"INSERT ({', '.join(logged)})",
    )


def install(machine: Machine, n: Names, signatures: dict[str, str]) -> Install:
    """The installation's statements for `machine`, whose schema creates the functions
    of `signatures` (raw name -> `name(types)` as SQL spells it; the writer's name
    function included)."""
    owned, definers = writer_functions(machine, n), callable_functions(machine, n)
    context = InstallContext(
        machine=str(machine.name),
        n=n.sql,
        writer=n.writer,
        table=n.table,
        events_table=n.events_table,
        limits_table=n.limits if machine.state_limits else "",
        owned=pg_text_array(signatures[f] for f in owned),
        definers=pg_text_array(signatures[f] for f in definers),
        functions=pg_text_array(signatures.values()),
        writes=app_writes(machine, n),
        executable=[signatures[f] for f in definers],
        writer_role=machine.postgres.writer_role,
    )
    macros = _template().make_module(vars=as_variables(context))
    return Install(
        prepare=_call(macros, "prepare"),
        setup=_call(macros, "setup"),
        pin=_call(macros, "pin"),
        grants=_grants(context, "{schema}", "{role}"),
        context=context,
    )


def app_grants(install: Install, schema: str, role: str) -> list[str]:
    """What an application role needs, and all it gets (the README's list; the tests'
    application role gets exactly these), for a raw schema and role name."""
    return list(_grants(install.context, sql_ident(schema), sql_ident(role)))


def _grants(context: InstallContext, s: str, r: str) -> tuple[str, ...]:
    """The grants macro for a schema and a role as SQL spells them (or placeholders)."""
    macros = _template().make_module(vars=as_variables(context))
    return tuple(line for line in _call(macros, "grants", s, r).split("\n") if line)


def _call(macros: jinja2.environment.TemplateModule, name: str, *args: str) -> str:
    """The text of the template's macro `name` called with `args`."""
    return str(getattr(macros, name)(*args))


@cache
def _template() -> jinja2.Template:
    return environment().get_template("install.sql.j2")
