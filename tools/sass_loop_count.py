"""Instructions per weight in the main loop of a repacked GGUF kernel, compiled for the H200 here.

    python3 tools/sass_loop_count.py --config fma-n32-g2 --rows 1 [--qtype Q4_K] [--top 12] [--pdl] [--maxnreg 128]

Compiles `triton_gguf_repacked`'s kernel for one `CONFIGS` entry and activation row count to sm_90
SASS (no GPU needed: Triton's ahead-of-time compiler and its bundled `nvdisasm`), specialized as a
launch specializes it (pointers and strides divisible by 16: without that the codes load one lane a
thread and the count nearly doubles), finds the longest backward branch (the K loop) and prints
its instruction count x threads / weights a turn, then the most frequent opcodes, then the
kernel's registers a thread (from the bundled `cuobjdump`) and shared memory. Run it on the device's
Triton (`bash tools/device_triton.sh`, then PYTHONPATH=.device_triton): another version allocates
registers differently (h2-n128-t1-s0: 160 a thread with 3.6.0, 108 with 3.9.0). A proxy for a
kernel bound by instruction issue (session 13: the 1-row "fma" kernel runs 7.4 a weight); whether
it is bound by that is for the device to say.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.pop("TRITON_INTERPRET", None)  # the interpreter's `triton.jit` gives no compilable kernels

DIVISIBLE = {"x_ptr", "xp_ptr", "xm_ptr", "xe_ptr", "K", "xq_ptr", "dx_ptr", "xs_ptr", "c_ptr", "h_ptr", "s_ptr", "d_ptr", "y_ptr", "out_ptr", "count_ptr", "N", "stride_xm",
             "stride_cn", "stride_hn", "stride_sn", "stride_ym", "stride_ysplit", "stride_om"}
TYPES = {"x_ptr": "*bf16", "c_ptr": "*i32", "h_ptr": "*i32", "s_ptr": "*i32", "d_ptr": "*i32", "y_ptr": "*fp32",
         "out_ptr": "*bf16", "count_ptr": "*i32", "xq_ptr": "*i32", "dx_ptr": "*fp32", "xs_ptr": "*fp32",
         "xp_ptr": "*i32"}


def compile_sass(config_name: str, rows: int, qtype: str, pdl: bool = False,
                 maxnreg: int | None = None) -> tuple[str, int, int, str]:
    """(SASS text, warps, weights a loop turn, a line naming its registers, spills and shared memory) of the
    kernel that `matmul_few_rows` launches for this config and row count (split-K partials summed by the
    reduce kernel); `pdl`: with programmatic dependent launch and the early weights, as the engine launches
    it; `maxnreg`: registers capped (Triton's option, `triton_gguf_h2.CAP_128_REGISTERS`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from onebit.kernels import triton_gguf_f16, triton_gguf_h2
    from onebit.kernels import triton_gguf_repacked as tr
    from onebit.kernels.gguf_repack import GROUPING

    config = tr.CONFIGS[config_name]
    if config.mode == "g16":
        return _compile_g16_sass(config, rows, qtype)
    group, lanes, _, planes = GROUPING[qtype]
    f16 = config.mode in tr.F16_MODES
    block_m = max(16, triton.next_power_of_2(rows)) if config.mode == "dot" or f16 else triton.next_power_of_2(rows)
    fn = triton_gguf_f16._f16_kernel if f16 else {"int": tr._repacked_int_kernel, "i8": tr._repacked_i8_kernel,
                                                  "h2": triton_gguf_h2._h2_kernel}.get(config.mode, tr._repacked_kernel)
    constexprs = {"QTYPE": tr.QTYPE_IDS[qtype], "GROUP": group, "LANES": lanes, "PLANES": planes, "BLOCK_M": block_m,
                  "BLOCK_N": config.block_n, "NG": config.ng, "REDUCE": 1, "NUM_STAGES": config.stages, "PDL": pdl, "ASM": True,
                  "QUADS": config.quads, "SCALED": config.mode == "f16s", "THREADS": config.quads, "SLICE_GROUPS": 4}
    if config.mode in ("fma", "dot"):
        constexprs["USE_DOT"] = config.mode == "dot"
    if config.mode == "h2":
        constexprs.update(triton_gguf_h2.kernel_constants(qtype), EARLY=pdl and config.stages != 1)
    # constexpr parameters left out take their defaults, as a launch that leaves them out does (EARLY, ...)
    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    constexprs = {name: value for name, value in constexprs.items() if name in fn.arg_names}
    types = {**TYPES, "d_ptr": "*fp32" if qtype == "Q6_K" and config.mode in ("int", "h2") else "*i32",
             "h_ptr": "*i16" if qtype == "Q6_K" else "*i32"}  # Q6_K's top bits are int16, as loaded
    if f16:
        types.update(x_ptr="*fp16", xm_ptr="*fp16", xe_ptr="*fp32")
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
             for name in DIVISIBLE if name in fn.arg_names and name not in constexprs}
    options = {"num_warps": config.warps, "launch_pdl": pdl} | ({"maxnreg": maxnreg} if maxnreg else {})
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=options)
    sass, resources = _disassemble(kernel)
    return sass, config.warps, config.block_n * config.ng * group, resources


