"""A fast, deterministic serving simulator for course "Lab 3: scheduling".

Four policies serve one trace of requests on one ``Device`` (COURSE_SPEC "Lab 3" and the
Lab 3 issue's "Exact semantics"); each iteration's time comes from ``cost.iteration_time``'s
formula:

- ``static``: when nothing runs, wait until 16 requests are queued or the oldest has
  waited 2 s; prefill the (up to) 16 prompts in one iteration, then decode all 16 slots
  until the longest output is done (finished slots keep decoding; no memory check).
- ``reserve``: continuous batching, FIFO admission of up to 256 sequences, each charged
  prompt + 4,000 positions against 0.99 of the KV budget; whole prompts prefilled at once.
- ``paged``: like reserve, but charged what it uses (current contexts, plus the required
  prefill of a joining request); preempts the newest request when growth would overflow.
- ``chunked``: paged admission plus at most 256 new prefill positions per iteration.

A request's first token is stamped when its prefill completes, every later token at the
end of the iteration that decodes it. A preempted request keeps its timestamps, loses its
cache and later re-prefills its prompt plus the tokens it had generated.

How it is fast (and still the per-iteration semantics, to the bit). Totals are kept as
running integers: the sum of decoding contexts is ``dsum + n_dec * iterations`` (each
decoding request stores ``dbase = context - iterations``), so nothing sums over the running
list per iteration. After each ordinary iteration the simulator looks for a *stretch*:
iterations in which nothing can be admitted, nothing finishes except possibly at the last
one, nothing is preempted, and the only prefill (chunked policy) is one full 256-token
chunk of the oldest prefilling request. In a stretch every integer total is linear in the
iteration index, so all its iteration times are computed at once with numpy using the same
float operations as ``iteration_time``, and the clock is their sequential running sum
(``np.add.accumulate`` adds left to right, like the per-iteration loop). The stretch ends
before the first iteration that would start at or after the next arrival (only when the
queue is empty: behind an inadmissible head an arrival changes nothing), at the first
finish, before the first iteration whose growth would overflow memory, and before the
chunk that completes a prefill. Token timestamps are stored as index ranges into one array
of iteration end times.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Sequence

import numpy as np

from .cost import Device, DeviceProfile, PROFILES, _seconds
from .step import (CHUNK_BUDGET, MAX_RUNNING, STATIC_BATCH, STATIC_WAIT, RequestTooLargeError, StepPlan,
                   _admit_limit, as_plan, chunked_step)
from .metrics import metrics
from .workload import MAX_OUTPUT, Request, RequestRecord, make_workload

__all__ = ["POLICIES", "RequestRecord", "run_trace", "run_with_step", "simulate", "resolve_device"]

#: The policies, in the order the lab sweeps them.
POLICIES: tuple[str, ...] = ("static", "reserve", "paged", "chunked")

#: Stretches shorter than this are stepped in Python (numpy's call overhead is larger).
_NUMPY_STRETCH = 12


def resolve_device(device) -> Device:
    """None -> ``Device()``; a ``Device`` as is; a ``DeviceProfile`` or a name in ``PROFILES`` -> its device.

    Raises: ValueError for an unknown profile name; TypeError for any other type."""
    if device is None:
        return Device()
    if isinstance(device, Device):
        return device
    if isinstance(device, DeviceProfile):
        return device.device
    if isinstance(device, str):
        if device in PROFILES:
            return PROFILES[device].device
        raise ValueError(f"device {device!r} is not a profile name; known: {', '.join(PROFILES)}")
    raise TypeError(f"device must be a Device, a DeviceProfile, a name in PROFILES or None, got "
                    f"{type(device).__qualname__}")


def _policy(policy) -> str:
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(repr(p) for p in POLICIES)}; got {policy!r}")
    return policy


def _requests(requests) -> list[Request]:
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


def _iteration_limit(requests: list[Request]) -> int:
    """A generous bound on iterations (and scheduler passes): every iteration makes progress on
    at least one position of some request, and re-prefills after preemption at most repeat it."""
    return 50 * sum(r.prompt + r.output for r in requests) + 10_000


def _overrun(limit: int, policy: str) -> RuntimeError:
    return RuntimeError(f"the {policy} simulation did not finish within {limit:,} iterations; "
                        "the scheduler is not making progress (a livelock), please report this trace")


class _Seq:
    """Mutable state of one request during a simulation."""

    __slots__ = ("arrival", "prompt", "output", "generated", "filled", "target", "dbase", "gbase",
                 "start", "uid", "segments", "preemptions")

    def __init__(self, r: Request):
        self.arrival, self.prompt, self.output = r.arrival, r.prompt, r.output
        self.generated = 0       # tokens emitted (exact while prefilling or waiting)
        self.filled = 0          # cached positions (exact while prefilling or waiting)
        self.target = 0          # prefill length fixed at admission: prompt + generated then
        self.dbase = 0           # while decoding: context = dbase + iterations done
        self.gbase = 0           # while decoding: generated = gbase + iterations done
        self.start = -1          # while decoding: index of the iteration of its current first token; else -1
        self.uid = -1            # key of its live entry in the finish heap
        self.segments = []       # (first iteration index, tokens) per run of consecutive tokens
        self.preemptions = 0


class _Timeline:
    """The clock and the end time of every iteration (a list of numpy pieces plus a pending list)."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.count = 0
        self._pieces: list[np.ndarray] = []
        self._pending: list[float] = []

    def step(self, seconds: float) -> None:
        self.clock += seconds
        self._pending.append(self.clock)
        self.count += 1

    def extend(self, ends: np.ndarray) -> None:
        if self._pending:
            self._pieces.append(np.array(self._pending))
            self._pending = []
        self._pieces.append(ends)
        self.count += len(ends)
        self.clock = float(ends[-1])

    def array(self) -> np.ndarray:
        if self._pending:
            self._pieces.append(np.array(self._pending))
            self._pending = []
        ends = np.concatenate(self._pieces) if self._pieces else np.zeros(0)
        ends.flags.writeable = False
        return ends


