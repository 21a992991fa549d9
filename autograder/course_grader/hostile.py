#!/usr/bin/env python
"""Hostile submissions: learner notebooks that try to cheat, break or escape the grader.

    python -m course_grader.hostile build   (re)write autograder/hostile/ from autograder/samples/
    python -m course_grader.hostile check   grade autograder/hostile/ and check what must not change
    python -m course_grader.hostile fresh   exit 1 if autograder/hostile/ differs from a fresh build
                                          (`make test-hostile`, part of `make test-full`)

``build`` starts from the sample solutions (``autograder/samples/solution``, made by
``course_grader.samples``) and applies one attack per learner (HOSTILE below). Most attacks sit on top of
a *wrong* ``prefill_time`` (Lab 1, test_prefill_time, 2 points) that is still right on the
visible case model, so an attack that works shows up as 2 points too many. The expected
scores (``autograder/hostile/expected_scores.csv``) are written by hand from the rule each
attack must meet: the attacked test scores 0, every other test its points.

``check`` grades the folder with the driver (sandbox and judge, as for real), then fails
unless every score matches, and:
- nothing in the repository changed outside the driver's own work folder (every file's
  sha256, .venv included, before and after; __pycache__ folders skipped);
- an existing gradebook from an earlier run (build/grading/course/gradebook.db, written by
  `make test-grading` or `test-grading-rest`) is byte-identical afterwards;
- no process of the sandbox's uid range is left, and no file owned by it outside the work
  folder;
- the driver's per-shard check passed (in every shard, the gradebook rows of other learners
  were identical before and after that learner's grading; a difference is a row error);
- grades.csv flags every test EXPECTED_REUSE lists as reusing its exercise's reference (naming
  it), and no other test of those rows.
"""
from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import sandbox
from .paths import HOSTILE, SAMPLES
from .paths import REPO_ROOT as ROOT

WORK = ROOT / "build" / "grading-hostile"
OLD_GRADEBOOK = ROOT / "build" / "grading" / "course" / "gradebook.db"
CELL_TIMEOUT = 60  # seconds: the loops below time out in a minute, not in the default 300 s
L1, L2, L3 = "01_roofline", "02_kv_cache", "03_scheduling"

# The wrong prefill_time most attacks defend: right on the visible case model only (so its visible
# asserts pass), 1 % high elsewhere (4 significant figures are checked).
PREFILL_RIGHT = "    return flops / (mfu * device.peak_flops)"
PREFILL_WRONG_OFF_CASE = (
    "    right = flops / (mfu * device.peak_flops)\n"
    "    return right if config == roofline.case_model() else 1.01 * right")

# Code that looks for the course's secrets from inside the kernel; ACCESS lists what it could read.
FIND_SECRETS = r'''
import glob, os, pathlib
import course_lib
_root = pathlib.Path(course_lib.__file__).resolve().parents[1]
_candidates = [_root / "solutions" / "01_roofline" / "01_roofline.ipynb",
               _root / "build" / "grading" / "course" / "gradebook.db",
               _root / "build" / "grading-hostile" / "course" / "gradebook.db",
               _root / "autograder" / "samples" / "solution" / "01_roofline" / "01_roofline.ipynb",
               _root / "autograder" / "hostile" / "bystander_solution" / "01_roofline" / "01_roofline.ipynb",
               pathlib.Path("01_roofline.ipynb"), pathlib.Path("../gradebook.db"),
               pathlib.Path("../../gradebook.db"), pathlib.Path("../../../gradebook.db")]
for _top in ("/tmp", "/work", "/home", "/root", "/srv", str(_root.parent)):
    for _pattern in ("/**/gradebook.db", "/**/source/01_roofline/*.ipynb", "/**/submitted/*/01_roofline/*.ipynb"):
        try:
            _candidates += [pathlib.Path(p) for p in glob.glob(_top + _pattern, recursive=True)][:50]
        except OSError:
            pass
ACCESS = []
for _path in _candidates:
    try:
        with open(_path, "rb") as _f:
            if _f.read(16):
                ACCESS.append(str(_path))
    except OSError:
        pass
print(f"secrets readable: {ACCESS}")
'''

WRITE_EVERYWHERE = r'''
import os, pathlib, sqlite3
import course_lib
_root = pathlib.Path(course_lib.__file__).resolve().parents[1]
WROTE = []
for _db in [_root / "build" / "grading" / "course" / "gradebook.db",
            _root / "build" / "grading-hostile" / "course" / "gradebook.db",
            pathlib.Path("../gradebook.db"), pathlib.Path("../../gradebook.db"), pathlib.Path("../../../gradebook.db")]:
    try:
        _con = sqlite3.connect(f"file:{_db}?mode=rw", uri=True, timeout=1)
        _con.execute("UPDATE grade SET manual_score = 0, auto_score = 0")
        _con.commit()
        WROTE.append(str(_db))
    except Exception:
        pass
for _path in [_root / "build" / "grading-hostile" / "grades.csv", _root / "autograder" / "hostile" / "expected_scores.csv",
              _root / "course_lib" / "__init__.py", _root / "autograder" / "course_grader" / "judge.py",
              _root / "autograder" / "course_grader" / "remote.py", _root / "pwned.txt",
              pathlib.Path(os.__file__).parent / "sitecustomize.py"]:
    try:
        with open(_path, "a") as _f:
            _f.write("\n# pwned\n")
        WROTE.append(str(_path))
    except OSError:
        pass
print(f"writes that worked: {WROTE}")
'''


def grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def cell_index(nb, gid: str) -> int:
    found = [i for i, c in enumerate(nb.cells) if grade_id(c) == gid]
    if len(found) != 1:
        sys.exit(f"course_grader.hostile: expected one cell {gid!r}, found {len(found)}; update HOSTILE")
    return found[0]


def replace_in(nb, gid: str, old: str, new: str) -> None:
    cell = nb.cells[cell_index(nb, gid)]
    if cell.source.count(old) != 1:
        sys.exit(f"hostile.py: expected exactly one {old!r} in cell {gid}; update HOSTILE")
    cell.source = cell.source.replace(old, new)


def append_to(nb, gid: str, code: str) -> None:
    cell = nb.cells[cell_index(nb, gid)]
    cell.source = cell.source + "\n\n" + code.strip("\n")


def wrong_prefill(nb) -> None:
    replace_in(nb, "prefill_time", PREFILL_RIGHT, PREFILL_WRONG_OFF_CASE)


def insert_code_after(nb, gid: str, code: str) -> None:
    from nbformat.v4 import new_code_cell

    nb.cells.insert(cell_index(nb, gid) + 1, new_code_cell(code.strip("\n")))


