"""Floating-point number formats from their bit layout: fp32, bf16, fp16, fp8 E4M3 and E5M2.

A binary floating-point format stores a sign bit, ``e`` exponent bits and ``m`` mantissa
(fraction) bits. A normal number is ``(-1)^sign * 1.f * 2^(E - bias)`` with ``bias = 2^(e-1) - 1``
and the stored exponent ``E`` in ``1 .. E_max``; ``E = 0`` holds zero and the subnormals
``0.f * 2^(1 - bias)``. From that layout alone:

- machine epsilon (the gap between 1 and the next larger number) is ``2^-m``;
- the smallest normal number is ``2^(1 - bias)``;
- the largest finite number depends on what the all-ones exponent means:

  - IEEE 754 (fp32, fp16, bf16, and OCP's E5M2): ``E = 2^e - 1`` is reserved for inf and NaN, so
    ``E_max = 2^e - 2`` and the largest finite value is ``(2 - 2^-m) * 2^(E_max - bias)``;
  - "finite only" (OCP's E4M3, ``torch.float8_e4m3fn``): there is no inf; the all-ones exponent
    holds ordinary numbers except the all-ones mantissa, the single NaN pattern, so the largest
    finite value is ``(2 - 2^(1-m)) * 2^(2^e - 1 - bias)`` = 1.75 * 2^8 = 448.

Sources: IEEE 754-2019 (binary32, binary16); the bfloat16 layout (Google's TPU documentation:
fp32's 8 exponent bits, 7 mantissa bits); P. Micikevicius et al., "FP8 Formats for Deep
Learning", arXiv:2209.05433, 2022, and the Open Compute Project's "OCP 8-bit Floating Point
Specification (OFP8)", 2023 (E4M3 largest 448, E5M2 largest 57,344). ``torch.finfo`` knows every
one of these dtypes; ``tests/test_quant_floats.py`` checks the layout arithmetic against it.
Lab 4's number-format table: ``docs/quantization.md#number-formats``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validation import ArgumentTypeError, boolean, instance, integer

__all__ = ["FloatFormat", "FLOAT_FORMATS", "float_format"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format, described by its bit layout (formulas in the module docstring).

    Attributes:
        name: short label ("fp32", "bf16", "fp16", "fp8 E4M3", "fp8 E5M2").
        exponent_bits: e, an int in 2..11.
        mantissa_bits: m (stored fraction bits, the implicit leading 1 not counted), an int in 1..52.
        finite_only: True for a format without inf whose only NaN is the all-ones pattern (E4M3);
            False for the IEEE 754 convention (all-ones exponent = inf and NaN).
        use: what the format stores or computes in inference, one line.
        torch_dtype: the matching torch dtype (for ``torch.finfo``), or None.

    Raises:
        ArgumentTypeError / ValueError naming the field for a bad bit count or flag.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    finite_only: bool = False
    use: str = ""
    torch_dtype: torch.dtype | None = None

    def __post_init__(self):
        instance("FloatFormat.name", self.name, str)
        integer("FloatFormat.exponent_bits", self.exponent_bits, minimum=2, maximum=11)
        integer("FloatFormat.mantissa_bits", self.mantissa_bits, minimum=1, maximum=52)
        boolean("FloatFormat.finite_only", self.finite_only)
        if self.torch_dtype is not None and not isinstance(self.torch_dtype, torch.dtype):
            raise ArgumentTypeError(f"FloatFormat.torch_dtype must be a torch.dtype or None, "
                                    f"got {type(self.torch_dtype).__qualname__}")

    @property
    def bits(self) -> int:
        """Total width: 1 sign bit + exponent bits + mantissa bits."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """Exponent bias, ``2^(e-1) - 1`` (127 for fp32 and bf16, 15 for fp16 and E5M2, 7 for E4M3)."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def eps(self) -> float:
        """Machine epsilon, ``2^-m``: the gap between 1.0 and the next representable number."""
        return 2.0 ** -self.mantissa_bits

    @property
    def smallest_normal(self) -> float:
        """The smallest positive normal number, ``2^(1 - bias)``."""
        return 2.0 ** (1 - self.bias)

    @property
    def max_finite(self) -> float:
        """The largest finite number: ``(2 - 2^-m) 2^(2^e - 2 - bias)`` (IEEE), or
        ``(2 - 2^(1-m)) 2^(2^e - 1 - bias)`` for a finite-only format (its all-ones pattern is NaN)."""
        e, m = self.exponent_bits, self.mantissa_bits
        if self.finite_only:
            return (2.0 - 2.0 ** (1 - m)) * 2.0 ** (2 ** e - 1 - self.bias)
        return (2.0 - 2.0 ** -m) * 2.0 ** (2 ** e - 2 - self.bias)


#: The formats of Lab 4's table, widest first.
FLOAT_FORMATS: tuple[FloatFormat, ...] = (
    FloatFormat("fp32", 8, 23, use="master weights and training; the lab's reference arithmetic and accumulators",
                torch_dtype=torch.float32),
    FloatFormat("bf16", 8, 7, use="weights and activations of most released models; fp32's range, 3 significant digits",
                torch_dtype=torch.bfloat16),
    FloatFormat("fp16", 5, 10, use="weights, activations, KV caches; quantisation scales (as in GGUF and this lab)",
                torch_dtype=torch.float16),
    FloatFormat("fp8 E4M3", 4, 3, finite_only=True,
                use="fp8 weights and activations (with a per-tensor or per-block scale); fp8 KV caches",
                torch_dtype=getattr(torch, "float8_e4m3fn", None)),
    FloatFormat("fp8 E5M2", 5, 2, use="gradients in fp8 training (range before precision)",
                torch_dtype=getattr(torch, "float8_e5m2", None)),
)


def float_format(name: str) -> FloatFormat:
    """The entry of ``FLOAT_FORMATS`` called ``name`` (e.g. "fp8 E4M3").

    Raises: ArgumentTypeError for a non-str; ValueError for an unknown name (the message lists them)."""
    instance("name", name, str)
    for fmt in FLOAT_FORMATS:
        if fmt.name == name:
            return fmt
    raise ValueError(f"name {name!r} is not a format of FLOAT_FORMATS; known: {[f.name for f in FLOAT_FORMATS]}")
