"""Perplexity, token windows, temporary weight swaps, activation maxima, SmoothQuant and W8A8
(course_lib.quant.perplexity / layers / outliers / smoothquant; docs/quantization.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from course_lib.models import toy_decoder
from course_lib.quant import (QuantScheme, fake_quantize, fake_quantize_activation, input_absmax, linear_layers,
                              outlier_table, perplexity, quantized, smoothing_scales, token_windows, w8a8,
                              window_nll)


# -- a model whose logits are written down ------------------------------------------------
class BigramLogits(nn.Module):
    """logits[b, t] = table[ids[b, t]]: the next-token distribution depends on the current token only,
    so the negative log-likelihood of a window can be computed by hand."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, ids, positions):
        assert positions.tolist() == list(range(ids.shape[1]))
        return self.table[ids]


TABLE = torch.tensor([[2.0, 0.0, -1.0],
                      [0.0, 3.0, 0.5],
                      [1.0, 1.0, -2.0]])


def hand_nll(table: list[list[float]], window: list[int]) -> float:
    """sum over t of -log softmax(table[x_t])[x_{t+1}], with the math module."""
    total = 0.0
    for cur, nxt in zip(window[:-1], window[1:]):
        row = table[cur]
        total += -(row[nxt] - math.log(sum(math.exp(v) for v in row)))
    return total


def test_perplexity_is_exp_of_the_mean_over_all_predictions():
    windows = torch.tensor([[0, 0, 0, 0, 0],        # the model likes 0 -> 0: an easy window
                            [2, 2, 1, 2, 2]])       # 2 -> 2 has logit -2: a hard one
    model = BigramLogits(TABLE)
    rows, ws = TABLE.tolist(), windows.tolist()
    per_window = [hand_nll(rows, w) for w in ws]
    nll, count = window_nll(model, windows)
    assert count == 2 * 4
    assert nll == pytest.approx(sum(per_window), rel=1e-12)
    expected = math.exp(sum(per_window) / 8)
    assert perplexity(model, windows) == pytest.approx(expected, rel=1e-12)
    # the tempting mistake, the mean of per-window perplexities, is far from it here
    mean_of_ppl = sum(math.exp(v / 4) for v in per_window) / 2
    assert abs(mean_of_ppl - expected) > 0.1 * expected
    # progress bar: same value
    assert perplexity(model, windows, progress=True) == pytest.approx(expected, rel=1e-12)


def test_logit_t_predicts_token_t_plus_1():
    # with an asymmetric bigram table, pairing logit t with token t (no shift) gives another value
    windows = torch.tensor([[0, 1, 2, 0, 2, 1]])
    model = BigramLogits(TABLE)
    nll, count = window_nll(model, windows)
    assert count == 5
    assert nll == pytest.approx(hand_nll(TABLE.tolist(), windows[0].tolist()), rel=1e-12)
    unshifted = sum(-torch.log_softmax(TABLE[t].double(), 0)[t].item() for t in windows[0, :-1].tolist())
    assert abs(nll - unshifted) > 0.1


def test_nll_is_summed_in_float64():
    # 40,000 equal predictions whose NLL float32 cannot hold exactly: a float32 log-softmax or sum
    # is off by more than 1e-9 relative
    table = torch.tensor([[0.1, 0.0], [0.0, 0.1]])
    windows = torch.zeros(40, 1001, dtype=torch.int64)
    a = float(table[0, 0])                          # the float32 logit, exactly
    per = -(a - math.log(math.exp(a) + 1.0))
    nll, count = window_nll(BigramLogits(table), windows)
    assert count == 40_000
    assert nll == pytest.approx(per * 40_000, rel=1e-9)


