"""What a learner reads and runs in the lab notebooks, checked without a kernel.

- Each lab's first cell shows its exercises and points exactly as the graded cells' nbgrader
  metadata declares them (``course_lib.exercises.points_table``), and every
  "**Exercise N (P points).**" statement agrees with it.
- A cell that uses a learner's function names it in a ``requires(...)`` call on its first line,
  so that it stops at once, naming the exercise, when that function is not written yet.
- ``requires`` and ``is_unsolved_stub`` tell nbgrader's release stubs from solved functions, on
  the real cells of every lab.
- Every code cell declares one role (``course_lib.exercises.cell_roles``), and what grading runs
  (set-up, exercises, checks) reads nothing that only a demonstration binds.
"""
import ast
import builtins
import inspect
import linecache
import re
import textwrap
import zlib

import nbformat
import pytest
import torch

from course_grader.samples import ROOT, labs, tables
from course_lib.kernels import exercise
from course_grader.samples import test_points as points_per_test   # not a test: renamed for pytest
from course_lib.exercises import (Exercise, ExerciseNeeded, binding_lines, bound_names, cell_roles, exercises,
                                   is_unsolved_stub, parse_python, points_table, requires)

LABS = labs()
STUB = "    # YOUR CODE HERE\n    raise NotImplementedError()"   # nbgrader's code stub (course_grader.config)


def _notebook(kind: str, lab: str):
    folder = "solutions" if kind == "solution" else "labs"
    return nbformat.read(ROOT / folder / lab / f"{lab}.ipynb", as_version=4)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


# -- exercises() on a notebook written out by hand ----------------------------------------------
def _cell(kind: str, source: str, **nbgrader):
    cell = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}[kind](source)
    if nbgrader:
        cell.metadata["nbgrader"] = nbgrader
    return cell


def _toy_notebook(extra=()):
    return nbformat.v4.new_notebook(cells=[
        _cell("markdown", "# Lab\n\n## 1. First"),
        _cell("code", "import math"),
        _cell("code", "def f(x):\n    return x\n\n\ndef g(x):\n    return 2 * x", grade_id="fg", solution=True,
              grade=False),
        _cell("code", "assert f(1) == 1", grade_id="test_f", grade=True, solution=False, points=1),
        _cell("code", "assert g(1) == 2", grade_id="test_g", grade=True, solution=False, points=1.5),
        _cell("markdown", "text\n\n## 2. Second\n\nmore"),
        _cell("code", "def h():\n    return 3", grade_id="h", solution=True, grade=False),
        _cell("code", "assert h() == 3", grade_id="test_h", grade=True, solution=False, points=2),
        *extra])


def test_exercises_follow_the_metadata_of_a_hand_written_notebook():
    assert exercises(_toy_notebook()) == (
        Exercise(number=1, cell="fg", functions=("f", "g"), tests=("test_f", "test_g"), points=2.5, section="1"),
        Exercise(number=2, cell="h", functions=("h",), tests=("test_h",), points=2, section="2"))
    table = points_table(_toy_notebook())
    assert table.splitlines()[2:] == ["| 1 | 1 | `f`, `g` | 2.5 |", "| 2 | 2 | `h` | 2 |",
                                      "| **2 exercises** | | 3 functions | **4.5** |"]


@pytest.mark.parametrize("change, message", [
    (lambda nb: nb.cells.insert(1, _cell("code", "1", grade_id="test_x", grade=True, solution=False, points=1)),
     "before the first solution cell"),
    (lambda nb: nb.cells.append(_cell("code", "def k():\n    pass", grade_id="k", solution=True, grade=False)),
     "no graded test cell"),
    (lambda nb: nb.cells.append(_cell("code", "1", grade_id="test_y", grade=True, solution=False, points="2")),
     "points"),
    (lambda nb: nb.cells.append(_cell("code", "1", grade_id="test_h", grade=True, solution=False, points=1)),
     "repeated"),
    (lambda nb: nb.cells.insert(5, _cell("code", "x = 1", grade_id="x", solution=True, grade=False)),
     "defines no function"),
])
def test_exercises_refuse_inconsistent_metadata(change, message):
    nb = _toy_notebook()
    change(nb)
    with pytest.raises(ValueError, match=message):
        exercises(nb)


