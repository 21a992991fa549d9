# nbgrader settings of a learner's server on the course hub (the hub puts this folder on the
# server's JUPYTER_CONFIG_PATH; autograder/hub/jupyterhub_config.py). The Assignments panel and the
# `nbgrader fetch_assignment / submit / fetch_feedback` commands use the shared exchange
# ($COURSE_EXCHANGE_ROOT) and learn the learner's courses from the hub's groups.
from course_grader.hub import configure_nbgrader_exchange, identify_learner_by_hub_name

c = get_config()  # noqa: F821 (nbgrader's config loader provides it)
configure_nbgrader_exchange(c)
identify_learner_by_hub_name(c)  # submissions and feedback by hub name
