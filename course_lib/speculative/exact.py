"""A language model whose distribution is known exactly, and the whole-sequence check it allows.

Speculative sampling promises that the *emitted sequence*, not only one token, follows the
target model (``docs/speculative_decoding.md#distribution-check``). With a real model that
cannot be checked: nobody can enumerate its continuations. ``MarkovLM`` is a tiny order-2 model
(the next token depends on the last two) over 2..16 tokens, so every continuation of n tokens
has an exactly computable probability (``continuation_probabilities``). ``sample_speculative``
runs the full speculative sampler on it (draft proposals drawn from q, one target pass scoring
gamma + 1 positions, ``verify_block``, bonus tokens, rollback of both states), vectorised over
many independent samples, and ``chi_square_test`` compares the emitted sequences with the
exact probabilities.

The model has the decoder's interface (``forward(input_ids, positions, cache, last_only)`` with
(B, T, V) float32 log-probabilities as logits, ``new_cache``), and its state is a
``TokenCache``: the token ids it has been fed, per row, with ``length`` / ``crop`` /
``max_len`` / ``clone`` as ``KVCache`` has them. For an n-gram model those ids *are* the whole
state, so "forgot to crop the cache" is the same fault here as in a transformer.

Sources: Leviathan, Kalman and Matias, ICML 2023, arXiv:2211.17192 (Algorithm 1); Chen et al.,
arXiv:2302.01318 (Algorithm 2); Pearson's chi-square goodness-of-fit test.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..validation import (ArgumentTypeError, boolean, fits_memory, instance, integer, integer_tensor, materialized,
                          nonnegative_integer, number, positive_integer, positive_number, token_ids)
from ..models.decoder import check_ids_and_positions
from .sampling import (ROW_SUM_TOLERANCE, accept_or_resample, sample_categorical, sampling_probs, verify_block)

__all__ = ["TokenCache", "MarkovLM", "continuation_probabilities", "sample_speculative", "chi_square_test"]

#: Largest number of continuations ``continuation_probabilities`` enumerates (V ** n).
MAX_CONTINUATIONS = 2 ** 22


class TokenCache:
    """The state of an n-gram model: the token ids each row has been fed.

    Same contract as ``course_lib.cache.contiguous.KVCache`` (``length``, ``crop``, ``max_len``,
    ``clone``, a ``WIRE_STATE``), extended to rows of different lengths, which the vectorised
    sampler needs (each of its rows has committed a different number of tokens).

    Args:
        batch: rows, an int >= 1. max_len: slots per row, an int >= 1.

    Attributes:
        tokens: (batch, max_len) int64; row b's state is tokens[b, :lengths[b]].
        lengths: (batch,) int64, the filled slots of each row.

    Raises: ArgumentTypeError / ValueError for sizes that are not ints >= 1.
    """

    WIRE_STATE = ("tokens", "lengths")

    def __init__(self, batch: int, max_len: int) -> None:
        batch = positive_integer("TokenCache batch", batch)
        max_len = positive_integer("TokenCache max_len", max_len)
        fits_memory("TokenCache batch * max_len", batch * max_len, 8 * batch * max_len, what="int64 token slots")
        self.tokens = torch.zeros(batch, max_len, dtype=torch.int64)
        self.lengths = torch.zeros(batch, dtype=torch.int64)

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_len(self) -> int:
        return self.tokens.shape[1]

    @property
    def length(self) -> int:
        """Filled slots, when every row holds the same number (KVCache's contract).

        Raises: ValueError when the rows differ (read ``lengths`` then)."""
        low, high = int(self.lengths.min()), int(self.lengths.max())
        if low != high:
            raise ValueError(f"the rows of this TokenCache hold different lengths ({low} to {high}); read .lengths")
        return low

    @length.setter
    def length(self, value: int) -> None:
        self.lengths.fill_(integer("TokenCache.length", value, minimum=0, maximum=self.max_len, note="the slots"))

    def _rows(self, rows) -> torch.Tensor:
        if rows is None:
            return torch.arange(self.batch)
        integer_tensor("rows", rows, ranks=(1,), layout="(R,)", dtype=torch.int64, minimum=0,
                       maximum=self.batch - 1, note=f"row indices; batch {self.batch}")
        if rows.unique().numel() != rows.numel():
            raise ValueError("rows must not repeat a row")
        return rows

    def crop(self, length, rows: torch.Tensor | None = None) -> None:
        """Forget every slot from ``length`` on (a rollback to a prefix).

        Args:
            length: an int (every selected row), or an (R,) int64 tensor, one length per row.
            rows: (R,) int64 distinct row indices, or None for every row.

        Raises:
            ArgumentTypeError: length neither an int nor an int64 tensor.
            ValueError: a length below 0 or above the row's filled slots (crop never un-forgets).
        """
        rows = self._rows(rows)
        current = self.lengths[rows]
        if isinstance(length, torch.Tensor):
            integer_tensor("crop length", length, ranks=(1,), layout="(R,)", dtype=torch.int64, minimum=0)
            if length.shape[0] != rows.numel():
                raise ValueError(f"crop length must hold one length per row, {rows.numel()}, got {length.shape[0]}")
            if bool((length > current).any()):
                row = int(rows[(length > current).nonzero()[0, 0]])
                raise ValueError(f"crop length for row {row} must be at most its filled slots "
                                 f"{int(self.lengths[row])}, got {int(length[(rows == row).nonzero()[0, 0]])}")
            self.lengths[rows] = length
        else:
            length = integer("crop length", length, minimum=0, maximum=int(current.min()) if rows.numel() else 0,
                             note="at most the filled slots")
            self.lengths[rows] = length

    def extend(self, ids: torch.Tensor, counts: torch.Tensor | None = None,
               rows: torch.Tensor | None = None) -> None:
        """Feed tokens: row rows[r] appends ids[r, :counts[r]].

        Args:
            ids: (R, T) int64 token ids (>= 0). counts: (R,) int64 in [0, T], or None for all T.
            rows: (R,) int64 distinct row indices, or None for every row (R = batch).

        Raises: ArgumentTypeError / ValueError for bad shapes or values; ValueError "TokenCache
            overflow" when a row would pass max_len.
        """
        rows = self._rows(rows)
        integer_tensor("ids", ids, ranks=(2,), layout="(R, T)", dtype=torch.int64, minimum=0)
        R, T = ids.shape
        if R != rows.numel():
            raise ValueError(f"ids must have one row per selected row, {rows.numel()}, got {R}")
        if counts is None:
            counts = torch.full((R,), T, dtype=torch.int64)
        else:
            integer_tensor("counts", counts, ranks=(1,), layout="(R,)", dtype=torch.int64, minimum=0, maximum=T)
            if counts.shape[0] != R:
                raise ValueError(f"counts must have one entry per row, {R}, got {counts.shape[0]}")
        start = self.lengths[rows]
        if R and int((start + counts).max()) > self.max_len:
            raise ValueError(f"TokenCache overflow: a row would hold {int((start + counts).max())} tokens "
                             f"> max_len {self.max_len}")
        r, c = (torch.arange(T) < counts.unsqueeze(1)).nonzero(as_tuple=True)
        self.tokens[rows[r], start[r] + c] = ids[r, c]
        self.lengths[rows] = start + counts

    def clone(self) -> "TokenCache":
        """An independent copy."""
        twin = copy.copy(self)
        twin.tokens, twin.lengths = self.tokens.clone(), self.lengths.clone()
        return twin


class MarkovLM(nn.Module):
    """An exact order-2 language model: P(next | all before) = P(next | the last two tokens).

    A context shorter than two tokens is padded on the left with a start state (index V in the
    table), so the first token of an empty context has its own distribution and so on.

    Args:
        probabilities: (V + 1, V + 1, V) floating tensor, V in [2, 16]; row [a, b] is the
            distribution of the next token after the tokens a, b (a or b = V: the start state).
            Every row must be a distribution (entries >= 0 summing to 1 within 1e-6), the unused
            ones too. Stored as float64.
        max_seq_len: the largest position + 1 that ``forward`` accepts (positions do not change
            the probabilities; they are checked as ``Decoder.forward`` checks them).

    Raises:
        ArgumentTypeError: probabilities not a floating tensor.
        ValueError: another shape, V outside [2, 16], a row that is not a distribution; a tensor
            on the meta device.
    """

    def __init__(self, probabilities: torch.Tensor, max_seq_len: int = 4096) -> None:
        super().__init__()
        instance("probabilities", probabilities, torch.Tensor)
        materialized("probabilities", probabilities)
        if not probabilities.dtype.is_floating_point:
            raise ArgumentTypeError(f"probabilities must be a floating tensor, got dtype {probabilities.dtype}")
        if probabilities.dim() != 3 or probabilities.shape[0] != probabilities.shape[1] or \
                probabilities.shape[0] != probabilities.shape[2] + 1:
            raise ValueError(f"probabilities must have shape (V + 1, V + 1, V), got {tuple(probabilities.shape)}")
        V = integer("vocab_size", probabilities.shape[2], minimum=2, maximum=16,
                    note="a tiny vocabulary: continuations are enumerated exactly, V ** n of them")
        table = probabilities.detach().to(torch.float64).clone()
        bad = ~(((table.sum(-1) - 1).abs() <= ROW_SUM_TOLERANCE) & (table >= 0).all(-1))
        if bool(bad.any()):
            a, b = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"probabilities[{a}, {b}] is not a distribution (entries >= 0 summing to 1)")
        self.register_buffer("probabilities", table)
        self.vocab_size = V
        self.max_seq_len = positive_integer("max_seq_len", max_seq_len)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def random(cls, vocab_size: int = 6, seed: int = 0, concentration: float = 1.0) -> "MarkovLM":
        """Every row drawn from a symmetric Dirichlet(concentration) (numpy's generator, seeded).

        Args: vocab_size: an int in [2, 16]. seed: an int >= 0. concentration: a number > 0;
            small values give peaked rows (a confident model), large ones near-uniform rows."""
        V = integer("vocab_size", vocab_size, minimum=2, maximum=16)
        seed = nonnegative_integer("seed", seed)
        concentration = positive_number("concentration", concentration)
        rows = np.random.default_rng(seed).dirichlet(np.full(V, float(concentration)), size=(V + 1, V + 1))
        return cls(torch.from_numpy(rows))

    @classmethod
    def perturbed(cls, other: "MarkovLM", strength: float, seed: int = 0) -> "MarkovLM":
        """A draft that differs from ``other`` but overlaps it: every row is the mixture
        (1 - strength) * other's row + strength * a random Dirichlet(1) row.

        Its acceptance chance at a context is 1 - strength * TV(other's row, the random row).

        Args: other: a MarkovLM. strength: a number in [0, 1] (0: identical). seed: an int >= 0."""
        instance("other", other, MarkovLM)
        strength = number("strength", strength, minimum=0, maximum=1)
        noise = cls.random(other.vocab_size, seed).probabilities
        return cls((1 - strength) * other.probabilities + strength * noise, other.max_seq_len)

    # -- the model ----------------------------------------------------------------------
    def _last_two(self, contexts: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the tokens at lengths - 2 and lengths - 1 (the start state V where there is none)."""
        padded = torch.cat([contexts.new_full((contexts.shape[0], 2), self.vocab_size), contexts], 1)
        return (padded.gather(1, lengths.unsqueeze(1)).squeeze(1),
                padded.gather(1, (lengths + 1).unsqueeze(1)).squeeze(1))

    def next_probs(self, contexts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The next-token distribution after each row's context, vectorised over rows.

        Args:
            contexts: (N, L) int64 token ids in [0, V - 1]; row i's context is contexts[i, :lengths[i]]
                (what lies beyond is ignored, but must still be valid ids).
            lengths: (N,) int64 in [0, L].

        Returns: (N, V) float64.

        Raises: ArgumentTypeError / ValueError for tensors of another dtype, rank, size or range.
        """
        V = self.vocab_size
        integer_tensor("contexts", contexts, ranks=(2,), layout="(N, L)", dtype=torch.int64, minimum=0,
                       maximum=V - 1, note=f"token ids; vocab_size {V}")
        integer_tensor("lengths", lengths, ranks=(1,), layout="(N,)", dtype=torch.int64, minimum=0,
                       maximum=contexts.shape[1], note=f"contexts hold {contexts.shape[1]} tokens")
        if lengths.shape[0] != contexts.shape[0]:
            raise ValueError(f"lengths must have one entry per context, {contexts.shape[0]}, got {lengths.shape[0]}")
        a, b = self._last_two(contexts, lengths)
        return self.probabilities[a, b]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: TokenCache | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Log-probabilities of the next token after each of T new tokens, as ``Decoder.forward``.

        Args:
            input_ids: (B, T) int64 ids in [0, V - 1], B, T >= 1.
            positions: (T,) or (B, T) int64 in [0, max_seq_len - 1]; checked, then unused (an
                order-2 model does not depend on positions).
            cache: a TokenCache with batch B, or None. With it, row b's context is its cached
                tokens followed by the new ones, and the new ones are appended (rows may hold
                different lengths). Without it, the context starts empty (the start state).
            last_only: (bool) return the last position only, (B, 1, V).

        Returns: (B, T, V) float32 log-probabilities (or (B, 1, V)).

        Raises: ArgumentTypeError / ValueError as ``Decoder.forward``: dtypes, ranks, an empty
            input, ids outside the vocabulary, positions out of range or of another length or
            batch, a cache that is not a TokenCache or of another batch, "TokenCache overflow".
        """
        V = self.vocab_size
        B, T = check_ids_and_positions(input_ids, positions, vocab_size=V, max_seq_len=self.max_seq_len)
        boolean("last_only", last_only)
        last = torch.full((B,), V, dtype=torch.int64)  # the token before input_ids[:, 0] (start state)
        if cache is not None:
            instance("cache", cache, TokenCache)
            if cache.batch != B:
                raise ValueError(f"cache batch is {cache.batch} but the model needs {B}")
            last = self._last_two(cache.tokens, cache.lengths)[1]
            cache.extend(input_ids)
        before = torch.cat([last.unsqueeze(1), input_ids], 1)  # position t's last two: before[t], before[t + 1]
        logp = self.probabilities[before[:, :T], before[:, 1:]].log().to(torch.float32)
        return logp[:, -1:] if last_only else logp

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> TokenCache:
        """An empty TokenCache: ``batch`` rows of ``max_len`` slots (None: max_seq_len)."""
        return TokenCache(batch, self.max_seq_len if max_len is None else max_len)


# -- exact probabilities -------------------------------------------------------------------
def continuation_probabilities(model: MarkovLM, prompt, n: int, *, temperature: float = 1.0,
                               top_k: int | None = None) -> torch.Tensor:
    """The exact probability of every continuation of ``n`` tokens after ``prompt``.

    Continuations are in lexicographic order, which is the base-V number they spell: entry
    sum_j c_j * V ** (n - 1 - j) is continuation (c_0, ..., c_{n-1}). With a temperature or a
    top-k, each next-token distribution is ``sampling_probs`` of the model's log-probabilities,
    what a sampler with those settings draws from.

    Args:
        model: a MarkovLM. prompt: 1..max_seq_len token ids (list or 1-D tensor).
        n: an int >= 1 with V ** n <= MAX_CONTINUATIONS. temperature, top_k: as sampling_probs.

    Returns: (V ** n,) float64, summing to 1.

    Raises: ArgumentTypeError / ValueError for a bad model, prompt, n, temperature or top_k.
    """
    instance("model", model, MarkovLM)
    V = model.vocab_size
    prompt = token_ids("prompt", prompt, vocab_size=V)
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    n = positive_integer("n", n, maximum=int(math.log(MAX_CONTINUATIONS) / math.log(V) + 1e-9),
                         note=f"V ** n continuations, at most {MAX_CONTINUATIONS}; V = {V}")
    contexts = torch.tensor([prompt], dtype=torch.int64)
    probs = torch.ones(1, dtype=torch.float64)
    for step in range(n):
        R = contexts.shape[0]
        nxt = sampling_probs(model.next_probs(contexts, torch.full((R,), len(prompt) + step)).log(), temperature, top_k)
        probs = (probs.unsqueeze(1) * nxt).reshape(-1)  # index r * V + t: prefix r, then token t
        contexts = torch.cat([contexts.repeat_interleave(V, 0), torch.arange(V).repeat(R).unsqueeze(1)], 1)
    return probs


# -- the speculative sampler ---------------------------------------------------------------
def _feed_committed(cache: TokenCache, rows: torch.Tensor, sequences: torch.Tensor, upto: torch.Tensor) -> None:
    """Feed row r the committed tokens it lacks: sequences[r, cache.lengths[r] : upto[r]]."""
    have = cache.lengths[rows]
    counts = (upto - have).clamp_min(0)
    width = int(counts.max()) if counts.numel() else 0
    if width:
        index = (have.unsqueeze(1) + torch.arange(width)).clamp_max(sequences.shape[1] - 1)
        cache.extend(sequences[rows].gather(1, index), counts, rows)


def _draw_seed(generator: torch.Generator) -> int:
    """A fresh seed from the sampler's generator: one independent stream per draw."""
    return int(torch.randint(0, 2 ** 62, (), generator=generator))


def _check_verify_output(out, R: int, gamma: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ArgumentTypeError(f"verify must return (n_accepted (R,) int64, next_token (R,) int64), "
                                f"got {type(out).__qualname__}")
    n_accepted, next_token = out
    integer_tensor("verify's n_accepted", n_accepted, ranks=(1,), layout="(R,)", dtype=torch.int64, minimum=0,
                   maximum=gamma)
    integer_tensor("verify's next_token", next_token, ranks=(1,), layout="(R,)", dtype=torch.int64, minimum=0,
                   maximum=V - 1)
    if n_accepted.shape[0] != R or next_token.shape[0] != R:
        raise ValueError(f"verify must return {R} values each, got {n_accepted.shape[0]} and {next_token.shape[0]}")
    return n_accepted, next_token


@torch.no_grad()
def sample_speculative(target: MarkovLM, draft: MarkovLM, prompt, n_tokens: int, gamma: int, n_samples: int,
                       seed: int, *, accept=accept_or_resample, verify=verify_block,
                       propose: Callable[[torch.Tensor, int], torch.Tensor] = sample_categorical,
                       temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """``n_samples`` independent continuations of ``prompt`` by speculative sampling.

    Every row runs its own sequence with its own committed length L (prompt + emitted so far);
    each iteration handles every unfinished row at once:

    1. draft: its cache is fed the committed tokens it lacks, then it proposes gamma tokens, each
       ``propose``d from q = sampling_probs(draft's log-probs, temperature, top_k), q recorded;
    2. target: its cache (holding the committed tokens but the newest) is fed the newest one and
       the gamma proposals: p at gamma + 1 positions (the same sampling_probs);
    3. ``verify(p, q, drafted, seed, accept=accept)``: n_accepted k and the next token;
    4. the row commits drafted[:k] and the next token (k + 1 tokens, L -> L + k + 1);
    5. rollback: target cache cropped to L + k (all committed but the newest), draft cache to
       min(its length, L + k) (the accepted proposals stay; the rejected ones go).

    A row stops once it has n_tokens; extra tokens of its last iteration are dropped (the first
    n_tokens of a sequence do not depend on what follows, so truncating keeps it exact).

    Pluggable, and why:
        accept: accept_or_resample's signature; the grader plugs in the learner's. It may run in
            another process: it is called once per drafted position per iteration, on all the rows
            still undecided at that position, never once per row.
        verify: verify_block's signature; tests pass faulty ones (a bonus drawn from the wrong
            position) to show the distribution test catches faults in the loop, not only in accept.
        propose: (q (R, V) float64, seed) -> (R,) int64 tokens; sample_categorical by default.
            The result is exact only if the proposals are drawn from the q that verify gets;
            tests pass argmax (a greedy draft scored with its softmax q) to show it is not.
        The models' states are their TokenCaches (``new_cache``): a test subclass whose cache
        ignores ``crop`` reproduces "not rolled back".

    Args:
        target, draft: MarkovLMs with the same vocab_size.
        prompt: 1 or more token ids (list or 1-D tensor). n_tokens: an int >= 1.
        gamma: drafted tokens per iteration, an int >= 0. n_samples: rows, an int >= 1.
        seed: an int in [0, 2**64 - 1]; every draw (proposals, verify) gets its own seed from
            ``torch.Generator().manual_seed(seed)``.
        temperature, top_k: as sampling_probs, applied to both models.

    Returns: (n_samples, n_tokens) int64 emitted tokens.

    Raises:
        ArgumentTypeError / ValueError: bad models (or different vocabularies), prompt, sizes,
            seed, temperature, top_k; a hook that is not callable or returns the wrong thing.
    """
    instance("target", target, MarkovLM)
    instance("draft", draft, MarkovLM)
    V = target.vocab_size
    if draft.vocab_size != V:
        raise ValueError(f"the draft's vocab_size {draft.vocab_size} is not the target's {V}")
    prompt = token_ids("prompt", prompt, vocab_size=V)
    if not prompt:
        raise ValueError("prompt must hold at least one token (the target is fed the newest committed token)")
    n_tokens = positive_integer("n_tokens", n_tokens)
    gamma = nonnegative_integer("gamma", gamma)
    n_samples = positive_integer("n_samples", n_samples)
    generator = torch.Generator().manual_seed(integer("seed", seed, minimum=0, maximum=2 ** 64 - 1))
    for name, hook in (("accept", accept), ("verify", verify), ("propose", propose)):
        if not callable(hook):
            raise ArgumentTypeError(f"{name} must be callable, got {type(hook).__qualname__}")
    sampling_probs(torch.zeros(V), temperature, top_k)  # checks temperature and top_k once

    P = len(prompt)
    goal = P + n_tokens
    capacity = goal + gamma  # the longest a row gets: L <= goal - 1, plus k + 1 <= gamma + 1
    fits_memory("(n_samples, prompt + n_tokens + gamma)", (n_samples, capacity), 3 * 8 * n_samples * capacity,
                what=f"the emitted tokens and both models' token caches, int64 (n_samples, {capacity})")
    sequences = torch.zeros(n_samples, capacity, dtype=torch.int64)
    sequences[:, :P] = torch.tensor(prompt)
    lengths = torch.full((n_samples,), P, dtype=torch.int64)
    target_cache = target.new_cache(n_samples, capacity)
    draft_cache = draft.new_cache(n_samples, capacity)
    if P > 1:  # prefill: each model holds the prompt but its newest token
        target_cache.extend(sequences[:, :P - 1])
        draft_cache.extend(sequences[:, :P - 1])
    offsets = torch.arange(gamma)

    while True:
        rows = (lengths < goal).nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        L = lengths[rows]
        # 1. draft
        _feed_committed(draft_cache, rows, sequences, L)
        qs, drafted = [], []
        for _ in range(gamma):
            q = sampling_probs(draft.next_probs(draft_cache.tokens[rows], draft_cache.lengths[rows]).log(),
                               temperature, top_k)
            x = propose(q, _draw_seed(generator))
            integer_tensor("propose's tokens", x, ranks=(1,), layout="(R,)", dtype=torch.int64, minimum=0,
                           maximum=V - 1)
            draft_cache.extend(x.unsqueeze(1), rows=rows)
            qs.append(q)
            drafted.append(x)
        q = torch.stack(qs, 1) if gamma else torch.zeros(rows.numel(), 0, V, dtype=torch.float64)
        drafted = torch.stack(drafted, 1) if gamma else torch.zeros(rows.numel(), 0, dtype=torch.int64)
        # 2. target: one pass over [newest committed, d_1 .. d_gamma]
        before = target_cache.lengths[rows]
        target_cache.extend(torch.cat([sequences[rows, L - 1].unsqueeze(1), drafted], 1), rows=rows)
        context = target_cache.tokens[rows]
        p = torch.stack([sampling_probs(target.next_probs(context, before + 1 + j).log(), temperature, top_k)
                         for j in range(gamma + 1)], 1)
        # 3. verify
        k, next_token = _check_verify_output(verify(p, q, drafted, _draw_seed(generator), accept=accept),
                                             rows.numel(), gamma, V)
        # 4. commit drafted[:k] and the next token
        sequences[rows.unsqueeze(1), L.unsqueeze(1) + offsets] = drafted
        sequences[rows, L + k] = next_token
        lengths[rows] = L + k + 1
        # 5. rollback
        target_cache.crop(L + k, rows)
        draft_cache.crop(torch.minimum(draft_cache.lengths[rows], L + k), rows)
    return sequences[:, P:goal].clone()


# -- the test ------------------------------------------------------------------------------
def chi_square_test(samples: torch.Tensor, probabilities: torch.Tensor, *, min_expected: float = 5.0
                    ) -> tuple[float, int, float]:
    """Pearson's chi-square goodness-of-fit test of sequences against exact probabilities.

    Each sample (a row of n tokens) is the cell sum_j c_j * V ** (n - 1 - j), the order of
    ``continuation_probabilities``. Cells whose expected count S * probability is below
    ``min_expected`` are pooled into one cell (the chi-square approximation needs expected counts
    of about 5 or more); if that pool itself expects fewer than ``min_expected``, the next
    smallest cells join it until it does. statistic = sum (observed - expected)**2 / expected over
    the cells, dof = cells - 1, p-value = P(chi2_dof >= statistic) = gammaincc(dof / 2, statistic / 2)
    (torch.special, float64). A sample in a cell of probability 0 gives statistic inf, p-value 0.

    Args:
        samples: (S, n) int64 tokens in [0, V - 1], S >= 1.
        probabilities: (V ** n,) floating, >= 0, summing to 1 within 1e-6.
        min_expected: a number > 0.

    Returns: (statistic: float, dof: int, p_value: float).

    Raises:
        ArgumentTypeError / ValueError: bad tensors (a tensor on the meta device included); a
            length that is not V ** n for an int V;
            fewer than two cells after pooling (nothing to test).
    """
    integer_tensor("samples", samples, ranks=(2,), layout="(S, n)", dtype=torch.int64, minimum=0)
    S, n = samples.shape
    if S == 0 or n == 0:
        raise ValueError(f"samples must hold at least one sequence of at least one token, got {tuple(samples.shape)}")
    instance("probabilities", probabilities, torch.Tensor)
    materialized("probabilities", probabilities)
    if not probabilities.dtype.is_floating_point or probabilities.dim() != 1:
        raise ValueError(f"probabilities must be a 1-D floating tensor, got dtype {probabilities.dtype} and shape "
                         f"{tuple(probabilities.shape)}")
    probs = probabilities.to(torch.float64)
    V = round(probs.shape[0] ** (1 / n))
    if V < 1 or V ** n != probs.shape[0]:
        raise ValueError(f"probabilities must have V ** n entries for samples of n = {n} tokens, got {probs.shape[0]}")
    if bool((probs < 0).any()) or not abs(float(probs.sum()) - 1) <= ROW_SUM_TOLERANCE:
        raise ValueError("probabilities must be >= 0 and sum to 1")
    min_expected = positive_number("min_expected", min_expected)
    integer_tensor("samples", samples, dtype=torch.int64, maximum=V - 1, note=f"V = {V}")

    cell = (samples * V ** torch.arange(n - 1, -1, -1)).sum(1)
    observed = torch.bincount(cell, minlength=V ** n).to(torch.float64)
    if bool(((probs == 0) & (observed > 0)).any()):
        return math.inf, int((probs > 0).sum()) - 1, 0.0
    expected = S * probs
    order = torch.argsort(expected)
    small = expected[order] < min_expected
    n_pooled = int(small.sum())
    cumulative = expected[order].cumsum(0)
    if n_pooled and float(cumulative[n_pooled - 1]) < min_expected:  # grow the pool to min_expected
        n_pooled = min(int((cumulative < min_expected).sum()) + 1, order.numel())
    keep, pool = order[n_pooled:], order[:n_pooled]
    cells_observed = torch.cat([observed[keep], observed[pool].sum().reshape(1)]) if n_pooled else observed[keep]
    cells_expected = torch.cat([expected[keep], expected[pool].sum().reshape(1)]) if n_pooled else expected[keep]
    positive = cells_expected > 0
    cells_observed, cells_expected = cells_observed[positive], cells_expected[positive]
    dof = cells_expected.numel() - 1
    if dof < 1:
        raise ValueError(f"chi_square_test needs at least two cells after pooling cells expecting fewer than "
                         f"{min_expected} samples; got {dof + 1} (draw more samples)")
    statistic = float(((cells_observed - cells_expected) ** 2 / cells_expected).sum())
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return statistic, dof, p_value
