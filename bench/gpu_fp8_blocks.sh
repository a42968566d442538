#!/usr/bin/env bash
# FP8 activations with one scale per row and block of 512 values (session 25, unmeasured) on the device,
# in one call (~9 min with a cold start, close to the 10-minute limit: finished runs come back either way;
# carry .whl):
#   device:  run(command="OUT=$OUT bash bench/gpu_fp8_blocks.sh", carry=[".whl"], timeout_s=600)
#   1. tests/test_fp8_fast.py and tests/test_fp8_head_fused.py on the GPU (the block quantizers bit for bit,
#      the split-K kernel's block form against its reference, the calibration); a failure stops the call
#      before anything is timed;
#   2. the engine A/B (bench/gpu_file_ab.sh), RUNS (blocks,new,silu) with RUN_ARGS (--runs fp8 --batches 32,64):
#      "new" is this tree as shipped (the block form and the wide tiles off, SiLU * mul unfused); "blocks"
#      the same with `fp8.BLOCK_FORM` and `triton_fp8_fast.WIDE` on (both calibration candidates); "silu"
#      that with SiLU * mul fused too (`FUSED_PRODUCERS` ("norm", "silu"): it emits block-scaled rows
#      wherever down's calibration chose the block form).
# Judge the products by the calibration lines each run's JSON keeps ("calibration": o and down at 32 and
# 64 rows, us and the kind), the engine by tok/s (its runs spread 5-7% within a side).
set -u
. "$(dirname "$0")/device_lib.sh"
start_script
say "1: FP8 tests on the GPU"
run_gpu_tests tests/test_fp8_fast.py "$OUT/pytest-fp8-fast.txt" 240 || exit 1
run_gpu_tests tests/test_fp8_head_fused.py "$OUT/pytest-fp8-fused.txt" 240 || exit 1
say "2: engine A/B"
AB=$(mktemp -d)  # side silu's folder: FUSED_PRODUCERS; the switches of both sides by SWITCHES
mkdir -p "$AB/silu/onebit/models"
sed 's/^FUSED_PRODUCERS = ("norm",)$/FUSED_PRODUCERS = ("norm", "silu")/' onebit/models/quantize.py \
    > "$AB/silu/onebit/models/quantize.py"
grep -q '^FUSED_PRODUCERS = ("norm", "silu")$' "$AB/silu/onebit/models/quantize.py" || {
    echo "could not make side silu (FUSED_PRODUCERS)"; exit 1; }
SWITCHES=""
for side in blocks silu; do
    SWITCHES+="${SWITCHES:+,}$side:onebit/kernels/fp8.py:BLOCK_FORM,$side:onebit/kernels/triton_fp8_fast.py:WIDE"
done
# a side with the block form calibrates twice the w8a8 candidates: up to ~150 s a run instead of ~100
WHEELS=0 AB_DIR=$AB SWITCHES=$SWITCHES RUNS=${RUNS:-blocks,new,silu} RUN_ARGS=${RUN_ARGS:---runs fp8 --batches 32,64} \
    RUN_TIMEOUT=240 OUT=$OUT timeout 480 bash bench/gpu_file_ab.sh
rm -rf "$OUT"/run-* "$AB"
for f in "$OUT"/*-[0-9]*.json; do  # each run's record (gpu_file_ab.sh): o's and down's calibration lines
    python3 - "$f" <<'PY'
import json, sys
for engine, record in json.load(open(sys.argv[1])).items():
    print(sys.argv[1].split("/")[-1], engine, record.get("startup_s"))
    for line in record.get("calibration", []):
        if "o_proj" in line or "down_proj" in line:
            print("  ", line[:220])
PY
done
