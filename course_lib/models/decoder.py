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

Past the context: a position at or beyond ``config.max_seq_len``, a prompt longer than it, or a
generation that would feed such a position is refused with ``ContextLengthError`` (a ValueError)
before any forward runs. The decoder does not slide a window (dropping the oldest keys would change
what every later token attends to, and positions past max_seq_len were never trained); a caller that
wants to go on must start again from a shorter context (docs/kv_cache.md#past-the-context).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from ..cache.contiguous import KVCache
from ..validation import ArgumentTypeError, ContextLengthError, boolean, instance, integer, integer_tensor, materialized
from . import ops
from .config import ModelConfig, toy_config
from .rope import rotate_pairs

AttentionFn = Callable[..., torch.Tensor]


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (Zhang & Sennrich, 2019), by ``ops.rms_norm``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class Linear(nn.Linear):
    """``nn.Linear`` whose product is ``ops.linear`` (PyTorch's, or the batch-invariant one in that mode).

    A module rather than a bare function call, so that forward hooks on the projections (``course_lib.quant``
    observes and rewrites their inputs with them) run in either mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class Block(nn.Module):
    """One decoder block; parameter names follow Hugging Face's Llama for easy loading."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.d_model, c.norm_eps)
        self.q_proj = Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.k_proj = Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.norm_eps)
        self.gate_proj = Linear(c.d_model, c.d_ff, bias=False)
        self.up_proj = Linear(c.d_model, c.d_ff, bias=False)
        self.down_proj = Linear(c.d_ff, c.d_model, bias=False)

    def qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """The attention inputs of x (B, T, d_model): (q (B, Hq, T, D), k (B, Hkv, T, D), v (B, Hkv, T, D)),
        q and k rotated. The first half of ``forward``; a serving engine (``course_lib.engine``) calls it,
        then its own attention over a paged cache, then ``finish``."""
        c = self.c
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotate_pairs(torch.cat([q, k], 1), *rope).split([c.n_heads, c.n_kv_heads], 1)   # one rotation
        return q, k, v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The block's output from its input x (B, T, d_model) and the attention output attn (B, Hq, T, D):
        output projection and residual, then RMSNorm, SwiGLU and residual. The second half of ``forward``."""
        c = self.c
        B, T, _ = x.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim))
        return x + self.mlp(self.post_attention_layernorm(x))

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """The block's SwiGLU feed-forward on its normalised input h (..., d_model):
        down(silu(gate(h)) * up(h)), (..., d_model) in h's dtype (Shazeer, 2020, "GLU Variants Improve
        Transformer", arXiv:2002.05202; SiLU by ``ops.silu``)."""
        return self.down_proj(ops.silu(self.gate_proj(h)) * self.up_proj(h))

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], kv: tuple[torch.Tensor, torch.Tensor] | None,
                start: int, attention_fn: AttentionFn, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.qkv(x, rope)
        if kv is None:
            attn = ops.attention(q, k, v, 0, key_mask)
        elif key_mask is None:
            attn = attention_fn(q, k, v, kv[0], kv[1], start)
        else:
            attn = attention_fn(q, k, v, kv[0], kv[1], start, key_mask=key_mask)
        return self.finish(x, attn)


def _on_device(name: str, x, device: torch.device) -> None:
    """A tensor ``x`` must hold data and be on the model's device (checked before any reduction runs on it)."""
    materialized(name, x)
    if isinstance(x, torch.Tensor) and x.device != device:
        raise ValueError(f"{name} is on {x.device} but the model is on {device}; move it with .to({str(device)!r})")


def _weight_with_data(model: "Decoder") -> torch.Tensor:
    """The model's embedding weight (its device and dtype are the model's), refused on the meta device."""
    return materialized("the model's weights (embed_tokens.weight)", model.embed_tokens.weight,
                        note="a model built on the meta device needs its weights loaded")


