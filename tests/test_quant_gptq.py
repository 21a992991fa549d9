"""GPTQ (course_lib.quant.gptq; Frantar et al. 2023, docs/quantization.md#gptq): the damped Hessian,
its gate, the column-by-column error compensation against an independent implementation, the grid,
and the contract: lower calibration-objective error than round-to-nearest on the same grid."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from course_lib.models import toy_decoder
from course_lib.quant import (QuantScheme, collect_hessians, damp_hessian, fake_quantize, gptq_quantize, hessian,
                              linear_layers, quantize, token_windows)


def correlated(n_rows: int, n_in: int, n_out: int, seed: int):
    """Calibration inputs X = Z A (a random mixing correlates the input channels) and a weight W."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n_rows, n_in, generator=g)
    a = torch.randn(n_in, n_in, generator=g) / n_in ** 0.5
    w = torch.randn(n_out, n_in, generator=g) * 0.05
    return z @ a, w


def output_error(x: torch.Tensor, w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """||X W^T - X W_hat^T||^2 in float64."""
    x64 = x.double()
    return float(((x64 @ w.double().T - x64 @ w_hat.double().T) ** 2).sum())


# -- the Hessian -------------------------------------------------------------------------------
def test_hessian_formula_by_hand():
    x = np.array([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0], [3.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    gram = x.T @ x / 4
    lam = 0.1 * np.mean(np.diag(gram))
    expected = gram + lam * np.eye(3)
    got = hessian(torch.tensor(x, dtype=torch.float32), damp=0.1)
    assert got.dtype == torch.float32 and got.shape == (3, 3)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(hessian(torch.tensor(x), damp=0).numpy(), gram, rtol=1e-6)  # full rank: allowed


def test_undamped_rank_deficient_hessian_is_refused():
    x, _ = correlated(n_rows=5, n_in=12, n_out=1, seed=0)     # 5 rows cannot span 12 columns
    with pytest.raises(ValueError, match=r"rank 5 < 12"):
        hessian(x, damp=0)
    h = hessian(x, damp=0.01)
    assert torch.linalg.eigvalsh(h.double()).min() > 0
    with pytest.raises(ValueError, match="zero"):
        hessian(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="damp"):
        hessian(x, damp=-0.1)


def test_gptq_refuses_a_hessian_that_is_not_positive_definite():
    x, w = correlated(n_rows=5, n_in=12, n_out=4, seed=0)
    singular = (x.T @ x / 5).float()
    with pytest.raises(ValueError, match="Cholesky"):
        gptq_quantize(w, singular, QuantScheme(4, "channel", None))
    with pytest.raises(ValueError, match="does not divide"):
        gptq_quantize(w, hessian(x), QuantScheme(4, "group", 5))
    with pytest.raises(ValueError, match=r"\(12, 12\)"):
        gptq_quantize(w, torch.eye(11), QuantScheme(4, "channel", None))


# -- the algorithm -------------------------------------------------------------------------------
def test_gptq_refuses_a_hessian_that_is_not_symmetric():
    x, w = correlated(n_rows=64, n_in=12, n_out=4, seed=0)
    scheme = QuantScheme(4, "channel", None)
    h = hessian(x)
    lopsided = h.clone()
    lopsided[7, 2] += 0.01 * float(h.abs().max())         # one triangle differs: Cholesky would ignore it
    with pytest.raises(ValueError, match=r"H must be symmetric .*got H\[2, 7\] = .* but H\[7, 2\]"):
        gptq_quantize(w, lopsided, scheme)
    with pytest.raises(ValueError, match=r"H must be symmetric"):
        gptq_quantize(w, torch.triu(h), scheme)
    with pytest.raises(ValueError, match=r"gram must be symmetric"):
        damp_hessian(torch.triu(x.T @ x / 64), damp=0)
    # rounding-level asymmetry (X^T X computed in float32, H in float16) is accepted, as it was
    ours = gptq_quantize(w, h, scheme).weight
    noisy = h + 1e-7 * float(h.abs().max()) * torch.randn(12, 12, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(gptq_quantize(w, noisy, scheme).weight, ours, atol=1e-2)
    gptq_quantize(w, (x.T @ x / 64 + 0.01 * torch.eye(12)).float(), scheme)
    gptq_quantize(w, h.half(), scheme)


@pytest.mark.parametrize("bad, pattern", [
    (lambda h: h[:, :-1], r"H must be \(12, 12\)"),
    (lambda h: h[None], r"H must be \(12, 12\)"),
    (lambda h: h.index_put((torch.tensor([3]), torch.tensor([3])), torch.tensor(float("nan"))), "H must hold finite"),
    (lambda h: h.index_put((torch.tensor([0]), torch.tensor([5])), torch.tensor(float("inf"))), "H must hold finite"),
    (lambda h: h.to("meta"), "H must be a tensor with data, on the cpu or cuda device, got one on the meta device"),
    (lambda h: h.long(), "H must be a floating-point tensor"),
])
def test_gptq_names_what_is_wrong_with_the_hessian(bad, pattern):
    x, w = correlated(n_rows=64, n_in=12, n_out=4, seed=0)
    with pytest.raises((ValueError, TypeError), match=pattern):
        gptq_quantize(w, bad(hessian(x)), QuantScheme(4, "channel", None))


def test_gptq_and_the_hessians_refuse_meta_tensors():
    x, w = correlated(n_rows=64, n_in=12, n_out=4, seed=0)
    meta = "must be a tensor with data, on the cpu or cuda device, got one on the meta device"
    with pytest.raises(ValueError, match="w " + meta):
        gptq_quantize(w.to("meta"), hessian(x), QuantScheme(4, "channel", None))
    with pytest.raises(ValueError, match="x " + meta):
        hessian(x.to("meta"))
    with pytest.raises(ValueError, match="gram " + meta):
        damp_hessian((x.T @ x).to("meta"))


def naive_gptq(w: torch.Tensor, h: torch.Tensor, scheme: QuantScheme, order: torch.Tensor) -> torch.Tensor:
    """Optimal Brain Quantization one column at a time with an explicit inverse of H restricted to
    the columns left (no Cholesky, no blocks), float64; grid scales from formats.quantize on the
    current weights (whole row for channel, the group's columns at its first column for groups)."""
    w = w.double()[:, order].clone()
    h = h.double()[order][:, order]
    n = w.shape[1]
    q_all = torch.zeros_like(w)
    channel = QuantScheme(scheme.bits, "channel", None, scheme.symmetric, scheme.scale_dtype)
    top = 2 ** (scheme.bits - 1) - 1

    def grid(block):
        qt = quantize(block.float(), channel)
        return qt.scales.double()[:, 0]

    s = grid(w) if scheme.granularity == "channel" else None
    for j in range(n):
        if scheme.granularity == "group" and j % scheme.group_size == 0:
            s = grid(w[:, j:j + scheme.group_size])
        q = torch.clamp(torch.round(w[:, j].float() / s.float()), -top, top).double() * s
        q_all[:, j] = q
        hinv = torch.linalg.inv(h[j:, j:])               # inverse over the columns not yet quantised
        err = (w[:, j] - q) / hinv[0, 0]
        w[:, j:] -= err[:, None] * hinv[0][None, :]
    return q_all[:, torch.argsort(order)].float()


@pytest.mark.parametrize("scheme", [QuantScheme(4, "channel", None), QuantScheme(4, "group", 8),
                                    QuantScheme(3, "group", 4)], ids=lambda s: s.name)
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_equals_column_by_column_obq(scheme, act_order):
    x, w = correlated(n_rows=200, n_in=24, n_out=10, seed=1)
    h = hessian(x)
    result = gptq_quantize(w, h, scheme, act_order=act_order, block_size=5)
    order = torch.argsort(torch.diagonal(h), descending=True, stable=True) if act_order else torch.arange(24)
    expected = naive_gptq(w, h, scheme, order)
    torch.testing.assert_close(result.weight, expected, rtol=1e-5, atol=1e-6)
    if act_order:
        assert torch.equal(result.perm, order)
    else:
        assert result.perm is None


@pytest.mark.parametrize("scheme", [QuantScheme(4, "channel", None), QuantScheme(4, "group", 16),
                                    QuantScheme(4, "group", 16, symmetric=False), QuantScheme(4, "tensor", None),
                                    QuantScheme(8, "group", 32, scale_dtype="fp32")], ids=lambda s: s.name)
def test_identity_hessian_is_round_to_nearest(scheme):
    # with uncorrelated inputs of equal variance no error is worth moving: GPTQ = RTN exactly
    _, w = correlated(n_rows=1, n_in=64, n_out=12, seed=2)
    result = gptq_quantize(w, torch.eye(64), scheme)
    assert torch.equal(result.weight, fake_quantize(w, scheme))


@pytest.mark.parametrize("scheme", [QuantScheme(4, "group", 16), QuantScheme(4, "group", 16, symmetric=False),
                                    QuantScheme(4, "channel", None)], ids=lambda s: s.name)
def test_lazy_block_updates_do_not_change_the_result(scheme):
    # block sizes that do not line up with the groups (5, 7) need the pending updates of a group's
    # later columns when the group starts
    x, w = correlated(n_rows=512, n_in=64, n_out=32, seed=0)
    h = hessian(x)
    one_by_one = gptq_quantize(w, h, scheme, block_size=1).weight
    for block in (5, 7, 16, 64, 1000):
        assert torch.equal(gptq_quantize(w, h, scheme, block_size=block).weight, one_by_one), block


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("scheme", [QuantScheme(4, "group", 32), QuantScheme(4, "group", 32, symmetric=False),
                                    QuantScheme(4, "channel", None)], ids=lambda s: s.name)
def test_every_weight_lies_on_its_groups_grid(scheme, act_order):
    x, w = correlated(n_rows=300, n_in=128, n_out=16, seed=4)
    result = gptq_quantize(w, hessian(x), scheme, act_order=act_order)
    stored = result.weight if result.perm is None else result.weight[:, result.perm]
    assert torch.equal(stored, result.quantized.dequantize())
    groups = scheme.n_groups(128)
    s = result.scales.repeat_interleave(128 // groups, dim=1)        # each stored column's scale
    codes = stored / s
    if not scheme.symmetric:
        codes = codes + result.quantized.zeros.repeat_interleave(128 // groups, dim=1)
    assert torch.allclose(codes, codes.round(), atol=1e-4)
    lo, hi = (-7, 7) if scheme.symmetric else (0, 15)
    assert codes.round().min() >= lo and codes.round().max() <= hi
    assert torch.equal(codes.round(), result.codes.float())
    assert (codes.round() == lo).any() or (codes.round() == hi).any()   # the grid's ends are used


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("scheme", [QuantScheme(4, "group", 128), QuantScheme(4, "channel", None)],
                         ids=lambda s: s.name)
def test_gptq_beats_round_to_nearest_on_correlated_inputs(scheme, seed):
    x, w = correlated(n_rows=1024, n_in=256, n_out=64, seed=seed)
    h = hessian(x)
    rtn = output_error(x, w, fake_quantize(w, scheme))
    plain = output_error(x, w, gptq_quantize(w, h, scheme).weight)
    ordered = output_error(x, w, gptq_quantize(w, h, scheme, act_order=True).weight)
    assert plain < 0.8 * rtn
    assert ordered < 0.8 * rtn


# -- collecting Hessians from a model ---------------------------------------------------------------
def test_collect_hessians_equals_hessian_of_the_captured_inputs():
    model = toy_decoder(seed=0)
    ids = torch.randint(0, model.config.vocab_size, (3 * 40,), generator=torch.Generator().manual_seed(5))
    _, cal = token_windows(ids, window=40, n_eval=1, n_calib=2)
    names = ["layers.1.q_proj", "layers.1.v_proj", "layers.2.down_proj"]
    captured = {n: [] for n in names}
    handles = [model.get_submodule(n).register_forward_pre_hook(
        lambda m, a, n=n: captured[n].append(a[0].reshape(-1, a[0].shape[-1]).clone())) for n in names]
    try:
        hs = collect_hessians(model, cal, layers=names)
    finally:
        for handle in handles:
            handle.remove()
    assert list(hs) == names
    for n in names:
        x = torch.cat(captured[n]).double()
        assert x.shape[0] == 80
        gram = x.T @ x / x.shape[0]
        expected = gram + 0.01 * gram.diagonal().mean() * torch.eye(x.shape[1], dtype=torch.float64)
        torch.testing.assert_close(hs[n].double(), expected, rtol=1e-5, atol=1e-6)
    assert hs["layers.1.q_proj"] is hs["layers.1.v_proj"]             # one input, one Hessian
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == 0
    assert damp_hessian(torch.eye(3), 0.5).tolist() == (1.5 * torch.eye(3)).tolist()


@pytest.mark.slow
def test_gptq_beats_round_to_nearest_on_a_smollm2_layer():
    os.environ["HF_HUB_OFFLINE"] = "1"
    from course_lib.data import load_smollm2, load_text

    model, tokenizer, _ = load_smollm2()
    text, _ = load_text(verbose=False)
    ids = tokenizer(text[:40_000], return_tensors="pt").input_ids[0]
    _, cal = token_windows(ids, window=512, n_eval=1, n_calib=2)
    name = "layers.11.down_proj"
    assert name in dict(linear_layers(model))
    captured = []
    handle = model.get_submodule(name).register_forward_pre_hook(
        lambda m, a: captured.append(a[0].reshape(-1, a[0].shape[-1]).clone()))
    try:
        h = collect_hessians(model, cal, layers=[name])[name]
    finally:
        handle.remove()
    x = torch.cat(captured)                                        # (1024, 1536): fewer rows than columns
    w = model.get_submodule(name).weight
    scheme = QuantScheme(4, "group", 128)
    rtn = output_error(x, w, fake_quantize(w, scheme))
    ours = output_error(x, w, gptq_quantize(w, h, scheme).weight)
    assert ours < 0.9 * rtn
