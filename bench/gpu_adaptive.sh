#!/usr/bin/env bash
# The seed's adaptive table on the H200 (~6 min): total tokens/s at 1..64 simultaneous requests
# through `1bit serve` for --parallel 8, --parallel 64 and --adaptive --adaptive-at 8 (two native
# backends on the one GPU: 8 slots, then 64), Qwen3-8B shape, random bf16 weights, 128+128 tokens.
# Run from the repo root with .whl carried (tools/device_wheels.sh):
#   OUT=DIR bash bench/gpu_adaptive.sh [CONCURRENCY]
set -u
CONC=${1:-1,2,4,8,12,16,24,32,64}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
python3 bench/make_shape_model.py /tmp/qwen3-8b-shape > /dev/null
BASE="-m /tmp/qwen3-8b-shape --load-format dummy --device cuda --ctx-size 1024 --max-batch-tokens 8192"
declare -A ARGS=(
  [parallel-8]="--parallel 8"
  [parallel-64]="--parallel 64"
  [adaptive-at-8]="--parallel 8 --adaptive --adaptive-at 8 --adaptive-slots 64"
)
for label in parallel-8 parallel-64 adaptive-at-8; do
  python3 -m onebit.cli bench --serve "$BASE ${ARGS[$label]}" --serve-timeout 300 --concurrency "$CONC" \
    --max-tokens 128 --prompts random:128 --label "$label" --out "$OUT/runs" --no-progress \
    > "$OUT/$label.log" 2>&1 || tail -20 "$OUT/$label.log"
done
python3 -m onebit.cli bench report "$OUT"/runs/parallel-8.json "$OUT"/runs/parallel-64.json \
  "$OUT"/runs/adaptive-at-8.json --out "$OUT/runs" > "$OUT/report.log" 2>&1
cat "$OUT/runs/report.md" 2>/dev/null || tail -20 "$OUT/report.log"
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/adaptive-results.tgz"
