"""Output: put generated `{relative path: text}` on disk atomically, or compare with it.

Atomic means a build killed at any instant (SIGKILL included) leaves every file
either its old bytes or its new bytes, and no temporary file inside the output
directory. Each file's new bytes are staged outside it (`staging_dir`: the system
temp directory when it shares the output's filesystem, else the output's parent),
then renamed over the target in one atomic step. Where Linux allows it, the bytes
are written to an unnamed O_TMPFILE first, so a name exists only for the
microseconds between link and rename; elsewhere (some sandboxes refuse the link)
a named `.fsmc-<pid>-*.tmp` file is used, and the next build sweeps away any such
file whose process is gone.

A file we generated starts with fsmc's header line (`generated_from`); only such
files, directly inside a machine folder, are ever called orphans or removed, so
a user's own notes, templates or nested output folders are never touched.
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fsmc.source import project_root
from fsmc.targets.common import header_spec

_IGNORED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


@dataclass(frozen=True)
class Stale:
    """The state of the output directory against what a build would write."""

    changed: list[str]
    missing: list[str]
    orphans: list[str]
    diff: str

    @property
    def current(self) -> bool:
        return not (self.changed or self.missing or self.orphans)


def generated_from(path: Path) -> str | None:
    """The spec path in a file's fsmc header (its first line), or None for a file
    fsmc did not write: a template or a note that merely mentions the phrase is not
    one of ours."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline(2048).rstrip("\r\n")
    except OSError:
        return None
    return header_spec(first)


def _candidates(out: Path) -> list[tuple[str, str, Path]]:
    """(folder, relative path, path) of every file directly in a folder of `out`:
    where fsmc puts a machine's files, and nowhere deeper or higher."""
    found = []
    try:
        folders = sorted(p for p in out.iterdir() if p.is_dir() and p.name not in _IGNORED_DIRS)
    except OSError:
        return []
    for folder in folders:
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.is_symlink():
                found.append((folder.name, f"{folder.name}/{path.name}", path))
    return found


def orphans(
    out: Path, files: dict[str, str], specs: frozenset[str] = frozenset(), left_alone: tuple[str, ...] = ()
) -> list[str]:
    """Files fsmc generated earlier in `out` that this build would not write.

    A file with fsmc's header is an orphan when it is in a machine folder this build
    writes, or its header names one of this build's `specs` (the spec now defines a
    machine of another name). Folders of other specs are never touched: a partial
    build (`fsmc build specs/job.yaml`) must not disown `generated/runner/`, and
    whether another spec still exists cannot be judged safely from here (it may
    live in another repository, or have been built from a git revision); see
    `abandoned` for the warning about those.

    A file whose name ends with a suffix in `left_alone` belongs to an optional target
    this build was not asked for (`.ts` without `--typescript`): never an orphan.
    """
    written = {p.split("/", 1)[0] for p in files}
    return [
        rel
        for folder, rel, path in _candidates(out)
        if rel not in files
        and not (left_alone and rel.endswith(left_alone))
        and (spec := generated_from(path)) is not None
        and (folder in written or spec in specs)
    ]


def not_rebuilt(out: Path, files: dict[str, str], left_alone: tuple[str, ...]) -> list[str]:
    """fsmc's files of an optional target that this build leaves as they are, in the
    folders it writes: worth a warning, since they may no longer match their spec."""
    if not left_alone:
        return []
    written = {p.split("/", 1)[0] for p in files}
    return [
        rel
        for folder, rel, path in _candidates(out)
        if folder in written and rel not in files and rel.endswith(left_alone) and generated_from(path) is not None
    ]


def abandoned(
    out: Path,
    files: dict[str, str],
    specs: frozenset[str] = frozenset(),
    roots: Iterable[Path] = (),
) -> list[str]:
    """Folders of `out` generated from a spec that seems to be gone: worth a warning,
    never a deletion (a false guess would destroy a file this build knows nothing of).

    A header records its spec's path relative to the root of the spec's repository
    (`source.spec_root`), which the header does not name. The spec seems gone only
    when that path exists under none of the folders it may be relative to: `roots`
    (those of this build's specs, which usually share a repository with the earlier
    ones), the output's repository, the working directory's, and the working
    directory itself. A wrong guess costs at most a missed warning, never a false one
    for a spec that exists in the repository being built."""
    written = {p.split("/", 1)[0] for p in files}
    cwd = Path.cwd()
    candidates = [*roots, project_root(out.resolve()), project_root(cwd), cwd]
    bases = [b for b in dict.fromkeys(candidates) if b is not None]
    gone: dict[str, str] = {}
    for folder, _, path in _candidates(out):
        spec = generated_from(path)
        if folder in written or spec is None or spec in specs or folder in gone:
            continue
        relative = PurePosixPath(spec)
        if spec and not relative.is_absolute() and ".." not in relative.parts:
            if not any((base / relative).exists() for base in bases):
                gone[folder] = spec
    return [f"{folder}/ (from {spec})" for folder, spec in sorted(gone.items())]


