"""The documentation as the tests read it: README.md (the site's landing page) and
every page under docs/.

Each fenced block of a page is marked by the HTML comment on the line before it:
`<!-- test: NAME -->`, a block some test reads as `block("NAME")` and runs (or holds
against what fsmc does), or `<!-- not run: REASON -->`. tests/test_docs.py checks that
every block is marked, that every name is unique, and that each one is read by a test.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARK = re.compile(r"<!-- (?:test: (?P<name>[a-z0-9-]+)|not run: (?P<reason>\S.*\S)) -->")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/spec.md
    line: int  # 1-based, the opening fence
    info: str  # the fence's language: yaml, console, python, ...
    text: str
    name: str | None  # `test: NAME`
    reason: str | None  # `not run: REASON`


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def text_of(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


@functools.cache
def blocks() -> tuple[Block, ...]:
    """Every fenced block of every page, with the mark before it (or none)."""
    from markdown_it import MarkdownIt

    found = []
    for path in pages():
        page = str(path.relative_to(ROOT))
        tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))
        for i, tok in enumerate(tokens):
            if tok.type != "fence":
                continue
            before = tokens[i - 1] if i else None
            mark = MARK.fullmatch(before.content.strip()) if before is not None and before.type == "html_block" else None
            assert tok.map is not None
            found.append(Block(page, tok.map[0] + 1, tok.info.strip(), tok.content,
                               mark["name"] if mark else None, mark["reason"] if mark else None))  # fmt: skip
    return tuple(found)


def block(name: str) -> str:
    """The text of the block marked `<!-- test: NAME -->`."""
    (found,) = [b for b in blocks() if b.name == name] or [None]
    if found is None:
        raise KeyError(f"no documentation block is marked 'test: {name}'")
    return found.text


def section(page: str, title: str) -> str:
    """The text of the `## title` section of `page`, up to the next `## ` heading."""
    text = text_of(page)
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


class _Yaml12(yaml.SafeLoader):
    """PyYAML's safe loader without YAML 1.1's booleans (on, off, yes, no): names stay
    names, as fsmc reads them."""


_Yaml12.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|false)$"), list("tf"))


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12)  # noqa: S506 - a SafeLoader subclass


def example_build(name: str, schema: str, out: Path, *, typescript: bool = False) -> Path:
    """specs/<name>.yaml built with `postgres.schema: <schema>` into `out`; its folder.
    The pages' examples leave `schema=` out, so that they reach a scratch schema the
    module must name it by default (SCHEMA), as the pages say it does."""
    from tests.harness import run_fsmc

    spec = load_yaml((ROOT / "specs" / f"{name}.yaml").read_text(encoding="utf-8"))
    spec.setdefault("postgres", {})["schema"] = schema
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    ran = run_fsmc("build", path, "--out", out / "generated", *(["--typescript"] if typescript else []))
    assert ran.code == 0, ran
    return out / "generated" / name


def example_module(name: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The generated module of `folder`, importable as `fsm_<name>` (as the pages
    import it) for the length of the test."""
    from tests.harness import import_file

    module = import_file(folder / f"fsm_{name}.py", f"fsm_{name}_docs")
    monkeypatch.setitem(sys.modules, f"fsm_{name}", module)
    return module
