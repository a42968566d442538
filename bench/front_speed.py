"""How many tokens/s the HTTP front and the load generator can carry, with no model behind them.

    PYTHONPATH=. python3 bench/front_speed.py [--concurrency 1,8,32,64] [--step-ms 2] [--out DIR]
        [--endpoint completions|chat] [--profile FILE] [--in-process [--requests N]]

Serves the real app (FastAPI, router, SSE, usage) over an instant backend: one step every
--step-ms emits one token for every active request, like a batched decode step that costs
nothing. `1bit bench` then measures it exactly as it measures a real server. Whatever tok/s it
reports is the ceiling the Python front plus the Python client impose on this machine; a real
server cannot exceed it. A measuring instrument only: the backend here is a fake.

Last it prints where the CPU went, per SSE event carrying text: the server process's CPU (from
the first level's start to the last level's end, the instant backend's ticks included) and the
bench client processes' CPU. `--profile FILE` also writes a cProfile of the server over the same
window (read it with `python3 -m pstats FILE`).

`--in-process` leaves out uvicorn, the sockets and the client: C tasks call the app (ASGI) straight,
closed loop, and the app's CPU per event is the process's CPU over the events it sent (the instant
backend's ticks included). It is steadier than the CPU of a served run on a busy machine, so it
is the figure to compare two versions of the app by.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import glob
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from onebit.backends.base import Backend, EngineStats, GenerateRequest, StepDelta, coalesced


class InstantBackend(Backend):
    """Emits one token per tick for every active request (a request ends at its max_tokens),
    delivered like the native backend's: a stream that fell behind gets its steps merged."""

    kind = "instant"

    def __init__(self, capacity: int, step_s: float):
        self.name, self.capacity, self.step_s = "instant-0", capacity, step_s
        self.active: dict[str, tuple[asyncio.Queue, int, int]] = {}
        self.counts: dict[str, int] = {}
        self._ticker: asyncio.Task | None = None
        self._state = "loading"

    @property
    def state(self) -> str:
        return self._state

    async def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick())
        self._state = "ready"

    async def stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
        self._state = "stopped"

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            for rid, (queue, n_prompt, limit) in list(self.active.items()):
                done = self.counts[rid] = self.counts.get(rid, 0) + 1
                last = done == limit
                queue.put_nowait(StepDelta(rid, [65], " x", finished=last, finish_reason="length" if last else None,
                                           num_prompt_tokens=n_prompt, num_output_tokens=done))
                if last:
                    del self.active[rid], self.counts[rid]

    async def generate(self, request: GenerateRequest):
        """Stream through the same coalescing queue reader the native backend uses."""
        self._check_admissible(request.request_id, self.active)
        queue: asyncio.Queue = asyncio.Queue()
        self.active[request.request_id] = (queue, len(request.prompt_token_ids), request.params.max_tokens or 16)
        try:
            async for delta in coalesced(queue):
                yield delta
        finally:
            self.active.pop(request.request_id, None)
            self.counts.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        pass

    def slots(self):
        return []

    def info(self) -> dict:
        return {**super().info(), "n_ctx": 4096}

    def stats(self):
        return EngineStats(num_running=len(self.active))


CPU_PATH = "/_front_speed/cpu"  # the instrument's own route: the server's CPU seconds so far


def serve(port: int, capacity: int, step_s: float, profile: str | None = None) -> None:
    """Run the real app over an InstantBackend until killed. With `profile`, the first GET of
    CPU_PATH starts a cProfile of the server and the second writes it to that file."""
    from onebit.api.app import create_app
    from onebit.api.server import make_server, run_server
    from onebit.models.default_model import default_model_dir
    from onebit.models.tokenizer import Tokenizer
    from onebit.router import Router
    model = default_model_dir()
    app = create_app(Router([InstantBackend(capacity, step_s)]), model_name="instant", model_path=str(model),
                     load_tokenizer=lambda: Tokenizer.from_dir(model))
    profiler = cProfile.Profile() if profile else None
    calls = 0

    @app.get(CPU_PATH, include_in_schema=False)
    async def cpu() -> dict:
        nonlocal calls
        calls += 1
        if profiler is not None and calls == 1:
            profiler.enable()
        elif profiler is not None and calls == 2:
            profiler.disable()
            profiler.dump_stats(profile)
        return {"cpu_s": time.process_time()}

    run_server(make_server(app, "127.0.0.1", port, "warning"))


