"""Contract checkers shared by every lab's graded cells (the course's grading contracts).

A contract compares what learner code produced with what the contract demands and, on
failure, raises ``ContractError`` with a message that says what differs and where:
- logit equivalence: max |a - b| <= atol + rtol * |b| with dtype-aware tolerances; on
  failure the first step and position over tolerance, its error, the reference's top-2
  gap there, and whether (and where) the greedy tokens diverged;
- byte counts: exact integer equality with a product formula; on failure both numbers
  and the term(s) of the formula that would explain the difference.
The first divergence of two token streams and the top-2 gap come from ``course_lib.divergence``.

Nothing here trusts a learner object: values are checked for their exact type, dtype
and shape before any comparison, so an object whose ``==`` always returns True fails.

Shared by the labs' checkers as well: ``close`` (relative closeness of two numbers),
``attempts`` (a bounded rejection-sampling loop for drawing cases) and ``diagnose`` /
``named_faults`` / ``with_diagnosis`` (the "Diagnosis:" line naming the known faults a wrong
result equals).

A ``ContractError`` shows itself in Jupyter without the checker's traceback: the contract, the
case, what differed and the diagnosis first, then the learner's own cell line
(``ContractError._render_traceback_``).
"""
from __future__ import annotations

import functools
import inspect
import linecache
import math
import os
import sys
from types import TracebackType
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from ..divergence import first_divergence, top2_gap


class ContractError(AssertionError):
    """A learner result broke a contract; the message explains how.

    The message has up to four parts, kept apart so that each place that shows it can order them:

    - ``what``: the contract and the case on the first line (the learner's function or the
      quantity, the case's drawn inputs, what differed: ``kv_bytes_per_token(case 0: L 66, ...):
      expected 135,168 = ..., got 67,584``), then any lines showing the values that differed
      (the expected and the learner's plan, the reference's terms);
    - ``diagnosis``: the "Diagnosis:" lines naming the known fault(s) the result equals
      (``named_faults``, ``with_diagnosis``), or "";
    - ``caveat``: the line that says a diagnosis is likely, not certain (``LIKELY``), or "";
    - ``hint``: another reading of the wrong value the contract computes itself (``check_bytes``:
      the single formula terms that would give the learner's number), or "".

    ``str(err)`` is the record the grader keeps: the first line of ``what`` (followed by
    ``"; " + hint`` when no diagnosis was found), the rest of ``what``, the diagnosis, the caveat.
    The lab tables' symptom regexes search it, and the judge's redaction of a hidden check keeps
    its first line and its Diagnosis lines (``course_grader.preprocessors.redact``), so lines that show
    drawn inputs or reference values never come after the diagnosis. A diagnosed error leaves
    the hint out of ``str(err)``: the diagnosis is the explanation.

    ``_render_traceback_`` is how IPython and Jupyter show it (see there).
    """

    def __init__(self, what: str, *, diagnosis: str = "", caveat: str = "", hint: str = "") -> None:
        self.what, self.diagnosis, self.caveat, self.hint = str(what), str(diagnosis), str(caveat), str(hint)
        first, newline, rest = self.what.partition("\n")
        if self.hint and not self.diagnosis:
            first = f"{first}; {self.hint}"
        super().__init__("\n".join(part for part in (first + newline + rest, self.diagnosis, self.caveat) if part))

    def __reduce__(self):
        return _rebuild_contract_error, (self.what, self.diagnosis, self.caveat, self.hint)

    def summary_lines(self) -> list[str]:
        """The message in the order a learner reads it: the contract and the case (the first line
        of ``what``), the values that differed (its other lines), the diagnosis and its caveat,
        then the hint (right after the values when there is no diagnosis)."""
        hint = self.hint[:1].upper() + self.hint[1:]
        return [line for part in (self.what, self.diagnosis, self.caveat, hint) for line in part.split("\n") if line]

    def _render_traceback_(self) -> list[str]:
        """IPython's hook for showing this error (``InteractiveShell.showtraceback`` calls it instead
        of formatting the traceback; ipykernel sends the list as the error output's traceback).

        Returns two strings: ``"ContractError: "`` + ``summary_lines()`` joined by newlines (no
        frame of the checker, no source line of course_lib, no list of the faults it tries); then,
        when the error came from a checker called by the learner's code, that call: its cell and
        line, the checker whose docstring states the contract, and the call's line with up to two
        lines either side (IPython's own layout, ``----> N`` marking the line). nbgrader's feedback
        redaction (``course_grader.preprocessors.RedactHiddenTracebacks``) relies on that layout:
        it finds a hidden test's markers around the marked line and replaces the first string by
        the redacted message.

        Never raises: IPython shows no error at all when this hook fails, and a graded cell
        without an error output would count as passed, so any failure falls back to one line.
        """
        name = type(self).__name__
        try:
            shown = [f"{name}: " + "\n".join(self.summary_lines())]
            call = _learner_call(self.__traceback__)
            return shown + ([call] if call else [])
        except Exception:  # the fallback keeps the error visible whatever went wrong above
            try:
                return [f"{name}: {AssertionError.__str__(self)}"]
            except Exception:
                return [name]


