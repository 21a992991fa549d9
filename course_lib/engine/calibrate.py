"""Lab 3's simulator against the real engine: fit the cost model to measured iterations, then compare.

1. ``engine_trace``: a small seeded trace for this CPU (Poisson arrivals, prompts cut from the course's
   text); Lab 3's workload (prompts of 2,000-6,000 tokens) is sized for a GPU.
2. ``fit_device``: the Lab 3 cost model prices an iteration as max(bytes / bandwidth, FLOPs / compute)
   (``scheduling.cost``; Orca-style iteration-level batching, Williams et al.'s roofline). From the
   engine's measured iterations (each ``StepReport`` gives its chunks and its wall time) it fits the two
   rates by least squares on log time, over a grid of 10 ** (1/40) steps: the relative error counts
   the same for a 30 ms decode and a 1 s prefill.
3. ``compare``: the same policy (the chunked step with the engine's budget, max_running and KV budget)
   serves a second trace in the simulator (``scheduling.run_with_step``) with the fitted device, and in
   the engine; the table gives TTFT, ITL and E2E percentiles of both and the simulator's error.

What the cost model leaves out on this CPU (``docs/engine.md``): a fixed cost per iteration (Python
scheduling and bookkeeping, plus thirty layers of small kernels); the growth of
a decode step with the batch even while the weights' bytes dominate (matrix products of a few rows
are not bandwidth-bound here); the extra traffic of gathering blocks for attention.
"""
from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, field, replace
from typing import Sequence as Seq

import numpy as np
import pandas as pd

from ..hardware import Device
from ..scheduling.cost import Deployment, iteration_work
from ..scheduling.metrics import metrics
from ..scheduling.reference import run_with_step
from ..scheduling.workload import Request, RequestRecord
from ..validation import integer, positive_integer, positive_number
from .engine import Engine, StepReport, TraceRequest

__all__ = ["engine_trace", "iteration_totals", "fit_device", "Fit", "simulate_engine_policy", "compare",
           "COMPARED"]

#: The metrics the comparison table shows, in order (keys of ``scheduling.metrics``).
COMPARED: tuple[str, ...] = ("ttft50", "ttft99", "itl50", "itl99", "e2e50", "throughput")


def engine_trace(token_ids: Seq[int], count: int = 40, rate: float = 2.0, seed: int = 0,
                 prompt_range: tuple[int, int] = (16, 128), output_range: tuple[int, int] = (8, 48)) -> list[TraceRequest]:
    """A seeded open-loop trace for the engine on a CPU.

    For each request, in order, from ``random.Random(seed)``: arrival += expovariate(rate); prompt length
    uniform in ``prompt_range``, its ids a window of ``token_ids`` at a uniform offset; output length
    uniform in ``output_range`` (inclusive).

    Args: token_ids: a long token sequence (the tokenized text). count: requests (>= 1). rate: requests/s.
    Raises: TypeError for a range that is not a pair; ValueError for a count < 1, a rate that is not
    positive, ranges that are not 1 <= lo <= hi, or a text shorter than the longest prompt."""
    count = positive_integer("count", count)
    rate = positive_number("rate", rate, note="requests/s")
    seed = integer("seed", seed)
    for name, pair in (("prompt_range", prompt_range), ("output_range", output_range)):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Seq) or len(pair) != 2:
            raise TypeError(f"{name} must be a pair (lo, hi) of ints, got {pair!r}")
        lo, hi = pair
        if not (positive_integer(f"{name}[0]", lo) <= integer(f"{name}[1]", hi)):
            raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
    ids = list(token_ids)
    if len(ids) < prompt_range[1]:
        raise ValueError(f"token_ids holds {len(ids)} tokens; prompts of up to {prompt_range[1]} need more")
    rng = random.Random(seed)
    arrival, trace = 0.0, []
    for _ in range(count):
        arrival += rng.expovariate(rate)
        n = rng.randint(*prompt_range)
        start = rng.randint(0, len(ids) - n)
        trace.append(TraceRequest(arrival, ids[start:start + n], rng.randint(*output_range)))
    return trace


