"""Linear layers of the graphs' row counts: cuBLAS, cuBLASLt or a Triton kernel, whichever measured faster.

`calibrate(layers, rows)` times `F.linear` against each Triton candidate (`triton_gemv`, up to
MAX_CALIBRATED_ROWS rows) and against `F.linear` through cuBLASLt (`CUBLASLT`: torch's
`preferred_blas_library("cublaslt")`, another heuristic over the same GPU's kernels) for every weight
shape and each row count in `rows`, inside CUDA graphs over copies of the weight that do not fit in L2
(`timing.ProductTimer`), as decode steps run them; it checks each result against `F.linear` on the
spot and keeps a candidate only where it is correct and faster. `linear()` then dispatches inputs of a
calibrated (device type, shape, rows) to the winner and everything else to `F.linear`. Nothing is
chosen where nothing was measured, so CPU runs always take `F.linear`.

cuBLASLt is there for the many-row steps (graph steps with a prompt chunk, B = 64-256): session 24's
`bench/gpu_blas_rows.py` on the H200 had cuBLAS's own pick for down_proj (4096x12288) at 192 rows 52.5 us
against cuBLASLt's 41.5, and 31.5 against 27.8 at 64 rows; equal within 1% on most other points.
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn.functional as F

from onebit.kernels import batch_invariant
from onebit.kernels.timing import ProductTimer, candidate_agrees

log = logging.getLogger(__name__)

try:
    from onebit.kernels import triton_gemv
except ImportError:  # pragma: no cover - depends on the install
    triton_gemv = None

# The most rows a Triton candidate takes (cuBLASLt is timed at every row count asked).
MAX_CALIBRATED_ROWS = triton_gemv.MAX_SPLIT_K_ROWS if triton_gemv is not None else 0

# The choice of F.linear through cuBLASLt, in _CHOSEN beside the Triton (kernel name, config) pairs.
CUBLASLT = ("cublaslt", ())

# One row of an MLP's [gate | up] product whose calibrated pick is the gemv kernel: the product applies SiLU *
# mul itself (`linear_silu_mul`) and the SiLU kernel's 36 launches a step go, as FP8's `SILU_IN_GATE_UP` does.
# Session 29 on the H200: bf16 B=1 236.2 -> 237.7 tok/s, B=32 unchanged (docs/perf-history.md).
SILU_IN_GATE_UP = True

# (device type, rows, N, K, dtype, has bias) -> (kernel name, config); cases where cuBLAS won are absent.
_CHOSEN: dict[tuple[str, int, int, int, torch.dtype, bool], tuple[str, tuple]] = {}


@contextlib.contextmanager
def cublaslt():
    """torch's products inside run through cuBLASLt (the preferred BLAS library restored after)."""
    backends = torch.backends.cuda
    before = backends.preferred_blas_library()
    backends.preferred_blas_library("cublaslt")
    try:
        yield
    finally:
        backends.preferred_blas_library(before)


def offers_cublaslt(weight: torch.Tensor) -> bool:
    """Whether the calibration times cuBLASLt for this weight: a CUDA weight (on ROCm torch's switch means
    hipBLASLt, which nothing here has measured)."""
    return weight.is_cuda and torch.version.hip is None


