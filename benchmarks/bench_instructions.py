"""Instructions per transition, counted by valgrind: where `job_apply`'s cost goes (issue 13).

Run: `python benchmarks/bench_instructions.py [--transactions N] [--top K]
[--writer-role]`. Needs
valgrind, PostgreSQL's server binaries (`$FSMC_PG_BINDIR`, else `pg_config
--bindir`, else the newest /usr/lib/postgresql/*/bin) and pgbench. Takes a few
minutes; nothing here touches the PostgreSQL on $FSMC_PG_DSN.

The timed benchmarks (bench_db.py, bench_enforcement.py) measure what users feel, but
on a shared two-core machine their rounds spread by 10% or more, and a piece of
enforcement that costs 3% drowns in that. Counting instructions does not drift: the
same binary doing the same work counts the same, whatever else the machine does.

A scratch cluster (initdb in a temporary folder, its own socket, no TCP, autovacuum
off so that nothing replans behind a session's back) runs under `valgrind
--tool=callgrind --trace-children=yes`: every backend writes its own count when it
exits. Each schema is installed as bench_db.py installs one (non-superuser owner,
the application role with the README's grants, the writer role); the ablated
copies are bench_enforcement.py's. For each path, pgbench (-M prepared, one client,
bench_db.py's script, fresh rows) runs twice, with N and with 6N transactions, each
run a new backend; instructions per transition are the difference of the two
backends' totals over 5N, which cancels connecting, authenticating and warming the
caches. The same difference, function by function (callgrind_annotate, inclusive),
is the profile printed for `job_apply` as built.

`--writer-role` measures only `job_apply`, as built with its writer role beside built
with `postgres.writer_role: false` (issue 23: no role, every write checked, the
functions' own included), and the unchecked function, in one cluster: the cost of
installing where nobody can create a role, with the same profile lines for both.

Instructions are not time: a cache miss or a system call (the commit's fdatasync)
costs the same count whatever it waits for. The figures say what the server's CPU
is asked to do, which is what enforcement adds; the timed benchmarks say what that
is worth on a given machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_db  # noqa: E402
import bench_enforcement  # noqa: E402
import psycopg  # noqa: E402
from psycopg import conninfo  # noqa: E402

from fsmc.model import Machine  # noqa: E402

PATHS = (("as built", "apply"), ("unchecked function", "function"), ("raw statement", "raw"),
         ("seed's path", "seed"))  # fmt: skip
HEARTBEAT = "heartbeat"  # a worker's heartbeat, job_heartbeat on a claimed row (issue 19: unchanged)
# Functions whose inclusive count says what a piece of enforcement or of the call costs.
SPOTLIGHT = (  # functions PostgreSQL exports, so that a stripped binary names them too
    ("PortalRun", "the statement, SELECT job_apply(...) (the rest is protocol and commit)"),
    ("plpgsql_exec_function", "the PL/pgSQL function, everything in it"),
    ("ExecConstraints", "NOT NULL and the tables' CHECKs, read back and prepared per statement"),
    ("stringToNode", "CHECKs' and WHEN clauses' text parsed back into trees"),
    ("ExecARUpdateTriggers", "AFTER UPDATE triggers: WHEN clauses, events queued"),
    ("ExecARInsertTriggers", "AFTER INSERT triggers: WHEN clauses, events queued"),
    ("AfterTriggerFireDeferred", "commit-time (deferred) triggers run"),
    ("fmgr_security_definer", "SECURITY DEFINER and SET clauses, around the call"),
    ("ProcessGUCArray", "the SET clauses, applied on entry"),
    ("AtEOXact_GUC", "settings put back on exit and at commit"),
    ("CommitTransactionCommand", "commit (the WAL flush's wait is not counted)"),
)


def bindir() -> Path:
    """Where `postgres` and `initdb` are."""
    if os.environ.get("FSMC_PG_BINDIR"):
        return Path(os.environ["FSMC_PG_BINDIR"])
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "postgres").exists():
            return Path(out)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    if not candidates:
        raise SystemExit("no PostgreSQL server binaries: set FSMC_PG_BINDIR")
    return Path(candidates[-1])


@dataclass
class Cluster:
    """A scratch cluster under callgrind; `as_owner` runs a command as the data
    folder's owner (initdb and postgres refuse root)."""

    folder: Path
    bin: Path
    port: int = 5499

    @property
    def counts(self) -> Path:
        return self.folder / "counts"

    @property
    def dsn(self) -> str:
        return f"host={self.folder} port={self.port} user=postgres dbname=postgres"

    def as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def start(self) -> subprocess.Popen[bytes]:
        data = self.folder / "data"
        self.counts.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
            shutil.chown(self.counts, "postgres")
        subprocess.run(self.as_owner([str(self.bin / "initdb"), "-D", str(data), "-U", "postgres",
                                      "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"]),
                       check=True, capture_output=True)  # fmt: skip
        server = subprocess.Popen(self.as_owner([
            "valgrind", "--tool=callgrind", "--trace-children=yes", "--dump-instr=no",
            f"--callgrind-out-file={self.counts}/cg.%p",
            str(self.bin / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.folder),
            "-c", "listen_addresses=", "-c", "autovacuum=off", "-c", "shared_buffers=128MB",
        ]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        for _ in range(600):
            with contextlib.suppress(psycopg.OperationalError):
                psycopg.connect(self.dsn, connect_timeout=5).close()
                return server
            if server.poll() is not None:
                raise SystemExit("the scratch cluster did not start under valgrind")
            time.sleep(0.5)
        raise SystemExit("the scratch cluster did not accept connections in 5 minutes")


def total(file: Path) -> int:
    """The instructions one backend executed, from its callgrind file."""
    for line in reversed(file.read_text(errors="replace").splitlines()):
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise SystemExit(f"{file}: no totals line")


def new_backend(counts: Path, before: set[Path]) -> Path:
    """The callgrind file of the backend a pgbench run used: of the files that appeared
    since `before` (pgbench's own first connection may make one too), the largest, once
    they are written whole."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        fresh = [p for p in counts.glob("cg.*") if p not in before]
        if fresh and all(_complete(p) for p in fresh):
            time.sleep(1)  # pgbench's first connection may still be writing its file
            fresh = [p for p in counts.glob("cg.*") if p not in before]
            if not all(_complete(p) for p in fresh):
                continue
            return max(fresh, key=total)
        time.sleep(0.5)
    raise SystemExit("a backend's callgrind file did not appear within 2 minutes")


def wait_for(file: Path) -> None:
    """Until an exited backend's callgrind file is written whole."""
    deadline = time.monotonic() + 120
    while not _complete(file):
        if time.monotonic() > deadline:
            raise SystemExit(f"{file} was not written within 2 minutes")
        time.sleep(0.2)


def _complete(file: Path) -> bool:
    with contextlib.suppress(OSError):
        return "\ntotals:" in file.read_text(errors="replace")[-4096:]
    return False


@dataclass
class Runner:
    cluster: Cluster
    folder: Path
    pgbench: str
    next_row: int = bench_db.FIRST_PGBENCH_ROW

    def backend_of(self, schema: str, method: str, transactions: int) -> Path:
        """Run `transactions` of `method` in one pgbench client on fresh rows; the
        callgrind file of its backend. `heartbeat`: each transaction refreshes the
        heartbeat of one of K rows claimed beforehand (`job_heartbeat`, at version 1)."""
        table = "jobs" if method in ("apply", HEARTBEAT) else "jobs_bare"
        base, self.next_row = self.next_row, self.next_row + bench_db.ROWS_PER_CONNECTION
        last = base + bench_db.ROWS_PER_CONNECTION - 1
        with psycopg.connect(self.cluster.dsn, autocommit=True, options=f"-c search_path={schema}") as admin:
            admin.execute(f"INSERT INTO {table} (id) SELECT {bench_db.row_id('i')} FROM generate_series"
                          f"({base}, {last}) AS i")  # fmt: skip
            if method == HEARTBEAT:
                admin.execute(f"SELECT job_apply({bench_db.row_id('i')}, 'claim', 0, 'bench')"
                              f" FROM generate_series({base}, {last}) AS i")  # fmt: skip
            admin.execute(f"ANALYZE {table}")
            pid = admin.info.backend_pid
        wait_for(self.cluster.counts / f"cg.{pid}")  # so that it is not taken for pgbench's
        script = self.folder / f"{method}.sql"
        if method == HEARTBEAT:
            k = bench_db.ROWS_PER_CONNECTION
            script.write_text(f"\\set row :base + :client_id * {k} + :n % {k}\n"
                              f"SELECT job_heartbeat({bench_db.row_id(':row')}, 1);\n\\set n :n + 1\n",
                              encoding="utf-8")  # fmt: skip
        else:
            script.write_text(bench_db.pgbench_script(method), encoding="utf-8")
        target = conninfo.make_conninfo(self.cluster.dsn, user=bench_db.app_of(schema),
                                        options=bench_db.options(schema))  # fmt: skip
        before = set(self.cluster.counts.glob("cg.*"))
        subprocess.run([self.pgbench, "-n", "-M", "prepared", "-t", str(transactions), "-c", "1",
                        "-D", "n=0", "-D", f"base={base}", "-f", str(script), target],
                       check=True, capture_output=True)  # fmt: skip
        return new_backend(self.cluster.counts, before)

    def per_transition(self, schema: str, method: str, n: int) -> tuple[float, Path, Path]:
        short, long = self.backend_of(schema, method, n), self.backend_of(schema, method, 6 * n)
        return (total(long) - total(short)) / (5 * n), short, long


def per_function(file: Path, *, inclusive: bool) -> dict[str, int]:
    """Each function's instruction count in one callgrind file: inclusive (with what
    it calls) or its own."""
    out = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                          "--threshold=100", str(file)], capture_output=True, text=True, check=True).stdout  # fmt: skip
    counts: dict[str, int] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(?:\S*:)?(\S+?)(?:\s+\[.*\])?$", line)
        if m:
            name = m.group(2)
            counts[name] = counts.get(name, 0) + int(m.group(1).replace(",", ""))
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=200,
                        help="N: each path runs N and 6N transactions")  # fmt: skip
    parser.add_argument("--top", type=int, default=12, help="functions of the profile to print")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="copy the callgrind files of job_apply's two runs here (for callgrind_annotate)")
    parser.add_argument("--writer-role", action="store_true",
                        help="only job_apply, with its writer role and without one (postgres.writer_role: false)")
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH (Debian: apt install valgrind)")
    pgbench = bench_db.pgbench_or_exit()

    with scratch_folder() as folder:
        cluster = Cluster(folder, bindir())
        server = cluster.start()
        try:
            with psycopg.connect(cluster.dsn) as conn:
                version = conn.execute("SHOW server_version").fetchone()
            print(f"PostgreSQL {version[0] if version else '?'} under valgrind {_valgrind_version()};"
                  f" {bench_db.machine_line()}; {args.transactions} and {6 * args.transactions}"
                  f" transactions per path, one pgbench client, synchronous_commit=on\n")  # fmt: skip
            runner = Runner(cluster, folder, pgbench)
            if args.writer_role:
                modes = {label: f"fsmc_ins_{i}" for i, label in enumerate(MODES)}
                for label, machine in MODES.items():
                    bench_db.setup(cluster.dsn, modes[label], machine)
                report_modes(runner, modes, args)
                return 0
            variants = dict(bench_enforcement.VARIANTS)
            schemas = {name: f"fsmc_ins_{i}" for i, name in enumerate(variants)}
            for name, statements in variants.items():
                bench_db.setup(cluster.dsn, schemas[name], bench_db.JOB)
                with psycopg.connect(cluster.dsn, autocommit=True) as conn:
                    conn.execute(f"SET search_path TO {schemas[name]}")
                    for statement in statements:
                        conn.execute(statement.encode())
            report(runner, schemas, args)
        finally:
            server.terminate()
            server.wait(timeout=300)
    return 0


