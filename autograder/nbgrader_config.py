"""nbgrader configuration for the course repository (the settings: ``course_grader.config``).

Stock nbgrader commands read this file when run from this folder, with the course venv
active (``source .venv/bin/activate``: nbgrader runs its ``alembic`` helper from PATH):

    cd autograder
    nbgrader generate_assignment 02_kv_cache --force   # solutions/ -> labs/
    nbgrader db student add alice
    nbgrader autograde 02_kv_cache                       # sandboxed and judged
    nbgrader generate_feedback 02_kv_cache
    nbgrader export                                      # autograder/work/grades.csv

From the repository root, pass the file instead (without ``.py``):
``nbgrader <cmd> --NbGrader.config_file=autograder/nbgrader_config``. The course root is
the folder above this file (traitlets sets ``__file__`` when it executes a config file).
Edit a setting here, after ``configure``, to override the course's.
"""
import os

from course_grader.config import configure

c = get_config()  # noqa: F821  (injected by traitlets)
SANDBOX_WARNING = configure(c, root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