def _rebuild_contract_error(what: str, diagnosis: str, caveat: str, hint: str) -> ContractError:
    """Unpickle a ContractError with its parts (``ContractError.__reduce__``)."""
    return ContractError(what, diagnosis=diagnosis, caveat=caveat, hint=hint)


#: Lines of the learner's code shown either side of the call that failed (IPython's default). nbgrader's
#: feedback finds a hidden test's BEGIN marker among them, so fewer would show a hidden check's message.
CALL_CONTEXT = 2


def _learner_call(tb: TracebackType | None) -> str:
    """The learner's call into the grading package on traceback TB, laid out like an IPython
    frame; "" when there is none (no traceback, or one that starts inside the package)."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    package = __name__.rpartition(".")[0]                     # course_lib.grading
    modules = [str(e.tb_frame.f_globals.get("__name__", "")) for e in entries]
    inside = next((i for i, m in enumerate(modules) if m == package or m.startswith(package + ".")), None)
    if inside is None:                                        # raised outside the checkers: its own line
        caller, checker = (entries[-1] if entries else None), ""
    else:
        caller = entries[inside - 1] if inside > 0 else None
        checker = f"{modules[inside].rpartition('.')[2]}.{entries[inside].tb_frame.f_code.co_name}"
    if caller is None:
        return ""
    filename, lineno = caller.tb_frame.f_code.co_filename, caller.tb_lineno
    try:                                                      # IPython names a cell "Cell In[12]"
        shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
        label = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:                                         # another shell, or none: the file name
        label = None
    where = " ".join(label) if label else f"File {filename}"
    head = f"{where}, line {lineno}" + (f" (help({checker}) states the contract)" if checker else "")
    numbers = [n for n in range(max(1, lineno - CALL_CONTEXT), lineno + CALL_CONTEXT + 1)
               if n == lineno or linecache.getline(filename, n)]
    width = len(str(numbers[-1]))
    body = [f"{'---->' if n == lineno else '     '} {n:>{width}} {linecache.getline(filename, n).rstrip()}"
            for n in numbers]
    return "\n".join([head] + body)


#: Default (atol, rtol) for logit comparisons, by dtype of the compared tensors.
LOGIT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (5e-2, 1e-2),
}


def fresh_seed() -> int:
    """A seed for hidden tests: new on every grading run (32 random bits), so hard-coded
    answers cannot pass; set COURSE_GRADING_SEED to replay one run."""
    fixed = os.environ.get("COURSE_GRADING_SEED")
    return int(fixed) if fixed else int.from_bytes(os.urandom(4), "little")


# -- type, dtype and shape checks --------------------------------------------------------
def check_tensor(name: str, obj, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                 allow_nan: bool = False) -> torch.Tensor:
    """Return ``obj`` as a plain detached tensor after checking it exactly.

    Raises:
        ContractError: ``obj`` is not exactly a ``torch.Tensor`` (subclasses are refused),
            or its dtype/shape differ from the ones given, or it holds NaN/inf.
    """
    if type(obj) is not torch.Tensor:
        raise ContractError(f"{name} must be a torch.Tensor, got {type(obj).__module__}.{type(obj).__qualname__}")
    if dtype is not None and obj.dtype != dtype:
        raise ContractError(f"{name} must have dtype {dtype}, got {obj.dtype}")
    if shape is not None and tuple(obj.shape) != tuple(shape):
        raise ContractError(f"{name} must have shape {tuple(shape)}, got {tuple(obj.shape)}")
    plain = obj.detach().clone().to("cpu")
    if not allow_nan and plain.is_floating_point() and not bool(torch.isfinite(plain).all()):
        raise ContractError(f"{name} contains NaN or inf")
    return plain


def check_int(name: str, obj) -> int:
    """Return ``obj`` if it is exactly an int (bool and int-like objects are refused)."""
    if type(obj) is not int:
        kind = type(obj)
        hint = " (convert it with int(...))" if kind.__module__ in ("numpy", "torch") or kind is float else ""
        raise ContractError(f"{name} must be an int, got {kind.__module__}.{kind.__qualname__}{hint}")
    return obj


def check_real(name: str, obj) -> float:
    """Return ``obj`` as a float if it is exactly an int or float (or a numpy scalar of those
    kinds) and finite. bool, tensors, arrays and number-like objects are refused, so a value
    whose comparisons are rigged cannot pass."""
    kind = type(obj)
    numpy_scalar = kind.__module__ == "numpy" and kind.__name__.startswith(("float", "int", "uint"))
    if kind not in (int, float) and not numpy_scalar:
        raise ContractError(f"{name} must be a number (int or float), got {kind.__module__}.{kind.__qualname__}")
    value = float(obj)
    if not math.isfinite(value):
        raise ContractError(f"{name} must be finite, got {value}")
    return value


def close(actual: float, expected: float, *, rel: float) -> bool:
    """True when |actual - expected| <= rel * |expected|: ``actual`` agrees with ``expected`` to a
    relative error of ``rel`` (NaN is close only to NaN, an infinity only to itself). Plain
    numbers only: check the type first (``check_real``)."""
    if math.isnan(actual) or math.isnan(expected):
        return math.isnan(actual) and math.isnan(expected)
    if math.isinf(actual) or math.isinf(expected):
        return actual == expected
    return abs(actual - expected) <= rel * abs(expected)


def significant_tolerance(figures: int) -> float:
    """Relative tolerance of "equal to ``figures`` significant figures": half a unit in the
    last kept digit of a mantissa starting with 1, i.e. 5 * 10**-figures (4 figures: 5e-4)."""
    return 5 * 10.0 ** -figures


def check_significant(actual, expected: float, *, figures: int = 4, what: str = "value") -> float:
    """Contract for times and ratios: ``actual`` is a finite real number with
    |actual - expected| <= significant_tolerance(figures) * |expected| (course contract: "times
    to 4 significant figures").

    Returns: the float value. Raises: ContractError showing both numbers and the ratio."""
    got = check_real(what, actual)
    tol = significant_tolerance(figures)
    if close(got, expected, rel=tol):
        return got
    ratio = f"; ratio got/expected = {got / expected:.6g}" if expected else ""
    raise ContractError(f"{what}: expected {expected:.{figures + 2}g}, got {got:.{figures + 2}g} "
                        f"(must agree to {figures} significant figures, relative error <= {tol:g}){ratio}")


def check_own_function(name: str, fn) -> None:
    """Refuse what is not a callable, an exercise not written yet, and course_lib's own reference
    passed off as the learner's (direct reuse; the grader flags a wrapper around a reference when
    the reference's code runs during the calls it watches, ``course_grader.provenance``).

    Raises:
        ContractError: FN is not callable, or is course_lib's function.
        ExerciseNeeded: FN is still nbgrader's unsolved stub (``course_lib.exercises``): the check
            stops before drawing any case, with one line saying what to do.
    """
    from ..exercises import ExerciseNeeded, is_unsolved_stub

    if not callable(fn):
        raise ContractError(f"{name} must be a function, got {type(fn).__qualname__}")
    if is_unsolved_stub(fn):
        raise ExerciseNeeded(f"`{name}` is not written yet (it still raises NotImplementedError): write it in its "
                             "exercise cell, run that cell, then rerun this check.", unsolved=(name,))
    inner, seen = fn, 0
    while seen < 20:                              # functools.partial(f) and @functools.wraps wrappers of f are f
        seen += 1
        wrapped = getattr(inner, "func", None) if isinstance(inner, functools.partial) else \
            inner.__dict__.get("__wrapped__") if hasattr(inner, "__dict__") else None
        if wrapped is None:
            break
        inner = wrapped
    for candidate in (fn, inner):
        if str(getattr(candidate, "__module__", "") or "").startswith("course_lib"):
            raise ContractError(f"{name} is course_lib's reference {candidate.__module__}."
                                f"{getattr(candidate, '__qualname__', '')}; the exercise asks for your own implementation")


def is_grader_error(exc: BaseException) -> bool:
    """Whether EXC is the grading machinery's own (its class sets a true ``grader_error``: the judge's
    errors about the kernel or the call, ``course_grader.judge``), which a checker passes on as it is
    instead of reporting it as something the learner's function raised."""
    return bool(getattr(type(exc), "grader_error", False))


