#!/usr/bin/env bash
# #18's seed table on the H200 in one device call (~7 min): Qwen3-8B shape, random bf16 weights, every
# token with a text of its own (--fill-vocab), 128 random prompt tokens, 128 new, closed loop, at
# 1,2,4,8,12,16,24,32,64 requests, for:
#   - --parallel 64 (no drafting),
#   - --parallel 8 with the oracle drafter at P (a stand-in for a trained MTP head: a random head's
#     drafts are never right),
#   - --adaptive --adaptive-at 8 (one engine, 64 slots in all) with the same oracle drafter: drafting
#     while at most 8 requests run, plain batched steps above.
# The oracle proposes the recorded greedy output of each prompt (bench/oracle_record.py records the
# bench's own prompt pools first). Run from the repo root with .whl carried (tools/device_wheels.sh):
#     OUT=DIR bash bench/gpu_adaptive.sh            (P=0.75 unless P is set; SHAPE=qwen3-8b)
# DET=1 records and serves with --deterministic: in bf16 the default kernels make a request's greedy
# output depend on its batch, so the record stops matching after a few tokens and the oracle's
# acceptance falls far below P (10-27% at P=0.75 in the first run); deterministic mode keeps it.
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
LEVELS=${LEVELS:-1,2,4,8,12,16,24,32,64}
# Requests per level: the bench's default (4 per client) leaves the 64-stream level ~1.3 s long, and
# --parallel 64 alone read 5,501 and 6,684 tok/s there in two runs; 8 per client at 64 steadies it.
# REQUESTS= (empty) for the bench's default; one count per level otherwise.
if [ -z "${REQUESTS+set}" ]; then
  REQUESTS=""
  [ "$LEVELS" = 1,2,4,8,12,16,24,32,64 ] && REQUESTS=8,8,16,32,48,64,96,128,512
fi
P=${P:-0.75}
SHAPE=${SHAPE:-qwen3-8b}
DEVICE=${DEVICE:-cuda}
DETFLAG=""
[ "${DET:-0}" = 1 ] && DETFLAG="--deterministic"
REQFLAG=""
[ -n "$REQUESTS" ] && REQFLAG="--requests $REQUESTS"
mkdir -p "$OUT"
if [ -d .whl ]; then
  install_wheels || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
MODEL=/tmp/$SHAPE-shape
python3 bench/make_shape_model.py $MODEL --shape "$SHAPE" --fill-vocab > /dev/null || exit 1
python3 bench/oracle_record.py -m $MODEL --load-format dummy --device "$DEVICE" --concurrency "$LEVELS" $DETFLAG \
  $REQFLAG --out /tmp/record.jsonl || exit 1
BASE="-m $MODEL --load-format dummy --device $DEVICE --ctx-size 1024 --max-batch-tokens 8192 $DETFLAG"
ORACLE="--draft oracle:$P --draft-record /tmp/record.jsonl"
run() {  # label, serve args
  python3 -m onebit.cli bench --serve "$BASE $2" --serve-timeout 300 --concurrency "$LEVELS" $REQFLAG --max-tokens 128 \
    --prompts random:128 --label "$1" --out "$OUT/runs" --no-progress > "$OUT/$1.log" 2>&1 || tail -20 "$OUT/$1.log"
  grep -A14 "total tok/s" "$OUT/$1.log" | grep "^|" | head -12
}
# RUNS: which of the three to run (all unless set), e.g. RUNS="parallel-64 adaptive-at-8-oracle".
RUNS=${RUNS:-parallel-64 parallel-8-oracle adaptive-at-8-oracle}
case " $RUNS " in *" parallel-64 "*) run parallel-64 "--parallel 64";; esac
case " $RUNS " in *" parallel-8-oracle "*) run parallel-8-oracle "--parallel 8 $ORACLE";; esac
case " $RUNS " in *" adaptive-at-8-oracle "*)
  run adaptive-at-8-oracle "--parallel 8 --adaptive --adaptive-at 8 --adaptive-slots 56 $ORACLE";; esac
R=$OUT/runs
RAN=$(ls "$R"/parallel-8-oracle.json "$R"/parallel-64.json "$R"/adaptive-at-8-oracle.json 2>/dev/null)
python3 -m onebit.cli bench report $RAN --out $R/adaptive > "$OUT/report.log" 2>&1
cat $R/adaptive/report.md 2>/dev/null || tail -20 "$OUT/report.log"
# At most 8 files come back from a device call: pack everything into one.
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/adaptive.tgz"
