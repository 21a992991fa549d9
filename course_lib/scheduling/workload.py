"""The seeded open-loop workload of Lab 3: scheduling (``docs/scheduling.md#workload``).

Requests arrive as a Poisson process (exponential gaps at the nominal rate); prompts are
uniform in [2000, 6000] tokens; output lengths are log-normal around 1,500 tokens, clipped
to [16, 4000]. Everything is drawn from one ``random.Random(seed)`` in a fixed order, so a
(rate, count, seed) triple names one exact trace.

``make_bursty_workload`` keeps the same requests (the same prompts and outputs, in order) and
moves their arrivals onto a seeded on/off process of the same mean rate
(``docs/scheduling.md#bursty-arrivals``).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from ..validation import integer, nonnegative_number, number, positive_integer, positive_number

__all__ = ["Request", "RequestRecord", "make_workload", "make_bursty_workload", "MAX_OUTPUT", "BURST_ON_FRACTION",
           "BURST_ON_SECONDS"]

#: Largest output length of the workload (tokens); the reserve policy charges it up front.
MAX_OUTPUT: int = 4000


@dataclass(frozen=True)
class Request:
    """One request of a trace.

    Attributes:
        arrival: arrival time in seconds (finite, >= 0).
        prompt: prompt length in tokens (int >= 1).
        output: tokens to generate (int, 1 <= output <= MAX_OUTPUT = 4000).

    Raises: TypeError / ValueError naming the field on a wrong type or value.
    """

    arrival: float
    prompt: int
    output: int

    def __post_init__(self) -> None:
        nonnegative_number("Request.arrival", self.arrival, note="seconds")
        positive_integer("Request.prompt", self.prompt)
        integer("Request.output", self.output, minimum=1, maximum=MAX_OUTPUT)


def make_workload(rate: float, count: int = 300, seed: int = 0) -> list[Request]:
    """The lab's workload: ``count`` requests drawn from ``random.Random(seed)``.

    For each request in order: arrival += expovariate(rate); prompt = randint(2000, 6000);
    output = min(4000, max(16, int(lognormvariate(log(1500), 0.6)))) (``docs/scheduling.md#workload``).
    At rate 0.20 and count 300 the mean output is 1,737.4 tokens and the realised rate
    (count / last arrival) is 0.224 req/s.

    Args:
        rate: nominal arrival rate in requests/s (positive, finite).
        count: number of requests (int >= 1). seed: the Random seed (int).
    Returns: a list of ``Request`` in arrival order.
    Raises: ValueError for a rate that is not positive and finite or count < 1; TypeError
        for a non-int count or seed.
    """
    positive_number("rate", rate, note="requests/s")
    count = positive_integer("count", count)
    seed = integer("seed", seed)
    rng = random.Random(seed)
    mu = math.log(1500)
    arrival = 0.0
    requests = []
    for _ in range(count):
        arrival += rng.expovariate(rate)
        prompt = rng.randint(2000, 6000)
        output = min(MAX_OUTPUT, max(16, int(rng.lognormvariate(mu, 0.6))))
        requests.append(Request(arrival, prompt, output))
    return requests


#: The on/off process of ``make_bursty_workload``: the share of time it is on, and the mean length
#: of an on period in seconds (assumed values: bursts a few times the mean rate, a minute apart).
BURST_ON_FRACTION: float = 0.25
BURST_ON_SECONDS: float = 20.0


def make_bursty_workload(rate: float, count: int = 300, seed: int = 0, *, on_fraction: float = BURST_ON_FRACTION,
                         on_seconds: float = BURST_ON_SECONDS) -> list[Request]:
    """The lab's requests arriving in bursts: an on/off (interrupted Poisson) process of mean rate ``rate``.

    The process alternates *on* periods (exponential lengths, mean ``on_seconds``), during which
    requests arrive as a Poisson process of rate ``rate / on_fraction``, and silent *off* periods
    (exponential, mean ``on_seconds * (1 - on_fraction) / on_fraction``), starting on at time 0. Its
    long-run mean rate is ``rate``, so it is compared with ``make_workload(rate)`` at one nominal rate:
    the prompts and outputs are those of ``make_workload(rate, count, seed)``, in the same order;
    only the arrival times differ (``docs/scheduling.md#bursty-arrivals``; the interrupted Poisson
    process is the two-state Markov-modulated Poisson process with one silent state, Fischer and
    Meier-Hellstern, Performance Evaluation 18(2), 1993).

    The arrivals come from ``random.Random(f"on-off {seed}")``, in this order: for each on period its
    length, then its arrival gaps until one passes its end, then the off period's length. An
    ``on_fraction`` of 1 gives a Poisson process (from that generator, not ``make_workload``'s).

    Args:
        rate: mean arrival rate in requests/s (positive, finite).
        count: number of requests (int >= 1). seed: the seed (int).
        on_fraction: share of time the process is on, in (0, 1] (0.25: bursts at 4x the mean rate).
        on_seconds: mean length of an on period in seconds (> 0; 20 s).

    Returns: a list of ``Request`` in arrival order.
    Raises: ValueError for a rate or on_seconds that is not positive and finite, an on_fraction
        outside (0, 1] or count < 1; TypeError for a non-int count or seed.
    """
    requests = make_workload(rate, count, seed)
    on_fraction = number("on_fraction", on_fraction, minimum=0, maximum=1, open_minimum=True)
    on_seconds = positive_number("on_seconds", on_seconds, note="seconds")
    rng = random.Random(f"on-off {seed}")
    peak = rate / on_fraction
    off_mean = on_seconds * (1 - on_fraction) / on_fraction
    arrivals: list[float] = []
    t = 0.0
    while len(arrivals) < count:
        end = t + rng.expovariate(1 / on_seconds)
        while len(arrivals) < count:
            gap = rng.expovariate(peak)
            if t + gap >= end:
                break
            t += gap
            arrivals.append(t)
        t = end   # memoryless: the gap that ran past the end is dropped
        if off_mean > 0:
            t += rng.expovariate(1 / off_mean)
    return [Request(a, r.prompt, r.output) for a, r in zip(arrivals, requests)]


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request.

    Attributes:
        arrival: arrival time (s). prompt, output: lengths in tokens.
        token_times: float64 array of shape (output,): the time (s) each output token was
            emitted, non-decreasing; read-only.
        preemptions: how many times this request was preempted.
    """

    arrival: float
    prompt: int
    output: int
    token_times: np.ndarray
    preemptions: int

    @property
    def ttft(self) -> float:
        """Time to first token (s): first token time - arrival."""
        return float(self.token_times[0]) - self.arrival

    @property
    def e2e(self) -> float:
        """End-to-end latency (s): last token time - arrival."""
        return float(self.token_times[-1]) - self.arrival
