"""Every template has a typed context whose fields are exactly its variables: a
variable the context lacks is a StrictUndefined error at render time for some spec,
a field the template never reads is a fact computed for nothing. Macros-only
templates (machine_bodies, install) count the variables their macros read."""

from __future__ import annotations

import dataclasses

import jinja2.meta
import pytest

from fsmc import migrate
from fsmc.targets import mermaid, pytest_suite, python, readme, typescript
from fsmc.targets.postgres import build, install
from fsmc.templating import environment, template_names

CONTEXTS: dict[str, type] = {
    "README.md.j2": readme.ReadmeContext,
    "diagram.mmd.j2": mermaid.DiagramContext,
    "machine.mmd.j2": mermaid.FileContext,
    "install.sql.j2": install.InstallContext,
    "machine.sql.j2": build.FileContext,
    "machine_bodies.sql.j2": build.BodyContext,
    "migrate.sql.j2": migrate.MigrateContext,
    "module.py.j2": python.ModuleContext,
    "test_module.py.j2": pytest_suite.TestFileContext,
    "module.ts.j2": typescript.ModuleContext,
    "test_module.ts.j2": typescript.TestFileContext,
}


def test_every_template_has_a_context() -> None:
    assert sorted(CONTEXTS) == template_names()


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_a_templates_context_fields_are_exactly_its_variables(name: str) -> None:
    env = environment()
    source, _, _ = env.loader.get_source(env, name)  # type: ignore[union-attr]
    variables = jinja2.meta.find_undeclared_variables(env.parse(source))
    fields = {f.name for f in dataclasses.fields(CONTEXTS[name])}
    assert fields == variables, (sorted(fields - variables), sorted(variables - fields))
