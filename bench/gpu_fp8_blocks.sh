#!/usr/bin/env bash
# FP8 activations with one scale per row and block of 512 values (session 25, unmeasured) on the device,
# in one call (~8 min with a cold start; carry .whl):
#   device:  run(command="OUT=$OUT bash bench/gpu_fp8_blocks.sh", carry=[".whl"], timeout_s=600)
#   1. tests/test_fp8_fast.py and tests/test_fp8_head_fused.py on the GPU (the block quantizers bit for bit,
#      the split-K kernel's block form against its reference, the calibration); a failure stops the call
#      before anything is timed;
#   2. the engine A/B (bench/gpu_file_ab.sh), RUNS (new,old,silu) with RUN_ARGS (--runs fp8 --batches 32,64):
#      "new" is this tree (the block form a calibration candidate, SiLU * mul unfused as shipped); "old"
#      the same without the block form's candidates (the dispatch before it); "silu" this tree with
#      SiLU * mul fused (`FUSED_PRODUCERS` ("norm", "silu"): it emits block-scaled rows wherever down's
#      calibration chose the block form).
# Judge the products by the calibration lines each run's JSON keeps ("calibration": o and down at 32 and
# 64 rows, us and the kind), the engine by tok/s (its runs spread 5-7% within a side).
set -u
. "$(dirname "$0")/device_lib.sh"
start_script
say "1: FP8 tests on the GPU"
run_gpu_tests tests/test_fp8_fast.py "$OUT/pytest-fp8-fast.txt" 240 || exit 1
run_gpu_tests tests/test_fp8_head_fused.py "$OUT/pytest-fp8-fused.txt" 240 || exit 1
say "2: engine A/B"
AB=$(mktemp -d)
mkdir -p "$AB/old/onebit/kernels" "$AB/silu/onebit/models"
BLOCK_CANDIDATES='^    out += \[(BLOCK_W8A8_KIND, c) for c in '
sed "/$BLOCK_CANDIDATES/d" onebit/kernels/fp8.py > "$AB/old/onebit/kernels/fp8.py"
sed 's/^FUSED_PRODUCERS = ("norm",)$/FUSED_PRODUCERS = ("norm", "silu")/' onebit/models/quantize.py \
    > "$AB/silu/onebit/models/quantize.py"
if grep -q "$BLOCK_CANDIDATES" "$AB/old/onebit/kernels/fp8.py" || ! grep -q "$BLOCK_CANDIDATES" onebit/kernels/fp8.py; then
    echo "could not make side old (the block form's candidates line)"; exit 1
fi
grep -q '^FUSED_PRODUCERS = ("norm", "silu")$' "$AB/silu/onebit/models/quantize.py" || {
    echo "could not make side silu (FUSED_PRODUCERS)"; exit 1; }
WHEELS=0 AB_DIR=$AB RUNS=${RUNS:-new,old,silu} RUN_ARGS=${RUN_ARGS:---runs fp8 --batches 32,64} OUT=$OUT \
    timeout 420 bash bench/gpu_file_ab.sh
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
