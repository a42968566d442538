#!/usr/bin/env bash
# Session 12's product changes measured in one device call (~8 min, no wheels needed):
#   A. engine decode tok/s at B = 1/8/32/64/256 (bench/gpu.py): "graphs" (Triton candidates,
#      split-K among them) against "graphs-cublas" (cuBLAS for every bf16 product) is the A/B of
#      the bf16 split-K candidate; "graphs-overlap-fp8" the FP8 engine with the w8a8 candidate. The
#      calibration lines say where Triton won (bf16) and which kind won at each row count (FP8);
#   B. per-kernel times of a decode step at B = 64 and 256 with PDL off (bench/gpu_step_profile.py;
#      with PDL on, kernels overlap and their times include waits): the fused q/k/v write's share;
#   C. FP8 products at 16 and 64 rows (bench/gpu_fp8_fast.py part 1): the w8a8 split-K against
#      `_scaled_mm` and the weight-only split-K, per product;
#   D. (its own call, carrying .whl: the gguf package) G26, packed GGUF in the engine at B = 1/8/64
#      (bench/gpu_gguf_quant.py --skip-kernels): mode "int" at 17-64 rows and PDL on the packed kernels.
# Run from the repo root:  run(command="OUT=$OUT bash bench/gpu_products_ab.sh", timeout_s=600)
#                          run(command="PARTS=D OUT=$OUT bash bench/gpu_products_ab.sh", carry=[".whl"], timeout_s=400)
# Environment: VARIANTS, BATCHES, PARTS (ABC), OUT. Each part has its own time limit; the tables
# are printed last and everything is in $OUT/products_ab.tgz.
set -u
OUT=${OUT:-/tmp/out}
VARIANTS=${VARIANTS:-graphs,graphs-cublas,graphs-overlap-fp8}
BATCHES=${BATCHES:-1,8,32,64,256}
PARTS=${PARTS:-ABC}
mkdir -p "$OUT/products_ab"
W=$OUT/products_ab
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if [[ $PARTS == *A* ]]; then
    timeout 330 python3 bench/gpu.py --out "$W/engine" --variants "$VARIANTS" --batches "$BATCHES" --hf-batches '' \
        > "$W/engine.log" 2>&1 || echo "part A: rc $? (log: engine.log)"
fi
if [[ $PARTS == *B* ]]; then
    timeout 120 python3 bench/gpu_step_profile.py --out "$W/profile" --batches 64,256 --no-pdl \
        > "$W/profile.log" 2>&1 || echo "part B: rc $? (log: profile.log)"
fi
if [[ $PARTS == *C* ]]; then
    timeout 100 python3 bench/gpu_fp8_fast.py --out "$W/fp8" --rows 16,64 --accum-rows '' --fused-rows '' \
        --skip-engines > "$W/fp8.log" 2>&1 || echo "part C: rc $? (log: fp8.log)"
fi
if [[ $PARTS == *D* ]]; then
    . bench/device_lib.sh
    install_wheels > "$W/pip.log" 2>&1 || echo "part D: the wheels did not install (log: pip.log)"
    timeout 360 python3 bench/gpu_gguf_quant.py --out "$W/gguf" --skip-kernels --batches 1,8,64 \
        > "$W/gguf.log" 2>&1 || echo "part D: rc $? (log: gguf.log)"
fi
tar czf "$OUT/products_ab.tgz" --exclude="*.pt" -C "$OUT" products_ab && rm -rf "$W"
tar xzf "$OUT/products_ab.tgz" -C /tmp 2>/dev/null
echo "== A: engine"
grep -E "choice|won at|^\| " /tmp/products_ab/engine.log 2>/dev/null | grep -v "^| variant\|^|---" | tail -40
echo "== B: step profile, PDL off"
grep -E "^\| (bf16|fp8) " /tmp/products_ab/profile/step_profile.md 2>/dev/null
grep -A4 "longest kernels" /tmp/products_ab/profile.log 2>/dev/null | grep -i "qk_norm\|longest" | head -8
echo "== C: FP8 products"
grep -E "^\| " /tmp/products_ab/fp8.log 2>/dev/null | head -20
echo "== D: packed GGUF in the engine"
grep -E "^\| " /tmp/products_ab/gguf.log 2>/dev/null | tail -8
