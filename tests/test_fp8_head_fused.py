"""FP8 output head (`--quantize-lm-head`) and the producers that emit e4m3 rows for the products
(`triton_fp8_fused`: add + RMSNorm with the per-token quantization in the same kernel, SiLU * mul with
one per token and block), against their plain-torch references in Triton's interpreter on CPU (the GPU where there
is one), and their wiring in the model."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels import fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
fused = pytest.importorskip("onebit.kernels.triton_fp8_fused")
BF16 = torch.bfloat16


def _skip_bf16_off_gpu(dtype: torch.dtype) -> None:
    # Triton's interpreter computes bf16 through numpy wrongly (the unfused `triton_fused` kernels
    # give NaN there too): bf16 cases run on a GPU only.
    if dtype == BF16 and DEVICE != "cuda":
        pytest.skip("bf16 in Triton's interpreter")


@pytest.fixture
def fp8_flags():
    """Restore fp8's module switches and calibration after a test."""
    saved = (fp8.FUSE_QUANT, fp8.CPU_EMULATES_GPU, fp8.FAST_ACCUM)
    yield
    fp8.FUSE_QUANT, fp8.CPU_EMULATES_GPU, fp8.FAST_ACCUM = saved
    fp8.reset()


def _dequantized(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    if block:
        return fp8.dequantize_row_blocks(q.float().cpu(), scale.float().cpu(), block)
    return q.float() * scale.float().view(-1, 1)


def _assert_same_quantization(got, want, exact: bool, block: int = 0):
    """q and scale of a kernel against the reference (a scale per row, or per row and block of
    `block` values): the scales to float32 rounding, the e4m3 values equal (exact) or, where the
    kernel's arithmetic may differ by an ulp before rounding (exp, sqrt), within one e4m3 step on at
    most 1% of the entries."""
    (q, s), (q_ref, s_ref) = got, want
    scales = -(-q.shape[1] // block) if block else 1
    assert q.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape and s.shape == s_ref.shape == (q.shape[0], scales)
    torch.testing.assert_close(s.float().cpu(), s_ref.float().cpu(), rtol=1e-5, atol=0)
    a, b = _dequantized(q, s, block).cpu(), _dequantized(q_ref, s_ref, block).cpu()
    if exact:
        assert torch.equal(q.float().cpu(), q_ref.float().cpu())
        return
    # codes, not values: a scale an ulp apart (a GPU's norm may round one element otherwise) makes
    # every dequantized value of its row differ while the codes agree
    differ = q.view(torch.uint8).cpu() != q_ref.view(torch.uint8).cpu()
    assert differ.float().mean().item() <= 0.01
    unit = s_ref.float().cpu().repeat_interleave(block, 1)[:, :q.shape[1]] if block else s_ref.cpu().view(-1, 1)
    step = b.abs() / 8 + unit * 2 ** -9  # one e4m3 step (3 mantissa bits), subnormals
    assert ((a - b).abs() <= step * 1.01).all()


@pytest.mark.parametrize("rows,cols,residual,dtype", [(3, 64, False, torch.float32), (5, 448, True, torch.float32),
                                                      (4, 300, True, torch.float32), (4, 300, True, BF16),
                                                      (2, 1024, False, BF16)])
def test_add_rms_norm_quantize_matches_the_reference(rows, cols, residual, dtype):
    _skip_bf16_off_gpu(dtype)
    g = torch.Generator().manual_seed(rows * cols)
    x = (torch.randn(rows, cols, generator=g) * 3).to(dtype).to(DEVICE)
    res = (torch.randn(rows, cols, generator=g)).to(dtype).to(DEVICE) if residual else None
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype).to(DEVICE)
    q, s, summed = fused.add_rms_norm_quantize(x, res, w, 1e-6)
    q_ref, s_ref, summed_ref = fp8.add_rms_norm_quantize_ref(x, res, w, 1e-6)
    _assert_same_quantization((q, s), (q_ref, s_ref), exact=False)
    if residual:
        assert torch.equal(summed, summed_ref)
    else:
        assert summed is None and summed_ref is None


@pytest.mark.parametrize("rows,inter,dtype", [(3, 96, torch.float32), (2, 2100, torch.float32), (4, 1200, BF16)])
def test_silu_mul_quantize_matches_the_reference(rows, inter, dtype):
    # 96 columns: one partial block a row; 2,100: four whole blocks of 512 and a partial one.
    _skip_bf16_off_gpu(dtype)
    g = torch.Generator().manual_seed(rows + inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 2).to(dtype).to(DEVICE)
    if inter > 1024:  # a large product in block 1: only that block's scale grows
        gate_up[0, 700], gate_up[0, inter + 700] = 40.0, 8.0
    got = fused.silu_mul_quantize(gate_up, fp8.ACTIVATION_BLOCK)
    want = fp8.silu_mul_quantize_ref(gate_up)
    _assert_same_quantization(got, want, exact=False, block=fp8.ACTIVATION_BLOCK)
    if inter > 1024:
        assert want[1][0, 1] > 4 * want[1][0, [0, 2]].max()
    rows_in = fp8.silu_mul_quantize(gate_up)  # the module function: the same form
    assert rows_in.block == fp8.ACTIVATION_BLOCK and rows_in.form == "blocks" and rows_in.scale.shape == want[1].shape


def test_fused_quantization_of_an_exact_row_is_exact():
    # Values that rms_norm leaves on the e4m3 grid up to the row's scale: every e4m3 value is hit exactly.
    row = torch.tensor([[448.0, -448.0, 1.0, -0.5, 0.0, 3.5, 240.0, -0.125]]).to(DEVICE)
    q, s, _ = fused.add_rms_norm_quantize(row, None, torch.ones(8, device=DEVICE), 0.0)
    q_ref, s_ref, _ = fp8.add_rms_norm_quantize_ref(row, None, torch.ones(8, device=DEVICE), 0.0)
    _assert_same_quantization((q, s), (q_ref, s_ref), exact=True)


def test_products_of_quantized_rows_equal_w8a8():
    g = torch.Generator().manual_seed(3)
    w, x, b = torch.randn(40, 96, generator=g), torch.randn(7, 96, generator=g), torch.randn(40, generator=g)
    q, scale = fp8.quantize_rows(w)
    xq, xs = fp8.quantize_rows(x)
    rows = fp8.Fp8Rows(xq, xs.view(-1, 1), x.dtype)
    assert rows.shape == (7, 96) and rows.device == x.device
    assert torch.equal(fp8.linear(rows, q, scale, b), fp8.w8a8_ref(x, q, scale, b))
    assert torch.equal(fp8.quantized_input_ref(rows, q, scale, None), fp8.w8a8_ref(x, q, scale, None))


def test_producers_emit_e4m3_only_where_the_product_runs_scaled_mm(fp8_flags):
    cpu = torch.device("cpu")
    fp8.CPU_EMULATES_GPU = False
    assert not fp8.takes_quantized_rows(512, 64, 64, False, cpu)  # the CPU's weight-only reference
    fp8.CPU_EMULATES_GPU = True
    fp8.FUSE_QUANT = True  # the default since session 15; the fixture restores whatever it was
    assert [fp8.takes_quantized_rows(m, 64, 64, False, cpu) for m in (1, 16, 64, 65, 512)] == \
        [False, False, False, True, True]  # above MAX_WEIGHT_ONLY_ROWS, as the uncalibrated GPU rule
    assert not fp8.takes_quantized_rows(512, 60, 64, False, cpu)  # a shape `_scaled_mm` does not take
    fp8.FUSE_QUANT = False
    assert not fp8.takes_quantized_rows(512, 64, 64, False, cpu)
    fp8.FUSE_QUANT = True
    assert not fp8.takes_quantized_rows(512, 64, 64, False, cpu, "blocks")  # `_scaled_mm` takes no block scales
    fp8._CHOSEN_QUANTIZED_INPUT[(64, 64, False, "rows")] = [(8, ("split_k", (16, 16, 64, 1, 4))),
                                                            (64, ("scaled_mm", None))]
    assert fp8.choice_for(8, 64, 64, False, "rows")[0] == "split_k"
    assert fp8.choice_for(33, 64, 64, False, "rows") == ("scaled_mm", None)
    assert fp8.choice_for(33, 64, 64, False) == fp8.default_choice(33, 64, 64)  # the other tables are untouched
    assert fp8.choice_for(33, 64, 64, False, "blocks") == fp8.default_choice(33, 64, 64)
    # On the GPU: wherever the calibrated kind takes e4m3 rows, the w8a8 split-K kernel as well.
    cuda = torch.device("cuda")
    fp8._CHOSEN_QUANTIZED_INPUT[(64, 64, False, "rows")] = [(8, ("split_k", (16, 16, 64, 1, 4))),
                                                            (64, ("split_k_w8a8", (64, 16, 64, 2, 4))),
                                                            (128, ("scaled_mm", None))]
    assert [fp8.takes_quantized_rows(m, 64, 64, False, cuda) for m in (8, 64, 128)] == [False, True, True]
    # a producer of block-scaled rows: only where its table chose the split-K kernel's block form
    fp8._CHOSEN_QUANTIZED_INPUT[(64, 64, False, "blocks")] = [(8, ("split_k", (16, 16, 64, 1, 4))),
                                                              (64, (fp8.BLOCK_W8A8_KIND, (64, 16, 64, 2, 4))),
                                                              (128, ("scaled_mm", None))]
    assert [fp8.takes_quantized_rows(m, 64, 64, False, cuda, "blocks") for m in (8, 64, 128)] == [False, True, False]
    fp8.FUSE_QUANT = False
    assert not fp8.takes_quantized_rows(64, 64, 64, False, cuda)


def test_e4m3_rows_from_a_producer_run_the_w8a8_split_k_as_its_own_quantizer_would():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(20, 128, generator=g).to(DEVICE)
    q, scale = fp8.quantize_rows(torch.randn(48, 128, generator=g).to(DEVICE))
    b = torch.randn(48, generator=g).to(DEVICE)
    rows = fp8.Fp8Rows(*fused_quantizer(x), x.dtype)
    config = (64, 16, 32, 2, 4)
    got = fp8.run_quantized("split_k_w8a8", config, rows, q, scale, b)
    assert got.equal(fp8.split_k_w8a8(x, q, scale, b, config))
    _assert_near(got, fp8.w8a8_ref(x, q, scale, b))


def test_block_scaled_rows_from_a_producer_run_the_block_form_as_its_own_quantizer_would():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(20, 1100, generator=g).to(DEVICE)
    q, scale = fp8.quantize_rows(torch.randn(48, 1100, generator=g).to(DEVICE))
    b = torch.randn(48, generator=g).to(DEVICE)
    rows = fp8.Fp8Rows(*fp8.quantize_row_blocks(x), x.dtype, fp8.ACTIVATION_BLOCK)
    config = (64, 16, 128, 2, 4)
    got = fp8.run_quantized(fp8.BLOCK_W8A8_KIND, config, rows, q, scale, b)
    assert got.equal(fp8.run_kernel(fp8.BLOCK_W8A8_KIND, config, x, q, scale, b))
    _assert_near(got, fp8.w8a8_blocks_ref(x, q, scale, b))
    assert torch.equal(fp8.quantized_input_ref(rows, q, scale, b), fp8.w8a8_blocks_ref(x, q, scale, b))
    with pytest.raises(ValueError, match="block"):  # a kind that takes one scale a row
        fp8.run_quantized("split_k_w8a8", config, rows, q, scale, b)
    with pytest.raises(ValueError, match="rows"):  # and the other way round
        fp8.run_quantized(fp8.BLOCK_W8A8_KIND, config, fp8.Fp8Rows(*fused_quantizer(x), x.dtype), q, scale, b)


def _assert_near(got: torch.Tensor, want: torch.Tensor) -> None:
    # Hopper's e4m3 tensor-core sums keep fewer bits than float32: 5e-4 of the reference on the H200
    assert ((got - want).norm() / want.norm()).item() < (1e-5 if DEVICE == "cpu" else 2e-3)


def fused_quantizer(x):
    """The one-pass Triton quantizer's (q, scale [T, 1]): what a fusing producer hands over."""
    from onebit.kernels import triton_fp8_fast

    q, s = triton_fp8_fast.quantize_rows(x)
    return q, s.view(-1, 1)


@pytest.mark.parametrize("tie", [True, False])
def test_quantizing_the_head_keeps_the_embedding(tie, tiny_models):
    from onebit import LLM
    from onebit.models.quantize import Fp8Linear
    from tests.model_probe import all_logits

    model_dir = tiny_models("qwen3", tie_word_embeddings=tie)
    ids = list(range(5, 40))
    plain = LLM(str(model_dir), device="cpu", parallel=1)
    want = all_logits(plain, ids)
    embedding = plain.engine.runner.model.embed_tokens.weight.detach().clone()
    no_head = LLM(str(model_dir), device="cpu", parallel=1, quantize="fp8", quantize_lm_head=False)
    head = LLM(str(model_dir), device="cpu", parallel=1, quantize="fp8", quantize_lm_head=True)
    model = head.engine.runner.model
    layers = head.engine.model_config.num_layers
    assert isinstance(model.lm_head, Fp8Linear)
    assert sum(isinstance(m, Fp8Linear) for m in model.modules()) == 4 * layers + 1
    assert (no_head.engine.runner.model.lm_head is None) == tie  # untouched without the option
    # The lookup still reads the embedding in the run dtype, bit for bit.
    assert model.embed_tokens.weight.dtype == torch.float32 and torch.equal(model.embed_tokens.weight, embedding)
    if tie:  # the head is the embedding's matrix, quantized per vocabulary row
        torch.testing.assert_close(fp8.dequantize_rows(model.lm_head.qweight, model.lm_head.weight_scale),
                                   embedding, rtol=0.07, atol=0)
    got, without = all_logits(head, ids), all_logits(no_head, ids)
    assert not torch.equal(got, without)  # the head's quantization reached the logits
    err = ((got - want).norm() / want.norm()).item()
    assert 0 < err < 0.1, err
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9


def test_fused_producers_feed_the_same_numbers_as_the_separate_quantizer(tiny_model_dir, fp8_flags, monkeypatch):
    """On the CPU emulating the GPU's many-row products: with the norms and SiLU * mul fused (as
    `FUSED_PRODUCERS` may name them) the norms emit e4m3 rows and the logits are bit for bit those of
    quantizing their outputs separately. The emulation runs `_scaled_mm`, which takes no block scales,
    so SiLU * mul stays unfused here (its wiring: the next test)."""
    from onebit import LLM
    from onebit.models.quantize import Fp8InputNorm, Fp8SwiGLU, fed_layers
    from tests.model_probe import all_logits

    from onebit.models import quantize

    fp8.CPU_EMULATES_GPU = True
    ids = [(7 * i) % 200 + 3 for i in range(80)]  # 80 rows: above MAX_WEIGHT_ONLY_ROWS, `_scaled_mm` on a GPU
    monkeypatch.setattr(quantize, "FUSED_PRODUCERS", ("norm", "silu"))
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1, quantize="fp8", quantize_lm_head=False)
    model = llm.engine.runner.model
    layers = llm.engine.model_config.num_layers
    assert sum(isinstance(m, Fp8InputNorm) for m in model.modules()) == 2 * layers
    assert sum(isinstance(m, Fp8SwiGLU) for m in model.modules()) == layers
    fed = fed_layers(model)
    assert {n.rpartition(".")[2]: form for n, form in fed.items()} == \
        {"qkv_proj": "rows", "gate_up_proj": "rows", "down_proj": "blocks"}
    assert len(fed) == 3 * layers
    calls = {"norm": 0, "silu": 0}
    norm_quantize, silu_quantize = fp8.add_rms_norm_quantize, fp8.silu_mul_quantize

    def counted(key, fn):
        def run(*args):
            calls[key] += 1
            return fn(*args)
        return run

    monkeypatch.setattr(fp8, "add_rms_norm_quantize", counted("norm", norm_quantize))
    monkeypatch.setattr(fp8, "silu_mul_quantize", counted("silu", silu_quantize))
    fp8.FUSE_QUANT = True
    fused_logits = all_logits(llm, ids)
    assert calls == {"norm": 2 * layers, "silu": 0}
    fp8.FUSE_QUANT = False
    separate = all_logits(llm, ids)
    assert calls == {"norm": 2 * layers, "silu": 0}  # not called again
    assert torch.equal(fused_logits, separate)
    fp8.CPU_EMULATES_GPU = False
    weight_only = all_logits(llm, ids)
    assert not torch.equal(weight_only, separate)  # the emulation quantized the activations
    assert ((weight_only - separate).norm() / weight_only.norm()).item() < 0.1
    short = all_logits(llm, ids[:20])  # few rows: no producer quantizes
    assert calls == {"norm": 2 * layers, "silu": 0} and short.shape[0] == 20


