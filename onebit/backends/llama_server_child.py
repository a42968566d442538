"""One llama-server child process: its command line, start-up, health wait, log file and end.

The child listens on 127.0.0.1 on a free port with an API key of its own (passed in its
environment, not on its command line, where any local user could read it), writes its log to
a file, and dies with this process: PR_SET_PDEATHSIG (the native worker's guard) is set between
fork and exec, so even kill -9 of 1bit leaves no llama-server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from onebit.backends.base import BackendError
from onebit.backends.native_worker import die_with_parent

_STOP_GRACE_S = 5.0


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@functools.lru_cache(maxsize=8)
def _help_text(binary: str, mtime: float) -> str:  # mtime: a rebuilt binary is asked again
    try:
        done = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ValueError(f"cannot run {binary} --help: {error}") from None
    return done.stdout + done.stderr


def _has_flag(text: str, flag: str) -> bool:
    return any(flag in line.split() or f"{flag}," in line.split() for line in text.splitlines())


def draft_flags(binary: str, head: str, draft_max: int | None = None) -> list[str]:
    """llama-server flags for MTP drafting with `head` (a GGUF; "" = the model's own MTP layers),
    as this build spells them (read from its --help); ValueError when it has none."""
    text = _help_text(binary, os.stat(binary).st_mtime)
    if _has_flag(text, "--mtp") and head:  # the seed's builds: --mtp HEAD.gguf
        flags = ["--mtp", head]
    elif "draft-mtp" in text and _has_flag(text, "--spec-type"):  # upstream: an MTP speculative type
        flags = ["--spec-type", "draft-mtp"]
        if head:
            model_flag = "--spec-draft-model" if _has_flag(text, "--spec-draft-model") else "--model-draft"
            flags += [model_flag, head]
    else:
        raise ValueError(f"{binary} has no MTP drafting flags (neither --mtp nor --spec-type draft-mtp in its "
                         "--help): use a build with MTP support, or serve without --mtp")
    if draft_max is not None:
        for flag in ("--spec-draft-n-max", "--draft-max"):
            if _has_flag(text, flag):
                flags += [flag, str(draft_max)]
                break
    return flags


def check_binary(binary: str) -> None:
    """ValueError with a clear message unless `binary` is an executable file."""
    path = Path(binary)
    hint = "build one with `1bit llama-server --build`, or give the path of your own llama-server build"
    if not path.exists():
        raise ValueError(f"llama-server binary {binary} does not exist; {hint}")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ValueError(f"llama-server binary {binary} is not an executable file; {hint}")


class LlamaServerChild:
    """A started llama-server process (`command` + "--port"/"--host" of its own)."""

    def __init__(self, command: list[str], log_path: Path):
        self.command = command
        self.log_path = log_path
        self.port = free_port()
        self.api_key = secrets.token_urlsafe(24)
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """The child's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process id."""
        return self.proc.pid if self.proc is not None else None

    async def spawn(self) -> None:
        """Start the process (from the event-loop thread: PR_SET_PDEATHSIG follows the forking thread)."""
        cmd = [*self.command, "--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "LLAMA_API_KEY": self.api_key}
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
                start_new_session=True)  # Ctrl-C reaches 1bit, which stops the child itself

    async def wait_healthy(self, timeout: float) -> None:
        """Return once /health says 200; BackendError if the process ends or `timeout` s pass first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with httpx.AsyncClient(base_url=self.url, timeout=5.0) as client:
            while True:
                if self.proc.returncode is not None:
                    raise BackendError(f"llama-server exited with code {self.proc.returncode} before it was "
                                       f"ready; the end of its log ({self.log_path}):\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/health")).status_code == 200:
                        return
                if loop.time() > deadline:
                    raise BackendError(f"llama-server was not ready after {timeout:.0f}s; its log: {self.log_path}")
                await asyncio.sleep(0.1)

    def log_tail(self, lines: int = 12) -> str:
        """The last lines the child wrote."""
        try:
            text = self.log_path.read_bytes()[-8192:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL, now (the exit is noticed by whoever waits on the process)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; reaps the process."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), _STOP_GRACE_S)
            except asyncio.TimeoutError:
                self.kill()
        await self.proc.wait()
