"""The generated TypeScript module beside what a Node worker would write by hand, and
beside the Python module (issue 25).

    npm ci --prefix tests/typescript                # TypeScript, pg (tests/run.sh does it)
    python benchmarks/bench_typescript.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

It compiles generated/job/fsm_job.ts with the tests' tsc (tests/typescript_tools.py)
into a scratch folder and runs benchmarks/bench_typescript.mjs there.

1. `apply(state, event)` against a plain object lookup, `plain[state][event]` (seed
   002's hand-written `allowed` table), over every legal pair of specs/job.yaml in a
   fixed order, interleaved round by round; the ratio is the median of the per-round
   ratios, with the lowest and highest. Target: within 2x.
2. With --dsn: one Node worker's jobs per second beside one Python worker's (the
   generated fsm_job.py on psycopg, autocommit), on the same queue of one schema:
   --jobs no-op jobs enqueued, then drained (claim, start, finish: three round trips a
   job, every move in the event log), Python and Node taking turns for --rounds
   rounds; the figure is each one's best round. Information, no target: both wait on
   the same three round trips.

Nothing here is a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.typescript_tools import compile_folders  # noqa: E402

GENERATED = ROOT / "generated" / "job"


def compiled(scratch: Path) -> tuple[Path, Path]:
    """The compiled job module, and the copy of the .mjs beside its node_modules."""
    built = compile_folders({"job": GENERATED}, scratch)
    if built.code != 0:
        raise SystemExit(f"tsc failed:\n{built.output}")
    script = built.root / "bench_typescript.mjs"
    shutil.copy2(HERE / "bench_typescript.mjs", script)
    return built.root / "out" / "job" / "fsm_job.js", script


def node(script: Path, *args: str) -> Any:
    done = subprocess.run(["node", str(script), *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_apply(script: Path, module: Path, rounds: int) -> bool:
    timings = node(script, "apply", str(module), str(rounds))
    ratios = [a / b for a, b in timings]
    ratio = statistics.median(ratios)
    ok = ratio <= 2.0
    print("1. TypeScript apply(state, event) against plain[state][event] (specs/job.yaml, every legal pair)")
    print(f"   apply {statistics.median(a for a, _ in timings):.1f} ns, lookup {statistics.median(b for _, b in timings):.1f} ns"
          f" a call: {ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}), target within 2x: {'PASS' if ok else 'MISS'}")  # fmt: skip
    return ok


def load_python_job() -> Any:
    spec = importlib.util.spec_from_file_location("fsm_job", GENERATED / "fsm_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fsm_job"] = module
    spec.loader.exec_module(module)
    return module


def bench_workers(script: Path, module: Path, dsn: str, jobs: int, rounds: int) -> None:
    import psycopg

    job = load_python_job()
    schema = f"bench_ts_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
            conn.execute((GENERATED / "job.sql").read_bytes())
            conn.commit()

        def enqueue() -> None:
            with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
                conn.execute("INSERT INTO jobs SELECT FROM generate_series(1, %s)", (jobs,))
                conn.commit()

        def python_worker() -> float:
            start = time.perf_counter()
            done = 0
            with psycopg.connect(dsn, autocommit=True) as conn:
                while claimed := job.claim(conn, "claim", actor="python", schema=schema):
                    row = claimed[0]
                    version = job.transition(conn, row.id, "start", expected_version=row.version, actor="python",
                                             schema=schema)  # fmt: skip
                    job.transition(conn, row.id, "finish", expected_version=version, actor="python", schema=schema)
                    done += 1
            assert done == jobs, (done, jobs)
            return done / (time.perf_counter() - start)

        def node_worker() -> float:
            got = node(script, "worker", str(module), dsn, schema)
            assert got["jobs"] == jobs, got
            return float(got["jobs"]) / float(got["seconds"])

        python_rates, node_rates = [], []
        for i in range(rounds):
            for who in ((python_worker, node_worker) if i % 2 == 0 else (node_worker, python_worker)):
                enqueue()
                (python_rates if who is python_worker else node_rates).append(who())
        best_python, best_node = max(python_rates), max(node_rates)
        print(f"2. one worker, {jobs} no-op jobs (claim, start, finish), best of {rounds} rounds each, turn by turn")
        print(f"   Python (psycopg) {best_python:,.0f} jobs/s, Node (pg) {best_node:,.0f} jobs/s: "
              f"Node/Python {best_node / best_python:.2f}x (rounds: Python "
              f"{', '.join(f'{r:,.0f}' for r in python_rates)}; Node {', '.join(f'{r:,.0f}' for r in node_rates)})")  # fmt: skip
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            writer = conn.execute(f'SELECT "{schema}".job_fsmc_writer()').fetchone()
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            if writer and writer[0]:
                conn.execute(f'DROP OWNED BY "{writer[0]}"')
                conn.execute(f'DROP ROLE "{writer[0]}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="a PostgreSQL database for the worker comparison (skipped without one)")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="worker rounds each (default 3)")
    parser.add_argument("--apply-rounds", type=int, default=21)
    args = parser.parse_args()
    print(f"node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}")
    with tempfile.TemporaryDirectory(prefix="fsmc-bench-ts-") as scratch:
        module, script = compiled(Path(scratch) / "build")
        ok = bench_apply(script, module, args.apply_rounds)
        if args.dsn:
            bench_workers(script, module, args.dsn, args.jobs, args.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
