"""Batch-invariant operations: a row's result does not depend on the other rows in the call (course Lab 6).

Two implementations of the same idea (Thinking Machines Lab, He et al., "Defeating Nondeterminism in LLM
Inference", 2025; vLLM's batch-invariant mode): every reduction in an order fixed once for all, never
chosen from the batch size.

- ``torch_ops`` (re-exported here): plain PyTorch for any device, what the reference decoder's
  ``batch_invariant_mode()`` routes every reduction through (the switch and the dispatch between these
  and PyTorch's default ops are ``course_lib.models.ops``): :func:`linear` (fixed row tiles),
  :func:`fixed_order_sum`, :func:`exp`, :func:`silu`, :func:`rms_norm`, :func:`softmax`,
  :func:`attention`.
- ``triton_ops``: Triton kernels for the matmul and RMSNorm (fixed blocks, no split-K); import it
  explicitly (``from course_lib.kernels.batch_invariant import triton_ops``), after setting
  ``TRITON_INTERPRET=1`` where there is no GPU (``course_lib.kernels``). It is not imported here, so
  importing the decoder never imports triton. Benchmark: ``python -m course_lib.kernels.bench_batch_invariant``.
"""
from .torch_ops import PIECE, ROW_TILE, attention, exp, fixed_order_sum, linear, rms_norm, silu, softmax

__all__ = ["PIECE", "ROW_TILE", "attention", "exp", "fixed_order_sum", "linear", "rms_norm", "silu", "softmax"]
