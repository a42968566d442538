"""Unit tests of `1bit bench`: statistics, SSE failure classification against a fake server, outputs."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from onebit.bench.cli import _glue_serve_args, build_parser
from onebit.bench import procs
from onebit.bench.cli import main as bench_main
from onebit.bench.client import RequestResult, build_payload, stream_request
from onebit.bench.loadgen import LevelPlan
from onebit.bench.online import BenchError, OnlineConfig, run_online
from onebit.bench.prompts import Prompt, make_prompts, parse_prompt_spec
from onebit.bench.report import report, save_run
from onebit.bench.runfile import load_run
from onebit.bench.split import client_procs, split_plan
from onebit.bench.stats import percentile, summarize
from onebit.bench.tables import detail_table, fmt_rate

# ---------------------------------------------------------------- fake SSE server


class FakeState:
    """What the fake server saw: streams in flight now, and the most at once."""

    def __init__(self):
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _text_chunk(text: str | None = None, finish: str | None = None) -> str:
    delta = {"content": text} if text else {}
    return _sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                 "finish_reason": finish}], "usage": None})


def make_fake_app(state: FakeState) -> Starlette:
    """A fake OpenAI server whose stream misbehaves as the request's `scenario` (or prompt text) says."""

    async def chat(request: Request):
        body = await request.json()
        scenario = body.get("scenario") or (body["messages"][0]["content"] if "messages" in body else body["prompt"])
        if not isinstance(scenario, str):
            scenario = "clean"
        n = body["max_tokens"]
        state.requests += 1
        if scenario == "http500":
            return JSONResponse({"error": {"message": "nope", "type": "server_error"}}, status_code=500)

        async def events():
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                sent = n - 1 if scenario == "short" else n
                for i in range(2 if scenario in ("truncated", "reset", "error") else sent):
                    await asyncio.sleep(0.002)
                    yield _text_chunk(f"t{i}")
                if scenario == "truncated":
                    return
                if scenario == "reset":
                    raise RuntimeError("connection dropped on purpose")
                if scenario == "error":
                    yield _sse({"error": {"message": "backend died", "type": "server_error"}})
                    return
                yield _text_chunk(finish=None if scenario == "nofinish" else "length")
                if scenario != "nousage":
                    last = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": sent,
                                                     "total_tokens": 5 + sent}}
                    if scenario == "spec":  # llama-server's place for them: the last chunk
                        last["timings"] = {"predicted_n": sent, "draft_n": 6, "draft_n_accepted": 4}
                    yield _sse(last)
                yield "data: [DONE]\n\n"
            finally:
                state.in_flight -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", chat, methods=["POST"]),
                             Route("/v1/models", models)])


def _free_port() -> int:
    from server_utils import free_port  # reserved across the xdist workers

    return free_port()


@pytest.fixture(scope="module")
def fake():
    """(root URL, FakeState) of the fake server, running under uvicorn in a thread for this module."""
    state = FakeState()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(make_fake_app(state), host="127.0.0.1", port=port,
                                           log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "fake server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", state
    server.should_exit = True
    thread.join(10)


async def _one(root: str, scenario: str, max_tokens: int = 6) -> RequestResult:
    body = build_payload(Prompt(text=scenario), "chat", "fake-model", max_tokens)
    async with httpx.AsyncClient(timeout=20) as client:
        return await stream_request(client, f"{root}/v1/chat/completions", body)


# ---------------------------------------------------------------- SSE classification


@pytest.mark.parametrize("scenario,kind", [
    ("error", "error_event"), ("truncated", "truncated"), ("short", "short"),
    ("nofinish", "no_finish_reason"), ("nousage", "no_usage"), ("http500", "http"), ("reset", "connection"),
])
def test_bad_streams_are_failures(fake, scenario, kind):
    result = asyncio.run(_one(fake[0], scenario))
    assert not result.ok
    assert result.failure == kind, result.message
    assert result.message
    if kind == "error_event":
        assert "backend died" in result.message
    if kind == "short":
        assert result.completion_tokens == 5 and "5 of 6" in result.message


def test_clean_stream_is_timed(fake):
    result = asyncio.run(_one(fake[0], "clean", max_tokens=6))
    assert result.ok, result.message
    assert result.completion_tokens == 6 and result.prompt_tokens == 5
    assert result.finish_reason == "length"
    assert len(result.chunk_times) == 6
    assert result.ttft == result.chunk_times[0]
    assert result.chunk_times == sorted(result.chunk_times)
    assert result.e2e >= result.chunk_times[-1]


def test_nothing_listening_is_a_connection_failure():
    async def go():
        async with httpx.AsyncClient(timeout=5) as client:
            return await stream_request(client, f"http://127.0.0.1:{_free_port()}/v1/completions",
                                        {"max_tokens": 4})
    assert asyncio.run(go()).failure == "connection"


def test_payload_asks_for_fixed_length_and_usage():
    chat = build_payload(Prompt(text="hi"), "chat", "m", 32, {"top_k": 1})
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["ignore_eos"] is True and chat["min_tokens"] == 32 and chat["max_tokens"] == 32
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True} and chat["top_k"] == 1
    comp = build_payload(Prompt(token_ids=(5, 6, 7)), "completions", "m", 8, {"min_tokens": None})
    assert comp["prompt"] == [5, 6, 7] and "messages" not in comp and "min_tokens" not in comp


