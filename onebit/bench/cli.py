"""`1bit bench`: the command-line front of the benchmarks.

- `1bit bench --offline -m DIR ...`: the engine alone (onebit/bench/offline.py).
- `1bit bench --url URL ...` or `--serve "ARGS"`: load test of an OpenAI-compatible server.
- `1bit bench report A.json B.json ... --out DIR`: several runs in one table and one plot.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_CONCURRENCY = "1,2,4,8,12,16,24"
DEFAULT_OUT = "bench-results"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("values must be >= 1")
    return values


def _prompt_spec(text: str) -> str:
    from onebit.bench.prompts import parse_prompt_spec

    try:
        parse_prompt_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def gpu_index_arg(text: str) -> int:
    """argparse type of `--gpu-clocks`: a GPU index as nvidia-smi numbers them."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a GPU index (0, 1, ... as nvidia-smi numbers them), got {text!r}")
    return int(text)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _client_procs(text: str) -> int | str:
    from onebit.bench.split import parse_client_procs

    try:
        return parse_client_procs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _id_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep or not lo.isdigit() or not hi.isdigit() or int(lo) >= int(hi):
        raise argparse.ArgumentTypeError("expected LO:HI with LO < HI, e.g. 32:250")
    return int(lo), int(hi)


def build_parser() -> argparse.ArgumentParser:
    """Arguments of `1bit bench` (offline and online modes)."""
    p = argparse.ArgumentParser(prog="1bit bench", description="Measure tokens/s by batch size or concurrency. "
                                "`1bit bench report A.json B.json --out DIR` merges runs.")
    p.add_argument("--offline", action="store_true", help="benchmark the engine alone (no server)")
    p.add_argument("-m", "--model", help="model directory (offline), or the model name to send (online; "
                   "default: the first of /v1/models)")
    p.add_argument("--batch", type=_int_list, default=[1, 8, 32, 64], help="offline batch sizes")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per request (fixed length)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="offline prompt length")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="offline: queue each step before the last one's tokens reach the host (as serve --overlap; default: on with CUDA)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--gpu-clocks", type=gpu_index_arg, metavar="INDEX", default=None,
                   help="sample GPU INDEX (nvidia-smi's numbering) every 100 ms over each level or batch: its SM "
                        "clock, power and slowdown reasons, beside its tok/s (a GPU at its power cap runs slower "
                        "clocks, which explains a lower figure)")
    online = p.add_argument_group("online (against a server)")
    target = online.add_mutually_exclusive_group()
    target.add_argument("--url", help="server root or OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    target.add_argument("--serve", metavar="ARGS",
                        help='start `1bit serve ARGS` on a free port, e.g. "-m DIR --parallel 8"')
    online.add_argument("--serve-timeout", type=_positive_float, default=600, help="seconds to wait for /health")
    online.add_argument("--api-key", help="sent as a Bearer token")
    online.add_argument("--concurrency", type=_int_list, default=_int_list(DEFAULT_CONCURRENCY),
                        help=f"levels of simultaneous requests (default {DEFAULT_CONCURRENCY})")
    online.add_argument("--prompts", type=_prompt_spec, default="chat",
                        help="chat, code, prose, short, random:TOKENS (token ids via /v1/completions: that many on any server), or "
                             "shared:PREFIX+TOKENS (one PREFIX-token system prompt shared by all, then TOKENS each)")
    online.add_argument("--endpoint", choices=["chat", "completions"],
                        help="force an endpoint (random prompts on chat become random words)")
    amount = online.add_mutually_exclusive_group()
    amount.add_argument("--requests", type=_int_list,
                        help="requests per level, or one count per --concurrency level, e.g. 8,16,32 "
                             "(default 4 per client, at least 8)")
    amount.add_argument("--duration", type=_positive_float, help="seconds per level; in-flight requests finish")
    online.add_argument("--request-rate", type=_positive_float,
                        help="open loop: Poisson arrivals at R req/s, --concurrency caps requests in flight")
    online.add_argument("--label", help="name of this run in tables and plots")
    online.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    online.add_argument("--warmup", type=int, default=1, help="short requests sent before measuring")
    online.add_argument("--timeout", type=_positive_float, default=600, help="seconds a request may take")
    online.add_argument("--extra-body", type=_json_object, default={},
                        help="JSON merged into every request body; null drops a field, e.g. '{\"min_tokens\": null}'")
    online.add_argument("--random-ids", type=_id_range, default=None,
                        help="token id range LO:HI of random prompts (default 32:250, valid in any byte-level BPE)")
    online.add_argument("--seed", type=int, default=0)
    online.add_argument("--client-procs", type=_client_procs, default="auto",
                        help="client processes per level, each running its share of the requests (default auto: "
                             "one per 16 streams, at most the CPUs less 2; one Python process cannot parse "
                             "more than a few thousand streamed tokens/s)")
    online.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def build_report_parser() -> argparse.ArgumentParser:
    """Arguments of `1bit bench report`."""
    p = argparse.ArgumentParser(prog="1bit bench report", description="Overlay several bench runs.")
    p.add_argument("runs", nargs="+", help="run JSON files written by `1bit bench`")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    return p


