"""The training loop: AdamW with warm-up and cosine decay, base + MTP loss, a wall-clock budget and
an epoch cap, and the best checkpoint by validation loss kept in memory."""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from tools.demo_training.model import DemoModel
from tools.demo_training.settings import MTP_LOSS_WEIGHT, Settings, log

def lr_at(step: int, total: int, settings: Settings) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr at step `total`."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = min(1.0, (step - settings.warmup_steps) / max(1, total - settings.warmup_steps))
    floor = settings.min_lr_ratio
    return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: DemoModel, settings: Settings, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on norm weights)."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8, **extra)


def autocast(device: torch.device):
    """bf16 autocast on the GPU; plain float32 on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(model: DemoModel, windows: torch.Tensor, batch: int, device: torch.device) -> tuple[float, float]:
    """Mean (base, MTP) validation loss per token over the fixed held-out windows."""
    was_training = model.training
    model.eval()
    base_sum = mtp_sum = 0.0
    for start in range(0, len(windows), batch):
        part = windows[start:start + batch]
        with autocast(device):
            base, mtp = model.losses(part)
        base_sum += base.item() * len(part)
        mtp_sum += mtp.item() * len(part)
    model.train(was_training)
    return base_sum / len(windows), mtp_sum / len(windows)


class StepFunction:
    """The loss forward, compiled with torch.compile when asked; any compile failure falls back to eager."""

    def __init__(self, model: DemoModel, compile_it: bool):
        self.eager = model.losses
        self.compiled = None
        if compile_it:
            try:
                self.compiled = torch.compile(model.losses, dynamic=False)
            except Exception as exc:  # noqa: BLE001 - any failure means "run eager"
                log(f"torch.compile unavailable ({type(exc).__name__}: {exc}); running eager")

    @property
    def mode(self) -> str:
        """'compiled' or 'eager'."""
        return "compiled" if self.compiled is not None else "eager"

    def give_up_compile(self, exc: BaseException) -> None:
        """Switch to eager for the rest of the run."""
        log(f"torch.compile failed ({type(exc).__name__}: {str(exc)[:300]}); falling back to eager")
        self.compiled = None

    def __call__(self, window: torch.Tensor):
        return (self.compiled or self.eager)(window)


class EpochSampler:
    """Batches of non-overlapping training windows, each window once per epoch in a shuffled order.

    Epoch e cuts the stream into windows of seq_len + 1 tokens starting at offset
    (e * span / 2) mod span, so a second pass sees the same text cut at other places. A batch
    never straddles two epochs (the last partial batch of an epoch is skipped).
    """

    def __init__(self, tokens: torch.Tensor, span: int, seed: int):
        self.tokens, self.span = tokens, span
        self.gen = torch.Generator(device=tokens.device).manual_seed(seed)
        self.windows_per_epoch = max(0, (len(tokens) - span // 2) // span)
        self.epoch, self.position, self.order = -1, 0, None
        self.offsets = torch.arange(span, device=tokens.device)

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.position = 0
        self.order = torch.randperm(self.windows_per_epoch, device=self.tokens.device, generator=self.gen)

    def batch(self, size: int) -> torch.Tensor:
        """The next `size` windows, [size, span], int64."""
        if self.order is None or self.position + size > self.windows_per_epoch:
            self._next_epoch()
        picked = self.order[self.position:self.position + size]
        self.position += size
        start = (self.epoch * self.span // 2) % self.span
        return self.tokens[start + picked[:, None] * self.span + self.offsets].long()

    def epochs_done(self, steps: int, size: int) -> float:
        """Passes over the training tokens after `steps` batches of `size`."""
        return steps * size / max(1, self.windows_per_epoch)


def steps_for_epochs(windows_per_epoch: int, batch: int, epochs: float) -> int:
    """How many steps of `batch` windows make `epochs` passes (whole batches per epoch)."""
    per_epoch = windows_per_epoch // batch
    return max(1, int(per_epoch * epochs))


class BestCheckpoint:
    """The model state with the lowest validation objective so far (base + MTP weight x MTP loss),
    copied on the training device; `restore` puts it back into the model."""

    def __init__(self):
        self.score = math.inf
        self.step = -1
        self.state: dict[str, torch.Tensor] | None = None
        self.record: dict = {}

    def offer(self, model: DemoModel, step: int, base: float, mtp: float) -> bool:
        """Keep the model's current state if its objective is the best so far; True when kept."""
        score = base + MTP_LOSS_WEIGHT * mtp
        if not score < self.score:
            return False
        self.score, self.step = score, step
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.record = {"step": step, "val_loss": round(base, 4), "val_mtp_loss": round(mtp, 4),
                       "objective": round(score, 4)}
        return True

    def restore(self, model: DemoModel) -> None:
        """Load the kept state into `model` (no-op when nothing was kept)."""
        if self.state is not None:
            model.load_state_dict(self.state)


