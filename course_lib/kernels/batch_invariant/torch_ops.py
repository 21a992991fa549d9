"""Batch-invariant operations in plain PyTorch (CPU or any device): every reduction in a fixed order.

Why results depend on the batch at all: a matrix library picks its kernel, its tiling and the order in
which it adds the K products from the *shape* of the call. On this course's CPU, row 0 of ``X @ W.T`` is
not bit-identical to ``x @ W.T`` for the same row once X has more rows (course Lab 6 measures it at every
SmolLM2 shape), so a prompt decoded alone and the same prompt decoded in a batch drift apart by float32
rounding, and greedy tokens can flip where two logits nearly tie. The cure (Thinking Machines Lab, He et
al., "Defeating Nondeterminism in LLM Inference", 2025; vLLM's batch-invariant mode) is to make each row's
arithmetic independent of everything else in the batch:

- :func:`linear` calls the matrix library only with one fixed shape: the rows are cut into tiles of
  ``ROW_TILE`` rows (the last tile padded with zero rows), so every call has the same (ROW_TILE, K) by
  (K, N) shape, the library takes the same path for every tile, and a row's result depends on that row
  alone, not on the batch size or on the row's place in the batch (checked in tests/).
- :func:`fixed_order_sum` adds in a pairwise tree built from elementwise additions, whose order is fixed
  by the index of each element and by nothing else; trailing zeros do not change the result (x + 0 = x
  exactly), so a row reduced alone, inside a longer padded row, or in a chunk of a longer prompt gives the
  same bits.
- :func:`rms_norm`, :func:`softmax` and :func:`attention` build on :func:`fixed_order_sum`; the maximum in
  the softmax is exact in any order.
- Elementwise arithmetic (+, -, *, /, sqrt) is correctly rounded, so it gives the same bits wherever an
  element sits. Transcendental functions are not: PyTorch's CPU loops run the vectorised (SIMD) version
  on whole vectors and a scalar version on the tail of an array, and the two can differ in the last bit,
  so the same value can come out differently at the end of a short array than in the middle of a long
  one. :func:`exp` (and :func:`silu` on it) therefore runs on pieces of ``PIECE`` elements, a multiple of
  every SIMD width and below PyTorch's parallel grain, so no element ever lands in a tail. Rotary
  cos/sin come from a table computed once for every position (``models.ops.rope_cos_sin``).

Shapes and dtypes are stated per function; every function computes in float32 and returns float32
(:func:`rms_norm` returns x's dtype). Cost: :func:`linear` pays for the padded rows (at batch 1 it runs a
ROW_TILE-row product); :func:`attention` materialises query x key x head_dim products, fine at the
course's prompt lengths and written for clarity, not speed.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ...validation import ArgumentTypeError, fits_memory, instance, integer, positive_number

__all__ = ["ROW_TILE", "PIECE", "linear", "fixed_order_sum", "exp", "silu", "rms_norm", "softmax", "attention"]

#: Rows per call of the matrix library in :func:`linear`. At 8, a batch of 8 decode tokens costs exactly
#: the default product; batch 1 pays for 7 zero rows (course Lab 6 measures both).
ROW_TILE = 8
#: Elements per call of a transcendental function in :func:`exp`: a multiple of 64 (every SIMD width
#: PyTorch's CPU kernels use, twice over) and under ATen's parallel grain of 32,768 elements.
PIECE = 16384


def _floating(name: str, x) -> torch.Tensor:
    instance(name, x, torch.Tensor)
    if not x.dtype.is_floating_point:
        raise ArgumentTypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    return x


def linear(x: torch.Tensor, weight: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """y = x @ weight.T with a result per row that does not depend on the other rows.

    Args:
        x: (..., K) floating tensor; all leading dimensions are rows.
        weight: (N, K) floating tensor on x's device (any strides).
        tile: rows per matrix-library call, an int >= 1 (the same for every call: that is the point).

    Returns:
        (..., N) float32. Rows are computed ``tile`` at a time by ``F.linear`` in float32; the last tile
        is padded with zero rows, which are dropped.

    Raises:
        ArgumentTypeError: a non-tensor or non-floating input, or a tile that is not an int.
        ValueError: weight not of rank 2, K that differ, tile < 1, inputs on different devices, a
            tile whose padded rows would not fit in memory (``validation.fits_memory``).
    """
    _floating("x", x), _floating("weight", weight)
    tile = integer("tile", tile, minimum=1, note="rows per call")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear needs x (..., K) and weight (N, K) with the same K, got x {tuple(x.shape)} "
                         f"and weight {tuple(weight.shape)}")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but weight is on {weight.device}")
    lead, K = x.shape[:-1], x.shape[-1]
    M = math.prod(lead)
    padded = math.ceil(M / tile) * tile
    fits_memory("(rows of x padded to whole tiles, K, N)", (padded, K, weight.shape[0]),
                4 * padded * (K + weight.shape[0]), device=x.device, what=f"float32 rows in tiles of {tile} and their products")
    rows = x.reshape(-1, K).to(torch.float32)
    w = weight.to(torch.float32)
    if padded != M:
        rows = torch.cat([rows, rows.new_zeros(padded - M, K)])
    out = torch.cat([F.linear(rows[i:i + tile], w) for i in range(0, padded, tile)]) if padded else \
        rows.new_zeros(0, w.shape[0])
    return out[:M].reshape(*lead, w.shape[0])


def fixed_order_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over ``dim`` in a pairwise tree whose order depends only on each element's index.

    The axis is padded with zeros to the next power of two, then halved repeatedly by adding element
    2i to element 2i + 1, one elementwise addition per level (elementwise arithmetic has no order to
    choose). Trailing zeros leave the result bit for bit unchanged, so the sum of a row is the same
    whether the row is reduced alone or with masked (zero) entries after it.

    Args:
        x: a floating tensor with at least one dimension; summed in float32.
        dim: the axis to reduce (negative counts from the end).

    Returns:
        x's shape without ``dim``, float32. An empty axis sums to 0.

    Raises:
        ArgumentTypeError: x not a floating tensor, dim not an int. ValueError: dim out of range.
    """
    _floating("x", x)
    dim = integer("dim", dim, minimum=-x.dim(), maximum=x.dim() - 1, note=f"an axis of a rank-{x.dim()} tensor")
    y = x.to(torch.float32).movedim(dim, -1)
    n = y.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        y = F.pad(y, (0, width - n))
    while y.shape[-1] > 1:
        y = y[..., 0::2] + y[..., 1::2]
    return y[..., 0]


