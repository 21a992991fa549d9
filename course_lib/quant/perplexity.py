"""Perplexity on fixed token windows.

Perplexity (docs/quantization.md#perplexity) is the exponential of the mean negative
log-likelihood over **all** next-token predictions of all windows:

    PPL = exp( sum_w sum_t -log p(x_{w,t+1} | x_{w,<=t}) / (number of predictions) )

which is not the mean of per-window perplexities (a window that the model finds hard weighs
the same in both, but exp of a mean is not the mean of exps). Each window of T tokens is an
independent sequence starting at position 0 and gives T - 1 predictions. The log-softmax and
the sum run in float64 so that thousands of predictions add up without float32 round-off.

The linear layers a quantiser changes, and the temporary weight swap ``quantized``, are in
``course_lib.quant.layers``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..validation import ArgumentTypeError, boolean, integer, integer_tensor, nonnegative_integer

__all__ = ["token_windows", "window_nll", "perplexity"]


def token_windows(ids: torch.Tensor, window: int = 512, n_eval: int = 8,
                  n_calib: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a token stream into evaluation windows and, after them, calibration windows.

    Args:
        ids: (n_tokens,) int64 token ids (a tokenised text).
        window: tokens per window, an int >= 2 (one window gives window - 1 predictions).
        n_eval: evaluation windows, an int >= 1.
        n_calib: calibration windows, an int >= 0.

    Returns:
        (eval, calib): eval (n_eval, window) int64 = consecutive windows from token 0; calib
        (n_calib, window) int64 = the next consecutive windows, so calibration never sees an
        evaluation token. Both are new contiguous tensors on ids' device.

    Raises:
        ArgumentTypeError: ids not an int64 tensor; a count that is not an int.
        ValueError: ids not 1-D; a count out of range; fewer than
            (n_eval + n_calib) * window tokens (the message names both numbers).
    """
    integer_tensor("ids", ids, ranks=(1,), layout="(n_tokens,)", dtype=torch.int64)
    window = integer("window", window, minimum=2, note="a window of T tokens gives T - 1 predictions")
    n_eval = integer("n_eval", n_eval, minimum=1)
    n_calib = nonnegative_integer("n_calib", n_calib)
    needed = (n_eval + n_calib) * window
    if ids.numel() < needed:
        raise ValueError(f"ids holds {ids.numel()} tokens but {n_eval} evaluation + {n_calib} calibration "
                         f"windows of {window} tokens need {needed}; use a longer text or fewer/shorter windows")
    split = n_eval * window
    eval_windows = ids[:split].reshape(n_eval, window).clone()
    calib_windows = ids[split:needed].reshape(n_calib, window).clone()
    return eval_windows, calib_windows


def _check_windows(windows) -> torch.Tensor:
    """windows as a (n, T) int64 tensor with n >= 1 and T >= 2 (a single (T,) window is refused)."""
    integer_tensor("windows", windows, ranks=(2,), layout="(n_windows, T)", dtype=torch.int64)
    n, T = windows.shape
    if n < 1 or T < 2:
        raise ValueError(f"windows must hold at least one window of at least 2 tokens (one prediction), "
                         f"got shape {tuple(windows.shape)}")
    return windows


def _progress(items, progress: bool, desc: str):
    """``items``, wrapped in a tqdm.auto bar when ``progress``."""
    if not progress:
        return items
    from tqdm.auto import tqdm
    return tqdm(items, desc=desc, unit="window")


@torch.no_grad()
def window_nll(model: nn.Module, windows: torch.Tensor, progress: bool = False) -> tuple[float, int]:
    """Summed next-token negative log-likelihood of ``model`` over token windows.

    Each window runs as its own sequence at positions 0 .. T-1, one window per forward (the
    (T, vocab) logits of a 512-token window of SmolLM2 already take 100 MB). Logit t predicts
    token t + 1, so a window contributes T - 1 terms -log softmax(logits_t)[x_{t+1}], computed
    and summed in float64.

    Args:
        model: called as ``model(ids (1, T) int64, positions (T,) int64) -> logits (1, T, vocab)``
            (``course_lib.models.Decoder``'s forward).
        windows: (n_windows, T) int64 token ids, T >= 2, on the model's device.
        progress: show a tqdm progress bar over the windows.

    Returns:
        (nll_sum, count): nll_sum a float in nats, count = n_windows * (T - 1) predictions.

    Raises:
        ArgumentTypeError: windows not an int64 tensor; progress not a bool; the model is not callable.
        ValueError: windows not 2-D, empty, or shorter than 2 tokens; logits of the wrong shape
            or with non-finite values (the message names the window).
    """
    if not callable(model):
        raise ArgumentTypeError(f"model must be callable (ids, positions) -> logits, got {type(model).__qualname__}")
    _check_windows(windows)
    boolean("progress", progress)
    n, T = windows.shape
    positions = torch.arange(T, device=windows.device)
    total = 0.0
    for i in _progress(range(n), progress, "perplexity"):
        logits = model(windows[i:i + 1], positions)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != (1, T):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__qualname__
            raise ValueError(f"model must return logits of shape (1, {T}, vocab) for window {i}, got {got}")
        logp = torch.log_softmax(logits[0, :-1].to(torch.float64), dim=-1)
        nll = -logp.gather(1, windows[i, 1:, None]).sum()
        if not torch.isfinite(nll):
            raise ValueError(f"the negative log-likelihood of window {i} is not finite ({float(nll)}): "
                             f"the model's logits hold inf or NaN")
        total += float(nll)
    return total, n * (T - 1)


def perplexity(model: nn.Module, windows: torch.Tensor, progress: bool = False) -> float:
    """exp(mean next-token NLL over all predictions of all windows) (docs/quantization.md#perplexity).

    Args and Raises: as ``window_nll``.

    Returns:
        The perplexity, a float >= 1 (e.g. about 20 for SmolLM2-135M on WikiText-2).
    """
    nll, count = window_nll(model, windows, progress)
    return math.exp(nll / count)
