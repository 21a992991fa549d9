"""The linear layers of a decoder that weight quantisation changes, and temporary weight swaps.

``linear_layers`` lists every ``nn.Linear`` inside ``model.layers`` (the projections of each block;
the output head is left out), ``select_linear_layers`` checks a ``layers=`` argument against them,
and ``quantized`` swaps the weights of chosen linear layers for a function of them (fake
quantisation, usually: docs/quantization.md#fake-quantisation) and puts the original tensors'
values back bitwise on exit, also when the block raises, so that one model object serves every
experiment of a lab. Perplexity itself is ``course_lib.quant.perplexity``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from ..validation import ArgumentTypeError, instance

__all__ = ["linear_layers", "select_linear_layers", "quantized"]


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every ``nn.Linear`` inside ``model.layers``, as (module path, module) in model order.

    For ``course_lib.models.Decoder`` these are the 7 projections of each block (q, k, v, o,
    gate, up, down: 210 on SmolLM2-135M), named like ``"layers.3.down_proj"``. The output head
    (tied to the embedding on SmolLM2) is outside ``model.layers`` and never listed.

    Raises:
        ArgumentTypeError: the model has no ``layers`` module (e.g. it is not a Decoder).
        ValueError: ``model.layers`` holds no nn.Linear.
    """
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.Module):
        raise ArgumentTypeError(f"model must have a `layers` module of blocks (a course_lib.models.Decoder), "
                                f"got {type(model).__qualname__}")
    found = [(name, module) for name, module in layers.named_modules(prefix="layers")
             if isinstance(module, nn.Linear)]
    if not found:
        raise ValueError(f"model.layers of {type(model).__qualname__} holds no nn.Linear")
    return found


def select_linear_layers(model: nn.Module, layers: Iterable[str] | None = None) -> list[tuple[str, nn.Linear]]:
    """The (name, module) pairs of ``linear_layers(model)`` named in ``layers`` (None: all), in model order.

    The one place where the ``layers=`` argument of ``quantized``, ``input_absmax``, ``w8a8`` and
    ``collect_hessians`` is checked.

    Args:
        layers: an iterable of names from ``linear_layers(model)`` (e.g. ``["layers.11.down_proj"]``),
            or None.

    Raises:
        ArgumentTypeError: layers is a str (a single name must be wrapped in a list) or holds a non-str.
        ValueError: an unknown name (the message lists a few valid ones), or an empty selection.
    """
    every = linear_layers(model)
    if layers is None:
        return every
    if isinstance(layers, str):
        raise ArgumentTypeError(f"layers must be a list of layer names or None, got the str {layers!r}; "
                                f"write [{layers!r}]")
    wanted = list(layers)
    known = dict(every)
    for name in wanted:
        instance("layers[...]", name, str)
        if name not in known:
            raise ValueError(f"layers names {name!r}, which is not a linear layer of model.layers; "
                             f"valid names look like {[n for n, _ in every[:3]]}")
    if not wanted:
        raise ValueError("layers must name at least one linear layer (or be None for all of them)")
    chosen = set(wanted)
    return [(name, module) for name, module in every if name in chosen]


def _check_replacement(name: str, new, old: torch.Tensor) -> None:
    """A weight returned by ``fn`` must be a finite float32 tensor of the old weight's shape."""
    if not isinstance(new, torch.Tensor):
        raise ArgumentTypeError(f"fn({name!r}, weight) must return a torch.Tensor, got {type(new).__qualname__}")
    if new.dtype != torch.float32:
        raise ArgumentTypeError(f"fn({name!r}, weight) must return a float32 tensor, got dtype {new.dtype}")
    if tuple(new.shape) != tuple(old.shape):
        raise ValueError(f"fn({name!r}, weight) must return a tensor of the weight's shape {tuple(old.shape)}, "
                         f"got {tuple(new.shape)}")
    if not bool(torch.isfinite(new).all()):
        bad = int((~torch.isfinite(new)).sum())
        raise ValueError(f"fn({name!r}, weight) returned {bad} non-finite values (inf or NaN)")


@contextmanager
def quantized(model: nn.Module, fn: Callable[[str, torch.Tensor], torch.Tensor],
              layers: Iterable[str] | None = None) -> Iterator[nn.Module]:
    """Run a block with each chosen linear weight replaced by ``fn(name, weight)``; restore on exit.

    Usage::

        scheme = QuantScheme(4, "group", 64)
        with quantized(model, lambda name, w: fake_quantize(w, scheme)):
            ppl = perplexity(model, eval_windows)

    The weights are replaced one layer at a time (``fn`` sees the float32 original, as a copy it
    may modify); on exit, normal or by an exception (from ``fn``, from a refused result, or from
    the block), every replaced weight gets its original values back bitwise.

    Args:
        model: a model with ``model.layers`` (see ``linear_layers``).
        fn: called as ``fn(name, weight)`` with weight a float32 (out, in) copy; must return a
            finite float32 tensor of the same shape (on any device; it is copied into the weight).
        layers: names from ``linear_layers(model)``, or None for all of them.

    Yields:
        The model, with the replaced weights.

    Raises:
        ArgumentTypeError: fn not callable; fn returns a non-tensor or a dtype other than float32.
        ValueError: fn returns another shape or non-finite values (the message names the layer);
            bad ``layers`` (see ``select_linear_layers``).
    """
    if not callable(fn):
        raise ArgumentTypeError(f"fn must be callable (name, weight) -> weight, got {type(fn).__qualname__}")
    chosen = select_linear_layers(model, layers)
    saved: list[tuple[nn.Linear, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for name, module in chosen:
                original = module.weight.detach().clone()
                new = fn(name, original.to(torch.float32, copy=True))
                _check_replacement(name, new, original)
                saved.append((module, original))
                module.weight.copy_(new)
        yield model
    finally:
        with torch.no_grad():
            for module, original in saved:
                module.weight.copy_(original)
