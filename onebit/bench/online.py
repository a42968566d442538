"""The online benchmark: every concurrency level against one OpenAI-compatible server, as a run dict."""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from tqdm import tqdm

from onebit.bench.client import build_payload, endpoint_path, http_client, stream_request
from onebit.bench.errors import BenchError
from onebit.bench.gpu_clocks import ClockSampler, describe
from onebit.bench.job import LevelJob
from onebit.bench.loadgen import LevelPlan, run_level
from onebit.bench.procs import run_level_procs
from onebit.bench.prompts import DEFAULT_RANDOM_IDS, default_endpoint, make_prompts
from onebit.bench.runfile import SCHEMA
from onebit.bench.split import client_procs, split_plan
from onebit.bench.stats import summarize
from onebit.bench.tables import fmt_rate, fmt_spec

# Prompts drawn per level in --duration mode; request i uses prompt i modulo this.
PROMPT_POOL = 512
# Client processes busier than this share of the level's time may be the bottleneck.
BUSY_WARNING = 0.8


@dataclass
class OnlineConfig:
    """Everything an online run needs; `url` is the server root or its /v1 base."""

    url: str
    concurrency: list[int]
    max_tokens: int = 256
    prompts: str = "chat"
    requests: int | list[int] | None = None  # per level: one count, or one per concurrency level
    duration_s: float | None = None
    request_rate: float | None = None
    model: str | None = None
    api_key: str | None = None
    endpoint: str | None = None  # 'chat' or 'completions'; default follows the prompt set
    label: str | None = None
    warmup: int = 1
    timeout_s: float = 600.0
    extra_body: dict = field(default_factory=dict)
    random_ids: tuple[int, int] = DEFAULT_RANDOM_IDS
    seed: int = 0
    progress: bool = True
    client_procs: int | str = "auto"  # client processes per level, or 'auto' (see split.py)
    gpu_clocks: int | None = None  # nvidia-smi's index of the GPU whose clock each level samples; None: none

    def __post_init__(self):
        if isinstance(self.requests, list) and len(self.requests) != len(self.concurrency):
            raise ValueError(f"{len(self.requests)} request counts for {len(self.concurrency)} concurrency levels")


def requests_per_level(cfg: OnlineConfig, concurrency: int) -> int | None:
    """--requests if given (a list: the count of this level's place in cfg.concurrency); None in
    --duration mode; else 4 per client, at least 8."""
    if isinstance(cfg.requests, list):
        return cfg.requests[list(cfg.concurrency).index(concurrency)]
    if cfg.requests is not None or cfg.duration_s is not None:
        return cfg.requests
    return max(4 * concurrency, 8)


def api_base(url: str) -> str:
    """'http://h:p' or 'http://h:p/v1/' -> 'http://h:p/v1'."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


async def discover_model(client: httpx.AsyncClient, base: str) -> str:
    """The first model id that GET /v1/models lists."""
    try:
        response = await client.get(f"{base}/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise BenchError(f"cannot list models at {base}/models ({exc}); pass --model") from None


def client_usage(procs: int, cpu_s: float | None, wall_s: float, summary: dict) -> dict:
    """The level's "client" record: processes, their CPU seconds, and the share of their time they were busy."""
    busy = cpu_s / (procs * wall_s) if cpu_s is not None and wall_s > 0 else None
    tokens = summary["generated_tokens"]
    per_token = cpu_s / tokens * 1e6 if cpu_s is not None and tokens else None
    return {"procs": procs, "cpu_s": cpu_s, "busy": busy, "cpu_us_per_token": per_token}


def _settings(cfg: OnlineConfig, base: str, model: str, endpoint: str) -> dict:
    return {"url": base, "model": model, "endpoint": endpoint, "prompts": cfg.prompts,
            "max_tokens": cfg.max_tokens, "concurrency": cfg.concurrency, "requests": cfg.requests,
            "duration_s": cfg.duration_s, "request_rate": cfg.request_rate, "warmup": cfg.warmup,
            "extra_body": cfg.extra_body, "client_procs": cfg.client_procs, "gpu_clocks": cfg.gpu_clocks}


async def _warm_up(cfg: OnlineConfig, client: httpx.AsyncClient, url: str, model: str, endpoint: str) -> None:
    prompts = make_prompts(cfg.prompts, max(cfg.warmup, 1), endpoint, seed="warm-up", id_range=cfg.random_ids)
    for i in range(cfg.warmup):
        # Full length, so that first-use costs of long sequences stay out of the first level.
        body = build_payload(prompts[i], endpoint, model, cfg.max_tokens, cfg.extra_body)
        result = await stream_request(client, url, body, index=i)
        if result.failure in ("http", "connection", "timeout", "error_event"):
            raise BenchError(f"warm-up request to {url} failed ({result.failure}): {result.message}")


