"""The long-prompt workload of `1bit bench` (#19): prompt lengths, the shared prefix, decode tok/s
without first-token time, per-level request counts, and the side-by-side table of bench/long_prompt.py.

One tiny-model server for the module; its prefix cache (blocks of 16 tokens) must serve the whole
shared prefix of every shared:P+N request once the warm-up has sent it, and none of random ones.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from onebit.bench.cli import build_parser
from onebit.bench.cli import main as bench_main
from onebit.bench.client import RequestResult, _StreamState
from onebit.bench.online import OnlineConfig, requests_per_level, run_online
from onebit.bench.prompts import make_prompts
from onebit.bench.stats import decode_rate, summarize, union_seconds
from onebit.bench.tables import detail_table
from server_utils import openai_clients, start_server, stop_server

REPO = Path(__file__).resolve().parents[1]
PREFIX, OWN = 64, 16  # the prefix is four whole KV blocks


def _long_prompt_module():
    spec = importlib.util.spec_from_file_location("long_prompt", REPO / "bench" / "long_prompt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """A tiny-model server with 4 slots (prefix caching on, as by default)."""
    srv = start_server(tiny_model_dir, "--parallel", "4", "--ctx-size", "256")
    yield srv
    stop_server(srv)


def _run(server, prompts: str, concurrency: list[int], requests: list[int] | int) -> dict:
    cfg = OnlineConfig(url=server.root, concurrency=concurrency, max_tokens=4, prompts=prompts,
                       requests=requests, progress=False, label="tiny")
    return run_online(cfg, print_fn=lambda *_: None)


# ---------------------------------------------------------------- against the tiny server


def test_shared_prefix_is_served_from_the_prefix_cache(server):
    run = _run(server, f"shared:{PREFIX}+{OWN}", [1, 3], [2, 3])
    assert [(lv["concurrency"], lv["summary"]["requests"]) for lv in run["levels"]] == [(1, 2), (3, 3)]
    for level in run["levels"]:
        assert level["summary"]["failed"] == 0, level["summary"]["failures_by_kind"]
        for r in level["requests"]:
            assert r["prompt_tokens"] == PREFIX + OWN
            # The warm-up request cached the prefix; each prompt's own tokens are new.
            assert PREFIX <= r["cached_tokens"] < PREFIX + OWN
        s = level["summary"]
        assert s["cached_prompt_tokens"] == sum(r["cached_tokens"] for r in level["requests"])
        assert s["decode_tok_s"] is not None and s["decode_tok_s"] > 0
    assert "| prompt cached |" in detail_table(run).splitlines()[0]


def test_random_prompts_have_their_length_and_no_cache_hits(server):
    # random:48 first and random:96 after: the longer prompts must not begin with the shorter ones.
    for length in (48, 96):
        run = _run(server, f"random:{length}", [2], 4)
        requests = run["levels"][0]["requests"]
        assert [r["prompt_tokens"] for r in requests] == [length] * 4
        assert [r["cached_tokens"] for r in requests] == [0] * 4


def test_openai_client_sees_the_cached_prefix(server):
    sync, _ = openai_clients(server)
    ids = list(make_prompts(f"shared:{PREFIX}+{OWN}", 1, "completions", seed="openai")[0].token_ids)
    model = sync.models.list().data[0].id
    first = sync.completions.create(model=model, prompt=ids, max_tokens=1)
    again = sync.completions.create(model=model, prompt=ids[:PREFIX] + ids[PREFIX:][::-1], max_tokens=1)
    assert first.usage.prompt_tokens == again.usage.prompt_tokens == PREFIX + OWN
    assert again.usage.prompt_tokens_details.cached_tokens >= PREFIX


def test_side_by_side_table_of_long_prompt_runs(server, tmp_path):
    lp = _long_prompt_module()
    for workload in (f"shared:{PREFIX}+{OWN}", "random:32"):
        run = _run(server, workload, [1, 2], [2, 2])
        run["label"], run["workload"] = "1bit", workload
        (tmp_path / lp.run_file(tmp_path, "1bit", workload).name).write_text(json.dumps(run))
    table = lp.side_by_side(lp.load_runs([tmp_path]))
    rows = [line for line in table.splitlines()[2:]]
    assert [row.split(" | ")[:2] for row in rows] == [["| random:32", "1"], ["| random:32", "2"],
                                                       [f"| shared:{PREFIX}+{OWN}", "1"], [f"| shared:{PREFIX}+{OWN}", "2"]]
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert cells[6] in ("32 / n/m", f"{PREFIX + OWN} / n/m")  # prompt tokens, no peer measured
        assert cells[-1] == "-" and cells[-2] == "-"  # no ratio without the peer
    assert lp.main(["table", str(tmp_path), "--out", str(tmp_path / "table.md")]) == 0
    assert (tmp_path / "table.md").read_text().startswith(table)


# ---------------------------------------------------------------- units


def _result(start: float, ttft: float, e2e: float, tokens: int) -> RequestResult:
    return RequestResult(index=0, start=start, ttft=ttft, e2e=e2e, completion_tokens=tokens, prompt_tokens=8)


def test_decode_rate_leaves_out_time_before_any_first_token():
    assert union_seconds([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert union_seconds([]) == 0.0
    # One request: its own decode rate, 10 tokens after the first in 2 s.
    assert decode_rate([_result(0.0, 1.0, 3.0, 11)]) == pytest.approx(5.0)
    # A burst of two: nobody decodes for the first second; then [1, 3] and [2, 3] overlap.
    burst = [_result(0.0, 1.0, 3.0, 11), _result(0.0, 2.0, 3.0, 11)]
    assert decode_rate(burst) == pytest.approx(20 / 2.0)
    s = summarize(burst, wall_s=3.0, concurrency=2)
    assert s["decode_tok_s"] == pytest.approx(10.0) and s["total_tok_s"] == pytest.approx(22 / 3.0)
    assert s["cached_prompt_tokens"] is None  # nobody reported a cache
    assert decode_rate([_result(0.0, 1.0, 1.0, 1)]) is None


def test_cached_tokens_from_usage_or_llama_timings():
    state = _StreamState(RequestResult(index=0), 0.0)
    state.feed(json.dumps({"choices": [], "timings": {"cache_n": 7, "prompt_n": 3}}).encode(), 0.1)
    assert state.result.cached_tokens == 7
    state.feed(json.dumps({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                                                    "prompt_tokens_details": {"cached_tokens": 9}}}).encode(), 0.2)
    assert state.result.cached_tokens == 9  # usage wins where both say
    silent = _StreamState(RequestResult(index=1), 0.0)
    silent.feed(json.dumps({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}}).encode(), 0.1)
    assert silent.result.cached_tokens is None


def test_requests_per_level_list():
    cfg = OnlineConfig(url="http://x", concurrency=[1, 8, 32], requests=[8, 16, 32])
    assert [requests_per_level(cfg, c) for c in (1, 8, 32)] == [8, 16, 32]
    with pytest.raises(ValueError):
        OnlineConfig(url="http://x", concurrency=[1, 8], requests=[8, 16, 32])
    args = build_parser().parse_args(["--url", "http://x", "--concurrency", "1,8", "--requests", "4,16"])
    assert args.requests == [4, 16]
    with pytest.raises(SystemExit):
        bench_main(["--url", "http://x", "--concurrency", "1,8", "--requests", "4,16,32"])


def test_random_prompts_of_different_lengths_share_no_prefix():
    short = make_prompts("random:64", 3, "completions", seed=1)
    long = make_prompts("random:256", 3, "completions", seed=1)
    assert all(len(p.token_ids) == 256 for p in long)
    assert all(a.token_ids[:16] != b.token_ids[:16] for a in short for b in long)
    assert make_prompts("random:64", 3, "completions", seed=1) == short  # still reproducible
