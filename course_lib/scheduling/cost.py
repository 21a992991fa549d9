"""The iteration cost model of Lab 3: scheduling (``docs/scheduling.md``).

One *iteration* of a serving engine runs a set of decoding sequences (each reads its
cached context c and adds one position) and a set of *chunks* (k new positions written on
top of c cached ones). Its time is a roofline bound:

    positions = decodes + sum(k)
    attention = sum(c over decodes) + sum(k*c + k*(k+1)/2 over chunks)
    FLOPs     = 2 * N_matmul * positions + 4 * L * d * attention
    bytes     = weights + KV/token * (sum(c over decodes) + sum(c over chunks))
    time      = max(bytes / bandwidth, FLOPs / compute)

The weights are read once per iteration and shared by every sequence in it, so the two
times are combined with a max, not a sum (Orca, OSDI'22, batches at this iteration level).
Units: bytes, seconds, FLOPs, bytes/s, FLOP/s.

The continuous policies (``step.py``) run every request as a chunk: a request that decodes
is a chunk of k = 1 on its c cached positions (attention c + 1, bytes c), as vLLM schedules
decode tokens. Only static batching uses the decodes term (attention c).

``Device`` carries both the accelerator (memory budget for the KV cache, bandwidth, usable
compute) and the served model (N_matmul, L, d, weight bytes, KV bytes per token); its
defaults are the course's case model on the 24GB-1.0 device at 50 % MFU. ``PROFILES`` holds
the four priced device profiles of the lab.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..roofline import CASE_WEIGHT_BYTES, case_model, n_matmul
from ..validation import instance, nonnegative_integer, positive_integer, positive_number

__all__ = ["Device", "DeviceProfile", "PROFILES", "iteration_time", "iteration_seconds", "max_tokens",
           "cost_per_million_tokens", "CASE_N_MATMUL", "CASE_LAYERS", "CASE_D_MODEL", "CASE_KV_BYTES"]

_CASE = case_model()
#: Parameters in matrix multiplies per token of the case model: 8,927,875,072 (Lab 1).
CASE_N_MATMUL: int = n_matmul(_CASE)
#: Layers L and width d of the case model (36, 4096).
CASE_LAYERS: int = _CASE.n_layers
CASE_D_MODEL: int = _CASE.d_model
#: KV-cache bytes per token of the case model in bf16: 2 * 36 * 8 * 128 * 2 = 147,456.
CASE_KV_BYTES: int = _CASE.kv_bytes_per_token(2)


@dataclass(frozen=True)
class Device:
    """A device serving one model, as the Lab 3 cost model sees it.

    Attributes (defaults: the course's case model on 24GB-1.0, ``docs/scheduling.md``):
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
            positive_number(f"Device.{name}", getattr(self, name))

    @property
    def kv_tokens(self) -> int:
        """Largest number of cached positions whose bytes (tokens * kv) fit in ``memory``."""
        return max_tokens(self.memory, self.kv)


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


#: The lab's four device profiles (``docs/scheduling.md``): unlisted fields keep the 24GB-bf16 values.
PROFILES: dict[str, DeviceProfile] = _profiles()


def max_tokens(limit: float, kv) -> int:
    """Largest integer T >= 0 with T * kv <= limit (bytes; the exact byte comparison, done once,
    so the simulators compare positions with integers)."""
    tokens = max(0, int(limit // kv))
    while (tokens + 1) * kv <= limit:
        tokens += 1
    while tokens > 0 and tokens * kv > limit:
        tokens -= 1
    return tokens


def iteration_seconds(*, positions: int, attention: int, context: int, device: Device) -> float:
    """An iteration's time (s) from its three integer totals: max((weights + kv * context) /
    bandwidth, (2 * n_matmul * positions + 4 * n_layers * d_model * attention) / compute).

    Every caller (``iteration_time``, both simulators) goes through here, so they do the same
    float operations in the same order; the fast simulator's numpy form copies this line.
    No checks: the totals are the callers' own integers."""
    memory_s = (device.weights + device.kv * context) / device.bandwidth
    compute_s = (2 * device.n_matmul * positions + 4 * device.n_layers * device.d_model * attention) / device.compute
    return max(memory_s, compute_s)


def iteration_time(decodes: Sequence[int], chunks: Sequence[tuple[int, int]], device: Device | None = None) -> float:
    """Time of one serving iteration in seconds (a bound: the cost model of ``docs/scheduling.md``).

    Args:
        decodes: cached context c (positions, int >= 0) of each decoding sequence; each
            decode adds one position (static batching; the continuous policies pass their
            decodes as chunks (1, c)).
        chunks: (k, c) per chunk: k new positions (int >= 1) on top of c cached ones
            (int >= 0).
        device: a ``Device``; None means ``Device()`` (the case model on 24GB-1.0).

    Returns:
        max(bytes / bandwidth, FLOPs / compute) with positions = len(decodes) + sum k,
        attention = sum c(decodes) + sum(k*c + k*(k+1)/2), FLOPs = 2*N_matmul*positions
        + 4*L*d*attention, bytes = weights + kv * (sum c(decodes) + sum c(chunks)).
        E.g. a 4,000-token prefill alone on the default device: 0.923 s; 18 decodes at
        context 5,000: 18.77 ms (also as 18 chunks (1, 5000): memory-bound, bytes unchanged).

    Raises:
        TypeError: decodes/chunks not sequences, a context or chunk size that is not an int,
            a chunk that is not a (k, c) pair, a device that is not a Device.
        ValueError: a negative context, k < 1, or an empty iteration (no decode, no chunk).
    """
    device = Device() if device is None else device
    instance("device", device, Device)
    if isinstance(decodes, (str, bytes)) or not isinstance(decodes, Sequence):
        raise TypeError(f"decodes must be a sequence of ints (cached contexts), got {type(decodes).__qualname__}")
    if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Sequence):
        raise TypeError(f"chunks must be a sequence of (k, c) pairs, got {type(chunks).__qualname__}")
    if len(decodes) == 0 and len(chunks) == 0:
        raise ValueError("an iteration needs at least one decode or one chunk; got decodes=[] and chunks=[]")
    context = 0
    for i, c in enumerate(decodes):
        context += nonnegative_integer(f"decodes[{i}]", c)
    positions = len(decodes)
    attention = context
    for i, pair in enumerate(chunks):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(f"chunks[{i}] must be a (k, c) pair of ints, got {pair!r}")
        k = positive_integer(f"chunks[{i}] new tokens k", pair[0])
        c = nonnegative_integer(f"chunks[{i}] cached tokens c", pair[1])
        positions += k
        attention += k * c + k * (k + 1) // 2
        context += c
    return iteration_seconds(positions=positions, attention=attention, context=context, device=device)


def cost_per_million_tokens(tokens_per_s: float, dollars_per_hour: float) -> float:
    """Dollars per million output tokens at a *measured* output rate:
    dollars_per_hour / 3600 / tokens_per_s * 1e6 (``docs/scheduling.md``, capacity and cost).

    Raises: ValueError if either argument is not a positive finite number (``validation``'s
    ArgumentTypeError, a TypeError and a ValueError, if it is not a number at all)."""
    tokens_per_s = positive_number("tokens_per_s", tokens_per_s)
    dollars_per_hour = positive_number("dollars_per_hour", dollars_per_hour)
    return dollars_per_hour / 3600 / tokens_per_s * 1e6
