"""What chat and text completions do differently, on the response models: one Formatter each.

A formatter turns one choice's deltas into stream chunk items (`opening`, `piece`, `finish`) and
the collected output of every choice into the whole response (`response`). A piece that is only
text is a TextPiece, which the stream renders from a template of `text_item` (formatting.ChunkWriter).
"""

from __future__ import annotations

import time

from onebit.api.formatting import TextPiece, chat_logprobs, completion_logprobs, usage
from onebit.api.generation import Choice, TokenCounter
from onebit.api.reasoning import ReasoningSplitter
from onebit.api.responses import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                  ChatCompletionResponse, ChatDelta, CompletionChoice, CompletionChunk,
                                  CompletionChunkChoice, CompletionResponse, FunctionCall, FunctionCallDelta,
                                  ToolCall, ToolCallDelta)
from onebit.api.tool_calls import ToolCallStream, ToolPlan
from onebit.api.state import ServerState
from onebit.protocol import StepDelta


class Collected:
    """Every choice's output so far, for a whole (non-streamed) response."""

    def __init__(self, choices: list[Choice]):
        self.choices = choices
        self.texts: dict[int, list[str]] = {c.index: [] for c in choices}
        self.finish: dict[int, str | None] = {c.index: None for c in choices}
        self.logprobs: dict[int, list] = {c.index: [] for c in choices}
        self.counts = TokenCounter()

    def add(self, index: int, delta: StepDelta) -> None:
        """Take in one delta of choice `index`."""
        self.texts[index].append(delta.text)
        self.counts.add(index, delta)
        if delta.logprobs:
            self.logprobs[index].extend(delta.logprobs)
        if delta.finished:
            self.finish[index] = delta.finish_reason

    def head(self, state: ServerState, rid: str, obj: str, prompt_tokens: int, cached_tokens: int = 0) -> dict:
        """The fields every whole response has besides its choices."""
        return {"id": rid, "object": obj, "created": int(time.time()), "model": state.model_name,
                "system_fingerprint": state.system_fingerprint,
                "usage": usage(prompt_tokens, self.counts.total, cached_tokens), "timings": self.counts.timings()}


class Formatter:
    """Base: one endpoint's response shapes for one request of `choices`."""

    chunk_type: type
    chunk_object: str

    def __init__(self, state: ServerState, rid: str, choices: list[Choice]):
        self.state = state
        self.rid = rid
        self.choices = choices

    def prompt_choices(self) -> list[Choice]:
        """The choices whose prompts `usage` counts (every choice of one prompt shares it)."""
        return self.choices[:1]

    def prompt_tokens(self) -> int:
        """Prompt tokens for `usage`."""
        return sum(len(c.prompt_token_ids) for c in self.prompt_choices())

    def cached_tokens(self, counter: TokenCounter) -> int:
        """Of `prompt_tokens`, those the engine found in its prefix cache."""
        return counter.cached(c.index for c in self.prompt_choices())

    def opening(self) -> list:
        """Chunk items sent before any token."""
        return []

    def piece(self, index: int, delta: StepDelta):
        """The chunk item for one delta's content, or None when it carries nothing to send; a
        TextPiece when the item is `text_item` of one text field."""
        raise NotImplementedError

    def text_item(self, index: int, field: str, text: str):
        """The chunk item carrying only `text` in `field` (what a TextPiece stands for)."""
        raise NotImplementedError

    def finish(self, index: int, delta: StepDelta):
        """The chunk item that ends choice `index`."""
        raise NotImplementedError

    def response(self, collected: Collected):
        """The whole response."""
        raise NotImplementedError


def _split(text: str, in_reasoning: bool) -> tuple[str | None, str]:
    splitter = ReasoningSplitter(in_reasoning)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.flush()
    reasoning, content = r1 + r2, c1 + c2
    if not reasoning and not in_reasoning:
        return None, content
    return reasoning.strip("\n"), content.lstrip("\n")


