"""The final checks of a run on the exported model: greedy completions of the plain code prompts
and the chat request (evaluation.py's rules), tokenized and rendered by 1bit's own tokenizer class
from the written model directory, exactly as `1bit serve` does."""

from __future__ import annotations

from pathlib import Path

import torch

from onebit.models.tokenizer import Tokenizer as ServingTokenizer
from tools.demo_training.evaluation import CHAT_REQUEST, CODE_PROMPTS, chat_has_function, parse_completion
from tools.demo_training.model import DemoModel


@torch.no_grad()
def greedy_ids(model: DemoModel, ids: list[int], max_new: int, stop_ids: set[int],
               device: torch.device) -> tuple[list[int], bool]:
    """Greedy continuation of one prompt by the base model (full forward per token); returns the
    new ids without the stop token and whether a stop token ended it."""
    seq = torch.tensor([ids], device=device)
    out: list[int] = []
    for _ in range(max_new):
        nxt = int(model.logits(model.base(seq)[:, -1]).argmax(-1))
        if nxt in stop_ids:
            return out, True
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([[nxt]], device=device)], dim=1)
    return out, False


def generation_checks(model: DemoModel, model_dir: Path, code_tokens: int, chat_tokens: int,
                      device: torch.device) -> dict:
    """Greedy completions of CODE_PROMPTS (`code_tokens` each) and of the chat request (at most
    `chat_tokens`), judged by the parse rule; the texts are kept for the card and the log."""
    model.eval()
    tok = ServingTokenizer.from_dir(model_dir)
    stop = set(tok.eos_token_ids)  # what the server stops at: eos and generation_config's eos ids
    code = []
    for prompt in CODE_PROMPTS:
        ids, finished = greedy_ids(model, tok.encode(prompt, add_special_tokens=True), code_tokens, stop, device)
        completion = tok.decode(ids)
        result = parse_completion(prompt, completion, finished)
        code.append({"prompt": prompt, "completion": completion, "finished": finished,
                     "parses_whole": result.whole, "parses_to_top_level": result.top_level, "parses": result.ok})
    _, prompt_ids = tok.chat_prompt_ids([{"role": "user", "content": CHAT_REQUEST}], add_generation_prompt=True)
    ids, finished = greedy_ids(model, prompt_ids, chat_tokens, stop, device)
    answer = tok.decode(ids)
    ok, judged = chat_has_function(answer, finished)
    return {"code_prompts": code, "code_parsed": sum(c["parses"] for c in code), "code_total": len(code),
            "chat": {"request": CHAT_REQUEST, "answer": answer, "finished": finished, "has_parsing_def": ok,
                     "code_judged": judged}}
