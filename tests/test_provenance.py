"""The reference-reuse flag (course_grader.provenance): a graded function that runs course_lib's
own reference for its exercise during the judge's calls is flagged, named, and (by the
instructor's setting) scored 0.

Fast part: the course's solutions run every contract under the call-time observer and reach
no reference; the hostile ``reference_wrappers`` submission's functions, run the same way, reach
exactly the references autograder/course_grader/hostile.py's EXPECTED_REUSE declares; one snippet
per route to a reference, and renamed copies, seen at call time; the gaps the module's docstring
names, each asserted as it behaves; the code scan (where a reference is named, code that can
hide calls from the observer); the judge's verdict entry, the zero rule on the judged Execute
step, and the driver's notes.
Slow part: the real driver (sandbox, judge, nbgrader) on the hostile submission with
``--reference-reuse zero``.
"""
from __future__ import annotations

import ast
import functools
import inspect
import json
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import nbformat
import pytest

import course_lib.roofline as roofline
import solutions
from course_grader import hostile, judge, provenance, remote
from course_grader.samples import labs, solution_sources, source_notebook, tables
from course_lib.grading.tables import Edit
from course_lib.models import toy_config

REPO = Path(__file__).resolve().parents[1]
WRAPPERS = REPO / "autograder" / "hostile" / "reference_wrappers"
KV = "course_lib.roofline.kv_bytes_per_token"
KV_METHOD = "course_lib.models.config.ModelConfig.kv_bytes_per_token"   # what roofline's function calls

HEADER = ("import importlib\nimport sys\nimport math\nfrom course_lib import roofline\n"
          "from course_lib.models import ModelConfig\n")
SIG = "def kv_bytes_per_token(c, b=2):\n"
DEF = SIG + "    return "
OWN = "2 * c.n_layers * c.n_kv_heads * c.head_dim * b"


def kernel_call(fn, *args, watch=None):
    """remote.answer_call as the kernel runs it, with the judge's watch spec (default: KV)."""
    enc = remote.CallEncoder()
    request = json.loads(remote.dumps({"op": "call", "fn": "f", "args": [enc.encode(a) for a in args], "kwargs": [],
                                       "objects": enc.table, "grad": False,
                                       "watch": provenance.watch_spec([KV]) if watch is None else watch}))
    return json.loads(remote.dumps(remote.answer_call({"f": fn}, request, None)))


