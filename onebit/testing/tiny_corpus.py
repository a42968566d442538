"""Built-in training text for the tiny test tokenizer: English prose, Python code, other scripts.

Written for this project. Its only job is to give a byte-level BPE enough varied words that
the merges look like a real tokenizer's (common English words, code keywords, indentation,
multi-byte characters), so tests see realistic token boundaries.
"""

CORPUS = r'''
The lighthouse keeper climbed the spiral stairs every evening at dusk. She carried a small
brass lamp, a notebook with a cracked leather cover, and a thermos of strong black tea. From
the top of the tower she could see the harbour, the fishing boats returning one by one, and
the long grey line where the sea met the sky. Nothing ever happened there, she liked to say,
and that was exactly why she had stayed for thirty-one years.

On Tuesday the weather changed. A warm wind came from the south, the clouds lowered, and by
nine o'clock the rain was falling sideways. The radio crackled with voices: a trawler had lost
its engine two miles out, and the coast guard asked whether the light was working. "It is,"
she answered, "and it will be until morning." Then she wound the clockwork, cleaned the glass,
and wrote the time in her notebook, as she had done ten thousand times before.

Good software is written for the people who will read it later. A function should do one
thing, and its name should say what that thing is. Tests are not a tax on development; they
are the reason you can change the code next year without fear. When a program fails, it
should fail loudly, early, and with a message that tells the reader what went wrong and how
to fix it. Measure before you optimise, and measure again after.

How many requests can one server answer at once? The answer depends on memory, on bandwidth,
and on how much work is shared between users. If every step reads all the weights once, then
eight users decoding together cost little more than one. The queue grows, the batch grows,
and the throughput grows with it, until the compute units are finally busy.

Questions and answers:
Q: What is the capital of France? A: Paris.
Q: How many legs does a spider have? A: Eight.
Q: What is 12 times 12? A: 144.
Q: Who wrote "Pride and Prejudice"? A: Jane Austen, in 1813.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 4096 65536 3.14159 2.71828 -7 1e-6 0x1F.
Punctuation: (parentheses) [brackets] {braces} <angle> "quotes" 'single' `back` ~tilde~
a+b=c; x*y/z; 50% off! really? yes... #hashtag @user $5.00 ^caret & ampersand | pipe \ slash

def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    numbers = [0, 1]
    while len(numbers) < n:
        numbers.append(numbers[-1] + numbers[-2])
    return numbers[:n]


class Counter:
    """Count how often each word appears in a text."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, text: str) -> None:
        for word in text.lower().split():
            self.counts[word] = self.counts.get(word, 0) + 1

    def most_common(self, k: int = 3) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda item: -item[1])[:k]


import json
import os
from pathlib import Path


def load_config(path: str) -> dict:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no config at {path}")
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


for i in range(10):
    if i % 2 == 0:
        print(i, "is even")
    else:
        print(i, "is odd")

result = {"name": "tiny", "layers": 2, "ok": True, "value": None}
print(json.dumps(result, indent=2))

{"role": "user", "content": "Hello! Can you help me?"}
{"role": "assistant", "content": "Of course. What do you need?"}
<tool_call>
{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}}
</tool_call>

Français : héllo wörld, où est la gare ? Ça va très bien, merci. L'été est arrivé.
Deutsch: Grüße aus München! Die Straße ist schön, und das Frühstück schmeckt gut.
Español: ¿Dónde está la biblioteca? ¡Mañana será un día estupendo, señor!
Русский: Привет, мир! Как дела? Сегодня хорошая погода.
Ελληνικά: Γειά σου κόσμε! Καλημέρα.
日本語: こんにちは世界。今日はいい天気ですね。東京は大きな都市です。
中文: 你好，世界！今天天气很好。我们一起去公园吧。
한국어: 안녕하세요, 세계! 만나서 반갑습니다.
العربية: مرحبا بالعالم
हिन्दी: नमस्ते दुनिया
Emoji: 😀 😃 😄 🚀 🌍 🎉 ❤️ 👍 🤖 🔥 ✨ 🍕 🐍 — “curly quotes” and ‘apostrophes’ … ellipsis • bullet
Math: α + β = γ, ∑ xᵢ² ≤ ∞, √2 ≈ 1.414, π r², ∀x ∃y: x ≠ y, 5 °C, 10 µs, € £ ¥ ₹.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Sphinx of black quartz, judge my vow. How vexingly quick daft zebras jump!
She sells sea shells by the sea shore; the shells she sells are surely seashells.

In the morning the market opened early. Farmers arrived with baskets of apples, pears and
plums; a baker set out loaves of rye and wheat; children ran between the stalls asking for
samples. By noon the square was full of music, conversation and the smell of roasted nuts.
Later, when the sun went down, the lanterns were lit and people walked home slowly, talking
about the harvest, the price of bread, and the weather for the coming week.

A recipe for pancakes: mix two cups of flour, two eggs, one cup of milk, a pinch of salt and
a spoonful of sugar. Whisk until smooth. Heat a pan with a little butter, pour a ladle of
batter, wait for bubbles, flip once, and serve warm with honey or berries.
'''
