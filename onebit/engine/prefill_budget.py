"""How many prompt tokens a step that also decodes may take (`--mixed-step-tokens`).

Chunked prefill shares a step between decoding sequences and prompt chunks. A step's time grows
with its prompt tokens, and every decoding sequence waits for the whole step, so a 2,048-token
chunk turns a 5 ms decode step into tens of milliseconds. With a mixed-step cap S, while any
sequence decodes, the step's prompt tokens stay within S minus its decode rows.

Why S around 256 on the H200 for the 8B shape (a prediction, to be measured with
bench/gpu_attention_long.py): a step's linear layers read every weight once whatever its row
count, and stay bound by those reads until the rows reach the GPU's FLOP/byte ridge (about
990 TFLOP/s over 4.8 TB/s, ~200 rows for bf16 weights), so up to there the prompt tokens ride
along nearly free and a decode step stays near its own time; prefill throughput at that chunk
size is close to the compute-bound rate too, since the ridge is where the two meet.

Attention is the part that grows with context: a chunk of n tokens starting c tokens in costs
n x c in attention, against n in its linear layers; for the 8B shape (32 query heads of 128, 36
layers) a token's attention FLOPs match its linear ones near c = 24k, and the attention kernel
runs at about half the GEMMs' rate, so a chunk deep into a long prompt is cut by
CONTEXT_SCALE / (CONTEXT_SCALE + c): half the tokens at 8k.
"""

from __future__ import annotations

CONTEXT_SCALE = 8192  # tokens of context at which a mixed step's chunk gets half the budget
MIN_CHUNK = 16  # a prompt always advances at least this much per step, however many rows decode


def prefill_tokens(cap: int, decode_rows: int) -> int:
    """Prompt tokens a step with `decode_rows` decode (or verification) rows may take in all."""
    return max(cap - decode_rows, MIN_CHUNK)


def chunk_tokens(tokens_left: int, context: int, context_scale: int = CONTEXT_SCALE) -> int:
    """Tokens a prompt chunk starting `context` tokens in may take from the step's `tokens_left`
    prompt tokens: fewer the deeper it starts; 0 once none are left."""
    if tokens_left <= 0:
        return 0
    return max(min(MIN_CHUNK, tokens_left), tokens_left * context_scale // (context_scale + max(context, 0)))