def call_on_copies(what: str, fn: Callable, *args, writes: Sequence[int] = (), **kwargs):
    """``fn(*args, **kwargs)`` with every tensor argument (also those in a list or tuple argument)
    replaced by a copy, except the positional arguments at the indices ``writes`` (those the
    exercise's contract lets it write, ``tables.Writes.args``), passed as they are; returns what
    fn returned.

    The contract of every exercise that takes tensors and declares no in-place write: the function
    leaves its inputs as they were (a caller still holds them: padding ``x`` in place with
    ``x.resize_`` corrupts the caller's batch). The grading judge applies the same rule to the
    learner's kernel (``course_grader.judge``).

    Raises:
        ContractError: fn raised (the message names it and the case, as a failed check), or
            changed a tensor argument in place (its values, shape or dtype).
        An exception of the grading machinery (``is_grader_error``) passes through unchanged.
    """
    originals, copies, labels = [], [], []

    def copied(value, label: str):
        if type(value) is torch.Tensor:
            originals.append(value)
            copies.append(value.clone())
            labels.append(label)
            return copies[-1]
        if type(value) in (list, tuple):
            return type(value)(copied(v, f"{label}[{j}]") for j, v in enumerate(value))
        return value
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except Exception:       # no signature to read (a builtin, an object whose __signature__ raises): number them
        names = []
    args = tuple(a if i in writes else copied(a, f"argument {i + 1}" + (f" (`{names[i]}`)" if i < len(names) else ""))
                 for i, a in enumerate(args))
    kwargs = {k: copied(v, f"argument `{k}`") for k, v in kwargs.items()}
    try:
        result = fn(*args, **kwargs)
    except (ContractError, KeyboardInterrupt):
        raise
    except Exception as exc:
        if is_grader_error(exc):
            raise
        raise ContractError(f"{what}: your function raised {type(exc).__name__}: {exc}") from None
    for label, before, after in zip(labels, originals, copies):
        if after.shape != before.shape or after.dtype != before.dtype or not torch.equal(after, before):
            change = (f"shape {tuple(before.shape)} -> {tuple(after.shape)}" if after.shape != before.shape else
                      f"dtype {before.dtype} -> {after.dtype}" if after.dtype != before.dtype else "its values")
            raise ContractError(f"{what}: your function changed its tensor {label} in place ({change}); a "
                                "function must leave the tensors it is given as they were: work on a copy "
                                "(x.clone(), torch.cat, torch.nn.functional.pad)")
    return result


