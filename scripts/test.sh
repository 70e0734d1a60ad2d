#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on CPU. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser_deps.sh
exec .venv/bin/python -m pytest -q "$@"
