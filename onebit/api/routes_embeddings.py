"""POST /v1/embeddings (with `--embedding`): each input's prompt runs through the router and the
engine's scheduler like any request (prefill only, one slot each), and comes back pooled and
L2-normalized; as floats, or base64 of little-endian float32 as the OpenAI client asks by default."""

from __future__ import annotations

import base64
import contextlib
import struct
import uuid
from typing import Literal, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from onebit.api.generation import Choice, merge_choices, take_tickets
from onebit.api.openai_routes import post_v1_and_bare
from onebit.api.pipeline import unless_disconnected
from onebit.api.protocol import _Lenient
from onebit.api.state import ServerState
from onebit.protocol import Cancelled, InternalError, InvalidRequest, SamplingParams, check_prompt

router = APIRouter()
MAX_INPUTS = 256


class EmbeddingRequest(_Lenient):
    """POST /v1/embeddings: a text, texts, token ids, or lists of token ids."""

    input: Union[str, list[str], list[int], list[list[int]]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


def _inputs(state: ServerState, value) -> list[list[int]]:
    if isinstance(value, str) or (value and all(isinstance(v, int) for v in value)):
        value = [value]
    if not value:
        raise InvalidRequest("input is empty", "input")
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"at most {MAX_INPUTS} inputs per request", "input")
    out = []
    for i, item in enumerate(value):
        ids = state.tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else list(item)
        out.append(check_prompt(ids, state.tokenizer.vocab_size, state.n_ctx, f"input.{i}"))
    return out


def _encode(vector: list[float], fmt: str):
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


async def _run(state: ServerState, choices: list[Choice], tickets) -> dict[int, list[float]]:
    vectors: dict[int, list[float]] = {}
    async with contextlib.aclosing(merge_choices(state, choices, tickets)) as merged:
        async for index, delta in merged:
            if delta.finished:
                if delta.embedding is None:
                    raise InternalError("the backend returned no embedding (embeddings need a native backend)")
                vectors[index] = delta.embedding
    return vectors


@post_v1_and_bare(router, "/embeddings")
async def embeddings(request: EmbeddingRequest, http: Request):
    """One normalized vector per input, pooled as --pooling (or the model's config) says."""
    state = http.app.state.server
    state.require_ready()
    if state.embedding_pooling is None:
        raise InvalidRequest("this server does not serve embeddings; start it with --embedding", "input",
                             code="not_supported")
    state.check_model(request.model)
    if request.dimensions is not None:
        raise InvalidRequest("dimensions is not supported: the model's hidden size is the dimension", "dimensions")
    prompts = _inputs(state, request.input)
    rid = f"embd-{uuid.uuid4().hex}"
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, pooling=state.embedding_pooling)
    choices = [Choice(i, ids, params, f"{rid}-{i}") for i, ids in enumerate(prompts)]
    tickets = take_tickets(state, len(choices))
    try:
        vectors = await unless_disconnected(http.receive, _run(state, choices, tickets))
    except Cancelled:
        return Response(status_code=499)
    tokens = sum(len(p) for p in prompts)
    data = [{"object": "embedding", "index": i, "embedding": _encode(vectors[i], request.encoding_format)}
            for i in range(len(prompts))]
    return JSONResponse({"object": "list", "data": data, "model": state.model_name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
