"""Roofline bounds for LLM inference (course "Lab 1: roofline"; the notebook's engine and
what the graders use).

Units everywhere: bytes and decimal GB (1 GB = 1e9 bytes, never GiB), seconds, FLOPs,
bytes/s and FLOP/s. Every time returned here is a *bound* (a best case under the stated
assumptions), not a prediction.

Contents:
- model accounting on a ``ModelConfig``: ``n_matmul``, ``kv_bytes_per_token``,
  ``serving_file_bytes`` (mixed int4-g128 / bf16 / int8 format), the spec's ``case_model``;
- time bounds: ``prefill_time`` (compute at MFU), ``decode_step_bound`` (max of memory and
  compute time), ``capacity_table`` (per-device TTFT, batch and throughput);
- the per-token cost calculator of the spec's 70B example: ``weight_bytes_for_format``,
  ``kv_bytes_per_sequence``, ``step_time_bound``, ``verification_cost_ratio``,
  ``expected_tokens_per_step``, ``speculative_speedup``, ``smallest_compute_bound_batch``;
- arithmetic intensity: ``gemv_intensity``, ``gemm_intensity``, ``decode_attention_intensity``;
- measurement: ``measure_matmul`` (W (d x d) @ X (d x B) on this machine) and
  ``estimate_roof`` (bandwidth from B = 1, peak from the largest B, ridge).

Every function raises ``ValueError`` naming the argument on bad input (non-positive sizes,
an unknown format, ``mfu`` outside (0, 1], ...).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral

from .hardware import REFERENCE_DEVICES, Accelerator, get_device
from .models.config import ModelConfig
from .validation import (instance, nonnegative_integer, nonnegative_number, number, positive_integer,
                         positive_number)

__all__ = [
    "CASE_WEIGHT_BYTES", "FORMAT_BITS", "StepBound", "case_model", "n_matmul", "kv_bytes_per_token",
    "serving_file_bytes", "default_weight_bytes", "requests_that_fit", "prefill_flops", "prefill_time", "decode_step_flops",
    "decode_step_bound", "capacity_table", "weight_bytes_for_format", "kv_bytes_per_sequence",
    "step_time_bound", "verification_cost_ratio", "expected_tokens_per_step", "speculative_speedup",
    "smallest_compute_bound_batch", "gemv_intensity", "gemm_intensity", "decode_attention_intensity",
    "DEFAULT_BATCHES", "measure_matmul", "MeasuredRoof", "estimate_roof",
]

#: Weight-file bytes of the case model used in every bound (spec: "5.5e9 bytes in the bounds").
CASE_WEIGHT_BYTES: float = 5.5e9

#: Bits per weight of the 70B calculator's formats (int4 g128: 4 bits + scale overhead = 4.15).
FORMAT_BITS: dict[str, float] = {"bf16": 16.0, "fp8": 8.0, "int4-g128": 4.15}


# -- argument checks -----------------------------------------------------------------------
def _device(name: str, value) -> Accelerator:
    try:
        return get_device(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


# -- model accounting ----------------------------------------------------------------------
def case_model() -> ModelConfig:
    """The spec's case model: 36 layers, d 4096, 32 query / 8 KV heads of 128, SwiGLU 15,360,
    vocab 152,064, untied. N = 9,550,729,216; N_matmul = 8,927,875,072 (COURSE_SPEC "Lab 1").
    ``max_seq_len`` is left at the ModelConfig default (the spec gives none; no bound uses it)."""
    return ModelConfig(n_layers=36, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=15360,
                       vocab_size=152064, tie_embeddings=False)


def n_matmul(config: ModelConfig) -> int:
    """Parameters that take part in a matrix multiply per token.

    ``config.parameters()`` minus the *untied* input embedding (a lookup is not a multiply);
    the output head stays. With tied embeddings the shared matrix is counted once, as the
    head, so N_matmul = parameters. (Norm vectors are kept, as in the spec's figure.)

    Returns: an exact int. Raises: ValueError if ``config`` is not a ModelConfig.
    """
    config = instance("config", config, ModelConfig)
    embedding = 0 if config.tie_embeddings else config.vocab_size * config.d_model
    return config.parameters() - embedding


def kv_bytes_per_token(config: ModelConfig, bytes_per_value: int | float = 2):
    """KV-cache bytes one position costs: 2 (K and V) * L * n_kv * d_head * bytes_per_value.

    Returns: an int for an int ``bytes_per_value`` (exact), else a float (e.g. 0.5 for int4).
    Raises: ValueError for a non-ModelConfig or a non-positive ``bytes_per_value``.
    """
    config = instance("config", config, ModelConfig)
    positive_number("bytes_per_value", bytes_per_value)
    return config.kv_bytes_per_token(bytes_per_value)


def serving_file_bytes(config: ModelConfig, linear_bits: float = 4.125, norm_bits: float = 16,
                       embedding_bits: float = 8) -> float:
    """Bytes of a mixed-format serving file, before packaging metadata.

    Block linear weights (q, k, v, o and the three SwiGLU projections) at ``linear_bits``
    (default 4.125 = int4 plus one fp16 scale per 128 weights), RMSNorm vectors (2 per block
    plus the final norm) at ``norm_bits`` (bf16), embedding table(s) at ``embedding_bits``
    (input embedding and, when untied, the output head; a tied table once). The spec's case
    model gives 5,528,428,544 bytes = 5.528429 GB.

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


def default_weight_bytes(model: ModelConfig) -> float:
    """Weight bytes the bounds use when none is given: ``CASE_WEIGHT_BYTES`` (5.5e9) for the
    case model (as the spec fixes), otherwise ``serving_file_bytes(model)``."""
    model = instance("model", model, ModelConfig)
    return CASE_WEIGHT_BYTES if model == case_model() else serving_file_bytes(model)


# -- time bounds ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StepBound:
    """A roofline bound on one step: ``bound_s = max(memory_s, compute_s)`` in seconds.

    ``binding`` is "compute" when compute_s >= memory_s, else "memory"; ``bytes_moved`` and
    ``flops`` are the numerators of the two times."""

    memory_s: float
    compute_s: float
    bound_s: float
    binding: str
    bytes_moved: float
    flops: float

    @classmethod
    def from_terms(cls, bytes_moved: float, bandwidth: float, flops: float, peak: float) -> "StepBound":
        memory_s, compute_s = bytes_moved / bandwidth, flops / peak
        return cls(memory_s=memory_s, compute_s=compute_s, bound_s=max(memory_s, compute_s),
                   binding="compute" if compute_s >= memory_s else "memory",
                   bytes_moved=bytes_moved, flops=flops)


def prefill_flops(model: ModelConfig, tokens: int) -> int:
    """FLOPs of a prefill of ``tokens`` positions, simplified form: 2*N_matmul*t + 2*L*d*t^2.

    Raises: ValueError for a non-positive ``tokens``."""
    model = instance("model", model, ModelConfig)
    t = positive_integer("tokens", tokens)
    return 2 * n_matmul(model) * t + 2 * model.n_layers * model.d_model * t * t


def prefill_time(model: ModelConfig, device, tokens: int, mfu: float = 0.5,
                 weight_bytes: float | None = None) -> float:
    """Bound on prefill time (time to first token) in seconds.

    (2*N_matmul*t + 2*L*d*t^2) / (mfu * peak). If ``weight_bytes`` is given the bound also
    cannot be below one read of the weights: max(that, weight_bytes / bandwidth); by default
    (None) it is the spec's compute-only formula.

    Args:
        model: a ModelConfig. device: an Accelerator or a name in ``hardware.DEVICES``.
        tokens: prompt positions t (> 0). mfu: model FLOP utilisation in (0, 1].
    Raises:
        ValueError: bad model/device, tokens <= 0, mfu outside (0, 1], weight_bytes <= 0.
    """
    dev = _device("device", device)
    mfu = number("mfu", mfu, minimum=0, maximum=1, open_minimum=True)
    seconds = prefill_flops(model, tokens) / (mfu * dev.peak_flops)
    if weight_bytes is not None:
        seconds = max(seconds, positive_number("weight_bytes", weight_bytes) / dev.bandwidth)
    return seconds


def decode_step_flops(model: ModelConfig, batch: int, context: float) -> float:
    """FLOPs of one decode step: 2*N_matmul*batch + 4*L*d*batch*context."""
    model = instance("model", model, ModelConfig)
    b = positive_integer("batch", batch)
    c = positive_number("context", context)
    return 2 * n_matmul(model) * b + 4 * model.n_layers * model.d_model * b * c


def decode_step_bound(model: ModelConfig, device, batch: int, context: float, kv_bytes_per_value=2,
                      weight_bytes: float | None = None) -> StepBound:
    """Bound on one decode step of ``batch`` sequences each at ``context`` cached positions.

    memory = (weight_bytes + batch * kv_per_token * context) / bandwidth;
    compute = (2*N_matmul*batch + 4*L*d*batch*context) / peak (no MFU: optimistic);
    bound = max(memory, compute) (the weight read is shared, so max, not sum).

    Args:
        weight_bytes: bytes of the weight file; None -> ``default_weight_bytes(model)``
            (5.5e9 for the case model). context may be fractional (an average).
    Returns: a StepBound (seconds). Raises: ValueError on non-positive sizes or bad types.
    """
    model = instance("model", model, ModelConfig)
    dev = _device("device", device)
    b = positive_integer("batch", batch)
    c = positive_number("context", context)
    kv = kv_bytes_per_token(model, kv_bytes_per_value)
    w = default_weight_bytes(model) if weight_bytes is None else positive_number("weight_bytes", weight_bytes)
    return StepBound.from_terms(w + b * kv * c, dev.bandwidth, decode_step_flops(model, b, c), dev.peak_flops)


def requests_that_fit(model: ModelConfig, device, prompt_tokens: int, output_tokens: int,
                      overhead_gb: float = 2.5, weight_bytes: float | None = None, kv_bytes_per_value=2) -> int:
    """Full-length requests whose KV cache fits at once (COURSE_SPEC "Lab 1", capacity planning):
    floor(free / (kv_per_token * (prompt + output))) with free = capacity - weights - overhead,
    all in decimal bytes (1 GB = 1e9); 0 when the weights and overhead leave nothing.

    Args:
        weight_bytes: None -> ``default_weight_bytes(model)``. overhead_gb: decimal GB (>= 0).
    Returns: an int >= 0. Raises: ValueError on non-positive sizes or a negative overhead."""
    model = instance("model", model, ModelConfig)
    dev = _device("device", device)
    prompt = positive_integer("prompt_tokens", prompt_tokens)
    output = positive_integer("output_tokens", output_tokens)
    overhead = nonnegative_number("overhead_gb", overhead_gb)
    w = default_weight_bytes(model) if weight_bytes is None else positive_number("weight_bytes", weight_bytes)
    free = dev.capacity_bytes - w - overhead * 1e9
    return max(0, math.floor(free / (kv_bytes_per_token(model, kv_bytes_per_value) * (prompt + output))))


def capacity_table(model: ModelConfig | None = None, devices=None, prompt_tokens: int = 4000,
                   output_tokens: int = 2000, overhead_gb: float = 2.5, mfu: float = 0.5,
                   weight_bytes: float | None = None, kv_bytes_per_value=2):
    """Per-device serving bounds for full-length requests, as a pandas DataFrame.

    Columns ``device, free_gb, batch, ttft_s, solo_tok_s, batch_tok_s``:
    - free_gb = capacity - weights - overhead (decimal GB; negative if the weights don't fit);
    - batch = floor(free / (kv_per_token * (prompt + output))), 0 if nothing fits;
    - ttft_s = prefill_time(prompt) at ``mfu``;
    - decode context = prompt + output / 2 (the mean over a request's output);
    - solo_tok_s = 1 / step(batch 1); batch_tok_s = batch / step(max(1, batch)) (0 if batch 0).

    Args:
        model: defaults to ``case_model()``. devices: Accelerators or names (default the five
            ``REFERENCE_DEVICES``). weight_bytes: override (e.g. 2 * N for all-bf16); None ->
            ``default_weight_bytes(model)``.
    Raises: ValueError on non-positive sizes, negative overhead, mfu outside (0, 1], empty devices.
    """
    import pandas as pd

    model = case_model() if model is None else instance("model", model, ModelConfig)
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
    w = default_weight_bytes(model) if weight_bytes is None else positive_number("weight_bytes", weight_bytes)
    context = prompt + output / 2
    rows = []
    for dev in devs:
        free = dev.capacity_bytes - w - overhead * 1e9
        batch = requests_that_fit(model, dev, prompt, output, overhead, w, kv_bytes_per_value)
        solo = decode_step_bound(model, dev, 1, context, kv_bytes_per_value, w).bound_s
        full = decode_step_bound(model, dev, max(1, batch), context, kv_bytes_per_value, w).bound_s
        rows.append({"device": dev.name, "free_gb": free / 1e9, "batch": batch,
                     "ttft_s": prefill_time(model, dev, prompt, mfu), "solo_tok_s": 1 / solo,
                     "batch_tok_s": batch / full})
    return pd.DataFrame(rows, columns=["device", "free_gb", "batch", "ttft_s", "solo_tok_s", "batch_tok_s"])


# -- per-token cost calculator (the spec's 70B example) ------------------------------------
def weight_bytes_for_format(n_params: int, fmt: str) -> float:
    """Weight bytes of ``n_params`` weights stored as ``fmt``: n_params * bits / 8.

    Formats (``FORMAT_BITS``): "bf16" 16, "fp8" 8, "int4-g128" 4.15 bits/weight. For 70e9
    parameters: 140.0 GB, 70.0 GB, 36.3125 GB. Returns a float (bytes).
    Raises: ValueError for non-positive ``n_params`` or an unknown ``fmt``."""
    n = positive_integer("n_params", n_params) if isinstance(n_params, Integral) else \
        positive_number("n_params", n_params)
    if fmt not in FORMAT_BITS:
        raise ValueError(f"fmt must be one of {sorted(FORMAT_BITS)}, got {fmt!r}")
    return n * FORMAT_BITS[fmt] / 8


def kv_bytes_per_sequence(n_layers: int, n_kv_heads: int, head_dim: int, context: int,
                          bytes_per_value: int | float = 2):
    """KV bytes of one sequence: 2 * L * n_kv * d_head * bytes_per_value * context.

    80 layers, 8 KV heads of 128, 2,048 positions, bf16 -> 671,088,640 bytes. Exact int for
    an int ``bytes_per_value``. Raises: ValueError on non-positive sizes."""
    for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                    ("context", context)):
        positive_integer(name, v)
    positive_number("bytes_per_value", bytes_per_value)
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_value * context


