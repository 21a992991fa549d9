"""Wall-clock timing shared by the course's measurements (benchmarks, speculative costs, batch sweeps,
the timing cells of Labs 1 and 2): one call timed by ``timed``; warm-up and repeats summarised by ``measure``."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .validation import integer

__all__ = ["Timing", "load_note", "measure", "timed"]


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """(fn(), its wall time in seconds): perf_counter around one call; on CUDA, synchronised
    before and after so that the time covers the kernels the call queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    value = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return value, time.perf_counter() - start


@dataclass(frozen=True)
class Timing:
    """A summary of repeated wall-clock measurements of one call, in seconds."""

    median_s: float
    min_s: float
    max_s: float
    repeats: int
    warmup: int

    def spread(self, unit: float = 1e-3, digits: int = 1) -> str:
        """'min-max' in ``unit`` seconds (default milliseconds), e.g. '25.3-27.9'."""
        return f"{self.min_s / unit:.{digits}f}-{self.max_s / unit:.{digits}f}"


def measure(fn: Callable[[], object], device: torch.device | str = "cpu", warmup: int = 3,
            repeats: int = 15) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times under ``timed``; the median,
    fastest and slowest call.

    Args:
        fn: a callable without arguments (its result is dropped).
        device: where ``fn`` runs (CUDA calls are synchronised around each one).
        warmup: an int >= 0. repeats: an int >= 1.

    Raises:
        ArgumentTypeError: warmup or repeats not an int. ValueError: warmup < 0 or repeats < 1.
    """
    warmup = integer("warmup", warmup, minimum=0)
    repeats = integer("repeats", repeats, minimum=1)
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    seconds = [timed(fn, device)[1] for _ in range(repeats)]
    return Timing(statistics.median(seconds), min(seconds), max(seconds), repeats, warmup)


def load_note() -> str:
    """The last line of a benchmark: the 1-minute load average and the core count, with a warning when
    other processes competed for the cores (load above cores + 0.5), which makes times unreliable."""
    load, cores = os.getloadavg()[0], os.cpu_count()
    return (f"load average (1 min) at the end: {load:.2f} on {cores} cores"
            + (" - other processes competed for the CPU, so the times are unreliable" if load > cores + 0.5 else ""))
