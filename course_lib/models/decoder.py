"""A compact Llama-style decoder: the Lab 2 toy model and the SmolLM2 reference model.

Pre-norm blocks (RMSNorm -> GQA attention with split-half RoPE -> residual; RMSNorm ->
SwiGLU -> residual), final RMSNorm, output head (tied or not). Positions are always
explicit arguments and the KV cache is an explicit object, so prefill and decode are
the same forward with different inputs (course Lab 2; style after gpt-fast).

Tensor conventions: token ids (B, T) int64 in 0 .. vocab_size - 1; positions (T,) or (B, T)
int64 in 0 .. max_seq_len - 1; logits (B, T, vocab) float32.

Inputs are checked once, on entry to ``Decoder.forward`` and the generation functions (token
ids and positions with one min/max reduction each, the cache by its sizes and dtype); the
blocks then compute without checks. Errors: ``course_lib.validation.ArgumentTypeError`` (a
TypeError, also a ValueError) for a wrong type or dtype, ``ValueError`` for a wrong value.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import nn

from ..cache.contiguous import KVCache
from ..validation import ArgumentTypeError, boolean, instance, integer, integer_tensor
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


def _on_device(name: str, x, device: torch.device) -> None:
    """A tensor ``x`` must be on the model's device (checked before any reduction runs on it)."""
    if isinstance(x, torch.Tensor) and x.device != device:
        raise ValueError(f"{name} is on {x.device} but the model is on {device}; move it with .to({str(device)!r})")


def check_ids_and_positions(input_ids, positions, *, vocab_size: int, max_seq_len: int) -> tuple[int, int]:
    """The entry checks of a model forward (``Decoder.forward``, ``speculative.exact.MarkovLM.forward``):
    input_ids (B, T) int64 in 0 .. vocab_size - 1 with B, T >= 1; positions (T,) or (B, T) int64 in
    0 .. max_seq_len - 1. Returns (B, T).

    Raises: ArgumentTypeError for a wrong type or dtype; ValueError for a wrong rank, an empty input,
    a value out of range, or positions of another length or batch."""
    integer_tensor("input_ids", input_ids, ranks=(2,), layout="(B, T)", dtype=torch.int64,
                   minimum=0, maximum=vocab_size - 1, note=f"token ids; vocab_size {vocab_size}")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise ValueError(f"input_ids must hold at least one token per sequence (B, T >= 1), "
                         f"got shape {tuple(input_ids.shape)}")
    integer_tensor("positions", positions, ranks=(1, 2), layout="(T,) or (B, T)", dtype=torch.int64,
                   minimum=0, maximum=max_seq_len - 1, note=f"the model's max_seq_len is {max_seq_len}")
    if positions.shape[-1] != T:
        raise ValueError(f"positions has {positions.shape[-1]} entries for T={T} tokens")
    if positions.dim() == 2 and positions.shape[0] != B:
        raise ValueError(f"positions must be (B, T) with B={B}, got {tuple(positions.shape)}")
    return B, T


