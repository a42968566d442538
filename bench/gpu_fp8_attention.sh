#!/usr/bin/env bash
# o's input block-quantized by the decode attention kernel (`quantize.Fp8Attention`, off) on the device, in
# one call (carry .whl):
#   device:  run(command="OUT=$OUT bash bench/gpu_fp8_attention.sh", carry=[".whl"], timeout_s=600)
#   1. tests/test_kernels.py and tests/test_fp8_head_fused.py on the GPU (the quantized attention output bit
#      for bit `fp8.quantize_row_blocks` of the plain one, in bf16, through the split kernel and the merge);
#      a failure stops the call before anything is timed;
#   2. MODE=ab (default; ~8 min with a cold start): the engine A/B (bench/gpu_file_ab.sh), RUNS
#      (attn,new,attn,new) with RUN_ARGS (--runs fp8 --batches 32,64): "new" is this tree as shipped, "attn"
#      the same with "attention" among `FUSED_PRODUCERS`; then o's calibration lines of each run.
#      MODE=profile (~4 min): bench/gpu_step_profile.py (PROFILE_ARGS, --engines fp8 --batches 32,64
#      --no-pdl) in side attn's tree, then in this one: kernels by kind per step, to find where side attn
#      lost 6% at B=32 in session 27 while o itself gained 1.6 us a layer.
# Session 27's A/B: o at 32 / 64 rows 9.5 / 10.7 -> 7.9 / 8.7 us, engine B=32 -6.0%, B=64 -1.9% (history).
set -u
. "$(dirname "$0")/device_lib.sh"
start_script
MODE=${MODE:-ab}
say "1: attention and FP8 producer tests on the GPU"
run_gpu_tests tests/test_kernels.py "$OUT/pytest-kernels.txt" 240 || exit 1
run_gpu_tests tests/test_fp8_head_fused.py "$OUT/pytest-fp8-fused.txt" 240 || exit 1
AB=$(mktemp -d)  # side attn's folder: FUSED_PRODUCERS with "attention"
mkdir -p "$AB/attn/onebit/models"
sed 's/^FUSED_PRODUCERS = ("norm", "silu")$/FUSED_PRODUCERS = ("norm", "silu", "attention")/' \
    onebit/models/quantize.py > "$AB/attn/onebit/models/quantize.py"
grep -q '^FUSED_PRODUCERS = ("norm", "silu", "attention")$' "$AB/attn/onebit/models/quantize.py" || {
    echo "could not make side attn (FUSED_PRODUCERS)"; exit 1; }
if [[ $MODE == profile ]]; then
    say "2: step profiles, side attn then new"
    TREE=$(mktemp -d)
    cp -r onebit bench "$TREE"/ && cp -r "$AB/attn"/. "$TREE"/
    # shellcheck disable=SC2086
    (cd "$TREE" && PYTHONPATH=$WHEEL_SITE:$TREE timeout 280 python3 bench/gpu_step_profile.py \
        ${PROFILE_ARGS:---engines fp8 --batches 32,64 --no-pdl} --out "$OUT/profile-attn") || echo "side attn: rc $?"
    # shellcheck disable=SC2086
    timeout 280 python3 bench/gpu_step_profile.py ${PROFILE_ARGS:---engines fp8 --batches 32,64 --no-pdl} \
        --out "$OUT/profile-new" || echo "side new: rc $?"
    rm -rf "$TREE" "$AB"
    exit 0
fi
say "2: engine A/B"
WHEELS=0 AB_DIR=$AB RUNS=${RUNS:-attn,new,attn,new} RUN_ARGS=${RUN_ARGS:---runs fp8 --batches 32,64} \
    RUN_TIMEOUT=150 OUT=$OUT timeout 460 bash bench/gpu_file_ab.sh
rm -rf "$OUT"/run-* "$AB"
for f in "$OUT"/*-[0-9]*.json; do  # each run's record (gpu_file_ab.sh): o's calibration lines
    python3 - "$f" <<'PY'
import json, sys
for engine, record in json.load(open(sys.argv[1])).items():
    print(sys.argv[1].split("/")[-1], engine, record.get("startup_s"))
    for line in record.get("calibration", []):
        if "o_proj" in line:
            print("  ", line[:220])
PY
done
