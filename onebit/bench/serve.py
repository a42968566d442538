"""Run a server (`1bit serve ARGS`, or a peer's command) on a loopback port for the length of a benchmark."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


class ServeError(RuntimeError):
    """The server could not be started or did not become healthy."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_healthy(proc: subprocess.Popen, root: str, log_path: Path, timeout_s: float,
                 name: str = "1bit serve") -> None:
    """Poll `root`/health until it answers 200; raise ServeError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServeError(f"`{name}` exited with code {proc.returncode} before it was healthy:\n"
                             f"{_tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise ServeError(f"`{name}` not healthy after {timeout_s:.0f} s:\n{_tail(log_path)}")


def stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM the server; SIGKILL its whole process group if it lingers past `grace_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    # The server was started in its own session, so its group holds only it and its workers.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _die_with_parent() -> None:
    # Runs in the child before exec: Linux sends it SIGTERM when the bench dies, even by SIGKILL.
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def served_command(cmd: list[str], port: int, log_path: Path, timeout_s: float = 600, name: str | None = None):
    """Run `cmd` (a server that will listen on 127.0.0.1:`port`), wait for /health, yield its /v1 base URL.

    The server's output goes to `log_path`; it is stopped on exit, also on error, Ctrl-C or SIGTERM.
    """
    name = name or Path(cmd[0]).name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        try:
            # Own session: Ctrl-C in the terminal reaches only the bench, which then stops the server.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                    preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        except OSError as exc:
            raise ServeError(f"`{name}` could not be started: {exc}") from None
    # A SIGTERM to the bench must still run the `finally` below, which stops the server.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", log_path, timeout_s, name)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop(proc)
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def serve_command(args: str, port: int) -> list[str]:
    """The command line of `1bit serve ARGS` on 127.0.0.1:`port` (the same Python as the bench)."""
    return [sys.executable, "-m", "onebit.cli", "serve", *shlex.split(args), "--host", "127.0.0.1", "--port", str(port)]


@contextlib.contextmanager
def served(args: str, log_path: Path, timeout_s: float = 600):
    """Context manager yielding the base URL (http://127.0.0.1:PORT/v1) of a healthy `1bit serve ARGS`."""
    port = free_port()
    with served_command(serve_command(args, port), port, log_path, timeout_s, name="1bit serve") as url:
        yield url
