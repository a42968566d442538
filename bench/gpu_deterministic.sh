#!/usr/bin/env bash
# One device call for --deterministic (~5 min on an H200). Run from the repo root with .whl carried
# (tools/device_wheels.sh): bench/gpu_deterministic.py prints kernel row checks, "identical"
# per comparison with and without --deterministic, and the decode cost table last.
# Usage: OUT=DIR bash bench/gpu_deterministic.sh
set -u
. "$(dirname "$0")/device_lib.sh"
start_script
python3 bench/gpu_deterministic.py --out "$OUT" > "$OUT/deterministic.log" 2>&1 || tail -40 "$OUT/deterministic.log"
cat "$OUT/deterministic.md" 2>/dev/null
