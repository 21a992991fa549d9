"""Batch-invariant matmul and RMSNorm as Triton kernels, each beside a PyTorch reference.

Why (source: Thinking Machines Lab, He et al., "Defeating Nondeterminism in LLM Inference", 2025,
https://thinkingmachines.ai/blog/defeating-nondeterminism-in-llm-inference/ ; vLLM's batch-invariant
mode, ``VLLM_BATCH_INVARIANT=1``, ``vllm/model_executor/layers/batch_invariant.py``): a library
matmul chooses its tiling, its split of the K reduction (split-K) and its kernel from the shape of
the call, so the float32 additions of row i are done in an order that depends on how many other
rows are in the batch. Floating-point addition is not associative, so row i's result changes by a
rounding error with the batch size, and a prompt decoded alone and the same prompt decoded in a
batch drift apart. The cure is to fix the reduction order of every output element once and for all.

What is fixed here, and so what makes these kernels batch-invariant:

- :func:`matmul`: the block sizes ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K`` and ``NUM_WARPS`` are module
  constants (no autotuning, nothing chosen from M, no split-K). Each program owns one
  (BLOCK_M, BLOCK_N) tile of y and walks K from 0 upward in steps of BLOCK_K, adding each step's
  ``tl.dot`` into one float32 accumulator. Element (i, j) of y is therefore the same chain of
  operations on row i of x and row j of weight whatever M is and wherever row i sits in the batch
  (rows beyond M are masked to zero and a dot product never mixes rows). M is also excluded from
  Triton's argument specialisation (``do_not_specialize``), so every M runs the same compiled code.
- :func:`rms_norm`: one program per row; the row's sum of squares is accumulated in float32 over D
  from 0 upward in fixed chunks of ``BLOCK_D``, then reduced by one ``tl.sum`` of fixed width. The
  number of rows R never enters a program.

The invariance is across batch size and row position for one device, dtype, triton version, (N, K)
or D, and stride pattern; it is not a promise that two GPUs, or the kernel and the reference, agree
bit for bit (they agree within the float32 rounding bounds stated in the tests).

Shapes and dtypes:
    matmul: x (M, K) float32 or bfloat16, weight (N, K) the same dtype and device (``nn.Linear.weight``
        layout), both any strides; y = x @ weight.T is (M, N) float32, accumulated in float32
        (float32 inputs use true float32 products, ``input_precision="ieee"``, not TF32).
    rms_norm: x (R, D) float32 or bfloat16, weight (D,) float32 or bfloat16, eps > 0;
        y = x * rsqrt(mean(x^2) + eps) * weight computed in float32, returned (R, D) in x's dtype
        (Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019).

Dispatch follows ``course_lib.kernels.gemv`` (see :func:`course_lib.kernels.triton_mode`): compiled on
CUDA tensors in ``"native"`` mode, interpreted on CPU tensors in ``"interpreter"`` mode, and in every
other case the PyTorch reference answers and a one-line notice is printed once.

Block sizes (chosen by reasoning about SmolLM2-135M decode shapes, not tuned on a GPU here;
``python -m course_lib.kernels.bench_batch_invariant`` measures them against cuBLAS):
BLOCK_M = 16 is the smallest ``tl.dot`` tile, and a decode step of up to 16 tokens then reads each
weight tile once; BLOCK_N = 32 gives 18 programs for N = 576 and 1536 for the 49152-row LM head, as
many as possible without split-K, which batch invariance forbids; BLOCK_K = 64 divides K = 576 and
K = 1536 exactly (9 and 24 steps, no masked waste). BLOCK_D = 1024 covers SmolLM2's D = 576 in one
chunk, and longer rows take several.

Interpreter note: Triton's interpreter stores bfloat16 as uint16 and its ``tl.dot`` multiplies the
bit patterns (triton-lang/triton#11584; the Triton debugging guide says to cast bfloat16 to float32
under the interpreter), so interpreted bfloat16 operands are upcast to float32 (exact) before the dot;
and its float32 -> bfloat16 cast truncates (``cast_impl`` passes no rounding mode) where the GPU
rounds to nearest even, so interpreted :func:`rms_norm` writes float32 and torch rounds to bfloat16.
"""
from __future__ import annotations

import torch

from ...validation import ArgumentTypeError, instance, positive_number
from .. import fallback_notice, import_triton, kernel_interpreted, notice_once, triton_mode

__all__ = [
    "reference_matmul", "reference_rms_norm", "matmul", "rms_norm", "SUPPORTED_DTYPES",
    "BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_D", "NUM_WARPS", "KERNEL_INTERPRETED",
]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
#: Fixed tile of the matmul: never a function argument, never chosen from the shape (that is the point).
BLOCK_M = 16
BLOCK_N = 32
BLOCK_K = 64
#: Fixed chunk of the RMSNorm reduction.
BLOCK_D = 1024
#: Warps per program on a GPU, fixed as well (ignored by the interpreter).
NUM_WARPS = 4

triton, tl = import_triton()

