"""Accelerator specs for the roofline bounds of course "Lab 1: roofline".

An accelerator is reduced to three numbers: memory capacity (decimal GB, 1 GB = 1e9
bytes), memory bandwidth (decimal TB/s, 1 TB/s = 1e12 B/s) and dense compute (TFLOP/s,
1e12 FLOP/s, *without* 2:4 structured sparsity). Its ridge point is peak / bandwidth in
FLOP/byte: kernels with a lower arithmetic intensity are bandwidth-bound.

``REFERENCE_DEVICES`` holds the five generic devices of the course spec (exact figures
from COURSE_SPEC.md "Lab 1"); ``DEVICES`` adds the H100 SXM and the H200 with their
vendors' dense BF16 figures.
"""
from __future__ import annotations

from dataclasses import dataclass

from .validation import positive_number

__all__ = ["Accelerator", "REFERENCE_DEVICES", "DEVICES", "get_device"]

_SPEC_SOURCE = "the course's generic reference devices (Lab 1: roofline; dense 16-bit compute)"


@dataclass(frozen=True)
class Accelerator:
    """One accelerator as the roofline sees it.

    Attributes:
        name: short label used as the key in ``DEVICES`` and in tables.
        capacity_gb: memory capacity in decimal GB (1e9 bytes; not GiB).
        bandwidth_tbps: memory bandwidth in decimal TB/s (1e12 bytes/s).
        dense_tflops: dense (no sparsity) 16-bit tensor throughput in TFLOP/s (1e12 FLOP/s).
        source: where the figures come from, with a date.

    Raises:
        ValueError: a size that is not a positive finite number, or an empty name.
    """

    name: str
    capacity_gb: float
    bandwidth_tbps: float
    dense_tflops: float
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Accelerator.name must be a non-empty str, got {self.name!r}")
        for field in ("capacity_gb", "bandwidth_tbps", "dense_tflops"):
            positive_number(f"Accelerator.{field}", getattr(self, field))

    @property
    def capacity_bytes(self) -> float:
        """Memory capacity in bytes (capacity_gb * 1e9)."""
        return self.capacity_gb * 1e9

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s (bandwidth_tbps * 1e12)."""
        return self.bandwidth_tbps * 1e12

    @property
    def peak_flops(self) -> float:
        """Dense peak compute in FLOP/s (dense_tflops * 1e12)."""
        return self.dense_tflops * 1e12

    @property
    def ridge_point(self) -> float:
        """Ridge point I* = peak_flops / bandwidth, in FLOP/byte."""
        return self.peak_flops / self.bandwidth


#: The five generic devices of the course spec: (name, capacity GB, TB/s, dense TFLOP/s).
REFERENCE_DEVICES: dict[str, Accelerator] = {
    d.name: d for d in (
        Accelerator("24GB-1.0", 24, 1.0, 165, _SPEC_SOURCE),
        Accelerator("24GB-0.3", 24, 0.30, 121, _SPEC_SOURCE),
        Accelerator("48GB", 48, 0.864, 362, _SPEC_SOURCE),
        Accelerator("80GB-2.039", 80, 2.039, 312, _SPEC_SOURCE),
        Accelerator("80GB-3.35", 80, 3.35, 989, _SPEC_SOURCE),
    )
}

_NVIDIA_NOTE = ("NVIDIA datasheet value (BF16 Tensor Core 1,979 TFLOP/s is quoted *with* sparsity; "
                "dense = half, 989); figures as recalled from the vendor datasheet and matching "
                "third-party spec pages, not re-fetched from nvidia.com; as of 2026-11")

#: Reference devices plus two named GPUs (vendor dense BF16 figures).
DEVICES: dict[str, Accelerator] = {
    **REFERENCE_DEVICES,
    "H100 SXM": Accelerator("H100 SXM", 80, 3.35, 989,
                            "NVIDIA H100 SXM5: 80 GB HBM3, 3.35 TB/s; " + _NVIDIA_NOTE),
    "H200": Accelerator("H200", 141, 4.8, 989,
                        "NVIDIA H200 SXM: 141 GB HBM3e, 4.8 TB/s; " + _NVIDIA_NOTE),
}


def get_device(device) -> Accelerator:
    """Return ``device`` if it is an ``Accelerator``, else look its name up in ``DEVICES``.

    Raises:
        ValueError: a name that is not in ``DEVICES``, or an object of another type.
    """
    if isinstance(device, Accelerator):
        return device
    if isinstance(device, str):
        if device in DEVICES:
            return DEVICES[device]
        raise ValueError(f"device {device!r} is unknown; known: {', '.join(DEVICES)}")
    raise ValueError(f"device must be an Accelerator or a name in DEVICES, got {type(device).__qualname__}")
