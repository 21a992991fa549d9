"""Tests of course_lib.kernels.w4a16: the PyTorch reference, the dispatch, and the Triton W4A16 kernel.

TRITON_INTERPRET is handled as in tests/test_kernels_gemv.py: tests named
``test_triton_kernel_*`` run the kernel in this process when it can (native CUDA, or
TRITON_INTERPRET=1 already in the environment) and skip otherwise; the slow
``test_interpreter_subprocess`` reruns exactly those in a fresh pytest with TRITON_INTERPRET=1
set from the start, and fails if any of them fails or skips.

Ground truth: the weights are built from integer codes q, scales s and zero points z drawn
here, and ``W_hat = (q - z) * s`` and ``y = x @ W_hat^T`` are computed in float64 from them,
independently of the packing and of the code under test. A float32 dot product of length K
differs from the exact one by at most gamma_K * sum_k |x_k w_k| with gamma_K ~ K * 2**-24
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.1), and forming
w_hat in float32 adds one rounding per weight; so every float32 result (reference or kernel) is
checked against ``float32_bound = (K + 2) * 2**-24 * (|x| @ |W_hat|^T)``, and the kernel against
the reference with twice that: only the summation order may differ.
"""
from __future__ import annotations

import pytest
import torch
from kernel_interpreter import run_kernel_tests_in_interpreter, run_without_triton

import course_lib.kernels as kernels_pkg
from course_lib.kernels import TritonMode, triton_mode
from course_lib.kernels import w4a16 as w4a16_module
from course_lib.kernels.w4a16 import reference_w4a16, w4a16_matmul
from course_lib.quant.packing import PackedInt4, pack_int4

MODE = triton_mode()
KERNEL_RUNS_HERE = MODE in ("native", "interpreter")
DEVICE = "cuda" if MODE == "native" else "cpu"
U32 = 2.0 ** -24  # unit roundoff of float32

needs_kernel = pytest.mark.skipif(
    not KERNEL_RUNS_HERE,
    reason=f"triton mode here is {str(MODE)!r} ({MODE.reason}); these run in test_interpreter_subprocess",
)