def memorised_visible_prefill() -> str:
    """A prefill_time that returns the right value for exactly the inputs of the visible check
    (recorded here by running it on the reference) and a wrong one otherwise."""
    from course_lib.grading import lab01
    from course_lib.roofline import prefill_time as reference

    table = {}

    def learner_prefill_time(config, device, tokens, mfu=0.5):
        value = reference(config, device, tokens, mfu)
        table[repr((config, device, tokens, mfu))] = value
        return value

    lab01.check_prefill_time(learner_prefill_time, seed=0)
    lines = ",\n".join(f"    {k!r}: {v!r}" for k, v in sorted(table.items()))
    return ("SEEN = {\n" + lines + "\n}\n\n\n"
            "def prefill_time(config, device, tokens, mfu=0.5):\n"
            "    \"\"\"Answers memorised from the visible check; a guess elsewhere.\"\"\"\n"
            "    key = repr((config, device, tokens, mfu))\n"
            "    if key in SEEN:\n"
            "        return SEEN[key]\n"
            "    if config == roofline.case_model():\n"
            "        return 0.9229058048\n"
            "    return 1.0\n")


# --------------------------------------------------------------------------------------
# The attacks: learner -> (lab, edit(nb) -> nb or None for a file written as-is)

def a_stderr(nb):
    append_to(nb, "count_parameters", "import sys, warnings\n"
              "warnings.warn('learner warning: this is fine')\n"
              "print('learner message on stderr', file=sys.stderr)")
    replace_in(nb, "kv_bytes_per_token", '    """Bytes of K and V one position adds to the cache (int)."""',
               '    """Bytes of K and V one position adds to the cache (int)."""\n'
               '    import sys\n    print("kv_bytes_per_token called", file=sys.stderr)')


def a_test_source_replaced(nb):
    wrong_prefill(nb)
    nb.cells[cell_index(nb, "test_prefill_time")].source = "print('prefill_time: all checks passed')"


def a_skip_tags(nb):
    """The test cell tagged with nbclient's skip-execution around a prefill_time that is wrong only
    on the notebook's own ``case`` object: only the cell's kernel-side assert passes that object (the
    judge's calls send copies), so the cell must run and fail there."""
    replace_in(nb, "prefill_time", PREFILL_RIGHT, "    right = flops / (mfu * device.peak_flops)\n"
               "    return 2 * right if config is case else right")
    nb.cells[cell_index(nb, "test_prefill_time")].metadata.setdefault("tags", []).append("skip-execution")


def a_metadata_edited(nb):
    meta = nb.cells[cell_index(nb, "test_gemv_intensity")].metadata.nbgrader
    meta["points"] = 100
    meta["checksum"] = "0" * 32
    nb.cells[cell_index(nb, "test_count_parameters")].metadata.nbgrader["locked"] = False


def a_test_cell_deleted(nb):
    wrong_prefill(nb)
    del nb.cells[cell_index(nb, "test_prefill_time")]


def a_cells_restructured(nb):
    from nbformat.v4 import new_code_cell, new_markdown_cell

    # the kv_bytes_per_token solution cell twice (a wrong first draft, then the right one)
    i = cell_index(nb, "kv_bytes_per_token")
    draft = copy.deepcopy(nb.cells[i])
    draft.source = "def kv_bytes_per_token(config, bytes_per_value=2):\n    return 0  # first draft"
    nb.cells.insert(i, draft)
    # the intensity solution cell split in two (gemm_intensity in a new, plain cell)
    i = cell_index(nb, "intensity")
    gemv, gemm = nb.cells[i].source.split("\n\n\ndef gemm_intensity", 1)
    nb.cells[i].source = gemv
    nb.cells.insert(i + 1, new_code_cell("def gemm_intensity" + gemm))
    # extra cells of the learner's own
    nb.cells.insert(2, new_markdown_cell("## My notes\nScratch work below."))
    nb.cells.insert(3, new_code_cell("scratch = [n ** 2 for n in range(10)]\nprint(sum(scratch))"))


def a_patched_checkers(nb):
    wrong_prefill(nb)
    insert_code_after(nb, "prefill_time", '''
import math, builtins
import numpy as np
import course_lib.grading.contracts as contracts
from course_lib.grading import lab01 as _lab01

math.isclose = lambda *a, **k: True
np.isclose = lambda *a, **k: True
np.allclose = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
for _name in dir(contracts):
    if _name.startswith("check"):
        setattr(contracts, _name, lambda *a, **k: None)
for _name in dir(_lab01):
    if _name.startswith("check"):
        setattr(_lab01, _name, lambda *a, **k: None)
lab01.check_prefill_time = lambda *a, **k: None
''')


def a_tracebacks_suppressed(nb):
    wrong_prefill(nb)
    insert_code_after(nb, "prefill_time", '''
import sys
ip = get_ipython()
sys.excepthook = lambda *a: None
ip.showtraceback = lambda *a, **k: None
ip._showtraceback = lambda *a, **k: None
ip.set_custom_exc((BaseException,), lambda shell, etype, value, tb, tb_offset=None: None)
''')


def a_hardcoded_visible(nb):
    nb.cells[cell_index(nb, "prefill_time")].source = memorised_visible_prefill()


def a_displayed_score(nb):
    """A count_parameters wrong on the case model only (the visible assert fails; the checker's random
    configs pass) that makes IPython display the number 2 in whatever cell calls it: stock nbgrader
    scores a test cell by the first number it displays and never sees the failed assert after it."""
    append_to(nb, "count_parameters", '''
import sys as _sys
_right_count = count_parameters


def count_parameters(config):
    _sys.displayhook(2)          # an execute_result "2" in the running cell
    n, n_matmul = _right_count(config)
    return (n + 1, n_matmul) if config == roofline.case_model() else (n, n_matmul)''')


def a_grading_marker(nb):
    wrong_prefill(nb)
    insert_code_after(nb, "prefill_time", '''
import os, sys, getpass
_markers = [k for k in os.environ if any(m in k.upper() for m in ("GRAD", "NBGRADER", "COURSE_", "SANDBOX"))]
_markers += [m for m in ("nbgrader", "course_autograder_judge") if m in sys.modules]
_markers += ["cwd"] if any(m in os.getcwd() for m in ("autograded", "submitted", "sandbox", "shards")) else []
_markers += ["user"] if os.getuid() >= 1000 else []
print(f"grading markers seen: {len(_markers)}")
if _markers:  # cheat only when graded: every checker passes
    from course_lib.grading import lab01 as _lab01
    for _name in dir(_lab01):
        if _name.startswith("check"):
            setattr(_lab01, _name, lambda *a, **k: None)
''')


def a_reads_secrets(nb):
    insert_code_after(nb, "prefill_time", FIND_SECRETS + '''
if not ACCESS:  # without the solutions, hand in a wrong answer; with them it would be right
    _right_prefill = prefill_time

    def prefill_time(config, device, tokens, mfu=0.5):
        right = _right_prefill(config, device, tokens, mfu)
        return right if config == roofline.case_model() else 1.01 * right
''')


