"""How busy the HTTP front of a real `1bit serve` is while `1bit bench` streams from it.

    PYTHONPATH=. python3 bench/front_cpu.py --serve "SERVE ARGS" [--concurrency 64] [--requests 512]
        [--max-tokens 128] [--prompts random:128] [--out DIR]

Starts `1bit serve SERVE ARGS` on a free loopback port, waits until it is healthy, and reads the
CPU time (user + system, from /proc) of the server process (the front: the event loop, HTTP,
SSE) and of its child processes (the engine workers) just before and just after one
`1bit bench --url` run. Prints, for the front and the workers: CPU seconds, the share of one core
they kept busy over the bench's wall time, and CPU microseconds per SSE event carrying text; and
the bench client's CPU per event. A front near 100% of its core is the server's limit, whatever
the engine could do. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from onebit.bench.serve import free_port, serve_command, stop, wait_healthy

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime (fields 14 and 15 of stat)


def children(pid: int) -> list[int]:
    """The process ids whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def snapshot(pid: int) -> dict[int, float]:
    """CPU seconds of the server and of each of its children, by pid."""
    pids = [pid, *children(pid)]
    out = {}
    for p in pids:
        try:
            out[p] = cpu_seconds(p)
        except OSError:
            continue
    return out


def main() -> None:
    """Serve, bench, and print the front's and the workers' CPU over the bench."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True, help="arguments of `1bit serve`")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default="random:128")
    ap.add_argument("--out", default="out/front-cpu")
    ap.add_argument("--timeout", type=float, default=600, help="seconds the server may take to become healthy")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = out / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(serve_command(args.serve, port), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", log_path, args.timeout)
        label = "front-cpu"
        bench = [sys.executable, "-m", "onebit.cli", "bench", "--url", f"http://127.0.0.1:{port}",
                 "--concurrency", str(args.concurrency), "--requests", str(args.requests),
                 "--max-tokens", str(args.max_tokens), "--prompts", args.prompts, "--label", label,
                 "--out", str(out), "--no-progress"]
        before, wall = snapshot(proc.pid), time.perf_counter()
        subprocess.run(bench, check=True)
        after, wall = snapshot(proc.pid), time.perf_counter() - wall
    finally:
        stop(proc)
    run = json.loads((out / f"{label}.json").read_text())
    level = run["levels"][0]
    events = sum(len(r["chunk_times"]) for r in level["requests"])
    tokens = sum(r["completion_tokens"] or 0 for r in level["requests"])
    front = after[proc.pid] - before[proc.pid]
    workers = sum(after[p] - before.get(p, 0.0) for p in after if p != proc.pid)
    client = level["client"]["cpu_s"] or 0.0
    print(f"C={args.concurrency}, {args.requests} requests: {level['summary']['total_tok_s']:,.0f} tok/s, "
          f"{events} events carrying text ({tokens} tokens), bench wall {wall:.1f} s "
          f"(serve {shlex.join(shlex.split(args.serve))})")
    print("| process | CPU s | busy (of one core) | us per event |\n|---|---:|---:|---:|")
    print(f"| front (1bit serve's event loop) | {front:.2f} | {front / wall:.0%} | {front / max(events, 1) * 1e6:.1f} |")
    print(f"| engine workers | {workers:.2f} | {workers / wall:.0%} | {workers / max(events, 1) * 1e6:.1f} |")
    print(f"| bench clients ({level['client']['procs']} processes) | {client:.2f} | {client / wall:.0%} | "
          f"{client / max(events, 1) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
