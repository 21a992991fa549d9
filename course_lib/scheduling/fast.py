"""The fast path of the Lab 3 serving simulator: ``reference.py``'s simulation, bit for bit.

Read ``reference.py`` first: it defines the policies one loop pass per iteration. This
module makes the same decisions in the same order and does the same float operations, so the
token timestamps are identical (the tests compare them with ``np.array_equal`` on many
seeded traces), but it avoids the two costs of the plain loop:

- Totals are running integers. A request that decodes stores ``dbase = context -
  iterations`` and ``gbase = generated - iterations``, so the contexts of all n_dec decoding
  requests sum to ``dsum + n_dec * iterations`` and nothing sums over the running list per
  iteration. Decoding requests are always the oldest running ones (a prefill cannot finish
  before an older one: the budget is walked in admission order), so they take the first
  n_dec positions of the budget and the prefilling requests share what is left.
- Stretches run at once. After an ordinary iteration the simulator looks for iterations in
  which nothing can be admitted, nothing finishes except possibly at the last one, nothing is
  preempted, and the only prefill chunk is the oldest prefilling request's (all the budget
  the decodes leave, without completing its prefill). In a stretch every integer total is
  linear in the iteration index, so its iteration times come from one call of
  ``cost.iteration_seconds`` on numpy arrays of the totals, and the clock is their running sum
  (``np.add.accumulate`` adds left to right, like the loop). A stretch ends before the first
  iteration that would start at or after the next arrival (only when the queue is empty:
  behind a head that cannot be admitted an arrival changes nothing), at the first finish,
  before the first iteration whose growth would overflow memory, and before the chunk that
  completes a prefill. Token timestamps are index ranges into one array of iteration ends.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque

import numpy as np

from .cost import Deployment, iteration_seconds
from .reference import overrun
from .step import (CHUNK_BUDGET, MAX_RUNNING, STATIC_BATCH, STATIC_WAIT, RequestTooLargeError, admit_limit,
                   static_batch, static_head_too_large)
from .workload import MAX_OUTPUT, Request, RequestRecord

__all__ = ["run_fast"]

#: Stretches shorter than this are stepped in Python (numpy's call overhead is larger).
_NUMPY_STRETCH = 12


class _Seq:
    """Mutable state of one request during a simulation."""

    __slots__ = ("arrival", "prompt", "output", "generated", "filled", "dbase", "gbase", "start", "uid",
                 "segments", "preemptions")

    def __init__(self, r: Request):
        self.arrival, self.prompt, self.output = r.arrival, r.prompt, r.output
        self.generated = 0       # tokens emitted (exact while prefilling or waiting)
        self.filled = 0          # cached positions (exact while prefilling or waiting)
        self.dbase = 0           # while decoding: context = dbase + iterations done
        self.gbase = 0           # while decoding: generated = gbase + iterations done
        self.start = -1          # while decoding: index of the iteration of its current first token; else -1
        self.uid = -1            # key of its live entry in the finish heap
        self.segments = []       # (first iteration index, tokens) per run of consecutive tokens
        self.preemptions = 0

    def remaining(self) -> int:
        """Positions left before its next token (exact while prefilling): prompt + generated - filled."""
        return self.prompt + self.generated - self.filled


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


def _stretch(tl: _Timeline, m: int, deployment: Deployment, stop_at: float | None, *, positions: int,
             attention: int, attention_step: int, context: int, context_step: int) -> int:
    """Run up to ``m`` iterations whose j-th has the given positions, attention + attention_step * j
    and context + context_step * j; stop before one that would start at or after ``stop_at``.
    Returns the number of iterations run (>= 1)."""
    last_attention, last_context = attention + attention_step * (m - 1), context + context_step * (m - 1)
    d = deployment
    kv = d.kv_bytes_per_token
    exact = (all(isinstance(v, int) for v in (d.n_matmul, d.n_layers, d.attention_width))
             and 4 * d.n_layers * d.attention_width * last_attention + 2 * d.n_matmul * positions <= 2 ** 62
             and last_context * (kv if isinstance(kv, int) else 1) <= 2 ** 62)
    if m < _NUMPY_STRETCH or not exact:   # short, or integers int64 could not hold exactly: one at a time
        for j in range(m):
            if j and stop_at is not None and tl.clock >= stop_at:
                return j
            tl.step(iteration_seconds(positions=positions, attention=attention + attention_step * j,
                                      context=context + context_step * j, deployment=deployment))
        return m
    j = np.arange(m, dtype=np.int64)
    times = iteration_seconds(positions=positions, attention=attention + attention_step * j,
                              context=context + context_step * j, deployment=deployment)
    ends = np.add.accumulate(np.concatenate(([tl.clock], times)))[1:]
    if stop_at is not None:
        m = 1 + int(np.searchsorted(ends[:-1], stop_at, side="left"))
        ends = ends[:m]
    tl.extend(ends)
    return m


# -- static batching -----------------------------------------------------------------------------
def _serve_static(seqs: list[_Seq], deployment: Deployment, limit: int, check_memory: bool) -> _Timeline:
    tl = _Timeline()
    kv_limit = admit_limit(deployment) if check_memory else None
    n, nxt, done, passes = len(seqs), 0, 0, 0
    queue: deque[_Seq] = deque()
    while done < n:
        passes += 1
        if passes > limit or tl.count > limit:
            raise overrun(limit, "static")
        while nxt < n and seqs[nxt].arrival <= tl.clock:
            queue.append(seqs[nxt])
            nxt += 1
        if not queue:
            tl.clock = seqs[nxt].arrival
            continue
        size = static_batch([s.prompt for s in itertools.islice(queue, STATIC_BATCH)], limit=kv_limit)
        deadline = queue[0].arrival + STATIC_WAIT
        if size == len(queue) < STATIC_BATCH and tl.clock < deadline:
            tl.clock = min(deadline, seqs[nxt].arrival) if nxt < n else deadline
            continue
        if size == 0:
            raise static_head_too_large(queue[0].arrival, queue[0].prompt, kv_limit)
        batch = [queue.popleft() for _ in range(size)]
        # one iteration prefills every prompt: chunks (prompt, 0)
        positions = sum(s.prompt for s in batch)
        tl.step(iteration_seconds(positions=positions, attention=sum(s.prompt * (s.prompt + 1) // 2 for s in batch),
                                  context=0, deployment=deployment))
        for s in batch:
            s.segments.append((tl.count - 1, s.output))
            s.generated, s.filled = s.output, s.prompt + s.output - 1
        # then every slot decodes (finished ones too; the decodes term: attention c) until the longest is done
        remaining, contexts = max(s.output for s in batch) - 1, positions
        while remaining > 0:
            ran = _stretch(tl, remaining, deployment, None, positions=len(batch), attention=contexts,
                           attention_step=len(batch), context=contexts, context_step=len(batch))
            remaining -= ran
            contexts += len(batch) * ran
        done += len(batch)
    return tl


# -- continuous batching: reserve, paged, chunked ------------------------------------------------
class _Continuous:
    """One continuous-batching simulation; its methods are the rules of ``step.py`` on running totals."""

    def __init__(self, seqs: list[_Seq], deployment: Deployment, policy: str, limit: int):
        if MAX_RUNNING > CHUNK_BUDGET:
            raise RuntimeError("the fast path assumes every decoding request fits in the chunk budget "
                               f"(MAX_RUNNING {MAX_RUNNING} <= CHUNK_BUDGET {CHUNK_BUDGET})")
        self.seqs, self.deployment, self.policy, self.limit = seqs, deployment, policy, limit
        self.reserve = policy == "reserve"
        self.budget = CHUNK_BUDGET if policy == "chunked" else None
        self.capacity, self.admit_limit = deployment.kv_tokens, admit_limit(deployment)
        self.tl = _Timeline()
        self.nxt = self.done = self.passes = 0
        self.queue: deque[_Seq] = deque()
        self.running: list[_Seq] = []      # admission order: the decoding ones first
        self.prefilling: list[_Seq] = []   # the running requests with prefill remaining, admission order
        self.n_dec = self.dsum = 0         # decoding requests; their contexts sum to dsum + n_dec * tl.count
        self.s_pref = 0                    # cached positions of the prefilling requests
        self.reserved = 0                  # sum of prompt + MAX_OUTPUT over running (the reserve charge)
        self.finish_heap: list[tuple[int, int, _Seq]] = []   # (iteration index of last token, uid, request)
        self.uid = self.preemptions = 0

    # -- totals
    def decode_contexts(self) -> int:
        return self.dsum + self.n_dec * self.tl.count

    def charge(self, s: _Seq) -> int:
        return s.prompt + MAX_OUTPUT if self.reserve else s.prompt + s.generated

    def used(self) -> int:
        return self.reserved if self.reserve else self.decode_contexts() + self.s_pref

    def arrivals(self) -> None:
        while self.nxt < len(self.seqs) and self.seqs[self.nxt].arrival <= self.tl.clock:
            self.queue.append(self.seqs[self.nxt])
            self.nxt += 1

    # -- rule 1: admission
    def admit(self) -> None:
        in_use = self.used()
        while self.queue and len(self.running) < MAX_RUNNING:
            s = self.queue[0]
            cost = self.charge(s)
            if in_use + cost > self.admit_limit:
                break
            self.queue.popleft()
            in_use += cost
            s.filled = 0
            self.running.append(s)
            self.prefilling.append(s)
            self.reserved += s.prompt + MAX_OUTPUT
        if not self.running:
            s = self.queue[0]
            raise RequestTooLargeError(
                f"a request (arrival {s.arrival:.6g} s, prompt {s.prompt}, {s.generated} tokens generated) "
                f"needs {self.charge(s)} cached positions but the {self.policy} policy admits at most "
                f"{self.admit_limit} (0.99 * kv_budget / kv_bytes_per_token) with nothing else running: it "
                "can never be served on this deployment")

    # -- rule 2: chunk planning (each decode is a one-position chunk, before every prefill chunk)
    def plan(self) -> list[tuple[_Seq, int]]:
        left = None if self.budget is None else self.budget - self.n_dec
        chunks = []
        for s in self.prefilling:
            k = s.remaining() if left is None else min(s.remaining(), left)
            if k <= 0:
                break  # budget spent: this and every later prefilling request waits
            chunks.append((s, k))
            if left is not None:
                left -= k
        return chunks

    # -- rule 3: preemption of the newest while the growth would overflow memory
    def preempt(self, chunks: list[tuple[_Seq, int]]) -> None:
        total = self.decode_contexts() + self.s_pref
        chunk_tokens = sum(k for _, k in chunks)
        while total + self.n_dec + chunk_tokens > self.capacity:
            if len(self.running) == 1:
                s = self.running[0]
                raise RequestTooLargeError(
                    f"a request (arrival {s.arrival:.6g} s, prompt {s.prompt}, output {s.output}) running alone "
                    f"would outgrow the KV budget of {self.capacity} positions: it can never finish on this "
                    "deployment")
            victim = self.running.pop()
            if victim.start >= 0:  # decoding (then nothing prefills: the newest would be prefilling)
                context = victim.dbase + self.tl.count
                victim.segments.append((victim.start, self.tl.count - victim.start))
                victim.generated = victim.gbase + self.tl.count
                self.dsum -= victim.dbase
                self.n_dec -= 1
                victim.start, victim.uid = -1, -1
            else:  # prefilling: the newest prefilling request, so its chunk (if any) is the last one
                context = victim.filled
                self.prefilling.pop()
                self.s_pref -= victim.filled
                if chunks and chunks[-1][0] is victim:
                    chunk_tokens -= chunks.pop()[1]
            total -= context
            victim.filled = 0
            self.reserved -= victim.prompt + MAX_OUTPUT
            victim.preemptions += 1
            self.preemptions += 1
            self.queue.appendleft(victim)

    # -- the iteration
    def run(self, chunks: list[tuple[_Seq, int]]) -> None:
        contexts = self.decode_contexts()
        attention, context = contexts + self.n_dec, contexts   # a decode: chunk (1, c), attention c + 1
        for s, k in chunks:
            attention += k * s.filled + k * (k + 1) // 2
            context += s.filled
        positions = self.n_dec + sum(k for _, k in chunks)
        self.tl.step(iteration_seconds(positions=positions, attention=attention, context=context,
                                       deployment=self.deployment))

    # -- rule 4: stamping (each decode's token is implied by its dbase/gbase; prefills are stamped here)
    def stamp(self, chunks: list[tuple[_Seq, int]]) -> None:
        it = self.tl.count
        for s, k in chunks:
            s.filled += k
            self.s_pref += k
            if s.remaining() == 0:  # prefill complete: the chunk emits a token and the request decodes
                self.prefilling.remove(s)
                self.s_pref -= s.filled
                s.generated += 1
                s.start = it - 1
                s.dbase, s.gbase = s.filled - it, s.generated - it
                self.dsum += s.dbase
                self.n_dec += 1
                self.uid += 1
                s.uid = self.uid
                heapq.heappush(self.finish_heap, (s.output - s.gbase - 1, self.uid, s))

    def retire(self) -> None:
        """Requests whose last token came in an iteration run so far leave."""
        heap, count = self.finish_heap, self.tl.count
        while heap and heap[0][0] < count:
            last, key, s = heapq.heappop(heap)
            if s.uid != key:
                continue  # stale: preempted since
            s.segments.append((s.start, last - s.start + 1))
            s.generated, s.filled = s.output, s.dbase + count
            s.start = s.uid = -1
            self.running.remove(s)
            self.dsum -= s.dbase
            self.n_dec -= 1
            self.reserved -= s.prompt + MAX_OUTPUT
            self.done += 1

    # -- many iterations of one shape at once
    def stretch(self) -> bool:
        """Run a stretch (module docstring) if the next iteration starts one; False if it does not."""
        self.arrivals()
        stop_at = None
        if self.queue:
            if len(self.running) < MAX_RUNNING and self.used() + self.charge(self.queue[0]) <= self.admit_limit:
                return False  # the queue head is admitted next iteration
        elif self.nxt < len(self.seqs):
            stop_at = self.seqs[self.nxt].arrival
        head = self.prefilling[0] if self.prefilling else None
        if head is not None:
            if self.budget is None:
                return False  # the next chunk completes a prefill
            k = self.budget - self.n_dec
            if k <= 0 or head.remaining() <= k:
                return False  # the head waits, or its next chunk completes its prefill
            c0, m = head.filled, (head.remaining() - 1) // k
        else:
            k, c0, m = 0, 0, self.limit
        total = self.decode_contexts() + self.s_pref
        m = min(m, (self.capacity - total) // (self.n_dec + k))
        heap = self.finish_heap
        while heap and heap[0][2].uid != heap[0][1]:
            heapq.heappop(heap)
        if heap:
            m = min(m, heap[0][0] - self.tl.count + 1)
        if m <= 0:
            return False
        contexts = self.decode_contexts()
        shape = dict(positions=self.n_dec + k, attention=contexts + self.n_dec + k * c0 + k * (k + 1) // 2,
                     attention_step=self.n_dec + k * k, context=contexts + c0, context_step=self.n_dec + k)
        if stop_at is not None:
            first = iteration_seconds(positions=shape["positions"], attention=shape["attention"],
                                      context=shape["context"], deployment=self.deployment)
            m = min(m, int((stop_at - self.tl.clock) / first) + 2)
        ran = _stretch(self.tl, m, self.deployment, stop_at, **shape)
        self.passes += 1
        if k:
            head.filled += k * ran
            self.s_pref += k * ran
        return True

    def serve(self) -> _Timeline:
        n = len(self.seqs)
        while self.done < n:
            self.passes += 1
            if self.passes > self.limit or self.tl.count > self.limit:
                raise overrun(self.limit, self.policy)
            self.arrivals()
            if not self.running and not self.queue:
                self.tl.clock = self.seqs[self.nxt].arrival
                continue
            self.admit()
            chunks = self.plan()
            self.preempt(chunks)
            self.run(chunks)
            self.stamp(chunks)
            self.retire()
            while self.done < n and self.running:
                if self.tl.count > self.limit:
                    raise overrun(self.limit, self.policy)
                if not self.stretch():
                    break
                self.retire()
        return self.tl


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


def run_fast(trace: list[Request], policy: str, deployment: Deployment, limit: int) -> list[RequestRecord]:
    """``reference.run_reference`` on checked inputs (a list of ``Request`` in arrival order, a
    policy in ``POLICIES``, a ``Deployment``, the iteration limit), from running totals and stretches."""
    seqs = [_Seq(r) for r in trace]
    if policy in ("static", "static-checked"):
        tl = _serve_static(seqs, deployment, limit, policy == "static-checked")
    else:
        tl = _Continuous(seqs, deployment, policy, limit).serve()
    return _records(seqs, tl.array())
