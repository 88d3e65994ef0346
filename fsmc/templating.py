"""Templating: the strict Jinja2 environment every emitter renders with.

Templates live in the top-level `templates/` folder, which the wheel ships as the
`fsmc.templates` package; a source checkout reads the folder directly. The
environment is strict (an undefined name is an error, a bug of ours) and has no
autoescape: escaping is done per target by the filters from `fsmc.escape`, which
are the only way a template may put spec text into output (`sql_ident` quotes a
raw name where it is printed). A template's variables are the fields of its typed
context (`as_variables`).
"""

from __future__ import annotations

import os
from dataclasses import fields
from functools import cache
from importlib import resources
from pathlib import Path

import jinja2
import jinja2.bccache

from fsmc import escape


def _source_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "templates"


def _read_template(name: str) -> str | None:
    try:
        package = resources.files("fsmc.templates")
        resource = package.joinpath(name)
        if resource.is_file():
            return resource.read_text(encoding="utf-8")
    except ModuleNotFoundError:
        pass
    path = _source_dir() / name
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return None


class _QuietCache(jinja2.FileSystemBytecodeCache):
    """Jinja2's file cache of compiled templates, where a cache that cannot be read or
    written is no cache: never an error of the build."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except OSError:
            pass

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept in the user's cache folder (`$XDG_CACHE_HOME/fsmc`, by
    default `~/.cache/fsmc`), as mypy and ruff keep theirs: compiling the templates was
    a fifth of a whole `fsmc build` process. A template whose text changed is compiled
    again (the cache is keyed by its source). Not in the temp directory, where a
    build's own staged files live. None where the folder cannot be made: then every
    process compiles."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "fsmc", "jinja2")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return _QuietCache(folder)


def template_names() -> list[str]:
    """Every template's name (the files of the templates folder)."""
    try:
        package = resources.files("fsmc.templates")
        return sorted(r.name for r in package.iterdir() if r.name.endswith(".j2"))
    except ModuleNotFoundError:
        return sorted(p.name for p in _source_dir().glob("*.j2"))


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_read_template),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )
    env.filters.update(
        py_str=escape.py_str,
        py_comment=escape.py_comment,
        ts_str=escape.ts_str,
        ts_comment=escape.ts_comment,
        sql_str=escape.sql_str,
        sql_ident=escape.sql_ident,
        sql_comment=escape.sql_comment,
        sql_text_array=escape.sql_text_array,
        mermaid_comment=escape.mermaid_comment,
        md=escape.md_text,
        html_comment=escape.html_comment,
    )
    return env


def as_variables(context: object) -> dict[str, object]:
    """A typed context's fields as template variables (shallow: values stay typed)."""
    return {f.name: getattr(context, f.name) for f in fields(context)}  # type: ignore[arg-type]


def render(template: str, **context: object) -> str:
    return environment().get_template(template).render(**context)
