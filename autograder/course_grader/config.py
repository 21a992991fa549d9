"""The course's nbgrader settings, applied by ``autograder/nbgrader_config.py``.

``configure(c, root)`` sets, on nbgrader's config object ``c``:

* the course layout: source ``solutions/``, release ``labs/``, and every working folder
  (submitted, autograded, feedback, gradebook, export CSV) under ``autograder/work/``,
  which git ignores;
* the release markers (``### BEGIN SOLUTION``, ``### BEGIN HIDDEN TESTS``, with the
  three hashes, so a stray phrase in prose is never taken for one);
* the autograde pipeline: the course file's deadlines, extensions and late policy applied through
  nbgrader's late-submission plugin (``course_grader.late``), deleted test cells restored, repeated cell ids dropped
  (``course_grader.preprocessors``), per-cell timeouts that record an error and go on,
  stderr that does not zero a cell, and the lab's demonstration cells left unrun (the source
  notebook's role tags; ``SkipDemonstrations``), with a clear error when learner code needs one;
* feedback that shows the learner's code and the visible checks but not the hidden tests
  (``COURSE_FEEDBACK_SHOWS_HIDDEN_TESTS=1`` keeps them), with learner HTML sanitised;
* learner code run in the bubblewrap sandbox (``course_grader.sandbox``) and every graded
  cell rerun by the judge (``course_grader.judge``), which also flags a test whose learner
  functions reach course_lib's own reference (``c.CourseJudge.reference_reuse``: "flag", or
  "zero" to score such tests 0). Without bubblewrap, kernels refuse to start unless
  ``COURSE_UNSAFE_NO_SANDBOX=1``, and then every command prints that learner code runs unsandboxed.

So the stock commands defend what the driver (``course_grader.grade``, which loads this config under
a generated one that moves every folder into its work folder) defends, except what only the driver
does: per-submission shards, the gradebook integrity check, symlinked files left out of the copy.
"""
from __future__ import annotations

import contextlib
import os
import sys

from .judge import VERDICT_SUFFIX

WORK = os.path.join("autograder", "work")  # relative to the course root; git-ignored
COURSE_ID = "llm-inference-lab"
# nbgrader's working folders (``CourseDirectory.<name>_directory``), under WORK
WORK_FOLDERS = ("submitted", "autograded", "feedback", "solution", "source_with_tests")


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


def place_course(c, root: str, work: str = WORK, export: str = "grades.csv") -> None:
    """Put the course root at ROOT and the gradebook and ``nbgrader export``'s CSV (EXPORT, rather
    than ./grades.csv in the working directory) in ROOT/WORK, which is made if it can be (sqlite
    cannot create a file in a missing folder; a read-only checkout keeps only the driver's own work
    course usable). The other folders are relative to the root and follow it."""
    c.CourseDirectory.root = root
    with contextlib.suppress(OSError):
        os.makedirs(os.path.join(root, work), exist_ok=True)
    c.CourseDirectory.db_url = "sqlite:///" + os.path.join(root, work, "gradebook.db")
    c.CsvExportPlugin.to = os.path.join(root, work, export)


def _layout(c, root: str) -> None:
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.source_directory = "solutions"  # nbgrader source: solutions + hidden tests
    c.CourseDirectory.release_directory = "labs"  # learner release, committed to git
    # Working folders relative to root: nbgrader's path regexes escape the root only
    # (CourseDirectory.format_path(escape=True) re.escape()s the root).
    for name in WORK_FOLDERS:
        setattr(c.CourseDirectory, f"{name}_directory", os.path.join(WORK, name))
    place_course(c, root)
    # Files nbgrader never copies between its folders (submitted -> autograded -> feedback): the
    # stock list, plus the judge's verdict records (they hold the judge's seed; a learner's own
    # file of that name is not carried into the autograded folder either).
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*" + VERDICT_SUFFIX]


def _release(c) -> None:
    from .preprocessors import HIDDEN_BEGIN, HIDDEN_END

    # ClearSolutions / ClearHiddenTests test `delimiter in line`; spelling the full marker
    # keeps a stray "BEGIN SOLUTION" in prose from being taken for one.
    c.ClearSolutions.begin_solution_delimeter = "### BEGIN SOLUTION"
    c.ClearSolutions.end_solution_delimeter = "### END SOLUTION"
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.ClearHiddenTests.begin_test_delimeter, c.ClearHiddenTests.end_test_delimeter = HIDDEN_BEGIN, HIDDEN_END


