#!/usr/bin/env bash
# Server check on the H200 (~3 min): `1bit serve --parallel 64` on the Qwen3-8B shape (random
# bf16 weights, --fill-vocab), `1bit bench` at C=8 and 64 (128 random prompt tokens, 128 new,
# 15 s per level so a level is many requests long), once plain and once with each extra flag
# set in VARIANTS (default: --no-overlap; overlap is on by default with CUDA), plus each server's step summary (graph replays vs eager,
# seconds inside steps) from its log.
# Run from the repo root with .whl carried:  OUT=DIR [VARIANTS="--no-overlap"] bash bench/gpu_serve64.sh [LEVELS]
set -u
. "$(dirname "$0")/device_lib.sh"
start_script
python3 bench/make_shape_model.py /tmp/qwen3-8b-shape --fill-vocab > /dev/null || exit 1
SERVE="-m /tmp/qwen3-8b-shape --load-format dummy --device cuda --parallel 64 --ctx-size 1024 --max-batch-tokens 8192"
for extra in "" ${VARIANTS:---no-overlap}; do
  label="parallel-64${extra:+ $extra}"
  dir="$OUT/run${extra// /}"
  mkdir -p "$dir"
  python3 -m onebit.cli bench --serve "$SERVE $extra" --concurrency "${1:-8,64}" --duration 15 --max-tokens 128 \
    --prompts random:128 --label "$label" --out "$dir" --no-progress > "$dir/bench.log" 2>&1
  echo "== $label"
  grep -A6 "total tok/s" "$dir/bench.log" | grep "^|" | head -8
  grep -h "forwards" "$dir"/*.log
done
