"""Streams survive their backend: kill -9 the native worker serving them mid-stream and every
stream completes on the other worker (or the restarted one) with exactly the undisturbed text."""

from __future__ import annotations

import pytest
from kill_mid_stream import completion_body, migrated_requests, run_streams
from server_utils import running_server, wait_backends_ready

ARGS = ("--adaptive", "--adaptive-at", "4", "--adaptive-slots", "4", "--backend", "native:cpu",
        "--backend", "native:cpu", "--ctx-size", "1024", "--alias", "tiny", "--backend-timeout", "10")
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with running_server(tiny_model_dir, *ARGS) as s:
        yield s


def _kill_primary_mid_stream(server, bodies: list[dict]):
    """The undisturbed streams, then the same streams with the primary killed while they run."""
    reference = run_streams(server.root, bodies)
    backends = wait_backends_ready(server)
    assert [b["in_flight"] for b in backends] == [0, 0]
    migrated = migrated_requests(server.log())
    results = run_streams(server.root, bodies, kill=backends[0]["pid"])
    # Every stream was on the primary when it died, and moved (the router logs each move).
    assert len(migrated_requests(server.log()) - migrated) == len(bodies), server.log()[-3000:]
    return reference, results


def _assert_same_complete_streams(reference, results) -> None:
    for ref, got in zip(reference, results):
        assert got.status == 200 and not got.errors and got.done, got.events[-3:]
        assert got.finish_reasons == ["length"] and got.usage["completion_tokens"] == MAX_TOKENS
        assert got.text == ref.text and ref.done and ref.usage["completion_tokens"] == MAX_TOKENS


def test_greedy_streams_survive_kill_9_of_their_worker(server):
    bodies = [completion_body(f"story number {i}", MAX_TOKENS) for i in range(4)]
    victim = wait_backends_ready(server)[0]["pid"]
    reference, results = _kill_primary_mid_stream(server, bodies)
    _assert_same_complete_streams(reference, results)
    assert len({r.text for r in reference}) == 4  # four different texts, each continued exactly
    backends = wait_backends_ready(server)
    assert backends[0]["pid"] != victim and backends[0]["restarts"] >= 1


def test_seeded_sampled_streams_continue_reproducibly(server):
    bodies = [completion_body(f"tale {i}", MAX_TOKENS, temperature=0.9, top_p=0.95, seed=100 + i) for i in range(2)]
    reference, results = _kill_primary_mid_stream(server, bodies)
    _assert_same_complete_streams(reference, results)
