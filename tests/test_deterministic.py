"""--deterministic: a sequence's logits are the same bits alone or in a batch at any position, in
chunked or whole prefill, after a prefix-cache hit, in speculative verification rows and with
overlapped steps (tiny Qwen3 in bf16 on CPU, torch references of the batch-invariant kernels);
and the Triton kernels against their references in Triton's interpreter."""

from __future__ import annotations

import random

import pytest
import torch

from onebit import LLM, SamplingParams
from onebit.kernels import batch_invariant
from onebit.kernels.attention import AttentionMetadata

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
# Repetitive prompts give the n-gram drafter something to propose.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11] * 3, [40, 50, 60], list(range(100, 140)), [7] * 9, [300, 301, 302, 303] * 4,
           list(range(200, 260)), [11, 12, 11, 12, 11], [499, 3]]


class LogitsSpy:
    """Records every logits row the runner returns, keyed by the tokens it was computed from
    (a row for position p is keyed by token_ids[: p + 1]), so runs that scheduled the same
    sequences differently can be compared row by row."""

    def __init__(self, llm: LLM):
        self.rows: dict[tuple[int, ...], torch.Tensor] = {}
        runner = llm.engine.runner
        run = runner.run

        def spy(plan, *args, **kwargs):
            out = run(plan, *args, **kwargs)
            chunk = {id(seq): n for seq, n in plan}
            for seq, first, count in out.rows:
                end = seq.num_computed_tokens + chunk[id(seq)]
                for i in range(count):
                    self.rows[tuple(seq.token_ids[:end - count + i + 1])] = out.logits[first + i].float().clone()
            return out

        runner.run = spy


def _generate(model, prompts, deterministic=True, params=GREEDY, always_draft=False, **options):
    """(output token ids per prompt, the logits rows seen, the engine) for one fresh engine."""
    llm = LLM(str(model), device="cpu", dtype="bfloat16", deterministic=deterministic, **options)
    if always_draft:  # a fixed draft length: the policy's choice depends on measured step times
        policy = llm.engine.speculator.policy
        policy.choose = lambda batch, drafting=None: policy.k_max
    spy = LogitsSpy(llm)
    outs = llm.generate(prompts, params)
    return [o.token_ids for o in outs], spy.rows, llm.engine


def _same_rows(a: dict, b: dict, at_least: int) -> bool:
    """True when every logits row both runs computed from the same tokens is the same bits (and
    there are at least `at_least` such rows: the comparison must cover the generated tokens)."""
    common = a.keys() & b.keys()
    assert len(common) >= at_least, (len(common), at_least)
    return all(torch.equal(a[key], b[key]) for key in common)


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models("qwen3")


@pytest.fixture(scope="module")
def alone(model):
    """Each prompt alone (parallel 1), deterministic: the reference of every comparison."""
    runs = [_generate(model, [p], parallel=1) for p in PROMPTS]
    return [r[0][0] for r in runs], {k: v for r in runs for k, v in r[1].items()}


def _in_batch(model, deterministic):
    order = list(range(len(PROMPTS)))
    random.Random(7).shuffle(order)  # every prompt at another position than in PROMPTS
    tokens, rows, _ = _generate(model, [PROMPTS[i] for i in order], deterministic, parallel=8)
    return [tokens[order.index(i)] for i in range(len(PROMPTS))], rows


def test_batch_of_eight_at_shuffled_positions_equals_alone(model, alone):
    tokens, rows = _in_batch(model, True)
    assert tokens == alone[0]
    assert _same_rows(rows, alone[1], at_least=len(PROMPTS) * GREEDY.max_tokens)


def test_without_deterministic_the_batch_may_differ(model):
    """The same comparison on the default kernels, printed only: whether bf16 rounding flips a
    row depends on this CPU's kernels (here the logits rows differed: the test above is not vacuous)."""
    det_alone = [_generate(model, [p], False, parallel=1) for p in PROMPTS[:3]]
    order = [2, 0, 1]
    tokens, rows, _ = _generate(model, [PROMPTS[i] for i in order], False, parallel=3)
    same_tokens = [tokens[order.index(i)] for i in range(3)] == [r[0][0] for r in det_alone]
    same_rows = _same_rows(rows, {k: v for r in det_alone for k, v in r[1].items()}, at_least=1)
    print(f"default kernels, bf16, batch of 3 == alone: tokens {same_tokens}, logits rows {same_rows}")


