"""GPTQ: quantise a weight column by column, compensating each rounding error in the columns left.

Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", ICLR 2023, arXiv:2210.17323 (Algorithm 1); docs/quantization.md#gptq.

For a linear layer with weight W (out, in) and calibration inputs X (N, in), GPTQ minimises the
layer's output error ||X W^T - X W_hat^T||^2 = sum_rows (w - w_hat) H (w - w_hat)^T with

    H = X^T X / N + lambda I,   lambda = damp * mean(diag(X^T X / N))

(the damping keeps H invertible when the calibration rows do not span every input direction).
Columns are quantised in order (or by descending diag H, "act order"); after column j is rounded,
its error scaled by 1 / [H_F^-1]_jj is subtracted from every remaining column k times
[H_F^-1]_jk, where H_F^-1 is the inverse Hessian restricted to the columns F not yet quantised.
Those rows are the rows of the upper Cholesky factor U of H^-1 (H^-1 = U^T U), divided by their
diagonal, so one factorisation serves all columns. Updates are applied lazily: within a block of
``block_size`` columns immediately, to the columns after the block once per block (one matmul).

Grid: the scheme's grid from ``course_lib.quant.formats``. Tensor and channel scales come from
the whole weight before the first column; a group's scale (and zero point) comes from the group's
*current* weights, already updated by the errors of all columns before it, when its first column
is reached. With act order, groups are runs of consecutive columns in the permuted order (the
order a packed weight stores them in: ``PackedInt4.from_quantized(result.quantized, result.perm)``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from ..validation import ArgumentTypeError, boolean, instance, materialized, number, positive_integer
from .formats import QuantizedTensor, QuantScheme, grid_codes, grid_values, quantize
from .outliers import observe_linear_inputs, run_windows
from .layers import select_linear_layers

__all__ = ["hessian", "damp_hessian", "collect_hessians", "GPTQResult", "gptq_quantize", "SYMMETRY_TOLERANCE"]

#: How far from symmetric a Hessian (or a gram matrix) may be: max |H - H^T| <= tolerance * max |H|,
#: with tolerance the larger of this and 8 machine epsilons of H's dtype (float32: 1e-5; float16:
#: 7.8e-3; bfloat16: 6.3e-2), so the rounding of a matrix computed as X^T X in that dtype passes
#: and a matrix whose two triangles differ (one of them is all that a Cholesky factorisation
#: reads) does not.
SYMMETRY_TOLERANCE = 1e-5


def _check_symmetric(name: str, m64: torch.Tensor, dtype: torch.dtype) -> None:
    """ValueError naming the most asymmetric pair of a finite square float64 matrix ``m64`` (whose
    original dtype was ``dtype``) when it is not symmetric within SYMMETRY_TOLERANCE (above)."""
    relative = max(SYMMETRY_TOLERANCE, 8 * torch.finfo(dtype).eps)
    asymmetry = (m64 - m64.T).abs()
    worst = float(asymmetry.max())
    allowed = relative * float(m64.abs().max())
    if worst > allowed:
        i, j = divmod(int(asymmetry.argmax()), m64.shape[1])
        raise ValueError(f"{name} must be symmetric (max |{name} - {name}^T| <= {relative:.2g} * max |{name}| = "
                         f"{allowed:.3g}), got {name}[{i}, {j}] = {float(m64[i, j]):.6g} but {name}[{j}, {i}] = "
                         f"{float(m64[j, i]):.6g}: a Cholesky factorisation reads one triangle only, so the other "
                         f"would be ignored; symmetrise it ((H + H.T) / 2) if the difference is rounding")


def damp_hessian(gram: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """H = gram + lambda I with lambda = damp * mean(diag(gram)), float32.

    Args:
        gram: (in, in) float, the mean outer product X^T X / N (symmetric, positive semi-definite).
        damp: a number >= 0 (GPTQ's reference uses 0.01).

    Returns:
        float32 (in, in).

    Raises:
        ArgumentTypeError: gram not a floating tensor; damp not a number.
        ValueError: gram not square, not finite, not symmetric (``SYMMETRY_TOLERANCE``) or on the
            meta device; damp < 0; damp = 0 while gram is rank-deficient (the message names the
            rank), or a gram of zeros (nothing to damp against).
    """
    instance("gram", gram, torch.Tensor)
    materialized("gram", gram)
    if not gram.dtype.is_floating_point:
        raise ArgumentTypeError(f"gram must be a floating-point tensor, got dtype {gram.dtype}")
    if gram.dim() != 2 or gram.shape[0] != gram.shape[1] or gram.shape[0] == 0:
        raise ValueError(f"gram must be a square (in, in) matrix, got shape {tuple(gram.shape)}")
    damp = number("damp", damp, minimum=0)
    g = gram.detach().to(torch.float64)
    if not bool(torch.isfinite(g).all()):
        raise ValueError("gram must hold finite values")
    _check_symmetric("gram", g, gram.dtype)
    n = g.shape[0]
    mean_diag = float(g.diagonal().mean())
    if mean_diag <= 0:
        raise ValueError("X^T X / N is zero (the calibration inputs are all zero): no Hessian to quantise against")
    if damp == 0:
        rank = int(torch.linalg.matrix_rank(g, hermitian=True))
        if rank < n:
            raise ValueError(f"X^T X / N has rank {rank} < {n} input features (fewer independent calibration "
                             f"rows than columns), so H is singular; use damp > 0 (e.g. 0.01)")
    h = g + damp * mean_diag * torch.eye(n, dtype=torch.float64, device=g.device)
    return h.to(torch.float32)


def hessian(x: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """GPTQ's layer Hessian H = X^T X / N + lambda I, lambda = damp * mean(diag(X^T X / N)).

    X^T X is accumulated in float64.

    Args:
        x: (N, in) float calibration inputs of one linear layer (N >= 1 rows), finite.
        damp: a number >= 0; 0 is allowed only when X^T X has full rank.

    Returns:
        float32 (in, in), symmetric positive definite.

    Raises:
        ArgumentTypeError: x not a floating tensor; damp not a number.
        ValueError: x not 2-D, empty, non-finite or on the meta device; damp < 0; damp = 0 with a
            rank-deficient X^T X (e.g. N < in; the message names the rank); x all zero.
    """
    instance("x", x, torch.Tensor)
    materialized("x", x)
    if not x.dtype.is_floating_point:
        raise ArgumentTypeError(f"x must be a floating-point tensor (N, in), got dtype {x.dtype}")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x must be a non-empty 2-D tensor (N, in), got shape {tuple(x.shape)}")
    x64 = x.detach().to(torch.float64)
    if not bool(torch.isfinite(x64).all()):
        raise ValueError("x must hold finite values")
    return damp_hessian(x64.T @ x64 / x64.shape[0], damp)


def collect_hessians(model: nn.Module, windows: torch.Tensor, layers: Iterable[str] | None = None,
                     damp: float = 0.01, progress: bool = False) -> dict[str, torch.Tensor]:
    """``hessian`` of every chosen linear layer's inputs over calibration windows.

    One forward per window with forward pre-hooks (removed on exit, also on error); X^T X is
    accumulated in float64 over all tokens of all windows. Layers reading the same input
    (q/k/v, gate/up) share one computation and get the same tensor object.

    All inputs come from one pass of the float model. The GPTQ paper quantises the blocks in
    sequence and collects each block's inputs from the already quantised blocks before it; the
    single pass is the simpler variant (one forward per window for all 210 layers).

    Args:
        model: a ``course_lib.models.Decoder``.
        windows: (n_windows, T) int64 calibration token ids.
        layers: names from ``linear_layers(model)``, or None for all (210 on SmolLM2-135M).
        damp: as ``hessian``. progress: a tqdm.auto bar over the windows.

    Returns:
        {name: float32 (in, in) H} in model order.

    Raises:
        As ``hessian``, ``run_windows`` and ``select_linear_layers``.
    """
    def gram(x: torch.Tensor) -> torch.Tensor:
        x64 = x.to(torch.float64)
        return x64.T @ x64

    chosen = [name for name, _ in select_linear_layers(model, layers)]
    with observe_linear_inputs(model, gram, torch.add, chosen) as (sums, rows):
        run_windows(model, windows, progress, desc="Hessians")
    damped: dict[int, torch.Tensor] = {}
    result = {}
    for name in chosen:
        s = sums[name]
        if id(s) not in damped:
            damped[id(s)] = damp_hessian(s / rows[name], damp)
        result[name] = damped[id(s)]
    return result


@dataclass(frozen=True)
class GPTQResult:
    """What ``gptq_quantize`` returns.

    Attributes:
        weight: float32 (out, in), the quantised weight W_hat in the original column order (use it
            in place of the layer's weight).
        perm: None, or with act order int64 (in,): stored column j holds original column perm[j]
            (``weight[:, perm] == quantized.dequantize()``).
        quantized: the ``QuantizedTensor`` of the stored (permuted) columns: codes, scales (for
            groups: one per run of group_size stored columns) and zero points.
    """

    weight: torch.Tensor
    perm: torch.Tensor | None
    quantized: QuantizedTensor

    @property
    def codes(self) -> torch.Tensor:
        """The integer codes (out, in), stored (permuted) column order."""
        return self.quantized.codes

    @property
    def scales(self) -> torch.Tensor:
        """float32 scales of the stored columns (shape as ``QuantizedTensor.scales``)."""
        return self.quantized.scales


def _cholesky_upper_inverse(h: torch.Tensor) -> torch.Tensor:
    """U with H^-1 = U^T U (upper triangular), in float64; ValueError when H is not positive definite."""
    h64 = h.to(torch.float64)
    lower, info = torch.linalg.cholesky_ex(h64)
    if int(info) != 0:
        raise ValueError(f"the Cholesky factorisation of H failed at column {int(info) - 1}: H is not positive "
                         f"definite; damp it (hessian(x, damp=0.01)) or collect more calibration rows")
    hinv = torch.cholesky_inverse(lower)
    upper, info = torch.linalg.cholesky_ex(hinv, upper=True)
    if int(info) != 0:
        raise ValueError(f"the Cholesky factorisation of H^-1 failed at column {int(info) - 1}: H is too "
                         f"ill-conditioned; increase damp")
    return upper


class _Grid:
    """Scales (and zero points) of one scheme, set from a block of weights, applied column by column."""

    def __init__(self, scheme: QuantScheme):
        self.scheme = scheme
        self.channel_scheme = QuantScheme(scheme.bits, "channel", None, scheme.symmetric, scheme.scale_dtype)

    def fit(self, w: torch.Tensor, whole_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scale, zero) of shape (out, 1) from the weights w (out, k), as ``formats.quantize`` sets them."""
        if whole_tensor:
            qt = quantize(w, QuantScheme(self.scheme.bits, "tensor", None, self.scheme.symmetric,
                                         self.scheme.scale_dtype))
            s = qt.scales.expand(w.shape[0], 1)
            z = None if qt.zeros is None else qt.zeros.expand(w.shape[0], 1)
            return s, z
        qt = quantize(w, self.channel_scheme)
        return qt.scales, qt.zeros

    def codes(self, col: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """Float codes of one column (out,) on the grid (s, z) (out,): ``formats.grid_codes``."""
        return grid_codes(col, s, z, self.scheme.bits)

    value = staticmethod(grid_values)


def gptq_quantize(w: torch.Tensor, H: torch.Tensor, scheme: QuantScheme, act_order: bool = False,
                  block_size: int = 128) -> GPTQResult:
    """Quantise one weight with GPTQ (module docstring; Frantar et al. 2023, Algorithm 1).

    Args:
        w: (out, in) floating weight (computed in float32), finite.
        H: (in, in) symmetric positive definite Hessian (``hessian``/``collect_hessians``, damped),
            finite; symmetric within ``SYMMETRY_TOLERANCE`` relative to max |H| (1e-5 for
            float32; looser for 16-bit dtypes, see its comment).
        scheme: the grid (``QuantScheme``); a group size must divide in.
        act_order: quantise columns by descending diag(H) (the perm is returned).
        block_size: columns per lazy-update block, an int >= 1 (the result does not depend on
            it beyond float32 rounding).

    Returns:
        ``GPTQResult`` (weight in the original column order, perm, quantized codes/scales).

    Raises:
        ArgumentTypeError: w or H not floating tensors; scheme not a QuantScheme; act_order not
            a bool; block_size not an int.
        ValueError: shapes that do not fit (H not (in, in)); non-finite values (naming w or H);
            w or H on the meta device; H not symmetric (the message names the most asymmetric
            pair); a group size that does not divide in; H not positive definite (the message
            names the failed Cholesky factorisation).
    """
    instance("scheme", scheme, QuantScheme)
    boolean("act_order", act_order)
    block_size = positive_integer("block_size", block_size)
    instance("w", w, torch.Tensor)
    instance("H", H, torch.Tensor)
    for name, t in (("w", w), ("H", H)):
        materialized(name, t)
        if not t.dtype.is_floating_point:
            raise ArgumentTypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"w must be a non-empty 2-D tensor (out, in), got shape {tuple(w.shape)}")
    out_features, in_features = w.shape
    if tuple(H.shape) != (in_features, in_features):
        raise ValueError(f"H must be ({in_features}, {in_features}) for a weight with in_features {in_features}, "
                         f"got shape {tuple(H.shape)}")
    n_groups = scheme.n_groups(in_features)           # refuses a group size that does not divide
    W = w.detach().to(torch.float32).clone()
    if not bool(torch.isfinite(W).all()):
        raise ValueError("w must hold finite float32 values")
    H64 = H.detach().to(torch.float64)
    if not bool(torch.isfinite(H64).all()):
        raise ValueError("H must hold finite values")
    _check_symmetric("H", H64, H.dtype)
    Hm = H.detach().to(torch.float32)
    perm = None
    if act_order:
        perm = torch.argsort(torch.diagonal(Hm), descending=True, stable=True)
        W = W[:, perm]
        Hm = Hm[perm][:, perm]
    U = _cholesky_upper_inverse(Hm).to(torch.float32)

    grid = _Grid(scheme)
    group = in_features // n_groups if scheme.granularity == "group" else in_features
    Q = torch.zeros_like(W)
    scales = torch.zeros(out_features, n_groups)
    zeros = None if scheme.symmetric else torch.zeros(out_features, n_groups)
    if scheme.granularity != "group":
        s, z = grid.fit(W, whole_tensor=scheme.granularity == "tensor")

    for i1 in range(0, in_features, block_size):
        i2 = min(i1 + block_size, in_features)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if scheme.granularity == "group" and col % group == 0:
                end = col + group
                current = W1[:, i:min(end, i2) - i1]
                if end > i2:   # the group runs past this block: bring its later columns up to date
                    later = W[:, i2:end] - Err1[:, :i] @ U[i1:i1 + i, i2:end]
                    current = torch.cat([current, later], dim=1)
                s, z = grid.fit(current)
                scales[:, col // group] = s[:, 0]
                if zeros is not None:
                    zeros[:, col // group] = z[:, 0]
            sc, zc = s[:, 0], (None if z is None else z[:, 0])
            w_col = W1[:, i]
            q = grid.codes(w_col, sc, zc)
            q_val = grid.value(q, sc, zc)
            Q[:, col] = q
            err = (w_col - q_val) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]

    if scheme.granularity != "group":
        scales = s[:1].clone() if scheme.granularity == "tensor" else s.clone()
        zeros = None if z is None else (z[:1].clone() if scheme.granularity == "tensor" else z.clone())
    codes = Q.to(torch.int8 if scheme.symmetric else torch.uint8)
    qt = QuantizedTensor(codes, scales, zeros, scheme)
    stored = qt.dequantize()
    weight = stored if perm is None else stored[:, torch.argsort(perm)]
    return GPTQResult(weight=weight, perm=perm, quantized=qt)
