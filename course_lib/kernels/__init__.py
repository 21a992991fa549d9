"""Triton kernels of the course, each beside a PyTorch reference with the same signature.

Modules: ``gemv`` (y = W x, Lab 1), ``bench_gemv`` (``python -m course_lib.kernels.bench_gemv``).
``w4a16`` (y = x W_hat^T with packed int4 weights, Lab 4), ``bench_w4a16`` (``python -m course_lib.kernels.bench_w4a16``).
``paged_attention`` (decode attention over a paged KV cache, the serving engine), ``bench_paged_attention``
(``python -m course_lib.kernels.bench_paged_attention``).
``batch_invariant`` (batch-invariant operations in PyTorch and Triton, Lab 6), ``bench_batch_invariant``
(``python -m course_lib.kernels.bench_batch_invariant``).
``bench`` (``python -m course_lib.kernels.bench``): one table for all four Triton kernels, each beside the
PyTorch operation it replaces (``docs/kernels.md``).

How a kernel runs depends on :func:`triton_mode`:

- ``"native"``: triton imports and a CUDA device is present; kernels run compiled on CUDA tensors.
- ``"interpreter"``: ``TRITON_INTERPRET=1`` is in the environment; kernels run in Triton's
  interpreter on CPU tensors (slow: keep shapes small). The variable must be set *before* the
  kernel module is imported, because ``@triton.jit`` reads it when it decorates the kernel
  (and older triton versions read it when ``triton`` itself is imported, which torch may do lazily).
  Set it in the shell or at the top of a notebook, before any other import.
- ``"unavailable"``: triton does not import (macOS, Windows) or there is neither a CUDA device
  nor the interpreter; the public functions fall back to their PyTorch reference and print a
  one-line notice once per process.
"""
from __future__ import annotations

import os
import sys

__all__ = ["TritonMode", "triton_mode", "notice_once"]

_TRUTHY = {"1", "true", "yes", "on", "y"}


class TritonMode(str):
    """The mode as a plain string (``"native"``, ``"interpreter"``, ``"unavailable"``) with a ``reason``.

    Compares equal to the string, so ``triton_mode() == "interpreter"`` works.
    """

    reason: str

    def __new__(cls, mode: str, reason: str) -> "TritonMode":
        obj = super().__new__(cls, mode)
        obj.reason = reason
        return obj

    def __repr__(self) -> str:
        return f"TritonMode({str(self)!r}, reason={self.reason!r})"


def interpreter_requested() -> bool:
    """True when ``TRITON_INTERPRET`` is set to a true value in this process's environment."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUTHY


def triton_mode() -> TritonMode:
    """Report how Triton kernels can run in this process.

    Returns:
        A :class:`TritonMode` equal to ``"native"``, ``"interpreter"`` or ``"unavailable"``,
        with ``.reason`` a one-line explanation (the import error, the device found, ...).
    """
    try:
        import triton  # noqa: F401  (imported for the side effect of checking availability)
    except Exception as exc:  # ImportError on macOS/Windows, occasionally a broken install
        return TritonMode("unavailable", f"triton does not import ({type(exc).__name__}: {exc})")
    version = getattr(sys.modules["triton"], "__version__", "?")
    if interpreter_requested():
        return TritonMode("interpreter", f"TRITON_INTERPRET=1 with triton {version}: kernels run on CPU tensors")
    import torch

    if torch.cuda.is_available():
        return TritonMode("native", f"triton {version} on {torch.cuda.get_device_name(0)}")
    return TritonMode(
        "unavailable",
        f"triton {version} imports but there is no CUDA device and TRITON_INTERPRET is not set",
    )


_NOTICES_SHOWN: set[str] = set()


def notice_once(key: str, message: str) -> None:
    """Print ``message`` to stderr the first time ``key`` is seen in this process."""
    if key in _NOTICES_SHOWN:
        return
    _NOTICES_SHOWN.add(key)
    print(message, file=sys.stderr, flush=True)
