#!/usr/bin/env python
"""Grade a folder of lab submissions with stock nbgrader, in parallel, into a CSV.

    python -m course_grader.grade SUBMISSIONS [--jobs N | --cluster ADDRESS] [--work DIR] [--expected FILE]
                               [--learners A,B] [--learner NAME] [--labs L] [--regrade] [--per-test] [--root DIR]
                               [--cell-timeout S] [--submission-timeout S] (--help lists the rest)

SUBMISSIONS is laid out like nbgrader's ``submitted`` folder, ``{learner}/{lab}/{lab}.ipynb``. Nothing
under it, ``solutions/`` or ``labs/`` is modified; the work folder (default ``build/grading/``,
emptied at each run) holds ``course/`` (a complete nbgrader course built from copies: stock commands
work in it; its ``gradebook.db`` gets every grade, ``feedback/`` the pages), ``shards/NNNN/`` (one
small course per submission, where ``nbgrader autograde --student`` runs), ``logs/``, and the tables
``grades.csv`` (learner, lab, score, max_score, raw_score, penalty, late, timestamp, deadline, error, seed,
judge_flags, flags, sandbox; score = raw_score - penalty, course_grader.late),
``judge_disagreements.csv``, ``timings.csv``, ``similarity.csv`` (pairs of learners whose exercise cells
are near copies: ``course_grader.similarity``; a flag, never a score), ``run.json`` and, with ``--per-test``,
``grades_per_test.csv``; beside each feedback page, the instructor's ``report.json`` (``submission_report``).
``--regrade`` grades only the named learners' rows into the previous run's work folder, in ``regrade/``,
and replaces just their lines, gradebook entries, pages and reports.

What it defends against: one submission's crash, hang, dead kernel, corrupt or renamed notebook,
edited graded cells, links to files outside it, or learner id nbgrader cannot use costs only its own
row (an error or a flag); learner code runs in the sandbox (``course_grader.sandbox``) and is judged
outside its kernel (``course_grader.judge``); a shard's autograde may change no gradebook row but its
own learner's; parallel autogrades never share the sqlite gradebook (nbgrader turns "database is
locked" into a failed run), so scores do not depend on ``--jobs``; SIGTERM/SIGINT kill every running
nbgrader process group. What it does not: a submission that grades slowly within its limits slows the
batch; ``--unsafe-no-sandbox`` runs learner code as this user (every output says so).

Exit status: 0 done (rows may carry errors); 1 the scores differ from --expected; 2 grading could not
run (a set-up, folder or option problem: the message on stderr says which).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import judge, lms, provenance, sandbox, warm
from . import term as term_mod
from .config import WORK_FOLDERS
from .paths import BASE_CONFIG, REPO_ROOT
from .term import TermError
from .text import ANSI, encodable, encodable_tree, printable

WORK_MARKER = ".grading-work"  # marks a folder this driver may empty
NOT_SUBMITTED = "not submitted"  # the error of a (learner, lab) pair with no notebook
TOTAL = "total"  # the `cell` value that means a notebook's total in --expected files
GLOB_CHARS = set("*?[]")
EXIT_OK, EXIT_MISMATCH, EXIT_INFRA = 0, 1, 2
SCORE_TOLERANCE = 1e-6
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")  # math libraries' thread counts
# "nbclient.exceptions.DeadKernelError: Kernel died" and the like, at the end of a traceback
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: .*)?$")
GENERIC_ERRORS = ("There was an error processing", "Please see the")


class InfrastructureError(RuntimeError):
    """The grading machinery (not a learner's submission) failed."""


class Stopped(InfrastructureError):
    """SIGTERM or SIGINT reached the driver: running nbgrader processes were killed."""


# nbgrader processes running now (each the leader of its own process group: a Popen, or a
# multiprocessing Process forked by course_grader.warm), and whether a SIGTERM/SIGINT asked the
# driver to stop; see stop_on_signals().
RUNNING: set = set()
STOPPING = threading.Event()


@dataclass
class Submission:
    """One (learner, lab) pair and what became of it."""

    learner: str
    lab: str
    folder: Path | None = None  # SUBMISSIONS/{learner}/{lab}, when present
    error: str = ""  # validation or grading error shown in the table
    score: float = 0.0
    max_score: float = math.nan
    cells: list[dict] = field(default_factory=list)  # per graded cell, from the gradebook
    comments: list[dict] = field(default_factory=list)  # nbgrader's auto comments per solution cell
    seconds: float = 0.0
    graded: bool = False  # nbgrader autograde finished and the scores are real
    shard: Path | None = None  # the course copy it was graded in
    timestamp: object = None  # submission time nbgrader read from timestamp.txt, if any
    penalty: float = 0.0  # late-submission penalty nbgrader charged (course_grader.late), in points
    seconds_late: float = 0.0  # past the deadline, extension included (0: on time or no deadline)
    deadline: object = None  # the deadline it was checked against (extension included), if the lab has one
    notebook_penalties: dict = field(default_factory=dict)  # nbgrader's late_submission_penalty per notebook
    seed: int | None = None  # COURSE_GRADING_SEED its hidden tests ran with
    judge_seed: int | None = None  # COURSE_JUDGE_SEED of the judge (never inside the kernel)
    judge_flags: list[dict] = field(default_factory=list)  # cells where the kernel and the judge disagreed
    notebook: str = ""  # the submitted file's name when it is not {lab}.ipynb (graded under that name)
    tampering: list[str] = field(default_factory=list)  # changes to locked/graded cells, undone before grading
    skipped: list[str] = field(default_factory=list)  # symlinks and special files left out of the copy
    reuse: list[str] = field(default_factory=list)  # reference reuse, code that may hide it (provenance.flag_notes)
    graded_on: str = ""  # the cluster worker's host that graded it ("" on this machine)
    speeds: dict[str, str] = field(default_factory=dict)  # kernel cells' speed, by grade_id (judge.kernel_speed)


# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m course_grader.grade",
                                     description="Autograde SUBMISSIONS/{learner}/{lab}/{lab}.ipynb with nbgrader.")
    parser.add_argument("submissions", type=Path, help="folder laid out as {learner}/{lab}/{lab}.ipynb")
    parser.add_argument("--jobs", "-j", type=int, default=1,
                        help="submissions graded at once (default 1; make grade passes JOBS, default 2)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="course root holding solutions/ (default: this repository)")
    parser.add_argument("--work", type=Path, help="work folder, emptied first (default: ROOT/build/grading)")
    parser.add_argument("--expected", type=Path, help="CSV learner,lab,score[,cell]; exit 1 when a score differs")
    parser.add_argument("--per-test", action="store_true", help="print and write the score of every graded cell")
    parser.add_argument("--cell-timeout", type=int, help="seconds per cell (default: the config's Execute.timeout)")
    parser.add_argument("--seed", type=int,
                        help="run seed for the hidden tests (default: a fresh random one, printed); each "
                             "submission gets COURSE_GRADING_SEED derived from it, its learner id and lab")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="grade even where the sandbox (bubblewrap) is unavailable, running learner code "
                             "as this user with this machine's access; every output says so")
    parser.add_argument("--reference-reuse", choices=("flag", "zero"), default=None,
                        help="a test whose learner functions reach course_lib's reference for that exercise: "
                             "'flag' lists it in the flags column, 'zero' also scores it 0 (default: the course "
                             "config's CourseJudge.reference_reuse, which is 'flag')")
    parser.add_argument("--learners", metavar="NAME[,NAME...]", default=None,
                        help="grade only these learners' folders (comma-separated); --expected then checks only "
                             "their rows")
    parser.add_argument("--learner", metavar="NAME", action="append", default=None,
                        help="also grade this learner's folder, its name taken whole (for a name with a comma); "
                             "may be repeated, and goes with --learners")
    parser.add_argument("--labs", metavar="LAB[,LAB...]", default=None,
                        help="grade only these labs (comma-separated folder names, e.g. 01_roofline); --expected "
                             "then checks only their rows")
    parser.add_argument("--cluster", metavar="ADDRESS", default=None,
                        help="grade on the Dask scheduler at ADDRESS (tcp://host:8786, or a scheduler file .json), one "
                             "task per submission; the workers need this commit's checkout with `make setup model "
                             "sandbox` (course_grader.cluster); without it, --jobs grades on this machine")
    parser.add_argument("--submission-timeout", type=int, default=3600,
                        help="seconds for one submission's autograde before it is killed (default 3600)")
    parser.add_argument("--course", type=Path, default=None,
                        help="the course file (default: ROOT/autograder/course.toml); with a roster in it, the run "
                             "also writes gradebook.csv and canvas_gradebook.csv (course_grader.lms)")
    parser.add_argument("--cold-start", action="store_true",
                        help="start a new `python -m nbgrader` for each command instead of forking it from the "
                             "process that imported nbgrader, torch and the checkers once (course_grader.warm): "
                             "about 3.5 s more per submission, the same scores and feedback; for timing comparisons "
                             "(where no fork server can run, or on --cluster workers, grading runs this way by itself)")
    parser.add_argument("--regrade", action="store_true",
                        help="regrade only the --learners/--learner (and --labs) given into the previous run in "
                             "--work: their rows, gradebook entries, feedback and report.json are replaced, every "
                             "other learner's left as they are; the previous run's seed unless --seed is given")
    parser.add_argument("--no-similarity", action="store_true",
                        help="do not compare the learners' exercise cells (course_grader.similarity); the Makefile's "
                             "sample targets use it: the samples are copies of the solution by construction")
    parser.add_argument("--similarity-threshold", type=float, default=None, metavar="T",
                        help="flag pairs of learners whose exercise cells reach this similarity, 0 < T <= 1 (default: "
                             "the course file's [similarity] threshold, else 0.8); never a score change")
    args = parser.parse_args(argv)
    if args.regrade and args.learners is None and args.learner is None:
        parser.error("--regrade needs --learners or --learner: the learners whose rows are regraded")
    if args.similarity_threshold is not None:
        try:
            term_mod.check_threshold(args.similarity_threshold, "--similarity-threshold")
        except TermError as exc:
            parser.error(str(exc))
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.cluster is not None and args.jobs != 1:
        parser.error("--cluster and --jobs do not go together: the cluster's workers decide how many run at once")
    if args.cluster is not None:
        if args.cluster.endswith(".json"):
            if not Path(args.cluster).is_file():
                parser.error(f"--cluster {args.cluster}: no such scheduler file")
        elif not re.match(r"^(tcp|tls|inproc|ucx)://[^/]+$", args.cluster):
            parser.error(f"--cluster {args.cluster!r}: give the scheduler's address (tcp://HOST:PORT, "
                         "tls://HOST:PORT) or a scheduler file (.json)")
    args.root = args.root.resolve()
    args.submissions = args.submissions.resolve()
    args.work = (args.work or args.root / "build" / "grading").resolve()
    args.seed_given = args.seed is not None   # --regrade takes the previous run's seed otherwise
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    if args.learners is not None or args.learner is not None:
        args.learners = _names(args.learners or "", args.learner or [])
        if not args.learners:
            parser.error("--learners/--learner needs at least one name")
    if args.labs is not None:
        args.labs = _names(args.labs)
        if not args.labs:
            parser.error("--labs needs at least one lab")
    return args


