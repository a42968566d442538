"""One request's position in its grammar: which tokens may come next, advanced token by token."""

from __future__ import annotations

import llguidance


class GrammarFailed(RuntimeError):
    """A request's grammar rejected a token or failed inside the matcher; fails that request only."""


class GrammarState:
    """Wraps one llguidance matcher: `accept` each token the request keeps; `done` once the
    grammar allows nothing more (the output is complete)."""

    def __init__(self, matcher: llguidance.LLMatcher):
        self.matcher = matcher

    @property
    def failed(self) -> bool:
        """True once the matcher is in its (permanent) error state."""
        return self.matcher.is_error()

    @property
    def done(self) -> bool:
        """True when the grammar is complete and admits no further token but an end token."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def accept(self, token: int) -> None:
        """Advance over `token`; GrammarFailed when the grammar does not allow it."""
        if not self.matcher.consume_token(token):
            raise GrammarFailed(f"the output grammar rejected token {token}: {self.matcher.get_error()}")
