"""`--adaptive` on one device is one engine: one worker process, one copy of the weights, one KV pool;
it drafts while at most --adaptive-at requests run and takes plain batched steps above. Its greedy
output is the plain engine's (same weights, no drafting)."""

from __future__ import annotations

import time

import httpx
import pytest
from kill_mid_stream import completion_body, run_streams
from server_utils import start_server, stop_server

AT, OVERFLOW = 2, 4
COMMON = ("--device", "cpu", "--ctx-size", "512", "--alias", "tiny")


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    server = start_server(tiny_model_dir, *COMMON, "--adaptive", "--adaptive-at", str(AT), "--adaptive-slots",
                          str(OVERFLOW), "--ngram")
    try:
        yield server
    finally:
        stop_server(server)


def _engine_workers(server) -> list[int]:
    """The server's children that run an engine (multiprocessing's spawned workers; its resource
    tracker, also a child, is not one)."""
    out = []
    for pid in server.children():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "spawn_main" in cmdline:
            out.append(pid)
    return out


def test_one_worker_one_backend_with_all_the_slots(server):
    adaptive = server
    (backend,) = httpx.get(f"{adaptive.root}/props", timeout=10).json()["backends"]
    assert (backend["name"], backend["kind"], backend["capacity"]) == ("native-0", "native", AT + OVERFLOW)
    assert _engine_workers(adaptive) == [backend["pid"]]  # the weights are loaded in this one process only
    slots = httpx.get(f"{adaptive.root}/slots", timeout=10).json()
    assert [s["id"] for s in slots] == list(range(AT + OVERFLOW))


def _regimes_seen(server, n_streams: int) -> set[str]:
    """The regimes /slots shows for busy slots while `n_streams` long greedy streams run."""
    import threading

    seen: set[str] = set()
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            for slot in httpx.get(f"{server.root}/slots", timeout=10).json():
                if slot["is_processing"]:
                    seen.add(slot["regime"])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = run_streams(server.root, [completion_body(f"slot {i}", 200) for i in range(n_streams)])
    finally:
        stop.set()
        watcher.join()
    assert all(r.done and r.usage["completion_tokens"] == 200 for r in results)
    return seen


def test_slots_show_the_regime_by_load(server):
    adaptive = server
    assert _regimes_seen(adaptive, AT) == {"speculative"}  # never more than --adaptive-at running
    assert "batch" in _regimes_seen(adaptive, AT + OVERFLOW)


def test_greedy_output_equals_the_plain_engine(server, tiny_model_dir):
    from onebit.engine.llm import LLM
    from onebit.protocol import SamplingParams

    prompts = [[100 + i, 200, 300 + 7 * i, 42] for i in range(AT + OVERFLOW)]
    streams = run_streams(server.root, [completion_body(p, 60) for p in prompts])
    assert all(r.done and r.usage["completion_tokens"] == 60 for r in streams)
    plain = LLM(str(tiny_model_dir), device="cpu", parallel=AT + OVERFLOW, ctx_size=512)
    expected = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    assert [r.text for r in streams] == [o.text for o in expected]