def _names(comma_list: str, whole: list[str] = ()) -> list[str]:
    """The items of a comma-separated option, each stripped, then the names WHOLE, without empty
    ones and repeats, in order."""
    return list(dict.fromkeys(name for name in [*(p.strip() for p in comma_list.split(",")), *whole] if name))


def submission_seed(run_seed: int, learner: str, lab: str, label: str = "") -> int:
    """The hidden-test seed of one submission: 32 bits of sha256(run seed, learner, lab), so every
    submission gets its own inputs and ``--seed RUN_SEED`` replays them (the seed is in grades.csv).
    LABEL="judge" gives the judge's base seed, passed as COURSE_JUDGE_SEED, which the sandbox never
    passes into the kernel (nor does the kernel's seed give it back): learner code cannot predict it."""
    return judge.sha256_seed(run_seed, learner, lab, *([label] if label else []))


# Finding and validating submissions


def learner_id_problem(learner: str) -> str:
    """Why nbgrader cannot use this folder name as a student id ('' when it can)."""
    if learner != learner.strip():
        return "learner id has leading/trailing whitespace (nbgrader strips it)"
    if GLOB_CHARS & set(learner):
        return "learner id contains a glob character (* ? [ ]), which nbgrader's --student treats as a pattern"
    if any(ord(ch) < 32 for ch in learner):
        return "learner id contains a control character"
    if encodable(learner) != learner:
        return "learner id is not UTF-8 text (its folder name has bytes UTF-8 cannot decode)"
    return ""


def submitted_notebook(folder: Path, lab: str) -> tuple[Path | None, str]:
    """The notebook to grade in SUBMISSIONS/{learner}/{lab}: ``{lab}.ipynb``, else the one and only
    other ``*.ipynb`` there (a renamed notebook: graded, and flagged in the table); returns
    (path, '') or (None, why)."""
    path = folder / f"{lab}.ipynb"
    if path.is_file() or path.is_symlink():
        return path, ""
    others = sorted(p for p in folder.glob("*.ipynb") if p.is_file() or p.is_symlink())
    if len(others) == 1:
        return others[0], ""
    found = (f"; found {', '.join(p.name for p in others)} (rename the one to grade)" if others
             else "; no notebook in the folder")
    return None, f"missing {lab}.ipynb{found}"


def notebook_problem(folder: Path, lab: str) -> str:
    """Check the notebook of SUBMISSIONS/{learner}/{lab}; return '' if nbgrader can read it."""
    path, why = submitted_notebook(folder, lab)
    if path is None:
        return why
    if path.is_symlink():
        return f"{path.name} is a symbolic link; submit the notebook file itself"
    try:
        nb = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        return f"{path.name} is not UTF-8 text: {exc}"
    except json.JSONDecodeError as exc:
        return f"{path.name} is not valid JSON: {exc}"
    except RecursionError:
        return f"{path.name} is JSON nested too deep to read"
    if not isinstance(nb, dict):
        return f"{path.name} is JSON but not a notebook (top level is {type(nb).__name__})"
    if nb.get("nbformat") != 4:
        return f"{path.name} has nbformat {nb.get('nbformat')!r}, expected 4"
    cells = nb.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, dict) and "cell_type" in c for c in cells):
        return f"{path.name} has no valid cell list"
    return ""


