#!/usr/bin/env bash
# A/B of a change to a few files, in the engine, in one device call (carry .whl and .ab):
#   here:    mkdir -p .ab/old/onebit/kernels && git show REV:onebit/kernels/FILE.py > .ab/old/onebit/kernels/FILE.py
#   device:  run(command="OUT=$OUT bash bench/gpu_file_ab.sh", carry=[".whl", ".ab"], timeout_s=600)
# "new" is the tree as carried; "old" a copy of its onebit/, bench/, tests/ and tools/ with every file under .ab/old laid over
# it (same relative paths). The runs alternate (RUNS, default new,old,new,old) so that a machine's
# drift shows as a spread within each side instead of a difference between them; each run is
# bench/gpu_gguf_quant.py --skip-kernels (G26) with RUN_ARGS, its JSON kept as $OUT/SIDE-I.json (old-2.json, ...), and a
# table of decode tok/s per run is printed last. Session 20 left this for the unrolled prepare_x and
# norm loops (7546150): `git show 7546150~1:onebit/kernels/triton_gguf_f16.py`.
# Environment: RUNS, RUN_ARGS (--runs q4km-packed --batches 8,64), OLD (.ab/old), WHEELS (1), OUT. A CPU try
# of the mechanics: PATH=$PWD/.venv/bin:$PATH WHEELS=0 RUNS=new,old
#   RUN_ARGS="--runs q4km-packed --batches 1 --shape qwen3-tiny --device cpu" bash bench/gpu_file_ab.sh
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
RUNS=${RUNS:-new,old,new,old}
RUN_ARGS=${RUN_ARGS:---runs q4km-packed --batches 8,64}
OLD=${OLD:-.ab/old}
mkdir -p "$OUT"
[[ -d $OLD ]] || { echo "no $OLD: put the old versions of the files there (see the header)"; exit 1; }
if [[ ${WHEELS:-1} == 1 ]]; then install_wheels || exit 1; fi  # WHEELS=0: a CPU try in the venv
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OLD_TREE=/tmp/ab-old
rm -rf "$OLD_TREE" && mkdir -p "$OLD_TREE" && cp -r onebit bench tests tools "$OLD_TREE"/ && cp -r "$OLD"/. "$OLD_TREE"/
say "old tree: $(cd "$OLD" && find . -type f | tr '\n' ' ')"
i=0
IFS=',' read -ra sides <<< "$RUNS"
for side in "${sides[@]}"; do
    i=$((i + 1))
    if [[ $side == old ]]; then root=$OLD_TREE; else root=$PWD; fi
    say "$i: $side"
    # shellcheck disable=SC2086
    (cd "$root" && PYTHONPATH=$WHEEL_SITE:$root timeout 200 python3 bench/gpu_gguf_quant.py $RUN_ARGS --skip-kernels \
        --out "$OUT/run-$i" > "$OUT/run-$i.log" 2>&1) || echo "run $i: rc $? (log: run-$i.log)"
    cp "$OUT/run-$i/gguf_quant.json" "$OUT/$side-$i.json" 2>/dev/null
    rm -f "$OUT"/run-"$i"/*.pt
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
rows = []
for path in sorted(pathlib.Path(sys.argv[1]).glob("*-[0-9]*.json"), key=lambda p: int(p.stem.split("-")[1])):
    for run, data in json.loads(path.read_text()).items():
        rows.append((path.stem, run, data["decode_tok_s"]))
batches = sorted({b for _, _, d in rows for b in d}, key=int)
print("| run | engine | " + " | ".join(f"B={b}" for b in batches) + " |")
print("|---|---|" + "---:|" * len(batches))
for stem, run, d in rows:
    print(f"| {stem} | {run} | " + " | ".join(str(d.get(b, "-")) for b in batches) + " |")
PY
