"""The generated code is run, type-checked and linted, not just looked at.

- every generated pytest suite passes;
- `mypy --strict` and `ruff check` pass on every generated module and suite;
- the module imports nothing outside the standard library;
- hand-editing one entry of a module's table makes its generated suite fail;
- the seed's own reachability test passes unchanged against the generated job module.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fsmc.columns import FSMC_OWNED
from fsmc.escape import sql_name
from fsmc.targets.postgres.build import build
from tests.conftest import GENERATED
from tests.harness import mypy, run_pytest
from tests.pg_scratch import machine_of

MACHINES = sorted(p.name for p in GENERATED.iterdir() if p.is_dir())


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip


def copy_machine(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(GENERATED / name, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def pytest_on(*folders: Path | str, cwd: Path | None = None, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """The generated suites of `folders` (and any further pytest arguments) run by
    pytest; their database part against `dsn` (None: FSMC_PG_DSN as this process has it)."""
    return run_pytest(*folders, cwd=cwd or Path(folders[0]), dsn=dsn)


def test_there_are_generated_machines() -> None:
    assert {"job", "runner", "task", "review", "breaker", "subscription"} <= set(MACHINES)


def test_the_generated_suites_pass_against_postgresql(pg_dsn: str, tmp_path: Path) -> None:
    # One pytest process for all of them (a second of start-up each, six times
    # otherwise); every one's database part runs: nothing skips.
    folders = [copy_machine(name, tmp_path) for name in MACHINES]
    done = pytest_on(*folders, "-rps", cwd=tmp_path, dsn=pg_dsn)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout
    passed = {line.split()[1].split("/")[0] for line in done.stdout.splitlines() if line.startswith("PASSED ")}
    assert passed == set(MACHINES), done.stdout  # each suite passed tests of its own


def test_the_generated_suite_sets_a_cap_too_large_to_fire(pg_dsn: str, tmp_path: Path) -> None:
    # Its database cap test fires a small cap for real (task's retry: 5) and sets a
    # large one as the table's owner; here task's is "large", so that path runs too.
    folder = copy_machine("task", tmp_path)
    suite = folder / "test_fsm_task.py"
    text = suite.read_text()
    assert text.count("\n_CAP_WALK_LIMIT = 50\n") == 1
    suite.write_text(text.replace("\n_CAP_WALK_LIMIT = 50\n", "\n_CAP_WALK_LIMIT = 4\n"))
    done = pytest_on(folder, "-k", "test_db_every_cap", dsn=pg_dsn)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout


def test_the_generated_suites_pass_without_a_database(tmp_path: Path) -> None:
    # One pytest process for all of them: each one's database part skips.
    folders = [copy_machine(name, tmp_path) for name in MACHINES]
    done = pytest_on(*folders, cwd=tmp_path, dsn="")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and " skipped" in done.stdout


# Calls of queue's create() (declared columns: args jsonb, kind and queue text, priority
# smallint): the right ones pass; each wrong one carries the ignore of exactly the
# error it is, and `--strict` reports an ignore that ignores nothing: a wrong call
# mypy accepted, or one it refused for another reason, fails the run.
CREATE_CALLS = """\
from __future__ import annotations

import datetime
import typing

import psycopg

import fsm_queue


def right(conn: psycopg.Connection[typing.Any]) -> None:
    job = fsm_queue.create(conn, args={"to": "a@example.com"}, queue="emails", priority=5)
    fsm_queue.create(conn, state="scheduled", due_at=datetime.datetime.now(datetime.UTC), fetch_cap=3, kind="mail")
    fsm_queue.create_many(conn, [{"priority": n} for n in range(3)])
    assert job.priority + 1 and job.queue.upper()


def wrong(conn: psycopg.Connection[typing.Any]) -> None:
    fsm_queue.create(conn, priority="high")  # type: ignore[arg-type]
    fsm_queue.create(conn, nope=1)  # type: ignore[call-arg]
    fsm_queue.create_many(conn, [{"nope": 1}])  # type: ignore[typeddict-unknown-key]