def _plain(path: str | Path) -> bool:
    """Whether PATH is a regular file or folder (not a symlink, fifo, device... nor unreadable)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


def links_and_special_files(folder: Path) -> list[str]:
    """Paths under FOLDER (relative) that are symlinks or not regular files/folders. They are not
    copied into the course: nbgrader would follow a link (to solutions, the gradebook, /etc/...)
    when it copies the submission, and hand what it points to to the kernel and the feedback."""
    return sorted(str((Path(dirpath) / name).relative_to(folder))
                  for dirpath, dirnames, filenames in os.walk(folder, followlinks=False)
                  for name in dirnames + filenames if not _plain(Path(dirpath) / name))


def copy_ignoring_links(folder: str, names: list[str]) -> set[str]:
    """shutil.copytree ignore function: skip symlinks, special files and editor/cache debris."""
    return {name for name in names if not _plain(os.path.join(folder, name)) or name.endswith(".pyc")
            or name in (".ipynb_checkpoints", "__pycache__")}


def known_labs(root: Path) -> set[str]:
    """Labs with an nbgrader source notebook: ROOT/solutions/{lab}/{lab}.ipynb."""
    if not (root / "solutions").is_dir():
        raise InfrastructureError(f"no solutions/ folder under the course root {root}")
    return set(term_mod.course_labs(root))


def find_submissions(submissions: Path, labs_available: set[str], only: list[str] | None = None,
                     only_labs: list[str] | None = None) -> list[Submission]:
    """One Submission per (learner, lab) for every lab anyone submitted; bad ones carry an error.

    A learner without a folder for a lab that others submitted gets a row with the
    error "not submitted" and score 0. ONLY (``--learners``) keeps just those learners' folders;
    a name with no folder is an InfrastructureError. ONLY_LABS (``--labs``) keeps just those labs;
    one that is not a lab of the course (ROOT/solutions/) is an InfrastructureError.
    """
    if not submissions.is_dir():
        raise InfrastructureError(f"submissions folder {submissions} does not exist")
    def folders(path: Path) -> list[Path]:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))

    learners = folders(submissions)
    if only is not None:
        absent = sorted(set(only) - {p.name for p in learners})
        if absent:
            raise InfrastructureError(f"--learners names no folder in {submissions}: {', '.join(absent)}")
        learners = [p for p in learners if p.name in only]
    if not learners:
        raise InfrastructureError(f"no learner folders in {submissions}")
    labs = sorted({lab.name for learner in learners for lab in folders(learner)})
    if only_labs is not None:
        unknown = sorted(set(only_labs) - labs_available)
        if unknown:
            raise InfrastructureError(f"--labs names no lab of the course: {', '.join(unknown)} "
                                      f"(the labs: {', '.join(sorted(labs_available))})")
        labs = [lab for lab in labs if lab in only_labs]
    if not labs:
        which = f" for --labs {','.join(only_labs)}" if only_labs is not None else ""
        raise InfrastructureError(f"no lab folders{which} in {submissions} (expected {{learner}}/{{lab}}/{{lab}}.ipynb)")
    rows = []
    for learner in learners:
        for lab in labs:
            row = Submission(learner.name, lab, folder=learner / lab)
            if lab not in labs_available and not row.folder.is_dir():
                continue  # a misnamed lab folder of another learner: no "not submitted" row for it
            if row.folder.is_symlink():
                row.error = f"{lab} is a symbolic link; submit the folder itself"
            elif not row.folder.is_dir():
                row.folder, row.error = None, NOT_SUBMITTED
            elif lab not in labs_available:
                row.error = f"unknown lab: no solutions/{lab}/{lab}.ipynb"
            else:
                row.error = learner_id_problem(learner.name) or notebook_problem(row.folder, lab)
                if not row.error:
                    name = submitted_notebook(row.folder, lab)[0].name
                    row.notebook = "" if name == f"{lab}.ipynb" else name
                    row.skipped = links_and_special_files(row.folder)
            rows.append(row)
    return rows


# Work folder and nbgrader processes


def prepare_work(work: Path, root: Path, submissions: Path) -> None:
    """Empty (or create) the work folder, refusing any folder that is not ours to empty."""
    for path in (root / "solutions", root / "labs", submissions):
        if work.is_relative_to(path):
            raise InfrastructureError(f"work folder {work} is inside {path}; choose another --work")
    for path in (root, root / "solutions", root / "labs", submissions):
        if path.is_relative_to(work):
            raise InfrastructureError(f"work folder {work} contains {path}; choose another --work")
    if work.exists():
        if any(work.iterdir()) and not (work / WORK_MARKER).exists():
            raise InfrastructureError(
                f"{work} exists, is not empty and was not made by this driver; remove it or choose another --work")
        shutil.rmtree(work)
    (work / "logs").mkdir(parents=True)
    (work / WORK_MARKER).write_text("made by course_grader.grade; emptied at every run\n")


def check_sandbox(allow_unsafe: bool) -> str:
    """The sandbox's gate (``sandbox.require_sandbox``: '' or, with ALLOW_UNSAFE, the warning to
    print), then, sandboxed, ``check_kernel_course_lib``; InfrastructureError when either refuses."""
    try:
        unsafe = sandbox.require_sandbox(allow_unsafe=allow_unsafe)
    except sandbox.SandboxUnavailableError as exc:
        raise InfrastructureError(f"{exc} (make sandbox installs it; the flag is --unsafe-no-sandbox)") from None
    if not unsafe:
        check_kernel_course_lib()
    return unsafe


def check_kernel_course_lib() -> None:
    """Refuse to grade when a sandboxed Python does not import the course_lib this driver (and so
    the judge) imports: in a mixed set-up (this checkout's driver, another checkout's venv) every
    kernel would fail its first import and every learner would score 0."""
    try:
        import course_lib
    except ImportError as exc:
        raise InfrastructureError(f"this Python ({sys.executable}) cannot import course_lib: {exc}; "
                                  "run `make setup` in this checkout") from None
    mine = Path(course_lib.__file__).resolve()
    # the judge's kernel half (course_grader.remote) must import there too
    probe = "import course_lib, course_grader.remote, sys; sys.stdout.write(course_lib.__file__)"
    try:
        proc = sandbox.run_sandboxed([sys.executable, "-c", probe], sandbox.SandboxLimits(wall_seconds=120))
    except sandbox.SandboxError as exc:
        raise InfrastructureError(f"could not start a sandboxed Python: {exc}") from None
    seen = proc.stdout.strip()
    if proc.returncode != 0 or not seen or Path(seen).resolve() != mine:
        detail = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
        raise InfrastructureError(
            f"the sandboxed kernel imports course_lib from {seen or 'nowhere'} ({detail if proc.returncode else 'ok'}), "
            f"this driver from {mine.parent}; grade with the checkout whose .venv runs it (make setup there)")


def write_course_config(course: Path, cell_timeout: int | None, sandbox_lines: list[str] = ()) -> None:
    """Write course/nbgrader_config.py: the course settings, with every path in this folder, then
    SANDBOX_LINES (course_grader.sandbox: kernels for learner code run inside bubblewrap)."""
    if not BASE_CONFIG.is_file():  # load_subconfig would silently skip a missing file
        raise InfrastructureError(f"missing {BASE_CONFIG}")
    lines = [
        "# Generated by course_grader.grade for one grading run; rerun the driver rather than edit.",
        "import os",
        "from course_grader.config import place_course",
        "c = get_config()  # noqa: F821",
        f"load_subconfig({BASE_CONFIG.name!r}, {str(BASE_CONFIG.parent)!r})  # course settings",
        *[f'c.CourseDirectory.{name}_directory = "{name}"' for name in ("source", "release", *WORK_FOLDERS)],
        "# the root is this file's folder, so that the copies (the shards) work too",
        'place_course(c, os.path.dirname(os.path.abspath(__file__)), work="", export="nbgrader_export.csv")',
    ]
    if cell_timeout is not None:
        lines.append(f"c.Execute.timeout = {int(cell_timeout)}")
    lines.extend(sandbox_lines)
    (course / "nbgrader_config.py").write_text("\n".join(lines) + "\n")


def nbgrader_env(jobs: int) -> dict[str, str]:
    """Environment for nbgrader subprocesses.

    nbgrader runs the `alembic` executable when it creates a gradebook
    (nbgrader/api.py, get_alembic_version), so this Python's bin folder goes first on
    PATH. With several jobs, math libraries get an equal share of the cores unless the
    caller set the thread counts already.
    """
    env = dict(os.environ)
    # A config file that raises must stop nbgrader, not be skipped with a log line: skipping
    # the generated config would grade with default paths and without the sandbox.
    env["TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR"] = "1"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if jobs > 1:
        share = str(max(1, (os.cpu_count() or 1) // jobs))
        for var in THREAD_VARS:
            env.setdefault(var, share)
    return env


def run_nbgrader(args: list[str], cwd: Path, log: Path, env: dict[str, str],
                 timeout: float | None = None) -> tuple[int, str]:
    """Run `nbgrader ARGS` in CWD, output to LOG; return (exit code, short reason).

    Once ``warm.start()`` ran in this process, the command is a fork of the warm server
    (``course_grader.warm``); otherwise a new `python -m nbgrader` process. On timeout the whole
    process group is killed (the kernel, in its own session, exits when ipykernel sees its parent
    gone) and the code is -9.
    """
    with open(log, "ab") as out:
        out.write(f"$ nbgrader {' '.join(args)}\n".encode())
        out.flush()
        if STOPPING.is_set():
            raise Stopped("grading was stopped")
        if warm.started():
            code = warm.run(args, cwd, log, env, timeout, running=RUNNING)
        else:
            proc = subprocess.Popen([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            RUNNING.add(proc)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                warm.kill_group(proc)
                proc.wait()
                code = None
            finally:
                RUNNING.discard(proc)
        if STOPPING.is_set():
            raise Stopped("grading was stopped")
    if code is None:
        why = f"killed after {timeout:.0f} s (--submission-timeout)"
        with open(log, "ab") as out:            # the log the row's error points at says so too
            out.write(f"[course_grader.grade] {why}\n".encode())
        return -9, why
    if code == 0:
        return 0, ""
    return code, last_error_line(log) or f"nbgrader {args[0]} exited with {code}"


def stop_on_signals() -> None:
    """On SIGTERM or SIGINT: kill every running nbgrader process group (with it the grading kernel,
    whose bubblewrap sandbox dies with its parent), start nothing new, and let run() end with
    exit status 2 ("grading was stopped")."""
    def handler(signum, frame):
        STOPPING.set()
        for proc in list(RUNNING):
            warm.kill_group(proc)
        raise Stopped(f"grading was stopped by {signal.Signals(signum).name}")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def last_error_line(log: Path) -> str:
    """The most telling line of an nbgrader log: the last exception raised, else the last ERROR."""
    lines = log.read_text(errors="replace").splitlines()
    for line in reversed(lines):
        if EXCEPTION_LINE.match(line.strip()):
            return line.strip()
    for line in reversed(lines):
        if "| ERROR]" in line and not any(generic in line for generic in GENERIC_ERRORS):
            return line.split("]", 1)[-1].strip()
    return ""


# The steps


def build_course(work: Path, root: Path, submissions: Path, labs: list[str],
                 cell_timeout: int | None, env: dict[str, str], sandbox_lines: list[str] = ()) -> Path:
    """Make work/course: config, source copy, release + gradebook entries, submissions copy."""
    course = work / "course"
    course.mkdir()
    write_course_config(course, cell_timeout, sandbox_lines)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.pyc")
    for lab in labs:
        shutil.copytree(root / "solutions" / lab, course / "source" / lab, ignore=ignore)
    shutil.copytree(submissions, course / "submitted", ignore=copy_ignoring_links)
    for lab in labs:
        log = work / "logs" / f"generate_{lab}.log"
        code, why = run_nbgrader(["generate_assignment", lab], course, log, env)
        if code != 0:
            raise InfrastructureError(f"nbgrader generate_assignment {lab} failed: {why} (log: {log})")
        if not (course / "release" / lab / f"{lab}.ipynb").is_file():
            raise InfrastructureError(f"generate_assignment {lab} wrote no release in {course / 'release'}; "
                                      "is the generated nbgrader_config.py being read?")
    if not (course / "gradebook.db").is_file():
        raise InfrastructureError(f"no gradebook at {course / 'gradebook.db'} after generate_assignment")
    return course


def course_id_of(db: Path) -> str:
    """A course id already stored in a gradebook, so Gradebook(db, id) adds no course row.

    nbgrader stores the configured CourseDirectory.course_id and, from the steps that
    open the gradebook without one, "default_course"; prefer the configured one.
    """
    with contextlib.closing(sqlite3.connect(db)) as con:
        ids = sorted(row[0] for row in con.execute("SELECT id FROM course"))
    named = [i for i in ids if i != "default_course"]
    if len(named) > 1 or not ids:
        raise InfrastructureError(f"expected one course in {db}, found {ids}")
    return (named or ids)[0]


def read_scores(db: Path, course_id: str, row: Submission) -> None:
    """Fill row.score/max_score/cells from a gradebook's submission for (learner, lab)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}", course_id) as gb:
        sub = gb.find_submission(row.lab, row.learner)
        row.score, row.max_score = float(sub.score), float(sub.max_score)
        row.timestamp = sub.timestamp
        row.penalty = float(sub.late_submission_penalty or 0.0)
        row.seconds_late = float(sub.total_seconds_late)
        row.deadline = sub.duedate
        row.notebook_penalties = {nb.name: nb.late_submission_penalty for nb in sub.notebooks}
        row.cells = [
            {"notebook": nb.name, "cell": g.name, "auto_score": g.auto_score,
             "score": float(g.score), "max_score": float(g.max_score),
             "needs_manual_grade": bool(g.needs_manual_grade)}
            for nb in sub.notebooks for g in nb.grades
        ]
        row.comments = [
            {"notebook": nb.name, "cell": c.name, "auto_comment": c.auto_comment}
            for nb in sub.notebooks for c in nb.comments
        ]


def _notebook_cells(notebook: Path) -> list[dict]:
    """The cells of an autograded notebook ([] when it cannot be read)."""
    try:
        cells = json.loads(notebook.read_text()).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [c for c in cells if isinstance(c, dict)] if isinstance(cells, list) else []




