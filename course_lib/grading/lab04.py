"""Graded checks for Lab 4 (quantisation).

Each ``check_*`` takes the learner's *function(s)*, builds its own inputs from a seed (fixed for
the visible checks, ``fresh_seed()`` for hidden tests) and compares the result with
``course_lib.quant`` (the reference formats, packing, windows, perplexity and SmoothQuant,
themselves tested against hand-computed figures and llama.cpp's GGUF blocks):

- codes: exactly the reference's, except where w / s lies within 1e-4 of a rounding tie (x.5),
  where either neighbour is accepted (round-half-even and round-half-up both pass);
- scales and zero points: the reference's to a relative 1e-6 (float32 rounding only);
- reconstruction: |w - w_hat| <= s/2 (+ float32 slack) wherever the value is not clipped, and the
  learner's dequantisation of the reference codes equals the reference's to a relative 1e-6;
- bytes and packed bytes: exact;
- windows: exactly the reference's token windows;
- perplexity: the reference's (exp of the mean loss over all predictions, float64) to a
  relative 1e-4 on the same model and windows;
- SmoothQuant scales: the reference's to a relative 1e-5;
- the W4A16 kernel (``check_w4a16_kernel``): launched by the course under Triton's interpreter with
  its loads and stores traced, equal to dequantise-then-matmul within float32 rounding, signed and
  zero-point codes, ragged sizes, odd K, groups that do not divide a tile.

When a contract fails, the checker evaluates the known faults of Lab 4 on the same inputs
(qmax = 2^(b-1); the scale from the signed maximum instead of the absolute maximum; the zero
point off by one; scale metadata left out of the bytes; nibbles swapped; offset-binary or
sign-magnitude nibbles; the mean of per-window perplexities; calibration windows that overlap the
evaluation windows; SmoothQuant's exponents swapped; ...) and names those the learner's result
equals.

Learner signatures (``docs/quantization.md``):
    quantize_symmetric(w, bits, group_size) -> (codes int8 (out, in), scales float32 (out, in // g))
    dequantize_symmetric(codes, scales, group_size) -> float32 (out, in)
    quantize_asymmetric(w, bits, group_size) -> (codes uint8, scales float32, zeros float32 (out, in // g))
    dequantize_asymmetric(codes, scales, zeros, group_size) -> float32 (out, in)
    int4_nbytes(out_features, in_features, group_size, scale_bytes=2, zero_point=False) -> int bytes
    pack_int4(codes int8 (..., n)) -> uint8 (..., ceil(n / 2));  unpack_int4(packed, n) -> int8 (..., n)
    split_windows(ids, window, n_eval, n_calib) -> (eval (n_eval, window), calib (n_calib, window)) int64
    perplexity(model, windows (n, T) int64) -> float
    smoothquant_scales(act_absmax (in,), weight (out, in), alpha) -> float32 (in,)
    w4a16_kernel: a @triton.jit kernel, launched by course_lib.kernels.exercise.launch_w4a16
"""
from __future__ import annotations

import math
import random
from typing import Callable

import torch

from ..kernels.w4a16 import reference_w4a16
from ..models.decoder import toy_decoder
from ..quant import formats as Q
from ..quant import packing as P
from ..quant.perplexity import perplexity as reference_perplexity
from ..quant.perplexity import token_windows
from ..quant import smoothquant as SQ
from .contracts import (ContractError, attempts, call_on_copies, check_int, check_own_function, check_real,
                        check_tensor, close, diagnose, is_grader_error)
from .kernel_checks import check_all_stored, launch_case, raise_if_bfloat16_arithmetic
from .tables import Contract, Edit, Fault, check_tables

__all__ = ["check_quantize_symmetric", "check_quantize_asymmetric", "check_int4_nbytes", "check_pack_int4",
           "check_split_windows", "check_perplexity", "check_smoothquant_scales", "sharp_toy_model",
           "CONTRACTS", "FAULTS"]

#: Relative tolerance of scales, zero points and dequantised values (float32 rounding only).
RELATIVE = 1e-6
#: Relative tolerance of the perplexity contract (a float32 log-softmax against the float64 reference).
PERPLEXITY_RELATIVE = 1e-4
#: Relative tolerance of the SmoothQuant scales (float32 powers).
SMOOTH_RELATIVE = 1e-5
#: A code may be either neighbour where w / s is this close to a rounding tie.
TIE = 1e-4


