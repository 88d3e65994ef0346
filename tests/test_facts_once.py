"""Facts written in two forms, held together: where one fact must be stated twice
(a JSON Schema for editors and the shape check, Python for the semantic rules and
the targets), a test says the two agree, so neither drifts alone."""

from __future__ import annotations

import json
from typing import Any

from fsmc import model, validate
from fsmc.shape import schema_text
from fsmc.targets import common


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded


def test_the_json_schemas_name_rules_are_the_validators() -> None:
    defs = schema()["$defs"]
    name, table = f"^{validate.NAME.pattern}$", f"^{validate.TABLE.pattern}$"
    assert (defs["name"]["pattern"], defs["name"]["maxLength"]) == (name, validate.NAME_MAX)
    assert (defs["table"]["pattern"], defs["table"]["maxLength"]) == (table, validate.TABLE_MAX)
    transition = defs["transition"]["properties"]
    assert transition["from"]["pattern"] == f"^({validate.NAME.pattern}|[*])$"
    assert (transition["to"]["pattern"], transition["to"]["maxLength"]) == (name, validate.NAME_MAX)
    assert transition["from"]["maxLength"] == validate.NAME_MAX


def test_the_id_types_are_one_table() -> None:
    enum = schema()["properties"]["postgres"]["properties"]["id_type"]["enum"]
    assert enum == list(model.ID_TYPES) == list(common.ID_TYPES)


def test_the_diagnostics_pages_table_of_codes_is_the_registry() -> None:
    # Every code the registry has, with its severity, in the registry's order, and no other.
    import re

    from fsmc.diagnostics import CODES
    from tests import docs

    section = docs.section("docs/diagnostics.md", "The codes")
    rows = re.findall(r"^\| `([a-z-]+)` \| (error|warning) \|", section, re.MULTILINE)
    assert rows == [(code, c.severity) for code, c in CODES.items()]


def test_the_json_schemas_cap_and_limit_ranges_are_the_models() -> None:
    defs = schema()["$defs"]
    assert (defs["cap"]["minimum"], defs["cap"]["maximum"]) == (1, model.MAX_CAP)
    # A cap, a cap per row's default and max, and a limit are all that one range.
    assert schema()["properties"]["limits"]["additionalProperties"] == {"$ref": "#/$defs/cap"}
    per_row = schema()["properties"]["caps"]["additionalProperties"]["oneOf"]
    assert per_row[0] == {"$ref": "#/$defs/cap"}
    assert all(v == {"$ref": "#/$defs/cap"} for v in per_row[1]["properties"].values())


def test_every_did_you_mean_is_one_rule() -> None:
    # An unknown state, an unknown key and an unknown command are judged alike: a typo
    # (a few edits away), not a mere resemblance.
    from fsmc import cli, shape

    assert validate.typo_of("termnals", ["terminals"]) == "terminals"
    assert validate.typo_of("processed", ["being_processed"]) is None
    assert shape._suggest("processed", ["being_processed"]) == ""
    assert shape._suggest("termnals", ["terminals"]) == " (did you mean 'terminals'?)"
    assert validate.typo_of is shape.typo_of
    assert "typo_of" in cli._refuse_unknown_command.__code__.co_names
