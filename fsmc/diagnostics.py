"""Diagnostics: what every stage returns for a user mistake, and how they are printed.

A `Diagnostic` is five facts (position, severity, code, message) plus the file it
belongs to. Stages create them with 1-based lines and columns; only the CLI prints
them, in one of three formats:

    text    FILE:LINE:COL: SEVERITY: MESSAGE [CODE]      (stdout, like mypy and ruff)
    json    a JSON array of {file, line, col, severity, code, message}   (stdout)
    github  ::error file=F,line=L,col=C,title=CODE::MESSAGE   (stdout, Actions annotations)

Printing sorts by (file, line, col, code, message) and drops exact duplicates, so
output does not depend on the order in which rules ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


class Code(str):
    """A diagnostic code, as mypy's `ErrorCode`: the kebab-case string users see and
    filter on, carrying its severity, a one-line summary (the README's table) and
    whether it makes the machine's graph meaningless.

    `blocks_graph` codes mean the names or the shape do not resolve into the machine
    the author meant: the graph rules do not run after one (one mistake, one
    diagnostic), and `fsmc graph` does not draw the machine. A `str` subclass, so a
    code compares, sorts, hashes and serialises as its string.
    """

    severity: Severity
    summary: str
    blocks_graph: bool

    def __new__(cls, code: str, severity: Severity, summary: str, *, blocks_graph: bool = False) -> Code:
        self = super().__new__(cls, code)
        self.severity = severity
        self.summary = summary
        self.blocks_graph = blocks_graph
        return self


YAML_SYNTAX = Code("yaml-syntax", "error", "the file is not valid YAML (or not UTF-8 text)", blocks_graph=True)
DUPLICATE_KEY = Code("duplicate-key", "error", "a mapping repeats a key", blocks_graph=True)
SCHEMA = Code("schema", "error", "the document does not fit the spec language", blocks_graph=True)
LIMIT = Code("limit", "error", "the file is past one of fsmc's documented size limits", blocks_graph=True)
BAD_NAME = Code("bad-name", "error", "a name breaks the naming rule", blocks_graph=True)
DUPLICATE_NAME = Code("duplicate-name", "error", "a state or event is declared twice", blocks_graph=True)
UNKNOWN_STATE = Code("unknown-state", "error", "a reference names an undeclared state", blocks_graph=True)
UNKNOWN_EVENT = Code("unknown-event", "error", "a reference names an undeclared event", blocks_graph=True)
DUPLICATE_TRANSITION = Code(
    "duplicate-transition", "error", "the same (from, event) pair is declared twice"
)
UNREACHABLE_STATE = Code("unreachable-state", "error", "a state cannot be reached from an initial state")
TERMINAL_EXIT = Code("terminal-exit", "error", "a terminal state has an outgoing transition")
DEAD_END = Code("dead-end", "error", "a non-terminal state has no outgoing transition")
TRAP = Code("trap", "error", "from a non-terminal state no terminal state can be reached")
LEASE_RECLAIM = Code("lease-reclaim", "error", "a lease state has no transition on the reclaim event")
CAP_TRAP = Code(
    "cap-trap", "error", "every way out of a non-terminal state is a capped event"
)
TIMER_CONFLICT = Code("timer-conflict", "error", "a state has more than one timed transition out")
UNCAPPED_BUDGET = Code(
    "uncapped-budget", "error", "a backoff, an `otherwise`, a `spent` or a `reset` relies on an event that is not capped"
)
BAD_COLUMN = Code("bad-column", "error", "a declared column's name, type or default cannot be used")
UNUSED_EVENT = Code("unused-event", "warning", "a declared event is used by no transition")

# The contract's table of codes, in the order the README lists them.
CODES: dict[str, Code] = {
    c: c
    for c in (
        YAML_SYNTAX, DUPLICATE_KEY, SCHEMA, LIMIT, BAD_NAME, DUPLICATE_NAME, UNKNOWN_STATE,
        UNKNOWN_EVENT, DUPLICATE_TRANSITION, UNREACHABLE_STATE, TERMINAL_EXIT, DEAD_END,
        TRAP, LEASE_RECLAIM, CAP_TRAP, TIMER_CONFLICT, UNCAPPED_BUDGET, BAD_COLUMN, UNUSED_EVENT,
    )
}  # fmt: skip
BLOCKS_GRAPH: frozenset[str] = frozenset(c for c in CODES.values() if c.blocks_graph)


@dataclass(frozen=True, order=True)
class Diagnostic:
    file: str
    line: int
    col: int
    code: Code
    message: str

    @property
    def severity(self) -> Severity:
        return CODES[self.code].severity

    @property
    def blocks_graph(self) -> bool:
        return CODES[self.code].blocks_graph

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def as_text(self) -> str:
        file, message = _printable(self.file), _printable(self.message)
        return f"{file}:{self.line}:{self.col}: {self.severity}: {message} [{self.code}]"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
        }

    def as_github(self) -> str:
        # Workflow-command escaping, as actions/toolkit does it: properties escape
        # , and : as well; the message escapes %, CR and LF.
        def prop(value: str) -> str:
            return _escape_data(value).replace(":", "%3A").replace(",", "%2C")

        level = "error" if self.is_error else "warning"
        return (
            f"::{level} file={prop(self.file)},line={self.line},col={self.col},"
            f"title={prop(self.code)}::{_escape_data(_printable(self.message))}"
        )


def _printable(text: str) -> str:
    """`text` with each non-printable character (a line break, ESC) as its escape:
    spec text quoted in a message (a name with a newline) must keep one diagnostic
    on one line, and must not drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def ordered(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Sorted, without exact duplicates: the order printing uses. By one key tuple a
    diagnostic, the dataclass's own order: its `__lt__` builds two tuples for every
    comparison, which made sorting 100,000 duplicate keys' diagnostics seconds."""
    return sorted(set(diagnostics), key=_sort_key)


def _sort_key(d: Diagnostic) -> tuple[str, int, int, str, str]:
    return (d.file, d.line, d.col, d.code, d.message)


def has_errors(diagnostics: Iterable[Diagnostic], *, strict: bool = False) -> bool:
    return any(d.is_error or strict for d in diagnostics)


def render(diagnostics: Iterable[Diagnostic], fmt: str) -> str:
    """The printed form of `diagnostics` in `fmt` (text, json or github)."""
    items = ordered(diagnostics)
    if fmt == "json":
        return json.dumps([d.as_dict() for d in items], indent=2, ensure_ascii=False) + "\n"
    if fmt == "github":
        return "".join(d.as_github() + "\n" for d in items)
    return "".join(d.as_text() + "\n" for d in items)
