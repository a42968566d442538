"""The llama-server backend: a llama.cpp build started, watched, restarted and stopped by 1bit.

Requests travel through the remote backend's OpenAI proxying (held, not copied); this module
owns the child's life and merges its figures (/props, /slots, /metrics) into ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import AsyncIterator, Callable

import httpx

from onebit.backends.base import BackendError, EngineStats, GenerateRequest, SlotInfo, StatefulBackend
from onebit.backends.heartbeat import Heartbeat
from onebit.backends.llama_server_child import LlamaServerChild, check_binary, draft_flags
from onebit.backends.remote import RemoteBackend
from onebit.engine.outputs import SpecStats, StepDelta

log = logging.getLogger(__name__)
# httpx logs every request at INFO: the child's figures are read every few seconds.
logging.getLogger("httpx").setLevel(logging.WARNING)

# llama-server's own defaults differ from OpenAI's (top_k 40, min_p 0.05): say "off" explicitly.
_BODY_DEFAULTS = {"top_k": 0, "min_p": 0.0}
_FIGURES = ("requests_processing", "requests_deferred", "prompt_tokens_total", "tokens_predicted_total",
            "n_decode_total", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")


def parse_metrics(text: str) -> dict[str, float]:
    """llama-server's Prometheus text -> {name without the `llamacpp:` prefix: value}."""
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[name[len("llamacpp:"):]] = float(value)
    return out


