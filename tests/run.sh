#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, then runs pytest.
# Usage: bash tests/run.sh [pytest args...]
#        bash tests/run.sh --fast [pytest args...]   the core stages only (tests/README.md)
# Database tests use FSMC_PG_DSN (e.g. postgresql://postgres@127.0.0.1:5432/postgres);
# .ci/run sets it and requires them, so in CI they never skip.
set -euo pipefail
cd "$(dirname "$0")/.."

fast=
if [ "${1:-}" = "--fast" ]; then
    fast=1
    shift
fi

# The npm packages install in the background, beside pip: real Mermaid, and the
# TypeScript toolchain that checks and runs the generated TypeScript (tests/typescript:
# typescript, @types/node, @types/pg, pg). The fast path runs neither, so it installs none.
npm_pids=()
for folder in tests/mermaid tests/typescript; do
    if [ -z "$fast" ] && { [ ! -d "$folder/node_modules" ] || [ "$folder/package-lock.json" -nt "$folder/node_modules" ]; }; then
        npm ci --prefix "$folder" --no-audit --no-fund --loglevel=error &
        npm_pids+=($!)
    fi
done

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# Python packages, once per pyproject.toml (the stamp is the copy installed from):
# pip takes seconds even when nothing is missing. --no-compile: bytecode is written
# for the modules the tests import, when they first do, not for all of mypy and co.
stamp=.venv/fsmc-installed-pyproject.toml
if ! cmp -s pyproject.toml "$stamp"; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -e '.[test]'
    cp pyproject.toml "$stamp"
fi

for pid in ${npm_pids[@]+"${npm_pids[@]}"}; do
    wait "$pid"
done
export PATH="$PWD/.venv/bin:$PATH"
# Bytecode, written once and read by every Python process of the run, in the test
# environment rather than beside the sources: the suite starts about a hundred Python
# processes (fsmc builds, generated suites, pre-commit, the xdist workers), and
# without a cache each compiles fsmc, jinja2, psycopg and pytest from source again
# (a second of CPU an `fsmc build`; the crash-safety test's 17 builds took 22 s of
# CPU, 7 s with the cache). An environment that sets PYTHONDONTWRITEBYTECODE to
# keep bytecode out of the working tree still gets that: the tree holds none.
# What the prefix mirrors of anything but this checkout (the tests' scratch folders,
# where modules are generated and imported once) goes at the start of each run.
export PYTHONPYCACHEPREFIX="$PWD/.venv/fsmc-pycache"
unset PYTHONDONTWRITEBYTECODE
if [ -d "$PYTHONPYCACHEPREFIX$PWD" ]; then
    mv "$PYTHONPYCACHEPREFIX$PWD" "$PYTHONPYCACHEPREFIX.keep"
fi
rm -rf "$PYTHONPYCACHEPREFIX"
if [ -d "$PYTHONPYCACHEPREFIX.keep" ]; then
    mkdir -p "$(dirname "$PYTHONPYCACHEPREFIX$PWD")"
    mv "$PYTHONPYCACHEPREFIX.keep" "$PYTHONPYCACHEPREFIX$PWD"
fi
# The tests' scratch folders in memory where the machine has room for them: fsmc
# fsyncs every file it writes (a build killed at any moment leaves old or new files),
# and the suite builds thousands; on a disk each fsync waits for the flush, the more so
# while PostgreSQL flushes its own. Only the folders of failed tests are kept. (Room:
# 4 GB free; and the tests run programs from there, so it must allow that.)
in_memory() {
    [ -d /dev/shm ] && [ -w /dev/shm ] &&
        [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -gt 4000000 ] || return 1
    local probe
    probe=$(mktemp /dev/shm/fsmc-exec-probe.XXXXXX) || return 1
    printf '#!/bin/sh\n' >"$probe" && chmod +x "$probe" && "$probe"
    local runs=$?
    rm -f "$probe"
    return $runs
}
if [ -z "${PYTEST_DEBUG_TEMPROOT:-}" ] && in_memory; then
    export PYTEST_DEBUG_TEMPROOT=/dev/shm
fi
set -- -o tmp_path_retention_policy=failed "$@"
if [ -n "$fast" ]; then
    # No database, no Mermaid, no tool in a process of its own: what a change to the
    # compiler's stages breaks first, in seconds. Not a substitute for the whole run.
    export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-fast}"
    exec python -m pytest -n 2 -m "core and not slow and not db" "$@"
fi
# Tests marked slow are collected first (tests/conftest.py); handing each worker two
# tests at a time, rather than a quarter of the suite at once, spreads them over both.
exec python -m pytest -n 2 --maxschedchunk 2 "$@"
