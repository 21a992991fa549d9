"""Timing on a CUDA device, for the kernel benchmarks and for a learner's kernel launched on a GPU.

Both figures follow the benchmarks' method (``docs/kernels.md``, "The command"): warm-up calls, then the
median of calls each timed with CUDA events, so one slow call (a clock change, another process) does not
move the figure.
"""
from __future__ import annotations

import statistics

import torch

__all__ = ["median_ms", "measure_copy_bandwidth"]


def median_ms(fn, warmup: int, repeats: int) -> float:
    """Median wall time of ``fn()`` on the current CUDA device, in milliseconds: ``warmup`` untimed
    calls, then ``repeats`` calls each timed with CUDA events (shared by the kernel benchmarks)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_copy_bandwidth(nbytes: int = 2 ** 30, warmup: int = 10, repeats: int = 50, device: str = "cuda",
                           timer=None) -> float:
    """Measured memory bandwidth in GB/s: 2 * nbytes / the median time of ``dst.copy_(src)`` for two
    ``nbytes`` buffers (each byte read once and written once), timed like the kernels
    (:func:`median_ms` unless ``timer``, ``timer(fn) -> milliseconds``, is given)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src)) if timer is not None else median_ms(lambda: dst.copy_(src), warmup, repeats)
    return 2 * nbytes / (ms * 1e-3) / 1e9
