"""Lab 5's checkers beyond the tables (tests/test_lab_tables.py runs lab05.FAULTS): wrong answers from a
hostile review that the checkers must refuse, and correct variants they must accept."""
import pytest
import torch

import solutions
from course_lib.grading import ContractError, lab05

LAB = "05_speculative_decoding"
ref = solutions.solution_functions(LAB)


def _row0(p, q, x, seed):
    """Every row uses row 0's distributions (wrong unless all rows share one pair)."""
    n = p.shape[0]
    return ref.accept_or_resample(p[:1].expand(n, -1).clone(), q[:1].expand(n, -1).clone(), x, seed)


def _fixed_seed(p, q, x, seed):
    return ref.accept_or_resample(p, q, x, 12345)


def _stratified(p, q, x, seed):
    """No randomness at all: low-discrepancy 'uniforms' (evenly spread counts pass a one-sided chi-square)."""
    n, V = p.shape
    rows = torch.arange(n)
    u = (rows * 0.6180339887498949) % 1
    accepted = u < p[rows, x] / q[rows, x]
    residual = (p - q).clamp(min=0)
    residual[residual.sum(-1) == 0] = p[residual.sum(-1) == 0]
    cdf = (residual / residual.sum(-1, keepdim=True)).cumsum(-1)
    v = ((rows * 0.7548776662466927) % 1).double()[:, None]
    return torch.where(accepted, x, torch.searchsorted(cdf, v).squeeze(-1).clamp(max=V - 1)), accepted


@pytest.mark.parametrize("wrong", [_row0, _fixed_seed, _stratified])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accept_or_resample_refuses_what_ignores_its_rows_or_its_seed(wrong, seed):
    with pytest.raises(ContractError):
        lab05.check_accept_or_resample(wrong, seed=seed)


def test_accept_or_resample_accepts_multinomial_and_the_global_generator():
    def multinomial(p, q, x, seed):
        torch.manual_seed(seed)
        rows = torch.arange(len(x))
        accepted = torch.rand(len(x), dtype=torch.float64) <= p[rows, x] / q[rows, x]
        residual = (p - q).clamp(min=0) + 1e-300 * (p > 0)
        return torch.where(accepted, x, torch.multinomial(residual, 1).squeeze(-1)), accepted

    for seed in (0, 1):
        lab05.check_accept_or_resample(multinomial, seed=seed)
        lab05.check_sequence_distribution(multinomial, seed=seed)


def test_formulas_refuse_an_alpha_one_limit_taken_too_early():
    def near_one(alpha, gamma):
        return float(gamma + 1) if alpha > 0.999 else ref.expected_tokens_per_step(alpha, gamma)

    with pytest.raises(ContractError, match="0.9999"):
        lab05.check_speculative_formulas(near_one, ref.speculative_speedup, seed=0)


def test_greedy_step_accepts_a_full_recompute_and_refuses_a_step_that_ignores_the_draft():
    @torch.no_grad()
    def recompute(target, draft, tokens, target_cache, draft_cache, gamma):
        """Throws both caches away and refills the target's from scratch: wasteful, but the contract holds."""
        target_cache.crop(0)
        draft_cache.crop(0)
        if len(tokens) > 1:
            target(torch.tensor([tokens[:-1]]), torch.arange(len(tokens) - 1), target_cache)
        return ref.greedy_speculative_step(target, draft, tokens, target_cache, draft_cache, gamma)

    @torch.no_grad()
    def no_draft(target, draft, tokens, target_cache, draft_cache, gamma):
        return ref.greedy_speculative_step(target, target, tokens, target_cache, draft_cache, gamma)

    lab05.check_greedy_speculative_step(recompute, seed=0)
    with pytest.raises(ContractError):
        lab05.check_greedy_speculative_step(no_draft, seed=0)
