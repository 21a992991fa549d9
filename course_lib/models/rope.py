"""Rotary position embedding (RoPE), split-half convention.

Source: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding"
(2021), and course "Lab 2": each 2-D pair (x_i, x_{i+D/2}) is rotated by the
angle position * omega_i with omega_i = theta^(-2i/D), i = 0 .. D/2 - 1. This is the
pairing Hugging Face's Llama uses ("rotate_half"); llama.cpp's GGUF files store q/k
rows permuted for the interleaved pairing, which transformers undoes on load.
"""
from __future__ import annotations

import torch


def rope_frequencies(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """Angular frequencies omega_i = theta^(-2i/head_dim), shape (head_dim // 2,), float32.

    Raises:
        ValueError: ``head_dim`` not a positive even int, or ``theta`` <= 0.
    """
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim!r}")
    if not theta > 0:
        raise ValueError(f"theta must be > 0, got {theta!r}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """Rotation angles position * omega_i, shape positions.shape + (head_dim // 2,), float32 (radians)."""
    omega = rope_frequencies(head_dim, theta)
    return positions.to(torch.float32)[..., None] * omega


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, batch: int | None = None):
    """cos and sin of the rotation angles, broadcastable against (B, H, T, head_dim // 2).

    Args:
        positions: int tensor (T,) shared by the batch, or (B, T).
        batch: when given, a (B, T) ``positions`` must have this B.

    Returns:
        (cos, sin), each float32 of shape (1, 1, T, head_dim // 2) or (B, 1, T, head_dim // 2).

    Raises:
        ValueError: float/bool positions, or a rank other than 1 or 2, or a batch mismatch.
    """
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(f"positions must be an integer tensor, got {positions.dtype}")
    if positions.dim() not in (1, 2):
        raise ValueError(f"positions must be (T,) or (B, T), got shape {tuple(positions.shape)}")
    if positions.dim() == 2 and batch is not None and positions.shape[0] != batch:
        raise ValueError(f"positions must be (B, T) with B={batch}, got {tuple(positions.shape)}")
    angles = rope_angles(positions, head_dim, theta)
    angles = angles[None, None] if positions.dim() == 1 else angles[:, None]
    return angles.cos(), angles.sin()


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each split-half pair (x_i, x_{i+D/2}) of x (B, H, T, D) by the angle whose cos/sin
    are given (from ``rope_cos_sin``). Computed in float32, returned in x's dtype."""
    D = x.shape[-1]
    xf = x.to(torch.float32)
    x1, x2 = xf[..., : D // 2], xf[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate query or key vectors by their absolute positions.

    Args:
        x: (B, H, T, D) float tensor, D even.
        positions: int tensor of shape (T,) shared by the batch, or (B, T): the absolute
            position of each of the T vectors (not its slot in a cache).
        theta: RoPE base.

    Returns:
        Tensor of x's shape and dtype; the rotation is computed in float32.

    Raises:
        ValueError: wrong ranks, odd D, or positions that do not match x's T (or B).
    """
    if x.dim() != 4:
        raise ValueError(f"x must be (B, H, T, D), got shape {tuple(x.shape)}")
    B, _, T, D = x.shape
    if D % 2:
        raise ValueError(f"x's last dimension must be even, got {D}")
    if positions.dim() >= 1 and positions.shape[-1] != T:
        raise ValueError(f"positions has {positions.shape[-1]} entries for T={T} vectors")
    cos, sin = rope_cos_sin(positions, D, theta, batch=B)
    return rotate_pairs(x, cos, sin)
