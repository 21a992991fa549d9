"""Grades to the LMS: a Canvas gradebook-import CSV, a plain CSV, and an optional upload to Canvas.

``python -m course_grader.lms build/grading/grades.csv --roster roster.csv`` (or ``make export``)
reads the grading driver's ``grades.csv`` and writes, beside it unless ``--out`` says otherwise:

* ``canvas_gradebook.csv``: Canvas's gradebook import layout (Grades > Import): the columns
  ``Student, ID, SIS User ID, SIS Login ID, Section``, then one column per lab headed
  ``Name (assignment id)`` when the course file names the Canvas assignment (``Name`` alone
  makes Canvas create a new assignment on import), and a ``Points Possible`` row. A roster text
  cell that starts as a spreadsheet formula (``= + - @``, tab, CR) gets a ``'`` before it. A learner who
  did not submit a lab gets an empty cell, which Canvas's import leaves unchanged.
* ``gradebook.csv``: ``learner, lab, score, max_score, late, flags, error``, one row per graded
  submission, in the course's own ids.

Learner ids map to Canvas users through the roster CSV (``read_roster``). A graded learner missing
from the roster is never skipped silently: the row stays in ``gradebook.csv`` with the error
"not in the roster", is left out of the Canvas CSV and of an upload, and is listed at the end.

``--canvas`` sends the scores through the ``canvasapi`` package (Canvas's bulk grade update,
``POST /api/v1/courses/:course_id/assignments/:id/submissions/update_grades``, one call per lab,
then its Progress polled), to the course and assignments the course file's ``[lms]`` names
(``course_grader.term``). It is a dry run that contacts nothing unless ``--send`` is given.

Canvas import format: Instructure's guide "How do I import grades in the Gradebook?" (Canvas
Instructor Guide); the bulk update endpoint: Canvas REST API, Submissions, "Grade or comment on
multiple submissions".
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from pathlib import Path

import pandas as pd

from . import term as term_mod
from .term import RosterEntry, Term, TermError, read_roster

CANVAS_FIXED = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
NOT_IN_ROSTER = "not in the roster"
GRADE_COLUMNS = ("learner", "lab", "score", "max_score")


def read_grades(path: Path | str) -> pd.DataFrame:
    """The driver's ``grades.csv`` (learner ids kept as text: ``NA`` stays a name).

    Raises:
        TermError: missing file or column, or a score that is not a finite number.
    """
    path = Path(path)
    try:
        grades = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise TermError(f"grades {path}: no such file (run the grader first: make grade)") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise TermError(f"grades {path}: not a CSV table: {exc}") from None
    missing = [c for c in GRADE_COLUMNS if c not in grades.columns]
    if missing:
        raise TermError(f"grades {path}: missing column(s) {missing}")
    for column in ("score", "max_score"):
        values = pd.to_numeric(grades[column], errors="coerce")
        bad = grades[values.isna() | values.isin([float("inf"), float("-inf")])]   # "inf" and "1e999" parse
        if not bad.empty:
            r = bad.iloc[0]
            raise TermError(f"grades {path}: {column} of {r['learner']!r} / {r['lab']!r} is not a finite number: "
                            f"{r[column]!r}")
        grades[column] = values
    for column in ("late", "flags", "error"):
        if column not in grades.columns:
            grades[column] = ""
    return grades


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")   # a cell a spreadsheet would run as a formula


def _text(cell: str) -> str:
    """A roster text cell for the Canvas CSV, with a ' before a formula start (``=cmd|' /C calc'!A0``
    in a learner's display name ran in a spreadsheet opening the file; Canvas matches rows by ID)."""
    return "'" + cell if cell.startswith(FORMULA_STARTS) else cell


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def gradebook(grades: pd.DataFrame, roster: dict[str, RosterEntry]) -> pd.DataFrame:
    """The plain gradebook: learner, lab, score, max_score, late, flags, error; a learner missing
    from ROSTER keeps its row, with the error NOT_IN_ROSTER first."""
    book = grades[["learner", "lab", "score", "max_score", "late", "flags", "error"]].copy()
    absent = ~book["learner"].isin(list(roster))
    book.loc[absent, "error"] = [NOT_IN_ROSTER + (f"; {e}" if e else "") for e in book.loc[absent, "error"]]
    return book.reset_index(drop=True)


