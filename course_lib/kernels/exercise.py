"""Kernels the learner writes: the course's launchers, and the checks every launch runs.

A kernel exercise fixes a ``@triton.jit`` kernel's signature and leaves its body to the learner.
The course supplies everything around it, as the Triton puzzles do: the allocation, the grid and
the block sizes. :func:`launcher` returns the function that launches a learner's kernel for one
exercise; the lab checkers (``course_lib.grading``) call it, in the notebook and in the grader's
sandbox alike. Every launch

1. accepts only a function decorated with ``@triton.jit`` outside ``course_lib`` (a PyTorch
   function, or the course's own kernel, in its place is refused with a message saying so);
2. places each tensor inside a larger buffer: inputs surrounded by poison (NaN for floats), outputs
   by a sentinel that is checked after the launch, and 2-D tensors with a row stride wider than a
   row (GUARD_COLUMNS more for inputs, OUTPUT_GUARD_COLUMNS for outputs, so an output addressed with
   an input's stride strays), so that a column index past the last one lands in padding, never in
   the next row;
3. under Triton's interpreter, traces every load, store and atomic: each lane its mask lets through must
   address an element of one of the launch's tensors. The first lane that does not stops the
   launch before the access, and the report names the tensor, the element index and whether it
   was a load or a store (with the poison and the sentinel, this is what a compiled launch on a GPU
   cannot do: there a stray read shows only as NaN in the output, a stray write as a changed
   sentinel). A masked load without ``other=`` reads NaN in its masked lanes (float32 and float64),
   where the interpreter alone would read 0: on a GPU those lanes are undefined.

A launcher returns its outputs and a report, all plain data (it crosses the grading judge's channel,
``course_grader.remote``): ``kernel`` (its name), ``mode`` (``"interpreter"`` or ``"compiled"``),
``traced`` (whether the address trace ran), ``grid``, ``loaded`` / ``stored`` (lanes per tensor),
``violation`` (None, or the first stray lane's ``op`` (load, store or atomic), ``tensor``, ``index`` (decoded with that tensor's
strides, out of range), ``shape``, ``strides`` (in elements), ``lanes`` (how many lanes of that access strayed), ``program``,
``inside_buffer`` and ``steps``: the element step along each axis of the access's block of
addresses, so a row stride the kernel got wrong shows), ``guard_writes``
(outputs whose sentinel changed), ``error`` (None, or ``"Type: message"`` of what the kernel
raised), ``compiled`` and ``compile_error``: after an interpreted launch that raised nothing and
strayed nowhere, whether Triton's compiler also builds the kernel for a GPU (``COMPILE_TARGET``; no
GPU needed) and, when it refuses, its message; ``compiled`` is None where that was not tried (a
compiled launch, or a compiler that cannot run here); ``bytes`` (the least the launch must move: each
element it needs read once, each output written once), ``seconds`` and ``bandwidth_gbps``: on a GPU
(a compiled launch) the median time of ``SPEED_REPEATS`` launches after ``SPEED_WARMUP`` (CUDA events)
and the device's measured copy bandwidth, so ``bytes / seconds`` is the achieved bandwidth; None under
the interpreter, where a time would say nothing about the kernel (``NOT_MEASURED``). No score uses them.

For grading, :func:`export_kernel` turns a learner's kernel into plain data (its source, its helpers'
and the constants they read) and :func:`rebuild_kernel` makes it again in another process, which the
grading judge launches it in (``course_grader.kernel_runner``): what a notebook changed in its own
process is not there.

Where triton does not import (macOS, Windows), :data:`triton` and :data:`tl` are stand-ins: a
notebook's kernel cell still defines its kernel, and a launch raises :class:`TritonUnavailable`
saying that the exercise needs Triton, so the rest of the lab runs.

Sources: the masked-load and program-id model is Triton's (Tillet, Kung, Cox, "Triton: an
intermediate language and compiler for tiled neural network computations", MAPL 2019); the
interpreter's builder (``triton.runtime.interpreter.InterpreterBuilder``) is where loads and stores
are traced; ``docs/kernels.md`` describes the exercises.
"""
from __future__ import annotations

import ast
import builtins
import functools
import inspect
import math
import sys
import textwrap
from types import FunctionType
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..validation import ArgumentTypeError, instance, positive_number, power_of_two
from . import check_tile, import_triton
from .gemv import check_gemv_inputs
from .paged_attention import check_paged_decode_inputs
from .w4a16 import check_w4a16_inputs

__all__ = ["triton", "tl", "TritonUnavailable", "KernelSourceError", "NEEDS_TRITON", "launcher", "LAUNCHERS", "launch_gemv", "launch_rms_norm",
           "launch_w4a16", "launch_paged_decode",
           "is_triton_kernel", "restore_triton", "export_kernel", "rebuild_kernel", "KERNEL_DATA_LIMITS", "guarded", "guard_changed", "GUARD_ROWS", "GUARD_COLUMNS",
           "OUTPUT_GUARD_COLUMNS", "SENTINEL", "NOT_MEASURED", "SPEED_WARMUP", "SPEED_REPEATS", "time_launch"]

#: Rows of poison above and below each guarded 2-D tensor, and elements before and after a 1-D one.
GUARD_ROWS = 1
#: Extra columns of poison at the end of each row of a guarded 2-D input (the row stride is wider).
GUARD_COLUMNS = 3
#: Extra columns of sentinel at the end of each row of a guarded 2-D output: not GUARD_COLUMNS, so an
#: output addressed with an input's row stride (the same shape, a different stride) strays.
OUTPUT_GUARD_COLUMNS = 5
#: What surrounds an output: a value a kernel is very unlikely to compute.
SENTINEL = -12345.0

NEEDS_TRITON = ("this exercise needs Triton, which imports on Linux x86_64 only (Triton's interpreter runs it on "
                "the CPU there); the rest of the lab runs without it")


class TritonUnavailable(RuntimeError):
    """A kernel exercise was launched where triton does not import."""


class KernelSourceError(TypeError):
    """A learner's kernel uses, in its source, what Triton's compiler would refuse and its interpreter
    would run as Python (``_check_kernel_source``): the learner's error, reported as a failed check."""


class _MissingTritonLanguage:
    """``tl`` where triton does not import: ``tl.constexpr`` exists (annotations read it when a
    kernel is defined); anything else raises :class:`TritonUnavailable`."""

    constexpr = "constexpr"

    def __getattr__(self, name: str):
        raise TritonUnavailable(f"triton.language.{name}: {NEEDS_TRITON}")


class _KernelWithoutTriton:
    """What ``triton.jit`` gives where triton does not import: the function, kept for its name."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        raise TritonUnavailable(f"{self.fn.__name__}: {NEEDS_TRITON}")


class _MissingTriton:
    """``triton`` where it does not import: ``triton.jit`` and ``triton.cdiv`` work; anything else raises."""

    @staticmethod
    def jit(fn=None, **kwargs):
        return _KernelWithoutTriton(fn) if fn is not None else _KernelWithoutTriton

    @staticmethod
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    def __getattr__(self, name: str):
        raise TritonUnavailable(f"triton.{name}: {NEEDS_TRITON}")


triton, tl = import_triton()
if triton is None:
    triton, tl = _MissingTriton(), _MissingTritonLanguage()


def _kernel_types() -> tuple[type, ...]:
    """The classes ``@triton.jit`` returns in this triton (compiled and interpreted); () without triton."""
    if isinstance(triton, _MissingTriton):
        return ()
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return JITFunction, InterpretedFunction


def is_triton_kernel(obj) -> bool:
    """True when OBJ is exactly what ``@triton.jit`` returns (not a subclass, not a Python function)."""
    return type(obj) in _kernel_types() and isinstance(getattr(obj, "fn", None), FunctionType)


def _learner_kernel(kernel, name: str) -> bool:
    """Check that KERNEL is the learner's ``@triton.jit`` function; return whether it was built for
    the interpreter.

    Raises:
        TritonUnavailable: triton does not import here.
        TypeError: KERNEL is not a ``@triton.jit`` function (a Python function, a lambda, ...).
        ValueError: it is one of course_lib's own kernels, or it was compiled for a GPU and this
            process has none.
    """
    if isinstance(kernel, _KernelWithoutTriton) or not _kernel_types():
        raise TritonUnavailable(f"{name}: {NEEDS_TRITON}")
    if not is_triton_kernel(kernel):
        raise TypeError(f"{name} must be a function decorated with @triton.jit (the course launches it on a grid of "
                        f"programs), got {type(kernel).__module__}.{type(kernel).__qualname__}: a kernel exercise "
                        "is answered by a Triton kernel, not by a function that computes the result another way")
    if str(getattr(kernel.fn, "__module__", "") or "").startswith("course_lib"):
        raise ValueError(f"{name} is course_lib's kernel {kernel.fn.__module__}.{kernel.fn.__qualname__}; the "
                         "exercise asks for your own")
    _check_kernel_source(kernel, name)
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    if not interpreted and not torch.cuda.is_available():
        raise ValueError(f"{name} was compiled for a GPU, and there is none here: set TRITON_INTERPRET=1 before "
                         "the cell that defines it runs (the lab's set-up cell does this), then run that cell again")
    return interpreted


# -- what a kernel's body may use -----------------------------------------------------------------
#: Python builtins a kernel body may name: those Triton's compiler accepts in a kernel, and the
#: exceptions a stub or a check raises.
KERNEL_BUILTINS = frozenset({"range", "min", "max", "float", "int", "bool", "abs", "len", "print", "isinstance",
                             "zip", "enumerate", "NotImplementedError", "ValueError", "AssertionError"})
#: Statements and expressions Triton's compiler does not accept in a kernel; under the interpreter they
#: would run as plain Python (an import, a nested function, a comprehension reaching the launcher's data).
_REFUSED_NODES = {ast.Import: "an import", ast.ImportFrom: "an import", ast.Global: "a global statement",
                  ast.Nonlocal: "a nonlocal statement", ast.Lambda: "a lambda", ast.FunctionDef: "a nested function",
                  ast.AsyncFunctionDef: "a nested function", ast.ClassDef: "a class", ast.Try: "a try statement",
                  ast.With: "a with statement", ast.Delete: "a del statement", ast.ListComp: "a comprehension",
                  ast.SetComp: "a comprehension", ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator",
                  ast.Yield: "a yield", ast.YieldFrom: "a yield", ast.Await: "an await", ast.NamedExpr: "a := expression",
                  ast.Match: "a match statement"}


@functools.cache
def _value_attributes() -> frozenset[str]:
    """Attributes a kernel may read on its values (tensors, pointers, dtypes, constexprs): the public
    ones of ``tl.tensor`` and ``tl.dtype`` and a few of their fields; never the interpreter's
    ``handle`` (raw numpy data) or anything starting with ``_``."""
    names = {n for cls in (tl.tensor, tl.dtype) for n in dir(cls) if not n.startswith("_")}
    return frozenset((names | {"dtype", "shape", "element_ty", "numel", "value", "primitive_bitwidth"}) - {"handle"})


def _language_module(value) -> bool:
    """Whether VALUE is the module triton or a triton.language module itself (by identity)."""
    return any(value is module for module, _ in _LANGUAGE.values())


def _language_member(module, attr: str, obj) -> bool:
    """Whether OBJ is what MODULE (a language module) held under ATTR when this module was imported: a
    name planted in triton.language later, or a function whose ``__module__`` claims triton, is not."""
    recorded = _LANGUAGE.get(getattr(module, "__name__", None))
    if recorded is None or recorded[0] is not module or recorded[1].get(attr, _MISSING) is not obj:
        return False
    if inspect.ismodule(obj):           # tl.core.inspect is a member too: only language modules count
        return _language_module(obj)
    defined_in = getattr(obj, "__module__", "") if callable(obj) else getattr(type(obj), "__module__", "")
    return str(defined_in or "").startswith("triton")      # not functools.wraps, imported by tl.core


def _language_value(obj) -> bool:
    """Whether OBJ is one of the language modules' own members (``tl.sum``, ``tl.float32``), by identity."""
    return id(obj) in _LANGUAGE_IDS


