#!/usr/bin/env bash
# Long prompts (#19), one device call: 1bit and llama.cpp's llama-server (CUDA) side by side on a
# Qwen3-8B-shaped model with random bf16 weights (the same weights in both: safetensors for 1bit, a
# bf16 GGUF written from them for llama.cpp), on 2,048- and 8,192-token prompts and on 1,024 shared
# tokens (a system prompt every user has) + 1,024 of each user's own, at 1 / 8 / 32 streams, 64 new
# tokens each. Run from the repo root, carrying `.whl` (tools/device_wheels.sh) and the llama.cpp
# source (bench/peers/slim_sdist.sh), see bench/README.md:
#
#   run(command="PEERS_DIR=.peers/slim bash bench/gpu_long_prompt.sh", carry=[".whl", ".peers/slim/sdist"])
#   run(command="PEER=0 bash bench/gpu_long_prompt.sh", carry=[".whl"])      # 1bit alone, no build
#
# Steps, against the clock (the call aims to end LIMIT_S seconds after it starts):
#   A. PEER=1: build llama-server for sm_90 in the background (bench/peers/build_llama_server.sh
#      --cuda 90, nice 10, its own process group; ~255 s on the 16 cores when last measured), on
#      CPUs 4-15 while 1bit is measured, on all of them after;
#   B. the model: config, tokenizer (--fill-vocab) and, with PEER=1, random weights drawn on the GPU
#      by our dummy loader and saved as safetensors; then its bf16 GGUF and 1bit's fp32 greedy
#      reference for llama.cpp's check, at the same time. PEER=0 writes no weights: 1bit draws the
#      same kind of random weights itself (--load-format dummy);
#   C. 1bit (bench/long_prompt.py run --server 1bit): one `1bit serve --parallel 32 --ctx-size CTX`,
#      every workload against it; with PEER=1 while the build goes on, 1bit and the bench client on
#      CPUs 0-3 of their own (the table says so);
#   D. PEER=1, once the build is done: llama.cpp the same way (`llama-server -np 32 -c 32*CTX
#      LLAMA_ARGS`), after its greedy check against 1bit's reference; workloads it has no time left
#      for are named NOT MEASURED;
#   E. the side-by-side table (bench/long_prompt.py table), printed last.
# Each workload is written when it is measured, so a run cut short keeps what it finished.
# Under $OUT: long_prompt.tar.gz (runs as JSON + Markdown, server and bench logs, build log, table)
# and table.md.
#
# Environment (defaults are the GPU run): PEER (1: both; 0: 1bit alone; only: llama.cpp alone),
# WORKLOADS (random:2048,shared:1024+1024,random:8192), CONC (1,8,32), REQUESTS (8,16,32: per level;
# C=32 is one burst of 32 prompts, C=8 two per stream), MAX_TOKENS (64), CTX (8448 tokens per slot,
# both servers: 8,192 prompt + 64 new with room to spare; llama-server rounds a slot up to 256s and
# ends a sequence that fills it, so exactly 8,256 would risk a short answer), OURS_ARGS (--device cuda), LLAMA_ARGS (-ngl 99 -fa on),
# CHECK_TOKENS (16), SHAPE (qwen3-8b; qwen3-tiny with DEVICE=cpu BUILD=cpu to try it on a CPU),
# DEVICE (cuda), BUILD (cuda), CUDA_ARCH (90), LIMIT_S (540), LLAMA_MIN_S (200: seconds step D wants),
# OURS_MAX_S (seconds step C may take with PEER=1; default LIMIT_S - LLAMA_MIN_S - its start), PY (python3),
# WHEELS (1), PEERS_DIR (.peers), WORK (model, GGUF and runs; /dev/shm when it has room).
# llama-server's defaults copy each finished request's KV to a host-memory prompt cache, which
# blocks its loop (~0.85 s per 8k request in session 12; C=32 at 8k did not finish in 359 s):
# LLAMA_ARGS="-ngl 99 -fa on --cache-ram 0" measures it without (docs/perf-history.md, session 12).
set -u
. "$(dirname "$0")/device_lib.sh"  # el, say, install_wheels_if_carried, the llama-server build

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/out}
PEER=${PEER:-1}
WORKLOADS=${WORKLOADS:-random:2048,shared:1024+1024,random:8192}
CONC=${CONC:-1,8,32}
REQUESTS=${REQUESTS:-8,16,32}
MAX_TOKENS=${MAX_TOKENS:-64}
CTX=${CTX:-8448}
SHAPE=${SHAPE:-qwen3-8b}
DEVICE=${DEVICE:-cuda}
BUILD=${BUILD:-cuda}
CUDA_ARCH=${CUDA_ARCH:-90}
OURS_ARGS=${OURS_ARGS:-"--device $DEVICE"}
# llama-server: every layer on the GPU, FlashAttention on (its default "auto" picks it here anyway;
# "on" rules out a silent fallback); continuous batching, -b 2048 / -ub 512, the f16 KV cache and
# the host-RAM prompt cache (--cache-ram 8192 MiB) are its defaults.
LLAMA_ARGS=${LLAMA_ARGS:-"-ngl 99 -fa on"}
CHECK_TOKENS=${CHECK_TOKENS:-16}
LIMIT_S=${LIMIT_S:-540}
LLAMA_MIN_S=${LLAMA_MIN_S:-200}
PY=${PY:-python3}
NCPU=$(nproc)
PEERS=${PEERS_DIR:-$REPO/.peers}
export PEERS_DIR=$PEERS
mkdir -p "$OUT"

