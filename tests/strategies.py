"""Hypothesis strategies shared by the hostile-input, injection and naming tests.

- `hostile_text()`: free text built from the fragments that break generators
  (quotes, backslashes, line breaks, comment closers, dollar quotes, Jinja and
  Mermaid syntax, Markdown table pipes, terminal escapes, non-ASCII), never NUL;
- `machines()`: random *valid* machines, as the plain data of a spec, built so
  that every rule of the contract holds (reachable, deterministic, no trap, no
  dead end, no terminal exit, lease states reclaimable);
- `to_yaml()`: a spec dict as YAML text, every string double-quoted with YAML's
  own escapes, so any text survives the round trip exactly;
- `mutated_specs()` / `random_yaml()`: bytes that are, or almost are, specs.
"""

from __future__ import annotations

import keyword
from typing import Any

from hypothesis import strategies as st

# --- free text -----------------------------------------------------------------

HOSTILE_FRAGMENTS = (
    '"', "'", '"""', "'''", "\\", "\\n", "\\x00", "\n", "\r\n", "\r", "\t", "\v", "\f",
    "*/", "/*", "--", "-->", "<!--", "$$", "$fsmc$", "$body$", "E'", "';", "');",
    "'); DROP TABLE canary; --", "$$; CREATE TABLE pwned (); $$", "\nCREATE TABLE pwned ();",
    "\\! touch pwned", ":var", ":'var'", "{{ 7*7 }}", "{% raw %}", "{#", "#}", "{{", "}}",
    "%%{init: {'theme': 'dark'}}%%", "%%", "[*]", "-->", "note", "end", "state", ":",
    "|", "\\|", "`", "```", "</details>", "<script>alert(1)</script>", "&lt;", "&#45;",
    "# heading", "\n## Injected\n", "| a | b |", "\n| x | y |\n", "---", "...", "- ",
    "? ", "&a", "*a", "!!python/object/apply:os.system", "<<: *a", "#", "{", "}", "[", "]",
    "\u2028", "\u2029", "\x85", "\x1b[2J", "\x1b]0;title\x07", "\u202e", "\u200b",
    "\ufeff", "\x7f", "\x9b", "\ufffe", "\U0010ffff", "é", "ß", "中文", "😀", "ǅ",
    "\U0001d54f", " ", "  ", "\\u0000", "%s", "%(x)s", "{0}", "${x}", "`id`",
)

_CHARS = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")


def hostile_text(max_parts: int = 8) -> st.SearchStrategy[str]:
    """Arbitrary text, biased to fragments that mean something in a target language."""
    part = st.one_of(st.sampled_from(HOSTILE_FRAGMENTS), st.text(_CHARS, max_size=12))
    return st.lists(part, max_size=max_parts).map("".join)


def description() -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), hostile_text())


# --- names -----------------------------------------------------------------------

# Names that are syntax, keywords or special names somewhere fsmc writes to.
FIGHTING_NAMES = (
    "end", "note", "default", "state", "class", "select", "order", "user", "none", "true",
    "false", "null", "on", "off", "yes", "no", "id", "mro", "name", "value", "values",
    "items", "keys", "get", "self", "cls", "type", "return", "if", "for", "import",
    "lambda", "async", "await", "table", "from", "to", "as", "left", "right", "of",
    "direction", "classdef", "style", "click", "fork", "join", "choice", "graph",
    "initial", "terminal", "transitions", "apply", "transition", "event", "version",
    "illegal_transition", "all", "any", "where", "group", "limit", "offset", "desc",
)  # fmt: skip

_PLAIN_NAME = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
NAMES = st.one_of(_PLAIN_NAME, st.sampled_from(FIGHTING_NAMES))


def machine_name() -> st.SearchStrategy[str]:
    """A machine name no rule refuses (the fighting machine names have their own test)."""
    return st.from_regex(r"m[a-z0-9]{0,8}", fullmatch=True).filter(
        lambda n: not keyword.iskeyword(n)
    )


# --- valid machines ----------------------------------------------------------------


