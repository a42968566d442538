#!/usr/bin/env bash
# Split-K sums left to their readers (`split_k_sum.SplitKSum`, `transformer.defer_split_k_sums`) on the
# device, in one call (~7 min on an H200 with its cold start; carry .whl, tools/device_wheels.sh):
#   1. tests/test_split_k_sum.py on the GPU (the readers and producers bit for bit, bf16 included);
#   2. the FP8 engine as shipped (fp8-fuse, bench/gpu_fp8_fuse.py) at B = 1 / 8 / 64 with the sums
#      deferred (ONEBIT_DEFER_SPLIT_K_SUMS=1, the default) and without (0);
#   3. the same for Q4_K_M packed (bench/gpu_gguf_quant.py --runs q4km-packed), and the two runs'
#      greedy logits compared.
# Usage: run(command="OUT=$OUT bash bench/gpu_defer_sums.sh", carry=[".whl"], timeout_s=600)
# Environment: BATCHES (1,8,64), FP8 (1: part 2), GGUF (1: part 3), OUT.
set -u
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-/tmp/out}
BATCHES=${BATCHES:-1,8,64}
mkdir -p "$OUT"
install_wheels || exit 1
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
say "1: tests on the GPU"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_split_k_sum.py > "$OUT/pytest.txt" 2>&1
tail -1 "$OUT/pytest.txt"
if [[ ${FP8:-1} == 1 ]]; then
    for defer in 0 1; do
        say "2: FP8 engine, sums deferred: $defer"
        ONEBIT_DEFER_SPLIT_K_SUMS=$defer timeout 200 python3 bench/gpu_fp8_fuse.py --out "$OUT/fp8-$defer" \
            --engines fp8-fuse --batches "$BATCHES" > "$OUT/fp8-$defer.log" 2>&1 || echo "fp8: rc $? (log: fp8-$defer.log)"
        tail -3 "$OUT/fp8-$defer.log"
    done
fi
if [[ ${GGUF:-1} == 1 ]]; then
    for defer in 0 1; do
        say "3: Q4_K_M packed, sums deferred: $defer"
        ONEBIT_DEFER_SPLIT_K_SUMS=$defer timeout 150 python3 bench/gpu_gguf_quant.py --runs q4km-packed \
            --out "$OUT/gguf-$defer" --skip-kernels --batches "$BATCHES" > "$OUT/gguf-$defer.log" 2>&1 \
            || echo "gguf: rc $? (log: gguf-$defer.log)"
        tail -3 "$OUT/gguf-$defer.log"
    done
    python3 - "$OUT" <<'PY'
import sys, pathlib, torch
out = pathlib.Path(sys.argv[1])
a, b = (sorted((out / f"gguf-{d}").glob("logits-*.pt")) for d in (0, 1))
if not a or not b:
    print("logits: missing"); sys.exit()
x, y = torch.load(a[0]), torch.load(b[0])
x, y = (t if isinstance(t, torch.Tensor) else torch.stack(list(t)) for t in (x, y))
print(f"Q4_K_M packed logits, deferred against summed: equal {torch.equal(x, y)}, max |diff| {(x.float() - y.float()).abs().max().item():.3g}")
for f in a + b:
    f.unlink()  # too large to bring back
PY
fi
