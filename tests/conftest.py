"""Shared test fixtures: the hypothesis profile, the PostgreSQL server, paths, and
fsmc's wheel (built once per session, whichever xdist worker asks first).

Database tests take the `pg_dsn` fixture. Without FSMC_PG_DSN they skip, except
when FSMC_REQUIRE_PG is set (as .ci/run sets it): then they fail, so CI can never
pass with the database part silently skipped.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
GENERATED = ROOT / "generated"

# Deterministic in CI (same examples every run), bounded so the suite stays fast.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None)
# The fast path (tests/run.sh --fast): a third of the examples, a quick answer while editing.
settings.register_profile("fast", max_examples=20, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


# --- markers: the fast path, and what starts first -----------------------------------------

# The compiler's own stages: load, check, build (render), diff, migrate's script, the CLI.
CORE = {"test_load", "test_rules", "test_invalid_specs", "test_golden", "test_diff", "test_cli",
        "test_hostile_input", "test_limits", "test_machines", "test_mermaid", "test_migrate",
        "test_injection", "test_fighting_names"}  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test of a CORE module `core`, and every test that takes the database
    (through `pg_dsn`, directly or by a fixture) `db`: the fast path is
    `-m "core and not slow and not db"`. Tests marked `slow` (seconds each: a tool in a
    process of its own, real Mermaid, megabytes of input) are moved first: with `-n 2`,
    a long test that starts last keeps one worker busy after the other has finished."""
    for item in items:
        if item.path.stem in CORE:
            item.add_marker(pytest.mark.core)
        if "pg_dsn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first


# The system catalogs that the suite's scratch installations write to: each run creates
# and drops some 1,000 schemas (20 MB of pg_proc). Where autovacuum is off, as on our
# machines, the dead rows stay, every catalog lookup wades through them, and a server
# used for weeks made the suite a third slower (pg_proc at 609 MB). A plain VACUUM
# before the run makes the space reusable (well under a second); it locks nothing that
# a running query needs.
SCRATCH_CATALOGS = ("pg_proc", "pg_attribute", "pg_class", "pg_depend", "pg_type",
                    "pg_constraint", "pg_trigger", "pg_index", "pg_attrdef", "pg_description",
                    "pg_shdepend", "pg_namespace", "pg_rewrite", "pg_statistic", "pg_init_privs",
                    "pg_authid", "pg_auth_members")  # fmt: skip


def pytest_sessionstart(session: pytest.Session) -> None:
    """Vacuums the scratch catalogs once per run, in the process that starts the workers
    (an xdist worker has `workerinput`). Best effort: a server that cannot be reached is
    the `pg_dsn` fixture's to report, and a role that does not own the catalogs is only
    warned by VACUUM, not refused."""
    dsn = os.environ.get("FSMC_PG_DSN")
    if not dsn or hasattr(session.config, "workerinput"):
        return
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            conn.execute("VACUUM " + ", ".join(f"pg_catalog.{name}" for name in SCRATCH_CATALOGS))
    except Exception:  # noqa: BLE001, S110 - see the docstring
        pass


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    dsn = os.environ.get("FSMC_PG_DSN")
    if not dsn:
        if os.environ.get("FSMC_REQUIRE_PG"):
            pytest.fail("FSMC_REQUIRE_PG is set but FSMC_PG_DSN is not")
        pytest.skip("FSMC_PG_DSN is not set")
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("select 1")
    except Exception as exc:  # noqa: BLE001 - any failure means the server is unusable
        if os.environ.get("FSMC_REQUIRE_PG"):
            pytest.fail(f"PostgreSQL at {dsn} is unreachable: {exc}")
        pytest.skip(f"PostgreSQL at {dsn} is unreachable: {exc}")
    return dsn


class Ran:
    """What one in-process `fsmc` invocation did."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"Ran(code={self.code}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


@pytest.fixture
def fsmc(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run the fsmc CLI in-process: `fsmc("check", path)` -> Ran(code, out, err)."""
    from fsmc.cli import main

    def run(*argv: str) -> Ran:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


# The job machine's scratch database and generated module, for the tests of the
# worker's side (a test module that needs another machine defines its own `db`).
# pg_scratch imports this module, so it is imported here only when used.


@pytest.fixture
def db(pg_dsn: str) -> Iterator[Any]:
    from tests.pg_scratch import Scratch, machine_of

    scratch = Scratch.create(pg_dsn, machine_of("job"))
    yield scratch
    scratch.drop()


@pytest.fixture
def job(tmp_path: Path) -> ModuleType:
    from tests.pg_scratch import machine_of, module_of

    return module_of(machine_of("job"), tmp_path)


# --- the wheel ----------------------------------------------------------------------


@dataclass(frozen=True)
class Wheel:
    path: Path
    log: str  # what `pip wheel --verbose` printed, stdout then stderr


@pytest.fixture(scope="session")
def fsmc_wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """fsmc's wheel, built from a clean copy of the working tree (what a clone holds,
    without tests, benchmarks, generated output or caches), once for the whole run:
    the xdist workers share one folder and take turns under a lock, so the second
    finds the first one's wheel.

    Built without build isolation, with the setuptools the test extra installed, so no
    build environment is made and nothing is fetched; the setuptools must satisfy
    pyproject.toml's `build-system.requires`, or this would not be the wheel pip builds."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        wanted = Requirement(line)
        assert wanted.specifier.contains(version(wanted.name), prereleases=True), (
            f"{wanted.name} {version(wanted.name)} does not satisfy {wanted}: run bash tests/run.sh")
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    folder = shared / "fsmc-wheel"
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        log = folder / "pip-wheel.log"
        if not log.exists():
            source = folder / "src"
            shutil.copytree(
                ROOT, source,
                ignore=shutil.ignore_patterns(".git", ".venv", "node_modules", "__pycache__", "*.egg-info",
                                              "build", "dist", "generated", "tests", "benchmarks",
                                              ".*_cache"),
            )  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--verbose",
                 "--disable-pip-version-check", "--wheel-dir", str(folder / "dist"), str(source)],
                capture_output=True, text=True, check=False, timeout=600,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            shutil.rmtree(source)
            log.write_text(done.stdout + done.stderr)
    (wheel,) = (folder / "dist").glob("fsmc-*.whl")
    return Wheel(wheel, log.read_text())
