"""Escape: one function per target language for every value that reaches generated code.

Two kinds. The literal and identifier functions (`py_str`, `ts_str`, `sql_str`, `sql_line_str`,
`sql_text_array`, `sql_ident`) return text whose meaning in the target is exactly
the input, whatever it holds: quotes, backslashes, newlines, `*/`, `--`, `$$`,
`{{ }}`, `%%`, non-ASCII. The SQL ones raise ValueError for what PostgreSQL cannot
hold (NUL; an identifier over 63 bytes), which the schema stage refuses earlier.

The one-line functions (`py_comment`, `ts_comment`, `sql_comment`, `mermaid_comment`,
`html_comment`, `md_text`, `dot_id`) first `fold` the text, because comments, table
cells and labels cannot hold a line break: every run of whitespace and
non-printable characters becomes one space. Then each keeps the rest from ending
or changing its context: `mermaid_comment` makes every run of `%` one (`%%{` opens
a directive), `html_comment` writes `>` as `&gt;` and breaks up `--` (an HTML
comment may hold neither), `md_text` backslash-escapes what Markdown would read as
markup, `dot_id` quotes. A Python or SQL line comment needs nothing more.

`sql_name` derives a name (index, constraint, trigger, function) from parts; it is
no escape, and goes through `sql_ident` where SQL names it.

Templates call `py_str`, `sql_str`, `md_text` (as `md`) and the comment functions
as Jinja filters (see `fsmc.templating`); the targets' Python calls the others
while building a template's context. No template quotes or escapes by hand.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

# Printable ASCII without the two characters a Python "..." literal must escape.
_PLAIN_ASCII = re.compile(r"[ !#-\[\]-~]*")
# Characters with a meaning anywhere in a line of GitHub Markdown: emphasis, code,
# links and images, HTML and entities, table cells, strikethrough, math.
_MD_INLINE = frozenset("\\`*_[]<>|~&$")
# A line that starts like a block (a list, a heading, a quote, a rule) must not.
_MD_BLOCK_START = re.compile(r"[-+*#>=]|\d+[.)]")


def fold(text: str) -> str:
    """One line of printable text: each non-printable character becomes a space, and
    each run of white space one space, with none at either end."""
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())


def py_str(text: str) -> str:
    """A double-quoted Python string literal equal to `text`."""
    if _PLAIN_ASCII.fullmatch(text):
        return '"' + text + '"'  # the common case: a name, or plain ASCII text
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(_code_escape(ch, 0x100))
    return '"' + "".join(out) + '"'


def _code_escape(ch: str, x_below: int) -> str:
    """`ch` as the escape of its code point that a Python literal and PostgreSQL's
    E'...' both read: `\\xHH` below `x_below`, otherwise `\\uXXXX` or `\\UXXXXXXXX`."""
    code = ord(ch)
    if code < x_below:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


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


_SQL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}  # as an E'...' literal reads them


def sql_line_str(text: str) -> str:
    """A SQL string literal equal to `text` on one line of printable characters: `sql_str`'s
    where `text` is printable, otherwise an E'...' literal writing each non-printable
    character as an escape (`\\n`, `\\x1b`, `\\u202e`). For a value shown in a
    line of its own (a declared column's default, which `fsmc diff` and a migration
    script's header print), so that it can end no line and drive no terminal."""
    if text.isprintable():
        return sql_str(text)
    if "\x00" in text:
        raise ValueError("PostgreSQL text cannot hold NUL")  # the schema stage refuses NUL
    out = []
    for ch in text:
        if ch == "'":
            out.append("''")
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:  # \xHH is a byte there: for ASCII only
            out.append(_SQL_ESCAPES.get(ch) or _code_escape(ch, 0x80))
    return "E'" + "".join(out) + "'"


def sql_comment(text: str) -> str:
    return fold(text)


def ts_str(text: str) -> str:
    """A double-quoted TypeScript (JavaScript) string literal equal to `text`: `\\` and
    `"` backslash-escaped, and every character that is not printable (line breaks,
    U+2028 and U+2029, which end a line in older engines, controls, lone surrogates)
    written as a `\\u{...}` escape."""
    if _PLAIN_ASCII.fullmatch(text):
        return '"' + text + '"'
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):x}}}")
    return '"' + "".join(out) + '"'


