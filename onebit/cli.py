"""The `1bit` command: `1bit serve` runs the server, `1bit bench` measures one."""

from __future__ import annotations

import argparse
import logging
import re
import sys

DEFAULT_PORT = 8000
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """'4G', '512M', '1.5GiB' or a plain number of bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r}")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand but `bench` (which parses its own)."""
    parser = argparse.ArgumentParser(prog="1bit", description="One GPU, many users: an OpenAI-compatible server.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the OpenAI-compatible server")
    serve.add_argument("-m", "--model", help="model directory or cached Hugging Face id (default: built-in)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    serve.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    serve.add_argument("--ctx-size", type=_positive, default=None, help="context size in tokens")
    serve.add_argument("--parallel", type=_positive, default=4, help="slots decoding together")
    serve.add_argument("--kv-cache-memory", type=parse_bytes, default=None, help="KV pool size, e.g. 2G")
    serve.add_argument("--alias", help="model name clients use (default: directory name)")
    serve.add_argument("--api-key", help="require this key on every API route")
    serve.add_argument("--max-queue", type=int, default=1024, help="requests that may wait for a slot")
    serve.add_argument("--max-body-bytes", type=parse_bytes, default=8 * 2**20)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub.add_parser("bench", help="measure tokens/s of a server (see `1bit bench --help`)", add_help=False)
    return parser


def _fail(message: str) -> int:
    print(f"1bit: error: {message}", file=sys.stderr)
    return 1


def serve(args: argparse.Namespace) -> int:
    """Wire model, backend, router and app together, then serve until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from onebit.models.errors import ModelLoadError
    from onebit.models.loader import resolve_model_path

    try:
        if args.model:
            path = resolve_model_path(args.model)
        else:
            from onebit.models.tiny import default_model_dir

            path = default_model_dir()
    except ModelLoadError as error:
        return _fail(str(error))
    from onebit.api.app import create_app
    from onebit.api.server import make_server, run_server
    from onebit.backends.native import NativeBackend
    from onebit.engine.config import EngineConfig
    from onebit.models.tokenizer import Tokenizer
    from onebit.router import Router

    try:
        config = EngineConfig(model=str(path), device=args.device, dtype=args.dtype, parallel=args.parallel,
                              ctx_size=args.ctx_size, kv_cache_memory=args.kv_cache_memory)
    except ValueError as error:
        return _fail(str(error))
    router = Router([NativeBackend(config, name="native-0")], max_queue=args.max_queue)
    name = args.alias or path.name
    failure: list[str] = []

    def on_load_error(message: str) -> None:
        failure.append(message)
        server.request_exit()

    app = create_app(router, model_name=name, model_path=str(path), load_tokenizer=lambda: Tokenizer.from_dir(path),
                     api_key=args.api_key, max_body_bytes=args.max_body_bytes, on_load_error=on_load_error)
    server = make_server(app, args.host, args.port, args.log_level)
    code = run_server(server)
    if failure:
        return _fail(f"could not load model {args.model or path}: {failure[0]}")
    return code


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        from onebit.bench.cli import main as bench_main

        return bench_main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            return serve(args)
        except KeyboardInterrupt:
            return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
