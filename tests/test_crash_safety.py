"""Crash safety (issue 5, fourth bullet; contract 3: "a build killed at any moment
leaves each file either old or new, never half-written, and no temporary file
inside DIR").

A real `fsmc build` of twelve machines (about 2 MB of output, each file fsync'ed)
is killed with SIGKILL again and again: at random moments from its start, and at
random moments after its first file was replaced (so the kills land while it
writes). After every kill each file in the output directory is byte for byte
its old version or its new one, and no other file exists there; beside it, only
fsmc's own `.fsmc-*.tmp` staging files may be left (see the comment below). A
build run to the end afterwards leaves `build --check` clean.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.harness import run_fsmc

MACHINES = 12


def spec(i: int, version: int) -> str:
    lines = ["fsmc: 1", f"machine: m{i}", "initial: s0", "states:"]
    lines += [f'  s{j}: "version {version} {"x" * 200}"' for j in range(150)]
    lines += ["terminals: [s149]", "events: [go]", "transitions:"]
    lines += [f"  - {{from: s{j}, event: go, to: s{j + 1}}}" for j in range(149)]
    return "\n".join(lines) + "\n"


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_a_build_killed_at_any_moment_leaves_old_or_new_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # spec paths are relative, as headers record them
    specs: dict[int, list[Path]] = {}
    for version in (1, 2):
        folder = tmp_path / f"v{version}"
        folder.mkdir()
        specs[version] = []
        for i in range(MACHINES):
            path = Path(f"v{version}") / f"m{i}.yaml"
            (tmp_path / path).write_text(spec(i, version))
            specs[version].append(path)
    expected = {}
    for version in (1, 2):
        ran = run_fsmc("build", *specs[version], "--out", tmp_path / f"expected{version}")
        assert ran.code == 0, ran
        expected[version] = snapshot(tmp_path / f"expected{version}")
    old, new = expected[1], expected[2]
    assert old.keys() == new.keys() and all(old[k] != new[k] for k in old)

    work = tmp_path / "work"  # the staging directory is the output's parent
    out = work / "out"
    first = out / sorted(old)[0]
    command = [sys.executable, "-m", "fsmc", "build", *map(str, specs[2]), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    subprocess.run(command, check=True, env=env, cwd=tmp_path)
    full = time.monotonic() - started

    rng = random.Random(20240605)
    seen_mixed = seen_old = leftovers = 0
    for attempt in range(24):
        ran = run_fsmc("build", *specs[1], "--out", out)  # back to the old version
        assert ran.code == 0 and snapshot(out) == old, ran
        inode = first.stat().st_ino
        proc = subprocess.Popen(command, env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        if attempt % 2:
            time.sleep(rng.uniform(0, full))  # anywhere in its life
        else:  # while it writes: once the first file was replaced
            deadline = time.monotonic() + 30
            while first.stat().st_ino == inode and proc.poll() is None:
                assert time.monotonic() < deadline, "the build never wrote"
            time.sleep(rng.uniform(0, full / 3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()

        now = snapshot(out)
        assert now.keys() == old.keys(), sorted(now.keys() ^ old.keys())  # no stray file
        torn = [rel for rel, data in now.items() if data not in (old[rel], new[rel])]
        assert not torn, f"half-written after kill {attempt}: {torn}"
        # Staging happens in the output's parent. Where the kernel lets fsmc link an
        # unnamed O_TMPFILE into place, a name exists there for microseconds; where
        # it does not (linkat from /proc fails with EXDEV on some sandboxes), the
        # bytes go to a named .fsmc-*.tmp file there, which a kill leaves behind:
        # outside DIR, as the contract requires, but litter. Known gap; see the
        # issue notes. Only such files may appear, never anything inside DIR.
        staged = [p for p in work.iterdir() if p.name != "out"]
        assert all(p.name.startswith(".fsmc-") and p.name.endswith(".tmp") for p in staged), staged
        leftovers += len(staged)
        for p in staged:
            p.unlink()
        written = sum(now[rel] == new[rel] for rel in now)
        seen_mixed += 0 < written < len(now)
        seen_old += written == 0
    # The kills did land before, and in the middle of, the writing.
    # (At least one of each: how many depends on timing, and these machines are shared.)
    assert seen_mixed >= 1 and seen_old >= 1, (seen_mixed, seen_old, leftovers)

    subprocess.run(command, check=True, env=env, cwd=tmp_path)
    assert snapshot(out) == new
    check = run_fsmc("build", *specs[2], "--out", out, "--check")
    assert check.code == 0, check