def test_chunked_prefill_equals_whole(model, alone):
    """A budget of 16 tokens a step cuts the long prompts into chunks that share steps with decodes."""
    tokens, rows, engine = _generate(model, PROMPTS, parallel=4, max_batch_tokens=16)
    assert engine.scheduler.max_batch_tokens == 16
    assert tokens == alone[0]
    assert _same_rows(rows, alone[1], at_least=len(PROMPTS) * GREEDY.max_tokens)


def test_prefix_cache_hit_equals_cold(model):
    long = list(range(120, 170))
    branch = long[:40] + [9, 8, 7, 6]  # shares two full blocks of 16 with `long`
    llm = LLM(str(model), device="cpu", dtype="bfloat16", deterministic=True, parallel=2)
    llm.generate([long], GREEDY)
    spy = LogitsSpy(llm)
    warm = llm.generate([branch], GREEDY)[0]
    assert warm.num_cached_tokens >= 32
    cold_tokens, cold_rows, _ = _generate(model, [branch], parallel=2, enable_prefix_caching=False)
    assert warm.token_ids == cold_tokens[0]
    assert _same_rows(spy.rows, cold_rows, at_least=GREEDY.max_tokens)


@pytest.mark.parametrize("method", ["ngram", "mtp"])
def test_speculative_verification_equals_plain(tiny_models, method):
    """Verification rows of 1 + 2 drafts give the logits of plain decode steps, bit for bit."""
    model = tiny_models("qwen3", mtp=True)
    prompts = PROMPTS[:5]
    plain_tokens, plain_rows, _ = _generate(model, prompts, parallel=8)
    spec = {"method": method, "draft_max": 2}
    tokens, rows, engine = _generate(model, prompts, parallel=8, speculative=spec, always_draft=True)
    assert engine.spec_proposed > 0
    if method == "ngram":  # the repetitive outputs: some drafts are right, so verifications keep tokens
        assert engine.spec_accepted > 0
    assert tokens == plain_tokens
    assert _same_rows(rows, plain_rows, at_least=len(prompts) * GREEDY.max_tokens)


def test_overlapped_steps_equal_plain(model, alone):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3)
    prompts = PROMPTS[:4]
    outs = {}
    for overlap in (False, True):
        llm = LLM(str(model), device="cpu", dtype="bfloat16", deterministic=True, parallel=8, overlap=overlap)
        assert llm.engine.overlap == overlap
        outs[overlap] = [(o.token_ids, [(lp.logprob, lp.top) for lp in o.logprobs])
                         for o in llm.generate(prompts, params)]
    assert outs[True] == outs[False]
    assert [tokens for tokens, _ in outs[True]] == alone[0][:4]


def test_deterministic_refuses_fp8_and_the_cli_takes_the_flag():
    from onebit.cli import build_parser
    from onebit.engine.config import EngineConfig
    with pytest.raises(ValueError, match="deterministic"):
        EngineConfig(model="m", deterministic=True, quantize="fp8")
    assert build_parser().parse_args(["serve", "--deterministic"]).deterministic
    assert not build_parser().parse_args(["serve"]).deterministic


# -- the kernels ------------------------------------------------------------------------------

triton_matmul = pytest.importorskip("onebit.kernels.triton_invariant_matmul")
triton_attention = pytest.importorskip("onebit.kernels.triton_invariant_attention")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _bf16(*shape, gen):
    return torch.randn(*shape, generator=gen).bfloat16().to(DEVICE)


def _bf16_exact_on_cpu(*shape, gen):
    """`_bf16` on the GPU; on the CPU, multiples of 1/16 in [-1/2, 1/2], so that every float32 sum of
    their products over K <= 4096 is exact whatever its order. Triton's interpreter multiplies a tile
    with numpy (`np.matmul` of the tile, then + the accumulator): the order inside is the host BLAS
    kernel's, which differs between CPUs (an AMD host without AVX-512 broke bit-equality of two
    BLOCK_K walks that an earlier host kept), so on the CPU a bit-equality test can only check that
    two launches cover the same elements, which exact sums still do; the order is the GPU's to check."""
    if DEVICE == "cuda":
        return _bf16(*shape, gen=gen)
    return (torch.randint(-8, 9, shape, generator=gen) / 16).bfloat16()


