"""The serving simulator of Lab 3, written plainly: one loop pass per iteration.

This is the readable definition of what ``run_trace`` computes (``fast.py`` is the same
simulation from running totals, tested against this one bit for bit). Five policies serve
one trace of requests on one ``Deployment``; every iteration's time is ``cost.iteration_time``
of what it runs (``docs/scheduling.md`` gives the rules and their sources):

- ``static``: when nothing runs, wait until 16 requests are queued or the oldest has
  waited 2 s; prefill the (up to) 16 prompts in one iteration, then decode all 16 slots
  until the longest output is done (finished slots keep decoding; no memory check).
- ``static-checked``: static batching that checks memory before admitting (``step.static_batch``):
  a batch takes queued requests head first while each one's prompt + 4,000 positions (the
  most a slot can reach) fits in 0.99 of the KV budget, at most 16; it is dispatched when it
  is full (16, or the next request would not fit) or the oldest has waited 2 s.
- ``reserve``: continuous (iteration-level) batching as in Orca (OSDI'22): FIFO admission
  of up to 256 sequences, each charged prompt + 4,000 positions against 0.99 of the KV
  budget; whole prompts prefilled at once.
- ``paged``: like reserve, but charged what it uses (current contexts, plus the required
  prefill of a joining request); preempts the newest request when growth would overflow.
- ``chunked``: paged admission plus a budget of 256 positions per iteration, decodes
  included (as vLLM and Sarathi-Serve, arXiv:2403.02310, count them).

An iteration of a continuous policy applies the rules of ``step.py`` in this module's
``_admit`` (``step.admit``), ``_preempt`` (``step.evictions``, which plans with
``step.plan_chunks`` and evicts the newest until the iteration fits) and ``_plan``
(``step.plan_chunks``), runs for ``iteration_time`` of its chunks, and ``_stamp``s tokens:
every running request is below its target (prompt + tokens generated so far) and advances by
its chunk; a chunk that reaches the target emits a token, stamped with the iteration's end.
So a request's first token comes when its prefill completes, each later one at the end of
the one-position chunk that decodes it (``docs/scheduling.md#token-timestamps``). A preempted request keeps its timestamps, loses its cache and later
re-prefills its prompt plus the tokens it had generated.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

import numpy as np

from .cost import PROFILES, Deployment, Profile, iteration_time
from .step import (CHUNK_BUDGET, MAX_RUNNING, STATIC_BATCH, STATIC_WAIT, RequestTooLargeError, StepPlan, admit,
                   admit_limit, as_plan, chunked_step, evictions, plan_chunks, static_batch,
                   static_head_too_large)
from .workload import MAX_OUTPUT, Request, RequestRecord

__all__ = ["POLICIES", "SWEEP_POLICIES", "run_reference", "run_with_step", "resolve_deployment", "check_policy",
           "check_trace", "iteration_limit", "overrun"]

#: The policies: the four the lab sweeps, in that order, then static batching with a memory check.
POLICIES: tuple[str, ...] = ("static", "reserve", "paged", "chunked", "static-checked")
#: The four policies of the lab's sweep (section 5), in its order.
SWEEP_POLICIES: tuple[str, ...] = POLICIES[:4]


# -- inputs, shared with the fast simulator --------------------------------------------------------
def resolve_deployment(deployment) -> Deployment:
    """None -> ``Deployment()``; a ``Deployment`` as is; a ``Profile`` or a name in ``PROFILES`` ->
    its deployment.

    Raises: ValueError for an unknown profile name; TypeError for any other type."""
    if deployment is None:
        return Deployment()
    if isinstance(deployment, Deployment):
        return deployment
    if isinstance(deployment, Profile):
        return deployment.deployment
    if isinstance(deployment, str):
        if deployment in PROFILES:
            return PROFILES[deployment].deployment
        raise ValueError(f"deployment {deployment!r} is not a profile name; known: {', '.join(PROFILES)}")
    raise TypeError(f"deployment must be a Deployment, a Profile, a name in PROFILES or None, got "
                    f"{type(deployment).__qualname__}")


def check_policy(policy) -> str:
    """``policy`` if it is one of ``POLICIES``; else ValueError listing the valid ones."""
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(repr(p) for p in POLICIES)}; got {policy!r}")
    return policy


def check_trace(requests) -> list[Request]:
    """A non-empty trace in arrival order as a list of ``Request`` ((arrival, prompt, output)
    triples are converted). Raises: TypeError for another type; ValueError if empty or unsorted."""
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise TypeError(f"requests must be a sequence of Request, got {type(requests).__qualname__}")
    if len(requests) == 0:
        raise ValueError("requests is empty: a trace needs at least one request")
    out = []
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            if isinstance(r, Sequence) and not isinstance(r, (str, bytes)) and len(r) == 3:
                r = Request(*r)
            else:
                raise TypeError(f"requests[{i}] must be a Request or an (arrival, prompt, output) triple, got {r!r}")
        if out and r.arrival < out[-1].arrival:
            raise ValueError(f"requests must be in arrival order: requests[{i}].arrival = {r.arrival} < "
                             f"requests[{i - 1}].arrival = {out[-1].arrival}")
        out.append(r)
    return out


def iteration_limit(requests: Sequence[Request]) -> int:
    """A generous bound on iterations (and scheduler passes): every iteration makes progress on
    at least one position of some request, and re-prefills after preemption at most repeat it."""
    return 50 * sum(r.prompt + r.output for r in requests) + 10_000


def overrun(limit: int, policy: str) -> RuntimeError:
    """The error a simulation raises when it passes ``iteration_limit`` (a livelock)."""
    return RuntimeError(f"the {policy} simulation did not finish within {limit:,} iterations; "
                        "the scheduler is not making progress (a livelock), please report this trace")


# -- one request's state -------------------------------------------------------------------------
class _Request:
    """A request during a simulation: cached positions, tokens generated, their times."""

    def __init__(self, r: Request):
        self.arrival, self.prompt, self.output = r.arrival, r.prompt, r.output
        self.filled = 0          # cached positions (its context)
        self.generated = 0       # tokens emitted
        self.times: list[float] = []
        self.preemptions = 0

    @property
    def target(self) -> int:
        """Positions to cache before its next token: prompt + tokens generated so far."""
        return self.prompt + self.generated

    def record(self) -> RequestRecord:
        times = np.array(self.times, dtype=np.float64)
        times.flags.writeable = False
        return RequestRecord(self.arrival, self.prompt, self.output, times, self.preemptions)


class _Clock:
    """Simulated time and the iterations run so far."""

    def __init__(self, limit: int, policy: str):
        self.now, self.iterations, self.limit, self.policy = 0.0, 0, limit, policy

    def run(self, seconds: float) -> float:
        self.iterations += 1
        if self.iterations > self.limit:
            raise overrun(self.limit, self.policy)
        self.now += seconds
        return self.now


def _arrive(pending: deque, queue: deque, now: float) -> None:
    """Move every request that has arrived by ``now`` to the back of the queue."""
    while pending and pending[0].arrival <= now:
        queue.append(pending.popleft())


# -- static batching -----------------------------------------------------------------------------
def _serve_static(reqs: list[_Request], deployment: Deployment, clock: _Clock, check_memory: bool) -> None:
    pending, queue = deque(reqs), deque()
    limit = admit_limit(deployment) if check_memory else None
    while pending or queue:
        _arrive(pending, queue, clock.now)
        if not queue:
            clock.now = pending[0].arrival
            continue
        size = static_batch([r.prompt for r in queue], limit=limit)
        deadline = queue[0].arrival + STATIC_WAIT
        if size == len(queue) < STATIC_BATCH and clock.now < deadline:   # not full: wait for more
            clock.now = min(deadline, pending[0].arrival) if pending else deadline
            continue
        if size == 0:
            raise static_head_too_large(queue[0].arrival, queue[0].prompt, limit)
        batch = [queue.popleft() for _ in range(size)]
        end = clock.run(iteration_time([], [(r.prompt, 0) for r in batch], deployment))
        for r in batch:   # one iteration prefills every prompt; each emits its first token
            r.filled, r.generated = r.prompt, 1
            r.times.append(end)
        while any(r.generated < r.output for r in batch):
            end = clock.run(iteration_time([r.filled for r in batch], [], deployment))
            for r in batch:
                r.filled += 1   # finished slots keep decoding
                if r.generated < r.output:
                    r.generated += 1
                    r.times.append(end)


# -- continuous batching: reserve, paged, chunked ------------------------------------------------
def _charge(r: _Request, policy: str) -> int:
    """Positions admission charges: the whole reservation (reserve), else the required prefill."""
    return r.prompt + MAX_OUTPUT if policy == "reserve" else r.prompt + r.generated


def _admit(queue: deque, running: list[_Request], deployment: Deployment, policy: str) -> None:
    """Rule 1 (``step.admit``): FIFO from the queue head against 0.99 of the KV budget."""
    used = sum(_charge(r, policy) for r in running) if policy == "reserve" else sum(r.filled for r in running)
    joining = admit(used, [_charge(r, policy) for r in queue], limit=admit_limit(deployment),
                    room=MAX_RUNNING - len(running))
    for _ in range(joining):
        r = queue.popleft()
        r.filled = 0
        running.append(r)
    if not running:
        r = queue[0]
        raise RequestTooLargeError(
            f"a request (arrival {r.arrival:.6g} s, prompt {r.prompt}, {r.generated} tokens generated) "
            f"needs {_charge(r, policy)} cached positions but the {policy} policy admits at most "
            f"{admit_limit(deployment)} (0.99 * kv_budget / kv_bytes_per_token) with nothing else running: it "
            "can never be served on this deployment")


def _evict(running: list[_Request], queue: deque, indices) -> None:
    """Preempted requests lose their cache and go back to the queue head, in admission order."""
    for i in sorted(indices, reverse=True):
        victim = running.pop(i)
        victim.filled = 0
        victim.preemptions += 1
        queue.appendleft(victim)


def _preempt(running: list[_Request], queue: deque, deployment: Deployment, budget: int | None) -> None:
    """Rule 3 (``step.evictions``): evict the most recently admitted while the cached positions
    plus the iteration's planned growth would exceed the KV budget."""
    count = evictions([r.filled for r in running], [r.target - r.filled for r in running], budget=budget,
                      capacity=deployment.kv_tokens)
    if count == len(running):
        r = running[0]
        raise RequestTooLargeError(
            f"a request (arrival {r.arrival:.6g} s, prompt {r.prompt}, output {r.output}) running alone "
            f"would outgrow the KV budget of {deployment.kv_tokens} positions: it can never finish on this "
            "deployment")
    _evict(running, queue, range(len(running) - count, len(running)))


