"""The serving engine: continuous batching of the reference decoder over a paged KV cache.

``Engine.step`` is one iteration: requests that have arrived join the queue, the scheduler
(``scheduler.py``: Lab 3's chunked step) decides admissions, preemptions and chunks, the block
manager (``block_manager.py``: Lab 2's block allocator) reserves their slots, the model runner
(``runner.py``) computes them in one batched forward, and every chunk that completes its
sequence's target yields one greedy token. ``Engine.run(trace)`` serves a whole trace and returns
Lab 3's ``RequestRecord`` per request, so ``scheduling.metrics`` reads an engine run and a
simulated run the same way.

Time: the engine keeps a clock in seconds. Each iteration advances it by the iteration's measured
wall time (scheduling, block bookkeeping and the forward, from ``timer``); when nothing runs or
waits it jumps to the next arrival instead of sleeping, as the Lab 3 simulator does. A token is
stamped with the clock at the end of the iteration that produced it. TTFT, ITL and the rest are
therefore measured iteration times laid end to end on the trace's arrival times.

Contract (tests/test_engine.py): every request's tokens equal ``generate_cached`` on its prompt
alone, whatever runs beside it, across preemptions and prefix hits; with
``model.batch_invariant_mode()`` on, its logits are bitwise those of the solo run; after a trace
every block is free again.
"""
from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence as Seq

import torch

from ..models.config import weight_bytes
from ..models.decoder import Decoder, state_with_data
from ..scheduling.step import CHUNK_BUDGET, RequestTooLargeError, admit_limit
from ..scheduling.workload import RequestRecord
from ..validation import (ArgumentTypeError, boolean, fits_memory, instance, integer, number,
                          positive_integer, token_ids)
from .block_manager import BlockManager
from .runner import ChunkInput, ModelRunner
from .scheduler import Scheduler, scheduling_deployment
from .sequence import Sequence

__all__ = ["Engine", "StepReport", "TraceRequest", "MAX_RUNNING"]

#: Default most sequences running at once (the engine's; Lab 3's simulator uses 256 on a big GPU).
MAX_RUNNING: int = 16


@dataclass(frozen=True)
class TraceRequest:
    """One request of an engine trace: arrival (s, >= 0), prompt token ids, max_new_tokens (>= 1)."""

    arrival: float
    prompt_ids: list[int]
    max_new_tokens: int


@dataclass(frozen=True)
class StepReport:
    """What one iteration did.

    Attributes:
        start, duration: engine clock at its start and its measured wall time (s).
        chunks: (k, c) per chunk, k new positions on c cached ones, in admission order: what Lab 3's
            ``iteration_time`` prices (``calibrate.py`` fits the cost model to these).
        rids: the request id of each chunk.
        emitted: (rid, token id) for each token it yielded.
        admitted, preempted: request ids admitted and preempted in this iteration.
        free_blocks: free blocks after it.
    """

    start: float
    duration: float
    chunks: tuple[tuple[int, int], ...]
    rids: tuple[int, ...]
    emitted: tuple[tuple[int, int], ...]
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    free_blocks: int

    @property
    def tokens(self) -> int:
        """Positions computed (sum of k): at most the engine's budget."""
        return sum(k for k, _ in self.chunks)


