"""Long prompts (#19): one server, started once, measured on several prompt workloads; and the
side-by-side table of 1bit and llama.cpp over those runs.

    python bench/long_prompt.py run --server 1bit -m MODEL_DIR --serve-args "--device cuda" \\
        --workloads random:2048,shared:1024+1024,random:8192 --concurrency 1,8,32 --requests 8,16,32 \\
        --max-tokens 64 --ctx-size 8448 --out DIR
    python bench/long_prompt.py run --server llama.cpp -m MODEL_DIR --gguf FILE --llama-server BIN \\
        --llama-args "-ngl 99 -fa on" --check-reference REF.json ...   (the same load)
    python bench/long_prompt.py table DIR [DIR ...]                   (the side-by-side table)

`run` starts the server the way bench/peers/run_peers.py does (1bit: `1bit serve -m MODEL_DIR
--parallel max(C) --ctx-size CTX SERVE_ARGS`; llama.cpp: `llama-server -m GGUF -np max(C)
-c max(C)*CTX LLAMA_ARGS`, after the greedy check against 1bit), waits for /health, and runs
`1bit bench`'s closed loop for each workload in turn against it: every server gets the same token
ids (see onebit/bench/prompts.py), so the same prompt lengths. Each workload's run is written
after each of its levels, to DIR/SERVER_WORKLOAD.json (+ .md), so a run stopped by a time limit
keeps every level it finished. A workload that would start later than --stop-after seconds after the
start is left out and said so.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench" / "peers")]

from onebit.bench.online import BenchError, OnlineConfig, run_online  # noqa: E402
from onebit.bench.prompts import parse_prompt_spec  # noqa: E402
from onebit.bench.runfile import load_run, safe_name, write_run  # noqa: E402
from onebit.bench.serve import ServeError, served_command  # noqa: E402
from onebit.bench.tables import fmt_cached, fmt_ms, fmt_rate, markdown_report  # noqa: E402

WORKLOADS = "random:2048,shared:1024+1024,random:8192"


def run_file(out: Path, server: str, workload: str) -> Path:
    """Where `run` writes the run of `server` on `workload`."""
    return out / f"{safe_name(server)}_{safe_name(workload)}.json"


def peer_for(args: argparse.Namespace):
    """The run_peers Peer (command, port, check) of --server, with a context of --ctx-size per slot."""
    import run_peers

    ns = argparse.Namespace(
        model=args.model, concurrency=args.concurrency, out=args.out, device=args.device,
        serve_args=f"--ctx-size {args.ctx_size} {args.serve_args}", ctx_per_slot=args.ctx_size,
        llama_server=args.llama_server, llama_args=args.llama_args, gguf=args.gguf, gguf_dtype=args.gguf_dtype,
        check_gguf=bool(args.gguf), check_tokens=args.check_tokens, check_reference=args.check_reference)
    return run_peers.PEERS[args.server](ns)


def run_main(args: argparse.Namespace) -> int:
    """Start the server once, bench every workload against it; 0 when every workload was measured."""
    t0 = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    peer = peer_for(args)
    if peer.missing:
        print(f"NOT MEASURED: {args.server}: {peer.missing}")
        return 1
    workloads = [w for w in args.workloads.split(",") if w]
    done: list[str] = []
    print(f"== {peer.label}: {shlex.join(peer.cmd)}", flush=True)
    try:
        with served_command(peer.cmd, peer.port, out / f"{safe_name(peer.label)}.log", args.serve_timeout,
                            peer.label) as url:
            print(f"== {peer.label} healthy after {time.monotonic() - t0:.0f} s", flush=True)
            if peer.check is not None:
                ok, message = peer.check(url.removesuffix("/v1"))
                print(f"== {peer.label}: {message}", flush=True)
                if not ok:
                    raise BenchError(message)
                peer.notes.append(message)
            for workload in workloads:
                elapsed = time.monotonic() - t0
                if args.stop_after is not None and elapsed > args.stop_after:
                    print(f"NOT MEASURED: {peer.label} {workload}: {elapsed:.0f} s gone, past --stop-after "
                          f"{args.stop_after:.0f}", flush=True)
                    continue
                cfg = OnlineConfig(url=url, concurrency=args.concurrency, max_tokens=args.max_tokens,
                                   prompts=workload, requests=args.requests, label=peer.label,
                                   endpoint=peer.endpoint, extra_body=peer.extra_body, seed=args.seed,
                                   progress=False, timeout_s=args.timeout)
                start = time.monotonic()

                def save(run: dict, workload: str = workload) -> Path:
                    run["workload"] = workload
                    run["peer"] = {"command": shlex.join(peer.cmd), "notes": peer.notes + args.note}
                    path = write_run(run, run_file(out, peer.label, workload))
                    path.with_suffix(".md").write_text(markdown_report([run], f"{peer.label}, {workload}"))
                    return path

                # written after every level too, so a time limit that cuts a workload keeps its levels
                run = run_online(cfg, print_fn=lambda line: print(f"   {workload} {line}", flush=True), on_level=save)
                path = save(run)
                done.append(workload)
                print(f"== {peer.label} {workload}: {time.monotonic() - start:.0f} s -> {path}", flush=True)
    except (ServeError, BenchError) as exc:
        print(f"NOT MEASURED: {peer.label}: {str(exc).strip().splitlines()[0]} (log: "
              f"{out / safe_name(peer.label)}.log)", flush=True)
        return 1
    return 0 if len(done) == len(workloads) else 1


# ---------------------------------------------------------------- the side-by-side table


def _prompt_lengths(level: dict) -> str:
    """usage.prompt_tokens of the level's completed requests: '2048', or 'LO-HI' when they differ."""
    counts = [r["prompt_tokens"] for r in level["requests"] if not r.get("failure") and r.get("prompt_tokens")]
    if not counts:
        return "-"
    lo, hi = min(counts), max(counts)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if not ours or not theirs else f"{ours / theirs:.2f}x"