def cell_outcomes(notebook: Path) -> tuple[dict[str, str], str]:
    """What an autograded notebook's errors say: ``{grade_id: why}`` for each graded code cell, and
    '' or a note naming the cell where the sandbox recorded that the kernel died (the cells graded
    before it kept their scores; the later ones scored 0).

    ``why`` is ``ename: first line of the message`` (at most 160 characters) of the error the grader
    recorded (CellTimeoutError, KernelDied), else of the cell's first error, "" without one: in the
    per-test table "wrong" (ContractError), "not attempted" (ExerciseNeeded, NotImplementedError)
    and "crashed" read apart without the feedback page."""
    outcomes, death = {}, ""
    for index, cell in enumerate(_notebook_cells(notebook)):
        grade_id = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")
        errors = [o for o in cell.get("outputs", []) if isinstance(o, dict) and o.get("output_type") == "error"
                  and cell.get("cell_type") == "code"]
        # a reason the grader recorded (the cell timed out, the kernel died) explains the cell better
        # than the KeyboardInterrupt or other error it caused; otherwise the first error is the cause
        recorded = [o for o in errors if o.get("ename") in ("CellTimeoutError", sandbox.KERNEL_DIED)]
        died = [str(o.get("evalue", "")) for o in recorded if o.get("ename") == sandbox.KERNEL_DIED]
        if died and not death:
            where = f"cell {index}" + (f" ({grade_id})" if grade_id else "")
            how = f"{sandbox.PROTOCOL_BROKEN} in {where} and was stopped" if sandbox.PROTOCOL_BROKEN in died[0] \
                else f"died in {where}"
            death = f"kernel {how}; later cells were not run (0 points)"
        if not grade_id or cell.get("cell_type") != "code":
            continue
        if not errors:
            outcomes[grade_id] = ""
            continue
        error = (recorded or errors)[0]
        ename = str(error.get("ename", "Error"))
        first = ANSI.sub("", str(error.get("evalue", ""))).strip().split("\n")[0]
        if not first:    # a message given only in the traceback (nbgrader's timeout error)
            last = ANSI.sub("", str((error.get("traceback") or [""])[-1])).strip().split("\n")[-1]
            first = last[len(ename) + 1:].strip() if last.startswith(ename + ":") else ""
        outcomes[grade_id] = printable(f"{ename}: {first}" if first else ename)[:160]
    return outcomes, death


def gradebook_rows(db: Path, learner: str | None = None) -> dict[str, list[str]]:
    """Every row of every table of the gradebook DB, as text (repr of the row), sorted, except
    the rows that belong to LEARNER's submissions (their student row, submitted assignments and
    notebooks, grades and comments). Compared before and after a shard's autograde, it shows
    that grading one learner changed nothing else in the gradebook."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        assignments = {r[0] for r in con.execute("SELECT id FROM submitted_assignment WHERE student_id = ?",
                                                  (learner,))}
        notebooks = {r[0] for r in con.execute("SELECT id, assignment_id FROM submitted_notebook")
                     if r[1] in assignments}
        owned = {"student": ("id", {learner}), "submitted_assignment": ("id", assignments),
                 "submitted_notebook": ("id", notebooks), "grade": ("notebook_id", notebooks),
                 "comment": ("notebook_id", notebooks)}
        out = {}
        for table in tables:
            columns = [c[1] for c in con.execute(f'PRAGMA table_info("{table}")')]
            key = owned.get(table)
            position = columns.index(key[0]) if key else None
            out[table] = sorted(repr(row) for row in con.execute(f'SELECT * FROM "{table}"')
                                if key is None or row[position] not in key[1])
        return out


def gradebook_changes(before: dict[str, list[str]], after: dict[str, list[str]]) -> str:
    """'' when the two gradebook_rows() dumps are identical, else which tables differ."""
    tables = sorted(t for t in set(before) | set(after) if before.get(t) != after.get(t))
    return ", ".join(f"{t} ({len(before.get(t, []))} -> {len(after.get(t, []))} rows)" for t in tables)


def _graded_cells(nb: dict) -> list[tuple[str, dict]]:
    return [(c["metadata"]["nbgrader"]["grade_id"], c) for c in nb.get("cells", [])
            if isinstance(c, dict) and isinstance(c.get("metadata"), dict)
            and isinstance(c["metadata"].get("nbgrader"), dict) and "grade_id" in c["metadata"]["nbgrader"]]


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def tampering(submitted: Path, release: Path) -> list[str]:
    """What a submission changed in the lab's graded and locked cells, compared with the release
    notebook: locked cells edited, grading metadata (points, checksum, flags) edited, graded
    cells deleted or repeated, grading metadata on cells the lab does not have. nbgrader's
    autograde undoes each of these before it runs the notebook (OverwriteCells restores locked
    sources and points from the gradebook, re-inserts deleted test cells; DeduplicateIds keeps
    the last copy of a repeated id); this list is what the driver flags in the table."""
    try:
        sub = json.loads(submitted.read_text())
        ref = json.loads(release.read_text())
    except (OSError, ValueError) as exc:
        return [f"could not compare with the release: {exc}"]
    released = dict(_graded_cells(ref))
    counts: dict[str, int] = {}
    notes = []
    for grade_id, cell in _graded_cells(sub):
        counts[grade_id] = counts.get(grade_id, 0) + 1
        original = released.get(grade_id)
        if original is None:
            notes.append(f"{grade_id}: not a graded cell of this lab (metadata ignored)")
            continue
        meta, want = cell["metadata"]["nbgrader"], original["metadata"]["nbgrader"]
        edited = sorted(k for k in set(meta) | set(want) if k != "schema_version" and meta.get(k) != want.get(k))
        if cell.get("cell_type") != original.get("cell_type"):
            edited.insert(0, "cell_type")
        if edited:
            notes.append(f"{grade_id}: metadata edited ({', '.join(edited)}; restored)")
        if want.get("locked") and _text(cell.get("source", "")) != _text(original.get("source", "")):
            notes.append(f"{grade_id}: locked cell edited (source restored)")
    for grade_id, original in released.items():
        meta = original["metadata"]["nbgrader"]
        if grade_id not in counts:
            notes.append(f"{grade_id}: deleted" + (" (re-inserted)" if meta.get("grade") else ""))
        elif counts[grade_id] > 1:
            notes.append(f"{grade_id}: {counts[grade_id]} copies (the last one is graded)")
    return notes


def lab_max_scores(db: Path, course_id: str, labs: list[str]) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}", course_id) as gb:
        return {lab: float(gb.find_assignment(lab).max_score) for lab in labs}


def stage_shard(course: Path, row: Submission) -> None:
    """Make row.shard: the config, a copy of the gradebook made after generate_assignment, the lab's
    source and this one submission (a renamed notebook under {lab}.ipynb); record its tampering."""
    shard = row.shard
    shard.mkdir(parents=True)
    shutil.copy2(course / "nbgrader_config.py", shard)
    shutil.copy2(course / "gradebook.db", shard)
    shutil.copytree(course / "source" / row.lab, shard / "source" / row.lab)
    submitted = shard / "submitted" / row.learner / row.lab
    shutil.copytree(course / "submitted" / row.learner / row.lab, submitted, ignore=copy_ignoring_links)
    if row.notebook:  # a renamed notebook: nbgrader looks for {lab}.ipynb
        (submitted / row.notebook).rename(submitted / f"{row.lab}.ipynb")
    row.tampering = tampering(submitted / f"{row.lab}.ipynb", course / "release" / row.lab / f"{row.lab}.ipynb")


def grade_shard(course: Path, row: Submission, course_id: str, env: dict[str, str], timeout: float) -> None:
    """Autograde one submission in its own copy of the course (row.shard) and read its scores."""
    start = time.monotonic()
    try:
        stage_shard(course, row)
        autograde_shard(row, course_id, env, timeout)
    finally:
        row.seconds = time.monotonic() - start


def autograde_shard(row: Submission, course_id: str, env: dict[str, str], timeout: float) -> None:
    """In a staged shard (row.shard): stock ``nbgrader autograde`` (sandboxed kernel, in-kernel
    checks and the judge, whose error outputs fail the cells it did not pass), then the scores and
    the judge's disagreements read into ROW.
    Also the body of a cluster task (``course_grader.cluster``), on the worker's copy of the shard."""
    shard = row.shard
    log = shard / "nbgrader.log"
    before = gradebook_rows(shard / "gradebook.db", row.learner)
    if row.seed is not None:
        env = {**env, "COURSE_GRADING_SEED": str(row.seed), "COURSE_JUDGE_SEED": str(row.judge_seed)}
    code, why = run_nbgrader(["autograde", row.lab, "--student", row.learner], shard, log, env, timeout)
    if code != 0:
        row.error = f"autograde failed: {why}"
        return
    records = judge.read_verdicts(shard / "autograded" / row.learner / row.lab, row.learner, row.lab)
    row.reuse = provenance.flag_notes(records)
    row.speeds = {str(c["grade_id"]): printable(str(c["speed"].get("text", "")))[:200] for record in records
                  for c in record["cells"] if isinstance(c, dict) and isinstance(c.get("speed"), dict)}
    for verdicts in (shard / "autograded" / row.learner / row.lab).glob("*" + judge.VERDICT_SUFFIX):
        verdicts.rename(shard / verdicts.name)  # generate_feedback copies the folder's other files
    row.judge_flags = judge.disagreements(records)
    changed = gradebook_changes(before, gradebook_rows(shard / "gradebook.db", row.learner))
    if changed:  # only nbgrader writes it, and only this learner's rows
        row.error = f"not graded: gradebook rows outside this submission changed while grading it: {changed}"
        return
    read_scores(shard / "gradebook.db", course_id, row)
    row.graded = True
    outcomes, row.error = cell_outcomes(shard / "autograded" / row.learner / row.lab / f"{row.lab}.ipynb")
    for cell in row.cells:
        cell["outcome"] = outcomes.get(cell["cell"], "")