def _stretch(tl: _Timeline, m: int, n_dec: int, s0: int, k: int, c0: int, device: Device,
             stop_at: float | None) -> int:
    """Run up to ``m`` iterations of n_dec decodes (contexts summing to s0 + n_dec*j) plus, when
    k > 0, one chunk of k new tokens at c0 + k*j cached ones; stop before an iteration that
    would start at or after ``stop_at``. Returns the number of iterations run (>= 1)."""
    if m < _NUMPY_STRETCH:
        return _stretch_python(tl, m, n_dec, s0, k, c0, device, stop_at)
    positions, tri = n_dec + k, k * (k + 1) // 2
    last_s, last_c = s0 + n_dec * (m - 1), c0 + k * (m - 1)
    last_att, last_ctx = last_s + k * last_c + tri, last_s + last_c
    ints = all(isinstance(v, int) for v in (device.n_matmul, device.n_layers, device.d_model))
    if not ints or 4 * device.n_layers * device.d_model * last_att + 2 * device.n_matmul * positions > 2 ** 62 \
            or last_ctx * (device.kv if isinstance(device.kv, int) else 1) > 2 ** 62:
        # integers that numpy's int64 could not hold exactly: take the per-iteration path
        return _stretch_python(tl, m, n_dec, s0, k, c0, device, stop_at)
    j = np.arange(m, dtype=np.int64)
    s = s0 + n_dec * j
    if k:
        c = c0 + k * j
        attention = s + (k * c + tri)
        context = s + c
    else:
        attention = context = s
    # the same operations, in the same order, as cost._seconds
    memory_s = (device.weights + device.kv * context) / device.bandwidth
    compute_s = (2 * device.n_matmul * positions + 4 * device.n_layers * device.d_model * attention) / device.compute
    times = np.maximum(memory_s, compute_s)
    ends = np.add.accumulate(np.concatenate(([tl.clock], times)))[1:]
    if stop_at is not None:
        m = 1 + int(np.searchsorted(ends[:-1], stop_at, side="left"))
        ends = ends[:m]
    tl.extend(ends)
    return m


