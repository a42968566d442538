"""Bring down backends back: restart each with exponential backoff until it serves again."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from onebit.backends.base import Backend

log = logging.getLogger(__name__)


@dataclass
class Backoff:
    """Restart delays: `initial`, doubling up to `maximum`; back to `initial` after `stable` s of serving."""

    initial: float = 1.0
    maximum: float = 30.0
    stable: float = 60.0


class Supervisor:
    """Watches backends; when one goes "down", restarts it with backoff until `start()` succeeds.

    Only the backend's own `start()` is used, so any kind (native worker, remote URL,
    llama-server child) is revived the same way.
    """

    def __init__(self, backoff: Backoff | None = None):
        self.backoff = backoff or Backoff()
        self._tasks: dict[int, asyncio.Task] = {}
        self._delay: dict[int, float] = {}
        self._up_since: dict[int, float] = {}
        self._closed = False

    def check(self, backends: list[Backend]) -> None:
        """Start a restart loop for every down backend that has none (call on the event loop)."""
        if self._closed:
            return
        now = asyncio.get_running_loop().time()
        for backend in backends:
            key = id(backend)
            if backend.state == "ready":
                self._up_since.setdefault(key, now)
            elif backend.state == "down":
                task = self._tasks.get(key)
                if task is None or task.done():
                    up = self._up_since.pop(key, None)
                    if up is not None and now - up >= self.backoff.stable:
                        self._delay.pop(key, None)
                    self._tasks[key] = asyncio.get_running_loop().create_task(self._revive(backend))

    async def _revive(self, backend: Backend) -> None:
        key = id(backend)
        while not self._closed:
            delay = self._delay.get(key, self.backoff.initial)
            self._delay[key] = min(delay * 2, self.backoff.maximum)
            log.warning("backend %s is down; restarting in %.1fs", backend.name, delay)
            await asyncio.sleep(delay)
            if self._closed or backend.state not in ("down", "loading"):
                return
            try:
                await backend.start()
            except Exception as error:
                log.warning("backend %s did not come back: %s", backend.name, error)
                continue
            log.info("backend %s is back", backend.name)
            return

    async def close(self) -> None:
        """Stop every restart loop."""
        self._closed = True
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
