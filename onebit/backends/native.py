"""The native backend: our engine in a worker process, driven over a pipe from the event loop."""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import queue
import threading
from typing import AsyncIterator, Callable

from onebit.backends.base import Backend, BackendError, EngineStats, GenerateRequest, SlotInfo
from onebit.backends.native_worker import worker_main
from onebit.engine.config import EngineConfig
from onebit.engine.outputs import StepDelta

log = logging.getLogger(__name__)

_STOP_GRACE_S = 5.0


class RequestRejected(BackendError):
    """The engine refused a request before running it (bad input, prompt too long).

    `details` holds "type", "message" and, when known, "param", "n_prompt_tokens", "n_ctx".
    """

    def __init__(self, details: dict):
        super().__init__(details.get("message", "request rejected"))
        self.details = details


class _PipeWriter:
    """Sends commands from a thread so a full pipe never blocks the event loop."""

    def __init__(self, conn):
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="onebit-pipe-writer", daemon=True)
        self._thread.start()

    def send(self, message) -> None:
        """Queue a message for the worker."""
        self._queue.put(message)

    def close(self) -> None:
        """Stop the thread after the queued messages are sent."""
        self._queue.put(None)

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the worker is gone; the reader reports it
                return


class NativeBackend(Backend):
    """Runs an LLMEngine in a spawned worker process (own GIL, owns the device).

    The worker sends one message per engine step with every request's delta; the
    front reads the pipe from the event loop and feeds per-request queues.
    """

    kind = "native"
    _ids = itertools.count()

    def __init__(self, config: EngineConfig, name: str | None = None,
                 on_state_change: Callable[[], None] | None = None):
        self.config = config
        self.name = name or f"native-{next(self._ids)}"
        self.capacity = config.parallel
        self.on_state_change = on_state_change
        self.model_info: dict = {}
        self.last_error: str | None = None
        self._state = "stopped"
        self._process = None
        self._conn = None
        self._writer: _PipeWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._stats = EngineStats()
        self._slots = [SlotInfo(id=i, backend=self.name, is_processing=False) for i in range(self.capacity)]

    # ---- lifecycle -------------------------------------------------------

    @property
    def state(self) -> str:
        """One of "loading", "ready", "down", "stopped"."""
        return self._state

    @property
    def pid(self) -> int | None:
        """The worker's process id, while it runs."""
        return self._process.pid if self._process is not None else None

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            if self.on_state_change is not None:
                self.on_state_change()

    async def start(self) -> None:
        """Spawn the worker and wait until the model is loaded; raise BackendError on failure."""
        # Started from the event loop (main) thread: PR_SET_PDEATHSIG fires when the
        # *thread* that forked the child exits, so never start it from a helper thread.
        self._loop = asyncio.get_running_loop()
        ctx = mp.get_context("spawn")
        front_conn, worker_conn = ctx.Pipe(duplex=True)
        self._process = ctx.Process(target=worker_main, args=(self.config, worker_conn, os.getpid()),
                                    name=f"onebit-{self.name}", daemon=True)
        self._set_state("loading")
        self._process.start()
        worker_conn.close()  # so that the worker's death reads as EOF here
        self._conn = front_conn
        self._writer = _PipeWriter(front_conn)
        self._ready = self._loop.create_future()
        self._loop.add_reader(front_conn.fileno(), self._on_readable)
        try:
            self.model_info = await self._ready
        except BaseException:
            await self._shutdown_worker()
            self._set_state("down")
            raise
        self._set_state("ready")
        log.info("%s ready: %s", self.name, self.model_info)

    async def stop(self) -> None:
        """Fail in-flight streams, tell the worker to stop, and reap it."""
        if self._process is None:
            self._set_state("stopped")
            return
        self._fail_all(BackendError("server is shutting down"))
        self._set_state("stopped")
        await self._shutdown_worker()

    async def _shutdown_worker(self) -> None:
        process, self._process = self._process, None
        if self._writer is not None:
            self._writer.send(("stop",))
            self._writer.close()
        self._detach_reader()
        if process is None:
            return
        deadline = asyncio.get_running_loop().time() + _STOP_GRACE_S
        while process.is_alive() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if process.is_alive():
            process.kill()
            await asyncio.sleep(0.05)
        process.join(timeout=1.0)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _detach_reader(self) -> None:
        if self._conn is not None and self._loop is not None and not self._conn.closed:
            self._loop.remove_reader(self._conn.fileno())

    # ---- the pipe ------------------------------------------------------------

    def _on_readable(self) -> None:
        """Drain every complete message the worker sent (runs on the event loop)."""
        conn = self._conn
        try:
            while conn is not None and not conn.closed and conn.poll():
                self._handle(conn.recv())
        except (EOFError, OSError):
            self._on_worker_exit()

    def _handle(self, message) -> None:
        kind = message[0]
        if kind == "step":
            _, deltas, self._stats, slots = message
            for slot in slots:
                slot.backend = self.name
            self._slots = slots
            for delta in deltas:
                stream = self._streams.get(delta.request_id)
                if stream is not None:
                    stream.put_nowait(delta)
        elif kind == "rejected":
            stream = self._streams.get(message[1])
            if stream is not None:
                stream.put_nowait(RequestRejected(message[2]))
        elif kind == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message[1])
        elif kind == "load_error":
            self.last_error = message[1]
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(BackendError(message[1]))

    def _on_worker_exit(self) -> None:
        self._detach_reader()
        code = self._process.exitcode if self._process is not None else None
        reason = f"engine worker exited (exit code {code})" if code is not None else "engine worker exited"
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(BackendError(self.last_error or reason))
        if self._state in ("ready", "loading"):
            log.error("%s: %s", self.name, reason)
            self._fail_all(BackendError(reason))
            self._slots = [SlotInfo(id=i, backend=self.name, is_processing=False) for i in range(self.capacity)]
            self._set_state("down")

    def _fail_all(self, error: BackendError) -> None:
        for stream in self._streams.values():
            stream.put_nowait(error)
        self._streams.clear()

    # ---- requests ----------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StepDelta]:
        """Stream the request's deltas; leaving early aborts it in the engine."""
        if self._state != "ready":
            raise BackendError(f"backend {self.name} is {self._state}")
        rid = request.request_id
        if rid in self._streams:
            raise BackendError(f"duplicate request id {rid}")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = stream
        self._writer.send(("add", rid, request.prompt_token_ids, request.params))
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine no longer holds it (rejected, or the worker died)
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if self._streams.get(rid) is stream:
                del self._streams[rid]
            if not finished and self._state == "ready":
                self._writer.send(("abort", rid))

    async def abort(self, request_id: str) -> None:
        """Ask the engine to drop the request; its final delta still arrives."""
        if self._state == "ready":
            self._writer.send(("abort", request_id))

    def slots(self) -> list[SlotInfo]:
        """Slots as of the last engine step."""
        return list(self._slots)

    def stats(self) -> EngineStats:
        """Engine counters as of the last engine step."""
        return self._stats

    def info(self) -> dict:
        """What /props shows about this backend."""
        info = super().info()
        info.update(device=self.model_info.get("device", self.config.device), pid=self.pid,
                    n_ctx=self.model_info.get("max_model_len"))
        if self.last_error:
            info["error"] = self.last_error
        return info
