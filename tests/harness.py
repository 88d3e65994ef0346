"""Running fsmc in-process on hostile input, and judging what it printed.

`run_fsmc(*argv)` calls `fsmc.cli.main` with stdout and stderr captured (no pytest
fixture, so hypothesis can call it many times per test) and measures the CPU time
it took. `assert_well_behaved` holds one run to the contract: exit 0, 1 or 2, every
line of the diagnostics' stream (stdout for check and build, stderr for the commands
whose stdout is their product) a diagnostic in `FILE:LINE:COL: SEVERITY: MESSAGE
[CODE]` form, every other stderr line one of the CLI's own `fsmc: ...` lines, never
a traceback or an internal error, and ended "within seconds" (contract 2).

Time budgets count CPU seconds, not wall-clock ones: on a shared 2-core machine
the wall clock mostly measures the other users (a 1 s run took 14.6 s under load),
while the CPU time is the work fsmc did, which is what a runaway (quadratic,
exponential) case multiplies. Each budget is at least 3x the most CPU time the
case took under `-n 2` with the other core busy.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsmc.cli import main
from fsmc.diagnostics import CODES

if TYPE_CHECKING:  # the database helpers import psycopg when called: the core tests need no driver
    import psycopg

    from tests.pg_scratch import Scratch

DIAGNOSTIC = re.compile(
    r"(?P<file>.+):(?P<line>[1-9][0-9]*):(?P<col>[1-9][0-9]*): (?P<severity>error|warning): "
    r"(?P<message>.+) \[(?P<code>[a-z][a-z-]*)\]"
)
CLI_LINE = re.compile(r"fsmc: (error|warning|stale|missing|orphan|nothing written): .+|"
                      r"fsmc: generated files are out of date; run fsmc build")  # fmt: skip


@dataclass
class Ran:
    code: int
    out: str
    err: str
    cpu: float  # CPU seconds the run took (this process: user + system)
    argv: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (f"Ran(code={self.code}, {self.cpu:.2f} s CPU, out={self.out[-1500:]!r}, "
                f"err={self.err[-1500:]!r})")  # fmt: skip


def run_fsmc(*argv: str | Path) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    started = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return Ran(code, out.getvalue(), err.getvalue(), time.process_time() - started,
               tuple(str(a) for a in argv))  # fmt: skip


def assert_well_behaved(ran: Ran, *, cpu_seconds: float = 5.0) -> list[re.Match[str]]:
    """The run ended as the contract says, within `cpu_seconds` of CPU time;
    returns its diagnostics, parsed."""
    assert ran.code in (0, 1, 2), ran
    assert "Traceback" not in ran.err and "internal error" not in ran.err, ran
    assert ran.cpu < cpu_seconds, ran
    found = []
    on_stdout = ran.argv[:1] in (("check",), ("build",))
    # `build --check` prints its diff after the diagnostics
    lines = [(line, True) for line in ran.out.splitlines() if "--check" not in ran.argv]
    lines += [(line, False) for line in ran.err.splitlines()]
    for line, from_stdout in lines:
        match = DIAGNOSTIC.fullmatch(line)
        if match and from_stdout == on_stdout:
            # The severity the diagnostics page promises, not fsmc's registry that printed it.
            assert match["code"] in CODES, (line, ran)
            assert documented_severity().get(match["code"]) == match["severity"], (line, ran)
            found.append(match)
        elif from_stdout:
            assert not on_stdout, (f"not a diagnostic line on stdout: {line!r}", ran)
        else:
            assert CLI_LINE.fullmatch(line), (f"not a diagnostic line: {line!r}", ran)
    if ran.code == 1 and not any(m["severity"] == "error" for m in found):
        # exit 1 without an error diagnostic is only --strict or --check
        assert "fsmc: " in ran.err, ran
    if ran.code == 2:
        assert ran.err.startswith("fsmc: error: ") or "usage:" in ran.err, ran
    return found


@functools.cache
def documented_severity() -> dict[str, str]:
    """Each diagnostic code's severity as the diagnostics page's table gives it: what
    users are told, written apart from fsmc.diagnostics."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    (table,) = [t for t in render_markdown(page).tables if t[0][:2] == ["code", "severity"]]
    return {row[0]: row[1] for row in table[1:]}