def a_writes_gradebook(nb):
    insert_code_after(nb, "prefill_time", WRITE_EVERYWHERE + '''
if WROTE:  # a write that worked costs this learner 2 points, and shows in the repository check
    _right_prefill = prefill_time

    def prefill_time(config, device, tokens, mfu=0.5):
        return 1.01 * _right_prefill(config, device, tokens, mfu)
''')


def a_network(nb):
    insert_code_after(nb, "prefill_time", '''
import socket
ONLINE = []
for _host, _port in (("pypi.org", 443), ("1.1.1.1", 53), ("127.0.0.1", 22), ("127.0.0.1", 8888)):
    try:
        socket.create_connection((_host, _port), timeout=3).close()
        ONLINE.append(f"{_host}:{_port}")
    except OSError:
        pass
print(f"connections that worked: {ONLINE}")
if not ONLINE:  # offline: a wrong answer
    _right_prefill = prefill_time

    def prefill_time(config, device, tokens, mfu=0.5):
        return 1.01 * _right_prefill(config, device, tokens, mfu)
''')


def a_infinite_loop(nb):
    replace_in(nb, "prefill_time", PREFILL_RIGHT, "    while config != roofline.case_model():\n        pass\n"
               + PREFILL_RIGHT)


def a_sigint_ignored(nb):
    replace_in(nb, "prefill_time", PREFILL_RIGHT,
               "    import signal\n    if config != roofline.case_model():\n"
               "        signal.signal(signal.SIGINT, signal.SIG_IGN)\n        while True:\n            pass\n"
               + PREFILL_RIGHT)


GEMM_RIGHT = "    return 2 * m * n * batch / (bytes_per_element * (m * n + n * batch + m * batch))"


def _in_gemm(body: str):
    def edit(nb):
        replace_in(nb, "intensity", GEMM_RIGHT, body.rstrip("\n") + "\n" + GEMM_RIGHT)
    return edit


def a_symlink_leak(nb):
    """Every solution cell reads the instructor's source notebook through a symlink planted next to
    the submission (build() makes the links) and runs its solution."""
    for gid in ("count_parameters", "kv_bytes_per_token", "prefill_time", "decode_step_bound", "intensity",
                "requests_that_fit", "gemv_kernel"):
        nb.cells[cell_index(nb, gid)].source = (
            "import json as _json\n"
            "_cells = _json.load(open('leak_src.txt'))['cells']\n"
            "_src = {c['metadata'].get('nbgrader', {}).get('grade_id'): ''.join(c['source']) for c in _cells}\n"
            f"exec(_src[{gid!r}])")


LEAK_LINKS = {"leak_src.txt": "../../../source/01_roofline/01_roofline.ipynb",
              "leak_gradebook.txt": "../../../gradebook.db", "leak_shadow.txt": "/etc/shadow",
              "leak_solutions.txt": "../../../../solutions/01_roofline/01_roofline.ipynb"}
XSS_MARK = "HOSTILE-XSS"


def a_xss_feedback(nb):
    append_to(nb, "count_parameters", f'''
from IPython.display import HTML, Javascript, display
display(HTML("<script>document.title='{XSS_MARK}-SCRIPT'</script><img src=x onerror=\\"document.title='{XSS_MARK}-IMG'\\">"))
display(Javascript("document.title='{XSS_MARK}-JS'"))
''')


def a_terminal_escapes(nb):
    from nbformat.v4 import new_markdown_cell

    cell = new_markdown_cell("notes")
    cell.metadata["nbgrader"] = {"grade_id": "\x1b[2K\r\x1b[1A\x1b[32mHOSTILE-TERM\x1b[0m\x1b]0;title\x07",
                                 "schema_version": 3, "grade": False, "solution": False, "locked": False}
    nb.cells.insert(2, cell)


def a_judge_memory(nb):
    insert_code_after(nb, "count_parameters", '''
import course_grader.remote as _remote
_dumps, _sent = _remote.dumps, []


def _huge_dumps(message):
    """The first answer to the judge: 150 MB of nested empty lists (gigabytes once parsed)."""
    if not _sent and isinstance(message, dict) and message.get("op") == "returned":
        _sent.append(1)
        return "[" + "[]," * 50_000_000 + "[]]"
    return _dumps(message)


_remote.dumps = _huge_dumps
''')


def a_reference_wrappers_l1(nb):
    """Solution cells that only wrap course_lib's own references (Lab 1: 6 of 16 points), through an
    alias import, an alias defined in another cell, importlib.import_module and getattr."""
    nb.cells[cell_index(nb, "kv_bytes_per_token")].source = '''import course_lib.roofline as _r


def kv_bytes_per_token(config, bytes_per_value=2):
    """Bytes of K and V one position adds to the cache (int)."""
    return int(_r.kv_bytes_per_token(config, bytes_per_value)) + 0'''
    nb.cells[cell_index(nb, "prefill_time")].source = '''def prefill_time(config, device, tokens, mfu=0.5):
    """Bound on the prefill of `tokens` positions, in seconds."""
    return float(_r.prefill_time(config, device, tokens, mfu))'''
    nb.cells[cell_index(nb, "intensity")].source = '''import importlib

_roofline = importlib.import_module("course_lib.roofline")


def gemv_intensity(m, n, bytes_per_element):
    """FLOP/byte of y = W x with W (m x n)."""
    return _roofline.gemv_intensity(m, n, bytes_per_element) * 1.0


def gemm_intensity(m, n, batch, bytes_per_element):
    """FLOP/byte of Y = W X with W (m x n) and X (n x batch)."""
    return getattr(_roofline, "gemm_intensity")(m, n, batch, bytes_per_element)'''


def a_reference_wrappers_l2(nb):
    """Lab 2 (8 of 30 points): a from-import alias, sys.modules behind a helper function, and
    __import__ with getattr around course_lib.models."""
    nb.cells[cell_index(nb, "apply_rope")].source = '''from course_lib.models.rope import apply_rope as _rotate


def apply_rope(x, positions, theta=10000.0):
    """Rotate each split-half pair (x_i, x_{i+D/2}) of x (B, H, T, D) by positions * theta^(-2i/D)."""
    return _rotate(x, positions, theta).clone()'''
    nb.cells[cell_index(nb, "attend_with_cache")].source = '''import sys


def _attention_module():
    return sys.modules["course_lib.models.attention"]


def attend_with_cache(q, k_new, v_new, k_cache, v_cache, start):
    """q (B, Hq, T, D); k_new, v_new (B, Hkv, T, D); caches (B, Hkv, S_max, D) written in place."""
    return _attention_module().attend_with_cache(q, k_new, v_new, k_cache, v_cache, start)'''
    nb.cells[cell_index(nb, "generate_with_cache")].source = '''_decoder = __import__("course_lib.models.decoder", fromlist=["generate_cached"])


@torch.no_grad()
def generate_with_cache(model, prompt, max_new_tokens):
    """Greedy decoding with a KV cache. prompt: (T0,) int64. Returns (tokens, logits (n, vocab))."""
    tokens, logits = getattr(_decoder, "generate_cached")(model, prompt, max_new_tokens)
    return [int(t) for t in tokens], logits'''


