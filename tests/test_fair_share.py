"""Many users on one server: fair share of slots, per-key limits, requests that can never fit,
the /queue view and queued-position comments. One real server (`--parallel 2`) with a key file."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.server_utils import queue_users, running_server, wait_for, wait_idle

KEYS = """\
# KEY NAME [limits]
key-alice alice
key-bob   bob
key-carol carol max_concurrent=1
key-dave  dave  tpm=40
key-erin  erin  max_queued=1
"""
MAX_QUEUE = 16
LONG = {"max_tokens": 150, "extra_body": {"ignore_eos": True}, "temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """One server: 2 slots, a key file, at most 16 waiting, 4 prompts per request."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(KEYS)
    with running_server(tiny_model_dir, "--parallel", "2", "--ctx-size", "512", "--alias", "tiny",
                        "--api-key-file", str(keys), "--max-queue", str(MAX_QUEUE),
                        "--max-prompts-per-request", "4") as srv:
        yield srv


def client(server, key: str) -> openai.AsyncOpenAI:
    """An async OpenAI client with this key (no retries: the test sees every 429)."""
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def sync_client(server, key: str) -> openai.OpenAI:
    """A sync OpenAI client with this key."""
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def queue_view(server) -> dict:
    """GET /queue as {user: row}."""
    return queue_users(server, "key-alice")


