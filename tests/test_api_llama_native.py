"""llama-server's native API against the real server: POST /completion (text, token and mixed
prompts, several prompts, n_predict, stream event by event, stop words, n_probs, id_slot,
return_tokens) and /infill, plus the start-up options --alias (repeated), --chat-template-file,
--jinja and --reasoning-format."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_utils import running_server

TEMPLATE = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
PROMPT = "The quick brown fox jumps over the lazy dog"
GREEDY = {"temperature": 0, "ignore_eos": True}
RESULT_FIELDS = ("content", "tokens", "stop", "stop_type", "stopping_word", "timings", "generation_settings",
                 "tokens_predicted", "tokens_evaluated", "truncated", "id_slot", "model", "tokens_cached")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """A server with two --alias options, a chat template file, --jinja and --reasoning-format none."""
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    with running_server(tiny_model_dir, "--ctx-size", "256", "--parallel", "4", "--alias", "tiny",
                        "--alias", "tiny-b,tiny-c", "--chat-template-file", str(template), "--jinja",
                        "--reasoning-format", "none") as s:
        yield s


def post(server, path: str, body: dict) -> httpx.Response:
    """A JSON POST."""
    return httpx.post(server.root + path, json=body, timeout=60)


def complete(server, **body) -> dict:
    """A whole /completion answer (asserting 200)."""
    r = post(server, "/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(server, text: str, add_special: bool = True) -> list[int]:
    """The server's tokenization of `text`."""
    return post(server, "/tokenize", {"content": text, "add_special": add_special}).json()["tokens"]


def test_completion_fields(server):
    out = complete(server, prompt=PROMPT, n_predict=5, return_tokens=True, **GREEDY)
    assert all(key in out for key in RESULT_FIELDS)
    assert out["stop"] is True and out["stop_type"] == "limit" and out["stopping_word"] == ""
    assert out["tokens_predicted"] == len(out["tokens"]) == 5
    assert out["tokens_evaluated"] == len(tokenize(server, PROMPT)) and out["truncated"] is False
    assert post(server, "/detokenize", {"tokens": out["tokens"]}).json()["content"] == out["content"]
    assert out["generation_settings"]["n_predict"] == 5 and out["generation_settings"]["temperature"] == 0
    assert out["timings"]["predicted_n"] == 5 and out["timings"]["prompt_n"] + out["timings"]["cache_n"] == \
        out["tokens_evaluated"]
    assert out["model"] == "tiny"
    # the same greedy tokens as the OpenAI-shaped route
    same = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, **GREEDY}).json()
    assert same["choices"][0]["text"] == out["content"]
    assert complete(server, prompt=PROMPT, n_predict=5, **GREEDY)["tokens"] == []  # only with return_tokens


def test_token_and_mixed_prompts(server):
    text = complete(server, prompt=PROMPT, n_predict=6, **GREEDY)
    ids = tokenize(server, PROMPT)
    by_ids = complete(server, prompt=ids, n_predict=6, **GREEDY)
    head, tail = "The quick brown fox", " jumps over the lazy dog"
    mixed = complete(server, prompt=[head, *tokenize(server, tail, add_special=False)], n_predict=6, **GREEDY)
    assert text["content"] == by_ids["content"] == mixed["content"]
    assert text["tokens_evaluated"] == by_ids["tokens_evaluated"] == mixed["tokens_evaluated"] == len(ids)


def test_several_prompts_give_a_list(server):
    out = post(server, "/completion", {"prompt": [PROMPT, "Another prompt"], "n_predict": 3, **GREEDY}).json()
    assert isinstance(out, list) and [r["index"] for r in out] == [0, 1]
    assert out[0]["content"] == complete(server, prompt=PROMPT, n_predict=3, **GREEDY)["content"]
    assert all(r["tokens_predicted"] == 3 for r in out)


