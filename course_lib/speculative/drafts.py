"""Draft sources for greedy speculative decoding: what proposes the tokens the target verifies.

A draft only has to guess well and cheaply; correctness comes from the target's verification
(``docs/speculative_decoding.md#greedy-speculative-decoding``). Three kinds
(``docs/speculative_decoding.md#draft-sources``):

- ``ModelDraft``: a smaller ``Decoder`` with its own KV cache, decoding greedily (Leviathan et
  al., 2023, arXiv:2211.17192; Chen et al., 2023, arXiv:2302.01318);
- ``truncated_draft``: the target's own first layers followed by its final norm and head, a
  self-draft that shares the target's weights (LayerSkip, Elhoushi et al., 2024,
  arXiv:2404.16710, drafts with early layers of the same model);
- ``PromptLookupDraft``: no model at all, the tokens that followed the most recent earlier
  occurrence of the last n-gram (Saxena, 2023, https://github.com/apoorvumang/prompt-lookup-decoding).
  It shines when the output quotes the prompt: repeat, correct or edit a passage.

Every draft speaks the ``Draft`` protocol that ``greedy.speculative_step`` calls.
``check_same_vocabulary`` guards a draft with its own tokenizer: token ids mean nothing across
two vocabularies.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ..cache.contiguous import KVCache
from ..models.decoder import Decoder, state_with_data
from ..validation import ArgumentTypeError, instance, integer, nonnegative_integer, positive_integer, token_ids

__all__ = ["Draft", "ModelDraft", "PromptLookupDraft", "truncated_draft", "check_same_vocabulary", "noisy_copy"]


@runtime_checkable
class Draft(Protocol):
    """What ``speculative_step`` needs from any draft source.

    ``tokens`` is the committed sequence (prompt + emitted so far), a list of int token ids of
    the target's vocabulary.
    """

    def propose(self, tokens: list[int], gamma: int) -> list[int]:
        """Between 0 and ``gamma`` token ids guessed to follow ``tokens``."""
        ...

    def rollback(self, length: int) -> None:
        """Forget any state beyond ``tokens[:length]`` (the target rejected the rest)."""
        ...


class ModelDraft:
    """A ``Decoder`` with its own KV cache as a greedy draft.

    It keeps the cache convention of ``docs/speculative_decoding.md#cache-rollback``: between
    iterations ``cache.length <= len(tokens) - 1`` and the cache holds ``tokens[:cache.length]``.
    ``propose`` first feeds the committed tokens the cache lacks (at least the newest one; on the
    first call, the prompt), then each proposal but the last.

    Args:
        model: the draft ``Decoder``; its vocabulary must be the target's (same ids).
        cache: a ``KVCache`` built by ``model.new_cache(1, max_len)``, empty or holding a prefix
            of the sequence to be continued.

    Attributes:
        model, cache: as given.

    Raises:
        ArgumentTypeError: model not a Decoder, cache not a KVCache or of another dtype.
        ValueError: a cache of another shape, batch (it must be 1) or device.
    """

    def __init__(self, model: Decoder, cache: KVCache) -> None:
        self.model = instance("model", model, Decoder)
        self.cache = instance("cache", cache, KVCache)
        weight = model.embed_tokens.weight
        cache.check_fits(model.config, 1, weight.dtype, weight.device)

    @torch.no_grad()
    def propose(self, tokens: list[int], gamma: int) -> list[int]:
        """``gamma`` greedy draft tokens following ``tokens``.

        Feeds ``tokens[cache.length:]`` at positions cache.length .. L - 1 (L = len(tokens)) in
        one forward and takes the argmax of its last row as d1, then feeds d1 -> d2, ...,
        d_{gamma-1} -> d_gamma. The cache ends holding L + gamma - 1 slots (d_gamma is never fed).

        Args:
            tokens: the committed sequence, L >= 1 int ids in the draft model's vocabulary (a
                list, or a 1-D integer tensor).
            gamma: an int >= 0 (0 proposes nothing and feeds nothing).

        Returns:
            a list of ``gamma`` int token ids.

        Raises:
            ArgumentTypeError: gamma not an int; tokens not a sequence of ints (``token_ids``).
            ValueError: gamma < 0; an empty ``tokens`` or an id outside the draft's vocabulary;
                ``cache.length > L - 1`` (the convention's invariant: roll back after a
                rejection), or positions L + gamma - 2 past the model's max_seq_len or
                L + gamma - 1 slots past cache.max_len (checked before anything is fed).
        """
        gamma = nonnegative_integer("gamma", gamma)
        tokens = token_ids("tokens", tokens, vocab_size=self.model.config.vocab_size)
        L = len(tokens)
        if L == 0:
            raise ValueError("tokens must hold at least one committed token (the prompt), got none")
        start = self.cache.length
        if gamma == 0:
            return []
        if not 0 <= start <= L - 1:
            raise ValueError(f"draft cache.length must be <= len(tokens) - 1 = {L - 1}, got {start} "
                             f"(roll the draft back to the committed tokens after a rejection)")
        if L + gamma - 1 > self.cache.max_len or L + gamma - 2 > self.model.config.max_seq_len - 1:
            raise ValueError(f"drafting {gamma} tokens after {L} needs L + gamma - 1 = {L + gamma - 1} draft "
                             f"cache slots (positions up to {L + gamma - 2}), but the draft cache has "
                             f"max_len {self.cache.max_len} and the draft model max_seq_len "
                             f"{self.model.config.max_seq_len}")
        device = self.model.embed_tokens.weight.device
        new = torch.tensor([tokens[start:]], dtype=torch.int64, device=device)           # (1, L - start)
        positions = torch.arange(start, L, device=device)
        proposals = [int(self.model(new, positions, self.cache, last_only=True)[0, -1].argmax())]
        for _ in range(gamma - 1):
            last = torch.tensor([[proposals[-1]]], dtype=torch.int64, device=device)     # (1, 1)
            position = torch.tensor([self.cache.length], device=device)
            proposals.append(int(self.model(last, position, self.cache, last_only=True)[0, -1].argmax()))
        return proposals

    def rollback(self, length: int) -> None:
        """Keep at most ``length`` slots: ``cache.crop(min(cache.length, length))``.

        Raises: ArgumentTypeError / ValueError for a length that is not an int >= 0."""
        length = nonnegative_integer("length", length)
        self.cache.crop(min(self.cache.length, length))


class PromptLookupDraft:
    """Prompt lookup decoding (Saxena, 2023): propose what followed the last n-gram before.

    For n = max_ngram down to min_ngram: find the most recent *earlier* occurrence of the
    sequence's last n tokens (an occurrence starting before the suffix itself; it may overlap
    it) and propose the up to ``gamma`` tokens that followed it. The first n with a match wins;
    no match for any n proposes nothing (the step is then a plain decode step). No model, no
    cache: ``rollback`` has nothing to forget. (Saxena's reference takes the first match in the
    sequence; this one takes the most recent, usually the better guess in an edited passage.)

    Args:
        max_ngram, min_ngram: n-gram lengths tried, ints with 1 <= min_ngram <= max_ngram.

    Raises:
        ArgumentTypeError / ValueError: lengths that are not ints with 1 <= min_ngram <= max_ngram.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.min_ngram = positive_integer("min_ngram", min_ngram)
        self.max_ngram = integer("max_ngram", max_ngram, minimum=self.min_ngram, note="at least min_ngram")

    def propose(self, tokens: list[int], gamma: int) -> list[int]:
        """Up to ``gamma`` tokens that followed the most recent earlier match of the last n-gram.

        Args:
            tokens: the committed sequence, int ids >= 0 (a list, or a 1-D integer tensor).
            gamma: an int >= 0.

        Returns:
            a list of 0 .. gamma int token ids.

        Raises:
            ArgumentTypeError: gamma not an int; tokens not a sequence of ints (a str, floats, a
                float tensor: ``token_ids``).
            ValueError: gamma < 0; a negative id; a tensor that is not 1-D or is on the meta device.
        """
        gamma = nonnegative_integer("gamma", gamma)
        tokens = token_ids("tokens", tokens)
        L = len(tokens)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if n >= L:                                     # no room for an earlier occurrence
                continue
            suffix = tokens[L - n:]
            for start in range(L - n - 1, -1, -1):        # the suffix itself starts at L - n: skip it
                if tokens[start:start + n] == suffix:
                    return list(tokens[start + n:start + n + gamma])
        return []

    def rollback(self, length: int) -> None:
        """Nothing to forget: the proposals are recomputed from ``tokens`` at every step."""


