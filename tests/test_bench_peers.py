"""The peers harness without a llama-server: the shape model with weights on disk, the greedy check
against a scripted llama-server, the reference cache and the report of run_peers.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from onebit.bench.runfile import SCHEMA
from onebit.bench.stats import summarize
from onebit.testing.gguf_export import export_gguf
from onebit.models.loader import load_model
from onebit.models.tokenizer import Tokenizer

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "peers")]
import llamacpp_peer  # noqa: E402
import make_shape_model as msm  # noqa: E402
import run_peers  # noqa: E402


@pytest.fixture(scope="module")
def shape_model(tmp_path_factory):
    """qwen3-tiny with 100 ids past its tokenizer, filled, and random bf16 weights in 3+ shards."""
    out = msm.make_shape_model(tmp_path_factory.mktemp("shape") / "m", "qwen3-tiny")
    config = json.loads((out / "config.json").read_text())
    config["vocab_size"] = 1124
    (out / "config.json").write_text(json.dumps(config))
    assert msm.fill_vocab(out) == 100
    files = msm.write_random_weights(out, "cpu", shard_bytes=400_000)
    assert len(files) >= 3
    return out


def test_fill_vocab_keeps_ids_and_gives_every_id_a_text(shape_model):
    tok = Tokenizer.from_dir(shape_model)
    assert tok.vocab_size == 1124
    assert tok.decode([1024, 1123]) == " [1024] [1123]"
    assert tok.token_to_id("<|im_end|>") == 1021 and tok.token_to_id("</think>") == 1023
    assert tok.decode(tok.encode("hello world")) == "hello world"


def test_weights_on_disk_are_the_dummy_weights(shape_model):
    index = json.loads((shape_model / msm.INDEX).read_text())
    assert "model.layers.0.self_attn.k_proj.weight" in index["weight_map"]
    assert "model.layers.1.mlp.up_proj.weight" in index["weight_map"]
    ours, _ = load_model(shape_model, torch.device("cpu"), torch.bfloat16, "auto")
    dummy, _ = load_model(shape_model, torch.device("cpu"), torch.bfloat16, "dummy")
    for (name, a), b in zip(ours.state_dict().items(), dummy.state_dict().values()):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b), name


def test_gguf_of_the_shape_model(shape_model, tmp_path):
    import gguf
    reader = gguf.GGUFReader(export_gguf(shape_model, tmp_path / "m.gguf", "bf16"))
    tokens = reader.get_field("tokenizer.ggml.tokens").contents()
    assert len(tokens) == 1124 and tokens[1100] == "\u0120[1100]"
    assert {t.name: t.tensor_type for t in reader.tensors}["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.BF16


# ---------------------------------------------------------------- greedy check against a scripted server

def _scripted(monkeypatch, greedy: list[int], top: dict[int, list[tuple[int, float]]]):
    """llama-server whose greedy continuation is `greedy` and whose top list after a prompt of
    length L is top[L] (token, logprob)."""
    def completion(root, prompt, n, n_probs=0):
        if not n_probs:
            return {"tokens": greedy[:n]}
        return {"completion_probabilities": [{"top_logprobs": [{"id": t, "logprob": lp} for t, lp in top[len(prompt)]]}]}
    monkeypatch.setattr(llamacpp_peer, "_completion", completion)


PROMPT = [40, 41, 42]
OURS = [7, 8, 9, 10]


def test_exact_check(monkeypatch):
    _scripted(monkeypatch, OURS, {})
    ok, message = llamacpp_peer.greedy_check("http://x", PROMPT, OURS)
    assert ok and "all 4 tokens" in message
    _scripted(monkeypatch, [7, 8, 5, 5], {})
    ok, message = llamacpp_peer.greedy_check("http://x", PROMPT, OURS)
    assert not ok and message.startswith("GREEDY MISMATCH at token 2")


def test_reduced_precision_check_passes_a_near_tie(monkeypatch):
    # llama-server flips token 2 (a near tie), then goes its own way; fed 1bit's tokens it agrees.
    top = {3: [(7, -1.0), (1, -2.0)], 4: [(8, -1.0)], 5: [(5, -1.00), (9, -1.02)], 6: [(10, -0.5)]}
    _scripted(monkeypatch, [7, 8, 5, 3], top)
    ok, message = llamacpp_peer.greedy_check("http://x", PROMPT, OURS, exact=False)
    assert ok, message
    assert "first 2 of 4 tokens" in message and "top-1 at 3/4 steps" in message and "0.020" in message
    ok, _ = llamacpp_peer.greedy_check("http://x", PROMPT, OURS, exact=True)
    assert not ok


@pytest.mark.parametrize("step5", [[(5, -1.0), (6, -1.1)],               # 1bit's token not in its top list
                                   [(5, -1.0), (6, -1.1), (9, -2.0)]])   # in it, but far below the best
def test_reduced_precision_check_fails_another_model(monkeypatch, step5):
    top = {3: [(7, -1.0)], 4: [(8, -1.0)], 5: step5, 6: [(10, -0.5)]}
    _scripted(monkeypatch, [7, 8, 5, 3], top)
    ok, message = llamacpp_peer.greedy_check("http://x", PROMPT, OURS, exact=False)
    assert not ok and message.startswith("GREEDY MISMATCH")


def test_reference_is_cached_per_checkpoint(shape_model, tmp_path, monkeypatch):
    calls = []

    def fake_greedy(model_dir, prompt, n, device):
        calls.append(n)
        return list(range(n))
    monkeypatch.setattr(llamacpp_peer, "ours_greedy", fake_greedy)
    cache = tmp_path / "ref.json"
    prompt, tokens = llamacpp_peer.reference(shape_model, 4, "cpu", cache)
    assert tokens == [0, 1, 2, 3] and prompt == llamacpp_peer.check_prompt(1124)
    assert llamacpp_peer.reference(shape_model, 4, "cpu", cache) == (prompt, tokens) and calls == [4]
    llamacpp_peer.reference(shape_model, 5, "cpu", cache)  # another length: computed again
    assert calls == [4, 5]


# ---------------------------------------------------------------- run_peers.py

def _run(label: str, note: str) -> dict:
    return {"schema": SCHEMA, "label": label,
            "settings": {"url": "http://127.0.0.1:1/v1", "model": "m", "prompts": "random:8", "endpoint": None,
                         "max_tokens": 4, "requests": 8},
            "levels": [{"concurrency": 1, "summary": summarize([], 1.0, 1), "requests": []}],
            "peer": {"command": f"{label}-server --flag", "notes": [note]}}


def test_report_of_included_runs_says_how_each_server_ran(tmp_path, capsys):
    paths = []
    for label in ("1bit", "llama.cpp"):
        paths.append(tmp_path / f"{label}.json")
        paths[-1].write_text(json.dumps(_run(label, f"{label} note")))
    argv = ["-m", str(tmp_path), "--peers", "", "--out", str(tmp_path / "out")]
    assert run_peers.main(argv + ["--include", str(paths[0]), "--include", str(paths[1])]) == 1  # none measured now
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Servers" in md and "- **llama.cpp**: `llama.cpp-server --flag`" in md and "  - 1bit note" in md
    assert "| llama.cpp |" in md


def test_arguments():
    args = run_peers.parse_args(["-m", "M", "--ours-args", "--device cuda", "--gguf", "g.gguf", "--check-gguf",
                                 "--gguf-dtype", "bf16", "--check-reference", "r.json", "--note", "a", "--note", "b"])
    assert args.serve_args == "--device cuda" and args.check_gguf and args.gguf_dtype == "bf16"
    assert args.check_reference == "r.json" and args.note == ["a", "b"] and args.include == []


def test_llama_cpp_peer_checks_a_given_gguf_only_when_told(monkeypatch, tmp_path):
    monkeypatch.setattr(run_peers, "reference", lambda model, n, device, cache: ([1, 2], [3] * n))
    seen = {}

    def fake_check(root, prompt, ours, exact=True):
        seen.update(prompt=prompt, ours=ours, exact=exact)
        return True, "ok"
    monkeypatch.setattr(run_peers, "greedy_check", fake_check)
    base = ["-m", str(tmp_path), "--llama-server", "/bin/true", "--gguf", "g.gguf", "--concurrency", "1,64",
            "--ctx-per-slot", "1024", "--llama-args", "-ngl 99 -fa on", "--check-tokens", "6"]
    peer = run_peers.llama_cpp(run_peers.parse_args(base))
    assert peer.check is None and "not checked" in peer.notes[0]
    cmd = " ".join(peer.cmd)
    assert "-m g.gguf" in cmd and "-np 64 -c 65536 -ngl 99 -fa on" in cmd
    peer = run_peers.llama_cpp(run_peers.parse_args(base + ["--check-gguf", "--gguf-dtype", "bf16"]))
    assert peer.check("http://x") == (True, "ok")
    assert seen == {"prompt": [1, 2], "ours": [3] * 6, "exact": False}


def test_report_without_matplotlib(tmp_path, monkeypatch):
    path = tmp_path / "1bit.json"
    path.write_text(json.dumps(_run("1bit", "n")))

    def no_plot(*args, **kwargs):
        raise ImportError("No module named 'matplotlib'")
    monkeypatch.setattr("onebit.bench.report.plot_runs", no_plot)
    assert run_peers.main(["-m", str(tmp_path), "--peers", "", "--include", str(path), "--out", str(tmp_path)]) == 1
    assert "## Servers" in (tmp_path / "report.md").read_text() and not (tmp_path / "report.png").exists()
