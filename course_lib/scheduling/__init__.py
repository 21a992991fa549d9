"""Lab 3: scheduling. An iteration cost model and serving cost accounting, the seeded workload
(Poisson or on/off arrivals), a serving simulator (static, reserve, paged and chunked policies, and
static batching with a memory check), serving metrics and the SLO capacity search.

Modules, in reading order: ``cost`` (one iteration's time), ``workload`` (the seeded trace),
``step`` (one iteration's scheduling rules: admission, chunk planning, preemption),
``reference`` (the simulator, one loop pass per iteration), ``fast`` (the same simulation,
bit for bit, from running totals), ``simulator`` (``run_trace``, ``simulate``), ``metrics``,
``capacity_search``. ``docs/scheduling.md`` gives every formula and rule with its sources.
``python -m course_lib.scheduling.bench`` times the full policy sweep and the four capacity
searches.
"""
from .capacity_search import BISECTION_STEPS, RATE_BOUNDS, capacity, meets_targets
from .cost import (CASE_D_MODEL, CASE_KV_BYTES_PER_TOKEN, CASE_LAYERS, CASE_N_MATMUL, HOURS_PER_YEAR, PROFILES,
                   SECONDS_PER_DAY, SECONDS_PER_HOUR, Deployment, Profile, break_even_tokens_per_day,
                   cost_per_million_tokens, iteration_seconds, iteration_time, iteration_work, joules_per_token,
                   max_tokens, owned_dollars_per_hour, utilisation_for_volume)
from .metrics import DEFAULT_TARGETS, METRIC_KEYS, metrics
from .reference import POLICIES, SWEEP_POLICIES, resolve_deployment, run_reference, run_with_step
from .simulator import ARRIVALS, run_trace, simulate
from .step import (ADMIT_FRACTION, CHUNK_BUDGET, MAX_RUNNING, STATIC_BATCH, STATIC_WAIT, RequestTooLargeError,
                   StepPlan, admit, admit_limit, as_plan, chunked_step, evictions, plan_chunks, static_batch)
from .workload import (BURST_ON_FRACTION, BURST_ON_SECONDS, MAX_OUTPUT, Request, RequestRecord,
                       make_bursty_workload, make_workload)

__all__ = [
    "Deployment", "Profile", "PROFILES", "iteration_time", "iteration_work", "iteration_seconds", "max_tokens",
    "cost_per_million_tokens", "utilisation_for_volume", "break_even_tokens_per_day", "owned_dollars_per_hour",
    "joules_per_token", "SECONDS_PER_HOUR", "SECONDS_PER_DAY", "HOURS_PER_YEAR",
    "CASE_N_MATMUL", "CASE_LAYERS", "CASE_D_MODEL", "CASE_KV_BYTES_PER_TOKEN",
    "Request", "RequestRecord", "make_workload", "make_bursty_workload", "MAX_OUTPUT", "BURST_ON_FRACTION",
    "BURST_ON_SECONDS", "ARRIVALS",
    "StepPlan", "as_plan", "chunked_step", "admit", "static_batch", "plan_chunks", "evictions", "admit_limit",
    "RequestTooLargeError",
    "CHUNK_BUDGET", "MAX_RUNNING", "ADMIT_FRACTION", "STATIC_BATCH", "STATIC_WAIT",
    "POLICIES", "SWEEP_POLICIES", "run_trace", "run_reference", "run_with_step", "simulate", "resolve_deployment",
    "metrics", "METRIC_KEYS", "DEFAULT_TARGETS",
    "capacity", "meets_targets", "BISECTION_STEPS", "RATE_BOUNDS",
]
