"""Does a graded learner function run course_lib's own reference for its exercise?

Every graded test's contract (``course_lib.grading.labNN.CONTRACTS``, ``Contract.references``)
names the course_lib functions that compute what its exercise asks for, e.g.
``course_lib.roofline.kv_bytes_per_token`` for Lab 1's ``kv_bytes_per_token``. A learner
function that only wraps one of them (``return int(_r.kv_bytes_per_token(config, b)) + 0``)
passes every black-box check, the judge's included. This module makes such reuse visible.

**What flags a test.** While the judge calls a learner function (``watch_spec`` on the judge's
side, ``Observer`` in the learner's kernel), a profiler hook (``sys.setprofile``, and
``threading.setprofile`` for threads started during the call; on for that call only) records
whether the code of a declared reference ran, matched by its qualified name and its file inside
the ``course_lib`` package, or by a digest of its code (``_fingerprint``: bytecode, constants
with the docstring, looked-up names), so a copy made from its code object, renamed, or compiled
from its source pasted unchanged counts too. The route to it does not matter: an alias,
``importlib``, ``getattr``, ``sys.modules``, a helper, a lambda, a class, ``exec``, or another
course_lib function that calls the reference. The hook is installed with the interpreter's own
profiler functions, taken once when the kernel first imports this module (``genuine_profiler``);
a call during which it was switched off, or a kernel whose profiler functions were already
replaced, is reported as unobserved.

**What it does not see.** The flag is for a person, not a proof, and no flag is no proof of
authorship either:

* code that did not run during the judge's calls: a reference only named, called on inputs the
  judge did not draw, or called before the call (its results kept in a table by an earlier cell);
* code run outside the profiled thread: a thread, executor or process started before the call, a
  thread started during it with ``_thread.start_new_thread`` (``threading.setprofile`` reaches only
  ``threading``'s threads), any process (``multiprocessing``, ``subprocess``, ``os.fork``), native code;
* a reference that is not Python code (``watch_spec`` skips it), and an *edited* copy of a
  reference (any changed constant, docstring or looked-up name): the learner's code, as far as
  this check can tell;
* learner code that defeats the hook from inside the kernel, where it runs first: a function that
  takes the hook with ``sys.getprofile()``, switches it off and puts it back before returning is
  reported as observed, and code that replaces this module's ``Observer``, or answers the judge in
  the harness's place through the stdin channel, reports what it likes (the judge fails a cell
  whose kernel answers again after the judge ended the session, the trace a naive forger leaves).

**The code scan** (``analyse``) reads the notebook's code cells with ``ast`` (IPython magics first
rewritten by IPython's own input transformer) and never runs them. It only lists what a person
may want to read, and never flags a test nor changes a score: ``Analysis.named`` says where the
code names a flagged reference (the note's ``named at ...``), and ``Analysis.dynamic`` lists code
that can keep a reference's run from the hook: a use of the profiler switches (``sys.setprofile``,
``settrace``, ``threading.setprofile``...), of threads, executors or processes, of
``course_grader``, and a write into ``sys``, ``threading``, ``builtins``, ``_thread`` or
``course_lib``. It is lexical: it follows names bound by import statements and by plain
``a = b.c`` assignments, nothing else, so a name built at run time (``getattr`` with a computed
string, ``vars()``, ``exec``) passes it unreported.

Which library function is the reference for which test is declared once, in the lab's
``CONTRACTS`` table; the judge (``course_grader.judge``) watches its calls for every graded cell
whose contract declares references and stores ``assess``'s result in the cell's verdict
(``reference_reuse``); the driver (``course_grader.grade``) lists ``flag_notes`` in
``grades.csv``'s ``flags`` and, with ``--reference-reuse zero`` (``c.CourseJudge.reference_reuse =
"zero"`` on the stock nbgrader commands), those tests score 0. See ``autograder/README.md``.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import sys
import threading
import types
from typing import Sequence

from .text import parse_python

__all__ = ["Analysis", "analyse", "notebook_cells", "watch_spec", "Observer", "genuine_profiler",
           "runtime_summary", "assess", "flag_notes", "MAX_CELL_CHARS"]

#: A code cell longer than this is not scanned (``Analysis.dynamic`` says so).
MAX_CELL_CHARS = 1_000_000
_TEXT = 60  # characters of learner source quoted in a note

# What the scan lists in Analysis.dynamic: dotted names (after the notebook's aliases) and why.
_PROFILER_SWITCHES = ("sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace",
                      "threading.setprofile_all_threads", "threading.settrace_all_threads")
_CONCURRENCY = ("threading.Thread", "threading.Timer", "_thread.start_new_thread", "_thread.start_new",
                "concurrent.futures", "multiprocessing", "os.fork", "os.posix_spawn", "subprocess")
_GRADER = ("course_grader",)
_WRITE_GUARDED = ("sys", "threading", "builtins", "_thread", "course_lib")


# == the code scan ================================================================================
class Analysis:
    """What the code scan found in a notebook's code cells (build with ``analyse``).

    ``dynamic``: code that can keep a reference's run from the call-time hook, each as
    ``"`line` (why; cell C line N)"``, in cell order, no repeats; a cell too long to scan is
    listed too. ``aliases``: the names the notebook binds by import or plain assignment to a
    dotted name (``{"_r": "course_lib.roofline"}``)."""

    def __init__(self, cells: Sequence[tuple[str, str]]) -> None:
        self.cells: list[tuple[str, list[str], ast.Module]] = []   # label, source lines, tree
        self.aliases: dict[str, str] = {}
        self.dynamic: list[str] = []
        for label, source in cells:
            source = "".join(source) if isinstance(source, list) else str(source)
            if len(source) > MAX_CELL_CHARS:
                self.dynamic.append(f"cell {label} not scanned ({len(source):,} characters)")
                continue
            parsed = _parse(source)
            if parsed is not None:                     # a cell that does not parse fails in the kernel too
                self.cells.append((str(label), parsed[1].splitlines(), parsed[0]))
        for _, _, tree in self.cells:
            self._collect_aliases(tree)
        for label, lines, tree in self.cells:
            for node in ast.walk(tree):
                why = self._hides(node)
                if why is not None:
                    note = f"`{_line(lines, node)}` ({why}; cell {label} line {node.lineno})"
                    if note not in self.dynamic:
                        self.dynamic.append(note)

    def _collect_aliases(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.aliases.update({a.asname: a.name for a in node.names if a.asname})
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self.aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                                     if a.name != "*"})
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = _dotted(node.value)
                if value is not None and value != node.targets[0].id:
                    self.aliases[node.targets[0].id] = value

    def resolve(self, node: ast.AST) -> str | None:
        """NODE's dotted name (a name or an attribute chain) with its first part followed through
        ``aliases``: ``s.setprofile`` after ``import sys as s`` is ``sys.setprofile``; None for
        any other expression."""
        name = _dotted(node)
        seen: set[str] = set()
        while name is not None:
            head, _, rest = name.partition(".")
            if head in seen or head not in self.aliases:
                break
            seen.add(head)
            name = self.aliases[head] + ("." + rest if rest else "")
        return name

    def _hides(self, node: ast.AST) -> str | None:
        """Why NODE can keep a reference's run from the call-time hook, or None."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and _under(self.resolve(node.args[0]), _WRITE_GUARDED):
            return f"writes into {self.resolve(node.args[0]).split('.')[0]}"
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return None
        name = self.resolve(node)
        if _under(name, _PROFILER_SWITCHES):
            return "switches the profiler"
        if _under(name, _CONCURRENCY):
            return "runs code beside the call"
        if _under(name, _GRADER):
            return "reaches the grader's modules"
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            base = self.resolve(node.value)
            if _under(base, _WRITE_GUARDED):
                return f"writes into {base.split('.')[0]}"
        return None

    def named(self, reference: str, functions: Sequence[str] = ()) -> list[str]:
        """Where the code names the last part of REFERENCE (``kv_bytes_per_token`` for
        ``course_lib.roofline.kv_bytes_per_token``) as an attribute, a from-imported name or a
        string constant, each as ``"`line` in cell C line N"``, those inside a top-level ``def`` of
        one of FUNCTIONS first. A hint for a person: a name alone does not say which object it is."""
        word = reference.rpartition(".")[2]
        inside, outside = [], []
        for label, lines, tree in self.cells:
            for top in tree.body:
                own = isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) and top.name in functions
                for node in ast.walk(top):
                    if (isinstance(node, ast.Attribute) and node.attr == word
                            or isinstance(node, ast.alias) and node.name == word
                            or isinstance(node, ast.Constant) and node.value == word):
                        (inside if own else outside).append(f"`{_line(lines, node)}` in cell {label} "
                                                            f"line {node.lineno}")
        return list(dict.fromkeys(inside + outside))


