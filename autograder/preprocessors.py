"""Custom nbgrader preprocessors for the course's autograde pipeline.

Loaded by ``autograder/nbgrader_config.py`` (by file path, so it works from any working
directory) and inserted into ``Autograde.autograde_preprocessors``.
"""

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
