"""Speculative decoding: the analytic model of expected tokens and speedup.

A cheap draft proposes ``gamma`` tokens; the target scores all of them (``gamma + 1``
positions per sequence) in one step and keeps the longest acceptable prefix (Leviathan,
Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023,
arXiv:2211.17192; Chen et al., arXiv:2302.01318). With each drafted token accepted with
probability ``alpha``, independently, this module gives the expected tokens per target step,
the cost of the verification step relative to a plain one (a roofline bound from
``roofline.step_time_bound``) and the resulting bound on the speedup.

Lab 1 previews these bounds on the 70B cost calculator
(``docs/roofline.md#speculative-decoding-bounds``); Lab 5 builds the decoding loop itself on
this module (``docs/speculative_decoding.md#expected-tokens-and-speedup``), asks where a
draft stops paying for itself (``break_even_alpha``) and which block length pays most
(``best_gamma``, ``docs/speculative_decoding.md#the-best-gamma``).
"""
from __future__ import annotations

from ..roofline import step_time_bound
from ..validation import nonnegative_integer, nonnegative_number, number, positive_integer, positive_number

__all__ = ["expected_tokens_per_step", "verification_cost_ratio", "speculative_speedup", "break_even_alpha",
           "best_gamma", "TIE_TOLERANCE"]

