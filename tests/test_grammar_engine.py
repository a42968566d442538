"""Grammar-constrained sampling inside the engine: outputs match their schema with overlapped steps
(constrained rows do not overlap, so their tokens are those of plain steps) and with speculative
decoding (drafts are checked against the grammar: greedy output equals plain steps'), compiled
grammars are cached, and a grammar failure fails only its request."""

from __future__ import annotations

import json

import jsonschema
import pytest

from onebit import LLM, SamplingParams
from onebit.engine.grammar import GrammarFailed
from onebit.protocol import InvalidRequest
from onebit.protocol.grammar import GrammarSpec

SCHEMA = {"type": "object",
          "properties": {"k": {"enum": ["a", "b", "c"]}, "n": {"type": "integer", "minimum": 0, "maximum": 50},
                         "xs": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4}},
          "required": ["k", "n", "xs"], "additionalProperties": False}
SPEC = GrammarSpec("json_schema", json.dumps(SCHEMA))
PROMPTS = ["hello there", "one two one two one two one two", "the weather is", "a b a b a b a b a b"]  # free rows repeat: n-grams draft


def _params() -> list[SamplingParams]:
    """Two constrained and two free requests, seeded."""
    return [SamplingParams(seed=i, max_tokens=120 if i % 2 == 0 else 30, grammar=SPEC if i % 2 == 0 else None)
            for i in range(4)]


def _run(llm: LLM) -> list[tuple[list[int], str | None]]:
    return [(o.token_ids, o.finish_reason) for o in llm.generate(PROMPTS, _params())]


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    """The outputs of plain steps (no overlap, no drafting) and the engine that made them."""
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=4, overlap=False)
    return llm, _run(llm)


def test_constrained_rows_validate_and_free_rows_do_not_need_to(plain):
    llm, outputs = plain
    for i, (tokens, reason) in enumerate(outputs):
        if i % 2 == 0:
            assert reason == "stop"
            jsonschema.validate(json.loads(llm.tokenizer.decode(tokens)), SCHEMA)
    assert llm.engine.grammar_compiler.compiled == 1  # two requests, one schema: compiled once


def test_overlapped_steps_give_the_same_tokens(tiny_model_dir, plain):
    overlapped = LLM(str(tiny_model_dir), device="cpu", parallel=4, overlap=True)
    assert overlapped.engine.overlap
    assert _run(overlapped) == plain[1]


def test_speculative_decoding_checks_drafts_against_the_grammar(tiny_model_dir, plain):
    greedy = [SamplingParams(temperature=0.0, max_tokens=120, grammar=SPEC) for _ in PROMPTS]
    expected = [(o.token_ids, o.finish_reason) for o in plain[0].generate(PROMPTS, greedy)]
    spec = LLM(str(tiny_model_dir), device="cpu", parallel=4,
               speculative={"method": "ngram", "policy": "always", "draft_max": 3})
    got = [(o.token_ids, o.finish_reason) for o in spec.generate(PROMPTS, greedy)]
    assert got == expected  # greedy: verification keeps exactly the tokens plain steps choose
    assert spec.engine.spec_proposed > 0  # constrained rows drafted (they are the only rows here)
    for tokens, reason in got:
        assert reason == "stop"
        jsonschema.validate(json.loads(spec.tokenizer.decode(tokens)), SCHEMA)
    sampled = spec.generate(PROMPTS, _params())  # seeded sampling with drafts: still valid
    for i in (0, 2):
        assert sampled[i].finish_reason == "stop"
        jsonschema.validate(json.loads(sampled[i].text), SCHEMA)


def test_a_bad_grammar_is_refused_at_admission(plain):
    llm = plain[0]
    with pytest.raises(InvalidRequest) as info:
        llm.engine.add_request("bad", [5, 6, 7], SamplingParams(grammar=GrammarSpec("gbnf", "root ::= (", "grammar")))
    assert info.value.param == "grammar"
    assert not llm.engine.has_unfinished()


def test_a_grammar_failure_fails_only_its_request(plain):
    llm = plain[0]
    engine = llm.engine
    engine.add_request("broken", [5, 6, 7], SamplingParams(seed=1, max_tokens=40, grammar=SPEC))
    engine.add_request("fine", [5, 6, 8], SamplingParams(seed=2, max_tokens=40, grammar=SPEC))

    def reject(token):
        raise GrammarFailed(f"rejected {token}")
    engine.seqs["broken"].grammar.accept = reject  # a matcher failing mid-request
    finished = {}
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.finished:
                finished[delta.request_id] = delta
    assert finished["broken"].finish_reason == "error" and "rejected" in finished["broken"].error
    assert finished["fine"].finish_reason == "stop" and finished["fine"].num_output_tokens > 0
    assert engine.scheduler.blocks.num_free == engine.scheduler.blocks.num_blocks


def test_prefix_cache_hit_gives_the_same_constrained_output(plain):
    llm = plain[0]
    prompt = list(range(10, 60))  # three full blocks of 16 tokens: cached after the first request
    params = SamplingParams(seed=9, max_tokens=120, grammar=SPEC)
    first, second = llm.generate([prompt], params)[0], llm.generate([prompt], params)[0]
    assert second.num_cached_tokens >= 32
    assert second.token_ids == first.token_ids and second.finish_reason == "stop"
    jsonschema.validate(json.loads(second.text), SCHEMA)
