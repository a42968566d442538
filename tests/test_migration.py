"""Migration units: a request continued from any step of its stream, by the router's own
continuation, ends exactly as the undisturbed one (text held back for a stop string included)."""

from __future__ import annotations

import pytest

from onebit.engine.llm import LLM
from onebit.protocol import GenerateRequest, SamplingParams, StepDelta
from onebit.router.migration import Progress

PROMPT = [100, 200, 300, 400, 150]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), device="cpu", parallel=2, ctx_size=256)


def _stream(llm: LLM, request: GenerateRequest) -> list[StepDelta]:
    """Every delta of one request, step by step."""
    engine = llm.engine
    engine.add_request(request.request_id, request.prompt_token_ids, request.params, resumed=request.resumed)
    deltas = []
    while engine.has_unfinished():
        deltas += [d for d in engine.step() if d.request_id == request.request_id]
    return deltas


def _continued_at(llm: LLM, request: GenerateRequest, reference: list[StepDelta], cut: int, kind: str,
                  decode=None) -> tuple[str, list[int], StepDelta]:
    """The client's text, token ids and last delta when the stream breaks after `cut` deltas and the
    rest comes from a fresh request built by the router's Progress."""
    progress = Progress(request)
    seen = [progress.add(d) for d in reference[:cut]]
    follow = progress.continuation(kind, decode)
    follow.request_id = f"{request.request_id}-after-{cut}-{kind}"
    if kind != "native":
        follow.resumed = None  # other kinds of backend ignore it: they start their text afresh
    seen += [progress.add(d) for d in _stream(llm, follow)]
    return "".join(d.text for d in seen), [t for d in seen for t in d.token_ids], seen[-1]


def _stop_inside(llm: LLM) -> tuple[str, str]:
    """A stop string that ends the greedy text mid-way and spans a token boundary, and the text it leaves."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    whole = llm.generate([PROMPT], params)[0]
    text = whole.text
    start = len(text) // 2
    while start < len(text) - 4 and not text[start:start + 4].isprintable():
        start += 1
    stop = text[start:start + 4]
    return stop, text[:text.find(stop)]


@pytest.mark.parametrize("kind", ["native", "remote"])
def test_continuing_after_any_step_gives_the_undisturbed_result(llm, kind):
    stop, expected = _stop_inside(llm)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop])
    request = GenerateRequest("r", PROMPT, params)
    reference = _stream(llm, request)
    assert "".join(d.text for d in reference) == expected and reference[-1].finish_reason == "stop"
    ids = [t for d in reference for t in d.token_ids]
    decode = lambda tokens, skip: llm.tokenizer.decode(tokens, skip_special_tokens=skip)  # noqa: E731
    held = 0
    for cut in range(1, len(reference)):
        text, tokens, last = _continued_at(llm, request, reference, cut, kind, decode)
        assert (text, tokens) == (expected, ids), cut
        assert last.finished and last.finish_reason == "stop" and last.num_output_tokens == len(ids)
        assert last.num_prompt_tokens == len(PROMPT)
        client = "".join(d.text for d in reference[:cut])
        held += llm.tokenizer.decode(ids[:sum(len(d.token_ids) for d in reference[:cut])]) != client
    assert held  # some cuts fell where text was held back (a possible stop string), the case that matters


def test_seeded_sampling_continues_as_it_would_have(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=30, ignore_eos=True)
    request = GenerateRequest("s", PROMPT, params)
    reference = _stream(llm, request)
    for cut in (1, 9, 20):
        text, tokens, last = _continued_at(llm, request, reference, cut, "native")
        assert tokens == [t for d in reference for t in d.token_ids] and last.num_output_tokens == 30
        assert text == "".join(d.text for d in reference)


def test_a_break_after_the_last_token_ends_the_request_without_a_backend():
    request = GenerateRequest("e", [1, 2], SamplingParams(max_tokens=3))
    progress = Progress(request)
    for i in range(3):
        progress.add(StepDelta("e", [10 + i], f"t{i}", num_prompt_tokens=2, num_output_tokens=i + 1))
    end = progress.continuation()
    assert isinstance(end, StepDelta) and end.finished and end.finish_reason == "length"
    assert (end.num_output_tokens, end.num_prompt_tokens) == (3, 2)
