#!/usr/bin/env bash
# The device's Triton for this machine's Python, in .device_triton/, so that tools/sass_loop_count.py
# compiles as the H200 machines do (their python3 carries triton 3.6.0; the venv's is newer and allocates
# differently: h2-n128-t1-s0 at one row, 108 registers a thread with 3.9.0 against 160 with 3.6.0;
# session 18's ncu counted 77 for h2-n64-t2-s1, 3.6.0 here 80). No GPU needed:
#   bash tools/device_triton.sh
#   PYTHONPATH=.device_triton .venv/bin/python tools/sass_loop_count.py --config h2-n128-t1-s0 --rows 1
# Environment: TRITON_VERSION (3.6.0), PYTHON (.venv/bin/python).
set -eu
cd "$(dirname "$0")/.."
version=${TRITON_VERSION:-3.6.0}
python=${PYTHON:-.venv/bin/python}
if [[ -f .device_triton/.version && $(cat .device_triton/.version) == "$version" ]]; then
    echo ".device_triton: triton $version already there"
    exit 0
fi
wheels=$(mktemp -d)
"$python" -m pip download --quiet --no-deps --only-binary :all: -d "$wheels" "triton==$version"
rm -rf .device_triton
"$python" -m pip install --quiet --no-deps --target .device_triton "$wheels"/triton-*.whl
rm -rf "$wheels"
echo "$version" > .device_triton/.version
echo ".device_triton: triton $(PYTHONPATH=.device_triton "$python" -c 'import triton; print(triton.__version__)')"