def train(model: DemoModel, train_tokens: torch.Tensor, val_windows: torch.Tensor, settings: Settings,
          device: torch.device, seed: int, budget_s: float, compile_it: bool,
          on_best: Callable[[DemoModel, dict], None] | None = None) -> dict:
    """Train for `budget_s` seconds, settings.max_steps or settings.max_epochs, whichever ends first;
    validate every val_every_s (or val_every_steps) and at the end, keep the best state (by the
    validation objective) and leave it loaded in `model`. `on_best(model, record)` is called after
    each new best, while the model holds that state. Returns the logged curves and counters."""
    optimizer = make_optimizer(model, settings, device)
    step_fn = StepFunction(model, compile_it)
    span = settings.seq_len + 1
    sampler = EpochSampler(train_tokens, span, seed)
    batch = min(settings.batch_size, max(1, sampler.windows_per_epoch))
    epoch_steps = steps_for_epochs(sampler.windows_per_epoch, batch, settings.max_epochs)
    # re-estimated from the measured step time when only the clock limits the run
    total_steps = min(settings.max_steps or 10**9, epoch_steps)
    best = BestCheckpoint()
    train_curve, val_curve = [], []
    tokens_seen, step = 0, 0
    acc_base = torch.zeros((), device=device)
    acc_mtp = torch.zeros((), device=device)
    acc_n = 0
    start = time.time()
    last_log = last_val = start
    timing_from: tuple[int, float] | None = None
    model.train()

    def do_val(now: float) -> None:
        base, mtp = evaluate(model, val_windows, settings.batch_size, device)
        val_curve.append({"step": step, "tokens": tokens_seen, "seconds": round(now - start, 1),
                          "val_loss": round(base, 4), "val_mtp_loss": round(mtp, 4)})
        kept = step > 0 and best.offer(model, step, base, mtp)
        log(f"  val   step {step:6d} | {(now - start) / 60:5.2f} min | loss {base:.4f} | mtp loss {mtp:.4f}"
            + (" | best so far" if kept else ""))
        if kept and on_best is not None:
            on_best(model, best.record)

    do_val(start)
    while step < total_steps:
        now = time.time()
        if now - start >= budget_s and (settings.max_steps is None or step > 0):
            break
        lr = lr_at(step, total_steps, settings)
        for group in optimizer.param_groups:
            group["lr"] = lr
        window = sampler.batch(batch)
        optimizer.zero_grad(set_to_none=True)
        try:
            with autocast(device):
                base, mtp = step_fn(window)
            (base + MTP_LOSS_WEIGHT * mtp).backward()
        except torch.cuda.OutOfMemoryError:
            if batch <= 1:
                raise
            batch //= 2
            total_steps = step + 2 * (total_steps - step)  # the same tokens in smaller batches
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            log(f"out of memory: batch size now {batch}")
            continue
        except Exception as exc:  # noqa: BLE001 - a compiled graph that fails runs eager instead
            if step_fn.compiled is None:
                raise
            step_fn.give_up_compile(exc)
            optimizer.zero_grad(set_to_none=True)
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += batch * settings.seq_len
        acc_base += base.detach()
        acc_mtp += mtp.detach()
        acc_n += 1

        if settings.max_steps is None:
            # Steps 1-10 include compilation; time steps 10-40 and size the cosine schedule so it
            # ends with the budget (5% kept for validation passes).
            if step == 10:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                timing_from = (step, time.time())
            elif step == 40 and timing_from is not None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                per_step = (time.time() - timing_from[1]) / (step - timing_from[0])
                left = budget_s - (time.time() - start)
                by_clock = step + max(1, int(0.95 * left / per_step))
                total_steps = min(by_clock, epoch_steps)
                log(f"  {per_step * 1000:.1f} ms/step ({step_fn.mode}, batch {batch}): schedule set to "
                    f"{total_steps} steps ({'the clock' if by_clock < epoch_steps else f'{settings.max_epochs:g} epochs'}"
                    f" limits; {sampler.windows_per_epoch * span / 1e6:.1f}M tokens per epoch)")

        now = time.time()
        log_due = (step % settings.log_every_steps == 0) if settings.log_every_steps else now - last_log >= settings.log_every_s
        if log_due or step == 1:
            base_avg, mtp_avg = (acc_base / acc_n).item(), (acc_mtp / acc_n).item()
            elapsed = now - start
            train_curve.append({"step": step, "tokens": tokens_seen, "seconds": round(elapsed, 1),
                                "train_loss": round(base_avg, 4), "train_mtp_loss": round(mtp_avg, 4),
                                "lr": lr})
            log(f"  train step {step:6d} | {elapsed / 60:5.2f} min | loss {base_avg:.4f} | mtp loss {mtp_avg:.4f}"
                f" | lr {lr:.2e} | {tokens_seen / 1e6:7.1f}M tokens | {tokens_seen / max(elapsed, 1e-9) / 1e3:6.0f}k tok/s")
            acc_base.zero_()
            acc_mtp.zero_()
            acc_n = 0
            last_log = now
        val_due = (step % settings.val_every_steps == 0) if settings.val_every_steps else now - last_val >= settings.val_every_s
        if val_due and step < total_steps:
            do_val(now)
            last_val = time.time()

    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = round(time.time() - start, 1)
    if not val_curve or val_curve[-1]["step"] != step:
        do_val(time.time())
    best.restore(model)
    log(f"  best checkpoint: step {best.step} of {step} (validation objective {best.score:.4f})")
    return {"train_curve": train_curve, "val_curve": val_curve, "steps": step, "tokens_seen": tokens_seen,
            "train_seconds": train_seconds, "batch_size": batch, "step_mode": step_fn.mode,
            "scheduled_steps": total_steps, "epochs": round(sampler.epochs_done(step, batch), 3),
            "tokens_per_epoch": sampler.windows_per_epoch * span, "best": best.record}