def truncated_draft(model: Decoder, n_layers: int) -> Decoder:
    """A self-draft: the first ``n_layers`` blocks of ``model``, then its final norm and output head.

    The draft *shares* the target's modules (embedding, blocks, norm, head): no weight is
    copied, so it costs no memory, and its parameters are the target's tensors (same
    ``data_ptr``). It is a real ``Decoder`` whose config has ``n_layers = n_layers``: its
    ``new_cache`` builds a cache of that depth, and ``forward`` and ``generate_cached`` work on it
    as on any decoder. Skipping the later layers makes its guesses worse than the target's
    (LayerSkip, arXiv:2404.16710, trains the model so that early exits guess well; SmolLM2 is
    not trained so), which is why Lab 5 finds it correct but slower.

    Args:
        model: the target ``Decoder``.
        n_layers: blocks kept, an int in [1, model.config.n_layers].

    Returns:
        a ``Decoder`` in eval mode.

    Raises:
        ArgumentTypeError: model not a Decoder, n_layers not an int.
        ValueError: n_layers outside [1, model.config.n_layers].
    """
    instance("model", model, Decoder)
    n = integer("n_layers", n_layers, minimum=1, maximum=model.config.n_layers,
                note=f"the target has {model.config.n_layers} blocks")
    with torch.device("meta"):       # no storage: every module is replaced by the target's below
        draft = Decoder(dataclasses.replace(model.config, n_layers=n))
    draft.embed_tokens = model.embed_tokens
    draft.layers = nn.ModuleList(model.layers[:n])
    draft.norm = model.norm
    draft.lm_head = model.lm_head     # tied or not, exactly the target's head
    return draft.eval()


