"""Where the host time of a served decode step goes: the engine alone, against the same engine
in the real worker process behind the real NativeBackend (pipe, (de)serializing, per-request
queues), C streams in a closed loop, no HTTP.

    PYTHONPATH=. python3 bench/host_profile.py [-m DIR] [--concurrency 64] [--requests 256]
        [--prompt-tokens 32] [--max-tokens 64] [--device cpu] [--profile FILE]

Part 1 drives LLMEngine straight (as `bench/closed_loop.py` does). Part 2 starts the worker the
way `1bit serve` does (NativeBackend, spawned process, one pipe) and runs C asyncio streams
through `NativeBackend.generate`, each replaced by a new request when it ends. The worker here
is `worker_main` with timers around what it does besides stepping: receiving and adding
requests, building the step message (stats and slots included) and pickling and writing it.
The front's side is the event loop process's own CPU time, per step. `--profile FILE` also
writes a cProfile of the worker's serve loop (read it with `python3 -m pstats FILE`).

Prints, per step, milliseconds of each part; the difference between the two parts' tok/s is
what the worker process and its pipe cost. HTTP (SSE framing, uvicorn) is measured by
`bench/front_speed.py` and by `1bit bench --serve` against the same model, the front process's
CPU under that load by `bench/front_cpu.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pickle
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from onebit.engine.config import EngineConfig
from onebit.engine.sampling_params import SamplingParams

TIMES_ENV = "ONEBIT_HOST_PROFILE_OUT"  # where the timed worker writes its table (set by part 2)


class Clock:
    """Adds up wall and CPU seconds per name (CPU time is what a loaded machine cannot inflate)."""

    def __init__(self):
        self.table: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self._started: list[tuple[float, float]] = []

    def start(self) -> None:
        """Begin timing (nestable)."""
        self._started.append((time.perf_counter(), time.thread_time()))

    def stop(self, name: str) -> None:
        """End the innermost timing and add it to `name`."""
        wall, cpu = self._started.pop()
        row = self.table[name]
        row[0] += time.perf_counter() - wall
        row[1] += time.thread_time() - cpu


def timed(clock: Clock, name: str, fn):
    """Wrap fn so that its wall and CPU time add up under `name`."""
    def wrapper(*args, **kwargs):
        clock.start()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.stop(name)
    return wrapper


class TimedConn:
    """A multiprocessing Connection whose send and recv time pickling apart from the pipe I/O."""

    def __init__(self, conn, clock: Clock):
        self.conn, self.clock = conn, clock
        self.step_bytes = 0
        self.step_messages = 0

    def send(self, message) -> None:
        """Pickle (timed as "send: pickle") then write (timed as "send: write")."""
        self.clock.start()
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.clock.stop("send: pickle")
        self.clock.start()
        self.conn.send_bytes(data)
        self.clock.stop("send: write")
        if message[0] == "step":
            self.step_bytes += len(data)
            self.step_messages += 1

    def recv(self):
        """Read and unpickle one command (timed as "recv commands")."""
        self.clock.start()
        try:
            return self.conn.recv()
        finally:
            self.clock.stop("recv commands")

    def poll(self, timeout=0.0) -> bool:
        """Whether a command is waiting (timed as "poll")."""
        self.clock.start()
        try:
            return self.conn.poll(timeout)
        finally:
            self.clock.stop("poll")


def time_collections(clock: Clock):
    """Count the garbage collector's passes into `clock` as "gc: generation N" (they run inside
    whatever part allocated last, whose time includes them too); returns the gc callback."""
    started = []

    def callback(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            row = clock.table[f"gc: generation {info['generation']}"]
            seconds = time.perf_counter() - started.pop()
            row[0] += seconds
            row[1] += seconds

    gc.callbacks.append(callback)
    return callback


def timed_worker_main(config: EngineConfig, conn, parent_pid: int) -> None:
    """`worker_main` with timers (and, if asked, cProfile) around the serve loop's parts."""
    from onebit.backends import native_worker

    native_worker.die_with_parent(parent_pid)
    engine = native_worker.load_engine(config)
    clock = Clock()
    time_collections(clock)
    proxy = TimedConn(conn, clock)
    steps = [0]
    step = engine.step

    def counted_step():
        steps[0] += 1
        return step()

    engine.step = timed(clock, "engine.step", counted_step)
    engine.add_request = timed(clock, "add_request", engine.add_request)
    engine.stats = timed(clock, "stats()", engine.stats)
    engine.slots = timed(clock, "slots()", engine.slots)
    conn.send(("ready", {"ctx_size": engine.ctx_size, "device": str(engine.device), "pid": os.getpid()}))
    profile_path = os.environ.get(TIMES_ENV + "_PROFILE")
    start, cpu = time.perf_counter(), time.thread_time()
    if profile_path:
        native_worker.serve_engine_profiled(engine, proxy, profile_path)
    else:
        native_worker.serve_engine(engine, proxy)
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    with open(os.environ[TIMES_ENV], "w") as f:
        json.dump({"wall": wall, "cpu": cpu, "steps": steps[0], "times": clock.table, "step_bytes": proxy.step_bytes,
                   "step_messages": proxy.step_messages}, f)