def compare(
    out: Path, files: dict[str, str], specs: frozenset[str] = frozenset(), left_alone: tuple[str, ...] = ()
) -> Stale:
    changed: list[str] = []
    missing: list[str] = []
    chunks: list[str] = []
    for rel in sorted(files):
        path = out / rel
        new = files[rel]
        try:
            old = path.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            missing.append(rel)
            old = None
        except OSError:
            old = ""
        if old == new:
            continue
        if old is not None:
            changed.append(rel)
        shown = (out / rel).as_posix()
        chunks.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile="/dev/null" if old is None else f"a/{shown}",
                tofile=f"b/{shown}",
            )
        )
    gone = orphans(out, files, specs, left_alone)
    for rel in gone:
        shown = (out / rel).as_posix()
        old = (out / rel).read_text(encoding="utf-8", errors="replace")
        chunks.extend(
            difflib.unified_diff(
                old.splitlines(keepends=True), [], fromfile=f"a/{shown}", tofile="/dev/null"
            )
        )
    diff = "".join(c if c.endswith("\n") else c + "\n\\ No newline at end of file\n" for c in chunks)
    return Stale(changed, missing, gone, diff)


def write(
    out: Path, files: dict[str, str], specs: frozenset[str] = frozenset(), left_alone: tuple[str, ...] = ()
) -> list[str]:
    """Write every file whose bytes differ, remove orphans; return what changed."""
    written = []
    out.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(out)
    sweep_stale(staging)
    for rel in sorted(files):
        path = out / rel
        data = files[rel].encode("utf-8")
        try:
            if path.read_bytes() == data:
                continue
        except OSError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            replace_atomically(path, data, staging)
        except OSError as exc:  # name the file the user asked for, not our staged copy
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        written.append(rel)
    emptied = set()
    for rel in orphans(out, files, specs, left_alone):
        (out / rel).unlink()
        written.append(rel)
        emptied.add(out / rel.split("/", 1)[0])
    for folder in sorted(emptied):
        _remove_if_emptied(folder)
    return written


def _remove_if_emptied(folder: Path) -> None:
    """Remove a machine folder that removing orphans left with nothing but caches
    (a renamed machine's old folder): build emptied it, so build tidies it away.
    Anything else in it (a user's note, a nested folder) keeps it."""
    try:
        left = list(folder.iterdir())
        if any(p.name not in _IGNORED_DIRS or p.is_symlink() or not p.is_dir() for p in left):
            return
        for cache in left:
            shutil.rmtree(cache)
        folder.rmdir()
    except OSError:
        pass  # tidying is a courtesy; the build itself succeeded


def staging_dir(out: Path) -> Path:
    """Where new bytes wait for their rename: never inside `out`.

    The system temp directory when it is on the same filesystem as `out` (a rename
    cannot cross filesystems), so that a build killed mid-write leaves its partial
    bytes where temporary files belong; else the parent of `out`.
    """
    target = out.resolve()
    temp = Path(tempfile.gettempdir())
    try:
        if temp.stat().st_dev == target.stat().st_dev and os.access(temp, os.W_OK):
            return temp
    except OSError:
        pass
    return target.parent


_STAGED = re.compile(r"\.fsmc-(\d+)-[^/]*\.tmp")


def sweep_stale(staging: Path) -> None:
    """Remove staged files of fsmc processes that were killed before their rename."""
    try:
        names = os.listdir(staging)
    except OSError:
        return
    for name in names:
        found = _STAGED.fullmatch(name)
        if found is None or _alive(int(found.group(1))):
            continue
        try:
            os.unlink(staging / name)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, and belongs to someone else
    return True


def replace_atomically(path: Path, data: bytes, staging: Path) -> None:
    """Give `path` the bytes `data` in one rename, staging the bytes in `staging`.

    Where `staging` cannot serve (not writable, or another filesystem, so the rename
    would fail), the bytes are staged beside `path` instead.
    """
    try:
        _replace(path, data, staging)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        _replace(path, data, path.parent)


def _replace(path: Path, data: bytes, staging: Path) -> None:
    mode = 0o644 & ~_umask()
    tmp_name = _staged_unnamed(data, staging, mode)
    if tmp_name is None:
        fd, name = tempfile.mkstemp(dir=staging, prefix=f".fsmc-{os.getpid()}-", suffix=".tmp")
        tmp_name = Path(name)
        try:
            os.fchmod(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        except BaseException:
            os.unlink(tmp_name)
            raise
        finally:
            os.close(fd)
    try:
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise


def _staged_unnamed(data: bytes, staging: Path, mode: int) -> Path | None:
    """Write `data` to an unnamed file and give it a name only once complete.

    None where the filesystem cannot (no O_TMPFILE, or no linking it from /proc).
    """
    global _unnamed_works
    if not _unnamed_works:
        return None
    fd = _unnamed_file(staging, mode)
    if fd is None:
        return None
    tmp_name = staging / f".fsmc-{os.getpid()}-{secrets.token_hex(6)}.tmp"
    try:
        _write_all(fd, data)
        os.fsync(fd)
        os.link(f"/proc/self/fd/{fd}", tmp_name, follow_symlinks=True)
    except OSError:
        _unnamed_works = False  # e.g. a sandboxed /proc: stop paying for the attempt
        return None
    finally:
        os.close(fd)
    return tmp_name


_unnamed_works = True


def _unnamed_file(directory: Path, mode: int) -> int | None:
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(directory, flag | os.O_WRONLY, mode)
    except OSError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
