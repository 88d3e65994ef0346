"""Shared test fixtures: the hypothesis profile, the PostgreSQL server, paths.

Database tests take the `pg_dsn` fixture. Without FSMC_PG_DSN they skip, except
when FSMC_REQUIRE_PG is set (as .ci/run sets it): then they fail, so CI can never
pass with the database part silently skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


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
