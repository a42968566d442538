"""The `1bit` command: `1bit serve` runs the server, `1bit bench` measures one."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys

from onebit.cli_dropin import add_dropin_arguments, aliases_of, hf_repo_id

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


def _add_backend_arguments(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group(
        "several backends",
        "A request goes to the first backend (in --backend order) holding fewer requests than its slots; "
        "when all are full it waits in one FIFO queue. A backend that dies or stops answering is restarted "
        "with backoff; requests it had not started streaming go to another backend.")
    group.add_argument("--adaptive", action="store_true",
                       help="a primary with --adaptive-at slots, overflow to a secondary with --adaptive-slots; "
                            "without --backend: one engine on --device with both (one copy of the weights), "
                            "drafting while at most --adaptive-at requests run, plain batched steps above")
    group.add_argument("--adaptive-at", type=_positive, default=None, metavar="N",
                       help="requests the primary holds before the overflow goes on (none: --parallel)")
    group.add_argument("--adaptive-slots", type=_positive, default=16, metavar="K",
                       help="slots of every backend after the first")
    # --mtp / --ngram / --draft-model apply to the primary only (backends/factory.py).
    group.add_argument("--hand-over", action="store_true",
                       help="backends on different devices: when the load falls back to the primary's slots, "
                            "requests streaming on the others move to the primary (each once per fall)")
    group.add_argument("--backend", action="append", default=None, metavar="SPEC",
                       help="repeatable, first = primary: native, native:cpu, native:cuda, native:cuda:N, "
                            "url:http://HOST:PORT (any OpenAI-compatible server), or llama-server:PATH (a llama.cpp "
                            "build 1bit runs; options gguf=FILE, args=...). Options after '?': slots=N; "
                            "for url: also prompt=ids|text (token ids need the same tokenizer on the peer) and "
                            "model=NAME. Example: url:http://box2:8000?slots=32&prompt=text. A url peer's API "
                            "key is read from $ONEBIT_BACKEND_API_KEY")
    group.add_argument("--llama-server", default=None, metavar="PATH",
                       help="serve the GGUF -m through this llama-server build (with --adaptive: two of them)")
    group.add_argument("--backend-timeout", type=float, default=30.0, metavar="S",
                       help="seconds without an answer before a backend counts as hung")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand but `bench` (which parses its own)."""
    parser = argparse.ArgumentParser(prog="1bit", description="One GPU, many users: an OpenAI-compatible server.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the OpenAI-compatible server",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("-m", "--model", help="model directory, .gguf file (or a directory holding one), or cached "
                                             "Hugging Face id, optionally ID:QUANT to pick a GGUF (none: the built-in model)")
    serve.add_argument("--gguf-file", default=None, metavar="NAME",
                       help="which GGUF file of the -m directory or cached repository to serve")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    serve.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    serve.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="weights and activations dtype (auto: bfloat16 on CUDA, float32 on the CPU)")
    serve.add_argument("--quantize", default=None, choices=["fp8"],
                       help="quantize the decoder's linear layers after loading: fp8 = e4m3 weights with one scale "
                            "per output channel (half the bytes of bf16; default: none)")
    serve.add_argument("--quantize-lm-head", action=argparse.BooleanOptionalAction, default=None,
                       help="with --quantize fp8, the output head too (e4m3, one scale per vocabulary row; a tied "
                            "head gets its own copy, the embedding lookup stays unquantized; default: on)")
    serve.add_argument("--gguf-keep-packed", action=argparse.BooleanOptionalAction, default=None,
                       help="keep a GGUF model's Q8_0/Q4_K/Q5_K/Q6_K linear layers packed on the device, multiplied "
                            "by Triton kernels: a third of bf16's memory for Q4_K, but slower than bf16 so far (default: off, "
                            "dequantized at load)")
    serve.add_argument("--ctx-size", type=_positive, default=None, help="context size in tokens")
    serve.add_argument("--parallel", type=_positive, default=4, help="slots decoding together")
    serve.add_argument("--kv-cache-memory", type=parse_bytes, default=None, help="KV pool size, e.g. 2G")
    serve.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                       help="KV cache entries: auto = the model's dtype; fp8 = e4m3 with per-head scales fixed by "
                            "a calibration prefill at start-up (half the bytes: twice the blocks in the same memory)")
    serve.add_argument("--max-batch-tokens", type=_positive, default=2048, help="token budget of one step")
    serve.add_argument("--mixed-step-tokens", type=_positive, default=None,
                       help="while sequences decode, cap a step at this many tokens (prompt chunks share what the "
                            "decode rows leave), so long prompts do not stall decoding; e.g. 256")
    serve.add_argument("--block-size", type=_positive, default=16, help="tokens per KV cache block")
    serve.add_argument("--no-prefix-caching", action="store_true", help="do not reuse cached prompt prefixes")
    serve.add_argument("--no-cuda-graphs", action="store_true", help="run decode steps eagerly (debugging)")
    serve.add_argument("--no-triton-gemv", action="store_true",
                       help="always use cuBLAS for products of 1 to 16 rows (by default each weight shape and "
                            "row count uses a Triton kernel where one measured faster at start-up)")
    serve.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                       help="prepare and queue each step while the GPU still runs the one before (hides the "
                            "host's share of a step; none: on with CUDA, off on the CPU)")
    serve.add_argument("--deterministic", action="store_true",
                       help="batch-invariant kernels: a request's greedy output is the same bits alone, in any "
                            "batch, with speculation, chunked prefill or prefix-cache hits (docs/perf.md: cost)")
    spec = serve.add_argument_group("speculative decoding (drafts verified losslessly; the engine drafts "
                                    "only while measured step times say it pays)")
    spec.add_argument("--mtp", nargs="?", const="", default=None, metavar="PATH",
                      help="draft with the multi-token-prediction head in the checkpoint (mtp.* tensors), "
                           "or with the one in PATH (a safetensors file or directory)")
    spec.add_argument("--ngram", action="store_true", help="draft by prompt lookup (n-gram matching)")
    spec.add_argument("--draft-model", default=None, metavar="DIR",
                      help="draft with a smaller model that has the same tokenizer (a directory or cached "
                           "Hugging Face id, like -m); its KV cache shares the KV budget")
    spec.add_argument("--mtp-max", "--draft-max", dest="draft_max", type=_positive, default=3,
                      help="most drafted tokens per step")
    spec.add_argument("--mtp-p-min", type=float, default=0.0, metavar="P",
                      help="draft a token only while the MTP head gives it at least probability P ")
    spec.add_argument("--draft-policy", choices=["auto", "always"], default="auto",
                      help="auto: draft only while measured step times say it pays; always: draft "
                           "--draft-max tokens on every step, as llama.cpp does")
    # Benchmark-only switches, hidden from --help (bench/README.md documents them): the oracle
    # drafter, a measuring instrument (onebit/bench/oracle.py), and random weights of a model's shape.
    spec.add_argument("--draft", default=None, help=argparse.SUPPRESS)
    spec.add_argument("--draft-record", default=None, help=argparse.SUPPRESS)
    serve.add_argument("--load-format", default="auto", choices=["auto", "dummy"], help=argparse.SUPPRESS)
    _add_backend_arguments(serve)
    add_dropin_arguments(serve)
    serve.add_argument("--api-key", help="require this key on every API route (its user is named 'default')")
    serve.add_argument("--api-key-file", metavar="FILE",
                       help="named keys with limits, one per line: KEY NAME [max_concurrent=N] [max_queued=N] "
                            "[tpm=N] (requests running or waiting, requests waiting, tokens per minute; "
                            "over a limit: 429 with Retry-After); '#' starts a comment")
    serve.add_argument("--no-webui", action="store_true", help="do not serve the web page at /")
    serve.add_argument("--max-queue", type=int, default=1024, help="requests that may wait for a slot")
    serve.add_argument("--max-prompts-per-request", type=_positive, default=64,
                       help="prompts one /v1/completions request may carry (more: 400)")
    serve.add_argument("--no-fair-share", action="store_true",
                       help="one first-come-first-served line for everyone, instead of sharing slots and "
                            "prefill fairly between users (API key name, else the `user` field)")
    serve.add_argument("--priority-preempt", action="store_true",
                       help="a waiting request with a lower `priority` value takes the slot of a running one of "
                            "the same user (with --no-fair-share: of anyone), on any backend kind; the preempted "
                            "one continues later from what it streamed, its client's stream unbroken")
    serve.add_argument("--props-show-path", action="store_true", help="/props shows the model's file path")
    serve.add_argument("--max-body-bytes", type=parse_bytes, default=8 * 2**20,
                       help="largest request body in bytes (e.g. 8M); larger is a 413")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="how much the server logs")
    sub.add_parser("bench", help="measure tokens/s of a server (see `1bit bench --help`)", add_help=False)
    sub.add_parser("llama-server", help="build llama-server to serve through (`1bit llama-server --help`)",
                   add_help=False)
    return parser