# ---------------------------------------------------------------- statistics


def _ok(index: int, tokens: int = 10, ttft: float = 0.1, step: float = 0.1) -> RequestResult:
    times = [ttft + i * step for i in range(tokens)]
    return RequestResult(index=index, ttft=ttft, e2e=times[-1], chunk_times=times, prompt_tokens=4,
                         completion_tokens=tokens, finish_reason="length")


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)


def test_summarize_counts_only_completed_tokens():
    results = [_ok(0), _ok(1), _ok(2),
               RequestResult(index=3, completion_tokens=7, failure="short", message="7 of 10"),
               RequestResult(index=4, failure="connection", message="refused")]
    s = summarize(results, wall_s=2.0, concurrency=2)
    assert (s["requests"], s["completed"], s["failed"], s["short"]) == (5, 3, 2, 1)
    assert s["failures_by_kind"] == {"short": 1, "connection": 1}
    assert s["generated_tokens"] == 30 and s["prompt_tokens"] == 12
    assert s["total_tok_s"] == pytest.approx(15.0)
    assert s["req_s"] == pytest.approx(1.5)
    assert s["per_request_tok_s"] == pytest.approx(10.0)  # 9 tokens after the first, in 0.9 s
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert s["itl_ms"]["p50"] == pytest.approx(100.0) and s["itl_ms"]["p99"] == pytest.approx(100.0)
    assert s["tpot_ms"] == pytest.approx(100.0)
    assert s["e2e_s"]["p50"] == pytest.approx(1.0)
    assert s["spec"] is None


def test_summarize_speculative_acceptance_and_empty_level():
    a, b, quiet = _ok(0), _ok(1), _ok(2)  # `quiet` reported no drafts (none made, or not a speculative server)
    a.draft_tokens, a.accepted_tokens, b.draft_tokens, b.accepted_tokens = 10, 6, 10, 2
    failed = RequestResult(index=3, draft_tokens=50, accepted_tokens=50, failure="timeout")
    spec = summarize([a, b, quiet, failed], 1.0, 2)["spec"]
    assert spec["drafted"] == 20 and spec["accepted"] == 8 and spec["rate"] == pytest.approx(0.4)
    empty = summarize([], 0.0, 4)
    assert empty["total_tok_s"] == 0.0 and empty["ttft_ms"]["p50"] is None and empty["spec"] is None


def test_stream_timings_reach_the_acceptance_column(fake):
    result = asyncio.run(_one(fake[0], "spec"))
    assert result.ok, result.message
    assert (result.draft_tokens, result.accepted_tokens) == (6, 4)
    plain = _ok(1)
    run = {"levels": [{"summary": summarize([result, result], 1.0, 2)}, {"summary": summarize([plain], 1.0, 1)}]}
    lines = detail_table(run).splitlines()
    assert lines[0].endswith("| spec accepted/drafted |") and lines[1].count("|") == lines[0].count("|")
    assert lines[2].startswith("| 1 |") and lines[2].endswith("| - |")
    assert lines[3].startswith("| 2 |") and lines[3].endswith("| 67% (8/12) |")
    no_spec = detail_table({"levels": [{"summary": summarize([plain], 1.0, 1)}]})
    assert "spec" not in no_spec and no_spec.splitlines()[2].count("|") == no_spec.splitlines()[0].count("|")


# ---------------------------------------------------------------- load generator and outputs


def _config(root: str, **overrides) -> OnlineConfig:
    options = dict(url=root, concurrency=[1, 3], max_tokens=5, prompts="random:8", requests=7,
                   progress=False, warmup=1)
    options.update(overrides)
    return OnlineConfig(**options)


