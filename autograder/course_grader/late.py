"""Deadlines, extensions and the late policy on nbgrader's own path (course_grader.term holds them).

Both grading paths, the driver (``make grade``) and stock ``nbgrader autograde``, run the course's
autograde pipeline (``course_grader.config``), so both apply the course file the same way:

* ``ApplyDeadlines`` (first of the sanitize steps) writes the course file's deadline for the lab into
  the gradebook's assignment (``duedate``) and the learner's extension into their submission
  (``extension``), nbgrader's own columns; nbgrader then computes ``total_seconds_late`` from the
  submission's ``timestamp.txt`` (nbgrader.api.SubmittedAssignment).
* ``CourseLatePolicy`` is the plugin of nbgrader's ``AssignLatePenalties`` step
  (``c.AssignLatePenalties.plugin_class``, nbgrader.plugins.LateSubmissionPlugin): it turns those
  seconds into points with ``term.late_penalty``, which nbgrader stores as the notebook's
  ``late_submission_penalty``; ``nbgrader export`` and the driver's grades.csv show the raw score,
  the penalty and the score after it.

Both read the course file named by their ``course_file`` option (default autograder/course.toml; the
driver sets it to its ``--course``). A lab with no deadline is left as it is.
"""
from __future__ import annotations

from pathlib import Path

from nbgrader.api import Gradebook
from nbgrader.plugins import LateSubmissionPlugin
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from . import term as term_mod


def write_deadlines(gb: Gradebook, term: term_mod.Term, labs) -> None:
    """Set the gradebook's due date of each of LABS that has a deadline in TERM (nbgrader keeps it as
    naive UTC). The driver writes them into its course gradebook before copying it into the shards,
    so that ApplyDeadlines there rewrites the same values (the shards' integrity check sees no change)."""
    for lab in labs:
        if lab in term.deadlines:
            gb.update_or_create_assignment(lab, duedate=term.deadlines[lab])


def _term(course_file: str) -> term_mod.Term:
    """The course file set in the config (it must exist), or the default one (absent: no deadlines)."""
    if course_file and not Path(course_file).exists():
        raise term_mod.TermError(f"the course file {course_file} set in the nbgrader config does not exist here")
    return term_mod.load(course_file or term_mod.COURSE_FILE)


class ApplyDeadlines(NbGraderPreprocessor):
    """Put the course file's deadline and the learner's extension into the gradebook before grading."""

    course_file = Unicode("", help="the course file (course_grader.term); default autograder/course.toml, "
                                   "where a missing file means no deadlines").tag(config=True)

    def preprocess(self, nb, resources):
        term = _term(self.course_file)
        info = resources["nbgrader"]
        lab, learner = info["assignment"], info["student"]
        if lab not in term.deadlines:
            return nb, resources
        with Gradebook(info["db_url"]) as gb:
            write_deadlines(gb, term, [lab])
            submission = gb.find_submission(lab, learner)
            submission.extension = term.extensions.get((learner, lab))
            gb.db.commit()
            if submission.timestamp is None:
                self.log.warning("%s / %s: no timestamp.txt, so lateness against the deadline %s was not checked",
                                 learner, lab, term.deadlines[lab].isoformat())
        return nb, resources


class CourseLatePolicy(LateSubmissionPlugin):
    """nbgrader's late-submission plugin with the course file's ``[late_policy]``."""

    course_file = Unicode("", help="the course file (course_grader.term); default autograder/course.toml").tag(
        config=True)

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float) -> float:
        policy = _term(self.course_file).late_policy
        penalty = term_mod.late_penalty(policy, float(score or 0.0), float(total_seconds_late))
        self.log.info("late policy %s: %s seconds late, penalty %s of %s", policy.method, total_seconds_late,
                      penalty, score)
        return penalty