def state_with_data(model: "Decoder", prefix: str) -> dict[str, torch.Tensor]:
    """``model.state_dict()``, every tensor refused on the meta device, named ``prefix`` + its key
    (a model partly on meta would otherwise compute with uninitialised memory).

    Raises: ValueError naming the first tensor on the meta device (``validation.materialized``)."""
    state = model.state_dict()
    for name, tensor in state.items():
        materialized(f"{prefix}{name}", tensor, note="load or move the model first")
    return state


def check_attention_mask(attention_mask, B: int, S: int) -> torch.Tensor:
    """A left-padded attention mask, as a (B, S) bool tensor (True = a real token).

    Args:
        attention_mask: (B, S) bool or int64 of 0/1 over every slot a forward reads (the cache's filled
            slots, then the new tokens); each row is zeros (pads) then ones. A row may still be all
            pads (a chunk of a chunked prefill that ends before the row's first real token).

    Raises:
        ArgumentTypeError: not a bool or int64 tensor.
        ValueError: another shape, a value other than 0/1, a row with a pad after a real token (right
            padding, or a pad between real tokens); a tensor on the meta device.
    """
    instance("attention_mask", attention_mask, torch.Tensor)
    materialized("attention_mask", attention_mask)
    if attention_mask.dtype not in (torch.bool, torch.int64):
        raise ArgumentTypeError(f"attention_mask must be a bool or int64 tensor of 0/1 (1 = a real token), "
                                f"got dtype {attention_mask.dtype}")
    if tuple(attention_mask.shape) != (B, S):
        raise ValueError(f"attention_mask must be (B, S) = {(B, S)}: one column per cached slot and new token, "
                         f"got {tuple(attention_mask.shape)}")
    if attention_mask.dtype == torch.int64 and not ((attention_mask == 0) | (attention_mask == 1)).all():
        raise ValueError("attention_mask must hold only 0 (pad) and 1 (real token)")
    mask = attention_mask.to(torch.bool)
    bad = (mask[:, :-1] & ~mask[:, 1:]).any(-1)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(f"attention_mask row {row} is not left-padded (it has a 0 after a 1: "
                         f"{mask[row].int().tolist()[-16:]} at its end): each row must be pads (0) then real "
                         f"tokens (1), so that its last column is a real token")
    return mask


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: the count of real tokens before each column, pads at 0.

    Args:
        attention_mask: (B, S) bool or int64 of 0/1, 1 = a real token.

    Returns:
        (B, S) int64: cumsum(mask) - 1 along the row, clamped at 0 (the convention of transformers'
        generation utilities), so a row's first real token has position 0 however many pads precede it.

    Raises: ArgumentTypeError / ValueError as ``check_attention_mask``.
    """
    instance("attention_mask", attention_mask, torch.Tensor)
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (B, S), got shape {tuple(attention_mask.shape)}")
    mask = check_attention_mask(attention_mask, *attention_mask.shape)
    return (mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)


def left_pad(prompts: Sequence[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack prompts of different lengths, pads first: (input_ids (B, T) int64, attention_mask (B, T) int64).

    Args:
        prompts: a non-empty sequence of (T_i,) int64 token-id tensors, T_i >= 1, on one device.
        pad_id: the id written into pad slots (an int >= 0; masked, so any valid id will do).

    Raises:
        ArgumentTypeError: prompts not a sequence of int64 tensors; pad_id not an int.
        ValueError: no prompts, an empty or non-1-D prompt.
    """
    instance("prompts", prompts, (list, tuple))
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    pad_id = integer("pad_id", pad_id, minimum=0)
    for i, p in enumerate(prompts):
        integer_tensor(f"prompts[{i}]", p, ranks=(1,), layout="(T_i,)", dtype=torch.int64)
        if p.numel() == 0:
            raise ValueError(f"prompts[{i}] is empty: every row needs a real last token")
    T = max(p.numel() for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.int64, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, T - p.numel():] = p
        mask[i, T - p.numel():] = 1
    return ids, mask


