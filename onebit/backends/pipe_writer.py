"""Send messages down a multiprocessing pipe from a thread, so a full pipe never blocks the event loop."""

from __future__ import annotations

import queue
import threading


class PipeWriter:
    """Queues messages and sends them from a daemon thread, in order."""

    def __init__(self, conn, name: str = "onebit-pipe-writer"):
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, message) -> None:
        """Queue a message for the other end."""
        self._queue.put(message)

    def close(self) -> None:
        """Stop the thread after the queued messages are sent."""
        self._queue.put(None)

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the other end is gone; the reader reports it
                return