class LlamaServerBackend(StatefulBackend):
    """A llama-server child with `capacity` slots serving the GGUF `model`.

    The child gets -m, --parallel, --ctx-size (`ctx_per_slot` x slots: llama-server splits its
    context evenly over its slots), `extra_args`, and the MTP flags its build spells (`mtp`: a head
    GGUF, "" for the model's own, None for none). Its /slots and /metrics are read every
    `health_interval` s; `health_timeout` s without an answer means hung: it is killed. A child
    that exits (or is killed) fails its streams and marks the backend "down"; the router's
    supervisor calls `start()` again, with backoff, which starts a fresh child.
    """

    kind = "llama-server"

    def __init__(self, binary: str, model: str, name: str, capacity: int, *, ctx_per_slot: int | None = None,
                 extra_args: list[str] | None = None, mtp: str | None = None, draft_max: int | None = None,
                 on_state_change: Callable[[], None] | None = None, health_interval: float = 2.0,
                 health_timeout: float = 30.0, load_timeout: float = 600.0, log_dir: str | None = None):
        check_binary(binary)
        if not Path(model).is_file():
            raise ValueError(f"backend {name}: the GGUF model {model} does not exist")
        self.binary = str(Path(binary).resolve())
        self.model = model
        self.name = name
        self.capacity = capacity
        self.on_state_change = on_state_change
        self.restarts = 0
        self.last_error: str | None = None
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"onebit-{name}-{os.getpid()}.log"
        command = [self.binary, "-m", model, "--parallel", str(capacity), "--metrics", "--slots"]
        if ctx_per_slot:
            command += ["--ctx-size", str(ctx_per_slot * capacity)]
        if mtp is not None:
            command += draft_flags(self.binary, mtp, draft_max)
        self.command = command + list(extra_args or [])
        self._health_timeout = health_timeout
        self._health_interval = health_interval
        self._load_timeout = load_timeout
        self._state = "stopped"
        self._child: LlamaServerChild | None = None
        self._remote: RemoteBackend | None = None
        self._watch: asyncio.Task | None = None
        self._poll: asyncio.Task | None = None
        self._props: dict = {}
        self._figures: dict[str, float] = {}
        self._child_slots: list[dict] = []
        self._heartbeat = Heartbeat(self._send_poll, self._on_silent, health_interval, health_timeout)

    # ---- lifecycle -------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return self._child.pid if self._child is not None else None

    async def start(self) -> None:
        """Start a fresh child (after ending any earlier one) and return once it serves."""
        await self._end_child()
        if self._props:
            self.restarts += 1
        self._set_state("loading")
        child = self._child = LlamaServerChild(self.command, self.log_path)
        log.info("%s: starting llama-server (%s); its log: %s", self.name, self.binary, self.log_path)
        try:
            await child.spawn()
            await child.wait_healthy(self._load_timeout)
            self._remote = RemoteBackend(child.url, self.name, self.capacity, api_key=child.api_key,
                                         on_state_change=self._on_remote_state, health_interval=self._health_interval,
                                         health_timeout=self._health_timeout, body_defaults=_BODY_DEFAULTS)
            self._remote.ids_from_logprobs = True  # token ids, so that a stream can migrate
            await self._remote.start()
            await self._read_figures(props=True)
        except (OSError, BackendError, httpx.HTTPError, ValueError) as error:
            self.last_error = str(error)
            await self._end_child()
            self._set_state("down")
            raise BackendError(f"{self.name}: {error}") from None
        self.last_error = None
        self._watch = asyncio.get_running_loop().create_task(self._watch_exit(child))
        self._heartbeat.start()
        self._set_state("ready")
        log.info("%s ready: pid %s, %s, %d slots of %s tokens", self.name, child.pid, child.url, self.capacity,
                 self.n_ctx)

    async def stop(self) -> None:
        """Fail in-flight streams and end the child."""
        await self._end_child()
        self._set_state("stopped")

    async def _end_child(self) -> None:
        self._heartbeat.stop()
        for task in (self._watch, self._poll):
            if task is not None and not task.done():
                task.cancel()
        remote, self._remote = self._remote, None
        if remote is not None:
            remote.on_state_change = None
            await remote.stop()
        child, self._child = self._child, None
        if child is not None:
            await child.stop()

    async def _watch_exit(self, child: LlamaServerChild) -> None:
        code = await child.proc.wait()
        if child is not self._child or self._state != "ready":
            return
        reason = self.last_error or f"llama-server exited with code {code}"
        self.last_error = f"{reason}; its log: {self.log_path}"
        log.error("%s: %s\n%s", self.name, self.last_error, child.log_tail())
        self._heartbeat.stop()
        if self._remote is not None:
            self._remote.mark_down(reason)
        self._set_state("down")

    def _on_remote_state(self) -> None:
        """The proxy found the child unreachable or silent: kill it; its exit marks us down."""
        if self._remote is not None and self._remote.state == "down" and self._state == "ready":
            self.last_error = self._remote.last_error
            self._child.kill()

    # ---- the child's figures -------------------------------------------------

    def _send_poll(self) -> None:
        if self._poll is None or self._poll.done():
            self._poll = asyncio.get_running_loop().create_task(self._poll_once())

    async def _poll_once(self) -> None:
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            await self._read_figures()
            self._heartbeat.heard()

    async def _read_figures(self, props: bool = False) -> None:
        """Read the child's /slots and /metrics (and /props at start-up)."""
        child = self._child
        headers = {"Authorization": f"Bearer {child.api_key}"}
        async with httpx.AsyncClient(base_url=child.url, headers=headers, timeout=self._health_timeout) as http:
            if props:
                resp = await http.get("/props")
                resp.raise_for_status()
                self._props = resp.json()
                settings = self._props.get("default_generation_settings") or {}
                if settings.get("n_ctx"):
                    self._remote.n_ctx = int(settings["n_ctx"])  # per slot; /v1/models says the training length
            resp = await http.get("/slots")
            resp.raise_for_status()
            self._child_slots = resp.json()
            resp = await http.get("/metrics")
            if resp.status_code == 200:
                self._figures = parse_metrics(resp.text)

    def _on_silent(self, seconds: float) -> None:
        self.last_error = f"llama-server stopped answering ({seconds:.0f}s without a reply); killed"
        log.error("%s: %s", self.name, self.last_error)
        if self._child is not None:
            self._child.kill()

    # ---- requests ----------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StepDelta]:
        """Stream the request's deltas from the child (through the remote backend's proxying)."""
        remote = self._remote
        if self._state != "ready" or remote is None:
            raise BackendError(f"backend {self.name} is {self._state}")
        async with contextlib.aclosing(remote.generate(request)) as stream:
            async for delta in stream:
                yield delta

    async def abort(self, request_id: str) -> None:
        """Close the request's connection; llama-server stops it."""
        if self._remote is not None:
            await self._remote.abort(request_id)

    def slots(self) -> list[SlotInfo]:
        """`capacity` slots: this server's requests on the child, then idle ones."""
        if self._remote is not None:
            return self._remote.slots()
        return [SlotInfo(id=i, backend=self.name, is_processing=False) for i in range(self.capacity)]

    @property
    def n_ctx(self) -> int | None:
        """Tokens per slot, as the child reports it."""
        return self._remote.n_ctx if self._remote is not None else None

    def stats(self) -> EngineStats:
        """The child's own counters (its /metrics and /slots) under this backend's name."""
        f = self._figures
        busy = sum(1 for s in self._child_slots if s.get("is_processing"))
        extra = {f"llamacpp_{k}": f[k] for k in _FIGURES if k in f}
        extra.update(child_slots=len(self._child_slots), child_slots_processing=busy)
        spec = None
        if f.get("spec_decode_num_draft_tokens_total"):
            spec = SpecStats(draft_tokens=int(f["spec_decode_num_draft_tokens_total"]),
                             accepted_tokens=int(f.get("spec_decode_num_accepted_tokens_total", 0)))
        return EngineStats(num_running=int(f.get("requests_processing", busy)),
                           num_waiting=int(f.get("requests_deferred", 0)), extra=extra, spec=spec)

    def info(self) -> dict:
        """What /props shows about this backend."""
        info = super().info()
        child = self._child
        info.update(device="llama-server", binary=self.binary, model=self.model, pid=self.pid,
                    url=child.url if child else None, n_ctx=self.n_ctx, restarts=self.restarts,
                    log=str(self.log_path), child_total_slots=self._props.get("total_slots"),
                    child_build=self._props.get("build_info"))
        if self.last_error:
            info["error"] = self.last_error
        return info
