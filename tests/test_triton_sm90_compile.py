"""Triton kernels compiled for the H200 (sm_90) on this CPU machine, no GPU needed.

Triton's interpreter, which the CPU tests run kernels in, does not check that a name keeps one
type across a runtime `if`; the GPU compiler refuses such a kernel. The fp8 KV cache's fused
write did that from a40a6ff on and failed on its first device run (G12, session 10): these tests
compile its every variant as the device would, in a child process without TRITON_INTERPRET (under
the interpreter `triton.jit` gives functions the compiler cannot take).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

COMPILE = textwrap.dedent("""
    import sys
    import triton
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:  # a triton without this ahead-of-time API
        sys.exit(3)
    from onebit.kernels import triton_fused

    kv_fp8, has_norm = sys.argv[1] == "1", sys.argv[2] == "1"
    cache = "*fp8e4nv" if kv_fp8 else "*bf16"
    signature = {"qkv_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                 "qn_ptr": "*bf16", "kn_ptr": "*bf16", "slot_ptr": "*i64", "q_out_ptr": "*bf16",
                 "k_cache_ptr": cache, "v_cache_ptr": cache, "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
                 "eps": "fp32", "qkv_stride": "i32", "NUM_HEADS": "constexpr", "NUM_KV": "constexpr",
                 "HEAD_DIM": "constexpr", "HAS_NORM": "constexpr", "KV_FP8": "constexpr"}
    constexprs = {"NUM_HEADS": 32, "NUM_KV": 8, "HEAD_DIM": 128, "HAS_NORM": has_norm, "KV_FP8": kv_fp8}
    source = ASTSource(fn=triton_fused._qk_norm_rope_store_kernel, signature=signature, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    print("stores", kernel.asm["ptx"].count("st.global"))
""")


@pytest.mark.parametrize("kv_fp8", [False, True])
@pytest.mark.parametrize("has_norm", [False, True])
def test_qk_norm_rope_store_compiles_for_sm90(kv_fp8, has_norm):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", COMPILE, str(int(kv_fp8)), str(int(has_norm))], env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        pytest.skip("this triton has no ahead-of-time compile API")
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 0  # the kernel writes q and the cache
