"""Engine behaviour: batching invariance, chunked prefill, preemption, prefix caching, aborts, leaks."""

from __future__ import annotations

import random

import pytest

from onebit import LLM, SamplingParams
from onebit.engine.errors import ContextOverflow
from onebit.engine.sampling_params import InvalidParameter
from onebit.models.errors import ModelLoadError


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 500) for _ in range(rng.randrange(3, 90))] for _ in range(n)]


def _params(n: int) -> list[SamplingParams]:
    """Half greedy, half seeded sampling, with varied lengths."""
    return [SamplingParams(temperature=0.0 if i % 2 else 0.9, top_p=0.95, seed=100 + i,
                           max_tokens=8 + 3 * i, ignore_eos=True) for i in range(n)]


def _no_leak(llm: LLM) -> None:
    bm = llm.engine.scheduler.blocks
    assert bm.num_free == bm.num_blocks
    assert all(c == 0 for c in bm.ref_count)
    assert not llm.engine.scheduler.running and not llm.engine.scheduler.waiting


@pytest.fixture(scope="module")
def alone(tiny_model_dir):
    """Each request of the reference set run by itself."""
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1, enable_prefix_caching=False)
    return [llm.generate([p], s)[0].token_ids for p, s in zip(_prompts(16), _params(16))]


@pytest.mark.parametrize("options", [
    {"parallel": 16},
    {"parallel": 16, "max_batch_tokens": 24},                      # chunked prefill
    {"parallel": 16, "max_batch_tokens": 40, "kv_cache_memory": 40 * 2 * 2 * 8 * 2 * 16 * 4,
     "block_size": 8},                                              # 40 blocks: forces preemption
    {"parallel": 5, "block_size": 4},
    # overlapped steps (step n+1 queued before step n's tokens reach the host), as on CUDA:
    {"parallel": 16, "max_batch_tokens": 24, "overlap": True},
    {"parallel": 16, "max_batch_tokens": 40, "kv_cache_memory": 40 * 2 * 2 * 8 * 2 * 16 * 4,
     "block_size": 8, "overlap": True},
])
def test_batch_gives_same_tokens_as_alone(tiny_model_dir, alone, options):
    llm = LLM(str(tiny_model_dir), device="cpu", **options)
    outs = llm.generate(_prompts(16), _params(16))
    assert [o.token_ids for o in outs] == alone
    assert all(o.finish_reason == "length" for o in outs)
    if "kv_cache_memory" in options:
        assert llm.engine.scheduler.num_preemptions > 0
    _no_leak(llm)


def test_prefix_cache_hit_computes_only_new_tokens(tiny_model_dir):
    prefix = _prompts(1, seed=7)[0] * 3  # ~ long shared prefix
    a, b = prefix + [11, 12, 13], prefix + [21, 22]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=2, block_size=8)
    first = llm.generate([a], params)[0]
    assert first.num_cached_tokens == 0
    second = llm.generate([b], params)[0]
    full_blocks = (len(prefix) // 8) * 8
    assert second.num_cached_tokens == full_blocks > 0
    cold = LLM(str(tiny_model_dir), device="cpu", parallel=2, block_size=8, enable_prefix_caching=False)
    assert second.token_ids == cold.generate([b], params)[0].token_ids
    # The same prompt again hits every block but the one holding its last token.
    again = llm.generate([b], params)[0]
    assert again.num_cached_tokens == ((len(b) - 1) // 8) * 8
    assert again.token_ids == second.token_ids
    _no_leak(llm)


def test_abort_in_every_state_frees_everything(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=2, max_batch_tokens=16, block_size=4)
    engine = llm.engine
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    long_prompt = list(range(10, 70))
    engine.add_request("prefilling", long_prompt, params)
    engine.add_request("decoding", [5, 6, 7], params)
    engine.add_request("waiting", [8, 9], params)
    engine.step()
    engine.step()
    states = {s.request_id: s for s in engine.scheduler.running}
    assert "prefilling" in states and states["prefilling"].num_uncomputed > 1
    assert any(s.request_id == "waiting" for s in engine.scheduler.waiting)
    for rid in ("prefilling", "decoding", "waiting", "unknown-id"):
        engine.abort(rid)
    finals = engine.step()
    assert {d.request_id: d.finish_reason for d in finals} == {
        "prefilling": "abort", "decoding": "abort", "waiting": "abort"}
    assert not engine.has_unfinished()
    _no_leak(llm)


def test_stop_token_stop_string_and_max_tokens(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=4)
    prompt = _prompts(1, seed=3)[0]
    base = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    stop_id = base.token_ids[5]
    first = base.token_ids.index(stop_id)
    by_token = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                     stop_token_ids=[stop_id]))[0]
    assert by_token.finish_reason == "stop"
    assert by_token.token_ids == base.token_ids[:first + 1]
    text = base.text
    needle = text[len(text) // 2: len(text) // 2 + 3]
    if needle.strip() and "\ufffd" not in needle:
        by_string = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                          stop=[needle]))[0]
        assert by_string.finish_reason == "stop"
        assert by_string.text == text[:text.index(needle)]
    assert base.finish_reason == "length" and len(base.token_ids) == 20


