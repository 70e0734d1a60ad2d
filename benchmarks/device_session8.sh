#!/usr/bin/env bash
# Session 8 of round 2 on one H200 (carry .whl: av for benchmarks.run / window --profile, the
# cuDNN frontend, ftfy, wcwidth). The session's first call (results h200_round2_s8_{rgb_convs,
# rope_probe,vae_rgb}.*) probed the encoder's first conv (3 -> 96) and the decoder's last (96 -> 3)
# as Triton kernels against cuDNN (a probe since replaced by benchmarks.vae_conv_probe; the head
# kernel removed), the Q / K norm + RoPE kernel's launches (benchmarks.quant_probe --only rope)
# and ran the VAE benchmark with session 5's served variant and the Triton convs. PART=vae2: the
# encoder's convs probed again (benchmarks.vae_conv_probe: the stem's two kernels, the
# downsamplings' pad inside a 4x4 conv), the VAE benchmark with the stem and the downsamplings.
# PART=vae2 also probes the DiT's bf16 GEMM shapes in other forms (benchmarks.gemm_probe).
# PART=window: one windowed bf16 session (cuDNN attention, the looped Triton RoPE: the shipped
# path) with a steady-state chunk profiled: where a bf16 chunk's time goes besides the GEMMs and
# the attention. PART=window_fp8: the windowed bf16 and FP8 chunks with the looped RoPE.
# PART=serve (carry .whl, after a call `python3 benchmarks/install_wheels.py .whlray /tmp/site`
# carrying .whlray): the shipped GPU config served, one 81-frame session. Outputs under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
run() {  # run NAME SECONDS ARGS...
    local name=$1 limit=$2; shift 2
    echo "== $name"; timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "rc $?"; tail -n 8 "$OUT/$name.log"
}
python3 benchmarks/install_wheels.py .whl /tmp/site > /dev/null || exit 1
vae_summary() {
    python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["stages"]["vae_only"]
for k, v in r.items():
    if k.startswith("vae_") and isinstance(v, dict) and "encode_s" in v:
        print(k, "enc", [round(x, 4) for x in v["encode_s"]], "dec", [round(x, 4) for x in v["decode_s"]],
              "warm", round(v.get("warmup_3chunks_s", 0), 1), "err", round(max(v.get("encode_rel_err", [0])), 5))
    elif k.startswith("vae_") and isinstance(v, dict) and "error" in v:
        print(k, v["error"][-600:])
PY
}
case "${PART:-vae2}" in
vae2)
    run gemm_probe 120 -m benchmarks.gemm_probe --out "$OUT/gemm_probe.json"
    run vae_convs 240 -m benchmarks.vae_conv_probe --out "$OUT/vae_convs.json"
    run vae_stem 300 -m benchmarks.run --preset lingbot-world-fast --frames 81 --vae-only \
        --vae-variants bf16_compiled_batched_upsample_2x2 bf16_compiled_batched_2x2_triton_stem \
        bf16_compiled_batched_2x2_stem_down --out "$OUT/vae_stem.json"
    grep -h " ms \|TFLOP\|default" "$OUT/vae_convs.log" "$OUT/gemm_probe.log" | head -60
    vae_summary "$OUT/vae_stem.json"
    ;;
window_fp8)  # the windowed chunks with the looped RoPE, bf16 and FP8 (the FP8 window config's options)
    run window_fp8_looped 280 -m benchmarks.window --compile --chunks 9 --precisions bf16+rope,fp8+bound+rope \
        --fp8-fast-accum --fp8-quant triton --fp8-attention --kv-codes --out "$OUT/window_fp8_looped.json"
    ;;
serve)  # the shipped GPU config served, one session (after a call that installs .whlray into /tmp/site)
    SESSIONS="1" BUDGET_S=420 HEALTH_WAIT_S=300 bash benchmarks/gpu_serve.sh 2>&1 | tail -40
    rm -f "$OUT/serve_logs.tar.gz" "$OUT/gpu_mem.csv"
    ;;
window)
    run window_bf16_profile 400 -m benchmarks.window --compile --chunks 8 --profile --precisions bf16+rope \
        --out "$OUT/window_bf16_profile.json"
    ;;
esac
