"""Speculative decoding through the server (`--ngram`, the built-in model): the /metrics counters,
and each response's llama.cpp-style `timings` with its own drafted and accepted tokens."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_utils import openai_clients, running_server

# Greedy on a repeating prompt: the n-gram drafter finds a match at every step and its drafts are
# kept, so the engine's draft policy (which weighs measured step times) keeps choosing to draft.
PROMPT = "x = 1\n" * 12
FIXED = {"model": "demo", "max_tokens": 24, "temperature": 0, "extra_body": {"ignore_eos": True}}
SPEC = ("onebit:spec_decode_num_draft_tokens", "onebit:spec_decode_num_accepted_tokens",
        "onebit:spec_decode_num_draft_tokens_per_pos", "onebit:spec_decode_num_accepted_tokens_per_pos",
        "onebit:num_decode_steps", "onebit:spec_decode_num_draft_steps")


@pytest.fixture(scope="module")
def server():
    """One `--ngram` server on the built-in model for the module."""
    # --draft-policy always: the automatic policy decides from measured step times, which a test must not.
    with running_server(None, "--ngram", "--draft-policy", "always", "--ctx-size", "256", "--parallel", "2",
                        "--alias", "demo") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    """The sync openai client."""
    return openai_clients(server)[0]


def _timings(client, endpoint: str, mode: str) -> dict | None:
    """Send one request; the `timings` of the response, or of the last chunk of a stream."""
    if endpoint == "chat":
        def create(**kw):
            return client.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **FIXED, **kw)
    else:
        def create(**kw):
            return client.completions.create(prompt=PROMPT, **FIXED, **kw)
    if mode == "full":
        return create().model_extra.get("timings")
    options = {"stream_options": {"include_usage": True}} if mode == "stream+usage" else {}
    chunks = list(create(stream=True, **options))
    assert all("timings" not in c.model_extra for c in chunks[:-1])  # only the last chunk carries them
    if mode == "stream+usage":
        assert chunks[-1].usage is not None
    return chunks[-1].model_extra.get("timings")


def _counters(server) -> dict:
    """The speculative counters of /metrics: {(name, position label or None): value}."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{server.root}/metrics").text):
        if family.name in SPEC:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    assert sample.labels["backend"] == "native-0"
                    out[family.name, sample.labels.get("position")] = sample.value
    return out


@pytest.mark.parametrize("mode", ["full", "stream", "stream+usage"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_response_timings_carry_its_drafts(server, client, endpoint, mode):
    before = _counters(server)
    timings = _timings(client, endpoint, mode)
    assert timings is not None, "the request drafted nothing"
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0 and timings["draft_n"] > 0
    after = _counters(server)
    # the server ran nothing else meanwhile: the response's drafts are exactly what /metrics gained
    for name, value in (("onebit:spec_decode_num_draft_tokens", timings["draft_n"]),
                        ("onebit:spec_decode_num_accepted_tokens", timings["draft_n_accepted"])):
        assert after[name, None] - before.get((name, None), 0) == value


def test_metrics_count_drafts_by_position_and_steps(server, client):
    _timings(client, "completions", "full")
    c = _counters(server)
    drafted = c["onebit:spec_decode_num_draft_tokens", None]
    accepted = c["onebit:spec_decode_num_accepted_tokens", None]
    by_pos = {p: v for (name, p), v in c.items() if name == "onebit:spec_decode_num_draft_tokens_per_pos"}
    kept_by_pos = {p: v for (name, p), v in c.items() if name == "onebit:spec_decode_num_accepted_tokens_per_pos"}
    assert drafted > 0 and "1" in by_pos and set(kept_by_pos) == set(by_pos)
    assert sum(by_pos.values()) == drafted and sum(kept_by_pos.values()) == accepted
    assert 0 < c["onebit:spec_decode_num_draft_steps", None] <= c["onebit:num_decode_steps", None]