def test_silu_producer_hands_its_down_product_block_scaled_rows(tiny_model_dir, fp8_flags, monkeypatch):
    """A fused SwiGLU whose down product takes block-scaled rows (as a GPU calibration may choose):
    SiLU * mul emits them, down multiplies them, and the MLP's output is bit for bit the block-form
    reference of down on silu(gate) * up; where down does not take them, the plain path runs."""
    from onebit import LLM
    from onebit.kernels import fused_ref
    from onebit.models import quantize

    monkeypatch.setattr(quantize, "FUSED_PRODUCERS", ("norm", "silu"))
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1, quantize="fp8", quantize_lm_head=False)
    mlp = llm.engine.runner.model.layers[0].mlp
    assert isinstance(mlp, quantize.Fp8SwiGLU) and mlp.down_proj.fed == "blocks"
    asked = []

    def takes(rows, n, k, has_bias, device, fed="rows"):
        asked.append(fed)
        return fed == "blocks"

    monkeypatch.setattr(fp8, "takes_quantized_rows", takes)
    x = torch.randn(6, mlp.gate_up_proj.in_features, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        got = mlp(x)
        down = mlp.down_proj
        want = fp8.w8a8_blocks_ref(fused_ref.silu_mul_ref(mlp.gate_up_proj(x)), down.qweight, down.weight_scale, down.bias)
        assert asked == ["blocks"] and torch.equal(got, want)
        monkeypatch.setattr(fp8, "takes_quantized_rows", lambda *args: False)
        plain = mlp(x)
    assert not torch.equal(plain, got)  # the weight-only reference: activations not quantized


def test_attention_producer_hands_o_block_scaled_rows_on_decode_steps(tiny_model_dir, fp8_flags, monkeypatch):
    """With "attention" among the producers, a decode-only step's attention kernel (Triton's interpreter
    here) writes o's input as block-scaled e4m3 rows, one block per KV head's group of query heads: o's
    output is bit for bit the block-form reference on the plain kernel's output. A step with a prefill,
    or a row count o does not take them at, runs the plain path."""
    if DEVICE == "cuda":  # the model runs on the CPU, so Triton must be the interpreter
        pytest.skip("a wiring test for Triton's interpreter; tests/test_kernels.py checks the kernel on the GPU")
    from onebit.kernels import triton_decode
    from onebit.kernels.attention import AttentionMetadata
    from onebit.models import quantize

    monkeypatch.setattr(quantize, "FUSED_PRODUCERS", ("norm", "silu", "attention"))
    monkeypatch.setattr(fp8, "ACTIVATION_BLOCK", 32)  # the tiny model's group: 2 query heads x 16
    llm = LLM_fp8(tiny_model_dir)
    attn = llm.engine.runner.model.layers[0].self_attn
    assert isinstance(attn, quantize.Fp8Attention) and attn.o_proj.fed == "blocks"
    assert attn.num_heads // attn.num_kv_heads * attn.head_dim == 32
    asked = []

    def takes(rows, n, k, has_bias, device, fed="rows"):
        asked.append((rows, fed))
        return fed == "blocks" and rows == 3

    monkeypatch.setattr(fp8, "takes_quantized_rows", takes)
    monkeypatch.setattr(quantize, "decode_quantizes", lambda q, meta: not meta.prefills)  # the CPU's q too
    g = torch.Generator().manual_seed(11)
    heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    k_cache, v_cache = (torch.randn(6, 4, kv_heads, dim, generator=g) for _ in range(2))
    q = torch.randn(3, heads, dim, generator=g)
    tables = torch.tensor([[0, 1, 0], [2, 3, 4], [5, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([7, 10, 2], dtype=torch.int32)
    meta = AttentionMetadata(slot_mapping=torch.zeros(3, dtype=torch.long), num_decodes=3, decode_block_tables=tables,
                             decode_context_lens=lens, prefills=[], decode_max_context=12)
    with torch.no_grad():
        got = attn.attend(q, k_cache, v_cache, meta)
        plain = triton_decode.paged_decode_attention(q, k_cache, v_cache, tables, lens, attn.scale, None, 12)
        o = attn.o_proj
        rows = fp8.Fp8Rows(*fp8.quantize_row_blocks(plain.reshape(3, -1), 32), plain.dtype, 32)
        want = fp8.quantized_input_ref(rows, o.qweight, o.weight_scale, o.bias)
        assert asked == [(3, "blocks")] and torch.equal(got, want)
        two = attn.attend(q[:2], k_cache, v_cache, AttentionMetadata(
            slot_mapping=torch.zeros(2, dtype=torch.long), num_decodes=2, decode_block_tables=tables[:2],
            decode_context_lens=lens[:2], prefills=[], decode_max_context=12))
    assert asked[-1] == (2, "blocks")  # not taken at 2 rows: the plain output, o quantizing nothing on the CPU
    assert not torch.equal(two, want[:2]) and ((two - want[:2]).norm() / want[:2].norm()).item() < 0.1


def LLM_fp8(model_dir):
    """The tiny model on the CPU with FP8 products (the head in the run dtype)."""
    from onebit import LLM

    return LLM(str(model_dir), device="cpu", parallel=1, quantize="fp8", quantize_lm_head=False)


def test_serve_quantizes_the_head_with_the_flag(tiny_model_dir):
    """`1bit serve --quantize fp8 --quantize-lm-head` scores a prompt as the engine with the head in
    FP8 does, not as the one with the head in the run dtype."""
    if DEVICE == "cuda":  # the device machine's python carries the server's wheels, not the client
        pytest.importorskip("openai")
    from onebit import LLM
    from tests.model_probe import all_logits
    from tests.server_utils import openai_clients, running_server

    ids = list(range(5, 25))

    def greedy_logprob(head: bool) -> float:
        llm = LLM(str(tiny_model_dir), device="cpu", parallel=1, quantize="fp8", quantize_lm_head=head)
        return all_logits(llm, ids)[-1].float().log_softmax(-1).max().item()

    want, bf_head = greedy_logprob(True), greedy_logprob(False)
    assert abs(want - bf_head) > 1e-4  # the head's quantization is visible in this logprob
    with running_server(tiny_model_dir, "--ctx-size", "128", "--parallel", "1", "--quantize", "fp8",
                        "--quantize-lm-head") as server:
        client, _ = openai_clients(server)
        reply = client.completions.create(model=tiny_model_dir.name, prompt=ids, max_tokens=3, temperature=0,
                                          logprobs=1)
    got = reply.choices[0].logprobs.token_logprobs
    assert len(got) == 3
    assert abs(got[0] - want) < 1e-5, (got[0], want, bf_head)


def test_by_default_the_norms_and_silu_are_fused_with_the_quantizer(tiny_model_dir, fp8_flags, monkeypatch):
    """`FUSED_PRODUCERS` as shipped (session 26): the two RMSNorms of each layer feed their products
    e4m3 rows and SiLU * mul feeds down block-scaled rows; naming the norms alone leaves the SwiGLU
    plain, and down quantizes its own input."""
    from onebit import LLM
    from onebit.models import quantize
    from onebit.models.quantize import Fp8InputNorm, Fp8SwiGLU, fed_layers

    def fused(producers):
        monkeypatch.setattr(quantize, "FUSED_PRODUCERS", producers)
        llm = LLM(str(tiny_model_dir), device="cpu", parallel=1, quantize="fp8", quantize_lm_head=False)
        model, layers = llm.engine.runner.model, llm.engine.model_config.num_layers
        assert sum(isinstance(m, Fp8InputNorm) for m in model.modules()) == 2 * layers
        return sum(isinstance(m, Fp8SwiGLU) for m in model.modules()) // layers, \
            {n.rpartition(".")[2]: form for n, form in fed_layers(model).items()}

    assert quantize.FUSED_PRODUCERS == ("norm", "silu")
    assert fused(quantize.FUSED_PRODUCERS) == (1, {"qkv_proj": "rows", "gate_up_proj": "rows", "down_proj": "blocks"})
    assert fused(("norm",)) == (0, {"qkv_proj": "rows", "gate_up_proj": "rows"})


def test_the_mlp_takes_gate_up_with_silu_mul_fused_where_the_product_offers_it(tiny_model_dir, fp8_flags, monkeypatch):
    """`Fp8SwiGLU`: where gate_up's `silu_mul` returns the activated rows (`fp8.linear_silu_mul`: one row on
    the GPU), down reads them and no gate_up product or SiLU kernel runs; where it returns None, the two run."""
    from onebit.kernels import fused_ref, ops
    from onebit.models import quantize

    llm = LLM_fp8(tiny_model_dir)
    mlp = llm.engine.runner.model.layers[0].mlp
    assert isinstance(mlp, quantize.Fp8SwiGLU)
    inter = mlp.down_proj.in_features
    offered, silu_runs = [], []
    activated = torch.randn(1, inter, generator=torch.Generator().manual_seed(3))

    def linear_silu_mul(x, q, scale, bias=None, fed=""):
        offered.append(x.shape[0])
        return activated if x.shape[0] == 1 else None

    def silu_mul(gate_up):
        silu_runs.append(gate_up.shape[0])
        return fused_ref.silu_mul_ref(gate_up)

    monkeypatch.setattr(fp8, "linear_silu_mul", linear_silu_mul)
    monkeypatch.setattr(ops, "silu_mul", silu_mul)
    x = torch.randn(3, mlp.gate_up_proj.in_features, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        one = mlp(x[:1])
        three = mlp(x)
    assert offered == [1, 3] and silu_runs == [3]
    assert torch.equal(one, mlp.down_proj(activated))
    gate, up = mlp.gate_up_proj(x).chunk(2, -1)
    assert torch.allclose(three, mlp.down_proj(torch.nn.functional.silu(gate) * up))
