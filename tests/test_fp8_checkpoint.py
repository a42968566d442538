"""FP8 checkpoints as published (quantization_config quant_method "fp8"): the block-scaled kernel
against its reference (Triton's interpreter on CPU), loading each layout, logits against
transformers on the dequantized weights, and the real server serving one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from onebit.kernels import fp8
from tests.fp8_checkpoint_writer import dequantized_weights, quantize_blocks, write_fp8_checkpoint

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCHEMES = [("block", (32, 32)), ("block", (128, 128)), ("channel", None), ("tensor", None)]


def test_block_quantization_round_trips_within_e4m3_precision():
    w = torch.randn(70, 200) * torch.linspace(0.01, 5, 200)
    q, scale = quantize_blocks(w, 32, 64)
    assert scale.shape == (3, 4) and q.dtype == torch.float8_e4m3fn
    back = fp8.dequantize_blocks(q, scale, (32, 64))
    step = scale.repeat_interleave(32, 0)[:70].repeat_interleave(64, 1)[:, :200] * 2.0 ** -9
    assert ((back - w).abs() <= w.abs() / 16 + step).all()


triton_fp8 = pytest.importorskip("onebit.kernels.triton_fp8")


@pytest.mark.parametrize("m,n,k,block,bias", [(1, 40, 300, (32, 32), False), (5, 130, 256, (128, 128), True),
                                              (16, 64, 96, (16, 32), True), (40, 96, 512, (128, 128), False)])
def test_triton_block_scaled_product_matches_its_reference(m, n, k, block, bias):
    g = torch.Generator().manual_seed(m + n + k)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 3
    q, scale = quantize_blocks(w, *block)
    x = torch.randn(m, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    to = lambda t: t.to(DEVICE) if t is not None else None  # noqa: E731
    want = fp8.block_weight_only_ref(to(x), to(q), to(scale), block, to(b))
    for config in (triton_fp8.DEFAULT_CONFIG, triton_fp8.MANY_ROWS_CONFIG):
        got = triton_fp8.weight_only(to(x), to(q), to(scale), to(b), config, block=block)
        assert ((got - want).norm() / want.norm()).item() < (1e-4 if DEVICE == "cpu" else 2e-3)


def _dequantized_copy(fp8_dir, out):
    """A plain checkpoint with the FP8 checkpoint's weights multiplied back (what transformers loads)."""
    out.mkdir()
    for file in fp8_dir.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, out / file.name)
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config))
    save_file(dequantized_weights(fp8_dir), str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize("scheme,block", SCHEMES, ids=[f"{s}-{b[0] if b else ''}" for s, b in SCHEMES])
def test_fp8_checkpoint_logits_match_transformers_on_its_dequantized_weights(tiny_model_dir, tmp_path, scheme, block):
    """transformers loads FP8 checkpoints on CPU only with accelerate (not a dependency here), so the
    reference is transformers on the same e4m3 values times their scales."""
    transformers = pytest.importorskip("transformers")
    from onebit import LLM
    from onebit.models.fp8_checkpoint import Fp8BlockLinear
    from onebit.models.quantize import Fp8Linear
    from tests.model_probe import all_logits

    path = write_fp8_checkpoint(tiny_model_dir, tmp_path / "fp8", scheme, block or (128, 128))
    llm = LLM(str(path), device="cpu", parallel=1)
    modules = [type(m) for name, m in llm.engine.runner.model.named_modules() if name.endswith("proj")]
    layers = llm.engine.model_config.num_layers
    if scheme != "block":
        assert modules.count(Fp8Linear) == 4 * layers
    elif block == (32, 32):
        assert modules.count(Fp8BlockLinear) == 4 * layers
    else:  # q (64 rows) and gate (192) do not end on a 128-row block: those fused layers are dequantized
        assert modules.count(Fp8BlockLinear) == 2 * layers and Fp8BlockLinear not in modules[::4]
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. def f(x): return x * 2")
    ours = all_logits(llm, ids)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(_dequantized_copy(path, tmp_path / "plain")), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-4


def test_other_quantization_methods_are_refused(tiny_model_dir, tmp_path):
    from onebit.models.errors import ModelLoadError
    from onebit.models.fp8_checkpoint import fp8_quantization

    path = write_fp8_checkpoint(tiny_model_dir, tmp_path / "q", "block", (32, 32))
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "gptq"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="'gptq' is not supported"):
        fp8_quantization(path)


def test_server_serves_a_block_scaled_checkpoint(tiny_model_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    from onebit.models.tokenizer import Tokenizer
    from tests.server_utils import SERVER_ARGS, openai_clients, running_server

    path = write_fp8_checkpoint(tiny_model_dir, tmp_path / "fp8", "block", (32, 32))
    ids = Tokenizer.from_dir(path).encode("def add(a, b):")
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(_dequantized_copy(path, tmp_path / "plain")), dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref_model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)[0, len(ids):].tolist()
    with running_server(path, *SERVER_ARGS, "--device", "cpu") as server:
        client, _ = openai_clients(server)
        reply = client.completions.create(model="tiny", prompt=ids, max_tokens=10, temperature=0, logprobs=1)
        assert reply.usage.completion_tokens == 10
        assert reply.choices[0].text == Tokenizer.from_dir(path).decode(want)