# -- inputs -----------------------------------------------------------------------------------
def _weights(rng: random.Random, out_f: int, in_f: int, group: int) -> torch.Tensor:
    """Gaussian weights of a random magnitude with, when there are enough groups, an all-zero
    group, a group holding one large outlier, a group whose most negative value dominates (so a
    scale taken from the signed maximum clips it) and an all-positive group (so a range not widened
    to contain 0 shows)."""
    gen = torch.Generator().manual_seed(rng.getrandbits(31))
    w = torch.randn(out_f, in_f, generator=gen) * 10 ** rng.uniform(-3, 1)
    cells = [(r, c) for r in range(out_f) for c in range(in_f // group)]
    rng.shuffle(cells)
    if len(cells) >= 4:
        (r0, c0), (r1, c1), (r2, c2), (r3, c3) = cells[:4]
        w[r0, c0 * group:(c0 + 1) * group] = 0.0
        w[r1, c1 * group + rng.randrange(group)] *= rng.uniform(20, 100)
        block = w[r2, c2 * group:(c2 + 1) * group]
        w[r2, c2 * group:(c2 + 1) * group] = -3 * block.abs() + block.abs().max() * 0.5 * (block > 0)
        block = w[r3, c3 * group:(c3 + 1) * group]
        w[r3, c3 * group:(c3 + 1) * group] = block.abs() + block.abs().mean()   # all positive: 0 is outside
    return w


def _shape(rng: random.Random, case: int) -> tuple[int, int, int, int]:
    """(out, in, group, bits) of a case: case 0 a small 4-bit grouped matrix, case 1 per-channel
    (one group per row), then random sizes, group sizes dividing in_features, 2..8 bits."""
    if case == 0:
        return 4, 32, 8, 4
    if case == 1:
        in_f = rng.choice([24, 48, 96])
        return rng.randint(2, 6), in_f, in_f, rng.choice([4, 8])
    group = rng.choice([2, 4, 8, 16, 32, 64])
    return rng.randint(1, 8), group * rng.randint(1, 6), group, rng.randint(2, 8)


def _where(index) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ")"


def _group_view(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1] // group, group)


def _expand(per_group: torch.Tensor, group: int) -> torch.Tensor:
    return per_group.repeat_interleave(group, dim=1)


def _same_scales(got: torch.Tensor, expected: torch.Tensor, zero_groups: torch.Tensor) -> bool:
    """Equal to RELATIVE, all-zero groups excepted (any positive finite scale does there)."""
    return _first_over(got, expected, ignore=zero_groups) is None


def _first_over(got: torch.Tensor, expected: torch.Tensor, rel: float = RELATIVE, ignore=None):
    """The first index where got differs from expected by more than rel * |expected| (+1e-30), all
    ``ignore`` positions excepted, or None."""
    over = (got.double() - expected.double()).abs() > rel * expected.double().abs() + 1e-30
    if ignore is not None:
        over &= ~ignore
    return tuple(over.nonzero()[0].tolist()) if bool(over.any()) else None


def _code_mismatch(got: torch.Tensor, expected: torch.Tensor, ratio: torch.Tensor):
    """The first index where codes differ other than by one at a rounding tie, or None."""
    diff = got.to(torch.int32) - expected.to(torch.int32)
    frac = ratio - ratio.floor()
    tie = (frac - 0.5).abs() < TIE
    bad = (diff != 0) & ~(tie & (diff.abs() == 1))
    return None if not bool(bad.any()) else tuple(bad.nonzero()[0].tolist())


# -- exercise 1: symmetric absmax -------------------------------------------------------------
def _strided_order(w: torch.Tensor, group: int) -> torch.Tensor:
    """The column order that makes strided groups contiguous: group j of a learner who reshapes
    (out, in) to (out, group_size, in // group_size) holds columns j, j + in // group_size, ..."""
    n_groups = w.shape[1] // group
    return torch.arange(w.shape[1]).reshape(group, n_groups).T.flatten()


def _grouped(variant: Callable) -> Callable:
    """VARIANT(w, bits, group, **fault) -> (codes, scales, ...), taught one more fault: ``strided=True``
    quantises the strided groups (``_strided_order``) and returns codes None: the scales (and zero
    points) identify the fault, whichever order the learner's codes then come back in."""
    def run(w: torch.Tensor, bits: int, group: int, *, strided: bool = False, **fault):
        if not strided:
            return variant(w, bits, group, **fault)
        return (None, *variant(w[:, _strided_order(w, group)], bits, group, **fault)[1:])
    return run


def _same_codes(got: torch.Tensor, candidate: torch.Tensor | None, ratio: torch.Tensor) -> bool:
    """Whether the learner's codes are the candidate's (None: the candidate names its fault by its
    scales alone), neighbours at a rounding tie allowed."""
    return candidate is None or _code_mismatch(got, candidate, ratio) is None


def _rounding(x: torch.Tensor, how: str) -> torch.Tensor:
    return {"round": torch.round, "trunc": torch.trunc, "floor": torch.floor}[how](x)


@_grouped
def _symmetric_variant(w: torch.Tensor, bits: int, group: int, *, qmax: int | None = None,
                       signed_max: bool = False, levels_scale: bool = False, rounding: str = "round"):
    """Symmetric absmax quantisation with one known fault switched on: (codes, scales)."""
    q = 2 ** (bits - 1) - 1 if qmax is None else qmax
    g = _group_view(w, group)     # float32 arithmetic, as a learner's code does it
    top = g.amax(dim=-1) if signed_max else g.abs().amax(dim=-1)
    scales = top / (2 ** bits - 1) if levels_scale else top / q
    scales = torch.where(top > 0, scales, torch.ones_like(scales))
    codes = torch.clamp(_rounding(g / scales[..., None], rounding), -q, q)
    return codes.reshape(w.shape).to(torch.int16), scales


_STRIDED = ("groups taken strided instead of as runs of group_size consecutive inputs: reshape (out, in) to "
            "(out, in // group_size, group_size), so group j holds inputs j * group_size .. (j + 1) * group_size - 1")
_SYMMETRIC_FAULTS = {
    "qmax = 2^(b-1) instead of 2^(b-1) - 1 (the codes must stay in -qmax..qmax, symmetric around 0)":
        lambda w, b, g: _symmetric_variant(w, b, g, qmax=2 ** (b - 1)),
    "the scale taken from the largest value instead of the largest absolute value (a group whose most "
    "negative weight dominates is clipped)": lambda w, b, g: _symmetric_variant(w, b, g, signed_max=True),
    "the scale spread over 2^b - 1 levels (absmax / (2^b - 1)) instead of absmax / qmax":
        lambda w, b, g: _symmetric_variant(w, b, g, levels_scale=True),
    "codes truncated toward zero instead of rounded to the nearest integer":
        lambda w, b, g: _symmetric_variant(w, b, g, rounding="trunc"),
    "codes rounded down (floor) instead of to the nearest integer":
        lambda w, b, g: _symmetric_variant(w, b, g, rounding="floor"),
    _STRIDED: lambda w, b, g: _symmetric_variant(w, b, g, strided=True),
}


def _check_reconstruction(what: str, w: torch.Tensor, w_hat: torch.Tensor, scales: torch.Tensor, group: int,
                          clipped: torch.Tensor | None = None) -> None:
    """|w - w_hat| <= s/2 (+ float32 slack) wherever not clipped."""
    s = _expand(scales.double(), group)
    err = (w.double() - w_hat.double()).abs()
    bound = s / 2 * (1 + 1e-5) + 1e-6 * w.double().abs() + 1e-30
    over = err > bound
    if clipped is not None:
        over &= ~clipped
    if bool(over.any()):
        i = tuple(over.nonzero()[0].tolist())
        raise ContractError(f"{what}: |w - w_hat| = {float(err[i]):.6g} at {_where(i)} exceeds s/2 = "
                            f"{float(s[i]) / 2:.6g} (w = {float(w[i]):.6g}, w_hat = {float(w_hat[i]):.6g}); "
                            "rounding to the nearest code never errs by more than half a step")


def check_quantize_symmetric(quantize: Callable, dequantize: Callable, seed: int = 0, cases: int = 5) -> None:
    """Contract: quantize(w, bits, group_size) returns int8 codes (out, in) and float32 scales
    (out, in // group_size) equal to symmetric absmax quantisation per group along the input
    dimension (``docs/quantization.md#symmetric-absmax``): qmax = 2^(bits-1) - 1, s = max|w| / qmax
    (an all-zero group: any positive scale, codes 0), q = clamp(round(w / s), -qmax, qmax); and
    dequantize(codes, scales, group_size) returns codes * s (float32), with |w - w_hat| <= s/2.
    Case 0: 4 x 32, 4 bits, group 8; case 1 is per-channel (one group per row); the rest are drawn
    (2..8 bits). Weights include an all-zero group, an outlier and a group whose most negative
    value dominates and an all-positive group."""
    check_own_function("quantize_symmetric", quantize)
    check_own_function("dequantize_symmetric", dequantize)
    rng = random.Random(seed)
    for case in range(cases):
        out_f, in_f, group, bits = _shape(rng, case)
        w = _weights(rng, out_f, in_f, group)
        what = f"quantize_symmetric(case {case}: w {out_f} x {in_f}, bits={bits}, group_size={group})"
        ref = Q.quantize(w, Q.QuantScheme(bits, "group", group, True, "fp32"))
        result = call_on_copies(what, quantize, w, bits, group)
        if type(result) is not tuple or len(result) != 2:
            raise ContractError(f"{what} must return a tuple (codes, scales), got {type(result).__qualname__}")
        codes = check_tensor(f"{what}[0] (codes)", result[0], shape=(out_f, in_f), dtype=torch.int8)
        scales = check_tensor(f"{what}[1] (scales)", result[1], shape=(out_f, in_f // group), dtype=torch.float32)
        zero_groups = _group_view(w, group).abs().amax(dim=-1) == 0
        ratio = (w.double() / _expand(ref.scales.double(), group))
        variants = {name: (lambda f=f: f(w, bits, group)) for name, f in _SYMMETRIC_FAULTS.items()}

        def same(got, candidate, ratio=ratio):
            c_codes, c_scales = candidate
            return _same_scales(got[1], c_scales, zero_groups) and _same_codes(got[0], c_codes, ratio)

        i = _first_over(scales, ref.scales, ignore=zero_groups)
        if i is not None:
            err = (f"{what}: the scale of group {_where(i)} is {float(scales[i]):.8g}, expected "
                   f"{float(ref.scales[i]):.8g} = max|w| / qmax over that group")
            raise diagnose(err, (codes, scales), variants, same)
        if bool((zero_groups & ~(scales > 0)).any()):
            raise ContractError(f"{what}: an all-zero group needs a positive scale (any, e.g. 1), not "
                                f"{float(scales[zero_groups][0])}")
        bad = _code_mismatch(codes, ref.codes, ratio)
        if bad is not None:
            err = (f"{what}: code at {_where(bad)} is {int(codes[bad])}, expected {int(ref.codes[bad])} "
                   f"(w = {float(w[bad]):.6g}, scale {float(_expand(ref.scales, group)[bad]):.6g})")
            raise diagnose(err, (codes, scales), variants, same)
        call = f"dequantize_symmetric(the codes of case {case})"
        got = check_tensor(call, call_on_copies(call, dequantize, ref.codes, ref.scales, group), shape=(out_f, in_f),
                           dtype=torch.float32)
        expected = ref.dequantize()
        i = _first_over(got, expected)
        if i is not None:
            raise ContractError(f"dequantize_symmetric(case {case}): value at {_where(i)} is {float(got[i]):.8g}, "
                                f"expected code * scale = {int(ref.codes[i])} * "
                                f"{float(_expand(ref.scales, group)[i]):.8g} = {float(expected[i]):.8g}")
        _check_reconstruction(f"dequantize_symmetric(quantize_symmetric(...)) in case {case}", w,
                              call_on_copies(f"dequantize_symmetric(your codes of case {case})", dequantize, codes,
                                             scales, group), scales, group)


# -- exercise 2: asymmetric min-max with a zero point -----------------------------------------
@_grouped
def _asymmetric_variant(w: torch.Tensor, bits: int, group: int, *, zero_shift: int = 0, no_zero_in_range=False,
                        floor_zero: bool = False, floor_codes: bool = False):
    """Asymmetric min-max quantisation with one known fault: (codes, scales, zeros)."""
    levels = 2 ** bits - 1
    g = _group_view(w, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    if not no_zero_in_range:
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    scales = hi / levels - lo / levels
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    z = torch.floor(-lo / scales) if floor_zero else torch.round(-lo / scales)
    zeros = torch.clamp(z + zero_shift, 0, levels)
    codes = torch.clamp(_rounding(g / scales[..., None], "floor" if floor_codes else "round") + zeros[..., None],
                        0, levels)
    return codes.reshape(w.shape).to(torch.int16), scales, zeros


_ASYMMETRIC_FAULTS = {
    "the zero point off by one (z = round(-lo / s) + 1)": lambda w, b, g: _asymmetric_variant(w, b, g, zero_shift=1),
    "the zero point off by one (z = round(-lo / s) - 1)": lambda w, b, g: _asymmetric_variant(w, b, g, zero_shift=-1),
    "the zero point rounded down (floor) instead of to the nearest integer":
        lambda w, b, g: _asymmetric_variant(w, b, g, floor_zero=True),
    "the range not extended to include 0 (lo = min(min w, 0), hi = max(max w, 0))":
        lambda w, b, g: _asymmetric_variant(w, b, g, no_zero_in_range=True),
    "codes rounded down (floor(w / s) + z) instead of to the nearest integer":
        lambda w, b, g: _asymmetric_variant(w, b, g, floor_codes=True),
    _STRIDED: lambda w, b, g: _asymmetric_variant(w, b, g, strided=True),
}


def check_quantize_asymmetric(quantize: Callable, dequantize: Callable, seed: int = 0, cases: int = 5) -> None:
    """Contract: quantize(w, bits, group_size) returns uint8 codes (out, in), float32 scales and
    float32 zero points (out, in // group_size) of asymmetric min-max quantisation
    (``docs/quantization.md#asymmetric-min-max``): L = 2^bits - 1, lo = min(min w, 0),
    hi = max(max w, 0), s = hi/L - lo/L (an all-zero group: any positive scale), z = clamp(round(-lo/s),
    0, L), q = clamp(round(w/s) + z, 0, L); dequantize(codes, scales, zeros, group_size) returns
    (q - z) * s, with |w - w_hat| <= s/2 wherever w is not clipped at 0 or L. Same cases as the
    symmetric check."""
    check_own_function("quantize_asymmetric", quantize)
    check_own_function("dequantize_asymmetric", dequantize)
    rng = random.Random(seed)
    for case in range(cases):
        out_f, in_f, group, bits = _shape(rng, case)
        w = _weights(rng, out_f, in_f, group)
        what = f"quantize_asymmetric(case {case}: w {out_f} x {in_f}, bits={bits}, group_size={group})"
        ref = Q.quantize(w, Q.QuantScheme(bits, "group", group, False, "fp32"))
        result = call_on_copies(what, quantize, w, bits, group)
        if type(result) is not tuple or len(result) != 3:
            raise ContractError(f"{what} must return a tuple (codes, scales, zeros), got {type(result).__qualname__}")
        n_groups = in_f // group
        codes = check_tensor(f"{what}[0] (codes)", result[0], shape=(out_f, in_f), dtype=torch.uint8)
        scales = check_tensor(f"{what}[1] (scales)", result[1], shape=(out_f, n_groups), dtype=torch.float32)
        zeros = check_tensor(f"{what}[2] (zero points)", result[2], shape=(out_f, n_groups), dtype=torch.float32)
        zero_groups = _group_view(w, group).abs().amax(dim=-1) == 0
        variants = {name: (lambda f=f: f(w, bits, group)) for name, f in _ASYMMETRIC_FAULTS.items()}
        ratio = w.double() / _expand(ref.scales.double(), group)

        def same(got, candidate, ratio=ratio):
            c_codes, c_scales, c_zeros = candidate
            return (_same_scales(got[1], c_scales, zero_groups) and bool(torch.equal(got[2], c_zeros.float()))
                    and _same_codes(got[0], c_codes, ratio))

        i = _first_over(scales, ref.scales, ignore=zero_groups)
        if i is not None:
            err = (f"{what}: the scale of group {_where(i)} is {float(scales[i]):.8g}, expected "
                   f"{float(ref.scales[i]):.8g} = (hi - lo) / L with lo = min(min w, 0), hi = max(max w, 0)")
            raise diagnose(err, (codes, scales, zeros), variants, same)
        if bool((zero_groups & ~(scales > 0)).any()):
            raise ContractError(f"{what}: an all-zero group needs a positive scale (any, e.g. 1)")
        wrong_zero = (zeros != ref.zeros) & ~zero_groups
        if bool(wrong_zero.any()):
            i = tuple(wrong_zero.nonzero()[0].tolist())
            err = (f"{what}: the zero point of group {_where(i)} is {float(zeros[i]):g}, expected "
                   f"{float(ref.zeros[i]):g} = clamp(round(-lo / s), 0, L)")
            raise diagnose(err, (codes, scales, zeros), variants, same)
        bad = _code_mismatch(codes, ref.codes, ratio)
        if bad is not None:
            err = (f"{what}: code at {_where(bad)} is {int(codes[bad])}, expected {int(ref.codes[bad])} "
                   f"(w = {float(w[bad]):.6g}, scale {float(_expand(ref.scales, group)[bad]):.6g}, zero point "
                   f"{float(_expand(ref.zeros, group)[bad]):g})")
            raise diagnose(err, (codes, scales, zeros), variants, same)
        call = f"dequantize_asymmetric(the codes of case {case})"
        got = check_tensor(call, call_on_copies(call, dequantize, ref.codes, ref.scales, ref.zeros, group),
                           shape=(out_f, in_f), dtype=torch.float32)
        expected = ref.dequantize()
        i = _first_over(got, expected)
        if i is not None:
            raise ContractError(f"dequantize_asymmetric(case {case}): value at {_where(i)} is {float(got[i]):.8g}, "
                                f"expected (code - zero point) * scale = {float(expected[i]):.8g}")
        call = f"dequantize_asymmetric(quantize_asymmetric(...)) in case {case}"
        mine = check_tensor(call, call_on_copies(call, dequantize, codes, scales, zeros, group), shape=(out_f, in_f),
                            dtype=torch.float32)
        if bool((_expand(zero_groups, group) & (mine != 0)).any()):
            raise ContractError(f"{what}: an all-zero group must come back as zeros (its codes equal to its zero "
                                "point), got a non-zero value after dequantisation")
        raw = torch.round(w.double() / _expand(ref.scales.double(), group)) + _expand(ref.zeros.double(), group)
        clipped = (raw < 0) | (raw > 2 ** bits - 1)     # outside the grid before the clamp
        _check_reconstruction(f"dequantize_asymmetric(quantize_asymmetric(...)) in case {case}", w, mine, scales,
                              group, clipped=clipped)


# -- exercise 3: bytes of an int4 matrix ------------------------------------------------------
def _bytes_variants(out_f, in_f, group, scale_bytes, zero_point) -> dict[str, int]:
    n_scales = out_f * (in_f // group)
    payload = out_f * math.ceil(in_f / 2)
    zeros = n_scales * scale_bytes if zero_point else 0
    return {
        "the scale metadata left out (every group stores its scale: out * (in / g) * scale_bytes)": payload + zeros,
        "only the packed payload counted (scales and zero points left out)": payload,
        "the zero points left out": payload + n_scales * scale_bytes,
        "one scale per group column instead of one per (row, group)": payload + (in_f // group) * scale_bytes * (
            2 if zero_point else 1),
        "the payload counted as one byte per weight": out_f * in_f + n_scales * scale_bytes + zeros,
        "the payload counted in bits (4 per weight) instead of bytes": out_f * in_f * 4 + n_scales * scale_bytes + zeros,
        "the payload rounded down (out * floor(in / 2)): an odd row needs ceil(in / 2) bytes, its last code "
        "alone in a byte": out_f * (in_f // 2) + n_scales * scale_bytes + zeros,
        "the whole matrix packed as one stream (ceil(out * in / 2)) instead of each row on its own":
            math.ceil(out_f * in_f / 2) + n_scales * scale_bytes + zeros,
        "the whole matrix counted as one stream and rounded down ((out * in) // 2): each row is packed on "
        "its own, an odd row's last code alone in a byte, so out * ceil(in / 2)":
            out_f * in_f // 2 + n_scales * scale_bytes + zeros,
    }


def check_int4_nbytes(fn: Callable, seed: int = 0, cases: int = 6) -> None:
    """Contract: fn(out_features, in_features, group_size, scale_bytes, zero_point) is the exact
    storage of an int4 matrix (``docs/quantization.md#packed-byte-count``): out * ceil(in / 2) packed bytes
    (each row packed on its own), plus out * (in / group_size) scales of ``scale_bytes`` each, plus
    as many zero points of the same width when ``zero_point``. Case 0: the 96-weight fixture (4 x 24,
    group 4, float32 scales: 144 B); case 1 SmolLM2's down_proj at int4 g64 fp16 + zero point; cases
    2 and 3 have odd in_features, 15 and 13 (in / 2 ends in .5 with an odd and an even whole part, so
    Python's round-half-to-even gets one of them wrong); the rest are drawn, odd in_features included."""
    check_own_function("int4_nbytes", fn)
    rng = random.Random(seed)
    for case in range(cases):
        if case == 0:
            out_f, in_f, group, scale_bytes, zero_point = 4, 24, 4, 4, False
        elif case == 1:
            out_f, in_f, group, scale_bytes, zero_point = 576, 1536, 64, 2, True
        elif case == 2:
            out_f, in_f, group, scale_bytes, zero_point = 7, 15, 5, 2, False
        elif case == 3:
            out_f, in_f, group, scale_bytes, zero_point = 3, 13, 13, 2, True
        else:
            group = rng.choice([1, 3, 5, 16, 32, 64, 128])
            out_f, in_f = rng.randint(1, 4096), group * rng.randint(1, 40)
            scale_bytes, zero_point = rng.choice([2, 4]), rng.random() < 0.5
        scheme = Q.QuantScheme(4, "group", group, not zero_point, "fp16" if scale_bytes == 2 else "fp32")
        expected = Q.storage_bytes((out_f, in_f), scheme).total
        what = (f"int4_nbytes({out_f}, {in_f}, group_size={group}, scale_bytes={scale_bytes}, "
                f"zero_point={zero_point})")
        got = check_int(what, fn(out_f, in_f, group, scale_bytes=scale_bytes, zero_point=zero_point))
        if got == expected:
            continue
        err = f"{what}: expected {expected:,} B, got {got:,} B"
        raise diagnose(err, got, {k: (lambda v=v: v) for k, v in
                                  _bytes_variants(out_f, in_f, group, scale_bytes, zero_point).items()},
                       lambda a, b: a == b)


# -- exercise 4: packing ----------------------------------------------------------------------
def _pack_variant(codes: torch.Tensor, *, swap=False, offset=False, magnitude=False) -> torch.Tensor:
    c = codes.to(torch.int16)
    if offset:
        nib = c + 8
    elif magnitude:
        nib = torch.where(c < 0, 8 | (-c).clamp(max=7), c)
    else:
        nib = c & 0xF
    if nib.shape[-1] % 2:
        nib = torch.nn.functional.pad(nib, (0, 1))
    low, high = nib[..., 0::2], nib[..., 1::2]
    if swap:
        low, high = high, low
    return (low | (high << 4)).to(torch.uint8)


_PACK_FAULTS = {
    "the nibble order swapped: element 2j must go in the LOW nibble (bits 0-3) and 2j+1 in the high nibble":
        dict(swap=True),
    "negative codes stored in offset binary (code + 8) instead of two's complement (code & 0xF: -1 -> 0b1111)":
        dict(offset=True),
    "negative codes stored as sign and magnitude instead of two's complement (code & 0xF: -1 -> 0b1111)":
        dict(magnitude=True),
}


def check_pack_int4(pack: Callable, unpack: Callable, seed: int = 0, cases: int = 5) -> None:
    """Contract: pack(codes) for int8 codes (..., n) in -8..7 returns uint8 (..., ceil(n/2)) equal
    byte for byte to the course layout (``docs/quantization.md#int4-packing``): element 2j in the low nibble
    of byte j, element 2j+1 in the high nibble, each code as a two's complement nibble (code & 0xF),
    a final high nibble of 0 when n is odd; unpack(packed, n) returns the int8 codes back, for all 16
    codes. Case 0 holds all 256 (low, high) pairs; case 1 is a (3, 7) tensor (odd n: a padded high
    nibble, and an unpack that must stop at n); the rest are random 1-D to 3-D tensors, odd n
    included."""
    check_own_function("pack_int4", pack)
    check_own_function("unpack_int4", unpack)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.getrandbits(31))
    for case in range(cases):
        if case == 0:
            values = torch.arange(-8, 8, dtype=torch.int8)
            codes = torch.stack(torch.meshgrid(values, values, indexing="ij"), dim=-1).reshape(-1)
        else:
            shape = [3, 7] if case == 1 else [rng.randint(1, 5) for _ in range(rng.randint(0, 2))] + [rng.randint(1, 41)]
            codes = torch.randint(-8, 8, shape, generator=gen, dtype=torch.int8)
        n = codes.shape[-1]
        what = f"pack_int4(case {case}: codes of shape {tuple(codes.shape)})"
        expected = P.pack_int4(codes)
        got = check_tensor(what, call_on_copies(what, pack, codes), shape=expected.shape, dtype=torch.uint8)
        if not torch.equal(got, expected):
            i = tuple((got != expected).nonzero()[0].tolist())
            j = 2 * i[-1]
            pair = codes[i[:-1] + (slice(j, j + 2),)].tolist()
            err = (f"{what}: byte {_where(i)} is 0x{int(got[i]):02X}, expected 0x{int(expected[i]):02X} "
                   f"(it packs codes {pair})")
            raise diagnose(err, got, {k: (lambda f=f: _pack_variant(codes, **f)) for k, f in _PACK_FAULTS.items()},
                           torch.equal)
        call = f"unpack_int4(pack_int4(codes), {n}) in case {case}"
        back = check_tensor(call, call_on_copies(call, unpack, expected, n), shape=codes.shape, dtype=torch.int8)
        if not torch.equal(back, codes):
            i = tuple((back != codes).nonzero()[0].tolist())
            raise ContractError(f"unpack_int4 (case {case}): code at {_where(i)} came back as {int(back[i])}, "
                                f"expected {int(codes[i])} (a nibble above 7 is negative: nibble - 16)")


# -- exercise 5: evaluation and calibration windows -------------------------------------------
def _starts(ids: torch.Tensor, windows: torch.Tensor, window: int) -> list[int | None]:
    """The token position each row of ``windows`` was cut from (the first consecutive slice of
    ``ids`` equal to it), None for a row that is no slice of ids."""
    slices = ids.unfold(0, window, 1)                    # (N - window + 1, window): every slice
    out = []
    for row in windows:
        hit = (slices == row).all(dim=1).nonzero()
        out.append(int(hit[0]) if hit.numel() else None)
    return out


def check_split_windows(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: fn(ids, window, n_eval, n_calib) returns two int64 tensors (n_eval, window) and
    (n_calib, window): the evaluation windows are the consecutive windows from token 0, the
    calibration windows the next consecutive windows after them, so no token position is in both
    (``docs/quantization.md#perplexity``). Even cases draw distinct token ids, odd cases ids from a
    small vocabulary (repeats, as in real text); the windows must equal the reference's exactly, and
    a failure says where each window was cut. Case 1 has exactly the tokens the windows need (enough:
    no ValueError). Finally, ids too short for the windows asked for must
    raise ValueError (``_check_too_short``), not return fewer windows."""
    check_own_function("split_windows", fn)
    rng = random.Random(seed)
    for case in range(cases):
        window, n_eval, n_calib = (512, 8, 4) if case == 0 else (rng.randint(2, 64), rng.randint(1, 8),
                                                                 rng.randint(1, 8))
        n = (n_eval + n_calib) * window + (0 if case == 1 else rng.randint(0, 3 * window))
        gen = torch.Generator().manual_seed(rng.getrandbits(31))
        ids = torch.randperm(n, generator=gen) if case % 2 == 0 else torch.randint(0, 50, (n,), generator=gen)
        what = f"split_windows(case {case}: {ids.numel()} tokens, window={window}, n_eval={n_eval}, n_calib={n_calib})"
        result = call_on_copies(what, fn, ids, window, n_eval, n_calib)
        if type(result) is not tuple or len(result) != 2:
            raise ContractError(f"{what} must return a tuple (eval_windows, calib_windows)")
        ev = check_tensor(f"{what}[0] (evaluation windows)", result[0], shape=(n_eval, window), dtype=torch.int64)
        ca = check_tensor(f"{what}[1] (calibration windows)", result[1], shape=(n_calib, window), dtype=torch.int64)
        ref_ev, ref_ca = token_windows(ids, window, n_eval, n_calib)
        if torch.equal(ev, ref_ev) and torch.equal(ca, ref_ca):
            continue
        got_ev, got_ca = _starts(ids, ev, window), _starts(ids, ca, window)
        evaluated = {p for start in got_ev if start is not None for p in range(start, start + window)}
        shared = [start for start in got_ca if start is not None and evaluated & set(range(start, start + window))]
        if shared:
            raise ContractError(f"{what}: the calibration windows overlap the evaluation windows (a calibration "
                                f"window starts at token position {shared[0]}, inside the evaluated text; "
                                f"evaluation windows start at {got_ev}); statistics calibrated on the text they "
                                "are evaluated on flatter the quantised model")
        raise ContractError(f"{what}: the windows start at token positions {got_ev} (evaluation) and {got_ca} "
                            f"(calibration; None: not a slice of ids); expected "
                            f"{[i * window for i in range(n_eval)]} and "
                            f"{[(n_eval + i) * window for i in range(n_calib)]} (evaluation windows are "
                            "consecutive from token 0, calibration windows follow them)")
    _check_too_short(fn)


def _check_too_short(fn: Callable) -> None:
    """split_windows on 10 tokens asked for 3 windows of 4 must raise ValueError: 12 tokens are needed,
    and fewer windows would silently shrink what the perplexity is measured on."""
    what = "split_windows(10 tokens, window=4, n_eval=2, n_calib=1)"
    try:
        result = fn(torch.arange(10), 4, 2, 1)
    except ValueError:
        return
    except (ContractError, KeyboardInterrupt):
        raise
    except Exception as exc:
        if is_grader_error(exc):
            raise
        raise ContractError(f"{what} must raise ValueError (12 tokens are needed), raised {type(exc).__name__}: "
                            f"{exc}") from None
    shapes = [tuple(t.shape) for t in result] if isinstance(result, tuple) else type(result).__qualname__
    raise ContractError(f"{what} returned {shapes} instead of raising ValueError: 12 tokens are needed, and "
                        "windows quietly dropped would change what the perplexity is measured on")


# -- exercise 6: perplexity -------------------------------------------------------------------
def sharp_toy_model(seed: int, vocab: int = 96, sharpness: float = 8.0):
    """A small random decoder (2 blocks, width 64, ``vocab`` tokens) whose output head is scaled by
    ``sharpness``, so its per-token losses, and so its per-window mean losses, vary widely."""
    model = toy_decoder(seed, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                        vocab_size=vocab)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model


@torch.no_grad()
def _window_nlls(model, windows: torch.Tensor, shift: int = 1) -> list[tuple[float, int]]:
    """(summed loss, predictions) per window: with shift 1 each position scored on the next token
    (the contract), 0 on its own token, -1 on the previous one."""
    out = []
    for ids in windows:
        logits = model(ids[None], torch.arange(ids.numel()))[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        if shift == 1:
            scored = logp[:-1].gather(1, ids[1:, None])
        elif shift == 0:
            scored = logp.gather(1, ids[:, None])
        else:
            scored = logp[1:].gather(1, ids[:-1, None])
        out.append((float(-scored.sum()), scored.numel()))
    return out


def _perplexity_variants(model, windows) -> dict[str, Callable[[], float]]:
    def nlls(shift=1):
        return _window_nlls(model, windows, shift)
    return {
        "the mean of per-window perplexities instead of exp of the mean loss over all predictions":
            lambda: sum(math.exp(s / c) for s, c in nlls()) / len(windows),
        "T predictions counted per window instead of T - 1 (the last position predicts nothing in the window)":
            lambda: math.exp(sum(s for s, _ in nlls()) / sum(c + 1 for _, c in nlls())),
        "each position scored on its own token instead of the next one (targets not shifted)":
            lambda: math.exp(sum(s for s, _ in nlls(0)) / sum(c for _, c in nlls(0))),
        "2 ** mean loss (the loss is in nats: exp, not 2 **)":
            lambda: 2 ** (sum(s for s, _ in nlls()) / sum(c for _, c in nlls())),
        "the shift reversed: logits at position t + 1 scored on token t (the previous token) instead of logits "
        "at t on token t + 1": lambda: math.exp(sum(s for s, _ in nlls(-1)) / sum(c for _, c in nlls(-1))),
        "the windows concatenated into one sequence (positions running on across windows) instead of scored "
        "one by one, each from position 0":
            lambda: math.exp(sum(s for s, c in _window_nlls(model, windows.reshape(1, -1))) / (windows.numel() - 1)),
    }


def check_perplexity(fn: Callable, seed: int = 0, cases: int = 3) -> None:
    """Contract: fn(model, windows) with windows (n, T) int64 returns exp of the mean next-token
    loss over all n * (T - 1) predictions (``docs/quantization.md#perplexity``; natural log), equal
    to ``course_lib.quant.perplexity`` (float64) to a relative 1e-4. ``model(ids (1, T), positions (T,))``
    returns logits (1, T, vocab). The model is a small random decoder with a sharpened head
    (``sharp_toy_model``), and each case's windows are redrawn until the mean of per-window
    perplexities differs from the right answer by more than 1 %."""
    check_own_function("perplexity", fn)
    rng = random.Random(seed)
    for case in range(cases):
        model = sharp_toy_model(rng.getrandbits(16))
        for _ in attempts("Lab 4"):
            n, T = (4, 32) if case == 0 else (rng.randint(2, 6), rng.randint(8, 48))
            gen = torch.Generator().manual_seed(rng.getrandbits(31))
            windows = torch.randint(0, model.config.vocab_size, (n, T), generator=gen)
            expected = reference_perplexity(model, windows)
            mean_of_windows = sum(math.exp(s / c) for s, c in _window_nlls(model, windows)) / n
            if abs(mean_of_windows / expected - 1) > 0.01:
                break
        what = f"perplexity(case {case}: {n} windows of {T} tokens)"
        got = check_real(what, call_on_copies(what, fn, model, windows))
        if close(got, expected, rel=PERPLEXITY_RELATIVE):
            continue
        err = f"{what}: expected {expected:.8g}, got {got:.8g} (relative tolerance {PERPLEXITY_RELATIVE:g})"
        raise diagnose(err, got, _perplexity_variants(model, windows),
                       lambda a, b: close(a, b, rel=PERPLEXITY_RELATIVE))


# -- exercise 7: SmoothQuant scales -----------------------------------------------------------
def _same_smoothing(got: torch.Tensor, candidate: torch.Tensor) -> bool:
    """GOT equals CANDIDATE: to a relative ``SMOOTH_RELATIVE`` where CANDIDATE is finite, and exactly
    (inf for inf, NaN for NaN) where it is not, so a finite value never matches an inf or a NaN."""
    got, candidate = got.double(), candidate.double()
    finite = torch.isfinite(candidate)
    if not bool(((got == candidate) | (got.isnan() & candidate.isnan()))[~finite].all()):
        return False
    return bool(torch.isfinite(got[finite]).all()) and \
        _first_over(got[finite], candidate[finite], SMOOTH_RELATIVE) is None


def check_smoothquant_scales(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: fn(act_absmax (in,), weight (out, in), alpha) returns float32 (in,) equal to
    s_j = max|X_j|^alpha / max_i |W_ij|^(1 - alpha), both maxima clamped to at least 1e-5
    (Xiao et al., SmoothQuant, arXiv:2211.10438; ``docs/quantization.md#smoothquant``), to a
    relative 1e-5. Case 0 uses alpha 0.8 (at 0.5 swapped exponents give the same scales); inputs
    include a few outlier channels, an all-zero weight column and a dead channel (max|X_j| = 0), so
    each clamp is checked on its own."""
    check_own_function("smoothquant_scales", fn)
    rng = random.Random(seed)
    for case in range(cases):
        gen = torch.Generator().manual_seed(rng.getrandbits(31))
        out_f, in_f = rng.randint(2, 48), rng.randint(4, 64)
        alpha = 0.8 if case == 0 else rng.choice([0.25, 0.5, 0.65, 0.8, round(rng.uniform(0.05, 0.95), 3)])
        weight = torch.randn(out_f, in_f, generator=gen) * 0.05
        zero_column, dead = rng.sample(range(in_f), k=2)
        weight[:, zero_column] = 0.0
        act = torch.rand(in_f, generator=gen) * 2 + 0.1
        for j in rng.sample(range(in_f), k=min(3, in_f)):
            act[j] *= rng.uniform(20, 200)
        act[dead] = 0.0
        what = f"smoothquant_scales(case {case}: act_absmax ({in_f},), weight ({out_f}, {in_f}), alpha={alpha})"
        expected = SQ.smoothing_scales(act, weight, alpha)
        got = check_tensor(what, call_on_copies(what, fn, act, weight, alpha), shape=(in_f,), dtype=torch.float32,
                           allow_nan=True)      # an inf or NaN is reported below, with its likely cause
        infinite = ~torch.isfinite(got)
        first = tuple(infinite.nonzero()[0].tolist()) if bool(infinite.any()) else \
            _first_over(got, expected, SMOOTH_RELATIVE)
        if first is None:
            continue
        j = first[0]
        err = (f"{what}: s[{j}] = {float(got[j]):.8g}, expected {float(expected[j]):.8g} (max|X_j| = "
               f"{float(act[j]):.6g}, max_i |W_ij| = {float(weight[:, j].abs().max()):.6g})")
        w_abs = weight.abs().amax(dim=0)
        x_max, w_max = act.clamp(min=1e-5), w_abs.clamp(min=1e-5)
        raise diagnose(err, got, {
            "the exponents swapped: max|X_j|^(1 - alpha) / max|W_j|^alpha instead of max|X_j|^alpha / max|W_j|^(1 - alpha)":
                lambda: x_max ** (1 - alpha) / w_max ** alpha,
            "the ratio inverted: max|W_j|^(1 - alpha) / max|X_j|^alpha": lambda: w_max ** (1 - alpha) / x_max ** alpha,
            "the activation maxima not clamped to 1e-5: a dead channel (max|X_j| = 0) gets s = 0":
                lambda: act ** alpha / w_max ** (1 - alpha),
            "the weight maxima not clamped to 1e-5: an all-zero weight column gets s = inf":
                lambda: x_max ** alpha / w_abs ** (1 - alpha),
            "neither maximum clamped to 1e-5": lambda: act ** alpha / w_abs ** (1 - alpha),
        }, _same_smoothing)


# -- exercise 8: the W4A16 kernel ---------------------------------------------------------------
#: (BLOCK_N, BLOCK_K) pairs the checker launches with.
W4A16_BLOCKS = ((16, 16), (16, 32), (32, 16), (32, 64))


def w4a16_kernel_cases(rng: random.Random, cases: int) -> list[tuple]:
    """(M, N, K, G, zero_points, BLOCK_N, BLOCK_K, x dtype) per case. Case 0: signed codes, N and K
    both ragged over at least two K tiles, groups that do not divide BLOCK_K; case 1: zero points,
    odd K (odd G: a padding nibble ends each packed row), one row of x; case 2: signed, bfloat16
    activations; then random. Sizes stay small: the interpreter runs every program in Python."""
    drawn = []
    for case in range(cases):
        bn, bk = W4A16_BLOCKS[rng.randrange(len(W4A16_BLOCKS))]
        zero_points = case == 1 or (case > 2 and rng.random() < 0.5)
        if case == 0:
            bn, bk = 16, 32
            g = rng.choice((12, 24, 20))
            groups = rng.choice([t for t in range(2, 12) if (g * t) % bk and g * t > bk])
        elif case == 1:
            g, groups = rng.choice((3, 5, 7, 9)), rng.randint(3, 7)
        else:
            g = rng.choice((2, 4, 6, 8, 16, 32))
            groups = rng.randint(1, max(1, 96 // g))
        m = 1 if case == 1 else rng.randint(1, 3)
        n = bn * rng.randint(1, 2) + rng.randint(1, bn - 1) if case < 3 else rng.randint(1, 40)
        dtype = torch.bfloat16 if case == 2 or (case > 2 and rng.random() < 0.3) else torch.float32
        drawn.append((m, n, g * groups, g, zero_points, bn, bk, dtype))
    return drawn


def _w4a16_stray(n: int, k: int, block_n: int) -> Callable[[dict], str]:
    """The diagnosis of a W4A16 kernel's stray access (``kernel_checks.launch_case``'s name_stray)."""
    strides = {"x": "stride_xm", "packed": "stride_pn", "scales": "stride_sn", "zeros": "stride_zn", "y": "stride_ym"}

    def name(v: dict) -> str:
        tensor, index, steps = v["tensor"], v["index"], v.get("steps") or []
        if tensor == "zeros" and not v["shape"][0]:
            return "HAS_ZEROS is False, and then z_ptr points to an empty tensor: load zero points only under `if HAS_ZEROS:`"
        if tensor == "packed" and len(steps) == 2 and steps[1] == 1:
            return ("a tile's codes were read from consecutive bytes: code k is in byte k // 2 (two codes per byte), "
                    "so the byte offset is cols // 2, and the same mask cols < K keeps it inside the row")
        if tensor == "x" and len(index) == 2 and v["inside_buffer"] and index[0] != v["program"][0]:
            return (f"program {tuple(v['program'])} reached row {index[0]} of x: row m of x starts m * stride_xm "
                    "elements after x_ptr (stride_xm, not K or another tensor's stride), and program (m, j) reads row m")
        if (tensor in ("packed", "scales", "zeros") and len(steps) == 2 and steps[0] is not None
                and steps[0] != v["strides"][0]):
            return (f"the rows of {tensor} were addressed {steps[0]} elements apart, but row n starts at n * "
                    f"{strides[tensor]} = n * {v['strides'][0]}: use {strides[tensor]}")
        if tensor == "y" and len(index) == 2 and v["inside_buffer"]:
            m, j = v["program"][0], v["program"][1]
            # programs run row m = 0 first: a missing row mask strays there, a wrong row stride only from m = 1
            if m > 0 or index[0] != m or not j * block_n <= index[1] < (j + 1) * block_n:
                return (f"the offset of row m of y is wrong: program {tuple(v['program'])} owns y[{m}, "
                        f"{j * block_n}:{min((j + 1) * block_n, n)}], which starts {m} * stride_ym elements after y_ptr "
                        "(y[m, n] is y_ptr + m * stride_ym + n; the programs of row 0 stored inside y)")
        if not v["inside_buffer"]:
            return ("an address far from every tensor: an offset is wrong (code k of W's row n is in byte "
                    "p_ptr + n * stride_pn + k // 2; its scale at s_ptr + n * stride_sn + k // G; x[m, k] at "
                    "x_ptr + m * stride_xm + k; y[m, n] at y_ptr + m * stride_ym + n)")
        if len(index) == 2 and tensor in ("packed", "scales", "zeros", "x") and index[1] >= v["shape"][1]:
            what = {"packed": "the packed codes", "scales": "the scales", "zeros": "the zero points", "x": "x"}[tensor]
            return (f"the tail mask is left out of the load of {what}: the last tile of BLOCK_K columns goes past "
                    f"column {k - 1} (mask the columns with cols < K)")
        if len(index) == 2 and tensor in ("packed", "scales", "zeros", "y") and index[tensor == "y"] >= n:
            return (f"the row mask is left out: the last program's rows of W go past row {n - 1} (mask them with "
                    "rows < N)")
        return ""
    return name


def _w4a16_variant(x, codes, scales, g, zeros, *, swap=False, unsigned=False, signed=False, no_zero=False,
                   byte_group=False, offset=False, tile=0):
    """y from codes read with one fault: nibbles of each byte swapped, signed codes read as 0..15 or as
    nibble - 8 (offset binary), zero-point codes sign-extended, the zero point left out, the group of code
    k taken as (k // 2) // G, or (TILE > 0) one group per tile of TILE columns (that of its first column)."""
    q = codes.to(torch.int64)
    if offset:
        q = (q & 0xF) - 8
    if swap:
        nibbles = q & 0xF
        if nibbles.shape[1] % 2:
            nibbles = torch.nn.functional.pad(nibbles, (0, 1))
        nibbles = nibbles.reshape(nibbles.shape[0], -1, 2).flip(-1).reshape(nibbles.shape[0], -1)[:, :q.shape[1]]
        q = nibbles if zeros is not None else torch.where(nibbles > 7, nibbles - 16, nibbles)
    if unsigned:
        q = q & 0xF
    if signed:
        q = torch.where(q > 7, q - 16, q)
    k = torch.arange(q.shape[1])
    group = (k // 2) // g if byte_group else (k // tile * tile) // g if tile else k // g
    w = q.double()
    if zeros is not None and not no_zero:
        w = w - zeros.double()[:, group]
    w = w * scales.double()[:, group]
    return x.double() @ w.T


def check_w4a16_kernel(kernel, seed: int = 0, cases: int = 3) -> None:
    """Contract: the learner's ``@triton.jit`` W4A16 kernel computes y = x @ W_hat^T with W_hat
    dequantised from packed int4 codes in registers, launched by the course
    (``course_lib.kernels.exercise.launch_w4a16``: the grid, the allocation, BLOCK_N and BLOCK_K from
    ``W4A16_BLOCKS``) under Triton's interpreter, on the cases ``w4a16_kernel_cases`` draws:

    - every lane it loads or stores addresses an element of x, packed, scales, zeros or y (each sits in
      a buffer whose rows are wider than the tensor's, so a missing column mask shows on every row);
    - y equals ``course_lib.kernels.w4a16.reference_w4a16`` (dequantise in float32, then multiply)
      within float32 rounding: |y - ref| <= 4 K 2^-24 sum_k |x_mk w_hat_nk| + 1e-30.
    Codes span all 16 values; scales are float16 in [0.01, 0.1]; zero points uint8 in 0..15."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case, (m, n, k, g, zero_points, bn, bk, dtype) in enumerate(w4a16_kernel_cases(rng, cases)):
        low, high = (0, 16) if zero_points else (-8, 8)
        codes = torch.randint(low, high, (n, k), generator=gen, dtype=torch.int16)
        packed = P.pack_int4(torch.where(codes > 7, codes - 16, codes).to(torch.int8))
        scales = (0.01 + 0.09 * torch.rand(n, k // g, generator=gen)).half()
        zeros = torch.randint(0, 16, (n, k // g), generator=gen, dtype=torch.uint8) if zero_points else None
        x = torch.randn(m, k, generator=gen).to(dtype)
        what = (f"w4a16_kernel(case {case}: x {m} x {k} {str(dtype).replace('torch.', '')}, W {n} x {k} int4 "
                f"{'with zero points' if zero_points else 'signed'}, G {g}, BLOCK_N {bn}, BLOCK_K {bk})")

        def run(x_in):
            y = launch_case(kernel, "w4a16", what, _w4a16_stray(n, k, bn), x_in, packed, scales, g, zeros,
                            block_n=bn, block_k=bk)
            return check_tensor(f"{what}: y", y, shape=(m, n), dtype=torch.float32, allow_nan=True)

        y = run(x)
        check_all_stored(what, y, "Program (m, j) owns y[m, j * BLOCK_N : (j + 1) * BLOCK_N]")
        expected = reference_w4a16(x, packed, scales, g, zeros)
        q = codes.double() - (zeros.double().repeat_interleave(g, dim=1) if zeros is not None else 0)
        w_abs = (q * scales.double().repeat_interleave(g, dim=1)).abs()
        bound = 4 * k * 2.0 ** -24 * (x.double().abs() @ w_abs.T) + 1e-30
        err = (y.double() - expected.double()).abs()
        if bool((err <= bound).all()):
            continue
        r, c = (int(i) for i in (err > bound).nonzero()[0])
        failure = ContractError(f"{what}: y[{r}, {c}] = {float(y[r, c]):.6g}, expected {float(expected[r, c]):.6g} "
                                f"(|diff| {float(err[r, c]):.3g} > allowed {float(bound[r, c]):.3g}); "
                                f"{int((err > bound).sum())} of {y.numel()} values over")
        raise_if_bfloat16_arithmetic(failure, dtype, lambda: bool(((run(x.float()).double() - expected.double()).abs()
                                                                   <= bound).all()), "x's tile")
        xf = x.float()
        variants = {
            "the nibble order swapped: code k is in the LOW nibble (bits 0-3) of byte k // 2 when k is even, the "
            "high nibble when k is odd": lambda: _w4a16_variant(xf, codes, scales, g, zeros, swap=True),
            "the group of code k taken from its byte, (k // 2) // G, instead of k // G":
                lambda: _w4a16_variant(xf, codes, scales, g, zeros, byte_group=True),
        }
        if len(range(0, k, bk)) > 1:
            variants[f"one group per K tile: the scale of each tile's first column (k0 // G) used for all its "
                     f"{bk} columns; the group of code k is k // G"] = \
                lambda: _w4a16_variant(xf, codes, scales, g, zeros, tile=bk)
        if zeros is None:
            variants["signed codes read as nibble - 8 (offset binary): they are two's complement nibbles, so "
                     "sign-extend them with (q ^ 8) - 8"] = lambda: _w4a16_variant(xf, codes, scales, g, zeros, offset=True)
            variants["signed codes read as 0..15: without zero points a nibble above 7 is negative (sign-extend it: "
                     "(q ^ 8) - 8)"] = lambda: _w4a16_variant(xf, codes, scales, g, zeros, unsigned=True)
        else:
            variants["zero-point codes sign-extended: with zero points the codes are unsigned, 0..15"] = \
                lambda: _w4a16_variant(xf, codes, scales, g, zeros, signed=True)
            variants["the zero point left out: w_hat = (q - z) * s"] = \
                lambda: _w4a16_variant(xf, codes, scales, g, zeros, no_zero=True)
        raise diagnose(failure, y, variants, lambda got, cand: bool(((got.double() - cand).abs() <= bound).all()))


# -- the lab's declared tables (see tables.py) -------------------------------------------------
#: Everything in course_lib that quantises or dequantises a weight: the quantisation exercises' references.
_QUANTIZERS = ("course_lib.quant.formats.quantize", "course_lib.quant.formats.dequantize",
               "course_lib.quant.formats.fake_quantize", "course_lib.quant.formats.QuantizedTensor.dequantize",
               "course_lib.quant.packing.pack_weight", "course_lib.quant.packing.PackedInt4.dequantize",
               "course_lib.quant.gptq.gptq_quantize")

CONTRACTS = (
    Contract("test_quantize_symmetric", check_quantize_symmetric, ("quantize_symmetric", "dequantize_symmetric"),
             references=_QUANTIZERS),
    Contract("test_quantize_asymmetric", check_quantize_asymmetric, ("quantize_asymmetric", "dequantize_asymmetric"),
             references=_QUANTIZERS),
    Contract("test_int4_nbytes", check_int4_nbytes, ("int4_nbytes",),
             references=("course_lib.quant.formats.storage_bytes", "course_lib.quant.formats.bits_per_weight",
                         "course_lib.quant.formats.StorageBytes.total",
                         "course_lib.quant.formats.StorageBytes.bits_per_weight",
                         "course_lib.quant.packing.PackedInt4.nbytes")),
    Contract("test_pack_int4", check_pack_int4, ("pack_int4", "unpack_int4"),
             references=("course_lib.quant.packing.pack_int4", "course_lib.quant.packing.unpack_int4",
                         "course_lib.quant.packing.pack_weight", "course_lib.quant.packing.PackedInt4.from_quantized",
                         "course_lib.quant.packing.PackedInt4.dequantize")),
    Contract("test_split_windows", check_split_windows, ("split_windows",),
             references=("course_lib.quant.perplexity.token_windows",)),
    Contract("test_perplexity", check_perplexity, ("perplexity",),
             references=("course_lib.quant.perplexity.perplexity", "course_lib.quant.perplexity.window_nll")),
    Contract("test_smoothquant_scales", check_smoothquant_scales, ("smoothquant_scales",),
             references=("course_lib.quant.smoothquant.smoothing_scales",)),
    Contract("test_w4a16_kernel", check_w4a16_kernel, ("w4a16_kernel",), launcher="w4a16",
             references=("course_lib.kernels.w4a16.reference_w4a16", "course_lib.kernels.w4a16.w4a16_matmul")),
)

FAULTS = (
    Fault("qmax_power_of_two",
          (Edit("quantize_symmetric", "qmax = 2 ** (bits - 1) - 1", "qmax = 2 ** (bits - 1)"),),
          {"test_quantize_symmetric": r"qmax = 2\^\(b-1\) instead"},
          "uses qmax = 2^(b-1), one code past the symmetric range"),
    Fault("groups_strided",
          (Edit("quantize_symmetric", "groups = w.reshape(out_f, in_f // group_size, group_size)",
                "groups = w.reshape(out_f, group_size, in_f // group_size).transpose(1, 2)"),),
          {"test_quantize_symmetric": "groups taken strided"},
          "groups every (in // group_size)-th input together instead of runs of group_size consecutive ones"),
    Fault("scale_from_max",
          (Edit("quantize_symmetric", "absmax = groups.abs().amax(dim=-1)", "absmax = groups.amax(dim=-1)"),),
          {"test_quantize_symmetric": "largest value instead of the largest absolute value"},
          "takes the scale from the largest weight instead of the largest magnitude"),
    Fault("zero_point_off_by_one",
          (Edit("quantize_asymmetric", "zeros = torch.clamp(torch.round(-lo / scales), 0, levels)",
                "zeros = torch.clamp(torch.round(-lo / scales) + 1, 0, levels)"),),
          {"test_quantize_asymmetric": "zero point off by one"},
          "shifts the zero point by one code"),
    Fault("scale_metadata_left_out",
          (Edit("int4_nbytes", "return payload + scales + zeros", "return payload + zeros"),),
          {"test_int4_nbytes": "scale metadata left out"},
          "counts the packed codes but not the scales stored beside them"),
    Fault("nibble_order_swapped",
          (Edit("pack_int4", "return (low | (high << 4)).to(torch.uint8)", "return (high | (low << 4)).to(torch.uint8)"),),
          {"test_pack_int4": "nibble order swapped"},
          "puts the first code of each pair in the high nibble"),
    Fault("sign_not_twos_complement",
          (Edit("pack_int4", "nibbles = codes.to(torch.int16) & 0xF", "nibbles = codes.to(torch.int16) + 8"),),
          {"test_pack_int4": "offset binary"},
          "stores negative codes as code + 8 instead of two's complement nibbles"),
    Fault("calibration_windows_evaluated",
          (Edit("split_windows", "calib = ids[n_eval * window:needed]", "calib = ids[:n_calib * window]"),),
          {"test_split_windows": "calibration windows overlap the evaluation windows"},
          "calibrates on the windows it evaluates on"),
    Fault("perplexity_mean_of_windows",
          (Edit("perplexity", "return math.exp(sum(nlls) / sum(counts))",
                "return sum(math.exp(s / c) for s, c in zip(nlls, counts)) / len(nlls)"),),
          {"test_perplexity": "mean of per-window perplexities"},
          "averages per-window perplexities instead of taking exp of the mean loss"),
    Fault("smoothquant_exponents_swapped",
          (Edit("smoothquant_scales", "return x_max ** alpha / w_max ** (1 - alpha)",
                "return x_max ** (1 - alpha) / w_max ** alpha"),),
          {"test_smoothquant_scales": "exponents swapped"},
          "raises the activation maximum to 1 - alpha and the weight maximum to alpha"),
    Fault("smoothquant_dead_channel_unclamped",
          (Edit("smoothquant_scales", "x_max = act_absmax.clamp(min=1e-5)", "x_max = act_absmax"),),
          {"test_smoothquant_scales": "activation maxima not clamped"},
          "clamps the weight maxima but not the activation maxima, so a channel that never fires gets s = 0"),
    Fault("w4a16_nibble_order_swapped",
          (Edit("w4a16_kernel", "q = (byte >> (4 * (cols % 2))[None, :]) & 0xF",
                "q = (byte >> (4 - 4 * (cols % 2))[None, :]) & 0xF"),),
          {"test_w4a16_kernel": "nibble order swapped"},
          "reads even codes from the high nibble and odd codes from the low one"),
    Fault("w4a16_sign_extension_left_out",
          (Edit("w4a16_kernel", "w = ((q ^ 8) - 8).to(tl.float32) * s", "w = q.to(tl.float32) * s"),),
          {"test_w4a16_kernel": "signed codes read as 0..15"},
          "reads signed codes as unsigned nibbles: -1 becomes 15"),
    Fault("w4a16_tail_mask_left_out",
          (Edit("w4a16_kernel", "ok = row_ok[:, None] & (cols < K)[None, :]", "ok = row_ok[:, None]"),),
          {"test_w4a16_kernel": "tail mask is left out of the load of the packed codes"},
          "loads the packed codes, scales and zero points of the last K tile without a column mask"),
    Fault("w4a16_group_from_byte_index",
          (Edit("w4a16_kernel", "group = (cols // G)[None, :]", "group = (cols // 2 // G)[None, :]"),),
          {"test_w4a16_kernel": r"group of code k taken from its byte"},
          "takes each code's group from its byte index, so the scales run at half speed"),
)
check_tables(CONTRACTS, FAULTS)
