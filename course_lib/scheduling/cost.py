"""The iteration cost model of course "Lab 3: scheduling" (COURSE_SPEC.md, "Lab 3").

One *iteration* of a serving engine runs a set of decoding sequences (each reads its
cached context c and adds one position) and a set of prefill *chunks* (k new positions
written on top of c cached ones). Its time is a roofline bound:

    positions = decodes + sum(k)
    attention = sum(c over decodes) + sum(k*c + k*(k+1)/2 over chunks)
    FLOPs     = 2 * N_matmul * positions + 4 * L * d * attention
    bytes     = weights + KV/token * (sum(c over decodes) + sum(c over chunks))
    time      = max(bytes / bandwidth, FLOPs / compute)

The weights are read once per iteration and shared by every sequence in it, so the two
times are combined with a max, not a sum. Units: bytes, seconds, FLOPs, bytes/s, FLOP/s.

``Device`` carries both the accelerator (memory budget for the KV cache, bandwidth, usable
compute) and the served model (N_matmul, L, d, weight bytes, KV bytes per token); its
defaults are the spec's case model on the 24GB-1.0 device at 50 % MFU. ``PROFILES`` holds
the four priced device profiles of the spec.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Sequence

from ..roofline import CASE_WEIGHT_BYTES, case_model, n_matmul

__all__ = ["Device", "DeviceProfile", "PROFILES", "iteration_time", "cost_per_million_tokens",
           "CASE_N_MATMUL", "CASE_LAYERS", "CASE_D_MODEL", "CASE_KV_BYTES"]

_CASE = case_model()
#: Parameters in matrix multiplies per token of the case model: 8,927,875,072 (spec "Lab 1"/"Lab 3").
CASE_N_MATMUL: int = n_matmul(_CASE)
#: Layers L and width d of the case model (36, 4096).
CASE_LAYERS: int = _CASE.n_layers
CASE_D_MODEL: int = _CASE.d_model
#: KV-cache bytes per token of the case model in bf16: 2 * 36 * 8 * 128 * 2 = 147,456.
CASE_KV_BYTES: int = _CASE.kv_bytes_per_token(2)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"Device.{name} must be a real number, got {type(value).__qualname__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"Device.{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class Device:
    """A device serving one model, as the Lab 3 cost model sees it.

    Attributes (defaults: the spec's case model on 24GB-1.0, COURSE_SPEC "Lab 3"):
        memory: KV-cache budget in bytes (16e9). Admission compares against 0.99 of it;
            growth (preemption) against all of it.
        bandwidth: memory bandwidth in bytes/s (1e12).
        compute: usable compute in FLOP/s (0.5 * 165e12: peak at 50 % MFU).
        kv: KV-cache bytes per token position (147,456 for bf16 K and V).
        n_matmul: parameters taking part in a matrix multiply per token (8,927,875,072).
        n_layers: decoder layers L (36).
        d_model: model width d (4096).
        weights: bytes of weights read once per iteration (5.5e9).

    Raises:
        TypeError: a field that is not a real number (bool refused).
        ValueError: a field that is not positive and finite.
    """

    memory: float = 16e9
    bandwidth: float = 1e12
    compute: float = 0.5 * 165e12
    kv: float = CASE_KV_BYTES
    n_matmul: int = CASE_N_MATMUL
    n_layers: int = CASE_LAYERS
    d_model: int = CASE_D_MODEL
    weights: float = CASE_WEIGHT_BYTES

    def __post_init__(self) -> None:
        for name in ("memory", "bandwidth", "compute", "kv", "n_matmul", "n_layers", "d_model", "weights"):
            _positive(name, getattr(self, name))

    @property
    def kv_tokens(self) -> int:
        """Largest number of cached positions whose bytes (tokens * kv) fit in ``memory``."""
        return _max_tokens(self.memory, self.kv)


@dataclass(frozen=True)
class DeviceProfile:
    """A named, priced device for the capacity and cost part of Lab 3.

    Attributes: name; device (a ``Device``); dollars_per_hour (assumed rental price, $/h).
    """

    name: str
    device: Device
    dollars_per_hour: float


def _profiles() -> dict[str, DeviceProfile]:
    base = Device()
    return {p.name: p for p in (
        DeviceProfile("24GB-bf16", base, 1.00),
        DeviceProfile("24GB-int8", replace(base, kv=73_728), 1.00),
        DeviceProfile("H100-bf16", replace(base, memory=72e9, bandwidth=3.35e12, compute=0.5 * 989e12), 2.50),
        DeviceProfile("L4-bf16", replace(base, bandwidth=0.30e12, compute=0.5 * 121e12), 0.80),
    )}


#: The spec's four device profiles (COURSE_SPEC "Lab 3"): unlisted fields keep the 24GB-bf16 values.
PROFILES: dict[str, DeviceProfile] = _profiles()


def _max_tokens(limit: float, kv) -> int:
    """Largest integer T >= 0 with T * kv <= limit (the exact byte comparison, done once)."""
    tokens = max(0, int(limit // kv))
    while (tokens + 1) * kv <= limit:
        tokens += 1
    while tokens > 0 and tokens * kv > limit:
        tokens -= 1
    return tokens


def _seconds(positions: int, attention: int, context: int, device: Device) -> float:
    """The spec's time from the three integer totals of an iteration (shared by every caller,
    so the simulator and ``iteration_time`` do the same float operations in the same order)."""
    memory_s = (device.weights + device.kv * context) / device.bandwidth
    compute_s = (2 * device.n_matmul * positions + 4 * device.n_layers * device.d_model * attention) / device.compute
    return max(memory_s, compute_s)


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__qualname__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def iteration_time(decodes: Sequence[int], chunks: Sequence[tuple[int, int]], device: Device | None = None) -> float:
    """Time of one serving iteration in seconds (a bound: COURSE_SPEC "Lab 3" cost model).

    Args:
        decodes: cached context c (positions, int >= 0) of each decoding sequence; each
            decode adds one position.
        chunks: (k, c) per prefill chunk: k new positions (int >= 1) on top of c cached
            ones (int >= 0).
        device: a ``Device``; None means ``Device()`` (the spec's case model on 24GB-1.0).

    Returns:
        max(bytes / bandwidth, FLOPs / compute) with positions = len(decodes) + sum k,
        attention = sum c(decodes) + sum(k*c + k*(k+1)/2), FLOPs = 2*N_matmul*positions
        + 4*L*d*attention, bytes = weights + kv * (sum c(decodes) + sum c(chunks)).
        E.g. a 4,000-token prefill alone on the default device: 0.923 s.

    Raises:
        TypeError: decodes/chunks not sequences, a context or chunk size that is not an int,
            a chunk that is not a (k, c) pair, a device that is not a Device.
        ValueError: a negative context, k < 1, or an empty iteration (no decode, no chunk).
    """
    device = Device() if device is None else device
    if not isinstance(device, Device):
        raise TypeError(f"device must be a Device, got {type(device).__qualname__}")
    if isinstance(decodes, (str, bytes)) or not isinstance(decodes, Sequence):
        raise TypeError(f"decodes must be a sequence of ints (cached contexts), got {type(decodes).__qualname__}")
    if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Sequence):
        raise TypeError(f"chunks must be a sequence of (k, c) pairs, got {type(chunks).__qualname__}")
    if len(decodes) == 0 and len(chunks) == 0:
        raise ValueError("an iteration needs at least one decode or one chunk; got decodes=[] and chunks=[]")
    context = 0
    for i, c in enumerate(decodes):
        context += _count(f"decodes[{i}]", c, 0)
    positions = len(decodes)
    attention = context
    for i, pair in enumerate(chunks):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(f"chunks[{i}] must be a (k, c) pair of ints, got {pair!r}")
        k = _count(f"chunks[{i}] new tokens k", pair[0], 1)
        c = _count(f"chunks[{i}] cached tokens c", pair[1], 0)
        positions += k
        attention += k * c + k * (k + 1) // 2
        context += c
    return _seconds(positions, attention, context, device)


def cost_per_million_tokens(tokens_per_s: float, dollars_per_hour: float) -> float:
    """Dollars per million output tokens at a *measured* output rate:
    dollars_per_hour / 3600 / tokens_per_s * 1e6 (COURSE_SPEC "Lab 3", capacity and cost).

    Raises: ValueError if either argument is not a positive finite number."""
    for name, value in (("tokens_per_s", tokens_per_s), ("dollars_per_hour", dollars_per_hour)):
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return dollars_per_hour / 3600 / tokens_per_s * 1e6
