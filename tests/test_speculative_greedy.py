"""Greedy speculative decoding (course_lib.speculative: drafts, greedy, costs, bench, break_even_alpha):
the tokens are exactly the target's greedy ones whatever the draft, the two caches keep the
convention of docs/speculative_decoding.md#cache-rollback after every iteration, and crop
restores K/V bit for bit. Toy decoders only, except the one slow test on SmolLM2-135M."""
import math

import numpy as np
import pytest
import torch

from course_lib.models.config import toy_config
from course_lib.models.decoder import Decoder, generate_cached, toy_decoder
from course_lib.speculative import (Draft, ModelDraft, PromptLookupDraft, SpeculativeStats, StepCosts, StepResult,
                                    best_gamma, break_even_alpha, check_same_vocabulary, generate_speculative,
                                    measure_step_costs, speculative_step, truncated_draft)
from course_lib.speculative.bench import compare

N_NEW = 24


@pytest.fixture(scope="module")
def target():
    return toy_decoder(0)


def random_prompt(length: int, seed: int, vocab: int = 512) -> torch.Tensor:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


PROMPTS = {"one token": random_prompt(1, 1), "short": random_prompt(5, 2), "longer": random_prompt(17, 3)}


class ScriptedDraft:
    """A draft that proposes the tokens it is given and records its rollbacks."""

    def __init__(self, proposals):
        self.proposals = list(proposals)
        self.rollbacks = []

    def propose(self, tokens, gamma):
        return self.proposals[:gamma]

    def rollback(self, length):
        self.rollbacks.append(length)


def start(model, prompt, max_len=64):
    """The convention's state before the first step: tokens = the prompt, the cache holding prompt[:-1]."""
    tokens = prompt.tolist()
    cache = model.new_cache(1, max_len)
    if len(tokens) > 1:
        model.prefill(prompt[:-1].view(1, -1), cache)
    return tokens, cache