def check_same_vocabulary(target_tokenizer, draft_tokenizer) -> None:
    """Check that two tokenizers map the same strings to the same ids (a draft's token ids go
    straight to the target, so one shifted id turns every proposal into a rejection or, worse,
    into a wrong token fed to the draft).

    Args:
        target_tokenizer, draft_tokenizer: objects with ``get_vocab() -> dict[str, int]``
            (transformers tokenizers have it, added tokens included).

    Raises:
        ArgumentTypeError: a tokenizer without ``get_vocab``.
        ValueError: vocabularies of different sizes, or the first id (in increasing order) whose
            token differs, naming both tokens.
    """
    vocabularies = []
    for name, tokenizer in (("target_tokenizer", target_tokenizer), ("draft_tokenizer", draft_tokenizer)):
        if not callable(getattr(tokenizer, "get_vocab", None)):
            raise ArgumentTypeError(f"{name} must have get_vocab() (a transformers tokenizer), "
                                    f"got {type(tokenizer).__qualname__}")
        vocabularies.append(tokenizer.get_vocab())
    target, draft = vocabularies
    if len(target) != len(draft):
        raise ValueError(f"vocabularies differ in size: target {len(target)} tokens, draft {len(draft)}")
    target_by_id = {i: token for token, i in target.items()}
    draft_by_id = {i: token for token, i in draft.items()}
    for i in sorted(set(target_by_id) | set(draft_by_id)):
        if target_by_id.get(i) != draft_by_id.get(i):
            raise ValueError(f"vocabularies differ first at id {i}: target {target_by_id.get(i)!r}, "
                             f"draft {draft_by_id.get(i)!r}")


def noisy_copy(model: Decoder, scale: float, seed: int = 0) -> Decoder:
    """A stand-in for a trained draft on a random model: a copy of ``model`` whose every weight matrix
    gets Gaussian noise of ``scale`` times that matrix's standard deviation (norm weights unchanged).
    On the course's toy decoders, scale 0.1–0.2 agrees with the original on roughly 60–80 % of greedy
    tokens (measured on a few seeds, teacher-forced), enough for both rejections and accepted runs.

    Args:
        model: a ``Decoder``. scale: noise relative to each matrix's std, a number >= 0. seed: an int.
    Returns: a new ``Decoder`` (eval mode, no gradients); ``model`` is unchanged.
    Raises: ArgumentTypeError / ValueError for a model that is not a Decoder or has a weight on the meta
        device (named), a negative scale, a non-int seed.
    """
    from ..validation import nonnegative_number

    instance("model", model, Decoder)
    scale = nonnegative_number("scale", scale)
    gen = torch.Generator().manual_seed(integer("seed", seed))
    state = state_with_data(model, "model.")
    draft = Decoder(model.config)
    draft.load_state_dict(state)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    return draft.eval().requires_grad_(False)
