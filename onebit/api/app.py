"""The FastAPI application factory: routes, middlewares, and loading in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

from fastapi import FastAPI

from onebit._version import __version__
from onebit.api import (anthropic, routes_chat, routes_completions, routes_embeddings, routes_info, routes_llama,
                        routes_queue, routes_responses, routes_webui)
from onebit.api.auth import KeyInfo
from onebit.api.cors import add_cors
from onebit.api.errors import install_error_handlers
from onebit.api.metrics import Metrics
from onebit.api.middleware import APIKeyMiddleware, BodyLimitMiddleware
from onebit.api.state import ServePolicy, ServerState
from onebit.router import Router

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


async def _load(state: ServerState, load_tokenizer: Callable[[], object],
                on_load_error: Callable[[str], None] | None) -> None:
    """Start the backends and load the tokenizer side by side; report a failure once."""
    try:
        tokenizer_task = asyncio.create_task(asyncio.to_thread(load_tokenizer))
        try:
            await state.router.start()
        finally:
            tokenizer = await tokenizer_task
        sizes = [b.get("n_ctx") for b in state.router.backends_info() if b.get("n_ctx")]
        state.n_ctx = min(sizes) if sizes else None
        state.tokenizer = tokenizer
        # A stream migrating to a peer without our text state restarts at a clean token boundary.
        state.router.decode = lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)
        log.info("ready: model %s, context %s tokens", state.model_name, state.n_ctx)
    except Exception as error:
        state.load_error = str(error) or type(error).__name__
        log.debug("load failed", exc_info=True)
        if on_load_error is not None:
            on_load_error(state.load_error)


def begin_shutdown(app: FastAPI) -> None:
    """Refuse new requests and end in-flight streams with an error event (call on the loop)."""
    state: ServerState = app.state.server
    if getattr(app.state, "stopping", None) is None:
        app.state.stopping = asyncio.get_running_loop().create_task(state.router.stop())


def create_app(router: Router, *, model_name: str, model_path: str, load_tokenizer: Callable[[], object],
               api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               on_load_error: Callable[[str], None] | None = None, model_info: dict | None = None,
               keys: dict[str, KeyInfo] | None = None, policy: ServePolicy | None = None,
               aliases: tuple[str, ...] = (), cors_origins: list[str] | None = None,
               reasoning_format: str = "auto", embedding_pooling: str | None = None,
               webui: bool = True) -> FastAPI:
    """Build the server app; the model loads after startup, so /health says 503 until then.
    `keys` are the named API keys (`onebit.api.auth`), besides the single `api_key`; `webui`: serve
    the web page at `/`."""
    keys = dict(keys or {})
    if api_key:
        keys.setdefault(api_key, KeyInfo("default"))
    state = ServerState(router=router, model_name=model_name, model_path=model_path, metrics=Metrics(router),
                        model_info=model_info, policy=policy or ServePolicy(), aliases=tuple(aliases),
                        reasoning_format=reasoning_format, system_fingerprint=f"fp_1bit_{__version__}",
                        embedding_pooling=embedding_pooling)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.loading = asyncio.create_task(_load(state, load_tokenizer, on_load_error))
        try:
            yield
        finally:
            app.state.loading.cancel()
            begin_shutdown(app)
            await app.state.stopping

    app = FastAPI(title="1bit", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible LLM server")
    app.state.server = state
    app.state.stopping = None
    install_error_handlers(app)
    app.include_router(routes_info.router)
    app.include_router(routes_chat.router)
    app.include_router(routes_completions.router)
    app.include_router(routes_queue.router)
    app.include_router(routes_llama.router)
    app.include_router(anthropic.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_embeddings.router)
    if webui:
        app.include_router(routes_webui.router)
    # Added last = outermost: the key is checked before the body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    if keys:
        app.add_middleware(APIKeyMiddleware, keys=keys)
    add_cors(app, cors_origins)  # outermost: a preflight is answered before the key check, nothing else is
    return app
