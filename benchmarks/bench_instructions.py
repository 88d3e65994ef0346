"""Instructions per transition, counted by valgrind: where `job_apply`'s cost goes (issue 13).

Run: `python benchmarks/bench_instructions.py [--transactions N] [--top K] [--only
SCENARIO ...] [--writer-role]`. Needs valgrind, PostgreSQL's server binaries
(`$FSMC_PG_BINDIR`, else `pg_config --bindir`, else the newest
/usr/lib/postgresql/*/bin) and pgbench. Takes about a quarter of an hour for every
scenario (`--only` runs some: `python benchmarks/bench_instructions.py --only
job_apply limits timed_claim`; `--writer-role` runs only job_apply, with its writer
role and without one); nothing here touches the PostgreSQL on $FSMC_PG_DSN.

The scenarios (`SCENARIOS`): `job_apply` as built, `function`, `raw` and `seed` (the
same move by hand, as bench_db.py has them), `heartbeat`, `ablations` (job_apply on
bench_enforcement.py's copies, each without one piece), `limits` (issue 22: a move
into a limited state, by `_apply` and by `_claim`, beside the same moves without the
limit) and `timed_claim` (issue 21: a claim of a timed event over 100,000 rows, most
of them not due, per claimed row, and the plan of its statement). The profile of
where job_apply's instructions go needs `job_apply` and `function`.

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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_db  # noqa: E402
import bench_enforcement  # noqa: E402
import bench_limits  # noqa: E402
import psycopg  # noqa: E402
from psycopg import conninfo  # noqa: E402

from fsmc.model import Machine  # noqa: E402
from fsmc.targets.postgres.names import Names  # noqa: E402

PATHS = (("as built", "apply"), ("unchecked function", "function"), ("raw statement", "raw"),
         ("seed's path", "seed"))  # fmt: skip
HEARTBEAT = "heartbeat"  # a worker's heartbeat, job_heartbeat on a claimed row (issue 19: unchanged)
SCENARIOS = ("job_apply", "function", "raw", "seed", HEARTBEAT, "ablations", "limits", "timed_claim")
METHOD_OF = {"job_apply": "apply", "function": "function", "raw": "raw", "seed": "seed"}
LIMITS_POOL = 64  # rows the limits scenario's moves cycle through (limit 50: never refused)
NOT_DUE = 100_000  # the timed claim's scheduled rows due in 2100
CLAIMED = 10  # rows each timed claim takes
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
    # The postmaster's callgrind file, made when it starts and written when it stops.
    resident: frozenset[Path] = frozenset()

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
                self.resident = frozenset(f for f in self.counts.glob("cg.*") if f.stat().st_size == 0)
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


def quiesce(cluster: Cluster) -> None:
    """Until no other client backend runs and every callgrind file is whole, and none
    has appeared for a second: a backend that has just closed (an install's, a
    VACUUM's) writes its count as it exits, and must not be taken for a pgbench run's."""
    deadline = time.monotonic() + 120
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        me = conn.info.backend_pid
        others = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        while (row := conn.execute(others.encode()).fetchone()) is not None and row[0] > 0:
            if time.monotonic() > deadline:
                raise SystemExit("client backends still running after 2 minutes")
            time.sleep(0.2)
    wait_for(cluster.counts / f"cg.{me}")
    seen: set[Path] = set()
    steady = 0
    while steady < 5:
        files = set(cluster.counts.glob("cg.*")) - cluster.resident
        steady = steady + 1 if files == seen and all(_complete(f) for f in files) else 0
        seen = files
        if time.monotonic() > deadline:
            raise SystemExit("callgrind files still being written after 2 minutes")
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
        return self.pgbench_backend(schema, script, transactions, base)

    def pgbench_backend(self, schema: str, script: Path, transactions: int, base: int = 0, start: int = 0) -> Path:
        """Run `script` `transactions` times in one pgbench client, as the application
        role of `schema` (`-D n=<start> -D base=<base>`); the callgrind file of its
        backend. A failed statement fails the run: nothing is counted that did not happen."""
        target = conninfo.make_conninfo(self.cluster.dsn, user=bench_db.app_of(schema),
                                        options=bench_db.options(schema))  # fmt: skip
        quiesce(self.cluster)
        before = set(self.cluster.counts.glob("cg.*"))
        ran = subprocess.run([self.pgbench, "-n", "-M", "prepared", "-t", str(transactions), "-c", "1",
                              "-D", f"n={start}", "-D", f"base={base}", "-f", str(script), target],
                             capture_output=True, text=True, check=False)  # fmt: skip
        if ran.returncode != 0:
            raise SystemExit(f"pgbench {script.name} failed:\n{ran.stdout}{ran.stderr}")
        return new_backend(self.cluster.counts, before)

    def per_transition(self, schema: str, method: str, n: int) -> tuple[float, Path, Path]:
        short, long = self.backend_of(schema, method, n), self.backend_of(schema, method, 6 * n)
        return (total(long) - total(short)) / (5 * n), short, long

    def per_run(self, schema: str, script: Path, n: int, before_each: str = "") -> float:
        """Instructions per transaction of `script`: runs of n and 6n, the difference
        over 5n. The second run's counter `n` goes on from the first's end. `before_each`,
        SQL the superuser runs in `schema` before each run."""
        files = []
        for start, transactions in ((0, n), (n, 6 * n)):
            if before_each:
                with psycopg.connect(self.cluster.dsn, autocommit=True, options=f"-c search_path={schema}") as admin:
                    admin.execute(before_each.encode())
                    pid = admin.info.backend_pid
                wait_for(self.cluster.counts / f"cg.{pid}")
            files.append(self.pgbench_backend(schema, script, transactions, start=start))
        return (total(files[1]) - total(files[0])) / (5 * n)


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
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), metavar="SCENARIO",
                        help=f"run only these scenarios, of: {', '.join(SCENARIOS)}")  # fmt: skip
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
            job_paths = [s for s in args.only if s in (*METHOD_OF, HEARTBEAT, "ablations")]
            variants = dict(bench_enforcement.VARIANTS) if "ablations" in args.only else {"as built": []}
            schemas = {name: f"fsmc_ins_{i}" for i, name in enumerate(variants)}
            for name, statements in variants.items() if job_paths else ():
                bench_db.setup(cluster.dsn, schemas[name], bench_db.JOB)
                with psycopg.connect(cluster.dsn, autocommit=True) as conn:
                    conn.execute(f"SET search_path TO {schemas[name]}")
                    for statement in statements:
                        conn.execute(statement.encode())
            if job_paths:
                report(runner, schemas, args)
            if "limits" in args.only:
                report_limits(runner, args.transactions)
            if "timed_claim" in args.only:
                report_timed_claim(runner, args.transactions)
        finally:
            server.terminate()
            server.wait(timeout=300)
    return 0


def report(runner: Runner, schemas: dict[str, str], args: argparse.Namespace) -> None:
    n = args.transactions
    per: dict[str, float] = {}
    files: dict[str, tuple[Path, Path]] = {}
    paths = [(label, method) for label, method in PATHS
             if method in (METHOD_OF[s] for s in args.only if s in METHOD_OF)]  # fmt: skip
    for label, method in paths:
        per[label], short, long = runner.per_transition(schemas["as built"], method, n)
        files[label] = (short, long)
    if paths:
        print(f"{'path':<24}{'instructions/transition':>26}{'job_apply / path':>20}")
    for label, _ in paths:
        ratio = f"{per['as built'] / per[label]:>19.2f}x" if "as built" in per else ""
        print(f"{label:<24}{per[label]:>26,.0f}{ratio}")

    if HEARTBEAT in args.only:
        beat, _, _ = runner.per_transition(schemas["as built"], HEARTBEAT, n)
        print(f"{'a heartbeat':<24}{beat:>26,.0f}   (job_heartbeat on a claimed row)")

    if "ablations" in args.only:
        built = per["as built"] if "as built" in per else runner.per_transition(schemas["as built"], "apply", n)[0]
        print(f"\n{'job_apply with a piece taken out':<40}{'instructions':>14}{'saves':>12}")
        for name in bench_enforcement.VARIANTS:
            if name == "as built":
                continue
            count, _, _ = runner.per_transition(schemas[name], "apply", n)
            saved = built - count
            print(f"{name:<40}{count:>14,.0f}{saved:>12,.0f}{saved / built:>6.0%}")

    if "as built" not in files or "unchecked function" not in files:
        return  # the profile sets job_apply beside the unchecked function
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
def report_limits(runner: Runner, n: int) -> None:
    """Issue 22: bench_limits.py's machine (queued -> running -> queued) with `limits:
    {running: 50}` beside the same spec without it, each installed as the README says.
    One pgbench client cycles LIMITS_POOL rows: by `_apply` (transaction n starts row
    n / 2 % K, then n + 1 requeues it, each its own transaction), and by
    `_claim('start', max_rows => 1)` then `_apply` requeue; at most one row is ever in
    running, so nothing is refused, and a failed call fails the run; a call that moved
    nothing (NULL: a wrong version) would leave the versions short of the moves, which
    are checked. Per transition: each cycle enters running once and leaves it once."""
    schemas = {"limited": "fsmc_ins_limited", "unlimited": "fsmc_ins_unlimited"}
    lim = Names.of(bench_limits.machine(True)).sql
    k = LIMITS_POOL
    scripts = {
        "apply": (f"\\set row :n / 2 % {k} + 1\n\\set v :n / {2 * k} * 2 + :n % 2\n\\if :n % 2 = 0\n"
                  f"SELECT {lim.apply}(:row, 'start', :v, 'bench');\n\\else\n"
                  f"SELECT {lim.apply}(:row, 'requeue', :v, 'bench');\n\\endif\n\\set n :n + 1\n", 1),
        "claim": (f"SELECT id, state_version FROM {lim.claim}('start', 'bench', 1) \\gset\n"
                  f"SELECT {lim.apply}(:id, 'requeue', :state_version, 'bench');\n", 2),
    }  # fmt: skip
    counts: dict[tuple[str, str], float] = {}
    moved = 0  # the moves made so far in each schema: the sum of its rows' versions
    for name, schema in schemas.items():
        bench_db.install(runner.cluster.dsn, schema, bench_limits.machine(name == "limited"))
        with psycopg.connect(runner.cluster.dsn, autocommit=True, options=f"-c search_path={schema}") as admin:
            admin.execute(f"INSERT INTO {lim.table} (id) SELECT i FROM generate_series(1, {k}) AS i".encode())
    for method, (text, moves) in scripts.items():
        script = runner.folder / f"limits_{method}.sql"
        script.write_text(text, encoding="utf-8")
        moved += 7 * n * moves
        for name, schema in schemas.items():
            # Each run from a vacuumed table, as autovacuum would keep it (it is off here).
            counts[method, name] = runner.per_run(schema, script, n, "VACUUM ANALYZE") / moves
            with psycopg.connect(runner.cluster.dsn, options=f"-c search_path={schema}") as admin:
                versions = admin.execute(f"SELECT sum(state_version) FROM {lim.table}".encode()).fetchone()
            if versions is None or versions[0] != moved:
                raise SystemExit(f"limits {method} in {schema}: {moved} moves, but the versions add up to {versions}")
    print("\nA move into a limited state (issue 22), instructions per transition, each cycle"
          " entering running and leaving it; limit 50 on running, one row at a time in it:")  # fmt: skip
    print(f"  {'':<42}{'limited':>10}{'unlimited':>11}{'limited / unlimited':>21}")
    for method, label in (("apply", "_apply start, _apply requeue"),
                          ("claim", "_claim start (max_rows 1), _apply requeue")):  # fmt: skip
        limited, unlimited = counts[method, "limited"], counts[method, "unlimited"]
        print(f"  {label:<42}{limited:>10,.0f}{unlimited:>11,.0f}{limited / unlimited:>20.3f}x")


def report_timed_claim(runner: Runner, n: int) -> None:
    """Issue 21: `queue_claim('schedule', ..., 10)` of specs/queue.yaml over NOT_DUE
    scheduled rows due in 2100 and as many due ones as the runs claim, in instructions
    per claimed row, and the plan of its statement (auto_explain): the due index, read
    from its due end. The rows are written with the triggers off (session_replication_role,
    a superuser's), as the guard would write them, so that loading them under valgrind
    takes seconds. Each run starts from a vacuumed table: a claimed row leaves the due
    index, and its dead entry stays at the index's due end until a vacuum, so within a
    run each claim steps past those of the claims before it. That is why this scenario
    runs a tenth of the transactions of the others (at least 20): fewer entries to step
    past, and the counts are exact whatever their number."""
    calls = max(20, n // 10)
    schema = "fsmc_ins_queue"
    machine = bench_db.machine_of_spec("queue")
    q = Names.of(machine).sql
    bench_db.install(runner.cluster.dsn, schema, machine)
    due = 7 * calls * CLAIMED  # the runs of calls and 6 * calls claims
    with psycopg.connect(runner.cluster.dsn, autocommit=True, options=f"-c search_path={schema}") as admin:
        admin.execute(b"SET session_replication_role = replica")
        admin.execute(f"INSERT INTO {q.table} (state, due_at) SELECT 'scheduled', timestamptz '2100-01-01'"
                      f" FROM generate_series(1, {NOT_DUE})".encode())  # fmt: skip
        admin.execute(f"INSERT INTO {q.table} (state, due_at)"
                      f" SELECT 'scheduled', now() - interval '1 day' + i * interval '1 ms'"
                      f" FROM generate_series(1, {due}) AS i".encode())  # fmt: skip
        admin.execute(b"SET session_replication_role = origin")
        admin.execute(b"VACUUM ANALYZE")
        plan = nested_plan(admin, f"SELECT count(*) FROM {q.claim}('schedule', 'bench', {CLAIMED})")
    if f"Index Scan using {q.due_index} on {q.table}" not in plan:
        raise SystemExit(f"the timed claim does not read {q.due_index}:\n{plan}")
    script = runner.folder / "timed_claim.sql"
    # 1 / 0 (an error, failing the run) unless the claim took CLAIMED rows.
    script.write_text(f"SELECT 1 / (count(*) = {CLAIMED})::int FROM {q.claim}('schedule', 'bench', {CLAIMED});\n",
                      encoding="utf-8")  # fmt: skip
    per_call = runner.per_run(schema, script, calls, "VACUUM ANALYZE")
    print(f"\nA claim of a timed event (issue 21): {q.claim}('schedule', 'bench', {CLAIMED}) over {NOT_DUE:,}"
          f" scheduled rows not due and {due:,} due, {calls} and {6 * calls} claims:"
          f" {per_call:,.0f} instructions per claim, {per_call / CLAIMED:,.0f} per claimed row")  # fmt: skip
    print("The plan of its statement (auto_explain, costs left out, long lines cut):")
    for line in plan_lines(plan):
        print(f"  {line}")


def plan_lines(plan: str, width: int = 100) -> list[str]:
    """An auto_explain plan's nodes, conditions and filters, without the query's text
    (it comes first) and the costs."""
    lines = plan.splitlines()
    start = next((i for i, line in enumerate(lines) if "(cost=" in line and not line.startswith(" ")), 0)
    kept = [re.sub(r"  \(cost=[^)]*\)", "", line) for line in lines[start:]]
    return [line if len(line) <= width else line[: width - 3] + "..." for line in kept if line.strip()]


def nested_plan(admin: psycopg.Connection[Any], query: str) -> str:
    """The plan of the statement `query` runs inside its function that reads the
    machine's table (auto_explain, as a notice), in a transaction rolled back."""
    notices: list[str] = []
    admin.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    admin.execute(b"LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice", "auto_explain.log_format = text"):  # fmt: skip
        admin.execute(f"SET {setting}".encode())
    with admin.transaction(force_rollback=True):
        admin.execute(query.encode())
    admin.execute(b"SET auto_explain.log_min_duration = -1")
    plans = [n for n in notices if "LockRows" in n]
    return plans[0] if plans else "\n".join(notices)


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
