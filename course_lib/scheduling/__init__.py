"""Lab 3: scheduling. An iteration cost model, the seeded workload, a serving simulator
(static, reserve, paged and chunked policies), serving metrics and the SLO capacity search.

Modules, in reading order: ``cost`` (one iteration's time), ``workload`` (the seeded trace),
``step`` (one iteration's scheduling rules: admission, chunk planning, preemption),
``reference`` (the simulator, one loop pass per iteration), ``fast`` (the same simulation,
bit for bit, from running totals), ``simulator`` (``run_trace``, ``simulate``), ``metrics``,
``capacity_search``. ``docs/scheduling.md`` gives every formula and rule with its sources.
``python -m course_lib.scheduling.bench`` times the full policy sweep and the four capacity
searches.
"""
from .capacity_search import BISECTION_STEPS, RATE_BOUNDS, capacity, meets_targets
from .cost import (CASE_D_MODEL, CASE_KV_BYTES_PER_TOKEN, CASE_LAYERS, CASE_N_MATMUL, PROFILES, Deployment, Profile,
                   cost_per_million_tokens, iteration_seconds, iteration_time, iteration_work, max_tokens)
from .metrics import DEFAULT_TARGETS, METRIC_KEYS, metrics
from .reference import POLICIES, resolve_deployment, run_reference, run_with_step
from .simulator import run_trace, simulate
from .step import (ADMIT_FRACTION, CHUNK_BUDGET, MAX_RUNNING, STATIC_BATCH, STATIC_WAIT, RequestTooLargeError,
                   StepPlan, admit, admit_limit, as_plan, chunked_step, evictions, plan_chunks)
from .workload import MAX_OUTPUT, Request, RequestRecord, make_workload

__all__ = [
    "Deployment", "Profile", "PROFILES", "iteration_time", "iteration_work", "iteration_seconds", "max_tokens",
    "cost_per_million_tokens",
    "CASE_N_MATMUL", "CASE_LAYERS", "CASE_D_MODEL", "CASE_KV_BYTES_PER_TOKEN",
    "Request", "RequestRecord", "make_workload", "MAX_OUTPUT",
    "StepPlan", "as_plan", "chunked_step", "admit", "plan_chunks", "evictions", "admit_limit",
    "RequestTooLargeError",
    "CHUNK_BUDGET", "MAX_RUNNING", "ADMIT_FRACTION", "STATIC_BATCH", "STATIC_WAIT",
    "POLICIES", "run_trace", "run_reference", "run_with_step", "simulate", "resolve_deployment",
    "metrics", "METRIC_KEYS", "DEFAULT_TARGETS",
    "capacity", "meets_targets", "BISECTION_STEPS", "RATE_BOUNDS",
]
