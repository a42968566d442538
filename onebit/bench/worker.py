"""A client process: runs its share of one level's requests and reports each result to the parent.

It speaks JSON lines. Stdin: first {"job", "plan", "first", "stride", "client"}, then, once it
said it is ready, {"start": T} with T a time.monotonic() instant (one clock for every process on
the machine), when its workers begin. Stdout: {"ready": true}, then {"result": RequestResult}
per finished request, {"alive": true} every HEARTBEAT_S, and {"done": true, "cpu_s": ...} at the
end. The parent starts it with procs.child_command(); when the parent's end of stdin closes, it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time

import httpx

from onebit.bench.client import http_client
from onebit.bench.job import LevelJob
from onebit.bench.loadgen import LevelPlan, drive

HEARTBEAT_S = 1.0


def _emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _exit_when_parent_leaves() -> None:
    # EOF on stdin means the parent is gone (even killed by SIGKILL): stop sending requests.
    def watch():
        while sys.stdin.readline():
            pass
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


async def _heartbeat() -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        _emit({"alive": True})


async def _warm(client: httpx.AsyncClient, url: str, connections: int) -> None:
    # Opens the connections the workers will reuse, before the clock starts; errors do not
    # matter here (the requests themselves will report them).
    async def one():
        with contextlib.suppress(httpx.HTTPError):
            await client.get(url)

    await asyncio.gather(*(one() for _ in range(connections)))


async def run_share(message: dict) -> None:
    """Run the share a parent's first message describes, reporting on stdout (see the module doc)."""
    job = LevelJob.from_json(message["job"])
    plan = LevelPlan(**message["plan"])
    first, stride = message["first"], message["stride"]
    options = message["client"]
    async with http_client(options.get("headers"), options["timeout_s"], plan.concurrency) as client:
        await _warm(client, options["warm_url"], plan.concurrency)
        send_global = job.sender(client)
        _emit({"ready": True})
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        start_at = json.loads(line)["start"]
        _exit_when_parent_leaves()
        beat = asyncio.create_task(_heartbeat())
        start = time.perf_counter() + (start_at - time.monotonic())  # the same instant on our clock
        cpu0 = time.process_time()
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        await drive(lambda j: send_global(first + j * stride), plan, start,
                    lambda result: _emit({"result": result.to_json()}))
        beat.cancel()
        _emit({"done": True, "cpu_s": time.process_time() - cpu0})


def main() -> int:
    """Read the share from stdin and run it; the exit code is 0 when it ran to its end."""
    line = sys.stdin.readline()
    if not line:
        return 2
    asyncio.run(run_share(json.loads(line)))
    return 0
