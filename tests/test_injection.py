"""No injection (issue 5, second bullet; contract 1: "No text from a spec ever changes
the meaning of a generated file").

hypothesis builds random *valid* machines (random sizes, names, edges that keep
every rule) and fills every free-text field (the machine's, each state's, each
event's and each transition's description) with hostile text: quotes,
backslashes, line breaks, `\"\"\"`, `*/`, `--`, `$$`, Jinja and Mermaid syntax,
Markdown pipes, terminal escapes, non-ASCII. For each machine it builds the spec
as written and the same spec with no descriptions at all, and proves:

- Python: the module imports and equals the spec's table (apply() answers every
  (state, event) pair as the spec says); its AST without docstrings equals the
  one built without descriptions, and each state's docstring *is* its description;
  the pytest file's AST is the same; ruff passes; the generated suites pass;
- SQL: with comment lines removed the file is the one built without
  descriptions; it loads with psql into PostgreSQL and the schema then holds
  exactly the objects, columns, constraints, functions and triggers of the
  description-free build, nothing ran outside it, and psql ran no meta-command;
- Mermaid: the diagram is the description-free one and real Mermaid parses it;
- README: a Markdown renderer shows the same headings and the spec's tables.

Spec file names (they reach every header) get the same treatment.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.harness import (
    assert_module_is_the_spec,
    assert_well_behaved,
    catalog,
    code_shape,
    drop_roles,
    expected_readme_tables,
    import_file,
    load_sql,
    render_markdown,
    run_fsmc,
    run_pytest,
    without_comment_lines,
    writer_role,
)
from tests.mermaid_check import parse_all
from tests.strategies import machines, to_yaml, without_descriptions

HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]


def build(spec: dict[str, Any], where: Path, file: str = "spec.yaml") -> dict[str, str]:
    """Build one spec into `where/out`; the generated files by kind. A relative
    `file` is given to fsmc as written (the caller has chdir'ed to `where`), so the
    generated headers record it whole, directories included."""
    path = where / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(spec), encoding="utf-8")
    ran = run_fsmc("build", file if Path.cwd() == where else path, "--out", where / "out")
    found = assert_well_behaved(ran)
    assert ran.code == 0, ran
    assert all(m["code"] == "unused-event" for m in found), ran
    folder = where / "out" / spec["machine"]
    files = {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir()}
    name = spec["machine"]
    return {"module": files[f"fsm_{name}.py"], "tests": files[f"test_fsm_{name}.py"],
            "sql": files[f"{name}.sql"], "mermaid": files[f"{name}.mmd"],
            "readme": files["README.md"], "folder": str(folder)}  # fmt: skip


def docstrings(module_source: str, cls: str) -> dict[str, str]:
    """Member name -> the docstring written right after it in enum class `cls`."""
    tree = ast.parse(module_source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    out = {}
    for stmt, following in zip(body, body[1:], strict=False):
        if (isinstance(stmt, ast.Assign) and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)):  # fmt: skip
            out[stmt.targets[0].id] = following.value.value  # type: ignore[attr-defined]
    return out


def assert_descriptions_change_nothing(
    spec: dict[str, Any], tmp: Path
) -> tuple[dict[str, str], dict[str, str]]:
    """Build `spec` as written and without descriptions; return both builds."""
    hostile = build(spec, tmp / "hostile")
    plain = build(without_descriptions(spec), tmp / "plain")
    # Python: same code, and the docstrings are the descriptions, exactly.
    assert code_shape(hostile["module"]) == code_shape(plain["module"])
    assert code_shape(hostile["tests"]) == code_shape(plain["tests"])
    for kind in ("states", "events"):
        decls = spec[kind]
        want = {n.upper(): t for n, t in decls.items() if t} if isinstance(decls, dict) else {}
        assert docstrings(hostile["module"], kind[:-1].capitalize()) == want
    module = import_file(Path(hostile["folder"]) / f"fsm_{spec['machine']}.py",
                         f"fsm_injected_{uuid.uuid4().hex}")  # fmt: skip
    assert_module_is_the_spec(module, spec)
    # SQL and Mermaid: the same but for comment lines.
    assert without_comment_lines(hostile["sql"], "--") == without_comment_lines(plain["sql"], "--")
    assert without_comment_lines(hostile["mermaid"], "%%") == without_comment_lines(
        plain["mermaid"], "%%")
    # README: what a reader sees.
    page, bare = render_markdown(hostile["readme"]), render_markdown(plain["readme"])
    assert page.headings == bare.headings
    assert page.tables == expected_readme_tables(spec)
    assert page.fences == bare.fences
    assert len(page.html) == len(bare.html) == 2 and all(
        h.startswith("<!--") and h.rstrip("\n").endswith("-->") and h.count("-->") == 1
        for h in page.html
    ), page.html
    return hostile, plain


@pytest.mark.slow
@settings(suppress_health_check=HEALTH)
@given(spec=machines())
def test_random_machines_with_hostile_text_compile_to_exactly_their_spec(
    spec: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert_descriptions_change_nothing(spec, tmp_path_factory.mktemp("inj"))


Built = tuple[dict[str, Any], dict[str, str], dict[str, str]]


def hostile_builds(tmp: Path, count: int) -> Iterator[Built]:
    """`count` hypothesis machines with hostile text, built into `tmp/all/<machine>`,
    each under its own machine name so one pytest run can take them all; yields
    (spec, files as written, files built without descriptions)."""
    found: list[Built] = []

    @settings(suppress_health_check=HEALTH, max_examples=count)
    @given(spec=machines())
    def collect(spec: dict[str, Any]) -> None:
        spec = {**spec, "machine": f"inj{len(found)}"}
        where = tmp / f"case{len(found)}"
        shutil.rmtree(where, ignore_errors=True)
        found.append((spec, *assert_descriptions_change_nothing(spec, where)))

    collect()
    for spec, files, plain in found:
        target = tmp / "all" / spec["machine"]
        if not target.exists():
            shutil.copytree(files["folder"], target)
        yield spec, files, plain


@pytest.mark.slow
def test_hostile_outputs_pass_ruff_real_mermaid_and_their_own_suites(tmp_path: Path) -> None:
    built = list(hostile_builds(tmp_path, 40))
    everything = tmp_path / "all"
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "."],
                          capture_output=True, text=True, cwd=everything)  # fmt: skip
    assert ruff.returncode == 0, ruff.stdout[-5000:]
    results = parse_all([files["mermaid"] for _, files, _ in built])
    for (spec, _, _), result in zip(built, results, strict=True):
        assert result.is_state_diagram, (result.error, spec)
        assert sorted(result.state_labels) == sorted(spec["states"]), spec
    suites = run_pytest(everything, cwd=everything)
    assert suites.returncode == 0, suites.stdout[-6000:]


@pytest.mark.slow
def test_hostile_sql_defines_exactly_the_expected_objects(tmp_path: Path, pg_dsn: str) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dbname = f"fsmc_injection_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    dsn = make_conninfo(**{**conninfo_to_dict(pg_dsn), "dbname": dbname})
    writers: list[str | None] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.canary (x int)")
            before = world(conn)
            loaded: list[str] = []
            for i, (spec, files, bare) in enumerate(hostile_builds(tmp_path, 25)):
                hostile = Path(files["folder"]) / f"{spec['machine']}.sql"
                plain = Path(bare["folder"]) / f"{spec['machine']}.sql"
                # "_h5" cannot be a spec name (names start with a letter): catalog()
                # blanks the schema name, and would blank a state called "h5" with it.
                schemas = [f"_h{i}", f"_p{i}"]
                for schema, path in zip(schemas, (hostile, plain), strict=True):
                    conn.execute(f"CREATE SCHEMA {schema}")
                    done = load_sql(dsn, path, schema)
                    assert done.returncode == 0, (done.stderr, spec)
                    assert "ERROR" not in done.stderr, done.stderr
                    loaded.append(schema)
                    writers.append(writer_role(conn, schema))
                assert catalog(conn, schemas[0]) == catalog(conn, schemas[1]), spec
            after = world(conn)
            assert after["schemas"] == sorted([*before["schemas"], *loaded])
            assert {k: v for k, v in after.items() if k != "schemas"} == {
                k: v for k, v in before.items() if k != "schemas"}
        assert not any(tmp_path.rglob("pwned")), "psql ran a meta-command"
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            drop_roles(admin, writers)


def world(conn: Any) -> dict[str, list[tuple[object, ...]]]:
    """What exists outside the schemas the test loads into.

    Only what this test alone can change: its own database's catalogs, and of the
    cluster-wide ones (roles, databases, settings) only the rows a leak of this
    test's text could create: the names its fragments hold, the settings of its
    own database. Other users of the same server add roles and settings at will."""
    q = {
        "schemas": "SELECT nspname FROM pg_namespace WHERE nspname ~ '^_[hp][0-9]+$'",
        "public": """SELECT relname, relkind::text FROM pg_class
                     WHERE relnamespace = 'public'::regnamespace ORDER BY 1""",
        "functions": """SELECT proname FROM pg_proc WHERE pronamespace IN
                        ('public'::regnamespace, 'pg_catalog'::regnamespace) ORDER BY 1""",
        "extensions": "SELECT extname FROM pg_extension ORDER BY 1",
        "event triggers": "SELECT evtname FROM pg_event_trigger ORDER BY 1",
        "suspicious roles": "SELECT rolname FROM pg_roles WHERE rolname IN ('pwned', 'canary')",
        "suspicious databases": "SELECT datname FROM pg_database WHERE datname IN ('pwned', 'canary')",
        "settings": """SELECT setrole::regrole::text, setconfig::text FROM pg_db_role_setting
                       WHERE setdatabase = (SELECT oid FROM pg_database
                                            WHERE datname = current_database())""",
    }
    out = {k: conn.execute(v).fetchall() for k, v in q.items()}
    out["schemas"] = sorted(r[0] for r in out["schemas"])
    return out


HOSTILE_FILE_NAMES = [
    'a"b\'c\\d.yaml', "x */ y -- z $$ {{ w }} %%{init}%% <!-- v -->.yaml", "*/*/--/-->.yaml",
    "line\nbreak.yaml", "é 中 😀.yaml", "`rm -rf`; DROP TABLE t; --.yaml", "\x1b[2J.yaml",
]


@pytest.mark.parametrize("name", HOSTILE_FILE_NAMES)
def test_a_hostile_spec_file_name_changes_nothing_but_comments(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = {"fsmc": 1, "machine": "named", "initial": "a", "states": {"a": "x", "b": "y"},
            "terminals": ["b"], "events": ["go"],
            "transitions": [{"from": "a", "event": "go", "to": "b"}]}  # fmt: skip
    plain = build(spec, tmp_path / "plain")
    (tmp_path / "hostile").mkdir()
    monkeypatch.chdir(tmp_path / "hostile")
    hostile = build(spec, tmp_path / "hostile", name)
    assert name.replace("\n", " ").split("/")[-1] in hostile["module"].replace("\n", " ") or (
        "\x1b" in name)
    assert code_shape(hostile["module"]) == code_shape(plain["module"])
    assert code_shape(hostile["tests"]) == code_shape(plain["tests"])
    assert without_comment_lines(hostile["sql"], "--") == without_comment_lines(plain["sql"], "--")
    assert without_comment_lines(hostile["mermaid"], "%%") == without_comment_lines(
        plain["mermaid"], "%%")
    page, bare = render_markdown(hostile["readme"]), render_markdown(plain["readme"])
    assert (page.headings, page.tables, page.fences) == (bare.headings, bare.tables, bare.fences)
    assert len(page.html) == 2 and all(h.count("-->") == 1 for h in page.html), page.html
    for kind in ("module", "tests", "sql", "mermaid", "readme"):
        assert hostile[kind].count("\n") == plain[kind].count("\n"), kind
        assert "\x1b" not in hostile[kind], kind


@pytest.mark.slow
def test_a_one_state_machine_gets_a_suite_that_passes(tmp_path: Path) -> None:
    # The smallest valid machine: its initial state is its only, terminal, state.
    spec = {"fsmc": 1, "machine": "single", "initial": "done", "states": ["done"],
            "terminals": ["done"], "events": ["poke"], "transitions": []}  # fmt: skip
    files = build(spec, tmp_path)
    done = run_pytest(".", cwd=Path(files["folder"]))
    assert done.returncode == 0, done.stdout[-4000:]
