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
    the machine and the load; a pair last measured more than `explore_every` steps ago starts its
    window anew. A re-measurement runs `PROBE_STEPS` steps in a row: from drafting, the first
    plain step starts cold and the last is done with no launch behind it, so only the middle one
    is a steady time (with one plain step, the plain estimate froze while drafting went on). Steps
    that carry a prompt chunk are kept only where no decode-only time is known, so that
    estimates compare like with like.
    With `always`, every step drafts k_max.

    Rates are compared in the steady state of each choice: a drafting step's time runs from the
    moment the step before it was done, so it holds its own host work that overlap would have
    hidden, and a run of drafting steps pays nothing more. The plain step after a drafting one
    starts cold (its preparation exposed once per switch, not per drafting step), and the one
    before it is done with no launch behind it: neither time is a steady plain step's, so neither
    is kept. That switch cost is why plain steps give way to drafting only when drafting wins by
    `ENTER_MARGIN`: near a tie, alternating paid it every other step (G14, session 9: 0.89x of
    `--parallel 64` at 64 requests, a third of the steps drafting). (Charging every
    drafting step that restart, as session 8's policy did, ruled drafting out at one request: 186 tok/s where
    drafting made 486, and on the CPU, where a step is all host work, 68 tok/s against 109.)
    """

    SAMPLES = 5  # step times per estimate
    ENTER_MARGIN = 0.10  # after a plain step, drafting must be this much faster to be chosen
    PROBE_STEPS = 3  # steps in a row that re-measure a pair (from drafting, plain keeps only one)

    def __init__(self, k_max: int, explore_every: int = 64, always: bool = False):
        self.k_max = k_max
        self.always = always  # draft k_max whenever possible, measured or not
        self.explore_every = explore_every
        self.times: dict[tuple[int, int], float] = {}  # (k, bucket) -> estimated step seconds
        self.warmed: set[tuple[int, int]] = set()  # pairs whose warm-up step has run
        self.measured_at: dict[tuple[int, int], int] = {}  # pair -> self.steps when last folded
        # pair -> its last few kept (step time, mixed) pairs: all mixed or none (see record_step)
        self._recent: dict[tuple[int, int], deque] = {}
        self.acceptance = 0.6  # prior until the first verification
        self.steps = 0
        self.last_k = 0  # the previous step's choice
        self._probe: tuple[int, int, int] = (0, 0, 0)  # (k, steps left, bucket) of a re-measurement

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
        self.last_k = self._choose(batch, batch if drafting is None else drafting)
        return self.last_k

    def _choose(self, batch: int, drafting: int) -> int:
        b = self.bucket(batch)
        k, left, probed = self._probe
        if left and probed == b:  # (a batch that changed bucket ends the re-measurement)
            self._probe = (k, left - 1, b)
            return k
        self._probe = (0, 0, 0)
        for k in range(self.k_max, -1, -1):
            if (k, b) not in self.times:
                return k
        rate = {k: (batch - drafting + drafting * self.expected_tokens(k)) / self.times[(k, b)]
                for k in range(self.k_max + 1)}
        ranked = sorted(rate, key=lambda k: -rate[k])
        if self.steps % self.explore_every == 0:
            k = min(ranked[1:], key=lambda k: self.measured_at.get((k, b), 0))
            self._probe = (k, self.PROBE_STEPS - 1, b)
            return k
        if ranked[0] and not self.last_k and rate[ranked[0]] < (1 + self.ENTER_MARGIN) * rate[0]:
            return 0
        return ranked[0]

    def record_step(self, batch: int, k: int, seconds: float, steady: bool = True, mixed: bool = False) -> None:
        """Fold a measured step time into its (k, bucket) estimate (after the pair's warm-up step).
        `steady` False: a plain step whose time is not a steady plain step's cost (with overlap on,
        one launched with nothing in flight, or one done with no launch after it); not kept.
        `mixed`: a prompt chunk rode along, costing both choices alike; kept only while the pair
        has no decode-only time (a level's start is all such steps), and the pair's first
        decode-only time then replaces them all: a plain pair re-measured one step at a time while
        drafting goes on must not stand on a turnover step's time (G14, session 10: 8 drafting rows
        of 64 streams kept drafting at 0.86x of plain)."""
        b = self.bucket(batch)
        if not (steady or k):
            return
        if (k, b) not in self.warmed:
            self.warmed.add((k, b))
            return
        pair = (k, b)
        recent = self._recent.setdefault(pair, deque(maxlen=self.SAMPLES))
        mixed_only = bool(recent) and recent[-1][1]
        if mixed and recent and not mixed_only:
            return  # a window of decode-only times, stale or not, is the better estimate
        if self.steps - self.measured_at.get(pair, self.steps) > self.explore_every or (not mixed and mixed_only):
            recent.clear()  # stale (the load or the machine may have changed since), or mixed times only
        recent.append((seconds, mixed))
        self.times[pair] = statistics.median(t for t, _ in recent)
        self.measured_at[pair] = self.steps

    def record_acceptance(self, proposed: int, accepted: int) -> None:
        """Fold one verification into the estimate of the chance that a draft is kept given the
        ones before it were (each kept draft is a success; the first rejected one a failure)."""
        if proposed:
            attempts = accepted + (1 if accepted < proposed else 0)
            self.acceptance = 0.9 * self.acceptance + 0.1 * (accepted / attempts)
