#!/usr/bin/env bash
# Mode "g16" (onebit/kernels/gluon_gguf_g16.py) on the device, in one call (~6 min with a cold start; carry
# .whl and .ab):
#   here:    rm -rf .ab/old && mkdir -p .ab/old/onebit/kernels && for f in gguf_repacked_table.json \
#              gluon_gguf_g16.py triton_gguf_repacked.py; do git show REV:onebit/kernels/$f > .ab/old/onebit/kernels/$f; done
#            (REV: the tree to compare with; the three files together, their launch signatures match; before
#            session 23 the kernel file was gluon_gguf_q4k.py)
#   device:  run(command="OUT=$OUT bash bench/gpu_g16.sh", carry=[".whl", ".ab"], timeout_s=600)
#   1. tests/test_gguf_g16.py on the GPU: the kernel against its float64 reference; a failure stops the call
#      before anything is timed;
#   2. bench/gpu_prepared_rows.sh on TYPES (Q4_K, Q6_K) at ROWS with CONFIGS (every g16 launch beside the
#      shipped picks):
#      the sweep, its winners merged into the table, then the engine A/B (Q4_K_M B = 8 / 64, RUNS, "old":
#      the files under .ab/old).
# $OUT keeps at most 8 files: pytest-g16.txt, sweep.log, merge.txt, the merged gguf_repacked_table.json and
# the A/B's per-run JSONs (RUNS of 4 at most).
# Environment: TYPES, ROWS, CONFIGS, RUNS (new,old,new), OUT.
set -u
. "$(dirname "$0")/device_lib.sh"
ROWS=${ROWS:-8,16,32,64}
CONFIGS=${CONFIGS:-f16s-n128-p256,f16s-n128-p512,f16s-n64-p512,f16s-n128,int-n64-g1-s3,int-n64-g1-s3-p256,g16-n128-s1-p256,g16-n64-p512,g16-n64-p256,g16-n64-s1-p512}
[[ -d .ab/old ]] || { echo "no .ab/old: put the old side's table there (see the header)"; exit 1; }
start_script
say "1: g16 tests on the GPU"
run_gpu_tests tests/test_gguf_g16.py "$OUT/pytest-g16.txt" 200 || exit 1
say "2: sweep, merge, engine A/B"
WHEELS=0 TYPES=${TYPES:-Q4_K,Q6_K} ROWS=$ROWS CONFIGS=$CONFIGS RUNS=${RUNS:-new,old,new} OUT=$OUT bash bench/gpu_prepared_rows.sh
rm -rf "$OUT"/run-* "$OUT/pytest.txt"
