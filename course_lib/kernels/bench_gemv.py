"""Benchmark the Triton GEMV against torch's matmul: achieved GB/s and fraction of peak bandwidth.

Run: ``python -m course_lib.kernels.bench_gemv [--peak-gbps 3350] [--shapes 4096x4096,8192x8192]``.

On a CUDA device, for each shape and dtype (float32, bfloat16): check ``gemv`` against
``reference_gemv``, then time ``gemv`` and ``W @ x`` (warm-up, then the median of repeats timed
with CUDA events) and report

    achieved GB/s = bytes / median time, bytes = W (M*N*b) + x (N*b) + y (M * output bytes)

(a *measurement*) and its fraction of the device's peak memory bandwidth (a vendor *bound*).
GEMV's arithmetic intensity is ~2/b FLOP/byte, far below any ridge point, so bandwidth is the
roof that applies (see ``course_lib.kernels.gemv``). torch does not report the peak bandwidth,
so it comes from ``--peak-gbps`` or from a small table of vendor figures keyed by device name.

Without a CUDA device it says the kernel is checked for correctness only (by the tests under
TRITON_INTERPRET=1) and exits 0.
"""
from __future__ import annotations

import argparse
import sys

import torch

from .timing import median_ms

# Vendor HBM bandwidth in GB/s (decimal), longest key first so "H100 PCIe" wins over "H100".
PEAK_GBPS_BY_NAME = {
    "H100 PCIe": 2000.0,  # NVIDIA H100 datasheet, PCIe
    "H100 NVL": 3900.0,  # NVIDIA H100 datasheet, NVL
    "H100": 3350.0,  # NVIDIA H100 datasheet, SXM
    "H200": 4800.0,  # NVIDIA H200 datasheet
    "A100-SXM4-80GB": 2039.0,  # NVIDIA A100 datasheet
    "A100-PCIE-40GB": 1555.0,
    "A100": 1935.0,  # A100 80GB PCIe
    "L4": 300.0,
}


def peak_gbps_for(device_name: str) -> float | None:
    """Vendor peak bandwidth (GB/s) for a ``torch.cuda.get_device_name`` string, or None if unknown."""
    for key in sorted(PEAK_GBPS_BY_NAME, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_GBPS_BY_NAME[key]
    return None


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        m, n = item.lower().split("x")
        shapes.append((int(m), int(n)))
    return shapes


def measure_gemv(shapes, dtypes=(torch.float32, torch.bfloat16), *, block_m: int | None = None,
                 block_n: int | None = None, num_warps: int | None = None, warmup: int = 10, repeats: int = 50,
                 device: str = "cuda", timer=None):
    """Time ``gemv`` and torch's ``W @ x`` for each (M, N) in ``shapes`` and each dtype.

    Args:
        shapes: (M, N) pairs; dtypes: float32 and/or bfloat16.
        block_m, block_n, num_warps: the kernel's launch options (the module defaults when None).
        warmup, repeats: passed to :func:`median_ms`.
        device: where the tensors live ("cuda" for a measurement).
        timer: ``timer(fn) -> milliseconds``; default ``median_ms(fn, warmup, repeats)`` (CUDA events).
            Tests pass a stand-in to check the plumbing on a CPU; its numbers are not measurements.

    Yields:
        One dict per (shape, dtype, impl) with keys kernel ("gemv"), impl ("triton" or "torch"), shape
        ("MxN"), M, N, dtype (name), ms (median), bytes (W M*N*b + x N*b + y M*(4 for the kernel's
        float32 output, b for torch's)) and err (the kernel's max relative error against
        ``reference_gemv``; None on the torch row).
    """
    from .gemv import DEFAULT_BLOCK_M, DEFAULT_BLOCK_N, gemv, reference_gemv

    block_m = block_m or DEFAULT_BLOCK_M
    block_n = block_n or DEFAULT_BLOCK_N
    if timer is None:
        def timer(fn):
            return median_ms(fn, warmup, repeats)
    for M, N in shapes:
        for dtype in dtypes:
            g = torch.Generator(device=device).manual_seed(0)
            W = torch.randn(M, N, device=device, dtype=torch.float32, generator=g).to(dtype)
            x = torch.randn(N, device=device, dtype=torch.float32, generator=g).to(dtype)
            y = gemv(W, x, block_m=block_m, block_n=block_n, num_warps=num_warps)
            ref = reference_gemv(W, x)
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            b = W.element_size()
            impls = {
                "triton": (lambda: gemv(W, x, block_m=block_m, block_n=block_n, num_warps=num_warps), 4),
                "torch": (lambda: W @ x, b),  # torch returns y in the input dtype
            }
            for impl, (fn, y_bytes) in impls.items():
                yield dict(kernel="gemv", impl=impl, shape=f"{M}x{N}", M=M, N=N,
                           dtype=str(dtype).removeprefix("torch."), ms=timer(fn),
                           bytes=M * N * b + N * b + M * y_bytes, err=err if impl == "triton" else None)
            del W, x, y, ref


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="device peak memory bandwidth in GB/s (default: looked up by device name)")
    parser.add_argument("--shapes", default="4096x4096,8192x8192,16384x8192", help="MxN,MxN,...")
    parser.add_argument("--block-m", type=int, default=None)
    parser.add_argument("--block-n", type=int, default=None)
    parser.add_argument("--num-warps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)

    from . import triton_mode
    from .gemv import DEFAULT_BLOCK_M, DEFAULT_BLOCK_N

    mode = triton_mode()
    if mode != "native":
        print(f"No native Triton on a CUDA device here ({mode}: {mode.reason}).")
        print("The GEMV kernel is checked for correctness only (tests under TRITON_INTERPRET=1); "
              "no bandwidth is measured on CPU.")
        return 0

    name = torch.cuda.get_device_name(0)
    peak = args.peak_gbps if args.peak_gbps is not None else peak_gbps_for(name)
    block_m = args.block_m or DEFAULT_BLOCK_M
    block_n = args.block_n or DEFAULT_BLOCK_N
    print(f"device: {name}; peak bandwidth (vendor bound): "
          + (f"{peak:.0f} GB/s" if peak else "unknown (pass --peak-gbps)"))
    print(f"gemv blocks: block_m={block_m}, block_n={block_n}, num_warps={args.num_warps}; "
          f"median of {args.repeats} after {args.warmup} warm-up; GB/s are measurements")
    header = f"{'shape':>12} {'dtype':>8} {'impl':>7} {'ms':>9} {'GB/s':>8} {'of peak':>8}"
    print(header)
    print("-" * len(header))
    for row in measure_gemv(_parse_shapes(args.shapes), block_m=block_m, block_n=block_n,
                            num_warps=args.num_warps, warmup=args.warmup, repeats=args.repeats):
        gbps = row["bytes"] / (row["ms"] * 1e-3) / 1e9
        frac = f"{gbps / peak:8.1%}" if peak else f"{'n/a':>8}"
        print(f"{row['shape']:>12} {row['dtype']:>8} {row['impl']:>7} {row['ms']:9.4f} {gbps:8.0f} {frac}"
              + (f"   (max rel err vs reference {row['err']:.1e})" if row["impl"] == "triton" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
