"""Benchmark the Triton W4A16 matmul against a dense float16 matmul: achieved GB/s and fraction of peak bandwidth.

Run: ``python -m course_lib.kernels.bench_w4a16 [--peak-gbps 4800] [--shapes 4096x4096,14336x4096]
[--m 1,16] [--group-size 128] [--zero-point]``.

On a CUDA device, for each weight shape N x K (out_features x in_features) and each number of
activation rows M: build random int4 codes (``course_lib.quant.packing.pack_int4``), float16
group scales (and zero points with ``--zero-point``) and float16 activations; check
``w4a16_matmul`` against ``reference_w4a16`` (a row that disagrees is reported and not timed);
then time ``w4a16_matmul`` and the dense ``x @ W16^T`` on the same dequantised weights in
float16 (warm-up, then the median of repeats timed with CUDA events) and report

    achieved GB/s = bytes / median time
    bytes (w4a16) = packed weights N*ceil(K/2) + scales (+ zero points) N*(K/g)*2
                    + activations M*K*2 + output M*N*4 (float32)
    bytes (dense) = weights N*K*2 + activations M*K*2 + output M*N*2

(a *measurement*) and its fraction of the device's peak memory bandwidth (a vendor *bound*,
from ``course_lib.hardware.DEVICES`` by device name, or ``--peak-gbps``). With few rows M the
product is memory-bound (``docs/roofline.md``), so the time that matters is bytes / bandwidth,
and the packed weights move about 3.8x fewer bytes than float16 ones
(``docs/quantization.md#bits-per-weight``).

Without a CUDA device it says that nothing is measured: the kernel is then checked for
correctness only (the tests under TRITON_INTERPRET=1), and interpreter timings are not speed
measurements. It exits 0.
"""
from __future__ import annotations

import argparse
import sys

import torch

from ..hardware import DEVICES, Device


