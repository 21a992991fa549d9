"""Roofline bounds for LLM inference (Lab 1: ``docs/roofline.md``; the notebook's engine and
what the graders use).

Units everywhere: bytes, seconds, FLOPs, bytes/s and FLOP/s, as a ``hardware.Device`` holds
them; decimal GB (1 GB = 1e9 bytes, never GiB) only where an argument's name says ``_gb``.
Every time returned here is a *bound* (a best case under the stated assumptions), not a
prediction.

Contents:
- ``step_time``: the roofline time of one step, max(bytes / bandwidth, FLOPs / peak), the
  one place the course writes it (Lab 3's cost model and its fast simulator call it too);
- model accounting on a ``ModelConfig``: ``n_matmul``, ``kv_bytes_per_token``,
  ``serving_file_bytes`` (mixed int4-g128 / bf16 / int8 format), ``case_model``;
- time bounds: ``prefill_time`` (compute at MFU), ``decode_step`` (both terms) and
  ``decode_step_bound`` (their max), ``requests_that_fit``, ``capacity_table`` (per-device
  TTFT, batch and throughput);
- the per-token cost calculator of the 70B example: ``weight_bytes_for_format``,
  ``kv_bytes_per_sequence``, ``step_time_bound``, ``smallest_compute_bound_batch``
  (``course_lib.speculative`` builds the speculative-decoding bounds on ``step_time_bound``);
- two devices and more: ``tensor_parallel_step`` (a decode step split by tensor parallelism, with its
  all-reduces over a link of ``TP_LINKS``);
- arithmetic intensity: ``gemv_intensity``, ``gemm_intensity``, ``decode_attention_intensity``;
- measurement: ``measure_matmul`` (W (d x d) @ X (d x B) on this machine),
  ``measure_gemv_bandwidth`` (x @ W streamed over more bytes than the caches hold) and
  ``estimate_roof`` (bandwidth from that stream, or from B = 1 without it; peak from the largest B; ridge).

Where a function's learner twin exists (``prefill_time``, ``decode_step_bound``,
``requests_that_fit`` in the Lab 1 notebook), both take the same arguments and return the same
kind of value. Long numeric argument lists are keyword-only, so a call reads as the formula does.

Every function raises ``ValueError`` naming the argument on bad input (non-positive sizes,
an unknown format, ``mfu`` outside (0, 1], ...).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral
from typing import TYPE_CHECKING

import numpy as np

from .cache.tiers import LINKS as TIER_LINKS
from .cache.tiers import Link
from .hardware import REFERENCE_DEVICES, Device, get_device
from .models.config import ModelConfig
from .validation import (instance, nonnegative_integer, nonnegative_number, number, positive_integer,
                         positive_number)

if TYPE_CHECKING:
    from .timing import Timing

__all__ = [
    "CASE_WEIGHT_BYTES", "FORMAT_BITS", "step_time", "StepBound", "case_model", "n_matmul", "kv_bytes_per_token",
    "serving_file_bytes", "default_weight_bytes", "requests_that_fit", "prefill_flops", "prefill_time",
    "attention_flops", "decode_step_flops", "decode_step", "decode_step_bound", "capacity_table", "weight_bytes_for_format",
    "kv_bytes_per_sequence", "step_time_bound", "smallest_compute_bound_batch",
    "TP_LINKS", "TensorParallelBound", "tensor_parallel_step", "gemv_intensity",
    "gemm_intensity", "decode_attention_intensity", "DEFAULT_BATCHES", "measure_matmul", "MeasuredRoof",
    "GemvBandwidth", "measure_gemv_bandwidth", "estimate_roof",
]

#: Weight-file bytes of the case model used in every bound (docs/roofline.md#serving-file).
CASE_WEIGHT_BYTES: float = 5.5e9

#: Bits per weight of the 70B calculator's formats (int4 g128: 4 bits + scale overhead = 4.15).
FORMAT_BITS: dict[str, float] = {"bf16": 16.0, "fp8": 8.0, "int4-g128": 4.15}


# -- the roofline step time ----------------------------------------------------------------
def step_time(*, bytes_moved, flops, bandwidth, peak_flops):
    """Roofline time of one step in seconds: max(bytes_moved / bandwidth, flops / peak_flops).

    Loads and arithmetic overlap, so the slower of the two bounds the step: a max, not a sum
    (Williams, Waterman and Patterson, 2009; ``docs/roofline.md#decode-step-bound``). Every
    step time of the course comes from here: Lab 1's bounds, Lab 3's iteration cost model
    (``scheduling.cost.iteration_seconds``) and its fast simulator, which passes numpy arrays.

    Args (keyword-only): bytes_moved: bytes read and written (B). flops: arithmetic (FLOP).
        bandwidth: bytes/s. peak_flops: FLOP/s (a datasheet peak, or a usable MFU share of it).
        Floats, ints or numpy arrays (element-wise; the result is then an array).
    Returns: seconds, a float for scalar inputs. No checks: callers validate where values enter.
    """
    memory_s = bytes_moved / bandwidth
    compute_s = flops / peak_flops
    if isinstance(memory_s, np.ndarray) or isinstance(compute_s, np.ndarray):
        return np.maximum(memory_s, compute_s)
    return max(memory_s, compute_s)


@dataclass(frozen=True)
class StepBound:
    """A roofline bound on one step, in seconds: ``bound_s = step_time(...)``, the larger of
    ``memory_s = bytes_moved / bandwidth`` and ``compute_s = flops / peak``.

    ``binding`` is "compute" when compute_s >= memory_s, else "memory"; ``bytes_moved`` (B) and
    ``flops`` (FLOP) are the numerators of the two times."""

    memory_s: float
    compute_s: float
    bound_s: float
    binding: str
    bytes_moved: float
    flops: float

    @classmethod
    def from_terms(cls, *, bytes_moved: float, flops: float, bandwidth: float, peak_flops: float) -> "StepBound":
        """The bound of a step moving ``bytes_moved`` bytes at ``bandwidth`` B/s and doing ``flops``
        FLOPs at ``peak_flops`` FLOP/s."""
        memory_s, compute_s = bytes_moved / bandwidth, flops / peak_flops
        return cls(memory_s=memory_s, compute_s=compute_s,
                   bound_s=step_time(bytes_moved=bytes_moved, flops=flops, bandwidth=bandwidth,
                                     peak_flops=peak_flops),
                   binding="compute" if compute_s >= memory_s else "memory",
                   bytes_moved=bytes_moved, flops=flops)


# -- argument checks -----------------------------------------------------------------------
def _device(name: str, value) -> Device:
    try:
        return get_device(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


# -- model accounting ----------------------------------------------------------------------
def case_model() -> ModelConfig:
    """The course's case model (``docs/roofline.md#case-model``): 36 layers, d 4096, 32 query /
    8 KV heads of 128, SwiGLU 15,360, vocab 152,064, untied. N = 9,550,729,216; N_matmul =
    8,927,875,072. ``max_seq_len`` is left at the ModelConfig default (no bound uses it)."""
    return ModelConfig(n_layers=36, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=15360,
                       vocab_size=152064, tie_embeddings=False)


def n_matmul(config: ModelConfig) -> int:
    """Parameters that take part in a matrix multiply per token (``docs/roofline.md#counting-rule``).

    ``config.parameters()`` minus the *untied* input embedding (a lookup is not a multiply);
    the output head stays. With tied embeddings the shared matrix is counted once, as the
    head, so N_matmul = parameters. (Norm vectors are kept.)

    Returns: an exact int. Raises: ValueError if ``config`` is not a ModelConfig.
    """
    config = instance("config", config, ModelConfig)
    embedding = 0 if config.tie_embeddings else config.vocab_size * config.d_model
    return config.parameters() - embedding


def kv_bytes_per_token(config: ModelConfig, bytes_per_value: int | float = 2):
    """KV-cache bytes one position costs: 2 (K and V) * L * n_kv * d_head * bytes_per_value
    (``docs/roofline.md#kv-bytes-per-token``).

    Returns: an int for an int ``bytes_per_value`` (exact), else a float (e.g. 0.5 for int4).
    Raises: ValueError for a non-ModelConfig or a non-positive ``bytes_per_value``.
    """
    config = instance("config", config, ModelConfig)
    positive_number("bytes_per_value", bytes_per_value)
    return config.kv_bytes_per_token(bytes_per_value)


def serving_file_bytes(config: ModelConfig, linear_bits: float = 4.125, norm_bits: float = 16,
                       embedding_bits: float = 8) -> float:
    """Bytes of a mixed-format serving file, before packaging metadata (``docs/roofline.md#serving-file``).

    Block linear weights (q, k, v, o and the three SwiGLU projections) at ``linear_bits``
    (default 4.125 = int4 plus one fp16 scale per 128 weights), RMSNorm vectors (2 per block
    plus the final norm) at ``norm_bits`` (bf16), embedding table(s) at ``embedding_bits``
    (input embedding and, when untied, the output head; a tied table once). The case model
    gives 5,528,428,544 bytes = 5.528429 GB.

    Returns: a float, in bytes. Raises: ValueError on a non-ModelConfig or non-positive bits.
    """
    config = instance("config", config, ModelConfig)
    for name, bits in (("linear_bits", linear_bits), ("norm_bits", norm_bits),
                       ("embedding_bits", embedding_bits)):
        positive_number(name, bits)
    norms = 2 * config.n_layers * config.d_model + config.d_model
    linear = config.n_layers * (config.block_parameters() - 2 * config.d_model)
    tables = (1 if config.tie_embeddings else 2) * config.vocab_size * config.d_model
    assert linear + norms + tables == config.parameters()
    return (linear * linear_bits + norms * norm_bits + tables * embedding_bits) / 8


def default_weight_bytes(config: ModelConfig) -> float:
    """Weight bytes ``capacity_table`` uses when none is given: ``CASE_WEIGHT_BYTES`` (5.5e9) for
    the case model (the course's round figure), otherwise ``serving_file_bytes(config)``."""
    config = instance("config", config, ModelConfig)
    return CASE_WEIGHT_BYTES if config == case_model() else serving_file_bytes(config)


# -- time bounds ---------------------------------------------------------------------------
def prefill_flops(config: ModelConfig, tokens: int) -> int:
    """FLOPs of a prefill of ``tokens`` positions, simplified form: 2*N_matmul*t + 2*L*(n_h*d_head)*t^2
    (``docs/roofline.md#prefill-time``), with n_h*d_head = ``config.attention_width`` (the width of
    the concatenated query heads; d_model for the case model and SmolLM2, not for every model).

    Returns: an exact int. Raises: ValueError for a non-ModelConfig or a non-positive ``tokens``."""
    config = instance("config", config, ModelConfig)
    t = positive_integer("tokens", tokens)
    return 2 * n_matmul(config) * t + 2 * config.n_layers * config.attention_width * t * t


def prefill_time(config: ModelConfig, device, tokens: int, mfu: float = 0.5) -> float:
    """Bound on prefill time (time to first token) in seconds (``docs/roofline.md#prefill-time``):

        (2*N_matmul*t + 2*L*(n_h*d_head)*t^2) / (mfu * peak_flops)

    Prefill is compute-bound (thousands of positions per weight read), so the bound divides
    by compute alone. The Lab 1 exercise of the same name takes the same arguments.

    Args:
        config: a ModelConfig. device: a ``hardware.Device`` or a name in ``hardware.DEVICES``.
        tokens: prompt positions t (> 0). mfu: model FLOP utilisation in (0, 1].
    Returns: seconds (a float).
    Raises:
        ValueError: bad config/device, tokens <= 0, mfu outside (0, 1].
    """
    dev = _device("device", device)
    mfu = number("mfu", mfu, minimum=0, maximum=1, open_minimum=True)
    return prefill_flops(config, tokens) / (mfu * dev.peak_flops)


def attention_flops(*, n_layers: int, width: int, context: float) -> float:
    """FLOPs of one position's attention over ``context`` cached positions: 4 * L * width * context
    (``docs/roofline.md#flops-per-token``).

    Per layer the scores q . k and the weighted sum of the values are each ``width * context``
    multiply-adds (2 FLOPs each), ``width`` being the query heads' width n_h * d_head
    (``ModelConfig.attention_width``), not d_model. The term that ``decode_step_flops`` adds per
    sequence to the weights' 2 * N_matmul, and what ``step_time_bound`` takes as
    ``attention_flops_per_sequence``.

    Args (keyword-only): n_layers (int > 0), width (int > 0), context (positions > 0, may be
        fractional: an average). Returns: an int for an int ``context``, else a float.
    Raises: ValueError naming the argument for a non-positive size."""
    L = positive_integer("n_layers", n_layers)
    w = positive_integer("width", width)
    c = positive_number("context", context)
    return 4 * L * w * c


def decode_step_flops(config: ModelConfig, *, batch: int, context: float) -> float:
    """FLOPs of one decode step: 2*N_matmul*batch + 4*L*(n_h*d_head)*batch*context
    (``docs/roofline.md#decode-step-bound``), n_h*d_head = ``config.attention_width``; the
    second term is ``batch * attention_flops(...)``.

    Returns: an int for an int ``context``, else a float. Raises: ValueError for a
    non-ModelConfig, a non-positive ``batch`` or ``context``."""
    config = instance("config", config, ModelConfig)
    b = positive_integer("batch", batch)
    c = positive_number("context", context)
    return 2 * n_matmul(config) * b + b * attention_flops(n_layers=config.n_layers,
                                                          width=config.attention_width, context=c)


def decode_step(config: ModelConfig, device, *, batch: int, context: float, weight_bytes: float,
                kv_bytes_per_value=2) -> StepBound:
    """Both roofline terms of one decode step of ``batch`` sequences each at ``context`` cached
    positions (``docs/roofline.md#decode-step-bound``), as a ``StepBound``:

        bytes   = weight_bytes + batch * kv_per_token * context   (the weight read is shared)
        FLOPs   = 2*N_matmul*batch + 4*L*(n_h*d_head)*batch*context
        bound_s = step_time(bytes, FLOPs, bandwidth, peak_flops)  (no MFU: optimistic)

    Args:
        config: a ModelConfig. device: a ``hardware.Device`` or a name in ``hardware.DEVICES``.
        batch (int > 0), context (positions > 0, may be fractional: an average),
        weight_bytes (bytes of the weight file, 5.5e9 for the case model), kv_bytes_per_value
        (bytes of one cached K or V element, 2 for bf16): keyword-only.
    Returns: a StepBound (seconds). Raises: ValueError on non-positive sizes or bad types.
    """
    config = instance("config", config, ModelConfig)
    dev = _device("device", device)
    b = positive_integer("batch", batch)
    c = positive_number("context", context)
    w = positive_number("weight_bytes", weight_bytes)
    kv = kv_bytes_per_token(config, kv_bytes_per_value)
    return StepBound.from_terms(bytes_moved=w + b * kv * c, flops=decode_step_flops(config, batch=b, context=c),
                                bandwidth=dev.bandwidth, peak_flops=dev.peak_flops)


def decode_step_bound(config: ModelConfig, device, *, batch: int, context: float, weight_bytes: float,
                      kv_bytes_per_value=2) -> float:
    """Bound on one decode step in seconds: ``decode_step(...).bound_s``, the larger of the
    memory time and the compute time (``docs/roofline.md#decode-step-bound``). The Lab 1
    exercise of the same name takes the same arguments and returns the same float.

    Raises: ValueError as ``decode_step``."""
    return decode_step(config, device, batch=batch, context=context, weight_bytes=weight_bytes,
                       kv_bytes_per_value=kv_bytes_per_value).bound_s


def requests_that_fit(config: ModelConfig, device, *, weight_bytes: float, prompt_tokens: int,
                      output_tokens: int, overhead_gb: float = 2.5, kv_bytes_per_value=2) -> int:
    """Full-length requests whose KV cache fits at once (``docs/roofline.md#capacity``):

        free = device.memory - weight_bytes - overhead_gb * 1e9          (bytes)
        fit  = floor(free / (kv_per_token * (prompt_tokens + output_tokens))), 0 when free <= 0

    The runtime overhead is a planning figure in decimal GB (2.5 GB; 1 GB = 1e9 bytes, not
    GiB). The Lab 1 exercise of the same name takes the same arguments.

    Args:
        config: a ModelConfig. device: a ``hardware.Device`` or a name in ``hardware.DEVICES``.
        weight_bytes (bytes > 0), prompt_tokens and output_tokens (ints > 0), overhead_gb
        (decimal GB >= 0), kv_bytes_per_value (2 for a bf16 cache): keyword-only.
    Returns: an int >= 0. Raises: ValueError on non-positive sizes or a negative overhead."""
    config = instance("config", config, ModelConfig)
    dev = _device("device", device)
    prompt = positive_integer("prompt_tokens", prompt_tokens)
    output = positive_integer("output_tokens", output_tokens)
    overhead = nonnegative_number("overhead_gb", overhead_gb)
    w = positive_number("weight_bytes", weight_bytes)
    free = dev.memory - w - overhead * 1e9
    return max(0, math.floor(free / (kv_bytes_per_token(config, kv_bytes_per_value) * (prompt + output))))


def capacity_table(config: ModelConfig | None = None, devices=None, *, prompt_tokens: int = 4000,
                   output_tokens: int = 2000, overhead_gb: float = 2.5, mfu: float = 0.5,
                   weight_bytes: float | None = None, kv_bytes_per_value=2):
    """Per-device serving bounds for full-length requests, as a pandas DataFrame
    (``docs/roofline.md#capacity-table``).

    Columns ``device, free_gb, batch, ttft_s, solo_tok_s, batch_tok_s``:
    - free_gb = memory - weights - overhead (decimal GB; negative if the weights don't fit);
    - batch = ``requests_that_fit``, 0 if nothing fits;
    - ttft_s = prefill_time(prompt) at ``mfu``;
    - decode context = prompt + output / 2 (the mean over a request's output);
    - solo_tok_s = 1 / step(batch 1); batch_tok_s = batch / step(max(1, batch)) (0 if batch 0).

    Args:
        config: defaults to ``case_model()``. devices: ``Device``s or names (default the five
            ``REFERENCE_DEVICES``). weight_bytes: override (e.g. 2 * N for all-bf16); None ->
            ``default_weight_bytes(config)``. The rest keyword-only, as ``requests_that_fit``.
    Raises: ValueError on non-positive sizes, negative overhead, mfu outside (0, 1], empty devices.
    """
    import pandas as pd

    config = case_model() if config is None else instance("config", config, ModelConfig)
    if devices is None:
        devs = list(REFERENCE_DEVICES.values())
    else:
        devs = [_device("devices", d) for d in devices]
        if not devs:
            raise ValueError("devices must not be empty")
    prompt = positive_integer("prompt_tokens", prompt_tokens)
    output = positive_integer("output_tokens", output_tokens)
    overhead = nonnegative_number("overhead_gb", overhead_gb)
    mfu = number("mfu", mfu, minimum=0, maximum=1, open_minimum=True)
    w = default_weight_bytes(config) if weight_bytes is None else positive_number("weight_bytes", weight_bytes)
    context = prompt + output / 2
    sizes = dict(weight_bytes=w, kv_bytes_per_value=kv_bytes_per_value)
    rows = []
    for dev in devs:
        free = dev.memory - w - overhead * 1e9
        batch = requests_that_fit(config, dev, prompt_tokens=prompt, output_tokens=output, overhead_gb=overhead,
                                  **sizes)
        solo = decode_step_bound(config, dev, batch=1, context=context, **sizes)
        full = decode_step_bound(config, dev, batch=max(1, batch), context=context, **sizes)
        rows.append({"device": dev.name, "free_gb": free / 1e9, "batch": batch,
                     "ttft_s": prefill_time(config, dev, prompt, mfu), "solo_tok_s": 1 / solo,
                     "batch_tok_s": batch / full})
    return pd.DataFrame(rows, columns=["device", "free_gb", "batch", "ttft_s", "solo_tok_s", "batch_tok_s"])


# -- per-token cost calculator (the 70B example) -------------------------------------------
def weight_bytes_for_format(n_params: int, fmt: str) -> float:
    """Weight bytes of ``n_params`` weights stored as ``fmt``: n_params * bits / 8
    (``docs/roofline.md#cost-calculator``).

    Formats (``FORMAT_BITS``): "bf16" 16, "fp8" 8, "int4-g128" 4.15 bits/weight. For 70e9
    parameters: 140.0 GB, 70.0 GB, 36.3125 GB. Returns a float (bytes).
    Raises: ValueError for non-positive ``n_params`` or an unknown ``fmt``."""
    n = positive_integer("n_params", n_params) if isinstance(n_params, Integral) else \
        positive_number("n_params", n_params)
    if fmt not in FORMAT_BITS:
        raise ValueError(f"fmt must be one of {sorted(FORMAT_BITS)}, got {fmt!r}")
    return n * FORMAT_BITS[fmt] / 8


def kv_bytes_per_sequence(*, n_layers: int, n_kv_heads: int, head_dim: int, context: int,
                          bytes_per_value: int | float = 2):
    """KV bytes of one sequence: 2 * L * n_kv * d_head * bytes_per_value * context
    (``docs/roofline.md#cost-calculator``).

    80 layers, 8 KV heads of 128, 2,048 positions, bf16 -> 671,088,640 bytes. Exact int for
    an int ``bytes_per_value``. Arguments keyword-only. Raises: ValueError on non-positive sizes."""
    for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                    ("context", context)):
        positive_integer(name, v)
    positive_number("bytes_per_value", bytes_per_value)
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_value * context


def step_time_bound(*, weight_bytes: float, n_params: int, batch: int, kv_bytes_per_sequence: float,
                    bandwidth: float, peak_flops: float, positions_per_sequence: int = 1,
                    attention_flops_per_sequence: float = 0) -> StepBound:
    """Bound on one target-model step, the 70B calculator's simplified form
    (``docs/roofline.md#cost-calculator``):

        bytes = weight_bytes + batch * kv_bytes_per_sequence
        FLOPs = 2 * n_params * batch * positions_per_sequence + batch * attention_flops_per_sequence
        bound = step_time(bytes, FLOPs, bandwidth, peak_flops)

    With ``attention_flops_per_sequence = 0`` (the default) the FLOPs are the weights' alone, the
    calculator's form; passing ``attention_flops(n_layers=, width=, context=)`` (4 * L * width *
    context for one scored position) gives the decode-step formula of
    ``docs/roofline.md#decode-step-bound``, attention included.

    Args (keyword-only):
        weight_bytes: bytes of the weights. n_params: parameters N. batch: sequences (int > 0).
        kv_bytes_per_sequence: bytes of one sequence's cache; may be 0 (weights-only floor).
        bandwidth: bytes/s (3.0 TB/s -> 3.0e12). peak_flops: FLOP/s (1,000 TFLOP/s -> 1e15).
        positions_per_sequence: positions scored per sequence (gamma + 1 when verifying).
        attention_flops_per_sequence: attention FLOPs of one sequence in this step (all its scored
            positions), >= 0.
    Returns: a StepBound (seconds).
    Raises: ValueError on non-positive sizes (negative KV bytes or attention FLOPs).
    """
    w = positive_number("weight_bytes", weight_bytes)
    n = positive_number("n_params", n_params)
    b = positive_integer("batch", batch)
    kv = nonnegative_number("kv_bytes_per_sequence", kv_bytes_per_sequence)
    bw = positive_number("bandwidth", bandwidth)
    peak = positive_number("peak_flops", peak_flops)
    p = positive_integer("positions_per_sequence", positions_per_sequence)
    a = nonnegative_number("attention_flops_per_sequence", attention_flops_per_sequence)
    return StepBound.from_terms(bytes_moved=w + b * kv, flops=2 * n * b * p + b * a, bandwidth=bw,
                                peak_flops=peak)


def smallest_compute_bound_batch(*, weight_bytes: float, n_params: int, kv_bytes_per_sequence: float,
                                 bandwidth: float, peak_flops: float,
                                 positions_per_sequence: int = 1) -> int | None:
    """Smallest batch at which ``step_time_bound`` is compute-bound (compute_s >= memory_s)
    (``docs/roofline.md#compute-bound-batch``).

    Solves batch * (2*N*P/peak - KV/bandwidth) >= weight_bytes / bandwidth. Returns None when
    the per-sequence KV read grows at least as fast as per-sequence compute (the step never
    turns compute-bound, e.g. 70B bf16 with a 2,048-position bf16 cache at P = 1).
    Arguments keyword-only, as ``step_time_bound`` (without ``batch``).
    Raises: ValueError on bad sizes."""
    terms = dict(weight_bytes=weight_bytes, n_params=n_params, kv_bytes_per_sequence=kv_bytes_per_sequence,
                 bandwidth=bandwidth, peak_flops=peak_flops, positions_per_sequence=positions_per_sequence)
    step_time_bound(batch=1, **terms)   # validates every argument
    slope = 2 * n_params * positions_per_sequence / peak_flops - kv_bytes_per_sequence / bandwidth
    if slope <= 0:
        return None

    def is_compute(b: int) -> bool:
        return step_time_bound(batch=b, **terms).binding == "compute"

    batch = max(1, math.ceil((weight_bytes / bandwidth) / slope))
    while batch > 1 and is_compute(batch - 1):  # guard against float rounding in the ceil
        batch -= 1
    while not is_compute(batch):
        batch += 1
    return batch


# -- two or more devices: tensor parallelism -------------------------------------------------
#: Links between the devices of one server, one direction each, rated bounds (not measurements): the
#: two PCIe links of ``cache.tiers.LINKS`` and NVLink 4 as an H100 SXM has it.
TP_LINKS: tuple[Link, ...] = (
    *(link for link in TIER_LINKS if link.name.startswith("host memory over PCIe")),
    Link("NVLink 4 (H100 SXM)", 450e9, "NVIDIA H100 datasheet: 900 GB/s of NVLink bandwidth per GPU, both "
         "directions summed (18 links of 50 GB/s): 450 GB/s each way; as of 2026-11"),
)


@dataclass(frozen=True)
class TensorParallelBound:
    """One decode step of a model split over ``devices`` devices by tensor parallelism, in seconds.

    ``per_device`` is the roofline bound of one device's share (``step_time_bound`` on 1/devices of
    the weights, the KV cache and the FLOPs); ``all_reduce_bytes`` is one all-reduce's message (B),
    ``sent_bytes`` what each device sends over its link in the whole step (B);
    ``communication_s`` the all-reduces' time; ``bound_s = per_device.bound_s + communication_s``."""

    devices: int
    per_device: StepBound
    all_reduce_bytes: float
    sent_bytes: float
    communication_s: float
    bound_s: float


def tensor_parallel_step(*, devices: int, weight_bytes: float, n_params: float, batch: int,
                         kv_bytes_per_sequence: float, n_layers: int, d_model: int, bandwidth: float,
                         peak_flops: float, link_bandwidth: float, link_latency_s: float = 0.0,
                         activation_bytes: float = 2, attention_flops_per_sequence: float = 0
                         ) -> TensorParallelBound:
    """Bound on one decode step of a model split over ``devices`` identical devices by tensor
    parallelism (``docs/roofline.md#tensor-parallelism``):

        per device     = step_time_bound(weights / n, N / n, batch, KV / n, attention / n)
        message        = batch * d_model * activation_bytes            (one all-reduce, bytes)
        one all-reduce = 2 (n - 1) * link_latency_s + 2 (n - 1) / n * message / link_bandwidth
        communication  = 2 * n_layers * one all-reduce
        bound          = per device + communication

    Each device holds 1/n of every weight matrix and of the KV heads, so it reads 1/n of the bytes
    and does 1/n of the FLOPs. Megatron-LM's split (Shoeybi et al., 2019, arXiv:1909.08053, section 3)
    needs two all-reduces of the activations per layer in a forward pass: after the attention's output
    projection and after the MLP's down projection. A ring all-reduce of M bytes over n devices takes
    2 (n - 1) steps and sends 2 (n - 1) / n * M bytes from each device (Patarasuk and Yuan, J. Parallel
    Distrib. Comput. 69(2), 2009; the latency-bandwidth cost of Thakur, Rabenseifner and Gropp, Int. J.
    High Perform. Comput. Appl. 19(1), 2005). The terms add: the next layer needs the all-reduced sum,
    so within one decode step the communication does not overlap the reads (an assumption; an engine
    that overlaps them does better). At n = 1 there is no communication and the result equals
    ``step_time_bound``.

    Args (keyword-only):
        devices: n, an int >= 1. weight_bytes, n_params, batch, kv_bytes_per_sequence, bandwidth,
            peak_flops, attention_flops_per_sequence: the whole model's, as ``step_time_bound``
            (bandwidth and peak_flops are one device's). n_layers, d_model: ints > 0.
        link_bandwidth: one direction of one device's link, bytes/s (``TP_LINKS``).
        link_latency_s: seconds per ring step (>= 0; 0 leaves latency out).
        activation_bytes: bytes of one activation value (2 for bf16).
    Returns: a TensorParallelBound (seconds, bytes).
    Raises: ValueError naming the argument on non-positive sizes or a negative latency.
    """
    n = positive_integer("devices", devices)
    L = positive_integer("n_layers", n_layers)
    d = positive_integer("d_model", d_model)
    link = positive_number("link_bandwidth", link_bandwidth)
    alpha = nonnegative_number("link_latency_s", link_latency_s)
    act = positive_number("activation_bytes", activation_bytes)
    share = step_time_bound(
        weight_bytes=positive_number("weight_bytes", weight_bytes) / n,
        n_params=positive_number("n_params", n_params) / n, batch=batch,
        kv_bytes_per_sequence=nonnegative_number("kv_bytes_per_sequence", kv_bytes_per_sequence) / n,
        bandwidth=bandwidth, peak_flops=peak_flops,
        attention_flops_per_sequence=nonnegative_number("attention_flops_per_sequence",
                                                        attention_flops_per_sequence) / n)
    message = batch * d * act
    all_reduces = 2 * L
    sent = all_reduces * 2 * (n - 1) / n * message
    communication = all_reduces * 2 * (n - 1) * alpha + sent / link
    return TensorParallelBound(devices=n, per_device=share, all_reduce_bytes=message, sent_bytes=sent,
                               communication_s=communication, bound_s=share.bound_s + communication)


# -- arithmetic intensity ------------------------------------------------------------------
def gemv_intensity(m: int, n: int, bytes_per_element: float) -> float:
    """FLOP/byte of y = W x, W (m x n): 2mn / (b (mn + m + n)) (one read of W and x, one
    write of y); ~ 2/b for large m, n. Raises: ValueError on non-positive sizes."""
    positive_integer("m", m), positive_integer("n", n)
    b = positive_number("bytes_per_element", bytes_per_element)
    return 2 * m * n / (b * (m * n + m + n))


def gemm_intensity(m: int, n: int, batch: int, bytes_per_element: float) -> float:
    """FLOP/byte of Y = W X, W (m x n), X (n x B): 2mnB / (b (mn + nB + mB)) (one read of each
    input, one write of the output); ~ 2B/b while B << m, n. Raises: ValueError on bad sizes."""
    positive_integer("m", m), positive_integer("n", n), positive_integer("batch", batch)
    b = positive_number("bytes_per_element", bytes_per_element)
    return 2 * m * n * batch / (b * (m * n + n * batch + m * batch))


def decode_attention_intensity(group_size: int, bytes_per_value: float) -> float:
    """FLOP/byte of decode attention against a KV cache: each cached K/V pair (2*d_head*b
    bytes per KV head) feeds 4*d_head FLOPs per query head of the group -> 2*g/b,
    independent of batch and context (4 for g = 4 with a bf16 cache).
    Raises: ValueError on non-positive arguments."""
    g = positive_integer("group_size", group_size)
    b = positive_number("bytes_per_value", bytes_per_value)
    return 2 * g / b


# -- measurement -----------------------------------------------------------------------------
#: Column counts B of the CPU measurement: 1, 2, 4, ..., 512.
DEFAULT_BATCHES: tuple[int, ...] = tuple(2 ** k for k in range(10))


def measure_matmul(d: int = 4096, batches=DEFAULT_BATCHES, warmup: int = 2, repeats: int = 7,
                   dtype=None, progress: bool = True, seed: int = 0):
    """Time Y = W @ X with W (d x d) and X (d x B) on the CPU for each B in ``batches``.

    Each B gets ``warmup`` untimed calls, then ``repeats`` timed calls (``time.perf_counter``
    around one ``torch.mm`` into a preallocated output); the median is kept. Derived columns:
    flops = 2*d*d*B; bytes = b*(d*d + d*B + d*B) (one read of each input, one write of the
    output, b bytes per element); intensity = flops / bytes (FLOP/byte); gflop_s and gb_s are
    flops and bytes per median second / 1e9 (``docs/roofline.md#cpu-measurement``).

    Pick ``d`` so that W (4*d*d bytes in float32) is larger than the last-level cache, or
    B = 1 measures the cache rather than DRAM: the default d = 4096 is 64 MiB of float32.

    Args:
        d: width (int > 0). batches: increasing positive ints. warmup: int >= 0.
        repeats: int > 0. dtype: a floating torch dtype (default float32). progress: show
        a tqdm bar. seed: for the random W and X.
    Returns:
        pandas DataFrame with columns ``batch, seconds, flops, bytes, intensity, gflop_s,
        gb_s``; ``df.attrs`` holds ``d``, ``dtype``, ``threads`` (torch's intra-op threads),
        ``repeats`` and ``warmup``.
    Raises:
        ValueError: non-positive d/repeats, negative warmup, empty or non-increasing batches,
            a non-floating dtype.
    """
    import time

    import pandas as pd
    import torch

    d = positive_integer("d", d)
    batches = [positive_integer("batches[]", b) for b in batches]
    if not batches or any(b2 <= b1 for b1, b2 in zip(batches, batches[1:])):
        raise ValueError(f"batches must be a non-empty increasing sequence, got {batches!r}")
    warmup = nonnegative_integer("warmup", warmup)
    repeats = positive_integer("repeats", repeats)
    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(d, d, generator=gen).to(dtype)
    rows = []
    bar = batches
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(batches, desc=f"W({d}x{d}) @ X({d}xB)", unit="B")
    for B in bar:
        X = torch.randn(d, B, generator=gen).to(dtype)
        Y = torch.empty(d, B, dtype=dtype)
        for _ in range(warmup):
            torch.mm(W, X, out=Y)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(W, X, out=Y)
            times.append(time.perf_counter() - t0)
        seconds = sorted(times)[len(times) // 2] if repeats % 2 else \
            sum(sorted(times)[repeats // 2 - 1: repeats // 2 + 1]) / 2
        flops = 2 * d * d * B
        nbytes = itemsize * (d * d + 2 * d * B)
        rows.append({"batch": B, "seconds": seconds, "flops": flops, "bytes": nbytes,
                     "intensity": flops / nbytes, "gflop_s": flops / seconds / 1e9,
                     "gb_s": nbytes / seconds / 1e9})
    df = pd.DataFrame(rows, columns=["batch", "seconds", "flops", "bytes", "intensity", "gflop_s", "gb_s"])
    df.attrs.update(d=d, dtype=str(dtype), threads=torch.get_num_threads(), repeats=repeats, warmup=warmup)
    return df


@dataclass(frozen=True)
class GemvBandwidth:
    """What ``measure_gemv_bandwidth`` measured: ``bandwidth`` in bytes/s (the bytes of one pass over the
    median time of a pass), ``streamed_bytes`` per pass, the matrix height ``d``, ``matrices`` per pass,
    ``threads`` and the ``course_lib.timing.Timing`` of a pass (seconds)."""

    bandwidth: float
    streamed_bytes: int
    d: int
    matrices: int
    threads: int
    timing: "Timing"

    def floor_s(self, weight_bytes: float) -> float:
        """The weight-streaming floor of a decode step: ``weight_bytes`` / ``bandwidth``, in seconds.
        Raises: ValueError for weight_bytes <= 0."""
        return positive_number("weight_bytes", weight_bytes) / self.bandwidth


def measure_gemv_bandwidth(total_bytes: float = 538e6, d: int = 4096, warmup: int = 2, repeats: int = 9,
                           seed: int = 0) -> GemvBandwidth:
    """The bandwidth a large float32 matrix-vector product reaches on this CPU, over more bytes than a
    typical last-level cache holds: the floor that a decode step, which streams every weight once, is
    measured against (``docs/decoder_performance.md#the-floor``; Lab 1 section 9, Lab 6's batch sweep and
    ``python -m course_lib.models.bench``).

    One pass computes ``x @ W_i`` (x of 1 x d) for float32 matrices ``W_i`` of d rows, one after another:
    d x d ones, then one narrower matrix for the rest, so that a pass streams ``total_bytes`` rounded up
    to a whole column. Give the model's weight bytes: the same bytes a decode step streams, too many for
    the cache when they exceed it (one 64 MiB matrix read again and again fits some servers' caches, and
    then measures the cache, not memory). Runs on the CPU. Timing: ``course_lib.timing.measure``
    (``warmup`` passes, then the median of ``repeats``).

    Args:
        total_bytes: bytes to stream per pass (a number > 0; default: about SmolLM2-135M's float32 weights).
        d: rows of each matrix (int > 0). warmup: int >= 0. repeats: int >= 1. seed: for the random matrices.

    Returns: a ``GemvBandwidth``.

    Raises:
        ArgumentTypeError: a total_bytes that is not a number, or d, warmup, repeats that are not ints.
        ValueError: total_bytes <= 0, d < 1, warmup < 0 or repeats < 1.
    """
    import torch

    from .timing import measure

    total_bytes = positive_number("total_bytes", total_bytes)
    d = positive_integer("d", d)
    columns = math.ceil(total_bytes / (4 * d))                       # float32 columns of d rows in all
    widths = [d] * (columns // d) + ([columns % d] if columns % d else [])
    gen = torch.Generator().manual_seed(seed)
    matrices = [torch.randn(d, w, generator=gen) for w in widths]      # each (in, out), contiguous
    x = torch.randn(1, d, generator=gen)

    def one_pass() -> None:
        for w in matrices:
            torch.mm(x, w)

    timing = measure(one_pass, "cpu", warmup=warmup, repeats=repeats)
    nbytes = 4 * d * columns
    return GemvBandwidth(nbytes / timing.median_s, nbytes, d, len(matrices), torch.get_num_threads(), timing)


@dataclass(frozen=True)
class MeasuredRoof:
    """A machine's roof estimated by ``estimate_roof``: ``bandwidth`` (bytes/s, from
    ``measure_gemv_bandwidth``, or the smallest B of ``measure_matmul``), ``peak_flops`` (FLOP/s, from
    the largest B) and ``ridge_point`` (FLOP/byte).
    These are *estimates*: the bandwidth comes from one kernel's streaming and the largest B may not
    saturate the cores, so the true roof is at least this high."""

    bandwidth: float
    peak_flops: float

    @property
    def ridge_point(self) -> float:
        return self.peak_flops / self.bandwidth


def estimate_roof(measurements, streaming: GemvBandwidth | None = None) -> MeasuredRoof:
    """Peak compute from the last row (largest B) of a ``measure_matmul`` table, and bandwidth from
    ``streaming`` (a ``measure_gemv_bandwidth`` result: a pass over more bytes than the caches hold) or,
    without it, from the table's first row (B = 1: one pass over one d x d W, which a large last-level
    cache may hold; ``docs/roofline.md#cpu-measurement``).

    Raises: ValueError if the table lacks the columns ``gb_s`` and ``gflop_s`` or is empty;
    ArgumentTypeError for a ``streaming`` that is not a GemvBandwidth."""
    cols = getattr(measurements, "columns", ())
    if "gb_s" not in cols or "gflop_s" not in cols or len(measurements) == 0:
        raise ValueError("estimate_roof needs a non-empty table from measure_matmul (columns gb_s, gflop_s)")
    if streaming is not None:
        bandwidth = instance("streaming", streaming, GemvBandwidth).bandwidth
    else:
        bandwidth = float(measurements["gb_s"].iloc[0]) * 1e9
    return MeasuredRoof(bandwidth=bandwidth, peak_flops=float(measurements["gflop_s"].iloc[-1]) * 1e9)
