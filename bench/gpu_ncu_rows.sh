#!/usr/bin/env bash
# Nsight Compute on the packed GGUF kernels at 8-64 rows (#20: modes "f16s" and "int", where the
# Q4_K_M steps at B = 8 / 64 spend their time), one device call (~2-3 min; carry .whl):
#   run(command="OUT=$OUT bash bench/gpu_ncu_rows.sh", carry=[".whl"])
# SPECS: ';'-separated "PRODUCT ROWS TYPE:CONFIG,..." (bench/gpu_gguf_stalls.py's --product, --rows,
# --configs). Prints each launch's time, DRAM and SM throughput, occupancy, registers and the top
# warp stall reasons; the whole ncu report of each spec lands in $OUT/ncu-N.txt.
set -u
. "$(dirname "$0")/device_lib.sh"
SPECS=${SPECS:-"gate_up_proj 64 Q4_K:f16s-n128-p256;o_proj 64 Q4_K:int-n64-g1-p256,Q4_K:f16s-n64-p256;o_proj 8 Q4_K:int-n64-g1-s3,Q4_K:f16s-n128-p512;gate_up_proj 8 Q4_K:f16s-n128-p512"}
start_script
command -v ncu > /dev/null || { echo "ncu: not on this machine"; exit 1; }
i=0
IFS=';' read -ra items <<< "$SPECS"
for spec in "${items[@]}"; do
    read -r product rows configs <<< "$spec"
    i=$((i + 1))
    say "$i: $product at $rows rows: $configs"
    timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        python3 bench/gpu_gguf_stalls.py --product "$product" --rows "$rows" --configs "$configs" > "$OUT/ncu-$i.txt" 2>&1 \
        || echo "ncu: rc $? (log: ncu-$i.txt)"
    grep -E "^  [_a-zA-Z]+.*\(|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Warp Cycles Per Issued|Issue Slots Busy|Stall|stalled|rows $rows:" "$OUT/ncu-$i.txt" | head -60
done