def test_window_nll_refuses_bad_windows_and_logits():
    model = BigramLogits(TABLE)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        window_nll(model, torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(TypeError, match="int64"):
        window_nll(model, torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="shape"):
        window_nll(model, torch.zeros(4, dtype=torch.int64))
    bad = BigramLogits(torch.tensor([[0.0, float("nan")], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="not finite"):
        window_nll(bad, torch.zeros(1, 3, dtype=torch.int64))


# -- windows --------------------------------------------------------------------------------
def test_token_windows_eval_then_calibration_never_overlapping():
    ids = torch.arange(100)
    ev, cal = token_windows(ids, window=8, n_eval=3, n_calib=2)
    assert ev.shape == (3, 8) and cal.shape == (2, 8) and ev.dtype == cal.dtype == torch.int64
    assert ev.flatten().tolist() == list(range(24))
    assert cal.flatten().tolist() == list(range(24, 40))
    ev0, cal0 = token_windows(ids, window=10, n_eval=10, n_calib=0)   # exactly enough
    assert ev0.flatten().tolist() == list(range(100)) and cal0.shape == (0, 10)
    ev[0, 0] = 99                                                       # copies, not views
    assert ids[0] == 0


def test_token_windows_refuses_short_text_naming_the_tokens_needed():
    with pytest.raises(ValueError, match=r"holds 100 tokens.*need 120"):
        token_windows(torch.arange(100), window=10, n_eval=8, n_calib=4)
    with pytest.raises(TypeError):
        token_windows(torch.arange(100).float())
    with pytest.raises(ValueError):
        token_windows(torch.arange(100).view(10, 10), window=5)
    with pytest.raises(ValueError):
        token_windows(torch.arange(100), window=1)


# -- the linear layers and quantized() ----------------------------------------------------------
@pytest.fixture(scope="module")
def toy():
    return toy_decoder(seed=0)


@pytest.fixture(scope="module")
def windows(toy):
    ids = torch.randint(0, toy.config.vocab_size, (6 * 48,), generator=torch.Generator().manual_seed(1))
    return token_windows(ids, window=48, n_eval=3, n_calib=3)


def test_linear_layers_are_the_seven_projections_of_each_block(toy):
    found = linear_layers(toy)
    assert len(found) == 7 * toy.config.n_layers
    assert [n for n, _ in found[:7]] == [f"layers.0.{p}_proj" for p in
                                         ("q", "k", "v", "o", "gate", "up", "down")]
    assert all(m is toy.get_submodule(n) for n, m in found)
    assert all(m is not toy.lm_head for _, m in found)
    with pytest.raises(TypeError, match="layers"):
        linear_layers(nn.Linear(2, 2))


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def same_bits(model, saved) -> bool:
    return all(torch.equal(v.view(torch.int32), saved[k].view(torch.int32)) if v.dtype == torch.float32
               else torch.equal(v, saved[k]) for k, v in model.state_dict().items())


def test_quantized_swaps_the_weights_and_restores_them_bitwise(toy, windows):
    ev, _ = windows
    saved = snapshot(toy)
    base = perplexity(toy, ev)
    scheme = QuantScheme(4, "channel", None)
    seen = []

    def fn(name, w):
        seen.append(name)
        assert w.dtype == torch.float32
        out = fake_quantize(w, scheme)
        w.zero_()                      # fn gets a copy: scribbling on it must not reach the model
        return out

    with quantized(toy, fn) as model:
        assert model is toy
        assert seen == [n for n, _ in linear_layers(toy)]
        w = toy.layers[2].down_proj.weight
        assert torch.equal(w, fake_quantize(saved["layers.2.down_proj.weight"], scheme))
        assert perplexity(toy, ev) != base
        assert torch.equal(toy.lm_head.weight, saved["lm_head.weight"])
    assert same_bits(toy, saved)
    assert perplexity(toy, ev) == base


def test_quantized_only_touches_the_listed_layers(toy):
    saved = snapshot(toy)
    with quantized(toy, lambda n, w: torch.zeros_like(w), layers=["layers.1.up_proj"]):
        changed = {k for k, v in toy.state_dict().items() if not torch.equal(v, saved[k])}
        assert changed == {"layers.1.up_proj.weight"}
    assert same_bits(toy, saved)
    with pytest.raises(ValueError, match="not a linear layer"):
        with quantized(toy, lambda n, w: w, layers=["lm_head"]):
            pass
    with pytest.raises(TypeError, match="list"):
        with quantized(toy, lambda n, w: w, layers="layers.1.up_proj"):
            pass


def test_quantized_restores_after_an_error_in_the_block(toy):
    saved = snapshot(toy)
    with pytest.raises(RuntimeError, match="inside"):
        with quantized(toy, lambda n, w: w * 0.5):
            assert not same_bits(toy, saved)
            raise RuntimeError("inside the block")
    assert same_bits(toy, saved)


@pytest.mark.parametrize("result, error, message", [
    (lambda w: w[:, :-1], ValueError, "shape"),
    (lambda w: w.double(), TypeError, "float32"),
    (lambda w: w.half(), TypeError, "float32"),
    (lambda w: torch.where(w > 0.05, torch.full_like(w, float("nan")), w), ValueError, "non-finite"),
    (lambda w: torch.where(w > 0.05, torch.full_like(w, float("inf")), w), ValueError, "non-finite"),
    (lambda w: w.numpy(), TypeError, "Tensor"),
])
def test_quantized_refuses_bad_results_and_still_restores(toy, result, error, message):
    saved = snapshot(toy)
    calls = []

    def fn(name, w):
        calls.append(name)
        return w * 0.5 if len(calls) < 5 else result(w)   # four layers replaced before the bad one

    with pytest.raises(error, match=message) as info:
        with quantized(toy, fn):
            pass
    assert "layers.0.gate_proj" in str(info.value)        # the fifth layer is named
    assert same_bits(toy, saved)


# -- activation maxima -----------------------------------------------------------------------
def test_input_absmax_matches_the_inputs_computed_by_hand(toy, windows):
    _, cal = windows
    absmax = input_absmax(toy, cal)
    assert list(absmax) == [n for n, _ in linear_layers(toy)]
    # block 0's attention input is input_layernorm(embedding), per window
    block = toy.layers[0]
    with torch.no_grad():
        h = block.input_layernorm(toy.embed_tokens(cal))          # (n, T, d)
    expected = h.abs().reshape(-1, h.shape[-1]).amax(0)
    for name in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(absmax[f"layers.0.{name}"], expected)
    assert absmax["layers.0.q_proj"] is absmax["layers.0.k_proj"]   # one statistic for a shared input
    assert absmax["layers.0.down_proj"].shape == (toy.config.d_ff,)
    assert absmax["layers.0.o_proj"] is not absmax["layers.0.q_proj"]
    only = input_absmax(toy, cal, layers=["layers.3.down_proj"])
    assert list(only) == ["layers.3.down_proj"]
    assert torch.equal(only["layers.3.down_proj"], absmax["layers.3.down_proj"])


def hooks_left(model) -> int:
    return sum(len(m._forward_pre_hooks) for m in model.modules())


def test_input_absmax_removes_its_hooks_also_on_error(toy, windows, monkeypatch):
    _, cal = windows
    assert hooks_left(toy) == 0
    input_absmax(toy, cal)
    assert hooks_left(toy) == 0

    def broken(x):
        raise RuntimeError("broken layer")

    monkeypatch.setattr(toy.layers[2].down_proj, "forward", broken)  # after the hooks of layers 0-1 ran
    with pytest.raises(RuntimeError, match="broken layer"):
        input_absmax(toy, cal)
    assert hooks_left(toy) == 0


def test_outlier_table_by_hand():
    table = outlier_table({
        "calm": torch.tensor([1.0, 2.0, 2.0, 4.0]),       # median 2 (mean of the two middle values), ratio 2
        "spiky": torch.tensor([1.0, 1.0, 300.0]),         # median 1, ratio 300
        "dead": torch.tensor([0.0, 0.0, 0.0]),            # no ratio
        "flat": torch.tensor([3.0, 3.0, 3.0]),            # ratio 1
    })
    assert list(table.columns) == ["layer", "in_features", "max", "median", "ratio"]
    assert table["layer"].tolist() == ["spiky", "calm", "flat", "dead"]
    assert table["in_features"].tolist() == [3, 4, 3, 3]
    assert table["max"].tolist()[:3] == [300.0, 4.0, 3.0]
    assert table["median"].tolist() == [1.0, 2.0, 3.0, 0.0]
    assert table["ratio"].tolist()[:3] == [300.0, 2.0, 1.0] and np.isnan(table["ratio"].iloc[3])
    with pytest.raises(ValueError, match="1-D"):
        outlier_table({"x": torch.ones(2, 2)})
    with pytest.raises(ValueError, match=">= 0"):
        outlier_table({"x": torch.tensor([-1.0, 2.0])})


# -- SmoothQuant ------------------------------------------------------------------------------
def test_smoothing_scales_by_hand():
    act = torch.tensor([4.0, 1.0, 0.0, 9.0])
    weight = torch.tensor([[1.0, -4.0, 2.0, 0.0],
                           [-0.5, 1.0, -1.0, 0.0]])        # column maxima 1, 4, 2, 0
    s = smoothing_scales(act, weight, 0.5)
    expected = [math.sqrt(4) / math.sqrt(1), math.sqrt(1) / math.sqrt(4), math.sqrt(1e-5) / math.sqrt(2),
                math.sqrt(9) / math.sqrt(1e-5)]
    assert s.dtype == torch.float32 and s.shape == (4,)
    assert s.tolist() == pytest.approx(expected, rel=1e-6)
    s8 = smoothing_scales(act, weight, 0.8)
    assert s8[0].item() == pytest.approx(4 ** 0.8 / 1 ** 0.2, rel=1e-6)
    assert s8[1].item() == pytest.approx(1 ** 0.8 / 4 ** 0.2, rel=1e-6)
    assert smoothing_scales(act, weight, 1.0).tolist() == pytest.approx([4.0, 1.0, 1e-5, 9.0], rel=1e-6)
    assert smoothing_scales(act, weight, 0.0).tolist() == pytest.approx([1.0, 0.25, 0.5, 1e5], rel=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        smoothing_scales(act, weight, 1.5)
    with pytest.raises(ValueError, match="in_features"):
        smoothing_scales(act[:3], weight, 0.5)


def test_smoothing_is_an_identity_before_quantisation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=g, dtype=torch.float64)
    x[:, [3, 17]] *= 80.0                                    # outlier channels
    w = torch.randn(24, 32, generator=g, dtype=torch.float64)
    s = smoothing_scales(x.abs().amax(0), w, 0.5).double()
    assert s[3] > 5 * s.median() and s[17] > 5 * s.median()  # the outlier channels get large factors
    smoothed = (x / s) @ (w * s).T
    assert torch.allclose(smoothed, x @ w.T, rtol=1e-12, atol=1e-10)
    assert (x / s).abs().amax(0).max() < x.abs().amax(0).max() / 5   # and the activation range shrinks


def test_fake_quantize_activation_uses_this_calls_absmax():
    x = torch.tensor([[0.5, -1.27, 0.013], [0.0, 0.0051, 1.0]])
    y = fake_quantize_activation(x, 8)
    s = 1.27 / 127                                            # absmax of this x
    expected = [[round(v / s) * s for v in row] for row in x.tolist()]
    assert y.shape == x.shape and y.dtype == x.dtype
    assert y.tolist() == [pytest.approx(r, abs=1e-7) for r in expected]
    assert torch.allclose(fake_quantize_activation(2 * x), 2 * y, atol=1e-7)   # dynamic: the scale follows x
    y4 = fake_quantize_activation(x.reshape(1, 2, 3), 4)
    assert y4.shape == (1, 2, 3)
    assert len(set(y4.flatten().tolist())) <= 15
    assert torch.equal(fake_quantize_activation(torch.zeros(3, 4)), torch.zeros(3, 4))


# -- W8A8 -----------------------------------------------------------------------------------------
def logits_of(model, ev):
    positions = torch.arange(ev.shape[1])
    with torch.no_grad():
        return torch.cat([model(ev[i:i + 1], positions) for i in range(ev.shape[0])])


def test_w8a8_layer_computes_quantised_smoothed_product(toy, windows):
    _, cal = windows
    name = "layers.1.gate_proj"
    layer = toy.get_submodule(name)
    absmax = input_absmax(toy, cal, layers=[name])
    seen = {}
    pre = layer.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0].detach().clone()))
    post = layer.register_forward_hook(lambda m, a, out: seen.__setitem__("y", out.detach().clone()))
    try:
        with w8a8(toy, absmax, alpha=0.5, layers=[name]):
            logits_of(toy, cal[:1])
    finally:
        pre.remove()
        post.remove()
    s = smoothing_scales(absmax[name], layer.weight, 0.5)
    w_hat = fake_quantize(layer.weight * s, QuantScheme(8, "channel", None, True, "fp32"))
    expected = fake_quantize_activation(seen["x"] / s) @ w_hat.T
    assert torch.allclose(seen["y"], expected, rtol=1e-5, atol=1e-6)
    assert hooks_left(toy) == 0


