"""Tests of ``python -m course_lib.kernels.bench``, the one benchmark of every Triton kernel.

On a machine without a CUDA device the command must say so, name the four kernels it covers, print
no figure and exit 0. The table code and each benchmark module's ``measure_*`` generator are checked
on the CPU with a stand-in timer (a constant "median"), whose numbers are plumbing, not measurements:
the kernels then answer through their PyTorch fallbacks (or the interpreter), which only proves that
the rows carry the right shapes, bytes and FLOPs to the table.
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.kernels import triton_mode
from course_lib.kernels.bench import (
    COLUMNS,
    KERNELS,
    TARGETS,
    format_table,
    measure_copy_bandwidth,
    table_rows,
    target_lines,
)
from course_lib.kernels.bench_batch_invariant import measure_batch_invariant
from course_lib.kernels.bench_gemv import measure_gemv
from course_lib.kernels.bench_paged_attention import measure_paged_attention, parse_heads
from course_lib.kernels.bench_w4a16 import measure_w4a16

REPO_ROOT = Path(__file__).resolve().parents[1]
MODE = triton_mode()
FOUR = ("gemv", "w4a16", "paged_attention", "batch_invariant_matmul")
# A figure: a number followed by a unit of time, bandwidth or throughput, or a percentage.
FIGURE = re.compile(r"\d\s*(GB/s|TFLOP/s|us\b|ms\b|%)")


def test_the_four_kernels_are_covered():
    assert tuple(k.name for k in KERNELS) == FOUR
    for k in KERNELS:
        assert callable(getattr(importlib.import_module(k.module), k.function)), k
        bench = importlib.import_module(k.bench)
        assert callable(bench.main) and any(n.startswith("measure_") for n in dir(bench)), k
        assert (REPO_ROOT / k.test).is_file(), k
        assert k.roof in ("bandwidth", "compute")


def test_bench_command_without_a_gpu():
    if MODE == "native":
        pytest.skip("a CUDA device is present: the benchmark would measure")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "course_lib.kernels.bench"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No GPU: no CUDA device is present" in out
    assert "checked for correctness only, by the interpreter tests" in out
    assert "No GPU figure was measured" in out
    for name in FOUR:
        assert re.search(rf"^\s+{name}\s", out, re.M), f"{name} not listed:\n{out}"
    assert not FIGURE.search(out), f"a figure was printed without a GPU:\n{out}"


def test_unknown_kernel_is_refused():
    from course_lib.kernels.bench import main

    with pytest.raises(SystemExit):
        main(["--kernels", "gemv,nope"])


def test_table_rows_formulas():
    rows = [
        dict(kernel="gemv", impl="triton", shape="4096x4096", dtype="bfloat16", ms=0.02, bytes=40_000_000),
        dict(kernel="w4a16", impl="fp16", shape="4096x4096", M=16, dtype="float16", ms=0.01, bytes=20_000_000),
        dict(kernel="paged_attention", impl="triton", shape="B=8 L=1024 9/3/64 bs16", dtype="bfloat16", ms=0.5,
             bytes=1_000_000_000),
        dict(kernel="batch_invariant_matmul", impl="cublas", shape="576x576", M=16, dtype="bfloat16", ms=0.001,
             flops=2 * 16 * 576 * 576, bytes=1),
        dict(kernel="batch_invariant_matmul", impl="triton", shape="576x576", M=16, dtype="float32", ms=0.001,
             flops=2 * 16 * 576 * 576, bytes=1),
        dict(kernel="w4a16", impl="w4a16", shape="4096x4100", M=None, dtype="float16", ms=None, bytes=None,
             note="skipped"),
    ]
    table = table_rows(rows, peak_gbps=4000.0, peak_tflops=989.0)
    assert [tuple(r) for r in table] == [COLUMNS] * 5        # the untimed row is left out
    assert table[0] == {"kernel": "gemv (triton)", "shape": "4096x4096", "dtype": "bfloat16", "median (us)": "20.0",
                        "achieved": "2000 GB/s", "fraction of peak": "50.0%"}
    assert table[1]["kernel"] == "w4a16 (torch fp16)" and table[1]["shape"] == "M=16 NxK=4096x4096"
    assert table[2]["achieved"] == "2000 GB/s" and table[2]["median (us)"] == "500.0"
    assert table[3]["kernel"] == "batch_invariant_matmul (torch cuBLAS)"
    assert table[3]["achieved"] == "10.617 TFLOP/s" and table[3]["fraction of peak"] == "1.1%"
    assert table[4]["fraction of peak"] == "n/a"             # a 16-bit peak says nothing of float32
    assert table_rows(rows[:1], None, None)[0]["fraction of peak"] == "n/a"
    text = format_table(table).splitlines()
    assert text[0].split("  ")[0].strip() == "kernel" and len(text) == 7
    assert len({len(line) for line in text}) == 1            # aligned


def test_measure_generators_feed_the_table():
    """Every benchmark module's rows reach the table (stand-in timer on the CPU: plumbing, not a measurement)."""

    def timer(fn):
        fn()
        return 1.0

    rows = [
        *measure_gemv([(8, 16)], device="cpu", timer=timer),
        *measure_w4a16([(8, 32), (8, 30)], [1, 3], group_size=16, device="cpu", timer=timer),
        *measure_paged_attention([1, 2], [17], [(4, 2, 8)], block_size=4, device="cpu", timer=timer),
        *measure_batch_invariant([(8, 32)], [1, 3], device="cpu", timer=timer),
    ]
    assert {r["kernel"] for r in rows} == set(FOUR)
    assert all(r["err"] is None or r["err"] <= 1e-2 for r in rows)
    gemv32 = next(r for r in rows if r["kernel"] == "gemv" and r["impl"] == "triton" and r["dtype"] == "float32")
    assert gemv32["bytes"] == 8 * 16 * 4 + 16 * 4 + 8 * 4
    paged = next(r for r in rows if r["kernel"] == "paged_attention" and r["B"] == 2)
    assert paged["bytes"] == 2 * 2 * 17 * 2 * 8 * 2 + 2 * 2 * 4 * 8 * 2 and paged["flops"] == 4 * 2 * 17 * 4 * 8
    assert any(r["kernel"] == "w4a16" and r["note"] and "does not divide" in r["note"] for r in rows)
    bi = next(r for r in rows if r["kernel"] == "batch_invariant_matmul" and r["M"] == 3)
    assert bi["flops"] == 2 * 3 * 8 * 32 and bi["invariant"] is True
    table = table_rows(rows, peak_gbps=1000.0, peak_tflops=100.0)
    assert {r["kernel"].split(" ")[0] for r in table} == set(FOUR)
    assert len(table) == sum(r["ms"] is not None for r in rows)