def learner(source: str, name: str = "kv_bytes_per_token"):
    """NAME as a notebook cell running SOURCE defines it."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace[name]


def scan(*cells) -> list[str]:
    return provenance.analyse([(str(i), src) for i, src in enumerate(cells)]).dynamic


# == the course's own solutions and the hostile wrappers, run under the observer ===================
def _reached_per_test(lab: str, namespace: dict) -> dict[str, set[str]]:
    """Every contract of LAB run on NAMESPACE's functions, each call of them watched as the judge
    watches it: test -> the references whose code ran (tests that reached none left out)."""
    found: dict[str, set[str]] = {}
    for contract in tables(lab).CONTRACTS:
        if not contract.references:
            continue
        spec = provenance.watch_spec(contract.references)
        reports = []

        def watched(fn):
            if contract.launcher:       # a kernel: watch its launches, as the judge's stand-in launches it
                from course_lib.kernels.exercise import LAUNCHERS
                fn = functools.partial(LAUNCHERS[contract.launcher], fn)

            def call(*args, **kwargs):
                with provenance.Observer(spec) as observer:
                    result = fn(*args, **kwargs)
                reports.append(observer.report())
                return result
            if contract.launcher:
                call.launches = contract.launcher
            return call

        contract.checker(*(watched(namespace[name]) for name in contract.functions), seed=0)
        assert reports and all(r["observed"] for r in reports), contract.test
        reached = {ref for r in reports for ref in r["reached"]}
        if reached:
            found[contract.test] = reached
    return found


@pytest.mark.parametrize("lab", labs())
def test_the_course_solutions_run_no_reference_and_show_nothing_to_look_at(lab):
    assert _reached_per_test(lab, solutions.solution_namespace(lab)) == {}
    nb = source_notebook(lab)
    cells = provenance.notebook_cells(nb.cells)
    assert any("import course_lib" in src or "from course_lib" in src for _, src in cells)  # helpers are used
    assert provenance.analyse(cells).dynamic == []


def _wrapper_edits(lab: str) -> list[Edit]:
    """The hostile wrapper submission's solution cells, as edits of the source notebook's."""
    nb = nbformat.read(WRAPPERS / lab / f"{lab}.ipynb", as_version=4)
    theirs = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
              if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    return [Edit(cell, ours, theirs[cell]) for cell, ours in solution_sources(lab).items() if theirs[cell] != ours]


@pytest.mark.parametrize("lab", [hostile.L1, hostile.L2])
def test_the_wrapped_submission_runs_the_expected_reference_on_exactly_the_wrapped_tests(lab):
    expected = hostile.EXPECTED_REUSE[("reference_wrappers", lab)]
    reached = _reached_per_test(lab, solutions.solution_namespace(lab, _wrapper_edits(lab)))
    assert set(reached) == set(expected)
    for test, reference in expected.items():
        assert reference in reached[test], test


def test_the_hostile_check_reads_the_flags_it_expects():
    rows = [{"learner": "reference_wrappers", "lab": hostile.L1, "flags": "; ".join(
        f"reuses reference {ref} in {test} (ran during the judge's calls)"
        for test, ref in hostile.EXPECTED_REUSE[("reference_wrappers", hostile.L1)].items())}]
    wanted = {("reference_wrappers", hostile.L1): hostile.EXPECTED_REUSE[("reference_wrappers", hostile.L1)]}
    assert hostile.reuse_problems(rows, wanted) == []
    rows[0]["flags"] = rows[0]["flags"].replace("in test_prefill_time", "in test_decode_step_bound")
    problems = hostile.reuse_problems(rows, wanted)
    assert any("test_prefill_time not flagged" in p for p in problems)
    assert any("test_decode_step_bound flagged" in p for p in problems)


# == one snippet per route to the reference: all seen at call time ===================================
ROUTES = {
    "module alias": "import course_lib.roofline as _r\n" + DEF + "int(_r.kv_bytes_per_token(c, b)) + 0",
    "from-import alias": "from course_lib.roofline import kv_bytes_per_token as k\n" + DEF + "k(c, b)",
    "name bound to the reference": "from course_lib import roofline as r\nkv_bytes_per_token = r.kv_bytes_per_token",
    "import_module": HEADER + "_m = importlib.import_module('course_lib.roofline')\n" + DEF + "_m.kv_bytes_per_token(c, b)",
    "import_module, computed name": HEADER + DEF + "importlib.import_module('course_lib.' + 'roof' + 'line')"
                                                   ".kv_bytes_per_token(c, b)",
    "__import__ + getattr": "m = __import__('course_lib.roofline', fromlist=['x'])\n"
                            + DEF + "getattr(m, 'kv_bytes_per_token')(c, b)",
    "getattr, computed name": HEADER + "k = 'kv'\n" + DEF + "getattr(roofline, k + '_bytes_per_token')(c, b)",
    "sys.modules": HEADER + DEF + "sys.modules['course_lib.roofline'].kv_bytes_per_token(c, b)",
    "iterating sys.modules": HEADER + DEF + "next(getattr(m, 'kv_bytes_per_token') for n, m in "
                                            "list(sys.modules.items()) if n == 'course_lib.roofline')(c, b)",
    "vars().get": HEADER + DEF + "vars(roofline).get('kv_bytes_' + 'per_token')(c, b)",
    "__getattribute__": HEADER + DEF + "roofline.__getattribute__('kv_bytes_per_token')(c, b)",
    "operator.attrgetter": "import operator\nimport course_lib.roofline\nimport course_lib\n"
                           + DEF + "operator.attrgetter('roofline.kv_bytes_per_token')(course_lib)(c, b)",
    "globals() write": HEADER + "globals()['kv_bytes_per_token'] = roofline.kv_bytes_per_token",
    "helper function": HEADER + "def _helper(*a):\n    return roofline.kv_bytes_per_token(*a)\n" + DEF + "_helper(c, b)",
    "default argument": HEADER + "def kv_bytes_per_token(c, b=2, f=roofline.kv_bytes_per_token):\n    return f(c, b)",
    "decorator": HEADER + "def use(fn):\n    return roofline.kv_bytes_per_token\n@use\n" + DEF + "0",
    "lambda": HEADER + "kv_bytes_per_token = lambda c, b=2: roofline.kv_bytes_per_token(c, b)",
    "callable class": HEADER + "class K:\n    def __call__(self, c, b=2):\n"
                               "        return roofline.kv_bytes_per_token(c, b)\nkv_bytes_per_token = K()",
    "container": HEADER + "TABLE = {'kv': roofline.kv_bytes_per_token}\n" + DEF + "TABLE['kv'](c, b)",
    "global statement": HEADER + "def setup():\n    global F\n    F = roofline.kv_bytes_per_token\nsetup()\n" + DEF + "F(c, b)",
    "closure": HEADER + "def make():\n    f = roofline.kv_bytes_per_token\n    def inner(c, b=2):\n"
                        "        return f(c, b)\n    return inner\nkv_bytes_per_token = make()",
    "star import": "from course_lib.models.config import *\n" + DEF + "ModelConfig.kv_bytes_per_token(c, b)",
    "the method on its argument": DEF + "c.kv_bytes_per_token(b)",
    "exec": HEADER + "exec('def kv_bytes_per_token(c, b=2):\\n    return roofline.kv_bytes_per_token(c, b)')",
    "eval": HEADER + "kv_bytes_per_token = eval('lambda c, b=2: roofline.kv_bytes_per_token(c, b)')",
    "a copy of its code object": HEADER + "import types\nkv_bytes_per_token = types.FunctionType("
                                          "roofline.kv_bytes_per_token.__code__, vars(roofline), None, (2,))",
}


@pytest.mark.parametrize("how", sorted(ROUTES))
def test_every_route_to_the_reference_is_seen_at_call_time(how):
    answer = kernel_call(learner(ROUTES[how]), toy_config(), watch=provenance.watch_spec([KV, KV_METHOD]))
    assert answer["op"] == "returned" and answer["observed"] is True and answer["reached"], (how, answer)


NOT_REACHING = {
    "own formula beside library helpers": HEADER + SIG + "    assert c != roofline.case_model() or True\n"
                                                             "    return " + OWN,
    "another library function": HEADER + DEF + "roofline.n_matmul(c) * 0 + " + OWN,
    "reference only in demonstration code": HEADER + "print(roofline.kv_bytes_per_token(roofline.case_model()))\n"
                                            + DEF + OWN,
    "a draft that is redefined": HEADER + "kv_bytes_per_token = roofline.kv_bytes_per_token\n" + DEF + OWN,
    "named, never called": HEADER + DEF + f"(roofline.kv_bytes_per_token, {OWN})[1]",
}


@pytest.mark.parametrize("how", sorted(NOT_REACHING))
def test_a_function_that_does_not_run_the_reference_is_not_flagged(how):
    answer = kernel_call(learner(NOT_REACHING[how]), toy_config())
    assert answer["op"] == "returned" and answer["reached"] == [] and answer["observed"] is True, (how, answer)


_RENAMED = types.FunctionType(roofline.kv_bytes_per_token.__code__.replace(co_qualname="mine", co_name="mine"),
                              roofline.kv_bytes_per_token.__globals__, "mine")


def test_a_renamed_copy_and_a_pasted_copy_of_the_reference_are_seen_by_their_code():
    """The fingerprint: a code object renamed, or the reference's source pasted into a cell as it
    is (run where its names resolve), computes the same code; an edited copy does not (a gap the
    module's docstring names)."""
    assert kernel_call(lambda c, b=2: _RENAMED(c, b), toy_config())["reached"] == [KV]
    source = textwrap.dedent(inspect.getsource(roofline.kv_bytes_per_token))
    pasted = dict(vars(roofline))
    exec(compile(source, "<cell>", "exec"), pasted)
    assert pasted["kv_bytes_per_token"] is not roofline.kv_bytes_per_token
    assert kernel_call(pasted["kv_bytes_per_token"], toy_config())["reached"] == [KV]
    edited = dict(vars(roofline))
    exec(compile(source.replace('"""KV-cache bytes', '"""My KV-cache bytes'), "<cell>", "exec"), edited)
    assert kernel_call(edited["kv_bytes_per_token"], toy_config())["reached"] == []
    assert all(len(item["fingerprint"]) == 64 for item in provenance.watch_spec([KV]))


def test_a_thread_started_during_the_call_is_followed():
    fn = learner(HEADER + "import threading\n" + SIG + "    out = []\n"
                 "    t = threading.Thread(target=lambda: out.append(roofline.kv_bytes_per_token(c, b)))\n"
                 "    t.start()\n    t.join()\n    return out[0]")
    assert kernel_call(fn, toy_config())["reached"] == [KV]


# == gaps the docstring names, asserted as they behave ================================================
def test_gap_a_result_computed_before_the_call_is_not_seen():
    fn = learner(HEADER + "from course_lib.models import toy_config\n"
                 "_TABLE = {2: roofline.kv_bytes_per_token(toy_config(), 2)}\n" + DEF + "_TABLE[b]")
    answer = kernel_call(fn, toy_config())
    assert answer["reached"] == [] and answer["observed"] is True


WORKER = HEADER + """import queue
import threading
jobs, results = queue.Queue(), queue.Queue()
def _work():
    for args in iter(jobs.get, None):
        results.put(roofline.kv_bytes_per_token(*args))
worker = threading.Thread(target=_work, daemon=True)
worker.start()
def kv_bytes_per_token(c, b=2):
    jobs.put((c, b))
    return results.get()
"""


def test_gap_a_thread_started_before_the_call_is_not_seen_and_the_scan_lists_it():
    namespace: dict = {"__name__": "__main__"}
    exec(compile(WORKER, "<cell>", "exec"), namespace)
    try:
        answer = kernel_call(namespace["kv_bytes_per_token"], toy_config())
    finally:
        namespace["jobs"].put(None)
        namespace["worker"].join(5)
    assert answer["reached"] == [] and answer["observed"] is True
    assert any("threading.Thread(target=_work" in d and "runs code beside the call" in d for d in scan(WORKER))


PUT_BACK = HEADER + SIG + ("    hook = sys.getprofile()\n    sys.setprofile(None)\n"
                                 "    try:\n        return roofline.kv_bytes_per_token(c, b)\n"
                                 "    finally:\n        sys.setprofile(hook)")


def test_gap_a_hook_switched_off_and_put_back_reads_as_observed_and_the_scan_lists_it():
    answer = kernel_call(learner(PUT_BACK), toy_config())
    assert answer["reached"] == [] and answer["observed"] is True
    assert any("sys.setprofile(None)" in d and "switches the profiler" in d for d in scan(PUT_BACK))


def test_gap_code_that_replaces_the_observer_in_the_kernel_reports_what_it_likes(monkeypatch):
    class Blind:                  # what learner code could put in the kernel's course_grader.provenance
        def __init__(self, spec):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def report(self):
            return {"reached": [], "observed": True}

    monkeypatch.setattr(provenance, "Observer", Blind)
    answer = kernel_call(learner(ROUTES["module alias"]), toy_config())
    assert answer["reached"] == [] and answer["observed"] is True


def test_a_hook_switched_off_and_left_off_is_reported_unobserved():
    answer = kernel_call(learner(HEADER + SIG + "    sys.setprofile(None)\n"
                                 "    return roofline.kv_bytes_per_token(c, b)"), toy_config())
    assert answer["observed"] is False and answer["reached"] == []
    assert sys.getprofile() is None                                    # the previous profiler is back


# == the kernel-side observer ==========================================================================
def test_a_call_without_a_watch_reports_nothing():
    answer = kernel_call(learner(ROUTES["module alias"]), toy_config(), watch=[])
    assert "reached" not in answer and "observed" not in answer and answer["op"] == "returned"


def test_the_profiler_in_place_before_the_call_is_restored():
    def previous(frame, event, arg):
        pass
    sys.setprofile(previous)
    try:
        kernel_call(learner(ROUTES["module alias"]), toy_config())
        assert sys.getprofile() is previous
    finally:
        sys.setprofile(None)


def test_the_observer_keeps_the_interpreter_profiler_when_sys_is_patched(monkeypatch):
    state = [None]

    def fake_set(fn):
        state[0] = fn
        if fn is not None:
            fn(sys._getframe(), "call", None)              # a fake event, so the hook "ran"

    monkeypatch.setattr(sys, "setprofile", fake_set)
    monkeypatch.setattr(sys, "getprofile", lambda: state[0])
    answer = kernel_call(learner(ROUTES["module alias"]), toy_config())
    assert answer["reached"] == [KV] and answer["observed"] is True


def test_a_kernel_whose_profiler_was_replaced_before_the_import_reports_unobserved(monkeypatch):
    fake = types.ModuleType("sys")
    fake.setprofile, fake.getprofile = (lambda f: None), (lambda: None)
    assert provenance.genuine_profiler(fake) is None
    assert provenance.genuine_profiler(sys)[0] is sys.setprofile
    monkeypatch.setattr(provenance, "_PROFILER", None)
    answer = kernel_call(learner(ROUTES["module alias"]), toy_config())
    assert answer["observed"] is False and answer["reached"] == []


def test_a_twin_called_as_a_method_of_an_argument_runs_under_the_judge():
    (contract,) = [c for c in tables("01_roofline").CONTRACTS if c.test == "test_count_parameters"]

    def count_parameters(config):
        return config.n_layers * config.block_parameters()

    answer = kernel_call(count_parameters, toy_config(), watch=provenance.watch_spec(contract.references))
    assert answer["reached"] == ["course_lib.models.config.ModelConfig.block_parameters"]


# == the code scan =====================================================================================
@pytest.mark.parametrize("code, what", [
    ("import sys\nsys.setprofile(None)", "`sys.setprofile(None)` (switches the profiler; cell 0 line 2)"),
    ("import sys as _s\n_s.setprofile = lambda f: None", "switches the profiler"),
    ("import threading\nthreading.settrace(print)", "switches the profiler"),
    ("from sys import setprofile as off\noff(None)", "`off(None)` (switches the profiler"),
    ("import sys\n_s = sys\n_s.getprofile = lambda: None", "`_s.getprofile = lambda: None` (writes into sys"),
    ("import builtins\nbuiltins.getattr = lambda *a: 0", "writes into builtins"),
    ("import sys\nsetattr(sys, 'getprofile', print)", "writes into sys"),
    ("import course_lib.roofline as r\nr.kv_bytes_per_token.__code__ = (lambda c, b=2: 0).__code__", "writes into course_lib"),
    ("import course_grader.provenance as p\np.Observer = None", "reaches the grader's modules"),
    ("import threading\nt = threading.Thread(target=print)", "runs code beside the call"),
    ("import threading\nclass W(threading.Thread):\n    pass", "runs code beside the call"),
    ("from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(2)", "runs code beside the call"),
    ("import multiprocessing as mp\np = mp.Process(target=print)", "runs code beside the call"),
    ("import _thread\n_thread.start_new_thread(print, ())", "runs code beside the call"),
    ("import os\ndef f():\n    os.fork()", "`os.fork()` (runs code beside the call; cell 0 line 3)"),   # never called
])
def test_code_that_can_hide_calls_from_the_observer_is_listed(code, what):
    notes = scan(code)
    assert any(what in n for n in notes), notes


@pytest.mark.parametrize("code", [
    "import re\nr = re.compile('a+')",
    "import torch\nf = torch.compile",
    "import math\nmath.tau2 = 2 * math.tau",
    "import sys\nsys.path.append('.')",
    "import threading\nlock = threading.Lock()",
    "%matplotlib inline\nx = 1",
    "import course_lib.roofline as r\nf = getattr(r, 'kv_bytes_per_token')",
    # lexical: a name built at run time passes the scan (a gap the module's docstring names)
    "getattr(__import__('s' + 'ys'), 'set' + 'profile')(None)",
    "exec('import sys; sys.setprofile(None)')",
])
def test_ordinary_code_and_names_built_at_run_time_are_not_listed(code):
    assert scan(code) == []


def test_hostile_source_does_not_break_the_scan():
    deep = "x = " + "(" * 150 + "1" + ")" * 150
    chain = "x = " + " + ".join(["1"] * 20000)
    analysis = provenance.analyse([("a", "def f(:\n"), ("b", deep), ("c", chain), ("d", "a = b\nb = a\na.x = 1")])
    assert analysis.dynamic == []
    assert [label for label, _, _ in analysis.cells] == ["b", "d"]          # what does not parse is skipped
    assert analysis.resolve(ast.parse("a.x", mode="eval").body) == "a.x"      # an alias cycle ends


def test_a_cell_too_long_to_scan_is_listed():
    long = "import sys\nsys.setprofile(None)\n#" + "#" * provenance.MAX_CELL_CHARS
    assert scan("x = 1", long) == [f"cell 1 not scanned ({len(long):,} characters)"]


def test_named_says_where_the_code_names_a_reference_the_graded_function_first():
    cells = [("setup", HEADER + "print(roofline.kv_bytes_per_token(roofline.case_model()))"),
             ("helpers", "def _helper(*a):\n    return getattr(roofline, 'kv_bytes_per_token')(*a)"),
             ("kv", "from course_lib.roofline import kv_bytes_per_token as k\n" + DEF + "k(c, b) or _helper(c, b)\n"
                    "def other():\n    return roofline.kv_bytes_per_token")]
    analysis = provenance.analyse(cells)
    assert analysis.named(KV, ["kv_bytes_per_token", "_helper"]) == [
        "`return getattr(roofline, 'kv_bytes_per_token')(*a)` in cell helpers line 2",
        "`print(roofline.kv_bytes_per_token(roofline.case_model()))` in cell setup line 6",
        "`from course_lib.roofline import kv_bytes_per_token as k` in cell kv line 1",
        "`return roofline.kv_bytes_per_token` in cell kv line 5"]
    assert analysis.named("course_lib.roofline.prefill_time") == []


def test_only_the_cells_before_the_test_count_and_the_test_cell_is_left_out():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(HEADER),
        nbformat.v4.new_code_cell("lab01.check_kv_bytes_per_token(kv_bytes_per_token)", metadata={"nbgrader": {
            "grade": True, "solution": False, "grade_id": "test_kv", "locked": True, "points": 1}}),
        nbformat.v4.new_code_cell("kv_bytes_per_token = roofline.kv_bytes_per_token")])
    assert [label for label, _ in provenance.notebook_cells(nb.cells)] == ["0", "2"]
    assert [label for label, _ in provenance.notebook_cells(nb.cells, before=2)] == ["0"]


