"""The engine's scheduler: Lab 3's chunked scheduling step applied to real sequences and blocks.

Each iteration asks ``scheduling.step.chunked_step`` (the function Lab 3's simulator and its
exercise use) for a ``StepPlan`` from the running sequences' (filled, target) pairs and the queue's
(prompt, generated) pairs, then carries it out on the block manager:

1. the admitted sequences leave the queue head and get block tables; a prefix hit gives a newcomer
   cached positions, so the step is asked again with the true contexts (and an empty queue), and
   its chunks then cover exactly the positions still to compute. The step counts a shared block once
   per sequence that holds it, so this second plan can preempt a sequence admitted a moment before
   (it is then in both ``Schedule.admitted`` and ``Schedule.preempted``, and waits at the queue head
   with its blocks freed); its tokens are unaffected;
2. the preempted sequences (the most recently admitted first) free their blocks and return to the
   queue head, keeping their tokens: they re-prefill prompt + generated when admitted again;
3. the chunks (sequence, k) go to the model runner; the budget bounds the sum of k.

Capacity: the step counts positions, the pool hands out whole blocks. The step is given a KV
budget of (num_blocks - max_running) * block_size positions; each running sequence leaves less
than one block partly empty, so sum(ceil(positions / block_size)) <= num_blocks always holds and
``BlockManager.reserve`` never runs out (docs/engine.md, "Capacity").
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..hardware import Device
from ..scheduling.cost import Deployment
from ..scheduling.step import StepPlan, chunked_step
from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus

__all__ = ["Scheduler", "Schedule", "scheduling_deployment"]


def scheduling_deployment(model_config, kv_positions: int, device: Device | None = None,
                          weight_bytes: float | None = None, kv_element_bytes: int = 4) -> Deployment:
    """The Lab 3 ``Deployment`` that describes the engine's model and cache.

    Args:
        model_config: the served model's ``ModelConfig`` (layers, width, attention width, KV bytes per
            position, matrix-multiply parameters from ``roofline.n_matmul``).
        kv_positions: cached positions the scheduler may plan for (int >= 1).
        device: the device the cost model prices (``engine.calibrate.fit_device`` fits one for this CPU); None
            gives a placeholder that only the scheduling rules read (they use the KV budget alone).
        weight_bytes: bytes of weights one iteration reads (None: 4 bytes per parameter).
        kv_element_bytes: bytes of one cached K or V element, the pool's dtype (4 for float32, 2 for
            bfloat16); the engine passes its model's.
    """
    from ..roofline import n_matmul

    kv_bytes = model_config.kv_bytes_per_token(kv_element_bytes)
    weights = 4.0 * model_config.parameters() if weight_bytes is None else float(weight_bytes)
    kv_budget = float(kv_positions * kv_bytes)
    if device is None:
        device = Device("engine (scheduling only)", memory=weights + kv_budget + 1.0, bandwidth=1.0, peak_flops=1.0,
                        source="placeholder: the scheduling rules read only the KV budget")
    return Deployment(device=device, mfu=1.0, kv_budget=kv_budget, n_matmul=n_matmul(model_config),
                      n_layers=model_config.n_layers, d_model=model_config.d_model,
                      attention_width=model_config.attention_width, kv_bytes_per_token=kv_bytes,
                      weight_bytes=weights)


@dataclass(frozen=True)
class Schedule:
    """One iteration's work: chunks (sequence, k) in admission order, and who was preempted or admitted."""

    chunks: tuple[tuple[Sequence, int], ...]
    preempted: tuple[Sequence, ...]
    admitted: tuple[Sequence, ...]
    plan: StepPlan

    @property
    def tokens(self) -> int:
        """Positions this iteration computes (sum of k): at most the budget."""
        return sum(k for _, k in self.chunks)


class Scheduler:
    """Waiting queue, running list and the scheduling step of the engine.

    Args:
        blocks: the ``BlockManager``. deployment: the Lab 3 ``Deployment`` whose KV budget the step reads
            (``scheduling_deployment``). budget: positions per iteration (None: unlimited, the paged
            policy). max_running: most sequences running at once.
    """

    def __init__(self, blocks: BlockManager, deployment: Deployment, budget: int | None, max_running: int) -> None:
        self.blocks = blocks
        self.deployment = deployment
        self.budget = budget
        self.max_running = max_running
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def _step(self, with_queue: bool) -> StepPlan:
        queue = [(len(s.prompt_ids), len(s.output_ids)) for s in self.waiting] if with_queue else []
        return chunked_step([(s.filled, s.target) for s in self.running], queue, self.deployment,
                            budget=self.budget, max_running=self.max_running)

    def schedule(self) -> Schedule:
        """Decide and apply one iteration's admissions and preemptions; return its chunks.

        Raises: ValueError when nothing is running or waiting; ``RequestTooLargeError`` from the step
        (the engine's ``add_request`` refuses such requests first)."""
        plan = self._step(with_queue=True)
        admitted = [self.waiting.popleft() for _ in range(plan.admitted)]
        hits = 0
        for seq in admitted:
            hits += self.blocks.admit(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        if hits:
            plan = self._step(with_queue=False)       # the true contexts: chunks cover uncached positions only
        chunks = tuple((self.running[i], k) for i, k in plan.chunks)
        preempted = tuple(self.running[i] for i in plan.preempted)
        for seq in reversed(preempted):               # back to the queue head, in admission order
            self.blocks.free(seq)
            seq.status = SequenceStatus.WAITING
            seq.preemptions += 1
            self.waiting.appendleft(seq)
        if preempted:
            gone = {id(s) for s in preempted}
            self.running = [s for s in self.running if id(s) not in gone]
        return Schedule(chunks, preempted, tuple(admitted), plan)

    def retire(self, seq: Sequence) -> None:
        """A sequence that emitted its last token leaves and frees its blocks."""
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        self.running.remove(seq)
