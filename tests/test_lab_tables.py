"""Each lab's declared tables (course_lib.grading.labNN.CONTRACTS and FAULTS) against its solution
notebook: the solution passes every contract; each fault, injected by its edits into the solution
cells, fails exactly the tests it lists, each with its symptom named; the notebook's graded cells
call the declared checkers on the declared functions. A fault added to a table is tested here
with no other change."""
import re

import pytest

import solutions
from course_grader import judge
from course_grader.samples import labs, tables  # every lab with a source notebook, and its labNN module
from course_lib.grading import ContractError
from course_lib.grading.tables import Contract, check_tables, resolve_reference

LABS = labs()
SEEDS = (0, 1, 2)


def _run(contract, namespace, seed):
    contract.checker(*(namespace[name] for name in contract.functions), seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lab", LABS)
def test_the_solution_meets_every_contract(lab, seed):
    module = tables(lab)
    namespace = solutions.solution_namespace(lab)
    for contract in module.CONTRACTS:
        _run(contract, namespace, seed)


FAULT_CASES = [(lab, fault.name) for lab in LABS for fault in tables(lab).FAULTS]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lab, fault", FAULT_CASES)
def test_each_fault_fails_exactly_its_tests_with_the_symptom(lab, fault, seed):
    module = tables(lab)
    declared = next(f for f in module.FAULTS if f.name == fault)
    namespace = solutions.solution_namespace(lab, declared.edits)
    for contract in module.CONTRACTS:
        if contract.test not in declared.fails:
            _run(contract, namespace, seed)   # a fault fails only the tests it lists
            continue
        try:
            _run(contract, namespace, seed)
        except ContractError as exc:
            assert re.search(declared.fails[contract.test], str(exc)), (
                f"{contract.test} caught fault {fault} on seed {seed} but did not name its symptom "
                f"{declared.fails[contract.test]!r}; the message was:\n{exc}")
        else:
            pytest.fail(f"{contract.checker.__name__} passes with fault {fault} on seed {seed}: the checker of "
                        f"{contract.test} does not catch it (make it fail, or remove the test from the fault's fails)")


@pytest.mark.parametrize("lab, fault", FAULT_CASES)
def test_each_fault_fails_the_visible_checks_alone(lab, fault):
    """What the learner runs before handing in: every fault of the table fails the visible part of
    each test it lists (the checker calls of the graded cell outside its hidden-tests block, with
    the cell's own arguments), not only the hidden tests."""
    module = tables(lab)
    declared = next(f for f in module.FAULTS if f.name == fault)
    namespace = solutions.solution_namespace(lab, declared.edits)
    contracts = {c.test: c for c in module.CONTRACTS}
    cells = {c.metadata["nbgrader"]["grade_id"]: c for c in solutions.notebook(lab).cells
             if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
    for test in declared.fails:
        contract = contracts[test]
        visible = [call for call in judge.parse_test_cell(cells[test].source)[0] if not call.hidden]
        assert visible, f"{test} has no visible checker call"
        with pytest.raises(ContractError):
            for call in visible:
                kwargs = {k: contract.build_object(v.name) if isinstance(v, judge.KernelName) else v
                          for k, v in call.kwargs.items()}
                contract.checker(*(namespace[name] for name in call.functions), **kwargs)


@pytest.mark.parametrize("lab", LABS)
def test_the_notebook_calls_the_declared_checkers(lab):
    """Every graded cell that calls a checker has a contract, and calls only that contract's checker
    on that contract's functions; every contract has its graded cell."""
    module = tables(lab)
    contracts = {c.test: c for c in module.CONTRACTS}
    points = solutions.test_points(lab)
    assert set(contracts) <= set(points), f"contracts without a graded cell: {set(contracts) - set(points)}"
    for cell in solutions.notebook(lab).cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade") or meta.get("solution"):
            continue
        calls, _ = judge.parse_test_cell(cell.source)
        if not calls:
            assert meta["grade_id"] not in contracts
            continue
        contract = contracts[meta["grade_id"]]
        for call in calls:
            assert (call.module, call.checker) == (module.__name__.rpartition(".")[2], contract.checker.__name__), \
                meta["grade_id"]
            assert tuple(call.functions) == contract.functions, meta["grade_id"]
            for value in call.kwargs.values():
                if isinstance(value, judge.KernelName):
                    assert value.name in contract.objects, (meta["grade_id"], value.name)


@pytest.mark.parametrize("lab", LABS)
def test_fault_edits_apply_to_the_solution(lab):
    module = tables(lab)
    for fault in module.FAULTS:
        solutions.solution_namespace(lab, fault.edits)   # each edit matches exactly once and runs


@pytest.mark.parametrize("lab", LABS)
def test_every_declared_reference_is_a_library_function(lab):
    """Each contract's ``references`` resolve (check_tables refuses the lab otherwise) to course_lib
    functions, methods or properties outside the grading package, or to a checker's fault model
    (``variant_*``: with no fault switched on it computes the reference's answer); every lab names the
    reference of at least one exercise."""
    module = tables(lab)
    check_tables(module.CONTRACTS, module.FAULTS)
    declared = [ref for contract in module.CONTRACTS for ref in contract.references]
    assert declared, f"{lab} declares no reference for any exercise"
    for ref in declared:
        obj = resolve_reference(ref)
        assert callable(obj) or isinstance(obj, property), ref
        assert ref.startswith("course_lib.") and (not ref.startswith("course_lib.grading")
                                                  or re.fullmatch(r"course_lib\.grading\.lab\d\d\.variant_\w+", ref)), ref


def test_check_tables_refuses_a_reference_that_does_not_resolve():
    from course_lib.grading.lab01 import check_prefill_time

    good = Contract("test_prefill_time", check_prefill_time, ("prefill_time",),
                    references=("course_lib.roofline.prefill_time",))
    check_tables((good,), ())
    for bad, why in (("course_lib.roofline.no_such_function", "does not resolve"),
                     ("course_lib.no_such_module.f", "does not resolve"),
                     ("course_lib.roofline.DEFAULT_BATCHES", "not a function")):
        with pytest.raises(ValueError, match=why):
            check_tables((Contract("test_prefill_time", check_prefill_time, ("prefill_time",), references=(bad,)),), ())
    for malformed in ("course_lib", "os.path.join", "course_lib.__main__.main"):
        with pytest.raises((TypeError, LookupError)):
            Contract("test_prefill_time", check_prefill_time, ("prefill_time",), references=(malformed,))
            resolve_reference(malformed)
    with pytest.raises(TypeError):
        Contract("test_prefill_time", check_prefill_time, ("prefill_time",), references="course_lib.roofline.prefill_time")
