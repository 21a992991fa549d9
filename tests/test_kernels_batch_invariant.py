"""Tests of course_lib.kernels.batch_invariant.triton_ops: references, dispatch, and the Triton kernels.

TRITON_INTERPRET is handled as in tests/test_kernels_gemv.py: tests named ``test_triton_kernel_*``
run the kernels in this process when it can (native CUDA, or TRITON_INTERPRET=1 already in the
environment) and skip otherwise; the slow ``test_interpreter_subprocess`` reruns exactly those in a
fresh pytest with TRITON_INTERPRET=1 set from the start, and fails if any of them fails or skips.

Batch invariance is tested bitwise (``torch.equal``): a fixed row v is put at every position of
batches of several sizes whose other rows are random, and its output row must equal the output of
v alone. Closeness to the exact answer is tested against float64 computed from the same (already
rounded) inputs, with bounds from the float32 error analysis (Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., section 3.1; u = 2**-24 is float32's unit roundoff):

- matmul: |y - exact| <= 2 (K + 2) u (|x| @ |w|^T) elementwise. (K + 2) u bounds any float32
  summation order of K exact-or-rounded products; the factor 2 leaves room for tensor-core
  accumulators that truncate rather than round. bfloat16 inputs get the same bound, since a product
  of two bfloat16 numbers is exact in float32.
- rms_norm: |y - exact| <= (D + 8) u |exact| for float32 output (the sum of squares has relative
  error <= D u, the square root halves it, rsqrt and the two products add a few u), plus
  2**-8 |exact| for bfloat16 output (one rounding to bfloat16, half an ulp <= 2**-8 relative).
"""
from __future__ import annotations

import pytest
import torch
from kernel_interpreter import run_kernel_tests_in_interpreter, run_without_triton

import course_lib.kernels as kernels_pkg
from course_lib.kernels import TritonMode, triton_mode
from course_lib.kernels.batch_invariant import triton_ops
from course_lib.kernels.batch_invariant.triton_ops import matmul, reference_matmul, reference_rms_norm, rms_norm

MODE = triton_mode()
KERNEL_RUNS_HERE = MODE in ("native", "interpreter")
DEVICE = "cuda" if MODE == "native" else "cpu"
U32 = 2.0 ** -24  # unit roundoff of float32
EPS = 1e-5
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]

needs_kernel = pytest.mark.skipif(
    not KERNEL_RUNS_HERE,
    reason=f"triton mode here is {str(MODE)!r} ({MODE.reason}); these run in test_interpreter_subprocess",
)


