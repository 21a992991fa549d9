"""The exercises of a lab notebook, and the guard at the top of a cell that needs one.

A lab notebook (the nbgrader source in ``solutions/``, the release in ``labs/``) marks each
exercise with nbgrader cell metadata: one *solution* cell (``"solution": true``; its ``grade_id``
names it) that defines the learner's functions, followed by the graded *test* cells
(``"grade": true``, a ``grade_id`` starting with ``test_`` and ``points``) that check them.
That metadata is the one home of a lab's exercise list:

* ``exercises(nb)`` derives the list from it: numbering in notebook order, the functions each
  exercise defines, its tests and the sum of their points, and the section it sits in;
* ``points_table(nb)`` renders the list as the markdown table each lab's first cell shows
  (``tests/test_notebook_structure.py`` checks that the cell holds exactly this table and that
  every "**Exercise N (P points).**" statement agrees with it);
* ``requires(*names)`` is the first line of a notebook cell that uses a learner's function: when
  one is not defined yet, or is still nbgrader's unsolved stub (``raise NotImplementedError()``),
  it stops the cell at once with an ``ExerciseNeeded`` error that names the function, instead of
  a long computation followed by a ``NotImplementedError``, or a ``NameError`` in a later cell.

Each code cell also declares its *role* with one Jupyter tag (``ROLES``): ``setup`` (imports and
the objects a check uses), ``exercise`` (the solution cells), ``check`` (the graded test cells) or
``demonstration`` (tables, plots, sweeps and measurements that teach but are not graded). The
grader runs every cell but the demonstrations (``course_grader.preprocessors.SkipDemonstrations``);
``cell_roles(nb)`` reads and validates the tags, ``bound_names(source)`` says what a cell defines
(``binding_lines(source)``: and where).

The notebook format is read as plain JSON (``nb["cells"]``, each with ``cell_type``, ``source`` as a
string or a list of lines, ``metadata``), so an ``nbformat`` node and ``json.load`` output both work.
"""
from __future__ import annotations

import ast
import gc
import inspect
import re
import sys
import time
from dataclasses import dataclass
from numbers import Real
from typing import Any, Mapping

__all__ = ["Exercise", "ExerciseNeeded", "exercises", "points_table", "requires", "is_unsolved_stub",
           "parse_python", "ROLES", "cell_roles", "bound_names", "binding_lines"]

