"""What the routes share: the router, the tokenizer, the model's name and context size."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from onebit.api.limits import RateLimits
from onebit.api.metrics import Metrics
from onebit.protocol.errors import NotFound, Unavailable
from onebit.router import Router


@dataclass
class ServePolicy:
    """Serving rules the operator sets: how much one request may ask for, and what /props shows."""

    max_prompts_per_request: int = 64
    props_show_path: bool = False


@dataclass
class ServerState:
    """The server's shared state; `tokenizer` and `n_ctx` are set once loading finishes."""

    router: Router
    model_name: str
    model_path: str
    metrics: Metrics
    model_info: dict | None = None  # e.g. {"format": "gguf", "file": ..., "quantization": ...}
    aliases: tuple[str, ...] = ()  # further names given with a repeated --alias
    strict_model_names: bool = False  # one model served: any `model` value is accepted, as llama-server does
    reasoning_format: str = "auto"  # --reasoning-format: the default of a request's `reasoning_format`
    system_fingerprint: str = "fp_1bit"
    embedding_pooling: str | None = None  # --embedding: how /v1/embeddings pools (None: not served)
    tokenizer: object | None = None
    n_ctx: int | None = None
    load_error: str | None = None
    policy: ServePolicy = field(default_factory=ServePolicy)
    limits: RateLimits = field(default_factory=RateLimits)
    created: int = field(default_factory=lambda: int(time.time()))
    _piece_cache: dict[int, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """True when a backend serves and the tokenizer is loaded."""
        return self.tokenizer is not None and self.n_ctx is not None and self.router.state == "ready"

    def require_ready(self) -> None:
        """Raise 503 unless the server can take requests."""
        if self.ready:
            return
        state = self.router.state
        if state == "loading" or (state == "ready" and self.tokenizer is None):
            raise Unavailable("Loading model", code="loading")
        raise Unavailable(f"no backend available ({self.load_error or state})")

    def check_model(self, requested: str | None) -> None:
        """404 when names are enforced and the request names a model this server does not serve (with
        one model served, any name is accepted, as llama-server does)."""
        if not self.strict_model_names:
            return
        if requested and requested not in (self.model_name, self.model_path, *self.aliases):
            raise NotFound(f"The model `{requested}` does not exist", param="model", code="model_not_found")

    def piece(self, token_id: int) -> str:
        """The text of one token, for logprobs (cached: the same ids recur)."""
        text = self._piece_cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._piece_cache[token_id] = text
        return text


def serving_state(http: Request, model: str | None) -> ServerState:
    """The server's state for a request that generates with `model`: 503 unless the server can take
    requests, 404 when it does not serve that model (see `ServerState.check_model`)."""
    state = http.app.state.server
    state.require_ready()
    state.check_model(model)
    return state
