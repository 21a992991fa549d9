"""Graded checks for Lab 1 (roofline).

Each ``check_*`` takes the learner's *function(s)*, draws model configs and devices from a
seed (fixed for the visible checks, ``fresh_seed()`` for hidden tests), calls the function,
and compares the result with ``course_lib.roofline`` under a course contract:

- counts and bytes are exact ints (``check_int`` / ``check_bytes``);
- times and intensities agree to 4 significant figures (``check_significant``).

When a contract fails, the checker evaluates the known faults of Lab 1 on the same inputs and
names the one the learner's number equals (the untied input embedding counted in N_matmul,
K and V counted once, query heads instead of KV heads, binary GiB for decimal GB, memory time
plus compute time instead of their max, ...), so the message names the symptom.

Learner signatures, the same as ``course_lib.roofline``'s functions of the same name (sizes are
plain ints; a device is a ``course_lib.hardware.Device``: memory in bytes, bandwidth in bytes/s,
peak_flops in FLOP/s; the checkers pass the arguments after ``*`` by keyword):
    count_parameters(config) -> (n_params: int, n_matmul: int)
    kv_bytes_per_token(config, bytes_per_value) -> int
    prefill_time(config, device, tokens, mfu) -> float seconds
    decode_step_bound(config, device, *, batch, context, weight_bytes, kv_bytes_per_value) -> float seconds
    gemv_intensity(m, n, bytes_per_element) -> float FLOP/byte
    gemm_intensity(m, n, batch, bytes_per_element) -> float FLOP/byte
    requests_that_fit(config, device, *, weight_bytes, prompt_tokens, output_tokens, overhead_gb,
                      kv_bytes_per_value) -> int
    gemv_kernel: a @triton.jit kernel (w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M, BLOCK_N),
                 launched by course_lib.kernels.exercise.launch_gemv
"""
from __future__ import annotations

import math
import random
from typing import Callable

import torch

from .. import roofline as ref
from ..hardware import Device
from ..kernels.gemv import reference_gemv
from ..models.config import ModelConfig
from .contracts import (ContractError, attempts, check_bytes, check_int, check_own_function, check_real,
                        check_significant, check_tensor, close, diagnose, significant_tolerance)
from .kernel_checks import check_all_stored, launch_case, raise_if_bfloat16_arithmetic
from .tables import Contract, Edit, Fault, check_tables

__all__ = ["random_config", "random_device", "kv_terms", "check_parameter_count", "check_kv_bytes_per_token",
           "check_prefill_time", "check_decode_step_bound", "check_gemv_intensity", "check_gemm_intensity",
           "check_requests_that_fit", "check_gemv_kernel", "gemv_kernel_cases", "GEMV_BLOCKS"]

FIGURES = 4  # "times to 4 significant figures"
GIB = 2 ** 30


