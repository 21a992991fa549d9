"""Activation-aware weight scaling for one layer (course_lib.quant.awq; docs/quantization.md)."""
from __future__ import annotations

import math

import pytest
import torch

from course_lib.quant import QuantScheme, awq_quantize, awq_scales, fake_quantize

SCHEME = QuantScheme(4, "group", 16)


def test_scales_by_hand():
    # s = [1, 4] ** 0.5 = [1, 2], divided by sqrt(2 * 1)
    s = awq_scales(torch.tensor([1.0, 4.0]), 0.5)
    assert torch.allclose(s, torch.tensor([1 / math.sqrt(2), math.sqrt(2)]))
    assert torch.equal(awq_scales(torch.tensor([3.0, 0.0, 7.0]), 0.0), torch.ones(3))
    # a dead channel is clamped to 1e-4 before normalising: [1e-4, 1] -> [0.01, 100] / 1
    s = awq_scales(torch.tensor([0.0, 1.0]), 1.0)
    assert torch.allclose(s, torch.tensor([0.01, 100.0]))


def test_alpha_zero_is_round_to_nearest_and_the_search_never_loses_to_it():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 32, generator=g)
    x = torch.randn(64, 32, generator=g)
    result = awq_quantize(w, x, SCHEME, grid=10)
    rtn = fake_quantize(w, SCHEME)
    rtn_err = float((x @ w.T - x @ rtn.T).pow(2).mean())
    assert math.isclose(result.errors[0.0], rtn_err, rel_tol=1e-6)
    assert float((x @ w.T - x @ result.weight.T).pow(2).mean()) <= rtn_err * (1 + 1e-6)
    assert sorted(result.errors) == [k / 10 for k in range(10)]


def test_a_salient_channel_is_protected():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 32, generator=g) * 0.1
    x = torch.randn(256, 32, generator=g)
    x[:, 5] *= 50.0                          # channel 5 carries most of the output
    result = awq_quantize(w, x, SCHEME)
    rtn = fake_quantize(w, SCHEME)
    assert result.alpha > 0
    assert result.scales[5] == result.scales.max()
    awq_err = (x @ w.T - x @ result.weight.T).pow(2).mean()
    rtn_err = (x @ w.T - x @ rtn.T).pow(2).mean()
    assert awq_err < 0.7 * rtn_err
    # column 5's own rounding error shrinks
    assert (w[:, 5] - result.weight[:, 5]).abs().mean() < (w[:, 5] - rtn[:, 5]).abs().mean()


def test_bad_inputs_are_refused():
    w = torch.randn(4, 16)
    with pytest.raises(ValueError, match=r"x must be \(N, 16\)"):
        awq_quantize(w, torch.randn(3, 8), SCHEME)
    with pytest.raises(ValueError, match="alpha"):
        awq_scales(torch.ones(4), 1.5)
    with pytest.raises(ValueError, match="act_mean_abs"):
        awq_scales(torch.tensor([-1.0, 1.0]), 0.5)
    with pytest.raises(ValueError, match="grid"):
        awq_quantize(w, torch.randn(3, 16), SCHEME, grid=0)
