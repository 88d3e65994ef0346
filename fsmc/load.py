"""Load: spec bytes -> a tree of plain Python values that remember where they came from.

The tree is made of `Mapping` (a dict), `Sequence` (a list), `Text` (a str) and the
other YAML 1.2 core scalars (int, float, bool, None). Containers and text carry
their 1-based `line` and `col`; a mapping also keeps the position of each key and
value, a sequence of each item, so any JSON path can be turned back into a
`file:line:col` (see `position_of`).

What it guarantees, for any input at all:
- it never raises for user input and never runs code: YAML tags are refused, and
  events are composed by this module, not by PyYAML's constructors;
- `on`, `off`, `yes`, `no` are strings (YAML 1.2 core), not booleans;
- a repeated mapping key is a `duplicate-key` diagnostic (the first value is kept);
- input past the limits below is refused with a `limit` diagnostic naming the
  limit, before it can cost time or memory: the file size is checked before
  parsing, nesting depth and alias expansion while composing (libyaml's own
  composer recurses in C and crashes the process on deep nesting, so it is not used).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from fsmc.diagnostics import DUPLICATE_KEY, LIMIT, SCHEMA, YAML_SYNTAX, Code, Diagnostic

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 1_000_000

Pos = tuple[int, int]


class Text(str):
    """A string that knows its 1-based line and column in the spec."""

    line: int
    col: int

    def __new__(cls, value: str, line: int = 0, col: int = 0) -> Text:
        self = super().__new__(cls, value)
        self.line = line
        self.col = col
        return self

    @property
    def pos(self) -> Pos:
        return (self.line, self.col)


class Mapping(dict[str, Any]):
    """A YAML mapping; `key_pos` and `value_pos` give each entry's positions."""

    def __init__(self, pos: Pos) -> None:
        super().__init__()
        self.pos = pos
        self.key_pos: dict[str, Pos] = {}
        self.value_pos: dict[str, Pos] = {}


class Sequence(list[Any]):
    """A YAML sequence; `item_pos[i]` is the position of item i."""

    def __init__(self, pos: Pos) -> None:
        super().__init__()
        self.pos = pos
        self.item_pos: list[Pos] = []


@dataclass(frozen=True)
class Document:
    """A loaded spec: its tree, the name diagnostics use, the path generated headers
    record, and the sha256 of its bytes."""

    file: str
    path: str
    root: Any
    sha256: str


# YAML 1.2 core schema, for plain (unquoted, untagged) scalars only.
_CONSTANTS: dict[str, Any] = {
    "": None, "~": None, "null": None, "Null": None, "NULL": None,
    "true": True, "True": True, "TRUE": True,
    "false": False, "False": False, "FALSE": False,
}  # fmt: skip
_NUMBER_START = frozenset("0123456789+-.")
_INT10 = re.compile(r"[-+]?[0-9]+")
_INT8 = re.compile(r"0o[0-7]+")
_INT16 = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"([-+]?)\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")


def resolve_plain(value: str) -> Any:
    """The YAML 1.2 core value of a plain scalar."""
    if value in _CONSTANTS:
        return _CONSTANTS[value]
    if value[0] not in _NUMBER_START:
        return value
    if _INT10.fullmatch(value):
        if len(value) > 4000:  # past Python's 4,300-digit limit, int() would raise
            return float(value)
        return int(value, 10)
    if _INT8.fullmatch(value):
        return int(value[2:], 8)
    if _INT16.fullmatch(value):
        return int(value[2:], 16)
    if _FLOAT.fullmatch(value):
        return float(value)
    if m := _INF.fullmatch(value):
        return float("-inf") if m.group(1) == "-" else float("inf")
    if _NAN.fullmatch(value):
        return float("nan")
    return value


