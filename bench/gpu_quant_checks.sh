#!/usr/bin/env bash
# The 1-row packed GGUF and FP8-handoff checks in one device call (~5 min on an H200; carry .whl,
# tools/device_wheels.sh); session 15 ran it as G33 (docs/perf-history.md):
#   A. packed GGUF at 1 row (bench/gpu_gguf_repacked.py --rows 1): fma-n64-g2 (the table's pick)
#      against the mode "i8" candidates, Q4_K and Q8_0;
#   B. Nsight Compute on those 1-row launches at the head (bench/gpu_gguf_stalls.py): what fma and
#      i8 wait on (throughput, warp stalls, memory); skipped with a line if ncu is missing or fails;
#   C. the FP8 producers' e4m3 handoff (bench/gpu_fp8_fuse.py): fused kernels alone, and engine
#      decode tok/s at B = 1/8/64/256 for bf16, fp8, fp8-fuse (the norms) and fp8-fuse-all.
# Usage: run(command="OUT=$OUT bash bench/gpu_quant_checks.sh", carry=[".whl"], timeout_s=600)
# Environment: PARTS (ABC), CONFIGS (part A's configs), OUT. Each part has its own time limit; the
# tables are printed last, the logs are in $OUT.
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
PARTS=${PARTS:-ABC}
CONFIGS=${CONFIGS:-fma-n64-g2,i8-n32-g4-s1,i8-n128-g1-q4,i8-n64-g2-q4,i8-n128-g1-q2}
mkdir -p "$OUT"
install_wheels || exit 1
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if [[ $PARTS == *A* ]]; then
    say "A: 1-row sweep"
    timeout 150 python3 bench/gpu_gguf_repacked.py --out "$OUT/one_row" --rows 1 --types Q4_K,Q8_0 \
        --configs "$CONFIGS" > "$OUT/one_row.log" 2>&1 || echo "part A: rc $? (log: one_row.log)"
fi
if [[ $PARTS == *B* ]]; then
    say "B: ncu"
    if command -v ncu > /dev/null; then
        timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
            python3 bench/gpu_gguf_stalls.py --configs "Q4_K:fma-n64-g2,Q4_K:i8-n32-g4-s1,Q4_K:i8-n128-g1-q4,Q8_0:fma-n64-g2" \
            > "$OUT/ncu.txt" 2>&1 || echo "part B: rc $? (log: ncu.txt)"
    else
        echo "part B: no ncu on this machine"
    fi
fi
if [[ $PARTS == *C* ]]; then
    say "C: FP8 producers"
    timeout 300 python3 bench/gpu_fp8_fuse.py --out "$OUT/fp8_fuse" > "$OUT/fp8_fuse.log" 2>&1 \
        || echo "part C: rc $? (log: fp8_fuse.log)"
fi
say "done"
echo "== A: 1-row packed GGUF (us per product; geometric means last)"
grep -E "^\| " "$OUT/one_row/gguf_repacked.md" 2>/dev/null | tail -24
echo "== B: ncu (kernel, duration, throughputs, top stalls)"
grep -E "_kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued|Stall" \
    "$OUT/ncu.txt" 2>/dev/null | head -60
grep -E "^lm_head" "$OUT/ncu.txt" 2>/dev/null
echo "== C: FP8 producers and engines"
grep -E "^\| " "$OUT/fp8_fuse/fp8_fuse.md" 2>/dev/null
