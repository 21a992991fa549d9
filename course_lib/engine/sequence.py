"""One request inside the serving engine: its tokens, its block table and what happened to it.

A sequence's *context* is the positions whose K/V are in the paged cache (``filled``); its *target*
is prompt + tokens generated so far, the positions to cache before its next token (Lab 3's
``scheduling.step`` vocabulary). Prefill and decode are the same thing here: a chunk of k new
positions; the chunk that brings ``filled`` to ``target`` yields the next token. The newest token
is never cached until the next chunk feeds it, so a decoding sequence is one position short of its
target, and a finished one has cached prompt + max_new_tokens - 1 positions (as ``generate_cached``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import torch

from ..cache.paged import PagedSequence
from ..scheduling.workload import RequestRecord

__all__ = ["Sequence", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"      # queued: new, or preempted (its cache freed)
    RUNNING = "running"      # admitted: holds blocks
    FINISHED = "finished"    # all its tokens emitted, blocks freed


@dataclass(eq=False)
class Sequence:
    """A request's state. Built by ``Engine.add_request`` (which checks the inputs).

    Attributes:
        rid: request id (an int, in the order requests were added).
        prompt_ids: the prompt's token ids (list of ints, at least one).
        max_new_tokens: tokens to generate (int >= 1).
        arrival: arrival time on the engine's clock (s).
        output_ids: generated token ids so far.
        token_times: engine clock (s) when each output token was emitted.
        logits: the float32 (vocab,) logits that chose each token, kept only when the engine was
            built with ``keep_logits=True`` (the batch-invariance tests compare them bitwise).
        preemptions: times it was preempted.
        reused: positions its admissions took from the prefix cache (summed over re-admissions).
        paged: its view of the block pool (block table, ``length`` = cached positions, token ids
            of those positions); empty while waiting.
        status: a ``SequenceStatus``.
    """

    rid: int
    prompt_ids: list[int]
    max_new_tokens: int
    arrival: float
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    preemptions: int = 0
    reused: int = 0
    paged: PagedSequence = field(default_factory=PagedSequence)
    status: SequenceStatus = SequenceStatus.WAITING

    @property
    def filled(self) -> int:
        """Cached positions (its context)."""
        return self.paged.length

    @property
    def target(self) -> int:
        """prompt + generated: the positions to cache before its next token."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        """prompt + generated token ids (a new list)."""
        return self.prompt_ids + self.output_ids

    @property
    def done(self) -> bool:
        return len(self.output_ids) == self.max_new_tokens

    def record(self) -> RequestRecord:
        """Lab 3's ``RequestRecord`` of this request (token times read-only float64)."""
        times = np.array(self.token_times, dtype=np.float64)
        times.flags.writeable = False
        return RequestRecord(self.arrival, len(self.prompt_ids), self.max_new_tokens, times, self.preemptions)
