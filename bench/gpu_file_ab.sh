#!/usr/bin/env bash
# A/B of a change to a few files, in the engine, in one device call (carry .whl and .ab):
#   here:    mkdir -p .ab/old/onebit/kernels && git show REV:onebit/kernels/FILE.py > .ab/old/onebit/kernels/FILE.py
#   device:  run(command="OUT=$OUT bash bench/gpu_file_ab.sh", carry=[".whl", ".ab"], timeout_s=600)
# "new" is the tree as carried; any other side NAME a copy of its onebit/, bench/, tests/ and tools/ with
# every file under .ab/NAME laid over it (same relative paths): "old" by default, and more variants
# as more folders (RUNS=new,old,alt,... with .ab/alt). The runs alternate (RUNS, default
# new,old,new,old) so that a machine's drift shows as a spread within each side instead of a difference
# between them; each run is bench/gpu_gguf_quant.py --skip-kernels (G26) with RUN_ARGS, its JSON kept as
# $OUT/SIDE-I.json (old-2.json, ...); a table of decode tok/s per run, then each side's mean and range, is
# printed last. Session 21 ran it for the unrolled prepare_x and norm loops (7546150: kept) and the
# prepared-rows shape picks (kept).
# A side may also be a module switch turned on (no folder needed): SWITCHES=SIDE:PATH:NAME[,...] makes the
# line `NAME = False` of PATH read `NAME = True` in SIDE's tree (after its folder, if it has one), e.g.
#   SWITCHES=on:onebit/kernels/fp8.py:CPU_EMULATES_GPU RUNS=new,on,new,on bash bench/gpu_file_ab.sh
# PRIME=1 starts each side's engine once before the runs (`--calibrate-only`), timing its products into the
# calibration cache, so that every timed run restores them: an engine that timed its own products decoded
# FP8 B=64 / 256 10-20% slower (session 34, perf.md item 6). It needs ONEBIT_CALIBRATION_CACHE set to a
# folder (else a new one is made).
# Environment: RUNS (side names: letters, digits, _), RUN_ARGS (--runs q4km-packed --batches 8,64), AB_DIR
# (the folders' parent, .ab), OLD (the folder of side "old", AB_DIR/old), SWITCHES, RUN_TIMEOUT (seconds a
# run may take, 200), PRIME (0), WHEELS (1), OUT. A CPU try of the
# mechanics (tests/test_bench_device_scripts.py runs one):
#   PATH=$PWD/.venv/bin:$PATH WHEELS=0 RUNS=new,old
#   RUN_ARGS="--runs q4km-packed --batches 1 --shape qwen3-tiny --device cpu" bash bench/gpu_file_ab.sh
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
RUNS=${RUNS:-new,old,new,old}
RUN_ARGS=${RUN_ARGS:---runs q4km-packed --batches 8,64}
AB_DIR=${AB_DIR:-.ab}
OLD=${OLD:-$AB_DIR/old}
SWITCHES=${SWITCHES:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-200}
mkdir -p "$OUT"
IFS=',' read -ra sides <<< "$RUNS"
mapfile -t distinct < <(printf '%s\n' "${sides[@]}" | sort -u)
overlay() {  # the folder laid over the tree for side $1
    if [[ $1 == old ]]; then echo "$OLD"; else echo "$AB_DIR/$1"; fi
}
IFS=',' read -ra switches <<< "$SWITCHES"
switched() {  # whether side $1 turns a switch on
    local entry
    for entry in "${switches[@]}"; do [[ ${entry%%:*} == "$1" ]] && return 0; done
    return 1
}
for side in "${distinct[@]}"; do
    [[ $side =~ ^[A-Za-z0-9_]+$ ]] || { echo "side name \"$side\": letters, digits and _ only"; exit 1; }
    [[ $side == new || -d $(overlay "$side") ]] || switched "$side" || {
        echo "no $(overlay "$side") for side $side: put its versions of the files there (see the header)"; exit 1; }
done
if [[ ${WHEELS:-1} == 1 ]]; then install_wheels || exit 1; fi  # WHEELS=0: a CPU try in the venv
# as start_script: every run times its own products (the calibration cache off unless set)
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 ONEBIT_CALIBRATION_CACHE=${ONEBIT_CALIBRATION_CACHE:-off}
TREES=$(mktemp -d)  # the other sides' trees
for side in "${distinct[@]}"; do
    [[ $side == new ]] && continue
    tree=$TREES/$side
    rm -rf "$tree" && mkdir -p "$tree" && copy_tree "$tree"
    if [[ -d $(overlay "$side") ]]; then
        cp -r "$(overlay "$side")"/. "$tree"/
        say "$side tree: $(cd "$(overlay "$side")" && find . -type f | tr '\n' ' ')"
    fi
    for entry in "${switches[@]}"; do
        IFS=':' read -r owner path name <<< "$entry"
        [[ $owner == "$side" ]] || continue
        switch_on "$tree/$path" "$name" || { echo "side $side: no line \"$name = False\" in $path"; exit 1; }
        say "$side tree: $path with $name = True"
    done