@pytest.mark.parametrize("m,n,k,bias", [(1, 40, 100, False), (5, 72, 200, True), (70, 33, 130, True)])
def test_matmul_matches_reference(m, n, k, bias):
    gen = torch.Generator().manual_seed(m * n + k)
    x, w = _bf16(m, k, gen=gen), _bf16(n, k, gen=gen)
    b = _bf16(n, gen=gen) if bias else None
    want = torch.nn.functional.linear(x.double(), w.double(), b.double() if bias else None)
    for got in (triton_matmul.matmul(x, w, b), batch_invariant.matmul_ref(x.cpu(), w.cpu(), b.cpu() if bias else None)):
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        assert ((got.double().to(want.device) - want).norm() / want.norm()).item() < 1e-2


def test_matmul_rows_do_not_depend_on_the_batch():
    """Row i of the product is the same bits for M = 1, 3, 64, 65, 130 and wherever the row sits.
    The interpreter computes a tile's tl.dot with numpy, whose order may follow the tile's width,
    so it runs one BLOCK_N here; on the GPU the launch picks BLOCK_N by M (bench/gpu_deterministic.py
    checks those rows bit for bit there)."""
    gen = torch.Generator().manual_seed(1)
    x, w, b = _bf16(130, 96, gen=gen), _bf16(48, 96, gen=gen), _bf16(48, gen=gen)
    config = None if DEVICE == "cuda" else triton_matmul.launch_config(1, 48)
    full = triton_matmul.matmul(x, w, b, config)
    ref_full = batch_invariant.matmul_ref(x.cpu(), w.cpu(), b.cpu())
    for m in (1, 3, 64, 65):
        assert torch.equal(triton_matmul.matmul(x[:m], w, b, config), full[:m]), m
        assert torch.equal(batch_invariant.matmul_ref(x[:m].cpu(), w.cpu(), b.cpu()), ref_full[:m]), m
    shuffled = torch.randperm(130, generator=gen)
    assert torch.equal(triton_matmul.matmul(x[shuffled], w, b, config), full[shuffled])
    assert torch.equal(batch_invariant.matmul_ref(x[shuffled].cpu(), w.cpu(), b.cpu()), ref_full[shuffled])