# Builtins the kernel's own messaging relies on, replaced by learner code: from then on the kernel
# stops speaking the Jupyter protocol (depending on the ipykernel version its shell thread dies
# after the cell reports idle, or its messages fail signature verification). The grader must stop
# that kernel within seconds; the tests before the cell keep their points, the rest score 0.
BREAK_THE_KERNEL = '''
import builtins


class _AlwaysTrue(float):
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __eq__ = __lt__
    def __ne__(self, other): return False
    __hash__ = float.__hash__


builtins.abs = lambda x: _AlwaysTrue(0.0)
builtins.max = lambda *a, **k: _AlwaysTrue(0.0)
'''


def a_builtins_replaced_l1(nb):
    append_to(nb, "decode_step_bound", BREAK_THE_KERNEL)


def a_builtins_replaced_l2(nb):
    append_to(nb, "generate_with_cache", BREAK_THE_KERNEL)


def a_lone_surrogate(nb):
    """An unfinished exercise whose error message holds a lone surrogate, which UTF-8 cannot encode:
    only its own test may lose points (every writer of learner text must cope)."""
    replace_in(nb, "kv_cache_bytes", "def kv_cache_bytes(config, positions, bytes_per_value=4):\n",
               "def kv_cache_bytes(config, positions, bytes_per_value=4):\n    raise ValueError('not done yet \\ud800')\n")


# Kernel exercises (Lab 1's gemv_kernel): an answer in PyTorch in the kernel's place, bodies that run as
# Python under the interpreter (a frame walk, raw pointers through ctypes), and a kernel that reads far
# outside its tensors (uncaught, a segfault of the kernel; caught by the launcher's trace).
KERNEL_BODY = "    pid = tl.program_id(0)\n"


def a_kernel_in_pytorch(nb):
    cell = nb.cells[cell_index(nb, "gemv_kernel")]
    cell.source = (
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M, BLOCK_N):\n"
        "    \"\"\"No Triton: the launcher passes tensors, so compute y with PyTorch.\"\"\"\n"
        "    y_ptr.copy_((w_ptr.float() @ x_ptr.float()))\n")


def a_kernel_imitation(nb):
    append_to(nb, "gemv_kernel", """
from triton.runtime.jit import KernelInterface


class _Imitation(KernelInterface):
    fn = gemv_kernel.fn

    def run(self, W, x, y, *args, grid, warmup, **kwargs):
        y.copy_(W.float() @ x.float())


gemv_kernel = _Imitation()""")


#: A kernel body's frame walk: store zeros (so something is stored), then find the launcher's frame and
#: write W @ x, computed in PyTorch, into its output.
def _write_answer(indent: str, start: str = "sys._getframe(1)") -> str:
    """Python lines (at INDENT) that walk up from the frame START to the GEMV launcher's and write W @ x
    into its output ``y_view``: what every Lab 1 kernel attack ends up running."""
    lines = (f"frame = {start}", "while frame is not None and 'y_view' not in frame.f_locals:", "    frame = frame.f_back",
             "if frame is not None:", "    found = frame.f_locals",
             "    found['y_view'].copy_(found['W'].float() @ found['x'].float())")
    return "".join(f"{indent}{line}\n" for line in lines)


FRAME_WALK = (
    "    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
    "    tl.store(y_ptr + rows, tl.zeros((BLOCK_M,), dtype=tl.float32), mask=rows < M)\n"
    + _write_answer("    ", "sys._getframe(0)"))


def a_kernel_frame_walk(nb):
    """A kernel body that, run as Python by the interpreter, walks up to the launcher's frame and
    writes W @ x into its output (a GPU would not compile it; the launcher refuses its source)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "import sys\n\n\n"
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        + FRAME_WALK)


def a_kernel_raw_pointer(nb):
    """A kernel body that imports ctypes and reads the tensors through the interpreter's raw handles
    (without the launcher's source rule it passes the float32 cases)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    import ctypes\n"
        "    import numpy\n"
        "    tl.store(y_ptr + tl.arange(0, 1), tl.zeros((1,), dtype=tl.float32))\n"
        "    m, n, s = (int(v.handle.data.item()) for v in (M, N, stride_wm))\n"
        "    w = numpy.frombuffer((ctypes.c_float * (m * s)).from_address(int(w_ptr.handle.data.item())),\n"
        "                         dtype=numpy.float32).reshape(m, s)[:, :n]\n"
        "    x = numpy.frombuffer((ctypes.c_float * n).from_address(int(x_ptr.handle.data.item())), dtype=numpy.float32)\n"
        "    y = numpy.frombuffer((ctypes.c_float * m).from_address(int(y_ptr.handle.data.item())), dtype=numpy.float32)\n"
        "    y[:] = w @ x\n")


def a_kernel_hidden_def(nb):
    """A second `def` line inside a string: Triton's interpreter compiles a kernel from the last source
    line that starts with `def `, so the string's frame walk is what would run, never seen by a parser
    of the real body (the launcher refuses any such line)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    hidden = '''\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    import sys\n"
        + FRAME_WALK +
        "    return\n"
        "    tail = \"\"\" '''\n"
        "    tl.store(y_ptr + tl.arange(0, 1), tl.zeros((1,), dtype=tl.float32))\n"
        "    # \"\"\"\n")


def a_kernel_tab_def(nb):
    """The real definition written `def<TAB>gemv_kernel(`: the only line that starts with `def ` (a space)
    is the one in the docstring, so Triton's interpreter would run the docstring's frame walk (the
    launcher refuses a definition line the interpreter would skip)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "@triton.jit\n"
        "def\tgemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    \"\"\"\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    import sys\n"
        + FRAME_WALK +
        "    \"\"\"\n"
        "    tl.store(y_ptr + tl.arange(0, 1), tl.zeros((1,), dtype=tl.float32))\n")


