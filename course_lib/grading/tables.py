"""The two tables each lab's grading is declared in: its graded contracts and its injected faults.

Every ``course_lib.grading.labNN`` module ends with

    CONTRACTS = (Contract(test="test_prefill_time", checker=check_prefill_time,
                          functions=("prefill_time",)), ...)
    FAULTS = (Fault(name="kv_factor_two_missing",
                    edits=(Edit("kv_bytes_per_token", "return 2 * config.n_layers", "return config.n_layers"),),
                    fails={"test_kv_bytes_per_token": "factor 2", ...}), ...)

and everything else is derived from them:

* the judge (``course_grader.judge``) looks a graded cell's checker up in ``CONTRACTS`` to learn
  which arguments the learner's functions may change in place, which notebook objects it
  must rebuild on its side and which of their submodules' calls it must mirror (``Probe``);
* the sample builder (``course_grader.samples``) writes one ``fault_<name>`` submission per
  fault by applying its edits to the solution cells, and the expected-scores file from the
  notebook's points and each fault's ``fails``;
* the checker tests (``tests/test_lab_tables.py``) run every contract on the solution cells of
  ``solutions/NN_name/NN_name.ipynb`` (it must pass) and on each fault (exactly the tests in
  ``fails`` must fail, each with a message matching its symptom);
* the grader's reference-reuse flag (``course_grader.provenance``) looks, for each test, for the
  library functions its contract names in ``references``.

Adding a fault to a lab is one ``Fault`` entry; ``make samples`` then writes its submission and
its expected scores, and the tests check that the checkers catch it.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping

__all__ = ["Contract", "Edit", "Fault", "Probe", "Writes", "check_tables", "resolve_reference"]

_DOTTED = re.compile(r"course_lib(\.[A-Za-z_][A-Za-z0-9_]*)*")


def resolve_reference(path: str):
    """The object the dotted name PATH (``course_lib.roofline.kv_bytes_per_token``,
    ``course_lib.models.config.ModelConfig.parameters``) names: the longest prefix that is a
    module is imported, the rest looked up as attributes. Only names inside ``course_lib`` are
    resolved, and none with a ``__`` part (so no ``__main__`` is ever imported).

    Raises: LookupError naming PATH when it is not such a name or names nothing."""
    if type(path) is not str or not _DOTTED.fullmatch(path) or "__" in path:
        raise LookupError(f"{path!r} is not a dotted name inside course_lib")
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        module = sys.modules.get(name)
        if module is None:
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError, AttributeError):
                found = False
            if not found:
                continue
            try:
                module = importlib.import_module(name)
            except Exception as exc:
                raise LookupError(f"{path}: importing {name} failed: {type(exc).__name__}: {exc}") from None
        obj = module
        for attr in parts[i:]:
            try:
                obj = getattr(obj, attr)
            except Exception:
                raise LookupError(f"{path}: {name} has no attribute path {'.'.join(parts[i:])!r}") from None
        return obj
    raise LookupError(f"{path}: no module of that name")


@dataclass(frozen=True)
class Writes:
    """What a checker lets the learner's functions change in place: positional argument indices,
    keyword names and course_lib classes (with everything reachable from them: a pool's tensors
    and lists). The judge applies no other in-place change the kernel reports, so a learner's
    function cannot rewrite a checker's inputs or its reference data."""

    args: tuple[int, ...] = ()
    kwargs: tuple[str, ...] = ()
    types: tuple[type, ...] = ()

    def __post_init__(self) -> None:
        if any(type(i) is not int or i < 0 for i in self.args):
            raise ValueError(f"Writes.args must be non-negative ints, got {self.args!r}")
        if any(type(k) is not str for k in self.kwargs):
            raise TypeError(f"Writes.kwargs must be str, got {self.kwargs!r}")
        if any(not isinstance(t, type) for t in self.types):
            raise TypeError(f"Writes.types must be classes, got {self.types!r}")

    def __bool__(self) -> bool:
        return bool(self.args or self.kwargs or self.types)


