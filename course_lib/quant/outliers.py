"""Activation statistics of linear-layer inputs, collected with forward pre-hooks.

A forward pre-hook sees the input ``x`` of an ``nn.Linear`` before the matmul. Two statistics
are built on it: the per-input-channel maximum ``max |x_j|`` over calibration windows (here;
docs/quantization.md#activation-outliers) and the Gram matrix ``X^T X`` that GPTQ needs
(``course_lib.quant.gptq.collect_hessians``). ``observe_linear_inputs`` is the one hook
mechanism both use; it removes every hook on exit, also when the forward raises.

Layers that read the same tensor (q/k/v read one normalised input, gate/up another) share
their statistic: it is computed once per forward and the result is the same tensor object.

A layer's outlier ratio is max_j(max|x_j|) / median_j(max|x_j|): about 1 for an input whose
channels have similar ranges, thousands where a few channels carry huge values, the outlier
features of Dettmers et al. (LLM.int8(), arXiv:2208.07339).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from ..validation import ArgumentTypeError, boolean, integer_tensor, materialized
from .layers import select_linear_layers

__all__ = ["observe_linear_inputs", "run_windows", "input_absmax", "outlier_table"]


@contextmanager
def observe_linear_inputs(model: nn.Module, reduce: Callable[[torch.Tensor], torch.Tensor],
                          combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                          layers: Iterable[str] | None = None) -> Iterator[tuple[dict, dict]]:
    """Accumulate a statistic of each chosen linear layer's input while the block runs forwards.

    For every call of a chosen layer, its input is flattened to x (N, in) (N = batch * tokens)
    and ``value = reduce(x)``; the running statistic becomes ``combine(previous, value)``.
    Layers whose input is the same tensor object in a forward (q/k/v, gate/up) get ``reduce``
    computed once and share one running statistic.

    Args:
        model: a model with ``model.layers`` (see ``course_lib.quant.linear_layers``).
        reduce: x (N, in) (the input's dtype, detached) -> a tensor.
        combine: (previous, value) -> the new statistic (e.g. ``torch.maximum``, ``torch.add``).
        layers: names from ``linear_layers(model)``, or None for all.

    Yields:
        (stats, rows): two dicts filled as forwards run; stats[name] the statistic (layers
        sharing an input map to the same tensor), rows[name] the number of input rows N seen.
        A layer that never ran is absent.

    Raises:
        RuntimeError: layers shared an input in one forward and not in another (a model whose
            wiring changes between forwards).
        As ``select_linear_layers`` for bad ``layers``.
    """
    chosen = select_linear_layers(model, layers)
    stats: dict[str, torch.Tensor] = {}
    rows: dict[str, int] = {}
    owner: dict[str, str] = {}            # layer -> the layer whose statistic it shares
    last: dict[str, object] = {"x": None, "name": None}   # the last input seen (kept alive: ids stay unique)

    def hook_for(name: str):
        def hook(module, args):
            x = args[0]
            if x is last["x"]:
                leader = last["name"]
            else:
                leader = name
                last["x"], last["name"] = x, name
                flat = x.detach().reshape(-1, x.shape[-1])
                value = reduce(flat)
                stats[name] = value if name not in stats else combine(stats[name], value)
                rows[name] = rows.get(name, 0) + flat.shape[0]
            if owner.setdefault(name, leader) != leader:
                raise RuntimeError(f"{name} shared its input with {owner[name]} in an earlier forward and with "
                                   f"{leader} now; observe_linear_inputs needs a fixed wiring")
            if leader != name:
                stats[name], rows[name] = stats[leader], rows[leader]
            return None
        return hook

    handles = []
    try:
        for name, module in chosen:
            handles.append(module.register_forward_pre_hook(hook_for(name)))
        yield stats, rows
    finally:
        for handle in handles:
            handle.remove()
        last["x"] = None
    for name, leader in owner.items():   # followers point at their leader's final statistic
        if leader != name:
            stats[name], rows[name] = stats[leader], rows[leader]


def run_windows(model: nn.Module, windows: torch.Tensor, progress: bool = False, desc: str = "calibration") -> None:
    """Run ``model`` on each window (one forward per window, positions 0 .. T-1, no gradients).

    The forwards whose side effects (hooks) collect calibration statistics.

    Args:
        model: ``model(ids (1, T) int64, positions (T,) int64)`` (a Decoder).
        windows: (n_windows, T) int64 token ids on the model's device.
        progress: a tqdm.auto bar over the windows. desc: its label.

    Raises:
        ArgumentTypeError: windows not an int64 tensor; model not callable; progress not a bool.
        ValueError: windows not 2-D or empty; errors of the model's forward.
    """
    if not callable(model):
        raise ArgumentTypeError(f"model must be callable (ids, positions) -> logits, got {type(model).__qualname__}")
    integer_tensor("windows", windows, ranks=(2,), layout="(n_windows, T)", dtype=torch.int64)
    if windows.shape[0] < 1 or windows.shape[1] < 1:
        raise ValueError(f"windows must hold at least one window of at least one token, got shape "
                         f"{tuple(windows.shape)}")
    boolean("progress", progress)
    positions = torch.arange(windows.shape[1], device=windows.device)
    items = range(windows.shape[0])
    if progress:
        from tqdm.auto import tqdm
        items = tqdm(items, desc=desc, unit="window")
    with torch.no_grad():
        for i in items:
            model(windows[i:i + 1], positions)


def input_absmax(model: nn.Module, windows: torch.Tensor, layers: Iterable[str] | None = None,
                 progress: bool = False) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x_j| of each chosen linear layer's input over calibration windows.

    Args:
        model: a ``course_lib.models.Decoder`` (anything with ``model.layers`` and its forward).
        windows: (n_windows, T) int64 token ids (calibration windows, disjoint from evaluation).
        layers: names from ``linear_layers(model)``, or None for all.
        progress: a tqdm.auto bar over the windows.

    Returns:
        {name: float32 (in_features,) tensor on the model's device}, non-negative, in model order.
        Layers that read the same input (q/k/v, gate/up) share one tensor object.

    Raises:
        As ``run_windows`` and ``select_linear_layers``.
    """
    def absmax(x: torch.Tensor) -> torch.Tensor:
        return x.abs().amax(dim=0).to(torch.float32)

    chosen = [name for name, _ in select_linear_layers(model, layers)]
    with observe_linear_inputs(model, absmax, torch.maximum, chosen) as (stats, _):
        run_windows(model, windows, progress, desc="activation maxima")
    return {name: stats[name] for name in chosen if name in stats}


def outlier_table(absmax: dict[str, torch.Tensor]):
    """One row per layer: how far its largest input channel stands above the typical one.

    Args:
        absmax: {layer name: (in_features,) per-channel max |x|} (``input_absmax``'s result).

    Returns:
        pandas.DataFrame with columns layer (str), in_features (int), max (float: the largest
        channel maximum), median (float: the median channel maximum, the mean of the two middle
        values for an even count), ratio (float: max / median; inf when the median is 0 and the
        max is not, NaN for an all-zero input), sorted by ratio descending (NaN last), index 0..n-1.

    Raises:
        ArgumentTypeError: absmax not a dict, or a value that is not a tensor.
        ValueError: a value that is not 1-D, is empty, holds negative or non-finite values, or is
            on the meta device.
    """
    import numpy as np
    import pandas as pd

    if not isinstance(absmax, dict):
        raise ArgumentTypeError(f"absmax must be a dict {{layer name: (in,) tensor}}, got {type(absmax).__qualname__}")
    records = []
    for name, values in absmax.items():
        if not isinstance(values, torch.Tensor):
            raise ArgumentTypeError(f"absmax[{name!r}] must be a tensor, got {type(values).__qualname__}")
        materialized(f"absmax[{name!r}]", values)
        if values.dim() != 1 or values.numel() == 0:
            raise ValueError(f"absmax[{name!r}] must be a non-empty 1-D tensor (in_features,), "
                             f"got shape {tuple(values.shape)}")
        v = values.detach().to("cpu", torch.float64).numpy()
        if not np.isfinite(v).all() or (v < 0).any():
            raise ValueError(f"absmax[{name!r}] must hold finite maxima >= 0")
        top, mid = float(v.max()), float(np.median(v))
        ratio = top / mid if mid > 0 else (float("inf") if top > 0 else float("nan"))
        records.append({"layer": name, "in_features": int(v.size), "max": top, "median": mid, "ratio": ratio})
    table = pd.DataFrame(records, columns=["layer", "in_features", "max", "median", "ratio"])
    return table.sort_values("ratio", ascending=False, na_position="last", kind="stable").reset_index(drop=True)