# == the verdict, the zero rule, the driver's notes ====================================================
def _verdict(reached=(), unobserved=0):
    return {"grade_id": "test_kv_bytes_per_token", "status": "passed", "checks": [
        {"checker": "lab01.check_kv_bytes_per_token", "functions": ["kv_bytes_per_token"], "status": "passed",
         "references": [KV], "reached": list(reached), "unobserved": unobserved}]}


def _cells(source):
    return [nbformat.v4.new_code_cell(HEADER), nbformat.v4.new_code_cell(source)]


WRAPPED = "def kv_bytes_per_token(c, b=2):\n    return roofline.kv_bytes_per_token(c, b)"


def test_assess_flags_what_ran_and_says_where_the_code_names_it():
    honest = _cells(DEF + OWN)
    assert provenance.assess(honest, _verdict()) is None
    assert provenance.assess(_cells(WRAPPED), _verdict()) is None          # named only: the scan never flags
    ran = provenance.assess(honest, _verdict(reached=[KV]), zero=True)
    assert ran == {"references": [KV], "named": [], "unobserved": 0, "zeroed": True}
    both = provenance.assess(_cells(WRAPPED), _verdict(reached=[KV]))
    assert both["named"] == ["`return roofline.kv_bytes_per_token(c, b)` in cell 1 line 2"]
    assert both["references"] == [KV] and both["zeroed"] is False
    blinded = provenance.assess(honest, _verdict(unobserved=2), zero=True)
    assert blinded == {"references": [], "named": [], "unobserved": 2, "zeroed": False}


