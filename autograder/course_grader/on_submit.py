"""Grading on submit: ``python -m course_grader.on_submit``, a small worker on nbgrader's exchange.

It polls the course's inbound folder (``EXCHANGE/<course>/inbound/``, where ``nbgrader submit`` and
the Assignments panel put each submission as ``LEARNER+LAB+TIMESTAMP+RANDOM/``) and queues a job for
each submission it has not handled yet. A job runs nbgrader's own steps for that one learner, in the
instructor's course root with the course config (the hub's ``autograder/hub/instructor/``, so the
same sandbox, judge and feedback rules as a typed ``nbgrader autograde``), in one child process
(``--grade-one LEARNER LAB``: nbgrader's apps one after another, as nbgrader's own test harness runs
them, which saves three interpreter and config start-ups per job)::

    nbgrader collect LAB --student LEARNER --update
    nbgrader autograde LAB --student LEARNER --force
    nbgrader generate_feedback LAB --student LEARNER --force
    nbgrader release_feedback LAB --student LEARNER

after which the learner's Assignments panel offers their feedback (``fetch_feedback``). ``collect``
takes the learner's newest submission, so a job grades the newest one present when it starts (the
status file records which: ``graded_timestamp``).

Rate limit: at most ``per_learner`` jobs queued or running per learner (``[grade_on_submit]
per_learner`` in the course file, or ``--per-learner``; default 2). A submission over the limit is
not graded on submit: it is logged with the learner and the reason, recorded as ``skipped``, and
stays in the exchange for the instructor's batch (``nbgrader collect`` takes the newest anyway).

Status file (JSON lines, ``<course root>/autograder/work/grade_on_submit.jsonl`` unless ``--status``):
one line per change of a job's state, the newest line of a submission being its state now:
``inbound`` (the exchange folder's name), ``learner``, ``lab``, ``timestamp``, ``state`` (queued,
running, graded, failed, skipped), ``queued``/``started``/``finished`` (UTC, ISO 8601), ``score`` (what
the learner's feedback shows: after the late penalty), ``raw_score``, ``penalty``, ``max_score``,
``graded_timestamp``, ``reason`` (skipped) or ``error`` (failed). A worker that starts
again reads it: a finished or skipped submission is never graded twice, a queued or running one is
queued again. ``--show`` prints it as a table.

Where jobs run: in ``jobs`` local worker threads (default 1: one nbgrader process writes the sqlite
gradebook at a time), or with ``--cluster ADDRESS`` (``[grade_on_submit] cluster``) as tasks on that
Dask scheduler (``distributed.Client.submit``), at most ``jobs`` out at once. Dask workers must see
the course root and the exchange at the same paths (the same machine, or a shared filesystem), and
run a checkout of the same commit (checked before the first job, as ``grade.py --cluster`` does).

What it defends: the sandbox and judge are the course config's, as for the typed commands; the
feedback is generated the same way (hidden tests and their inputs removed); a learner id that is not
a plain name (``..``, ``/``, control characters), a lab the course does not have and, with a roster in
the course file, a learner id not in it (made-up ids would each get past the per-learner limit and
add a student to the gradebook) are skipped, never passed to nbgrader; so is an entry with a symbolic
link or special file in it (``collect`` follows links: a notebook linked to solutions/ would reach
the feedback), one that cannot be read, or one whose time is not a date; a job refuses to collect
while any ``LEARNER+LAB+*`` entry is such a one. What it does not: as with ``nbgrader collect``, the
learner id and time in an inbound folder's name are the submitter's choice (autograder/README.md,
"Running a course hub"); a link made between the job's check and collect's copy (a race) is copied.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import term as term_mod
from .config import COURSE_ID, WORK
from .text import printable

log = logging.getLogger("course_grader.on_submit")

STATUS_FILE = "grade_on_submit.jsonl"           # in <course root>/WORK
FINAL_STATES = ("graded", "failed", "skipped")  # a submission in one of these is never queued again
# a learner id nbgrader may use as a folder name: no path separators, no leading dot, no control characters
PLAIN_NAME = re.compile(r"[A-Za-z0-9_@-][A-Za-z0-9_.@-]*")
OUTPUT_TAIL = 2000                              # characters of a failed command's output kept in `error`
STAMP_BYTES = 1000                              # of timestamp.txt read (nbgrader writes one line; a learner may not)
CHILDREN: set[subprocess.Popen] = set()        # the jobs' child processes running now, ended when the worker stops


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Submission:
    """One folder of the inbound exchange: ``LEARNER+LAB+TIMESTAMP+RANDOM`` (nbgrader's naming)."""
    inbound: str
    learner: str
    lab: str
    timestamp: str


def parse_inbound(name: str) -> Submission | None:
    """The submission an inbound folder's NAME stands for, or None when it is not of nbgrader's form
    ``LEARNER+LAB+TIMESTAMP[+RANDOM]`` (split from the right, as ``nbgrader collect`` does, so a
    learner id may hold a ``+``)."""
    parts = name.rsplit("+", 3)
    if len(parts) < 3:
        return None
    if len(parts) == 3:
        parts.append("")
    learner, lab, timestamp, _ = parts
    return Submission(name, learner, lab, timestamp)


def course_env(course_root: Path, exchange: Path) -> dict[str, str]:
    """The environment of an instructor's hub server, for nbgrader run in COURSE_ROOT: the course
    config of this checkout (``autograder/hub/instructor/``) moved to COURSE_ROOT, and the exchange."""
    from .hub import INSTRUCTOR_CONFIG, VENV_BIN
    return dict(os.environ, JUPYTER_CONFIG_PATH=str(INSTRUCTOR_CONFIG), COURSE_HUB_COURSE_ROOT=str(course_root),
                COURSE_EXCHANGE_ROOT=str(exchange), PATH=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))