if [[ -z ${WORK:-} ]]; then
    WORK=$REPO/.peers/long-prompt-$SHAPE
    if [[ $SHAPE == qwen3-8b ]] && shm_has_room; then
        WORK=/dev/shm/onebit-long-prompt-$SHAPE
    fi
fi
MODEL=$WORK/model
GGUF=$WORK/model-bf16.gguf
REF=$WORK/reference.json
RUNS=$WORK/runs
LOGS=$WORK/logs
rm -rf "$RUNS" "$LOGS"
mkdir -p "$MODEL" "$RUNS" "$LOGS"
say "PEER=$PEER, work dir $WORK, $NCPU CPUs; workloads $WORKLOADS at C=$CONC ($REQUESTS requests), $MAX_TOKENS new"

# --- A: the llama-server build (PEER=1 / only) -------------------------------------------------------------
VARIANT=(--cuda "$CUDA_ARCH")
[[ $BUILD == cpu ]] && VARIANT=()
BIN=$(llama_server_bin "$PY" "${VARIANT[@]}")
OURS_CPUS=()
if [[ $PEER != 0 ]]; then
    if llama_server_ready "$BIN"; then
        say "llama-server already built: $BIN"
        echo "reused $BIN" > "$LOGS/llama-build.log"
    else
        if [[ $PEER == 1 ]] && can_split_cpus; then
            OURS_CPUS=(taskset -c 0-3)
            BUILD_CPUS=(taskset -c "4-$((NCPU - 1))")
        fi
        say "building llama-server (${VARIANT[*]:-cpu}) in the background -> logs/llama-build.log"
        start_llama_server_build "$LOGS/llama-build.log" "$NCPU" "$PY" "${VARIANT[@]}"
    fi
fi

# --- wheels (the device's python3 lacks fastapi, uvicorn, pydantic, gguf) ------------------------------------
install_wheels_if_carried "$PY" "$LOGS/pip.log" "$REPO"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1

# --- B: model, GGUF, reference ------------------------------------------------------------------------------
say "writing the model -> logs/prepare.log"
(
    set -e
    if [[ $PEER == 0 ]]; then
        "$PY" bench/make_shape_model.py "$MODEL" --shape "$SHAPE" --fill-vocab
        exit 0
    fi
    if [[ ! -f $MODEL/model.safetensors.index.json ]]; then
        rm -f "$GGUF" "$REF"
        "${OURS_CPUS[@]}" "$PY" bench/make_shape_model.py "$MODEL" --shape "$SHAPE" --fill-vocab --weights \
            --device "$DEVICE"
    else
        echo "reusing $MODEL"
    fi
    gguf_pid=
    if [[ ! -f $GGUF ]]; then
        "${OURS_CPUS[@]}" "$PY" -m onebit.testing.gguf_export "$MODEL" "$GGUF.part" --dtype bf16 \
            > "$LOGS/gguf.log" 2>&1 && mv "$GGUF.part" "$GGUF" &
        gguf_pid=$!
    fi
    if (( CHECK_TOKENS > 0 )); then
        "${OURS_CPUS[@]}" "$PY" bench/peers/llamacpp_peer.py reference "$MODEL" "$CHECK_TOKENS" "$DEVICE" "$REF"
    fi
    if [[ -n $gguf_pid ]]; then
        wait "$gguf_pid" || { cat "$LOGS/gguf.log"; exit 1; }
    fi
) > "$LOGS/prepare.log" 2>&1
PREP_RC=$?
if (( PREP_RC != 0 )); then
    say "PREPARING THE MODEL FAILED (rc $PREP_RC):"
    tail -30 "$LOGS/prepare.log"
else
    say "model ready$([[ -f $GGUF ]] && echo ", GGUF $(du -h "$GGUF" | cut -f1)")"
fi

COMMON=(--workloads "$WORKLOADS" --concurrency "$CONC" --requests "$REQUESTS" --max-tokens "$MAX_TOKENS"
        --ctx-size "$CTX" --out "$RUNS")
PIN=()  # taskset for the next run_server, if any
run_server() {  # $1: seconds it may take, then the arguments of `long_prompt.py run`
    local limit=$1
    shift
    timeout -s TERM -k 30 "$limit" "${PIN[@]}" "$PY" bench/long_prompt.py run "${COMMON[@]}" \
        --stop-after $((limit - 40)) "$@"
}

