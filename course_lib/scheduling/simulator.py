"""The Lab 3 serving simulator's entry points: ``run_trace`` and ``simulate``.

The simulation is defined, one loop pass per iteration, in ``reference.py`` (the policies,
the rules of ``step.py``, the timestamps); ``run_trace`` runs the same simulation through the
fast path of ``fast.py``, which gives the same records bit for bit. ``docs/scheduling.md``
describes the policies and the cost model.
"""
from __future__ import annotations

from typing import Sequence

from .fast import run_fast
from .metrics import metrics
from .reference import check_policy, check_trace, iteration_limit, resolve_deployment
from .workload import Request, RequestRecord, make_bursty_workload, make_workload

__all__ = ["run_trace", "simulate", "ARRIVALS"]

#: The arrival processes ``simulate`` serves: name -> workload maker (rate, count) -> trace.
ARRIVALS = {"poisson": make_workload, "on-off": make_bursty_workload}


def run_trace(requests: Sequence[Request], policy: str, deployment=None) -> list[RequestRecord]:
    """Serve an explicit trace with one policy and return what happened to each request.

    Args:
        requests: ``Request`` objects (or (arrival, prompt, output) triples) in arrival order.
        policy: "static", "reserve", "paged" or "chunked" (``reference.py`` defines them).
        deployment: a ``Deployment``, a ``Profile``, a name in ``PROFILES``, or None
            (``Deployment()``: the case model on the 24GB-1.0 device).

    Returns:
        one ``RequestRecord`` per request, in the input order (token times in seconds), equal
        bit for bit to ``run_reference(requests, policy, deployment)``.

    Raises:
        ValueError: an unknown policy (the message lists the valid ones); an empty or unsorted
            trace; ``RequestTooLargeError`` (a ValueError) when a request can never be served.
        TypeError: a request or deployment of the wrong type.
        RuntimeError: the iteration bound was exceeded (a scheduler that makes no progress).
    """
    policy = check_policy(policy)
    deployment = resolve_deployment(deployment)
    trace = check_trace(requests)
    return run_fast(trace, policy, deployment, iteration_limit(trace))


def simulate(rate: float, policy: str, deployment=None, count: int = 300, *, arrivals: str = "poisson") -> dict:
    """Serve the lab's workload ``make_workload(rate, count)`` with ``policy`` and return its metrics.

    Args:
        rate: nominal arrival rate (requests/s, > 0). policy: one of ``POLICIES``.
        deployment: as in ``run_trace`` (None: the 24GB-bf16 profile's). count: requests (>= 1).
        arrivals: "poisson" (``make_workload``) or "on-off" (``make_bursty_workload``: the same
            requests arriving in bursts of the same mean rate, its default on/off parameters).

    Returns:
        ``metrics(run_trace(...))``: a dict with ttft50, ttft99, itl50, itl99, itlmax, tpot50,
        e2e50 (seconds), throughput (output tokens/s), goodput (requests/s meeting TTFT <= 3 s
        and every gap <= 100 ms), preemptions (int), realised (requests/s).

    Raises: ValueError (unknown policy or arrivals, bad rate or count), as ``run_trace`` otherwise.
    """
    policy = check_policy(policy)
    if not isinstance(arrivals, str) or arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(map(repr, ARRIVALS))}; got {arrivals!r}")
    return metrics(run_trace(ARRIVALS[arrivals](rate, count), policy, deployment))
