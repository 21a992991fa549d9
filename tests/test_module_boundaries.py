"""One home per concept, and modules talk through public names: no module of course_lib, of the
grader package or of the tests imports another module's ``_private`` name or reaches into one
(``module._name``). A name another module needs is public, documented where it lives."""
import ast
import fnmatch
import re
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


# -- layers: every import of course_lib points down the order docs/architecture.md#layers writes --
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROOT_PACKAGE = "course_lib"      # its __init__ holds the version only: below every layer


def documented_layers(markdown: str) -> list[list[str]]:
    """The ordered list of the "## Layers" section of MARKDOWN, lowest layer first: per item, the
    course_lib names (modules, packages, fnmatch patterns) it writes in backticks."""
    section = markdown.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    layers: list[list[str]] = []
    for line in section.splitlines():
        if re.match(r"\d+\.\s", line):
            layers.append([])
        elif not line.strip():
            continue
        elif not (line.startswith(" ") and layers):   # prose before the list; nothing may follow it
            assert not layers, f"docs/architecture.md#layers: text after the list: {line!r}"
            continue
        layers[-1].extend(re.findall(r"`(course_lib(?:\.[\w*]+)*)`", line))
    return layers


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    """Index of the layer whose entry names MODULE most closely: an entry equal to it, then a pattern
    matching it, then the longest entry naming a package that holds it; -1 for the bare package."""
    if module == ROOT_PACKAGE:
        return -1
    best = None
    for index, names in enumerate(layers):
        for name in names:
            if module == name:
                rank = (2, len(name))
            elif "*" in name and fnmatch.fnmatchcase(module, name):
                rank = (1, len(name))
            elif module.startswith(name + "."):
                rank = (0, len(name))
            else:
                continue
            if best is None or rank > best[0]:
                best = (rank, index)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    """``course_lib/models/config.py`` -> ``course_lib.models.config``; a package's __init__ is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every course_lib module SOURCE imports, at any depth (function bodies
    included): ``from X import a`` imports X, and X.a when that is a module of KNOWN; importing a
    module runs its packages' __init__ too, so each enclosing package (but the bare course_lib) counts."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(parse_python(source, module)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] != ROOT_PACKAGE:
                continue
            found.extend((node.lineno, ".".join(parts[:n])) for n in range(2, len(parts) + 1))
            if len(parts) == 1:
                found.append((node.lineno, target))
    return sorted(set(found))


def layer_violations(sources: dict[str, tuple[str, bool]], layers: list[list[str]]) -> list[str]:
    """One line per import of SOURCES (module -> (source, is_package)) that does not point to a lower
    layer or stay within its own package on the same layer, naming both modules and both layers."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    def describe(index: int | None) -> str:
        if index is None:
            return "no layer"
        return "below every layer" if index < 0 else f"layer {index + 1} ({', '.join(layers[index])})"

    found = []
    for module, (source, is_package) in sorted(sources.items()):
        mine = layer_of(module, layers)
        for line, target in imports_of(source, module, is_package, set(sources)):
            theirs = layer_of(target, layers)
            if unit(target) == unit(module) and mine == theirs and mine is not None:
                continue                                    # within its own package, on its own line
            if mine is not None and theirs is not None and theirs < mine:
                continue                                    # down
            way = "up" if None not in (mine, theirs) and theirs > mine else "sideways"
            found.append(f"{module}:{line} in {describe(mine)} imports {target} in {describe(theirs)} ({way})")
    return found


def course_lib_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(path): (path.read_text(), path.name == "__init__.py")
            for path in sorted((ROOT / "course_lib").rglob("*.py"))}


def test_the_layers_section_names_existing_modules_once():
    layers = documented_layers(ARCHITECTURE.read_text())
    names = [name for names in layers for name in names]
    assert len(layers) >= 5 and all(layers), layers
    assert len(names) == len(set(names)), f"a name on two lines of docs/architecture.md#layers: {names}"
    modules = course_lib_sources()
    for name in names:
        assert any(m == name or m.startswith(name + ".") or fnmatch.fnmatchcase(m, name) for m in modules), \
            f"docs/architecture.md#layers names {name}, which is no module or package of course_lib"


def test_every_module_of_course_lib_has_a_layer():
    layers = documented_layers(ARCHITECTURE.read_text())
    missing = [m for m in course_lib_sources() if layer_of(m, layers) is None]
    assert not missing, f"modules in no line of docs/architecture.md#layers: {missing}"


def test_every_import_of_course_lib_points_down_the_documented_layers():
    layers = documented_layers(ARCHITECTURE.read_text())
    found = layer_violations(course_lib_sources(), layers)
    assert not found, "imports against docs/architecture.md#layers:\n" + "\n".join(found)


def test_the_layer_check_finds_sideways_upward_and_unlisted_imports():
    """The check itself, on made-up modules: a function-level sideways import, an upward one through a
    package's __init__ (importing low.pkg.mod runs low.pkg), one of an unlisted module, and allowed ones."""
    doc = ("# Page\n\n## Layers\n\nProse with `course_lib.ignored`.\n\n1. `course_lib.base`: plain\n"
           "2. `course_lib.a`, `course_lib.b`,\n   `course_lib.*.cli`\n\n## Next\n\n1. `course_lib.not_a_layer`\n")
    layers = documented_layers(doc)
    assert layers == [["course_lib.base"], ["course_lib.a", "course_lib.b", "course_lib.*.cli"]]
    sources = {
        "course_lib": ("", True),
        "course_lib.base": ("import course_lib\n", False),
        "course_lib.a": ("from . import base\n", True),
        "course_lib.a.one": ("from .two import x\nfrom course_lib.a.cli import main\n", False),
        "course_lib.a.two": ("def f():\n    from ..b import y\n", False),
        "course_lib.a.cli": ("from course_lib.b.cli import main\n", False),
        "course_lib.b": ("", True),
        "course_lib.b.cli": ("", False),
        "course_lib.base.deep": ("from course_lib.a.two import f\nfrom ..stray import z\n", False),
    }
    assert layer_of("course_lib.a.cli", layers) == 1 and layer_of("course_lib.base.deep", layers) == 0
    assert layer_violations(sources, layers) == [
        "course_lib.a.cli:1 in layer 2 (course_lib.a, course_lib.b, course_lib.*.cli) imports course_lib.b "
        "in layer 2 (course_lib.a, course_lib.b, course_lib.*.cli) (sideways)",
        "course_lib.a.cli:1 in layer 2 (course_lib.a, course_lib.b, course_lib.*.cli) imports course_lib.b.cli "
        "in layer 2 (course_lib.a, course_lib.b, course_lib.*.cli) (sideways)",
        "course_lib.a.two:2 in layer 2 (course_lib.a, course_lib.b, course_lib.*.cli) imports course_lib.b "
        "in layer 2 (course_lib.a, course_lib.b, course_lib.*.cli) (sideways)",
        "course_lib.base.deep:1 in layer 1 (course_lib.base) imports course_lib.a in layer 2 (course_lib.a, "
        "course_lib.b, course_lib.*.cli) (up)",
        "course_lib.base.deep:1 in layer 1 (course_lib.base) imports course_lib.a.two in layer 2 (course_lib.a, "
        "course_lib.b, course_lib.*.cli) (up)",
        "course_lib.base.deep:2 in layer 1 (course_lib.base) imports course_lib.stray in no layer (sideways)",
    ]