def links_and_special_files(folder: Path) -> list[str]:
    """Paths under FOLDER (relative) that are symbolic links or not regular files or folders: nbgrader
    collect follows links when it copies a submission (a notebook linked to solutions/ or to another
    learner's submission would be graded and shown in this learner's feedback) and a fifo blocks it."""
    def plain(path: str) -> bool:
        mode = os.lstat(path).st_mode
        return stat.S_ISREG(mode) or stat.S_ISDIR(mode)
    if not plain(folder):
        return ["."]
    return sorted(str((Path(top) / name).relative_to(folder))
                  for top, dirs, files in os.walk(folder, followlinks=False, onerror=_raise)
                  for name in dirs + files if not plain(os.path.join(top, name)))


def _raise(exc: OSError) -> None:
    raise exc


def read_stamp(path: Path) -> str:
    """The first ``STAMP_BYTES`` of the timestamp.txt at PATH, stripped ('' for a link or a file that is
    not a regular file: never opened, so a fifo cannot block the worker)."""
    if not stat.S_ISREG(os.lstat(path).st_mode):
        return ""
    with open(path, "rb") as f:
        return f.read(STAMP_BYTES).decode("utf-8", errors="replace").strip()


def stamp_problem(timestamp: str) -> str:
    """Why ``nbgrader collect`` cannot read TIMESTAMP (an inbound folder name's third part), '' when it can."""
    from nbgrader.utils import parse_utc
    try:
        parse_utc(timestamp)
    except (ValueError, OverflowError, TypeError) as exc:
        return f"the time in the folder name is not a date ({type(exc).__name__}): nbgrader collect refuses " \
               "every submission of this learner and lab while it is in the exchange (remove it)"
    return ""


