"""Graded checks for Lab 3 (scheduling).

Each ``check_*`` takes the learner's *function*, builds its own inputs from a seed (fixed for
the visible checks, ``fresh_seed()`` for hidden tests), and compares the result with
``course_lib.scheduling`` (the reference cost model, scheduling step, metrics and capacity
search, themselves tested against the reference figures of ``docs/scheduling.md`` and
hand-derived traces):

- times and metrics: real numbers within a relative 1e-9 of the reference (float rounding
  only: the formulas are exact);
- scheduling decisions: exactly the reference's plan (which requests are admitted, which
  are evicted, and each chunk's size, a decode being a one-position chunk);
- the capacity search: the reference's sequence of probed rates and its result (to 1e-12);
- the radix prefix cache (on plain data, ``RadixCache.to_plain``'s form): the returned block ids
  and the whole tree after every call exactly equal to ``course_lib.cache.radix.RadixCache``'s;
- the price per million output tokens: ``scheduling.cost_per_million_tokens`` within a relative 1e-9;
- load or recompute: the ``course_lib.cache.tiers`` figures within a relative 1e-9, the verdict exactly.

When a contract fails, the checker evaluates the known faults of Lab 3 on the same inputs
(memory and compute time summed instead of the max; a chunk charged only its own tokens in
attention, without k*c; the oldest request evicted instead of the newest; a preempted
request re-prefilling only its prompt; decodes left out of the position budget; TPOT divided
by n_out; p99 ITL as the mean of per-request p99s; a locked leaf evicted; a count released at one
node only; ...) and names those the learner's result equals. ``variant_step``, ``variant_bisect`` and
``variant_evict`` are the reference rules with one fault switched on. A radix tree's other faults are
named by their symptom (blocks lost or held twice by a split, a partly matched block returned).

Learner signatures (a deployment is a ``course_lib.scheduling.Deployment``; ``iteration_time`` is
the same function as ``course_lib.scheduling.iteration_time``, ``schedule_step`` as
``course_lib.scheduling.chunked_step``):
    iteration_time(decodes, chunks, deployment) -> float seconds
    schedule_step(running, queue, deployment, budget=256, max_running=256) -> StepPlan
    serving_metrics(records, targets=(3.0, 0.1)) -> dict (ttft50, ttft99, itl50, itl99, tpot50, goodput)
    find_capacity(run, targets=(3.0, 0.1), lo=0.01, hi=4.0, steps=10) -> float
    radix_match(root, tokens, block_size, now) -> list[int]           (root: a plain tree, changed in place)
    radix_release(root, tokens, block_size) -> None                    (in place)
    radix_evict(root, n_blocks, block_size) -> list[int]               (in place)
    cost_per_million(output_tokens, prompt_tokens, seconds, dollars_per_hour, utilisation=1.0) -> float $
    load_or_recompute(positions, kv_bytes_per_position, bandwidth, prefill_rate) -> dict
        (load_s, recompute_s, break_even_bandwidth, load_wins)
"""
from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Callable, Iterator

import numpy as np

from .. import scheduling as ref
from ..cache import tiers
from ..cache.radix import RadixCache
from ..hardware import Device
from ..scheduling import Deployment, Request, RequestRecord, StepPlan
from .contracts import (ContractError, attempts, check_int_list, check_own_function, check_real, close,
                        named_faults, with_diagnosis)
from .tables import Contract, Edit, Fault, Writes, check_tables

__all__ = ["check_iteration_time", "check_schedule_step", "check_step_in_a_run", "check_serving_metrics",
           "check_find_capacity", "check_radix_match", "check_radix_evict", "check_load_or_recompute",
           "check_cost_per_million",
           "normalise_plan", "variant_step", "variant_bisect", "variant_evict", "tiny_deployment",
           "METRIC_NAMES", "TIER_KEYS", "RELATIVE", "CONTRACTS", "FAULTS"]

#: Relative tolerance of the time and metric contracts (float rounding of exact formulas).
RELATIVE = 1e-9
#: Keys ``serving_metrics`` must return.
METRIC_NAMES = ("ttft50", "ttft99", "itl50", "itl99", "tpot50", "goodput")


def tiny_deployment(kv_budget: float, *, bandwidth: float = 1000.0, peak_flops: float = 1e4, **model) -> Deployment:
    """A deployment with 1 byte of KV per token, so the KV budget is counted in positions, and
    small model constants, so iteration times are easy numbers: weights 1000 B at ``bandwidth``
    1000 B/s, ``peak_flops`` 1e4 FLOP/s used in full (mfu 1). ``model``: other ``Deployment``
    fields (n_matmul, n_layers, d_model, attention_width, kv_bytes_per_token, weight_bytes;
    attention_width defaults to d_model). Its device has just the memory the weights and the
    budget take."""
    fields = dict(mfu=1.0, kv_budget=float(kv_budget), kv_bytes_per_token=1, n_matmul=1, n_layers=1, d_model=1,
                  weight_bytes=1000.0)
    fields.update(model)
    device = Device("tiny", memory=fields["weight_bytes"] + fields["kv_budget"], bandwidth=bandwidth,
                    peak_flops=peak_flops, source="a small device for the Lab 3 checks")
    return Deployment(device=device, **fields)


def _close(a: float, b: float) -> bool:
    """The time and metric contract: agreement to a relative ``RELATIVE`` (1e-9)."""
    return close(a, b, rel=RELATIVE)


