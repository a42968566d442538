#!/usr/bin/env bash
# One device call: llama.cpp's llama-server (CUDA) and 1bit side by side, on a Qwen3-8B-shaped model
# with random bf16 weights (the same weights in both: safetensors for 1bit, a bf16 GGUF written
# from them for llama.cpp). Run from the repo root with `.whl` and `.peers/sdist` carried:
#
#   bash bench/peers/gpu_llamacpp.sh
#
# Steps, against the clock (the call aims to end LIMIT_S seconds after it starts):
#   A. in the background (nice 10): build llama-server for sm_90 (build_llama_server.sh --cuda 90),
#      unless .peers/VERSION-cuda-90/bin/llama-server is there already;
#   B. meanwhile: write the model (config, tokenizer, random weights drawn on the GPU by our dummy
#      loader and saved as safetensors shards), then, at the same time, its bf16 GGUF
#      (onebit.testing.gguf_export) and 1bit's fp32 greedy reference for the llama.cpp check;
#   C. once the build is done: bench 1bit (run_peers.py --peers 1bit) with nothing else running;
#   D. bench llama.cpp (greedy check against the reference, then the same load) and write one
#      report with both.
# If the build is not done by LIMIT_S - OURS_S - LLAMA_S, there is no time left for C and D: the
# build goes on until LIMIT_S - 10, then stops. A CUDA build of ggml took ~8000 CPU-seconds when
# timed file by file on a slower machine (so 4 to 9 minutes on 16 cores): the first call may only
# build. A binary built in the call comes back in $OUT (llama-server.tar.xz.part*, the script
# prints how to unpack it into .peers/VERSION-cuda-90/bin/ and carry it, so that no later call builds);
# a build stopped half way is resumed by the same command only while the machine is still held
# (model, GGUF and reference are then reused too).
# OVERLAP=1 measures 1bit during the build instead (1bit and the bench client on CPUs 0-3, the
# build on the others, the report says so), which saves a few minutes when the build nearly fits.
#
# Under $OUT (at most 8 files come back): report.md, report.png, 1bit.json, llama.cpp.json,
# llama-build.log, logs.tar.gz, and a freshly built llama-server in parts. The table is printed last.
#
# Environment (defaults are the GPU run): SHAPE (qwen3-8b; qwen3-tiny to try it on a CPU),
# DEVICE (cuda), BUILD (cuda; cpu uses .peers/VERSION-cpu), CUDA_ARCH (90), JOBS (nproc),
# CONC (1,8,32,64), MAX_TOKENS (128), PROMPTS (random:128), CTX (1024 per sequence),
# CHECK_TOKENS (16), LLAMA_ARGS, OURS_ARGS, WORK (where model, GGUF and runs live), LIMIT_S (560),
# OURS_S (100) and LLAMA_S (130): seconds kept for steps C and D, OVERLAP (0), PY (python3),
# WHEELS (1: install .whl/*.whl into /tmp/site), PEERS_DIR (.peers), GGUF_DTYPE (bf16; q4_k_m: both
# servers run the same Q4_K_M file, written by llama.cpp's recipe with round-to-nearest encoders,
# 1bit with --gguf-keep-packed; no greedy check then: the two quantized computations differ).
set -u
. "$(dirname "$0")/../device_lib.sh"  # el, say, install_wheels_if_carried, the llama-server build

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/out}
SHAPE=${SHAPE:-qwen3-8b}
DEVICE=${DEVICE:-cuda}
BUILD=${BUILD:-cuda}
CUDA_ARCH=${CUDA_ARCH:-90}
NCPU=$(nproc)
JOBS=${JOBS:-$NCPU}
CONC=${CONC:-1,8,32,64}
MAX_TOKENS=${MAX_TOKENS:-128}
PROMPTS=${PROMPTS:-random:128}
CTX=${CTX:-1024}
CHECK_TOKENS=${CHECK_TOKENS:-16}
LIMIT_S=${LIMIT_S:-560}
OURS_S=${OURS_S:-100}
LLAMA_S=${LLAMA_S:-130}
OVERLAP=${OVERLAP:-0}
PY=${PY:-python3}
GGUF_DTYPE=${GGUF_DTYPE:-bf16}
# 1bit: as many slots as the highest concurrency (run_peers adds --parallel), CTX tokens each;
# bf16 from config.json; everything else its defaults (--max-batch-tokens 2048, like llama-server's -b).
OURS_ARGS=${OURS_ARGS:-"--device $DEVICE --ctx-size $CTX"}
[[ $GGUF_DTYPE == bf16 ]] || OURS_ARGS="$OURS_ARGS --gguf-keep-packed"
# llama-server: run_peers adds -np (the highest concurrency) and -c (that times CTX: llama-server
# splits -c evenly over its slots, so each holds CTX tokens like 1bit's). Every layer on the GPU.
# -fa on: its default is "auto", which turns FlashAttention on for this model on CUDA anyway;
# "on" rules out a silent fallback. Continuous batching is on by default. The rest stays
# llama-server's default, including its host-RAM prompt cache (--cache-ram 8192 MiB), which copies
# a finished slot's KV to host memory when the slot takes a new request.
LLAMA_ARGS=${LLAMA_ARGS:-"-ngl 99 -fa on"}
PEERS=${PEERS_DIR:-$REPO/.peers}  # build_llama_server.sh reads PEERS_DIR too
VARIANT=(--cuda "$CUDA_ARCH")
[[ $BUILD == cuda ]] || VARIANT=()
# Where the builder puts (or put) this variant: PEERS/VERSION-cuda-ARCH or PEERS/VERSION-cpu.
BIN=$(llama_server_bin "$PY" "${VARIANT[@]}")