def run_choice(choice: tuple[str, tuple], x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias by a calibrated choice: `CUBLASLT` or a Triton (kernel, config)."""
    if choice == CUBLASLT:
        with cublaslt():
            return F.linear(x, weight, bias)
    return triton_gemv.KERNELS[choice[0]](x, weight, bias, choice[1])


def _choice_key(device: torch.device, rows: int, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    # `_CHOSEN`'s key of a product of `rows` input rows by this weight (and bias) on `device`
    return device.type, rows, weight.shape[0], weight.shape[1], weight.dtype, bias is not None


def choice_for(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[str, tuple] | None:
    """The choice calibrated for this product (`CUBLASLT` or a Triton (kernel, config)), or None for
    `F.linear`."""
    return _CHOSEN.get(_choice_key(x.device, x.shape[0], weight, bias))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through cuBLASLt or a Triton kernel when x is an input of a (device, shape, rows) it
    won; in deterministic mode (`batch_invariant.mode`) through the batch-invariant product."""
    if batch_invariant.enabled():
        return batch_invariant.linear(x, weight, bias)
    chosen = _dispatched_choice(x, weight, bias)
    if chosen is not None:
        return run_choice(chosen, x, weight, bias)
    return F.linear(x, weight, bias)


def _dispatched_choice(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[str, tuple] | None:
    """`choice_for` where the calibrated kernels can take the operands (a contiguous 2-D x, a weight with unit
    column stride), else None."""
    if _CHOSEN and x.dim() == 2 and x.is_contiguous() and weight.stride(1) == 1:
        return choice_for(x, weight, bias)
    return None


def one_row_gemv_config(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple | None:
    """The gemv kernel's config where this weight's calibrated one-row pick is that kernel (not in
    deterministic mode), else None: the products a decoder layer may run with its norms folded in
    (`gemv_folded`)."""
    if batch_invariant.enabled() or weight.stride(1) != 1:
        return None
    chosen = _CHOSEN.get(_choice_key(weight.device, 1, weight, bias))
    return chosen[1] if chosen is not None and chosen[0] == "gemv" else None


def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """silu(gate) * up of `linear(x, weight, bias)` for an MLP's [gate | up] weight in one kernel, bit for bit
    the product followed by `ops.silu_mul`, where that applies (`SILU_IN_GATE_UP`, one contiguous row whose
    calibrated pick is the gemv kernel, `one_row_gemv_config`); else None, and the caller runs the two."""
    if not (SILU_IN_GATE_UP and x.dim() == 2 and x.shape[0] == 1 and x.is_contiguous() and weight.shape[0] % 2 == 0):
        return None
    config = one_row_gemv_config(weight, bias)
    return None if config is None else triton_gemv.gemv_silu_mul(x, weight, bias, config)


def gemv_folded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: tuple,
                norm_eps: float | None = None, residual: torch.Tensor | None = None,
                silu_mul: bool = False) -> torch.Tensor:
    """One row through the gemv kernel with `config` (`one_row_gemv_config`): with norm_eps, of x / rms(x)
    for a weight with its norm's weight folded in (`fold_norm_into`); with residual, plus that
    row; with silu_mul, silu(gate) * up of an MLP's [gate | up] weight."""
    if silu_mul:
        return triton_gemv.gemv_silu_mul(x, weight, bias, config, norm_eps=norm_eps)
    return triton_gemv.gemv(x, weight, bias, config, norm_eps=norm_eps, residual=residual)


def fold_norm_into(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] times an RMSNorm's weight [K] along its columns, in float32 and rounded once to the
    weight's dtype: the weight `gemv_folded(..., norm_eps=...)` multiplies the raw row by."""
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype)


def _correct_candidates(x, weight, bias, name: str) -> list[tuple[str, tuple]]:
    """The choices for x's row count that run and match F.linear: Triton (kernel, config) pairs, then
    `CUBLASLT` where offered."""
    want = F.linear(x, weight, bias).float()
    offered = list(triton_gemv.candidates(x.shape[0])) + ([CUBLASLT] if offers_cublaslt(weight) else [])
    return [choice for choice in offered
            if candidate_agrees(lambda choice=choice: run_choice(choice, x, weight, bias), want,
                                _label(*choice), name, log)]


def _label(kernel: str, config: tuple) -> str:
    return f"{kernel} {'/'.join(map(str, config))}".rstrip()


@torch.inference_mode()
def calibrate(layers: dict[str, tuple[torch.Tensor, torch.Tensor | None]], rows: list[int],
              timer=ProductTimer, device_types: tuple[str, ...] = ("cuda",)) -> list[str]:
    """Measure, per distinct weight shape among `layers` (name -> (weight, bias)) on a device of
    `device_types` and per row count in `rows`, cuBLAS against the Triton candidates and cuBLASLt;
    remember the winners. Returns one line per shape and row count (microseconds and TB/s of the weight
    bytes for cuBLAS and every correct candidate) and one summary line per shape, starting "few-row
    choice" (the row counts where Triton won, then where cuBLASLt did; cuBLAS's and the best candidate's
    TB/s per row count). `timer(weight)` gives the context manager that times (`ProductTimer`; a fake in
    unit tests, which also pass device_types ("cpu",) to run the kernels in Triton's interpreter).

    Cost at start-up, Qwen3-8B (5 shapes, 1.6 GB of bf16 weights), `--parallel 64` (rows 1, 2, 4,
    8, 12, 16, then 24-64 in steps of 8, then the graphs' larger steps to 512 for cuBLASLt alone): 20
    timings at 1 row (cuBLAS, 10 GEMV, 5 skinny and 3 split-K configs, cuBLASLt), 10 at each other count
    to 16, up to 9 at each count to 128 (cuBLAS, 5-7 split-K, cuBLASLt), 2 above; each timing is 1 warm-up call +
    7 replays x 20 calls of the product: ~10 s in all, plus the Triton compiles (cached on disk after
    the first start)."""
    if triton_gemv is None:
        return ["few-row linear: Triton is not installed, cuBLAS everywhere"]
    lines, seen = [], set()
    for name, (weight, bias) in layers.items():
        shape = (weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
        if shape in seen or weight.device.type not in device_types:
            continue
        seen.add(shape)
        n, k = weight.shape
        mbytes = weight.numel() * weight.element_size() / 1e6  # MB per microsecond is TB/s
        won_rows: dict[str, list[int]] = {"Triton": [], "cuBLASLt": []}
        speeds = []
        with timer(weight) as clock:
            for m in rows:
                x = torch.randn(m, k, device=weight.device, dtype=weight.dtype)
                cublas_us = clock.us(lambda w: F.linear(x, w, bias))
                candidate_us = {choice: clock.us(lambda w, choice=choice: run_choice(choice, x, w, bias))
                                for choice in _correct_candidates(x, weight, bias, name)}
                best = min(candidate_us, key=candidate_us.get, default=None)
                key = _choice_key(weight.device, m, weight, bias)
                if best is not None and candidate_us[best] < cublas_us:
                    _CHOSEN[key] = best
                    won_rows["cuBLASLt" if best == CUBLASLT else "Triton"].append(m)
                else:
                    _CHOSEN.pop(key, None)
                speeds.append(f"{m} {mbytes / cublas_us:.2f}/{f'{mbytes / candidate_us[best]:.2f}' if best else '-'}")
                each = ", ".join(f"{_label(*c)} {mbytes / us:.2f}" for c, us in candidate_us.items()) or "none ran"
                verdict = f"{_label(*best)} {candidate_us[best]:.1f} us" if key in _CHOSEN else "cuBLAS"
                lines.append(f"linear {name} {n}x{k}, {m} row(s): cuBLAS {cublas_us:.1f} us "
                             f"{mbytes / cublas_us:.2f} TB/s; candidates TB/s: {each} -> {verdict}")
        won = {kind: ",".join(map(str, at)) or "none" for kind, at in won_rows.items()}
        lines.append(f"few-row choice {name} {n}x{k}: Triton at rows {won['Triton']} of {','.join(map(str, rows))}; "
                     f"cuBLASLt at rows {won['cuBLASLt']}; TB/s cuBLAS/best candidate by rows: {', '.join(speeds)}")
    return lines


def picks() -> dict[str, dict[int, str]]:
    """The calibrated choices, for reports: {"NxK": {rows: "kernel config"}} ("cublaslt ()" for cuBLASLt;
    cuBLAS elsewhere)."""
    out: dict[str, dict[int, str]] = {}
    for (_, rows, n, k, _, _), (kernel, config) in sorted(_CHOSEN.items(), key=lambda item: item[0][1]):
        out.setdefault(f"{n}x{k}", {})[rows] = f"{kernel} {config}"
    return out


def chosen_state() -> list:
    """Every calibrated choice as JSON-ready lists (`onebit.engine.calibration_cache` keeps them on disk)."""
    return [[device, rows, n, k, str(dtype).removeprefix("torch."), bias, kernel, list(config)]
            for (device, rows, n, k, dtype, bias), (kernel, config) in _CHOSEN.items()]


def restore_chosen(state: list) -> None:
    """Make `chosen_state`'s choices the calibrated ones, as if `calibrate` had just found them."""
    _CHOSEN.clear()
    for device, rows, n, k, dtype, bias, kernel, config in state:
        _CHOSEN[(device, rows, n, k, getattr(torch, dtype), bias)] = (kernel, tuple(config))


def reset() -> None:
    """Forget every choice (tests)."""
    _CHOSEN.clear()