# -- the greedy contract ----------------------------------------------------------------------
@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("kind", ["other model", "truncated", "itself", "prompt lookup"])
def test_tokens_equal_plain_greedy_for_every_draft_and_gamma(target, kind, gamma):
    drafts = {"other model": lambda: toy_decoder(7), "truncated": lambda: truncated_draft(target, 2),
              "itself": lambda: target, "prompt lookup": lambda: PromptLookupDraft()}
    for name, prompt in PROMPTS.items():
        expected, _ = generate_cached(target, prompt, N_NEW)
        tokens, stats = generate_speculative(target, drafts[kind](), prompt, N_NEW, gamma)
        assert tokens.dtype == torch.int64 and tokens.shape == (N_NEW,)
        assert torch.equal(tokens, expected), f"{kind}, gamma {gamma}, prompt {name!r}"
        assert stats.emitted == N_NEW and stats.accepted <= stats.proposed


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 6])
def test_the_target_as_its_own_draft_accepts_every_proposal(target, gamma):
    tokens, stats = generate_speculative(target, target, PROMPTS["longer"], N_NEW, gamma)
    assert stats.acceptance_rate == 1.0
    # every iteration emits gamma + 1 tokens, but the last, truncated to land on N_NEW exactly
    assert stats.iterations == math.ceil(N_NEW / (gamma + 1))
    assert stats.emitted == N_NEW
    # one chunk per iteration: gamma + 1 tokens, the last one what is left; each timed
    chunks = [gamma + 1] * (N_NEW // (gamma + 1)) + ([N_NEW % (gamma + 1)] if N_NEW % (gamma + 1) else [])
    assert list(stats.chunk_tokens) == chunks
    assert len(stats.iteration_s) == stats.iterations and all(t > 0 for t in stats.iteration_s)


def test_the_target_as_its_own_draft_emits_gamma_plus_one_per_step(target):
    gamma = 4
    tokens, cache = start(target, PROMPTS["longer"])
    draft = ModelDraft(target, target.new_cache(1, 64))
    for _ in range(4):
        result = speculative_step(target, draft, tokens, cache, gamma)
        assert (result.proposed, result.accepted, len(result.emitted)) == (gamma, gamma, gamma + 1)
        tokens.extend(result.emitted)


def test_prompt_lookup_is_accepted_on_a_repetitive_prompt(target):
    base = PROMPTS["short"]
    continuation, _ = generate_cached(target, base, 40)
    prompt = torch.cat([base, continuation, base])        # the passage, then its start again
    expected, _ = generate_cached(target, prompt, N_NEW)
    tokens, stats = generate_speculative(target, PromptLookupDraft(), prompt, N_NEW, 4)
    assert torch.equal(tokens, expected)
    assert stats.accepted > 0 and stats.acceptance_rate > 0
    assert stats.tokens_per_iteration > 1


def test_zero_new_tokens_is_an_empty_generation(target):
    tokens, stats = generate_speculative(target, toy_decoder(7), PROMPTS["short"], 0, 4)
    assert tokens.shape == (0,) and tokens.dtype == torch.int64
    assert stats == SpeculativeStats(0, 0, 0, 0, math.inf, -1)


def test_generation_up_to_the_last_position_matches_plain_greedy():
    model = toy_decoder(0, max_seq_len=32)
    prompt = random_prompt(10, 4)
    n = 32 - 10 + 1                                          # the most generate_cached allows
    expected, _ = generate_cached(model, prompt, n)
    for draft in (model, toy_decoder(3, max_seq_len=32), PromptLookupDraft()):
        tokens, _ = generate_speculative(model, draft, prompt, n, 6)
        assert torch.equal(tokens, expected)


def test_min_top2_gap_is_over_the_rows_that_chose_the_emitted_tokens(target):
    prompt = PROMPTS["longer"]
    _, logits = generate_cached(target, prompt, N_NEW)
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    tokens, stats = generate_speculative(target, target, prompt, N_NEW, 4)
    assert stats.min_top2_gap_at == int(gaps.argmin())
    assert stats.min_top2_gap == pytest.approx(float(gaps.min()), abs=1e-4)


# -- one step ---------------------------------------------------------------------------------
def test_step_emits_accepted_plus_one_and_the_bonus_on_full_acceptance(target):
    prompt = PROMPTS["longer"]
    greedy, _ = generate_cached(target, prompt, 6)
    greedy = greedy.tolist()
    L = prompt.numel()
    cases = {   # proposals -> (accepted, emitted)
        "all right": (greedy[:4], 4, greedy[:5]),                    # bonus token greedy[4]
        "second wrong": ([greedy[0], (greedy[1] + 1) % 512, 3, 4], 1, greedy[:2]),
        "first wrong": ([(greedy[0] + 1) % 512, 1, 2, 3], 0, greedy[:1]),
        "none": ([], 0, greedy[:1]),                                 # a plain decode step
    }
    for name, (proposals, accepted, emitted) in cases.items():
        tokens, cache = start(target, prompt)
        draft = ScriptedDraft(proposals)
        result = speculative_step(target, draft, tokens, cache, 4)
        assert isinstance(result, StepResult)
        assert (result.proposed, result.accepted) == (len(proposals), accepted), name
        assert list(result.emitted) == emitted and len(result.emitted) == result.accepted + 1, name
        assert cache.length == L + accepted and draft.rollbacks == [L + accepted], name
        assert tokens == prompt.tolist(), "speculative_step must not modify tokens"


@pytest.mark.parametrize("draft_kind", ["other model", "truncated"])
def test_both_caches_keep_the_convention_after_every_iteration(target, draft_kind):
    model = toy_decoder(7) if draft_kind == "other model" else truncated_draft(target, 2)
    tokens, cache = start(target, PROMPTS["longer"], 128)
    draft = ModelDraft(model, model.new_cache(1, 128))
    accepted = []
    for _ in range(12):
        result = speculative_step(target, draft, tokens, cache, 3)
        tokens.extend(result.emitted)
        accepted.append(result.accepted)
        assert cache.length == len(tokens) - 1
        assert draft.cache.length <= len(tokens) - 1
    assert min(accepted) < 3, "the test needs at least one rejection"


def test_crop_restores_the_cache_bit_for_bit(target):
    tokens, cache = start(target, PROMPTS["longer"], 128)
    draft = ModelDraft(toy_decoder(7), toy_decoder(7).new_cache(1, 128))
    rejections = 0
    for _ in range(10):
        n = cache.length
        before, draft_before, draft_n = cache.clone(), draft.cache.clone(), draft.cache.length
        L = len(tokens)
        proposals = draft.propose(list(tokens), 3)
        draft.cache.crop(draft_n)      # propose again inside the step: same proposals, same draft state
        result = speculative_step(target, draft, tokens, cache, 3)
        rejections += result.accepted < 3
        # crop: every slot filled before the iteration is unchanged, in both caches
        assert torch.equal(cache.k[:, :, :, :n], before.k[:, :, :, :n])
        assert torch.equal(cache.v[:, :, :, :n], before.v[:, :, :, :n])
        assert torch.equal(draft.cache.k[:, :, :, :draft_n], draft_before.k[:, :, :, :draft_n])
        # re-feeding the same block into the cropped cache gives the state of the same feeds
        after_k = cache.k[:, :, :, :cache.length].clone()
        after_v = cache.v[:, :, :, :cache.length].clone()
        length = cache.length
        for replay in (cache, before):
            replay.crop(n)
            target(torch.tensor([[tokens[-1], *proposals]]), torch.arange(L - 1, L + len(proposals)), replay)
            replay.crop(length)
            assert torch.equal(replay.k[:, :, :, :length], after_k)
            assert torch.equal(replay.v[:, :, :, :length], after_v)
        tokens.extend(result.emitted)
    assert rejections > 0


# -- drafts -----------------------------------------------------------------------------------
def test_prompt_lookup_proposes_what_followed_the_most_recent_match():
    draft = PromptLookupDraft(max_ngram=2, min_ngram=1)
    tokens = [1, 2, 9, 1, 2, 8, 5, 1, 2]
    assert draft.propose(tokens, 3) == [8, 5, 1]          # the match at 3, not the older one at 0
    assert draft.propose(tokens, 10) == [8, 5, 1, 2]      # up to the end of the sequence


def test_prompt_lookup_tries_the_longest_ngram_first():
    draft = PromptLookupDraft(max_ngram=3, min_ngram=1)
    tokens = [7, 1, 2, 3, 4, 3, 9, 1, 2, 3]
    assert draft.propose(tokens, 2) == [4, 3]             # the 3-gram [1, 2, 3] at 1, not [3] at 5
    assert PromptLookupDraft(max_ngram=1).propose(tokens, 2) == [9, 1]


def test_prompt_lookup_without_a_match_proposes_nothing():
    assert PromptLookupDraft().propose([1, 2, 3, 4], 4) == []
    assert PromptLookupDraft().propose([7], 4) == []
    assert PromptLookupDraft().propose([1, 2, 1], 0) == []


def test_prompt_lookup_never_matches_the_suffix_with_itself():
    draft = PromptLookupDraft(max_ngram=3, min_ngram=3)
    assert draft.propose([4, 1, 2, 3], 4) == []            # [1, 2, 3] occurs only as the suffix
    assert draft.propose([1, 2, 3], 4) == []
    assert PromptLookupDraft(max_ngram=1).propose([5, 5], 3) == [5]   # an earlier, overlapping match
    draft.rollback(0)                                       # no state: nothing to do
    assert isinstance(draft, Draft)


def test_prompt_lookup_refuses_bad_ngram_lengths():
    with pytest.raises(ValueError):
        PromptLookupDraft(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError):
        PromptLookupDraft(min_ngram=0)


def test_truncated_draft_shares_the_targets_weights(target):
    draft = truncated_draft(target, 2)
    assert isinstance(draft, Decoder) and draft.config.n_layers == 2
    assert len(draft.layers) == 2 and draft.new_cache(1, 8).n_layers == 2
    target_ptrs = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in target_ptrs for p in draft.parameters())
    assert draft.norm is target.norm and draft.lm_head is target.lm_head
    assert draft.layers[1] is target.layers[1]
    assert not any(t.is_meta for t in [*draft.parameters(), *draft.buffers()])
    # it computes what a copy of the first two layers with the same norm and head computes
    kept = {k: v for k, v in target.state_dict().items()
            if not k.startswith("layers.") or int(k.split(".")[1]) < 2}
    copy = Decoder.from_hf_state_dict(draft.config, kept)
    ids = PROMPTS["longer"].view(1, -1)
    positions = torch.arange(ids.shape[1])
    assert torch.equal(draft(ids, positions), copy(ids, positions))
    with pytest.raises(ValueError):
        truncated_draft(target, 5)
    with pytest.raises(ValueError):
        truncated_draft(target, 0)


