"""Compiling a request's GrammarSpec into an llguidance matcher, with compiled grammars cached by
spec: the second request with the same schema copies a ready matcher instead of compiling."""

from __future__ import annotations

import json
from collections import OrderedDict

import llguidance

from onebit.engine.grammar.state import GrammarState
from onebit.models.tokenizer import Tokenizer
from onebit.protocol.errors import InvalidRequest
from onebit.protocol.grammar import GrammarSpec

# No free whitespace between JSON tokens: a model (a random one above all) could otherwise
# spend its whole budget on spaces and never close the object.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for `spec` (not yet checked); InvalidRequest for bad input."""
    try:
        if spec.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
        if spec.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(spec.text, overrides=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(spec.text)
        return llguidance.grammar_from("gbnf", spec.text)
    except (ValueError, TypeError, json.JSONDecodeError) as error:
        raise InvalidRequest(f"invalid {spec.kind.replace('_', ' ')}: {error}", spec.param) from None
    except Exception as error:  # the GBNF translator raises its own parse errors
        raise InvalidRequest(f"invalid {spec.kind}: {error}", spec.param) from None


class GrammarCompiler:
    """Builds matchers for one model's tokenizer; keeps the last `cache_size` compiled grammars."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: set[int], cache_size: int = 128):
        eos = sorted(eos_token_ids) or None
        self.tokenizer = llguidance.LLTokenizer(tokenizer.backend_json(), n_vocab=vocab_size, eos_token=eos)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self.compiled = 0  # grammars compiled (cache misses), for tests and metrics

    def start(self, spec: GrammarSpec) -> GrammarState:
        """A fresh state at the start of `spec`'s grammar; InvalidRequest naming the request field
        when the grammar does not compile."""
        template = self._cache.get(spec.key)
        if template is None:
            template = self._compile(spec)
            self._cache[spec.key] = template
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(spec.key)
        return GrammarState(template.deep_copy())

    def _compile(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        text = grammar_text(spec)
        try:
            problem = llguidance.LLMatcher.validate_grammar(text, self.tokenizer)
        except Exception as error:  # the library's own exception types; any of them is a bad grammar
            problem = str(error) or type(error).__name__
        if problem:
            raise InvalidRequest(f"invalid {spec.kind.replace('_', ' ')}: {problem}", spec.param)
        matcher = llguidance.LLMatcher(self.tokenizer, text, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"invalid {spec.kind.replace('_', ' ')}: {matcher.get_error()}", spec.param)
        self.compiled += 1
        return matcher
