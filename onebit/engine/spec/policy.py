"""When drafting pays: which requests may draft, how many tokens, and the measured policy."""

from __future__ import annotations

import statistics
from collections import deque

from onebit.engine.sequence import Sequence


def can_draft(seq: Sequence) -> bool:
    """Requests whose sampling depends on per-position state (penalties, bias, logprobs) never
    draft. A grammar's per-position masks and min_tokens' ban on end tokens are applied per row in
    verification (Speculator.verify)."""
    p = seq.params
    return not (p.has_penalties or p.logit_bias or p.logprobs is not None)


def draft_budget(seq: Sequence, k: int) -> int:
    """The step's k capped by the request's own draft_max and by the room left before its limit."""
    if not can_draft(seq):
        return 0
    if seq.params.draft_max is not None:
        k = min(k, seq.params.draft_max)
    return max(0, min(k, seq.max_total_tokens - seq.num_tokens - 1))


class DraftPolicy:
    """Decides per step how many tokens to draft (0 = a plain decode step), from measured step
    times and observed acceptance.

    Step times are kept per (draft length, batch-size bucket); the chosen k maximises expected
    tokens per second of the whole batch: (1 + a + a^2 + ... + a^k) / time(k). A pair's first
    step is a warm-up and not kept (on a GPU it may compile kernels or capture a graph for the new
    shape: seconds, which would rule that k out for good), so a pair is tried until it has one kept
    time. An estimate is the median of the pair's last few times, so a one-off stall (or the last
    step of a batch, timed without a launch after it) moves nothing. Every `explore_every` steps
    the pair of the batch's bucket measured longest ago is re-measured, so the estimates follow
    the machine and the load. With `always`, every step drafts k_max.

    With overlapped steps a drafting step also makes the plain step after it start cold: that
    step's host preparation no longer hides behind the GPU. Plain steps report their preparation
    time (`prep`), and drafting is charged it; a cold plain step's own wall time spans the next
    step's launch too, so it is not folded into the step times.
    """

    SAMPLES = 5  # step times per estimate

    def __init__(self, k_max: int, explore_every: int = 64, always: bool = False):
        self.k_max = k_max
        self.always = always  # draft k_max whenever possible, measured or not
        self.explore_every = explore_every
        self.times: dict[tuple[int, int], float] = {}  # (k, bucket) -> estimated step seconds
        self.warmed: set[tuple[int, int]] = set()  # pairs whose warm-up step has run
        self.measured_at: dict[tuple[int, int], int] = {}  # pair -> self.steps when last folded
        self.prep: dict[int, float] = {}  # bucket -> host time to prepare a plain step (overlap only)
        self._recent: dict[tuple[str, object], deque] = {}  # ("time" or "prep", key) -> last few values
        self.acceptance = 0.6  # prior until the first verification
        self.steps = 0

    @staticmethod
    def bucket(batch: int) -> int:
        """Power-of-two bucket of a batch size."""
        return 1 << max(batch - 1, 0).bit_length()

    def expected_tokens(self, k: int) -> float:
        """Expected tokens per sequence per step with k drafts at the current acceptance."""
        a = min(max(self.acceptance, 0.0), 0.999)
        return 1.0 + sum(a ** i for i in range(1, k + 1))

    def choose(self, batch: int, drafting: int | None = None) -> int:
        """The draft length for this step's batch of `batch` decodes of which `drafting` (all when
        None) may draft (0: plain step). The rest decode one token whatever k is."""
        self.steps += 1
        if self.always:
            return self.k_max
        b = self.bucket(batch)
        for k in range(self.k_max, -1, -1):
            if (k, b) not in self.times:
                return k
        drafting = batch if drafting is None else drafting
        restart = self.prep.get(b, 0.0)
        ranked = sorted(range(self.k_max + 1),
                        key=lambda k: -(batch - drafting + drafting * self.expected_tokens(k))
                        / (self.times[(k, b)] + (restart if k else 0.0)))
        if self.steps % self.explore_every == 0:
            return min(ranked[1:], key=lambda k: self.measured_at.get((k, b), 0))
        return ranked[0]

    def record_step(self, batch: int, k: int, seconds: float, cold: bool = False, prep: float | None = None) -> None:
        """Fold a measured step time into its (k, bucket) estimate (after the pair's warm-up step).
        With overlap on, a plain step also gives `prep`, its host preparation time, and `cold`
        says it started with nothing in flight (its time is then not a step's cost)."""
        b = self.bucket(batch)
        if prep is not None and not k:
            self._fold("prep", self.prep, b, prep)
        if cold and not k:
            return
        if (k, b) not in self.warmed:
            self.warmed.add((k, b))
            return
        self._fold("time", self.times, (k, b), seconds)
        self.measured_at[(k, b)] = self.steps

    def _fold(self, kind: str, table: dict, key, value: float) -> None:
        """Set table[key] to the median of its last SAMPLES values."""
        recent = self._recent.setdefault((kind, key), deque(maxlen=self.SAMPLES))
        recent.append(value)
        table[key] = statistics.median(recent)

    def record_acceptance(self, proposed: int, accepted: int) -> None:
        """Fold one verification into the estimate of the chance that a draft is kept given the
        ones before it were (each kept draft is a success; the first rejected one a failure)."""
        if proposed:
            attempts = accepted + (1 if accepted < proposed else 0)
            self.acceptance = 0.9 * self.acceptance + 0.1 * (accepted / attempts)
