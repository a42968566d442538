"""Runs one scheduled step as a single packed forward over the paged KV cache."""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

import torch

from onebit.engine.cuda_graphs import LADDER, CudaGraphDecoder, ladder_for
from onebit.engine.feed import Feed, make_feed
from onebit.engine.sampling_params import SamplingParams
from onebit.engine.sequence import Sequence
from onebit.engine.transfer import upload
from onebit.engine import calibration_cache
from onebit.kernels import batch_invariant, fp8, gemv, ops, pdl
from onebit.kernels.attention import AttentionMetadata, triton_decode, triton_prefill_flash
from onebit.models.config import ModelConfig
from onebit.models.fp8_checkpoint import fp8_block_layers
from onebit.models.quantize import fed_layers, fp8_layers
from onebit.models.rope import rope_cos_sin
from onebit.models.transformer import CausalLM


log = logging.getLogger("onebit.engine")

# A chunk of up to this many tokens (a short prompt, a prompt's tail, a verification) runs as
# graph rows: each row re-reads its context, which costs little at this size and saves the
# eager step's launch overhead, so a decode batch that a new prompt joins stays a graph replay.
GRAPH_CHUNK_TOKENS = 128
# Every FP8 run of session 34 whose engine timed its products in-process decoded B=64 / 256 10-20% under the
# runs that restored the same choices from the calibration cache (5 of 5; perf.md item 6). One candidate
# cause is where the graphs' memory lands after the timing's weight copies and thousands of captured
# graphs; with this on, a start-up that timed hands the allocator's cached memory back before the capture.
# Off until measured.
RELEASE_CALIBRATION_MEMORY = False


def pick_num_splits(ctx_size: int) -> int:
    """Context splits of the GPU decode kernel (1 when the torch reference runs)."""
    return triton_decode.pick_num_splits(ctx_size) if triton_decode is not None else 1


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one cache block takes across all layers, K and V."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * elem


@dataclass
class StepOutput:
    """A forward's results: logits rows, which sequence owns which rows (seq, first row, count),
    the pre-norm hidden states of the packed tokens when asked, and each plan entry's first
    packed token."""

    logits: torch.Tensor
    rows: list[tuple[Sequence, int, int]]
    hidden: torch.Tensor | None
    starts: list[int]