@pytest.mark.parametrize("k,splits,used", [(600, 2, 2), (768, 3, 3)])
def test_split_matmul_rows_do_not_depend_on_the_batch(monkeypatch, k, splits, used):
    """Fixed split-K: the partials of K pieces cut by K and the split count alone, added in split
    order, so row i is the same bits for M = 1, 3, 64, 65, 130, wherever it sits, and when the
    rows are launched in pieces (a small workspace bound); the reference of the same structure too."""
    assert -(-k // triton_matmul.chunk_len(k, splits)) == used
    gen = torch.Generator().manual_seed(k)
    x, w, b = _bf16(130, k, gen=gen), _bf16(48, k, gen=gen), _bf16(48, gen=gen)
    config = None if DEVICE == "cuda" else triton_matmul.launch_config(1, 48)
    full = triton_matmul.matmul(x, w, b, config, splits=splits)
    ref_full = batch_invariant.matmul_ref(x.cpu(), w.cpu(), b.cpu(), splits=splits)
    want = torch.nn.functional.linear(x.double(), w.double(), b.double())
    for got in (full, ref_full):
        assert ((got.double().to(want.device) - want).norm() / want.norm()).item() < 1e-2
    for m in (1, 3, 64, 65):
        assert torch.equal(triton_matmul.matmul(x[:m], w, b, config, splits=splits), full[:m]), m
        assert torch.equal(triton_matmul.matmul(x[-m:], w, b, config, splits=splits), full[-m:]), m
        assert torch.equal(batch_invariant.matmul_ref(x[:m].cpu(), w.cpu(), b.cpu(), splits=splits), ref_full[:m]), m
    shuffled = torch.randperm(130, generator=gen)
    assert torch.equal(triton_matmul.matmul(x[shuffled], w, b, config, splits=splits), full[shuffled])
    assert torch.equal(batch_invariant.matmul_ref(x[shuffled].cpu(), w.cpu(), b.cpu(), splits=splits),
                       ref_full[shuffled])
    monkeypatch.setattr(triton_matmul, "WORKSPACE_BYTES", used * 48 * 4 * 64)  # 64 rows a launch: 3 launches
    assert torch.equal(triton_matmul.matmul(x, w, b, config, splits=splits), full)
    # one split is the unsplit kernel, bit for bit, and so is its reference
    assert torch.equal(triton_matmul.matmul(x, w, b, config, splits=1), triton_matmul.matmul(x, w, b, config))
    assert torch.equal(batch_invariant.matmul_ref(x.cpu(), w.cpu(), b.cpu(), splits=1),
                       batch_invariant.matmul_ref(x.cpu(), w.cpu(), b.cpu()))


@pytest.mark.parametrize("splits", [1, 2])
def test_tma_variants_give_the_pointer_kernels_bits(splits):
    """The TMA variants (one program per tile, persistent, warp-specialized, both) walk K like
    the pointer kernel: the same bits as it for the same blocks, rows the same for M = 1, 65 and
    130 at any position, split or not; persistent programs (4 in the interpreter) walk several
    tiles each. K = 512 is a whole number of BLOCK_K tiles (the pointer kernel drops its K mask).
    On the CPU the inputs sum exactly (`_bf16_exact_on_cpu`)."""
    if DEVICE == "cpu":
        pytest.importorskip("triton.tools.tensor_descriptor")
    gen = torch.Generator().manual_seed(5 + splits)
    x, w, b = _bf16_exact_on_cpu(130, 512, gen=gen), _bf16_exact_on_cpu(80, 512, gen=gen), _bf16(80, gen=gen)
    blocks = (16, 4, 3, 64, 64)
    full = triton_matmul.matmul(x, w, b, (*blocks, 0), splits=splits)
    want = torch.nn.functional.linear(x.double(), w.double(), b.double())
    assert ((full.double() - want).norm() / want.norm()).item() < 1e-2
    assert torch.equal(full, triton_matmul.matmul(x, w, b, (16, 4, 3, 64, 128, 0), splits=splits))  # BLOCK_K 128
    for variant in (1, 2, 3, 4):
        config = (*blocks, variant)
        assert torch.equal(triton_matmul.matmul(x, w, b, config, splits=splits), full), variant
        assert torch.equal(triton_matmul.matmul(x[-65:], w, b, config, splits=splits), full[-65:]), variant
    assert torch.equal(triton_matmul.matmul(x[7:8], w, b, (*blocks, 2), splits=splits), full[7:8])


def test_tma_launch_on_layouts_tma_cannot_address():
    """A weight whose rows are not 16-byte aligned runs a TMA launch through pointers (the same
    blocks); an x that starts off alignment is copied first; the bits are those of the aligned case."""
    if DEVICE == "cpu":
        pytest.importorskip("triton.tools.tensor_descriptor")
    gen = torch.Generator().manual_seed(9)
    w_wide, x_wide = _bf16(40, 101, gen=gen), _bf16(9, 100, gen=gen)
    w, x = w_wide[:, :100], x_wide[1:]  # rows of 202 bytes; x starts 200 bytes in
    assert not triton_matmul.tma_addressable(w) and not triton_matmul.tma_addressable(x)
    blocks = (16, 4, 3, 16, 64)
    want = triton_matmul.matmul(x.contiguous(), w.contiguous(), None, (*blocks, 0))
    assert torch.equal(triton_matmul.matmul(x, w, None, (*blocks, 1)), want)
    assert torch.equal(triton_matmul.matmul(x, w.contiguous(), None, (*blocks, 2)), want)


def test_launch_table_lookup(tmp_path, monkeypatch):
    """The sweep's JSON loads into the table; a shape's rows pick the first launch whose max_m
    covers them (the last one beyond), its split count is the same for every M, and other
    devices or shapes get nothing."""
    from onebit.kernels import invariant_launch_table as table
    monkeypatch.setattr(table, "TABLE", {})
    monkeypatch.setattr(table, "_device_name", lambda device: "GPU-A")
    path = tmp_path / "table.json"
    path.write_text('{"device": "GPU-A", "shapes": {"96,512": {"splits": 2, "launches": '
                    '[[64, 64, 4, 4, 64, 64], [16, 32, 4, 5, 64, 128]]}}}')
    table.load(str(path))
    cuda = torch.device("cuda", 0)
    assert table.lookup(96, 512, 1, cuda) == (2, (32, 4, 5, 64, 128))
    assert table.lookup(96, 512, 17, cuda) == (2, (64, 4, 4, 64, 64))
    assert table.lookup(96, 512, 300, cuda) == (2, (64, 4, 4, 64, 64))
    assert table.lookup(96, 256, 1, cuda) is None
    assert triton_matmul.split_count(96, 512, cuda) == 2 and triton_matmul.split_count(96, 512, None) == 1
    assert triton_matmul.launch_config(1, 96, 512, cuda) == triton_matmul.Launch(32, 4, 5, 64, 128)
    assert triton_matmul.launch_config(1, 96, 512, torch.device("cpu")) == triton_matmul.default_launch(1, 96)
    monkeypatch.setattr(table, "_device_name", lambda device: "GPU-B")
    assert table.lookup(96, 512, 1, cuda) is None
    path.write_text('{"device": "GPU-A", "shapes": {"96,512": {"splits": 1, "launches": [[256, 128, 8, 3, 128, 64, 2]]}}}')
    monkeypatch.setattr(table, "_device_name", lambda device: "GPU-A")
    table.load(str(path))  # a 7th column: the kernel variant
    assert triton_matmul.launch_config(300, 96, 512, cuda) == triton_matmul.Launch(128, 8, 3, 128, 64, 2)
    path.write_text('{"device": "GPU-A", "shapes": {"96,512": {"splits": 2, "launches": [[64, 64, 4]]}}}')
    with pytest.raises(ValueError, match="launches"):
        table.load(str(path))


def _paged(gen, context=76, heads=4, kv_heads=2, head_dim=16, block_size=16, num_blocks=12):
    k = _bf16(num_blocks, block_size, kv_heads, head_dim, gen=gen)
    v = _bf16(num_blocks, block_size, kv_heads, head_dim, gen=gen)
    table = torch.randperm(num_blocks, generator=gen)[:-(-context // block_size)].to(DEVICE)
    return _bf16(context, heads, head_dim, gen=gen), k, v, table


def _prefill_meta(table, chunk, context):
    return AttentionMetadata(slot_mapping=None, num_decodes=0, decode_block_tables=None, decode_context_lens=None,
                             prefills=[(0, chunk, context)], prefill_block_tables=table[None],
                             decode_num_splits=2, decode_max_context=128)


def _decode_meta(table, lens):
    return AttentionMetadata(slot_mapping=None, num_decodes=len(lens), decode_block_tables=table[None].repeat(len(lens), 1),
                             decode_context_lens=torch.tensor(lens, dtype=torch.int32, device=table.device),
                             prefills=[], decode_num_splits=2, decode_max_context=128)


def test_attention_token_is_the_same_in_decode_verify_and_prefill():
    """Positions 66..75 of one sequence: a prefill chunk of 10, the whole prefill of 76, decode rows
    (a batch of 10, and one alone), all the same bits; splits of 64 keys, so two of them are merged;
    close to the reference, which is itself the same bits in every arrangement."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, table = _paged(gen)
    scale = 16 ** -0.5

    def run(meta, rows):
        tiles = (triton_attention.decode_tiles(meta.decode_block_tables, meta.decode_context_lens) if not meta.prefills
                 else triton_attention.plan_tiles(meta, 2, batch_invariant.combined_tables(meta)))
        return triton_attention.packed(rows, k, v, tiles, scale, 64, 2)

    chunk = run(_prefill_meta(table, 10, 76), q[66:])
    whole = run(_prefill_meta(table, 76, 76), q)
    decodes = run(_decode_meta(table, list(range(67, 77))), q[66:])
    one = run(_decode_meta(table, [73]), q[72:73])
    assert torch.equal(chunk, whole[66:]) and torch.equal(chunk, decodes) and torch.equal(one[0], chunk[6])
    ref = batch_invariant.attention_rows_ref(q.cpu()[66:], k.cpu(), v.cpu(), _prefill_meta(table.cpu(), 10, 76), scale)
    assert ((chunk.float().cpu() - ref.float()).norm() / ref.float().norm()).item() < 2e-2
    ref_decodes = batch_invariant.attention_rows_ref(q.cpu()[66:], k.cpu(), v.cpu(),
                                                     _decode_meta(table.cpu(), list(range(67, 77))), scale)
    assert torch.equal(ref, ref_decodes)