def assert_json_diagnostics(ran: Ran) -> list[dict[str, object]]:
    assert ran.code in (0, 1, 2), ran
    if ran.code == 2:
        return []
    items = json.loads(ran.out)
    assert isinstance(items, list)
    for item in items:
        assert set(item) == {"file", "line", "col", "severity", "code", "message"}, item
        assert item["code"] in CODES and item["line"] >= 1 and item["col"] >= 1, item
    return items


def import_file(path: Path, name: str) -> types.ModuleType:
    """Import a generated module from its file, under a name no other test uses."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


# --- generated suites, run as a user runs them -----------------------------------------


def run_pytest(*args: str | Path, cwd: Path, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """`pytest -q ARGS` in a process of its own in `cwd`, as a user runs a generated
    suite, leaving no bytecode or cache behind; the database part against `dsn` ("" for
    none; None: FSMC_PG_DSN as this process has it). Without this run's xdist and
    hypothesis plugins: no generated suite uses them, and hypothesis's takes a second
    of every start to import."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if dsn is not None:
        env["FSMC_PG_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "no:hypothesispytest", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip


# --- mypy ---------------------------------------------------------------------------


def mypy_cache(kind: str) -> Path:
    """A mypy cache that outlives the run, in the environment the tests run in (.venv
    under tests/run.sh): the standard library and psycopg are analysed once, not by
    every run of every test; mypy rechecks whatever changed (it compares each file's
    hash and the options). `kind` keeps runs with different settings apart."""
    home = Path(sys.prefix)
    if not os.access(home, os.W_OK):
        home = Path(tempfile.gettempdir())
    return home / "fsmc-mypy-cache" / kind


def mypy(*args: str | Path, cwd: Path, kind: str = "strict") -> subprocess.CompletedProcess[str]:
    """`mypy --strict ARGS` in `cwd` (kind "strict"), or, kind "package", mypy with
    the settings pyproject.toml gives it (run in the repository), using mypy_cache."""
    strict = ["--strict"] if kind == "strict" else []
    return subprocess.run(
        [sys.executable, "-m", "mypy", *strict, "--cache-dir", str(mypy_cache(kind)), *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


# --- what a build wrote, judged target by target ---------------------------------------


def spec_table(spec: dict[str, Any]) -> dict[tuple[str, str], str]:
    out = {}
    for t in spec["transitions"]:
        for source in t["from"] if isinstance(t["from"], list) else [t["from"]]:
            out[source, t["event"]] = t["to"]
    return out


def assert_module_is_the_spec(module: types.ModuleType, spec: dict[str, Any]) -> None:
    """Enums, initial, terminals and table equal the spec's, and `apply` answers
    every (state, event) pair as the table says."""
    states, events = list(spec["states"]), list(spec["events"])
    table = spec_table(spec)
    assert [(s.name, s.value) for s in module.State] == [(s.upper(), s) for s in states]
    assert [(e.name, e.value) for e in module.Event] == [(e.upper(), e) for e in events]
    assert module.INITIAL == spec["initial"]
    assert set(module.TERMINAL) == set(spec["terminals"])
    assert {(s.value, e.value): t.value for (s, e), t in module.TRANSITIONS.items()} == table
    for s in states:
        for e in events:
            if (s, e) in table:
                assert module.apply(s, e) is module.State(table[s, e])
            else:
                try:
                    module.apply(s, e)
                except module.IllegalTransition as error:
                    assert (error.state, error.event) == (s, e)
                else:
                    raise AssertionError(f"apply({s!r}, {e!r}) did not raise")


def code_shape(source: str) -> str:
    """The module's AST without docstrings: what the code means, not what it says."""
    tree = ast.parse(source)
    _drop_docstrings(tree)
    return ast.dump(tree)


def _drop_docstrings(node: ast.AST) -> None:
    """Drop every bare string statement from every `body` under `node`. Only
    statements hold statements (in these fields), so the walk visits statements alone,
    not each name and constant as ast.walk would: a third of code_shape's time."""
    body = getattr(node, "body", None)
    if isinstance(body, list):
        node.body = [  # type: ignore[attr-defined]
            stmt for stmt in body
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str))
        ] or [ast.Pass()]  # fmt: skip
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        children = getattr(node, field, None)
        if isinstance(children, list):
            for child in children:
                _drop_docstrings(child)


def without_comment_lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if not line.lstrip().startswith(prefix)]