def ts_comment(text: str) -> str:
    """A `//` line comment's text: folded to one line (a TypeScript line comment also
    ends at U+2028 and U+2029, which folding turns into spaces)."""
    return fold(text)


def sql_text_array(values: Iterable[str]) -> str:
    """A `text[]` constant holding `values` in order: `'{"a","b"}'::text[]`.

    Every element is double-quoted (so `null`, empty strings, commas and braces stay
    text) with `"` and `\\` backslash-escaped, as the array input syntax wants, and
    the whole literal goes through `sql_str`. One constant, where `x IN ('a', 'b')`
    is a list the executor must fold and hash again for every statement that checks
    it (which a CHECK constraint is, on every INSERT and UPDATE).
    """
    elements = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return sql_str("{" + ",".join(elements) + "}") + "::text[]"


def sql_jsonb_keys(values: Iterable[str]) -> str:
    """A `jsonb` constant whose keys are `values`: `'{"a": 0, "b": 0}'::pg_catalog.jsonb`.

    `constant ? x` then says whether x is one of them by a binary search over the
    sorted keys, with nothing to build first: an `= ANY` over an array of nine or
    more elements builds a hash table each time its expression is made ready, which
    for a CHECK is every statement. JSON's escapes hold any text; `sql_str` quotes
    the whole. The keys are sorted: the same set is the same constant, whatever order
    the spec wrote it in (a domain holding it is named after the set)."""
    return sql_str(json.dumps(dict.fromkeys(sorted(values), 0), ensure_ascii=False)) + "::pg_catalog.jsonb"


def sql_jsonb_paths(paths: Iterable[tuple[str, ...]]) -> str:
    """A `jsonb` constant of nested objects holding `paths` (all of one length) and no
    other: `[("a", "b")]` gives `'{"a": {"b": 0}}'::pg_catalog.jsonb`.

    `(constant #> p) = '0'` then says whether the text[] p is one of them (a leaf,
    not an inner object a shorter path stops at), a key looked up at each level. Keys are sorted at every level: the same set is the same
    constant, whatever order the spec wrote it in."""
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = 0
    return sql_str(json.dumps(tree, ensure_ascii=False)) + "::pg_catalog.jsonb"


