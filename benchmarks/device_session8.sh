#!/usr/bin/env bash
# Session 8 of round 2 on one H200 (carry .whl: av for benchmarks.run / window --profile, the
# cuDNN frontend, ftfy, wcwidth). PART=vae: the VAE's RGB convs (the encoder's first, 3 -> 96;
# the decoder's last, 96 -> 3) as Triton kernels against cuDNN at a later chunk's shape
# (benchmarks.rgb_conv_probe), the Q / K norm + RoPE kernel's launches (benchmarks.quant_probe
# --only rope), then the VAE benchmark with session 5's served variant, + the Triton stem, + both
# (one process, the fastest profiled). PART=window: one windowed bf16 session (cuDNN attention,
# Triton RoPE: the shipped path) with a steady-state chunk profiled: where a bf16 chunk's time
# goes besides the GEMMs and the attention. Outputs under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
run() {  # run NAME SECONDS ARGS...
    local name=$1 limit=$2; shift 2
    echo "== $name"; timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "rc $?"; tail -n 8 "$OUT/$name.log"
}
python3 benchmarks/install_wheels.py .whl /tmp/site > /dev/null || exit 1
case "${PART:-vae}" in
vae)
    run rgb_convs 240 -m benchmarks.rgb_conv_probe --out "$OUT/rgb_convs.json"
    run rope_probe 120 -m benchmarks.quant_probe --only rope --out "$OUT/rope_probe.json"
    run vae_rgb 300 -m benchmarks.run --preset lingbot-world-fast --frames 81 --vae-only \
        --vae-variants bf16_compiled_batched_upsample_2x2 bf16_compiled_batched_2x2_triton_stem \
        bf16_compiled_batched_2x2_triton_rgb --out "$OUT/vae_rgb.json"
    grep -h "ms \|rope " "$OUT/rgb_convs.log" "$OUT/rope_probe.log" | head -40
    python3 - "$OUT/vae_rgb.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["stages"]["vae_only"]
for k, v in r.items():
    if k.startswith("vae_") and isinstance(v, dict) and "encode_s" in v:
        print(k, "enc", [round(x, 4) for x in v["encode_s"]], "dec", [round(x, 4) for x in v["decode_s"]],
              {a: b for a, b in v.items() if "err" in a or "rel" in a})
    elif k.startswith("vae_") and isinstance(v, dict) and "error" in v:
        print(k, v["error"][-600:])
PY
    ;;
window)
    run window_bf16_profile 400 -m benchmarks.window --compile --chunks 8 --profile --precisions bf16+rope \
        --out "$OUT/window_bf16_profile.json"
    ;;
esac
