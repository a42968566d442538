"""Decides, at every step, which sequences run and how many tokens each computes.

Running decodes go first (one token each), then running prefills continue in chunks,
then waiting sequences are admitted while slots, blocks and the token budget allow: the
least-served user's first, in arrival order within a user (`fair_admission.py`; with one user
this is first in, first out), and running sequences take the budget in the same fair order.
When blocks run out, the most recently admitted sequence is preempted: its blocks are freed
and it goes back to the head of its user's line, to be recomputed.

The scheduler also owns every change to a sequence's state around a step (computed
tokens, appended tokens, rolled-back drafts, committed and freed blocks); the engine
never touches the block manager itself.
"""

from __future__ import annotations

from onebit.engine.block_manager import BlockManager
from onebit.engine.fair_admission import WaitingLine
from onebit.engine.prefill_budget import chunk_tokens, prefill_tokens
from onebit.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    """Owns the waiting queue, the running set (at most `parallel`) and their slots.

    mixed_step_tokens: None, or the cap on a step's tokens while any sequence decodes: prompt
    chunks then share what the decode rows leave (`prefill_budget`), so decode latency stays
    near a plain decode step's while long prompts prefill."""

    def __init__(self, blocks: BlockManager, parallel: int, max_batch_tokens: int, fair: bool = True,
                 priority_preempt: bool = False, mixed_step_tokens: int | None = None):
        self.blocks = blocks
        self.parallel = parallel
        self.max_batch_tokens = max(max_batch_tokens, parallel)
        self.mixed_step_tokens = mixed_step_tokens
        self.priority_preempt = priority_preempt
        self.waiting = WaitingLine(fair)
        self.running: list[Sequence] = []
        self.free_slots = list(range(parallel))
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """True while any sequence waits or runs."""
        return bool(self.waiting or self.running)

    @property
    def num_blocks(self) -> int:
        """Blocks in the KV pool."""
        return self.blocks.num_blocks

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV pool held by live sequences."""
        return self.blocks.usage

    def decoding(self) -> list[Sequence]:
        """Running sequences with exactly one token to compute (the ones that may draft)."""
        return [s for s in self.running if s.num_uncomputed == 1]

    def reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow seq's blocks to hold num_tokens (room for drafts) if the pool allows; True if it did."""
        if not self.blocks.can_grow(seq, num_tokens):
            return False
        self.blocks.grow(seq, num_tokens)
        return True

    @staticmethod
    def add_placeholders(sampled: list[tuple[Sequence, int]]) -> None:
        """Overlap: let each sequence that sampled at row `row` of a step still on the device and
        goes on compute that token's position in the next step; a placeholder stands for it.
        A token that ends the request for length is never fed (its position is never needed)."""
        for seq, row in sampled:
            if seq.is_finished or seq.num_uncomputed or seq.num_tokens + 1 >= seq.max_total_tokens:
                continue
            seq.add_placeholder(row)

    @staticmethod
    def mark_computed(plan: list[tuple[Sequence, int]]) -> dict[Sequence, tuple[int, int]]:
        """Advance each planned sequence past its step's tokens (the forward is queued);
        returns {seq: (computed before, computed in the step)}."""
        computed = {}
        for seq, n in plan:
            computed[seq] = (seq.num_computed_tokens, n)
            seq.num_computed_tokens += n
        return computed

    @staticmethod
    def append(seq: Sequence, token: int) -> None:
        """Add one generated token to seq."""
        seq.append(token)

    @staticmethod
    def roll_back_drafts(seq: Sequence, kept: int) -> None:
        """After a verification: drop seq's drafts; its K/V is valid up to the last kept one (the
        rest of the step's positions are overwritten later)."""
        seq.drop_drafts()
        seq.num_computed_tokens = seq.num_tokens + kept

    def commit(self, plan: list[tuple[Sequence, int]]) -> None:
        """Register for prefix caching the blocks this step filled, for the sequences that go on."""
        for seq, _ in plan:
            if not seq.is_finished:
                self.blocks.commit_full_blocks(seq)

    def _release_slot(self, seq: Sequence) -> None:
        if seq.slot is not None:
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
            seq.slot = None

    def _preempt(self, seq: Sequence) -> None:
        seq.drop_drafts()
        self.running.remove(seq)
        self.waiting.stopped(seq)
        self.blocks.free_sequence(seq)
        self._release_slot(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence from wherever it is and free its blocks."""
        seq.drop_drafts()
        if seq in self.running:
            self.running.remove(seq)
            self.waiting.stopped(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free_sequence(seq)
        self._release_slot(seq)
        seq.status = SequenceStatus.FINISHED

    def _preempt_for_priority(self) -> None:
        """With every slot taken, a waiting sequence preempts its user's running sequence of a
        larger priority value (the latest admitted of them), which goes back to wait."""
        if len(self.running) < self.parallel or not self.waiting:
            return
        head = self.waiting[0]
        victims = [s for s in self.running if s.user == head.user and s.priority > head.priority]
        if victims:
            self._preempt(victims[-1])

    def _fit(self, seq: Sequence, want: int) -> int:
        """How many of `want` new tokens seq can get blocks for right now."""
        held = len(seq.block_table) * self.blocks.block_size - seq.num_computed_tokens
        return min(want, held + self.blocks.num_free * self.blocks.block_size)

    def _prefill_left(self) -> int | None:
        """The step's prompt tokens under the mixed-step cap; None when uncapped (no cap set, or
        nothing decodes)."""
        if self.mixed_step_tokens is None:
            return None
        decode_rows = sum(s.num_uncomputed for s in self.running if s.num_uncomputed == 1 or s.num_draft)
        return prefill_tokens(self.mixed_step_tokens, decode_rows) if decode_rows else None

    @staticmethod
    def _chunk_cap(seq: Sequence, prefill_left: int | None) -> int:
        """At most how many tokens seq may compute under the mixed-step cap."""
        if prefill_left is None or seq.num_uncomputed <= 1 or seq.num_draft:
            return seq.num_uncomputed
        return chunk_tokens(prefill_left, seq.num_computed_tokens)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The step's plan: (sequence, number of tokens to compute) pairs, decodes first."""
        budget = self.max_batch_tokens
        prefill_left = self._prefill_left()
        plan: dict[Sequence, int] = {}
        if self.priority_preempt:
            self._preempt_for_priority()
        preemptions_before = self.num_preemptions
        for seq in self.waiting.fair_order(self.running):
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            want = min(seq.num_uncomputed, budget, self._chunk_cap(seq, prefill_left))
            if want <= 0:
                continue
            n = self._fit(seq, want)
            while n <= 0:
                victim = self.running[-1]
                budget += plan.pop(victim, 0)
                self._preempt(victim)
                if victim is seq:
                    break
                n = self._fit(seq, want)
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self.blocks.grow(seq, seq.num_computed_tokens + n)
            plan[seq] = n
            budget -= n
            if prefill_left is not None and n > 1 and not seq.num_draft:
                prefill_left -= n
        preempted = self.num_preemptions > preemptions_before
        # After a preemption the pool is short: admitting now would only thrash.
        while not preempted and self.waiting and len(self.running) < self.parallel and budget > 0:
            seq = self.waiting[0]
            self.blocks.match_prefix(seq)
            n = self._fit(seq, min(seq.num_uncomputed, budget, self._chunk_cap(seq, prefill_left)))
            if n <= 0:
                self.blocks.free_sequence(seq)
                break
            self.waiting.popleft()
            self.blocks.grow(seq, seq.num_computed_tokens + n)
            seq.status = SequenceStatus.RUNNING
            seq.slot = self.free_slots.pop(0)
            self.running.append(seq)
            self.waiting.started(seq)
            plan[seq] = n
            budget -= n
            if prefill_left is not None and n > 1:
                prefill_left -= n
        self.waiting.charge(plan.items())
        decodes = [(s, n) for s, n in plan.items() if n == 1]
        return decodes + [(s, n) for s, n in plan.items() if n > 1]