def canvas_table(book: pd.DataFrame, roster: dict[str, RosterEntry], term: Term) -> list[list[str]]:
    """Canvas's import table (header, Points Possible, one row per roster learner), as text cells."""
    labs = sorted(set(book["lab"]) | set(term.lms.assignments if term.lms else ()))
    assignments = term.lms.assignments if term.lms else {}
    header = list(CANVAS_FIXED) + [f"{assignments[lab].name} ({assignments[lab].id})" if lab in assignments
                                   else lab for lab in labs]
    maxima = book.groupby("lab")["max_score"].max().to_dict()
    points = ["Points Possible", "", "", "", ""] + [_number(maxima[lab]) if lab in maxima else "" for lab in labs]
    scores = {(r.learner, r.lab): r.score for r in book.itertuples()}
    rows = [header, points]
    for e in sorted(roster.values(), key=lambda e: (e.name or e.learner).lower()):
        rows.append([_text(e.name or e.learner), str(e.canvas_id),
                     *map(_text, (e.sis_user_id, e.sis_login_id, e.section))]
                    + [_number(scores[(e.learner, lab)]) if (e.learner, lab) in scores else "" for lab in labs])
    return rows


def write_exports(book: pd.DataFrame, roster: dict[str, RosterEntry], term: Term, out: Path) -> None:
    """Write OUT/gradebook.csv and OUT/canvas_gradebook.csv for the plain gradebook BOOK (each file
    whole or not at all: written under a temporary name, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(canvas_table(book, roster, term))
    plain = book.assign(score=book["score"].map(_number), max_score=book["max_score"].map(_number))
    for name, content in (("gradebook.csv", plain.to_csv(index=False)), ("canvas_gradebook.csv", text.getvalue())):
        tmp = out / f".{name}.partial"
        tmp.write_text(content, encoding="utf-8")
        tmp.replace(out / name)


def upload_plan(book: pd.DataFrame, roster: dict[str, RosterEntry], term: Term) -> dict[str, dict]:
    """{lab: Canvas's grade_data {canvas user id: {"posted_grade": score}}} for the roster's rows
    (rows not in the roster are never sent).

    Raises:
        TermError: no [lms] section, or a lab in the book with no Canvas assignment.
    """
    if term.lms is None:
        raise TermError(f"{term.path}: --canvas needs an [lms] section (url, course_id, [lms.assignments])")
    sendable = book[book["learner"].isin(list(roster))]
    labs = sorted(set(sendable["lab"]))
    unmapped = [lab for lab in labs if lab not in term.lms.assignments]
    if unmapped:
        raise TermError(f"{term.path}: [lms.assignments] has no Canvas assignment for {', '.join(unmapped)}")
    return {lab: {str(roster[r.learner].canvas_id): {"posted_grade": _number(r.score)}
                  for r in sendable[sendable["lab"] == lab].itertuples()} for lab in labs}


def token_for(term: Term) -> str:
    """The API token from the environment variable [lms] token_env names.

    Raises:
        TermError: the variable is unset or empty."""
    token = os.environ.get(term.lms.token_env, "") if term.lms else ""
    if not token:
        raise TermError(f"{term.path}: [lms] token_env: the environment variable "
                        f"{term.lms.token_env if term.lms else 'CANVAS_TOKEN'} is empty (it holds the Canvas API token)")
    return token


def upload(plan: dict[str, dict], term: Term, token: str | None = None, poll_seconds: float = 60.0,
           log=print) -> None:
    """Send PLAN (``upload_plan``) to Canvas through canvasapi, one bulk update per lab, waiting for
    each one's Progress to complete; with no TOKEN, print what would be sent and contact nothing.

    Raises:
        TermError: Canvas refused a call or a bulk update did not complete within POLL_SECONDS (the
            message names the lab and Canvas's reply).
    """
    if token is None:
        for lab, grades in plan.items():
            a = term.lms.assignments[lab]
            log(f"dry run: would send {len(grades)} grade(s) of {lab} to {term.lms.url} course "
                f"{term.lms.course_id} assignment {a.id} ({a.name}); add --send to send them")
            for user, grade in grades.items():   # Canvas user id -> the posted grade, as it would be sent
                log(f"  Canvas user {user}: {grade['posted_grade']}")
        return
    from canvasapi import Canvas
    from canvasapi.exceptions import CanvasException
    try:
        course = Canvas(term.lms.url, token).get_course(term.lms.course_id)
        for lab, grades in plan.items():
            a = term.lms.assignments[lab]
            progress = course.get_assignment(a.id).submissions_bulk_update(grade_data=grades)
            deadline = time.monotonic() + poll_seconds
            while progress.workflow_state in ("queued", "running") and time.monotonic() < deadline:
                time.sleep(0.2)
                progress = progress.query()
            if progress.workflow_state != "completed":
                raise TermError(f"Canvas did not complete the grades of {lab} (assignment {a.id}): "
                                f"progress {progress.workflow_state}: {getattr(progress, 'message', '') or ''}")
            log(f"sent {len(grades)} grade(s) of {lab} to assignment {a.id} ({a.name}): completed")
    except CanvasException as exc:
        raise TermError(f"Canvas refused the upload ({term.lms.url}, course {term.lms.course_id}): {exc}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m course_grader.lms",
        description="Write the Canvas gradebook-import CSV and a plain gradebook from grades.csv, and optionally "
                    "send the scores to Canvas (autograder/README.md, Grades to the LMS).")
    parser.add_argument("grades", type=Path, nargs="?", default=Path("build/grading/grades.csv"),
                        help="the grading driver's grades.csv (default: build/grading/grades.csv)")
    parser.add_argument("--course", type=Path, default=term_mod.COURSE_FILE,
                        help="the course file (default: autograder/course.toml)")
    parser.add_argument("--roster", type=Path, help="roster CSV (default: the course file's roster)")
    parser.add_argument("--out", type=Path, help="folder for the two CSVs (default: beside grades.csv)")
    parser.add_argument("--canvas", action="store_true", help="also send the scores to Canvas ([lms]); a dry run "
                        "unless --send")
    parser.add_argument("--send", action="store_true", help="with --canvas: really send (needs the token in the "
                        "environment variable [lms] token_env names)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.send and not args.canvas:
            raise TermError("--send goes with --canvas")
        term = term_mod.load(args.course, labs=term_mod.course_labs())
        roster_path = args.roster or term.roster
        if roster_path is None:
            raise TermError(f"no roster: pass --roster FILE or set roster = \"FILE\" in {term.path}")
        roster = read_roster(roster_path)
        book = gradebook(read_grades(args.grades), roster)
        plan = upload_plan(book, roster, term) if args.canvas else None
        token = token_for(term) if args.send else None      # every refusal comes before any file is written
        out = args.out or args.grades.parent
        write_exports(book, roster, term, out)
        print(f"Gradebook:        {out / 'gradebook.csv'} ({len(book)} row(s))")
        print(f"Canvas import:    {out / 'canvas_gradebook.csv'} ({len(roster)} learner(s) in the roster)")
        if plan is not None:
            upload(plan, term, token)
    except TermError as exc:
        print(f"python -m course_grader.lms: {exc}", file=sys.stderr)
        return 2
    missing = book[book["error"].str.startswith(NOT_IN_ROSTER)]
    print(f"\n{len(missing)} row(s) to look at (learners not in the roster: not in the Canvas CSV, never sent)"
          + (":" if len(missing) else "."))
    for r in missing.itertuples():
        print(f"  {r.learner} / {r.lab}: {NOT_IN_ROSTER} {roster_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
