# Shared pieces of the device scripts (bench/gpu_*.sh, bench/peers/gpu_llamacpp.sh): the carried
# wheels, the clock of their log lines, copies of the tree with a module switch on (A/B sides), and the
# llama-server build they run in the background.
# Sourced, never run; the scripts run from the repository root and source it first thing:
#
#   . "$(dirname "$0")/device_lib.sh"        # bench/*.sh
#   . "$(dirname "$0")/../device_lib.sh"     # bench/peers/*.sh
#
# Sourcing starts the clock (T0) and sets the globals below; it runs nothing else, changes no
# shell option and reads no environment variable: the scripts keep their own (WHEELS, PY, ...).
# Safe under `set -u`. Most scripts then call `start_script` (OUT, the wheels, Python's output).

DEVICE_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WHEEL_DIR=.whl       # what tools/device_wheels.sh writes, relative to the working directory
WHEEL_SITE=/tmp/site  # where the wheels are installed (the device's python3 lacks them)
LLAMA_BUILDER=$DEVICE_LIB_DIR/peers/build_llama_server.sh
BUILD_PID=    # the background llama-server build (start_llama_server_build), empty when none runs
BUILD_LOG=    # its log
BUILD_CPUS=() # what to put before the build's command to pin it to some CPUs (taskset -c ...), or nothing

# --- the clock ------------------------------------------------------------------------------------
T0=$(date +%s)

el() {
    # Seconds since this library was sourced (the script's start).
    echo $(( $(date +%s) - T0 ))
}

say() {
    # Prints its arguments as one line, behind the seconds since the start: "[12s] ...".
    echo "[$(el)s] $*"
}

# --- GPU tests before timings ---------------------------------------------------------------------
run_gpu_tests() {
    # $1: a test file, $2: its log (under $OUT), $3: seconds at most. Runs the tests on this machine's GPU
    # and prints pytest's last lines; on a failure says so and returns non-zero, for the caller's
    # `run_gpu_tests ... || exit 1`: a kernel that fails its tests is never timed.
    timeout "$3" python3 -m pytest -q -p no:cacheprovider "$1" > "$2" 2>&1
    local status=$?
    tail -3 "$2"
    [[ $status == 0 ]] || { echo "$1 failed on the GPU (rc $status): nothing timed ($(basename "$2"))"; return 1; }
}

# --- a copy of the tree with a module switch on ------------------------------------------------------
copy_tree() {
    # $1: an existing folder. Copies what a run imports and runs from (onebit, bench, tests, tools) into it.
    cp -r onebit bench tests tools "$1"/
}

switch_on() {
    # $1: a Python file, $2: a module switch NAME. Rewrites its line `NAME = False` to `NAME = True`; returns 1
    # when the file then holds no line `NAME = True` (there was no such switch), for the caller's message.
    sed -i "s/^$2 = False\$/$2 = True/" "$1"
    grep -q "^$2 = True\$" "$1"
}

# --- the carried wheels ---------------------------------------------------------------------------
pip_install_wheels() {
    # $1: the python to run pip with. Installs every WHEEL_DIR/*.whl into WHEEL_SITE, offline and
    # quietly (pip's messages go where the caller sends them). Returns pip's status: non-zero when
    # WHEEL_DIR holds no wheel too (pip then gets the pattern itself and cannot find it).
    "$1" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WHEEL_SITE" \
        "$WHEEL_DIR"/*.whl
}

install_wheels() {
    # The plain scripts' way (gpu_serve.sh, gpu_tables.sh, ...): installs the wheels with python3 and,
    # when that worked, exports PYTHONPATH=WHEEL_SITE:PWD (the repository root). Returns pip's status,
    # for the caller's `install_wheels || exit 1`.
    pip_install_wheels python3 || return
    export PYTHONPATH=$WHEEL_SITE:$PWD
}

start_script() {
    # The common start of a device script, after `set -u` and sourcing this library: OUT (/tmp/out
    # unless set) made, the wheels installed (the script exits when that fails), Python's output
    # unbuffered and progress bars off, and the calibration cache off unless set (each engine a script
    # starts times its products, as A/B runs and start-up timings need).
    OUT=${OUT:-/tmp/out}
    mkdir -p "$OUT"
    install_wheels || exit 1
    export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 ONEBIT_CALIBRATION_CACHE=${ONEBIT_CALIBRATION_CACHE:-off}
}

