#!/usr/bin/env bash
# Quick server check on the H200 (~2 min): `1bit serve --parallel 64` on the Qwen3-8B shape (random
# bf16 weights, --fill-vocab), `1bit bench` at C=8 and 64 (128 random prompt tokens, 128 new), and
# the engine's step summary from the server log (graph replays vs eager, seconds inside steps).
# Run from the repo root with .whl carried:  OUT=DIR bash bench/gpu_serve64.sh [LEVELS]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
python3 bench/make_shape_model.py /tmp/qwen3-8b-shape --fill-vocab > /dev/null || exit 1
python3 -m onebit.cli bench --serve "-m /tmp/qwen3-8b-shape --load-format dummy --device cuda --parallel 64 --ctx-size 1024 --max-batch-tokens 8192" \
  --concurrency "${1:-8,64}" --max-tokens 128 --prompts random:128 --label parallel-64 --out "$OUT" --no-progress > "$OUT/bench.log" 2>&1
grep -A6 "total tok/s" "$OUT/bench.log" | grep "^|" | head -8
grep -h "forwards" "$OUT"/*.log
