"""Registers and spills of the decode attention kernels as the H200 compiles them, with no GPU.

    python3 tools/decode_registers.py [--warps 2,4] [--splits 1,8] [--caches bf16,e4m3] [--tiles 32,64] [--merge-last]

Compiles `triton_decode`'s split kernel (8B shape: 4 query heads a KV head, head_dim 128, 16-token blocks,
PDL on; keys a loop turn from --tiles) and its merge kernel for sm_90 with Triton's ahead-of-time compiler,
specialized as a launch specializes them (pointers and strides divisible by 16), and prints
each variant's registers a thread and STACK bytes a thread (spilled registers) from the bundled
`cuobjdump`. Run it on the device's Triton (`bash tools/device_triton.sh`, then
PYTHONPATH=.device_triton): versions allocate differently. Session 32, triton 3.6.0: the shipped split
kernel (64-key tiles, 2 warps) holds 168-236 registers a thread, no spills (3.9.0: 198-255).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.pop("TRITON_INTERPRET", None)  # the interpreter's `triton.jit` gives no compilable kernels

from tools.sass_loop_count import cubin_resources  # noqa: E402

SHAPE = {"GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "PDL": True}
MERGE_WARPS = 4  # the merge launches on Triton's default warps
TYPES = {"part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "tables_ptr": "*i32", "lens_ptr": "*i32",
         "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "s_ptr": "*fp32", "count_ptr": "*i32"}


def compile_resources(kernel_name: str, warps: int, splits: int, cache: str, tile: int = 64,
                      merge_last: bool = False) -> dict[str, int]:
    """`cubin_resources` of triton_decode's `kernel_name` compiled for sm_90 with `warps`, NUM_SPLITS `splits`,
    `tile` keys a loop turn and a `cache` ("bf16" or "e4m3") KV cache (e4m3 with float16 products, as shipped);
    `merge_last`: the split kernel merging in its last program (`triton_decode.MERGE_IN_SPLIT`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from onebit.kernels import triton_decode

    fn = getattr(triton_decode, kernel_name)
    e4m3 = cache == "e4m3"
    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default},
                  **SHAPE, "TILE": tile, "NUM_SPLITS": splits, "KV_FP8": e4m3, "DOT_F16": e4m3,
                  "MERGE_LAST": merge_last}
    constexprs = {name: value for name, value in constexprs.items() if name in fn.arg_names}
    types = {**TYPES, **({"k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv"} if e4m3 else {})}
    signature = {name: "constexpr" if name in constexprs else
                 types.get(name, "*bf16" if name.endswith("_ptr") else "fp32" if name == "scale" else "i32")
                 for name in fn.arg_names}
    # as a launch specializes them: pointers and strides divisible by 16 (vector loads; without it each
    # thread loads one element at a time and the counts differ)
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in fn.arg_names
             if name not in constexprs and (name.endswith("_ptr") or name.startswith("stride_"))}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "launch_pdl": True})
    return cubin_resources(kernel.asm["cubin"])


def _report(name: str, warps: int, splits: int, cache: str, tile: int, merge_last: bool = False) -> None:
    used = compile_resources(name, warps, splits, cache, tile, merge_last)
    label = name + (" merging in its last program" if merge_last else "")
    print(f"{label} tile={tile} warps={warps} splits={splits} cache={cache}: {used.get('REG')} registers, "
          f"{used.get('STACK')} bytes of stack a thread")


def main() -> int:
    """Prints one line a variant: kernel, warps, splits, cache, registers, spilled bytes a thread (the split
    kernel at each of --warps, the merge at the warps it launches with)."""
    import triton

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warps", default="2,4", help="warps a program (the shipped launch: 2)")
    ap.add_argument("--splits", default="1,8", help="NUM_SPLITS values (1: the split kernel writes the output)")
    ap.add_argument("--caches", default="bf16,e4m3")
    ap.add_argument("--tiles", default="64", help="keys a loop turn (`triton_decode.LAUNCH`: 64)")
    ap.add_argument("--merge-last", action="store_true",
                    help="also the split kernel merging in its last program (`triton_decode.MERGE_IN_SPLIT`)")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, sm_90")
    tiles = [int(t) for t in args.tiles.split(",")]
    for tile in tiles:
        for warps in (int(w) for w in args.warps.split(",")):
            for splits in (int(s) for s in args.splits.split(",")):
                for cache in args.caches.split(","):
                    _report("_decode_split_kernel", warps, splits, cache, tile)
                    if args.merge_last and splits > 1:
                        _report("_decode_split_kernel", warps, splits, cache, tile, merge_last=True)
    for splits in (int(s) for s in args.splits.split(",") if int(s) > 1):
        for cache in args.caches.split(","):
            _report("_decode_merge_kernel", MERGE_WARPS, splits, cache, tiles[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
