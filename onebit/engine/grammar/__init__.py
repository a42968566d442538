"""Constrained decoding: grammars compiled once per schema (compiler.py), a matcher state per
request (state.py) and one batched token mask per step (mask.py), on llguidance."""

from onebit.engine.grammar.compiler import GrammarCompiler
from onebit.engine.grammar.mask import GrammarMasker
from onebit.engine.grammar.state import GrammarFailed, GrammarState

__all__ = ["GrammarCompiler", "GrammarFailed", "GrammarMasker", "GrammarState"]