def _plan(running: list[_Request], budget: int | None) -> list[tuple[_Request, int]]:
    """Rule 2 (``step.plan_chunks``): each running request's chunk, in admission order; a chunk
    of 0 (the budget is spent) is left out: that request waits."""
    sizes = plan_chunks([r.target - r.filled for r in running], budget)
    return [(r, k) for r, k in zip(running, sizes) if k > 0]


def _stamp(chunks: Sequence[tuple[_Request, int]], end: float) -> None:
    """Rule 4: each chunk caches its k positions; one that reaches its target emits a token at ``end``."""
    for r, k in chunks:
        r.filled += k
        if r.filled == r.target:
            r.generated += 1
            r.times.append(end)


def _retire(running: list[_Request]) -> None:
    """Requests that emitted their last token leave (their cache is freed)."""
    running[:] = [r for r in running if r.generated < r.output]


def _iterations(reqs: list[_Request], clock: _Clock):
    """The serving loop of every continuous simulation: yields (queue, running) once per
    iteration, after the requests that arrived by now joined the queue; an idle engine jumps to
    the next arrival. Ends when every request has left."""
    pending, queue, running = deque(reqs), deque(), []
    while pending or queue or running:
        _arrive(pending, queue, clock.now)
        if not running and not queue:
            clock.now = pending[0].arrival
            continue
        yield queue, running