def _autograde(c) -> None:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput, Execute,
                                        IgnorePattern, LimitOutput, OverwriteKernelspec, SaveAutoGrades)

    from . import late, preprocessors

    # OverwriteCells restores locked sources and points from the gradebook; with this it also
    # puts back a test cell the learner deleted, so it is graded. RestoreMissingTests is
    # OverwriteCells with a placement that survives a deleted solution cell too.
    c.OverwriteCells.add_missing_cells = True
    _execute_limits(c)
    # The tag on which nbclient leaves a cell unrun is SkipDemonstrations' alone (it removes any a
    # submission carries); set here, so no other config file (the learner's Validate sets its own)
    # can make a tag the learner controls skip a cell in grading.
    c.Execute.skip_cells_with_tag = preprocessors.SKIP_TAG
    # The stock sanitize and autograde lists (nbgrader/converters/autograde.py), in order, with the
    # course's steps (course_grader.preprocessors; each says which stock behaviour it fixes):
    # RestoreMissingTests for OverwriteCells, DropRepeatedIds for DeduplicateIds, EncodableText last
    # among the sanitize steps and right after Execute, and, so that a test cell's score comes from
    # its errors only, StderrToStdout and DisplayedValuesAreNotScores after IgnorePattern. Around
    # Execute, SkipDemonstrations (before) leaves the source notebook's demonstration cells unrun (no graded
    # check reads their results) and NameSkippedDemonstrations (after) explains a NameError they cause.
    # ApplyDeadlines (first) copies the course file's deadline and the learner's extension into the
    # gradebook; nbgrader's AssignLatePenalties then charges what CourseLatePolicy says (course_grader.late).
    c.AssignLatePenalties.plugin_class = late.CourseLatePolicy
    c.Autograde.sanitize_preprocessors = [late.ApplyDeadlines, ClearOutput, preprocessors.DropRepeatedIds, OverwriteKernelspec,
                                          preprocessors.RestoreMissingTests, CheckCellMetadata,
                                          preprocessors.EncodableText]
    c.Autograde.autograde_preprocessors = [preprocessors.SkipDemonstrations, Execute, preprocessors.EncodableText,
                                           preprocessors.NameSkippedDemonstrations, IgnorePattern,
                                           preprocessors.StderrToStdout, preprocessors.DisplayedValuesAreNotScores,
                                           ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
                                           AssignLatePenalties, CheckCellMetadata]


def _execute_limits(c) -> None:
    """Per-cell limits of nbgrader's Execute step, the same in grading and in the learner's Validate."""
    # Sized for a 2-core CPU: a lab runs in a few minutes, the heaviest cell well under 300 s.
    c.Execute.timeout = 300  # seconds per cell
    # On a cell timeout, interrupt the kernel, record a CellTimeoutError output in that cell
    # (0 points for it) and go on with the next cell, instead of failing the submission.
    c.Execute.interrupt_on_timeout = True
    c.Execute.error_on_timeout = {"ename": "CellTimeoutError", "evalue": "", "traceback": [
        "CellTimeoutError: the cell ran longer than the per-cell limit and was interrupted"]}
    # Time to drain a cell's output after its reply; the default 4 s is tight on a loaded
    # 2-core machine running several kernels, and a miss fails the whole notebook.
    c.Execute.iopub_timeout = 30


def configure_validate(c) -> None:
    """The learner's Validate (``jupyter/nbgrader_config.py``, read by ``make lab``'s JupyterLab and
    ``nbgrader validate``): run what grading runs. Stock Validate runs every cell with a 30 s limit
    per cell, so it ran the demonstrations grading skips (a model load or a sweep past 30 s failed
    it, and code that needs a demonstration passed it). Here nbclient leaves every cell tagged
    ``demonstration`` unrun (nbgrader's Validator takes no extra preprocessors, but its Execute
    step reads ``skip_cells_with_tag``) and the cells get grading's limits. The tags are the
    validated notebook's own: there is no source notebook on a learner's machine, and Validate
    grades nothing. Grading never reads this file's settings (``configure`` sets its own skip tag)."""
    _execute_limits(c)
    c.Execute.skip_cells_with_tag = "demonstration"


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
