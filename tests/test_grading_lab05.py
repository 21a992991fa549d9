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


def _unseeded(p, q, x, seed):
    """Ignores its seed: draws one from torch's global generator, so each call draws anew."""
    return ref.accept_or_resample(p, q, x, int(torch.randint(0, 2 ** 31, ())))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_step_that_ignores_its_seed_fails_both_checks(seed):
    """Same seed, other draws: the distributions are right, the contract (draws from the seed alone) is not."""
    alone = r"same seed .* gave different tokens .* must come from torch\.Generator\(\)\.manual_seed\(seed\) alone"
    with pytest.raises(ContractError, match=alone):
        lab05.check_accept_or_resample(_unseeded, seed=seed)
    with pytest.raises(ContractError, match=alone):
        lab05.check_sequence_distribution(_unseeded, seed=seed)


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


@torch.no_grad()
def _feeds_last_proposal(target, draft, tokens, target_cache, draft_cache, gamma):
    """The natural proposal loop: the draft is fed every proposal, the last one too, so after a full
    acceptance its cache holds one committed token more than the reference's (still <= L' - 1)."""
    L = len(tokens)
    missing = tokens[draft_cache.length:]
    logits = draft(torch.tensor([missing]), torch.arange(L - len(missing), L), draft_cache)[0, -1]
    proposals = []
    for i in range(gamma):
        proposals.append(int(logits.argmax()))
        logits = draft(torch.tensor([[proposals[-1]]]), torch.tensor([L + i]), draft_cache)[0, -1]
    verdict = target(torch.tensor([[tokens[-1]] + proposals]), torch.arange(L - 1, L + gamma),
                     target_cache)[0].argmax(-1).tolist()
    k = 0
    while k < gamma and proposals[k] == verdict[k]:
        k += 1
    target_cache.crop(L + k)
    draft_cache.crop(min(draft_cache.length, L + k))
    return proposals[:k] + [verdict[k]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_step_accepts_a_draft_fed_its_last_proposal(seed):
    lab05.check_greedy_speculative_step(_feeds_last_proposal, seed=seed)


def test_greedy_step_refuses_a_draft_slot_that_is_not_the_committed_tokens():
    @torch.no_grad()
    def last_slot_wrong(target, draft, tokens, target_cache, draft_cache, gamma):
        emitted = _feeds_last_proposal(target, draft, tokens, target_cache, draft_cache, gamma)
        if draft_cache.length == len(tokens) + len(emitted) - 1:          # holds the extra slot: spoil it
            draft_cache.k[:, :, :, draft_cache.length - 1] += 1.0
        return emitted

    with pytest.raises(ContractError, match="draft_cache slot"):
        lab05.check_greedy_speculative_step(last_slot_wrong, seed=0)


def test_the_visible_greedy_check_catches_a_draft_cache_never_cropped():
    """The visible case drafts 3 to 5 tokens with rejections before the last one, so a draft cache
    that keeps rejected proposals fails it (not only the hidden tests)."""
    from course_lib.grading.tables import Edit

    namespace = solutions.solution_namespace(LAB, (Edit(
        "greedy_speculative_step", "    draft_cache.crop(min(draft_cache.length, L + k))\n", ""),))
    with pytest.raises(ContractError, match="not cropped after a rejection"):
        lab05.check_greedy_speculative_step(namespace["greedy_speculative_step"], seed=0)


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


def _edited(*edits):
    from course_lib.grading.tables import Edit

    return solutions.solution_namespace(LAB, tuple(Edit(*edit) for edit in edits))


def test_the_alpha_one_limit_taken_as_gamma_is_named():
    """At alpha = 1, gamma equals gamma * alpha: the diagnosis names the limit, not the product."""
    namespace = _edited(("expected_tokens_per_step", "return float(gamma + 1)", "return float(gamma)"))
    with pytest.raises(ContractError, match="alpha = 1 limit taken as gamma") as caught:
        lab05.check_speculative_formulas(namespace["expected_tokens_per_step"], namespace["speculative_speedup"])
    assert "gamma * alpha" not in str(caught.value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_draft_crop_without_min_is_named_as_the_drafts(seed):
    """After a full acceptance the draft holds L + gamma - 1 slots, so crop(L + k) raises in the draft's
    crop; the diagnosis is about the draft's cache, not the target's crop off by one."""
    namespace = _edited(("greedy_speculative_step", "draft_cache.crop(min(draft_cache.length, L + k))",
                         "draft_cache.crop(L + k)"))
    with pytest.raises(ContractError, match=r"crop it to min\(draft_cache\.length, L \+ k\)") as caught:
        lab05.check_greedy_speculative_step(namespace["greedy_speculative_step"], seed=seed)
    assert "crop off by one" not in str(caught.value)


@pytest.mark.parametrize("seed", range(12))
def test_a_draft_never_cropped_and_one_cropped_to_the_committed_length_are_told_apart(seed):
    """Every drawn case first fails them where they leave different caches (``_telling_iterations``)."""
    never = _edited(("greedy_speculative_step", "    draft_cache.crop(min(draft_cache.length, L + k))\n", ""))
    with pytest.raises(ContractError, match="not cropped after a rejection") as caught:
        lab05.check_greedy_speculative_step(never["greedy_speculative_step"], seed=seed)
    assert "off by one" not in str(caught.value)
    one_more = _edited(("greedy_speculative_step", "draft_cache.crop(min(draft_cache.length, L + k))",
                        "draft_cache.crop(min(draft_cache.length, L + k + 1))"))
    with pytest.raises(ContractError, match="crop off by one: the draft's cache"):
        lab05.check_greedy_speculative_step(one_more["greedy_speculative_step"], seed=seed)


@pytest.mark.parametrize("seed", range(6))
def test_a_bonus_token_that_is_not_the_targets_always_fails(seed):
    """The stale draft logits (the last proposal again) and the draft's own next token: every drawn
    case holds a full acceptance where the draft's next token is not the target's."""
    stale = _edited(("greedy_speculative_step", "    emitted = proposals[:k] + [verdict[k]]\n",
                     "    emitted = proposals[:k] + [verdict[k] if k < gamma else int(logits.argmax())]\n"))
    with pytest.raises(ContractError, match="bonus token is not the target's"):
        lab05.check_greedy_speculative_step(stale["greedy_speculative_step"], seed=seed)
    draft_bonus = solutions.solution_namespace(LAB, next(f for f in lab05.FAULTS if f.name == "bonus_from_draft").edits)
    with pytest.raises(ContractError, match="it is the draft's prediction after the last proposal"):
        lab05.check_greedy_speculative_step(draft_bonus["greedy_speculative_step"], seed=seed)


# -- best_gamma -------------------------------------------------------------------------------
def _speedup(alpha, gamma, c):
    return sum(alpha ** i for i in range(gamma + 1)) / (gamma * c + 1)      # E as a sum of powers


def _best_by_max(alpha, draft_cost, gammas):
    """Correct, written another way: max over (speedup, -gamma), E summed term by term."""
    value, negative = max((_speedup(alpha, g, draft_cost), -g) for g in gammas)
    return -negative, value


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_gamma_accepts_another_correct_argmax(seed):
    lab05.check_best_gamma(_best_by_max, seed=seed, cases=20)


def test_best_gamma_names_a_tie_taken_in_the_given_order():
    def first_listed(alpha, draft_cost, gammas):
        best, value = None, -1.0
        for g in gammas:                                                 # not sorted: a tie keeps the first listed
            if _speedup(alpha, g, draft_cost) > value:
                best, value = g, _speedup(alpha, g, draft_cost)
        return best, value
    with pytest.raises(ContractError, match="first gamma in the given order taken on a tie"):
        lab05.check_best_gamma(first_listed, seed=0)


@pytest.mark.parametrize("wrong, message", [
    (lambda a, c, gs: (float(_best_by_max(a, c, gs)[0]), _best_by_max(a, c, gs)[1]), "must be one of the given ints"),
    (lambda a, c, gs: _best_by_max(a, c, gs)[0], "must return a tuple"),
    (lambda a, c, gs: list(_best_by_max(a, c, gs)), "must return a tuple"),
    (lambda a, c, gs: (_best_by_max(a, c, gs)[0], 1.0), "right, but speedup"),
    (lambda a, c, gs: (max(gs), _speedup(a, max(gs), c)), "expected tokens per iteration maximised"),
])
def test_best_gamma_refuses_wrong_types_and_values(wrong, message):
    with pytest.raises(ContractError, match=message):
        lab05.check_best_gamma(wrong, seed=0)


def test_best_gamma_fixed_cases_cover_an_interior_optimum_both_ends_and_ties():
    from course_lib.speculative.analysis import best_gamma
    found = [best_gamma(a, c, gs)[0] for a, c, gs, _ in lab05.BEST_GAMMA_CASES]
    ends = [(min(gs), max(gs)) for _, _, gs, _ in lab05.BEST_GAMMA_CASES]
    assert min(ends[0]) < found[0] < max(ends[0])                       # interior
    assert found[2] == ends[2][0] and found[3] == ends[3][1]            # the shortest, the longest
    for case in (1, 4):                                                 # ties: every gamma gives the same speedup
        a, c, gs, _ = lab05.BEST_GAMMA_CASES[case]
        assert len({_speedup(a, g, c) for g in gs}) == 1 and found[case] == min(gs)