class Decoder(nn.Module):
    """Llama-style decoder with an explicit KV cache and explicit positions.

    The constructors ``random`` and ``from_hf_state_dict`` return an inference model
    (eval mode, parameters without gradients), so no autograd graph reaches the cache.

    Args:
        config: the model's ``ModelConfig``.

    Raises:
        ArgumentTypeError: ``config`` is not a ModelConfig.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = instance("config", config, ModelConfig)
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
        behaviour course Lab 2 describes; cached vs full recompute differ by ~1e-6.

        Args:
            config: a ModelConfig; None means ``toy_config()``. seed: an int.
        Raises: ArgumentTypeError for a config that is not a ModelConfig or a seed that is not an int."""
        seed = integer("seed", seed)
        model = cls(toy_config() if config is None else config)
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
            ArgumentTypeError: ``config`` not a ModelConfig, ``state_dict`` not a mapping, or a
                value that is not a tensor.
            ValueError: a tensor is missing, unexpected, or has the wrong shape.
        """
        instance("state_dict", state_dict, Mapping)
        model = cls(config)
        ours = {}
        for key, tensor in state_dict.items():
            name = key.removeprefix("model.")
            name = name.replace(".self_attn.", ".").replace(".mlp.", ".")
            if name.endswith("rotary_emb.inv_freq"):
                continue
            ours[name] = instance(f"state_dict[{key!r}]", tensor, torch.Tensor)
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
            input_ids: (B, T) int64 token ids in 0 .. vocab_size - 1, B >= 1 and T >= 1, on
                the model's device.
            positions: (T,) or (B, T) int64 absolute positions of those tokens, in
                0 .. config.max_seq_len - 1, on the model's device.
            cache: a ``KVCache`` built for this model (``new_cache``: same layers, KV heads,
                head width, dtype and device; batch B); when given, the new keys/values go to
                slots cache.length .. cache.length+T-1, attention reads every filled slot, and
                cache.length advances by T. Without it, a plain causal forward.
            attention_fn: replaces ``attend_with_cache`` (same signature) for cached
                forwards; Lab 2 plugs the learner's attention step in here.
            last_only: (bool) compute logits for the last position only (B, 1, vocab): what
                generation needs; skips the output head's work on the other T - 1 positions.

        Returns:
            (B, T, vocab_size) float32 logits, or (B, 1, vocab_size) with ``last_only``.

        Raises:
            ArgumentTypeError: input_ids or positions not int64 tensors; cache not a KVCache
                or of another dtype; attention_fn not callable; last_only not a bool.
            ValueError: wrong ranks or an empty input; a token id outside the vocabulary; a
                position outside 0 .. max_seq_len - 1; positions of another length or batch;
                inputs on another device than the model; a cache of another shape, batch or
                device, or one without room for T more slots ("KV cache overflow").
        """
        c = self.config
        weight = self.embed_tokens.weight
        _on_device("input_ids", input_ids, weight.device)
        _on_device("positions", positions, weight.device)
        B, T = check_ids_and_positions(input_ids, positions, vocab_size=c.vocab_size, max_seq_len=c.max_seq_len)
        if attention_fn is not None and not callable(attention_fn):
            raise ArgumentTypeError(f"attention_fn must be callable (q, k_new, v_new, k_cache, v_cache, start) "
                                    f"or None, got {type(attention_fn).__qualname__}")
        boolean("last_only", last_only)
        start = 0
        if cache is not None:
            instance("cache", cache, KVCache)
            cache.check_fits(c, B, weight.dtype, weight.device)
            start = cache.length
            if start + T > cache.max_len:
                raise ValueError(f"KV cache overflow: {start} filled + {T} new > max_len {cache.max_len}")
        rope = rope_cos_sin(positions, c.head_dim, c.rope_theta, batch=B, scaling=c.rope_scaling)  # once per forward
        attention_fn = attention_fn or attend_with_cache
        x = self.embed_tokens(input_ids)
        if cache is None:
            for block in self.layers:
                x = block(x, rope, None, 0, attention_fn)
        else:
            for block, k_layer, v_layer in zip(self.layers, cache.k, cache.v):
                x = block(x, rope, (k_layer, v_layer), start, attention_fn)
            cache.advance(T)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)).to(torch.float32)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        """An empty ``KVCache`` for this model: compact KV heads, the weights' dtype and device.

        Args:
            batch: sequences, an int >= 1.
            max_len: slots, an int in [1, config.max_seq_len]; None means config.max_seq_len.

        Raises:
            ArgumentTypeError / ValueError: as ``KVCache.for_model`` (e.g. max_len 0).
        """
        weight = self.embed_tokens.weight
        return KVCache.for_model(self.config, batch, max_len, weight.dtype, weight.device)

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, cache: KVCache, positions: torch.Tensor | None = None):
        """Fill the cache with a prompt. positions default to cache.length .. cache.length+T-1.

        Returns (B, T, vocab) float32 logits. Raises: as ``forward``."""
        instance("cache", cache, KVCache)
        if positions is None:
            instance("input_ids", input_ids, torch.Tensor)
            T = input_ids.shape[-1] if input_ids.dim() else 0
            positions = torch.arange(cache.length, cache.length + T, device=input_ids.device)
        return self(input_ids, positions, cache)

    @torch.no_grad()
    def decode(self, token_ids: torch.Tensor, cache: KVCache, positions: torch.Tensor | None = None):
        """One decode step: token_ids (B, 1) at positions (default: cache.length). Returns (B, vocab).

        Raises: as ``forward``; ValueError for token_ids that are not (B, 1)."""
        instance("token_ids", token_ids, torch.Tensor)
        if token_ids.dim() != 2 or token_ids.shape[1] != 1:
            raise ValueError(f"decode takes one token per sequence, shape (B, 1); got {tuple(token_ids.shape)}")
        return self.prefill(token_ids, cache, positions)[:, -1]


def toy_decoder(seed: int = 0, **overrides) -> Decoder:
    """The Lab 2 toy decoder (3,033,344 parameters with the defaults), random weights."""
    return Decoder.random(toy_config(**overrides), seed)


