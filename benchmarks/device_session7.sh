#!/usr/bin/env bash
# Session 7 of round 2 on one H200. PART=window (the third of three calls; the first two leave
# FlashAttention's big wheel's parts in /tmp/fa4, see benchmarks/fetch_wheels.sh; carry .whlfa4,
# which also holds the cuDNN frontend, ftfy and wcwidth): FlashAttention's CuTe DSL kernels
# probed at the DiT's shapes; windowed chunks, one session each on the same weights: bf16, FP8
# with the code cache as a ring (the default now), as the shifting window (session 6's), with
# the bound scales of Q and K; windowed bf16 chunks with FlashAttention.
# PART=dit (the next call, the machine still warm: /tmp/site kept): the 81-frame engine run,
# compiled bf16, compiled with FlashAttention, and the FP8 attention without / with the code
# cache / with the bound scales. Outputs under $OUT.
set -uo pipefail
# the cutlass DSL's own packages: a .pth file that PYTHONPATH entries do not run
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
run() {  # run NAME SECONDS ARGS...
    local name=$1 limit=$2; shift 2
    echo "== $name"; timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "rc $?"; tail -n 6 "$OUT/$name.log"
}
case "${PART:-window}" in
window)
    cp .whlfa4/*.part-* /tmp/fa4/ && cat /tmp/fa4/*.part-* > ".whlfa4/$(cat .whlfa4/JOINED)" || exit 1
    python3 benchmarks/install_wheels.py .whlfa4 /tmp/site > /dev/null || exit 1
    run fa4_probe 90 -m benchmarks.attention_probe --sweep none --out "$OUT/fa4_probe.json"
    W="-m benchmarks.window --compile --chunks 9 --save-latents"
    run window_codes 260 $W --precisions bf16,fp8,fp8+shift,fp8+bound --fp8-fast-accum --fp8-quant triton \
        --fp8-attention --kv-codes --out "$OUT/window_codes.json"
    run window_fa4 140 $W --precisions bf16 --attention fa4 --out "$OUT/window_fa4.json"
    grep -h "fa4\|cudnn" "$OUT/fa4_probe.log" | head -20
    ;;
dit)
    # carry .whl (benchmarks.run imports av, ftfy; the cuDNN frontend): on top of PART=window's
    python3 benchmarks/install_wheels.py .whl /tmp/site > /dev/null || exit 1
    V=fp8_triton_quant_fast_accum_fp8_attention
    run dit_h 560 -m benchmarks.run --preset lingbot-world-fast --frames 81 --residual-init --numerics-chunks 2 \
        --skip eager_bf16 fast_flash fast_cudnn profile pipeline pipeline_compiled profile_compiled profile_fp8 \
        --fp8-variants $V ${V}_codes ${V}_codes_bound --out "$OUT/dit_h.json"
    run window_fa4 140 -m benchmarks.window --compile --chunks 9 --save-latents --precisions bf16 --attention fa4 \
        --out "$OUT/window_fa4.json"
    ;;
# The second device session: the Q / K norm + RoPE as one Triton pass (AccelOptions.triton_rope)
# against the compiled region, windowed (bf16 with FlashAttention, FP8 with the code cache and the
# bound scales; one steady-state chunk of each profiled) and over 81 frames. PART=rope_window is
# the third call of the FA4 recipe (carry .whlfa4), PART=rope_dit the next (carry .whl).
rope_window)
    cp .whlfa4/*.part-* /tmp/fa4/ && cat /tmp/fa4/*.part-* > ".whlfa4/$(cat .whlfa4/JOINED)" || exit 1
    python3 benchmarks/install_wheels.py .whlfa4 /tmp/site > /dev/null || exit 1
    run window_rope 400 -m benchmarks.window --compile --chunks 9 --save-latents --profile --attention fa4 \
        --precisions bf16,bf16+rope,fp8+bound,fp8+bound+rope --fp8-fast-accum --fp8-quant triton --fp8-attention \
        --kv-codes --out "$OUT/window_rope.json"
    ;;
rope_dit)
    python3 benchmarks/install_wheels.py .whl /tmp/site > /dev/null || exit 1
    V=fp8_triton_quant_fast_accum_fp8_attention_codes_bound
    run dit_i 560 -m benchmarks.run --preset lingbot-world-fast --frames 81 --residual-init --numerics-chunks 2 \
        --skip eager_bf16 fast_flash fast_cudnn profile pipeline pipeline_compiled profile_compiled profile_fp8 \
        --fp8-variants $V ${V}_rope --out "$OUT/dit_i.json"
    ;;
esac
