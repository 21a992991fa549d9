"""Two 4-bit codes per byte, and the packed int4 weight a W4A16 kernel reads.

Nibble layouts (``order``):

- ``"pairs"`` (the course's layout): element ``2j`` in the low nibble of byte ``j``, element
  ``2j + 1`` in the high nibble; with an odd count the last high nibble is 0. A kernel reading
  columns ``k`` and ``k + 1`` reads one byte.
- ``"halves"`` (GGML's block layout, llama.cpp ggml-quants.c ``block_q4_0``/``block_q4_1``): for
  ``n = 2h`` elements, byte ``j`` holds element ``j`` low and element ``j + h`` high. GGML applies
  it to each block of 32 (h = 16); reshape to (..., blocks, 32) first.

Signed codes (-8..7) are stored as two's complement nibbles (``code & 0xF``); unsigned codes
(0..15) as they are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..validation import boolean, instance, integer_tensor, materialized, one_of, positive_integer
from .formats import QuantizedTensor, QuantScheme, quantize

__all__ = ["NIBBLE_ORDERS", "pack_int4", "unpack_int4", "PackedInt4", "pack_weight", "check_int4_zero_points"]

#: The nibble layouts ``pack_int4``/``unpack_int4`` know.
NIBBLE_ORDERS: tuple[str, ...] = ("pairs", "halves")


def pack_int4(codes: torch.Tensor, signed: bool = True, order: str = "pairs") -> torch.Tensor:
    """Pack 4-bit codes two per byte.

    Args:
        codes: integer tensor (..., n), n >= 1; values in [-8, 7] when ``signed``, [0, 15] otherwise.
        signed: two's complement nibbles (True) or unsigned nibbles (False).
        order: ``"pairs"`` or ``"halves"`` (module docstring); "halves" needs an even n.

    Returns:
        uint8 (..., ceil(n / 2)).

    Raises:
        ArgumentTypeError: codes not an integer tensor. ValueError: a value out of range, n = 0,
        an odd n with "halves", an unknown order.
    """
    boolean("signed", signed)
    one_of("order", order, NIBBLE_ORDERS)
    low, high = (-8, 7) if signed else (0, 15)
    integer_tensor("codes", codes, minimum=low, maximum=high,
                   note="signed int4" if signed else "unsigned int4")
    if codes.dim() == 0 or codes.shape[-1] == 0:
        raise ValueError(f"codes must have a last dimension of at least 1 element, got shape {tuple(codes.shape)}")
    n = codes.shape[-1]
    nibbles = (codes.to(torch.int16) & 0xF).to(torch.uint8)
    if order == "halves":
        if n % 2:
            raise ValueError(f"order 'halves' needs an even number of codes (a block of n = 2h), got n = {n}")
        first, second = nibbles[..., : n // 2], nibbles[..., n // 2:]
    else:
        if n % 2:
            nibbles = torch.cat([nibbles, nibbles.new_zeros((*nibbles.shape[:-1], 1))], dim=-1)
        first, second = nibbles[..., 0::2], nibbles[..., 1::2]
    return (first | (second << 4)).contiguous()


def unpack_int4(packed: torch.Tensor, n: int, signed: bool = True, order: str = "pairs") -> torch.Tensor:
    """Inverse of ``pack_int4``: ``unpack_int4(pack_int4(q, s, o), q.shape[-1], s, o) == q``.

    Args:
        packed: uint8 (..., ceil(n / 2)) (n / 2 for "halves").
        n: the number of codes per row, >= 1.
        signed, order: as given to ``pack_int4``.

    Returns:
        int8 (..., n): values in [-8, 7] when ``signed``, [0, 15] otherwise.

    Raises:
        ArgumentTypeError: packed not a uint8 tensor. ValueError: a last dimension that does not
        match n, an odd n with "halves".
    """
    n = positive_integer("n", n)
    boolean("signed", signed)
    one_of("order", order, NIBBLE_ORDERS)
    integer_tensor("packed", packed, dtype=torch.uint8)
    if order == "halves" and n % 2:
        raise ValueError(f"order 'halves' needs an even number of codes (a block of n = 2h), got n = {n}")
    width = math.ceil(n / 2)
    if packed.dim() == 0 or packed.shape[-1] != width:
        raise ValueError(f"packed must have a last dimension of ceil(n / 2) = {width} bytes for n = {n}, "
                         f"got shape {tuple(packed.shape)}")
    first = (packed & 0xF).to(torch.int8)
    second = (packed >> 4).to(torch.int8)
    if signed:
        first = first - 16 * (first >= 8).to(torch.int8)
        second = second - 16 * (second >= 8).to(torch.int8)
    if order == "halves":
        return torch.cat([first, second], dim=-1)
    return torch.stack([first, second], dim=-1).reshape(*packed.shape[:-1], 2 * width)[..., :n].contiguous()


def check_int4_zero_points(name: str, zeros: torch.Tensor) -> None:
    """Refuse zero points an unsigned 4-bit code cannot sit on: each must be a whole number in
    0..15 (``docs/quantization.md#asymmetric-min-max``: z = clamp(round(-lo / s), 0, 15)).

    Raises:
        ValueError: naming the first bad zero point and where it is (NaN and infinities included).
    """
    bad = ~((zeros == zeros.round()) & (zeros >= 0) & (zeros <= 15))
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must hold whole numbers in [0, 15] (a 4-bit code's range), got {float(zeros[where])} "
                         f"at {where}")


@dataclass(frozen=True)
class PackedInt4:
    """A 4-bit weight as a kernel stores it: packed codes ("pairs" layout), group scales, zero points.

    Attributes:
        packed: uint8 (out, ceil(in / 2)); signed codes (two's complement) when ``zeros`` is None,
            unsigned codes 0..15 otherwise; columns in stored order.
        scales: (out, in // group_size), torch.float16 or torch.float32 (the storage dtype).
        zeros: None, or the scales' shape and dtype holding integers 0..15.
        group_size: consecutive stored columns sharing one scale; divides ``in_features``.
        in_features: the number of columns.
        perm: None, or int64 (in,) a permutation of 0..in-1: stored column j holds the weight's
            column ``perm[j]`` (GPTQ act-order, Frantar et al., arXiv:2210.17323); groups run
            over stored columns.

    Weight: ``w_hat[:, perm[j]] = (q[:, j] - z[:, j // g]) * s[:, j // g]`` (z = 0 when symmetric),
    computed in float32 exactly as ``formats.QuantizedTensor.dequantize``.

    Raises:
        ArgumentTypeError / ValueError naming the field on a bad shape, dtype or value (a tensor
        on the meta device included).
    """

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int
    in_features: int
    perm: torch.Tensor | None = None

    def __post_init__(self):
        in_features = positive_integer("PackedInt4.in_features", self.in_features)
        g = positive_integer("PackedInt4.group_size", self.group_size)
        if in_features % g:
            raise ValueError(f"PackedInt4.group_size {g} does not divide in_features {in_features}")
        integer_tensor("PackedInt4.packed", self.packed, ranks=(2,), layout="(out, ceil(in / 2))", dtype=torch.uint8)
        out_features = self.packed.shape[0]
        if self.packed.shape[1] != math.ceil(in_features / 2):
            raise ValueError(f"PackedInt4.packed must have ceil({in_features} / 2) = {math.ceil(in_features / 2)} "
                             f"columns, got shape {tuple(self.packed.shape)}")
        shape = (out_features, in_features // g)
        for field in ("scales", "zeros"):
            value = getattr(self, field)
            if field == "zeros" and value is None:
                continue
            instance(f"PackedInt4.{field}", value, torch.Tensor)
            materialized(f"PackedInt4.{field}", value)
            if value.dtype not in (torch.float16, torch.float32) or tuple(value.shape) != shape:
                raise ValueError(f"PackedInt4.{field} must be float16 or float32 of shape {shape}, got dtype "
                                 f"{value.dtype} and shape {tuple(value.shape)}")
        if self.zeros is not None:
            if self.zeros.dtype != self.scales.dtype:
                raise ValueError(f"PackedInt4.zeros must have the scales' dtype {self.scales.dtype}, "
                                 f"got {self.zeros.dtype}")
            check_int4_zero_points("PackedInt4.zeros", self.zeros)
        if self.perm is not None:
            integer_tensor("PackedInt4.perm", self.perm, ranks=(1,), layout="(in,)", dtype=torch.int64)
            if self.perm.numel() != in_features or not torch.equal(
                    torch.sort(self.perm).values, torch.arange(in_features, device=self.perm.device)):
                raise ValueError(f"PackedInt4.perm must be a permutation of 0..{in_features - 1}")

    @property
    def out_features(self) -> int:
        """Rows of the weight."""
        return self.packed.shape[0]

    @property
    def has_permutation(self) -> bool:
        """True when ``perm`` is given and is not the identity."""
        return self.perm is not None and not torch.equal(
            self.perm, torch.arange(self.in_features, device=self.perm.device))

    @property
    def nbytes(self) -> int:
        """Stored bytes: packed codes + scales + zeros (+ 4 B per column, int32 indices, for a
        permutation that is not the identity). Matches ``formats.storage_bytes``."""
        meta = self.scales.numel() * self.scales.element_size()
        if self.zeros is not None:
            meta += self.zeros.numel() * self.zeros.element_size()
        return self.packed.numel() + meta + (4 * self.in_features if self.has_permutation else 0)

    def dequantize(self) -> torch.Tensor:
        """float32 (out, in) in the weight's original column order; equals
        ``formats.fake_quantize`` of the same scheme exactly."""
        codes = unpack_int4(self.packed, self.in_features, signed=self.zeros is None)
        rows, groups = self.scales.shape
        q = codes.to(torch.float32).reshape(rows, groups, self.group_size)
        if self.zeros is not None:
            q = q - self.zeros.to(torch.float32).unsqueeze(-1)
        w = (q * self.scales.to(torch.float32).unsqueeze(-1)).reshape(rows, self.in_features)
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out

    @classmethod
    def from_quantized(cls, qt: QuantizedTensor, perm: torch.Tensor | None = None) -> "PackedInt4":
        """Pack a 4-bit channel or group ``QuantizedTensor``.

        Args:
            qt: codes in stored column order (with ``perm``: the quantisation of ``W[:, perm]``).
            perm: None or int64 (in,), see the class docstring.

        Raises:
            ValueError: a scheme that is not 4-bit, or tensor granularity (one scale for the whole
            tensor: use "channel"). ArgumentTypeError: qt not a QuantizedTensor.
        """
        instance("qt", qt, QuantizedTensor)
        scheme = qt.scheme
        if scheme.bits != 4:
            raise ValueError(f"PackedInt4 holds 4-bit codes, got a {scheme.bits}-bit scheme ({scheme.name})")
        if scheme.granularity == "tensor":
            raise ValueError("PackedInt4 needs channel or group scales, got a per-tensor scheme; "
                             "quantise with granularity='channel' instead")
        in_features = qt.codes.shape[1]
        g = in_features if scheme.granularity == "channel" else scheme.group_size
        dtype = torch.float16 if scheme.scale_dtype == "fp16" else torch.float32
        zeros = None if qt.zeros is None else qt.zeros.to(dtype)
        return cls(pack_int4(qt.codes, signed=scheme.symmetric), qt.scales.to(dtype), zeros, g, in_features, perm)


def pack_weight(w: torch.Tensor, group_size: int, symmetric: bool = True, scale_dtype: str = "fp16") -> PackedInt4:
    """Quantise w (out, in) to int4 with ``QuantScheme(4, "group", group_size, symmetric, scale_dtype)``
    and pack it. Errors as ``formats.quantize`` (a group size that does not divide is refused)."""
    return PackedInt4.from_quantized(quantize(w, QuantScheme(4, "group", group_size, symmetric, scale_dtype)))

