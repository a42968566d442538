"""Triton kernels compiled for the H200 (sm_90) on this CPU machine, no GPU needed.

Triton's interpreter, which the CPU tests run kernels in, does not check that a name keeps one
type across a runtime `if`, nor does it run the grid-dependency instructions of programmatic
dependent launch (`onebit.kernels.pdl`); the GPU compiler does. The fp8 KV cache's fused write
reused names across such a branch from a40a6ff on and failed on its first device run (G12,
session 10). These tests compile the decode step's kernels as the device would, in a child
process without TRITON_INTERPRET (under the interpreter `triton.jit` gives functions the compiler
cannot take): the fused write in its every variant, and each PDL kernel with PDL on
(the FP8 split-K kernel and the split-K reduce also with block-scaled weights, the split-K kernel also on
e4m3 rows, with one scale a row or a row's block, where its tiles must reach the tensor cores as e4m3), the repacked GGUF "int" kernel
at 64 rows for every type, and the GGUF "i8" kernel with its PTX (DP4A, PRMT: the interpreter runs
their plain-integer spelling instead).
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

COMPILE = textwrap.dedent(r"""
    import importlib
    import sys
    import triton
    import triton.language as tl
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:  # a triton without this ahead-of-time API
        sys.exit(3)

    FLOATS = {"eps", "scale"}

    def signature(fn, types, constexprs):
        # pointers bf16 unless named in `types`, eps/scale fp32, other scalars i32
        out = {}
        for name in fn.arg_names:
            if name in constexprs:
                out[name] = "constexpr"
            elif name in types:
                out[name] = types[name]
            elif name.endswith("_ptr"):
                out[name] = "*bf16"
            else:
                out[name] = "fp32" if name in FLOATS else "i32"
        return out

    def compile_sm90(label, module, name, types, constexprs, warps=4):
        fn = getattr(importlib.import_module("onebit.kernels." + module), name)
        # constexpr parameters left out take their defaults, as a launch that leaves them out does
        constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
        pdl = bool(constexprs.get("PDL"))
        source = ASTSource(fn=fn, signature=signature(fn, types, constexprs), constexprs=constexprs)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl, "num_warps": warps})
        ptx = kernel.asm["ptx"]
        atomics = [line for line in ptx.splitlines() if "atom.global" in line]  # predicated: "@%p atom.global..."
        print(label, "stores", ptx.count("st.global"), "griddepcontrol", ptx.count("griddepcontrol"),
              "e4m3-mma", sum(1 for line in ptx.splitlines() if "mma" in line and ".e4m3.e4m3" in line),
              "wgmma", ptx.count("wgmma.mma_async"), "shared", kernel.metadata.shared,
              "dp4a", ptx.count("dp4a."), "prmt", ptx.count("prmt.b32"), "hfma2", ptx.count("fma.rn.f16x2"),
              "hsub2", ptx.count("sub.f16x2"), "atomics", len(atomics),
              "acq-rel-atomics", sum(1 for line in atomics if ".gpu." in line and ".acq_rel." in line),
              "cg-loads", ptx.count("ld.global.cg"), "barriers", ptx.count("bar.sync"),
              "loads-before-wait", ptx.split("griddepcontrol.wait")[0].count("ld.global"))

    which = sys.argv[1]
    fp8 = "*fp8e4nv"
    if which == "fused-write":  # every variant, PDL off
        for kv_fp8, has_norm, heads in [(f, n, h) for f in (False, True) for n in (False, True) for h in (1, 16)]:
            cache = fp8 if kv_fp8 else "*bf16"
            compile_sm90(f"fused-write-fp8={int(kv_fp8)}-norm={int(has_norm)}-heads={heads}", "triton_fused",
                         "_qk_norm_rope_store_kernel",
                         {"pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "slot_ptr": "*i64",
                          "k_cache_ptr": cache, "v_cache_ptr": cache, "k_scale_ptr": "*fp32",
                          "v_scale_ptr": "*fp32"},
                         {"NUM_HEADS": 32, "NUM_KV": 8, "HEAD_DIM": 128, "HAS_NORM": has_norm,
                          "KV_FP8": kv_fp8, "PDL": False, "HEADS": heads})
    elif which == "gguf-int":  # mode "int" of repacked GGUF weights at 64 rows, as 17-64 rows launch it
        from onebit.kernels import triton_gguf_repacked as tr
        from onebit.kernels.gguf_repack import GROUPING
        config = tr.INT_MANY_ROWS_CONFIG
        for qtype in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
            group, lanes, _, planes = GROUPING[qtype]
            compile_sm90(f"gguf-int-{qtype}", "triton_gguf_repacked", "_repacked_int_kernel",
                         {"x_ptr": "*bf16", "c_ptr": "*i32", "h_ptr": "*i32", "s_ptr": "*i32",
                          "d_ptr": "*fp32" if qtype == "Q6_K" else "*i32", "y_ptr": "*fp32"},
                         {"QTYPE": tr.QTYPE_IDS[qtype], "GROUP": group, "LANES": lanes, "PLANES": planes,
                          "BLOCK_M": tr.MAX_INT_ROWS, "BLOCK_N": config.block_n, "NG": config.ng, "REDUCE": 1,
                          "NUM_STAGES": config.stages}, warps=config.warps)
    elif which == "gguf-f16":  # modes "f16" / "f16s" on a 64-row tile as the shipped picks launch them, PDL on
        from onebit.kernels import triton_gguf_repacked as tr
        from onebit.kernels.gguf_repack import GROUPING
        for qtype, scaled in (("Q4_K", False), ("Q4_K", True), ("Q6_K", True)):
            group, lanes, _, planes = GROUPING[qtype]
            compile_sm90(f"gguf-f16{'s' if scaled else ''}-{qtype}", "triton_gguf_f16", "_f16_kernel",
                         {"x_ptr": "*fp16", "xm_ptr": "*fp16", "xe_ptr": "*fp32", "c_ptr": "*i32",
                          "h_ptr": "*i16" if qtype == "Q6_K" else "*i32", "s_ptr": "*i32",
                          "d_ptr": "*fp32" if qtype == "Q6_K" else "*i32", "y_ptr": "*fp32"},
                         {"QTYPE": tr.QTYPE_IDS[qtype], "GROUP": group, "LANES": lanes, "PLANES": planes,
                          "BLOCK_M": 64, "BLOCK_N": 128, "REDUCE": 1, "NUM_STAGES": 2, "SCALED": scaled,
                          "ASM": True, "PDL": True})
    elif which == "gguf-dot":  # mode "dot" of repacked Q4_K weights on a 64-row tile (17-64 rows, a candidate)
        from onebit.kernels import triton_gguf_repacked as tr
        from onebit.kernels.gguf_repack import GROUPING
        config = tr.CONFIGS["dot-n64-g1"]
        group, lanes, _, planes = GROUPING["Q4_K"]
        compile_sm90("gguf-dot-Q4_K", "triton_gguf_repacked", "_repacked_kernel",
                     {"x_ptr": "*bf16", "c_ptr": "*i32", "h_ptr": "*i32", "s_ptr": "*i32", "d_ptr": "*i32",
                      "y_ptr": "*fp32"},
                     {"QTYPE": tr.QTYPE_IDS["Q4_K"], "GROUP": group, "LANES": lanes, "PLANES": planes,
                      "BLOCK_M": 64, "BLOCK_N": config.block_n, "NG": config.ng, "USE_DOT": True, "REDUCE": 1,
                      "NUM_STAGES": config.stages}, warps=config.warps)
    elif which == "gguf-g16":  # mode "g16" (Gluon, Q4_K at 8-64 rows) at the tiles its configs launch
        import re
        from onebit.kernels import gluon_gguf_g16 as g16
        if not g16.available():
            sys.exit(3)
        for block_m, block_n, reduce, stages, warps, qtype in (
                (8, 64, 1, 2, 4, "Q4_K"), (64, 128, 1, 1, 4, "Q4_K"), (16, 128, 0, 1, 4, "Q4_K"),
                (64, 128, 1, 2, 8, "Q4_K"), (8, 64, 1, 2, 4, "Q6_K"), (64, 64, 0, 1, 4, "Q6_K")):
            kernel = g16.compile_sm90(block_m, block_n, reduce, stages, warps, qtype)
            ptx = kernel.asm["ptx"]
            waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
            print(f"gguf-g16-{qtype}-m{block_m}-n{block_n}-w{warps}-s{stages}", "wgmma", ptx.count("wgmma.mma_async"), "wait1",
                  waits.count("1"), "wait0", waits.count("0"), "shared", kernel.metadata.shared, "stores",
                  ptx.count("st.global"), "barriers", ptx.count("bar.sync"), "f16x2", ptx.count("fma.rn.f16x2") + ptx.count("mul.rn.f16x2"))
    elif which == "gguf-i8":  # mode "i8" (1 row, DP4A) for its types as the sweep's configs launch it, PDL on
        from onebit.kernels import triton_gguf_repacked as tr
        from onebit.kernels.gguf_repack import GROUPING
        for qtype in tr.I8_TYPES:
            group, lanes, _, planes = GROUPING[qtype]
            meta = {"GROUP": group, "LANES": lanes, "PLANES": planes, "PDL": True}
            # a (row, group) a thread (a sweep candidate); over four threads, 4 rows each (session 16's
            # dropped candidate i8-n128-g1-q4: the kernel keeps `quads`)
            for label, config in (("i8-n32-g4-s1", tr.CONFIGS["i8-n32-g4-s1"]),
                                  ("i8-n128-g1-q4", tr.RepackedConfig("i8", 128, 1, stages=1, programs=512, quads=4))):
                compile_sm90(f"gguf-{label}-{qtype}", "triton_gguf_repacked", "_repacked_i8_kernel",
                             {"xq_ptr": "*i32", "dx_ptr": "*fp32", "xs_ptr": "*fp32", "c_ptr": "*i32",
                              "s_ptr": "*i32", "d_ptr": "*i32", "y_ptr": "*fp32"},
                             {**meta, "QTYPE": tr.QTYPE_IDS[qtype], "BLOCK_N": config.block_n, "NG": config.ng,
                              "QUADS": config.quads, "REDUCE": 1,
                              "NUM_STAGES": config.stages, "ASM": True}, warps=config.warps)
            compile_sm90(f"gguf-i8-quantize-{qtype}", "triton_gguf_repacked", "_quantize_x_i8_kernel",
                         {"q_ptr": "*i32", "dx_ptr": "*fp32", "xs_ptr": "*fp32"},
                         {key: value for key, value in meta.items() if key != "PDL"})
    elif which == "gguf-h2":  # mode "h2" (1 row, float16 pairs) for its types as the table launches it, PDL on
        from onebit.kernels import triton_gguf_h2 as h2
        for qtype in ("Q4_K", "Q6_K"):
            for stages, early in ((0, False), (1, False), (2, False), (0, True)):
                compile_sm90(f"gguf-h2-s{stages}{'-early' if early else ''}-{qtype}", "triton_gguf_h2", "_h2_kernel",
                             {"x_ptr": "*bf16", "xp_ptr": "*i32", "c_ptr": "*i32",
                              "h_ptr": "*i16" if qtype == "Q6_K" else "*i32", "s_ptr": "*i32",
                              "d_ptr": "*fp32" if qtype == "Q6_K" else "*i32", "y_ptr": "*fp32"},
                             {**h2.kernel_constants(qtype), "SLICE_GROUPS": 4, "BLOCK_N": 64, "THREADS": 2,
                              "REDUCE": 1, "NUM_STAGES": stages, "ASM": True, "PDL": True, "EARLY": early})
    elif which == "e4m3-rounding":  # the per-row quantizers, rounding in float32 (sw) or in the cast (hw)
        from onebit.kernels import triton_fp8_fast
        triton_fp8_fast._CAST_ROUNDS = tl.constexpr(sys.argv[2] == "hw")  # before anything compiles them
        for module, name, constexprs in (("triton_fp8_fast", "_quantize_rows_kernel", {"BLOCK_K": 4096}),
                                         ("triton_fp8_fused", "_add_rms_norm_quantize_kernel",
                                          {"HAS_RESIDUAL": True, "BLOCK": 4096})):
            fn = getattr(importlib.import_module("onebit.kernels." + module), name)
            source = ASTSource(fn=fn, signature=signature(fn, {"q_ptr": fp8, "s_ptr": "*fp32"}, constexprs),
                               constexprs={**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default},
                                           **constexprs})
            ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
            body = [line for line in ptx.splitlines() if line.strip().endswith(";") and not line.strip().startswith(".")]
            print(name, "instructions", len(body), "cvt-e4m3", ptx.count("cvt.rn.satfinite.e4m3x2.f32"))
    elif which == "merge-last":  # the decode split kernel merging in its last program (MERGE_IN_SPLIT), PDL on
        decode = {"tables_ptr": "*i64", "lens_ptr": "*i64", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32",
                  "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "count_ptr": "*i32"}
        shape = {"GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "NUM_SPLITS": 8, "BLOCK_SIZE": 16, "TILE": 64,
                 "PDL": True, "MERGE_LAST": True}
        for label, types, extra in [("bf16", {}, {}), ("e4m3", {"k_ptr": fp8, "v_ptr": fp8}, {"KV_FP8": True, "DOT_F16": True}),
                                    ("quantized", {"out_ptr": fp8, "s_ptr": "*fp32"}, {"QUANTIZE": True, "ROUND": tl.bfloat16})]:
            compile_sm90("merge-last-" + label, "triton_decode", "_decode_split_kernel", {**decode, **types},
                         {**shape, **extra}, warps=2)
    elif which == "argmax":  # the sampler's two-pass argmax (no PDL: it runs outside the graphs), bf16 and fp32 logits
        partials = {"value_ptr": "*fp32", "index_ptr": "*i32"}
        for logits in ("*bf16", "*fp32"):
            compile_sm90(f"argmax-chunks-{logits[1:]}", "triton_argmax", "_argmax_chunks_kernel",
                         {**partials, "x_ptr": logits}, {"BLOCK": 1024, "MAX_SPLITS": 128})
        compile_sm90("argmax-merge", "triton_argmax", "_argmax_merge_kernel", {**partials, "out_ptr": "*i64"},
                     {"MAX_SPLITS": 128})
    else:  # every PDL kernel, PDL on
        on = {"PDL": True}
        decode = {"tables_ptr": "*i64", "lens_ptr": "*i64", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32",
                  "k_ptr": fp8, "v_ptr": fp8, "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32"}
        heads = {"GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "NUM_SPLITS": 4}
        for args in [
            ("triton_fused", "_add_rms_norm_kernel", {}, {"HAS_RESIDUAL": True, "BLOCK": 4096}),
            # the norms with their weight loaded before the wait (`pdl.early_weights`)
            ("triton_fused", "_add_rms_norm_kernel", {}, {"HAS_RESIDUAL": True, "BLOCK": 4096, "EARLY": True}),
            ("triton_fp8_fused", "_add_rms_norm_quantize_kernel", {"q_ptr": fp8, "s_ptr": "*fp32"},
             {"HAS_RESIDUAL": False, "BLOCK": 4096, "EARLY": True}),
            ("triton_gguf_f16", "_add_rms_norm_f16_kernel", {"x16_ptr": "*fp16", "xm_ptr": "*fp16", "xe_ptr": "*fp32"},
             {"HAS_RESIDUAL": True, "BLOCK": 4096, "CHUNK": 256, "SUB": 32, "EARLY": True}),
            ("triton_fused", "_silu_mul_kernel", {}, {"BLOCK": 1024}),
            ("triton_fused", "_qk_norm_rope_store_kernel",
             {"pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "slot_ptr": "*i64"},
             {"NUM_HEADS": 32, "NUM_KV": 8, "HEAD_DIM": 128, "HAS_NORM": True, "KV_FP8": False}),
            ("triton_decode", "_decode_split_kernel", decode,
             {**heads, "BLOCK_SIZE": 16, "TILE": 64, "KV_FP8": True, "DOT_F16": True}),
            ("triton_decode", "_decode_merge_kernel", decode, {**heads, "TILE": 64}),
            # the output written block-quantized for o's e4m3 product (quantize.Fp8Attention), by the split
            # kernel (one split) and by the merge
            ("triton_decode", "_decode_split_kernel", {**decode, "out_ptr": fp8, "s_ptr": "*fp32"},
             {**heads, "NUM_SPLITS": 1, "BLOCK_SIZE": 16, "TILE": 64, "KV_FP8": True, "DOT_F16": True, "QUANTIZE": True,
              "ROUND": tl.bfloat16}),
            ("triton_decode", "_decode_merge_kernel", {**decode, "out_ptr": fp8, "s_ptr": "*fp32"},
             {**heads, "TILE": 64, "QUANTIZE": True, "ROUND": tl.bfloat16}),
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32", "out_ptr": "*fp32"},
             {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT": 4, "EVEN_K": True}),
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32"},
             {"HAS_BIAS": True, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT": 1, "EVEN_K": True}),
            ("triton_split_k", "_reduce_kernel", {"p_ptr": "*fp32", "s_ptr": "*fp32"},
             {"HAS_BIAS": True, "SPLIT": 4, "BLOCK": 1024}),
            # block-scaled weights: one row summing four block columns a tile, a tensor-core tile in
            # one, and the reduce of partials that come scaled
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32", "out_ptr": "*fp32"},
             {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT": 4, "EVEN_K": True,
              "SCALE_BN": 128, "SCALE_BK": 128}),
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32"},
             {"HAS_BIAS": True, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT": 1, "EVEN_K": False,
              "SCALE_BN": 128, "SCALE_BK": 128}),
            ("triton_split_k", "_reduce_kernel", {"p_ptr": "*fp32", "s_ptr": "*fp32"},
             {"HAS_BIAS": True, "SPLIT": 4, "BLOCK": 1024, "HAS_SCALE": False}),
            # e4m3 rows (w8a8): a 64-row tile into fp32 partials, a 128-row tile (two warp groups)
            # with a bias
            ("triton_fp8_fast", "_split_k_kernel",
             {"x_ptr": fp8, "w_ptr": fp8, "s_ptr": "*fp32", "xs_ptr": "*fp32", "out_ptr": "*fp32"},
             {"HAS_BIAS": False, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT": 2, "EVEN_K": True,
              "X_FP8": True}),
            ("triton_fp8_fast", "_split_k_kernel", {"x_ptr": fp8, "w_ptr": fp8, "s_ptr": "*fp32", "xs_ptr": "*fp32"},
             {"HAS_BIAS": True, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT": 1, "EVEN_K": True,
              "X_FP8": True}),
            # e4m3 rows with a scale per row and block of K (split_k_w8a8_blocks), at a shipped deep tile
            ("triton_fp8_fast", "_split_k_kernel", {"x_ptr": fp8, "w_ptr": fp8, "s_ptr": "*fp32", "xs_ptr": "*fp32"},
             {"HAS_BIAS": False, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 256, "SPLIT": 1, "EVEN_K": True,
              "X_FP8": True, "XS_BK": 512}),
            ("triton_fp8_fast", "_quantize_rows_kernel", {"q_ptr": fp8, "s_ptr": "*fp32"}, {"BLOCK_K": 4096}),
            ("triton_fp8_fast", "_quantize_row_blocks_kernel", {"q_ptr": fp8, "s_ptr": "*fp32"}, {"BLOCK": 512}),
            ("triton_fp8_fused", "_add_rms_norm_quantize_kernel", {"q_ptr": fp8, "s_ptr": "*fp32"},
             {"HAS_RESIDUAL": True, "BLOCK": 4096}),
            ("triton_fp8_fused", "_silu_mul_quantize_kernel", {"q_ptr": fp8, "s_ptr": "*fp32"}, {"BLOCK": 512}),
            ("triton_gemv", "_gemv_kernel", {}, {"HAS_BIAS": False, "BLOCK_N": 8, "BLOCK_K": 512}),
            # one-row products loading their first weight tile before the grid-dependency wait
            ("triton_gemv", "_gemv_kernel", {}, {"HAS_BIAS": True, "BLOCK_N": 4, "BLOCK_K": 2048, "EARLY": True}),
            # bf16 gate_up with SiLU * mul in the same program (`gemv_silu_mul`), then also early
            ("triton_gemv", "_gemv_kernel", {}, {"HAS_BIAS": True, "BLOCK_N": 8, "BLOCK_K": 512, "GATED": True}),
            ("triton_gemv", "_gemv_kernel", {}, {"HAS_BIAS": False, "BLOCK_N": 8, "BLOCK_K": 1024, "GATED": True,
                                                 "EARLY": True}),
            # a decoder layer's one-row products with its norms folded in: the residual added as o and down
            # store, the row's rms inside gate_up (and qkv)
            ("triton_gemv", "_gemv_kernel", {}, {"HAS_BIAS": False, "BLOCK_N": 8, "BLOCK_K": 1024, "RESIDUAL": True,
                                                 "EARLY": True}),
            ("triton_gemv", "_gemv_kernel", {}, {"HAS_BIAS": True, "BLOCK_N": 8, "BLOCK_K": 1024, "GATED": True,
                                                 "NORM": True, "EARLY": True}),
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32"},
             {"HAS_BIAS": True, "BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 2048, "SPLIT": 1, "EVEN_K": True, "EARLY": True}),
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32", "out_ptr": "*fp32"},
             {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT": 4, "EVEN_K": False,
              "SCALE_BN": 128, "SCALE_BK": 128, "EARLY": True}),
            # an MLP's gate_up with SiLU * mul in the same program (`split_k_silu_mul`), then also early
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32"},
             {"HAS_BIAS": True, "BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 2048, "SPLIT": 1, "EVEN_K": True, "GATED": True}),
            ("triton_fp8_fast", "_split_k_kernel", {"w_ptr": fp8, "s_ptr": "*fp32"},
             {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 2048, "SPLIT": 1, "EVEN_K": True, "GATED": True,
              "EARLY": True}),
            # mode "f16"'s x preparation: its own launch, and the input norm that makes it instead
            ("triton_gguf_f16", "_prepare_x_kernel", {"x16_ptr": "*fp16", "xm_ptr": "*fp16", "xe_ptr": "*fp32"},
             {"BLOCK": 256, "SUB": 32, "CHUNKS": 16}),
            ("triton_gguf_f16", "_add_rms_norm_f16_kernel", {"x16_ptr": "*fp16", "xm_ptr": "*fp16", "xe_ptr": "*fp32"},
             {"HAS_RESIDUAL": True, "BLOCK": 4096, "CHUNK": 256, "SUB": 32}),
            ("triton_gemv", "_skinny_kernel", {}, {"HAS_BIAS": True, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256}),
            # packed GGUF (repacked Q4_K): mode "int" and mode "fma" (their partials: _reduce_kernel above)
            ("triton_gguf_repacked", "_repacked_int_kernel",
             {"c_ptr": "*i32", "h_ptr": "*i32", "s_ptr": "*i32", "d_ptr": "*i32", "y_ptr": "*fp32"},
             {"QTYPE": 1, "GROUP": 256, "LANES": 32, "PLANES": 8, "BLOCK_M": 16, "BLOCK_N": 64, "NG": 1,
              "REDUCE": 1, "NUM_STAGES": 2}),
            ("triton_gguf_repacked", "_repacked_kernel",
             {"c_ptr": "*i32", "h_ptr": "*i32", "s_ptr": "*i32", "d_ptr": "*i32", "y_ptr": "*fp32"},
             {"QTYPE": 1, "GROUP": 256, "LANES": 32, "PLANES": 8, "BLOCK_M": 1, "BLOCK_N": 32, "NG": 2,
              "USE_DOT": False, "REDUCE": 1, "NUM_STAGES": 2}),
            ("triton_gemv", "_split_k_kernel", {"out_ptr": "*fp32"},
             {"HAS_BIAS": False, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT": 2}),
            ("triton_gemv", "_split_k_kernel", {}, {"HAS_BIAS": True, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT": 1}),
        ]:
            module, name, types, constexprs = args
            label = name + ("-early" if constexprs.get("EARLY") else "") + ("-w8a8" if constexprs.get("X_FP8") else "")
            compile_sm90(label, module, name, types, {**constexprs, **on})
""")


def _compile(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", COMPILE, *args], env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode == 3:
        pytest.skip("this triton has no ahead-of-time compile API")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_fused_kv_write_compiles_for_sm90_in_every_variant():
    lines = _compile("fused-write")
    assert [line.split()[0] for line in lines] == [f"fused-write-fp8={f}-norm={n}-heads={h}"
                                                   for f in (0, 1) for n in (0, 1) for h in (1, 16)]
    for line in lines:
        assert int(line.split()[2]) > 0, line  # it writes q and the cache
        assert line.split()[4] == "0", line  # PDL off: no grid-dependency instructions


def test_hardware_e4m3_rounding_compiles_to_the_cast_with_fewer_instructions():
    """`triton_fp8_fast.HARDWARE_E4M3_ROUNDING`: the quantizers leave the rounding to the cast's cvt.rn."""
    software = {line.split()[0]: line.split() for line in _compile("e4m3-rounding", "sw")}
    hardware = {line.split()[0]: line.split() for line in _compile("e4m3-rounding", "hw")}
    assert set(software) == set(hardware) == {"_quantize_rows_kernel", "_add_rms_norm_quantize_kernel"}
    for name, hw in hardware.items():
        assert int(hw[4]) > 0, hw  # the cast rounds, two values an instruction
        assert int(hw[2]) < int(software[name][2]), (hw, software[name])


def test_the_decode_split_kernel_merging_in_its_last_program_compiles_for_sm90():
    """`triton_decode.MERGE_IN_SPLIT`: one acquire-release atomic a program (its arrival), the merge's loads from
    L2 (other programs wrote them), in every output form."""
    lines = _compile("merge-last")
    assert [line.split()[0] for line in lines] == ["merge-last-bf16", "merge-last-e4m3", "merge-last-quantized"]
    for line in lines:
        fields = line.split()
        count = dict(zip(fields[1::2], map(int, fields[2::2])))
        assert count["atomics"] == 1 and count["acq-rel-atomics"] == 1, line  # one arrival, acquire-release at GPU scope
        assert count["cg-loads"] > 0 and count["barriers"] > 0, line  # loads from L2; a barrier before the arrival


def test_argmax_kernels_compile_for_sm90():
    lines = _compile("argmax")
    assert [line.split()[0] for line in lines] == ["argmax-chunks-bf16", "argmax-chunks-fp32", "argmax-merge"]
    for line in lines:
        assert int(line.split()[2]) > 0 and line.split()[4] == "0", line  # it stores; no PDL


def test_every_pdl_kernel_compiles_for_sm90_with_its_wait():
    lines = _compile("pdl")
    assert len(lines) == 40
    for line in lines:
        name, _, stores, _, waits, _, e4m3_mma = line.split()[:7]
        assert int(stores) > 0, line
        assert int(waits) == 2, line  # griddepcontrol.wait, then launch_dependents
        # e4m3 rows reach the tensor cores as e4m3 (no widening to bf16 on the way)
        assert (int(e4m3_mma) > 0) == name.endswith("-w8a8"), line
        # nothing read before the wait, but the early weights of `pdl.early_weights` (one-row products' first
        # tile, the norms' weight)
        assert (int(line.split()[-1]) > 0) == ("-early" in name), line


def test_gguf_int_mode_compiles_for_sm90_at_64_rows_on_the_tensor_cores():
    lines = _compile("gguf-int")
    assert [line.split()[0] for line in lines] == [f"gguf-int-{q}" for q in ("Q4_K", "Q5_K", "Q6_K", "Q8_0")]
    for line in lines:
        fields = line.split()
        assert int(fields[2]) > 0 and int(fields[8]) > 0, line  # it stores, through wgmma
        assert int(fields[10]) <= 227 * 1024, line  # fits an H200 SM's shared memory


def test_gguf_f16_modes_compile_for_sm90_on_the_tensor_cores():
    """Q4_K exact and scaled, and Q6_K scaled (its codes' offset taken by the HSUB2 before the HMUL2)."""
    lines = _compile("gguf-f16")
    assert [line.split()[0] for line in lines] == ["gguf-f16-Q4_K", "gguf-f16s-Q4_K", "gguf-f16s-Q6_K"]
    for line in lines:
        fields = line.split()
        assert int(fields[2]) > 0 and int(fields[4]) == 2 and int(fields[8]) > 0, line  # stores, PDL, wgmma
        assert int(fields[10]) <= 227 * 1024, line
        assert (int(fields[18]) > 0) == ("f16s" in fields[0]), line  # HSUB2 only where the weights are scaled


def test_gguf_dot_mode_compiles_for_sm90_at_64_rows_on_the_tensor_cores():
    fields = _compile("gguf-dot")[0].split()
    assert fields[0] == "gguf-dot-Q4_K" and int(fields[2]) > 0, fields
    assert int(fields[8]) > 0, fields  # a 64-row tile: wgmma (below 64 rows the older mma)
    assert int(fields[10]) <= 227 * 1024, fields


def test_gguf_h2_mode_compiles_for_sm90_with_float16_pair_fmas():
    lines = _compile("gguf-h2")
    assert [line.split()[0] for line in lines] == [f"gguf-h2-s{s}-{q}" for q in ("Q4_K", "Q6_K")
                                                   for s in ("0", "1", "2", "0-early")]
    for line in lines:
        fields = line.split()
        assert int(fields[2]) > 0 and fields[4] == "2", line  # it stores (the partial, the scratch); PDL's wait
        assert int(fields[16]) >= 2, line  # the weights' and the sums' HFMA2 (inline PTX), not emulated
        # the first group's codes and scales before the wait only with `pdl.early_weights`
        assert (int(fields[-1]) > 0) == ("-early-" in fields[0]), line


def test_gguf_g16_mode_compiles_for_sm90_with_one_wgmma_left_in_flight():
    """Mode "g16" (Gluon): eight planes a group, each plane's wgmma waited for only down to one in flight
    (`wait_group 1`), so that the next plane's dequantization overlaps it; one full wait a group, before
    the x buffers are written again."""
    lines = _compile("gguf-g16")
    assert [line.split()[0] for line in lines] == [
        "gguf-g16-Q4_K-m8-n64-w4-s2", "gguf-g16-Q4_K-m64-n128-w4-s1", "gguf-g16-Q4_K-m16-n128-w4-s1",
        "gguf-g16-Q4_K-m64-n128-w8-s2", "gguf-g16-Q6_K-m8-n64-w4-s2", "gguf-g16-Q6_K-m64-n64-w4-s1"]  # w8: two warp groups
    for line in lines:
        fields = line.split()
        planes = 16 if "Q6_K" in fields[0] else 8  # a super-block's planes, a wgmma each
        assert int(fields[2]) >= planes, line  # (more where a tile takes two instructions)
        assert int(fields[4]) == planes and int(fields[6]) >= 1, line
        assert int(fields[8]) <= 227 * 1024 and int(fields[10]) > 0, line
        # the weights two at a time in the inline PTX, a plane's worth at least each; one x copy a turn: a
        # barrier before it, the wait's, the group's end and the epilogue's (a copy a plane had one each;
        # with two warp groups Triton 3.9, not the H200's 3.6, adds its own)
        assert int(fields[14]) >= planes and (int(fields[12]) <= 6 or "-w8-" in fields[0]), line


def test_gguf_i8_mode_compiles_for_sm90_with_dp4a_and_prmt():
    lines = _compile("gguf-i8")
    assert [line.split()[0] for line in lines] == [name for q in ("Q4_K", "Q8_0") for name in (
        f"gguf-i8-n32-g4-s1-{q}", f"gguf-i8-n128-g1-q4-{q}", f"gguf-i8-quantize-{q}")]
    for line in lines:
        fields = line.split()
        assert int(fields[2]) > 0, line  # it stores
        if "quantize" not in fields[0]:
            assert int(fields[4]) == 2, line  # PDL's wait and launch
            # per four lanes: one DP4A a plane, two PRMT stages of 4 x 4 byte transposes
            assert int(fields[12]) > 0 and int(fields[14]) >= 2 * int(fields[12]), line
