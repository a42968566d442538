"""GGUF linear layers kept packed (`gguf_keep_packed`): which layers are packed, that their bytes are the
file's, and that the model computes what the dequantized load computes (on CPU both run the same
dequantized values; the kernels themselves are checked in test_gguf_kernels.py)."""

from __future__ import annotations

import gguf
import pytest
import torch

from onebit import LLM, SamplingParams
from onebit.kernels.gguf_quants import PackedMatrix, dequantize_blocks
from onebit.models.gguf.files import open_gguf
from onebit.models.gguf.packed import PackedGGUFLinear
from onebit.models.layers import Linear
from onebit.testing.gguf_encode import q4_k_m_type
from tests.gguf_files import write_gguf
from tests.model_probe import all_logits

Q = gguf.GGMLQuantizationType
PROMPT = list(range(3, 40, 2))
# Every packed type, fused q/k/v and gate/up rows of different types, one matrix of a type the kernels
# do not read (so that layer stays dequantized), the untied head packed, the embedding dequantized.
MIXED = {"attn_q": Q.Q4_K, "attn_k": Q.Q8_0, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K, "ffn_gate": Q.Q4_K,
         "ffn_up": Q.Q6_K, "ffn_down": Q.Q8_0, "output": Q.Q6_K, "token_embd": Q.Q4_K}


def mixed_type(name: str, tensor: torch.Tensor) -> Q:
    """MIXED's type for a GGUF matrix name, Q4_0 for blk.1.attn_output."""
    if name == "blk.1.attn_output.weight":
        return Q.Q4_0
    return MIXED.get(name.split(".")[-2], Q.F32)  # vectors stay F32 anyway


@pytest.fixture(scope="module")
def mixed_file(tiny_models, tmp_path_factory):
    """A llama (Q/K rows permuted in the file, untied head) with rows of 256, written with mixed types."""
    src = tiny_models("llama", hidden=256, heads=4, kv_heads=2, intermediate=512)
    return write_gguf(src, tmp_path_factory.mktemp("packed") / "mixed.gguf", types=mixed_type)


@pytest.fixture(scope="module")
def loads(mixed_file):
    """(packed, dequantized) engines of the mixed file on CPU in float32."""
    return (LLM(str(mixed_file), device="cpu", parallel=2, gguf_keep_packed=True),
            LLM(str(mixed_file), device="cpu", parallel=2, gguf_keep_packed=False))


def _packed_layers(llm: LLM) -> dict[str, PackedGGUFLinear]:
    model = llm.engine.runner.model
    return {name: m for name, m in model.named_modules() if isinstance(m, PackedGGUFLinear)}


