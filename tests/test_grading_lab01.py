"""Lab 1 checkers beyond the declared tables (tests/test_lab_tables.py runs the solution and every
fault of lab01.FAULTS): rigged or mistyped return values are refused, course_lib's own reference
is refused, and the drawn cases cover the edge cases."""
import math

import pytest

from course_lib import roofline
from course_lib.grading import (ContractError, attempts, check_real, check_significant, close, diagnose, lab01,
                                named_faults)

import solutions

ref = solutions.solution_functions("01_roofline")


def test_case_model_reference_figures():
    """The case model's reference figures (docs/roofline.md#reference-figures) from the solution."""
    case = roofline.case_model()
    assert ref.count_parameters(case) == (9_550_729_216, 8_927_875_072)
    assert ref.kv_bytes_per_token(case, 2) == 147_456
    assert ref.kv_bytes_per_token(case, 1) == 73_728


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
        lab01.check_requests_that_fit(lambda *a, **k: 3.0, seed=0)


def test_course_lib_reference_is_refused():
    with pytest.raises(ContractError, match="course_lib's reference"):
        lab01.check_gemv_intensity(roofline.gemv_intensity)


def test_significant_figures_contract():
    assert check_significant(1.0004, 1.0) == 1.0004
    with pytest.raises(ContractError, match="4 significant figures"):
        check_significant(1.0006, 1.0)
    with pytest.raises(ContractError):
        check_significant(-1.0, 1.0)


def test_shared_checker_helpers():
    """contracts.close, attempts and diagnose: the helpers every lab's checkers share."""
    assert close(1.0004, 1.0, rel=5e-4) and not close(1.0006, 1.0, rel=5e-4)
    assert close(float("nan"), float("nan"), rel=1e-9) and not close(float("nan"), 1.0, rel=1e-9)
    assert not close(1.0, float("inf"), rel=1e-9) and close(float("inf"), float("inf"), rel=1e-9)
    with pytest.raises(RuntimeError, match="Lab 9 grader: no suitable random case in 3 draws"):
        for _ in attempts("Lab 9", limit=3):
            pass
    variants = {"doubled": lambda: 2.0, "also doubled": lambda: 2.0, "halved": lambda: 0.5,
                "cannot run here": lambda: 1 / 0, "not applicable": lambda: None}
    err = diagnose("x: expected 1, got 2", 2.0, variants, lambda got, c: got == c)
    assert isinstance(err, ContractError) and "any of these faults" in str(err)
    assert "  - doubled\n  - also doubled\n" in str(err) and "halved" not in str(err)
    one = diagnose(ContractError("x"), 0.5, variants, lambda got, c: got == c)
    assert "with this fault: halved" in str(one) and "likely cause" in str(one)
    assert str(named_faults("x", [])) == "x"


def test_requests_that_fit_draws_a_case_where_nothing_fits():
    # case 0 is drawn with weights + overhead above capacity: a negative count is named
    def negative(config, device, *, weight_bytes, prompt_tokens, output_tokens, overhead_gb=2.5, kv_bytes_per_value=2):
        free = device.memory - weight_bytes - overhead_gb * 1e9
        return math.floor(free / (ref.kv_bytes_per_token(config, kv_bytes_per_value) * (prompt_tokens + output_tokens)))
    with pytest.raises(ContractError, match="negative count"):
        lab01.check_requests_that_fit(negative, seed=3)
