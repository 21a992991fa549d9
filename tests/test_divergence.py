"""Where two runs part (course_lib.divergence): the first differing token and the top-2 logit gap."""
from __future__ import annotations

import pytest
import torch

from course_lib import grading
from course_lib.divergence import first_divergence, top2_gap


@pytest.mark.parametrize("a, b, expected", [
    ([1, 2, 3], [1, 2, 3], None), ([], [], None), ([1, 2, 3], [1, 5, 3], 1), ([4], [5], 0),
    ([1, 2], [1, 2, 3], 2), ((1, 2, 3), (1,), 1), ([], [7], 0),
])
def test_first_divergence_is_the_first_differing_index_or_the_shorter_length(a, b, expected):
    assert first_divergence(a, b) == expected


def test_top2_gap_is_largest_minus_second_largest_in_float64():
    logits = torch.tensor([[0.5, 3.0, 2.75], [1.0, 1.0, -2.0]], dtype=torch.float32)
    gaps = top2_gap(logits)
    assert gaps.dtype == torch.float64 and gaps.tolist() == [0.25, 0.0]
    assert top2_gap(logits[0]).shape == () and float(top2_gap(logits[0])) == 0.25


@pytest.mark.parametrize("bad, error, match", [
    ([1.0, 2.0], TypeError, "logits must be a Tensor"),
    (torch.tensor([1, 2]), TypeError, "logits must be a floating tensor"),
    (torch.zeros(3, 1), ValueError, r"at least 2 values .* got shape \(3, 1\)"),
    (torch.tensor(1.0), ValueError, r"got shape \(\)"),
])
def test_top2_gap_refuses_what_has_no_second_largest_logit(bad, error, match):
    with pytest.raises(error, match=match):
        top2_gap(bad)


def test_the_grading_package_still_offers_both():
    """Lab 5's notebook imports top2_gap from course_lib.grading; the checkers use the same functions."""
    assert grading.top2_gap is top2_gap and grading.first_divergence is first_divergence