def _speculative_config(args: argparse.Namespace, path):
    """The SpeculativeConfig for the chosen drafter (None: no drafting); ValueError (or
    ModelLoadError) with a clear message."""
    from onebit.engine.spec.config import SpeculativeConfig
    from onebit.models.loader import resolve_model_path
    from onebit.models.tokenizer import Tokenizer

    drafters = [name for name, on in (("--mtp", args.mtp is not None), ("--ngram", args.ngram),
                                      ("--draft-model", args.draft_model is not None),
                                      ("--draft", args.draft is not None)) if on]
    if len(drafters) > 1:
        count = {2: "two", 3: "three"}.get(len(drafters), str(len(drafters)))
        raise ValueError(f"{' and '.join(drafters)} are {count} drafters; choose one")
    options = {"draft_max": args.draft_max, "p_min": args.mtp_p_min, "policy": args.draft_policy}
    if args.mtp is not None:
        return SpeculativeConfig("mtp", mtp_path=args.mtp or None, **options)
    if args.ngram:
        return SpeculativeConfig("ngram", **options)
    if args.draft_model is not None:
        from onebit.engine.spec.draft_model import check_same_tokenizer

        draft_model = resolve_model_path(args.draft_model)
        check_same_tokenizer(Tokenizer.from_dir(path), Tokenizer.from_dir(draft_model), str(draft_model))
        return SpeculativeConfig("draft", draft_model=str(draft_model), **options)
    if args.draft is not None:
        return _oracle_config(args)
    if args.draft_record:
        raise ValueError("--draft-record belongs to --draft oracle:P")
    return None


