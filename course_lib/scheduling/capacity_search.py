"""SLO capacity search of Lab 3: scheduling (``docs/scheduling.md``, "Capacity").

The capacity of a deployment is the largest nominal arrival rate whose chunked-policy run meets
both p99 targets (TTFT <= 3 s, ITL <= 100 ms). It is found by bisection: 10 steps on
[0.01, 4] req/s, moving the lower bound up when the midpoint passes and the upper bound down
when it fails. Finite samples break monotonicity (a slightly higher rate can pass where a
lower one failed), so the notebook re-checks the result at +-0.005 req/s.
"""
from __future__ import annotations

from numbers import Real

from .metrics import DEFAULT_TARGETS
from .reference import resolve_deployment
from .simulator import simulate

__all__ = ["capacity", "meets_targets", "BISECTION_STEPS", "RATE_BOUNDS"]

#: Bisection steps and the bracket of nominal rates (requests/s) of the lab.
BISECTION_STEPS: int = 10
RATE_BOUNDS: tuple[float, float] = (0.01, 4.0)


def meets_targets(result: dict, targets: tuple[float, float] = DEFAULT_TARGETS) -> bool:
    """True when p99 TTFT <= targets[0] and p99 ITL <= targets[1] (seconds); NaN fails."""
    return bool(result["ttft99"] <= targets[0] and result["itl99"] <= targets[1])


def capacity(deployment=None, targets: tuple[float, float] = DEFAULT_TARGETS, *,
             count: int = 300) -> tuple[float, dict]:
    """Largest nominal rate (requests/s) the chunked policy serves within both p99 targets.

    Bisection, ``BISECTION_STEPS`` = 10 steps on ``RATE_BOUNDS`` = [0.01, 4]: at each midpoint
    run ``simulate(mid, "chunked", deployment, count)``; when both p99 targets pass the lower bound
    moves to the midpoint, otherwise the upper bound does. Returns the final lower bound.

    Args:
        deployment: a ``Deployment``, a ``Profile``, a name in ``PROFILES``, or None (24GB-bf16).
        targets: (p99 TTFT seconds, p99 ITL seconds), default (3.0, 0.1).
        count: requests per run (300).

    Returns:
        (nominal_rate, metrics): the lower bound after 10 steps and the ``simulate`` metrics at
        that rate (from the bisection run; 0.01 req/s is run once more if no midpoint passed).

    Raises: ValueError / TypeError for a bad deployment, targets or count (as ``simulate``).
    """
    deployment = resolve_deployment(deployment)
    if not (isinstance(targets, (tuple, list)) and len(targets) == 2
            and all(isinstance(t, Real) and not isinstance(t, bool) and t > 0 for t in targets)):
        raise ValueError(f"targets must be (p99 TTFT seconds, p99 ITL seconds), two positive numbers; got {targets!r}")
    lo, hi = RATE_BOUNDS
    best = None
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        result = simulate(mid, "chunked", deployment, count)
        if meets_targets(result, targets):
            lo, best = mid, result
        else:
            hi = mid
    if best is None:
        best = simulate(lo, "chunked", deployment, count)
    return lo, best
