"""Tests of course_lib.kernels.exercise: the launcher of learner-written kernels and its address trace.

The kernels here are built for Triton's interpreter whatever this process's mode (TRITON_INTERPRET is
set only while they are decorated, as the labs' set-up cells do), so the trace runs on every CPU.
"""
from __future__ import annotations

import math
import os
import re
import sys

import pytest
import torch

from course_lib.exercises import ExerciseNeeded, is_unsolved_stub
from course_lib.kernels import triton_import_error
from course_lib.kernels.exercise import SENTINEL, TritonUnavailable, guard_changed, guarded, launcher, tl, triton
from course_lib.grading import lab01
from course_lib.grading.contracts import ContractError
from kernel_interpreter import run_without_triton

pytestmark = pytest.mark.skipif(triton_import_error() is not None, reason="triton does not import here")

_saved = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    @triton.jit
    def good(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            w = tl.load(w_ptr + rows[:, None] * stride_wm + cols[None, :],
                        mask=(rows < M)[:, None] & (cols < N)[None, :], other=0.0)
            xv = tl.load(x_ptr + cols, mask=cols < N, other=0.0)
            acc += tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)
        tl.store(y_ptr + rows, acc, mask=rows < M)

    @triton.jit
    def unmasked_store(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(y_ptr + rows, tl.zeros((BLOCK_M,), dtype=tl.float32))

    @triton.jit
    def packed_rows(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            w = tl.load(w_ptr + rows[:, None] * N + cols[None, :],
                        mask=(rows < M)[:, None] & (cols < N)[None, :], other=0.0)
            xv = tl.load(x_ptr + cols, mask=cols < N, other=0.0)
            acc += tl.sum(w * xv[None, :], axis=1)
        tl.store(y_ptr + rows, acc, mask=rows < M)

    @triton.jit
    def wild_pointer(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        tl.load(w_ptr + 100_000_000 + tl.arange(0, BLOCK_N))

    @triton.jit
    def no_other(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            w = tl.load(w_ptr + rows[:, None] * stride_wm + cols[None, :], mask=(rows < M)[:, None] & (cols < N)[None, :])
            xv = tl.load(x_ptr + cols, mask=cols < N)
            acc += tl.sum(w * xv[None, :], axis=1)
        tl.store(y_ptr + rows, acc, mask=rows < M)

    @triton.jit
    def atomic_past_x(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        tl.atomic_add(x_ptr + (1 << 30) + tl.arange(0, BLOCK_N), 1.0)      # far from every buffer

    @triton.jit
    def wide_read(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        tl.load((x_ptr + N - 1).to(tl.pointer_type(tl.int64)))

    @triton.jit
    def python_inside(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        f = sys.getrecursionlimit()
        tl.store(y_ptr, 0.0)

    @triton.jit
    def raw_handle(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        address = w_ptr.handle
        tl.store(y_ptr, 0.0)

    @triton.jit
    def imports(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        import ctypes
        tl.store(y_ptr, 0.0)

    @triton.jit
    def language_internals(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        frames = tl.core.inspect.stack()
        tl.store(y_ptr, 0.0)

    @triton.jit
    def hidden_def(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """The interpreter compiles a kernel from the last source line that starts with `def `:
        def hidden_def(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M, BLOCK_N):
        """
        tl.store(y_ptr, 0.0)

    @triton.jit
    def capture_scope(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        scope = triton.cdiv.get_capture_scope()
        tl.store(y_ptr, 0.0)

    def _python_helper(*args):
        return None

    HELPER = tl.constexpr(_python_helper)

    @triton.jit
    def constexpr_function(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        HELPER.value(w_ptr)
        tl.store(y_ptr, 0.0)

    @triton.jit
    def match_handle(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        h = 0
        match x_ptr:
            case tl.tensor(handle=h):
                h = 1
        tl.store(y_ptr, 0.0)

    @triton.jit
    def says_not_implemented(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        raise NotImplementedError("I did write it")

    @triton.jit
    def stub(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        raise NotImplementedError()

    @triton.jit
    def raises(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        tl.store(y_ptr + tl.arange(0, 3), 0.0)      # tl.arange needs a power of two
finally:
    if _saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _saved


def _case(m=13, n=37, dtype=torch.float32):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    return torch.randn(m, n, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_correct_kernel_is_launched_traced_and_reads_each_element_once(dtype):
    W, x = _case(dtype=dtype)
    y, report = launcher(good, "gemv")(W, x, block_m=4, block_n=16)
    torch.testing.assert_close(y, W.float() @ x.float(), rtol=1e-5, atol=1e-5)
    assert report["mode"] == "interpreter" and report["traced"] and report["grid"] == [4]
    assert report["violation"] is None and report["error"] is None and report["guard_writes"] == []
    assert report["loaded"] == {"W": 13 * 37, "x": 37 * 4} and report["stored"] == {"y": 13}


def test_a_missing_column_mask_stops_the_launch_and_names_the_column():
    """Rows of W are wider than N in the launcher's buffer, so the first read past column N - 1 is
    caught on row 0 of program 0, before it happens (seed 0's case 0: W 33 x 57 in blocks of 16 x 16;
    the 3 padding columns of 16 rows stray, the columns after them are the next row's)."""
    with pytest.raises(ContractError, match=r"program \(0,\) loaded from W\[0, 57\].*: 48 lane.*\n"
                                            r".*tail mask is left out of W's load"):
        lab01.check_gemv_kernel(_without_column_mask(), seed=0, cases=1)


def _without_column_mask():
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import linecache
        source = ("def tail(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
                  "    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
                  "    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)\n"
                  "    for n0 in range(0, N, BLOCK_N):\n"
                  "        cols = n0 + tl.arange(0, BLOCK_N)\n"
                  "        w = tl.load(w_ptr + rows[:, None] * stride_wm + cols[None, :], mask=(rows < M)[:, None])\n"
                  "        xv = tl.load(x_ptr + cols, mask=cols < N, other=0.0)\n"
                  "        acc += tl.sum(w * xv[None, :], axis=1)\n"
                  "    tl.store(y_ptr + rows, acc, mask=rows < M)\n")
        linecache.cache["<tail kernel>"] = (len(source), None, source.splitlines(True), "<tail kernel>")
        namespace = {"tl": tl}
        exec(compile(source, "<tail kernel>", "exec"), namespace)
        return triton.jit(namespace["tail"])
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def test_a_store_past_the_last_row_is_stopped_before_it_lands():
    W, x = _case(m=5, n=8)
    y, report = launcher(unmasked_store, "gemv")(W, x, block_m=4, block_n=8)
    v = report["violation"]
    assert v["op"] == "store" and v["tensor"] == "y" and v["index"] == [5] and v["program"][0] == 1 and v["lanes"] == 3
    assert report["guard_writes"] == []                     # stopped before the access: the sentinel is intact
    with pytest.raises(ContractError, match=r"stored to y\[33\].*\n.*row mask is left out of the store"):
        lab01.check_gemv_kernel(unmasked_store, seed=0, cases=1)


def test_rows_addressed_with_n_instead_of_the_row_stride_are_named():
    with pytest.raises(ContractError, match=r"rows of W were addressed \d+ elements apart.*use stride_wm, not N"):
        lab01.check_gemv_kernel(packed_rows, seed=0, cases=1)


def test_a_wild_pointer_is_refused_without_touching_memory():
    W, x = _case(m=4, n=16)
    _, report = launcher(wild_pointer, "gemv")(W, x, block_m=4, block_n=16)
    assert report["violation"]["tensor"] in ("W", "x", "y") and report["violation"]["inside_buffer"] is False
    with pytest.raises(ContractError, match="an address far from every tensor"):
        lab01.check_gemv_kernel(wild_pointer, seed=0, cases=1)


def test_the_interpreter_is_left_as_it_was_after_a_launch_that_failed():
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    before = (interpreter.InterpreterBuilder.create_masked_load, interpreter.InterpreterBuilder.create_masked_store,
              JITFunction.__call__)
    W, x = _case(m=5, n=8)
    for kernel in (unmasked_store, raises, good):
        launcher(kernel, "gemv")(W, x, block_m=4, block_n=8)
    assert (interpreter.InterpreterBuilder.create_masked_load, interpreter.InterpreterBuilder.create_masked_store,
            JITFunction.__call__) == before


def test_an_exception_in_the_kernel_is_reported_with_its_own_type():
    W, x = _case(m=5, n=8)
    _, report = launcher(raises, "gemv")(W, x, block_m=4, block_n=8)
    assert report["violation"] is None and report["error"].split(":")[0] in ("ValueError", "AssertionError",
                                                                             "TypeError", "CompilationError")
    with pytest.raises(ContractError, match="your kernel raised"):
        lab01.check_gemv_kernel(raises, seed=0, cases=1)


def test_the_unsolved_stub_asks_for_the_exercise():
    assert is_unsolved_stub(stub) and not is_unsolved_stub(good)
    with pytest.raises(ExerciseNeeded, match="`gemv_kernel` is not written yet"):
        lab01.check_gemv_kernel(stub, seed=0)


def test_anything_but_a_learners_triton_kernel_is_refused():
    from triton.runtime.jit import KernelInterface

    class Imitation(KernelInterface):
        fn = good.fn

        def run(self, *args, grid, warmup, **kwargs):
            raise AssertionError("an imitation must never be launched")

    W, x = _case(m=4, n=8)
    for impostor in (lambda W, x, y, *rest, **kw: y.copy_(W @ x), Imitation(), good.fn):
        with pytest.raises(TypeError, match="must be a function decorated with @triton.jit"):
            launcher(impostor, "gemv")(W, x, block_m=4, block_n=8)
    disguised = good.fn
    saved = disguised.__module__
    disguised.__module__ = "course_lib.kernels.gemv"        # as the course's own kernel reports itself
    try:
        with pytest.raises(ValueError, match="course_lib's kernel"):
            launcher(good, "gemv")(W, x, block_m=4, block_n=8)
    finally:
        disguised.__module__ = saved


def test_bad_launch_arguments_are_refused_before_the_kernel_runs():
    W, x = _case(m=4, n=8)
    with pytest.raises(ValueError, match="block_m"):
        launcher(good, "gemv")(W, x, block_m=3, block_n=8)
    with pytest.raises(ValueError, match="x has 7 elements"):
        launcher(good, "gemv")(W, x[:7], block_m=4, block_n=8)
    with pytest.raises(KeyError, match="no kernel exercise 'gemm'"):
        launcher(good, "gemm")


def test_a_write_into_an_outputs_guard_is_seen():
    view, buffer = guarded((3, 4), torch.float32, "cpu", SENTINEL)
    assert not guard_changed(view, buffer)
    buffer[-1, 0] = 0.0
    assert guard_changed(view, buffer)
    view1, buffer1 = guarded((5,), torch.float32, "cpu", SENTINEL)
    view1.fill_(math.nan)
    assert not guard_changed(view1, buffer1)
    buffer1[0] = 1.0
    assert guard_changed(view1, buffer1)


def test_check_gemv_kernel_passes_a_right_kernel_on_many_seeds():
    for seed in range(6):
        lab01.check_gemv_kernel(good, seed=seed, cases=6)


def test_without_triton_the_kernel_cell_runs_and_the_launch_says_why():
    proc = run_without_triton(
        "from course_lib.kernels.exercise import triton, tl, launcher, TritonUnavailable\n"
        "import torch\n"
        "@triton.jit\n"
        "def k(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    pass\n"
        "try:\n"
        "    launcher(k, 'gemv')(torch.ones(2, 2), torch.ones(2), block_m=2, block_n=2)\n"
        "except TritonUnavailable as exc:\n"
        "    print('refused:', exc)\n")
    assert proc.returncode == 0, proc.stderr
    assert "refused: gemv_kernel: this exercise needs Triton" in proc.stdout
    assert TritonUnavailable.__mro__[1] is RuntimeError


def test_masked_lanes_without_other_read_nan_as_a_gpu_would_read_garbage():
    """The interpreter alone reads 0 in masked lanes; the trace makes them NaN (float32), so a kernel
    that relies on it fails here as it could on a GPU."""
    W, x = _case(m=5, n=10)
    y, report = launcher(no_other, "gemv")(W, x, block_m=4, block_n=8)
    assert report["violation"] is None and bool(torch.isnan(y).all())
    with pytest.raises(ContractError, match="a masked load without other=0.0 reads NaN"):
        lab01.check_gemv_kernel(no_other, seed=0, cases=1)


def test_atomics_and_wide_accesses_are_traced_too():
    W, x = _case(m=4, n=16)
    _, report = launcher(atomic_past_x, "gemv")(W, x, block_m=4, block_n=16)
    # 2^30 elements past x: which buffer is nearest depends on where the allocator put them
    assert report["violation"]["op"] == "atomic" and report["violation"]["lanes"] == 16
    _, report = launcher(wide_read, "gemv")(W, x, block_m=4, block_n=16)
    assert report["violation"] == {**report["violation"], "op": "load", "tensor": "x", "index": [15]}


@pytest.mark.parametrize("kernel, construct", [(python_inside, "`sys` is the module sys, not triton.language"),
                                               (raw_handle, "`.handle` is not an attribute of a Triton value"),
                                               (imports, "an import"),
                                               (language_internals, "tl.core.inspect is not part of triton.language"),
                                               (hidden_def, "starts with `def `"),
                                               (capture_scope, "`.get_capture_scope` is not an attribute of a Triton value"),
                                               (constexpr_function, "`HELPER` is triton.language.core.constexpr, not a constant"),
                                               (match_handle, "a match statement")])
def test_a_body_that_is_python_rather_than_triton_is_refused_before_it_runs(kernel, construct):
    """Under the interpreter a kernel body runs as Python: without this rule it could compute y in
    PyTorch from the launcher's frames or raw pointers. A GPU would not compile any of these."""
    W, x = _case(m=4, n=8)
    with pytest.raises(TypeError, match=re.escape(construct)):
        launcher(kernel, "gemv")(W, x, block_m=4, block_n=8)


def test_only_nbgraders_bare_stub_counts_as_unwritten():
    with pytest.raises(ContractError, match="your kernel raised NotImplementedError: I did write it"):
        lab01.check_gemv_kernel(says_not_implemented, seed=0, cases=1)


# -- Lab 4's W4A16 kernel --------------------------------------------------------------------------
_ZEROS_ALWAYS = ("        if HAS_ZEROS:\n            z = tl.load(z_ptr + rows[:, None] * stride_zn + group, mask=ok, other=0).to(tl.float32)",
                 "        z = tl.load(z_ptr + rows[:, None] * stride_zn + group, mask=ok, other=0).to(tl.float32)\n"
                 "        if HAS_ZEROS:")


@pytest.mark.slow
def test_the_w4a16_solution_equals_dequantise_then_matmul_on_the_real_down_proj():
    """The issue's real-weights case: block 3's down_proj (576 x 1536) of SmolLM2, int4 g64, one token,
    signed and zero-point codes; each packed byte is loaded by the lanes of its two codes, no more."""
    from course_lib import quant
    from course_lib.data import load_smollm2
    from solutions import solution_functions

    kernel = solution_functions("04_quantization").w4a16_kernel
    model, _, _ = load_smollm2()
    W = dict(quant.linear_layers(model))["layers.3.down_proj"].weight.detach()
    x = torch.randn(1, W.shape[1], generator=torch.Generator().manual_seed(0))
    for symmetric in (True, False):
        packed = quant.pack_weight(W, 64, symmetric=symmetric, scale_dtype="fp16")
        zeros = None if symmetric else packed.zeros.to(torch.uint8)
        y, report = launcher(kernel, "w4a16")(x, packed.packed, packed.scales, 64, zeros, block_n=32, block_k=64)
        w_hat = packed.dequantize()
        bound = 4 * W.shape[1] * 2.0 ** -24 * (x.abs() @ w_hat.abs().T) + 1e-30
        assert report["violation"] is None and report["error"] is None
        assert bool(((y - x @ w_hat.T).abs() <= bound).all())
        assert report["loaded"]["packed"] == W.numel() and report["loaded"]["scales"] == W.numel()


def test_w4a16_zero_points_read_without_any_are_named():
    from course_lib.grading import lab04
    from course_lib.grading.tables import Edit
    from solutions import solution_functions

    kernel = solution_functions("04_quantization", (Edit("w4a16_kernel", *_ZEROS_ALWAYS),)).w4a16_kernel
    with pytest.raises(ContractError, match=r"loaded from zeros\[0\], outside its shape \(0,\)(.|\n)*only under `if HAS_ZEROS:`"):
        lab04.check_w4a16_kernel(kernel, seed=0, cases=1)


def test_check_w4a16_kernel_passes_the_solution_on_many_seeds():
    from course_lib.grading import lab04
    from solutions import solution_functions

    kernel = solution_functions("04_quantization").w4a16_kernel
    for seed in range(6):
        lab04.check_w4a16_kernel(kernel, seed=seed, cases=5)


def test_an_output_addressed_with_an_inputs_row_stride_strays_and_is_named():
    """x and y have the same shape; their guards differ in width, so their row strides differ."""
    from course_lib.grading import lab06
    from course_lib.grading.tables import Edit
    from solutions import solution_functions

    edit = Edit("rms_norm_kernel", "tl.store(y_ptr + row * stride_yr + cols", "tl.store(y_ptr + row * stride_xr + cols")
    kernel = solution_functions("06_batching_determinism", (edit,)).rms_norm_kernel
    with pytest.raises(ContractError, match=r"program 1 reached row 0 of y: row r of y starts r \* stride_yr"):
        lab06.check_rms_norm_kernel(kernel, seed=0, cases=1)


def test_eps_added_to_the_scale_is_named():
    """1 / sqrt(ms) + eps (a newcomer's version) is not 1 / (sqrt(ms) + eps): each gets its own diagnosis."""
    from course_lib.grading import lab06
    from course_lib.grading.tables import Edit
    from solutions import solution_functions

    edit = Edit("rms_norm_kernel", "rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)",
                "rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D) + eps")
    kernel = solution_functions("06_batching_determinism", (edit,)).rms_norm_kernel
    with pytest.raises(ContractError, match=r"eps added to the scale"):
        lab06.check_rms_norm_kernel(kernel, seed=0, cases=1)


# -- Lab 2: the paged decode kernel ---------------------------------------------------------------
def _paged_case(lens=(5,), block_size=4, width=3, n_kv=1, group=2, dim=8, dtype=torch.float32):
    """q, caches, a table whose rows use consecutive blocks (padding 0 past them) and the lengths."""
    gen = torch.Generator().manual_seed(sum(lens))
    used = [-(-n // block_size) for n in lens]
    num_blocks = sum(used) + 1
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    for b, n in enumerate(used):
        table[b, :n] = torch.arange(sum(used[:b]), sum(used[:b]) + n)
    q = torch.randn(len(lens), n_kv * group, dim, generator=gen).to(dtype)
    k = torch.randn(num_blocks, block_size, n_kv, dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, n_kv, dim, generator=gen).to(dtype)
    return q, k, v, table, torch.tensor(lens)


def _paged_solution(*edits):
    from course_lib.grading.tables import Edit
    from solutions import solution_functions

    return solution_functions("02_kv_cache", tuple(Edit("paged_decode_kernel", *e) for e in edits)).paged_decode_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_paged_decode_solution_equals_the_pytorch_path_and_reads_each_needed_slot_once_per_query_head(dtype):
    from course_lib.kernels.paged_attention import reference_paged_decode_attention

    q, k, v, table, lens = _paged_case(lens=(5, 12, 1), width=4, n_kv=2, group=3, dtype=dtype)
    o, report = launcher(_paged_solution(), "paged_decode")(q, k, v, table, lens)
    assert report["violation"] is None and report["error"] is None and report["guard_writes"] == []
    expected = reference_paged_decode_attention(q.float(), k.float(), v.float(), table, lens)
    assert (o - expected).abs().max() < 1e-5
    # 3 query heads share each KV head and read it once each: 3 loads per needed K element
    assert report["loaded"]["k_cache"] == report["loaded"]["v_cache"] == 3 * sum(lens.tolist()) * 2 * 8


def test_check_paged_decode_kernel_passes_the_solution_on_many_seeds():
    from course_lib.grading import lab02

    for seed in range(6):
        lab02.check_paged_decode_kernel(_paged_solution(), seed=seed, cases=6)


def test_a_padding_entry_read_through_an_unmasked_load_is_named():
    """One block more than the context spans, loaded without the mask: row 0's next entry is padding,
    which the launcher sets to an id just past the pool."""
    from course_lib.grading import lab02

    kernel = _paged_solution(("range(0, tl.cdiv(context, BLOCK_SIZE))", "range(0, tl.cdiv(context, BLOCK_SIZE) + 1)"),
                             ("k = tl.load(k_ptr + offsets, mask=valid[:, None], other=0.0)", "k = tl.load(k_ptr + offsets)"))
    q, k, v, table, lens = _paged_case(lens=(5,), width=3)
    o, report = launcher(kernel, "paged_decode")(q, k, v, table, lens)
    violation = report["violation"]
    assert (violation["op"], violation["tensor"], violation["index"][0]) == ("load", "k_cache", k.shape[0])
    named = lab02.paged_stray(k.shape[0], 1, 2)(violation)
    assert f"block {k.shape[0]} was read: the id the launcher writes in the block table's padding" in named


def test_stale_slots_after_the_context_are_nan_so_an_unmasked_tail_shows():
    kernel = _paged_solution(("k = tl.load(k_ptr + offsets, mask=valid[:, None], other=0.0)", "k = tl.load(k_ptr + offsets)"),
                             ("v = tl.load(v_ptr + offsets, mask=valid[:, None], other=0.0)", "v = tl.load(v_ptr + offsets)"))
    q, k, v, table, lens = _paged_case(lens=(5, 8), width=2)
    o, report = launcher(kernel, "paged_decode")(q, k, v, table, lens)
    assert report["violation"] is None
    assert bool(o[0].isnan().all()) and not bool(o[1].isnan().any())     # 5 of 8 slots used; 8 of 8


def test_paged_decode_launch_arguments_are_refused_before_the_kernel_runs():
    kernel = _paged_solution()
    q, k, v, table, lens = _paged_case()
    launch = launcher(kernel, "paged_decode")
    with pytest.raises(ValueError, match="block size"):
        launch(q, k[:, :3], v[:, :3], table, lens)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        launch(q.half(), k.half(), v.half(), table, lens)
    bad = table.clone()
    bad[0, 1] = 99
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\] is 99, not a block of the pool"):
        launch(q, k, v, bad, lens)


def test_an_outputs_guard_is_checked_for_any_strided_view():
    buffer = torch.full((4, 2, 3, 7), SENTINEL)
    view = buffer[1:3, :1, :, :5].permute(0, 2, 1, 3)
    view.fill_(0.0)
    assert not guard_changed(view, buffer)
    buffer[1, 1, 0, 0] = 1.0              # head 1 is outside the view
    assert guard_changed(view, buffer)


@pytest.mark.parametrize("lab, kernel_name", [("01_roofline", "gemv_kernel"), ("02_kv_cache", "paged_decode_kernel"),
                                              ("04_quantization", "w4a16_kernel"), ("06_batching_determinism", "rms_norm_kernel")])
def test_every_solution_kernel_is_also_compiled_for_a_gpu_after_other_launches(lab, kernel_name):
    """The launcher compiles the learner's kernel for an H100 (sm_90) without a GPU. An interpreted launch
    leaves triton.language patched (a helper such as tl.sum patches tl.core and never restores it), so
    this runs after the launches of earlier tests in the same process and of the course's own kernel."""
    from course_lib.kernels.gemv import gemv
    from solutions import solution_functions

    gemv(torch.randn(5, 7), torch.randn(7))          # the course's kernel, interpreted: patches triton.language
    kernel = getattr(solution_functions(lab), kernel_name)
    inputs = {"gemv_kernel": lambda: (_case(), {"block_m": 4, "block_n": 16}),
              "paged_decode_kernel": lambda: (_paged_case(), {}),
              "w4a16_kernel": lambda: ((torch.randn(2, 8), torch.randint(0, 255, (3, 4), dtype=torch.uint8),
                                        torch.rand(3, 2).half(), 4), {"block_n": 4, "block_k": 8}),
              "rms_norm_kernel": lambda: ((torch.randn(3, 10), torch.randn(10), 1e-5), {"block_d": 16})}
    args, kwargs = inputs[kernel_name]()
    name = {"gemv_kernel": "gemv", "paged_decode_kernel": "paged_decode", "w4a16_kernel": "w4a16",
            "rms_norm_kernel": "rms_norm"}[kernel_name]
    *_, report = launcher(kernel, name)(*args, **kwargs)
    assert report["error"] is None and report["violation"] is None
    assert report["compiled"] is True and report["compile_error"] is None


def test_a_kernel_the_interpreter_runs_but_a_gpu_compiler_refuses_fails_with_the_compilers_message():
    from course_lib.grading import lab02

    kernel = _paged_solution(("l = 0.0", "l = 0"))
    o, report = launcher(kernel, "paged_decode")(*_paged_case())
    assert report["error"] is None and not bool(o.isnan().any())       # the interpreter computed it
    assert report["compiled"] is False and "Loop-carried variable l has initial type int32" in report["compile_error"]
    with pytest.raises(ContractError, match="Triton's compiler refuses it for a GPU(.|\n)*Loop-carried variable l"):
        lab02.check_paged_decode_kernel(kernel, seed=0, cases=1)


def test_a_compiler_that_cannot_run_here_gives_no_verdict(monkeypatch):
    """No ptxas, an unwritable cache: the canary kernel does not compile either, so nothing is held
    against the learner's kernel."""
    import course_lib.kernels.exercise as exercise

    monkeypatch.setattr(exercise, "_COMPILED", {})
    monkeypatch.setattr(exercise, "COMPILE_TARGET", ("no-such-backend", 0, 0))      # the canary cannot compile
    kernel = _paged_solution(("l = 0.0", "l = 0"))
    *_, report = launcher(kernel, "paged_decode")(*_paged_case())
    assert report["compiled"] is None and report["compile_error"] is None


def test_a_kernel_source_that_is_not_triton_fails_the_check_in_one_line():
    from course_lib.grading import lab02

    kernel = _paged_solution(("kvh = h // GROUP", "kvh = h // sorted([GROUP])[0]"))
    with pytest.raises(ContractError, match=r"case 0: .*paged_decode_kernel, line \d+: `sorted` is not a Triton builtin"):
        lab02.check_paged_decode_kernel(kernel, seed=0, cases=1)


# -- kernels that are Python in disguise (found by a hostile review of the paged exercise) ---------
_CHEAT = '''
import sys as _sys
import triton
import triton.language as tl

RAN = []


def _cheat(*_):
    """What each disguise would run: walk up to the launcher and write the course's answer into o."""
    RAN.append(1)
    from course_lib.kernels.paged_attention import reference_paged_decode_attention as _ref
    f = _sys._getframe(0)
    while f is not None and "o_view" not in f.f_locals:
        f = f.f_back
    L = f.f_locals
    L["o_view"].copy_(_ref(L["q"].float(), L["k_cache"].float(), L["v_cache"].float(), L["block_tables"],
                           L["context_lens"]).float())
    return 0
'''
_SIGNATURE = ("(q_ptr, k_ptr, v_ptr, bt_ptr, cl_ptr, o_ptr, scale, stride_qb, stride_qh, stride_kb, stride_ks, "
              "stride_kh, stride_tb, stride_ob, stride_oh, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, "
              "HEAD_DIM: tl.constexpr)")
_ZERO_STORE = ("    d = tl.arange(0, HEAD_DIM)\n"
               "    tl.store(o_ptr + tl.program_id(0) * stride_ob + tl.program_id(1) * stride_oh + d, "
               "tl.zeros((HEAD_DIM,), dtype=tl.float32))\n")
_DISGUISES = {
    "a tl.dtype subclass that is callable": ("class _Fast(tl.dtype):\n    def __call__(self, *a):\n        return _cheat()\n"
                                             "FAST = _Fast('fp32')\n", "    FAST()\n", "not a\\s+constant"),
    "a tl.constexpr subclass that is callable": ("class _One(tl.constexpr):\n    def __call__(self, *a):\n        return _cheat()\n"
                                                 "ONE = _One(1)\n", "    ONE()\n", "not a\\s+constant"),
    "an object whose __class__ says tl.dtype": ("class _Liar:\n    __class__ = property(lambda self: tl.dtype)\n"
                                                "    def __call__(self, *a):\n        return _cheat()\nLIAR = _Liar()\n",
                                                "    LIAR()\n", "not a\\s+constant"),
    "a name planted in triton.language": ("_cheat.__module__ = 'triton.language.standard'\ntl.group_sum = _cheat\n",
                                          "    tl.group_sum(d)\n", "not part of triton.language"),
    "the interpreter's name for assignments, defined in the kernel's module": (
        "from triton.runtime import interpreter as _ti\n"
        "class _Semantic:\n    def __getattr__(self, n):\n        return getattr(_ti.interpreter_semantic, n)\n"
        "    def to_tensor(self, value, check):\n        _cheat()\n        return _ti.interpreter_semantic.to_tensor(value, check)\n"
        "interpreter_semantic = _Semantic()\n", "    done = 1\n", "interpreter's name"),
    "the interpreter's name for chained comparisons, defined in the kernel's module": (
        "from triton.runtime import interpreter as _ti\n"
        "class _InterpreterComparison(_ti._InterpreterComparison):\n"
        "    def get_result(self):\n        _cheat()\n        return super().get_result()\n",
        "    ok = 0 <= HEAD_DIM < 100000\n", "interpreter's name"),
    "__builtins__ replaced in the kernel's module": (
        "import builtins as _b\n__builtins__ = dict(vars(_b), range=lambda *a: (_cheat(), _b.range(*a))[1])\n",
        "    for k in range(0, 1):\n        d += 0\n", "`__builtins__` was replaced"),
    "a @triton.jit helper that claims to be triton's": (
        "@triton.jit\ndef _helper(x):\n    import sys\n    return x\n_helper.fn.__module__ = 'triton.language.standard'\n",
        "    _helper(d)\n", "an import"),
}


def _disguised(tmp_path, name: str, preamble: str, body: str, def_line: str = "def paged_decode_kernel"):
    """Write the module (the cheat, PREAMBLE, then a kernel whose body stores zeros and runs BODY) and import it
    with the interpreter on, as a notebook cell would define it."""
    path = tmp_path / f"{name}.py"
    path.write_text(_CHEAT + preamble + f"\n\n@triton.jit\n{def_line}{_SIGNATURE}:\n" + _ZERO_STORE + body)
    return _import_interpreted(name, str(path))


def _import_interpreted(name: str, path: str):
    """The module at PATH imported as NAME with TRITON_INTERPRET=1 (its kernels built for the interpreter)."""
    import importlib.util

    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return module


@pytest.mark.parametrize("disguise", sorted(_DISGUISES))
def test_python_in_a_triton_disguise_is_refused_before_it_runs(tmp_path, disguise):
    from course_lib.grading import lab02

    preamble, body, message = _DISGUISES[disguise]
    module = _disguised(tmp_path, f"disguise_{sorted(_DISGUISES).index(disguise)}", preamble, body)
    try:
        with pytest.raises(ContractError, match=message):
            lab02.check_paged_decode_kernel(module.paged_decode_kernel, seed=0, cases=1)
        assert module.RAN == []
    finally:
        tl.__dict__.pop("group_sum", None)


@pytest.mark.parametrize("separator", ["\t", "\\\n    ", "\f"])
def test_a_definition_line_the_interpreter_would_skip_is_refused(tmp_path, separator):
    """Triton's interpreter runs a kernel from the last line that starts with `def ` (a space): with
    `def<TAB>name(` the only such line is one hidden in the docstring, which would run unchecked."""
    from course_lib.grading import lab02

    hidden = (f'    """\ndef paged_decode_kernel{_SIGNATURE}:\n    _cheat()\n' + _ZERO_STORE + '    """\n')
    module = _disguised(tmp_path, f"def_{ord(separator[0])}", "", hidden, def_line=f"def{separator}paged_decode_kernel")
    with pytest.raises(ContractError, match="write the kernel's definition `def name"):
        lab02.check_paged_decode_kernel(module.paged_decode_kernel, seed=0, cases=1)
    assert module.RAN == []


def test_a_function_planted_in_the_interpreters_cache_is_not_what_runs(tmp_path):
    """InterpretedFunction.rewritten_fn maps a kernel to the Python function the interpreter runs; an
    entry written there before the launch is dropped, so the checked source is what runs."""
    from triton.runtime.interpreter import InterpretedFunction
    from course_lib.grading import lab02

    module = _disguised(tmp_path, "cache_poison", "", "")
    InterpretedFunction.rewritten_fn[module.paged_decode_kernel.fn] = lambda *a, **k: module._cheat()
    with pytest.raises(ContractError, match="differs from contiguous attention"):    # the zeros it stores
        lab02.check_paged_decode_kernel(module.paged_decode_kernel, seed=0, cases=1)
    assert module.RAN == []


def test_a_kernel_that_writes_with_atomics_is_counted_as_storing():
    from course_lib.grading.tables import Edit
    from solutions import solution_functions

    kernel = solution_functions("01_roofline", (Edit("gemv_kernel", "tl.store(y_ptr + rows, acc, mask=row_mask)",
                                                     "tl.store(y_ptr + rows, acc * 0.0, mask=row_mask)\n"
                                                     "    tl.atomic_add(y_ptr + rows, acc, mask=row_mask)"),)).gemv_kernel
    W, x = _case()
    y, report = launcher(kernel, "gemv")(W, x, block_m=4, block_n=16)
    assert report["error"] is None and report["stored"]["y"] == 2 * 13     # 13 stores, 13 atomic adds
    assert torch.allclose(y, W @ x, atol=1e-5)


def test_a_builtin_replaced_for_the_whole_process_is_refused(monkeypatch):
    import builtins

    from course_lib.grading import lab02

    real_abs = builtins.abs
    monkeypatch.setattr(builtins, "abs", lambda x: real_abs(x))
    with pytest.raises(ContractError, match="the builtins abs were replaced"):
        lab02.check_paged_decode_kernel(_paged_solution(), seed=0, cases=1)


def test_the_functions_that_read_a_kernels_source_must_be_pythons_own(monkeypatch):
    """A linecache.getlines that answered the rule with one source and the interpreter with another would
    run unchecked text."""
    import linecache

    from course_lib.grading import lab02

    real = linecache.getlines
    monkeypatch.setattr(linecache, "getlines", lambda *a, **k: real(*a, **k))
    with pytest.raises(ContractError, match="linecache.getlines were replaced"):
        lab02.check_paged_decode_kernel(_paged_solution(), seed=0, cases=1)


# -- a @triton.jit object or function changed after the decorator (tests/kernel_attacks/) -----------
_ATTACKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_attacks")


def _attack(name: str):
    """tests/kernel_attacks/NAME.py imported with the interpreter on; its gemv_kernel."""
    return _import_interpreted(f"kernel_attack_{name}", os.path.join(_ATTACKS, f"{name}.py")).gemv_kernel


@pytest.mark.parametrize("name, message", [
    ("pre_run_hook", "changed after the decorator"), ("run_replaced", "changed after the decorator"),
    ("fn_swapped", "changed after the decorator"), ("annotation_object", "annotation of 'M' is not tl.constexpr"),
    ("renamed_function", "not exactly @triton.jit"), ("decorator_hook", "not exactly @triton.jit"),
    ("default_argument", "default value"),
    ("executor_patched", "hold NaN"),       # Triton's classes are restored before the launch: the copy of y runs
    ("dtype_instance_method", "not a\\s+constant"), ("float32_instance_method", "hold NaN"),
    ("builder_instance_method", "33 of 33 rows over"), ("annotation_expression", "annotation of 'M' is `_C.value\\(\\)`"),
])
def test_a_kernel_object_changed_after_the_decorator_scores_nothing(name, message):
    """Each of these scored full marks through the grader before the launcher checked the object and
    launched a fresh one from the checked function, with Triton's runtime as imported."""
    from course_lib.kernels.exercise import restore_triton

    try:
        with pytest.raises(ContractError, match=message):
            lab01.check_gemv_kernel(_attack(name), seed=0, cases=2)
    finally:       # what the attack planted in Triton (GridExecutor, tl.float32, the builder) goes for later tests
        restore_triton()


@pytest.mark.parametrize("name", ["honest_helpers", "honest_reduce"])
def test_honest_kernels_written_other_ways_pass(name):
    lab01.check_gemv_kernel(_attack(name), seed=0, cases=4)


# == a kernel as data: what the grading judge launches in a process of its own ====================
def _exported_honest():
    from course_lib.kernels.exercise import export_kernel

    kernel = _import_interpreted("kernel_data_honest", os.path.join(_ATTACKS, "honest_helpers.py")).gemv_kernel
    return kernel, export_kernel(kernel, "gemv_kernel")


def test_a_kernel_exported_as_data_and_rebuilt_elsewhere_passes_its_check(tmp_path):
    import json

    from course_lib.kernels.exercise import rebuild_kernel

    kernel, data = _exported_honest()
    assert [f["name"] for f in data["functions"]] == ["gemv_kernel", "_tile"] and data["interpreted"] is True
    helper_globals = dict(data["functions"][1]["globals"])
    assert helper_globals["ZERO"] == {"constexpr": {"constant": 0.0}} and helper_globals["tl"] == {"module": "triton.language"}
    assert dict(data["functions"][0]["globals"])["_tile"] == {"function": 1}
    rebuilt = rebuild_kernel(json.loads(json.dumps(data)), tmp_path)
    assert rebuilt is not kernel and rebuilt.fn.__globals__ is not kernel.fn.__globals__
    assert rebuilt.fn.__code__.co_firstlineno == kernel.fn.__code__.co_firstlineno
    lab01.check_gemv_kernel(rebuilt)


def _edited(data: dict, function: int = 0, *, source=None, bind=None, **fields) -> dict:
    import copy

    data = copy.deepcopy(data)
    entry = data["functions"][function]
    if source is not None:
        entry["source"] = source(entry["source"])
    if bind is not None:
        entry["globals"] = [[n, bind.get(n, b)] for n, b in entry["globals"]] + \
            [[n, b] for n, b in bind.items() if n not in dict(entry["globals"])]
    entry.update(fields)
    return data


_MARK = "open(MARK, 'w').write('ran')"
_NOT_A_KERNEL = {
    "a statement beside the definition": (lambda d: _edited(d, source=lambda s: _MARK + "\n" + s), "not exactly the definition"),
    "a second decorator": (lambda d: _edited(d, source=lambda s: s.replace("@triton.jit", f"@triton.jit\n@print({_MARK})")),
                           "decorators"),
    "a call as an annotation": (lambda d: _edited(d, source=lambda s: s.replace("BLOCK_M: tl.constexpr", f"BLOCK_M: {_MARK}")),
                                "annotations"),
    "a default": (lambda d: _edited(d, source=lambda s: s.replace("BLOCK_N: tl.constexpr", f"BLOCK_N: tl.constexpr = {_MARK}")),
                  "defaults"),
    "tl bound to os": (lambda d: _edited(d, bind={"tl": {"module": "os"}}), "binding 'module'"),
    "a member of os": (lambda d: _edited(d, bind={"sys": {"member": ["os", "system"]}}), "binding 'member'"),
    "triton.language.core's import of builtins": (
        lambda d: _edited(d, bind={"o": {"member": ["triton.language.core", "builtins"]}}), "binding 'member'"),
    "a dict constant": (lambda d: _edited(d, bind={"C": {"constant": {"a": 1}}}), "constant of type dict"),
    "a constexpr holding a function": (lambda d: _edited(d, bind={"C": {"constexpr": {"function": 0}}}), "constexpr holding"),
    "a function past the list": (lambda d: _edited(d, bind={"_tile": {"function": 7}}), "binding 'function'"),
    "tl bound to a number": (lambda d: _edited(d, bind={"tl": {"constant": 3}}), "other than triton"),
    "a line number out of range": (lambda d: _edited(d, line=10 ** 9), "out of range"),
    "a field too many": (lambda d: {**d, "extra": 1}, "fields"),
    "no functions": (lambda d: {**d, "functions": []}, "0 functions"),
    "a source that does not parse": (lambda d: _edited(d, source=lambda s: s + "\n  )"), "does not parse"),
}


@pytest.mark.parametrize("case", sorted(_NOT_A_KERNEL))
def test_rebuilding_refuses_data_that_is_not_a_kernel_before_any_of_it_runs(case, tmp_path, monkeypatch):
    """What the learner's process sends is data it could forge: a definition with anything a definition
    evaluates (decorators, annotations, defaults) beyond @triton.jit and tl.constexpr, statements beside it,
    or a global bound to anything but a constant, triton.language or another sent function, never runs."""
    from course_lib.kernels.exercise import KernelSourceError, rebuild_kernel

    make, message = _NOT_A_KERNEL[case]
    mark = tmp_path / "ran"
    monkeypatch.setitem(__builtins__ if isinstance(__builtins__, dict) else vars(__builtins__), "MARK", str(mark))
    data = make(_exported_honest()[1])
    folder = tmp_path / "kernels"
    folder.mkdir()
    with pytest.raises(KernelSourceError, match=message):
        rebuild_kernel(data, folder)
    assert not mark.exists()


def test_forged_data_meets_the_kernel_rule_again_at_the_notebooks_line(tmp_path):
    """Data that skips the rule in the learner's process (a body that computes in PyTorch) is rebuilt, and
    its launch refuses it as a launch in the notebook would, naming the notebook's line."""
    from course_lib.kernels.exercise import KernelSourceError, rebuild_kernel

    _, data = _exported_honest()
    entry = data["functions"][0]
    forged = _edited(data, source=lambda s: s.replace("    tl.store(", "    torch.zeros(1)\n    tl.store(", 1))
    line = entry["line"] + next(i for i, t in enumerate(entry["source"].splitlines()) if "tl.store(" in t)
    with pytest.raises(KernelSourceError, match=rf"gemv_kernel, line {line}: `.zeros` is not an attribute of a Triton value"):
        launcher(rebuild_kernel(forged, tmp_path), "gemv")(torch.ones(4, 8), torch.ones(8), block_m=4, block_n=8)


def test_a_kernel_that_calls_or_copies_course_libs_kernel_scores_nothing(tmp_path):
    """course_lib's own kernels (``_gemv_kernel``, ...) called as a helper, or their source sent as a helper's:
    the first passed every check before, the second is what forged data would send (its module is gone)."""
    import ast
    import textwrap

    from course_lib.kernels import gemv
    from course_lib.kernels.exercise import KernelSourceError, rebuild_kernel

    path = tmp_path / "calls_course.py"
    path.write_text("import triton\nimport triton.language as tl\nfrom course_lib.kernels.gemv import _gemv_kernel\n\n\n"
                    "@triton.jit\ndef gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, "
                    "BLOCK_N: tl.constexpr):\n    _gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, 1, 1, BLOCK_M, BLOCK_N)\n")
    calls = _import_interpreted("kernel_calls_course", str(path)).gemv_kernel
    with pytest.raises(ContractError, match=r"gemv_kernel -> _gemv_kernel is course_lib's kernel "
                                            r"course_lib\.kernels\.gemv\._gemv_kernel; the exercise asks for your own"):
        lab01.check_gemv_kernel(calls)
    _, data = _exported_honest()
    text = open(gemv.__file__).read()          # the course's kernel as its file has it (a learner can read it)
    course = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == "_gemv_kernel")
    lines = text.splitlines(keepends=True)[course.decorator_list[0].lineno - 1:course.end_lineno]
    pasted = _edited(data, 1, name=course.name, line=course.decorator_list[0].lineno,
                     source=lambda _: textwrap.dedent("".join(lines)))
    with pytest.raises(KernelSourceError, match=r"gemv_kernel -> _tile is course_lib's kernel course_lib\.kernels\.gemv\._gemv_kernel "
                                                r"\(a copy of its source\)"):
        launcher(rebuild_kernel(pasted, tmp_path), "gemv")(torch.ones(4, 8), torch.ones(8), block_m=4, block_n=8)


def test_a_timed_launch_leaves_the_outputs_as_the_checked_launch_wrote_them(monkeypatch):
    """On a GPU the launcher times the kernel by launching it again: a kernel that accumulates into its output
    would change it, so the timing puts the checked output back (median_ms stands in for CUDA events here)."""
    from course_lib.kernels import timing
    from course_lib.kernels.exercise import SPEED_REPEATS, SPEED_WARMUP, time_launch

    y = torch.zeros(4)
    calls = []

    def median_ms(fn, warmup, repeats):
        calls.append((warmup, repeats))
        for _ in range(warmup + repeats):
            fn()
        return 0.5

    monkeypatch.setattr(timing, "median_ms", median_ms)
    seconds = time_launch(lambda: y.add_(1.0), {"y": (y, y)})
    assert seconds == 0.0005 and calls == [(SPEED_WARMUP, SPEED_REPEATS)] and y.tolist() == [0.0] * 4