def test_light_user_is_not_stuck_behind_a_burst(server):
    """Alice sends 12 requests of 150 tokens, then Bob one of 5: Bob finishes before Alice's 4th does."""
    async def main():
        await wait_idle(server, "key-alice")
        alice, bob = client(server, "key-alice"), client(server, "key-bob")
        done: list[str] = []

        async def one(c, name, i, **kw):
            out = await c.completions.create(model="tiny", prompt=f"burst {i}", **kw)
            done.append(name)
            return out

        burst = [asyncio.create_task(one(alice, "alice", i, **LONG)) for i in range(12)]
        # Bob arrives while Alice's burst waits (at most one of hers has finished).
        await wait_for(lambda: queue_view(server).get("alice", {}).get("waiting", 0) >= 9, "alice's burst queued")
        light = await one(bob, "bob", 0, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        assert light.usage.completion_tokens == 5
        alice_done_before_bob = done[:done.index("bob")].count("alice")
        for task in burst:
            task.cancel()
        await asyncio.gather(*burst, return_exceptions=True)
        return alice_done_before_bob

    alice_done_before_bob = asyncio.run(main())
    assert alice_done_before_bob < 4


def test_two_backlogged_users_take_turns(server):
    """Alice queues 6 equal requests, then Bob 6: from Bob's arrival on, completions alternate
    between them (FIFO would finish all of Alice's waiting requests first)."""
    async def main():
        await wait_idle(server, "key-alice")
        alice, bob = client(server, "key-alice"), client(server, "key-bob")
        done: list[str] = []
        kw = {"max_tokens": 40, "temperature": 0, "extra_body": {"ignore_eos": True}}

        async def one(c, name, i):
            await c.completions.create(model="tiny", prompt=f"turn {i}", **kw)
            done.append(name)

        before = queue_view(server).get("alice", {}).get("requests", 0)

        def alice_all_in():
            row = queue_view(server).get("alice", {})
            return row.get("requests", 0) - before + row.get("waiting", 0) == 6

        tasks = [asyncio.create_task(one(alice, "alice", i)) for i in range(6)]
        await wait_for(alice_all_in, "alice's 6 requests in")
        arrived = len(done)
        tasks += [asyncio.create_task(one(bob, "bob", i)) for i in range(6)]
        await asyncio.gather(*tasks)
        return done, arrived

    done, arrived = asyncio.run(main())
    assert sorted(done) == ["alice"] * 6 + ["bob"] * 6
    assert arrived <= 2, "the burst was not in line when Bob came (the test needs that)"
    # Alice's (at most 2) running requests finish first; then Bob gets slots as soon as they free.
    assert done[arrived + 2:arrived + 6].count("bob") >= 2
    # (How many turns Bob takes in a row afterwards depends on how far ahead Alice was when he came,
    # a matter of timing, so the order at the very end is not asserted.)


def test_queue_and_metrics_show_users_not_texts(server):
    """/queue lists user names with counts; /metrics has per-user served tokens and waiting time."""
    sync_client(server, "key-bob").completions.create(model="tiny", prompt="secret words", max_tokens=3)
    body = httpx.get(f"{server.root}/queue", headers={"Authorization": "Bearer key-bob"}, timeout=10).json()
    assert body["fair_share"] is True and body["total_slots"] == 2
    rows = {row["user"]: row for row in body["users"]}
    assert rows["bob"]["tokens_served"] > 0 and rows["bob"]["requests"] >= 1
    assert "secret" not in str(body)
    text = httpx.get(f"{server.root}/metrics", headers={"Authorization": "Bearer key-bob"}, timeout=10).text
    assert 'onebit:user_tokens_served_total{user="bob"}' in text
    assert 'onebit:user_queue_wait_seconds_total{user="bob"}' in text


def test_slots_name_the_user_of_each_running_request(server):
    """While Carol's request runs, its slot in /slots says `user: carol`."""
    async def main():
        await wait_idle(server, "key-alice")
        carol = client(server, "key-carol")
        stream = await carol.completions.create(model="tiny", prompt="slot owner", stream=True, **LONG)
        async for _ in stream:
            break
        slots = httpx.get(f"{server.root}/slots", headers={"Authorization": "Bearer key-carol"}, timeout=10).json()
        await stream.close()
        return slots

    slots = asyncio.run(main())
    assert [s.get("user") for s in slots if s["is_processing"]] == ["carol"]


def test_over_max_concurrent_is_429_with_retry_after(server):
    """Carol may have one request at once: a second while the first streams is a 429."""
    async def main():
        await wait_idle(server, "key-alice")
        carol = client(server, "key-carol")
        stream = await carol.completions.create(model="tiny", prompt="first", stream=True, **LONG)
        async for _ in stream:
            break
        try:
            with pytest.raises(openai.RateLimitError) as caught:
                await carol.completions.create(model="tiny", prompt="second", max_tokens=2)
        finally:
            await stream.close()
        return caught.value

    error = asyncio.run(main())
    assert error.status_code == 429
    assert int(error.response.headers["retry-after"]) >= 1
    body = error.response.json()["error"]
    assert body["type"] == "rate_limit_error" and body["code"] == "rate_limit_exceeded"
    assert "carol" in body["message"]


def test_over_tokens_per_minute_is_429_until_the_window_passes(server):
    """Dave may use 40 tokens a minute: a request of about 50 passes, the next is a 429 whose
    Retry-After is within the minute."""
    dave = sync_client(server, "key-dave")
    first = dave.completions.create(model="tiny", prompt="count me", max_tokens=40,
                                    extra_body={"ignore_eos": True})
    assert first.usage.total_tokens > 40
    with pytest.raises(openai.RateLimitError) as caught:
        dave.completions.create(model="tiny", prompt="again", max_tokens=2)
    assert 1 <= int(caught.value.response.headers["retry-after"]) <= 60


def test_over_max_queued_is_429(server):
    """Erin may have one request waiting: with both slots taken, her second waiting one is a 429."""
    async def main():
        await wait_idle(server, "key-alice")
        alice, erin = client(server, "key-alice"), client(server, "key-erin")
        # As long as the context allows, so the slots stay taken while Erin's requests arrive (150
        # tokens once ran out on a fast host under load); cancelled at the end, so it costs no time.
        hold = [asyncio.create_task(alice.completions.create(model="tiny", prompt=f"hold {i}",
                                                             **{**LONG, "max_tokens": 480}))
                for i in range(2)]
        await wait_for(lambda: queue_view(server).get("alice", {}).get("running", 0) == 2, "slots taken")
        waiting = asyncio.create_task(erin.completions.create(model="tiny", prompt="wait", max_tokens=2))
        await wait_for(lambda: queue_view(server).get("erin", {}).get("waiting", 0) == 1, "erin waiting")
        try:
            with pytest.raises(openai.RateLimitError):
                await erin.completions.create(model="tiny", prompt="too many", max_tokens=2)
        finally:
            for task in (*hold, waiting):
                task.cancel()
            await asyncio.gather(*hold, waiting, return_exceptions=True)

    asyncio.run(main())


@pytest.mark.parametrize("kwargs, param", [
    ({"prompt": "x", "max_tokens": 2, "n": MAX_QUEUE + 3}, "n"),
    ({"prompt": ["a", "b", "c", "d", "e"], "max_tokens": 2}, "prompt"),
    ({"prompt": "x", "max_tokens": 600}, "max_tokens"),
])
def test_a_request_that_can_never_fit_is_400_at_once(server, kwargs, param):
    """More choices than slots plus queue, more prompts than allowed, or prompt + max_tokens past
    the context: a 400 naming the field, never a 503."""
    with pytest.raises(openai.BadRequestError) as caught:
        sync_client(server, "key-bob").completions.create(model="tiny", **kwargs)
    assert caught.value.response.json()["error"]["param"] == param


def test_a_waiting_stream_is_told_its_place(server):
    """With both slots busy, a stream's first lines are a `: queued position N` comment; the
    OpenAI client ignores it and reads the stream whole."""
    async def main():
        await wait_idle(server, "key-alice")
        alice = client(server, "key-alice")
        hold = [asyncio.create_task(alice.completions.create(model="tiny", prompt=f"hold {i}", **LONG))
                for i in range(2)]
        await wait_for(lambda: queue_view(server).get("alice", {}).get("running", 0) == 2, "slots taken")
        lines = []
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "stream": True}
        async with httpx.AsyncClient(timeout=120) as http:
            async with http.stream("POST", f"{server.base_url}/completions", json=body,
                                   headers={"Authorization": "Bearer key-bob"}) as response:
                async for line in response.aiter_lines():
                    if line:
                        lines.append(line)
        for task in hold:
            task.cancel()
        await asyncio.gather(*hold, return_exceptions=True)
        return lines

    lines = asyncio.run(main())
    assert lines[0] == ": queued position 1"
    assert lines[-1] == "data: [DONE]"


