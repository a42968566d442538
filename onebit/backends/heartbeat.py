"""Notice a backend that stops answering: ping it now and then, and act when it goes quiet."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger(__name__)


class Heartbeat:
    """Calls `ping()` every `interval` seconds; calls `on_silent()` once nothing was heard for `timeout`.

    The owner calls `heard()` whenever anything arrives from the backend (replies to
    pings, but also ordinary traffic), so a busy backend is never mistaken for a hung one.
    """

    def __init__(self, ping: Callable[[], None], on_silent: Callable[[float], None],
                 interval: float = 2.0, timeout: float = 30.0):
        self._ping = ping
        self._on_silent = on_silent
        self.interval = interval
        self.timeout = timeout
        self._last = 0.0
        self._task: asyncio.Task | None = None

    def heard(self) -> None:
        """The backend said something just now."""
        self._last = asyncio.get_running_loop().time()

    def start(self) -> None:
        """Begin watching (call on the event loop)."""
        self.stop()
        self.heard()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Stop watching."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            silent = loop.time() - self._last
            if silent > self.timeout:
                self._task = None
                self._on_silent(silent)
                return
            try:
                self._ping()
            except Exception:  # a ping that cannot even be sent is silence too; the timeout decides
                log.debug("ping failed", exc_info=True)
