"""The learner's first run: each RELEASE notebook (labs/NN/NN.ipynb, every exercise unsolved)
executed top to bottom, going on past errors as "Run Selected Cell and All Below" from each
failing cell would.

- A cell errors only if it is a graded check of an unsolved exercise or a cell that starts with
  ``requires(...)``; every other cell (the device table, the 70B calculator, the CPU
  measurement, the RoPE explorer, the workload, the policy sweep, ...) runs without error.
- A ``requires`` cell fails with ``ExerciseNeeded`` naming every function it requires: never a
  bare ``NameError`` for a variable a failed cell above did not define, never the unsolved
  stub's ``NotImplementedError`` after minutes of computing.
- A graded check fails with ``ExerciseNeeded`` (its checker saw the stub) or the stub's
  ``NotImplementedError`` (a visible assert called it first), without the checker's frames.
"""
import ast
import os

import nbformat
import pytest
from nbclient import NotebookClient

from course_grader.samples import ROOT, labs
from course_lib.exercises import parse_python

pytestmark = pytest.mark.slow   # starts a kernel per lab and runs every cell (about a minute each)

LABS = labs()


def _requires(source: str):
    try:
        tree = parse_python(source)
    except SyntaxError:
        return None
    first = tree.body[0] if tree.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
            and getattr(first.value.func, "id", None) == "requires"):
        return [a.value for a in first.value.args]
    return None


@pytest.fixture(scope="module", params=LABS)
def executed(request, tmp_path_factory):
    lab = request.param
    nb = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    work = tmp_path_factory.mktemp(lab)
    saved = {k: os.environ.get(k) for k in ("COURSE_QUICK", "HF_HUB_OFFLINE", "MPLBACKEND")}
    os.environ.update(COURSE_QUICK="1", HF_HUB_OFFLINE="1", MPLBACKEND="Agg")   # the kernel inherits them
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(work)}}).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return lab, nb


def _errors(cell):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def test_only_checks_and_requires_cells_fail_and_they_say_why(executed):
    lab, nb = executed
    ran_clean, problems = 0, []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        errors = _errors(cell)
        needed = _requires(cell.source)
        if meta.get("grade"):
            if not errors or errors[0]["ename"] not in ("ExerciseNeeded", "NotImplementedError"):
                problems.append(f"cell {i} (check {meta['grade_id']}): expected ExerciseNeeded (from the checker) or "
                                f"the stub's NotImplementedError, got {[e['ename'] for e in errors] or 'no error'}")
            elif any("course_lib/grading" in line for line in errors[0].get("traceback", [])):
                problems.append(f"cell {i} (check {meta['grade_id']}): its error shows the checker's frames")
            continue
        if needed is None:
            if errors:
                problems.append(f"cell {i} needs no exercise but failed with {errors[0]['ename']}: "
                                f"{errors[0]['evalue'][:300]}")
            else:
                ran_clean += 1
            continue
        if not errors:
            problems.append(f"cell {i} requires {needed}, all unsolved in the release, yet it ran")
            continue
        error = errors[0]
        if error["ename"] != "ExerciseNeeded":
            problems.append(f"cell {i} requires {needed} but failed with {error['ename']}: {error['evalue'][:300]}")
        missing = [name for name in needed if f"`{name}`" not in error["evalue"]]
        if missing:
            problems.append(f"cell {i}: its error does not name {missing}: {error['evalue'][:300]}")
    assert not problems, f"{lab}:\n" + "\n".join(problems)
    assert ran_clean >= 3, f"{lab}: only {ran_clean} cells ran without needing an exercise"


def test_no_cell_fails_with_a_name_error(executed):
    lab, nb = executed
    names = [(i, e["evalue"]) for i, c in enumerate(nb.cells) if c.cell_type == "code"
             for e in _errors(c) if e["ename"] == "NameError"]
    assert not names, f"{lab}: NameError in cells {names}"
