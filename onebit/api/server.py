"""Run the app under uvicorn with our shutdown: SIGTERM/Ctrl-C end streams with an error, exit 0."""

from __future__ import annotations

import asyncio
import signal

import uvicorn
from fastapi import FastAPI

from onebit.api.app import begin_shutdown

GRACEFUL_SHUTDOWN_S = 5


class Server(uvicorn.Server):
    """uvicorn's server, which also fails in-flight streams as soon as a stop signal arrives."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        """Serve until told to exit."""
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        """Signal handler: stop accepting, and end running streams now instead of waiting for them."""
        super().handle_exit(sig, frame)
        self.request_exit()

    def request_exit(self) -> None:
        """Ask the server to shut down (safe from any thread or a signal handler)."""
        self.should_exit = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(begin_shutdown, self.config.app)


def make_server(app: FastAPI, host: str, port: int, log_level: str = "info") -> Server:
    """A server for `app` on host:port (access log off: it costs throughput)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, lifespan="on")
    return Server(config)


def run_server(server: Server) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop."""
    # uvicorn re-raises the caught signal once it is done; make that a no-op so we exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    asyncio.run(server.serve())
    return 0
