"""`1bit serve -m X.gguf` end to end: same greedy tokens as the safetensors directory, the file's name
and quantization in /v1/models and /props, split files, the Hugging Face cache with a :QUANT suffix,
and broken files refused with a clear message and no traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from onebit.models.errors import ModelLoadError
from onebit.models.loader import resolve_model_path
from tests.gguf_files import Q, write_gguf
from tests.server_utils import REPO_ROOT, openai_clients, running_server, start_server, stop_server, wait_healthy

ARGS = ("--ctx-size", "256", "--parallel", "2")
PROMPTS = ["Tell me about the quick brown fox.", "def add(a, b):"]


def _greedy(server, model: str) -> list[str]:
    client, _ = openai_clients(server)
    out = []
    for prompt in PROMPTS:
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                               temperature=0, max_tokens=12, logprobs=True)
        out.append([t.token for t in reply.choices[0].logprobs.content])
    return out


@contextlib.contextmanager
def _running_servers(*extras):
    """Healthy servers, one per tuple of extra arguments (`-m MODEL` first), started side by side
    (their start-ups overlap) and all stopped at the end."""
    servers = []
    try:
        for model, *extra in extras:
            servers.append(start_server(model, *ARGS, *extra, wait=False))
        for server in servers:
            wait_healthy(server)
        yield servers
    finally:
        for server in servers:
            stop_server(server)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_f32_gguf_serves_the_same_greedy_tokens_as_safetensors(arch, tiny_models, tmp_path):
    src = tiny_models(arch)
    path = write_gguf(src, tmp_path / f"tiny-{arch}.gguf")
    with _running_servers((src,), (path,)) as (reference, server):
        expected = _greedy(reference, src.name)
        models = httpx.get(f"{server.base_url}/models").json()["data"]
        assert models[0]["id"] == f"tiny-{arch}"  # the file name without .gguf
        assert models[0]["meta"]["quantization"] == "F32"
        assert _greedy(server, f"tiny-{arch}") == expected
    assert sum(len(tokens) for tokens in expected) == 24


def test_q8_0_file_serves_and_props_names_file_and_type(tiny_model_dir, tmp_path):
    path = write_gguf(tiny_model_dir, tmp_path / "tiny-q8.gguf", Q.Q8_0)
    with running_server(path, *ARGS) as server:
        props = httpx.get(f"{server.root}/props").json()
        assert props["model_alias"] == "tiny-q8"
        assert props["model_info"]["file"] == "tiny-q8.gguf"
        assert props["model_info"]["quantization"] == "Q8_0"
        assert len(_greedy(server, "tiny-q8")[0]) == 12


def test_mtp_head_gguf_serves(tiny_models, tmp_path):
    src = tiny_models("qwen3", mtp=True)
    model = write_gguf(src, tmp_path / "m.gguf")
    head = write_gguf(src, tmp_path / "head.gguf", mtp_only=True)
    with _running_servers((model,), (model, "--mtp", str(head))) as (plain_server, server):
        plain = _greedy(plain_server, "m")
        assert _greedy(server, "m") == plain  # verification keeps greedy output exact


def test_split_files_load_from_any_shard(tiny_model_dir, tmp_path):
    write_gguf(tiny_model_dir, tmp_path / "big.gguf", Q.F16, split_max_tensors=10)
    shards = sorted(p.name for p in tmp_path.glob("*.gguf"))
    assert shards == [f"big-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    first = tmp_path / shards[0]
    assert resolve_model_path(str(tmp_path / shards[2])) == first.resolve()
    assert resolve_model_path(str(tmp_path)) == first.resolve()
    with running_server(tmp_path / shards[1], *ARGS) as server:
        assert httpx.get(f"{server.base_url}/models").json()["data"][0]["id"] == "big"
        assert len(_greedy(server, "big")[0]) == 12
    (tmp_path / shards[2]).unlink()
    with pytest.raises(ModelLoadError, match="lacks 1 of its 3 files: big-00003-of-00003.gguf"):
        resolve_model_path(str(first))


def _fake_cache(root, repo: str, files: dict):
    """A Hugging Face cache layout: blobs, a snapshot of symlinks, refs/main."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / "abc123"
    for rel, src in files.items():
        blob = base / "blobs" / rel.replace("/", "_")
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, blob)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).symlink_to(blob)
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text("abc123")
    return snap