def test_the_driver_notes_name_the_reference_and_the_test():
    reuse = provenance.assess(_cells(WRAPPED), _verdict(reached=[KV]), zero=True)
    verdict = dict(_verdict(reached=[KV]), reference_reuse=reuse)
    dynamic = "`sys.setprofile(None)` (switches the profiler; cell 3 line 1)"
    notes = provenance.flag_notes([{"cells": [verdict], "dynamic_code": [dynamic]}])
    assert notes[0] == (f"reuses reference {KV} in test_kv_bytes_per_token (ran during the judge's calls; named at "
                        "`return roofline.kv_bytes_per_token(c, b)` in cell 1 line 2; scored 0)")
    assert notes[1] == f"may hide calls from the reference check: {dynamic}"
    assert hostile.REUSE_NOTE.search(notes[0])["test"] == "test_kv_bytes_per_token"
    blinded = dict(_verdict(unobserved=1), reference_reuse=provenance.assess(_cells(DEF + OWN), _verdict(unobserved=1)))
    assert provenance.flag_notes([{"cells": [blinded]}]) == [
        "test_kv_bytes_per_token: the judge's call-time reference check was switched off by the learner's code "
        "in 1 call(s)"]


@pytest.mark.parametrize("policy, zeroed", [("flag", False), ("zero", True)])
def test_the_judged_execute_step_scores_a_flagged_test_0_only_when_told(policy, zeroed):
    nb = nbformat.v4.new_notebook(cells=_cells(WRAPPED)
                                  + [nbformat.v4.new_code_cell("lab01.check_kv_bytes_per_token(kv_bytes_per_token)")])
    step = judge.CourseJudge(reference_reuse=policy)
    step._judge_nb, step._judge_index = nb, 2
    verdict = _verdict(reached=[KV])
    step._judge_reuse(nb.cells[2], verdict)
    assert verdict["reference_reuse"]["references"] == [KV] and verdict["reference_reuse"]["zeroed"] is zeroed
    errors = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    assert [o.ename for o in errors] == (["ReferenceReuse"] if zeroed else [])


