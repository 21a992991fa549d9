"""Stochastic acceptance: the rule that makes speculative *sampling* emit the target's distribution.

A draft proposes ``x ~ q``; the target's distribution at that position is ``p``. Accept ``x`` with
probability ``min(1, p(x) / q(x))``; on a rejection emit a token drawn from the residual
``normalize(max(0, p - q))`` instead. The emitted token is distributed exactly as ``p`` whatever
``q`` is (Leviathan, Kalman and Matias, ICML 2023, arXiv:2211.17192, Algorithm 1 and Theorem 3.5;
Chen et al., arXiv:2302.01318, Algorithm 2), provided ``q`` is the distribution ``x`` was really
drawn from. The chance of accepting is ``sum_x min(p(x), q(x)) = 1 - TV(p, q)``
(``docs/speculative_decoding.md#stochastic-acceptance``).

Contents:
    sampling_probs          logits -> the distribution one samples from (temperature, top-k);
                            applied identically to the target (p) and the draft (q)
    sample_categorical      one token per row by inverse CDF (the drafts and the bonus token)
    accept_or_resample      the acceptance step for N independent rows: the readable reference,
                            and the learner's exercise (same name, same arguments)
    verify_block            a block of gamma proposals per row, positions in order, plus the bonus
    acceptance_probability, total_variation, emitted_distribution   the analytic side
    trial_distribution      many trials of the acceptance step on one pair (p, q), vectorised

Every probability is float64: a float32 residual of two nearly equal distributions loses most of
its digits, and ``emitted_distribution`` is checked against ``p`` to 1e-12. Inputs of another
floating dtype are converted. Probability rows must be nonnegative and sum to 1 within 1e-6
(``ValueError`` naming the first row that does not). Every function here refuses a tensor on
the meta device (``ValueError`` naming it: it has no values to check).

Randomness: every function that samples takes an int ``seed`` and draws from its own
``torch.Generator().manual_seed(seed)``; the global RNG is never touched, so a result depends
on its arguments only.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..validation import (ArgumentTypeError, instance, integer, integer_tensor, materialized, nonnegative_number,
                          positive_integer)

__all__ = ["sampling_probs", "sample_categorical", "accept_or_resample", "verify_block", "acceptance_probability",
           "total_variation", "emitted_distribution", "trial_distribution"]

#: How far a probability row's sum may be from 1.
ROW_SUM_TOLERANCE = 1e-6

#: Largest number of elements of one (rows, support) block that ``trial_distribution`` hands a
#: learner's ``accept`` at once (2**22 float64 = 32 MiB per matrix).
TRIAL_BLOCK_ELEMENTS = 2 ** 22

Accept = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


# -- validation ----------------------------------------------------------------------------
def _floating(name: str, value, *, ranks: tuple[int, ...], layout: str) -> torch.Tensor:
    """A floating tensor of an allowed rank with a nonempty last axis, on a device with data, as float64."""
    if not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a floating tensor of shape {layout}, got {type(value).__qualname__}")
    materialized(name, value)
    if not value.dtype.is_floating_point:
        raise ArgumentTypeError(f"{name} must be a floating tensor of shape {layout} (float64 preferred), "
                                f"got dtype {value.dtype}")
    if value.dim() not in ranks or value.shape[-1] == 0:
        raise ValueError(f"{name} must have shape {layout} with V >= 1, got {tuple(value.shape)}")
    return value.to(torch.float64)


def _probabilities(name: str, value, *, ranks: tuple[int, ...], layout: str) -> torch.Tensor:
    """A tensor of probability rows along the last axis, as float64: entries >= 0, each row summing
    to 1 within ROW_SUM_TOLERANCE. The error names the first bad row."""
    t = _floating(name, value, ranks=ranks, layout=layout)
    if t.numel() == 0:
        return t
    negative = (t < 0).any(-1)
    sums = t.sum(-1)
    bad_sum = ~((sums - 1).abs() <= ROW_SUM_TOLERANCE)  # NaN counts as bad
    for bad, what in ((negative, "has a negative entry"), (bad_sum, None)):
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0])
            where = f"{name}[{', '.join(map(str, index))}]" if index else name
            if what is None:
                what = f"sums to {float(sums[index]):.9g}"
            raise ValueError(f"{where} {what}: every row of {name} must be a probability distribution "
                             f"(entries >= 0, summing to 1 within {ROW_SUM_TOLERANCE:g})")
    return t


def _seed(seed) -> int:
    return integer("seed", seed, minimum=0, maximum=2 ** 64 - 1)


def _sub_seed(generator: torch.Generator) -> int:
    """A fresh seed drawn from ``generator``: one independent stream per call that needs one."""
    return int(torch.randint(0, 2 ** 62, (), generator=generator))


# -- logits -> distributions ---------------------------------------------------------------
def sampling_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """The distribution a sampler draws from: ``softmax(logits / temperature)`` restricted to the
    ``top_k`` largest logits and renormalised, in float64.

    Apply it identically to the target's logits (p) and the draft's (q): the acceptance rule then
    reproduces the target's *sampling* distribution at that temperature and top-k.

    Args:
        logits: (..., V) floating tensor (log-probabilities are logits too); -inf marks a token
            that cannot be drawn; NaN and +inf are refused, and so is a row of only -inf.
        temperature: a number >= 0. 0 means greedy: a one-hot row at the argmax, the first index
            among tied maxima (``torch.argmax``'s rule, the one greedy decoding uses).
        top_k: None (no restriction) or an int in [1, V]. Every token whose logit ties the k-th
            largest is kept (the rule of Hugging Face's ``TopKLogitsWarper`` and gpt-fast), so the
            result never depends on the order ``torch.topk`` returns ties in.

    Returns: (..., V) float64, each row summing to 1.

    Raises:
        ArgumentTypeError: logits not a floating tensor; temperature or top_k of the wrong type.
        ValueError: a 0-d tensor or V = 0; NaN or +inf logits; a row of only -inf; a negative
            temperature; top_k outside [1, V].
    """
    x = _floating("logits", logits, ranks=tuple(range(1, 9)), layout="(..., V)")
    temperature = nonnegative_number("temperature", temperature)
    V = x.shape[-1]
    if top_k is not None:
        top_k = integer("top_k", top_k, minimum=1, maximum=V, note=f"V = {V}")
    if x.numel() == 0:
        return x
    if bool(torch.isnan(x).any()) or bool((x == float("inf")).any()):
        raise ValueError("logits must not hold NaN or +inf")
    top = x.amax(-1, keepdim=True)
    if bool((top == float("-inf")).any()):
        raise ValueError("logits must hold at least one finite value per row (a row of only -inf has no token)")
    if temperature == 0:
        return torch.nn.functional.one_hot(x.argmax(-1), V).to(torch.float64)
    z = (x - top) / temperature  # <= 0, the maximum exactly 0: exp cannot overflow
    if top_k is not None and top_k < V:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    weights = torch.exp(z)
    return weights / weights.sum(-1, keepdim=True)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row i's token: the first index whose cumulative probability exceeds u[i] (u in [0, 1)).

    A token with probability 0 adds nothing to the cumulative sum, so it can never be chosen; a
    u at or above the last cumulative value (the sum can round to 1 - 1e-16) is clamped to the
    last token of positive probability, never to a token the row cannot produce."""
    cdf = probs.cumsum(-1)
    index = torch.searchsorted(cdf, u.unsqueeze(-1), right=True).squeeze(-1)
    V = probs.shape[-1]
    last_positive = V - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(-1)
    return torch.minimum(index, last_positive)


def sample_categorical(probs: torch.Tensor, seed: int) -> torch.Tensor:
    """One token per row of ``probs`` by inverse CDF (cumsum + searchsorted): how the exact
    sampler draws the draft's proposals and the bonus token.

    Args:
        probs: (N, V) probability rows (float64, or converted). seed: an int in [0, 2**64 - 1].

    Returns: (N,) int64 tokens; token t is drawn with probability probs[i, t].

    Raises: ArgumentTypeError / ValueError for a tensor that is not (N, V) probability rows, a seed
        that is not an int in range.
    """
    p = _probabilities("probs", probs, ranks=(2,), layout="(N, V)")
    generator = torch.Generator().manual_seed(_seed(seed))
    return _inverse_cdf(p, torch.rand(p.shape[0], generator=generator, dtype=torch.float64))


# -- the acceptance step -------------------------------------------------------------------
def accept_or_resample(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, seed: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance step of speculative sampling for N independent rows (the readable reference).

    Row i: the draft drew x[i] from q[i]; the target's distribution is p[i].

    1. Accept x[i] iff u < p[i, x] / q[i, x], u uniform in [0, 1): probability min(1, p/q).
    2. Otherwise emit a token from the residual normalize(max(0, p[i] - q[i])), by inverse CDF.
       Normalising matters: max(0, p - q) sums to 1 - sum min(p, q) < 1, and drawing from the
       unnormalised vector piles the missing mass onto one token. When the residual is all zero
       (p == q, where every proposal is accepted anyway) the row falls back to p[i].

    The emitted token is distributed exactly as p[i] (Leviathan et al., 2023, arXiv:2211.17192,
    Theorem 3.5; ``docs/speculative_decoding.md#stochastic-acceptance``).

    This is also the learner's graded exercise: same name, same arguments, same returns.

    Args:
        p: (N, V) target probabilities, float64. q: (N, V) draft probabilities, float64.
        x: (N,) int64 proposals, each in [0, V - 1] with q[i, x[i]] > 0.
        seed: an int in [0, 2**64 - 1]; u (N values) and then the residual draws (N values) come
            from ``torch.Generator().manual_seed(seed)``.

    Returns:
        (tokens (N,) int64, accepted (N,) bool): tokens[i] == x[i] where accepted[i].

    Raises:
        ArgumentTypeError: p or q not a floating tensor, x not an int64 tensor, seed not an int.
        ValueError: p and q of different shapes or not (N, V); x not (N,) or outside [0, V - 1]; a
            row that is not a probability distribution (named); q[i, x[i]] == 0 (a proposal the
            draft could not have drawn: the q passed is not the one x was sampled from).
    """
    p = _probabilities("p", p, ranks=(2,), layout="(N, V)")
    q = _probabilities("q", q, ranks=(2,), layout="(N, V)")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape (N, V), got {tuple(p.shape)} and {tuple(q.shape)}")
    N, V = p.shape
    integer_tensor("x", x, ranks=(1,), layout="(N,)", dtype=torch.int64, minimum=0, maximum=V - 1,
                   note=f"token ids; V = {V}")
    if x.shape[0] != N:
        raise ValueError(f"x must hold one proposal per row, N = {N}, got {x.shape[0]}")
    generator = torch.Generator().manual_seed(_seed(seed))
    u = torch.rand(N, generator=generator, dtype=torch.float64)
    v = torch.rand(N, generator=generator, dtype=torch.float64)

    px = p.gather(1, x.unsqueeze(1)).squeeze(1)
    qx = q.gather(1, x.unsqueeze(1)).squeeze(1)
    if bool((qx <= 0).any()):
        row = int((qx <= 0).nonzero()[0, 0])
        raise ValueError(f"q[{row}, x[{row}]] = q[{row}, {int(x[row])}] is 0: the draft could not have proposed "
                         f"that token, so x was not sampled from this q (the ratio p/q must use the q sampled from)")
    accepted = u < px / qx

    residual = (p - q).clamp_min(0)
    mass = residual.sum(1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(torch.float64).tiny), p)
    resampled = _inverse_cdf(residual, v)
    return torch.where(accepted, x, resampled), accepted


def _check_accept_output(out, n: int, x: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a (possibly learner-written) accept returned, checked before the sampler uses it."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ArgumentTypeError(f"accept must return a tuple (tokens (N,) int64, accepted (N,) bool), "
                                f"got {type(out).__qualname__}")
    tokens, accepted = out
    integer_tensor("accept's tokens", tokens, ranks=(1,), layout="(N,)", dtype=torch.int64, minimum=0,
                   maximum=V - 1, note=f"token ids; V = {V}")
    instance("accept's accepted", accepted, torch.Tensor)
    if accepted.dtype != torch.bool or accepted.dim() != 1:
        raise ArgumentTypeError(f"accept's accepted must be a bool tensor of shape (N,), got dtype "
                                f"{accepted.dtype} and shape {tuple(accepted.shape)}")
    if tokens.shape[0] != n or accepted.shape[0] != n:
        raise ValueError(f"accept must return N = {n} tokens and N flags, got {tokens.shape[0]} and "
                         f"{accepted.shape[0]}")
    if bool((accepted & (tokens != x)).any()):
        row = int((accepted & (tokens != x)).nonzero()[0, 0])
        raise ValueError(f"accept marked row {row} accepted but returned token {int(tokens[row])}, not the "
                         f"proposal {int(x[row])}: an accepted proposal is emitted as it is")
    return tokens, accepted


def verify_block(p: torch.Tensor, q: torch.Tensor, drafted: torch.Tensor, seed: int,
                 accept: Accept = accept_or_resample) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify gamma drafted tokens per row: positions in order, stop at the first rejection.

    Position i (0 .. gamma - 1) calls ``accept(p[rows, i], q[rows, i], drafted[rows, i], seed_i)``
    ONCE, on every row not rejected before i; a row rejected at i emits ``accept``'s resampled
    token and stops with n_accepted = i. A row whose gamma proposals were all accepted draws the
    bonus token from p[:, gamma], the target's distribution after the last proposal. Each row
    thus emits n_accepted + 1 tokens: drafted[:, :n_accepted] and next_token.

    ``accept`` is pluggable: the grader passes the learner's accept_or_resample (and it may run in
    another process, so it is called at most gamma times per block, never once per row).

    Args:
        p: (N, gamma + 1, V) target probabilities at the gamma + 1 scored positions.
        q: (N, gamma, V) the draft's probabilities, the ones each drafted token was drawn from.
        drafted: (N, gamma) int64 proposals in [0, V - 1]. gamma may be 0 (plain sampling from p).
        seed: an int in [0, 2**64 - 1]; position i's accept and the bonus get their own seeds,
            drawn from ``torch.Generator().manual_seed(seed)``.
        accept: a function with accept_or_resample's signature and returns.

    Returns:
        (n_accepted (N,) int64 in [0, gamma], next_token (N,) int64): the correction token after
        a rejection, or the bonus token.

    Raises:
        ArgumentTypeError / ValueError: shapes that do not agree, rows that are not distributions,
            drafted outside [0, V - 1], an ``accept`` that is not callable or returns something
            that is not (tokens (n,) int64, accepted (n,) bool) with accepted tokens equal to the
            proposals; anything ``accept`` raises.
    """
    p = _probabilities("p", p, ranks=(3,), layout="(N, gamma + 1, V)")
    q = _probabilities("q", q, ranks=(3,), layout="(N, gamma, V)")
    N, G1, V = p.shape
    gamma = G1 - 1
    if q.shape != (N, gamma, V):
        raise ValueError(f"q must have shape (N, gamma, V) = {(N, gamma, V)} for p of shape {tuple(p.shape)}, "
                         f"got {tuple(q.shape)}")
    integer_tensor("drafted", drafted, ranks=(2,), layout="(N, gamma)", dtype=torch.int64, minimum=0,
                   maximum=V - 1, note=f"token ids; V = {V}")
    if drafted.shape != (N, gamma):
        raise ValueError(f"drafted must have shape (N, gamma) = {(N, gamma)}, got {tuple(drafted.shape)}")
    if not callable(accept):
        raise ArgumentTypeError(f"accept must be callable like accept_or_resample(p, q, x, seed), "
                                f"got {type(accept).__qualname__}")
    generator = torch.Generator().manual_seed(_seed(seed))
    seeds = [_sub_seed(generator) for _ in range(gamma + 1)]

    n_accepted = torch.full((N,), gamma, dtype=torch.int64)
    next_token = torch.zeros(N, dtype=torch.int64)
    rows = torch.arange(N)  # rows with no rejection yet
    for i in range(gamma):
        if rows.numel() == 0:
            break
        x = drafted[rows, i]
        tokens, accepted = _check_accept_output(accept(p[rows, i], q[rows, i], x, seeds[i]), rows.numel(), x, V)
        rejected = rows[~accepted]
        n_accepted[rejected] = i
        next_token[rejected] = tokens[~accepted]
        rows = rows[accepted]
    if rows.numel():
        next_token[rows] = sample_categorical(p[rows, gamma], seeds[gamma])
    return n_accepted, next_token


# -- the analytic side ---------------------------------------------------------------------
def _pair(p, q, *, probabilities: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    check = _probabilities if probabilities else _floating
    p = check("p", p, ranks=tuple(range(1, 9)), layout="(..., V)")
    q = check("q", q, ranks=tuple(range(1, 9)), layout="(..., V)")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return p, q


def _scalar_if_1d(t: torch.Tensor):
    return float(t) if t.dim() == 0 else t


def acceptance_probability(p: torch.Tensor, q: torch.Tensor):
    """Chance that a proposal x ~ q is accepted: sum_x min(p(x), q(x)) = 1 - TV(p, q).

    Args: p, q: (..., V) probability rows of the same shape.
    Returns: a float for 1-D inputs, else a (...) float64 tensor.
    Raises: ArgumentTypeError / ValueError as ``accept_or_resample`` for bad rows or shapes."""
    p, q = _pair(p, q)
    return _scalar_if_1d(torch.minimum(p, q).sum(-1))


def total_variation(a: torch.Tensor, b: torch.Tensor):
    """Total variation distance 0.5 * sum |a - b| along the last axis.

    Args: a, b: (..., V) floating tensors of the same shape (distributions, or empirical
        frequencies; not checked to sum to 1).
    Returns: a float for 1-D inputs, else a (...) float64 tensor."""
    a, b = _pair(a, b, probabilities=False)
    return _scalar_if_1d(0.5 * (a - b).abs().sum(-1))


def emitted_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution of the token one acceptance step emits, computed analytically:

        q(x) * min(1, p(x) / q(x))  +  (1 - sum_y min(p(y), q(y))) * residual(x)

    with residual = normalize(max(0, p - q)) (p where that is all zero). The first term is
    "proposed and accepted", the second "rejected, then resampled". It equals p (to ~1e-16 in
    float64): Leviathan et al., 2023, Theorem 3.5.

    Args: p, q: (..., V) probability rows of the same shape (q may be 0 where p is not).
    Returns: (..., V) float64."""
    p, q = _pair(p, q)
    accepted_mass = torch.where(q > 0, q * torch.clamp(p / q, max=1.0), torch.zeros_like(q))
    rejected_mass = 1 - torch.minimum(p, q).sum(-1, keepdim=True)
    residual = (p - q).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(torch.float64).tiny), p)
    return accepted_mass + rejected_mass * residual


def trial_distribution(p: torch.Tensor, q: torch.Tensor, n_trials: int, seed: int,
                       accept: Accept = accept_or_resample) -> tuple[torch.Tensor, int]:
    """Run ``n_trials`` independent acceptance steps on one pair (p, q) and count what they emit.

    With the library's accept (the default) nothing of size n_trials x V is built: the proposals
    are one ``torch.multinomial(q, n_trials)``, the acceptance test compares n_trials uniforms
    with p[x] / q[x], and every rejected trial draws from the one residual vector (again one
    multinomial), so memory is O(n_trials + V) even for V = 49,152. This is the same rule as
    accept_or_resample, with the work shared because every row has the same p and q.

    Any other ``accept`` (a learner's) gets real (rows, S) matrices, where S is the union of the
    supports of p and q (the tokens with p > 0 or q > 0; the others can be neither proposed nor
    resampled, so dropping them changes nothing). Pass p and q from ``sampling_probs(...,
    top_k=k)`` to keep S small: the trials run in blocks of at most TRIAL_BLOCK_ELEMENTS
    elements, one ``accept`` call per block.

    Args:
        p, q: (V,) probability vectors (float64). n_trials: an int >= 1.
        seed: an int in [0, 2**64 - 1]. accept: a function like accept_or_resample.

    Returns:
        (counts (V,) int64 summing to n_trials, accepted: int, the trials whose proposal was kept).

    Raises:
        ArgumentTypeError / ValueError: p, q not probability vectors of one length; n_trials < 1;
            a bad seed; an accept that is not callable or returns the wrong thing.
    """
    p = _probabilities("p", p, ranks=(1,), layout="(V,)")
    q = _probabilities("q", q, ranks=(1,), layout="(V,)")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same length V, got {p.shape[0]} and {q.shape[0]}")
    n_trials = positive_integer("n_trials", n_trials)
    generator = torch.Generator().manual_seed(_seed(seed))
    if not callable(accept):
        raise ArgumentTypeError(f"accept must be callable like accept_or_resample(p, q, x, seed), "
                                f"got {type(accept).__qualname__}")
    V = p.shape[0]
    if accept is accept_or_resample:
        x = torch.multinomial(q, n_trials, replacement=True, generator=generator)
        u = torch.rand(n_trials, generator=generator, dtype=torch.float64)
        kept = u < p[x] / q[x]
        n_rejected = n_trials - int(kept.sum())
        residual = (p - q).clamp_min(0)
        if float(residual.sum()) <= 0:
            residual = p
        counts = torch.bincount(x[kept], minlength=V)
        if n_rejected:
            counts += torch.bincount(torch.multinomial(residual, n_rejected, replacement=True, generator=generator),
                                     minlength=V)
        return counts, n_trials - n_rejected

    support = ((p > 0) | (q > 0)).nonzero().squeeze(1)
    ps, qs = p[support], q[support]
    S = support.numel()
    block = max(1, TRIAL_BLOCK_ELEMENTS // S)
    counts = torch.zeros(V, dtype=torch.int64)
    n_accepted = 0
    for start in range(0, n_trials, block):
        n = min(block, n_trials - start)
        x = torch.multinomial(qs, n, replacement=True, generator=generator)
        tokens, accepted = _check_accept_output(
            accept(ps.expand(n, S).contiguous(), qs.expand(n, S).contiguous(), x, _sub_seed(generator)), n, x, S)
        counts += torch.bincount(support[tokens], minlength=V)
        n_accepted += int(accepted.sum())
    return counts, n_accepted
