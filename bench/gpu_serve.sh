#!/usr/bin/env bash
# One device call: kernel tests on the GPU, the engine table (bench/gpu.py), then the server
# through HTTP with `1bit bench`. Run from the repo root with .whl carried (tools/device_wheels.sh).
# Usage: bash bench/gpu_serve.sh [CONCURRENCY] [GPU_PY_ARGS...]
set -u
. "$(dirname "$0")/device_lib.sh"
CONC=${1:-1,8,32,64}
shift || true
start_script
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py > "$OUT/kernels.log" 2>&1
tail -3 "$OUT/kernels.log"
python3 bench/make_shape_model.py /tmp/qwen3-8b-shape > /dev/null
python3 -m onebit.cli bench --serve "-m /tmp/qwen3-8b-shape --load-format dummy --device cuda --parallel 64 --ctx-size 1024 --max-batch-tokens 8192" \
  --concurrency "$CONC" --max-tokens 128 --prompts random:128 --label 1bit-h200 --out "$OUT/serve" --no-progress \
  > "$OUT/serve.log" 2>&1
grep -A12 "total tok/s" "$OUT/serve.log" | head -30
python3 bench/gpu.py --out "$OUT" "$@" > "$OUT/gpu.log" 2>&1
grep -v "loading weights" "$OUT/gpu.log" | tail -25
