"""What the engine talks to for speculative decoding: propose before a step, verify after it."""

from __future__ import annotations

import logging
import time

import torch

from onebit.engine.outputs import SpecStats
from onebit.engine.sequence import Sequence
from onebit.engine.spec.drafter import Drafter
from onebit.engine.spec.policy import DraftPolicy, draft_budget
from onebit.engine.spec.verify import verify
from onebit.engine.transfer import upload

log = logging.getLogger("onebit.engine")


class Speculator:
    """Runs one drafter under the draft policy and keeps the counters; without a drafter every
    step is a plain one (the counters still count decode steps)."""

    def __init__(self, drafter: Drafter | None, draft_max: int = 3, always: bool = False,
                 generator: torch.Generator | None = None, max_running: int | None = None,
                 eos_token_ids: set[int] = frozenset()):
        self.drafter = drafter
        self.eos_token_ids = set(eos_token_ids)  # banned in rows before a request's min_tokens
        self.max_running = max_running  # above this many running requests: plain steps only
        self.policy = DraftPolicy(draft_max, always=always) if drafter is not None else None
        self.stats = SpecStats()
        self.generator = generator  # for unseeded sampled requests' verification
        self.step_k = 0
        self.faults = None  # the engine's test-only FaultInjector, if any
        self.failed: list[Sequence] = []  # sequences whose drafting failed in the last propose()
        self.masker = None  # a GrammarMasker for constrained requests' verification

    def _draft(self, chosen: list[tuple[Sequence, int]]) -> list[tuple[Sequence, list[int]]]:
        """The drafter's proposals; when the batch fails, each sequence alone, and the ones that
        still fail go to `self.failed` (the engine fails those requests only)."""
        def propose(batch):
            if self.faults is not None:
                for seq, _ in batch:
                    self.faults.check("drafter", seq)
            return list(self.drafter.propose(batch))

        try:
            return propose(chosen)
        except Exception:
            log.exception("drafting failed; drafting each request alone")
        out = []
        for seq, k in chosen:
            try:
                out += propose([(seq, k)])
            except Exception:
                log.exception("request %s failed in the drafter", seq.request_id)
                self.failed.append(seq)
        return out

    def _eligible(self, scheduler, in_flight=()) -> tuple[list[Sequence], list[Sequence]]:
        """(running decodes, those of them that may draft); `in_flight`: the (sequence, row) pairs
        of a step whose tokens are still on the device (decodes of the coming step too). A request
        that can never draft (logprobs, penalties, logit bias, draft_max 0) is not one that may:
        else a batch of only such requests would have the policy choose drafting steps that draft
        nothing, and with overlap each of them waits for the tokens before it for nothing."""
        decoding = scheduler.decoding()
        if in_flight:
            awaiting = {seq for seq, _ in in_flight}
            decoding += [seq for seq in scheduler.running if seq in awaiting and seq.num_uncomputed == 0]
        primary = self.primary(scheduler.running) if self.max_running is not None else None
        return decoding, [seq for seq in decoding if (primary is None or seq in primary) and draft_budget(seq, 1)]

    def decide(self, scheduler, in_flight=()) -> int:
        """The policy's draft length for the coming step (0: a plain step), asked once per step
        before it is scheduled: a drafting step needs the previous step's tokens on the host, so
        the engine gives up overlap for it. `propose` then drafts with this k. `in_flight`: the
        (sequence, row) pairs of the step still on the device (`LaunchedStep.plain`), if any."""
        self.step_k = 0
        if self.policy is None:
            return 0
        decoding, eligible = self._eligible(scheduler, in_flight)
        self.step_k = self.policy.choose(len(decoding), drafting=len(eligible)) if eligible else 0
        return self.step_k

    def propose(self, scheduler) -> tuple[list[Sequence], bool]:
        """Append drafts (of the length `decide` chose) to running decodes, with blocks reserved
        through the scheduler. Returns the drafting sequences and whether any sequence was chosen
        to draft (the MTP head then wants this step's states)."""
        self.failed = []
        if not self.step_k:
            return [], False
        _, eligible = self._eligible(scheduler)
        chosen = []
        for seq in eligible:
            k = draft_budget(seq, self.step_k)
            if k and scheduler.reserve(seq, seq.num_tokens + k):
                chosen.append((seq, k))
        drafting = []
        for seq, drafts in self._draft(chosen):
            if drafts:
                seq.token_ids.extend(drafts)
                seq.num_draft = len(drafts)
                drafting.append(seq)
            elif self.policy is not None:
                # Nothing to offer (an n-gram drafter without a match) yields one token, as a first
                # draft rejected would: counted so, the policy stops choosing steps that draft
                # nothing and cost their overlap. (The MTP head leaves out rows whose states are
                # stale, which are not misses.)
                self.policy.record_acceptance(1, 0)
        return drafting, bool(chosen)

    def primary(self, running: list[Sequence]) -> set[Sequence]:
        """The running requests that may draft: all of them, or under a load limit (`--adaptive` on
        one device) the first `max_running` in running order, the primary's share. Above the limit
        the rest take plain rows beside them, as an overflow backend would serve them, instead of
        every request losing its drafts at once (that dipped at 12-16 requests on the H200)."""
        if self.max_running is None:
            return set(running)
        return set(running[:self.max_running])

    def regime(self, seq: Sequence | None, running: list[Sequence]) -> str | None:
        """"speculative" for a request in the primary's share, "batch" for one beyond it (seq None:
        a request that would start now); None when no load limit is set (a plain engine, or a
        drafter the policy alone decides for)."""
        if self.max_running is None:
            return None
        if seq is None:
            primary = len(running) < self.max_running
        else:
            primary = seq in self.primary(running)
        return "speculative" if self.drafter is not None and primary else "batch"

    def needs_hidden(self, plan, chose: bool) -> bool:
        """Whether this step's forward must keep the base model's states for the drafter."""
        return self.drafter is not None and self.drafter.needs_hidden(plan, chose)

    @staticmethod
    def trim(drafting: list[Sequence], plan: list[tuple[Sequence, int]]) -> None:
        """Drop the drafts the plan did not fit, so no step carries stale ones."""
        scheduled = dict(plan)
        for seq in drafting:
            seq.drop_drafts(max(scheduled.get(seq, 0) - 1, 0))

    def verify(self, seq: Sequence, logits: torch.Tensor) -> tuple[list[int], int]:
        """Check seq's drafts against its logits rows and count; returns (the tokens to append:
        the kept drafts, then the target's own next token; how many drafts were kept)."""
        drafts = seq.token_ids[seq.num_tokens - seq.num_draft:]
        logits = self._ban_early_ends(seq, logits, len(drafts))
        if seq.grammar is not None:  # drafts the grammar rejects are rejected; every row is masked
            logits, valid = self._grammar_masker(logits).mask_drafts(logits.float(), seq.grammar, drafts)
            kept, bonus = verify(logits, seq, drafts[:valid], self.generator)
        else:
            kept, bonus = verify(logits, seq, drafts, self.generator)
        self.stats.record_verification(len(drafts), kept)
        seq.spec.drafted += len(drafts)
        seq.spec.accepted += kept
        self.policy.record_acceptance(len(drafts), kept)
        return drafts[:kept] + [bonus], kept

    def _ban_early_ends(self, seq: Sequence, logits: torch.Tensor, num_drafts: int) -> torch.Tensor:
        """The verification rows with end tokens banned in each row whose position comes before
        the request's min_tokens (row j follows the j-th draft), as plain sampling bans them."""
        early = seq.params.min_tokens - (seq.num_output_tokens - num_drafts)
        if early <= 0:
            return logits
        ends = [t for t in self.eos_token_ids | set(seq.params.stop_token_ids) if 0 <= t < logits.shape[-1]]
        if not ends:
            return logits
        logits = logits.clone()
        rows = min(early, logits.shape[0])
        logits[:rows].index_fill_(1, upload(ends, torch.long, logits.device), float("-inf"))
        return logits

    def _grammar_masker(self, logits: torch.Tensor):
        """The GrammarMasker for verification rows, made at the first constrained verification."""
        if self.masker is None:
            from onebit.engine.grammar import GrammarMasker  # the grammar library loads only when used
            self.masker = GrammarMasker(logits.shape[-1], logits.device)
        return self.masker

    def observe(self, plan, out, computed, decodes: int, k: int, verified: bool, started: float,
                steady: bool = True, mixed: bool = False) -> None:
        """After a step's tokens are final: let the drafter learn from it, count it, and time it
        (`k`: the draft length chosen for it, 0 for a plain step, whether or not drafts came;
        `steady`, `mixed`: see DraftPolicy.record_step)."""
        if self.drafter is not None:
            self.drafter.observe(plan, out, computed)
        if decodes:
            self.stats.record_step(verified)
            if self.policy is not None:
                self.policy.record_step(decodes, k, time.perf_counter() - started, steady, mixed)

    def release(self, seq: Sequence) -> None:
        """Forget a finished, aborted or failed request."""
        if self.drafter is not None:
            self.drafter.release(seq)