class FakeTokenizer:
    def __init__(self, vocab):
        self.vocab = dict(vocab)

    def get_vocab(self):
        return dict(self.vocab)


def test_check_same_vocabulary_names_the_first_differing_id():
    vocab = {"a": 0, "b": 1, "c": 2, "d": 3}
    check_same_vocabulary(FakeTokenizer(vocab), FakeTokenizer(vocab))
    with pytest.raises(ValueError, match=r"id 2: target 'c', draft 'x'"):
        check_same_vocabulary(FakeTokenizer(vocab), FakeTokenizer({"a": 0, "b": 1, "x": 2, "d": 3}))
    with pytest.raises(ValueError, match="size"):
        check_same_vocabulary(FakeTokenizer(vocab), FakeTokenizer({"a": 0, "b": 1, "c": 2}))
    with pytest.raises(TypeError):
        check_same_vocabulary(FakeTokenizer(vocab), object())


# -- validation -------------------------------------------------------------------------------
def test_gamma_must_be_a_positive_int(target):
    tokens, cache = start(target, PROMPTS["short"])
    for gamma in (0, -1):
        with pytest.raises(ValueError, match="gamma"):
            speculative_step(target, PromptLookupDraft(), tokens, cache, gamma)
        with pytest.raises(ValueError, match="gamma"):
            generate_speculative(target, PromptLookupDraft(), PROMPTS["short"], 4, gamma)
    with pytest.raises(TypeError):
        generate_speculative(target, PromptLookupDraft(), PROMPTS["short"], 4, 2.0)