# --- C: 1bit -------------------------------------------------------------------------------------------------
if (( PREP_RC == 0 )) && [[ $PEER != only ]]; then
    NOTE=()
    DUMMY=()
    [[ $PEER == 0 ]] && DUMMY=(--load-format dummy)
    LIMIT_OURS=$(( LIMIT_S - 15 - $(el) ))
    [[ $PEER == 1 ]] && LIMIT_OURS=${OURS_MAX_S:-$(( LIMIT_S - LLAMA_MIN_S - $(el) ))}  # the rest is llama.cpp's
    if build_running; then
        NOTE=(--note "measured while llama-server was compiling (nice 10) on CPUs 4-$((NCPU - 1)); this server and \
the bench client had CPUs 0-3 to themselves")
        (( ${#OURS_CPUS[@]} )) || NOTE=(--note "measured while llama-server was compiling (nice 10) on the same CPUs")
    fi
    say "1bit: ${LIMIT_OURS}s at most -> logs/1bit.log"
    PIN=("${OURS_CPUS[@]}")
    run_server "$LIMIT_OURS" --server 1bit -m "$MODEL" --serve-args "$OURS_ARGS ${DUMMY[*]}" \
        "${NOTE[@]}" > "$LOGS/1bit.log" 2>&1
    say "1bit done (rc $?)"
    grep -h "^== 1bit .*->\|NOT MEASURED\|healthy" "$LOGS/1bit.log"
    grep -h "KV cache:" "$RUNS/1bit.log" 2>/dev/null | head -1
    PIN=()
    widen_build
fi

# --- D: llama.cpp -------------------------------------------------------------------------------------------
MISSING=
if [[ $PEER != 0 ]]; then
    if (( PREP_RC != 0 )); then
        MISSING="the model could not be prepared (logs/prepare.log)"
    else
        while build_running && (( $(el) < LIMIT_S - 90 )); do sleep 2; done
        if build_running; then
            MISSING="the llama-server build was not done $(el)s into the call (at $(build_progress) build steps)"
            stop_build
        elif [[ -n $BUILD_PID ]]; then
            wait "$BUILD_PID"
            rc=$?
            if (( rc != 0 )) || [[ ! -x $BIN ]]; then
                MISSING="the llama-server build failed (rc $rc): see logs/llama-build.log"
                tail -30 "$LOGS/llama-build.log"
            else
                say "llama-server built ($(build_progress))"
            fi
        fi
    fi
    if [[ -z $MISSING ]]; then
        LIMIT_LLAMA=$(( LIMIT_S - 15 - $(el) ))
        (( LIMIT_LLAMA < LLAMA_MIN_S )) && say "only ${LIMIT_LLAMA}s left for llama.cpp (it wants $LLAMA_MIN_S): \
the last workloads may not be measured"
        say "llama.cpp: ${LIMIT_LLAMA}s at most -> logs/llama.cpp.log"
        CHECK=(--check-tokens "$CHECK_TOKENS")
        (( CHECK_TOKENS > 0 )) && CHECK+=(--check-reference "$REF" --device "$DEVICE")
        run_server "$LIMIT_LLAMA" --server llama.cpp -m "$MODEL" --gguf "$GGUF" --gguf-dtype bf16 \
            --llama-server "$BIN" --llama-args "$LLAMA_ARGS" "${CHECK[@]}" > "$LOGS/llama.cpp.log" 2>&1
        say "llama.cpp done (rc $?)"
        grep -h "^== llama.cpp .*->\|NOT MEASURED\|greedy check\|GREEDY\|healthy" "$LOGS/llama.cpp.log" | cut -c1-600
        grep -h "n_ctx_slot\|llama_kv_cache: .*MiB" "$RUNS/llama.cpp.log" 2>/dev/null | head -2 | cut -c1-300
    else
        say "llama.cpp NOT MEASURED: $MISSING"
    fi
fi

# --- E: table and files --------------------------------------------------------------------------------------
"$PY" bench/long_prompt.py table "$RUNS" --out "$RUNS/table.md" > /dev/null 2>&1
grep -h "^NOT MEASURED" "$LOGS/1bit.log" "$LOGS/llama.cpp.log" 2>/dev/null | sed 's/^/- /' >> "$RUNS/table.md"
[[ -n $MISSING ]] && echo "- llama.cpp NOT MEASURED: $MISSING" >> "$RUNS/table.md"
cp "$RUNS"/*.log "$LOGS/" 2>/dev/null
tar -czf "$OUT/long_prompt.tar.gz" -C "$WORK" runs logs
[[ -f $RUNS/table.md ]] && cp "$RUNS/table.md" "$OUT/table.md"
say "files in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
echo
if [[ -f $OUT/table.md ]]; then
    echo "# Long prompts: $SHAPE, $MAX_TOKENS new tokens, requests per level $REQUESTS (C=$CONC), ctx $CTX per slot"
    cat "$OUT/table.md"
else
    echo "NO TABLE${MISSING:+: $MISSING}"
fi