def _stretch_python(tl, m, n_dec, s0, k, c0, device, stop_at) -> int:
    positions, tri = n_dec + k, k * (k + 1) // 2
    for j in range(m):
        if j and stop_at is not None and tl.clock >= stop_at:
            return j
        s, c = s0 + n_dec * j, c0 + k * j
        tl.step(_seconds(positions, s + k * c + tri, s + c, device))
    return m


# -- static batching ---------------------------------------------------------------------------
def _run_static(seqs: list[_Seq], device: Device, limit: int) -> _Timeline:
    tl = _Timeline()
    n, nxt, done, passes = len(seqs), 0, 0, 0
    queue: deque[_Seq] = deque()
    while done < n:
        passes += 1
        if passes > limit or tl.count > limit:
            raise _overrun(limit, "static")
        while nxt < n and seqs[nxt].arrival <= tl.clock:
            queue.append(seqs[nxt])
            nxt += 1
        if not queue:
            tl.clock = seqs[nxt].arrival
            continue
        deadline = queue[0].arrival + STATIC_WAIT
        if len(queue) < STATIC_BATCH and tl.clock < deadline:
            tl.clock = min(deadline, seqs[nxt].arrival) if nxt < n else deadline
            continue
        batch = [queue.popleft() for _ in range(min(STATIC_BATCH, len(queue)))]
        # one iteration prefills every prompt: chunks (prompt, 0)
        positions = sum(s.prompt for s in batch)
        attention = sum(s.prompt * (s.prompt + 1) // 2 for s in batch)
        tl.step(_seconds(positions, attention, 0, device))
        for s in batch:
            s.segments.append((tl.count - 1, s.output))
            s.generated, s.filled = s.output, s.prompt + s.output - 1
        # then every slot decodes (finished ones too) until the longest output is done
        remaining = max(s.output for s in batch) - 1
        s0 = positions
        while remaining > 0:
            ran = _stretch(tl, remaining, len(batch), s0, 0, 0, device, None)
            remaining -= ran
            s0 += len(batch) * ran
        done += len(batch)
    return tl


# -- continuous batching: reserve, paged, chunked -----------------------------------------------
def _run_continuous(seqs: list[_Seq], device: Device, policy: str, limit: int) -> tuple[_Timeline, int]:
    reserve = policy == "reserve"
    budget = CHUNK_BUDGET if policy == "chunked" else None
    capacity, admit_limit = device.kv_tokens, _admit_limit(device)
    tl = _Timeline()
    n, nxt, done, passes = len(seqs), 0, 0, 0
    queue: deque[_Seq] = deque()
    running: list[_Seq] = []      # admission order
    prefilling: list[_Seq] = []   # the running requests with prefill remaining, admission order
    n_dec = dsum = 0              # decoding requests; their contexts sum to dsum + n_dec * tl.count
    s_pref = 0                    # cached positions of the prefilling requests
    reserved = 0                  # sum of prompt + MAX_OUTPUT over running (the reserve charge)
    finish_heap: list[tuple[int, int, _Seq]] = []   # (iteration index of last token, uid, request)
    uid = preemptions = 0

    def charge(s: _Seq) -> int:
        return s.prompt + MAX_OUTPUT if reserve else s.prompt + s.generated

    def used() -> int:
        return reserved if reserve else dsum + n_dec * tl.count + s_pref

    def arrivals() -> None:
        nonlocal nxt
        while nxt < n and seqs[nxt].arrival <= tl.clock:
            queue.append(seqs[nxt])
            nxt += 1

    while done < n:
        passes += 1
        if passes > limit or tl.count > limit:
            raise _overrun(limit, policy)
        arrivals()
        if not running and not queue:
            tl.clock = seqs[nxt].arrival
            continue

        # admission: FIFO from the queue head against 0.99 of memory
        in_use = used()
        while queue and len(running) < MAX_RUNNING:
            s = queue[0]
            cost = charge(s)
            if in_use + cost > admit_limit:
                break
            queue.popleft()
            in_use += cost
            s.target, s.filled = s.prompt + s.generated, 0
            running.append(s)
            prefilling.append(s)
            reserved += s.prompt + MAX_OUTPUT
        if not running:
            s = queue[0]
            raise RequestTooLargeError(
                f"a request (arrival {s.arrival:.6g} s, prompt {s.prompt}, {s.generated} tokens generated) "
                f"needs {charge(s)} cached positions but the {policy} policy admits at most {admit_limit} "
                f"(0.99 * memory / kv) with nothing else running: it can never be served on this device")

        # plan: prefill chunks in admission order within the budget; everything else decodes
        chunks: list[tuple[_Seq, int]] = []
        chunk_tokens, left = 0, budget
        for s in prefilling:
            k = s.target - s.filled if left is None else min(s.target - s.filled, left)
            if k <= 0:
                break  # budget spent: this and every later prefilling request waits (a chunk of 0 is skipped)
            chunks.append((s, k))
            chunk_tokens += k
            if left is not None:
                left -= k
        # preempt the newest while this iteration's growth would overflow memory (re-plan = drop its part)
        total = dsum + n_dec * tl.count + s_pref
        while total + n_dec + chunk_tokens > capacity:
            if len(running) == 1:
                s = running[0]
                raise RequestTooLargeError(
                    f"a request (arrival {s.arrival:.6g} s, prompt {s.prompt}, output {s.output}) running alone "
                    f"would outgrow the KV budget of {capacity} positions: it can never finish on this device")
            victim = running.pop()
            if victim.start >= 0:  # decoding
                context = victim.dbase + tl.count
                victim.segments.append((victim.start, tl.count - victim.start))
                victim.generated = victim.gbase + tl.count
                dsum -= victim.dbase
                n_dec -= 1
                victim.start, victim.uid = -1, -1
            else:  # prefilling: the newest prefilling request, so its chunk (if any) is the last one
                context = victim.filled
                prefilling.pop()
                s_pref -= victim.filled
                if chunks and chunks[-1][0] is victim:
                    chunk_tokens -= chunks.pop()[1]
            total -= context
            victim.filled = 0
            reserved -= victim.prompt + MAX_OUTPUT
            victim.preemptions += 1
            preemptions += 1
            queue.appendleft(victim)

        # run the iteration
        sdec = dsum + n_dec * tl.count
        attention = context = sdec
        for s, k in chunks:
            attention += k * s.filled + k * (k + 1) // 2
            context += s.filled
        tl.step(_seconds(n_dec + chunk_tokens, attention, context, device))
        it = tl.count
        for s, k in chunks:
            s.filled += k
            s_pref += k
            if s.filled == s.target:  # prefill complete: the chunk emits a token
                prefilling.remove(s)
                s_pref -= s.filled
                s.generated += 1
                s.start = it - 1
                s.dbase, s.gbase = s.target - it, s.generated - it
                dsum += s.dbase
                n_dec += 1
                uid += 1
                s.uid = uid
                heapq.heappush(finish_heap, (s.output - s.gbase - 1, uid, s))

        # finished requests leave; then try to run a stretch of identical-shape iterations
        while True:
            while finish_heap and finish_heap[0][0] < tl.count:
                last, key, s = heapq.heappop(finish_heap)
                if s.uid != key:
                    continue  # stale: preempted since
                s.segments.append((s.start, last - s.start + 1))
                s.generated, s.filled = s.output, s.dbase + tl.count
                s.start = s.uid = -1
                running.remove(s)
                dsum -= s.dbase
                n_dec -= 1
                reserved -= s.prompt + MAX_OUTPUT
                done += 1
            if done == n or not running:
                break
            if tl.count > limit:
                raise _overrun(limit, policy)
            arrivals()
            stop_at = None
            if queue:
                if len(running) < MAX_RUNNING and used() + charge(queue[0]) <= admit_limit:
                    break  # the queue head is admitted next iteration
            elif nxt < n:
                stop_at = seqs[nxt].arrival
            if prefilling:
                head = prefilling[0]
                if budget is None or head.target - head.filled <= budget:
                    break  # the next chunk completes a prefill
                k, c0, m = budget, head.filled, (head.target - head.filled - 1) // budget
            else:
                k, c0, m = 0, 0, limit
            total = dsum + n_dec * tl.count + s_pref
            m = min(m, (capacity - total) // (n_dec + k))
            while finish_heap and finish_heap[0][2].uid != finish_heap[0][1]:
                heapq.heappop(finish_heap)
            if finish_heap:
                m = min(m, finish_heap[0][0] - tl.count + 1)
            if m <= 0:
                break
            if stop_at is not None:
                s0 = dsum + n_dec * tl.count
                first = _seconds(n_dec + k, s0 + k * c0 + k * (k + 1) // 2, s0 + c0, device)
                m = min(m, int((stop_at - tl.clock) / first) + 2)
            ran = _stretch(tl, m, n_dec, dsum + n_dec * tl.count, k, c0, device, stop_at)
            passes += 1
            if k:
                head.filled += k * ran
                s_pref += k * ran
    return tl, preemptions


def _records(seqs: list[_Seq], ends: np.ndarray) -> list[RequestRecord]:
    records = []
    for s in seqs:
        parts = [ends[start:start + count] for start, count in s.segments]
        times = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if len(times) != s.output:
            raise RuntimeError(f"internal error: a request got {len(times)} token times for {s.output} tokens")
        times.flags.writeable = False
        records.append(RequestRecord(s.arrival, s.prompt, s.output, times, s.preemptions))
    return records


def run_trace(requests: Sequence[Request], policy: str, device=None) -> list[RequestRecord]:
    """Serve an explicit trace with one policy and return what happened to each request.

    Args:
        requests: ``Request`` objects (or (arrival, prompt, output) triples) in arrival order.
        policy: "static", "reserve", "paged" or "chunked" (module docstring; COURSE_SPEC "Lab 3").
        device: a ``Device``, a ``DeviceProfile``, a name in ``PROFILES``, or None (``Device()``).

    Returns:
        one ``RequestRecord`` per request, in the input order (token times in seconds).

    Raises:
        ValueError: an unknown policy (the message lists the valid ones); an empty or unsorted
            trace; ``RequestTooLargeError`` (a ValueError) when a request can never be served.
        TypeError: a request or device of the wrong type.
        RuntimeError: the iteration bound was exceeded (a scheduler that makes no progress).
    """
    policy = _policy(policy)
    device = resolve_device(device)
    reqs = _requests(requests)
    seqs = [_Seq(r) for r in reqs]
    limit = _iteration_limit(reqs)
    if policy == "static":
        tl = _run_static(seqs, device, limit)
    else:
        tl, _ = _run_continuous(seqs, device, policy, limit)
    return _records(seqs, tl.array())


def simulate(rate: float, policy: str, device=None, count: int = 300) -> dict:
    """Serve the spec's workload ``make_workload(rate, count)`` with ``policy`` and return its metrics.

    Args:
        rate: nominal arrival rate (requests/s, > 0). policy: one of ``POLICIES``.
        device: as in ``run_trace`` (None: the spec's 24GB-bf16 device). count: requests (>= 1).

    Returns:
        ``metrics(run_trace(...))``: a dict with ttft50, ttft99, itl50, itl99, itlmax, tpot50,
        e2e50 (seconds), throughput (output tokens/s), goodput (requests/s meeting TTFT <= 3 s
        and every gap <= 100 ms), preemptions (int), realised (requests/s).

    Raises: ValueError (unknown policy, bad rate or count), as ``run_trace`` otherwise.
    """
    policy = _policy(policy)
    return metrics(run_trace(make_workload(rate, count), policy, device))


# -- a plain driver for a scheduling-step function ----------------------------------------------
def run_with_step(requests: Sequence[Request], device=None,
                  step: Callable[..., StepPlan] = chunked_step, *, budget: int | None = CHUNK_BUDGET,
                  max_running: int = MAX_RUNNING) -> list[RequestRecord]:
    """Serve a trace with the chunked (``budget=256``) or paged (``budget=None``) policy, asking
    ``step(running, queue, device, budget=budget, max_running=max_running)`` for every
    iteration's decision (see ``chunked_step`` for the arguments and the ``StepPlan`` it returns).

    A plain per-iteration loop, slow but direct: use it on small traces to watch a scheduling
    step (yours, in the lab) drive the whole simulation. With the default ``chunked_step`` it
    gives the same records as ``run_trace(requests, "chunked", device)``.

    ``step`` may return a StepPlan or a 4-tuple with lists (see ``as_plan``).

    Raises: as ``run_trace``; TypeError for a malformed plan; ValueError when ``step`` returns
    an inconsistent one.
    """
    device = resolve_device(device)
    reqs = _requests(requests)
    seqs = [_Seq(r) for r in reqs]
    limit = _iteration_limit(reqs)
    tl = _Timeline()
    queue: deque[_Seq] = deque()
    running: list[_Seq] = []
    n, nxt, done = len(seqs), 0, 0
    tokens: dict[int, list[float]] = {id(s): [] for s in seqs}
    while done < n:
        if tl.count > limit:
            raise _overrun(limit, "step-driven")
        while nxt < n and seqs[nxt].arrival <= tl.clock:
            queue.append(seqs[nxt])
            nxt += 1
        if not running and not queue:
            tl.clock = seqs[nxt].arrival
            continue
        plan = as_plan(step([(s.filled, s.target) for s in running], [(s.prompt, s.generated) for s in queue],
                            device, budget=budget, max_running=max_running))
        if not 0 <= plan.admitted <= len(queue):
            raise ValueError(f"step admitted {plan.admitted} requests but {len(queue)} are queued")
        for _ in range(plan.admitted):
            s = queue.popleft()
            s.target, s.filled = s.prompt + s.generated, 0
            running.append(s)
        victims = plan.preempted
        if len(set(victims)) != len(victims) or any(not 0 <= i < len(running) for i in victims):
            raise ValueError(f"step preempted {list(victims)}: expected distinct indices into the "
                             f"{len(running)} running requests (after admission)")
        if len(victims) >= len(running):
            raise ValueError(f"step preempted all {len(running)} running requests: at least one must keep running "
                             "(a request that cannot run alone can never be served)")
        _check_plan(plan, running, set(victims))
        decodes = [running[i] for i in plan.decodes]
        chunks = [(running[i], k) for i, k in plan.chunks]
        for i in sorted(victims, reverse=True):  # back to the queue head in admission order
            victim = running.pop(i)
            victim.filled = 0
            victim.preemptions += 1
            queue.appendleft(victim)
        tl.step(_iteration_seconds(decodes, chunks, device))
        for s in decodes:
            s.filled += 1
            s.generated += 1
            tokens[id(s)].append(tl.clock)
        for s, k in chunks:
            s.filled += k
            if s.filled == s.target:
                s.generated += 1
                tokens[id(s)].append(tl.clock)
        for s in [s for s in running if s.generated == s.output]:
            running.remove(s)
            done += 1
    records = []
    for s in seqs:
        times = np.array(tokens[id(s)])
        times.flags.writeable = False
        records.append(RequestRecord(s.arrival, s.prompt, s.output, times, s.preemptions))
    return records


def _check_plan(plan: StepPlan, running: list[_Seq], evicted: set[int]) -> None:
    """Refuse a plan that names a request twice, out of range or evicted, or a chunk that is
    not 1..remaining."""
    seen = set(evicted)
    for i in plan.decodes:
        if not (isinstance(i, int) and 0 <= i < len(running)) or i in seen or running[i].filled < running[i].target:
            raise ValueError(f"step planned a decode for running index {i!r}, which is not a decoding request "
                             f"among the {len(running)} left running")
        seen.add(i)
    for entry in plan.chunks:
        i, k = entry
        if not (isinstance(i, int) and 0 <= i < len(running)) or i in seen or not isinstance(k, int) \
                or not 1 <= k <= running[i].target - running[i].filled:
            raise ValueError(f"step planned chunk {entry!r}: index must name a prefilling request among the "
                             f"{len(running)} left running and k must be 1..its remaining prefill")
        seen.add(i)
    if not plan.decodes and not plan.chunks:
        raise ValueError("step planned an empty iteration (no decode, no chunk)")


def _iteration_seconds(decodes: list[_Seq], chunks: list[tuple[_Seq, int]], device: Device) -> float:
    from .cost import iteration_time

    return iteration_time([s.filled for s in decodes], [(k, s.filled) for s, k in chunks], device)
