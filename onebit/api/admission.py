"""Admit one API request: whose it is, whether it can ever fit, its key's limits, then its slots.

Order matters: a request that can never be served gets a 400 (retrying cannot help), one over
its key's limits a 429 with Retry-After, and only then does it take slots or places in line
(a 503 there means the server as a whole is full).
"""

from __future__ import annotations

from fastapi import Request

from onebit.api.auth import request_user
from onebit.api.generation import Choice, take_tickets
from onebit.api.protocol import SamplingFields
from onebit.api.state import ServerState
from onebit.protocol import ContextOverflow, InvalidRequest
from onebit.protocol.validate import check_int
from onebit.router import Ticket

PRIORITY_LIMIT = 2**31  # vLLM's priority is an int; anything of this size is a mistake


def check_fits(state: ServerState, choices: list[Choice]) -> None:
    """400 for a request no amount of waiting can serve: more choices than the server has slots
    and places in line, or a prompt plus max_tokens past the context."""
    router = state.router
    room = router.max_queue + sum(r.limit for r in router.routes)
    if len(choices) > room:
        raise InvalidRequest(f"this request asks for {len(choices)} generations (prompts x n); the server holds "
                             f"at most {room} at once ({router.max_queue} waiting)", "n")
    n_ctx = state.n_ctx
    if n_ctx is None:
        return
    for choice in choices:
        want = choice.params.max_tokens
        if want is not None and len(choice.prompt_token_ids) + want > n_ctx:
            raise ContextOverflow(len(choice.prompt_token_ids), n_ctx,
                                  f"the prompt ({len(choice.prompt_token_ids)} tokens) plus max_tokens ({want}) is "
                                  f"more than the context of {n_ctx} tokens", param="max_tokens")


def admit(http: Request, state: ServerState, choices: list[Choice], fields: SamplingFields | None) -> list[Ticket]:
    """Set each choice's user and priority, check the request fits and is within its key's limits,
    then take its slots (all or nothing)."""
    user, key = request_user(http, fields.user if fields is not None else None)
    priority = 0
    if fields is not None and fields.priority is not None:
        priority = check_int("priority", fields.priority, -PRIORITY_LIMIT, PRIORITY_LIMIT)
    for choice in choices:
        choice.user, choice.priority, choice.key = user, priority, key
    check_fits(state, choices)
    prompt_tokens = sum(len(c.prompt_token_ids) for c in choices)
    state.limits.check(user, key, len(choices), prompt_tokens, state.router.users)
    return take_tickets(state, len(choices), user, priority)


def check_prompt_count(state: ServerState, count: int) -> None:
    """400 when one request carries more prompts than `--max-prompts-per-request`."""
    limit = state.policy.max_prompts_per_request
    if count > limit:
        raise InvalidRequest(f"this request has {count} prompts; the server takes at most {limit} per request "
                             "(--max-prompts-per-request)", "prompt")
