"""The reference-reuse flag (course_grader.provenance): a graded function that reaches course_lib's
own reference for its exercise is flagged, named, and (by the instructor's setting) scored 0.

Fast part: the static analysis on the course's solution notebooks (nothing flagged, although they
import course_lib), on the hostile ``reference_wrappers`` submission (every wrapped test flagged,
as autograder/course_grader/hostile.py's EXPECTED_REUSE declares) and on one snippet per way of
reaching a name; dynamic code; the kernel-side call-time observer run in-process; the judge's
verdict entry, the zero rule on the judged Execute step, and the driver's notes.
Slow part: the real driver (sandbox, judge, nbgrader) on the hostile submission with
``--reference-reuse zero``.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

import course_lib.roofline as roofline
from course_grader import hostile, judge, provenance, remote
from course_grader.samples import labs, source_notebook, tables
from course_lib.models import toy_config

REPO = Path(__file__).resolve().parents[1]
WRAPPERS = REPO / "autograder" / "hostile" / "reference_wrappers"
KV = "course_lib.roofline.kv_bytes_per_token"

DEF = "def kv_bytes_per_token(c, b=2):\n    return "
OWN = "2 * c.n_layers * c.n_kv_heads * c.head_dim * b"
HEADER = ("import importlib\nimport sys\nimport math\nfrom course_lib import roofline\n"
          "from course_lib.models import ModelConfig\n")


def reached(cells, function="kv_bytes_per_token", references=(KV,)) -> list[str]:
    analysis = provenance.analyse([(str(i), src) for i, src in enumerate(cells)])
    return [f.reference for f in analysis.reaches(function, list(references))]


def dynamic(*cells) -> list[str]:
    return provenance.analyse([(str(i), src) for i, src in enumerate(cells)]).dynamic


# == the course's own solutions and the hostile wrappers ===========================================
@pytest.mark.parametrize("lab", labs())
def test_the_course_solutions_reach_no_reference(lab):
    nb = source_notebook(lab)
    cells = provenance.notebook_cells(nb.cells)
    assert any("import course_lib" in src or "from course_lib" in src for _, src in cells)  # helpers are used
    analysis = provenance.analyse(cells)
    module = tables(lab)
    assert any(c.references for c in module.CONTRACTS)
    for contract in module.CONTRACTS:
        for function in contract.functions:
            assert analysis.reaches(function, contract.references) == [], (contract.test, function)
    assert analysis.dynamic == []


@pytest.mark.parametrize("lab", [hostile.L1, hostile.L2])
def test_the_wrapped_submission_is_flagged_on_every_wrapped_test(lab):
    expected = hostile.EXPECTED_REUSE[("reference_wrappers", lab)]
    nb = nbformat.read(WRAPPERS / lab / f"{lab}.ipynb", as_version=4)
    analysis = provenance.analyse(provenance.notebook_cells(nb.cells))
    flagged = {}
    for contract in tables(lab).CONTRACTS:
        for function in contract.functions:
            for finding in analysis.reaches(function, contract.references):
                flagged.setdefault(contract.test, []).append(finding.reference)
                assert finding.how.startswith(function)
    assert set(flagged) == set(expected)
    for test, reference in expected.items():
        assert reference in flagged[test], test


def test_the_hostile_check_reads_the_flags_it_expects():
    rows = [{"learner": "reference_wrappers", "lab": hostile.L1, "flags": "; ".join(
        f"reuses reference {ref} in {test} (in the code: x)"
        for test, ref in hostile.EXPECTED_REUSE[("reference_wrappers", hostile.L1)].items())}]
    wanted = {("reference_wrappers", hostile.L1): hostile.EXPECTED_REUSE[("reference_wrappers", hostile.L1)]}
    assert hostile.reuse_problems(rows, wanted) == []
    rows[0]["flags"] = rows[0]["flags"].replace("in test_prefill_time", "in test_decode_step_bound")
    problems = hostile.reuse_problems(rows, wanted)
    assert any("test_prefill_time not flagged" in p for p in problems)
    assert any("test_decode_step_bound flagged" in p for p in problems)


# == one snippet per way of reaching a name =======================================================
REACHING = {
    "module alias": ["import course_lib.roofline as _r\n"
                     "def kv_bytes_per_token(config, b=2):\n    return int(_r.kv_bytes_per_token(config, b)) + 0"],
    "alias from another cell": ["import course_lib.roofline as _r",
                                "def kv_bytes_per_token(config, b=2):\n    return _r.kv_bytes_per_token(config, b)"],
    "the notebook's own import": [HEADER + "def kv_bytes_per_token(config, b=2):\n"
                                           "    return roofline.kv_bytes_per_token(config, b)"],
    "from-import alias": ["from course_lib.roofline import kv_bytes_per_token as k\n"
                          "def kv_bytes_per_token(config, b=2):\n    return k(config, b)"],
    "name bound to the reference": ["from course_lib import roofline as r\nkv_bytes_per_token = r.kv_bytes_per_token"],
    "top package attribute chain": ["import course_lib.roofline\n"
                                    + DEF + "course_lib.roofline.kv_bytes_per_token(c, b)"],
    "import_module": [HEADER + "_m = importlib.import_module('course_lib.roofline')\n"
                               "def kv_bytes_per_token(c, b=2):\n    return _m.kv_bytes_per_token(c, b)"],
    "relative import_module": [HEADER + DEF
                               + "importlib.import_module('.roofline', 'course_lib').kv_bytes_per_token(c, b)"],
    "__import__ top level": ["def kv_bytes_per_token(c, b=2):\n"
                             "    return __import__('course_lib.roofline').roofline.kv_bytes_per_token(c, b)"],
    "__import__ fromlist + getattr": ["m = __import__('course_lib.roofline', fromlist=['x'])\n"
                                      + DEF + "getattr(m, 'kv_bytes_per_token')(c, b)"],
    "sys.modules": [HEADER + "def kv_bytes_per_token(c, b=2):\n"
                             "    return sys.modules['course_lib.roofline'].kv_bytes_per_token(c, b)"],
    "vars()": [HEADER + "def kv_bytes_per_token(c, b=2):\n    return vars(roofline)['kv_bytes_per_token'](c, b)"],
    "__dict__": [HEADER + "def kv_bytes_per_token(c, b=2):\n    return roofline.__dict__['kv_bytes_per_token'](c, b)"],
    "globals() write": [HEADER + "globals()['kv_bytes_per_token'] = roofline.kv_bytes_per_token"],
    "helper function": [HEADER + "def _helper(*a):\n    return roofline.kv_bytes_per_token(*a)\n"
                                 "def kv_bytes_per_token(c, b=2):\n    return _helper(c, b)"],
    "helper returning the module": [HEADER + "def _lib():\n    return sys.modules['course_lib.roofline']\n"
                                    + DEF + "_lib().kv_bytes_per_token(c, b)"],
    "default argument": [HEADER + "def kv_bytes_per_token(c, b=2, f=roofline.kv_bytes_per_token):\n    return f(c, b)"],
    "decorator": [HEADER + "def use(fn):\n    return roofline.kv_bytes_per_token\n"
                           "@use\ndef kv_bytes_per_token(c, b=2):\n    return 0"],
    "lambda": [HEADER + "kv_bytes_per_token = lambda c, b=2: roofline.kv_bytes_per_token(c, b)"],
    "callable class": [HEADER + "class K:\n    def __call__(self, c, b=2):\n"
                                "        return roofline.kv_bytes_per_token(c, b)\nkv_bytes_per_token = K()"],
    "container": [HEADER + "TABLE = {'kv': roofline.kv_bytes_per_token}\n"
                           "def kv_bytes_per_token(c, b=2):\n    return TABLE['kv'](c, b)"],
    "global statement": [HEADER + "def setup():\n    global F\n    F = roofline.kv_bytes_per_token\nsetup()\n"
                                  "def kv_bytes_per_token(c, b=2):\n    return F(c, b)"],
    "closure": [HEADER + "def make():\n    f = roofline.kv_bytes_per_token\n"
                         "    def inner(c, b=2):\n        return f(c, b)\n"
                         "    return inner\nkv_bytes_per_token = make()"],
    "star import": ["from course_lib.roofline import *"],
    "star import, name used in a function": ["from course_lib.models.config import *\n"
                                             "def kv_bytes_per_token(c, b=2):\n"
                                             "    return ModelConfig.kv_bytes_per_token(c, b)"],
    "the method through its class": [HEADER + "def kv_bytes_per_token(c, b=2):\n"
                                              "    return ModelConfig.kv_bytes_per_token(c, b)"],
    "%time magic": [HEADER + "%time k = roofline.kv_bytes_per_token\n"
                             "def kv_bytes_per_token(c, b=2):\n    return k(c, b)"],
}


@pytest.mark.parametrize("how", sorted(REACHING))
def test_every_way_of_naming_the_reference_is_found(how):
    refs = (KV, "course_lib.models.config.ModelConfig.kv_bytes_per_token")
    assert reached(REACHING[how], references=refs), how


NOT_REACHING = {
    "own formula beside library helpers": [HEADER + "def kv_bytes_per_token(c, b=2):\n"
                                                    "    assert c != roofline.case_model() or True\n"
                                                    "    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * b"],
    "another library function": [HEADER + DEF + "roofline.n_matmul(c) * 0 + " + OWN],
    "reference only in demonstration code": [HEADER + "print(roofline.kv_bytes_per_token(roofline.case_model()))\n"
                                                      "def kv_bytes_per_token(c, b=2):\n"
                                                      "    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * b"],
    "a draft that is redefined": [HEADER + "kv_bytes_per_token = roofline.kv_bytes_per_token", DEF + OWN],
    "star import, then the learner's own definition": ["from course_lib.roofline import *\n" + DEF + OWN],
    "same attribute name on an unrelated module": ["import math\nmath.kv_bytes_per_token = 1\n"
                                                   + DEF + "math.kv_bytes_per_token"],
}


@pytest.mark.parametrize("how", sorted(NOT_REACHING))
def test_code_that_does_not_reach_the_reference_is_not_flagged(how):
    assert reached(NOT_REACHING[how]) == [], how


PPL = "course_lib.quant.perplexity.perplexity"   # a function whose package rebinds its submodule's name


@pytest.mark.parametrize("how, cell", [
    ("from the package", "from course_lib.quant import perplexity as p\ndef perplexity(m, w):\n    return p(m, w)"),
    ("package attribute", "from course_lib import quant\ndef perplexity(m, w):\n    return quant.perplexity(m, w)"),
    ("import as", "import course_lib.quant.perplexity as p\ndef perplexity(m, w):\n    return p(m, w)"),
    ("the submodule's own name", "from course_lib.quant.perplexity import perplexity as p\n"
                                 "def perplexity(m, w):\n    return p(m, w)"),
])
def test_a_name_rebound_by_its_package_resolves_as_python_does(how, cell):
    """``course_lib.quant.perplexity`` is, as an attribute of the package, the function (the
    package's __init__ rebinds it over the submodule): every spelling of it reaches the reference."""
    assert reached([cell], function="perplexity", references=(PPL,)) == [PPL], how


def test_a_finding_names_the_chain_and_the_learner_text():
    cells = [HEADER, "def _helper(*a):\n    return roofline.kv_bytes_per_token(*a)",
             "def kv_bytes_per_token(c, b=2):\n    return _helper(c, b)"]
    analysis = provenance.analyse([("setup", cells[0]), ("helpers", cells[1]), ("kv", cells[2])])
    (finding,) = analysis.reaches("kv_bytes_per_token", [KV])
    assert finding.chain == ("kv_bytes_per_token", "_helper")
    assert finding.origin == "`roofline.kv_bytes_per_token` in cell helpers line 2"


def test_only_the_cells_before_the_test_count():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(HEADER + "def kv_bytes_per_token(c, b=2):\n    return 2 * c.n_layers * b"),
        nbformat.v4.new_code_cell("lab01.check_kv_bytes_per_token(kv_bytes_per_token)", metadata={"nbgrader": {
            "grade": True, "solution": False, "grade_id": "test_kv", "locked": True, "points": 1}}),
        nbformat.v4.new_code_cell("kv_bytes_per_token = roofline.kv_bytes_per_token")])
    early = provenance.analyse(provenance.notebook_cells(nb.cells, before=1))
    late = provenance.analyse(provenance.notebook_cells(nb.cells))
    assert early.reaches("kv_bytes_per_token", [KV]) == []
    assert [f.reference for f in late.reaches("kv_bytes_per_token", [KV])] == [KV]
    assert [label for label, _ in provenance.notebook_cells(nb.cells)] == ["0", "2"]   # the test cell is left out


