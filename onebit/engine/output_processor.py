"""Turns accepted tokens into text and deltas: detokenizing, stop tokens, stop strings, length."""

from __future__ import annotations

import logging

from onebit.engine.outputs import StepDelta, TokenLogprob
from onebit.engine.sequence import Sequence
from onebit.models.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer
from onebit.protocol.types import Resumed

log = logging.getLogger(__name__)


class OutputProcessor:
    """Owns each request's detokenizer and stop-string matcher, decides finish reasons and
    builds the deltas the engine returns."""

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        # The detokenizers' byte table, built now rather than in the first request's add_request
        # (0.1 s here for a 152k vocabulary, ~0.5 s on the H200 host: session 15's G21 counted it
        # as 0.46 ms of every step of a 512-request run).
        _ = tokenizer.token_bytes

    def start(self, seq: Sequence, resumed: Resumed | None = None) -> None:
        """Attach the text state a new request needs; for a resumed one, replay the tokens it
        already generated (the prompt's tail) so held-back text and stop-string state carry on."""
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, seq.params.skip_special_tokens)
        seq.stop_matcher = StopStringMatcher(seq.params.stop) if seq.params.stop else None
        if resumed is None or resumed.num_generated <= 0:
            return
        generated = seq.token_ids[seq.num_prompt_tokens - resumed.num_generated:seq.num_prompt_tokens]
        released = seq.detokenizer.add(generated)
        if seq.stop_matcher is not None:
            released, _ = seq.stop_matcher.feed(released)
        if released != resumed.text:
            log.warning("request %s resumed: its %d generated tokens give %r, the client had %r",
                        seq.request_id, len(generated), released[-40:], resumed.text[-40:])
        for token in generated:  # penalties count them as output
            seq.output_counts[token] = seq.output_counts.get(token, 0) + 1

    def process(self, seq: Sequence, token: int) -> tuple[str, str | None]:
        """The text that `token` (just appended to seq) releases, and the finish reason it causes:
        "stop" (an end token, a stop token, a stop string or a complete grammar), "length" (the
        limit), or None."""
        p = seq.params
        reason = None
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            reason = "stop"
            piece = seq.detokenizer.flush()
        else:
            piece = seq.detokenizer.add([token])
            if seq.grammar is not None and seq.grammar.done:  # the constrained output is complete
                reason = "stop"
                piece += seq.detokenizer.flush()
            elif seq.num_tokens >= seq.max_total_tokens:
                reason = "length"
                piece += seq.detokenizer.flush()
        if seq.stop_matcher is not None:
            piece, stopped = seq.stop_matcher.feed(piece)
            if stopped:
                reason = "stop"
            elif reason is not None:
                piece += seq.stop_matcher.flush()
        return piece, reason

    @staticmethod
    def delta(seq: Sequence, tokens: list[int], text: str, reason: str | None,
              logprobs: list[TokenLogprob] | None = None, error: str | None = None) -> StepDelta:
        """One request's delta for this step (`reason` set: its last)."""
        return StepDelta(seq.request_id, tokens, text, reason is not None, reason, error, logprobs,
                         seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_tokens,
                         seq.spec.drafted, seq.spec.accepted)
