#!/usr/bin/env bash
# The CPU tables of docs/perf.md (in full: docs/perf-history.md), on a tiny Qwen3 (4 layers,
# hidden 128): engine alone by batch, the server by concurrency, and the seed's adaptive table.
# About 10 minutes on 2 cores.
# Usage: bash bench/cpu_tables.sh OUT_DIR
set -eu
OUT=${1:?output directory}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
M="$OUT/tiny-qwen3"
[ -d "$M" ] || "$PY" -m onebit.testing.tiny "$M" --arch qwen3 --layers 4 --hidden 128 --vocab 1024 > /dev/null
export TQDM_DISABLE=1
"$PY" -m onebit.cli bench --offline -m "$M" --batch 1,8,32,64 --max-tokens 128 --prompt-tokens 128 --device cpu \
  | tee "$OUT/offline.md"
"$PY" -m onebit.cli bench --serve "-m $M --parallel 32 --device cpu" --concurrency 1,8,32 --max-tokens 128 \
  --prompts random:128 --label serve-p32 --out "$OUT/serve" --no-progress | grep -A5 "^| total"
for cfg in "p8:--parallel 8" "p16:--parallel 16" "adaptive8:--parallel 8 --adaptive --adaptive-at 8 --adaptive-slots 16"; do
  label=${cfg%%:*}; args=${cfg#*:}
  "$PY" -m onebit.cli bench --serve "-m $M --device cpu $args" --concurrency 1,2,4,8,12,16,24 --max-tokens 64 \
    --prompts random:64 --label "$label" --out "$OUT/adaptive" --no-progress | grep -A3 "^| total"
done
"$PY" -m onebit.cli bench report "$OUT"/adaptive/p8.json "$OUT"/adaptive/p16.json "$OUT"/adaptive/adaptive8.json \
  --out "$OUT/adaptive-report" | head -8