@dataclass(frozen=True)
class Probe:
    """A submodule whose forward calls a checker observes (a forward hook that counts token ids)
    on a model it passes to the learner's function. The grading judge passes that function a copy
    of the model rebuilt in the learner's kernel, so it mirrors the calls: for every argument that
    is an ``owner``, it records the shape and dtype of the first input of each forward call of the
    submodule at the dotted attribute path ``submodule`` on the kernel's copy, and replays each call on
    its own model's submodule with zeros of that shape and dtype. A checker's hook on the submodule
    may therefore read the input's shape and dtype, never its values; the submodule's forward must
    not change state (an embedding lookup, not a cache write)."""

    owner: type
    submodule: str

    def __post_init__(self) -> None:
        if not isinstance(self.owner, type):
            raise TypeError(f"Probe.owner must be a class, got {self.owner!r}")
        if type(self.submodule) is not str or not all(p.isidentifier() and not p.startswith("_")
                                                    for p in self.submodule.split(".")):
            raise ValueError(f"Probe.submodule must be a dotted path of public attributes, got {self.submodule!r}")


@dataclass(frozen=True)
class Contract:
    """One graded test cell of a lab notebook.

    Attributes:
        test: the cell's nbgrader ``grade_id`` (``test_...``).
        checker: the ``check_*`` function the cell calls; it takes the learner's functions first.
        functions: the learner functions the cell passes to it, in order (notebook names).
        writes: what those functions may change in place (``Writes``; default nothing).
        objects: keyword values of the cell's checker calls that name notebook objects
            (``model=toy``), mapped to how the judge builds its own copy:
            ``(module, factory, kwargs)`` (the kernel's object is never used: learner code
            could have changed it).
        references: dotted names of the course_lib functions (or methods) that compute what
            the exercise asks for: its reference implementations
            (``"course_lib.roofline.kv_bytes_per_token"``). The grader flags the test when the
            learner's functions reach one of them (``course_grader.provenance``); library
            helpers the exercise may use (model configs, loaders, validation) are not listed. A
            checker's fault model (``variant_*`` of the lab's grading module) is listed too: with no
            fault switched on, it computes the answer.
        probes: submodules of the objects the checker passes whose forward calls it observes
            (``Probe``), which the judge mirrors from the learner's kernel.
        launcher: for a kernel exercise, the key of ``course_lib.kernels.exercise.LAUNCHERS``
            whose launcher runs the learner's ``@triton.jit`` function (its one function); the
            judge's calls of it launch the kernel through that launcher in a process of the judge's own
            ("" for an exercise that is a plain function).
    """

    test: str
    checker: Callable
    functions: tuple[str, ...]
    writes: Writes = field(default_factory=Writes)
    objects: Mapping[str, tuple[str, str, dict]] = field(default_factory=dict)
    references: tuple[str, ...] = ()
    probes: tuple[Probe, ...] = ()
    launcher: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.test, str) and self.test.startswith("test_")):
            raise ValueError(f"Contract.test must be a grade_id starting with 'test_', got {self.test!r}")
        if not callable(self.checker) or not self.checker.__name__.startswith("check_"):
            raise TypeError(f"Contract.checker must be a check_* function, got {self.checker!r}")
        if not self.functions or any(not (isinstance(f, str) and f.isidentifier()) for f in self.functions):
            raise ValueError(f"Contract.functions must be a non-empty tuple of names, got {self.functions!r}")
        if not isinstance(self.writes, Writes):
            raise TypeError(f"Contract.writes must be a Writes, got {self.writes!r}")
        if type(self.references) is not tuple or any(
                type(r) is not str or not _DOTTED.fullmatch(r) or "." not in r for r in self.references):
            raise TypeError(f"Contract.references must be a tuple of dotted course_lib names, got {self.references!r}")
        if type(self.probes) is not tuple or any(not isinstance(p, Probe) for p in self.probes):
            raise TypeError(f"Contract.probes must be a tuple of Probe, got {self.probes!r}")
        if type(self.launcher) is not str:
            raise TypeError(f"Contract.launcher must be a str, got {self.launcher!r}")
        if self.launcher:
            from ..kernels.exercise import LAUNCHERS

            if self.launcher not in LAUNCHERS or len(self.functions) != 1:
                raise ValueError(f"Contract {self.test}: launcher {self.launcher!r} must be one of "
                                 f"{sorted(LAUNCHERS)}, for a contract of one function (the kernel)")

    def build_object(self, name: str):
        """A new copy of the notebook object NAME, built as ``objects`` says (``module.factory(**kwargs)``).

        Raises: KeyError when ``objects`` does not name it."""
        module, factory, kwargs = self.objects[name]
        return getattr(importlib.import_module(module), factory)(**kwargs)


