"""Does a graded learner function reach course_lib's own reference for its exercise?

Every graded test's contract (``course_lib.grading.labNN.CONTRACTS``, ``Contract.references``)
names the course_lib functions that compute what its exercise asks for, e.g.
``course_lib.roofline.kv_bytes_per_token`` for Lab 1's ``kv_bytes_per_token``. A learner
function that only wraps one of them (``return int(_r.kv_bytes_per_token(config, b)) + 0``)
passes every black-box check, the judge's included. This module makes such reuse visible, in
two independent ways:

* **In the code** (``analyse``, ``Analysis.reaches``): the notebook's code cells are parsed
  with ``ast`` (IPython magics first rewritten by IPython's own input transformer) and never
  executed. Names are followed through module-level and local bindings: ``import a.b as r`` then
  ``r.f``; ``from a.b import f as g``; ``importlib.import_module("a.b")`` and ``__import__``
  with constant names; ``getattr(module, "f")``, ``vars(module)["f"]``, ``module.__dict__["f"]``
  and ``sys.modules["a.b"]`` with constant keys; ``globals()["name"] = ...``; containers,
  default arguments, decorators, closures, ``global`` statements, lambdas, classes and the
  return values of the notebook's own functions; and from one learner function into every
  learner function it names. A graded function *reaches* a reference when the analysis finds
  the reference object (resolved in this process by ``tables.resolve_reference``, so a
  re-export such as ``course_lib.models.apply_rope`` counts as ``course_lib.models.rope.apply_rope``)
  among the names its body, transitively, can evaluate.
* **At call time** (``watch_spec`` in the judge, ``Observer`` in the learner's kernel): while
  the judge calls a learner function, a profiler hook (``sys.setprofile`` and
  ``threading.setprofile``, on for that call only) records whether the code of a declared
  reference ran, matched by its qualified name and its file inside the ``course_lib`` package, or
  by a digest of its code (``_fingerprint``), so a renamed copy counts; the hook is installed with
  the interpreter's own profiler functions, taken once when the kernel loads this module.
  This catches what the code analysis cannot see: a reference called through another library
  function, or through code built at run time.

Both give a **flag for a person, not a proof**. The analysis is conservative (a name that may
hold a reference counts as one, so a function that names a reference and never calls it is
flagged too) and sees only what is written: strings computed at run time, ``exec``, ``eval``,
``compile``, IPython's ``run_cell`` and most magics defeat it, so every such use in a code
cell is reported on its own ("dynamic code, not analysable", ``Analysis.dynamic``), as is a
call that switches the interpreter's profiler (``sys.setprofile``/``settrace``), a write to an
attribute of ``sys``, ``threading``, ``builtins``, ``course_grader`` or ``course_lib``, and the
start of a thread, executor or process, all of which could blind the call-time check. A route
whose key the analysis cannot read (``m.__getattribute__(name)``, ``vars(m).get(name)``,
``operator.attrgetter``, ``sys.modules.values()``) counts as reaching every reference, and so does
a value too large to track (``MAX_ATOMS``); past ``MAX_STEPS`` or ``MAX_NODES`` the analysis stops
and says so. The call-time check runs inside the learner's kernel, where learner
code could have replaced it before the judge arrived; a call during which the hook was
switched off is reported as unobserved. Neither says who wrote the code: a learner who copied
a reference's *body* into a cell of their own is not flagged by either.

Which library function is the reference for which test is declared once, in the lab's
``CONTRACTS`` table; the judge (``course_grader.judge``) runs both checks for every graded cell
whose contract declares references and stores the result in the cell's verdict
(``reference_reuse``); the driver (``course_grader.grade``) lists it in ``grades.csv``'s ``flags``
and, with ``--reference-reuse zero`` (``c.CourseJudge.reference_reuse = "zero"`` on the stock
nbgrader commands), those tests score 0. See ``autograder/README.md``.
"""
from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import re
import sys
import threading
import types
from dataclasses import dataclass
from typing import Iterable, Sequence

from .text import parse_python

__all__ = ["Finding", "Analysis", "analyse", "notebook_cells", "watch_spec", "Observer", "runtime_summary",
           "assess", "flag_notes", "MAX_CELL_CHARS"]

#: A code cell longer than this is not parsed (it is reported as not analysable).
MAX_CELL_CHARS = 1_000_000
#: Passes over a function body until its local bindings stop growing (and rounds over the whole
#: notebook for ``global`` statements); the analysis is monotone, so this only bounds odd code.
MAX_PASSES = 8
#: Tracked objects one value may hold before it collapses to "anything" (``_ANY``, which reaches
#: every reference): bounds the work on long chains of containers (``v2 = (v1, os.a2)``).
MAX_ATOMS = 64
#: Evaluation steps (statements and expressions visited, over all passes) one analysis may take;
#: past it the analysis stops and says so ("too large to analyse").
MAX_STEPS = 2_000_000
#: AST nodes one analysis may hold (all cells together); a larger notebook is not analysed.
MAX_NODES = 1_000_000
_TEXT = 60  # characters of learner source quoted in a finding

# Magics whose argument is Python code run in the user's namespace: analysed as such.
_CODE_MAGICS = {"time", "timeit", "capture", "prun"}
# Magics that run no learner Python code.
_INERT_MAGICS = {"matplotlib", "config", "load_ext", "reload_ext", "unload_ext", "autoreload", "aimport",
                 "precision", "pip", "conda", "who", "whos", "who_ls", "env", "pwd", "ls", "history", "xmode",
                 "pdb", "lsmagic", "magic", "html", "HTML", "markdown", "latex", "javascript", "js", "svg",
                 "writefile", "bash", "sh", "script", "system", "sx"}
# IPython shell methods that run code given as text.
_SHELL_RUNNERS = {"run_cell", "run_cell_async", "run_code", "run_ast_nodes", "ex", "ev", "safe_execfile",
                  "safe_execfile_ipy", "safe_run_module", "runcode", "push"}
_PROFILER_SWITCHES = {"sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace",
                      "threading.setprofile_all_threads", "threading.settrace_all_threads"}
_SHELL = "IPython.shell"   # the pseudo-path of get_ipython()'s value
# Modules whose attributes learner code must not rebind: the interpreter's, the profiler's and ours.
_GUARDED_MODULES = ("sys", "threading", "builtins", "_thread", "course_grader", "course_lib")
# Calls that start code running beside the graded call (threads, executors, processes).
_CONCURRENCY = ("threading.Thread", "threading.Timer", "_thread.start_new_thread", "_thread.start_new",
                "concurrent.futures", "multiprocessing", "os.fork", "os.posix_spawn", "subprocess")
