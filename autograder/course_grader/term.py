"""The course file, ``autograder/course.toml``: what an instructor sets for a term.

Read once, validated where it enters: every refusal is a ``TermError`` whose message names the
file and the field (``[lms] course_id: ...``), and nothing is written by a command that refuses.

Sections (all optional; a command that needs a missing one says which):

``[lms]``
    ``url`` (the Canvas site, ``https://canvas.example.edu``; http:// only for localhost), ``course_id`` (an integer),
    ``token_env`` (the environment variable holding an API token; default ``CANVAS_TOKEN``; the
    token itself never goes in the file), and ``[lms.assignments]``: one entry per lab,
    ``"01_roofline" = { id = 1234, name = "Lab 1: roofline" }``.
``roster``
    A path (relative to the course file) to the roster CSV (``read_roster``).
``[deadlines]``
    ``"01_roofline" = 2027-01-15T17:00:00+01:00``: a TOML date-time with its time zone (one
    without is refused), or the same as an ISO 8601 string.
``[extensions]``
    ``alice = { "01_roofline" = 48 }``: extra hours for one learner (in the roster) on one lab
    (with a deadline).
``[late_policy]``
    ``method`` ("none", "percent_per_day", "zero"), ``percent_per_day``, ``cap`` (percent, at most
    100), ``zero_after_days`` (``LatePolicy``, ``late_penalty``).
``[similarity]``
    ``threshold``: a pair of learners whose exercise cells reach this similarity (above 0, at most 1;
    default 0.8) is flagged for a person to read (``course_grader.similarity``).
``[grade_on_submit]``
    ``per_learner`` (jobs queued or running per learner at most, a positive integer; default 2),
    ``jobs`` (jobs running at once, a positive integer; default 1), ``cluster`` (a Dask scheduler
    address such as ``tcp://host:8786``; default none: local threads) (``GradeOnSubmit``,
    ``course_grader.on_submit``).

Format: TOML 1.0, read with the standard library's ``tomllib``.
"""
from __future__ import annotations

import csv
import datetime as dt
import io
import math
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from .paths import REPO_ROOT

COURSE_FILE = REPO_ROOT / "autograder" / "course.toml"


def course_labs(root: Path = REPO_ROOT) -> tuple[str, ...]:
    """The labs of the course at ROOT: those with an nbgrader source notebook,
    ROOT/solutions/{lab}/{lab}.ipynb (none when there is no solutions/ folder)."""
    folder = Path(root) / "solutions"
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.name for p in folder.iterdir() if (p / f"{p.name}.ipynb").is_file()))


ROSTER_COLUMNS = ("learner", "canvas_id", "name", "sis_user_id", "sis_login_id", "section")
LATE_METHODS = ("none", "percent_per_day", "zero")
SIMILARITY_THRESHOLD = 0.8   # the default of [similarity] threshold
LOOPBACK = ("localhost", "127.0.0.1", "::1")   # the only hosts [lms] url may name with http://


class TermError(ValueError):
    """The course file (or a file it names) cannot be used; the message names the field."""


@dataclass(frozen=True)
class RosterEntry:
    learner: str
    canvas_id: int
    name: str = ""
    sis_user_id: str = ""
    sis_login_id: str = ""
    section: str = ""