def test_a_cache_that_breaks_the_convention_is_refused_before_anything_runs(target):
    prompt = random_prompt(12, 5)
    tokens, cache = start(target, prompt)
    target.prefill(torch.tensor([[1, 2, 3]]), cache)                   # 14 slots for 12 tokens
    with pytest.raises(ValueError, match=r"target_cache.length must be len\(tokens\) - 1 = 11, got 14"):
        speculative_step(target, PromptLookupDraft(), tokens, cache, 4)
    tokens, cache = start(target, prompt)
    draft = ModelDraft(toy_decoder(7), toy_decoder(7).new_cache(1, 64))
    toy_decoder(7).prefill(prompt.view(1, -1), draft.cache)           # the draft holds all 12 tokens
    with pytest.raises(ValueError, match=r"draft cache.length must be <= len\(tokens\) - 1 = 11, got 12"):
        speculative_step(target, draft, tokens, cache, 4)
    assert cache.length == 11


def test_positions_past_the_end_are_refused_before_overflowing():
    model = toy_decoder(0, max_seq_len=16)
    tokens, cache = start(model, random_prompt(14, 6), max_len=16)
    draft = ModelDraft(model, model.new_cache(1, 16))
    with pytest.raises(ValueError, match="max_seq_len 16"):
        speculative_step(model, draft, tokens, cache, 3)             # positions 13 .. 16
    assert cache.length == 13 and draft.cache.length == 0
    small = model.new_cache(1, 14)
    model.prefill(torch.tensor([tokens[:-1]]), small)
    with pytest.raises(ValueError, match="max_len 14"):
        speculative_step(model, PromptLookupDraft(), tokens, small, 1)   # slots up to 15
    assert speculative_step(model, PromptLookupDraft(), tokens, cache, 2).emitted  # 13 .. 15 fit
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_speculative(model, model, random_prompt(14, 6), 4, 2)
    short_draft = ModelDraft(model, model.new_cache(1, 14))
    with pytest.raises(ValueError, match="draft cache"):
        short_draft.propose(tokens, 2)                                 # needs 15 draft slots


def test_a_draft_model_with_another_vocabulary_is_refused(target):
    with pytest.raises(ValueError, match="vocab_size"):
        generate_speculative(target, toy_decoder(1, vocab_size=256), PROMPTS["short"], 4, 2)
    with pytest.raises(TypeError):
        generate_speculative(target, object(), PROMPTS["short"], 4, 2)
    used = ModelDraft(target, target.new_cache(1, 64))
    target.prefill(torch.tensor([[1, 2]]), used.cache)
    with pytest.raises(ValueError, match="empty"):
        generate_speculative(target, used, PROMPTS["short"], 4, 2)


