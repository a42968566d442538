"""The router's fair line and priority preemption with a fake backend (any kind the engine is not:
llama-server children and url peers wait and preempt only here). Order is asserted, never time."""

from __future__ import annotations

import asyncio
import contextlib

from onebit.backends.base import GenerateRequest
from onebit.engine.outputs import StepDelta
from onebit.engine.sampling_params import SamplingParams
from onebit.router import Router

from router_fakes import CountingBackend

PROMPT = [7, 7]


def _peer(capacity: int) -> CountingBackend:
    """A counting fake of a peer's kind (a url peer or a llama-server child)."""
    return CountingBackend("fake", capacity, kind="remote")


def _request(name: str, user: str, max_tokens: int, priority: int = 0) -> GenerateRequest:
    return GenerateRequest(name, list(PROMPT), SamplingParams(max_tokens=max_tokens), user=user, priority=priority)


async def _run(router: Router, request: GenerateRequest, done: list[str]) -> list[StepDelta]:
    """Stream one request to its end; record its name in `done` when it finishes."""
    ticket = router.ticket(user=request.user, priority=request.priority)
    async with contextlib.aclosing(router.stream(ticket, request).deltas()) as deltas:
        out = [delta async for delta in deltas]
    done.append(request.request_id)
    return out


def _assert_whole(deltas: list[StepDelta], max_tokens: int) -> None:
    """The client saw every position once, in order, with counts that add up."""
    tokens = [t for d in deltas for t in d.token_ids]
    assert tokens == list(range(len(PROMPT), len(PROMPT) + max_tokens))
    assert "".join(d.text for d in deltas) == "".join(f"<{t}>" for t in tokens)
    assert deltas[-1].finished and deltas[-1].num_output_tokens == max_tokens
    assert all(d.num_prompt_tokens == len(PROMPT) for d in deltas)


def _starts(backend: CountingBackend) -> list[str]:
    return [r.request_id for r in backend.requests]


def test_fair_line_serves_the_light_user_before_the_burst():
    """One slot: Alice's four requests are in line first, Bob's one comes next after her running one."""
    backend = _peer(1)
    router = Router([backend], supervisor=None)

    async def go():
        await router.start()
        done: list[str] = []
        tasks = [asyncio.create_task(_run(router, _request(f"a{i}", "alice", 5), done)) for i in range(4)]
        tasks.append(asyncio.create_task(_run(router, _request("b0", "bob", 5), done)))
        await asyncio.gather(*tasks)
        return done

    done = asyncio.run(go())
    assert _starts(backend) == done == ["a0", "b0", "a1", "a2", "a3"]
    assert router.in_flight == 0 and router.preemption is None


def test_priority_orders_one_users_line_only():
    """Alice's urgent request passes her other waiting one, not Bob's (who was served less)."""
    backend = _peer(1)
    router = Router([backend], supervisor=None)

    async def go():
        await router.start()
        done: list[str] = []
        plan = [("a0", "alice", 0), ("b0", "bob", 0), ("a1", "alice", 5), ("a2", "alice", -1), ("b1", "bob", 0)]
        await asyncio.gather(*(_run(router, _request(n, u, 5, p), done) for n, u, p in plan))
        return done

    assert asyncio.run(go()) == ["a0", "b0", "a2", "b1", "a1"]


async def _preempt_scenario(router: Router, backend: CountingBackend, urgent_user: str):
    """Alice's long priority-5 request runs; once it streamed 5 tokens, `urgent_user` sends a short
    priority -1 request. Returns (completion order, the long stream's deltas)."""
    await router.start()
    done: list[str] = []
    long_request = _request("long", "alice", 60, priority=5)
    ticket = router.ticket(user="alice", priority=5)
    long_deltas: list[StepDelta] = []

    async def long_stream():
        async with contextlib.aclosing(router.stream(ticket, long_request).deltas()) as deltas:
            async for delta in deltas:
                long_deltas.append(delta)
                if len(long_deltas) == 5:
                    urgent.set()
        done.append("long")

    urgent = asyncio.Event()
    task = asyncio.create_task(long_stream())
    await urgent.wait()
    await _run(router, _request("urgent", urgent_user, 3, priority=-1), done)
    await task
    return done, long_deltas


