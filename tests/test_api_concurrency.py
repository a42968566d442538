"""Many streams at once equal the offline engine; a cancelled stream frees its slot and KV blocks.

Every test runs against a plain server and one with overlapped steps (`--overlap`)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httpx
import pytest
from server_utils import SERVER_ARGS, openai_clients, running_server

from onebit import LLM, SamplingParams

N_STREAMS = 32


@pytest.fixture(scope="module", params=[(), ("--overlap",)], ids=["plain", "overlap"])
def server(tiny_model_dir, request):
    """One server per mode (8 slots: 32 streams also exercise the router's queue); with --overlap
    each step is queued before the last one's tokens reach the host, and nothing else may change."""
    with running_server(tiny_model_dir, *SERVER_ARGS, *request.param) as s:
        yield s


def _requests():
    """Per stream: token-id prompt, seed, max_tokens, temperature."""
    return [([(7 * i + j) % 400 + 10 for j in range(3 + i % 7)], 1000 + i, 8 + i % 9, [0.0, 0.7, 1.0][i % 3])
            for i in range(N_STREAMS)]


async def _stream_all(server) -> list[tuple[str, int, int, str]]:
    _, client = openai_clients(server)

    async def one(prompt, seed, max_tokens, temperature):
        stream = await client.completions.create(
            model="tiny", prompt=prompt, seed=seed, max_tokens=max_tokens, temperature=temperature, stream=True,
            logprobs=0, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, n_tokens, usage, finish = [], 0, None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            for choice in chunk.choices:
                text.append(choice.text)
                n_tokens += len(choice.logprobs.tokens) if choice.logprobs else 0
                finish = choice.finish_reason or finish
        return "".join(text), n_tokens, usage, finish

    try:
        return await asyncio.gather(*(one(*r) for r in _requests()))
    finally:
        await client.close()


def test_32_concurrent_streams_equal_offline(server, tiny_model_dir):
    results = asyncio.run(_stream_all(server))
    reqs = _requests()
    for (text, n_tokens, usage, finish), (_, _, max_tokens, _) in zip(results, reqs):
        assert n_tokens == usage == max_tokens
        assert finish == "length"
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=8, ctx_size=256)
    params = [SamplingParams(seed=seed, max_tokens=m, temperature=t, ignore_eos=True) for _, seed, m, t in reqs]
    offline = llm.generate([r[0] for r in reqs], params)
    assert [o.text for o in offline] == [r[0] for r in results]
    assert [len(o.token_ids) for o in offline] == [r[1] for r in results]


def _stats(server) -> dict:
    return httpx.get(f"{server.root}/props").json()["backends"][0]["stats"]


def _counter(server, name: str, **labels) -> float:
    text = httpx.get(f"{server.root}/metrics").text
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*{re.escape(label_text)}[^}}]*\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_cancelled_stream_frees_slot_and_kv_blocks(server):
    client, _ = openai_clients(server)
    aborts_before = _counter(server, "onebit:request_success_total", finished_reason="abort")
    stream = client.completions.create(model="tiny", prompt="cancel me", max_tokens=240, stream=True,
                                       extra_body={"ignore_eos": True})
    seen = 0
    for chunk in stream:
        seen += 1
        if seen == 3:
            busy = [s for s in httpx.get(f"{server.root}/slots").json() if s["is_processing"]]
            assert len(busy) == 1 and busy[0]["id_task"]
            assert _stats(server)["kv_usage"] > 0
            break
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        slots = httpx.get(f"{server.root}/slots").json()
        if not any(s["is_processing"] for s in slots) and _stats(server)["kv_usage"] == 0:
            break
        time.sleep(0.05)
    assert not any(s["is_processing"] for s in slots)
    stats = _stats(server)
    assert stats["kv_usage"] == 0 and stats["num_running"] == 0
    assert _counter(server, "onebit:request_success_total", finished_reason="abort") == aborts_before + 1
    props = httpx.get(f"{server.root}/props").json()
    assert props["backends"][0]["in_flight"] == 0


def test_disconnected_non_streaming_request_is_aborted(server):
    """A client drops a non-streaming request while it generates: the server aborts it. The client
    closes its connection once /props shows the request running (no client timeout decides when:
    on a fast host 8 x 240 tokens finished inside the 0.3 s this test used to wait)."""
    aborts_before = _counter(server, "onebit:request_success_total", finished_reason="abort")
    body = json.dumps({"prompt": "slow", "max_tokens": 240, "n": 8, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.monotonic() + 30
    while not _stats(server)["num_running"]:
        assert time.monotonic() < deadline, "the request never showed as running"
        time.sleep(0.002)
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _stats(server)["num_running"]:
        time.sleep(0.05)
    assert _stats(server)["num_running"] == 0 and _stats(server)["kv_usage"] == 0
    assert _counter(server, "onebit:request_success_total", finished_reason="abort") > aborts_before
