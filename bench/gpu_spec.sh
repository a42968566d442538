#!/usr/bin/env bash
# One device call for speculative decoding on the H200 (~6 min). Run from the repo root with
# .whl carried (tools/device_wheels.sh):
#   1. GPU kernel and CUDA-graph tests;
#   2. bench/gpu_spec.py: greedy equality (graphs / eager / MTP / n-gram on CUDA) and the oracle
#      table (speed-up against acceptance, one request, Qwen3-8B shape);
#   3. "free under load": `1bit serve --parallel 64` with and without --mtp (random MTP head on
#      the 8B shape: drafts are never right, so the policy must stop drafting) at 1,4,8,16,64.
# Usage: OUT=DIR bash bench/gpu_spec.sh [CONCURRENCY]
set -u
CONC=${1:-1,4,8,16,64}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_cuda_graph_inputs.py > "$OUT/tests.log" 2>&1
tail -2 "$OUT/tests.log"
python3 bench/gpu_spec.py --out "$OUT" > "$OUT/spec.log" 2>&1 || tail -30 "$OUT/spec.log"
python3 bench/make_shape_model.py /tmp/qwen3-8b-shape > /dev/null
SERVE="-m /tmp/qwen3-8b-shape --load-format dummy --device cuda --parallel 64 --ctx-size 1024 --max-batch-tokens 8192"
for variant in plain mtp; do
  extra=""
  [[ $variant == mtp ]] && extra="--mtp"
  python3 -m onebit.cli bench --serve "$SERVE $extra" --concurrency "$CONC" --max-tokens 128 --prompts random:128 \
    --label "$variant" --out "$OUT/load" --no-progress > "$OUT/load-$variant.log" 2>&1 || tail -20 "$OUT/load-$variant.log"
done
python3 -m onebit.cli bench report "$OUT/load/plain.json" "$OUT/load/mtp.json" --out "$OUT/load" > "$OUT/load-report.log" 2>&1
cat "$OUT/load/report.md" 2>/dev/null || tail -20 "$OUT/load-report.log"
echo
cat "$OUT/spec.md" 2>/dev/null
# At most 8 files come back from a device call: pack everything into one.
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/spec-results.tgz"