def collect_problem(inbound: Path, learner: str, lab: str) -> str:
    """Why ``nbgrader collect LAB --student LEARNER`` must not run now ('' when it may): it copies the
    newest of every INBOUND/LEARNER+LAB+* entry, following links, and fails on a time that is not a date,
    so each such entry is checked, not only the one that queued the job."""
    for folder in sorted(inbound.glob(f"{learner}+{lab}+*")):
        sub = parse_inbound(folder.name)
        try:
            is_folder = stat.S_ISDIR(os.lstat(folder).st_mode)
            odd = links_and_special_files(folder) if is_folder else []
        except OSError as exc:
            return f"{printable(folder.name)}: cannot be read: {exc}"
        why = (f"symbolic links or special files ({', '.join(odd[:5])})" if odd else
               "not a folder (a file or a link)" if not is_folder else
               stamp_problem(sub.timestamp) if sub is not None else "not an nbgrader submission name")
        if why:
            return f"{printable(folder.name)}: {why}; not collected"
    return ""


class JobError(RuntimeError):
    """An nbgrader step of a job failed; the message names the command and ends with its output."""


def nbgrader_steps(learner: str, lab: str) -> list[list[str]]:
    """The nbgrader commands (without ``nbgrader``) that grade LEARNER's newest submission of LAB and
    release its feedback."""
    return [["collect", lab, "--student", learner, "--update"],
            ["autograde", lab, "--student", learner, "--force"],
            ["generate_feedback", lab, "--student", learner, "--force"],
            ["release_feedback", lab, "--student", learner]]


def run_nbgrader_steps(steps: list[list[str]]) -> None:
    """Run each of STEPS (``["autograde", LAB, ...]``) as ``nbgrader STEP`` would, one after another
    in this process, with the configuration nbgrader finds from here (``JUPYTER_CONFIG_PATH``, the
    working folder): ``NbGraderApp.instance()``, ``initialize``, ``start``, ``reset``, as nbgrader's
    own test harness (``nbgrader.tests.run_nbgrader``) does.

    Raises:
        JobError: a step exited non-zero (the message names it).
    """
    from jupyter_core.application import NoStart
    from nbgrader.apps import NbGraderApp

    for step in steps:
        app = NbGraderApp.instance()
        try:
            app.initialize(step)
            app.start()
        except NoStart:   # a subcommand's normal end
            pass
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise JobError(f"`nbgrader {' '.join(step)}` exited {exc.code}") from None
        finally:
            app.reset()


def check_kernel_imports() -> None:
    """Refuse a job whose sandboxed kernel would import another course_lib than this process (the
    driver's check, ``grade.check_kernel_course_lib``): otherwise every test fails its first import
    and the learner gets a page of zeros. Skipped where the sandbox cannot run (the course config
    then refuses to start a kernel by itself).

    Raises:
        JobError: naming both locations.
    """
    from . import grade, sandbox
    if not sandbox.sandbox_status()[0]:
        return
    try:
        grade.check_kernel_course_lib()
    except grade.InfrastructureError as exc:
        raise JobError(f"not graded: {exc}") from None


