"""How many tokens/s the HTTP front and the load generator can carry, with no model behind them.

    PYTHONPATH=. python3 bench/front_speed.py [--concurrency 1,8,32,64] [--step-ms 2] [--out DIR]

Serves the real app (FastAPI, router, SSE, usage) over an instant backend: one step every
--step-ms emits one token for every active request, like a batched decode step that costs
nothing. `1bit bench` then measures it exactly as it measures a real server. Whatever tok/s it
reports is the ceiling the Python front plus the Python client impose on this machine; a real
server cannot exceed it. A measuring instrument only: the backend here is a fake.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
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


def serve(port: int, capacity: int, step_s: float) -> None:
    """Run the real app over an InstantBackend until killed."""
    from onebit.api.app import create_app
    from onebit.api.server import make_server, run_server
    from onebit.models.default_model import default_model_dir
    from onebit.models.tokenizer import Tokenizer
    from onebit.router import Router
    model = default_model_dir()
    app = create_app(Router([InstantBackend(capacity, step_s)]), model_name="instant", model_path=str(model),
                     load_tokenizer=lambda: Tokenizer.from_dir(model))
    run_server(make_server(app, "127.0.0.1", port, "warning"))


def main() -> None:
    """Serve the instant backend in a child process and bench it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="out/front-speed")
    ap.add_argument("--serve-port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_port is not None:
        serve(args.serve_port, 512, args.step_ms / 1000)
        return
    from onebit.bench.serve import free_port, served_command
    port = free_port()
    cmd = [sys.executable, __file__, "--serve-port", str(port), "--step-ms", str(args.step_ms)]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with served_command(cmd, port, Path(args.out) / "front.log", timeout_s=120, name="instant front"):
        subprocess.run([sys.executable, "-m", "onebit.cli", "bench", "--url", f"http://127.0.0.1:{port}",
                        "--concurrency", args.concurrency, "--max-tokens", str(args.max_tokens),
                        "--prompts", "random:128", "--label", f"front-{args.step_ms}ms", "--out", args.out,
                        "--no-progress"], check=True)


if __name__ == "__main__":
    main()