@dataclass(frozen=True)
class Edit:
    """Replace ``find`` (which must occur exactly once) by ``replace`` in the solution cell whose
    nbgrader ``grade_id`` is ``cell`` (its source without the ``### BEGIN/END SOLUTION`` lines)."""

    cell: str
    find: str
    replace: str

    def __post_init__(self) -> None:
        if not self.find:
            raise ValueError(f"Edit.find must not be empty (cell {self.cell!r})")
        if self.find == self.replace:
            raise ValueError(f"Edit in cell {self.cell!r} changes nothing")

    def apply(self, source: str) -> str:
        """SOURCE with the edit made. Raises ValueError unless ``find`` occurs exactly once (so a
        change to the solution cannot silently disable a fault)."""
        count = source.count(self.find)
        if count != 1:
            raise ValueError(f"fault edit in cell {self.cell!r}: expected exactly one {self.find!r}, found "
                             f"{count}; update the lab's FAULTS to the new solution")
        return source.replace(self.find, self.replace)


@dataclass(frozen=True)
class Fault:
    """A realistic learner mistake, injected into the solution by ``edits``.

    Attributes:
        name: short snake_case id; its sample submission is ``fault_<name>``.
        edits: the solution-cell edits that inject it.
        fails: the graded tests (grade_ids) it must fail, each mapped to a regular expression its
            failure message must match (the symptom the checker names); every other test of the
            lab must pass.
        description: one line for people: what the learner did wrong.
    """

    name: str
    edits: tuple[Edit, ...]
    fails: Mapping[str, str]
    description: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name or ""):
            raise ValueError(f"Fault.name must be snake_case, got {self.name!r}")
        if not self.edits or any(not isinstance(e, Edit) for e in self.edits):
            raise TypeError(f"Fault {self.name}: edits must be a non-empty tuple of Edit")
        if not self.fails:
            raise ValueError(f"Fault {self.name}: a fault that fails no test is not a fault")
        for pattern in self.fails.values():
            re.compile(pattern)

    @property
    def learner(self) -> str:
        """The sample submission's learner id."""
        return f"fault_{self.name}"


def check_tables(contracts: tuple[Contract, ...], faults: tuple[Fault, ...]) -> None:
    """Raise ValueError when a lab's tables disagree with each other or with the library: repeated
    test ids, checkers or fault names, a fault failing a test that has no contract, or a contract
    reference that does not resolve to a function, method or property of course_lib."""
    tests = [c.test for c in contracts]
    for what, names in (("test", tests), ("checker", [c.checker.__name__ for c in contracts]),
                        ("fault", [f.name for f in faults])):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"repeated {what} in a lab's tables: {repeated}")
    for fault in faults:
        unknown = sorted(set(fault.fails) - set(tests))
        if unknown:
            raise ValueError(f"fault {fault.name} fails tests with no contract: {unknown}")
    for contract in contracts:
        for ref in contract.references:
            try:
                obj = resolve_reference(ref)
            except LookupError as exc:
                raise ValueError(f"contract {contract.test}: reference {ref} does not resolve: {exc}") from None
            if not (callable(obj) or isinstance(obj, property)) or isinstance(obj, type):
                raise ValueError(f"contract {contract.test}: reference {ref} is a {type(obj).__qualname__}, "
                                 "not a function, method or property")