# == dynamic code =================================================================================
@pytest.mark.parametrize("code, what", [
    ("exec(open('x.py').read())", "exec()"),
    ("f = eval('lambda: 1')", "eval()"),
    ("import builtins\nbuiltins.compile('1', 'x', 'eval')", "compile()"),
    ("import importlib\nm = importlib.import_module('course_lib.' + 'roofline')",
     "import_module() with a computed name"),
    ("m = __import__(''.join(['course_lib']))", "__import__() with a computed name"),
    ("import course_lib.roofline as r\nname = 'kv'\nf = getattr(r, name + '_bytes_per_token')", "with a computed name"),
    ("import sys\nsys.setprofile(None)", "sys.setprofile()"),
    ("%run helpers.py", "%run magic"),
    ("get_ipython().run_cell('x = 1')", "run_cell()"),
    ("def f():\n    exec('x = 1')", "exec()"),                         # inside a function nobody calls
    # switching the call-time check off, or running code beside the graded call
    ("import sys as _s\n_s.setprofile = lambda f: None", "`_s.setprofile` rebound"),
    ("import sys\n_s = sys\n_s.getprofile = lambda: None", "`_s.getprofile` rebound"),
    ("import threading\ndel threading.setprofile", "`threading.setprofile` rebound or deleted"),
    ("import builtins\nbuiltins.getattr = lambda *a: 0", "`builtins.getattr` rebound"),
    ("import sys\nsetattr(sys, 'setprofile', print)", "setattr(sys, 'setprofile', print)"),
    ("import sys\nvars(sys)['setprofile'] = print", "rebound"),
    ("import course_lib.roofline as r\nr.kv_bytes_per_token = len", "`r.kv_bytes_per_token` rebound"),
    ("import course_grader.provenance as p\np.Observer = None", "`p.Observer` rebound"),
    ("import threading\nt = threading.Thread(target=print)", "threading.Thread() (code run beside"),
    ("from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(2)",
     "concurrent.futures.ThreadPoolExecutor()"),
    ("import multiprocessing as mp\np = mp.Process(target=print)", "multiprocessing.Process()"),
    ("import _thread\n_thread.start_new_thread(print, ())", "_thread.start_new_thread()"),
    ("import threading\nclass W(threading.Thread):\n    pass", "a subclass of threading.Thread"),
])
def test_dynamic_code_is_reported_as_not_analysable(code, what):
    notes = dynamic(code)
    assert any(what in n for n in notes), notes


