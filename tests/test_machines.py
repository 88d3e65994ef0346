"""Real machines, from public projects, as spec language 1.1 fixtures.

Each tests/machines/*.yaml is a lifecycle someone else wrote (its source named in
the comment at its top, translated faithfully). Each passes `fsmc check` as
written, builds, and its generated module passes `mypy --strict`, `ruff check` and
its own generated suite, without the database and against PostgreSQL. The 1.1 examples written here
(review, breaker, subscription, and task's cap) live in specs/, and
test_generated_code runs their suites; a hand edit of one choice target or one cap
in a generated module making its suite fail is proven there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsmc.pipeline import check
from fsmc.source import read
from fsmc.targets import generate
from tests.conftest import SPECS as OUR_SPECS
from tests.harness import mypy, run_pytest

MACHINES = Path(__file__).resolve().parent / "machines"
SPECS = sorted(MACHINES.glob("*.yaml"))


def test_there_are_at_least_15_real_machines() -> None:
    assert len(SPECS) >= 15


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_each_machine_names_its_source_and_passes_check(spec: Path) -> None:
    head = spec.read_text().split("\nfsmc:", 1)[0]
    assert head.startswith("# "), "a fixture opens with a comment saying what it is"
    assert "\n# Source: https://" in "\n" + head, head
    result = check(read(str(spec)))
    assert [d.as_text() for d in result.diagnostics] == []
    assert result.machine is not None


def _build(out: Path) -> list[Path]:
    folders = []
    for spec in SPECS:
        machine = check(read(str(spec))).machine
        assert machine is not None
        for rel, text in generate(machine).files.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        folders.append(out / str(machine.name))
    assert len(set(folders)) == len(SPECS), "two fixtures define the same machine"
    return folders


def _run(*argv: str, cwd: Path, dsn: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "FSMC_PG_DSN": dsn},
    )  # fmt: skip


@pytest.mark.slow
def test_every_machine_builds_and_its_generated_code_passes(tmp_path: Path) -> None:
    folders = _build(tmp_path)
    done = run_pytest(*folders, cwd=tmp_path, dsn="")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    done = mypy(*folders, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _run(sys.executable, "-m", "ruff", "check", "--isolated", ".", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_real_mermaid_draws_one_arrow_per_choice_target() -> None:
    from fsmc.targets import mermaid
    from tests import mermaid_check

    machines = [check(read(str(spec))).machine for spec in [*SPECS, *sorted(OUR_SPECS.glob("*.yaml"))]]
    results = mermaid_check.parse_all([mermaid.diagram(m) for m in machines if m is not None])
    for machine, result in zip(machines, results, strict=True):
        assert machine is not None and result.ok and result.is_state_diagram, machine.name
        arrows = sorted((s, t, e) for s, t, e in result.edges if mermaid_check.START not in (s, t))
        # Each arrow labelled with its event, a capped one with its limit too.
        assert arrows == sorted((s, t, label) for s, label, t in mermaid_check.drawn_arrows(machine)), machine.name
        lease = set(machine.lease.states) if machine.lease is not None else set()
        assert mermaid.diagram(machine).count(" lease\n") == (1 if lease else 0), machine.name
        choice_arrows = {(s, t, e) for s, t, e in arrows if (s, e) in machine.choices}
        assert len(choice_arrows) == sum(len(ts) for ts in machine.choices.values())


def test_graph_dot_draws_one_edge_per_choice_target() -> None:
    from fsmc.targets import graph

    machine = check(read(str(OUR_SPECS / "review.yaml"))).machine
    assert machine is not None
    text = graph.dot(machine)
    for target in ("approved", "changes_requested", "open"):
        assert f'"open" -> "{target}" [label="review"];' in text
    assert text.count('[label="withdraw"]') == 3  # the wildcard, expanded


def test_transition_picks_a_choices_target_and_refuses_an_unknown_one(pg_dsn: str, tmp_path: Path) -> None:
    # transition() always passes every parameter of <machine>_apply, each cast to its
    # type (contract 4.1: no overload can be a better match), `to_state` NULL unless
    # `to` is given.
    from tests.pg_scratch import Scratch, machine_of, module_of

    machine = machine_of("task")
    scratch = Scratch.create(pg_dsn, machine)
    try:
        module = module_of(machine, tmp_path)
        with scratch.connect() as conn:
            row_id = scratch.new_row(conn)
            assert module.transition(conn, row_id, "acquire", expected_version=0, actor="t",
                                     schema=scratch.schema) == 1  # fmt: skip
            got = module.transition(conn, row_id, "begin", expected_version=1, actor="t", to="working",
                                    schema=scratch.schema)  # fmt: skip
            assert got == 2
            with pytest.raises(ValueError, match="'nowhere'"):
                module.transition(conn, row_id, "begin", expected_version=1, actor="t", to="nowhere",
                                  schema=scratch.schema)  # fmt: skip
    finally:
        scratch.drop()


def test_every_machine_fits_the_published_json_schema() -> None:
    # What an editor checks a spec against (`fsmc schema`), apart from fsmc's loader.
    import json

    import jsonschema
    import yaml

    from fsmc.shape import schema_text

    validator = jsonschema.Draft202012Validator(json.loads(schema_text()))
    for spec in SPECS:
        assert list(validator.iter_errors(yaml.safe_load(spec.read_text()))) == [], spec.name


@pytest.mark.slow
def test_every_machines_generated_suite_passes_against_postgresql(tmp_path: Path, pg_dsn: str) -> None:
    # The database part of each generated suite: the .sql installs, every transition
    # and choice target moves a row, every other pair and every cap is refused.
    folders = _build(tmp_path)
    done = run_pytest("-rs", *folders, cwd=tmp_path, dsn=pg_dsn)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "skipped" not in done.stdout.splitlines()[-1], done.stdout[-3000:]