def test_closed_loop_runs_every_request_with_at_most_c_in_flight(fake):
    root, state = fake
    state.max_in_flight = 0
    run = run_online(_config(root), print_fn=lambda *_: None)
    assert run["settings"]["model"] == "fake-model"  # discovered from /v1/models
    assert [level["concurrency"] for level in run["levels"]] == [1, 3]
    for level in run["levels"]:
        assert level["summary"]["completed"] == 7 and level["summary"]["failed"] == 0
        assert [r["index"] for r in level["requests"]] == list(range(7))
        assert all(r["completion_tokens"] == 5 for r in level["requests"])
        assert level["summary"]["generated_tokens"] == 35
    assert 1 <= state.max_in_flight <= 3


def test_each_finished_level_is_handed_over_before_the_next_starts(fake):
    root, _ = fake
    seen = []
    run = run_online(_config(root, concurrency=[1, 2, 3], requests=2), print_fn=lambda *_: None,
                     on_level=lambda partial: seen.append([lv["concurrency"] for lv in partial["levels"]]))
    assert seen == [[1], [1, 2], [1, 2, 3]]
    assert [lv["concurrency"] for lv in run["levels"]] == [1, 2, 3]


def test_open_loop_and_duration_modes(fake):
    root, state = fake
    state.max_in_flight = 0
    run = run_online(_config(root, concurrency=[2], request_rate=500.0), print_fn=lambda *_: None)
    assert run["levels"][0]["summary"]["completed"] == 7
    assert state.max_in_flight <= 2
    run = run_online(_config(root, concurrency=[2], requests=None, duration_s=0.3), print_fn=lambda *_: None)
    summary = run["levels"][0]["summary"]
    assert summary["requests"] >= 1 and summary["failed"] == 0


def test_dying_server_gives_failures_not_a_crash(fake):
    run = run_online(_config(fake[0], warmup=0, extra_body={"scenario": "reset"}), print_fn=lambda *_: None)
    for level in run["levels"]:
        assert level["summary"]["failed"] == 7 and level["summary"]["completed"] == 0
        assert level["summary"]["failures_by_kind"] == {"connection": 7}
    with pytest.raises(BenchError):
        run_online(_config(f"http://127.0.0.1:{_free_port()}", model="x"), print_fn=lambda *_: None)


def test_files_agree_with_json_and_report_merges(fake, tmp_path):
    run = run_online(_config(fake[0], label="fake run"), print_fn=lambda *_: None)
    json_path, md_path, png_path = save_run(run, tmp_path)
    assert json_path.name == "fake_run.json" and png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = load_run(json_path)
    md = md_path.read_text()
    cells = " | ".join(fmt_rate(level["summary"]["total_tok_s"]) for level in loaded["levels"])
    assert f"| fake run | {cells} |" in md
    for level in loaded["levels"]:
        s = level["summary"]
        assert f"| {s['concurrency']} | {s['completed']} | {s['failed']} | {s['short']} | " \
               f"{fmt_rate(s['total_tok_s'])} |" in md
    md2, png2 = report([json_path, json_path], tmp_path / "merged")
    merged = md2.read_text()
    assert f"| fake run | {cells} |" in merged and f"| fake run#2 | {cells} |" in merged
    assert png2.exists()
    assert bench_main(["report", str(json_path), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "report.md").exists()
    (tmp_path / "bad.json").write_text("{}")
    assert bench_main(["report", str(tmp_path / "bad.json"), "--out", str(tmp_path)]) == 1


# ---------------------------------------------------------------- client processes


def test_split_plan_shares_workers_requests_and_rate():
    shares = split_plan(LevelPlan(10, requests=23, request_rate=5.0), 3)
    assert [s.plan.concurrency for s in shares] == [4, 3, 3]
    assert sorted(i for s in shares for i in s.indices()) == list(range(23))  # a partition, in blocks
    assert [s.plan.requests for s in shares] == [9, 7, 7]  # in proportion to the workers
    assert sum(s.plan.request_rate for s in shares) == pytest.approx(5.0)
    assert len({s.plan.seed for s in shares}) == 3  # independent arrival streams
    timed = split_plan(LevelPlan(5, duration_s=2.0), 2)
    assert [(s.index(0), s.index(1)) for s in timed] == [(0, 2), (1, 3)]
    assert all(s.plan.duration_s == 2.0 and s.plan.requests is None for s in timed)
    assert len(split_plan(LevelPlan(8, requests=1), 4)) == 1  # no process without a request


def test_client_procs_setting():
    assert [client_procs("auto", c, cpu_count=64) for c in (1, 16, 17, 64)] == [1, 1, 2, 4]
    assert client_procs("auto", 64, cpu_count=2) == 1 and client_procs("auto", 64, cpu_count=5) == 3
    assert client_procs(8, 3) == 3 and client_procs(2, 1) == 1
    assert build_parser().parse_args(["--url", "u", "--client-procs", "3"]).client_procs == 3
    assert build_parser().parse_args(["--url", "u"]).client_procs == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--url", "u", "--client-procs", "0"])


def test_sse_lines_split_across_reads():
    events = [_text_chunk(f"t{i}") for i in range(3)] + [_text_chunk(finish="length")]
    events += [_sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}), "data: [DONE]"]
    raw = "".join(events).replace("\n\n", "\r\n\r\n").encode()  # CRLF, and no newline after [DONE]

    async def pieces():
        for i in range(0, len(raw), 7):
            yield raw[i:i + 7]

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=pieces()))

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_request(client, "http://x/v1/completions", {"max_tokens": 3})
    result = asyncio.run(go())
    assert result.ok, result.message
    assert len(result.chunk_times) == 3 and result.completion_tokens == 3


