"""`1bit bench`: the command-line front of the benchmarks."""

from __future__ import annotations

import argparse


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("values must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    """Arguments of `1bit bench`."""
    p = argparse.ArgumentParser(prog="1bit bench", description="Measure tokens/s by batch size or concurrency.")
    p.add_argument("--offline", action="store_true", help="benchmark the engine alone (no server)")
    p.add_argument("-m", "--model", help="model directory (offline), or the model name to send (online)")
    p.add_argument("--batch", type=_int_list, default=[1, 8, 32, 64], help="offline batch sizes")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark the arguments ask for; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.offline:
        parser.error("only --offline is available so far: the online load generator is issue 5")
    if not args.model:
        from onebit.models.tiny import default_model_dir
        args.model = str(default_model_dir())
    from onebit.bench.offline import run_offline
    run_offline(args.model, args.batch, args.max_tokens, args.prompt_tokens, args.device, args.dtype)
    return 0
