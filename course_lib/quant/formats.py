"""Integer weight quantisation: schemes, quantise/dequantise, and what each format stores.

A weight is a 2-D float tensor ``(out_features, in_features)`` like ``nn.Linear.weight``. A
``QuantScheme`` says how it is cut into groups that share one scale: one group for the whole
tensor (``"tensor"``), one per output row (``"channel"``), or runs of ``group_size`` consecutive
input columns within a row (``"group"``). Groups always run along the input (last) dimension,
the dimension a matrix-vector product reduces over.

Two grids (all arithmetic in float32, rounding with ``torch.round``, i.e. half to even):

- symmetric absmax: ``s = absmax / qmax`` with ``qmax = 2**(bits-1) - 1``, codes
  ``q = clamp(round(w / s), -qmax, qmax)`` (int8), ``w_hat = q * s``. The grid is symmetric about 0
  and never uses the code ``-2**(bits-1)``; 0 is exact.
- asymmetric min-max with an integer zero point (Jacob et al. 2018, "Quantization and Training of
  Neural Networks for Efficient Integer-Arithmetic-Only Inference", arXiv:1712.05877, section 2.1:
  ``r = S (q - Z)``): the range is widened to contain 0, ``lo = min(min w, 0)``,
  ``hi = max(max w, 0)``, ``L = 2**bits - 1``, ``s = hi/L - lo/L`` (two divisions, so ``hi - lo``
  never overflows near the float32 limits), ``z = clamp(round(-lo / s), 0, L)``,
  ``q = clamp(round(w / s) + z, 0, L)`` (uint8), ``w_hat = (q - z) * s``. 0 is exact.

A group of zeros gets ``s = 1`` (and ``z = 0``): codes 0, ``w_hat`` exactly 0, no 0/0.

The scale that is used is the float32 scale rounded to the storage dtype (``scale_dtype``), so
fake quantisation (``fake_quantize``) computes exactly what a kernel reading the stored format
computes. Error bound, wherever a code is not clipped: ``|w - w_hat| <= s/2`` (plus float32
rounding of the product). Symmetric codes are never clipped while the stored scale is a normal
number (its relative rounding error, at most 2**-11 for fp16, keeps ``absmax/s`` below
``qmax + 1/2``); asymmetric codes can be clipped by one step at the top of the range when both
``hi/s`` and ``-lo/s`` round up.

Float32 edge cases (``scale_dtype="fp32"``): a non-zero group whose scale underflows to 0
(weights of a few subnormal ulps) gets the smallest float32, 2**-149; a subnormal scale carries
an absolute rounding error up to 2**-150, so a code can clip and the error bound becomes
``s/2 + L * 2**-149`` (L = qmax or 2**bits - 1). A code whose value ``(q - z) * s`` would
overflow float32 (a group reaching within s/2 of +-3.4e38) is moved one step towards the zero
point, so ``w_hat`` stays finite with an error below s. With fp16 storage a scale that overflows
or underflows float16 is refused (``quantize`` raises and names ``scale_dtype="fp32"``).

Storage accounting (``storage_bytes``, ``FORMATS``) counts payload bits plus metadata per weight;
the course's tables in docs and Lab 4 are computed from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..validation import ArgumentTypeError, boolean, instance, integer, materialized, one_of, positive_integer

__all__ = [
    "SCALE_BYTES", "SCALE_TORCH_DTYPES", "GRANULARITIES", "qmax", "QuantScheme", "QuantizedTensor",
    "quantize", "dequantize", "fake_quantize", "StorageBytes", "storage_bytes", "bits_per_weight",
    "StorageFormat", "FORMATS",
]

#: Bytes per stored scale (and per stored zero point) for each ``scale_dtype``.
SCALE_BYTES: dict[str, int] = {"fp16": 2, "fp32": 4}
#: The torch dtype of each ``scale_dtype``.
SCALE_TORCH_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "fp32": torch.float32}
#: The allowed ``QuantScheme.granularity`` values.
GRANULARITIES: tuple[str, ...] = ("tensor", "channel", "group")


def qmax(bits: int) -> int:
    """The largest symmetric code, ``2**(bits-1) - 1`` (7 for int4, 127 for int8).

    Raises:
        ArgumentTypeError: bits not an int. ValueError: bits outside 2..8.
    """
    bits = integer("bits", bits, minimum=2, maximum=8)
    return 2 ** (bits - 1) - 1


@dataclass(frozen=True)
class QuantScheme:
    """How a weight is quantised.

    Attributes:
        bits: code width, an int in 2..8.
        granularity: ``"tensor"`` (one scale), ``"channel"`` (one per output row) or ``"group"``
            (one per ``group_size`` consecutive input columns of a row).
        group_size: required (an int >= 1) when granularity is ``"group"``, None otherwise.
        symmetric: True for absmax codes in [-qmax, qmax], False for min-max codes in [0, 2**bits - 1]
            with an integer zero point (Jacob et al. 2018).
        scale_dtype: ``"fp16"`` or ``"fp32"``, the storage dtype of scales and zero points.

    Raises:
        ArgumentTypeError / ValueError naming the field (``QuantScheme.bits`` ...).
    """

    bits: int = 4
    granularity: str = "group"
    group_size: int | None = 64
    symmetric: bool = True
    scale_dtype: str = "fp16"

    def __post_init__(self):
        object.__setattr__(self, "bits", integer("QuantScheme.bits", self.bits, minimum=2, maximum=8))
        if not isinstance(self.granularity, str):
            raise ArgumentTypeError(f"QuantScheme.granularity must be a str, one of {list(GRANULARITIES)}, "
                                    f"got {self.granularity!r} of type {type(self.granularity).__qualname__}")
        one_of("QuantScheme.granularity", self.granularity, GRANULARITIES)
        if self.granularity == "group":
            if self.group_size is None:
                raise ValueError("QuantScheme.group_size must be an int >= 1 when granularity is 'group', got None")
            object.__setattr__(self, "group_size", positive_integer("QuantScheme.group_size", self.group_size))
        elif self.group_size is not None:
            raise ValueError(f"QuantScheme.group_size must be None when granularity is {self.granularity!r} "
                             f"(only 'group' has a group size), got {self.group_size!r}")
        boolean("QuantScheme.symmetric", self.symmetric)
        if not isinstance(self.scale_dtype, str):
            raise ArgumentTypeError(f"QuantScheme.scale_dtype must be 'fp16' or 'fp32', got {self.scale_dtype!r} "
                                    f"of type {type(self.scale_dtype).__qualname__}")
        one_of("QuantScheme.scale_dtype", self.scale_dtype, SCALE_BYTES)

    @property
    def name(self) -> str:
        """Short label: "int4 g64", "int4 g64 +zero", "int8 channel", "int4 tensor", "... fp32"."""
        where = f"g{self.group_size}" if self.granularity == "group" else self.granularity
        return (f"int{self.bits} {where}" + ("" if self.symmetric else " +zero")
                + (" fp32" if self.scale_dtype == "fp32" else ""))

    @property
    def levels(self) -> int:
        """Number of codes used: ``2*qmax + 1`` symmetric, ``2**bits`` asymmetric."""
        return 2 * qmax(self.bits) + 1 if self.symmetric else 2 ** self.bits

    def n_groups(self, in_features: int) -> int:
        """Scales per row for a weight with ``in_features`` columns: ``in_features // group_size``
        for "group", 1 for "channel" (one per row) and for "tensor" (one for the whole tensor).

        Raises:
            ValueError: in_features < 1, or a group size that does not divide in_features
                (refused, never padded: the message names both numbers).
        """
        in_features = positive_integer("in_features", in_features)
        if self.granularity != "group":
            return 1
        if in_features % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide in_features {in_features} "
                             f"({in_features} = {in_features // self.group_size} * {self.group_size} + "
                             f"{in_features % self.group_size}); pick a group size that divides it")
        return in_features // self.group_size

    def scale_shape(self, shape: Sequence[int]) -> tuple[int, int]:
        """Shape of the scales (and zero points) of a weight of ``shape`` (out, in): (1, 1) for
        tensor, (out, 1) for channel, (out, in // group_size) for group.

        Raises: ValueError as ``n_groups``, or a shape that is not two ints >= 1."""
        out_features, in_features = _shape2("shape", shape)
        groups = self.n_groups(in_features)
        return (1, 1) if self.granularity == "tensor" else (out_features, groups)


def _shape2(name: str, shape) -> tuple[int, int]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) != 2:
        raise ValueError(f"{name} must be a 2-D shape (out_features, in_features), got {shape!r}")
    return positive_integer(f"{name}[0]", shape[0]), positive_integer(f"{name}[1]", shape[1])


def _check_weight(w) -> torch.Tensor:
    """A 2-D floating tensor with finite values, as float32 (the range check runs after the cast,
    so a float64 value beyond the float32 range is reported too)."""
    instance("w", w, torch.Tensor)
    materialized("w", w)
    if not w.dtype.is_floating_point:
        raise ArgumentTypeError(f"w must be a floating-point tensor of shape (out_features, in_features), "
                                f"got dtype {w.dtype}")
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"w must be a non-empty 2-D tensor (out_features, in_features), got shape {tuple(w.shape)}")
    w32 = w.detach().to(torch.float32)
    finite = torch.isfinite(w32)
    if not bool(finite.all()):
        index = tuple(int(i) for i in torch.nonzero(~finite)[0])
        raise ValueError(f"w must hold finite float32 values; w[{index[0]}, {index[1]}] = {w[index].item()!r}"
                         + ("" if w.dtype == torch.float32 or not math.isfinite(w[index].item())
                            else " (beyond the float32 range)"))
    return w32


def _grouped(w: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """View of w as (rows of scales, scales per row, weights per scale)."""
    out_features, in_features = w.shape
    groups = scheme.n_groups(in_features)
    if scheme.granularity == "tensor":
        return w.reshape(1, 1, -1)
    return w.reshape(out_features, groups, in_features // groups)


#: The smallest positive float32 (subnormal, 2**-149): the least scale a non-zero group gets.
_FP32_SMALLEST = 2.0 ** -149


def _stored_scale(s: torch.Tensor, nonzero: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """The float32 scales rounded to the storage dtype; refuses fp16 scales it cannot hold. An fp32
    scale of a non-zero group that underflows to 0 (subnormal weights) becomes 2**-149."""
    if scheme.scale_dtype == "fp32":
        return torch.where(nonzero, s.clamp(min=_FP32_SMALLEST), s)
    stored = s.to(torch.float16).to(torch.float32)
    bad = nonzero & (~torch.isfinite(stored) | (stored == 0))
    if bool(bad.any()):
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(
            f"the scale {s[index].item():.6g} of group {index} (row, group) does not fit in float16 "
            f"(largest 65504, smallest subnormal 6e-08): it rounds to {stored[index].item()}; "
            f"use scale_dtype='fp32' for weights of this magnitude")
    return stored


@dataclass(frozen=True)
class QuantizedTensor:
    """Codes, scales and zero points of a quantised weight (``quantize`` builds it).

    Attributes:
        codes: int8 (symmetric, values in [-qmax, qmax]) or uint8 (asymmetric, values in
            [0, 2**bits - 1]), shape (out, in).
        scales: float32 holding values of the storage dtype; shape (1, 1) for tensor, (out, 1) for
            channel, (out, in // group_size) for group.
        zeros: None (symmetric) or float32 of the scales' shape holding integers in [0, 2**bits - 1].
        scheme: the ``QuantScheme``.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    scheme: QuantScheme

    def __post_init__(self):
        instance("QuantizedTensor.scheme", self.scheme, QuantScheme)
        want = torch.int8 if self.scheme.symmetric else torch.uint8
        instance("QuantizedTensor.codes", self.codes, torch.Tensor)
        if self.codes.dtype != want or self.codes.dim() != 2:
            raise ValueError(f"QuantizedTensor.codes must be a 2-D {want} tensor for {self.scheme.name}, got "
                             f"dtype {self.codes.dtype} and shape {tuple(self.codes.shape)}")
        shape = self.scheme.scale_shape(tuple(self.codes.shape))
        for field, value in (("scales", self.scales), ("zeros", self.zeros)):
            if field == "zeros" and self.scheme.symmetric:
                if value is not None:
                    raise ValueError("QuantizedTensor.zeros must be None for a symmetric scheme")
                continue
            instance(f"QuantizedTensor.{field}", value, torch.Tensor)
            if value.dtype != torch.float32 or tuple(value.shape) != shape:
                raise ValueError(f"QuantizedTensor.{field} must be float32 of shape {shape}, got dtype "
                                 f"{value.dtype} and shape {tuple(value.shape)}")

    def dequantize(self) -> torch.Tensor:
        """``w_hat``: float32 (out, in); ``q * s`` (symmetric) or ``(q - z) * s`` (asymmetric)."""
        rows, groups = self.scales.shape
        q = self.codes.to(torch.float32).reshape(rows, groups, -1)
        z = None if self.zeros is None else self.zeros.unsqueeze(-1)
        return grid_values(q, self.scales.unsqueeze(-1), z).reshape(self.codes.shape)


def grid_codes(x: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None, bits: int) -> torch.Tensor:
    """Float codes of x on the grid of scale s and zero point z (broadcast against x): symmetric
    (z None) clamp(round(x / s), -qmax, qmax), asymmetric clamp(round(x / s) + z, 0, 2^bits - 1)
    (module docstring). The one rounding rule of ``quantize`` and of GPTQ's column-by-column pass."""
    if z is None:
        top = qmax(bits)
        return torch.clamp(torch.round(x / s), -top, top)
    return torch.clamp(torch.round(x / s) + z, 0, 2 ** bits - 1)


def grid_values(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
    """w_hat of codes q: q * s (symmetric, z None) or (q - z) * s, broadcast."""
    return q * s if z is None else (q - z) * s


def _finite_codes(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Codes (float32, grouped) moved one step towards the zero point where ``(q - z) * s``
    overflows float32. Only a group whose range reaches within s/2 of the float32 limit has such
    a code (``|q - z| <= |w|/s + 1/2``), and one step always makes it finite (``(|q - z| - 1) s
    <= |w| - s/2``), so the weight's error stays below one step s."""
    offset = q - z.unsqueeze(-1)
    overflow = ~torch.isfinite(offset * s.unsqueeze(-1))
    if bool(overflow.any()):
        q = torch.where(overflow, q - torch.sign(offset), q)
    return q


def quantize(w: torch.Tensor, scheme: QuantScheme) -> QuantizedTensor:
    """Quantise a weight with ``scheme`` (formulas in the module docstring).

    Args:
        w: floating tensor (out_features, in_features), any float dtype (computed in float32).
        scheme: a ``QuantScheme``.

    Returns:
        ``QuantizedTensor`` (codes, scales rounded to the storage dtype and held as float32, zeros).

    Raises:
        ArgumentTypeError: w not a floating tensor, scheme not a QuantScheme.
        ValueError: w not 2-D or empty, on the meta device, a non-finite value (its index is
            named), a group size that does not divide in_features, or (fp16 storage) a scale that overflows to inf or
            underflows to 0 in float16 while its group is not all zero (use scale_dtype="fp32").
    """
    instance("scheme", scheme, QuantScheme)
    w32 = _check_weight(w)
    g = _grouped(w32, scheme)
    if scheme.symmetric:
        top = qmax(scheme.bits)
        absmax = g.abs().amax(dim=-1)
        nonzero = absmax > 0
        s = torch.where(nonzero, absmax / top, torch.ones_like(absmax))
        s = _stored_scale(s, nonzero, scheme)
        q = grid_codes(g, s.unsqueeze(-1), None, scheme.bits)
        codes = _finite_codes(q, torch.zeros_like(s), s).to(torch.int8)
        zeros = None
    else:
        levels = 2 ** scheme.bits - 1
        lo = torch.clamp(g.amin(dim=-1), max=0.0)
        hi = torch.clamp(g.amax(dim=-1), min=0.0)
        nonzero = hi > lo
        s = torch.where(nonzero, hi / levels - lo / levels, torch.ones_like(hi))
        s = _stored_scale(s, nonzero, scheme)
        z = torch.clamp(torch.round(-lo / s), 0, levels)
        q = grid_codes(g, s.unsqueeze(-1), z.unsqueeze(-1), scheme.bits)
        codes = _finite_codes(q, z, s).to(torch.uint8)
        zeros = z
    return QuantizedTensor(codes.reshape(w32.shape), s, zeros, scheme)


def dequantize(qt: QuantizedTensor) -> torch.Tensor:
    """``qt.dequantize()``: float32 (out, in). Raises ArgumentTypeError if qt is not a QuantizedTensor."""
    return instance("qt", qt, QuantizedTensor).dequantize()


def fake_quantize(w: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """``dequantize(quantize(w, scheme))``: float32, w's shape; the weight a quantised model
    computes with. Errors as ``quantize``."""
    return quantize(w, scheme).dequantize()


# -- storage -------------------------------------------------------------------------------
@dataclass(frozen=True)
class StorageBytes:
    """Bytes a quantised weight occupies, by part.

    Attributes:
        payload: the packed codes, bytes.
        scales: the scales, bytes.
        zeros: the zero points, bytes (0 when symmetric).
        permutation: the column permutation (int32 indices), bytes (0 when none).
        numel: the number of weights.
    """

    payload: int
    scales: int
    zeros: int
    permutation: int
    numel: int

    @property
    def total(self) -> int:
        """All parts, bytes."""
        return self.payload + self.scales + self.zeros + self.permutation

    @property
    def bits_per_weight(self) -> float:
        """``8 * total / numel``."""
        return 8 * self.total / self.numel


def storage_bytes(shape: Sequence[int], scheme: QuantScheme, permutation: bool = False) -> StorageBytes:
    """What a weight of ``shape`` (out, in) quantised with ``scheme`` stores.

    payload = out * ceil(in * bits / 8) (each row packed on its own, so a row starts on a byte);
    scales = number of scales * SCALE_BYTES[scale_dtype]; zeros = the same count and width when
    asymmetric (an fp16 zero point, as GGUF Q4_1 stores its fp16 minimum), else 0;
    permutation = in * 4 (int32 column indices, GPTQ act-order) when ``permutation``.

    Examples: int4 with fp16 scales is 4 + 16/g bits per weight: 4.125 / 4.25 / 4.5 at
    g = 128 / 64 / 32, and 4.25 at g = 128 with an fp16 zero point.

    Raises:
        ValueError: shape not two ints >= 1, a group size that does not divide in.
        ArgumentTypeError: scheme not a QuantScheme, permutation not a bool.
    """
    instance("scheme", scheme, QuantScheme)
    boolean("permutation", permutation)
    out_features, in_features = _shape2("shape", shape)
    rows, groups = scheme.scale_shape((out_features, in_features))
    n_scales = rows * groups
    width = SCALE_BYTES[scheme.scale_dtype]
    return StorageBytes(
        payload=out_features * math.ceil(in_features * scheme.bits / 8),
        scales=n_scales * width,
        zeros=0 if scheme.symmetric else n_scales * width,
        permutation=4 * in_features if permutation else 0,
        numel=out_features * in_features,
    )


def bits_per_weight(shape: Sequence[int], scheme: QuantScheme) -> float:
    """``storage_bytes(shape, scheme).bits_per_weight``. Errors as ``storage_bytes``."""
    return storage_bytes(shape, scheme).bits_per_weight


@dataclass(frozen=True)
class StorageFormat:
    """A block format as a table row: ``bits`` per element plus ``metadata_bits_per_block``
    shared by every ``block`` consecutive elements.

    Attributes:
        name: the label in tables ("GGUF Q4_0").
        bits: payload bits per weight.
        block: weights sharing one set of metadata (1 for plain floats).
        metadata_bits_per_block: scale (and zero/minimum) bits per block.
        source: where the layout is specified.
    """

    name: str
    bits: int
    block: int
    metadata_bits_per_block: int
    source: str

    def __post_init__(self):
        positive_integer("StorageFormat.bits", self.bits)
        positive_integer("StorageFormat.block", self.block)
        integer("StorageFormat.metadata_bits_per_block", self.metadata_bits_per_block, minimum=0)

    @property
    def bits_per_weight(self) -> float:
        """``bits + metadata_bits_per_block / block``."""
        return self.bits + self.metadata_bits_per_block / self.block


_GGML = "llama.cpp ggml-quants.c / gguf-py quants.py"
#: Storage formats compared in Lab 4 (bits per weight = bits + metadata / block).
FORMATS: tuple[StorageFormat, ...] = (
    StorageFormat("fp32", 32, 1, 0, "IEEE 754 binary32"),
    StorageFormat("bf16", 16, 1, 0, "bfloat16 (8-bit exponent, 7-bit mantissa)"),
    StorageFormat("fp16", 16, 1, 0, "IEEE 754 binary16"),
    StorageFormat("int8 g128 fp16", 8, 128, 16, "this module: symmetric int8, one fp16 scale per 128"),
    StorageFormat("int4 g128 fp16", 4, 128, 16, "this module: symmetric int4, one fp16 scale per 128"),
    StorageFormat("int4 g64 fp16", 4, 64, 16, "this module: symmetric int4, one fp16 scale per 64"),
    StorageFormat("int4 g32 fp16", 4, 32, 16, "this module: symmetric int4, one fp16 scale per 32"),
    StorageFormat("int4 g128 fp16 +zero", 4, 128, 32,
                  "this module: asymmetric int4, fp16 scale and fp16 zero point per 128"),
    StorageFormat("MXFP4", 4, 32, 8,
                  "OCP Microscaling Formats (MX) v1.0: 32 FP4 E2M1 elements sharing one 8-bit E8M0 scale"),
    StorageFormat("GGUF Q4_0", 4, 32, 16, f"{_GGML}: block_q4_0, fp16 d + 16 bytes of nibbles"),
    StorageFormat("GGUF Q4_1", 4, 32, 32, f"{_GGML}: block_q4_1, fp16 d and fp16 m + 16 bytes of nibbles"),
    StorageFormat("GGUF Q8_0", 8, 32, 16, f"{_GGML}: block_q8_0, fp16 d + 32 int8"),
)
