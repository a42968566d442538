#!/usr/bin/env bash
# The side-stream L2 prefetch (onebit/kernels/l2_prefetch.py, off by default) on the device, in one call
# (~6 min with a cold start; carry .whl):
#   device:  run(command="OUT=$OUT bash bench/gpu_l2_prefetch.sh", carry=[".whl"], timeout_s=600)
#   1. tests/test_l2_prefetch.py on the GPU (products around the prefetch, eager and in a CUDA graph, bit for
#      bit as without); a failure stops the call before anything is timed;
#   2. bench/gpu_l2_prefetch.py: the o weight's product after the real decode attention, with and without
#      the prefetch forked onto the second stream, per weight size, 1 and 8 rows;
#   3. the engine A/B (bench/gpu_file_ab.sh): side "on" is this tree with `enabled = True`, RUNS (new,on,new)
#      with RUN_ARGS (--runs bf16,fp8 --batches 1,8).
# $OUT keeps pytest-l2.txt, l2.txt, l2_prefetch.json and the A/B's per-run JSONs.
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
install_wheels || exit 1
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
say "1: prefetch tests on the GPU"
run_gpu_tests tests/test_l2_prefetch.py "$OUT/pytest-l2.txt" 120 || exit 1
say "2: the product after the attention window, with and without the prefetch"
timeout 120 python3 bench/gpu_l2_prefetch.py --out "$OUT" > "$OUT/l2.txt" 2>&1
tail -8 "$OUT/l2.txt"
say "3: engine A/B"
AB=$(mktemp -d)
mkdir -p "$AB/on/onebit/kernels"
sed 's/^enabled = False /enabled = True /' onebit/kernels/l2_prefetch.py > "$AB/on/onebit/kernels/l2_prefetch.py"
grep -q "^enabled = True " "$AB/on/onebit/kernels/l2_prefetch.py" || { echo "could not switch the prefetch on"; exit 1; }
WHEELS=0 AB_DIR=$AB RUNS=${RUNS:-new,on,new} RUN_ARGS=${RUN_ARGS:---runs bf16,fp8 --batches 1,8} OUT=$OUT \
    timeout 400 bash bench/gpu_file_ab.sh
rm -rf "$OUT"/run-* "$AB"