if triton is not None:

    @triton.jit(do_not_specialize=["M"])
    def _matmul_kernel(
        x_ptr, w_ptr, y_ptr,
        M, N, K,
        stride_xm, stride_xk,
        stride_wn, stride_wk,
        stride_ym, stride_yn,
        FP32_DOT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of x and y
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # rows of weight = columns of y
        row_mask = rows < M
        col_mask = cols < N
        # int64 offsets: index * stride overflows int32 for tensors of more than 2**31 elements.
        x_row = rows.to(tl.int64) * stride_xm
        w_col = cols.to(tl.int64) * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # The one reduction order of every output element: K from 0 upward, BLOCK_K at a time.
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_mask = ks < K
            k64 = ks.to(tl.int64)
            a = tl.load(x_ptr + x_row[:, None] + k64[None, :] * stride_xk,
                        mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            # (BLOCK_K, BLOCK_N): the transpose of weight's (N, K) orientation, read through strides.
            b = tl.load(w_ptr + k64[:, None] * stride_wk + w_col[None, :],
                        mask=k_mask[:, None] & col_mask[None, :], other=0.0)
            if FP32_DOT:
                # float32 operands (or bfloat16 under the interpreter, upcast exactly): "ieee" asks
                # for true float32 products (the GPU default would round the inputs to TF32).
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)  # bfloat16 tensor cores, float32 accumulation
        y_off = rows.to(tl.int64)[:, None] * stride_ym + cols.to(tl.int64)[None, :] * stride_yn
        tl.store(y_ptr + y_off, acc, mask=row_mask[:, None] & col_mask[None, :])

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, w_ptr, y_ptr,
        D,
        stride_xr, stride_xd, stride_w, stride_yr, stride_yd,
        eps,
        BLOCK_D: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_xr
        y_row = y_ptr + row * stride_yr
        # Pass 1: sum of squares, D from 0 upward in BLOCK_D chunks, one float32 lane per column
        # of the chunk, then one fixed-width tree reduction.
        acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask = cols < D
            xv = tl.load(x_row + cols.to(tl.int64) * stride_xd, mask=mask, other=0.0).to(tl.float32)
            acc += xv * xv
        mean_square = tl.sum(acc, axis=0) / D
        rstd = tl.rsqrt(mean_square + eps)
        # Pass 2: y = x * rstd * weight, rounded once to y's dtype.
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask = cols < D
            c64 = cols.to(tl.int64)
            xv = tl.load(x_row + c64 * stride_xd, mask=mask, other=0.0).to(tl.float32)
            wv = tl.load(w_ptr + c64 * stride_w, mask=mask, other=0.0).to(tl.float32)
            yv = xv * rstd * wv
            tl.store(y_row + c64 * stride_yd, yv.to(y_ptr.dtype.element_ty), mask=mask)
else:
    _matmul_kernel = None
    _rms_norm_kernel = None

#: Whether ``@triton.jit`` built the kernels for the interpreter (TRITON_INTERPRET at this module's import).
KERNEL_INTERPRETED = kernel_interpreted(_matmul_kernel)


def _dtype_error(name: str, tensor: torch.Tensor) -> ArgumentTypeError:
    return ArgumentTypeError(f"{name}.dtype must be float32 or bfloat16, got {tensor.dtype}")


def _check_matmul(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int, int]:
    """Validate matmul's arguments; return (M, N, K)."""
    instance("x", x, torch.Tensor)
    instance("weight", weight, torch.Tensor)
    if x.dim() != 2:
        raise ValueError(f"x must have rank 2 (M, K), got shape {tuple(x.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must have rank 2 (N, K), got shape {tuple(weight.shape)}")
    M, K = x.shape
    N = weight.shape[0]
    if weight.shape[1] != K:
        raise ValueError(f"weight has K={weight.shape[1]} columns but x has K={K}; expected weight of "
                         f"shape (N, {K}) (y = x @ weight.T)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise _dtype_error("x", x)
    if weight.dtype != x.dtype:
        raise ArgumentTypeError(f"weight.dtype must equal x.dtype ({x.dtype}), got {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device} but x is on {x.device}; expected the same device")
    return M, N, K


def _check_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps) -> tuple[int, int, float]:
    """Validate rms_norm's arguments; return (R, D, eps)."""
    instance("x", x, torch.Tensor)
    instance("weight", weight, torch.Tensor)
    if x.dim() != 2:
        raise ValueError(f"x must have rank 2 (R, D), got shape {tuple(x.shape)}")
    if weight.dim() != 1:
        raise ValueError(f"weight must have rank 1 (D,), got shape {tuple(weight.shape)}")
    R, D = x.shape
    if weight.shape[0] != D:
        raise ValueError(f"weight has {weight.shape[0]} elements but x has D={D} columns; expected weight "
                         f"of shape ({D},)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise _dtype_error("x", x)
    if weight.dtype not in SUPPORTED_DTYPES:
        raise _dtype_error("weight", weight)
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device} but x is on {x.device}; expected the same device")
    eps = positive_number("eps", eps, note="added to mean(x^2) under the square root")
    return R, D, float(eps)


def reference_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T in plain PyTorch (float32): the specification :func:`matmul` is tested against.

    Not batch-invariant in general: the matrix library picks its algorithm from the shape.

    Args:
        x: (M, K) float32 or bfloat16, any strides.
        weight: (N, K), the same dtype and device as x, any strides.

    Returns:
        y: (M, N) float32 on x's device (inputs upcast to float32, float32 products and sums).

    Raises:
        TypeError (``ArgumentTypeError``, also a ValueError): a non-tensor argument, an unsupported
            dtype, or dtypes that differ.
        ValueError: wrong ranks, K that differ, tensors on different devices.
    """
    _check_matmul(x, weight)
    return x.to(torch.float32) @ weight.to(torch.float32).T


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x * rsqrt(mean(x^2) + eps) * weight in plain PyTorch, in float32, returned in x's dtype.

    Args:
        x: (R, D) float32 or bfloat16, any strides.
        weight: (D,) float32 or bfloat16 on x's device.
        eps: a finite number > 0.

    Returns:
        y: (R, D) in x.dtype on x's device.

    Raises:
        TypeError (``ArgumentTypeError``, also a ValueError): a non-tensor argument, an unsupported
            dtype, or an eps that is not a number.
        ValueError: wrong ranks, a weight that is not (D,), different devices, eps <= 0 or not finite.
    """
    _, _, eps = _check_rms_norm(x, weight, eps)
    xf = x.to(torch.float32)
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd * weight.to(torch.float32)).to(x.dtype)


