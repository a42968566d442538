"""Kill a backend's process while streams run on it, and read every stream to its end.

Shared by the end-to-end tests of backend death (native workers, llama-server children).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamResult:
    """One raw SSE stream of /v1/completions as the client saw it."""

    status: int = 0
    events: list[dict] = field(default_factory=list)  # every data event but [DONE], parsed
    done: bool = False  # ended with data: [DONE]

    @property
    def text(self) -> str:
        """The streamed text, all chunks joined."""
        return "".join(c.get("text", "") for e in self.events for c in e.get("choices", []))

    @property
    def errors(self) -> list[dict]:
        """The error events."""
        return [e for e in self.events if "error" in e]

    @property
    def usage(self) -> dict | None:
        """The usage chunk, if one came."""
        return next((e["usage"] for e in self.events if e.get("usage")), None)

    @property
    def finish_reasons(self) -> list[str]:
        """Every finish_reason sent."""
        return [c["finish_reason"] for e in self.events for c in e.get("choices", []) if c.get("finish_reason")]


def completion_body(prompt, max_tokens: int, **extra) -> dict:
    """A streaming /v1/completions body that runs to `max_tokens` (greedy unless `extra` says)."""
    return {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True}, **extra}


async def _streams(root: str, bodies: list[dict], victim: int | None, after_chunks: int) -> list[StreamResult]:
    """Open every stream; once each has `after_chunks` text chunks, SIGKILL `victim` (None: nobody);
    read every stream to its end."""
    results = [StreamResult() for _ in bodies]
    going = [asyncio.Event() for _ in bodies]

    async def one(i: int, http: httpx.AsyncClient) -> None:
        result = results[i]
        try:
            async with http.stream("POST", f"{root}/v1/completions", json=bodies[i]) as resp:
                result.status = resp.status_code
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        result.done = True
                        continue
                    result.events.append(json.loads(line[6:]))
                    if sum(1 for e in result.events if e.get("choices") and e["choices"][0].get("text")) >= after_chunks:
                        going[i].set()
        finally:
            going[i].set()

    async with httpx.AsyncClient(timeout=120) as http:
        tasks = [asyncio.create_task(one(i, http)) for i in range(len(bodies))]
        await asyncio.gather(*(event.wait() for event in going))
        if victim is not None:
            os.kill(victim, signal.SIGKILL)
        await asyncio.gather(*tasks)
    return results


def run_streams(root: str, bodies: list[dict], *, kill: int | None = None, after_chunks: int = 2) -> list[StreamResult]:
    """Run the streams concurrently to their ends; with `kill`, SIGKILL that pid once every stream has
    streamed `after_chunks` text chunks (so the process dies while all of them are mid-stream)."""
    return asyncio.run(_streams(root, bodies, kill, after_chunks))


def migrated_requests(log: str) -> set[str]:
    """The request ids the router logged as migrating (a request may move more than once: a stream
    can break before its backend is known to be down, and the next try land on it again)."""
    return set(re.findall(r"request (\S+): backend \S+ failed after \d+ tokens .*; migrating", log))
