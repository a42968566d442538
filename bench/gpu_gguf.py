"""GGUF on the GPU: the Qwen3-8B shape written as GGUF bf16 and Q8_0, loaded, checked and timed.

    PYTHONPATH=. python3 bench/gpu_gguf.py --out DIR [--device cuda] [--shape qwen3-8b]
    PYTHONPATH=. python3 bench/gpu_gguf.py --out DIR --device cpu --shape qwen3-tiny   # CPU try-out

Random weights are drawn once (our dummy loader) and written three ways: safetensors shards, GGUF
BF16 and GGUF Q8_0 (Q8_0 encoded in torch on the device: the `gguf` library's numpy encoder would
take minutes). Each is then served by the engine in a fresh child process, which reports the
weight-loading time, the peak host memory while loading (anonymous memory, which the process
allocated, apart from file pages it mapped, which the kernel may drop and which ru_maxrss also
counts), the logits of a fixed prompt (compared with
the safetensors load) and decode tokens/s at B=1, 8, 64 (64 new tokens; the time of a 1-token run
with other prompts is subtracted, leaving decode). Results go to DIR/gguf.json and DIR/gguf.md.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from bench.make_shape_model import fill_vocab, hf_state_dict, make_shape_model, save_sharded

PROBE = list(range(100, 164))


def q8_0_bytes(t: torch.Tensor) -> np.ndarray:
    """Q8_0 blocks (f16 scale + 32 int8) of a matrix, encoded on its device; [rows, bytes per row]."""
    rows, cols = t.shape
    blocks = t.float().reshape(rows, cols // 32, 32)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.round(blocks / torch.where(scale > 0, scale, 1)).clamp(-127, 127).to(torch.int8)
    packed = torch.cat([scale.half().view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return packed.reshape(rows, -1).cpu().numpy()


def write_model_gguf(model, shape_dir: Path, out: Path, file_type: int, matrix) -> Path:
    """Write the loaded model `model` (its config.json in shape_dir) as a GGUF file of llama.cpp file type
    `file_type`: qwen3 names, vectors in F32, each matrix as `matrix(gguf name, tensor)` encodes it:
    (data, GGML type, shape when the data's own shape does not give it, else None)."""
    from tests.gguf_files import gguf_name, hyper_parameters, vocab_metadata

    c = json.loads((shape_dir / "config.json").read_text())
    w = gguf.GGUFWriter(out, "qwen3")
    hyper_parameters(w, c, file_type)
    vocab_metadata(w, shape_dir, "gpt-2", False)
    for hf, t in hf_state_dict(model).items():
        name = gguf_name(hf, c["num_hidden_layers"], mtp_block=-1)
        if t.dim() == 1:
            w.add_tensor(name, t.float().cpu().numpy())
        else:
            data, kind, shape = matrix(name, t)
            w.add_tensor(name, data, raw_shape=shape, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_gguf_from(model, shape_dir: Path, out: Path, qtype) -> Path:
    """Write the loaded model `model` as a GGUF file with its matrices in `qtype` (BF16 or Q8_0)."""
    from tests.gguf_files import FILE_TYPES

    def matrix(name, t):
        if qtype == gguf.GGMLQuantizationType.BF16:
            return t.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16), qtype, tuple(t.shape)
        return q8_0_bytes(t), qtype, None

    return write_model_gguf(model, shape_dir, out, FILE_TYPES[qtype], matrix)


class PeakMemory:
    """Polls /proc/self/status in a thread and keeps the largest RssAnon and RssFile seen (GiB)."""

    def __init__(self, every_s: float = 0.005):
        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(every_s,), daemon=True)

    @staticmethod
    def now() -> dict[str, float]:
        """RssAnon and RssFile of this process now, GiB."""
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("RssAnon", "RssFile"):
                    out[key] = int(line.split()[1]) / 2**20
        return out

    def _poll(self, every_s: float) -> None:
        while not self._stop.is_set():
            for key, value in self.now().items():
                self.peak[key] = max(self.peak[key], value)
            self._stop.wait(every_s)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def child(model: str, device: str, out: Path) -> None:
    """In a fresh process: load `model` in the engine, time it, record RSS, logits and decode speed."""
    import onebit.engine.build as llm_engine  # where the engine calls load_model
    from onebit import LLM
    from tests.model_probe import all_logits

    record: dict = {"model": model, "rss_before_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    original = llm_engine.load_model

    def timed(*args, **kwargs):
        record["anon_before_load_gb"] = PeakMemory.now()["RssAnon"]
        start = time.perf_counter()
        with PeakMemory() as memory:
            result = original(*args, **kwargs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        record["load_s"] = time.perf_counter() - start
        record["peak_rss_after_load_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        record["peak_anon_gb"] = memory.peak["RssAnon"]
        record["peak_file_gb"] = memory.peak["RssFile"]
        return result

    llm_engine.load_model = timed
    llm = LLM(model, device=device, parallel=64, ctx_size=512, dtype="bfloat16")
    torch.save(all_logits(llm, PROBE).float().cpu(), out)
    record["decode_tok_s"] = decode_tok_s(llm, (1, 8, 64))
    print(json.dumps(record))


def decode_tok_s(llm, batches, repeats: int = 3, clocks: dict | None = None,
                 gc_pauses: dict | None = None) -> dict[int, float]:
    """Decode tokens/s of `llm` at each batch size: 64 new tokens after 128-token random prompts, the
    time of a 1-token run with other prompts subtracted (prefill), after a short warm-up run; the
    median of `repeats` such pairs (one pair moved B=8 by up to 12% between runs of one tree on one
    machine, session 21). `clocks`, where given, receives each batch size's GPU clock summary over its
    timed runs (`onebit.bench.gpu_clocks`; None without nvidia-smi); `gc_pauses` the garbage collector's
    pauses over them (`onebit.bench.gc_pauses`)."""
    from onebit import SamplingParams
    from onebit.bench.gc_pauses import GcPauses
    from onebit.bench.gpu_clocks import ClockSampler

    rng = random.Random(0)
    vocab = llm.engine.model_config.vocab_size
    speed = {}
    for b in batches:
        def run(tokens: int) -> float:
            prompts = [[rng.randrange(1000, vocab) for _ in range(128)] for _ in range(b)]
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
            return time.perf_counter() - start
        run(4)  # warm-up
        with ClockSampler(0 if clocks is not None else None) as sampler, GcPauses() as pauses:
            speed[b] = round(statistics.median(b * 64 / max(run(65) - run(1), 1e-9) for _ in range(repeats)), 1)
        if clocks is not None:
            clocks[b] = sampler.summary()
        if gc_pauses is not None:
            gc_pauses[b] = pauses.summary()
    return speed


def run_child(model: Path, device: str, logits: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", str(model), "--device", device, "--logits", str(logits)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        raise SystemExit(f"child failed on {model}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    """Write the three copies, measure each in a child, write the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/gguf"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--logits", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.device, args.logits)
        return 0
    from onebit.models.loader import load_model

    work = args.out / "model"
    shutil.rmtree(work, ignore_errors=True)
    make_shape_model(work, args.shape)
    fill_vocab(work)
    start = time.perf_counter()
    model, _ = load_model(work, torch.device(args.device), torch.bfloat16, "dummy")
    save_sharded(hf_state_dict(model), work)
    files = {"safetensors": work}
    for kind in (gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.Q8_0):
        files[kind.name] = write_gguf_from(model, work, args.out / f"model-{kind.name}.gguf", kind)
    del model
    written_s = time.perf_counter() - start
    results = {}
    for name, path in files.items():
        results[name] = run_child(path, args.device, args.out / f"logits-{name}.pt")
    ref = torch.load(args.out / "logits-safetensors.pt")
    for name in files:
        diff = torch.load(args.out / f"logits-{name}.pt") - ref
        results[name]["logit_max_abs_err"] = diff.abs().max().item()
        results[name]["logit_rms_err"] = diff.pow(2).mean().sqrt().item()
        path = files[name]
        results[name]["file_gb"] = sum(p.stat().st_size for p in (path.glob("*.safetensors") if path.is_dir()
                                                                    else [path])) / 2**30
    report = {"shape": args.shape, "device": args.device, "write_s": written_s, "results": results}
    (args.out / "gguf.json").write_text(json.dumps(report, indent=1))
    lines = [f"GGUF loading, {args.shape} on {args.device} (random weights; logits vs the safetensors load)", "",
             "| file | GB | load s | anon before load GB | peak anon GB | peak file-mapped GB | ru_maxrss GB | logit RMS err | max err | tok/s B=1 | B=8 | B=64 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        d = r["decode_tok_s"]
        lines.append(f"| {name} | {r['file_gb']:.1f} | {r['load_s']:.1f} | {r['anon_before_load_gb']:.2f} | {r['peak_anon_gb']:.2f} | "
                     f"{r['peak_file_gb']:.2f} | {r['peak_rss_after_load_gb']:.2f} | "
                     f"{r['logit_rms_err']:.4f} | {r['logit_max_abs_err']:.3f} | {d['1']} | {d['8']} | {d['64']} |")
    (args.out / "gguf.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