def _case(M, N, K, g, symmetric=True, scale_dtype=torch.float16, x_dtype=torch.float32, seed=0):
    """Random codes, scales, zero points and activations; returns a dict with the packed tensors
    and the float64 ground truth computed from the codes."""
    gen = torch.Generator().manual_seed(seed)
    if symmetric:
        q = torch.randint(-8, 8, (N, K), generator=gen)
        zeros = None
    else:
        q = torch.randint(0, 16, (N, K), generator=gen)
        zeros = torch.randint(0, 16, (N, K // g), generator=gen).to(scale_dtype)
    scales = (torch.rand(N, K // g, generator=gen) * 0.2 + 0.01).to(scale_dtype)
    x = torch.randn(M, K, generator=gen).to(x_dtype)
    z64 = 0.0 if zeros is None else zeros.double().repeat_interleave(g, dim=1)
    w64 = (q.double() - z64) * scales.double().repeat_interleave(g, dim=1)
    exact = x.double() @ w64.T
    bound = (K + 2) * U32 * (x.double().abs() @ w64.abs().T) + 1e-30
    return dict(x=x, q=q, packed=pack_int4(q, signed=symmetric), scales=scales, zeros=zeros, g=g,
                exact=exact, bound=bound)


def _args(c, device="cpu"):
    zeros = None if c["zeros"] is None else c["zeros"].to(device)
    return c["x"].to(device), c["packed"].to(device), c["scales"].to(device), c["g"], zeros


def _assert_within(y, target, bound, what):
    err = (y.double().cpu() - target.double().cpu()).abs()
    worst = (err - bound.cpu()).max().item()
    assert y.dtype == torch.float32 and y.shape == target.shape, f"{what}: got {y.dtype} {tuple(y.shape)}"
    assert worst <= 0, (f"{what}: max abs error {err.max().item():.3e} exceeds the float32 bound by {worst:.3e} "
                        f"at {divmod(int((err - bound.cpu()).argmax()), y.shape[1])}")


# (M, N, K, group_size): odd N, odd K (a padding nibble), odd groups that straddle bytes,
# one group per row, K smaller and larger than a block.
SHAPES = [
    (1, 37, 96, 32),
    (3, 33, 45, 9),
    (16, 17, 7, 7),
    (5, 5, 130, 65),
    (8, 64, 256, 64),
    (2, 19, 30, 2),
]
VARIANTS = [  # (symmetric, scale dtype)
    (True, torch.float16),
    (False, torch.float16),
    (True, torch.float32),
    (False, torch.float32),
]


# ---------------------------------------------------------------- reference and validation


@pytest.mark.parametrize("symmetric, scale_dtype", VARIANTS, ids=["sym-fp16", "zero-fp16", "sym-fp32", "zero-fp32"])
@pytest.mark.parametrize("M, N, K, g", SHAPES)
def test_reference_matches_ground_truth(M, N, K, g, symmetric, scale_dtype):
    c = _case(M, N, K, g, symmetric, scale_dtype, seed=M * 7 + N + K)
    y = reference_w4a16(*_args(c))
    _assert_within(y, c["exact"], c["bound"], "reference vs float64 from the codes")


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "zero"])
def test_reference_equals_dequantize_then_matmul(symmetric):
    c = _case(4, 21, 45, 15, symmetric, seed=3)
    pi = PackedInt4(c["packed"], c["scales"], c["zeros"], c["g"], 45)
    expected = c["x"].double() @ pi.dequantize().double().T
    _assert_within(reference_w4a16(*_args(c)), expected, c["bound"], "reference vs PackedInt4.dequantize")
    _assert_within(reference_w4a16(c["x"], pi), expected, c["bound"], "reference(x, PackedInt4)")


def test_reference_applies_the_packed_permutation():
    """Stored column j holds W column perm[j]: y must be x @ W^T in the original column order."""
    c = _case(3, 11, 24, 8, seed=5)
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    pi = PackedInt4(c["packed"], c["scales"], None, 8, 24, perm)
    W = pi.dequantize().double()
    expected = c["x"].double() @ W.T
    bound = 26 * U32 * (c["x"].double().abs() @ W.abs().T)
    _assert_within(reference_w4a16(c["x"], pi), expected, bound, "reference with perm")
    _assert_within(w4a16_matmul(c["x"].to(DEVICE), PackedInt4(c["packed"].to(DEVICE), c["scales"].to(DEVICE), None,
                                                               8, 24, perm.to(DEVICE))),
                   expected, bound, "w4a16_matmul with perm")


def _bad(**change):
    c = _case(2, 3, 8, 4, symmetric=False, seed=0)
    args = dict(x=c["x"], packed=c["packed"], scales=c["scales"], group_size=4, zeros=c["zeros"])
    args.update(change)
    return args


BAD_INPUTS = [
    (dict(x=torch.zeros(8)), ValueError, "x must have rank 2"),
    (dict(x=torch.zeros(2, 8, dtype=torch.float64)), TypeError, "x.dtype must be one of"),
    (dict(x=torch.zeros(2, 8, dtype=torch.int32)), TypeError, "x.dtype must be one of"),
    (dict(x=[[0.0] * 8] * 2), TypeError, "x must be a Tensor"),
    (dict(x=torch.zeros(2, 9)), ValueError, "expected ceil\\(K/2\\) = 5"),
    (dict(packed=torch.zeros(3, 4, dtype=torch.int8)), TypeError, "packed.dtype must be uint8"),
    (dict(packed=torch.zeros(12, dtype=torch.uint8)), ValueError, "packed must have rank 2"),
    (dict(packed=torch.zeros(3, 3, dtype=torch.uint8)), ValueError, "3 bytes per row but x has K=8"),
    (dict(group_size=3, scales=torch.ones(3, 2, dtype=torch.float16)), ValueError, "group_size=3 does not divide K=8"),
    (dict(group_size=0), ValueError, "group_size must be an int >= 1"),
    (dict(group_size=4.0), TypeError, "group_size must be an int"),
    (dict(scales=torch.ones(3, 3, dtype=torch.float16)), ValueError, "scales must have shape .* \\(3, 2\\)"),
    (dict(scales=torch.ones(3, 2, dtype=torch.bfloat16)), TypeError, "scales.dtype must be one of"),
    (dict(zeros=torch.ones(2, 3, dtype=torch.float16)), ValueError, "zeros must have shape"),
    (dict(zeros=torch.ones(3, 2, dtype=torch.int32)), TypeError, "zeros.dtype must be one of"),
    (dict(scales=None), ValueError, "scales and group_size are required"),
    (dict(group_size=None), ValueError, "scales and group_size are required"),
    (dict(scales=torch.ones(3, 2, dtype=torch.float16, device="meta")), ValueError,
     "scales is on meta but x is on cpu"),
    (dict(packed=torch.zeros(3, 4, dtype=torch.uint8, device="meta")), ValueError, "packed is on meta"),
    (dict(zeros=torch.full((3, 2), 16.0, dtype=torch.float16)), ValueError, r"whole numbers in \[0, 15\].*got 16\.0"),
    (dict(zeros=torch.full((3, 2), -1.0, dtype=torch.float16)), ValueError, r"whole numbers in \[0, 15\].*got -1\.0"),
    (dict(zeros=torch.full((3, 2), 2.5)), ValueError, r"whole numbers in \[0, 15\].*got 2\.5"),
    (dict(zeros=torch.full((3, 2), float("nan"))), ValueError, r"whole numbers in \[0, 15\].*got nan"),
    (dict(zeros=torch.full((3, 2), 200, dtype=torch.uint8)), ValueError, r"whole numbers in \[0, 15\].*got 200"),
]


@pytest.mark.parametrize("change, error, match", BAD_INPUTS, ids=[m for _, _, m in BAD_INPUTS])
@pytest.mark.parametrize("fn", [reference_w4a16, w4a16_matmul])
def test_invalid_inputs_raise(fn, change, error, match):
    with pytest.raises(error, match=match):
        fn(**_bad(**change))


@pytest.mark.parametrize("fn", [reference_w4a16, w4a16_matmul])
def test_packed_int4_mixed_with_raw_tensors_or_wrong_width(fn):
    c = _case(2, 3, 8, 4, seed=0)
    pi = PackedInt4(c["packed"], c["scales"], None, 4, 8)
    with pytest.raises(ValueError, match="either a PackedInt4 alone"):
        fn(c["x"], pi, c["scales"])
    with pytest.raises(ValueError, match="in_features=8"):
        fn(torch.zeros(2, 10), pi)


@pytest.mark.parametrize("name", ["block_m", "block_n", "block_k"])
@pytest.mark.parametrize("bad, match", [(0, "power of two"), (24, "power of two"), (1.5, "power of two"),
                                        (True, "power of two"), (8, "at least")])
def test_block_sizes_checked(name, bad, match):
    with pytest.raises(ValueError, match=match):
        w4a16_matmul(**_bad(), **{name: bad})


def test_fallback_when_triton_is_unavailable(monkeypatch, capsys):
    """Without triton (or a GPU, or the interpreter) w4a16_matmul answers with the reference
    and says so once."""
    monkeypatch.setattr(w4a16_module, "triton_mode", lambda: TritonMode("unavailable", "no triton in this test"))
    monkeypatch.setattr(kernels_pkg, "_NOTICES_SHOWN", set())
    c = _case(3, 9, 13, 13, symmetric=False, seed=2)
    y1 = w4a16_matmul(*_args(c))
    y2 = w4a16_matmul(*_args(c))
    _assert_within(y1, c["exact"], c["bound"], "fallback")
    assert torch.equal(y1, y2)
    assert capsys.readouterr().err == (
        "course_lib.kernels.w4a16: using the PyTorch reference (no triton in this test).\n")


def test_w4a16_result_in_this_process():
    """Whatever the mode here (kernel or reference fallback), w4a16_matmul gives the right answer."""
    c = _case(5, 33, 45, 9, symmetric=False, seed=4)
    _assert_within(w4a16_matmul(*_args(c, DEVICE)), c["exact"], c["bound"], "w4a16_matmul")


def test_empty_dimensions_reference():
    assert reference_w4a16(torch.zeros(0, 8), **{k: v for k, v in _bad().items() if k != "x"}).shape == (0, 3)
    y = reference_w4a16(torch.zeros(2, 0), torch.zeros(3, 0, dtype=torch.uint8),
                        torch.zeros(3, 0, dtype=torch.float16), 4)
    assert y.shape == (2, 3) and (y == 0).all()


@pytest.mark.slow
def test_module_imports_and_falls_back_without_triton():
    """A fresh interpreter where ``import triton`` fails (as on macOS/Windows): the module
    imports, w4a16_matmul returns the reference's answer and prints the notice."""
    code = (
        "import torch\n"
        "from course_lib.kernels import w4a16\n"
        "from course_lib.quant.packing import pack_int4\n"
        "assert w4a16._w4a16_kernel is None\n"
        "g = torch.Generator().manual_seed(0)\n"
        "q = torch.randint(-8, 8, (5, 9), generator=g); s = torch.rand(5, 3, generator=g).half()\n"
        "x = torch.randn(2, 9, generator=g)\n"
        "y = w4a16.w4a16_matmul(x, pack_int4(q), s, 3)\n"
        "ref = x.double() @ (q.double() * s.double().repeat_interleave(3, 1)).T\n"
        "assert (y.double() - ref).abs().max().item() < 1e-5, y\n"
        "print('ok')\n"
    )
    proc = run_without_triton(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert "course_lib.kernels.w4a16: using the PyTorch reference (triton does not import" in proc.stderr


def test_bench_measures_nothing_without_a_gpu(capsys):
    if MODE == "native":
        pytest.skip("a CUDA device is present: the benchmark would measure")
    from course_lib.kernels.bench_w4a16 import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "not a speed measurement" in out and "GB/s" not in out


def test_bench_peak_comes_from_course_lib_hardware():
    from course_lib.hardware import DEVICES
    from course_lib.kernels.bench_w4a16 import device_for

    assert device_for("NVIDIA H200") is DEVICES["H200"]
    assert device_for("NVIDIA H100 SXM5 80GB") is DEVICES["H100 SXM"]
    assert device_for("Tesla T4") is None


# ---------------------------------------------------------------- the Triton kernel


@needs_kernel
@pytest.mark.parametrize("symmetric, scale_dtype", VARIANTS, ids=["sym-fp16", "zero-fp16", "sym-fp32", "zero-fp32"])
@pytest.mark.parametrize("M, N, K, g", SHAPES)
def test_triton_kernel_matches_reference(M, N, K, g, symmetric, scale_dtype):
    c = _case(M, N, K, g, symmetric, scale_dtype, seed=M * 7 + N + K)
    args = _args(c, DEVICE)
    y = w4a16_matmul(*args, block_m=16, block_n=16, block_k=32)
    assert y.device == args[0].device
    _assert_within(y, c["exact"], c["bound"], "kernel vs float64 from the codes")
    _assert_within(y, reference_w4a16(*args), 2 * c["bound"], "kernel vs reference_w4a16")


@needs_kernel
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "zero"])
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=["x-fp16", "x-bf16"])
def test_triton_kernel_half_activations(x_dtype, symmetric):
    c = _case(4, 23, 45, 15, symmetric, x_dtype=x_dtype, seed=11)
    pi = PackedInt4(c["packed"].to(DEVICE), c["scales"].to(DEVICE),
                    None if c["zeros"] is None else c["zeros"].to(DEVICE), c["g"], 45)
    expected = c["x"].double() @ pi.dequantize().double().cpu().T
    y = w4a16_matmul(c["x"].to(DEVICE), pi, block_m=16, block_n=16, block_k=32)
    _assert_within(y, expected, c["bound"], "kernel(x, PackedInt4) vs x @ dequantize().T")