def generation_inputs(model: Decoder, prompt: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, int]:
    """Check the arguments every greedy generation function shares (these two and
    ``course_lib.speculative.generate_speculative``); return (ids (1, T0) int64, n).

    Raises: as ``generate_full_recompute``."""
    instance("model", model, Decoder)
    c = model.config
    _on_device("prompt", prompt, model.embed_tokens.weight.device)
    integer_tensor("prompt", prompt, ranks=(1, 2), layout="(T0,) or (1, T0)", dtype=torch.int64,
                   minimum=0, maximum=c.vocab_size - 1, note=f"token ids; vocab_size {c.vocab_size}")
    if prompt.dim() == 2 and prompt.shape[0] != 1:
        raise ValueError(f"prompt must have shape (T0,) or (1, T0): generation runs one sequence, "
                         f"got {tuple(prompt.shape)}")
    T0 = prompt.shape[-1]
    if T0 == 0:
        raise ValueError("prompt must hold at least one token (T0 >= 1), got an empty prompt")
    if T0 > c.max_seq_len:
        raise ValueError(f"prompt must hold at most max_seq_len = {c.max_seq_len} tokens, got {T0}")
    # Step i feeds positions up to T0 + i - 1; the last emitted token is never fed.
    n = integer("max_new_tokens", max_new_tokens, minimum=0, maximum=c.max_seq_len - T0 + 1,
                note=f"a prompt of {T0} tokens leaves positions for this many; max_seq_len {c.max_seq_len}")
    return prompt.reshape(1, -1), n


def _no_tokens(model: Decoder, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The empty generation: tokens (0,) int64 and logits (0, vocab) float32 on ids' device."""
    return (torch.empty(0, dtype=torch.int64, device=ids.device),
            torch.empty(0, model.config.vocab_size, dtype=torch.float32, device=ids.device))


@torch.no_grad()
def generate_full_recompute(model: Decoder, prompt: torch.Tensor, max_new_tokens: int):
    """Greedy generation that re-runs the whole sequence at every step (no cache).

    Args:
        model: a ``Decoder``.
        prompt: (T0,) or (1, T0) int64 ids in 0 .. vocab_size - 1, T0 >= 1.
        max_new_tokens: an int in [0, max_seq_len - T0 + 1] (the last new token is never fed,
            so the positions used are 0 .. T0 + max_new_tokens - 2). 0 returns an empty
            generation without running the model.

    Returns:
        (tokens (max_new_tokens,) int64, logits (max_new_tokens, vocab) float32): the logits
        that chose each new token.

    Raises:
        ArgumentTypeError: model not a Decoder, prompt not an int64 tensor, max_new_tokens not an int.
        ValueError: an empty or batched prompt, a token id outside the vocabulary, a prompt
            longer than max_seq_len, max_new_tokens < 0 or past the last position.
    """
    ids, n = generation_inputs(model, prompt, max_new_tokens)
    if n == 0:
        return _no_tokens(model, ids)
    tokens, logits = [], []
    for _ in range(n):
        step = model(ids, torch.arange(ids.shape[1], device=ids.device))[0, -1]
        nxt = step.argmax()
        tokens.append(nxt)
        logits.append(step)
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return torch.stack(tokens), torch.stack(logits)


@torch.no_grad()
def generate_cached(model: Decoder, prompt: torch.Tensor, max_new_tokens: int,
                    cache: KVCache | None = None, attention_fn: AttentionFn | None = None):
    """Greedy generation with a KV cache: one prefill, then one decode step per token.

    Args, returns and edge cases as ``generate_full_recompute``; the last emitted token is
    never fed, so the cache ends holding T0 + max_new_tokens - 1 positions.

    Args:
        cache: an empty ``KVCache`` for this model with batch 1 and at least
            T0 + max_new_tokens - 1 slots, or None for a new one of exactly that size. With
            max_new_tokens 0 it is checked but left unchanged.
        attention_fn: as ``Decoder.forward``.

    Raises:
        As ``generate_full_recompute``; ArgumentTypeError for a cache that is not a KVCache;
        ValueError for a cache that is not empty or too short, or of another shape, batch,
        dtype or device (checked before the prompt runs).
    """
    ids, n = generation_inputs(model, prompt, max_new_tokens)
    T0 = ids.shape[1]
    needed = T0 + max(n, 1) - 1
    if cache is None:
        cache = model.new_cache(1, needed)
    else:
        instance("cache", cache, KVCache)
        weight = model.embed_tokens.weight
        cache.check_fits(model.config, 1, weight.dtype, weight.device)
        if cache.length != 0:
            raise ValueError(f"cache must be empty (length 0) for generation, got length {cache.length}; "
                             f"crop(0) it or pass a new one")
        if cache.max_len < needed:
            raise ValueError(f"cache must have at least T0 + max_new_tokens - 1 = {needed} slots, "
                             f"got max_len {cache.max_len}")
    if n == 0:
        return _no_tokens(model, ids)
    step = model(ids, torch.arange(T0, device=ids.device), cache, attention_fn)[0, -1]
    tokens, logits = [], []
    for i in range(n):
        nxt = step.argmax()
        tokens.append(nxt)
        logits.append(step)
        if i + 1 < n:
            pos = torch.tensor([cache.length], device=ids.device)
            step = model(nxt.view(1, 1), pos, cache, attention_fn)[0, -1]
    return torch.stack(tokens), torch.stack(logits)
