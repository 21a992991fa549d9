"""The iteration cost model of Lab 3: scheduling (``docs/scheduling.md#cost-model``).

One *iteration* of a serving engine runs a set of decoding sequences (each reads its
cached context c and adds one position) and a set of *chunks* (k new positions written on
top of c cached ones). Its time is a roofline bound (``roofline.step_time``):

    positions = decodes + sum(k)
    attention = sum(c over decodes) + sum(k*c + k*(k+1)/2 over chunks)
    FLOPs     = 2 * N_matmul * positions + 4 * L * (n_h * d_head) * attention
    bytes     = weight_bytes + kv_bytes_per_token * (sum(c over decodes) + sum(c over chunks))
    time      = max(bytes / bandwidth, FLOPs / (mfu * peak_flops))

The weights are read once per iteration and shared by every sequence in it, so the two
times are combined with a max, not a sum (Orca, OSDI'22, batches at this iteration level).
Units: bytes, seconds, FLOPs, bytes/s, FLOP/s.

The continuous policies (``step.py``) run every request as a chunk: a request that decodes
is a chunk of k = 1 on its c cached positions (attention c + 1, bytes c), as vLLM schedules
decode tokens. Only static batching uses the decodes term (attention c).

A ``Deployment`` is what the cost model prices: a ``hardware.Device`` (bandwidth, peak
compute, memory) serving one model (N_matmul, L, d, its attention width n_h * d_head, weight
bytes, KV bytes per token) at an MFU, with a KV-cache budget. Its defaults are the course's
case model on the 24GB-1.0 device at 50 % MFU with 16e9 B of KV budget. ``PROFILES`` holds the
four priced deployments of the lab.

The module ends with the serving cost accounting of the lab's capacity section
(``docs/scheduling.md#serving-cost-accounting``): dollars per million output tokens at a
utilisation, the utilisation of a daily volume, the break-even volume against a hosted API,
an owned device's hourly cost and the energy per output token.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..hardware import DEVICES, REFERENCE_DEVICES, Device
from ..roofline import CASE_WEIGHT_BYTES, case_model, n_matmul, step_time
from ..validation import instance, nonnegative_integer, nonnegative_number, number, positive_integer, positive_number

__all__ = ["Deployment", "Profile", "PROFILES", "iteration_time", "iteration_work", "iteration_seconds",
           "max_tokens", "cost_per_million_tokens", "utilisation_for_volume",
           "break_even_tokens_per_day", "owned_dollars_per_hour", "joules_per_token", "SECONDS_PER_HOUR",
           "SECONDS_PER_DAY", "HOURS_PER_YEAR", "CASE_N_MATMUL", "CASE_LAYERS", "CASE_D_MODEL",
           "CASE_KV_BYTES_PER_TOKEN"]

_CASE = case_model()
#: Parameters in matrix multiplies per token of the case model: 8,927,875,072 (Lab 1).
CASE_N_MATMUL: int = n_matmul(_CASE)
#: Layers L and width d of the case model (36, 4096).
CASE_LAYERS: int = _CASE.n_layers
CASE_D_MODEL: int = _CASE.d_model
#: KV-cache bytes per token of the case model in bf16: 2 * 36 * 8 * 128 * 2 = 147,456.
CASE_KV_BYTES_PER_TOKEN: int = _CASE.kv_bytes_per_token(2)


@dataclass(frozen=True)
class Deployment:
    """A device serving one model, as the Lab 3 cost model sees it (``docs/scheduling.md#cost-model``).

    Attributes (defaults: the course's case model on 24GB-1.0 at 50 % MFU):
        device: the ``hardware.Device`` (memory in bytes, bandwidth in bytes/s, peak_flops in
            FLOP/s); default ``REFERENCE_DEVICES["24GB-1.0"]`` (24e9 B, 1e12 B/s, 165e12 FLOP/s).
        mfu: model FLOP utilisation in (0, 1]: the share of ``peak_flops`` an iteration
            reaches (0.5, a planning assumption). ``usable_flops`` = mfu * peak_flops.
        kv_budget: bytes of device memory for the KV cache (16e9 = 24 GB - 5.5 GB of weights
            - 2.5 GB of runtime overhead, Lab 1's free memory: ``docs/roofline.md#capacity``).
            Admission compares against 0.99 of it; growth (preemption) against all of it.
        n_matmul: parameters taking part in a matrix multiply per token (8,927,875,072).
        n_layers: decoder layers L (36).
        d_model: model width d (4096).
        attention_width: n_h * d_head, the width of the concatenated query heads, which the
            attention FLOPs scale with (``docs/roofline.md#flops-per-token``). None (the
            default) takes ``d_model``: the two are equal for the case model (32 * 128 = 4096)
            and SmolLM2, not for every model (Qwen3-0.6B: d 1,024, 16 * 128 = 2,048). Stored
            resolved, so ``deployment.attention_width`` is always a number.
        kv_bytes_per_token: KV-cache bytes per token position (147,456 for bf16 K and V).
        weight_bytes: bytes of weights read once per iteration (5.5e9).

    Raises:
        TypeError: a device that is not a ``Device``; a number field that is not a real
            number (bool refused).
        ValueError: a number that is not positive and finite, mfu above 1, or weights plus
            KV budget larger than the device's memory.
    """

    device: Device = REFERENCE_DEVICES["24GB-1.0"]
    mfu: float = 0.5
    kv_budget: float = 16e9
    n_matmul: int = CASE_N_MATMUL
    n_layers: int = CASE_LAYERS
    d_model: int = CASE_D_MODEL
    attention_width: int | None = None
    kv_bytes_per_token: float = CASE_KV_BYTES_PER_TOKEN
    weight_bytes: float = CASE_WEIGHT_BYTES

    def __post_init__(self) -> None:
        instance("Deployment.device", self.device, Device)
        number("Deployment.mfu", self.mfu, minimum=0, maximum=1, open_minimum=True)
        for name in ("kv_budget", "n_matmul", "n_layers", "d_model", "kv_bytes_per_token", "weight_bytes"):
            positive_number(f"Deployment.{name}", getattr(self, name))
        if self.attention_width is None:
            object.__setattr__(self, "attention_width", self.d_model)  # frozen: resolve the default once
        positive_number("Deployment.attention_width", self.attention_width)
        if self.weight_bytes + self.kv_budget > self.device.memory:
            raise ValueError(f"Deployment: weight_bytes {self.weight_bytes:.4g} B + kv_budget {self.kv_budget:.4g} B "
                             f"exceed the memory of {self.device.name} ({self.device.memory:.4g} B)")

    @property
    def usable_flops(self) -> float:
        """Compute an iteration reaches, in FLOP/s: mfu * device.peak_flops (0.5 * 165e12)."""
        return self.mfu * self.device.peak_flops

    @property
    def kv_tokens(self) -> int:
        """Largest number of cached positions whose bytes (tokens * kv_bytes_per_token) fit in
        ``kv_budget``."""
        return max_tokens(self.kv_budget, self.kv_bytes_per_token)


@dataclass(frozen=True)
class Profile:
    """A named, priced deployment for the capacity and cost part of Lab 3
    (``docs/scheduling.md#device-profiles-and-prices``).

    Attributes: name; deployment (a ``Deployment``); dollars_per_hour (assumed rental price, $/h).
    """

    name: str
    deployment: Deployment
    dollars_per_hour: float


def _profiles() -> dict[str, Profile]:
    base = Deployment()
    return {p.name: p for p in (
        Profile("24GB-bf16", base, 1.00),
        Profile("24GB-int8", replace(base, kv_bytes_per_token=73_728), 1.00),
        Profile("H100-bf16", replace(base, device=DEVICES["H100 SXM"], kv_budget=72e9), 2.50),
        Profile("L4-bf16", replace(base, device=REFERENCE_DEVICES["24GB-0.3"]), 0.80),
    )}


#: The lab's four priced deployments (``docs/scheduling.md#device-profiles-and-prices``):
#: unlisted fields keep the 24GB-bf16 values; H100-bf16 is the H100 SXM (80 GB, 3.35 TB/s,
#: 989 TFLOP/s) with 72e9 B of KV budget, L4-bf16 the 24GB-0.3 device (0.30 TB/s, 121 TFLOP/s).
PROFILES: dict[str, Profile] = _profiles()


def max_tokens(limit: float, kv_bytes_per_token) -> int:
    """Largest integer T >= 0 with T * kv_bytes_per_token <= limit (bytes; the exact byte
    comparison, done once, so the simulators compare positions with integers)."""
    tokens = max(0, int(limit // kv_bytes_per_token))
    while (tokens + 1) * kv_bytes_per_token <= limit:
        tokens += 1
    while tokens > 0 and tokens * kv_bytes_per_token > limit:
        tokens -= 1
    return tokens


def iteration_work(*, positions, attention, context, deployment: Deployment):
    """An iteration's (bytes moved, FLOPs) from its three integer totals:

        bytes = weight_bytes + kv_bytes_per_token * context
        FLOPs = 2 * n_matmul * positions + 4 * n_layers * attention_width * attention

    The totals may be numpy int64 arrays (the fast simulator's stretches; the results are then
    arrays). No checks: the totals are the callers' own integers."""
    d = deployment
    return (d.weight_bytes + d.kv_bytes_per_token * context,
            2 * d.n_matmul * positions + 4 * d.n_layers * d.attention_width * attention)


def iteration_seconds(*, positions, attention, context, deployment: Deployment):
    """An iteration's time (s) from its three integer totals: ``roofline.step_time`` of
    ``iteration_work`` at the device's bandwidth and the deployment's ``usable_flops``.

    Every caller (``iteration_time``, both simulators; the fast one with numpy arrays of
    totals) goes through here, so they do the same float operations in the same order.
    No checks: the totals are the callers' own integers."""
    bytes_moved, flops = iteration_work(positions=positions, attention=attention, context=context,
                                        deployment=deployment)
    return step_time(bytes_moved=bytes_moved, flops=flops, bandwidth=deployment.device.bandwidth,
                     peak_flops=deployment.usable_flops)


def iteration_time(decodes: Sequence[int], chunks: Sequence[tuple[int, int]], deployment: Deployment) -> float:
    """Time of one serving iteration in seconds (a bound: ``docs/scheduling.md#cost-model``).
    The Lab 3 exercise of the same name takes the same arguments.

    Args:
        decodes: cached context c (positions, int >= 0) of each decoding sequence; each
            decode adds one position (static batching; the continuous policies pass their
            decodes as chunks (1, c)).
        chunks: (k, c) per chunk: k new positions (int >= 1) on top of c cached ones
            (int >= 0).
        deployment: a ``Deployment`` (``Deployment()``: the case model on 24GB-1.0).

    Returns:
        max(bytes / bandwidth, FLOPs / usable_flops) with positions = len(decodes) + sum k,
        attention = sum c(decodes) + sum(k*c + k*(k+1)/2), FLOPs = 2*N_matmul*positions
        + 4*L*attention_width*attention, bytes = weight_bytes + kv_bytes_per_token * (sum c(decodes) +
        sum c(chunks)). E.g. a 4,000-token prefill alone on ``Deployment()``: 0.923 s; 18
        decodes at context 5,000: 18.77 ms (also as 18 chunks (1, 5000): memory-bound, bytes
        unchanged).

    Raises:
        TypeError: decodes/chunks not sequences, a context or chunk size that is not an int,
            a chunk that is not a (k, c) pair, a deployment that is not a Deployment.
        ValueError: a negative context, k < 1, or an empty iteration (no decode, no chunk).
    """
    instance("deployment", deployment, Deployment)
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
    return iteration_seconds(positions=positions, attention=attention, context=context, deployment=deployment)


# -- serving cost accounting (docs/scheduling.md#serving-cost-accounting) ---------------------------
#: Seconds in an hour and in a day, and hours in a (365-day) year.
SECONDS_PER_HOUR: int = 3600
SECONDS_PER_DAY: int = 86_400
HOURS_PER_YEAR: int = 8760


def cost_per_million_tokens(tokens_per_s: float, dollars_per_hour: float, utilisation: float = 1.0) -> float:
    """Dollars per million output tokens of a device paid by the hour
    (``docs/scheduling.md#serving-cost-accounting``):

        dollars_per_hour / 3600 / (tokens_per_s * utilisation) * 1e6

    Args:
        tokens_per_s: output tokens per second while the device is busy (the *measured* rate at
            the load it serves, e.g. the simulator's ``throughput`` at the SLO capacity).
        dollars_per_hour: what an hour of the device costs, busy or idle ($/h).
        utilisation: the share of the paid hours the device is busy at that rate, in (0, 1]
            (1: always busy). Idle hours are paid too, so the price *divides* by it: at 0.3 a
            token costs 1 / 0.3 = 3.33 times what it costs on a busy device.

    Returns: $ per 1e6 output tokens (float). E.g. 466.3 tok/s at $1.00/h: $0.5957; at 30 %
    utilisation: $1.986.

    Raises: ValueError if tokens_per_s or dollars_per_hour is not a positive finite number or
    utilisation is not in (0, 1] (``validation``'s ArgumentTypeError, a TypeError and a
    ValueError, if one is not a number at all)."""
    tokens_per_s = positive_number("tokens_per_s", tokens_per_s)
    dollars_per_hour = positive_number("dollars_per_hour", dollars_per_hour)
    utilisation = number("utilisation", utilisation, minimum=0, maximum=1, open_minimum=True)
    return dollars_per_hour / SECONDS_PER_HOUR / (tokens_per_s * utilisation) * 1e6


def utilisation_for_volume(tokens_per_day: float, tokens_per_s: float) -> float:
    """Share of an always-on device's day a daily volume keeps it busy
    (``docs/scheduling.md#serving-cost-accounting``): tokens_per_day / (tokens_per_s * 86,400).

    Args: tokens_per_day: output tokens served per day (> 0); tokens_per_s: the device's output
    rate while busy (> 0). Returns a float in (0, 1].
    Raises: ValueError for a non-positive argument, or a volume above what one device serves in a
    day (tokens_per_s * 86,400: more than one device is needed)."""
    tokens_per_day = positive_number("tokens_per_day", tokens_per_day)
    tokens_per_s = positive_number("tokens_per_s", tokens_per_s)
    share = tokens_per_day / (tokens_per_s * SECONDS_PER_DAY)
    if share > 1:
        raise ValueError(f"tokens_per_day {tokens_per_day:.6g} is more than one device serves in a day at "
                         f"{tokens_per_s:.6g} tok/s ({tokens_per_s * SECONDS_PER_DAY:.6g}): use more devices")
    return share


def break_even_tokens_per_day(dollars_per_hour: float, api_dollars_per_million: float) -> float:
    """Daily output volume at which an always-on device at ``dollars_per_hour`` costs what a hosted
    API charging ``api_dollars_per_million`` ($ per 1e6 output tokens) would
    (``docs/scheduling.md#serving-cost-accounting``):

        24 * dollars_per_hour / api_dollars_per_million * 1e6   (output tokens per day)

    Below it the API is cheaper (the device's day is paid whatever it serves); above it, the device
    is, as long as the volume fits in it (``utilisation_for_volume`` <= 1).
    Raises: ValueError for a non-positive argument."""
    dollars_per_hour = positive_number("dollars_per_hour", dollars_per_hour)
    api = positive_number("api_dollars_per_million", api_dollars_per_million)
    return SECONDS_PER_DAY / SECONDS_PER_HOUR * dollars_per_hour / api * 1e6


def owned_dollars_per_hour(*, purchase_dollars: float, watts: float, dollars_per_kwh: float,
                           years: float = 3) -> float:
    """Hourly cost of an owned device run around the clock (``docs/scheduling.md#serving-cost-accounting``):
    its price written off evenly over ``years`` of 8,760 hours, plus its power at the electricity price:

        purchase_dollars / (years * 8760) + watts / 1000 * dollars_per_kwh

    Arguments keyword-only: purchase_dollars ($, > 0), watts (the device's draw while serving, W, > 0),
    dollars_per_kwh ($ per kWh, >= 0), years (> 0; 3 by default). Not counted: the host, cooling,
    space, staff, a loan's interest, a resale value. E.g. $25,000, 700 W, $0.15/kWh, 3 years:
    0.9513 + 0.105 = $1.056/h.
    Raises: ValueError for a non-positive price, power or period, or a negative electricity price."""
    purchase = positive_number("purchase_dollars", purchase_dollars)
    watts = positive_number("watts", watts)
    kwh = nonnegative_number("dollars_per_kwh", dollars_per_kwh)
    years = positive_number("years", years)
    return purchase / (years * HOURS_PER_YEAR) + watts / 1000 * kwh


def joules_per_token(watts: float, tokens_per_s: float) -> float:
    """Energy per output token in joules: watts / tokens_per_s (a watt is a joule per second;
    ``docs/scheduling.md#serving-cost-accounting``). 700 W at 3,500 tok/s: 0.2 J.
    Raises: ValueError for a non-positive argument."""
    return positive_number("watts", watts) / positive_number("tokens_per_s", tokens_per_s)