def _serve_continuous(reqs: list[_Request], deployment: Deployment, policy: str, clock: _Clock) -> None:
    budget = CHUNK_BUDGET if policy == "chunked" else None
    for queue, running in _iterations(reqs, clock):
        _admit(queue, running, deployment, policy)
        _preempt(running, queue, deployment, budget)
        chunks = _plan(running, budget)
        end = clock.run(iteration_time([], [(k, r.filled) for r, k in chunks], deployment))
        _stamp(chunks, end)
        _retire(running)


def run_reference(requests: Sequence[Request], policy: str, deployment=None) -> list[RequestRecord]:
    """Serve a trace with one policy, one loop pass per iteration; ``run_trace`` gives the same
    records bit for bit, faster. Arguments, returns and errors as ``run_trace``."""
    policy = check_policy(policy)
    deployment = resolve_deployment(deployment)
    trace = check_trace(requests)
    reqs = [_Request(r) for r in trace]
    clock = _Clock(iteration_limit(trace), policy)
    if policy in ("static", "static-checked"):
        _serve_static(reqs, deployment, clock, policy == "static-checked")
    else:
        _serve_continuous(reqs, deployment, policy, clock)
    return [r.record() for r in reqs]


# -- a simulation driven by a scheduling-step function -------------------------------------------
def run_with_step(requests: Sequence[Request], deployment=None,
                  step: Callable[..., StepPlan] = chunked_step, *, budget: int | None = CHUNK_BUDGET,
                  max_running: int = MAX_RUNNING) -> list[RequestRecord]:
    """Serve a trace with the chunked (``budget=256``) or paged (``budget=None``) policy, asking
    ``step(running, queue, deployment, budget=budget, max_running=max_running)`` for every
    iteration's decision: running is [(filled, prompt + generated)] in admission order, queue
    [(prompt, generated)] head first (see ``chunked_step`` and the ``StepPlan`` it returns).

    The same loop as ``run_reference`` with the step in place of rules 1-3: use it on small
    traces to watch a scheduling step (yours, in the lab) drive the whole simulation. With the
    default ``chunked_step`` it gives the records of ``run_trace(requests, "chunked", deployment)``.
    ``step`` may return a StepPlan or a 4-tuple with lists (see ``as_plan``).

    Raises: as ``run_trace``; TypeError for a malformed plan; ValueError when ``step`` returns
    an inconsistent one (the message says which rule of a plan it breaks).
    """
    deployment = resolve_deployment(deployment)
    trace = check_trace(requests)
    reqs = [_Request(r) for r in trace]
    clock = _Clock(iteration_limit(trace), "step-driven")
    for queue, running in _iterations(reqs, clock):
        plan = as_plan(step([(r.filled, r.target) for r in running], [(r.prompt, r.generated) for r in queue],
                            deployment, budget=budget, max_running=max_running))
        if not 0 <= plan.admitted <= len(queue):
            raise ValueError(f"step admitted {plan.admitted} requests but {len(queue)} are queued")
        for _ in range(plan.admitted):
            r = queue.popleft()
            r.filled = 0
            running.append(r)
        _check_plan(plan, running)
        chunks = [(running[i], k) for i, k in plan.chunks]
        _evict(running, queue, plan.preempted)
        end = clock.run(iteration_time([], [(k, r.filled) for r, k in chunks], deployment))
        _stamp(chunks, end)
        _retire(running)
    return [r.record() for r in reqs]