def report(runner: Runner, schemas: dict[str, str], args: argparse.Namespace) -> None:
    n = args.transactions
    per: dict[str, float] = {}
    files: dict[str, tuple[Path, Path]] = {}
    for label, method in PATHS:
        per[label], short, long = runner.per_transition(schemas["as built"], method, n)
        files[label] = (short, long)
    print(f"{'path':<24}{'instructions/transition':>26}{'job_apply / path':>20}")
    for label, _ in PATHS:
        print(f"{label:<24}{per[label]:>26,.0f}{per['as built'] / per[label]:>19.2f}x")

    beat, _, _ = runner.per_transition(schemas["as built"], HEARTBEAT, n)
    print(f"{'a heartbeat':<24}{beat:>26,.0f}   (job_heartbeat on a claimed row)")

    print(f"\n{'job_apply with a piece taken out':<40}{'instructions':>14}{'saves':>12}")
    for name in bench_enforcement.VARIANTS:
        if name == "as built":
            continue
        count, _, _ = runner.per_transition(schemas[name], "apply", n)
        saved = per["as built"] - count
        print(f"{name:<40}{count:>14,.0f}{saved:>12,.0f}{saved / per['as built']:>6.0%}")

    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for label, (a, b) in files.items():
            for run, file in (("short", a), ("long", b)):
                shutil.copy(file, args.keep / f"{label.replace(' ', '_').replace(chr(39), '')}.{run}.callgrind")
    few, many = (per_function(f, inclusive=True) for f in files["as built"])
    floor_few, floor_many = (per_function(f, inclusive=True) for f in files["unchecked function"])
    print(f"\nWhere job_apply's instructions go, per transition (inclusive, {5 * n} transitions;"
          f" beside it the unchecked function's):")  # fmt: skip
    for name, what in SPOTLIGHT:
        mine = (many.get(name, 0) - few.get(name, 0)) / (5 * n)
        floor = (floor_many.get(name, 0) - floor_few.get(name, 0)) / (5 * n)
        print(f"  {name:<26}{mine:>10,.0f}{floor:>10,.0f}  {what}")
    few, many = (per_function(f, inclusive=False) for f in files["as built"])
    own = {name: (many.get(name, 0) - few.get(name, 0)) / (5 * n) for name in many}
    top = sorted(own.items(), key=lambda kv: kv[1], reverse=True)[: args.top]
    print(f"\nThe {args.top} functions with the most instructions of their own, per transition"
          " (a hex address is a function the binary does not export):")  # fmt: skip
    for name, count in top:
        print(f"  {name:<40}{count:>10,.0f}{count / per['as built']:>6.1%}")


