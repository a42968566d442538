"""The remote backend: any OpenAI-compatible server (another 1bit, vLLM, llama-server) behind a URL."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator, Callable

import httpx

from onebit.backends.base import BackendError, EngineStats, GenerateRequest, SlotInfo, StatefulBackend
from onebit.backends.heartbeat import Heartbeat
from onebit.backends.remote_protocol import (StreamState, completion_body, error_from_body, final_delta, parse_chunk,
                                             sse_lines)
from onebit.protocol import RequestError, StepDelta

log = logging.getLogger(__name__)

_LOADING_WAIT_S = 300.0  # how long start() waits for a peer that says it is still loading


class RemoteBackend(StatefulBackend):
    """Proxies requests to `url`'s /v1/completions with streaming, `capacity` at a time.

    The prompt goes as token ids (`prompt_mode="ids"`: the peer must serve the same
    tokenizer) or as text (`"text"`). Each request streams on its own HTTP connection;
    leaving a stream early closes it, which aborts the request on the peer. A peer
    error, a dropped connection, or a stream that ends without its finish and [DONE]
    is a BackendError, never a clean end. The peer's /health is probed every
    `health_interval` s; a refused connection or `health_timeout` s without an
    answer marks the backend down (its streams fail), and `start()` brings it back.
    """

    kind = "remote"

    def __init__(self, url: str, name: str, capacity: int = 16, *, prompt_mode: str = "ids",
                 model: str | None = None, api_key: str | None = None,
                 on_state_change: Callable[[], None] | None = None,
                 health_interval: float = 2.0, health_timeout: float = 30.0, connect_timeout: float = 5.0,
                 body_defaults: dict | None = None):
        if prompt_mode not in ("ids", "text"):
            raise ValueError("prompt_mode is 'ids' or 'text'")
        if capacity < 1:
            raise ValueError("a remote backend needs at least 1 slot")
        self.url = url.rstrip("/")
        self.name = name
        self.capacity = capacity
        self.prompt_mode = prompt_mode
        self.model = model
        self.on_state_change = on_state_change
        self.n_ctx: int | None = None
        self.last_error: str | None = None
        self._api_key = api_key
        self.body_defaults = dict(body_defaults or {})  # fields a peer needs spelled out (its defaults differ)
        self.ids_from_logprobs = False  # llama-server: ask greedy streams for logprobs to learn the token ids
        self._connect_timeout = connect_timeout
        self._state = "stopped"
        self._client: httpx.AsyncClient | None = None
        self._streams: dict[str, tuple[asyncio.Queue, asyncio.Task, SlotInfo]] = {}
        self._has_health = True
        self._probe: asyncio.Task | None = None
        self._heartbeat = Heartbeat(self._send_probe, self._on_silent, health_interval, health_timeout)

    # ---- lifecycle -------------------------------------------------------

    def _new_client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        timeout = httpx.Timeout(connect=self._connect_timeout, read=None, write=30.0, pool=None)
        limits = httpx.Limits(max_connections=self.capacity + 4, max_keepalive_connections=self.capacity + 4)
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, limits=limits)

    async def start(self) -> None:
        """Wait for the peer to be healthy and learn its model name and context size.

        A refused connection fails at once (the supervisor retries with backoff); a
        peer that answers "loading" (503) is waited for.
        """
        if self._client is not None:
            await self._client.aclose()
        self._client = self._new_client()
        self._set_state("loading")
        try:
            await self._wait_healthy()
            await self._read_models()
        except (httpx.HTTPError, BackendError, ValueError) as error:
            self.last_error = f"{self.url}: {error}"
            self._set_state("down")
            raise BackendError(self.last_error) from None
        self.last_error = None
        self._heartbeat.start()
        self._set_state("ready")
        log.info("%s ready: %s, model %s, context %s, %d slots", self.name, self.url, self.model, self.n_ctx,
                 self.capacity)

    async def _wait_healthy(self) -> None:
        deadline = asyncio.get_running_loop().time() + _LOADING_WAIT_S
        while True:
            resp = await self._client.get("/health", timeout=self._connect_timeout)
            if resp.status_code == 404:  # a peer without /health: /v1/models decides
                self._has_health = False
                return
            if resp.status_code == 200:
                return
            if resp.status_code != 503 or asyncio.get_running_loop().time() > deadline:
                raise BackendError(f"/health answered HTTP {resp.status_code}")
            await asyncio.sleep(0.5)

    async def _read_models(self) -> None:
        resp = await self._client.get("/v1/models", timeout=self._connect_timeout)
        if resp.status_code != 200:
            raise BackendError(f"/v1/models answered HTTP {resp.status_code}")
        models = resp.json().get("data") or []
        entry = next((m for m in models if m.get("id") == self.model), models[0] if models else {})
        if self.model is None:
            self.model = entry.get("id")
        self.n_ctx = entry.get("max_model_len") or entry.get("meta", {}).get("n_ctx_train") or self.n_ctx

    async def stop(self) -> None:
        """Fail in-flight streams and close the connections."""
        self._heartbeat.stop()
        self._fail_all(BackendError("server is shutting down"))
        self._set_state("stopped")
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- health --------------------------------------------------------------

    def _send_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._run_probe())

    async def _run_probe(self) -> None:
        try:
            resp = await self._client.get("/health" if self._has_health else "/v1/models",
                                          timeout=self._heartbeat.timeout)
        except httpx.ConnectError as error:
            self._mark_down(f"connection refused ({error})")
            return
        except (httpx.HTTPError, AttributeError):  # a timeout: let the heartbeat's clock decide
            return
        if resp.status_code == 200:
            self._heartbeat.heard()

    def _on_silent(self, seconds: float) -> None:
        self._mark_down(f"no healthy answer for {seconds:.0f}s")

    def mark_down(self, reason: str) -> None:
        """The peer is gone (its owner knows): fail its streams and go "down" (only from "ready")."""
        self._mark_down(reason)

    def _mark_down(self, reason: str) -> None:
        if self._state != "ready":
            return
        self.last_error = f"{self.url}: {reason}"
        log.error("%s is down: %s", self.name, self.last_error)
        self._heartbeat.stop()
        self._fail_all(BackendError(f"backend {self.name} went down: {reason}"))
        self._set_state("down")

    def _fail_all(self, error: BackendError) -> None:
        for queue, task, _ in self._streams.values():
            task.cancel()
            queue.put_nowait(error)
        self._streams.clear()

    # ---- requests ----------------------------------------------------------

    async def _pump(self, request: GenerateRequest, queue: asyncio.Queue, slot: SlotInfo) -> None:
        """Read the peer's SSE stream into `queue`: deltas, then the finished delta or an exception."""
        state = StreamState(request.request_id)
        done = False
        try:
            body = {**self.body_defaults, **completion_body(request, self.model, self.prompt_mode, self.n_ctx)}
            if body.get("temperature") == 0 and body.get("top_k") == 0:
                # Greedy either way, but a peer told to keep every candidate (llama-server with top_k 0)
                # runs its whole sampler chain over the full vocabulary for every token of every slot.
                body["top_k"] = 1
            hidden_ids = self.ids_from_logprobs and body.get("top_k") == 1 and "logprobs" not in body
            if hidden_ids:
                # llama-server streams token ids only inside logprobs; after the sampler chain a greedy
                # request has one candidate, so asking for it costs nothing. The ids let the request
                # migrate if this peer dies mid-stream; the client, who asked for no logprobs, gets none.
                body.update(logprobs=1, post_sampling_probs=True)
            async with self._client.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    raise error_from_body(resp.status_code, await resp.aread())
                async for line in sse_lines(resp.aiter_bytes()):
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    delta = parse_chunk(state, json.loads(data))
                    if delta is not None and hidden_ids:
                        delta.logprobs = None
                    if delta is not None:
                        slot.n_decoded = state.tokens
                        queue.put_nowait(delta)
            if not done or state.finish_reason is None:
                raise BackendError(f"the stream from {self.url} ended before the request finished")
            queue.put_nowait(final_delta(state, len(request.prompt_token_ids)))
        except RequestError as error:  # a BackendError, or the peer refused the client's input
            queue.put_nowait(error)
        except httpx.ConnectError as error:
            queue.put_nowait(BackendError(f"cannot reach {self.url}: {error}"))
            self._mark_down(f"connection refused ({error})")
        except (httpx.HTTPError, ValueError) as error:
            queue.put_nowait(BackendError(f"the stream from {self.url} broke: {type(error).__name__}: {error}"))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StepDelta]:
        """Stream the request's deltas from the peer; leaving early closes the connection (aborts it there)."""
        rid = request.request_id
        self._check_admissible(rid, self._streams)
        queue: asyncio.Queue = asyncio.Queue()
        slot = SlotInfo(id=-1, backend=self.name, is_processing=True, request_id=rid,
                        n_prompt_tokens=len(request.prompt_token_ids))
        task = asyncio.get_running_loop().create_task(self._pump(request, queue, slot))
        entry = (queue, task, slot)
        self._streams[rid] = entry
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if self._streams.get(rid) is entry:
                del self._streams[rid]
            if not task.done():
                task.cancel()  # closes the connection, which aborts the request on the peer

    async def abort(self, request_id: str) -> None:
        """Close the request's connection; the peer aborts it."""
        entry = self._streams.pop(request_id, None)
        if entry is not None:
            entry[1].cancel()
            entry[0].put_nowait(BackendError("aborted"))

    def slots(self) -> list[SlotInfo]:
        """`capacity` slots: the requests this server has in flight there, then idle ones."""
        busy = [entry[2] for entry in self._streams.values()]
        out = []
        for i in range(self.capacity):
            slot = busy[i] if i < len(busy) else SlotInfo(id=i, backend=self.name, is_processing=False)
            slot.id = i
            out.append(slot)
        return out

    def stats(self) -> EngineStats:
        """What this server knows: how many of its requests the peer is serving."""
        return EngineStats(num_running=len(self._streams))

    def info(self) -> dict:
        """What /props shows about this backend."""
        info = super().info()
        info.update(device=self.url, url=self.url, model=self.model, n_ctx=self.n_ctx, prompt=self.prompt_mode)
        if self.last_error:
            info["error"] = self.last_error
        return info