def _check_plan(plan: StepPlan, running: list[_Request]) -> None:
    """Refuse a plan that evicts everyone or out of range, plans a separate decode, names a
    request twice or evicted, or a chunk that is not 1..remaining."""
    victims = plan.preempted
    if len(set(victims)) != len(victims) or any(not 0 <= i < len(running) for i in victims):
        raise ValueError(f"step preempted {list(victims)}: expected distinct indices into the "
                         f"{len(running)} running requests (after admission)")
    if len(victims) >= len(running):
        raise ValueError(f"step preempted all {len(running)} running requests: at least one must keep running "
                         "(a request that cannot run alone can never be served)")
    if plan.decodes:
        raise ValueError(f"step planned decodes {list(plan.decodes)}: every running request is below its target "
                         "(prompt + tokens generated), so a decode is a one-position chunk (index, 1) that "
                         "takes one position of the budget")
    seen = set(victims)
    for entry in plan.chunks:
        i, k = entry
        if not 0 <= i < len(running) or i in seen or not 1 <= k <= running[i].target - running[i].filled:
            raise ValueError(f"step planned chunk {entry!r}: index must name a request among the "
                             f"{len(running)} left running, once, and k must be 1..its remaining positions")
        seen.add(i)
    if not plan.chunks:
        raise ValueError("step planned an empty iteration (no chunk)")
