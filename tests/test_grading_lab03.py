"""Lab 3 checkers: correct functions pass on many seeds; each injected fault of the lab fails
its check on every seed with a message that names the symptom; rigged results are refused."""
import inspect

import numpy as np
import pytest

from course_lib import scheduling
from course_lib.grading import ContractError, lab03

import lab03_reference as ref

SEEDS = [0, 1, 2, 3, 12345, 2**31 - 1]


def _patched(fn, old, new):
    """The reference function with one source edit (as the lab's fault samples are made)."""
    source = inspect.getsource(fn)
    assert source.count(old) == 1, (old, source)
    namespace = dict(vars(ref))
    exec(source.replace(old, new), namespace)
    return namespace[fn.__name__]


FAULTS = {
    "sum not max": (lab03.check_iteration_time, ref.iteration_time,
                    "return max(memory_s, compute_s)", "return memory_s + compute_s", "added instead of taking the max"),
    "no k*c": (lab03.check_iteration_time, ref.iteration_time,
               "sum(k * c + k * (k + 1) // 2", "sum(k * (k + 1) // 2", "without the k\\*c term"),
    "evict oldest": (lab03.check_schedule_step, ref.schedule_step,
                     "evicted.append(live[-1])", "evicted.append(live[0])", "oldest running request evicted"),
    "forget generated": (lab03.check_schedule_step, ref.schedule_step,
                         "cost = prompt + generated", "cost = prompt", "forgetting the tokens it had already generated"),
    "tpot / n_out": (lab03.check_serving_metrics, ref.serving_metrics,
                     "/ (r.output - 1) for r in records if r.output > 1]", "/ r.output for r in records if r.output > 1]",
                     "TPOT divided by n_out"),
    "p99 of per-request p99s": (lab03.check_serving_metrics, ref.serving_metrics,
                                '"itl99": float(np.quantile(itl, 0.99))',
                                '"itl99": float(np.mean([np.quantile(g, 0.99) for g in gaps if len(g)]))',
                                "mean of per-request p99s"),
    "goodput strict <": (lab03.check_serving_metrics, ref.serving_metrics,
                         "t <= targets[0] and (len(g) == 0 or g.max() <= targets[1])",
                         "t < targets[0] and (len(g) == 0 or g.max() < targets[1])", "strict < instead of <="),
    "chunk bytes missing": (lab03.check_iteration_time, ref.iteration_time,
                            "context = sum(decodes) + sum(c for k, c in chunks)", "context = sum(decodes)",
                            "cached positions left out of the bytes"),
    "admission against all memory": (lab03.check_schedule_step, ref.schedule_step,
                                     "> 0.99 * device.memory", "> device.memory", "instead of 0.99"),
    "evict at exactly full": (lab03.check_schedule_step, ref.schedule_step,
                              "* device.kv > device.memory:", "* device.kv >= device.memory:",
                              "exactly fill memory"),
}


@pytest.mark.parametrize("seed", SEEDS)
def test_correct_functions_pass(seed):
    lab03.check_iteration_time(ref.iteration_time, seed)
    lab03.check_schedule_step(ref.schedule_step, seed)
    lab03.check_serving_metrics(ref.serving_metrics, seed)
    lab03.check_find_capacity(ref.find_capacity, seed)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_each_fault_fails_with_its_symptom(fault, seed):
    check, fn, old, new, symptom = FAULTS[fault]
    with pytest.raises(ContractError, match=symptom):
        check(_patched(fn, old, new), seed)


def test_spec_figures_of_the_reference_learner():
    d = scheduling.Device()
    assert round(ref.iteration_time([], [(4000, 0)], d), 3) == 0.923
    assert round(ref.iteration_time([5000] * 18, [], d) * 1e3, 2) == 18.77
    assert round(ref.iteration_time([5000] * 17, [(512, 0)], d) * 1e3, 2) == 116.04
    assert round(ref.iteration_time([5000] * 17, [(512, 2000)], d) * 1e3, 2) == 123.36
    assert round(ref.iteration_time([5000] * 17, [(128, 0)], d) * 1e3, 2) == 32.05
    assert round(ref.iteration_time([5000] * 17, [(128, 2000)], d) * 1e3, 2) == 33.88


@pytest.mark.parametrize("flags, symptom", [
    (dict(keep_upper=True), "upper bound returned"),
    (dict(ttft_only=True), "only the TTFT target"),
    (dict(steps_delta=1), "one bisection step too many"),
])
def test_capacity_faults_are_named(flags, symptom):
    def search(run, targets=(3.0, 0.1), lo=0.01, hi=4.0, steps=10):
        return lab03._bisect(run, targets, lo, hi, steps, **flags)
    with pytest.raises(ContractError, match=symptom):
        lab03.check_find_capacity(search, seed=0)


class Rigged(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__


def test_rigged_and_malformed_results_are_refused():
    with pytest.raises(ContractError, match="must be a number"):
        lab03.check_iteration_time(lambda *a: Rigged(0.0))
    with pytest.raises(ContractError, match="StepPlan"):
        lab03.check_schedule_step(lambda *a, **k: {"admitted": 0})
    with pytest.raises(ContractError, match="int"):
        lab03.check_schedule_step(lambda r, q, d, **k: (True, (), (), ()))
    with pytest.raises(ContractError, match="must return a dict"):
        lab03.check_serving_metrics(lambda records, targets: [1.0])
    with pytest.raises(ContractError, match="lacks"):
        lab03.check_serving_metrics(lambda records, targets: {"ttft50": 1.0})
    with pytest.raises(ContractError, match="course_lib's reference"):
        lab03.check_iteration_time(scheduling.iteration_time)


def test_an_equivalent_midpoint_and_plain_lists_are_accepted():
    def search(run, targets=(3.0, 0.1), lo=0.01, hi=4.0, steps=10):
        for _ in range(steps):
            mid = lo + (hi - lo) / 2
            ok = run(mid)["ttft99"] <= targets[0] and run(mid)["itl99"] <= targets[1]
            lo, hi = (mid, hi) if ok else (lo, mid)
        return lo

    def as_lists(*args, **kwargs):
        plan = ref.schedule_step(*args, **kwargs)
        return [plan.admitted, list(plan.preempted)[::-1], list(plan.decodes), [list(c) for c in plan.chunks]]

    with pytest.raises(ContractError, match="probe \\d+ was"):  # two calls per step: the probes differ
        lab03.check_find_capacity(search, seed=0)
    once = _patched(ref.find_capacity, "mid = (lo + hi) / 2", "mid = lo + (hi - lo) / 2")
    for seed in SEEDS:
        lab03.check_find_capacity(once, seed)
        lab03.check_schedule_step(as_lists, seed)


def test_a_faulty_step_also_fails_inside_a_simulation():
    """The run-level check catches a step fault even where the single-step cases are skipped."""
    faulty = _patched(ref.schedule_step, "evicted.append(live[-1])", "evicted.append(live[0])")
    with pytest.raises(ContractError, match="simulation|refused"):
        lab03._check_step_in_a_run(faulty, __import__("random").Random(0))
