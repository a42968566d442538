"""Markdown tables of bench runs: the seed's shape (tokens/s by concurrency) and one detailed table per run."""

from __future__ import annotations

from onebit.bench.client import endpoint_path
from onebit.bench.gpu_clocks import describe
from onebit.bench.runfile import summaries


def fmt_rate(value: float | None) -> str:
    """Tokens or requests per second: no decimals from 100 up, one below, '-' when unknown."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def fmt_ms(value: float | None) -> str:
    """Milliseconds, one decimal; '-' when unknown."""
    return "-" if value is None else f"{value:,.1f}"


def fmt_s(value: float | None) -> str:
    """Seconds, two decimals; '-' when unknown."""
    return "-" if value is None else f"{value:,.2f}"


def _cell(summary: dict) -> str:
    text = fmt_rate(summary["total_tok_s"])
    return text if not summary["failed"] else f"{text} ({summary['failed']} failed)"


def seed_table(runs: list[dict]) -> str:
    """One row per run (its label), one column per concurrency: total decode tokens/s."""
    levels = sorted({s["concurrency"] for run in runs for s in summaries(run)})
    lines = ["| total tok/s | " + " | ".join(f"C={c}" for c in levels) + " |",
             "|---|" + "---:|" * len(levels)]
    for run in runs:
        by_c = {s["concurrency"]: s for s in summaries(run)}
        cells = [_cell(by_c[c]) if c in by_c else "" for c in levels]
        lines.append(f"| {run['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


DETAIL_HEADER = ("| C | completed | failed | short | total tok/s | decode tok/s | tok/s per req | req/s | "
                 "TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | e2e p50 s | e2e p99 s |")
CACHED_HEADER = " prompt cached |"
CLOCK_HEADER = " GPU clock |"
SPEC_HEADER = " spec accepted/drafted |"


def fmt_cached(summary: dict) -> str:
    """Share of the level's prompt tokens served from the prefix cache; '-' when the server said nothing."""
    cached, prompt = summary.get("cached_prompt_tokens"), summary.get("prompt_tokens")
    if cached is None or not prompt:
        return "-"
    return f"{cached / prompt:.0%}"


def fmt_spec(spec: dict | None) -> str:
    """Speculative acceptance as 'rate (accepted/drafted)'; '-' when the level has none."""
    if not spec:
        return "-"
    rate = "-" if spec["rate"] is None else f"{spec['rate']:.0%}"
    return f"{rate} ({spec['accepted']:,}/{spec['drafted']:,})"


def detail_row(s: dict, spec: bool = False, cached: bool = False, clock: bool = False) -> str:
    """One level's row of the detailed table; `cached` adds the prefix-cache share, `spec` the
    speculative acceptance cell, `clock` the GPU's clock over the level (`--gpu-clocks`)."""
    cells = [str(s["concurrency"]), str(s["completed"]), str(s["failed"]), str(s["short"]),
             fmt_rate(s["total_tok_s"]), fmt_rate(s.get("decode_tok_s")), fmt_rate(s["per_request_tok_s"]),
             fmt_rate(s["req_s"]),
             fmt_ms(s["ttft_ms"]["p50"]), fmt_ms(s["ttft_ms"]["p90"]), fmt_ms(s["ttft_ms"]["p99"]),
             fmt_ms(s["itl_ms"]["p50"]), fmt_ms(s["itl_ms"]["p99"]),
             fmt_s(s["e2e_s"]["p50"]), fmt_s(s["e2e_s"]["p99"])]
    if cached:
        cells.append(fmt_cached(s))
    if spec:
        cells.append(fmt_spec(s.get("spec")))
    if clock:
        cells.append(describe(s.get("gpu_clock")))
    return "| " + " | ".join(cells) + " |"


def detail_table(run: dict) -> str:
    """Every figure of every level of one run; the prefix-cache column only when the server reported
    cached tokens, the speculative one only when some level has drafts, the GPU clock only when the
    run sampled it."""
    levels = summaries(run)
    spec = any(s.get("spec") for s in levels)
    cached = any(s.get("cached_prompt_tokens") is not None for s in levels)
    clock = any("gpu_clock" in s for s in levels)
    header = DETAIL_HEADER + (CACHED_HEADER if cached else "") + (SPEC_HEADER if spec else "") + \
        (CLOCK_HEADER if clock else "")
    lines = [header, "|" + "---:|" * header.count(" |")]
    lines += [detail_row(s, spec, cached, clock) for s in levels]
    return "\n".join(lines)


def settings_line(run: dict) -> str:
    """One line saying what was measured and how."""
    st = run["settings"]
    loop = "closed loop" if st.get("request_rate") is None else f"open loop, {st['request_rate']:g} req/s Poisson"
    requests = st.get("requests")
    if st.get("duration_s") is not None:
        amount = f"{st['duration_s']:g} s"
    elif isinstance(requests, list):
        amount = "/".join(str(n) for n in requests) + " requests"
    else:
        amount = f"{requests} requests" if requests else "4 requests per client (at least 8)"
    return (f"`{run['label']}`: {st['url']} model `{st['model']}`, prompts `{st['prompts']}` via "
            f"/v1{endpoint_path(st['endpoint'])}, {st['max_tokens']} new tokens, {loop}, {amount} per level")


def failures_text(run: dict) -> str:
    """Failure kinds per level, or '' when every request completed."""
    lines = []
    for s in summaries(run):
        if s["failed"]:
            kinds = ", ".join(f"{k}: {n}" for k, n in sorted(s["failures_by_kind"].items()))
            lines.append(f"- `{run['label']}` C={s['concurrency']}: {s['failed']} failed ({kinds})")
    return "\n".join(lines)


def markdown_report(runs: list[dict], title: str = "1bit bench") -> str:
    """The whole Markdown document: settings, the seed-shaped table, details and failures."""
    parts = [f"# {title}", "", *(f"- {settings_line(r)}" for r in runs), "", seed_table(runs)]
    for run in runs:
        parts += ["", f"## {run['label']}", "", detail_table(run)]
    failures = [text for text in (failures_text(r) for r in runs) if text]
    if failures:
        parts += ["", "## Failures", "", *failures]
    return "\n".join(parts) + "\n"
