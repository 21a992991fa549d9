"""Rotary position embedding (RoPE), split-half convention.

Source: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding"
(2021), and course "Lab 2": each 2-D pair (x_i, x_{i+D/2}) is rotated by the
angle position * omega_i with omega_i = theta^(-2i/D), i = 0 .. D/2 - 1. This is the
pairing Hugging Face's Llama uses ("rotate_half"); llama.cpp's GGUF files store q/k
rows permuted for the interleaved pairing, which transformers undoes on load.

A checkpoint trained for a longer context than its pre-training one may rescale the
frequencies (``config.RopeScaling``: linear position interpolation, or Llama 3.1's
frequency-dependent rule); ``scale_frequencies`` applies it, and ``rope_frequencies``,
``rope_angles`` and ``rope_cos_sin`` take it as ``scaling``. Two other published rules,
NTK-aware base change (``ntk_frequencies``) and YaRN (``yarn_frequencies``), are computed here
for Lab 2's RoPE explorer and for comparison; the decoder does not load them
(docs/kv_cache.md#long-context-rope-scaling).
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


def ntk_frequencies(head_dim: int, theta: float, factor: float) -> torch.Tensor:
    """RoPE frequencies under NTK-aware scaling: the base is raised to
    theta' = theta * factor ** (head_dim / (head_dim - 2)), so omega_i = theta'^(-2i/head_dim);
    shape (head_dim // 2,), float32.

    Pair 0 keeps omega_0 = 1 (its exponent is 0) and the slowest pair, i = head_dim/2 - 1, is
    divided by exactly ``factor``; the pairs between are divided by factor ** (2i / (head_dim - 2)).
    With head_dim 2 the only pair is pair 0 and nothing changes. Source: bloc97, "NTK-Aware Scaled
    RoPE allows LLaMA models to have extended (8k+) context size without any fine-tuning"
    (r/LocalLLaMA, June 2023); transformers' ``_compute_dynamic_ntk_parameters`` applies the same
    base change with a factor that follows the sequence length.

    Raises: ArgumentTypeError / ValueError for a ``head_dim`` that is not a positive even int, a
    ``theta`` or ``factor`` that is not a finite number > 0."""
    head_dim = positive_integer("head_dim", head_dim)
    positive_number("theta", theta)
    positive_number("factor", factor)
    if head_dim == 2:
        return rope_frequencies(head_dim, theta)
    return rope_frequencies(head_dim, theta * factor ** (head_dim / (head_dim - 2)))


def yarn_attention_factor(factor: float) -> float:
    """YaRN's attention temperature: cos and sin are multiplied by 0.1 * ln(factor) + 1 (1 for a
    factor <= 1), so every q.k logit grows by its square. Source: Peng et al., "YaRN: Efficient
    Context Window Extension of Large Language Models" (2023, arXiv:2309.00071), section 3.4;
    transformers' ``_compute_yarn_parameters`` (``get_mscale``).

    Raises: ArgumentTypeError / ValueError for a ``factor`` that is not a finite number > 0."""
    positive_number("factor", factor)
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_frequencies(head_dim: int, theta: float, factor: float, original_max_position_embeddings: int,
                     beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """RoPE frequencies under YaRN's "NTK-by-parts" rule, shape (head_dim // 2,), float32.

    A pair that turns r = C * omega_i / (2 pi) times over the pre-training context
    C = ``original_max_position_embeddings`` falls in one of three bands: r > ``beta_fast``
    (many turns: short range) keeps omega_i; r < ``beta_slow`` (less than a turn) gets
    omega_i / factor, as position interpolation; between, a linear ramp over the pair index
    blends the two. As transformers' ``_compute_yarn_parameters`` computes it (with its default
    ``truncate``): the band edges are the pair indices where r equals beta,
    low = floor(d ln(C / (2 pi beta_fast)) / (2 ln theta)) and
    high = ceil(d ln(C / (2 pi beta_slow)) / (2 ln theta)), clipped to [0, d - 1]; with
    ramp_i = clamp((i - low) / (high - low), 0, 1), omega'_i = (1 - ramp_i) omega_i + ramp_i omega_i / factor.
    The attention temperature that goes with it is ``yarn_attention_factor``.
    Source: Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models" (2023,
    arXiv:2309.00071), section 3.2 (alpha = beta_slow = 1, beta = beta_fast = 32 for Llama).

    Raises: ArgumentTypeError / ValueError for a ``head_dim`` that is not a positive even int;
    ``theta`` not > 1 (the bands are logarithms in base theta); ``factor``, ``beta_fast`` or
    ``beta_slow`` not a finite number > 0; beta_slow >= beta_fast; an
    ``original_max_position_embeddings`` that is not an int >= 1."""
    omega = rope_frequencies(head_dim, theta)
    if not theta > 1:
        raise ValueError(f"theta must be > 1 for YaRN (its bands are logarithms in base theta), got {theta!r}")
    positive_number("factor", factor)
    context = positive_integer("original_max_position_embeddings", original_max_position_embeddings)
    positive_number("beta_fast", beta_fast)
    positive_number("beta_slow", beta_slow)
    if beta_slow >= beta_fast:
        raise ValueError(f"beta_slow ({beta_slow}) must be below beta_fast ({beta_fast}): pairs with more than "
                         "beta_fast turns are kept, those with fewer than beta_slow interpolated")

    def band_edge(turns: float) -> float:
        return head_dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(band_edge(beta_fast)), 0)
    high = min(math.ceil(band_edge(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001        # as transformers: a step instead of a division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return (1 - ramp) * omega + ramp * (omega / factor)


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


#: The long-context scalings by name (Lab 2's explorer and table): none, position interpolation, NTK-aware
#: base change, YaRN.
SCALINGS: tuple[str, ...] = ("none", "linear", "ntk", "yarn")
#: The pre-training context assumed for YaRN's bands when none is given (positions).
CONTEXT: int = 2048


def scaled_frequencies(n_pairs: int, base: float, scaling: str = "none", factor: float = 1.0,
                       context: int = CONTEXT) -> torch.Tensor:
    """omega_i (n_pairs,) float32 of a head of width 2 * n_pairs under SCALING ("none", "linear":
    ``RopeScaling("linear")``, "ntk": ``ntk_frequencies``, "yarn": ``yarn_frequencies`` with
    beta_fast 32, beta_slow 1 and pre-training context ``context``), stretched by ``factor``.

    Raises: ValueError for an unknown ``scaling``, a ``factor`` below 1, or arguments the library
    function refuses."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    if not factor >= 1:
        raise ValueError(f"factor must be >= 1 (a context stretched by it), got {factor!r}")
    d = 2 * n_pairs
    if scaling == "none":
        return rope_frequencies(d, base)
    if scaling == "linear":
        return rope_frequencies(d, base, RopeScaling("linear", float(factor)))
    if scaling == "ntk":
        return ntk_frequencies(d, base, factor)
    return yarn_frequencies(d, base, factor, context)
