# nbgrader settings for the learner's JupyterLab (`make lab` puts this folder on JUPYTER_CONFIG_PATH).
# The Assignments panel lists what an instructor released into an exchange folder; on a learner's
# own machine there is none, and nbgrader's default (/usr/local/share/nbgrader/exchange) is not
# writable, so the panel showed only errors. Here it reads an exchange inside the checkout
# (autograder/work/, which git ignores): an empty list until an instructor on this machine runs
# `nbgrader release_assignment`. A class server (JupyterHub) sets its own shared exchange instead.
# Validate (the toolbar button) runs what grading runs: the demonstration cells are skipped, with
# grading's per-cell limits (course_grader.config.configure_validate).
import os

from course_grader.config import COURSE_ID, configure_validate

c = get_config()  # noqa: F821 (nbgrader's config loader provides it)
_exchange = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "autograder", "work", "exchange")
_exchange = os.path.normpath(_exchange)
os.makedirs(_exchange, exist_ok=True)
os.chmod(_exchange, 0o1777)   # nbgrader needs an exchange root every user can write (sticky, as /tmp)
c.Exchange.root = _exchange
c.CourseDirectory.course_id = COURSE_ID
configure_validate(c)