def check_ids_and_positions(input_ids, positions, *, vocab_size: int, max_seq_len: int) -> tuple[int, int]:
    """The entry checks of a model forward (``Decoder.forward``, ``speculative.exact.MarkovLM.forward``):
    input_ids (B, T) int64 in 0 .. vocab_size - 1 with B, T >= 1; positions (T,) or (B, T) int64 in
    0 .. max_seq_len - 1. Returns (B, T).

    Raises: ArgumentTypeError for a wrong type or dtype; ContextLengthError (a ValueError) for a
    position >= max_seq_len (the refuse policy of the module docstring); ValueError for a wrong rank,
    an empty input, another value out of range, or positions of another length or batch."""
    integer_tensor("input_ids", input_ids, ranks=(2,), layout="(B, T)", dtype=torch.int64,
                   minimum=0, maximum=vocab_size - 1, note=f"token ids; vocab_size {vocab_size}")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise ValueError(f"input_ids must hold at least one token per sequence (B, T >= 1), "
                         f"got shape {tuple(input_ids.shape)}")
    try:
        integer_tensor("positions", positions, ranks=(1, 2), layout="(T,) or (B, T)", dtype=torch.int64,
                       minimum=0, maximum=max_seq_len - 1,
                       note=f"the model's max_seq_len is {max_seq_len}; past it the decoder refuses (no sliding window)")
    except ArgumentTypeError:
        raise
    except ValueError as err:
        if positions.numel() and int(positions.max()) >= max_seq_len:
            raise ContextLengthError(str(err)) from None
        raise
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
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def batch_invariant(self) -> bool:
        """Whether batch-invariant mode is on (read-only; ``batch_invariant_mode`` switches it). The mode
        belongs to the current context (thread or asyncio task), not to this model: ``models.ops``."""
        return ops.batch_invariant_enabled()

    @contextmanager
    def batch_invariant_mode(self, enabled: bool = True) -> Iterator["Decoder"]:
        """Within the block, every reduction of the forward (projections, RMSNorm, attention, output head)
        runs in a fixed order (``course_lib.kernels.batch_invariant``), so a row's logits are bitwise the
        same alone, in a batch of any size and at any place in it, and in one-pass or chunked prefill
        (course Lab 6). Yields this model. The previous mode comes back on exit, also on an exception.

        The switch is ``models.ops.batch_invariant_mode``: it holds for every model and engine computing in
        the current context (thread or asyncio task), not for this model alone; a thread started inside
        the block starts with the mode off (see ``models.ops``).

        Raises: ArgumentTypeError for ``enabled`` that is not a bool."""
        with ops.batch_invariant_mode(enabled):
            yield self

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
            ValueError: a tensor is missing, unexpected, has the wrong shape or is on the meta
                device (no weights to load).
        """
        instance("state_dict", state_dict, Mapping)
        model = cls(config)
        ours = {}
        for key, tensor in state_dict.items():
            name = key.removeprefix("model.")
            name = name.replace(".self_attn.", ".").replace(".mlp.", ".")
            if name.endswith("rotary_emb.inv_freq"):
                continue
            ours[name] = materialized(f"state_dict[{key!r}]", instance(f"state_dict[{key!r}]", tensor, torch.Tensor))
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
                attention_fn: AttentionFn | None = None, last_only: bool = False,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
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
            attention_fn: replaces the default cached attention (``ops.cached_attention``, the
                unchecked core of ``attend_with_cache``; same signature) for cached
                forwards; Lab 2 plugs the learner's attention step in here.
            last_only: (bool) compute logits for the last position only (B, 1, vocab): what
                generation needs; skips the output head's work on the other T - 1 positions.
            attention_mask: None, or (B, cache.length + T) bool / int64 0/1 over the cached slots
                and the new tokens, 1 = a real token, left-padded (``check_attention_mask``): pad
                slots are never read by a real token. Positions stay the caller's: a padded
                row's real tokens take ``positions_from_mask``'s values. The physical cache
                length includes the pads; a row's position does not.

        Returns:
            (B, T, vocab_size) float32 logits, or (B, 1, vocab_size) with ``last_only``.

        Raises:
            ArgumentTypeError: input_ids or positions not int64 tensors; cache not a KVCache
                or of another dtype; attention_fn not callable; last_only not a bool; an
                attention_mask neither bool nor int64.
            ValueError: a mask of another shape or not left-padded; an attention_fn together
                with batch_invariant mode; wrong ranks or an empty input; a token id outside the vocabulary; a
                negative position (one >= max_seq_len raises ContextLengthError, a ValueError: refused,
                never slid); positions of another length or batch;
                inputs on another device than the model; a model whose weights are on the meta
                device; a tensor argument on the meta device; a cache of another shape, batch or
                device, or one without room for T more slots ("KV cache overflow").
        """
        c = self.config
        weight = _weight_with_data(self)
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
        key_mask = None if attention_mask is None else check_attention_mask(attention_mask, B, start + T)
        if key_mask is not None:
            _on_device("attention_mask", key_mask, weight.device)
            if bool(key_mask.all()):
                key_mask = None                           # nothing padded: the unmasked path, same result
        if attention_fn is not None and ops.batch_invariant_enabled():
            raise ValueError("attention_fn cannot be used in batch_invariant mode: the mode routes attention "
                             "through course_lib.kernels.batch_invariant")
        rope = self.rotary(positions, B)                                               # once per forward
        attention_fn = attention_fn or ops.cached_attention
        x = self.embed_tokens(input_ids)
        if cache is None:
            for block in self.layers:
                x = block(x, rope, None, 0, attention_fn, key_mask)
        else:
            for block, k_layer, v_layer in zip(self.layers, cache.k, cache.v):
                x = block(x, rope, (k_layer, v_layer), start, attention_fn, key_mask)
            cache.advance(T)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)).to(torch.float32)

    def rotary(self, positions: torch.Tensor, B: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for ``rotate_pairs`` (what ``Block.qkv`` takes), for positions (T,) or (B, T) int64 in
        0 .. max_seq_len - 1, as ``rope.rope_cos_sin`` returns them: ``ops.rope_cos_sin``, which in
        batch-invariant mode reads them from a table computed once for every position."""
        c = self.config
        return ops.rope_cos_sin(positions, c.head_dim, c.rope_theta, B, c.rope_scaling, max_seq_len=c.max_seq_len)

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
    weight = _weight_with_data(model)
    _on_device("prompt", prompt, weight.device)
    integer_tensor("prompt", prompt, ranks=(1, 2), layout="(T0,) or (1, T0)", dtype=torch.int64,
                   minimum=0, maximum=c.vocab_size - 1, note=f"token ids; vocab_size {c.vocab_size}")
    if prompt.dim() == 2 and prompt.shape[0] != 1:
        raise ValueError(f"prompt must have shape (T0,) or (1, T0): generation runs one sequence, "
                         f"got {tuple(prompt.shape)}")
    T0 = prompt.shape[-1]
    if T0 == 0:
        raise ValueError("prompt must hold at least one token (T0 >= 1), got an empty prompt")
    if T0 > c.max_seq_len:
        raise ContextLengthError(f"prompt must hold at most max_seq_len = {c.max_seq_len} tokens, got {T0}")
    # Step i feeds positions up to T0 + i - 1; the last emitted token is never fed.
    n = _new_tokens(max_new_tokens, 0, T0, c.max_seq_len, f"a prompt of {T0} tokens leaves positions for this many")
    return prompt.reshape(1, -1), n


def _new_tokens(max_new_tokens, minimum: int, T0: int, max_seq_len: int, what: str) -> int:
    """``max_new_tokens`` checked as an int in [minimum, max_seq_len - T0 + 1]; a count past the last
    position raises ContextLengthError (the decoder refuses, it does not slide)."""
    try:
        return integer("max_new_tokens", max_new_tokens, minimum=minimum, maximum=max_seq_len - T0 + 1,
                       note=f"{what}; max_seq_len {max_seq_len}, past which the decoder refuses")
    except ArgumentTypeError:
        raise
    except ValueError as err:
        if max_new_tokens > max_seq_len - T0 + 1:
            raise ContextLengthError(str(err)) from None
        raise


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
        ContextLengthError (a ValueError): a prompt longer than max_seq_len, or max_new_tokens past
            the last position (refused before any forward; the decoder does not slide).
        ValueError: an empty or batched prompt, a token id outside the vocabulary,
            max_new_tokens < 0; a prompt or model weights on the meta device.
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


@torch.no_grad()
def generate_batch(model: Decoder, prompts: Sequence[torch.Tensor], max_new_tokens: int, pad_id: int = 0,
                   prefill_chunk: int | None = None):
    """Greedy generation for a left-padded batch: one cache of B rows, one forward per step for all rows.

    Each row keeps its own positions (``positions_from_mask``); the cache's physical slots include the
    pads. With ``model.batch_invariant_mode()`` on, each row's tokens and logits are bitwise those of
    the row generated alone (course Lab 6).

    Args:
        model: a ``Decoder``.
        prompts: a non-empty sequence of (T_i,) int64 token ids, T_i >= 1.
        max_new_tokens: an int >= 1 with max(T_i) + max_new_tokens - 1 <= max_seq_len.
        pad_id: the id in pad slots (an int in the vocabulary).
        prefill_chunk: None to prefill in one forward, or an int >= 1 to prefill that many columns
            per forward (chunked prefill: the same logits, within float32 rounding or bitwise in
            batch-invariant mode).

    Returns:
        (tokens (B, max_new_tokens) int64, logits (B, max_new_tokens, vocab) float32): row b's
        logits that chose each of its tokens.

    Raises:
        ArgumentTypeError / ValueError: as ``left_pad`` and ``Decoder.forward``; max_new_tokens < 1
        or past the last position; a prefill_chunk < 1; a model whose weights are on the meta device.
    """
    instance("model", model, Decoder)
    _weight_with_data(model)
    c = model.config
    ids, mask = left_pad(prompts, integer("pad_id", pad_id, minimum=0, maximum=c.vocab_size - 1,
                                          note=f"a token id; vocab_size {c.vocab_size}"))
    B, T0 = ids.shape
    if T0 > c.max_seq_len:
        raise ContextLengthError(f"the longest prompt holds {T0} tokens, more than max_seq_len = {c.max_seq_len}")
    n = _new_tokens(max_new_tokens, 1, T0, c.max_seq_len, f"the longest prompt has {T0} tokens")
    chunk = T0 if prefill_chunk is None else integer("prefill_chunk", prefill_chunk, minimum=1)
    device = model.embed_tokens.weight.device
    ids, mask = ids.to(device), mask.to(device)
    positions = positions_from_mask(mask)
    cache = model.new_cache(B, T0 + n - 1)
    for s in range(0, T0, chunk):
        step = model(ids[:, s:s + chunk], positions[:, s:s + chunk], cache, attention_mask=mask[:, :s + chunk],
                     last_only=True)[:, -1]
    tokens, logits = [], []
    next_position = positions[:, -1:] + 1
    for i in range(n):
        nxt = step.argmax(-1)
        tokens.append(nxt)
        logits.append(step)
        if i + 1 < n:
            mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
            step = model(nxt[:, None], next_position, cache, attention_mask=mask)[:, -1]
            next_position = next_position + 1
    return torch.stack(tokens, 1), torch.stack(logits, 1)
