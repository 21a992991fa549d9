"""One benchmark for every Triton kernel of the course: ``python -m course_lib.kernels.bench``.

Run: ``python -m course_lib.kernels.bench [--kernels gemv,w4a16,paged_attention,batch_invariant_matmul]
[--peak-gbps 4800] [--peak-tflops 989] [--warmup 10] [--repeats 50]``.

It covers the four kernels listed in :data:`KERNELS` and measures each with its own benchmark module's
``measure_*`` function (``bench_gemv``, ``bench_w4a16``, ``bench_paged_attention``,
``bench_batch_invariant``: each checks the kernel against its PyTorch reference before timing, warms
up, and takes the median of repeats timed with CUDA events), at a few engine-like shapes each, beside
the PyTorch operation it replaces. It prints one table with the columns

    kernel | shape | dtype | median (us) | achieved | fraction of peak

where *achieved* is a measurement: GB/s = bytes / median time for the memory-bound kernels (GEMV,
W4A16 GEMV, paged-attention decode; the bytes are each module's formula), and TFLOP/s = 2 M N K /
median time for the batch-invariant matmul. *Fraction of peak* divides it by a vendor *bound*: the
peak memory bandwidth from ``bench_gemv.peak_gbps_for`` (by device name, or ``--peak-gbps``), and
for the matmul the dense 16-bit tensor throughput of ``course_lib.hardware.DEVICES`` (or
``--peak-tflops``; not applicable to float32 inputs). The targets the course sets
(``docs/kernels.md#targets``, :data:`TARGETS`): the paged-attention decode and the W4A16 GEMV at
75 % or more of the *measured* HBM bandwidth, which the command also measures, as the median of a
device-to-device copy of 1 GiB (bytes = 2 x the size: each byte is read once and written once;
:func:`measure_copy_bandwidth`), and after the table it says at how many shapes each target is met.

Without a CUDA device (or without native Triton) it prints the kernels it covers, says that no GPU
is present and no GPU figure was measured (the kernels are then checked for correctness only, by the
interpreter tests), and exits 0: it never prints a number it did not measure. It exits 1 when a
kernel disagrees with its reference or a benchmark fails, after printing the rest of the table.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass

import torch

from .timing import measure_copy_bandwidth

__all__ = ["Kernel", "KERNELS", "TARGETS", "COLUMNS", "table_rows", "format_table", "target_lines",
           "measure_copy_bandwidth", "main"]


@dataclass(frozen=True)
class Kernel:
    """One Triton kernel of the course, as the benchmark covers it.

    Attributes:
        name: the key used by ``--kernels`` and in the table.
        module: the kernel's module; function: its public entry point there.
        bench: the benchmark module whose ``measure_*`` generator times it (and which has its own CLI).
        what: one line on what it computes; lab: where the course introduces it.
        roof: "bandwidth" (achieved GB/s) or "compute" (achieved TFLOP/s).
        test: the test file that checks it under Triton's interpreter.
    """

    name: str
    module: str
    function: str
    bench: str
    what: str
    lab: str
    roof: str
    test: str


KERNELS: tuple[Kernel, ...] = (
    Kernel("gemv", "course_lib.kernels.gemv", "gemv", "course_lib.kernels.bench_gemv",
           "y = W x, float32 accumulation", "Lab 1", "bandwidth", "tests/test_kernels_gemv.py"),
    Kernel("w4a16", "course_lib.kernels.w4a16", "w4a16_matmul", "course_lib.kernels.bench_w4a16",
           "y = x W_hat^T with packed int4 weights dequantised in registers", "Lab 4", "bandwidth",
           "tests/test_kernels_w4a16.py"),
    Kernel("paged_attention", "course_lib.kernels.paged_attention", "paged_decode_attention",
           "course_lib.kernels.bench_paged_attention", "decode attention over a paged KV cache (GQA, online softmax)",
           "the serving engine", "bandwidth", "tests/test_kernels_paged_attention.py"),
    Kernel("batch_invariant_matmul", "course_lib.kernels.batch_invariant.triton_ops", "matmul",
           "course_lib.kernels.bench_batch_invariant", "y = x W^T with a fixed reduction order (no split-K)",
           "Lab 6", "compute", "tests/test_kernels_batch_invariant.py"),
)

#: Fraction of the measured HBM bandwidth (device copy) each memory-bound kernel should reach (docs/kernels.md#targets).
TARGETS = {"paged_attention": 0.75, "w4a16": 0.75}

#: The table's columns, in order.
COLUMNS = ("kernel", "shape", "dtype", "median (us)", "achieved", "fraction of peak")

# Shapes of the combined run: a few of each benchmark's own defaults (their CLIs take more).
_GEMV_SHAPES = ((4096, 4096), (8192, 8192))
_W4A16_SHAPES, _W4A16_MS = ((4096, 4096), (14336, 4096)), (1, 16)
_BATCH_INVARIANT_MS = (1, 16)
_IMPL_LABEL = {"triton": "triton", "w4a16": "triton", "torch": "torch", "fp16": "torch fp16",
               "cublas": "torch cuBLAS"}


def table_rows(rows, peak_gbps: float | None, peak_tflops: float | None) -> list[dict]:
    """The table's rows (dicts keyed by :data:`COLUMNS`, values formatted as text) from ``measure_*`` rows.

    Timed rows only (``ms`` not None). Bandwidth kernels: achieved = bytes / ms in GB/s, fraction of
    ``peak_gbps``; the batch-invariant matmul: achieved = flops / ms in TFLOP/s, fraction of
    ``peak_tflops`` (16-bit inputs only: a 16-bit tensor-core peak says nothing of float32). An
    unknown peak gives "n/a"."""
    roofs = {k.name: k.roof for k in KERNELS}
    table = []
    for row in rows:
        if row.get("ms") is None:
            continue
        seconds = row["ms"] * 1e-3
        shape = row["shape"]
        if row["kernel"] in ("w4a16", "batch_invariant_matmul"):
            shape = f"M={row['M']} NxK={shape}"
        if roofs[row["kernel"]] == "compute":
            tflops = row["flops"] / seconds / 1e12
            achieved = f"{tflops:.3f} TFLOP/s"
            peak = peak_tflops if row["dtype"] in ("bfloat16", "float16") else None
            frac = f"{tflops / peak:.1%}" if peak else "n/a"
        else:
            gbps = row["bytes"] / seconds / 1e9
            achieved = f"{gbps:.0f} GB/s"
            frac = f"{gbps / peak_gbps:.1%}" if peak_gbps else "n/a"
        table.append({"kernel": f"{row['kernel']} ({_IMPL_LABEL.get(row['impl'], row['impl'])})", "shape": shape,
                      "dtype": row["dtype"], "median (us)": f"{row['ms'] * 1e3:.1f}", "achieved": achieved,
                      "fraction of peak": frac})
    return table


def format_table(table: list[dict]) -> str:
    """A plain text table of ``table_rows`` output: a header, a rule, one aligned line per row
    (text columns left-aligned, numbers right-aligned)."""
    right = {"median (us)", "achieved", "fraction of peak"}
    widths = {c: max([len(c)] + [len(r[c]) for r in table]) for c in COLUMNS}

    def line(values):
        return "  ".join(v.rjust(widths[c]) if c in right else v.ljust(widths[c]) for c, v in zip(COLUMNS, values))

    out = [line(COLUMNS), "  ".join("-" * widths[c] for c in COLUMNS)]
    out += [line([r[c] for c in COLUMNS]) for r in table]
    return "\n".join(out)


def target_lines(rows, copy_gbps: float | None) -> list[str]:
    """One line per kernel of :data:`TARGETS` with timed Triton rows: its fraction of the measured copy
    bandwidth ``copy_gbps`` at its worst and best shape, and at how many shapes it meets the target."""
    lines = []
    for name, target in TARGETS.items():
        fracs = [(row["bytes"] / (row["ms"] * 1e-3) / 1e9 / copy_gbps, row["shape"]) for row in rows
                 if row["kernel"] == name and row["impl"] in ("triton", "w4a16") and row.get("ms") is not None
                 and copy_gbps]
        if not fracs:
            continue
        met = sum(f >= target for f, _ in fracs)
        (lo, lo_shape), (hi, hi_shape) = min(fracs), max(fracs)
        lines.append(f"target {name} >= {target:.0%} of the measured copy bandwidth: met at {met} of {len(fracs)} "
                     f"shapes (worst {lo:.1%} at {lo_shape}, best {hi:.1%} at {hi_shape})")
    return lines


def _print_kernels(selected) -> None:
    print("Kernels covered (each beside a PyTorch reference with the same signature):")
    width = max(len(k.name) for k in selected)
    for k in selected:
        print(f"  {k.name:<{width}}  {k.module}.{k.function}: {k.what} ({k.lab}); "
              f"roof: {k.roof}; own CLI: python -m {k.bench}")


def _measure(kernel: Kernel, warmup: int, repeats: int):
    """The ``measure_*`` generator of one kernel at the combined run's shapes (CUDA)."""
    if kernel.name == "gemv":
        from .bench_gemv import measure_gemv
        return measure_gemv(_GEMV_SHAPES, warmup=warmup, repeats=repeats)
    if kernel.name == "w4a16":
        from .bench_w4a16 import measure_w4a16
        return measure_w4a16(_W4A16_SHAPES, _W4A16_MS, warmup=warmup, repeats=repeats)
    if kernel.name == "paged_attention":
        from .bench_paged_attention import measure_paged_attention
        return measure_paged_attention(warmup=warmup, repeats=repeats)
    if kernel.name == "batch_invariant_matmul":
        from .bench_batch_invariant import DEFAULT_SHAPES, measure_batch_invariant
        from .bench_w4a16 import parse_pairs
        return measure_batch_invariant(parse_pairs(DEFAULT_SHAPES), _BATCH_INVARIANT_MS, warmup=warmup,
                                       repeats=repeats)
    raise ValueError(f"no benchmark for kernel {kernel.name!r}")


