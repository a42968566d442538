"""llama-server children as backends, end to end with the real CPU build and a tiny GGUF model.

The build comes from `1bit llama-server --build` (`make test` runs it when the cache lacks one).
Without it these tests skip locally with the reason, and FAIL under CI=true: a broken build must
never pass for a green run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import torch
from server_utils import openai_clients, pid_alive, server_props, start_server, stop_server, wait_backends_ready
from kill_mid_stream import completion_body, migrated_requests, run_streams
from test_adaptive_e2e import _streams

from onebit.backends.llama_server_build import BuildPlan, default_cache_dir
from onebit.testing.gguf_export import export_gguf  # the one import of the exporter (it may move to onebit.testing)


@pytest.fixture(scope="session")
def llama_server_bin() -> str:
    """The llama-server to test: $ONEBIT_LLAMA_SERVER, else the cached CPU build."""
    path = Path(os.environ.get("ONEBIT_LLAMA_SERVER") or BuildPlan(default_cache_dir()).binary)
    if not (path.is_file() and os.access(path, os.X_OK)):
        reason = f"no llama-server build at {path}: run `1bit llama-server --build` (make test does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)
    return str(path)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny Qwen3 model as an f32 GGUF (llama.cpp then computes greedy tokens as we do)."""
    return export_gguf(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf", "f32")


def _wait(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# ---- one server: -m GGUF --llama-server PATH ------------------------------------------------------

@pytest.fixture(scope="module")
def server(llama_server_bin, tiny_gguf):
    server = start_server(tiny_gguf, "--llama-server", llama_server_bin, "--parallel", "2", "--ctx-size", "4096",
                          "--alias", "tiny", "--backend-timeout", "10", "--log-level", "info", "--props-show-path")
    try:
        yield server
    finally:
        stop_server(server)


def _reference_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


def test_openai_sdk_streams_and_non_streams_the_reference_tokens(server, tiny_model_dir):
    client, _ = openai_clients(server)
    prompt = [100, 200, 300, 400, 150, 250]
    expected = _reference_greedy(tiny_model_dir, prompt, 12)
    extra = {"ignore_eos": True, "skip_special_tokens": False}
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=1,
                                      extra_body=extra)
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
    assert len(whole.choices[0].logprobs.token_logprobs) == 12
    detok = httpx.post(f"{server.root}/detokenize", json={"tokens": expected}, timeout=10).json()
    assert whole.choices[0].text == detok["content"], expected
    text, usage, finish = "", None, None
    for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body=extra):
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    assert text == whole.choices[0].text and usage.completion_tokens == 12 and finish == "length"
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                          extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 5 and chat.choices[0].message.content


def test_slots_props_and_metrics_show_the_child(server):
    props = server_props(server)
    (backend,) = props["backends"]
    assert (backend["name"], backend["kind"], backend["capacity"], backend["state"]) == (
        "llama-server-0", "llama-server", 2, "ready")
    assert backend["child_total_slots"] == 2 and backend["n_ctx"] == 4096 and props["n_ctx"] == 4096
    assert backend["pid"] in server.children() and Path(backend["log"]).is_file()
    assert str(backend["log"]) in server.log()  # 1bit's log names the child's log file
    slots = httpx.get(f"{server.root}/slots").json()
    assert [(s["backend"], s["id"]) for s in slots] == [("llama-server-0", 0), ("llama-server-0", 1)]
    client, _ = openai_clients(server)
    client.completions.create(model="tiny", prompt="count", max_tokens=7, extra_body={"ignore_eos": True})
    # The child's own counters arrive with its next poll (every 2 s).
    _wait(lambda: server_props(server)["backends"][0]["stats"].get("llamacpp_tokens_predicted_total", 0) >= 7,
          "the child's tokens_predicted counter")
    metrics = httpx.get(f"{server.root}/metrics").text
    assert 'onebit:backend_up{backend="llama-server-0"} 1.0' in metrics
    assert 'onebit:request_success_total{backend="llama-server-0",finished_reason="length"}' in metrics


def test_router_counts_the_childs_slots(server):
    counts, peak = asyncio.run(_streams(server, 5, 200))
    # Every stream completes in full, and no poll of the router's own count ever saw more than the
    # child's 2 slots reserved (a poll can miss the peak when streams are fast, so no lower bound).
    assert counts == [200] * 5 and set(peak) == {"llama-server-0"} and peak["llama-server-0"] <= 2
    assert server_props(server)["backends"][0]["in_flight"] == 0


