#!/usr/bin/env bash
# The wheels the H200 image lacks (its Python 3.12 has torch and CUDA, not Ray nor Serve's packages), fetched
# here into the git-ignored folders the device tool carries:
#
#   bash benchmarks/fetch_wheels.sh      # from the repo root, where pip reaches PyPI
#
#   .whlray/  ray 2.60.0 alone (travels in a call of its own: install_wheels.py .whlray /tmp/site)
#   .whl/     the rest: Serve's and the ingress's packages, av, ftfy (benchmarks.run's text encoder)
#             and the cuDNN frontend (attention="cudnn_fp8"; 1.14.1: no dependencies of its own)
#   .whlfa3/  fa3-fwd 0.0.3 (27 MB: FlashAttention-3's forward kernels, `model.attention: fa3`; built
#             for CUDA 13 on torch's stable ABI, it loads on the device image's torch 2.11+cu130) and a
#             second copy of the cuDNN frontend (2 MB): the attention probe and the fa3 check compare
#             FA3 with cuDNN's FP8 in one call, carry [".whlfa3"] alone:
#               python3 benchmarks/install_wheels.py .whlfa3 /tmp/site && PYTHONPATH=/tmp/site:$PWD ...
#             Beside .whl it passes one call's 64 MiB: for a served run, install it in a call of its
#             own first (as .whlray; a warm machine keeps /tmp/site, gpu_serve.sh's .whl adds to it).
#
# FA4=1 also fetches FlashAttention's CuTe DSL kernels (flash-attn-4: FA3-class bf16 attention on
# sm_90, for benchmarks/probes/attention.py) with their CUDA 13 libraries. Their largest wheel
# (nvidia-cutlass-dsl-libs-cu13, 92 MB) is over one call's carry: it is cut into three parts,
# one per call, joined on the device (a warm machine keeps /tmp between calls):
#
#   call 1, carry [".whlfa4_1"]: mkdir -p /tmp/fa4 && cp .whlfa4_1/* /tmp/fa4/
#   call 2, carry [".whlfa4_2"]: cp .whlfa4_2/* /tmp/fa4/
#   call 3, carry [".whlfa4"]:   cp .whlfa4/*.part-* /tmp/fa4/ && cat /tmp/fa4/*.part-* > .whlfa4/$(cat .whlfa4/JOINED)
#                                && python3 benchmarks/install_wheels.py .whlfa4 /tmp/site
#                                && PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.probes.attention ...
#
# Versions are the ones this project's CPU environment runs with, except grpcio-reflection,
# which must match the image's grpcio (1.84.0). `--no-deps`: the image already holds the rest.
set -euo pipefail

PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)  # pip matches the listed tags only: fa3-fwd is 2_24
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
rm -rf .whlfa3
fetch .whlfa3 fa3-fwd==0.0.3 nvidia-cudnn-frontend==1.14.1  # --no-deps: fa3-fwd's interface imports torch alone
du -sh .whlfa3

if [ "${FA4:-0}" = 1 ]; then
    rm -rf .whlfa4 .whlfa4_1 .whlfa4_2
    fetch .whlfa4 flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 cuda-bindings==13.5.0 \
        cuda-pathfinder apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5 einops==0.8.2 \
        protobuf==7.36.2
    big=$(cd .whlfa4 && ls nvidia_cutlass_dsl_libs_cu13-*.whl)
    echo "$big" > .whlfa4/JOINED
    split -n 3 -d -a 2 ".whlfa4/$big" ".whlfa4/$big.part-"  # parts 00, 01, 02: joined in this order
    rm ".whlfa4/$big"
    mkdir -p .whlfa4_1 .whlfa4_2
    mv ".whlfa4/$big.part-00" .whlfa4_1/ && mv ".whlfa4/$big.part-01" .whlfa4_2/
    du -sh .whlfa4 .whlfa4_1 .whlfa4_2
fi
