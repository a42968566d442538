#!/usr/bin/env bash
# Server against its own engine at 64 streams on the H200 (#19), the same workload three ways:
# 1. the engine alone, 2. the engine in its worker process behind NativeBackend (pipe, no HTTP),
# 3. `1bit serve --parallel 64` driven by `1bit bench` (HTTP, SSE, client processes), with the CPU
#    the server's front process, its worker and the bench clients spent (bench/front_cpu.py).
# Qwen3-8B shape (random bf16 weights, --fill-vocab), closed loop of C=64 streams, REQUESTS requests
# of 128 random prompt tokens + 128 new (a fixed count, not a duration: all three run the same
# requests, ramp-up and tail included). Overlap is on (the CUDA default) in all three.
# Run from the repo root with .whl carried:  OUT=DIR [REQUESTS=512] [PROFILE=1] [QUANTIZE=fp8] bash bench/gpu_host_overhead.sh
set -u
. "$(dirname "$0")/device_lib.sh"
REQUESTS=${REQUESTS:-512}
QUANT_ARGS=${QUANTIZE:+--quantize $QUANTIZE}
start_script
python3 bench/make_shape_model.py /tmp/qwen3-8b-shape --fill-vocab > /dev/null || exit 1
python3 bench/host_profile.py -m /tmp/qwen3-8b-shape --load-format dummy --device cuda --concurrency 64 \
  --requests "$REQUESTS" --prompt-tokens 128 --max-tokens 128 --ctx-size 1024 --max-batch-tokens 8192 $QUANT_ARGS \
  --json "$OUT/host_profile.json" > "$OUT/host_profile.log" 2>&1
SERVE="-m /tmp/qwen3-8b-shape --load-format dummy --device cuda --parallel 64 --ctx-size 1024 --max-batch-tokens 8192 $QUANT_ARGS"
python3 bench/front_cpu.py --serve "$SERVE" --concurrency 64 --requests "$REQUESTS" --max-tokens 128 \
  --prompts random:128 --out "$OUT/server" > "$OUT/server.log" 2>&1
# The front's CPU per SSE event on this host's CPU, with no model and no sockets (a few seconds).
python3 bench/front_speed.py --in-process --concurrency 64 --requests "$REQUESTS" --step-ms 7 > "$OUT/front_app.log" 2>&1
grep -v "^INFO" "$OUT/host_profile.log" | tail -16
echo "== 1bit serve --parallel 64, 1bit bench C=64, $REQUESTS requests"
grep -A6 "total tok/s" "$OUT/server.log" | grep "^|" | head -4
grep -h "forwards" "$OUT/server"/*.log 2>/dev/null | tail -1
echo "== CPU over the bench (front: 1bit serve's event loop; near 100% busy it is the server's limit)"
grep -A5 "^| process" "$OUT/server.log"
tail -1 "$OUT/front_app.log"
python3 - "$OUT" <<'PY'
import json, sys, glob
out = sys.argv[1]
f = json.load(open(f"{out}/host_profile.json"))
runs = [json.load(open(p)) for p in glob.glob(f"{out}/server/*.json")]
levels = [lv for r in runs for lv in (r.get("levels") or r.get("results") or []) if isinstance(lv, dict)]
server = next((lv["summary"]["total_tok_s"] for lv in levels if lv.get("concurrency") == 64 and "summary" in lv), None)
engine, backend = f["engine"]["tok_s"], f["backend"]["tok_s"]
print(f"| engine alone | {engine:,.0f} tok/s | 1.00x |")
print(f"| worker + pipe (NativeBackend) | {backend:,.0f} tok/s | {backend / engine:.2f}x |")
print(f"| HTTP server (1bit bench) | {server:,.0f} tok/s | {server / engine:.2f}x |" if server else "| HTTP server | see server.log |")
PY
# PROFILE=1: once more, the served run with its worker under cProfile (slower, so its figures are
# not the table's): where a served 64-stream step's host time goes on the device's CPU, waits for
# the GPU included (the functions that resolve sampled tokens); the 25 costliest by own time and by
# cumulative time.
if [ "${PROFILE:-0}" = 1 ]; then
  ONEBIT_WORKER_PROFILE="$OUT/worker.prof" python3 bench/front_cpu.py --serve "$SERVE" --concurrency 64 \
    --requests "$REQUESTS" --max-tokens 128 --prompts random:128 --out "$OUT/server_profiled" \
    > "$OUT/server_profiled.log" 2>&1
  python3 - "$OUT/worker.prof" > "$OUT/worker_profile.txt" <<'PY'
import pstats, sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("tottime").print_stats(25)
stats.sort_stats("cumulative").print_stats(25)
PY
  grep -E "^ +[0-9]" "$OUT/worker_profile.txt" | head -25
fi