def check_int_list(name: str, obj) -> list[int]:
    """Return a copy of ``obj`` if it is a list/tuple of exact ints (or a 1-D int64 tensor)."""
    if type(obj) is torch.Tensor:
        if obj.dim() != 1 or obj.dtype != torch.int64:
            raise ContractError(f"{name} must be a 1-D int64 tensor or a list of ints, got "
                                f"shape {tuple(obj.shape)} {obj.dtype}")
        return [int(x) for x in obj.tolist()]
    if type(obj) not in (list, tuple):
        raise ContractError(f"{name} must be a list of ints, got {type(obj).__qualname__}")
    return [check_int(f"{name}[{i}]", x) for i, x in enumerate(obj)]


# -- drawing cases and naming faults -------------------------------------------------------
def attempts(lab: str, limit: int = 100_000) -> Iterator[int]:
    """Bound a checker's rejection-sampling loop (``for _ in attempts("Lab 1"): draw; if ok: break``).

    Raises: RuntimeError after ``limit`` draws: no suitable case is a bug in the grader, reported
    as such (never a learner's failure)."""
    yield from range(limit)
    raise RuntimeError(f"{lab} grader: no suitable random case in {limit} draws (a grader bug; please report)")


#: The caveat every diagnosis carries: equal on these inputs does not prove the cause.
LIKELY = ("(a likely cause, not a certainty: a different bug can give the same result on these inputs; "
          "check your code against the named fault)")


