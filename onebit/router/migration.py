"""Continue a request on another backend after its backend died mid-stream (a migration).

The client has been sent some tokens and text; the request goes on from its prompt plus those
tokens, with what is left of its token limits, and the new backend's deltas are shifted so the
client sees one stream: no repeated or missing text, usage and draft counts that add up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from onebit.protocol import GenerateRequest, Resumed, StepDelta

log = logging.getLogger(__name__)


class Progress:
    """What one request's client has been sent so far, over every backend that served it.

    `add()` records a delta and returns it as the client must see it (counts shifted past what
    earlier backends produced); `continuation()` is the request to send to the next backend.
    """

    def __init__(self, request: GenerateRequest):
        self.request = request
        self.token_ids: list[int] = []
        self._texts: list[str] = []  # the text sent, in pieces (joined when read: += on an attribute copies it all)
        self.ids_known = True  # False once a delta carried text without its token ids (a text-only peer)
        self.moves = 0
        self._prompt_tokens: int | None = None  # as the first backend counted them
        self._cached_tokens = 0
        self._base_tokens = 0  # output tokens produced before the current backend took over
        self._base_drafts = (0, 0)
        self._drafts = (0, 0)
        self._skip_tokens = 0  # tokens the current backend regenerates that the client already has
        self._skip_chars = 0  # and their text

    def add(self, delta: StepDelta) -> StepDelta:
        """Record one delta of the current backend; the delta shifted for the client."""
        if delta.text and not delta.token_ids:
            self.ids_known = False
        if self._skip_tokens or self._skip_chars:
            delta = self._skip(delta)
        self.token_ids += delta.token_ids
        if delta.text:
            self._texts.append(delta.text)
        if self.moves == 0:
            if delta.num_prompt_tokens:
                self._prompt_tokens = delta.num_prompt_tokens
                self._cached_tokens = delta.num_cached_tokens
            self._drafts = (delta.num_draft_tokens, delta.num_accepted_tokens)
            return delta
        drafted, accepted = self._base_drafts
        self._drafts = (drafted + delta.num_draft_tokens, accepted + delta.num_accepted_tokens)
        return dataclasses.replace(delta, num_prompt_tokens=self._prompt_tokens or len(self.request.prompt_token_ids),
                                   num_output_tokens=self._base_tokens + delta.num_output_tokens,
                                   num_cached_tokens=self._cached_tokens, num_draft_tokens=self._drafts[0],
                                   num_accepted_tokens=self._drafts[1])

    def _skip(self, delta: StepDelta) -> StepDelta:
        """Drop the regenerated tokens and text the client already has from a delta."""
        n = min(self._skip_tokens, len(delta.token_ids))
        c = min(self._skip_chars, len(delta.text))
        self._skip_tokens -= n
        self._skip_chars -= c
        logprobs = delta.logprobs[n:] if delta.logprobs is not None else None
        return dataclasses.replace(delta, token_ids=delta.token_ids[n:], text=delta.text[c:], logprobs=logprobs)

    def _clean_cut(self, decode) -> int:
        """The longest prefix of the streamed tokens whose text the client has in full (text held back
        at the break, half a character or a possible stop string, lies after it); all of them when
        `decode` is None."""
        if decode is None:
            return len(self.token_ids)
        skip = self.request.params.skip_special_tokens
        for k in range(len(self.token_ids), -1, -1):
            text = decode(self.token_ids[:k], skip) if k else ""
            if self.text.startswith(text) and not text.endswith("\ufffd"):
                return k
        return 0

    @property
    def text(self) -> str:
        """The text sent so far."""
        if len(self._texts) > 1:
            self._texts[:] = ["".join(self._texts)]
        return self._texts[0] if self._texts else ""

    @property
    def can_continue(self) -> bool:
        """Whether the request can go on elsewhere: nothing was sent yet, or every token's id is known."""
        return not self.token_ids and not self._texts or self.ids_known

    def continuation(self, kind: str = "native", decode=None) -> GenerateRequest | StepDelta:
        """The request that continues from here on a backend of `kind`, or (when its token limit is
        already reached) the finished delta that ends it. Call only when `can_continue`.

        A native backend rebuilds the text state from `Resumed`. Any other kind continues from the
        last clean token boundary (found with `decode`, the tokenizer's): the tokens after it are
        generated again and the wrapper drops what the client already has of them."""
        original = self.request
        n = len(self.token_ids)
        if kind != "native" and n:
            n = self._clean_cut(decode)
            self._skip_tokens = len(self.token_ids) - n
            self._skip_chars = len(self.text) - len(decode(self.token_ids[:n], original.params.skip_special_tokens)
                                                    if decode is not None and n else "")
            if decode is None:
                self._skip_chars = 0
        self.moves += 1
        self._base_tokens = n
        self._base_drafts = self._drafts
        if n == 0 and not self._texts:
            return original
        p = original.params
        remaining = None if p.max_tokens is None else p.max_tokens - n
        if remaining is not None and remaining <= 0:
            return StepDelta(original.request_id, [], "", finished=True, finish_reason="length",
                             num_prompt_tokens=self._prompt_tokens or len(original.prompt_token_ids),
                             num_output_tokens=n, num_cached_tokens=self._cached_tokens,
                             num_draft_tokens=self._drafts[0], num_accepted_tokens=self._drafts[1])
        params = dataclasses.replace(p, max_tokens=remaining, min_tokens=max(0, p.min_tokens - n))
        text = self.text[:len(self.text) - self._skip_chars]
        prompt_text = original.prompt_text + text if original.prompt_text is not None else None
        return dataclasses.replace(original, prompt_token_ids=original.prompt_token_ids + self.token_ids[:n],
                                   params=params, prompt_text=prompt_text, resumed=Resumed(n, text))


async def settle(backend, timeout: float = 1.0) -> None:
    """After `backend` failed a request, wait (up to `timeout` s) until its state says so: right after a
    child dies the backend may still read "ready", and a retry would claim a slot on it and fail again at
    once, spending the request's attempts before the restart could take it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while backend.state == "ready" and loop.time() < deadline:
        await asyncio.sleep(0.05)


async def wait_until_serviceable(router, timeout: float) -> bool:
    """Wait (up to `timeout` s) until some backend is loading or ready, e.g. the one restarting
    after its death; True if one is. A migrating request waits for it rather than fail."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not router.serviceable():
        if router.closed or loop.time() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True
