"""The built-in default model: a trained code model shipped in the package (issue 8)."""

from __future__ import annotations

import ast

import pytest
import torch

from onebit import LLM, SamplingParams
from onebit.models.default_model import DEMO_DIR, default_model_dir

PROMPTS = [
    "class Stack:\n    def __init__(self):",
    "def read_json(path):",
    "import os\n\n\ndef list_files(path):",
    "def count_words(text):",
]
STOPS = ["\n\n\n", "\ndef ", "\nclass "]


def _python_continuation(prompt: str, text: str) -> bool:
    """The completion adds at least two lines of code and prompt + completion parses."""
    if sum(1 for line in text.splitlines() if line.strip()) < 2:
        return False
    try:
        ast.parse(prompt + text)
        return True
    except SyntaxError:
        return False


@pytest.fixture(scope="module")
def demo():
    return LLM(str(default_model_dir()), device="cpu", parallel=4)


def test_default_is_the_packaged_demo_and_loads_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert default_model_dir() == DEMO_DIR
    assert DEMO_DIR.parent.parent.name == "onebit"
    # The package budget: #22 allows 60 MB, but every device call carries the tracked tree under 64 MiB.
    assert sum(f.stat().st_size for f in DEMO_DIR.iterdir()) < 48 * 2**20
    from safetensors import safe_open
    with safe_open(str(DEMO_DIR / "model.safetensors"), "pt") as f:
        assert any(k.startswith("mtp.") for k in f.keys())  # the MTP head ships in the checkpoint


def test_logits_match_transformers(demo):
    transformers = pytest.importorskip("transformers")
    ids = demo.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    ref = transformers.AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32).eval()
    from model_probe import all_logits
    ours = all_logits(demo, ids)
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max().item() < 1e-3


def test_greedy_completions_are_python(demo, tiny_model_dir):
    params = SamplingParams(temperature=0, max_tokens=128, stop=STOPS)
    outs = demo.generate(PROMPTS, params)
    parsed = [_python_continuation(p, o.text) for p, o in zip(PROMPTS, outs)]
    assert all(len(o.token_ids) >= 4 for o in outs)  # it wrote something, not an immediate stop
    assert sum(parsed) >= 3, [p + o.text for p, o in zip(PROMPTS, outs)]
    # The same check on a random-weight model: noise never parses.
    noise = LLM(str(tiny_model_dir), device="cpu", parallel=4)
    noisy = noise.generate([noise.tokenizer.encode(p) for p in PROMPTS], params)
    assert sum(_python_continuation(p, o.text) for p, o in zip(PROMPTS, noisy)) == 0


def test_serve_without_model_answers(tmp_path):
    from server_utils import openai_clients, running_server
    with running_server(None, "--parallel", "2", "--ctx-size", "512") as server:
        client, _ = openai_clients(server)
        chat = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=16,
                                              messages=[{"role": "user", "content": "Write a function."}])
        assert chat.choices[0].message.content is not None and chat.usage.completion_tokens >= 1
        done = client.completions.create(model="demo", prompt="def read_json(path):", max_tokens=24,
                                         temperature=0)
        assert done.usage.completion_tokens >= 1 and done.choices[0].text.strip()


def test_serve_mtp_without_model_matches_plain_greedy(demo):
    from server_utils import openai_clients, running_server
    prompt = "def read_json(path):"
    want = demo.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].text
    with running_server(None, "--mtp", "--parallel", "2", "--ctx-size", "512") as server:
        client, _ = openai_clients(server)
        for body in ({}, {"speculative": {"n_max": 0}}, {"speculative": {"n_max": 2}}):
            done = client.completions.create(model="demo", prompt=prompt, max_tokens=40, temperature=0,
                                             extra_body={"ignore_eos": True, **body})
            assert done.choices[0].text == want and done.usage.completion_tokens == 40
        bad = client.with_options(max_retries=0).completions
        import openai
        with pytest.raises(openai.BadRequestError):
            bad.create(model="demo", prompt=prompt, max_tokens=4, extra_body={"speculative": {"n_max": -1}})
