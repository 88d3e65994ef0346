"""Shape: the JSON Schema check of a loaded spec, as positioned diagnostics.

The schema (`spec.schema.json`, printed by `fsmc schema`) is the one editors use.
Every jsonschema error becomes a `schema` diagnostic at the node it is about, with
a message that names the JSON path (`transitions[3].to: ...`). Errors about the
*spelling* of a name (pattern, maxLength) are left out: the `bad-name` rule
reports those with the naming rule spelled out, and once is enough.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

from fsmc.diagnostics import LIMIT, SCHEMA, Diagnostic
from fsmc.load import Document, Mapping, describe_value, format_path, key_position, position_of
from fsmc.model import MAX_CAP, WILDCARD
from fsmc.typos import typo_of

MAX_ERRORS = 1000
_NUL_FREE = "^[^\\u0000]*$"


@cache
def schema_text() -> str:
    return resources.files("fsmc").joinpath("spec.schema.json").read_text(encoding="utf-8")


@cache
def _validator() -> Any:
    # Imported here: `fsmc graph` and `fsmc schema` should not pay for jsonschema.
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(schema_text()))


@cache
def _fast_check() -> Any:
    # fastjsonschema compiles the same schema to Python: about 20x faster than
    # jsonschema on a 20,000-transition spec, but it stops at the first error. So
    # it only answers "does it fit?"; jsonschema finds and explains every error.
    # It knows draft 7, which has every keyword this schema uses.
    import fastjsonschema

    schema = json.loads(schema_text())
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    # Draft 7 spells 2020-12's `dependentSchemas` as `dependencies` (an if/then
    # would say the same and cost a third of the check on a 20,000-transition spec).
    transition = schema["$defs"]["transition"]
    transition["dependencies"] = transition.pop("dependentSchemas")
    # The generated code formats each item's path (`data.transitions[12]`) from its
    # locals before it checks the item, for an error message this gate never reads:
    # on a 20,000-transition spec, a third of the check. Left unformatted, the path is
    # a constant; what the code accepts and refuses is the same.
    code = fastjsonschema.compile_to_code(schema).replace(".format(**locals())", "")
    root = re.search(r"^def (\w+)\(", code, re.MULTILINE)
    assert root is not None, "fastjsonschema generated no function"
    namespace: dict[str, Any] = {}
    exec(compile(code, "<fsmc: spec.schema.json, fastjsonschema>", "exec"), namespace)  # noqa: S102 - our own schema's code
    return namespace[root.group(1)]


def fits(root: Any) -> bool:
    """True when `root` satisfies the schema (the fast path; no explanations)."""
    import fastjsonschema

    try:
        _fast_check()(root)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


def check_shape(doc: Document) -> list[Diagnostic]:
    """One `schema` diagnostic per way `doc` does not fit the spec language."""
    if doc.root is None:
        return [_diag(doc, (1, 1), "the spec is empty; expected a mapping with keys fsmc, machine, "
                      "initial, states, terminals, events and transitions")]  # fmt: skip
    version = _version_problem(doc)
    if version is not None:
        return [version]
    if fits(doc.root):
        return []
    out: list[Diagnostic] = []
    for error in _validator().iter_errors(doc.root):
        out.extend(_from_error(doc, error))
        if len(out) >= MAX_ERRORS:
            # jsonschema explains ~30,000 errors a second: a 4 MiB spec of errors
            # took half a minute and printed 50 MB. Stop, and say so.
            last = out[-1]
            out.append(Diagnostic(
                doc.file, last.line, last.col, LIMIT,
                f"fsmc reports at most {MAX_ERRORS:,} schema errors in a spec; "
                "it stopped looking here",
            ))  # fmt: skip
            break
    return out


def _version_problem(doc: Document) -> Diagnostic | None:
    """A spec of another format version is not judged by version 1's rules at all."""
    root = doc.root
    if not isinstance(root, Mapping) or "fsmc" not in root:
        return None
    version = root["fsmc"]
    if type(version) is int and version == 1:
        return None
    if type(version) is int:
        message = f"fsmc: unsupported spec format version {version}; this fsmc reads version 1"
    else:
        message = f"fsmc: expected the format version, the integer 1; got {describe_value(version)}"
    return _diag(doc, root.value_pos["fsmc"], message)


def _diag(doc: Document, pos: tuple[int, int], message: str) -> Diagnostic:
    return Diagnostic(doc.file, pos[0], pos[1], SCHEMA, message)


def _from_error(doc: Document, error: Any) -> list[Diagnostic]:
    found = _translate(doc, error)
    if found is None:
        return []
    return found if isinstance(found, list) else [found]


