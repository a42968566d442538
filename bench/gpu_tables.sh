#!/usr/bin/env bash
# Server tables on the H200 in one device call (~8 min), Qwen3-8B shape, random bf16 weights, every
# token with a text of its own (--fill-vocab), 128 random prompt tokens, 128 new, closed loop:
#   - the seed's adaptive table: --parallel 8, --parallel 64, --adaptive --adaptive-at 8 (two
#     native backends on the one GPU: 8 slots, then 64) at 1,2,4,8,12,16,24,32,64 requests;
#   - --parallel 64 --mtp (a random MTP head: drafts are never right, so drafting must cost
#     nothing) at 1,4,8,16,64, against --parallel 64 at the same levels.
# Run from the repo root with .whl carried (tools/device_wheels.sh):  OUT=DIR bash bench/gpu_tables.sh
set -u
. "$(dirname "$0")/device_lib.sh"
LEVELS=${LEVELS:-1,2,4,8,12,16,24,32,64}
MTP_LEVELS=${MTP_LEVELS:-1,4,8,16,64}
start_script
python3 bench/make_shape_model.py /tmp/qwen3-8b-shape --fill-vocab > /dev/null || exit 1
BASE="-m /tmp/qwen3-8b-shape --load-format dummy --device cuda --ctx-size 1024 --max-batch-tokens 8192"
run() {  # label, levels, serve args
  python3 -m onebit.cli bench --serve "$BASE $3" --serve-timeout 300 --concurrency "$2" --max-tokens 128 \
    --prompts random:128 --label "$1" --out "$OUT/runs" --no-progress > "$OUT/$1.log" 2>&1 || tail -20 "$OUT/$1.log"
  grep -A14 "total tok/s" "$OUT/$1.log" | grep "^|" | head -12
}
run parallel-64 "$LEVELS" "--parallel 64"
run parallel-8 "$LEVELS" "--parallel 8"
run adaptive-at-8 "$LEVELS" "--parallel 8 --adaptive --adaptive-at 8 --adaptive-slots 64"
run parallel-64-mtp "$MTP_LEVELS" "--parallel 64 --mtp"
R=$OUT/runs
python3 -m onebit.cli bench report $R/parallel-8.json $R/parallel-64.json $R/adaptive-at-8.json --out $R/adaptive \
  > "$OUT/report.log" 2>&1
python3 -m onebit.cli bench report $R/parallel-64.json $R/parallel-64-mtp.json --out $R/mtp >> "$OUT/report.log" 2>&1
cat $R/adaptive/report.md $R/mtp/report.md 2>/dev/null || tail -20 "$OUT/report.log"
# At most 8 files come back from a device call: pack everything into one.
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/tables.tgz"
