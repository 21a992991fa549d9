"""The seeded open-loop workload of Lab 3: scheduling (``docs/scheduling.md#workload``).

Requests arrive as a Poisson process (exponential gaps at the nominal rate); prompts are
uniform in [2000, 6000] tokens; output lengths are log-normal around 1,500 tokens, clipped
to [16, 4000]. Everything is drawn from one ``random.Random(seed)`` in a fixed order, so a
(rate, count, seed) triple names one exact trace.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from ..validation import integer, nonnegative_number, positive_integer, positive_number

__all__ = ["Request", "RequestRecord", "make_workload", "MAX_OUTPUT"]

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
