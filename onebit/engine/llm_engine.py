"""The engine: requests in, per-step deltas out. Single-threaded; the caller drives `step()`.

One step is schedule -> run -> sample -> update: the speculator may append drafts and the
scheduler picks (sequence, tokens) pairs; the runner forwards them as one packed batch; the
sampler queues one token per sampling row; then the scheduler applies the tokens to the
sequences and the output processor turns them into text, stop decisions and deltas.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from onebit.engine.config import EngineConfig
from onebit.engine.fault_injection import FaultInjector
from onebit.engine.outputs import EngineStats, SlotInfo, StepDelta, TokenLogprob
from onebit.engine.parts import EngineParts, LaunchedStep
from onebit.engine.pooling import Pooler
from onebit.engine.sampler import SampledBatch
from onebit.engine.sampling_params import SamplingParams
from onebit.engine.sequence import Sequence
from onebit.engine.transfer import upload
from onebit.kernels import compile_watch
from onebit.protocol.types import Resumed
from onebit.protocol.validate import check_request

log = logging.getLogger("onebit.engine")
SLOW_STEP_S = 0.25  # a step() call longer than this is logged (LLMEngine.slow_step_s)


class LLMEngine:
    """Decodes many requests together over a paged KV cache (build one with `build_engine`).

    add_request / abort may be called between steps; each `step()` runs one batched
    forward and returns the deltas it produced (including final ones for aborts).
    """

    def __init__(self, config: EngineConfig, parts: EngineParts):
        self.config = config
        self.model_path, self.device, self.dtype = parts.model_path, parts.device, parts.dtype
        self.tokenizer, self.model_config = parts.tokenizer, parts.model_config
        self.eos_token_ids, self.ctx_size = parts.eos_token_ids, parts.ctx_size
        self.kv_bytes_per_block = parts.kv_bytes_per_block
        self.scheduler, self.runner, self.sampler = parts.scheduler, parts.runner, parts.sampler
        self.speculator, self.outputs = parts.speculator, parts.outputs
        # Overlap: a launched step whose tokens are still on their way to the host (see step()).
        self.overlap = parts.overlap
        self.busy_s = 0.0  # wall time inside step() that ran a forward
        # The same time by what the call launched ("graph decode", "graph with prompt", "eager"):
        # [calls, seconds, seconds until the launch was queued]. With overlap a call also waits
        # for the step before it; the part after the launch is that wait and the host's work on
        # the previous step's tokens.
        self.busy_by_kind: dict[str, list] = {}
        compile_watch.install()
        # A step longer than this is logged with what it ran (a compile or a stall shows up in a
        # request's TTFT; G14, session 10, saw one of ~500 ms that nothing recorded). Tests set 0.
        self.slow_step_s = SLOW_STEP_S
        self.slow_steps = 0
        self.slow_log_every_s = 10.0  # at most one such line this often (a big model on a CPU is slow every step)
        self._slow_logged = (float("-inf"), 0)  # (when the last line went out, slow steps counted then)
        self.seqs: dict[str, Sequence] = {}
        self._pending: list[StepDelta] = []
        self._inflight: LaunchedStep | None = None
        self._clock = 0.0  # when the last step was done (the start of the next one's cost)
        self._arrivals = itertools.count()
        self.faults = FaultInjector.from_env()  # None unless a test asks for faults
        self.speculator.faults = self.faults
        self.grammar_compiler = None  # see _grammars()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "LLMEngine":
        """Shorthand for `onebit.engine.build.build_engine(config)`."""
        from onebit.engine.build import build_engine
        return build_engine(config)

    # -- requests -------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    *, user: str = "anonymous", priority: int = 0, resumed: Resumed | None = None) -> None:
        """Queue a request of `user` (lower `priority` first among that user's); raise InvalidRequest
        (ContextOverflow for a prompt too long) for bad input.

        `resumed`: the request continues one another backend started (see `Resumed`); the
        text state is rebuilt from the prompt's generated tail before its first new token."""
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        check_request(prompt_token_ids, params, self.model_config.vocab_size, self.ctx_size)
        n = len(prompt_token_ids)
        limit = self.ctx_size if params.max_tokens is None else min(self.ctx_size, n + params.max_tokens)
        seq = Sequence(request_id, prompt_token_ids, params, limit, next(self._arrivals), user, priority)
        if params.seed is not None:
            seq.generator = self.sampler.make_generator(params.seed)
        if params.grammar is not None:
            seq.grammar = self._grammars().start(params.grammar)
        if params.pooling is not None:
            seq.pooler = Pooler(params.pooling, n)
        self.outputs.start(seq, resumed)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def _grammars(self):
        """The GrammarCompiler, made at the first constrained request (it reads the whole vocabulary;
        the grammar library loads only when used)."""
        if self.grammar_compiler is None:
            from onebit.engine.grammar import GrammarCompiler
            self.grammar_compiler = GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        return self.grammar_compiler

    def abort(self, request_id: str) -> None:
        """Stop a request in any state; its final delta comes from the next step. Unknown ids are ignored."""
        seq = self.seqs.get(request_id)
        if seq is not None:
            self._finish(seq)
            self._pending.append(self.outputs.delta(seq, [], "", "abort"))

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
        # graph replays, eager forwards and Triton compiles so far (what this call adds, for the logs)
        counts = (self.runner.graph_steps, self.runner.eager_steps, compile_watch.compiled)
        previous, self._inflight = self._inflight, None
        if previous is None:  # nothing in flight: this step's time counts from now, not from an idle gap
            self._clock = max(self._clock, started)
        worked = previous is not None
        drafts = self.speculator.decide(self.scheduler, previous.plain if previous is not None else ())
        if previous is not None and (drafts or not previous.can_feed()):
            # drafts are made from the tokens the last step chose
            deltas += self._update(previous, followed=False)
            previous = None
        launched = self._launch(previous, deltas)  # schedule -> run -> sample (queued on the device)
        launch_s = time.perf_counter() - started
        if previous is not None:
            deltas += self._update(previous, followed=launched is not None)
        if launched is not None:
            worked = True
            if self.overlap and not launched.drafting:
                self._inflight = launched
            else:
                deltas += self._update(launched)
        if worked:
            elapsed = time.perf_counter() - started
            self.busy_s += elapsed
            kind = self._step_kind(launched, counts)
            entry = self.busy_by_kind.setdefault(kind, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += elapsed
            entry[2] += launch_s
            if elapsed > self.slow_step_s:
                self._log_slow_step(elapsed, launched, counts)
        return deltas

    def _step_kind(self, launched: LaunchedStep | None, counts: tuple[int, int, int]) -> str:
        """What a step() call launched, for `busy_by_kind`."""
        if launched is None:
            return "nothing launched"
        if self.runner.eager_steps > counts[1]:
            return "eager"
        return "graph with prompt" if launched.mixed else "graph decode"

    def _log_slow_step(self, elapsed: float, launched: LaunchedStep | None, counts: tuple[int, int, int]) -> None:
        """One warning line for a step over `slow_step_s`: what this call launched, how it ran and
        which Triton kernel variants it compiled."""
        self.slow_steps += 1
        now = time.monotonic()
        last, counted = self._slow_logged
        if now - last < self.slow_log_every_s:
            return
        self._slow_logged = (now, self.slow_steps)
        unlogged = self.slow_steps - counted - 1
        graphs = self.runner.graph_steps - counts[0]
        eager = self.runner.eager_steps - counts[1]
        if launched is None:
            what = "nothing launched"
        else:
            what = (f"{len(launched.plan)} sequences, {launched.decodes} decoding, "
                    f"{sum(n for _, n in launched.plan)} tokens{' with a prompt chunk' if launched.mixed else ''}, "
                    f"draft length {launched.k}")
        compiled = compile_watch.since(counts[2])
        log.warning("slow step: %.0f ms (%s; %d graph replays, %d eager forwards in this call; "
                    "%d Triton kernel variants compiled%s)%s",
                    elapsed * 1e3, what, graphs, eager, compile_watch.compiled - counts[2],
                    f": {'; '.join(compiled)}" if compiled else "",
                    f"; {unlogged} more slow steps since the last line" if unlogged > 0 else "")

    def _schedule(self, previous: LaunchedStep | None, deltas: list[StepDelta]):
        """Drafts (the speculator), placeholders for `previous`'s tokens (overlap), then the plan.
        Returns (plan, drafting sequences, whether any sequence was chosen to draft). A request
        whose drafting failed is failed here (its error delta goes to `deltas`), the others go on."""
        drafting, chose = self.speculator.propose(self.scheduler)
        for seq in self.speculator.failed:
            deltas.append(self._fail(seq, "internal error while drafting"))
        if previous is not None:
            self.scheduler.add_placeholders(previous.plain)
        plan = self.scheduler.schedule()
        self.speculator.trim(drafting, plan)
        return plan, drafting, chose

    def _launch(self, previous: LaunchedStep | None, deltas: list[StepDelta]) -> LaunchedStep | None:
        """Schedule, forward and queue the sampling of one step; None when nothing runs (or it
        failed, whose deltas go to `deltas`)."""
        plan, drafting, chose = self._schedule(previous, deltas)
        if not plan:
            return None
        decodes = sum(1 for seq, _ in plan if seq.num_computed_tokens > 0)
        try:
            fed = previous.sampled.tokens if previous is not None else None
            pooling = [(i, seq, n) for i, (seq, n) in enumerate(plan) if seq.pooler is not None]
            want_hidden = self.speculator.needs_hidden(plan, chose) or bool(pooling)
            out = self.runner.run(plan, want_hidden=want_hidden, fed_tokens=fed)
            for i, seq, n in pooling:  # before mark_computed: num_computed_tokens is the chunk's first position
                states = out.hidden[out.starts[i]:out.starts[i] + n]
                seq.pooler.add(seq.num_computed_tokens, self.runner.final_norm(states))
        except Exception as exc:  # a failed forward fails the step's requests, not the engine
            log.exception("step failed")
            deltas += [self._fail(seq, f"internal error during the forward pass: {exc}") for seq, _ in plan]
            return None
        plain = [(seq, row) for seq, row, count in out.rows if not seq.num_draft]
        sampled = None
        if plain:
            try:
                sampled = self._sample(out.logits, plain)
            except Exception:  # whose fault? sample each alone, fail only those that fail, then the rest again
                plain = self._without_failing(out.logits, plain, deltas)
                try:
                    sampled = self._sample(out.logits, plain) if plain else None
                except Exception as exc:  # each row samples alone but not together: fail them all
                    log.exception("step failed")
                    deltas += [self._fail(seq, f"internal error during sampling: {exc}") for seq, _ in plain]
                    plain, sampled = [], None
        # From here a row is the row of `sampled`'s tokens that the next step feeds from: the same
        # as the logits row unless drafting rows or a request failed in the sampler left gaps.
        plain = [(seq, i) for i, (seq, _) in enumerate(plain)]
        mixed = any(n > 1 + seq.num_draft for seq, n in plan)
        computed = self.scheduler.mark_computed(plan)
        return LaunchedStep(plan, out, plain, sampled, computed, decodes, drafting,
                            cold=self.overlap and previous is None,
                            k=self.speculator.step_k if chose else 0, mixed=mixed)

    def _without_failing(self, logits: torch.Tensor, plain: list[tuple[Sequence, int]],
                         deltas: list[StepDelta]) -> list[tuple[Sequence, int]]:
        """After a batch failed to sample: try each row alone; fail the requests whose row fails
        (their error delta goes to `deltas`) and return the others. A seeded request's generator
        may have moved in the failed attempt; greedy requests are unaffected."""
        kept = []
        for seq, row in plain:
            try:
                self._sample(logits, [(seq, row)]).resolve()
            except Exception as exc:
                log.exception("request %s failed in the sampler", seq.request_id)
                deltas.append(self._fail(seq, f"internal error during sampling: {exc}"))
            else:
                kept.append((seq, row))
        return kept

    def _sample(self, logits: torch.Tensor, plain: list[tuple[Sequence, int]]) -> SampledBatch:
        """Sample one token for each (sequence, logits row); the common all-rows case needs no gather,
        which on a 152k vocabulary is a copy of the whole logits tensor per step."""
        if self.faults is not None:
            for seq, _ in plain:
                self.faults.check("sampler", seq)
        rows = [row for _, row in plain]
        if rows != list(range(logits.shape[0])):
            logits = logits[upload(rows, torch.long, logits.device)]
        return self.sampler.sample(logits, [seq for seq, _ in plain])

    def _update(self, step: LaunchedStep, followed: bool = True) -> list[StepDelta]:
        """Wait for a launched step's tokens and apply them: append, verify drafts, finish, commit.
        `followed` False: with overlap on, no step was launched behind it (its time is short)."""
        try:
            tokens, logprobs = step.sampled.resolve() if step.sampled is not None else ([], [])
        except Exception as exc:
            log.exception("step failed")
            return [self._fail(seq, f"internal error during sampling: {exc}") for seq, _ in step.plan
                    if not seq.is_finished]
        deltas = []
        for (seq, _), token, lp in zip(step.plain, tokens, logprobs):
            if not seq.is_finished:  # else aborted meanwhile, or (overlap) a row run after its last token
                deltas.append(self._guarded(seq, self._append, seq, [token], [lp] if lp is not None else None))
        verified = False
        for seq, row, count in step.out.rows:
            if seq.num_draft:
                verified = True
                deltas.append(self._guarded(seq, self._verify, seq, step.out.logits[row:row + count]))
        self.scheduler.commit(step.plan)
        # A step's cost is the wall time since the step before it was done (or since the call
        # that launched it with nothing in flight): with overlap a plain step costs about one GPU
        # step, a drafting step also its exposed host work, so the policy weighs drafting against
        # overlapped plain steps at their true price. A plain step launched cold or done with no
        # launch behind it is no steady step.
        self.speculator.observe(step.plan, step.out, step.computed, step.decodes, step.k, verified,
                                self._clock, steady=not step.cold and followed, mixed=step.mixed)
        self._clock = time.perf_counter()
        return deltas

    def _verify(self, seq: Sequence, logits: torch.Tensor) -> StepDelta:
        """Keep the drafts the target agrees with, then its own next token; roll the rest back."""
        tokens, kept = self.speculator.verify(seq, logits)
        self.scheduler.roll_back_drafts(seq, kept)
        return self._append(seq, tokens)

    def _append(self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> StepDelta:
        """Append tokens in order, stopping at the first that ends the request; one delta for all."""
        taken, text, reason = [], "", None
        if self.faults is not None:
            self.faults.check("detokenizer", seq)
        for token in tokens:
            self.scheduler.append(seq, token)
            if seq.grammar is not None:
                seq.grammar.accept(token)  # GrammarFailed fails this request only (see _guarded)
            taken.append(token)
            piece, reason = self.outputs.process(seq, token)
            text += piece
            if reason is not None:
                break
        if reason is not None:
            self._finish(seq)
        delta = self.outputs.delta(seq, taken, text, reason, logprobs)
        if reason is not None and seq.pooler is not None:
            delta.embedding = seq.pooler.result()
        return delta

    def _guarded(self, seq: Sequence, update, *args) -> StepDelta:
        """`update(*args)`, failing only this request if it raises."""
        try:
            return update(*args)
        except Exception as exc:
            log.exception("request %s failed", seq.request_id)
            return self._fail(seq, f"internal error: {exc}")

    def _finish(self, seq: Sequence) -> None:
        """Forget a finished, aborted or failed request and free its slot and blocks (the drafter's too)."""
        self.scheduler.finish(seq)
        self.speculator.release(seq)
        if self.seqs.get(seq.request_id) is seq:
            del self.seqs[seq.request_id]

    def _fail(self, seq: Sequence, message: str) -> StepDelta:
        self._finish(seq)
        return self.outputs.delta(seq, [], "", "error", error=message)

    # -- introspection --------------------------------------------------------------------

    @property
    def spec_proposed(self) -> int:
        """Drafts verified since the engine started."""
        return self.speculator.stats.draft_tokens

    @property
    def spec_accepted(self) -> int:
        """Drafts the target kept since the engine started."""
        return self.speculator.stats.accepted_tokens

    def stats(self) -> EngineStats:
        """Running/waiting counts, KV usage, preemptions and speculative decoding counters."""
        s = self.scheduler
        extra = {"spec_draft_tokens": self.spec_proposed, "spec_accepted_tokens": self.spec_accepted}
        return EngineStats(len(s.running), len(s.waiting), s.kv_usage, s.num_preemptions, s.num_blocks, extra,
                           self.speculator.stats.copy())

    def step_summary(self) -> str:
        """One line on how the steps ran: graph replays (mean rows) against eager forwards, and the
        seconds spent stepping (host and device), for logs at shutdown."""
        r = self.runner
        rows = r.graph_rows / r.graph_steps if r.graph_steps else 0.0
        kinds = ", ".join(f"{kind} {n} x {s / n * 1e3:.2f} ms ({launch / n * 1e3:.2f} to launch)"
                          for kind, (n, s, launch) in sorted(self.busy_by_kind.items()))
        return (f"{r.graph_steps + r.eager_steps} forwards: {r.graph_steps} graph replays (mean {rows:.1f} rows), "
                f"{r.eager_steps} eager; {self.busy_s:.1f} s in steps ({kinds})")

    def slots(self) -> list[SlotInfo]:
        """One entry per slot, with the request it serves if any."""
        running = self.scheduler.running
        by_slot = {seq.slot: seq for seq in running}
        idle_regime = self.speculator.regime(None, running)
        out = []
        for i in range(self.config.parallel):
            seq = by_slot.get(i)
            out.append(SlotInfo(i, "", seq is not None, seq.request_id if seq else None,
                                seq.num_prompt_tokens if seq else 0, seq.num_output_tokens if seq else 0,
                                self.speculator.regime(seq, running) if seq else idle_regime))
        return out