def iteration_totals(history: Seq[StepReport]) -> np.ndarray:
    """(n, 3) int64 of (positions, attention, context) per iteration, the cost model's totals
    (``scheduling.cost.iteration_time``: chunks (k, c) give positions sum k, attention
    sum(k c + k (k + 1) / 2), context sum c)."""
    rows = [(sum(k for k, _ in r.chunks), sum(k * c + k * (k + 1) // 2 for k, c in r.chunks),
             sum(c for _, c in r.chunks)) for r in history]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


@dataclass(frozen=True)
class Fit:
    """The fitted device and how well it explains the iterations it was fitted on.

    Attributes: device (bandwidth B/s, peak_flops FLOP/s as fitted); iterations (how many);
    memory_bound (share of them the fit prices by bytes); median_error, p90_error (|predicted / measured
    - 1| over those iterations); measured, predicted ((iterations,) float64 seconds, in run order);
    decode_only ((iterations,) bool: every chunk of the iteration was one position: decodes, or a
    prefill's last single position beside them)."""

    device: Device
    iterations: int
    memory_bound: float
    median_error: float
    p90_error: float
    measured: np.ndarray = field(repr=False, compare=False)
    predicted: np.ndarray = field(repr=False, compare=False)
    decode_only: np.ndarray = field(repr=False, compare=False)


def fit_device(history: Seq[StepReport], deployment: Deployment, steps_per_decade: int = 40) -> Fit:
    """Least-squares fit of the cost model's bandwidth and compute to measured iterations.

    Minimises sum(log(predicted_i) - log(measured_i))^2 with predicted_i = max(bytes_i / bandwidth,
    FLOPs_i / compute), bytes and FLOPs from ``scheduling.cost.iteration_work`` of each iteration's
    chunks on ``deployment`` (``Engine.deployment``: the engine's weight bytes and KV bytes). Both rates are
    searched on a log grid (1e8 .. 1e12 B/s, 1e9 .. 1e13 FLOP/s, ``steps_per_decade`` points per decade).
    ``compute`` is the rate an iteration reaches, ``deployment.mfu * peak_flops``: the fitted device's
    ``peak_flops`` is compute / mfu, so the simulator on ``deployment`` prices with exactly the fitted rate.

    Warns (UserWarning) when a rate lands on the grid's edge: the iterations do not pin it down (none is
    priced by that term, or the true rate is outside the grid).

    Raises: ValueError for fewer than 2 iterations, a duration that is not positive, or ``steps_per_decade``
    below 1."""
    steps_per_decade = positive_integer("steps_per_decade", steps_per_decade)
    if len(history) < 2:
        raise ValueError(f"fit_device needs at least 2 measured iterations, got {len(history)}")
    measured = np.array([r.duration for r in history])
    if (measured <= 0).any():
        raise ValueError("every iteration must have a positive measured duration")
    positions, attention, context = iteration_totals(history).T
    bytes_moved, flops = iteration_work(positions=positions, attention=attention, context=context,
                                        deployment=deployment)
    bandwidths = np.logspace(8, 12, 4 * steps_per_decade + 1)
    computes = np.logspace(9, 13, 4 * steps_per_decade + 1)
    memory = np.log(bytes_moved[None, :] / bandwidths[:, None])            # (grid, n)
    compute = np.log(flops[None, :] / computes[:, None])
    target = np.log(measured)
    best = (math.inf, 0, 0)
    for j in range(len(computes)):
        loss = ((np.maximum(memory, compute[j][None, :]) - target[None, :]) ** 2).sum(1)
        i = int(loss.argmin())
        if loss[i] < best[0]:
            best = (float(loss[i]), i, j)
    _, i, j = best
    bandwidth, peak = float(bandwidths[i]), float(computes[j])
    predicted = np.maximum(bytes_moved / bandwidth, flops / peak)
    memory_bound = bytes_moved / bandwidth >= flops / peak
    for name, k, grid, unit, binds in (("bandwidth", i, bandwidths, "B/s", memory_bound.any()),
                                       ("compute", j, computes, "FLOP/s", (~memory_bound).any())):
        if k in (0, len(grid) - 1):
            warnings.warn(f"fit_device: the fitted {name} {grid[k]:.3g} {unit} is at the edge of the search grid "
                          f"({grid[0]:.0e} .. {grid[-1]:.0e}); these iterations do not determine it", stacklevel=2)
        elif not binds:
            warnings.warn(f"fit_device: no iteration is priced by {name}; {grid[k]:.3g} {unit} is only a lower "
                          "bound (add iterations that term limits)", stacklevel=2)
    errors = np.abs(predicted / measured - 1)
    device = Device("this CPU (fitted)", memory=deployment.weight_bytes + deployment.kv_budget + 1.0,
                    bandwidth=bandwidth, peak_flops=peak / deployment.mfu,
                    source=f"least-squares fit to {len(history)} measured engine iterations "
                           f"(peak_flops = fitted compute / mfu {deployment.mfu:g})")
    decode_only = np.array([all(k == 1 for k, _ in r.chunks) for r in history])
    return Fit(device, len(history), float(np.mean(memory_bound)),
               float(np.median(errors)), float(np.quantile(errors, 0.9)), measured, predicted, decode_only)


def simulate_engine_policy(trace: Seq[TraceRequest], engine: Engine, device: Device) -> list[RequestRecord]:
    """Lab 3's simulator serving ``trace`` with the engine's policy (chunked step, its budget, max_running and
    KV budget) on ``device``: ``Engine.deployment`` with the fitted device in place of its placeholder."""
    deployment = replace(engine.deployment, device=device)
    requests = [Request(t.arrival, len(t.prompt_ids), t.max_new_tokens) for t in trace]
    return run_with_step(requests, deployment, budget=engine.budget, max_running=engine.max_running)


def compare(simulated: Seq[RequestRecord], measured: Seq[RequestRecord]) -> pd.DataFrame:
    """Table of ``COMPARED`` metrics: simulator, engine, error (simulator / engine - 1); seconds except
    throughput (tokens/s)."""
    sim, eng = metrics(simulated), metrics(measured)
    rows = [(key, sim[key], eng[key], sim[key] / eng[key] - 1) for key in COMPARED]
    return pd.DataFrame(rows, columns=["metric", "simulator", "engine", "error"])
