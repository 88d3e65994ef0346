"""Bounded resources (issue 5, fifth bullet; contract 2: hostile YAML "ends in a clear
error within seconds").

Each case runs the real entry point in its own process, and `os.wait4` reports
that process's own CPU time and peak memory. Specs within the limits build (or
fail) in bounded time and memory, however they are shaped; the worst shapes found
so far (thousands of misspelt names among thousands of states, a 4 MiB file of
schema errors) are here because they once took minutes or hours.

Time is CPU time, not wall-clock time: under load on a shared 2-core machine the
wall clock measures the other users (16.2 s against a 15 s limit), the CPU time
what fsmc did. Each budget is at least 3x the CPU time the case took under `-n 2`
with the other core busy, and far below what the runaway cases took.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsmc.load import MAX_BYTES
from tests.conftest import ROOT

MiB = 1024 * 1024


def run_measured(*argv: str, cwd: Path) -> tuple[int, str, float, int]:
    """(exit status, output, CPU seconds, peak RSS in bytes) of `python -m fsmc ARGV`;
    the output is stdout (diagnostics) and stderr (`fsmc: ...` lines) in one."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsmc", *argv], cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    err = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return proc.returncode, err.decode(), cpu, usage.ru_maxrss * 1024


def chain(n: int, description: str) -> str:
    lines = ["fsmc: 1", "machine: big", "initial: s0", "states:"]
    lines += [f'  s{i}: "{description}"' for i in range(n)]
    lines += [f"terminals: [s{n - 1}]", "events: [go]", "transitions:"]
    lines += [f"  - {{from: s{i}, event: go, to: s{i + 1}}}" for i in range(n - 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape", ["25,000 states", "2,000 states with 1 KiB descriptions"]
)
def test_a_2_mb_spec_builds_in_bounded_time_and_memory(shape: str, tmp_path: Path) -> None:
    text = chain(25_000, "d" * 20) if shape.startswith("25") else chain(2_000, "d" * 1000)
    assert 1.5 * MiB < len(text) < 2.5 * MiB
    (tmp_path / "big.yaml").write_text(text)
    code, err, cpu, peak = run_measured("build", "big.yaml", "--out", "out", cwd=tmp_path)
    assert code == 0, err[-3000:]
    # CPU: 3.6 s under load
    assert cpu < 30 and peak < 400 * MiB, (cpu, peak / MiB)
    assert (tmp_path / "out" / "big" / "fsm_big.py").stat().st_size > 0


@pytest.mark.slow
def test_many_misspelt_names_among_many_states_end_within_seconds(tmp_path: Path) -> None:
    # 30,000 unknown targets, each once compared with all 30,000 states for a
    # "did you mean": 900 million comparisons, which ran for hours.
    n = 30_000
    lines = ["fsmc: 1", "machine: big", "initial: s0",
             "states: [" + ", ".join(f"s{i}" for i in range(n)) + "]",
             f"terminals: [s{n - 1}]", "events: [go]", "transitions:"]  # fmt: skip
    lines += [f"- {{from: s{i}, event: go, to: s{i + 1}x}}" for i in range(n - 1)]
    (tmp_path / "typos.yaml").write_text("\n".join(lines) + "\n")
    code, err, cpu, peak = run_measured("check", "typos.yaml", cwd=tmp_path)
    assert code == 1 and err.count("[unknown-state]") == n - 1, err[-2000:]
    assert "did you mean 's" in err  # the first ones still get a suggestion
    # CPU: 2.4 s under load (hours before)
    assert cpu < 15 and peak < 600 * MiB, (cpu, peak / MiB)


@pytest.mark.slow
def test_a_4_mib_file_of_schema_errors_ends_within_seconds(tmp_path: Path) -> None:
    head = "fsmc: 1\nmachine: job\ninitial: a\nstates: [a]\nterminals: [a]\nevents: [e]\n"
    row = "- {from: 1, event: 2, to: 3}\n"
    # 140,000 rows of 7 nodes each stay under the 1,000,000-node limit.
    text = head + "transitions:\n" + row * 140_000
    assert 3.5 * MiB < len(text) <= MAX_BYTES
    (tmp_path / "errors.yaml").write_text(text)
    code, err, cpu, peak = run_measured("check", "errors.yaml", cwd=tmp_path)
    assert code == 1, err[-2000:]
    lines = err.splitlines()
    (limit,) = [line for line in lines if line.endswith("[limit]")]
    assert "at most 1,000 schema errors" in limit, limit
    assert len(lines) <= 1001
    # CPU: 6.2 s under load
    assert cpu < 20 and peak < 768 * MiB, (cpu, peak / MiB)


@pytest.mark.slow
def test_input_past_each_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    cases = {
        "size.yaml": ("#" * (MAX_BYTES + 1), "larger than 4.0 MiB"),
        "depth.yaml": ("[" * 65 + "]" * 65, "nesting is deeper than 64 levels"),
        "nodes.yaml": ("[" + "0," * 1_000_001 + "]", "more than 1,000,000 YAML nodes"),
        "aliases.yaml": ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n"
            for i in range(6)), "more than 1,000,000 YAML nodes"),
    }  # fmt: skip
    for name, (text, _) in cases.items():
        (tmp_path / name).write_text(text)
    code, err, cpu, peak = run_measured("check", *cases, cwd=tmp_path)
    assert code == 1 and "Traceback" not in err, err
    for name, (_, words) in cases.items():
        (line,) = [x for x in err.splitlines() if x.startswith(name + ":")]
        assert line.endswith("[limit]") and words in line, line
    # CPU: 4.1 s under load
    assert cpu < 20 and peak < 400 * MiB, (cpu, peak / MiB)
