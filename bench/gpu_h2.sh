#!/usr/bin/env bash
# Mode "h2" (Q4_K and Q6_K at one row in float16 pairs, onebit/kernels/triton_gguf_h2.py) in one device call
# (~5-6 min on an H200; carry .whl, tools/device_wheels.sh); session 18 ran it as G36:
#   1. tests/test_gguf_h2.py on the GPU (the inline-PTX path against the float64 reference);
#   2. the 1-row sweep of TYPES (bench/gpu_gguf_repacked.py): the h2 candidates against the fma picks,
#      and then the engine at B = 1 on that sweep's table (bf16, Q4_K_M packed and dequantized, Q8_0
#      packed), unless ENGINE=0;
#   3. Nsight Compute at NCU_PRODUCT on NCU_CONFIGS (skipped with a line if ncu is missing; NCU=0 skips it);
#   4. with G26=1: the engine at B = 1 / 8 / 64 (bench/gpu_gguf_quant.py --skip-kernels) on the shipped
#      table overlaid by this sweep's picks, and with FP8=1 the FP8 engine (fp8-fuse) at B = 1 / 64.
# Usage: run(command="OUT=$OUT bash bench/gpu_h2.sh", carry=[".whl"], timeout_s=600)
# Environment: CONFIGS (the sweep's), TYPES, NCU, NCU_CONFIGS, NCU_PRODUCT, ENGINE, G26, G26_RUNS (gpu_gguf_quant.py
# --runs), FP8, OUT. The
# defaults are the fourth call's configs; the second ran TYPES=Q4_K with i8-n32-g4-s1 and more h2
# launches, ncu on Q4_K at gate_up_proj; the third the Q6_K sweep with ncu at down_proj; the fourth
# ENGINE=0 NCU=0 G26=1 FP8=1.
set -u
. "$(dirname "$0")/device_lib.sh"
TYPES=${TYPES:-Q4_K,Q6_K}
CONFIGS=${CONFIGS:-h2-n64-t2-s1,h2-n128-t1-s1,h2-n64-t2-s0,h2-n128-t1-s0,h2-n64-t2-s0-p1024,h2-n64-t2-s0-p256,h2-n64-t2-p256}
NCU_CONFIGS=${NCU_CONFIGS:-Q6_K:h2-n64-t2-s1,Q6_K:h2-n128-t1-s1,Q6_K:fma-n16-g2-s3-p256}
start_script
say "1: tests on the GPU"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gguf_h2.py > "$OUT/pytest.txt" 2>&1
tail -1 "$OUT/pytest.txt"
say "2: 1-row sweep"
engine=()
[[ ${ENGINE:-1} == 1 ]] && engine=(--engine --batches 1)
timeout 360 python3 bench/gpu_gguf_repacked.py --out "$OUT/sweep" --types "$TYPES" --rows 1 --configs "$CONFIGS" \
    "${engine[@]}" > "$OUT/sweep.log" 2>&1 || echo "sweep: rc $? (log: sweep.log)"
if [[ ${NCU:-1} == 0 ]]; then
    echo "ncu: skipped (NCU=0)"
elif command -v ncu > /dev/null; then
    say "3: ncu at ${NCU_PRODUCT:-down_proj}"
    timeout 120 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        python3 bench/gpu_gguf_stalls.py --product "${NCU_PRODUCT:-down_proj}" --configs "$NCU_CONFIGS" > "$OUT/ncu.txt" 2>&1 \
        || echo "ncu: rc $? (log: ncu.txt)"
    grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|L1/TEX Hit|Issue Slots Busy|Warp Cycles Per Issued|Registers Per" "$OUT/ncu.txt" | head -60
else
    echo "ncu: not on this machine"
fi
tail -40 "$OUT/sweep.log"
if [[ ${G26:-0} == 1 ]]; then
    say "4: engine B = 1 / 8 / 64 on the shipped table and this sweep's picks"
    ONEBIT_GGUF_REPACKED_TABLE="$OUT/sweep/gguf_repacked_table.json" timeout 280 python3 bench/gpu_gguf_quant.py \
        --runs "${G26_RUNS:-bf16,q4km-packed,q4km-dequantized,q8-packed}" \
        --out "$OUT/g26" --skip-kernels --batches 1,8,64 > "$OUT/g26.log" 2>&1 || echo "g26: rc $? (log: g26.log)"
    tail -12 "$OUT/g26.log"
fi
if [[ ${FP8:-0} == 1 ]]; then
    say "5: FP8 engine"
    timeout 240 python3 bench/gpu_fp8_fuse.py --out "$OUT/fp8" --engines fp8-fuse --batches 1,64 > "$OUT/fp8.log" 2>&1 \
        || echo "fp8: rc $? (log: fp8.log)"
    tail -8 "$OUT/fp8.log"
fi
