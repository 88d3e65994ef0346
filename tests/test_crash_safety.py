"""Crash safety (issue 5, fourth bullet; contract 3: "a build killed at any moment
leaves each file either old or new, never half-written, and no temporary file
inside DIR").

A real `fsmc build` process replaces the files of an earlier build and is killed
with SIGKILL at chosen moments of its write phase. Files on disk change only
through the writer's system calls (`os.write`, `os.fsync`, `os.link`,
`os.replace`), so the child counts those calls and SIGKILLs itself just before or
just after the n-th one, or halfway through a write: kills on both sides of every
kind of call, at the first, a middle and the last file, stand for a kill at any
moment, deterministically and without sleeping. A first, uninterrupted run
records the sequence of calls, from which each moment's outcome follows: exactly
as many files are new as renames had happened.

After every kill each file in DIR is byte for byte its old version or its new
one, as many new as renames done, and no other file exists in DIR; the staging
directory (TMPDIR, on the same filesystem) holds nothing but the killed process's
own `.fsmc-<pid>-*.tmp` files, which the next build sweeps away. A build run to the end afterwards leaves `build --check` clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.harness import run_fsmc

MACHINES = 3
STATES = 40

# Runs `fsmc ARGV` with the writer's system calls counted. With a moment
# (index, "before" | "after" | "half"), the process SIGKILLs itself there; without,
# it prints the sequence of calls when the build is done.
CHILD = """
import json, os, signal, sys, tempfile
from fsmc.cli import main

tempfile.gettempdir()  # Python probes TMPDIR with a write of its own: not fsmc's
# Jinja2's compiled-template cache (in the user's cache folder) is filled or read
# before counting: its writes are a cache's, not the build's, whose every write is
# counted below.
from fsmc.templating import environment, template_names
for name in template_names():
    environment().get_template(name)
moment = json.loads(sys.argv[1])
calls = []