def test_packable_layers_are_packed_and_the_rest_is_not(loads):
    packed, dequantized = loads
    layers = _packed_layers(packed)
    assert "lm_head" in layers and "layers.1.self_attn.o_proj" not in layers
    assert isinstance(packed.engine.runner.model.get_submodule("layers.1.self_attn.o_proj"), Linear)
    assert sorted(layers) == sorted(["lm_head", "layers.0.self_attn.o_proj"] + [
        f"layers.{i}.{m}" for i in range(2) for m in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj")])
    qkv = layers["layers.0.self_attn.qkv_proj"]
    assert qkv.part_types == [("Q4_K", 256), ("Q8_0", 128), ("Q6_K", 128)]
    assert layers["layers.0.mlp.gate_up_proj"].part_types == [("Q4_K", 512), ("Q6_K", 512)]
    assert not _packed_layers(dequantized)
    assert packed.engine.runner.model.embed_tokens.weight.dtype == torch.float32


def test_packed_layers_are_repacked_for_the_gpu(loads):
    from onebit.kernels.gguf_repack import RepackedMatrix

    for layer in _packed_layers(loads[0]).values():
        assert layer.repacked and all(isinstance(p, RepackedMatrix) for p in layer.parts)
        assert not any(name.endswith("_quants") for name, _ in layer.named_buffers())  # no second copy


def test_packed_bytes_are_the_files(loads, mixed_file):
    """The ffn_down weight's bytes are the file's; q's rows come back unpermuted, whole rows of blocks."""
    packed, _ = loads
    gfile = open_gguf(mixed_file)
    down = _packed_layers(packed)["layers.1.mlp.down_proj"].parts[0]
    file_rows = torch.from_numpy(gfile.tensors["blk.1.ffn_down.weight"].data.copy()).reshape(down.rows, -1)
    assert torch.equal(down.blocks(), file_rows)
    q_part: PackedMatrix = _packed_layers(packed)["layers.0.self_attn.qkv_proj"].parts[0]
    q_file = dequantize_blocks(torch.from_numpy(gfile.tensors["blk.0.attn_q.weight"].data.copy()), "Q4_K")
    assert not torch.equal(q_part.dequantize(), q_file)  # the file's rows are in llama.cpp's order...
    assert torch.equal(q_part.dequantize().sort(dim=0).values, q_file.sort(dim=0).values)  # ...the same rows


def test_packed_model_computes_the_dequantized_models_logits(loads):
    packed, dequantized = loads
    got, want = all_logits(packed, PROMPT), all_logits(dequantized, PROMPT)
    assert want.std().item() > 0.5
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max().item()


def test_packed_model_generates_the_same_tokens(loads):
    packed, dequantized = loads
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [PROMPT, PROMPT[:7]]
    assert [o.token_ids for o in packed.generate(prompts, params)] == \
        [o.token_ids for o in dequantized.generate(prompts, params)]


def test_bfloat16_packed_and_dequantized_loads_agree(mixed_file):
    got = all_logits(LLM(str(mixed_file), device="cpu", parallel=1, dtype="bfloat16", gguf_keep_packed=True), PROMPT)
    want = all_logits(LLM(str(mixed_file), device="cpu", parallel=1, dtype="bfloat16", gguf_keep_packed=False),
                      PROMPT)
    # Both multiply by the same bf16-rounded weights; only the order of float sums may differ.
    assert (got.float() - want.float()).abs().max().item() <= 0.02 * want.float().abs().max().item()


def test_the_cpu_default_dequantizes_at_load(mixed_file):
    assert not _packed_layers(LLM(str(mixed_file), device="cpu", parallel=1))


def test_q4_k_m_recipe_follows_llama_cpp():
    assert q4_k_m_type("blk.0.attn_q.weight", 4096, 36, False) == "Q4_K"
    assert q4_k_m_type("output.weight", 4096, 36, False) == "Q6_K"
    six = [i for i in range(36) if q4_k_m_type(f"blk.{i}.ffn_down.weight", 12288, 36, False) == "Q6_K"]
    assert six[:5] == [0, 1, 2, 3, 6] and six[-4:] == [32, 33, 34, 35]
    assert q4_k_m_type("blk.5.attn_q.weight", 384, 8, True) == "Q5_0"  # rows not whole super-blocks
    assert q4_k_m_type("token_embd.weight", 384, 8, True) == "Q8_0"  # tied: the head's Q6_K, then its fallback


def test_the_triton_kernels_inside_the_model_give_the_same_logits(loads, monkeypatch):
    """The packed layers through the Triton kernels (the interpreter on CPU) instead of the reference."""
    from onebit.kernels import gguf_quants

    pytest.importorskip("onebit.kernels.triton_gguf")
    packed, dequantized = loads
    reference = gguf_quants.packed_linear
    monkeypatch.setattr(gguf_quants, "packed_linear", lambda x, parts, bias=None: reference(x, parts, bias, True))
    got, want = all_logits(packed, PROMPT), all_logits(dequantized, PROMPT)
    # The prompt's rows (17-64) go through mode "int" for Q8_0 (float32 reassociation, bounded in
    # test_gguf_repacked: 1.1e-5 alone) and "f16s" for Q6_K and Q4_K (Q4_K: the stand-in off Hopper for
    # the table's g16 picks, which round the same way), whose weights it rounds to float16 (2**-11
    # relative each; tests/test_gguf_f16.py): 8e-4 with Q6_K alone, 2.1e-3 with both.
    assert ((got - want).norm() / want.norm()).item() < 4e-3


def test_the_norms_before_packed_products_prepare_their_float16_rows(loads, monkeypatch):
    """The input norms before qkv and gate_up become `PackedInputNorm`s (only in the packed model); made
    to hand `F16Rows` on CPU (the GPU's condition, in Triton's interpreter) they leave the logits bit
    for bit those of the kernels that prepare x themselves (every norm through its Triton kernel in
    both runs, as on the GPU: off CUDA the plain norms would take the torch reference)."""
    from onebit.kernels import gguf_quants, ops
    from onebit.models.gguf.packed import PackedInputNorm

    pytest.importorskip("onebit.kernels.triton_gguf_f16")
    packed, dequantized = loads
    norms = [name for name, m in packed.engine.runner.model.named_modules() if isinstance(m, PackedInputNorm)]
    assert sorted(norms) == [f"layers.{i}.{n}" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")]
    assert not any(isinstance(m, PackedInputNorm) for m in dequantized.engine.runner.model.modules())
    reference = gguf_quants.packed_linear
    monkeypatch.setattr(gguf_quants, "packed_linear", lambda x, parts, bias=None: reference(x, parts, bias, True))
    monkeypatch.setattr(ops, "_triton", lambda t: ops.triton_fused is not None)
    plain = all_logits(packed, PROMPT)
    handed = []
    takes = PackedGGUFLinear.takes_f16_rows

    def on_any_device(self, rows, device):
        handed.append(rows)
        return takes(self, rows, torch.device("cuda"))

    monkeypatch.setattr(PackedGGUFLinear, "takes_f16_rows", on_any_device)
    assert torch.equal(all_logits(packed, PROMPT), plain)
    assert len(PROMPT) in handed  # the prompt's rows went through the fused norm (Q6_K parts: "f16s")