def workload(args, rng: random.Random):
    """(prompt ids, params) of the next request of the closed loop."""
    limit = args.max_tokens
    if args.stagger:
        limit = rng.randint(args.max_tokens // 2, args.max_tokens * 3 // 2)
    prompt = [rng.randrange(32, 250) for _ in range(args.prompt_tokens)]
    return prompt, SamplingParams(temperature=0, max_tokens=limit, ignore_eos=True)


def engine_part(args, config: EngineConfig) -> dict:
    """The closed loop straight into the engine."""
    from onebit.backends.native_worker import load_engine

    engine = load_engine(config)  # as the worker loads it (the same torch threads on the CPU)
    clock = Clock()
    counting = time_collections(clock)
    rng = random.Random(0)
    sent = tokens = steps = 0
    while sent < min(args.concurrency, args.requests):
        engine.add_request(f"r{sent}", *workload(args, rng))
        sent += 1
    start = time.perf_counter()
    cpu = time.process_time()
    while engine.has_unfinished():
        for delta in engine.step():
            tokens += len(delta.token_ids)
            if delta.finished and sent < args.requests:
                engine.add_request(f"r{sent}", *workload(args, rng))
                sent += 1
        steps += 1
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    gc.callbacks.remove(counting)
    del engine
    gc.collect()
    if config.device != "cpu":
        import torch
        torch.cuda.empty_cache()  # the worker of part 2 sizes its KV pool from the free memory
    return {"wall": wall, "steps": steps, "tokens": tokens, "cpu": cpu,
            "gc": {name: row[0] for name, row in clock.table.items()}}


async def backend_part(args, config: EngineConfig, times_path: str) -> dict:
    """The closed loop through NativeBackend and its worker process."""
    from onebit.backends import native
    from onebit.protocol import GenerateRequest

    native.worker_main = timed_worker_main  # the spawned child imports it from this script
    backend = native.NativeBackend(config, health_interval=3600, health_timeout=3600)
    await backend.start()
    rng = random.Random(0)
    counter = iter(range(args.requests))
    tokens = 0
    events = 0

    async def client() -> None:
        nonlocal tokens, events
        for i in counter:
            prompt, params = workload(args, rng)
            async for delta in backend.generate(GenerateRequest(f"r{i}", prompt, params)):
                tokens += len(delta.token_ids)
                events += 1

    start = time.perf_counter()
    cpu = time.process_time()
    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    await backend.stop()
    for _ in range(100):  # the worker writes its table as it exits
        if os.path.exists(times_path) and os.path.getsize(times_path):
            break
        await asyncio.sleep(0.05)
    worker = json.loads(Path(times_path).read_text())
    return {"wall": wall, "tokens": tokens, "events": events, "cpu": cpu, "worker": worker}


def main() -> None:
    """Run both parts and print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None, help="model directory (default: the built-in demo model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stagger", action="store_true", help="output lengths uniform in [max/2, 3*max/2]")
    ap.add_argument("--profile", default=None, help="write a cProfile of the worker's serve loop here")
    ap.add_argument("--parts", default="engine,backend")
    ap.add_argument("--ctx-size", type=int, default=None, help="default: prompt + twice max tokens + 16")
    ap.add_argument("--load-format", default="auto", help="dummy: random weights (a bench/make_shape_model.py shape)")
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--quantize", default=None, choices=["fp8"], help="as `1bit serve --quantize`")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    model = args.model
    if model is None:
        from onebit.models.default_model import default_model_dir
        model = str(default_model_dir())
    config = EngineConfig(model=model, device=args.device, parallel=args.concurrency,
                          ctx_size=args.ctx_size or args.prompt_tokens + args.max_tokens * 2 + 16,
                          load_format=args.load_format, max_batch_tokens=args.max_batch_tokens,
                          quantize=args.quantize)
    parts = args.parts.split(",")
    print(f"model {model}, device {args.device}, C={args.concurrency}, {args.requests} requests of "
          f"{args.prompt_tokens}+{args.max_tokens} tokens{' (staggered)' if args.stagger else ''}")
    figures = {}
    if "engine" in parts:
        e = engine_part(args, config)
        ms = e["wall"] / e["steps"] * 1e3
        figures["engine"] = {**e, "tok_s": e["tokens"] / e["wall"]}
        print(f"engine alone: {e['tokens'] / e['wall']:,.0f} tok/s, {e['steps']} steps, {ms:.2f} ms/step "
              f"({e['cpu'] / e['steps'] * 1e3:.2f} ms CPU); garbage collection: "
              + (", ".join(f"{name[4:]} {sec / e['steps'] * 1e3:.3f} ms/step" for name, sec in sorted(e["gc"].items()))
                 or "none"))
    if "backend" in parts:
        times_path = os.path.join(tempfile.mkdtemp(), "times.json")
        os.environ[TIMES_ENV] = times_path
        if args.profile:
            os.environ[TIMES_ENV + "_PROFILE"] = str(Path(args.profile).resolve())
        b = asyncio.run(backend_part(args, config, times_path))
        w = b["worker"]
        figures["backend"] = {**b, "tok_s": b["tokens"] / b["wall"]}
        steps = w["steps"] or 1
        ms = b["wall"] / steps * 1e3
        print(f"worker + pipe + NativeBackend: {b['tokens'] / b['wall']:,.0f} tok/s, {steps} steps, {ms:.2f} ms/step; "
              f"{w['step_messages']} step messages, {w['step_bytes'] / max(w['step_messages'], 1):,.0f} bytes each; "
              f"{b['events']} deltas to streams")
        print("| part | wall ms per step | CPU ms per step |\n|---|---:|---:|")
        order = ["engine.step", "add_request", "recv commands", "poll", "stats()", "slots()", "send: pickle",
                 "send: write"]
        for name in order + sorted(set(w["times"]) - set(order)):
            wall, cpu = w["times"].get(name, (0.0, 0.0))
            print(f"| worker: {name} | {wall / steps * 1e3:.3f} | {cpu / steps * 1e3:.3f} |")
        step_wall, step_cpu = w["times"].get("engine.step", (0.0, 0.0))
        print(f"| worker: all but engine.step | {(w['wall'] - step_wall) / steps * 1e3:.3f} | "
              f"{(w['cpu'] - step_cpu) / steps * 1e3:.3f} |")
        print(f"| front process (pipe read, unpickle, queues, streams) | | {b['cpu'] / steps * 1e3:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
