"""Causal attention over a KV cache, with grouped-query (GQA) head sharing.

Source: course "Lab 2" (cached attention step; GQA/MQA) and Ainslie et al.,
"GQA: Training Generalized Multi-Query Transformer Models" (2023). Query head h reads
KV head h // (n_heads // n_kv_heads): consecutive query heads share one KV head, which
is ``repeat_interleave`` on the head axis (``repeat`` would pair them round-robin).

Padded batches (course Lab 6) pass ``key_mask`` (B, S) bool, True at the slots that hold a real token
(left padding: a row's pads come first). A real query reads the real keys at or before its slot; a pad
query, which has no real key at or before it, reads every key, so no softmax row is empty and pad rows
stay finite; K and V at pad slots are read as zeros, so a NaN stored there cannot reach a real row
(a zero probability times NaN is NaN).
"""
from __future__ import annotations

import math

import torch

from ..validation import ArgumentTypeError, instance, nonnegative_integer, positive_integer


def _float4(name: str, x) -> torch.Tensor:
    """x as a rank-4 floating tensor, or an error naming it."""
    instance(name, x, torch.Tensor)
    if not x.dtype.is_floating_point:
        raise ArgumentTypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    if x.dim() != 4:
        raise ValueError(f"{name} must have rank 4 (B, H, T, D), got shape {tuple(x.shape)}")
    return x