def _constant(value) -> bool:
    """Whether a global VALUE may be named in a kernel as a constant: exactly a number, a string, None,
    one of triton.language's own dtypes (``tl.float32``, by identity), or a ``tl.constexpr`` holding one
    (a constexpr can hold anything, a function too). Exact types: a subclass could carry a ``__call__``
    or lie about its ``__class__``, and a new dtype instance could carry its own methods."""
    if type(value) is tl.constexpr:
        if set(vars(value)) - {"value", "type"}:    # nothing planted on the constexpr itself
            return False
        value = value.value
    # a dtype only as triton.language defines it (tl.float32): a new instance could carry its own methods
    return value is None or type(value) in (int, float, bool, str) or (type(value) in _DTYPE_TYPES and _language_value(value))


_MISSING = object()


def _dtype_classes() -> frozenset:
    """tl.dtype and its subclasses defined in triton (pointer_type, block_type, ...), as triton defines them."""
    found, stack = set(), [tl.dtype]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.add(cls)
            stack.extend(cls.__subclasses__())
    return frozenset(found)


_DTYPE_TYPES = frozenset() if isinstance(triton, _MissingTriton) else _dtype_classes()


#: The builtins a kernel may name, as they were when this module was imported.
_BUILTINS = {n: getattr(builtins, n) for n in KERNEL_BUILTINS}


def _machinery() -> dict[tuple[str, str], object]:
    """What reads, parses and compiles a kernel's source, for the rule and for the interpreter alike
    (``inspect.getsourcelines`` through ``linecache``, ``ast.parse``, ``compile`` and ``exec``): a
    replacement could show the rule one source and the interpreter another."""
    import linecache  # noqa: F401 (imported so that sys.modules holds it)
    import sys

    return {(module, attr): getattr(sys.modules[module], attr)
            for module, attrs in (("inspect", ("getsourcelines", "findsource", "getsourcefile", "getfile", "getblock",
                                               "getsource", "unwrap")),
                                  ("linecache", ("getlines", "getline", "updatecache", "checkcache")),
                                  ("ast", ("parse",)), ("textwrap", ("dedent",)), ("builtins", ("compile", "exec")))
            for attr in attrs if hasattr(sys.modules[module], attr)}


_MACHINERY = _machinery()


def _check_run_namespace(fn, name: str, def_lines: Sequence[str]) -> None:
    """Refuse a kernel whose globals would change what its checked source does when the interpreter runs
    it. The interpreter does not run ``fn``: it rewrites the source (from the definition line on) and
    runs the result in ``fn.__globals__``, where the rewrite's own names (``interpreter_semantic`` for
    every assignment, ``_InterpreterComparison`` for a chained comparison: found by rewriting this very
    source) and the builtins are looked up at run time. Each must be the interpreter's or Python's own
    object; the globals a plain dict.

    Raises:
        KernelSourceError: naming the global that is not what the interpreter expects.
    """
    from triton.runtime import interpreter

    namespace = fn.__globals__
    if type(namespace) is not dict:
        raise KernelSourceError(f"{name}: the kernel's globals are a {type(namespace).__qualname__}, not a plain dict "
                                "(define the kernel in a notebook cell or a module)")
    if namespace.get("__builtins__", builtins) not in (builtins, vars(builtins)):
        raise KernelSourceError(f"{name}: `__builtins__` was replaced in the kernel's module; the kernel's builtins "
                                "must be Python's own")
    import sys

    replaced = sorted(f"{m}.{a}" for (m, a), obj in _MACHINERY.items() if getattr(sys.modules.get(m), a, _MISSING) is not obj)
    if replaced:
        raise KernelSourceError(f"{name}: {', '.join(replaced)} were replaced; the functions that read, parse and compile "
                                "a kernel's source must be Python's own (a replacement could show this check one "
                                "source and the interpreter another)")
    changed = sorted(n for n, obj in _BUILTINS.items() if getattr(builtins, n, _MISSING) is not obj)
    if changed:
        raise KernelSourceError(f"{name}: the builtins {', '.join(changed)} were replaced; a kernel's builtins must be "
                                "Python's own")
    transformer = getattr(getattr(interpreter, "FunctionRewriter", None), "ast_transformer", None)
    if transformer is None:
        return
    original = ast.parse(textwrap.dedent("".join(def_lines)))
    before = {n.id for n in ast.walk(original) if isinstance(n, ast.Name)}
    rewritten = transformer.visit(ast.parse(textwrap.dedent("".join(def_lines))))
    bound = {a.arg for n in ast.walk(rewritten) if isinstance(n, ast.Lambda) for a in n.args.args}
    inserted = {n.id for n in ast.walk(rewritten) if isinstance(n, ast.Name)} - before - bound
    for inserted_name in sorted(inserted):
        own = getattr(interpreter, inserted_name, _MISSING)
        if inserted_name in namespace and namespace[inserted_name] is not own:
            raise KernelSourceError(f"{name}: the global `{inserted_name}` is the interpreter's name for what it runs "
                                    "in place of your kernel's assignments and comparisons; it must not be "
                                    "defined in the kernel's module")


#: The annotations a kernel's definition may write (or a string): Triton's compiler evaluates them again.
_ANNOTATIONS = ("tl.constexpr", "triton.language.constexpr")


def _written_decorator_problem(top: ast.FunctionDef) -> tuple[str, int] | None:
    """(what, line) when the definition TOP is decorated other than exactly ``@triton.jit``; None otherwise
    (no decorator: ``triton.jit(fn)`` called by hand). From the source alone, as the next two."""
    decorators = [ast.unparse(d) for d in top.decorator_list]
    if decorators and decorators != ["triton.jit"]:
        return f"its decorators are {decorators}, not exactly @triton.jit", top.decorator_list[0].lineno
    return None


def _written_defaults(top: ast.FunctionDef) -> bool:
    """Whether the definition TOP writes a default, a keyword-only parameter, *args or **kwargs."""
    return bool(top.args.defaults or top.args.kw_defaults or top.args.vararg or top.args.kwarg)


def _written_annotation_problem(top: ast.FunctionDef) -> tuple[str, int] | None:
    """(what, line) for the first annotation of TOP other than ``_ANNOTATIONS`` or a string, or a return
    annotation; None when there is none."""
    for arg in top.args.posonlyargs + top.args.args + top.args.kwonlyargs:
        written = arg.annotation
        if written is not None and not (isinstance(written, ast.Constant) and type(written.value) is str) \
                and ast.unparse(written) not in _ANNOTATIONS:
            return f"the annotation of {arg.arg!r} is `{ast.unparse(written)[:80]}`, not tl.constexpr", written.lineno
    if top.returns is not None:
        return "the kernel has a return annotation", top.returns.lineno
    return None


