"""One generation for the routes that answer in other APIs' shapes (Anthropic Messages, OpenAI
Responses): prompt and params to an Outcome, whole or delta by delta."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import Request

from onebit.api.generation import Choice, TokenCounter, merge_choices, take_tickets
from onebit.api.llama_fields import stop_fields
from onebit.api.pipeline import unless_disconnected
from onebit.api.state import ServerState
from onebit.protocol import SamplingParams, StepDelta


@dataclass
class Outcome:
    """What one generation produced so far: text, tokens, finish reason and counts."""

    choice: Choice
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    counter: TokenCounter = field(default_factory=TokenCounter)

    def add(self, delta: StepDelta) -> None:
        """Take in one delta."""
        self.counter.add(self.choice.index, delta)
        self.text.append(delta.text)
        self.tokens.extend(delta.token_ids)
        if delta.finished:
            self.finish = delta.finish_reason

    @property
    def content(self) -> str:
        """The text generated so far."""
        return "".join(self.text)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt."""
        return len(self.choice.prompt_token_ids)

    @property
    def output_tokens(self) -> int:
        """Tokens generated so far."""
        return self.counter.count(self.choice.index)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache."""
        return self.counter.cached([self.choice.index])

    def stop_word(self, state: ServerState) -> str | None:
        """The stop string that ended the generation, if one did."""
        fields = stop_fields(state, self.finish, self.content, self.tokens, self.choice.params.stop)
        return fields["stopping_word"] if fields["stop_type"] == "word" else None


def start(state: ServerState, ids: list[int], params: SamplingParams, rid: str, text: str | None) -> tuple:
    """Reserve the slot now (a full queue is a 503 before any stream starts): (outcome, ticket)."""
    ticket = take_tickets(state, 1)[0]
    return Outcome(Choice(0, ids, params, rid, text)), ticket


async def deltas(state: ServerState, outcome: Outcome, ticket) -> AsyncIterator[StepDelta]:
    """The generation's deltas as they come, each already added to `outcome`; a failure raises."""
    async with contextlib.aclosing(merge_choices(state, [outcome.choice], [ticket])) as merged:
        async for _, delta in merged:
            outcome.add(delta)
            yield delta


async def run_whole(http: Request, state: ServerState, outcome: Outcome, ticket) -> Outcome:
    """Run to the end (aborted with Cancelled if the client goes away first)."""
    async def work():
        async for _ in deltas(state, outcome, ticket):
            pass
        return outcome

    return await unless_disconnected(http.receive, work())
