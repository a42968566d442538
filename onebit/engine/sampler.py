"""Turns a step's logits into tokens, each row by its own request's parameters.

Order: logit_bias, penalties and min_tokens masks act on the raw logits, then the grammar mask of
the constrained rows (one batched mask, engine/grammar/mask.py); then
temperature, top-k, top-p and min-p shape the distribution; a token is drawn by an
exponential race (argmax of p / E with E ~ Exp(1)), whose noise for a seeded request
comes from that request's own generator, reseeded at every token from the seed and the
token's position (`position_seed`): a seed gives the same tokens whatever else shares the
batch, and a request continued elsewhere from its prompt plus the tokens it already had
(a migration) draws what it would have drawn. Logprobs are those of the raw model distribution.
"""

from __future__ import annotations

import torch

from onebit.engine.outputs import TokenLogprob
from onebit.engine.sequence import Sequence
from onebit.engine.transfer import Download, upload
from onebit.kernels import ops


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Repetition (prompt and output), presence and frequency (output) penalties, in place."""
    for row, seq in enumerate(seqs):
        p = seq.params
        if not p.has_penalties:
            continue
        if p.repetition_penalty != 1.0:
            seen = upload(sorted(set(seq.token_ids)), torch.long, logits.device)
            vals = logits[row, seen]
            logits[row, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and seq.output_counts:
            ids = upload(list(seq.output_counts), torch.long, logits.device)
            counts = upload(list(seq.output_counts.values()), logits.dtype, logits.device)
            logits[row, ids] -= p.frequency_penalty * counts + p.presence_penalty


def apply_bias_and_bans(logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int]) -> None:
    """logit_bias, and a ban on end tokens while fewer than min_tokens were generated, in place.

    All rows at once: one indexed add and one indexed fill per step (a fixed-length benchmark sets
    min_tokens on every request; a write per row cost milliseconds a step at 64 rows on a GPU),
    into the flattened logits with uploaded indices: advanced-index assignment of a Python number
    (`logits[rows, ids] = -inf`) made the host wait for the GPU's queue, which undid overlapped
    steps (G21, session 11: 5.7 ms of a 7-9 ms served step at 64 streams).
    `logits` must be contiguous (the sampler's own copy)."""
    vocab = logits.shape[-1]
    bias_at, biases, ban_at = [], [], []
    for row, seq in enumerate(seqs):
        p = seq.params
        for token_id, bias in p.logit_bias.items():
            if 0 <= token_id < vocab:
                bias_at.append(row * vocab + token_id)
                biases.append(bias)
        if seq.num_output_tokens < p.min_tokens:
            ban_at.extend(row * vocab + t for t in eos_ids | set(p.stop_token_ids) if 0 <= t < vocab)
    flat = logits.view(-1)
    if bias_at:
        flat.index_add_(0, upload(bias_at, torch.long, logits.device), upload(biases, logits.dtype, logits.device))
    if ban_at:
        flat.index_fill_(0, upload(ban_at, torch.long, logits.device), float("-inf"))


def shape_distribution(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p, for the sampled (non-greedy) rows."""
    temps = upload([s.params.temperature for s in seqs], logits.dtype, logits.device)
    probs = (logits / temps[:, None]).softmax(dim=-1)
    top_k = [s.params.top_k for s in seqs]
    top_p = [s.params.top_p for s in seqs]
    if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        vocab = probs.shape[-1]
        ks = upload([k if k > 0 else vocab for k in top_k], torch.long, probs.device)
        rank = torch.arange(vocab, device=probs.device)[None, :]
        drop = rank >= ks[:, None]
        ps = upload(top_p, probs.dtype, probs.device)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
        drop |= before >= ps[:, None]
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    if any(s.params.min_p > 0 for s in seqs):  # decided on the host: no device sync
        min_p = upload([s.params.min_p for s in seqs], probs.dtype, probs.device)
        threshold = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """The generator seed for the token at `position` (its index in prompt + output) of a request
    seeded with `seed`: a splitmix64 mix, so neighbouring positions get unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1  # torch takes seeds below 2**63


def _race_noise(probs: torch.Tensor, seqs: list[Sequence], default: torch.Generator | None) -> torch.Tensor:
    noise = torch.empty_like(probs)
    unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
    if unseeded:
        block = torch.empty((len(unseeded), probs.shape[1]), dtype=probs.dtype, device=probs.device)
        block.exponential_(generator=default)
        noise[upload(unseeded, torch.long, probs.device)] = block
    for i, seq in enumerate(seqs):
        if seq.generator is not None:
            seq.generator.manual_seed(position_seed(seq.params.seed, seq.num_tokens))
            noise[i].exponential_(generator=seq.generator)
    return noise


class Sampler:
    """Samples one token per row of logits and reports logprobs when asked."""

    def __init__(self, eos_token_ids: set[int], device: torch.device, seed: int = 0):
        self.eos_token_ids = set(eos_token_ids)
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.masker = None  # a GrammarMasker, made at the first constrained request

    def make_generator(self, seed: int) -> torch.Generator:
        """A generator on the sampling device for one seeded request."""
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        return g

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprob | None]]:
        """One token per row of logits [N, vocab], and logprobs for the rows that asked."""
        return self.sample(logits, seqs).resolve()

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> "SampledBatch":
        """Queue the sampling of one token per row of logits [N, vocab] (and the logprobs asked for)
        and the copy of the results to the host, without waiting for the GPU."""
        # The logits stay in the model's dtype unless a bias, a penalty or a grammar changes them: the
        # argmax of bfloat16 values is the argmax of their float32 conversion (exact, order-preserving;
        # ties to the lowest index in both), and a float32 copy of [rows, vocab] cost a kernel and its
        # bytes every step. min_tokens' bans (-inf) are exact in any dtype: a copy in the model's.
        raw = logits
        added = any(s.params.logit_bias or s.params.has_penalties for s in seqs)
        banned = any(s.num_output_tokens < s.params.min_tokens for s in seqs)
        constrained = any(s.grammar is not None for s in seqs)
        edited = added or banned
        if added or constrained:
            logits = logits.to(torch.float32, copy=True)
        elif banned:
            logits = logits.clone()
        if edited:
            apply_bias_and_bans(logits, seqs, self.eos_token_ids)
            apply_penalties(logits, seqs)
        if constrained:
            if self.masker is None:
                from onebit.engine.grammar import GrammarMasker  # the grammar library loads only when used
                self.masker = GrammarMasker(logits.shape[-1], logits.device)
            logits = self.masker.apply(logits, [s.grammar for s in seqs])
        tokens = ops.argmax_rows(logits)
        sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if sampled:
            rows = upload(sampled, torch.long, logits.device)
            sub = [seqs[i] for i in sampled]
            probs = shape_distribution(logits[rows].float(), sub)
            noise = _race_noise(probs, sub, self.generator)
            tokens[rows] = (probs / noise).argmax(dim=-1)
        wanted = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if not wanted:
            return SampledBatch(tokens, Download([tokens]), [])
        rows = upload(wanted, torch.long, logits.device)
        lp = raw[rows].float().log_softmax(dim=-1)
        top_vals, top_ids = lp.topk(max(max(seqs[i].params.logprobs for i in wanted), 1), dim=-1)
        chosen = lp.gather(1, tokens[rows][:, None]).squeeze(1)
        return SampledBatch(tokens, Download([tokens, chosen, top_vals, top_ids]),
                            [(i, seqs[i].params.logprobs) for i in wanted])


class SampledBatch:
    """A step's sampled token ids, on the device (`tokens`, which the next step can read as its
    input ids) and on their way to the host; `resolve()` waits for that copy only."""

    def __init__(self, tokens: torch.Tensor, download: Download, wanted: list[tuple[int, int]]):
        self.tokens = tokens
        self._download = download
        self._wanted = wanted  # (row, number of top logprobs) for the rows that asked

    def resolve(self) -> tuple[list[int], list[TokenLogprob | None]]:
        """The token ids as a list, and each row's logprobs (None where not asked)."""
        lists = self._download.lists()
        token_list = lists[0]
        logprobs: list[TokenLogprob | None] = [None] * len(token_list)
        if self._wanted:
            chosen, top_vals, top_ids = lists[1:]
            for j, (i, n) in enumerate(self._wanted):
                logprobs[i] = TokenLogprob(token_list[i], chosen[j], list(zip(top_ids[j][:n], top_vals[j][:n])))
        return token_list, logprobs