done
side_root() {  # the tree side $1 runs in
    if [[ $1 == new ]]; then echo "$PWD"; else echo "$TREES/$1"; fi
}
if [[ ${PRIME:-0} == 1 ]]; then
    [[ ${ONEBIT_CALIBRATION_CACHE,,} == off ]] && export ONEBIT_CALIBRATION_CACHE=$(mktemp -d)
    for side in "${distinct[@]}"; do
        say "prime $side (its products into $ONEBIT_CALIBRATION_CACHE)"
        # shellcheck disable=SC2086
        (cd "$(side_root "$side")" && PYTHONPATH=$WHEEL_SITE:$(side_root "$side") timeout "$RUN_TIMEOUT" python3 \
            bench/gpu_gguf_quant.py $RUN_ARGS --skip-kernels --calibrate-only --out "$OUT/prime-$side" \
            > "$OUT/prime-$side.log" 2>&1) || echo "prime $side: rc $? (log: prime-$side.log)"
        grep "^| " "$OUT/prime-$side/gguf_quant.md" 2>/dev/null | grep -v "^| run "
    done
fi
i=0
for side in "${sides[@]}"; do
    i=$((i + 1))
    root=$(side_root "$side")
    say "$i: $side"
    # shellcheck disable=SC2086
    (cd "$root" && PYTHONPATH=$WHEEL_SITE:$root timeout "$RUN_TIMEOUT" python3 bench/gpu_gguf_quant.py $RUN_ARGS --skip-kernels \
        --out "$OUT/run-$i" > "$OUT/run-$i.log" 2>&1) || echo "run $i: rc $? (log: run-$i.log)"
    cp "$OUT/run-$i/gguf_quant.json" "$OUT/$side-$i.json" 2>/dev/null
    rm -f "$OUT"/run-"$i"/*.pt
done
rm -rf "$TREES"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
rows, clocks, pauses = [], {}, {}  # (run file, engine) -> the GPU clock / the collector's pauses by batch size
sources = {}  # (run file, engine) -> "timed" or "cache": FP8 engines that timed their products ran slow (item 6)
for path in sorted(pathlib.Path(sys.argv[1]).glob("*-[0-9]*.json"), key=lambda p: int(p.stem.split("-")[1])):
    for run, data in json.loads(path.read_text()).items():
        rows.append((path.stem, run, data["decode_tok_s"]))
        sources[path.stem, run] = data.get("calibration_source", "-")
        clocks[path.stem, run] = data.get("clocks") or {}
        pauses[path.stem, run] = data.get("gc_pauses") or {}
batches = sorted({b for _, _, d in rows for b in d}, key=int)
print("| run | engine | calibration | " + " | ".join(f"B={b}" for b in batches) + " |")
print("|---|---|---|" + "---:|" * len(batches))
for stem, run, d in rows:
    print(f"| {stem} | {run} | {sources[stem, run]} | " + " | ".join(str(d.get(b, "-")) for b in batches) + " |")
print("\n| side | engine | runs | " + " | ".join(f"B={b} mean (range)" for b in batches) + " |")
print("|---|---|---:|" + "---|" * len(batches))
for side, run in dict.fromkeys((stem.split("-")[0], run) for stem, run, _ in rows):
    mine = [d for stem, r, d in rows if stem.split("-")[0] == side and r == run]
    cells = []
    for b in batches:
        values = [d[b] for d in mine if b in d]
        cells.append(f"{sum(values) / len(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})" if values else "-")
    print(f"| {side} | {run} | {len(mine)} | " + " | ".join(cells) + " |")
sys.path.insert(0, ".")
from onebit.bench.gpu_clocks import describe  # noqa: E402
if any(clocks.values()):  # the GPU while each figure was timed: a slower clock explains a lower figure
    print("\n| run | engine | " + " | ".join(f"B={b} clock" for b in batches) + " |")
    print("|---|---|" + "---|" * len(batches))
    for (stem, run), c in clocks.items():
        print(f"| {stem} | {run} | " + " | ".join(describe(c.get(b)) for b in batches) + " |")
if any(pauses.values()):  # a full collection of a large heap stalls the host that drives the steps
    print("\n| run | engine | " + " | ".join(f"B={b} gc collections (0/1/2), ms" for b in batches) + " |")
    print("|---|---|" + "---|" * len(batches))
    for (stem, run), g in pauses.items():
        print(f"| {stem} | {run} | " + " | ".join(
            f"{'/'.join(map(str, g[b]['collections']))}, {g[b]['seconds'] * 1e3:.1f} (longest {g[b]['longest_s'] * 1e3:.1f})"
            if b in g else "-" for b in batches) + " |")
PY
