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
this module (``docs/speculative_decoding.md#expected-tokens-and-speedup``).
"""
from __future__ import annotations

from .roofline import step_time_bound
from .validation import nonnegative_integer, nonnegative_number, number, positive_number

__all__ = ["expected_tokens_per_step", "verification_cost_ratio", "speculative_speedup"]


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