def analyse(cells: Sequence[tuple[str, str]]) -> Analysis:
    """Scan CELLS, ``(label, source)`` pairs of code cells in execution order (see
    ``notebook_cells``); never executes them. A cell that does not parse is skipped (it raises
    in the kernel as well)."""
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


@functools.lru_cache(maxsize=512)
def _parse(source: str) -> tuple[ast.Module, str] | None:
    """(tree, the source it was parsed from) for SOURCE with its IPython magics rewritten into
    Python; None when it does not parse. Cached: each graded cell scans the cells before it."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        source = TransformerManager().transform_cell(source)
    except Exception:
        pass
    try:
        return parse_python(source), source
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a name or an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _under(name: str | None, prefixes: Sequence[str]) -> bool:
    return name is not None and any(name == p or name.startswith(p + ".") for p in prefixes)


def _line(lines: list[str], node: ast.AST) -> str:
    """The source line of NODE, stripped and cut to _TEXT characters."""
    index = getattr(node, "lineno", 0) - 1
    text = " ".join(lines[index].split()) if 0 <= index < len(lines) else type(node).__name__
    return text if len(text) <= _TEXT else text[:_TEXT - 3] + "..."


# == call time ====================================================================================
def watch_spec(references: Sequence[str]) -> list[dict]:
    """What the kernel's ``Observer`` watches for REFERENCES: for each one that is Python code,
    its dotted name, the qualified name of its code object, its file relative to the folder
    holding the ``course_lib`` package (``course_lib/roofline.py``) and its code's fingerprint.
    Judge side (trusted course_lib); the kernel matches code objects by these, so a reference that
    learner code re-bound, copied with ``types.FunctionType`` or imported under another name is
    still seen.

    Raises: LookupError for a reference that does not resolve (a course-authoring error)."""
    import inspect
    from pathlib import Path

    import course_lib
    from course_lib.grading.tables import resolve_reference

    root = Path(course_lib.__file__).resolve().parent.parent
    spec = []
    for ref in references:
        fn = resolve_reference(ref)
        fn = getattr(fn, "__func__", fn)                   # a bound or class method's function
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
    """Text of a constant for ``_fingerprint``. Only the kinds the compiler makes are read; any
    other object (planted by learner code with ``code.replace(co_consts=...)``) reads "object",
    unasked: its ``__repr__`` would run learner code inside the profiler hook, unobserved."""
    kind = type(value)
    if kind is types.CodeType:
        return "code:" + _fingerprint(value)
    if kind is tuple:
        return "(" + ",".join(_const_text(v) for v in value) + ")"
    if kind is frozenset:                             # its order varies with string hashing
        return "{" + ",".join(sorted(_const_text(v) for v in value)) + "}"
    if kind in (int, float, complex, str, bytes, bool, type(None), type(...)):
        return f"{kind.__name__}:{value!r}"
    return "object"


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

    Returns ``{"references", "named", "unobserved", "zeroed"}``: the declared references whose
    code ran during the judge's calls (the flag), up to three places where CELLS name them
    (``Analysis.named``, a hint), the calls the hook did not observe, and whether the test is
    to score 0."""
    checks = [c for c in verdict.get("checks", []) if c.get("references")]
    if not checks:
        return None
    references = list(dict.fromkeys(r for c in checks for r in c["references"]))
    ran = {r for c in checks for r in c.get("reached", []) if isinstance(r, str)}
    found = [r for r in references if r in ran]
    unobserved = sum(int(c.get("unobserved", 0) or 0) for c in checks)
    if not found and not unobserved:
        return None
    named: list[str] = []
    if found:
        functions = list(dict.fromkeys(f for c in checks for f in c.get("functions", [])))
        analysis = analyse(notebook_cells(cells))
        named = list(dict.fromkeys(w for r in found for w in analysis.named(r, functions)))[:3]
    return {"references": found, "named": named, "unobserved": unobserved, "zeroed": bool(zero and found)}


