"""Why the PostgreSQL schema's objects are as they are: the comment lines `build` puts
above each object in `<machine>.sql` (fsmc's own sentences, the same for every
machine; `build` escapes them). Only text: nothing here knows a machine."""

from __future__ import annotations

LEASE_INDEX = (
    "The reclaim scan reads only rows in a lease state. Keyed on state, not heartbeat_at:",
    "a heartbeat then changes no indexed column and stays a HOT update.",
)
FUNCTIONS = (
    "Every function, trigger functions included, runs with its search_path pinned to",
    "pg_catalog, the schema it was created in, and pg_temp last (the block at the end of",
    "this file): nothing a caller creates (a temporary table named like a table here, a",
    "function or operator in a schema on the caller's search_path) changes what it does,",
    "and built-ins are called by their pg_catalog names, since an exact-type overload in",
    "a schema others may create in would win over them whatever the order. Those that",
    "look rows up by key also turn seq scans off: PL/pgSQL keeps a session's plan, and",
    "one made while a table was nearly empty (a fresh deployment) would scan it whole",
    "until the next ANALYZE.",
    "",
    "The machine this schema was built from (fsmc.digest): read by `fsmc migrate`.",
)
GUARD_UPDATE = (
    "The rules live in the function, not in the WHEN clause: PostgreSQL rebuilds a",
    "WHEN clause for every statement, but keeps a PL/pgSQL function's expressions for",
    "the session, and the spec's lists are the costly part.",
)
_REACHES = "Only an UPDATE that sets state, state_version or a count reaches the function (a"
_COLUMNS_NAMED = (
    "named in the trigger, not compared in its WHEN clause: PostgreSQL rebuilds a WHEN",
    "clause for every statement, and tests a column list against the statement's SET",
    "list. What an earlier BEFORE trigger of the owner's changes in them is not seen.",
)
GUARD_UPDATE_COLUMNS = (
    _REACHES,
    "heartbeat does not), and none the writer role's functions make. The columns are",
    *_COLUMNS_NAMED,
)
# 1.2's `postgres.writer_role: false`: no one's writes are skipped.
GUARD_UPDATE_COLUMNS_EVERY_WRITE = (
    _REACHES,
    "heartbeat does not), the functions' included: there is no writer role. The columns are",
    *_COLUMNS_NAMED,
)
_AFTER = (
    "It runs AFTER the row is written, so the statement fails all the same: a BEFORE",
    "UPDATE row trigger, whatever its columns and WHEN clause, makes PostgreSQL lock",
    "every row any UPDATE of the table writes before writing it, a WAL record more for",
    "each move and each heartbeat.",
)
_BEFORE = (
    "It runs BEFORE the row is written, because the machine has caps: after, the count's",
    "CHECK would refuse a move past the cap first, with 23514 instead of the cap's code.",
)
CHECK_LOGGED = (
    "Checked at COMMIT, so a transaction may update the row and insert its event row in",
    "either order, in separate statements. Under SET CONSTRAINTS ALL IMMEDIATE it runs",
    "at the end of each statement, beside the guard, and PostgreSQL runs triggers in the",
    "order of their names: this one's sorts after the guard's, so a move along no edge",
    "is answered by the guard (23F04), not by this check's missing event row (23F05).",
)
WRITER_FUNCTIONS = (
    "The functions that move rows run as the machine's writer role (SECURITY DEFINER; the",
    "block at the end of this file creates the role if needed and gives it these functions).",
    "It is NOLOGIN and granted to no application, so the triggers below can tell these",
    "functions' writes, which keep to the spec by construction, from everyone else's, and",
    "skip their checks for them: enforcement then costs these calls almost nothing.",
)
CHECKED_FUNCTIONS = (
    "The functions that move rows run as the installer, who owns them (SECURITY DEFINER):",
    "this schema has no writer role (postgres.writer_role: false), so the triggers below",
    "check these functions' writes like everyone else's, and a legal move passes them.",
    "EXECUTE on them is granted, never PUBLIC's (the block at the end of this file).",
)
CLAIM_INDEX = (
    "Claim takes the oldest rows of the claimable states and purge the oldest terminal",
    "ones: over a table of mostly finished rows, each scan reads only its own states.",
    "Neither covers heartbeat_at, so heartbeats stay HOT updates.",
)
CLAIM_BY_INDEX = (
    "A claim limited to given values of the spec's `claim.by` columns reads the",
    "claimable rows with those values, in the order it takes them.",
)
PURGE_TICKETS = (
    "Purge's permit to delete history, one row per purging transaction: owned by the",
    "schema's owner and granted to no one, so only the SECURITY DEFINER purge function",
    "can write it, and the append-only trigger lets a DELETE through only while its",
    "transaction holds one (a setting or an advisory lock the caller could forge).",
)
INTERVALS = (
    "Every stay of every row in a state: the first from created_at (no event brought it",
    "in), each later one from the event that brought it in, to the event that took it out",
    "(the next version's), or to the clock while the row is still there.",
)
FORMAT = (
    "The format of the schema fsmc built (fsmc.targets.postgres.formats.SCHEMA_FORMAT):",
    "`fsmc migrate` upgrades a database an older fsmc built (no such function: format 1)",
    "before it compares machines, so an old database is migrated, never taken for current.",
)
PURGE = (
    "The only way history is deleted. SECURITY DEFINER, to write the owner's ticket table",
    "(the application role has no grant on it, so it cannot forge a ticket).",
)
DOMAINS = (
    "The spec's states and its (from, event, to) triples, for the tables' CHECKs, which",
    "cast to these domains. PostgreSQL reads a table's CHECK back from the catalog for",
    "every statement that writes the table, but keeps a domain's CHECK parsed for the",
    "session: the lists are read once, and each lookup is a search of a jsonb's keys (for",
    "a move, one level per name).",
)
APPEND_ONLY = ("SECURITY DEFINER only to read the ticket table, which the caller cannot.",)
GUARD_DELETE = (
    "The event log refers to its rows by id without a foreign key: checking one on every",
    "event row cost _apply a tenth of its time, and the commit-time check already refuses",
    "an event row its row did not make. What the key also did, keeping a row that has",
    "history from being deleted or truncated away, this does (purge, holding a ticket,",
    "excepted). SECURITY DEFINER only to read the ticket table.",
)
LIMITS = (
    "1.2's limits: one row per place, as many slots per limited state as its limit. A row",
    "entering the state takes a free slot (`holder`, its id) that no other transaction",
    "holds (FOR UPDATE SKIP LOCKED), or is refused when there is none: two movers never",
    "take one slot, and movers into one state do not queue behind each other. A row",
    "leaving frees its slot, which is free for others once its transaction commits. So",
    "no commit ever leaves more rows in a state than its slots, under READ COMMITTED too.",
)
LIMITS_FREE = ("The free slots, which an entering row's scan reads in slot order.",)
COUNT_LIMITS = (
    "SECURITY DEFINER: the application may read the slots, never write them; its own",
    "direct writes (and the writer role's) are counted here like every other move.",
)
LIMITS_TRIGGERS = (
    "The counting triggers fire for every role, the writer's included (no writer test in",
    "their WHEN clauses): the limit is the table's, whoever moves the rows. A write that",
    "neither enters nor leaves a limited state never reaches the function.",
)
NOTIFY = (
    "postgres.notify: a wake-up for the workers of the listed events. One channel per",
    "installation (its name derives from this schema's and the machine's, so the module",
    "computes it too); the payload is the state the row entered. PostgreSQL sends a",
    "notification at COMMIT, folding repeats within a transaction: a batch insert sends",
    "one. Any role may NOTIFY any channel: a forged one only wakes a worker to find nothing.",
)
NOTIFY_TRIGGERS = (
    "A row trigger whose WHEN clause holds the states a listed event takes rows from:",
    "every other write (a heartbeat, a move elsewhere) never reaches the function, and a",
    "statement trigger would need a transition table, which holds every row the",
    "statement writes, heartbeats included. The WHEN clause is rebuilt for every",
    "statement that sets state, so it holds the list and nothing else (a move that stays",
    "in such a state sends a wake-up too: one more claim that may find nothing).",
)
CLAIMABLE_IN = (
    "In how many seconds a row is next claimable by a listed event: 0 when one is now,",
    "the wait for the earliest due row of a timed event, NULL when none waits (or every",
    "place of a limited state the event moves rows into is taken). The module's",
    "wait_for() reads it after its LISTEN, so a row committed before then is never",
    "missed. The claim's own predicates, read through the claim's and the due indexes,",
    "skipping what other transactions hold, as the claim does. The writer's (SECURITY",
    "DEFINER), to look at the limits' slots as the claim does; EXECUTE granted, as for",
    "the claim.",
)


def guard_update(*, before: bool, writer_role: bool) -> tuple[str, ...]:
    """The update guard trigger's comment: BEFORE (with caps) or AFTER, with or without
    a writer role whose writes it skips."""
    columns = GUARD_UPDATE_COLUMNS if writer_role else GUARD_UPDATE_COLUMNS_EVERY_WRITE
    return (*columns, *(_BEFORE if before else _AFTER))