def read_roster(path: Path | str) -> dict[str, RosterEntry]:
    """The roster CSV at PATH: ``learner`` (the course id, the submission folder's name) and
    ``canvas_id`` (the Canvas user id, an integer) required; ``name``, ``sis_user_id``,
    ``sis_login_id``, ``section`` optional. Returns {learner: RosterEntry}.

    Raises:
        TermError: missing file or column, unknown column, an empty or repeated learner, a
            canvas_id that is not a positive integer or that two learners share.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TermError(f"roster {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TermError(f"roster {path}: cannot be read as UTF-8 text: {exc}") from None
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in ("learner", "canvas_id") if c not in header]
    if missing:
        raise TermError(f"roster {path}: missing column(s) {missing} (columns: {', '.join(ROSTER_COLUMNS)})")
    unknown = [c for c in header if c not in ROSTER_COLUMNS]
    if unknown:
        raise TermError(f"roster {path}: unknown column(s) {unknown} (columns: {', '.join(ROSTER_COLUMNS)})")
    roster: dict[str, RosterEntry] = {}
    by_canvas: dict[int, str] = {}
    for line, row in enumerate(reader, start=2):
        learner = (row.get("learner") or "").strip()
        if not learner:
            raise TermError(f"roster {path} line {line}: learner is empty")
        if learner in roster:
            raise TermError(f"roster {path} line {line}: learner {learner!r} is listed twice")
        raw = (row.get("canvas_id") or "").strip()
        if not (raw.isascii() and raw.isdigit()) or int(raw) <= 0:   # "²" and "１２" are digits to isdigit
            raise TermError(f"roster {path} line {line}: canvas_id of {learner!r} must be a positive integer, "
                            f"got {raw!r}")
        cid = int(raw)
        if cid in by_canvas:
            raise TermError(f"roster {path} line {line}: canvas_id {cid} is also the id of {by_canvas[cid]!r}")
        by_canvas[cid] = learner
        roster[learner] = RosterEntry(learner, cid, *((row.get(c) or "").strip() for c in ROSTER_COLUMNS[2:]))
    return roster




@dataclass(frozen=True)
class Assignment:
    lab: str
    id: int
    name: str


@dataclass(frozen=True)
class LMS:
    url: str
    course_id: int
    token_env: str = "CANVAS_TOKEN"
    assignments: dict[str, Assignment] = field(default_factory=dict)


@dataclass(frozen=True)
class LatePolicy:
    """How a late submission loses points (``late_penalty``). ``method``: "none" (no penalty),
    "percent_per_day" (PERCENT_PER_DAY of the score for each started day late, at most CAP
    percent; after ZERO_AFTER_DAYS started days, the whole score) or "zero" (any lateness, the
    whole score)."""
    method: str = "none"
    percent_per_day: float = 0.0
    cap: float = 100.0
    zero_after_days: int | None = None


@dataclass(frozen=True)
class GradeOnSubmit:
    """The on-submit worker's settings (``course_grader.on_submit``): at most PER_LEARNER jobs queued
    or running per learner, JOBS running at once, on the Dask scheduler at CLUSTER (None: local threads)."""
    per_learner: int = 2
    jobs: int = 1
    cluster: str | None = None


@dataclass(frozen=True)
class Term:
    path: Path
    lms: LMS | None = None
    roster: Path | None = None
    deadlines: dict[str, dt.datetime] = field(default_factory=dict)   # lab -> aware datetime
    extensions: dict[tuple[str, str], dt.timedelta] = field(default_factory=dict)   # (learner, lab) -> extra time
    late_policy: LatePolicy = LatePolicy()
    similarity_threshold: float = SIMILARITY_THRESHOLD   # [similarity] threshold (course_grader.similarity)
    grade_on_submit: GradeOnSubmit = GradeOnSubmit()

    def deadline(self, learner: str, lab: str) -> dt.datetime | None:
        """LAB's deadline for LEARNER, their extension included (None: the lab has no deadline)."""
        base = self.deadlines.get(lab)
        return None if base is None else base + self.extensions.get((learner, lab), dt.timedelta(0))


def late_penalty(policy: LatePolicy, score: float, seconds_late: float) -> float:
    """Points taken from SCORE for a submission SECONDS_LATE seconds past its deadline (extension
    included); 0 when on time. A started day counts as a day: 1 s late is one day late. The
    course's policy, described in autograder/README.md ("Deadlines, extensions and the late policy").

    Raises:
        ValueError: a negative or non-finite score or lateness.
    """
    if not (math.isfinite(score) and score >= 0 and math.isfinite(seconds_late) and seconds_late >= 0):
        raise ValueError(f"late_penalty: score and seconds_late must be finite and >= 0, got {score}, {seconds_late}")
    if seconds_late == 0 or policy.method == "none":
        return 0.0
    days = math.ceil(seconds_late / 86_400)
    if policy.method == "zero" or (policy.zero_after_days is not None and days > policy.zero_after_days):
        return float(score)
    return float(score) * min(policy.cap, policy.percent_per_day * days) / 100.0


