"""Custom nbgrader preprocessors for the course's autograde pipeline.

Loaded by ``autograder/nbgrader_config.py`` (by file path, so it works from any working
directory) and inserted into ``Autograde.autograde_preprocessors``.
"""

import re

from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

STDERR_PREFIX = "[stderr]"


class StderrToStdout(NbGraderPreprocessor):
    """Keep stderr text of graded code cells visible, but as stdout.

    Stock nbgrader 0.9.x (``nbgrader.utils.determine_grade``) gives 0 points to a graded
    code cell with any ``stream`` output named ``stderr``, so a warning printed by torch,
    transformers or the learner's code would zero a correct answer. The course rule is:
    only an ``error`` output (an exception, or the timeout error nbclient records) fails
    a test cell.

    This preprocessor runs after ``Execute`` (and after ``IgnorePattern``) and before
    ``SaveAutoGrades``. For each graded code cell it turns every ``stderr`` stream output
    into a ``stdout`` stream whose text starts with a line ``[stderr]``, so the text stays
    in the autograded notebook and the feedback, and the grade depends on errors only.
    Cells that are not graded are left as they are.
    """

    prefix = Unicode(
        STDERR_PREFIX,
        help="Line put before stderr text that is moved to stdout in graded cells.",
    ).tag(config=True)

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or not utils.is_grade(cell):
            return cell, resources
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                output["name"] = "stdout"
                output["text"] = self.prefix + "\n" + output.get("text", "")
        return cell, resources


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
REDACTED = "      ... (hidden test lines not shown)"


def redact_hidden_lines(text: str) -> str:
    """TEXT with every line from a BEGIN HIDDEN TESTS marker to its END marker replaced by one
    placeholder line (ANSI colour codes are ignored when looking for the markers). An
    unterminated region is redacted to the end."""
    out, hidden = [], False
    for line in text.split("\n"):
        plain = ANSI.sub("", line)
        if not hidden and HIDDEN_BEGIN in plain:
            hidden = True
            out.append(REDACTED)
            continue
        if hidden:
            if HIDDEN_END in plain:
                hidden = False
            continue
        out.append(line)
    return "\n".join(out)


class RedactHiddenTracebacks(NbGraderPreprocessor):
    """Remove hidden-test source from the tracebacks of graded cells (for feedback).

    ``ClearHiddenTests`` removes the hidden region from a test cell's *source*, but an error
    raised while the cell ran carries a traceback that quotes the cell's lines, hidden ones
    included. This preprocessor rewrites each traceback frame of a graded code cell's error
    outputs with ``redact_hidden_lines``. The exception's type and message stay.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or not utils.is_grade(cell):
            return cell, resources
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [redact_hidden_lines(frame) for frame in output.get("traceback", [])]
        return cell, resources
