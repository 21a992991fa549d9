"""Floating-point formats from their bit layout (course_lib.quant.floats; docs/quantization.md#number-formats)."""
from __future__ import annotations

import pytest
import torch

from course_lib.quant import FLOAT_FORMATS, FloatFormat, float_format
from course_lib.validation import ArgumentTypeError


# Hand-written from the IEEE 754 and OCP fp8 specifications: (largest finite, eps, smallest normal).
EXPECTED = {
    "fp32": (3.4028234663852886e38, 2.0 ** -23, 2.0 ** -126),
    "bf16": (3.3895313892515355e38, 2.0 ** -7, 2.0 ** -126),
    "fp16": (65504.0, 2.0 ** -10, 2.0 ** -14),
    "fp8 E4M3": (448.0, 0.125, 2.0 ** -6),
    "fp8 E5M2": (57344.0, 0.25, 2.0 ** -14),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_layout_arithmetic_gives_the_specifications_figures(name):
    fmt = float_format(name)
    largest, eps, smallest_normal = EXPECTED[name]
    assert fmt.max_finite == largest
    assert fmt.eps == eps
    assert fmt.smallest_normal == smallest_normal


@pytest.mark.parametrize("fmt", FLOAT_FORMATS, ids=lambda f: f.name)
def test_layout_arithmetic_agrees_with_torch_finfo(fmt):
    assert fmt.torch_dtype is not None, "this torch has every dtype of the table"
    info = torch.finfo(fmt.torch_dtype)
    assert fmt.bits == info.bits
    assert fmt.max_finite == info.max
    assert fmt.eps == info.eps
    assert fmt.smallest_normal == info.smallest_normal


def test_e4m3_keeps_its_top_exponent_for_numbers_and_e5m2_does_not():
    e4m3, e5m2 = float_format("fp8 E4M3"), float_format("fp8 E5M2")
    assert e4m3.finite_only and not e5m2.finite_only
    # 448 = 1.75 * 2^8: exponent field 1111 (2^(15 - 7)), mantissa 110 (111 is NaN)
    assert torch.tensor(448.0).to(torch.float8_e4m3fn).view(torch.uint8).item() == 0b0_1111_110
    assert torch.tensor(1e6).to(torch.float8_e5m2).float().item() == float("inf")


def test_bad_layouts_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="exponent_bits"):
        FloatFormat("x", 1, 3)
    with pytest.raises(ValueError, match="mantissa_bits"):
        FloatFormat("x", 4, 0)
    with pytest.raises(ArgumentTypeError, match="finite_only"):
        FloatFormat("x", 4, 3, finite_only=1)
    with pytest.raises(ValueError, match="fp8 E4M3"):
        float_format("fp4")
