"""The `1bit serve` options that llama-server users and OpenAI-style clients expect: model names,
chat template choice, reasoning format, embeddings and CORS."""

from __future__ import annotations

import argparse


def add_dropin_arguments(serve: argparse.ArgumentParser) -> None:
    """The llama-server options clients and scripts expect."""
    serve.add_argument("--alias", action="append", default=None, metavar="NAME",
                       help="model name clients see, repeatable or comma-separated (none: the directory name, "
                            "the GGUF file's name, or the Hugging Face id); with one model served any name "
                            "is accepted")
    serve.add_argument("--chat-template", default=None, metavar="NAME",
                       help="use a built-in chat template instead of the model's: chatml, llama3 or mistral")
    serve.add_argument("--chat-template-file", default=None, metavar="FILE",
                       help="use this jinja chat template instead of the model's (rendered in the sandbox)")
    serve.add_argument("--jinja", action="store_true",
                       help="accepted for llama-server compatibility: chat templates are always jinja here")
    serve.add_argument("--reasoning-format", default="auto", choices=["auto", "none", "deepseek", "deepseek-legacy"],
                       help="none: leave <think> text in the content; otherwise split it into "
                            "reasoning_content (a request's reasoning_format wins)")
    serve.add_argument("--embedding", "--embeddings", action="store_true",
                       help="serve POST /v1/embeddings (prompts pooled by the engine, through the same scheduler)")
    serve.add_argument("--pooling", default=None, choices=["mean", "last", "cls"],
                       help="how embeddings pool the prompt's final states (none: the model's 1_Pooling config, "
                            "else last)")
    serve.add_argument("--cors-origins", default="", metavar="ORIGINS",
                       help="comma-separated origins browsers may call the API from, or * (empty: none)")


def aliases_of(values: list[str] | None) -> list[str]:
    """Every --alias (repeatable, each comma-separated) in order."""
    return [name.strip() for value in values or [] for name in value.split(",") if name.strip()]


def hf_repo_id(path) -> str | None:
    """`org/name` for a snapshot directory of the Hugging Face cache (models--org--name/snapshots/HASH)."""
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith("models--") and "--" in repo[len("models--"):]:
        return repo[len("models--"):].replace("--", "/", 1)
    return None