def test_preemption_passes_the_slot_and_the_stream_continues_whole():
    backend = _peer(1)
    router = Router([backend], supervisor=None, priority_preempt=True)
    done, deltas = asyncio.run(_preempt_scenario(router, backend, "alice"))
    assert done == ["urgent", "long"]
    _assert_whole(deltas, 60)
    assert router.preemption.preemptions == 1 and backend.aborted == 1
    assert _starts(backend) == ["long", "urgent", "long"]
    resumed = backend.requests[2]
    n = resumed.resumed.num_generated
    assert n >= 5 and resumed.prompt_token_ids == PROMPT + list(range(2, 2 + n))
    assert resumed.params.max_tokens == 60 - n and resumed.user == "alice" and resumed.priority == 5
    assert router.in_flight == 0 and router.queue_size == 0
    assert all(c.running == 0 and c.waiting == 0 for c in router.users.users.values())


def test_another_users_priority_never_preempts():
    """Bob's priority -1 does not take Alice's slot: he waits for it to end."""
    backend = _peer(1)
    router = Router([backend], supervisor=None, priority_preempt=True)
    done, deltas = asyncio.run(_preempt_scenario(router, backend, "bob"))
    assert done == ["long", "urgent"] and router.preemption.preemptions == 0 and backend.aborted == 0
    _assert_whole(deltas, 60)


def test_without_fair_share_priority_preempts_across_users():
    """One shared line (--no-fair-share): priority orders everyone's requests, so Bob's preempts."""
    backend = _peer(1)
    router = Router([backend], supervisor=None, priority_preempt=True, fair=False)
    done, deltas = asyncio.run(_preempt_scenario(router, backend, "bob"))
    assert done == ["urgent", "long"] and router.preemption.preemptions == 1
    _assert_whole(deltas, 60)


def test_without_the_flag_nothing_is_preempted():
    backend = _peer(1)
    router = Router([backend], supervisor=None)
    done, deltas = asyncio.run(_preempt_scenario(router, backend, "alice"))
    assert done == ["long", "urgent"] and backend.aborted == 0
    _assert_whole(deltas, 60)


def test_the_least_urgent_latest_running_request_yields():
    """Two slots, Alice runs priorities 1 and 7 (started in that order) and a 7 again: an urgent
    request preempts the later priority-7 one; the others run on undisturbed."""
    backend = _peer(2)
    router = Router([backend], supervisor=None, priority_preempt=True)

    async def go():
        await router.start()
        done: list[str] = []
        first = asyncio.create_task(_run(router, _request("p1", "alice", 40, 1), done))
        second = asyncio.create_task(_run(router, _request("p7", "alice", 40, 7), done))
        while len(backend.requests) < 2:
            await asyncio.sleep(0.001)
        third = asyncio.create_task(_run(router, _request("p7-later", "alice", 40, 7), done))  # waits
        await asyncio.sleep(0)
        await _run(router, _request("urgent", "alice", 3, -1), done)
        results = await asyncio.gather(first, second, third)
        return done, results

    done, results = asyncio.run(go())
    assert done[0] == "urgent"
    assert router.preemption.preemptions == 1
    preempted = [r for r in backend.requests if r.resumed is not None]
    assert [r.request_id for r in preempted] == ["p7"]
    for deltas in results:
        _assert_whole(deltas, 40)
    assert router.in_flight == 0


def test_a_peer_is_told_whose_request_it_is():
    """A url peer that shares its own slots fairly (another 1bit) gets the `user`; the anonymous
    user is not named."""
    from onebit.backends.remote_protocol import completion_body

    params = SamplingParams(max_tokens=3)
    assert completion_body(GenerateRequest("r", [1], params, user="alice"), None, "ids", None)["user"] == "alice"
    assert "user" not in completion_body(GenerateRequest("r", [1], params), None, "ids", None)