def test_exercises_refuse_what_is_not_a_notebook():
    with pytest.raises(TypeError):
        exercises({"cells": "no"})
    with pytest.raises(ValueError, match="no exercise"):
        points_table(nbformat.v4.new_notebook(cells=[_cell("markdown", "# nothing graded")]))


@pytest.mark.parametrize("spurious", [1, 2])
def test_parse_python_gets_past_a_spurious_system_error(monkeypatch, spurious):
    real, calls = ast.parse, []

    def flaky(source, filename="<unknown>"):   # CPython 3.11.7's threaded AST bug, staged
        calls.append(source)
        if len(calls) <= spurious:
            raise SystemError("AST constructor recursion depth mismatch (before=1, after=2)")
        return real(source, filename)

    monkeypatch.setattr(ast, "parse", flaky)
    tree = parse_python("def f():\n    return 1\n")
    assert [n.name for n in tree.body] == ["f"] and len(calls) == spurious + 1


def test_parse_python_raises_what_persists(monkeypatch):
    def broken(source, filename="<unknown>"):
        raise SystemError("AST constructor recursion depth mismatch")

    monkeypatch.setattr(ast, "parse", broken)
    with pytest.raises(SystemError):
        parse_python("x = 1")
    monkeypatch.undo()
    with pytest.raises(SyntaxError):
        parse_python("def (")


# -- the labs' statements of their exercises and points -----------------------------------------
@pytest.mark.parametrize("lab", LABS)
@pytest.mark.parametrize("kind", ["solution", "release"])
def test_the_first_cell_states_the_exercises_and_points_of_the_metadata(lab, kind):
    nb = _notebook(kind, lab)
    assert points_table(nb) in nb.cells[0].source, (
        f"the first cell of {kind} {lab} must show this table of its exercises (from the graded cells' "
        f"metadata); paste it in place of the old one:\n\n{points_table(nb)}")


@pytest.mark.parametrize("lab", LABS)
def test_the_exercises_agree_with_the_grader_and_the_contracts(lab):
    """Independent readers of the same notebook: the sample builder's points per test and the lab's
    CONTRACTS (which functions each graded test checks)."""
    found = exercises(_notebook("solution", lab))
    points = points_per_test(lab)
    assert [t for ex in found for t in ex.tests] == list(points)
    for ex in found:
        assert ex.points == sum(points[t] for t in ex.tests)
    contracts = {c.test: c for c in tables(lab).CONTRACTS}
    for ex in found:
        for test in ex.tests:
            assert set(contracts[test].functions) <= set(ex.functions), (
                f"{test} checks {contracts[test].functions}, which exercise {ex.number} ({ex.cell}) does not define")


_STATEMENT = re.compile(r"\*\*Exercise (\d+) \(([^)]*?) points?\)\.\*\*")


@pytest.mark.parametrize("lab", LABS)
def test_each_exercise_statement_gives_its_number_and_points(lab):
    """"**Exercise N (P points).**" (or "(1 + 1 points)") in the markdown above each solution cell."""
    nb = _notebook("solution", lab)
    found = {ex.cell: ex for ex in exercises(nb)}
    statements = []
    for i, cell in enumerate(nb.cells):
        if _meta(cell).get("solution"):
            above = next(c for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
            match = _STATEMENT.search(above.source)
            assert match, (f"{lab}: no '**Exercise N (P points).**' in the markdown above solution cell "
                           f"{_meta(cell)['grade_id']}")
            stated = sum(float(p) for p in match.group(2).split("+"))
            ex = found[_meta(cell)["grade_id"]]
            assert (int(match.group(1)), stated) == (ex.number, ex.points), (
                f"{lab}: the statement says exercise {match.group(1)} with {match.group(2)} points; the metadata "
                f"says exercise {ex.number} with {ex.points}")
            statements.append(int(match.group(1)))
    assert statements == list(range(1, len(found) + 1))


# -- cells that need an exercise say so on their first line -------------------------------------
def _requires_call(tree: ast.Module):
    """The names of a leading ``requires("a", "b")`` statement, or None."""
    first = tree.body[0] if tree.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
            and isinstance(first.value.func, ast.Name) and first.value.func.id == "requires"):
        return [a.value for a in first.value.args]
    return None


