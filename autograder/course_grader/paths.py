"""Where the grader finds the course it grades.

The package lives in ``autograder/course_grader/`` of the course repository, installed
editable by ``pip install -e .``; everything it reads is found from there:

    REPO_ROOT/solutions/{lab}/{lab}.ipynb    nbgrader source (solutions and hidden tests)
    REPO_ROOT/labs/{lab}/{lab}.ipynb         learner release
    AUTOGRADER/nbgrader_config.py            the course's nbgrader configuration
    AUTOGRADER/samples/, AUTOGRADER/hostile/ sample and hostile submissions with expected scores

(Paths only: nothing here defends against anything.)
"""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
AUTOGRADER = PACKAGE.parent
REPO_ROOT = AUTOGRADER.parent
BASE_CONFIG = AUTOGRADER / "nbgrader_config.py"
SAMPLES = AUTOGRADER / "samples"
HOSTILE = AUTOGRADER / "hostile"