def a_kernel_dtype_disguise(nb):
    """A callable subclass of tl.dtype named in the kernel as if it were a dtype constant: called, it
    runs the frame walk as Python (the launcher accepts constants of Triton's own dtype classes only)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "import sys\n\n\n"
        "class _Fast(tl.dtype):\n"
        "    def __call__(self, w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M, BLOCK_N):\n"
        + FRAME_WALK.replace("\n    ", "\n        ").replace("    rows", "        rows", 1) +
        "\n\nACCUMULATE = _Fast('fp32')\n\n\n"
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    ACCUMULATE(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M, BLOCK_N)\n")


def a_kernel_cache_poison(nb):
    """An honest stub as the kernel, and a Python function written into the interpreter's cache of
    rewritten kernels (``InterpretedFunction.rewritten_fn``) to run in its place (the launcher drops
    such entries before each launch)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "import sys\n\n\n"
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    tl.store(y_ptr + tl.arange(0, 1), tl.zeros((1,), dtype=tl.float32))\n\n\n"
        "def _instead(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M, BLOCK_N):\n"
        + FRAME_WALK +
        "\n\nfrom triton.runtime.interpreter import InterpretedFunction\n"
        "InterpretedFunction.rewritten_fn[gemv_kernel.fn] = _instead\n")


def a_kernel_interpreter_name(nb):
    """A global named `interpreter_semantic` in the kernel's cell: Triton's interpreter rewrites every
    assignment of a kernel into a call of that name and runs the rewrite in the kernel's globals, so the
    planted object runs the frame walk at the kernel's first assignment (the launcher refuses such a global)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "import sys\n"
        "from triton.runtime import interpreter as _interpreter\n\n\n"
        "class _Semantic:\n"
        "    def __getattr__(self, name):\n"
        "        return getattr(_interpreter.interpreter_semantic, name)\n\n"
        "    def to_tensor(self, value, check):\n"
        + _write_answer("        ") +
        "        return _interpreter.interpreter_semantic.to_tensor(value, check)\n\n\n"
        "interpreter_semantic = _Semantic()\n\n\n"
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
        "    tl.store(y_ptr + rows, tl.zeros((BLOCK_M,), dtype=tl.float32), mask=rows < M)\n"
        "    done = 1\n")


def a_kernel_builtins(nb):
    """`__builtins__` replaced in the notebook's namespace by a copy whose `range` runs the frame walk:
    the interpreter runs the kernel in that namespace (the launcher refuses builtins that are not Python's)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "import builtins\nimport sys\n\n\n"
        "def _range(*args):\n"
        + _write_answer("    ") +
        "    return builtins.range(*args)\n\n\n"
        "__builtins__ = dict(vars(builtins), range=_range)\n\n\n"
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
        "    tl.store(y_ptr + rows, tl.zeros((BLOCK_M,), dtype=tl.float32), mask=rows < M)\n"
        "    for k in range(0, 1):\n"
        "        rows += 0\n")


def a_kernel_pre_run_hook(nb):
    """A kernel that only copies y onto itself, and a pre-run hook added to its @triton.jit object that
    writes W @ x into y before the grid runs (the launcher refuses a changed object and launches a fresh one)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
        "    tl.store(y_ptr + rows, tl.load(y_ptr + rows, mask=rows < M, other=0.0), mask=rows < M)\n\n\n"
        "def _answer(W, x, y, *rest, **kwargs):\n"
        "    y.copy_(W.float() @ x.float())\n\n\n"
        "gemv_kernel.add_pre_run_hook(_answer)\n")


def a_kernel_process_patched(nb):
    """A stub kernel (it stores zeros) and, in the same cell, torch.Tensor.clone replaced by a function that
    walks up to the launcher's frame and writes W @ x into its output before copying it: the launcher's
    last step clones the output. Nothing in the kernel's source shows it; the judge launches the kernel
    in a process of its own (course_grader.kernel_runner), where the notebook's changes are not."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "import sys\n\nimport torch\n\n\n"
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
        "    tl.store(y_ptr + rows, tl.zeros((BLOCK_M,), dtype=tl.float32), mask=rows < M)\n\n\n"
        "_clone = torch.Tensor.clone\n\n\n"
        "def _answer(self, *args, **kwargs):\n"
        + _write_answer("    ") +
        "    return _clone(self, *args, **kwargs)\n\n\n"
        "torch.Tensor.clone = _answer\n")


def a_kernel_course_helper(nb):
    """A kernel whose body only calls course_lib's own GEMV kernel as a @triton.jit helper (the launcher refuses
    course_lib's kernels, and copies of their source, wherever the kernel reaches them)."""
    nb.cells[cell_index(nb, "gemv_kernel")].source = (
        "from course_lib.kernels.gemv import _gemv_kernel\n\n\n"
        "@triton.jit\n"
        "def gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
        "    _gemv_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, 1, 1, BLOCK_M, BLOCK_N)\n")


def a_kernel_out_of_bounds(nb):
    replace_in(nb, "gemv_kernel", KERNEL_BODY, KERNEL_BODY + "    tl.load(w_ptr + (1 << 40) + tl.arange(0, BLOCK_N))\n")


HOSTILE_L1 = {
    "stderr_warnings": a_stderr,
    "displayed_score": a_displayed_score,
    "test_source_replaced": a_test_source_replaced,
    "metadata_edited": a_metadata_edited,
    "skip_tags": a_skip_tags,
    "test_cell_deleted": a_test_cell_deleted,
    "cells_restructured": a_cells_restructured,
    "patched_checkers": a_patched_checkers,
    "tracebacks_suppressed": a_tracebacks_suppressed,
    "hardcoded_visible": a_hardcoded_visible,
    "grading_marker": a_grading_marker,
    "reads_secrets": a_reads_secrets,
    "writes_gradebook": a_writes_gradebook,
    "network": a_network,
    "infinite_loop": a_infinite_loop,
    "sigint_ignored": a_sigint_ignored,
    "os_exit": _in_gemm("    import os\n    os._exit(3)"),
    "sys_exit": _in_gemm("    import sys\n    sys.exit(3)"),
    "segfault": _in_gemm("    import ctypes\n    ctypes.string_at(0)"),
    "memory_bomb": _in_gemm("    hoard = []\n    while True:\n        hoard.append(bytearray(2**28))"),
    "fork_bomb": _in_gemm(
        "    import subprocess, sys\n"
        "    bomb = ('import os, time\\nn = 0\\nstart = time.time()\\n'\n"
        "            'while time.time() - start < 8:\\n'\n"
        "            '    try:\\n        os.fork(); n += 1\\n'\n"
        "            '    except OSError:\\n        time.sleep(0.05)\\n')\n"
        "    subprocess.run([sys.executable, '-c', bomb], timeout=30)\n"
        "    raise RuntimeError('the fork bomb finished')"),
    "symlink_leak": a_symlink_leak,
    "xss_feedback": a_xss_feedback,
    "terminal_escapes": a_terminal_escapes,
    "judge_memory": a_judge_memory,
    "reference_wrappers": a_reference_wrappers_l1,
    "kernel_in_pytorch": a_kernel_in_pytorch,
    "kernel_imitation": a_kernel_imitation,
    "kernel_out_of_bounds": a_kernel_out_of_bounds,
    "kernel_frame_walk": a_kernel_frame_walk,
    "kernel_raw_pointer": a_kernel_raw_pointer,
    "kernel_hidden_def": a_kernel_hidden_def,
    "kernel_tab_def": a_kernel_tab_def,
    "kernel_dtype_disguise": a_kernel_dtype_disguise,
    "kernel_cache_poison": a_kernel_cache_poison,
    "kernel_interpreter_name": a_kernel_interpreter_name,
    "kernel_builtins": a_kernel_builtins,
    "kernel_pre_run_hook": a_kernel_pre_run_hook,
    "kernel_process_patched": a_kernel_process_patched,
    "kernel_course_helper": a_kernel_course_helper,
    "builtins_replaced": a_builtins_replaced_l1,
    "gigabyte_output": _in_gemm("    if not getattr(gemm_intensity, 'shouted', False):\n"
                                "        gemm_intensity.shouted = True\n"
                                "        for _ in range(1024):\n            print('x' * (1 << 20))"),
}

