"""A compact Llama-style decoder: the Lab 2 toy model and the SmolLM2 reference model.

Pre-norm blocks (RMSNorm -> GQA attention with split-half RoPE -> residual; RMSNorm ->
SwiGLU -> residual), final RMSNorm, output head (tied or not). Positions are always
explicit arguments and the KV cache is an explicit object, so prefill and decode are
the same forward with different inputs (course Lab 2; style after gpt-fast).

Tensor conventions: token ids (B, T) int64; positions (T,) or (B, T) int64; logits
(B, T, vocab) float32.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import nn

from ..cache.contiguous import KVCache
from .attention import attend_with_cache, causal_attention
from .config import ModelConfig, toy_config
from .rope import rope_cos_sin, rotate_pairs

AttentionFn = Callable[..., torch.Tensor]


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (Zhang & Sennrich, 2019)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf).to(x.dtype)


class Block(nn.Module):
    """One decoder block; parameter names follow Hugging Face's Llama for easy loading."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.d_model, c.norm_eps)
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.norm_eps)
        self.gate_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.down_proj = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], kv: tuple[torch.Tensor, torch.Tensor] | None,
                start: int, attention_fn: AttentionFn) -> torch.Tensor:
        c = self.c
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotate_pairs(q, *rope), rotate_pairs(k, *rope)
        if kv is None:
            attn = causal_attention(q, k, v, 0)
        else:
            attn = attention_fn(q, k, v, kv[0], kv[1], start)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class Decoder(nn.Module):
    """Llama-style decoder with an explicit KV cache and explicit positions.

    The constructors ``random`` and ``from_hf_state_dict`` return an inference model
    (eval mode, parameters without gradients), so no autograd graph reaches the cache.

    Args:
        config: the model's ``ModelConfig``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    # -- construction -------------------------------------------------------------------
    @classmethod
    def random(cls, config: ModelConfig | None = None, seed: int = 0) -> "Decoder":
        """Random weights (caching correctness is algebra, not learning). Embeddings ~ N(0, 1),
        projections ~ N(0, (0.5 / sqrt(fan_in))^2), norms 1. At this scale a rotary position off
        by one moves the logits by about 1e-2 while greedy tokens mostly stay equal, the
        behaviour course Lab 2 describes; cached vs full recompute differ by ~1e-6."""
        model = cls(config or toy_config())
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("layernorm.weight") or name == "norm.weight":
                    p.fill_(1.0)
                elif p.dim() == 2:
                    std = 1.0 if name == "embed_tokens.weight" else 0.5 * p.shape[1] ** -0.5
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return model.eval().requires_grad_(False)

    @classmethod
    def from_hf_state_dict(cls, config: ModelConfig, state_dict: Mapping[str, torch.Tensor]) -> "Decoder":
        """Load weights named as in transformers' ``LlamaForCausalLM.state_dict()``.

        Raises:
            ValueError: a tensor is missing, unexpected, or has the wrong shape.
        """
        model = cls(config)
        ours = {}
        for key, tensor in state_dict.items():
            name = key.removeprefix("model.")
            name = name.replace(".self_attn.", ".").replace(".mlp.", ".")
            if name.endswith("rotary_emb.inv_freq"):
                continue
            ours[name] = tensor
        if config.tie_embeddings:
            ours.pop("lm_head.weight", None)
        expected = {k: v.shape for k, v in model.state_dict().items()}
        if config.tie_embeddings:
            expected.pop("lm_head.weight", None)
        missing = sorted(set(expected) - set(ours))
        unexpected = sorted(set(ours) - set(expected))
        if missing or unexpected:
            raise ValueError(f"state dict does not fit {config}: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        for name, shape in expected.items():
            if tuple(ours[name].shape) != tuple(shape):
                raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(ours[name].shape)}")
        model.load_state_dict(ours, strict=False)
        return model.eval().requires_grad_(False)

    # -- forward ------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None,
                attention_fn: AttentionFn | None = None, last_only: bool = False) -> torch.Tensor:
        """Logits for T new tokens.

        Args:
            input_ids: (B, T) int64 token ids.
            positions: (T,) or (B, T) int64 absolute positions of those tokens.
            cache: a ``KVCache``; when given, the new keys/values go to slots
                cache.length .. cache.length+T-1, attention reads every filled slot, and
                cache.length advances by T. Without it, a plain causal forward.
            attention_fn: replaces ``attend_with_cache`` (same signature) for cached
                forwards; Lab 2 plugs the learner's attention step in here.
            last_only: compute logits for the last position only (B, 1, vocab): what
                generation needs; skips the output head's work on the other T - 1 positions.

        Returns:
            (B, T, vocab_size) float32 logits, or (B, 1, vocab_size) with ``last_only``.

        Raises:
            ValueError: wrong ranks/dtypes, a position outside the RoPE table, or a cache
                whose batch or size does not fit.
        """
        if input_ids.dim() != 2 or input_ids.dtype != torch.int64:
            raise ValueError(f"input_ids must be (B, T) int64, got {tuple(input_ids.shape)} {input_ids.dtype}")
        if positions.dtype != torch.int64:
            raise ValueError(f"positions must be int64, got {positions.dtype}")
        B, T = input_ids.shape
        start = 0
        if cache is not None:
            if cache.k.shape[1] != B:
                raise ValueError(f"cache batch {cache.k.shape[1]} != input batch {B}")
            start = cache.length
            if start + T > cache.max_len:
                raise ValueError(f"KV cache overflow: {start} filled + {T} new > max_len {cache.max_len}")
        rope = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, batch=B)  # once per forward
        if positions.shape[-1] != T:
            raise ValueError(f"positions has {positions.shape[-1]} entries for T={T} tokens")
        attention_fn = attention_fn or attend_with_cache
        x = self.embed_tokens(input_ids)
        for i, block in enumerate(self.layers):
            kv = cache.layer(i) if cache is not None else None
            x = block(x, rope, kv, start, attention_fn)
        if cache is not None:
            cache.advance(T)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)).to(torch.float32)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        """An empty ``KVCache`` for this model (float32, compact KV heads)."""
        return KVCache.for_model(self.config, batch, max_len, self.embed_tokens.weight.dtype)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, cache: KVCache, positions: torch.Tensor | None = None):
        """Fill the cache with a prompt. positions default to cache.length .. cache.length+T-1.

        Returns (B, T, vocab) float32 logits."""
        if positions is None:
            positions = torch.arange(cache.length, cache.length + input_ids.shape[1])
        return self(input_ids, positions, cache)

    @torch.no_grad()
    def decode(self, token_ids: torch.Tensor, cache: KVCache, positions: torch.Tensor | None = None):
        """One decode step: token_ids (B, 1) at positions (default: cache.length). Returns (B, vocab)."""
        if token_ids.dim() != 2 or token_ids.shape[1] != 1:
            raise ValueError(f"decode takes one token per sequence, shape (B, 1); got {tuple(token_ids.shape)}")
        return self.prefill(token_ids, cache, positions)[:, -1]


def toy_decoder(seed: int = 0, **overrides) -> Decoder:
    """The Lab 2 toy decoder (3,033,344 parameters with the defaults), random weights."""
    return Decoder.random(toy_config(**overrides), seed)


@torch.no_grad()
def generate_full_recompute(model: Decoder, prompt: torch.Tensor, max_new_tokens: int):
    """Greedy generation that re-runs the whole sequence at every step (no cache).

    Args:
        prompt: (T0,) or (1, T0) int64 ids.

    Returns:
        (tokens (max_new_tokens,) int64, logits (max_new_tokens, vocab) float32): the logits
        that chose each new token.
    """
    ids = prompt.reshape(1, -1)
    tokens, logits = [], []
    for _ in range(max_new_tokens):
        step = model(ids, torch.arange(ids.shape[1]))[0, -1]
        nxt = step.argmax()
        tokens.append(nxt)
        logits.append(step)
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return torch.stack(tokens), torch.stack(logits)


@torch.no_grad()
def generate_cached(model: Decoder, prompt: torch.Tensor, max_new_tokens: int,
                    cache: KVCache | None = None, attention_fn: AttentionFn | None = None):
    """Greedy generation with a KV cache: one prefill, then one decode step per token.

    Same returns as ``generate_full_recompute``; the last emitted token is never fed, so
    the cache ends holding T0 + max_new_tokens - 1 positions.
    """
    ids = prompt.reshape(1, -1)
    cache = cache or model.new_cache(1, ids.shape[1] + max_new_tokens)
    step = model(ids, torch.arange(ids.shape[1]), cache, attention_fn)[0, -1]
    tokens, logits = [], []
    for i in range(max_new_tokens):
        nxt = step.argmax()
        tokens.append(nxt)
        logits.append(step)
        if i + 1 < max_new_tokens:
            pos = torch.tensor([cache.length])
            step = model(nxt.view(1, 1), pos, cache, attention_fn)[0, -1]
    return torch.stack(tokens), torch.stack(logits)
