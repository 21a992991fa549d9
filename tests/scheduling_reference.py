"""A plain, per-iteration reference of the Lab 3 serving simulator (tests only).

Written straight from the Lab 3 issue's "Exact semantics", one loop pass per iteration,
lists of request objects, sums recomputed every time, ``iteration_time`` called with the
explicit decode contexts and (k, c) chunks. Slow (seconds for a few dozen requests of the
real workload): the tests use it on small traces and compare the fast simulator with it.
"""
from __future__ import annotations

import numpy as np

from course_lib.scheduling import Device, RequestRecord, RequestTooLargeError, iteration_time

STATIC_BATCH, STATIC_WAIT = 16, 2.0
MAX_RUNNING, CHUNK_BUDGET, MAX_OUTPUT = 256, 256, 4000


class Req:
    def __init__(self, arrival, prompt, output):
        self.arrival, self.prompt, self.output = arrival, prompt, output
        self.filled = 0          # cached positions (its context)
        self.generated = 0       # tokens emitted
        self.target = 0          # prefill length fixed at admission
        self.times = []          # token timestamps
        self.preemptions = 0

    def record(self):
        return RequestRecord(self.arrival, self.prompt, self.output, np.array(self.times), self.preemptions)


def reference_run(requests, policy, device=None, iteration_bound=10_000_000):
    """Serve ``requests`` ((arrival, prompt, output) triples or Request objects) and return
    (records, final clock, total preemptions)."""
    device = device or Device()
    reqs = [Req(r[0], r[1], r[2]) if isinstance(r, tuple) else Req(r.arrival, r.prompt, r.output)
            for r in requests]
    if policy == "static":
        clock = _static(reqs, device, iteration_bound)
    elif policy in ("reserve", "paged", "chunked"):
        clock = _continuous(reqs, device, policy, iteration_bound)
    else:
        raise ValueError(policy)
    return [r.record() for r in reqs], clock, sum(r.preemptions for r in reqs)


def _static(reqs, device, bound):
    clock, queue, pending, finished = 0.0, [], list(reqs), 0
    for _ in range(bound):
        if finished == len(reqs):
            return clock
        while pending and pending[0].arrival <= clock:
            queue.append(pending.pop(0))
        if not queue:
            clock = pending[0].arrival
            continue
        deadline = queue[0].arrival + STATIC_WAIT
        if len(queue) < STATIC_BATCH and clock < deadline:
            clock = min(deadline, pending[0].arrival) if pending else deadline
            continue
        batch, queue = queue[:STATIC_BATCH], queue[STATIC_BATCH:]
        clock += iteration_time([], [(r.prompt, 0) for r in batch], device)
        for r in batch:
            r.filled, r.generated = r.prompt, 1
            r.times.append(clock)
        while any(r.generated < r.output for r in batch):
            clock += iteration_time([r.filled for r in batch], [], device)
            for r in batch:
                r.filled += 1  # finished slots keep decoding
                if r.generated < r.output:
                    r.generated += 1
                    r.times.append(clock)
        finished += len(batch)
    raise RuntimeError("iteration bound exceeded")


def _continuous(reqs, device, policy, bound):
    clock, queue, pending, running, finished = 0.0, [], list(reqs), [], 0
    budget = CHUNK_BUDGET if policy == "chunked" else None
    for _ in range(bound):
        if finished == len(reqs):
            return clock
        while pending and pending[0].arrival <= clock:
            queue.append(pending.pop(0))
        if not running and not queue:
            clock = pending[0].arrival
            continue
        # admission (bytes compared as tokens * kv)
        if policy == "reserve":
            used_tokens = sum(r.prompt + MAX_OUTPUT for r in running)
        else:
            used_tokens = sum(r.filled for r in running)
        while queue and len(running) < MAX_RUNNING:
            head = queue[0]
            cost = head.prompt + MAX_OUTPUT if policy == "reserve" else head.prompt + head.generated
            if (used_tokens + cost) * device.kv > 0.99 * device.memory:
                break
            queue.pop(0)
            used_tokens += cost
            head.target, head.filled = head.prompt + head.generated, 0
            running.append(head)
        if not running:
            raise RequestTooLargeError("cannot fit")
        # plan, preempting the newest while the growth would overflow memory
        while True:
            left = budget
            decodes, chunks = [], []
            for r in running:
                if r.filled < r.target:
                    k = r.target - r.filled if left is None else min(r.target - r.filled, left)
                    if k > 0:
                        chunks.append((r, k))
                        if left is not None:
                            left -= k
                else:
                    decodes.append(r)
            growth = len(decodes) + sum(k for _, k in chunks)
            if (sum(r.filled for r in running) + growth) * device.kv > device.memory:
                if len(running) == 1:
                    raise RequestTooLargeError("outgrows memory alone")
                victim = running.pop()
                victim.filled = 0
                victim.preemptions += 1
                queue.insert(0, victim)
                continue
            break
        clock += iteration_time([r.filled for r in decodes], [(k, r.filled) for r, k in chunks], device)
        for r in decodes:
            r.filled += 1
            r.generated += 1
            r.times.append(clock)
        for r, k in chunks:
            r.filled += k
            if r.filled == r.target:
                r.generated += 1
                r.times.append(clock)
        for r in [r for r in running if r.generated == r.output]:
            running.remove(r)
            finished += 1
    raise RuntimeError("iteration bound exceeded")
