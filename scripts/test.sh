#!/usr/bin/env bash
# Set up (idempotent) and run the tests on CPU. Extra args go to pytest.
#   bash scripts/test.sh           everything (CI's command)
#   bash scripts/test.sh --fast    the fast tier: no Ray / Serve app / cluster, no browser, no GPU, no
#                                  slow module (markers set in tests/conftest.py); skips browser_deps,
#                                  and the setup when .venv was set up from the same pyproject.toml
#                                  and scripts/setup.sh (setup.sh --if-changed)
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [ "${1:-}" = "--fast" ]; then
    FAST=1
    shift
fi
if [ "$FAST" = 1 ]; then
    bash scripts/setup.sh --if-changed
    exec .venv/bin/python -m pytest -q -m "not ray and not browser and not gpu and not slow" "$@"
fi
bash scripts/setup.sh
bash scripts/browser_deps.sh
exec .venv/bin/python -m pytest -q --durations=20 "$@"  # the 20 slowest: where CI's minutes go
