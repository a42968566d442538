"""Fair share and priority preemption for backends that are not our engine: a front 1bit server whose
two backends are `url:` peers (one slot each) on a second 1bit server. Requests wait only in the
front's router, so its fair line and `--priority-preempt` decide; order and text are asserted,
never time."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from server_utils import start_server, stop_server

LONG_TOKENS = 300  # the preemption test's long streams: far longer than the urgent request


@pytest.fixture(scope="module")
def front(tiny_model_dir):
    """The front (2 url backends of 1 slot each, --priority-preempt) on a peer with 2 slots."""
    peer = start_server(tiny_model_dir, "--device", "cpu", "--ctx-size", "1024", "--parallel", "2", "--alias", "tiny")
    try:
        url = f"url:{peer.root}?slots=1"
        server = start_server(tiny_model_dir, "--backend", url, "--backend", url, "--priority-preempt",
                              "--ctx-size", "1024", "--alias", "tiny", "--backend-timeout", "10")
        try:
            yield server
        finally:
            stop_server(server)
    finally:
        stop_server(peer)


def client(server) -> openai.AsyncOpenAI:
    """An async OpenAI client (no retries)."""
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def queue(server) -> dict:
    """GET /queue."""
    return httpx.get(f"{server.root}/queue", timeout=10).json()


def users(server) -> dict:
    """/queue's rows by user."""
    return {row["user"]: row for row in queue(server)["users"]}


async def wait_for(predicate, what: str, limit_s: float = 60) -> None:
    """Poll until `predicate()` holds (a guard against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


async def idle(server) -> None:
    """Nothing running or waiting."""
    await wait_for(lambda: all(r["running"] + r["waiting"] == 0 for r in users(server).values()), "idle")


def test_url_backends_share_slots_fairly_and_show_who_waits(front):
    """Alice queues 6 long requests on the two url slots, then Bob one short one: Bob finishes before
    Alice's 4th (first come first served: after all 6). While Alice waits, /queue shows her waiting
    requests and /slots names her on both url slots."""
    async def main():
        await idle(front)
        c = client(front)
        done: list[str] = []

        async def one(user: str, i: int, max_tokens: int) -> None:
            await c.completions.create(model="tiny", prompt=f"burst {i}", max_tokens=max_tokens, temperature=0,
                                       user=user, extra_body={"ignore_eos": True})
            done.append(user)

        burst = [asyncio.create_task(one("alice", i, 150)) for i in range(6)]
        await wait_for(lambda: users(front).get("alice", {}).get("waiting", 0) >= 3, "alice's burst queued")
        seen_queue = users(front)["alice"]
        seen_slots = httpx.get(f"{front.root}/slots", timeout=10).json()
        await one("bob", 0, 5)
        before_bob = done[:done.index("bob")].count("alice")
        for task in burst:
            task.cancel()
        await asyncio.gather(*burst, return_exceptions=True)
        return before_bob, seen_queue, seen_slots

    before_bob, seen_queue, seen_slots = asyncio.run(main())
    assert before_bob < 4
    assert seen_queue["running"] == 2 and seen_queue["waiting"] >= 3
    assert [(s["backend"], s["user"]) for s in seen_slots if s["is_processing"]] == [("remote-0", "alice"),
                                                                                    ("remote-1", "alice")]


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


def test_priority_preempts_a_url_request_of_the_same_user_and_its_stream_continues_whole(front):
    """Both url slots run Alice's priority-5 streams; her priority -1 request takes the later one's slot
    and finishes first; the preempted stream waits, continues from what it sent, and its text equals
    an undisturbed greedy run (no error, nothing repeated or missing)."""
    prompts = ["the first long story", "the second long story"]

    async def main():
        await idle(front)
        c = client(front)
        reference = await asyncio.gather(*(_stream(c, p, []) for p in prompts))
        await idle(front)
        before = queue(front)["preemptions"]
        done: list[str] = []
        chunks: list[list[str]] = [[], []]

        async def long(i: int):
            out = await _stream(c, prompts[i], chunks[i], priority=5)
            done.append(f"long{i}")
            return out

        first = asyncio.create_task(long(0))
        await wait_for(lambda: chunks[0], "the first stream streaming")
        second = asyncio.create_task(long(1))
        await wait_for(lambda: len(chunks[1]) >= 3, "the second stream streaming")
        urgent = await c.completions.create(model="tiny", prompt="urgent", max_tokens=5, temperature=0,
                                            user="alice", extra_body={"priority": -1, "ignore_eos": True})
        done.append("urgent")
        results = await asyncio.gather(first, second)
        return reference, results, done, urgent, queue(front)["preemptions"] - before

    reference, results, done, urgent, preemptions = asyncio.run(main())
    assert urgent.usage.completion_tokens == 5
    assert done[0] == "urgent" and sorted(done[1:]) == ["long0", "long1"]
    assert preemptions == 1
    for (ref_text, ref_usage), (text, usage) in zip(reference, results):
        assert text == ref_text and len(ref_text) > 0
        assert usage.completion_tokens == ref_usage.completion_tokens == LONG_TOKENS
        assert usage.prompt_tokens == ref_usage.prompt_tokens
