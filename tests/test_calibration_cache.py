"""The products' calibration kept on disk (`onebit.engine.calibration_cache`): the choices survive the
round trip through JSON, the key changes with anything that decides them, a restart restores instead
of timing, and a damaged or unwritable cache only costs a new calibration."""

from __future__ import annotations

import json

import pytest
import torch

from onebit.engine import calibration_cache as cc
from onebit.kernels import fp8, gemv


@pytest.fixture
def clean_tables():
    """Empty choice tables before and after a test."""
    gemv.reset()
    fp8.reset()
    yield
    gemv.reset()
    fp8.reset()


def test_the_choices_round_trip_through_json(clean_tables):
    gemv._CHOSEN[("cuda", 8, 4096, 4096, torch.bfloat16, False)] = ("split_k", (16, 64, 256, 4, 4))
    gemv._CHOSEN[("cuda", 192, 4096, 12288, torch.float16, True)] = gemv.CUBLASLT
    fp8._CHOSEN[(4096, 4096, False)] = [(16, ("split_k_w8a8", (64, 64, 256, 4, 4))), (64, ("scaled_mm", None))]
    fp8._CHOSEN_QUANTIZED_INPUT[(4096, 12288, False, "blocks")] = [(64, (fp8.BLOCK_W8A8_KIND, (64, 64, 256, 4, 4)))]
    fp8._CHOSEN_BLOCKS[(4096, 4096, (128, 128), True)] = [(1, ("weight_only", None)), (8, ("split_k", (16, 32, 128, 2, 4)))]
    saved = json.loads(json.dumps({"gemv": gemv.chosen_state(), "fp8": fp8.chosen_state()}))
    want = (dict(gemv._CHOSEN), dict(fp8._CHOSEN), dict(fp8._CHOSEN_QUANTIZED_INPUT), dict(fp8._CHOSEN_BLOCKS))
    gemv.reset()
    fp8.reset()
    assert fp8.choice_for(64, 4096, 12288, False, "blocks") == fp8.default_choice(64, 4096, 12288)
    gemv.restore_chosen(saved["gemv"])
    fp8.restore_chosen(saved["fp8"])
    assert (gemv._CHOSEN, fp8._CHOSEN, fp8._CHOSEN_QUANTIZED_INPUT, fp8._CHOSEN_BLOCKS) == want
    assert fp8.choice_for(40, 4096, 12288, False, "blocks") == (fp8.BLOCK_W8A8_KIND, (64, 64, 256, 4, 4))
    assert fp8.choice_for(20, 4096, 4096, False) == ("scaled_mm", None)


def test_the_key_changes_with_the_environment_and_the_inputs():
    env = cc.environment(torch.device("cpu"))
    assert env["device"] == "cpu" and len(env["kernels"]) == 64 and env["torch"] == torch.__version__
    inputs = {"rows": [1, 2, 4], "fp8": ["(4096, 4096):torch.float8_e4m3fn"], "switches": {"fp8.BLOCK_FORM": True}}
    key = cc.cache_key(env, inputs)
    assert key == cc.cache_key(dict(env), json.loads(json.dumps(inputs)))  # the same inputs, the same key
    assert key != cc.cache_key({**env, "device": "NVIDIA H100"}, inputs)
    assert key != cc.cache_key({**env, "kernels": "0" * 64}, inputs)
    assert key != cc.cache_key(env, {**inputs, "rows": [1, 2, 4, 8]})
    assert key != cc.cache_key(env, {**inputs, "switches": {"fp8.BLOCK_FORM": False}})


def test_the_kernels_hash_follows_every_source_file(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "table.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not code")
    first = cc.kernels_hash(tmp_path)
    (tmp_path / "notes.txt").write_text("still not code")
    assert cc.kernels_hash(tmp_path) == first
    (tmp_path / "table.json").write_text('{"a": 1}')
    assert cc.kernels_hash(tmp_path) != first


def test_a_restart_restores_what_the_first_start_timed(tmp_path):
    timed, restored = [], []
    state = {"gemv": [["cuda", 1, 8, 8, "bfloat16", False, "gemv", [8, 512, 4]]]}

    def calibrate():
        timed.append(1)
        return ["line one", "line two"]

    first = cc.calibrate_or_restore(tmp_path, "k1", calibrate, lambda: state, restored.append)
    again = cc.calibrate_or_restore(tmp_path, "k1", calibrate, lambda: state, restored.append)
    other = cc.calibrate_or_restore(tmp_path, "k2", calibrate, lambda: state, restored.append)
    assert first == (["line one", "line two"], "timed") and again == (["line one", "line two"], "cache")
    assert other[1] == "timed" and len(timed) == 2 and restored == [state]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1.json", "k2.json"]  # no temporary file left


def test_a_damaged_file_costs_a_new_calibration_and_is_replaced(tmp_path):
    timed = []
    run = lambda: cc.calibrate_or_restore(tmp_path, "k", lambda: timed.append(1) or ["timed"], lambda: {"a": 1},
                                          lambda state: state["a"])
    (tmp_path / "k.json").write_text("{not json")
    assert run() == (["timed"], "timed")
    assert run() == (["timed"], "cache") and len(timed) == 1  # replaced by a good one
    (tmp_path / "k.json").write_text(json.dumps({"key": "another", "choices": {}, "report": []}))
    assert run() == (["timed"], "timed")  # a file saved under another key is not trusted
    (tmp_path / "k.json").write_text(json.dumps({"key": "k", "choices": {}, "report": []}))
    assert run() == (["timed"], "timed")  # choices that do not restore (no "a"): timed again
    assert len(timed) == 3


def test_without_a_folder_or_a_writable_one_every_start_times(tmp_path):
    timed = []
    calibrate = lambda: timed.append(1) or ["x"]
    assert cc.calibrate_or_restore(None, "k", calibrate, dict, lambda s: None) == (["x"], "timed")
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the cache's folder would have to be inside a file
    assert cc.calibrate_or_restore(blocked / "cache", "k", calibrate, dict, lambda s: None) == (["x"], "timed")
    assert cc.calibrate_or_restore(blocked / "cache", "k", calibrate, dict, lambda s: None) == (["x"], "timed")
    assert len(timed) == 3


def test_the_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.default_dir() == tmp_path / "xdg" / "onebit" / "calibration"
    monkeypatch.setenv(cc.ENV, str(tmp_path / "mine"))
    assert cc.default_dir() == tmp_path / "mine"
    for off in ("off", "OFF", "0"):
        monkeypatch.setenv(cc.ENV, off)
        assert cc.default_dir() is None


def test_the_engine_keys_its_calibration_by_what_it_would_time(tiny_model_dir, monkeypatch):
    from onebit import LLM
    from onebit.models import quantize

    def inputs(**kwargs):
        runner = LLM(str(tiny_model_dir), device="cpu", parallel=2, **kwargs).engine.runner
        return runner._calibration_inputs([1, 2], True)

    plain, fp8_weights = inputs(), inputs(quantize="fp8", quantize_lm_head=False)
    assert plain["linear"] and not plain["fp8"] and fp8_weights["fp8"] and fp8_weights["fed"]
    monkeypatch.setattr(quantize, "FUSED_PRODUCERS", ("norm",))
    fewer = inputs(quantize="fp8", quantize_lm_head=False)
    assert fewer["fp8"] == fp8_weights["fp8"] and fewer["fed"] != fp8_weights["fed"]  # down no longer fed
    env = cc.environment(torch.device("cpu"))
    assert len({cc.cache_key(env, i) for i in (plain, fp8_weights, fewer)}) == 3
    json.dumps(fp8_weights)  # JSON values only
