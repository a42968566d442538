"""The native backend: our engine in a worker process, driven over a pipe from the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import multiprocessing as mp
import os
from typing import AsyncIterator, Callable

from onebit.backends.base import BackendError, EngineStats, GenerateRequest, SlotInfo, StatefulBackend, coalesced
from onebit.backends.heartbeat import Heartbeat
from onebit.backends.native_worker import worker_main
from onebit.backends.pipe_writer import PipeWriter
from onebit.backends.step_wire import unpack_deltas, unpack_slots
from onebit.engine.config import EngineConfig
from onebit.protocol import RequestError, StepDelta, from_wire

__all__ = ["NativeBackend"]

log = logging.getLogger(__name__)

_STOP_GRACE_S = 5.0


class NativeBackend(StatefulBackend):
    """Runs an LLMEngine in a spawned worker process (own GIL, owns the device).

    The worker sends one message per engine step with every request's delta; the
    front reads the pipe from the event loop and feeds per-request queues. A worker
    that exits is noticed at once (EOF on the pipe); one that stops answering pings
    for `health_timeout` seconds is killed. Either way the backend goes "down", and
    `start()` spawns a fresh worker.

    `load_gate`: backends sharing one GPU share one lock, so they load one after the
    other and each sizes its KV pool from what the previous one left free.
    """

    kind = "native"
    _ids = itertools.count()

    def __init__(self, config: EngineConfig, name: str | None = None,
                 on_state_change: Callable[[], None] | None = None, *,
                 load_gate: asyncio.Lock | None = None, health_interval: float = 2.0,
                 health_timeout: float = 30.0):
        self.config = config
        self.name = name or f"native-{next(self._ids)}"
        self.capacity = config.parallel
        self.on_state_change = on_state_change
        self.model_info: dict = {}
        self.last_error: str | None = None
        self.restarts = 0
        self._load_gate = load_gate
        self._state = "stopped"
        self._process = None
        self._conn = None
        self._writer: PipeWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._stats = EngineStats()
        self._slots = self._idle_slots()
        self._packed_slots: list[tuple] | None = None  # the worker's last report, unpacked when asked for
        self._heartbeat = Heartbeat(lambda: self._writer.send(("ping",)), self._on_silent,
                                    health_interval, health_timeout)

    # ---- lifecycle -------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The worker's process id, while it runs."""
        return self._process.pid if self._process is not None else None

    def _idle_slots(self) -> list[SlotInfo]:
        return [SlotInfo(id=i, backend=self.name, is_processing=False) for i in range(self.capacity)]

    async def start(self) -> None:
        """Spawn the worker and wait until the model is loaded; raise BackendError on failure.

        Also restarts a backend that went down (the dead worker is reaped first).
        """
        if self._process is not None:
            await self._shutdown_worker()
        if self.model_info:
            self.restarts += 1
        self.last_error = None
        self._set_state("loading")
        if self._load_gate is None:
            await self._spawn_and_wait()
        else:
            async with self._load_gate:
                await self._spawn_and_wait()
        self._pin_kv_budget()
        self._heartbeat.start()
        self._set_state("ready")
        log.info("%s ready: %s", self.name, self.model_info)

    async def _spawn_and_wait(self) -> None:
        # Started from the event loop (main) thread: PR_SET_PDEATHSIG fires when the
        # *thread* that forked the child exits, so never start it from a helper thread.
        self._loop = asyncio.get_running_loop()
        ctx = mp.get_context("spawn")
        front_conn, worker_conn = ctx.Pipe(duplex=True)
        self._process = ctx.Process(target=worker_main, args=(self.config, worker_conn, os.getpid()),
                                    name=f"onebit-{self.name}", daemon=True)
        self._process.start()
        worker_conn.close()  # so that the worker's death reads as EOF here
        self._conn = front_conn
        self._writer = PipeWriter(front_conn)
        self._ready = self._loop.create_future()
        self._loop.add_reader(front_conn.fileno(), self._on_readable)
        try:
            self.model_info = await self._ready
        except BaseException:
            await self._shutdown_worker()
            self._set_state("down")
            raise

    def _pin_kv_budget(self) -> None:
        """On a GPU, keep the KV pool this load got, so a restart gets the same and still fits."""
        size = self.model_info.get("kv_cache_bytes")
        if self.config.kv_cache_memory is None and size and str(self.model_info.get("device", "")).startswith("cuda"):
            self.config = dataclasses.replace(self.config, kv_cache_memory=size)

    async def stop(self) -> None:
        """Fail in-flight streams, tell the worker to stop, and reap it."""
        self._heartbeat.stop()
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
        if process is not None:
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
        if self._state == "ready":
            self._heartbeat.heard()
        kind = message[0]
        if kind == "step":
            _, packed, stats, slots = message
            if stats is not None:
                self._stats = stats
                self._packed_slots = slots
            for delta in unpack_deltas(packed):
                stream = self._streams.get(delta.request_id)
                if stream is not None:
                    stream.put_nowait(delta)
        elif kind == "rejected":
            stream = self._streams.get(message[1])
            if stream is not None:
                stream.put_nowait(from_wire(message[2]))  # the engine's own exception type, rebuilt
        elif kind == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message[1])
        elif kind == "load_error":
            self.last_error = message[1]
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(BackendError(message[1]))

    def _on_silent(self, seconds: float) -> None:
        """The worker answered nothing for too long: kill it; its EOF marks the backend down."""
        self.last_error = f"engine worker stopped answering ({seconds:.0f}s without a reply)"
        log.error("%s: %s; killing it", self.name, self.last_error)
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    def _on_worker_exit(self) -> None:
        self._detach_reader()
        self._heartbeat.stop()
        code = self._process.exitcode if self._process is not None else None
        reason = f"engine worker exited (exit code {code})" if code is not None else "engine worker exited"
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(BackendError(self.last_error or reason))
        if self._state in ("ready", "loading"):
            log.error("%s: %s", self.name, reason)
            self.last_error = self.last_error or reason
            self._fail_all(BackendError(reason))
            self._slots, self._packed_slots = self._idle_slots(), None
            self._set_state("down")

    def _fail_all(self, error: BackendError) -> None:
        for stream in self._streams.values():
            stream.put_nowait(error)
        self._streams.clear()

    # ---- requests ----------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StepDelta]:
        """Stream the request's deltas; leaving early aborts it in the engine."""
        request_id = request.request_id
        self._check_admissible(request_id, self._streams)
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        self._writer.send(("add", request_id, request.prompt_token_ids, request.params, request.user,
                           request.priority, request.resumed))
        finished = False
        try:
            async for item in coalesced(stream):
                finished = item.finished
                yield item
        except RequestError:  # from the queue: the engine no longer holds it (rejected, or the worker died)
            finished = True
            raise
        finally:
            if self._streams.get(request_id) is stream:
                del self._streams[request_id]
            if not finished and self._state == "ready":
                self._writer.send(("abort", request_id))

    async def abort(self, request_id: str) -> None:
        """Ask the engine to drop the request; its final delta still arrives."""
        if self._state == "ready":
            self._writer.send(("abort", request_id))

    def slots(self) -> list[SlotInfo]:
        """Slots as of the worker's last report."""
        if self._packed_slots is not None:
            self._slots, self._packed_slots = unpack_slots(self._packed_slots, self.name), None
        return list(self._slots)

    def stats(self) -> EngineStats:
        """Engine counters as of the last engine step."""
        return self._stats

    def info(self) -> dict:
        """What /props shows about this backend."""
        info = super().info()
        info.update(device=self.model_info.get("device", self.config.device), pid=self.pid,
                    n_ctx=self.model_info.get("ctx_size"), restarts=self.restarts,
                    kv_cache_bytes=self.model_info.get("kv_cache_bytes"))
        if self.config.adaptive_at is not None:  # one engine serving --adaptive: drafting up to this many
            info["adaptive_at"] = self.config.adaptive_at
        if self.last_error:
            info["error"] = self.last_error
        return info
