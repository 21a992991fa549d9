"""Activation-aware weight scaling (AWQ) for one linear layer, with round-to-nearest underneath.

AWQ (Lin et al., 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration", arXiv:2306.00978) protects the input channels that carry large activations:
rounding error in weight column j is multiplied by x_j in the output, so those columns matter
most. It multiplies column j by a factor s_j >= 1 for salient channels before rounding and
divides the input by s_j (in deployment the division is folded into the operation that produces
the input, e.g. the preceding norm's weight), which is exact before rounding:
``x W^T = (x / s) (W diag(s))^T``. After rounding, the effective weight is

    W_hat = Q(W diag(s)) diag(1 / s)

so a salient column's relative rounding error shrinks by about s_j, while the group's scale,
set by its largest |w_ij s_j|, grows only if that column holds the group's largest weight.
The factors follow the authors' search (``llm-awq``, ``awq/quantize/auto_scale.py``):

    s_j = mean|X_j|^alpha,   s <- s / sqrt(max(s) min(s)),   alpha in {0, 1/grid, ..., (grid-1)/grid}

keeping the alpha whose quantised layer has the smallest output mean squared error on the
calibration inputs. alpha = 0 gives s = 1, plain round-to-nearest, so the search is never worse
than it on those inputs. Differences from the paper, kept small for the lab: the error is
measured on this layer's output (the paper measures a block's), and no weight clipping search.
SmoothQuant (``smoothquant.py``) uses the same identity for another goal: to flatten activations
before they are quantised (docs/quantization.md#activation-aware-scaling-awq).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validation import ArgumentTypeError, instance, integer, number
from .formats import QuantScheme, fake_quantize

__all__ = ["AWQ_FLOOR", "awq_scales", "AWQResult", "awq_quantize"]

#: Lower clamp of mean|X_j|^alpha before normalising (llm-awq's 1e-4): a dead channel stays finite.
AWQ_FLOOR = 1e-4


def _inputs(x, in_features: int) -> torch.Tensor:
    instance("x", x, torch.Tensor)
    if not x.dtype.is_floating_point:
        raise ArgumentTypeError(f"x must be a floating tensor (N, in_features), got dtype {x.dtype}")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] != in_features:
        raise ValueError(f"x must be (N, {in_features}) calibration inputs with N >= 1, got shape {tuple(x.shape)}")
    x32 = x.detach().to(torch.float32)
    if not bool(torch.isfinite(x32).all()):
        raise ValueError("x must hold finite values (inf or NaN found)")
    return x32


def awq_scales(act_mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """AWQ's per-input-channel factors for one alpha: ``s = clamp(mean|X|^alpha, 1e-4)``, divided by
    ``sqrt(max(s) * min(s))`` so that they straddle 1 (llm-awq's normalisation).

    Args:
        act_mean_abs: (in,) floating, the mean |x| of each input channel over calibration tokens, >= 0.
        alpha: a float in [0, 1]; 0 gives all ones.

    Returns:
        float32 (in,) positive factors.

    Raises:
        ArgumentTypeError: act_mean_abs not a floating tensor; alpha not a number.
        ValueError: act_mean_abs not 1-D or empty, negative or non-finite; alpha outside [0, 1].
    """
    instance("act_mean_abs", act_mean_abs, torch.Tensor)
    if not act_mean_abs.dtype.is_floating_point:
        raise ArgumentTypeError(f"act_mean_abs must be a floating tensor (in,), got dtype {act_mean_abs.dtype}")
    if act_mean_abs.dim() != 1 or act_mean_abs.numel() == 0:
        raise ValueError(f"act_mean_abs must be a non-empty 1-D tensor (in,), got shape {tuple(act_mean_abs.shape)}")
    a = act_mean_abs.detach().to(torch.float32)
    if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
        raise ValueError("act_mean_abs must hold finite values >= 0 (means of |x|)")
    alpha = number("alpha", alpha, minimum=0.0, maximum=1.0)
    s = a.pow(alpha).clamp(min=AWQ_FLOOR)
    return s / (s.max() * s.min()).sqrt()


@dataclass(frozen=True)
class AWQResult:
    """What ``awq_quantize`` found.

    Attributes:
        weight: float32 (out, in), ``Q(W diag(s)) diag(1/s)``: the weight the layer computes with.
        scales: float32 (in,), the chosen factors s.
        alpha: the chosen exponent.
        errors: {alpha: output mean squared error on the calibration inputs} for every alpha tried
            (``errors[0.0]`` is round-to-nearest's).
    """

    weight: torch.Tensor
    scales: torch.Tensor
    alpha: float
    errors: dict


def awq_quantize(w: torch.Tensor, x: torch.Tensor, scheme: QuantScheme, grid: int = 20) -> AWQResult:
    """Quantise one layer's weight with AWQ's activation-aware factors, searched on calibration inputs.

    For alpha = k / grid, k = 0 .. grid - 1: s = ``awq_scales(mean|x|, alpha)``,
    W_hat = ``fake_quantize(W * s, scheme) / s``, error = mean((x W^T - x W_hat^T)^2); the alpha of
    least error wins (the first on a tie, so alpha = 0, round-to-nearest, unless another is better).

    Args:
        w: (out, in) floating weight (an ``nn.Linear.weight``).
        x: (N, in) floating inputs of the layer on calibration tokens.
        scheme: the ``QuantScheme`` applied to W * s (e.g. ``QuantScheme(4, "group", 64)``).
        grid: number of alphas tried, an int in 1..100 (the authors use 20).

    Returns:
        ``AWQResult``.

    Raises:
        ArgumentTypeError / ValueError: as ``formats.quantize`` for w and scheme; x not (N, in) with
            N >= 1 or non-finite; grid not an int in 1..100.
    """
    instance("scheme", scheme, QuantScheme)
    instance("w", w, torch.Tensor)
    if w.dim() != 2:
        raise ValueError(f"w must be a 2-D weight (out, in), got shape {tuple(w.shape)}")
    x32 = _inputs(x, w.shape[1])
    grid = integer("grid", grid, minimum=1, maximum=100)
    w32 = w.detach().to(torch.float32)
    reference = x32 @ w32.T
    mean_abs = x32.abs().mean(dim=0)
    best = None
    errors = {}
    for k in range(grid):
        alpha = k / grid
        s = awq_scales(mean_abs, alpha)
        w_hat = fake_quantize(w32 * s, scheme) / s
        err = float((reference - x32 @ w_hat.T).pow(2).mean())
        errors[alpha] = err
        if best is None or err < best[0]:
            best = (err, alpha, s, w_hat)
    _, alpha, s, w_hat = best
    return AWQResult(weight=w_hat, scales=s, alpha=alpha, errors=errors)