def test_a_model_draft_with_another_vocabulary_is_refused_before_anything_runs(target):
    other = toy_decoder(1, vocab_size=256)
    pattern = r"ModelDraft's model has vocab_size 256 but the target has 512"
    draft = ModelDraft(other, other.new_cache(1, 64))
    with pytest.raises(ValueError, match=pattern):
        generate_speculative(target, draft, PROMPTS["short"], 4, 2)
    tokens, cache = start(target, PROMPTS["short"])
    with pytest.raises(ValueError, match=pattern):
        speculative_step(target, draft, tokens, cache, 2)
    assert cache.length == len(tokens) - 1 and draft.cache.length == 0


@pytest.mark.parametrize("tokens, error, pattern", [
    ("abcab", TypeError, "tokens must be a sequence of int token ids"),
    ([1, 2.5, 1], TypeError, r"tokens\[1\] must be an int"),
    ([1, -2, 1], ValueError, r"tokens\[1\] must be an int in \[0, "),
    (torch.tensor([1.0, 2.0]), TypeError, "tokens must be an integer tensor"),
])
def test_prompt_lookup_refuses_tokens_that_are_not_int_ids(tokens, error, pattern):
    with pytest.raises(error, match=pattern):
        PromptLookupDraft().propose(tokens, 2)
    with pytest.raises(TypeError, match="gamma must be an int"):
        PromptLookupDraft().propose([1, 2, 1], 2.0)


def test_prompt_lookup_takes_a_1d_integer_tensor_as_a_list():
    tokens = [1, 2, 9, 1, 2, 8, 5, 1, 2]
    assert PromptLookupDraft(max_ngram=2).propose(torch.tensor(tokens), 3) == [8, 5, 1]
    assert PromptLookupDraft(max_ngram=2).propose(np.array(tokens), 3) == [8, 5, 1]


def test_model_draft_checks_its_tokens_against_its_vocabulary(target):
    draft = ModelDraft(target, target.new_cache(1, 64))
    with pytest.raises(ValueError, match=r"tokens\[1\] must be an int in \[0, 511\] \(vocab_size 512\), got 600"):
        draft.propose([1, 600], 2)
    with pytest.raises(TypeError, match=r"tokens\[0\] must be an int"):
        draft.propose([1.0, 2], 2)
    with pytest.raises(ValueError, match="at least one committed token"):
        draft.propose([], 2)
    assert draft.cache.length == 0


@pytest.mark.parametrize("proposals, error, pattern", [
    ([7.9, 3], TypeError, r"draft ScriptedDraft.propose\(tokens, 3\)\[0\] must be an int .*got 7.9 of type float"),
    ([7, "3"], TypeError, r"draft ScriptedDraft.propose\(tokens, 3\)\[1\] must be an int"),
    (torch.tensor([7.0, 3.0]), TypeError, r"draft ScriptedDraft.propose\(tokens, 3\) must be an integer tensor"),
    ([7, 512], ValueError, r"draft ScriptedDraft.propose\(tokens, 3\)\[1\] must be an int in \[0, 511\]"),
])
def test_proposals_a_draft_returns_are_checked_as_int_ids_naming_the_draft(target, proposals, error, pattern):
    tokens, cache = start(target, PROMPTS["short"])
    draft = ScriptedDraft([])
    draft.propose = lambda tokens, gamma: proposals
    with pytest.raises(error, match=pattern):
        speculative_step(target, draft, tokens, cache, 3)
    assert cache.length == len(tokens) - 1                 # the target never ran
    assert draft.rollbacks == [len(tokens) - 1]            # the draft is back within the convention


def test_a_draft_proposing_more_than_gamma_tokens_is_named(target):
    tokens, cache = start(target, PROMPTS["short"])
    draft = ScriptedDraft([])
    draft.propose = lambda tokens, gamma: [1, 2, 3]
    with pytest.raises(ValueError, match=r"draft ScriptedDraft.propose\(tokens, 2\) must return at most gamma = 2"):
        speculative_step(target, draft, tokens, cache, 2)


