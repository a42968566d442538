"""How well the MTP head drafts: simulated greedy speculative decoding on held-out prompts, and
top-1 agreement with the true prefix."""

from __future__ import annotations

import torch

from tools.demo_training.model import DemoModel
from tools.demo_training.settings import Settings
from tools.demo_training.training import autocast

@torch.no_grad()
def greedy_continue(model: DemoModel, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of every prompt by the base model (full forward each step, float32)."""
    seq = prompts
    for _ in range(new_tokens):
        hidden = model.base(seq)
        nxt = model.logits(hidden[:, -1]).argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


@torch.no_grad()
def speculative_acceptance(model: DemoModel, seq: torch.Tensor, prompt_len: int, drafts: int) -> dict:
    """Simulate greedy speculative decoding of `seq` (a prompt + its greedy continuation) with the MTP head.

    With tokens up to c known and base hidden states up to c-1: draft 1 = argmax MTP(h_{c-1},
    token c); draft j+1 = argmax MTP(previous MTP output, draft j) at the next position. The
    base model's greedy tokens are `seq` itself, so a verify step accepts the longest matching
    prefix of the drafts, and decoding moves on by (accepted + 1) tokens.
    """
    hidden = model.base(seq[None])
    known = prompt_len
    steps = accepted = 0
    depth_tries = [0] * drafts
    depth_hits = [0] * drafts
    while known + drafts < len(seq):
        h = hidden[:, :known]
        toks = seq[1:known + 1][None]
        proposal = []
        for _ in range(drafts):
            out = model.mtp_hidden(h, toks)
            token = model.mtp_logits(out[:, -1]).argmax(-1)
            proposal.append(int(token))
            h = torch.cat([h, out[:, -1:]], dim=1)
            toks = torch.cat([toks, token[:, None]], dim=1)
        truth = seq[known + 1:known + 1 + drafts].tolist()
        ok = 0
        while ok < drafts and proposal[ok] == truth[ok]:
            ok += 1
        for depth in range(min(ok + 1, drafts)):
            depth_tries[depth] += 1
            depth_hits[depth] += depth < ok
        steps += 1
        accepted += ok
        known += ok + 1
    return {"steps": steps, "accepted": accepted, "depth_tries": depth_tries, "depth_hits": depth_hits}


@torch.no_grad()
def teacher_forced_agreement(model: DemoModel, windows: torch.Tensor, batch: int, device: torch.device) -> dict:
    """Top-1 figures on held-out text with the true prefix: base accuracy (token t+1), MTP accuracy
    (token t+2), and how often the MTP argmax equals the base model's argmax for token t+2."""
    model.eval()
    base_hits = mtp_hits = agree = base_total = mtp_total = 0
    for start in range(0, len(windows), batch):
        part = windows[start:start + batch]
        ids = part[:, :-1]
        with autocast(device):
            hidden = model.base(ids)
            base_pred = model.logits(hidden).argmax(-1)
            mtp_pred = model.mtp_logits(model.mtp_hidden(hidden[:, :-1], ids[:, 1:])).argmax(-1)
        base_hits += int((base_pred == part[:, 1:]).sum())
        mtp_hits += int((mtp_pred == part[:, 2:]).sum())
        agree += int((mtp_pred == base_pred[:, 1:]).sum())
        base_total += base_pred.numel()
        mtp_total += mtp_pred.numel()
    return {"base_top1_accuracy": round(base_hits / base_total, 4),
            "mtp_top1_accuracy": round(mtp_hits / mtp_total, 4),
            "mtp_agrees_with_base": round(agree / mtp_total, 4)}


def measure_acceptance(model: DemoModel, val_tokens: torch.Tensor, settings: Settings, device: torch.device) -> dict:
    """Acceptance at draft lengths 1 and 3 on greedy continuations of held-out prompts."""
    model.eval()
    p, n = settings.accept_prompt_len, settings.accept_prompts
    room = len(val_tokens) - p
    if room <= 0:
        return {}
    starts = [int(i * room / n) for i in range(n)]
    prompts = torch.stack([val_tokens[s:s + p] for s in starts]).long().to(device)
    seqs = greedy_continue(model, prompts, settings.accept_new_tokens)
    result = {"prompts": n, "prompt_tokens": p, "new_tokens": settings.accept_new_tokens}
    for k in (1, 3):
        total = {"steps": 0, "accepted": 0, "depth_tries": [0] * k, "depth_hits": [0] * k}
        for seq in seqs:
            part = speculative_acceptance(model, seq, p, k)
            total["steps"] += part["steps"]
            total["accepted"] += part["accepted"]
            total["depth_tries"] = [a + b for a, b in zip(total["depth_tries"], part["depth_tries"])]
            total["depth_hits"] = [a + b for a, b in zip(total["depth_hits"], part["depth_hits"])]
        steps = max(1, total["steps"])
        result[f"draft_{k}"] = {
            "acceptance_rate": round(total["accepted"] / (k * steps), 4),
            "mean_accepted_per_step": round(total["accepted"] / steps, 4),
            "tokens_per_step": round(1 + total["accepted"] / steps, 4),
            "per_depth_conditional": [round(h / max(1, t), 4) for h, t in zip(total["depth_hits"], total["depth_tries"])],
            "verify_steps": total["steps"],
        }
    return result
