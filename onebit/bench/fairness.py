"""A light user beside a heavy one: each user's time to first token, first-come-first-served vs fair share.

    python -m onebit.bench.fairness --serve "-m MODEL --parallel 4" [--heavy-clients 8] ...
    python -m onebit.bench.fairness --url http://127.0.0.1:8080/v1      # one server as it runs

With --serve the script starts `1bit serve ARGS` twice, once with `--no-fair-share` (one FIFO
line) and once as is (fair share), and runs the same load on each: the heavy user keeps
`--heavy-clients` streams going back to back (closed loop), the light user sends one short
request at a time, `--light-gap` seconds after the last one ended. Users are told apart by the
OpenAI `user` field. It prints, per mode and user, p50/p99 time to first token, requests and
output tokens/s, as a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from onebit.bench.serve import served
from onebit.bench.stats import percentile


async def one_request(http: httpx.AsyncClient, url: str, model: str, user: str, prompt: str,
                      max_tokens: int) -> tuple[float | None, int]:
    """Stream one completion; (seconds to the first text, output tokens) or (None, 0) on failure."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "user": user,
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, tokens = None, 0
    async with http.stream("POST", f"{url}/completions", json=body) as response:
        if response.status_code != 200:
            return None, 0
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return None, 0
            if first is None and any(c.get("text") for c in event.get("choices", [])):
                first = time.perf_counter() - start
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return first, tokens


async def run_load(url: str, model: str, args: argparse.Namespace) -> dict[str, dict]:
    """The heavy and the light user together until the light one sent all its requests."""
    ttft: dict[str, list[float]] = {"heavy": [], "light": []}
    tokens = {"heavy": 0, "light": 0}
    failures = {"heavy": 0, "light": 0}
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=args.heavy_clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        async def record(user: str, prompt: str, max_tokens: int) -> None:
            first, n = await one_request(http, url, model, user, prompt, max_tokens)
            if first is None:
                failures[user] += 1
            else:
                ttft[user].append(first)
                tokens[user] += n

        async def heavy(i: int) -> None:
            while not stop.is_set():
                await record("heavy", f"heavy client {i} writes a long story", args.heavy_tokens)

        async def light() -> None:
            await asyncio.sleep(args.warmup)
            for i in range(args.light_requests):
                await record("light", f"light question {i}", args.light_tokens)
                await asyncio.sleep(args.light_gap)
            stop.set()

        started = time.perf_counter()
        await asyncio.gather(light(), *(heavy(i) for i in range(args.heavy_clients)))
        wall = time.perf_counter() - started
    return {user: {"p50_ttft_ms": _ms(percentile(ttft[user], 50)), "p99_ttft_ms": _ms(percentile(ttft[user], 99)),
                   "requests": len(ttft[user]), "failed": failures[user], "tokens_per_s": round(tokens[user] / wall, 1)}
            for user in ("light", "heavy")}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def table(rows: list[tuple[str, str, dict]]) -> str:
    """Markdown: one row per (mode, user)."""
    out = ["| mode | user | p50 TTFT ms | p99 TTFT ms | requests | failed | output tok/s |",
           "|---|---|---|---|---|---|---|"]
    for mode, user, r in rows:
        out.append(f"| {mode} | {user} | {r['p50_ttft_ms']} | {r['p99_ttft_ms']} | {r['requests']} | {r['failed']} "
                   f"| {r['tokens_per_s']} |")
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m onebit.bench.fairness", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--serve", metavar="ARGS", help="`1bit serve` arguments; run FIFO and fair on it")
    where.add_argument("--url", help="an OpenAI base URL (ending in /v1) to load as it is")
    p.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    p.add_argument("--heavy-clients", type=int, default=8, help="streams the heavy user keeps going")
    p.add_argument("--heavy-tokens", type=int, default=64, help="output tokens per heavy request")
    p.add_argument("--light-requests", type=int, default=20, help="requests the light user sends, one at a time")
    p.add_argument("--light-tokens", type=int, default=8, help="output tokens per light request")
    p.add_argument("--light-gap", type=float, default=0.2, help="seconds between the light user's requests")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of heavy load before the light user starts")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def model_of(url: str, given: str | None) -> str:
    """The model name to send: given, or the server's first."""
    return given or httpx.get(f"{url}/models", timeout=30).json()["data"][0]["id"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    args = parse_args(argv)
    rows: list[tuple[str, str, dict]] = []
    if args.url:
        result = asyncio.run(run_load(args.url, model_of(args.url, args.model), args))
        rows += [("as served", user, r) for user, r in result.items()]
    else:
        logs = Path(tempfile.mkdtemp(prefix="onebit-fairness-"))
        for mode, extra in (("FIFO", " --no-fair-share"), ("fair", "")):
            with served(args.serve + extra, logs / f"{mode}.log") as url:
                result = asyncio.run(run_load(url, model_of(url, args.model), args))
            rows += [(mode, user, r) for user, r in result.items()]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([{"mode": m, "user": u, **r} for m, u, r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