def _server_cpu(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{CPU_PATH}", timeout=30) as reply:
        return json.load(reply)["cpu_s"]


def cpu_table(out: str, label: str, server_cpu_s: float) -> list[str]:
    """Lines of the CPU table: server and client CPU per SSE event carrying text, over every level."""
    run = json.load(open(Path(out) / f"{label}.json"))
    events = tokens = 0
    client_s = 0.0
    for level in run["levels"]:
        events += sum(len(r["chunk_times"]) for r in level["requests"])
        tokens += sum(r["completion_tokens"] or 0 for r in level["requests"])
        client_s += level["client"]["cpu_s"] or 0.0
    if not events:
        return ["no events"]
    return ["| process | CPU s | us per event | us per token |", "|---|---:|---:|---:|",
            f"| server (front + instant backend) | {server_cpu_s:.2f} | {server_cpu_s / events * 1e6:.1f} | "
            f"{server_cpu_s / tokens * 1e6:.1f} |",
            f"| bench client (all processes) | {client_s:.2f} | {client_s / events * 1e6:.1f} | "
            f"{client_s / tokens * 1e6:.1f} |",
            f"({events} events carrying text, {tokens} tokens)"]


async def in_process(concurrency: int, requests: int, max_tokens: int, step_s: float, endpoint: str,
                     profile: str | None) -> dict:
    """Closed loop of `concurrency` streamed requests called straight into the app (no server):
    the process's CPU per SSE event carrying text."""
    from onebit.api.app import create_app
    from onebit.models.default_model import default_model_dir
    from onebit.models.tokenizer import Tokenizer
    from onebit.router import Router
    model = default_model_dir()
    app = create_app(Router([InstantBackend(concurrency, step_s)]), model_name="instant", model_path=str(model),
                     load_tokenizer=lambda: Tokenizer.from_dir(model))
    body = {"model": "instant", "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, "temperature": 0.0}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "hello " * 64}]
    else:
        body["prompt"] = list(range(40, 168))
    raw = json.dumps(body).encode()
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    events = tokens = 0
    ended = asyncio.Event()  # never set: a client that stays connected

    async def call(method: str, url: str, data: bytes) -> bytes:
        sent = False
        chunks: list[bytes] = []

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            await ended.wait()

        async def send(message):
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": url, "raw_path": url.encode(), "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]}
        await app(scope, receive, send)
        return b"".join(chunks)

    counter = iter(range(requests))

    async def client() -> None:
        nonlocal events, tokens
        for _ in counter:
            out = await call("POST", path, raw)
            if not out.endswith(b"data: [DONE]\n\n"):
                raise RuntimeError(f"stream did not end with [DONE]: {out[-300:]!r}")
            events += (out.count(b'"text":"') - out.count(b'"text":""')  # not the finish chunk's empty text
                       + out.count(b'"content":"'))
            tokens += int(re.search(rb'"completion_tokens":(\d+)', out).group(1))

    async with app.router.lifespan_context(app):
        while json.loads(await call("GET", "/health", b"")).get("status") != "ok":
            await asyncio.sleep(0.05)
        profiler = cProfile.Profile() if profile else None
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"events": events, "tokens": tokens, "cpu_s": cpu, "wall_s": wall,
            "us_per_event": cpu / max(events, 1) * 1e6}


def main() -> None:
    """Serve the instant backend in a child process and bench it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="out/front-speed")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--requests", type=int, default=None, help="requests per level (default: the bench's)")
    ap.add_argument("--client-procs", default="auto")
    ap.add_argument("--profile", default=None, help="write a cProfile of the server here")
    ap.add_argument("--in-process", action="store_true", help="call the app straight, no server, no client")
    ap.add_argument("--serve-port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.in_process:
        import uvicorn
        c = int(args.concurrency.split(",")[-1])
        loop_factory = uvicorn.Config(None).get_loop_factory()  # the server's: uvloop where installed
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            r = runner.run(in_process(c, args.requests or 4 * c, args.max_tokens, args.step_ms / 1000, args.endpoint,
                                      args.profile))
            loop = type(runner.get_loop()).__module__.split(".")[0]
        print(f"in process ({loop} loop), C={c}, {args.endpoint}: {r['events']} events ({r['tokens']} tokens) "
              f"in {r['wall_s']:.2f} s, "
              f"app CPU {r['cpu_s']:.2f} s = {r['us_per_event']:.1f} us per event")
        return
    if args.serve_port is not None:
        serve(args.serve_port, 512, args.step_ms / 1000, args.profile)
        return
    from onebit.bench.serve import free_port, served_command
    port = free_port()
    cmd = [sys.executable, __file__, "--serve-port", str(port), "--step-ms", str(args.step_ms)]
    if args.profile:
        cmd += ["--profile", str(Path(args.profile).resolve())]
    label = f"front-{args.step_ms}ms"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(Path(args.out) / f"{label}.*")):
        Path(stale).unlink()
    bench = [sys.executable, "-m", "onebit.cli", "bench", "--url", f"http://127.0.0.1:{port}",
             "--concurrency", args.concurrency, "--max-tokens", str(args.max_tokens),
             "--prompts", "random:128",
             "--endpoint", args.endpoint, "--client-procs", args.client_procs,
             "--label", label, "--out", args.out, "--no-progress"]
    if args.requests:
        bench += ["--requests", str(args.requests)]
    with served_command(cmd, port, Path(args.out) / "front.log", timeout_s=120, name="instant front"):
        cpu0 = _server_cpu(port)
        subprocess.run(bench, check=True)
        server_s = _server_cpu(port) - cpu0
    print("\n".join(cpu_table(args.out, label, server_s)))


if __name__ == "__main__":
    main()
