"""Argument checks for course_lib's public entry points: one home for every "must be a positive int".

The library validates a value once, where it enters (a dataclass's ``__post_init__``, a public
function or method), with these functions, and lets the formulas inside read bare. Each check
returns the value it accepted, so a call site reads ``n = positive_integer("n", n)``.

Errors:
    ArgumentTypeError: the value is of the wrong *kind*: the wrong Python type, or a tensor of
        the wrong dtype. It is a ``TypeError`` and, for code written when course_lib raised
        ``ValueError`` for every bad argument, also a ``ValueError`` (numpy's ``AxisError`` is a
        ``ValueError`` and an ``IndexError`` for the same reason). New code should catch
        ``TypeError``.
    ValueError: the kind is right but the value is not allowed: out of range, wrong shape, empty.

    Every message names the argument and what is allowed, then what was given::

        block_size must be an int >= 1, got 0
        crop length must be an int in [0, 6] (at most the filled slots), got 2.5 of type float
        positions must hold values in [0, 511] (the model's max_seq_len is 512), got values from 522 to 525

What counts as an int: a Python ``int`` or a numpy integer scalar (``numbers.Integral``), returned
as a Python ``int``. Refused: ``bool`` (``True`` is an ``int`` subclass, never a size or an index),
floats even when whole (``2.0``), and torch tensors, 0-d ones included: a tensor kept as a length
or an index turns later arithmetic into tensor arithmetic (another device, another dtype, a
graph); convert it with ``int(t)``. ``strict=True`` refuses numpy integers too (for values a
learner's function returns, which are compared exactly).

What counts as a number: an ``int`` or ``float`` or a numpy scalar of those (``numbers.Real``),
not ``bool``; NaN is refused, and so is +-inf unless ``finite=False``. A number is returned
unchanged (an int stays an int, so exact byte counts stay exact).
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Iterable

__all__ = [
    "ArgumentTypeError", "MAX_TOKEN_ID", "is_integer", "integer", "positive_integer", "nonnegative_integer",
    "power_of_two", "number", "positive_number", "nonnegative_number", "boolean", "instance", "one_of",
    "token_ids", "integer_tensor", "materialized", "memory_bytes", "fits_memory", "ContextLengthError",
]

#: Largest token id any check accepts when no vocabulary size is given (ids are stored as int64).
MAX_TOKEN_ID: int = 2 ** 63 - 1


class ArgumentTypeError(TypeError, ValueError):
    """A value of the wrong kind (Python type or tensor dtype). A TypeError, and also a
    ValueError so that ``except ValueError`` written for older course_lib versions still works."""


class ContextLengthError(ValueError):
    """A request past a context limit: a position at or beyond a model's ``max_seq_len``, a generation
    that would reach one, or an append that would grow a cached sequence past the limit its cache
    was given. The course's policy past the context is to refuse, before anything is computed or
    written; nothing slides out of the window (docs/kv_cache.md#past-the-context). A ValueError, so
    ``except ValueError`` catches it."""


# -- messages ------------------------------------------------------------------------------
def _range_text(minimum, maximum, open_minimum: bool = False, open_maximum: bool = False) -> str:
    """' in [0, 7]', ' >= 1', ' in (0, 1]', ' < 4' or '' (no bound)."""
    if minimum is not None and maximum is not None:
        return f" in {'(' if open_minimum else '['}{minimum}, {maximum}{')' if open_maximum else ']'}"
    if minimum is not None:
        return f" {'>' if open_minimum else '>='} {minimum}"
    if maximum is not None:
        return f" {'<' if open_maximum else '<='} {maximum}"
    return ""


def _note(note: str | None) -> str:
    return f" ({note})" if note else ""


def _short(value: Any) -> str:
    """repr(value), shortened for tensors and long containers."""
    kind = type(value)
    if kind.__module__.startswith("torch") and hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _given(value: Any) -> str:
    """What was given, for a type error: 'True of type bool', 'a tensor of shape () and dtype ...'."""
    text = _short(value)
    return text if text.startswith("a tensor of shape") else f"{text} of type {type(value).__qualname__}"


def _article(word: str) -> str:
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _type_error(name: str, allowed: str, value: Any, note: str | None, convert: str) -> ArgumentTypeError:
    kind = type(value)
    hint = f" (convert it with {convert}(...))" if kind.__module__.split(".")[0] in ("numpy", "torch") else ""
    return ArgumentTypeError(f"{name} must be {allowed}{_note(note)}, got {_given(value)}{hint}")


# -- integers ------------------------------------------------------------------------------
def is_integer(value: Any, *, strict: bool = False) -> bool:
    """True for a Python int or (unless ``strict``) a numpy integer scalar; False for bool,
    floats, tensors and everything else."""
    if type(value) is int:
        return True
    return not strict and isinstance(value, Integral) and not isinstance(value, bool)


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
            strict: bool = False, note: str | None = None) -> int:
    """``value`` as a Python int, checked to lie in [minimum, maximum] (a None bound is open).

    Args:
        name: the argument's name as the caller knows it (``"block_id"``, ``"ModelConfig.n_layers"``).
        minimum, maximum: inclusive bounds, or None.
        strict: accept only a built-in int (no numpy integers).
        note: a short reason shown in parentheses after the allowed range.

    Raises:
        ArgumentTypeError: not an int (bool, float, tensor, str, ...).
        ValueError: outside [minimum, maximum].
    """
    if not is_integer(value, strict=strict):
        raise _type_error(name, "an int" + _range_text(minimum, maximum), value, note, "int")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an int{_range_text(minimum, maximum)}{_note(note)}, got {value!r}")
    return value


def positive_integer(name: str, value: Any, *, maximum: int | None = None, strict: bool = False,
                     note: str | None = None) -> int:
    """``integer(name, value, minimum=1, ...)``: a size or a count that cannot be zero."""
    return integer(name, value, minimum=1, maximum=maximum, strict=strict, note=note)


def nonnegative_integer(name: str, value: Any, *, maximum: int | None = None, strict: bool = False,
                        note: str | None = None) -> int:
    """``integer(name, value, minimum=0, ...)``: a count or an offset that may be zero."""
    return integer(name, value, minimum=0, maximum=maximum, strict=strict, note=note)


def power_of_two(name: str, value: Any, *, note: str | None = None) -> int:
    """A positive int that is a power of two (1, 2, 4, ...), as a Python int.

    Raises:
        ArgumentTypeError: not an int. ValueError: zero, negative or not a power of two.
    """
    allowed = "a positive power of two (an int: 1, 2, 4, ...)"
    if not is_integer(value):
        raise _type_error(name, allowed, value, note, "int")
    value = int(value)
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be {allowed}{_note(note)}, got {value!r}")
    return value


# -- real numbers --------------------------------------------------------------------------
def number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
           open_minimum: bool = False, open_maximum: bool = False, finite: bool = True,
           note: str | None = None):
    """A real number (int or float, not bool), returned unchanged, checked against the bounds.

    Args:
        minimum, maximum: bounds, or None; inclusive unless ``open_minimum`` / ``open_maximum``
            (``number("mfu", x, minimum=0, maximum=1, open_minimum=True)`` is (0, 1]).
        finite: refuse +-inf (NaN is always refused).

    Raises:
        ArgumentTypeError: not a real number (bool, str, tensor, complex, None, ...).
        ValueError: NaN, an infinity when ``finite``, or outside the bounds.
    """
    def allowed() -> str:
        return ("a finite number" if finite else "a number") + _range_text(minimum, maximum, open_minimum,
                                                                          open_maximum)

    if isinstance(value, bool) or not isinstance(value, Real):
        raise _type_error(name, allowed(), value, note, "float")
    bad = (math.isnan(value) or (finite and math.isinf(value))
           or (minimum is not None and (value <= minimum if open_minimum else value < minimum))
           or (maximum is not None and (value >= maximum if open_maximum else value > maximum)))
    if bad:
        raise ValueError(f"{name} must be {allowed()}{_note(note)}, got {value!r}")
    return value


def positive_number(name: str, value: Any, *, note: str | None = None):
    """A finite number > 0 (a time, a rate, a byte count), returned unchanged."""
    return number(name, value, minimum=0, open_minimum=True, note=note)


def nonnegative_number(name: str, value: Any, *, note: str | None = None):
    """A finite number >= 0, returned unchanged."""
    return number(name, value, minimum=0, note=note)


# -- other kinds ---------------------------------------------------------------------------
def boolean(name: str, value: Any, *, note: str | None = None) -> bool:
    """A bool (``True``/``False`` only: 0, 1 and numpy bools are refused).

    Raises: ArgumentTypeError for anything else."""
    if type(value) is not bool:
        raise _type_error(name, "a bool (True or False)", value, note, "bool")
    return value


def instance(name: str, value: Any, kind: type | tuple[type, ...], *, note: str | None = None):
    """``value`` if it is an instance of ``kind`` (a class or a tuple of classes).

    Raises: ArgumentTypeError naming the expected class(es) and the type given."""
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        allowed = " or ".join(_article(k.__qualname__) for k in kinds)
        raise ArgumentTypeError(f"{name} must be {allowed}{_note(note)}, got {_given(value)}")
    return value


def one_of(name: str, value: Any, choices: Iterable, *, note: str | None = None):
    """``value`` if it equals one of ``choices`` (compared with ==; bools never match ints).

    Raises: ValueError listing the choices."""
    choices = list(choices)
    for choice in choices:
        if isinstance(choice, bool) != isinstance(value, bool):
            continue
        try:
            equal = bool(choice == value)
        except Exception:  # e.g. an array compared with a str: not a match
            equal = False
        if equal:
            return value
    raise ValueError(f"{name} must be one of {choices!r}{_note(note)}, got {_short(value)}")


def token_ids(name: str, value: Any, *, vocab_size: int | None = None) -> list[int]:
    """Token ids as a list of Python ints, each in [0, vocab_size - 1] (or [0, 2**63 - 1]).

    Args:
        value: a sequence of ints (list, tuple, numpy array) or a 1-D integer torch tensor; an
            empty sequence is allowed (callers that need a token check the length).
        vocab_size: the vocabulary size, or None when only int64 ids are required.

    Raises:
        ArgumentTypeError: a str/bytes, a non-iterable, a float or bool tensor, or an element
            that is not an int (named ``name[i]``).
        ValueError: a tensor that is not 1-D or on the ``meta`` device, or an id outside the
            vocabulary.
    """
    maximum = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
    note = None if vocab_size is None else f"vocab_size {vocab_size}"
    if type(value) is list and all(type(t) is int for t in value) and (
            not value or (min(value) >= 0 and max(value) <= maximum)):
        return list(value)            # the common case, checked in C; anything else is named below
    kind = type(value)
    if kind.__module__.startswith("torch") and hasattr(value, "dim"):
        integer_tensor(name, value, ranks=(1,), layout="(T,)", minimum=0, maximum=maximum, note=note)
        return [int(t) for t in value.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or getattr(value, "ndim", 1) != 1:
        raise ArgumentTypeError(f"{name} must be a sequence of int token ids or a 1-D integer tensor, got "
                                f"{_given(value)}")
    return [integer(f"{name}[{i}]", t, minimum=0, maximum=maximum, note=note) for i, t in enumerate(value)]


def integer_tensor(name: str, value: Any, *, ranks: tuple[int, ...] | None = None, layout: str | None = None,
                   dtype=None, minimum: int | None = None, maximum: int | None = None,
                   note: str | None = None):
    """A torch tensor of integers, checked for rank, dtype and value range; returned unchanged.

    The range is checked with one ``torch.aminmax`` reduction (one device synchronisation), so
    it costs about as much as one small kernel, whatever the tensor's size.

    Args:
        ranks: allowed numbers of dimensions, e.g. (1, 2); None accepts any.
        layout: how the shape is described in messages, e.g. "(T,) or (B, T)".
        dtype: the one torch dtype required (e.g. torch.int64); None accepts any integer dtype
            (bool, floating and complex dtypes are refused).
        minimum, maximum: inclusive bounds on every element, or None.

    Raises:
        ArgumentTypeError: not a tensor, or the wrong dtype.
        ValueError: a rank not in ``ranks``, or an element outside [minimum, maximum]; a tensor
            on the ``meta`` device (``materialized``).
    """
    import torch

    def expected() -> str:
        shape_text = f" of shape {layout}" if layout else (
            f" of rank {' or '.join(map(str, ranks))}" if ranks is not None else "")
        dtype_text = _article(str(dtype).removeprefix("torch.")) if dtype is not None else "an integer"
        return f"{name} must be {dtype_text} tensor{shape_text}{_note(note)}"

    if not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"{expected()}, got {_given(value)}")
    materialized(name, value)
    bad_dtype = value.dtype != dtype if dtype is not None else (
        value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool)
    if bad_dtype:
        raise ArgumentTypeError(f"{expected()}, got dtype {value.dtype}")
    if ranks is not None and value.dim() not in ranks:
        raise ValueError(f"{expected()}, got shape {tuple(value.shape)}")
    if (minimum is not None or maximum is not None) and value.numel():
        if value.numel() == 1:  # a decode step: one token, one position
            low = high = value.item()
        else:
            low, high = torch.stack(torch.aminmax(value)).tolist()
        if (minimum is not None and low < minimum) or (maximum is not None and high > maximum):
            got = f"{low}" if low == high else f"values from {low} to {high}"
            raise ValueError(f"{name} must hold values{_range_text(minimum, maximum)}{_note(note)}, got {got}")
    return value


def materialized(name: str, value: Any, *, note: str | None = None):
    """``value`` unchanged, unless it is a torch tensor on the ``meta`` device.

    A meta tensor has a shape and a dtype but no storage: every check that reads its values
    (``.item()``, ``int(t)``, ``bool(t.all())``, ``.tolist()``, ``.cpu()``) fails inside torch
    with a message that names neither the argument nor the cause. Call this where a tensor
    enters a public function, before the first reduction on it. Anything that is not a tensor
    passes unchanged (the caller's type checks come before or after, as it needs).

    Raises:
        ValueError: a tensor on the meta device, e.g. "w must be a tensor with data, on the cpu
            or cuda device, got one on the meta device (shape (8, 64), dtype torch.float32: ...)".
    """
    if getattr(value, "is_meta", False) and type(value).__module__.startswith("torch"):
        raise ValueError(f"{name} must be a tensor with data, on the cpu or cuda device{_note(note)}, got one on "
                         f"the meta device (shape {tuple(value.shape)}, dtype {value.dtype}: no values to check "
                         f"or compute with)")
    return value


# -- sizes that must fit ---------------------------------------------------------------------
def memory_bytes(device: Any = "cpu") -> int | None:
    """Total memory of DEVICE in bytes: a CUDA device's own memory, otherwise this machine's
    physical memory (``os.sysconf``); None where it cannot be read (then nothing is refused)."""
    import os

    import torch

    device = _device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def fits_memory(name: str, value: Any, nbytes: int, *, device: Any = "cpu", what: str = "") -> None:
    """Refuse, before allocating, a size argument whose allocation of ``nbytes`` bytes exceeds the
    total memory of ``device`` (``memory_bytes``): such a size would otherwise reach the allocator
    (an out-of-memory error after other allocations, or the machine swapping).

    Raises:
        ValueError: naming the argument, its value, the bytes it needs (``what`` says for what) and
            the memory there is.
    """
    total = memory_bytes(device)
    if total is not None and nbytes > total:
        raise ValueError(f"{name} = {value!r} needs {nbytes / 2 ** 30:,.1f} GiB ({nbytes:,} bytes)"
                         f"{' for ' + what if what else ''}, more than the {total / 2 ** 30:,.1f} GiB of memory "
                         f"{_device_text(device)}")


def _device(device: Any):
    """DEVICE as a torch.device; None is torch's default device (as in ``torch.zeros(device=None)``)."""
    import torch

    return torch.get_default_device() if device is None else torch.device(device)


def _device_text(device: Any) -> str:
    device = _device(device)
    return f"of the GPU {device}" if device.type == "cuda" else "of this machine (cpu)"
