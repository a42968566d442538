"""Prompt sets for the online benchmark: built-in texts and random token prompts.

`chat`, `code`, `prose` and `short` are a handful of prompts each, written for this project,
sent as one user message to /v1/chat/completions. `random:N` prompts are N random token ids
sent to /v1/completions (the seed's "N random prompt tokens"); when the chat endpoint is forced,
they become N random common English words instead, which is about N tokens in any byte-level
BPE vocabulary but not exactly N. `shared:P+N` prompts are the same P random tokens (a system
prompt every user shares) followed by N random tokens of each prompt's own: the prefix is drawn
from a fixed seed, so a warm-up request caches it as a running server would have.

Token-id prompts reach every server as the same ids, so each one evaluates exactly N (or P+N)
tokens whatever its tokenizer (ids 32..249 are single bytes in any byte-level BPE vocabulary);
`usage.prompt_tokens` of each request, kept in the run file, shows what the server counted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CHAT = [
    "My sourdough starter smells like nail polish remover. What is going on and how do I fix it?",
    "I have a job interview tomorrow for a junior data analyst role. What questions should I expect?",
    "Explain the difference between a Roth IRA and a traditional IRA as if I were twenty.",
    "Plan a three-day trip to Lisbon for someone who likes museums and hates crowds.",
    "My cat keeps knocking cups off the table while looking at me. Why do cats do that?",
    "Help me write a polite message to my neighbour about their dog barking at night.",
]

CODE = [
    "Write a Python function that merges overlapping intervals given as a list of (start, end) pairs.",
    "In Rust, how do I share a mutable counter between threads safely? Show a short example.",
    "Explain what this SQL does and make it faster: SELECT * FROM orders WHERE id IN "
    "(SELECT order_id FROM items WHERE price > 100);",
    "Write a bash one-liner that finds the ten largest files under the current directory.",
    "Implement an LRU cache in TypeScript with get and put in O(1) time, with comments.",
    "Why does this Python print 3 three times? fs = [lambda: i for i in range(4)][1:]; "
    "[print(f()) for f in fs]",
]

PROSE = [
    "Write a short story about a lighthouse keeper who finds a letter addressed to her from 1893.",
    "Describe a night market in a coastal town in the rain, in vivid sensory detail.",
    "Write an essay on why bridges are the most optimistic things people build.",
    "Tell the history of a single copper coin from the mint to the bottom of a fountain.",
    "Write a letter from a retired astronaut to her grandson about the first time she saw Earth.",
    "Write a fable in which a river and a mountain argue about which of them is patient.",
]

SHORT = [
    "Hi!",
    "What is 17 times 23?",
    "Name a colour.",
    "Capital of Peru?",
    "Say something kind.",
    "Is a tomato a fruit?",
]

PROMPT_SETS = {"chat": CHAT, "code": CODE, "prose": PROSE, "short": SHORT}

# Common single-token English words for random word prompts on the chat endpoint.
_WORDS = ("time year people way day man thing woman life child world school state family student "
          "group country problem hand part place case week company system program question work "
          "government number night point home water room mother area money story fact month lot "
          "right study book eye job word business issue side kind head house service friend father "
          "power hour game line end member law car city name team minute idea kid body back parent "
          "face others level office door health person art war history party result change morning "
          "reason research girl guy moment air teacher force education").split()

# Token ids drawn for random prompts when the vocabulary size is unknown: every byte-level BPE
# vocabulary (and the project's tiny models) has ordinary tokens in this range.
DEFAULT_RANDOM_IDS = (32, 250)


@dataclass(frozen=True)
class Prompt:
    """One prompt: text for the chat endpoint or either endpoint, or token ids for /v1/completions."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None


def parse_prompt_spec(spec: str) -> tuple[str, int | None]:
    """'chat' -> ('chat', None); 'random:128' -> ('random', 128); 'shared:1024+512' -> ('shared', 1536),
    the total length. Raises ValueError on anything else."""
    if spec in PROMPT_SETS:
        return spec, None
    name, _, length = spec.partition(":")
    if name == "random" and length.isdigit() and int(length) > 0:
        return "random", int(length)
    if name == "shared":
        return "shared", sum(shared_lengths(spec))
    raise ValueError(f"unknown prompt set {spec!r}: use {', '.join(PROMPT_SETS)}, random:TOKENS or "
                     "shared:PREFIX+TOKENS")


def shared_lengths(spec: str) -> tuple[int, int]:
    """'shared:1024+512' -> (1024, 512): the shared prefix and each prompt's own tokens."""
    prefix, plus, own = spec.partition(":")[2].partition("+")
    if not (plus and prefix.isdigit() and own.isdigit() and int(prefix) > 0 and int(own) > 0):
        raise ValueError(f"bad shared prompt spec {spec!r}: use shared:PREFIX+TOKENS, e.g. shared:1024+1024")
    return int(prefix), int(own)


def default_endpoint(spec: str) -> str:
    """'completions' for random token prompts, 'chat' for the text sets."""
    return "completions" if parse_prompt_spec(spec)[0] in ("random", "shared") else "chat"


def make_prompts(spec: str, count: int, endpoint: str, seed: int | str = 0,
                 id_range: tuple[int, int] = DEFAULT_RANDOM_IDS) -> list[Prompt]:
    """`count` prompts of the set `spec` for `endpoint` ('chat' or 'completions'), cycling text sets.

    Random prompts differ from each other (a new draw per prompt), so a prefix cache cannot
    turn them into cache hits. The draws are seeded by `seed` and `spec` together: with the seed
    alone, random:8192's prompts would begin with random:2048's, and a server measured with one
    after the other would serve the longer ones partly from its prefix cache.
    """
    name, length = parse_prompt_spec(spec)
    if name not in ("random", "shared"):
        texts = PROMPT_SETS[name]
        return [Prompt(text=texts[i % len(texts)]) for i in range(count)]
    prefix_len, length = shared_lengths(spec) if name == "shared" else (0, length)
    rng, fixed = random.Random(f"{seed} {spec}"), random.Random(f"shared prefix {prefix_len}")
    lo, hi = id_range
    if endpoint == "chat":
        prefix = " ".join(fixed.choice(_WORDS) for _ in range(prefix_len))
        return [Prompt(text=(prefix + " " if prefix else "") + " ".join(rng.choice(_WORDS) for _ in range(length)))
                for _ in range(count)]
    prefix_ids = tuple(fixed.randrange(lo, hi) for _ in range(prefix_len))
    return [Prompt(token_ids=prefix_ids + tuple(rng.randrange(lo, hi) for _ in range(length))) for _ in range(count)]
