"""Greedy speculative decoding with two KV caches: the Lab 5 reference loop.

A draft proposes ``gamma`` tokens; the target scores the newest committed token and the
proposals in ONE forward (``gamma + 1`` positions) and keeps the longest prefix of proposals
equal to its own argmax, plus its own next token (the correction, or the bonus when every
proposal was accepted). The output is therefore token for token the target's greedy decoding
(``generate_cached``), whatever the draft proposes; a good draft only makes it faster
(Leviathan et al., 2023, arXiv:2211.17192; Chen et al., 2023, arXiv:2302.01318;
``docs/speculative_decoding.md#greedy-speculative-decoding`` and ``#greedy-contract``).

Cache convention (``docs/speculative_decoding.md#cache-rollback``; the graded checker and the
notebook use the same one). Between iterations, with ``tokens`` the committed sequence (prompt
and emitted tokens, a list of L >= 1 ints):

    target_cache.length == L - 1    K/V of every committed token but the newest, fed next
    draft cache length  <= L - 1    it holds tokens[:length]

One iteration (``speculative_step``):

    1. draft: feed tokens[draft_len:] (positions draft_len .. L-1) -> d1; feed d1 -> d2, ...,
       d_{gamma-1} -> d_gamma                                (draft cache ends at L + gamma - 1)
    2. target: one forward of [tokens[-1], d1 .. d_gamma] at positions L-1 .. L+gamma-1
       -> g_0 .. g_gamma, the argmax of each row
    3. k = the number of leading i with d_{i+1} == g_i;  emitted = [d1 .. dk, g_k]
    4. target_cache.crop(L + k); draft.rollback(L + k)       (both invariants hold for L + k + 1)

Crop is a rollback by length only: the slots past it are overwritten by the next feed, so a
cache that is not cropped makes the next step attend to rejected tokens' keys.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..cache.contiguous import KVCache
from ..divergence import top2_gap
from ..models.decoder import Decoder, generation_inputs
from ..validation import ArgumentTypeError, instance, positive_integer, token_ids
from .drafts import Draft, ModelDraft

__all__ = ["StepResult", "SpeculativeStats", "speculative_step", "generate_speculative"]


@dataclass(frozen=True)
class StepResult:
    """What one iteration did.

    Attributes:
        emitted: the committed tokens, ``accepted + 1`` ints: the accepted proposals, then the
            target's own token (the correction at the first mismatch, or the bonus token when
            every proposal was accepted).
        proposed: proposals the draft made (0 .. gamma).
        accepted: leading proposals equal to the target's argmax (0 .. proposed).
        min_top2_gap: the smallest (largest logit - second largest) over the target rows that
            chose the emitted tokens (rows 0 .. accepted), in logit units: how close the greedy
            comparison came to a tie (``docs/speculative_decoding.md#greedy-contract``).
        min_top2_gap_at: index in ``emitted`` of the token that row chose.
    """

    emitted: tuple[int, ...]
    proposed: int
    accepted: int
    min_top2_gap: float
    min_top2_gap_at: int = 0


@dataclass(frozen=True)
class SpeculativeStats:
    """Totals of one ``generate_speculative`` run.

    Attributes:
        iterations: target forwards after the prefill.
        proposed, accepted, emitted: totals over the iterations (emitted == max_new_tokens).
        min_top2_gap: the smallest top-2 logit gap of any row that chose an emitted token
            (inf when nothing was emitted).
        min_top2_gap_at: index of that token in the generated tokens (-1 when none).
        iteration_s: wall time of each iteration in seconds (``time.perf_counter``; the draft's
            proposals, the verification forward and the rollback). Each iteration ends by reading
            its tokens on the host, which waits for the device, so on a GPU too each time is
            complete. A streaming client receives one chunk per iteration: these are the gaps
            between chunks (the first one follows the prefill).
        chunk_tokens: tokens emitted by each iteration (its chunk), summing to ``emitted``.
    """

    iterations: int
    proposed: int
    accepted: int
    emitted: int
    min_top2_gap: float
    min_top2_gap_at: int
    iteration_s: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed, the measured alpha (nan when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else math.nan

    @property
    def tokens_per_iteration(self) -> float:
        """emitted / iterations (nan when there was no iteration)."""
        return self.emitted / self.iterations if self.iterations else math.nan


@torch.no_grad()
def _verify(target: Decoder, draft: Draft, tokens: list[int], target_cache: KVCache,
           proposals: list[int]) -> StepResult:
    """Steps 2-4 of an iteration for given proposals (possibly none: a plain decode step).
    Unchecked: ``speculative_step`` and ``generate_speculative`` check the arguments first."""
    L = len(tokens)
    device = target.embed_tokens.weight.device
    block = torch.tensor([[tokens[-1], *proposals]], dtype=torch.int64, device=device)   # (1, m + 1)
    positions = torch.arange(L - 1, L + len(proposals), device=device)
    logits = target(block, positions, target_cache)[0]                                   # (m + 1, V)
    greedy = logits.argmax(dim=-1).tolist()                                              # g_0 .. g_m
    k = 0
    while k < len(proposals) and proposals[k] == greedy[k]:
        k += 1
    emitted = (*proposals[:k], greedy[k])
    target_cache.crop(L + k)          # keep tokens[:L] and the k accepted proposals
    draft.rollback(L + k)
    if logits.shape[-1] < 2:
        gap, at = math.inf, 0
    else:
        gaps = top2_gap(logits[:k + 1])                                                  # (k + 1,)
        at = int(gaps.argmin())
        gap = float(gaps[at])
    return StepResult(emitted, len(proposals), k, gap, at)


def _check_draft_vocabulary(target: Decoder, draft) -> None:
    """A draft model (a ``Decoder``, or the model of a ``ModelDraft``) must share the target's
    vocabulary size: its token ids go to the target and the target's to it."""
    model = draft.model if isinstance(draft, ModelDraft) else draft if isinstance(draft, Decoder) else None
    if model is not None and model.config.vocab_size != target.config.vocab_size:
        what = "ModelDraft's model" if isinstance(draft, ModelDraft) else "draft Decoder"
        raise ValueError(f"the {what} has vocab_size {model.config.vocab_size} but the target has "
                         f"{target.config.vocab_size}: its token ids would not mean the same tokens (the draft "
                         f"must use the target's vocabulary; check_same_vocabulary compares two tokenizers)")


def _checked_proposals(draft: Draft, proposals, gamma: int, vocab_size: int) -> list[int]:
    """What a draft's ``propose`` returned (user code: checked before the target runs): at most
    ``gamma`` int ids in the target's vocabulary, as a list of Python ints."""
    name = f"draft {type(draft).__name__}.propose(tokens, {gamma})"
    if isinstance(proposals, (list, tuple)):   # ids from logits.argmax() are 0-d integer tensors: take their values
        proposals = [int(p) if isinstance(p, torch.Tensor) and p.dim() == 0 and not p.is_floating_point()
                     and p.dtype != torch.bool and not p.is_meta else p for p in proposals]
    proposals = token_ids(name, proposals, vocab_size=vocab_size)
    if len(proposals) > gamma:
        raise ValueError(f"{name} must return at most gamma = {gamma} tokens, got {len(proposals)}")
    return proposals


def speculative_step(target: Decoder, draft: Draft, tokens: list[int], target_cache: KVCache,
                     gamma: int) -> StepResult:
    """One iteration of greedy speculative decoding under the cache convention (module docstring).

    A draft that proposes fewer than ``gamma`` tokens (prompt lookup without a match) is
    verified on what it proposed; with none, this is a plain decode step emitting one token.

    Args:
        target: the target ``Decoder``.
        draft: a ``Draft`` (``ModelDraft``, ``PromptLookupDraft``, ...).
        tokens: the committed sequence, a list of L >= 1 int ids in the target's vocabulary;
            not modified (extend it with the result's ``emitted``).
        target_cache: the target's ``KVCache`` (batch 1) holding tokens[:L - 1].
        gamma: tokens to draft, an int >= 1.

    Returns:
        a ``StepResult``. Afterwards target_cache.length == L + accepted and the draft holds at
        most that many tokens: the invariant for tokens + emitted.

    Raises:
        ArgumentTypeError: target not a Decoder, draft without propose/rollback, tokens not a
            list of ints, target_cache not a KVCache, gamma not an int; proposals the draft
            returns that are not ints (a float, a str, a float tensor: the error names the
            draft's class).
        ValueError: gamma < 1; an empty ``tokens`` or an id outside the target's vocabulary; a
            ``ModelDraft`` whose model has another vocab_size than the target; target_cache.length
            != L - 1 (the invariant); positions L - 1 .. L + gamma - 1 past the target's
            max_seq_len or slots past target_cache.max_len (all checked before anything runs); a
            draft proposing more than gamma tokens or ids outside the target's vocabulary
            (checked before the target runs; the draft is rolled back to L - 1 first, the
            target cache is untouched).
    """
    instance("target", target, Decoder)
    instance("draft", draft, Draft, note="an object with propose(tokens, gamma) and rollback(length)")
    instance("tokens", tokens, list)
    instance("target_cache", target_cache, KVCache)
    gamma = positive_integer("gamma", gamma)
    V = target.config.vocab_size
    tokens = token_ids("tokens", tokens, vocab_size=V)
    _check_draft_vocabulary(target, draft)
    L = len(tokens)
    if L == 0:
        raise ValueError("tokens must hold at least one committed token (the prompt), got an empty list")
    weight = target.embed_tokens.weight
    target_cache.check_fits(target.config, 1, weight.dtype, weight.device)
    if target_cache.length != L - 1:
        raise ValueError(f"target_cache.length must be len(tokens) - 1 = {L - 1}, got {target_cache.length} "
                         f"(between iterations the target cache holds every committed token but the newest)")
    if L + gamma > min(target.config.max_seq_len, target_cache.max_len):
        raise ValueError(f"a step with gamma={gamma} after {L} tokens feeds the target positions {L - 1} .. "
                         f"{L + gamma - 1}, past max_seq_len {target.config.max_seq_len} or the cache's "
                         f"max_len {target_cache.max_len}; use a smaller gamma near the end")
    proposed = draft.propose(tokens, gamma)                                         # step 1
    try:
        proposals = _checked_proposals(draft, proposed, gamma, V)
    except ValueError:          # ArgumentTypeError too: the step did not happen, keep the convention
        draft.rollback(L - 1)
        raise
    return _verify(target, draft, tokens, target_cache, proposals)     # steps 2-4


@torch.no_grad()
def generate_speculative(target: Decoder, draft: Draft | Decoder, prompt: torch.Tensor, max_new_tokens: int,
                         gamma: int) -> tuple[torch.Tensor, SpeculativeStats]:
    """Greedy speculative generation: the same tokens as ``generate_cached(target, prompt, n)``.

    Prefill: the target (and a model draft) get prompt[:-1]; then ``speculative_step`` until
    ``max_new_tokens`` tokens are emitted. The last iterations are truncated to land exactly:
    with ``left`` tokens to go, an iteration drafts min(gamma, left - 1) (it emits at most that
    plus one), and the final token, when one is left, comes from a plain target step. So the
    target sees the positions ``generate_cached`` uses, 0 .. T0 + max_new_tokens - 2, and no more.

    Args:
        target: the target ``Decoder``.
        draft: a ``Draft``, or a ``Decoder`` with the target's vocab_size (wrapped in a
            ``ModelDraft`` with a new cache). A ``ModelDraft`` must come with an empty cache and
            a model of the target's vocab_size.
        prompt: (T0,) or (1, T0) int64 ids, T0 >= 1, on the target's device.
        max_new_tokens: an int in [0, max_seq_len - T0 + 1].
        gamma: tokens drafted per iteration, an int >= 1.

    Returns:
        (tokens (max_new_tokens,) int64 on the target's device, ``SpeculativeStats``).

    Raises:
        ArgumentTypeError: as ``generate_cached``; a draft that is neither a Draft nor a Decoder.
        ValueError: as ``generate_cached``; gamma < 1; a draft Decoder, or a ModelDraft's model,
            of another vocab_size (checked before anything runs); a ModelDraft whose cache is not
            empty; a draft model whose max_seq_len is too short; as ``speculative_step`` for
            what the draft proposes.
    """
    ids, n = generation_inputs(target, prompt, max_new_tokens)
    gamma = positive_integer("gamma", gamma)
    tokens = ids[0].tolist()
    T0 = len(tokens)
    _check_draft_vocabulary(target, draft)
    if isinstance(draft, Decoder):
        draft = ModelDraft(draft, draft.new_cache(1, min(max(T0 + n - 1, 1), draft.config.max_seq_len)))
    elif not isinstance(draft, Draft):
        raise ArgumentTypeError(f"draft must be a Draft (propose, rollback) or a Decoder, "
                                f"got {type(draft).__qualname__}")
    if isinstance(draft, ModelDraft) and draft.cache.length != 0:
        raise ValueError(f"the ModelDraft's cache must be empty (length 0) for a new generation, "
                         f"got length {draft.cache.length}; crop(0) it")
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=ids.device), SpeculativeStats(0, 0, 0, 0, math.inf, -1)
    target_cache = target.new_cache(1, T0 + n - 1)
    if T0 > 1:                        # prefill: everything but the newest token, which the first step feeds
        target(ids[:, :-1], torch.arange(T0 - 1, device=ids.device), target_cache)
        if isinstance(draft, ModelDraft):
            draft_device = draft.model.embed_tokens.weight.device
            draft.model(ids[:, :-1].to(draft_device), torch.arange(T0 - 1, device=draft_device), draft.cache)
    out: list[int] = []
    iterations = proposed = accepted = 0
    min_gap, min_gap_at = math.inf, -1
    times: list[float] = []
    chunks: list[tuple[int, ...]] = []
    while len(out) < n:
        left = n - len(out)
        start = time.perf_counter()
        if left == 1:      # nothing worth drafting: one plain target step
            step = _verify(target, draft, tokens, target_cache, [])
        else:
            step = speculative_step(target, draft, tokens, target_cache, min(gamma, left - 1))
        times.append(time.perf_counter() - start)
        if step.min_top2_gap < min_gap:
            min_gap, min_gap_at = step.min_top2_gap, len(out) + step.min_top2_gap_at
        tokens.extend(step.emitted)
        out.extend(step.emitted)
        chunks.append(step.emitted)
        iterations += 1
        proposed += step.proposed
        accepted += step.accepted
    stats = SpeculativeStats(iterations, proposed, accepted, len(out), min_gap, min_gap_at, tuple(times),
                             tuple(len(c) for c in chunks))
    return torch.tensor(out, dtype=torch.int64, device=ids.device), stats
