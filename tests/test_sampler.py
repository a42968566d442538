"""Each sampling parameter moves the distribution the way it should (statistical checks on fixed logits)."""

from __future__ import annotations

from collections import Counter

import torch

from onebit.engine.sampler import Sampler
from onebit.engine.sampling_params import SamplingParams
from onebit.engine.sequence import Sequence

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
EOS = 7


def _draw(params: SamplingParams, n: int = 4000, history: list[int] | None = None) -> Counter:
    """Sample n tokens from LOGITS, all rows in one batch."""
    sampler = Sampler({EOS}, torch.device("cpu"), seed=0)
    seqs = []
    for _ in range(n):
        seq = Sequence("r", [0], params, 100, 0)
        for t in history or []:
            seq.append(t)
        seqs.append(seq)
    tokens, _ = sampler(LOGITS.repeat(n, 1), seqs)
    return Counter(tokens)


def _freq(counts: Counter, token: int) -> float:
    return counts[token] / sum(counts.values())


def test_plain_sampling_follows_softmax():
    counts = _draw(SamplingParams(temperature=1.0))
    expected = LOGITS.softmax(-1)
    for t in range(8):
        assert abs(_freq(counts, t) - expected[t].item()) < 0.03


def test_greedy_takes_argmax():
    assert _draw(SamplingParams(temperature=0.0), n=50) == Counter({0: 50})


def test_temperature_sharpens_and_flattens():
    cold, hot = _draw(SamplingParams(temperature=0.3)), _draw(SamplingParams(temperature=3.0))
    assert _freq(cold, 0) > 0.75 > _freq(hot, 0)
    assert _freq(hot, 7) > 0.04 > _freq(cold, 7)


def test_top_k_top_p_min_p_cut_the_tail():
    assert set(_draw(SamplingParams(top_k=3))) == {0, 1, 2}
    probs = LOGITS.softmax(-1)
    # top_p just above the first two tokens' mass keeps exactly three tokens
    p = (probs[0] + probs[1]).item() + 0.01
    assert set(_draw(SamplingParams(top_p=p))) == {0, 1, 2}
    assert set(_draw(SamplingParams(top_p=0.01))) == {0}
    # min_p 0.5: keep tokens with prob >= half the top one: exp(-0.5)=0.61 passes, exp(-1)=0.37 fails
    assert set(_draw(SamplingParams(min_p=0.5))) == {0, 1}


def test_logit_bias_forces_and_bans():
    assert set(_draw(SamplingParams(logit_bias={5: 100.0}), n=200)) == {5}
    assert 0 not in _draw(SamplingParams(logit_bias={0: -100.0}), n=2000)


def test_penalties_lower_repeated_tokens():
    base = _freq(_draw(SamplingParams()), 0)
    history = [0, 0, 0]
    assert _freq(_draw(SamplingParams(repetition_penalty=2.0), history=history), 0) < base - 0.1
    assert _freq(_draw(SamplingParams(presence_penalty=1.5), history=history), 0) < base - 0.1
    light = _freq(_draw(SamplingParams(frequency_penalty=0.3), history=[0]), 0)
    heavy = _freq(_draw(SamplingParams(frequency_penalty=0.3), history=history), 0)
    assert heavy < light - 0.05
    assert _freq(_draw(SamplingParams(presence_penalty=-1.0), history=[3]), 3) > _freq(_draw(SamplingParams()), 3) + 0.05


def test_min_tokens_bans_end_tokens():
    params = SamplingParams(min_tokens=5, logit_bias={EOS: 100.0}, stop_token_ids=[6])
    assert EOS not in _draw(params, n=500) and 6 not in _draw(params, n=500)
    assert set(_draw(params, n=50, history=[1, 1, 1, 1, 1])) == {EOS}


def test_seeded_rows_independent_of_batch():
    sampler = Sampler({EOS}, torch.device("cpu"), seed=0)
    params = SamplingParams(temperature=1.0, seed=42)

    def run(batch_size: int) -> list[int]:
        seq = Sequence("s", [0], params, 100, 0)
        seq.generator = sampler.make_generator(42)
        others = [Sequence(f"o{i}", [0], SamplingParams(), 100, 0) for i in range(batch_size)]
        out = []
        for _ in range(20):
            tokens, _ = sampler(LOGITS.repeat(batch_size + 1, 1), others + [seq])
            out.append(tokens[-1])
            seq.append(tokens[-1])
        return out

    assert run(0) == run(7) == run(3)
    assert len(set(run(0))) > 1  # a fresh draw per position, not one repeated token


def test_seeded_draw_depends_on_seed_and_position_only():
    """A request continued from its prompt plus the tokens it had (a migration) draws the same
    tokens as the undisturbed one: the noise comes from (seed, position), not from a stream."""
    sampler = Sampler({EOS}, torch.device("cpu"), seed=0)
    params = SamplingParams(temperature=1.0, seed=7)

    def draws(prefix: list[int], n: int) -> list[int]:
        seq = Sequence("s", prefix, params, 100, 0)
        seq.generator = sampler.make_generator(params.seed)
        out = []
        for _ in range(n):
            token = sampler(LOGITS[None, :], [seq])[0][0]
            seq.append(token)
            out.append(token)
        return out

    whole = draws([0], 12)
    assert draws([0] + whole[:5], 7) == whole[5:]
    params = SamplingParams(temperature=1.0, seed=8)
    assert draws([0], 12) != whole  # another seed, other tokens (12 draws over 8 tokens)