def with_diagnosis(err: ContractError | str, diagnosis: str, *, likely: bool = True) -> ContractError:
    """``err`` (a message or a ContractError) with ``"Diagnosis: " + diagnosis`` and, when
    ``likely`` (the default: a match on these inputs does not prove the cause), the caveat ``LIKELY``.
    Pass ``likely=False`` only when the checker's evidence rules the other causes out. A diagnosis
    ``err`` already had is replaced; its contract, case and hint are kept."""
    base = err if isinstance(err, ContractError) else ContractError(err)
    return ContractError(base.what, diagnosis=f"Diagnosis: {diagnosis}", caveat=LIKELY if likely else "",
                         hint=base.hint)


def named_faults(err: ContractError | str, matches: Sequence[str]) -> ContractError:
    """``err`` (a message or a ContractError) with a "Diagnosis:" naming the known faults in
    ``matches`` (several when they coincide on these inputs), or unchanged when there is none."""
    if not matches:
        return err if isinstance(err, ContractError) else ContractError(err)
    if len(matches) == 1:
        return with_diagnosis(err, f"your result equals the reference with this fault: {matches[0]}")
    listed = "".join(f"\n  - {m}" for m in matches)
    return with_diagnosis(err, f"your result equals the reference with any of these faults "
                               f"(on these inputs they coincide):{listed}")


def diagnose(err: ContractError | str, got: Any, variants: Mapping[str, Callable[[], Any]],
             same: Callable[[Any, Any], bool]) -> ContractError:
    """``named_faults`` for the variants whose value equals ``got``.

    Args:
        err: the contract failure. got: the learner's (type-checked) result.
        variants: fault description -> a zero-argument function computing the reference with
            that fault on the same inputs (one that raises, or returns None, is not the answer).
        same: same(got, candidate) -> bool, the comparison (``close``, exact ``==``, allclose).
    """
    matches = []
    for symptom, make in variants.items():
        try:
            candidate = make()
        except Exception:  # a variant that cannot be evaluated on these inputs is not the answer
            continue
        if candidate is not None and same(got, candidate):
            matches.append(symptom)
    return named_faults(err, matches)


def _tolerances(dtype: torch.dtype, atol, rtol):
    """(atol, rtol): the given values, or the dtype's defaults from LOGIT_TOLERANCES."""
    default_atol, default_rtol = LOGIT_TOLERANCES.get(dtype, (1e-5, 1e-5))
    return (default_atol if atol is None else atol), (default_rtol if rtol is None else rtol)


# -- logit equivalence -------------------------------------------------------------------
def check_logits_close(actual, expected: torch.Tensor, *, what: str = "logits",
                       atol: float | None = None, rtol: float | None = None,
                       tokens_actual: Sequence[int] | None = None,
                       tokens_expected: Sequence[int] | None = None,
                       position_offset: int = 0) -> float:
    """Logit equivalence contract over steps.

    Args:
        actual: learner logits, (steps, vocab) or (vocab,); checked for exact type/dtype/shape.
        expected: reference logits of the same shape (float32 -> atol 1e-5, rtol 1e-5 unless given).
        tokens_actual, tokens_expected: the greedy tokens each run emitted, when comparing
            generation. Once they diverge the later logits see different contexts, so only
            the common prefix (up to and including the first differing step) is compared.
        position_offset: absolute position of step 0 (for messages only).

    Returns:
        The max |actual - expected| over the compared steps.

    Raises:
        ContractError: naming the first step/position over tolerance, its error, the
            reference's top-2 gap there and whether the tokens diverged.
    """
    got = check_tensor(what, actual, shape=expected.shape, dtype=expected.dtype)
    atol, rtol = _tolerances(expected.dtype, atol, rtol)
    ref = expected.detach().to("cpu")
    if ref.dim() == 1:
        got, ref = got[None], ref[None]
    steps = ref.shape[0]
    diverged = None
    if tokens_actual is not None and tokens_expected is not None:
        diverged = first_divergence(list(tokens_actual), list(tokens_expected))
        if diverged is not None:
            steps = min(steps, diverged + 1)
    err = (got[:steps].to(torch.float64) - ref[:steps].to(torch.float64)).abs()
    bound = atol + rtol * ref[:steps].to(torch.float64).abs()
    over = (err > bound).any(dim=-1)
    max_err = float(err.max()) if err.numel() else 0.0
    if not bool(over.any()):
        return max_err
    step = int(over.nonzero()[0, 0])
    step_err = float(err[step].max())
    gap = float(top2_gap(ref[step]))
    if tokens_actual is None or tokens_expected is None:
        token_note = ""
    elif diverged is None:
        token_note = (f"; the greedy tokens are identical over all {len(tokens_expected)} steps, "
                      "so comparing tokens alone would hide this")
    else:
        token_note = f"; the greedy tokens first diverge at step {diverged}"
    raise ContractError(
        f"{what} differ from the reference: first over tolerance at step {step} "
        f"(position {position_offset + step}), max |diff| {step_err:.3g} > atol {atol:g} + "
        f"rtol {rtol:g}*|ref| ({ref.dtype}); the reference's top-2 gap there is {gap:.3g}"
        f"{token_note}; max |diff| over the compared steps {max_err:.3g}")