def load_runs(dirs: list[Path]) -> dict[str, dict[str, dict]]:
    """{workload: {server label: run}} of every run file `run` wrote under `dirs`."""
    runs: dict[str, dict[str, dict]] = {}
    for d in dirs:
        for path in sorted(Path(d).glob("*.json")):
            try:
                run = load_run(path)
            except ValueError:
                continue
            if "workload" in run:
                runs.setdefault(run["workload"], {})[run["label"]] = run
    return runs


def side_by_side(runs: dict[str, dict[str, dict]], ours: str = "1bit", peer: str = "llama.cpp") -> str:
    """One row per workload and concurrency: `ours` / `peer` for decode tok/s per request and in
    total, TTFT p50 and p90, the prompt lengths each server counted and its prefix-cache share,
    and the ratios (above 1: `ours` is ahead)."""
    head = (f"| prompts | C | decode tok/s per req ({ours} / {peer}) | decode tok/s total | TTFT p50 ms | "
            f"TTFT p90 ms | prompt tokens | prompt cached | decode x | TTFT p50 x |")
    lines = [head, "|---|---:|" + "---:|" * 8]
    order = sorted(runs, key=lambda w: (parse_prompt_spec(w)[0] == "shared", parse_prompt_spec(w)[1] or 0, w))
    for workload in order:
        by_server = runs[workload]
        levels = {label: {lv["summary"]["concurrency"]: (lv["summary"], lv) for lv in run["levels"]}
                  for label, run in by_server.items()}
        cs = sorted({c for per in levels.values() for c in per})
        for c in cs:
            a = levels.get(ours, {}).get(c)
            b = levels.get(peer, {}).get(c)

            def pair(fn) -> str:
                return f"{fn(a) if a else 'n/m'} / {fn(b) if b else 'n/m'}"

            def failed(x) -> str:
                return f" ({x[0]['failed']} failed)" if x and x[0]["failed"] else ""

            per_req = pair(lambda x: fmt_rate(x[0]["per_request_tok_s"]) + failed(x))
            total = pair(lambda x: fmt_rate(x[0].get("decode_tok_s")))
            p50 = pair(lambda x: fmt_ms(x[0]["ttft_ms"]["p50"]))
            p90 = pair(lambda x: fmt_ms(x[0]["ttft_ms"]["p90"]))
            prompt = pair(lambda x: _prompt_lengths(x[1]))
            cached = pair(lambda x: fmt_cached(x[0]))
            dec_x = _ratio(a[0].get("decode_tok_s") if a else None, b[0].get("decode_tok_s") if b else None)
            ttft_x = _ratio(b[0]["ttft_ms"]["p50"] if b else None, a[0]["ttft_ms"]["p50"] if a else None)
            lines.append(f"| {workload} | {c} | {per_req} | {total} | {p50} | {p90} | {prompt} | {cached} | "
                         f"{dec_x} | {ttft_x} |")
    return "\n".join(lines)


