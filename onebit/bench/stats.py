"""Figures of one concurrency level, computed from its requests' results.

Definitions (the JSON and the tables use them):
- total tok/s: completion tokens of the completed requests / wall time of the level (first
  request sent to last request ended). Failed requests add no tokens.
- tok/s per request: mean over completed requests of (completion tokens - 1) / (e2e - TTFT),
  the decode rate one user sees after the first token.
- decode tok/s: the completed requests' tokens after their first, summed, / the time during
  which at least one of them was past its first token (the union of their [TTFT, end]
  spans). Time when every request is still waiting for its first token (a burst's first
  prefill, every prompt at C=1) is left out; steps that serve other requests' prefill while
  some decode stay in. At C=1 it is the decode rate itself.
- cached prompt tokens: what the server said it took from its prefix cache
  (usage.prompt_tokens_details.cached_tokens, or llama-server's timings.cache_n), summed over
  the completed requests that said; None when none did.
- ITL: gaps between consecutive chunks carrying text, pooled over completed requests. A
  server that sends several tokens in one chunk shows one larger gap for them.
- TPOT: mean over completed requests of (e2e - TTFT) / (completion tokens - 1).
- spec: drafted and accepted tokens summed over the completed requests whose last chunk
  reported them (llama.cpp's `timings.draft_n` / `draft_n_accepted`), and accepted / drafted;
  None when no request reported them.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from onebit.bench.client import RequestResult


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile (linear interpolation), or None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), p))


def mean(values: list[float]) -> float | None:
    """Arithmetic mean, or None for no values."""
    return float(np.mean(values)) if values else None


def inter_token_gaps(result: RequestResult) -> list[float]:
    """Gaps (s) between consecutive text chunks of one request."""
    t = result.chunk_times
    return [b - a for a, b in zip(t, t[1:])]


def _decode_span(r: RequestResult) -> float | None:
    if r.ttft is None or r.e2e is None or not r.completion_tokens or r.completion_tokens < 2:
        return None
    span = r.e2e - r.ttft
    return span if span > 0 else None


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def decode_rate(results: list[RequestResult]) -> float | None:
    """Tokens after the first, summed over `results`, per second of time some of them was decoding
    (see the module docstring); None when no request decoded."""
    tokens, spans = 0, []
    for r in results:
        if _decode_span(r) is not None:
            tokens += r.completion_tokens - 1
            spans.append((r.start + r.ttft, r.start + r.e2e))
    busy = union_seconds(spans)
    return tokens / busy if busy > 0 else None


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def speculative(results: list[RequestResult]) -> dict | None:
    """{"drafted", "accepted", "rate"} over the requests that reported drafts, or None when none did."""
    reported = [r for r in results if r.draft_tokens is not None]
    if not reported:
        return None
    drafted = sum(r.draft_tokens for r in reported)
    accepted = sum(r.accepted_tokens or 0 for r in reported)
    return {"drafted": drafted, "accepted": accepted, "rate": accepted / drafted if drafted else None}


def summarize(results: list[RequestResult], wall_s: float, concurrency: int) -> dict:
    """The summary dict of one level (latencies in ms, except e2e in s)."""
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    generated = sum(r.completion_tokens or 0 for r in done)
    per_request, tpot = [], []
    for r in done:
        span = _decode_span(r)
        if span is not None:
            per_request.append((r.completion_tokens - 1) / span)
            tpot.append(span / (r.completion_tokens - 1))
    ttft = [r.ttft for r in done if r.ttft is not None]
    itl = [g for r in done for g in inter_token_gaps(r)]
    e2e = [r.e2e for r in done if r.e2e is not None]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "completed": len(done),
        "failed": len(failed),
        "short": sum(1 for r in failed if r.failure == "short"),
        "failures_by_kind": dict(Counter(r.failure for r in failed)),
        "wall_s": wall_s,
        "generated_tokens": generated,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in done),
        "total_tok_s": generated / wall_s if wall_s > 0 else 0.0,
        "per_request_tok_s": mean(per_request),
        "decode_tok_s": decode_rate(done),
        "cached_prompt_tokens": (sum(r.cached_tokens for r in done if r.cached_tokens is not None)
                                 if any(r.cached_tokens is not None for r in done) else None),
        "req_s": len(done) / wall_s if wall_s > 0 else 0.0,
        "ttft_ms": {"p50": _ms(percentile(ttft, 50)), "p90": _ms(percentile(ttft, 90)),
                    "p99": _ms(percentile(ttft, 99))},
        "itl_ms": {"p50": _ms(percentile(itl, 50)), "p99": _ms(percentile(itl, 99))},
        "tpot_ms": _ms(mean(tpot)),
        "e2e_s": {"mean": mean(e2e), "p50": percentile(e2e, 50), "p99": percentile(e2e, 99)},
        "spec": speculative(done),
    }