@st.composite
def machines(draw: st.DrawFn, *, descriptions: bool = True) -> dict[str, Any]:
    """A spec (plain data) that checks clean, but for unused-event warnings.

    Every state is reached by a spanning tree from the initial state; every
    non-terminal state gets an edge to a terminal, so no trap and no dead end;
    terminals have no outgoing edge; each (from, event) is used once.
    """
    text = description() if descriptions else st.none()
    names = draw(st.lists(NAMES, min_size=1, max_size=8, unique=True))
    n = len(names)
    event_names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    if n == 1:
        terminal_flags = [True]  # a single state is the initial one, and terminal
    else:
        rest = draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
        if not any(rest):
            rest[draw(st.integers(0, n - 2))] = True
        terminal_flags = [False, *rest]
    terminals = [s for s, t in zip(names, terminal_flags, strict=True) if t]
    non_terminal = [s for s, t in zip(names, terminal_flags, strict=True) if not t]

    table: dict[tuple[str, str], str] = {}
    spare = iter(f"ev{i}" for i in range(1000))

    def free_event(source: str) -> str:
        free = [e for e in event_names if (source, e) not in table]
        if free:
            return draw(st.sampled_from(free))
        new = next(e for e in spare if e not in event_names)
        event_names.append(new)
        return new

    for i in range(1, n):  # a spanning tree from the initial state
        parents = [s for s in names[:i] if s in non_terminal]
        parent = draw(st.sampled_from(parents))
        table[parent, free_event(parent)] = names[i]
    extra = draw(st.integers(0, 2 * n))
    for _ in range(extra):  # more edges, any non-terminal source, any target
        if not non_terminal:
            break
        source = draw(st.sampled_from(non_terminal))
        free = [e for e in event_names if (source, e) not in table]
        if free:
            table[source, draw(st.sampled_from(free))] = draw(st.sampled_from(names))
    for s in non_terminal:  # a way out from every non-terminal state
        if not _reaches_terminal(s, table, set(terminals)):
            table[s, free_event(s)] = draw(st.sampled_from(terminals))

    lease = None
    if non_terminal and draw(st.booleans()):
        held = draw(st.lists(st.sampled_from(non_terminal), min_size=1, unique=True))
        reclaim = draw(st.sampled_from(event_names))
        for s in held:
            table.setdefault((s, reclaim), names[0])
        lease = {"states": held, "reclaim": reclaim}

    items = list(table.items())
    order = draw(st.permutations(range(len(items))))
    transitions = _group_sources([items[i] for i in order], draw, text)

    spec: dict[str, Any] = {"fsmc": 1, "machine": draw(machine_name())}
    if draw(st.booleans()):
        spec["description"] = draw(text)
    spec["initial"] = names[0]
    spec["states"] = _declarations(names, draw, text)
    spec["terminals"] = terminals
    spec["events"] = _declarations(event_names, draw, text)
    spec["transitions"] = transitions
    if lease:
        spec["lease"] = lease
    if draw(st.booleans()):
        spec["postgres"] = {"id_type": draw(st.sampled_from(["uuid", "bigint", "text"]))}
    return spec


def _reaches_terminal(start: str, table: dict[tuple[str, str], str], terminals: set[str]) -> bool:
    seen, frontier = {start}, [start]
    while frontier:
        state = frontier.pop()
        if state in terminals:
            return True
        for (source, _), target in table.items():
            if source == state and target not in seen:
                seen.add(target)
                frontier.append(target)
    return False


def _declarations(names: list[str], draw: st.DrawFn, text: st.SearchStrategy[Any]) -> Any:
    if draw(st.booleans()):
        return list(names)
    return {name: draw(text) for name in names}


def _group_sources(
    items: list[tuple[tuple[str, str], str]], draw: st.DrawFn, text: st.SearchStrategy[Any]
) -> list[dict[str, Any]]:
    """Transitions, sometimes with a `from` list for edges sharing event and target."""
    out: list[dict[str, Any]] = []
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for (source, event), target in items:
        if (event, target) in grouped and draw(st.booleans()):
            entry = grouped[event, target]
            entry["from"] = [*entry["from"], source] if isinstance(entry["from"], list) else [
                entry["from"], source
            ]
            continue
        entry = {"from": source, "event": event, "to": target}
        if draw(st.booleans()):
            entry["description"] = draw(text)
        grouped[event, target] = entry
        out.append(entry)
    return out