@pytest.mark.parametrize("code", [
    "import re\nr = re.compile('a+')",
    "import torch\nf = torch.compile",
    "def compile(x):\n    return x\ny = compile(3)",
    "%matplotlib inline\nx = 1",
    "import course_lib.roofline as r\nf = getattr(r, 'kv_bytes_per_token')",
])
def test_ordinary_code_is_not_reported_as_dynamic(code):
    assert dynamic(code) == []


def test_hostile_source_does_not_break_the_analysis():
    deep = "x = " + "(" * 150 + "1" + ")" * 150
    chain = "x = " + " + ".join(["1"] * 20000)
    analysis = provenance.analyse([("a", "def f(:\n"), ("b", deep), ("c", chain), ("d", "y = 1\n" * 10),
                                   ("e", "#" * (provenance.MAX_CELL_CHARS + 1))])
    assert analysis.reaches("f", [KV]) == []
    assert any("cell e: not analysed" in n for n in analysis.dynamic)


# == call time ====================================================================================
def kernel_call(fn, *args, watch=None):
    """remote.answer_call as the kernel runs it, with the judge's watch spec for KV."""
    enc = remote.CallEncoder()
    request = json.loads(remote.dumps({"op": "call", "fn": "f", "args": [enc.encode(a) for a in args], "kwargs": [],
                                       "objects": enc.table, "grad": False,
                                       "watch": provenance.watch_spec([KV]) if watch is None else watch}))
    return json.loads(remote.dumps(remote.answer_call({"f": fn}, request, None)))


