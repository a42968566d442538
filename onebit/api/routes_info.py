"""Health, models, slots, props, metrics, and the tokenizer endpoints."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from onebit.api.llama_fields import default_generation_settings
from onebit.api.openai_routes import ERROR_RESPONSES
from onebit.api.prepare import check_ids, render_chat
from onebit.api.protocol import (ApplyTemplateRequest, ApplyTemplateResponse, DetokenizeRequest,
                                 DetokenizeResponse, HealthResponse, ModelList, TokenizeRequest,
                                 TokenizeResponse)

router = APIRouter()


def _state(http: Request):
    return http.app.state.server


@router.get("/health", response_model=HealthResponse, responses=ERROR_RESPONSES)
@router.get("/v1/health", response_model=HealthResponse, responses=ERROR_RESPONSES, include_in_schema=False)
async def health(http: Request):
    """200 once the model is loaded and a backend serves; 503 while loading or when down."""
    state = _state(http)
    if not state.ready:
        state.require_ready()
    return {"status": "ok"}


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
@router.get("/models", response_model=ModelList, include_in_schema=False)  # base_url without /v1
async def models(http: Request):
    """The one model this server serves, with its context length (and its further --alias names)."""
    state = _state(http)
    card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "onebit",
            "max_model_len": state.n_ctx, "meta": state.model_info}
    if state.aliases:
        card["aliases"] = [state.model_name, *state.aliases]
    return {"object": "list", "data": [card]}


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES)
async def tokenize(request: TokenizeRequest, http: Request):
    """Text to token ids (with `with_pieces`, each id with its text)."""
    state = _state(http)
    state.require_ready()
    ids = state.tokenizer.encode(request.content, add_special_tokens=request.add_special)
    if request.with_pieces:
        return {"tokens": [{"id": i, "piece": state.piece(i)} for i in ids]}
    return {"tokens": ids}


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(request: DetokenizeRequest, http: Request):
    """Token ids to text; ids outside the vocabulary are a 400."""
    state = _state(http)
    state.require_ready()
    check_ids(state, request.tokens, "tokens")
    return {"content": state.tokenizer.decode(request.tokens, skip_special_tokens=False)}


@router.post("/apply-template", response_model=ApplyTemplateResponse, responses=ERROR_RESPONSES)
async def apply_template(request: ApplyTemplateRequest, http: Request):
    """The prompt the chat template renders for these messages."""
    state = _state(http)
    state.require_ready()
    return {"prompt": render_chat(state, request.messages, request.tools, request.chat_template_kwargs,
                                  request.add_generation_prompt)}


@router.get("/slots", responses=ERROR_RESPONSES)
async def slots(http: Request) -> list[dict]:
    """One object per slot of every backend (llama-server's shape plus `backend`)."""
    state = _state(http)
    return [{**slot, "n_ctx": slot.get("n_ctx") or state.n_ctx} for slot in state.router.slots()]


def _without_paths(info: dict) -> dict:
    """A backend's /props facts with file paths cut to their last part (`--props-show-path` keeps them)."""
    out = dict(info)
    for key in ("model", "binary", "log"):
        value = out.get(key)
        if isinstance(value, str) and "/" in value and "://" not in value:
            out[key] = value.rstrip("/").rsplit("/", 1)[-1]
    return out


@router.get("/props", responses=ERROR_RESPONSES)
async def props(http: Request) -> dict:
    """Server and model properties, and each backend's kind, device, capacity, load and stats."""
    state = _state(http)
    router_ = state.router
    backends = router_.backends_info()
    if not state.policy.props_show_path:
        backends = [_without_paths(info) for info in backends]
    for info, route in zip(backends, router_.routes):
        stats = route.backend.stats()
        info["stats"] = {"num_running": stats.num_running, "num_waiting": stats.num_waiting,
                         "kv_usage": stats.kv_usage, "num_kv_blocks": stats.num_kv_blocks,
                         "num_preemptions": stats.num_preemptions, **stats.extra}
    template = getattr(state.tokenizer, "chat_template", None)
    return {
        "model_alias": state.model_name,
        "model_path": state.model_path if state.policy.props_show_path else state.model_name,
        "model_info": state.model_info,
        "n_ctx": state.n_ctx,
        "total_slots": sum(r.limit for r in router_.routes),
        "is_ready": state.ready,
        "queue_size": router_.queue_size,
        "max_queue": router_.max_queue,
        "chat_template": template if isinstance(template, str) else None,
        "default_generation_settings": default_generation_settings(state),
        "backends": backends,
    }


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(http: Request):
    """Prometheus text format."""
    return Response(_state(http).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