def table_main(args: argparse.Namespace) -> int:
    """Print (and with --out, write) the side-by-side table of the runs under the given directories."""
    runs = load_runs([Path(d) for d in args.dirs])
    if not runs:
        print("no long-prompt runs found")
        return 1
    text = side_by_side(runs, args.ours, args.peer)
    notes = ["", f"n/m: not measured. decode x = {args.ours} / {args.peer} decode tok/s total; TTFT p50 x = "
             f"{args.peer} / {args.ours} TTFT p50 (above 1: {args.ours} ahead). Definitions: onebit/bench/stats.py."]
    servers: dict[str, dict] = {}
    for by_server in runs.values():
        for label, run in by_server.items():
            servers.setdefault(label, run)
    for label, run in servers.items():
        st, peer = run["settings"], run.get("peer", {})
        notes.append(f"- {label}: {st['max_tokens']} new tokens, requests per level {st['requests']}, "
                     f"`{peer.get('command', '?')}`")
        notes += [f"  - {note}" for note in peer.get("notes", [])]
    text = text + "\n" + "\n".join(notes) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line arguments of `run` and `table`."""
    from onebit.bench.cli import _int_list

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="start one server and bench every workload against it")
    r.add_argument("--server", choices=["1bit", "llama.cpp"], required=True)
    r.add_argument("-m", "--model", required=True, help="model directory (safetensors or dummy + tokenizer)")
    r.add_argument("--workloads", default=WORKLOADS, help=f"prompt specs, comma-separated (default {WORKLOADS})")
    r.add_argument("--concurrency", type=_int_list, default=[1, 8, 32])
    r.add_argument("--requests", type=_int_list, default=None,
                   help="requests per level: one count or one per level (default 4 per client, at least 8)")
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--ctx-size", type=int, default=8448,
                   help="tokens per slot, for both servers (default: 8,192 + 64 and room to spare; llama-server "
                        "ends a sequence that fills its slot)")
    r.add_argument("--serve-args", default="", help="more `1bit serve` arguments, e.g. '--device cuda'")
    r.add_argument("--llama-server", help="llama-server binary (default: as run_peers.py finds it)")
    r.add_argument("--llama-args", default="-ngl 99 -fa on", help="more llama-server arguments")
    r.add_argument("--gguf", help="GGUF of the same weights (default: written from --model in f32)")
    r.add_argument("--gguf-dtype", choices=["f32", "f16", "bf16"], default="f32",
                   help="the GGUF's dtype: f32 must continue exactly as 1bit does, f16/bf16 the top-k check")
    r.add_argument("--check-tokens", type=int, default=16, help="llama.cpp greedy check length (0: none)")
    r.add_argument("--check-reference", help="1bit's reference continuation JSON (llamacpp_peer.py reference)")
    r.add_argument("--device", default="cpu", help="device of the greedy check's reference")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--timeout", type=float, default=600, help="seconds a request may take")
    r.add_argument("--serve-timeout", type=float, default=600, help="seconds to wait for /health")
    r.add_argument("--stop-after", type=float, default=None,
                   help="start no workload later than this many seconds after the start")
    r.add_argument("--note", action="append", default=[], help="a line the table keeps with this server")
    r.add_argument("--out", required=True)
    t = sub.add_parser("table", help="the side-by-side table of the runs under DIRS")
    t.add_argument("dirs", nargs="+")
    t.add_argument("--ours", default="1bit")
    t.add_argument("--peer", default="llama.cpp")
    t.add_argument("--out", help="also write the table to this file")
    args = p.parse_args(argv)
    if args.command == "run" and args.requests is not None:
        if len(args.requests) == 1:
            args.requests = args.requests[0]
        elif len(args.requests) != len(args.concurrency):
            p.error("--requests: one count, or one per --concurrency level")
    return args


def main(argv: list[str] | None = None) -> int:
    """`run` or `table`."""
    args = parse_args(argv)
    return run_main(args) if args.command == "run" else table_main(args)


if __name__ == "__main__":
    sys.exit(main())