# Routes to the items of a module's namespace whose key the analysis cannot read.
_NAMESPACE_ROUTES = {"get", "values", "items", "keys", "copy", "pop", "setdefault", "__getitem__", "__iter__"}


# == values the analysis tracks ===================================================================
@dataclass(frozen=True)
class _Path:
    """A dotted name in an importable namespace: a module, or an attribute of one."""
    name: str


@dataclass(frozen=True)
class _Dict:
    """``vars(module)`` / ``module.__dict__``: a subscript with a constant key names an attribute."""
    name: str


@dataclass(frozen=True)
class _Any:
    """Any attribute of the course_lib module ``name`` (reached through a route whose key the
    analysis cannot read: ``__getattribute__``, ``vars(m).get(k)``, ``sys.modules.values()``...),
    or, for ``name == "*"``, anything at all (a value too large to track); it reaches every
    reference."""
    name: str


_TOP = _Any("*")


@dataclass(frozen=True)
class _AttrGetter:
    """``operator.attrgetter(NAME)``; NAME None when it is not a constant."""
    name: str | None


@dataclass(frozen=True)
class _Globals:
    """``globals()`` (or the shell's ``user_ns``): a subscript with a constant key names a global."""


class _Origin:
    """Where the learner's code produced a value: cell, line and (computed when shown) its text."""

    __slots__ = ("cell", "line", "_text", "_source", "_node")

    def __init__(self, cell: str, line: int, text: str | None = None, source: "_Cell | None" = None,
                 node: ast.AST | None = None) -> None:
        self.cell, self.line, self._text, self._source, self._node = cell, line, text, source, node

    @property
    def text(self) -> str:
        if self._text is None:
            try:
                text = ast.get_source_segment(self._source.source, self._node) or ast.unparse(self._node)
            except Exception:
                text = type(self._node).__name__
            text = " ".join(str(text).split())
            self._text = text if len(text) <= _TEXT else text[:_TEXT - 3] + "..."
        return self._text

    def __str__(self) -> str:
        return f"`{self.text}` in cell {self.cell} line {self.line}"


class _Def:
    """A function, lambda or class the notebook defines (compared by identity)."""

    def __init__(self, node: ast.AST, scope: "_Scope", cell: "_Cell") -> None:
        self.node, self.scope, self.cell = node, scope, cell

    @property
    def label(self) -> str:
        return getattr(self.node, "name", "<lambda>")


@dataclass
class _Cell:
    label: str
    source: str
    tree: ast.Module | None = None

    def origin(self, node: ast.AST) -> _Origin:
        return _Origin(self.label, getattr(node, "lineno", 0), source=self, node=node)


class _Val:
    """What an expression may evaluate to (``values``) and every tracked object its evaluation
    may touch (``mentions``, a superset), each with where the learner's code produced it."""

    __slots__ = ("values", "mentions")

    def __init__(self, values: dict | None = None, mentions: dict | None = None) -> None:
        self.values = dict(values or {})
        self.mentions = dict(mentions or {})
        for atom, origin in self.values.items():
            self.mentions.setdefault(atom, origin)

    def add(self, other: "_Val", values: bool = True) -> "_Val":
        if values:
            for atom, origin in other.values.items():
                self.values.setdefault(atom, origin)
        for atom, origin in other.mentions.items():
            self.mentions.setdefault(atom, origin)
        return self


def _union(vals: Iterable[_Val], values: bool = True) -> _Val:
    out = _Val()
    for v in vals:
        out.add(v, values)
    return out


class _Scope:
    """One namespace: the module, a function (its local names fixed by its body), a class body,
    or a comprehension."""

    def __init__(self, kind: str, parent: "_Scope | None", local: set[str] | None = None) -> None:
        self.kind, self.parent, self.local = kind, parent, local
        self.bindings: dict[str, _Val] = {}
        self.global_names: set[str] = set()
        self.star: list[str] = []      # modules star-imported here whose names are unknown

    def size(self) -> int:
        return sum(len(v.mentions) + len(v.values) for v in self.bindings.values())


# == findings =====================================================================================
@dataclass(frozen=True)
class Finding:
    """A graded function that reaches a reference: ``chain`` is the learner functions from the
    graded one to where the reference is named (``origin``: the learner's text, cell and line)."""

    function: str
    reference: str
    chain: tuple[str, ...]
    origin: str

    @property
    def how(self) -> str:
        return " -> ".join(self.chain) + f" -> {self.origin}"

    def as_dict(self) -> dict:
        return {"function": self.function, "reference": self.reference, "how": self.how}