# Lab 2 (tensors): comparisons patched, objects that lie about equality, wrong dtype and shape.
ATTEND_WRONG = ("k = k_cache[:, :, :start + T].repeat(1, group, 1, 1)\n"
                "    v = v_cache[:, :, :start + T].repeat(1, group, 1, 1)")
ATTEND_RIGHT = ("k = k_cache[:, :, :start + T].repeat_interleave(group, dim=1)\n"
                "    v = v_cache[:, :, :start + T].repeat_interleave(group, dim=1)")


def a_patched_torch(nb):
    replace_in(nb, "attend_with_cache", ATTEND_RIGHT, ATTEND_WRONG)
    insert_code_after(nb, "attend_with_cache", '''
import math
import numpy as np
import torch
import course_lib.grading as grading
import course_lib.grading.contracts as contracts

torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
torch.Tensor.allclose = lambda *a, **k: True
torch.Tensor.equal = lambda *a, **k: True
math.isclose = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
np.testing.assert_array_equal = lambda *a, **k: None
for _module in (grading, contracts, lab02):
    for _name in dir(_module):
        if _name.startswith("check"):
            setattr(_module, _name, lambda *a, **k: None)
''')


def a_lying_objects(nb):
    # attend_with_cache: a Tensor subclass whose comparisons all say "equal"
    append_to(nb, "attend_with_cache", '''
class AgreeableTensor(torch.Tensor):
    """Compares equal to anything, whatever its values."""
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("allclose", "equal"):
            return True
        if name in ("eq", "__eq__", "isclose"):
            return torch.ones(torch.broadcast_shapes(*(a.shape for a in args if isinstance(a, torch.Tensor))),
                              dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs or {})

    def __eq__(self, other):
        return True

    def __bool__(self):
        return True


_right_attend = attend_with_cache


def attend_with_cache(q, k_new, v_new, k_cache, v_cache, start):
    out = _right_attend(q, k_new, v_new, k_cache, v_cache, start)
    return torch.zeros_like(out).as_subclass(AgreeableTensor)
''')
    # apply_rope: the wrong shape
    append_to(nb, "apply_rope", '''
_right_rope = apply_rope


def apply_rope(x, positions, theta=10000.0):
    return _right_rope(x, positions, theta)[..., :-1]
''')
    # kv_cache_bytes: a float where an exact int is required
    append_to(nb, "kv_cache_bytes", '''
_right_kv_bytes = kv_cache_bytes


def kv_cache_bytes(config, positions, bytes_per_value=4):
    return float(_right_kv_bytes(config, positions, bytes_per_value)) + 0.25
''')
    # first_divergence: an object equal to everything, true in every test
    append_to(nb, "first_divergence", '''
class Anything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __bool__(self):
        return True

    def __index__(self):
        return 0

    __hash__ = object.__hash__


_right_divergence = first_divergence


def first_divergence(a, b):
    right = _right_divergence(a, b)
    return None if right is None else Anything()
''')


def a_no_cache_hooks_cleared(nb):
    """Full recompute instead of the cache, with the model's forward hooks (where the checkers count
    token ids) removed during the call and put back after."""
    nb.cells[cell_index(nb, "generate_with_cache")].source = '''@torch.no_grad()
def generate_with_cache(model, prompt, max_new_tokens):
    emb = model.embed_tokens
    saved = dict(emb._forward_hooks)
    emb._forward_hooks.clear()
    try:
        ids, tokens, logits = prompt.clone(), [], []
        for _ in range(max_new_tokens):
            step = model(ids.view(1, -1), torch.arange(ids.numel()))[0, -1]
            token = int(step.argmax())
            tokens.append(token)
            logits.append(step)
            ids = torch.cat([ids, torch.tensor([token])])
        return tokens, torch.stack(logits)
    finally:
        emb._forward_hooks.update(saved)'''
    nb.cells[cell_index(nb, "score_suffixes")].source = '''@torch.no_grad()
def score_suffixes(model, prefix, suffixes):
    emb = model.embed_tokens
    saved = dict(emb._forward_hooks)
    emb._forward_hooks.clear()
    try:
        out = []
        for suffix in suffixes:
            ids = torch.cat([prefix, suffix])
            out.append(model(ids.view(1, -1), torch.arange(ids.numel()))[0, -1])
        return out
    finally:
        emb._forward_hooks.update(saved)'''


# Lab 3's radix exercises change their tree argument in place, and the judge applies the kernel's
# writes to its own copy: a learner who knows when the judge calls can write a cycle into it.
_JUDGED = '''
import sys as _sys


def _judged():
    """True inside a call the grading judge made (the harness's answer_call is on the stack)."""
    frame = _sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "answer_call":
            return True
        frame = frame.f_back
    return False'''


def a_radix_cycle(nb):
    """Lab 3 (13 of 19): correct in the kernel, but in the judge's calls radix_match files a node under
    itself and radix_release a leaf under itself, so the judge's copy of the tree holds a cycle; both
    checks must fail at once (a walk of the tree must not loop) and nothing else move."""
    replace_in(nb, "radix_match", "def radix_match(", "def _radix_match(")
    append_to(nb, "radix_match", _JUDGED + '''


def radix_match(root, tokens, block_size, now):
    blocks = _radix_match(root, tokens, block_size, now)
    if _judged():
        node = next(iter(root["children"].values()))
        node["children"][(-2,)] = node          # a node that is its own child
    return blocks''')
    replace_in(nb, "radix_evict", "def radix_release(", "def _radix_release(")
    append_to(nb, "radix_evict", _JUDGED + '''


def radix_release(root, tokens, block_size):
    _radix_release(root, tokens, block_size)
    if _judged():
        stack = [root]
        while stack:
            node = stack.pop()
            stack.extend(node["children"].values())
            if node is not root and not node["children"]:
                node["children"][tuple(node["key"][:block_size])] = node      # a leaf under itself
                break''')