def test_hf_cache_id_with_quant_suffix(tiny_model_dir, tmp_path, monkeypatch):
    q8 = write_gguf(tiny_model_dir, tmp_path / "a.gguf", Q.Q8_0)
    f16 = write_gguf(tiny_model_dir, tmp_path / "b.gguf", Q.F16)
    cache = tmp_path / "hub"
    snap = _fake_cache(cache, "org/Tiny-GGUF", {"Tiny-Q8_0.gguf": q8, "Tiny-F16.gguf": f16,
                                                "mmproj-Tiny-F16.gguf": f16})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert resolve_model_path("org/Tiny-GGUF:Q8_0") == (snap / "Tiny-Q8_0.gguf").resolve()
    assert resolve_model_path("org/Tiny-GGUF", gguf_file="Tiny-F16.gguf") == (snap / "Tiny-F16.gguf").resolve()
    with pytest.raises(ModelLoadError, match=r"choose one with --gguf-file.*Tiny-F16.gguf, Tiny-Q8_0.gguf"):
        resolve_model_path("org/Tiny-GGUF")
    with pytest.raises(ModelLoadError, match="quantization Q4_K_M matches no GGUF file"):
        resolve_model_path("org/Tiny-GGUF:Q4_K_M")
    with running_server("org/Tiny-GGUF:Q8_0", *ARGS) as server:
        props = httpx.get(f"{server.root}/props").json()
        assert props["model_alias"] == "Tiny-Q8_0" and props["model_info"]["quantization"] == "Q8_0"
        assert len(_greedy(server, "Tiny-Q8_0")[0]) == 12


def _serve_fails(*models) -> list[str]:
    """Run `1bit serve -m MODEL` for each model, side by side, each expecting a clean refusal;
    return their stderr in the order of `models`."""
    procs = []
    try:
        for model in models:
            cmd = [sys.executable, "-m", "onebit.cli", "serve", "-m", str(model), "--port", "0", *ARGS]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          cwd=REPO_ROOT, env={**os.environ, "TQDM_DISABLE": "1"}))
        errors = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=180)
            assert proc.returncode == 1, stderr
            assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
            errors.append(stderr)
        return errors
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _retype(path, name: str, new_type: int) -> None:
    """Overwrite the type field of tensor `name` in the file's tensor-info table."""
    import gguf

    reader = gguf.GGUFReader(path)
    field = next(t.field for t in reader.tensors if t.name == name)
    offset = field.offset + sum(p.nbytes for p in field.parts[:4])
    del reader
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(new_type.to_bytes(4, "little"))


def test_broken_files_are_refused_with_a_clear_message(tiny_model_dir, tmp_path):
    good = write_gguf(tiny_model_dir, tmp_path / "good.gguf")
    data = good.read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) * 2 // 3])
    (tmp_path / "head.gguf").write_bytes(data[:100])
    write_gguf(tiny_model_dir, tmp_path / "missing.gguf", drop=("blk.1.ffn_up.weight",))
    shutil.copyfile(good, tmp_path / "unknown.gguf")
    _retype(tmp_path / "unknown.gguf", "blk.0.ffn_up.weight", 99)
    shutil.copyfile(good, tmp_path / "iq.gguf")
    _retype(tmp_path / "iq.gguf", "output_norm.weight", 20)  # IQ4_NL: blocks of 32, so the header still parses
    magic, cut, head, missing, unknown, iq = _serve_fails(
        *(tmp_path / f"{name}.gguf" for name in ("magic", "cut", "head", "missing", "unknown", "iq")))
    assert "not a GGUF file" in magic
    assert "truncated" in cut
    assert "truncated or corrupt" in head
    assert "missing weights tensor blk.1.ffn_up.weight" in missing
    assert "unknown type" in unknown
    assert "type IQ4_NL" in iq and "supported types: F32" in iq
