"""The pieces an engine is made of (wired by build.py) and a step queued on the device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from onebit.engine.output_processor import OutputProcessor
from onebit.engine.runner import ModelRunner, StepOutput
from onebit.engine.sampler import SampledBatch, Sampler
from onebit.engine.scheduler import Scheduler
from onebit.engine.sequence import Sequence
from onebit.engine.spec.speculator import Speculator
from onebit.models.config import ModelConfig
from onebit.models.tokenizer import Tokenizer


@dataclass
class EngineParts:
    """Everything `build_engine` loads and sizes, handed to the engine ready to run."""

    model_path: Path
    device: torch.device
    dtype: torch.dtype
    tokenizer: Tokenizer
    model_config: ModelConfig
    eos_token_ids: set[int]
    ctx_size: int  # the longest sequence, after the KV pool's limit
    kv_bytes_per_block: int  # everything one block costs: all layers, MTP layer, draft pool
    scheduler: Scheduler
    runner: ModelRunner
    sampler: Sampler
    speculator: Speculator
    outputs: OutputProcessor
    overlap: bool


@dataclass
class LaunchedStep:
    """A step queued on the device: its plan, forward output, sampled rows and bookkeeping."""

    plan: list[tuple[Sequence, int]]
    out: StepOutput
    plain: list[tuple[Sequence, int]]  # sequences that sample one token, with their row of sampled's tokens
    sampled: SampledBatch | None
    computed: dict  # seq -> (computed tokens before the step, tokens computed in it)
    decodes: int
    drafting: list[Sequence]
    cold: bool = False  # launched with no step in flight although overlap is on
    k: int = 0  # the draft length chosen for it (0: a plain step), even if no drafts came
    mixed: bool = False  # a prompt chunk rode along (its time is not a decode step's alone)

    def can_feed(self) -> bool:
        """Whether the next step may start before this one's tokens reach the host: not when a
        penalty needs them (they count the output so far), nor a grammar (its next mask depends on
        them), nor drafts (verification decides the next tokens): such steps run without overlap."""
        return self.sampled is not None and not self.drafting and not any(
            seq.params.has_penalties or seq.grammar is not None for seq, _ in self.plain)