def test_killed_child_moves_its_stream_to_the_restarted_one(server):
    victim = server_props(server)["backends"][0]["pid"]
    # The only backend dies mid-stream: the stream waits for the restarted child and goes on there.
    (result,) = run_streams(server.root, [completion_body("long story", 1000)], kill=victim)
    assert result.status == 200 and not result.errors and result.done, result.events[-3:]
    assert result.finish_reasons == ["length"] and result.usage["completion_tokens"] == 1000
    backend = _wait(lambda: (b := server_props(server)["backends"][0])["state"] == "ready" and b["pid"] != victim and b,
                    "the restarted child")
    assert backend["restarts"] >= 1 and not pid_alive(victim)
    counts, _ = asyncio.run(_streams(server, 2, 10))
    assert counts == [10, 10]


def test_kill_9_of_1bit_leaves_no_llama_server(server):
    child = wait_backends_ready(server)[0]["pid"]
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    _wait(lambda: not pid_alive(child), "the orphaned llama-server to die", timeout=10)


# ---- a missing or broken binary -------------------------------------------------------------------

def test_missing_binary_is_a_clear_error(tiny_gguf, tmp_path):
    server = start_server(tiny_gguf, "--llama-server", str(tmp_path / "nope" / "llama-server"), wait=False)
    assert server.proc.wait(60) == 1
    assert "does not exist" in server.log() and "1bit llama-server --build" in server.log()
    assert "Traceback" not in server.log()


