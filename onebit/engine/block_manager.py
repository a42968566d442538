"""The paged KV cache's bookkeeping: a pool of fixed-size blocks, block tables and prefix caching.

Full blocks are hashed by content, chained over the prefix (a block's hash covers
every token before it), so two sequences with the same first N blocks share them.
A freed block keeps its hash until it is handed out again, so a later request with
the same prefix finds it. Free blocks are reused least-recently-freed first.
"""

from __future__ import annotations

from collections import OrderedDict

from onebit.engine.sequence import Sequence


class OutOfBlocks(RuntimeError):
    """The pool has too few free blocks for the request."""


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given its parent's hash."""
    return hash((parent, tokens))


class BlockManager:
    """Allocates cache blocks to sequences and shares identical prefixes between them."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (cached-but-unused ones included)."""
        return len(self.free)

    @property
    def usage(self) -> float:
        """Fraction of the pool held by live sequences."""
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold num_tokens tokens."""
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.block_hash[block]
        if old is not None and self.cached.get(old) == block:
            del self.cached[old]
        self.block_hash[block] = None
        self.block_tokens[block] = None
        self.ref_count[block] = 1
        return block

    def match_prefix(self, seq: Sequence) -> None:
        """Attach cached blocks for the longest matching prefix of a sequence without blocks.

        The block holding the last token is never taken from the cache, so at
        least one token is computed and produces the first logits.
        """
        if not self.enable_prefix_caching or seq.block_table or seq.pooler is not None:
            return  # an embedding pools the states of every prompt position: none may be skipped
        parent = None
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            h = chain_hash(parent, tokens)
            block = self.cached.get(h)
            if block is None or self.block_tokens[block] != tokens:
                break
            if self.ref_count[block] == 0:
                del self.free[block]
            self.ref_count[block] += 1
            seq.block_table.append(block)
            seq.block_hashes.append(h)
            parent = h
        seq.num_cached_tokens = len(seq.block_table) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """True when seq's table can be extended to hold num_tokens tokens."""
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= len(self.free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend seq's block table to hold num_tokens tokens."""
        need = self.blocks_needed(num_tokens) - len(seq.block_table)
        if need > len(self.free):
            raise OutOfBlocks(f"need {need} blocks, {len(self.free)} free")
        for _ in range(need):
            seq.block_table.append(self._take_free())

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Register the hashes of seq's blocks that became full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            h = chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, tokens)
            block = seq.block_table[i]
            seq.block_hashes.append(h)
            if h not in self.cached:
                self.cached[h] = block
                self.block_hash[block] = h
                self.block_tokens[block] = tokens

    def free_sequence(self, seq: Sequence) -> None:
        """Drop seq's references; blocks nobody holds go back to the pool (keeping their hash)."""
        for block in reversed(seq.block_table):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free[block] = None
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0