def step_time_bound(weight_bytes: float, n_params: int, batch: int, kv_bytes_per_sequence: float,
                    bandwidth: float, peak_flops: float, positions_per_sequence: int = 1) -> StepBound:
    """Bound on one target-model step (the 70B calculator's simplified form).

    memory = (weight_bytes + batch * kv_bytes_per_sequence) / bandwidth;
    compute = 2 * n_params * batch * positions_per_sequence / peak_flops; bound = max.

    Args:
        bandwidth: bytes/s (3.0 TB/s -> 3.0e12). peak_flops: FLOP/s (1,000 TFLOP/s -> 1e15).
        kv_bytes_per_sequence: may be 0 (weights-only floor).
        positions_per_sequence: positions scored per sequence (gamma + 1 when verifying).
    Raises: ValueError on non-positive sizes (negative KV bytes).
    """
    w = positive_number("weight_bytes", weight_bytes)
    n = positive_number("n_params", n_params)
    b = positive_integer("batch", batch)
    kv = nonnegative_number("kv_bytes_per_sequence", kv_bytes_per_sequence)
    bw = positive_number("bandwidth", bandwidth)
    peak = positive_number("peak_flops", peak_flops)
    p = positive_integer("positions_per_sequence", positions_per_sequence)
    return StepBound.from_terms(w + b * kv, bw, 2 * n * b * p, peak)


