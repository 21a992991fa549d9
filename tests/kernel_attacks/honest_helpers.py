"""An honest GEMV: a jit helper, tl.range, multiple_of / max_contiguous, static_assert, device_assert, a tl.constexpr global, eviction_policy."""
import triton, triton.language as tl

ZERO = tl.constexpr(0.0)

@triton.jit
def _tile(w_ptr, x_ptr, rows, row_mask, n0, N, stride_wm, BLOCK_N: tl.constexpr):
    cols = n0 + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_N), BLOCK_N)
    w = tl.load(w_ptr + rows[:, None] * stride_wm + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=ZERO,
                eviction_policy="evict_first")
    xv = tl.load(x_ptr + cols, mask=col_mask, other=ZERO)
    return tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)

@triton.jit
def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.static_assert(BLOCK_N >= 1, "BLOCK_N")
    pid = tl.program_id(axis=0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for t in tl.range(0, tl.cdiv(N, BLOCK_N)):
        acc += _tile(w_ptr, x_ptr, rows, row_mask, t * BLOCK_N, N, stride_wm, BLOCK_N)
    tl.device_assert(pid >= 0, "pid")
    tl.store(y_ptr + rows, acc, mask=row_mask)
