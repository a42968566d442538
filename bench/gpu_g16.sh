#!/usr/bin/env bash
# Mode "g16" (onebit/kernels/gluon_gguf_q4k.py, written in session 22 and never run) on the device, in one call
# (~8-9 min with a cold start; carry .whl and .ab):
#   here:    mkdir -p .ab/old/onebit/kernels && cp onebit/kernels/gguf_repacked_table.json .ab/old/onebit/kernels/
#   device:  run(command="OUT=$OUT bash bench/gpu_g16.sh", carry=[".whl", ".ab"], timeout_s=600)
#   1. tests/test_gguf_g16.py on the GPU: the kernel against its float64 reference; a failure stops the call
#      before anything is timed;
#   2. bench/gpu_gguf_g16_tiles.py: the many-row tiles against the dequantized weight at 128 / 512 / 2,048 rows
#      (TILES=0 skips it);
#   3. bench/gpu_prepared_rows.sh on Q4_K at ROWS with CONFIGS (the g16 launches beside the shipped picks): the
#      sweep, its winners merged into the table, then the engine A/B (Q4_K_M B = 8 / 64, RUNS, "old": the
#      table without g16).
# $OUT keeps at most 8 files: pytest-g16.txt, g16_tiles.md, sweep.log, merge.txt, the merged
# gguf_repacked_table.json and the A/B's per-run JSONs (RUNS of 3 sides at most).
# Environment: TILES (1), ROWS, CONFIGS, RUNS (new,old,new), OUT.
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
ROWS=${ROWS:-8,16,32,64}
CONFIGS=${CONFIGS:-f16s-n128-p256,f16s-n128,f16s-n128-p512,f16-n128,int-n64-g1-s3,int-n64-g1-p256,int-n64-g1-s3-p256,g16-n128-s1-p256,g16-n128-s1-p128,g16-n64-p512,g16-n64-p256,g16-n64-s1-p512}
mkdir -p "$OUT"
[[ -d .ab/old ]] || { echo "no .ab/old: put the old side's table there (see the header)"; exit 1; }
install_wheels || exit 1
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
say "1: g16 tests on the GPU"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gguf_g16.py > "$OUT/pytest-g16.txt" 2>&1
status=$?
tail -3 "$OUT/pytest-g16.txt"
[[ $status == 0 ]] || { echo "g16 tests failed (rc $status): nothing timed (pytest-g16.txt)"; exit 1; }
if [[ ${TILES:-1} == 1 ]]; then
    say "2: many-row tiles"
    timeout 200 python3 bench/gpu_gguf_g16_tiles.py --out "$OUT/tiles" > "$OUT/tiles.log" 2>&1 || echo "tiles: rc $?"
    tail -12 "$OUT/tiles.log"
    cp "$OUT/tiles/g16_tiles.md" "$OUT/" 2>/dev/null
    rm -rf "$OUT/tiles" "$OUT/tiles.log"
fi
say "3: sweep, merge, engine A/B"
WHEELS=0 TYPES=Q4_K ROWS=$ROWS CONFIGS=$CONFIGS RUNS=${RUNS:-new,old,new} OUT=$OUT bash bench/gpu_prepared_rows.sh
rm -rf "$OUT"/run-* "$OUT/pytest.txt"