def own(config, b=2):
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * b


def wrapper(config, b=2):
    return int(roofline.kv_bytes_per_token(config, b)) + 0


_COPY = types.FunctionType(roofline.kv_bytes_per_token.__code__, roofline.kv_bytes_per_token.__globals__)


def copied(config, b=2):
    return _COPY(config, b)


def blinding(config, b=2):
    sys.setprofile(None)
    return wrapper(config, b)


def test_the_kernel_reports_a_reference_that_ran_during_the_call():
    config = toy_config()
    assert kernel_call(own, config)["reached"] == [] and kernel_call(own, config)["observed"] is True
    assert kernel_call(wrapper, config)["reached"] == [KV]
    assert kernel_call(copied, config)["reached"] == [KV]            # same code, another function object
    answer = kernel_call(blinding, config)
    assert answer["observed"] is False and answer["reached"] == []
    assert sys.getprofile() is None                                    # the previous profiler is back


def test_a_call_without_a_watch_reports_nothing():
    answer = kernel_call(wrapper, toy_config(), watch=[])
    assert "reached" not in answer and "observed" not in answer and answer["op"] == "returned"


def test_the_profiler_in_place_before_the_call_is_restored():
    def previous(frame, event, arg):
        pass
    sys.setprofile(previous)
    try:
        kernel_call(wrapper, toy_config())
        assert sys.getprofile() is previous
    finally:
        sys.setprofile(None)


