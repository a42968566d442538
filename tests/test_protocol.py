"""The shared bottom layer: torch-free import, the one validation's ranges, and failures that keep
their type across the worker process boundary and the error table."""

from __future__ import annotations

import asyncio
import math
import pickle
import subprocess
import sys

import pytest

from onebit.api.errors import ERRORS, error_body, status_of
from onebit.backends.native import NativeBackend
from onebit.engine.config import EngineConfig
from onebit.protocol import (Cancelled, ContextOverflow, GenerateRequest, InternalError, InvalidRequest, NotFound,
                             Overloaded, RequestError, SamplingParams, Unavailable, check_n, check_prompt, from_wire)
from onebit.protocol.errors import KINDS
from onebit.router import NoBackendAvailable, QueueFull, RouterClosed

BIG = 2**64


def test_import_protocol_does_not_import_torch():
    code = "import sys, onebit.protocol; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("field, value", [
    ("top_k", BIG), ("top_k", 2**63), ("top_k", -2), ("top_k", 1.5), ("max_tokens", 2**63), ("max_tokens", 0),
    ("min_tokens", 2**63), ("min_tokens", -1), ("seed", BIG), ("seed", -(2**63) - 1), ("logprobs", BIG),
    ("logprobs", 21), ("temperature", math.inf), ("temperature", math.nan), ("top_p", math.nan), ("top_p", 0.0),
    ("min_p", -0.1), ("presence_penalty", math.inf), ("frequency_penalty", -2.5), ("repetition_penalty", math.inf),
    ("repetition_penalty", 0.0), ("draft_max", BIG), ("draft_max", 65),
])
def test_every_field_is_range_checked(field, value):
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**{field: value})
    assert info.value.param == ("speculative.n_max" if field == "draft_max" else field)


def test_token_ids_are_checked_against_the_vocabulary_and_top_k_is_capped():
    for bias in ({BIG: 1.0}, {"-1": 1.0}, {"abc": 1.0}, {"7": math.nan}, {"7": math.inf}, {"7": 101.0}):
        with pytest.raises(InvalidRequest) as info:
            SamplingParams(logit_bias=bias).validate(100)
        assert info.value.param == "logit_bias"
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(logit_bias={"100": 1.0}).validate(100)  # fine until the vocabulary is known
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(stop_token_ids=[100]).validate(100)
    assert info.value.param == "stop_token_ids"
    params = SamplingParams(top_k=2**62, logit_bias={"99": 2})
    params.validate(100)
    assert params.top_k == 100 and params.logit_bias == {99: 2.0}
    for n in (0, 17, BIG):
        with pytest.raises(InvalidRequest):
            check_n(n)


def test_prompt_checks():
    with pytest.raises(InvalidRequest):
        check_prompt([], 100, 10)
    with pytest.raises(InvalidRequest):
        check_prompt([1, BIG], None, None)
    for bad in (True, 1.0, "7", -1, 100, None):  # the first bad id is named, whatever the rest
        with pytest.raises(InvalidRequest, match=f"token id {bad!r} is outside"):
            check_prompt([5, bad, 200, "x"], 100, None)
    assert check_prompt([0, 99], 100, None) == [0, 99]
    with pytest.raises(ContextOverflow) as info:
        check_prompt([1] * 10, 100, 10, "messages")
    assert (info.value.n_prompt_tokens, info.value.n_ctx, info.value.param) == (10, 10, "messages")


ERRORS_OF_EACH_KIND = [InvalidRequest("bad", "top_k"), ContextOverflow(300, 256, param="prompt"),
                       NotFound("no model", "model", "model_not_found"), Overloaded("busy", code="queue_full"),
                       Unavailable("Loading model", code="loading"), Cancelled("gone"), InternalError("boom")]


@pytest.mark.parametrize("error", ERRORS_OF_EACH_KIND, ids=lambda e: e.kind)
def test_errors_cross_a_boundary_as_data_and_keep_their_type(error):
    back = from_wire(pickle.loads(pickle.dumps(error.to_wire())))
    assert type(back) is type(error)
    assert (back.message, back.param, back.code, back.fields()) == (error.message, error.param, error.code,
                                                                    error.fields())


def test_one_table_maps_every_kind():
    assert set(KINDS) <= set(ERRORS)
    overflow = error_body(ContextOverflow(300, 256))["error"]
    assert status_of(ContextOverflow(300, 256)) == 400
    assert (overflow["type"], overflow["code"], overflow["n_prompt_tokens"], overflow["n_ctx"]) == (
        "exceed_context_size_error", "context_length_exceeded", 300, 256)
    assert [status_of(e) for e in (QueueFull("full"), NoBackendAvailable("none"), RouterClosed("bye"))] == [503] * 3
    assert error_body(QueueFull("full"))["error"]["code"] == "queue_full"
    assert from_wire({"kind": "no such kind", "message": "x"}).kind == "internal"
    assert isinstance(from_wire({"kind": "context_overflow", "message": "x"}), InvalidRequest)  # sizes missing


def test_worker_rejections_come_back_as_the_engines_exception_types(tiny_model_dir):
    """A real engine worker process refuses bad input; the front raises the very same types."""
    backend = NativeBackend(EngineConfig(model=str(tiny_model_dir), device="cpu", parallel=2, ctx_size=64))

    async def outcome(request: GenerateRequest) -> RequestError | str:
        try:
            async for delta in backend.generate(request):
                if delta.finished:
                    return delta.finish_reason
        except RequestError as error:
            return error

    async def go():
        await backend.start()
        try:
            long = await outcome(GenerateRequest("long", list(range(10, 80)), SamplingParams(max_tokens=2)))
            bad = SamplingParams(max_tokens=2)
            bad.top_k = BIG  # past the constructor's check: the worker's own call of the validation catches it
            huge_k = await outcome(GenerateRequest("k", [10, 11], bad))
            oov = await outcome(GenerateRequest("oov", [10, 10**6], SamplingParams(max_tokens=2)))
            fine = await outcome(GenerateRequest("ok", [10, 11], SamplingParams(max_tokens=2, top_k=10**12)))
            return long, huge_k, oov, fine
        finally:
            await backend.stop()

    long, huge_k, oov, fine = asyncio.run(go())
    assert type(long) is ContextOverflow and (long.n_prompt_tokens, long.n_ctx) == (70, 64)
    assert type(huge_k) is InvalidRequest and huge_k.param == "top_k"
    assert type(oov) is InvalidRequest and oov.param == "prompt"
    assert fine == "length"  # top_k past the vocabulary is capped, and the worker kept serving