def test_target_lines():
    assert TARGETS == {"paged_attention": 0.75, "w4a16": 0.75}
    rows = [dict(kernel="paged_attention", impl="triton", shape=f"B={b}", ms=1.0, bytes=b * 1_000_000)
            for b in (500, 800, 3000)]
    rows += [dict(kernel="paged_attention", impl="torch", shape="B=1", ms=1.0, bytes=10 ** 12),
             dict(kernel="w4a16", impl="w4a16", shape="4096x4096", M=1, ms=None, bytes=None, note="MISMATCH")]
    assert target_lines(rows, copy_gbps=1000.0) == [
        "target paged_attention >= 75% of the measured copy bandwidth: met at 2 of 3 shapes "
        "(worst 50.0% at B=500, best 300.0% at B=3000)"]
    assert target_lines(rows, copy_gbps=None) == []


def test_copy_bandwidth_formula():
    """2 bytes moved per byte copied (stand-in timer on the CPU: plumbing, not a measurement)."""
    gbps = measure_copy_bandwidth(10 ** 6, device="cpu", timer=lambda fn: (fn(), 1.0)[1])   # 2 MB in 1 ms
    assert abs(gbps - 2.0) < 1e-12


def test_paged_bench_heads_option():
    assert parse_heads("9/3/64,32/8/128") == [(9, 3, 64), (32, 8, 128)]


def test_paged_bench_measures_nothing_without_a_gpu(capsys):
    if MODE == "native":
        pytest.skip("a CUDA device is present: the benchmark would measure")
    from course_lib.kernels.bench_paged_attention import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "Nothing is measured" in out and not FIGURE.search(out)


def test_the_gemv_bench_still_runs_without_a_gpu(capsys):
    if MODE == "native":
        pytest.skip("a CUDA device is present: the benchmark would measure")
    from course_lib.kernels.bench_gemv import main

    assert main([]) == 0
    assert "no bandwidth is measured" in capsys.readouterr().out


def test_measure_defaults_time_on_cuda():
    """The stand-in timer and CPU tensors are for tests: by default every measure_* generator builds its
    tensors on CUDA and times with CUDA events (timer None -> timing.median_ms)."""
    import inspect

    for fn in (measure_gemv, measure_w4a16, measure_paged_attention, measure_batch_invariant):
        assert inspect.signature(fn).parameters["device"].default == "cuda"
        assert inspect.signature(fn).parameters["timer"].default is None
