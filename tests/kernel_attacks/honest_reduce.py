"""An honest GEMV: tl.reduce with a jit combine function, tl.where, static_range."""
import triton, triton.language as tl

@triton.jit
def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for n0 in tl.static_range(0, 1):
        pass
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        m = (rows[:, None] < M) & (cols[None, :] < N)
        w = tl.load(w_ptr + rows[:, None] * stride_wm + cols[None, :], mask=m, other=0.0).to(tl.float32)
        xv = tl.load(x_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc = acc + tl.where(m, w * xv[None, :], 0.0)
    y = tl.reduce(acc, 1, _add)
    tl.store(y_ptr + rows, y, mask=rows < M)

@triton.jit
def _add(a, b):
    return a + b
