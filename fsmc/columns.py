"""Declared columns (`postgres: {columns: ...}`): the row's own data, beside the state.

A spec may give the machine's table columns of its own (a job's arguments, its queue,
its priority). They are data: no transition reads or writes them, the guard ignores
them, and the application may insert and update them. This module is the one table
of the types a spec may give them: for each, its SQL type, the Python type the
generated module annotates it with, how the module passes a value (the exact type it
casts to, arrays of it for a batch), and which defaults a spec may write. Nothing
here knows of a spec's text: `fsmc.model` reads the declarations, `fsmc.validate`
judges them, the targets render them.

Why a closed list rather than any SQL type: the spec is input fsmc renders into SQL
and Python, so a type is a name from this table, never text copied into a statement
(a `text DEFAULT (SELECT ...)` cannot be written), and every type has a Python type
that `mypy --strict` checks callers against.
"""

from __future__ import annotations

import json
import keyword
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsmc.escape import py_str, sql_line_str

if TYPE_CHECKING:
    from fsmc.model import DeclaredColumn


@dataclass(frozen=True)
class ColumnType:
    sql: str  # as the column is declared
    cast: str  # the exact type a value is cast to, as the module writes it
    python: str  # the annotation in the generated module
    default_kind: str | None  # what a default may be: "str", "int", "bool", "number", "json"; None: no default
    low: int | None = None  # an integer type's range
    high: int | None = None


TYPES: dict[str, ColumnType] = {
    "text": ColumnType("text", "pg_catalog.text", "str", "str"),
    "jsonb": ColumnType("jsonb", "pg_catalog.jsonb", "typing.Any", "json"),
    "boolean": ColumnType("boolean", "pg_catalog.bool", "bool", "bool"),
    "smallint": ColumnType("smallint", "pg_catalog.int2", "int", "int", -(2**15), 2**15 - 1),
    "integer": ColumnType("integer", "pg_catalog.int4", "int", "int", -(2**31), 2**31 - 1),
    "bigint": ColumnType("bigint", "pg_catalog.int8", "int", "int", -(2**63), 2**63 - 1),
    "double precision": ColumnType("double precision", "pg_catalog.float8", "float", "number"),
    "numeric": ColumnType("numeric", "pg_catalog.numeric", "decimal.Decimal", "number"),
    "timestamptz": ColumnType("timestamptz", "pg_catalog.timestamptz", "datetime.datetime", None),
    "date": ColumnType("date", "pg_catalog.date", "datetime.date", None),
    "uuid": ColumnType("uuid", "pg_catalog.uuid", "uuid.UUID", None),
    "bytea": ColumnType("bytea", "pg_catalog.bytea", "bytes", None),
}

# The types a column's values may be given in place: what `ALTER COLUMN ... TYPE new
# USING column::new` can do, PostgreSQL's explicit casts among these types (text takes
# any other through its input function, and any other gives text; a test holds this
# table to the server's). `fsmc migrate` refuses any other change of type: the script
# could only fail.
_NUMBERS = frozenset({"smallint", "integer", "bigint", "double precision", "numeric"})
CONVERTS: dict[str, frozenset[str]] = {
    "text": frozenset(TYPES) - {"text"},
    "jsonb": _NUMBERS | {"text", "boolean"},
    "boolean": frozenset({"text", "integer"}),
    "smallint": _NUMBERS - {"smallint"} | {"text"},
    "integer": _NUMBERS - {"integer"} | {"text", "boolean"},
    "bigint": _NUMBERS - {"bigint"} | {"text"},
    "double precision": _NUMBERS - {"double precision"} | {"text"},
    "numeric": _NUMBERS - {"numeric"} | {"text"},
    "timestamptz": frozenset({"text", "date"}),
    "date": frozenset({"text", "timestamptz"}),
    "uuid": frozenset({"text"}),
    "bytea": frozenset({"text"}),
}

# Names a declared column cannot take, whatever the spec: the columns fsmc owns (some
# only with a lease, caps or timers, which a later release of the spec may add), the
# parameters of the generated functions (PL/pgSQL resolves a name clash in queries over
# the table in the column's favour), the dataclass's own attributes, and the keyword
# parameters of `create`. Per spec, also each event's count and cap column
# (`reserved_for`). A test holds this list to the generated code.
FSMC_OWNED = frozenset(
    {"id", "state", "state_version", "version", "created_at", "entered_at", "claimed_by",
     "claimed_at", "heartbeat_at", "due_at", "event", "actor", "payload", "to_state",
     "from_state", "expected_version", "max_rows", "older_than", "at", "holder", "slot",
     "apply", "conn", "schema", "rows"}
)  # fmt: skip