def flag_notes(records: Sequence[dict]) -> list[str]:
    """The driver's ``flags`` notes from a submission's verdict records (``judge.read_verdicts``):
    per test that reuses a reference, ``reuses reference A, B in test_x (ran during the judge's
    calls; named at `...` in cell C line N)``; per test whose calls the hook did not observe, a
    note saying so; and each of the notebook's ``Analysis.dynamic`` findings once."""
    notes, dynamic = [], []
    for record in records:
        for verdict in record.get("cells", []):
            reuse = verdict.get("reference_reuse")
            if not isinstance(reuse, dict):
                continue
            test = verdict.get("grade_id", "?")
            refs = [r for r in reuse.get("references", []) if isinstance(r, str)]
            if refs:
                evidence = ["ran during the judge's calls"]
                evidence += [f"named at {w}" for w in reuse.get("named", [])[:1] if isinstance(w, str)]
                evidence += ["scored 0"] if reuse.get("zeroed") else []
                notes.append(f"reuses reference {', '.join(refs)} in {test} ({'; '.join(evidence)})")
            if reuse.get("unobserved"):
                notes.append(f"{test}: the judge's call-time reference check was switched off by the learner's code "
                             f"in {reuse['unobserved']} call(s)")
        dynamic += [d for d in record.get("dynamic_code", []) if isinstance(d, str)]
    notes += [f"may hide calls from the reference check: {d}" for d in dict.fromkeys(dynamic)]
    return notes
