#!/usr/bin/env bash
# The 1-row packed GGUF and FP8-handoff checks in one device call (~5 min on an H200; carry .whl,
# tools/device_wheels.sh); sessions 15 and 16 ran it as G33 (docs/perf-history.md):
#   A. packed GGUF at 1 row (bench/gpu_gguf_repacked.py --rows 1): the table's picks (fma-n64-g2 for
#      Q4_K, fma-n64-g2-p512 for Q8_0, fma-n16-g2-s3-p256 for Q6_K) against mode "i8"'s
#      i8-n32-g4-s1 (session 16 dropped the folded offsets and the i8 quads); then
#      tools/merge_repacked_table.py on it (printed; --write here if a pick wins by 15%);
#   B. Nsight Compute on those 1-row launches at the head (bench/gpu_gguf_stalls.py): what fma and
#      i8 wait on (throughput, warp stalls, memory); skipped with a line if ncu is missing or fails;
#   C. the FP8 producers' e4m3 handoff (bench/gpu_fp8_fuse.py): fused kernels alone, and engine
#      decode tok/s at B = 1/8/64/256 for bf16, fp8, fp8-fuse (as shipped) and fp8-fuse-norms;
#   D. Nsight Compute on the table's mode "int" launches at 8 and 64 rows (gate_up, Q4_K / Q6_K).
# Usage: run(command="OUT=$OUT bash bench/gpu_quant_checks.sh", carry=[".whl"], timeout_s=600)
# Environment: PARTS (default ABC; D on request), CONFIGS (part A's configs), OUT. Each part has its
# own time limit; the tables are printed last, the logs are in $OUT.
set -u
. "$(dirname "$0")/device_lib.sh"
PARTS=${PARTS:-ABC}
CONFIGS=${CONFIGS:-fma-n64-g2,fma-n64-g2-p512,fma-n16-g2-s3-p256,i8-n32-g4-s1}
start_script
if [[ $PARTS == *A* ]]; then
    say "A: 1-row sweep"
    timeout 150 python3 bench/gpu_gguf_repacked.py --out "$OUT/one_row" --rows 1 --types Q4_K,Q8_0,Q6_K \
        --configs "$CONFIGS" > "$OUT/one_row.log" 2>&1 || echo "part A: rc $? (log: one_row.log)"
    python3 tools/merge_repacked_table.py "$OUT/one_row" > "$OUT/one_row_merge.md" 2>&1
fi
# ncu_stalls FILE ARGS...: bench/gpu_gguf_stalls.py ARGS under Nsight Compute into $OUT/FILE
ncu_stalls() {
    local file=$1
    shift
    if ! command -v ncu > /dev/null; then
        echo "ncu: not on this machine"
        return
    fi
    timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        python3 bench/gpu_gguf_stalls.py "$@" > "$OUT/$file" 2>&1 || echo "ncu: rc $? (log: $file)"
}
if [[ $PARTS == *B* ]]; then
    say "B: ncu at 1 row"
    ncu_stalls ncu.txt --configs "Q4_K:fma-n64-g2,Q4_K:i8-n32-g4-s1,Q6_K:fma-n16-g2-s3-p256,Q8_0:fma-n64-g2"
fi
if [[ $PARTS == *D* ]]; then
    # Q4_K_M B=8 / B=64 spend 4.49 / 7.51 ms a step in mode "int" (session 15's G23), ~1 TB/s: what
    # the table's 8- and 64-row launches wait on, at the MLP's gate_up.
    say "D: ncu at 8 and 64 rows"
    ncu_stalls ncu_rows8.txt --product gate_up_proj --rows 8 --configs "Q4_K:int-n64-g1-s3,Q6_K:int-n64-g1-s3"
    ncu_stalls ncu_rows64.txt --product gate_up_proj --rows 64 --configs "Q4_K:int-n64-g1-p256"
fi
if [[ $PARTS == *C* ]]; then
    say "C: FP8 producers"
    timeout 300 python3 bench/gpu_fp8_fuse.py --out "$OUT/fp8_fuse" > "$OUT/fp8_fuse.log" 2>&1 \
        || echo "part C: rc $? (log: fp8_fuse.log)"
fi
say "done"
echo "== A: 1-row packed GGUF (us per product; geometric means last)"
grep -E "^\| " "$OUT/one_row/gguf_repacked.md" 2>/dev/null | tail -40
cat "$OUT/one_row_merge.md" 2>/dev/null
for file in ncu.txt ncu_rows8.txt ncu_rows64.txt; do
    [[ -f $OUT/$file ]] || continue
    echo "== B/D: $file (kernel, duration, throughputs, occupancy, the main stall)"
    grep -E "_kernel|Duration|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|stalled" \
        "$OUT/$file" | head -80
    grep -E "^(lm_head|gate_up_proj) " "$OUT/$file"
done
echo "== C: FP8 producers and engines"
grep -E "^\| " "$OUT/fp8_fuse/fp8_fuse.md" 2>/dev/null
