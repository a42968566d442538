"""Triton products with repacked GGUF weights (`gguf_repack.RepackedMatrix`), 1-16 activation rows.

Each program owns BLOCK_N weight rows and walks its share of K NG groups at a time (a group: 256
values for Q4_K/Q5_K, 128 for Q6_K/Q8_0, stored as LANES = 32 or 16 int32 words per row). It
loads the codes of its rows' NG groups as one contiguous run per row (wide vector loads), the
group's scales as whole 32-bit words, and then for each plane j (one sub-block of every group)
builds the exact float32 weights without shifting the codes down or converting ints to floats:

    f = bitcast((word & plane mask) | exponent of 2**E) = 2**E + code   (one LOP3 per weight)
    t = fma(f, scale, -2**E * scale) = code * scale       (exact: the product fits in 24 bits)
    w = t - offset                                        (the GGUF value, bit for bit)

and multiplies them by the activations at the plane's columns, one of two ways:
- mode "fma" (CUDA cores, up to 4 rows): acc_m[n, g, lane] += x[m] * w, summed once at the end;
- mode "dot" (tensor cores, rows padded to 16): w rounded to the activations' dtype (exactly what
  a model dequantized at load multiplies by) and `tl.dot` with float32 accumulation.
- mode "int" (`_repacked_int_kernel`, tensor cores, any row count): no float weights at all; per
  sub-block a `tl.dot` on the exact codes (128 + code as bfloat16 bit patterns, built two lanes per
  mask-and-or; Q8_0 signed through float32), then acc += scale * dot - (offset + 128 scale) * sum(x):
  a reassociation of the product (reference `gguf_repack.repacked_int_linear_ref`, float32 bound in
  tests/test_gguf_repacked.py). sm_90 SASS of its loop, Triton 3.9: 4.6-4.8 instructions per weight
  for Q4_K (the "dot" mode: 10.6), 6.4 Q8_0, 7.4 Q5_K, 8 Q6_K.
K is split over SPLIT programs per row tile so that 4096-row products still fill the GPU; their
partial sums meet in a float32 workspace summed in a fixed order ("sum", deterministic) or by
atomic adds into the zeroed output ("atomic").

Mode "int" also runs 17 to MAX_INT_ROWS rows; above, `matmul` expands the weight to the
activations' dtype (`dequantize`, same plane code) and multiplies with cuBLAS. Reference:
`gguf_repack.repacked_linear_ref`.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from onebit.kernels import pdl
from onebit.kernels.gguf_repack import F16_TYPES, F16S_TYPES, GROUPING, H2_TYPES, F16Rows, RepackedMatrix
from onebit.kernels.int8_ops import dot4, transpose_bytes
from onebit.kernels.triton_gguf import _store_partial  # split-K partials, summed in order by reduce_partials
from onebit.kernels.triton_split_k import reduce_partials

MAX_KERNEL_ROWS = 16
# Mode "int" takes its row tile as the tensor cores' narrow side (any width up to 256), so it also
# runs 17-64 rows, reading the packed weight once where the dequantized path wrote and read a bf16
# copy of it: Q4_K_M B=64 in the engine 4,429 tok/s that way, 6,820 through "int" (session 13).
# INT_ABOVE_FEW_ROWS False restores the dequantized path.
MAX_INT_ROWS = 64
INT_ABOVE_FEW_ROWS = True
QTYPE_IDS = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3}


class RepackedConfig(NamedTuple):
    """A launch of `matmul_few_rows`: mode "fma" (CUDA cores, up to 4 rows), "dot" or "int" (tensor
    cores) or "i8" (1 row, int8 x); BLOCK_N weight rows per program; NG groups per loop turn; split:
    programs along K (0: enough for about `programs` programs); reduce "sum" or "atomic"; warps;
    pipeline stages; quads (mode "i8"): how many of a (row, group)'s quads of four lanes are read at
    once, one a thread (1: one thread walks them all; up to LANES / 4)."""

    mode: str = "fma"
    block_n: int = 16
    ng: int = 2
    split: int = 0
    reduce: str = "sum"
    warps: int = 4
    stages: int = 2
    programs: int = 1024
    quads: int = 1


# Candidates bench/gpu_gguf_repacked.py sweeps (named so its table can say which won). Dropped after the
# 2026-12-01 H200 sweep, each beaten at every row count: fma-n8-g2, fma-n16-g4, fma-n16-g2-atomic, dot-n16-g2;
# after the 2026-12-02 sweep at 1-64 rows (docs/perf-history.md, session 13): int-n32-g1, int-n128-g1,
# int-n128-g2, int-n256-g1 and, of int-n64-g1's variants, 8 warps, 2048 programs and NG 4.
CONFIGS = {
    "fma-n16-g2": RepackedConfig("fma", 16, 2),
    "fma-n32-g2": RepackedConfig("fma", 32, 2, programs=512),
    "dot-n32-g2": RepackedConfig("dot", 32, 2),
    "dot-n32-g4": RepackedConfig("dot", 32, 4, programs=512),
    "dot-n64-g2": RepackedConfig("dot", 64, 2, warps=8, programs=512),
    "int-n64-g1": RepackedConfig("int", 64, 1, programs=512),
    "int-n64-g2": RepackedConfig("int", 64, 2, programs=512),
    "int-n64-g1-s3": RepackedConfig("int", 64, 1, stages=3, programs=512),
    "int-n64-g1-s3-p256": RepackedConfig("int", 64, 1, stages=3, programs=256),  # the Q6_K 64-row pick
    # 17-64 rows (--wide leaves "dot" out): "dot" weights (code * scale - offset in bf16) on 64-row wgmma
    # tiles, against "int"'s per-sub-block rescale of the accumulator. Session 15 (geometric mean over
    # the 8B products, Q4_K / Q6_K / Q8_0, speed-up vs bf16 cuBLAS at 32 / 64 rows): dot-n64-g1 0.55x /
    # 0.47x, dot-n128-g1 0.50x / 0.26x (dropped), int-n64-g1-p256 0.75x / 0.52x; dot-n64-g1 won only
    # Q6_K's o_proj and down_proj (and its head at 64 rows), by 5-20%.
    "dot-n64-g1": RepackedConfig("dot", 64, 1, programs=512),
    # 17-64 rows: fewer programs, so less split-K. The partials are rows x N float32 per slice: at 64
    # rows int-n64-g1 splits a 4096-wide product 8 ways and writes and sums 8 MB of partials for its
    # 9.4 MB of Q4_K weights. Session 14's --wide sweep: 256 programs won at 32-64 rows by 5-15%
    # (Q4_K at 64 rows 0.58x bf16 cuBLAS against int-n64-g1's 0.51x); the table holds those picks.
    "int-n64-g1-p256": RepackedConfig("int", 64, 1, programs=256),
    "int-n64-g1-p128": RepackedConfig("int", 64, 1, programs=128),
    "int-n128-g1-p128": RepackedConfig("int", 128, 1, warps=8, programs=128),
    # 1 row, Q4_K and Q8_0: mode "i8" (`_repacked_i8_kernel`: x rounded to int8 per sub-block, DP4A on
    # the codes). Session 14 on the H200, geometric mean over the 8B products of Q4_K and Q8_0 of the
    # speed-up vs bf16 cuBLAS: fma-n64-g2 1.32x; i8-n32-g4-s1 1.15x, i8-n128-g2-w8-s1 1.12x,
    # i8-n128-g1-s1-p1024 1.07x (best on Q4_K's gate_up / down, 2-8% ahead of fma; behind on Q8_0).
    # Dropped then: i8-n64-g2 (two stages: every small load an async copy, 8-13x slower) and three
    # i8-n64/n128 variants at 1.03-1.07x. A thread per (row, group) needs BLOCK_N * NG >= the threads.
    # 8-64 rows, Q4_K and Q5_K: modes "f16" and "f16s" (`triton_gguf_f16`). Session 17 on the H200 (Q4_K,
    # us against the best "int" config at the same product): f16s-n128 wins where there are many weight
    # rows (gate_up 24576x4096 at 8 / 64 rows 42.6 / 72.2 against 63.3 / 86.1; the 151936-row head 1.3-1.8x)
    # and loses on the 4096-row products (o, down: 0.75-0.87x; a short K walk per program after split-K,
    # and `prepare_x`'s launch), hence picks per product shape. Exact "f16" ran as fast as "f16s" at
    # BLOCK_N 64 and slower at 128. Dropped: f16-n64, f16(s)-n128-w8, f16s-n128-w8-s3, f16s-n64 (0.44-0.70x
    # bf16 where f16s-n128-p256 made 0.60-0.94x).
    "f16-n128": RepackedConfig("f16", 128, 1, programs=128),
    "f16s-n64-p512": RepackedConfig("f16s", 64, 1, programs=512),
    "f16s-n128": RepackedConfig("f16s", 128, 1, programs=128),
    "f16s-n128-p256": RepackedConfig("f16s", 128, 1, programs=256),
    "f16s-n128-p512": RepackedConfig("f16s", 128, 1, programs=512),
    "f16s-n256-w8": RepackedConfig("f16s", 256, 1, warps=8, programs=128),
    # session 19's candidates for the 4096-row Q4_K products (o, down) at 8-64 rows, where "int" still
    # wins: 64-row tiles with fewer programs (a longer K walk each, fewer partials), and a third stage
    "f16s-n64-p256": RepackedConfig("f16s", 64, 1, programs=256),
    "f16s-n64-p128": RepackedConfig("f16s", 64, 1, programs=128),
    "f16s-n64-s3-p256": RepackedConfig("f16s", 64, 1, stages=3, programs=256),
    # 8-64 rows, Q4_K and Q6_K: mode "g16" (`gluon_gguf_g16`, Gluon): f16s's float16 tensor-core products with each
    # plane's wgmma left in flight while the next plane is dequantized (f16s waits for every one); the
    # minimums folded into the weights. Session 23's sweep: 1.11-1.32x the shipped picks at 8-64 rows
    # (g16-n64-p256 and -p512 picked for most shapes; g16-n128-s1-p128 dropped, never near the best).
    # stages 2: the next group's code words prefetched into registers (at 128 rows a warp group they spill).
    # Session 23: two warp groups of 64 rows sharing one copy of x16 (warps=8: g16-n128-w8-p256, -p128,
    # -s1-p256) lost at every row count (0.68-1.35x bf16 against n64's 0.85-1.54x).
    "g16-n128-s1-p256": RepackedConfig("g16", 128, 1, stages=1, programs=256),
    "g16-n64-p512": RepackedConfig("g16", 64, 1, programs=512),
    "g16-n64-p256": RepackedConfig("g16", 64, 1, programs=256),
    "g16-n64-s1-p512": RepackedConfig("g16", 64, 1, stages=1, programs=512),
    # Session 24: Q4_K's code words copied into a shared-memory ring of 3-4 turns with x16 (g16-n64-s3-p256,
    # -s4-p256, -s4-p512) lost at every product and row count (0.61-0.91x g16-n64-p256).
    # unmeasured (written in session 22, whose device time ran out first): a pipeline stage more or less for
    # the shipped f16s tile at 32-64 rows, and a fourth stage for "int" (the e4m3 tiles gained 4-7% at
    # 64-256 rows from deeper pipelines that session; bf16's split-K tiles nothing)
    "f16s-n128-s3-p256": RepackedConfig("f16s", 128, 1, stages=3, programs=256),
    "f16s-n128-s1-p256": RepackedConfig("f16s", 128, 1, stages=1, programs=256),
    "int-n64-g1-s4": RepackedConfig("int", 64, 1, stages=4, programs=512),
    "int-n64-g1-s4-p256": RepackedConfig("int", 64, 1, stages=4, programs=256),
    # 1 row, Q4_K and Q6_K: mode "h2" (`triton_gguf_h2`, float16 pairs; SASS 2.3-3.0 instructions a weight for
    # Q4_K against fma's 6.5, 3.9-4.6 for Q6_K against ~9.5); `quads` is the threads that share a (row,
    # group); stages 1 loads each group then computes it, 0 sends the first group's loads out before x's
    # preparation, 2 loads the next group into registers before this one's arithmetic. Session 18,
    # geometric mean over the 8B products of the speed-up vs bf16 cuBLAS, Q4_K: n64-t2-s1 1.52-1.54x,
    # n128-t1-s1 1.50-1.52x, n64-t2-p256 1.44x (won qkv), n128-t1-p256 1.45x, n64-t2 1.44x, n128-t1 1.42x,
    # n64-t4-s1 1.38x (fma-n64-g2 1.34x, i8-n32-g4-s1 1.42x); Q6_K: n64-t2-s1 1.16x (the shipped
    # fma-n16-g2-s3-p256 ~0.95x). Dropped: n256-t1-s1 1.08x, n64-t2-p1024 1.34x, n64-t2-atomic 1.34x,
    # n32-t4 1.01x, n16-t8 0.46x, and every launch with Triton's own pipelining through shared memory
    # (0.46-0.80x). Engine Q4_K_M B=1: 244 (fma) -> 270 (h2 for Q4_K) -> 278 tok/s (and Q6_K).
    "h2-n128-t1": RepackedConfig("h2", 128, 1, programs=512, quads=1),
    "h2-n128-t1-s1": RepackedConfig("h2", 128, 1, stages=1, programs=512, quads=1),
    "h2-n128-t1-s0": RepackedConfig("h2", 128, 1, stages=0, programs=512, quads=1),
    "h2-n128-t1-p256": RepackedConfig("h2", 128, 1, programs=256, quads=1),
    # session 19's candidates around the stages-0 pick: more split-K programs or fewer, two rows a
    # thread (more loads in flight a thread), and smaller programs (more of them an SM)
    "h2-n128-t1-s0-p1024": RepackedConfig("h2", 128, 1, stages=0, programs=1024, quads=1),
    "h2-n128-t1-s0-p256": RepackedConfig("h2", 128, 1, stages=0, programs=256, quads=1),
    "h2-n128-t1-s0-w2": RepackedConfig("h2", 128, 1, warps=2, stages=0, programs=512, quads=1),
    "h2-n256-t1-s0": RepackedConfig("h2", 256, 1, stages=0, programs=512, quads=1),
    "h2-n256-t1-s0-w8": RepackedConfig("h2", 256, 1, warps=8, stages=0, programs=512, quads=1),
    "h2-n64-t1-s0-w2": RepackedConfig("h2", 64, 1, warps=2, stages=0, programs=512, quads=1),
    "h2-n32-t1-s0-w1": RepackedConfig("h2", 32, 1, warps=1, stages=0, programs=1024, quads=1),
    "h2-n64-t2": RepackedConfig("h2", 64, 1, programs=512, quads=2),
    "h2-n64-t2-s1": RepackedConfig("h2", 64, 1, stages=1, programs=512, quads=2),
    "h2-n64-t2-s0": RepackedConfig("h2", 64, 1, stages=0, programs=512, quads=2),
    "h2-n64-t2-s0-p1024": RepackedConfig("h2", 64, 1, stages=0, programs=1024, quads=2),
    "h2-n64-t2-s0-p256": RepackedConfig("h2", 64, 1, stages=0, programs=256, quads=2),
    "h2-n64-t2-p256": RepackedConfig("h2", 64, 1, programs=256, quads=2),
    "h2-n64-t4": RepackedConfig("h2", 64, 1, programs=512, quads=4),
    "h2-n64-t4-s1": RepackedConfig("h2", 64, 1, stages=1, programs=512, quads=4),
    "i8-n32-g4-s1": RepackedConfig("i8", 32, 4, stages=1, programs=512),
    "i8-n128-g2-w8-s1": RepackedConfig("i8", 128, 2, warps=8, stages=1, programs=256),
    "i8-n128-g1-s1-p1024": RepackedConfig("i8", 128, 1, stages=1, programs=1024),
    # Session 15 (G33 and a sweep after it, Q4_K at 1 row, speed-up over fma-n64-g2 per 8B product): a
    # (row, group)'s quads spread over 4 or 8 threads (`quads`, so that warp loads cover whole sectors
    # as fma's do; i8-n32-g2-q4, i8-n64-g1-q4, i8-n16-g2-q8) 0.73-1.00x, prediction 1.3-1.6x; 2, 4 or 8
    # rows a thread sharing one load of x (i8-n64-g4-s1, i8-n128-g4-s1, i8-n256-g4-s1, i8-n128-g2-s1;
    # SASS LDG 0.18 -> 0.07-0.11 a weight) lost too but on the head (169 us against fma's 181). Nsight
    # Compute on the head: i8-n32-g4-s1 is bound by L1 (90% of L1/TEX throughput; 22 of its 31 cycles
    # between issues wait on L1), fma-n64-g2 by issue (71% SM throughput at 18% occupancy). All
    # dropped. Session 16 (G33): both at once, a group's quads over 4 (2) threads and 4 rows a thread
    # (i8-n128-g1-q4, i8-n64-g2-q4, i8-n128-g1-q2; SASS 2.07-2.21 instructions a weight) 1.06-1.13x bf16
    # against fma-n64-g2's 1.16x and i8-n32-g4-s1's 1.21x (prediction 1.15-1.4x over fma); ncu on the
    # head: still 94% of L1/TEX throughput. Dropped.
    # "fma" at the tiles the session-14 --wide sweep picked at 1 row for Q4_K (fma-n64-g2-s2-p256) ...
    "fma-n64-g2": RepackedConfig("fma", 64, 2, programs=256),
    "fma-n64-g2-p512": RepackedConfig("fma", 64, 2, programs=512),  # ... and for Q8_0
    "fma-n16-g2-s3-p256": RepackedConfig("fma", 16, 2, stages=3, programs=256),  # ... and for Q6_K
    # Session 16 (G33): the offsets folded out of the per-weight work (acc += (scale * code) * x, the
    # offset once per (row, group, plane) on the sum of x; SASS at 1 row, Q4_K 6.48 -> 5.84 instructions
    # a weight) ran 0.94x bf16 against the unfolded tile's 1.16x (prediction 5-10% faster): the sums of
    # x cost a cross-lane reduction and registers in a kernel held to 18% occupancy by registers. Removed.
}
I8_TYPES = ("Q4_K", "Q8_0")
# 17 to MAX_INT_ROWS rows. 2026-12-02 sweep, geometric mean over the 8B products and Q4_K/Q6_K/Q8_0 of
# the speed-up vs bf16 cuBLAS at 32 / 64 rows: int-n64-g1 0.77x / 0.51x, -s3 0.80x / 0.49x, int-n128-g1
# (the first, unmeasured choice) 0.58x / 0.35x. Q4_K_M B=64 in the engine: 5,064 -> 6,851 tok/s.
INT_MANY_ROWS_CONFIG = CONFIGS["int-n64-g1"]
FMA_MAX_ROWS = 4
MODE_MAX_ROWS = {"fma": FMA_MAX_ROWS, "dot": MAX_INT_ROWS, "int": MAX_INT_ROWS, "i8": 1, "f16": MAX_INT_ROWS,
                 "f16s": MAX_INT_ROWS, "g16": MAX_INT_ROWS, "h2": 1}
# Mode "h2" (`triton_gguf_h2`: one row in float16 pairs on the CUDA cores, x scaled per split-K slice)
# takes `gguf_repack.H2_TYPES`; its `quads` is the threads that share a (row, group).
# Modes "f16" and "f16s" (`triton_gguf_f16`: float16 tensor cores with the sub-block scales inside the
# weights; "f16" keeps them exact and rescales once a 256-column group, "f16s" folds d in as well and
# rounds each weight once to float16) take `gguf_repack.F16_TYPES`, "f16s" Q6_K too (`F16S_TYPES`).
# Mode "g16" (`gluon_gguf_g16`, Q4_K and Q6_K on Hopper with Gluon) reads the same preparation.
F16_MODES = ("f16", "f16s", "g16")
F16_MODE_TYPES = {"f16": F16_TYPES, "f16s": F16S_TYPES, "g16": ("Q4_K", "Q6_K")}  # the types each of them takes
# (qtype, rows 1..MAX_INT_ROWS) -> config, and (qtype, rows, N, K) -> config where one product shape
# has its own pick: the device sweep's picks (bench/gpu_gguf_repacked.py writes
# them as JSON), taken from gguf_repacked_table.json beside this file, then from
# $ONEBIT_GGUF_REPACKED_TABLE over it (a sweep of a few row counts replaces just those). Types the
# sweep leaves out (Q5_K) take what won for the others: "fma" at 1-2 rows, "int" above.
TABLE_ENV = "ONEBIT_GGUF_REPACKED_TABLE"
TABLE_FILE = Path(__file__).with_name("gguf_repacked_table.json")
DEFAULT = {(qtype, m): CONFIGS["fma-n32-g2"] if m <= 2 else CONFIGS["int-n64-g1-s3"] if m <= MAX_KERNEL_ROWS
           else INT_MANY_ROWS_CONFIG for qtype in GROUPING for m in range(1, MAX_INT_ROWS + 1)}


def table_from_json(text: str) -> dict[tuple, RepackedConfig]:
    """{key: {rows: config fields}} (the sweep's file) -> {(qtype, rows): RepackedConfig}, the rows
    between two measured counts taking the config of the next measured count up. Up to 16 rows the
    rows past the last measured count take its config; above 16 (the tensor-core modes only) they
    are left to the default. A key "QTYPE" sets a type's picks; a key "QTYPE NxK" (weight rows x
    columns) one product shape's, which `matmul_few_rows` prefers: entries (qtype, rows, N, K), from
    its smallest measured count up only (below it, the type's picks hold)."""
    table = {}
    for key, by_rows in json.loads(text).items():
        qtype, *shape = key.split()
        shape = tuple(int(v) for v in shape[0].split("x")) if shape else ()
        measured = sorted((int(m), RepackedConfig(**fields)) for m, fields in by_rows.items())
        few = [(rows, c) for rows, c in measured if rows <= MAX_KERNEL_ROWS]
        for m in range(measured[0][0] if shape and measured else 1, MAX_INT_ROWS + 1):
            chosen = next((c for rows, c in measured if rows >= m), None)
            if chosen is None and m <= MAX_KERNEL_ROWS and few:
                chosen = few[-1][1]
            if chosen is not None and m <= MODE_MAX_ROWS[chosen.mode]:  # a 1-row "i8" pick stays at 1 row
                table[(qtype, m) + shape] = chosen
    return table


def _load_table() -> None:
    for path in (TABLE_FILE if TABLE_FILE.exists() else None, os.environ.get(TABLE_ENV)):
        if path:
            DEFAULT.update(table_from_json(Path(path).read_text()))


_load_table()


@triton.jit
def _f16_low(bits):
    """The f16 whose bits are the low 16 of int32 `bits`, as float32."""
    return (bits & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _byte_of(words, j: tl.constexpr):
    """Byte j (0-3) of int32 `words` as int32 0..255."""
    return (words >> (8 * j)) & 255


@triton.jit
def _q8_0_plane_d(w0, w1, j: tl.constexpr):
    """Q8_0's d of plane j (0-3) as float32: the f16 halves of w0 (planes 0, 1), then of w1 (2, 3)."""
    if j < 2:
        return _f16_low(w0 >> (16 * j))
    return _f16_low(w1 >> (16 * (j - 2)))


@triton.jit
def _plane_byte(lower, upper, j: tl.constexpr):
    """Byte j (0-7) of the eight bytes held by int32 `lower` (0-3) and `upper` (4-7), as int32 0..255."""
    if j < 4:
        return _byte_of(lower, j % 4)
    return _byte_of(upper, j % 4)


@triton.jit
def _load_scales(s_ptr, d_ptr, rn64, n_ok, stride_sn, stride_dn, g, QTYPE: tl.constexpr):
    """The scale words of groups g [NG] of rows rn [BN]: four [BN, NG] int32 tensors and d's (float32)."""
    mask = n_ok[:, None]
    if QTYPE == 0:  # two words of f16 d's per 128-group (blocks 4g..4g+3)
        drow = d_ptr + rn64[:, None] * stride_dn + (2 * g)[None, :]
        w0 = tl.load(drow, mask=mask, other=0)
        w1 = tl.load(drow + 1, mask=mask, other=0)
        return w0, w1, w0, w1, tl.zeros_like(w0).to(tl.float32), tl.zeros_like(w0).to(tl.float32)
    elif QTYPE == 3:  # two words of int8 scales per 128-group; a float32 d per super-block (2 groups)
        srow = s_ptr + rn64[:, None] * stride_sn + (2 * g)[None, :]
        w0 = tl.load(srow, mask=mask, other=0)
        w1 = tl.load(srow + 1, mask=mask, other=0)
        d = tl.load(d_ptr + rn64[:, None] * stride_dn + (g // 2)[None, :], mask=mask, other=0.0)
        return w0, w1, w0, w1, d, d
    else:  # four words per super-block (scales 0-3, 4-7, mins 0-3, 4-7); one word (d, dmin)
        srow = s_ptr + rn64[:, None] * stride_sn + (4 * g)[None, :]
        w0 = tl.load(srow, mask=mask, other=0)
        w1 = tl.load(srow + 1, mask=mask, other=0)
        w2 = tl.load(srow + 2, mask=mask, other=0)
        w3 = tl.load(srow + 3, mask=mask, other=0)
        dw = tl.load(d_ptr + rn64[:, None] * stride_dn + g[None, :], mask=mask, other=0)
        return w0, w1, w2, w3, _f16_low(dw), _f16_low(dw >> 16)


@triton.jit
def _plane_scale(w0, w1, w2, w3, d, dmin, j: tl.constexpr, QTYPE: tl.constexpr):
    """Plane j's (scale, offset) [BN, NG] float32: value = scale * unsigned code - offset."""
    if QTYPE == 0:
        scale = _q8_0_plane_d(w0, w1, j)
        return scale, 128.0 * scale
    elif QTYPE == 3:
        if j < 4:
            sc = ((w0 << (24 - 8 * (j % 4))) >> 24).to(tl.float32)  # sign-extended byte
        else:
            sc = ((w1 << (24 - 8 * (j % 4))) >> 24).to(tl.float32)
        scale = d * sc
        return scale, 32.0 * scale
    else:
        sc = _plane_byte(w0, w1, j).to(tl.float32)
        mn = _plane_byte(w2, w3, j).to(tl.float32)
        return d * sc, dmin * mn


@triton.jit
def _plane_weights(words, upper, high, scale, offset, j: tl.constexpr, QTYPE: tl.constexpr):
    """Plane j's weights scale * code - offset [BN, NG, LANES], float32, exact as the GGUF reference.

    The code is not shifted down: masked in place (bits B*jj.., jj = j % (PLANES / 2), in `words` for
    the lower half of the planes, else in `upper` = words >> 16) and given the exponent of 2**E,
    E = 23 - B*jj, so the float is f = 2**E + code with one LOP3; then fma(f, scale, -2**E * scale)
    = code * scale exactly (the product has at most 22 significant bits)."""
    if QTYPE == 0:
        jj: tl.constexpr = j % 2
        if j < 2:
            src = words
        else:
            src = upper
        bits = (src & (0xFF << (8 * jj))) ^ ((0x80 << (8 * jj)) | ((150 - 8 * jj) << 23))  # signed byte + 128
        e: tl.constexpr = 23 - 8 * jj
    else:
        jj: tl.constexpr = j % 4
        if j < 4:
            src = words
        else:
            src = upper
        bits = (src & (0xF << (4 * jj))) | ((150 - 4 * jj) << 23)
        if QTYPE == 2:  # the fifth bit (bit j of `high`) to bit 4jj + 4
            up: tl.constexpr = 4 * jj + 4 - j
            bits = bits | ((high << up) & (0x10 << (4 * jj)))
        elif QTYPE == 3:  # the top two bits (bits 2j, 2j + 1 of `high`) to bits 4jj + 4, 4jj + 5
            up: tl.constexpr = 4 * jj + 4 - 2 * j
            if up >= 0:
                bits = bits | ((high << up) & (0x30 << (4 * jj)))
            else:
                bits = bits | ((high >> (-up)) & (0x30 << (4 * jj)))
        e: tl.constexpr = 23 - 4 * jj
    f = bits.to(tl.float32, bitcast=True)
    s = scale[:, :, None]
    t = tl.fma(f, s, -(1 << e) * s)
    return t - offset[:, :, None]


@triton.jit
def _load_group_codes(c_ptr, h_ptr, rn64, n_ok, stride_cn, stride_hn, g0, NG: tl.constexpr, LANES: tl.constexpr,
                      QTYPE: tl.constexpr):
    """Codes words [BN, NG, LANES] of groups g0.. of rows rn, and the high bits (int32; zeros if none)."""
    gi = tl.arange(0, NG)
    lane = tl.arange(0, LANES)
    offs = (g0 + gi)[None, :, None] * LANES + lane[None, None, :]
    mask = n_ok[:, None, None]
    words = tl.load(c_ptr + rn64[:, None, None] * stride_cn + offs, mask=mask, other=0)
    if QTYPE == 2 or QTYPE == 3:
        high = tl.load(h_ptr + rn64[:, None, None] * stride_hn + offs, mask=mask, other=0).to(tl.int32)
    else:
        high = words
    return words, high


@triton.jit(do_not_specialize=["M", "GROUPS_PER_SPLIT", "stride_ysplit"])  # fewer compiled variants
def _repacked_kernel(x_ptr, c_ptr, h_ptr, s_ptr, d_ptr, y_ptr, M, N, GROUPS_PER_SPLIT,
                     stride_xm, stride_cn, stride_hn, stride_sn, stride_dn, stride_ym, stride_ysplit,
                     QTYPE: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, PLANES: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NG: tl.constexpr, USE_DOT: tl.constexpr,
                     REDUCE: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    # Program (pid_n, pid_k): rows pid_n * BLOCK_N.., groups pid_k * GROUPS_PER_SPLIT.. (a multiple of NG).
    # REDUCE 0: store into y; 1: the float32 partial into y + pid_k * stride_ysplit; 2: atomic add into y.
    pid_k, rn, rn64, rm, m_ok, n_ok = _program_tile(M, N, BLOCK_M, BLOCK_N)
    gi = tl.arange(0, NG)
    lane = tl.arange(0, LANES)
    # "fma": one [BN, NG, LANES] accumulator per activation row (up to 4, named: Triton has no lists),
    # in the layout of the loaded codes, so each thread scales only the few (row, group) pairs it holds.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc0 = tl.zeros((BLOCK_N, NG, LANES), dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    first = pid_k * GROUPS_PER_SPLIT
    for g0 in tl.range(first, first + GROUPS_PER_SPLIT, NG, num_stages=NUM_STAGES):
        words, high = _load_group_codes(c_ptr, h_ptr, rn64, n_ok, stride_cn, stride_hn, g0, NG, LANES, QTYPE)
        w0, w1, w2, w3, d, dmin = _load_scales(s_ptr, d_ptr, rn64, n_ok, stride_sn, stride_dn, g0 + gi, QTYPE)
        upper = words >> 16
        for j in tl.static_range(PLANES):
            scale, offset = _plane_scale(w0, w1, w2, w3, d, dmin, j, QTYPE)
            w = _plane_weights(words, upper, high, scale, offset, j, QTYPE)  # [BN, NG, LANES]
            cols = (g0 + gi)[:, None] * GROUP + j * LANES + lane[None, :]  # [NG, LANES]
            if USE_DOT:
                x = tl.load(x_ptr + rm[:, None, None] * stride_xm + cols[None, :, :], mask=m_ok[:, None, None],
                            other=0.0)
                x2 = tl.reshape(x, (BLOCK_M, NG * LANES))
                w2d = tl.reshape(w, (BLOCK_N, NG * LANES)).to(x_ptr.dtype.element_ty)
                if x_ptr.dtype.element_ty == tl.float32:
                    acc = tl.dot(x2, tl.trans(w2d), acc, input_precision="ieee")
                else:
                    acc = tl.dot(x2, tl.trans(w2d), acc)
            else:
                acc0 += w * tl.load(x_ptr + cols).to(tl.float32)[None, :, :]
                if BLOCK_M > 1:
                    acc1 += w * tl.load(x_ptr + stride_xm + cols, mask=cols * 0 + M > 1, other=0.0).to(tl.float32)[None, :, :]
                if BLOCK_M > 2:
                    acc2 += w * tl.load(x_ptr + 2 * stride_xm + cols, mask=cols * 0 + M > 2, other=0.0).to(tl.float32)[None, :, :]
                    acc3 += w * tl.load(x_ptr + 3 * stride_xm + cols, mask=cols * 0 + M > 3, other=0.0).to(tl.float32)[None, :, :]
    if not USE_DOT:
        acc = tl.where(rm[:, None] == 0, tl.sum(tl.sum(acc0, axis=2), axis=1)[None, :], acc)
        if BLOCK_M > 1:
            acc = tl.where(rm[:, None] == 1, tl.sum(tl.sum(acc1, axis=2), axis=1)[None, :], acc)
        if BLOCK_M > 2:
            acc = tl.where(rm[:, None] == 2, tl.sum(tl.sum(acc2, axis=2), axis=1)[None, :], acc)
            acc = tl.where(rm[:, None] == 3, tl.sum(tl.sum(acc3, axis=2), axis=1)[None, :], acc)
    ok = m_ok[:, None] & n_ok[None, :]
    _store_partial(y_ptr, y_ptr + rm[:, None] * stride_ym + rn[None, :], acc, ok, pid_k, stride_ysplit, REDUCE)


@triton.jit
def _lane_pairs(words, BLOCK_N: tl.constexpr, LANES: tl.constexpr):
    """int32 [BN, LANES] -> its even and odd lanes [BN, LANES / 2] (in registers: each thread holds
    consecutive lanes)."""
    return tl.split(tl.reshape(words, (BLOCK_N, LANES // 2, 2)))


@triton.jit
def _program_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (pid_n, pid_k)'s share of a few-row product: (pid_k, its weight rows rn and as int64,
    the activation rows rm, rm < M, rn < N)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    return tl.program_id(1), rn, rn.to(tl.int64), rm, rm < M, rn < N


@triton.jit
def _group_code_pairs(c_ptr, h_ptr, rn64, n_ok, stride_cn, stride_hn, g, BLOCK_N: tl.constexpr, LANES: tl.constexpr,
                      QTYPE: tl.constexpr):
    """Group g's codes of rows rn as `_plane_codes` takes them: (lo_pair, hi_pair, high_pair) int32
    [BN, LANES / 2], the even and odd lanes' words paired (Q8_0: the two words themselves)."""
    words, high = _load_group_codes(c_ptr, h_ptr, rn64, n_ok, stride_cn, stride_hn, g, 1, LANES, QTYPE)
    we, wo = _lane_pairs(tl.reshape(words, (BLOCK_N, LANES)), BLOCK_N, LANES)
    he, ho = _lane_pairs(tl.reshape(high, (BLOCK_N, LANES)), BLOCK_N, LANES)
    if QTYPE == 0:
        lo_pair = we
        hi_pair = wo
    else:
        lo_pair = (we & 0xFFFF) | (wo << 16)
        hi_pair = ((we >> 16) & 0xFFFF) | (wo & -65536)
    return lo_pair, hi_pair, (he & 0xFFFF) | (ho << 16)


@triton.jit
def _pairs_to_dtype(bits, BLOCK_N: tl.constexpr, LANES: tl.constexpr, DTYPE: tl.constexpr,
                    F16: tl.constexpr = False):
    """int32 [BN, LANES / 2] holding two bfloat16 (F16: float16) bit patterns (lane 2i low, lane 2i + 1
    high) -> DTYPE [BN, LANES] (the register is already what the tensor core takes: the unpacking folds
    away)."""
    lo = bits.to(tl.int16)
    hi = (bits >> 16).to(tl.int16)
    BITS: tl.constexpr = tl.float16 if F16 else tl.bfloat16
    q = tl.reshape(tl.join(lo, hi), (BLOCK_N, LANES)).to(BITS, bitcast=True)
    if DTYPE != BITS:
        q = q.to(DTYPE)
    return q


@triton.jit
def _plane_codes(lo_pair, hi_pair, high_pair, j: tl.constexpr, QTYPE: tl.constexpr, BLOCK_N: tl.constexpr,
                 LANES: tl.constexpr, DTYPE: tl.constexpr, F16: tl.constexpr = False):
    """Plane j's codes [BN, LANES] in DTYPE, exactly. Q4_K/Q5_K/Q6_K: 128 + the unsigned code, built two
    lanes at a time as the bits of two bfloat16s (exponent of 128, code in the low mantissa bits): one
    shift and one mask-and-or per two weights, no int-to-float conversion (the 128 is taken off with the
    sub-block's x sum); F16: 1024 + the code as two float16s the same way. lo_pair/hi_pair: bits 0-15 /
    16-31 of the even lane's word in the low half and the odd lane's in the high half; high_pair
    likewise for the high bits. Q8_0: the signed code, through float32 (its 8-bit codes do not fit the
    7-bit bfloat16 mantissa)."""
    if QTYPE == 0:
        we = lo_pair  # Q8_0: the words themselves, even and odd lanes
        wo = hi_pair
        ue = ((we >> (8 * j)) & 0xFF) ^ 0x80  # the code + 128, 0..255
        uo = ((wo >> (8 * j)) & 0xFF) ^ 0x80
        fe = (ue | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0  # 2**23 + u - 2**23 - 128
        fo = (uo | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
        return tl.reshape(tl.join(fe, fo), (BLOCK_N, LANES)).to(DTYPE)
    return _pairs_to_dtype(_plane_code_bits(lo_pair, hi_pair, high_pair, j, QTYPE, F16), BLOCK_N, LANES, DTYPE, F16)


@triton.jit
def _plane_code_bits(lo_pair, hi_pair, high_pair, j: tl.constexpr, QTYPE: tl.constexpr, F16: tl.constexpr):
    """`_plane_codes`' int32 [BN, LANES / 2] before the conversion (Q4_K/Q5_K/Q6_K): two bfloat16s
    128 + code (F16: two float16s 1024 + code) a word, the even lane's in the low half."""
    jj: tl.constexpr = j % 4
    if j < 4:
        src = lo_pair
    else:
        src = hi_pair
    if F16:
        bits = ((src >> (4 * jj)) & 0x000F000F) | 0x64006400  # f16 0x6400 = 1024.0
    else:
        bits = ((src >> (4 * jj)) & 0x000F000F) | 0x43004300  # bf16 0x4300 = 128.0
    if QTYPE == 2:  # the fifth bit: bit j of the high byte (lane 2i in bits 0-7, 2i + 1 in 16-23)
        if j <= 4:
            bits = bits | ((high_pair << (4 - j)) & 0x00100010)
        else:
            bits = bits | ((high_pair >> (j - 4)) & 0x00100010)
    elif QTYPE == 3:  # the top two bits: bits 2j, 2j + 1 of the high int16
        if 2 * j <= 4:
            bits = bits | ((high_pair << (4 - 2 * j)) & 0x00300030)
        else:
            bits = bits | ((high_pair >> (2 * j - 4)) & 0x00300030)
    return bits


@triton.jit
def _byte_to_float(byte):
    """int32 0..255 -> float32, exactly, with a mask-and-or and a subtraction (int-to-float conversion
    runs at an eighth of the integer rate)."""
    return (byte | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _plane_scale_int(w0, w1, w2, w3, d, dmin, j: tl.constexpr, QTYPE: tl.constexpr):
    """Plane j's (scale, offset) [BN, 1] float32 for mode "int", the same values as `_plane_scale`:
    value = scale * code - offset with Q8_0's code signed, Q6_K's code - 32 (offset 0 for both)."""
    if QTYPE == 0:
        scale = _q8_0_plane_d(w0, w1, j)
        return scale, 0.0 * scale
    elif QTYPE == 3:
        sc = _byte_to_float(_plane_byte(w0, w1, j) ^ 0x80) - 128.0  # the signed byte
        return d * sc, 0.0 * sc
    else:
        sc = _byte_to_float(_plane_byte(w0, w1, j))
        mn = _byte_to_float(_plane_byte(w2, w3, j))
        return d * sc, dmin * mn


@triton.jit
def _dot_f32(a, b, IEEE: tl.constexpr):
    """a @ b with float32 accumulation (IEEE float32 products when the operands are float32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit(do_not_specialize=["M", "GROUPS_PER_SPLIT", "stride_ysplit"])
def _repacked_int_kernel(x_ptr, c_ptr, h_ptr, s_ptr, d_ptr, y_ptr, M, N, GROUPS_PER_SPLIT,
                         stride_xm, stride_cn, stride_hn, stride_sn, stride_dn, stride_ym, stride_ysplit,
                         QTYPE: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, PLANES: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NG: tl.constexpr, REDUCE: tl.constexpr,
                         NUM_STAGES: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    # Mode "int": per sub-block (plane j of group g: LANES columns with one scale s and offset o per
    # weight row) D = codes @ x.T on the tensor cores with the exact codes, then acc += s * D - o' * xsum,
    # xsum = the sub-block's x sum (also a tensor-core product, with ones: it lands in acc's layout).
    # acc is [BLOCK_N, BLOCK_M] (weights as the left operand). Grid and REDUCE as `_repacked_kernel`.
    pid_k, rn, rn64, rm, m_ok, n_ok = _program_tile(M, N, BLOCK_M, BLOCK_N)
    lane = tl.arange(0, LANES)
    one = tl.arange(0, 1)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    ones = tl.full((BLOCK_N, LANES), 1.0, dtype=DTYPE)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    x_lanes = x_ptr + rm[None, :] * stride_xm + lane[:, None]  # [LANES, BM]: one sub-block's x, transposed
    x_ok = m_ok[None, :] & (lane[:, None] < LANES)
    first = pid_k * GROUPS_PER_SPLIT
    for g0 in tl.range(first, first + GROUPS_PER_SPLIT, NG, num_stages=NUM_STAGES):
        for gi in tl.static_range(NG):
            g = g0 + gi
            lo_pair, hi_pair, high_pair = _group_code_pairs(c_ptr, h_ptr, rn64, n_ok, stride_cn, stride_hn, g,
                                                            BLOCK_N, LANES, QTYPE)
            w0, w1, w2, w3, d, dmin = _load_scales(s_ptr, d_ptr, rn64, n_ok, stride_sn, stride_dn, g + one, QTYPE)
            for j in tl.static_range(PLANES):
                scale, offset = _plane_scale_int(w0, w1, w2, w3, d, dmin, j, QTYPE)  # [BN, 1]
                xt = tl.load(x_lanes + (g * GROUP + j * LANES), mask=x_ok, other=0.0)
                dots = _dot_f32(_plane_codes(lo_pair, hi_pair, high_pair, j, QTYPE, BLOCK_N, LANES, DTYPE), xt, IEEE)  # [BN, BM]
                acc += scale * dots  # one FMA per output and sub-block
                if QTYPE != 0:  # the codes carry 128 + code: take 128 * scale (and the offset) * xsum off
                    xsum = _dot_f32(ones, xt, IEEE)
                    if QTYPE == 3:  # Q6_K's value: scale * (code - 32)
                        acc -= (160.0 * scale) * xsum
                    else:
                        acc -= (offset + 128.0 * scale) * xsum
    ok = m_ok[None, :] & n_ok[:, None]
    _store_partial(y_ptr, y_ptr + rm[None, :] * stride_ym + rn[:, None], acc, ok, pid_k, stride_ysplit, REDUCE)


@triton.jit
def _quantize_x_i8_kernel(x_ptr, q_ptr, dx_ptr, xs_ptr, GROUP: tl.constexpr, LANES: tl.constexpr,
                          PLANES: tl.constexpr):
    # Mode "i8"'s activation row, group g (one program): each sub-block (plane j: LANES columns)
    # rounded to int8 with its own step dx = max|x| / 127, xq = floor(x * 127 / max|x| + 0.5), packed
    # four lanes a word in the order the product reads them (word (g, q, j) = lanes 4q..4q+3 of plane
    # j); dx and the float sum of x per sub-block beside. Reference: `gguf_repack.quantize_sub_blocks_i8`.
    g = tl.program_id(0)
    plane = tl.arange(0, PLANES)
    lane = tl.arange(0, LANES)
    x = tl.load(x_ptr + g * GROUP + plane[:, None] * LANES + lane[None, :]).to(tl.float32)  # [PLANES, LANES]
    amax = tl.max(tl.abs(x), axis=1)
    xq = tl.floor(x * tl.where(amax > 0.0, 127.0 / amax, 0.0)[:, None] + 0.5).to(tl.int32)
    shifts = 8 * tl.arange(0, 4)
    words = tl.sum((tl.reshape(xq, (PLANES, LANES // 4, 4)) & 255) << shifts[None, None, :], axis=2)  # bytes: sum = or
    quad = tl.arange(0, LANES // 4)
    tl.store(q_ptr + g * (PLANES * LANES // 4) + quad[None, :] * PLANES + plane[:, None], words)
    tl.store(dx_ptr + g * PLANES + plane, amax / 127.0)
    tl.store(xs_ptr + g * PLANES + plane, tl.sum(x, axis=1))


@triton.jit
def _split4(t, BLOCK_N: tl.constexpr, NG: tl.constexpr, QUADS: tl.constexpr):
    """[BN, NG, QUADS, 4] -> its four [BN, NG, QUADS] slices along the last axis (in registers: one thread
    holds the four)."""
    even, odd = tl.split(tl.reshape(t, (BLOCK_N, NG, QUADS, 2, 2)))
    t0, t2 = tl.split(even)
    t1, t3 = tl.split(odd)
    return t0, t1, t2, t3


@triton.jit
def _i8_scaled(sums, w0, w1, w2, w3, d, dmin, dx_ptr, g, j: tl.constexpr, PLANES: tl.constexpr,
               QTYPE: tl.constexpr):
    """Plane j's int32 sums [BN, NG, QUADS] times the plane's scale and x step, float32 (the offset is
    `_i8_offset`'s)."""
    scale, _ = _plane_scale_int(w0, w1, w2, w3, d, dmin, j, QTYPE)
    dx = tl.load(dx_ptr + g * PLANES + j)[None, :]
    return (scale * dx)[:, :, None] * sums.to(tl.float32)


@triton.jit
def _i8_offset(w0, w1, w2, w3, d, dmin, xs_ptr, g, j: tl.constexpr, PLANES: tl.constexpr, QTYPE: tl.constexpr):
    """Plane j's offset * sum(x) [BN, NG] (Q4_K; Q8_0's sums are on the signed codes: none)."""
    _, offset = _plane_scale_int(w0, w1, w2, w3, d, dmin, j, QTYPE)
    return offset * tl.load(xs_ptr + g * PLANES + j)[None, :]


@triton.jit(do_not_specialize=["GROUPS_PER_SPLIT", "stride_ysplit"])
def _repacked_i8_kernel(xq_ptr, dx_ptr, xs_ptr, c_ptr, s_ptr, d_ptr, y_ptr, N, GROUPS_PER_SPLIT,
                        stride_cn, stride_sn, stride_dn, stride_ysplit,
                        QTYPE: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, PLANES: tl.constexpr,
                        BLOCK_N: tl.constexpr, NG: tl.constexpr, QUADS: tl.constexpr, REDUCE: tl.constexpr,
                        NUM_STAGES: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    # Mode "i8" (Q4_K, Q8_0; one activation row, rounded to int8 per sub-block by
    # `_quantize_x_i8_kernel`): integer dot products, four weights an instruction. The codes are read
    # four words (lanes) a thread, QUADS such quads of a (row, group) at once: the four words' nibbles
    # (Q4_K: masked into the bytes of planes 0, 2, 4, 6 and 1, 3, 5, 7) or bytes (Q8_0: planes 0-3)
    # are transposed (PRMT) so that one word holds four lanes of one plane, then DP4A with the
    # matching word of xq adds them into that plane's int32 sum, exactly. Per plane and quad once a
    # group: acc += s * dx * sum, and per plane acc_o -= o * sum(x).
    # QUADS 1: one thread walks a (row, group)'s eight quads, and a warp's load touches 32 lines 16
    # bytes each; QUADS 4 / 8: four / eight threads share a (row, group), a quad each a load, so a
    # warp's load covers whole 32-byte sectors / 128-byte lines (as "fma" reads), and each thread
    # scales its own quads' sums (the per-plane scale work is repeated by the QUADS threads).
    # Grid and REDUCE as `_repacked_kernel` (0: store, 1: split-K partial, 2: atomic add).
    # Reference: `gguf_repack.repacked_i8_linear_ref`.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn64 = rn.to(tl.int64)
    n_ok = rn < N
    gi = tl.arange(0, NG)
    quad = tl.arange(0, QUADS)
    four = tl.arange(0, 4)
    acc = tl.zeros((BLOCK_N, NG, QUADS), dtype=tl.float32)
    acc_o = tl.zeros((BLOCK_N, NG), dtype=tl.float32)
    first = pid_k * GROUPS_PER_SPLIT
    for g0 in tl.range(first, first + GROUPS_PER_SPLIT, NG, num_stages=NUM_STAGES):
        g = g0 + gi
        s0 = tl.zeros((BLOCK_N, NG, QUADS), dtype=tl.int32)
        s1 = s0
        s2 = s0
        s3 = s0
        s4 = s0
        s5 = s0
        s6 = s0
        s7 = s0
        for q0 in tl.static_range(0, LANES // 4, QUADS):
            lanes = (g * LANES + 4 * q0)[None, :, None, None] + 4 * quad[None, None, :, None] + four[None, None, None, :]
            chunk = tl.load(c_ptr + rn64[:, None, None, None] * stride_cn + lanes, mask=n_ok[:, None, None, None],
                            other=0)  # [BN, NG, QUADS, 4]: lanes 4q..4q+3 of each quad q
            r0, r1, r2, r3 = _split4(chunk, BLOCK_N, NG, QUADS)
            # these quads' xq words of planes 0-3 (and 4-7), in the codes' layout (the same for every row)
            xw = (xq_ptr + (rn * 0)[:, None, None, None] + (g * (PLANES * LANES // 4) + q0 * PLANES)[None, :, None, None]
                  + (quad * PLANES)[None, None, :, None] + four[None, None, None, :])
            x0, x1, x2, x3 = _split4(tl.load(xw), BLOCK_N, NG, QUADS)
            if QTYPE == 0:  # bytes = planes 0-3, signed codes
                p0, p1, p2, p3 = transpose_bytes(r0, r1, r2, r3, ASM)
                s0 = dot4(p0, x0, s0, True, ASM)
                s1 = dot4(p1, x1, s1, True, ASM)
                s2 = dot4(p2, x2, s2, True, ASM)
                s3 = dot4(p3, x3, s3, True, ASM)
            else:  # nibbles: the low ones of each byte are planes 0, 2, 4, 6, the high ones 1, 3, 5, 7
                x4, x5, x6, x7 = _split4(tl.load(xw + 4), BLOCK_N, NG, QUADS)
                p0, p2, p4, p6 = transpose_bytes(r0 & 0x0F0F0F0F, r1 & 0x0F0F0F0F, r2 & 0x0F0F0F0F,
                                                 r3 & 0x0F0F0F0F, ASM)
                p1, p3, p5, p7 = transpose_bytes((r0 >> 4) & 0x0F0F0F0F, (r1 >> 4) & 0x0F0F0F0F,
                                                 (r2 >> 4) & 0x0F0F0F0F, (r3 >> 4) & 0x0F0F0F0F, ASM)
                s0 = dot4(p0, x0, s0, False, ASM)
                s1 = dot4(p1, x1, s1, False, ASM)
                s2 = dot4(p2, x2, s2, False, ASM)
                s3 = dot4(p3, x3, s3, False, ASM)
                s4 = dot4(p4, x4, s4, False, ASM)
                s5 = dot4(p5, x5, s5, False, ASM)
                s6 = dot4(p6, x6, s6, False, ASM)
                s7 = dot4(p7, x7, s7, False, ASM)
        w0, w1, w2, w3, d, dmin = _load_scales(s_ptr, d_ptr, rn64, n_ok, stride_sn, stride_dn, g, QTYPE)
        acc += _i8_scaled(s0, w0, w1, w2, w3, d, dmin, dx_ptr, g, 0, PLANES, QTYPE)
        acc += _i8_scaled(s1, w0, w1, w2, w3, d, dmin, dx_ptr, g, 1, PLANES, QTYPE)
        acc += _i8_scaled(s2, w0, w1, w2, w3, d, dmin, dx_ptr, g, 2, PLANES, QTYPE)
        acc += _i8_scaled(s3, w0, w1, w2, w3, d, dmin, dx_ptr, g, 3, PLANES, QTYPE)
        if PLANES > 4:
            acc += _i8_scaled(s4, w0, w1, w2, w3, d, dmin, dx_ptr, g, 4, PLANES, QTYPE)
            acc += _i8_scaled(s5, w0, w1, w2, w3, d, dmin, dx_ptr, g, 5, PLANES, QTYPE)
            acc += _i8_scaled(s6, w0, w1, w2, w3, d, dmin, dx_ptr, g, 6, PLANES, QTYPE)
            acc += _i8_scaled(s7, w0, w1, w2, w3, d, dmin, dx_ptr, g, 7, PLANES, QTYPE)
        if QTYPE != 0:
            for j in tl.static_range(PLANES):
                acc_o += _i8_offset(w0, w1, w2, w3, d, dmin, xs_ptr, g, j, PLANES, QTYPE)
    total = tl.sum(tl.sum(acc, axis=2), axis=1) - tl.sum(acc_o, axis=1)
    _store_partial(y_ptr, y_ptr + rn, total, n_ok, pid_k, stride_ysplit, REDUCE)


@triton.jit
def _dequantize_kernel(c_ptr, h_ptr, s_ptr, d_ptr, w_ptr, N, stride_cn, stride_hn, stride_sn, stride_dn, stride_wn,
                       QTYPE: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, PLANES: tl.constexpr,
                       BLOCK_N: tl.constexpr, NG: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn64 = rn.to(tl.int64)
    n_ok = rn < N
    g0 = tl.program_id(1) * NG
    gi = tl.arange(0, NG)
    lane = tl.arange(0, LANES)
    words, high = _load_group_codes(c_ptr, h_ptr, rn64, n_ok, stride_cn, stride_hn, g0, NG, LANES, QTYPE)
    w0, w1, w2, w3, d, dmin = _load_scales(s_ptr, d_ptr, rn64, n_ok, stride_sn, stride_dn, g0 + gi, QTYPE)
    upper = words >> 16
    for j in tl.static_range(PLANES):
        scale, offset = _plane_scale(w0, w1, w2, w3, d, dmin, j, QTYPE)
        w = _plane_weights(words, upper, high, scale, offset, j, QTYPE)
        cols = (g0 + gi)[:, None] * GROUP + j * LANES + lane[None, :]
        tl.store(w_ptr + rn64[:, None, None] * stride_wn + cols[None, :, :], w.to(w_ptr.dtype.element_ty),
                 mask=n_ok[:, None, None])


def _operands(weight: RepackedMatrix):
    """(codes, high, scales, d) as the kernels read them: scales and f16 d's as int32 words; absent
    arrays replaced by any valid pointer (never read)."""
    codes = weight.codes
    high = weight.high if weight.high.numel() else codes
    scales = weight.scales.view(torch.int32) if weight.scales.numel() else codes
    d = weight.d if weight.d.dtype == torch.float32 else weight.d.view(torch.int32)
    return codes, high, scales, d


def _meta(weight: RepackedMatrix) -> dict:
    group, lanes, _, planes = GROUPING[weight.qtype]
    return dict(QTYPE=QTYPE_IDS[weight.qtype], GROUP=group, LANES=lanes, PLANES=planes)


def dequantize(weight: RepackedMatrix, dtype: torch.dtype = torch.bfloat16, block_n: int = 16) -> torch.Tensor:
    """The RepackedMatrix `weight` as a dense [rows, cols] tensor of `dtype`, on its device (float32:
    equal to the GGUF reference bit for bit)."""
    codes, high, scales, d = _operands(weight)
    out = torch.empty(weight.rows, weight.cols, dtype=dtype, device=codes.device)
    groups = weight.cols // GROUPING[weight.qtype][0]
    ng = 2 if groups % 2 == 0 else 1
    _dequantize_kernel[(triton.cdiv(weight.rows, block_n), groups // ng)](
        codes, high, scales, d, out, weight.rows, codes.stride(0), high.stride(0), scales.stride(0), d.stride(0),
        out.stride(0), BLOCK_N=block_n, NG=ng, num_warps=4, **_meta(weight))
    return out


def _largest_dividing(value: int, limit: int) -> int:
    """The largest power of two at most `limit` that divides `value`."""
    out = 1
    while out * 2 <= limit and value % (out * 2) == 0:
        out *= 2
    return out


def plan(weight: RepackedMatrix, rows: int, config: RepackedConfig) -> tuple[int, int, int, int]:
    """(NG, split, BLOCK_M, REDUCE) of a launch: NG and split powers of two dividing the groups."""
    groups = weight.cols // GROUPING[weight.qtype][0]
    # mode "g16" walks whole 256-column super-blocks (Q6_K: two groups a turn)
    ng = _largest_dividing(groups, 256 // GROUPING[weight.qtype][0] if config.mode == "g16" else config.ng)
    turns = groups // ng
    row_tiles = triton.cdiv(weight.rows, config.block_n)
    if config.split:
        split = _largest_dividing(turns, config.split)
    else:
        split = 1
        while row_tiles * split < config.programs and turns % (split * 2) == 0:
            split *= 2
    # "int": the tensor cores pad a narrow activation tile themselves (Triton takes dots from 1 column);
    # "dot" pads to 16 rows, and from 64 its tile reaches sm_90's wgmma.
    block_m = max(16, triton.next_power_of_2(rows)) if config.mode == "dot" else triton.next_power_of_2(rows)
    reduce = 0 if split == 1 else 1 if config.reduce == "sum" else 2
    return ng, split, block_m, reduce


def quantize_x_i8(x: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mode "i8"'s activation row x [1, K] for a weight of `qtype`: (xq int32 words, four int8 lanes
    each, in the product's order; dx float32 and the sum of x float32 per sub-block)."""
    group, lanes, _, planes = GROUPING[qtype]
    groups = x.shape[1] // group
    xq = torch.empty(groups * planes * lanes // 4, dtype=torch.int32, device=x.device)
    dx = torch.empty(groups * planes, dtype=torch.float32, device=x.device)
    xs = torch.empty_like(dx)
    _quantize_x_i8_kernel[(groups,)](x, xq, dx, xs, GROUP=group, LANES=lanes, PLANES=planes, num_warps=4)
    return xq, dx, xs


def unpack_x_i8(xq: torch.Tensor, qtype: str) -> torch.Tensor:
    """`quantize_x_i8`'s words back to the int8 values, float32 [1, sub-blocks, LANES] in column order
    (the layout `gguf_repack.quantize_sub_blocks_i8` returns), for checking."""
    _, lanes, _, planes = GROUPING[qtype]
    b = torch.stack([(xq.long().reshape(1, -1) >> (8 * k)) & 255 for k in range(4)], dim=-1)
    b = torch.where(b > 127, b - 256, b).reshape(1, -1, lanes // 4, planes, 4)  # [1, group, quad, plane, 4]
    return b.permute(0, 1, 3, 2, 4).reshape(1, -1, lanes).float()


def _launch_i8(x, weight, target, grid, ng, groups_per_split, stride_split, reduce, config) -> None:
    codes, _, scales, d = _operands(weight)
    xq, dx, xs = quantize_x_i8(x, weight.qtype)
    _repacked_i8_kernel[grid](xq, dx, xs, codes, scales, d, target, weight.rows, groups_per_split, codes.stride(0),
                              scales.stride(0), d.stride(0), stride_split, BLOCK_N=config.block_n, NG=ng,
                              QUADS=config.quads, REDUCE=reduce, NUM_STAGES=config.stages,
                              ASM=x.device.type == "cuda", num_warps=config.warps, **_meta(weight), **pdl.options())


def _type_refusal(config: RepackedConfig, qtype: str) -> str | None:
    """Why `matmul_few_rows` refuses `config` for a weight of `qtype`, or None where its mode takes the type."""
    if config.mode == "i8" and qtype not in I8_TYPES:
        return f'mode "i8" takes {", ".join(I8_TYPES)}, not {qtype}'
    if config.mode in F16_MODES and qtype not in F16_MODE_TYPES[config.mode]:
        return f'mode "{config.mode}" takes {", ".join(F16_MODE_TYPES[config.mode])}, not {qtype}'
    if config.mode == "h2" and qtype not in H2_TYPES:
        return f'mode "h2" takes {", ".join(H2_TYPES)}, not {qtype}'
    return None


def takes(config: RepackedConfig, qtype: str) -> bool:
    """Whether `matmul_few_rows` runs `config` on a weight of `qtype` (its mode takes the type)."""
    return _type_refusal(config, qtype) is None


def config_for(weight: RepackedMatrix, m: int) -> RepackedConfig:
    """The launch `matmul_few_rows` takes for m rows of this weight when given none: DEFAULT[qtype, M, N,
    K], else DEFAULT[qtype, M], else INT_MANY_ROWS_CONFIG; a "g16" pick (Hopper's wgmma, measured on the
    H200) becomes G16_ELSEWHERE on a device that cannot run it."""
    config = (DEFAULT.get((weight.qtype, m, weight.rows, weight.cols))
              or DEFAULT.get((weight.qtype, m), INT_MANY_ROWS_CONFIG))
    if config.mode == "g16" and not runs_g16(weight.codes.device):
        return G16_ELSEWHERE
    return config


# What a "g16" pick runs where g16 cannot (a GPU other than Hopper, or a Triton without Gluon): the
# float16 tensor-core mode it came from, the Q4_K pick at 8-64 rows before g16 (session 21's table).
G16_ELSEWHERE = CONFIGS["f16s-n128-p256"]


@functools.lru_cache(maxsize=None)
def runs_g16(device: torch.device) -> bool:
    """Whether mode "g16" runs on this device: a CUDA GPU of compute capability 9.x (wgmma) and a Triton
    whose Gluon compiles the kernel."""
    from onebit.kernels import gluon_gguf_g16

    return (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
            and gluon_gguf_g16.compiles())


def _takes_few_rows(m: int) -> bool:
    """Whether `matmul` sends m rows to `matmul_few_rows` (else: the dequantized weight and cuBLAS)."""
    return m <= MAX_KERNEL_ROWS or (m <= MAX_INT_ROWS and INT_ABOVE_FEW_ROWS)


def reads_f16_rows(weight: RepackedMatrix, m: int) -> bool:
    """Whether `matmul` runs m rows of this weight in a mode that reads `F16Rows`' preparation ("f16",
    "f16s"), so that a producer making it saves that product its `prepare_x` launch."""
    return _takes_few_rows(m) and config_for(weight, m).mode in F16_MODES


def matmul_few_rows(x: torch.Tensor | F16Rows, weight: RepackedMatrix, out: torch.Tensor | None = None,
                    config: RepackedConfig | None = None) -> torch.Tensor:
    """x [M, K] @ weight.T into out [M, rows] (fresh when None; a column slice of a wider output is
    fine: unit column stride), M up to the mode's MODE_MAX_ROWS. config None: `config_for` (the
    sweep's table). x may come as `F16Rows` (modes "f16"/"f16s" then skip `prepare_x`). Reference:
    `gguf_repack.repacked_linear_ref`."""
    prepared = x if isinstance(x, F16Rows) else None
    if prepared is not None:
        x = prepared.x
    m, k = x.shape
    if k != weight.cols:
        raise ValueError(f"x has {k} columns, the weight {weight.cols}")
    config = config or config_for(weight, m)
    most = MODE_MAX_ROWS.get(config.mode)
    if most is None or config.reduce not in ("sum", "atomic"):
        raise ValueError(f"unknown config {config}")
    if not 1 <= m <= most:
        raise ValueError(f'matmul_few_rows takes 1 to {most} rows in mode "{config.mode}", got {m}')
    refusal = _type_refusal(config, weight.qtype)
    if refusal:
        raise ValueError(refusal)
    if config.mode == "g16" and (x.device.type != "cuda" or config.block_n not in (64, 128)
                                 or config.reduce != "sum"):
        raise ValueError(f'mode "g16" runs on a CUDA device with 64 or 128 weight rows a program and split-K sums, '
                         f'not {x.device.type} with {config.block_n} and "{config.reduce}"')
    if config.quads not in (1, 2, 4, 8) or (config.quads > 1 and config.mode not in ("i8", "h2")):
        raise ValueError(f"unknown config {config}")
    if out is None:
        out = torch.empty(m, weight.rows, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    codes, high, scales, d = _operands(weight)
    ng, split, block_m, reduce = plan(weight, m, config)
    groups = weight.cols // GROUPING[weight.qtype][0]
    target, stride_t, stride_split = out, out.stride(0), 0
    if reduce == 1:
        target = torch.empty(split, m, weight.rows, dtype=torch.float32, device=x.device)
        stride_t, stride_split = weight.rows, m * weight.rows
    elif reduce == 2:
        out.zero_()
    args = (x, codes, high, scales, d, target, m, weight.rows, groups // split, x.stride(0), codes.stride(0),
            high.stride(0), scales.stride(0), d.stride(0), stride_t, stride_split)
    grid = (triton.cdiv(weight.rows, config.block_n), split)
    if config.mode == "i8":
        _launch_i8(x, weight, target, grid, ng, groups // split, stride_split, reduce, config)
    elif config.mode == "h2":
        from onebit.kernels import triton_gguf_h2  # beside triton_gguf_f16, which builds on this module

        triton_gguf_h2.launch(x, codes, high, scales, d, target, weight.rows, weight.qtype, groups // split,
                              stride_split, grid, config.block_n, config.quads, reduce, config.stages, config.warps)
    elif config.mode == "g16":
        from onebit.kernels import gluon_gguf_g16, triton_gguf_f16

        if not gluon_gguf_g16.available():
            raise ValueError('mode "g16" needs a Triton with Gluon (3.5 or later)')
        x16, _, xe = triton_gguf_f16.prepare_x(x) if prepared is None else prepared[1:]
        gluon_gguf_g16.launch(x16, xe, codes, high, scales, d, target, weight.rows, weight.qtype, groups // split,
                              stride_t, stride_split, grid, config.block_n, reduce, config.stages, config.warps)
    elif config.mode in F16_MODES:
        from onebit.kernels import triton_gguf_f16  # it builds on this module's helpers

        triton_gguf_f16.launch(x, codes, high, scales, d, target, weight.rows, groups // split, stride_t, stride_split,
                               grid, config.block_n, reduce, config.stages, config.warps, config.mode == "f16s",
                               _meta(weight), prepared)
    elif config.mode == "int":
        _repacked_int_kernel[grid](*args, BLOCK_M=block_m, BLOCK_N=config.block_n, NG=ng, REDUCE=reduce,
                                   NUM_STAGES=config.stages, num_warps=config.warps, **_meta(weight),
                                   **pdl.options())
    else:
        _repacked_kernel[grid](*args, BLOCK_M=block_m, BLOCK_N=config.block_n, NG=ng, USE_DOT=config.mode == "dot",
                               REDUCE=reduce, NUM_STAGES=config.stages, num_warps=config.warps, **_meta(weight),
                               **pdl.options())
    if reduce == 1:
        reduce_partials(target, None, None, out)
    return out


def matmul(x: torch.Tensor | F16Rows, weight: RepackedMatrix, out: torch.Tensor | None = None,
           config: RepackedConfig | None = None) -> torch.Tensor:
    """x [M, K] (or `F16Rows`) @ weight.T into out (fresh when None): `matmul_few_rows` up to
    MAX_KERNEL_ROWS rows (up to MAX_INT_ROWS in mode "int" with INT_ABOVE_FEW_ROWS), else the weight
    dequantized to x's dtype and cuBLAS."""
    if _takes_few_rows(x.shape[0]):
        return matmul_few_rows(x, weight, out, config)
    if isinstance(x, F16Rows):
        x = x.x
    if x.shape[1] != weight.cols:
        raise ValueError(f"x has {x.shape[1]} columns, the weight {weight.cols}")
    y = F.linear(x, dequantize(weight, x.dtype))
    return y if out is None else out.copy_(y)
