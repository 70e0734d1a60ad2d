#!/usr/bin/env bash
# Create .venv and install the project with its test extras (idempotent).
#   bash scripts/setup.sh               always runs every step
#   bash scripts/setup.sh --if-changed  does nothing when .venv was set up by this script from the
#                                       same pyproject.toml and setup.sh (the stamp below); the
#                                       fast tier's `scripts/test.sh --fast` calls it so
#
# Torch: on a CPU machine this installs torch==${LWF_TORCH:-2.13.0} (the CPU wheel on this
# workplace's disk). On a GPU machine install the CUDA torch of your choice into .venv first
# (or set LWF_TORCH to the version you want); an importable torch is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.lwf-setup-stamp  # the hash of what this setup was made from, written as its last step
inputs_hash() { cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1; }
if [ "${1:-}" = "--if-changed" ] && [ -x .venv/bin/python ] && [ -f "$STAMP" ] && \
   [ "$(cat "$STAMP")" = "$(inputs_hash)" ]; then
  exit 0
fi
rm -f "$STAMP"  # an interrupted setup leaves none: the next --if-changed runs it again
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==${LWF_TORCH:-2.13.0}"
fi
.venv/bin/pip install -q -e '.[test]'
# The proxy guard (deployments/proxy_guard.py) is loaded by Serve's HTTP proxy from an
# environment variable read when Ray starts the proxy; a serve config cannot set it. Every
# Python of this venv gets it as a default (an explicit setting wins), so the README's
# `serve run` has it; the k8s manifests set it in the pods' environment. The same line gives
# the processes `serve run` starts (raylet, proxy, replicas) the allocator and object-store
# settings of deployments/replicas/allocator.py (MALLOC_ENV: what a flood of large frames leaves).
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
DEFAULTS=$(.venv/bin/python -c "from deployments.replicas.allocator import MALLOC_ENV as e; print(repr({**e, 'RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH': 'deployments.proxy_guard:middlewares'}))")
echo "import os; [os.environ.setdefault(k, v) for k, v in $DEFAULTS.items()]" > "$SITE/lwf_proxy_guard.pth"
# openpi-client (the peers' client, driven by tests/deployments/test_peer_clients.py): its only
# release pins numpy<2, which would downgrade this project's numpy; the modules the tests use
# (msgpack_numpy, websocket_client_policy) need only msgpack, numpy and websockets.
.venv/bin/pip install -q --no-deps "openpi-client==0.1.2"
inputs_hash > "$STAMP"