# -- inputs -----------------------------------------------------------------------------------
def random_config(rng: random.Random, tied: bool | None = None, gqa: bool = True,
                  square: bool | None = None) -> ModelConfig:
    """A Llama-shaped config with sizes drawn from ``rng``: 1-96 layers, 2-64 query heads of
    32-256, KV heads a proper divisor of the query heads when ``gqa`` (so query heads != KV
    heads), SwiGLU width 1-4x the model width, vocab 1,000-260,000. ``square``: True makes
    d_model = n_heads * head_dim (so attention FLOPs counted with d_model or with
    n_heads * head_dim agree); False makes them differ (so q/o sized d x d is caught); None
    draws True 80 % of the time."""
    head_dim = rng.choice([32, 64, 64, 128, 128, 256])
    n_heads = rng.choice([2, 4, 6, 8, 12, 16, 24, 32, 48, 64])
    if square is None:
        square = rng.random() < 0.8
    d_model = head_dim * n_heads
    if not square:
        d_model = 64 * rng.randint(4, 256)
        if d_model == head_dim * n_heads:
            d_model += 64
    divisors = [k for k in range(1, n_heads + 1) if n_heads % k == 0 and (k < n_heads or not gqa)]
    return ModelConfig(n_layers=rng.randint(1, 96), d_model=d_model, n_heads=n_heads,
                       n_kv_heads=rng.choice(divisors), head_dim=head_dim,
                       d_ff=64 * rng.randint(max(1, d_model // 64), 4 * max(1, d_model // 64)),
                       vocab_size=rng.randint(1000, 260_000),
                       tie_embeddings=rng.random() < 0.5 if tied is None else tied)


def wide_heads_config(rng: random.Random) -> ModelConfig:
    """A config whose query heads are twice the model width (n_heads * head_dim = 2 * d_model, as in
    Qwen3-0.6B): 8-48 layers, 16 or 32 heads of 64 or 128, a small vocabulary (1,000-4,000) so the
    attention projections are a large share of N_matmul. An attention term counted with d_model
    and W_q/W_o sized d x d are then both off by a share no rounding hides."""
    n_heads, head_dim = rng.choice([16, 32]), rng.choice([64, 128])
    d_model = n_heads * head_dim // 2
    return ModelConfig(n_layers=rng.randint(8, 48), d_model=d_model, n_heads=n_heads,
                       n_kv_heads=rng.choice([k for k in (1, 2, 4, 8) if n_heads % k == 0]), head_dim=head_dim,
                       d_ff=64 * rng.randint(d_model // 64, 4 * d_model // 64), vocab_size=rng.randint(1000, 4000),
                       tie_embeddings=rng.random() < 0.5)


def random_device(rng: random.Random) -> Device:
    """A device with capacity 16-192 GB, bandwidth 0.2-8 TB/s and 50-2500 dense TFLOP/s, rounded
    like a datasheet (three significant figures) and converted to bytes, B/s and FLOP/s."""
    def sig3(x: float) -> float:
        return float(f"{x:.3g}")
    return Device.from_datasheet(f"device-{rng.randrange(10**6)}", capacity_gb=sig3(rng.uniform(16, 192)),
                                 bandwidth_tbps=sig3(rng.uniform(0.2, 8.0)), dense_tflops=sig3(rng.uniform(50, 2500)),
                                 source="drawn by the Lab 1 grader")


def _describe(config: ModelConfig) -> str:
    return (f"L {config.n_layers}, d {config.d_model}, {config.n_heads} query / {config.n_kv_heads} KV heads of "
            f"{config.head_dim}, d_ff {config.d_ff}, vocab {config.vocab_size}, "
            f"{'tied' if config.tie_embeddings else 'untied'}")


def _device_text(device: Device) -> str:
    return f"{device.memory / 1e9:g} GB, {device.bandwidth / 1e12:g} TB/s, {device.peak_flops / 1e12:g} TFLOP/s"


def _same_figures(got: float, candidate: float) -> bool:
    """A fault variant's time or intensity equals the learner's to the contract's 4 figures."""
    return close(got, candidate, rel=significant_tolerance(FIGURES))


def _same_int(got, candidate) -> bool:
    """An exact count: only a plain int is compared, so a rigged object is never diagnosed."""
    return type(got) is int and got == candidate


# -- exercise 1: parameters and N_matmul -------------------------------------------------------
def check_parameter_count(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(config) returns (N, N_matmul) as exact ints, N counting every parameter (a tied
    table once) and N_matmul leaving out an *untied* input embedding (``docs/roofline.md#counting-rule``)."""
    check_own_function("count_parameters", fn)
    rng = random.Random(seed)
    for case in range(cases):
        # case 0 untied, case 1 tied, case 2 with d_model != n_heads * head_dim
        config = random_config(rng, tied=[False, True, None][case] if case < 3 else None,
                               square=False if case == 2 else None)
        what = f"count_parameters(case {case}: {_describe(config)})"
        out = fn(config)
        if type(out) not in (tuple, list) or len(out) != 2:
            raise ContractError(f"{what} must return a tuple (n_params, n_matmul), got {type(out).__qualname__}")
        n_params, n_mm = check_int(f"{what}[0]", out[0]), check_int(f"{what}[1]", out[1])
        d, V, L = config.d_model, config.vocab_size, config.n_layers
        q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        expected_n, expected_mm = config.parameters(), ref.n_matmul(config)
        table = V * d
        for got, expected, label in ((n_params, expected_n, "n_params"), (n_mm, expected_mm, "n_matmul")):
            if got == expected:
                continue
            err = ContractError(f"{what}: {label} expected {expected:,}, got {got:,} "
                                f"(difference {got - expected:+,})")
            raise diagnose(err, got, {
                "the untied input embedding counted in N_matmul (an embedding lookup is not a multiply)":
                    lambda: expected_mm + (0 if config.tie_embeddings else table) if label == "n_matmul" else None,
                "a tied embedding counted twice (input table and output head are one matrix)":
                    lambda: expected + (table if config.tie_embeddings else 0),
                "the output head left out (it is a d x vocab matrix multiply)":
                    lambda: expected - (0 if config.tie_embeddings and label == "n_params" else table),
                "W_q and W_o sized d x d instead of d x n_heads*d_head (and n_heads*d_head x d)":
                    lambda: expected + 2 * L * d * (d - q),
                "k and v projections sized with query heads (d x n_heads*d_head instead of d x n_kv*d_head)":
                    lambda: expected + 2 * L * d * (q - kv),
                "RMSNorm vectors left out (2 per block plus the final norm)":
                    lambda: expected - (2 * L * d + d),
                "the final norm left out": lambda: expected - d,
                "two SwiGLU projections instead of three (the gate is missing)":
                    lambda: expected - L * d * config.d_ff,
            }, _same_int)


# -- exercise 2: KV bytes per token ------------------------------------------------------------
def kv_terms(config: ModelConfig, bytes_per_value) -> dict:
    """Factors of KV bytes per token: 2 (K and V) * L * n_kv * d_head * bytes per value."""
    return {"K and V": 2, "layers": config.n_layers, "KV heads": config.n_kv_heads,
            "head_dim": config.head_dim, "bytes per value": bytes_per_value}


def check_kv_bytes_per_token(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(config, bytes_per_value) == 2 * L * n_kv * d_head * bytes_per_value exactly
    (an int; configs always have fewer KV heads than query heads)."""
    check_own_function("kv_bytes_per_token", fn)
    rng = random.Random(seed)
    for case in range(cases):
        config = random_config(rng, gqa=True)
        nbytes = rng.choice([1, 2, 2, 4])
        what = f"kv_bytes_per_token(case {case}: {_describe(config)}, {nbytes} B/value)"
        got = fn(config, nbytes)
        try:
            check_bytes(got, kv_terms(config, nbytes), what=what)
        except ContractError as err:
            expected = math.prod(kv_terms(config, nbytes).values())
            raise diagnose(err, got, {
                "the factor 2 for K and V forgotten (the cache stores a key AND a value per head)":
                    lambda: expected // 2,
                f"query heads ({config.n_heads}) used instead of KV heads ({config.n_kv_heads}): "
                "with GQA only the KV heads are cached":
                    lambda: expected // config.n_kv_heads * config.n_heads,
                "both: query heads and no factor 2": lambda: expected // 2 // config.n_kv_heads * config.n_heads,
                "d_model used instead of n_kv * head_dim": lambda: expected // (config.n_kv_heads * config.head_dim)
                    * config.d_model,
            }, _same_int) from None


#: The diagnosis of an attention term counted with the model width d instead of the query heads' n_h*d_h.
ATTENTION_WITH_D_MODEL = ("attention counted with d_model (the model width) instead of the query heads' width "
                          "n_heads*head_dim")
#: The diagnosis of an N_matmul whose W_q and W_o are d x d instead of d x n_h*d_h.
Q_AND_O_D_BY_D = "N_matmul with W_q and W_o sized d x d instead of d x n_heads*head_dim"


def _nmm_q_and_o_d_by_d(config: ModelConfig) -> int:
    """N_matmul with W_q and W_o counted as d x d (the fault ``q_and_o_sized_d_by_d``)."""
    return ref.n_matmul(config) + 2 * config.n_layers * config.d_model * (config.d_model - config.attention_width)


# -- exercise 3: prefill time ------------------------------------------------------------------
def check_prefill_time(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(config, device, tokens, mfu) equals (2*N_matmul*t + 2*L*n_h*d_h*t^2) / (mfu * peak_flops)
    in seconds, to 4 significant figures (``docs/roofline.md#prefill-time``). Case 1 has query
    heads twice the model width (``wide_heads_config``) and 256-512 tokens, so an attention term
    written with the model width d, or W_q and W_o sized d x d, fails; the other cases are mostly
    square."""
    check_own_function("prefill_time", fn)
    rng = random.Random(seed)
    for case in range(cases):
        config = wide_heads_config(rng) if case == 1 else random_config(rng, tied=False if case == 0 else None)
        device = random_device(rng)
        tokens, mfu = rng.randint(1, 32768), rng.choice([0.3, 0.4, 0.5, 0.6, 0.75])
        if case == 0:  # short enough that the weight term (2*N_matmul*t) is not swamped by attention
            tokens = rng.randint(1, 512)
        if case == 1:  # both terms a visible share: the attention width and N_matmul both count
            tokens = rng.randint(256, 512)
        what = f"prefill_time(case {case}: {_describe(config)}; {_device_text(device)}; {tokens} tokens, mfu {mfu})"
        got = fn(config, device, tokens, mfu)
        expected = ref.prefill_time(config, device, tokens, mfu)
        try:
            check_significant(got, expected, figures=FIGURES, what=what)
        except ContractError as err:
            L, d, t, peak = config.n_layers, config.attention_width, tokens, device.peak_flops
            nmm, n_all = ref.n_matmul(config), config.parameters()
            raise diagnose(err, check_real(what, got), {
                "MFU left out (divided by the peak, not mfu * peak)": lambda: expected * mfu,
                "multiplied by MFU instead of dividing": lambda: expected * mfu * mfu,
                "attention term 4*L*n_h*d_h*t^2 (the per-token 4*L*n_h*d_h*t summed without halving)":
                    lambda: (2 * nmm * t + 4 * L * d * t * t) / (mfu * peak),
                "attention term left out": lambda: 2 * nmm * t / (mfu * peak),
                ATTENTION_WITH_D_MODEL: lambda: (2 * nmm * t + 2 * L * config.d_model * t * t) / (mfu * peak),
                Q_AND_O_D_BY_D: lambda: (2 * _nmm_q_and_o_d_by_d(config) * t + 2 * L * d * t * t) / (mfu * peak),
                "N (all parameters) used instead of N_matmul":
                    lambda: (2 * n_all * t + 2 * L * d * t * t) / (mfu * peak),
                "one FLOP per weight instead of two (a multiply-add is 2 FLOPs)":
                    lambda: (nmm * t + 2 * L * d * t * t) / (mfu * peak),
                "peak_flops multiplied by 1e12 (a Device holds FLOP/s already, not TFLOP/s)":
                    lambda: expected / 1e12,
            }, _same_figures) from None


# -- exercise 4: decode step bound -------------------------------------------------------------
def check_decode_step_bound(fn: Callable, seed: int = 0, cases: int = 8) -> None:
    """Contract: fn(config, device, batch=, context=, weight_bytes=, kv_bytes_per_value=) equals
    ``roofline.step_time`` of the step's bytes and FLOPs in seconds, to 4 significant figures
    (``docs/roofline.md#decode-step-bound``): max(memory, compute) with
    memory = (weight_bytes + batch * kv_per_token * context) / bandwidth and
    compute = (2*N_matmul*batch + 4*L*n_h*d_h*batch*context) / peak_flops. Case 1 is
    compute-bound on a ``wide_heads_config`` with attention 20-80 % of the FLOPs, as in
    ``check_prefill_time``. Half the other cases put the two terms within a
    factor 3 of each other, where the max and the sum differ most."""
    check_own_function("decode_step_bound", fn)
    rng = random.Random(seed)
    for case in range(cases):
        for _ in attempts("Lab 1"):
            config = wide_heads_config(rng) if case == 1 else random_config(rng, tied=False if case == 0 else None)
            device = random_device(rng)
            sizes = dict(batch=rng.randint(1, 1024), context=rng.randint(1, 32768),
                         weight_bytes=ref.n_matmul(config) * rng.choice([0.5, 1, 2]),
                         kv_bytes_per_value=rng.choice([1, 2, 2, 4]))
            bound = ref.decode_step(config, device, **sizes)
            balanced = max(bound.memory_s, bound.compute_s) <= 3 * min(bound.memory_s, bound.compute_s)
            # case 0: compute-bound with a weight term large enough that an N_matmul error shows
            head_share = 2 * config.vocab_size * config.d_model * sizes["batch"] / bound.flops
            attention_share = 4 * config.n_layers * config.attention_width * sizes["batch"] * sizes["context"] \
                / bound.flops
            if case == 0:
                fits = bound.binding == "compute" and head_share > 0.01
            elif case == 1:
                fits = bound.binding == "compute" and 0.2 <= attention_share <= 0.8
            else:
                fits = balanced or case % 2
            if fits:
                break
        batch, context, weight_bytes = sizes["batch"], sizes["context"], sizes["weight_bytes"]
        what = (f"decode_step_bound(case {case}: {_describe(config)}; {_device_text(device)}; batch {batch}, "
                f"context {context}, weights {weight_bytes:,.0f} B, {sizes['kv_bytes_per_value']} B/value)")
        got = fn(config, device, **sizes)
        try:
            check_significant(got, bound.bound_s, figures=FIGURES, what=what)
        except ContractError as err:
            kv = ref.kv_bytes_per_token(config, sizes["kv_bytes_per_value"])
            flops = bound.flops

            def step(bytes_moved=bound.bytes_moved, flops=flops, bandwidth=device.bandwidth,
                     peak_flops=device.peak_flops):
                return ref.step_time(bytes_moved=bytes_moved, flops=flops, bandwidth=bandwidth, peak_flops=peak_flops)

            err = ContractError(f"{err}\n(reference: memory time {bound.memory_s:.4g} s, compute time "
                                f"{bound.compute_s:.4g} s, {bound.binding}-bound)")
            raise diagnose(err, check_real(what, got), {
                "memory time and compute time added instead of taking the max (the weight read and the "
                "arithmetic overlap; the slower one bounds the step)": lambda: bound.memory_s + bound.compute_s,
                "KV-cache bytes left out of the memory term": lambda: step(bytes_moved=weight_bytes),
                "KV bytes without the factor 2 for K and V":
                    lambda: step(bytes_moved=weight_bytes + batch * kv / 2 * context),
                "KV bytes with query heads instead of KV heads":
                    lambda: step(bytes_moved=weight_bytes + batch * kv // config.n_kv_heads * config.n_heads * context),
                "bandwidth multiplied by 1e12 (a Device holds bytes/s already, not TB/s)":
                    lambda: step(bandwidth=device.bandwidth * 1e12),
                "peak_flops multiplied by 1e12 (a Device holds FLOP/s already, not TFLOP/s)":
                    lambda: step(peak_flops=device.peak_flops * 1e12),
                "peak divided by an MFU of 0.5 (the decode bound uses the full peak: optimistic)":
                    lambda: step(peak_flops=0.5 * device.peak_flops),
                "N (all parameters, with the untied input embedding) used instead of N_matmul in the compute term":
                    lambda: step(flops=flops + 2 * batch * (config.parameters() - ref.n_matmul(config))),
                "the KV read not multiplied by the batch": lambda: step(bytes_moved=weight_bytes + kv * context),
                ATTENTION_WITH_D_MODEL: lambda: step(flops=flops + 4 * config.n_layers * batch * context
                                                     * (config.d_model - config.attention_width)),
                Q_AND_O_D_BY_D: lambda: step(flops=flops + 2 * batch * (_nmm_q_and_o_d_by_d(config)
                                                                        - ref.n_matmul(config))),
                "only the memory time (the compute term is missing)": lambda: bound.memory_s,
                "only the compute time (the memory term is missing)": lambda: bound.compute_s,
            }, _same_figures) from None


# -- exercise 5: arithmetic intensity ----------------------------------------------------------
def _check_intensity_case(name: str, fn: Callable, args: tuple, expected: float, case: int,
                          variants: dict[str, Callable[[], float]]) -> None:
    what = f"{name}{args} (case {case})"
    got = fn(*args)
    try:
        check_significant(got, expected, figures=FIGURES, what=what)
    except ContractError as err:
        raise diagnose(err, check_real(what, got), variants, _same_figures) from None


def _intensity_sizes(rng: random.Random) -> tuple[int, int, int, float]:
    """(m, n, batch, bytes per element): one matrix side small (2-40), the other large (120-300),
    so the vector terms matter and leaving out x (m x n: n reads) cannot pass for leaving out y
    (m writes) at 4 significant figures."""
    small, large = rng.randint(2, 40), rng.randint(120, 300)
    m, n = (small, large) if rng.random() < 0.5 else (large, small)
    return m, n, rng.randint(2, 600), rng.choice([0.5, 1, 2, 4])


def check_gemv_intensity(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract (FLOP/byte, 4 significant figures): fn(m, n, b) = 2mn / (b(mn + m + n)): one read
    of W and x, one write of y. Sizes are small enough that the vector terms matter."""
    check_own_function("gemv_intensity", fn)
    rng = random.Random(seed)
    for case in range(cases):
        m, n, _, b = _intensity_sizes(rng)
        _check_intensity_case("gemv_intensity", fn, (m, n, b), ref.gemv_intensity(m, n, b), case, {
            "only the matrix counted in the bytes (x and y left out)": lambda: 2 / b,
            "one FLOP per multiply-add instead of two": lambda: m * n / (b * (m * n + m + n)),
            "the output write left out": lambda: 2 * m * n / (b * (m * n + n)),
            "the input vector x left out": lambda: 2 * m * n / (b * (m * n + m)),
        })


def check_gemm_intensity(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract (FLOP/byte, 4 significant figures): fn(m, n, B, b) = 2mnB / (b(mn + nB + mB)):
    one read of W and X, one write of Y. Sizes are small enough that X and Y matter."""
    check_own_function("gemm_intensity", fn)
    rng = random.Random(seed)
    for case in range(cases):
        m, n, batch, b = _intensity_sizes(rng)
        _check_intensity_case("gemm_intensity", fn, (m, n, batch, b), ref.gemm_intensity(m, n, batch, b), case, {
            "only the matrix counted in the bytes (~2B/b, no saturation)": lambda: 2 * batch / b,
            "one FLOP per multiply-add instead of two": lambda: m * n * batch / (b * (m * n + n * batch + m * batch)),
            "the output write left out": lambda: 2 * m * n * batch / (b * (m * n + n * batch)),
            "the input X left out": lambda: 2 * m * n * batch / (b * (m * n + m * batch)),
            "the GEMV formula (batch ignored)": lambda: ref.gemv_intensity(m, n, b),
        })


# -- exercise 6: requests that fit -------------------------------------------------------------
def check_requests_that_fit(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(config, device, weight_bytes=, prompt_tokens=, output_tokens=, overhead_gb=,
    kv_bytes_per_value=) is the exact int floor((memory - weights - overhead) / (kv_per_token *
    (prompt + output))), with the device's memory in bytes and the overhead in decimal GB
    (1e9 bytes), or 0 if nothing fits (``docs/roofline.md#capacity``). Case 0 leaves nothing
    free; the others are drawn so that an overhead read as binary GiB would change the answer."""
    check_own_function("requests_that_fit", fn)
    rng = random.Random(seed)
    for case in range(cases):
        for _ in attempts("Lab 1"):
            config, device = random_config(rng), random_device(rng)
            sizes = dict(weight_bytes=ref.n_matmul(config) * rng.choice([0.5, 1, 2]),
                         prompt_tokens=rng.randint(100, 16000), output_tokens=rng.randint(16, 8000),
                         overhead_gb=rng.choice([0.0, 1.0, 2.5, 4.0]), kv_bytes_per_value=rng.choice([1, 2, 2]))
            expected = ref.requests_that_fit(config, device, **sizes)
            kv = ref.kv_bytes_per_token(config, sizes["kv_bytes_per_value"])
            weight_bytes, overhead, tokens = sizes["weight_bytes"], sizes["overhead_gb"], \
                sizes["prompt_tokens"] + sizes["output_tokens"]
            free = device.memory - weight_bytes - overhead * 1e9
            binary = math.floor((device.memory - weight_bytes - overhead * GIB) / (kv * tokens))
            if (free < 0) if case == 0 else (expected >= 2 and binary != expected):
                break
        what = (f"requests_that_fit(case {case}: {_describe(config)}; {_device_text(device)}; weights "
                f"{weight_bytes:,.0f} B, prompt {sizes['prompt_tokens']}, output {sizes['output_tokens']}, "
                f"overhead {overhead} GB, {sizes['kv_bytes_per_value']} B/value)")
        got = fn(config, device, **sizes)
        value = check_int(what, got)
        if value == expected:
            continue
        per_request = kv * tokens
        err = ContractError(f"{what}: expected {expected:,}, got {value:,} (free {free / 1e9:.4g} GB, "
                            f"{per_request:,} B per full-length request)")

        def fit(free=free, per_request=per_request, rounding=math.floor, floor_at_zero=True):
            count = rounding(free / per_request)
            return max(0, count) if floor_at_zero else count

        memory = device.memory
        raise diagnose(err, value, {
            "the overhead in binary GiB (2^30 bytes) instead of decimal GB (1e9 bytes)":
                lambda: fit(free=memory - weight_bytes - overhead * GIB),
            "the weights not subtracted from the memory": lambda: fit(free=memory - overhead * 1e9),
            "the runtime overhead not subtracted": lambda: fit(free=memory - weight_bytes),
            "only the prompt's KV counted (a full-length request also caches its output)":
                lambda: fit(per_request=kv * sizes["prompt_tokens"]),
            "KV bytes per token without the factor 2 for K and V": lambda: fit(per_request=per_request / 2),
            "KV bytes per token with query heads instead of KV heads":
                lambda: fit(per_request=per_request // config.n_kv_heads * config.n_heads),
            "kv_bytes_per_value ignored (a 2-byte cache assumed)":
                lambda: fit(per_request=ref.kv_bytes_per_token(config, 2) * tokens),
            "rounded instead of floored (a partial request does not fit)": lambda: fit(rounding=round),
            "a negative count when nothing fits (should be 0)": lambda: fit(floor_at_zero=False),
        }, _same_int)


# -- exercise 7: the GEMV kernel (section 10) -------------------------------------------------
#: (BLOCK_M, BLOCK_N) pairs the checker launches with: the kernel must work for any of them.
GEMV_BLOCKS = ((4, 16), (8, 32), (2, 8), (16, 16), (4, 64), (1, 32))


def gemv_kernel_cases(rng: random.Random, cases: int) -> list[tuple[int, int, int, int, torch.dtype]]:
    """(M, N, block_m, block_n, dtype) per case. Case 0: rows and columns both ragged (not block
    multiples) over at least three column tiles, float32; case 1: one row, bfloat16; case 2: one
    column; case 3: both sizes exact block multiples, bfloat16; then random, mostly ragged. Sizes
    stay small: the interpreter runs every program in Python."""
    drawn = []
    for case in range(cases):
        bm, bn = GEMV_BLOCKS[rng.randrange(len(GEMV_BLOCKS))]
        dtype = torch.bfloat16 if case in (1, 3) or (case > 3 and rng.random() < 0.5) else torch.float32
        if case == 0:
            bm, bn = max(bm, 2), min(bn, 16)
            m, n = bm * rng.randint(1, 3) + rng.randint(1, bm - 1), bn * rng.randint(2, 3) + rng.randint(1, bn - 1)
        elif case == 1:
            m, n = 1, rng.randint(bn + 1, 3 * bn)
        elif case == 2:
            m, n = rng.randint(2, 20), 1
        elif case == 3:
            m, n = bm * rng.randint(1, 3), bn * rng.randint(1, 3)
        else:
            m, n = rng.randint(1, 24), rng.randint(1, 80)
        drawn.append((m, n, bm, bn, dtype))
    return drawn


def _gemv_stray(n_rows: int, n_cols: int) -> Callable[[dict], str]:
    """The diagnosis of a GEMV kernel's stray access (``kernel_checks.launch_case``'s name_stray)."""
    def name(v: dict) -> str:
        tensor, index, steps, row_stride = v["tensor"], v["index"], v.get("steps") or [], v["strides"][0]
        if tensor == "W" and v["op"] == "load":
            if len(steps) == 2 and steps[0] not in (None, row_stride) and steps[1] == 1:
                return (f"the rows of W were addressed {steps[0]} elements apart, but row r of W starts at "
                        f"r * stride_wm = r * {row_stride}: use stride_wm, not N")
        if not v["inside_buffer"]:
            return ("an address far from every tensor: an offset is wrong (row r, column c of W is "
                    "w_ptr + r * stride_wm + c; element c of x is x_ptr + c; y[r] is y_ptr + r)")
        if tensor == "W" and v["op"] == "load":
            if index[0] >= n_rows or index[0] < 0:
                return (f"the row mask is left out of W's load: the last program's rows go past row {n_rows - 1} "
                        "(mask the rows with rows < M)")
            if index[1] >= n_cols:
                return (f"the tail mask is left out of W's load: the last column tile goes past column {n_cols - 1} "
                        "(mask the columns with cols < N)")
        if tensor == "x" and v["op"] == "load" and index[0] >= n_cols:
            return (f"the tail mask is left out of x's load: the last column tile goes past element {n_cols - 1} "
                    "(mask it with cols < N)")
        if tensor == "y" and v["op"] == "store" and index[0] >= n_rows:
            return (f"the row mask is left out of the store: the last program writes past y[{n_rows - 1}] "
                    "(store with mask=rows < M)")
        return ""
    return name


def check_gemv_kernel(kernel, seed: int = 0, cases: int = 4) -> None:
    """Contract: the learner's ``@triton.jit`` kernel computes y = W x, launched by the course
    (``course_lib.kernels.exercise.launch_gemv``: the grid, the allocation, BLOCK_M and BLOCK_N,
    drawn from ``GEMV_BLOCKS``) under Triton's interpreter on shapes that are not block multiples,
    one row, one column and exact multiples, float32 and bfloat16 inputs:

    - every lane it loads or stores addresses an element of W, x or y (W sits in a buffer whose
      rows are wider than N, so a missing column mask shows on every row);
    - y equals ``reference_gemv`` (float32 products and sums) within float32 rounding:
      |y - W x| <= 4 N 2^-24 sum_j |W_ij x_j| + 1e-30 per row.
    A plain function in the kernel's place is refused: the exercise is the kernel."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case, (m, n, bm, bn, dtype) in enumerate(gemv_kernel_cases(rng, cases)):
        W = torch.randn(m, n, generator=gen).to(dtype)
        x = torch.randn(n, generator=gen).to(dtype)
        what = f"gemv_kernel(case {case}: W {m} x {n} {str(dtype).replace('torch.', '')}, BLOCK_M {bm}, BLOCK_N {bn})"
        y = launch_case(kernel, "gemv", what, _gemv_stray(m, n), W, x, block_m=bm, block_n=bn)
        y = check_tensor(f"{what}: y", y, shape=(m,), dtype=torch.float32, allow_nan=True)
        check_all_stored(what, y, "Program i owns rows i * BLOCK_M to i * BLOCK_M + BLOCK_M - 1")
        Wf, xf = W.float(), x.float()
        expected = reference_gemv(W, x)
        bound = 4 * max(n, 1) * 2.0 ** -24 * (Wf.abs() @ xf.abs()) + 1e-30
        err = (y.double() - expected.double()).abs()
        if bool((err <= bound).all()):
            continue
        row = int((err > bound).nonzero()[0, 0])
        failure = ContractError(f"{what}: y[{row}] = {float(y[row]):.6g}, expected {float(expected[row]):.6g} "
                                f"(|diff| {float(err[row]):.3g} > allowed {float(bound[row]):.3g}); "
                                f"{int((err > bound).sum())} of {m} rows over")
        raise_if_bfloat16_arithmetic(failure, dtype, lambda: bool(((launch_case(
            kernel, "gemv", what, _gemv_stray(m, n), Wf, xf, block_m=bm, block_n=bn).double() - expected.double()).abs()
            <= bound).all()), "what you load")
        tiles = [(n0, min(n0 + bn, n)) for n0 in range(0, n, bn)]
        raise diagnose(failure, y, {
            f"only the first column tile summed (columns 0-{tiles[0][1] - 1}): loop over every tile of BLOCK_N "
            "columns": lambda: Wf[:, :tiles[0][1]] @ xf[:tiles[0][1]] if len(tiles) > 1 else None,
            "the accumulator overwritten by each column tile (acc = ... instead of acc += ...): only the last tile "
            "counts": lambda: Wf[:, tiles[-1][0]:] @ xf[tiles[-1][0]:] if len(tiles) > 1 else None,
        }, lambda got, cand: bool(((got.double() - cand.double()).abs() <= bound).all()))


# -- the lab's declared tables (see tables.py) -------------------------------------------------
CONTRACTS = (
    Contract("test_count_parameters", check_parameter_count, ("count_parameters",),
             references=("course_lib.roofline.n_matmul", "course_lib.models.config.ModelConfig.parameters",
                         "course_lib.models.config.ModelConfig.block_parameters")),
    Contract("test_kv_bytes_per_token", check_kv_bytes_per_token, ("kv_bytes_per_token",),
             references=("course_lib.roofline.kv_bytes_per_token", "course_lib.roofline.kv_bytes_per_sequence",
                         "course_lib.models.config.ModelConfig.kv_bytes_per_token")),
    Contract("test_prefill_time", check_prefill_time, ("prefill_time",),
             references=("course_lib.roofline.prefill_time", "course_lib.roofline.prefill_flops")),
    Contract("test_decode_step_bound", check_decode_step_bound, ("decode_step_bound",),
             references=("course_lib.roofline.decode_step_bound", "course_lib.roofline.decode_step",
                         "course_lib.roofline.decode_step_flops", "course_lib.roofline.attention_flops")),
    Contract("test_gemv_intensity", check_gemv_intensity, ("gemv_intensity",),
             references=("course_lib.roofline.gemv_intensity", "course_lib.roofline.gemm_intensity")),
    Contract("test_gemm_intensity", check_gemm_intensity, ("gemm_intensity",),
             references=("course_lib.roofline.gemm_intensity",)),
    Contract("test_requests_that_fit", check_requests_that_fit, ("requests_that_fit",),
             references=("course_lib.roofline.requests_that_fit",)),
    Contract("test_gemv_kernel", check_gemv_kernel, ("gemv_kernel",), launcher="gemv",
             references=("course_lib.kernels.gemv.reference_gemv", "course_lib.kernels.gemv.gemv")),
)

# The notebook's functions call each other (prefill_time and decode_step_bound call
# count_parameters and kv_bytes_per_token), so a fault in one fails the tests of its callers too.
FAULTS = (
    Fault("untied_embedding_in_nmatmul",
          (Edit("count_parameters", "n_matmul = n_params - (0 if config.tie_embeddings else table)",
                "n_matmul = n_params"),),
          {"test_count_parameters": "untied input embedding counted in N_matmul",
           "test_prefill_time": r"N \(all parameters\)", "test_decode_step_bound": r"N \(all parameters"},
          "counts the input embedding of an untied model as a matmul weight"),
    Fault("kv_factor_two_missing",
          (Edit("kv_bytes_per_token", "return 2 * config.n_layers * config.n_kv_heads",
                "return config.n_layers * config.n_kv_heads"),),
          {"test_kv_bytes_per_token": "factor 2 for K and V forgotten",
           "test_decode_step_bound": "without the factor 2", "test_requests_that_fit": "without the factor 2"},
          "counts K or V, not both"),
    Fault("query_heads_for_kv",
          (Edit("kv_bytes_per_token", "config.n_kv_heads * config.head_dim", "config.n_heads * config.head_dim"),),
          {"test_kv_bytes_per_token": "query heads .* used instead of KV heads",
           "test_decode_step_bound": "query heads instead of KV heads",
           "test_requests_that_fit": "query heads instead of KV heads"},
          "sizes the KV cache with the query heads (ignores grouped-query attention)"),
    Fault("attention_with_d_model",
          (Edit("prefill_time", "config.n_layers * config.n_heads * config.head_dim * tokens ** 2",
                "config.n_layers * config.d_model * tokens ** 2"),
           Edit("decode_step_bound", "config.n_layers * config.n_heads * config.head_dim * batch * context",
                "config.n_layers * config.d_model * batch * context")),
          {"test_prefill_time": "attention counted with d_model", "test_decode_step_bound": "attention counted with d_model"},
          "counts attention FLOPs with the model width d, wrong when d != n_heads * head_dim"),
    Fault("gib_for_gb",
          (Edit("requests_that_fit", "free = device.memory - weight_bytes - overhead_gb * 1e9",
                "free = device.memory - weight_bytes - overhead_gb * 2**30"),),
          {"test_requests_that_fit": "binary GiB"},
          "reads the overhead's decimal GB as binary GiB"),
    Fault("sum_not_max",
          (Edit("decode_step_bound", "return max(bytes_moved / device.bandwidth, flops / device.peak_flops)",
                "return bytes_moved / device.bandwidth + flops / device.peak_flops"),),
          {"test_decode_step_bound": "added instead of taking the max"},
          "adds the memory and compute times instead of taking the larger"),
    Fault("gemv_input_vector_left_out",
          (Edit("intensity", "(bytes_per_element * (m * n + m + n))", "(bytes_per_element * (m * n + m))"),),
          {"test_gemv_intensity": "input vector x left out"},
          "counts the matrix read and the output write of a GEMV but not the input vector"),
    Fault("q_and_o_sized_d_by_d",
          (Edit("count_parameters", "attention = d * q_width + 2 * d * kv_width + q_width * d",
                "attention = d * d + 2 * d * kv_width + d * d"),),
          {"test_count_parameters": "W_q and W_o sized d x d", "test_prefill_time": "W_q and W_o sized d x d",
           "test_decode_step_bound": "W_q and W_o sized d x d"},
          "sizes W_q and W_o as d x d, wrong when d != n_heads * head_dim"),
    Fault("gemv_tail_mask_left_out",
          (Edit("gemv_kernel", "mask=row_mask[:, None] & col_mask[None, :]", "mask=row_mask[:, None]"),),
          {"test_gemv_kernel": "tail mask is left out of W's load"},
          "loads W's last column tile without a column mask, reading past column N - 1"),
    Fault("gemv_row_mask_left_out",
          (Edit("gemv_kernel", "mask=row_mask[:, None] & col_mask[None, :]", "mask=col_mask[None, :]"),
           Edit("gemv_kernel", "tl.store(y_ptr + rows, acc, mask=row_mask)", "tl.store(y_ptr + rows, acc)")),
          {"test_gemv_kernel": "row mask is left out"},
          "masks the columns but not the rows, so the last program reads and writes past row M - 1"),
    Fault("gemv_accumulator_overwritten",
          (Edit("gemv_kernel", "acc += tl.sum(", "acc = tl.sum("),),
          {"test_gemv_kernel": r"accumulator overwritten"},
          "assigns each column tile's sums to the accumulator instead of adding them"),
    Fault("gemv_products_in_bfloat16",
          (Edit("gemv_kernel", "tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)",
                "tl.sum((w * xv[None, :]).to(tl.float32), axis=1)"),),
          {"test_gemv_kernel": "wrong for bfloat16 ones"},
          "multiplies bfloat16 inputs in bfloat16 and converts only the products to float32"),
)
check_tables(CONTRACTS, FAULTS)