def grade_submission(course_root: str, exchange: str, learner: str, lab: str) -> dict:
    """Grade LEARNER's newest submission of LAB from the exchange at EXCHANGE: collect, autograde,
    generate_feedback and release_feedback (``nbgrader_steps``, nbgrader's commands as an instructor
    types them) in COURSE_ROOT with the course config, in a child process (``--grade-one``). Runs
    where it is called: a worker thread, or a Dask worker that sees COURSE_ROOT and EXCHANGE at the
    same paths.

    Returns: {"started", "finished" (UTC ISO 8601), "score" (after the late penalty), "raw_score",
    "penalty", "max_score" (points, from the
    gradebook), "graded_timestamp" (the submission's time, from its timestamp.txt)}.

    Raises:
        JobError: a step failed (the message names it and ends with the child's output).
    """
    from nbgrader.api import Gradebook

    started, root = now(), Path(course_root)
    # -P: the child runs in COURSE_ROOT, which must not come first on sys.path: a course root that is a
    # clone of the course would shadow the course_lib and course_grader of this venv, which the
    # sandboxed kernel imports (every learner would score 0; --grade-one checks it)
    command = [sys.executable, "-P", "-m", "course_grader.on_submit", "--course-root", str(root), "--exchange",
               str(exchange), "--grade-one", learner, lab]
    with subprocess.Popen(command, cwd=root, env=course_env(root, Path(exchange)), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as child:
        CHILDREN.add(child)
        try:
            output, _ = child.communicate()
        finally:
            CHILDREN.discard(child)
    if child.returncode != 0:
        raise JobError(f"grading {learner} {lab} exited {child.returncode}:\n{output[-OUTPUT_TAIL:]}")
    stamp = root / WORK / "submitted" / learner / lab / "timestamp.txt"
    with Gradebook("sqlite:///" + str(root / WORK / "gradebook.db"), COURSE_ID) as gb:
        sub = gb.find_submission(lab, learner)
        raw, penalty, max_score = float(sub.score), float(sub.late_submission_penalty or 0), float(sub.max_score)
    # the score the learner's feedback shows: after the late penalty (course_grader.late), as nbgrader's
    # export computes it (nbgrader.plugins.export)
    return {"started": started, "finished": now(), "score": max(0.0, raw - penalty), "max_score": max_score,
            "raw_score": raw, "penalty": penalty,
            "graded_timestamp": read_stamp(stamp) if os.path.lexists(stamp) else None}


def read_status(path: Path) -> dict[str, dict]:
    """{inbound folder: its newest record} from the status file at PATH ({} when there is none). A
    last line cut short (the worker stopped while writing it) is left out."""
    latest: dict[str, dict] = {}
    if not path.exists():
        return latest
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not {"inbound", "learner", "state"} <= set(record):
            log.warning("%s line %d is not a job record (left out)", path, number)
            continue
        latest[record["inbound"]] = record
    return latest


class Worker:
    """The queue: scan the inbound folder, queue or skip new submissions, run jobs, record each change.

    Args:
        course_root: the instructor's course root (``solutions/``, ``autograder/work/``).
        exchange: nbgrader's exchange root (the course's folders are under EXCHANGE/<course>).
        per_learner: jobs queued or running per learner at most (a positive integer).
        jobs: jobs running at once at most (a positive integer).
        submit: ``submit(function, *args)`` returning a future (``done()``, ``result()``): a
            ``ThreadPoolExecutor``'s, or a Dask ``Client``'s; None: JOBS local worker threads.
        job: the job function, ``job(course_root, exchange, learner, lab) -> dict`` (``grade_submission``).
        status: the status file (default COURSE_ROOT/autograder/work/grade_on_submit.jsonl).
        labs: the labs graded on submit (default: those of the course root now, ``term.course_labs``).
        learners: the learner ids graded on submit (the course file's roster); None: any plain name.

    Raises:
        ValueError: PER_LEARNER or JOBS is not a positive integer.
    """

    def __init__(self, course_root: Path, exchange: Path, *, per_learner: int = 2, jobs: int = 1, submit=None,
                 job=grade_submission, status: Path | None = None, labs: tuple[str, ...] | None = None,
                 learners=None) -> None:
        for name, value in (("per_learner", per_learner), ("jobs", jobs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Worker: {name} must be a positive integer, got {value!r}")
        self.course_root, self.exchange = Path(course_root), Path(exchange)
        self.inbound = self.exchange / COURSE_ID / "inbound"
        self.per_learner, self.jobs, self.job = per_learner, jobs, job
        self._pool = None
        if submit is None:
            self._pool = ThreadPoolExecutor(jobs, thread_name_prefix="grade-on-submit")
            submit = self._pool.submit
        self.submit = submit
        self.status = Path(status) if status else self.course_root / WORK / STATUS_FILE
        self._labs = None if labs is None else tuple(labs)
        self._learners = None if learners is None else frozenset(learners)
        self.records = read_status(self.status)
        self.waiting: collections.deque[str] = collections.deque()   # inbound names, oldest first
        self.running: dict[str, object] = {}                          # inbound name -> future
        for name, record in self.records.items():   # queued or running when the last worker stopped
            if record["state"] not in FINAL_STATES:
                self.waiting.append(name)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def active(self, learner: str) -> int:
        """LEARNER's jobs queued or running."""
        return sum(1 for name in [*self.waiting, *self.running] if self.records[name]["learner"] == learner)

    def _record(self, name: str, **changes) -> None:
        """Change the record of inbound folder NAME and append it to the status file (one write)."""
        record = dict(self.records.get(name, {}), **changes)
        self.records[name] = record
        self.status.parent.mkdir(parents=True, exist_ok=True)
        with open(self.status, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def scan(self) -> None:
        """Queue each new complete submission in the inbound folder, or skip it saying why. A
        submission is complete once nbgrader wrote its ``timestamp.txt`` (after the notebooks)."""
        if not self.inbound.is_dir():
            return
        for folder in sorted(self.inbound.iterdir(), key=lambda p: p.name):
            if folder.name in self.records:
                continue
            reason = None
            try:   # a learner's entry: a file, a fifo, a link, unreadable, a huge or endless timestamp.txt
                if not os.path.lexists(folder / "timestamp.txt"):
                    continue   # nbgrader is writing it
                odd = links_and_special_files(folder)
                if not odd and not read_stamp(folder / "timestamp.txt"):
                    continue   # nbgrader is writing it
            except OSError as exc:
                odd, reason = [], f"cannot be read: {type(exc).__name__}: {exc.strerror or exc}"
            if odd:
                reason = (f"symbolic links or special files in the submission ({', '.join(odd[:5])}): nbgrader "
                          "collect would follow them; not graded")
            sub = parse_inbound(folder.name)
            base = {"learner": sub.learner if sub else "", "lab": sub.lab if sub else "",
                    "timestamp": sub.timestamp if sub else "", "inbound": folder.name, "queued": now(),
                    "started": None, "finished": None, "score": None, "max_score": None,
                    "graded_timestamp": None, "reason": None, "error": None}
            if reason:   # the entry's files were refused above
                pass
            elif sub is None:
                reason = "not an nbgrader submission name (LEARNER+LAB+TIMESTAMP)"
            elif not PLAIN_NAME.fullmatch(sub.learner):
                reason = "the learner id is not a plain name (letters, digits, _ . @ -, no leading dot)"
            elif sub.lab not in (self._labs if self._labs is not None else term_mod.course_labs(self.course_root)):
                reason = f"no lab {sub.lab!r} in the course root {self.course_root}"
            elif self._learners is not None and sub.learner not in self._learners:
                reason = "the learner id is not in the course file's roster"
            elif problem := stamp_problem(sub.timestamp):
                reason = problem
            elif self.active(sub.learner) >= self.per_learner:
                reason = f"{self.active(sub.learner)} job(s) already queued or running (per_learner = " \
                         f"{self.per_learner}); left in the exchange for the instructor's batch"
            if reason:
                self._record(folder.name, **dict(base, state="skipped", reason=reason))
                log.warning("not graded on submit: %s (learner %s, lab %s): %s", printable(folder.name),
                            printable(base["learner"]), printable(base["lab"]), reason)
                continue
            self._record(folder.name, **base, state="queued")
            self.waiting.append(folder.name)
            log.info("queued %s", printable(folder.name))

    def reap(self) -> None:
        """Record each finished job: graded (score) or failed (error)."""
        for name, future in list(self.running.items()):
            if not future.done():
                continue
            del self.running[name]
            try:
                result = future.result()
            except Exception as exc:   # the job's error, or the Dask worker's
                self._record(name, state="failed", finished=now(), error=f"{type(exc).__name__}: {exc}")
                log.error("grading %s failed: %s", printable(name), printable(f"{type(exc).__name__}: {exc}"))
                continue
            self._record(name, state="graded", **result)
            log.info("graded %s: %s / %s", printable(name), result.get("score"), result.get("max_score"))

    def dispatch(self) -> None:
        """Start queued jobs, oldest first, while fewer than JOBS run."""
        while self.waiting and len(self.running) < self.jobs:
            name = self.waiting.popleft()
            record = self.records[name]
            self._record(name, state="running", started=now())
            self.running[name] = self.submit(self.job, str(self.course_root), str(self.exchange),
                                             record["learner"], record["lab"])

    def step(self) -> None:
        self.reap()
        self.scan()
        self.dispatch()

    def run(self, interval: float = 5.0, once: bool = False) -> None:
        """Poll every INTERVAL seconds until stopped; with ONCE, until the queue is empty."""
        while True:
            self.step()
            if once and not self.waiting and not self.running:
                return
            time.sleep(interval if not once else min(interval, 0.2))


def error_summary(error: str) -> str:
    """A failed job's error in one line: its first line, and where the cause usually is: the last
    traceback's exception line (``module.Name: message``), else the last line of the child's output
    that says ``ERROR``, ``error:``, ``cannot`` or refuses."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return ""
    # a traceback's own last line, "module.Name: message"; else a line that says error or refuses
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    after = lines[tracebacks[-1] + 1:] if tracebacks else []
    cause = next((line for line in reversed(after) if re.match(r"[A-Za-z_][\w.]*: ", line)), "") or \
        next((line for line in reversed(lines[1:]) if re.search(r"ERROR|[Ee]rror:|cannot|refus", line)), "")
    return lines[0] + (f" ... {cause}" if cause else "")


def show(status: Path) -> str:
    """The status file as a table: one line per submission, its state now."""
    records = read_status(status)
    lines = [f"{'learner':<20} {'lab':<22} {'submitted':<30} {'state':<8} {'score':>11}  finished / why"]
    for r in sorted(records.values(), key=lambda r: r.get("queued") or ""):
        score = f"{r['score']:g} / {r['max_score']:g}" if r.get("score") is not None else ""
        why = r.get("reason") or error_summary(r.get("error") or "") or r.get("finished") or ""
        if r.get("penalty"):
            why = f"late penalty {r['penalty']:g} (raw {r['raw_score']:g}); {why}"
        lines.append(f"{printable(r['learner'])[:20]:<20} {printable(r['lab'])[:22]:<22} "
                     f"{printable(r['timestamp'])[:30]:<30} {r['state']:<8} {score:>11}  {printable(why)}")
    return "\n".join(lines) + f"\n{len(records)} submission(s) in {status}"


def _positive(option: str):
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{option}: expected a positive integer, got {text!r}")
        return int(text)
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"--interval: expected seconds from 0.1 to 3600, got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from .hub import course_root, exchange_root
    parser = argparse.ArgumentParser(
        prog="python -m course_grader.on_submit",
        description="Grade each submission as it reaches nbgrader's exchange: collect, autograde (sandbox and "
                    "judge), generate_feedback and release_feedback for that one learner, at most N queued per "
                    "learner (autograder/README.md, Running a course hub: Grading on submit).")
    parser.add_argument("--course-root", type=Path, default=Path(course_root()),
                        help="the instructor's course root (default: $COURSE_HUB_COURSE_ROOT, else this checkout)")
    parser.add_argument("--exchange", type=Path, default=Path(exchange_root()),
                        help="nbgrader's exchange root (default: $COURSE_EXCHANGE_ROOT, else /srv/nbgrader/exchange)")
    parser.add_argument("--course", type=Path, help="the course file, for [grade_on_submit] (default: "
                        "COURSE_ROOT/autograder/course.toml)")
    parser.add_argument("--per-learner", type=_positive("--per-learner"),
                        help="jobs queued or running per learner at most (default: the course file's, else 2)")
    parser.add_argument("--jobs", type=_positive("--jobs"),
                        help="jobs running at once at most (default: the course file's, else 1)")
    parser.add_argument("--cluster", metavar="ADDRESS", help="run each job on this Dask scheduler (tcp://HOST:8786); "
                        "its workers must see the course root and the exchange (default: the course file's, else "
                        "local worker threads)")
    parser.add_argument("--status", type=Path, help=f"the status file (default: COURSE_ROOT/{WORK}/{STATUS_FILE})")
    parser.add_argument("--interval", type=_seconds, default=5.0, help="seconds between two scans (default 5)")
    parser.add_argument("--once", action="store_true", help="grade what is in the exchange now, then exit")
    parser.add_argument("--show", action="store_true", help="print the status file as a table and exit")
    parser.add_argument("--grade-one", nargs=2, metavar=("LEARNER", "LAB"), help="grade LEARNER's newest "
                        "submission of LAB now, as a job does (collect, autograde, generate_feedback, "
                        "release_feedback), and exit; no status file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prog = "python -m course_grader.on_submit"
    status = args.status or args.course_root / WORK / STATUS_FILE
    if args.show:
        print(show(status))
        return 0
    if args.grade_one:
        learner, lab = args.grade_one
        if not PLAIN_NAME.fullmatch(learner) or lab not in term_mod.course_labs(args.course_root):
            print(f"{prog}: --grade-one {printable(learner)} {printable(lab)}: expected a plain learner id and a lab "
                  f"of {args.course_root}", file=sys.stderr)
            return 2
        problem = collect_problem(args.exchange / COURSE_ID / "inbound", learner, lab)
        if problem:
            print(f"{prog}: --grade-one {learner} {lab}: {problem}", file=sys.stderr)
            return 1
        os.environ.update(course_env(args.course_root.resolve(), args.exchange.resolve()))
        os.chdir(args.course_root)
        try:
            check_kernel_imports()
            run_nbgrader_steps(nbgrader_steps(learner, lab))
        except JobError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 1
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s grade-on-submit %(levelname)s %(message)s")
    try:   # every refusal comes before the status file is written
        labs = term_mod.course_labs(args.course_root)
        if not labs:
            raise term_mod.TermError(f"--course-root {args.course_root}: no solutions/LAB/LAB.ipynb there")
        if not args.exchange.is_dir():
            raise term_mod.TermError(f"--exchange {args.exchange}: no such folder")
        inbound = args.exchange / COURSE_ID / "inbound"
        if inbound.is_dir() and not os.access(inbound, os.R_OK | os.X_OK):
            raise term_mod.TermError(f"--exchange {args.exchange}: cannot list {inbound} (run as the instructor who "
                                     "released the labs: COURSE_HUB_GRADER_USER)")
        course = term_mod.load(args.course or args.course_root / "autograder" / "course.toml", labs=labs)
        settings = course.grade_on_submit
        learners = set(term_mod.read_roster(course.roster)) if course.roster is not None else None
    except term_mod.TermError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    per_learner = args.per_learner or settings.per_learner
    jobs = args.jobs or settings.jobs
    address = args.cluster or settings.cluster
    submit, connection = None, None
    if address:
        from . import cluster, grade
        try:
            connection = cluster.Cluster(address, sandbox_lines=[], cell_timeout=None)
            connection.check()
        except grade.InfrastructureError as exc:
            if connection is not None:
                connection.close()
            print(f"{prog}: --cluster {address}: {exc}", file=sys.stderr)
            return 2
        submit = lambda function, *a: connection.client.submit(function, *a, pure=False)  # noqa: E731
    worker = Worker(args.course_root, args.exchange, per_learner=per_learner, jobs=jobs, submit=submit,
                    status=status, learners=learners)
    log.info("watching %s for %s (per_learner %d, jobs %d, %s); status in %s", worker.inbound, ", ".join(labs),
             per_learner, jobs, f"Dask at {address}" if address else "local threads", status)
    # The hub stops a service with SIGINT, then SIGTERM (a process started in the background may
    # ignore SIGINT): stop at once, ending a running job's child process; the job is queued again by
    # the next worker, from the status file.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: sys.exit(0))
    try:
        worker.run(args.interval, once=args.once)
    finally:
        for child in list(CHILDREN):
            child.terminate()
        worker.close()
        if connection is not None:
            connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