def table_of(spec: dict[str, Any]) -> dict[tuple[str, str], str]:
    """The (from, event) -> to table a spec declares."""
    out = {}
    for t in spec["transitions"]:
        sources = t["from"] if isinstance(t["from"], list) else [t["from"]]
        for s in sources:
            out[s, t["event"]] = t["to"]
    return out


def names_of(declarations: Any) -> list[str]:
    return list(declarations)


def without_descriptions(spec: dict[str, Any]) -> dict[str, Any]:
    """The same machine with every free-text field removed."""
    out = {k: v for k, v in spec.items() if k != "description"}
    for key in ("states", "events"):
        out[key] = list(spec[key])
    out["transitions"] = [
        {k: v for k, v in t.items() if k != "description"} for t in spec["transitions"]
    ]
    return out


# --- YAML text ---------------------------------------------------------------------

_YAML_SPECIAL_PLAIN = {"true", "false", "null", "~", ""}


def yaml_str(text: str) -> str:
    """A YAML double-quoted scalar equal to `text`: YAML folds raw line breaks (and
    U+2028, U+0085) inside quotes, and refuses raw control characters, so every
    character that is not printable is written as an escape."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch.isprintable() and ch != "\ufeff" and code not in (0xFFFE, 0xFFFF):
            out.append(ch)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _name(text: str) -> str:
    """Names plain, as authors write them; only YAML's own constants need quotes."""
    return yaml_str(text) if text in _YAML_SPECIAL_PLAIN else text


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return yaml_str(value)


def to_yaml(spec: dict[str, Any]) -> str:
    """A spec in the block style people write, names plain, text double-quoted."""
    lines = []
    for key, value in spec.items():
        if key in ("machine", "initial"):
            lines.append(f"{key}: {_name(value)}")
        elif key in ("states", "events"):
            if isinstance(value, dict):
                lines.append(f"{key}:" if value else f"{key}: {{}}")
                for name, text in value.items():
                    lines.append(f"  {_name(name)}: {_scalar(text)}")
            else:
                lines.append(f"{key}: [{', '.join(_name(n) for n in value)}]")
        elif key == "terminals":
            lines.append(f"{key}: [{', '.join(_name(n) for n in value)}]")
        elif key == "transitions":
            lines.append("transitions:" if value else "transitions: []")
            for t in value:
                source = t["from"]
                shown = (
                    "[" + ", ".join(_name(s) for s in source) + "]"
                    if isinstance(source, list)
                    else _name(source)
                )
                entry = f"  - {{from: {shown}, event: {_name(t['event'])}, to: {_name(t['to'])}"
                if "description" in t:
                    entry += f", description: {_scalar(t['description'])}"
                lines.append(entry + "}")
        elif key == "lease":
            lines.append("lease:")
            lines.append(f"  states: [{', '.join(_name(s) for s in value['states'])}]")
            lines.append(f"  reclaim: {_name(value['reclaim'])}")
        elif key == "postgres":
            lines.append("postgres:")
            lines.extend(f"  {k}: {_name(v)}" for k, v in value.items())
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


# --- broken specs ------------------------------------------------------------------

_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True), hostile_text(3), NAMES,
)  # fmt: skip
_YAML_TOKENS = (
    b"&a ", b"*a", b"!!str ", b"!!python/object/apply:os.system [true]", b"!tag ", b": ",
    b"- ", b"{", b"}", b"[", b"]", b"'", b'"', b"\t", b"%YAML 1.1\n", b"---\n", b"...\n",
    b"? ", b"|", b">-", b"<<: *a", b"#", b",", b"\n", b"\r\n", b"\xef\xbb\xbf", b"\xff",
    b"\xc3", b"\x00", b"@", b"`", b"%", b"\\", b"\n  ", b"\n- ", b"&a [*a]",
)  # fmt: skip


def random_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    return st.recursive(
        _LEAF,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5),
            st.dictionaries(st.one_of(NAMES, hostile_text(2)), inner, max_size=5),
        ),
        max_leaves=max_leaves,
    )


