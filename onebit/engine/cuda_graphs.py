"""Steps replayed from CUDA graphs, one graph per row count on a ladder.

A graph runs the model over R rows where every row is one token with its own position,
cache slot, block table and context length: a decode token is one row, and a sequence
verifying k drafts is k + 1 rows that share its block table with context lengths p + 1
(each layer writes the step's K/V before attending, so a row sees the drafts before it).
A step of R rows runs the graph captured for the smallest ladder size >= R; the extra rows
are padding that writes into a scratch cache block and attends to one token of it. Inputs
live in static buffers that each step overwrites in place.
"""

from __future__ import annotations

import torch

from onebit.engine.feed import Feed
from onebit.engine.transfer import upload_into
from onebit.kernels.attention import AttentionMetadata

LADDER = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]


def ladder_for(max_batch: int) -> list[int]:
    """Captured batch sizes up to max_batch (max_batch itself always included)."""
    sizes = [b for b in LADDER if b < max_batch]
    return sizes + [max_batch]


class CudaGraphDecoder:
    """Captures the model's one-token-per-row forward (logits and pre-norm states included) and
    replays it. Without a captured graph for a size (CPU tests), `run` executes the same forward
    eagerly over the same static buffers."""

    def __init__(self, model, kv_cache: torch.Tensor, rope, scratch_block: int, block_size: int,
                 max_batch: int, max_blocks: int, num_splits: int, max_context: int):
        device = kv_cache.device
        self.model, self.kv_cache, self.rope = model, kv_cache, rope
        self.block_size = block_size
        self.scratch_slot = scratch_block * block_size
        self.scratch_block = scratch_block
        # Input ids, positions, cache slots and context lengths are the rows of one buffer, written whole
        # by one upload a step (a few KB: the copy's latency, not its bytes, is what a step pays for each
        # upload).
        self.row_inputs = torch.zeros((4, max_batch), dtype=torch.long, device=device)
        self.ids, self.positions, self.slots, self.lens = self.row_inputs.unbind(0)
        self.slots.fill_(self.scratch_slot)
        self.lens.fill_(1)
        self.tables = torch.full((max_batch, max_blocks), scratch_block, dtype=torch.int32, device=device)
        # The block-table rows last uploaded (padding included): a step whose rows are the same skips the
        # upload (one block holds block_size tokens, so at one row 15 steps of 16 keep the table).
        self._uploaded_tables: list[list[int]] | None = None
        self.num_splits, self.max_context = num_splits, max_context
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.pool = None
        self.sizes = ladder_for(max_batch)

    def _forward(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        meta = AttentionMetadata(slot_mapping=self.slots[:b], num_decodes=b, decode_block_tables=self.tables[:b],
                                 decode_context_lens=self.lens[:b], prefills=[],
                                 decode_num_splits=self.num_splits, decode_max_context=self.max_context)
        normed, prenorm = self.model(self.ids[:b], self.positions[:b], self.kv_cache, meta, self.rope,
                                     return_prenorm=True)
        return self.model.compute_logits(normed), prenorm

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per ladder size, largest first so smaller ones reuse its memory pool."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # Compile every Triton kernel variant outside capture (few-row products pick their
            # kernel by row count), then settle the allocator at the largest size.
            for b in self.sizes + [self.sizes[-1]]:
                self._forward(b)
        torch.cuda.current_stream().wait_stream(stream)
        for b in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self._forward(b)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[b] = (graph, outputs)
        torch.cuda.synchronize()

    def can_run(self, rows: int) -> bool:
        """True when the ladder covers a step of `rows` rows."""
        return 0 < rows <= self.sizes[-1]

    def fill(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
             lens: list[int]) -> int:
        """Write one step's rows into the static inputs, padded to a ladder size; return that size."""
        n = len(ids)
        b = next(size for size in self.sizes if size >= n)
        width = max(len(t) for t in tables)
        rows = [t + [self.scratch_block] * (width - len(t)) for t in tables]
        rows += [[self.scratch_block] * width] * (b - n)
        rest = self.row_inputs.shape[1] - n
        upload_into(self.row_inputs.view(-1), ids + [0] * rest + positions + [0] * rest
                    + slots + [self.scratch_slot] * rest + lens + [1] * rest)
        if rows != self._uploaded_tables:
            upload_into(self.tables[:b, :width], rows)
            self._uploaded_tables = rows
        return b

    def run(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]],
            lens: list[int], feed: Feed | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the static inputs for this step and replay; returns (logits, pre-norm states), one
        row per input row. Both are views of static buffers that the next replay overwrites.
        `feed` overwrites some rows' input ids with the previous step's sampled ids on the device."""
        b = self.fill(ids, positions, slots, tables, lens)
        if feed is not None:
            feed.write_into(self.ids)
        captured = self.graphs.get(b)
        if captured is None:
            logits, prenorm = self._forward(b)
        else:
            captured[0].replay()
            logits, prenorm = captured[1]
        return logits[:len(ids)], prenorm[:len(ids)]
