"""No traceback, ever, for user input (issue 5, first bullet; contract section 2).

Whatever bytes a spec holds, `fsmc check` and `fsmc build` end with exit 0, 1 or 2,
print only diagnostics in the contract's `FILE:LINE:COL: SEVERITY: MESSAGE [CODE]`
form (or the CLI's own `fsmc: error: ...` lines), never a traceback, within seconds.

- hypothesis mutates valid specs (delete, duplicate, retype, re-nest nodes; byte
  edits; truncation) and writes random YAML, and runs the CLI in-process on each;
- hand-written hostile files: alias bombs, YAML tags that would run a command,
  100k nested brackets (in a real process: a C stack overflow would kill it),
  non-UTF-8 bytes, a BOM, CRLF and CR line endings, a 20 MB file, /dev/zero, an
  empty file, a directory, a missing file, a file that disappears mid-run;
- `REV:PATH` arguments cannot smuggle options into git.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsmc.load import MAX_BYTES, MAX_DEPTH, MAX_NODES
from tests.conftest import ROOT, SPECS
from tests.harness import assert_json_diagnostics, assert_well_behaved, run_fsmc
from tests.strategies import (
    byte_mutations,
    dump_any,
    machines,
    mutated_tree,
    random_values,
    to_yaml,
)

BASES = {p.stem: p.read_text(encoding="utf-8") for p in sorted(SPECS.glob("*.yaml"))}
JOB = BASES["job"]
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]


def codes(found: list[Any]) -> set[str]:
    return {m["code"] for m in found}


def check_and_build(path: Path, out: Path) -> None:
    """Both commands on one input: well-behaved, and a build that succeeds wrote
    Python that compiles; one that fails wrote nothing."""
    found = assert_well_behaved(run_fsmc("check", path))
    as_json = assert_json_diagnostics(run_fsmc("check", "--format", "json", path))
    assert len(as_json) == len({(m["line"], m["col"], m["code"], m["message"]) for m in found})
    built = run_fsmc("build", path, "--out", out)
    assert_well_behaved(built)
    if built.code == 0:
        for py in out.rglob("*.py"):
            compile(py.read_text(encoding="utf-8"), str(py), "exec")
    else:
        assert not out.exists() or not any(out.rglob("*")), built


# --- hypothesis ----------------------------------------------------------------------


@pytest.mark.slow
@settings(suppress_health_check=HEALTH)
@given(
    base=st.one_of(st.sampled_from(sorted(BASES)).map(lambda k: yaml.safe_load(BASES[k])),
                   machines()),
    data=st.data(),
    flow=st.booleans(),
)  # fmt: skip
def test_mutated_spec_trees_never_crash(
    base: dict[str, Any], data: st.DataObject, flow: bool, tmp_path_factory: Any
) -> None:
    tree = data.draw(mutated_tree(base))
    tmp = tmp_path_factory.mktemp("tree")
    spec = tmp / "spec.yaml"
    spec.write_text(dump_any(tree, flow), encoding="utf-8")
    check_and_build(spec, tmp / "out")


@settings(suppress_health_check=HEALTH)
@given(
    base=st.one_of(st.sampled_from(sorted(BASES)).map(lambda k: BASES[k].encode()),
                   machines().map(lambda m: to_yaml(m).encode())),
    data=st.data(),
)  # fmt: skip
def test_byte_mutations_of_specs_never_crash(
    base: bytes, data: st.DataObject, tmp_path_factory: Any
) -> None:
    tmp = tmp_path_factory.mktemp("bytes")
    spec = tmp / "spec.yaml"
    spec.write_bytes(data.draw(byte_mutations(base)))
    check_and_build(spec, tmp / "out")


@settings(suppress_health_check=HEALTH)
@given(tree=random_values(), flow=st.booleans(), fmt=st.sampled_from(["text", "github"]))
def test_random_yaml_never_crashes(tree: Any, flow: bool, fmt: str, tmp_path_factory: Any) -> None:
    tmp = tmp_path_factory.mktemp("random")
    spec = tmp / "spec.yaml"
    spec.write_text(dump_any(tree, flow), encoding="utf-8")
    ran = run_fsmc("check", "--format", fmt, spec)
    if fmt == "text":
        assert_well_behaved(ran)
    else:
        assert ran.code in (0, 1) and ran.err == "", ran
        # Actions reads one workflow command per "\n"-ended line
        lines = ran.out.split("\n")
        assert lines[-1] == "" and all(
            line.startswith(("::error ", "::warning ")) and line.isprintable() for line in lines[:-1]
        ), ran


@settings(suppress_health_check=HEALTH)
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_crashes(text: str, tmp_path_factory: Any) -> None:
    spec = tmp_path_factory.mktemp("text") / "spec.yaml"
    spec.write_bytes(text.encode("utf-8", "surrogatepass"))
    assert_well_behaved(run_fsmc("check", spec))


# --- hand-written hostile files --------------------------------------------------------


def billion_laughs(levels: int = 9) -> str:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    return "\n".join(lines) + "\n"


HOSTILE: dict[str, tuple[bytes, int, str | None]] = {
    # name: (bytes, exit status, a diagnostic code that must be among those printed)
    "alias bomb": (billion_laughs().encode(), 1, "limit"),
    "alias bomb inside a spec": (
        JOB.replace("initial: queued", "initial: queued\nx: &x [*x]").encode(), 1, "yaml-syntax"
    ),
    "alias bomb in descriptions": (
        (billion_laughs(5) + JOB.replace("description: Lifecycle", "description: *e\n#")).encode(),
        1, "schema",
    ),
    "recursive alias": (b"a: &a [*a]\n", 1, "yaml-syntax"),
    "python tag": (b"!!python/object/apply:os.system ['touch MARKER']\n", 1, "yaml-syntax"),
    "python tag in a spec": (
        JOB.replace("machine: job", "machine: !!python/object/apply:os.system ['touch MARKER']")
        .encode(), 1, "yaml-syntax",
    ),
    "python tag as a key": (
        JOB.replace("  queued: accepted", "  ? !!python/name:os.system\n  : x\n  queued: a")
        .encode(), 1, "yaml-syntax",
    ),
    "python new tag": (
        b"fsmc: !!python/object/new:subprocess.Popen [[touch, MARKER]]\n", 1, "yaml-syntax"
    ),
    "local tag": (JOB.replace("initial: queued", "initial: !state queued").encode(), 1,
                  "yaml-syntax"),
    "tag directive": (b"%TAG !e! tag:example.com,2000:\n---\na: !e!x 1\n", 1, "yaml-syntax"),
    "yaml 1.1 directive": (b"%YAML 1.1\n---\n" + JOB.encode(), 0, None),
    "merge key": (JOB.replace("lease:", "<<: {fsmc: 2}\nlease:").encode(), 1, "schema"),
    "latin-1": (JOB.replace("Lifecycle", "Lifecycle caf\xe9").encode("latin-1"), 1,
                "yaml-syntax"),
    "utf-16 with BOM": (JOB.encode("utf-16"), 1, "yaml-syntax"),
    "overlong utf-8": (b"machine: \xc0\xaf\n", 1, "yaml-syntax"),
    "encoded surrogate": (b"machine: \xed\xa0\x80\n", 1, "yaml-syntax"),
    "lone continuation byte": (b"\x80", 1, "yaml-syntax"),
    "NUL byte": (JOB.replace("initial: queued", "initial: que\x00ued").encode(), 1,
                 "yaml-syntax"),
    "NUL in a description": (
        JOB.replace("description: Lifecycle", 'description: "\\0 Lifecycle').replace(
            "in relayd.", 'in relayd."').encode(), 1, "schema",
    ),
    "control character": (JOB.replace("initial: queued", "initial: que\x1bued").encode(), 1,
                          "yaml-syntax"),
    "a name with a line break and ESC": (
        JOB.replace("  queued: accepted", '  "que\\nued\\e[2J": x\n  queued: accepted').encode(),
        1, "bad-name",
    ),
    "no terminals": (JOB.replace("[completed, abandoned]", "[]").encode(), 1, "dead-end"),
    "no events": (b"fsmc: 1\nmachine: m\ninitial: a\nstates: [a]\nterminals: [a]\n"
                  b"events: {}\ntransitions: []\n", 1, "schema"),
    "empty": (b"", 1, "schema"),
    "whitespace only": (b"  \n\t\n\n", 1, None),
    "comment only": (b"# nothing here\n", 1, "schema"),
    "document marker only": (b"---\n", 1, "schema"),
    "document end only": (b"...\n", 1, None),
    "null": (b"null\n", 1, "schema"),
    "a number": (b"42\n", 1, "schema"),
    "a string": (b'"fsmc: 1"\n', 1, "schema"),
    "a list": (b"- fsmc: 1\n", 1, "schema"),
    "an empty mapping": (b"{}\n", 1, "schema"),
    "two documents": (JOB.encode() + b"---\n" + JOB.encode(), 1, "yaml-syntax"),
    "unclosed flow": (b"states: [a, b\n", 1, "yaml-syntax"),
    "unclosed quote": (b'machine: "job\n', 1, "yaml-syntax"),
    "tab indentation": (JOB.replace("  queued:", "\tqueued:").encode(), 1, "yaml-syntax"),
    "huge integer": (JOB.replace("fsmc: 1", "fsmc: " + "9" * 5000).encode(), 1, "schema"),
    "float version": (JOB.replace("fsmc: 1", "fsmc: 1.0").encode(), 1, "schema"),
    "boolean name": (JOB.replace("initial: queued", "initial: true").encode(), 1, "schema"),
    "integer key": (JOB.replace("  queued: accepted", "  1: one\n  queued: accepted").encode(),
                    1, "schema"),
    "null key": (JOB.replace("  queued: accepted", "  ~: none\n  queued: accepted").encode(),
                 1, "schema"),
    "mapping key": (JOB.replace("  queued: accepted", "  ? [a]\n  : b\n  queued: a").encode(),
                    1, "schema"),
    "a 1 MiB name": (JOB.replace("machine: job", "machine: j" + "o" * 2**20).encode(), 1,
                     "bad-name"),
    "a 3 MiB description": (
        JOB.replace("description: Lifecycle", "description: " + "x" * 3 * 2**20).encode(), 0,
        None,
    ),
    "100k duplicate keys": (b"".join(b"a: 1\n" for _ in range(100_000)), 1, "duplicate-key"),
    "a million list items": (b"[" + b"0," * (MAX_NODES + 1) + b"]", 1, "limit"),
    "just past the size limit": (JOB.encode() + b"#" * (MAX_BYTES + 1 - len(JOB)), 1, "limit"),
    "20 MB": (JOB.encode() + b"\n#" + b"x" * 20_000_000 + b"\n", 1, "limit"),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_files_end_in_clear_diagnostics(name: str, tmp_path: Path) -> None:
    data, status, code = HOSTILE[name]
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(data)
    ran = run_fsmc("check", spec)
    # 3 s of CPU for the largest under load (a million list items, 100k keys)
    found = assert_well_behaved(ran, cpu_seconds=10 if len(data) > 2**18 else 5)
    assert ran.code == status, ran
    if code is not None:
        assert code in codes(found), ran
    if status == 1:
        assert any(m["severity"] == "error" and m["file"] == str(spec) for m in found), ran
    if len(data) > 2**20:
        return  # the big ones cost seconds each, and build reads them as check does
    out = tmp_path / "out"
    built = run_fsmc("build", spec, "--out", out)
    assert_well_behaved(built)
    assert built.code == status, built
    assert (status == 0) == out.exists(), built


def test_tags_never_run_anything(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    payloads = [
        f"!!python/object/apply:os.system ['touch {marker}']",
        f"!!python/object/apply:subprocess.call [[touch, {marker}]]",
        f"!!python/object/new:subprocess.Popen [[touch, {marker}]]",
        "!!python/name:os.system",
        f"!!python/module:os {marker}",
    ]
    for i, payload in enumerate(payloads):
        for where in ("machine: job", "initial: queued", "  claim: a worker reserves the job"):
            spec = tmp_path / f"spec{i}.yaml"
            key = where.split(":")[0]
            spec.write_text(JOB.replace(where, f"{key}: {payload}"))
            for argv in (("check", spec), ("build", spec, "--out", tmp_path / "out"),
                         ("graph", spec)):  # fmt: skip
                ran = run_fsmc(*argv)
                found = assert_well_behaved(ran)
                assert ran.code == 1 and "yaml-syntax" in codes(found), ran
                assert "tags are not allowed" in ran.out + ran.err, ran
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_deep_nesting_is_refused_by_a_real_process_without_crashing(tmp_path: Path) -> None:
    # libyaml's composer recurses in C: a segfault here would kill the process, so
    # this runs the real entry point, on every shape of deep nesting at once.
    n = 100_000
    shapes = {
        "flow-seq": "[" * n + "]" * n,
        "flow-seq-unclosed": "[" * n,
        "flow-map": "{a: " * n + "}" * n,
        "block-seq": "- " * n + "x\n",
        "block-map": "".join(" " * i + "a:\n" for i in range(2000)) + " " * 2000 + "x\n",
        "mixed": "[{a: " * (n // 2) + "x" + "}]" * (n // 2),
        "in-a-spec": JOB.replace("description: Lifecycle", "description: " + "[" * n + "]" * n
                                 + "\n#"),
    }  # fmt: skip
    paths = []
    for name, text in shapes.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        paths.append(str(path))
    done = subprocess.run(
        [sys.executable, "-m", "fsmc", "check", *paths],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    for path in paths:
        mine = [line for line in done.stdout.splitlines() if line.startswith(path + ":")]
        assert mine, (path, done.stdout[-3000:], done.stderr[-3000:])
        assert any(line.endswith("[limit]") or line.endswith("[yaml-syntax]") for line in mine)
    limited = [line for line in done.stdout.splitlines() if line.endswith("[limit]")]
    assert all(f"deeper than {MAX_DEPTH} levels" in line for line in limited)
    assert len(limited) >= len(paths) - 1  # the unclosed one may end as a syntax error


def test_a_byte_order_mark_changes_nothing_but_the_digest(tmp_path: Path) -> None:
    plain, bom = tmp_path / "plain" / "job.yaml", tmp_path / "bom" / "job.yaml"
    for path, data in ((plain, JOB.encode()), (bom, b"\xef\xbb\xbf" + JOB.encode())):
        path.parent.mkdir()
        path.write_bytes(data)
    assert_same_build(plain, bom, tmp_path)


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_crlf_and_cr_line_endings_change_nothing_but_the_digest(
    ending: str, tmp_path: Path
) -> None:
    plain, other = tmp_path / "plain" / "job.yaml", tmp_path / "other" / "job.yaml"
    for path, text in ((plain, JOB), (other, JOB.replace("\n", ending))):
        path.parent.mkdir()
        path.write_bytes(text.encode())
    assert_same_build(plain, other, tmp_path)


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_diagnostics_point_at_the_same_line_and_column_whatever_the_line_endings(
    ending: str, tmp_path: Path
) -> None:
    broken = (JOB.replace("event: start, to: running", "event: strat, to: runing")
              .replace("initial: queued", "initial: queued\ninitial: again"))  # fmt: skip
    plain, other = tmp_path / "plain.yaml", tmp_path / "other.yaml"
    plain.write_bytes(broken.encode())
    other.write_bytes(("\ufeff" + broken.replace("\n", ending)).encode())
    a, b = run_fsmc("check", plain), run_fsmc("check", other)
    assert a.code == b.code == 1
    assert_well_behaved(a), assert_well_behaved(b)
    assert a.out.replace(str(plain), "F") == b.out.replace(str(other), "F")


def assert_same_build(a: Path, b: Path, tmp_path: Path) -> None:
    outs = []
    for spec in (a, b):
        out = spec.parent / "out"
        ran = run_fsmc("build", spec, "--out", out)
        assert ran.code == 0 and assert_well_behaved(ran) == [], ran
        outs.append({p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*.*")})
    assert outs[0].keys() == outs[1].keys()
    for rel in outs[0]:
        left = [line for line in outs[0][rel].splitlines() if "sha256" not in line]
        right = [line for line in outs[1][rel].splitlines() if "sha256" not in line]
        assert left == right, rel


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_devices_are_refused_after_the_size_limit(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} does not exist here")
    ran = run_fsmc("check", device)
    found = assert_well_behaved(ran)
    assert ran.code == 1 and codes(found) == {"limit"}, ran


def test_the_size_limit_says_which_limit_and_not_a_wrong_size(tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_bytes(JOB.encode() + b"#" * (20 * 2**20))
    ran = run_fsmc("check", spec)
    (found,) = assert_well_behaved(ran)
    assert found["code"] == "limit" and (found["line"], found["col"]) == ("1", "1"), ran
    assert "4.0 MiB" in found["message"]
    # fsmc reads at most MAX_BYTES + 1 bytes, so it cannot know a size past that:
    # the message must not claim the 20 MB file "is 4.0 MiB".
    assert "is 4.0 MiB" not in found["message"], ran


def test_io_trouble_is_exit_2_with_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "dangling.yaml").symlink_to(tmp_path / "nowhere.yaml")
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop.yaml")
    cases = {
        "missing.yaml": "no such file",
        "dir.yaml": "is a directory",
        "dangling.yaml": "no such file",
        "loop.yaml": "cannot read",
        "no-such-rev:spec.yaml": "",
    }
    for name, words in cases.items():
        for command in ("check", "build"):
            ran = run_fsmc(command, tmp_path / name if ":" not in name else name)
            assert_well_behaved(ran)
            assert ran.code == 2, ran
            assert ran.err.count("\n") == 1 and ran.err.startswith("fsmc: error: "), ran
            assert words in ran.err, ran


def test_a_spec_that_disappears_or_changes_mid_run(tmp_path: Path) -> None:
    """A writer thread deletes, truncates and rewrites the spec while fsmc reads it:
    every run sees some state of the file and ends well, never with a traceback."""
    spec = tmp_path / "job.yaml"
    data = JOB.encode()
    spec.write_bytes(data)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                if i % 3 == 0:
                    spec.unlink()
                elif i % 3 == 1:
                    spec.write_bytes(data[: (i * 37) % len(data)])
                else:
                    spec.write_bytes(data)
            except FileNotFoundError:
                pass

    writer = threading.Thread(target=churn)
    writer.start()
    seen = set()
    try:
        for i in range(300):
            if i % 2:
                ran = run_fsmc("build", spec, "--out", tmp_path / f"out{i % 3}")
            else:
                ran = run_fsmc("check", spec)
            assert_well_behaved(ran)
            seen.add(ran.code)
    finally:
        stop.set()
        writer.join()
    assert {1, 2} <= seen, seen  # both a truncated spec and a vanished one were met


def test_a_rev_cannot_smuggle_options_into_git(tmp_path: Path) -> None:
    target = tmp_path / "written-by-git"
    for argv in (("check", "--", f"--output={target}:x"), ("build", "--", f"--output={target}:x")):
        ran = run_fsmc(*argv)
        assert_well_behaved(ran)
        assert ran.code == 2, ran
    assert not any(p.name.startswith("written-by-git") for p in tmp_path.iterdir())


@pytest.mark.slow
def test_the_real_entry_point_never_prints_a_traceback(tmp_path: Path) -> None:
    files = {name: data for name, (data, _, _) in HOSTILE.items() if len(data) < 2**20}
    paths = []
    for i, data in enumerate(files.values()):
        path = tmp_path / f"{i}.yaml"
        path.write_bytes(data)
        paths.append(str(path))
    done = subprocess.run(
        [sys.executable, "-m", "fsmc", "check", *paths],
        capture_output=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    err, out = done.stderr.decode("utf-8"), done.stdout.decode("utf-8")
    assert done.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "internal error" not in err and err == "", err[-3000:]
    for line in out.splitlines():
        assert line.startswith(tuple(p + ":" for p in paths)), line