"""


def test_mypy_strict_passes_on_every_generated_file(tmp_path: Path) -> None:
    folders = [str(copy_machine(name, tmp_path)) for name in MACHINES]
    # One mypy run for both: the generated files, and calls of a module's create().
    (tmp_path / "queue" / "use_create.py").write_text(CREATE_CALLS)
    done = mypy(*folders, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found in" in done.stdout, done.stdout


@pytest.mark.parametrize("where", ["repository", "machine folder"])
def test_ruff_passes_on_every_generated_file(where: str, tmp_path: Path) -> None:
    # Linters classify imports by where they run, so run it both ways.
    if where == "repository":
        done = run(sys.executable, "-m", "ruff", "check", "--isolated", str(GENERATED), cwd=GENERATED.parent)
        assert done.returncode == 0, done.stdout + done.stderr
        return
    for name in MACHINES:
        folder = copy_machine(name, tmp_path)
        done = run(sys.executable, "-m", "ruff", "check", "--isolated", ".", cwd=folder)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", MACHINES)
def test_the_module_uses_only_the_standard_library(name: str) -> None:
    module = next(p for p in (GENERATED / name).glob("*.py") if not p.name.startswith("test_"))
    imported = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}
    assert module.stem not in sys.stdlib_module_names


def suite_after_editing(tmp_path: Path, entry: str, replacement: str, name: str = "job") -> str:
    """The generated suite's output of machine `name` after replacing `entry` (found
    once) in its module; asserts the suite failed."""
    folder = copy_machine(name, tmp_path)
    module = folder / f"fsm_{name}.py"
    text = module.read_text()
    assert text.count(entry) == 1
    module.write_text(text.replace(entry, replacement))
    done = pytest_on(folder, dsn="")  # the table, not the database
    assert done.returncode == 1, done.stdout
    return done.stdout


def test_editing_one_table_entry_makes_the_generated_suite_fail(tmp_path: Path) -> None:
    out = suite_after_editing(
        tmp_path,
        "(State.RUNNING, Event.FINISH): State.COMPLETED,",
        "(State.RUNNING, Event.FINISH): State.FAILED,",
    )
    assert "test_the_table_is_exactly_the_specs" in out
    assert "test_every_declared_transition" in out


def test_removing_one_table_entry_makes_the_generated_suite_fail(tmp_path: Path) -> None:
    out = suite_after_editing(tmp_path, "            (State.FAILED, Event.RETRY): State.QUEUED,\n", "")
    assert "test_the_table_is_exactly_the_specs" in out


def test_editing_one_choice_target_makes_the_generated_suite_fail(tmp_path: Path) -> None:
    out = suite_after_editing(
        tmp_path, "                    State.CHANGES_REQUESTED,\n", "                    State.DRAFT,\n", "review"
    )
    assert "test_the_table_is_exactly_the_specs" in out
    assert "test_every_target_of_every_choice" in out


@pytest.mark.parametrize(("name", "entry", "replacement", "failing"), [
    ("task", "        Event.RETRY: 5,\n", "        Event.RETRY: 6,\n", "test_the_table_is_exactly_the_specs"),
    # The dataclass's own copy of a cap that refuses, one more and one less.
    ("subscription", "if extend_trial_count >= 2:", "if extend_trial_count >= 3:",
     "test_every_cap_is_refused_one_past_its_limit"),
    ("subscription", "if extend_trial_count >= 2:", "if extend_trial_count >= 1:",
     "test_every_cap_is_refused_one_past_its_limit"),
    # Its copy of the budget an `otherwise` spends (task's retry: dead once 5 are spent).
    ("task", '(State.DEAD, "retry_count", None, 5)', '(State.DEAD, "retry_count", None, 6)',
     "test_a_spent_budget_moves_the_row_to_the_otherwise"),
    ("task", '(State.DEAD, "retry_count", None, 5)', '(State.DEAD, "retry_count", None, 4)',
     "test_a_spent_budget_moves_the_row_to_the_otherwise"),
])  # fmt: skip
def test_editing_one_cap_makes_the_generated_suite_fail(
    name: str, entry: str, replacement: str, failing: str, tmp_path: Path
) -> None:
    assert failing in suite_after_editing(tmp_path, entry, replacement, name)


SEED_TEST = '''
from fsm_job import State, TRANSITIONS


def test_every_state_reachable_from_queued():
    seen = {State.QUEUED}
    frontier = [State.QUEUED]
    while frontier:
        s = frontier.pop()  # pop() takes the last item, so this walks depth-first
        for (src, _evt), dst in TRANSITIONS.items():
            if src == s and dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(State), f"unreachable: {set(State) - seen}"
'''


def test_the_seeds_own_check_passes_unchanged_against_the_generated_module(tmp_path: Path) -> None:
    folder = copy_machine("job", tmp_path)
    (folder / "test_seed.py").write_text(textwrap.dedent(SEED_TEST))
    done = run_pytest("test_seed.py", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_module_behaves_as_the_contract_says(tmp_path: Path) -> None:
    folder = copy_machine("job", tmp_path)
    script = textwrap.dedent(
        """
        import dataclasses, pickle, uuid
        import fsm_job as m
        assert m.State.QUEUED.value == "queued" and m.State.QUEUED == "queued"
        assert [s.value for s in m.State][:2] == ["queued", "claimed"]
        assert m.INITIAL is m.State.QUEUED
        assert m.TERMINAL == frozenset({m.State.COMPLETED, m.State.ABANDONED})
        assert m.apply("queued", "claim") is m.State.CLAIMED
        assert m.apply(m.State.RUNNING, m.Event.FINISH) is m.State.COMPLETED
        try:
            m.apply("completed", "retry")
        except m.IllegalTransition as e:
            assert (e.state, e.event) == (m.State.COMPLETED, m.Event.RETRY)
            assert "terminal" in str(e) and "'completed'" in str(e) and "'retry'" in str(e)
        else:
            raise AssertionError("no IllegalTransition")
        try:
            m.apply("queued", "start")
        except m.IllegalTransition as e:
            assert "terminal" not in str(e) and "'queued'" in str(e) and "'start'" in str(e)
        for bad in (("queueed", "claim"), ("queued", "clam")):
            try:
                m.apply(*bad)
            except ValueError as e:
                assert repr(bad[0] if bad[0] != "queued" else bad[1]) in str(e)
            else:
                raise AssertionError("no ValueError")
        job = m.Job(id=uuid.uuid4())
        moved = job.apply("claim").apply(m.Event.START)
        assert (job.state, job.version) == (m.State.QUEUED, 0)
        assert (moved.state, moved.version, moved.id) == (m.State.RUNNING, 2, job.id)
        try:
            job.state = m.State.RUNNING
        except dataclasses.FrozenInstanceError:
            pass
        else:
            raise AssertionError("mutable")
        try:
            m.TRANSITIONS[(m.State.QUEUED, m.Event.START)] = m.State.RUNNING
        except TypeError:
            pass
        else:
            raise AssertionError("table is writable")
        print("ok")
        """
    )
    done = run(sys.executable, "-c", script, cwd=folder)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


def test_reserved_class_names_are_every_capitalised_name_the_module_defines() -> None:
    from fsmc.validate import RESERVED_CAMEL

    # Over every example's module: what a module defines depends on its spec (a timed
    # one defines NotDue), and a class name must collide with none of it.
    capitalised: set[str] = set()
    for module in sorted(GENERATED.glob("*/fsm_*.py")):
        defined = set()
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defined.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
            elif isinstance(node, ast.Assign):
                defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        machine_class = "".join(p.title() for p in module.parent.name.split("_"))
        capitalised |= {n for n in defined if n[:1].isupper()} - {machine_class, machine_class + "New"}
    assert capitalised == RESERVED_CAMEL


@pytest.mark.parametrize("name", ["i_n_i_t_i_a_l", "t_r_a_n_s_i_t_i_o_n_s", "connection", "key_error"])
def test_machine_names_whose_class_would_replace_a_module_name_are_refused(name: str, fsmc, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "m.yaml"
    spec.write_text((GENERATED.parent / "specs" / "runner.yaml").read_text().replace("machine: runner", f"machine: {name}"))
    ran = fsmc("check", spec)
    assert ran.code == 1 and "[bad-name]" in ran.out and ran.out.count("\n") == 1


def test_no_declared_column_can_take_a_name_fsmc_generates() -> None:
    # Every column fsmc gives the table and every parameter of its functions, for a spec
    # using every feature (lease, caps per row, timers, limits): `fsmc.columns` reserves
    # them, or a declared column could shadow one in PL/pgSQL or in create()'s keywords.
    machine = machine_of("queue")
    declared = {str(c.name) for c in machine.postgres.columns}
    per_event = {sql_name(e, kind) for e in machine.event_names for kind in ("count", "cap")}
    schema = build(machine).schema
    owned = {c.name for c in schema.tables[0].columns} - declared  # the machine's table
    owned |= {p.name for f in schema.functions for p in f.parameters} - declared  # claim.by: its own columns
    assert owned - per_event <= FSMC_OWNED, owned - per_event - FSMC_OWNED