class ChatFormatter(Formatter):
    """Chat completions: messages, `reasoning_content` split out of `<think>` blocks, chat logprobs."""

    chunk_type = ChatCompletionChunk
    chunk_object = "chat.completion.chunk"

    def __init__(self, state: ServerState, rid: str, choices: list[Choice], split: bool, in_reasoning: bool,
                 tools: ToolPlan | None = None):
        super().__init__(state, rid, choices)
        self.split = split
        self.in_reasoning = in_reasoning
        self.logprobs = choices[0].params.logprobs is not None
        self.splitters = {c.index: ReasoningSplitter(in_reasoning) for c in choices}
        self.tools = tools if tools is not None and tools.format is not None else None
        self.calls = {c.index: ToolCallStream(self.tools.format, self.tools.parallel) for c in choices} \
            if self.tools else {}

    def _tool_split(self, index: int, content: str, final: bool) -> tuple[str, list[ToolCallDelta]]:
        """Content without tool-call text, and the calls it completed as stream deltas."""
        if not self.tools:
            return content, []
        content, pieces = self.calls[index].feed(content, final)
        deltas = []
        for p in pieces:  # a call's opening (id, type, name), then its arguments in pieces, as OpenAI sends them
            if p.id is not None:
                deltas.append(ToolCallDelta(index=p.index, id=p.id, type="function",
                                            function=FunctionCallDelta(name=p.name, arguments=p.arguments)))
            else:
                deltas.append(ToolCallDelta(index=p.index, function=FunctionCallDelta(arguments=p.arguments)))
        return content, deltas

    def _finish_reason(self, index: int, reason: str | None) -> str | None:
        if reason == "stop" and self.tools and self.calls[index].calls:
            return "tool_calls"
        return reason

    def opening(self) -> list:
        """The assistant role, one chunk per choice."""
        return [ChatChunkChoice(index=c.index, delta=ChatDelta(role="assistant", content=None), logprobs=None,
                                finish_reason=None) for c in self.choices]

    def piece(self, index: int, delta: StepDelta) -> ChatChunkChoice | None:
        """Reasoning and content text of the delta (and its logprobs)."""
        if self.split:
            reasoning, content = self.splitters[index].feed(delta.text)
            if delta.finished:
                r, c = self.splitters[index].flush()
                reasoning, content = reasoning + r, content + c
        else:
            reasoning, content = "", delta.text
        content, calls = self._tool_split(index, content, delta.finished)
        body = {}
        if reasoning:
            body["reasoning_content"] = reasoning
        if content:  # never an empty content delta: clients take "" as a (blank) piece of the message
            body["content"] = content
        if calls:
            body["tool_calls"] = calls
        lp = chat_logprobs(self.state, delta.logprobs) if self.logprobs and delta.logprobs else None
        if not lp and len(body) == 1 and not calls:
            field, text = next(iter(body.items()))
            return TextPiece(index, field, text)
        if not body and not lp:
            return None
        return ChatChunkChoice(index=index, delta=ChatDelta(**body), logprobs=lp, finish_reason=None)

    def text_item(self, index: int, field: str, text: str) -> ChatChunkChoice:
        """A delta of `content` or `reasoning_content` alone."""
        return ChatChunkChoice(index=index, delta=ChatDelta(**{field: text}), logprobs=None, finish_reason=None)

    def finish(self, index: int, delta: StepDelta) -> ChatChunkChoice:
        """An empty delta with the finish reason."""
        return ChatChunkChoice(index=index, delta=ChatDelta(), logprobs=None,
                               finish_reason=self._finish_reason(index, delta.finish_reason))

    def response(self, collected: Collected) -> ChatCompletionResponse:
        """The chat.completion object."""
        out = []
        for c in self.choices:
            text = "".join(collected.texts[c.index])
            reasoning, content = _split(text, self.in_reasoning) if self.split else (None, text)
            content, calls = self._tool_split(c.index, content, True)
            message = AssistantMessage(role="assistant", content=content or (None if calls else content))
            if reasoning is not None:
                message.reasoning_content = reasoning
            if calls:
                message.tool_calls = [ToolCall(id=call_id, type="function", function=FunctionCall(
                    name=call.name, arguments=call.arguments)) for call_id, call in self.calls[c.index].calls]
            lp = chat_logprobs(self.state, collected.logprobs[c.index]) if c.params.logprobs is not None else None
            out.append(ChatChoice(index=c.index, message=message, logprobs=lp,
                                  finish_reason=self._finish_reason(c.index, collected.finish[c.index])))
        return ChatCompletionResponse(choices=out, **collected.head(self.state, self.rid, "chat.completion",
                                                                     self.prompt_tokens(),
                                                                     self.cached_tokens(collected.counts)))