def test_level_over_two_client_processes(fake):
    root, state = fake
    state.max_in_flight = 0
    run = run_online(_config(root, concurrency=[1, 4], requests=9, client_procs=2), print_fn=lambda *_: None)
    assert run["settings"]["client_procs"] == 2
    assert [level["client"]["procs"] for level in run["levels"]] == [1, 2]  # never more processes than C
    level = run["levels"][1]
    assert level["client"]["cpu_s"] > 0
    assert level["summary"]["completed"] == 9 and level["summary"]["failed"] == 0
    assert [r["index"] for r in level["requests"]] == list(range(9))
    assert sum(r["completion_tokens"] for r in level["requests"]) == level["summary"]["generated_tokens"] == 45
    assert all(r["start"] >= 0 and len(r["chunk_times"]) == 5 for r in level["requests"])
    assert level["summary"]["wall_s"] >= max(r["start"] + r["e2e"] for r in level["requests"]) - 1e-5
    assert state.max_in_flight <= 4
    timed = run_online(_config(root, concurrency=[3], requests=None, duration_s=0.3, request_rate=200.0,
                               client_procs=2, warmup=0), print_fn=lambda *_: None)["levels"][0]
    indices = [r["index"] for r in timed["requests"]]
    assert timed["summary"]["failed"] == 0 and len(set(indices)) == len(indices) >= 1


# A stand-in for worker.py that says it is ready, reports its first request, then dies or hangs.
_FAKE_CHILD = """
import json, sys, time
share = json.loads(sys.stdin.readline())
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()
print(json.dumps({"result": {"index": share["first"], "e2e": 0.01, "completion_tokens": 5}}), flush=True)
if sys.argv[1] == "hang":
    time.sleep(60)
sys.exit(7)
"""


@pytest.mark.parametrize("fate", ["die", "hang"])
def test_dead_or_hung_client_process_gives_failures(fake, monkeypatch, fate):
    monkeypatch.setattr(procs, "child_command", lambda: [sys.executable, "-c", _FAKE_CHILD, fate])
    monkeypatch.setattr(procs, "SILENCE_TIMEOUT_S", 0.5)
    run = run_online(_config(fake[0], concurrency=[4], requests=10, client_procs=2), print_fn=lambda *_: None)
    level = run["levels"][0]
    assert [r["index"] for r in level["requests"]] == list(range(10))
    assert (level["summary"]["completed"], level["summary"]["failed"]) == (2, 8)
    assert level["summary"]["failures_by_kind"] == {"client": 8}
    message = next(r["message"] for r in level["requests"] if r["failure"])
    assert ("exit code 7" if fate == "die" else "silent") in message


def test_client_process_that_cannot_start_is_an_error(fake, monkeypatch):
    monkeypatch.setattr(procs, "child_command", lambda: [sys.executable, "-c", "raise SystemExit('no httpx here')"])
    with pytest.raises(BenchError, match="no httpx here"):
        run_online(_config(fake[0], concurrency=[2], client_procs=2), print_fn=lambda *_: None)


# ---------------------------------------------------------------- prompts and arguments


def test_prompt_sets():
    assert parse_prompt_spec("random:64") == ("random", 64)
    for bad in ("random", "random:0", "poems", "random:x"):
        with pytest.raises(ValueError):
            parse_prompt_spec(bad)
    ids = make_prompts("random:16", 5, "completions", seed=1)
    assert all(len(p.token_ids) == 16 for p in ids) and len({p.token_ids for p in ids}) == 5
    assert ids == make_prompts("random:16", 5, "completions", seed=1)
    words = make_prompts("random:16", 2, "chat")
    assert all(len(p.text.split()) == 16 for p in words)
    for name in ("chat", "code", "prose", "short"):
        texts = [p.text for p in make_prompts(name, 20, "chat")]
        assert all(texts) and len(set(texts)) >= 4


