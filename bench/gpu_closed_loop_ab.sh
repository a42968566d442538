#!/usr/bin/env bash
# A/B of the engine's host work per step between two source trees, on the device: bench/closed_loop.py
# (the engine driven directly, 64 requests in flight, per-phase host milliseconds per step) run for
# tree A and tree B, alternating, so drift on the machine hits both alike.
#
#   mkdir -p .peers/old && git archive COMMIT | tar -x -C .peers/old
#   run(command="OUT=$OUT bash bench/gpu_closed_loop_ab.sh", carry=[".peers/old"], timeout_s=600)
#
# Environment: A (.peers/old), B (.: this tree), ROUNDS (2), CONC (64), REQUESTS (256), ARGS ("--stagger"),
# PY (python3). Under $OUT: one log per run and ab.md with the lines that matter.
set -u
OUT=${OUT:-/tmp/out}; A=${A:-.peers/old}; B=${B:-.}; ROUNDS=${ROUNDS:-2}; CONC=${CONC:-64}
REQUESTS=${REQUESTS:-256}; ARGS=${ARGS:---stagger}; PY=${PY:-python3}
mkdir -p "$OUT"
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
: > "$OUT/ab.md"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    tree=${!side}
    log="$OUT/$side-$round.log"
    (cd "$tree" && PYTHONPATH=. timeout 280 $PY bench/closed_loop.py --shape qwen3-8b --device cuda \
       --concurrency "$CONC" --requests "$REQUESTS" $ARGS) > "$log" 2>&1
    { echo "## $side round $round ($tree)"; grep -E "^overlap|forwards|^bf16 picks|^\|" "$log"; echo; } >> "$OUT/ab.md"
  done
done
cat "$OUT/ab.md"
