"""A smaller model with the target's tokenizer as the speculative drafter (`--draft-model DIR`).

The drafter keeps its own paged KV cache (its own ModelRunner and BlockManager). For each target
request it keeps a proxy Sequence: the tokens it has seen, the blocks holding their K/V, and how
many of its tokens are its own drafts. Proposing re-syncs the proxy with the target's tokens by
their common prefix, so rejected drafts, preemption and recompute need no bookkeeping of their own.
"""

from __future__ import annotations

import logging

import torch

from onebit.engine.block_manager import BlockManager
from onebit.engine.runner import ModelRunner
from onebit.engine.sequence import Sequence, SequenceStatus
from onebit.engine.spec.drafter import Proposals
from onebit.models.config import ModelConfig
from onebit.models.loader import load_model, resolve_model_path
from onebit.models.tokenizer import Tokenizer
from onebit.models.transformer import CausalLM

log = logging.getLogger("onebit.engine.draft")


def check_same_tokenizer(target: Tokenizer, draft: Tokenizer, draft_name: str) -> None:
    """ValueError unless both tokenizers map every token id to the same token.

    Drafts are token ids, and the target reads them as its own: the two vocabularies must agree
    id for id (the embedding sizes may differ; Qwen pads them differently per model size).
    """
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"draft model {draft_name} has a tokenizer of {draft.vocab_size} tokens, the model's has "
                         f"{target.vocab_size}; a draft model must use the same tokenizer as the model")
    for i in range(target.vocab_size):
        if draft.id_to_token(i) != target.id_to_token(i):
            raise ValueError(f"draft model {draft_name} has a different tokenizer than the model: token id {i} is "
                             f"{draft.id_to_token(i)!r} for the draft model, {target.id_to_token(i)!r} for the model")


def load_draft_model(model: str, target_tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype,
                     load_format: str = "auto") -> tuple[CausalLM, ModelConfig]:
    """Find the draft model locally (a directory or a cached Hugging Face id; never a download),
    check its tokenizer against the target's, and load it."""
    path = resolve_model_path(model)
    check_same_tokenizer(target_tokenizer, Tokenizer.from_dir(path), str(path))
    return load_model(path, device, dtype, load_format)