def one_line(text: str | None) -> str:
    """How a description shows on one line of a README or comment: non-printable
    characters are spaces, and runs of white space one space."""
    if not text:
        return ""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


@dataclass
class Markdown:
    headings: list[str]
    tables: list[list[list[str]]]  # table -> rows (header first) -> cell texts
    html: list[str]
    fences: list[tuple[str, str]]  # (info, content)


def render_markdown(text: str) -> Markdown:
    """What a CommonMark + GFM-tables renderer makes of `text`."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    out = Markdown([], [], [], [])
    row: list[str] | None = None
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            out.headings.append(_inline_text(tokens[i + 1]))
        elif tok.type == "table_open":
            out.tables.append([])
        elif tok.type == "tr_open":
            row = []
            out.tables[-1].append(row)
        elif tok.type == "inline" and row is not None and tokens[i - 1].type in ("th_open",
                                                                                   "td_open"):
            row.append(_inline_text(tok))
        elif tok.type == "tr_close":
            row = None
        elif tok.type == "html_block":
            out.html.append(tok.content)
        elif tok.type == "fence":
            out.fences.append((tok.info, tok.content))
        if tok.type == "inline":
            out.html += [c.content for c in tok.children or [] if c.type == "html_inline"]
    return out


def _inline_text(tok: Any) -> str:
    parts = []
    for child in tok.children or []:
        if child.type in ("text", "code_inline", "html_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append("\n")
    return "".join(parts)


def expected_readme_tables(spec: dict[str, Any]) -> list[list[list[str]]]:
    """The README's states, events and transitions tables, as a reader sees them."""
    def described(decls: Any) -> list[tuple[str, str]]:
        if isinstance(decls, dict):
            return [(name, one_line(text)) for name, text in decls.items()]
        return [(name, "") for name in decls]

    lease = spec.get("lease", {}).get("states", [])
    states = [["state", "", "description"]]
    for name, text in described(spec["states"]):
        notes = [note for note, holds in (("initial", name == spec["initial"]),
                                          ("terminal", name in spec["terminals"]),
                                          ("lease", name in lease)) if holds]  # fmt: skip
        states.append([name, ", ".join(notes), text])
    events = [["event", "description"]] + [[n, t] for n, t in described(spec["events"])]
    transitions = [["from", "event", "to", "description"]]
    for t in spec["transitions"]:
        for source in t["from"] if isinstance(t["from"], list) else [t["from"]]:
            transitions.append([source, t["event"], t["to"], one_line(t.get("description"))])
    return [states, events, transitions]


# --- PostgreSQL -------------------------------------------------------------------------

CATALOG = {
    "relations": """
        SELECT c.relkind::text, c.relname FROM pg_class c
        WHERE c.relnamespace = %(ns)s::regnamespace ORDER BY 1, 2""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), '')
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = %(ns)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2""",
    "constraints": """
        SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = %(ns)s::regnamespace ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(ns)s ORDER BY 1""",
    "functions": """
        SELECT proname, pg_get_function_identity_arguments(oid), pg_get_functiondef(oid)
        FROM pg_proc WHERE pronamespace = %(ns)s::regnamespace ORDER BY 1, 2""",
    "triggers": """
        SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = %(ns)s::regnamespace AND NOT t.tgisinternal ORDER BY 1""",
    "types": """
        SELECT typname FROM pg_type WHERE typnamespace = %(ns)s::regnamespace
        AND typtype <> 'b' AND typrelid = 0 ORDER BY 1""",
    "comments": """
        SELECT objoid::regclass::text, description FROM pg_description d
        JOIN pg_class c ON c.oid = d.objoid WHERE c.relnamespace = %(ns)s::regnamespace
        ORDER BY 1, 2""",
}


