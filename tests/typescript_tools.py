"""TypeScript for the tests and the benchmarks: one tsc process type-checks and
compiles every generated module and node:test suite it is given, and node runs the
suites it made.

The npm packages (TypeScript, @types/node, @types/pg, pg) are pinned in
`tests/typescript/package-lock.json`; `tests/run.sh` installs them. When they are
missing, `tools()` raises `Missing` with the command to run: the tests fail on it,
never skip. tsc checks under the strictest options a project may set (`strict` and
the checks `@tsconfig/strictest` adds, `erasableSyntaxOnly` for Node's own type
stripping), and emits ES modules beside a `package.json` saying so, with the `.ts` of
relative imports rewritten to `.js` (the suites import `./fsm_<machine>.ts`, which is
what Node 23.6+ runs as it is; the Node of this project may be older).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent / "typescript"
INSTALL = "npm ci --prefix tests/typescript"

COMPILER_OPTIONS = {
    "strict": True,
    "noUncheckedIndexedAccess": True,
    "exactOptionalPropertyTypes": True,
    "noPropertyAccessFromIndexSignature": True,
    "noImplicitOverride": True,
    "noImplicitReturns": True,
    "noFallthroughCasesInSwitch": True,
    "noUnusedLocals": True,
    "noUnusedParameters": True,
    "isolatedModules": True,
    "verbatimModuleSyntax": True,
    "erasableSyntaxOnly": True,
    "module": "nodenext",
    "target": "es2022",
    "types": ["node"],
    "rewriteRelativeImportExtensions": True,
    "rootDir": "src",
    "outDir": "out",
}


class Missing(Exception):
    """The npm packages are not installed."""


def tools() -> Path:
    """The installed node_modules folder."""
    modules = HERE / "node_modules"
    if not (modules / ".bin" / "tsc").exists() or not (modules / "pg").is_dir():
        raise Missing(f"the TypeScript toolchain is not installed: run `{INSTALL}` (tests/run.sh does)")
    return modules


@dataclass(frozen=True)
class Compiled:
    root: Path  # holds src/ (the copies tsc read), out/ (what it wrote) and node_modules
    code: int
    output: str  # tsc's diagnostics, empty when there are none

    def suites(self, *names: str) -> list[Path]:
        """The compiled node:test suites of the folders `names` (all, when none is named)."""
        folders = [self.root / "out" / n for n in names] if names else sorted((self.root / "out").iterdir())
        return sorted(p for folder in folders for p in folder.glob("*.test.js"))


def compile_folders(folders: Mapping[str, Path], root: Path) -> Compiled:
    """Copy each machine folder to `root/src/<name>`, and compile every `.ts` there with
    one tsc process into `root/out/<name>`, where the folder's other files (its `.sql`,
    its Python module) are copied too, as the suites find them beside themselves."""
    modules = tools()
    src = root / "src"
    for name, folder in folders.items():
        shutil.copytree(folder, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "tsconfig.json").write_text(json.dumps({"compilerOptions": COMPILER_OPTIONS, "include": ["src"]}))
    (root / "package.json").write_text(json.dumps({"type": "module", "private": True}))
    (root / "node_modules").symlink_to(modules, target_is_directory=True)
    done = subprocess.run([str(modules / ".bin" / "tsc"), "-p", str(root)], cwd=root, capture_output=True, text=True)
    for name in folders:
        for path in (src / name).iterdir():
            if path.is_file() and path.suffix != ".ts" and (root / "out" / name).is_dir():
                shutil.copy2(path, root / "out" / name / path.name)
    return Compiled(root, done.returncode, (done.stdout + done.stderr).strip())


@dataclass(frozen=True)
class TestRun:
    __test__ = False  # not a test class, whatever pytest makes of the name

    code: int
    output: str  # TAP

    def count(self, what: str) -> int:
        """A count from the run's summary: `pass`, `fail`, `skipped`, `tests`."""
        for line in self.output.splitlines():
            if line.startswith(f"# {what} "):
                return int(line.split()[2])
        raise AssertionError(f"no '# {what}' line in:\n{self.output[-3000:]}")

    def failed(self) -> list[str]:
        """The names of the tests that failed."""
        return [line.split(" - ", 1)[1] for line in self.output.splitlines()
                if line.lstrip().startswith("not ok ") and " - " in line]  # fmt: skip


def node_test(suites: Sequence[Path], env: Mapping[str, str] | None = None, *, timeout: float = 300) -> TestRun:
    """Run `suites` with one `node --test` (two files at a time), reporting TAP."""
    environment = {k: v for k, v in os.environ.items() if k not in ("FSMC_PG_DSN", "FSMC_PYTHON")}
    environment.update(env or {})
    done = subprocess.run(
        ["node", "--test", "--test-concurrency=2", "--test-reporter=tap", *map(str, suites)],
        capture_output=True, text=True, env=environment, timeout=timeout,
    )  # fmt: skip
    return TestRun(done.returncode, done.stdout + done.stderr)