def test_integer_proposals_of_any_int_kind_are_verified_as_python_ints(target):
    reference = speculative_step(target, ScriptedDraft([5, 6]), *start(target, PROMPTS["short"]), 2)
    zero_d = lambda ids: [torch.tensor(i) for i in ids]      # noqa: E731  what [logits.argmax(), ...] gives
    for kind in (np.array, torch.tensor, tuple, zero_d):
        draft = ScriptedDraft([])
        draft.propose = lambda tokens, gamma, kind=kind: kind([5, 6])
        step = speculative_step(target, draft, *start(target, PROMPTS["short"]), 2)
        assert step == reference and all(type(t) is int for t in step.emitted)


def test_speculative_step_refuses_committed_tokens_that_are_not_ids(target):
    tokens, cache = start(target, PROMPTS["short"])
    with pytest.raises(TypeError, match=r"tokens\[2\] must be an int"):
        speculative_step(target, PromptLookupDraft(), [*tokens[:2], 3.0, *tokens[3:]], cache, 2)
    with pytest.raises(ValueError, match=r"tokens\[0\] must be an int in \[0, 511\]"):
        speculative_step(target, PromptLookupDraft(), [512, *tokens[1:]], cache, 2)
    assert cache.length == len(tokens) - 1


# -- the analytic model -----------------------------------------------------------------------
def test_break_even_alpha_matches_a_fine_grid():
    alpha = np.linspace(0.0, 1.0, 1_000_001)[:-1]                    # alpha = 1 is the limit gamma + 1
    tokens = (1 - alpha ** 5) / (1 - alpha)                           # gamma = 4
    speedup = tokens / (4 * 0.1 + 1.0)
    grid = alpha[np.argmax(speedup >= 1)]                             # first alpha that breaks even
    found = break_even_alpha(4, draft_cost=0.1)
    assert abs(found - grid) < 2e-6
    assert round(found, 3) == round(float(grid), 3) == 0.287          # docs/speculative_decoding.md
    assert break_even_alpha(4, draft_cost=0.0) == 0.0                 # a free draft never loses
    assert break_even_alpha(4, draft_cost=0.1, verification_ratio=1.5) > found


def test_best_gamma_against_the_sum_of_powers():
    def speedup(alpha, gamma, c, v=1.0):                              # E as 1 + alpha + ... + alpha^gamma
        return sum(alpha ** i for i in range(gamma + 1)) / (gamma * c + v)

    # alpha 0.8, c 0.1 over 1 .. 8: 1.8/1.1, 2.44/1.2, ..., peaking inside the range, at gamma 6
    values = [speedup(0.8, g, 0.1) for g in range(1, 9)]
    assert values.index(max(values)) == 5
    gamma, value = best_gamma(0.8, 0.1, range(1, 9))
    assert gamma == 6 and value == pytest.approx(3.951424 / 1.6, rel=1e-12)       # E = 3.951424 by hand
    assert best_gamma(0.8, 0.1, [8, 2, 6, 4]) == best_gamma(0.8, 0.1, [2, 4, 6, 8])  # any order
    assert best_gamma(0.95, 0.0, [1, 3, 8])[0] == 8                  # a free draft: the longest block
    assert best_gamma(0.2, 0.3, range(1, 9)) == (1, pytest.approx(1.2 / 1.3))       # the shortest block
    assert best_gamma(0.0, 0.0, [4, 2, 3]) == (2, 1.0)                # a tie everywhere: the smallest gamma
    assert best_gamma(1.0, 1.0, [5, 1, 3]) == (1, 1.0)                # (g + 1) / (g + 1): a tie again
    gamma, value = best_gamma(0.8, 0.1, range(1, 9), verification_ratio=2.0)
    assert value == pytest.approx(max(speedup(0.8, g, 0.1, 2.0) for g in range(1, 9)), rel=1e-12)


def test_best_gamma_refuses_bad_candidates():
    with pytest.raises(ValueError, match="gammas"):
        best_gamma(0.8, 0.1, [])
    with pytest.raises(ValueError, match="gammas"):
        best_gamma(0.8, 0.1, [2, -1])
    with pytest.raises(ValueError, match="alpha"):
        best_gamma(1.5, 0.1, [2])


