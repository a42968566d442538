"""End to end: `1bit bench --serve` starts the real server on the tiny model, measures it, stops it."""

from __future__ import annotations

import json

from onebit.bench.cli import main as bench_main
from onebit.bench.tables import fmt_rate


def test_bench_serve_tiny_model(tiny_model_dir, tmp_path, capsys):
    code = bench_main(["--serve", f"-m {tiny_model_dir} --parallel 4 --ctx-size 256 --log-level warning",
                       "--concurrency", "1,3", "--requests", "6", "--max-tokens", "8", "--prompts", "random:16",
                       "--label", "tiny", "--out", str(tmp_path), "--no-progress"])
    assert code == 0, (tmp_path / "serve.log").read_text()
    run = json.loads((tmp_path / "tiny.json").read_text())
    assert run["settings"]["endpoint"] == "completions"
    assert [level["concurrency"] for level in run["levels"]] == [1, 3]
    for level in run["levels"]:
        summary = level["summary"]
        assert (summary["completed"], summary["failed"]) == (6, 0), summary["failures_by_kind"]
        assert summary["generated_tokens"] == 6 * 8
        for request in level["requests"]:
            assert request["completion_tokens"] == 8 and request["prompt_tokens"] == 16
            assert request["finish_reason"] == "length"
            assert request["ttft"] <= request["e2e"]
    cells = " | ".join(fmt_rate(level["summary"]["total_tok_s"]) for level in run["levels"])
    assert f"| tiny | {cells} |" in (tmp_path / "tiny.md").read_text()
    assert f"| tiny | {cells} |" in capsys.readouterr().out
    assert (tmp_path / "tiny.png").read_bytes()[:4] == b"\x89PNG"