def _compile_g16_sass(config, rows: int, qtype: str) -> tuple[str, int, int, str]:
    """`compile_sass` for mode "g16" (a Gluon kernel, Q4_K or Q6_K, compiled by its module's `compile_sm90`)."""
    import triton

    from onebit.kernels import gluon_gguf_g16 as g16

    kernel = g16.compile_sm90(max(8, triton.next_power_of_2(rows)), config.block_n, 1, config.stages,
                              config.warps, qtype)
    sass, resources = _disassemble(kernel)
    return sass, config.warps, config.block_n * 256, resources  # a loop turn: one 256-column super-block


def _disassemble(kernel) -> tuple[str, str]:
    """(SASS text, a line naming registers a thread and shared memory) of a compiled kernel."""
    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    used = cubin_resources(kernel.asm["cubin"])
    return sass, (f"{used.get('REG', '?')} registers a thread, {used.get('STACK', '?')} bytes of stack a thread "
                  f"(spills), {kernel.metadata.shared} bytes of shared memory a program")


def cubin_resources(cubin: bytes) -> dict[str, int]:
    """A compiled kernel's resource counts as the bundled `cuobjdump --dump-resource-usage` prints them: REG
    (registers a thread), STACK (bytes a thread: spills and local arrays), SHARED (static shared bytes)..."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(path)], capture_output=True,
                               text=True).stdout
    return {name: int(value) for name, value in re.findall(r"\b([A-Z]+):(\d+)", usage)}


def loop_body(sass: str) -> list[str]:
    """The instructions of the longest loop: from a label to the backward branch that returns to it."""
    labels, pending, code, best = {}, None, [], (0, -1)
    for line in sass.splitlines():
        label = re.match(r"\s*\.L_x_(\d+):", line)
        if label:
            pending = label.group(1)
            continue
        found = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if not found:
            continue
        address = int(found.group(1), 16)
        code.append((address, found.group(2)))
        if pending is not None:
            labels[pending], pending = address, None
        branch = re.search(r"BRA `\(\.L_x_(\d+)\)", line)
        if branch and labels.get(branch.group(1), address) < address:
            start = labels[branch.group(1)]
            if address - start > best[1] - best[0]:
                best = (start, address)
    return [text for address, text in code if best[0] <= address <= best[1]]


def opcode(instruction: str) -> str:
    """`@P0 FFMA.FTZ R1, ...` -> FFMA."""
    return re.sub(r"^@!?U?P[T\d]+\s+", "", instruction).split()[0].split(".")[0]


def main() -> int:
    """Print the loop's instructions per weight and its most frequent opcodes."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a triton_gguf_repacked.CONFIGS name")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--qtype", default="Q4_K", choices=("Q4_K", "Q5_K", "Q6_K", "Q8_0"))
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--pdl", action="store_true", help="PDL on, with the early weights (as the engine launches)")
    ap.add_argument("--maxnreg", type=int, default=None, help="cap the registers a thread (Triton's maxnreg)")
    args = ap.parse_args()
    sass, warps, weights, resources = compile_sass(args.config, args.rows, args.qtype, args.pdl, args.maxnreg)
    body = loop_body(sass)
    if not body:
        print("no loop found", file=sys.stderr)
        return 1
    per_weight = warps * 32 / weights
    print(f"{args.config} {args.qtype} {args.rows} row(s): {len(body)} instructions a thread a loop turn, "
          f"{len(body) * per_weight:.2f} per weight")
    for op, count in collections.Counter(map(opcode, body)).most_common(args.top):
        print(f"  {op:12s} {count:5d}  {count * per_weight:.2f} per weight")
    print(resources)
    return 0


if __name__ == "__main__":
    sys.exit(main())
