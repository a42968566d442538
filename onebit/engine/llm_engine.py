"""The engine: requests in, per-step deltas out. Single-threaded; the caller drives `step()`."""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from onebit.engine.block_manager import BlockManager
from onebit.engine.config import EngineConfig
from onebit.engine.device import available_memory, pick_device, pick_dtype
from onebit.engine.draft_model import DraftModelProposer, load_draft_model
from onebit.engine.oracle import OracleDrafter
from onebit.engine.outputs import EngineStats, SlotInfo, SpecStats, StepDelta, TokenLogprob
from onebit.engine.runner import GRAPH_CHUNK_TOKENS, ModelRunner, StepOutput, kv_block_bytes
from onebit.engine.sampler import SampledBatch, Sampler
from onebit.engine.sampling_params import SamplingParams
from onebit.engine.scheduler import Scheduler
from onebit.engine.sequence import Sequence
from onebit.engine.speculative import DraftPolicy, NgramDrafter, can_draft, verify
from onebit.engine.transfer import upload
from onebit.models.loader import load_model, resolve_model_path
from onebit.models.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer
from onebit.protocol.validate import check_request

log = logging.getLogger("onebit.engine")


@dataclass
class _Launched:
    """A step queued on the device: its plan, forward output, sampled rows and bookkeeping."""

    plan: list[tuple[Sequence, int]]
    out: StepOutput
    plain: list[tuple[Sequence, int]]  # sequences that sample one token, with their logits row
    sampled: SampledBatch | None
    computed: dict  # seq -> (computed tokens before the step, tokens computed in it)
    decodes: int
    drafting: list[Sequence]
    started: float


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
        draft = (load_draft_model(config.draft_model, self.tokenizer, self.device, self.dtype, config.load_format)
                 if config.speculative == "draft" else None)
        self._draft_block_bytes = kv_block_bytes(draft[1], config.block_size, self.dtype) if draft else 0
        model, cfg = load_model(path, self.device, self.dtype, config.load_format)
        self.model_config = cfg
        self.eos_token_ids = set(self.tokenizer.eos_token_ids) | set(cfg.eos_token_ids)
        mtp = None
        if config.speculative == "mtp":
            from onebit.models.mtp import load_mtp_head
            mtp = load_mtp_head(path, cfg, self.device, self.dtype,
                                Path(config.mtp_path) if config.mtp_path else None, config.load_format)
        self._mtp_layers = 1 if mtp is not None else 0
        num_blocks, self.max_model_len = self._size_pool(cfg)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.parallel, config.max_batch_tokens)
        self.runner = ModelRunner(model, cfg, self.device, self.dtype, num_blocks, config.block_size,
                                  self.max_model_len, config.parallel, config.cuda_graphs, mtp,
                                  max_graph_chunk=max(GRAPH_CHUNK_TOKENS, 1 + config.draft_max),
                                  triton_gemv=config.triton_gemv)
        # Drafters other than the MTP head (which lives in the runner) share one interface:
        # propose([(seq, k)]) -> [(seq, drafts)] and release(seq).
        self.drafter = None
        if draft:
            self.drafter = DraftModelProposer(*draft, self.device, self.dtype, cfg.vocab_size, num_blocks,
                                              config.block_size, self.max_model_len, config.max_batch_tokens,
                                              config.parallel, config.cuda_graphs)
        elif config.speculative == "ngram":
            self.drafter = NgramDrafter()
        elif config.speculative == "oracle":
            log.warning("speculative decoding with the ORACLE drafter: a measuring instrument that reads "
                        "recorded outputs (%s); never a way to serve", config.oracle_record)
            self.drafter = OracleDrafter(OracleDrafter.read_record(config.oracle_record), config.oracle_p,
                                         cfg.vocab_size, config.seed)
        self.policy = DraftPolicy(config.draft_max, always=config.draft_policy == "always") \
            if config.speculative else None
        self.spec = SpecStats()
        self.busy_s = 0.0  # wall time inside step() that ran a forward
        self.sampler = Sampler(self.eos_token_ids, self.device, config.seed)
        self.seqs: dict[str, Sequence] = {}
        self._pending: list[StepDelta] = []
        # Overlap: a launched step whose tokens are still on their way to the host (see step()).
        # Drafting reads each step's tokens on the host before the next step, so never with speculation.
        self.overlap = config.overlap and config.speculative is None
        if config.overlap and not self.overlap:
            log.warning("overlapped steps are off: speculative decoding needs each step's tokens first")
        self._inflight: _Launched | None = None
        self._arrivals = itertools.count()
        log.info("KV cache: %d blocks of %d tokens (%.1f MiB), context %d tokens, %d slots%s",
                 num_blocks, config.block_size, num_blocks * kv_block_bytes(cfg, config.block_size, self.dtype) / 2**20,
                 self.max_model_len, config.parallel, "; overlapped steps" if self.overlap else "")

    def _size_pool(self, cfg) -> tuple[int, int]:
        c = self.config
        bs = c.block_size
        per_block = kv_block_bytes(cfg, bs, self.dtype) * (cfg.num_layers + self._mtp_layers) // cfg.num_layers
        per_block += self._draft_block_bytes  # the draft model's pool has as many blocks
        self.kv_bytes_per_block = per_block  # everything one block costs: all layers, MTP layer, draft pool
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
        """Queue a request; raise InvalidRequest (ContextOverflow for a prompt too long) for bad input."""
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        check_request(prompt_token_ids, params, self.model_config.vocab_size, self.max_model_len)
        n = len(prompt_token_ids)
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
        self._finish(seq)
        self._pending.append(self._delta(seq, [], "", "abort"))

    def has_unfinished(self) -> bool:
        """True while any request is queued, running or has an undelivered delta."""
        return bool(self.seqs or self._pending or self._inflight)

    # -- stepping -------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[StepDelta]:
        """Run one batched forward and return every delta it produced.

        With overlap on, the step launched here is finished by the next call: this call queues
        step n+1 on the GPU (its decodes read the tokens step n sampled straight from the
        device), then waits for step n's tokens and turns them into deltas while the GPU
        computes step n+1. Deltas therefore come one call later than they would without overlap.
        """
        deltas, self._pending = self._pending, []
        started = time.perf_counter()
        previous, self._inflight = self._inflight, None
        worked = previous is not None
        if previous is not None and not self._can_feed(previous):
            deltas += self._finish_step(previous)
            previous = None
        launched = self._launch(previous, deltas)
        if previous is not None:
            deltas += self._finish_step(previous)
        if launched is not None:
            if self.overlap:  # never on with speculation, so a launched step has no drafts or MTP states
                self._inflight = launched
            else:
                deltas += self._finish_step(launched)
        if launched is not None or worked:
            self.busy_s += time.perf_counter() - started
        return deltas

    def _can_feed(self, previous: "_Launched") -> bool:
        """Whether the next step may start before `previous`'s tokens reach the host: not when a
        penalty needs them (they count the output so far)."""
        return previous.sampled is not None and not any(seq.params.has_penalties for seq, _ in previous.plain)

    def _add_placeholders(self, previous: "_Launched") -> None:
        """Let each sequence that sampled in `previous` and goes on compute that token's position in
        the next step: a placeholder stands for the token, which the forward reads on the device.
        A token that ends the request for length is never fed (its position is never needed)."""
        for row, (seq, _) in enumerate(previous.plain):
            if seq.is_finished or seq.num_uncomputed or seq.num_tokens + 1 >= seq.max_total_tokens:
                continue
            seq.add_placeholder(row)

    def _launch(self, previous: "_Launched | None", deltas: list[StepDelta]) -> "_Launched | None":
        """Schedule and queue one forward and its sampling; None when nothing runs (or it failed,
        whose deltas go to `deltas`)."""
        started = time.perf_counter()  # drafting counts: a draft model's forwards are part of a step's cost
        drafting, want_state = self._propose_drafts()
        if previous is not None:
            self._add_placeholders(previous)
        plan = self.scheduler.schedule()
        scheduled = {seq: n for seq, n in plan}
        for seq in drafting:  # drafts the plan did not fit are dropped; no step carries stale ones
            seq.drop_drafts(max(scheduled.get(seq, 0) - 1, 0))
        if not plan:
            return None
        decodes = sum(1 for seq in scheduled if seq.num_computed_tokens > 0)
        try:
            # The MTP head needs base states for every position it will read: prompts (eager anyway)
            # and speculative steps. Plain decode steps under load skip it and stay graph replays.
            want_hidden = self.runner.mtp is not None and (want_state or any(n > 1 for _, n in plan))
            fed = previous.sampled.tokens if previous is not None else None
            out = self.runner.run(plan, want_hidden=want_hidden, fed_tokens=fed)
            plain = [(seq, row) for seq, row, count in out.rows if not seq.num_draft]
            sampled = self._sample_plain(out.logits, plain) if plain else None
        except Exception as exc:  # a failed forward fails the step's requests, not the engine
            log.exception("step failed")
            for seq, _ in plan:
                deltas.append(self._fail(seq, f"internal error during the forward pass: {exc}"))
            return None
        computed = {}
        for seq, n in plan:
            computed[seq] = (seq.num_computed_tokens, n)
            seq.num_computed_tokens += n
        return _Launched(plan, out, plain, sampled, computed, decodes, drafting, started)

    def _finish_step(self, step: "_Launched") -> list[StepDelta]:
        """Wait for a launched step's tokens and turn them into deltas: accept, verify, finish."""
        deltas = []
        try:
            tokens, logprobs = step.sampled.resolve() if step.sampled is not None else ([], [])
        except Exception as exc:
            log.exception("step failed")
            return [self._fail(seq, f"internal error during sampling: {exc}") for seq, _ in step.plan
                    if not seq.is_finished]
        for (seq, _), token, lp in zip(step.plain, tokens, logprobs):
            if seq.is_finished:  # aborted meanwhile, or (overlap) a row run after the request's last token
                continue
            deltas.append(self._guarded(seq, lambda seq=seq, token=token, lp=lp: self._accept(seq, token, lp)))
        out = step.out
        verified = any(seq.num_draft for seq, _, _ in out.rows)
        for seq, row, count in out.rows:
            if seq.num_draft:
                deltas.append(self._guarded(seq, lambda seq=seq, row=row, count=count:
                                            self._accept_verified(seq, out.logits[row:row + count])))
        if out.hidden is not None:
            self._mtp_catch_up(step.plan, out, step.computed)
        for seq, _ in step.plan:
            if not seq.is_finished:
                self.block_manager.commit_full_blocks(seq)
        if step.decodes:
            self.spec.record_step(verified)
        if self.policy is not None and step.decodes:
            self.policy.record_step(step.decodes, self._step_k if step.drafting else 0,
                                    time.perf_counter() - step.started)
        return deltas

    def _sample_plain(self, logits, plain: list[tuple[Sequence, int]]):
        """Sample one token for each (sequence, logits row); the common all-rows case needs no gather,
        which on a 152k vocabulary is a copy of the whole logits tensor per step."""
        rows = [row for _, row in plain]
        if rows != list(range(logits.shape[0])):
            logits = logits[upload(rows, torch.long, logits.device)]
        return self.sampler.sample(logits, [seq for seq, _ in plain])

    def _guarded(self, seq: Sequence, accept) -> StepDelta:
        try:
            return accept()
        except Exception as exc:
            log.exception("request %s failed", seq.request_id)
            return self._fail(seq, f"internal error: {exc}")

    # -- speculative decoding -------------------------------------------------------------

    def _draft_budget(self, seq: Sequence, k: int) -> int:
        if seq.params.draft_max is not None:
            k = min(k, seq.params.draft_max)
        return max(0, min(k, seq.max_total_tokens - seq.num_tokens - 1))

    def _propose_drafts(self) -> tuple[list[Sequence], bool]:
        """Append drafts to running decodes when the policy says drafting pays for this batch.
        Returns the drafting sequences, and whether this step should collect MTP state."""
        self._step_k = 0
        if self.policy is None:
            return [], False
        decoding = [s for s in self.scheduler.running if s.num_uncomputed == 1]
        self._step_k = self.policy.choose(len(decoding)) if decoding else 0
        if not self._step_k:
            return [], False
        chosen = []
        for seq in decoding:
            k = self._draft_budget(seq, self._step_k) if can_draft(seq) else 0
            if k and self.block_manager.can_grow(seq, seq.num_tokens + k):
                self.block_manager.grow(seq, seq.num_tokens + k)
                chosen.append((seq, k))
        if self.runner.mtp is not None:
            proposals = self._mtp_drafts([(seq, k) for seq, k in chosen if seq.hidden_pos == seq.num_tokens - 2])
        else:
            proposals = self.drafter.propose(chosen)
        drafting = []
        for seq, drafts in proposals:
            if drafts:
                seq.token_ids.extend(drafts)
                seq.num_draft = len(drafts)
                drafting.append(seq)
        # With an MTP head, a sequence without a fresh base state gets one from this step.
        return drafting, self.runner.mtp is not None and bool(chosen)

    def _mtp_drafts(self, chosen: list[tuple[Sequence, int]]) -> list[tuple[Sequence, list[int]]]:
        """Chain the MTP head k times from each sequence's last base state."""
        if not chosen:
            return []
        drafts = {seq: [] for seq, _ in chosen}
        hidden = {seq: seq.last_hidden[None] for seq, _ in chosen}
        last = {seq: seq.token_ids[-1] for seq, _ in chosen}
        stopped: set[Sequence] = set()
        p_min = self.config.mtp_p_min
        for depth in range(max(k for _, k in chosen)):
            active = [seq for seq, k in chosen if k > depth and seq not in stopped]
            if not active:
                break
            entries = [(seq, seq.num_tokens - 2 + depth, [last[seq]], hidden[seq]) for seq in active]
            prenorm, normed = self.runner.mtp_forward(entries)
            logits = self.runner.model.compute_logits(normed)
            guesses = logits.argmax(dim=-1).tolist()
            confident = (logits.float().softmax(-1).amax(-1) >= p_min).tolist() if p_min > 0 else None
            for i, seq in enumerate(active):
                if confident is not None and not confident[i]:
                    stopped.add(seq)  # the head is unsure: stop this chain here
                    continue
                drafts[seq].append(guesses[i])
                hidden[seq], last[seq] = prenorm[i:i + 1], guesses[i]
        return list(drafts.items())

    def _accept_verified(self, seq: Sequence, logits) -> StepDelta:
        """Keep the drafts the target agrees with, then its own next token; roll the rest back."""
        drafts = seq.token_ids[seq.num_tokens - seq.num_draft:]
        kept, bonus = verify(logits, seq, drafts, self.sampler.generator)
        self.spec.record_verification(len(drafts), kept)
        seq.num_drafted += len(drafts)
        seq.num_draft_accepted += kept
        self.policy.record_acceptance(len(drafts), kept)
        seq.drop_drafts()
        # K/V is valid up to the last kept draft; the rest of this step's positions are overwritten later.
        seq.num_computed_tokens = seq.num_tokens + kept
        return self._accept_many(seq, drafts[:kept] + [bonus])

    def _mtp_catch_up(self, plan, out, computed) -> None:
        """Write MTP cache entries for the positions this step made final, with the true base states,
        and keep each sequence's last base state for the next draft."""
        entries = []
        for (seq, _), start in zip(plan, out.starts):
            if seq.is_finished:
                continue
            first, n = computed[seq]
            n_real = min(n, seq.num_computed_tokens - first)  # kept positions of a verify step
            if n_real <= 0:
                continue
            t0 = first - 1 if seq.hidden_pos == first - 1 and first > 0 else first
            t1 = first + n_real - 2  # the last entry whose next token is already known
            if t1 >= t0:
                states = [out.hidden[start + (t - first)][None] if t >= first else seq.last_hidden[None]
                          for t in range(t0, t1 + 1)]
                entries.append((seq, t0, seq.token_ids[t0 + 1:t1 + 2], torch.cat(states)))
            seq.last_hidden = out.hidden[start + n_real - 1].clone()
            seq.hidden_pos = first + n_real - 1
        if entries:
            self.runner.mtp_forward(entries)

    def _accept(self, seq: Sequence, token: int, lp: TokenLogprob | None) -> StepDelta:
        return self._accept_many(seq, [token], [lp] if lp is not None else None)

    def _accept_many(self, seq: Sequence, tokens: list[int], logprobs=None) -> StepDelta:
        """Append tokens in order, stopping at the first that ends the request; one delta for all."""
        p = seq.params
        reason = None
        text = ""
        taken = []
        for token in tokens:
            seq.append(token)
            taken.append(token)
            if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
                reason = "stop"
                piece = seq.detokenizer.flush()
            else:
                piece = seq.detokenizer.add([token])
                if seq.num_tokens >= seq.max_total_tokens:
                    reason = "length"
                    piece += seq.detokenizer.flush()
            if seq.stop_matcher is not None:
                piece, stopped = seq.stop_matcher.feed(piece)
                if stopped:
                    reason = "stop"
                elif reason is not None:
                    piece += seq.stop_matcher.flush()
            text += piece
            if reason is not None:
                break
        if reason is not None:
            self._finish(seq)
            self.seqs.pop(seq.request_id, None)
        return self._delta(seq, taken, text, reason, logprobs)

    def _finish(self, seq: Sequence) -> None:
        """Free a finished, aborted or failed request's slot and blocks (the draft model's too)."""
        self.scheduler.finish(seq)
        if self.drafter is not None:
            self.drafter.release(seq)

    def _fail(self, seq: Sequence, message: str) -> StepDelta:
        self._finish(seq)
        self.seqs.pop(seq.request_id, None)
        delta = self._delta(seq, [], "", "error")
        delta.error = message
        return delta

    def _delta(self, seq, tokens, text, reason, logprobs=None) -> StepDelta:
        return StepDelta(seq.request_id, tokens, text, reason is not None, reason, None, logprobs,
                         seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_tokens,
                         seq.num_drafted, seq.num_draft_accepted)

    # -- introspection --------------------------------------------------------------------

    @property
    def spec_proposed(self) -> int:
        """Drafts verified since the engine started."""
        return self.spec.draft_tokens

    @property
    def spec_accepted(self) -> int:
        """Drafts the target kept since the engine started."""
        return self.spec.accepted_tokens

    def stats(self) -> EngineStats:
        """Running/waiting counts, KV usage, preemptions and speculative decoding counters."""
        s = self.scheduler
        extra = {"spec_draft_tokens": self.spec_proposed, "spec_accepted_tokens": self.spec_accepted}
        return EngineStats(len(s.running), len(s.waiting), self.block_manager.usage, s.num_preemptions,
                           self.block_manager.num_blocks, extra, self.spec.copy())

    def step_summary(self) -> str:
        """One line on how the steps ran: graph replays (mean rows) against eager forwards, and the
        seconds spent stepping (host and device), for logs at shutdown."""
        r = self.runner
        rows = r.graph_rows / r.graph_steps if r.graph_steps else 0.0
        return (f"{r.graph_steps + r.eager_steps} forwards: {r.graph_steps} graph replays (mean {rows:.1f} rows), "
                f"{r.eager_steps} eager; {self.busy_s:.1f} s in steps")

    def slots(self) -> list[SlotInfo]:
        """One entry per slot, with the request it serves if any."""
        by_slot = {seq.slot: seq for seq in self.scheduler.running}
        out = []
        for i in range(self.config.parallel):
            seq = by_slot.get(i)
            out.append(SlotInfo(i, "", seq is not None, seq.request_id if seq else None,
                                seq.num_prompt_tokens if seq else 0, seq.num_output_tokens if seq else 0))
        return out
