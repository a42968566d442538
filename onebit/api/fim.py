"""Fill-in-the-middle for `suffix` on /v1/completions: the prompt and suffix wrapped in the model's
FIM tokens (prefix-suffix-middle order), where its tokenizer has them."""

from __future__ import annotations

from onebit.protocol import InvalidRequest

# (prefix, suffix, middle) token spellings of the families that train FIM.
FIM_TOKENS = [
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, DeepSeek-style
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<PRE>", "<SUF>", "<MID>"),  # CodeLlama
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
]


def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    """The (prefix, suffix, middle) token ids of `tokenizer`, None when it has no FIM tokens."""
    for names in FIM_TOKENS:
        ids = [tokenizer.token_to_id(n) for n in names]
        if all(i is not None for i in ids):
            return ids[0], ids[1], ids[2]
    return None


def fim_prompt(tokenizer, prefix: list[int], suffix: str) -> list[int]:
    """`prefix` (token ids) and `suffix` as one FIM prompt; 400 naming `suffix` without FIM tokens."""
    ids = fim_tokens(tokenizer)
    if ids is None:
        raise InvalidRequest("this model has no fill-in-the-middle tokens, so suffix is not supported", "suffix")
    pre, suf, mid = ids
    return [pre, *prefix, suf, *tokenizer.encode(suffix, add_special_tokens=False), mid]
