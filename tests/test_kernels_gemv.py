"""Tests of course_lib.kernels.gemv: the PyTorch reference, the dispatch, and the Triton kernel.

How TRITON_INTERPRET is handled: ``@triton.jit`` reads TRITON_INTERPRET when it decorates a
kernel (older triton versions when triton itself is imported, which torch or another test may do
first), so setting it from inside a running pytest process is not reliable, and a conftest that
set it would switch every other test file in the suite to the interpreter too. Instead:

- tests named ``test_triton_kernel_*`` run the kernel directly when this process can (native
  CUDA, or TRITON_INTERPRET=1 was already in the environment) and otherwise skip;
- ``test_interpreter_subprocess`` reruns exactly those tests in a fresh
  ``python -m pytest`` with TRITON_INTERPRET=1 in its environment from the start, and fails
  with the child's output if any of them fails or skips.
  It skips (with the reason) when triton does not import (macOS, Windows).

Tolerances: float32 inputs: rtol 1e-5, atol 1e-5 (only the summation order differs from the
reference); bfloat16 inputs: rtol 1e-3, atol 1e-3 (bf16*bf16 products are exact in float32, but
the looser bound leaves room for a different reduction order and for kernels that round x).
"""
from __future__ import annotations

import pytest
import torch
from kernel_interpreter import run_kernel_tests_in_interpreter

from course_lib.kernels import (TritonMode, fallback_notice, import_triton, kernel_interpreted, notice_once,
                                triton_import_error, triton_mode)
from course_lib.kernels.gemv import gemv, reference_gemv

MODE = triton_mode()
KERNEL_RUNS_HERE = MODE in ("native", "interpreter")
DEVICE = "cuda" if MODE == "native" else "cpu"
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-3, atol=1e-3)}

needs_kernel = pytest.mark.skipif(
    not KERNEL_RUNS_HERE,
    reason=f"triton mode here is {str(MODE)!r} ({MODE.reason}); these run in test_interpreter_subprocess",
)


def _inputs(M, N, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(M, N, generator=g).to(dtype)
    x = torch.randn(N, generator=g).to(dtype)
    return W.to(device), x.to(device)


def _exact(W, x):
    """float64 product of the (already rounded) inputs: the ground truth for the reference."""
    return (W.double() @ x.double()).float()


# ---------------------------------------------------------------- reference and validation


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_matches_float64(dtype):
    W, x = _inputs(37, 53, dtype)
    y = reference_gemv(W, x)
    assert y.shape == (37,) and y.dtype == torch.float32
    torch.testing.assert_close(y, _exact(W, x), **TOL[torch.float32])


@pytest.mark.parametrize(
    "W, x, match",
    [
        (torch.zeros(3), torch.zeros(3), "W must have rank 2"),
        (torch.zeros(2, 3, 4), torch.zeros(4), "W must have rank 2"),
        (torch.zeros(2, 3), torch.zeros(3, 1), "x must have rank 1"),
        (torch.zeros(2, 3), torch.zeros(4), "x has 4 elements but W has N=3"),
        (torch.zeros(2, 3, dtype=torch.float16), torch.zeros(3, dtype=torch.float16), "float32 or bfloat16"),
        (torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), "float32 or bfloat16"),
        (torch.zeros(2, 3), torch.zeros(3, dtype=torch.bfloat16), "x.dtype must equal W.dtype"),
    ],
)
@pytest.mark.parametrize("fn", [reference_gemv, gemv])
def test_invalid_inputs_raise(fn, W, x, match):
    with pytest.raises(ValueError, match=match):
        fn(W, x)


