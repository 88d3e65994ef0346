"""The TypeScript target (issue 25): `fsmc build --typescript` and what it writes.

The option adds `fsm_<machine>.ts` and `fsm_<machine>.test.ts` to a machine's folder
and nothing else; without it those files are neither written, compared nor removed.
One tsc process type-checks under the strictest options every example's module and
suite, a copy of the job machine's module with one table entry edited by hand, and
random machines whose every description is hostile text (issue 5's promise: without
its comment lines the module is the one built with no descriptions at all). One node
process runs the examples' suites, their database half too when FSMC_PG_DSN is set
(which races a Node claim against the Python module's on one table); another runs the
edited copy's, which must fail, and the hostile machines', which must pass.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fsmc.targets import typescript
from fsmc.validate import RESERVED_CAMEL
from tests.conftest import GENERATED, ROOT
from tests.harness import run_fsmc
from tests.strategies import machines, to_yaml, without_descriptions
from tests.typescript_tools import Compiled, Missing, compile_folders, node_test

MACHINES = sorted(p.name for p in GENERATED.iterdir() if p.is_dir())


def spec_text(machine: str, **replace: str) -> str:
    text = (ROOT / "specs" / f"{machine}.yaml").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_file()}


def test_the_option_adds_the_module_and_its_suite_and_nothing_else(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "job.yaml"
    spec.write_text(spec_text("job"))
    assert fsmc("build", spec, "--out", tmp_path / "plain").code == 0
    assert fsmc("build", spec, "--out", tmp_path / "both", "--typescript").code == 0
    plain, both = files(tmp_path / "plain" / "job"), files(tmp_path / "both" / "job")
    assert both - plain == {"fsm_job.ts", "fsm_job.test.ts"}
    assert plain == {"README.md", "fsm_job.py", "job.mmd", "job.sql", "test_fsm_job.py"}
    for name in plain:  # the other files do not depend on the option
        assert (tmp_path / "plain" / "job" / name).read_bytes() == (tmp_path / "both" / "job" / name).read_bytes()


def test_check_compares_the_typescript_files_only_when_asked(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec, out = tmp_path / "job.yaml", tmp_path / "out"
    spec.write_text(spec_text("job"))
    assert fsmc("build", spec, "--out", out, "--typescript").code == 0
    module = out / "job" / "fsm_job.ts"
    fresh = module.read_text()
    module.write_text(fresh.replace('claim: "claimed"', 'claim: "running"'))
    stale = fsmc("build", spec, "--out", out, "--check", "--typescript")
    assert stale.code == 1 and "fsmc: stale: " + module.as_posix() in stale.err
    assert '-    queued: frozen({ __proto__: null, claim: "running" }),' in stale.out
    # Without the option the .ts files are not this build's: left alone, with a warning.
    unasked = fsmc("build", spec, "--out", out, "--check")
    assert unasked.code == 0 and "pass --typescript" in unasked.err
    assert fsmc("build", spec, "--out", out).code == 0
    assert module.read_text() != fresh and (out / "job" / "fsm_job.test.ts").exists()
    assert fsmc("build", spec, "--out", out, "--typescript").code == 0
    assert module.read_text() == fresh


def test_a_renamed_machine_takes_its_typescript_files_along(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec, out = tmp_path / "job.yaml", tmp_path / "out"
    spec.write_text(spec_text("job"))
    assert fsmc("build", spec, "--out", out, "--typescript").code == 0
    spec.write_text(spec_text("job", **{"machine: job": "machine: chore"}))
    assert fsmc("build", spec, "--out", out, "--typescript").code == 0
    assert not (out / "job").exists()
    assert {"fsm_chore.ts", "fsm_chore.test.ts"} <= files(out / "chore")


def test_what_typescript_cannot_name_is_an_error_of_that_build_only(fsmc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    date = tmp_path / "date.yaml"  # class Date would hide the global every timestamp is typed with
    date.write_text(spec_text("job", **{"machine: job": "machine: date"}))
    refused = fsmc("build", date, "--out", tmp_path / "a", "--typescript")
    assert refused.code == 1 and not (tmp_path / "a").exists()
    assert f"{date}:4:10: error: machine name 'date' cannot be used with --typescript" in refused.out
    assert "[bad-name]" in refused.out
    assert fsmc("build", date, "--out", tmp_path / "b").code == 0
    column = tmp_path / "queue.yaml"  # a class cannot have a field named constructor
    column.write_text(spec_text("queue", **{"    args: jsonb": "    args: jsonb\n    constructor: text"}))
    refused = fsmc("build", column, "--out", tmp_path / "c", "--typescript")
    assert refused.code == 1 and "'constructor' cannot be used with --typescript" in refused.out
    assert "[bad-column]" in refused.out


def test_the_reserved_class_names_cover_every_global_the_module_names() -> None:
    """A machine whose class is named like a global the module uses (or a class it
    defines) would hide it: every capitalised name in a generated module is one the
    module defines for its machine, one the Python module reserves, or one the
    TypeScript target reserves."""
    for machine in MACHINES:
        text = (GENERATED / machine / f"fsm_{machine}.ts").read_text()
        code = re.sub(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\]|\\.)*"|`(?:[^`\\]|\\.)*`', "", text, flags=re.S)
        names = set(re.findall(r"(?<![.\w])[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\b", code))
        camel = "".join(part.title() for part in machine.split("_"))
        own = {camel, camel + "New"}
        assert names - own - RESERVED_CAMEL - typescript.RESERVED_CAMEL == set(), machine


# --- tsc and node over the examples' generated files ------------------------------------------


HOSTILE = 6  # machines with hostile descriptions


def without_comments(source: str) -> str:
    """A TypeScript file without its comment lines (`//` lines, `/** ... */` blocks)."""
    source = re.sub(r"^\s*/\*\*.*?\*/\n", "", source, flags=re.S | re.M)
    return "".join(line for line in source.splitlines(keepends=True) if not line.lstrip().startswith("//"))


def hostile_folders(root: Path) -> dict[str, Path]:
    """HOSTILE random machines with hostile text in every description, each built with
    --typescript as written and without descriptions: the TypeScript of the two differs
    in comment lines only. Their folders, by machine name."""
    folders: dict[str, Path] = {}

    @settings(suppress_health_check=list(HealthCheck), max_examples=HOSTILE, deadline=None)
    @given(spec=machines())
    def build(spec: dict[str, object]) -> None:
        name = f"hostile{len(folders)}"
        spec = {**spec, "machine": name}
        texts = []
        for kind, written in (("as_written", spec), ("plain", without_descriptions(spec))):
            path = root / kind / f"{name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(to_yaml(written), encoding="utf-8")
            ran = run_fsmc("build", path, "--out", root / kind / "out", "--typescript")
            assert ran.code == 0, ran
            folder = root / kind / "out" / name
            texts.append([without_comments((folder / f).read_text()) for f in (f"fsm_{name}.ts", f"fsm_{name}.test.ts")])
        assert texts[0] == texts[1], spec
        folders[name] = root / "as_written" / "out" / name

    build()
    return folders


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    """Every example's folder; `mutated_job`, the job machine's with its module's table
    edited by hand (queued --claim--> running, not claimed); HOSTILE machines with
    hostile text: compiled by one tsc."""
    root = tmp_path_factory.mktemp("typescript")
    hostile = hostile_folders(root / "hostile")
    mutated = root / "mutated_job"
    shutil.copytree(GENERATED / "job", mutated)
    module = mutated / "fsm_job.ts"
    edited = module.read_text().replace('claim: "claimed"', 'claim: "running"', 1)
    assert edited != module.read_text()
    module.write_text(edited)
    try:
        return compile_folders({**{m: GENERATED / m for m in MACHINES}, "mutated_job": mutated, **hostile},
                               root / "build")  # fmt: skip
    except Missing as exc:
        pytest.fail(str(exc))


@pytest.mark.slow
def test_tsc_passes_every_generated_file_under_the_strictest_options(compiled: Compiled) -> None:
    assert (compiled.code, compiled.output) == (0, "")
    assert len(compiled.suites()) == len(MACHINES) + 1 + HOSTILE


@pytest.mark.slow
def test_every_generated_suite_passes_under_node(compiled: Compiled, request: pytest.FixtureRequest) -> None:
    """The suites' database half too, when there is a database (then nothing may skip:
    the claim race needs the Python module, run by this interpreter, with psycopg)."""
    env = {}
    if os.environ.get("FSMC_PG_DSN") or os.environ.get("FSMC_REQUIRE_PG"):
        env = {"FSMC_PG_DSN": request.getfixturevalue("pg_dsn"), "FSMC_PYTHON": sys.executable}
    ran = node_test(compiled.suites(*MACHINES), env)
    assert ran.code == 0 and ran.count("fail") == 0, ran.output[-6000:]
    assert ran.count("pass") >= 12 * len(MACHINES)
    if env:
        assert ran.count("skipped") == 0, ran.output[-6000:]
        assert ran.output.count("ok ") and "Python claim racing" in ran.output


@pytest.mark.slow
def test_an_edited_table_fails_its_suite_and_hostile_text_changes_nothing(compiled: Compiled) -> None:
    """The edited job module's suite fails where the table is checked; the hostile
    machines' suites pass (their tables are their specs')."""
    edited = node_test(compiled.suites("mutated_job"))
    assert edited.code != 0
    assert {"every declared transition", "the tables are exactly the spec's, and read-only"} <= set(edited.failed())
    hostile = node_test(compiled.suites(*(f"hostile{i}" for i in range(HOSTILE))))
    assert hostile.code == 0 and hostile.count("pass") >= 12 * HOSTILE, hostile.output[-6000:]