def test_props_shows_the_model_name_not_its_path(server, tiny_model_dir):
    """/props names the model; its directory stays private without --props-show-path."""
    props = httpx.get(f"{server.root}/props", headers={"Authorization": "Bearer key-bob"}, timeout=10).json()
    assert props["model_path"] == "tiny"
    assert str(tiny_model_dir) not in str(props)


def test_a_request_without_a_known_key_is_401(server):
    """The key file's keys are the only ones."""
    with pytest.raises(openai.AuthenticationError):
        sync_client(server, "key-mallory").completions.create(model="tiny", prompt="x", max_tokens=2)


def test_priority_orders_one_users_waiting_requests(server):
    """Alice's two waiting requests: the one with the lower `priority` value gets the next slot."""
    async def main():
        await wait_idle(server, "key-alice")
        alice = client(server, "key-alice")
        done: list[str] = []

        async def one(name, priority):
            await alice.completions.create(model="tiny", prompt=name, max_tokens=5,
                                           extra_body={"priority": priority, "ignore_eos": True})
            done.append(name)

        # The holds are cancelled, never run to the end: long enough that neither ends while the test sets up.
        hold_kw = {**LONG, "max_tokens": 480}
        hold = [asyncio.create_task(alice.completions.create(model="tiny", prompt=f"hold {i}", **hold_kw))
                for i in range(2)]
        await wait_for(lambda: queue_view(server).get("alice", {}).get("running", 0) == 2, "slots taken")
        later = asyncio.create_task(one("later", 5))
        await wait_for(lambda: queue_view(server)["alice"]["waiting"] == 1, "first waiting")
        sooner = asyncio.create_task(one("sooner", -1))
        await wait_for(lambda: queue_view(server)["alice"]["waiting"] == 2, "both waiting")
        hold[0].cancel()  # one slot frees; the other stays busy until the end
        await asyncio.gather(later, sooner)
        hold[1].cancel()
        await asyncio.gather(*hold, return_exceptions=True)
        return done

    assert asyncio.run(main()) == ["sooner", "later"]
