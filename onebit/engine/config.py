"""Engine configuration: the knobs users know from vLLM and llama-server."""

from __future__ import annotations

from dataclasses import dataclass

from onebit.engine.spec.config import SpeculativeConfig

# `--quantize fp8` quantizes the output head too unless told otherwise: on the demo model's held-out
# text the head adds +0.07-0.14 points of perplexity, +0.68% against float32 with FP8 weights,
# activations and KV cache together (docs/perf.md "FP8 and GGUF accuracy"; #20's budget: 1%).
QUANTIZE_LM_HEAD_DEFAULT = True


@dataclass
class EngineConfig:
    """Everything needed to build an LLMEngine (`onebit.engine.build.build_engine`).

    model: a model directory, or a Hugging Face id already in the local cache.
    parallel: the number of slots (sequences decoding together).
    ctx_size: the longest sequence (prompt + output); None takes the model's limit.
    kv_cache_memory: bytes for the KV pool; when None the pool holds `parallel`
    full contexts, capped by `gpu_memory_fraction` of free device memory on CUDA.
    speculative: None, or a SpeculativeConfig (a method name such as "mtp", or a dict of its
    fields such as {"method": "ngram", "draft_max": 2}, is turned into one).
    load_format: "auto" reads the checkpoint; "dummy" draws random weights from config.json
    alone (benchmarks of a model's shape only).
    overlap: prepare and queue step n+1 while the GPU still runs step n; with speculative decoding
    only plain steps overlap (a drafting step needs the tokens before it). None (the default) turns
    it on for CUDA, where it was checked and measured faster at every batch size (docs/perf.md),
    and off on the CPU, where there is no device queue to hide host work behind.
    quantize: None, or "fp8": the decoder's linear layers quantized after loading (e4m3 weights with
    one scale per output channel; `onebit.models.quantize`).
    quantize_lm_head: with `quantize`, the output head too (per-row scales; a tied head gets an e4m3
    copy and the embedding lookup keeps the run dtype). The default follows the held-out perplexity
    in docs/perf.md.
    kv_cache_dtype: "auto" (the model's dtype) or "fp8": K/V stored as e4m3 with fixed per-layer,
    per-KV-head scales from a calibration prefill at start-up (`onebit.engine.kv_calibration`), half
    the bytes of bf16 per cached token.
    gguf_keep_packed: a GGUF model's Q8_0/Q4_K/Q5_K/Q6_K linear layers stay in their blocks on the
    device, multiplied by Triton kernels (`onebit.models.gguf.packed`); None or False (the default)
    dequantizes them to the run dtype at load (packed is slower than bf16 on the H200 so far).
    triton_gemv: at start-up on CUDA in half precision, time the Triton few-row kernels against
    cuBLAS for each weight shape at 1 to 16 rows, and use one where it is correct and faster.
    adaptive_at: one engine serving `--adaptive` on one device: the primary's regime (drafting,
    when a drafter is set) while at most this many requests run, plain large-batch steps above.
    mixed_step_tokens: None (the default: a step's only bound is max_batch_tokens), or the cap on
    a step's tokens while any sequence decodes; prompt chunks take what the decode rows leave, less
    deep into long prompts (`onebit.engine.prefill_budget`), so decode latency stays flat.
    deterministic: batch-invariant kernels (`onebit.kernels.batch_invariant`): a sequence's logits
    are the same bits alone or in any batch, in a verification, a chunk or after a prefix hit.
    """

    model: str
    device: str = "auto"
    dtype: str = "auto"
    parallel: int = 4
    ctx_size: int | None = None
    max_batch_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory: int | None = None
    gpu_memory_fraction: float = 0.85
    enable_prefix_caching: bool = True
    seed: int = 0
    load_format: str = "auto"
    cuda_graphs: bool = True
    speculative: SpeculativeConfig | None = None
    overlap: bool | None = None
    triton_gemv: bool = True
    quantize: str | None = None
    quantize_lm_head: bool = QUANTIZE_LM_HEAD_DEFAULT
    kv_cache_dtype: str = "auto"
    gguf_keep_packed: bool | None = None
    fair_share: bool = True  # share slots and prefill between users by least service (False: FIFO)
    priority_preempt: bool = False  # a waiting request of lower priority value preempts its user's running one
    adaptive_at: int | None = None  # `--adaptive` on one device: draft only while this many requests run or fewer
    deterministic: bool = False  # batch-invariant products and attention (same output whatever the batch)
    mixed_step_tokens: int | None = None  # cap on a step's tokens while sequences decode (prefill_budget.py)

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError("parallel must be >= 1")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be >= 1")
        if self.mixed_step_tokens is not None and self.mixed_step_tokens < 1:
            raise ValueError("mixed_step_tokens must be >= 1")
        if self.ctx_size is not None and self.ctx_size < 2:
            raise ValueError("ctx_size must be >= 2")
        if self.quantize not in (None, "fp8"):
            raise ValueError(f"unknown quantization {self.quantize!r}; use fp8")
        if self.deterministic and self.quantize:
            raise ValueError("deterministic mode has no batch-invariant fp8 kernel yet; drop --quantize")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"unknown KV cache dtype {self.kv_cache_dtype!r}; use auto or fp8")
        if self.deterministic and self.kv_cache_dtype == "fp8":
            raise ValueError("deterministic mode has no batch-invariant attention over an fp8 KV cache yet; "
                             "drop --kv-cache-dtype fp8")
        self.speculative = SpeculativeConfig.coerce(self.speculative)
        if self.adaptive_at is not None and not 1 <= self.adaptive_at <= self.parallel:
            raise ValueError("adaptive_at must be in 1..parallel")
