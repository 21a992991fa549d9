"""Graded checks for Lab 5 (speculative decoding).

Each ``check_*`` takes the learner's *functions*, draws its own inputs from a seed (fixed for
the visible checks, ``fresh_seed()`` for the hidden tests) and compares against a contract:

* ``check_accept_or_resample``: one acceptance step on fresh (p, q) pairs is a *statistical*
  contract. The emitted tokens must follow p, the accepted fraction must match
  sum_x min(p(x), q(x)), and the rejected rows must follow the residual normalize(max(0, p - q)).
  Each is a test at a stated significance level.
* ``check_sequence_distribution``: the same function, plugged into the library's whole speculative
  sampler (``course_lib.speculative.exact.sample_speculative``) on a small exact language model.
  Every continuation of 3 tokens has a known probability; a chi-square test checks the emitted
  *sequences*, bonus tokens and rejections at every position included.
* ``check_greedy_speculative_step``: one iteration of greedy speculative decoding with two caches,
  driven here iteration by iteration. After each call, the tokens must equal the target's own
  greedy decoding and both caches must hold exactly the committed prefix, with the K/V the
  reference computes.
* ``check_speculative_formulas``: expected tokens per iteration and the speedup model, to a
  relative 1e-9 (docs/speculative_decoding.md#expected-tokens-and-speedup).
* ``check_best_gamma``: the block length with the largest speedup among given ones, ties to the
  smallest, on fixed cases (an interior optimum, both ends, two ties) and drawn ones
  (docs/speculative_decoding.md#the-best-gamma).

When a contract fails, the checker tries the faults the lab lists and names the one that matches
(docs/speculative_decoding.md#exercises-and-contracts). For the statistical checks a correct
function fails with a probability below ``SIGNIFICANCE`` per check; the message says so.
"""
from __future__ import annotations

import copy
import math
import random
import re
from typing import Callable

import torch

from ..cache.contiguous import KVCache
from ..divergence import first_divergence, top2_gap
from ..models.config import toy_config
from ..models.decoder import Decoder, generate_cached
from ..speculative import analysis
from ..speculative.drafts import ModelDraft, noisy_copy
from ..speculative.exact import MarkovLM, chi_square_test, continuation_probabilities, sample_speculative
from ..speculative.greedy import generate_speculative, speculative_step
from ..speculative.sampling import acceptance_probability, accept_or_resample, total_variation
from .contracts import (ContractError, attempts, call_on_copies, check_int_list, check_own_function, check_real,
                        diagnose, is_grader_error, with_diagnosis)
from .tables import Contract, Edit, Fault, Writes, check_tables

#: Probability that a correct implementation fails one statistical check (all its tests together,
#: Bonferroni-corrected). The hidden tests draw fresh seeds, so this is the false-alarm rate per run.
SIGNIFICANCE = 1e-6

# -- one acceptance step ------------------------------------------------------------------------


