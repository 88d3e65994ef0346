#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, then runs pytest.
# Usage: bash tests/run.sh [pytest args...]
# Database tests use FSMC_PG_DSN (e.g. postgresql://postgres@127.0.0.1:5432/postgres);
# .ci/run sets it and requires them, so in CI they never skip.
set -euo pipefail
cd "$(dirname "$0")/.."

# The npm packages that check Mermaid install in the background, beside pip.
npm_pid=
if [ ! -d tests/mermaid/node_modules ] || [ tests/mermaid/package-lock.json -nt tests/mermaid/node_modules ]; then
    npm ci --prefix tests/mermaid --no-audit --no-fund --loglevel=error &
    npm_pid=$!
fi

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

if [ -n "$npm_pid" ]; then
    wait "$npm_pid"
fi
export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -n 2 "$@"