def grade_all(course: Path, work: Path, rows: list[Submission], course_id: str, jobs: int,
              env: dict[str, str], timeout: float, cluster=None) -> None:
    """Grade every row without an error, JOBS at a time on this machine, or one task per row on
    CLUSTER (a ``course_grader.cluster.Cluster``); a failure stays in its own row."""
    todo = [r for r in rows if not r.error]
    for i, row in enumerate(todo):
        row.shard = work / "shards" / f"{i:04d}"
    if cluster is not None:
        report_outcomes(cluster.grade(course, todo, course_id, timeout), len(todo))
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(grade_shard, course, r, course_id, env, timeout): r for r in todo}
        report_outcomes(((futures[f], f.exception(), "") for f in concurrent.futures.as_completed(futures)), len(todo))


def report_outcomes(outcomes, total: int) -> None:
    """Record and print each (row, exception or None, where) as its grading ends; an exception is
    that row's error (a broken shard must not stop the batch), except Stopped."""
    for done, (row, exc, where) in enumerate(outcomes, 1):
        if isinstance(exc, Stopped) or (exc is not None and not isinstance(exc, Exception)):
            raise exc
        if exc is not None:
            row.error = f"grading crashed: {type(exc).__name__}: {exc}"
        row.graded_on = where
        status = f"{row.score:g}/{row.max_score:g}" if row.graded else "not graded"
        note = f" [{printable(row.error)}]" if row.error else ""
        place = f" on {where}" if where else ""
        print(f"  [{done}/{total}] {row.learner} / {row.lab}: {status}{note} ({row.seconds:.1f} s{place})",
              flush=True)


def merge_into_course(course: Path, rows: list[Submission], course_id: str, term=None) -> None:
    """Add the learners to course/gradebook.db, copy in their grades and files (one process, serial)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gb:
        for learner in sorted({r.learner for r in rows if not learner_id_problem(r.learner)}):
            gb.update_or_create_student(learner)
        for row in rows:
            if not row.graded:
                continue
            extra = {"timestamp": row.timestamp} if row.timestamp is not None else {}
            submission = gb.update_or_create_submission(row.lab, row.learner, **extra)
            # what the shard's ApplyDeadlines and AssignLatePenalties wrote (course_grader.late)
            if term is not None and row.lab in term.deadlines:   # the due date is there (build_course)
                submission.extension = term.extensions.get((row.learner, row.lab))
            for nb in submission.notebooks:
                nb.late_submission_penalty = row.notebook_penalties.get(nb.name)
            for cell in row.cells:
                grade = gb.find_grade(cell["cell"], cell["notebook"], row.lab, row.learner)
                grade.auto_score = cell["auto_score"]
                grade.needs_manual_grade = cell["needs_manual_grade"]
            for cell in row.comments:
                comment = gb.find_comment(cell["cell"], cell["notebook"], row.lab, row.learner)
                comment.auto_comment = cell["auto_comment"]
            gb.db.commit()
    for row in rows:
        src = row.shard / "autograded" / row.learner / row.lab if row.shard else None
        if src is not None and src.is_dir():
            shutil.copytree(src, course / "autograded" / row.learner / row.lab)


FEEDBACK_SECONDS = 300        # one learner's feedback page; the batch of a lab gets this plus per learner
FEEDBACK_SECONDS_PER_LEARNER = 20


def generate_feedback(course: Path, work: Path, rows: list[Submission], labs: list[str],
                      env: dict[str, str], run=None, each: bool = False) -> None:
    """Stock `nbgrader generate_feedback LAB` on the merged course; a missing HTML becomes a row error.

    One process per lab (nbgrader's start-up is most of a page's cost), given ``FEEDBACK_SECONDS``
    plus ``FEEDBACK_SECONDS_PER_LEARNER`` per graded learner; if it runs out (outputs that take the
    HTML sanitiser minutes), each learner still without a page gets a process of its own
    (``--student``, ``FEEDBACK_SECONDS``), so one submission costs only its own feedback. EACH
    (``--regrade``): only the latter, for ROWS' learners, so no other learner's page is rewritten. RUN
    replaces ``run_nbgrader`` in tests."""
    run = run or run_nbgrader

    def missing(row: Submission) -> bool:
        return row.graded and not (course / "feedback" / row.learner / row.lab / f"{row.lab}.html").is_file()

    for lab in labs:
        log = work / "logs" / f"feedback_{lab}.log"
        learners = [r for r in rows if r.lab == lab and r.graded]
        if not each:
            code, _ = run(["generate_feedback", lab], course, log, env,
                          timeout=FEEDBACK_SECONDS + FEEDBACK_SECONDS_PER_LEARNER * len(learners))
            if code != -9:
                continue
        for row in learners:
            if missing(row):
                code, _ = run(["generate_feedback", lab, "--student", row.learner, "--force"], course, log, env,
                              timeout=FEEDBACK_SECONDS)
                if code == -9:
                    row.error = row.error or f"feedback not generated: its page took over {FEEDBACK_SECONDS} s"
    for row in rows:
        if missing(row):
            row.error = row.error or f"feedback not generated (see {work / 'logs' / f'feedback_{row.lab}.log'})"


def check_merge(course: Path, rows: list[Submission], course_id: str) -> None:
    """Re-read the merged gradebook: every graded row must have the score its shard gave."""
    for row in (r for r in rows if r.graded):
        again = Submission(row.learner, row.lab)
        read_scores(course / "gradebook.db", course_id, again)
        if abs(again.score - row.score) > SCORE_TOLERANCE:
            raise InfrastructureError(f"merged gradebook has {again.score} for {row.learner}/{row.lab}, "
                                      f"its shard had {row.score}")


# Tables


def totals_table(rows: list[Submission]) -> pd.DataFrame:
    """One row per (learner, lab): ``score`` is the raw score less the late penalty (nbgrader's
    export does the same), ``late`` the seconds past the deadline (extension included), ``timestamp``
    the submission time it used (UTC; empty when the submission had no timestamp.txt)."""
    return pd.DataFrame([(printable(r.learner), printable(r.lab), max(0.0, r.score - r.penalty), r.max_score,
                          r.score, r.penalty, round(r.seconds_late), _utc(r.timestamp), _utc(r.deadline),
                          printable(r.error), r.seed, len(r.judge_flags), printable("; ".join(flag_notes(r))))
                         for r in sorted(rows, key=lambda r: (r.learner, r.lab))],
                        columns=["learner", "lab", "score", "max_score", "raw_score", "penalty", "late", "timestamp",
                                 "deadline", "error", "seed", "judge_flags", "flags"],
                        ).astype({"seed": "Int64"})


def _utc(when) -> str:
    """nbgrader's naive-UTC datetime as ISO 8601 with its zone ("" for none)."""
    return "" if when is None else when.replace(tzinfo=dt.timezone.utc).isoformat()


def timings_table(rows: list[Submission]) -> pd.DataFrame:
    """learner, lab, seconds, graded_on: one row per submission that was graded or tried. On this
    machine seconds cover copying its shard, autograde and the judge, and graded_on is empty; on a
    cluster they are the worker's time for autograde and the judge (not staging, transfer or queueing)
    and graded_on is "host (pid N)" of the worker process, empty for a task that never came back."""
    return pd.DataFrame([(printable(r.learner), printable(r.lab), round(r.seconds, 3), r.graded_on)
                         for r in rows if r.shard is not None], columns=["learner", "lab", "seconds", "graded_on"])


def flag_notes(row: Submission) -> list[str]:
    """What an instructor should look at in a graded row: a renamed notebook, edited or deleted
    graded cells (undone before grading), cells where the learner's kernel and the judge disagreed,
    tests that reuse their exercise's reference and code that may hide calls from that check."""
    notes = [f"graded {row.notebook} as {row.lab}.ipynb"] if row.notebook else []
    if row.graded and row.deadline is not None and row.timestamp is None:
        notes.append("no timestamp.txt: lateness against the deadline not checked")
    notes += [f"not copied (symlink or special file): {name}" for name in row.skipped]
    notes += row.tampering
    notes += [f"{f['cell']}: the judge failed it, the kernel passed it (check for tampering)"
              if f.get("in_kernel") == "passed" else
              f"{f['cell']}: the kernel failed it, the judge passed it (their hidden inputs differ; the kernel's 0 stands)"
              for f in row.judge_flags]
    return notes + row.reuse


def cells_table(rows: list[Submission]) -> pd.DataFrame:
    """Per graded cell: `score` is nbgrader's auto_score (0 when it has none); `outcome` is
    "passed", or the cell's first error (``cell_outcomes``), or "failed" when it scored less
    without one; `speed`, for a kernel exercise, the judge's record of the kernel's speed (on a GPU its
    achieved bandwidth; on a CPU that it was not measured), never part of the score."""
    records = []
    for r in sorted(rows, key=lambda r: (r.learner, r.lab)):
        for c in r.cells:
            score, outcome = cell_result(c)
            records.append((printable(r.learner), printable(r.lab), c["cell"], score, c["max_score"], outcome,
                            r.speeds.get(c["cell"], "")))
    return pd.DataFrame(records, columns=["learner", "lab", "cell", "score", "max_score", "outcome", "speed"])


