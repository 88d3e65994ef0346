"""Source: a spec argument (a path, or `REV:PATH` read from git) -> its bytes.

Trouble here is the user's environment, not the spec: a missing file, a
directory, an unreadable file, a git revision that does not exist. It raises
`SourceError`, which the CLI turns into exit status 2. At most `MAX_BYTES + 1`
bytes are read, so `/dev/zero` or a 20 GB file costs nothing; the loader then
refuses anything past the limit.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fsmc.load import MAX_BYTES


class SourceError(Exception):
    pass


@dataclass(frozen=True)
class Source:
    file: str  # the argument as the user wrote it; diagnostics use it
    path: str  # a relative path for generated headers (no absolute paths in output)
    data: bytes


def read(arg: str) -> Source:
    if _is_file(arg):
        return Source(arg, _header_path(arg), _read_file(arg))
    rev, _, path = arg.partition(":")
    return Source(arg, PurePosixPath(path).as_posix(), _read_git(rev, path, arg))


def _is_file(arg: str) -> bool:
    """A path, not `REV:PATH` (a file whose name holds a colon is still a file)."""
    return os.path.lexists(arg) or ":" not in arg


def spec_root(arg: str) -> Path:
    """The folder a spec argument's header path is relative to: the root of the
    spec's repository (for `REV:PATH`, of the working directory's, where git reads
    it), else the working directory. `fsmc build` resolves earlier headers against
    it to judge whether their specs still exist."""
    start = Path(os.path.abspath(arg)).parent if _is_file(arg) else Path.cwd()
    return project_root(start) or Path.cwd()


def label(arg: str, path: str) -> str:
    """How a spec is named where two versions of it meet (a migration's header): the
    header `path`, behind its git revision when `arg` read it from one, so that
    `fsmc migrate HEAD~1:specs/job.yaml specs/job.yaml` does not say it migrates
    from specs/job.yaml to specs/job.yaml."""
    return path if _is_file(arg) else f"{arg.partition(':')[0]}:{path}"


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds `.git`, if any."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _header_path(arg: str) -> str:
    """The spec's path as generated headers record it: relative to its repository's
    root (so `fsmc build --check` agrees from any working directory), else to the
    working directory; never absolute."""
    absolute = Path(os.path.abspath(arg))
    base = spec_root(arg)
    try:
        return absolute.relative_to(base).as_posix()
    except ValueError:
        pass
    relative = os.path.relpath(absolute) if absolute.drive == Path.cwd().drive else arg
    if relative.startswith(".."):
        relative = absolute.name if os.path.isabs(arg) else arg
    return PurePosixPath(*relative.split(os.sep)).as_posix()


def _read_file(arg: str) -> bytes:
    try:
        with open(arg, "rb") as f:
            return f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise SourceError(f"{arg}: no such file") from None
    except IsADirectoryError:
        raise SourceError(f"{arg}: is a directory, not a spec file") from None
    except PermissionError:
        raise SourceError(f"{arg}: permission denied") from None
    except OSError as exc:
        raise SourceError(f"{arg}: cannot read: {exc.strerror or exc}") from None


def _read_git(rev: str, path: str, arg: str) -> bytes:
    try:
        done = subprocess.run(
            ["git", "show", "--end-of-options", f"{rev}:{path}"],  # a rev is never an option
            capture_output=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except OSError as exc:
        raise SourceError(f"{arg}: cannot run git: {exc.strerror or exc}") from None
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SourceError(f"{arg}: {reason[-1] if reason else 'git show failed'}")
    return done.stdout
