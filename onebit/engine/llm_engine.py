"""The engine: requests in, per-step deltas out. Single-threaded; the caller drives `step()`."""

from __future__ import annotations

import itertools
import logging

import torch

from onebit.engine.outputs import EngineStats, SlotInfo, StepDelta, TokenLogprob
from onebit.engine.block_manager import BlockManager
from onebit.engine.config import EngineConfig
from onebit.engine.device import available_memory, pick_device, pick_dtype
from onebit.engine.errors import ContextOverflow
from onebit.engine.runner import ModelRunner, kv_block_bytes
from onebit.engine.sampler import Sampler
from onebit.engine.sampling_params import InvalidParameter, SamplingParams
from onebit.engine.scheduler import Scheduler
from onebit.engine.sequence import Sequence
from onebit.models.loader import load_model, resolve_model_path
from onebit.models.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer

log = logging.getLogger("onebit.engine")


class LLMEngine:
    """Loads a model and decodes many requests together over a paged KV cache.

    add_request / abort may be called between steps; each `step()` runs one batched
    forward and returns the deltas it produced (including final ones for aborts).
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        path = resolve_model_path(config.model)
        self.model_path = path
        self.device = pick_device(config.device)
        self.dtype = pick_dtype(config.dtype, self.device)
        if self.device.type == "cpu":
            # Softmax tails underflow into denormals, which cost x86 CPUs up to 100x per op.
            torch.set_flush_denormal(True)
        self.tokenizer = Tokenizer.from_dir(path)
        model, cfg = load_model(path, self.device, self.dtype, config.load_format)
        self.model_config = cfg
        self.eos_token_ids = set(self.tokenizer.eos_token_ids) | set(cfg.eos_token_ids)
        num_blocks, self.max_model_len = self._size_pool(cfg)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.parallel, config.max_batch_tokens)
        self.runner = ModelRunner(model, cfg, self.device, self.dtype, num_blocks, config.block_size,
                                  self.max_model_len, config.parallel, config.cuda_graphs)
        self.sampler = Sampler(self.eos_token_ids, self.device, config.seed)
        self.seqs: dict[str, Sequence] = {}
        self._pending: list[StepDelta] = []
        self._arrivals = itertools.count()
        log.info("KV cache: %d blocks of %d tokens (%.1f MiB), context %d tokens, %d slots",
                 num_blocks, config.block_size, num_blocks * kv_block_bytes(cfg, config.block_size, self.dtype) / 2**20,
                 self.max_model_len, config.parallel)

    def _size_pool(self, cfg) -> tuple[int, int]:
        c = self.config
        bs = c.block_size
        per_block = kv_block_bytes(cfg, bs, self.dtype)
        want_len = c.ctx_size or cfg.max_position_embeddings
        if c.kv_cache_memory is not None:
            num_blocks = c.kv_cache_memory // per_block
        else:
            num_blocks = c.parallel * -(-want_len // bs)
            num_blocks = min(num_blocks, available_memory(self.device, c.gpu_memory_fraction) // per_block)
        if num_blocks * bs < 2:
            raise ValueError(f"the KV cache budget holds {num_blocks * bs} tokens; it needs at least 2")
        max_len = min(want_len, num_blocks * bs)
        if max_len < want_len:
            log.warning("context limited to %d tokens by the KV cache size", max_len)
        return num_blocks, max_len

    # -- requests -------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; raise ValueError (InvalidParameter, ContextOverflow) for bad input."""
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise InvalidParameter("prompt", "the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab)), None)
        if bad is not None:
            raise InvalidParameter("prompt", f"token id {bad!r} is outside the vocabulary [0, {vocab})")
        params.validate()
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise ContextOverflow(n, self.max_model_len)
        limit = self.max_model_len if params.max_tokens is None else min(self.max_model_len, n + params.max_tokens)
        seq = Sequence(request_id, prompt_token_ids, params, limit, next(self._arrivals))
        if params.seed is not None:
            seq.generator = self.sampler.make_generator(params.seed)
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        seq.stop_matcher = StopStringMatcher(params.stop) if params.stop else None
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> None:
        """Stop a request in any state; its final delta comes from the next step. Unknown ids are ignored."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return
        self.scheduler.finish(seq)
        self._pending.append(self._delta(seq, [], "", "abort"))

    def has_unfinished(self) -> bool:
        """True while any request is queued, running or has an undelivered final delta."""
        return bool(self.seqs or self._pending)

    # -- stepping -------------------------------------------------------------------------

    def step(self) -> list[StepDelta]:
        """Run one batched forward and return every delta it produced."""
        deltas, self._pending = self._pending, []
        plan = self.scheduler.schedule()
        if not plan:
            return deltas
        try:
            logits, sampling = self.runner.run(plan)
            tokens, logprobs = self.sampler(logits, sampling)
        except Exception as exc:  # a failed forward fails the step's requests, not the engine
            log.exception("step failed")
            for seq, _ in plan:
                deltas.append(self._fail(seq, f"internal error during the forward pass: {exc}"))
            return deltas
        for seq, n in plan:
            seq.num_computed_tokens += n
            self.block_manager.commit_full_blocks(seq)
        for seq, token, lp in zip(sampling, tokens, logprobs):
            try:
                deltas.append(self._accept(seq, token, lp))
            except Exception as exc:
                log.exception("request %s failed", seq.request_id)
                deltas.append(self._fail(seq, f"internal error: {exc}"))
        return deltas

    def _accept(self, seq: Sequence, token: int, lp: TokenLogprob | None) -> StepDelta:
        seq.append(token)
        p = seq.params
        reason = None
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            reason = "stop"
            text = seq.detokenizer.flush()
        else:
            text = seq.detokenizer.add([token])
            if seq.num_tokens >= seq.max_total_tokens:
                reason = "length"
                text += seq.detokenizer.flush()
        if seq.stop_matcher is not None:
            text, stopped = seq.stop_matcher.feed(text)
            if stopped:
                reason = "stop"
            elif reason is not None:
                text += seq.stop_matcher.flush()
        if reason is not None:
            self.scheduler.finish(seq)
            self.seqs.pop(seq.request_id, None)
        return self._delta(seq, [token], text, reason, [lp] if lp is not None else None)

    def _fail(self, seq: Sequence, message: str) -> StepDelta:
        self.scheduler.finish(seq)
        self.seqs.pop(seq.request_id, None)
        delta = self._delta(seq, [], "", "error")
        delta.error = message
        return delta

    def _delta(self, seq, tokens, text, reason, logprobs=None) -> StepDelta:
        return StepDelta(seq.request_id, tokens, text, reason is not None, reason, None, logprobs,
                         seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_tokens)

    # -- introspection --------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """Running/waiting counts, KV usage and preemptions."""
        s = self.scheduler
        return EngineStats(len(s.running), len(s.waiting), self.block_manager.usage, s.num_preemptions,
                           self.block_manager.num_blocks)

    def slots(self) -> list[SlotInfo]:
        """One entry per slot, with the request it serves if any."""
        by_slot = {seq.slot: seq for seq in self.scheduler.running}
        out = []
        for i in range(self.config.parallel):
            seq = by_slot.get(i)
            out.append(SlotInfo(i, "", seq is not None, seq.request_id if seq else None,
                                seq.num_prompt_tokens if seq else 0, seq.num_output_tokens if seq else 0))
        return out
