"""A contiguous, preallocated KV cache (one tensor per K and V for all layers).

Layout follows gpt-fast's ``KVCache``: (n_layers, B, n_kv_heads, max_len, head_dim),
compact GQA heads (heads are repeated only inside attention). ``length`` counts the
filled slots; the model writes new keys at slots length .. length+T-1. Slots are not
positions: RoPE positions are passed explicitly to the model (course Lab 2).
"""
from __future__ import annotations

import copy

import torch


class KVCache:
    """Preallocated K/V storage for a decoder.

    Args:
        n_layers, batch, n_kv_heads, max_len, head_dim: sizes (positive ints).
        dtype: storage dtype (float32 by default).

    Attributes:
        k, v: (n_layers, batch, n_kv_heads, max_len, head_dim) tensors.
        length: filled slots (int).
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        for name, value in (("n_layers", n_layers), ("batch", batch), ("n_kv_heads", n_kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVCache {name} must be a positive int, got {value!r}")
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @classmethod
    def for_model(cls, config, batch: int = 1, max_len: int | None = None,
                  dtype: torch.dtype = torch.float32) -> "KVCache":
        """A cache sized for a ``ModelConfig`` (max_len defaults to config.max_seq_len)."""
        return cls(config.n_layers, batch, config.n_kv_heads, max_len or config.max_seq_len,
                   config.head_dim, dtype)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (B, n_kv_heads, max_len, head_dim) of one layer's K and V storage."""
        return self.k[index], self.v[index]

    def advance(self, n_new: int) -> None:
        """Mark n_new more slots filled (called once per forward, after every layer wrote)."""
        if self.length + n_new > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} + {n_new} > max_len {self.max_len}")
        self.length += n_new

    def crop(self, length: int) -> None:
        """Forget every slot from ``length`` on (a rollback or a branch back to a prefix)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length must be in 0..{self.length}, got {length}")
        self.length = length

    def clone(self) -> "KVCache":
        """An independent copy (storage included, detached from any autograd graph)."""
        twin = copy.copy(self)
        twin.k, twin.v = self.k.detach().clone(), self.v.detach().clone()
        return twin

    def filled_bytes(self) -> int:
        """Bytes held by the filled slots of K and V, measured from the tensors."""
        per_slot = self.k[:, :, :, :1].numel() * self.k.element_size()
        return 2 * per_slot * self.length

    def allocated_bytes(self) -> int:
        """Bytes of the whole preallocated storage."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
