"""The online softmax: attention for one query over its keys one tile at a time (Lab 2, section 11).

A kernel that streams the KV cache in blocks (FlashAttention, FlashDecoding, the course's paged decode
kernel in ``course_lib.kernels.paged_attention``) never holds all of a query's scores at once. It keeps a
small state over the keys seen so far and updates it with each tile:

    m   the largest score so far (starts at -inf),
    l   sum over keys seen of exp(s_j - m) (starts at 0),
    acc sum over keys seen of exp(s_j - m) v_j, a vector of the value width (starts at 0).

A tile of scores s' (T,) with values V' (T, Dv) gives

    m' = max(m, max_j s'_j),   c = exp(m - m'),   p_j = exp(s'_j - m'),
    l' = c l + sum_j p_j,      acc' = c acc + sum_j p_j V'_j,

and after the last tile the output is acc / l = softmax(s) @ V exactly (in real arithmetic): the factor
c rescales what was summed against the old maximum whenever the maximum grows, and subtracting the
maximum keeps every exp at most 1, so scores near +-1e4 stay finite in float32.

Sources: Milakov and Gimelshein, "Online normalizer calculation for softmax" (2018, arXiv:1805.02867);
Dao et al., "FlashAttention" (2022, arXiv:2205.14135); ``docs/kv_cache.md#the-online-softmax``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..validation import instance, positive_integer

__all__ = ["initial_state", "online_softmax_update", "online_attention"]

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def initial_state(value_dim: int, dtype: torch.dtype = torch.float32) -> State:
    """(m, l, acc) before any key: m = -inf and l = 0 (0-d tensors), acc = zeros (value_dim,)."""
    value_dim = positive_integer("value_dim", value_dim)
    return (torch.tensor(-math.inf, dtype=dtype), torch.tensor(0.0, dtype=dtype), torch.zeros(value_dim, dtype=dtype))


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                          v: torch.Tensor) -> State:
    """One tile of the online softmax (module docstring): the state after the keys seen so far and this
    tile's scores and values -> the state after this tile too.

    Args:
        m, l: 0-d float tensors, the running maximum and the running sum of exp(s - m).
        acc: (Dv,) float, the running sum of exp(s - m) v.
        scores: (T,) float, T >= 1, this tile's scores q . k_j * scale. v: (T, Dv), its values.

    Returns:
        (m', l', acc'): new tensors of the same shapes and dtype as (m, l, acc).

    Raises:
        TypeError: an argument that is not a tensor. ValueError: shapes that do not fit.
    """
    for name, t in (("m", m), ("l", l), ("acc", acc), ("scores", scores), ("v", v)):
        instance(name, t, torch.Tensor)
    if m.dim() or l.dim() or acc.dim() != 1 or scores.dim() != 1 or v.dim() != 2 or not scores.numel() \
            or v.shape != (scores.shape[0], acc.shape[0]):
        raise ValueError(f"expected m, l 0-d, acc (Dv,), scores (T,) with T >= 1 and v (T, Dv); got shapes "
                         f"{tuple(m.shape)}, {tuple(l.shape)}, {tuple(acc.shape)}, {tuple(scores.shape)}, "
                         f"{tuple(v.shape)}")
    m_new = torch.maximum(m, scores.max())
    c = torch.exp(m - m_new)            # 0 for the first tile (m = -inf), 1 when the maximum stays
    p = torch.exp(scores - m_new)
    return m_new, c * l + p.sum(), c * acc + p @ v.to(acc.dtype)


def online_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int,
                     update: Callable[..., State] = online_softmax_update) -> torch.Tensor:
    """softmax(k @ q / sqrt(D)) @ v for one query, computed by ``update`` over tiles of ``tile`` keys
    (the last tile shorter when S is not a multiple); ``update`` has the signature of
    :func:`online_softmax_update` (a learner's, in Lab 2).

    Args:
        q: (D,) float32. k: (S, D) float32, S >= 1. v: (S, Dv) float32. tile: keys per tile, >= 1.

    Returns:
        (Dv,) float32: acc / l after the last tile.

    Raises:
        TypeError / ValueError: arguments of the wrong type or shape, tile < 1.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        instance(name, t, torch.Tensor)
    tile = positive_integer("tile", tile)
    if q.dim() != 1 or k.dim() != 2 or v.dim() != 2 or k.shape[1] != q.shape[0] or v.shape[0] != k.shape[0] \
            or not k.shape[0]:
        raise ValueError(f"expected q (D,), k (S, D) with S >= 1 and v (S, Dv); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    scale = 1.0 / math.sqrt(q.shape[0])
    m, l, acc = initial_state(v.shape[1], q.dtype)
    for t0 in range(0, k.shape[0], tile):
        scores = (k[t0:t0 + tile] @ q) * scale
        m, l, acc = update(m, l, acc, scores, v[t0:t0 + tile])
    return acc / l