# == the verdict, the zero rule, the driver's notes ================================================
def _verdict(reached=(), unobserved=0):
    return {"grade_id": "test_kv_bytes_per_token", "status": "passed", "checks": [
        {"checker": "lab01.check_kv_bytes_per_token", "functions": ["kv_bytes_per_token"], "status": "passed",
         "references": [KV], "reached": list(reached), "unobserved": unobserved}]}


def _cells(source):
    return [nbformat.v4.new_code_cell(HEADER), nbformat.v4.new_code_cell(source)]


def test_assess_combines_the_code_and_the_call_time_evidence():
    honest = _cells("def kv_bytes_per_token(c, b=2):\n    return 2 * c.n_layers * c.n_kv_heads * c.head_dim * b")
    assert provenance.assess(honest, _verdict()) is None
    runtime_only = provenance.assess(honest, _verdict(reached=[KV]), zero=True)
    assert runtime_only["references"] == [KV] and runtime_only["static"] == [] and runtime_only["zeroed"] is True
    wrapped = _cells("def kv_bytes_per_token(c, b=2):\n    return roofline.kv_bytes_per_token(c, b)")
    both = provenance.assess(wrapped, _verdict(reached=[KV]))
    assert both["references"] == [KV] and both["zeroed"] is False
    assert both["static"][0]["how"].startswith("kv_bytes_per_token -> `roofline.kv_bytes_per_token`")
    blinded = provenance.assess(honest, _verdict(unobserved=2), zero=True)
    assert blinded["references"] == [] and blinded["unobserved"] == 2 and blinded["zeroed"] is False


def test_the_driver_notes_name_the_reference_and_the_test():
    wrapped = _cells("def kv_bytes_per_token(c, b=2):\n    return roofline.kv_bytes_per_token(c, b)")
    reuse = provenance.assess(wrapped, _verdict(reached=[KV]), zero=True)
    verdict = dict(_verdict(reached=[KV]), reference_reuse=reuse)
    notes = provenance.flag_notes([{"cells": [verdict], "dynamic_code": ["exec() (cell 3 line 1)"]}])
    assert re.fullmatch(rf"reuses reference {re.escape(KV)} in test_kv_bytes_per_token \(in the code: .*; "
                        r"ran during the judge's calls; scored 0\)", notes[0]), notes
    assert notes[1] == "dynamic code, not analysable: exec() (cell 3 line 1)"
    assert hostile.REUSE_NOTE.search(notes[0])["test"] == "test_kv_bytes_per_token"


@pytest.mark.parametrize("policy, zeroed", [("flag", False), ("zero", True)])
def test_the_judged_execute_step_scores_a_flagged_test_0_only_when_told(policy, zeroed):
    nb = nbformat.v4.new_notebook(cells=_cells("def kv_bytes_per_token(c, b=2):\n"
                                               "    return roofline.kv_bytes_per_token(c, b)")
                                  + [nbformat.v4.new_code_cell("lab01.check_kv_bytes_per_token(kv_bytes_per_token)")])
    step = judge.make_judge_execute()(reference_reuse=policy)
    step._judge_nb, step._judge_index = nb, 2
    verdict = _verdict()
    step._judge_reuse(nb.cells[2], verdict)
    assert verdict["reference_reuse"]["references"] == [KV] and verdict["reference_reuse"]["zeroed"] is zeroed
    errors = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    assert [o.ename for o in errors] == (["ReferenceReuse"] if zeroed else [])


