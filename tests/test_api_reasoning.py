"""The <think> splitter, fed in every possible chunking."""

from __future__ import annotations

from onebit.api.reasoning import ReasoningSplitter, prompt_opens_reasoning


def _run(text: str, size: int, in_reasoning: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(in_reasoning)
    reasoning, content = "", ""
    for i in range(0, len(text), size):
        r, c = splitter.feed(text[i:i + size])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    return reasoning + r, content + c


def test_split_at_every_chunk_size():
    text = "<think>plan: a < b</think>answer <thin"
    for size in range(1, len(text) + 1):
        assert _run(text, size) == ("plan: a < b", "answer <thin")


def test_prompt_already_opened_the_block():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    for size in (1, 3, 100):
        assert _run("why</think>because", size, in_reasoning=True) == ("why", "because")


def test_no_tags_is_all_content():
    assert _run("plain text", 2) == ("", "plain text")


def test_random_chunkings_agree_with_the_whole_text():
    # Chunks without a '<' take a shortcut; any chunking must give what the whole text gives.
    import random
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice(["<think>", "</think>", "<", "<th", "</", ">", "a", "b ", "\n"])
                       for _ in range(rng.randint(0, 12)))
        opened = rng.random() < 0.5
        whole = _run(text, max(len(text), 1), opened)
        for size in range(1, len(text) + 1):
            assert _run(text, size, opened) == whole, (text, size, opened)
