"""Process lifecycle: 503 while loading, load failures, worker death, SIGTERM, kill -9 leaves no orphan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
from server_utils import REPO_ROOT, pid_alive, start_server, stop_server, wait_healthy


def _wait_dead(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def _read_sse(server, body: dict, events: list, started: threading.Event) -> None:
    """Collect raw SSE payloads of one streaming completion into `events`."""
    try:
        with httpx.stream("POST", f"{server.root}/v1/completions", json=body, timeout=60) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
    except httpx.HTTPError as error:
        events.append(f"transport error: {error}")
    started.set()


def _start_stream(server, max_tokens: int):
    events: list[str] = []
    started = threading.Event()
    body = {"prompt": "long story", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    thread = threading.Thread(target=_read_sse, args=(server, body, events, started), daemon=True)
    thread.start()
    assert started.wait(30)
    return thread, events


def _assert_broken_stream(events: list[str]) -> None:
    assert events and events[-1] != "[DONE]", events[-3:]
    last = json.loads(events[-1])
    assert set(last["error"]) >= {"message", "type", "param", "code"}
    finishes = [c.get("finish_reason") for e in events[:-1] for c in json.loads(e).get("choices", [])]
    assert not any(finishes), "a broken stream must not carry a finish_reason"


def test_health_503_while_loading_then_kill9_leaves_no_worker(tiny_model_dir):
    server = start_server(tiny_model_dir, "--ctx-size", "256", wait=False)
    try:
        statuses = set()
        deadline = time.monotonic() + 60
        while 200 not in statuses and time.monotonic() < deadline:
            try:
                resp = httpx.get(f"{server.root}/health", timeout=2)
                statuses.add(resp.status_code)
                if resp.status_code == 503:
                    assert resp.json()["error"]["type"] == "unavailable_error"
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        assert statuses == {503, 200}
        workers = server.children()
        assert httpx.get(f"{server.root}/props").json()["backends"][0]["pid"] in workers
        thread, _ = _start_stream(server, 200)  # a busy worker must die too
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        assert _wait_dead(workers) == []
    finally:
        stop_server(server)


def test_sigterm_ends_streams_with_error_and_exits_0(tiny_model_dir):
    server = start_server(tiny_model_dir, "--ctx-size", "4096")
    try:
        workers = server.children()
        thread, events = _start_stream(server, 4000)
        time.sleep(0.2)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(10)
        assert code == 0 and time.monotonic() - t0 < 10
        thread.join(10)
        _assert_broken_stream(events)
        assert _wait_dead(workers) == []
    finally:
        stop_server(server)


def test_worker_death_moves_streams_to_the_restarted_worker(tiny_model_dir):
    """A killed worker's stream continues on the restarted one (migration): it ends with [DONE],
    no error event and every token it asked for; the worker comes back under a new pid."""
    server = start_server(tiny_model_dir, "--ctx-size", "4096")
    try:
        worker = httpx.get(f"{server.root}/props").json()["backends"][0]["pid"]
        assert worker in server.children()
        thread, events = _start_stream(server, 1000)
        os.kill(worker, signal.SIGKILL)
        thread.join(240)
        assert not thread.is_alive() and events and events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks)
        finishes = [c["finish_reason"] for chunk in chunks for c in chunk.get("choices", []) if c["finish_reason"]]
        assert finishes == ["length"]
        assert httpx.get(f"{server.root}/health").status_code == 200
        again = httpx.get(f"{server.root}/props").json()["backends"][0]["pid"]
        assert again != worker and again in server.children()
        assert stop_server(server) == 0
    finally:
        stop_server(server)


def _serve_fails(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onebit.cli", "serve", "--port", "1", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TQDM_DISABLE": "1"})


def test_missing_model_is_a_clear_error(tmp_path):
    result = _serve_fails("-m", str(tmp_path / "nope"))
    assert result.returncode != 0
    assert "error" in result.stderr and "Traceback" not in result.stderr


def test_broken_model_dir_fails_in_the_worker_cleanly(tmp_path, tiny_model_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    (broken / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"], "model_type": "nope"}))
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    port = str(_free_port())
    result = subprocess.run([sys.executable, "-m", "onebit.cli", "serve", "-m", str(broken), "--port", port],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    assert result.returncode == 1, result.stderr
    assert "could not load model" in result.stderr and "Traceback" not in result.stderr


def _free_port() -> int:
    from server_utils import free_port

    return free_port()


def test_wait_healthy_reports_exit(tmp_path):
    server = start_server(tmp_path / "nope", wait=False)
    try:
        wait_healthy(server, timeout=60)
    except RuntimeError as error:
        assert "exited" in str(error)
    else:
        raise AssertionError("a server without a model must not become healthy")
    finally:
        stop_server(server)
