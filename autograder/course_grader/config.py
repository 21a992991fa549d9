"""The course's nbgrader settings, applied by ``autograder/nbgrader_config.py``.

``configure(c, root)`` sets, on nbgrader's config object ``c``:

* the course layout: source ``solutions/``, release ``labs/``, and every working folder
  (submitted, autograded, feedback, gradebook, export CSV) under ``autograder/work/``,
  which git ignores;
* the release markers (``### BEGIN SOLUTION``, ``### BEGIN HIDDEN TESTS``, with the
  three hashes, so a stray phrase in prose is never taken for one);
* the autograde pipeline: deleted test cells restored, repeated cell ids dropped
  (``course_grader.preprocessors``), per-cell timeouts that record an error and go on,
  stderr that does not zero a cell;
* feedback that shows the learner's code and the visible checks but not the hidden tests
  (``COURSE_FEEDBACK_SHOWS_HIDDEN_TESTS=1`` keeps them), with learner HTML sanitised;
* learner code run in the bubblewrap sandbox (``course_grader.sandbox``) and every graded
  cell rerun by the judge (``course_grader.judge``), which also flags a test whose learner
  functions reach course_lib's own reference for the exercise
  (``c.CourseJudge.reference_reuse``: "flag", or "zero" to score such tests 0). Where
  bubblewrap is unavailable, kernels refuse to start unless ``COURSE_UNSAFE_NO_SANDBOX=1``,
  and then every command prints that learner code runs unsandboxed.

The grading driver (``course_grader.grade``) loads ``autograder/nbgrader_config.py`` as a
sub-config of a generated config in its own work folder and overrides the root and every
folder there, so these settings (timeouts, markers, preprocessors) apply to both.
"""
from __future__ import annotations

import os
import sys

from .judge import VERDICT_SUFFIX

WORK = os.path.join("autograder", "work")  # relative to the course root; git-ignored
COURSE_ID = "llm-inference-lab"


def configure(c, root: str) -> str:
    """Apply the course settings to nbgrader's config ``c`` for the repository at ``root``.

    Returns the sandbox's unsafe-grading warning ("" when the sandbox works); it is also
    printed to stderr, i.e. into the log of every nbgrader command that reads the config.
    """
    _layout(c, root)
    _release(c)
    _autograde(c)
    _feedback(c)
    return _learner_code(c)


def _layout(c, root: str) -> None:
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.root = root
    c.CourseDirectory.source_directory = "solutions"  # nbgrader source: solutions + hidden tests
    c.CourseDirectory.release_directory = "labs"  # learner release, committed to git
    # Working folders relative to root: nbgrader's path regexes escape the root only
    # (CourseDirectory.format_path(escape=True) re.escape()s the root).
    c.CourseDirectory.submitted_directory = os.path.join(WORK, "submitted")
    c.CourseDirectory.autograded_directory = os.path.join(WORK, "autograded")
    c.CourseDirectory.feedback_directory = os.path.join(WORK, "feedback")
    c.CourseDirectory.solution_directory = os.path.join(WORK, "solution")
    c.CourseDirectory.source_with_tests_directory = os.path.join(WORK, "source_with_tests")
    # sqlite cannot create the gradebook file inside a missing folder, so make the folder.
    try:
        os.makedirs(os.path.join(root, WORK), exist_ok=True)
    except OSError:  # read-only checkout: only the driver's own work course is used then
        pass
    c.CourseDirectory.db_url = "sqlite:///" + os.path.join(root, WORK, "gradebook.db")
    # `nbgrader export` writes here rather than to ./grades.csv in the working directory.
    c.CsvExportPlugin.to = os.path.join(root, WORK, "grades.csv")
    # Files nbgrader never copies between its folders (submitted -> autograded -> feedback): the
    # stock list, plus the judge's verdict records (they hold the judge's seed; a learner's own
    # file of that name is not carried into the autograded folder either).
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*" + VERDICT_SUFFIX]


def _release(c) -> None:
    # ClearSolutions / ClearHiddenTests test `delimiter in line`; spelling the full marker
    # keeps a stray "BEGIN SOLUTION" in prose from being taken for one.
    c.ClearSolutions.begin_solution_delimeter = "### BEGIN SOLUTION"
    c.ClearSolutions.end_solution_delimeter = "### END SOLUTION"
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.ClearHiddenTests.begin_test_delimeter = "### BEGIN HIDDEN TESTS"
    c.ClearHiddenTests.end_test_delimeter = "### END HIDDEN TESTS"


