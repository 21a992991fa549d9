"""An int8 KV cache, simulated: keys and values rounded per token and head as they enter the cache.

Each cached vector of one token and one KV head (``head_dim`` values of K, and of V) gets its own
symmetric absmax scale, ``s = max|x| / 127``, codes ``round(x / s)`` in -127..127, stored as int8
with one float16 scale per vector (``KV_INT8``: the course's ``QuantScheme`` with one scale per
row, a row being one (token, head) vector). A scale per token is what lets an engine write a
token's K and V once and never re-quantise them when later tokens arrive (a scale shared across
tokens would change as the sequence grows). vLLM's fp8 and int8 KV caches and KIVI (Liu et al.,
2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", arXiv:2402.02750, which
quantises V per token) use the same placement; the grid is the lab's (``course_lib.quant.formats``).

The simulation is fake quantisation, as for weights (docs/quantization.md#fake-quantisation): a
decoder's cached attention (``models.ops.cached_attention``) receives the rounded-and-restored
K and V of the new tokens, writes them into its float cache and attends over it, so every
attention read sees exactly the values an int8 cache would return, including the current
token's own K and V (engines write the new K and V to the cache before attending). Because a
token is rounded once, when written, a prefill of T tokens and a prefill followed by decode
steps see the same cached values (``tests/test_quant_kv_cache.py`` checks it).

Bytes per token (``kv_cache_bytes_per_token``): ``2 (K, V) * n_layers * n_kv_heads *
(head_dim * bits / 8 + scale bytes)`` = 11,880 B for SmolLM2-135M at int8 with fp16 scales,
against 23,040 B in float16 (docs/quantization.md#int8-kv-cache).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..models import ops
from ..models.config import ModelConfig
from ..validation import ArgumentTypeError, instance
from .formats import QuantScheme, fake_quantize, storage_bytes

__all__ = ["KV_INT8", "fake_quantize_kv", "kv_cache_bytes_per_token", "quantized_kv_attention",
           "QuantizedKVDecoder"]

#: int8, one float16 scale per (token, head) vector of head_dim values.
KV_INT8 = QuantScheme(8, "channel", None, symmetric=True, scale_dtype="fp16")


def _check_kv_scheme(scheme) -> QuantScheme:
    instance("scheme", scheme, QuantScheme)
    if scheme.granularity != "channel":
        raise ValueError(f"scheme.granularity must be 'channel' (one scale per token and head), "
                         f"got {scheme.granularity!r}")
    return scheme


def fake_quantize_kv(x: torch.Tensor, scheme: QuantScheme = KV_INT8) -> torch.Tensor:
    """Round keys or values per token and head and restore them: what an int8 KV cache returns.

    Args:
        x: (B, H, T, D) floating tensor (K or V of H KV heads for T tokens, as ``Block.qkv`` makes them).
        scheme: a ``QuantScheme`` with granularity "channel" (one scale per D-vector); ``KV_INT8``
            by default.

    Returns:
        x's shape and dtype: each (b, h, t) vector quantised with its own scale and dequantised
        (``formats.fake_quantize`` on the (B*H*T, D) view), so ``|x - x_hat| <= s / 2`` with
        ``s = max|x[b, h, t]| / 127``.

    Raises:
        ArgumentTypeError: x not a floating tensor; scheme not a QuantScheme.
        ValueError: x not 4-D or empty; non-finite values; a granularity other than "channel"; a
            scale float16 cannot hold (as ``formats.quantize``).
    """
    instance("x", x, torch.Tensor)
    scheme = _check_kv_scheme(scheme)
    if not x.dtype.is_floating_point:
        raise ArgumentTypeError(f"x must be a floating tensor (B, H, T, D), got dtype {x.dtype}")
    if x.dim() != 4 or x.numel() == 0:
        raise ValueError(f"x must be a non-empty (B, H, T, D) tensor of keys or values, got shape {tuple(x.shape)}")
    flat = x.reshape(-1, x.shape[-1])
    return fake_quantize(flat, scheme).reshape(x.shape).to(x.dtype)


def kv_cache_bytes_per_token(config: ModelConfig, scheme: QuantScheme = KV_INT8) -> int:
    """Bytes one token's keys and values take in a quantised KV cache, scales included.

    2 (K and V) * n_layers * ``storage_bytes((n_kv_heads, head_dim), scheme).total``: per layer and
    tensor, n_kv_heads vectors of head_dim codes (bits / 8 bytes each) and one scale per vector
    (two bytes in float16; a zero point as much again for an asymmetric scheme). The float16 cache
    it replaces costs ``config.kv_bytes_per_token(2)`` (docs/roofline.md#kv-bytes-per-token).

    Raises: ArgumentTypeError for a config that is not a ModelConfig or a scheme that is not a
        QuantScheme; ValueError for a granularity other than "channel".
    """
    instance("config", config, ModelConfig)
    scheme = _check_kv_scheme(scheme)
    per_layer = storage_bytes((config.n_kv_heads, config.head_dim), scheme).total
    return 2 * config.n_layers * per_layer


def quantized_kv_attention(scheme: QuantScheme = KV_INT8, attention_fn: Callable | None = None) -> Callable:
    """A decoder ``attention_fn`` that writes rounded keys and values to the cache (see the module docstring).

    Args:
        scheme: as ``fake_quantize_kv``.
        attention_fn: the cached attention to wrap (``models.ops.cached_attention`` by default), with
            its signature ``(q, k_new, v_new, k_cache, v_cache, start, **kwargs)``.

    Returns:
        ``fn(q, k_new, v_new, k_cache, v_cache, start, **kwargs)``, which calls ``attention_fn`` with
        ``fake_quantize_kv(k_new)`` and ``fake_quantize_kv(v_new)``; pass it as
        ``model(ids, positions, cache, attention_fn=fn)``. Queries are not rounded.

    Raises: ArgumentTypeError for a scheme that is not a QuantScheme or an attention_fn that is not
        callable; ValueError as ``fake_quantize_kv`` for the scheme.
    """
    scheme = _check_kv_scheme(scheme)
    inner = ops.cached_attention if attention_fn is None else attention_fn
    if not callable(inner):
        raise ArgumentTypeError(f"attention_fn must be callable or None, got {type(inner).__qualname__}")

    def attention(q, k_new, v_new, k_cache, v_cache, start, **kwargs):
        return inner(q, fake_quantize_kv(k_new, scheme), fake_quantize_kv(v_new, scheme), k_cache, v_cache,
                     start, **kwargs)
    return attention


class QuantizedKVDecoder(nn.Module):
    """A decoder that runs every forward through a fresh KV cache holding rounded keys and values.

    ``QuantizedKVDecoder(model)(ids, positions)`` is ``model(ids, positions, cache, attention_fn=...)``
    with a new cache of ``T`` slots and ``quantized_kv_attention(scheme)``, so a perplexity function
    that calls ``model(ids (1, T), positions (T,))`` measures the model with an int8 KV cache.
    With ``scheme=None`` the cache keeps float values: the same code path without rounding, the
    baseline to compare logits against.

    Args:
        model: a ``course_lib.models.Decoder`` (anything with ``new_cache`` and the decoder's forward).
        scheme: a "channel" ``QuantScheme`` (``KV_INT8`` by default) or None.

    Raises: ArgumentTypeError for a model without ``new_cache``; as ``quantized_kv_attention``.
    """

    def __init__(self, model: nn.Module, scheme: QuantScheme | None = KV_INT8) -> None:
        super().__init__()
        if not callable(getattr(model, "new_cache", None)):
            raise ArgumentTypeError(f"model must be a course_lib.models.Decoder (with new_cache), "
                                    f"got {type(model).__qualname__}")
        self.model = model
        self.scheme = scheme
        self.attention_fn = None if scheme is None else quantized_kv_attention(scheme)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) float32 of input_ids (B, T) at positions (T,), through a new cache.
        Raises: as the decoder's forward."""
        instance("input_ids", input_ids, torch.Tensor)
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
        cache = self.model.new_cache(input_ids.shape[0], input_ids.shape[1])
        return self.model(input_ids, positions, cache, attention_fn=self.attention_fn)
