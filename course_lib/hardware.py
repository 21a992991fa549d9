"""Accelerators as the roofline sees them (``docs/roofline.md#devices``).

A ``Device`` is three numbers in SI units: memory capacity in bytes, memory bandwidth in
bytes/s and dense compute in FLOP/s (*without* 2:4 structured sparsity). Its ridge point
``peak_flops / bandwidth`` (FLOP/byte) divides kernels into bandwidth-bound (lower arithmetic
intensity) and compute-bound (higher). Datasheets quote decimal GB (1e9 bytes, not GiB), TB/s
(1e12 B/s) and TFLOP/s (1e12 FLOP/s); ``Device.from_datasheet`` converts them once, where the
figures enter, so every formula after it reads bare.

Lab 1 (``roofline``) bounds a model on a ``Device``; Lab 3 (``scheduling.cost.Deployment``)
serves a model on one. ``REFERENCE_DEVICES`` holds the course's five generic devices
(``docs/roofline.md#devices``); ``DEVICES`` adds the H100 SXM and the H200 with their vendors'
dense BF16 figures. ``Device.from_datasheet`` reads the datasheet's footnotes too (a peak quoted
with sparsity, a capacity in GiB); ``H100_SXM_PEAKS`` holds one datasheet's peaks per precision.
"""
from __future__ import annotations

from dataclasses import dataclass

from .validation import positive_number

__all__ = ["Device", "CAPACITY_UNITS", "REFERENCE_DEVICES", "DEVICES", "H100_SXM_PEAKS", "get_device"]

#: Bytes in one unit of a capacity figure: decimal GB (what datasheets of accelerators print) and
#: binary GiB (what memory is built in and ``nvidia-smi`` or ``free -g`` report).
CAPACITY_UNITS: dict[str, int] = {"GB": 10 ** 9, "GiB": 2 ** 30}

_REFERENCE_SOURCE = "the course's generic reference devices (docs/roofline.md#devices; dense 16-bit compute)"


@dataclass(frozen=True)
class Device:
    """One accelerator: what the roofline bounds need of it, in SI units.

    Attributes:
        name: short label used as the key in ``DEVICES`` and in tables.
        memory: memory capacity in bytes (24 GB -> 24e9: decimal, not GiB).
        bandwidth: memory bandwidth in bytes/s (1 TB/s -> 1e12).
        peak_flops: dense (no sparsity) 16-bit tensor throughput in FLOP/s (165 TFLOP/s -> 165e12).
        source: where the figures come from, with a date.

    Raises:
        ValueError: an empty name, or a figure that is not a positive finite number (a
            ``TypeError`` subclass as well when it is not a number at all).
    """

    name: str
    memory: float
    bandwidth: float
    peak_flops: float
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Device.name must be a non-empty str, got {self.name!r}")
        for field in ("memory", "bandwidth", "peak_flops"):
            positive_number(f"Device.{field}", getattr(self, field))

    @classmethod
    def from_datasheet(cls, name: str, capacity_gb: float, bandwidth_tbps: float, dense_tflops: float,
                       source: str = "", *, sparse: bool = False, capacity_unit: str = "GB") -> "Device":
        """A device from datasheet units: capacity in decimal GB (x 1e9 bytes), bandwidth in TB/s
        (x 1e12 B/s), dense compute in TFLOP/s (x 1e12 FLOP/s) (``docs/roofline.md#reading-a-datasheet``).

        Two readings a datasheet leaves to its footnotes, keyword-only:
            sparse: True when the quoted TFLOP/s assume 2:4 structured sparsity (NVIDIA marks them
                "with sparsity"); the dense peak a bound uses is then half the figure.
            capacity_unit: "GB" (1e9 bytes, the default) or "GiB" (2**30 bytes: 24 GiB = 25.77e9 bytes),
                for a capacity that is really a power of two.

        Raises: ValueError (naming the argument) for a figure that is not a positive finite number,
        a ``sparse`` that is not a bool, or an unknown ``capacity_unit``."""
        for argument, value in (("capacity_gb", capacity_gb), ("bandwidth_tbps", bandwidth_tbps),
                                ("dense_tflops", dense_tflops)):
            positive_number(argument, value)
        if not isinstance(sparse, bool):
            raise ValueError(f"sparse must be True or False, got {sparse!r}")
        if capacity_unit not in CAPACITY_UNITS:
            raise ValueError(f"capacity_unit must be one of {', '.join(CAPACITY_UNITS)}, got {capacity_unit!r}")
        return cls(name, capacity_gb * CAPACITY_UNITS[capacity_unit], bandwidth_tbps * 1e12,
                   dense_tflops * 1e12 / (2 if sparse else 1), source)

    @property
    def ridge_point(self) -> float:
        """Ridge point I* = peak_flops / bandwidth, in FLOP/byte (``docs/roofline.md#ridge-point``)."""
        return self.peak_flops / self.bandwidth


