"""A small serving engine: continuous batching of the course's decoder over a paged KV cache.

Built from the course's own parts, one module each, in reading order (``docs/engine.md``):
``sequence`` (a request's state), ``block_manager`` (Lab 2's block allocator for all layers),
``scheduler`` (Lab 3's chunked scheduling step on real sequences), ``runner`` (one batched forward
over the paged cache), ``engine`` (``Engine``: add_request / step / run). ``calibrate`` fits Lab 3's
cost model to the engine's measured iterations and compares the simulator with the engine;
``python -m course_lib.engine.bench`` measures batched against sequential serving and the paged
against the contiguous decode step.
"""
from .block_manager import BlockManager
from .engine import MAX_RUNNING, Engine, StepReport, TraceRequest
from .runner import ChunkInput, ModelRunner
from .scheduler import Schedule, Scheduler, scheduling_deployment
from .sequence import Sequence, SequenceStatus

__all__ = ["Engine", "StepReport", "TraceRequest", "MAX_RUNNING", "BlockManager", "ModelRunner", "ChunkInput",
           "Scheduler", "Schedule", "scheduling_deployment", "Sequence", "SequenceStatus"]
