#!/usr/bin/env python
"""Regenerate the sample submissions in autograder/samples/ from the labs' fault tables.

    python -m course_grader.samples            (or: make samples)
    python -m course_grader.samples --check    exit 1 if a committed sample or the expected
                                               scores differ from what the tables give

For each lab (``solutions/NN_name/``, with its tables in ``course_lib.grading.labNN``) this
writes, as nbgrader's submitted layout ``samples/{learner}/{lab}/{lab}.ipynb``:
- ``solution``: the learner release with every solution cell filled in from solutions/
  (markers removed) - what a learner who solved everything hands in;
- ``release``: the untouched learner release (every exercise still raises);
- one ``fault_<name>`` learner per entry of the lab's ``FAULTS``: the solution with that
  fault's edits made in its solution cells;
and ``samples/expected_scores.csv``: per lab, the solution scores every point, the release 0,
and each fault every point but those of the tests its ``fails`` lists (0 each). The points come
from the source notebook's nbgrader metadata, the failures from the table: a grader that stops
catching a fault makes `make test-grading` fail.
"""
from __future__ import annotations

import copy
import csv
import importlib
import io
import shutil
import sys
from pathlib import Path

import nbformat

from .paths import REPO_ROOT as ROOT
from .paths import SAMPLES

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
EXPECTED = SAMPLES / "expected_scores.csv"


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def labs() -> list[str]:
    """Labs with a source notebook, in order."""
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())


def tables(lab: str):
    """``course_lib.grading.labNN`` of LAB (its CONTRACTS and FAULTS)."""
    module = importlib.import_module(f"course_lib.grading.lab{lab[:2]}")
    if not hasattr(module, "FAULTS"):
        raise SystemExit(f"course_grader.samples: course_lib.grading.lab{lab[:2]} declares no FAULTS table")
    return module


def source_notebook(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)


def solution_sources(lab: str) -> dict[str, str]:
    """grade_id -> source of each solution cell of the source notebook, without the solution
    markers, in notebook order (what a learner who solved everything wrote)."""
    out = {}
    for cell in source_notebook(lab).cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            out[_grade_id(cell)] = "\n".join(ln for ln in cell.source.splitlines() if ln.strip() not in MARKERS)
    return out


def test_points(lab: str) -> dict[str, float]:
    """grade_id -> points of each graded test cell of the source notebook."""
    out = {}
    for cell in source_notebook(lab).cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            out[meta["grade_id"]] = meta.get("points", 0)
    return out


def build(lab: str) -> dict[str, nbformat.NotebookNode]:
    """learner -> notebook, for the solution, the release and every fault of LAB."""
    release = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    solved = copy.deepcopy(release)
    sources = solution_sources(lab)
    for cell in solved.cells:
        if _grade_id(cell) in sources:
            cell.source = sources[_grade_id(cell)]
    notebooks = {"solution": solved, "release": release}
    for fault in tables(lab).FAULTS:
        nb = copy.deepcopy(solved)
        for edit in fault.edits:
            cell = next((c for c in nb.cells if _grade_id(c) == edit.cell), None)
            if cell is None:
                raise SystemExit(f"course_grader.samples: {fault.learner}: no solution cell {edit.cell!r} in {lab}")
            try:
                cell.source = edit.apply(cell.source)
            except ValueError as exc:
                raise SystemExit(f"course_grader.samples: {fault.learner}: {exc}") from None
        notebooks[fault.learner] = nb
    return notebooks


def expected_rows(lab: str) -> list[dict]:
    """Rows of expected_scores.csv for LAB: totals, and a 0 row per test a fault must fail."""
    points = test_points(lab)
    total = sum(points.values())
    rows = [{"learner": "solution", "lab": lab, "cell": "total", "score": total},
            {"learner": "release", "lab": lab, "cell": "total", "score": 0}]
    for fault in tables(lab).FAULTS:
        unknown = sorted(set(fault.fails) - set(points))
        if unknown:
            raise SystemExit(f"course_grader.samples: {fault.learner} fails tests not in {lab}: {unknown}")
        rows.append({"learner": fault.learner, "lab": lab, "cell": "total",
                     "score": total - sum(points[t] for t in fault.fails)})
        rows += [{"learner": fault.learner, "lab": lab, "cell": test, "score": 0}
                 for test in points if test in fault.fails]
    return rows


def _format(score) -> str:
    return str(int(score)) if float(score).is_integer() else repr(float(score))


def expected_csv() -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, ["learner", "lab", "cell", "score"], lineterminator="\n")
    writer.writeheader()
    for lab in labs():
        for row in expected_rows(lab):
            writer.writerow({**row, "score": _format(row["score"])})
    return out.getvalue()


def generated() -> dict[str, str]:
    """Path relative to samples/ -> the text each generated file must have."""
    files = {"expected_scores.csv": expected_csv()}
    for lab in labs():
        for learner, nb in build(lab).items():
            files[f"{learner}/{lab}/{lab}.ipynb"] = nbformat.writes(nb) + "\n"
    return files


def _stray_folders(files: dict[str, str]) -> list[Path]:
    """Folders under samples/ that no generated file lives in (a fault removed from a table)."""
    wanted = {name.split("/")[0] for name in files if "/" in name}
    return sorted(p for p in SAMPLES.iterdir() if p.is_dir() and p.name not in wanted)


def stale() -> list[str]:
    """Generated files whose committed copy under samples/ differs or is missing, and sample
    folders no table asks for."""
    files = generated()
    problems = [name for name, text in files.items()
                if not (SAMPLES / name).is_file() or (SAMPLES / name).read_text() != text]
    problems += [f"{p.name}/ (no longer generated)" for p in _stray_folders(files)]
    return sorted(problems)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        problems = stale()
        if problems:
            print("autograder/samples/ is stale (run `make samples`):\n  " + "\n  ".join(problems))
            return 1
        print("autograder/samples/ matches the labs' tables")
        return 0
    files = generated()
    for folder in _stray_folders(files):
        shutil.rmtree(folder)
        print(f"removed {folder.relative_to(ROOT)}")
    for name, text in files.items():
        path = SAMPLES / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