# == the analysis =================================================================================
class Analysis:
    """The bindings of a notebook's code cells, as of the end of the last cell, and the dynamic
    code found in them. Build with ``analyse``."""

    def __init__(self, cells: Sequence[tuple[str, str]]) -> None:
        self.cells: list[_Cell] = []
        self.dynamic: list[str] = []          # "what (cell X line N)", in order, no repeats
        self._dynamic_seen: set[str] = set()
        self.module = _Scope("module", None)
        self._defs: dict[tuple[int, int], _Def] = {}
        self._def_cache: dict[int, tuple[_Val, _Val]] = {}   # id(def) -> (mentions, returns)
        self._active: set[int] = set()
        self._resolved: dict[str, object] = {}
        self._global_writes: dict[str, _Val] = {}            # names functions bind with `global`
        self.steps = 0                                       # statements and expressions visited
        self.complete = True                                 # False once a budget stopped the analysis
        self._nodes = 0
        for label, source in cells:
            self._parse(str(label), source)
        for _ in range(MAX_PASSES):
            self.module = _Scope("module", None)
            self._def_cache.clear()
            for cell in self.cells:
                self._guarded(cell, lambda cell=cell: self._exec(cell.tree.body, self.module, cell, top=True))
            for name, val in self._global_writes.items():
                self._bind(name, val, self.module, False)
            self._def_cache.clear()
            before = _size(self._global_writes)
            done: set[int] = set()
            while True:                                   # every function, reached or not: dynamic code
                todo = [d for d in self._defs.values() if id(d) not in done]
                if not todo:
                    break
                for d in todo:
                    done.add(id(d))
                    self._guarded(d.cell, lambda d=d: self._def_info(d))
            if _size(self._global_writes) == before:
                break

    # -- input ------------------------------------------------------------------------------------
    def _parse(self, label: str, source) -> None:
        source = "".join(source) if isinstance(source, list) else str(source)
        if len(source) > MAX_CELL_CHARS:
            self._note(f"cell {label}: not analysed ({len(source):,} characters)")
            return
        try:
            from IPython.core.inputtransformer2 import TransformerManager
            source = TransformerManager().transform_cell(source)
        except Exception:
            pass
        try:
            tree = parse_python(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return                                          # it fails in the kernel as well
        self._nodes += sum(1 for _ in ast.walk(tree))
        if self._nodes > MAX_NODES:
            self.complete = False
            self._note(f"cell {label}: not analysed (too large to analyse: over {MAX_NODES:,} syntax nodes)")
            return
        self.cells.append(_Cell(label, source, tree))

    def _guarded(self, cell: _Cell, work) -> None:
        if self.steps > MAX_STEPS:
            return
        try:
            work()
        except RecursionError:
            self._note(f"cell {cell.label}: not analysed (nested too deeply)")
        except _Budget:
            self.complete = False
            self._note(f"cell {cell.label}: analysis stopped (too large to analyse: over {MAX_STEPS:,} steps)")

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Budget

    def _capped(self, val: "_Val", cell: _Cell, node: ast.AST) -> "_Val":
        """VAL, or ``_TOP`` (anything) when it holds more than MAX_ATOMS tracked objects."""
        if len(val.values) <= MAX_ATOMS and len(val.mentions) <= MAX_ATOMS:
            return val
        self._note(f"cell {cell.label}: values too large to analyse (over {MAX_ATOMS} tracked objects; "
                   f"taken as reaching every reference)")
        return _Val({_TOP: cell.origin(node)})

    def _note(self, text: str) -> None:
        if text not in self._dynamic_seen:
            self._dynamic_seen.add(text)
            self.dynamic.append(text)

    def _dynamic(self, what: str, cell: _Cell, node: ast.AST) -> None:
        self._note(f"{what} (cell {cell.label} line {getattr(node, 'lineno', 0)})")

    # -- names --------------------------------------------------------------------------------------
    def _def(self, node: ast.AST, scope: _Scope, cell: _Cell) -> _Def:
        """The one _Def of NODE defined in SCOPE (a nested def gets a new one per analysis of its
        enclosing function, whose scope is new each time)."""
        key = (id(node), id(scope))
        d = self._defs.get(key)
        if d is None:
            d = self._defs[key] = _Def(node, scope, cell)
        return d

    def _lookup(self, name: str, scope: _Scope) -> _Val:
        s = scope
        while s is not None and s.kind != "module":
            if s.kind == "class" and s is not scope:      # class bodies are not enclosing scopes
                s = s.parent
                continue
            if s.local is not None and name in s.local:
                return _Val().add(s.bindings.get(name, _Val()))
            s = s.parent
        found = self.module.bindings.get(name)
        if found is not None:
            return _Val().add(found)
        out = _Val()
        for module in self.module.star:
            out.values.setdefault(_Path(f"{module}.{name}"), _Origin("?", 0, f"from {module} import *"))
        if name == "get_ipython":
            out.values.setdefault(_Path("IPython.get_ipython"), _Origin("?", 0, name))
        elif hasattr(builtins, name):
            out.values.setdefault(_Path(f"builtins.{name}"), _Origin("?", 0, name))
        return _Val(out.values)

    def _bind(self, name: str, val: _Val, scope: _Scope, replace: bool) -> None:
        if name in scope.global_names:
            self._bind_global(name, val)
            return
        if replace or name not in scope.bindings:
            scope.bindings[name] = _Val().add(val)
        else:
            scope.bindings[name].add(val)
        self._cap_binding(scope.bindings, name)

    def _bind_global(self, name: str, val: _Val) -> None:
        """A module-level binding made from inside a function (``global``) or through
        ``globals()``: it holds in every later round of the analysis."""
        self._global_writes.setdefault(name, _Val()).add(val)
        self._cap_binding(self._global_writes, name)
        self._bind(name, val, self.module, False)

    def _cap_binding(self, bindings: dict, name: str) -> None:
        """Collapse BINDINGS[NAME] to ``_TOP`` when it holds more than MAX_ATOMS tracked objects."""
        bound = bindings[name]
        if len(bound.values) > MAX_ATOMS or len(bound.mentions) > MAX_ATOMS:
            origin = next(iter(bound.mentions.values()))
            self._note(f"cell {origin.cell}: values too large to analyse (over {MAX_ATOMS} tracked objects; "
                       f"taken as reaching every reference)")
            bindings[name] = _Val({_TOP: origin})

    # -- statements ---------------------------------------------------------------------------------
    def _exec(self, body: list, scope: _Scope, cell: _Cell, top: bool = False) -> _Val:
        """Process statements in SCOPE; TOP: module level, where a binding replaces the name's
        earlier one (elsewhere bindings accumulate). Returns what the statements mention."""
        out = _Val()
        for stmt in body:
            out.add(self._stmt(stmt, scope, cell, top), values=False)
        return out

    def _stmt(self, node: ast.stmt, scope: _Scope, cell: _Cell, top: bool) -> _Val:
        self._step()
        ev = lambda e: self._ev(e, scope, cell)  # noqa: E731
        if isinstance(node, ast.Delete):
            out = _Val()
            for target in node.targets:
                base = self._ev(target.value, scope, cell) if isinstance(target, (ast.Attribute, ast.Subscript)) \
                    else self._ev(target, scope, cell)
                if isinstance(target, (ast.Attribute, ast.Subscript)):
                    self._guard_write(base, target, cell)
                out.add(base, values=False)
            return out
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            d = self._def(node, scope, cell)
            val = _Val({d: _Origin(cell.label, node.lineno, f"def {node.name}")})
            self._bind(node.name, val, scope, top)
            return val
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return self._import(node, scope, cell, top)
        if isinstance(node, ast.Assign):
            val = ev(node.value)
            out = _Val().add(val, values=False)
            for target in node.targets:
                out.add(self._assign(target, val, scope, cell, top), values=False)
            return out
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            val = ev(node.value) if node.value is not None else _Val()
            return _Val().add(val, values=False).add(self._assign(node.target, val, scope, cell, False),
                                                      values=False)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            val = ev(node.iter)
            out = _Val().add(val, values=False).add(self._assign(node.target, val, scope, cell, False), values=False)
            return out.add(self._exec(node.body + node.orelse, scope, cell), values=False)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            out = _Val()
            for item in node.items:
                val = ev(item.context_expr)
                out.add(val, values=False)
                if item.optional_vars is not None:
                    out.add(self._assign(item.optional_vars, val, scope, cell, False), values=False)
            return out.add(self._exec(node.body, scope, cell), values=False)
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            out = self._exec(node.body + node.orelse + node.finalbody, scope, cell)
            for handler in node.handlers:
                out.add(ev(handler.type), values=False)
                if handler.name:
                    self._bind(handler.name, _Val(), scope, False)
                out.add(self._exec(handler.body, scope, cell), values=False)
            return out
        if isinstance(node, (ast.If, ast.While)):
            return ev(node.test).add(self._exec(node.body + node.orelse, scope, cell), values=False)
        if isinstance(node, ast.Match):
            subject = ev(node.subject)
            out = _Val().add(subject, values=False)
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    for name in (getattr(sub, "name", None), getattr(sub, "rest", None)):
                        if isinstance(name, str):
                            self._bind(name, subject, scope, False)
                    if isinstance(sub, ast.expr):
                        out.add(ev(sub), values=False)
                out.add(ev(case.guard), values=False)
                out.add(self._exec(case.body, scope, cell), values=False)
            return out
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return _Val()
        out = _Val()                                       # Return, Expr, Raise, Assert, Delete, ...
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                out.add(ev(child), values=False)
        return out

    def _import(self, node, scope: _Scope, cell: _Cell, top: bool) -> _Val:
        origin = cell.origin(node)
        out = _Val()
        if isinstance(node, ast.Import):
            for alias in node.names:
                path = alias.name if alias.asname else alias.name.split(".")[0]
                val = _Val({_Path(path): origin})
                self._bind(alias.asname or path, val, scope, top)
                out.add(val)
            return out
        if node.level or not node.module:                   # relative: nothing the notebook can name
            return out
        for alias in node.names:
            if alias.name == "*":
                names = _public_names(node.module)
                if names is None:
                    scope.star.append(node.module)
                for name in names or ():
                    self._bind(name, _Val({_Path(f"{node.module}.{name}"): origin}), scope, top)
                continue
            val = _Val({_Path(f"{node.module}.{alias.name}"): origin})
            self._bind(alias.asname or alias.name, val, scope, top)
            out.add(val)
        return out

    def _assign(self, target: ast.expr, val: _Val, scope: _Scope, cell: _Cell, top: bool) -> _Val:
        if isinstance(target, ast.Name):
            self._bind(target.id, val, scope, top)
            return _Val()
        if isinstance(target, (ast.Tuple, ast.List)):
            out = _Val()
            for elt in target.elts:
                out.add(self._assign(elt, val, scope, cell, False), values=False)
            return out
        if isinstance(target, ast.Starred):
            return self._assign(target.value, val, scope, cell, False)
        if isinstance(target, ast.Subscript):
            base = self._ev(target.value, scope, cell)
            key = _constant_str(target.slice)
            out = _Val().add(base, values=False).add(self._ev(target.slice, scope, cell), values=False)
            self._guard_write(base, target, cell)
            if any(isinstance(a, _Globals) for a in base.values):
                if key is None:
                    self._dynamic("globals() written under a computed name", cell, target)
                else:
                    self._bind_global(key, val)
            return out
        if isinstance(target, ast.Attribute):
            base = self._ev(target.value, scope, cell)
            self._guard_write(base, target, cell)
            return _Val().add(base, values=False)
        return _Val()

    def _guard_write(self, base: _Val, target: ast.AST, cell: _Cell) -> None:
        """Report a write to an attribute (or namespace item) of sys, threading, builtins,
        course_grader or course_lib: it can switch the call-time check off or swap a reference."""
        for atom in base.values:
            if isinstance(atom, (_Path, _Dict)) and _guarded_module(atom.name):
                self._dynamic(f"`{_short(target)}` rebound or deleted (it can hide calls from the judge's "
                              f"call-time check)", cell, target)
                return

    # -- expressions --------------------------------------------------------------------------------
    def _ev(self, node, scope: _Scope, cell: _Cell) -> _Val:
        if node is None or isinstance(node, ast.Constant):
            return _Val()
        self._step()
        method = getattr(self, "_ev_" + type(node).__name__, None)
        if method is not None:
            return self._capped(method(node, scope, cell), cell, node)
        out = _Val()                              # BinOp, Compare, JoinedStr, Await, Slice, ...
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                out.add(self._ev(child, scope, cell), values=False)
        return self._capped(out, cell, node)

    def _ev_Name(self, node: ast.Name, scope, cell) -> _Val:
        return self._lookup(node.id, scope)

    def _ev_Attribute(self, node: ast.Attribute, scope, cell) -> _Val:
        base = self._ev(node.value, scope, cell)
        out = _Val().add(base, values=False)
        origin = cell.origin(node)
        for atom in base.values:
            if isinstance(atom, _Any):
                out.values.setdefault(atom, origin)
            elif isinstance(atom, _Dict) and node.attr in _NAMESPACE_ROUTES:
                hidden = _opaque(atom.name)
                if hidden is not None:
                    out.values.setdefault(hidden, origin)
            elif isinstance(atom, _Path) and atom.name == "sys.modules" and node.attr in _NAMESPACE_ROUTES \
                    and node.attr not in ("get", "__getitem__"):
                out.values.setdefault(_Any("course_lib"), origin)
            elif isinstance(atom, _Path):
                name = f"{atom.name}.{node.attr}"
                if node.attr == "__dict__":
                    out.values.setdefault(_Dict(atom.name), origin)
                elif name in (f"{_SHELL}.user_ns", f"{_SHELL}.user_global_ns"):
                    out.values.setdefault(_Globals(), origin)
                else:
                    out.values.setdefault(_Path(name), origin)
        return _Val(out.values, out.mentions)

    def _ev_Subscript(self, node: ast.Subscript, scope, cell) -> _Val:
        base = self._ev(node.value, scope, cell)
        out = _Val().add(base, values=False).add(self._ev(node.slice, scope, cell), values=False)
        key = _constant_str(node.slice)
        origin = cell.origin(node)
        for atom, where in base.values.items():
            if atom == _Path("sys.modules") or isinstance(atom, _Dict):
                prefix = "" if isinstance(atom, _Path) else atom.name + "."
                if key is not None:
                    out.values.setdefault(_Path(prefix + key), origin)
                elif _library(atom.name) or isinstance(atom, _Path):
                    self._dynamic(f"{_short(node.value)}[...] with a computed key", cell, node)
                if key is None and _opaque(atom.name) is not None:
                    out.values.setdefault(_opaque(atom.name), origin)
            elif isinstance(atom, _Globals):
                if key is not None:
                    out.add(self._lookup(key, self.module))
                else:
                    self._dynamic("globals() read under a computed name", cell, node)
            else:                                          # a container: any of its elements
                out.values.setdefault(atom, where)
        return _Val(out.values, out.mentions)

    def _ev_Call(self, node: ast.Call, scope, cell) -> _Val:
        func = self._ev(node.func, scope, cell)
        args = [self._ev(a, scope, cell) for a in node.args]
        kwargs = {k.arg: self._ev(k.value, scope, cell) for k in node.keywords}
        out = _Val().add(func, values=False)
        for v in [*args, *kwargs.values()]:
            out.add(v, values=False)
        origin = cell.origin(node)
        const = [_constant_str(a) for a in node.args]
        for atom in list(func.values):
            if isinstance(atom, _Any):
                out.values.setdefault(atom, origin)
                continue
            if isinstance(atom, _AttrGetter):
                for target in (args[0].values if args else ()):
                    if isinstance(target, _Path):
                        found = _Path(f"{target.name}.{atom.name}") if atom.name else _opaque(target.name)
                        if found is not None:
                            out.values.setdefault(found, origin)
                continue
            if isinstance(atom, _Def):
                if isinstance(atom.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    out.add(_Val(self._def_info(atom)[1].values))
                continue
            if not isinstance(atom, _Path):
                continue
            name = atom.name
            if any(name == c or name.startswith(c + ".") for c in _CONCURRENCY):
                self._dynamic(f"{name}() (code run beside the graded call is not analysable)", cell, node)
            if name.endswith((".__getattribute__", ".__getattr__")):
                owner = name.rsplit(".", 1)[0]
                if owner in ("builtins.object", "builtins.type", "types.ModuleType"):    # object.__getattribute__(m, k)
                    targets, key = (args[0].values if args else {}), (const[1] if len(const) > 1 else None)
                else:                                                                       # m.__getattribute__(k)
                    targets, key = {_Path(owner): origin}, (const[0] if const else None)
                for target in targets:
                    if isinstance(target, _Path):
                        found = _Path(f"{target.name}.{key}") if key else _opaque(target.name)
                        if found is not None:
                            out.values.setdefault(found, origin)
                continue
            if name == "operator.attrgetter":
                out.values.setdefault(_AttrGetter(const[0] if len(const) == 1 else None), origin)
            elif name in ("builtins.setattr", "builtins.delattr", "builtins.object.__setattr__",
                          "builtins.object.__delattr__") and args:
                self._guard_write(args[0], node, cell)
            elif name.endswith((".__setattr__", ".__delattr__")) and _guarded_module(name.rsplit(".", 2)[0]):
                self._guard_write(_Val({_Path(name.rsplit(".", 2)[0]): origin}), node, cell)
            elif name == "importlib.import_module":
                keywords = {k.arg: _constant_str(k.value) for k in node.keywords}
                module = _absolute(const[0] if const else keywords.get("name"),
                                   const[1] if len(const) > 1 else keywords.get("package"))
                if module is None:
                    self._dynamic("importlib.import_module() with a computed name", cell, node)
                else:
                    out.values.setdefault(_Path(module), origin)
            elif name in ("builtins.__import__", "importlib.__import__"):
                if const and const[0]:
                    out.values.setdefault(_Path(const[0]), origin)
                    out.values.setdefault(_Path(const[0].split(".")[0]), origin)
                else:
                    self._dynamic("__import__() with a computed name", cell, node)
            elif name == "builtins.getattr" and len(args) >= 2:
                for target in args[0].values:
                    if isinstance(target, _Path):
                        if const[1] is not None:
                            out.values.setdefault(_Path(f"{target.name}.{const[1]}"), origin)
                        else:
                            if _library(target.name):
                                self._dynamic(f"getattr({target.name}, ...) with a computed name", cell, node)
                            if _opaque(target.name) is not None:
                                out.values.setdefault(_opaque(target.name), origin)
            elif name == "builtins.vars":
                if args:
                    for target in args[0].values:
                        if isinstance(target, _Path):
                            out.values.setdefault(_Dict(target.name), origin)
                else:
                    out.values.setdefault(_Globals(), origin)
            elif name in ("builtins.globals", "builtins.locals"):
                out.values.setdefault(_Globals(), origin)
            elif name in ("sys.modules.get", "sys.modules.__getitem__"):
                if const and const[0] is not None:
                    out.values.setdefault(_Path(const[0]), origin)
                else:
                    self._dynamic("sys.modules looked up under a computed name", cell, node)
                    out.values.setdefault(_Any("course_lib"), origin)
            elif name in ("builtins.exec", "builtins.eval", "builtins.compile"):
                self._dynamic(f"{name.split('.')[1]}()", cell, node)
            elif name in _PROFILER_SWITCHES:
                self._dynamic(f"{name}() (it can hide calls from the judge's call-time check)", cell, node)
            elif name == "IPython.get_ipython":
                out.values.setdefault(_Path(_SHELL), origin)
            elif name in (f"{_SHELL}.run_line_magic", f"{_SHELL}.run_cell_magic"):
                out.add(self._magic(node, const, scope, cell), values=False)
            elif name.startswith(_SHELL + ".") and name.rpartition(".")[2] in _SHELL_RUNNERS:
                self._dynamic(f"get_ipython().{name.rpartition('.')[2]}()", cell, node)
        return _Val(out.values, out.mentions)

    def _magic(self, node: ast.Call, const: list, scope: _Scope, cell: _Cell) -> _Val:
        magic = const[0] if const else None
        if magic in _INERT_MAGICS:
            return _Val()
        code = None
        if magic in _CODE_MAGICS:
            cell_magic = len(const) > 2
            code = const[2] if cell_magic else const[1] if len(const) > 1 else None
            if code is not None and not cell_magic:
                code = re.sub(r"^\s*(-\w+(\s+[\w.]+)?\s+)*", "", code)   # options: -n 3 -r 2
            try:
                tree = parse_python(code) if code is not None else None
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                tree = None
            if tree is not None:
                return self._exec(tree.body, scope, _Cell(f"{cell.label} (%{magic})", code, tree))
        self._dynamic(f"%{magic or '?'} magic", cell, node)
        return _Val()

    def _ev_Lambda(self, node: ast.Lambda, scope, cell) -> _Val:
        d = self._def(node, scope, cell)
        return _Val({d: cell.origin(node)})

    def _ev_NamedExpr(self, node: ast.NamedExpr, scope, cell) -> _Val:
        val = self._ev(node.value, scope, cell)
        self._assign(node.target, val, scope, cell, False)
        return val

    def _ev_Starred(self, node: ast.Starred, scope, cell) -> _Val:
        return self._ev(node.value, scope, cell)

    def _container(self, parts, scope, cell) -> _Val:
        return _union(self._ev(p, scope, cell) for p in parts if p is not None)

    def _ev_List(self, node, scope, cell) -> _Val:
        return self._container(node.elts, scope, cell)

    _ev_Tuple = _ev_Set = _ev_List

    def _ev_Dict(self, node: ast.Dict, scope, cell) -> _Val:
        return self._container([*node.keys, *node.values], scope, cell)

    def _ev_IfExp(self, node: ast.IfExp, scope, cell) -> _Val:
        return self._ev(node.test, scope, cell).add(self._container([node.body, node.orelse], scope, cell))

    def _ev_BoolOp(self, node: ast.BoolOp, scope, cell) -> _Val:
        return self._container(node.values, scope, cell)

    def _comprehension(self, node, parts, scope, cell) -> _Val:
        inner = _Scope("comprehension", scope, set())
        out = _Val()
        for gen in node.generators:
            for sub in ast.walk(gen.target):
                if isinstance(sub, ast.Name):
                    inner.local.add(sub.id)
        for gen in node.generators:
            val = self._ev(gen.iter, inner, cell)
            out.add(val, values=False)
            self._assign(gen.target, val, inner, cell, False)
            for cond in gen.ifs:
                out.add(self._ev(cond, inner, cell), values=False)
        return out.add(self._container(parts, inner, cell))

    def _ev_ListComp(self, node, scope, cell) -> _Val:
        return self._comprehension(node, [node.elt], scope, cell)

    _ev_SetComp = _ev_GeneratorExp = _ev_ListComp

    def _ev_DictComp(self, node, scope, cell) -> _Val:
        return self._comprehension(node, [node.key, node.value], scope, cell)

    # -- functions and classes ------------------------------------------------------------------------
    def _def_info(self, d: _Def) -> tuple[_Val, _Val]:
        """(what running or using D may touch, what calling it may return)."""
        key = id(d)
        cached = self._def_cache.get(key)
        if cached is not None:
            return cached
        if key in self._active:                             # recursion: its own analysis covers it
            return _Val(), _Val()
        self._active.add(key)
        try:
            info = self._analyse_def(d)
        finally:
            self._active.discard(key)
        self._def_cache[key] = info
        return info

    def _analyse_def(self, d: _Def) -> tuple[_Val, _Val]:
        node, outer, cell = d.node, d.scope, d.cell
        around = _Val()                                    # evaluated where the def statement runs
        for dec in getattr(node, "decorator_list", []):
            around.add(self._ev(dec, outer, cell), values=False)
        if isinstance(node, ast.ClassDef):
            for base in [*node.bases, *(k.value for k in node.keywords)]:
                val = self._ev(base, outer, cell)
                around.add(val, values=False)
                for atom in val.values:
                    if isinstance(atom, _Path) and any(atom.name == c or atom.name.startswith(c + ".")
                                                       for c in _CONCURRENCY):
                        self._dynamic(f"a subclass of {atom.name} (code run beside the graded call is not "
                                      f"analysable)", cell, node)
            scope = _Scope("class", outer, _bound_names(node.body)[0])
            for _ in range(MAX_PASSES):
                size = scope.size()
                body = self._exec(node.body, scope, cell)
                if scope.size() == size:
                    break
            members = _union(scope.bindings.values())    # methods run when the class is used
            return around.add(body, values=False).add(members, values=False), _Val()
        args = node.args
        for default in [*args.defaults, *(k for k in args.kw_defaults if k is not None)]:
            around.add(self._ev(default, outer, cell), values=False)
        params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        if isinstance(node, ast.Lambda):
            scope = _Scope("function", outer, params)
            val = self._ev(node.body, scope, cell)
            return around.add(val, values=False), _Val(val.values)
        bound, declared_global, declared_nonlocal = _bound_names(node.body)
        scope = _Scope("function", outer, (params | bound) - declared_global - declared_nonlocal)
        scope.global_names = declared_global
        for _ in range(MAX_PASSES):
            size = scope.size()
            body = self._exec(node.body, scope, cell)
            if scope.size() == size:
                break
        returns = _Val()
        for sub in _own_nodes(node.body):
            if isinstance(sub, ast.Return) and sub.value is not None:
                returns.add(_Val(self._ev(sub.value, scope, cell).values))
        return around.add(body, values=False), returns

    # -- results ------------------------------------------------------------------------------------
    def _resolve(self, name: str):
        if name not in self._resolved:
            obj = None
            if _library(name):
                from course_lib.grading.tables import resolve_reference
                try:
                    obj = _identity(_by_attributes(name))
                except LookupError:
                    try:
                        obj = _identity(resolve_reference(name))
                    except LookupError:
                        obj = None
            self._resolved[name] = obj
        return self._resolved[name]

    def reaches(self, function: str, references: Sequence[str]) -> list[Finding]:
        """Findings, one per reference in REFERENCES (dotted course_lib names) that the notebook's
        FUNCTION (a module-level name) can reach, each with its shortest chain of learner functions.

        Raises: LookupError for a reference that does not resolve (a course-authoring error)."""
        from course_lib.grading.tables import resolve_reference

        wanted = {}
        for ref in references:
            wanted.setdefault(id(_identity(resolve_reference(ref))), ref)
        start = self.module.bindings.get(function)
        if start is None:
            return []
        found: dict[str, Finding] = {}
        queue = [(atom, origin, (function,)) for atom, origin in start.mentions.items()]
        seen: set = set()
        while queue:
            atom, origin, chain = queue.pop(0)
            if atom in seen:
                continue
            seen.add(atom)
            if isinstance(atom, _Any):                       # any attribute of a course_lib module, or anything
                for ref in references:
                    if ref not in found:
                        found[ref] = Finding(function, ref, chain, str(origin))
            elif isinstance(atom, _Path):
                obj = self._resolve(atom.name)
                ref = wanted.get(id(obj)) if obj is not None else None
                if ref is not None and ref not in found:
                    found[ref] = Finding(function, ref, chain, str(origin))
            elif isinstance(atom, _Def):
                try:
                    mentions = self._def_info(atom)[0].mentions
                except (RecursionError, _Budget):
                    continue
                step = chain if atom.label == chain[-1] and len(chain) == 1 else chain + (atom.label,)
                queue += [(a, o, step) for a, o in mentions.items()]
        return [found[r] for r in references if r in found]


def analyse(cells: Sequence[tuple[str, str]]) -> Analysis:
    """Parse and analyse CELLS, ``(label, source)`` pairs of code cells in execution order (see
    ``notebook_cells``). Never executes them; a cell that does not parse is skipped (it raises in
    the kernel as well)."""
    return Analysis(cells)


@functools.lru_cache(maxsize=4)
def analyse_cached(cells: tuple) -> Analysis:
    """``analyse`` for ``assess``: the graded cells of one notebook that no solution cell
    separates share the same code before them, hence one analysis."""
    return Analysis(cells)


def notebook_cells(cells, before: int | None = None) -> list[tuple[str, str]]:
    """``(label, source)`` of the code cells among CELLS (nbformat cells or dicts; the first
    BEFORE of them) that are not graded test cells: solution cells, the course's own code cells
    and any cell the learner added. A cell's label is its nbgrader grade_id, else its index."""
    out = []
    for index, cell in enumerate(list(cells)[:before] if before is not None else cells):
        if cell.get("cell_type") != "code":
            continue
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if meta.get("grade") and not meta.get("solution"):
            continue
        label = meta.get("grade_id") if isinstance(meta.get("grade_id"), str) and meta.get("grade_id") else str(index)
        out.append((label, cell.get("source", "")))
    return out


# == call time ====================================================================================
def watch_spec(references: Sequence[str]) -> list[dict]:
    """What the kernel's ``Observer`` watches for REFERENCES: for each one that is Python code,
    its dotted name, the qualified name of its code object and its file relative to the folder
    holding the ``course_lib`` package (``course_lib/roofline.py``). Judge side (trusted
    course_lib); the kernel matches code objects by these, so a reference that learner code
    re-bound, copied with ``types.FunctionType`` or imported under another name is still seen."""
    import inspect
    from pathlib import Path

    import course_lib
    from course_lib.grading.tables import resolve_reference

    root = Path(course_lib.__file__).resolve().parent.parent
    spec = []
    for ref in references:
        fn = _identity(resolve_reference(ref))
        fn = fn.fget if isinstance(fn, property) else fn
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if code is None:
            continue
        try:
            where = Path(code.co_filename).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        spec.append({"reference": ref, "qualname": code.co_qualname, "file": where, "fingerprint": _fingerprint(code)})
    return spec


def _fingerprint(code: types.CodeType) -> str:
    """A digest of what a code object computes: its bytecode (``co_code``), constants
    (``co_consts``, nested code objects by their own digest, docstring included) and the names it
    looks up (``co_names``), not its name, qualified name or file, so a copy made with
    ``types.FunctionType(f.__code__.replace(co_qualname=...), ...)`` has the same one."""
    digest = hashlib.sha256(code.co_code)
    digest.update(repr(code.co_names).encode())
    digest.update(_const_text(code.co_consts).encode())
    return digest.hexdigest()


def _const_text(value) -> str:
    if isinstance(value, types.CodeType):
        return "code:" + _fingerprint(value)
    if isinstance(value, tuple):
        return "(" + ",".join(_const_text(v) for v in value) + ")"
    if isinstance(value, frozenset):                  # its order varies with string hashing
        return "{" + ",".join(sorted(_const_text(v) for v in value)) + "}"
    return f"{type(value).__name__}:{value!r}"


def genuine_profiler(module) -> tuple | None:
    """MODULE's (setprofile, getprofile) when they are the interpreter's built-ins (a built-in
    function bound to a module named sys, which Python code cannot forge), else None."""
    found = []
    for name in ("setprofile", "getprofile"):
        fn = module.__dict__.get(name) if type(module) is types.ModuleType else None
        if type(fn) is not types.BuiltinFunctionType or fn.__name__ != name \
                or type(fn.__self__) is not types.ModuleType or fn.__self__.__name__ != "sys":
            return None
        found.append(fn)
    return tuple(found)


# Taken once, when this module is imported in the kernel, and never looked up on sys again: learner
# code that later replaces sys.setprofile/getprofile does not reach the Observer; if they were
# already replaced, every watched call is reported as unobserved.
_PROFILER = genuine_profiler(sys)
_THREAD_PROFILER = (threading.setprofile, threading.getprofile)


class Observer:
    """Kernel side: records which watched references' code runs during one learner call.

    ``with Observer(spec): fn(...)`` installs a profiler hook (``sys.setprofile`` and, for threads
    started during the call, ``threading.setprofile``) and restores the previous ones afterwards;
    ``report()`` is what the kernel sends back: ``reached`` (the references whose code ran) and
    ``observed`` (False when the hook never ran or was not in place at the end, i.e. learner
    code switched it off). With an empty or malformed SPEC it does nothing and reports nothing.
    Cost: one Python-level call per function call and return inside the learner call."""

    def __init__(self, spec) -> None:
        self.targets: dict[str, list[tuple[str, str]]] = {}
        prints: dict[str, list[str]] = {}
        for item in spec if type(spec) is list else ():
            if type(item) is dict and all(type(item.get(k)) is str for k in ("reference", "qualname", "file")):
                self.targets.setdefault(item["qualname"], []).append(("/" + item["file"], item["reference"]))
                if type(item.get("fingerprint")) is str:
                    prints.setdefault(item["fingerprint"], []).append(item["reference"])
        self.reached: set[str] = set()
        self.events = 0
        self.intact = False
        self._installed = False
        targets, reached = self.targets, self.reached
        seen: dict[int, tuple] = {}    # id(code) -> (code, references with its fingerprint); keeps code alive

        def hook(frame, event, arg):
            self.events += 1
            if event == "call":
                code = frame.f_code
                files = targets.get(code.co_qualname)
                if files is not None:
                    filename = code.co_filename.replace("\\", "/")
                    for suffix, reference in files:
                        if filename.endswith(suffix):
                            reached.add(reference)
                if prints:
                    known = seen.get(id(code))
                    if known is None:
                        known = seen[id(code)] = (code, prints.get(_fingerprint(code), ()))
                    reached.update(known[1])
        self._hook = hook

    def __enter__(self) -> "Observer":
        if self.targets and _PROFILER is not None:
            setprofile, getprofile = _PROFILER
            self._previous = (getprofile(), _THREAD_PROFILER[1]())
            _THREAD_PROFILER[0](self._hook)
            setprofile(self._hook)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            setprofile, getprofile = _PROFILER
            self.intact = getprofile() is self._hook
            setprofile(self._previous[0])
            _THREAD_PROFILER[0](self._previous[1])

    def report(self) -> dict:
        if not self.targets:
            return {}
        return {"reached": sorted(self.reached), "observed": bool(self.intact and self.events)}


def runtime_summary(observations: Sequence[tuple[str, tuple, bool]]) -> dict:
    """A check record's call-time part from the judge's observations of its calls
    (``KernelSession.observations``: (function, references reached, observed) per call)."""
    return {"reached": sorted({r for _, refs, _ in observations for r in refs}),
            "unobserved": sum(1 for _, _, ok in observations if not ok)}


# == the verdict and the flags ======================================================================
def assess(cells, verdict: dict, zero: bool = False) -> dict | None:
    """The ``reference_reuse`` entry of a graded cell's verdict, or None when there is nothing to
    report. CELLS: the notebook's cells before the test cell (nbformat cells); VERDICT: the
    judge's verdict, whose check records name their learner functions and declared
    ``references`` and carry the call-time ``reached``/``unobserved``; ZERO: the instructor's
    setting that scores a flagged test 0.

    Returns ``{"references", "static", "runtime", "unobserved", "zeroed"}``: every reference
    found, the code findings (``Finding.as_dict``), the references whose code ran during the
    judge's calls, the calls the hook did not observe, and whether the test is to score 0."""
    checks = [c for c in verdict.get("checks", []) if c.get("references")]
    if not checks:
        return None
    references = list(dict.fromkeys(r for c in checks for r in c["references"]))
    functions = list(dict.fromkeys(f for c in checks for f in c.get("functions", [])))
    analysis = analyse_cached(tuple((str(label), "".join(src) if isinstance(src, list) else str(src))
                               for label, src in notebook_cells(cells)))
    static = [f.as_dict() for fn in functions for f in analysis.reaches(fn, references)]
    runtime = sorted({r for c in checks for r in c.get("reached", []) if r in references})
    unobserved = sum(int(c.get("unobserved", 0) or 0) for c in checks)
    found = [r for r in references if r in runtime or any(f["reference"] == r for f in static)]
    if not found and not unobserved:
        return None
    return {"references": found, "static": static, "runtime": runtime, "unobserved": unobserved,
            "zeroed": bool(zero and found)}


def flag_notes(records: Sequence[dict]) -> list[str]:
    """The driver's ``flags`` notes from a submission's verdict records (``judge.read_verdicts``):
    per test that reuses a reference, ``reuses reference A, B in test_x (in the code: ...; ran
    during the judge's calls)``; per test whose calls the hook did not observe, a note saying so;
    and each dynamic-code finding of the notebook once."""
    notes, dynamic = [], []
    for record in records:
        for verdict in record.get("cells", []):
            reuse = verdict.get("reference_reuse")
            if not isinstance(reuse, dict):
                continue
            test = verdict.get("grade_id", "?")
            refs = [r for r in reuse.get("references", []) if isinstance(r, str)]
            if refs:
                evidence = [f"in the code: {f['how']}" for f in reuse.get("static", [])[:1] if isinstance(f, dict)]
                if reuse.get("runtime"):
                    evidence.append("ran during the judge's calls")
                zeroed = "; scored 0" if reuse.get("zeroed") else ""
                notes.append(f"reuses reference {', '.join(refs)} in {test} ({'; '.join(evidence)}{zeroed})")
            if reuse.get("unobserved"):
                notes.append(f"{test}: the judge's call-time reference check was switched off by the learner's code "
                             f"in {reuse['unobserved']} call(s)")
        dynamic += [d for d in record.get("dynamic_code", []) if isinstance(d, str)]
    notes += [f"dynamic code, not analysable: {d}" for d in dict.fromkeys(dynamic)]
    return notes


# == helpers ======================================================================================
def _size(bindings: dict) -> int:
    return sum(len(v.mentions) + len(v.values) for v in bindings.values())


def _library(name: str) -> bool:
    return name == "course_lib" or name.startswith("course_lib.")


class _Budget(Exception):
    """An analysis went past MAX_STEPS."""


def _guarded_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _GUARDED_MODULES)


def _opaque(name: str) -> "_Any | None":
    """What an item of NAME's namespace under an unreadable key may be: any attribute of a
    course_lib module; any course_lib module for sys, sys.modules, builtins and importlib (they
    lead to every module); None (nothing tracked) otherwise."""
    if _library(name):
        return _Any(name)
    if name in ("sys", "sys.modules", "builtins", "importlib"):
        return _Any("course_lib")
    return None


def _short(node: ast.AST) -> str:
    try:
        text = " ".join(ast.unparse(node).split())
    except Exception:
        return type(node).__name__
    return text if len(text) <= _TEXT else text[:_TEXT - 3] + "..."


def _by_attributes(name: str):
    """The object a learner's dotted name denotes when Python evaluates it: ``from a.b import c``,
    ``a.b.c`` and ``import a.b.c as d`` all take ``c`` as an attribute of ``a.b`` first (a package
    that rebinds a submodule's name to a function, as ``course_lib.quant.perplexity`` is, gives the
    function), importing a submodule only where the attribute is missing. Only course_lib names
    without a ``__`` part.

    Raises: LookupError when a part is neither an attribute nor an importable submodule."""
    import importlib

    parts = name.split(".")
    if parts[0] != "course_lib" or any(p.startswith("__") for p in parts):
        raise LookupError(name)
    try:
        obj = importlib.import_module("course_lib")
        for i, part in enumerate(parts[1:], start=2):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                obj = importlib.import_module(".".join(parts[:i]))
    except Exception:
        raise LookupError(name) from None
    return obj


def _identity(obj):
    """The object a reference comparison uses: a bound or class method's function."""
    return getattr(obj, "__func__", obj)


def _constant_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _absolute(name: str | None, package: str | None) -> str | None:
    if name is None:
        return None
    if not name.startswith("."):
        return name
    if not package:
        return None
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")
    if level > len(base):
        return None
    return ".".join(base[:len(base) - level + 1] + ([name[level:]] if name[level:] else []))


def _public_names(module: str) -> list[str] | None:
    """The names ``from MODULE import *`` binds, for a course_lib module; None for another."""
    if not _library(module):
        return None
    from course_lib.grading.tables import resolve_reference
    try:
        mod = resolve_reference(module)
    except LookupError:
        return None
    names = getattr(mod, "__all__", None)
    if not isinstance(names, (list, tuple)):
        names = [n for n in dir(mod) if not n.startswith("_")]
    return [n for n in names if isinstance(n, str)]


def _own_nodes(body: list):
    """Every node of BODY outside nested functions, classes and lambdas."""
    todo = list(body)
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.append(child)
            else:
                yield child


def _bound_names(body: list) -> tuple[set[str], set[str], set[str]]:
    """(names BODY binds, names it declares global, names it declares nonlocal), not counting
    nested functions' and classes' own names or comprehension variables."""
    bound, declared_global, declared_nonlocal = set(), set(), set()
    comprehension_targets = set()
    for node in _own_nodes(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.comprehension):
            comprehension_targets |= {id(n) for n in ast.walk(node.target)}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and id(node) not in comprehension_targets:
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Global):
            declared_global |= set(node.names)
        elif isinstance(node, ast.Nonlocal):
            declared_nonlocal |= set(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return bound - declared_global - declared_nonlocal, declared_global, declared_nonlocal