class ModelRunner:
    """Owns the KV cache tensor and turns a step plan into logits.

    On CUDA, steps whose sequences each bring at most `max_graph_chunk` tokens (decodes,
    verifications, short prompt chunks) and fit the largest captured row count replay graphs;
    others run eagerly. With `triton_gemv` (half precision on CUDA), the products of the graphs' row
    counts use a Triton kernel (up to 128 rows) or cuBLASLt for the weight shapes where one measured
    faster than cuBLAS at start-up (`gemv.calibrate`).
    """

    def __init__(self, model: CausalLM, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 num_blocks: int, block_size: int, ctx_size: int, parallel: int = 1,
                 cuda_graphs: bool = True, mtp=None, max_graph_chunk: int = GRAPH_CHUNK_TOKENS,
                 triton_gemv: bool = True, deterministic: bool = False, kv_dtype: torch.dtype | None = None):
        self.model = model
        self.deterministic = deterministic  # every forward (and graph capture) in batch_invariant.mode
        self.mtp = mtp
        self.cfg = cfg
        self.device = device
        self.dtype = dtype  # the activations' (a prefill's queries)
        self.parallel = parallel
        self.block_size = block_size
        # One block past the pool is scratch: padded rows of a graph replay write there.
        # With an MTP head, one more layer of cache holds its entries.
        layers = cfg.num_layers + (1 if mtp is not None else 0)
        # kv_dtype e4m3: the attention layers carry their scales (`engine.kv_calibration`).
        self.kv_cache = torch.zeros(2, layers, num_blocks + 1, block_size, cfg.num_kv_heads,
                                    cfg.head_dim, dtype=kv_dtype or dtype, device=device)
        self.rope = rope_cos_sin(cfg, ctx_size, device)
        self.num_splits = pick_num_splits(ctx_size)
        self.ctx_size = ctx_size
        self.graphs: CudaGraphDecoder | None = None
        self.max_graph_chunk = max_graph_chunk
        self.graph_steps = self.graph_rows = self.eager_steps = 0  # for the engine's step summary
        self.gemv_report: list[str] = []  # the products' calibration lines, for logs and benchmarks
        # seconds of each CUDA start-up phase (calibration, graph capture, eager warm-up), for logs and benches
        self.startup_s: dict[str, float] = {}
        # "timed" or "cache" (`calibration_cache`) after a CUDA start-up; "none" elsewhere
        self.calibration_source = "none"
        if device.type == "cuda":
            self._start_on_cuda(num_blocks, calibrate_bf16=triton_gemv, cuda_graphs=cuda_graphs)

    def _start_on_cuda(self, num_blocks: int, calibrate_bf16: bool, cuda_graphs: bool) -> None:
        """The CUDA start-up, each phase timed into `startup_s`: the products' calibrations (before the
        capture, so that each graph records whichever product won for its row count), the graphs'
        capture, the eager warm-up."""
        model = self.model
        rows = max(self.parallel, min(self.parallel * self.max_graph_chunk, LADDER[-1]))  # the graphs' largest step
        started = time.perf_counter()
        folder = calibration_cache.default_dir()
        inputs = self._calibration_inputs(ladder_for(rows), calibrate_bf16)
        key = calibration_cache.cache_key(calibration_cache.environment(self.device), inputs)
        self.gemv_report, source = calibration_cache.calibrate_or_restore(
            folder, key, lambda: self._calibrate(ladder_for(rows), calibrate_bf16),
            lambda: {"gemv": gemv.chosen_state(), "fp8": fp8.chosen_state()},
            lambda state: (gemv.restore_chosen(state["gemv"]), fp8.restore_chosen(state["fp8"])))
        for line in self.gemv_report:
            log.info(line)
        if source == "cache":
            log.info("the products' choices come from the calibration cache %s (%s=off times them again)",
                     folder / f"{key}.json", calibration_cache.ENV)
        self.calibration_source = source
        if RELEASE_CALIBRATION_MEMORY and source == "timed":
            gc.collect()
            torch.cuda.empty_cache()  # the timing's weight copies and graph pools go back to the device
        self.startup_s["calibration"] = time.perf_counter() - started
        started = time.perf_counter()
        if cuda_graphs:
            self.graphs = CudaGraphDecoder(model, self.kv_cache, self.rope, num_blocks, self.block_size, rows,
                                           -(-self.ctx_size // self.block_size), self.num_splits, self.ctx_size)
            with batch_invariant.mode(self.deterministic):
                self.graphs.capture()
            self.startup_s["graph capture"] = time.perf_counter() - started
            started = time.perf_counter()
        self.warm_up_eager(num_blocks)
        self.startup_s["eager warm-up"] = time.perf_counter() - started
        log.info("start-up on the GPU: %s", ", ".join(f"{phase} {s:.1f} s" for phase, s in self.startup_s.items()))

    def _calibrate(self, ladder: list[int], calibrate_bf16: bool) -> list[str]:
        """Time the products' candidates at the graphs' row counts (`gemv`, `fp8`); the report lines."""
        model, dtype = self.model, self.dtype
        lines = []
        if calibrate_bf16 and dtype in (torch.bfloat16, torch.float16):
            # Triton candidates up to gemv.MAX_CALIBRATED_ROWS, cuBLASLt at every graph size
            lines += gemv.calibrate(model.linear_weights(), ladder)
        quantized = fp8_layers(model)
        if quantized:  # --quantize fp8: its kernel per row count
            lines += fp8.calibrate(quantized, [b for b in ladder if b <= fp8.MAX_CALIBRATED_ROWS], dtype,
                                   fed_layers(model))
        blocked = fp8_block_layers(model)
        if blocked:  # a block-scaled FP8 checkpoint: its kernel per row count
            lines += fp8.calibrate_blocks(blocked, [b for b in ladder if b <= fp8.MAX_WEIGHT_ONLY_ROWS], dtype)
        return lines

    def _calibration_inputs(self, ladder: list[int], calibrate_bf16: bool) -> dict:
        """What `_calibrate` times, as JSON values, for the calibration cache's key: the products'
        shapes and dtypes, the producers' forms, the row counts, and the module switches that change
        the candidates or how they are timed."""
        def shapes(layers: dict) -> list:
            return sorted({json_shape(v) for v in layers.values()})

        def json_shape(value: tuple) -> str:
            return " ".join(f"{tuple(t.shape)}:{t.dtype}" if isinstance(t, torch.Tensor) else repr(t) for t in value)

        model = self.model
        quantized = fp8_layers(model)
        return {"dtype": str(self.dtype), "rows": ladder, "bf16": calibrate_bf16,
                "linear": shapes(model.linear_weights()), "fp8": shapes(quantized),
                "fed": sorted({f"{json_shape(quantized[name])} {form}" for name, form in fed_layers(model).items()}),
                "fp8_blocks": shapes(fp8_block_layers(model)),
                "switches": {"fp8.FAST": fp8.FAST, "fp8.FUSE_QUANT": fp8.FUSE_QUANT, "fp8.BLOCK_FORM": fp8.BLOCK_FORM,
                             "pdl": bool(pdl.options())}}

    @torch.inference_mode()
    def warm_up_eager(self, scratch_block: int) -> None:
        """Run a few eager steps in the scratch block so that the eager path's Triton kernels
        compile now: on first use they stalled a serving step for 0.5-1.4 s on the H200. Triton
        compiles a variant per integer argument that is 1 or divisible by 16, so the lengths mix
        both kinds (a 128-token prompt is one)."""
        steps = [[16, 128], [1, 37, 3 * GRAPH_CHUNK_TOKENS + 7], [1, 16, 127]]
        # The decode kernel's split count follows the step's decode rows (adaptive splits): one
        # step per count the eager path can meet, each a kernel variant of its own (G21, session
        # 11: a first mixed step with 10 decodes compiled NUM_SPLITS=4 for 0.6 s while serving).
        steps += [[1] * rows + [GRAPH_CHUNK_TOKENS] for rows in self._decode_rows_per_split_count()]
        # The fused q/k/v write takes more heads a program as a step's tokens grow: one step per variant.
        cfg = self.cfg
        steps += [[n] for n in ops.fused_write_warm_up_tokens(cfg.num_heads + 2 * cfg.num_kv_heads, self.device)]
        for lens in steps:
            with batch_invariant.mode(self.deterministic):
                self._eager_scratch_step([n for n in lens if n < self.ctx_size], scratch_block)
        for dtype in {self.dtype, torch.float32}:  # the sampler's argmax, of the logits as they come or edited
            ops.argmax_rows(torch.zeros((1, cfg.vocab_size), dtype=dtype, device=self.device))
        if not self.deterministic:
            self._warm_up_flash_launches(scratch_block)

    def _warm_up_flash_launches(self, scratch_block: int) -> None:
        """Compile the flash prefill kernel's launch for many programs (long prompts: 4 warps), which
        the warm-up's short prompts never choose, on a 16-token query over the scratch block (it only
        reads the cache)."""
        if triton_prefill_flash is None or not triton_prefill_flash.enabled:
            return
        cfg, n = self.cfg, 16
        q = torch.zeros(n, cfg.num_heads, cfg.head_dim, dtype=self.dtype, device=self.device)
        k_cache, v_cache = self.kv_cache[0, 0], self.kv_cache[1, 0]
        tables = torch.full((1, -(-n // self.block_size)), scratch_block, dtype=torch.long, device=self.device)
        ones = torch.ones(cfg.num_kv_heads, dtype=torch.float32, device=self.device)  # e4m3 caches' scales
        triton_prefill_flash.paged_prefill_attention(q, k_cache, v_cache, [0], [n], [n], tables, 1.0,
                                                     k_scale=ones, v_scale=ones,
                                                     launch=triton_prefill_flash.MANY_PROGRAMS_LAUNCH)

    def _decode_rows_per_split_count(self) -> list[int]:
        """For each split count the decode kernel chooses over 1..parallel decode rows, the
        fewest rows that choose it (none where splits are fixed or the kernel is not in use)."""
        if triton_decode is None or not triton_decode.adaptive_splits or self.device.type != "cuda":
            return []
        return triton_decode.rows_per_split_count(self.parallel, self.cfg.num_kv_heads, self.ctx_size,
                                                  triton_decode.sm_count(self.device))

    def _eager_scratch_step(self, lens: list[int], scratch_block: int) -> None:
        # Stand-in sequences whose every block is the scratch block; one-token ones are decodes,
        # which the packed step wants first.
        plan = []
        for n in sorted(lens, key=lambda n: n > 1):
            seq = Sequence("warm-up", [i % self.cfg.vocab_size for i in range(n)], SamplingParams(), n, 0)
            seq.block_table = [scratch_block] * -(-n // self.block_size)
            plan.append((seq, n))
        ids, positions, meta = self.prepare(plan)
        normed = self.model(ids, positions, self.kv_cache, meta, self.rope)
        self.model.compute_logits(normed[-1:])

    def _graph_rows(self, plan: list[tuple[Sequence, int]]):
        """One row per packed token: (ids, positions, slots, block tables, context lengths)."""
        bs = self.block_size
        ids, positions, slots, tables, lens = [], [], [], [], []
        for seq, n in plan:
            start = seq.num_computed_tokens
            table = seq.block_table
            for p in range(start, start + n):
                ids.append(seq.token_ids[p])
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
                tables.append(table)
                lens.append(p + 1)
        return ids, positions, slots, tables, lens

    def _use_graph(self, plan: list[tuple[Sequence, int]]) -> bool:
        # A chunk of n tokens costs n reads of its context as rows, so only short ones
        # (decodes, verifications, the tail of a prompt) go through the graphs.
        return (self.graphs is not None and all(n <= self.max_graph_chunk for _, n in plan)
                and self.graphs.can_run(sum(n for _, n in plan)))

    @staticmethod
    def _logit_rows(plan: list[tuple[Sequence, int]]):
        """Which packed tokens produce logits: every position of a verifying sequence, the last
        token of one whose tokens are then all computed. Returns StepOutput's rows, the packed
        indices of those tokens, and each plan entry's first packed token."""
        rows, sample_rows, starts, start = [], [], [], 0
        for seq, n in plan:
            count = n if seq.num_draft else int(seq.num_computed_tokens + n == seq.num_tokens)
            if count:
                rows.append((seq, len(sample_rows), count))
                sample_rows.extend(range(start + n - count, start + n))
            starts.append(start)
            start += n
        return rows, sample_rows, starts

    def _feed(self, plan: list[tuple[Sequence, int]], fed_tokens: torch.Tensor | None) -> Feed | None:
        """The ids of the sequences whose last token is a placeholder for one the previous step
        sampled (`fed_tokens`, on the device), for their packed rows; None when there are none."""
        if fed_tokens is None:
            return None
        dst, src, start = [], [], 0
        for seq, n in plan:
            if seq.fed_row is not None:  # the placeholder is the last token, computed in this chunk
                dst.append(start + n - 1)
                src.append(seq.fed_row)
            start += n
        return make_feed(dst, src, fed_tokens)

    def _run_graph(self, plan: list[tuple[Sequence, int]], want_hidden: bool, feed) -> StepOutput:
        rows, sample_rows, starts = self._logit_rows(plan)
        logits, prenorm = self.graphs.run(*self._graph_rows(plan), feed=feed)
        if len(sample_rows) != logits.shape[0]:
            logits = logits[self._tensor(sample_rows)]
        return StepOutput(logits, rows, prenorm if want_hidden else None, starts)

    def _table(self, tables: list[list[int]]) -> torch.Tensor | None:
        """Block tables padded to one width, as a [rows, width] tensor on the device."""
        if not tables:
            return None
        width = max(len(t) for t in tables)
        return self._tensor([x for t in tables for x in t + [0] * (width - len(t))]).view(len(tables), width)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return upload(values, torch.long, self.device)

    def prepare(self, plan: list[tuple[Sequence, int]]):
        """Packed input ids, positions and attention metadata for an eager forward."""
        ids, positions, slots = [], [], []
        decode_tables, decode_lens, prefills, prefill_tables = [], [], [], []
        bs = self.block_size
        for seq, n in plan:
            start = seq.num_computed_tokens
            query_start = len(ids)
            ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if n == 1:
                decode_tables.append(table)
                decode_lens.append(start + 1)
            else:
                prefills.append((query_start, n, start + n))
                prefill_tables.append(table)
        decode_ctx = self._tensor(decode_lens) if decode_tables else None
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots), num_decodes=len(decode_tables),
            decode_block_tables=self._table(decode_tables), decode_context_lens=decode_ctx, prefills=prefills,
            prefill_block_tables=self._table(prefill_tables), decode_num_splits=self.num_splits,
            decode_max_context=self.ctx_size)
        return self._tensor(ids), self._tensor(positions), meta

    @torch.inference_mode()
    def final_norm(self, prenorm: torch.Tensor) -> torch.Tensor:
        """The model's final norm of pre-norm hidden states (what the logits are computed from)."""
        return self.model.norm(prenorm)

    @torch.inference_mode()
    def run(self, plan: list[tuple[Sequence, int]], want_hidden: bool = False,
            fed_tokens: torch.Tensor | None = None) -> StepOutput:
        """Forward the step: logits for every sequence that samples (all positions of a
        verifying one), and with want_hidden the pre-norm states of every packed token.
        A sequence with a placeholder last token (`fed_row`) reads it from `fed_tokens`, the
        previous step's sampled ids on the device, so the host never waits for them."""
        with batch_invariant.mode(self.deterministic):
            return self._run(plan, want_hidden, fed_tokens)

    def _run(self, plan: list[tuple[Sequence, int]], want_hidden: bool, fed_tokens: torch.Tensor | None):
        feed = self._feed(plan, fed_tokens)
        if self._use_graph(plan):
            self.graph_steps += 1
            self.graph_rows += sum(n for _, n in plan)
            return self._run_graph(plan, want_hidden, feed)
        self.eager_steps += 1
        rows, sample_rows, starts = self._logit_rows(plan)
        ids, positions, meta = self.prepare(plan)
        if feed is not None:
            feed.write_into(ids)
        normed, prenorm = self.model(ids, positions, self.kv_cache, meta, self.rope, return_prenorm=True)
        logits = (self.model.compute_logits(normed[self._tensor(sample_rows)]) if sample_rows
                  else normed.new_empty((0, self.cfg.vocab_size)))
        return StepOutput(logits, rows, prenorm if want_hidden else None, starts)

    @torch.inference_mode()
    def mtp_forward(self, entries: list[tuple[Sequence, int, list[int], torch.Tensor]]):
        """Run MTP entries: per sequence (seq, first entry t0, tokens t0+1.., hidden states [m, H]).
        Entry t writes the MTP cache at position t, rotated as position t + 1. Returns
        (pre-norm outputs, normed outputs), one row per entry, in order."""
        bs = self.block_size
        ids, rope_pos, slots, prefills, tables, hidden = [], [], [], [], [], []
        for seq, t0, tokens, states in entries:
            m = len(tokens)
            prefills.append((len(ids), m, t0 + m))
            tables.append(seq.block_table)
            ids.extend(tokens)
            rope_pos.extend(range(t0 + 1, t0 + m + 1))
            slots.extend(seq.block_table[t // bs] * bs + t % bs for t in range(t0, t0 + m))
            hidden.append(states)
        meta = AttentionMetadata(slot_mapping=self._tensor(slots), num_decodes=0, decode_block_tables=None,
                                 decode_context_lens=None, prefills=prefills,
                                 prefill_block_tables=self._table(tables), decode_num_splits=self.num_splits,
                                 decode_max_context=self.ctx_size)
        layer = self.cfg.num_layers
        with batch_invariant.mode(self.deterministic):
            return self.mtp(self.model, self._tensor(ids), torch.cat(hidden), self._tensor(rope_pos),
                            self.kv_cache[0, layer], self.kv_cache[1, layer], meta, self.rope)
