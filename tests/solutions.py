"""The one adapter between the tests and the learner-facing solutions.

Tests never keep their own copy of a lab's solution: they read the solution cells of the
nbgrader source notebook ``solutions/NN_name/NN_name.ipynb`` (cells whose nbgrader metadata
says ``solution``), drop the ``### BEGIN/END SOLUTION`` lines, and run them, after the imports
of the notebook's other code cells, in a fresh namespace. A fault's edits (the lab's FAULTS
table) are applied to those sources first, exactly as the sample builder applies them.
"""
from __future__ import annotations

import ast
import contextlib
import linecache
import os
import zlib

# one reader of the source notebooks, shared with the sample builder
from course_grader.samples import solution_sources, test_points  # noqa: F401
from course_grader.samples import source_notebook as notebook
from course_lib.exercises import parse_python


def _imports(lab: str) -> str:
    """The top-level import statements of the notebook's code cells that are not solution cells."""
    lines = []
    for cell in notebook(lab).cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or meta.get("solution"):
            continue
        try:
            tree = parse_python(cell.source)
        except SyntaxError:  # IPython magics: a set-up cell with them has no imports we need
            continue
        lines += [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return "\n".join(dict.fromkeys(lines))


def solution_namespace(lab: str, edits=()) -> dict:
    """A namespace holding the lab's solution functions, after the given ``tables.Edit``s.

    As in a notebook: each cell's source is in ``linecache`` under its own file name (``@triton.jit``
    reads a kernel's source), and, without a GPU, TRITON_INTERPRET=1 is set while the cells run, so
    a kernel exercise's kernel is built for Triton's interpreter (the lab's set-up cell does the same)
    without switching this process's other kernels to it."""
    sources = solution_sources(lab)
    for edit in edits:
        sources[edit.cell] = edit.apply(sources[edit.cell])
    namespace: dict = {"__name__": f"solution_{lab}"}
    exec(compile(_imports(lab), f"<{lab} imports>", "exec"), namespace)
    with _interpreter_for_new_kernels():
        for grade_id, source in sources.items():
            filename = f"<{lab} solution cell {grade_id} {zlib.crc32(source.encode()):08x}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            exec(compile(source, filename, "exec"), namespace)
    return namespace


@contextlib.contextmanager
def _interpreter_for_new_kernels():
    """TRITON_INTERPRET=1 inside the block where there is no CUDA device (``@triton.jit`` reads it
    when it decorates), the environment as it was afterwards."""
    import torch

    saved = os.environ.get("TRITON_INTERPRET")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def solution_functions(lab: str, edits=()):
    """The lab's solution functions as attributes (``ref.count_parameters``), after ``edits``."""
    from types import SimpleNamespace

    return SimpleNamespace(**{k: v for k, v in solution_namespace(lab, edits).items() if not k.startswith("__")})
