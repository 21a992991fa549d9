"""Graded checks for Lab 2 (KV-cache equivalence).

Each ``check_*`` takes the learner's *function*, builds its own inputs from a seed
(fixed for the visible checks, ``fresh_seed()`` for hidden tests), runs the function,
and compares the result with a course_lib reference under a contract from
``contracts``. When a contract fails, the checker also tries the known faults of
course Lab 2 (the decoder's blocks: SwiGLU's gate added instead of multiplied, RMSNorm's eps or
weight missing, LayerNorm's unbiased variance or missing weight, silu's derivative taken as the
sigmoid, a tied weight's gradient from one use only, repeated ids overwriting each other; rotary
position off by one, frozen position, position reset on append, misaligned KV-head repeat, a causal mask aligned top-left, cache never cropped; the online
softmax's sums not rescaled when the maximum grows, the maximum not subtracted; the paged decode kernel's
KV head, unmasked tail, running sum and an integer running sum a GPU's compiler refuses) and
names the one the learner's numbers match, so the message states the symptom, not just "wrong".
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import random
from typing import Callable

import torch

from ..cache.contiguous import KVCache
from ..cache.paged import BlockPool, PagedSequence
from ..divergence import first_divergence
from ..models.attention import attend_with_cache, causal_attention
from ..models.config import ModelConfig, toy_config
from ..models.decoder import Decoder, generate_full_recompute
from ..models.online_softmax import initial_state
from ..models.rope import apply_rope
from ..validation import instance
from .contracts import (ContractError, call_on_copies, check_bytes, check_close, check_int_list, check_logits_close,
                        check_own_function, check_tensor, diagnose, is_grader_error, with_diagnosis)
from .kernel_checks import launch_case, raise_if_bfloat16_arithmetic
from .tables import Contract, Edit, Fault, Probe, Writes, check_tables

# -- helpers ----------------------------------------------------------------------------------


def _matches(candidate: torch.Tensor, got: torch.Tensor, atol: float = 1e-5) -> bool:
    return (candidate.shape == got.shape and candidate.dtype == got.dtype
            and bool(torch.allclose(got, candidate, atol=atol, rtol=1e-5)))


def _matches_within(atol: float) -> Callable[[torch.Tensor, torch.Tensor], bool]:
    """``contracts.diagnose``'s comparison for tensors: same shape and dtype, allclose within atol."""
    return lambda got, candidate: _matches(candidate, got, atol)


def interleaved_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE with interleaved pairs (x_0, x_1), (x_2, x_3), ... (the GPT-J / original RoFormer
    layout) instead of the split-half pairs the course's models use: the fault a learner makes by
    following the paper's notation with Llama weights (docs/kv_cache.md#split-half-pairing).
    x (B, H, T, D) float32; positions (T,) or (B, T) int64; returns x's shape and dtype."""
    D = x.shape[-1]
    omega = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = positions.to(torch.float32)[..., None] * omega
    ang = ang[None, None] if positions.dim() == 1 else ang[:, None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1)
    return out.flatten(-2)


# -- the decoder's blocks: RMSNorm, SwiGLU, their backward passes, LayerNorm, the tied embedding ------
@functools.lru_cache(maxsize=1)
def smollm2_model() -> Decoder:
    """SmolLM2-135M on the course's weights (``course_lib.data.load_smollm2``, its provenance line not
    printed), loaded once per process: the blocks check's model when none is passed, and the grading
    judge's own copy of the notebook's ``smollm2`` (``CONTRACTS``' ``objects``). Never handed to learner
    code (its checks pass tensors), so one copy serves every check.

    Raises: ``course_lib.data.ArtifactError`` when no copy of the weights is available."""
    from ..data import load_smollm2

    with contextlib.redirect_stdout(io.StringIO()):
        model, _, _ = load_smollm2()
    return model


class _Captured(Exception):
    """Raised by a forward hook to end a forward once the input it waits for is captured."""


