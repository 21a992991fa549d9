"""Lab 3: scheduling. An iteration cost model, the seeded workload, a fast serving simulator
(static, reserve, paged and chunked policies), serving metrics and the SLO capacity search.

Source of every formula and rule: COURSE_SPEC.md "Lab 3: scheduling" and the Lab 3 issue's
"Exact semantics". ``python -m course_lib.scheduling.bench`` times the full policy sweep and
the four capacity searches.
"""
from .capacity_search import BISECTION_STEPS, RATE_BOUNDS, capacity, meets_targets
from .cost import (CASE_D_MODEL, CASE_KV_BYTES, CASE_LAYERS, CASE_N_MATMUL, PROFILES, Device, DeviceProfile,
                   cost_per_million_tokens, iteration_time)
from .metrics import DEFAULT_TARGETS, METRIC_KEYS, metrics
from .simulator import POLICIES, resolve_device, run_trace, run_with_step, simulate
from .step import (ADMIT_FRACTION, CHUNK_BUDGET, MAX_RUNNING, STATIC_BATCH, STATIC_WAIT, RequestTooLargeError,
                   StepPlan, as_plan, chunked_step)
from .workload import MAX_OUTPUT, Request, RequestRecord, make_workload

__all__ = [
    "Device", "DeviceProfile", "PROFILES", "iteration_time", "cost_per_million_tokens",
    "CASE_N_MATMUL", "CASE_LAYERS", "CASE_D_MODEL", "CASE_KV_BYTES",
    "Request", "RequestRecord", "make_workload", "MAX_OUTPUT",
    "StepPlan", "as_plan", "chunked_step", "RequestTooLargeError",
    "CHUNK_BUDGET", "MAX_RUNNING", "ADMIT_FRACTION", "STATIC_BATCH", "STATIC_WAIT",
    "POLICIES", "run_trace", "run_with_step", "simulate", "resolve_device",
    "metrics", "METRIC_KEYS", "DEFAULT_TARGETS",
    "capacity", "meets_targets", "BISECTION_STEPS", "RATE_BOUNDS",
]
