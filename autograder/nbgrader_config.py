"""nbgrader configuration for the course repository.

Stock nbgrader commands read this file when run from this folder:

    cd autograder
    nbgrader generate_assignment 02_kv_cache      # solutions/ -> labs/ (add --force to redo)
    nbgrader db student add alice
    nbgrader autograde 02_kv_cache
    nbgrader generate_feedback 02_kv_cache
    nbgrader export

From the repository root, pass the file instead (without ``.py``):
``nbgrader <cmd> --NbGrader.config_file=autograder/nbgrader_config``.

Learner code is sandboxed and judged here too, as under the driver: the end of this file puts
``autograder/sandbox.py``'s SandboxExecute (bubblewrap kernels) in place of Execute and wraps it
with the judge (``autograder/judge.py``; a cell the judge fails gets a JudgeVerdict error and
scores 0). Where bubblewrap is unavailable, kernels refuse to start unless
``COURSE_UNSAFE_NO_SANDBOX=1`` is set, and then every command prints that learner code runs
unsandboxed.

Paths: the course root is the repository root, found from this file's location.
traitlets' PyFileConfigLoader executes config files with ``__file__`` set to the config
file's absolute path (traitlets/config/loader.py, ``_read_file_as_dict``), so
``__file__`` is reliable here whatever the working directory. Fallback, should a loader
ever omit it: the working directory when it is named ``autograder``, else its
``autograder/`` subfolder (i.e. the working directory is taken as the repository root).

The grading driver (autograder/grade.py) loads this file as a sub-config of a generated
config in its own work folder and overrides the root and every directory there, so
these settings (timeouts, markers, preprocessors, course id) apply to both.
"""

import importlib.util
import os

c = get_config()  # noqa: F821  (injected by traitlets)

try:
    _HERE = os.path.dirname(os.path.abspath(__file__))
except NameError:  # pragma: no cover - traitlets always defines __file__
    _cwd = os.getcwd()
    _HERE = _cwd if os.path.basename(_cwd) == "autograder" else os.path.join(_cwd, "autograder")
REPO_ROOT = os.path.dirname(_HERE)

# --- Course directory layout -------------------------------------------------------
c.CourseDirectory.course_id = "llm-inference-lab"
c.CourseDirectory.root = REPO_ROOT
c.CourseDirectory.source_directory = "solutions"  # nbgrader source: solutions + hidden tests
c.CourseDirectory.release_directory = "labs"  # learner release, committed to git
# Working folders: relative to root so nbgrader's path regexes escape the root correctly
# (CourseDirectory.format_path(escape=True) re.escape()s the root only). git ignores them.
_WORK = os.path.join("autograder", "work")
c.CourseDirectory.submitted_directory = os.path.join(_WORK, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(_WORK, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(_WORK, "feedback")
c.CourseDirectory.solution_directory = os.path.join(_WORK, "solution")
c.CourseDirectory.source_with_tests_directory = os.path.join(_WORK, "source_with_tests")
# sqlite cannot create the gradebook file inside a missing folder, so make the folder.
try:
    os.makedirs(os.path.join(REPO_ROOT, _WORK), exist_ok=True)
except OSError:  # read-only checkout: only the driver's own work course is used then
    pass
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(REPO_ROOT, _WORK, "gradebook.db")

# `nbgrader export` writes here rather than to ./grades.csv in the working directory.
c.CsvExportPlugin.to = os.path.join(REPO_ROOT, _WORK, "grades.csv")

# --- Release: markers for what the learner must not see ----------------------------
# ClearSolutions / ClearHiddenTests test `delimiter in line`; spelling the full marker
# keeps a stray "BEGIN SOLUTION" in prose from being taken for one.
c.ClearSolutions.begin_solution_delimeter = "### BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "### END SOLUTION"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearHiddenTests.begin_test_delimeter = "### BEGIN HIDDEN TESTS"
c.ClearHiddenTests.end_test_delimeter = "### END HIDDEN TESTS"

# --- Before execution: a submission cannot drop a test ------------------------------------
# OverwriteCells restores locked sources and points from the gradebook; with this it also puts
# back a test cell the learner deleted, so it is graded. RestoreMissingTests (preprocessors.py)
# is OverwriteCells with a placement that survives a deleted solution cell too.
c.OverwriteCells.add_missing_cells = True

# --- Execution during autograde -------------------------------------------------------
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

# --- Grading rule: stderr does not zero a test cell ------------------------------------
# nbgrader.utils.determine_grade gives 0 to a graded cell with a `stderr` stream output.
# StderrToStdout (autograder/preprocessors.py) runs after Execute/IgnorePattern and before
# SaveAutoGrades and turns such output into stdout under a "[stderr]" line.
def _load(name, filename):
    """autograder/FILENAME as module NAME, loaded by path once per process (the driver and its
    generated configs load sandbox.py and judge.py under the same names)."""
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, filename))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_module = _load("course_autograder_preprocessors", "preprocessors.py")

from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    Execute,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)

# The stock sanitize list (nbgrader/converters/autograde.py) with RestoreMissingTests for
# OverwriteCells and DropRepeatedIds for DeduplicateIds (preprocessors.py: both fix stock crashes
# on a learner who deleted or duplicated cells).
from nbgrader.preprocessors import ClearOutput, OverwriteKernelspec  # noqa: E402

c.Autograde.sanitize_preprocessors = [
    ClearOutput,
    _module.DropRepeatedIds,
    OverwriteKernelspec,
    _module.RestoreMissingTests,
    CheckCellMetadata,
]

# The stock list (nbgrader/converters/autograde.py, Autograde.autograde_preprocessors)
# with StderrToStdout inserted after IgnorePattern.
c.Autograde.autograde_preprocessors = [
    Execute,
    IgnorePattern,
    _module.StderrToStdout,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]

# --- Feedback: learners see their code, the visible checks and every result, not the hidden tests
# Stock generate_feedback renders the autograded notebook, whose test cells hold the hidden tests
# (restored from the source). ClearHiddenTests removes the ### BEGIN/END HIDDEN TESTS regions
# before rendering and RedactHiddenTracebacks removes them from tracebacks, which quote the cell;
# the outputs (pass, or the contract's message) stay. An instructor who wants the full cells in
# the feedback sets COURSE_FEEDBACK_SHOWS_HIDDEN_TESTS=1.
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import ClearHiddenTests, GetGrades  # noqa: E402

# Learner outputs are untrusted HTML: scripts, event handlers and Javascript outputs are stripped
# from the feedback page (an instructor opening it would otherwise run the learner's script).
c.HTMLExporter.sanitize_html = True

if os.environ.get("COURSE_FEEDBACK_SHOWS_HIDDEN_TESTS") != "1":
    c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, _module.RedactHiddenTracebacks,
                                        CSSHTMLHeaderPreprocessor]

# --- Learner code: sandboxed kernels and the judge, for the stock commands too --------------------
# (the driver's generated config loads this file, then configures both again with its own limits)
import sys as _sys  # noqa: E402

SANDBOX_WARNING = _load("course_autograder_sandbox", "sandbox.py").configure_nbgrader(
    c, allow_unsafe=os.environ.get("COURSE_UNSAFE_NO_SANDBOX") == "1")
if SANDBOX_WARNING:
    print(SANDBOX_WARNING, file=_sys.stderr)
_load("course_autograder_judge", "judge.py").configure_nbgrader(c)