def _number(value, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise TermError(f"{where}: expected a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _late_policy(raw, path: Path) -> LatePolicy:
    if not isinstance(raw, dict):
        raise TermError(f"{path}: [late_policy] must be a table")
    unknown = set(raw) - {"method", "percent_per_day", "cap", "zero_after_days"}
    if unknown:
        raise TermError(f"{path}: [late_policy] has unknown field(s) {sorted(unknown)}")
    method = raw.get("method", "none")
    if method not in LATE_METHODS:
        raise TermError(f"{path}: [late_policy] method: expected one of {', '.join(LATE_METHODS)}, got {method!r}")
    per_day = _number(raw.get("percent_per_day", 0), f"{path}: [late_policy] percent_per_day (percent)", 0, 100)
    if method == "percent_per_day" and per_day == 0:
        raise TermError(f"{path}: [late_policy] percent_per_day: method percent_per_day needs a percentage above 0")
    cap = _number(raw.get("cap", 100), f"{path}: [late_policy] cap (percent)", 0, 100)
    zero_after = raw.get("zero_after_days")
    if zero_after is not None:
        zero_after = _int(zero_after, f"{path}: [late_policy] zero_after_days")
    return LatePolicy(method, per_day, cap, zero_after)


def _grade_on_submit(raw, path: Path) -> GradeOnSubmit:
    if not isinstance(raw, dict):
        raise TermError(f"{path}: [grade_on_submit] must be a table")
    unknown = set(raw) - {"per_learner", "jobs", "cluster"}
    if unknown:
        raise TermError(f"{path}: [grade_on_submit] has unknown field(s) {sorted(unknown)}")
    cluster = raw.get("cluster")
    if cluster is not None:
        cluster = _str(cluster, f"{path}: [grade_on_submit] cluster")
        if "://" not in cluster:
            raise TermError(f"{path}: [grade_on_submit] cluster: expected a Dask scheduler address such as "
                            f"tcp://host:8786, got {cluster!r}")
    return GradeOnSubmit(per_learner=_int(raw.get("per_learner", 2), f"{path}: [grade_on_submit] per_learner"),
                         jobs=_int(raw.get("jobs", 1), f"{path}: [grade_on_submit] jobs"), cluster=cluster)


def _deadlines(raw, path: Path, labs) -> dict[str, dt.datetime]:
    if not isinstance(raw, dict):
        raise TermError(f"{path}: [deadlines] must be a table of lab = date-time")
    out = {}
    for lab, value in raw.items():
        where = f"{path}: [deadlines] {lab}"
        _lab(lab, labs, where)
        if isinstance(value, str):
            try:
                value = dt.datetime.fromisoformat(value)
            except ValueError:
                raise TermError(f"{where}: not a date-time: {value!r} (write 2027-01-15T17:00:00+01:00)") from None
        if not isinstance(value, dt.datetime):
            raise TermError(f"{where}: expected a date-time with a time zone, got {value!r}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise TermError(f"{where}: {value.isoformat()} has no time zone: add one (Z for UTC, or +01:00)")
        try:
            out[lab] = value.astimezone(dt.timezone.utc)
        except OverflowError:
            raise TermError(f"{where}: {value.isoformat()} is out of range in UTC") from None
    return out


def _extensions(raw, path: Path, roster: Path | None) -> dict[tuple[str, str], dt.timedelta]:
    if not isinstance(raw, dict):
        raise TermError(f"{path}: [extensions] must be a table of learner = {{ lab = hours }}")
    if raw and roster is None:
        raise TermError(f"{path}: [extensions] needs a roster (roster = \"FILE\") to check the learners it names")
    known = read_roster(roster) if raw else {}
    out = {}
    for learner, labs in raw.items():
        where = f"{path}: [extensions] {learner}"
        if learner not in known:
            raise TermError(f"{where}: unknown learner (not in the roster {roster})")
        if not isinstance(labs, dict) or not labs:
            raise TermError(f"{where}: expected {{ lab = hours, ... }}, got {labs!r}")
        for lab, hours in labs.items():
            out[(learner, lab)] = dt.timedelta(hours=_number(hours, f"{where} {lab} (hours)", 0, 24 * 365))
    return out


def _int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TermError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _str(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TermError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _lab(lab: str, labs, where: str) -> None:
    if labs is not None and lab not in labs:
        raise TermError(f"{where}: unknown lab (the labs are {', '.join(sorted(labs))})")


def _lms(raw, path: Path, labs) -> LMS:
    if not isinstance(raw, dict):
        raise TermError(f"{path}: [lms] must be a table")
    unknown = set(raw) - {"url", "course_id", "token_env", "assignments"}
    if unknown:
        raise TermError(f"{path}: [lms] has unknown field(s) {sorted(unknown)}")
    url = _str(raw.get("url"), f"{path}: [lms] url")
    if not url.startswith(("https://", "http://")):
        raise TermError(f"{path}: [lms] url: expected an http(s) address, got {url!r}")
    host = urllib.parse.urlsplit(url).hostname or ""
    if url.startswith("http://") and host not in LOOPBACK:   # the token goes in every request's header
        raise TermError(f"{path}: [lms] url: {url!r} would send the API token unencrypted; use https:// "
                        "(http:// only for this machine: localhost, 127.0.0.1)")
    assignments = {}
    table = raw.get("assignments", {})
    if not isinstance(table, dict):
        raise TermError(f"{path}: [lms.assignments] must be a table of lab = {{ id = N, name = \"...\" }}")
    for lab, entry in table.items():
        where = f"{path}: [lms.assignments] {lab}"
        _lab(lab, labs, where)
        if not isinstance(entry, dict) or set(entry) - {"id", "name"} or "id" not in entry:
            raise TermError(f"{where}: expected {{ id = N, name = \"...\" }}, got {entry!r}")
        assignments[lab] = Assignment(lab, _int(entry["id"], f"{where} id"),
                                      _str(entry.get("name", lab), f"{where} name"))
    return LMS(url=url.rstrip("/"), course_id=_int(raw.get("course_id"), f"{path}: [lms] course_id"),
               token_env=_str(raw.get("token_env", "CANVAS_TOKEN"), f"{path}: [lms] token_env"),
               assignments=assignments)


def load(path: Path | str = COURSE_FILE, labs: tuple[str, ...] | None = None) -> Term:
    """Read and validate the course file at PATH, its lab names against LABS (None: not checked).
    A missing file is an empty term (no LMS, no roster, no deadlines).

    Raises:
        TermError: the file does not parse as TOML, or a field is missing, of the wrong type or unknown.
    """
    path = Path(path)
    if not path.exists():
        return Term(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TermError(f"{path}: not a valid TOML file: {exc}") from None
    unknown = set(raw) - {"lms", "roster", "deadlines", "extensions", "late_policy", "similarity",
                          "grade_on_submit"}
    if unknown:
        raise TermError(f"{path}: unknown section(s) or field(s) {sorted(unknown)}")
    roster = None
    if "roster" in raw:
        roster = (path.parent / _str(raw["roster"], f"{path}: roster")).resolve()
    deadlines = _deadlines(raw.get("deadlines", {}), path, labs)
    extensions = _extensions(raw.get("extensions", {}), path, roster)
    for (learner, lab), extra in extensions.items():
        if lab not in deadlines:
            raise TermError(f"{path}: [extensions] {learner} {lab}: the lab has no deadline in [deadlines]")
        try:
            deadlines[lab] + extra
        except OverflowError:
            raise TermError(f"{path}: [extensions] {learner} {lab}: the deadline with this extension is past "
                            "the year 9999") from None
    return Term(path, lms=_lms(raw["lms"], path, labs) if "lms" in raw else None, roster=roster, deadlines=deadlines,
                extensions=extensions, late_policy=_late_policy(raw.get("late_policy", {}), path),
                similarity_threshold=_similarity(raw.get("similarity", {}), path),
                grade_on_submit=_grade_on_submit(raw.get("grade_on_submit", {}), path))


def _similarity(raw, path: Path) -> float:
    if not isinstance(raw, dict):
        raise TermError(f"{path}: [similarity] must be a table")
    unknown = set(raw) - {"threshold"}
    if unknown:
        raise TermError(f"{path}: [similarity] has unknown field(s) {sorted(unknown)}")
    return check_threshold(raw.get("threshold", SIMILARITY_THRESHOLD), f"{path}: [similarity] threshold")


def check_threshold(value, where: str) -> float:
    """VALUE as a similarity threshold (``course_grader.similarity``): a number above 0 and at most 1.

    Raises:
        TermError: naming WHERE (the course-file field or the command-line option) when it is not one.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise TermError(f"{where}: expected a number above 0 and at most 1, got {value!r}")
    return float(value)
