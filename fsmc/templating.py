"""Templating: the strict Jinja2 environment every emitter renders with.

Templates live in the top-level `templates/` folder, which the wheel ships as the
`fsmc.templates` package; a source checkout reads the folder directly. The
environment is strict (an undefined name is an error, a bug of ours) and has no
autoescape: escaping is done per target by the filters from `fsmc.escape`, which
are the only way a template may put spec text into output.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

import jinja2

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


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Jinja2's cache of compiled templates, in a private folder of the system's temp
    directory (Jinja2 makes it 0700 and refuses one another user owns). Compiling the
    templates is a fifth of a whole `fsmc build` process; a template whose text
    changed is compiled again (the cache is keyed by its source). None where no such
    folder can be had: then every process compiles."""
    try:
        return jinja2.FileSystemBytecodeCache()
    except (OSError, RuntimeError):
        return None


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
        sql_str=escape.sql_str,
        sql_comment=escape.sql_comment,
        mermaid_comment=escape.mermaid_comment,
        md=escape.md_text,
        html_comment=escape.html_comment,
    )
    return env


def render(template: str, **context: object) -> str:
    return environment().get_template(template).render(**context)
