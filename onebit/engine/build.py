"""Building an engine from its config: device, dtype, weights, KV pool size, drafter."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from onebit.engine.block_manager import BlockManager
from onebit.engine.config import EngineConfig
from onebit.engine.device import available_memory, pick_device, pick_dtype
from onebit.engine.kv_calibration import calibrate_kv_scales, calibration_ids
from onebit.engine.llm_engine import LLMEngine
from onebit.engine.parts import EngineParts
from onebit.engine.output_processor import OutputProcessor
from onebit.engine.runner import GRAPH_CHUNK_TOKENS, ModelRunner, kv_block_bytes
from onebit.engine.sampler import Sampler
from onebit.engine.scheduler import Scheduler
from onebit.engine.spec.speculator import Speculator
from onebit.kernels import kv_fp8
from onebit.models import transformer
from onebit.models.config import ModelConfig
from onebit.models.loader import load_model, resolve_model_path
from onebit.models.tokenizer import Tokenizer

log = logging.getLogger("onebit.engine")


def size_pool(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
              extra_layers: int = 0, extra_block_bytes: int = 0) -> tuple[int, int, int]:
    """(number of KV blocks, context size, bytes one block costs) for this config and model.

    A block's cost covers every layer, `extra_layers` more (the MTP head's) and `extra_block_bytes`
    (the draft model's pool, which has as many blocks). Without kv_cache_memory the pool holds
    `parallel` full contexts, capped by the memory available; the context shrinks to fit the pool."""
    bs = config.block_size
    per_block = kv_block_bytes(cfg, bs, dtype) * (cfg.num_layers + extra_layers) // cfg.num_layers
    per_block += extra_block_bytes
    want_len = config.ctx_size or cfg.max_position_embeddings
    if config.kv_cache_memory is not None:
        num_blocks = config.kv_cache_memory // per_block
    else:
        num_blocks = config.parallel * -(-want_len // bs)
        num_blocks = min(num_blocks, available_memory(device, config.gpu_memory_fraction) // per_block)
    if num_blocks * bs < 2:
        raise ValueError(f"the KV cache budget holds {num_blocks * bs} tokens; it needs at least 2")
    ctx_size = min(want_len, num_blocks * bs)
    if ctx_size < want_len:
        log.warning("context limited to %d tokens by the KV cache size", ctx_size)
    return num_blocks, ctx_size, per_block


def _make_drafter(config: EngineConfig, draft, runner: ModelRunner, cfg: ModelConfig, num_blocks: int,
                  ctx_size: int, device: torch.device, dtype: torch.dtype):
    """The drafter the speculative config names (None without speculation)."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "mtp":
        from onebit.engine.spec.mtp import MtpDrafter
        return MtpDrafter(runner, spec.p_min)
    if spec.method == "ngram":
        from onebit.engine.spec.ngram import NgramDrafter
        return NgramDrafter()
    if spec.method == "draft":
        from onebit.engine.spec.draft_model import DraftModelProposer
        return DraftModelProposer(*draft, device, dtype, cfg.vocab_size, num_blocks, config.block_size, ctx_size,
                                  config.max_batch_tokens, config.parallel, config.cuda_graphs)
    return spec.drafter_factory(vocab_size=cfg.vocab_size, seed=config.seed)


def fold_norms(model, config: EngineConfig, device: torch.device) -> int:
    """Fold the decoder norms into the products after them (`transformer.FOLD_NORMS`) where the one-row
    gemv path can use them: on CUDA, weights not quantized by --quantize. Returns the layers folded."""
    if transformer.FOLD_NORMS and device.type == "cuda" and not config.quantize:
        return model.fold_norms()
    return 0


def _load(config: EngineConfig, path: Path, tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype):
    """(model, its config, MTP head or None, (draft model, its config) or None)."""
    spec = config.speculative
    method = spec.method if spec is not None else None
    draft = None
    if method == "draft":
        from onebit.engine.spec.draft_model import load_draft_model
        draft = load_draft_model(spec.draft_model, tokenizer, device, dtype, config.load_format)
    model, cfg = load_model(path, device, dtype, config.load_format, config.gguf_keep_packed)
    folded = fold_norms(model, config, device)
    if folded:
        log.info("folded the norms of %d decoder layers into their products", folded)
    if config.quantize:
        from onebit.models.quantize import quantize_model
        count = quantize_model(model, config.quantize, head=config.quantize_lm_head)
        log.info("quantized %d linear layers to %s", count, config.quantize)
    mtp = None
    if method == "mtp":
        from onebit.models.mtp import load_mtp_head
        mtp = load_mtp_head(path, cfg, device, dtype, Path(spec.mtp_path) if spec.mtp_path else None,
                            config.load_format)
    return model, cfg, mtp, draft


def build_engine(config: EngineConfig) -> LLMEngine:
    """Load the model (and drafter) on the configured device, size the KV pool, wire the engine."""
    path = resolve_model_path(config.model)
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    if device.type == "cpu":
        # Softmax tails underflow into denormals, which cost x86 CPUs up to 100x per op.
        torch.set_flush_denormal(True)
    tokenizer = Tokenizer.from_dir(path)
    model, cfg, mtp, draft = _load(config, path, tokenizer, device, dtype)
    draft_bytes = kv_block_bytes(draft[1], config.block_size, dtype) if draft else 0
    kv_dtype = kv_fp8.cache_dtype(config.kv_cache_dtype, dtype)
    if kv_fp8.KV_FP8 == kv_dtype:
        scales = calibrate_kv_scales(model, cfg, calibration_ids(tokenizer, cfg.vocab_size, 256), device, dtype,
                                     mtp=mtp)
        log.info("fp8 KV cache: per-head scales from a calibration prefill, K %.3g..%.3g, V %.3g..%.3g",
                 scales[0].min(), scales[0].max(), scales[1].min(), scales[1].max())
    num_blocks, ctx_size, per_block = size_pool(config, cfg, kv_dtype, device, 1 if mtp is not None else 0,
                                                draft_bytes)
    spec = config.speculative
    blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
    runner = ModelRunner(model, cfg, device, dtype, num_blocks, config.block_size, ctx_size, config.parallel,
                         config.cuda_graphs, mtp,
                         max_graph_chunk=max(GRAPH_CHUNK_TOKENS, 1 + (spec.draft_max if spec else 3)),
                         triton_gemv=config.triton_gemv and not config.deterministic,
                         deterministic=config.deterministic, kv_dtype=kv_dtype)
    eos = set(tokenizer.eos_token_ids) | set(cfg.eos_token_ids)
    sampler = Sampler(eos, device, config.seed)
    drafter = _make_drafter(config, draft, runner, cfg, num_blocks, ctx_size, device, dtype)
    speculator = Speculator(drafter, spec.draft_max if spec else 3, spec is not None and spec.policy == "always",
                            sampler.generator, config.adaptive_at, sampler.eos_token_ids)
    # With a drafter, only plain steps overlap: a drafting step waits for the tokens before it.
    overlap = config.overlap if config.overlap is not None else device.type == "cuda"
    log.info("KV cache: %d blocks of %d tokens (%.1f MiB), context %d tokens, %d slots%s",
             num_blocks, config.block_size, num_blocks * kv_block_bytes(cfg, config.block_size, kv_dtype) / 2**20,
             ctx_size, config.parallel, "; overlapped steps" if overlap else "")
    parts = EngineParts(path, device, dtype, tokenizer, cfg, eos, ctx_size, per_block,
                        Scheduler(blocks, config.parallel, config.max_batch_tokens, config.fair_share,
                                  config.priority_preempt, config.mixed_step_tokens), runner, sampler, speculator,
                        OutputProcessor(tokenizer, eos), overlap)
    return LLMEngine(config, parts)
