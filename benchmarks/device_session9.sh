#!/usr/bin/env bash
# Session 9 of round 2 on one H200. Outputs under $OUT.
#
# The first calls (results h200_round2_s9_{rope_probe,gemm_autotune,gemm_autotune_b,window_*,serve_fa4_*})
# ran the FA4 wheels' three-call recipe (benchmarks/fetch_wheels.sh's header) with a probe in each:
#   call 1 (carry .whlfa4_1): python3 -m benchmarks.quant_probe --only rope; python3 -m benchmarks.gemm_probe
#       --autotune --only ffn_up o_proj ffn_down
#   call 2 (carry .whlfa4_2): python3 -m benchmarks.gemm_probe --autotune --only qkv ffn_down
#   call 3 (carry .whlfa4): the FA4 install, then benchmarks.window --compile --chunks 8 --precisions bf16+rope
#       three times, in processes that set torch.backends.cuda.preferred_blas_library (cublas / cublaslt)
#       first: cublas + cudnn, cublaslt + cudnn, cublaslt + fa4
#   call 4 (carry .whlray): python3 benchmarks/install_wheels.py .whlray /tmp/site
#   call 5 (carry .whl): CONFIG=benchmarks/serve_config.h200.fa4.yaml SESSIONS="1" BUDGET_S=440
#       HEALTH_WAIT_S=320 bash benchmarks/gpu_serve.sh (FA4 served)
# PART=update (carry .whl: av for benchmarks.run): the cache update as CausalDiT.write_kv against the
# whole t = 0 call, windowed (bf16 and FP8 sessions in one process), then the 81-frame engine run.
# PART=ring (carry .whl): the bf16 window as a ring against the shifting window (A B A in one process).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
run() {  # run NAME SECONDS ARGS...
    local name=$1 limit=$2; shift 2
    echo "== $name"; timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "rc $?"; tail -n 8 "$OUT/$name.log"
}
python3 benchmarks/install_wheels.py .whl /tmp/site > /dev/null || exit 1
case "${PART:-update}" in
update)
    run window_update 300 -m benchmarks.window --compile --chunks 9 --save-latents \
        --precisions bf16+rope+whole,bf16+rope,fp8+bound+rope+whole,fp8+bound+rope \
        --fp8-fast-accum --fp8-quant triton --fp8-attention --kv-codes --out "$OUT/window_update.json"
    grep "ms/chunk" "$OUT/window_update.log"
    python3 - "$OUT" <<'PY' | tee "$OUT/window_update_latents.txt"
import sys, torch
out = sys.argv[1]
for base in ("bf16_rope", "fp8_bound_rope"):
    whole, kv = (torch.load(f"{out}/window_update_{base}{tag}_latents.pt") for tag in ("_whole", ""))
    print(base, "write_kv vs whole call: equal", torch.equal(whole, kv),
          "max rel", float(((kv - whole).norm() / whole.norm())))
PY
    V=fp8_triton_quant_fast_accum_fp8_attention_codes_bound_rope
    run dit_s9 420 -m benchmarks.run --preset lingbot-world-fast --frames 81 --residual-init --numerics-chunks 2 \
        --skip eager_bf16 fast_flash fast_cudnn profile pipeline compile_fa4 compile_fa4_rope pipeline_compiled \
        profile_compiled profile_fp8 --fp8-variants $V --out "$OUT/dit_s9.json"
    rm -f "$OUT"/*_latents.pt
    ;;
ring)
    run window_ring 300 -m benchmarks.window --compile --chunks 9 --save-latents \
        --precisions bf16+rope+shift,bf16+rope,bf16+shift+rope --out "$OUT/window_ring.json"
    grep "ms/chunk" "$OUT/window_ring.log"
    python3 - "$OUT" <<'PY' | tee "$OUT/window_ring_latents.txt"
import sys, torch
out = sys.argv[1]
shift, ring, again = (torch.load(f"{out}/window_ring_{tag}_latents.pt") for tag in ("bf16_rope_shift", "bf16_rope",
                                                                                     "bf16_shift_rope"))
for k in range(shift.shape[0]):
    print("chunk", k, "ring vs shift", float((ring[k] - shift[k]).norm() / shift[k].norm()),
          "shift vs shift", float((again[k] - shift[k]).norm() / shift[k].norm()))
PY
    rm -f "$OUT"/*_latents.pt
    ;;
esac
