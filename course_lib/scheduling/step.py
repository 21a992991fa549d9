"""One iteration's scheduling decision of the continuous policies (course "Lab 3: scheduling").

``chunked_step`` is the chunked policy's per-iteration step, written plainly so a reader
(and the Lab 3 exercise) can follow it top to bottom: FIFO admission against 0.99 of the
KV budget, a budget of new prefill positions walked in admission order, and preemption of
the most recently admitted request when the iteration's growth would overflow the budget.
With ``budget=None`` it is the paged policy's step. The simulator (``simulator.py``) makes
the same decisions from running totals instead of lists; tests check the two agree.

Semantics (COURSE_SPEC "Lab 3" and the Lab 3 issue's "Exact semantics"):
- used = sum of running contexts (cached positions); admit from the queue head while fewer
  than ``max_running`` run and (used + cost) * kv <= 0.99 * memory, cost = the request's
  required prefill, prompt + generated (a preempted request re-prefills the tokens it had
  already generated); used += cost; the admitted request's prefill target is that cost;
- nothing running after admission: the queue head cannot fit -> ``RequestTooLargeError``;
- walk running requests in admission order: one with prefill remaining (filled < target)
  gets a chunk of min(remaining, budget left) (a chunk of 0 is skipped: it waits); any other
  request decodes one token;
- if (sum of contexts + this iteration's growth) * kv > memory (all of it, not 0.99),
  preempt the most recently admitted running request (it frees its cache and returns to the
  queue head) and plan again; preempting the last running request means it cannot fit
  -> ``RequestTooLargeError``.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Sequence

from .cost import Device, _max_tokens

__all__ = ["StepPlan", "as_plan", "chunked_step", "RequestTooLargeError", "CHUNK_BUDGET", "MAX_RUNNING",
           "ADMIT_FRACTION", "STATIC_BATCH", "STATIC_WAIT"]

#: New prefill positions per iteration for the chunked policy (tokens).
CHUNK_BUDGET: int = 256
#: Most sequences a continuous policy runs at once.
MAX_RUNNING: int = 256
#: Fraction of the KV budget admission may fill (growth may use all of it).
ADMIT_FRACTION: float = 0.99
#: Static batching: batch size, and the longest the oldest queued request waits (seconds).
STATIC_BATCH: int = 16
STATIC_WAIT: float = 2.0


class RequestTooLargeError(ValueError):
    """A request cannot be served on this device: it cannot be admitted with nothing else
    running, or its context outgrows the KV budget while it runs alone."""


@dataclass(frozen=True)
class StepPlan:
    """What one iteration runs.

    Attributes:
        admitted: how many requests leave the queue head (in order) and join the running
            list, appended after the ones already running, with filled = 0 and target =
            prompt + generated.
        preempted: indices, into the running list after admission, of the evicted requests
            (ascending); they lose their cache and go back to the queue head in their
            admission order. The policy evicts the most recently admitted first, so these
            are the last indices of the list.
        decodes: indices, into the running list after admission, of the requests that
            decode one token (ascending: admission order).
        chunks: (index, k) for each prefill chunk of k >= 1 new positions (admission order).
        All indices number the list after admission, before eviction (no renumbering).
    """

    admitted: int
    preempted: tuple[int, ...]
    decodes: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]


def _int(what: str, value) -> int:
    if type(value) is not int:
        kind = type(value)
        hint = " (convert it with int(...))" if kind.__module__ in ("numpy", "torch") else ""
        raise TypeError(f"{what} must be an int, got {kind.__module__}.{kind.__qualname__} {value!r}{hint}")
    return value


def as_plan(plan) -> StepPlan:
    """A scheduling step's answer as a canonical ``StepPlan``: fields as tuples, ``preempted``,
    ``decodes`` and ``chunks`` sorted by index.

    Accepts a ``StepPlan`` or a 4-tuple/list (admitted, preempted, decodes, chunks) whose index
    collections are lists or tuples of plain ints and whose chunks are (index, k) pairs.

    Raises: TypeError naming the field for any other shape or type (numpy or torch integers
    included, with a hint to convert them with int())."""
    if type(plan) is StepPlan:
        fields = (plan.admitted, plan.preempted, plan.decodes, plan.chunks)
    elif type(plan) in (tuple, list) and len(plan) == 4:
        fields = tuple(plan)
    else:
        raise TypeError(f"a scheduling step must return StepPlan(admitted, preempted, decodes, chunks), got "
                        f"{type(plan).__module__}.{type(plan).__qualname__}")
    admitted, preempted, decodes, chunks = fields

    def indices(name, value):
        if type(value) not in (tuple, list):
            raise TypeError(f"StepPlan.{name} must be a list or tuple of int indices, got {value!r}")
        return tuple(sorted(_int(f"StepPlan.{name}[{i}]", x) for i, x in enumerate(value)))

    if type(chunks) not in (tuple, list):
        raise TypeError(f"StepPlan.chunks must be a list of (index, k) pairs, got {chunks!r}")
    pairs = []
    for i, c in enumerate(chunks):
        if type(c) not in (tuple, list) or len(c) != 2:
            raise TypeError(f"StepPlan.chunks[{i}] must be an (index, k) pair, got {c!r}")
        pairs.append((_int(f"StepPlan.chunks[{i}] index", c[0]), _int(f"StepPlan.chunks[{i}] k", c[1])))
    return StepPlan(_int("StepPlan.admitted", admitted), indices("preempted", preempted),
                    indices("decodes", decodes), tuple(sorted(pairs)))


def _admit_limit(device: Device) -> int:
    """Largest token count whose bytes fit in ADMIT_FRACTION * memory."""
    return _max_tokens(ADMIT_FRACTION * device.memory, device.kv)


def _tokens(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def chunked_step(running: Sequence[tuple[int, int]], queue: Sequence[int], device: Device, *,
                 budget: int | None = CHUNK_BUDGET, max_running: int = MAX_RUNNING) -> StepPlan:
    """The chunked policy's scheduling step for one iteration (admission, chunk budget, preemption).

    Args:
        running: (filled, target) per running request, in admission order: filled = cached
            positions (its context), target = the prefill length fixed when it was admitted
            (prompt + tokens generated before). filled < target: prefill remaining;
            otherwise it is decoding.
        queue: (prompt, generated) of each waiting request, head first: its prompt length
            and the tokens it generated before a preemption (0 for a new request). Its
            required prefill is prompt + generated.
        device: a ``Device`` (memory and kv are used).
        budget: new prefill positions per iteration (``CHUNK_BUDGET`` = 256); None means
            unlimited (the paged policy).
        max_running: most requests running after admission (256).

    Returns:
        a ``StepPlan``; its chunk sizes and decodes are for the running list after admission
        and preemption.

    Raises:
        RequestTooLargeError: nothing runs after admission (the queue head does not fit), or
            the last running request had to be preempted (its context outgrows memory).
        ValueError / TypeError: malformed running entries or queue lengths, running and queue
            both empty, a budget or max_running < 1.
    """
    if not isinstance(device, Device):
        raise TypeError(f"device must be a Device, got {type(device).__qualname__}")
    if budget is not None:
        budget = _tokens("budget", budget, 1)
    max_running = _tokens("max_running", max_running, 1)
    seqs = []
    for i, entry in enumerate(running):
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise TypeError(f"running[{i}] must be a (filled, target) pair, got {entry!r}")
        seqs.append((_tokens(f"running[{i}] filled", entry[0], 0), _tokens(f"running[{i}] target", entry[1], 1)))
    required = []
    for i, entry in enumerate(queue):
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise TypeError(f"queue[{i}] must be a (prompt, generated) pair, got {entry!r}")
        required.append(_tokens(f"queue[{i}] prompt", entry[0], 1) + _tokens(f"queue[{i}] generated", entry[1], 0))
    queue = required
    if not seqs and not queue:
        raise ValueError("nothing to schedule: running and queue are both empty")

    # 1. admission: FIFO from the queue head against 0.99 of the KV budget
    used = sum(filled for filled, _ in seqs)
    limit = _admit_limit(device)
    admitted = 0
    while admitted < len(queue) and len(seqs) < max_running and used + queue[admitted] <= limit:
        used += queue[admitted]
        seqs.append((0, queue[admitted]))
        admitted += 1
    if not seqs:
        raise RequestTooLargeError(
            f"the request at the queue head needs {queue[0]} cached positions ({queue[0] * device.kv:.4g} B) "
            f"but admission allows {limit} ({ADMIT_FRACTION} * memory = {ADMIT_FRACTION * device.memory:.4g} B) "
            "with nothing else running: it can never be served on this device")

    # 2. plan in admission order; 3. preempt the newest while the growth would overflow memory
    capacity = device.kv_tokens
    preempted = 0
    while True:
        live = seqs[:len(seqs) - preempted]
        if not live:
            filled, target = seqs[0]
            raise RequestTooLargeError(
                f"a request running alone at context {filled} (target {target}) would outgrow the KV budget "
                f"of {capacity} positions ({device.memory:.4g} B): it can never finish on this device")
        left = budget
        decodes, chunks = [], []
        for index, (filled, target) in enumerate(live):
            if filled < target:
                k = target - filled if left is None else min(target - filled, left)
                if k > 0:
                    chunks.append((index, k))
                    if left is not None:
                        left -= k
            else:
                decodes.append(index)
        growth = len(decodes) + sum(k for _, k in chunks)
        if sum(filled for filled, _ in live) + growth > capacity:
            preempted += 1
            continue
        evicted = tuple(range(len(seqs) - preempted, len(seqs)))
        return StepPlan(admitted, evicted, tuple(decodes), tuple(chunks))
