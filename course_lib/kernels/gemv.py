"""GEMV, y = W x: a Triton kernel beside its PyTorch reference (Lab 1, roofline).

Shapes and dtypes (both functions):
    W: (M, N), float32 or bfloat16, any strides (a view into a larger buffer is fine).
    x: (N,), the same dtype and device as W, any stride.
    y: (M,), float32; every product is accumulated in float32.

Roofline (source: Williams, Waterman, Patterson, "Roofline", CACM 2009; Lab 1 of the course):
GEMV reads each weight once and does one multiply and one add with it, so its arithmetic
intensity is about 2*M*N FLOP / (M*N*b bytes) = 2/b FLOP/byte for b bytes per weight
(0.5 for float32, 1 for bfloat16). That is far below the ridge point of any GPU or CPU
(tens to hundreds of FLOP/byte), so GEMV is memory-bound: its time bound is
bytes / bandwidth with bytes = M*N*b (W) + N*b (x) + 4*M (y), and a good kernel reaches a
large fraction of the device's memory bandwidth. ``bench_gemv`` measures that fraction.

Kernel design: each program owns ``block_m`` rows; it loops over the columns in blocks of
``block_n``, loads a (block_m, block_n) tile of W and a block of x with masks (so sizes need
not be multiples of the blocks and nothing outside W or x is read), multiplies in float32
and reduces along the columns into a float32 accumulator of ``block_m`` values.
"""
from __future__ import annotations

import torch

from ..validation import instance, power_of_two
from . import check_tile, fallback_notice, import_triton, kernel_interpreted, notice_once, triton_mode

__all__ = ["reference_gemv", "gemv", "check_gemv_inputs", "SUPPORTED_DTYPES", "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N"]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
DEFAULT_BLOCK_M = 16
DEFAULT_BLOCK_N = 256

triton, tl = import_triton()

if triton is not None:

    @triton.jit
    def _gemv_kernel(
        w_ptr, x_ptr, y_ptr,
        M, N,
        stride_wm, stride_wn, stride_x,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        # int64 offsets: rows * stride_wm overflows int32 for W of more than 2**31 elements.
        row_off = rows.to(tl.int64) * stride_wm
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            w = tl.load(
                w_ptr + row_off[:, None] + cols.to(tl.int64)[None, :] * stride_wn,
                mask=row_mask[:, None] & col_mask[None, :],
                other=0.0,
            )
            xv = tl.load(x_ptr + cols.to(tl.int64) * stride_x, mask=col_mask, other=0.0)
            acc += tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)
        tl.store(y_ptr + rows, acc, mask=row_mask)
else:
    _gemv_kernel = None

#: Whether ``@triton.jit`` built the kernel for the interpreter (TRITON_INTERPRET at this module's import).
KERNEL_INTERPRETED = kernel_interpreted(_gemv_kernel)


def check_gemv_inputs(W: torch.Tensor, x: torch.Tensor) -> tuple[int, int]:
    """(M, N) of a GEMV's W and x after checking them as :func:`reference_gemv` documents (its Raises)."""
    instance("W", W, torch.Tensor)
    instance("x", x, torch.Tensor)
    if W.dim() != 2:
        raise ValueError(f"W must have rank 2 (M, N), got shape {tuple(W.shape)}")
    if x.dim() != 1:
        raise ValueError(f"x must have rank 1 (N,), got shape {tuple(x.shape)}")
    M, N = W.shape
    if x.shape[0] != N:
        raise ValueError(f"x has {x.shape[0]} elements but W has N={N} columns; expected x of shape ({N},)")
    if W.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"W.dtype must be float32 or bfloat16, got {W.dtype}")
    if x.dtype != W.dtype:
        raise ValueError(f"x.dtype must equal W.dtype ({W.dtype}), got {x.dtype}")
    if x.device != W.device:
        raise ValueError(f"x is on {x.device} but W is on {W.device}; expected the same device")
    return M, N


def reference_gemv(W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y = W x in plain PyTorch: the specification the Triton kernel is tested against.

    Args:
        W: (M, N) float32 or bfloat16 tensor, any strides.
        x: (N,) tensor, same dtype and device as W.

    Returns:
        y: (M,) float32 tensor on W's device (inputs upcast to float32, float32 accumulation).

    Raises:
        TypeError: W or x is not a tensor.
        ValueError: wrong ranks, mismatched N, unsupported or mismatched dtype, different devices.
    """
    check_gemv_inputs(W, x)
    return W.to(torch.float32) @ x.to(torch.float32)


def gemv(
    W: torch.Tensor,
    x: torch.Tensor,
    block_m: int = DEFAULT_BLOCK_M,
    block_n: int = DEFAULT_BLOCK_N,
    num_warps: int | None = None,
) -> torch.Tensor:
    """y = W x with the Triton kernel; same contract as :func:`reference_gemv`.

    Args:
        W: (M, N) float32 or bfloat16 tensor, any strides.
        x: (N,) tensor, same dtype and device as W, any stride.
        block_m: rows per program (power of two).
        block_n: columns per loop step (power of two).
        num_warps: passed to the launch on a GPU (Triton's default when None).

    Returns:
        y: (M,) float32 tensor on W's device.

    Dispatch (see :func:`course_lib.kernels.triton_mode`): the kernel runs compiled on CUDA
    tensors in ``"native"`` mode and interpreted on CPU tensors in ``"interpreter"`` mode;
    in every other case (no triton, no GPU, CPU tensors without the interpreter) the result
    comes from :func:`reference_gemv` and a one-line notice is printed once.

    Raises:
        TypeError / ValueError: as :func:`reference_gemv`; ValueError for a block that is not
        a positive power of two, or a block_m x block_n tile past ``MAX_TILE_ELEMENTS``.
    """
    M, N = check_gemv_inputs(W, x)
    block_m = power_of_two("block_m", block_m, note="tl.arange needs one")
    block_n = power_of_two("block_n", block_n, note="tl.arange needs one")
    check_tile("gemv", block_m=block_m, block_n=block_n)

    fallback = fallback_notice("course_lib.kernels.gemv", "gemv", _gemv_kernel, triton_mode(), W)
    if fallback is not None:
        notice_once(*fallback)
        return reference_gemv(W, x)

    y = torch.empty(M, dtype=torch.float32, device=W.device)
    if M == 0:
        return y
    if N == 0:
        return y.zero_()
    grid = (triton.cdiv(M, block_m),)
    kwargs = {} if num_warps is None or KERNEL_INTERPRETED else {"num_warps": num_warps}
    _gemv_kernel[grid](
        W, x, y,
        M, N,
        W.stride(0), W.stride(1), x.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n,
        **kwargs,
    )
    return y