def sqlstate_of(error: BaseException) -> str | None:
    return getattr(error, "sqlstate", None)


def refused(conn: psycopg.Connection[Any], query: bytes, params: tuple[Any, ...] = ()) -> psycopg.Error:
    """Run `query`, expect the database to refuse it, roll back, return the error."""
    import psycopg
    import pytest

    with pytest.raises(psycopg.Error) as raised:
        conn.execute(query, params)
    conn.rollback()
    return raised.value


def refused_at_commit(conn: psycopg.Connection[Any], *queries: tuple[bytes, tuple[Any, ...]]) -> psycopg.Error:
    """Every statement passes; COMMIT is refused."""
    import psycopg
    import pytest

    for query, params in queries:
        conn.execute(query, params)
    with pytest.raises(psycopg.Error) as raised:
        conn.commit()
    return raised.value


def snapshot(db: Scratch, conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """Everything both tables of a scratch installation (tests/pg_scratch.py) hold, to
    show a refused call changed nothing."""
    rows = conn.execute(db.q("SELECT * FROM {table} ORDER BY id")).fetchall()
    events = conn.execute(db.q("SELECT * FROM {events} ORDER BY {id_col}, version")).fetchall()
    return tuple(rows), tuple(events)


def writer_role(conn: Any, schema: str, function: str | None = None) -> str | None:
    """The writer role of the installation in `schema`, as its `<machine>_fsmc_writer()`
    (or `function`, where several machines share the schema) says; None when nothing
    is installed there."""
    found = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
        " WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE %s",
        (schema, function or "%\\_fsmc\\_writer"),
    ).fetchone()
    if found is None:
        return None
    return str(conn.execute(f"SELECT {found[0]}").fetchone()[0])


def drop_roles(conn: Any, roles: Iterable[str | None]) -> None:
    """Drop writer roles an installation made (they outlive its schema or database)."""
    for role in roles:
        if role is not None:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def catalog(conn: Any, schema: str) -> dict[str, list[tuple[object, ...]]]:
    """Every object a schema holds, with its definition, the schema's name blanked (and
    its writer role's, which is made from it)."""
    out = {}
    writer = writer_role(conn, schema)
    blank = re.compile(rf"\b{re.escape(schema)}\b")

    def blanked(v: str) -> str:
        return blank.sub("S", v.replace(writer, "W") if writer else v)

    for kind, query in CATALOG.items():
        rows = conn.execute(query, {"ns": schema}).fetchall()
        out[kind] = [tuple(blanked(v) if isinstance(v, str) else v for v in row) for row in rows]
    return out


def load_sql(dsn: str, path: Path, schema: str) -> subprocess.CompletedProcess[str]:
    """`psql -v ON_ERROR_STOP=1 -1 -f FILE` into `schema`, as the contract says to."""
    env = {**os.environ, "PGOPTIONS": f"-c search_path={schema}"}
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-1", "-f", str(path), dsn],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def nested_plans(db: Any, query: bytes) -> list[str]:
    """The plans of the statements `query` runs inside functions (auto_explain)."""
    return explained(db, query)[1]


def explained(db: Any, query: bytes) -> tuple[list[Any], list[str]]:
    """`query`'s rows (as a superuser, rolled back) and the plans of the statements it
    runs inside functions, as they ran (auto_explain)."""
    with db.superuser() as su:
        notices: list[str] = []
        su.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        su.execute("LOAD 'auto_explain'")
        for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                        "auto_explain.log_level = notice", "auto_explain.log_format = text"):  # fmt: skip
            su.execute(f"SET {setting}")
        rows = su.execute(query).fetchall()
        su.rollback()
    return rows, notices
