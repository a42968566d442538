"""Start the real `1bit serve` as a subprocess on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 120
REPO_ROOT = Path(__file__).resolve().parents[1]


# Ports free_port handed out, shared by every process on the machine (the pytest-xdist workers of
# `make test`, another checkout's suite): a port stays reserved here for PORT_HOLD_S, far longer
# than a server takes to bind it, so no other caller is handed it meanwhile.
PORT_LEDGER = Path(tempfile.gettempdir()) / "onebit-test-ports"
PORT_HOLD_S = 600


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now and no other free_port call (in
    any process) handed out in the last PORT_HOLD_S seconds.

    The kernel's pick for port 0 is random, so two processes asking at once can each get the port
    the other was just given and has not bound yet; the ledger, read and written under an
    exclusive lock, rules that out.
    """
    with open(PORT_LEDGER, "a+") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.seek(0)
        now = time.time()
        held = {}
        for line in ledger:
            with contextlib.suppress(ValueError):
                port, at = line.split()
                if now - float(at) < PORT_HOLD_S:
                    held[int(port)] = float(at)
        while True:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in held:
                break
        held[port] = now
        ledger.seek(0)
        ledger.truncate()
        ledger.writelines(f"{p} {at}\n" for p, at in held.items())
    return port


@dataclass
class ServerProcess:
    """A running server: its process, base URL (ending in /v1) and log file."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def root(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL."""
        return f"{self.root}/v1"

    def log(self) -> str:
        """Everything the server wrote so far."""
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        """Pids whose parent is the server (its engine workers), read from /proc."""
        return child_pids(self.proc.pid)


def child_pids(parent: int) -> list[int]:
    """Pids of the direct children of `parent`, found by scanning /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            out.append(int(entry))
    return out


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_server(model_dir: Path | None, *args: str, wait: bool = True) -> ServerProcess:
    """Launch `python -m onebit.cli serve -m MODEL --port P ARGS` (no -m when model_dir is None:
    the built-in model); wait for /health 200 if asked."""
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="onebit-server-", suffix=".log")[1])
    model = ["-m", str(model_dir)] if model_dir is not None else []
    cmd = [sys.executable, "-m", "onebit.cli", "serve", *model, "--port", str(port),
           "--log-level", "warning", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
    server = ServerProcess(proc, port, log_path)
    if wait:
        wait_healthy(server)
    return server


def wait_healthy(server: ServerProcess, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll /health until 200; fail with the server's log if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.root}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    stop_server(server)
    raise RuntimeError(f"server not healthy after {timeout}s:\n{server.log()}")


def stop_server(server: ServerProcess, timeout: float = 15) -> int | None:
    """SIGTERM, then SIGKILL if it lingers; also reap any worker it left behind."""
    workers = server.children()
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    for pid in workers:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return server.proc.returncode


@contextlib.contextmanager
def running_server(model_dir: Path | None, *args: str):
    """Context manager: a healthy server, stopped at the end."""
    server = start_server(model_dir, *args)
    try:
        yield server
    finally:
        stop_server(server)


SERVER_ARGS = ("--ctx-size", "256", "--parallel", "8", "--alias", "tiny")


def openai_clients(server: ServerProcess, **options):
    """A sync and an async official OpenAI client for the server (no retries: tests see every error)."""
    import openai

    options = {"api_key": "unused", "max_retries": 0, "timeout": 60, **options}
    return openai.OpenAI(base_url=server.base_url, **options), openai.AsyncOpenAI(base_url=server.base_url, **options)


async def wait_for(predicate, what: str, limit_s: float = 60) -> None:
    """Poll until `predicate()` holds (a guard against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


def queue_users(server: ServerProcess, key: str | None = None) -> dict:
    """GET /queue's rows as {user: row} (`key`: the API key to ask with, where the server wants one)."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    body = httpx.get(f"{server.root}/queue", headers=headers, timeout=10).json()
    return {row["user"]: row for row in body["users"]}


async def wait_idle(server: ServerProcess, key: str | None = None) -> None:
    """Wait until no user has anything running or waiting (tests start from an empty server)."""
    await wait_for(lambda: all(r["running"] + r["waiting"] == 0 for r in queue_users(server, key).values()), "idle")


def server_props(server: ServerProcess) -> dict:
    """GET /props."""
    return httpx.get(f"{server.root}/props", timeout=10).json()


def wait_backends_ready(server: ServerProcess, timeout: float = 60) -> list[dict]:
    """/props' backends once every one is ready (a guard against hanging: fails after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        backends = server_props(server)["backends"]
        if all(b["state"] == "ready" for b in backends):
            return backends
        time.sleep(0.1)
    raise AssertionError(f"backends not ready: {server_props(server)['backends']}\n{server.log()}")
