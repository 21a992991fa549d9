"""The operations the decoder computes with, each switched between PyTorch's op and its batch-invariant one.

The decoder (``models.decoder``) and the serving engine's runner (``engine.runner``) call their
reductions through this module only: :func:`linear`, :func:`rms_norm`, :func:`silu`, :func:`attention`,
:func:`cached_attention` and :func:`rope_cos_sin`. Each one reads the current mode and runs either the
default PyTorch path (fused, fastest) or the fixed-order one of ``course_lib.kernels.batch_invariant``,
whose rows do not depend on the batch around them (course Lab 6, ``docs/batching_determinism.md``).

Why a mode, and why here. This follows Thinking Machines Lab's ``batch_invariant_ops``
(github.com/thinking-machines-lab/batch_invariant_ops; He et al., "Defeating Nondeterminism in LLM
Inference", 2025): the model's code names its operations once and a switch outside the model decides how
they are computed, instead of a flag passed down every method. That project swaps PyTorch's own kernels
process-wide through ``torch.library``; we keep the switch in a small namespace of our own, so the
default path stays PyTorch's untouched and a reader can open the one function that dispatches. The
module lives beside the model, not in ``kernels.batch_invariant``, because the dispatch needs the
model's attention paths (``models.attention``) and the kernels must not import the model. The mode is a
``contextvars.ContextVar``: it belongs to the current context, not to a model, so it covers every model
and every runner that computes in that context (a draft and its target alike). A thread starts from a
fresh context and so starts with the mode off, whatever the thread that started it had (CPython's
default; a free-threaded 3.14 build copies the starter's context, ``sys.flags.thread_inherit_context``);
an asyncio task copies the context when it is created, so it inherits the mode of its creator, and a
switch inside a task never leaks out of it. ``Decoder.batch_invariant_mode()`` is the public switch; it
enters :func:`batch_invariant_mode`.

Shapes and dtypes are those of the op each function dispatches to; the functions add no argument checks
of their own (the decoder checks its inputs once, on entry), except the mode switch itself.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Iterator

import torch
from torch.nn import functional as F

from ..kernels.batch_invariant import torch_ops as invariant_ops
from ..validation import boolean
from . import rope
from .attention import attend, attend_cached, batch_invariant_attention, write_then_keys
from .config import RopeScaling

__all__ = ["batch_invariant_enabled", "batch_invariant_mode", "linear", "rms_norm", "silu", "attention",
           "cached_attention", "rope_cos_sin"]

_BATCH_INVARIANT: ContextVar[bool] = ContextVar("course_lib_batch_invariant", default=False)


def batch_invariant_enabled() -> bool:
    """Whether batch-invariant mode is on in the current context (thread or asyncio task); off by default."""
    return _BATCH_INVARIANT.get()


@contextmanager
def batch_invariant_mode(enabled: bool = True) -> Iterator[None]:
    """Switch batch-invariant mode on (or off, with ``enabled=False``) for the block, in this context only.

    On exit, normal or by an exception, the mode the context had before comes back (modes nest).

    Raises: ArgumentTypeError for ``enabled`` that is not a bool."""
    token = _BATCH_INVARIANT.set(boolean("enabled", enabled))
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias), as ``F.linear``: x (..., K), weight (N, K), bias (N,) or None -> (..., N)
    in x's dtype. Batch-invariant: ``torch_ops.linear`` (fixed row tiles, float32), then x's dtype."""
    if not _BATCH_INVARIANT.get():
        return F.linear(x, weight, bias)
    y = invariant_ops.linear(x, weight)
    return (y if bias is None else y + bias.to(torch.float32)).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich, 2019) over the last axis, in float32, returned
    in x's dtype: x (..., D), weight (D,). Default: PyTorch's fused ``F.rms_norm`` (one call instead of
    five); batch-invariant: ``torch_ops.rms_norm`` (the mean by a fixed-order sum)."""
    if _BATCH_INVARIANT.get():
        return invariant_ops.rms_norm(x, weight, eps)
    f32 = torch.float32
    return F.rms_norm(x.to(f32), weight.shape, weight.to(f32), eps).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) (Elfwing et al., 2018), in x's dtype. Batch-invariant: ``torch_ops.silu`` (its
    exponential on fixed pieces, so no element falls in a vector loop's scalar tail)."""
    if _BATCH_INVARIANT.get():
        return invariant_ops.silu(x).to(x.dtype)
    return F.silu(x)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
              key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q (B, Hq, T, D) over all S = start + T keys k, v (B, Hkv, S, D), with the
    masking rules of ``models.attention`` (``key_mask`` None or (B, S) bool, True at real tokens);
    returns (B, Hq, T, D) in q's dtype. Default: ``attention.attend`` (PyTorch's fused attention);
    batch-invariant: ``attention.batch_invariant_attention`` (every sum in a fixed order)."""
    if _BATCH_INVARIANT.get():
        return batch_invariant_attention(q, k, v, start, key_mask=key_mask)
    return attend(q, k, v, start, key_mask)


def cached_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, start: int, *, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One cached attention step, the signature of ``attention.attend_with_cache`` without its checks (the
    decoder's default ``attention_fn``): write k_new, v_new (B, Hkv, T, D) at slots start .. start + T - 1
    of one layer's cache (B, Hkv, S_max, D), then :func:`attention` of q (B, Hq, T, D) over the filled
    slots. Returns (B, Hq, T, D) in q's dtype."""
    if not _BATCH_INVARIANT.get():
        return attend_cached(q, k_new, v_new, k_cache, v_cache, start, key_mask=key_mask)
    keys, values = write_then_keys(k_new, v_new, k_cache, v_cache, start)
    return batch_invariant_attention(q, keys, values, start, key_mask=key_mask)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, batch: int | None = None,
                 scaling: RopeScaling | None = None, *, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, as ``models.rope.rope_cos_sin`` returns them: float32 of shape
    (1, 1, T, head_dim // 2) for positions (T,) or (B, 1, T, head_dim // 2) for positions (B, T) int64.

    Batch-invariant: rows of a table computed once for positions 0 .. max_seq_len - 1 (per device, head
    width, theta and scaling), so a position's cos/sin never depend on which other positions share the
    call (``kernels.batch_invariant.torch_ops``, on transcendental functions). Positions must then lie
    in 0 .. max_seq_len - 1 (the decoder checks them on entry).

    Raises: as ``models.rope.rope_cos_sin`` on the default path."""
    if not _BATCH_INVARIANT.get():
        return rope.rope_cos_sin(positions, head_dim, theta, batch=batch, scaling=scaling)
    cos, sin = _rope_table(max_seq_len, head_dim, theta, scaling, positions.device)
    if positions.dim() == 1:
        return cos[positions][None, None], sin[positions][None, None]
    return cos[positions][:, None], sin[positions][:, None]


@lru_cache(maxsize=8)
def _rope_table(max_seq_len: int, head_dim: int, theta: float, scaling: RopeScaling | None,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (max_seq_len, head_dim // 2) float32 for every position (kept: a few MB per model shape)."""
    every = torch.arange(max_seq_len, device=device)
    cos, sin = rope.rope_cos_sin(every, head_dim, theta, scaling=scaling)
    return cos[0, 0], sin[0, 0]
