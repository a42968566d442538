"""tools/train_demo.py (code in tools/demo_training/): the smoke run writes a loadable model whose MTP head
has the documented layout."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "train_demo.py"


def _load_script():
    name = "train_demo_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def td():
    """The training package, imported the way the entry script imports it."""
    _load_script()  # puts the repository on sys.path, as `python3 tools/train_demo.py` does
    return importlib.import_module("tools.demo_training")


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    """Output of `train_demo.py --smoke`, run once on the CPU."""
    out = tmp_path_factory.mktemp("demo-smoke")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out / "model"),
                           "--package-to", str(out / "package")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (out / "model" / "stdout.txt").write_text(proc.stdout)
    return out / "model"


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_output_files(smoke_dir):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "metrics.json", "MODEL_CARD.md"):
        assert (smoke_dir / name).is_file(), name
    assert sum(f.stat().st_size for f in smoke_dir.iterdir()) < 40e6


def test_package_reassembles_to_the_same_directory(smoke_dir, td, tmp_path):
    package_dir = smoke_dir.parent / "package"
    names = sorted(p.name for p in package_dir.iterdir())
    assert names == ["demo_model_files.tar", "model.safetensors.part00"]
    target = tmp_path / "assembled"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "assemble_demo.py"), str(package_dir), str(target)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in ("model.safetensors", "config.json", "tokenizer.json", "metrics.json", "MODEL_CARD.md"):
        assert (target / name).read_bytes() == (smoke_dir / name).read_bytes(), name
    assert not (target / "PARTS.json").exists()


def test_package_splits_into_small_pieces_and_detects_a_bad_one(tmp_path):
    from tools.demo_training.package import assemble, package

    model = tmp_path / "model"
    model.mkdir()
    weights = bytes(range(256)) * 40  # 10,240 bytes
    (model / "model.safetensors").write_bytes(weights)
    (model / "config.json").write_text("{}")
    written = package(model, tmp_path / "out", part_bytes=4096)
    parts = sorted(p for p in written if ".part" in p.name)
    assert [p.stat().st_size for p in parts] == [4096, 4096, 2048]
    assemble(tmp_path / "out", tmp_path / "back")
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "back" / "config.json").read_text() == "{}"
    # A smaller model later: the stale third piece goes.
    (model / "model.safetensors").write_bytes(weights[:5000])
    package(model, tmp_path / "out", part_bytes=4096)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.part*")) == ["model.safetensors.part00",
                                                                            "model.safetensors.part01"]
    (tmp_path / "out" / "model.safetensors.part01").write_bytes(b"x" * 904)
    with pytest.raises(ValueError, match="sha256"):
        assemble(tmp_path / "out", tmp_path / "bad")


def test_config_and_tokenizer_files(smoke_dir):
    cfg = _config(smoke_dir)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["torch_dtype"] == "bfloat16"
    assert cfg["num_nextn_predict_layers"] == 1
    assert cfg["tie_word_embeddings"] is True
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (64, 2, 512)

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smoke_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert None not in ids.values()
    assert tok.get_vocab_size() == cfg["vocab_size"]
    text = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(text).ids) == text

    tok_cfg = json.loads((smoke_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|im_end|>" and "<|im_start|>" in tok_cfg["chat_template"]
    gen = json.loads((smoke_dir / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) == {ids["<|endoftext|>"], ids["<|im_end|>"]}


def test_mtp_tensors_have_the_documented_layout(smoke_dir):
    cfg = _config(smoke_dir)
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    expected = {
        "mtp.pre_fc_norm_embedding.weight": [h],
        "mtp.pre_fc_norm_hidden.weight": [h],
        "mtp.fc.weight": [h, 2 * h],
        "mtp.layers.0.input_layernorm.weight": [h],
        "mtp.layers.0.self_attn.q_proj.weight": [q, h],
        "mtp.layers.0.self_attn.k_proj.weight": [kv, h],
        "mtp.layers.0.self_attn.v_proj.weight": [kv, h],
        "mtp.layers.0.self_attn.o_proj.weight": [h, q],
        "mtp.layers.0.self_attn.q_norm.weight": [d],
        "mtp.layers.0.self_attn.k_norm.weight": [d],
        "mtp.layers.0.post_attention_layernorm.weight": [h],
        "mtp.layers.0.mlp.gate_proj.weight": [inter, h],
        "mtp.layers.0.mlp.up_proj.weight": [inter, h],
        "mtp.layers.0.mlp.down_proj.weight": [h, inter],
        "mtp.norm.weight": [h],
    }
    with safe_open(str(smoke_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        shapes = {n: list(f.get_slice(n).get_shape()) for n in names}
        dtypes = {f.get_tensor(n).dtype for n in names}
    assert {n: shapes.get(n) for n in expected} == expected
    assert {n for n in names if n.startswith("mtp.")} == set(expected)
    assert dtypes == {torch.bfloat16}
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied


def test_transformers_loads_the_base_model_with_the_same_logits(smoke_dir, td):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(smoke_dir), dtype=torch.float32).eval()
    ours = td.load_demo(smoke_dir)
    ids = torch.randint(0, _config(smoke_dir)["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
        got = ours.logits(ours.base(ids))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    metrics = json.loads((smoke_dir / "metrics.json").read_text())
    assert metrics["transformers_max_abs_logit_diff"] < 1e-4


def test_best_checkpoint_is_the_lowest_validation_objective(smoke_dir):
    metrics = json.loads((smoke_dir / "metrics.json").read_text())
    weight = metrics["mtp_loss_weight"]
    scored = [(v["val_loss"] + weight * v["val_mtp_loss"], v["step"]) for v in metrics["val_curve"] if v["step"] > 0]
    assert metrics["best_checkpoint"]["step"] == min(scored)[1]
    assert metrics["val_curve"][-1]["step"] == metrics["training"]["steps"]  # the final state was a candidate


def test_chat_pairs_and_generation_checks_recorded(smoke_dir):
    metrics = json.loads((smoke_dir / "metrics.json").read_text())
    chat = metrics["data"]["chat_pairs"]
    assert chat["pairs"] > 0 and 0 < chat["token_fraction"] < 0.1
    assert chat["example"].startswith("<|im_start|>user\nWrite a Python function ")
    gen = metrics["generation_checks"]
    assert [c["prompt"] for c in gen["code_prompts"]][:1] == ["def fibonacci(n):"] and gen["code_total"] == 5
    assert gen["code_parsed"] == sum(c["parses"] for c in gen["code_prompts"])
    assert gen["chat"]["request"] == "Write a Python function to add two numbers."
    dropped = metrics["data"]["dropped"]
    assert set(dropped) >= {"exact_duplicates", "near_duplicates"}
    last = (smoke_dir / "stdout.txt").read_text().strip().splitlines()[-12:]  # the table comes last
    assert any(line.startswith("code prompts parse") for line in last)
    assert last[-1].startswith("transformers logit diff")


def test_rendered_pair_is_what_the_server_renders(smoke_dir):
    from onebit.models.tokenizer import Tokenizer as ServingTokenizer
    from tools.demo_training.instructions import render_pair

    tok = ServingTokenizer.from_dir(smoke_dir)
    request, answer = "Write a Python function to add two numbers.", "```python\ndef add(a, b):\n    return a + b\n```"
    prompt_text, prompt_ids = tok.chat_prompt_ids([{"role": "user", "content": request}], add_generation_prompt=True)
    rendered = render_pair(request, answer)
    assert rendered == prompt_text + answer + "<|im_end|>"
    full = tok.apply_chat_template([{"role": "user", "content": request}, {"role": "assistant", "content": answer}],
                                   add_generation_prompt=False)
    assert full == rendered + "\n"
    # Token ids: the training encoding of the pair starts with exactly the server's prompt ids.
    from tokenizers import Tokenizer

    from tools.demo_training.corpus import encode_docs

    (ids,) = encode_docs(Tokenizer.from_file(str(smoke_dir / "tokenizer.json")), [rendered], specials=True)
    assert list(ids[:len(prompt_ids)]) == prompt_ids
    assert ids[-1] == tok.token_to_id("<|im_end|>")


def test_training_reduced_the_loss(smoke_dir):
    metrics = json.loads((smoke_dir / "metrics.json").read_text())
    curve = metrics["train_curve"]
    assert len(curve) >= 2 and curve[-1]["train_loss"] < curve[0]["train_loss"]
    assert curve[-1]["train_mtp_loss"] < curve[0]["train_mtp_loss"]
    assert metrics["val_curve"][-1]["val_loss"] < metrics["val_curve"][0]["val_loss"]
    for k in (1, 3):
        rate = metrics["mtp_acceptance"][f"draft_{k}"]["acceptance_rate"]
        assert 0.0 <= rate <= 1.0
    assert metrics["parameters"]["mtp"] > 0 and metrics["training"]["tokens_seen"] > 0


def _tiny_model(td, seed: int = 0):
    settings = td.SMOKE
    config = {
        "hidden_size": settings.hidden, "intermediate_size": settings.intermediate,
        "num_hidden_layers": settings.layers, "num_attention_heads": settings.heads,
        "num_key_value_heads": settings.kv_heads, "head_dim": settings.head_dim, "vocab_size": 97,
        "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 256, "tie_word_embeddings": True,
    }
    torch.manual_seed(seed)
    return td.DemoModel(td.build_qwen3_config(config)).eval()


def test_mtp_layer_is_causal(td):
    model = _tiny_model(td)
    ids = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(0))
    j = 17
    changed = ids.clone()
    changed[:, j] = (ids[:, j] + 5) % 97
    with torch.no_grad():
        outs = []
        for seq in (ids, changed):
            hidden = model.base(seq)
            outs.append(model.mtp_logits(model.mtp_hidden(hidden[:, :-1], seq[:, 1:])))
    # MTP entry t reads token t+1 and h_t: a change at j may only reach entries j-1 onwards.
    torch.testing.assert_close(outs[0][:, :j - 1], outs[1][:, :j - 1], atol=0, rtol=0)
    assert not torch.allclose(outs[0][:, j - 1], outs[1][:, j - 1])
    assert not torch.allclose(outs[0][:, j:], outs[1][:, j:])
    td.check_causal(model, 97)  # the script's own start-up check agrees


def test_mtp_entries_match_one_at_a_time(td):
    """Running the MTP layer over a prefix gives the same entries as over the whole sequence."""
    model = _tiny_model(td, seed=3)
    ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden = model.base(ids)
        full = model.mtp_hidden(hidden[:, :-1], ids[:, 1:])
        for t in (0, 5, 22):
            prefix = model.mtp_hidden(hidden[:, :t + 1], ids[:, 1:t + 2])
            torch.testing.assert_close(prefix[:, -1], full[:, t], atol=1e-5, rtol=1e-5)


def test_a_failing_compile_falls_back_to_eager(td, monkeypatch):
    def broken_compile(fn, **_):
        def fail(*args):
            raise RuntimeError("simulated compiler failure")
        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = _tiny_model(td).train()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 97, (4000,), generator=gen, dtype=torch.int32)
    val = td.windows(torch.randint(0, 97, (1000,), generator=gen), td.SMOKE.seq_len + 1, 4).long()
    settings = replace(td.SMOKE, max_steps=2, val_every_steps=2)
    history = td.train(model, tokens, val, settings, torch.device("cpu"), seed=0, budget_s=60.0, compile_it=True)
    assert history["steps"] == 2 and history["step_mode"] == "eager"


def test_spdx_licence_expressions(td):
    assert td.spdx_is_permissive("BSD-3-Clause AND 0BSD AND MIT AND Zlib AND CC0-1.0")
    assert td.spdx_is_permissive("Apache-2.0 AND Apache-2.0 WITH LLVM-exception AND MIT")
    assert td.spdx_is_permissive("MIT OR GPL-3.0-only")
    assert not td.spdx_is_permissive("MPL-2.0 AND MIT")
    assert not td.spdx_is_permissive("GPL-2.0-or-later")
    assert not td.spdx_is_permissive("(MIT AND")


def test_function_pairs_from_documented_functions():
    from tools.demo_training.instructions import function_pairs, request_text

    source = (
        "import os\n\n\n"
        "def add(a, b=1):\n"
        "    \"\"\"Return the sum of a and b.\n\n    More words.\n    \"\"\"\n"
        "    total = a + b\n"
        "    return total\n\n\n"
        "def _private(x):\n    \"\"\"Return x unchanged here.\"\"\"\n    y = x\n    return y\n\n\n"
        "def undocumented(x):\n    y = x\n    z = y\n    return z\n"
    )
    pairs = function_pairs(source, "pkg/mod.py")
    assert len(pairs) == 1
    request, answer = pairs[0]
    assert request in ("Write a Python function `add(a, b=1)` to return the sum of a and b.",
                       "Write a Python function to return the sum of a and b.")
    assert answer.startswith("```python\ndef add(a, b=1):\n") and answer.endswith("    return total\n```")
    import ast

    ast.parse(answer[len("```python\n"):-len("```")])
    assert request_text("f", "x", "Returns the square of x", 0) == "Write a Python function `f(x)` that returns the square of x."
    assert function_pairs("def broken(:\n", "x.py") == []


def test_near_duplicates_are_dropped(td, tmp_path, monkeypatch):
    from tools.demo_training import corpus

    body = "def f(x):\n    # add one\n    return x + 1\n" * 20
    texts = {"a.py": body, "b.py": body, "c.py": body.replace("# add one", "# plus one").replace("    ", "  "),
             "d.py": "def g():\n    return 2\n" * 20}
    files = []
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
        files.append(corpus.SourceFile(f"python-stdlib/{name}", tmp_path / name, len(text), "python-stdlib"))
    monkeypatch.setattr(corpus, "_stdlib_files", lambda: files)
    result = corpus.collect_corpus(replace(td.SMOKE, packages=False, corpus_mb=1.0), workers=1)
    assert len(result.docs) == 2 and {t for _, t in result.docs} == {body, texts["d.py"]}
    assert result.dedup["exact_duplicates"] == 1 and result.dedup["near_duplicates"] == 1


def test_epoch_sampler_sees_every_window_once_per_epoch():
    from tools.demo_training.training import EpochSampler, steps_for_epochs

    span = 5
    tokens = torch.arange(103, dtype=torch.int32)
    sampler = EpochSampler(tokens, span, seed=0)
    assert sampler.windows_per_epoch == 20  # (103 - 2) // 5
    first = torch.cat([sampler.batch(4) for _ in range(5)])
    assert sorted(first[:, 0].tolist()) == list(range(0, 100, 5))
    assert all((row[1:] - row[:-1] == 1).all() for row in first)
    second = sampler.batch(4)
    assert sampler.epoch == 1 and all(int(r[0]) % 5 == 2 for r in second)  # shifted by span // 2
    assert int(second.max()) < 103
    assert steps_for_epochs(20, 4, 2.0) == 10 and steps_for_epochs(22, 4, 1.5) == 7


def test_training_stops_at_max_epochs_and_restores_the_best(td):
    model = _tiny_model(td).train()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 97, (65 * 40 + 40,), generator=gen, dtype=torch.int32)
    val = td.windows(torch.randint(0, 97, (1000,), generator=gen), td.SMOKE.seq_len + 1, 4).long()
    settings = replace(td.SMOKE, max_steps=None, max_epochs=2.0, batch_size=8, val_every_steps=2, log_every_steps=5)
    history = td.train(model, tokens, val, settings, torch.device("cpu"), seed=0, budget_s=120.0, compile_it=False)
    assert history["steps"] == 10 and history["epochs"] == 2.0  # 40 windows, batch 8, two passes
    best = history["best"]
    scored = {v["step"]: v["val_loss"] + 0.3 * v["val_mtp_loss"] for v in history["val_curve"] if v["step"] > 0}
    assert best["step"] == min(scored, key=scored.get)
    from tools.demo_training.training import evaluate

    base, mtp = evaluate(model, val, 8, torch.device("cpu"))
    assert abs(base - best["val_loss"]) < 1e-3 and abs(mtp - best["val_mtp_loss"]) < 1e-3


def test_parse_rule():
    from tools.demo_training.evaluation import chat_has_function, parse_completion

    body = "\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"
    assert parse_completion("def fib(n):", body, finished=True).whole
    cut_in_next = parse_completion("def fib(n):", body + "\n\ndef other(x):\n    \"\"\"Ret", finished=False)
    assert not cut_in_next.whole and cut_in_next.top_level
    assert not parse_completion("def fib(n):", "\n    x = (1,\n    2", finished=False).ok
    assert not parse_completion("def fib(n):", "    ret", finished=False).ok  # no complete line
    assert chat_has_function("Sure:\n```python\ndef add(a, b):\n    return a + b\n```\n", True)[0]
    assert not chat_has_function("```python\nprint(1)\n```", True)[0]
    assert not chat_has_function("Sorry, no code.", True)[0]
