"""The command line: the only part of fsmc that touches the terminal, output files and
exit codes.

Exit status everywhere: 0 success, 1 the spec has errors (`graph` too, when it
still draws a spec whose names resolve; or, for `build --check`, generated files
are stale; for `diff`, the machines differ), 2 usage or I/O trouble. Input never
produces a traceback: an exception that escapes a stage is our bug, and is
reported as one (exit 3) with a request to file it.
"""

from __future__ import annotations

import argparse
import gc
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from fsmc import __version__
from fsmc.diagnostics import Diagnostic, render

EXIT_OK, EXIT_ERRORS, EXIT_TROUBLE, EXIT_BUG = 0, 1, 2, 3


class Trouble(Exception):
    """Usage or I/O trouble: printed as `fsmc: error: ...`, exit 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _refuse_unknown_command(parser, commands, argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage says which options it takes, not the top level's
        commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_TROUBLE
    # A command is short-lived and allocates many small objects that never form
    # cycles worth collecting: the collector would cost a quarter of a large build.
    collecting = gc.isenabled()
    gc.disable()
    try:
        code: int = args.run(args)
        return code
    except Trouble as exc:
        print(f"fsmc: error: {exc}", file=sys.stderr)
        return EXIT_TROUBLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception:  # our bug, never the user's: say so plainly
        print(
            "fsmc: internal error (a bug in fsmc, not in your spec; please report it):",
            file=sys.stderr,
        )
        traceback.print_exc(limit=-3, file=sys.stderr)
        return EXIT_BUG
    finally:
        if collecting:
            gc.enable()


def _refuse_unknown_command(
    parser: argparse.ArgumentParser, commands: dict[str, argparse.ArgumentParser], argv: list[str]
) -> None:
    """A mistyped command gets a suggestion, as git's does. The top level has no
    option that takes a value, so its first word not starting with `-` is the command."""
    from fsmc.typos import typo_of

    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None or word in commands or "--" in argv[: argv.index(word)]:
        return
    close = typo_of(word, commands)
    hint = f"; did you mean '{close}'?" if close else f" (commands: {', '.join(commands)})"
    parser.error(f"unknown command '{word}'{hint}")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    p = argparse.ArgumentParser(
        prog="fsmc",
        description="Check a state-machine spec, and generate Python, PostgreSQL, "
        "Mermaid and tests that agree with it.",
    )
    p.add_argument("--version", action="version", version=f"fsmc {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    check = sub.add_parser("check", help="validate specs and report diagnostics")
    _spec_args(check)
    check.set_defaults(run=_check)

    build = sub.add_parser("build", help="validate, then generate code for specs")
    _spec_args(build)
    build.add_argument("--out", default="generated", metavar="DIR", help="default: generated/")
    build.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and print a diff if any generated file is stale",
    )
    build.add_argument(
        "--typescript",
        action="store_true",
        help="also generate fsm_<machine>.ts and its node:test suite fsm_<machine>.test.ts",
    )
    build.set_defaults(run=_build)

    graph = sub.add_parser("graph", help="print the state diagram")
    graph.add_argument("spec", metavar="SPEC")
    graph.add_argument("--format", choices=["mermaid", "dot"], default="mermaid")
    graph.set_defaults(run=_graph)

    diff = sub.add_parser("diff", help="compare two versions of a spec")
    diff.add_argument("old", metavar="OLD")
    diff.add_argument("new", metavar="NEW")
    diff.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    diff.set_defaults(run=_diff)

    migrate = sub.add_parser("migrate", help="SQL that upgrades a database from OLD to NEW")
    migrate.add_argument("old", metavar="OLD")
    migrate.add_argument("new", metavar="NEW")
    migrate.add_argument("--out", metavar="FILE", help="write the SQL here instead of stdout")
    migrate.add_argument("--no-transaction", action="store_true",
                         help="leave out BEGIN and COMMIT, to run inside a migration framework's transaction")  # fmt: skip
    migrate.set_defaults(run=_migrate)

    roles = sub.add_parser(
        "roles",
        help="the SQL that provisions an installation's roles: the writer role an "
        "administrator makes before the install, and the application's grants",
    )
    roles.add_argument("spec", metavar="SPEC")
    roles.add_argument("--database", required=True, help="the database the .sql is installed into")
    roles.add_argument("--schema", help="the schema it is installed into (default: the spec's postgres.schema, else public)")
    roles.add_argument("--owner", required=True, help="the role that installs it (owns the schema)")
    roles.add_argument("--app", required=True, metavar="ROLE", help="the role the application connects as")
    roles.set_defaults(run=_roles)

    schema = sub.add_parser("schema", help="print the JSON Schema of the spec language")
    schema.set_defaults(run=_schema)
    return p, dict(sub.choices)


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="+", metavar="SPEC", help="a path, or REV:PATH from git")
    p.add_argument("--format", choices=["text", "json", "github"], default="text")
    p.add_argument("--strict", action="store_true", help="warnings fail too")


def _print_diagnostics(diagnostics: list[Diagnostic], fmt: str, *, data_on_stdout: bool = False) -> None:
    """Diagnostics go to stdout, as mypy's and ruff's do (`fsmc check x.yaml | grep
    trap`); for a command whose stdout is its product (a diagram, a diff, SQL), to
    stderr, so that `fsmc graph x.yaml > x.mmd` stays a valid diagram."""
    (sys.stderr if data_on_stdout else sys.stdout).write(render(diagnostics, fmt))


def _checked(arg: str):  # type: ignore[no-untyped-def]
    from fsmc import pipeline, source

    try:
        return pipeline.check(source.read(arg))
    except source.SourceError as exc:
        raise Trouble(str(exc)) from None


def _check(args: argparse.Namespace) -> int:
    results = [_checked(arg) for arg in args.specs]
    diagnostics = [d for r in results for d in r.diagnostics]
    _print_diagnostics(diagnostics, args.format)
    return EXIT_OK if all(r.ok(strict=args.strict) for r in results) else EXIT_ERRORS


def _build(args: argparse.Namespace) -> int:
    from fsmc import output, source
    from fsmc.pipeline import Checked
    from fsmc.targets import OPTIONAL_SUFFIXES, generate, typescript

    specs = list(dict.fromkeys(args.specs))  # overlapping globs name a spec twice
    results = [_checked(arg) for arg in specs]
    if args.typescript:  # what that target cannot generate is an error of the spec's, for this build
        results = [Checked(r.machine, r.diagnostics + typescript.problems(r.machine)) if r.ok() else r
                   for r in results]  # fmt: skip
    _print_diagnostics([d for r in results for d in r.diagnostics], args.format)
    if not all(r.ok() for r in results):
        print("fsmc: nothing written: the specs have errors", file=sys.stderr)
        return EXIT_ERRORS
    if not all(r.ok(strict=True) for r in results) and args.strict:
        print("fsmc: nothing written: the specs have warnings (--strict)", file=sys.stderr)
        return EXIT_ERRORS
    files: dict[str, str] = {}
    owners: dict[str, str] = {}
    for arg, result in zip(specs, results, strict=True):
        machine = result.machine
        assert machine is not None  # ok() says so
        if machine.name in owners:
            raise Trouble(
                f"{owners[machine.name]} and {arg} both define machine '{machine.name}'"
            )
        owners[machine.name] = arg
        generated = generate(machine, typescript=args.typescript)
        for warning in generated.warnings:
            print(f"fsmc: warning: {warning}", file=sys.stderr)
        files.update(generated.files)
    spec_paths = frozenset(r.machine.path for r in results if r.machine is not None)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise Trouble(f"{out}: not a directory")
    left_alone = () if args.typescript else OPTIONAL_SUFFIXES["typescript"]
    kept = output.not_rebuilt(out, files, left_alone)
    if kept:  # one line: a repository that keeps TypeScript output has it in every folder
        folders = ", ".join(dict.fromkeys((out / rel).parent.as_posix() for rel in kept))
        print(f"fsmc: warning: the TypeScript files in {folders} are left as they were: pass "
              "--typescript to rebuild (or check) them", file=sys.stderr)  # fmt: skip
    roots = [source.spec_root(arg) for arg in specs]
    for folder in output.abandoned(out, files, spec_paths, roots):
        print(
            f"fsmc: warning: {(out / folder).as_posix()} was generated from a spec that no "
            "longer exists; delete it if the machine is gone",
            file=sys.stderr,
        )
    if args.check:
        stale = output.compare(out, files, spec_paths, left_alone)
        if stale.current:
            return EXIT_OK
        # The diff is for people; with --format json or github stdout stays parseable.
        (sys.stdout if args.format == "text" else sys.stderr).write(stale.diff)
        for kind, rels in (("stale", stale.changed), ("missing", stale.missing),
                           ("orphan", stale.orphans)):  # fmt: skip
            for rel in rels:
                shown = (out / rel).as_posix()
                print(f"fsmc: {kind}: {shown}", file=sys.stderr)
                if args.format == "github":  # a pointer in the Actions run, per file
                    print(_stale_annotation(kind, shown))
        print("fsmc: generated files are out of date; run fsmc build", file=sys.stderr)
        return EXIT_ERRORS
    try:
        output.write(out, files, spec_paths, left_alone)
    except OSError as exc:
        raise Trouble(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    return EXIT_OK


_STALE_MESSAGES = {
    "stale": "differs from what fsmc build generates; run fsmc build",
    "missing": "is missing; run fsmc build",
    "orphan": "was generated for a machine the specs no longer define; run fsmc build to remove it",
}


def _stale_annotation(kind: str, path: str) -> str:
    """One GitHub Actions `::error` for a generated file that is not current
    (workflow-command escaping as actions/toolkit does it)."""
    def data(value: str) -> str:
        return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def prop(value: str) -> str:
        return data(value).replace(":", "%3A").replace(",", "%2C")

    message = f"{path} {_STALE_MESSAGES[kind]}"
    return f"::error file={prop(path)},title={prop(f'fsmc build --check: {kind}')}::{data(message)}"


def _graph(args: argparse.Namespace) -> int:
    from fsmc.targets import graph

    result = _checked(args.spec)
    blocking = [d for d in result.diagnostics if d.is_error and d.code in graph.BLOCKING]
    _print_diagnostics(result.diagnostics, "text", data_on_stdout=True)
    if result.machine is None or blocking:
        return EXIT_ERRORS
    sys.stdout.write(graph.render(result.machine, args.format))
    if result.ok():
        return EXIT_OK
    # A spec that breaks a graph rule (a trap, an unreachable state) is still drawn,
    # since the picture shows the problem; but it has errors, and a script running
    # `fsmc graph spec.yaml > spec.mmd` must be able to tell, as from `check`.
    print("fsmc: the spec has errors; the diagram draws it as written", file=sys.stderr)
    return EXIT_ERRORS


def _diff(args: argparse.Namespace) -> int:
    import os

    from fsmc.diff import compare
    from fsmc.diff_render import render as render_diff

    old, new = _checked(args.old), _checked(args.new)
    broken = [(arg, r) for arg, r in ((args.old, old), (args.new, new)) if not r.ok()]
    if broken:
        _print_diagnostics([d for _, r in broken for d in r.diagnostics], "text", data_on_stdout=True)
        names = " and ".join(arg for arg, _ in broken)
        raise Trouble(f"cannot compare: {names} {'has' if len(broken) == 1 else 'have'} errors")
    if old.machine.name != new.machine.name:
        raise Trouble(
            f"{args.old} defines machine '{old.machine.name}' but {args.new} defines "
            f"'{new.machine.name}': diff compares two versions of one machine, and a "
            "renamed machine is a new one (new module, tables and functions)"
        )
    changes = compare(old.machine, new.machine)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    sys.stdout.write(render_diff(changes, args.format, color=color))
    return EXIT_OK if changes.same else EXIT_ERRORS


def _migrate(args: argparse.Namespace) -> int:
    import dataclasses

    from fsmc import migrate, output, source

    old, new = _checked(args.old), _checked(args.new)
    broken = [(arg, r) for arg, r in ((args.old, old), (args.new, new)) if not r.ok()]
    both = [d for _, r in ((args.old, old), (args.new, new)) for d in r.diagnostics]
    _print_diagnostics(both, "text", data_on_stdout=True)
    if broken:
        names = " and ".join(arg for arg, _ in broken)
        print(f"fsmc: nothing written: {names} {'has' if len(broken) == 1 else 'have'} errors",
              file=sys.stderr)  # fmt: skip
        return EXIT_ERRORS
    # The script's header names each spec as `label` does (with its REV:, if any).
    machines = [dataclasses.replace(r.machine, path=source.label(arg, r.machine.path))
                for arg, r in ((args.old, old), (args.new, new))]  # fmt: skip
    try:
        script = migrate.migrate(*machines, transaction=not args.no_transaction)
    except migrate.Unsupported as exc:
        raise Trouble(f"cannot migrate {args.old} to {args.new}: {exc}") from None
    if args.out is None:
        sys.stdout.write(script)
        return EXIT_OK
    path = Path(args.out)
    try:  # written even when empty: a stale script from another pair must not survive
        output.replace_atomically(path, script.encode("utf-8"), path.parent)
    except OSError as exc:
        raise Trouble(f"cannot write {args.out}: {exc.strerror or exc}") from None
    return EXIT_OK


def _roles(args: argparse.Namespace) -> int:
    from fsmc.escape import sql_comment, sql_ident
    from fsmc.targets.common import Paths
    from fsmc.targets.postgres.build import build
    from fsmc.targets.postgres.install import app_grants
    from fsmc.targets.postgres.names import writer_role

    checked = _checked(args.spec)
    _print_diagnostics(checked.diagnostics, "text", data_on_stdout=True)
    if not checked.ok():
        print(f"fsmc: nothing printed: {args.spec} has errors", file=sys.stderr)
        return EXIT_ERRORS
    m = checked.machine
    schema = args.schema or m.postgres.schema
    for option, name in (("--database", args.database), ("--schema", schema), ("--owner", args.owner),
                         ("--app", args.app)):  # fmt: skip
        _sql_name(option, name)
    writer, owner = sql_ident(writer_role(str(m.name), args.database, schema)), sql_ident(args.owner)
    sql_file = Paths.of(m).sql.rsplit("/", 1)[-1]
    if m.postgres.writer_role:
        administrator = [
            "-- 1. An administrator, before the install (an owner that may create roles does this itself):",
            f"CREATE ROLE {writer} NOLOGIN;",
            f"GRANT {writer} TO {owner};",
        ]
    else:
        administrator = ["-- 1. Nothing: postgres.writer_role is false, so no role is made or needed"
                         " (every write is checked)."]  # fmt: skip
    # The names the user gave reach the comments escaped (a line break would end one).
    lines = [
        f"-- The {m.name} machine in schema {sql_comment(schema)} of database {sql_comment(args.database)}: its roles.",
        *administrator,
        f"-- 2. {sql_comment(args.owner)} installs it: PGOPTIONS='-c search_path={sql_comment(schema)}'"
        f" psql -v ON_ERROR_STOP=1 -1 -f {sql_file}",
        f"-- 3. {sql_comment(args.owner)} grants the application's role what it needs, and nothing more:",
        *app_grants(build(m).install, schema, args.app),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def _sql_name(option: str, name: str) -> None:
    """Refuse (exit 2) a name PostgreSQL cannot hold as given: it cuts a name past 63
    bytes short (two installations could then share one), and holds no empty one or
    NUL."""
    from fsmc.escape import SQL_NAME_MAX

    if not name or "\x00" in name:
        raise Trouble(f"{option}: {name!r} is not a name PostgreSQL can hold (empty, or with a NUL)")
    if len(name.encode()) > SQL_NAME_MAX:
        raise Trouble(
            f"{option}: {name!r} is {len(name.encode())} bytes; PostgreSQL names hold at most "
            f"{SQL_NAME_MAX} (it would cut this one short)"
        )


def _schema(args: argparse.Namespace) -> int:
    from fsmc.shape import schema_text

    sys.stdout.write(schema_text())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