_HEADING = re.compile(r"^##\s+(\d+)\.", re.MULTILINE)   # "## 4. Prefill: ..." -> section "4"


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(SOURCE, FILENAME)``, tried up to 3 times in all (the later tries with the garbage
    collector paused) when it raises a spurious ``SystemError``.

    CPython 3.11 before 3.11.8 keeps the AST converter's recursion depth in state shared by all
    threads, so a parse can raise ``SystemError: AST constructor recursion depth mismatch`` when
    another thread converts an AST at the same moment (python/cpython#106905). Python 3.11 also
    parses source while it formats a traceback, so any thread that logs an exception (a kernel
    manager, an event loop, a Dask worker) can set it off. The text was fine: a second parse of
    it succeeds.

    Raises:
        SyntaxError, ValueError: as ``ast.parse``.
        SystemError: when the last try fails too.
    """
    tries = 3
    for attempt in range(tries):
        paused = attempt > 0 and gc.isenabled()
        if attempt:
            time.sleep(0.01 * attempt)   # let the other thread's conversion finish
        if paused:
            gc.disable()
        try:
            return ast.parse(source, filename)
        except SystemError:
            if attempt == tries - 1:
                raise
        finally:
            if paused:
                gc.enable()


@dataclass(frozen=True)
class Exercise:
    """One exercise of a lab notebook, as its nbgrader metadata declares it.

    Attributes:
        number: 1, 2, ... in notebook order of the solution cells.
        cell: the solution cell's ``grade_id`` (the name the lab's FAULTS edits refer to).
        functions: the names the solution cell defines at top level (``def``), in order.
        tests: the ``grade_id`` of each graded test cell between this solution cell and the next.
        points: the sum of those test cells' ``points`` (an int when every one is whole).
        section: the number of the last "## N. Title" heading above the solution cell, or None.
    """

    number: int
    cell: str
    functions: tuple[str, ...]
    tests: tuple[str, ...]
    points: float
    section: str | None


class ExerciseNeeded(RuntimeError):
    """A notebook cell needs a learner function that is not defined yet or not solved yet.

    Attributes:
        missing: names that are not defined in the notebook's namespace.
        unsolved: names still bound to nbgrader's unsolved stub.
    """

    def __init__(self, message: str, missing: tuple[str, ...] = (), unsolved: tuple[str, ...] = ()):
        super().__init__(message)
        self.missing = missing
        self.unsolved = unsolved

    def _render_traceback_(self) -> list[str]:
        """How IPython and Jupyter show it: the message alone, without the frames of the library
        code that raised it (the message says what to do; the cell is the one that failed)."""
        return [f"{type(self).__name__}: {self}"]


def _source(cell: Mapping) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _nbgrader(cell: Mapping) -> Mapping:
    return (cell.get("metadata") or {}).get("nbgrader") or {}


def exercises(nb: Mapping) -> tuple[Exercise, ...]:
    """The exercises of a lab notebook, from its nbgrader metadata.

    Args:
        nb: a notebook as JSON (a dict with ``cells``) or an ``nbformat`` node.

    Returns:
        One ``Exercise`` per solution cell, in notebook order; each owns the graded test cells
        that follow it up to the next solution cell.

    Raises:
        TypeError: ``nb`` has no ``cells`` list.
        ValueError: a graded test cell before the first solution cell, a solution cell with no
            graded test after it or no top-level ``def``, a graded cell without a numeric
            ``points`` >= 0, or a repeated ``grade_id``.
    """
    cells = nb.get("cells") if isinstance(nb, Mapping) else None
    if not isinstance(cells, list):
        raise TypeError(f"nb must be a notebook (a mapping with a 'cells' list), got {type(nb).__name__}")
    found: list[dict[str, Any]] = []
    seen: set[str] = set()
    section = None
    for index, cell in enumerate(cells):
        text = _source(cell)
        if cell.get("cell_type") == "markdown":
            headings = _HEADING.findall(text)
            section = headings[-1] if headings else section
            continue
        meta = _nbgrader(cell)
        grade_id = meta.get("grade_id")
        if not (meta.get("solution") or meta.get("grade")):
            continue
        if grade_id in seen:
            raise ValueError(f"cell {index}: grade_id {grade_id!r} is repeated")
        seen.add(grade_id)
        if meta.get("solution"):
            tree = parse_python(text, f"<solution cell {grade_id}>")
            functions = tuple(node.name for node in tree.body
                              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
            if not functions:
                raise ValueError(f"solution cell {grade_id!r} defines no function")
            found.append({"cell": grade_id, "functions": functions, "tests": [], "points": [],
                          "section": section})
        if meta.get("grade"):
            points = meta.get("points")
            if isinstance(points, bool) or not isinstance(points, Real) or not points >= 0:
                raise ValueError(f"graded cell {grade_id!r} has points {points!r}: a number >= 0 is needed")
            if not found:
                raise ValueError(f"graded cell {grade_id!r} comes before the first solution cell")
            found[-1]["tests"].append(grade_id)
            found[-1]["points"].append(points)
    for entry in found:
        if not entry["tests"]:
            raise ValueError(f"solution cell {entry['cell']!r} has no graded test cell after it")
    return tuple(Exercise(number=i, cell=e["cell"], functions=e["functions"], tests=tuple(e["tests"]),
                          points=_plain(sum(e["points"])), section=e["section"])
                 for i, e in enumerate(found, start=1))


#: The role tags of a lab notebook's code cells, one per cell (see the module docstring).
ROLES = ("setup", "exercise", "check", "demonstration")


def cell_roles(nb: Mapping) -> list[str | None]:
    """The role of each cell of a lab notebook (None for a markdown or raw cell), from its tags.

    Args:
        nb: a notebook as JSON (a dict with ``cells``) or an ``nbformat`` node.

    Raises:
        TypeError: ``nb`` has no ``cells`` list.
        ValueError: a code cell with no role tag or with more than one, or one whose role
            disagrees with its nbgrader metadata (a solution cell is an ``exercise``, a graded
            test cell a ``check``, and no other cell is either).
    """
    cells = nb.get("cells") if isinstance(nb, Mapping) else None
    if not isinstance(cells, list):
        raise TypeError(f"nb must be a notebook (a mapping with a 'cells' list), got {type(nb).__name__}")
    roles: list[str | None] = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            roles.append(None)
            continue
        tags = [t for t in ((cell.get("metadata") or {}).get("tags") or []) if t in ROLES]
        if len(tags) != 1:
            raise ValueError(f"code cell {index} has role tags {tags}: exactly one of {', '.join(ROLES)} is needed")
        meta = _nbgrader(cell)
        expected = "exercise" if meta.get("solution") else "check" if meta.get("grade") else None
        declared = tags[0] if tags[0] in ("exercise", "check") else None
        if declared != expected:
            what = f"nbgrader marks it a {'solution' if expected == 'exercise' else 'graded test'} cell" \
                if expected else "it is not an nbgrader solution or graded test cell"
            raise ValueError(f"code cell {index} is tagged {tags[0]!r} but {what}")
        roles.append(tags[0])
    return roles


def binding_lines(source: str) -> dict[str, int]:
    """The global names a code cell's SOURCE binds when it runs, each with the line number (from 1)
    of its first binding: assignment targets (walrus, ``for``, ``with ... as`` and ``except ... as``
    included), ``def``, ``class`` and ``import``. Names local to a function, class body, lambda or
    comprehension are not global and are left out; IPython magic lines (starting with ``%`` or
    ``!``) bind nothing.

    Raises:
        SyntaxError: SOURCE is not Python.
    """
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    found: dict[str, int] = {}

    def bind(name: str, node: ast.AST) -> None:
        line = getattr(node, "lineno", 0)
        if name not in found or line < found[name]:
            found[name] = line

    class Binder(ast.NodeVisitor):
        def visit_Name(self, node: ast.Name) -> None:
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                bind(node.id, node)

        def visit_alias(self, node: ast.alias) -> None:
            if node.name != "*":
                bind(node.asname or node.name.partition(".")[0], node)

        def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
            if node.name:
                bind(node.name, node)
            self.generic_visit(node)

        def _defines(self, node) -> None:           # its name is global, its body is not
            bind(node.name, node)
            for child in (*node.decorator_list, *getattr(node, "bases", ()), *getattr(node, "keywords", ())):
                self.visit(child)

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _defines

        def _local(self, node) -> None:
            pass

        visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _local

    Binder().visit(parse_python("\n".join(lines)))
    return found


def bound_names(source: str) -> frozenset[str]:
    """The global names SOURCE binds (``binding_lines`` without the line numbers).

    Raises:
        SyntaxError: SOURCE is not Python.
    """
    return frozenset(binding_lines(source))


def _plain(value: float) -> float:
    """An integral number as an int (2.0 -> 2), anything else unchanged."""
    return int(value) if float(value).is_integer() else value


def points_table(nb: Mapping) -> str:
    """The markdown table of a lab's exercises and points that its first cell shows.

    One row per exercise (number, section, the functions to write, points) and a total row;
    the points are the sums of the graded cells' nbgrader ``points``.

    Raises:
        TypeError, ValueError: as ``exercises``; ValueError also for a notebook without exercises.
    """
    found = exercises(nb)
    if not found:
        raise ValueError("the notebook has no exercise (no nbgrader solution cell)")
    rows = ["| exercise | section | you write | points |", "| --- | --- | --- | --- |"]
    for ex in found:
        rows.append(f"| {ex.number} | {ex.section or ''} | {', '.join(f'`{f}`' for f in ex.functions)} "
                    f"| {ex.points} |")
    n_functions = sum(len(ex.functions) for ex in found)
    total = _plain(sum(ex.points for ex in found))
    rows.append(f"| **{len(found)} exercises** | | {n_functions} functions | **{total}** |")
    return "\n".join(rows)


def is_unsolved_stub(function: Any) -> bool:
    """Whether ``function`` is still an unsolved exercise: a Python function whose code does
    nothing but raise ``NotImplementedError`` (the only global name it uses), which is what
    nbgrader's release puts in place of a solution (``raise NotImplementedError()``, the stub
    ``autograder/course_grader/config.py`` sets). Decorators that keep ``__wrapped__``
    (``functools.wraps``, ``torch.no_grad()``) are looked through. Anything without Python code
    (a builtin, a class instance) is not a stub. A ``@triton.jit`` kernel (triton's ``JITFunction``
    or ``InterpretedFunction``) is judged by the function it wraps (its ``fn``)."""
    if type(function).__name__ in ("JITFunction", "InterpretedFunction"):
        function = getattr(function, "fn", None)
    try:
        code = inspect.unwrap(function).__code__
    except (AttributeError, ValueError):   # no __code__, or a __wrapped__ cycle
        return False
    return code.co_names == ("NotImplementedError",)


def _names(items) -> str:
    """`a`, `b` and `c`."""
    quoted = [f"`{n}`" for n in items]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _unwritten(one: bool) -> str:
    return (f"{'is' if one else 'are'} not written yet "
            f"({'it still raises' if one else 'they still raise'} NotImplementedError)")


def _undefined(one: bool) -> str:
    return (f"{'is' if one else 'are'} not defined yet "
            f"({'its' if one else 'their'} exercise cell has not run since the kernel started)")


def requires(*names: str, namespace: Mapping[str, Any] | None = None) -> None:
    """Stop the calling notebook cell at once unless the learner functions it uses are ready.

    Call it as a cell's first line: ``requires("generate_with_cache")``. A function is ready when
    it is defined in the notebook's namespace and is not nbgrader's unsolved stub
    (``is_unsolved_stub``). The check calls nothing, so it costs no time.

    Args:
        names: the learner functions the cell needs (at least one identifier).
        namespace: where to look them up; by default the caller's globals, which in a notebook
            cell is the notebook's namespace.

    Raises:
        TypeError: a name that is not a str.
        ValueError: no name, or a name that is not an identifier.
        ExerciseNeeded: one or more functions are not defined or not solved yet; the message
            names each one and says what to do, and ``missing`` / ``unsolved`` list them.
    """
    if not names:
        raise ValueError("requires() needs at least one function name")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"requires() takes function names as str, got {name!r} of type {type(name).__name__}")
        if not name.isidentifier():
            raise ValueError(f"requires() takes function names, got {name!r}")
    scope = sys._getframe(1).f_globals if namespace is None else namespace
    missing = tuple(n for n in names if n not in scope)
    unsolved = tuple(n for n in names if n in scope and is_unsolved_stub(scope[n]))
    if not (missing or unsolved):
        return
    if set(unsolved) == set(names) or set(missing) == set(names):     # one reason for all: "which ..."
        state = _unwritten if unsolved else _undefined
        what = f"your {_names(names)}, which {state(len(names) == 1)}"
    else:
        clauses = [f"{_names(group)} {state(len(group) == 1)}"
                   for group, state in ((unsolved, _unwritten), (missing, _undefined)) if group]
        what = f"your {_names(names)}: " + "; ".join(clauses)
    several = len(missing) + len(unsolved) > 1
    exercise, cells = ("those exercises", "their cells and the checks below them") if several else \
        ("that exercise", "its cell and the check below it")
    raise ExerciseNeeded(f"this cell needs {what}. Solve {exercise} (the table in the notebook's first cell "
                         f"says which one asks for each function), run {cells}, then rerun this cell.",
                         missing=missing, unsolved=unsolved)