class DraftModelProposer:
    """Greedy drafts from a draft model over its own KV pool of `num_blocks` blocks.

    Proposals are argmaxes over the ids both models have (the smaller embedding), so every
    draft is a valid target token. Drafting is best effort: a request gets no drafts when the
    pool is short of blocks, its context exceeds the draft model's, or a token id lies outside
    the draft model's embedding.
    """

    def __init__(self, model: CausalLM, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 target_vocab: int, num_blocks: int, block_size: int, ctx_size: int, max_batch_tokens: int,
                 parallel: int = 1, cuda_graphs: bool = False):
        self.cfg = cfg
        self.vocab = min(cfg.vocab_size, target_vocab)
        self.ctx_size = min(ctx_size, cfg.max_position_embeddings)
        self.max_batch_tokens = max_batch_tokens
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        # Drafting steps are one token per sequence and catching up after a verification is at most
        # draft_max + 1 tokens: on CUDA both replay graphs.
        self.runner = ModelRunner(model, cfg, device, dtype, num_blocks, block_size, self.ctx_size, parallel,
                                  cuda_graphs)
        self.proxies: dict[Sequence, Sequence] = {}  # target sequence -> its draft-side proxy

    def release(self, seq: Sequence) -> None:
        """Free the draft-side blocks of a finished, aborted or failed request."""
        proxy = self.proxies.pop(seq, None)
        if proxy is not None:
            self.blocks.free_sequence(proxy)

    def observe(self, plan, out, computed) -> None:
        """Nothing: proposing re-syncs each proxy with its target's tokens."""

    def needs_hidden(self, plan, drafting: bool) -> bool:
        """Never: the draft model runs on tokens alone."""
        return False

    def propose(self, chosen: list[tuple[Sequence, int]]) -> Proposals:
        """Up to k greedy drafts for each (target sequence, k); drafting never fails a request."""
        try:
            return self._propose(chosen)
        except Exception:
            log.exception("draft model failed; dropping its state for this step's requests")
            for seq, _ in chosen:
                self.release(seq)
            return []

    def _propose(self, chosen: list[tuple[Sequence, int]]) -> Proposals:
        todo = []
        for seq, k in chosen:
            k = min(k, self.ctx_size + 1 - seq.num_tokens)
            proxy = self._sync(seq, k) if k > 0 else None
            if proxy is not None:
                todo.append((seq, proxy, k))
        if not todo:
            return []
        # Catch up on the target's new tokens (chunked under the token budget); the last chunk gives draft 1.
        first: dict[Sequence, int] = {}
        behind = [proxy for _, proxy, _ in todo]
        while behind:
            plan, budget = [], self.max_batch_tokens
            for proxy in behind:
                if budget == 0:
                    break
                n = min(proxy.num_uncomputed, budget)
                plan.append((proxy, n))
                budget -= n
            first.update(self._forward(plan))
            behind = [proxy for proxy in behind if proxy.num_uncomputed]
        drafts = {proxy: [first[proxy]] for _, proxy, _ in todo}
        for depth in range(1, max(k for _, _, k in todo)):
            active = [proxy for _, proxy, k in todo if k > depth]
            for proxy in active:
                proxy.token_ids.append(drafts[proxy][-1])
            for proxy, token in self._forward([(proxy, 1) for proxy in active]).items():
                drafts[proxy].append(token)
        for proxy in drafts:
            # Drafts 1..k-1 now have K/V here; the last one has none (recomputed or rolled back next time).
            proxy.num_draft = len(drafts[proxy]) - 1
        return [(seq, drafts[proxy]) for seq, proxy, _ in todo]

    def _sync(self, seq: Sequence, k: int) -> Sequence | None:
        """Roll seq's proxy back to its common prefix with seq's tokens, then give it the rest of
        them and blocks for k - 1 drafts; None (proxy left consistent) when it cannot draft now."""
        proxy = self.proxies.get(seq)
        if proxy is None:
            proxy = self.proxies[seq] = Sequence(seq.request_id, [], seq.params, self.ctx_size, 0)
        tokens = seq.token_ids
        # The proxy's tokens before its own drafts were copied from seq's and are final there.
        same = len(proxy.token_ids) - proxy.num_draft
        while same < min(proxy.num_computed_tokens, len(tokens)) and proxy.token_ids[same] == tokens[same]:
            same += 1
        same = min(same, proxy.num_computed_tokens, len(tokens) - 1)  # always feed one token, for its logits
        del proxy.token_ids[same:]
        proxy.num_computed_tokens, proxy.num_draft = same, 0
        new = tokens[same:]
        if max(new) >= self.cfg.vocab_size:  # an id only the target's (padded) embedding has
            return None
        need = len(tokens) + k - 1
        if not self.blocks.can_grow(proxy, need):
            self._evict_idle()
            if not self.blocks.can_grow(proxy, need):
                return None
        self.blocks.grow(proxy, need)
        proxy.token_ids.extend(new)
        return proxy

    def _evict_idle(self) -> None:
        """Free the proxies of preempted requests: they are rebuilt when those run again."""
        for seq in [s for s in self.proxies if s.status is not SequenceStatus.RUNNING]:
            self.release(seq)

    def _forward(self, plan: list[tuple[Sequence, int]]) -> dict[Sequence, int]:
        """One batched forward over (proxy, tokens to compute); the greedy next token of every
        proxy whose tokens are then all computed."""
        plan = sorted(plan, key=lambda entry: entry[1] > 1)  # the attention metadata wants decodes first
        out = self.runner.run(plan)
        guesses = out.logits[:, :self.vocab].argmax(dim=-1).tolist()
        for proxy, n in plan:
            proxy.num_computed_tokens += n
        return {proxy: guesses[row] for proxy, row, _ in out.rows}
