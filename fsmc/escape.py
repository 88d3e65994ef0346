"""Escape: one function per target language for every value that reaches generated code.

Templates never quote or escape by hand; they call these (registered as Jinja
filters). Each function returns text whose meaning in its target is exactly the
input, whatever the input holds: quotes, backslashes, newlines, `*/`, `--`, `$$`,
`{{ }}`, `%%`, non-ASCII. Comments cannot hold line breaks, so the comment
functions fold all whitespace to single spaces and drop non-printable characters.
"""

from __future__ import annotations

import re

_MD_PUNCT = frozenset("\\`*_{}[]<>()#+-.!|~&\"'=:$^@%")


def fold(text: str) -> str:
    """One line of printable text: whitespace runs become one space."""
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())


def py_str(text: str) -> str:
    """A double-quoted Python string literal equal to `text`."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x100:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def py_comment(text: str) -> str:
    return fold(text)


def sql_str(text: str) -> str:
    """A SQL string literal equal to `text`, whatever standard_conforming_strings says.

    Plain '...' strings treat backslashes as escapes when standard_conforming_strings
    is off, so text with a backslash uses an E'...' literal, which always does.
    """
    if "\x00" in text:
        raise ValueError("PostgreSQL text cannot hold NUL")  # the schema stage refuses NUL
    quoted = text.replace("'", "''")
    if "\\" in text:
        return "E'" + quoted.replace("\\", "\\\\") + "'"
    return "'" + quoted + "'"


def sql_comment(text: str) -> str:
    return fold(text)


def mermaid_comment(text: str) -> str:
    # `%%{` opens a Mermaid directive; keep every percent sign single.
    return re.sub(r"%+", "%", fold(text))


def md_text(text: str) -> str:
    """Markdown text that renders as `text`, literally, on one line (tables included)."""
    return "".join("\\" + ch if ch in _MD_PUNCT else ch for ch in fold(text))


def html_comment(text: str) -> str:
    # An HTML comment ends at `-->`, and may not hold `--` at all.
    folded = fold(text).replace(">", "&gt;")
    while "--" in folded:
        folded = folded.replace("--", "-&#45;")
    return folded