def _translate(doc: Document, error: Any) -> Diagnostic | list[Diagnostic] | None:
    parts = list(error.absolute_path)
    where = format_path(parts) or "(top level)"
    kind, expected = error.validator, error.validator_value
    if kind == "oneOf" and parts[:1] == ["caps"]:
        # A cap is an integer or (1.2) {default, max}: explain the form the author
        # wrote (a mapping: its keys and values), not "not valid under any schema".
        branch = 1 if isinstance(error.instance, dict) else 0
        found: list[Diagnostic] = []
        for sub in error.context:
            if sub.schema_path and sub.schema_path[0] == branch:
                found.extend(_from_error(doc, sub))
        return found
    if kind == "oneOf" and parts[-1:] == ["after"] or kind == "pattern" and parts[-2:-1] == ["after"]:
        # A wait (1.2) in any other form: one diagnostic saying the three forms.
        return _diag(
            doc, position_of(doc.root, parts),
            f"{where}: a wait is a duration (a positive whole number with ms, s, m, h or d: "
            f"30s, 5m), due_at, or {{backoff: 3s, factor: 2, max: 5m}}; got {describe_value(error.instance)}",
        )  # fmt: skip
    if kind in ("pattern", "maxLength", "propertyNames"):
        if kind == "pattern" and expected == _NUL_FREE:
            return _diag(
                doc, position_of(doc.root, parts),
                f"{where}: text contains a NUL character, which PostgreSQL cannot store",
            )  # fmt: skip
        return None  # the bad-name rule reports these
    if kind == "required":
        # The structured fields, not the English message: the first required key the
        # mapping lacks.
        missing = next((k for k in expected if k not in error.instance), "?")
        allowed = list(error.schema.get("properties", {}))
        typos = [k for k in error.instance if k not in allowed and _suggest(k, [missing])]
        if typos:
            return None  # the unknown-key diagnostic already says "did you mean '<missing>'?"
        return _diag(doc, position_of(doc.root, parts), f"{where}: missing required key '{missing}'")
    if kind == "additionalProperties":
        # jsonschema reports all unknown keys of a mapping at once; one each is clearer.
        allowed = list(error.schema.get("properties", {}))
        return [
            _diag(
                doc, key_position(doc.root, parts, key),
                f"{where}: unknown key '{key}'{_suggest(key, allowed)}; "
                f"allowed keys: {', '.join(allowed)}",
            )
            for key in error.instance
            if key not in allowed
        ]  # fmt: skip
    if kind == "type":
        wanted = expected if isinstance(expected, list) else [expected]
        names = " or ".join(_TYPE_NAMES.get(str(t), str(t)) for t in wanted)
        hint = ""
        scalar = error.instance is None or isinstance(error.instance, (bool, int, float))
        if "string" in wanted and scalar:
            # A name (string only) or free text (string or null, e.g. a description).
            hint = "; quote it to use it as a name" if "null" not in wanted else "; quote it"
        if parts[:1] == ["caps"] and len(parts) == 2 and "object" in wanted:
            hint = f"; a cap is an integer from 1 to {MAX_CAP:,}, or {{default: N, max: M}}"
        elif parts[:1] == ["caps"] and len(parts) in (2, 3):
            hint = f"; a cap is an integer from 1 to {MAX_CAP:,}"
        return _diag(
            doc, position_of(doc.root, parts),
            f"{where}: expected {names}, got {describe_value(error.instance)}{hint}",
        )  # fmt: skip
    if kind == "enum":
        options = ", ".join(str(v) for v in expected)
        return _diag(
            doc, position_of(doc.root, parts),
            f"{where}: {describe_value(error.instance)} is not one of {options}",
        )  # fmt: skip
    if kind in ("minItems", "minProperties"):
        what = "list" if kind == "minItems" else "mapping"
        hint = "; a choice lists two or more states" if parts[-1:] == ["to"] else ""
        return _diag(
            doc, position_of(doc.root, parts), f"{where}: the {what} must not be empty{hint}"
        )
    if kind == "not" and error.instance == WILDCARD:
        return _diag(
            doc, position_of(doc.root, parts),
            f'{where}: "*" stands alone (from: "*" is every non-terminal state); '
            "it cannot be one name in a list",
        )  # fmt: skip
    if kind == "const" and parts[-1:] == ["from"]:
        # `except` depends on from: "*" (dependentSchemas): point at the `except`.
        return _diag(
            doc, key_position(doc.root, parts[:-1], "except"),
            f"{format_path(parts[:-1])}.except: only a wildcard source (from: \"*\") takes "
            f"except; this transition's from is {describe_value(error.instance)}",
        )  # fmt: skip
    if kind == "uniqueItems":
        return _repeated(doc, parts, where, error.instance)
    if kind in ("minimum", "maximum") and parts[:1] == ["caps"]:
        if isinstance(error.instance, float) and not error.instance.is_integer():
            return None  # infinity: its `type` error already says it is no integer
        return _diag(
            doc, position_of(doc.root, parts),
            f"{where}: a cap is an integer from 1 to {MAX_CAP:,}; "
            f"got {describe_value(error.instance)}",
        )  # fmt: skip
    return _diag(doc, position_of(doc.root, parts), f"{where}: {error.message}")


def _repeated(doc: Document, parts: list[str | int], where: str, items: Any) -> Diagnostic:
    """A list that names a state twice (a `to` choice), at the second copy."""
    seen: set[Any] = set()
    for i, item in enumerate(items):
        if not isinstance(item, (dict, list)):
            if item in seen:
                return _diag(
                    doc, position_of(doc.root, [*parts, i]),
                    f"{where}[{i}]: {describe_value(item)} is already in the list; "
                    + ("it names each event once" if parts == ["postgres", "notify"]
                       else "a choice names each state once"),
                )  # fmt: skip
            seen.add(item)
    return _diag(doc, position_of(doc.root, parts), f"{where}: the list repeats an item")


_TYPE_NAMES = {
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
    "integer": "an integer",
    "null": "null",
}


def _suggest(word: str, choices: list[str]) -> str:
    close = typo_of(word, choices)
    return f" (did you mean '{close}'?)" if close else ""

