"""Triton paged-attention decode kernel: one query token per sequence over its cached context.

GQA-aware: one program handles one KV head for all the query heads that share it, so each
K/V byte is read once per sequence. The context is split into `num_splits` ranges handled by
separate programs (long contexts with few sequences still fill the GPU); a second small kernel
merges the partial softmaxes (with one split, the split kernel writes the output itself).
Reference: `onebit.kernels.attention.decode_attention_ref`.
Runs under TRITON_INTERPRET=1 on CPU tensors too, which is how the CPU tests check it.

Split lengths are per sequence, read from its context length in device memory: a sequence of
c tokens cuts its context into ranges of max(min_split, ceil(c / num_splits) rounded up to the
key tile) tokens, so a 2k context and an 8k one both spread over all the programs they can use,
and a short one leaves the rest empty (they store an empty partial). `num_splits` itself depends
only on the row count, the KV heads and the engine's context bound (`choose_num_splits`), never
on the step's data, so a CUDA graph captured for a row count stays right for every replay.
Before, the split length was fixed per engine (ceil(ctx_size / splits)): with --ctx-size 8448 and
16 splits of 528 tokens, a 2k context used 4 of them, 32 programs at B=1 on a 132-SM GPU.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from onebit.kernels import kv_fp8, pdl
from onebit.kernels.triton_fp8_fast import _e4m3_scale, _to_e4m3


@triton.jit
def _store_group(out, out_ptr, s_ptr, seq, kv_head, heads, dims, row_ok, stride_ob, stride_oh, stride_sb,
                 QUANTIZE: tl.constexpr, ROUND: tl.constexpr):
    # out [GROUP_PAD, HEAD_DIM] float32: one sequence's output for the query heads of one KV head.
    # QUANTIZE: stored as e4m3 with one scale for the group (one block of GROUP x HEAD_DIM values of the
    # sequence's row, at s_ptr[seq, kv_head]), from the values rounded to ROUND (the model's dtype) as the
    # plain store leaves them: `quantize_row_blocks` of the plain output gives the same bits.
    ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :]
    if QUANTIZE:
        v = out.to(ROUND).to(tl.float32)
        s = _e4m3_scale(tl.max(tl.max(tl.where(row_ok[:, None], tl.abs(v), 0.0), axis=1), axis=0))
        tl.store(s_ptr + seq * stride_sb + kv_head, s)
        tl.store(ptrs, _to_e4m3(v, s).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _split_length(lens_ptr, seq, min_split, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr):
    # (context length, split length) of a sequence: its context over NUM_SPLITS, in whole key tiles,
    # at least min_split tokens a split
    ctx_len = tl.load(lens_ptr + seq).to(tl.int32)  # int32 or int64 lengths (the graphs' are int64)
    return ctx_len, tl.maximum(min_split, (ctx_len + NUM_SPLITS * TILE - 1) // (NUM_SPLITS * TILE) * TILE)


@triton.jit
def _used_splits(lens_ptr, seq, min_split, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr):
    # how many of a sequence's splits hold keys: the first cdiv(ctx_len, split_len)
    ctx_len, split_len = _split_length(lens_ptr, seq, min_split, TILE, NUM_SPLITS)
    return tl.minimum((ctx_len + split_len - 1) // split_len, NUM_SPLITS)


@triton.jit
def _merge_partials(part_acc_ptr, part_ml_ptr, base0, used, rows, dims, GROUP: tl.constexpr,
                    GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, CACHE: tl.constexpr):
    # The normalized output [GROUP_PAD, HEAD_DIM] float32 of one sequence's KV head from the partials of its
    # `used` splits at (base0 + split). Unrolled over NUM_SPLITS so that every partial's loads are in flight at
    # once (a loop bounded by the used count ran them one after another: bf16 B=1 -1.3%, session 31 call 1);
    # the loads of splits past the context's end are masked off, as the split kernel stores nothing for them.
    # CACHE: the loads' cache modifier (".cg", from L2, where other programs of this launch wrote them).
    m_all = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        base = base0 + split
        live = rows < GROUP * (split < used)  # the group's rows in a used split, none past the context
        m_all = tl.maximum(m_all, tl.load(part_ml_ptr + (base * GROUP_PAD + rows) * 2, mask=live,
                                          other=float("-inf"), cache_modifier=CACHE))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_all = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        base = base0 + split
        live = rows < GROUP * (split < used)
        m = tl.load(part_ml_ptr + (base * GROUP_PAD + rows) * 2, mask=live, other=float("-inf"), cache_modifier=CACHE)
        l = tl.load(part_ml_ptr + (base * GROUP_PAD + rows) * 2 + 1, mask=live, other=0.0, cache_modifier=CACHE)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_safe))
        l_all += l * w
        acc += tl.load(part_acc_ptr + (base * GROUP_PAD + rows[:, None]) * HEAD_DIM + dims[None, :],
                       mask=live[:, None], other=0.0, cache_modifier=CACHE) * w[:, None]
    return acc / tl.maximum(l_all, 1e-30)[:, None]


# The table width and the split length change from one eager step to the next: specializing on
# them (1, or divisible by 16) compiled new variants while serving (G21, session 11).
@triton.jit(do_not_specialize=["max_blocks", "min_split"])
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, part_acc_ptr, part_ml_ptr, k_scale_ptr, v_scale_ptr, out_ptr,
    scale, max_blocks, min_split,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_ob, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr, KV_FP8: tl.constexpr,
    DOT_F16: tl.constexpr = False, PDL: tl.constexpr = False,
    s_ptr=None, stride_sb=0, QUANTIZE: tl.constexpr = False, ROUND: tl.constexpr = None,
    count_ptr=None, MERGE_LAST: tl.constexpr = False,
):
    pdl.wait_for_previous(PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    ctx_len, split_len = _split_length(lens_ptr, seq, min_split, TILE, NUM_SPLITS)
    start = split * split_len
    end = tl.minimum(start + split_len, ctx_len)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    if KV_FP8:  # e4m3 entries: K's head scale folds into the score scale, V's into the output
        scale = scale * tl.load(k_scale_ptr + kv_head)
    if DOT_F16:  # kv_fp8.float16_products: k and v below follow q's dtype
        q = q.to(tl.float16)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for t0 in range(start, end, TILE):
        tokens = t0 + tl.arange(0, TILE)
        tok_ok = tokens < end
        blocks = tl.load(tables_ptr + seq * max_blocks + tokens // BLOCK_SIZE, mask=tok_ok, other=0)
        offs = blocks.to(tl.int64) * stride_kb + (tokens % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptr + offs[:, None] + dims[None, :], mask=tok_ok[:, None], other=0.0)
        v = tl.load(v_ptr + offs[:, None] + dims[None, :], mask=tok_ok[:, None], other=0.0)
        if KV_FP8:
            k, v = k.to(q.dtype), v.to(q.dtype)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m = m_new
    if KV_FP8:
        acc = acc * tl.load(v_scale_ptr + kv_head)

    if NUM_SPLITS == 1:  # the whole context: normalize and write the output, no merge
        _store_group(acc / tl.maximum(l, 1e-30)[:, None], out_ptr, s_ptr, seq, kv_head, heads, dims, row_ok,
                     stride_ob, stride_oh, stride_sb, QUANTIZE, ROUND)
    else:
        base0 = (seq * num_kv_heads + kv_head) * NUM_SPLITS
        if start < end:  # only a used split's real rows: the merge reads nothing else
            base = base0 + split
            tl.store(part_acc_ptr + (base * GROUP_PAD + rows[:, None]) * HEAD_DIM + dims[None, :], acc,
                     mask=row_ok[:, None])
            tl.store(part_ml_ptr + (base * GROUP_PAD + rows) * 2, m, mask=row_ok)
            tl.store(part_ml_ptr + (base * GROUP_PAD + rows) * 2 + 1, l, mask=row_ok)
        if MERGE_LAST:
            # Every split of the (sequence, KV head) counts itself in; the last to arrive merges them and
            # sets the count back to 0 for the next launch. The barrier orders the program's stores before
            # the count's release (as a CUDA split-K semaphore does); the acquire orders the merge's loads after.
            tl.debug_barrier()
            counter = count_ptr + seq * num_kv_heads + kv_head
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1:
                used = _used_splits(lens_ptr, seq, min_split, TILE, NUM_SPLITS)
                _store_group(_merge_partials(part_acc_ptr, part_ml_ptr, base0, used, rows, dims, GROUP, GROUP_PAD,
                                             HEAD_DIM, NUM_SPLITS, ".cg"),
                             out_ptr, s_ptr, seq, kv_head, heads, dims, row_ok, stride_ob, stride_oh, stride_sb,
                             QUANTIZE, ROUND)
                tl.store(counter, 0)


@triton.jit(do_not_specialize=["min_split"])
def _decode_merge_kernel(
    part_acc_ptr, part_ml_ptr, lens_ptr, out_ptr, min_split, stride_ob, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PDL: tl.constexpr = False, s_ptr=None, stride_sb=0, QUANTIZE: tl.constexpr = False,
    ROUND: tl.constexpr = None,
):
    pdl.wait_for_previous(PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    used = _used_splits(lens_ptr, seq, min_split, TILE, NUM_SPLITS)
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    out = _merge_partials(part_acc_ptr, part_ml_ptr, (seq * num_kv_heads + kv_head) * NUM_SPLITS, used, rows, dims,
                          GROUP, GROUP_PAD, HEAD_DIM, NUM_SPLITS, "")
    _store_group(out, out_ptr, s_ptr, seq, kv_head, kv_head * GROUP + rows, dims, rows < GROUP, stride_ob, stride_oh,
                 stride_sb, QUANTIZE, ROUND)


# The Triton dtype a quantized output is rounded to first, by the queries' torch dtype.
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

# The adaptive split rule (`choose_num_splits`): splits of at least one 64-key tile, so that a short
# context at a few rows spreads over programs that each read one tile (session 31, H200, 8B shape,
# 128 + 128 tokens, against 128-token splits: bf16 B=1 +0.9 / +1.0% in two calls, FP8 B=1 398.2 -> 406.0;
# B=8 bf16 +0.7 / +2.3%, FP8 -1.1%). The merge reads only the splits that hold keys.
MIN_SPLIT_TOKENS = 64
MAX_SPLITS = 32
CTAS_PER_SM = 2  # programs per SM to aim for: one waits on memory while the other computes
# The engine's rule: True, `choose_num_splits` per row count with per-sequence split lengths;
# False, the older fixed rule (`pick_num_splits` of the context size, fixed split length). Benches
# flip it to compare the two (bench/gpu_attention_long.py). On since its first device run (session
# 10, H200, one layer of the 8B shape in CUDA graphs): 1.12-1.45x the fixed rule at B=1 and 2-8k
# contexts, 1.13-1.29x at B=32, 0.99-1.36x at B=8; engine decode after 2k prompts +4.6 to +7.4%.
adaptive_splits = True


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H100/H200 SXM); 132 elsewhere so that
    CPU tests choose what the GPU would."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(rows: int, kv_heads: int, max_context: int, sms: int = 132,
                      min_split: int = MIN_SPLIT_TOKENS, max_splits: int = MAX_SPLITS) -> int:
    """Context splits for a decode launch of `rows` sequences: about CTAS_PER_SM programs (rows x
    kv_heads x splits) per SM, no more splits than a context of max_context tokens can give
    min_split tokens each, at most max_splits; a power of two, so that few kernel variants exist
    and the graph capture compiles all of them (the eager path's mixed steps reuse them).
    Depends on shapes only (graph-safe)."""
    want = -(-CTAS_PER_SM * sms // max(rows * kv_heads, 1))
    useful = -(-max(max_context, 1) // min_split)
    return 1 << (max(1, min(want, useful, max_splits)).bit_length() - 1)


def rows_per_split_count(max_rows: int, kv_heads: int, max_context: int, sms: int = 132) -> list[int]:
    """For each split count `choose_num_splits` gives over 1..max_rows rows, the fewest rows
    that get it, ascending: one launch per kernel variant a warm-up must compile."""
    first: dict[int, int] = {}
    for rows in range(1, max_rows + 1):
        first.setdefault(choose_num_splits(rows, kv_heads, max_context, sms), rows)
    return sorted(first.values())


def pick_num_splits(max_context: int, split_target: int = 512, max_splits: int = 16) -> int:
    """The engine-wide split count of the older fixed rule, for contexts up to max_context tokens
    (also fixes the batch-invariant kernel's split length, `batch_invariant.split_len`)."""
    return max(1, min(max_splits, -(-max_context // split_target)))


class DecodeLaunch(NamedTuple):
    """How the split kernel walks a context: `tile` keys a loop turn, `warps` a program, `stages`
    of software pipelining (0: Triton's default)."""

    tile: int = 64
    warps: int = 4
    stages: int = 0


# The launch per cache dtype at head_dim <= 128 (above, 32-key tiles). Session 16 (H200, one layer
# of the 8B shape, 8 points from 1 x 2k to 256 x 1k, bench/gpu_decode_fp8.py, three sweeps; geometric
# mean of the speed-up over t64-w4 of the same cache): bf16 t64-w2 1.018x twice (never slower than
# 0.5%: 1-5% at 1-8 rows and 256 x 192), t128-w4 0.99x, t128-w8 0.94x, t64-w8 0.88x, t32-w4 0.87x,
# t256-w8 0.80x, 1 warp 0.37-0.85x; stages 3-4 change nothing. The e4m3 cache with bfloat16 products
# reached 1.5-2.2 TB/s of e4m3 bytes (bf16: 3.4-4.3) and was no faster than bf16 anywhere; with
# float16 products (FP8_DOT_F16) on 2 warps, 1.21x over t64-w4 and 1.16-1.45x over the bf16 cache
# from 32 rows up (256 x 1k: 170 against 246 us, 3.1 TB/s); t128-w2 0.99x of that. Engine, 12 GiB of
# KV: B=256 26,507 tok/s against the bf16 cache's 25,381 (e4m3 before: 24,113), B=64 12,056 / 11,891.
LAUNCH = {"bf16": DecodeLaunch(64, 2), "fp8": DecodeLaunch(64, 2)}
# An e4m3 cache with bf16 queries multiplies in float16 (`kv_fp8.float16_products`). False:
# bfloat16, as before (benches).
FP8_DOT_F16 = True
# With several splits, the last split program of each (sequence, KV head) to finish merges the partials
# itself (a count per pair in device memory, back to 0 after each launch), so the merge kernel's launch
# goes: 36 launches a decode step of the 8B shape, ~1.8 us each at one row (session 28's profile). Off
# until measured on the device (the split kernel holds 168-236 registers on 2 warps; the merge adds to them).
MERGE_IN_SPLIT = False
_COUNTS: dict[torch.device, torch.Tensor] = {}
_RETIRED_COUNTS: list[torch.Tensor] = []  # outgrown counts: a captured graph may still point at one


def merge_counts(device: torch.device, pairs: int) -> torch.Tensor:
    """The int32 arrival counts of `MERGE_IN_SPLIT`, at least `pairs` of them, all 0 between launches. They
    are made outside CUDA-graph capture (the decoder runs every size eagerly before capturing, largest
    last); a capture that needs more raises."""
    counts = _COUNTS.get(device)
    if counts is None or counts.numel() < pairs:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the decode merge needs {pairs} counts, made outside graph capture; run the "
                               "launch once eagerly first")
        if counts is not None:
            _RETIRED_COUNTS.append(counts)
        counts = torch.zeros(max(pairs, 1024), dtype=torch.int32, device=device)
        _COUNTS[device] = counts
    return counts


CANDIDATES = {  # bench/gpu_decode_fp8.py's sweep: today's launch, the one before, and the runners-up
    "t64-w2": DecodeLaunch(64, 2), "t64-w4": DecodeLaunch(64, 4), "t128-w2": DecodeLaunch(128, 2),
    "t128-w4": DecodeLaunch(128, 4),
}


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           num_splits: int | None = 1, max_context: int | None = None,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                           min_split: int | None = None, launch: DecodeLaunch | None = None,
                           out: torch.Tensor | None = None, quantize_block: int = 0
                           ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, heads, head_dim] over cached contexts; caches [blocks, block_size, kv_heads, head_dim]
    (e4m3 caches with their per-KV-head scales k_scale, v_scale [kv_heads] float32).

    block_tables [B, max_blocks] and context_lens [B] are integer tensors on q's device.
    max_context bounds every context (default: the table width). num_splits None chooses the
    split count by `choose_num_splits` (with min_split MIN_SPLIT_TOKENS unless given); each
    sequence then splits its own context evenly (see the module doc). An explicit num_splits
    without min_split is the fixed rule: every split covers ceil(max_context / num_splits)
    tokens. All launch parameters depend on shapes only, so the call can be captured in a CUDA graph.
    `launch` overrides the kernel's tile, warps and stages (`LAUNCH` by cache dtype; benches).
    `out` [B, heads, head_dim] (any strides with a unit last one, e.g. the decode rows of a mixed step's
    output) receives the result, which is also returned.
    `quantize_block` (the query heads of one KV head times head_dim, `fp8.ACTIVATION_BLOCK` for an FP8
    product after it): returns (e4m3 [B, heads * head_dim], scales [B, kv_heads] float32), the output
    quantized with one scale per row and block as `fp8.quantize_row_blocks` would quantize it, by the
    kernel that writes it (no output in q's dtype, no quantizer launch).
    """
    batch, num_heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    group_pad = max(16, triton.next_power_of_2(group))
    max_blocks = block_tables.shape[1]
    max_context = max_context or max_blocks * block_size
    if num_splits is None:
        min_split = min_split or MIN_SPLIT_TOKENS
        num_splits = choose_num_splits(batch, kv_heads, max_context, sm_count(q.device), min_split)
    elif min_split is None:
        min_split = -(-max_context // num_splits)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    launch = launch or LAUNCH["fp8" if fp8 else "bf16"]
    tile = launch.tile if head_dim <= 128 else 32
    tuning = {"num_warps": launch.warps} | ({"num_stages": launch.stages} if launch.stages else {})
    quantized = {}
    if quantize_block:
        if quantize_block != group * head_dim or out is not None:
            raise ValueError(f"a quantized output takes blocks of {group} heads x {head_dim} = {group * head_dim} "
                             f"values and no `out`, got a block of {quantize_block}")
        out = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
        scales = torch.empty((batch, kv_heads), dtype=torch.float32, device=q.device)
        quantized = {"s_ptr": scales, "stride_sb": scales.stride(0), "QUANTIZE": True, "ROUND": _TL_DTYPES[q.dtype]}
    elif out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.stride(2) != 1:
        raise ValueError(f"out {tuple(out.shape)} with strides {out.stride()} does not fit q {tuple(q.shape)}")
    if num_splits > 1:
        part_acc = torch.empty((batch, kv_heads, num_splits, group_pad, head_dim), dtype=torch.float32,
                               device=q.device)
        part_ml = torch.empty((batch, kv_heads, num_splits, group_pad, 2), dtype=torch.float32, device=q.device)
    else:  # unused by the kernel: the output is written directly
        part_acc = part_ml = out
    merge_last = MERGE_IN_SPLIT and num_splits > 1
    merging = {"count_ptr": merge_counts(q.device, batch * kv_heads), "MERGE_LAST": True} if merge_last else {}
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, part_acc, part_ml,
        k_scale if fp8 else part_ml, v_scale if fp8 else part_ml, out,
        scale, max_blocks, min_split,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, TILE=tile,
        NUM_SPLITS=num_splits, KV_FP8=fp8, DOT_F16=kv_fp8.float16_products(fp8, q.dtype, FP8_DOT_F16),
        **tuning, **pdl.options(), **(quantized if num_splits == 1 or merge_last else {}), **merging)
    if num_splits > 1 and not merge_last:
        _decode_merge_kernel[(batch, kv_heads)](
            part_acc, part_ml, context_lens, out, min_split, out.stride(0), out.stride(1),
            GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, TILE=tile, NUM_SPLITS=num_splits,
            **pdl.options(), **quantized)
    if quantize_block:
        return out.view(batch, num_heads * head_dim), scales
    return out