def _local_names(top: ast.FunctionDef) -> set[str]:
    """The definition's parameters and the names its body assigns or deletes (its locals)."""
    local = {a.arg for a in top.args.args + top.args.kwonlyargs + top.args.posonlyargs}
    return local | {n.id for s in top.body for n in ast.walk(s)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def _check_kernel_object(kernel, fn, top: ast.FunctionDef, name: str, line0: int) -> None:
    """Refuse a ``@triton.jit`` object, or its function, changed after the decorator made it: what the
    interpreter runs is the object (its ``run``, ``rewrite``, ``rewriter``, pre-run hooks, keyword
    arguments) and the function's name, defaults and annotations, none of which is in the body the
    rule reads. Also refuse decorators other than ``@triton.jit`` (they run in the cell's scope) and
    defaults (the kernel's arguments all come from the launcher).

    Raises:
        KernelSourceError: naming what was changed.
    """
    def refuse(what: str, line: int = top.lineno):
        raise KernelSourceError(f"{name}, line {line0 + line}: {what}; a kernel is a function decorated with "
                                "@triton.jit and nothing else, left as the decorator made it")

    problem = _written_decorator_problem(top)
    if problem is None and top.decorator_list and not _language_module(fn.__globals__.get("triton")):
        problem = "its decorators are ['triton.jit'], not exactly @triton.jit", top.decorator_list[0].lineno
    if problem is not None:
        refuse(*problem)
    if vars(fn):
        refuse(f"attributes were set on the function ({', '.join(sorted(vars(fn)))[:200]})")
    if fn.__name__ != top.name or fn.__qualname__.split(".")[-1] != top.name:
        refuse(f"the function is named {fn.__name__!r} but defined as {top.name!r}")
    if fn.__defaults__ or fn.__kwdefaults__ or _written_defaults(top):
        refuse("a parameter has a default value, or the signature has *args or **kwargs (the launcher passes "
               "every argument)")
    for arg, annotation in fn.__annotations__.items():
        if annotation is not tl.constexpr and type(annotation) is not str:
            refuse(f"the annotation of {arg!r} is not tl.constexpr")
    problem = _written_annotation_problem(top)      # Triton's compiler evaluates the written annotations again
    if problem is not None:
        refuse(*problem)
    if type(kernel).__name__ == "InterpretedFunction":
        from triton.runtime.interpreter import FunctionRewriter, InterpretedFunction

        fresh = InterpretedFunction(fn)
        if set(vars(kernel)) != set(vars(fresh)) or type(kernel.rewriter) is not FunctionRewriter \
                or kernel.rewriter.fn is not fn or set(vars(kernel.rewriter)) - {"filename", "def_file_lineno", "def_lineno"} \
                != set(vars(fresh.rewriter)) - {"filename", "def_file_lineno", "def_lineno"} \
                or any(v is not None for v in (*kernel.kwargs.values(), *kernel.rewriter.kwargs.values())) \
                or kernel.pre_run_hooks or kernel.arg_names != fresh.arg_names:       # @triton.jit passes kwargs=None
            refuse("the @triton.jit object was changed after the decorator made it (an attribute set on it, its "
                   "function or rewriter swapped, a pre-run hook or keyword arguments added)")


def _shape(top: ast.FunctionDef) -> str:
    """A definition's structure, for spotting a copy of one of course_lib's kernels: its names (the function's,
    its parameters', its locals' and globals') renamed in order of first appearance, without its decorators,
    annotations and docstring; attributes (``tl.load``) and constants kept."""
    import copy

    tree = copy.deepcopy(top)
    tree.decorator_list, tree.returns, tree.name = [], None, "f"
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and type(first.value.value) is str:
        tree.body = tree.body[1:]
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation, node.arg = None, names.setdefault(node.arg, f"n{len(names)}")
        elif isinstance(node, ast.Name):
            node.id = names.setdefault(node.id, f"n{len(names)}")
    return ast.dump(tree, include_attributes=False)


@functools.cache
def _course_kernels() -> dict[str, str]:
    """The structure (``_shape``) of each of course_lib's own ``@triton.jit`` kernels -> its qualified name."""
    import importlib

    found = {}
    for module_name in ("course_lib.kernels.gemv", "course_lib.kernels.w4a16", "course_lib.kernels.paged_attention",
                        "course_lib.kernels.batch_invariant.triton_ops", __name__):
        for value in vars(importlib.import_module(module_name)).values():
            fn = getattr(value, "fn", None)
            if type(value) in _kernel_types() and isinstance(fn, FunctionType) and fn.__module__.startswith("course_lib"):
                top = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
                found[_shape(top)] = f"{fn.__module__}.{fn.__qualname__}"
    return found


def _check_kernel_source(kernel, name: str, seen: set | None = None) -> None:
    """Refuse a kernel whose body uses what Triton's compiler would refuse (module docstring): only its
    arguments and locals, triton / triton.language, constants, other ``@triton.jit`` functions and
    ``KERNEL_BUILTINS``; attributes of values from ``_value_attributes``. Under the interpreter a body
    runs as Python, so without this a "kernel" could compute its answer in PyTorch or read the
    launcher's memory; a GPU would not compile it.

    Raises:
        KernelSourceError (a TypeError): naming the construct or name that is not Triton, and its line.
    """
    seen = set() if seen is None else seen
    if id(kernel) in seen:
        return
    seen.add(id(kernel))
    fn = kernel.fn
    try:
        lines, _ = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError) as exc:
        raise KernelSourceError(f"{name}: the kernel's source cannot be read ({exc}); define it in a notebook cell or a file") from None
    # Triton's interpreter re-reads the source and compiles it from the LAST line that starts with "def "
    # (FunctionRewriter._find_def): another such line, in a docstring, a string or a comment, would be
    # what runs, unchecked.
    defs = [i for i, line in enumerate(lines) if line.strip().startswith("def ")]
    top = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if top is None:
        raise KernelSourceError(f"{name}: no function definition in the kernel's source")
    if len(defs) > 1:
        raise KernelSourceError(f"{name}, line {fn.__code__.co_firstlineno + defs[1]}: a line of the kernel's source other "
                                "than its own definition starts with `def ` (in a docstring, a string or a comment). "
                                "Triton's interpreter reads a kernel from the last such line, so it would run that text "
                                "instead: reword the line")
    if defs != [top.lineno - 1]:
        raise KernelSourceError(f"{name}, line {fn.__code__.co_firstlineno + top.lineno - 1}: write the kernel's definition "
                                "`def name(...)`, one space after `def`: Triton's interpreter finds a kernel by the last "
                                "source line that starts that way"
                                + (f", and here it would run line {fn.__code__.co_firstlineno + defs[-1]} instead" if defs else ""))
    line0 = fn.__code__.co_firstlineno - 1
    own = str(getattr(fn, "__module__", "") or "").startswith("course_lib")
    copied = None if own else _course_kernels().get(_shape(top))
    if own or copied is not None:
        raise KernelSourceError(f"{name} is course_lib's kernel {copied or fn.__module__ + '.' + fn.__qualname__}"
                                f"{' (a copy of its source)' if copied else ''}; the exercise asks for your own")
    _check_kernel_object(kernel, fn, top, name, line0)
    local = _local_names(top)
    body = [node for statement in top.body for node in ast.walk(statement)]      # what runs at launch
    _check_run_namespace(fn, name, lines[defs[0]:])
    value_attributes = _value_attributes()

    def refuse(node, what: str):
        raise KernelSourceError(f"{name}, line {line0 + getattr(node, 'lineno', 1)}: {what}. A Triton kernel may use only its "
                        "arguments, triton.language (tl), constants and other @triton.jit functions; a GPU would not "
                        "compile this, and here it would run as plain Python")

    def resolve(node):
        """The object a chain of attributes on a global name stands for, or None when it starts elsewhere."""
        if isinstance(node, ast.Name):
            if node.id in local or node.id not in fn.__globals__:
                return None
            value = fn.__globals__[node.id]
            if inspect.ismodule(value) and not _language_module(value):
                refuse(node, f"`{node.id}` is the module {value.__name__}, not triton.language")
            return value
        if isinstance(node, ast.Attribute):
            base = resolve(node.value)
            if base is None or not inspect.ismodule(base):
                return None
            if node.attr.startswith("_") or not hasattr(base, node.attr):
                refuse(node, f"{ast.unparse(node)} is not part of triton.language")
            obj = getattr(base, node.attr)
            if not _language_member(base, node.attr, obj):
                refuse(node, f"{ast.unparse(node)} is not part of triton.language (it was not there, or not "
                             "this, when triton was imported)")
            return obj
        return None

    for node in body:
        if type(node) in _REFUSED_NODES:
            refuse(node, f"{_REFUSED_NODES[type(node)]}")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            if node.id in fn.__globals__:
                value = fn.__globals__[node.id]
                if is_triton_kernel(value):
                    if not _language_value(value):
                        _check_kernel_source(value, f"{name} -> {node.id}", seen)
                elif not _language_module(value) and not _constant(value):
                    refuse(node, f"`{node.id}` is {type(value).__module__}.{type(value).__qualname__}, not a "
                                 "constant (a number, a string, a Triton dtype, or tl.constexpr of one)")
            elif node.id not in KERNEL_BUILTINS:
                refuse(node, f"`{node.id}` is not a Triton builtin")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                refuse(node, f"the attribute {node.attr} is private")
            base = resolve(node.value)
            if not inspect.ismodule(base) and node.attr not in value_attributes:
                refuse(node, f"`.{node.attr}` is not an attribute of a Triton value")
            resolve(node)


# -- a kernel as data ---------------------------------------------------------------------------------
#: Caps on a kernel sent as data (``export_kernel``): its @triton.jit functions (the kernel and its helpers),
#: characters of one function's source, the largest first line number, globals of one function and
#: characters of one string constant.
KERNEL_DATA_LIMITS = {"functions": 16, "source": 100_000, "line": 1_000_000, "globals": 256, "string": 10_000}


@functools.cache
def _language_names() -> dict[int, tuple[str, str]]:
    """id -> (module, attribute) of each member of the language modules as imported (the first name found)."""
    names: dict[int, tuple[str, str]] = {}
    for module_name, (_, namespace) in _LANGUAGE.items():
        for attr, member in namespace.items():
            names.setdefault(id(member), (module_name, attr))
    return names


