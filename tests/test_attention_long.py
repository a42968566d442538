"""Long-context attention (#19): the decode kernel's adaptive KV splits and the flash prefill
kernel against their plain-torch references (Triton's interpreter on CPU, or the GPU), and the
mixed-step prefill cap."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels.attention import decode_attention_ref, prefill_attention_ref

triton_decode = pytest.importorskip("onebit.kernels.triton_decode")
triton_prefill_flash = pytest.importorskip("onebit.kernels.triton_prefill_flash")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-3}[DEVICE]  # the interpreter is true fp32; the GPU's fp32 dots are tf32


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _cache(lens, heads, kv_heads, head_dim, block_size, seed, queries):
    """Random paged caches with scattered blocks, block tables [len(lens), width], and `queries` query rows."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    q = torch.randn(queries, heads, head_dim, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    width = max(-(-n // block_size) for n in lens)
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, n in enumerate(lens):
        for j in range(-(-n // block_size)):
            tables[i, j] = perm.pop()
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return to(q), to(k), to(v), to(tables), to(torch.tensor(lens, dtype=torch.int32))


# -- decode: split count from the shape, split length from each context ------------------------

def test_split_count_fills_the_gpu_at_small_batch_and_not_more():
    # 8 KV heads (the 8B shape), 132 SMs, an 8,448-token context bound
    choose = lambda rows: triton_decode.choose_num_splits(rows, 8, 8448, 132)  # noqa: E731
    assert [choose(b) for b in (1, 2, 8, 32, 64, 256)] == [32, 16, 4, 2, 1, 1]
    # about 2 programs per SM (B=1 stops at MAX_SPLITS: 256 programs)
    assert all(choose(b) * b * 8 >= 256 for b in (1, 8, 32))
    # a context bound too short for min_split (64) tokens per split caps the count
    assert triton_decode.choose_num_splits(1, 8, 300, 132) == 4  # 5 useful, a power of two
    assert triton_decode.choose_num_splits(1, 8, 100, 132) == 2
    assert triton_decode.choose_num_splits(1, 8, 64, 132) == 1


def test_the_eager_warm_up_meets_every_split_count_once():
    """The runner warms the eager path with one step per split count (each a kernel variant):
    the fewest rows that choose each count, every count met over 1..64 rows."""
    rows = triton_decode.rows_per_split_count(64, 8, 8448, 132)
    choose = lambda b: triton_decode.choose_num_splits(b, 8, 8448, 132)  # noqa: E731
    assert [choose(b) for b in rows] == sorted({choose(b) for b in range(1, 65)}, reverse=True)
    assert all(choose(b - 1) != choose(b) for b in rows if b > 1)  # the first row count of each
    assert rows[0] == 1 and rows == sorted(rows)


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,lens,max_context,min_split", [
    (8, 2, 32, 16, [1, 5, 300, 700], 1024, None),   # GQA 4: short contexts leave most splits empty
    (4, 1, 16, 8, [130, 1000], 1000, 64),           # MQA, 16 splits, lengths not multiples of the tile
    (4, 4, 16, 4, [3, 64, 65], 128, None),          # one split: the output is written without a merge
    (16, 2, 64, 16, [17, 1, 250], 256, 32),         # GQA 8, min_split below the key tile
    (4, 2, 16, 16, [1999, 37], 2048, 16),           # 32 splits of a long context, length no multiple of them
])
def test_adaptive_decode_matches_reference(heads, kv_heads, head_dim, block_size, lens, max_context, min_split):
    q, k, v, tables, ctx = _cache(lens, heads, kv_heads, head_dim, block_size, sum(lens), len(lens))
    scale = head_dim ** -0.5
    ours = triton_decode.paged_decode_attention(q, k, v, tables, ctx, scale, None, max_context,
                                                min_split=min_split)
    ref = decode_attention_ref(q, k, v, tables.long(), ctx.long(), scale)
    assert torch.isfinite(ours).all()
    assert _rel(ours, ref) < TOLERANCE


def test_adaptive_decode_reads_new_lengths_without_a_new_launch_shape():
    """A graph replays one launch for a row count while the contexts grow: the split count is the
    same for any lengths, and the same launch is right for lengths written in place."""
    lens = [40, 600, 9]
    q, k, v, tables, ctx = _cache([700] * 3, 8, 2, 32, 16, 3, 3)
    n = triton_decode.choose_num_splits(3, 2, 700, 132)
    for step in range(2):
        ctx.copy_(torch.tensor([x + 50 * step for x in lens], dtype=torch.int32))
        ours = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.2, n, 700,
                                                    min_split=triton_decode.MIN_SPLIT_TOKENS)
        assert _rel(ours, decode_attention_ref(q, k, v, tables.long(), ctx.long(), 0.2)) < TOLERANCE