@needs_kernel
def test_triton_kernel_default_blocks_and_uint8_zeros():
    c = _case(2, 40, 384, 128, symmetric=False, scale_dtype=torch.float32, seed=8)
    x, packed, scales, g, zeros = _args(c, DEVICE)
    _assert_within(w4a16_matmul(x, packed, scales, g, zeros.to(torch.uint8)), c["exact"], c["bound"],
                   "default blocks, uint8 zero points")


@needs_kernel
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "zero"])
def test_triton_kernel_ignores_the_padding_nibble(symmetric):
    """For odd K the high nibble of each row's last byte is padding: whatever it holds, y is unchanged."""
    c = _case(3, 9, 13, 13, symmetric, seed=6)
    x, packed, scales, g, zeros = _args(c, DEVICE)
    dirty = packed.clone()
    dirty[:, -1] |= 0x70  # code 7 in the padding nibble
    _assert_within(w4a16_matmul(x, dirty, scales, g, zeros, block_m=16, block_n=16, block_k=32),
                   c["exact"], c["bound"], "kernel with a non-zero padding nibble")


@needs_kernel
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "zero"])
def test_triton_kernel_never_reads_outside_its_inputs(symmetric):
    """x, scales and zeros are interiors of NaN-filled buffers (x also with a column stride of 2),
    so any read outside them puts NaN into y; packed is the interior of a buffer of 0x77 bytes
    (code 7 in every nibble), so a byte read outside it and used for an output changes y. Odd M,
    N and K, and a K that is not a multiple of block_k, exercise every mask."""
    M, N, K, g = 5, 19, 45, 9
    c = _case(M, N, K, g, symmetric, seed=9)
    x0, p0, s0, _, z0 = _args(c)
    nan = float("nan")
    xbuf = torch.full((M + 2, 2 * K + 3), nan)
    xbuf[1 : M + 1, 1 : 2 * K + 1 : 2] = x0
    pbuf = torch.full((N + 2, p0.shape[1] + 3), 0x77, dtype=torch.uint8)
    pbuf[1 : N + 1, 1 : p0.shape[1] + 1] = p0
    sbuf = torch.full((N + 2, K // g + 3), nan, dtype=s0.dtype)
    sbuf[1 : N + 1, 1 : K // g + 1] = s0
    xbuf, pbuf, sbuf = xbuf.to(DEVICE), pbuf.to(DEVICE), sbuf.to(DEVICE)
    x = xbuf[1 : M + 1, 1 : 2 * K + 1 : 2]
    packed = pbuf[1 : N + 1, 1 : p0.shape[1] + 1]
    scales = sbuf[1 : N + 1, 1 : K // g + 1]
    zeros = None
    if z0 is not None:
        zbuf = torch.full((N + 2, K // g + 3), nan, dtype=z0.dtype)
        zbuf[1 : N + 1, 1 : K // g + 1] = z0
        zeros = zbuf.to(DEVICE)[1 : N + 1, 1 : K // g + 1]
    assert x.stride() == (2 * K + 3, 2) and not packed.is_contiguous() and not scales.is_contiguous()
    y = w4a16_matmul(x, packed, scales, g, zeros, block_m=16, block_n=16, block_k=32)
    assert torch.isfinite(y).all(), f"{(~torch.isfinite(y)).sum().item()} non-finite outputs"
    _assert_within(y, c["exact"], c["bound"], "kernel on views into sentinel buffers")


def _element_addresses(t: torch.Tensor) -> set[int]:
    """The byte address of every element of t (a view: only its own elements, not its buffer's)."""
    offsets = torch.zeros(t.shape, dtype=torch.int64)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = size
        offsets = offsets + torch.arange(size).view(shape) * stride
    return set((t.data_ptr() + offsets * t.element_size()).flatten().tolist())


@needs_kernel
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "zero"])
def test_triton_kernel_loads_and_stores_only_its_tensors(monkeypatch, symmetric):
    """Address trace under the interpreter: every unmasked load of the kernel must hit an element
    of x, packed, scales or zeros (all views into larger buffers, so a stray read would land in
    memory that exists but is not theirs), and every store an element of y, each exactly once.
    This catches reads that feed only outputs that are never stored, which no value can show."""
    if not w4a16_module.KERNEL_INTERPRETED:
        pytest.skip("the address trace needs Triton's interpreter (TRITON_INTERPRET=1)")
    import numpy as np
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or not hasattr(builder, "create_masked_load") or not hasattr(builder, "create_masked_store"):
        pytest.skip("this triton's interpreter has no InterpreterBuilder.create_masked_load/store to trace")
    loads, stores = [], []
    real_load, real_store = builder.create_masked_load, builder.create_masked_store

    def traced_load(self, ptrs, mask, *args, **kwargs):
        loads.append(ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)].astype(np.int64))
        return real_load(self, ptrs, mask, *args, **kwargs)

    def traced_store(self, ptrs, value, mask, *args, **kwargs):
        stores.append(ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)].astype(np.int64))
        return real_store(self, ptrs, value, mask, *args, **kwargs)

    monkeypatch.setattr(builder, "create_masked_load", traced_load)
    monkeypatch.setattr(builder, "create_masked_store", traced_store)
    M, N, K, g = 5, 19, 45, 9
    c = _case(M, N, K, g, symmetric, seed=12)
    x0, p0, s0, _, z0 = _args(c)
    x = torch.zeros(M + 1, 2 * K + 1)[1:, 1::2]
    x.copy_(x0)
    packed = torch.zeros(N + 2, p0.shape[1] + 2, dtype=torch.uint8)[1:-1, 1:-1]
    packed.copy_(p0)
    scales = torch.zeros(N + 2, K // g + 2, dtype=s0.dtype)[1:-1, 1:-1]
    scales.copy_(s0)
    zeros = None
    if z0 is not None:
        zeros = torch.zeros(N + 2, K // g + 2, dtype=z0.dtype)[1:-1, 1:-1]
        zeros.copy_(z0)
    y = w4a16_matmul(x, packed, scales, g, zeros, block_m=16, block_n=16, block_k=32)
    _assert_within(y, c["exact"], c["bound"], "traced kernel")
    allowed = set().union(*(_element_addresses(t) for t in (x, packed, scales, zeros) if t is not None))
    loaded = set(np.concatenate(loads).tolist())
    stray = loaded - allowed
    assert not stray, f"{len(stray)} addresses loaded outside x, packed, scales and zeros"
    for t in (x, packed, scales) + (() if zeros is None else (zeros,)):
        assert _element_addresses(t) <= loaded, "an input element was never read"
    stored = np.concatenate(stores)
    assert len(stored) == M * N and set(stored.tolist()) == _element_addresses(y), "y not stored exactly once"


@needs_kernel
def test_triton_kernel_empty_dimensions():
    _, packed, scales, g, _ = _args(_case(1, 3, 8, 4, seed=0), DEVICE)
    assert w4a16_matmul(torch.zeros(0, 8, device=DEVICE), packed, scales, g).shape == (0, 3)
    y = w4a16_matmul(torch.zeros(2, 0, device=DEVICE), torch.zeros(3, 0, dtype=torch.uint8, device=DEVICE),
                     torch.zeros(3, 0, dtype=torch.float16, device=DEVICE), 4)
    assert y.shape == (2, 3) and (y == 0).all()


@needs_kernel
def test_triton_kernel_actually_used(capfd):
    """In a kernel-capable process w4a16_matmul must not silently fall back to the reference."""
    w4a16_matmul(*_args(_case(2, 8, 8, 4, seed=0), DEVICE))
    assert "using the PyTorch reference" not in capfd.readouterr().err


# ---------------------------------------------------------------- the interpreter run


@pytest.mark.slow
def test_interpreter_subprocess():
    run_kernel_tests_in_interpreter(__file__)
