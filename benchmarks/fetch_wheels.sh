#!/usr/bin/env bash
# The wheels the H200 image lacks (Python 3.12, see ../shared/docs/VERIFIED_NOTES.md), fetched
# here into the git-ignored folders the device tool carries:
#
#   bash benchmarks/fetch_wheels.sh      # from the repo root, where pip reaches PyPI
#
#   .whlray/  ray 2.60.0 alone (travels in a call of its own: install_wheels.py .whlray /tmp/site)
#   .whl/     the rest: Serve's and the ingress's packages, av, ftfy (benchmarks.run's text encoder)
#             and the cuDNN frontend (attention="cudnn_fp8"; 1.14.1: no dependencies of its own)
#
# Versions are the ones this project's CPU environment runs with, except grpcio-reflection,
# which must match the image's grpcio (1.84.0). `--no-deps`: the image already holds the rest.
set -euo pipefail

PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux1_x86_64)
fetch() {  # fetch DIR SPEC...
    local dir=$1; shift
    mkdir -p "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]/#/--platform=}" --platform any -d "$dir" "$@"
}

fetch .whlray ray==2.60.0
fetch .whl grpcio-reflection==1.84.0 protobuf==7.36.2 \
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 websockets==17.4 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 opentelemetry-api==1.45.2 importlib-metadata \
    av==18.1.0 msgpack-numpy==0.4.8 ftfy==6.3.1 wcwidth==0.9.4 watchfiles==1.3.0 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
    nvidia-cudnn-frontend==1.14.1
du -sh .whl
# ray's wheel (79 MB) is over one call's 64 MiB: drop what Serve never imports (install_wheels.py
# skips the same members), repacked under the same name.
python3 - <<'PY'
import zipfile
from pathlib import Path
from benchmarks.install_wheels import SKIP_PREFIXES
for wheel in Path(".whlray").glob("ray-*.whl"):
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if not info.filename.startswith(SKIP_PREFIXES):
                dst.writestr(info, src.read(info))
    tmp.replace(wheel)
PY
du -sh .whlray