def exp(x: torch.Tensor) -> torch.Tensor:
    """e**x in float32, each element computed by the same (vectorised) code wherever it sits.

    Args: x: a floating tensor of any shape. Returns: float32, x's shape. Raises: ArgumentTypeError."""
    _floating("x", x)
    flat = x.to(torch.float32).reshape(-1)
    n = flat.numel()
    pieces = F.pad(flat, (0, -n % PIECE)).view(-1, PIECE)
    out = torch.empty_like(pieces)
    for i in range(pieces.shape[0]):
        torch.exp(pieces[i], out=out[i])
    return out.view(-1)[:n].view(x.shape)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) = x / (1 + e**-x) in float32 (Elfwing et al., 2018), e**-x by :func:`exp`.

    Args: x: a floating tensor. Returns: float32, x's shape. Raises: ArgumentTypeError."""
    _floating("x", x)
    xf = x.to(torch.float32)
    return xf / (1.0 + exp(-xf))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich, 2019), the mean by :func:`fixed_order_sum`.

    Args:
        x: (..., D) floating tensor. weight: (D,) floating tensor. eps: a float > 0.

    Returns:
        (..., D) in x's dtype, computed in float32.

    Raises:
        ArgumentTypeError: non-tensor or non-floating inputs, an eps that is not a number (a str, a
            tensor). ValueError: weight not (D,), on another device than x; eps not finite and > 0 (0
            gives NaN rows for x = 0, a negative eps NaN wherever mean(x^2) < -eps; an eps below
            float32's smallest value, about 1.4e-45, still rounds to 0).
    """
    _floating("x", x), _floating("weight", weight)
    eps = positive_number("eps", eps, note="added to mean(x^2) under the square root")
    if weight.dim() != 1 or x.dim() < 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rms_norm needs x (..., D) and weight (D,), got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but weight is on {weight.device}")
    xf = x.to(torch.float32)
    mean_square = fixed_order_sum(xf * xf) / xf.shape[-1]
    scale = 1.0 / torch.sqrt(mean_square + eps)           # sqrt and / are correctly rounded everywhere
    return (weight.to(torch.float32) * (xf * scale[..., None])).to(x.dtype)


def _check_mask(name: str, mask, scores: torch.Tensor) -> None:
    instance(name, mask, torch.Tensor)
    if mask.dtype != torch.bool:
        raise ArgumentTypeError(f"{name} must be a bool tensor (True where a score may be used), got dtype {mask.dtype}")
    try:
        fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"{name} of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
                         f"{tuple(scores.shape)}")
    if mask.device != scores.device:
        raise ValueError(f"{name} is on {mask.device} but the scores are on {scores.device}")


def softmax(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis, its normaliser by :func:`fixed_order_sum`.

    Args:
        scores: (..., S) floating tensor.
        allowed: None, or a bool tensor broadcastable to scores: False entries get probability exactly 0
            (so zeros they multiply stay out of every sum). A row with no allowed entry gets all zeros.

    Returns:
        (..., S) float32 probabilities; S = 0 gives an empty result.

    Raises:
        ArgumentTypeError: scores not a floating tensor, allowed not a bool tensor.
        ValueError: allowed not broadcastable to scores' shape, or on another device.
    """
    _floating("scores", scores)
    s = scores.to(torch.float32)
    if allowed is not None:
        _check_mask("allowed", allowed, scores)
        s = s.masked_fill(~allowed, float("-inf"))
    if s.shape[-1] == 0:
        return s
    peak = s.amax(-1, keepdim=True)                       # a maximum is exact in any order
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    e = exp(s - peak)
    total = fixed_order_sum(e)[..., None]
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D), masked) v with every reduction in a fixed order (GQA heads shared).

    q k^T is an elementwise product summed over D by :func:`fixed_order_sum`; the weighted sum of values
    is an elementwise product summed over the keys the same way. Keys are in the order given: a row's
    result does not depend on masked keys *after* its real ones, so callers put padding last.

    Args:
        q: (B, Hq, T, D). k, v: (B, Hkv, S, D) with Hkv dividing Hq (query head h reads KV head
            h // (Hq // Hkv)). allowed: (B, T, S) bool, True where query t may read key s.

    Returns:
        (B, Hq, T, D) float32; a query with no allowed key (S = 0 included) gets zeros.

    Raises:
        ArgumentTypeError / ValueError: non-floating tensors, shapes that do not fit together, no KV
        head (Hkv = 0), tensors on different devices.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _floating(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4, got shape {tuple(t.shape)}")
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if Hkv < 1 or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or Hq % Hkv:
        raise ValueError(f"attention needs q (B, Hq, T, D) and k, v (B, Hkv, S, D) with Hkv dividing Hq, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    instance("allowed", allowed, torch.Tensor)
    if allowed.dtype != torch.bool or tuple(allowed.shape) != (B, T, S):
        raise ValueError(f"allowed must be a (B, T, S) = {(B, T, S)} bool tensor, got {tuple(allowed.shape)} "
                         f"{allowed.dtype}")
    for name, t in (("k", k), ("v", v), ("allowed", allowed)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    G = Hq // Hkv
    qg = q.to(torch.float32).reshape(B, Hkv, G, T, 1, D)
    kk = k.to(torch.float32)[:, :, None, None]                        # (B, Hkv, 1, 1, S, D)
    vv = v.to(torch.float32)[:, :, None, None]
    out = []
    for t0 in range(0, T, ROW_TILE):                                   # bounded memory on long prompts
        qt = qg[:, :, :, t0:t0 + ROW_TILE]
        scores = fixed_order_sum(qt * kk) / math.sqrt(D)               # (B, Hkv, G, t, S)
        p = softmax(scores, allowed[:, None, None, t0:t0 + ROW_TILE])
        out.append(fixed_order_sum(p[..., None] * vv, dim=-2))         # (B, Hkv, G, t, D)
    return torch.cat(out, dim=3).reshape(B, Hq, T, D)
