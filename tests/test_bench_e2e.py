"""End to end: `1bit bench --serve` starts the real server on the tiny model, measures it, stops it.

Both tests also run levels over two client processes (--client-procs 2; a level never has more
processes than streams, so C=1 stays in one process).
"""

from __future__ import annotations

import json

from onebit.bench.cli import main as bench_main
from onebit.bench.tables import fmt_rate


def test_bench_serve_tiny_model(tiny_model_dir, tmp_path, capsys):
    code = bench_main(["--serve", f"-m {tiny_model_dir} --parallel 4 --ctx-size 256 --log-level warning",
                       "--concurrency", "1,3", "--requests", "6", "--max-tokens", "8", "--prompts", "random:16",
                       "--label", "tiny", "--out", str(tmp_path), "--no-progress", "--client-procs", "2"])
    assert code == 0, (tmp_path / "serve.log").read_text()
    run = json.loads((tmp_path / "tiny.json").read_text())
    assert run["settings"]["endpoint"] == "completions"
    assert [level["concurrency"] for level in run["levels"]] == [1, 3]
    assert run["settings"]["client_procs"] == 2 and [level["client"]["procs"] for level in run["levels"]] == [1, 2]
    for level in run["levels"]:
        summary = level["summary"]
        assert (summary["completed"], summary["failed"]) == (6, 0), summary["failures_by_kind"]
        assert summary["generated_tokens"] == 6 * 8 == sum(r["completion_tokens"] for r in level["requests"])
        assert [r["index"] for r in level["requests"]] == list(range(6))
        for request in level["requests"]:
            assert request["completion_tokens"] == 8 and request["prompt_tokens"] == 16
            assert request["finish_reason"] == "length"
            assert request["ttft"] <= request["e2e"]
    cells = " | ".join(fmt_rate(level["summary"]["total_tok_s"]) for level in run["levels"])
    assert f"| tiny | {cells} |" in (tmp_path / "tiny.md").read_text()
    assert f"| tiny | {cells} |" in capsys.readouterr().out
    assert (tmp_path / "tiny.png").read_bytes()[:4] == b"\x89PNG"


def test_server_killed_mid_run_gives_failures_not_a_hang(tiny_model_dir, tmp_path):
    import os
    import signal
    import threading
    import time

    from server_utils import start_server, stop_server

    server = start_server(tiny_model_dir, "--parallel", "4", "--ctx-size", "512")
    codes = {}

    def bench(procs: str):
        # Two benches at once against the one server: in this process, and over two client processes.
        codes[procs] = bench_main(["--url", server.root, "--concurrency", "4", "--requests", "40",
                                   "--max-tokens", "200", "--prompts", "random:16", "--label", "killed",
                                   "--out", str(tmp_path / procs), "--no-progress", "--timeout", "30",
                                   "--warmup", "0", "--client-procs", procs])

    workers = [threading.Thread(target=bench, args=(procs,), daemon=True) for procs in ("1", "2")]
    try:
        for worker in workers:
            worker.start()
        # Kill once the server has finished two requests (of the 80): the rest, ~78 x 200 tokens, cannot
        # finish within one 20 ms poll on any host (a fixed 3 s sleep let a fast host finish them all).
        deadline = time.monotonic() + 60
        while _finished_requests(server) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(server.proc.pid, signal.SIGKILL)
        for worker in workers:
            worker.join(timeout=120)
            assert not worker.is_alive(), "the bench must not hang when its server dies"
    finally:
        stop_server(server)
    assert codes == {"1": 0, "2": 0}
    for procs in ("1", "2"):
        run = json.loads((tmp_path / procs / "killed.json").read_text())
        level = run["levels"][0]
        assert level["client"]["procs"] == int(procs)
        summary = level["summary"]
        assert summary["failed"] > 0
        assert summary["completed"] + summary["failed"] == 40
        assert [r["index"] for r in level["requests"]] == list(range(40))
        assert all(r["completion_tokens"] == 200 for r in level["requests"] if not r.get("failure"))


def _finished_requests(server) -> float:
    """Requests the server has finished, by its /metrics (every finish reason summed)."""
    import re

    import httpx

    text = httpx.get(f"{server.root}/metrics", timeout=5).text
    return sum(float(v) for v in re.findall(r"^onebit:request_success_total\{[^}]*\} (\S+)$", text, re.M))
