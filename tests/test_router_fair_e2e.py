"""Fair share and priority preemption in the router, for a `url:` peer (a second 1bit server) and our
engine alike: a front 1bit server with one url slot and one native slot. Requests wait only in the
front's router, so its fair line and `--priority-preempt` decide; order and text are asserted,
never time."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from server_utils import queue_users, start_server, stop_server, wait_for, wait_idle

LONG_TOKENS = 300  # the preemption test's long streams: far longer than the urgent request


@pytest.fixture(scope="module")
def front(tiny_model_dir):
    """The front, with --priority-preempt: a url backend of 1 slot on a peer 1bit server, then a
    native backend of 1 slot (our engine never sees a request wait either: the router preempts)."""
    peer = start_server(tiny_model_dir, "--device", "cpu", "--ctx-size", "1024", "--parallel", "1", "--alias", "tiny")
    try:
        server = start_server(tiny_model_dir, "--backend", f"url:{peer.root}?slots=1", "--backend",
                              "native:cpu?slots=1", "--priority-preempt", "--ctx-size", "1024", "--alias", "tiny",
                              "--backend-timeout", "10")
        try:
            yield server
        finally:
            stop_server(server)
    finally:
        stop_server(peer)


def client(server) -> openai.AsyncOpenAI:
    """An async OpenAI client (no retries)."""
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_url_and_native_slots_are_shared_fairly_and_show_who_waits(front):
    """Alice queues 6 long requests on the two slots (url, native), then Bob one short one: Bob finishes before
    Alice's 4th (first come first served: after all 6). While Alice waits, /queue shows her waiting
    requests and /slots names her on both slots."""
    async def main():
        await wait_idle(front)
        c = client(front)
        done: list[str] = []

        async def one(user: str, i: int, max_tokens: int) -> None:
            await c.completions.create(model="tiny", prompt=f"burst {i}", max_tokens=max_tokens, temperature=0,
                                       user=user, extra_body={"ignore_eos": True})
            done.append(user)

        burst = [asyncio.create_task(one("alice", i, 150)) for i in range(6)]
        await wait_for(lambda: queue_users(front).get("alice", {}).get("waiting", 0) >= 3, "alice's burst queued")
        seen_queue = queue_users(front)["alice"]
        # /slots shows each worker's last report (every 50 ms): wait for both to have reported Alice.
        await wait_for(lambda: _busy_slots(front) == [("remote-0", "alice"), ("native-1", "alice")],
                       "both slots reported busy with alice")
        await one("bob", 0, 5)
        before_bob = done[:done.index("bob")].count("alice")
        for task in burst:
            task.cancel()
        await asyncio.gather(*burst, return_exceptions=True)
        return before_bob, seen_queue

    before_bob, seen_queue = asyncio.run(main())
    assert before_bob < 4
    assert seen_queue["running"] == 2 and seen_queue["waiting"] >= 3


def _busy_slots(server) -> list[tuple[str, str]]:
    """(backend, user) of each /slots entry that is processing."""
    return [(s["backend"], s["user"]) for s in httpx.get(f"{server.root}/slots", timeout=10).json() if s["is_processing"]]


async def _stream(c: openai.AsyncOpenAI, prompt: str, chunks: list[str], **extra) -> tuple[str, object]:
    """Stream a greedy completion of LONG_TOKENS tokens; every text chunk goes to `chunks` as it comes."""
    stream = await c.completions.create(model="tiny", prompt=prompt, max_tokens=LONG_TOKENS, temperature=0,
                                        stream=True, stream_options={"include_usage": True}, user="alice",
                                        extra_body={"ignore_eos": True, **extra})
    usage = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            chunks.append(chunk.choices[0].text)
        usage = chunk.usage or usage
    return "".join(chunks), usage


def _preempted(server) -> list[int]:
    """Requests preempted so far on each backend (/props)."""
    return [b["preempted"] for b in httpx.get(f"{server.root}/props", timeout=10).json()["backends"]]


async def _preempt_one(server, priorities: tuple[int, int]):
    """Alice's two long streams, started in order (the first lands on the url slot, the second on the
    native one) with these priorities, then her priority -1 request. Returns the undisturbed runs, the
    disturbed ones, the completion order, the urgent response and the preemptions per backend."""
    prompts = ["the first long story", "the second long story"]
    await wait_idle(server)
    c = client(server)
    reference = await asyncio.gather(*(_stream(c, p, []) for p in prompts))
    await wait_idle(server)
    before = _preempted(server)
    done: list[str] = []
    chunks: list[list[str]] = [[] for _ in prompts]

    async def long(i: int):
        out = await _stream(c, prompts[i], chunks[i], priority=priorities[i])
        done.append(f"long{i}")
        return out

    tasks = []
    for i in range(len(prompts)):
        tasks.append(asyncio.create_task(long(i)))
        await wait_for(lambda: len(chunks[i]) >= 3, f"stream {i} streaming")
    urgent = await c.completions.create(model="tiny", prompt="urgent", max_tokens=5, temperature=0,
                                        user="alice", extra_body={"priority": -1, "ignore_eos": True})
    done.append("urgent")
    results = await asyncio.gather(*tasks)
    preempted = [after - b for after, b in zip(_preempted(server), before)]
    return reference, results, done, urgent, preempted


def _assert_whole_after_preemption(outcome, victim_backend: int) -> None:
    """The urgent request finished first; exactly one request was preempted, on this backend; every
    long stream has the undisturbed text and usage."""
    reference, results, done, urgent, preempted = outcome
    assert urgent.usage.completion_tokens == 5
    assert done[0] == "urgent" and sorted(done[1:]) == ["long0", "long1"]
    assert preempted == [1 if i == victim_backend else 0 for i in range(2)]
    for (ref_text, ref_usage), (text, usage) in zip(reference, results):
        assert text == ref_text and len(ref_text) > 0
        assert usage.completion_tokens == ref_usage.completion_tokens == LONG_TOKENS
        assert usage.prompt_tokens == ref_usage.prompt_tokens


def test_priority_preempts_the_same_users_url_request_and_its_stream_continues_whole(front):
    """The url slot runs Alice's priority-9 stream, the native slot her priority-5 one: her priority -1
    request takes the url slot (the largest priority value yields) and finishes first; the preempted
    stream waits, continues from what it sent, and its text equals an undisturbed greedy run."""
    _assert_whole_after_preemption(asyncio.run(_preempt_one(front, (9, 5))), victim_backend=0)


def test_priority_preempts_on_the_native_backend_too(front):
    """Equal priorities: the later started stream (native) yields, and resumes from its text state."""
    _assert_whole_after_preemption(asyncio.run(_preempt_one(front, (5, 5))), victim_backend=1)
