"""Rotary position embedding (RoPE), split-half convention.

Source: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding"
(2021), and course "Lab 2": each 2-D pair (x_i, x_{i+D/2}) is rotated by the
angle position * omega_i with omega_i = theta^(-2i/D), i = 0 .. D/2 - 1. This is the
pairing Hugging Face's Llama uses ("rotate_half"); llama.cpp's GGUF files store q/k
rows permuted for the interleaved pairing, which transformers undoes on load.

A checkpoint trained for a longer context than its pre-training one may rescale the
frequencies (``config.RopeScaling``: linear position interpolation, or Llama 3.1's
frequency-dependent rule); ``scale_frequencies`` applies it, and ``rope_frequencies``,
``rope_angles`` and ``rope_cos_sin`` take it as ``scaling``.
"""
from __future__ import annotations

import math

import torch

from ..validation import ArgumentTypeError, instance, integer_tensor, positive_integer, positive_number
from .config import MAX_POSITIONS, RopeScaling

_POSITION_NOTE = "float32 represents every integer position exactly only up to 2**24"


def scale_frequencies(omega: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """RoPE frequencies ``omega`` (float32, any shape) rescaled as ``scaling`` says, same shape and dtype.

    "linear" (position interpolation, Chen et al. 2023): omega / factor, so position p turns as
    p / factor did. "llama3" (Meta's Llama 3.1 rule, as transformers' ``_compute_llama3_parameters``
    computes it, in the same order): with wavelength w = 2 pi / omega and the pre-training context
    C = original_max_position_embeddings,

        w < C / high_freq_factor  (short wavelengths):  omega                (kept)
        w > C / low_freq_factor   (long wavelengths):   omega / factor
        otherwise, with s = (C / w - low_freq_factor) / (high_freq_factor - low_freq_factor):
                                                        (1 - s) * omega / factor + s * omega

    Raises: ArgumentTypeError for an ``omega`` that is not a floating tensor or a ``scaling`` that
    is not a RopeScaling."""
    instance("omega", omega, torch.Tensor)
    if not omega.dtype.is_floating_point:
        raise ArgumentTypeError(f"omega must be a floating tensor, got dtype {omega.dtype}")
    instance("scaling", scaling, RopeScaling)
    factor = scaling.factor
    if scaling.rope_type == "linear":
        return omega / factor
    low, high, context = scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = context / low, context / high
    wavelen = 2 * math.pi / omega
    scaled = torch.where(wavelen > low_freq_wavelen, omega / factor, omega)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def rope_frequencies(head_dim: int, theta: float = 10000.0, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Angular frequencies omega_i = theta^(-2i/head_dim), shape (head_dim // 2,), float32, then
    rescaled by ``scaling`` when one is given (``scale_frequencies``).

    Raises:
        ArgumentTypeError / ValueError: ``head_dim`` not a positive even int, ``theta`` not a
            finite number > 0, ``scaling`` neither None nor a RopeScaling.
    """
    head_dim = positive_integer("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int (RoPE turns pairs), got {head_dim}")
    positive_number("theta", theta)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    omega = 1.0 / (theta ** exponents)
    return omega if scaling is None else scale_frequencies(omega, scaling)


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float = 10000.0,
                scaling: RopeScaling | None = None) -> torch.Tensor:
    """Rotation angles position * omega_i, shape positions.shape + (head_dim // 2,), float32 (radians).

    Args:
        positions: integer tensor of any shape; any sign (a negative position turns backwards),
            magnitude at most 2**24 (``MAX_POSITIONS``), beyond which float32 rounds neighbouring
            positions to the same angle.
        scaling: a ``RopeScaling`` of the frequencies, or None (plain RoPE).

    Raises:
        ArgumentTypeError: ``positions`` not an integer tensor (float, bool, a list, ...).
        ValueError: a position beyond +-2**24; bad ``head_dim`` / ``theta`` / ``scaling`` as
            ``rope_frequencies``.
    """
    integer_tensor("positions", positions, minimum=-MAX_POSITIONS, maximum=MAX_POSITIONS, note=_POSITION_NOTE)
    omega = rope_frequencies(head_dim, theta, scaling)
    return positions.to(torch.float32)[..., None] * omega


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, batch: int | None = None,
                 scaling: RopeScaling | None = None):
    """cos and sin of the rotation angles, broadcastable against (B, H, T, head_dim // 2).

    Args:
        positions: int tensor (T,) shared by the batch, or (B, T); |position| <= 2**24.
        batch: when given, a (B, T) ``positions`` must have this B.
        scaling: a ``RopeScaling`` of the frequencies (the model's ``config.rope_scaling``), or None.

    Returns:
        (cos, sin), each float32 of shape (1, 1, T, head_dim // 2) or (B, 1, T, head_dim // 2).

    Raises:
        ArgumentTypeError: float/bool positions, or not a tensor.
        ValueError: a rank other than 1 or 2, a batch mismatch, a position beyond +-2**24.
    """
    integer_tensor("positions", positions, ranks=(1, 2), layout="(T,) or (B, T)")
    if batch is not None:
        batch = positive_integer("batch", batch)
        if positions.dim() == 2 and positions.shape[0] != batch:
            raise ValueError(f"positions must be (B, T) with B={batch}, got {tuple(positions.shape)}")
    angles = rope_angles(positions, head_dim, theta, scaling)
    angles = angles[None, None] if positions.dim() == 1 else angles[:, None]
    return angles.cos(), angles.sin()


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each split-half pair (x_i, x_{i+D/2}) of x (B, H, T, D) by the angle whose cos/sin
    are given (from ``rope_cos_sin``, last dimension D // 2). Computed in float32, returned in
    x's dtype.

    Raises: ValueError when cos/sin's last dimension is not D // 2 (other shape errors are
    torch's broadcasting errors; ``apply_rope`` checks everything)."""
    D = x.shape[-1]
    if 2 * cos.shape[-1] != D or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must have last dimension D // 2 = {D // 2} (x is {tuple(x.shape)}), "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    xf = x.to(torch.float32)
    x1, x2 = xf[..., : D // 2], xf[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate query or key vectors by their absolute positions.

    Args:
        x: (B, H, T, D) floating tensor, D even.
        positions: int tensor of shape (T,) shared by the batch, or (B, T): the absolute
            position of each of the T vectors (not its slot in a cache); any sign,
            |position| <= 2**24.
        theta: RoPE base, a finite number > 0.

    Returns:
        Tensor of x's shape and dtype; the rotation is computed in float32.

    Raises:
        ArgumentTypeError: x not a floating tensor, positions not an integer tensor.
        ValueError: wrong ranks, odd D, positions that do not match x's T (or B), a position
            beyond +-2**24, theta not > 0.
    """
    instance("x", x, torch.Tensor)
    if not x.dtype.is_floating_point:
        raise ArgumentTypeError(f"x must be a floating tensor (B, H, T, D), got dtype {x.dtype}")
    if x.dim() != 4:
        raise ValueError(f"x must be (B, H, T, D), got shape {tuple(x.shape)}")
    B, _, T, D = x.shape
    if D % 2:
        raise ValueError(f"x's last dimension must be even, got {D}")
    integer_tensor("positions", positions, ranks=(1, 2), layout="(T,) or (B, T)")
    if positions.shape[-1] != T:
        raise ValueError(f"positions has {positions.shape[-1]} entries for T={T} vectors")
    cos, sin = rope_cos_sin(positions, D, theta, batch=B)
    return rotate_pairs(x, cos, sin)