# -- exercise 1: iteration time ----------------------------------------------------------------
def _time_variants(decodes, chunks, d: Deployment) -> dict[str, float]:
    """The cost model with each known fault, on the same inputs."""
    ctx_dec = sum(decodes)
    ctx_chunk = sum(c for _, c in chunks)
    positions = len(decodes) + sum(k for k, _ in chunks)
    tri = sum(k * (k + 1) // 2 for k, _ in chunks)
    kc = sum(k * c for k, c in chunks)

    def t(positions=positions, attention=ctx_dec + kc + tri, context=ctx_dec + ctx_chunk, combine=None, deployment=d):
        if combine is None:   # the reference's roofline max, with a wrong term
            return ref.iteration_seconds(positions=positions, attention=attention, context=context,
                                         deployment=deployment)
        bytes_moved, flops = ref.iteration_work(positions=positions, attention=attention, context=context,
                                                deployment=d)
        return combine(bytes_moved / d.device.bandwidth, flops / d.usable_flops)

    return {
        "memory time and compute time added instead of taking the max (the weight read is shared and "
        "overlaps the arithmetic)": t(combine=lambda a, b: a + b),
        "a chunk's attention charged only its own tokens, k(k+1)/2, without the k*c term for the c cached "
        "positions each new token attends to": t(attention=ctx_dec + tri),
        "a chunk's attention charged k*c without the k(k+1)/2 among its own new tokens": t(attention=ctx_dec + kc),
        "a chunk's cached positions left out of the bytes read": t(context=ctx_dec),
        "decode contexts left out of the bytes read": t(context=ctx_chunk),
        "decode contexts left out of the attention work": t(attention=kc + tri),
        "only the decodes counted as positions (chunk tokens missing from 2*N_matmul*positions)":
            t(positions=len(decodes)),
        "attention counted with d_model instead of attention_width (the query heads' n_heads*head_dim)":
            t(deployment=dataclasses.replace(d, attention_width=d.d_model)),
        "only the memory time": t(combine=lambda a, b: a),
        "only the compute time": t(combine=lambda a, b: b),
    }


def check_iteration_time(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(decodes, chunks, deployment) equals the cost model of ``docs/scheduling.md#cost-model``
    within a relative 1e-9: max((weight_bytes + kv_bytes_per_token*(sum c_dec + sum c_chunk)) /
    bandwidth, (2*N_matmul*positions + 4*L*attention_width*attention) / (mfu * peak_flops)) with
    attention = sum c_dec + sum(k*c + k(k+1)/2). Case 2 draws a tiny deployment whose
    attention_width differs from its d_model, redrawn until that changes the time, so an attention
    term written with d_model fails (the case model has both 4,096). Case 0 is the reference figure of 17 decodes at 5,000 plus a 512-token
    chunk after 2,000 cached positions (123.36 ms, compute-bound); case 1 is memory-bound with
    short chunks, one-position ones included, on long cached contexts; the rest are drawn from
    the seed."""
    check_own_function("iteration_time", fn)
    rng = random.Random(seed)
    for case in range(cases):
        if case == 0:
            deployment, decodes, chunks = Deployment(), [5000] * 17, [(512, 2000)]
        elif case == 1:  # memory-bound, with chunks on long cached contexts: their bytes matter
            deployment = Deployment()
            decodes = [rng.randint(3000, 6000) for _ in range(rng.randint(4, 12))]
            chunks = [(rng.randint(1, 8), rng.randint(4000, 8000))] + [
                (1, rng.randint(3000, 6000)) for _ in range(rng.randint(1, 4))]   # decodes of a continuous batch
        else:
            for _ in attempts("Lab 3"):
                deployment = rng.choice(list(ref.PROFILES.values())).deployment if case % 2 else tiny_deployment(
                    rng.randint(100, 10_000), bandwidth=float(rng.randint(100, 5000)),
                    peak_flops=float(rng.randint(1000, 10**5)), n_matmul=rng.randint(1, 50),
                    n_layers=rng.randint(1, 4), d_model=rng.randint(1, 8))
                if case == 2:   # the query heads' width apart from the model width
                    deployment = dataclasses.replace(deployment, attention_width=deployment.d_model + rng.randint(1, 8))
                big = deployment.n_matmul > 10**6
                decodes = [rng.randint(0, 8000 if big else 300) for _ in range(rng.randint(0, 40 if big else 6))]
                chunks = [(rng.randint(1, 512 if big else 40), rng.randint(0, 6000 if big else 200))
                          for _ in range(rng.randint(0 if decodes else 1, 3))]
                # case 2 is redrawn until the attention width shows in the time (compute-bound, attention > 0)
                square = dataclasses.replace(deployment, attention_width=deployment.d_model)
                if case != 2 or not _close(ref.iteration_time(decodes, chunks, square),
                                           ref.iteration_time(decodes, chunks, deployment)):
                    break
        what = f"iteration_time(case {case}: {len(decodes)} decodes, chunks {chunks})"
        got = check_real(what, fn(list(decodes), [tuple(c) for c in chunks], deployment))
        expected = ref.iteration_time(decodes, chunks, deployment)
        if _close(got, expected):
            continue
        err = f"{what}: expected {expected:.10g} s, got {got:.10g} s (relative error must be <= {RELATIVE:g})"
        raise named_faults(err, [name for name, value in _time_variants(decodes, chunks, deployment).items()
                                 if _close(got, value)])


# -- exercise 2: the chunked policy's scheduling step ------------------------------------------
def variant_step(running, queue, deployment: Deployment, budget, max_running, *, evict_newest: bool = True,
                 count_generated: bool = True, admit_fraction: float = ref.ADMIT_FRACTION,
                 share_budget: bool = True, evict_at_full: bool = False,
                 free_decodes: bool = False, decodes_apart: bool = False) -> StepPlan | None:
    """``scheduling.chunked_step`` with one known fault switched on (None when the variant has
    nothing left to run). The rules are the library's (``scheduling.admit``,
    ``scheduling.plan_chunks``); each flag changes one of them:

    evict_newest=False: evict the oldest; count_generated=False: a re-prefill of the prompt
    only; admit_fraction: admission against another fraction of the KV budget; share_budget=False:
    every request gets up to the whole budget; evict_at_full: evict when the growth would
    exactly fill the KV budget; free_decodes: one-position chunks (decodes) take no budget;
    decodes_apart: decodes listed in ``StepPlan.decodes`` and taking no budget (the decode
    term of static batching carried over)."""
    required = [prompt + (generated if count_generated else 0) for prompt, generated in queue]
    limit = ref.max_tokens(admit_fraction * deployment.kv_budget, deployment.kv_bytes_per_token)
    admitted = ref.admit(sum(f for f, _ in running), required, limit=limit, room=max_running - len(running))
    table = list(running) + [(0, cost) for cost in required[:admitted]]
    live = list(range(len(table)))
    evicted: list[int] = []
    while live:
        decodes = [i for i in live if (free_decodes or decodes_apart) and table[i][1] - table[i][0] == 1]
        planned = [i for i in live if i not in decodes]
        remaining = [table[i][1] - table[i][0] for i in planned]
        sizes = (ref.plan_chunks(remaining, budget) if share_budget
                 else [k for need in remaining for k in ref.plan_chunks([need], budget)])
        chunks = sorted([(i, k) for i, k in zip(planned, sizes) if k > 0]
                        + ([] if decodes_apart else [(i, 1) for i in decodes]))
        total = sum(table[i][0] for i in live) + len(decodes) * decodes_apart + sum(k for _, k in chunks)
        if total > deployment.kv_tokens or (evict_at_full and total == deployment.kv_tokens):
            evicted.append(live.pop() if evict_newest else live.pop(0))
            continue
        return StepPlan(admitted, tuple(sorted(evicted)), tuple(decodes) if decodes_apart else (), tuple(chunks))
    return None


_STEP_FAULTS = {
    "the oldest running request evicted instead of the most recently admitted one": dict(evict_newest=False),
    "a preempted request re-prefills only its prompt, forgetting the tokens it had already generated "
    "(cost and prefill target must be prompt + generated)": dict(count_generated=False),
    "admission checked against all of the KV budget instead of 0.99 of it": dict(admit_fraction=1.0),
    "every chunk gets up to the full budget (the 256 positions are per iteration, shared "
    "in admission order)": dict(share_budget=False),
    "eviction when the growth would exactly fill the KV budget (evict only when it would exceed it: > not >=)":
        dict(evict_at_full=True),
    "a decoding request's one-position chunk left out of the budget (every position an iteration "
    "processes counts against it, decodes included, walked in admission order)": dict(free_decodes=True),
    "decoding requests planned as separate decodes outside the budget (StepPlan.decodes) instead of "
    "one-position chunks (index, 1) that take one position of it each": dict(decodes_apart=True),
}

#: Case kinds of check_schedule_step: each forces a situation where one fault changes the plan.
_STEP_KINDS = {"preempt": dict(evict_newest=False), "generated": dict(count_generated=False),
               "admit": dict(admit_fraction=1.0), "boundary": dict(evict_at_full=True),
               "decodes": dict(free_decodes=True)}


def normalise_plan(what: str, plan) -> StepPlan:
    """A learner's plan as a canonical StepPlan (``scheduling.as_plan``), type errors as ContractError."""
    try:
        return ref.as_plan(plan)
    except TypeError as exc:
        raise ContractError(f"{what}: {exc}") from None


def _draw_step_case(rng: random.Random, kind: str):
    """A feasible scheduling situation on a tiny deployment; ``kind`` forces what it exercises."""
    for _ in attempts("Lab 3"):
        memory = rng.randint(150, 1500)
        deployment = tiny_deployment(memory)
        running = []
        for _ in range(rng.randint(0, 8)):
            if rng.random() < 0.4:   # a prefill (or re-prefill) under way
                target = rng.randint(1, memory // 4)
                running.append((rng.randint(0, target - 1), target))
            else:                    # decoding: one position short of its target (its newest token)
                filled = rng.randint(1, memory // 4 + memory // 8)
                running.append((filled, filled + 1))
        queue = [(rng.randint(1, memory // 3), rng.choice([0, 0, rng.randint(1, memory // 10)]))
                 for _ in range(rng.randint(0, 4))]
        budget = rng.choice([None, 8, 32, 256])
        max_running = rng.choice([256, 256, rng.randint(1, 8)])
        if not running and not queue:
            continue
        try:
            plan = ref.chunked_step(running, queue, deployment, budget=budget, max_running=max_running)
        except ValueError:  # RequestTooLargeError: not a situation the exercise asks about
            continue
        args = (running, queue, deployment, budget, max_running)
        if kind == "preempt" and not (plan.preempted and any(f > 0 for f, _ in running[:-1])):
            continue
        if kind == "generated" and not any(g for _, g in queue[:plan.admitted + 1]):
            continue
        if kind in _STEP_KINDS and variant_step(*args, **_STEP_KINDS[kind]) in (None, plan):
            continue
        return args, plan


def check_schedule_step(fn: Callable, seed: int = 0, cases: int = 8, trace: bool = True) -> None:
    """Contract: fn(running, queue, deployment, budget, max_running) returns the same plan as the
    reference chunked step (``course_lib.scheduling.chunked_step``; ``docs/scheduling.md#admission``
    and the two sections after it): FIFO admission while fewer than max_running run and used +
    prompt + generated <= 0.99 * kv_budget (in positions at kv_bytes_per_token each); then, walking the running
    requests in admission order, a chunk of min(target - filled, budget left) each (a decoding
    request has 1 left and takes one position of the budget; a chunk of 0 is skipped); and, while
    contexts + this iteration's growth exceed the KV budget, eviction of the most recently admitted
    request. The first cases force situations where a known fault changes the plan: a preemption,
    a re-prefill of generated tokens, the 0.99 admission limit, growth that would exactly fill
    the KV budget (allowed: evict only when it would exceed it) and decodes competing with a prefill for
    the budget. With ``trace`` the function also drives a small simulation (``run_with_step``)
    that must give the reference's token timestamps."""
    check_own_function("schedule_step", fn)
    rng = random.Random(seed)
    for case in range(cases):
        kinds = list(_STEP_KINDS)
        (running, queue, deployment, budget, max_running), expected = _draw_step_case(
            rng, kinds[case] if case < len(kinds) else "any")
        what = (f"schedule_step(case {case}: running {running}, queue {queue}, KV budget "
                f"{deployment.kv_budget:g} positions, budget {budget}, max_running {max_running})")
        got = normalise_plan(what, fn([tuple(r) for r in running], [tuple(q) for q in queue], deployment,
                                      budget=budget, max_running=max_running))
        if got == expected:
            continue
        err = f"{what}:\n  expected {expected}\n  got      {got}"
        args = (running, queue, deployment, budget, max_running)
        raise named_faults(err, [name for name, flags in _STEP_FAULTS.items()
                                 if variant_step(*args, **flags) == got])
    if trace:
        check_step_in_a_run(fn, rng)


def check_step_in_a_run(fn: Callable, rng: random.Random) -> None:
    """Drive ``run_with_step`` with fn on a small trace that preempts (drawn from ``rng``) and
    compare every token time and preemption count with the reference step's run."""
    for _ in attempts("Lab 3"):
        memory = rng.randint(300, 700)
        requests, t = [], 0.0
        for _ in range(rng.randint(3, 6)):
            t += rng.choice([0.0, 0.5, 1.0, 3.0])
            requests.append(Request(t, rng.randint(20, memory // 3), rng.randint(2, 60)))
        deployment = tiny_deployment(memory)
        try:
            expected = ref.run_trace(requests, "chunked", deployment)
        except ValueError:
            continue
        if sum(r.preemptions for r in expected) and any(r.preemptions for r in expected[:-1]):
            break

    def step(running, queue, deployment, *, budget, max_running):
        return normalise_plan("schedule_step (inside a simulation)", fn(running, queue, deployment, budget=budget,
                                                                        max_running=max_running))

    what = (f"a simulation driven by schedule_step ({len(requests)} requests, KV budget {memory} positions, "
            "budget 32 positions per iteration)")
    try:
        got = ref.run_with_step(requests, deployment, step=step, budget=32)
        expected = ref.run_with_step(requests, deployment, step=ref.chunked_step, budget=32)
    except ContractError:
        raise
    except ValueError as exc:
        raise ContractError(f"{what}: the simulator refused a plan: {exc}") from None
    for i, (g, e) in enumerate(zip(got, expected)):
        if g.preemptions != e.preemptions:
            raise ContractError(f"{what}: request {i} was preempted {g.preemptions} time(s), expected "
                                f"{e.preemptions}")
        if not np.array_equal(g.token_times, e.token_times):
            j = int(np.argmax(g.token_times != e.token_times))
            raise ContractError(f"{what}: request {i}'s token {j} came at {float(g.token_times[j])!r} s, "
                                f"expected {float(e.token_times[j])!r} s")


# -- exercise 3: serving metrics ---------------------------------------------------------------
def _draw_records(rng: random.Random, n: int, grid: bool = False, targets=(3.0, 0.1)) -> list[RequestRecord]:
    """Random records with one-token answers. With ``grid``, every time is a multiple of 1/64 s
    (exact in binary), so TTFTs and gaps land *exactly* on dyadic targets such as (2.5, 0.125)."""
    records, arrival = [], 0.0
    step = 1 / 64
    for i in range(n):
        if grid:
            arrival += step * rng.randint(0, 128)
            first = arrival + (targets[0] if rng.random() < 0.3 else step * rng.randint(1, 320))
            gaps = [targets[1] if rng.random() < 0.3 else step * rng.randint(1, 24) for _ in range(rng.randint(0, 11))]
            if i == 0:  # good only under <=: TTFT and every gap exactly at the targets
                first, gaps = arrival + targets[0], [targets[1]] * 3
            output = 1 + len(gaps) if i not in (1, n - 2) else 1
            gaps = gaps[:output - 1]
        else:
            arrival += rng.expovariate(2.0)
            output = 1 if i in (1, n - 2) else rng.randint(2, 12)
            first = arrival + rng.uniform(0.05, 5.0)
            gaps = [rng.choice([rng.uniform(0.01, 0.09), 0.1, rng.uniform(0.02, 0.4)]) for _ in range(output - 1)]
        times = np.array([first] + [first + s for s in np.cumsum(gaps)], dtype=np.float64)
        times.flags.writeable = False
        records.append(RequestRecord(arrival, rng.randint(10, 100), output, times, rng.choice([0, 0, 1])))
    return records


def _metric_variants(records, targets) -> dict[str, dict[str, float]]:
    m = ref.metrics(records, targets)
    final = max(float(r.token_times[-1]) for r in records)
    multi = [r for r in records if r.output > 1]
    per_request_p99 = float(np.mean([np.quantile(np.diff(r.token_times), 0.99) for r in multi]))
    tpot_n = float(np.median([(r.e2e - r.ttft) / r.output for r in multi]))
    tpot_all = float(np.median([(r.e2e - r.ttft) / max(1, r.output - 1) for r in records]))
    gaps = np.concatenate([np.diff(r.token_times) for r in multi])
    ttft = np.array([r.ttft for r in records])
    good_strict = sum(1 for r in records if r.ttft < targets[0] and (r.output == 1 or np.diff(r.token_times).max()
                                                                      < targets[1])) / final
    return {
        "p99 ITL computed as the mean of per-request p99s (ITL percentiles pool every gap of every request)":
            {"itl99": per_request_p99},
        "TPOT divided by n_out instead of n_out - 1 (n_out tokens have n_out - 1 gaps)": {"tpot50": tpot_n},
        "one-token answers included in TPOT (it is undefined for them)": {"tpot50": tpot_all},
        "goodput as a count of requests instead of requests per second of the final clock":
            {"goodput": m["goodput"] * final},
        "goodput with strict < instead of <= at the targets": {"goodput": good_strict},
        "percentiles by the 'nearest' method instead of numpy's default linear interpolation":
            {"ttft99": float(np.quantile(ttft, 0.99, method="nearest")),
             "itl99": float(np.quantile(gaps, 0.99, method="nearest"))},
    }


def check_serving_metrics(fn: Callable, seed: int = 0, cases: int = 3) -> None:
    """Contract: fn(records, targets) returns a dict whose values for ``METRIC_NAMES`` equal
    ``course_lib.scheduling.metrics`` within a relative 1e-9: TTFT p50/p99 over requests, ITL
    p50/p99 over every gap of every request pooled (numpy's default linear quantiles), TPOT
    median of (E2E - TTFT)/(n_out - 1) over requests with n_out > 1, goodput = requests with
    TTFT <= target and every gap <= target per second of the final clock (last token time).
    Records include one-token answers; case 0 puts TTFTs and gaps exactly on its targets."""
    check_own_function("serving_metrics", fn)
    rng = random.Random(seed)
    for case in range(cases):
        grid = case == 0  # case 0: times on a 1/64 s grid, TTFTs and gaps exactly at (2.5, 0.125)
        targets = (2.5, 0.125) if grid else rng.choice([(3.0, 0.1), (2.0, 0.1), (4.0, 0.2)])
        records = _draw_records(rng, rng.randint(8, 40), grid=grid, targets=targets)
        what = f"serving_metrics(case {case}: {len(records)} records, targets {targets})"
        got = fn(list(records), targets)
        if type(got) is not dict:
            raise ContractError(f"{what} must return a dict, got {type(got).__qualname__}")
        expected = ref.metrics(records, targets)
        missing = [key for key in METRIC_NAMES if key not in got]
        if missing:
            raise ContractError(f"{what}: the dict lacks {', '.join(map(repr, missing))} "
                                f"(needs {', '.join(METRIC_NAMES)})")
        for key in METRIC_NAMES:
            value = check_real(f"{what}[{key!r}]", got[key])
            if _close(value, expected[key]):
                continue
            err = f"{what}: {key} expected {expected[key]:.10g}, got {value:.10g}"
            raise named_faults(err, [name for name, values in _metric_variants(records, targets).items()
                                     if key in values and _close(value, values[key])])


# -- exercise 4: the capacity search -----------------------------------------------------------
def variant_bisect(run, targets, lo, hi, steps, *, keep_upper=False, strict=False, ttft_only=False, steps_delta=0):
    """The capacity bisection (``scheduling.capacity``'s rule on any ``run(rate)``) with one known
    fault switched on: return the upper bound, strict < at the targets, only the TTFT target, or
    ``steps_delta`` steps more or fewer. With no flag it is the correct search."""
    for _ in range(steps + steps_delta):
        mid = (lo + hi) / 2
        result = run(mid)
        ok_t = result["ttft99"] < targets[0] if strict else result["ttft99"] <= targets[0]
        ok_i = result["itl99"] < targets[1] if strict else result["itl99"] <= targets[1]
        if ok_t and (ttft_only or ok_i):
            lo = mid
        else:
            hi = mid
    return hi if keep_upper else lo


_CAPACITY_FAULTS = {
    "the upper bound returned (it failed the targets or was never tested; the answer is the last rate "
    "that passed)": dict(keep_upper=True),
    "strict < at the targets instead of <=": dict(strict=True),
    "only the TTFT target checked (both p99 targets must pass)": dict(ttft_only=True),
    "one bisection step too few": dict(steps_delta=-1),
    "one bisection step too many": dict(steps_delta=1),
}


def _synthetic_load(rng: random.Random):
    """A fake ``run(rate)``: p99 TTFT and ITL rise with the rate past two thresholds, with a few
    non-monotone 'lucky' rates (finite samples) and values exactly at the targets."""
    t_cap, i_cap = rng.uniform(0.05, 3.5), rng.uniform(0.05, 3.5)
    lucky = {round(rng.uniform(0.01, 4.0), 1) for _ in range(3)}

    def run(rate: float) -> dict:
        over_t = rate > t_cap and round(rate, 1) not in lucky
        over_i = rate > i_cap
        return {"ttft99": 3.0 + (rate - t_cap) if over_t else (3.0 if rate > 0.9 * t_cap else 1.0),
                "itl99": 0.1 + (rate - i_cap) if over_i else 0.05}
    return run


def _close_rate(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(1.0, abs(b))


def _same_search(got: float, probed: list[float], expected: float, want: list[float]) -> bool:
    """Same result and same probes, to 1e-12 (lo + (hi - lo) / 2 and (lo + hi) / 2 round apart)."""
    return _close_rate(got, expected) and len(probed) == len(want) and all(map(_close_rate, probed, want))


def check_find_capacity(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: fn(run, targets, lo, hi, steps) bisects exactly like ``scheduling.capacity``: ``steps``
    midpoints (lo + hi) / 2, each run once; lo = mid when p99 TTFT <= targets[0] and p99 ITL <=
    targets[1], else hi = mid; returns lo. ``run`` is a synthetic load here; the probed rates and
    the result must equal the reference's to a relative 1e-12 (any rounding of the midpoint)."""
    check_own_function("find_capacity", fn)
    rng = random.Random(seed)
    for case in range(cases):
        run = _synthetic_load(rng)
        targets = (3.0, 0.1)
        lo, hi, steps = (0.01, 4.0, 10) if case == 0 else (rng.uniform(0.0, 0.5), rng.uniform(2.0, 6.0),
                                                          rng.randint(4, 12))
        probed: list[float] = []

        def spy(rate):
            probed.append(float(rate))
            return dict(run(rate))

        what = f"find_capacity(case {case}: lo {lo!r}, hi {hi!r}, {steps} steps)"
        got = check_real(what, fn(spy, targets, lo, hi, steps))
        want: list[float] = []
        expected = variant_bisect(lambda r: (want.append(r), run(r))[1], targets, lo, hi, steps)
        if _same_search(got, probed, expected, want):
            continue
        err = f"{what}: expected {expected!r} after probing {len(want)} rates, got {got!r} after {len(probed)}"
        for i, (p, q) in enumerate(zip(probed, want)):
            if not _close_rate(p, q):
                err += f"; probe {i} was {p!r}, expected {q!r} (the midpoint (lo + hi) / 2)"
                break
        matches = []
        for name, flags in _CAPACITY_FAULTS.items():
            trail: list[float] = []
            result = variant_bisect(lambda r: (trail.append(r), run(r))[1], targets, lo, hi, steps, **flags)
            if _same_search(got, probed, result, trail):
                matches.append(name)
        raise named_faults(err, matches)


# -- exercises 6 and 7: the radix prefix cache on plain data --------------------------------------
#: A drawn tree's token alphabet: small, so prompts share prefixes; a query's divergent tokens lie outside it.
_ALPHABET = 4


def _ticks(plain: dict) -> list[int]:
    """Every last-access tick of a plain tree the checker built (``RadixCache.to_plain``'s form)."""
    return [plain["last_access"]] + [node["last_access"] for _, node in _plain_nodes(plain)]


def _plain_nodes(plain: dict, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """(token path, node) for every node of a plain tree below the root, parents first; tolerant of a malformed
    tree (what is not a node dict is skipped, a dict reached again is not read again: a learner's tree may
    hold a cycle), as it reads learners' trees before they are validated."""
    stack, seen = [(path, plain)], {id(plain)}
    while stack:
        at, node = stack.pop()
        children = node.get("children") if type(node) is dict else None
        for child in (children.values() if type(children) is dict else ()):
            if type(child) is dict and id(child) not in seen:
                seen.add(id(child))
                key = child.get("key")
                here = at + tuple(key) if type(key) in (list, tuple) else at
                yield here, child
                stack.append((here, child))


def _block_ids(plain: dict) -> list[int]:
    """The block ids a (possibly malformed) plain tree holds, repeats included."""
    return [b for _, node in _plain_nodes(plain) if type(node.get("blocks")) in (list, tuple)
            for b in node["blocks"] if type(b) is int]


def _draw_radix(rng: random.Random, block_size: int, prompts: int) -> tuple[RadixCache, list[list[int]], list]:
    """A radix cache built the way a server builds it: PROMPTS prompts, each sharing a prefix (whole blocks or
    not) with an earlier one, cached under block ids in no order; every second one's path then held by a
    running request (acquired) before later prompts renew other paths, so locked leaves are not the most
    recent. Returns the cache, the prompts and the held nodes. Ticks come from the cache's own counter, so no
    two nodes that are not on one path share one (an eviction order has no ties)."""
    cache = RadixCache(block_size)
    ids = iter(rng.sample(range(100, 100 + 64 * prompts), 64 * prompts))
    cached: list[list[int]] = []
    held = []
    for p in range(prompts):
        source = rng.choice(cached) if cached else []
        tokens = source[:rng.randint(0, len(source))] + [rng.randrange(_ALPHABET)
                                                         for _ in range(block_size * rng.randint(1, 3))]
        tokens = tokens[:len(tokens) - len(tokens) % block_size]
        found = cache.match(tokens)
        cache.insert(tokens, list(found.blocks) + [next(ids) for _ in range(len(tokens) // block_size
                                                                              - len(found.blocks))])
        cached.append(tokens)
        if p % 2 == 0 and rng.random() < 0.7:
            node = cache.match(tokens).node
            cache.acquire(node)
            held.append(tokens)
    return cache, cached, held


def _radix_query(rng: random.Random, cached: list[list[int]], block_size: int, kind: str) -> list[int]:
    """A request's tokens against a drawn tree: a cached prompt cut at a block boundary then diverging
    (``boundary``), cut inside a block then diverging (``mid-block``) or ending there (``short``), extended
    past its end (``longer``), or sharing nothing (``none``)."""
    source = max(cached, key=len) if kind != "none" else []
    other = lambda n: [_ALPHABET + rng.randrange(3) for _ in range(n)]       # tokens no cached prompt holds
    if kind == "boundary":
        return source[:block_size * rng.randint(1, len(source) // block_size)] + other(rng.randint(1, 2 * block_size))
    if kind in ("mid-block", "short"):
        cut = rng.choice([j for j in range(block_size + 1, len(source)) if j % block_size] or [len(source)])
        return source[:cut] + (other(rng.randint(1, 2 * block_size)) if kind == "mid-block" else [])
    if kind == "longer":
        return source + other(rng.randint(1, 2 * block_size))
    return other(rng.randint(1, 3 * block_size))


def _depth(node) -> int:
    """Nodes on the path from the root's child down to NODE (a ``RadixNode``; 0 for the root)."""
    depth = 0
    while node.parent is not None:
        node, depth = node.parent, depth + 1
    return depth


def _learner_tree(what: str, plain, block_size: int) -> RadixCache:
    """The learner's tree, validated as a cache (its form and invariants), or a ContractError saying what is wrong."""
    try:
        return RadixCache.from_plain(plain, block_size)
    except (ValueError, RuntimeError) as exc:
        raise ContractError(f"{what}: the tree is no longer a valid radix tree: {exc}") from None


def _first_difference(got: dict, expected: dict, ignore_root_tick: bool = True) -> str:
    """Where two valid plain trees first differ, in words ('' when they are the same)."""
    stack = [((), got, expected)]
    while stack:
        path, g, e = stack.pop()
        where = "the root" if not path else f"the node at tokens {list(path)}"
        for field in ("key", "blocks", "lock", "last_access"):
            if field == "last_access" and not path and ignore_root_tick:
                continue
            if (list(g[field]) != list(e[field])) if field in ("key", "blocks") else g[field] != e[field]:
                return f"{where}: {field} is {g[field]!r}, expected {e[field]!r}"
        if set(g["children"]) != set(e["children"]):
            extra = sorted(map(list, set(g["children"]) - set(e["children"])))
            missing = sorted(map(list, set(e["children"]) - set(g["children"])))
            return (f"{where}: children under first blocks {sorted(map(list, g['children']))}, expected "
                    f"{sorted(map(list, e['children']))}" + (f" (unexpected {extra})" if extra else "")
                    + (f" (missing {missing})" if missing else ""))
        for first in e["children"]:
            child = e["children"][first]
            stack.append((path + tuple(child["key"]), g["children"][first], child))
    return ""


def _match_diagnosis(before: dict, after, got: list[int], expected: list[int]) -> list[str]:
    """Symptoms of the known faults of a match with split, from the trees before and after it."""
    found = []
    lost = sorted(set(_block_ids(before)) - set(_block_ids(after)))
    if lost:
        found.append(f"blocks {lost} were in the tree before the match and are in no node after it: a split must "
                     "leave the rest of the edge's blocks with the child (the new parent takes only the matched ones)")
    repeated = sorted(b for b, n in Counter(_block_ids(after)).items() if n > 1)
    if repeated:
        found.append(f"blocks {repeated} are held by two nodes after the split: the child must keep only the blocks "
                     "after the cut")
    if len(got) > len(expected) and got[:len(expected)] == expected:
        found.append("a block whose tokens matched only in part was offered for reuse: its later positions hold "
                     "another prefix's K/V, so a match counts whole blocks only (round down)")
    return found


def _with_symptoms(err: str, symptoms: list[str]) -> ContractError:
    """ERR with the symptoms the checker saw, as a likely diagnosis (none: ERR alone)."""
    if not symptoms:
        return ContractError(err)
    return with_diagnosis(err, symptoms[0] if len(symptoms) == 1 else "".join(f"\n  - {s}" for s in symptoms))


def _fixed_match_tree() -> RadixCache:
    """Case 0 of the match check (block size 2): the prompt [1 .. 6] in blocks 10, 11, 12, held by a running
    request (its edge is locked: a split must copy the count), and [7, 7, 8, 8] in blocks 30, 31."""
    cache = RadixCache(block_size=2)
    cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12])
    cache.acquire(cache.match([1, 2, 3, 4, 5, 6]).node)
    cache.insert([7, 7, 8, 8], [30, 31])
    return cache


def check_radix_match(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: fn(root, tokens, block_size, now) on a plain radix tree (``RadixCache.to_plain``'s form:
    nested dicts of key, blocks, lock, last_access, children) does what ``RadixCache.match`` does, in place:
    returns the block ids (a list of ints) of the longest cached prefix of TOKENS in whole blocks; splits an
    edge matched in part at the last whole matched block (a new node takes the matched part, its blocks,
    the child's lock count, and becomes the child's parent; the child keeps the rest and its children);
    sets ``last_access = now`` on every node of the matched path (the root's tick is not compared). Each
    case is a tree built by a server's inserts and held paths, with block sizes 1 to 4, and a run of
    queries on it: a cut at a block boundary, divergence inside a block, a request ending inside a block,
    one longer than anything cached and one sharing nothing. Case 0 is fixed: a locked edge split twice
    (the new parent must carry its lock count), a split of an unlocked edge, a partly matched block. After each
    call the tree must equal the reference's exactly."""
    check_own_function("radix_match", fn)
    rng = random.Random(seed)
    for case in range(cases):
        if case == 0:
            cache, block_size = _fixed_match_tree(), 2
            queries = [[1, 2, 3, 4, 9, 9], [1, 2, 3], [7, 7, 8], [1, 2, 3, 4, 5, 6, 0, 0], [9, 9], [1, 2, 3, 5]]
        else:
            block_size = (2, 3, 1)[case - 1] if case < 4 else rng.randint(1, 4)
            cache, cached, _ = _draw_radix(rng, block_size, prompts=rng.randint(4, 7))
            queries = [_radix_query(rng, cached, block_size, kind)
                       for kind in ("mid-block", "boundary", "short", "longer", "none", "mid-block")]
        for tokens in queries:
            root, before = cache.to_plain(), cache.to_plain()
            now = max(_ticks(before)) + 1
            what = f"radix_match(case {case}, block_size {block_size}, tokens {tokens}, now {now})"
            got = check_int_list(what, fn(root, list(tokens), block_size, now))
            expected = list(cache.match(tokens).blocks)
            want = cache.to_plain()
            symptoms = _match_diagnosis(before, root, got, expected)
            if got != expected:
                raise _with_symptoms(f"{what}: returned blocks {got}, expected {expected} (the longest cached "
                                     "prefix in whole blocks)", symptoms)
            if symptoms:
                raise _with_symptoms(f"{what}: the tree after the match is wrong", symptoms)
            learner = _learner_tree(what, root, block_size)
            difference = _first_difference(learner.to_plain(), want)
            if difference:
                raise ContractError(f"{what}: after the match, {difference}")


# -- exercise 7: a finished request lets go; eviction under locks -----------------------------------------
def variant_evict(cache: RadixCache, n_blocks: int, *, oldest_first: bool = True, bottom_up: bool = True,
                  fold: bool = True) -> list[int] | None:
    """``RadixCache.evict`` with one known fault switched on, on CACHE (changed in place; the checker passes a
    copy): the most recently used leaf first
    (oldest_first=False), a parent left without children never a candidate (bottom_up=False), a parent left
    with one child never folded into it (fold=False). With no flag it evicts as the reference does; None
    when the variant runs out of candidates."""
    candidates = [n for n in cache.nodes() if not n.children and n.lock == 0]
    evicted: list[int] = []
    while len(evicted) < n_blocks:
        if not candidates:
            return None
        leaf = (min if oldest_first else max)(candidates, key=lambda n: n.last_access)
        candidates.remove(leaf)
        parent = leaf.parent
        del parent.children[leaf.key[:cache.block_size]]
        evicted.extend(leaf.blocks)
        if parent is cache.root:
            continue
        if not parent.children and parent.lock == 0:
            if bottom_up:
                candidates.append(parent)
        elif len(parent.children) == 1 and fold:
            (child,) = parent.children.values()
            if child.lock == parent.lock:
                grand = parent.parent
                del grand.children[parent.key[:cache.block_size]]
                child.key, child.blocks, child.parent = parent.key + child.key, parent.blocks + child.blocks, grand
                child.last_access = max(child.last_access, parent.last_access)
                grand.children[child.key[:cache.block_size]] = child
    return evicted


_EVICT_FAULTS = {
    "the most recently used leaf evicted first (least recently used first: smallest last_access)":
        dict(oldest_first=False),
    "a parent left without children never became a candidate (eviction goes bottom up: such a parent is a "
    "leaf now, evictable when nobody holds it)": dict(bottom_up=False),
    "a parent left with one child was not folded into it (the child takes the parent's key and blocks in "
    "front of its own and the larger last_access; the order of later evictions depends on it)": dict(fold=False),
}


def _fixed_evict_tree() -> RadixCache:
    """Case 0 of the eviction check (block size 1), built in this order: [5, 5] held by a running request
    before anything else (the oldest leaf, locked); [1, 0, 3] and [1, 3, 0], which split [1] off; [0, 2, 0, 6]
    held (a path of two nodes the check releases); then [1] used again. Evicting 3 blocks takes [0, 3],
    folds [1] into [1, 3, 0] with [1]'s recent tick, and then takes [6], not [1, 3, 0]."""
    cache = RadixCache(block_size=1)
    cache.insert([5, 5], [40, 41])
    cache.acquire(cache.match([5, 5]).node)
    cache.insert([1, 0, 3], [10, 11, 12])
    cache.insert([1, 3, 0], [10, 13, 14])
    cache.insert([0, 2, 0], [20, 21, 22])
    cache.insert([0, 2, 0, 6], [20, 21, 22, 23])
    cache.acquire(cache.match([0, 2, 0, 6]).node)
    cache.match([1])
    return cache


def _check_refused_eviction(evict: Callable, root: dict, cache: RadixCache, case: int, block_size: int) -> None:
    """evict asked for one block more than the unlocked nodes hold must raise ValueError and leave the tree
    as it was (validate, then evict)."""
    n_blocks = cache.evictable_blocks + 1
    what = f"radix_evict(case {case}, n_blocks {n_blocks}, one more than the unlocked nodes hold)"
    try:
        evict(root, n_blocks, block_size)
    except ValueError:
        learner = _learner_tree(what, root, block_size)
        difference = _first_difference(learner.to_plain(), cache.to_plain(), ignore_root_tick=False)
        if difference:
            raise ContractError(f"{what} raised ValueError but changed the tree first: {difference} (check the "
                                "request against the unlocked blocks before evicting anything)") from None
        return
    raise ContractError(f"{what} must raise ValueError (nothing can free that many blocks)")


def check_radix_evict(release: Callable, evict: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: on a plain radix tree (``RadixCache.to_plain``'s form) with paths held by running requests,
    release(root, tokens, block_size) does what ``RadixCache.release`` does for the node TOKENS end at
    (lowers the lock count of every node on its path from the root, in place), and evict(root, n_blocks,
    block_size) what ``RadixCache.evict`` does: evicts at least N_BLOCKS blocks, the least recently used
    unlocked leaf first, bottom up (a parent left a leaf joins the candidates when nobody holds it), folds a
    parent left with one child and the same lock count into that child (the child takes the parent's key and
    blocks in front of its own and the larger last_access) and returns the evicted block ids in order;
    asked for more blocks than unlocked nodes hold, it raises ValueError and changes nothing. Each case
    releases a held path of two or more nodes, evicts, asks for one block too many, and evicts the rest.
    Case 0 is fixed (``_fixed_evict_tree``): the oldest leaf is locked, and a fold changes which leaf
    leaves next. After each call the tree must equal the reference's exactly."""
    check_own_function("radix_release", release)
    check_own_function("radix_evict", evict)
    rng = random.Random(seed)
    for case in range(cases):
        if case == 0:
            cache, block_size, tokens = _fixed_evict_tree(), 1, [0, 2, 0, 6]
        else:
            for _ in attempts("Lab 3"):
                block_size = (2, 1, 3)[case - 1] if case < 4 else rng.randint(1, 4)
                cache, cached, held = _draw_radix(rng, block_size, prompts=rng.randint(6, 9))
                deep = [t for t in held if _depth(cache.find(t)) >= 2]
                if deep and cache.evictable_blocks >= 2:
                    break
            tokens = rng.choice(deep)
        root, before = cache.to_plain(), cache.to_plain()
        what = f"radix_release(case {case}, block_size {block_size}, tokens {tokens})"
        release(root, list(tokens), block_size)
        cache.release(cache.find(tokens))
        learner = _learner_tree(what, root, block_size)
        difference = _first_difference(learner.to_plain(), cache.to_plain(), ignore_root_tick=False)
        if difference:
            only_last = RadixCache.from_plain(before, block_size)
            only_last.find(tokens).lock -= 1
            raise named_faults(f"{what}: after the release, {difference}", [
                "a finished request's count released only at the node its tokens end at (every node of the path, "
                "from the root's child down, holds one count for it)"] if learner.to_plain() == only_last.to_plain()
                else [])
        for step in range(2):
            if step == 1:
                _check_refused_eviction(evict, root, cache, case, block_size)
            n_blocks = (3 if case == 0 else rng.randint(1, max(1, cache.evictable_blocks // 2))) if step == 0 \
                else cache.evictable_blocks
            if n_blocks == 0:
                break
            what = f"radix_evict(case {case}, step {step}, block_size {block_size}, n_blocks {n_blocks})"
            before = cache.to_plain()
            got = check_int_list(what, evict(root, n_blocks, block_size))
            expected = cache.evict(n_blocks)
            if got != expected:     # the reference never evicts a held block: only a wrong answer can
                held = sorted(set(got) & {b for n in RadixCache.from_plain(before, block_size).nodes() if n.lock
                                          for b in n.blocks})
                if held:
                    raise with_diagnosis(f"{what}: evicted {got}, expected {expected}", f"blocks {held} belong to "
                                         "nodes a running request holds (lock count > 0): a locked node is never "
                                         "evicted", likely=False)
                raise named_faults(f"{what}: evicted {got}, expected {expected}", [
                    name for name, flags in _EVICT_FAULTS.items()
                    if variant_evict(RadixCache.from_plain(before, block_size), n_blocks, **flags) == got])
            learner = _learner_tree(what, root, block_size)
            difference = _first_difference(learner.to_plain(), cache.to_plain(), ignore_root_tick=False)
            if difference:
                raise ContractError(f"{what}: after the eviction, {difference} (a parent left with one child and "
                                    "the same lock count is folded into it)")


# -- exercise 5: the price of a token on a device that is not always busy -----------------------------
def _price_variants(out: float, prompt: float, seconds: float, price: float, u: float) -> dict[str, float]:
    """The utilisation-adjusted price with each known fault, on the same inputs."""
    tps = out / seconds
    return {
        "the utilisation multiplied instead of divided (idle hours are paid too, so a device busy a share u of its "
        "hours makes each token cost 1/u times more)": price / 3600 / tps * u * 1e6,
        "the hourly price used as a price per second (divide $/h by 3,600 before dividing by tokens per second)":
            price / (tps * u) * 1e6,
        "the hourly price divided by 60 instead of 3,600 (an hour has 3,600 seconds)": price / 60 / (tps * u) * 1e6,
        "the prompt tokens counted as output (a price per million output tokens divides by the output tokens only)":
            price / 3600 / ((out + prompt) / seconds * u) * 1e6,
        "a price per token, not per million tokens (multiply by 1e6)": price / 3600 / (tps * u),
    }


def check_cost_per_million(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(output_tokens, prompt_tokens, seconds, dollars_per_hour, utilisation) returns the dollars
    per million output tokens of a device rented at dollars_per_hour that served output_tokens (and prompts
    of prompt_tokens) in ``seconds`` of busy time and is busy a share ``utilisation`` of the hours paid:
    ``course_lib.scheduling.cost_per_million_tokens(output_tokens / seconds, dollars_per_hour, utilisation)``
    within a relative 1e-9, as a real number. Case 0 is the 24GB-bf16 capacity run of section 6 (about 466
    output tokens/s at $1.00/h) always busy, case 1 the same device 30 % used; the rest are drawn."""
    check_own_function("cost_per_million", fn)
    rng = random.Random(seed)
    for case in range(cases):
        if case < 2:
            out, prompt, seconds, price = 521_220, 1_200_467, 1117.8, 1.0
            u = 1.0 if case == 0 else 0.3
        else:
            seconds = 10 ** rng.uniform(1, 5)
            out = rng.randint(1_000, 10_000_000)
            prompt = rng.randint(1_000, 30_000_000)
            price, u = round(10 ** rng.uniform(-1, 1.3), 2), round(rng.uniform(0.05, 0.95), 3)
        what = (f"cost_per_million(case {case}: {out:,} output tokens, {prompt:,} prompt tokens in {seconds:.6g} s, "
                f"${price}/h, utilisation {u})")
        got = check_real(what, fn(out, prompt, seconds, price, u))
        expected = ref.cost_per_million_tokens(out / seconds, price, u)
        if _close(got, expected):
            continue
        err = f"{what}: expected ${expected!r} per million output tokens, got {got!r}"
        raise named_faults(err, [name for name, value in _price_variants(out, prompt, seconds, price, u).items()
                                 if _close(got, value)])


# -- exercise 8: load a saved prefix or recompute it -----------------------------------------------------
TIER_KEYS = ("load_s", "recompute_s", "break_even_bandwidth", "load_wins")


def _tier_variants(L: float, S: float, B: float, T: float) -> dict[str, dict]:
    """The tiered-cache answer with each known fault, on the same inputs."""
    return {
        "the bandwidth read as bits per second (a link's bytes/s are its bits/s / 8; here B is already in "
        "bytes/s)": {"load_s": L * S * 8 / B},
        "the break-even bandwidth multiplied by the prefix length (T * S_kv is bytes per second, whatever L)":
            {"break_even_bandwidth": L * T * S},
        "the break-even bandwidth as S_kv / T instead of T * S_kv (positions per second times bytes per "
        "position)": {"break_even_bandwidth": S / T},
        "loading said to win at the break-even point (it wins only when T * S_kv < B: equal times are no "
        "gain)": {"load_wins": T * S <= B},
        "the verdict reversed (loading wins when the link is faster than the break-even bandwidth)":
            {"load_wins": T * S > B},
    }


def check_load_or_recompute(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(positions, kv_bytes_per_position, bandwidth, prefill_rate) returns a dict with
    ``load_s`` = L * S_kv / B and ``recompute_s`` = L / T (seconds), ``break_even_bandwidth`` = T * S_kv
    (bytes/s) within a relative 1e-9 of ``course_lib.cache.tiers``, and ``load_wins`` (a bool) =
    T * S_kv < B. Case 0 is this machine's measured SmolLM2-135M row of docs/kv_cache.md (1,024 positions of
    46,080 bytes, 488 positions/s, a 22.8 GB/s memory copy); case 1 sits exactly at the break-even point
    (dyadic numbers: T * S_kv == B, loading does not win); case 2 is a 70B-class model with full attention
    over an NVMe SSD (recompute wins); the rest are drawn from the seed."""
    check_own_function("load_or_recompute", fn)
    rng = random.Random(seed)
    for case in range(cases):
        if case == 0:
            L, S, B, T = 1024, 46_080, 22.8e9, 488.0
        elif case == 1:
            L, S, T = rng.randint(1, 4096), 2 ** rng.randint(10, 20), 2.0 ** rng.randint(4, 12)
            B = T * S
        elif case == 2:
            L, S = 2048, tiers.KV_LAYOUTS_70B[0].bytes_per_position
            B, T = next(link for link in tiers.LINKS if "SSD" in link.name).bandwidth, \
                tiers.prefill_rate_bound(70e9, 989e12, 0.5)
        else:
            L, S = rng.randint(1, 100_000), rng.randint(1_000, 3_000_000)
            T, B = 10 ** rng.uniform(1, 4.5), 10 ** rng.uniform(6, 11.5)
        what = f"load_or_recompute(case {case}: {L} positions, {S} bytes each, bandwidth {B:.6g} B/s, {T:.6g} positions/s)"
        got = fn(L, S, B, T)
        if type(got) is not dict:
            raise ContractError(f"{what} must return a dict, got {type(got).__qualname__}")
        missing = [key for key in TIER_KEYS if key not in got]
        if missing:
            raise ContractError(f"{what}: the dict lacks {', '.join(map(repr, missing))} (needs {', '.join(TIER_KEYS)})")
        expected = {"load_s": tiers.load_seconds(L, S, B), "recompute_s": tiers.recompute_seconds(L, T),
                    "break_even_bandwidth": tiers.break_even_bandwidth(T, S),
                    "load_wins": tiers.load_beats_recompute(T, S, B)}
        for key in TIER_KEYS:
            if key == "load_wins":
                if type(got[key]) not in (bool, np.bool_):
                    raise ContractError(f"{what}['load_wins'] must be a bool, got {type(got[key]).__qualname__}")
                ok = bool(got[key]) == expected[key]
                value = bool(got[key])
            else:
                value = check_real(f"{what}[{key!r}]", got[key])
                ok = _close(value, expected[key])
            if ok:
                continue
            err = f"{what}: {key} expected {expected[key]!r}, got {value!r}"
            raise named_faults(err, [name for name, values in _tier_variants(L, S, B, T).items()
                                     if key in values and (values[key] == value if key == "load_wins"
                                                           else _close(value, values[key]))])


# -- the lab's declared tables (see tables.py) -------------------------------------------------
CONTRACTS = (
    Contract("test_iteration_time", check_iteration_time, ("iteration_time",),
             references=("course_lib.scheduling.cost.iteration_time", "course_lib.scheduling.cost.iteration_seconds",
                         "course_lib.scheduling.cost.iteration_work")),
    Contract("test_schedule_step", check_schedule_step, ("schedule_step",),
             references=("course_lib.scheduling.step.chunked_step", "course_lib.scheduling.step.admit",
                         "course_lib.scheduling.step.plan_chunks", "course_lib.scheduling.step.evictions",
                         "course_lib.grading.lab03.variant_step")),
    Contract("test_serving_metrics", check_serving_metrics, ("serving_metrics",),
             references=("course_lib.scheduling.metrics.metrics",)),
    Contract("test_find_capacity", check_find_capacity, ("find_capacity",),
             references=("course_lib.scheduling.capacity_search.capacity", "course_lib.grading.lab03.variant_bisect")),
    Contract("test_cost_per_million", check_cost_per_million, ("cost_per_million",),
             references=("course_lib.scheduling.cost.cost_per_million_tokens",)),
    Contract("test_radix_match", check_radix_match, ("radix_match",), writes=Writes(args=(0,)),
             references=("course_lib.cache.radix.RadixCache.match", "course_lib.cache.radix.RadixCache._walk",
                         "course_lib.cache.radix.RadixCache._matched", "course_lib.cache.radix.RadixCache._split")),
    Contract("test_radix_evict", check_radix_evict, ("radix_release", "radix_evict"), writes=Writes(args=(0,)),
             references=("course_lib.cache.radix.RadixCache.release", "course_lib.cache.radix.RadixCache.evict",
                         "course_lib.cache.radix.RadixCache._path", "course_lib.cache.radix.RadixCache._fold",
                         "course_lib.grading.lab03.variant_evict")),
    Contract("test_load_or_recompute", check_load_or_recompute, ("load_or_recompute",),
             references=("course_lib.cache.tiers.load_seconds", "course_lib.cache.tiers.recompute_seconds",
                         "course_lib.cache.tiers.break_even_bandwidth", "course_lib.cache.tiers.load_beats_recompute")),
)

FAULTS = (
    Fault("cost_sum_not_max",
          (Edit("iteration_time", "return max(memory_s, compute_s)", "return memory_s + compute_s"),),
          {"test_iteration_time": "added instead of taking the max"},
          "adds the memory and compute times of an iteration instead of taking the larger"),
    Fault("attention_width_as_d_model",
          (Edit("iteration_time", "4 * d.n_layers * d.attention_width * attention",
                "4 * d.n_layers * d.d_model * attention"),),
          {"test_iteration_time": "attention counted with d_model"},
          "counts attention FLOPs with the model width instead of the query heads' n_heads * head_dim"),
    Fault("chunk_attention_without_kc",
          (Edit("iteration_time", "sum(k * c + k * (k + 1) // 2 for k, c in chunks)",
                "sum(k * (k + 1) // 2 for k, c in chunks)"),),
          {"test_iteration_time": r"without the k\*c term"},
          "charges a chunk's attention among its own new tokens only, not to the cached positions"),
    Fault("preempt_oldest",
          (Edit("schedule_step", "evicted.append(live[-1])", "evicted.append(live[0])"),),
          {"test_schedule_step": "oldest running request evicted"},
          "evicts the oldest running request instead of the most recently admitted one"),
    Fault("reprefill_forgets_generated",
          (Edit("schedule_step", "cost = prompt + generated", "cost = prompt"),),
          {"test_schedule_step": "forgetting the tokens it had already generated"},
          "re-admits a preempted request for its prompt only, forgetting the tokens it had generated"),
    Fault("decodes_outside_the_budget",
          (Edit("schedule_step",
                "k = target - filled if left is None else min(target - filled, left)\n"
                "            if k > 0:\n"
                "                chunks.append((i, k))\n"
                "                if left is not None:",
                "k = target - filled if left is None or target - filled == 1 else min(target - filled, left)\n"
                "            if k > 0:\n"
                "                chunks.append((i, k))\n"
                "                if left is not None and target - filled > 1:"),),
          {"test_schedule_step": "one-position chunk left out of the budget"},
          "lets decoding requests' one-position chunks bypass the per-iteration position budget"),
    Fault("tpot_divides_by_n_out",
          (Edit("serving_metrics", "/ (r.output - 1) for r in records if r.output > 1]",
                "/ r.output for r in records if r.output > 1]"),),
          {"test_serving_metrics": "TPOT divided by n_out"},
          "divides a request's decode time by n_out instead of its n_out - 1 gaps"),
    Fault("p99_mean_of_per_request_p99",
          (Edit("serving_metrics", '"itl99": float(np.quantile(itl, 0.99))',
                '"itl99": float(np.mean([np.quantile(g, 0.99) for g in gaps if len(g)]))'),),
          {"test_serving_metrics": "mean of per-request p99s"},
          "averages per-request p99 gaps instead of pooling every gap"),
    Fault("utilisation_multiplied",
          (Edit("cost_per_million", "return dollars_per_s / (tokens_per_s * utilisation) * 1e6",
                "return dollars_per_s / tokens_per_s * utilisation * 1e6"),),
          {"test_cost_per_million": "utilisation multiplied instead of divided"},
          "multiplies the price by the utilisation instead of dividing by it, so an idle device looks cheaper"),
    Fault("hourly_price_per_second",
          (Edit("cost_per_million", "dollars_per_s = dollars_per_hour / 3600", "dollars_per_s = dollars_per_hour"),),
          {"test_cost_per_million": "hourly price used as a price per second"},
          "divides the hourly price by tokens per second without converting it to dollars per second"),
    Fault("prompt_tokens_counted",
          (Edit("cost_per_million", "tokens_per_s = output_tokens / seconds",
                "tokens_per_s = (output_tokens + prompt_tokens) / seconds"),),
          {"test_cost_per_million": "prompt tokens counted as output"},
          "counts the prompt tokens with the output tokens in a price per million output tokens"),
    Fault("split_drops_child_blocks",
          (Edit("radix_match", 'child["key"], child["blocks"] = child["key"][cut:], child["blocks"][blocks:]',
                'child["key"], child["blocks"] = child["key"][cut:], []'),),
          {"test_radix_match": "are in no node after it"},
          "splits an edge without leaving the rest of its blocks with the child"),
    Fault("partial_block_reused",
          (Edit("radix_match", "full = same // block_size           # whole blocks only",
                "full = -(-same // block_size)      # a block matched in part counts too"),),
          {"test_radix_match": "matched only in part was offered for reuse"},
          "rounds a match up to the block its tokens reach, offering a partly matched block for reuse"),
    Fault("evict_locked_node",
          (Edit("radix_evict", 'candidates = [n for n in nodes if not n["children"] and n["lock"] == 0]',
                'candidates = [n for n in nodes if not n["children"]]'),),
          {"test_radix_evict": "a locked node is never evicted"},
          "lets eviction take leaves a running request holds"),
    Fault("count_not_released",
          (Edit("radix_evict", '    for node in path:\n        node["lock"] -= 1', '    path[-1]["lock"] -= 1'),),
          {"test_radix_evict": "released only at the node its tokens end at"},
          "releases a finished request's count on the last node of its path only"),
)
check_tables(CONTRACTS, FAULTS)
