"""W8A8 simulation and SmoothQuant (docs/quantization.md#w8a8, docs/quantization.md#smoothquant).

W8A8 here: per-output-channel symmetric int8 weights (``QuantScheme(8, "channel", None, True,
"fp32")``) and dynamic per-tensor symmetric int8 activations (the scale is the absmax of each
input tensor, recomputed at every call), both fake quantised so the float kernels run.

SmoothQuant (Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training Quantization for
Large Language Models", ICML 2023, arXiv:2211.10438, eq. 4) divides input channel j by

    s_j = max|X_j|^alpha / max_i |W_ij|^(1 - alpha)

and multiplies the weight column j by s_j: (X diag(s)^-1)(diag(s) W^T) = X W^T exactly, but the
activations' outlier channels shrink (by s_j) while the weights absorb them. alpha = 0 leaves the
activations alone (s_j = 1 / max|W_j|), alpha = 1 moves all of their range into the weights. A
deployment folds 1/s into the preceding RMSNorm weight; here the division is explicit, in float32,
just before the activation is quantised.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch import nn

from ..validation import ArgumentTypeError, instance, integer, materialized, number
from .formats import QuantScheme, fake_quantize, qmax
from .layers import quantized, select_linear_layers

__all__ = ["W8A8_WEIGHT_SCHEME", "SMOOTHING_FLOOR", "smoothing_scales", "fake_quantize_activation", "w8a8"]

#: The weight half of W8A8: symmetric int8, one float32 scale per output channel.
W8A8_WEIGHT_SCHEME = QuantScheme(8, "channel", None, True, "fp32")
#: Maxima below this are raised to it before the powers in ``smoothing_scales`` (a dead channel
#: or an all-zero weight column would otherwise give 0 or inf).
SMOOTHING_FLOOR = 1e-5


def _vector(name: str, x) -> torch.Tensor:
    instance(name, x, torch.Tensor)
    materialized(name, x)
    if not x.dtype.is_floating_point:
        raise ArgumentTypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def smoothing_scales(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors s_j = max|X_j|^alpha / max_i|W_ij|^(1 - alpha).

    Both maxima are clamped to at least ``SMOOTHING_FLOOR`` (1e-5) first (the reference
    implementation of Xiao et al. does the same for the weight maxima). Computed in float32.

    Args:
        act_absmax: (in_features,) float, the calibration maxima max|X_j| (``input_absmax``), >= 0.
        weight: (out_features, in_features) float, the layer's weight.
        alpha: the migration strength, a number in [0, 1].

    Returns:
        float32 (in_features,) positive factors on act_absmax's device. Use as
        ``x / s`` and ``weight * s`` (s broadcast along the input dimension).

    Raises:
        ArgumentTypeError: a non-tensor or non-float tensor; alpha not a number.
        ValueError: wrong ranks, in_features that differ, negative or non-finite values, alpha
            outside [0, 1]; a tensor on the meta device.
    """
    _vector("act_absmax", act_absmax)
    _vector("weight", weight)
    alpha = float(number("alpha", alpha, minimum=0, maximum=1))
    if act_absmax.dim() != 1:
        raise ValueError(f"act_absmax must be 1-D (in_features,), got shape {tuple(act_absmax.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if weight.shape[1] != act_absmax.shape[0]:
        raise ValueError(f"act_absmax has {act_absmax.shape[0]} channels but weight has in_features "
                         f"{weight.shape[1]}; pass the maxima of this layer's input")
    a = act_absmax.detach().to(torch.float32)
    if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
        raise ValueError("act_absmax must hold finite maxima >= 0")
    w = weight.detach().to(device=a.device, dtype=torch.float32).abs().amax(dim=0)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight must hold finite values")
    a = a.clamp(min=SMOOTHING_FLOOR)
    w = w.clamp(min=SMOOTHING_FLOOR)
    return a.pow(alpha) / w.pow(1.0 - alpha)


def fake_quantize_activation(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Dynamic per-tensor symmetric absmax fake quantisation of an activation.

    The scale s = max|x| / qmax(bits) comes from this call's x (float32 scale), codes
    clamp(round(x / s), -qmax, qmax): ``fake_quantize`` with ``QuantScheme(bits, "tensor", None,
    True, "fp32")`` applied to x flattened to (N, features).

    Args:
        x: a floating tensor of any shape (..., features) with at least one element, finite.
        bits: an int in 2..8.

    Returns:
        A tensor of x's shape and dtype.

    Raises:
        ArgumentTypeError: x not a floating tensor; bits not an int.
        ValueError: bits outside 2..8; an empty x; a non-finite value; x on the meta device.
    """
    _vector("x", x)
    qmax(integer("bits", bits))   # checks the range
    if x.numel() == 0:
        raise ValueError(f"x must hold at least one value, got shape {tuple(x.shape)}")
    flat = x.reshape(1, -1) if x.dim() < 2 else x.reshape(-1, x.shape[-1])
    scheme = QuantScheme(bits, "tensor", None, True, "fp32")
    return fake_quantize(flat, scheme).reshape(x.shape).to(x.dtype)


@contextmanager
def w8a8(model: nn.Module, act_absmax: dict[str, torch.Tensor] | None = None, alpha: float | None = None,
         layers: Iterable[str] | None = None) -> Iterator[nn.Module]:
    """Run a block with simulated W8A8 on the chosen linear layers, optionally after SmoothQuant.

    Each chosen layer computes ``fq_act(x / s) @ fq_w(W * s)^T``, with ``fq_w`` per-channel int8
    (``W8A8_WEIGHT_SCHEME``), ``fq_act`` dynamic per-tensor int8 (``fake_quantize_activation``), and
    ``s = smoothing_scales(act_absmax[name], W, alpha)`` when ``alpha`` is given (s = 1 otherwise).
    Weights and hooks are restored and removed on exit, also on error.

    Args:
        model: a model with ``model.layers`` (``course_lib.models.Decoder``).
        act_absmax: {layer name: (in,) calibration maxima} (``input_absmax`` on calibration windows);
            required when alpha is given, unused otherwise.
        alpha: SmoothQuant's migration strength in [0, 1], or None for plain W8A8.
        layers: names from ``linear_layers(model)``, or None for all.

    Yields:
        The model.

    Raises:
        ValueError: alpha given without act_absmax, or act_absmax lacking a chosen layer; alpha
            outside [0, 1]; bad ``layers``.
        ArgumentTypeError: act_absmax not a dict.
    """
    chosen = select_linear_layers(model, layers)
    names = [name for name, _ in chosen]
    scales: dict[str, torch.Tensor] = {}
    if alpha is not None:
        number("alpha", alpha, minimum=0, maximum=1)
        if act_absmax is None:
            raise ValueError("alpha needs act_absmax: the smoothing factors come from the calibration maxima "
                             "(input_absmax(model, calib_windows))")
        instance("act_absmax", act_absmax, dict)
        missing = [name for name in names if name not in act_absmax]
        if missing:
            raise ValueError(f"act_absmax has no maxima for {len(missing)} chosen layers, e.g. {missing[:3]}")
        for name, module in chosen:
            scales[name] = smoothing_scales(act_absmax[name], module.weight, alpha).to(module.weight.device)

    def weight_fn(name: str, w: torch.Tensor) -> torch.Tensor:
        if name in scales:
            w = w * scales[name]
        return fake_quantize(w, W8A8_WEIGHT_SCHEME)

    def hook_for(name: str):
        s = scales.get(name)

        def hook(module, args):
            x = args[0]
            if s is not None:
                x = (x.to(torch.float32) / s).to(x.dtype)
            return (fake_quantize_activation(x, 8),) + tuple(args[1:])
        return hook

    handles = []
    try:
        with quantized(model, weight_fn, names):
            for name, module in chosen:
                handles.append(module.register_forward_pre_hook(hook_for(name)))
            yield model
    finally:
        for handle in handles:
            handle.remove()
