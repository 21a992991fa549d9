"""One home per concept, and modules talk through public names: no module of course_lib, of the
grader package or of the tests imports another module's ``_private`` name or reaches into one
(``module._name``). A name another module needs is public, documented where it lives."""
import ast
from pathlib import Path

import pytest

from course_lib.exercises import parse_python

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [ROOT / "course_lib", ROOT / "autograder" / "course_grader", ROOT / "tests"]
OURS = ("course_lib", "course_grader", "solutions")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str | None, level: int) -> bool:
    return level > 0 or (module or "").split(".")[0] in OURS


def crossings(source: str, label: str) -> list[str]:
    """``label:line name`` for each private name of another of our modules that ``source`` uses."""
    tree = parse_python(source, label)
    modules: set[str] = set()     # local names bound to our modules (import x.y as m, from x import y)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name, 0):
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and _ours(node.module, node.level):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{label}:{node.lineno} from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args
              and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, str)
              and _ours(node.value.args[0].value, 0)):   # m = importlib.import_module("course_lib.x"), lazy imports
            modules.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{label}:{node.lineno} {base.id}...{node.attr}")
    return found


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_no_module_uses_another_modules_private_names(folder):
    found = [hit for path in sorted(folder.rglob("*.py"))
             for hit in crossings(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)


def test_the_check_finds_a_private_import_and_a_private_attribute():
    source = ("from course_lib.grading.lab01 import _hidden\nfrom course_grader import judge\n"
              "judge.KernelSession._secret()\nself._fine = 1\n"
              "remote = importlib.import_module('course_grader.remote')\nremote._table\n")
    assert sorted(crossings(source, "sample")) == ["sample:1 from course_lib.grading.lab01 import _hidden",
                                                   "sample:3 judge..._secret", "sample:6 remote..._table"]