@pytest.mark.parametrize("lab", LABS)
def test_a_cell_that_uses_a_learner_function_requires_it_first(lab):
    nb = _notebook("solution", lab)
    learner = {f for ex in exercises(nb) for f in ex.functions}
    checked = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _meta(cell):
            continue
        tree = parse_python(cell.source)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} & learner
        named = _requires_call(tree)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "requires"]
        assert len(calls) == (named is not None), f"{lab} cell {i}: requires(...) must be the cell's first line"
        if named is None:
            assert not used, (f"{lab} cell {i} uses {sorted(used)}: start it with "
                              f"requires({', '.join(map(repr, sorted(used)))})")
            continue
        checked += 1
        assert set(named) <= learner, f"{lab} cell {i}: requires({named}) names what no exercise defines"
        assert used <= set(named), f"{lab} cell {i} uses {sorted(used - set(named))} without requiring it"
    assert checked, f"{lab}: no cell requires an exercise"


# -- requires() and the stub test on the labs' own cells ---------------------------------------
def _defined(source: str) -> dict:
    """The functions a cell defines (a kernel cell's ``@triton.jit`` reads its source: it is put in
    linecache, as IPython does for a cell)."""
    namespace: dict = {"torch": torch, "triton": exercise.triton, "tl": exercise.tl, "__name__": "cell"}
    tree = parse_python(source)
    filename = f"<cell {zlib.crc32(source.encode()):08x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(ast.Module([n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))], []),
                 filename, "exec"), namespace)
    return {n.name: namespace[n.name] for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("lab", LABS)
def test_every_release_stub_is_unsolved_and_every_solution_is_not(lab):
    stubs = {_meta(c)["grade_id"]: c.source for c in _notebook("release", lab).cells if _meta(c).get("solution")}
    solved = {_meta(c)["grade_id"]: c.source for c in _notebook("solution", lab).cells if _meta(c).get("solution")}
    assert stubs.keys() == solved.keys()
    for cell in stubs:
        assert "raise NotImplementedError()" in stubs[cell]
        for name, function in _defined(stubs[cell]).items():
            assert is_unsolved_stub(function), f"{lab}: the release's {name} is not seen as unsolved"
            with pytest.raises(NotImplementedError):    # and it really is: a call (of a kernel's function) raises
                _call_with_nones(function.fn if exercise.is_triton_kernel(function) else function)
        for name, function in _defined(solved[cell]).items():
            assert not is_unsolved_stub(function), f"{lab}: the solution's {name} is seen as unsolved"


def _call_with_nones(function):
    """Call FUNCTION with None for every parameter that has no default."""
    args, kwargs = [], {}
    for p in inspect.signature(inspect.unwrap(function)).parameters.values():
        if p.default is p.empty and p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = None
        elif p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            args.append(None)
    return function(*args, **kwargs)


def _stub(name: str, decorator: str = ""):
    return _defined(f"{decorator}def {name}(a, b=1):\n    \"\"\"doc\"\"\"\n{STUB}\n")[name]


def test_requires_passes_solved_functions_and_costs_no_call():
    calls = []
    namespace = {"f": lambda *a: calls.append(a), "g": len}
    assert requires("f", "g", namespace=namespace) is None
    assert calls == []


def test_requires_names_unsolved_and_missing_functions():
    namespace = {"solved": lambda: 1, "todo": _stub("todo"), "later": _stub("later", "@torch.no_grad()\n")}
    with pytest.raises(ExerciseNeeded) as caught:
        requires("solved", "todo", "later", "gone", namespace=namespace)
    error = caught.value
    assert (error.unsolved, error.missing) == (("todo", "later"), ("gone",))
    message = str(error)
    for part in ("`todo` and `later` are not written yet (they still raise NotImplementedError)",
                 "`gone` is not defined yet", "rerun this cell"):
        assert part in message, message
    single = r"your `todo`, which is not written yet \(it still raises NotImplementedError\)"
    with pytest.raises(ExerciseNeeded, match=single):
        requires("todo", namespace=namespace)


def test_requires_reads_the_callers_globals_by_default():
    namespace = {"requires": requires, "todo": _stub("todo")}
    code = compile("requires('todo')", "<notebook cell>", "exec")
    with pytest.raises(ExerciseNeeded, match="`todo`"):
        exec(code, namespace)
    namespace["todo"] = _defined("def todo(a):\n    return a\n")["todo"]
    exec(code, namespace)


def test_a_partly_written_function_is_not_a_stub():
    partly = _defined(textwrap.dedent("""
        def partly(x):
            if x:
                return abs(x)
            raise NotImplementedError()
        """))["partly"]
    assert not is_unsolved_stub(partly)
    assert not is_unsolved_stub(len) and not is_unsolved_stub(object())


@pytest.mark.parametrize("bad, error", [((), ValueError), ((3,), TypeError), (("not a name",), ValueError)])
def test_requires_refuses_bad_names(bad, error):
    with pytest.raises(error):
        requires(*bad, namespace={})


# -- cell roles: what the grader runs (set-up, exercises, checks) and skips (demonstrations) ------
def _reads(source: str) -> set[str]:
    """Names SOURCE reads that it does not bind anywhere itself (its functions' parameters and
    locals included) and that are not builtins: what it needs from other cells."""
    tree = parse_python(source)
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    local = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    local |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
              for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg) if a is not None}
    return loads - local - bound_names(source) - set(dir(builtins))


