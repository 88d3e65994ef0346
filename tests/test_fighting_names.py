"""Names that fight their targets (issue 5, third bullet; contract 1, 4.1-4.3).

States and events named like Mermaid syntax (`end`, `note`, `state`, `class`,
`default`), SQL keywords (`select`, `order`, `user`), YAML 1.1 booleans (`on`,
`off`, `yes`, `no`), Python specials (`none`, `true`, `mro`, `name`, `value`, `id`),
machines named like standard-library modules (`email`, `queue`, `types`, `test`,
`enum`, ...) and tables named like reserved words: every one compiles to working
code in every target, proven by running it (the module imported and its table
compared, the generated suites, ruff, mypy --strict, real Mermaid, psql), or is
refused with a clear `bad-name` diagnostic at the name and nothing is written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    assert_module_is_the_spec,
    assert_well_behaved,
    drop_roles,
    expected_readme_tables,
    import_file,
    load_sql,
    mypy,
    render_markdown,
    run_fsmc,
    run_pytest,
    writer_role,
)
from tests.mermaid_check import END, START, mermaid_blocks, parse_all
from tests.strategies import to_yaml

# The list, in an order that makes a valid chain.
FIGHTING = ["end", "note", "default", "state", "class", "select", "order", "user", "none",
            "true", "on", "off", "yes", "no", "id", "mro", "name", "value"]  # fmt: skip
MACHINES_THAT_WORK = [
    "email", "queue", "types", "test", "enum",  # the list
    "typing", "json", "re", "uuid", "collections", "dataclasses", "pytest", "machine",
    "apply", "transition", "select", "user", "order", "end", "default", "id",
]  # fmt: skip
# Refused: keywords (of the name or its class), the module's own class names, and
# built-ins the module relies on (`key_error` would turn `except KeyError` into a
# TypeError at the first illegal transition).
MACHINES_REFUSED = ["class", "if", "import", "none", "true", "false", "state", "event",
                    "illegal_transition", "connection", "exception", "value_error",
                    "key_error", "base_exception", "type_error"]  # fmt: skip


def fight_spec() -> dict[str, Any]:
    s = FIGHTING
    transitions = [{"from": s[i], "event": s[i], "to": s[i + 1]} for i in range(len(s) - 1)]
    transitions.append({"from": s[1:-1], "event": "value", "to": "end"})  # every one back
    return {
        "fsmc": 1, "machine": "fight", "description": "names that fight their targets",
        "initial": "end", "states": {n: f"the {n} state" for n in s}, "terminals": ["value"],
        "events": list(s), "transitions": transitions,
        "lease": {"states": ["note", "default", "state"], "reclaim": "value"},
        "postgres": {"table": "user", "events_table": "select", "id_type": "text"},
    }  # fmt: skip


def small_spec(machine: str) -> dict[str, Any]:
    return {
        "fsmc": 1, "machine": machine, "initial": "queued",
        "states": ["queued", "running", "done"], "terminals": ["done"],
        "events": ["start", "finish"],
        "transitions": [{"from": "queued", "event": "start", "to": "running"},
                        {"from": "running", "event": "finish", "to": "done"}],
        "postgres": {"id_type": "bigint"},
    }  # fmt: skip


SPECS = {"fight": fight_spec(), **{m: small_spec(m) for m in MACHINES_THAT_WORK}}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every spec above, built in one `fsmc build` run."""
    root = tmp_path_factory.mktemp("fighting")
    paths = []
    for name, spec in SPECS.items():
        path = root / "specs" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(to_yaml(spec))
        paths.append(path)
    ran = run_fsmc("build", *paths, "--out", root / "out")
    assert ran.code == 0 and assert_well_behaved(ran, cpu_seconds=30) == [], ran
    return root / "out"


def test_the_yaml_names_are_strings_not_booleans(built: Path) -> None:
    text = (built.parent / "specs" / "fight.yaml").read_text()
    assert "events: [end, note, default, state, class, select, order, user, none, " \
           '"true", on, off, yes, no, id, mro, name, value]' in text  # plain, as people write
    module = import_file(built / "fight" / "fsm_fight.py", "fsm_fight_names")
    assert [s.value for s in module.State] == FIGHTING
    assert module.State.ON == "on" and module.Event.NO == "no" and module.State.NONE == "none"


@pytest.mark.parametrize("name", list(SPECS))
def test_the_module_is_exactly_the_spec(name: str, built: Path) -> None:
    module = import_file(built / name / f"fsm_{name}.py", f"fsm_{name}_{uuid.uuid4().hex}")
    assert_module_is_the_spec(module, SPECS[name])
    item = getattr(module, "".join(p.capitalize() for p in name.split("_")))(id="x")
    event = SPECS[name]["transitions"][0]["event"]
    moved = item.apply(event)
    assert (item.version, moved.version) == (0, 1)
    with pytest.raises(module.IllegalTransition):  # a terminal refuses everything
        module.apply(SPECS[name]["terminals"][0], event)