def test_broken_binary_is_a_clear_error(tiny_gguf, tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'this is not a llama-server build' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = start_server(tiny_gguf, "--llama-server", str(fake), wait=False)
    assert server.proc.wait(60) == 1
    log = server.log()
    assert "exited with code 3 before it was ready" in log and "this is not a llama-server build" in log
    assert "Traceback" not in log


def test_llama_server_without_a_gguf_model_is_a_clear_error(tiny_model_dir, llama_server_bin):
    server = start_server(tiny_model_dir, "--llama-server", str(llama_server_bin), wait=False)
    assert server.proc.wait(60) == 1
    assert "needs a GGUF model" in server.log() and "Traceback" not in server.log()


# ---- --adaptive with llama-server children -------------------------------------------------------

ADAPTIVE = ("--adaptive", "--adaptive-at", "4", "--adaptive-slots", "8", "--device", "cpu", "--ctx-size", "2048",
            "--alias", "tiny", "--backend-timeout", "10")


@pytest.fixture(scope="module", params=["native+llama-server", "llama-server+llama-server"])
def adaptive(request, llama_server_bin, tiny_model_dir, tiny_gguf):
    child = f"llama-server:{llama_server_bin}?gguf={tiny_gguf}&args=-t 1"
    if request.param == "native+llama-server":
        args, names = ("--backend", "native:cpu", "--backend", child), ["native-0", "llama-server-1"]
    else:
        # One token per llama.cpp batch: a stream resumed on the other child recomputes its prompt
        # and output as a prefill, and a batched prefill's sums differ from decoding's in the last
        # bits, enough to flip a near tie within 1,000 greedy tokens (failed once in CI at ~800).
        # Token by token, both children compute every position the same way.
        child += " -ub 1"
        args, names = ("--backend", child, "--backend", child), ["llama-server-0", "llama-server-1"]
    server = start_server(tiny_model_dir, *ADAPTIVE, *args)
    try:
        yield server, names
    finally:
        stop_server(server)


def test_adaptive_twelve_streams_fill_both_backends(adaptive):
    server, names = adaptive
    backends = wait_backends_ready(server)
    assert [(b["name"], b["capacity"]) for b in backends] == [(names[0], 4), (names[1], 8)]
    before = {b["name"]: b["served"] for b in backends}
    # 300 tokens each: a llama-server child is fast enough to finish a shorter request before the
    # burst's last one arrives, which would then find a free primary slot.
    counts, _ = asyncio.run(_streams(server, 12, 300))
    after = {b["name"]: b["served"] for b in server_props(server)["backends"]}
    assert counts == [300] * 12
    # The router's own counts: a request goes on to the overflow only while the primary holds 4, so 8
    # there means the primary was full. (The peak seen by polling /props can miss short requests.)
    assert {name: after[name] - before[name] for name in names} == {names[0]: 4, names[1]: 8}
    metrics = httpx.get(f"{server.root}/metrics").text
    for name in names:
        assert f'onebit:request_success_total{{backend="{name}",finished_reason="length"}}' in metrics


def test_adaptive_greedy_streams_survive_kill_9_of_their_backend(adaptive):
    """Issue 18: 4 greedy streams on the primary, killed mid-stream, all end as an undisturbed run."""
    server, names = adaptive
    # Our engine (a slow primary here) and llama.cpp agree on these prompts' greedy tokens for 200
    # tokens (on the first they part at token 210, a near tie), so native+llama-server is compared
    # exactly over 200. A llama-server primary is so fast that 200 tokens could end before the kill.
    n = 200 if names[0] == "native-0" else 1000
    bodies = [completion_body(f"story number {i}", n) for i in range(4)]
    reference = run_streams(server.root, bodies)
    victim = wait_backends_ready(server)[0]["pid"]
    # The reference streams' slots are released just after their clients read the end: until then a new
    # request could overflow to the other backend and never be on the victim (failed once in CI: 3 == 4).
    _wait(lambda: all(b["in_flight"] == 0 for b in server_props(server)["backends"]), "no request in flight",
          timeout=30)
    migrated = migrated_requests(server.log())
    results = run_streams(server.root, bodies, kill=victim)
    assert len(migrated_requests(server.log()) - migrated) == 4  # each stream moved
    for ref, got in zip(reference, results):
        assert got.status == 200 and not got.errors and got.done, got.events[-3:]
        assert got.finish_reasons == ["length"] and got.usage["completion_tokens"] == n
        assert got.text == ref.text
    assert httpx.get(f"{server.root}/health").status_code == 200
    backends = wait_backends_ready(server)
    assert backends[0]["pid"] != victim and backends[0]["restarts"] >= 1 and not pid_alive(victim)
    before = server_props(server)["backends"][0]["served"]
    counts, _ = asyncio.run(_streams(server, 4, 30))
    # The router's own count (a peak seen by polling /props could miss requests this short).
    assert counts == [30] * 4 and server_props(server)["backends"][0]["served"] - before == 4


def test_adaptive_kill_9_of_1bit_leaves_no_child(adaptive):
    server, _ = adaptive
    children = [b["pid"] for b in wait_backends_ready(server)]
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    _wait(lambda: not any(pid_alive(p) for p in children), "every child to die", timeout=10)


# ---- unit tests (no build needed) -----------------------------------------------------------------

def test_spec_parses_llama_server_options():
    from onebit.backends.spec import BackendSpecError, parse_backend_spec

    spec = parse_backend_spec("llama-server:/opt/ll/llama-server?slots=3&gguf=/m/x.gguf&args=-ngl 99 -fa on")
    assert (spec.kind, spec.target, spec.slots) == ("llama-server", "/opt/ll/llama-server", 3)
    assert spec.options == {"gguf": "/m/x.gguf", "args": "-ngl 99 -fa on"}
    for bad in ("llama-server:", "llama-server:/x?prompt=ids", "llama-server:/x?args=-a 'open"):
        with pytest.raises(BackendSpecError):
            parse_backend_spec(bad)


def _fake_help(tmp_path: Path, text: str) -> str:
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!/bin/sh\ncat <<'HELP'\n{text}\nHELP\n")
    fake.chmod(0o755)
    return str(fake)


def test_mtp_maps_to_the_flags_the_build_has(tmp_path):
    from onebit.backends.llama_server_child import draft_flags

    (tmp_path / "a").mkdir()
    seed_build = _fake_help(tmp_path / "a", "--mtp FNAME                 MTP head\n--draft-max N   drafts")
    assert draft_flags(seed_build, "/h.gguf", 3) == ["--mtp", "/h.gguf", "--draft-max", "3"]
    (tmp_path / "b").mkdir()
    upstream = _fake_help(tmp_path / "b", "--spec-draft-model, -md, --model-draft FNAME  draft model\n"
                                          "--spec-type none,draft-simple,draft-mtp   types\n--spec-draft-n-max N  n")
    assert draft_flags(upstream, "/h.gguf", 2) == ["--spec-type", "draft-mtp", "--spec-draft-model", "/h.gguf",
                                                   "--spec-draft-n-max", "2"]
    assert draft_flags(upstream, "", None) == ["--spec-type", "draft-mtp"]
    (tmp_path / "c").mkdir()
    plain = _fake_help(tmp_path / "c", "-m, --model FNAME   model path\n-np, --parallel N  slots")
    with pytest.raises(ValueError, match="no MTP drafting flags"):
        draft_flags(plain, "/h.gguf", 3)


def test_gguf_tokenizer_equals_the_directory_tokenizer(tiny_model_dir, tiny_gguf):
    from onebit.models.tokenizer import Tokenizer

    ours, from_gguf = Tokenizer.from_dir(tiny_model_dir), Tokenizer.from_dir(tiny_gguf)
    for text in ("Hello world, the answer is 42!", "<|im_start|>user\nhi<|im_end|>\n", "  tabs\t\tand\n\nlines",
                 "naïve café 日本"):
        assert from_gguf.encode(text) == ours.encode(text)
    assert from_gguf.vocab_size == ours.vocab_size and from_gguf.special_token_ids == ours.special_token_ids
    assert from_gguf.chat_template == ours.chat_template


def test_builder_reuses_a_cached_binary_and_names_its_variants(tmp_path, monkeypatch):
    from onebit.backends import llama_server_build as b

    plan = b.BuildPlan(tmp_path, "1.2.3")
    assert plan.binary == tmp_path / "1.2.3-cpu" / "bin" / "llama-server"
    assert b.BuildPlan(tmp_path, "1.2.3", "90").build_dir == tmp_path / "1.2.3-cuda-90"
    assert "-DGGML_CUDA=ON" in b.cmake_options(b.BuildPlan(tmp_path, "1.2.3", "90"))
    plan.binary.parent.mkdir(parents=True)
    plan.binary.write_text("#!/bin/sh\n")
    plan.binary.chmod(0o755)
    monkeypatch.setattr(b, "_run", lambda *a: pytest.fail("a cached build must not run anything"))
    assert b.build(plan) == plan.binary
    assert b.built_binaries([tmp_path]) == [plan.binary]


def test_sse_lines_split_at_newlines_only():
    from onebit.backends.remote_protocol import sse_lines

    async def chunks():
        for part in (b'data: {"t": "a\xe2\x80\xa8b\xc2\x85c"}\r', b'\n\ndata: [DO', b"NE]\n"):
            yield part

    async def collect():
        return [line async for line in sse_lines(chunks())]

    assert asyncio.run(collect()) == ['data: {"t": "a\u2028b\u0085c"}', "", "data: [DONE]"]


# ---- issue #13: our GGUF tokenizer against llama.cpp's on the same file ----------------------------

def test_gguf_tokenizer_equals_llama_server_tokenize(llama_server_bin, tiny_model_dir, tmp_path):
    """The tokenizer we build from GGUF metadata gives llama-server's own /tokenize ids, specials included.

    The file comes from the tests' independent writer (tests/gguf_files.py), not from the exporter.
    """
    import subprocess

    from tests.gguf_files import write_gguf
    from server_utils import free_port
    from test_gguf_tokenizer import STRINGS

    from onebit.models.tokenizer import Tokenizer

    path = write_gguf(tiny_model_dir, tmp_path / "tiny-f32.gguf")
    port = free_port()
    log = open(tmp_path / "llama-server.log", "w")
    proc = subprocess.Popen([llama_server_bin, "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
                             "-c", "256", "-np", "1", "-t", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy():
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None  # ends the wait; the assert below names the exit
        _wait(healthy, "llama-server /health", timeout=120)
        assert proc.poll() is None, (tmp_path / "llama-server.log").read_text()[-2000:]
        ours = Tokenizer.from_dir(path)
        special = ours.encode("<|im_start|>")
        assert len(special) == 1 and special[0] in ours.special_token_ids  # specials are parsed on both sides
        for text in [s for s in STRINGS if s]:
            theirs = httpx.post(f"{url}/tokenize", json={"content": text, "add_special": False,
                                                         "parse_special": True}, timeout=30).json()["tokens"]
            assert theirs and ours.encode(text) == theirs, text
    finally:
        proc.kill()
        proc.wait(10)
        log.close()