class LoadFailure(Exception):
    """Composition cannot go on; carries the diagnostic that says why."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def load(data: bytes, file: str, path: str | None = None) -> tuple[Document | None, list[Diagnostic]]:
    """Parse `data` into a `Document`, or None when the bytes are not a YAML tree.

    Diagnostics for problems that leave a usable tree (a duplicate key, a tag, a
    non-string key) come back alongside the document.
    """
    if len(data) > MAX_BYTES:
        return None, [
            Diagnostic(
                file, 1, 1, LIMIT,
                # Only MAX_BYTES + 1 bytes were read, so the real size is unknown.
                f"the file is larger than {_size(MAX_BYTES)}, the most fsmc reads in a spec",
            )
        ]  # fmt: skip
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _position_in_bytes(data, exc.start)
        return None, [
            Diagnostic(
                file, line, col, YAML_SYNTAX,
                f"the file is not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be decoded",
            )
        ]  # fmt: skip
    if text.startswith("\ufeff"):
        text = text[1:]  # a UTF-8 byte order mark is allowed, and not part of the text
    composer = _Composer(file)
    try:
        root = composer.compose(text)
    except LoadFailure as exc:
        return None, [*composer.diagnostics, exc.diagnostic]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        if "maximum nesting depth" in problem:
            # libyaml 0.2.5+ has its own limit (1,000), which its scanner's lookahead
            # can reach before our composer sees level 65: the same limit to the user.
            message = f"nesting is deeper than {MAX_DEPTH} levels"
            return None, [*composer.diagnostics, Diagnostic(file, line, col, LIMIT, message)]
        if exc.context and exc.problem:
            started = exc.context_mark
            if started is not None and (started.line, started.column) != (line - 1, col - 1):
                problem = (
                    f"{exc.problem} ({exc.context} started at line {started.line + 1}, "
                    f"column {started.column + 1})"
                )
            else:
                problem = f"{exc.problem} ({exc.context})"
        return None, [*composer.diagnostics, Diagnostic(file, line, col, YAML_SYNTAX, problem)]
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        # libyaml counts the offset in UTF-8 bytes (and gives the character as an
        # int), PyYAML's own reader in characters.
        c = exc.character if isinstance(exc.character, int) else ord(exc.character)
        at = exc.position if isinstance(exc.character, int) else len(text[: exc.position].encode())
        line, col = _position_in_bytes(text.encode(), at)
        message = (f"character U+{c:04X} is not allowed in YAML text; "
                   "write it as an escape in a double-quoted string")
        return None, [*composer.diagnostics, Diagnostic(file, line, col, YAML_SYNTAX, message)]
    except yaml.YAMLError as exc:
        return None, [*composer.diagnostics, Diagnostic(file, 1, 1, YAML_SYNTAX, str(exc))]
    digest = hashlib.sha256(data).hexdigest()
    return Document(file, path or file, root, digest), composer.diagnostics


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def _position_in_bytes(data: bytes, offset: int) -> Pos:
    before = data[:offset]
    line = before.count(b"\n") + 1
    line_start = before.rfind(b"\n") + 1
    col = len(before[line_start:].decode("utf-8", errors="replace")) + 1
    return line, col


def _parser(text: str) -> Any:
    """libyaml's event parser when present (fast, iterative), else PyYAML's own."""
    if getattr(yaml, "__with_libyaml__", False):
        from yaml._yaml import CParser

        return CParser(text)
    return yaml.BaseLoader(text)


class _Frame:
    """A container being composed: its value, its path part, and a pending key."""

    __slots__ = ("value", "part", "key", "key_pos", "anchor", "nodes")

    def __init__(self, value: Mapping | Sequence, part: str | int | None, anchor: str | None):
        self.value = value
        self.part = part
        self.key: Any = _NO_KEY
        self.key_pos: Pos = (0, 0)
        self.anchor = anchor
        self.nodes = 1


_NO_KEY = object()


class _Composer:
    """Builds the tree from parser events with an explicit stack (no recursion)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.diagnostics: list[Diagnostic] = []
        self.anchors: dict[str, tuple[Any, Pos, int]] = {}
        self.nodes = 0
        self.stack: list[_Frame] = []

    def _diag(self, pos: Pos, code: Code, message: str) -> None:
        self.diagnostics.append(Diagnostic(self.file, pos[0], pos[1], code, message))

    def _fail(self, pos: Pos, code: Code, message: str) -> LoadFailure:
        return LoadFailure(Diagnostic(self.file, pos[0], pos[1], code, message))

    def compose(self, text: str) -> Any:
        parser = _parser(text)
        try:
            return self._compose(parser)
        finally:
            dispose = getattr(parser, "dispose", None)
            if dispose is not None:
                dispose()

    def _compose(self, parser: Any) -> Any:
        stack: list[_Frame] = []
        self.stack = stack
        root: Any = None
        documents = 0
        get_event = parser.get_event
        while True:
            event = get_event()
            if event is None:
                break
            kind = type(event)
            if kind is yaml.StreamStartEvent or kind is yaml.StreamEndEvent:
                continue
            if kind is yaml.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise self._fail(
                        _pos(event), YAML_SYNTAX,
                        "a spec holds one YAML document; found a second one",
                    )  # fmt: skip
                continue
            if kind is yaml.DocumentEndEvent:
                continue
            pos = _pos(event)
            if kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                frame = stack.pop()
                if frame.anchor is not None:
                    self.anchors[frame.anchor] = (frame.value, frame.value.pos, frame.nodes)
                if stack:
                    stack[-1].nodes += frame.nodes
                    self._attach(stack[-1], frame.value, frame.value.pos)
                else:
                    root = frame.value
                continue
            tag = getattr(event, "tag", None)
            if tag is not None and not (kind is yaml.ScalarEvent and tag == "!"):
                shown = tag.replace("tag:yaml.org,2002:", "!!")
                self._diag(pos, YAML_SYNTAX, f"YAML tags are not allowed in a spec (found '{shown}')")
            if kind is yaml.ScalarEvent:
                value: Any
                if not event.style and tag is None:  # plain scalar (libyaml says "", PyYAML None)
                    value = resolve_plain(event.value)
                    if type(value) is str:
                        value = Text(value, pos[0], pos[1])
                else:
                    value = Text(event.value, pos[0], pos[1])
                self._count(pos, 1)
                if event.anchor is not None:
                    self.anchors[event.anchor] = (value, pos, 1)
                if stack:
                    stack[-1].nodes += 1
                    self._attach(stack[-1], value, pos)
                else:
                    root = value
            elif kind is yaml.AliasEvent:
                if event.anchor not in self.anchors:
                    raise self._fail(pos, YAML_SYNTAX, f"unknown alias *{event.anchor}")
                value, _, size = self.anchors[event.anchor]
                self._count(pos, size)
                if stack:
                    stack[-1].nodes += size
                    self._attach(stack[-1], value, pos)
                else:
                    root = value
            else:  # a collection starts
                if len(stack) >= MAX_DEPTH:
                    raise self._fail(
                        pos, LIMIT, f"nesting is deeper than {MAX_DEPTH} levels"
                    )  # fmt: skip
                self._count(pos, 1)
                container: Mapping | Sequence = (
                    Mapping(pos) if kind is yaml.MappingStartEvent else Sequence(pos)
                )
                part = self._part_for_child(stack[-1]) if stack else None
                stack.append(_Frame(container, part, event.anchor))
        return root

    def _count(self, pos: Pos, nodes: int) -> None:
        self.nodes += nodes
        if self.nodes > MAX_NODES:
            raise self._fail(
                pos, LIMIT,
                f"the document expands to more than {MAX_NODES:,} YAML nodes "
                "(aliases count once per use)",
            )  # fmt: skip

    def _part_for_child(self, frame: _Frame) -> str | int | None:
        if isinstance(frame.value, Sequence):
            return len(frame.value)
        return None if frame.key is _NO_KEY else str(frame.key)

    def _attach(self, frame: _Frame, value: Any, pos: Pos) -> None:
        container = frame.value
        if isinstance(container, Sequence):
            container.append(value)
            container.item_pos.append(pos)
            return
        if frame.key is _NO_KEY:
            frame.key = value
            frame.key_pos = pos
            return
        key, key_pos = frame.key, frame.key_pos
        frame.key = _NO_KEY
        if isinstance(key, (Mapping, Sequence)):
            self._diag(key_pos, SCHEMA, f"{self._path(frame)}: a mapping key must be a name")
            return
        if not isinstance(key, str):
            shown = _plain_repr(key)
            self._diag(
                key_pos, SCHEMA,
                f"{self._path(frame)}: key {shown} is {_kind(key)}, not a name; "
                f"quote it ('{shown}') to use it as a name",
            )  # fmt: skip
            key = Text(shown, key_pos[0], key_pos[1])
        if key in container:
            first = container.key_pos[key]
            where = f"line {first[0]}" + (f", column {first[1]}" if first[0] == key_pos[0] else "")
            self._diag(
                key_pos, DUPLICATE_KEY,
                f"duplicate key '{key}' (first defined at {where}); "
                "YAML loaders would silently keep only one",
            )  # fmt: skip
            return
        container[key] = value
        container.key_pos[key] = key_pos
        container.value_pos[key] = pos

    def _path(self, frame: _Frame) -> str:
        # `frame` is the top of the stack; the path is the parts of every open frame.
        parts = [f.part for f in self.stack if f.part is not None]
        return format_path(parts) or "(top level)"