def device_for(device_name: str) -> Device | None:
    """The ``course_lib.hardware.DEVICES`` entry whose name occurs in a
    ``torch.cuda.get_device_name`` string (case-insensitive, longest name first), or None."""
    for key in sorted(DEVICES, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return DEVICES[key]
    return None


def peak_bandwidth(device_name: str, peak_gbps: float | None) -> tuple[float | None, str | None]:
    """(peak bandwidth in GB/s, where it comes from) for a benchmark's fraction-of-peak column: ``peak_gbps``
    when given (the --peak-gbps option), else the vendor bound of the ``device_for`` entry, else (None, None)."""
    if peak_gbps is not None:
        return peak_gbps, "--peak-gbps"
    device = device_for(device_name)
    if device is not None:
        return device.bandwidth / 1e9, f"course_lib.hardware {device.name!r}: {device.source}"
    return None, None


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """"576x576,1536x576" -> [(576, 576), (1536, 576)]: the --shapes option of the kernel benchmarks."""
    pairs = []
    for item in text.split(","):
        n, k = item.lower().split("x")
        pairs.append((int(n), int(k)))
    return pairs


def measure_w4a16(shapes, ms=(1, 16), *, group_size: int = 128, zero_point: bool = False,
                  blocks: dict | None = None, warmup: int = 10, repeats: int = 50, device: str = "cuda",
                  timer=None):
    """Time ``w4a16_matmul`` and the dense float16 ``x @ W16^T`` for each weight shape (N, K) and row count M.

    Args:
        shapes: (N, K) pairs (out_features x in_features); ms: activation row counts M.
        group_size, zero_point: the int4 format (signed codes, or unsigned ones with zero points).
        blocks: ``w4a16_matmul``'s block_m / block_n / block_k / num_warps (the module defaults when None).
        warmup, repeats: passed to ``timing.median_ms``.
        device: where the tensors live ("cuda" for a measurement).
        timer: ``timer(fn) -> milliseconds``; default ``median_ms(fn, warmup, repeats)`` (CUDA events).
            Tests pass a stand-in to check the plumbing on a CPU; its numbers are not measurements.

    Yields:
        One dict per row with keys kernel ("w4a16"), impl ("w4a16" or "fp16"), shape ("NxK"), N, K, M,
        dtype ("float16" activations), ms, bytes (the module docstring's formulas), err (the kernel's max
        relative error against ``reference_w4a16``) and note: None for a timed row; for a shape whose K
        the group size does not divide, or a kernel that disagrees with the reference (relative error
        above 1e-4), one row with the reason in note and ms None (not timed).
    """
    from ..quant.packing import pack_int4
    from .timing import median_ms
    from .w4a16 import DEFAULT_BLOCK_K, DEFAULT_BLOCK_M, DEFAULT_BLOCK_N, reference_w4a16, w4a16_matmul

    blocks = dict(blocks or {})
    blocks = dict(block_m=blocks.get("block_m") or DEFAULT_BLOCK_M, block_n=blocks.get("block_n") or DEFAULT_BLOCK_N,
                  block_k=blocks.get("block_k") or DEFAULT_BLOCK_K, num_warps=blocks.get("num_warps"))
    if timer is None:
        def timer(fn):
            return median_ms(fn, warmup, repeats)
    g = group_size
    for N, K in shapes:
        base = dict(kernel="w4a16", shape=f"{N}x{K}", N=N, K=K, dtype="float16")
        if K % g:
            yield dict(base, impl="w4a16", M=None, ms=None, bytes=None, err=None,
                       note=f"skipped: group size {g} does not divide K={K}")
            continue
        gen = torch.Generator(device=device).manual_seed(0)
        if zero_point:
            q = torch.randint(0, 16, (N, K), device=device, generator=gen)
            zeros = torch.randint(0, 16, (N, K // g), device=device, generator=gen).to(torch.float16)
        else:
            q = torch.randint(-8, 8, (N, K), device=device, generator=gen)
            zeros = None
        scales = (torch.rand(N, K // g, device=device, generator=gen) * 0.02 + 1e-3).to(torch.float16)
        packed = pack_int4(q, signed=zeros is None)
        z = 0 if zeros is None else zeros.float().repeat_interleave(g, dim=1)
        w16 = ((q.float() - z) * scales.float().repeat_interleave(g, dim=1)).to(torch.float16)
        del q
        meta_bytes = scales.numel() * 2 * (1 if zeros is None else 2)
        for M in ms:
            x = torch.randn(M, K, device=device, generator=gen).to(torch.float16)
            y = w4a16_matmul(x, packed, scales, g, zeros, **blocks)
            ref = reference_w4a16(x, packed, scales, g, zeros)
            err = ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            if not err <= 1e-4:
                yield dict(base, impl="w4a16", M=M, ms=None, bytes=None, err=err,
                           note=f"MISMATCH: max rel err vs reference {err:.1e}; not timed")
                continue
            impls = {
                "w4a16": (lambda: w4a16_matmul(x, packed, scales, g, zeros, **blocks),
                          packed.numel() + meta_bytes + M * K * 2 + M * N * 4),
                "fp16": (lambda: x @ w16.T, N * K * 2 + M * K * 2 + M * N * 2),
            }
            for impl, (fn, nbytes) in impls.items():
                yield dict(base, impl=impl, M=M, ms=timer(fn), bytes=nbytes,
                           err=err if impl == "w4a16" else None, note=None)
            del x, y, ref
        del packed, scales, zeros, w16


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="device peak memory bandwidth in GB/s (default: course_lib.hardware by device name)")
    parser.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336",
                        help="weight shapes NxK (out_features x in_features), comma-separated")
    parser.add_argument("--m", default="1,16", help="activation rows M (tokens), comma-separated")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--zero-point", action="store_true", help="unsigned codes with zero points")
    parser.add_argument("--block-m", type=int, default=None)
    parser.add_argument("--block-n", type=int, default=None)
    parser.add_argument("--block-k", type=int, default=None)
    parser.add_argument("--num-warps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)

    from . import triton_mode
    from .w4a16 import DEFAULT_BLOCK_K, DEFAULT_BLOCK_M, DEFAULT_BLOCK_N

    mode = triton_mode()
    if mode != "native":
        print(f"No native Triton on a CUDA device here ({mode}: {mode.reason}).")
        print("Nothing is measured: the W4A16 kernel is checked for correctness only (tests under "
              "TRITON_INTERPRET=1), and interpreter timings are not a speed measurement.")
        return 0

    name = torch.cuda.get_device_name(0)
    peak, peak_source = peak_bandwidth(name, args.peak_gbps)
    blocks = dict(block_m=args.block_m or DEFAULT_BLOCK_M, block_n=args.block_n or DEFAULT_BLOCK_N,
                  block_k=args.block_k or DEFAULT_BLOCK_K, num_warps=args.num_warps)
    g = args.group_size
    print(f"device: {name}; peak bandwidth (vendor bound): "
          + (f"{peak:.0f} GB/s ({peak_source})" if peak else "unknown (pass --peak-gbps)"))
    print(f"w4a16: int4 {'+zero point ' if args.zero_point else ''}g{g}, fp16 scales, fp16 activations; "
          f"blocks {blocks}; median of {args.repeats} after {args.warmup} warm-up; GB/s are measurements")
    header = f"{'N x K':>12} {'M':>4} {'impl':>7} {'ms':>9} {'GB/s':>8} {'of peak':>8}"
    print(header)
    print("-" * len(header))
    rows = measure_w4a16(parse_pairs(args.shapes), [int(m) for m in args.m.split(",")], group_size=g,
                         zero_point=args.zero_point, blocks=blocks, warmup=args.warmup, repeats=args.repeats)
    for row in rows:
        if row["note"] is not None:
            m = "" if row["M"] is None else f"{row['M']:>4} "
            print(f"{row['shape']:>12} {m} {row['note']}")
            continue
        gbps = row["bytes"] / (row["ms"] * 1e-3) / 1e9
        frac = f"{gbps / peak:8.1%}" if peak else f"{'n/a':>8}"
        print(f"{row['shape']:>12} {row['M']:>4} {row['impl']:>7} {row['ms']:9.4f} {gbps:8.0f} {frac}"
              + (f"   (max rel err vs reference {row['err']:.1e})" if row["impl"] == "w4a16" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
