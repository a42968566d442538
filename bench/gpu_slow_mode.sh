#!/usr/bin/env bash
# FP8's slow mode (perf.md item 6): every FP8 run of session 34 whose engine timed its products in-process
# decoded B=64 / 256 10-20% under the runs that restored the same choices from the calibration cache. This
# call tells the two kinds of slow apart on one machine, in one call (~6 min, no wheels needed):
#   1. `bench/gpu_step_profile.py --engines fp8 --batches 64,256` with an empty calibration cache: the
#      engine times its products here (its rows say "calibrated here") and writes the cache;
#   2. the same again: the engine restores the choices from the cache;
#   3. with COLD=1, restored again with an empty Triton cache (TRITON_CACHE_DIR): every kernel compiled in
#      the process, as in 1, but nothing timed (a fresh machine's first run is both at once);
#   4. with RELEASE=1, once more with the cache emptied, on a copy of the tree with
#      `runner.RELEASE_CALIBRATION_MEMORY` on.
# Per step each prints wall ms, kernels ms and the gap between them: kernels up in 1 says the graphs'
# kernels run slower after the timing (where their memory landed, the modules loaded); the gap up says
# the host. Run from the repo root:  OUT=DIR [COLD=1] [RELEASE=1] bash bench/gpu_slow_mode.sh
# PROFILE_ARGS replaces the profile's arguments (a CPU try: "--engines bf16 --batches 1 --turnover 0 --steps 2
# --device cpu --shape qwen3-tiny", as tests/test_bench_device_scripts.py runs it).
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}  # ".": the tree a run is in
export ONEBIT_CALIBRATION_CACHE=$(mktemp -d)
profile() {  # $1: the run's name
    say "$1"
    # shellcheck disable=SC2086
    timeout 280 python3 bench/gpu_step_profile.py ${PROFILE_ARGS:---engines fp8 --batches 64,256 --turnover 0} \
        --out "$OUT/$1" > "$OUT/$1.log" 2>&1 || { echo "$1 failed:"; tail -5 "$OUT/$1.log"; }
}
profile timed
profile restored
if [[ ${COLD:-0} == 1 ]]; then
    TRITON_CACHE_DIR=$(mktemp -d) profile restored-cold
fi
if [[ ${RELEASE:-0} == 1 ]]; then
    rm -rf "${ONEBIT_CALIBRATION_CACHE:?}"/*
    tree=$(mktemp -d)  # a copy of the tree with the switch on
    copy_tree "$tree"
    switch_on "$tree/onebit/engine/runner.py" RELEASE_CALIBRATION_MEMORY || {
        echo "no line \"RELEASE_CALIBRATION_MEMORY = False\" in onebit/engine/runner.py"; exit 1; }
    (cd "$tree" && profile released)
    rm -rf "$tree"
fi
for run in timed restored restored-cold released; do
    [[ -f $OUT/$run/step_profile.md ]] || continue
    echo "== $run"
    awk '/^\|/ {shown = 1; print; next} shown {exit}' "$OUT/$run/step_profile.md"  # the decode table
done