def test_break_even_alpha_raises_when_no_alpha_breaks_even():
    with pytest.raises(ValueError, match="no alpha"):
        break_even_alpha(4, draft_cost=2.0)                            # 5 tokens for 9 target steps
    with pytest.raises(ValueError, match="gamma"):
        break_even_alpha(0, draft_cost=0.1)


# -- costs and the bench --------------------------------------------------------------------------
def test_measure_step_costs_reports_medians_and_ratios(target):
    costs = measure_step_costs(target, truncated_draft(target, 1), gammas=(2, 4), context=16, warmup=1, repeats=3)
    assert isinstance(costs, StepCosts)
    assert set(costs.v) == set(costs.verify_s) == {2, 4}
    assert costs.c == pytest.approx(costs.draft_step_s / costs.target_step_s)
    assert costs.v[4] == pytest.approx(costs.verify_s[4] / costs.target_step_s)
    assert (costs.context, costs.warmup, costs.repeats) == (16, 1, 3)
    assert costs.threads == torch.get_num_threads() and costs.device == "cpu"
    lookup = measure_step_costs(target, PromptLookupDraft(), gammas=(3,), context=16, warmup=0, repeats=2)
    assert lookup.c == 0.0 and lookup.draft_step_s > 0
    with pytest.raises(ValueError, match="max_seq_len"):
        measure_step_costs(target, PromptLookupDraft(), context=510)


def test_compare_reports_each_method_beside_plain_greedy(target):
    prompts = {"a": PROMPTS["short"], "b": PROMPTS["longer"]}
    table = compare(target, prompts, {"lookup": PromptLookupDraft, "self": lambda: target},
                    gamma=3, max_new_tokens=8, repeats=1, warmup=0)
    assert list(table.prompt) == ["a"] * 3 + ["b"] * 3 + ["total"] * 3
    assert table.same_tokens.all()
    assert (table.tokens == [8] * 6 + [16] * 3).all()
    greedy = table[table.method == "greedy"]
    assert (greedy.speedup == 1).all() and greedy.alpha.isna().all()
    assert (table[table.method == "self"].alpha == 1).all()
    # the stream: greedy keeps no per-step times; a speculative row's decode time is its chunks' gaps
    assert greedy[["decode_s", "mean_gap_s", "max_gap_s", "tpot_s"]].isna().all().all()
    spec_rows = table[table.method != "greedy"]
    assert (spec_rows.decode_s > 0).all() and (spec_rows.decode_s <= spec_rows.seconds).all()
    assert np.allclose(spec_rows.mean_gap_s * spec_rows.iterations, spec_rows.decode_s)
    assert np.allclose(spec_rows.tpot_s * spec_rows.tokens, spec_rows.decode_s)
    assert (spec_rows.max_gap_s >= spec_rows.mean_gap_s).all()
    total = table[(table.prompt == "total") & (table.method == "lookup")].iloc[0]
    per_prompt = table[(table.prompt != "total") & (table.method == "lookup")]
    assert total.decode_s == pytest.approx(per_prompt.decode_s.sum())
    assert total.max_gap_s == per_prompt.max_gap_s.max()


def test_compare_warms_up_on_the_first_prompt_only(target):
    """Warm-up rounds warm the code paths every prompt shares: with 2 warm-up and 1 timed round,
    three prompts take 2 + 3 rounds, not 3 x 3."""
    made = []
    prompts = {"a": PROMPTS["short"], "b": PROMPTS["longer"], "c": PROMPTS["short"]}
    compare(target, prompts, {"lookup": lambda: made.append(1) or PromptLookupDraft()}, gamma=3, max_new_tokens=4,
            repeats=1, warmup=2)
    assert len(made) == 2 + 3


# -- the real model ---------------------------------------------------------------------------
@pytest.mark.slow
def test_prompt_lookup_on_smollm2_reproduces_greedy():
    from course_lib.data import load_smollm2
    from course_lib.speculative.bench import PROMPTS as BENCH_PROMPTS, prompt_ids

    model, tokenizer, _ = load_smollm2()
    prompt = prompt_ids(tokenizer, BENCH_PROMPTS["repeat paragraph"])
    expected, _ = generate_cached(model, prompt, 16)
    tokens, stats = generate_speculative(model, PromptLookupDraft(), prompt, 16, 4)
    assert torch.equal(tokens, expected)
    assert stats.accepted > 0