# == the real driver ================================================================================
@pytest.mark.slow
def test_the_driver_scores_the_wrapped_tests_0_under_reference_reuse_zero(tmp_path):
    """Grades the hostile wrapper submission (Labs 1 and 2) and the solution through the driver,
    sandbox and judge with --reference-reuse zero: every wrapped test scores 0 and is flagged with
    its reference; the solution keeps full marks and carries no such flag."""
    import pandas as pd

    submissions = tmp_path / "submitted"
    for learner in ("reference_wrappers", "bystander_solution"):
        shutil.copytree(REPO / "autograder" / "hostile" / learner, submissions / learner)
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
        assert re.search(rf"reuses reference [^\n]*{re.escape(reference)}[^\n]* in {test} ", run.stdout), test


# == routes the analysis cannot read, guarded modules, threads, the work budget ======================
OPAQUE = {
    "__getattribute__ with a constant": [HEADER + DEF + "roofline.__getattribute__('kv_bytes_per_token')(c, b)"],
    "__getattribute__ with a computed name": [HEADER + "n = 'kv_bytes_' + 'per_token'\n"
                                              + DEF + "roofline.__getattribute__(n)(c, b)"],
    "object.__getattribute__": [HEADER + DEF + "object.__getattribute__(roofline, 'kv_bytes_per_token')(c, b)"],
    "vars().get": [HEADER + DEF + "vars(roofline).get('kv_bytes_' + 'per_token')(c, b)"],
    "__dict__ with a computed key": [HEADER + "k = 'kv'\n" + DEF + "roofline.__dict__[k + '_bytes_per_token'](c, b)"],
    "getattr with a computed name": [HEADER + "k = 'kv'\n" + DEF + "getattr(roofline, k + '_bytes_per_token')(c, b)"],
    "operator.attrgetter": ["import operator\nimport course_lib\n"
                            + DEF + "operator.attrgetter('roofline.kv_bytes_per_token')(course_lib)(c, b)"],
    "attrgetter with a computed name": ["from operator import attrgetter\nfrom course_lib import roofline\n"
                                        "n = 'kv_bytes_per_token'\n" + DEF + "attrgetter(n)(roofline)(c, b)"],
    "iterating sys.modules": ["import sys\n" + DEF + "[getattr(m, 'kv_bytes_per_token', None) "
                              "for m in sys.modules.values()][0](c, b)"],
}


@pytest.mark.parametrize("how", sorted(OPAQUE))
def test_a_route_whose_key_is_unreadable_counts_as_reaching_the_module(how):
    assert reached(OPAQUE[how]) == [KV], how




@pytest.mark.parametrize("code", [
    "import math\nmath.tau2 = 2 * math.tau",
    "import sys\nsys.path.append('.')",
    "import threading\nlock = threading.Lock()",
])
def test_writes_to_other_modules_are_not_reported(code):
    assert dynamic(code) == []


def _chain(n: int) -> str:
    """A never-run block whose values nest one level deeper per line (v_i holds i tracked objects
    without a cap)."""
    return "import os\nv0 = os.a0\n" + "".join(f"v{i} = (v{i - 1}, os.a{i})\n" for i in range(1, n))


def test_a_long_chain_of_nested_values_is_bounded_and_reported():
    n = 20_000
    analysis = provenance.analyse([("big", _chain(n))])
    assert analysis.steps < 10 * n                       # linear work: a handful of steps per line
    assert max(len(v.values) + len(v.mentions) for v in analysis.module.bindings.values()) \
        <= 2 * provenance.MAX_ATOMS
    assert any("cell big: values too large to analyse" in d for d in analysis.dynamic), analysis.dynamic


def test_a_value_too_large_to_track_reaches_every_reference():
    cells = ["import os\nv0 = os.a0\n" + "".join(f"v{i} = (v{i - 1}, os.a{i})\n" for i in range(1, 100))
             + "def kv_bytes_per_token(c, b=2):\n    return v99"]
    assert reached(cells) == [KV]


def test_the_step_budget_stops_the_analysis_and_says_so(monkeypatch):
    monkeypatch.setattr(provenance, "MAX_STEPS", 500)
    analysis = provenance.analyse([("big", "x = 1\n" * 2000)])
    assert analysis.complete is False and analysis.steps <= 501
    assert any("too large to analyse: over 500 steps" in d for d in analysis.dynamic), analysis.dynamic


