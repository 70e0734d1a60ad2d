#!/usr/bin/env bash
# Session 6 of round 2 on one H200 (the third of three calls; see benchmarks/fetch_wheels.sh for
# the first two, which leave the big wheel's parts in /tmp/fa4): FlashAttention's CuTe DSL
# kernels probed at the DiT's shapes, then windowed chunks with them, and the FP8 window with the
# code cache (AccelOptions.kv_codes) against the per-call quantization. Outputs under $OUT.
set -uo pipefail
# ONLY_CODES=1: one call, carry [".whlcudnn"] (the cuDNN frontend alone): the two FP8 window runs
if [ "${ONLY_CODES:-0}" = 1 ]; then
    python3 benchmarks/install_wheels.py .whlcudnn /tmp/site > /dev/null || exit 1
else
    cp .whlfa4/*.part-* /tmp/fa4/ && cat /tmp/fa4/*.part-* > ".whlfa4/$(cat .whlfa4/JOINED)" || exit 1
    python3 benchmarks/install_wheels.py .whlfa4 /tmp/site > /dev/null || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
run() {  # run NAME SECONDS ARGS...
    local name=$1 limit=$2; shift 2
    echo "== $name"; timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "rc $?"; tail -n 4 "$OUT/$name.log"
}
W="-m benchmarks.window --compile --chunks 8 --save-latents"
[ "${ONLY_CODES:-0}" = 1 ] || run fa4_probe 90 -m benchmarks.attention_probe --sweep none --out "$OUT/fa4_probe.json"
run window_fp8_codes 200 $W --precisions bf16,fp8 --fp8-fast-accum --fp8-quant triton --fp8-attention --kv-codes \
    --out "$OUT/window_fp8_codes.json"
run window_fp8_percall 140 $W --precisions fp8 --fp8-fast-accum --fp8-quant triton --fp8-attention \
    --out "$OUT/window_fp8_percall.json"
[ "${ONLY_CODES:-0}" = 1 ] || run window_fa4 140 $W --precisions bf16 --attention fa4 --out "$OUT/window_fa4.json"
[ "${ONLY_CODES:-0}" = 1 ] || grep -h "fa4\|cudnn" "$OUT/fa4_probe.log" | head -20