def test_shared_prefix_prompts():
    assert parse_prompt_spec("shared:8+4") == ("shared", 12)
    for bad in ("shared", "shared:8", "shared:0+4", "shared:8+0", "shared:a+4", "shared:8+4+2"):
        with pytest.raises(ValueError):
            parse_prompt_spec(bad)
    ids = make_prompts("shared:8+4", 5, "completions", seed=1)
    assert all(len(p.token_ids) == 12 for p in ids)
    assert len({p.token_ids[:8] for p in ids}) == 1 and len({p.token_ids[8:] for p in ids}) == 5
    # The same prefix whatever the per-prompt seed (a warm-up request caches it), other own tokens.
    warm = make_prompts("shared:8+4", 1, "completions", seed="warm-up")[0]
    assert warm.token_ids[:8] == ids[0].token_ids[:8] and warm.token_ids[8:] != ids[0].token_ids[8:]
    words = make_prompts("shared:6+3", 3, "chat", seed=2)
    assert len({" ".join(p.text.split()[:6]) for p in words}) == 1
    assert all(len(p.text.split()) == 9 for p in words)


def test_arguments():
    argv = _glue_serve_args(["--serve", "-m /models/x --parallel 8", "--concurrency", "1,2"])
    args = build_parser().parse_args(argv)
    assert args.serve == "-m /models/x --parallel 8" and args.concurrency == [1, 2]
    offline = build_parser().parse_args(["--offline", "-m", "d", "--batch", "1,8", "--max-tokens", "16",
                                         "--prompt-tokens", "32", "--device", "cpu", "--dtype", "float32"])
    assert offline.offline and offline.batch == [1, 8] and offline.prompt_tokens == 32
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--url", "http://x", "--prompts", "poems"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--url", "http://x", "--requests", "3", "--duration", "2"])
    with pytest.raises(SystemExit):
        bench_main(["--concurrency", "1"])  # neither --url nor --serve
    assert build_parser().parse_args(["--url", "http://x", "--gpu-clocks", "1"]).gpu_clocks == 1
    assert build_parser().parse_args(["--url", "http://x"]).gpu_clocks is None
    for bad in ("-1", "gpu0", ""):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--url", "http://x", "--gpu-clocks", bad])


def test_gpu_clocks_sampled_over_each_level_reach_the_tables(fake, tmp_path, monkeypatch):
    """`--gpu-clocks INDEX`: each level's summary holds the GPU's clock over it (a fake nvidia-smi here, on
    PATH), the level's line says it, the detailed table gets a column; without the option, no column;
    with it but no sample, a warning instead of a figure."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\necho \"$*\" >> " + str(tmp_path / "args") + "\n"
                                         "printf '1710, 678.5, 0x4\\n1740, 681.5, 0x4\\n'\nexec sleep 60\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    printed = []
    run = run_online(_config(fake[0], gpu_clocks=3), print_fn=printed.append)
    assert run["settings"]["gpu_clocks"] == 3
    arg_lines = (tmp_path / "args").read_text().splitlines()
    assert len(arg_lines) == 2 and all("-i 3 " in line for line in arg_lines)  # one sampler a level, GPU 3
    for level in run["levels"]:
        clock = level["summary"]["gpu_clock"]
        assert clock["samples"] == 2 and clock["sm_mhz_mean"] == 1725.0 and clock["reasons"] == ["power cap"]
    assert "C=3: GPU 1,725 MHz (min 1,710), 680 W, slowed 100% (power cap)" in printed
    table = detail_table(run).splitlines()
    assert table[0].endswith("| GPU clock |") and table[2].endswith("| 1,725 MHz (min 1,710), 680 W, slowed 100% "
                                                                     "(power cap) |")
    plain = run_online(_config(fake[0]), print_fn=lambda *_: None)
    assert "gpu_clock" not in plain["levels"][0]["summary"] and "GPU clock" not in detail_table(plain)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    printed.clear()
    blind = run_online(_config(fake[0], gpu_clocks=0, concurrency=[1]), print_fn=printed.append)
    assert blind["levels"][0]["summary"]["gpu_clock"] is None
    assert any("no GPU clock sample" in line for line in printed)
    assert detail_table(blind).splitlines()[2].endswith("| - |")