#: Relative difference below which ``best_gamma`` counts two speedups as equal (a tie).
TIE_TOLERANCE = 1e-12


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Expected tokens emitted per target step with ``gamma`` drafted tokens, each accepted with
    probability ``alpha`` independently (Leviathan et al., 2023, arXiv:2211.17192):

        E = (1 - alpha^(gamma + 1)) / (1 - alpha),   gamma + 1 when alpha = 1

    (``docs/speculative_decoding.md#expected-tokens-and-speedup``). alpha 0.8, gamma 4 -> 3.3616.

    Returns: a float (tokens). Raises: ValueError for alpha outside [0, 1] or a negative gamma.
    """
    number("alpha", alpha, minimum=0, maximum=1)
    g = nonnegative_integer("gamma", gamma)
    if alpha == 1:
        return float(g + 1)
    return (1 - alpha ** (g + 1)) / (1 - alpha)


def verification_cost_ratio(*, weight_bytes: float, n_params: int, batch: int, kv_bytes_per_sequence: float,
                            bandwidth: float, peak_flops: float, gamma: int) -> float:
    """Cost of a target step scoring gamma + 1 positions per sequence relative to a plain
    one-position step (``docs/roofline.md#speculative-decoding-bounds``):

        v_gamma = step_time_bound(positions_per_sequence = gamma + 1) / step_time_bound(positions = 1)

    1.0 while both are memory-bound; grows towards gamma + 1 once compute binds.

    Args (keyword-only): as ``roofline.step_time_bound`` (bytes, parameters, sequences, bytes,
        bytes/s, FLOP/s), and ``gamma``, the drafted tokens per step (int >= 0).
    Returns: a float >= 1. Raises: ValueError on bad sizes or a negative ``gamma``.
    """
    g = nonnegative_integer("gamma", gamma)
    terms = dict(weight_bytes=weight_bytes, n_params=n_params, batch=batch,
                 kv_bytes_per_sequence=kv_bytes_per_sequence, bandwidth=bandwidth, peak_flops=peak_flops)
    return step_time_bound(**terms, positions_per_sequence=g + 1).bound_s / step_time_bound(**terms).bound_s


def speculative_speedup(alpha: float, gamma: int, *, verification_ratio: float = 1.0,
                        draft_cost: float = 0.0) -> float:
    """Bound on speculative decoding's speedup over plain decoding (Leviathan et al., 2023,
    arXiv:2211.17192; ``docs/speculative_decoding.md#expected-tokens-and-speedup``):

        speedup <= expected_tokens_per_step(alpha, gamma) / (gamma * draft_cost + verification_ratio)

    ``verification_ratio`` (from ``verification_cost_ratio``; 1 in the classic analysis) is the
    verification step's cost relative to a plain target step, ``draft_cost`` one draft step's
    time relative to a plain target step (0: a free draft). Both keyword-only.

    Returns: a float. Raises: ValueError for a non-positive verification_ratio, a negative
    draft_cost, or alpha and gamma as ``expected_tokens_per_step``.
    """
    e = expected_tokens_per_step(alpha, gamma)
    r = positive_number("verification_ratio", verification_ratio)
    c = nonnegative_number("draft_cost", draft_cost)
    return e / (gamma * c + r)


def break_even_alpha(gamma: int, *, draft_cost: float, verification_ratio: float = 1.0) -> float:
    """The acceptance rate at which speculative decoding stops being slower than plain decoding:
    the ``alpha`` in [0, 1] with ``speculative_speedup(alpha, gamma, ...) == 1``
    (``docs/speculative_decoding.md#speedup-reference-figures``: gamma 4, c = 0.1 -> about 0.287).

    The speedup grows with alpha (more tokens per iteration, same cost), so the root is unique and
    found by bisection to 1e-12. Below it a correct draft makes decoding slower.

    Args:
        gamma: drafted tokens per iteration, an int >= 1.
        draft_cost: one draft step's time relative to a plain target step (keyword-only, >= 0).
        verification_ratio: the verification step's cost relative to a plain target step
            (keyword-only, > 0; 1 in the classic analysis).

    Returns:
        alpha, a float in [0, 1]; 0.0 when even alpha = 0 breaks even (a free draft with a free
        verification).

    Raises:
        ValueError: gamma < 1, a negative draft_cost or a non-positive verification_ratio; or no
            alpha in [0, 1] reaches a speedup of 1 (even alpha = 1 gives gamma + 1 tokens for
            gamma * draft_cost + verification_ratio > gamma + 1 target steps).
    """
    g = positive_integer("gamma", gamma)
    c = nonnegative_number("draft_cost", draft_cost)
    r = positive_number("verification_ratio", verification_ratio)
    if speculative_speedup(1.0, g, verification_ratio=r, draft_cost=c) < 1:
        raise ValueError(f"no alpha in [0, 1] breaks even at gamma={g}, draft_cost={c}, verification_ratio={r}: "
                         f"even alpha = 1 emits {g + 1} tokens per iteration for the cost of "
                         f"{g * c + r:.4g} target steps")
    if speculative_speedup(0.0, g, verification_ratio=r, draft_cost=c) >= 1:
        return 0.0
    low, high = 0.0, 1.0          # speedup(low) < 1 <= speedup(high)
    while high - low > 1e-12:
        mid = (low + high) / 2
        if speculative_speedup(mid, g, verification_ratio=r, draft_cost=c) < 1:
            low = mid
        else:
            high = mid
    return high


def best_gamma(alpha: float, draft_cost: float, gammas, *, verification_ratio: float = 1.0) -> tuple[int, float]:
    """The block length with the largest speedup bound among ``gammas``, and that speedup
    (``docs/speculative_decoding.md#the-best-gamma``).

    Each extra drafted token adds ``alpha^gamma`` expected tokens (a shrinking gain) for one more
    draft step (a fixed cost, ``draft_cost``), so with a costly draft the speedup
    ``speculative_speedup(alpha, gamma, ...)`` rises, peaks and falls: alpha 0.8 and
    draft_cost 0.1 peak at gamma 6 (2.4696, free verification) among 1 .. 8. A free draft with
    alpha > 0 always prefers the longest block; alpha = 0 the shortest.

    Ties: speedups within a relative ``TIE_TOLERANCE`` (1e-12) of the largest count as equal, and
    the *smallest* such gamma wins (the same speedup for fewer draft steps and a shorter stall
    between chunks); alpha 0 with a free draft ties every gamma at 1.0.

    Args:
        alpha: acceptance rate, a float in [0, 1].
        draft_cost: one draft step's time relative to a plain target step (>= 0).
        gammas: the candidate block lengths, a non-empty iterable of ints >= 0 (any order;
            0 is plain decoding).
        verification_ratio: keyword-only, the verification step's cost relative to a plain
            target step (> 0; 1 in the classic analysis), the same for every gamma.

    Returns:
        (gamma, speedup): an int from ``gammas`` and its ``speculative_speedup``, a float.

    Raises:
        ValueError: an empty ``gammas``, a negative gamma, or alpha, draft_cost and
            verification_ratio as ``speculative_speedup``.
    """
    candidates = sorted({nonnegative_integer("gammas[i]", g) for g in gammas})
    if not candidates:
        raise ValueError("gammas must hold at least one block length, got none")
    speedups = [speculative_speedup(alpha, g, verification_ratio=verification_ratio, draft_cost=draft_cost)
                for g in candidates]
    top = max(speedups)
    for g, s in zip(candidates, speedups):        # ascending: the first within the tolerance is the smallest
        if s >= top * (1 - TIE_TOLERANCE):
            return g, s
    raise AssertionError("unreachable")
