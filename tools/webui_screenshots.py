"""Take the README's screenshots of the web page: docs/webui-chat.png and docs/webui-status.png.

Starts `1bit serve` with the built-in model (MTP drafting on), asks it one question through the
page, then loads it with several users' streams and shoots the live view. Needs Debian's chromium
(`make browser`) and the `playwright` package (test extras). Run from the repository root:

    .venv/bin/python tools/webui_screenshots.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from PIL import Image
from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUESTION = "Write `read_json(path)`: open the file and return the **parsed** data."
USERS = ["alice", "alice", "alice", "bob", "bob", "carol"]  # six streams on four slots: two wait
SIZE = {"width": 1200, "height": 760}


@contextlib.contextmanager
def serve(parallel: int):
    """`1bit serve` (built-in model, --mtp) on a free loopback port, until the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "onebit.cli", "serve", "--mtp", "--parallel", str(parallel), "--ctx-size", "2048",
           "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    root = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        yield root
    finally:
        proc.terminate()
        proc.wait(30)


def load(root: str, model: str, stop: threading.Event) -> list[threading.Thread]:
    """One long stream per entry of USERS, each named by the OpenAI `user` field."""
    def stream(user: str) -> None:
        body = {"model": model, "user": user, "stream": True, "max_tokens": 1500, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Write a long module."}]}
        with httpx.stream("POST", f"{root}/v1/chat/completions", json=body, timeout=None) as answer:
            for _ in answer.iter_lines():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=stream, args=(user,), daemon=True) for user in USERS]
    for thread in threads:
        thread.start()
    return threads


def save_small(png: bytes, path: Path) -> None:
    """Save as a 256-colour PNG (flat UI colours survive; the file stays well under 200 KB)."""
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    image.save(path, optimize=True)
    print(f"{path}: {path.stat().st_size // 1024} KB")


def main() -> int:
    """Shoot both views into docs/."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    with serve(parallel=4) as root, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport=SIZE)
        page.set_default_timeout(120_000)
        page.goto(root + "/")
        expect(page.locator("#connection")).to_have_text("connected")
        page.fill("#set-temperature", "0")
        page.fill("#set-max_tokens", "80")
        page.fill("#chat-input", QUESTION)
        page.click("#send")
        expect(page.locator(".msg.assistant")).to_have_attribute("data-state", "done")
        save_small(page.screenshot(), args.out / "webui-chat.png")

        model = httpx.get(f"{root}/v1/models").json()["data"][0]["id"]
        stop = threading.Event()
        load(root, model, stop)
        page.click("#tab-status")
        expect(page.locator("tr.slot[data-state=busy]")).to_have_count(4)
        expect(page.locator("#queue-length")).to_have_text("2 / 1024")
        page.wait_for_timeout(4000)  # a few polls, so the rates cover a full window
        save_small(page.screenshot(full_page=True), args.out / "webui-status.png")
        stop.set()
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