def _autograde(c) -> None:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput, Execute,
                                        IgnorePattern, LimitOutput, OverwriteKernelspec, SaveAutoGrades)

    from . import preprocessors

    # OverwriteCells restores locked sources and points from the gradebook; with this it also
    # puts back a test cell the learner deleted, so it is graded. RestoreMissingTests is
    # OverwriteCells with a placement that survives a deleted solution cell too.
    c.OverwriteCells.add_missing_cells = True
    # Sized for a 2-core CPU: a lab runs in a few minutes, the heaviest cell well under 300 s.
    c.Execute.timeout = 300  # seconds per cell
    # On a cell timeout, interrupt the kernel, record a CellTimeoutError output in that cell
    # (0 points for it) and go on with the next cell, instead of failing the submission.
    c.Execute.interrupt_on_timeout = True
    c.Execute.error_on_timeout = {
        "ename": "CellTimeoutError",
        "evalue": "",
        "traceback": ["CellTimeoutError: the cell ran longer than the per-cell limit and was interrupted"],
    }
    # Time to drain a cell's output after its reply; the default 4 s is tight on a loaded
    # 2-core machine running several kernels, and a miss fails the whole notebook.
    c.Execute.iopub_timeout = 30
    # The stock sanitize list (nbgrader/converters/autograde.py) with RestoreMissingTests for
    # OverwriteCells and DropRepeatedIds for DeduplicateIds (both fix stock crashes on a learner
    # who deleted or duplicated cells).
    c.Autograde.sanitize_preprocessors = [
        ClearOutput,
        preprocessors.DropRepeatedIds,
        OverwriteKernelspec,
        preprocessors.RestoreMissingTests,
        CheckCellMetadata,
        preprocessors.EncodableText,
    ]
    # EncodableText runs last among the sanitize steps and right after Execute: text UTF-8 cannot encode
    # (a lone surrogate in a source, an exception message or a print) would otherwise fail the
    # writing of the autograded notebook, and so the whole submission.
    # The stock autograde list with two steps after IgnorePattern, so that a test cell's score
    # comes from its errors only: nbgrader's determine_grade gives 0 to a graded cell with a
    # `stderr` stream output (a warning printed by a library, say), which StderrToStdout turns
    # into stdout under "[stderr]"; and it scores a cell by the number its first execute_result
    # shows, which DisplayedValuesAreNotScores turns into display_data.
    c.Autograde.autograde_preprocessors = [
        Execute,
        preprocessors.EncodableText,
        IgnorePattern,
        preprocessors.StderrToStdout,
        preprocessors.DisplayedValuesAreNotScores,
        ClearMetadataPreprocessor,
        LimitOutput,
        SaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
    ]


def _feedback(c) -> None:
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import ClearHiddenTests, GetGrades

    from . import preprocessors

    # Learner outputs are untrusted HTML: scripts, event handlers and Javascript outputs are
    # stripped from the feedback page (an instructor opening it would otherwise run them).
    c.HTMLExporter.sanitize_html = True
    # Stock generate_feedback renders the autograded notebook, whose test cells hold the hidden
    # tests (restored from the source). ClearHiddenTests removes them from the sources and
    # RedactHiddenTracebacks from tracebacks, which quote the cell; outputs stay.
    if os.environ.get("COURSE_FEEDBACK_SHOWS_HIDDEN_TESTS") != "1":
        c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, preprocessors.RedactHiddenTracebacks,
                                            CSSHTMLHeaderPreprocessor]


def _learner_code(c) -> str:
    """Sandboxed kernels, then the judge around them (the driver's generated config calls
    both again with its own limits)."""
    from . import judge, sandbox

    warning = sandbox.configure_nbgrader(c, allow_unsafe=os.environ.get("COURSE_UNSAFE_NO_SANDBOX") == "1")
    if warning:
        print(warning, file=sys.stderr)
    judge.configure_nbgrader(c)
    # A graded test whose learner functions reach course_lib's reference for that exercise (the
    # contract's references; course_grader.provenance) is flagged in its verdict and the autograde
    # log. "zero" also scores it 0, with a ReferenceReuse error in the cell that the feedback shows.
    c.CourseJudge.reference_reuse = "flag"
    return warning
