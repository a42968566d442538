"""When drafting pays: which requests may draft, how many tokens, and the measured policy."""

from __future__ import annotations

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
    tokens per second of the whole batch: (1 + a + a^2 + ... + a^k) / time(k). A pair never
    measured is tried once; every `explore_every` steps the runner-up is re-measured so the
    estimates follow the machine and the load. With `always`, every step drafts k_max.

    With overlapped steps a drafting step also makes the plain step after it start cold: that
    step's host preparation no longer hides behind the GPU. Plain steps report their preparation
    time (`prep`), and drafting is charged it; a cold plain step's own wall time spans the next
    step's launch too, so it is not folded into the step times.
    """

    def __init__(self, k_max: int, explore_every: int = 1024, always: bool = False):
        self.k_max = k_max
        self.always = always  # draft k_max whenever possible, measured or not
        self.explore_every = explore_every
        self.times: dict[tuple[int, int], float] = {}
        self.prep: dict[int, float] = {}  # bucket -> host time to prepare a plain step (overlap only)
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
            return ranked[1]
        return ranked[0]

    def record_step(self, batch: int, k: int, seconds: float, cold: bool = False, prep: float | None = None) -> None:
        """Fold a measured step time into its (k, bucket) estimate (exponential moving average).
        With overlap on, a plain step also gives `prep`, its host preparation time, and `cold`
        says it started with nothing in flight (its time is then not a step's cost)."""
        b = self.bucket(batch)
        if prep is not None and not k:
            self._fold(self.prep, b, prep)
        if not (cold and not k):
            self._fold(self.times, (k, b), seconds)

    @staticmethod
    def _fold(table: dict, key, value: float) -> None:
        old = table.get(key)
        table[key] = value if old is None else 0.8 * old + 0.2 * value

    def record_acceptance(self, proposed: int, accepted: int) -> None:
        """Fold one verification into the estimate of the chance that a draft is kept given the
        ones before it were (each kept draft is a success; the first rejected one a failure)."""
        if proposed:
            attempts = accepted + (1 if accepted < proposed else 0)
            self.acceptance = 0.9 * self.acceptance + 0.1 * (accepted / attempts)