def _report_main(argv: list[str]) -> int:
    from onebit.bench.report import report

    args = build_report_parser().parse_args(argv)
    try:
        md, png = report(args.runs, Path(args.out))
    except ValueError as exc:
        print(f"1bit bench report: error: {exc}", file=sys.stderr)
        return 1
    print(md.read_text())
    print(f"wrote {md} and {png}")
    return 0


def _offline_main(args: argparse.Namespace) -> int:
    if not args.model:
        from onebit.models.default_model import default_model_dir
        args.model = str(default_model_dir())
    from onebit.bench.offline import run_offline
    run_offline(args.model, args.batch, args.max_tokens, args.prompt_tokens, args.device, args.dtype,
                overlap=args.overlap, gpu_clocks=args.gpu_clocks)
    return 0


def _online_config(args: argparse.Namespace, url: str):
    from onebit.bench.online import OnlineConfig
    from onebit.bench.prompts import DEFAULT_RANDOM_IDS

    return OnlineConfig(url=url, concurrency=args.concurrency, max_tokens=args.max_tokens, prompts=args.prompts,
                        requests=args.requests, duration_s=args.duration, request_rate=args.request_rate,
                        model=args.model, api_key=args.api_key, endpoint=args.endpoint,
                        label=args.label or ("1bit" if args.serve else None), warmup=args.warmup,
                        timeout_s=args.timeout, extra_body=args.extra_body,
                        random_ids=args.random_ids or DEFAULT_RANDOM_IDS, seed=args.seed,
                        progress=not args.no_progress, client_procs=args.client_procs,
                        gpu_clocks=args.gpu_clocks)


def _online_main(args: argparse.Namespace) -> int:
    from onebit.bench.online import BenchError, run_online
    from onebit.bench.report import save_run
    from onebit.bench.serve import ServeError, served
    from onebit.bench.tables import markdown_report

    out = Path(args.out)
    try:
        if args.serve is not None:
            print(f"starting `1bit serve {args.serve}` (log: {out / 'serve.log'})", file=sys.stderr)
            with served(args.serve, out / "serve.log", args.serve_timeout) as url:
                run = run_online(_online_config(args, url))
        else:
            run = run_online(_online_config(args, args.url))
    except (BenchError, ServeError) as exc:
        print(f"1bit bench: error: {exc}", file=sys.stderr)
        return 1
    paths = save_run(run, out)
    print(markdown_report([run], f"1bit bench: {run['label']}"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _glue_serve_args(argv: list[str]) -> list[str]:
    # argparse reads the value of `--serve "-m DIR"` as an option because it starts with '-';
    # gluing it into `--serve=-m DIR` keeps it a value.
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--serve":
            out[i:i + 2] = [f"--serve={out[i + 1]}"]
            break
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark the arguments ask for; return the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "report":
        return _report_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(_glue_serve_args(argv))
    if args.offline:
        return _offline_main(args)
    if not args.url and args.serve is None:
        parser.error("give --url URL (a running server), --serve \"ARGS\" (start one), or --offline")
    if args.max_tokens < 1:
        parser.error("--max-tokens must be >= 1")
    if args.requests is not None:
        if len(args.requests) == 1:
            args.requests = args.requests[0]
        elif len(args.requests) != len(args.concurrency):
            parser.error(f"--requests has {len(args.requests)} counts for {len(args.concurrency)} "
                         "--concurrency levels: give one count, or one per level")
    return _online_main(args)
