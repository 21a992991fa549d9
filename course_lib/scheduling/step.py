"""One iteration's scheduling decision of the continuous policies (Lab 3: scheduling).

The rules, each a small function on plain integers, in the order an iteration applies them
(``docs/scheduling.md`` states them with the cost model):

1. ``admit``: take requests from the queue head, in order, while fewer than ``max_running``
   run and the cached positions in use plus the newcomer's required prefill fit in 0.99 of
   the KV budget. A request's required prefill is prompt + tokens it generated before (a
   preempted request re-prefills what it had generated).
2. ``plan_chunks``: every running request is below its *target*, re-derived each iteration
   as prompt + tokens generated so far, and advances by a chunk of min(target - filled,
   budget left), walked in admission order; a chunk of 0 waits. After its first token a
   request is one position short of its target (its newest token is not cached yet), so a
   decode is a one-position chunk that takes one position of the budget. vLLM counts decode
   tokens against its per-iteration token budget the same way; Sarathi-Serve
   (arXiv:2403.02310) builds its stall-free batches from this budget.
3. ``evictions``: while the cached positions plus this iteration's growth would exceed the
   KV budget (all of it, not 0.99), the most recently admitted request is preempted (it frees
   its cache and goes back to the queue head) and the plan is made again.

``chunked_step`` applies the three rules to (filled, target) pairs and returns a ``StepPlan``
(the Lab 3 exercise writes the same function); with ``budget=None`` it is the paged policy's
step. The readable simulator (``reference.py``) and the Lab 3 checkers use these functions,
so each rule is written once; the fast simulator (``fast.py``) makes the same decisions from
running totals and is tested against the readable one bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..validation import instance, integer
from .cost import Deployment, max_tokens
from .workload import MAX_OUTPUT

__all__ = ["StepPlan", "as_plan", "chunked_step", "admit", "static_batch", "plan_chunks", "evictions", "admit_limit",
           "RequestTooLargeError", "CHUNK_BUDGET", "MAX_RUNNING", "ADMIT_FRACTION", "STATIC_BATCH",
           "STATIC_WAIT"]

#: Positions (prefill and decode tokens) one iteration of the chunked policy may process.
CHUNK_BUDGET: int = 256
#: Most sequences a continuous policy runs at once.
MAX_RUNNING: int = 256
#: Fraction of the KV budget admission may fill (growth may use all of it).
ADMIT_FRACTION: float = 0.99
#: Static batching: batch size, and the longest the oldest queued request waits (seconds).
STATIC_BATCH: int = 16
STATIC_WAIT: float = 2.0


class RequestTooLargeError(ValueError):
    """A request cannot be served on this deployment: it cannot be admitted with nothing else
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
        decodes: indices of requests that would decode one token outside the chunk budget.
            The continuous policies plan none: a decoding request is a one-position chunk
            ``(index, 1)``, so this is always empty in their plans.
        chunks: (index, k) for each chunk of k >= 1 new positions (admission order).
        All indices number the list after admission, before eviction (no renumbering).
    """

    admitted: int
    preempted: tuple[int, ...]
    decodes: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]


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
        return tuple(sorted(integer(f"StepPlan.{name}[{i}]", x, strict=True) for i, x in enumerate(value)))

    if type(chunks) not in (tuple, list):
        raise TypeError(f"StepPlan.chunks must be a list of (index, k) pairs, got {chunks!r}")
    pairs = []
    for i, c in enumerate(chunks):
        if type(c) not in (tuple, list) or len(c) != 2:
            raise TypeError(f"StepPlan.chunks[{i}] must be an (index, k) pair, got {c!r}")
        pairs.append((integer(f"StepPlan.chunks[{i}] index", c[0], strict=True),
                      integer(f"StepPlan.chunks[{i}] k", c[1], strict=True)))
    return StepPlan(integer("StepPlan.admitted", admitted, strict=True), indices("preempted", preempted),
                    indices("decodes", decodes), tuple(sorted(pairs)))


def admit_limit(deployment: Deployment) -> int:
    """Most cached positions admission may fill: the largest T with T * kv_bytes_per_token <=
    0.99 * kv_budget."""
    return max_tokens(ADMIT_FRACTION * deployment.kv_budget, deployment.kv_bytes_per_token)


# -- the three rules -----------------------------------------------------------------------------
def admit(used: int, required: Sequence[int], *, limit: int, room: int) -> int:
    """Rule 1, admission: how many queued requests join, head first (FIFO).

    A request joins while fewer than ``room`` have joined and ``used`` plus its ``required``
    positions stays <= ``limit``; the first that does not fit stops admission (the head blocks
    the rest). ``used`` then grows by what joined.

    Args: used: cached positions charged to the running requests; required: positions each
    queued request is charged, head first; limit: ``admit_limit(deployment)``; room: free
    running slots (``max_running`` - running). Returns: the count admitted (ints, positions).
    """
    admitted = 0
    while admitted < len(required) and admitted < room and used + required[admitted] <= limit:
        used += required[admitted]
        admitted += 1
    return admitted


def static_batch(prompts: Sequence[int], *, limit: int | None) -> int:
    """How many queued requests a static batch takes, head first: at most ``STATIC_BATCH`` (16).

    ``limit=None`` (the ``static`` policy): no memory check, min(16, queued). Otherwise
    (``static-checked``) each request is charged prompt + ``MAX_OUTPUT`` positions, the most its
    slot can reach (its output length is not known when it is admitted, and the batch decodes
    until its longest output is done), and the batch takes requests while the total stays <=
    ``limit`` (``admit_limit(deployment)``): ``admit(0, charges, limit=limit, room=16)``. May be
    0 when the head alone does not fit. Args: prompts: prompt lengths, head first (positions).
    """
    if limit is None:
        return min(STATIC_BATCH, len(prompts))
    return admit(0, [p + MAX_OUTPUT for p in prompts[:STATIC_BATCH]], limit=limit, room=STATIC_BATCH)


def static_head_too_large(arrival: float, prompt: int, limit: int) -> RequestTooLargeError:
    """The error both simulators raise when ``static_batch`` takes 0 requests: the queue head (arriving
    at ``arrival`` s with a ``prompt``-position prompt) can never fit ``limit`` cached positions."""
    return RequestTooLargeError(
        f"a request (arrival {arrival:.6g} s, prompt {prompt}) needs {prompt + MAX_OUTPUT} cached positions but "
        f"static-checked admits at most {limit} (0.99 * kv_budget / kv_bytes_per_token): it can never be served "
        "on this deployment")


def plan_chunks(remaining: Sequence[int], budget: int | None) -> list[int]:
    """Rule 2, chunk planning: the chunk size of each running request, in admission order.

    Each request gets min(its remaining positions, budget left) and the budget shrinks by it;
    0 means it waits this iteration. ``remaining`` is target - filled (>= 1) per request, with
    target = prompt + tokens generated so far, so a decoding request has 1 remaining and takes
    one position of the budget. ``budget=None`` is unlimited (every request gets all it has
    left: the paged and reserve policies). Returns one int per request (positions).
    """
    sizes = []
    left = budget
    for need in remaining:
        k = need if left is None else min(need, left)
        sizes.append(k)
        if left is not None:
            left -= k
    return sizes


def evictions(filled: Sequence[int], remaining: Sequence[int], *, budget: int | None, capacity: int) -> int:
    """Rule 3, preemption: how many of the most recently admitted requests must be evicted.

    While the cached positions of the requests kept plus the chunks planned for them exceed
    ``capacity`` (``deployment.kv_tokens``: all of the KV budget, not 0.99), the newest kept request is
    evicted and the plan is made again (``plan_chunks`` on the rest). Returns a count from 0
    to len(filled); len(filled) means even the oldest cannot run alone (the caller raises
    ``RequestTooLargeError``). Lists are in admission order.
    """
    kept = len(filled)
    while kept and sum(filled[:kept]) + sum(plan_chunks(remaining[:kept], budget)) > capacity:
        kept -= 1
    return len(filled) - kept


# -- the step ------------------------------------------------------------------------------------
def _pairs(name: str, entries, first: str, second: str, minimum: tuple[int, int]) -> list[tuple[int, int]]:
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise TypeError(f"{name} must be a sequence of ({first}, {second}) pairs, got {type(entries).__qualname__}")
    pairs = []
    for i, entry in enumerate(entries):
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise TypeError(f"{name}[{i}] must be a ({first}, {second}) pair, got {entry!r}")
        pairs.append((integer(f"{name}[{i}] {first}", entry[0], minimum=minimum[0]),
                      integer(f"{name}[{i}] {second}", entry[1], minimum=minimum[1])))
    return pairs


def chunked_step(running: Sequence[tuple[int, int]], queue: Sequence[tuple[int, int]], deployment: Deployment, *,
                 budget: int | None = CHUNK_BUDGET, max_running: int = MAX_RUNNING) -> StepPlan:
    """The chunked policy's scheduling step for one iteration (admission, chunk budget, preemption).

    Args:
        running: (filled, target) per running request, in admission order: filled = cached
            positions (its context), target = prompt + tokens generated so far (re-derived
            every iteration), so filled < target: a request whose prefill is under way has
            target - filled positions left, a decoding one exactly 1 (its newest token).
        queue: (prompt, generated) of each waiting request, head first: its prompt length
            and the tokens it generated before a preemption (0 for a new request). Its
            required prefill is prompt + generated.
        deployment: a ``Deployment`` (its kv_budget and kv_bytes_per_token are used).
        budget: positions one iteration may process (``CHUNK_BUDGET`` = 256), decodes
            included; None means unlimited (the paged policy).
        max_running: most requests running after admission (256).

    Returns:
        a ``StepPlan`` whose chunks cover the running list after admission and preemption;
        its ``decodes`` is empty (a decode is the chunk ``(index, 1)``).

    Raises:
        RequestTooLargeError: nothing runs after admission (the queue head does not fit), or
            the last running request had to be preempted (its context outgrows the KV budget).
        ValueError / TypeError: malformed running entries or queue lengths, a running entry
            with filled >= target, running and queue both empty, a budget or max_running < 1.
    """
    instance("deployment", deployment, Deployment)
    if budget is not None:
        budget = integer("budget", budget, minimum=1, note="None for no limit")
    max_running = integer("max_running", max_running, minimum=1)
    table = _pairs("running", running, "filled", "target", (0, 1))
    for i, (filled, target) in enumerate(table):
        if filled >= target:
            raise ValueError(f"running[{i}] = ({filled}, {target}): a running request is below its target "
                             "(prompt + tokens generated so far), so filled must be < target")
    required = [prompt + generated for prompt, generated in _pairs("queue", queue, "prompt", "generated", (1, 0))]
    if not table and not required:
        raise ValueError("nothing to schedule: running and queue are both empty")

    used = sum(filled for filled, _ in table)
    limit = admit_limit(deployment)
    admitted = admit(used, required, limit=limit, room=max_running - len(table))
    table += [(0, cost) for cost in required[:admitted]]
    if not table:
        raise RequestTooLargeError(
            f"the request at the queue head needs {required[0]} cached positions "
            f"({required[0] * deployment.kv_bytes_per_token:.4g} B) but admission allows {limit} "
            f"({ADMIT_FRACTION} * kv_budget = {ADMIT_FRACTION * deployment.kv_budget:.4g} B) "
            "with nothing else running: it can never be served on this deployment")

    filled = [f for f, _ in table]
    remaining = [t - f for f, t in table]
    evicted = evictions(filled, remaining, budget=budget, capacity=deployment.kv_tokens)
    kept = len(table) - evicted
    if kept == 0:
        raise RequestTooLargeError(
            f"a request running alone at context {filled[0]} (target {table[0][1]}) would outgrow the KV budget "
            f"of {deployment.kv_tokens} positions ({deployment.kv_budget:.4g} B): it can never finish on this "
            "deployment")
    chunks = tuple((i, k) for i, k in enumerate(plan_chunks(remaining[:kept], budget)) if k > 0)
    return StepPlan(admitted, tuple(range(kept, len(table))), (), chunks)