def _randn(*shape, dtype=torch.float32, seed=0, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def _assert_matmul_close(y, x, w, what):
    """y within 2 (K + 2) u (|x| @ |w|^T) of the float64 product of the inputs."""
    xd, wd = x.double().cpu(), w.double().cpu()
    exact = xd @ wd.T
    bound = 2 * (x.shape[1] + 2) * U32 * (xd.abs() @ wd.abs().T) + 1e-30
    assert y.dtype == torch.float32 and tuple(y.shape) == tuple(exact.shape), f"{what}: {y.dtype} {tuple(y.shape)}"
    err = (y.double().cpu() - exact).abs()
    worst = (err - bound).max().item() if err.numel() else 0.0
    assert worst <= 0, f"{what}: max abs error {err.max().item():.3e} exceeds the bound by {worst:.3e}"


def _rms_exact(x, w, eps=EPS):
    xd = x.double().cpu()
    return xd / torch.sqrt(xd.pow(2).mean(dim=-1, keepdim=True) + eps) * w.double().cpu()


def _assert_rms_close(y, x, w, what, eps=EPS):
    exact = _rms_exact(x, w, eps)
    rel = (x.shape[1] + 8) * U32 + (2.0 ** -8 if x.dtype == torch.bfloat16 else 0.0)
    assert y.dtype == x.dtype and tuple(y.shape) == tuple(x.shape), f"{what}: {y.dtype} {tuple(y.shape)}"
    err = (y.double().cpu() - exact).abs()
    worst = (err - rel * exact.abs() - 1e-30).max().item() if err.numel() else 0.0
    assert worst <= 0, f"{what}: max abs error {err.max().item():.3e} exceeds the bound by {worst:.3e}"


# ---------------------------------------------------------------- references and validation


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("M, N, K", [(1, 1, 1), (3, 37, 70), (17, 33, 200)])
def test_reference_matmul_matches_float64(M, N, K, dtype):
    x, w = _randn(M, K, dtype=dtype, seed=1), _randn(N, K, dtype=dtype, seed=2)
    _assert_matmul_close(reference_matmul(x, w), x, w, "reference_matmul")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("w_dtype", DTYPES, ids=["w-fp32", "w-bf16"])
@pytest.mark.parametrize("R, D", [(1, 1), (4, 576), (3, 2500)])
def test_reference_rms_norm_matches_float64(R, D, dtype, w_dtype):
    x, w = _randn(R, D, dtype=dtype, seed=3), _randn(D, dtype=w_dtype, seed=4)
    _assert_rms_close(reference_rms_norm(x, w, EPS), x, w, "reference_rms_norm")


X2, W2 = torch.zeros(2, 8), torch.zeros(3, 8)
BAD_MATMUL = [
    (dict(x=torch.zeros(8)), ValueError, r"x must have rank 2 \(M, K\)"),
    (dict(x=torch.zeros(1, 2, 8)), ValueError, "x must have rank 2"),
    (dict(weight=torch.zeros(8)), ValueError, r"weight must have rank 2 \(N, K\)"),
    (dict(weight=torch.zeros(3, 9)), ValueError, "weight has K=9 columns but x has K=8"),
    (dict(x=torch.zeros(2, 8, dtype=torch.float16), weight=torch.zeros(3, 8, dtype=torch.float16)),
     TypeError, "x.dtype must be float32 or bfloat16, got torch.float16"),
    (dict(x=torch.zeros(2, 8, dtype=torch.float64), weight=torch.zeros(3, 8, dtype=torch.float64)),
     TypeError, "x.dtype must be float32 or bfloat16"),
    (dict(weight=torch.zeros(3, 8, dtype=torch.bfloat16)), TypeError, "weight.dtype must equal x.dtype"),
    (dict(x=[[0.0] * 8] * 2), TypeError, "x must be a Tensor"),
    (dict(weight=torch.zeros(3, 8, device="meta")), ValueError, "weight is on meta but x is on cpu"),
]


@pytest.mark.parametrize("change, error, match", BAD_MATMUL, ids=[m for _, _, m in BAD_MATMUL])
@pytest.mark.parametrize("fn", [reference_matmul, matmul])
def test_invalid_matmul_inputs_raise(fn, change, error, match):
    args = dict(x=X2, weight=W2)
    args.update(change)
    with pytest.raises(error, match=match):
        fn(**args)


BAD_RMS = [
    (dict(x=torch.zeros(8)), ValueError, r"x must have rank 2 \(R, D\)"),
    (dict(weight=torch.zeros(1, 8)), ValueError, r"weight must have rank 1 \(D,\)"),
    (dict(weight=torch.zeros(7)), ValueError, "weight has 7 elements but x has D=8"),
    (dict(x=torch.zeros(2, 8, dtype=torch.float16)), TypeError, "x.dtype must be float32 or bfloat16"),
    (dict(weight=torch.zeros(8, dtype=torch.float64)), TypeError, "weight.dtype must be float32 or bfloat16"),
    (dict(weight=torch.zeros(8, device="meta")), ValueError, "weight is on meta but x is on cpu"),
    (dict(eps=0.0), ValueError, "eps must be a finite number > 0"),
    (dict(eps=-1e-5), ValueError, "eps must be a finite number > 0"),
    (dict(eps=float("nan")), ValueError, "eps must be"),
    (dict(eps="1e-5"), TypeError, "eps must be a finite number"),
]


@pytest.mark.parametrize("change, error, match", BAD_RMS, ids=[m for _, _, m in BAD_RMS])
@pytest.mark.parametrize("fn", [reference_rms_norm, rms_norm])
def test_invalid_rms_norm_inputs_raise(fn, change, error, match):
    args = dict(x=torch.zeros(2, 8), weight=torch.ones(8), eps=EPS)
    args.update(change)
    with pytest.raises(error, match=match):
        fn(**args)


def test_block_sizes_are_fixed_constants():
    """The tile is part of the result's definition: module constants, powers of two, tl.dot-sized."""
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_D"):
        value = getattr(triton_ops, name)
        assert type(value) is int and value >= 16 and value & (value - 1) == 0, (name, value)


def test_fallback_when_triton_is_unavailable(monkeypatch, capsys):
    """Without triton (or a GPU, or the interpreter) both functions answer with their references
    and each says so once."""
    monkeypatch.setattr(triton_ops, "triton_mode", lambda: TritonMode("unavailable", "no triton in this test"))
    monkeypatch.setattr(kernels_pkg, "_NOTICES_SHOWN", set())
    x, w = _randn(5, 40, seed=5), _randn(9, 40, seed=6)
    y1, y2 = matmul(x, w), matmul(x, w)
    assert torch.equal(y1, reference_matmul(x, w)) and torch.equal(y1, y2)
    g = _randn(40, seed=7)
    r1, r2 = rms_norm(x, g, EPS), rms_norm(x, g, EPS)
    assert torch.equal(r1, reference_rms_norm(x, g, EPS)) and torch.equal(r1, r2)
    assert capsys.readouterr().err == (
        "course_lib.kernels.batch_invariant.matmul: using the PyTorch reference (no triton in this test).\n"
        "course_lib.kernels.batch_invariant.rms_norm: using the PyTorch reference (no triton in this test).\n")


def test_results_in_this_process():
    """Whatever the mode here (kernel or reference fallback), both functions give the right answer."""
    x, w = _randn(5, 70, seed=8, device=DEVICE), _randn(33, 70, seed=9, device=DEVICE)
    _assert_matmul_close(matmul(x, w), x, w, "matmul")
    g = _randn(70, seed=10, device=DEVICE)
    _assert_rms_close(rms_norm(x, g, EPS), x, g, "rms_norm")


def test_reference_empty_dimensions():
    assert reference_matmul(torch.zeros(0, 4), torch.zeros(3, 4)).shape == (0, 3)
    y = reference_matmul(torch.zeros(2, 0), torch.zeros(3, 0))
    assert y.shape == (2, 3) and (y == 0).all()
    assert reference_rms_norm(torch.zeros(0, 4), torch.ones(4), EPS).shape == (0, 4)


@pytest.mark.slow
def test_module_imports_and_falls_back_without_triton():
    """A fresh interpreter where ``import triton`` fails (as on macOS/Windows): the module imports,
    both functions return their references' answers and print the notice."""
    code = (
        "import torch\n"
        "from course_lib.kernels.batch_invariant import triton_ops as t\n"
        "assert t._matmul_kernel is None and t._rms_norm_kernel is None\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(3, 20, generator=g); w = torch.randn(7, 20, generator=g)\n"
        "assert torch.equal(t.matmul(x, w), x @ w.T)\n"
        "assert torch.equal(t.rms_norm(x, w[0], 1e-5), t.reference_rms_norm(x, w[0], 1e-5))\n"
        "print('ok')\n"
    )
    proc = run_without_triton(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert ("course_lib.kernels.batch_invariant.matmul: using the PyTorch reference (triton does not import"
            in proc.stderr)


def test_bench_measures_nothing_without_a_gpu(capsys):
    if MODE == "native":
        pytest.skip("a CUDA device is present: the benchmark would measure")
    from course_lib.kernels.bench_batch_invariant import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "GPU benchmark was not run" in out and "TFLOP/s" not in out and "GB/s" not in out


# ---------------------------------------------------------------- the Triton kernels


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "M, N, K",
    [
        (1, 1, 1),
        (16, 64, 128),  # exact multiples of BLOCK_M, BLOCK_N, BLOCK_K
        (17, 33, 200),  # every dimension ragged: one row, one column, 8 of 64 K past a block
        (3, 37, 70),
        (5, 100, 64),  # several column tiles, the last one partial
    ],
)
def test_triton_kernel_matmul_matches_float64(M, N, K, dtype):
    x, w = _randn(M, K, dtype=dtype, seed=M + N, device=DEVICE), _randn(N, K, dtype=dtype, seed=K, device=DEVICE)
    y = matmul(x, w)
    assert y.device == x.device and y.is_contiguous()
    _assert_matmul_close(y, x, w, "matmul vs float64")


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_triton_kernel_matmul_is_batch_invariant(dtype):
    """Row v alone, and v at every position of batches of M = 1, 2, 3, 4, 8, 16 and 20 (20 puts
    it in a second row tile too) with random other rows: every output row of v is bitwise equal.
    N = 70 and K = 150 are ragged, so masked tiles are part of the test."""
    N, K = 70, 150
    w = _randn(N, K, dtype=dtype, seed=20, device=DEVICE)
    v = _randn(1, K, dtype=dtype, seed=21, device=DEVICE)
    alone = matmul(v, w)[0]
    _assert_matmul_close(alone[None], v, w, "matmul of v alone")
    for M in (1, 2, 3, 4, 8, 16, 20):
        others = _randn(M, K, dtype=dtype, seed=100 + M, device=DEVICE)
        for pos in range(M):
            x = others.clone()
            x[pos] = v[0]
            y = matmul(x, w)
            assert torch.equal(y[pos], alone), (
                f"M={M}, row {pos}: max |diff| {(y[pos] - alone).abs().max().item():.3e} (must be bitwise 0)")


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_triton_kernel_matmul_strided_views(dtype):
    """weight as a transposed view, weight as the interior of a NaN-filled buffer, and x with a
    column stride of 2 inside a NaN-filled buffer: any read outside them would put NaN into y."""
    M, N, K = 5, 37, 70
    x0, w0 = _randn(M, K, dtype=dtype, seed=30), _randn(N, K, dtype=dtype, seed=31)
    nan = float("nan")
    xbuf = torch.full((M + 2, 2 * K + 3), nan, dtype=dtype)
    xbuf[1:M + 1, 1:2 * K + 1:2] = x0
    wbuf = torch.full((N + 2, K + 3), nan, dtype=dtype)
    wbuf[1:N + 1, 1:K + 1] = w0
    xbuf, wbuf = xbuf.to(DEVICE), wbuf.to(DEVICE)
    x = xbuf[1:M + 1, 1:2 * K + 1:2]
    w_inner = wbuf[1:N + 1, 1:K + 1]
    w_t = w0.T.contiguous().to(DEVICE).T  # (N, K) with strides (1, N)
    assert x.stride() == (2 * K + 3, 2) and not w_inner.is_contiguous() and w_t.stride() == (1, N)
    for w in (w_inner, w_t):
        y = matmul(x, w)
        assert torch.isfinite(y).all(), f"{(~torch.isfinite(y)).sum().item()} non-finite outputs"
        _assert_matmul_close(y, x0, w0, f"matmul with weight strides {w.stride()}")


@needs_kernel
def test_triton_kernel_matmul_empty_dimensions():
    assert matmul(torch.zeros(0, 8, device=DEVICE), torch.zeros(3, 8, device=DEVICE)).shape == (0, 3)
    assert matmul(torch.zeros(2, 8, device=DEVICE), torch.zeros(0, 8, device=DEVICE)).shape == (2, 0)
    y = matmul(torch.zeros(2, 0, device=DEVICE), torch.zeros(3, 0, device=DEVICE))
    assert y.shape == (2, 3) and (y == 0).all()


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("R, D", [(1, 1), (4, 576), (3, 2500), (2, 1024)])  # one, one partial, three chunks, exact
def test_triton_kernel_rms_norm_matches_float64(R, D, dtype):
    x, w = _randn(R, D, dtype=dtype, seed=R + D, device=DEVICE), _randn(D, seed=D, device=DEVICE)
    y = rms_norm(x, w, EPS)
    assert y.device == x.device and y.is_contiguous()
    _assert_rms_close(y, x, w, "rms_norm vs float64")
    # a bfloat16 weight as well (SmolLM2 keeps its norm weights in the model dtype)
    _assert_rms_close(rms_norm(x, w.to(torch.bfloat16), EPS), x, w.to(torch.bfloat16), "rms_norm, bf16 weight")


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_triton_kernel_rms_norm_is_batch_invariant(dtype):
    """Row v alone, and v in batches of R = 1..16 with random other rows (every position up to
    R = 8, then the first two, the middle and the last two, to keep the interpreter run short: one
    program per row, so a position is just a program id): its output row is bitwise equal every
    time. D = 1500 takes two BLOCK_D chunks, the second ragged."""
    D = 1500
    w = _randn(D, seed=40, device=DEVICE)
    v = _randn(1, D, dtype=dtype, seed=41, device=DEVICE)
    alone = rms_norm(v, w, EPS)[0]
    _assert_rms_close(alone[None], v, w, "rms_norm of v alone")
    for R in range(1, 17):
        others = _randn(R, D, dtype=dtype, seed=200 + R, device=DEVICE) * (1 + R)  # rows of other scales
        for pos in sorted(set(range(R)) if R <= 8 else {0, 1, R // 2, R - 2, R - 1}):
            x = others.clone()
            x[pos] = v[0]
            y = rms_norm(x, w, EPS)
            assert torch.equal(y[pos], alone), (
                f"R={R}, row {pos}: max |diff| {(y[pos].float() - alone.float()).abs().max().item():.3e}")


@needs_kernel
def test_triton_kernel_rms_norm_strided_views():
    """x with a column stride of 2 and weight with a stride of 3, inside NaN-filled buffers."""
    R, D = 3, 300
    x0, w0 = _randn(R, D, seed=50), _randn(D, seed=51)
    xbuf = torch.full((R + 1, 2 * D + 1), float("nan"))
    xbuf[1:, 1::2] = x0
    wbuf = torch.full((3 * D + 2,), float("nan"))
    wbuf[1:3 * D + 1:3] = w0
    x, w = xbuf.to(DEVICE)[1:, 1::2], wbuf.to(DEVICE)[1:3 * D + 1:3]
    assert x.stride() == (2 * D + 1, 2) and w.stride() == (3,)
    y = rms_norm(x, w, EPS)
    assert torch.isfinite(y).all()
    _assert_rms_close(y, x0, w0, "rms_norm on strided views")
    assert torch.equal(y, rms_norm(x0.to(DEVICE), w0.to(DEVICE), EPS))


@needs_kernel
def test_triton_kernel_rms_norm_empty_rows():
    assert rms_norm(torch.zeros(0, 8, device=DEVICE), torch.ones(8, device=DEVICE), EPS).shape == (0, 8)


@needs_kernel
def test_triton_kernel_actually_used(capfd):
    """In a kernel-capable process neither function may silently fall back to its reference."""
    x = _randn(2, 16, device=DEVICE)
    matmul(x, x)
    rms_norm(x, x[0], EPS)
    assert "using the PyTorch reference" not in capfd.readouterr().err


# ---------------------------------------------------------------- the interpreter run


@pytest.mark.slow
def test_interpreter_subprocess():
    run_kernel_tests_in_interpreter(__file__)
