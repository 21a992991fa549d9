"""What every kernel exercise's checker does with a launch: read the launcher's report.

The launchers (``course_lib.kernels.exercise``) run a learner's ``@triton.jit`` kernel on guarded
buffers and, under Triton's interpreter, trace its loads and stores. :func:`launch_case` launches
one case and turns the report into the course's errors, in this order:

1. the kernel raised: ``ExerciseNeeded`` for nbgrader's unsolved stub (``NotImplementedError``),
   else a ``ContractError`` quoting the exception;
2. Triton's compiler refuses it for a GPU (the launcher compiles it, no GPU needed): a
   ``ContractError`` quoting the compiler;
3. a lane loaded or stored outside the launch's tensors: a ``ContractError`` naming the access
   (load or store, tensor, element index, program) and, through the lab's ``name_stray`` function,
   the mask or offset that is wrong;
4. a write landed in an output's guard (a compiled launch, where nothing is traced);
5. the kernel stored nothing at all.

Only then does the checker compare values. A launch refused before it started (not a
``@triton.jit`` function, course_lib's own kernel, no Triton here) raises from the launcher itself.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..exercises import ExerciseNeeded
from ..kernels.exercise import KernelSourceError, launcher
from .contracts import ContractError, with_diagnosis

__all__ = ["launch_case", "stray_text", "check_all_stored", "raise_if_bfloat16_arithmetic"]


def stray_text(violation: dict) -> str:
    """One line for a report's ``violation``: which lane went where."""
    op = {"store": "stored to", "load": "loaded from"}.get(violation["op"], "made an atomic access to")
    where = "" if violation["inside_buffer"] else " (far outside the buffer it is nearest to)"
    index = ", ".join(str(i) for i in violation["index"])
    return (f"program {tuple(violation['program'])} {op} {violation['tensor']}[{index}], outside its shape "
            f"{tuple(violation['shape'])}{where}: {violation['lanes']} lane(s) of that access addressed no element of "
            "the kernel's tensors")


def launch_case(kernel, exercise: str, case_text: str, name_stray: Callable[[dict], str], *args, **kwargs):
    """Launch KERNEL as kernel exercise EXERCISE on ARGS/KWARGS; return its outputs (the launcher's
    result without the report) after checking the report as the module docstring says.

    Args:
        case_text: the checker's description of the case (``gemv_kernel(case 0: W 13 x 37 ...)``),
            the first words of every message.
        name_stray: violation -> the diagnosis of a stray access (the mask or offset at fault), or "".

    Raises:
        ExerciseNeeded: the kernel still raises nbgrader's NotImplementedError.
        ContractError: the kernel's source uses what is not Triton (``KernelSourceError``), the kernel
            raised, does not compile for a GPU, strayed outside its tensors, wrote into a guard, or
            stored nothing.
    """
    try:
        *outputs, report = launcher(kernel, exercise)(*args, **kwargs)
    except KernelSourceError as exc:        # the static rule on the kernel's source: the learner's error
        raise ContractError(f"{case_text}: {exc}") from None
    if type(report) is not dict:
        raise ContractError(f"{case_text}: the launch returned no report")
    error = report.get("error")
    if error:
        if str(error).strip() == "NotImplementedError:":       # nbgrader's stub: raise NotImplementedError()
            raise ExerciseNeeded(f"`{report.get('kernel')}` is not written yet (it still raises NotImplementedError): "
                                 "write its body in the exercise cell, run that cell, then rerun this check.",
                                 unsolved=(str(report.get("kernel")),))
        raise ContractError(f"{case_text}: your kernel raised {str(error)[:800]}")
    if report.get("compiled") is False:
        raise ContractError(f"{case_text}: your kernel runs in Triton's interpreter, but Triton's compiler refuses "
                            f"it for a GPU (checked without one, for CUDA compute capability 9.0), so it would not "
                            f"run on a GPU:\n{str(report.get('compile_error'))[-1200:]}")
    violation = report.get("violation")
    if violation:
        diagnosis = name_stray(violation)
        err = ContractError(f"{case_text}: {stray_text(violation)}")
        raise with_diagnosis(err, diagnosis, likely=False) if diagnosis else err
    if report.get("guard_writes"):
        raise ContractError(f"{case_text}: your kernel wrote outside {', '.join(report['guard_writes'])} (the "
                            "values around it changed): a store without the mask its last block needs")
    if not any(report.get("stored", {}).values()) and report.get("traced"):
        raise ContractError(f"{case_text}: your kernel stored nothing (no tl.store reached an output)")
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def check_all_stored(what: str, y: torch.Tensor, owns: str) -> None:
    """Raise unless every element of Y (a launcher's output, which starts as NaN) holds a number.

    Args:
        what: the case's description, the message's first words. owns: which elements a program
            owns (``"Program i owns rows ..."``), said in the message.

    Raises:
        ContractError: naming the first NaN elements and how many there are.
    """
    unwritten = torch.isnan(y).nonzero().tolist()
    if unwritten:
        where = ", ".join(f"y[{', '.join(map(str, i))}]" for i in unwritten[:8])
        raise ContractError(f"{what}: {where}{' ...' if len(unwritten) > 8 else ''} hold NaN ({len(unwritten)} of "
                            f"{y.numel()} elements): never stored (y starts as NaN), or computed from a NaN. {owns}; "
                            "a masked load without other=0.0 reads NaN in its masked lanes here (on a GPU they are "
                            "undefined)")


def raise_if_bfloat16_arithmetic(failure: ContractError, dtype: torch.dtype, right_in_float32: Callable[[], bool],
                                 loaded: str) -> None:
    """Raise FAILURE with the diagnosis "arithmetic on bfloat16 values" when the case's inputs were
    bfloat16 (DTYPE) and the same kernel is right on the same values in float32 (RIGHT_IN_FLOAT32
    relaunches it and compares); otherwise return. LOADED names what to convert after loading it
    ("what you load", "x's tile").

    Triton's interpreter does not compute bfloat16 arithmetic (it operates on the raw 16-bit patterns);
    a GPU would round each product to bfloat16. Either way the kernel must convert first."""
    if dtype != torch.bfloat16 or not right_in_float32():
        return
    raise with_diagnosis(failure, (
        f"right for float32 inputs, wrong for bfloat16 ones: arithmetic on the bfloat16 values themselves. Convert "
        f"{loaded} with .to(tl.float32) before computing with it (Triton's interpreter computes garbage from "
        "bfloat16's raw bits; on a GPU every product would be rounded to bfloat16)"), likely=False)
