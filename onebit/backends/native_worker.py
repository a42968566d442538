"""The engine worker process: owns the device, runs engine steps, talks over one pipe.

Messages in (front -> worker): ("add", request_id, prompt_token_ids, params, user, priority, resumed or None),
("abort", request_id), ("ping",), ("stop",).
Messages out (worker -> front): ("ready", info), ("load_error", message),
("rejected", request_id, error.to_wire()), ("step", deltas, stats, slots), ("pong",).
A step's deltas and slots travel packed as tuples (`onebit.backends.step_wire`); stats and slots
are None on most steps (see serve_engine).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from multiprocessing.connection import Connection

from onebit.backends.step_wire import pack_deltas, pack_slots
from onebit.engine.config import EngineConfig
from onebit.protocol import InternalError, RequestError

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (kill -9 included)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The parent may have died before prctl took effect.
    if os.getppid() != parent_pid:
        os._exit(1)


def _rejection(error: Exception) -> dict:
    """Why add_request refused a request, as plain data the front turns back into the same
    exception type (`onebit.protocol.from_wire`); anything but a RequestError is our bug: internal."""
    if not isinstance(error, RequestError):
        log.exception("add_request failed")
        error = InternalError(f"{type(error).__name__}: {error}")
    return error.to_wire()


def load_engine(config: EngineConfig):
    """Build the engine of `config` as the worker process does (on the CPU with one math thread fewer
    than cores, the one left to the HTTP front, unless OMP_NUM_THREADS is set); benchmarks that drive
    the engine straight call it to measure the engine the server runs."""
    import torch  # heavy: imported in the worker only

    from onebit.engine.build import build_engine

    on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    if on_cpu and "OMP_NUM_THREADS" not in os.environ:
        # Leave one core to the HTTP front: spinning math threads on every core starve the
        # process that streams the tokens (measured on 2 cores: 353 -> 669 tok/s at 4 streams).
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    return build_engine(config)


REPORT_INTERVAL_S = 0.05
# A file path here makes the worker run its step loop under cProfile and write the profile there
# when it stops: where a served step's host time goes (bench/gpu_host_overhead.sh PROFILE=1).
PROFILE_ENV = "ONEBIT_WORKER_PROFILE"


def serve_engine(engine, conn: Connection) -> None:
    """Run the step loop until "stop" or the pipe closes (the front went away)."""
    last_report = 0.0
    while True:
        busy = engine.has_unfinished()
        # Block for commands only when there is nothing to step.
        while not busy or conn.poll(0):
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "add":
                _, request_id, prompt_token_ids, params, *rest = message
                user, priority, resumed = (list(rest) + ["anonymous", 0, None][len(rest):])[:3]
                try:
                    engine.add_request(request_id, prompt_token_ids, params, user=user, priority=priority,
                                       resumed=resumed)
                except Exception as error:  # a bad request must never kill the worker
                    conn.send(("rejected", request_id, _rejection(error)))
            elif kind == "abort":
                engine.abort(message[1])
            elif kind == "ping":
                conn.send(("pong",))
            elif kind == "stop":
                return
            busy = engine.has_unfinished()
        deltas = engine.step()
        # Stats and slots cost a pickle of every slot per step: send them when a request ends
        # (so /metrics is exact after a response) or every REPORT_INTERVAL_S, else only the deltas.
        now = time.monotonic()
        if now - last_report >= REPORT_INTERVAL_S or any(d.finished for d in deltas):
            conn.send(("step", pack_deltas(deltas), engine.stats(), pack_slots(engine.slots())))
            last_report = now
        else:
            conn.send(("step", pack_deltas(deltas), None, None))


def _kv_info(engine) -> dict:
    """The KV pool this engine got, so the front can log it and keep it across restarts."""
    try:
        blocks = engine.scheduler.num_blocks
        # The whole budget (MTP layer and draft pool included), so a restart sizes the same pool.
        return {"kv_cache_blocks": blocks, "kv_cache_bytes": blocks * engine.kv_bytes_per_block}
    except (AttributeError, TypeError):  # an engine without a paged pool: nothing to report
        return {}


def serve_engine_profiled(engine, conn: Connection, path: str) -> None:
    """serve_engine under cProfile; the profile is written to `path` however the loop ends
    (`ONEBIT_WORKER_PROFILE`, and bench/host_profile.py's timed worker)."""
    import cProfile

    profiler = cProfile.Profile()
    try:
        profiler.runcall(serve_engine, engine, conn)
    finally:
        profiler.dump_stats(path)


def worker_main(config: EngineConfig, conn: Connection, parent_pid: int) -> None:
    """Process entry point: load the engine, report, then serve until told to stop."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the front, which stops us
    logging.basicConfig(level=logging.INFO, format="%(levelname)s worker: %(message)s")
    try:
        engine = load_engine(config)
    except Exception as error:
        log.debug("load failed", exc_info=True)
        conn.send(("load_error", f"{type(error).__name__}: {error}"))
        return
    info = {
        "ctx_size": engine.ctx_size,
        "device": str(engine.device),
        "pid": os.getpid(),
        "vocab_size": getattr(engine.tokenizer, "vocab_size", None),
        **_kv_info(engine),
    }
    conn.send(("ready", info))
    try:
        if os.environ.get(PROFILE_ENV):
            serve_engine_profiled(engine, conn, os.environ[PROFILE_ENV])
        else:
            serve_engine(engine, conn)
    except (BrokenPipeError, EOFError):
        pass
    finally:
        summary = getattr(engine, "step_summary", None)
        if summary is not None:
            log.info("%s", summary())
