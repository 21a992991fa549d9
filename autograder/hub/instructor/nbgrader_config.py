# nbgrader settings of an instructor's server on the course hub (the hub puts this folder on the
# server's JUPYTER_CONFIG_PATH; autograder/hub/jupyterhub_config.py): the course config of this
# checkout (autograder/nbgrader_config.py: layout, sandbox, judge, feedback rules), moved to the
# course root $COURSE_HUB_COURSE_ROOT when that is set, plus the hub's exchange and course groups.
# `nbgrader release_assignment / collect / autograde / generate_feedback / release_feedback` and the
# formgrader then work from any folder of the instructor's server.
import os

from course_grader.hub import REPO, configure_nbgrader_exchange, course_root, repoint_course_root

c = get_config()  # noqa: F821 (nbgrader's config loader provides it)
load_subconfig("nbgrader_config.py", os.path.join(str(REPO), "autograder"))  # noqa: F821 (the course settings)
if os.path.abspath(course_root()) != str(REPO):
    repoint_course_root(c, course_root())
configure_nbgrader_exchange(c)