# == the real driver ===================================================================================
@pytest.mark.slow
def test_the_driver_scores_the_wrapped_tests_0_under_reference_reuse_zero(tmp_path):
    """Grades the hostile wrapper submission (Labs 1 and 2) and the solution through the driver,
    sandbox and judge with --reference-reuse zero: every wrapped test scores 0 and is flagged with
    its reference; the solution keeps full marks and carries no such flag."""
    import pandas as pd

    submissions = tmp_path / "submitted"
    for learner_id in ("reference_wrappers", "bystander_solution"):
        shutil.copytree(REPO / "autograder" / "hostile" / learner_id, submissions / learner_id)
    work = tmp_path / "work"
    run = subprocess.run([sys.executable, "-m", "course_grader.grade", str(submissions), "--work", str(work),
                          "--per-test", "--seed", "5", "--reference-reuse", "zero"],
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    grades = pd.read_csv(work / "grades.csv", dtype=str, keep_default_na=False)
    cells = pd.read_csv(work / "grades_per_test.csv", dtype=str, keep_default_na=False)
    points = {(r.lab, r.cell): float(r.max_score) for r in cells.itertuples()}
    for lab in (hostile.L1, hostile.L2):
        wrapped = hostile.EXPECTED_REUSE[("reference_wrappers", lab)]
        got = {r.cell: float(r.score) for r in cells.itertuples() if (r.learner, r.lab) == ("reference_wrappers", lab)}
        for cell, score in got.items():
            assert score == (0.0 if cell in wrapped else points[(lab, cell)]), (lab, cell, score)
        full = sum(v for (l, _), v in points.items() if l == lab)
        honest = grades[(grades.learner == "bystander_solution") & (grades.lab == lab)].iloc[0]
        assert float(honest["score"]) == full and "reuses reference" not in honest["flags"]
    rows = grades.to_dict("records")
    assert hostile.reuse_problems(rows) == []
    for r in rows:                                   # every reuse note says the test scored 0
        if r["learner"] == "reference_wrappers":
            assert r["flags"].count("reuses reference") == r["flags"].count("; scored 0)") > 0, r["flags"]
    for test, reference in hostile.EXPECTED_REUSE[("reference_wrappers", hostile.L1)].items():
        assert re.search(rf"reuses reference [^\n]*{re.escape(reference)}[^\n]* in {test} \(ran during the judge's "
                         r"calls; named at `", run.stdout), test


def test_the_hook_never_runs_a_planted_constant():
    """The hook fingerprints the code of every call; a constant planted with code.replace is named,
    never asked for its repr: its __repr__ would run learner code inside the hook, unobserved."""
    ran = []

    class Planted:
        def __repr__(self):
            ran.append(True)
            return "planted"

    def trampoline():
        return None
    planted = types.FunctionType(trampoline.__code__.replace(co_consts=(None, Planted(), ("x", frozenset({2})))), {})
    observer = provenance.Observer(provenance.watch_spec([KV]))
    with observer:
        planted()
    assert not ran and observer.report() == {"reached": [], "observed": True}
