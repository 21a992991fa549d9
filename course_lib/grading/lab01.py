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

Learner signatures (all sizes are plain ints, devices are ``course_lib.hardware.Accelerator``):
    count_parameters(config) -> (n_params: int, n_matmul: int)
    kv_bytes_per_token(config, bytes_per_value) -> int
    prefill_time(config, device, tokens, mfu) -> float seconds
    decode_step_bound(config, device, batch, context, weight_bytes, kv_bytes_per_value) -> float seconds
    gemv_intensity(m, n, bytes_per_element) -> float FLOP/byte
    gemm_intensity(m, n, batch, bytes_per_element) -> float FLOP/byte
    requests_that_fit(config, device, weight_bytes, prompt_tokens, output_tokens, overhead_gb) -> int
"""
from __future__ import annotations

import math
import random
from typing import Callable

from .. import roofline as ref
from ..hardware import Accelerator
from ..models.config import ModelConfig
from .tables import Contract, Edit, Fault, check_tables
from .contracts import (ContractError, check_bytes, check_int, check_own_function, check_real, check_significant,
                        significant_tolerance)

__all__ = ["random_config", "random_device", "kv_terms", "check_parameter_count", "check_kv_bytes_per_token",
           "check_prefill_time", "check_decode_step_bound", "check_gemv_intensity", "check_gemm_intensity",
           "check_requests_that_fit"]

FIGURES = 4  # "times to 4 significant figures"
GIB = 2 ** 30


# -- inputs -----------------------------------------------------------------------------------
def random_config(rng: random.Random, tied: bool | None = None, gqa: bool = True,
                  square: bool | None = None) -> ModelConfig:
    """A Llama-shaped config with sizes drawn from ``rng``: 1-96 layers, 2-64 query heads of
    32-256, KV heads a proper divisor of the query heads when ``gqa`` (so query heads != KV
    heads), SwiGLU width 1-4x the model width, vocab 1,000-260,000. ``square``: True makes
    d_model = n_heads * head_dim (what the spec's attention FLOPs 4*L*d*t assume); False makes
    them differ (so q/o sized d x d is caught); None draws True 80 % of the time."""
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


def random_device(rng: random.Random) -> Accelerator:
    """An accelerator with capacity 16-192 GB, bandwidth 0.2-8 TB/s and 50-2500 dense TFLOP/s,
    rounded like a datasheet (three significant figures)."""
    def sig3(x: float) -> float:
        return float(f"{x:.3g}")
    return Accelerator(name=f"device-{rng.randrange(10**6)}", capacity_gb=sig3(rng.uniform(16, 192)),
                       bandwidth_tbps=sig3(rng.uniform(0.2, 8.0)), dense_tflops=sig3(rng.uniform(50, 2500)),
                       source="drawn by the Lab 1 grader")


def _attempts(limit: int = 100_000):
    """Bound a rejection-sampling loop; running out is a grader bug, reported as such."""
    yield from range(limit)
    raise RuntimeError(f"Lab 1 grader: no suitable random case in {limit} draws (a grader bug; please report)")


def _describe(config: ModelConfig) -> str:
    return (f"L {config.n_layers}, d {config.d_model}, {config.n_heads} query / {config.n_kv_heads} KV heads of "
            f"{config.head_dim}, d_ff {config.d_ff}, vocab {config.vocab_size}, "
            f"{'tied' if config.tie_embeddings else 'untied'}")


def _device_text(device: Accelerator) -> str:
    return f"{device.capacity_gb:g} GB, {device.bandwidth_tbps:g} TB/s, {device.dense_tflops:g} TFLOP/s"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= significant_tolerance(FIGURES) * abs(b)


def _diagnose(err: ContractError, got: float, variants: dict[str, Callable[[], float]], exact: bool = False):
    """``err`` with the names of every known fault whose value equals ``got`` appended (several
    can coincide when one term of a max hides another; ``exact``: only an exact int is compared,
    so a rigged object is never diagnosed)."""
    if exact and type(got) is not int:
        return err
    matches = []
    for symptom, make in variants.items():
        try:
            candidate = make()
        except Exception:  # a variant that cannot be evaluated on these inputs is not the answer
            continue
        if candidate is not None and ((got == candidate) if exact else _close(got, candidate)):
            matches.append(symptom)
    if not matches:
        return err
    if len(matches) == 1:
        return ContractError(f"{err}\nDiagnosis: your number equals the formula with this fault: {matches[0]}"
                             f"\n{_LIKELY}")
    listed = "".join(f"\n  - {m}" for m in matches)
    return ContractError(f"{err}\nDiagnosis: your number equals the formula with any of these faults "
                         f"(on these inputs they give the same value):{listed}\n{_LIKELY}")


_LIKELY = ("(a likely cause, not a certainty: a different bug can give the same value on these inputs; "
           "check your code against the named formula)")


# -- exercise 1: parameters and N_matmul -------------------------------------------------------
def check_parameter_count(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(config) returns (N, N_matmul) as exact ints, N counting every parameter (a tied
    table once) and N_matmul leaving out an *untied* input embedding (COURSE_SPEC "Lab 1")."""
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
            raise _diagnose(err, got, {
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
            }, exact=True)


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
            raise _diagnose(err, got, {
                "the factor 2 for K and V forgotten (the cache stores a key AND a value per head)":
                    lambda: expected // 2,
                f"query heads ({config.n_heads}) used instead of KV heads ({config.n_kv_heads}): "
                "with GQA only the KV heads are cached":
                    lambda: expected // config.n_kv_heads * config.n_heads,
                "both: query heads and no factor 2": lambda: expected // 2 // config.n_kv_heads * config.n_heads,
                "d_model used instead of n_kv * head_dim": lambda: expected // (config.n_kv_heads * config.head_dim)
                    * config.d_model,
            }, exact=True) from None


# -- exercise 3: prefill time ------------------------------------------------------------------
def check_prefill_time(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(config, device, tokens, mfu) equals (2*N_matmul*t + 2*L*d*t^2) / (mfu * peak)
    in seconds, to 4 significant figures. Configs have d = n_heads * head_dim, the case the
    spec's simplified attention term assumes (so 4*L*d*t and 4*L*n_h*d_h*t agree)."""
    check_own_function("prefill_time", fn)
    rng = random.Random(seed)
    for case in range(cases):
        config = random_config(rng, tied=False if case == 0 else None, square=True)
        device = random_device(rng)
        tokens, mfu = rng.randint(1, 32768), rng.choice([0.3, 0.4, 0.5, 0.6, 0.75])
        if case == 0:  # short enough that the weight term (2*N_matmul*t) is not swamped by attention
            tokens = rng.randint(1, 512)
        what = f"prefill_time(case {case}: {_describe(config)}; {_device_text(device)}; {tokens} tokens, mfu {mfu})"
        got = fn(config, device, tokens, mfu)
        expected = ref.prefill_time(config, device, tokens, mfu)
        try:
            check_significant(got, expected, figures=FIGURES, what=what)
        except ContractError as err:
            L, d, t, peak = config.n_layers, config.d_model, tokens, device.peak_flops
            nmm, n_all = ref.n_matmul(config), config.parameters()
            raise _diagnose(err, check_real(what, got), {
                "MFU left out (divided by the peak, not mfu * peak)": lambda: expected * mfu,
                "multiplied by MFU instead of dividing": lambda: expected * mfu * mfu,
                "attention term 4*L*d*t^2 (the per-token 4*L*d*t summed without halving)":
                    lambda: (2 * nmm * t + 4 * L * d * t * t) / (mfu * peak),
                "attention term left out": lambda: 2 * nmm * t / (mfu * peak),
                "N (all parameters) used instead of N_matmul":
                    lambda: (2 * n_all * t + 2 * L * d * t * t) / (mfu * peak),
                "one FLOP per weight instead of two (a multiply-add is 2 FLOPs)":
                    lambda: (nmm * t + 2 * L * d * t * t) / (mfu * peak),
            }) from None


# -- exercise 4: decode step bound -------------------------------------------------------------
def check_decode_step_bound(fn: Callable, seed: int = 0, cases: int = 8) -> None:
    """Contract: fn(config, device, batch, context, weight_bytes, kv_bytes_per_value) equals
    max(memory, compute) in seconds to 4 significant figures, with
    memory = (weight_bytes + batch * kv_per_token * context) / bandwidth and
    compute = (2*N_matmul*batch + 4*L*d*batch*context) / peak. Half the cases put the two terms
    within a factor 3 of each other, where the max and the sum differ most."""
    check_own_function("decode_step_bound", fn)
    rng = random.Random(seed)
    for case in range(cases):
        for _ in _attempts():
            config = random_config(rng, tied=False if case == 0 else None, square=True)
            device = random_device(rng)
            batch, context = rng.randint(1, 1024), rng.randint(1, 32768)
            nbytes = rng.choice([1, 2, 2, 4])
            weight_bytes = ref.n_matmul(config) * rng.choice([0.5, 1, 2])
            bound = ref.decode_step_bound(config, device, batch, context, nbytes, weight_bytes)
            balanced = max(bound.memory_s, bound.compute_s) <= 3 * min(bound.memory_s, bound.compute_s)
            # case 0: compute-bound with a weight term large enough that an N_matmul error shows
            head_share = 2 * config.vocab_size * config.d_model * batch / bound.flops
            if (bound.binding == "compute" and head_share > 0.01) if case == 0 else (balanced or case % 2):
                break
        what = (f"decode_step_bound(case {case}: {_describe(config)}; {_device_text(device)}; batch {batch}, "
                f"context {context}, weights {weight_bytes:,.0f} B, {nbytes} B/value)")
        got = fn(config, device, batch, context, weight_bytes, nbytes)
        try:
            check_significant(got, bound.bound_s, figures=FIGURES, what=what)
        except ContractError as err:
            kv = ref.kv_bytes_per_token(config, nbytes)
            bw, peak = device.bandwidth, device.peak_flops
            flops = bound.flops
            err = ContractError(f"{err}\n(reference: memory time {bound.memory_s:.4g} s, compute time "
                                f"{bound.compute_s:.4g} s, {bound.binding}-bound)")
            raise _diagnose(err, check_real(what, got), {
                "memory time and compute time added instead of taking the max (the weight read and the "
                "arithmetic overlap; the slower one bounds the step)": lambda: bound.memory_s + bound.compute_s,
                "KV-cache bytes left out of the memory term": lambda: max(weight_bytes / bw, bound.compute_s),
                "KV bytes without the factor 2 for K and V":
                    lambda: max((weight_bytes + batch * kv / 2 * context) / bw, bound.compute_s),
                "KV bytes with query heads instead of KV heads":
                    lambda: max((weight_bytes + batch * kv // config.n_kv_heads * config.n_heads * context) / bw,
                                bound.compute_s),
                "bandwidth in binary TiB/s (2^40) instead of decimal TB/s":
                    lambda: max(bound.bytes_moved / (device.bandwidth_tbps * 2 ** 40), bound.compute_s),
                "peak divided by an MFU of 0.5 (the decode bound uses the full peak: optimistic)":
                    lambda: max(bound.memory_s, flops / (0.5 * peak)),
                "N (all parameters, with the untied input embedding) used instead of N_matmul in the compute term":
                    lambda: max(bound.memory_s, (flops + 2 * batch * (config.parameters() - ref.n_matmul(config)))
                                / peak),
                "the KV read not multiplied by the batch": lambda: max((weight_bytes + kv * context) / bw,
                                                                       bound.compute_s),
                "only the memory time (the compute term is missing)": lambda: bound.memory_s,
                "only the compute time (the memory term is missing)": lambda: bound.compute_s,
            }) from None


# -- exercise 5: arithmetic intensity ----------------------------------------------------------
def _check_intensity_case(name: str, fn: Callable, args: tuple, expected: float, case: int,
                          variants: dict[str, Callable[[], float]]) -> None:
    what = f"{name}{args} (case {case})"
    got = fn(*args)
    try:
        check_significant(got, expected, figures=FIGURES, what=what)
    except ContractError as err:
        raise _diagnose(err, check_real(what, got), variants) from None


def _intensity_sizes(rng: random.Random) -> tuple[int, int, int, float]:
    return rng.randint(2, 300), rng.randint(2, 300), rng.randint(2, 600), rng.choice([0.5, 1, 2, 4])


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
            "the GEMV formula (batch ignored)": lambda: ref.gemv_intensity(m, n, b),
        })


# -- exercise 6: requests that fit -------------------------------------------------------------
def check_requests_that_fit(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(config, device, weight_bytes, prompt_tokens, output_tokens, overhead_gb) is the
    exact int floor((capacity - weights - overhead) / (kv_per_token * (prompt + output))) with
    capacity and overhead in decimal GB (1e9 bytes) and a 2-byte cache, or 0 if nothing fits.
    Cases are drawn so that binary GiB would change the answer."""
    check_own_function("requests_that_fit", fn)
    rng = random.Random(seed)
    for case in range(cases):
        for _ in _attempts():
            config, device = random_config(rng), random_device(rng)
            weight_bytes = ref.n_matmul(config) * rng.choice([0.5, 1, 2])
            prompt, output = rng.randint(100, 16000), rng.randint(16, 8000)
            overhead = rng.choice([0.0, 1.0, 2.5, 4.0])
            expected = ref.requests_that_fit(config, device, prompt, output, overhead, weight_bytes)
            per_request = ref.kv_bytes_per_token(config, 2) * (prompt + output)
            binary = math.floor((device.capacity_gb * GIB - weight_bytes - overhead * GIB) / per_request)
            free = device.capacity_bytes - weight_bytes - overhead * 1e9
            if (free < 0) if case == 0 else (expected >= 2 and binary != expected):
                break
        what = (f"requests_that_fit(case {case}: {_describe(config)}; {_device_text(device)}; weights "
                f"{weight_bytes:,.0f} B, prompt {prompt}, output {output}, overhead {overhead} GB)")
        got = fn(config, device, weight_bytes, prompt, output, overhead)
        value = check_int(what, got)
        if value == expected:
            continue
        cap, kv = device.capacity_gb, ref.kv_bytes_per_token(config, 2)
        err = ContractError(f"{what}: expected {expected:,}, got {value:,} (free "
                            f"{(cap * 1e9 - weight_bytes - overhead * 1e9) / 1e9:.4g} GB, "
                            f"{per_request:,} B per full-length request)")
        raise _diagnose(err, value, {
            "binary GiB (2^30 bytes) used where the device's decimal GB (1e9 bytes) are specified":
                lambda: max(0, binary),
            "the capacity in binary GiB (2^30) instead of decimal GB":
                lambda: max(0, math.floor((cap * GIB - weight_bytes - overhead * 1e9) / per_request)),
            "the overhead in binary GiB (2^30) instead of decimal GB":
                lambda: max(0, math.floor((cap * 1e9 - weight_bytes - overhead * GIB) / per_request)),
            "the weights not subtracted from the capacity":
                lambda: max(0, math.floor((cap * 1e9 - overhead * 1e9) / per_request)),
            "the runtime overhead not subtracted": lambda: max(0, math.floor((cap * 1e9 - weight_bytes) / per_request)),
            "only the prompt's KV counted (a full-length request also caches its output)":
                lambda: max(0, math.floor((cap * 1e9 - weight_bytes - overhead * 1e9) / (kv * prompt))),
            "KV bytes per token without the factor 2 for K and V":
                lambda: max(0, math.floor((cap * 1e9 - weight_bytes - overhead * 1e9) / (per_request / 2))),
            "KV bytes per token with query heads instead of KV heads":
                lambda: max(0, math.floor((cap * 1e9 - weight_bytes - overhead * 1e9)
                                          / (per_request // config.n_kv_heads * config.n_heads))),
            "rounded instead of floored (a partial request does not fit)":
                lambda: max(0, round((cap * 1e9 - weight_bytes - overhead * 1e9) / per_request)),
            "a negative count when nothing fits (should be 0)":
                lambda: math.floor((cap * 1e9 - weight_bytes - overhead * 1e9) / per_request),
        }, exact=True)


# -- the lab's declared tables (see tables.py) -------------------------------------------------
CONTRACTS = (
    Contract("test_count_parameters", check_parameter_count, ("count_parameters",)),
    Contract("test_kv_bytes_per_token", check_kv_bytes_per_token, ("kv_bytes_per_token",)),
    Contract("test_prefill_time", check_prefill_time, ("prefill_time",)),
    Contract("test_decode_step_bound", check_decode_step_bound, ("decode_step_bound",)),
    Contract("test_gemv_intensity", check_gemv_intensity, ("gemv_intensity",)),
    Contract("test_gemm_intensity", check_gemm_intensity, ("gemm_intensity",)),
    Contract("test_requests_that_fit", check_requests_that_fit, ("requests_that_fit",)),
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
    Fault("gib_for_gb",
          (Edit("requests_that_fit", "free = device.capacity_gb * 1e9 - weight_bytes - overhead_gb * 1e9",
                "free = device.capacity_gb * 2**30 - weight_bytes - overhead_gb * 2**30"),),
          {"test_requests_that_fit": "binary GiB"},
          "reads the device's decimal GB as binary GiB"),
    Fault("sum_not_max",
          (Edit("decode_step_bound", "return max(bytes_moved / bandwidth, flops / peak)",
                "return bytes_moved / bandwidth + flops / peak"),),
          {"test_decode_step_bound": "added instead of taking the max"},
          "adds the memory and compute times instead of taking the larger"),
    Fault("q_and_o_sized_d_by_d",
          (Edit("count_parameters", "attention = d * q_width + 2 * d * kv_width + q_width * d",
                "attention = d * d + 2 * d * kv_width + d * d"),),
          {"test_count_parameters": "W_q and W_o sized d x d"},
          "sizes W_q and W_o as d x d, wrong when d != n_heads * head_dim"),
)
check_tables(CONTRACTS, FAULTS)