# Every PostgreSQL keyword, of any category (`SELECT word FROM pg_get_keywords()` on
# 15, plus the words 16 to 18 added). Reserved ones must be quoted to name a table
# (`user`, `order`); quoting an unreserved one is harmless (a quoted lower-case name
# is the same identifier), so all are quoted and no category can be got wrong.
_SQL_KEYWORDS = frozenset(
    """
    abort absent absolute access action add admin after aggregate all also alter always
    analyse analyze and any array as asc asensitive assertion assignment asymmetric at
    atomic attach attribute authorization backward before begin between bigint binary
    bit boolean both breadth by cache call called cascade cascaded case cast catalog
    chain char character characteristics check checkpoint class close cluster coalesce
    collate collation column columns comment comments commit committed compression
    concurrently conditional configuration conflict connection constraint constraints
    content continue conversion copy cost create cross csv cube current current_catalog
    current_date current_role current_schema current_time current_timestamp current_user
    cursor cycle data database day deallocate dec decimal declare default defaults
    deferrable deferred definer delete delimiter delimiters depends depth desc detach
    dictionary disable discard distinct do document domain double drop each else empty
    enable encoding encrypted end enum error escape event except exclude excluding
    exclusive execute exists explain expression extension external extract false family
    fetch filter finalize first float following for force foreign format forward freeze
    from full function functions generated global grant granted greatest group grouping
    groups handler having header hold hour identity if ilike immediate immutable
    implicit import in include including increment index indexes inherit inherits
    initially inline inner inout input insensitive insert instead int integer intersect
    interval into invoker is isnull isolation join json json_array json_arrayagg
    json_exists json_object json_objectagg json_query json_scalar json_serialize
    json_table json_value keep key keys label language large last lateral leading
    leakproof least left level like limit listen load local localtime localtimestamp
    location lock locked logged mapping match matched materialized maxvalue merge
    merge_action method minute minvalue mode month move name names national natural
    nchar nested new next nfc nfd nfkc nfkd no none normalize normalized not nothing
    notify notnull nowait null nullif nulls numeric object of off offset oids old omit
    on only operator option options or order ordinality others out outer over overlaps
    overlay overriding owned owner parallel parameter parser partial partition passing
    password path placing plans policy position preceding precision prepare prepared
    preserve primary prior privileges procedural procedure procedures program
    publication quote quotes range read real reassign recheck recursive ref references
    referencing refresh reindex relative release rename repeatable replace replica reset
    restart restrict return returning returns revoke right role rollback rollup routine
    routines row rows rule savepoint scalar schema schemas scroll search second security
    select sequence sequences serializable server session session_user set setof sets
    share show similar simple skip smallint snapshot some sql stable standalone start
    statement statistics stdin stdout storage stored strict string strip subscription
    substring support symmetric sysid system system_user table tables tablesample
    tablespace temp template temporary text then ties time timestamp to trailing
    transaction transform treat trigger trim true truncate trusted type types uescape
    unbounded uncommitted unconditional unencrypted union unique unknown unlisten
    unlogged until update user using vacuum valid validate validator value values
    varchar variadic varying verbose version view views virtual volatile when where
    whitespace window with within without work wrapper write xml xmlattributes xmlconcat
    xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize
    xmltable year yes zone
    """.split()
)
_SQL_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")
SQL_NAME_MAX = 63  # NAMEDATALEN - 1: PostgreSQL silently truncates longer names


def sql_ident(name: str) -> str:
    """A SQL identifier that names exactly `name`: bare when it is a plain lower-case
    identifier and no keyword, double-quoted otherwise (quotes doubled)."""
    if "\x00" in name:
        raise ValueError("PostgreSQL identifiers cannot hold NUL")
    if len(name.encode()) > SQL_NAME_MAX:
        # PostgreSQL would truncate it silently, so two names could become one.
        raise ValueError(f"identifier longer than {SQL_NAME_MAX} bytes: {name!r}")
    if _SQL_PLAIN.fullmatch(name) and name not in _SQL_KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def sql_name(*parts: str) -> str:
    """A derived name (index, constraint, trigger, function) joining `parts` with `_`,
    unquoted. Within 63 bytes it is the plain join; past that it is cut and given an
    8-hex-digit suffix hashed from the full join, so distinct joins stay distinct
    names, and the same join always gives the same name."""
    full = "_".join(parts)
    if len(full.encode()) <= SQL_NAME_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    head = full.encode()[: SQL_NAME_MAX - len(digest) - 1].decode(errors="ignore")
    return head + "_" + digest


def mermaid_comment(text: str) -> str:
    # `%%{` opens a Mermaid directive; keep every percent sign single.
    return re.sub(r"%+", "%", fold(text))


def md_text(text: str) -> str:
    """Markdown text that renders as `text`, literally, on one line (tables included)."""
    escaped = "".join("\\" + ch if ch in _MD_INLINE else ch for ch in fold(text))
    start = _MD_BLOCK_START.match(escaped)
    if start:  # escape the punctuation that makes it a block (`1\.`, `\-`, `\#`)
        end = start.end()
        escaped = escaped[: end - 1] + "\\" + escaped[end - 1 :]
    return escaped


def html_comment(text: str) -> str:
    # An HTML comment ends at `-->`, and may not hold `--` at all.
    folded = fold(text).replace(">", "&gt;")
    while "--" in folded:
        folded = folded.replace("--", "-&#45;")
    return folded


def dot_id(text: str) -> str:
    """A double-quoted Graphviz DOT identifier equal to `text` folded to one line
    (the names it is given have nothing to fold)."""
    return '"' + fold(text).replace("\\", "\\\\").replace('"', '\\"') + '"'