class CompletionFormatter(Formatter):
    """Text completions: `n` choices per prompt, legacy logprobs with text offsets, optional token ids."""

    chunk_type = CompletionChunk
    chunk_object = "text_completion"

    def __init__(self, state: ServerState, rid: str, choices: list[Choice], n: int, return_token_ids: bool,
                 echo: bool = False):
        super().__init__(state, rid, choices)
        self.n = n
        self.return_token_ids = return_token_ids
        self.logprobs = choices[0].params.logprobs is not None
        self.offsets = {c.index: 0 for c in choices}
        self.echo = {c.index: self._prompt_text(c) for c in choices} if echo else {}

    def _prompt_text(self, choice: Choice) -> str:
        """The prompt as text, for `echo` (decoded where the client sent token ids)."""
        if choice.prompt_text is not None:
            return choice.prompt_text
        return self.state.tokenizer.decode(choice.prompt_token_ids, skip_special_tokens=False)

    def opening(self) -> list:
        """With `echo`, each choice's prompt text before its first token."""
        return [CompletionChunkChoice(index=i, text=text, logprobs=None, finish_reason=None)
                for i, text in self.echo.items()]

    def prompt_choices(self) -> list[Choice]:
        """Every prompt counts once, however many choices it has."""
        return self.choices[::self.n]

    def piece(self, index: int, delta: StepDelta) -> CompletionChunkChoice | None:
        """The delta's text (with its logprobs and token ids when asked for)."""
        lp = None
        if self.logprobs and delta.logprobs:
            lp = completion_logprobs(self.state, delta.logprobs, self.offsets[index])
        self.offsets[index] += len(delta.text)
        if not (delta.text or lp or (self.return_token_ids and delta.token_ids)):
            return None
        if lp is None and not self.return_token_ids:
            return TextPiece(index, "text", delta.text)
        item = CompletionChunkChoice(index=index, text=delta.text, logprobs=lp, finish_reason=None)
        if self.return_token_ids:
            item.token_ids = delta.token_ids
        return item

    def text_item(self, index: int, field: str, text: str) -> CompletionChunkChoice:
        """The text alone (`field` is always "text")."""
        return CompletionChunkChoice(index=index, text=text, logprobs=None, finish_reason=None)

    def finish(self, index: int, delta: StepDelta) -> CompletionChunkChoice:
        """Empty text with the finish reason."""
        return CompletionChunkChoice(index=index, text="", logprobs=None, finish_reason=delta.finish_reason)

    def response(self, collected: Collected) -> CompletionResponse:
        """The text_completion object."""
        out = []
        for c in self.choices:
            lp = (completion_logprobs(self.state, collected.logprobs[c.index], 0)
                  if c.params.logprobs is not None else None)
            text = self.echo.get(c.index, "") + "".join(collected.texts[c.index])
            out.append(CompletionChoice(index=c.index, text=text, logprobs=lp,
                                        finish_reason=collected.finish[c.index]))
        return CompletionResponse(choices=out, **collected.head(self.state, self.rid, "text_completion",
                                                                self.prompt_tokens(),
                                                                self.cached_tokens(collected.counts)))
