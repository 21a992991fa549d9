"""Time the Lab 3 simulator: the full policy sweep and the four capacity searches.

Run: ``python -m course_lib.scheduling.bench [--repeats 3] [--warmup 1] [--count 300]``.

The sweep is 4 policies x nominal rates 0.10, 0.20, 0.25, 0.30, 0.35, 0.40 req/s x 300
requests (``docs/scheduling.md``); each capacity search is 10 chunked runs (``capacity``), one
per priced deployment of ``PROFILES``. Each part is run ``--warmup`` times, then timed
``--repeats`` times with ``time.perf_counter``; the median wall-clock time is printed (a
*measurement* on this machine's CPU; the simulator is single-threaded Python + numpy). Then
the sweep table (simulated seconds, tokens/s, requests/s) and the capacity results.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from .capacity_search import capacity
from .cost import PROFILES, cost_per_million_tokens
from .metrics import METRIC_KEYS
from .reference import SWEEP_POLICIES
from .simulator import simulate

#: The nominal rates of the lab's sweep (requests/s).
SWEEP_RATES: tuple[float, ...] = (0.10, 0.20, 0.25, 0.30, 0.35, 0.40)


def sweep(rates=SWEEP_RATES, policies=SWEEP_POLICIES, count: int = 300) -> list[dict]:
    """One row per (policy, rate): {"policy", "rate", **simulate(rate, policy, count=count)}."""
    return [{"policy": p, "rate": r, **simulate(r, p, count=count)} for p in policies for r in rates]


def capacities(count: int = 300) -> dict:
    """{profile name: (nominal rate, metrics)} from ``capacity`` on each of ``PROFILES``."""
    return {name: capacity(profile.deployment, count=count) for name, profile in PROFILES.items()}


def _timed(fn, warmup: int, repeats: int):
    for _ in range(warmup):
        fn()
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


def _row(values: dict) -> str:
    cells = []
    for key in METRIC_KEYS:
        v = values[key]
        if key in ("ttft50", "ttft99", "e2e50"):
            cells.append(f"{v:9.2f}")
        elif key in ("itl50", "itl99", "itlmax", "tpot50"):
            cells.append(f"{v * 1e3:9.2f}")
        elif key == "preemptions":
            cells.append(f"{v:9d}")
        else:
            cells.append(f"{v:9.3f}" if key != "throughput" else f"{v:9.1f}")
    return " ".join(cells)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per part (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before timing")
    parser.add_argument("--count", type=int, default=300, help="requests per run")
    args = parser.parse_args(argv)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible; "
          f"the simulator runs on one thread (Python {platform.python_version()})")
    print(f"timing: {args.warmup} warm-up run(s), median of {args.repeats} timed repeat(s), time.perf_counter")
    sweep_s, sweep_all, rows = _timed(lambda: sweep(count=args.count), args.warmup, args.repeats)
    cap_s, cap_all, caps = _timed(lambda: capacities(count=args.count), args.warmup, args.repeats)
    runs_sweep = len(SWEEP_POLICIES) * len(SWEEP_RATES)
    print(f"sweep ({runs_sweep} runs of {args.count} requests): median {sweep_s:.2f} s "
          f"(all: {', '.join(f'{t:.2f}' for t in sweep_all)})")
    print(f"capacity searches ({len(PROFILES)} x 10 chunked runs): median {cap_s:.2f} s "
          f"(all: {', '.join(f'{t:.2f}' for t in cap_all)})")
    print(f"total (sweep + capacity): {sweep_s + cap_s:.2f} s (measurement)")

    print("\nsweep (simulated; TTFT/E2E in s, ITL/TPOT in ms, throughput tokens/s, goodput and realised req/s):")
    print(f"{'policy':8} {'rate':>5} " + " ".join(f"{k:>9}" for k in METRIC_KEYS))
    for row in rows:
        print(f"{row['policy']:8} {row['rate']:5.2f} " + _row(row))

    print("\ncapacity (chunked, p99 TTFT <= 3 s and p99 ITL <= 100 ms; 10 bisection steps on [0.01, 4]):")
    print(f"{'profile':10} {'rate':>7} {'ttft99 s':>9} {'itl99 ms':>9} {'tokens/s':>9} {'$/h':>5} {'$/M tokens':>10}")
    for name, (rate, m) in caps.items():
        price = PROFILES[name].dollars_per_hour
        print(f"{name:10} {rate:7.4f} {m['ttft99']:9.3f} {m['itl99'] * 1e3:9.2f} {m['throughput']:9.1f} "
              f"{price:5.2f} {cost_per_million_tokens(m['throughput'], price):10.3f}")


if __name__ == "__main__":
    main()
