"""onebit.kernels.int8_ops against torch: byte permute, 4 x 4 byte transpose and four-byte dot
products, on random words including every byte's extremes. On the CPU the kernels run in Triton's
interpreter, so the plain-integer spelling (ASM false) is what is checked here; the PTX spelling is
checked for its instructions by tests/test_triton_sm90_compile.py, and on a GPU by this test."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from onebit.kernels.int8_ops import byte_perm, dot4, transpose_bytes  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ASM = DEVICE == "cuda"
SELECTORS = (0x3210, 0x5140, 0x7362, 0x5410, 0x7632, 0x0123, 0x4747)


@triton.jit
def _ops_kernel(a_ptr, b_ptr, c_ptr, perm_ptr, t_ptr, dot_ptr, N: tl.constexpr, ASM: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i)
    b = tl.load(b_ptr + i)
    c = tl.load(c_ptr + i)
    tl.store(perm_ptr + i, byte_perm(a, b, 0x3210, ASM))
    tl.store(perm_ptr + N + i, byte_perm(a, b, 0x5140, ASM))
    tl.store(perm_ptr + 2 * N + i, byte_perm(a, b, 0x7362, ASM))
    tl.store(perm_ptr + 3 * N + i, byte_perm(a, b, 0x5410, ASM))
    tl.store(perm_ptr + 4 * N + i, byte_perm(a, b, 0x7632, ASM))
    tl.store(perm_ptr + 5 * N + i, byte_perm(a, b, 0x0123, ASM))
    tl.store(perm_ptr + 6 * N + i, byte_perm(a, b, 0x4747, ASM))
    t0, t1, t2, t3 = transpose_bytes(a, b, c, a ^ b, ASM)
    tl.store(t_ptr + i, t0)
    tl.store(t_ptr + N + i, t1)
    tl.store(t_ptr + 2 * N + i, t2)
    tl.store(t_ptr + 3 * N + i, t3)
    tl.store(dot_ptr + i, dot4(a, b, c, False, ASM))
    tl.store(dot_ptr + N + i, dot4(a, b, c, True, ASM))


def _bytes(words: torch.Tensor) -> torch.Tensor:
    """int32 [N] -> its bytes [N, 4] as int64 0..255, byte 0 first."""
    return torch.stack([(words.long() >> (8 * k)) & 255 for k in range(4)], dim=1)


def _words(byte_rows: torch.Tensor) -> torch.Tensor:
    """[N, 4] bytes 0..255 -> int32 words (byte 0 lowest)."""
    w = sum(byte_rows[:, k].long() << (8 * k) for k in range(4))
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def test_byte_ops_match_torch():
    n = 256
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(-2**31, 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32) for _ in range(3))
    a[:4] = torch.tensor([0, -1, 0x7F7F7F7F, -0x7F7F7F80], dtype=torch.int32)  # 0x00.., 0xFF.., 0x7F.., 0x80..
    b[:4] = torch.tensor([-1, -0x7F7F7F80, 0x7F7F7F7F, 0], dtype=torch.int32)
    c = c % 2**20  # an accumulator far from overflow
    perm = torch.empty(len(SELECTORS), n, dtype=torch.int32)
    t = torch.empty(4, n, dtype=torch.int32)
    dots = torch.empty(2, n, dtype=torch.int32)
    args = [v.to(DEVICE) for v in (a, b, c, perm, t, dots)]
    _ops_kernel[(1,)](*args, N=n, ASM=ASM)
    perm, t, dots = (v.cpu() for v in args[3:])

    eight = torch.cat([_bytes(a), _bytes(b)], dim=1)  # b:a, a's bytes first
    for row, selector in enumerate(SELECTORS):
        picks = [(selector >> (4 * i)) & 7 for i in range(4)]
        assert torch.equal(perm[row], _words(eight[:, picks])), hex(selector)

    rows = torch.stack([_bytes(a), _bytes(b), _bytes(c), _bytes(a ^ b)], dim=1)  # [N, row i, byte k]
    for k in range(4):
        assert torch.equal(t[k], _words(rows[:, :, k])), k

    ua, ub = _bytes(a), _bytes(b)
    sa, sb = torch.where(ua > 127, ua - 256, ua), torch.where(ub > 127, ub - 256, ub)
    assert torch.equal(dots[0].long(), c.long() + (ua * sb).sum(dim=1))
    assert torch.equal(dots[1].long(), c.long() + (sa * sb).sum(dim=1))