def cell_result(cell: dict) -> tuple[float, str]:
    """(score, outcome) of one of a row's graded cells, as ``cells_table`` describes them."""
    score = 0.0 if cell["auto_score"] is None else float(cell["auto_score"])
    return score, cell.get("outcome", "") or ("passed" if score >= cell["max_score"] else "failed")


def read_csv_text(path: Path) -> pd.DataFrame:
    """Read a CSV keeping every field as text: learner ids like 'NA' or '007' stay as written."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def compare_expected(expected_path: Path, totals: pd.DataFrame, cells: pd.DataFrame,
                     learners: list[str] | None = None, labs: list[str] | None = None) -> pd.DataFrame:
    """Rows where the scores differ from the expected file (only LEARNERS' rows and LABS' rows when
    given: ``--learners`` and ``--labs``).

    The expected file is a CSV with columns learner, lab, score and optionally cell. A
    row whose cell is empty or "total" is checked against the notebook total; any other
    cell value is a grade cell id (nbgrader's grade_id). Every graded (learner, lab)
    must have an expected total, so a new sample without expectations also fails; a
    (learner, lab) pair that was never submitted needs one only if the file names it (a
    sample that disappears still fails: its expected total no longer matches).
    """
    try:
        expected = read_csv_text(expected_path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InfrastructureError(f"cannot read --expected {expected_path}: {exc}") from exc
    missing = {"learner", "lab", "score"} - set(expected.columns)
    if missing:
        raise InfrastructureError(f"--expected {expected_path} lacks column(s) {sorted(missing)}")
    if "cell" not in expected.columns:
        expected["cell"] = TOTAL
    expected["cell"] = expected["cell"].replace("", TOTAL)
    if learners is not None:
        expected = expected[expected["learner"].isin(learners)]
    if labs is not None:
        expected = expected[expected["lab"].isin(labs)]

    actual = {(r.learner, r.lab, TOTAL): r.score for r in totals.itertuples()}
    actual.update({(r.learner, r.lab, r.cell): r.score for r in cells.itertuples()})
    differences = []
    for r in expected.itertuples():
        key = (r.learner, r.lab, r.cell)
        try:
            want = float(r.score)
        except ValueError:
            raise InfrastructureError(f"--expected: score {r.score!r} for {key} is not a number") from None
        got = actual.get(key)
        if got is None:
            differences.append((*key, want, math.nan, "no such graded row"))
        elif abs(got - want) > SCORE_TOLERANCE:
            differences.append((*key, want, got, ""))
    covered = {(r.learner, r.lab) for r in expected.itertuples() if r.cell == TOTAL}
    differences += [(r.learner, r.lab, TOTAL, math.nan, r.score, "no expected total") for r in totals.itertuples()
                    if (r.learner, r.lab) not in covered and r.error != NOT_SUBMITTED]
    return pd.DataFrame(differences, columns=["learner", "lab", "cell", "expected", "actual", "note"])


def show(df: pd.DataFrame, width: int = 70) -> str:
    """A table for the terminal: long error texts cut to WIDTH characters."""
    if df.empty:
        return "(none)"
    view = df.copy()
    for col in ("error", "note", "flags"):
        if col in view:
            view[col] = view[col].map(lambda s: s if len(str(s)) <= width else str(s)[: width - 3] + "...")
    return view.to_string(index=False)


# Main


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    # nbgrader's API makes SQLAlchemy warn "Object of type <...> not in session" (its own
    # apps print the same); they are noise here.
    warnings.filterwarnings("ignore", message=r"Object of type .* not in session")
    try:
        import nbgrader  # noqa: F401  (fail early and clearly when it is not installed)
    except ImportError as exc:
        raise InfrastructureError(f"nbgrader is not importable by {sys.executable}: {exc}") from exc
    # the course file and its roster are read before anything is graded or written: a bad one is refused
    args.term = term_mod.load(args.course or args.root / "autograder" / "course.toml", labs=known_labs(args.root))
    args.roster = term_mod.read_roster(args.term.roster) if args.term.roster is not None else None
    rows = find_submissions(args.submissions, known_labs(args.root), args.learners, args.labs)
    labs = sorted({r.lab for r in rows if r.folder is not None and not r.error.startswith("unknown lab")})
    if not labs:
        raise InfrastructureError(f"none of the submitted labs has a source in {args.root / 'solutions'}")
    # the judge's lines come after the sandbox's: they wrap the (sandboxed) Execute step
    sandbox_lines = sandbox.nbgrader_config_lines(sandbox.SandboxLimits(wall_seconds=args.submission_timeout),
                                                  allow_unsafe=args.unsafe_no_sandbox) + judge.nbgrader_config_lines()
    if args.reference_reuse is not None:
        sandbox_lines.append(f"c.CourseJudge.reference_reuse = {args.reference_reuse!r}")
    # the deadlines, extensions and late policy of this run's course file (course_grader.late)
    # (on a cluster the workers read it at the same path: a missing file fails their submissions by name)
    if args.term.path.exists():
        sandbox_lines += [f"c.{step}.course_file = {str(args.term.path.resolve())!r}"
                          for step in ("ApplyDeadlines", "CourseLatePolicy")]
    cluster = None
    try:
        if args.cluster is None:
            unsafe = check_sandbox(args.unsafe_no_sandbox)
        else:  # learner code runs on the workers: their sandboxes are checked, not this machine's
            from .cluster import Cluster

            cluster = Cluster(args.cluster, sandbox_lines, args.cell_timeout, allow_unsafe=args.unsafe_no_sandbox)
            reports = cluster.check()
            unsafe = next((r["unsafe"] for r in reports.values() if r["unsafe"]), "")
            print(f"Cluster {args.cluster}: {len(reports)} worker(s) on {len({r['host'] for r in reports.values()})} "
                  f"machine(s), each with this driver's course code; sandbox: "
                  f"{'NONE on some (--unsafe-no-sandbox)' if unsafe else 'bubblewrap'}.", flush=True)
        if unsafe:
            print(unsafe, flush=True)
        return _grade(args, rows, labs, sandbox_lines, unsafe, cluster, started)
    finally:
        if cluster is not None:
            cluster.close()


def _grade(args: argparse.Namespace, rows: list[Submission], labs: list[str], sandbox_lines: list[str],
           unsafe: str, cluster, started: float) -> int:
    # --regrade grades in WORK/regrade (emptied) and then replaces only its rows in the previous run's
    # course, tables and reports; checked before anything is written
    previous = previous_run(args.work, args.root, labs) if args.regrade else None
    if previous is not None and not args.seed_given:
        args.seed = previous["seed"]
    stage = args.work / REGRADE_FOLDER if previous is not None else args.work
    if previous is not None:
        prepare_stage(stage)
    else:
        prepare_work(args.work, args.root, args.submissions)
    env = nbgrader_env(args.jobs)
    if not args.cold_start and warm.available():
        warm.start()  # its imports overlap the work below until the first command

    print(f"Preparing {stage / 'course'} (labs: {', '.join(labs)}; learner code "
          f"{'NOT sandboxed' if unsafe else 'sandboxed with bubblewrap'}) ...", flush=True)
    course = build_course(stage, args.root, args.submissions, labs, args.cell_timeout, env, sandbox_lines)
    course_id = course_id_of(course / "gradebook.db")
    if args.term.deadlines:
        from nbgrader.api import Gradebook

        from .late import write_deadlines

        with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gb:
            write_deadlines(gb, args.term, labs)
    max_scores = lab_max_scores(course / "gradebook.db", course_id, labs)
    for row in rows:
        row.max_score = max_scores.get(row.lab, math.nan)

    todo = [r for r in rows if not r.error]
    for row in todo:
        row.seed = submission_seed(args.seed, row.learner, row.lab)
        row.judge_seed = submission_seed(args.seed, row.learner, row.lab, "judge")
    rejected = sum(1 for r in rows if r.error and r.error != NOT_SUBMITTED)
    how = f"on the cluster at {args.cluster}" if cluster is not None else f"with {args.jobs} job(s)"
    processes = "each nbgrader command forked from the warm process" if warm.started() and cluster is None else \
        "each nbgrader command a new process"
    print(f"{'Regrading' if previous is not None else 'Grading'} {len(todo)} submission(s) {how} ({processes}); "
          f"{rejected} rejected before grading; hidden-test run seed {args.seed} (replay: --seed {args.seed}).",
          flush=True)
    grade_start = time.monotonic()
    grade_all(course, stage, rows, course_id, args.jobs, env, args.submission_timeout, cluster)
    grading_seconds = time.monotonic() - grade_start
    if todo and not any(r.graded for r in todo):
        raise InfrastructureError(
            "every submission failed to autograde, which points at the grading set-up rather than the "
            f"learners; see the logs under {stage / 'shards'} (first: {todo[0].error})")
    # per lab, the learners graded: this run's, or the previous run's with the regraded rows' outcome
    args.graded = {lab: set(names) for lab, names in (previous or {}).get("graded", {}).items()}
    for row in rows:
        args.graded.setdefault(row.lab, set()).discard(row.learner)
        if row.graded:
            args.graded[row.lab].add(row.learner)

    if previous is not None:    # from here on, the previous run's course: only these rows' entries change
        course = args.work / "course"
        course_id = course_id_of(course / "gradebook.db")
        clear_rows(course, stage / "course", rows, course_id)
    merge_into_course(course, rows, course_id, args.term)
    check_merge(course, rows, course_id)
    generate_feedback(course, stage, rows, labs, env, each=previous is not None)
    code, why = run_nbgrader(["export"], course, stage / "logs" / "export.log", env)
    if code != 0:
        raise InfrastructureError(f"nbgrader export failed: {why}")

    if previous is not None:
        totals, cells = replace_tables(args.work, rows, unsafe)
    else:
        totals, cells = write_tables(args.work, rows, unsafe, args.per_test)
    similar = compare_similarity(args, course, labs, replace=previous is not None)
    write_reports(course, rows, run_record(args, unsafe), similar)
    if previous is None:
        write_run_file(args, labs, unsafe)
    else:   # the previous run's record, with the regraded rows' outcome in "graded"
        record = {**previous, "graded": {lab: sorted(names) for lab, names in sorted(args.graded.items())}}
        write_atomically(args.work / RUN_FILE, json.dumps(encodable_tree(record), indent=1) + "\n")
    print_summary(args, rows, totals, cells, course / "feedback", similar)
    if args.roster is not None:
        book = lms.gradebook(lms.read_grades(args.work / "grades.csv"), args.roster)
        lms.write_exports(book, args.roster, args.term, args.work)
        missing = book[book["error"].str.startswith(lms.NOT_IN_ROSTER)]
        print(f"Gradebook:     {args.work / 'gradebook.csv'} and {args.work / 'canvas_gradebook.csv'} (Canvas import; "
              f"roster {args.term.roster}: {len(missing)} graded row(s) not in it"
              + (": " + ", ".join(sorted(set(missing['learner']))) if len(missing) else "") + ")")
    print(f"Time: grading {grading_seconds:.1f} s {how}, whole run {time.monotonic() - started:.1f} s")
    if unsafe:
        print(unsafe)
    if args.expected is not None:
        differences = compare_expected(args.expected, totals, cells, args.learners, args.labs)
        if not differences.empty:
            print(f"\nScores differ from {args.expected}:\n" + show(differences))
            return EXIT_MISMATCH
        print(f"\nAll scores match {args.expected}.")
    return EXIT_OK


def sandbox_label(unsafe: str) -> str:
    """grades.csv's ``sandbox`` value (and report.json's): how learner code ran."""
    return "NONE (unsafe: --unsafe-no-sandbox)" if unsafe else "bubblewrap"


def result_tables(rows: list[Submission], unsafe: str) -> dict[str, pd.DataFrame]:
    """The run's tables by file name: grades.csv (totals), grades_per_test.csv (cells),
    judge_disagreements.csv and timings.csv."""
    totals = totals_table(rows)
    totals["sandbox"] = sandbox_label(unsafe)
    flags = pd.DataFrame([f for r in rows for f in r.judge_flags],
                         columns=["learner", "lab", "notebook", "cell", "points", "in_kernel", "judge", "score",
                                  "message"])
    flags["message"] = flags["message"].map(printable)
    return {"grades.csv": totals, "grades_per_test.csv": cells_table(rows), "judge_disagreements.csv": flags,
            "timings.csv": timings_table(rows)}


def write_tables(work: Path, rows: list[Submission], unsafe: str, per_test: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write WORK/grades.csv, judge_disagreements.csv, timings.csv and, with PER_TEST,
    grades_per_test.csv; returns the totals and per-cell tables."""
    tables = result_tables(rows, unsafe)
    for name, table in tables.items():
        if per_test or name != "grades_per_test.csv":
            table.to_csv(work / name, index=False)
    return tables["grades.csv"], tables["grades_per_test.csv"]