install_wheels_if_carried() {
    # The peer scripts' way. $1: python, $2: pip's log file, $3: the repository root.
    # With WHEELS=1 (the default) and a wheel in WHEEL_DIR: installs them (pip's output to $2; when it
    # fails, says so with the log's last 5 lines and goes on) and exports PYTHONPATH=WHEEL_SITE:$3.
    # Else (WHEELS=0, or no wheel carried): exports PYTHONPATH=$3, before whatever PYTHONPATH held.
    if [[ ${WHEELS:-1} == 1 ]] && compgen -G "$WHEEL_DIR/*.whl" >/dev/null; then
        pip_install_wheels "$1" > "$2" 2>&1 || { say "pip install of .whl failed:"; tail -5 "$2"; }
        export PYTHONPATH=$WHEEL_SITE:$3
    else
        export PYTHONPATH=$3${PYTHONPATH:+:$PYTHONPATH}
    fi
}

# --- where the model lives ------------------------------------------------------------------------
shm_has_room() {
    # True when /dev/shm (RAM) has more than 40 GiB free: room for the Qwen3-8B shape's bf16 weights
    # and their GGUF (2 x 16.4 GB), so that nothing waits for the disk.
    [[ -d /dev/shm ]] && (( $(df -Pk /dev/shm | awk 'NR==2 {print $4}') > 40 * 1024 * 1024 ))
}

# --- the llama-server build -----------------------------------------------------------------------
llama_server_bin() {
    # $1: the python that runs the builder (PYTHON), then the builder's variant arguments (--cuda 90,
    # or none for the CPU build). Prints where bench/peers/build_llama_server.sh puts (or put) that
    # binary; builds nothing. Prints nothing when the builder cannot answer.
    local python=$1
    shift
    PYTHON=$python bash "$LLAMA_BUILDER" --path "$@" 2>/dev/null
}

llama_server_ready() {
    # $1: the binary's path. True when it is executable; a carried file that lost its mode gets it back.
    [[ -f $1 && ! -x $1 ]] && chmod +x "$1"
    [[ -x $1 ]]
}

can_split_cpus() {
    # True when the build can have CPUs of its own (taskset is there and the machine has 8 CPUs or
    # more): the scripts then pin the build with BUILD_CPUS=(taskset -c 4-LAST) and their own work to 0-3.
    command -v taskset >/dev/null && (( $(nproc) >= 8 ))
}

start_llama_server_build() {
    # $1: log file, $2: JOBS (parallel compile jobs), $3: PYTHON for the builder (empty: the builder
    # picks its own, as without one), then the builder's variant arguments (--cuda 90, or none).
    # Starts bench/peers/build_llama_server.sh in the background, nice 10, in a session (process group)
    # of its own so that stop_build reaches cmake, ninja and every compiler, behind BUILD_CPUS.
    # Sets BUILD_PID and BUILD_LOG. Call it in the script's own shell (not in $(...) or a pipe), so
    # that the script can `wait "$BUILD_PID"`.
    local log=$1 jobs=$2 python=$3
    shift 3
    if [[ -n $python ]]; then
        PYTHON=$python JOBS=$jobs setsid "${BUILD_CPUS[@]}" nice -n 10 bash "$LLAMA_BUILDER" "$@" > "$log" 2>&1 &
    else
        JOBS=$jobs setsid "${BUILD_CPUS[@]}" nice -n 10 bash "$LLAMA_BUILDER" "$@" > "$log" 2>&1 &
    fi
    BUILD_PID=$!
    BUILD_LOG=$log
}

build_running() {
    # True while the background build started by start_llama_server_build runs.
    [[ -n $BUILD_PID ]] && kill -0 "$BUILD_PID" 2>/dev/null
}

build_progress() {
    # The build's last "[done/total]" step count from its log (ninja's), e.g. "[312/480]"; empty before one.
    grep -o '^\[[0-9]*/[0-9]*\]' "$BUILD_LOG" | tail -1
}

widen_build() {
    # Gives a build pinned by BUILD_CPUS every CPU again (compilers started later inherit it from ninja).
    [[ -n $BUILD_PID && ${#BUILD_CPUS[@]} -gt 0 ]] || return 0
    local p
    for p in $(pgrep -g "$BUILD_PID" 2>/dev/null); do taskset -a -p -c "0-$(( $(nproc) - 1 ))" "$p" >/dev/null 2>&1; done
}

stop_build() {
    # Sends SIGTERM to the whole build (its process group); the caller waits for it if it needs to.
    kill -TERM -- "-$BUILD_PID" 2>/dev/null
}