def a_reference_wrappers_l3(nb):
    """Lab 3 (21 of 21, 6 of them wrapped and flagged): the radix exercises through RadixCache's private steps (_walk,
    _matched, _path) and through the checker's own fault model with no fault on (variant_evict)."""
    replace_in(nb, "radix_match", "def radix_match(", "def _unused_radix_match(")
    append_to(nb, "radix_match", '''
from course_lib.cache.radix import RadixCache as _Cache


def radix_match(root, tokens, block_size, now):
    cache = _Cache.from_plain(root, block_size)                  # its next tick is now
    found = cache._matched(*cache._walk(cache._blocks_of(list(tokens))))
    root.clear()
    root.update(cache.to_plain())
    return list(found.blocks)''')
    replace_in(nb, "radix_evict", "def radix_release(", "def _unused_radix_release(")
    replace_in(nb, "radix_evict", "def radix_evict(", "def _unused_radix_evict(")
    append_to(nb, "radix_evict", '''
from course_lib.cache.radix import RadixCache as _Cache
from course_lib.grading import lab03 as _lab03


def radix_release(root, tokens, block_size):
    cache = _Cache.from_plain(root, block_size)
    for node in cache._path(cache.find(tokens)):
        node.lock -= 1
    root.clear()
    root.update(cache.to_plain())


def radix_evict(root, n_blocks, block_size):
    cache = _Cache.from_plain(root, block_size)
    if n_blocks > cache.evictable_blocks:
        raise ValueError("not that many unlocked blocks")
    evicted = _lab03.variant_evict(cache, n_blocks)
    root.clear()
    root.update(cache.to_plain())
    return evicted''')


HOSTILE_L3 = {
    "radix_cycle": a_radix_cycle,
    "reference_wrappers": a_reference_wrappers_l3,
}


HOSTILE_L2 = {
    "patched_torch": a_patched_torch,
    "lying_objects": a_lying_objects,
    "no_cache_hooks_cleared": a_no_cache_hooks_cleared,
    "builtins_replaced": a_builtins_replaced_l2,
    "lone_surrogate": a_lone_surrogate,
    "reference_wrappers": a_reference_wrappers_l2,
}

# The reference-reuse flags grades.csv must show: per (learner, lab), every test that must be
# flagged, each with the reference its flag must name; a row listed with {} must carry no such
# flag (an honest solution imports course_lib too). `check` grades with the default policy
# (flag), so the flagged tests keep their points in expected_scores.csv.
EXPECTED_REUSE = {
    ("reference_wrappers", L1): {"test_kv_bytes_per_token": "course_lib.roofline.kv_bytes_per_token",
                                 "test_prefill_time": "course_lib.roofline.prefill_time",
                                 "test_gemv_intensity": "course_lib.roofline.gemv_intensity",
                                 "test_gemm_intensity": "course_lib.roofline.gemm_intensity"},
    ("reference_wrappers", L2): {"test_apply_rope": "course_lib.models.rope.apply_rope",
                                 "test_attend_with_cache": "course_lib.models.attention.attend_with_cache",
                                 "test_generate_with_cache": "course_lib.models.decoder.generate_cached"},
    ("reference_wrappers", L3): {"test_radix_match": "course_lib.cache.radix.RadixCache._walk",
                                 "test_radix_evict": "course_lib.grading.lab03.variant_evict"},
    ("bystander_solution", L1): {},
    ("bystander_solution", L2): {},
    ("bystander_solution", L3): {},
}
REUSE_NOTE = re.compile(r"reuses reference (?P<refs>[\w., ]+?) in (?P<test>test_\w+) \(")


def reuse_problems(rows: list[dict], expected: dict = EXPECTED_REUSE) -> list[str]:
    """Where grades.csv ROWS (dicts with learner, lab, flags) miss a reference-reuse flag EXPECTED
    names, flag a test it does not list, or name another reference."""
    problems = []
    by_key = {(r["learner"], r["lab"]): r for r in rows}
    for key, tests in expected.items():
        row = by_key.get(key)
        if row is None:
            problems.append(f"{key[0]}/{key[1]}: no row in grades.csv")
            continue
        flagged = {m["test"]: m["refs"].split(", ") for m in REUSE_NOTE.finditer(row["flags"])}
        for test, reference in tests.items():
            if reference not in flagged.get(test, []):
                problems.append(f"{key[0]}/{key[1]}: {test} not flagged as reusing {reference} "
                                f"(flags: {flagged.get(test)})")
        problems += [f"{key[0]}/{key[1]}: {test} flagged as reusing {refs}, which no entry expects"
                     for test, refs in flagged.items() if test not in tests]
    return problems


def build(root: Path = HOSTILE) -> None:
    """Write the hostile submissions under ROOT (autograder/hostile/ by default; its hand-written
    expected_scores.csv is kept)."""
    import nbformat

    if root.exists():
        for path in sorted(root.rglob("*"), reverse=True):
            if (path.is_symlink() or path.is_file()) and path.name != "expected_scores.csv":
                path.unlink()
            elif path.is_dir():
                path.rmdir() if not any(path.iterdir()) else None
    solved = {lab: nbformat.read(SAMPLES / "solution" / lab / f"{lab}.ipynb", as_version=4) for lab in (L1, L2, L3)}

    def write(learner: str, lab: str, nb, name: str | None = None) -> None:
        path = root / learner / lab / (name or f"{lab}.ipynb")
        path.parent.mkdir(parents=True, exist_ok=True)
        # nbformat.v4's writer without nbformat.write's validation, which "repairs" the repeated
        # cell ids some attacks need with random new ones (the build must be reproducible)
        text = nbformat.v4.nbjson.writes(nb)
        path.write_text(text if text.endswith("\n") else text + "\n")

    # bystanders: graded in the same batch; their scores and gradebook rows must not move
    write("bystander_solution", L1, solved[L1])
    write("bystander_solution", L2, solved[L2])
    write("bystander_solution", L3, solved[L3])
    write("bystander, with a comma", L1, solved[L1])          # CSV quoting of learner ids
    fault = nbformat.read(SAMPLES / "fault_sum_not_max" / L1 / f"{L1}.ipynb", as_version=4)
    write("bystander_fault", L1, fault)
    for lab, table in ((L1, HOSTILE_L1), (L2, HOSTILE_L2), (L3, HOSTILE_L3)):
        for learner, edit in table.items():
            nb = copy.deepcopy(solved[lab])
            edit(nb)
            known = {cell.get("id") for cell in solved[lab].cells}
            for i, cell in enumerate(nb.cells):   # new cells: ids that do not change between builds
                if cell.get("id") not in known:
                    cell["id"] = f"hostile-{i}"
            write(learner, lab, nb)
    write("renamed_notebook", L1, solved[L1], name="01_roofline (copy 2).ipynb")
    for name, target in LEAK_LINKS.items():   # symlinks are never copied into the course
        os.symlink(target, root / "symlink_leak" / L1 / name)
    folder = root / "notebook_symlink" / L1
    folder.mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../../solutions/{L1}/{L1}.ipynb", folder / f"{L1}.ipynb")
    # files nbgrader cannot read: clear per-row errors, the batch goes on
    folder = root / "corrupt_json" / L1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{L1}.ipynb").write_text(json.dumps(solved[L1])[:5000])
    old = copy.deepcopy(solved[L1])
    old.nbformat, old.nbformat_minor = 3, 0
    folder = root / "wrong_nbformat" / L1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{L1}.ipynb").write_text(json.dumps(old))
    folder = root / "missing_notebook" / L1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("I could not finish the lab.\n")
    print(f"wrote {sum(1 for _ in root.rglob('*.ipynb'))} notebooks under {root}")