def check_close(actual, expected: torch.Tensor, *, what: str = "output",
                atol: float | torch.Tensor | None = None, rtol: float | None = None,
                dtype: torch.dtype | None = None) -> float:
    """Element-wise closeness contract for any tensor (|a - b| <= atol + rtol*|b|, dtype-aware
    defaults as for logits). Returns the max |diff|.

    Args:
        atol: a number, or a float64 tensor broadcastable to ``expected`` (a per-element bound,
            e.g. one that grows with position where float32 rounding does).
        dtype: the dtype ``actual`` must have (default: ``expected.dtype``; a float64 reference
            may judge a float32 result).

    Raises:
        ContractError: wrong type/dtype/shape, or naming the first index over tolerance, its
            error and its bound.
    """
    dtype = expected.dtype if dtype is None else dtype
    got = check_tensor(what, actual, shape=expected.shape, dtype=dtype)
    atol, rtol = _tolerances(dtype, atol, rtol)
    ref = expected.detach().to("cpu").to(torch.float64)
    err = (got.to(torch.float64) - ref).abs()
    bound = (atol + rtol * ref.abs()).expand_as(ref)
    over = err > bound
    if not bool(over.any()):
        return float(err.max()) if err.numel() else 0.0
    index = tuple(int(i) for i in over.nonzero()[0])
    raise ContractError(f"{what} differs from the reference: first over tolerance at index {index}, |diff| "
                        f"{float(err[index]):.3g} > allowed {float(bound[index]):.3g} ({dtype}); "
                        f"{int(over.sum())} of {over.numel()} values over; max |diff| {float(err.max()):.3g}")


# -- byte counts -------------------------------------------------------------------------
def check_bytes(actual, terms: Mapping[str, int], *, what: str = "bytes") -> int:
    """Exact byte-count contract for a product formula.

    Args:
        actual: the learner's count; must be an exact int.
        terms: the formula's factors in order, e.g. {"K and V": 2, "layers": 4, ...};
            the expected count is their product.

    Returns:
        The expected count (== actual).

    Raises:
        ContractError: showing both numbers, the formula, and (as its ``hint``) every single
            term that, with another integer value, would give the learner's number (e.g. "'K and V'
            = 1 instead of 2"); the ratio got/expected when no single term does.
    """
    got = check_int(what, actual)
    expected = math.prod(terms.values())
    if got == expected:
        return expected
    formula = " * ".join(f"{name} {value}" for name, value in terms.items())
    hints = []
    for name, value in terms.items():
        rest = expected // value if value else 0
        if rest and got % rest == 0 and got // rest > 0:
            hints.append(f"'{name}' = {got // rest} instead of {value}")
    ratio = f"; ratio got/expected = {got / expected:.6g}" if expected and not hints else ""
    raise ContractError(f"{what}: expected {expected:,} = {formula}, got {got:,}{ratio}",
                        hint=("your number is what the formula gives with " + " or ".join(hints)) if hints else "")
