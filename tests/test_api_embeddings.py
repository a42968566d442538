"""Embeddings: the engine's pooling against transformers' final hidden states on the same weights
(in process, prefill in chunks), and POST /v1/embeddings on the real server with the openai client."""

from __future__ import annotations

import concurrent.futures
import functools
import json

import httpx
import openai
import pytest
import torch
from server_utils import running_server

from onebit.engine.llm import LLM
from onebit.engine.pooling import Pooler
from onebit.models.pooling_config import model_pooling
from onebit.protocol import SamplingParams

TEXTS = ["The quick brown fox jumps over the lazy dog, again and again, until the dog wakes up.", "short one"]


@functools.cache
def _hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def reference(model_dir, ids: list[int], kind: str) -> torch.Tensor:
    """transformers' final (normed) hidden states pooled and normalized."""
    model = _hf_model(model_dir)
    with torch.no_grad():
        states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    pooled = {"mean": states.mean(0), "last": states[-1], "cls": states[0]}[kind]
    return torch.nn.functional.normalize(pooled, dim=0)


def test_engine_pooling_matches_transformers_in_chunks(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=4, ctx_size=256, max_batch_tokens=16)
    ids = llm.engine.tokenizer.encode(TEXTS[0], add_special_tokens=True)
    assert len(ids) > 32  # three chunks or more under a 16-token step budget
    kinds = ("mean", "last", "cls")
    for kind in kinds:
        llm.engine.add_request(kind, ids, SamplingParams(max_tokens=1, ignore_eos=True, pooling=kind))
    out = {}
    while llm.engine.has_unfinished():
        for delta in llm.engine.step():
            if delta.finished:
                out[delta.request_id] = delta.embedding
    for kind in kinds:
        assert torch.allclose(torch.tensor(out[kind]), reference(tiny_model_dir, ids, kind), atol=1e-4), kind


def test_pooler_counts_a_recomputed_chunk_once():
    pooler = Pooler("mean", 4)
    states = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    pooler.add(0, states[:2])
    pooler.add(0, states[:3])  # recomputed after a preemption: positions 0 and 1 again, then 2
    assert pooler.result() is None
    pooler.add(3, states[3:])
    assert torch.allclose(torch.tensor(pooler.result()), torch.nn.functional.normalize(states.mean(0), dim=0))


def test_pooling_from_the_model_config(tmp_path):
    assert model_pooling(tmp_path) == "last"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert model_pooling(tmp_path) == "mean"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """A server with --embedding and mean pooling."""
    with running_server(tiny_model_dir, "--ctx-size", "256", "--parallel", "4", "--alias", "tiny", "--embedding",
                        "--pooling", "mean") as s:
        yield s


def test_embeddings_endpoint(server, tiny_model_dir):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
    batch = client.embeddings.create(model="tiny", input=TEXTS)  # the client asks for base64 by default
    assert [d.index for d in batch.data] == [0, 1] and batch.model == "tiny"
    ids = [httpx.post(server.root + "/tokenize", json={"content": t, "add_special": True}).json()["tokens"]
           for t in TEXTS]
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == sum(len(i) for i in ids)
    for item, tokens in zip(batch.data, ids):
        vector = torch.tensor(item.embedding)
        assert vector.shape == (64,) and abs(vector.norm().item() - 1) < 1e-5
        assert torch.allclose(vector, reference(tiny_model_dir, tokens, "mean"), atol=1e-4)
    one = client.embeddings.create(model="tiny", input=TEXTS[1], encoding_format="float")
    by_ids = client.embeddings.create(model="tiny", input=[ids[1]], encoding_format="float")
    assert torch.allclose(torch.tensor(one.data[0].embedding), torch.tensor(batch.data[1].embedding), atol=1e-5)
    assert one.data[0].embedding == by_ids.data[0].embedding


def test_embeddings_share_the_server_with_generation(server):
    client = openai.OpenAI(base_url=server.root, api_key="x", max_retries=0, timeout=60)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        chats = [pool.submit(client.chat.completions.create, model="tiny", max_tokens=8,
                             messages=[{"role": "user", "content": f"hi {i}"}], extra_body={"ignore_eos": True})
                 for i in range(3)]
        embeds = [pool.submit(client.embeddings.create, model="tiny", input=[t] * 3) for t in TEXTS]
        assert all(c.result().usage.completion_tokens == 8 for c in chats)
        assert all(len(e.result().data) == 3 for e in embeds)


@pytest.mark.parametrize("body, param", [({"input": []}, "input"), ({"input": [10**9]}, "input.0"),
                                         ({"input": "x", "dimensions": 8}, "dimensions")])
def test_bad_embedding_requests(server, body, param):
    r = httpx.post(server.base_url + "/embeddings", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
