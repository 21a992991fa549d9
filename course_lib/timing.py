"""Wall-clock timing shared by the course's measurements (speculative costs, batch sweeps)."""
from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["timed"]


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
