"""Lab 1 checkers: correct functions pass on many seeds; each injected fault of the issue
fails the checks it should (and only those), with a message that names the symptom; rigged
return values are refused."""
import math

import pytest

from course_lib import roofline
from course_lib.grading import ContractError, check_real, check_significant, lab01

import lab01_reference as ref

SEEDS = [0, 1, 2, 12345, 2**31 - 1]
CHECKS = {
    "params": lambda m, s: lab01.check_parameter_count(m.count_parameters, s),
    "kv": lambda m, s: lab01.check_kv_bytes_per_token(m.kv_bytes_per_token, s),
    "prefill": lambda m, s: lab01.check_prefill_time(m.prefill_time, s),
    "decode": lambda m, s: lab01.check_decode_step_bound(m.decode_step_bound, s),
    "gemv": lambda m, s: lab01.check_gemv_intensity(m.gemv_intensity, s),
    "gemm": lambda m, s: lab01.check_gemm_intensity(m.gemm_intensity, s),
    "fit": lambda m, s: lab01.check_requests_that_fit(m.requests_that_fit, s),
}


class Learner:
    """The reference solution with some functions replaced; later functions call the
    replacements (as a notebook's functions call each other)."""

    def __init__(self, **overrides):
        for name in ("count_parameters", "kv_bytes_per_token", "prefill_time", "decode_step_bound",
                     "gemv_intensity", "gemm_intensity", "requests_that_fit"):
            setattr(self, name, overrides.get(name, getattr(ref, name)))
        if "kv_bytes_per_token" in overrides or "count_parameters" in overrides:
            kv, count = self.kv_bytes_per_token, self.count_parameters

            def decode(config, device, batch, context, weight_bytes, kvb=2):
                memory = (weight_bytes + batch * kv(config, kvb) * context) / (device.bandwidth_tbps * 1e12)
                compute = (2 * count(config)[1] * batch + 4 * config.n_layers * config.d_model * batch * context) \
                    / (device.dense_tflops * 1e12)
                return max(memory, compute)

            def prefill(config, device, tokens, mfu=0.5):
                flops = 2 * count(config)[1] * tokens + 2 * config.n_layers * config.d_model * tokens ** 2
                return flops / (mfu * device.dense_tflops * 1e12)

            def fit(config, device, w, prompt, output, overhead=2.5):
                free = device.capacity_gb * 1e9 - w - overhead * 1e9
                return max(0, math.floor(free / (kv(config, 2) * (prompt + output))))
            self.decode_step_bound, self.prefill_time, self.requests_that_fit = decode, prefill, fit


@pytest.mark.parametrize("seed", SEEDS)
def test_correct_functions_pass(seed):
    for check in CHECKS.values():
        check(Learner(), seed)


def test_case_model_reference_figures():
    """The spec's figures (typed from COURSE_SPEC "Lab 1") from the reference learner."""
    case = roofline.case_model()
    assert ref.count_parameters(case) == (9_550_729_216, 8_927_875_072)
    assert ref.kv_bytes_per_token(case, 2) == 147_456
    assert ref.kv_bytes_per_token(case, 1) == 73_728


def _decode_sum(config, device, batch, context, weight_bytes, kvb=2):
    memory = (weight_bytes + batch * ref.kv_bytes_per_token(config, kvb) * context) / (device.bandwidth_tbps * 1e12)
    compute = (2 * ref.count_parameters(config)[1] * batch + 4 * config.n_layers * config.d_model * batch * context) \
        / (device.dense_tflops * 1e12)
    return memory + compute


def _fit_gib(config, device, w, prompt, output, overhead=2.5):
    free = device.capacity_gb * 2**30 - w - overhead * 2**30
    return max(0, math.floor(free / (ref.kv_bytes_per_token(config, 2) * (prompt + output))))


FAULTS = {
    "untied embedding in N_matmul": (
        dict(count_parameters=lambda c: (ref.count_parameters(c)[0],) * 2),
        {"params": "untied input embedding counted in N_matmul", "prefill": "N \\(all parameters\\)",
         "decode": "N \\(all parameters"}),
    "K and V counted once": (
        dict(kv_bytes_per_token=lambda c, b=2: c.n_layers * c.n_kv_heads * c.head_dim * b),
        {"kv": "factor 2 for K and V forgotten", "decode": "without the factor 2", "fit": "without the factor 2"}),
    "query heads": (
        dict(kv_bytes_per_token=lambda c, b=2: 2 * c.n_layers * c.n_heads * c.head_dim * b),
        {"kv": "query heads .* used instead of KV heads", "decode": "query heads instead of KV heads",
         "fit": "query heads instead of KV heads"}),
    "GiB for GB": (dict(requests_that_fit=_fit_gib), {"fit": "binary GiB"}),
    "q and o sized d x d": (
        dict(count_parameters=lambda c: tuple(x + 2 * c.n_layers * c.d_model * (c.d_model - c.n_heads * c.head_dim)
                                              for x in ref.count_parameters(c))),
        {"params": "W_q and W_o sized d x d"}),
    "sum instead of max": (dict(decode_step_bound=_decode_sum), {"decode": "added instead of taking the max"}),
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_each_fault_fails_exactly_its_checks_with_the_symptom(fault, seed):
    overrides, expected = FAULTS[fault]
    learner = Learner(**overrides)
    for name, check in CHECKS.items():
        if name in expected:
            with pytest.raises(ContractError, match=expected[name]):
                check(learner, seed)
        else:
            check(learner, seed)


class AlwaysEqual(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


@pytest.mark.parametrize("value", [AlwaysEqual(1.0), True, "1.0", None, [1.0], float("nan"), float("inf")])
def test_rigged_or_non_numbers_are_refused(value):
    with pytest.raises(ContractError):
        check_real("x", value)
    with pytest.raises(ContractError):
        lab01.check_prefill_time(lambda *a: value, seed=0)


def test_wrong_types_for_counts_are_refused():
    with pytest.raises(ContractError, match="must be an int"):
        lab01.check_kv_bytes_per_token(lambda c, b: float(ref.kv_bytes_per_token(c, b)), seed=0)
    with pytest.raises(ContractError, match="tuple"):
        lab01.check_parameter_count(lambda c: ref.count_parameters(c)[1], seed=0)
    with pytest.raises(ContractError, match="must be an int"):
        lab01.check_requests_that_fit(lambda *a: 3.0, seed=0)


def test_course_lib_reference_is_refused():
    with pytest.raises(ContractError, match="course_lib's reference"):
        lab01.check_gemv_intensity(roofline.gemv_intensity)


def test_significant_figures_contract():
    assert check_significant(1.0004, 1.0) == 1.0004
    with pytest.raises(ContractError, match="4 significant figures"):
        check_significant(1.0006, 1.0)
    with pytest.raises(ContractError):
        check_significant(-1.0, 1.0)


def test_requests_that_fit_draws_a_case_where_nothing_fits():
    # case 0 is drawn with weights + overhead above capacity: a negative count is named
    def negative(config, device, w, prompt, output, overhead=2.5):
        free = device.capacity_gb * 1e9 - w - overhead * 1e9
        return math.floor(free / (ref.kv_bytes_per_token(config, 2) * (prompt + output)))
    with pytest.raises(ContractError, match="negative count"):
        lab01.check_requests_that_fit(negative, seed=3)