mkdir -p "$OUT"
# The model lives in RAM (/dev/shm) when it has room for weights + GGUF (2 x 16.4 GB for the 8B
# shape), so nothing waits for the disk; else beside the repo in .peers/ (ignored by git).
if [[ -z ${WORK:-} ]]; then
    WORK=$REPO/.peers/gpu-$SHAPE
    if [[ $SHAPE == qwen3-8b ]] && shm_has_room; then
        WORK=/dev/shm/onebit-peers-$SHAPE
    fi
fi
MODEL=$WORK/model
GGUF=$WORK/model-$GGUF_DTYPE.gguf
OURS_MODEL=$MODEL  # what 1bit serves: the checkpoint, or with a quantized GGUF_DTYPE the same file as llama.cpp
[[ $GGUF_DTYPE == bf16 ]] || OURS_MODEL=$GGUF
REF=$WORK/reference.json
RUNS=$WORK/runs
LOGS=$WORK/logs
rm -rf "$RUNS" "$LOGS"
mkdir -p "$MODEL" "$RUNS" "$LOGS"
say "work dir $WORK, $NCPU CPUs"

# --- A: the llama-server build ------------------------------------------------------------------
FRONT=()
if llama_server_ready "$BIN"; then  # a binary carried from an earlier call gets its mode back
    say "llama-server already built: $BIN"
    echo "reused $BIN" > "$OUT/llama-build.log"
else
    if [[ $OVERLAP == 1 ]] && can_split_cpus; then
        FRONT=(taskset -c 0-3)
        BUILD_CPUS=(taskset -c 4-$((NCPU - 1)))
    fi
    say "building llama-server (bench/peers/build_llama_server.sh${VARIANT[*]:+ ${VARIANT[*]}}, JOBS=$JOBS) \
-> $OUT/llama-build.log"
    # No PYTHON for the builder: it picks its own python, as this script always let it.
    start_llama_server_build "$OUT/llama-build.log" "$JOBS" "" "${VARIANT[@]}"