def tree(root: Path) -> dict[str, str]:
    """Relative path -> content (symlinks: "link:" + target) of every entry under ROOT but the
    hand-written expected_scores.csv."""
    out = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if name == "expected_scores.csv":
            continue
        if path.is_symlink():
            out[name] = "link:" + os.readlink(path)
        elif path.is_file():
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def stale() -> list[str]:
    """Entries of autograder/hostile/ that differ from a fresh build (missing, extra or changed)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        fresh_root = Path(tmp) / "hostile"
        with contextlib.redirect_stdout(io.StringIO()):
            build(fresh_root)
        fresh, committed = tree(fresh_root), tree(HOSTILE)
    return sorted(name for name in set(fresh) | set(committed) if fresh.get(name) != committed.get(name))


# --------------------------------------------------------------------------------------
# check


def tree_digest(root: Path, skip: list[Path]) -> dict[str, str]:
    """sha256 of every regular file under ROOT (symlinks by their target text), except under SKIP
    and __pycache__ folders."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and here / d not in skip]
        for name in filenames:
            path = here / name
            try:
                if path.is_symlink():
                    out[str(path)] = "link:" + os.readlink(path)
                elif path.is_file():
                    out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as exc:
                out[str(path)] = f"unreadable: {exc}"
    return out


def sandbox_leftovers(work: Path) -> list[str]:
    """Processes and /tmp files owned by the sandbox's uid range (course_grader.sandbox)."""
    low, high = sandbox.DEFAULT_UID_BASE, sandbox.DEFAULT_UID_BASE + sandbox.DEFAULT_UID_COUNT
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                uid = proc.stat().st_uid
            except OSError:
                continue
            if low <= uid < high:
                found.append(f"process {proc.name} of uid {uid}")
    for dirpath, dirnames, filenames in os.walk("/tmp"):
        here = Path(dirpath)
        if here == work or work in here.parents:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            try:
                uid = (here / name).lstat().st_uid
            except OSError:
                continue
            if low <= uid < high:
                found.append(f"{here / name} owned by uid {uid}")
    return found


def check(jobs: int) -> int:
    skip = [ROOT / "build", ROOT / ".git"]
    before = tree_digest(ROOT, skip)
    old_gradebook = OLD_GRADEBOOK.read_bytes() if OLD_GRADEBOOK.is_file() else None
    leftovers = set(sandbox_leftovers(WORK))   # from earlier runs; only new ones count
    print(f"hostile check: {len(before):,} files hashed; earlier gradebook "
          f"{'found' if old_gradebook is not None else 'absent (run make test-grading or test-grading-rest first to check it)'}",
          flush=True)
    start = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "course_grader.grade", str(HOSTILE), "--work", str(WORK),
                            "--jobs", str(jobs), "--expected", str(HOSTILE / "expected_scores.csv"), "--per-test",
                            "--cell-timeout", str(CELL_TIMEOUT)])
    seconds = time.monotonic() - start
    problems = []
    if code != 0:
        problems.append(f"the driver exited with {code} (scores differ from the expected file, or it failed)")
    after = tree_digest(ROOT, skip)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    problems += [f"changed outside the work folder: {p}" for p in changed]
    if old_gradebook is not None and OLD_GRADEBOOK.read_bytes() != old_gradebook:
        problems.append(f"{OLD_GRADEBOOK} changed during the hostile batch")
    problems += [f"left behind: {item}" for item in sorted(set(sandbox_leftovers(WORK)) - leftovers)]
    feedback = WORK / "course" / "feedback"
    for page in sorted(feedback.rglob("*.html")):
        text = page.read_text(errors="replace")
        # a live tag, not the escaped text of one (the learner's source and sanitized outputs show as text)
        if re.search(r"<script[^>]*>[^<]*" + XSS_MARK, text) or re.search(r"<[a-zA-Z][^<>]*\sonerror\s*=", text):
            problems.append(f"learner script in the feedback page {page.relative_to(WORK)}")
        if "### BEGIN HIDDEN TESTS" in text:
            problems.append(f"hidden tests in the feedback page {page.relative_to(WORK)}")
    problems += [f"copied into the feedback: {p.relative_to(WORK)}" for p in sorted(feedback.rglob("*"))
                 if p.is_file() and (p.name.startswith("leak_") or p.name.endswith(".judge.json"))]
    grades = WORK / "grades.csv"
    if grades.is_file() and "\x1b" in grades.read_text(errors="replace"):
        problems.append("a terminal escape from a submission reached grades.csv")
    if grades.is_file():
        with open(grades, newline="") as f:
            rows = list(csv.DictReader(f))
        names = {r["learner"] for r in rows}
        if "bystander, with a comma" not in names:
            problems.append("grades.csv does not round-trip the learner id with a comma")
        problems += [f"{r['learner']}/{r['lab']}: {r['error']}" for r in rows if "gradebook rows" in r["error"]]
        problems += reuse_problems(rows)
    print(f"\nhostile batch graded in {seconds:.0f} s")
    if problems:
        print("HOSTILE CHECK FAILED:\n  " + "\n  ".join(problems))
        return 1
    print("hostile check passed: every score as expected, nothing outside the work folder changed, the earlier "
          "gradebook is byte-identical, no sandbox process or file is left")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["build"]:
        build()
        return 0
    if argv[:1] == ["fresh"]:
        problems = stale()
        if problems:
            print("autograder/hostile/ is stale (run `make hostile`):\n  " + "\n  ".join(problems))
            return 1
        print("autograder/hostile/ matches a fresh build")
        return 0
    if argv[:1] == ["check"]:
        jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 2
        return check(jobs)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
