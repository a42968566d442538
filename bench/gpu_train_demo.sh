#!/usr/bin/env bash
# One device call that trains 1bit's built-in demo model v2 on the H200 (~5-8 min, no wheels):
# corpus (all permissively licensed Python on the machine, deduplicated) + chat pairs made from
# its documented functions, tokenizer, Qwen3 + MTP training for at most 2 epochs or the clock,
# best checkpoint by validation loss, evaluation of the exported bf16 weights, output.
#   Usage: OUT=DIR bash bench/gpu_train_demo.sh
# Returns (<= 8 files, each <= 16 MiB): model.safetensors.partNN (15 MiB pieces),
# demo_model_files.tar (config, tokenizer, metrics.json, MODEL_CARD.md, PARTS.json), train.log.
# The best-so-far model is packaged during training too, so a run cut short still returns one.
# Reassemble: python3 tools/assemble_demo.py FILES_DIR onebit/assets/demo
# The last lines printed are the summary table (losses, parse counts, chat check, MTP acceptance).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1
# The whole call must end within 600 s: the run plans its stages to end by DEADLINE minutes
# (training is cut to fit), and `timeout` stops it for sure 25 s before the limit.
DEADLINE=${DEADLINE:-8.7}
timeout -k 5 565 python3 tools/train_demo.py --out /tmp/demo_model --package-to "$OUT" --seed 0 \
    --minutes 6.5 --deadline-minutes "$DEADLINE" 2>&1 | tee "$OUT/train.log"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
    echo "train_demo.py exited with $status; what was packaged last:"
fi
ls -l "$OUT"