def test_logprobs_report_raw_distribution_and_top_n():
    sampler = Sampler({EOS}, torch.device("cpu"), seed=0)
    seq = Sequence("l", [0], SamplingParams(temperature=0, logprobs=3), 100, 0)
    tokens, lps = sampler(LOGITS[None, :], [seq])
    expected = LOGITS.log_softmax(-1)
    assert tokens == [0] and lps[0].token_id == 0
    assert abs(lps[0].logprob - expected[0].item()) < 1e-5
    assert [t for t, _ in lps[0].top] == [0, 1, 2]
    assert all(abs(v - expected[t].item()) < 1e-5 for t, v in lps[0].top)


def test_bias_and_bans_land_on_their_own_rows_only():
    from onebit.engine.sampler import apply_bias_and_bans
    from onebit.engine.sequence import Sequence
    seqs = [Sequence("a", [1], SamplingParams(logit_bias={2: 5.0, 3: -1.0}), 50, 0),
            Sequence("b", [1], SamplingParams(min_tokens=3, stop_token_ids=[4]), 50, 1),
            Sequence("c", [1], SamplingParams(min_tokens=1), 50, 2)]
    seqs[2].append(7)  # c already has its one token: no ban
    logits = torch.zeros(3, 10)
    apply_bias_and_bans(logits, seqs, eos_ids={9})
    want = torch.zeros(3, 10)
    want[0, 2], want[0, 3] = 5.0, -1.0
    want[1, 9] = want[1, 4] = float("-inf")
    assert torch.equal(logits, want)


def test_bias_and_bans_write_no_python_number_through_tensor_indices(monkeypatch):
    """`logits[row_tensor, id_tensor] = -inf` made the host wait for the GPU's queue on CUDA (G21,
    session 11: 5.7 ms of a served step); the writes go through index_fill_/index_add_ instead."""
    from onebit.engine.sampler import apply_bias_and_bans
    writes = []
    original = torch.Tensor.__setitem__

    def recording(self, key, value):
        writes.append((key, value))
        return original(self, key, value)
    monkeypatch.setattr(torch.Tensor, "__setitem__", recording)
    seqs = [Sequence("a", [1], SamplingParams(logit_bias={2: 5.0}, min_tokens=4), 50, 0),
            Sequence("b", [1], SamplingParams(min_tokens=3, stop_token_ids=[4]), 50, 1)]
    logits = torch.zeros(2, 10)
    apply_bias_and_bans(logits, seqs, eos_ids={9})
    assert logits[0, 2] == 5.0 and logits[0, 9] == logits[1, 9] == logits[1, 4] == float("-inf")
    assert writes == []


def _mixed_rows() -> list[Sequence]:
    """Greedy, seeded sampling (top-k), logprobs, a logit bias and a penalty: every path of `sample`."""
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=50, seed=3),
              SamplingParams(temperature=0.0, logprobs=4), SamplingParams(temperature=0.0, logit_bias={5: 30.0}),
              SamplingParams(temperature=1.0, seed=9, repetition_penalty=1.3)]
    seqs = []
    for i, p in enumerate(params):
        seq = Sequence(f"m{i}", [1, 2, 3], p, 100, i)
        seq.generator = Sampler({EOS}, torch.device("cpu")).make_generator(p.seed) if p.seed is not None else None
        seqs.append(seq)
    return seqs


def test_bfloat16_logits_sample_what_their_float32_values_sample():
    """The sampler keeps a step's logits in the model's dtype unless a row edits them: every row's token
    and logprobs from bfloat16 logits equal those from the same values in float32, ties included."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 300, generator=gen) * 4).to(torch.bfloat16)
    logits[0, 17] = logits[0, 230] = logits[0].max() + 1  # a tie: the lower index wins in both
    before = logits.clone()
    got_tokens, got_lps = Sampler({EOS}, torch.device("cpu"), seed=0)(logits, _mixed_rows())
    want_tokens, want_lps = Sampler({EOS}, torch.device("cpu"), seed=0)(logits.float(), _mixed_rows())
    assert got_tokens == want_tokens and got_tokens[0] == 17 and got_tokens[3] == 5
    assert got_lps[2] is not None and got_lps[2] == want_lps[2]
    assert torch.equal(logits, before)  # the bias and penalty rows edited a copy


def test_greedy_rows_of_bfloat16_logits_are_not_copied_to_float32(monkeypatch):
    """A step of plain greedy rows takes the argmax of the logits as they are (no float32 copy)."""
    logits = torch.randn(3, 64).to(torch.bfloat16)
    want = logits.float().argmax(-1).tolist()
    casts = []
    for name in ("to", "float"):
        original = getattr(torch.Tensor, name)

        def recording(self, *args, _original=original, _name=name, **kwargs):
            casts.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, recording)
    seqs = [Sequence(f"g{i}", [0], SamplingParams(temperature=0.0), 100, i) for i in range(3)]
    tokens, _ = Sampler({EOS}, torch.device("cpu"), seed=0)(logits, seqs)
    assert tokens == want and casts == []


def test_min_tokens_bans_apply_to_a_copy_in_the_model_dtype(monkeypatch):
    """Bans alone (-inf, exact in bfloat16) edit a bfloat16 copy: the banned end token loses to the next
    best, as with float32 logits, and the step's logits are untouched."""
    logits = torch.randn(2, 64).to(torch.bfloat16)
    logits[:, EOS] = 50.0
    before = logits.clone()
    seqs = [Sequence(f"b{i}", [0], SamplingParams(temperature=0.0, min_tokens=4), 100, i) for i in range(2)]
    want = Sampler({EOS}, torch.device("cpu"), seed=0)(logits.float(), seqs)[0]
    casts = []
    original = torch.Tensor.to

    def recording(self, *args, **kwargs):
        casts.append(args)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "to", recording)
    got = Sampler({EOS}, torch.device("cpu"), seed=0)(logits, seqs)[0]
    assert got == want and EOS not in got and casts == []
    assert torch.equal(logits, before)
