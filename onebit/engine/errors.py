"""Errors the engine raises for bad requests."""

from __future__ import annotations


class ContextOverflow(ValueError):
    """The prompt does not fit the context (llama-server's exceed_context_size_error)."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int):
        super().__init__(
            f"the request has {n_prompt_tokens} prompt tokens, which does not leave room to generate "
            f"within the context size of {n_ctx} tokens"
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx
