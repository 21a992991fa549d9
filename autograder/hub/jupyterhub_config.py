# JupyterHub configuration for a course hub (autograder/README.md, "Running a course hub").
#
#   make hub-proxy                                   # the pinned configurable-http-proxy (npm)
#   COURSE_HUB_LEARNERS=alice,bob .venv/bin/jupyterhub -f autograder/hub/jupyterhub_config.py
#
# Every setting that differs between hubs is an environment variable (course_grader/hub.py lists
# them): the exchange root COURSE_EXCHANGE_ROOT (default /srv/nbgrader/exchange), the hub's state
# folder COURSE_HUB_STATE, the instructors and learners, the ports, and the token of the
# `course-admin` service (REST API). Each user's server is this checkout's venv's
# jupyterhub-singleuser, so notebooks, nbgrader and the grader are the course's pinned versions.
# Instructors (hub group formgrade-<course>) get every nbgrader extension (formgrader, Create
# Assignment, course list, assignment list) and the course config; learners (nbgrader-<course>, or
# anyone else) the assignment list and validate only. Authentication and spawning are the hub's
# defaults (PAM users, LocalProcessSpawner: each user's server runs as that OS user in their home);
# change them after a `load_subconfig` of this file in your own config, as tests/test_hub_exchange.py
# does (DummyAuthenticator, SimpleLocalProcessSpawner).
import os

from course_grader.config import COURSE_ID
from course_grader.hub import (INSTRUCTOR_CONFIG, INSTRUCTOR_GROUP, LEARNER_CONFIG, LEARNER_GROUP,
                               LEARNER_SETTINGS, REPO, VENV_BIN, course_root, exchange_root, grade_on_submit,
                               grade_on_submit_service, names, proxy_command)

c = get_config()  # noqa: F821 (injected by traitlets)

# -- where the hub listens and keeps its state ----------------------------------------------------
state = os.environ.get("COURSE_HUB_STATE") or "/srv/jupyterhub"
os.makedirs(state, exist_ok=True)
# loopback unless told otherwise: PAM passwords must not cross a network in plain HTTP, so serve other
# machines through a TLS reverse proxy, or give the hub a certificate (COURSE_HUB_SSL_CERT/KEY)
c.JupyterHub.bind_url = "{}://{}:{}".format("https" if os.environ.get("COURSE_HUB_SSL_CERT") else "http",
                                            os.environ.get("COURSE_HUB_IP", "127.0.0.1"),
                                            os.environ.get("COURSE_HUB_PORT", "8000"))
if os.environ.get("COURSE_HUB_SSL_CERT"):
    c.JupyterHub.ssl_cert = os.environ["COURSE_HUB_SSL_CERT"]
    c.JupyterHub.ssl_key = os.environ["COURSE_HUB_SSL_KEY"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("COURSE_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{}".format(os.environ.get("COURSE_HUB_PROXY_API_PORT", "8001"))
c.ConfigurableHTTPProxy.command = proxy_command()
c.JupyterHub.db_url = "sqlite:///" + os.path.join(state, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(state, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(state, "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "jupyterhub-proxy.pid")

# -- who may log in, and the course groups nbgrader's JupyterHubAuthPlugin reads ------------------
instructors = names("COURSE_HUB_INSTRUCTORS")   # no default: an account named "instructor" gets nothing
learners = names("COURSE_HUB_LEARNERS")
c.Authenticator.allowed_users = set(instructors) | set(learners)
# Only the users named here: someone removed from the variables can no longer log in. (Group
# memberships stay in the hub's database: remove a former instructor from formgrade-<course> on the
# admin page or through the REST API.)
c.Authenticator.allow_existing_users = False
c.Authenticator.admin_users = set(names("COURSE_HUB_ADMINS"))
# Learners join nbgrader-<course> when an instructor runs `nbgrader db student add NAME` (the
# plugin adds them through the hub's API); load_groups only ever adds members.
c.JupyterHub.load_groups = {INSTRUCTOR_GROUP: {"users": instructors}, LEARNER_GROUP: {"users": []}}

# Roles: instructors may manage the membership of the learners' group (what `nbgrader db student
# add/remove` does), nothing else; the course-admin service drives the hub from scripts.
c.JupyterHub.load_roles = [
    {
        "name": "course-instructor",
        "description": f"manage the learners of {COURSE_ID} (nbgrader db student add/remove)",
        "scopes": [f"list:groups!group={LEARNER_GROUP}", f"read:groups!group={LEARNER_GROUP}",
                   f"groups!group={LEARNER_GROUP}"],
        "groups": [INSTRUCTOR_GROUP],
    },
]
c.JupyterHub.services = []
if os.environ.get("COURSE_HUB_ADMIN_TOKEN"):
    c.JupyterHub.services.append({"name": "course-admin", "api_token": os.environ["COURSE_HUB_ADMIN_TOKEN"]})
    c.JupyterHub.load_roles.append({
        "name": "course-admin",
        "description": "users, their servers and tokens, and groups, through the REST API",
        "scopes": ["admin:users", "admin:servers", "tokens", "admin:groups"],
        "services": ["course-admin"],
    })
# Grading on submit (autograder/README.md, "Grading on submit"): COURSE_HUB_GRADE_ON_SUBMIT=1 makes the
# hub start and keep running `python -m course_grader.on_submit` as a managed service (no API scope).
if grade_on_submit():
    c.JupyterHub.services.append(grade_on_submit_service())
    if os.getuid() == 0 and not os.environ.get("COURSE_HUB_GRADER_USER"):
        print("jupyterhub_config.py: WARNING: the grade-on-submit service runs as root, so the gradebook and "
              "feedback it writes in the course root are root's: set COURSE_HUB_GRADER_USER to the instructor who "
              "owns it", flush=True)

# -- each user's server: the course venv, with the settings of the user's role --------------------
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {
    # the venv first: nbgrader runs `alembic` by name, and the terminal's python is the course's
    "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")]),
    # kernels run the venv's Python whatever kernelspecs a user's ~/.local holds (as `make lab`)
    "JUPYTER_PATH": str(VENV_BIN.parent / "share" / "jupyter"),
    "HF_HUB_OFFLINE": "1",
    "COURSE_EXCHANGE_ROOT": exchange_root(),
}
if os.environ.get("COURSE_LIB_CACHE"):  # a model cache every user can read
    c.Spawner.environment["COURSE_LIB_CACHE"] = os.environ["COURSE_LIB_CACHE"]


def _is_instructor(spawner) -> bool:
    return any(group.name == INSTRUCTOR_GROUP for group in spawner.user.groups)


def _role_environment(spawner):
    """Instructors' servers read autograder/hub/instructor/ (the course config, every nbgrader
    extension); everyone else's autograder/hub/learner/ (the exchange) and then jupyter/, the
    settings `make lab` uses (instructor tools off)."""
    if _is_instructor(spawner):
        role = {"JUPYTER_CONFIG_PATH": str(INSTRUCTOR_CONFIG), "COURSE_HUB_COURSE_ROOT": course_root()}
    else:
        role = {"JUPYTER_CONFIG_PATH": os.pathsep.join([str(LEARNER_CONFIG), str(LEARNER_SETTINGS)])}
    spawner.environment = dict(spawner.environment, **role)


def _server_token_scopes(spawner):
    """The scopes of the server's $JUPYTERHUB_API_TOKEN, which nbgrader's JupyterHubAuthPlugin uses:
    reading the user's own groups (their courses); for instructors also the learners' group."""
    scopes = ["users:activity!user", "access:servers!server", "read:users:name!user", "read:users:groups!user"]
    if _is_instructor(spawner):
        scopes += [f"list:groups!group={LEARNER_GROUP}", f"read:groups!group={LEARNER_GROUP}",
                   f"groups!group={LEARNER_GROUP}"]
    return scopes


c.Spawner.pre_spawn_hook = _role_environment
c.Spawner.server_token_scopes = _server_token_scopes


# Learners' servers run this checkout's venv, so under LocalProcessSpawner each learner's account
# can read what the checkout's permissions allow: keep the solutions and grading folders private
# (autograder/README.md, "Running a course hub").
# The course root, when it is another clone, holds the same folders, and autograder/work/ there is
# the gradebook and every learner's submission.
for _root, _private in [(_r, _p) for _r in dict.fromkeys([str(REPO), os.path.abspath(course_root())])
                        for _p in ("solutions", "autograder/samples", "autograder/hostile", "autograder/work")]:
    _path = os.path.join(_root, _private)
    if os.path.exists(_path) and os.stat(_path).st_mode & 0o004:
        print(f"jupyterhub_config.py: WARNING: {_path} is readable by every account; learners' servers can "
              f"read it (chmod -R o-rwx {_path})", flush=True)