def test_stream_event_by_event(server):
    whole = complete(server, prompt=PROMPT, n_predict=6, return_tokens=True, **GREEDY)
    with httpx.stream("POST", server.root + "/completion", timeout=60,
                      json={"prompt": PROMPT, "n_predict": 6, "stream": True, "return_tokens": True, **GREEDY}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and "data: [DONE]" not in lines
    events = [json.loads(line[len("data: "):]) for line in lines]
    *pieces, last = events
    assert pieces and all(e["stop"] is False for e in pieces)
    running = [sum(len(e["tokens"]) for e in pieces[:i + 1]) for i in range(len(pieces))]
    assert [e["tokens_predicted"] for e in pieces] == running
    assert "".join(e["content"] for e in pieces) == whole["content"]
    assert [t for e in pieces for t in e["tokens"]] == whole["tokens"]
    assert last["stop"] is True and last["content"] == "" and last["stop_type"] == "limit"
    assert all(key in last for key in RESULT_FIELDS) and last["tokens_predicted"] == 6


def test_stop_word(server):
    whole = complete(server, prompt=PROMPT, n_predict=12, **GREEDY)["content"]
    # the first 3-character piece after the start that does not occur earlier in the output
    at = next(i for i in range(1, len(whole) - 3) if whole.find(whole[i:i + 3]) == i)
    word = whole[at:at + 3]
    out = complete(server, prompt=PROMPT, n_predict=12, stop=[word], **GREEDY)
    assert out["stop_type"] == "word" and out["stopping_word"] == word and out["content"] == whole[:at]
    assert out["generation_settings"]["stop"] == [word]


def test_n_probs(server):
    out = complete(server, prompt=PROMPT, n_predict=4, n_probs=3, return_tokens=True, **GREEDY)
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"]
    for p in probs:
        assert len(p["top_logprobs"]) == 3 and p["logprob"] <= 0
        assert p["top_logprobs"][0]["id"] == p["id"]  # greedy: the sampled token is the most likely
        assert bytes(p["bytes"]) == p["token"].encode("utf-8")


def test_slot_and_cache_fields(server):
    out = complete(server, prompt=PROMPT, n_predict=2, id_slot=1, cache_prompt=False, **GREEDY)
    assert out["id_slot"] == 1
    again = complete(server, prompt=PROMPT * 2, n_predict=2, **GREEDY)
    again = complete(server, prompt=PROMPT * 2, n_predict=2, **GREEDY)
    assert again["tokens_cached"] >= 16 and again["timings"]["cache_n"] == again["tokens_cached"]


@pytest.mark.parametrize("body, param", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": "x", "id_slot": 99}, "id_slot"),
    ({"prompt": "x", "n_probs": 500}, "n_probs"),
    ({"prompt": "x", "n_predict": 0}, "n_predict"),
    ({"prompt": {"a": 1}}, "prompt"),
])
def test_bad_completion_requests(server, body, param):
    r = post(server, "/completion", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert complete(server, prompt="still serving", n_predict=1)["stop"] is True


def test_infill_without_fim_tokens_is_a_clear_error(server):
    r = post(server, "/infill", {"input_prefix": "def f(", "input_suffix": "):\n"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "not_supported" and "fill-in-the-middle" in r.json()["error"]["message"]


def test_repeated_alias(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    (card,) = client.models.list().data
    assert card.id == "tiny" and card.model_extra["aliases"] == ["tiny", "tiny-b", "tiny-c"]
    out = client.chat.completions.create(model="tiny-c", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert out.model == "tiny"


def test_chat_template_file(server):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert post(server, "/apply-template", {"messages": messages}).json()["prompt"] == "[system]S\n[user]U\n[assistant]"


def test_reasoning_format_none_keeps_think_text_in_content(server):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>"}]
    out = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 4, **GREEDY}).json()
    message = out["choices"][0]["message"]
    assert message["content"] and "reasoning_content" not in message


def test_no_cors_headers_without_cors_origins(server):
    r = httpx.options(server.root + "/v1/models", headers={"Origin": "http://a.example",
                                                           "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in r.headers