def test_fixed_rule_still_available():
    q, k, v, tables, ctx = _cache([5, 100], 8, 1, 32, 16, 4, 2)
    ours = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.1, 3, 112)  # fixed 38-token splits
    assert _rel(ours, decode_attention_ref(q, k, v, tables.long(), ctx.long(), 0.1)) < TOLERANCE


# -- flash prefill over the paged cache ------------------------------------------------------

LAUNCHES = [triton_prefill_flash.PrefillLaunch(16, 16, 4, 2), triton_prefill_flash.PrefillLaunch(32, 16, 4, 2)]


@pytest.mark.parametrize("launch", LAUNCHES, ids=["rows16", "rows32"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,chunks", [
    (4, 2, 16, 4, [(5, 5), (3, 50), (1, 9), (40, 40)]),  # fresh prompts, a chunk after a cached prefix, a decode
    (8, 2, 32, 16, [(37, 100), (70, 70)]),              # GQA 4: unmasked key tiles before the diagonal
    (4, 4, 16, 8, [(33, 33)]),                           # MHA
])
def test_flash_prefill_matches_reference(launch, heads, kv_heads, head_dim, block_size, chunks):
    qlens = [n for n, _ in chunks]
    ctxs = [c for _, c in chunks]
    total = sum(qlens)
    q, k, v, tables, _ = _cache(ctxs, heads, kv_heads, head_dim, block_size, sum(ctxs), total + 3)
    starts = [sum(qlens[:i]) for i in range(len(qlens))]
    out = torch.full_like(q, float("nan"))
    triton_prefill_flash.paged_prefill_attention(q, k, v, starts, qlens, ctxs, tables, head_dim ** -0.5, out=out,
                                                 launch=launch)
    assert out[total:].isnan().all()  # rows outside the chunks untouched
    for i, (start, n, ctx) in enumerate(zip(starts, qlens, ctxs)):
        ref = prefill_attention_ref(q[start:start + n], k, v, ctx, tables[i].long(), head_dim ** -0.5)
        assert _rel(out[start:start + n], ref) < TOLERANCE


def test_flash_prefill_tiles_longest_first_and_cover_every_query():
    order = triton_prefill_flash.tile_order([5, 0, 33], [5, 0, 100], 16)
    assert sorted(order) == [(0, 0), (2, 0), (2, 16), (2, 32)]
    assert order[0] == (2, 32) and order[-1] == (0, 0)  # 100 keys first, 5 keys last
    assert triton_prefill_flash.tokens_per_tile(32, 8, 128) == 32
    assert triton_prefill_flash.tokens_per_tile(40, 8, 128) == 16  # a group of 5 pads to 8


def test_flash_prefill_plan_reused_across_layers():
    """The tile plan built once for a step gives each layer's call the same result as building it."""
    chunks = [(20, 60), (7, 7)]
    qlens, ctxs = [n for n, _ in chunks], [c for _, c in chunks]
    q, k, v, tables, _ = _cache(ctxs, 4, 2, 16, 8, 1, sum(qlens))
    launch = LAUNCHES[0]
    plan = triton_prefill_flash.plan_tiles([0, 20], qlens, ctxs, 4, 2, q.device, launch)
    a = triton_prefill_flash.paged_prefill_attention(q, k, v, [0, 20], qlens, ctxs, tables, 0.25, launch=launch)
    b = triton_prefill_flash.paged_prefill_attention(q, k, v, [0, 20], qlens, ctxs, tables, 0.25, launch=launch,
                                                     plan=plan)
    assert torch.equal(a, b)


