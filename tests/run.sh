#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, then runs pytest.
# Usage: bash tests/run.sh [pytest args...]
# Database tests use FSMC_PG_DSN (e.g. postgresql://postgres@127.0.0.1:5432/postgres);
# .ci/run sets it and requires them, so in CI they never skip.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
if [ ! -d tests/mermaid/node_modules ] || [ tests/mermaid/package-lock.json -nt tests/mermaid/node_modules ]; then
    npm ci --prefix tests/mermaid --no-audit --no-fund --loglevel=error
fi
export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -n 2 "$@"