def _kernel_interpreted() -> bool:
    """True when any kernel module was built by Triton's interpreter in this process."""
    from . import gemv, paged_attention, w4a16
    from .batch_invariant import triton_ops

    return any(m.KERNEL_INTERPRETED for m in (gemv, w4a16, paged_attention, triton_ops))


def main(argv: list[str] | None = None) -> int:
    names = [k.name for k in KERNELS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(names), help=f"comma-separated subset of {', '.join(names)}")
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="device peak memory bandwidth in GB/s (default: bench_gemv's vendor table by device name)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="device dense 16-bit peak in TFLOP/s (default: course_lib.hardware by device name)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    wanted = [n.strip() for n in args.kernels.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        parser.error(f"unknown kernel(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    selected = [k for k in KERNELS if k.name in wanted]

    from . import triton_mode

    _print_kernels(selected)
    mode = triton_mode()
    if mode != "native" or _kernel_interpreted():
        if not torch.cuda.is_available():
            print(f"No GPU: no CUDA device is present here ({mode}: {mode.reason}).")
        else:
            print(f"No native Triton here: a CUDA device is present, but the kernels do not run compiled in this "
                  f"process ({mode}: {mode.reason}; or TRITON_INTERPRET=1 was set when they were imported).")
        print("The kernels are checked for correctness only, by the interpreter tests (TRITON_INTERPRET=1): "
              + ", ".join(k.test for k in selected) + ".")
        print("No GPU figure was measured: nothing was timed, so no median, bandwidth, throughput or "
              "fraction of peak is printed.")
        return 0

    from .bench_gemv import peak_gbps_for
    from .bench_w4a16 import device_for

    name = torch.cuda.get_device_name(0)
    peak_gbps = args.peak_gbps if args.peak_gbps is not None else peak_gbps_for(name)
    if args.peak_tflops is not None:
        peak_tflops = args.peak_tflops
    else:
        device = device_for(name)
        peak_tflops = device.peak_flops / 1e12 if device is not None else None
    print(f"device: {name}; peak bandwidth (vendor bound): "
          + (f"{peak_gbps:.0f} GB/s" if peak_gbps else "unknown (pass --peak-gbps)")
          + "; dense 16-bit peak (vendor bound): "
          + (f"{peak_tflops:.0f} TFLOP/s" if peak_tflops else "unknown (pass --peak-tflops)"))
    print(f"median of {args.repeats} after {args.warmup} warm-up, CUDA events; 'achieved' is a measurement, "
          "'fraction of peak' divides it by the vendor bound")
    copy_gbps = measure_copy_bandwidth(warmup=args.warmup, repeats=args.repeats)
    print(f"measured HBM bandwidth (device copy of 1 GiB, read + write): {copy_gbps:.0f} GB/s"
          + (f" = {copy_gbps / peak_gbps:.1%} of the vendor peak" if peak_gbps else ""))
    rows, problems = [], []
    for kernel in selected:
        try:
            for row in _measure(kernel, args.warmup, args.repeats):
                rows.append(row)
                if row.get("note"):
                    problems.append(f"{kernel.name} {row['shape']}: {row['note']}")
        except Exception as exc:  # report it, measure the other kernels, exit 1
            problems.append(f"{kernel.name}: benchmark failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    print(format_table(table_rows(rows, peak_gbps, peak_tflops)))
    for line in target_lines(rows, copy_gbps) + problems:
        print(line)
    failed = [p for p in problems if "MISMATCH" in p or "benchmark failed" in p]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
