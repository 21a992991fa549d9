"""Measured costs of speculative decoding on this machine: the c and v_gamma of the speedup model.

``docs/speculative_decoding.md#cost-measurement``: after a warm-up, the median of repeats of

    c       = (one draft decode step) / (one target decode step)
    v_gamma = (the target scoring gamma + 1 positions in one forward) / (one target decode step)

with the KV cache at a realistic length (``context`` committed tokens). These are
*measurements* of this machine, thread count and dtype, to put beside the roofline *bound* on
v_gamma (``analysis.verification_cost_ratio``) and into ``analysis.speculative_speedup``. A
memory-bound device has v_gamma close to 1; a CPU, where the output head over 49,152 tokens is
real arithmetic for every extra position, can be well above it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from ..cache.contiguous import KVCache
from ..models.decoder import Decoder
from ..timing import timed
from ..validation import ArgumentTypeError, instance, nonnegative_integer, positive_integer
from .drafts import Draft, ModelDraft

__all__ = ["StepCosts", "measure_step_costs", "timed"]


@dataclass(frozen=True)
class StepCosts:
    """Median step times and the ratios the speedup model takes (times in seconds).

    Attributes:
        target_step_s: one target decode step (one token, ``context`` tokens cached).
        draft_step_s: one draft decode step, for a model draft; for a draft without a model
            (prompt lookup), one ``propose`` call of max(gammas) tokens on a ``context``-token
            sequence: host-side bookkeeping, not a forward.
        c: draft_step_s / target_step_s for a model draft; 0.0 for a draft without a model (its
            propose time, reported above, is not a per-token model step).
        verify_s: gamma -> one target forward of gamma + 1 positions.
        v: gamma -> verify_s[gamma] / target_step_s, the measured v_gamma.
        context: cached tokens during the measurement.
        warmup, repeats: untimed and timed rounds.
        threads: torch.get_num_threads() during the measurement.
        device: the target's device, with the CUDA device name when there is one.
    """

    target_step_s: float
    draft_step_s: float
    c: float
    verify_s: dict[int, float]
    v: dict[int, float]
    context: int
    warmup: int
    repeats: int
    threads: int
    device: str


def _forward_at(model: Decoder, cache: KVCache, context: int, n_positions: int) -> Callable[[], float]:
    """A timer of one forward of ``n_positions`` tokens after ``context`` cached ones (crop, then feed)."""
    device = model.embed_tokens.weight.device
    ids = torch.arange(n_positions, dtype=torch.int64, device=device).view(1, -1) % model.config.vocab_size
    positions = torch.arange(context, context + n_positions, device=device)

    def run() -> float:
        cache.crop(context)
        return timed(lambda: model(ids, positions, cache), device)[1]
    return run


@torch.no_grad()
def measure_step_costs(target: Decoder, draft: Decoder | Draft, gammas: tuple[int, ...] = (2, 4, 6), *,
                       context: int = 256, warmup: int = 3, repeats: int = 15) -> StepCosts:
    """Measure c and v_gamma for ``target`` and ``draft`` on this machine.

    The cases are timed in interleaved rounds (target step, draft step, each verification, then
    again), so a slow drift of the machine moves all of them alike; the first ``warmup`` rounds
    are not kept. Caches are prefilled once with ``context`` tokens and cropped back before each
    timed forward, so every forward attends to exactly ``context`` cached positions.

    Args:
        target: the target ``Decoder``.
        draft: a draft ``Decoder`` or ``ModelDraft`` (its model is timed on a new cache of its
            own), or another ``Draft`` (timed by one ``propose`` call; c = 0).
        gammas: drafted tokens per iteration to measure v_gamma for, ints >= 1.
        context: cached tokens, an int >= 1 with context + max(gammas) + 1 <= max_seq_len.
        warmup: untimed rounds, an int >= 0. repeats: timed rounds, an int >= 1.

    Returns:
        a ``StepCosts``.

    Raises:
        ArgumentTypeError: target not a Decoder, draft neither a Decoder nor a Draft, a count
            that is not an int.
        ValueError: an empty ``gammas`` or one < 1, context out of range, repeats < 1.
    """
    instance("target", target, Decoder)
    gammas = tuple(positive_integer(f"gammas[{i}]", g) for i, g in enumerate(gammas))
    if not gammas:
        raise ValueError("gammas must name at least one gamma")
    draft_model = draft.model if isinstance(draft, ModelDraft) else draft
    if not isinstance(draft_model, (Decoder, Draft)):
        raise ArgumentTypeError(f"draft must be a Decoder or a Draft, got {type(draft).__qualname__}")
    context = positive_integer("context", context)
    limit = min(target.config.max_seq_len,
                draft_model.config.max_seq_len if isinstance(draft_model, Decoder) else target.config.max_seq_len)
    if context + max(gammas) + 1 > limit:
        raise ValueError(f"context + max(gammas) + 1 = {context + max(gammas) + 1} positions must fit the "
                         f"max_seq_len {limit}; use a shorter context")
    warmup = nonnegative_integer("warmup", warmup)
    repeats = positive_integer("repeats", repeats)

    device = target.embed_tokens.weight.device
    target_cache = target.new_cache(1, context + max(gammas) + 1)
    target.prefill(torch.arange(context, device=device).view(1, -1) % target.config.vocab_size, target_cache)
    cases = {"target": _forward_at(target, target_cache, context, 1)}
    cases.update({g: _forward_at(target, target_cache, context, g + 1) for g in gammas})
    if isinstance(draft_model, Decoder):
        draft_cache = draft_model.new_cache(1, context + 1)
        draft_device = draft_model.embed_tokens.weight.device
        draft_model.prefill(torch.arange(context, device=draft_device).view(1, -1) % draft_model.config.vocab_size,
                            draft_cache)
        cases["draft"] = _forward_at(draft_model, draft_cache, context, 1)
    else:
        tokens = [i % 7 for i in range(context)]     # a repetitive sequence: lookup finds a match at once
        cases["draft"] = lambda: timed(lambda: draft_model.propose(tokens, max(gammas)), device)[1]

    times: dict = {key: [] for key in cases}
    for round_ in range(warmup + repeats):
        for key, run in cases.items():
            seconds = run()
            if round_ >= warmup:
                times[key].append(seconds)
    median = {key: statistics.median(values) for key, values in times.items()}
    target_s = median["target"]
    name = str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    return StepCosts(
        target_step_s=target_s, draft_step_s=median["draft"],
        c=median["draft"] / target_s if isinstance(draft_model, Decoder) else 0.0,
        verify_s={g: median[g] for g in gammas}, v={g: median[g] / target_s for g in gammas},
        context=context, warmup=warmup, repeats=repeats, threads=torch.get_num_threads(), device=name)