def repeat_kv(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv * group_size, S, D), each KV head repeated for its group.

    Raises: ArgumentTypeError / ValueError for a ``group_size`` that is not an int >= 1."""
    if positive_integer("group_size", group_size) == 1:
        return x
    return x.repeat_interleave(group_size, dim=1)


def attention_allowed(T: int, S: int, start: int, key_mask: torch.Tensor | None, device) -> torch.Tensor:
    """Which keys each query may read: (1, T, S) without a mask, (B, T, S) with one; True = may read.

    Query i (at slot start + i) reads key j iff j <= start + i and key j is real; a query left with
    no key (a pad before the row's first real token) reads every key instead (module docstring)."""
    query_slot = torch.arange(T, device=device)[:, None] + start
    allowed = (torch.arange(S, device=device)[None, :] <= query_slot)[None]
    if key_mask is None:
        return allowed
    allowed = allowed & key_mask[:, None, :]
    return allowed | ~allowed.any(-1, keepdim=True)


def zero_pad_slots(x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """K or V (B, Hkv, S, D) with the slots where key_mask (B, S) is False set to 0 (a copy); x itself without a mask."""
    if key_mask is None:
        return x
    return x.masked_fill(~key_mask[:, None, :, None], 0.0)


def check_key_mask(key_mask, B: int, S: int) -> torch.Tensor | None:
    """key_mask as given: None, or a (B, S) bool tensor. Raises ArgumentTypeError / ValueError otherwise."""
    if key_mask is None:
        return None
    instance("key_mask", key_mask, torch.Tensor)
    if key_mask.dtype != torch.bool:
        raise ArgumentTypeError(f"key_mask must be a bool tensor (True = a real token), got dtype {key_mask.dtype}")
    if tuple(key_mask.shape) != (B, S):
        raise ValueError(f"key_mask must be (B, S) = {(B, S)}, one entry per key slot, got {tuple(key_mask.shape)}")
    return key_mask


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0, *,
                     key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of T new queries over S = start + T keys.

    Args:
        q: (B, Hq, T, D) rotated queries at absolute positions start .. start+T-1.
        k, v: (B, Hkv, S, D) with S = start + T; Hkv divides Hq.
        start: number of keys that precede the first query (cached positions), an int >= 0.
        key_mask: None, or (B, S) bool, True at the slots of real tokens (module docstring).

    Returns:
        (B, Hq, T, D) in q's dtype; scores and softmax are computed in float32.
        Query i may attend key j iff j <= start + i (and, with key_mask, key j is real).

    Raises:
        ArgumentTypeError: q, k, v not floating tensors; ``start`` not an int.
        ValueError: ranks other than 4; k, v shapes that differ or do not match q's B and D;
            S != start + T; Hkv that does not divide Hq; start < 0.
    """
    B, Hq, T, D = _float4("q", q).shape
    _float4("k", k), _float4("v", v)
    start = nonnegative_integer("start", start)
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k and v must both be (B={B}, Hkv, S, D={D}), got {tuple(k.shape)} and {tuple(v.shape)}")
    S, Hkv = k.shape[-2], k.shape[1]
    if S != start + T:
        raise ValueError(f"expected start + T = {start + T} keys, got {S}")
    if Hq % Hkv:
        raise ValueError(f"KV heads ({Hkv}) must divide query heads ({Hq})")
    return attend(q, k, v, start, check_key_mask(key_mask, B, S))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
           key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``causal_attention`` without its argument checks: the decoder's inner path, called 30 times a
    step with shapes its entry checks already fixed (the checked functions of this module call it too).

    GQA without copies: ``enable_gqa`` lets PyTorch's fused attention read KV head h // group for query
    head h (``repeat_interleave`` order) instead of materialising the repeated keys and values, which
    a decode step would otherwise copy out of the whole cache in every layer (``docs/decoder_performance.md``).
    Scores and softmax in float32; returns q's dtype.
    """
    T, S = q.shape[-2], k.shape[-2]
    # softmax(q k^T / sqrt(D) + mask) v, fused by PyTorch (same math, far less memory traffic
    # than materialising the (T, S) score matrix on long prompts).
    mask, is_causal = None, False
    if key_mask is not None:
        k, v = zero_pad_slots(k, key_mask), zero_pad_slots(v, key_mask)
        mask = attention_allowed(T, S, start, key_mask, q.device)[:, None]     # (B, 1, T, S)
    elif T == 1:
        pass                                            # the newest query sees every key
    elif start == 0:
        is_causal = True                                # plain lower-triangular mask
    else:
        query_pos = torch.arange(T, device=q.device)[:, None] + start
        mask = torch.arange(S, device=q.device)[None, :] <= query_pos    # True = may attend
    f32 = torch.float32
    out = torch.nn.functional.scaled_dot_product_attention(
        q.to(f32), k.to(f32), v.to(f32), attn_mask=mask, is_causal=is_causal, scale=1.0 / math.sqrt(q.shape[-1]),
        enable_gqa=k.shape[1] != q.shape[1])
    return out.to(q.dtype)


def attend_cached(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, start: int, *, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``attend_with_cache`` without its argument checks (the decoder's default ``attention_fn``)."""
    keys, values = write_then_keys(k_new, v_new, k_cache, v_cache, start)
    return attend(q, keys, values, start, key_mask)


def attend_with_cache(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, *,
                      key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One cached attention step (reference for the Lab 2 exercise of the same signature).

    Writes the T new keys/values into the preallocated cache at slots start .. start+T-1,
    then attends the T queries over slots 0 .. start+T-1 with a causal mask.

    Args:
        q: (B, Hq, T, D) rotated queries.
        k_new, v_new: (B, Hkv, T, D) rotated keys and values of the new positions.
        k_cache, v_cache: (B, Hkv, S_max, D) one layer's cache, written in place (cast to
            the cache's dtype on write).
        start: slots already filled (int, 0 <= start, start + T <= S_max).
        key_mask: None, or (B, start + T) bool, True at the slots of real tokens (module docstring).

    Returns:
        (B, Hq, T, D) attention output.

    Raises:
        ArgumentTypeError: a non-tensor or non-floating argument, ``start`` not an int.
        ValueError: the new block does not fit in the cache, or shapes disagree.
    """
    B, Hq, T, D = _float4("q", q).shape
    _float4("k_new", k_new), _float4("v_new", v_new), _float4("k_cache", k_cache), _float4("v_cache", v_cache)
    start = nonnegative_integer("start", start)
    if k_new.shape != v_new.shape or k_new.shape[-2] != T:
        raise ValueError(f"k_new {tuple(k_new.shape)} / v_new {tuple(v_new.shape)} do not match T={T}")
    Hkv = k_new.shape[1]
    if k_cache.shape != v_cache.shape or k_cache.shape[:2] != (B, Hkv) or k_cache.shape[3] != D \
            or k_new.shape[0] != B or k_new.shape[3] != D:
        raise ValueError(f"k_cache and v_cache must both be (B={B}, Hkv={Hkv}, S_max, D={D}) like k_new "
                         f"{tuple(k_new.shape)} and q {tuple(q.shape)}, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if start + T > k_cache.shape[-2]:
        raise ValueError(f"slots {start}..{start + T - 1} do not fit a cache of {k_cache.shape[-2]}")
    keys, values = write_then_keys(k_new, v_new, k_cache, v_cache, start)
    return causal_attention(q, keys, values, start, key_mask=key_mask)


def write_then_keys(k_new, v_new, k_cache, v_cache, start):
    """Write T new keys/values at slots start .. start+T-1 of one layer's cache; return the filled K, V views."""
    T = k_new.shape[-2]
    k_cache[:, :, start:start + T] = k_new
    v_cache[:, :, start:start + T] = v_new
    return k_cache[:, :, :start + T], v_cache[:, :, :start + T]


def batch_invariant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0, *,
                              key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``causal_attention`` with every reduction in a fixed order (``course_lib.kernels.batch_invariant``).

    Same arguments, result and masking rules as ``causal_attention``. Each row's keys are first reordered
    so its pads come last (a rotation by the row's pad count): the fixed-order sums then see a row's real
    keys at the same indices whether the row runs alone or padded inside a batch, and the masked keys
    after them add exact zeros. Result: a row's output is bitwise independent of the batch around it and
    of how its prompt was split into chunks.
    """
    from ..kernels.batch_invariant import torch_ops

    B, Hq, T, D = _float4("q", q).shape
    _float4("k", k), _float4("v", v)
    start = nonnegative_integer("start", start)
    S = k.shape[-2]
    if S != start + T:
        raise ValueError(f"expected start + T = {start + T} keys, got {S}")
    key_mask = check_key_mask(key_mask, B, S)
    allowed = attention_allowed(T, S, start, key_mask, q.device).expand(B, T, S)
    if key_mask is not None:
        k, v = zero_pad_slots(k, key_mask), zero_pad_slots(v, key_mask)
        pads = S - key_mask.sum(-1)                                            # (B,) leading pad slots
        order = (torch.arange(S, device=q.device)[None, :] + pads[:, None]) % S  # real keys first
        k = k.gather(2, order[:, None, :, None].expand_as(k))
        v = v.gather(2, order[:, None, :, None].expand_as(v))
        allowed = allowed.gather(2, order[:, None, :].expand(B, T, S))
    return torch_ops.attention(q, k, v, allowed).to(q.dtype)
