#!/usr/bin/env bash
# Download, here, the wheels the GPU device machine lacks for running the server there
# (its python3 is 3.12 with torch, transformers, httpx, jinja2, tokenizers; no fastapi, uvicorn,
# pydantic, gguf or llguidance; the openai client is left out: the bench talks plain httpx).
# Carry the folder .whl with the device call and start the command with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# (the same as `. bench/device_lib.sh && install_wheels`, which the bench/gpu_*.sh scripts run).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
python3 - <<'PY' > /tmp/onebit-device-versions.txt
from importlib.metadata import version
for name in ["fastapi", "starlette", "uvicorn", "pydantic", "pydantic_core", "annotated-types",
             "typing-inspection", "gguf",
             "opentelemetry-api", "annotated-doc", "httptools", "llguidance"]:
    try:
        print(f"{name}=={version(name)}")
    except Exception:
        print(name)
PY
PLATFORMS=""
for n in 17 24 27 28 31 34; do PLATFORMS="$PLATFORMS --platform manylinux_2_${n}_x86_64"; done
while read -r spec; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $PLATFORMS --platform manylinux2014_x86_64 --platform any -d .whl "$spec"
done < /tmp/onebit-device-versions.txt
# The device's own anyio needs a newer typing_extensions than this machine may hold: take the newest.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform any -d .whl "typing_extensions>=4.16"
ls .whl