def test_w8a8_is_close_to_float_and_restores_the_model(toy, windows):
    ev, cal = windows
    saved = snapshot(toy)
    ref = logits_of(toy, ev)
    with w8a8(toy):
        got = logits_of(toy, ev)
    assert same_bits(toy, saved) and hooks_left(toy) == 0
    rel = (got - ref).norm() / ref.norm()
    assert 0 < rel < 0.03
    with pytest.raises(ValueError, match="act_absmax"):
        with w8a8(toy, alpha=0.5):
            pass
    with pytest.raises(RuntimeError, match="stop"):
        with w8a8(toy, input_absmax(toy, cal), alpha=0.5):
            raise RuntimeError("stop")
    assert same_bits(toy, saved) and hooks_left(toy) == 0


def test_smoothquant_reduces_the_w8a8_error_when_inputs_have_outlier_channels(windows):
    # Outlier channels as in LLMs: a few channels of the RMSNorm outputs (the inputs of q/k/v and
    # gate/up) scaled by 50-100x.
    ev, cal = windows
    model = toy_decoder(seed=3)
    with torch.no_grad():
        for i, block in enumerate(model.layers):
            for norm in (block.input_layernorm, block.post_attention_layernorm):
                norm.weight[[5 + i, 77, 200 - i]] *= torch.tensor([60.0, 100.0, 50.0])
    absmax = input_absmax(model, cal)
    ref = logits_of(model, ev)

    def error(alpha):
        with w8a8(model, absmax, alpha=alpha):
            return ((logits_of(model, ev) - ref).norm() / ref.norm()).item()

    plain, smooth = error(None), error(0.5)
    assert smooth < 0.5 * plain