def _distribution_pair(rng: random.Random, V: int, case: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A target p and a draft q over V tokens, float64. In odd cases some tokens are impossible for the
    draft (q = 0) and some for the target (p = 0), so that both ratio branches and the residual matter."""
    for _ in attempts("Lab 5"):
        p = torch.distributions.Dirichlet(torch.full((V,), rng.choice([0.5, 1.0, 2.0]), dtype=torch.float64)).sample()
        q = torch.distributions.Dirichlet(torch.full((V,), rng.choice([0.5, 1.0, 2.0]), dtype=torch.float64)).sample()
        if case % 2 == 1:                      # sparse supports: zeros in p and in q
            p[rng.randrange(V)] = 0.0
            q[rng.randrange(V)] = 0.0
        p, q = p / p.sum(), q / q.sum()
        tv = float(total_variation(p, q))
        residual = (p - q).clamp(min=0) / tv
        # the residual must spread over several tokens (its chi-square needs two cells) and not sit on the
        # last one (where an unnormalised inverse CDF piles up the missing mass)
        if 0.15 < tv < 0.7 and int((residual > 0.05).sum()) >= 2 and float(residual[-1]) < 0.5:
            return p, q
    raise AssertionError("unreachable")


def _emission_checks(tokens: torch.Tensor, accepted: torch.Tensor, x: torch.Tensor, p: torch.Tensor,
                     q: torch.Tensor, level: float) -> list[str]:
    """The three statistical tests of one batch of trials; returns the failures (empty: passed)."""
    N, V = len(tokens), len(p)
    failures = []
    alpha = float(acceptance_probability(p, q))
    n_acc = int(accepted.sum())
    sd = math.sqrt(N * alpha * (1 - alpha))
    z = (n_acc - N * alpha) / sd if sd > 0 else (0.0 if n_acc == round(N * alpha) else math.inf)
    if math.erfc(abs(z) / math.sqrt(2)) < level:
        failures.append(f"accepted {n_acc:,} of {N:,} proposals ({n_acc / N:.4f}); sum_x min(p, q) = {alpha:.4f} "
                        f"predicts {N * alpha:,.0f} (z = {z:+.1f})")
    stat, dof, pv = chi_square_test(tokens.view(-1, 1), p)
    if pv < level:
        empirical = torch.bincount(tokens, minlength=V).double() / N
        failures.append(f"the emitted tokens do not follow p: chi-square {stat:,.1f} on {dof} degrees of freedom, "
                        f"p-value {pv:.2g}; TV(emitted, p) = {float(total_variation(empirical, p)):.4f}, "
                        f"TV(q, p) = {float(total_variation(q, p)):.4f}")
    rejected = tokens[~accepted]
    residual = (p - q).clamp(min=0)
    if len(rejected) >= 50 and float(residual.sum()) > 0:
        stat, dof, pv = chi_square_test(rejected.view(-1, 1), residual / residual.sum())
        if pv < level:
            empirical = torch.bincount(rejected, minlength=V).double() / len(rejected)
            failures.append(f"the {len(rejected):,} resampled tokens do not follow normalize(max(0, p - q)): "
                            f"chi-square {stat:,.1f} on {dof} degrees of freedom, p-value {pv:.2g}; resampled "
                            f"{_rounded(empirical)} vs residual {_rounded(residual / residual.sum())}")
    return failures


def _rounded(t: torch.Tensor) -> list[float]:
    return [round(float(v), 3) for v in t]


def _step_variants(p: torch.Tensor, q: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """The emitted distribution of a step with each known fault (analytic), for the diagnosis."""
    def mixture(target, draft, normalise=True):
        accept = torch.minimum(target, draft)                 # accepted mass of each token
        residual = (target - draft).clamp(min=0)              # its sum R = 1 - sum(accept): the rejection rate
        R = residual.sum()
        if normalise:
            return accept + residual                          # R * residual / R
        # inverse CDF on the unnormalised residual (its CDF ends at R < 1): a uniform u < R picks token j
        # with probability residual_j, and u >= R is clamped onto the last token
        out = accept + R * residual
        out[-1] += R * (1 - R)
        return out

    def swapped():
        # the proposal still comes from q, but is accepted with min(1, q/p) and resampled from max(0, q - p)
        accept = q * torch.where(p > 0, (q / p).clamp(max=1), torch.ones_like(p))
        residual = (q - p).clamp(min=0)
        return accept + (1 - accept.sum()) * residual / residual.sum()

    return {
        "p and q swapped: accepted with min(1, q(x)/p(x)) and resampled from max(0, q - p)": swapped,
        "residual not renormalised: max(0, p - q) sampled as if it summed to 1 (its mass is 1 - sum min(p, q) < 1), "
        "so the remaining probability lands on the last token": lambda: mixture(p, q, normalise=False),
        "the rejected proposal kept instead of resampling": lambda: q,
    }


SEEDED_ROWS = 2_000   # rows of the calls that check the draws come from the seed alone


def _check_seeded(fn: Callable, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, seed: int, what: str) -> None:
    """Contract: the draws come from ``seed`` alone (``torch.Generator().manual_seed(seed)``). On the
    first ``SEEDED_ROWS`` rows, two calls with the same seed give the same tokens and, where at least
    20 of those rows are expected to be rejected (sum of TV(p, q) over rows), a call with seed + 1
    other tokens (each such row's outcome then depends on the draws)."""
    p, q, x = p[:SEEDED_ROWS], q[:SEEDED_ROWS], x[:SEEDED_ROWS]
    first, _ = _call_step(fn, p, q, x, seed, what)
    again, _ = _call_step(fn, p, q, x, seed, what)
    if not torch.equal(first, again):
        rows = int((first != again).sum())
        raise ContractError(f"{what}: two calls with the same seed {seed} on the same {len(x):,} rows gave different "
                            f"tokens in {rows:,} rows: the draws must come from torch.Generator().manual_seed(seed) "
                            "alone (torch's global generator, or one not made from seed, gives other draws each call)")
    if float((p - q).clamp(min=0).sum()) < 20:
        return
    other, _ = _call_step(fn, p, q, x, seed + 1, what)
    if torch.equal(other, first):
        raise ContractError(f"{what}: seeds {seed} and {seed + 1} gave the same {len(x):,} tokens: the draws must "
                            "come from torch.Generator().manual_seed(seed)")


def _call_step(fn: Callable, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, seed: int, what: str):
    """The learner's accept_or_resample on (N, V) rows, its result type-checked."""
    N, V = p.shape
    result = call_on_copies(what, fn, p, q, x, seed)
    if type(result) is not tuple or len(result) != 2:
        raise ContractError(f"{what}: accept_or_resample must return a tuple (tokens, accepted), got "
                            f"{type(result).__qualname__}")
    tokens, accepted = result
    if type(tokens) is not torch.Tensor or tokens.shape != (N,) or tokens.dtype != torch.int64:
        raise ContractError(f"{what}: tokens must be an int64 tensor of shape ({N},), got "
                            f"{_describe(tokens)}")
    if type(accepted) is not torch.Tensor or accepted.shape != (N,) or accepted.dtype != torch.bool:
        raise ContractError(f"{what}: accepted must be a bool tensor of shape ({N},), got {_describe(accepted)}")
    if N and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
        raise ContractError(f"{what}: tokens must be ids in 0 .. {V - 1}, got values {int(tokens.min())} .. "
                            f"{int(tokens.max())}")
    kept = accepted & (tokens != x)
    if bool(kept.any()):
        i = int(kept.nonzero()[0])
        raise ContractError(f"{what}: row {i} is marked accepted but emits {int(tokens[i])} instead of its "
                            f"proposal {int(x[i])}: an accepted proposal is the token emitted")
    impossible = accepted & (p[torch.arange(N), x] == 0)
    if bool(impossible.any()):
        i = int(impossible.nonzero()[0])
        raise with_diagnosis(f"{what}: row {i} accepted token {int(x[i])}, which the target gives probability 0: "
                             "the acceptance probability is min(1, p(x) / q(x)), which is 0 there",
                             "p and q swapped: min(1, q(x) / p(x)) is 1 wherever p(x) = 0")
    return tokens, accepted


def _describe(obj) -> str:
    if type(obj) is torch.Tensor:
        return f"a {obj.dtype} tensor of shape {tuple(obj.shape)}"
    return type(obj).__qualname__


def check_accept_or_resample(fn: Callable, seed: int = 0, cases: int = 2, trials: int = 90_000,
                             pairs: int = 3) -> None:
    """Contract: fn(p (N, V) float64, q (N, V) float64, x (N,) int64, seed int) -> (tokens (N,) int64,
    accepted (N,) bool), where each x[i] was drawn from q[i]. Row i accepts x[i] with probability
    min(1, p(x)/q(x)); a rejected row emits a token drawn from normalize(max(0, p - q)), its own row's.
    Checked statistically. Each case's ``trials`` rows mix ``pairs`` fresh (p, q) pairs in a random order,
    so every row must use its own distributions. For each pair, at significance ``SIGNIFICANCE``:
    the accepted count against sum_x min(p, q) (binomial z-test), the emitted tokens against p and
    the resampled ones against the residual (Pearson chi-square). An accepted row must emit its
    proposal; no token with p = 0 may be accepted. The draws must come from ``seed``: two seeds give
    different tokens.
    Source: Leviathan et al., 2023 (arXiv:2211.17192), Theorem 3.5; docs/speculative_decoding.md#stochastic-acceptance.
    """
    check_own_function("accept_or_resample", fn)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    torch_state = torch.random.get_rng_state()
    level = SIGNIFICANCE / (3 * cases * pairs)
    try:
        torch.manual_seed(seed)                       # the Dirichlet draws use the global generator
        drawn = []
        for case in range(cases):
            V = rng.randint(5, 12)
            drawn.append([_distribution_pair(rng, V, case) for _ in range(pairs)])
    finally:
        torch.random.set_rng_state(torch_state)
    for case, these in enumerate(drawn):
        V = len(these[0][0])
        which = torch.randint(0, pairs, (trials,), generator=gen)          # the pair each row uses
        P = torch.stack([p for p, _ in these])[which]
        Q = torch.stack([q for _, q in these])[which]
        x = torch.multinomial(Q, 1, generator=gen).squeeze(-1)
        what = (f"accept_or_resample(case {case}: {trials:,} trials of {pairs} pairs (p, q) over {V} tokens, rows "
                "mixed)")
        call_seed = rng.randrange(2 ** 31)
        tokens, accepted = _call_step(fn, P, Q, x, call_seed, what)
        for j, (p, q) in enumerate(these):
            rows = which == j
            failures = _emission_checks(tokens[rows], accepted[rows], x[rows], p, q, level)
            if failures:
                err = ContractError(f"{what}, pair {j}: " + failures[0] + "".join(f"\n  also: {f}" for f in failures[1:])
                                    + f"\n  (a correct step fails this check with probability below {SIGNIFICANCE:g})")
                empirical = torch.bincount(tokens[rows], minlength=V).double() / int(rows.sum())
                raise diagnose(err, empirical, _step_variants(p, q),
                               lambda got, cand: float(total_variation(got, cand)) < 0.25 * float(total_variation(got, p))
                               and float(total_variation(got, cand)) < 0.02) from None
        if case == 0:
            _check_seeded(fn, P, Q, x, call_seed, what)


# -- whole sequences ----------------------------------------------------------------------------
def check_sequence_distribution(fn: Callable, seed: int = 0, cases: int = 1, samples: int = 40_000,
                                n_tokens: int = 3) -> None:
    """Contract: with fn as the acceptance step of the whole speculative sampler
    (``course_lib.speculative.exact.sample_speculative``: the draft samples gamma tokens, the
    target scores gamma + 1 positions, bonus tokens, per-row rollback), the emitted *sequences*
    follow the target model. On a fresh exact order-2 model over 5..7 tokens and a draft that
    differs from it, every continuation of ``n_tokens`` tokens has a known probability
    (``continuation_probabilities``). The ``samples`` sampled continuations pass a Pearson
    chi-square test at significance ``SIGNIFICANCE`` (cells expected below 5 pooled).
    fn is called once per drafted position per iteration, on every row still running.
    Source: Leviathan et al., 2023 (arXiv:2211.17192); docs/speculative_decoding.md#distribution-check.
    """
    check_own_function("accept_or_resample", fn)
    rng = random.Random(seed)
    level = SIGNIFICANCE / cases
    for case in range(cases):
        V = rng.randint(5, 7)
        target = MarkovLM.random(vocab_size=V, seed=rng.randrange(2 ** 31))
        draft = MarkovLM.perturbed(target, strength=rng.choice([0.5, 1.0]), seed=rng.randrange(2 ** 31))
        prompt = [rng.randrange(V) for _ in range(rng.randint(1, 3))]
        gamma = rng.choice([2, 3])
        what = (f"sequence distribution (case {case}: vocabulary {V}, prompt {prompt}, gamma {gamma}, "
                f"{samples:,} continuations of {n_tokens} tokens)")
        got = sample_speculative(target, draft, prompt, n_tokens, gamma, samples, rng.randrange(2 ** 31),
                                 accept=_checked_accept(fn, what))
        exact = continuation_probabilities(target, prompt, n_tokens)
        stat, dof, pv = chi_square_test(got, exact)
        if pv < level:
            index = (got * (V ** torch.arange(n_tokens - 1, -1, -1))).sum(-1)
            empirical = torch.bincount(index, minlength=V ** n_tokens).double() / samples
            worst = int((empirical - exact).abs().argmax())
            seq = [(worst // V ** (n_tokens - 1 - i)) % V for i in range(n_tokens)]
            raise ContractError(
                f"{what}: the emitted sequences do not follow the target: chi-square {stat:,.1f} on {dof} degrees "
                f"of freedom, p-value {pv:.2g} (significance {level:g}; a correct step fails with probability below "
                f"that)\n  most off: continuation {seq} emitted {float(empirical[worst]):.4f} of the time, the target "
                f"gives it {float(exact[worst]):.4f}; TV(emitted, target) = "
                f"{float(total_variation(empirical, exact)):.4f}")


def _checked_accept(fn: Callable, what: str) -> Callable:
    """fn as the sampler's acceptance step, each call's result checked as in check_accept_or_resample,
    and on the first call, that its draws come from the seed alone (``_check_seeded``)."""
    first = [True]

    def accept(p, q, x, seed):
        if first[0]:
            first[0] = False
            _check_seeded(fn, p, q, x, seed, what)
        return _call_step(fn, p, q, x, seed, what)
    return accept


# -- greedy speculative decoding ----------------------------------------------------------------
def _hidden_target(seed: int) -> Decoder:
    rng = random.Random(seed)
    n_kv = rng.choice([1, 2])
    config = toy_config(n_layers=rng.choice([2, 3]), d_model=64, n_heads=n_kv * rng.choice([1, 2]), n_kv_heads=n_kv,
                        head_dim=16, d_ff=128, vocab_size=rng.choice([97, 128, 160]),
                        rope_theta=rng.choice([10000.0, 500.0]), max_seq_len=128)
    return Decoder.random(config, seed)


class _RecordingDraft:
    """A draft that records each proposal it makes: (the committed tokens, the proposed tokens)."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def propose(self, tokens: list[int], gamma: int) -> list[int]:
        proposals = self.inner.propose(tokens, gamma)
        self.calls.append((list(tokens), list(proposals)))
        return proposals

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)


@torch.no_grad()
def _telling_iterations(target: Decoder, draft: Decoder, calls: list[tuple[list[int], list[int]]]) -> bool:
    """Whether a reference run (its ``_RecordingDraft.calls``) has both iterations that tell common
    mistakes from the contract:

    * one that rejects a proposal after which the target agrees with a later one: only there does a
      step that counts every match (not the matching prefix) emit other tokens, and, with the
      rejection before the last proposal, a draft cache never cropped show;
    * a full acceptance whose bonus token the draft would predict otherwise: only there does a
      bonus taken from the draft instead of the target show;
    * the first iteration that accepts at most gamma - 2 proposals accepts at most gamma - 3: a
      draft cache never cropped and one cropped to L' (not L' - 1) first fail there, and with
      gamma - 2 accepted they would leave the same cache, so the diagnosis could not name one."""
    after_rejection = other_bonus = False
    crops_differ = None
    for tokens, proposals in calls:
        L, gamma = len(tokens), len(proposals)
        ids, positions = torch.tensor([tokens + proposals]), torch.arange(L + gamma)
        verdict = target(ids, positions)[0, L - 1:].argmax(-1)
        agree = [p == int(v) for p, v in zip(proposals, verdict)]
        k = agree.index(False) if False in agree else gamma
        if True in agree[k + 1:]:
            after_rejection = True
        if k == gamma and not other_bonus:
            other_bonus = int(draft(ids, positions)[0, -1].argmax()) != int(verdict[-1])
        if crops_differ is None and k <= gamma - 2:
            crops_differ = k <= gamma - 3
    return after_rejection and other_bonus and bool(crops_differ)


def _greedy_case(seed: int, case: int, n_new: int):
    """(target, draft, draft name, prompt, gamma, greedy tokens) with no near-tie (top-2 gap >= 1e-3)
    anywhere in the target's greedy decoding, so that float rounding cannot decide a token. Every case
    after the first drafts 3 to 5 tokens with a noisy copy, with rejections, accepted runs, an
    iteration where the target agrees with a proposal after rejecting an earlier one and a full
    acceptance whose bonus the draft would get wrong (``_telling_iterations``), the visible case
    included."""
    rng = random.Random(seed * 7919 + case)
    target = _hidden_target(rng.randrange(2 ** 31))
    gen = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    for _ in attempts("Lab 5"):
        prompt = torch.randint(0, target.config.vocab_size, (rng.randint(4, 10),), generator=gen)
        tokens, logits = generate_cached(target, prompt, n_new + 6)
        if float(top2_gap(logits).min()) < 1e-3:
            continue
        if case == 0:
            return target, target, "the target itself (every proposal is accepted)", prompt, rng.choice([2, 3, 4]), \
                tokens.tolist()
        gamma = rng.choice([3, 4, 5])
        draft = noisy_copy(target, rng.choice([0.1, 0.15, 0.2]), rng.randrange(2 ** 31))
        recorder = _RecordingDraft(ModelDraft(draft, draft.new_cache(1, len(prompt) + n_new)))
        stats = generate_speculative(target, recorder, prompt, n_new, gamma)[1]
        if stats.proposed - stats.accepted >= 2 and stats.accepted >= 2 \
                and _telling_iterations(target, draft, recorder.calls):
            return target, draft, "a noisy copy of the target", prompt, gamma, tokens.tolist()
    raise AssertionError("unreachable")


@torch.no_grad()
def _committed_mismatch(model: Decoder, got: KVCache, committed: list[int], start: int) -> int | None:
    """First slot s in start .. got.length - 1 whose K/V differ (atol 1e-4) from MODEL's own K/V of the
    committed tokens at positions 0 .. s (a fresh prefill), or None. A draft fed its last proposal
    before the target accepted it holds one slot more than the reference's, and that slot is right
    when it holds the committed token's K/V (the contract: the draft's cache holds committed tokens)."""
    n = got.length
    fresh = model.new_cache(1, n)
    model(torch.tensor([committed[:n]]), torch.arange(n), fresh)
    return _slot_mismatch(got, fresh, n, start)


def _slot_mismatch(got: KVCache, ref: KVCache, n: int, start: int = 0, atol: float = 1e-4) -> int | None:
    """First slot s in start .. n - 1 whose K or V (any layer, head) differs from the reference's, or None."""
    if n <= start:
        return None
    diff = ((got.k[:, :, :, start:n] - ref.k[:, :, :, start:n]).abs().amax(dim=(0, 1, 2, 4)) +
            (got.v[:, :, :, start:n] - ref.v[:, :, :, start:n]).abs().amax(dim=(0, 1, 2, 4)))
    bad = (diff > atol).nonzero()
    return start + int(bad[0]) if len(bad) else None


def check_greedy_speculative_step(fn: Callable, seed: int = 0, cases: int = 2, n_new: int = 24) -> None:
    """Contract: fn(target, draft, tokens, target_cache, draft_cache, gamma) -> the tokens emitted by one
    iteration of greedy speculative decoding (a list of 1 .. gamma + 1 ints), changing both caches in
    place. ``tokens`` is the committed sequence (prompt and every token emitted so far, length L).
    On entry target_cache holds K/V of tokens[:L-1], and draft_cache of tokens[:draft_cache.length]
    (at most L - 1). On return, with L' = L + len(emitted):

    * emitted equals what the reference iteration emits (``course_lib.speculative.greedy.speculative_step``
      with a ``ModelDraft``): the accepted proposals, then the target's token, which is the bonus
      when all gamma are accepted;
    * target_cache.length == L' - 1 and draft_cache.length <= L' - 1 (every committed token but the
      newest, which the next iteration feeds), and the K/V in both caches equal the reference's
      (atol 1e-4);
    * over the whole run, the tokens equal the target's own greedy decoding (``generate_cached``).

    The checker prefills both caches with prompt[:-1] and calls fn until ``n_new`` tokens are emitted.
    Case 0 drafts with the target itself (every block fully accepted); the others with a noisy copy
    (rejections at varying positions). Prompts with a top-2 logit gap below 1e-3 anywhere in the
    target's greedy decoding are redrawn.
    Source: Leviathan et al., 2023 (arXiv:2211.17192); docs/speculative_decoding.md#greedy-speculative-decoding.
    """
    check_own_function("greedy_speculative_step", fn)
    for case in range(cases):
        target, draft, name, prompt, gamma, greedy = _greedy_case(seed, case, n_new)
        T0 = len(prompt)
        max_len = T0 + n_new + gamma + 2
        caches = [target.new_cache(1, max_len), draft.new_cache(1, max_len)]
        ref_target, ref_draft = target.new_cache(1, max_len), ModelDraft(draft, draft.new_cache(1, max_len))
        with torch.no_grad():
            if T0 > 1:
                for model, cache in ((target, caches[0]), (draft, caches[1]), (target, ref_target),
                                     (draft, ref_draft.cache)):
                    model(prompt[None, :-1], torch.arange(T0 - 1), cache)
        tokens = prompt.tolist()
        iteration = 0
        while len(tokens) - T0 < n_new:
            L = len(tokens)
            label = (f"greedy_speculative_step(case {case}: draft = {name}, gamma {gamma}; iteration {iteration}, "
                     f"L = {L} committed tokens)")
            expected = speculative_step(target, ref_draft, list(tokens), ref_target, gamma)
            k = expected.accepted
            try:
                result = fn(target, draft, list(tokens), caches[0], caches[1], gamma)
            except (ContractError, KeyboardInterrupt):
                raise
            except Exception as exc:
                if is_grader_error(exc):
                    raise
                raise _raised(label, exc, L, gamma, k) from None
            emitted = check_int_list("the emitted tokens", result)
            want = list(expected.emitted)
            if emitted != want:
                raise _wrong_tokens(label, emitted, want, gamma, k, tokens, greedy, T0, draft, caches[1],
                                    ref_draft.cache)
            _check_lengths(label, caches, L, want, gamma, k)
            for which, got, ref in (("target_cache", caches[0], ref_target), ("draft_cache", caches[1], ref_draft.cache)):
                slot = _slot_mismatch(got, ref, min(got.length, ref.length))
                if slot is None and got.length > ref.length:     # a draft that was also fed its last proposal
                    slot = _committed_mismatch(draft, got, tokens + want, ref.length)
                if slot is not None:
                    raise _slot_error(label, which, slot, tokens + want, k, gamma)
            tokens += want
            iteration += 1
        produced = tokens[T0:T0 + n_new]
        if produced != greedy[:n_new]:
            i = first_divergence(produced, greedy[:n_new])
            raise ContractError(f"greedy speculative decoding (case {case}): token {i} is {produced[i]} but the "
                                f"target's greedy decoding gives {greedy[i]}: speculative decoding must emit exactly "
                                "the target's tokens")


#: The length a refused ``KVCache.crop`` asked for, read from its message (``course_lib.validation``'s
#: "crop length must be an int in [0, M] (...), got N"): the only trace of which crop raised that a
#: learner's exception keeps when it comes back from the grading kernel as text.
_CROP_ASKED = re.compile(r"crop length must be an int in \[0, \d+\].*, got (\d+)$")


def _raised(label: str, exc: Exception, L: int, gamma: int, k: int) -> ContractError:
    """The failure for a learner's step that raised, naming the crop it got wrong when a crop raised.
    Only after a full acceptance (k = gamma) can a crop ask for more slots than a cache holds: the
    target's holds L + gamma, the reference draft's L + gamma - 1 (its last proposal is never fed)."""
    err = ContractError(f"{label}: your function raised {type(exc).__name__}: {exc}")
    asked = _CROP_ASKED.search(str(exc))
    if asked is None or k != gamma:
        return err
    if int(asked.group(1)) == L + k + 1:
        return with_diagnosis(err, "crop off by one: all gamma proposals were accepted, so the target's cache holds "
                              "L + gamma slots; cropping to the committed length L' = L + gamma + 1 asks for a slot "
                              "that was never filled. Keep every committed token but the newest: crop to L' - 1")
    if int(asked.group(1)) == L + k:
        return with_diagnosis(err, "the draft's crop asked for L + k slots after a full acceptance, but a draft that "
                              "was never fed its last proposal holds only L + gamma - 1: it may hold fewer than the "
                              "committed tokens, never more, so crop it to min(draft_cache.length, L + k)")
    return err


def _check_lengths(label, caches, L, want, gamma, k) -> None:
    """Both caches must hold every committed token but the newest (L' - 1 slots; the draft's at most)."""
    Lp = L + len(want)
    t_len, d_len = caches[0].length, caches[1].length
    if t_len != Lp - 1:
        err = ContractError(f"{label}: after the iteration target_cache.length is {t_len}, expected L' - 1 = {Lp - 1} "
                            f"(the {Lp} committed tokens but the newest, which the next iteration feeds)")
        if t_len == L + gamma and k < gamma:
            raise with_diagnosis(err, f"cache not cropped after a rejection: only {k} of {gamma} proposals were "
                                 f"accepted, yet the cache still holds the K/V of the {gamma - k} rejected ones; crop "
                                 "it back to L' - 1")
        if abs(t_len - (Lp - 1)) == 1:
            raise with_diagnosis(err, f"crop off by one: the cache was cropped to {t_len} slots instead of "
                                 f"{Lp - 1} = L + accepted")
        raise err
    if d_len > Lp - 1:
        err = ContractError(f"{label}: after the iteration draft_cache.length is {d_len}, more than L' - 1 = {Lp - 1}: "
                            "it holds K/V of tokens that were never committed")
        uncropped = d_len >= L + gamma - 1 and k < gamma - 1    # as long as after proposing: no crop at all?
        if uncropped and d_len == Lp:      # k = gamma - 2: no crop and a crop to L' leave the same cache
            raise with_diagnosis(err, "the draft's cache keeps a rejected proposal: either it was not cropped after "
                                 "the rejection, or it was cropped to the committed length L' instead of L' - 1 "
                                 f"(here, with {k} of {gamma} accepted, the two leave the same {d_len} slots)")
        if uncropped:
            raise with_diagnosis(err, "cache not cropped after a rejection: the draft's cache keeps the rejected "
                                 "proposals")
        if d_len == Lp:
            raise with_diagnosis(err, "crop off by one: the draft's cache was cropped to the committed length "
                                 "instead of L' - 1")
        raise err


def _wrong_tokens(label, emitted, want, gamma, k, tokens, greedy, T0, draft, draft_cache,
                  ref_draft_cache) -> ContractError:
    err = ContractError(f"{label}: emitted {emitted}, the reference iteration emits {want} ({k} of {gamma} "
                        "proposals accepted, then the target's own token)")
    start = len(tokens) - T0
    if k < gamma and len(emitted) > len(want) and emitted[:k] == want[:k]:
        return with_diagnosis(err, f"proposals accepted past the first mismatch: the target rejected proposal {k + 1} "
                              f"(its own token there is {want[k]}), so the iteration ends with that token; the "
                              "accepted count is the length of the matching prefix, not the number of matches")
    if k == gamma and len(emitted) == len(want) and emitted[:-1] == want[:-1]:
        with torch.no_grad():
            seq = tokens + want[:-1]
            draft_says = int(draft(torch.tensor([seq]), torch.arange(len(seq)))[0, -1].argmax())
        source = ("it is the draft's prediction after the last proposal; " if emitted[-1] == draft_says != want[-1]
                  else "")
        return with_diagnosis(err, f"the bonus token is not the target's: every proposal was accepted, and {source}the "
                              "bonus is the target's own prediction after the last proposal (row gamma of its "
                              "verification forward), which the draft may not share")
    if emitted != greedy[start:start + len(emitted)]:
        return err
    slot = _slot_mismatch(draft_cache, ref_draft_cache, min(draft_cache.length, ref_draft_cache.length))
    if slot is not None:
        return with_diagnosis(err, "your tokens are the target's greedy tokens, but a different number of them: your "
                              f"draft proposed other tokens, and its cache differs from the reference's at slot {slot}. "
                              "The draft was not fed every committed token its cache lacks (after a full acceptance "
                              "it lacks two: the last proposal and the bonus token); feed tokens[draft_cache.length:]")
    if k == gamma and emitted == want[:-1]:
        return with_diagnosis(err, "bonus token dropped: when every proposal is accepted, the target's prediction "
                              "after the last one (its row gamma) is a free extra token; emit it")
    return with_diagnosis(err, "your tokens are the target's greedy tokens, but a different number of them: your draft "
                          "proposed other tokens than a draft whose cache holds the committed sequence")


def _slot_error(label, which, slot, committed, k, gamma) -> ContractError:
    err = ContractError(f"{label}: {which} slot {slot} holds other K/V than the reference's for committed token "
                        f"{committed[slot]} at position {slot}")
    if which == "draft_cache":
        return with_diagnosis(err, "the draft was not fed every committed token its cache lacks, each at its own "
                              "position (token s belongs in slot s at position s): after a full acceptance it lacks two, "
                              "the last proposal and the bonus token; feed tokens[draft_cache.length:] at positions "
                              "draft_cache.length .. L - 1, then proposal d_j at position L + j - 1")
    return with_diagnosis(err, "the target was fed a token at the wrong position or into the wrong slot (feed "
                          "[tokens[-1], d1 .. d_gamma] at positions L - 1 .. L + gamma - 1)")


# -- the formulas ------------------------------------------------------------------------------
def check_speculative_formulas(expected_fn: Callable, speedup_fn: Callable, seed: int = 0, cases: int = 12) -> None:
    """Contracts: expected_fn(alpha, gamma) == (1 - alpha^(gamma + 1)) / (1 - alpha), or gamma + 1 at
    alpha = 1; speedup_fn(alpha, gamma, *, verification_ratio, draft_cost) == expected /
    (gamma * draft_cost + verification_ratio); both to a relative 1e-9, on alpha in {0, 0.99, 0.999, 0.9999, 1} and random
    alpha in (0, 1), gamma in 0 .. 8. Source: Leviathan et al., 2023 (arXiv:2211.17192), Eq. 1 and
    Theorem 3.8; docs/speculative_decoding.md#expected-tokens-and-speedup."""
    check_own_function("expected_tokens_per_step", expected_fn)
    check_own_function("speculative_speedup", speedup_fn)
    rng = random.Random(seed)
    draws = [(1.0, 4, 0.1, 1.0), (0.0, 3, 0.2, 1.0), (0.8, 4, 0.1, 1.0), (0.99, 2, 0.3, 1.5), (0.999, 5, 0.1, 1.2),
             (0.9999, 3, 0.05, 1.1)]
    draws += [(rng.random(), rng.randint(0, 8), rng.uniform(0, 0.6), rng.uniform(1.0, 3.0)) for _ in range(cases)]
    for alpha, gamma, c, v in draws:
        want = analysis.expected_tokens_per_step(alpha, gamma)
        what = f"expected_tokens_per_step(alpha={alpha:.6g}, gamma={gamma})"
        got = _number(what, lambda: expected_fn(alpha, gamma), alpha, gamma)
        if not math.isclose(got, want, rel_tol=1e-9) and alpha == 1:
            err = ContractError(f"{what}: expected {want:.10g} = gamma + 1 (the limit of (1 - alpha^(gamma+1)) / "
                                f"(1 - alpha) at alpha = 1), got {got:.10g}")
            raise diagnose(err, got, {
                "the alpha = 1 limit taken as gamma: every proposal is accepted, and the target's own (bonus) token "
                "follows them, so gamma + 1 tokens": lambda: float(gamma),
            }, lambda g, cand: math.isclose(g, cand, rel_tol=1e-9)) from None
        if not math.isclose(got, want, rel_tol=1e-9):
            err = ContractError(f"{what}: expected {want:.10g} = (1 - alpha^(gamma+1)) / (1 - alpha), got {got:.10g}")
            raise diagnose(err, got, {
                "alpha^gamma instead of alpha^(gamma + 1): the bonus token left out of the count":
                    lambda: (1 - alpha ** gamma) / (1 - alpha),
                "gamma * alpha: only the accepted proposals counted, as if each were independent of the previous":
                    lambda: gamma * alpha,
                "the target's own token left out (expected accepted proposals, not tokens)":
                    lambda: (1 - alpha ** (gamma + 1)) / (1 - alpha) - 1,
            }, lambda g, cand: math.isclose(g, cand, rel_tol=1e-9)) from None
        want = analysis.speculative_speedup(alpha, gamma, verification_ratio=v, draft_cost=c)
        what = (f"speculative_speedup(alpha={alpha:.6g}, gamma={gamma}, verification_ratio={v:.6g}, "
                f"draft_cost={c:.6g})")
        got = _number(what, lambda: speedup_fn(alpha, gamma, verification_ratio=v, draft_cost=c), alpha, gamma)
        if not math.isclose(got, want, rel_tol=1e-9):
            err = ContractError(f"{what}: expected {want:.10g} = E / (gamma * draft_cost + verification_ratio), "
                                f"got {got:.10g}")
            raise diagnose(err, got, {
                "one draft step counted instead of gamma (E / (draft_cost + v))": lambda: want * (gamma * c + v) / (c + v),
                "the verification cost left out (E / (gamma * draft_cost))": lambda: want * (gamma * c + v) / (gamma * c),
                "the draft cost left out (E / v)": lambda: want * (gamma * c + v) / v,
            }, lambda g, cand: math.isclose(g, cand, rel_tol=1e-9)) from None


def _number(what: str, call: Callable, alpha: float, gamma: int) -> float:
    try:
        value = call()
    except ZeroDivisionError:
        err = ContractError(f"{what}: raised ZeroDivisionError")
        if alpha == 1:
            raise with_diagnosis(err, "the alpha = 1 limit not handled: (1 - alpha^(gamma+1)) / (1 - alpha) is 0/0 "
                                 "there; every proposal is accepted, so the value is gamma + 1", likely=False) from None
        raise err from None
    return check_real(what, value)


# -- the best block length ---------------------------------------------------------------------
#: The fixed cases every run of ``check_best_gamma`` starts with: (alpha, draft_cost, gammas, what it shows).
BEST_GAMMA_CASES = (
    (0.8, 0.1, (1, 2, 3, 4, 5, 6, 7, 8), "an interior optimum, gamma 6"),
    (0.0, 0.0, (2, 4, 1, 3), "a tie: every gamma gives 1.0"),
    (0.2, 0.3, (5, 3, 1, 8), "the shortest block"),
    (0.95, 0.01, (2, 8, 4, 6), "the longest block"),
    (1.0, 1.0, (4, 6, 2), "a tie: (gamma + 1) / (gamma + 1) = 1 for every gamma"),
)


def _best_by(key: Callable[[int], float], gammas, *, ties_to_largest: bool = False, in_order: bool = False):
    """(gamma, key(gamma)) maximising key over gammas: ascending, ties to the smallest (exact
    comparison), or to the largest, or to the first in the given order. For the diagnosis."""
    best, value = None, -math.inf
    for g in (list(gammas) if in_order else sorted(gammas)):
        v = key(g)
        if v > value or (ties_to_largest and v == value):
            best, value = g, v
    return best, value


def _best_gamma_variants(alpha: float, c: float, gammas) -> dict[str, Callable[[], tuple[int, float]]]:
    """What best_gamma returns with each known fault: (gamma, the speedup it reports)."""
    speedup = lambda g: analysis.speculative_speedup(alpha, g, draft_cost=c)
    tokens = lambda g: analysis.expected_tokens_per_step(alpha, g)
    no_bonus = lambda g: (1 - alpha ** g) / (1 - alpha) / (g * c + 1)
    return {
        "the expected tokens per iteration maximised, not the speedup: the draft's cost is left out, so the longest "
        "block always wins": lambda: _best_by(tokens, gammas),
        "the verification step's cost left out (E / (gamma * draft_cost)): one target step per iteration is paid "
        "whatever gamma is, and without it the shortest block looks best": lambda: _best_by(
            lambda g: tokens(g) / (g * c), gammas),
        "the largest gamma taken on a tie: equal speedups go to the smallest gamma": lambda: _best_by(
            speedup, gammas, ties_to_largest=True),
        "the first gamma in the given order taken on a tie, not the smallest: gammas may come in any order": lambda:
            _best_by(speedup, gammas, in_order=True),
        "speedups from expected tokens that count alpha^gamma instead of alpha^(gamma + 1) (the bonus token left "
        "out; see expected_tokens_per_step)": lambda: _best_by(no_bonus, gammas),
    }


def _best_gamma_draw(rng: random.Random) -> tuple[float, float, tuple[int, ...]]:
    """A random case whose best speedup is apart from the next distinct one (relative 1e-9), so float
    rounding in a learner's formula cannot decide it."""
    for _ in attempts("Lab 5"):
        alpha = round(rng.uniform(0.05, 0.98), 6)
        c = round(rng.choice([0.0, rng.uniform(0.01, 0.6)]), 6)
        gammas = tuple(rng.sample(range(1, 11), rng.randint(3, 8)))
        values = sorted((analysis.speculative_speedup(alpha, g, draft_cost=c) for g in gammas), reverse=True)
        if values[0] - values[1] > 1e-9 * values[0]:
            return alpha, c, gammas
    raise AssertionError("unreachable")


def check_best_gamma(fn: Callable, seed: int = 0, cases: int = 8) -> None:
    """Contract: fn(alpha, draft_cost, gammas) -> (gamma, speedup): the gamma among ``gammas`` (a list of
    ints >= 1, in any order) with the largest ``speculative_speedup(alpha, gamma, verification_ratio=1,
    draft_cost=draft_cost)``, and that speedup (a float, to a relative 1e-9); on a tie the smallest such
    gamma. Checked on the fixed cases ``BEST_GAMMA_CASES`` (an interior optimum, both ends, two ties),
    then ``cases`` drawn ones (alpha in [0.05, 0.98], draft_cost 0 or in [0.01, 0.6], 3 to 8 gammas of
    1 .. 10 shuffled, no near-tie). Reference: ``course_lib.speculative.analysis.best_gamma``.
    Source: Leviathan et al., 2023 (arXiv:2211.17192), Theorem 3.8 maximised over gamma;
    docs/speculative_decoding.md#the-best-gamma.
    """
    check_own_function("best_gamma", fn)
    rng = random.Random(seed)
    draws = [case[:3] for case in BEST_GAMMA_CASES] + [_best_gamma_draw(rng) for _ in range(cases)]
    for alpha, c, gammas in draws:
        what = f"best_gamma(alpha={alpha:g}, draft_cost={c:g}, gammas={list(gammas)})"
        result = call_on_copies(what, fn, alpha, c, list(gammas))
        if type(result) is not tuple or len(result) != 2:
            raise ContractError(f"{what}: must return a tuple (gamma, speedup), got {type(result).__qualname__}"
                                + (f" of length {len(result)}" if type(result) is tuple else ""))
        got_gamma, got_speedup = result
        if type(got_gamma) is not int or got_gamma not in gammas:
            raise ContractError(f"{what}: the gamma returned must be one of the given ints {sorted(gammas)}, got "
                                f"{got_gamma!r} ({type(got_gamma).__qualname__})")
        got_speedup = check_real(f"{what}: the speedup returned", got_speedup)
        want_gamma, want_speedup = analysis.best_gamma(alpha, c, gammas)
        table = ", ".join(f"{g}: {analysis.speculative_speedup(alpha, g, draft_cost=c):.6g}" for g in sorted(gammas))
        same = lambda got, cand: got[0] == cand[0] and math.isclose(got[1], cand[1], rel_tol=1e-9)
        if got_gamma != want_gamma:
            err = ContractError(f"{what}: returned gamma {got_gamma} (speedup {got_speedup:.10g}); the largest speedup "
                                f"is {want_speedup:.10g}, at gamma {want_gamma} (speedups by gamma: {table}; on a tie "
                                "the smallest gamma)")
            raise diagnose(err, (got_gamma, got_speedup), _best_gamma_variants(alpha, c, gammas),
                           lambda got, cand: got[0] == cand[0]) from None
        if not math.isclose(got_speedup, want_speedup, rel_tol=1e-9):
            err = ContractError(f"{what}: returned gamma {got_gamma}, right, but speedup {got_speedup:.10g}; "
                                f"speculative_speedup gives {want_speedup:.10g} there (E / (gamma * draft_cost + 1))")
            raise diagnose(err, (got_gamma, got_speedup), _best_gamma_variants(alpha, c, gammas), same) from None


# -- the lab's declared tables (see tables.py) -------------------------------------------------
_SAMPLING = ("course_lib.speculative.sampling.accept_or_resample", "course_lib.speculative.sampling.verify_block",
             "course_lib.speculative.sampling.trial_distribution")

CONTRACTS = (
    Contract("test_speculative_formulas", check_speculative_formulas,
             ("expected_tokens_per_step", "speculative_speedup"),
             references=("course_lib.speculative.analysis.expected_tokens_per_step",
                         "course_lib.speculative.analysis.speculative_speedup")),
    Contract("test_best_gamma", check_best_gamma, ("best_gamma",),
             references=("course_lib.speculative.analysis.best_gamma",)),
    Contract("test_greedy_speculative_step", check_greedy_speculative_step, ("greedy_speculative_step",),
             writes=Writes(args=(3, 4)),                                        # target_cache, draft_cache
             references=("course_lib.speculative.greedy.speculative_step",
                         "course_lib.speculative.greedy.generate_speculative",
                         "course_lib.speculative.drafts.ModelDraft.propose")),
    Contract("test_accept_or_resample", check_accept_or_resample, ("accept_or_resample",), references=_SAMPLING),
    Contract("test_sequence_distribution", check_sequence_distribution, ("accept_or_resample",),
             references=_SAMPLING),
)

_BEST_SPEEDUP = "        speedup = speculative_speedup(alpha, gamma, verification_ratio=1.0, draft_cost=draft_cost)\n"
_CROP = "    target_cache.crop(L + k)\n    draft_cache.crop(min(draft_cache.length, L + k))\n"
FAULTS = (
    Fault("expected_tokens_without_bonus",
          (Edit("expected_tokens_per_step", "(1 - alpha ** (gamma + 1)) / (1 - alpha)",
                "(1 - alpha ** gamma) / (1 - alpha)"),),
          {"test_speculative_formulas": r"alpha\^gamma instead of alpha\^\(gamma \+ 1\)",
           "test_best_gamma": r"alpha\^gamma instead of alpha\^\(gamma \+ 1\)"},
          "counts alpha^gamma, leaving the bonus token out of the expected tokens"),
    Fault("best_gamma_by_expected_tokens",
          (Edit("best_gamma", _BEST_SPEEDUP, "        speedup = expected_tokens_per_step(alpha, gamma)\n"),),
          {"test_best_gamma": "expected tokens per iteration maximised, not the speedup"},
          "ranks the gammas by expected tokens per iteration, leaving out the draft's cost: the longest block wins"),
    Fault("best_gamma_without_verification",
          (Edit("best_gamma", _BEST_SPEEDUP,
                "        speedup = expected_tokens_per_step(alpha, gamma) / (gamma * draft_cost)\n"),),
          {"test_best_gamma": "verification step's cost left out"},
          "divides the expected tokens by the draft steps alone, leaving out the verification step"),
    Fault("best_gamma_largest_on_tie",
          (Edit("best_gamma", "if speedup > best_speedup:", "if speedup >= best_speedup:"),),
          {"test_best_gamma": "largest gamma taken on a tie"},
          "keeps the last of equal speedups, so a tie goes to the largest gamma"),
    Fault("no_crop_after_rejection",
          (Edit("greedy_speculative_step", _CROP, ""),),
          {"test_greedy_speculative_step": "not cropped after a rejection"},
          "never crops the caches, so rejected proposals stay in them"),
    Fault("crop_off_by_one",
          (Edit("greedy_speculative_step", "    target_cache.crop(L + k)\n", "    target_cache.crop(L + k + 1)\n"),),
          {"test_greedy_speculative_step": "off by one"},
          "crops the target's cache to the committed length instead of one less"),
    Fault("bonus_token_dropped",
          (Edit("greedy_speculative_step", "emitted = proposals[:k] + [verdict[k]]",
                "emitted = proposals[:k] + ([verdict[k]] if k < gamma else [])"),),
          {"test_greedy_speculative_step": "bonus token dropped"},
          "emits nothing extra when every proposal is accepted"),
    Fault("bonus_from_draft",
          (Edit("greedy_speculative_step", "    emitted = proposals[:k] + [verdict[k]]\n",
                "    if k == gamma:   # the bonus from the draft: feed it the last proposal, take its prediction\n"
                "        logits = draft(torch.tensor([[proposals[-1]]]), torch.tensor([L + gamma - 1]), "
                "draft_cache)[0, -1]\n"
                "        emitted = proposals + [int(logits.argmax())]\n"
                "    else:\n"
                "        emitted = proposals[:k] + [verdict[k]]\n"),),
          {"test_greedy_speculative_step": "bonus token is not the target's"},
          "takes the bonus token after a full acceptance from the draft instead of the target's verification row"),
    Fault("draft_not_fed_missing_tokens",
          (Edit("greedy_speculative_step", "missing = tokens[draft_cache.length:]", "missing = tokens[-1:]"),),
          {"test_greedy_speculative_step": "not fed every committed token"},
          "feeds the draft only the newest committed token, though after a full acceptance it lacks two"),
    Fault("accepted_count_not_prefix",
          (Edit("greedy_speculative_step", "    while k < gamma and proposals[k] == verdict[k]:\n        k += 1\n",
                "    k = sum(p == v for p, v in zip(proposals, verdict))\n"),),
          {"test_greedy_speculative_step": "accepted past the first mismatch"},
          "counts every proposal the target agrees with, also after its first mismatch, instead of the matching prefix"),
    Fault("residual_not_renormalised",
          (Edit("accept_or_resample", "cdf = (residual / residual.sum(-1, keepdim=True)).cumsum(-1)",
                "cdf = residual.cumsum(-1)"),),
          {"test_accept_or_resample": "residual not renormalised",
           "test_sequence_distribution": "do not follow the target"},
          "samples max(0, p - q) by inverse CDF without dividing by its sum"),
    Fault("seed_ignored",
          (Edit("accept_or_resample", "gen = torch.Generator().manual_seed(seed)", "gen = None"),),
          {"test_accept_or_resample": r"must come from torch\.Generator\(\)\.manual_seed\(seed\) alone",
           "test_sequence_distribution": r"must come from torch\.Generator\(\)\.manual_seed\(seed\) alone"},
          "draws from torch's global generator (generator=None), so the same seed gives other tokens each call"),
    Fault("p_q_swapped",
          (Edit("accept_or_resample", "ratio = p[rows, x] / q[rows, x]", "ratio = q[rows, x] / p[rows, x]"),
           Edit("accept_or_resample", "residual = (p - q).clamp(min=0)", "residual = (q - p).clamp(min=0)")),
          {"test_accept_or_resample": "p and q swapped",
           "test_sequence_distribution": "do not follow the target"},
          "accepts with q(x)/p(x) and resamples from max(0, q - p)"),
)
check_tables(CONTRACTS, FAULTS)
