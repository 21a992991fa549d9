"""Speculative sampling (course Lab 5, docs/speculative_decoding.md#stochastic-acceptance and
#distribution-check): the emitted *sequence*, not one token, must follow the target.

The heart of this file is a whole-sequence test: an exact order-2 target (``MarkovLM``), a draft
that differs from it, every continuation of 3 or 4 tokens enumerated with its exact probability,
and a chi-square test of 60,000-100,000 speculative samples against them. A correct sampler
passes; each fault in the FAULTS table (in the acceptance step or in the loop around it) fails.
The significance level is ALPHA = 1e-3 and every seed is fixed, so the outcome is deterministic;
with a fresh seed a correct sampler would fail with probability ALPHA.
"""
from __future__ import annotations

import math

import pytest
import torch

from course_lib.speculative.exact import (MarkovLM, TokenCache, chi_square_test, continuation_probabilities,
                                          sample_speculative)
from course_lib.speculative.sampling import (acceptance_probability, accept_or_resample, emitted_distribution,
                                             sample_categorical, sampling_probs, total_variation,
                                             trial_distribution, verify_block, TRIAL_BLOCK_ELEMENTS)
from course_lib.validation import ArgumentTypeError

ALPHA = 1e-3  # significance level of every chi-square test here
Z_BOUND = 5.0  # a normal statistic beyond 5 sigma: probability below 6e-7 by chance
PROMPT = [1, 2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the tensors are ~100,000 x 6, as fast on one thread, and on a shared
    CPU (pytest-xdist workers on 2 cores) torch's thread pool waits on busy cores: measured 15x
    slower with two threads while another process ran."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    return MarkovLM.random(6, seed=0)


@pytest.fixture(scope="module")
def draft(target):
    return MarkovLM.perturbed(target, strength=0.5, seed=1)


class CountingVerify:
    """verify_block (or a faulty one) that records every call's n_accepted: the sampler's own
    statistics, recomputed (one call per iteration, on the rows still unfinished)."""

    def __init__(self, verify=verify_block):
        self.verify, self.n_accepted = verify, []

    def __call__(self, p, q, drafted, seed, accept):
        n_accepted, next_token = self.verify(p, q, drafted, seed, accept=accept)
        self.n_accepted.append(n_accepted)
        return n_accepted, next_token

    def histogram(self, gamma: int) -> list[int]:
        """[rejected at position 0, ..., rejected at gamma - 1, all gamma accepted]."""
        return torch.bincount(torch.cat(self.n_accepted), minlength=gamma + 1).tolist()

    def first_position(self) -> tuple[int, int]:
        """(accepted, trials) of the first proposal of each row-iteration: independent Bernoulli
        trials, unlike the later positions, which are tried only after an acceptance."""
        k = torch.cat(self.n_accepted)
        return int((k >= 1).sum()), k.numel()


# -- faults injected into the sampler, one table ------------------------------------------
class NoCropCache(TokenCache):
    """A cache whose rollback is forgotten: crop does nothing."""

    def crop(self, length, rows=None):
        pass


class NoRollback(MarkovLM):
    """A model whose state is never rolled back after a rejection (room for the stale tokens)."""

    def new_cache(self, batch=1, max_len=None):
        return NoCropCache(batch, 8 * (max_len or self.max_seq_len))


def bonus_from_last_draft_position(p, q, drafted, seed, accept):
    """The bonus token drawn from p[:, gamma - 1] (the distribution of the last proposal) instead
    of p[:, gamma] (the one after it)."""
    gamma = q.shape[1]
    return verify_block(torch.cat([p[:, :gamma], p[:, gamma - 1:gamma]], 1), q, drafted, seed, accept)


def residual_not_renormalised(p, q, x, seed):
    """accept_or_resample with the inverse CDF run on max(0, p - q) itself: a u above its mass
    lands on the last token."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.rand(x.shape[0], generator=generator, dtype=torch.float64)
    v = torch.rand(x.shape[0], generator=generator, dtype=torch.float64)
    accepted = u < p.gather(1, x[:, None])[:, 0] / q.gather(1, x[:, None])[:, 0]
    residual = (p - q).clamp_min(0)
    resampled = torch.searchsorted(residual.cumsum(1), v[:, None], right=True)[:, 0].clamp_max(p.shape[1] - 1)
    return torch.where(accepted, x, resampled), accepted


def p_and_q_swapped(p, q, x, seed):
    return accept_or_resample(q, p, x, seed)


def greedy_proposal(q, seed):
    """A greedy draft: argmax of q, while verify still gets the softmax q."""
    return q.argmax(-1)


# name -> (how the fault is injected into sample_speculative, gamma, n_tokens, n_samples).
# The bonus faults need n_tokens > gamma: an iteration starting at committed length L emits its
# bonus at L + gamma >= len(prompt) + gamma, so with n_tokens <= gamma no bonus token is ever
# among those kept, and that fault cannot show (measured: gamma 3, n_tokens 3 passes).
FAULTS = {
    "bonus token from p[:, gamma - 1]": (dict(verify=bonus_from_last_draft_position), 2, 3, 60_000),
    "bonus token from p[:, gamma - 1], gamma 3": (dict(verify=bonus_from_last_draft_position), 3, 4, 100_000),
    "residual not renormalised": (dict(accept=residual_not_renormalised), 2, 3, 60_000),
    "greedy draft scored with its softmax q": (dict(propose=greedy_proposal), 3, 3, 60_000),
    "p and q swapped": (dict(accept=p_and_q_swapped), 2, 3, 60_000),
    "target state not rolled back": (dict(target=NoRollback), 2, 3, 60_000),
    "target state not rolled back, gamma 3": (dict(target=NoRollback), 3, 4, 100_000),
}


def run(base_target, base_draft, gamma, n_tokens, n_samples, seed=0, **hooks):
    """Sample with the hooks of one fault (a class for the target or the draft, or sampler
    keywords); return (samples, CountingVerify)."""
    target = hooks.pop("target", MarkovLM)(base_target.probabilities)
    draft = hooks.pop("draft", MarkovLM)(base_draft.probabilities)
    counting = CountingVerify(hooks.pop("verify", verify_block))
    samples = sample_speculative(target, draft, PROMPT, n_tokens, gamma, n_samples, seed, verify=counting, **hooks)
    return samples, counting


# -- the whole-sequence distribution test --------------------------------------------------
@pytest.mark.parametrize("gamma, n_tokens, n_samples, temperature, top_k", [
    (2, 3, 60_000, 1.0, None),
    (3, 3, 60_000, 1.0, None),
    (3, 4, 100_000, 1.0, None),
    (2, 3, 60_000, 0.7, 4),
])
def test_speculative_samples_follow_the_target_sequence_distribution(target, draft, gamma, n_tokens, n_samples,
                                                                     temperature, top_k):
    probs = continuation_probabilities(target, PROMPT, n_tokens, temperature=temperature, top_k=top_k)
    samples, counting = run(target, draft, gamma, n_tokens, n_samples, temperature=temperature, top_k=top_k)
    assert samples.shape == (n_samples, n_tokens) and samples.dtype == torch.int64
    statistic, dof, p_value = chi_square_test(samples, probs)
    assert p_value >= ALPHA, f"chi2 {statistic:.1f} on {dof} dof, p = {p_value:.3g} < {ALPHA}"
    # the paths that make it hard did occur: rejections at every position, and bonus tokens
    histogram = counting.histogram(gamma)
    assert min(histogram) >= 1000, f"rejected at 0..gamma-1, all accepted: {histogram}"


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_sampler_fault_fails_the_sequence_distribution_test(target, draft, fault):
    hooks, gamma, n_tokens, n_samples = FAULTS[fault]
    probs = continuation_probabilities(target, PROMPT, n_tokens)
    samples, _ = run(target, draft, gamma, n_tokens, n_samples, **dict(hooks))
    statistic, dof, p_value = chi_square_test(samples, probs)
    assert p_value < ALPHA, f"{fault}: chi2 {statistic:.1f} on {dof} dof, p = {p_value:.3g} not below {ALPHA}"


@pytest.mark.parametrize("gamma, n_tokens, n_samples", [(2, 3, 60_000), (3, 4, 100_000)])
def test_a_draft_not_rolled_back_keeps_the_distribution_but_is_accepted_less(target, draft, gamma, n_tokens,
                                                                             n_samples):
    """The draft's state after a rejection still holds the rejected proposals, and the correction
    token never reaches it: its q is conditioned on the wrong context. Speculative sampling is
    exact for ANY q, as long as the ratio uses the q the proposal was drawn from, so the
    sequences still follow the target; what the fault costs is acceptance. Compared on the same
    seeds: the first proposal of each iteration (one Bernoulli trial per row-iteration) is
    accepted significantly less often (two-proportion z-test; the shared seeds correlate the two
    runs positively, which makes this z conservative) and fewer tokens come per iteration."""
    probs = continuation_probabilities(target, PROMPT, n_tokens)
    samples, stale = run(target, draft, gamma, n_tokens, n_samples, draft=NoRollback)
    statistic, dof, p_value = chi_square_test(samples, probs)
    assert p_value >= ALPHA, f"chi2 {statistic:.1f} on {dof} dof, p = {p_value:.3g} < {ALPHA}"

    _, correct = run(target, draft, gamma, n_tokens, n_samples)
    (a1, n1), (a2, n2) = correct.first_position(), stale.first_position()
    pooled = (a1 + a2) / (n1 + n2)
    z = (a1 / n1 - a2 / n2) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    assert z > Z_BOUND, f"first-position acceptance {a1 / n1:.4f} (rolled back) vs {a2 / n2:.4f}: z = {z:.1f}"
    tokens_per_iteration = [float((torch.cat(c.n_accepted) + 1).double().mean()) for c in (correct, stale)]
    assert tokens_per_iteration[1] < tokens_per_iteration[0]


def test_sampler_calls_accept_once_per_position_per_iteration_on_all_rows(target, draft):
    calls = []

    def counting_accept(p, q, x, seed):
        calls.append(x.shape[0])
        return accept_or_resample(p, q, x, seed)

    counting = CountingVerify()
    gamma, n_tokens, n_samples = 3, 4, 5000
    sample_speculative(target, draft, PROMPT, n_tokens, gamma, n_samples, 0, accept=counting_accept, verify=counting)
    iterations = len(counting.n_accepted)
    assert iterations <= n_tokens and len(calls) <= gamma * iterations
    assert calls[0] == n_samples  # the first position of the first iteration: every row in one call


def test_temperature_zero_is_greedy_decoding_of_the_target(target, draft):
    samples = sample_speculative(target, draft, PROMPT, 6, 3, 4, 0, temperature=0)
    greedy = continuation_probabilities(target, PROMPT, 6, temperature=0)
    assert float(greedy.max()) == 1.0
    index = int(greedy.argmax())
    expected = [(index // 6 ** (5 - j)) % 6 for j in range(6)]
    assert samples.tolist() == [expected] * 4


def test_sampler_is_reproducible_from_its_seed(target, draft):
    a = sample_speculative(target, draft, PROMPT, 4, 2, 100, 5)
    assert torch.equal(a, sample_speculative(target, draft, PROMPT, 4, 2, 100, 5))
    assert not torch.equal(a, sample_speculative(target, draft, PROMPT, 4, 2, 100, 6))


def test_gamma_zero_and_a_one_token_prompt_sample_the_target(target, draft):
    probs = continuation_probabilities(target, [3], 3)
    _, _, p_value = chi_square_test(sample_speculative(target, draft, [3], 3, 0, 30_000, 1), probs)
    assert p_value >= ALPHA
    _, _, p_value = chi_square_test(sample_speculative(target, draft, [3], 3, 2, 30_000, 2), probs)
    assert p_value >= ALPHA


# -- one acceptance step -------------------------------------------------------------------
def test_sampling_probs_temperature_and_top_k():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 3.0]])
    assert sampling_probs(logits).dtype == torch.float64
    torch.testing.assert_close(sampling_probs(logits), torch.softmax(logits.double(), -1), rtol=0, atol=1e-15)
    torch.testing.assert_close(sampling_probs(logits, 2.0), torch.softmax(logits.double() / 2, -1),
                               rtol=0, atol=1e-15)
    top2 = sampling_probs(logits, top_k=2)
    assert (top2[0, 2:] == 0).all() and (top2[1, :] > 0).all()  # row 1: the three tied 0.5s all stay
    torch.testing.assert_close(top2[0, :2], torch.softmax(logits[0, :2].double(), -1), rtol=0, atol=1e-15)
    torch.testing.assert_close(top2.sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-15)
    # temperature 0: one-hot argmax; among ties the first index
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert sampling_probs(ties, 0).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert sampling_probs(logits, 0, top_k=1).tolist() == [[1.0, 0, 0, 0], [0, 0, 0, 1.0]]
    # tied logits at temperature 1: equal probabilities; -inf: never drawn; batch dimensions kept
    assert sampling_probs(torch.tensor([1.0, 1.0, float("-inf")])).tolist() == [0.5, 0.5, 0.0]
    assert sampling_probs(torch.zeros(2, 3, 5), 0.5, top_k=5).shape == (2, 3, 5)


def test_sampling_probs_refuses_bad_arguments():
    with pytest.raises(ValueError, match="temperature"):
        sampling_probs(torch.zeros(3), -1.0)
    with pytest.raises(ValueError, match="top_k"):
        sampling_probs(torch.zeros(3), top_k=4)
    with pytest.raises(ValueError, match="NaN"):
        sampling_probs(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="only -inf"):
        sampling_probs(torch.full((3,), float("-inf")))
    with pytest.raises(ArgumentTypeError):
        sampling_probs(torch.zeros(3, dtype=torch.int64))


def _pair(V=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    p = torch.distributions.Dirichlet(torch.ones(V, dtype=torch.float64)).sample()
    logits = torch.randn(V, generator=generator, dtype=torch.float64)
    q = 0.5 * p + 0.5 * torch.softmax(logits, 0)
    return p, q


def test_accept_or_resample_on_200000_trials_of_one_pair():
    torch.manual_seed(0)
    p, q = _pair()
    N, V = 200_000, p.shape[0]
    P, Q = p.expand(N, V), q.expand(N, V)
    x = sample_categorical(Q, seed=1)
    tokens, accepted = accept_or_resample(P, Q, x, seed=2)
    assert tokens.dtype == torch.int64 and accepted.dtype == torch.bool
    assert torch.equal(tokens[accepted], x[accepted])
    a = acceptance_probability(p, q)
    assert a == pytest.approx(1 - total_variation(p, q), abs=1e-15)
    z = (float(accepted.double().mean()) - a) / math.sqrt(a * (1 - a) / N)
    assert abs(z) < Z_BOUND, f"acceptance {float(accepted.double().mean()):.5f} vs sum min(p, q) {a:.5f}: z = {z:.2f}"
    empirical = torch.bincount(tokens, minlength=V).double() / N
    assert total_variation(empirical, p) < 0.05 * total_variation(q, p)
    _, _, p_value = chi_square_test(tokens[:, None], p)
    assert p_value >= ALPHA


def test_accept_or_resample_never_draws_a_token_of_zero_residual():
    # residual mass only on tokens 0 and 1: a u near 1 must not spill onto tokens 2..4
    p = torch.tensor([[0.3, 0.3, 0.4, 0.0, 0.0]], dtype=torch.float64).expand(50_000, 5)
    q = torch.tensor([[0.1, 0.1, 0.6, 0.1, 0.1]], dtype=torch.float64).expand(50_000, 5)
    tokens, accepted = accept_or_resample(p, q, torch.full((50_000,), 3), seed=0)
    assert not accepted.any() and set(tokens.tolist()) == {0, 1}
    # p == q: every proposal is accepted (the all-zero residual falls back to p)
    tokens, accepted = accept_or_resample(q, q, torch.full((50_000,), 3), seed=0)
    assert accepted.all()


@pytest.mark.parametrize("seed", range(5))
def test_emitted_distribution_is_p_in_float64(seed):
    generator = torch.Generator().manual_seed(seed)
    V = 50
    p = torch.softmax(3 * torch.randn(4, V, generator=generator, dtype=torch.float64), -1)
    q = torch.softmax(3 * torch.randn(4, V, generator=generator, dtype=torch.float64), -1)
    p[0, :10] = 0  # p zero where q is not
    q[1, 10:20] = 0  # q zero where p is not
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    q[2] = p[2]  # p == q: the residual is empty
    out = emitted_distribution(p, q)
    assert out.dtype == torch.float64
    assert float((out - p).abs().max()) < 1e-12


def test_trial_distribution_on_a_49152_token_vocabulary():
    """200,000 trials on V = 49,152 (SmolLM2's vocabulary): an (n_trials, V) float64 matrix would
    be 78.6 GB, more than this machine has, so finishing at all shows it is never built."""
    V, n = 49_152, 200_000
    generator = torch.Generator().manual_seed(0)
    ranks = torch.arange(1, V + 1, dtype=torch.float64)
    p = (ranks ** -1.1)[torch.randperm(V, generator=generator)]
    q = 0.6 * p / p.sum() + 0.4 * (ranks ** -1.1)[torch.randperm(V, generator=generator)] / p.sum()
    p, q = p / p.sum(), q / q.sum()
    counts, accepted = trial_distribution(p, q, n, seed=3)
    assert counts.shape == (V,) and counts.dtype == torch.int64 and int(counts.sum()) == n
    a = acceptance_probability(p, q)
    assert abs(accepted / n - a) < Z_BOUND * math.sqrt(a * (1 - a) / n)
    tokens = torch.repeat_interleave(torch.arange(V), counts)
    _, _, p_value = chi_square_test(tokens[:, None], p)
    assert p_value >= ALPHA


def test_trial_distribution_gives_a_learners_accept_the_top_k_support_in_few_calls():
    V, n, k = 49_152, 200_000, 40
    generator = torch.Generator().manual_seed(1)
    target_logits = torch.randn(V, generator=generator, dtype=torch.float64) * 3
    draft_logits = target_logits + torch.randn(V, generator=generator, dtype=torch.float64)
    p, q = sampling_probs(target_logits, top_k=k), sampling_probs(draft_logits, top_k=k)
    shapes = []

    def learners_accept(p_rows, q_rows, x, seed):
        shapes.append(tuple(p_rows.shape))
        return accept_or_resample(p_rows, q_rows, x, seed)

    counts, accepted = trial_distribution(p, q, n, seed=4, accept=learners_accept)
    support = int(((p > 0) | (q > 0)).sum())
    assert all(shape[1] == support <= 2 * k for shape in shapes)  # the union of the two top-k sets
    assert len(shapes) == math.ceil(n / (TRIAL_BLOCK_ELEMENTS // support)) <= 5  # one call per block
    assert int(counts.sum()) == n and int(counts[(p == 0)].sum()) == 0
    a = acceptance_probability(p, q)
    assert abs(accepted / n - a) < Z_BOUND * math.sqrt(a * (1 - a) / n)
    assert total_variation(counts.double() / n, p) < 0.05 * total_variation(q, p)


def test_verify_block_counts_and_bonus():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]], dtype=torch.float64).repeat(3, 1, 1)
    q = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]]], dtype=torch.float64).repeat(3, 1, 1)
    drafted = torch.tensor([[0, 1], [1, 1], [0, 1]])
    n_accepted, next_token = verify_block(p, q, drafted, seed=0)
    assert n_accepted.tolist() == [2, 2, 2] and next_token.tolist() == [2, 2, 2]  # q == p: bonus from p[:, 2]
    q2 = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]], dtype=torch.float64).repeat(3, 1, 1)
    p2 = p.clone()
    p2[:, 0] = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    n_accepted, next_token = verify_block(p2, q2, torch.ones(3, 2, dtype=torch.int64), seed=0)
    assert n_accepted.tolist() == [0, 0, 0] and next_token.tolist() == [0, 0, 0]  # rejected, residual is token 0


# -- validation ----------------------------------------------------------------------------
def test_accept_or_resample_validates_its_arguments():
    p = torch.full((3, 4), 0.25, dtype=torch.float64)
    x = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="same shape"):
        accept_or_resample(p, p[:, :3] / 0.75, x, 0)
    with pytest.raises(ValueError, match=r"\(N, V\)"):
        accept_or_resample(p[0], p[0], x, 0)
    bad = p.clone()
    bad[2, 0] = 0.5
    with pytest.raises(ValueError, match=r"p\[2\] sums to 1\.25"):
        accept_or_resample(bad, p, x, 0)
    bad = p.clone()
    bad[1] = torch.tensor([1.5, -0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"q\[1\] has a negative entry"):
        accept_or_resample(p, bad, x, 0)
    with pytest.raises(ValueError, match="x must hold values"):
        accept_or_resample(p, p, torch.tensor([0, 4, 1]), 0)
    with pytest.raises(ArgumentTypeError, match="int64"):
        accept_or_resample(p, p, x.to(torch.int32), 0)
    with pytest.raises(ValueError, match="one proposal per row"):
        accept_or_resample(p, p, x[:2], 0)
    q = p.clone()
    q[1] = torch.tensor([0.0, 0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match=r"q\[1, x\[1\]\].*could not have proposed"):
        accept_or_resample(p, q, x, 0)
    with pytest.raises(ArgumentTypeError, match="seed"):
        accept_or_resample(p, p, x, 1.0)


def test_verify_block_validates_shapes_and_what_accept_returns():
    p = torch.full((2, 3, 4), 0.25, dtype=torch.float64)
    q = torch.full((2, 2, 4), 0.25, dtype=torch.float64)
    drafted = torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"q must have shape \(N, gamma, V\)"):
        verify_block(p, q[:, :1], drafted, 0)
    with pytest.raises(ValueError, match="drafted must have shape"):
        verify_block(p, q, drafted[:, :1], 0)
    with pytest.raises(ValueError, match="accepted but returned token"):
        verify_block(p, q, drafted, 0, accept=lambda p, q, x, s: (x + 1, torch.ones_like(x, dtype=torch.bool)))
    with pytest.raises(ArgumentTypeError, match="bool"):
        verify_block(p, q, drafted, 0, accept=lambda p, q, x, s: (x, torch.ones_like(x)))


def test_chi_square_test_p_value_pooling_and_impossible_samples():
    # three cells, dof 2: the chi-square survival function is exp(-x / 2)
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    samples = torch.tensor([0] * 40 + [1] * 40 + [2] * 20)[:, None]
    statistic, dof, p_value = chi_square_test(samples, probs)
    expected = (40 - 50) ** 2 / 50 + (40 - 30) ** 2 / 30 + 0
    assert dof == 2 and statistic == pytest.approx(expected) and p_value == pytest.approx(math.exp(-expected / 2))
    # cells expecting < 5 are pooled: 0.02 and 0.03 of 100 samples expect 2 and 3, one cell of 5
    probs = torch.tensor([0.5, 0.45, 0.02, 0.03], dtype=torch.float64)
    samples = torch.tensor([0] * 50 + [1] * 45 + [2] * 2 + [3] * 3)[:, None]
    assert chi_square_test(samples, probs)[:2] == (0.0, 2)
    # a sample the model cannot produce
    assert chi_square_test(torch.tensor([[0], [3]]), torch.tensor([0.5, 0.5, 0.0, 0.0]))[2] == 0.0
    with pytest.raises(ValueError, match="V \\*\\* n"):
        chi_square_test(torch.zeros(5, 2, dtype=torch.int64), torch.full((5,), 0.2))


def test_sample_speculative_validates_its_arguments(target, draft):
    with pytest.raises(ValueError, match="vocab_size"):
        sample_speculative(target, MarkovLM.random(5), PROMPT, 3, 2, 10, 0)
    with pytest.raises(ValueError, match="at least one token"):
        sample_speculative(target, draft, [], 3, 2, 10, 0)
    with pytest.raises(ValueError, match="prompt"):
        sample_speculative(target, draft, [6], 3, 2, 10, 0)
    with pytest.raises(ArgumentTypeError, match="accept must be callable"):
        sample_speculative(target, draft, PROMPT, 3, 2, 10, 0, accept=None)


# -- the exact model -----------------------------------------------------------------------
def test_markov_lm_forward_with_and_without_cache_gives_the_same_log_probs(target):
    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [0, 0, 1, 1, 2, 2]])
    full = target(ids, torch.arange(6))
    assert full.shape == (2, 6, 6) and full.dtype == torch.float32
    cache = target.new_cache(2, 8)
    prefix = target(ids[:, :4], torch.arange(4), cache)
    step = target(ids[:, 4:5], torch.arange(4, 5), cache.clone())  # a clone: the cache itself stays at 4
    rest = target(ids[:, 4:], torch.arange(4, 6), cache, last_only=True)
    assert cache.length == 6 and rest.shape == (2, 1, 6)
    torch.testing.assert_close(torch.cat([prefix, step, rest], 1), full, rtol=0, atol=0)
    # crop back and take another branch: as if the cache had never held the old one
    cache.crop(3)
    branch = target(torch.tensor([[5], [5]]), torch.tensor([3]), cache)
    fresh = target(torch.cat([ids[:, :3], torch.tensor([[5], [5]])], 1), torch.arange(4))
    torch.testing.assert_close(branch[:, 0], fresh[:, 3], rtol=0, atol=0)
    # a log-probability row is a distribution, the one next_probs gives
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(2, 6))
    torch.testing.assert_close(full[:, 2].double().exp(), target.next_probs(ids, torch.tensor([3, 3])),
                               rtol=1e-6, atol=1e-7)


def test_markov_lm_checks_positions_ids_and_cache(target):
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ArgumentTypeError, match="positions"):
        target(ids, torch.arange(3.0))
    with pytest.raises(ValueError, match="positions has 2 entries"):
        target(ids, torch.arange(2))
    with pytest.raises(ValueError, match="positions must hold values"):
        target(ids, torch.tensor([4094, 4095, 4096]))
    with pytest.raises(ValueError, match="input_ids must hold values"):
        target(torch.tensor([[6]]), torch.arange(1))
    with pytest.raises(ValueError, match="TokenCache overflow"):
        target(ids, torch.arange(3), target.new_cache(1, 2))
    with pytest.raises(ValueError, match="cache batch"):
        target(ids, torch.arange(3), target.new_cache(2, 8))


def test_token_cache_per_row_lengths_crop_and_clone():
    cache = TokenCache(3, 6)
    cache.extend(torch.tensor([[1, 2, 3], [4, 5, 0], [1, 1, 1]]), counts=torch.tensor([3, 2, 0]))
    assert cache.lengths.tolist() == [3, 2, 0] and cache.tokens[0, :3].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="different lengths"):
        cache.length
    twin = cache.clone()
    cache.crop(torch.tensor([1, 0]), rows=torch.tensor([0, 1]))
    assert cache.lengths.tolist() == [1, 0, 0] and twin.lengths.tolist() == [3, 2, 0]
    with pytest.raises(ValueError, match="at most"):
        cache.crop(torch.tensor([2]), rows=torch.tensor([0]))
    with pytest.raises(ValueError, match="at most the filled slots"):
        twin.crop(1)
    cache.crop(0)
    assert cache.length == 0


def test_markov_lm_refuses_a_table_that_is_not_distributions():
    table = MarkovLM.random(5).probabilities.clone()
    table[5, 5, 0] += 0.1
    with pytest.raises(ValueError, match=r"probabilities\[5, 5\]"):
        MarkovLM(table)
    with pytest.raises(ValueError, match=r"\(V \+ 1, V \+ 1, V\)"):
        MarkovLM(table[:, :, :4])


def test_perturbed_draft_differs_but_overlaps(target, draft):
    a = acceptance_probability(target.probabilities, draft.probabilities)
    assert 0.5 < float(a.min()) and float(a.max()) < 1
    assert torch.equal(MarkovLM.perturbed(target, 0.0).probabilities, target.probabilities)


def test_continuation_probabilities_sum_to_one_and_match_products_of_next_probs(target):
    V, n = 6, 3
    probs = continuation_probabilities(target, PROMPT, n)
    assert probs.shape == (V ** n,) and probs.dtype == torch.float64
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
    table = target.probabilities
    for index in (0, 1, 17, 100, 215):
        c = [(index // V ** (n - 1 - j)) % V for j in range(n)]
        seq = PROMPT + c
        by_hand = float(table[seq[0], seq[1], seq[2]] * table[seq[1], seq[2], seq[3]] * table[seq[2], seq[3], seq[4]])
        assert float(probs[index]) == pytest.approx(by_hand, rel=1e-12)
    # all of them at once through forward (float32 log-probs)
    grid = torch.cartesian_prod(*[torch.arange(V)] * n)
    ids = torch.cat([torch.tensor(PROMPT).expand(V ** n, 2), grid], 1)
    logp = target(ids, torch.arange(ids.shape[1])).double()
    per_token = logp[:, 1:-1].gather(2, ids[:, 2:, None]).squeeze(2)
    torch.testing.assert_close(per_token.sum(1).exp(), probs, rtol=1e-5, atol=1e-9)
    # a one-token prompt reads the start state: the first token's distribution is table[V, prompt]
    assert torch.allclose(continuation_probabilities(target, [4], 1), table[V, 4])