fi
BUILD_RC=
build_result() {  # after the build process ended: its status, and the last lines when it failed
    wait "$BUILD_PID"
    BUILD_RC=$?
    if (( BUILD_RC != 0 )) || [[ ! -x $BIN ]]; then
        say "THE LLAMA-SERVER BUILD FAILED (rc $BUILD_RC); the last lines of llama-build.log:"
        tail -40 "$OUT/llama-build.log"
        return 1
    fi
    say "llama-server built"
    BUILT_NOW=1
}
BUILT_NOW=0
pack_binary() {  # the fresh binary into $OUT, in parts under 16 MiB, to carry instead of building again
    local rel=${BIN#"$PEERS"/} free parts
    free=$(( 8 - $(find "$OUT" -type f | wc -l) ))
    local z=(xz -T0 -3) ext=xz x=J
    command -v xz >/dev/null || { z=(gzip -1); ext=gz; x=z; }
    tar -C "$PEERS" -cf - "$rel" | "${z[@]}" | split -b 15M -d - "$OUT/llama-server.tar.$ext.part"
    parts=$(find "$OUT" -name "llama-server.tar.$ext.part*" | wc -l)
    if (( parts > free )); then
        rm -f "$OUT"/llama-server.tar.*.part*
        say "llama-server ($(du -h "$BIN" | cut -f1)) needs $parts parts, only $free files can come back: not returned"
        return
    fi
    say "llama-server ($(du -h "$BIN" | cut -f1)) is in \$OUT as $parts part(s): to skip the build next time,
    mkdir -p .peers && cat FILES_AT/llama-server.tar.$ext.part* | tar -x$x -C .peers   # -> .peers/$rel
and carry \".peers/$rel\" (with .whl) instead of .peers/sdist"
}

# --- wheels (the device's python3 lacks fastapi, uvicorn, pydantic, gguf) -----------------------
install_wheels_if_carried python3 "$LOGS/pip.log" "$REPO"
export PYTHONUNBUFFERED=1
"$PY" -c "import matplotlib" 2>/dev/null || say "no matplotlib here: the report comes without report.png"

# --- B: model, GGUF, reference ------------------------------------------------------------------
say "writing the model, its GGUF and 1bit's reference continuation -> logs/prepare.log"
(
    set -e
    if [[ ! -f $MODEL/model.safetensors.index.json ]]; then
        rm -f "$GGUF" "$REF"
        "${FRONT[@]}" "$PY" bench/make_shape_model.py "$MODEL" --shape "$SHAPE" --fill-vocab --weights \
            --device "$DEVICE"
    else
        echo "reusing $MODEL"
    fi
    gguf_pid=
    if [[ ! -f $GGUF ]]; then
        # Under a temporary name, so that an export cut short is never taken for a finished file.
        "${FRONT[@]}" "$PY" -m onebit.testing.gguf_export "$MODEL" "$GGUF.part" --dtype "$GGUF_DTYPE" --device "$DEVICE" \
            > "$LOGS/gguf.log" 2>&1 && mv "$GGUF.part" "$GGUF" &
        gguf_pid=$!
    fi
    "${FRONT[@]}" "$PY" bench/peers/llamacpp_peer.py reference "$MODEL" "$CHECK_TOKENS" "$DEVICE" "$REF"
    if [[ -n $gguf_pid ]]; then
        wait "$gguf_pid" || { cat "$LOGS/gguf.log"; exit 1; }
    fi
) > "$LOGS/prepare.log" 2>&1
PREP_RC=$?
if (( PREP_RC != 0 )); then
    say "PREPARING THE MODEL FAILED (rc $PREP_RC):"
    tail -30 "$LOGS/prepare.log"
else
    say "model ready: $(grep -h 'wrote\|reusing' "$LOGS/prepare.log" | head -2 | tr '\n' ' ')"
    say "GGUF $(du -h "$GGUF" | cut -f1), reference $(head -c 300 "$REF")"
fi

COMMON=(-m "$MODEL" --concurrency "$CONC" --max-tokens "$MAX_TOKENS" --prompts "$PROMPTS" --out "$RUNS" --gpu-clocks 0)  # the clock each peer ran at (power cap)
OURS_DONE=0
bench_1bit() {  # step C; arguments: what to put before the command (taskset), then --note ...
    local cpus=() notes=()
    while (( $# )) && [[ $1 != --note ]]; do cpus+=("$1"); shift; done
    notes=("$@")
    say "bench 1bit ($OURS_ARGS)"
    "${cpus[@]}" "$PY" bench/peers/run_peers.py "${COMMON[@]}" -m "$OURS_MODEL" --peers 1bit --serve-args "$OURS_ARGS" \
        "${notes[@]}" > "$LOGS/peers-1bit.log" 2>&1
    say "1bit done (rc $?)"
    grep -h "PEER NOT MEASURED" "$LOGS/peers-1bit.log"
    OURS_DONE=1
}

# --- C during the build (OVERLAP=1 only) ----------------------------------------------------------
if (( PREP_RC == 0 )) && [[ $OVERLAP == 1 ]] && build_running; then
    if (( ${#FRONT[@]} )); then
        bench_1bit "${FRONT[@]}" --note "measured while llama-server was compiling (nice 10) on CPUs \
4-$((NCPU - 1)); this server and the bench client had CPUs 0-3 to themselves"
    else
        bench_1bit --note "measured while llama-server was compiling (nice 10) on the same CPUs"
    fi
    widen_build
fi

# --- waiting for the build: C and D need OURS_S + LLAMA_S seconds ---------------------------------
DEADLINE=$(( LIMIT_S - LLAMA_S - (OURS_DONE ? 0 : OURS_S) ))
while build_running && (( $(el) < DEADLINE )); do sleep 2; done
MISSING=
if (( PREP_RC != 0 )); then
    MISSING="the model could not be prepared (logs/prepare.log)"
elif build_running; then
    MISSING="the llama-server build was not done $(el)s into this call (at $(build_progress) build steps), too late \
to measure in this one; it goes on compiling to the end of the call: run the same command again while the \
machine is held, the build resumes where it stopped and model, GGUF and reference are reused"
    say "$MISSING"
elif [[ -n $BUILD_PID ]] && ! build_result; then
    MISSING="the llama-server build failed (rc $BUILD_RC): see llama-build.log"
fi

# --- C (with nothing else running) and D ----------------------------------------------------------
if [[ -z $MISSING ]]; then
    (( OURS_DONE )) || bench_1bit
    INCLUDE=()
    [[ -f $RUNS/1bit.json ]] && INCLUDE=(--include "$RUNS/1bit.json")
    CHECK=(--check-gguf --gguf-dtype bf16 --check-tokens "$CHECK_TOKENS" --check-reference "$REF")
    [[ $GGUF_DTYPE == bf16 ]] || CHECK=(--check-tokens 0)
    say "bench llama.cpp ($LLAMA_ARGS)"
    "$PY" bench/peers/run_peers.py "${COMMON[@]}" --peers llama.cpp --llama-server "$BIN" --llama-args "$LLAMA_ARGS" \
        --ctx-per-slot "$CTX" --gguf "$GGUF" "${CHECK[@]}" --device "$DEVICE" "${INCLUDE[@]}" \
        > "$LOGS/peers-llama.cpp.log" 2>&1
    say "llama.cpp done (rc $?)"
    grep -h "greedy check\|GREEDY\|PEER NOT MEASURED" "$LOGS/peers-llama.cpp.log" | cut -c1-1500
elif [[ -f $RUNS/report.md ]]; then
    # The report of 1bit alone (measured during the build), with the reason llama.cpp is missing.
    echo "- PEER NOT MEASURED: llama.cpp: $MISSING" >> "$RUNS/report.md"
fi

for f in report.md report.png 1bit.json llama.cpp.json; do
    [[ -f $RUNS/$f ]] && cp "$RUNS/$f" "$OUT/"
done
cp "$RUNS"/*.log "$LOGS/" 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs
if build_running; then
    # $OUT holds everything already; the rest of the call still compiles, which the next call saves
    # (or, when it finishes, its binary comes back to be carried).
    while build_running && (( $(el) < LIMIT_S - 10 )); do sleep 2; done
    if build_running; then
        stop_build
        wait "$BUILD_PID" 2>/dev/null
        say "build stopped at $(build_progress) steps; the same command again resumes it if the machine is still \
held (it is given back soon after a call ends), else starts over"
    elif build_result; then
        say "the build finished $(el)s into the call, too late to measure in it: the same command again \
measures both"
    fi
fi
(( BUILT_NOW )) && pack_binary
say "files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
if [[ -f $OUT/report.md ]]; then
    echo
    cat "$OUT/report.md"
else
    echo "NO REPORT${MISSING:+: $MISSING}"
fi
