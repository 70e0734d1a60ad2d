#!/usr/bin/env bash
# Set up (idempotent) and run the tests on CPU. Extra args go to pytest.
#   bash scripts/test.sh           everything (CI's command)
#   bash scripts/test.sh --fast    the fast tier: no Ray / Serve app / cluster, no browser, no GPU, no
#                                  slow module (markers set in tests/conftest.py); skips browser_deps
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [ "${1:-}" = "--fast" ]; then
    FAST=1
    shift
fi
bash scripts/setup.sh
if [ "$FAST" = 1 ]; then
    exec .venv/bin/python -m pytest -q -m "not ray and not browser and not gpu and not slow" "$@"
fi
bash scripts/browser_deps.sh
exec .venv/bin/python -m pytest -q --durations=20 "$@"  # the 20 slowest: where CI's minutes go