def test_no_module_shadows_the_standard_library(built: Path) -> None:
    for folder in built.iterdir():
        modules = [p.stem for p in folder.glob("*.py")]
        assert modules and not set(modules) & sys.stdlib_module_names, modules


@pytest.mark.slow
def test_the_generated_suites_pass(built: Path) -> None:
    done = run_pytest("-p", "no:randomly", built, cwd=built)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


@pytest.mark.slow
def test_ruff_and_mypy_strict_pass(built: Path) -> None:
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "."],
                          capture_output=True, text=True, cwd=built)  # fmt: skip
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr
    folders = sorted(str(p) for p in built.iterdir() if p.name in
                     {"fight", "email", "queue", "types", "test", "enum", "typing", "uuid"})
    done = mypy(*folders, cwd=built)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_real_mermaid_draws_every_name(built: Path) -> None:
    texts, wanted = [], []
    for name, spec in SPECS.items():
        mmd = (built / name / f"{name}.mmd").read_text()
        (block,) = mermaid_blocks((built / name / "README.md").read_text())
        arrows = [(START, spec["initial"], "")]
        for t in spec["transitions"]:
            for source in t["from"] if isinstance(t["from"], list) else [t["from"]]:
                arrows.append((source, t["to"], t["event"]))
        arrows += [(t, END, "") for t in spec["terminals"]]
        for text in (mmd, block):
            texts.append(text)
            wanted.append((list(spec["states"]), Counter(arrows)))
    for result, (states, arrows) in zip(parse_all(texts), wanted, strict=True):
        assert result.is_state_diagram, result.error
        assert Counter(result.state_labels) == Counter(states), result
        assert Counter(result.edges) == arrows, result


def test_the_readme_tables_show_every_name(built: Path) -> None:
    for name, spec in SPECS.items():
        page = render_markdown((built / name / "README.md").read_text())
        assert page.tables[:3] == expected_readme_tables(spec), name


def test_the_sql_loads_and_works_with_every_name(built: Path, pg_dsn: str) -> None:
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for name, spec in SPECS.items():
            schema = f"fsmc_fight_{os.getpid()}_{name}"
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{schema}"')
            try:
                done = load_sql(pg_dsn, built / name / f"{name}.sql", schema)
                assert done.returncode == 0 and "ERROR" not in done.stderr, (name, done.stderr)
                conn.execute(f'SET search_path TO "{schema}"')
                pg = spec.get("postgres", {})
                table = pg.get("table", name + "s")
                first = spec["transitions"][0]
                if pg.get("id_type") == "text":
                    conn.execute(f'INSERT INTO "{table}" (id) VALUES (%s)', ["row-1"])
                    row_id: object = "row-1"
                else:
                    row_id = conn.execute(
                        f'INSERT INTO "{table}" DEFAULT VALUES RETURNING id').fetchone()[0]
                with conn.transaction():
                    version = conn.execute(
                        f'SELECT "{name}_apply"(%s, %s, 0, %s)', [row_id, first["event"], "t"]
                    ).fetchone()[0]
                assert version == 1, name
                state = conn.execute(f'SELECT state FROM "{table}" WHERE id = %s',
                                     [row_id]).fetchone()[0]  # fmt: skip
                assert state == first["to"], name
            finally:
                conn.execute("RESET search_path")
                writer = writer_role(conn, schema)
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
                drop_roles(conn, [writer])


@pytest.mark.parametrize("name", MACHINES_REFUSED)
def test_names_that_cannot_work_are_refused_with_bad_name(name: str, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    text = to_yaml(small_spec(name))
    spec.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("machine:"))
    for argv in (("check", spec), ("build", spec, "--out", tmp_path / "out")):
        ran = run_fsmc(*argv)
        found = assert_well_behaved(ran)
        assert ran.code == 1, ran
        assert [(m["code"], m["line"], m["col"]) for m in found] == [("bad-name", str(line), "10")]
        assert f"machine name '{name}' cannot be used" in ran.out, ran
    assert not (tmp_path / "out").exists()


def test_an_unquoted_true_is_a_boolean_and_says_to_quote_it(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(to_yaml(fight_spec()).replace('"true"', "true"))
    ran = run_fsmc("check", spec)
    found = assert_well_behaved(ran)
    assert ran.code == 1 and {m["code"] for m in found} == {"schema"}, ran
    assert all("quote it" in m["message"] for m in found), ran