def _binding(value, add: Callable) -> dict | None:
    """How the global VALUE of a checked kernel crosses as data, or None when it is nothing a kernel may name
    (the rule refused those already): ``{"constant": v}`` (a number, a string, None), ``{"module": name}`` (triton
    or a triton.language module), ``{"member": [module, attribute]}`` (``tl.float32``, ``tl.sum``),
    ``{"function": i}`` (another @triton.jit function, the I-th of the export: ADD exports it) or
    ``{"constexpr": binding}``."""
    if value is None or type(value) in (int, float, bool, str):
        return {"constant": value}
    if _language_module(value):
        return {"module": value.__name__}
    if _language_value(value):
        return {"member": list(_language_names()[id(value)])}
    if is_triton_kernel(value):
        return {"function": add(value)}
    if type(value) is tl.constexpr and not set(vars(value)) - {"value", "type"}:
        inner = _binding(value.value, add)
        return None if inner is None or set(inner) - {"constant", "member"} else {"constexpr": inner}
    return None


def export_kernel(kernel, name: str) -> dict:
    """A learner's kernel as plain data, for a grading process of its own to launch (``rebuild_kernel``): the
    source of the kernel and of every ``@triton.jit`` helper it names, each with its first line number and
    the globals it reads (constants, triton.language, the helpers); nothing else of the process that defined
    it. The grading judge launches a kernel this way so that what a notebook changed in its own process
    (numpy, torch.Tensor, Triton's compiler) is not there when the kernel runs.

    Returns:
        ``{"kernel": NAME, "interpreted": bool, "functions": [{"name", "line", "source", "globals":
        [[name, binding], ...]}, ...]}``, the kernel first (bindings: ``_binding``).

    Raises:
        what a launch raises for KERNEL (``_learner_kernel``): TritonUnavailable, TypeError (not a
        @triton.jit function), KernelSourceError (the rule), ValueError; KernelSourceError when it
        names more than ``KERNEL_DATA_LIMITS["functions"]`` functions.
    """
    interpreted = _learner_kernel(kernel, name)
    functions: list[dict] = []
    index: dict[int, int] = {}

    def add(k) -> int:
        if id(k) not in index:
            if len(functions) >= KERNEL_DATA_LIMITS["functions"]:
                raise KernelSourceError(f"{name} names more than {KERNEL_DATA_LIMITS['functions']} @triton.jit "
                                        "functions; the exercise needs a few")
            index[id(k)] = len(functions)
            entry: dict = {}
            functions.append(entry)
            fn = k.fn
            lines, first = inspect.getsourcelines(fn)
            source = textwrap.dedent("".join(lines))
            top = ast.parse(source).body[0]
            read = sorted({n.id for n in ast.walk(top) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                          - _local_names(top))
            bound = [[g, b] for g in read if g in fn.__globals__
                     for b in [_binding(fn.__globals__[g], add)] if b is not None]
            entry.update(name=fn.__name__, line=max(1, first), source=source, globals=bound)
        return index[id(k)]

    add(kernel)
    return {"kernel": name, "interpreted": interpreted, "functions": functions}


def rebuild_kernel(data, folder) -> object:
    """Make in this process the ``@triton.jit`` kernel that DATA describes (``export_kernel``'s format): each
    function's source is written to a file in FOLDER at its own line numbers (so the rule's messages name the
    notebook's lines), run in a namespace holding only the globals DATA binds, and decorated with
    ``@triton.jit`` here. DATA comes from the learner's process, which could send anything: its form is
    checked before any of it runs, and only a definition with at most ``@triton.jit`` as decorator,
    ``tl.constexpr`` (or a string) as annotations and no defaults runs (what a definition evaluates);
    launching the result applies the whole rule again (``_check_kernel_source``).

    Returns:
        the kernel, built for Triton's interpreter when DATA says the learner's was.

    Raises:
        TritonUnavailable: triton does not import here.
        KernelSourceError: DATA is not a kernel as ``export_kernel`` writes one (the message says what).
    """
    import os
    from pathlib import Path

    if isinstance(triton, _MissingTriton):
        raise TritonUnavailable(NEEDS_TRITON)

    def bad(what: str):
        raise KernelSourceError(f"the kernel sent for grading is not one the course can rebuild: {what}")

    def form(value, kind: type, what: str):
        if type(value) is not kind:
            bad(f"{what} is a {type(value).__name__}, not a {kind.__name__}")
        return value

    limits = KERNEL_DATA_LIMITS
    form(data, dict, "the data")
    if set(data) != {"kernel", "interpreted", "functions"}:
        bad(f"its fields are {sorted(map(str, data))[:8]}")
    form(data["kernel"], str, "kernel")
    interpreted = form(data["interpreted"], bool, "interpreted")
    functions = form(data["functions"], list, "functions")
    if not 1 <= len(functions) <= limits["functions"]:
        bad(f"{len(functions)} functions")

    def resolve(binding, depth: int = 0):
        """The object a binding names; ("function", i) for another function (bound once all are built)."""
        form(binding, dict, "a binding")
        if len(binding) != 1:
            bad("a binding with other than one field")
        (kind, value), = binding.items()
        if kind == "constant":
            if value is not None and type(value) not in (int, float, bool, str):
                bad(f"a constant of type {type(value).__name__}")
            if type(value) is str and len(value) > limits["string"]:
                bad("a string constant over the limit")
            return value
        if kind == "module" and type(value) is str and value in _LANGUAGE:
            return _LANGUAGE[value][0]
        if kind == "member" and type(value) is list and len(value) == 2 and value[0] in _LANGUAGE \
                and type(value[1]) is str and value[1] in _LANGUAGE[value[0]][1]:
            member = _LANGUAGE[value[0]][1][value[1]]
            if type(member) in _DTYPE_TYPES or is_triton_kernel(member):     # what a kernel may name of them
                return member
        if kind == "function" and type(value) is int and 0 <= value < len(functions):
            return ("function", value)
        if kind == "constexpr" and depth == 0:
            inner = resolve(value, 1)
            if type(inner) is tuple:
                bad("a constexpr holding a function")
            return tl.constexpr(inner)
        bad(f"a binding {kind!r} to {str(value)[:80]!r}")

    folder = Path(folder)
    built, namespaces, deferred = [], [], []
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpreted else "0"    # what @triton.jit reads when it runs
    try:
        for i, entry in enumerate(functions):
            form(entry, dict, f"function {i}")
            if set(entry) != {"name", "line", "source", "globals"}:
                bad(f"function {i} has the fields {sorted(map(str, entry))[:8]}")
            fn_name, line = form(entry["name"], str, "a name"), form(entry["line"], int, "a line")
            source, bindings = form(entry["source"], str, "a source"), form(entry["globals"], list, "globals")
            if not fn_name.isidentifier() or not 1 <= line <= limits["line"] or len(source) > limits["source"] \
                    or len(bindings) > limits["globals"]:
                bad(f"function {i}'s name, first line, source or globals are out of range")
            try:
                tree = ast.parse(source)
            except (SyntaxError, ValueError) as exc:
                bad(f"function {i}'s source does not parse ({exc})")
            top = tree.body[0] if len(tree.body) == 1 else None
            if not isinstance(top, ast.FunctionDef) or top.name != fn_name:
                bad(f"function {i}'s source is not exactly the definition of {fn_name}")
            problem = _written_decorator_problem(top) or _written_annotation_problem(top) \
                or (_written_defaults(top) and ("a default, a keyword-only parameter, *args or **kwargs", top.lineno))
            if problem:
                bad(f"{fn_name}'s definition has decorators, annotations or defaults a kernel's may not have: "
                    f"{problem[0]}")
            annotations = [a.annotation for a in top.args.posonlyargs + top.args.args + top.args.kwonlyargs
                           if a.annotation is not None]
            namespace = {"__name__": f"learner_kernel_{i}", "__builtins__": builtins}
            for pair in bindings:
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or not pair[0].isidentifier():
                    bad(f"a global of {fn_name} is not a [name, binding] pair")
                value = resolve(pair[1])
                if type(value) is tuple:
                    deferred.append((namespace, pair[0], value[1]))
                else:
                    namespace[pair[0]] = value
            roots = {ast.unparse(n).split(".")[0] for n in [*top.decorator_list, *annotations]
                     if not isinstance(n, ast.Constant)}
            if any(not _language_module(namespace.get(r)) for r in roots) or \
                    (top.decorator_list and namespace.get("triton") is not _LANGUAGE["triton"][0]):
                bad(f"{fn_name}'s decorator or annotations name something other than triton and triton.language")
            path = folder / f"kernel_{i}.py"
            path.write_text("\n" * (line - 1) + source)
            try:
                exec(compile(ast.increment_lineno(tree, line - 1), str(path), "exec"), namespace)
            except Exception as exc:        # an annotation naming what the module lacks, say
                bad(f"{fn_name}'s definition raised {type(exc).__name__}: {_message(exc)[:200]}")
            made = namespace[fn_name]
            kernel = made if top.decorator_list else triton.jit(made)
            namespace[fn_name] = kernel
            built.append(kernel)
            namespaces.append(namespace)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    for namespace, global_name, j in deferred:
        namespace[global_name] = built[j]
    return built[0]


# -- guarded buffers ------------------------------------------------------------------------------
def _poison(dtype: torch.dtype) -> float | int:
    """What surrounds an input: NaN for floating dtypes, the dtype's largest value for integers."""
    return math.nan if dtype.is_floating_point else torch.iinfo(dtype).max


def guarded(shape: Sequence[int], dtype: torch.dtype, device, fill, columns: int = GUARD_COLUMNS
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, buffer): a tensor of SHAPE inside a buffer filled with FILL, with GUARD_ROWS rows
    (2-D) or elements (1-D) of it before and after, and COLUMNS more at each row's end (2-D)."""
    if len(shape) == 1:
        buffer = torch.full((shape[0] + 2 * GUARD_ROWS,), fill, dtype=dtype, device=device)
        return buffer[GUARD_ROWS:GUARD_ROWS + shape[0]], buffer
    rows, cols = shape
    buffer = torch.full((rows + 2 * GUARD_ROWS, cols + columns), fill, dtype=dtype, device=device)
    return buffer[GUARD_ROWS:GUARD_ROWS + rows, :cols], buffer


def _guarded_input(t: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    view, buffer = guarded(tuple(t.shape), t.dtype, device, _poison(t.dtype))
    view.copy_(t)
    return view, buffer


def guard_changed(view: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether anything outside VIEW (any strided view of BUFFER) in BUFFER (filled with SENTINEL) was written."""
    outside = torch.ones(buffer.numel(), dtype=torch.bool, device=buffer.device)
    offset = view.storage_offset() - buffer.storage_offset()
    outside.as_strided(tuple(view.shape), tuple(view.stride()), offset).fill_(False)
    return not bool((buffer.reshape(-1)[outside] == SENTINEL).all())


# -- the address trace ----------------------------------------------------------------------------
class _OutOfBounds(Exception):
    """Raised inside the interpreter by a load or store that addresses no element of the launch's tensors."""


class _Region:
    """One tensor of a launch: its elements' byte addresses, and the buffer around it."""

    def __init__(self, name: str, view: torch.Tensor, buffer: torch.Tensor) -> None:
        self.name, self.shape, self.strides = name, tuple(view.shape), tuple(view.stride())
        self.base, self.itemsize = view.data_ptr(), view.element_size()
        self.low, self.high = buffer.data_ptr(), buffer.data_ptr() + buffer.numel() * buffer.element_size()
        if view.numel() == 0:       # an empty tensor's pointer is not in its buffer (torch gives 0): near it is nearest
            self.low = self.high = self.base
        self.order = sorted(range(view.dim()), key=lambda d: -self.strides[d])

    def index(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(inside, index): which ADDRESSES (int64 bytes) are elements of this tensor, and the element
        index each one decodes to (n, ndim), out of range for those that are not."""
        offset = addresses - self.base
        aligned = offset % self.itemsize == 0
        rest = offset // self.itemsize
        index = np.zeros((addresses.size, len(self.shape)), dtype=np.int64)
        inside = aligned.copy()
        for d in self.order:
            stride = max(self.strides[d], 1)
            index[:, d] = rest // stride
            rest = rest - index[:, d] * stride
            inside &= (index[:, d] >= 0) & (index[:, d] < self.shape[d])
        return inside & (rest == 0), index

    def near(self, address: int) -> int:
        """Bytes from ADDRESS to this tensor's buffer (0 inside it)."""
        return max(self.low - address, address - self.high + 1, 0)


def _steps(addresses: np.ndarray, itemsize: int) -> list[int | None]:
    """Per axis of a block of addresses, the step in elements between neighbours along it (None
    where the steps differ, or the axis has one lane): a (BLOCK_M, BLOCK_N) block of W built with
    row stride S shows [S, 1]."""
    steps: list[int | None] = []
    for axis in range(addresses.ndim):
        diff = np.diff(addresses, axis=axis)
        uniform = diff.size > 0 and bool((diff == diff.flat[0]).all()) and int(diff.flat[0]) % itemsize == 0
        steps.append(int(diff.flat[0]) // itemsize if uniform else None)
    return steps


def _undefined(interpreter, ptrs):
    """What a masked lane of a load without ``other=`` reads in a traced launch: NaN for float32 and
    float64 (a GPU leaves those lanes undefined; the interpreter alone would read 0, hiding the
    missing ``other``), None (the interpreter's zeros) for other dtypes."""
    dtype = ptrs.get_element_ty()
    np_dtype = interpreter._get_np_dtype(dtype)
    if np_dtype not in (np.float32, np.float64):
        return None
    return interpreter.TensorHandle(np.full(np.shape(ptrs.data), np.nan, dtype=np_dtype), dtype)


class _Trace:
    """Checks every lane of the interpreter's loads, stores and atomics against the launch's tensors
    (the methods ``InterpreterBuilder.create_masked_load`` / ``create_masked_store``, which every
    ``tl.load`` / ``tl.store`` reaches, masked or not, and ``create_atomic_rmw`` / ``create_atomic_cas``
    are wrapped while it is active). A lane must address a whole element: a pointer cast to a wider
    type must cover elements of the same tensor."""

    def __init__(self, regions: Sequence[_Region], dims: int = 3) -> None:
        self.regions = list(regions)
        self.dims = dims          # the grid's axes: a violation's program id has this many
        self.counts: dict[str, dict[str, int]] = {"load": {}, "store": {}}
        self.violation: dict | None = None
        self.active = False
        self._saved: tuple | None = None

    def _check(self, op: str, builder, ptrs, mask) -> None:
        addresses = np.asarray(ptrs.data).astype(np.int64)
        if mask is None:
            active = addresses.reshape(-1)
        else:
            active = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)].reshape(-1)
        if active.size == 0:
            return
        width = max(1, int(getattr(ptrs.get_element_ty(), "primitive_bitwidth", 8)) // 8)
        claimed = np.zeros(active.size, dtype=bool)
        for region in self.regions:
            inside, _ = region.index(active)
            if width > region.itemsize:     # a wider type through a cast pointer: its last element too
                inside &= region.index(active + (width - region.itemsize))[0]
            hits = int(inside.sum())
            if hits:
                counts = self.counts["store" if op == "atomic" else op]      # an atomic writes
                counts[region.name] = counts.get(region.name, 0) + hits
            claimed |= inside
        if claimed.all():
            return
        stray = active[~claimed]
        first = int(stray[0])
        region = min(self.regions, key=lambda r: r.near(first))
        _, index = region.index(np.array([first], dtype=np.int64))
        self.violation = {"op": op, "tensor": region.name, "index": [int(i) for i in index[0]],
                          "shape": list(region.shape), "strides": list(region.strides), "lanes": int(stray.size),
                          "inside_buffer": region.near(first) == 0,
                          "program": [int(i) for i in getattr(builder, "grid_idx", ())][:self.dims],
                          "steps": _steps(np.asarray(ptrs.data).astype(np.int64), region.itemsize)}
        raise _OutOfBounds(f"{op} outside the kernel's tensors")

    def __enter__(self) -> "_Trace":
        from triton.runtime import interpreter
        from triton.runtime.jit import JITFunction

        # triton.language's own @jit helpers (tl.sum, tl.max, ...) were built compiled when triton was
        # imported before TRITON_INTERPRET was set; inside an interpreted launch they run interpreted too.
        jit_call = JITFunction.__call__

        def interpreted_call(jit_self, *args, **kwargs):
            return interpreter.InterpretedFunction(jit_self.fn)(*args, **kwargs)

        JITFunction.__call__ = interpreted_call
        self._saved = (JITFunction, jit_call, None, None, None, None, None)
        builder = getattr(interpreter, "InterpreterBuilder", None)
        load = getattr(builder, "create_masked_load", None)
        store = getattr(builder, "create_masked_store", None)
        if load is None or store is None:
            return self               # this triton's interpreter cannot be traced: the guards remain
        trace = self

        def traced_load(builder_self, ptrs, mask, other=None, *args, **kwargs):
            trace._check("load", builder_self, ptrs, mask)
            if other is None:     # masked lanes without other=: undefined on a GPU, NaN here
                other = _undefined(interpreter, ptrs)
            return load(builder_self, ptrs, mask, other, *args, **kwargs)

        def traced_store(builder_self, ptrs, value, mask, *args, **kwargs):
            trace._check("store", builder_self, ptrs, mask)
            return store(builder_self, ptrs, value, mask, *args, **kwargs)

        rmw, cas = getattr(builder, "create_atomic_rmw", None), getattr(builder, "create_atomic_cas", None)

        def traced_rmw(builder_self, op, ptrs, value, mask, *args, **kwargs):
            trace._check("atomic", builder_self, ptrs, mask)
            return rmw(builder_self, op, ptrs, value, mask, *args, **kwargs)

        def traced_cas(builder_self, ptrs, *args, **kwargs):
            trace._check("atomic", builder_self, ptrs, None)
            return cas(builder_self, ptrs, *args, **kwargs)

        self._saved = (JITFunction, jit_call, builder, load, store, rmw, cas)
        builder.create_masked_load, builder.create_masked_store = traced_load, traced_store
        if rmw is not None and cas is not None:
            builder.create_atomic_rmw, builder.create_atomic_cas = traced_rmw, traced_cas
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            jit_function, jit_call, builder, load, store, rmw, cas = self._saved
            jit_function.__call__ = jit_call
            if builder is not None:
                builder.create_masked_load, builder.create_masked_store = load, store
            if rmw is not None and cas is not None:
                builder.create_atomic_rmw, builder.create_atomic_cas = rmw, cas


def _forget_rewritten() -> None:
    """Drop from the interpreter's cache (``InterpretedFunction.rewritten_fn``: function -> the Python
    function it runs) every entry but triton.language's own, so the launch rewrites the learner's kernel
    and helpers from the source ``_check_kernel_source`` read, not from an entry planted in the cache."""
    from triton.runtime.interpreter import InterpretedFunction

    cache = getattr(InterpretedFunction, "rewritten_fn", None)
    if isinstance(cache, dict):
        for fn in [f for f in cache if id(f) not in _LANGUAGE_FNS]:
            cache.pop(fn, None)


#: A compiled launch (on a GPU) is timed after its checked run: warm-up launches, then the median of timed ones.
SPEED_WARMUP, SPEED_REPEATS = 3, 20
#: What a kernel check says of speed where the kernel ran in Triton's interpreter.
NOT_MEASURED = "not measured (Triton's interpreter on the CPU; speed needs a GPU)"


@functools.cache
def _bandwidth_gbps() -> float:
    """This process's GPU's memory bandwidth in GB/s, measured once (a 256 MiB device copy)."""
    from .timing import measure_copy_bandwidth

    return measure_copy_bandwidth(nbytes=1 << 28, warmup=SPEED_WARMUP, repeats=SPEED_REPEATS)


def time_launch(launch: Callable[[], None], outputs: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Seconds one LAUNCH takes on the GPU (median, ``SPEED_*``), its OUTPUTS' buffers left as the checked
    launch wrote them (a kernel that accumulates into its output would change them)."""
    from .timing import median_ms

    saved = [buffer.clone() for _, buffer in outputs.values()]
    seconds = median_ms(launch, SPEED_WARMUP, SPEED_REPEATS) * 1e-3
    for (_, buffer), copy in zip(outputs.values(), saved):
        buffer.copy_(copy)
    return seconds


def _launch(kernel, name: str, interpreted: bool, grid: tuple[int, ...], args: Sequence,
            constexprs: Mapping[str, int], inputs: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
            outputs: Mapping[str, tuple[torch.Tensor, torch.Tensor]], traffic: int | None = None) -> dict:
    """Launch KERNEL on GRID with ARGS (tensors are the guarded views of INPUTS and OUTPUTS, name ->
    (view, buffer)) and the CONSTEXPRS as keywords; return the report (module docstring).
    INTERPRETED: what ``_learner_kernel`` said of KERNEL. TRAFFIC: the bytes the launch must move at least
    (default: every element of every view once)."""
    regions = [_Region(n, view, buffer) for n, (view, buffer) in {**inputs, **outputs}.items()]
    trace = _Trace(regions, len(grid))
    report: dict = {"kernel": name, "mode": "interpreter" if interpreted else "compiled", "traced": False,
                    "grid": list(grid), "loaded": {}, "stored": {}, "violation": None, "guard_writes": [],
                    "error": None, "compiled": None, "compile_error": None, "seconds": None, "bandwidth_gbps": None,
                    "bytes": int(traffic if traffic is not None else
                                 sum(view.numel() * view.element_size() for view, _ in {**inputs, **outputs}.values()))}
    params = list(inspect.signature(kernel.fn).parameters)
    if len(params) != len(args) + len(constexprs) or set(params[len(args):]) != set(constexprs):
        report["error"] = (f"TypeError: the kernel's parameters are ({', '.join(params)}); the exercise launches it with "
                           f"{len(args)} arguments then the constexprs {', '.join(constexprs)}: keep the signature the "
                           "notebook gives")[:1500]
        return report
    try:
        if interpreted:
            # Triton as imported (nothing planted in its language, interpreter or JIT since), the interpreter's
            # cache without learner entries, and a @triton.jit object made here from the checked function.
            restore_triton()
            _forget_rewritten()
            runner = type(kernel)(kernel.fn)
            with trace:
                report["traced"] = trace.active
                runner[grid](*args, **constexprs)
        else:
            compiled = type(kernel)(kernel.fn)
            compiled[grid](*args, **constexprs)
            torch.cuda.synchronize()
            report["seconds"] = time_launch(lambda: compiled[grid](*args, **constexprs), outputs)
            report["bandwidth_gbps"] = _bandwidth_gbps()
    except (Exception, SystemExit) as exc:       # the kernel's own exception is the report's error
        if trace.violation is None:
            cause = exc.__cause__ if type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None else exc
            report["error"] = f"{type(cause).__name__}: {_message(cause)}"[:1500]
    report["violation"] = trace.violation
    if interpreted and report["error"] is None and report["violation"] is None:
        report["compiled"], report["compile_error"] = _gpu_compile(kernel, args, constexprs)
    report["loaded"], report["stored"] = trace.counts["load"], trace.counts["store"]
    report["guard_writes"] = [n for n, (view, buffer) in outputs.items() if guard_changed(view, buffer)]
    return report


#: The GPU an interpreted launch also compiles the learner's kernel for (without running it): Triton's
#: compiler needs no GPU, and an H100 (CUDA, compute capability 9.0, 32-thread warps) is the course's
#: reference device. The interpreter runs some kernels a GPU's compiler refuses (a loop-carried value
#: that changes type, ``l = 0`` then ``l = l * c + ...`` in float32); this finds them.
COMPILE_TARGET = ("cuda", 90, 32)
_COMPILED: dict[tuple, tuple[bool, str | None]] = {}   # (code, globals, signature, constexprs) -> verdict


def _language_state() -> dict:
    """A snapshot of triton.language and of Triton's interpreter and JIT (``triton.runtime.interpreter``,
    ``triton.runtime.jit``): their modules' namespaces and the attributes of the classes they define.
    An interpreted launch leaves triton.language changed (the interpreter patches it for a launch; a
    ``@triton.jit`` helper called inside one, ``tl.sum`` say, patches ``tl.core`` again and never
    restores it, which the compiler then trips on), and notebook code could change any of them."""
    import sys
    from types import ModuleType

    modules = {name: module for name, module in list(sys.modules.items()) if isinstance(module, ModuleType) and
               (name in ("triton", "triton.runtime.interpreter", "triton.runtime.jit") or name.startswith("triton.language"))}
    state: dict = {name: dict(vars(module)) for name, module in modules.items()}
    for name, module in modules.items():
        for member in list(vars(module).values()):
            if isinstance(member, type) and member.__module__ == name:
                state[member] = dict(vars(member))
            elif not isinstance(member, (type, ModuleType)) and not callable(member) \
                    and type(getattr(member, "__dict__", None)) is dict:
                # instances such as tl.float32 or the interpreter's builder: a method set on one shadows its class's
                state[(id(member), "instance")] = (member, dict(vars(member)))
    return state


def _set_language_state(state: dict) -> None:
    """Make the modules and classes STATE (``_language_state``) recorded what it recorded: changed names
    set back, added ones removed, except in a module the names of the interpreter's own globals, which
    it copies into the namespace of every function it rewrites (``FunctionRewriter._compile_and_exec``;
    its cached rewrites of triton.language's helpers use them): those are set to the interpreter's
    objects."""
    import sys

    from triton.runtime import interpreter

    for key, recorded in state.items():
        if isinstance(key, tuple):         # an instance: its attributes as recorded
            instance, attributes = recorded
            now = vars(instance)
            for name in [n for n in now if n not in attributes]:
                del now[name]
            for name, value in attributes.items():
                if now.get(name, _MISSING) is not value:
                    now[name] = value
            continue
        target = sys.modules.get(key) if isinstance(key, str) else key
        if target is None:
            continue
        now = vars(target)
        for name in [n for n in now if n not in recorded]:
            if isinstance(key, str) and hasattr(interpreter, name):
                now[name] = getattr(interpreter, name)
            elif isinstance(key, str):
                del now[name]
            else:
                delattr(target, name)
        for name, value in recorded.items():
            if now.get(name, _MISSING) is not value:
                if isinstance(key, str):
                    now[name] = value
                elif name not in ("__dict__", "__weakref__", "__doc__"):
                    setattr(target, name, value)


if not isinstance(triton, _MissingTriton):      # loaded now, so that the snapshot below holds them as imported
    import triton.runtime.interpreter  # noqa: F401
    import triton.runtime.jit  # noqa: F401
#: Triton as this module found it (no launch has run yet: the set-up cell imports it first).
_PRISTINE_LANGUAGE = None if isinstance(triton, _MissingTriton) else _language_state()
#: triton and triton.language.* from that snapshot, name -> (module, its namespace): what a kernel may
#: name, by identity (``_check_kernel_source``).
_LANGUAGE: dict[str, tuple] = {} if _PRISTINE_LANGUAGE is None else {
    name: (sys.modules[name], namespace) for name, namespace in _PRISTINE_LANGUAGE.items()
    if isinstance(name, str) and (name == "triton" or name.startswith("triton.language"))}
_LANGUAGE_IDS = frozenset(id(v) for _, namespace in _LANGUAGE.values() for v in namespace.values())
#: The Python functions behind triton.language's own @jit helpers (keys the interpreter may cache).
_LANGUAGE_FNS = frozenset(id(v.fn) for _, namespace in _LANGUAGE.values() for v in namespace.values()
                          if isinstance(getattr(v, "fn", None), FunctionType))


def restore_triton() -> None:
    """Set triton, triton.language, Triton's interpreter and JIT (their namespaces, classes and module-level
    instances) back to how they were when this module was imported, as every learner launch does first.
    No-op where triton does not import."""
    if _PRISTINE_LANGUAGE is not None:
        _set_language_state(_PRISTINE_LANGUAGE)


def _swap_in_compiled(fn, swapped: list, seen: set) -> None:
    """Replace, in FN's globals and in triton.language, each function ``@triton.jit`` built for the
    interpreter that a compile would reach by a compiled build of the same function (recording the
    originals in SWAPPED): Triton's compiler refuses interpreted functions, and under TRITON_INTERPRET
    every ``@triton.jit`` function is one, triton.language's own helpers (``tl.cdiv``, ``tl.sum``) included."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if id(fn) in seen:
        return
    seen.add(id(fn))
    namespaces = [vars(module) for n, (module, _) in _LANGUAGE.items() if n != "triton"] if len(seen) == 1 else []
    namespaces.append(fn.__globals__)
    for namespace in namespaces:
        for name, obj in list(namespace.items()):
            if type(obj) is InterpretedFunction and isinstance(getattr(obj, "fn", None), FunctionType):
                swapped.append((namespace, name, obj))
                namespace[name] = JITFunction(obj.fn)
                if namespace is fn.__globals__:
                    _swap_in_compiled(obj.fn, swapped, seen)


def _gpu_compile(kernel, args: Sequence, constexprs: Mapping[str, int]) -> tuple[bool | None, str | None]:
    """Compile KERNEL for ``COMPILE_TARGET`` with the types of this launch's ARGS (Triton's
    ``mangle_type``) and its CONSTEXPRS: (True, None) when it compiles; (False, the compiler's message)
    when the compiler refuses it (a ``CompilationError``, or any error once ``_compile_canary`` has
    compiled: the kernel would not build on a GPU); (None, None) when the canary itself does not
    compile (no ptxas, an unwritable cache), which says nothing about the kernel. Cached per kernel source, argument types and constexprs."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.errors import CompilationError
    from triton.runtime.jit import JITFunction, mangle_type

    fn = kernel.fn
    names = list(inspect.signature(fn).parameters)
    positional = dict(zip([n for n in names if n not in constexprs], args))
    signature = {n: "constexpr" if n in constexprs else mangle_type(positional[n]) for n in names}
    key = (fn.__code__, id(fn.__globals__), tuple(signature.items()), tuple(sorted(constexprs.items())))
    if key in _COMPILED:
        return _COMPILED[key]

    def compile_for_gpu(kernel_fn, kernel_signature, kernel_constexprs) -> None:
        current, swapped = _language_state(), []
        try:
            _set_language_state(_PRISTINE_LANGUAGE)
            _swap_in_compiled(kernel_fn, swapped, set())
            triton.compile(ASTSource(JITFunction(kernel_fn), kernel_signature, constexprs=dict(kernel_constexprs)),
                           target=GPUTarget(*COMPILE_TARGET))
        finally:
            for namespace, name, obj in reversed(swapped):
                namespace[name] = obj
            _set_language_state(current)

    if "canary" not in _COMPILED:       # a kernel known to compile: if it does not, the compiler cannot run here
        try:
            compile_for_gpu(_compile_canary.fn, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 16})
            _COMPILED["canary"] = (True, None)
        except Exception as exc:
            _COMPILED["canary"] = (False, f"{type(exc).__name__}: {_message(exc)}"[:500])
    if not _COMPILED["canary"][0]:
        return None, None
    verdict: tuple[bool, str | None] = (True, None)
    try:
        compile_for_gpu(fn, signature, constexprs)
    except CompilationError as exc:
        verdict = (False, _message(exc).strip()[-1500:])
    except Exception as exc:    # the canary compiled, so the compiler works here: the kernel is what it refused
        verdict = (False, f"{type(exc).__name__}: {_message(exc)}".strip()[-1500:])
    _COMPILED[key] = verdict
    return verdict


if not isinstance(triton, _MissingTriton):
    @triton.jit
    def _compile_canary(x_ptr, n, BLOCK: tl.constexpr):
        """What the learners' kernels use (a loop with a loaded bound, masks, reductions): it must compile."""
        offsets = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for i in range(0, tl.cdiv(n, BLOCK)):
            acc += tl.load(x_ptr + i * BLOCK + offsets, mask=i * BLOCK + offsets < n, other=0.0)
        tl.store(x_ptr + offsets, acc / tl.sum(acc, axis=0) + tl.max(acc, axis=0), mask=offsets < n)


def _message(exc: BaseException) -> str:
    """str(EXC), or a stand-in when its __str__ raises (a learner's exception may)."""
    try:
        return str(exc)
    except Exception:
        return "<its message could not be read>"


def _device(interpreted: bool) -> str:
    return "cpu" if interpreted else "cuda"


# -- the exercises' launchers -----------------------------------------------------------------------
def _checked_blocks(kernel_name: str, **blocks: int) -> dict[str, int]:
    """BLOCKS (a launcher's argument name -> value), each a power of two (``tl.arange`` needs one) and
    together a tile ``check_tile`` accepts; ValueError otherwise."""
    blocks = {name: power_of_two(name, value, note="tl.arange needs one") for name, value in blocks.items()}
    check_tile(kernel_name, **blocks)
    return blocks


def _output(shape: Sequence[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """A guarded float32 output (view, buffer): the guards hold SENTINEL, the view NaN until stored."""
    view, buffer = guarded(shape, torch.float32, device, SENTINEL, OUTPUT_GUARD_COLUMNS)
    view.fill_(math.nan)
    return view, buffer


def launch_gemv(kernel, W: torch.Tensor, x: torch.Tensor, *, block_m: int, block_n: int
                ) -> tuple[torch.Tensor, dict]:
    """Launch a learner's GEMV kernel: y = W x (Lab 1).

    The kernel's signature: ``gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr)``; row ``r`` of W starts ``r * stride_wm`` elements after ``w_ptr`` and
    its columns are contiguous; x is contiguous; the kernel writes the M float32 values of y.
    The grid is ``(cdiv(M, BLOCK_M),)``: program ``i`` owns rows ``i * BLOCK_M`` to
    ``i * BLOCK_M + BLOCK_M - 1``.

    Args:
        kernel: the learner's ``@triton.jit`` function.
        W: (M, N) float32 or bfloat16; x: (N,), the same dtype. Copied into guarded buffers.
        block_m, block_n: powers of two, the kernel's BLOCK_M and BLOCK_N.

    Returns:
        (y, report): y (M,) float32 on the CPU, NaN where the kernel stored nothing; the report as
        the module docstring describes.

    Raises:
        TypeError / ValueError: as ``course_lib.kernels.gemv.reference_gemv`` for W and x; a block
            that is not a power of two or too large a tile; KERNEL not a learner's @triton.jit
            function. TritonUnavailable: triton does not import.
    """
    M, N = check_gemv_inputs(W, x)
    block_m, block_n = _checked_blocks("gemv_kernel", block_m=block_m, block_n=block_n).values()
    interpreted = _learner_kernel(kernel, "gemv_kernel")
    device = _device(interpreted)
    w_view, w_buffer = _guarded_input(W, device)
    x_view, x_buffer = _guarded_input(x, device)
    y_view, y_buffer = _output((M,), device)
    grid = (max(1, triton.cdiv(M, block_m)),)
    report = _launch(kernel, "gemv_kernel", interpreted, grid, (w_view, x_view, y_view, M, N, w_view.stride(0)),
                     {"BLOCK_M": block_m, "BLOCK_N": block_n},
                     {"W": (w_view, w_buffer), "x": (x_view, x_buffer)}, {"y": (y_view, y_buffer)})
    return y_view.detach().to("cpu").clone(), report


def launch_rms_norm(kernel, x: torch.Tensor, weight: torch.Tensor, eps: float, *, block_d: int
                    ) -> tuple[torch.Tensor, dict]:
    """Launch a learner's batch-invariant RMSNorm kernel: y = x * rsqrt(mean(x^2) + eps) * weight (Lab 6).

    The kernel's signature: ``rms_norm_kernel(x_ptr, w_ptr, y_ptr, R, D, stride_xr, stride_yr, eps,
    BLOCK_D: tl.constexpr)``; row ``r`` of x starts ``r * stride_xr`` elements after ``x_ptr`` (row
    ``r`` of y ``r * stride_yr`` after ``y_ptr``), columns contiguous; w holds D contiguous values.
    The grid is ``(R,)``: program ``r`` owns row ``r``.

    Args:
        kernel: the learner's ``@triton.jit`` function.
        x: (R, D) float32; weight: (D,) float32; eps: a finite number > 0. Copied into guarded buffers.
        block_d: a power of two, the kernel's BLOCK_D.

    Returns:
        (y, report): y (R, D) float32 on the CPU, NaN where the kernel stored nothing; the report as
        the module docstring describes.

    Raises:
        TypeError / ValueError: x or weight not float32 tensors of shapes (R, D) and (D,), R or D
            zero, eps not finite and > 0, block_d not a power of two, KERNEL not a learner's
            @triton.jit function. TritonUnavailable: triton does not import.
    """
    instance("x", x, torch.Tensor)
    instance("weight", weight, torch.Tensor)
    if x.dim() != 2 or weight.dim() != 1 or weight.shape[0] != x.shape[1] or min(x.shape) == 0:
        raise ValueError(f"rms_norm_kernel needs x (R, D) and weight (D,) with R, D >= 1, got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise ValueError(f"x and weight must be float32, got {x.dtype} and {weight.dtype}")
    eps = positive_number("eps", eps, note="added to mean(x^2) under the square root")
    (block_d,) = _checked_blocks("rms_norm_kernel", block_d=block_d).values()
    interpreted = _learner_kernel(kernel, "rms_norm_kernel")
    device = _device(interpreted)
    R, D = x.shape
    x_view, x_buffer = _guarded_input(x, device)
    w_view, w_buffer = _guarded_input(weight, device)
    y_view, y_buffer = _output((R, D), device)
    report = _launch(kernel, "rms_norm_kernel", interpreted, (R,),
                     (x_view, w_view, y_view, R, D, x_view.stride(0), y_view.stride(0), float(eps)),
                     {"BLOCK_D": block_d}, {"x": (x_view, x_buffer), "weight": (w_view, w_buffer)},
                     {"y": (y_view, y_buffer)})
    return y_view.detach().to("cpu").clone(), report


def launch_w4a16(kernel, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, group_size: int,
                 zeros: torch.Tensor | None = None, *, block_n: int, block_k: int) -> tuple[torch.Tensor, dict]:
    """Launch a learner's W4A16 kernel: y = x @ W_hat^T with W_hat dequantised from packed int4 codes
    in registers (Lab 4; the format: ``course_lib.kernels.w4a16``, ``docs/quantization.md#int4-packing``).

    The kernel's signature: ``w4a16_kernel(x_ptr, p_ptr, s_ptr, z_ptr, y_ptr, N, K, G, stride_xm,
    stride_pn, stride_sn, stride_zn, stride_ym, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr)``. Row ``m`` of x (row ``n`` of packed, scales, zeros; row ``m`` of y)
    starts ``m * stride_xm`` (``n * stride_pn``, ...) elements after its pointer, columns contiguous:
    byte ``k // 2`` of a packed row holds code ``k`` (even k in the low nibble), column ``k // G`` of
    scales and zeros its group's scale and zero point. With ``HAS_ZEROS`` False the codes are signed
    nibbles (-8..7) and z_ptr points to an empty tensor. The grid is ``(M, cdiv(N, BLOCK_N))``:
    program ``(m, j)`` owns y[m, j * BLOCK_N : (j + 1) * BLOCK_N].

    Args:
        kernel: the learner's ``@triton.jit`` function.
        x, packed, scales, group_size, zeros: as ``course_lib.kernels.w4a16.reference_w4a16`` (raw
            tensors): x (M, K), packed uint8 (N, ceil(K/2)), scales (N, K // group_size), zeros None
            or (N, K // group_size). Copied into guarded buffers.
        block_n, block_k: powers of two, the kernel's BLOCK_N and BLOCK_K.

    Returns:
        (y, report): y (M, N) float32 on the CPU, NaN where the kernel stored nothing; the report as
        the module docstring describes.

    Raises:
        TypeError / ValueError: as ``reference_w4a16`` for the tensors; a block that is not a power of
            two or too large a tile; KERNEL not a learner's @triton.jit function.
            TritonUnavailable: triton does not import.
    """
    M, N, K = check_w4a16_inputs(x, packed, scales, group_size, zeros)
    block_n, block_k = _checked_blocks("w4a16_kernel", block_n=block_n, block_k=block_k).values()
    interpreted = _learner_kernel(kernel, "w4a16_kernel")
    device = _device(interpreted)
    x_view, x_buffer = _guarded_input(x, device)
    p_view, p_buffer = _guarded_input(packed, device)
    s_view, s_buffer = _guarded_input(scales, device)
    z_view, z_buffer = _guarded_input(zeros if zeros is not None else torch.zeros(0, dtype=torch.uint8), device)
    y_view, y_buffer = _output((M, N), device)
    stride_z = z_view.stride(0) if zeros is not None else 0
    report = _launch(kernel, "w4a16_kernel", interpreted, (M, max(1, triton.cdiv(N, block_n))),
                     (x_view, p_view, s_view, z_view, y_view, N, K, int(group_size), x_view.stride(0),
                      p_view.stride(0), s_view.stride(0), stride_z, y_view.stride(0)),
                     {"HAS_ZEROS": zeros is not None, "BLOCK_N": block_n, "BLOCK_K": block_k},
                     {"x": (x_view, x_buffer), "packed": (p_view, p_buffer), "scales": (s_view, s_buffer),
                      "zeros": (z_view, z_buffer)}, {"y": (y_view, y_buffer)})
    return y_view.detach().to("cpu").clone(), report


def _guarded_cache(cache: torch.Tensor, n_heads: int, unread: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, buffer): a copy of CACHE (num_blocks, block_size, Hkv, D) laid out block, head, slot, column
    in a NaN buffer with a guard block after the pool, N_HEADS - Hkv + 1 guard heads in every block and
    GUARD_COLUMNS more columns per slot, so a KV head >= Hkv, a block id past the pool or a column past D
    lands in poison. The slots UNREAD (num_blocks, block_size) bool marks are NaN too."""
    num_blocks, block_size, n_kv, dim = cache.shape
    buffer = torch.full((num_blocks + 2 * GUARD_ROWS, n_kv + max(1, n_heads - n_kv), block_size, dim + GUARD_COLUMNS),
                        math.nan, dtype=cache.dtype, device=device)
    view = buffer[GUARD_ROWS:GUARD_ROWS + num_blocks, :n_kv, :, :dim].permute(0, 2, 1, 3)
    view.copy_(cache)
    view.masked_fill_(unread.to(device)[:, :, None, None], math.nan)
    return view, buffer


def launch_paged_decode(kernel, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Launch a learner's paged decode-attention kernel: one query per sequence over K/V kept in blocks
    (Lab 2; shapes and the block table as ``course_lib.kernels.paged_attention``).

    The kernel's signature: ``paged_decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cl_ptr, o_ptr, scale,
    stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_tb, stride_ob, stride_oh,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr)``. Element d of query head h
    of sequence b is at ``q_ptr + b * stride_qb + h * stride_qh + d``; slot s of physical block n, KV head
    g, column d of either cache at ``k_ptr`` (``v_ptr``) ``+ n * stride_kb + s * stride_ks + g * stride_kh
    + d`` (the two caches share their strides, which are not those of a contiguous tensor); entry i of
    sequence b's block table at ``bt_ptr + b * stride_tb + i``; its context length at ``cl_ptr + b``; the
    output like q with ``stride_ob``, ``stride_oh``. ``scale`` is 1 / sqrt(HEAD_DIM); ``GROUP`` = Hq / Hkv.
    The grid is ``(B, Hq)``: program ``(b, h)`` owns o[b, h, :] and reads KV head h // GROUP.

    What the launch holds for a kernel that reads what it should not: every slot of the pool that no
    sequence of the call reads (the rest of a last block, free blocks) is NaN, the table's entries past
    a row's ceil(context_lens[b] / block_size) blocks hold ``num_blocks`` (an id just past the pool:
    the guard block), and each cache block has poisoned heads after its Hkv real ones.

    Args:
        kernel: the learner's ``@triton.jit`` function.
        q, k_cache, v_cache, block_tables, context_lens: as ``reference_paged_decode_attention``
            (checked by ``check_paged_decode_inputs``), q float32 or bfloat16, block_size and D powers
            of two (``tl.arange`` spans a block's slots and a head's columns). Copied into guarded buffers.

    Returns:
        (o, report): o (B, Hq, D) float32 on the CPU, NaN where the kernel stored nothing; the report as
        the module docstring describes.

    Raises:
        ArgumentTypeError / ValueError: as ``check_paged_decode_inputs``; q not float32 or bfloat16; a
            block size or head dimension that is not a power of two; KERNEL not a learner's @triton.jit
            function. TritonUnavailable: triton does not import.
    """
    check_paged_decode_inputs(q, k_cache, v_cache, block_tables, context_lens)
    if q.dtype not in (torch.float32, torch.bfloat16):
        raise ArgumentTypeError(f"paged_decode_kernel is launched on float32 or bfloat16 queries and caches, got {q.dtype}")
    B, Hq, D = q.shape
    num_blocks, block_size, Hkv, _ = k_cache.shape
    power_of_two("the block size (k_cache.shape[1])", block_size, note="tl.arange spans a block's slots")
    power_of_two("the head dimension (q.shape[2])", D, note="tl.arange spans a head's columns")
    check_tile("paged_decode_kernel", block_size=block_size, head_dim=D)
    interpreted = _learner_kernel(kernel, "paged_decode_kernel")
    device = _device(interpreted)
    lens = [int(n) for n in context_lens.tolist()]
    table = block_tables.detach().to("cpu", torch.int64).clone()
    unread = torch.ones(num_blocks, block_size, dtype=torch.bool)
    for b, length in enumerate(lens):
        used = -(-length // block_size)
        slots = torch.arange(length)
        unread[table[b, slots // block_size], slots % block_size] = False
        table[b, used:] = num_blocks                      # padding: the guard block past the pool
    q_view, q_buffer = guarded((B, Hq * D), q.dtype, device, math.nan)
    q_view = q_view.view(B, Hq, D)
    q_view.copy_(q)
    k_view, k_buffer = _guarded_cache(k_cache, Hq, unread, device)
    v_view, v_buffer = _guarded_cache(v_cache, Hq, unread, device)
    t_view, t_buffer = _guarded_input(table.to(block_tables.dtype), device)
    c_view, c_buffer = _guarded_input(context_lens, device)
    o_flat, o_buffer = _output((B, Hq * D), device)
    o_view = o_flat.view(B, Hq, D)
    report = _launch(kernel, "paged_decode_kernel", interpreted, (B, Hq),
                     (q_view, k_view, v_view, t_view, c_view, o_view, 1.0 / math.sqrt(D),
                      q_view.stride(0), q_view.stride(1), k_view.stride(0), k_view.stride(1), k_view.stride(2),
                      t_view.stride(0), o_view.stride(0), o_view.stride(1)),
                     {"GROUP": Hq // Hkv, "BLOCK_SIZE": block_size, "HEAD_DIM": D},
                     {"q": (q_view, q_buffer), "k_cache": (k_view, k_buffer), "v_cache": (v_view, v_buffer),
                      "block_tables": (t_view, t_buffer), "context_lens": (c_view, c_buffer)},
                     {"o": (o_view, o_buffer)},
                     # what must be read: each sequence's L positions of K and V once, q, the used table entries
                     traffic=(2 * sum(lens) * Hkv * D + B * Hq * D) * q.element_size() + B * Hq * D * 4
                     + sum(-(-n // block_size) for n in lens) * block_tables.element_size()
                     + B * context_lens.element_size())
    return o_view.detach().to("cpu").clone(), report


#: The course's launcher of each kernel exercise, by name (the grading judge's call requests name
#: one: ``course_grader.remote.answer_call`` launches the learner's kernel through it).
LAUNCHERS: dict[str, Callable] = {"gemv": launch_gemv, "rms_norm": launch_rms_norm, "w4a16": launch_w4a16,
                                  "paged_decode": launch_paged_decode}


def launcher(kernel, exercise: str) -> Callable:
    """The function that launches KERNEL as kernel exercise EXERCISE (a key of :data:`LAUNCHERS`):
    ``launcher(gemv_kernel, "gemv")(W, x, block_m=4, block_n=16)`` returns ``(y, report)``.

    The grading judge passes the checkers a stand-in for the learner's kernel whose calls already
    launch it through the same launcher, in a process of the judge's own that rebuilt the kernel from
    its source (``export_kernel``, ``rebuild_kernel``; its ``launches`` attribute names the exercise);
    such a stand-in is returned as it is.

    Raises:
        KeyError: EXERCISE is not a kernel exercise.
    """
    instance("exercise", exercise, str)
    if exercise not in LAUNCHERS:
        raise KeyError(f"no kernel exercise {exercise!r}; the exercises are {sorted(LAUNCHERS)}")
    if not is_triton_kernel(kernel) and getattr(kernel, "launches", None) == exercise:
        return kernel
    return functools.partial(LAUNCHERS[exercise], kernel)