def replace_tables(work: Path, rows: list[Submission], unsafe: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``--regrade``: in each table of the previous run in WORK (grades.csv, judge_disagreements.csv,
    timings.csv and grades_per_test.csv where it exists), replace the lines of ROWS' (learner, lab)
    pairs with theirs (``replace_csv_rows``); every other line stays byte for byte. Returns the
    regraded rows' totals and per-cell tables."""
    tables = result_tables(rows, unsafe)
    keys = {(name(r.learner), name(r.lab)) for r in rows for name in (str, printable)}
    for file, table in tables.items():
        if (work / file).exists():
            replace_csv_rows(work / file, table.to_csv(index=False, lineterminator="\n"), ("learner", "lab"), keys)
    return tables["grades.csv"], tables["grades_per_test.csv"]


def replace_csv_rows(path: Path, fresh: str, columns: tuple[str, ...], keys: set[tuple[str, ...]]) -> None:
    """Rewrite the CSV at PATH with its lines whose COLUMNS values are one of KEYS replaced by the
    lines of FRESH (CSV text with the same header) with that key, where the first old line of the
    key stood (keys PATH lacks: at the end). Every other line is kept as it was, byte for byte (one
    record per line: the driver writes no newline inside a field, ``printable``). Written whole or
    not at all.

    Raises:
        InfrastructureError: FRESH's header differs from PATH's (another driver version wrote it).
    """
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    new = fresh.splitlines(keepends=True)
    header = next(csv.reader(lines[:1]), [])
    if not new or next(csv.reader(new[:1])) != header:
        raise InfrastructureError(f"--regrade: {path} has the columns {header}, this driver writes "
                                  f"{next(csv.reader(new[:1]), [])}; grade the whole batch again")
    where = [header.index(c) for c in columns]

    def key(line: str) -> tuple[str, ...]:
        fields = next(csv.reader([line]))
        return tuple(fields[i] for i in where)

    waiting: dict[tuple[str, ...], list[str]] = {}
    for line in new[1:]:
        waiting.setdefault(key(line), []).append(line)
    out = lines[:1]
    for line in lines[1:]:
        k = key(line)
        if k in keys:
            out += waiting.pop(k, [])          # the replacement, once, where the first old line stood
        else:
            out.append(line)
    out += [line for group in waiting.values() for line in group]
    write_atomically(path, "".join(out))


def write_atomically(path: Path, text: str) -> None:
    """Write TEXT (UTF-8) to PATH whole or not at all: a temporary file beside it, renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --regrade, similarity flags, report.json

RUN_FILE = "run.json"          # in the work folder: what a --regrade checks and reuses
REGRADE_FOLDER = "regrade"     # WORK/regrade: a regrade's own course and shards, emptied by the next one
SIMILARITY_CSV = "similarity.csv"
REPORT = "report.json"         # beside each feedback page
REPORT_SCHEMA = 1              # report.json's schema_version; raise it when a field changes meaning


def write_run_file(args: argparse.Namespace, labs: list[str], unsafe: str) -> None:
    """WORK/run.json: the course root, SUBMISSIONS, run seed, labs and per lab the learners graded in
    this run (what ``previous_run`` checks before a ``--regrade``)."""
    record = {"schema_version": REPORT_SCHEMA, "root": str(args.root), "submissions": str(args.submissions),
              "seed": args.seed, "labs": sorted(labs),
              "graded": {lab: sorted(names) for lab, names in sorted(args.graded.items())},
              "sandbox": sandbox_label(unsafe)}
    write_atomically(args.work / RUN_FILE, json.dumps(encodable_tree(record), indent=1) + "\n")


def previous_run(work: Path, root: Path, labs: list[str]) -> dict:
    """The run a ``--regrade`` goes into: WORK/run.json, with the grades and course the driver wrote.

    Raises:
        InfrastructureError: naming --regrade: no finished run of this driver in WORK, one made from
            another course root, or a lab (of LABS) it did not grade.
    """
    record = work / RUN_FILE
    if not (work / WORK_MARKER).exists() or not record.is_file():
        raise InfrastructureError(f"--regrade: no previous grading run in {work} to regrade into (run.json missing); "
                                  "grade the whole batch first, without --regrade")
    try:
        previous = json.loads(record.read_text(encoding="utf-8"))
        seed, before = int(previous["seed"]), Path(previous["root"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InfrastructureError(f"--regrade: cannot read {record}: {exc}") from None
    graded, run_labs = previous.get("graded", {}), previous.get("labs", [])
    if not (isinstance(graded, dict) and all(isinstance(v, list) and all(isinstance(n, str) for n in v)
                                             for v in graded.values())
            and isinstance(run_labs, list) and all(isinstance(lab, str) for lab in run_labs)):
        raise InfrastructureError(f"--regrade: {record}: labs must be a list of labs and graded a table of lab = "
                                  "[learner, ...]; grade the whole batch again")
    if before != root:
        raise InfrastructureError(f"--regrade: the run in {work} graded the course at {before}, not --root {root}; "
                                  "regrade with that root, or grade the whole batch again")
    missing = [p for p in (work / "grades.csv", work / "course" / "gradebook.db") if not p.is_file()]
    if missing:
        raise InfrastructureError(f"--regrade: the run in {work} is incomplete ({', '.join(map(str, missing))} "
                                  "missing); grade the whole batch again")
    for table in ("grades.csv", "grades_per_test.csv", "judge_disagreements.csv", "timings.csv", SIMILARITY_CSV):
        problem = table_problem(work / table) if (work / table).exists() else ""
        if problem:   # found now, before the previous run's course is changed, not when its lines are replaced
            raise InfrastructureError(f"--regrade: {work / table}: {problem}; grade the whole batch again")
    other = sorted(set(labs) - set(run_labs))
    if other:
        raise InfrastructureError(f"--regrade: the run in {work} did not grade {', '.join(other)}; grade it "
                                  "without --regrade (in another --work)")
    return dict(previous, seed=seed)


def table_problem(path: Path) -> str:
    """Why ``replace_csv_rows`` cannot rewrite the CSV at PATH ('' when it can): it is not UTF-8, or a line
    is not one record with the header's number of fields (a blank line, a cut or hand-edited one)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read as UTF-8 text: {exc}"
    if not lines:
        return "is empty"
    width = len(next(csv.reader(lines[:1])))
    for number, line in enumerate(lines[1:], start=2):
        try:
            fields = list(csv.reader([line]))
        except csv.Error as exc:
            return f"line {number} is not CSV: {exc}"
        if len(fields) != 1 or len(fields[0]) != width:
            return f"line {number} is not one record of {width} fields"
    return ""


def prepare_stage(stage: Path) -> None:
    """Empty (or create) WORK/regrade, a regrade's own work folder."""
    if stage.exists():
        shutil.rmtree(stage)
    (stage / "logs").mkdir(parents=True)


def clear_rows(course: Path, fresh: Path, rows: list[Submission], course_id: str) -> None:
    """``--regrade``: take ROWS' previous entries out of the previous run's COURSE (their gradebook
    submissions, submitted copies, autograded notebooks and feedback) and copy in their new
    submissions from the regrade's course FRESH, so that ``merge_into_course`` adds them anew;
    no other learner's entry is touched."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gb:
        for row in rows:
            try:
                gb.remove_submission(row.lab, row.learner)
            except MissingEntry:
                pass
    for row in rows:
        for folder in ("submitted", "autograded", "feedback"):
            target = course / folder / row.learner / row.lab
            if target.is_dir():
                shutil.rmtree(target)
        source = fresh / "submitted" / row.learner / row.lab
        if source.is_dir():
            shutil.copytree(source, course / "submitted" / row.learner / row.lab)


def compare_similarity(args: argparse.Namespace, course: Path, labs: list[str], replace: bool = False):
    """Compare the exercise cells of every pair of the learners graded in each of LABS (the copies in
    COURSE/submitted, the starter code from COURSE/release; ``course_grader.similarity``) and write
    WORK/similarity.csv, or with REPLACE (``--regrade``) replace those labs' lines in it (the previous
    run's learners and the regraded ones compared). Returns the ``similarity.Result``, or None with
    ``--no-similarity`` (or a regrade into a run that had it)."""
    path = args.work / SIMILARITY_CSV
    if args.no_similarity or (replace and not path.exists()):
        return None
    from . import similarity

    threshold = args.similarity_threshold if args.similarity_threshold is not None else args.term.similarity_threshold
    result = similarity.compare_submissions(course / "submitted", labs, course / "release", threshold,
                                            learners=args.graded)
    if replace:
        replace_csv_rows(path, similarity.csv_text(result), ("lab",), {(lab,) for lab in labs})
    else:
        write_atomically(path, similarity.csv_text(result))
    return result


def git_commit(folder: Path) -> str:
    """The git commit checked out at FOLDER, with "+modified" when tracked files differ from it;
    "unknown" outside a git checkout (or without git)."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=60)
        if head.returncode != 0:
            return "unknown"
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+modified" if status.returncode != 0 or status.stdout.strip() else "")


def run_record(args: argparse.Namespace, unsafe: str) -> dict:
    """What every report.json of a run shares: the run seed, the sandbox mode, the course root's and
    the grader's commits, the grader code's fingerprint and the package versions
    (``course_grader.cluster.versions``, the set a cluster's workers must match, and course_lib's)."""
    import course_lib

    from .cluster import code_fingerprint, versions

    return {"run_seed": args.seed, "sandbox": sandbox_label(unsafe),
            "course": {"root": str(args.root), "commit": git_commit(args.root)},
            "grader": {"commit": git_commit(REPO_ROOT), "code_fingerprint": code_fingerprint()},
            "versions": {**versions(), "course_lib": course_lib.__version__, "copydetect": _version("copydetect")}}


def _version(distribution: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def cell_diagnoses(notebook: Path) -> dict[str, str]:
    """``{grade_id: message}`` of an autograded notebook's graded cells that raised: the whole text of
    the error the score rests on (the one ``cell_outcomes`` names: the checker's ContractError with its
    "Diagnosis:" lines, a timeout, a dead kernel), terminal colours removed, at most 4000 characters."""
    out = {}
    for cell in _notebook_cells(notebook):
        grade_id = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")
        errors = [o for o in cell.get("outputs", []) if isinstance(o, dict) and o.get("output_type") == "error"]
        if not grade_id or cell.get("cell_type") != "code" or not errors:
            continue
        recorded = [o for o in errors if o.get("ename") in ("CellTimeoutError", sandbox.KERNEL_DIED)]
        error = (recorded or errors)[0]
        text = f"{error.get('ename', 'Error')}: {error.get('evalue', '')}".rstrip(": ")
        out[str(grade_id)] = encodable(ANSI.sub("", text))[:4000]
    return out


def submission_report(row: Submission, run: dict, diagnoses: dict[str, str], similar: list[dict] | None) -> dict:
    """report.json of one graded ROW (schema ``REPORT_SCHEMA``): the scores, per graded test its name,
    points, score, outcome, diagnosis and seed; the flags; the submitted notebook's sha256; and RUN
    (``run_record``). SIMILAR: the row's flagged pairs (``similarity.Result.flags_of``), None when
    similarity was not compared."""
    name = row.notebook or f"{row.lab}.ipynb"
    try:
        digest = hashlib.sha256((row.folder / name).read_bytes()).hexdigest() if row.folder else ""
    except OSError:
        digest = ""
    tests = [{"name": c["cell"], "points": c["max_score"], **dict(zip(("score", "outcome"), cell_result(c))),
              "diagnosis": diagnoses.get(c["cell"], ""), "seed": row.seed} for c in row.cells]
    others = [n for n in flag_notes(row) if n not in row.reuse]
    return encodable_tree({
        "schema_version": REPORT_SCHEMA, "learner": row.learner, "lab": row.lab, "notebook": name,
        "notebook_sha256": digest, "score": max(0.0, row.score - row.penalty), "max_score": row.max_score,
        "raw_score": row.score, "penalty": row.penalty, "late_seconds": round(row.seconds_late),
        "error": row.error, "seed": row.seed, "judge_seed": row.judge_seed, "tests": tests,
        "flags": {"judge": [{k: f[k] for k in ("cell", "in_kernel", "judge", "message")} for f in row.judge_flags],
                  "reference_reuse": list(row.reuse), "late": row.seconds_late > 0, "notes": others,
                  "similarity": similar},
        **run})


def write_reports(course: Path, rows: list[Submission], run: dict, similar=None) -> None:
    """Write COURSE/feedback/{learner}/{lab}/report.json for every graded row (``submission_report``).
    The instructor's record: nbgrader's release_feedback hands learners only the ``*.html`` pages."""
    for row in rows:
        if not row.graded:
            continue
        folder = course / "feedback" / row.learner / row.lab
        folder.mkdir(parents=True, exist_ok=True)
        diagnoses = cell_diagnoses(course / "autograded" / row.learner / row.lab / f"{row.lab}.ipynb")
        flags = similar.flags_of(row.learner, row.lab) if similar is not None else None
        write_atomically(folder / REPORT, json.dumps(submission_report(row, run, diagnoses, flags), indent=1) + "\n")


def print_summary(args: argparse.Namespace, rows: list[Submission], totals: pd.DataFrame, cells: pd.DataFrame,
                  feedback: Path, similar=None) -> None:
    """The tables, the rows an instructor should look at (errors and flags), the pairs of learners whose
    exercise cells are near copies (SIMILAR, a ``similarity.Result``; at most ``PRINTED_PAIRS``) and
    where the files are."""
    print("\nGrades:\n" + show(totals))
    if args.per_test:
        print("\nPer graded cell:\n" + show(cells))
    attention = totals[((totals["error"] != "") & (totals["error"] != NOT_SUBMITTED)) | (totals["flags"] != "")]
    print(f"\n{len(attention)} row(s) to look at (errors other than 'not submitted', or flags)"
          + (":" if len(attention) else "."))
    if not attention.empty:
        by_key = {(r.learner, r.lab): r for r in rows}
        for r in attention.itertuples():
            row = by_key[(r.learner, r.lab)]
            other = printable("; ".join(n for n in flag_notes(row) if n not in row.reuse))
            text = "; ".join(x for x in (r.error, other) if x)[:300]
            print(f"  {r.learner} / {r.lab}:" + (f" {text}" if text else ""))
            for note in row.reuse:      # each in full: which test reaches which reference, and how
                print(f"      {printable(note)}")
    if similar is not None:
        from .similarity import summary_lines

        print("\n".join(summary_lines(similar, args.work / SIMILARITY_CSV)))
    print(f"\nGrades CSV:    {args.work / 'grades.csv'}")
    print(f"Judge flags:   {args.work / 'judge_disagreements.csv'} ({sum(len(r.judge_flags) for r in rows)} "
          "cell(s) where the learner's kernel and the judge disagreed)")
    print(f"Timings:       {args.work / 'timings.csv'} (seconds per submission; on a cluster, the worker)")
    if args.per_test:
        print(f"Per-test CSV:  {args.work / 'grades_per_test.csv'}")
    if similar is not None:
        print(f"Similarity:    {args.work / SIMILARITY_CSV} (every pair of learners compared; flagged: at or above "
              f"{similar.threshold:g})")
    print(f"Feedback HTML: {feedback}  ({{learner}}/{{lab}}/{{lab}}.html; the instructor's "
          f"{{learner}}/{{lab}}/{REPORT} beside it)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        stop_on_signals()
    try:
        return run(args)
    except InfrastructureError as exc:
        print(f"python -m course_grader.grade: cannot grade: {exc}", file=sys.stderr)
        return EXIT_INFRA
    except TermError as exc:
        print(f"python -m course_grader.grade: refused: {exc}", file=sys.stderr)
        return EXIT_INFRA


if __name__ == "__main__":
    sys.exit(main())
