"""The tokenizer in a GGUF file's metadata, built as a `tokenizers.Tokenizer`.

Two vocabularies, as llama.cpp reads them:
- `gpt2`: byte-level BPE (tokens, merges, token types) split first by the regex that
  `tokenizer.ggml.pre` names;
- `llama`: SentencePiece (tokens, scores, `<0xXX>` byte tokens). Its scores order the merges:
  any two adjacent pieces whose concatenation is in the vocabulary merge, highest score first,
  which is a BPE whose merge list is every such pair sorted by the score of the result.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as RustTokenizer

from onebit.models.errors import ModelLoadError
from onebit.models.gguf.files import GGUFFile

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (split regex or None for GPT-2's own, ignore_merges as llama.cpp sets it)
PRE_TOKENIZERS = {
    "gpt-2": (None, False),
    "qwen2": (_QWEN2, False),
    "llama-bpe": (_LLAMA3, True),
    "llama3": (_LLAMA3, True),
}
MODELS = ("gpt2", "llama")


def _list(gfile: GGUFFile, key: str, required: bool = True) -> list | None:
    value = gfile.get(key)
    if value is None and required:
        raise ModelLoadError(f"{gfile.path.name}: tokenizer metadata lacks {key!r}")
    return value


def _vocab(gfile: GGUFFile) -> tuple[list[str], list[int]]:
    tokens = _list(gfile, "tokenizer.ggml.tokens")
    types = _list(gfile, "tokenizer.ggml.token_type", required=False) or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelLoadError(f"{gfile.path.name}: {len(tokens)} tokens but {len(types)} token types")
    return tokens, types


def _add_special(tok: RustTokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens as special added tokens, user-defined ones as plain added tokens (both matched
    in raw text, as llama.cpp does); they keep their ids because they are in the model's vocab too."""
    added = [AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
             for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)]
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])


def _bpe(gfile: GGUFFile) -> RustTokenizer:
    tokens, types = _vocab(gfile)
    pre = gfile.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(f"{gfile.path.name}: unknown pre-tokenizer {pre!r} (tokenizer.ggml.pre); "
                             f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    regex, ignore_merges = PRE_TOKENIZERS[pre]
    merges = [tuple(m.split(" ", 1)) for m in _list(gfile, "tokenizer.ggml.merges")]
    vocab = {text: i for i, text in enumerate(tokens)}
    tok = RustTokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    _add_special(tok, tokens, types)
    return tok


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every pair of vocabulary pieces whose concatenation is a normal piece, by that piece's score
    (highest first), then by the ids of the two halves."""
    ids = {text: i for i, text in enumerate(tokens) if types[i] in (NORMAL, UNKNOWN, USER_DEFINED)}
    ranked = []
    for text, i in ids.items():
        if types[i] != NORMAL:
            continue
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _spm(gfile: GGUFFile) -> RustTokenizer:
    tokens, types = _vocab(gfile)
    scores = _list(gfile, "tokenizer.ggml.scores")
    if len(scores) != len(tokens):
        raise ModelLoadError(f"{gfile.path.name}: {len(tokens)} tokens but {len(scores)} scores")
    unk = gfile.get("tokenizer.ggml.unknown_token_id")
    vocab = {text: i for i, text in enumerate(tokens)}
    tok = RustTokenizer(models.BPE(vocab, spm_merges(tokens, scores, types), byte_fallback=True,
                                   unk_token=tokens[unk] if isinstance(unk, int) else None, fuse_unk=True))
    steps = [normalizers.Replace(" ", "\u2581")]
    if gfile.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    _add_special(tok, tokens, types)
    return tok


def _token(gfile: GGUFFile, tokens: list[str], key: str) -> str | None:
    value = gfile.get(f"tokenizer.ggml.{key}_token_id")
    return tokens[value] if isinstance(value, int) and 0 <= value < len(tokens) else None


def tokenizer_from_gguf(gfile: GGUFFile):
    """Our Tokenizer (special tokens, add_bos_token, chat template) for the vocabulary in `gfile`."""
    from onebit.models.tokenizer import Tokenizer

    kind = gfile.get("tokenizer.ggml.model")
    if kind not in MODELS:
        raise ModelLoadError(f"{gfile.path.name}: unsupported tokenizer model {kind!r} (tokenizer.ggml.model); "
                             f"supported: {', '.join(MODELS)}")
    try:
        tok = _bpe(gfile) if kind == "gpt2" else _spm(gfile)
    except ModelLoadError:
        raise
    except Exception as exc:  # the Rust side raises plain Exception for a malformed vocabulary
        raise ModelLoadError(f"{gfile.path.name}: cannot build its {kind} tokenizer: {exc}") from None
    tokens = gfile.get("tokenizer.ggml.tokens")
    bos, eos = _token(gfile, tokens, "bos"), _token(gfile, tokens, "eos")
    default_bos = kind == "llama"  # llama.cpp's default for SentencePiece vocabularies
    if gfile.get("tokenizer.ggml.add_bos_token", default_bos) and bos is not None:
        bos_id = gfile.get("tokenizer.ggml.bos_token_id")
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    extra = [gfile.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    return Tokenizer(tok, eos_token=eos, bos_token=bos, extra_eos_token_ids=[i for i in extra if isinstance(i, int)],
                     chat_template=gfile.get("tokenizer.chat_template"))