def test_seeded_sampling_reproducible_and_seeds_differ(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=4)
    prompt = [10, 20, 30]
    p = lambda seed: SamplingParams(temperature=1.0, seed=seed, max_tokens=24, ignore_eos=True)
    a, b, c = llm.generate([prompt] * 3, [p(1), p(1), p(2)])
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_eos_ends_unless_ignored(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1)
    eos = sorted(llm.engine.eos_token_ids)[0]
    forced = SamplingParams(temperature=0, max_tokens=10, logit_bias={eos: 100.0})
    out = llm.generate([[10, 20]], forced)[0]
    assert out.finish_reason == "stop" and out.token_ids == [eos] and out.text == ""
    ignored = SamplingParams(temperature=0, max_tokens=10, logit_bias={eos: 100.0}, ignore_eos=True)
    assert llm.generate([[10, 20]], ignored)[0].token_ids == [eos] * 10
    delayed = SamplingParams(temperature=0, max_tokens=10, logit_bias={eos: 100.0}, min_tokens=4)
    out = llm.generate([[10, 20]], delayed)[0]
    assert len(out.token_ids) == 5 and out.token_ids[-1] == eos and eos not in out.token_ids[:4]


def test_bad_requests_raise_clear_errors(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1, ctx_size=64)
    engine = llm.engine
    with pytest.raises(ContextOverflow) as info:
        engine.add_request("long", list(range(10, 80)), SamplingParams())
    assert info.value.n_prompt_tokens == 70 and info.value.n_ctx == 64
    with pytest.raises(InvalidParameter) as info:
        engine.add_request("empty", [], SamplingParams())
    assert info.value.param == "prompt"
    with pytest.raises(InvalidParameter):
        engine.add_request("oov", [10, 10**6], SamplingParams())
    for field, value in [("top_p", 0.0), ("top_p", 1.5), ("temperature", -1.0), ("max_tokens", 0),
                         ("min_p", 2.0), ("logprobs", 50), ("repetition_penalty", 0.0)]:
        with pytest.raises(InvalidParameter) as info:
            SamplingParams(**{field: value})
        assert info.value.param == field
    # the engine still serves after the rejections; output is capped by the context
    out = llm.generate([[10, 11]], SamplingParams(max_tokens=1000, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 62
    _no_leak(llm)


def test_broken_models_fail_with_named_problem(tmp_path, tiny_model_dir):
    import json
    import shutil
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(str(tmp_path / "nowhere"), device="cpu")
    with pytest.raises(ModelLoadError, match="local Hugging Face cache"):
        LLM("some-org/not-cached-model", device="cpu")
    bad_arch = tmp_path / "arch"
    shutil.copytree(tiny_model_dir, bad_arch)
    cfg = json.loads((bad_arch / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad_arch / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        LLM(str(bad_arch), device="cpu")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_model_dir, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        LLM(str(corrupt), device="cpu")
    no_weights = tmp_path / "noweights"
    shutil.copytree(tiny_model_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        LLM(str(no_weights), device="cpu")
    wrong_shape = tmp_path / "shape"
    shutil.copytree(tiny_model_dir, wrong_shape)
    cfg = json.loads((wrong_shape / "config.json").read_text())
    cfg["intermediate_size"] += 8
    (wrong_shape / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="shape"):
        LLM(str(wrong_shape), device="cpu")


def test_sharded_checkpoint_loads(tmp_path, tiny_model_dir):
    import json
    import shutil
    from safetensors.torch import load_file, save_file
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_model_dir, sharded)
    tensors = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, sharded / fname)
        weight_map.update({n: fname for n in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a = LLM(str(sharded), device="cpu", parallel=1).generate([[10, 20, 30]], params)[0]
    b = LLM(str(tiny_model_dir), device="cpu", parallel=1).generate([[10, 20, 30]], params)[0]
    assert a.token_ids == b.token_ids


def test_model_from_local_hugging_face_cache(tmp_path, monkeypatch, tiny_model_dir):
    import shutil
    repo = tmp_path / "hub" / "models--some-org--tiny-model"
    snapshot = repo / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    cached = LLM("some-org/tiny-model", device="cpu", parallel=1).generate([[10, 20, 30]], params)[0]
    local = LLM(str(tiny_model_dir), device="cpu", parallel=1).generate([[10, 20, 30]], params)[0]
    assert cached.token_ids == local.token_ids


def test_a_slow_step_is_logged_with_what_it_ran(tiny_model_dir, caplog):
    """Counts, not clocks: with the threshold at 0 every step that runs a forward is 'slow', and
    each logs what it launched."""
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=2, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.engine.slow_step_s = llm.engine.slow_log_every_s = 0.0
    with caplog.at_level("WARNING", logger="onebit.engine"):
        llm.generate(_prompts(2, seed=1), params)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("slow step:")]
    assert len(lines) == llm.engine.slow_steps >= 4  # a prefill and three decode steps at least
    assert "2 sequences, 0 decoding" in lines[0] and "with a prompt chunk" in lines[0]  # the prefill
    assert any("2 sequences, 2 decoding" in line and "prompt chunk" not in line for line in lines[1:])
    assert all("eager forwards in this call" in line and "Triton kernel variants compiled" in line for line in lines)
    # the step summary's time by kind counts the same calls (on the CPU, all eager)
    assert set(llm.engine.busy_by_kind) == {"eager"}
    assert llm.engine.busy_by_kind["eager"][0] == llm.engine.slow_steps
    assert f"eager {llm.engine.slow_steps} x" in llm.engine.step_summary()
    # once a minute instead: the steps after the first line are counted, not logged
    caplog.clear()
    llm.engine.slow_log_every_s = 60.0
    before = llm.engine.slow_steps
    with caplog.at_level("WARNING", logger="onebit.engine"):
        llm.generate(_prompts(2, seed=2), params)
    assert llm.engine.slow_steps - before >= 4
    assert len([r for r in caplog.records if r.getMessage().startswith("slow step:")]) <= 1
