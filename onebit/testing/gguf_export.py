"""Write a Hugging Face model directory (Qwen3, Qwen2, Llama, Mistral) as one GGUF file for llama.cpp.

    python -m onebit.testing.gguf_export MODEL_DIR OUT.gguf [--dtype f32|f16|bf16|q4_k_m] [--device cuda]

Weights stream from the safetensors files one tensor at a time, so the whole model is never in
memory. Matrices are stored in the chosen dtype, norms and biases always in f32. q4_k_m follows
llama.cpp's Q4_K_M recipe per matrix (`gguf_encode.q4_k_m_type`: Q6_K for the head and some
attn_v/ffn_down, Q4_K elsewhere), encoded by round to nearest (`gguf_encode`, on --device; no
search for the best scales, unlike llama.cpp's quantizer). The tokenizer must be a byte-level BPE
(`tokenizer.json`), as Qwen, Llama 3 and our tiny models use.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import torch

from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.testing.gguf_encode import encode, q4_k_m_type
from onebit.testing.gguf_tensors import (
    GGUF_ARCH, GGUFExportError, expected_tensors, gguf_tensor_name, plan_tensors, rotate_half_to_interleaved,
)
from onebit.testing.gguf_vocab import Vocab, read_vocab, write_tokenizer_metadata

__all__ = ["GGUFExportError", "GGUF_ARCH", "expected_tensors", "export_gguf", "gguf_tensor_name", "main",
           "rotate_half_to_interleaved"]

DTYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    # matrices by the recipe (see _recipe_type); Q4_K is what plan_tensors is given
    "q4_k_m": (gguf.GGMLQuantizationType.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
}

# What _convert hands the writer for each stored type (bf16 travels as raw 16-bit patterns).
_NUMPY_DTYPE = {
    gguf.GGMLQuantizationType.F32: np.dtype(np.float32),
    gguf.GGMLQuantizationType.F16: np.dtype(np.float16),
    gguf.GGMLQuantizationType.BF16: np.dtype(np.uint16),
}


def _write_metadata(w: gguf.GGUFWriter, cfg: ModelConfig, vocab: Vocab, name: str,
                    ftype: gguf.LlamaFileType) -> None:
    w.add_name(name)
    w.add_file_type(int(ftype))
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(vocab.tokens))
    s = cfg.rope_scaling
    if s is not None and s["rope_type"] in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(s["rope_type"]))
        w.add_rope_scaling_factor(float(s["factor"]))
        if s["rope_type"] == "yarn":
            w.add_rope_scaling_orig_ctx_len(int(s.get("original_max_position_embeddings")
                                                or cfg.max_position_embeddings))
    # llama3 scaling is carried by the rope_freqs tensor instead (see gguf_tensors.plan_tensors).
    write_tokenizer_metadata(w, vocab)


def _recipe_type(name: str, shape: tuple[int, ...], cfg: ModelConfig) -> gguf.GGMLQuantizationType:
    """The Q4_K_M recipe's type of matrix `name`."""
    return gguf.GGMLQuantizationType[q4_k_m_type(name, shape[1], cfg.num_layers, cfg.tie_word_embeddings)]


def _nbytes(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> int:
    """Bytes of a stored tensor of `shape` (PyTorch order) and type."""
    if qtype in _NUMPY_DTYPE:
        return int(np.prod(shape)) * _NUMPY_DTYPE[qtype].itemsize
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape[:-1])) * (shape[-1] // block) * size


def _convert(t: torch.Tensor, qtype: gguf.GGMLQuantizationType, device: str = "cpu") -> np.ndarray:
    if qtype not in _NUMPY_DTYPE:  # quantized: uint8 [rows, row bytes]
        return encode(t.to(device), qtype.name)
    if qtype == gguf.GGMLQuantizationType.F32:
        return t.to(torch.float32).contiguous().numpy()
    if qtype == gguf.GGMLQuantizationType.F16:
        return t.to(torch.float16).contiguous().numpy()
    return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)


def export_gguf(model_dir: str | Path, out: str | Path, dtype: str = "f32",
                tokenizer_pre: str | None = None, device: str = "cpu") -> Path:
    """Write `model_dir` (a Hugging Face directory) to the GGUF file `out` and return its path;
    `device` runs the quantized types' encoders.

    The file appears only when complete (written beside it, then renamed).
    """
    path, out = Path(model_dir), Path(out)
    if dtype not in DTYPES:
        raise GGUFExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    cfg = ModelConfig.from_dir(path)
    if cfg.family == "qwen2" and cfg.head_dim * cfg.num_heads != cfg.hidden_size:
        raise GGUFExportError("llama.cpp's qwen2 graph needs head_dim * num_attention_heads == hidden_size")
    if cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "llama3" and GGUF_ARCH[cfg.family] != "llama":
        raise GGUFExportError(f"llama3 rope scaling is only supported for Llama-family models, not {cfg.family}")
    qtype, ftype = DTYPES[dtype]
    vocab = read_vocab(path, cfg, tokenizer_pre)
    if len(vocab.tokens) != cfg.vocab_size:
        raise GGUFExportError(f"tokenizer has {len(vocab.tokens)} tokens but config.json vocab_size is "
                              f"{cfg.vocab_size}; llama.cpp needs one entry per embedding row")
    plans = plan_tensors(path, cfg, qtype)
    if dtype == "q4_k_m":
        plans = [dataclasses.replace(p, qtype=_recipe_type(p.name, p.shape, cfg)) if len(p.shape) > 1 else p
                 for p in plans]

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, GGUF_ARCH[cfg.family])
    try:
        _write_metadata(writer, cfg, vocab, path.resolve().name, ftype)
        for p in plans:
            if p.qtype in _NUMPY_DTYPE:
                writer.add_tensor_info(p.name, p.shape, _NUMPY_DTYPE[p.qtype], _nbytes(p.shape, p.qtype),
                                       raw_dtype=p.qtype)
            else:  # quantized: the byte shape, which the writer turns back into the value shape
                nbytes = _nbytes(p.shape, p.qtype)
                writer.add_tensor_info(p.name, (p.shape[0], nbytes // p.shape[0]), np.dtype(np.uint8), nbytes,
                                       raw_dtype=p.qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for p in plans:
            writer.write_tensor_data(_convert(p.load(), p.qtype, device))
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m onebit.testing.gguf_export", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="Hugging Face model directory (config.json, safetensors, tokenizer.json)")
    parser.add_argument("out", help="GGUF file to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="type of the matrices (default f32)")
    parser.add_argument("--tokenizer-pre", help="llama.cpp pre-tokenizer name, when it cannot be recognised")
    parser.add_argument("--device", default="cpu", help="where q4_k_m's encoders run (cuda for large models)")
    args = parser.parse_args(argv)
    try:
        out = export_gguf(args.model_dir, args.out, args.dtype, args.tokenizer_pre, args.device)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