@torch.no_grad()
def _norm_input(model: Decoder, ids: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """The input that the RMSNorm module NORM of MODEL receives in a plain forward of ids (1, T): the
    residual stream there, (1, T, d_model) float32. The forward stops at NORM."""
    captured = []

    def hook(module, inputs):
        captured.append(inputs[0].detach().clone())
        raise _Captured

    handle = norm.register_forward_pre_hook(hook)
    try:
        model(ids, torch.arange(ids.shape[1]))
    except _Captured:
        pass
    finally:
        handle.remove()
    return captured[0]


def _with_zero_row(x: torch.Tensor, row: int) -> torch.Tensor:
    """x (..., T, d) with a row of zeros inserted at index ROW of its second-last axis."""
    zero = torch.zeros_like(x.narrow(-2, 0, 1))
    return torch.cat([x.narrow(-2, 0, row), zero, x.narrow(-2, row, x.shape[-2] - row)], dim=-2)


def _rms_variants(x: torch.Tensor, weight: torch.Tensor, eps: float) -> dict:
    """RMSNorm with the mistakes the forward check names, in float32."""
    ms = x.pow(2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    return {
        "the weight (the learned per-channel scale) not applied: x / sqrt(mean(x^2) + eps) is returned "
        "without the final * weight": lambda: x / torch.sqrt(ms + eps),
        "eps added outside the square root: x / (sqrt(mean(x^2)) + eps); it belongs inside, "
        "x / sqrt(mean(x^2) + eps)": lambda: x / (torch.sqrt(ms) + eps) * weight,
        "the mean subtracted first (that is LayerNorm's centring; RMSNorm divides x itself by its root mean "
        "square)": lambda: centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * weight,
        "divided by the root of the sum of squares instead of the mean (the 1/d missing)":
            lambda: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps) * weight,
        "multiplied by sqrt(mean(x^2) + eps) instead of divided by it": lambda: x * torch.sqrt(ms + eps) * weight,
    }


def _swiglu_variants(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> dict:
    """SwiGLU with the mistakes the forward check names, in float32."""
    F = torch.nn.functional
    g, u = x @ w_gate.T, x @ w_up.T
    return {
        "the gate and the up projection added, silu(gate(x)) + up(x): SwiGLU multiplies them element-wise, "
        "silu(gate(x)) * up(x)": lambda: (F.silu(g) + u) @ w_down.T,
        "silu applied to the up projection instead of the gate: silu(up(x)) * gate(x)": lambda: (F.silu(u) * g) @ w_down.T,
        "no silu: gate(x) * up(x) (a bilinear layer)": lambda: (g * u) @ w_down.T,
        "sigmoid in place of silu: silu(z) = z * sigmoid(z)": lambda: (torch.sigmoid(g) * u) @ w_down.T,
        "the down projection left out (the result has d_ff columns)": lambda: F.silu(g) * u,
    }


def _close_within(atol: float, rtol: float) -> Callable[[torch.Tensor, torch.Tensor], bool]:
    """``diagnose``'s comparison: same shape, |got - candidate| <= atol + rtol |candidate| everywhere."""
    def same(got, candidate):
        return (tuple(got.shape) == tuple(candidate.shape) and
                bool(((got.double() - candidate.double()).abs()
                      <= atol + rtol * candidate.double().abs()).all()))
    return same


#: Relative tolerances of the blocks' float32 forward contracts: |got - reference| <= BLOCK_ATOL *
#: max|reference| + BLOCK_RTOL * |reference|, about 20 times what another float32 order of the same
#: sums gives on SmolLM2's activations (measured: 6e-7 of the largest output).
BLOCK_ATOL, BLOCK_RTOL = 1e-5, 1e-5


def _check_block_output(what: str, got, expected: torch.Tensor, variants: dict) -> None:
    """Compare a float32 block output with the reference within BLOCK_ATOL / BLOCK_RTOL; on failure
    name the variants that equal it."""
    out = check_tensor(what, got, shape=expected.shape, dtype=torch.float32)
    atol = BLOCK_ATOL * float(expected.abs().max())
    try:
        check_close(out, expected, atol=atol, rtol=BLOCK_RTOL, what=what)
    except ContractError as err:
        raise diagnose(err, out, variants, _close_within(atol, BLOCK_RTOL)) from None


def check_blocks_forward(rms_norm_fn: Callable, swiglu_fn: Callable, seed: int = 0,
                         model: Decoder | None = None, tokens: int = 8) -> None:
    """Contract: the two forward blocks of a SmolLM2 decoder layer, on its real weights and activations.

    - ``rms_norm_fn(x (..., d) float32, weight (d,) float32, eps: float)`` returns float32 of x's shape equal
      to the model's own RMSNorm module (``RMSNorm.forward``: x / sqrt(mean(x^2) + eps) * weight, Zhang &
      Sennrich 2019, arXiv:1910.07467) on: the embedded tokens with layer 0's ``input_layernorm``, and the
      residual stream entering a drawn layer's ``post_attention_layernorm`` (a 3-D x). Each x has one
      all-zero row, whose output must be 0: eps keeps 0 / 0 from giving NaN.
    - ``swiglu_fn(x (..., d) float32, w_gate (d_ff, d), w_up (d_ff, d), w_down (d, d_ff))`` returns
      float32 (..., d) equal to that layer's feed-forward (``Block.mlp``: down(silu(gate(x)) * up(x)),
      Shazeer 2020, arXiv:2002.05202) on the normalised activations it really receives.

    Tolerance: |got - reference| <= 1e-5 max|reference| + 1e-5 |reference| (``BLOCK_ATOL``, ``BLOCK_RTOL``).
    ``tokens`` random token ids are embedded; ``model`` is the notebook's SmolLM2 (None: ``smollm2_model()``)."""
    check_own_function("rms_norm", rms_norm_fn)
    check_own_function("swiglu", swiglu_fn)
    model = model if model is not None else smollm2_model()
    instance("model", model, Decoder)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    c = model.config
    layer = rng.randrange(1, c.n_layers)
    ids = torch.randint(0, c.vocab_size, (1, tokens), generator=gen)
    block = model.layers[layer]
    with torch.no_grad():
        embedded = model.embed_tokens(ids)[0]                                            # (T, d)
        residual = _norm_input(model, ids, block.post_attention_layernorm)               # (1, T, d)
        normed = block.post_attention_layernorm(residual)
        ffn = block.mlp(normed)
    norm_cases = [("the embedded tokens, layer 0's input_layernorm", embedded, model.layers[0].input_layernorm),
                  (f"the residual stream entering layer {layer}'s post_attention_layernorm", residual,
                   block.post_attention_layernorm)]
    for case, (source, x, norm) in enumerate(norm_cases):
        zero_row = rng.randrange(x.shape[-2] + 1)
        x = _with_zero_row(x, zero_row)
        eps, weight = float(norm.eps), norm.weight.detach()
        with torch.no_grad():
            expected = norm(x)
        what = (f"rms_norm(case {case}: {source}, x {tuple(x.shape)} with row {zero_row} all zeros, "
                f"eps {eps:.3g})")
        got = call_on_copies(what, rms_norm_fn, x, weight, eps)
        out = check_tensor(f"{what} output", got, shape=expected.shape, dtype=torch.float32, allow_nan=True)
        zero_out = out.select(-2, zero_row)
        if not bool(torch.isfinite(zero_out).all()):
            raise with_diagnosis(ContractError(
                f"{what}: the all-zero row gave {'NaN' if bool(zero_out.isnan().any()) else 'inf'}: its root mean "
                f"square is 0, so x / sqrt(mean(x^2)) is 0 / 0"),
                "eps missing (or 0): it goes inside the square root, x / sqrt(mean(x^2) + eps), so an all-zero "
                "row gives 0 instead of NaN", likely=False)
        if not bool(torch.isfinite(out).all()):
            raise ContractError(f"{what} output contains NaN or inf on rows that are not zero")
        _check_block_output(f"{what} output", out, expected, _rms_variants(x, weight, eps))
    weights = (block.gate_proj.weight.detach(), block.up_proj.weight.detach(), block.down_proj.weight.detach())
    for case, x in enumerate((normed[0], normed)):
        what = f"swiglu(case {case}: layer {layer}'s feed-forward on its normalised input, x {tuple(x.shape)})"
        expected = ffn[0] if x.dim() == 2 else ffn
        got = call_on_copies(what, swiglu_fn, x, *weights)
        _check_block_output(f"{what} output", got, expected, _swiglu_variants(x, *weights))


# the backward passes, against torch.autograd in float64
def _rms_forward64(x, weight, eps):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def _swiglu_forward64(x, w_gate, w_up, w_down):
    F = torch.nn.functional
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _autograd(forward: Callable, inputs: tuple, grad_y: torch.Tensor) -> tuple:
    """The gradient of sum(forward(*inputs) * grad_y) with respect to each input (float64), by torch.autograd."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    with torch.enable_grad():
        y = forward(*leaves)
    return torch.autograd.grad(y, leaves, grad_y)


def _rms_backward_variants(x, weight, eps, grad_y) -> dict:
    """Per output (0: grad_x, 1: grad_weight), RMSNorm backward passes with the mistakes the check names."""
    d = x.shape[-1]
    r = (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    u = grad_y * weight
    lead = tuple(range(x.dim() - 1))
    return {0: {
        "1 / rms treated as a constant: the term through mean(x^2), - x r^3 sum(grad_y * weight * x) / d, "
        "is missing": lambda: r * u,
        "the weight left out of grad_x (the upstream gradient reaching x / rms is grad_y * weight)":
            lambda: r * grad_y - x * r ** 3 * (grad_y * x).sum(-1, keepdim=True) / d,
        "the 1/d of the mean missing from the second term": lambda: r * u - x * r ** 3 * (u * x).sum(-1, keepdim=True),
    }, 1: {
        "grad_weight summed without the normalisation: sum(grad_y * x) instead of sum(grad_y * x / rms)":
            lambda: (grad_y * x).sum(lead),
        "grad_weight taken from the output: sum(grad_y * y) counts the weight once more":
            lambda: (grad_y * x * r * weight).sum(lead),
    }}


def _swiglu_backward_variants(x, w_gate, w_up, w_down, grad_y) -> dict:
    """Per output (0: grad_x, 1: grad_w_gate, 2: grad_w_up, 3: grad_w_down), SwiGLU backward passes with
    the mistakes the check names."""
    g, u = x @ w_gate.T, x @ w_up.T
    s = torch.sigmoid(g)
    silu = g * s
    grad_h = grad_y @ w_down
    grad_g_sigmoid = grad_h * u * s                      # silu'(g) taken as sigmoid(g)
    grad_g = grad_h * u * s * (1 + g * (1 - s))
    grad_u = grad_h * silu
    x2 = x.reshape(-1, x.shape[-1])

    def flat(t):
        return t.reshape(-1, t.shape[-1])
    sig = "silu'(z) taken as sigmoid(z): silu(z) = z sigmoid(z), so silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z)))"
    return {0: {
        sig: lambda: grad_g_sigmoid @ w_gate + grad_u @ w_up,
        "grad_x only through the gate: x feeds both gate(x) and up(x), and grad_x is the sum of both paths":
            lambda: grad_g @ w_gate,
        "grad_x only through the up projection: x feeds both gate(x) and up(x), and grad_x is the sum of both "
        "paths": lambda: grad_u @ w_up,
    }, 1: {
        sig: lambda: flat(grad_g_sigmoid).T @ x2,
        "grad_w_gate without silu's derivative (grad_h * up(x) used as the gradient at gate(x))":
            lambda: flat(grad_h * u).T @ x2,
    }, 2: {
        "grad_w_up from gate(x) instead of silu(gate(x))": lambda: flat(grad_h * g).T @ x2,
    }, 3: {
        "grad_w_down from gate(x) * up(x) without the silu": lambda: flat(grad_y).T @ flat(g * u),
    }}


#: Tolerance of the float64 backward contracts: |got - autograd| <= BACKWARD_ATOL * max|autograd| +
#: BACKWARD_RTOL * |autograd|; a correct float64 formula differs by about 1e-15 of the largest value.
BACKWARD_ATOL, BACKWARD_RTOL = 1e-9, 1e-7


def _check_gradients(what: str, got, names: tuple[str, ...], expected: tuple, variants: dict) -> None:
    """GOT must be a tuple of len(names) float64 tensors, each equal to its autograd gradient within
    the backward tolerance; a wrong one names the variants of its ``variants[i]`` that equal it."""
    if type(got) is not tuple or len(got) != len(names):
        raise ContractError(f"{what} must return a tuple ({', '.join(names)}), got "
                            + (f"a tuple of {len(got)}" if type(got) is tuple else type(got).__qualname__))
    for i, (name, value, ref) in enumerate(zip(names, got, expected)):
        label = f"{what}: {name}"
        out = check_tensor(label, value, shape=ref.shape, dtype=torch.float64)
        atol = BACKWARD_ATOL * float(ref.abs().max())
        try:
            check_close(out, ref, atol=atol, rtol=BACKWARD_RTOL, what=label)
        except ContractError as err:
            raise diagnose(err, out, variants.get(i, {}), _close_within(atol, BACKWARD_RTOL)) from None


def _backward_cases(rng: random.Random, cases: int) -> list[dict]:
    """Shapes of the backward check: leading dims, width d, SwiGLU width d_ff, eps, and a zero row or not."""
    specs = []
    for case in range(cases):
        lead = [(3,), (2, 4), (1, 5), (2, 1, 3)][case % 4] if case < 4 else \
            tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
        specs.append({"lead": lead, "d": rng.choice([4, 8, 12, 16]), "d_ff": rng.choice([6, 10, 20, 24]),
                      "eps": rng.choice([1e-5, 1e-6, 1e-2]), "zero_row": case == 1})
    return specs


def check_blocks_backward(rms_norm_backward_fn: Callable, swiglu_backward_fn: Callable, seed: int = 0,
                          cases: int = 4) -> None:
    """Contract: the backward passes of RMSNorm and SwiGLU, written by hand, equal torch.autograd's
    gradients of the same forward in float64 (``torch.nn.functional.rms_norm``; ``F.linear`` and ``F.silu``).

    - ``rms_norm_backward_fn(x (..., d), weight (d,), eps, grad_y (..., d))`` -> ``(grad_x (..., d),
      grad_weight (d,))`` for y = x / sqrt(mean(x^2) + eps) * weight; grad_weight sums over every
      leading axis;
    - ``swiglu_backward_fn(x (..., d), w_gate (d_ff, d), w_up (d_ff, d), w_down (d, d_ff), grad_y (..., d))``
      -> ``(grad_x, grad_w_gate, grad_w_up, grad_w_down)``, each of its input's shape, for
      y = down(silu(gate(x)) * up(x)).

    Every tensor is float64 and so must every gradient be; each within 1e-9 max|autograd| + 1e-7 |autograd|
    (``BACKWARD_ATOL``, ``BACKWARD_RTOL``). Cases: 1 to 3 leading axes, one case with an all-zero row."""
    check_own_function("rms_norm_backward", rms_norm_backward_fn)
    check_own_function("swiglu_backward", swiglu_backward_fn)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    for case, spec in enumerate(_backward_cases(rng, cases)):
        lead, d, d_ff, eps = spec["lead"], spec["d"], spec["d_ff"], spec["eps"]
        x = torch.randn(*lead, d, generator=gen, dtype=f64) * torch.rand(*lead, 1, generator=gen, dtype=f64) * 3
        if spec["zero_row"]:
            x.reshape(-1, d)[0] = 0
        weight = 1 + 0.5 * torch.randn(d, generator=gen, dtype=f64)
        grad_y = torch.randn(*lead, d, generator=gen, dtype=f64)
        what = (f"rms_norm_backward(case {case}: x {tuple(x.shape)}, eps {eps:g}"
                f"{', its first row all zeros' if spec['zero_row'] else ''})")
        got = call_on_copies(what, rms_norm_backward_fn, x, weight, eps, grad_y)
        _check_gradients(what, got, ("grad_x", "grad_weight"), _autograd(lambda a, w: _rms_forward64(a, w, eps),
                                                                        (x, weight), grad_y),
                         _rms_backward_variants(x, weight, eps, grad_y))
        w_gate = torch.randn(d_ff, d, generator=gen, dtype=f64) / d ** 0.5
        w_up = torch.randn(d_ff, d, generator=gen, dtype=f64) / d ** 0.5
        w_down = torch.randn(d, d_ff, generator=gen, dtype=f64) / d_ff ** 0.5
        what = f"swiglu_backward(case {case}: x {tuple(x.shape)}, d_ff {d_ff})"
        got = call_on_copies(what, swiglu_backward_fn, x, w_gate, w_up, w_down, grad_y)
        _check_gradients(what, got, ("grad_x", "grad_w_gate", "grad_w_up", "grad_w_down"),
                         _autograd(_swiglu_forward64, (x, w_gate, w_up, w_down), grad_y),
                         _swiglu_backward_variants(x, w_gate, w_up, w_down, grad_y))


# LayerNorm
def _layer_norm_variants(x, weight, bias, eps) -> dict:
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = centred.pow(2).mean(-1, keepdim=True)
    normed = centred / torch.sqrt(var + eps)
    return {
        "the weight (the per-channel scale) not applied: the normalised x plus the bias is returned":
            lambda: normed + bias,
        "the bias not added": lambda: normed * weight,
        "the unbiased variance (divided by d - 1, torch.var's default); LayerNorm divides by d "
        "(x.var(-1, unbiased=False))": lambda: centred / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias,
        "the mean not subtracted (that is RMSNorm, with a bias)":
            lambda: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight + bias,
        "the mean subtracted but the variance taken around 0 (mean(x^2) instead of mean((x - mean)^2))":
            lambda: centred / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight + bias,
        "eps added outside the square root: (x - mean) / (std + eps)": lambda: centred / (var.sqrt() + eps) * weight + bias,
        "divided by the variance instead of the standard deviation": lambda: centred / (var + eps) * weight + bias,
    }


def check_layer_norm(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: fn(x (..., d) float32, weight (d,) float32, bias (d,) float32, eps: float) returns float32
    of x's shape equal to ``torch.nn.functional.layer_norm(x, (d,), weight, bias, eps)``:
    (x - mean) / sqrt(var + eps) * weight + bias over the last axis, var the biased variance (Ba, Kiros &
    Hinton 2016, arXiv:1607.06450), within 1e-5 max|reference| + 1e-5 |reference|. Rows have means away
    from 0, and one row is constant (variance 0: eps keeps 0 / 0 from giving NaN)."""
    check_own_function("layer_norm", fn)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case in range(cases):
        lead = [(5,), (2, 3), (1, 4), (2, 2, 2)][case % 4]
        d = rng.choice([8, 16, 48, 64])
        eps = rng.choice([1e-5, 1e-6, 1e-3])
        scale = torch.exp(torch.randn(*lead, 1, generator=gen))
        x = (torch.randn(*lead, d, generator=gen) + 2 * torch.randn(*lead, 1, generator=gen)) * scale
        constant = rng.randrange(math.prod(lead))
        x.reshape(-1, d)[constant] = rng.choice([0.0, 1.5, -3.0])
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        bias = 0.5 * torch.randn(d, generator=gen)
        expected = torch.nn.functional.layer_norm(x, (d,), weight, bias, eps)
        what = f"layer_norm(case {case}: x {tuple(x.shape)}, eps {eps:g}, row {constant} constant)"
        got = call_on_copies(what, fn, x, weight, bias, eps)
        out = check_tensor(f"{what} output", got, shape=expected.shape, dtype=torch.float32, allow_nan=True)
        flat = out.reshape(-1, d)
        if not bool(torch.isfinite(flat[constant]).all()):
            raise with_diagnosis(ContractError(
                f"{what}: the constant row gave NaN or inf: its variance is 0, so (x - mean) / sqrt(var) is 0 / 0"),
                "eps missing (or 0): it goes inside the square root, (x - mean) / sqrt(var + eps), so a constant "
                "row gives the bias instead of NaN", likely=False)
        if not bool(torch.isfinite(out).all()):
            raise ContractError(f"{what} output contains NaN or inf on rows that are not constant")
        _check_block_output(f"{what} output", out, expected, _layer_norm_variants(x, weight, bias, eps))


# the tied embedding
def _tied_cases(rng: random.Random, cases: int) -> list[tuple[tuple[int, int], int, int]]:
    """((B, T), vocab, d) per case, vocab != d (so a transposed gradient has the wrong shape)."""
    return [(rng.choice([(1, 9), (2, 6), (3, 5)]), rng.choice([11, 17, 29]), rng.choice([4, 6, 8]))
            for _ in range(cases)]


def check_tied_embedding_grad(fn: Callable, seed: int = 0, cases: int = 3) -> None:
    """Contract: fn(ids (B, T) int64, grad_embedded (B, T, d), hidden (B, T, d), grad_logits (B, T, V), vocab_size)
    returns the gradient (V, d) of a weight E used twice, as a tied embedding is (Press & Wolf 2017,
    arXiv:1608.05859): h = E[ids] (the lookup, whose output receives grad_embedded) and
    logits = hidden @ E.T (the output head, whose output receives grad_logits). It must equal
    torch.autograd's gradient of sum(E[ids] * grad_embedded) + sum((hidden @ E.T) * grad_logits) with respect
    to E, within 1e-9 max|autograd| + 1e-7 |autograd|: the lookup's gradient summed over repeated ids
    (every case repeats some ids and leaves others unused) plus grad_logits.T @ hidden over all positions.
    Every float tensor is float64, and so must the result be."""
    check_own_function("tied_embedding_grad", fn)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    for case, ((B, T), V, d) in enumerate(_tied_cases(rng, cases)):
        used = torch.randperm(V, generator=gen)[: max(2, V // 3)]          # few ids: some repeat, most never occur
        ids = used[torch.randint(0, used.numel(), (B, T), generator=gen)]
        flat = ids.flatten()
        flat[1] = flat[0]                                                 # at least one repeated id
        ids = flat.view(B, T)
        grad_embedded = torch.randn(B, T, d, generator=gen, dtype=f64)
        hidden = torch.randn(B, T, d, generator=gen, dtype=f64)
        grad_logits = torch.randn(B, T, V, generator=gen, dtype=f64)
        E = torch.randn(V, d, generator=gen, dtype=f64)
        (expected,) = _autograd(lambda e: (torch.nn.functional.embedding(ids, e) * grad_embedded).sum()
                                + ((hidden @ e.T) * grad_logits).sum(), (E,), torch.ones((), dtype=f64))
        repeated = sorted(int(i) for i in flat.unique() if int((flat == i).sum()) > 1)
        what = (f"tied_embedding_grad(case {case}: ids {(B, T)} over a vocabulary of {V}, d {d}; "
                f"ids {repeated} occur more than once)")
        got = call_on_copies(what, fn, ids, grad_embedded, hidden, grad_logits, V)
        out = check_tensor(f"{what} output", got, shape=(V, d), dtype=f64)
        atol = BACKWARD_ATOL * float(expected.abs().max())
        try:
            check_close(out, expected, atol=atol, rtol=BACKWARD_RTOL, what=f"{what} output")
        except ContractError as err:
            lookup = torch.zeros(V, d, dtype=f64).index_add_(0, flat, grad_embedded.reshape(-1, d))
            head = grad_logits.reshape(-1, V).T @ hidden.reshape(-1, d)

            def overwritten():
                last = torch.zeros(V, d, dtype=f64)
                for i, g in zip(flat.tolist(), grad_embedded.reshape(-1, d)):
                    last[i] = g
                return last + head
            raise diagnose(err, out, {
                "only one use of the tied weight: the output head's gradient grad_logits.T @ hidden is missing "
                "(E is used twice, as the lookup and as the output head, and its gradient is the sum of both)":
                    lambda: lookup,
                "only one use of the tied weight: the lookup's gradient (grad_embedded added into the rows of "
                "ids) is missing (E is used twice, as the lookup and as the output head, and its gradient is "
                "the sum of both)": lambda: head,
                "repeated ids overwrite each other (grad[ids] = ...) instead of accumulating "
                "(index_add_ adds every occurrence)": overwritten,
            }, _close_within(atol, BACKWARD_RTOL)) from None


# -- RoPE -------------------------------------------------------------------------------------
def rope_float64(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Split-half RoPE computed in float64 throughout: the exact value float32 code approximates."""
    D = x.shape[-1]
    omega = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = positions.to(torch.float64)[..., None] * omega
    ang = ang[None, None] if positions.dim() == 1 else ang[:, None]
    x1, x2 = x[..., : D // 2].double(), x[..., D // 2:].double()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1)


def rope_tolerance(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per-element bound for a float32 RoPE against the float64 value: 1e-5 plus the error of a
    float32 angle, which grows with position: 8 * eps32 * (1 + p) * |pair| (eps32 = 2^-23).
    Any correct float32 formula for omega_i and the angle stays inside it; a position off by one
    moves the fast pairs by O(|pair|) and does not."""
    D = x.shape[-1]
    pair = torch.sqrt(x[..., : D // 2].double() ** 2 + x[..., D // 2:].double() ** 2)
    pos = positions.to(torch.float64)
    pos = pos[None, None, :, None] if positions.dim() == 1 else pos[:, None, :, None]
    slack = 8 * 2.0 ** -23 * (1 + pos) * pair
    return 1e-5 + torch.cat([slack, slack], dim=-1)


def check_apply_rope(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: fn(x (B,H,T,D) float32, positions (T,) or (B,T) int64, theta) returns float32 equal
    to the split-half rotation of course Lab 2 (computed in float64) within ``rope_tolerance``:
    1e-5 plus the rounding a float32 angle p * omega_i can carry at position p."""
    check_own_function("apply_rope", fn)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case in range(cases):
        B, H, T = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 9)
        D = 2 * rng.randint(1, 16)
        theta = rng.choice([10000.0, 100000.0, 500.0])
        x = torch.randn(B, H, T, D, generator=gen)
        if case % 2:
            positions = torch.randint(0, 4096, (B, T), generator=gen)
        else:
            positions = torch.randint(0, 4096, (T,), generator=gen)
        if case == 0:
            positions[0] = 0
        got = call_on_copies(f"apply_rope(case {case})", fn, x, positions, theta)
        try:
            check_close(got, rope_float64(x, positions, theta), dtype=torch.float32, rtol=0.0,
                        atol=rope_tolerance(x, positions),
                        what=f"apply_rope output (case {case}: x {tuple(x.shape)}, theta {theta:g})")
        except ContractError as err:
            got_t = check_tensor("apply_rope output", got)
            raise diagnose(err, got_t, {
                "rotary position off by one (rotated by position + 1)": lambda: apply_rope(x, positions + 1, theta),
                "rotary position off by one (rotated by position - 1)": lambda: apply_rope(x, positions - 1, theta),
                "interleaved pairs (2i, 2i+1) instead of split-half pairs (i, i + D/2)":
                    lambda: interleaved_rope(x, positions, theta),
                "rotation in the wrong direction (sign of sin flipped)": lambda: apply_rope(x, -positions, theta),
            }, _matches_within(1e-2)) from None


# -- cached attention step ----------------------------------------------------------------------
def check_attention_step(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: fn(q, k_new, v_new, k_cache, v_cache, start) writes K/V at slots start..start+T-1
    (and nowhere else) and returns causal GQA attention over slots 0..start+T-1 (atol 1e-5)."""
    check_own_function("attend_with_cache", fn)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case in range(cases):
        B, Hkv = rng.randint(1, 2), rng.choice([1, 2, 3])
        group = [2, 3, 4, 1][case % 4] if case < 4 else rng.choice([1, 2, 3, 4])
        Hq, D, S_max = Hkv * group, rng.choice([8, 16]), 32
        start, T = rng.randint(0, 12), rng.choice([1, 1, 3, 6])
        q = torch.randn(B, Hq, T, D, generator=gen)
        k_new, v_new = torch.randn(B, Hkv, T, D, generator=gen), torch.randn(B, Hkv, T, D, generator=gen)
        k_cache = torch.randn(B, Hkv, S_max, D, generator=gen)
        v_cache = torch.randn(B, Hkv, S_max, D, generator=gen)
        k_cache[:, :, start:] = 1e3          # unfilled slots hold junk that must never be read
        v_cache[:, :, start:] = 1e3
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        expected = attend_with_cache(q, k_new, v_new, ref_k, ref_v, start)
        got_k, got_v = k_cache.clone(), v_cache.clone()
        label = f"case {case}: B {B}, {Hq} query heads over {Hkv} KV heads, start {start}, T {T}"
        got = call_on_copies(f"attend_with_cache({label})", fn, q, k_new, v_new, got_k, got_v, start,
                             writes=_CACHE_WRITES.args)
        out = check_tensor(f"attention output ({label})", got, shape=expected.shape, dtype=expected.dtype)
        if not torch.equal(got_k, ref_k) or not torch.equal(got_v, ref_v):
            wrote = (got_k != k_cache).any(dim=(0, 1, 3)).nonzero().flatten().tolist()
            slots = f"slots {wrote[0]}..{wrote[-1]}" if wrote else "no slot"
            hint = " (position reset: the new block went to slot 0 instead of slot `start`)" \
                if wrote and wrote[0] == 0 and start > 0 else ""
            raise ContractError(f"KV cache after the step ({label}): expected K/V written to slots "
                                f"{start}..{start + T - 1} and every other slot unchanged; your step "
                                f"changed {slots}{hint}")
        try:
            check_close(out, expected, what=f"attention output ({label})")
        except ContractError as err:
            def misaligned():
                kk = ref_k[:, :, :start + T].repeat(1, group, 1, 1)
                vv = ref_v[:, :, :start + T].repeat(1, group, 1, 1)
                return causal_attention(q, kk, vv, start)

            def no_mask():
                return _masked(q, ref_k[:, :, :start + T], ref_v[:, :, :start + T], None)

            def top_left():
                return _masked(q, ref_k[:, :, :start + T], ref_v[:, :, :start + T], 0) if start else None
            raise diagnose(err, out, {
                "KV-head repeat misaligned: query head h read KV head h % n_kv instead of h // group "
                "(torch.repeat where the grouping needs repeat_interleave)": misaligned,
                "no causal mask inside the new block (query i also attended to later new keys)": no_mask,
                "causal mask aligned top-left: new query i saw keys 0..i instead of 0..start+i, so most "
                "cached keys were hidden from it (scaled_dot_product_attention(..., is_causal=True) aligns "
                "its mask to the upper-left corner when there are more keys than queries; pass "
                "attn_mask = (key position <= start + query position) instead)": top_left,
            }, _matches_within(1e-5)) from None


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int | None) -> torch.Tensor:
    """GQA attention of q (B, Hq, T, D) over k, v (B, Hkv, S, D), all float32, returning (B, Hq, T, D):
    query i sees key j iff j <= offset + i, or every key when ``offset`` is None. ``offset`` S - T is
    the causal mask of a cache step (aligned to the lower-right corner); 0 is the mask aligned to the
    upper-left corner, which is what ``torch.nn.functional.scaled_dot_product_attention(...,
    is_causal=True)`` applies when S > T (PyTorch's documentation of ``is_causal`` and of
    ``torch.nn.attention.bias.CausalVariant.UPPER_LEFT``)."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if offset is not None:
        T, S = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(torch.arange(S)[None, :] > torch.arange(T)[:, None] + offset, float("-inf"))
    return scores.softmax(-1) @ vv


# -- cached generation --------------------------------------------------------------------------
def _hidden_model(seed: int) -> Decoder:
    rng = random.Random(seed)
    n_kv = rng.choice([1, 2, 3])
    config = toy_config(n_layers=rng.choice([2, 3]), d_model=96, n_heads=n_kv * rng.choice([1, 2, 3]),
                        n_kv_heads=n_kv, head_dim=16, d_ff=160, vocab_size=rng.choice([97, 256, 300]),
                        rope_theta=rng.choice([10000.0, 500.0]), max_seq_len=256)
    return Decoder.random(config, seed)


class _TokenCounter:
    """Counts token ids fed through a model's embedding (how much work the learner's loop did)."""

    def __init__(self, model: Decoder):
        self.count = 0
        self.handle = model.embed_tokens.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        self.count += inputs[0].numel()

    def close(self):
        self.handle.remove()


@torch.no_grad()
def _generate_with_decode_positions(model: Decoder, prompt: torch.Tensor, n: int, position):
    """Cached greedy generation whose decode step i (0-based) is fed ``position(i, cache_length, T0)``."""
    T0 = prompt.numel()
    cache = model.new_cache(1, T0 + n + 2)
    step = model(prompt.view(1, -1), torch.arange(T0), cache)[0, -1]
    logits = [step]
    for i in range(n - 1):
        pos = torch.tensor([position(i, cache.length, T0)])
        step = model(step.argmax().view(1, 1), pos, cache)[0, -1]
        logits.append(step)
    return torch.stack(logits)


def check_generation(fn: Callable, seed: int = 0, model: Decoder | None = None,
                     prompt_len: int = 12, max_new_tokens: int = 32) -> None:
    """Contract: fn(model, prompt (T0,) int64, max_new_tokens) -> (tokens, logits) with tokens
    (n,) int64 (or a list of ints) and logits (n, vocab) float32, equal to greedy generation with
    a full recompute at every step: logits within atol 1e-5 + rtol 1e-5 on the common prefix,
    each token the argmax of its logits; and the loop must use the cache: at most T0 + n token
    ids go through the model (a full recompute feeds about T0*n + n^2/2), and at least T0 + n - 1
    (fewer means the model's embedding, where they are counted, was bypassed)."""
    check_own_function("generate_with_cache", fn)
    model = model if model is not None else _hidden_model(seed)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=gen)
    # the learner's loop first (an unsolved exercise fails at once, not after the slow reference),
    # the reference after it on a copy taken before, which the learner's call cannot have changed
    pristine = copy.deepcopy(model)
    counter = _TokenCounter(model)
    try:
        result = call_on_copies(f"generate_with_cache(max_new_tokens={max_new_tokens})", fn, model, prompt,
                                max_new_tokens)
    finally:
        counter.close()
    ref_tokens, ref_logits = generate_full_recompute(pristine, prompt, max_new_tokens)
    if type(result) is not tuple or len(result) != 2:
        raise ContractError(f"generate must return a tuple (tokens, logits), got {type(result).__qualname__}")
    tokens = check_int_list("tokens", result[0])
    logits = check_tensor("logits", result[1], shape=ref_logits.shape, dtype=torch.float32)
    if len(tokens) != max_new_tokens:
        raise ContractError(f"expected {max_new_tokens} tokens, got {len(tokens)}")
    greedy = logits.argmax(-1).tolist()
    if tokens != greedy:
        step = first_divergence(tokens, greedy)
        raise ContractError(f"token {step} is {tokens[step]} but the argmax of your logits at that step is "
                            f"{greedy[step]}: greedy decoding emits the argmax")
    try:
        check_logits_close(logits, ref_logits, what="generation logits", tokens_actual=tokens,
                           tokens_expected=ref_tokens.tolist(), position_offset=prompt_len - 1)
    except ContractError as err:
        raise diagnose(err, logits, {
            "rotary position off by one: decode tokens were fed position p + 1 instead of p":
                lambda: _generate_with_decode_positions(pristine, prompt, max_new_tokens, lambda i, c, t0: c + 1),
            "frozen position: every decode token was fed the same position (the prompt length)":
                lambda: _generate_with_decode_positions(pristine, prompt, max_new_tokens, lambda i, c, t0: t0),
            "position reset to 0 on each append: every decode token was fed position 0":
                lambda: _generate_with_decode_positions(pristine, prompt, max_new_tokens, lambda i, c, t0: 0),
        }, _matches_within(1e-5)) from None
    limit = prompt_len + max_new_tokens
    if counter.count > limit:
        raise ContractError(f"the logits are right but {counter.count} token ids went through the model; a "
                            f"cached loop feeds the prompt once and then one token per step (<= {limit})")
    floor = prompt_len + max_new_tokens - 1
    if counter.count < floor:
        raise ContractError(f"only {counter.count} token ids went through model.embed_tokens, fewer than any "
                            f"generation feeds (>= {floor}: the prompt, then every new token but the last); call "
                            "the model itself and leave its hooks alone")


# -- cache bytes ------------------------------------------------------------------------------
def kv_cache_terms(config: ModelConfig, positions: int, bytes_per_value: int, batch: int = 1) -> dict:
    """The factors of the KV-cache size formula 2 * L * n_kv * d_head * bytes * positions (* batch)."""
    terms = {"K and V": 2, "layers": config.n_layers, "KV heads": config.n_kv_heads,
             "head_dim": config.head_dim, "bytes per value": bytes_per_value, "positions": positions}
    if batch != 1:
        terms["batch"] = batch
    return terms


def check_kv_cache_bytes(formula_fn: Callable, measured_fn: Callable, seed: int = 0, cases: int = 3) -> None:
    """Contracts: formula_fn(config, positions, bytes_per_value) == 2*L*n_kv*d_head*bytes*positions
    exactly; measured_fn(cache) == bytes of the filled slots of cache.k and cache.v, read from the
    tensors (any batch, any dtype)."""
    check_own_function("kv_cache_bytes", formula_fn)
    check_own_function("measured_kv_bytes", measured_fn)
    rng = random.Random(seed)
    for case in range(cases):
        n_kv = rng.choice([1, 2, 4])
        config = toy_config(n_layers=rng.randint(1, 6), n_heads=n_kv * rng.choice([2, 4]), n_kv_heads=n_kv,
                            head_dim=rng.choice([16, 32, 64]), d_model=128, d_ff=256)
        positions, nbytes = rng.randint(1, 5000), rng.choice([1, 2, 4])
        check_bytes(formula_fn(config, positions, nbytes), kv_cache_terms(config, positions, nbytes),
                    what=f"kv_cache_bytes(case {case}: {config.n_layers} layers, {config.n_heads} query heads, "
                         f"{n_kv} KV heads, head_dim {config.head_dim}, {positions} positions, {nbytes} B/value)")
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
        batch = rng.randint(1, 3)
        cache = KVCache.for_model(config, batch=batch, max_len=64, dtype=dtype)
        cache.length = rng.randint(1, 64)
        itemsize = torch.empty((), dtype=dtype).element_size()
        terms = kv_cache_terms(config, cache.length, itemsize, batch)  # before the call: it may mutate cache
        check_bytes(measured_fn(cache), terms,
                    what=f"measured_kv_bytes(case {case}: a {dtype} cache, batch {batch}, {cache.length} filled "
                         f"of {cache.max_len} slots)")


# -- first divergence -------------------------------------------------------------------------
def check_first_divergence(fn: Callable, seed: int = 0, cases: int = 12) -> None:
    """Contract: fn(a, b) for two lists of ints returns the first differing index, the shorter
    length when one is a proper prefix of the other, and None when they are equal."""
    check_own_function("first_divergence", fn)
    rng = random.Random(seed)
    pairs = [([], []), ([1], [1]), ([1, 2], [1, 2, 3]), ([5, 2, 3], [4, 2, 3]), ([1, 2, 3], [1, 2, 4])]
    for _ in range(cases):
        a = [rng.randint(0, 9) for _ in range(rng.randint(0, 20))]
        b = list(a)
        kind = rng.random()
        if kind < 0.4 and b:
            b[rng.randrange(len(b))] += 1
        elif kind < 0.7:
            b = b[:rng.randint(0, len(b))]
        pairs.append((a, b) if rng.random() < 0.5 else (b, a))
    for a, b in pairs:
        expected = first_divergence(a, b)
        got = fn(list(a), list(b))
        if expected is None:
            if got is not None:
                raise ContractError(f"first_divergence({a}, {b}): the sequences are equal, expected None, got {got!r}")
        elif type(got) is not int or got != expected:
            raise ContractError(f"first_divergence({a}, {b}): expected {expected}, got {got!r}")


# -- suffixes after a shared prefix ---------------------------------------------------------------
@torch.no_grad()
def _cold_last_logits(model: Decoder, ids: torch.Tensor) -> torch.Tensor:
    return model(ids.view(1, -1), torch.arange(ids.numel()))[0, -1]


@torch.no_grad()
def _uncropped_suffix_logits(model: Decoder, prefix: torch.Tensor, suffixes) -> list[torch.Tensor]:
    cache = model.new_cache(1, prefix.numel() + sum(s.numel() for s in suffixes) + 1)
    model(prefix.view(1, -1), torch.arange(prefix.numel()), cache)
    out = []
    for s in suffixes:
        pos = torch.arange(prefix.numel(), prefix.numel() + s.numel())
        out.append(model(s.view(1, -1), pos, cache)[0, -1])
    return out


def check_suffix_scores(fn: Callable, seed: int = 0, model: Decoder | None = None,
                        atol: float = 1e-4, rtol: float = 1e-5) -> None:
    """Contract: fn(model, prefix (P,) int64, suffixes list of (S_i,) int64) returns one (vocab,)
    float32 tensor per suffix, equal to the last-position logits of a cold full forward of
    prefix + suffix (atol 1e-4, rtol 1e-5), while running the prefix through the model once: exactly
    P + sum(S_i) token ids go through the model's embedding (fewer means it was bypassed)."""
    check_own_function("score_suffixes", fn)
    model = model if model is not None else _hidden_model(seed + 1)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    prefix = torch.randint(0, V, (rng.randint(20, 40),), generator=gen)
    lengths = [rng.randint(5, 9), rng.randint(2, 4), rng.randint(3, 7)]
    suffixes = [torch.randint(0, V, (n,), generator=gen) for n in lengths]
    expected = [_cold_last_logits(model, torch.cat([prefix, s])) for s in suffixes]
    counter = _TokenCounter(model)
    try:
        result = call_on_copies(f"score_suffixes({len(suffixes)} suffixes)", fn, model, prefix, suffixes)
    finally:
        counter.close()
    if type(result) not in (list, tuple) or len(result) != len(suffixes):
        raise ContractError(f"expected a list of {len(suffixes)} logit tensors, got {type(result).__qualname__}"
                            + (f" of length {len(result)}" if type(result) in (list, tuple) else ""))
    got = [check_tensor(f"logits for suffix {i}", r, shape=(V,), dtype=torch.float32) for i, r in enumerate(result)]
    for i, (g, e) in enumerate(zip(got, expected)):
        try:
            check_logits_close(g, e, what=f"last-position logits of suffix {i}", atol=atol, rtol=rtol,
                               position_offset=prefix.numel() + suffixes[i].numel() - 1)
        except ContractError as err:
            uncropped = _uncropped_suffix_logits(model, prefix, suffixes)
            if i > 0 and all(_matches(u, x, atol) for u, x in zip(uncropped, got)):
                raise with_diagnosis(
                    err, "suffix 0 matches a cold forward but later suffixes also attend to the keys "
                    "of earlier suffixes: the shared prefix cache was extended in place and never cropped back "
                    "to the prefix (copy it, or crop it, before each suffix)", likely=False) from None
            raise
    limit = prefix.numel() + sum(s.numel() for s in suffixes)
    if counter.count > limit:
        raise ContractError(f"the logits are right but {counter.count} token ids went through the model; reusing "
                            f"the prefix cache feeds the prefix once and each suffix once (<= {limit})")
    if counter.count < limit:
        raise ContractError(f"only {counter.count} token ids went through model.embed_tokens, but every one of "
                            f"the {limit} prefix and suffix positions must be fed once; call the model itself "
                            "and leave its hooks alone")


# -- paged KV cache ---------------------------------------------------------------------------
def _refused(what: str, append_fn: Callable, pool, seq, k, v) -> bool:
    """Call append_fn(pool, seq, k, v) for an append past the context: True when it raised ValueError after
    changing neither the sequence nor the pool, False when it returned; any other exception, or a refusal
    after a write, is a ContractError saying what the policy asks."""
    before = (list(seq.block_table), seq.length, list(pool.ref_counts), list(pool.free_block_ids),
              pool.k.clone(), pool.v.clone())
    try:
        append_fn(pool, seq, k, v)
    except ValueError:
        after = (list(seq.block_table), seq.length, list(pool.ref_counts), list(pool.free_block_ids))
        if after != tuple(before[:4]) or not (torch.equal(pool.k, before[4]) and torch.equal(pool.v, before[5])):
            raise ContractError(f"{what} raised ValueError but changed the sequence or the pool first (check "
                                "the length the whole append would reach before allocating or writing "
                                "anything)") from None
        return True
    except Exception as err:  # noqa: BLE001  (the learner's own exception, named)
        if is_grader_error(err):
            raise
        raise ContractError(f"{what} raised {type(err).__name__}: {err}; past the context paged_append must "
                            "raise ValueError (or a subclass of it)") from None
    return False


def _check_paged_context(append_fn: Callable, rng: random.Random, gen: torch.Generator) -> None:
    """A sequence in a pool with max_seq_len: an append that starts below the limit and would cross it must
    raise ValueError and change nothing; the append that ends exactly on the limit is accepted; one more
    append from the limit must raise ValueError and change nothing (the reference ``PagedKVCache.append``
    raises ContextLengthError, a ValueError, before writing)."""
    from ..cache.paged import PagedSequence

    bs, n_kv, D = rng.choice([4, 5]), rng.choice([1, 2]), 4
    limit = bs * rng.randint(1, 3) + rng.randint(1, bs - 1)      # ends inside a block
    first, more = rng.randint(1, limit - 1), rng.randint(1, bs + 1)
    kv = lambda n: (torch.randn(n, n_kv, D, generator=gen), torch.randn(n, n_kv, D, generator=gen))  # noqa: E731
    (k1, v1), (k2, v2), (k3, v3) = kv(first), kv(limit - first), kv(more)
    kx, vx = kv(limit - first + more)
    pool = BlockPool(16, bs, n_kv, D, max_seq_len=limit)
    seq = PagedSequence()
    label = f"context case: pool.max_seq_len {limit}, block_size {bs}"
    append_fn(pool, seq, k1.clone(), v1.clone())
    crossing = f"{label}: paged_append of {limit - first + more} positions to a sequence of {first}"
    if not _refused(crossing, append_fn, pool, seq, kx.clone(), vx.clone()):
        raise ContractError(f"{crossing} returned, and the cache grew past its context: seq.length is now "
                            f"{seq.length!r}, past max_seq_len {limit}. Refuse an append that would cross the limit, "
                            "not only one that starts on it (raise ValueError before writing anything)")
    try:
        append_fn(pool, seq, k2.clone(), v2.clone())
    except ValueError as err:
        raise ContractError(f"{label}: an append from {first} to exactly {limit} positions fits, but paged_append "
                            f"raised ValueError: {err}") from None
    if seq.length != limit:
        raise ContractError(f"{label}: after appends of {first} and {limit - first} positions seq.length should be "
                            f"{limit}, got {seq.length!r}")
    what = f"{label}: paged_append of {more} more positions to a sequence of {limit}"
    if not _refused(what, append_fn, pool, seq, k3.clone(), v3.clone()):
        raise ContractError(f"{what} returned, and the cache grew past its context: seq.length is now "
                            f"{seq.length!r}, past max_seq_len {limit}. Past the context the policy is to refuse: "
                            "raise ValueError before writing anything (the model has no position to give the new "
                            "tokens)")


def check_paged(append_fn: Callable, read_fn: Callable, seed: int = 0, cases: int = 2) -> None:
    """Contract: append_fn(pool, seq, k, v) / read_fn(pool, seq) behave like the reference
    ``PagedKVCache`` on a fork scenario: reads equal the appended K/V exactly (logical order);
    after a fork the full prefix blocks stay shared (same physical ids), the shared partially
    filled block is copied on write by whichever sequence appends first, the other sequence's
    data never changes, and the pool ends with the reference's ref counts and free blocks.
    Past the context (an append that would take seq.length past pool.max_seq_len) append_fn
    raises ValueError and changes nothing; an append that ends exactly on it fits; a pool whose
    max_seq_len is None sets no limit (odd cases)."""
    check_own_function("paged_append", append_fn)
    check_own_function("paged_read", read_fn)
    from ..cache.paged import BlockPool, PagedKVCache, PagedSequence

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case in range(cases):
        bs, n_kv, D = rng.choice([4, 5, 16]), rng.choice([1, 2]), rng.choice([4, 8])
        P = bs * rng.randint(1, 3) + rng.randint(1, bs - 1)          # ends inside a block
        extra_a, extra_b = rng.randint(1, 2 * bs), rng.randint(1, 2 * bs)
        kv = lambda n: (torch.randn(n, n_kv, D, generator=gen), torch.randn(n, n_kv, D, generator=gen))  # noqa: E731
        prefix, tail_b, tail_a = kv(P), kv(extra_b), kv(extra_a)
        limit = None if case % 2 else 64 * bs        # None: the pool sets no limit of its own
        label = (f"case {case}: block_size {bs}, prefix {P} positions, then {extra_b} and {extra_a} more, "
                 f"pool.max_seq_len {limit}")
        cut = rng.randint(1, P - 1)                                  # the prefix arrives in two appends

        def replay(pool, append, fork):
            # clones: the truth tensors below must not be reachable (and zeroable) by the append
            a = PagedSequence()
            append(pool, a, prefix[0][:cut].clone(), prefix[1][:cut].clone())
            append(pool, a, prefix[0][cut:].clone(), prefix[1][cut:].clone())
            a_table_before = list(a.block_table)
            b = fork(a)
            append(pool, b, tail_b[0].clone(), tail_b[1].clone())
            return a, b, a_table_before

        ref_pool = BlockPool(64, bs, n_kv, D, max_seq_len=limit)
        ref_cache = PagedKVCache(ref_pool)
        ref_a, _, _ = replay(ref_pool, lambda p, s, k, v: ref_cache.append(s, k, v), ref_cache.fork)
        ref_cache.append(ref_a, *tail_a)

        pool = BlockPool(64, bs, n_kv, D, max_seq_len=limit)
        helper = PagedKVCache(pool)
        a, b, a_table = replay(pool, append_fn, helper.fork)

        def read(seq, name, truth):
            if type(seq) is not PagedSequence or type(seq.length) is not int or seq.length != truth[0].shape[0]:
                raise ContractError(f"{label}: after the appends {name}.length should be {truth[0].shape[0]}, "
                                    f"got {getattr(seq, 'length', None)!r}")
            out = read_fn(pool, seq)
            if type(out) is not tuple or len(out) != 2:
                raise ContractError(f"{label}: paged_read must return a tuple (k, v)")
            for got, want, part in zip(out, truth, "kv"):
                got = check_tensor(f"paged_read {part} of {name}", got, shape=want.shape, dtype=want.dtype)
                if not torch.equal(got, want):
                    bad = int((got != want).flatten(1).any(1).nonzero()[0])
                    blk, off = divmod(bad, bs)
                    raise ContractError(f"{label}: paged_read of {name} differs from the appended {part.upper()} "
                                        f"at position {bad} (logical block {blk}, offset {off})")

        truth_a = (prefix[0], prefix[1])
        read(a, "the original sequence", truth_a)      # B's append must not have touched A's data
        truth_b = (torch.cat([prefix[0], tail_b[0]]), torch.cat([prefix[1], tail_b[1]]))
        try:
            read(b, "the fork", truth_b)
        except ContractError as err:
            raise with_diagnosis(err, "the fork's copy-on-write did not carry over the filled slots of the shared "
                                 "block, or the fork's table points at the wrong blocks", likely=False) from None
        full = P // bs
        if b.block_table[:full] != a_table[:full]:
            raise ContractError(f"{label}: the fork's full prefix blocks changed from {a_table[:full]} to "
                                f"{b.block_table[:full]}: full shared blocks are never written, so they must stay "
                                "shared (copy only the partially filled last block)")
        if b.block_table[full] == a_table[full]:
            raise ContractError(f"{label}: the fork wrote into the shared, partially filled block {a_table[full]} "
                                "instead of copying it first (copy-on-write)")
        append_fn(pool, a, tail_a[0].clone(), tail_a[1].clone())
        read(a, "the original sequence", (torch.cat([prefix[0], tail_a[0]]), torch.cat([prefix[1], tail_a[1]])))
        read(b, "the fork", truth_b)
        if sorted(pool.ref_counts) != sorted(ref_pool.ref_counts) or pool.num_free != ref_pool.num_free:
            raise ContractError(f"{label}: the pool ends with {pool.num_blocks - pool.num_free} blocks in use and "
                                f"ref counts {sorted(c for c in pool.ref_counts if c)}; the reference uses "
                                f"{ref_pool.num_blocks - ref_pool.num_free} with {sorted(c for c in ref_pool.ref_counts if c)}"
                                " (a leaked block, a missing decref, or a needless copy)")
    _check_paged_context(append_fn, rng, gen)


# -- exercise 12: the online softmax -----------------------------------------------------------
def _faulty_updates(m, l, acc, scores, v) -> dict:
    """What a faulty online-softmax update returns from the state (m, l, acc): description -> state."""
    m_new = torch.maximum(m, scores.max())
    c, p = torch.exp(m - m_new), torch.exp(scores - m_new)
    raw = torch.exp(scores)
    old = torch.exp(scores - m) if bool(torch.isfinite(m)) else None
    up = torch.exp(m_new - m)
    l_new = c * l + p.sum()
    variants = {
        "the running sum not rescaled when the maximum grows (it must be l' = exp(m - m') * l + sum(p))":
            (m_new, l + p.sum(), c * acc + p @ v),
        "the running output not rescaled when the maximum grows (it must be acc' = exp(m - m') * acc + p @ v)":
            (m_new, l_new, acc + p @ v),
        "the rescaling factor inverted: exp(m' - m) instead of exp(m - m') (it is at most 1: the old sums shrink "
        "when the maximum grows)": (m_new, up * l + p.sum(), up * acc + p @ v),
        "acc kept normalised (acc / l): in this state acc is the unnormalised sum of exp(s - m) * v; divide by l "
        "once, after the last tile": (m_new, l_new, (c * acc + p @ v) / l_new),
        "neither the running sum nor the running output rescaled when the maximum grows (multiply both by "
        "exp(m - m'))": (m_new, l + p.sum(), acc + p @ v),
        "exp taken of the raw scores (the running maximum not subtracted): it overflows float32 for scores "
        "above about 88; use exp(scores - m')": (m_new, l + raw.sum(), acc + raw @ v),
    }
    if old is not None:
        variants["the running maximum not updated: m' = max(m, max(scores))"] = (m, l + old.sum(), acc + old @ v)
    return variants


def _call_update(what: str, fn: Callable, m, l, acc, scores, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fn(m, l, acc, scores, v), checked to be three float32 tensors of shapes (), (), (Dv,) (NaN/inf allowed:
    the caller names them)."""
    out = call_on_copies(what, fn, m, l, acc, scores, v)
    if type(out) not in (tuple, list) or len(out) != 3:
        raise ContractError(f"{what}: expected a tuple (m, l, acc) of three tensors, got {type(out).__name__}")
    return tuple(check_tensor(f"{what}: {name}", t, shape=shape, dtype=torch.float32, allow_nan=True)
                 for name, t, shape in zip(("m", "l", "acc"), out, ((), (), tuple(acc.shape))))


def _same_state(a, b, scale: float) -> bool:
    """m equal to float32 rounding, l and acc within a relative 1e-5 (acc: of SCALE, its values' size)."""
    (m1, l1, a1), (m2, l2, a2) = a, b
    return (bool(torch.isclose(m1.double(), m2.double(), rtol=1e-6, atol=0.0)) or bool(m1 == m2)) and \
        bool(torch.isclose(l1.double(), l2.double(), rtol=1e-5, atol=0.0)) and \
        bool(((a1.double() - a2.double()).abs() <= 1e-5 * (a2.double().abs() + scale)).all())


def _online_cases(rng: random.Random, cases: int) -> list[tuple[int, int, int, float]]:
    """(S, tile, D, score scale) per case. Case 0: a ragged last tile; case 1: scores near +-1e4; case 2:
    one key per tile; case 3: one tile holds every key; then random."""
    drawn = []
    for case in range(cases):
        D = rng.choice((4, 8, 16))
        if case == 0:
            tile = rng.choice((4, 8))
            S = tile * rng.randint(3, 5) + rng.randint(1, tile - 1)
        elif case == 2:
            S, tile = rng.randint(6, 14), 1
        elif case == 3:
            S = rng.randint(5, 30)
            tile = S + rng.randint(0, 5)
        else:
            S, tile = rng.randint(1, 60), rng.randint(1, 16)
        drawn.append((S, tile, D, 1e4 if case == 1 else rng.choice((1.0, 3.0, 30.0))))
    return drawn


def check_online_softmax(update: Callable, seed: int = 0, cases: int = 4) -> None:
    """Contract: update(m, l, acc, scores, v) is one tile of the online softmax
    (``course_lib.models.online_softmax``; m, l 0-d float32, acc (Dv,), scores (T,), v (T, Dv)) returning
    the state (m', l', acc') after the tile:

    - from a state reached on earlier keys, with a tile whose largest score exceeds the running maximum
      (so every term must be rescaled), the new state equals the reference's: m' to float32 rounding,
      l' and acc' to a relative 1e-5;
    - driven over a query's keys tile by tile (``online_attention``: scores k @ q / sqrt(D), the output
      acc / l after the last tile), the output equals softmax(scores) @ v computed in float64 within
      1e-5 max|v|, on the cases ``_online_cases`` draws (a ragged last tile, one key per tile, one tile for
      all keys, scores near +-1e4 where exp without the maximum subtracted overflows float32)."""
    check_own_function("online_softmax_update", update)
    from ..models.online_softmax import online_attention, online_softmax_update

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case, (S, tile, D, size) in enumerate(_online_cases(rng, cases)):
        Dv = rng.choice((3, 8))
        # 1. one update from a reached state, with a larger maximum in the new tile
        T0, T1 = rng.randint(1, 6), rng.randint(1, 6)
        first = torch.randn(T0, generator=gen) * min(size, 30.0)
        state = online_softmax_update(*initial_state(Dv), first, torch.randn(T0, Dv, generator=gen))
        scores = first.max() + torch.rand(T1, generator=gen) * 4.0 - 1.0
        scores[rng.randrange(T1)] = first.max() + 2.0
        v = torch.randn(T1, Dv, generator=gen)
        what = (f"online_softmax_update(case {case}: a state after {T0} key{'s' * (T0 > 1)} with m = {float(state[0]):.4g}, a tile of "
                f"{T1} scores up to {float(scores.max()):.4g}, Dv {Dv})")
        got = _call_update(what, update, *state, scores, v)
        expected = online_softmax_update(*state, scores, v)
        scale = float(v.abs().max()) * float(expected[1])
        if not _same_state(got, expected, scale):
            failure = ContractError(
                f"{what}: returned m = {float(got[0]):.6g}, l = {float(got[1]):.6g}, acc[0] = {float(got[2][0]):.6g}; "
                f"expected m = {float(expected[0]):.6g}, l = {float(expected[1]):.6g}, acc[0] = {float(expected[2][0]):.6g}")
            raise diagnose(failure, got, {name: (lambda s=s: s) for name, s in _faulty_updates(*state, scores, v).items()},
                           lambda a, b: _same_state(a, b, scale))
        # 2. the whole query, tile by tile
        q = torch.randn(D, generator=gen)
        k = torch.randn(S, D, generator=gen)
        q = q * (size * math.sqrt(D) / float((k @ q).abs().max()))        # the largest |score| is `size`
        v = torch.randn(S, Dv, generator=gen)
        what = f"online_attention over {S} keys in tiles of {tile} (case {case}: scores up to |{size:g}|, D {D}, Dv {Dv})"
        tiles = iter(range(0, S, tile))

        def step(m, l, acc, s, vt):
            t0 = next(tiles)
            return _call_update(f"{what}, the tile of keys {t0}..{t0 + len(s) - 1}", update, m, l, acc, s, vt)

        out = online_attention(q, k, v, tile, update=step)
        scores = (k.double() @ q.double()) / math.sqrt(D)
        expected = torch.softmax(scores, dim=0) @ v.double()
        if not bool(torch.isfinite(out).all()):
            raise with_diagnosis(ContractError(f"{what}: the output holds NaN or inf ({out[:4].tolist()} ...)"), (
                "exp of scores near 1e4 overflows float32 (exp(89) is already inf): subtract the running maximum "
                "before exp, p = exp(scores - m'), and rescale the old sums by exp(m - m')"), likely=size > 100)
        err = (out.double() - expected).abs()
        bound = 1e-5 * float(v.abs().max())
        if bool((err > bound).any()):
            i = int(err.argmax())
            raise ContractError(f"{what}: output[{i}] = {float(out[i]):.6g}, expected softmax(scores) @ v = "
                                f"{float(expected[i]):.6g} (|diff| {float(err[i]):.3g} > {bound:.3g})")


# -- exercise 13: the paged decode kernel -----------------------------------------------------------
def paged_kernel_cases(rng: random.Random, cases: int) -> list[dict]:
    """One dict per case: B, Hq, Hkv, D, block_size (powers of two), the context lengths ``lens``,
    ``extra`` table columns past the widest row, the ``dtype``, a ``spread`` multiplying q (larger
    scores), and ``shared`` (sequence 1 starts with sequence 0's first block, as a prefix hit).
    Case 0: GQA with two or three query heads per KV head, one context shorter than a block and one
    that fills its table row exactly (no padding entry), float32; case 1: one KV head for every query
    head (MQA), bfloat16; case 2: one sequence of one position whose row has padding; case 3: two
    sequences sharing their first block, larger scores; then random. Sizes stay small: the
    interpreter runs every program in Python."""
    drawn = []
    for case in range(cases):
        Hkv, G = rng.choice(((2, 2), (2, 3), (1, 4), (3, 1), (1, 2)))
        D, bs = rng.choice((8, 16, 32)), rng.choice((4, 8))
        B, extra, dtype, spread, shared = rng.randint(1, 3), rng.randint(0, 2), torch.float32, 1.0, False
        if case == 0:
            Hkv, G, B, extra = 2, rng.choice((2, 3)), 3, 0
            widest = bs * rng.randint(2, 3)
            lens = [widest, rng.randint(1, bs - 1), bs * rng.randint(1, 2) + rng.randint(1, bs - 1)]
        elif case == 1:
            Hkv, G, dtype, extra = 1, rng.choice((3, 4)), torch.bfloat16, 1
            lens = [bs * rng.randint(1, 3) + rng.randint(1, bs - 1) for _ in range(B)]
        elif case == 2:
            B, extra, lens = 1, rng.randint(1, 2), [1]
        elif case == 3:
            B, spread, shared, extra = 2, 4.0, True, 1
            lens = [bs + rng.randint(1, 2 * bs), bs + rng.randint(1, 2 * bs)]
        else:
            lens = [rng.randint(1, 5 * bs) for _ in range(B)]
            dtype = torch.bfloat16 if rng.random() < 0.3 else torch.float32
            spread = rng.choice((1.0, 3.0))
        drawn.append({"B": B, "Hq": Hkv * G, "Hkv": Hkv, "D": D, "block_size": bs, "lens": lens, "extra": extra,
                      "dtype": dtype, "spread": spread, "shared": shared})
    return drawn


def _paged_inputs(spec: dict, gen: torch.Generator):
    """(q, k_cache, v_cache, block_tables, context_lens) for one case of ``paged_kernel_cases``: blocks
    at shuffled ids of a pool with two free blocks, table padding 0 (as the serving engine pads)."""
    B, Hq, Hkv, D, bs, lens = (spec[n] for n in ("B", "Hq", "Hkv", "D", "block_size", "lens"))
    used = [-(-n // bs) for n in lens]
    width = max(used) + spec["extra"]
    num_blocks = sum(used) - (1 if spec["shared"] else 0) + 2
    ids = iter(torch.randperm(num_blocks, generator=gen).tolist())
    table = torch.zeros(B, width, dtype=torch.int32)
    for b, n in enumerate(used):
        for i in range(n):
            table[b, i] = table[0, 0] if spec["shared"] and b == 1 and i == 0 else next(ids)
    dtype = spec["dtype"]
    q = (spec["spread"] * torch.randn(B, Hq, D, generator=gen)).to(dtype)
    k_cache = torch.randn(num_blocks, bs, Hkv, D, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, bs, Hkv, D, generator=gen).to(dtype)
    return q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int64)


def _paged_decode64(q, k_cache, v_cache, table, lens, *, kv_head: Callable[[int, int, int], int] = lambda h, G, n: h // G,
                    positions: Callable[[int, int], int] = lambda n, bs: n, zero_tail: bool = False, scaled: bool = True,
                    rescale_sum: bool = True, rescale_output: bool = True, update_max: bool = True,
                    normalise: bool = True) -> torch.Tensor:
    """Decode attention in float64 by walking each sequence's blocks with the online softmax, the
    reference for the check and, with an argument changed, for the faults it names: ``kv_head(h, G,
    Hkv)`` the KV head query head h reads; ``positions(context, block_size)`` how many positions are
    read; ``zero_tail``: the rest of the last block read as keys and values 0 with score 0 (no -inf);
    ``scaled``: scores times 1 / sqrt(D); ``rescale_sum`` / ``rescale_output``: l and acc multiplied
    by exp(m - m') when the maximum grows; ``update_max``: m set to m' after each block; ``normalise``:
    the output divided by l. Returns (B, Hq, D) float64 (NaN where l stays 0)."""
    B, Hq, D = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    heads = torch.tensor([kv_head(h, Hq // Hkv, Hkv) for h in range(Hq)])
    out = torch.empty(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        n = positions(int(lens[b]), bs)
        end = -(-n // bs) * bs if zero_tail else n
        p = torch.arange(end)
        rows = table[b, (p // bs).long()].long()
        keys = k_cache[rows, p % bs].double()[:, heads].transpose(0, 1)            # (Hq, end, D)
        values = v_cache[rows, p % bs].double()[:, heads].transpose(0, 1)
        keys[:, n:], values[:, n:] = 0.0, 0.0
        scores = (keys @ q[b].double()[:, :, None])[..., 0] / (math.sqrt(D) if scaled else 1.0)   # (Hq, end)
        m = torch.full((Hq,), -math.inf, dtype=torch.float64)
        l, acc = torch.zeros(Hq, dtype=torch.float64), torch.zeros(Hq, D, dtype=torch.float64)
        for t0 in range(0, end, bs):
            s, v = scores[:, t0:t0 + bs], values[:, t0:t0 + bs]
            m_new = torch.maximum(m, s.max(dim=1).values)
            c = torch.exp(m - m_new)
            w = torch.exp(s - m_new[:, None])
            l = (c if rescale_sum else 1.0) * l + w.sum(dim=1)
            acc = (c[:, None] if rescale_output else 1.0) * acc + (w[:, :, None] * v).sum(dim=1)
            m = m_new if update_max else m
        out[b] = acc / l[:, None] if normalise else acc
    return out


def paged_stray(num_blocks: int, n_kv: int, group: int) -> Callable[[dict], str]:
    """The diagnosis of a paged decode kernel's stray access (``kernel_checks.launch_case``'s name_stray)."""
    def name(v: dict) -> str:
        tensor, index = v["tensor"], v["index"]
        if not v["inside_buffer"]:
            return ("an address far from every tensor: an offset is wrong (slot s of block n, KV head g, column d "
                    "is at n * stride_kb + s * stride_ks + g * stride_kh + d; query head h of sequence b at "
                    "b * stride_qb + h * stride_qh; load the block id from bt_ptr + b * stride_tb + i)")
        if tensor in ("k_cache", "v_cache") and v["op"] == "load":
            strides = ("the offset of slot s of block n, KV head g, column d is n * stride_kb + s * stride_ks + "
                       "g * stride_kh + d, each index times its own stride: the caches are not contiguous, so "
                       "BLOCK_SIZE * stride_ks is not stride_kb and HEAD_DIM is not stride_kh")
            program = v.get("program") or []
            if index[0] >= num_blocks:
                return (f"block {num_blocks} was read: the id the launcher writes in the block table's padding (the "
                        "entries past a row's ceil(context / BLOCK_SIZE) blocks). A sequence's loads must be masked "
                        "with position < context, and its loop must stop after its last block")
            if index[2] >= n_kv and len(program) == 2 and index[2] == program[1] and group > 1:
                return (f"KV head {index[2]} was read by query head {program[1]}, but there are {n_kv} KV heads: query "
                        f"head h reads KV head h // GROUP (GROUP = {group} query heads share each KV head), not KV head h")
            if index[2] >= n_kv:
                return f"the load reached KV head {index[2]} of a block that has {n_kv}: {strides}"
            if index[3] >= v["shape"][3]:
                return f"a column past HEAD_DIM was read (column {index[3]}): {strides}"
        if tensor == "block_tables" and v["op"] == "load":
            return (f"the block table was read past the end of row {index[0]}: a sequence of context L has "
                    "ceil(L / BLOCK_SIZE) blocks (tl.cdiv(context, BLOCK_SIZE)); loop over those entries only")
        if tensor == "context_lens":
            return "context_lens was read past its B entries: sequence b's context length is at cl_ptr + b"
        if tensor == "o" and v["op"] == "store":
            return "the store strayed: program (b, h) writes o[b, h, :] at o_ptr + b * stride_ob + h * stride_oh + d"
        if tensor == "q":
            return "the query load strayed: query head h of sequence b is at q_ptr + b * stride_qb + h * stride_qh + d"
        return ""
    return name


def check_paged_decode_kernel(kernel, seed: int = 0, cases: int = 4) -> None:
    """Contract: the learner's ``@triton.jit`` kernel computes decode attention over a paged KV cache,
    launched by the course (``course_lib.kernels.exercise.launch_paged_decode``: grid (B, Hq), the
    caches in a layout with poisoned padding) under Triton's interpreter on the cases
    ``paged_kernel_cases`` draws (GQA and MQA, context lengths that are not block multiples, one
    position, padded block tables, a shared prefix block, float32 and bfloat16):

    - every lane it loads or stores addresses an element of its tensors (the table's padding holds an
      id past the pool, each block has poisoned heads after its KV heads, and every slot no sequence
      reads is NaN);
    - o equals contiguous attention over each sequence's positions in float64 within
      1e-5 max|v| + 1e-6 per element; the message also gives the difference from the course's
      PyTorch paged path (``reference_paged_decode_attention``).
    A plain function in the kernel's place is refused: the exercise is the kernel."""
    from ..kernels.paged_attention import reference_paged_decode_attention
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case, spec in enumerate(paged_kernel_cases(rng, cases)):
        q, k_cache, v_cache, table, lens = _paged_inputs(spec, gen)
        B, Hq, D = q.shape
        Hkv, bs = spec["Hkv"], spec["block_size"]
        what = (f"paged_decode_kernel(case {case}: {B} sequence{'s' * (B > 1)} of context {spec['lens']}, Hq {Hq}, "
                f"Hkv {Hkv}, D {D}, BLOCK_SIZE {bs}, table width {table.shape[1]}, "
                f"{str(spec['dtype']).replace('torch.', '')}{', a shared first block' * spec['shared']})")
        o = launch_case(kernel, "paged_decode", what, paged_stray(k_cache.shape[0], Hkv, Hq // Hkv),
                        q, k_cache, v_cache, table, lens)
        o = check_tensor(f"{what}: o", o, shape=(B, Hq, D), dtype=torch.float32, allow_nan=True)
        exact = _paged_decode64(q, k_cache, v_cache, table, lens)
        bound = 1e-5 * float(v_cache.double().abs().max()) + 1e-6
        err = (o.double() - exact).abs()
        if bool((err <= bound).all()):
            continue
        b, h = (int(i) for i in (~(err <= bound)).nonzero()[0, :2])
        course = reference_paged_decode_attention(q.float(), k_cache.float(), v_cache.float(), table, lens).double()
        failure = ContractError(
            f"{what}: o[{b}, {h}] (query head {h} of sequence {b}, {int(lens[b])} positions, KV head {h // (Hq // Hkv)}) "
            + ("holds NaN" if bool(o[b, h].isnan().any()) else f"differs from contiguous attention by {float(err[b, h].max()):.3g}")
            + f" (allowed {bound:.3g}; the course's PyTorch paged path differs by {float((course - exact).abs().max()):.2g}); "
            f"{int((~(err <= bound)).any(dim=2).sum())} of {B * Hq} (sequence, head) pairs wrong")

        def same(got, candidate):
            return bool((((got.double() - candidate).abs() <= bound) | (got.isnan() & candidate.isnan())).all())

        def variant(**change):
            return lambda: _paged_decode64(q, k_cache, v_cache, table, lens, **change)

        variants = {
            "query head h reads KV head h % Hkv (round robin); it reads h // GROUP": variant(kv_head=lambda h, G, n: h % n)
            if 1 < Hkv < Hq else lambda: None,
            "the running sum l not rescaled by exp(m - m_new) when the maximum grows": variant(rescale_sum=False),
            "the running output acc not rescaled by exp(m - m_new) when the maximum grows": variant(rescale_output=False),
            "neither l nor acc rescaled by exp(m - m_new) when the maximum grows": variant(rescale_sum=False,
                                                                                       rescale_output=False),
            "the slots of the last block past the context counted with score 0: set their scores to -inf "
            "(tl.where(position < context, s, -inf)) so that exp gives them weight 0": variant(zero_tail=True),
            "the last, partly filled block left out: a context of L positions spans tl.cdiv(L, BLOCK_SIZE) blocks, "
            "not L // BLOCK_SIZE": variant(positions=lambda n, size: n // size * size)
            if any(int(n) % bs for n in lens) else lambda: None,
            "the scores not multiplied by scale (1 / sqrt(HEAD_DIM))": variant(scaled=False),
            "acc stored without dividing it by l: acc is the unnormalised sum, the output is acc / l":
                variant(normalise=False),
            "the running maximum never updated (m = m_new missing): m stays -inf, so exp(m - m_new) = 0 wipes the "
            "sums at every block and only the last block counts": variant(update_max=False)
            if any(int(n) > bs for n in lens) else lambda: None,
            "only the first block read: loop over every block of the sequence": variant(positions=lambda n, size: min(n, size))
            if any(int(n) > bs for n in lens) else lambda: None,
        }
        raise_if_bfloat16_arithmetic(failure, spec["dtype"], lambda: same(launch_case(
            kernel, "paged_decode", what, paged_stray(k_cache.shape[0], Hkv, Hq // Hkv), q.float(), k_cache.float(),
            v_cache.float(), table, lens), exact), "what you load (q, K and V)")
        failure = diagnose(failure, o, variants, same)
        if failure.diagnosis or not bool(o.isnan().any()):
            raise failure
        raise with_diagnosis(failure, (
            "NaN: never stored (o starts as NaN; program (b, h) owns o[b, h, :]), or computed from a NaN. In this "
            "launch every slot of the pool that no sequence reads holds NaN (the rest of a last block, free blocks), "
            "as a real pool holds stale values there: mask the K and V loads with position < context (other=0.0). "
            "A multiplication by a zero weight does not remove a NaN"), likely=False)


# -- the lab's declared tables (see tables.py) -------------------------------------------------
_TOY = {"toy": ("course_lib.models.decoder", "toy_decoder", {"seed": 0})}  # what the set-up cell builds
_EMBEDDING = (Probe(Decoder, "embed_tokens"),)   # where _TokenCounter counts the token ids fed to the model
_CACHE_WRITES = Writes(args=(3, 4))              # attend_with_cache writes its k_cache and v_cache
# the set-up cell's SmolLM2 (smollm2, tokenizer, provenance = load_smollm2()); the judge loads its own once
_SMOLLM2 = {"smollm2": ("course_lib.grading.lab02", "smollm2_model", {})}
_BLOCK_FORWARDS = ("course_lib.models.decoder.RMSNorm.forward", "course_lib.models.ops.rms_norm",
                   "course_lib.kernels.batch_invariant.torch_ops.rms_norm", "course_lib.models.decoder.Block.mlp")

CONTRACTS = (
    Contract("test_blocks_forward", check_blocks_forward, ("rms_norm", "swiglu"), objects=_SMOLLM2,
             references=_BLOCK_FORWARDS),
    # the library has no backward pass; reaching its forwards means autograd through them
    Contract("test_blocks_backward", check_blocks_backward, ("rms_norm_backward", "swiglu_backward"),
             references=_BLOCK_FORWARDS),
    Contract("test_layer_norm", check_layer_norm, ("layer_norm",)),
    Contract("test_tied_embedding_grad", check_tied_embedding_grad, ("tied_embedding_grad",)),
    Contract("test_apply_rope", check_apply_rope, ("apply_rope",),
             references=("course_lib.models.rope.apply_rope", "course_lib.models.rope.rotate_pairs",
                         "course_lib.models.rope.rope_cos_sin", "course_lib.models.rope.rope_angles")),
    Contract("test_attend_with_cache", check_attention_step, ("attend_with_cache",),
             writes=_CACHE_WRITES,
             references=("course_lib.models.attention.attend_with_cache",
                         "course_lib.models.attention.causal_attention")),
    Contract("test_generate_with_cache", check_generation, ("generate_with_cache",), objects=_TOY,
             references=("course_lib.models.decoder.generate_cached",), probes=_EMBEDDING),
    Contract("test_kv_cache_bytes", check_kv_cache_bytes, ("kv_cache_bytes", "measured_kv_bytes"),
             references=("course_lib.models.config.ModelConfig.kv_bytes_per_token",
                         "course_lib.roofline.kv_bytes_per_token", "course_lib.roofline.kv_bytes_per_sequence",
                         "course_lib.cache.contiguous.KVCache.filled_bytes")),
    Contract("test_first_divergence", check_first_divergence, ("first_divergence",)),
    Contract("test_score_suffixes", check_suffix_scores, ("score_suffixes",), objects=_TOY, probes=_EMBEDDING),
    Contract("test_paged", check_paged, ("paged_append", "paged_read"),
             writes=Writes(types=(BlockPool, PagedSequence)),                       # pool, seq
             references=("course_lib.cache.paged.PagedKVCache.append", "course_lib.cache.paged.PagedKVCache.read")),
    Contract("test_online_softmax", check_online_softmax, ("online_softmax_update",),
             references=("course_lib.models.online_softmax.online_softmax_update",
                         "course_lib.models.online_softmax.online_attention")),
    Contract("test_paged_decode_kernel", check_paged_decode_kernel, ("paged_decode_kernel",), launcher="paged_decode",
             references=("course_lib.kernels.paged_attention.reference_paged_decode_attention",
                         "course_lib.kernels.paged_attention.paged_decode_attention_unchecked",
                         "course_lib.kernels.paged_attention.paged_decode_attention",
                         "course_lib.kernels.paged_attention.paged_decode_kernel_unchecked",
                         "course_lib.kernels.paged_attention.gather_blocks")),
)

_NEXT_POSITION = "position = torch.tensor([cache.length])"
FAULTS = (
    Fault("swiglu_sum",
          (Edit("blocks_forward", "return (gate * torch.sigmoid(gate) * up) @ w_down.T",
                "return (gate * torch.sigmoid(gate) + up) @ w_down.T"),),
          {"test_blocks_forward": r"silu\(gate\(x\)\) \+ up\(x\)"},
          "adds the gate's silu and the up projection instead of multiplying them"),
    Fault("rms_norm_no_eps",
          (Edit("blocks_forward", "torch.rsqrt(ms + eps)", "torch.rsqrt(ms)"),),
          {"test_blocks_forward": "all-zero row gave NaN"},
          "leaves eps out of RMSNorm's square root: an all-zero row gives 0 / 0"),
    Fault("swiglu_backward_sigmoid",
          (Edit("blocks_backward", "grad_gate = grad_h * up * sig * (1 + gate * (1 - sig))",
                "grad_gate = grad_h * up * sig"),),
          {"test_blocks_backward": r"silu'\(z\) taken as sigmoid\(z\)"},
          "takes sigmoid(z) for the derivative of silu(z) = z sigmoid(z)"),
    Fault("layer_norm_weight_unused",
          (Edit("layer_norm", "* torch.rsqrt(var + eps) * weight + bias", "* torch.rsqrt(var + eps) + bias"),),
          {"test_layer_norm": r"weight \(the per-channel scale\) not applied"},
          "adds the bias to the normalised x without scaling it by the weight"),
    Fault("tied_grad_one_use",
          (Edit("tied_embedding_grad",
                "    grad += grad_logits.reshape(-1, vocab_size).T @ hidden.reshape(-1, d)   # use 2: the output head\n",
                ""),),
          {"test_tied_embedding_grad": r"only one use of the tied weight: the output head's gradient"},
          "returns the lookup's gradient of the tied weight and drops the output head's"),
    Fault("rope_off_by_one",
          (Edit("generate_with_cache", _NEXT_POSITION, "position = torch.tensor([cache.length + 1])"),),
          {"test_generate_with_cache": "rotary position off by one"},
          "feeds each new token the position after its own"),
    Fault("frozen_position",
          (Edit("generate_with_cache", _NEXT_POSITION, "position = torch.tensor([prompt.numel()])"),),
          {"test_generate_with_cache": "frozen position"},
          "gives every generated token the same position"),
    Fault("position_reset",
          (Edit("generate_with_cache", _NEXT_POSITION,
                "position = torch.arange(1)                        # positions restart at 0 on every append"),),
          {"test_generate_with_cache": "position reset to 0"},
          "restarts positions at 0 on every append"),
    Fault("kv_repeat_misaligned",
          (Edit("attend_with_cache",
                "k = k_cache[:, :, :start + T].repeat_interleave(group, dim=1)\n"
                "    v = v_cache[:, :, :start + T].repeat_interleave(group, dim=1)",
                "k = k_cache[:, :, :start + T].repeat(1, group, 1, 1)\n"
                "    v = v_cache[:, :, :start + T].repeat(1, group, 1, 1)"),),
          {"test_attend_with_cache": "KV-head repeat misaligned"},
          "repeats KV heads round-robin (repeat) instead of in groups (repeat_interleave)"),
    Fault("causal_mask_top_left",
          (Edit("attend_with_cache",
                "    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])                # (B, Hq, T, start+T)\n"
                "    future = torch.arange(start + T)[None, :] > (torch.arange(T)[:, None] + start)\n"
                "    return scores.masked_fill(future, float(\"-inf\")).softmax(dim=-1) @ v",
                "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)"),),
          {"test_attend_with_cache": "causal mask aligned top-left"},
          "masks with scaled_dot_product_attention(..., is_causal=True), whose mask is aligned top-left: "
          "after a cache, new query i sees only keys 0..i"),
    Fault("cache_never_cropped",
          (Edit("score_suffixes", "max_len=P + max(s.numel() for s in suffixes)",
                "max_len=P + sum(s.numel() for s in suffixes)"),
           Edit("score_suffixes", "        cache.crop(P)                                       # forget the previous branch\n",
                "")),
          {"test_score_suffixes": "never cropped"},
          "scores each suffix on top of the previous one (the cache is never cropped back to the prefix)"),
    Fault("no_copy_on_write",
          (Edit("paged",
                "        elif pool.ref_counts[seq.block_table[-1]] > 1:      # shared and partially filled: copy on write\n"
                "            old, new = seq.block_table[-1], pool.allocate()\n"
                "            pool.k[new, :offset] = pool.k[old, :offset]\n"
                "            pool.v[new, :offset] = pool.v[old, :offset]\n"
                "            pool.decref(old)\n"
                "            seq.block_table[-1] = new\n", ""),),
          {"test_paged": "copy-on-write"},
          "writes into a block another sequence shares instead of copying it first"),
    Fault("cache_grows_past_context",
          (Edit("paged",
                "    if pool.max_seq_len is not None and seq.length + k.shape[0] > pool.max_seq_len:\n"
                "        raise ValueError(f\"append of {k.shape[0]} positions would take the sequence past \"\n"
                "                         f\"max_seq_len {pool.max_seq_len}: refused, nothing written\")\n", ""),),
          {"test_paged": "the cache grew past its context"},
          "appends past the pool's max_seq_len: the cache grows with no policy past the context"),
    Fault("online_sum_not_rescaled",
          (Edit("online_softmax_update", "correction * l + p.sum()", "l + p.sum()"),),
          {"test_online_softmax": "running sum not rescaled"},
          "adds the new tile's exponentials to a running sum taken against the old maximum"),
    Fault("online_output_not_rescaled",
          (Edit("online_softmax_update", "correction * acc + p @ v", "acc + p @ v"),),
          {"test_online_softmax": "running output not rescaled"},
          "adds the new tile's weighted values to a running output taken against the old maximum"),
    Fault("online_max_not_subtracted",
          (Edit("online_softmax_update", "correction = torch.exp(m - m_new)", "correction = torch.ones(())"),
           Edit("online_softmax_update", "p = torch.exp(scores - m_new)", "p = torch.exp(scores)")),
          {"test_online_softmax": "raw scores"},
          "takes exp of the raw scores: right in real arithmetic, infinite in float32 for scores near 1e4"),
    Fault("paged_kernel_kv_head",
          (Edit("paged_decode_kernel", "kvh = h // GROUP", "kvh = h"),),
          {"test_paged_decode_kernel": "query head h reads KV head h // GROUP"},
          "reads KV head h for query head h, as if every query head had its own KV head"),
    Fault("paged_kernel_tail_unmasked",
          (Edit("paged_decode_kernel", "k = tl.load(k_ptr + offsets, mask=valid[:, None], other=0.0)",
                "k = tl.load(k_ptr + offsets)"),
           Edit("paged_decode_kernel", "v = tl.load(v_ptr + offsets, mask=valid[:, None], other=0.0)",
                "v = tl.load(v_ptr + offsets)")),
          {"test_paged_decode_kernel": "mask the K and V loads"},
          "loads whole blocks, the stale slots after the context included, and relies on their zero weights"),
    Fault("paged_kernel_sum_not_rescaled",
          (Edit("paged_decode_kernel", "l = correction * l + tl.sum(p, axis=0)", "l = l + tl.sum(p, axis=0)"),),
          {"test_paged_decode_kernel": "running sum l not rescaled"},
          "adds each block's exponentials to a running sum taken against the old maximum"),
    Fault("paged_kernel_int_sum",
          (Edit("paged_decode_kernel", "l = 0.0", "l = 0"),),
          {"test_paged_decode_kernel": "compiler refuses it"},
          "starts the running sum as the integer 0: the interpreter runs it, a GPU's compiler refuses a loop-carried "
          "value whose type the loop changes"),
)
check_tables(CONTRACTS, FAULTS)