def _fallback_reason(name: str, tensor: torch.Tensor) -> tuple[str, str] | None:
    """(notice key, message) when ``name`` must use its reference here, None when the kernel runs."""
    return fallback_notice(f"course_lib.kernels.batch_invariant.{name}", f"bi-{name}", _matmul_kernel,
                           triton_mode(), tensor)


def matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T with the batch-invariant Triton kernel; same contract as :func:`reference_matmul`.

    Row i of y is bitwise the same whatever M is and wherever row i sits in x (fixed tile
    ``BLOCK_M x BLOCK_N``, K walked from 0 upward in ``BLOCK_K`` steps, no split-K; see the module
    docstring, after He et al. 2025 and vLLM's batch-invariant mode).

    Args:
        x: (M, K) float32 or bfloat16, any strides.
        weight: (N, K), the same dtype and device as x, any strides (a transposed or sliced view works).

    Returns:
        y: (M, N) float32 on x's device, contiguous.

    Dispatch (see :func:`course_lib.kernels.triton_mode`): compiled on CUDA tensors in ``"native"``
    mode, interpreted on CPU tensors in ``"interpreter"`` mode; otherwise :func:`reference_matmul`
    answers (not batch-invariant) and a one-line notice is printed once.

    Raises:
        TypeError / ValueError: as :func:`reference_matmul`.
    """
    M, N, K = _check_matmul(x, weight)
    fallback = _fallback_reason("matmul", x)
    if fallback is not None:
        notice_once(*fallback)
        return reference_matmul(x, weight)
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    kwargs = {} if KERNEL_INTERPRETED else {"num_warps": NUM_WARPS}
    _matmul_kernel[grid](
        x, weight, y,
        M, N, K,
        x.stride(0), x.stride(1),
        weight.stride(0), weight.stride(1),
        y.stride(0), y.stride(1),
        FP32_DOT=x.dtype == torch.float32 or KERNEL_INTERPRETED,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        **kwargs,
    )
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with the batch-invariant Triton kernel; same contract as :func:`reference_rms_norm`.

    One program per row; the sum of squares is accumulated in float32 over D from 0 upward in
    fixed ``BLOCK_D`` chunks, so row i of y is bitwise the same whatever R is and wherever row i sits.

    Args:
        x: (R, D) float32 or bfloat16, any strides.
        weight: (D,) float32 or bfloat16 on x's device, any stride.
        eps: a finite number > 0.

    Returns:
        y: (R, D) in x.dtype on x's device, contiguous.

    Dispatch: as :func:`matmul` (the fallback is :func:`reference_rms_norm`).

    Raises:
        TypeError / ValueError: as :func:`reference_rms_norm`.
    """
    R, D, eps = _check_rms_norm(x, weight, eps)
    fallback = _fallback_reason("rms_norm", x)
    if fallback is not None:
        notice_once(*fallback)
        return reference_rms_norm(x, weight, eps)
    # The interpreter's float32 -> bfloat16 cast drops the low bits (round toward zero) where the
    # GPU rounds to nearest even: under the interpreter the kernel writes float32, torch rounds.
    out_dtype = torch.float32 if KERNEL_INTERPRETED else x.dtype
    y = torch.empty(R, D, dtype=out_dtype, device=x.device)
    if R == 0 or D == 0:
        return y.to(x.dtype)
    kwargs = {} if KERNEL_INTERPRETED else {"num_warps": NUM_WARPS}
    _rms_norm_kernel[(R,)](
        x, weight, y,
        D,
        x.stride(0), x.stride(1), weight.stride(0), y.stride(0), y.stride(1),
        eps,
        BLOCK_D=BLOCK_D,
        **kwargs,
    )
    return y.to(x.dtype)