@pytest.mark.parametrize("bad", [0, -16, 24, 1.5, True])
def test_block_sizes_must_be_powers_of_two(bad):
    W, x = _inputs(4, 4, torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        gemv(W, x, block_m=bad)
    with pytest.raises(ValueError, match="power of two"):
        gemv(W, x, block_n=bad)


def test_triton_mode_has_a_reason():
    mode = triton_mode()
    assert isinstance(mode, TritonMode)
    assert mode in ("native", "interpreter", "unavailable")
    assert isinstance(mode.reason, str) and mode.reason


def test_notice_once_prints_once(capsys):
    notice_once("test-key-gemv", "hello once")
    notice_once("test-key-gemv", "hello once")
    assert capsys.readouterr().err == "hello once\n"


def test_import_triton_agrees_with_the_import_error():
    triton, tl = import_triton()
    assert (triton is None) == (tl is None) == (triton_import_error() is not None)
    assert (triton is None) == MODE.reason.startswith("triton does not import")


class InterpretedFunction:     # named as the kernels @triton.jit builds under TRITON_INTERPRET=1
    pass


class JITFunction:             # named as the compiled ones
    pass


def test_fallback_notice_names_why_the_reference_answers():
    """The one decision every kernel module takes from course_lib.kernels: which calls fall back, and the
    notice (its key and its one line) that says why."""
    cpu = torch.zeros(1)
    cuda_like = type("CudaTensor", (), {"is_cuda": True, "device": "cuda:0"})()
    where, interpreter = "course_lib.kernels.demo", TritonMode("interpreter", "set")
    assert kernel_interpreted(InterpretedFunction()) and not kernel_interpreted(JITFunction())
    assert not kernel_interpreted(None)
    assert fallback_notice(where, "demo", None, TritonMode("native", "gpu"), cpu) == (
        "demo-fallback", "course_lib.kernels.demo: using the PyTorch reference (gpu).")
    assert fallback_notice(where, "demo", JITFunction(), TritonMode("unavailable", "no GPU"), cuda_like) == (
        "demo-fallback", "course_lib.kernels.demo: using the PyTorch reference (no GPU).")
    assert fallback_notice(where, "demo", InterpretedFunction(), interpreter, cpu) is None
    assert fallback_notice(where, "demo", InterpretedFunction(), interpreter, cuda_like)[0] == "demo-interp-cuda"
    assert fallback_notice(where, "demo", JITFunction(), TritonMode("native", "gpu"), cuda_like) is None
    assert fallback_notice(where, "demo", JITFunction(), interpreter, cpu) == (
        "demo-native-cpu", "course_lib.kernels.demo: cpu tensors, TRITON_INTERPRET was set after the kernel "
        "module was imported; using the PyTorch reference.")
    assert "compiled Triton needs CUDA tensors" in fallback_notice(where, "demo", JITFunction(),
                                                                   TritonMode("native", "gpu"), cpu)[1]


def test_gemv_result_in_this_process():
    """Whatever the mode here (kernel or reference fallback), gemv gives the reference's answer."""
    W, x = _inputs(37, 53, torch.float32, device=DEVICE)
    torch.testing.assert_close(gemv(W, x, block_m=16, block_n=32), reference_gemv(W, x), **TOL[torch.float32])


# ---------------------------------------------------------------- the Triton kernel


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "M, N, block_m, block_n",
    [
        (37, 53, 16, 32),  # neither dimension a multiple of its block
        (64, 128, 16, 32),  # exact multiples
        (5, 53, 16, 32),  # M smaller than a block
        (37, 7, 16, 32),  # N smaller than a block
        (1, 1, 16, 32),
        (3, 300, 4, 64),  # several column blocks, last one partial
    ],
)
def test_triton_kernel_matches_reference(M, N, block_m, block_n, dtype):
    W, x = _inputs(M, N, dtype, seed=M * 1000 + N, device=DEVICE)
    y = gemv(W, x, block_m=block_m, block_n=block_n)
    assert y.shape == (M,) and y.dtype == torch.float32 and y.device == W.device
    torch.testing.assert_close(y, reference_gemv(W, x), **TOL[dtype])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sentinel", [float("nan"), float("inf"), -3.0e38], ids=["nan", "inf", "huge"])
def test_triton_kernel_never_reads_outside_W_or_x(dtype, sentinel):
    """W is the interior of a sentinel-filled buffer and x every other element of another:
    any read outside them would put the sentinel (NaN/inf/overflow) into y."""
    M, N = 37, 53
    W_vals, x_vals = _inputs(M, N, dtype, seed=7)
    buf = torch.full((M + 2, N + 3), sentinel, dtype=dtype)
    buf[1 : M + 1, 1 : N + 1] = W_vals
    xbuf = torch.full((2 * N + 3,), sentinel, dtype=dtype)
    xbuf[1 : 2 * N + 1 : 2] = x_vals
    buf, xbuf = buf.to(DEVICE), xbuf.to(DEVICE)
    W = buf[1 : M + 1, 1 : N + 1]  # strides (N + 3, 1): sentinel to the left, right, above, below
    x = xbuf[1 : 2 * N + 1 : 2]  # stride 2: sentinel between and around the elements
    assert not W.is_contiguous() and x.stride() == (2,)
    y = gemv(W, x, block_m=16, block_n=32)
    assert torch.isfinite(y).all(), f"{(~torch.isfinite(y)).sum().item()} non-finite outputs"
    torch.testing.assert_close(y, reference_gemv(W_vals, x_vals).to(DEVICE), **TOL[dtype])


@needs_kernel
def test_triton_kernel_transposed_view():
    A, _ = _inputs(53, 37, torch.float32, device=DEVICE)
    W = A.t()  # (37, 53) with strides (1, 37)
    x = torch.randn(53, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    torch.testing.assert_close(gemv(W, x, block_m=16, block_n=32), reference_gemv(W, x), **TOL[torch.float32])


@needs_kernel
def test_triton_kernel_empty_dimensions():
    assert gemv(torch.zeros(0, 5, device=DEVICE), torch.zeros(5, device=DEVICE)).shape == (0,)
    y = gemv(torch.zeros(4, 0, device=DEVICE), torch.zeros(0, device=DEVICE))
    assert y.shape == (4,) and (y == 0).all()


@needs_kernel
def test_triton_kernel_actually_used(capfd):
    """In a kernel-capable process gemv must not silently fall back to the reference."""
    W, x = _inputs(8, 8, torch.float32, device=DEVICE)
    gemv(W, x, block_m=8, block_n=8)
    assert "using the PyTorch reference" not in capfd.readouterr().err


# ---------------------------------------------------------------- the interpreter run


@pytest.mark.slow
def test_interpreter_subprocess():
    run_kernel_tests_in_interpreter(__file__)