# PostgreSQL's reserved key words (categories R and T of `pg_get_keywords()`, PostgreSQL
# 15): a column named so would have to be quoted in every statement that names it.
SQL_RESERVED = frozenset(
    "all analyse analyze and any array as asc asymmetric authorization binary both case cast "
    "check collate collation column concurrently constraint create cross current_catalog "
    "current_date current_role current_schema current_time current_timestamp current_user "
    "default deferrable desc distinct do else end except false fetch for foreign freeze from "
    "full grant group having ilike in initially inner intersect into is isnull join lateral "
    "leading left like limit localtime localtimestamp natural not notnull null offset on only "
    "or order outer overlaps placing primary references returning right select session_user "
    "similar some symmetric table tablesample then to trailing true union unique user using "
    "variadic verbose when where window with".split()
)


def name_problem(name: str, reserved: frozenset[str]) -> str | None:
    """Why `name` (well-formed) cannot name a declared column, or None."""
    if name in FSMC_OWNED or name in reserved:
        return "is a column or parameter fsmc generates"
    if name.startswith("v_"):
        return "starts with v_, the prefix of the generated functions' variables"
    if keyword.iskeyword(name):
        return "is a Python keyword"
    if name in SQL_RESERVED:
        return "is a PostgreSQL reserved word"
    return None


def default_problem(kind: ColumnType, value: object) -> str | None:
    """Why `value` cannot be the default of a column of this type, or None."""
    if kind.default_kind is None:
        return f"a {kind.sql} column cannot have a default in a spec (leave it out: NULL, or given at create)"
    if kind.default_kind == "str" and not isinstance(value, str):
        return f"the default of a {kind.sql} column must be a string"
    if kind.default_kind == "bool" and not isinstance(value, bool):
        return f"the default of a {kind.sql} column must be true or false"
    if kind.default_kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"the default of a {kind.sql} column must be an integer"
        assert kind.low is not None and kind.high is not None
        if not kind.low <= value <= kind.high:
            return f"the default {value} is out of a {kind.sql}'s range ({kind.low} to {kind.high})"
    if kind.default_kind == "number" and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    ):
        return f"the default of a {kind.sql} column must be a finite number"
    if kind.default_kind == "json":
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            return "the default of a jsonb column must be a JSON value (no NaN or infinity)"
    return None


def null_problem(nullable: bool, has_default: bool) -> str | None:
    """Why a column's nullability cannot be, or None."""
    if not nullable and not has_default:
        return (
            "a column that may not be NULL needs a default: rows are inserted without it "
            "(`INSERT ... DEFAULT VALUES`, create() without it, fsmc's generated tests)"
        )
    return None


def sql_default(kind: ColumnType, value: object) -> str:
    """The SQL expression of a default `default_problem` accepts: on one printable line
    (`sql_line_str`), since `fsmc diff` and a migration's header show it."""
    if kind.default_kind == "bool":
        return "true" if value else "false"
    if kind.default_kind in ("int", "number"):
        return repr(value) if isinstance(value, float) else str(value)
    if kind.default_kind == "json":
        return sql_line_str(json.dumps(value, sort_keys=True, ensure_ascii=False)) + "::jsonb"
    return sql_line_str(str(value))


def sql_parts(column: DeclaredColumn) -> tuple[str, bool, str | None]:
    """A declared column (of a type `TYPES` has) as its table declares it: its SQL type,
    whether it is NOT NULL, and its default's SQL expression (None: none). What the
    build creates, the digest records and `fsmc diff` compares, so the three agree on
    when two declarations are one."""
    kind = TYPES[column.type]
    return kind.sql, not column.nullable, sql_default(kind, column.default) if column.has_default else None


def python_default(kind: ColumnType, value: object) -> str:
    """The Python expression of a default, for the dataclass and `create`'s docs."""
    if kind.default_kind == "number" and kind.python == "decimal.Decimal":
        return f"decimal.Decimal({py_str(str(value))})"
    if kind.default_kind == "number":
        return repr(float(value))  # type: ignore[arg-type]
    if isinstance(value, str):
        return py_str(value)
    return repr(value)
