"""Where two decoding runs part, and how close a greedy choice was to a tie.

- :func:`first_divergence`: the first position where two token streams differ. Logits are compared
  on the common prefix only: after the first differing token the two runs see different contexts
  (docs/kv_cache.md#common-prefix, docs/README.md#logit-equivalence).
- :func:`top2_gap`: the largest minus the second-largest logit. A greedy token flips when an error
  in the logits is larger than this gap (docs/batching_determinism.md).

The grading contracts (``course_lib.grading``), Lab 5's speculative decoding and Lab 6's batching
report use both; this module imports nothing else of course_lib but its argument checks.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .validation import ArgumentTypeError, instance, materialized

__all__ = ["first_divergence", "top2_gap"]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ.

    Args:
        a, b: token ids (lists or tuples of ints; any sequences whose items compare with ``!=``).

    Returns:
        The first index i with ``a[i] != b[i]``; when one sequence is a proper prefix of the
        other, the shorter length; None when they are equal (same length, same items).

    Raises:
        TypeError: an argument without ``len`` or iteration (as ``len`` and ``zip`` raise it).
        ValueError: a tensor on the meta device (no values to compare).
    """
    materialized("a", a)
    materialized("b", b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """Largest minus second-largest logit along the last axis (a near-tie has a small gap).

    Args:
        logits: (..., vocab) floating tensor, vocab >= 2.

    Returns:
        (...) float64 tensor of gaps >= 0 (computed in float64, so the subtraction adds no rounding
        of the logits' dtype), on the logits' device.

    Raises:
        ArgumentTypeError: logits not a floating torch.Tensor.
        ValueError: logits with no axis or a last axis shorter than 2 (no second-largest value).
    """
    instance("logits", logits, torch.Tensor)
    if not logits.dtype.is_floating_point:
        raise ArgumentTypeError(f"logits must be a floating tensor, got dtype {logits.dtype}")
    if logits.dim() == 0 or logits.shape[-1] < 2:
        raise ValueError(f"logits must have a last axis of at least 2 values (..., vocab), got shape "
                         f"{tuple(logits.shape)}")
    top = logits.to(torch.float64).topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]
