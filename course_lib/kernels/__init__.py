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

Every kernel module takes the same three pieces from here: :func:`import_triton` (``triton`` and
``triton.language``, or None where triton does not import), :func:`kernel_interpreted` (whether
``@triton.jit`` built a kernel for the interpreter) and :func:`fallback_notice` (whether a call
must use the PyTorch reference, and the one-line notice that says why).
"""
from __future__ import annotations

import math
import os
import sys
from types import ModuleType

__all__ = ["TritonMode", "triton_mode", "notice_once", "triton_import_error", "import_triton", "kernel_interpreted",
           "fallback_notice", "MAX_TILE_ELEMENTS", "check_tile"]

#: Most elements one Triton block (a ``tl.arange`` range or a tile) may hold: Triton's
#: ``triton.language.TRITON_MAX_TENSOR_NUMEL`` (2^20 in Triton 3); a larger one does not compile.
MAX_TILE_ELEMENTS = 1 << 20

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
    error = triton_import_error()
    if error is not None:
        return TritonMode("unavailable", f"triton does not import ({error})")
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


def triton_import_error() -> str | None:
    """Why ``import triton`` (and ``triton.language``) fails in this process, as
    ``"ImportError: ..."``, or None when both import.

    Sets ``TRITON_DEFAULT_FP_FUSION=1`` first unless it is set: Triton 3.9 warns at every first compile
    that its default (a * b + c fused into one FMA) becomes the opposite in 3.10; the course keeps 3.9's
    default, said here, rather than print that warning above every kernel check."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError on macOS/Windows, occasionally a broken install
        return f"{type(exc).__name__}: {exc}"
    return None


def import_triton() -> tuple[ModuleType, ModuleType] | tuple[None, None]:
    """``(triton, triton.language)``, or ``(None, None)`` where triton does not import (it is
    Linux x86_64 only; the PyTorch references work everywhere).

    A kernel module calls it once, at import, and defines its ``@triton.jit`` kernels only when the
    modules came back: ``triton, tl = import_triton()``. ``TRITON_INTERPRET`` must be set before that
    import (see the module docstring)."""
    if triton_import_error() is not None:
        return None, None
    return sys.modules["triton"], sys.modules["triton.language"]


def kernel_interpreted(kernel) -> bool:
    """True when ``kernel`` (a ``@triton.jit`` function, or None where triton does not import) was
    built for Triton's interpreter. The decorator reads ``TRITON_INTERPRET`` when the kernel's module
    is imported, so this records what it built, whatever the environment says later."""
    return kernel is not None and type(kernel).__name__ == "InterpretedFunction"


def fallback_notice(where: str, key: str, kernel, mode: TritonMode, tensor) -> tuple[str, str] | None:
    """``(notice key, one-line message)`` when a call of the kernel behind ``where`` must use its
    PyTorch reference, None when the kernel runs.

    The reference answers when triton does not import or ``mode`` is ``"unavailable"``; when the
    kernel was built for the interpreter and ``tensor`` is on CUDA (the interpreter runs on CPU
    tensors); and when it was compiled but ``tensor`` is on the CPU. Pass the result to
    :func:`notice_once`, so each reason prints once per process.

    Args:
        where: the public name the notice starts with (``"course_lib.kernels.gemv"``).
        key: the prefix of the notice keys (``"gemv"`` gives ``"gemv-fallback"``, ...).
        kernel: the module's ``@triton.jit`` kernel, or None.
        mode: this process's :func:`triton_mode` (the caller's, so that a test can replace it).
        tensor: the call's main input (its device decides).
    """
    if kernel is None or mode == "unavailable":
        return f"{key}-fallback", f"{where}: using the PyTorch reference ({mode.reason})."
    if kernel_interpreted(kernel):
        if tensor.is_cuda:
            return (f"{key}-interp-cuda", f"{where}: interpreter mode with CUDA tensors; using the PyTorch "
                    "reference (the interpreter runs on CPU tensors).")
        return None
    if not tensor.is_cuda:
        reason = ("TRITON_INTERPRET was set after the kernel module was imported"
                  if mode == "interpreter" else "compiled Triton needs CUDA tensors")
        return f"{key}-native-cpu", f"{where}: {tensor.device} tensors, {reason}; using the PyTorch reference."
    return None


def check_tile(what: str, **sizes: int) -> None:
    """Refuse block sizes whose tile (their product) exceeds ``MAX_TILE_ELEMENTS``, before any launch.

    Raises:
        ValueError: naming the sizes, the tile's elements and the limit.
    """
    elements = math.prod(sizes.values())
    if elements > MAX_TILE_ELEMENTS:
        given = " x ".join(f"{name} {value}" for name, value in sizes.items())
        raise ValueError(f"{what}: a tile of {given} holds {elements:,} elements, more than the {MAX_TILE_ELEMENTS:,} "
                         "a Triton block may hold; use smaller blocks")
