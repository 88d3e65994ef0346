"""SQL parts: a generated `.sql` file -> its statements; a CREATE TABLE -> its parts.

In: text that `fsmc.targets.sql.emit` produced, and only that. Out: frozen data
that `fsmc.migrate` compares, object by object, between two machines' files.

This reads fsmc's own output, whose layout the SQL target fixes: a statement starts
at the beginning of a line; every line between statements is blank or a `--`
comment (spec text reaches the file only through those comments and through
literals inside statements); function bodies are quoted with `$fsmc$`; a statement
ends with `;` at the end of a line outside those quotes and outside a `--` comment
(comments may also sit inside a statement; a table's parts are read without them).
A statement this module
does not know (a kind other than CREATE TABLE, INDEX, FUNCTION, [CONSTRAINT]
TRIGGER) is a bug of ours, raised as an AssertionError: the migration tests run
every kind the target emits, so a new kind fails them before it reaches a user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOLLAR_QUOTE = "$fsmc$"
_IDENT = r'"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*'
_HEAD = re.compile(
    rf"CREATE (?P<kind>TABLE|INDEX|FUNCTION|TRIGGER|CONSTRAINT TRIGGER) (?P<name>{_IDENT})"
)
_TRIGGER_TABLE = re.compile(rf"CREATE (?:CONSTRAINT )?TRIGGER (?:{_IDENT}) .*? ON (?P<table>{_IDENT})")
_CONSTRAINT = re.compile(rf"CONSTRAINT (?P<name>{_IDENT}) (?P<definition>.*)", re.DOTALL)
_COLUMN = re.compile(rf"(?P<name>{_IDENT}) (?P<definition>.*)", re.DOTALL)


@dataclass(frozen=True)
class Statement:
    kind: str  # table, index, function or trigger (a constraint trigger is a trigger)
    name: str  # the object's name as SQL spells it (quoted where it must be)
    text: str  # the whole statement, ending with ';'

    @property
    def trigger_table(self) -> str:
        """The table a trigger is on (as SQL spells it)."""
        found = _TRIGGER_TABLE.match(self.text)
        assert self.kind == "trigger" and found is not None, self.text[:80]
        return found["table"]


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, whole definition), in order
    constraints: tuple[tuple[str, str], ...]  # (name, definition after `CONSTRAINT name `)
    options: tuple[tuple[str, str], ...]  # storage parameters: (name, value)


def statements(text: str) -> list[Statement]:
    """The statements of a generated `.sql` file, in file order."""
    out: list[Statement] = []
    lines: list[str] = []
    quoted = False
    for line in text.splitlines():
        if not lines and (not line.strip() or line.startswith("--")):
            continue
        lines.append(line)
        if line.count(DOLLAR_QUOTE) % 2:
            quoted = not quoted
        if not quoted and line.rstrip().endswith(";") and not line.lstrip().startswith("--"):
            out.append(_statement("\n".join(lines)))
            lines = []
    assert not lines, f"a statement runs past the end of the file: {lines[0][:80]!r}"
    return out


def _statement(text: str) -> Statement:
    if text.startswith("DO $fsmc$"):
        return Statement("do", "", text)  # the search_path pin; migrate runs its own
    head = _HEAD.match(text)
    assert head is not None, f"fsmc migrate does not know this kind of statement: {text[:80]!r}"
    return Statement(head["kind"].removeprefix("CONSTRAINT ").lower(), head["name"], text)


def table(statement: Statement) -> Table:
    """The columns, constraints and storage parameters of a CREATE TABLE."""
    assert statement.kind == "table", statement.text[:80]
    text = _uncommented(statement.text)
    start = text.index("(")
    end = _closing(text, start)
    columns: list[tuple[str, str]] = []
    constraints: list[tuple[str, str]] = []
    for element in _split(text[start + 1 : end]):
        constraint = _CONSTRAINT.fullmatch(element)
        if constraint is not None:
            constraints.append((constraint["name"], constraint["definition"]))
            continue
        column = _COLUMN.fullmatch(element)
        assert column is not None, element
        columns.append((column["name"], element))
    tail = text[end + 1 :].strip().removesuffix(";").strip()
    options: list[tuple[str, str]] = []
    if tail:
        assert tail.startswith("WITH (") and tail.endswith(")"), tail
        for option in _split(tail[len("WITH (") : -1]):
            name, _, value = option.partition("=")
            options.append((name.strip(), value.strip()))
    return Table(statement.name, tuple(columns), tuple(constraints), tuple(options))


def check_expression(definition: str) -> str:
    """`(expr)` of a constraint definition `CHECK (expr)`."""
    assert definition.startswith("CHECK ("), definition[:80]
    return definition[len("CHECK ") :]


def unquote(ident: str) -> str:
    """The name a SQL identifier stands for (`"user"` -> `user`)."""
    if ident.startswith('"'):
        return ident[1:-1].replace('""', '"')
    return ident


def _uncommented(text: str) -> str:
    """`text` without its `--` comments (those outside quotes)."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote is None and text.startswith("--", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        if quote is not None and ch == quote:
            quote = None
        elif quote is None and ch in "'\"":
            quote = ch
        out.append(ch)
        i += 1
    return "".join(out)


def _tokens(text: str) -> list[tuple[int, str]]:
    """The characters of `text` that are outside quotes ('...' and "..."), with their
    positions: what commas and parentheses mean structure."""
    out: list[tuple[int, str]] = []
    quote: str | None = None
    for i, ch in enumerate(text):
        if quote is not None:
            if ch == quote:
                quote = None  # a doubled quote closes and reopens: the same result
            continue
        if ch in "'\"":
            quote = ch
            continue
        out.append((i, ch))
    return out


def _closing(text: str, start: int) -> int:
    """The position of the parenthesis that closes the one at `start`."""
    depth = 0
    for i, ch in _tokens(text):
        if i < start:
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    raise AssertionError(f"unbalanced parentheses: {text[:80]!r}")


def _split(text: str) -> list[str]:
    """`text` cut at its top-level commas, each part stripped."""
    parts: list[str] = []
    depth, begin = 0, 0
    for i, ch in _tokens(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[begin:i].strip())
            begin = i + 1
    parts.append(text[begin:].strip())
    return [p for p in parts if p]