@st.composite
def mutated_tree(draw: st.DrawFn, spec: dict[str, Any]) -> Any:
    """`spec` with a few nodes deleted, duplicated, retyped or re-nested."""
    tree = _copy(spec)
    for _ in range(draw(st.integers(1, 4))):
        tree = _mutate_once(draw, tree)
    return tree


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _mutate_once(draw: st.DrawFn, tree: Any) -> Any:
    path = draw(st.sampled_from(_paths(tree)))
    if not path:
        return draw(st.one_of(random_values(), st.just([tree]), st.just({"fsmc": tree})))
    parent = tree
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    node = parent[key]
    how = draw(st.sampled_from(["delete", "duplicate", "retype", "wrap-list", "wrap-map",
                                "replace", "move"]))  # fmt: skip
    if how == "delete":
        del parent[key]
    elif how == "duplicate":
        if isinstance(parent, list):
            parent.insert(key, _copy(node))
        else:
            parent[draw(NAMES)] = _copy(node)
    elif how == "retype":
        parent[key] = draw(_LEAF)
    elif how == "wrap-list":
        parent[key] = [node]
    elif how == "wrap-map":
        parent[key] = {draw(NAMES): node}
    elif how == "replace":
        parent[key] = draw(random_values(10))
    else:  # move: graft this node somewhere else too
        other = draw(st.sampled_from(_paths(tree)))
        target = tree
        for part in other[:-1] if other else ():
            target = target[part]
        if other and isinstance(target, (dict, list)):
            target[other[-1]] = _copy(node)
    return tree


def dump_any(value: Any, flow: bool) -> str:
    """Any tree as YAML: block or flow style, keys and strings quoted when needed."""
    if flow:
        return _flow(value) + "\n"
    return _block(value, 0)


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _leaf(value)


def _block(value: Any, indent: int) -> str:
    pad = "  " * indent
    if isinstance(value, dict) and value:
        out = ""
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out += f"{pad}{_key(k)}:\n{_block(v, indent + 1)}"
            else:
                out += f"{pad}{_key(k)}: {_flow(v)}\n"
        return out
    if isinstance(value, list) and value:
        out = ""
        for v in value:
            if isinstance(v, (dict, list)) and v:
                out += f"{pad}-\n{_block(v, indent + 1)}"
            else:
                out += f"{pad}- {_flow(v)}\n"
        return out
    return pad + _flow(value) + "\n"


def _key(key: Any) -> str:
    if isinstance(key, str):
        return _name(key) if _is_plain_name(key) else yaml_str(key)
    return _leaf(key)


def _is_plain_name(text: str) -> bool:
    return bool(text) and text[0].isalpha() and text.isascii() and text.replace("_", "a").isalnum()


def _leaf(value: Any) -> str:
    if isinstance(value, str):
        return _name(value) if _is_plain_name(value) else yaml_str(value)
    if isinstance(value, float):
        if value != value:
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return ".inf" if value > 0 else "-.inf"
    return _scalar(value)


@st.composite
def byte_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few byte-level edits: cut, duplicate, insert, flip, truncate."""
    for _ in range(draw(st.integers(1, 5))):
        n = len(data)
        at = draw(st.integers(0, n))
        how = draw(st.sampled_from(["cut", "dup", "insert", "token", "flip", "truncate",
                                    "indent", "swap-lines"]))  # fmt: skip
        if how == "cut":
            data = data[:at] + data[at + draw(st.integers(1, 40)) :]
        elif how == "dup":
            data = data[:at] + data[at : at + draw(st.integers(1, 80))] + data[at:]
        elif how == "insert":
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif how == "token":
            data = data[:at] + draw(st.sampled_from(_YAML_TOKENS)) + data[at:]
        elif how == "flip" and n:
            i = min(at, n - 1)
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
        elif how == "truncate":
            data = data[:at]
        elif how == "indent":
            lines = data.split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = draw(st.sampled_from([b" ", b"  ", b"\t", b"    "])) + lines[i]
            data = b"\n".join(lines)
        else:
            lines = data.split(b"\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
    return data