def without_writer_role(machine: Machine) -> Machine:
    """`machine` as if its spec said `postgres: {writer_role: false}`."""
    return dataclasses.replace(machine, postgres=dataclasses.replace(machine.postgres, writer_role=False))


# --writer-role: job_apply installed each way (the owner bench_db makes may create roles;
# without a writer role it makes none).
MODES: dict[str, Machine] = {"writer role": bench_db.JOB, "no writer role": without_writer_role(bench_db.JOB)}


def report_modes(runner: Runner, schemas: dict[str, str], args: argparse.Namespace) -> None:
    """job_apply with its writer role and without, the unchecked function as the floor,
    and where each spends its instructions (SPOTLIGHT)."""
    n = args.transactions
    per: dict[str, float] = {}
    files: dict[str, tuple[Path, Path]] = {}
    runs = [(f"job_apply, {label}", schemas[label], "apply") for label in MODES]
    runs.append(("unchecked function", schemas["writer role"], "function"))
    runs += [(f"a heartbeat, {label}", schemas[label], HEARTBEAT) for label in MODES]
    for label, schema, method in runs:
        per[label], short, long = runner.per_transition(schema, method, n)
        files[label] = (short, long)
    base = per["job_apply, writer role"]
    print(f"{'path':<32}{'instructions/transition':>26}{'vs writer role':>16}{'/ unchecked':>13}")
    for label, _, method in runs:
        if method == HEARTBEAT:
            print(f"{label:<32}{per[label]:>26,.0f}{per[label] / per['a heartbeat, writer role'] - 1:>+15.1%}")
            continue
        print(f"{label:<32}{per[label]:>26,.0f}{per[label] / base - 1:>+15.1%}"
              f"{per[label] / per['unchecked function']:>12.2f}x")  # fmt: skip
    moves = [label for label, _, method in runs if method != HEARTBEAT]
    counts = {label: tuple(per_function(f, inclusive=True) for f in files[label]) for label in moves}
    print(f"\nWhere they go, per transition (inclusive, {5 * n} transitions): " + ", ".join(moves))
    for name, what in SPOTLIGHT:
        each = [(many.get(name, 0) - few.get(name, 0)) / (5 * n) for few, many in counts.values()]
        print(f"  {name:<26}" + "".join(f"{v:>10,.0f}" for v in each) + f"  {what}")


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    """A folder the cluster's owner can write (a short path: the socket's name must fit)."""
    folder = Path(tempfile.mkdtemp(prefix="fsmc_ins_", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _valgrind_version() -> str:
    return subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
