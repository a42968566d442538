"""Run one level over several client processes (worker.py) and merge their results.

One Python process can only parse so many streamed tokens a second (see client.py); past that
the benchmark, not the server, sets the tok/s. So the parent starts one process per share
(split.py), waits until every one is connected, gives them one start instant, ticks the
progress bar on their results as they arrive, and merges them into one level exactly as if
one process had run it. A process that dies or goes silent is killed and its unfinished
requests become failures of kind "client"; one that cannot start is a BenchError.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from onebit.bench.client import RequestResult
from onebit.bench.errors import BenchError
from onebit.bench.job import LevelJob
from onebit.bench.loadgen import LevelPlan, level_wall, progress_bar
from onebit.bench.split import Share

READY_TIMEOUT_S = 120.0  # start-up: interpreter, imports, connections, on a busy machine
SILENCE_TIMEOUT_S = 60.0  # a started process that says nothing (it sends a heartbeat each second) is hung
START_DELAY_S = 0.05  # the start instant lies this far ahead, so that every process hears of it in time
LINE_LIMIT = 1 << 26  # one result line holds every chunk time of a request

# The child imports the same onebit as the parent, whatever its sys.path says (a checkout run
# with PYTHONPATH, an installed copy); onebit/__init__.py imports no torch, so a client stays light.
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from onebit.bench.worker import main; sys.exit(main())"


def child_command() -> list[str]:
    """The command line of one client process."""
    return [sys.executable, "-c", _BOOT, str(Path(__file__).resolve().parents[2])]


class _Child:
    """One client process, its share, and what it reported."""

    def __init__(self, share: Share, proc: asyncio.subprocess.Process, stderr):
        self.share, self.proc, self.stderr = share, proc, stderr
        self.results: list[RequestResult] = []
        self.cpu_s: float | None = None

    @classmethod
    async def spawn(cls, share: Share, message: dict) -> _Child:
        """Start a client process and hand it its share."""
        stderr = tempfile.TemporaryFile()
        proc = await asyncio.create_subprocess_exec(*child_command(), stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=stderr,
                                                    limit=LINE_LIMIT)
        child = cls(share, proc, stderr)
        child.send(message)
        return child

    def send(self, message: dict) -> None:
        """Write one JSON line to the process (ignored once it is gone)."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            self.proc.stdin.write((json.dumps(message) + "\n").encode())

    async def _read(self, timeout: float) -> dict | None:
        """The next message; None at EOF. Raises TimeoutError after `timeout` s of silence."""
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            if not line:
                return None
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if isinstance(message, dict):
                    return message
            # Anything else on stdout (a stray print in some library) is skipped.

    def why(self, what: str) -> str:
        """`what`, the exit code and the end of the process's stderr."""
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace").strip()[-1500:]
        code = self.proc.returncode
        return f"{what}{'' if code is None else f' (exit code {code})'}" + (f": {tail}" if tail else "")

    async def wait_ready(self) -> None:
        """Return once the process is connected; raise BenchError if it dies or takes too long first."""
        try:
            while (message := await self._read(READY_TIMEOUT_S)) is not None:
                if message.get("ready"):
                    return
        except asyncio.TimeoutError:
            raise BenchError(self.why(f"a client process was not ready after {READY_TIMEOUT_S:g} s")) from None
        await self.proc.wait()
        raise BenchError(self.why("a client process exited before it was ready"))

    async def collect(self, start_at: float, on_result) -> None:
        """Gather results until the process is done; a dead or silent one turns into failures."""
        try:
            while (message := await self._read(SILENCE_TIMEOUT_S)) is not None:
                if "result" in message:
                    result = RequestResult.from_json(message["result"])
                    self.results.append(result)
                    on_result(result)
                elif message.get("done"):
                    self.cpu_s = message.get("cpu_s")
                    return
            await self.proc.wait()
            reason = self.why("the client process running it died")
        except asyncio.TimeoutError:
            reason = self.why(f"the client process running it was silent for {SILENCE_TIMEOUT_S:g} s")
            self.kill()
        for result in self._lost(reason, time.monotonic() - start_at):
            self.results.append(result)
            on_result(result)

    def _lost(self, reason: str, now: float) -> list[RequestResult]:
        """Failures for the requests the process never reported, stamped `now` s into the level."""
        seen = {r.index for r in self.results}
        if self.share.plan.requests is not None:
            missing = [i for i in self.share.indices() if i not in seen]
        else:  # --duration: as many as were in flight, one per worker, after the last one seen
            nxt = max(((i - self.share.first) // self.share.stride for i in seen), default=-1) + 1
            missing = [self.share.index(nxt + w) for w in range(self.share.plan.concurrency)]
        return [RequestResult(index=i, start=now, e2e=0.0, failure="client", message=reason) for i in missing]

    def kill(self) -> None:
        """Kill the process if it still runs."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def close(self) -> None:
        """Let the process exit (kill it if it lingers) and drop its files."""
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5.0)
        except asyncio.TimeoutError:
            self.kill()
            await self.proc.wait()
        self.stderr.close()


async def run_level_procs(job: LevelJob, plan: LevelPlan, shares: list[Share], client_options: dict,
                          show_progress: bool = True) -> tuple[list[RequestResult], float, float | None]:
    """Run `plan`, split in `shares`, one client process each; return (results by index, wall s, client CPU s).

    `client_options` is what each process needs for its HTTP client: {"headers", "timeout_s",
    "warm_url"}. The client CPU is summed over the processes that finished (None if none did).
    """
    children: list[_Child] = []
    try:
        for share in shares:
            message = {"job": job.to_json(), "plan": dataclasses.asdict(share.plan), "first": share.first,
                       "stride": share.stride, "client": client_options}
            children.append(await _Child.spawn(share, message))
        for outcome in await asyncio.gather(*(child.wait_ready() for child in children), return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        start_at = time.monotonic() + START_DELAY_S
        for child in children:
            child.send({"start": start_at})
        with progress_bar(plan, show_progress) as bar:
            await asyncio.gather(*(child.collect(start_at, lambda r: bar.update(1)) for child in children))
    except BaseException:  # a BenchError, Ctrl-C, cancellation: no process may outlive the level
        for child in children:
            child.kill()
        raise
    finally:
        for child in children:
            await child.close()
    results = sorted((r for child in children for r in child.results), key=lambda r: r.index)
    cpu = [child.cpu_s for child in children if child.cpu_s is not None]
    return results, level_wall(results), sum(cpu) if cpu else None
