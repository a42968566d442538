"""Check the built-in demo model through the real server, on this machine (CPU is fine):

    PYTHONPATH=. python3 tools/demo_training/check_server.py [-m MODEL_DIR] [--threads N]

Starts `1bit serve` (the default model unless -m) as a subprocess three times: plain, `--mtp`
(the default draft policy, "auto": what a user gets) and `--mtp --draft-policy always` (drafts
at every step, so acceptance covers every position at the engine's default draft length, 3).
Each time it sends, with the official openai client, greedily: the five plain code prompts
(64 tokens, /v1/completions) and the chat request (/v1/chat/completions), judged by the rules
of tools/demo_training/evaluation.py; then single-user speed: each prompt once more for 128
tokens with ignore_eos, one request at a time, tokens/s over the five. Acceptance = accepted /
drafted tokens from the server's /metrics counters. Prints one table.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from openai import OpenAI

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.demo_training.evaluation import CHAT_REQUEST, CODE_PROMPTS, chat_has_function, parse_completion  # noqa: E402
from tools.demo_training.evaluation import table as format_table  # noqa: E402

SPEED_TOKENS = 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m onebit.cli serve` on a free loopback port, with its log in a temporary file."""

    def __init__(self, model: str | None, extra: list[str]):
        self.port = _free_port()
        self.log_path = Path(tempfile.mkstemp(prefix="demo-check-", suffix=".log")[1])
        cmd = [sys.executable, "-m", "onebit.cli", "serve", "--port", str(self.port), *extra]
        if model:
            cmd[4:4] = ["-m", model]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(cmd, stdout=self.log_path.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.root = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.root + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("server not healthy after 300 s:\n" + self.log_path.read_text()[-3000:])
            time.sleep(0.5)
        self.client = OpenAI(base_url=self.root + "/v1", api_key="none", max_retries=0, timeout=600)

    def counter(self, name: str) -> float:
        """Sum of a Prometheus counter over its label sets (0 when absent)."""
        text = httpx.get(self.root + "/metrics", timeout=10).text
        pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.MULTILINE)
        return sum(float(v) for v in pattern.findall(text))

    def stop(self) -> None:
        """SIGTERM, then kill after 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def check(server: Server) -> dict:
    """Parse counts, the chat check, single-user tokens/s and acceptance for one running server."""
    client = server.client
    code = []
    for prompt in CODE_PROMPTS:
        r = client.completions.create(model="demo", prompt=prompt, max_tokens=64, temperature=0)
        choice = r.choices[0]
        code.append(parse_completion(prompt, choice.text, choice.finish_reason == "stop"))
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": CHAT_REQUEST}],
                                       max_tokens=160, temperature=0)
    answer = r.choices[0].message.content or ""
    chat_ok, _ = chat_has_function(answer, r.choices[0].finish_reason == "stop")
    drafted0 = server.counter("onebit:spec_decode_num_draft_tokens")
    accepted0 = server.counter("onebit:spec_decode_num_accepted_tokens")
    tokens, start = 0, time.perf_counter()
    for prompt in CODE_PROMPTS:
        r = client.completions.create(model="demo", prompt=prompt, max_tokens=SPEED_TOKENS, temperature=0,
                                      extra_body={"ignore_eos": True})
        tokens += r.usage.completion_tokens
    elapsed = time.perf_counter() - start
    drafted = server.counter("onebit:spec_decode_num_draft_tokens") - drafted0
    accepted = server.counter("onebit:spec_decode_num_accepted_tokens") - accepted0
    return {"code": code, "chat_ok": chat_ok, "answer": answer, "tok_s": tokens / elapsed,
            "acceptance": accepted / drafted if drafted else None, "drafted": drafted}


def main() -> None:
    """Run the three servers one after another and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=None, help="model directory (default: the built-in model)")
    parser.add_argument("--device", default=None, help="passed to 1bit serve --device (e.g. cpu)")
    args = parser.parse_args()
    extra = ["--device", args.device] if args.device else []
    runs = {"plain": [], "--mtp": ["--mtp"], "--mtp, policy always": ["--mtp", "--draft-policy", "always"]}
    results = {}
    for name, flags in runs.items():
        server = Server(args.model, extra + flags)
        try:
            results[name] = check(server)
        finally:
            server.stop()
        r = results[name]
        print(f"{name}: {r['tok_s']:.1f} tok/s; chat answer:\n{r['answer']}\n", flush=True)
    base = results["plain"]["tok_s"]
    rows = []
    for name, r in results.items():
        whole = sum(c.whole for c in r["code"])
        top = sum(c.top_level for c in r["code"])
        acc = f"{r['acceptance']:.1%} of {r['drafted']:.0f} drafts" if r["acceptance"] is not None else "no drafts"
        rows.append((name, f"code parses {sum(c.ok for c in r['code'])}/5 (whole {whole}, to a top-level statement "
                           f"{top}) | chat def parses {'yes' if r['chat_ok'] else 'NO'} | {r['tok_s']:.1f} tok/s "
                           f"({r['tok_s'] / base:.2f}x) | acceptance {acc}"))
    print(format_table(rows))


if __name__ == "__main__":
    main()
