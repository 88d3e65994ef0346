"""The loader: positions, YAML 1.2 core scalars, duplicate keys, tags and limits."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fsmc import load as loader
from fsmc.load import Mapping, Sequence, Text, load


def tree(text: str | bytes) -> object:
    data = text.encode() if isinstance(text, str) else text
    doc, diagnostics = load(data, "spec.yaml")
    assert doc is not None, diagnostics
    assert diagnostics == []
    return doc.root


def diags(text: str | bytes) -> list[tuple[str, int, int, str]]:
    data = text.encode() if isinstance(text, str) else text
    _, found = load(data, "spec.yaml")
    return [(d.code, d.line, d.col, d.message) for d in found]


def test_names_keep_their_line_and_column() -> None:
    root = tree("machine: job\nstates:\n  queued: waiting\n  done:\nterminals: [done]\n")
    assert isinstance(root, Mapping)
    assert root["machine"].pos == (1, 10)
    states = root["states"]
    assert isinstance(states, Mapping)
    keys = list(states)
    assert [(k, k.pos) for k in keys] == [("queued", (3, 3)), ("done", (4, 3))]
    assert states.key_pos["done"] == (4, 3)
    assert states.value_pos["done"] == (4, 8)  # the empty (null) value after the colon
    assert states["done"] is None
    terminals = root["terminals"]
    assert isinstance(terminals, Sequence)
    assert terminals[0].pos == (5, 13)
    assert terminals.item_pos == [(5, 13)]


def test_block_sequences_of_flow_mappings() -> None:
    root = tree("transitions:\n  - {from: a, event: go, to: b}\n  - from: b\n    event: stop\n")
    assert isinstance(root, Mapping)
    first, second = root["transitions"]
    assert first.pos == (2, 5) and first["event"].pos == (2, 22)
    assert second.pos == (3, 5) and second["event"].pos == (4, 12)


def test_yaml_1_2_core_scalars() -> None:
    root = tree(
        "on: [on, off, yes, no, y, n]\nt: [true, True, false, FALSE]\n"
        "n: [null, ~, '', Null]\ni: [1, -2, 0x1f, 0o17, '3']\nf: [1.5, .inf, -.inf]\n"
    )
    assert isinstance(root, Mapping)
    assert list(root) == ["on", "t", "n", "i", "f"]
    assert root["on"] == ["on", "off", "yes", "no", "y", "n"]
    assert all(type(v) is Text for v in root["on"])
    assert root["t"] == [True, True, False, False]
    assert root["n"] == [None, None, "", None]
    assert root["i"] == [1, -2, 31, 15, "3"]
    assert root["f"] == [1.5, float("inf"), float("-inf")]


def test_quoted_scalars_are_always_strings() -> None:
    root = tree("a: 'true'\nb: \"null\"\nc: '1'\n")
    assert root == {"a": "true", "b": "null", "c": "1"}


def test_a_byte_order_mark_and_crlf_line_endings_are_fine() -> None:
    root = tree(b"\xef\xbb\xbfmachine: job\r\nstates: [a]\r\n")
    assert isinstance(root, Mapping)
    assert root["machine"] == "job" and root["states"][0].pos == (2, 10)


def test_a_repeated_key_is_reported_at_the_second_copy() -> None:
    found = diags("states:\n  a: one\n  b:\n  a: two\n")
    assert found == [
        (
            "duplicate-key",
            4,
            3,
            "duplicate key 'a' (first defined at line 2); YAML loaders would silently keep only one",
        )
    ]


def test_a_boolean_key_is_a_schema_error_that_says_to_quote_it() -> None:
    found = diags("states:\n  true: x\n  on: y\n")
    assert [(c, line, col) for c, line, col, _ in found] == [("schema", 2, 3)]
    assert "quote it" in found[0][3] and "states" in found[0][3]


def test_tags_are_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = f"a: !!python/object/apply:os.system ['touch {marker}']\nb: !custom x\n"
    found = diags(text)
    assert [(c, line) for c, line, _, _ in found] == [("yaml-syntax", 1), ("yaml-syntax", 2)]
    assert "!!python/object/apply:os.system" in found[0][3]
    assert not marker.exists()


def test_syntax_errors_point_at_the_problem() -> None:
    found = diags("states: [a, b\nevents: x\n")
    assert len(found) == 1 and found[0][0] == "yaml-syntax"
    assert found[0][1] == 2


def test_non_utf8_bytes_are_reported_with_their_position() -> None:
    found = diags(b"machine: job\nstates: [caf\xe9]\n")
    assert found == [
        ("yaml-syntax", 2, 13, "the file is not UTF-8 text: byte 0xe9 cannot be decoded")
    ]


def test_a_second_document_is_refused() -> None:
    found = diags("a: 1\n---\nb: 2\n")
    assert [(c, line) for c, line, _, _ in found] == [("yaml-syntax", 2)]


def test_deep_nesting_is_refused_quickly_and_without_crashing() -> None:
    # libyaml's own composer recurses in C and kills the process on input like this.
    start = time.process_time()  # CPU time: the wall clock measures a loaded machine
    found = diags("[" * 100_000 + "]" * 100_000)
    assert time.process_time() - start < 5
    # Where it is noticed depends on the libyaml build (newer ones stop at their own
    # limit while scanning ahead); what the user is told does not.
    assert [(c, line, m) for c, line, _, m in found] == [
        ("limit", 1, "nesting is deeper than 64 levels")
    ]
    assert loader.MAX_DEPTH < found[0][2] <= 1001


def test_an_alias_bomb_is_refused_quickly() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    start = time.process_time()
    found = diags("\n".join(lines) + "\n")
    assert time.process_time() - start < 5
    assert len(found) == 1 and found[0][0] == "limit"
    assert "1,000,000 YAML nodes" in found[0][3]


def test_a_few_aliases_are_fine() -> None:
    root = tree("d: &d a description\nstates: {a: *d, b: *d}\n")
    assert isinstance(root, Mapping)
    assert root["states"] == {"a": "a description", "b": "a description"}


def test_a_file_past_the_size_limit_is_refused_before_parsing() -> None:
    found = diags(b"#" * (loader.MAX_BYTES + 1))
    assert [(c, line, col) for c, line, col, _ in found] == [("limit", 1, 1)]
    assert "4.0 MiB" in found[0][3]


def test_the_empty_file_is_a_document_with_no_root() -> None:
    doc, found = load(b"", "spec.yaml")
    assert doc is not None and doc.root is None and found == []


@pytest.mark.parametrize(
    ("parts", "expected"),
    [([], "(1, 1)"), (["states", "b"], "(2, 19)"), (["transitions", 0, "to"], "(3, 29)")],
)
def test_json_paths_map_back_to_positions(parts: list[str | int], expected: str) -> None:
    root = tree("machine: m\nstates: {a: x, b: y}\ntransitions: [{from: a, to: b}]\n")
    assert str(loader.position_of(root, parts)) == expected


def test_the_document_records_the_sha256_of_its_bytes() -> None:
    import hashlib

    data = b"machine: job\n"
    doc, _ = load(data, "spec.yaml", "specs/spec.yaml")
    assert doc is not None
    assert (doc.file, doc.path) == ("spec.yaml", "specs/spec.yaml")
    assert doc.sha256 == hashlib.sha256(data).hexdigest()
