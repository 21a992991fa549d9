"""The course hub's settings: what ``autograder/hub/jupyterhub_config.py`` and the hub users'
nbgrader configs (``autograder/hub/learner/``, ``autograder/hub/instructor/``) share.

Everything is read from environment variables, so one checkout serves a real hub and the
throwaway one ``tests/test_hub_exchange.py`` starts:

=============================  ===================================================  ===========================
variable                       meaning                                              default
=============================  ===================================================  ===========================
``COURSE_EXCHANGE_ROOT``       nbgrader's exchange (release, inbound, feedback)     ``/srv/nbgrader/exchange``
``COURSE_HUB_STATE``           the hub's database, cookie secret, pid file          ``/srv/jupyterhub``
``COURSE_HUB_IP``              address the hub's proxy listens on                   ``127.0.0.1``
``COURSE_HUB_PORT``            its port                                             8000
``COURSE_HUB_API_PORT``        the hub's own API (loopback)                         8081
``COURSE_HUB_PROXY_API_PORT``  the proxy's API (loopback)                           8001
``COURSE_HUB_INSTRUCTORS``     comma-separated hub users in ``formgrade-<course>``  (none)
``COURSE_HUB_SSL_CERT``/``KEY`` the hub's TLS certificate and key (https)            plain http
``COURSE_HUB_LEARNERS``        comma-separated hub users allowed to log in          (none)
``COURSE_HUB_COURSE_ROOT``     the instructors' course root (``solutions/``, ...)   this checkout
``COURSE_HUB_ADMIN_TOKEN``     token of the ``course-admin`` service (REST API)     no service
``COURSE_LIB_CACHE``           the converted model cache, passed to every server    course_lib's default
``COURSE_HUB_GRADE_ON_SUBMIT`` 1: run the ``grade-on-submit`` service                off (0)
``COURSE_HUB_GRADER_USER``     the OS user that service runs as (needs a root hub)  the hub's user
=============================  ===================================================  ===========================

Course membership lives in hub groups, as nbgrader's ``JupyterHubAuthPlugin`` reads it:
``formgrade-<course>`` for instructors, ``nbgrader-<course>`` for learners (``nbgrader db student
add NAME`` run by an instructor adds NAME to it through the hub's API). Defends: a learner's
submissions and feedback go by hub name, and learners get no instructor tools. Does not: nbgrader's
exchange trusts the learner id and time in an inbound file's name (``collect`` only warns).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .config import COURSE_ID, place_course

REPO = Path(__file__).resolve().parents[2]
HUB_DIR = REPO / "autograder" / "hub"
LEARNER_CONFIG = HUB_DIR / "learner"        # a learner's server reads this folder, then LEARNER_SETTINGS
LEARNER_SETTINGS = REPO / "jupyter"         # what `make lab` reads: nbgrader's instructor tools off
INSTRUCTOR_CONFIG = HUB_DIR / "instructor"  # JUPYTER_CONFIG_PATH of an instructor's server
# `make hub-proxy` installs the pinned configurable-http-proxy (autograder/hub/package.json) here.
PROXY = REPO / "build" / "hub-node" / "node_modules" / ".bin" / "configurable-http-proxy"
VENV_BIN = Path(sys.prefix) / "bin"         # the course venv: the hub and every server run in it

DEFAULT_EXCHANGE_ROOT = "/srv/nbgrader/exchange"
LEARNER_GROUP = f"nbgrader-{COURSE_ID}"
INSTRUCTOR_GROUP = f"formgrade-{COURSE_ID}"


def exchange_root() -> str:
    return os.environ.get("COURSE_EXCHANGE_ROOT") or DEFAULT_EXCHANGE_ROOT


def course_root() -> str:
    return os.environ.get("COURSE_HUB_COURSE_ROOT") or str(REPO)


def names(variable: str, default: str = "") -> list[str]:
    return [n.strip() for n in os.environ.get(variable, default).split(",") if n.strip()]


def proxy_command() -> list[str]:
    """The pinned proxy from `make hub-proxy`, else one on PATH (npm's global install)."""
    return [str(PROXY)] if PROXY.exists() else ["configurable-http-proxy"]


def configure_nbgrader_exchange(c) -> None:
    """nbgrader settings every hub user needs: the course, the shared exchange, and course
    membership from the hub's groups (``JupyterHubAuthPlugin``, which asks the hub's API with the
    server's own ``JUPYTERHUB_API_TOKEN``)."""
    from nbgrader.auth import JupyterHubAuthPlugin

    c.CourseDirectory.course_id = COURSE_ID
    c.Exchange.root = exchange_root()
    # A learner's fetched copy goes to ~/<course>/<lab>/ (nbgrader's advice with the hub plugin).
    c.Exchange.path_includes_course = True
    c.Authenticator.plugin_class = JupyterHubAuthPlugin


def identify_learner_by_hub_name(c) -> None:
    """A learner's submissions and feedback go by their hub name ($JUPYTERHUB_USER), not by the OS
    user their server runs as. nbgrader names a submission after the OS user (it uses
    $JUPYTERHUB_USER only for Docker's `jovyan`); with LocalProcessSpawner the two are the same,
    with one OS user for everyone (SimpleLocalProcessSpawner, containers) they are not."""
    if os.environ.get("JUPYTERHUB_USER"):
        c.CourseDirectory.student_id = os.environ["JUPYTERHUB_USER"]


def grade_on_submit_service() -> dict:
    """The ``c.JupyterHub.services`` entry of the ``grade-on-submit`` managed service: the hub starts
    ``python -m course_grader.on_submit`` (this venv) on the course root and the exchange, as
    ``$COURSE_HUB_GRADER_USER`` when set (the OS user who owns the course root; the hub must run as
    root), else as the hub's own user. The service needs no hub API scope: collect, autograde and
    the feedback steps read and write files only (autograder/README.md, "Grading on submit")."""
    environment = {
        "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")]),
        "HF_HUB_OFFLINE": "1", "COURSE_EXCHANGE_ROOT": exchange_root(), "COURSE_HUB_COURSE_ROOT": course_root()}
    if os.environ.get("COURSE_LIB_CACHE"):
        environment["COURSE_LIB_CACHE"] = os.environ["COURSE_LIB_CACHE"]
    service = {"name": "grade-on-submit", "cwd": course_root(), "environment": environment,
               # -P: the course root (the working folder) is not put on sys.path, so the service imports
               # this checkout's course_grader, the one its venv (and so the sandboxed kernel) imports
               "command": [str(VENV_BIN / "python"), "-P", "-m", "course_grader.on_submit",
                           "--course-root", course_root(), "--exchange", exchange_root()]}
    if os.environ.get("COURSE_HUB_GRADER_USER"):
        service["user"] = os.environ["COURSE_HUB_GRADER_USER"]
    return service


def grade_on_submit() -> bool:
    """Whether ``COURSE_HUB_GRADE_ON_SUBMIT`` turns the grade-on-submit service on.

    Raises:
        ValueError: the variable is set to something else than 1 or 0 (the message names it).
    """
    value = os.environ.get("COURSE_HUB_GRADE_ON_SUBMIT", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"COURSE_HUB_GRADE_ON_SUBMIT: expected 1 (on) or 0 (off), got {value!r}")
    return value == "1"


def repoint_course_root(c, root: str) -> None:
    """Move the course config's absolute paths (course root, gradebook, CSV export) to ROOT
    (``course_grader.config.place_course``)."""
    place_course(c, os.path.abspath(root))