def test_the_node_budget_leaves_a_large_notebook_unanalysed(monkeypatch):
    monkeypatch.setattr(provenance, "MAX_NODES", 1000)
    analysis = provenance.analyse([("small", "x = 1"), ("big", "y = 1\n" * 1000)])
    assert analysis.complete is False and [c.label for c in analysis.cells] == ["small"]
    assert any("cell big: not analysed (too large to analyse" in d for d in analysis.dynamic)


def test_assess_analyses_the_same_code_once(monkeypatch):
    calls = []
    real = provenance.Analysis.__init__
    monkeypatch.setattr(provenance.Analysis, "__init__", lambda self, cells: (calls.append(1), real(self, cells))[1])
    provenance.analyse_cached.cache_clear()
    wrapped = _cells("def kv_bytes_per_token(c, b=2):\n    return roofline.kv_bytes_per_token(c, b)")
    first = provenance.assess(wrapped, _verdict())
    second = provenance.assess(wrapped + [nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": "test_other", "locked": True, "points": 1}})], _verdict())
    assert first == second and first["references"] == [KV] and len(calls) == 1


# == twins of a reference, declared in the contracts ===================================================
@pytest.mark.parametrize("lab, test, code", [
    ("01_roofline", "test_kv_bytes_per_token",
     "import course_lib.roofline as r\ndef kv_bytes_per_token(config, bytes_per_value=2):\n"
     "    return r.kv_bytes_per_sequence(n_layers=config.n_layers, n_kv_heads=config.n_kv_heads,\n"
     "                                   head_dim=config.head_dim, context=1, bytes_per_value=bytes_per_value)"),
    ("01_roofline", "test_gemv_intensity",
     "from course_lib.roofline import gemm_intensity as g\ndef gemv_intensity(m, n, b):\n    return g(m, n, 1, b)"),
    ("01_roofline", "test_count_parameters",
     "from course_lib.models.config import ModelConfig\ndef count_parameters(config):\n"
     "    return config.n_layers * ModelConfig.block_parameters(config) + 0"),
])
def test_a_twin_of_the_reference_is_declared_and_found(lab, test, code):
    (contract,) = [c for c in tables(lab).CONTRACTS if c.test == test]
    assert reached([code], contract.functions[0], contract.references), (lab, test)


def test_a_twin_called_as_a_method_of_an_argument_runs_under_the_judge():
    (contract,) = [c for c in tables("01_roofline").CONTRACTS if c.test == "test_count_parameters"]

    def count_parameters(config):
        return config.n_layers * config.block_parameters()

    answer = kernel_call(count_parameters, toy_config(), watch=provenance.watch_spec(contract.references))
    assert answer["reached"] == ["course_lib.models.config.ModelConfig.block_parameters"]


# == call time: the profiler the learner cannot swap, and renamed copies =================================
def test_the_observer_keeps_the_interpreter_profiler_when_sys_is_patched(monkeypatch):
    state = [None]

    def fake_set(fn):
        state[0] = fn
        if fn is not None:
            fn(sys._getframe(), "call", None)              # a fake event, so the hook "ran"

    monkeypatch.setattr(sys, "setprofile", fake_set)
    monkeypatch.setattr(sys, "getprofile", lambda: state[0])

    def through_getattribute(config, b=2):
        return roofline.__getattribute__("kv_bytes_per_token")(config, b)

    answer = kernel_call(through_getattribute, toy_config())
    assert answer["reached"] == [KV] and answer["observed"] is True


def test_a_kernel_whose_profiler_was_replaced_before_the_import_reports_unobserved(monkeypatch):
    fake = types.ModuleType("sys")
    fake.setprofile, fake.getprofile = (lambda f: None), (lambda: None)
    assert provenance.genuine_profiler(fake) is None
    assert provenance.genuine_profiler(sys)[0] is sys.setprofile
    monkeypatch.setattr(provenance, "_PROFILER", None)
    answer = kernel_call(wrapper, toy_config())
    assert answer["observed"] is False and answer["reached"] == []


_RENAMED = types.FunctionType(roofline.kv_bytes_per_token.__code__.replace(co_qualname="mine", co_name="mine"),
                              roofline.kv_bytes_per_token.__globals__, "mine")


def renamed(config, b=2):
    return _RENAMED(config, b)


def test_a_renamed_copy_of_the_reference_is_seen_by_its_code():
    config = toy_config()
    assert kernel_call(renamed, config)["reached"] == [KV]
    assert kernel_call(own, config)["reached"] == []
    assert all(len(item["fingerprint"]) == 64 for item in provenance.watch_spec([KV]))