def counted(name, real):
    def call(*args, **kwargs):
        calls.append(name)
        if moment and len(calls) - 1 == moment[0]:
            if moment[1] == "half":
                real(args[0], args[1][: len(args[1]) // 2])
            elif moment[1] == "after":
                try:
                    real(*args, **kwargs)
                finally:  # a call that fails (a refused link) is killed after, too
                    os.kill(os.getpid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return call

for name in ("write", "fsync", "link", "replace"):
    setattr(os, name, counted(name, getattr(os, name)))
code = main(sys.argv[2:])
if not moment:
    print(json.dumps(calls))
sys.exit(code)
"""


def spec(i: int, version: int) -> str:
    lines = ["fsmc: 1", f"machine: m{i}", "initial: s0", "states:"]
    lines += [f'  s{j}: "version {version} {"x" * 200}"' for j in range(STATES)]
    lines += [f"terminals: [s{STATES - 1}]", "events: [go]", "transitions:"]
    lines += [f"  - {{from: s{j}, event: go, to: s{j + 1}}}" for j in range(STATES - 1)]
    return "\n".join(lines) + "\n"


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def moments(calls: list[str]) -> list[tuple[int, str]]:
    """Where to kill: on each side of the first, a middle and the last rename; with
    the first file's bytes not yet written, half written, written but not renamed
    (after its fsync, and after its link where the kernel allows one); halfway
    through a middle file's write."""
    def at(name: str) -> list[int]:
        return [i for i, call in enumerate(calls) if call == name]

    writes, renames = at("write"), at("replace")
    chosen = {(writes[0], "before"), (writes[0], "half"), (at("fsync")[0], "after"),
              (writes[len(writes) // 2], "half")}  # fmt: skip
    chosen |= {(i, "after") for i in at("link")[:1]}
    for i in (renames[0], renames[len(renames) // 2], renames[-1]):
        chosen |= {(i, "before"), (i, "after")}
    return sorted(chosen)


@pytest.mark.slow
def test_a_build_killed_at_any_moment_leaves_old_or_new_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # spec paths are relative, as headers record them
    staging = tmp_path / "staging"  # where the writer stages bytes: TMPDIR, same filesystem
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))  # the in-process builds, too
    specs: dict[int, list[str]] = {}
    for version in (1, 2):
        (tmp_path / f"v{version}").mkdir()
        specs[version] = []
        for i in range(MACHINES):
            path = f"v{version}/m{i}.yaml"
            (tmp_path / path).write_text(spec(i, version))
            specs[version].append(path)
    expected = {}
    for version in (1, 2):
        ran = run_fsmc("build", *specs[version], "--out", tmp_path / f"expected{version}")
        assert ran.code == 0, ran
        expected[version] = snapshot(tmp_path / f"expected{version}")
    old, new = expected[1], expected[2]
    assert old.keys() == new.keys() and all(old[k] != new[k] for k in old)

    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(staging)}

    def restore_old() -> None:
        for rel, data in old.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)

    def child(moment: tuple[int, str] | None) -> tuple[int, int, str, str]:
        """(exit status, pid, stdout, stderr) of the counted build of v2."""
        argv = ["build", *specs[2], "--out", str(out)]
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(moment), *argv],
                                env=env, cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        stdout, stderr = proc.communicate(timeout=300)
        return proc.returncode, proc.pid, stdout, stderr

    restore_old()
    code, _, stdout, stderr = child(None)
    assert code == 0, stderr
    assert snapshot(out) == new
    calls = json.loads(stdout)
    assert calls.count("replace") == len(new), calls  # one rename per file, nothing else
    chosen = moments(calls)
    assert len(chosen) >= 10, (chosen, calls)

    seen, left = set(), set()
    for index, when in chosen:
        restore_old()
        code, pid, _, stderr = child((index, when))
        assert code == -9, (index, when, stderr)
        renamed = calls[:index].count("replace") + (when == "after" and calls[index] == "replace")

        now = snapshot(out)
        assert now.keys() == old.keys(), sorted(now.keys() ^ old.keys())  # no stray file
        torn = [rel for rel, data in now.items() if data not in (old[rel], new[rel])]
        assert not torn, f"half-written after a kill {when} call {index} ({calls[index]}): {torn}"
        assert sum(now[rel] == new[rel] for rel in now) == renamed, (index, when)
        seen.add(0 if renamed == 0 else 2 if renamed == len(now) else 1)
        # Staged bytes wait outside DIR. Where the kernel lets fsmc link an unnamed
        # O_TMPFILE into place, a name exists there only between link and rename;
        # elsewhere (linkat from /proc fails with EXDEV on some sandboxes) the bytes
        # go to a named .fsmc-PID-*.tmp from the start. Either way only the killed
        # process's own staged files may be left, and the next build removes them.
        now_left = {p.name for p in staging.iterdir()} - left
        assert all(n.startswith(f".fsmc-{pid}-") and n.endswith(".tmp") for n in now_left), now_left
        left |= now_left
    # The kills landed before any file was new, amid the renames, and after the last.
    assert seen == {0, 1, 2}, seen

    restore_old()
    ran = run_fsmc("build", *specs[2], "--out", out)  # sweeps what the killed ones left
    assert ran.code == 0, ran
    assert snapshot(out) == new and list(staging.iterdir()) == [], left
    check = run_fsmc("build", *specs[2], "--out", out, "--check")
    assert check.code == 0, check


def test_a_cache_folder_that_cannot_be_made_or_written_changes_nothing(tmp_path: Path) -> None:
    # Compiled templates are kept in the user's cache folder; without one (a read-only
    # home, a file in the way) every process compiles, and the output is the same.
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would go")
    outs = []
    for cache_home in (blocked, tmp_path / "cache"):
        out = tmp_path / f"out-{cache_home.name}"
        ran = subprocess.run([sys.executable, "-m", "fsmc", "build", str(ROOT / "specs" / "job.yaml"),
                              "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "XDG_CACHE_HOME": str(cache_home)})  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        outs.append(snapshot(out))
    assert outs[0] == outs[1]
    assert any((tmp_path / "cache" / "fsmc" / "jinja2").iterdir())