#: The course's five generic devices (capacity GB, TB/s, dense TFLOP/s), docs/roofline.md#devices.
REFERENCE_DEVICES: dict[str, Device] = {
    d.name: d for d in (
        Device.from_datasheet("24GB-1.0", 24, 1.0, 165, _REFERENCE_SOURCE),
        Device.from_datasheet("24GB-0.3", 24, 0.30, 121, _REFERENCE_SOURCE),
        Device.from_datasheet("48GB", 48, 0.864, 362, _REFERENCE_SOURCE),
        Device.from_datasheet("80GB-2.039", 80, 2.039, 312, _REFERENCE_SOURCE),
        Device.from_datasheet("80GB-3.35", 80, 3.35, 989, _REFERENCE_SOURCE),
    )
}

_NVIDIA_NOTE = ("NVIDIA datasheet value (BF16 Tensor Core 1,979 TFLOP/s is quoted *with* sparsity; "
                "dense = half, 989); figures as recalled from the vendor datasheet and matching "
                "third-party spec pages, not re-fetched from nvidia.com; as of 2026-11")

#: Reference devices plus two named GPUs (vendor dense BF16 figures).
DEVICES: dict[str, Device] = {
    **REFERENCE_DEVICES,
    "H100 SXM": Device.from_datasheet("H100 SXM", 80, 3.35, 989,
                                      "NVIDIA H100 SXM5: 80 GB HBM3, 3.35 TB/s; " + _NVIDIA_NOTE),
    "H200": Device.from_datasheet("H200", 141, 4.8, 989, "NVIDIA H200 SXM: 141 GB HBM3e, 4.8 TB/s; " + _NVIDIA_NOTE),
}


#: The H100 SXM's tensor throughput as its datasheet prints it, per precision: (precision, TFLOP/s as
#: quoted, quoted with 2:4 structured sparsity?). FP32 runs without tensor cores; every tensor-core
#: figure is quoted with sparsity, so its dense peak is half. Read with
#: ``Device.from_datasheet(..., sparse=...)``; the bound's peak is that of the precision the
#: kernels compute in (docs/roofline.md#reading-a-datasheet).
H100_SXM_PEAKS: tuple[tuple[str, float, bool], ...] = (
    ("FP32", 67, False),
    ("TF32 tensor core", 989, True),
    ("BF16 tensor core", 1979, True),
    ("FP8 tensor core", 3958, True),
)


def get_device(device) -> Device:
    """Return ``device`` if it is a ``Device``, else look its name up in ``DEVICES``.

    Raises:
        ValueError: a name that is not in ``DEVICES``, or an object of another type.
    """
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        if device in DEVICES:
            return DEVICES[device]
        raise ValueError(f"device {device!r} is unknown; known: {', '.join(DEVICES)}")
    raise ValueError(f"device must be a Device or a name in DEVICES, got {type(device).__qualname__}")