def verification_cost_ratio(weight_bytes: float, n_params: int, batch: int, kv_bytes_per_sequence: float,
                            bandwidth: float, peak_flops: float, gamma: int) -> float:
    """Cost of a target step scoring gamma + 1 positions per sequence relative to a plain
    one-position step: bound(positions = gamma + 1) / bound(positions = 1). 1.0 while both
    are memory-bound; grows towards gamma + 1 once compute binds.
    Raises: ValueError on bad sizes or a negative ``gamma``."""
    g = nonnegative_integer("gamma", gamma)
    args = (weight_bytes, n_params, batch, kv_bytes_per_sequence, bandwidth, peak_flops)
    return step_time_bound(*args, positions_per_sequence=g + 1).bound_s / step_time_bound(*args).bound_s


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Expected tokens emitted per target step with gamma drafted tokens, each accepted with
    probability alpha independently: (1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 at alpha 1.
    Raises: ValueError for alpha outside [0, 1] or a negative gamma."""
    number("alpha", alpha, minimum=0, maximum=1)
    g = nonnegative_integer("gamma", gamma)
    if alpha == 1:
        return float(g + 1)
    return (1 - alpha ** (g + 1)) / (1 - alpha)


def speculative_speedup(alpha: float, gamma: int, verification_ratio: float = 1.0,
                        draft_cost: float = 0.0) -> float:
    """Bound on speculative decoding's speedup over plain decoding:
    expected_tokens_per_step(alpha, gamma) / (gamma * draft_cost + verification_ratio),
    where verification_ratio (from ``verification_cost_ratio``) replaces the classic 1 and
    draft_cost is one draft step's time relative to a plain target step (0: free draft).
    Raises: ValueError for a non-positive verification_ratio or a negative draft_cost."""
    e = expected_tokens_per_step(alpha, gamma)
    r = positive_number("verification_ratio", verification_ratio)
    c = nonnegative_number("draft_cost", draft_cost)
    return e / (gamma * c + r)


def smallest_compute_bound_batch(weight_bytes: float, n_params: int, kv_bytes_per_sequence: float,
                                 bandwidth: float, peak_flops: float,
                                 positions_per_sequence: int = 1) -> int | None:
    """Smallest batch at which ``step_time_bound`` is compute-bound (compute_s >= memory_s).

    Solves batch * (2*N*P/peak - KV/bandwidth) >= weight_bytes / bandwidth. Returns None when
    the per-sequence KV read grows at least as fast as per-sequence compute (the step never
    turns compute-bound, e.g. 70B bf16 with a 2,048-position bf16 cache at P = 1).
    Raises: ValueError on bad sizes."""
    args = (weight_bytes, n_params)
    step_time_bound(*args, 1, kv_bytes_per_sequence, bandwidth, peak_flops, positions_per_sequence)
    slope = 2 * n_params * positions_per_sequence / peak_flops - kv_bytes_per_sequence / bandwidth
    if slope <= 0:
        return None

    def is_compute(b: int) -> bool:
        s = step_time_bound(*args, b, kv_bytes_per_sequence, bandwidth, peak_flops, positions_per_sequence)
        return s.binding == "compute"

    batch = max(1, math.ceil((weight_bytes / bandwidth) / slope))
    while batch > 1 and is_compute(batch - 1):  # guard against float rounding in the ceil
        batch -= 1
    while not is_compute(batch):
        batch += 1
    return batch


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
    flops and bytes per median second / 1e9. Source: COURSE_SPEC "Lab 1" (CPU measurement).

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
class MeasuredRoof:
    """A machine's roof estimated from ``measure_matmul``: ``bandwidth`` (bytes/s, from the
    smallest B), ``peak_flops`` (FLOP/s, from the largest B) and ``ridge_point`` (FLOP/byte).
    These are *estimates*: the B = 1 point also does some arithmetic and the largest B may not
    saturate the cores, so the true roof is at least this high."""

    bandwidth: float
    peak_flops: float

    @property
    def ridge_point(self) -> float:
        return self.peak_flops / self.bandwidth


def estimate_roof(measurements) -> MeasuredRoof:
    """Bandwidth from the first row (B = 1: one pass over W, memory-bound) and peak compute
    from the last row (largest B) of a ``measure_matmul`` table (COURSE_SPEC "Lab 1").

    Raises: ValueError if the table lacks the columns ``gb_s`` and ``gflop_s`` or is empty."""
    cols = getattr(measurements, "columns", ())
    if "gb_s" not in cols or "gflop_s" not in cols or len(measurements) == 0:
        raise ValueError("estimate_roof needs a non-empty table from measure_matmul (columns gb_s, gflop_s)")
    return MeasuredRoof(bandwidth=float(measurements["gb_s"].iloc[0]) * 1e9,
                        peak_flops=float(measurements["gflop_s"].iloc[-1]) * 1e9)
