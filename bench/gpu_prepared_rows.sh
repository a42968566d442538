#!/usr/bin/env bash
# The 8-64-row sweep with f16 modes timed as the engine runs them, merged into the table, then an engine A/B
# against an older tree, in one device call (#20; ~7 min with a cold start; carry .whl and .ab):
#   here:    mkdir -p .ab/old/onebit/kernels
#            git show REV:onebit/kernels/gguf_repacked_table.json > .ab/old/onebit/kernels/gguf_repacked_table.json
#            (and any other file of REV the old side should run, at its path under .ab/old)
#   device:  run(command="OUT=$OUT bash bench/gpu_prepared_rows.sh", carry=[".whl", ".ab"], timeout_s=600)
#   1. tests/test_gguf_f16.py's producer tests on the GPU (bfloat16, inline PTX);
#   2. the 8-64-row sweep of TYPES on CONFIGS (bench/gpu_gguf_repacked.py), modes "f16"/"f16s" timed on
#      prepared rows at the products whose producer prepares them (its PREPARED_PRODUCTS);
#   3. its winners merged into this tree's table where they beat the shipped pick by MIN_GAIN
#      (tools/merge_repacked_table.py --shapes --write; the merged table comes back as
#      gguf_repacked_table.json);
#   4. the engine, Q4_K_M packed at B = 8 / 64, alternating (bench/gpu_file_ab.sh, RUNS): "new" is this
#      tree with the merged table, "old" the tree with .ab/old laid over it. Tables of decode tok/s per
#      run and per side are printed last.
# Session 21 ran it with SiLU * mul also preparing the down product's rows (`PackedSwiGLU`, b1f1c0a, old
# side: that commit's parent's packed.py and table): -24% at B=8, removed.
# Environment: TYPES, ROWS, CONFIGS, MIN_GAIN (1.03), RUNS (new,old,new), WHEELS (1; 0: a caller installed them),
# OUT.
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
TYPES=${TYPES:-Q4_K,Q6_K}
ROWS=${ROWS:-8,16,32,64}
# the shipped picks at 8-64 rows (the merge compares each against the sweep's best) and their neighbours
CONFIGS=${CONFIGS:-int-n64-g1-s3,int-n64-g1-p256,int-n64-g1-s3-p256,f16s-n128,f16s-n128-p256,f16s-n128-p512,f16s-n64-p512,f16-n128,g16-n64-p256,g16-n64-p512,g16-n64-s1-p512,g16-n128-s1-p256}
mkdir -p "$OUT"
# checked here too, so that a missing old side stops the call before the sweep instead of after it
[[ -d .ab/old ]] || { echo "no .ab/old: put the old side's files there (see the header)"; exit 1; }
if [[ ${WHEELS:-1} == 1 ]]; then install_wheels || exit 1; fi
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
say "1: producer tests on the GPU"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gguf_f16.py \
    -k "prepares or prepared" > "$OUT/pytest.txt" 2>&1
tail -1 "$OUT/pytest.txt"
say "2: sweep of $TYPES at $ROWS rows"
timeout 240 python3 bench/gpu_gguf_repacked.py --out "$OUT/sweep" --types "$TYPES" \
    --rows "$ROWS" --configs "$CONFIGS" > "$OUT/sweep.log" 2>&1 || echo "sweep: rc $? (log: sweep.log)"
say "3: merge"
python3 tools/merge_repacked_table.py "$OUT/sweep" --min-gain "${MIN_GAIN:-1.03}" --shapes --write \
    > "$OUT/merge.txt" 2>&1 || echo "merge: rc $?"
cat "$OUT/merge.txt"
cp onebit/kernels/gguf_repacked_table.json "$OUT/"
rm -f "$OUT"/sweep/*.pt
say "4: engine A/B"
WHEELS=0 RUNS=${RUNS:-new,old,new} OUT=$OUT bash bench/gpu_file_ab.sh
