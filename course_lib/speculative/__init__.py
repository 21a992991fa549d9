"""Speculative decoding (Lab 5; Lab 1 previews the analytic model): ``docs/speculative_decoding.md``.

- ``analysis``: the analytic model: expected tokens per iteration, verification cost (roofline
  bound), speedup bound, break-even acceptance rate, the best block length;
- ``drafts``: draft sources (a smaller model, a truncated self-draft, prompt lookup);
- ``greedy``: greedy speculative decoding with two KV caches, the reference loop;
- ``costs``: the measured draft cost c and verification ratio v_gamma on this machine;
- ``bench``: ``python -m course_lib.speculative.bench``, prompt lookup against plain greedy;
- ``sampling``: stochastic acceptance (Leviathan et al., 2023; Chen et al., 2023);
- ``exact``: a small exact language model, the whole-sequence sampler and a chi-square test.
"""
from .analysis import (best_gamma, break_even_alpha, expected_tokens_per_step, speculative_speedup,
                       verification_cost_ratio)
from .costs import StepCosts, measure_step_costs, timed
from .drafts import Draft, ModelDraft, PromptLookupDraft, check_same_vocabulary, noisy_copy, truncated_draft
from .greedy import SpeculativeStats, StepResult, generate_speculative, speculative_step

__all__ = [
    "expected_tokens_per_step", "verification_cost_ratio", "speculative_speedup", "break_even_alpha", "best_gamma",
    "Draft", "ModelDraft", "PromptLookupDraft", "truncated_draft", "check_same_vocabulary", "noisy_copy",
    "StepResult", "SpeculativeStats", "speculative_step", "generate_speculative",
    "StepCosts", "measure_step_costs", "timed",
]

# stochastic acceptance and the exact model:
from .exact import MarkovLM, TokenCache, chi_square_test, continuation_probabilities, sample_speculative
from .sampling import (acceptance_probability, accept_or_resample, emitted_distribution, sample_categorical,
                       sampling_probs, total_variation, trial_distribution, verify_block)

__all__ += [
    "sampling_probs", "sample_categorical", "accept_or_resample", "verify_block", "acceptance_probability",
    "total_variation", "emitted_distribution", "trial_distribution",
    "MarkovLM", "TokenCache", "continuation_probabilities", "sample_speculative", "chi_square_test",
]