@pytest.mark.parametrize("kind", ["solution", "release"])
@pytest.mark.parametrize("lab", LABS)
def test_every_code_cell_declares_one_role_that_agrees_with_nbgrader(lab, kind):
    roles = cell_roles(_notebook(kind, lab))
    assert "setup" in roles and "demonstration" in roles


@pytest.mark.parametrize("lab", LABS)
def test_what_grading_runs_needs_nothing_from_a_demonstration(lab):
    """The cells grading runs (set-up, exercises, checks) read only names those cells bind, and
    the set-up binds every notebook object a check's contract names (``Contract.objects``)."""
    nb = _notebook("solution", lab)
    graded = [(i, c.source) for i, (c, role) in enumerate(zip(nb.cells, cell_roles(nb))) if role in
              ("setup", "exercise", "check")]
    bound = set().union(*(bound_names(source) for _, source in graded))
    for index, source in graded:
        assert not _reads(source) - bound, f"cell {index} reads {sorted(_reads(source) - bound)}, which only " \
            "demonstration cells bind"
    setup = set().union(*(bound_names(c.source) for c, role in zip(nb.cells, cell_roles(nb)) if role == "setup"))
    for contract in tables(lab).CONTRACTS:
        assert set(contract.objects) <= setup, f"{contract.test} needs {sorted(contract.objects)} from the set-up"


@pytest.mark.parametrize("change, message", [
    (lambda cell: cell.metadata.pop("tags"), "exactly one"),
    (lambda cell: cell.metadata.update(tags=["setup", "demonstration"]), "exactly one"),
    (lambda cell: cell.metadata.update(tags=["check"]), "not an nbgrader solution or graded test cell"),
])
def test_cell_roles_refuses_a_missing_doubled_or_wrong_role(change, message):
    nb = _toy_notebook()
    roles = {"import math": "setup"}
    for cell in nb.cells:
        if cell.cell_type == "code":
            meta = cell.metadata.get("nbgrader", {})
            cell.metadata["tags"] = ["exercise" if meta.get("solution") else "check" if meta.get("grade")
                                     else roles[cell.source]]
    assert cell_roles(nb)[1] == "setup"
    change(nb.cells[1])
    with pytest.raises(ValueError, match=message):
        cell_roles(nb)


def test_bound_names_are_the_globals_a_cell_binds():
    source = ("import os.path, numpy as np\nfrom a import b as c\nx, (y, z) = 1, (2, 3)\nfor i in range(3): j = i\n"
              "def f(a=k): q = 1\nclass K: r = 2\n[w for w in range(3)]\nwith open('x') as fh: pass\n"
              "try: pass\nexcept E as e: pass\nif (n := 3): m = 4\n%timeit f(1)")
    assert bound_names(source) == {"os", "np", "c", "x", "y", "z", "i", "j", "f", "K", "fh", "e", "n", "m"}
    assert binding_lines(source) == {"os": 1, "np": 1, "c": 2, "x": 3, "y": 3, "z": 3, "i": 4, "j": 4, "f": 5, "K": 6,
                                     "fh": 8, "e": 10, "n": 11, "m": 11}