def _oracle_config(args: argparse.Namespace):
    """`--draft oracle:P --draft-record FILE`: the benchmark-only oracle drafter."""
    from onebit.bench.oracle import oracle_speculation

    kind, _, p = args.draft.partition(":")
    try:
        probability = float(p)
    except ValueError:
        probability = -1.0
    if kind != "oracle" or not 0.0 <= probability <= 1.0:
        raise ValueError(f"--draft {args.draft!r}: the only value is oracle:P with P in [0, 1] (a measuring "
                         "instrument; real drafters are --mtp, --ngram and --draft-model)")
    if not args.draft_record:
        raise ValueError("--draft oracle:P needs --draft-record FILE (recorded greedy outputs)")
    return oracle_speculation(probability, args.draft_record, args.draft_max, args.draft_policy)


def _fail(message: str) -> int:
    print(f"1bit: error: {message}", file=sys.stderr)
    return 1


def _backend_specs(args: argparse.Namespace):
    """The backends to run, the slots of each, and the one-engine adaptive limit (None unless `--adaptive`
    without --backend: one native engine then serves the primary's and the overflow's slots), from
    --backend/--adaptive*; ValueError on a bad mix."""
    from onebit.backends.spec import BackendSpec, parse_backend_spec

    if args.adaptive_at is not None and not args.adaptive:
        raise ValueError("--adaptive-at needs --adaptive")
    if args.backend_timeout <= 0:
        raise ValueError("--backend-timeout must be > 0")
    specs = [parse_backend_spec(text) for text in args.backend or []]
    if args.llama_server and specs:
        raise ValueError("--llama-server PATH is the short form; with --backend write llama-server:PATH")
    if args.llama_server:
        specs = [BackendSpec("llama-server", args.llama_server)] * (2 if args.adaptive else 1)
    if args.adaptive and not specs:
        # Both would be native on --device: one engine serves both regimes (one copy of the weights,
        # one KV pool), drafting up to --adaptive-at running requests and plain batched steps above.
        at = args.adaptive_at or args.parallel
        return [BackendSpec("native")], [at + args.adaptive_slots], at
    if not specs:
        specs = [BackendSpec("native")]
    if args.adaptive and len(specs) < 2:
        raise ValueError("--adaptive needs two backends or more (give none, or at least two --backend)")
    first = (args.adaptive_at or args.parallel) if args.adaptive else args.parallel
    slots = [s.slots or (first if i == 0 else args.adaptive_slots) for i, s in enumerate(specs)]
    return specs, slots, None


def _model_identity(path, alias: str | None) -> tuple[str, dict | None]:
    """The served model name (a GGUF file's name without .gguf, a cached model's repository id) and,
    for GGUF, its file and quantization."""
    from onebit.models.gguf import is_gguf
    from onebit.models.gguf.files import model_name
    from onebit.models.gguf.load import gguf_info

    if not is_gguf(path):
        return alias or hf_repo_id(path) or path.name, None
    return alias or model_name(path), gguf_info(path)


