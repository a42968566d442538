"""Engine configuration: the knobs users know from vLLM and llama-server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """Everything needed to build an LLMEngine.

    model: a model directory, or a Hugging Face id already in the local cache.
    parallel: the number of slots (sequences decoding together).
    ctx_size: the longest sequence (prompt + output); None takes the model's limit.
    kv_cache_memory: bytes for the KV pool; when None the pool holds `parallel`
    full contexts, capped by `gpu_memory_fraction` of free device memory on CUDA.
    speculative: None, "mtp" (the checkpoint's head, or the one at mtp_path), "ngram"
    (prompt lookup) or "draft" (the smaller model at draft_model, same tokenizer; its KV
    pool has as many blocks as the model's and shares the KV budget with it), or "oracle":
    a measuring instrument for benchmarks only, proposing the recorded greedy continuation
    (oracle_record) right with probability oracle_p per token.
    draft_policy: "auto" drafts only while measured step times say it pays; "always" drafts
    draft_max tokens whenever it can (llama.cpp's behaviour; deterministic, for tests).
    overlap: prepare and queue step n+1 while the GPU still runs step n; ignored with speculative
    decoding, where drafting needs each step's tokens on the host first. Off by default until it
    has been checked and timed on a GPU (docs/perf.md).
    triton_gemv: at start-up on CUDA in half precision, time the Triton few-row kernels against
    cuBLAS for each weight shape at 1 to 16 rows, and use one where it is correct and faster.
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
    speculative: str | None = None
    draft_max: int = 3
    mtp_path: str | None = None
    mtp_p_min: float = 0.0
    draft_model: str | None = None
    oracle_p: float | None = None  # speculative="oracle" only: a measuring instrument (engine/oracle.py)
    oracle_record: str | None = None
    draft_policy: str = "auto"
    overlap: bool = False
    triton_gemv: bool = True

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError("parallel must be >= 1")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be >= 1")
        if self.ctx_size is not None and self.ctx_size < 2:
            raise ValueError("ctx_size must be >= 2")
        if self.speculative not in (None, "mtp", "ngram", "draft", "oracle"):
            raise ValueError("speculative must be None, 'mtp', 'ngram', 'draft' or 'oracle'")
        if (self.speculative == "oracle") != (self.oracle_p is not None and self.oracle_record is not None):
            raise ValueError("speculative='oracle' (a measuring instrument) needs oracle_p and oracle_record, "
                             "and they mean nothing without it")
        if self.draft_policy not in ("auto", "always"):
            raise ValueError("draft_policy must be 'auto' or 'always'")
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError("speculative='draft' needs draft_model (a model directory with the same tokenizer)")
        if self.draft_max < 1:
            raise ValueError("draft_max must be >= 1")
        if not 0.0 <= self.mtp_p_min < 1.0:
            raise ValueError("mtp_p_min must be in [0, 1)")