def test_flash_prefill_takes_four_warps_only_with_many_programs():
    """G27's launch rule: 4 warps at 8+ programs per SM (an 8k prompt: 2,048 programs on the 8B
    shape), 8 below (a 2k prompt: 512); both keep the default's rows, so one tile plan serves."""
    flash = triton_prefill_flash
    many, default = flash.MANY_PROGRAMS_LAUNCH, flash.DEFAULT_LAUNCH
    assert (many.rows, many.tile_k) == (default.rows, default.tile_k) and many.warps == 4
    assert flash.tokens_per_tile(32, 8, default.rows) == 32  # the 8B shape: 32 tokens a tile

    def pick(prompt_tokens: int):
        plan = flash.plan_tiles([0], [prompt_tokens], [prompt_tokens], 32, 8, torch.device("cpu"))
        return flash.launch_for(plan, 8, 132)
    assert pick(8192) == many and pick(4 * 1056) == many  # 2,048 and 1,056 programs
    assert pick(2048) == default and pick(512) == default  # 512 and 128 programs
    # the kernel with launch=None (its own pick) gives the default launch's result
    chunks = [(20, 60), (7, 7)]
    qlens, ctxs = [n for n, _ in chunks], [c for _, c in chunks]
    q, k, v, tables, _ = _cache(ctxs, 4, 2, 16, 8, 1, sum(qlens))
    auto = flash.paged_prefill_attention(q, k, v, [0, 20], qlens, ctxs, tables, 0.25)
    fixed = flash.paged_prefill_attention(q, k, v, [0, 20], qlens, ctxs, tables, 0.25, launch=default)
    assert torch.equal(auto, fixed)


# -- the merge by the last split program (`MERGE_IN_SPLIT`) -------------------------------------

@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,lens,max_context,min_split", [
    (8, 2, 32, 16, [1, 5, 300, 700], 1024, None),   # short contexts leave most splits empty
    (4, 1, 16, 8, [130, 1000], 1000, 64),           # MQA, 16 splits
    (4, 2, 16, 16, [1999, 37], 2048, 16),           # 32 splits
])
def test_the_last_split_merges_as_the_merge_kernel_does(monkeypatch, heads, kv_heads, head_dim, block_size, lens,
                                                        max_context, min_split):
    """With `MERGE_IN_SPLIT` the last split program of each (sequence, KV head) merges the partials: the
    output is the merge kernel's to the bit, the arrival counts are back to 0 after every launch (the next
    launch, or a graph replay, starts from them), and a second launch over longer contexts is right too."""
    q, k, v, tables, ctx = _cache(lens, heads, kv_heads, head_dim, block_size, sum(lens), len(lens))
    scale = head_dim ** -0.5

    class NoMergeLaunch:  # with the switch on, the merge kernel must not run
        def __getitem__(self, grid):
            raise AssertionError("the merge kernel launched")

    def both():
        plain = triton_decode.paged_decode_attention(q, k, v, tables, ctx, scale, None, max_context, min_split=min_split)
        with monkeypatch.context() as patch:
            patch.setattr(triton_decode, "MERGE_IN_SPLIT", True)
            patch.setattr(triton_decode, "_decode_merge_kernel", NoMergeLaunch())
            merged = triton_decode.paged_decode_attention(q, k, v, tables, ctx, scale, None, max_context,
                                                          min_split=min_split)
        return plain, merged

    for grow in (0, 1):
        ctx.copy_(torch.tensor([min(n + grow, max_context) for n in lens], dtype=torch.int32))
        plain, merged = both()
        assert torch.equal(merged, plain)
        assert _rel(merged, decode_attention_ref(q, k, v, tables.long(), ctx.long(), scale)) < TOLERANCE
        counts = triton_decode.merge_counts(q.device, len(lens) * kv_heads)
        assert counts.abs().sum().item() == 0


def test_the_last_split_quantizes_its_merge_as_the_merge_kernel_does(monkeypatch):
    """The FP8 handoff (`quantize_block`) with the merge in the split kernel: the same e4m3 bits and scales."""
    q, k, v, tables, ctx = _cache([1, 40, 90], 8, 2, 32, 8, 11, 3)
    q[1, :4] *= 50
    want_q, want_s = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.3, num_splits=4, quantize_block=128)
    monkeypatch.setattr(triton_decode, "MERGE_IN_SPLIT", True)
    monkeypatch.setattr(triton_decode, "_decode_merge_kernel", None)  # not launched: the split kernel merges
    got_q, got_s = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.3, num_splits=4, quantize_block=128)
    assert torch.equal(got_s, want_s) and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))


def test_merge_counts_grow_outside_capture_and_keep_the_old_buffer_alive():
    device = torch.device(DEVICE)
    small = triton_decode.merge_counts(device, 8)
    assert small.numel() >= 8 and small.dtype == torch.int32 and small.abs().sum().item() == 0
    assert triton_decode.merge_counts(device, 8) is small  # reused
    big = triton_decode.merge_counts(device, small.numel() + 1)
    assert big.numel() > small.numel() and any(t is small for t in triton_decode._RETIRED_COUNTS)