def _model_path(args: argparse.Namespace):
    """The model to serve: -m resolved (directory, GGUF file, cached id), or the built-in model."""
    from onebit.models.loader import resolve_model_path

    if args.model:
        return resolve_model_path(args.model, args.gguf_file)
    if args.gguf_file:
        raise ValueError("--gguf-file needs -m (the directory or cached repository holding the file)")
    from onebit.models.default_model import default_model_dir

    return default_model_dir()


def serve(args: argparse.Namespace) -> int:
    """Wire model, backend, router and app together, then serve until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from onebit.models.errors import ModelLoadError
    from onebit.models.tokenizer import Tokenizer

    from onebit.api.cors import parse_origins
    from onebit.models.builtin_templates import chosen_template, with_template
    from onebit.models.pooling_config import model_pooling

    try:
        path = _model_path(args)
        template = chosen_template(args.chat_template, args.chat_template_file)
    except (ModelLoadError, ValueError) as error:
        return _fail(str(error))
    from onebit.api.app import create_app
    from onebit.api.server import make_server, run_server
    from onebit.engine.config import EngineConfig
    from onebit.router import Router

    try:
        speculative = _speculative_config(args, path)
    except (ModelLoadError, ValueError) as error:
        return _fail(str(error))
    try:
        config = EngineConfig(model=str(path), device=args.device, dtype=args.dtype, parallel=args.parallel,
                              ctx_size=args.ctx_size, kv_cache_memory=args.kv_cache_memory,
                              max_batch_tokens=args.max_batch_tokens, block_size=args.block_size,
                              mixed_step_tokens=args.mixed_step_tokens,
                              enable_prefix_caching=not args.no_prefix_caching,
                              cuda_graphs=not args.no_cuda_graphs, overlap=args.overlap,
                              triton_gemv=not args.no_triton_gemv, quantize=args.quantize,
                              **({} if args.quantize_lm_head is None else {"quantize_lm_head": args.quantize_lm_head}),
                              kv_cache_dtype=args.kv_cache_dtype,
                              gguf_keep_packed=args.gguf_keep_packed,
                              fair_share=not args.no_fair_share, priority_preempt=args.priority_preempt,
                              load_format=args.load_format, speculative=speculative,
                              deterministic=args.deterministic)
    except ValueError as error:
        return _fail(str(error))
    from onebit.backends.factory import BuildOptions, build_backends, overflow_policy

    options = BuildOptions(default_device=args.device, health_timeout=args.backend_timeout,
                           api_key=os.environ.get("ONEBIT_BACKEND_API_KEY"))
    try:
        specs, slots, adaptive_at = _backend_specs(args)
        if adaptive_at is not None:
            config = dataclasses.replace(config, parallel=slots[0], adaptive_at=adaptive_at)
        backends = build_backends(specs, slots, config, options)
    except ValueError as error:
        return _fail(str(error))
    aliases = aliases_of(args.alias)
    router = Router(backends, max_queue=args.max_queue, overflow=overflow_policy(specs, options),
                    fair=not args.no_fair_share, hand_over=args.hand_over, priority_preempt=args.priority_preempt)
    name, info = _model_identity(path, aliases[0] if aliases else None)
    failure: list[str] = []

    def on_load_error(message: str) -> None:
        failure.append(message)
        server.request_exit()

    from onebit.api.auth import build_keys
    from onebit.api.state import ServePolicy

    try:
        keys = build_keys(args.api_key, args.api_key_file)
    except (OSError, ValueError) as error:
        return _fail(f"--api-key-file: {error}")
    policy = ServePolicy(max_prompts_per_request=args.max_prompts_per_request, props_show_path=args.props_show_path)
    app = create_app(router, model_name=name, model_path=str(path),
                     load_tokenizer=lambda: with_template(Tokenizer.from_dir(path), template),
                     max_body_bytes=args.max_body_bytes, on_load_error=on_load_error, model_info=info,
                     keys=keys, policy=policy, aliases=tuple(aliases[1:]),
                     cors_origins=parse_origins(args.cors_origins), reasoning_format=args.reasoning_format,
                     embedding_pooling=(args.pooling or model_pooling(path)) if args.embedding else None,
                     webui=not args.no_webui)
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
    if argv and argv[0] == "llama-server":
        from onebit.llama_server_cli import main as llama_server_main

        return llama_server_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            return serve(args)
        except KeyboardInterrupt:
            return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
