#!/usr/bin/env bash
# One device call for speculative decoding on the H200 (~1.5 min). Run from the repo root with
# .whl carried (tools/device_wheels.sh):
#   1. GPU kernel and CUDA-graph tests;
#   2. bench/gpu_spec.py: greedy equality (graphs / eager / MTP / n-gram on CUDA) and the oracle
#      table (speed-up against acceptance, one request, Qwen3-8B shape).
# "Free under load" (--mtp through the server) is in bench/gpu_tables.sh.
# Usage: OUT=DIR bash bench/gpu_spec.sh   (DETERMINISTIC=1: the oracle table with --deterministic)
set -u
. "$(dirname "$0")/device_lib.sh"
start_script
python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_cuda_graph_inputs.py > "$OUT/tests.log" 2>&1
tail -2 "$OUT/tests.log"
python3 bench/gpu_spec.py --out "$OUT" ${DETERMINISTIC:+--deterministic} > "$OUT/spec.log" 2>&1 || tail -30 "$OUT/spec.log"
cat "$OUT/spec.md" 2>/dev/null
# At most 8 files come back from a device call: pack everything into one.
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/spec-results.tgz"