async def _run_level(cfg: OnlineConfig, client: httpx.AsyncClient, job: LevelJob, plan: LevelPlan,
                     options: dict) -> dict:
    """One level, in this process or spread over client processes; its dict in the run. With
    `cfg.gpu_clocks`, the summary's "gpu_clock" holds that GPU's clock over the level (None when
    nvidia-smi gave no sample)."""
    shares = split_plan(plan, client_procs(cfg.client_procs, plan.concurrency))
    procs = len(shares)
    with ClockSampler(cfg.gpu_clocks) as sampler:
        if procs == 1:
            cpu0 = time.process_time()
            results, wall = await run_level(job.sender(client), plan, cfg.progress)
            cpu = time.process_time() - cpu0
        else:
            results, wall, cpu = await run_level_procs(job, plan, shares, options, cfg.progress)
    summary = summarize(results, wall, plan.concurrency)
    if cfg.gpu_clocks is not None:
        summary["gpu_clock"] = sampler.summary()
    return {"concurrency": plan.concurrency, "client": client_usage(procs, cpu, wall, summary),
            "summary": summary, "requests": [r.to_json() for r in results]}


def _print_level(level: dict, print_fn) -> None:
    summary, c, client = level["summary"], level["concurrency"], level["client"]
    spec = f", spec accepted {fmt_spec(summary['spec'])}" if summary["spec"] else ""
    print_fn(f"C={c}: {fmt_rate(summary['total_tok_s'])} tok/s total, "
             f"{summary['completed']}/{summary['requests']} completed, {summary['failed']} failed{spec}")
    if "gpu_clock" in summary:
        print_fn(f"C={c}: GPU {describe(summary['gpu_clock'])}" if summary["gpu_clock"] else
                 f"C={c}: warning: no GPU clock sample (is nvidia-smi on PATH, and the GPU index right?)")
    if client["busy"] is not None and client["busy"] > BUSY_WARNING:
        procs = "1 client process was" if client["procs"] == 1 else f"{client['procs']} client processes were"
        print_fn(f"C={c}: warning: {procs} {client['busy']:.0%} busy; the benchmark itself may limit this "
                 "level's tok/s (more --client-procs, on free cores, would tell)")


def _run_dict(cfg: OnlineConfig, base: str, model: str, endpoint: str, levels: list[dict]) -> dict:
    label = cfg.label or urlsplit(base).netloc
    return {"schema": SCHEMA, "label": label,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "settings": _settings(cfg, base, model, endpoint), "levels": levels}


async def run_online_async(cfg: OnlineConfig, print_fn=tqdm.write, on_level=None) -> dict:
    """Run every level of `cfg` and return the run dict (see runfile.py); `on_level(run)`, if
    given, gets the run of the levels measured so far after each one (to write it down before a
    time limit can cut the rest)."""
    base = api_base(cfg.url)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None
    # What each client process needs to build its own HTTP client (see procs.py).
    options = {"headers": headers, "timeout_s": cfg.timeout_s, "warm_url": f"{base}/models"}
    async with http_client(headers, cfg.timeout_s, max(cfg.concurrency)) as client:
        model = cfg.model or await discover_model(client, base)
        endpoint = cfg.endpoint or default_endpoint(cfg.prompts)
        url = base + endpoint_path(endpoint)
        await _warm_up(cfg, client, url, model, endpoint)
        levels = []
        for c in cfg.concurrency:
            count = requests_per_level(cfg, c)
            job = LevelJob(url, model, endpoint, cfg.prompts, count or PROMPT_POOL, cfg.seed + c, cfg.max_tokens,
                           cfg.extra_body, cfg.random_ids)
            plan = LevelPlan(c, count, cfg.duration_s, cfg.request_rate, seed=cfg.seed + c)
            levels.append(await _run_level(cfg, client, job, plan, options))
            _print_level(levels[-1], print_fn)
            if on_level is not None:
                on_level(_run_dict(cfg, base, model, endpoint, list(levels)))
    return _run_dict(cfg, base, model, endpoint, levels)


def run_online(cfg: OnlineConfig, print_fn=tqdm.write, on_level=None) -> dict:
    """Synchronous wrapper of `run_online_async`."""
    return asyncio.run(run_online_async(cfg, print_fn, on_level))