class Engine:
    """A small continuous-batching engine on the course's decoder, paged cache and scheduler.

    Args:
        model: a ``Decoder`` (the toy model or SmolLM2; any dtype or device its weights are on).
        num_blocks: physical KV blocks (int > max_running); each holds ``block_size`` positions of
            every layer: 2 * n_layers * n_kv_heads * head_dim * block_size * element size bytes.
        block_size: positions per block (int >= 1; 16 as Lab 2 and vLLM).
        budget: positions one iteration may compute, decodes included (int >= 1; Lab 3's 256), or
            None for no limit (whole prompts at once: Lab 3's paged policy).
        max_running: most sequences running at once (int >= 1).
        keep_logits: keep the logits that chose each token on its ``Sequence`` (bool).
        audit: check the block accounting after every iteration (``BlockManager.audit``; bool).
        timer: the clock read around each iteration (``time.perf_counter``; tests pass a fake one to
            make the schedule reproducible).
        decode_attention: as ``ModelRunner``.
        prefix_cache: ``"hash"`` (the allocator's chained block hashes: blocks found while a live sequence
            holds them) or ``"radix"`` (a radix tree that keeps finished requests' full blocks until it
            must evict them); ``block_manager.py`` describes both. The contract is the same.

    Attributes:
        capacity: cached positions the scheduler plans for: (num_blocks - max_running) * block_size,
            so that whole blocks always suffice (``scheduler.py``).
        deployment: the Lab 3 ``Deployment`` of this engine: its model's weight bytes, its KV budget
            (``capacity``) and a placeholder device (``calibrate.fit_device`` fits a real one).
        clock: the engine's time (s). history: a ``StepReport`` per iteration run.
        sequences: every request added, by request id.

    Raises:
        ArgumentTypeError / ValueError naming the argument: a model that is not a Decoder, a size that
        is not a positive int, num_blocks <= max_running or so many that their K/V would not fit in the
        memory of the model's device (``validation.fits_memory``; checked before anything is
        allocated), a decode_attention that is not callable, a prefix_cache other than "hash" or "radix".
    """

    def __init__(self, model: Decoder, num_blocks: int, block_size: int = 16, budget: int | None = CHUNK_BUDGET,
                 max_running: int = MAX_RUNNING, *, keep_logits: bool = False, audit: bool = False,
                 timer: Callable[[], float] = time.perf_counter, decode_attention: Callable | None = None,
                 prefix_cache: str = "hash") -> None:
        self.model = instance("model", model, Decoder)
        state_with_data(model, "the model's ")
        block_size = positive_integer("block_size", block_size)
        max_running = positive_integer("max_running", max_running)
        num_blocks = integer("num_blocks", num_blocks, minimum=max_running + 1,
                             note="more blocks than max_running: each running sequence may leave one block "
                                  "partly empty")
        c = model.config
        weight = model.embed_tokens.weight
        fits_memory("(num_blocks, block_size)", (num_blocks, block_size),
                    num_blocks * block_size * c.kv_bytes_per_token(weight.element_size()), device=weight.device,
                    what=f"the K/V blocks of {c.n_layers} layers (num_blocks * block_size * the config's "
                         "kv_bytes_per_token)")
        if decode_attention is not None and not callable(decode_attention):
            raise ArgumentTypeError(f"decode_attention must be None or a callable with the arguments of "
                                    f"paged_decode_attention_unchecked, got {type(decode_attention).__qualname__}")
        if budget is not None:
            budget = positive_integer("budget", budget, note="None for no limit")
        self.keep_logits = boolean("keep_logits", keep_logits)
        self.audit = boolean("audit", audit)
        if not callable(timer):
            raise TypeError(f"timer must be a callable returning seconds, got {type(timer).__qualname__}")
        self.timer = timer
        self.budget, self.max_running, self.block_size, self.num_blocks = budget, max_running, block_size, num_blocks
        self.capacity = (num_blocks - max_running) * block_size
        self.deployment = scheduling_deployment(model.config, self.capacity, weight_bytes=weight_bytes(model),
                                                kv_element_bytes=model.embed_tokens.weight.element_size())
        self.blocks = BlockManager(num_blocks, block_size, prefix_cache)
        self.scheduler = Scheduler(self.blocks, self.deployment, budget, max_running)
        self.runner = ModelRunner(model, num_blocks, block_size, decode_attention)
        self.clock = 0.0
        self.history: list[StepReport] = []
        self.sequences: list[Sequence] = []
        self._pending: list[tuple[float, int]] = []        # (arrival, rid) not yet arrived, sorted

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt_ids, max_new_tokens: int, arrival: float | None = None) -> int:
        """Queue a request; returns its request id (0, 1, ... in the order added).

        Args:
            prompt_ids: token ids (a sequence of ints or a 1-D integer tensor), at least one, in the
                model's vocabulary.
            max_new_tokens: tokens to generate greedily (int >= 1).
            arrival: when it arrives on the engine's clock (s, at least the clock's current time, which
                starts at 0); None means now. A later arrival waits outside the queue until the clock
                reaches it.

        Raises:
            ArgumentTypeError / ValueError: ids that are not ints in the vocabulary, an empty prompt,
                max_new_tokens < 1 or past the model's max_seq_len, an arrival before the engine's clock.
            RequestTooLargeError (a ValueError): prompt + max_new_tokens - 1 positions do not fit the
                scheduler's KV capacity (the request could never finish); nothing is queued.
        """
        c = self.model.config
        prompt = token_ids("prompt_ids", prompt_ids, vocab_size=c.vocab_size)
        if not prompt:
            raise ValueError("prompt_ids must hold at least one token")
        if len(prompt) > c.max_seq_len:
            raise ValueError(f"prompt_ids holds {len(prompt)} tokens, more than the model's max_seq_len "
                             f"{c.max_seq_len}")
        n = integer("max_new_tokens", max_new_tokens, minimum=1, maximum=c.max_seq_len - len(prompt) + 1,
                    note=f"a prompt of {len(prompt)} tokens; max_seq_len {c.max_seq_len}")
        if arrival is None:
            arrival = self.clock
        else:
            arrival = float(number("arrival", arrival, minimum=self.clock,
                                   note=f"seconds on the engine's clock, which is at {self.clock:g} s: a request "
                                        "cannot arrive before now, its TTFT would count time before it existed; a "
                                        "new Engine starts at 0, or add engine.clock to a trace's arrivals"))
        positions = len(prompt) + n - 1
        limit = admit_limit(self.deployment)
        if positions > limit:
            raise RequestTooLargeError(
                f"a request of {len(prompt)} prompt tokens and {n} new tokens caches up to {positions} positions, "
                f"more than this engine admits ({limit}: 0.99 of (num_blocks {self.num_blocks} - max_running "
                f"{self.max_running}) * block_size {self.block_size}); build the engine with more blocks")
        seq = Sequence(len(self.sequences), prompt, n, arrival)
        self.sequences.append(seq)
        bisect.insort(self._pending, (arrival, seq.rid))
        return seq.rid

    @property
    def has_work(self) -> bool:
        """True while some request has not finished (pending, waiting or running)."""
        return bool(self._pending or self.scheduler.waiting or self.scheduler.running)

    def _arrive(self) -> None:
        while self._pending and self._pending[0][0] <= self.clock:
            _, rid = self._pending.pop(0)
            self.scheduler.add(self.sequences[rid])

    # -- one iteration ----------------------------------------------------------------------------
    def step(self) -> StepReport | None:
        """Run one iteration (module docstring); None when no request is left.

        Raises: RuntimeError if the block accounting breaks (``audit=True``), which is a bug; TypeError /
            ValueError if the timer returns a non-number or goes backwards (the engine's clock would be
            wrong from then on, so build a new engine with a monotonic timer)."""
        self._arrive()
        if not self.scheduler.waiting and not self.scheduler.running:
            if not self._pending:
                return None
            self.clock = max(self.clock, self._pending[0][0])          # idle: jump to the next arrival
            self._arrive()
        start = self.timer()
        schedule = self.scheduler.schedule()
        inputs = []
        for seq, k in schedule.chunks:
            first = seq.filled
            slots = self.blocks.reserve(seq, k)
            inputs.append(ChunkInput(first, seq.token_ids[first:first + k], slots, list(seq.paged.block_table),
                                     emit=first + k == seq.target))
        logits = self.runner.run(inputs)
        tokens = logits.argmax(-1).tolist()
        emitted, done = [], []
        row = 0
        for (seq, k), chunk in zip(schedule.chunks, inputs):
            self.blocks.commit(seq, k)
            if chunk.emit:
                seq.output_ids.append(tokens[row])
                if self.keep_logits:
                    seq.logits.append(logits[row].clone())
                emitted.append(seq)
                row += 1
                if seq.done:
                    done.append(seq)
        for seq in done:
            self.scheduler.retire(seq)
        began = self.clock
        self.clock += self._elapsed(start)
        for seq in emitted:
            seq.token_times.append(self.clock)
        if self.audit:
            self.blocks.audit(self.scheduler.running)
        report = StepReport(began, self.clock - began, tuple((k, ch.start) for (_, k), ch in zip(schedule.chunks, inputs)),
                            tuple(seq.rid for seq, _ in schedule.chunks),
                            tuple((seq.rid, seq.output_ids[-1]) for seq in emitted),
                            tuple(s.rid for s in schedule.admitted), tuple(s.rid for s in schedule.preempted),
                            self.blocks.num_free)
        self.history.append(report)
        return report

    def _elapsed(self, start) -> float:
        """Seconds since ``start`` on the engine's timer; a timer that returns a non-number or goes
        backwards would corrupt every time of the records, so it stops the run."""
        end = self.timer()
        if isinstance(start, bool) or isinstance(end, bool) or not all(
                isinstance(t, (int, float)) and math.isfinite(t) for t in (start, end)):
            raise TypeError(f"timer must return finite seconds (int or float), got {start!r} then {end!r}")
        if end < start:
            raise ValueError(f"timer went backwards ({start!r} then {end!r}); use a monotonic clock such as "
                             "time.perf_counter")
        return float(end - start)

    def run(self, trace: Seq) -> list[RequestRecord]:
        """Serve a trace to the end; returns one ``RequestRecord`` per trace entry, in trace order.

        Args:
            trace: ``TraceRequest``s, or (arrival, prompt_ids, max_new_tokens) triples; arrivals are
                on the engine's clock (s).

        Raises: as ``add_request`` (every entry is checked before any runs: a bad entry loses nothing).
        """
        if isinstance(trace, (str, bytes)) or not isinstance(trace, Seq):
            raise TypeError(f"trace must be a sequence of TraceRequest or (arrival, prompt_ids, max_new_tokens), "
                            f"got {type(trace).__qualname__}")
        entries = []
        for i, entry in enumerate(trace):
            if isinstance(entry, TraceRequest):
                entry = (entry.arrival, entry.prompt_ids, entry.max_new_tokens)
            if not isinstance(entry, (tuple, list)) or len(entry) != 3:
                raise TypeError(f"trace[{i}] must be a TraceRequest or an (arrival, prompt_ids, max_new_tokens) "
                                f"triple, got {entry!r}")
            entries.append(entry)
        before = len(self.sequences)
        try:
            rids = [self.add_request(ids, n, arrival) for arrival, ids, n in entries]
        except Exception:
            self._forget(before)
            raise
        while self.has_work:
            self.step()
        return [self.sequences[rid].record() for rid in rids]

    def _forget(self, count: int) -> None:
        """Drop the requests added after the first ``count`` (none has run yet): a refused trace
        leaves the engine as it was."""
        gone = {seq.rid for seq in self.sequences[count:]}
        self._pending = [p for p in self._pending if p[1] not in gone]
        del self.sequences[count:]

    def output_ids(self, rid: int) -> torch.Tensor:
        """The tokens generated for request ``rid`` so far, (n,) int64."""
        rid = integer("rid", rid, minimum=0, maximum=len(self.sequences) - 1)
        return torch.tensor(self.sequences[rid].output_ids, dtype=torch.int64)