def _pos(event: Any) -> Pos:
    mark = event.start_mark
    return (mark.line + 1, mark.column + 1)


def _plain_repr(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return "a " + type(value).__name__


_SHOWN = 60  # characters of a string value a message quotes


def describe_value(value: Any) -> str:
    """How a diagnostic names a value the user wrote: `boolean true`, `integer 5`."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        if len(value) > _SHOWN:  # a whole non-spec file (`fsmc check /etc/passwd`) is one string
            return f"string '{value[:_SHOWN]}...' ({len(value):,} characters)"
        return f"string '{value}'"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {_plain_repr(value)}"
    if isinstance(value, int):
        return f"integer {value}"
    return f"number {value}"


def format_path(parts: list[str | int] | tuple[str | int, ...]) -> str:
    """JSON-style path: `transitions[3].to` (lists indexed from 0)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def walk(root: Any, parts: Iterator[str | int] | list[str | int]) -> tuple[Any, Pos]:
    """The value at `parts` below `root`, and its position (as near as exists)."""
    node, pos = root, getattr(root, "pos", (1, 1))
    for part in parts:
        if isinstance(node, Sequence) and isinstance(part, int) and 0 <= part < len(node):
            node, pos = node[part], node.item_pos[part]
        elif isinstance(node, Mapping) and isinstance(part, str) and part in node:
            node, pos = node[part], node.value_pos[part]
        else:
            break
    return node, pos


def position_of(root: Any, parts: list[str | int]) -> Pos:
    return walk(root, parts)[1]


def key_position(root: Any, parts: list[str | int], key: str) -> Pos:
    """Where `key` is written in the mapping at `parts` (for unknown-key errors)."""
    node, pos = walk(root, parts)
    if isinstance(node, Mapping) and key in node.key_pos:
        return node.key_pos[key]
    return pos
