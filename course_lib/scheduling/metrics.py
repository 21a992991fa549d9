"""Serving metrics of Lab 3: scheduling (``docs/scheduling.md#metrics``; goodput as in
DistServe, arXiv:2401.09670).

From per-request token timestamps:
- TTFT (time to first token) = first token time - arrival;
- ITL (inter-token latency) = every gap between consecutive tokens of a request, pooled
  over all requests (one long answer contributes many gaps: ITL percentiles are per
  token, not per request);
- TPOT (time per output token) = (E2E - TTFT) / (n_out - 1), undefined for a one-token
  answer (those requests are left out of the TPOT median);
- E2E = last token time - arrival;
- throughput = all output tokens / final clock; goodput = requests with TTFT <= 3 s and
  every gap <= 100 ms, per second of final clock (the final clock is the last token time:
  the simulation ends when the last request finishes);
- realised rate = requests / last arrival (the open-loop rate the trace actually had).
Percentiles use numpy's default (linear interpolation between order statistics).
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Sequence

import numpy as np

from .workload import RequestRecord

__all__ = ["metrics", "METRIC_KEYS", "DEFAULT_TARGETS"]

#: The keys of ``metrics`` (and ``simulate``), in table order.
METRIC_KEYS: tuple[str, ...] = ("ttft50", "ttft99", "itl50", "itl99", "itlmax", "tpot50", "e2e50",
                                "throughput", "goodput", "preemptions", "realised")
#: The lab's latency targets: (TTFT seconds, largest inter-token gap seconds).
DEFAULT_TARGETS: tuple[float, float] = (3.0, 0.1)


def _quantile(values: np.ndarray, q: float) -> float:
    return float(np.quantile(values, q)) if len(values) else math.nan


def metrics(records: Sequence[RequestRecord], targets: tuple[float, float] = DEFAULT_TARGETS) -> dict:
    """Latency and throughput metrics of one simulated run.

    Args:
        records: one ``RequestRecord`` per request (token_times float64, shape (output,)).
        targets: (TTFT target, gap target) in seconds for goodput; the lab's (3.0, 0.1).

    Returns:
        dict with ttft50, ttft99, itl50, itl99, itlmax, tpot50, e2e50 (seconds),
        throughput (output tokens/s), goodput (requests/s), preemptions (int), realised
        (requests/s). Quantiles: numpy's default linear method; ITL pooled over every gap of
        every request. NaN where a metric is undefined: ITL figures when no request has two
        tokens, tpot50 when every answer has one token, realised when the last arrival is 0.

    Raises:
        ValueError: no records, a record whose token_times does not have ``output`` finite,
            non-decreasing entries at or after its arrival, or targets that are not two
            positive numbers.
        TypeError: an entry that is not a RequestRecord.
    """
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence) or len(records) == 0:
        raise ValueError("records must be a non-empty sequence of RequestRecord")
    if not (isinstance(targets, Sequence) and len(targets) == 2
            and all(isinstance(t, Real) and not isinstance(t, bool) and t > 0 for t in targets)):
        raise ValueError(f"targets must be (TTFT seconds, gap seconds), two positive numbers; got {targets!r}")
    ttft_target, gap_target = targets
    n = len(records)
    ttft = np.empty(n)
    e2e = np.empty(n)
    tpot = []
    gaps = []
    good = 0
    tokens = 0
    final = -math.inf
    last_arrival = 0.0
    preemptions = 0
    for i, r in enumerate(records):
        if not isinstance(r, RequestRecord):
            raise TypeError(f"records[{i}] must be a RequestRecord, got {type(r).__qualname__}")
        times = r.token_times
        if not isinstance(times, np.ndarray) or times.ndim != 1 or len(times) != r.output or len(times) == 0:
            raise ValueError(f"records[{i}].token_times must be a 1-d array of {r.output} token times")
        first, last = float(times[0]), float(times[-1])
        ttft[i] = first - r.arrival
        e2e[i] = last - r.arrival
        if not (math.isfinite(first) and math.isfinite(last)) or ttft[i] < 0:
            raise ValueError(f"records[{i}]: token times must be finite and not before the arrival")
        gap = np.diff(times)
        if len(gap):
            if gap.min() < 0:
                raise ValueError(f"records[{i}].token_times must be non-decreasing")
            gaps.append(gap)
            tpot.append((e2e[i] - ttft[i]) / (r.output - 1))
        if ttft[i] <= ttft_target and (len(gap) == 0 or gap.max() <= gap_target):
            good += 1
        tokens += r.output
        final = max(final, last)
        last_arrival = max(last_arrival, r.arrival)
        preemptions += r.preemptions
    itl = np.concatenate(gaps) if gaps else np.zeros(0)
    return {
        "ttft50": _quantile(ttft, 0.5),
        "ttft99": _quantile(ttft, 0.99),
        "itl50": _quantile(itl, 0.5),
        "itl99": _quantile(itl, 0.99),
        "itlmax": float(itl.max()) if len(itl) else math.nan,
        "tpot50": _quantile(np.array(tpot), 0.5),
        "e2e50": _quantile(e2e, 0.5),
        "throughput": tokens / final if final > 0 else math.nan,
        "goodput": good / final if final > 0 else math.nan,
        "preemptions": int(preemptions),
        "realised": n / last_arrival if last_arrival > 0 else math.nan,
    }
