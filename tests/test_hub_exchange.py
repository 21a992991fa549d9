"""nbgrader's exchange on a real JupyterHub, end to end: one instructor and two learners.

A throwaway hub (autograder/hub/jupyterhub_config.py, loaded by a small overlay config in a temp
folder) runs on loopback ports with jupyterhub's SharedPasswordAuthenticator and SimpleLocalProcessSpawner:
every user's single-user server is this venv's `jupyterhub-singleuser`, run as this OS user with
its own home under the temp folder; the exchange root is in the temp folder too. The test drives
the hub only through its REST API and its proxy, with a `course-admin` service token:

* the hub starts each user's server (POST /hub/api/users/NAME/server) with the environment of the
  user's role (instructor: the course config and every nbgrader extension; learner: the exchange
  and the learner tools only) and a server token that nbgrader's JupyterHubAuthPlugin uses to read
  course membership from the hub's groups;
* the instructor's nbgrader commands run in a terminal of the instructor's server (the terminal
  websocket, through the proxy), i.e. with that server's JUPYTERHUB_API_TOKEN/USER/API_URL, as an
  instructor typing them in JupyterLab's terminal. `nbgrader db student add` puts the learners into
  the hub group nbgrader-<course> through the hub's API;
* learners use their servers' nbgrader assignment-list API (fetch, submit, fetch_feedback: what the
  Assignments panel calls) and the contents API (saving the notebook, as JupyterLab does);
* grading is on submit: the hub's `grade-on-submit` service (COURSE_HUB_GRADE_ON_SUBMIT=1,
  course_grader.on_submit) runs stock nbgrader's collect, autograde (course config: sandbox and
  judge), generate_feedback and release_feedback for each learner as their submission arrives; the
  learners wait until their assignment list offers feedback, and the scores are read back through the
  instructor's formgrader API, the gradebook and the service's status file (`--show` in the terminal).

What does not go through the hub: the test puts solutions/<lab> into the instructor's course root
(as cloning the course repository would), and reads the users' homes and the gradebook file to
check results. All users are one OS user here, so file permissions cannot keep one learner out of
another's files (on a real hub, LocalProcessSpawner runs each server as its own user and the
exchange's inbound and feedback folders are write/execute-only); the privacy assertions are on what
nbgrader's exchange hands each user.
"""
from __future__ import annotations

import csv
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from course_grader.config import COURSE_ID
from course_grader.hub import INSTRUCTOR_GROUP, LEARNER_GROUP, proxy_command
from course_grader.judge import VERDICT_SUFFIX

ROOT = Path(__file__).resolve().parents[1]
LAB = "01_roofline"   # the fastest lab to grade
FAULT = "fault_gib_for_gb"
SUBMISSIONS = {"learner_a": ROOT / "autograder" / "samples" / "solution" / LAB / f"{LAB}.ipynb",
               "learner_b": ROOT / "autograder" / "samples" / FAULT / LAB / f"{LAB}.ipynb"}
SAMPLE_OF = {"learner_a": "solution", "learner_b": FAULT}
MARKERS = {name: f"{name}-private-{secrets.token_hex(8)}" for name in SAMPLE_OF}
USERS = ["instructor", "learner_a", "learner_b"]
PASSWORD = "course-hub-test-" + secrets.token_hex(4)
BIN = Path(sys.executable).parent

requests = pytest.importorskip("requests")
websocket = pytest.importorskip("websocket")   # websocket-client, a jupyter_server dependency


def _skip_reason() -> str | None:
    if not (BIN / "jupyterhub").exists():
        return "jupyterhub is not installed in this venv (make setup installs the dev extra)"
    proxy = proxy_command()[0]
    if shutil.which(proxy) is None:
        return f"no configurable-http-proxy ({proxy}): run `make hub-proxy` (needs Node.js 20+ and npm)"
    if shutil.which("node") is None:
        return "no node on PATH: configurable-http-proxy needs Node.js 20+"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected() -> dict[tuple[str, str], float]:
    """(sample learner, cell or 'total') -> score for LAB, from autograder/samples/expected_scores.csv."""
    with open(ROOT / "autograder" / "samples" / "expected_scores.csv", newline="") as f:
        return {(r["learner"], r["cell"] or "total"): float(r["score"]) for r in csv.DictReader(f) if r["lab"] == LAB}


class Hub:
    """A running hub: REST calls as the course-admin service, and calls to users' servers."""

    def __init__(self, url: str, admin_token: str, proc: subprocess.Popen, log: Path):
        self.url, self.admin_token, self.proc, self.log = url, admin_token, proc, log
        self.tokens: dict[str, str] = {}

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def api(self, method: str, path: str, **kw):
        r = requests.request(method, f"{self.url}/hub/api{path}",
                             headers={"Authorization": f"token {self.admin_token}"}, timeout=60, **kw)
        assert r.ok, f"{method} /hub/api{path}: {r.status_code} {r.text}\n{self.log_tail()}"
        return r.json() if r.text else None

    def user(self, name: str, method: str, path: str, **kw):
        """A request to NAME's server through the proxy, with NAME's own token."""
        r = requests.request(method, f"{self.url}/user/{name}{path}",
                             headers={"Authorization": f"token {self.tokens[name]}"}, timeout=300, **kw)
        return r

    def start_server(self, name: str, timeout: float = 120) -> None:
        self.api("POST", f"/users/{name}/server")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.api("GET", f"/users/{name}")["servers"].get("")
            if server and server.get("ready"):
                return
            time.sleep(0.5)
        raise AssertionError(f"{name}'s server did not start in {timeout} s\n{self.log_tail()}")


class Terminal:
    """A terminal of a user's server (jupyter_server_terminals), driven over its websocket."""

    def __init__(self, hub: Hub, name: str):
        r = hub.user(name, "POST", "/api/terminals")
        assert r.ok, f"cannot open a terminal on {name}'s server: {r.status_code} {r.text}"
        ws_url = hub.url.replace("http://", "ws://") + f"/user/{name}/terminals/websocket/{r.json()['name']}"
        self.ws = websocket.create_connection(ws_url, header=[f"Authorization: token {hub.tokens[name]}"], timeout=5)
        self.transcript = ""

    def run(self, command: str, timeout: float = 300) -> tuple[int, str]:
        """Type COMMAND, wait for its exit status; returns (status, what the terminal printed)."""
        marker = "__RC_" + uuid.uuid4().hex[:8]
        self.ws.send(json.dumps(["stdin", f'{command}; echo "{marker}_$?__"\r']))
        out, deadline = "", time.monotonic() + timeout
        pattern = re.compile(re.escape(marker) + r"_(\d+)__")
        while time.monotonic() < deadline:
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if msg[0] == "stdout":
                out += msg[1]
                m = pattern.search(out)
                if m:
                    self.transcript += out
                    return int(m.group(1)), out
            elif msg[0] == "disconnect":
                break
        raise AssertionError(f"`{command}` did not finish in {timeout} s:\n{out[-4000:]}")

    def check(self, command: str, timeout: float = 300) -> str:
        rc, out = self.run(command, timeout)
        assert rc == 0, f"`{command}` exited {rc} in the instructor's terminal:\n{out[-6000:]}"
        return out


def test_learner_settings_are_those_of_make_lab():
    """A learner's hub server reads jupyter/ (what `make lab` reads: nbgrader's instructor tools off)
    after its own folder, which must not override those settings."""
    from course_grader.hub import LEARNER_CONFIG, LEARNER_SETTINGS

    assert LEARNER_SETTINGS == ROOT / "jupyter" and (LEARNER_SETTINGS / "labconfig" / "page_config.json").is_file()
    assert not (LEARNER_CONFIG / "labconfig").exists() and not (LEARNER_CONFIG / "jupyter_server_config.d").exists()
    assert "jpserver_extensions" not in (LEARNER_CONFIG / "jupyter_server_config.json").read_text()


def test_hub_config_reads_its_environment(tmp_path, monkeypatch):
    """jupyterhub_config.py loads without a hub, and takes the exchange, ports, users and roles from
    the environment (course_grader/hub.py)."""
    from traitlets.config import PyFileConfigLoader
    monkeypatch.setenv("COURSE_EXCHANGE_ROOT", str(tmp_path / "x"))
    monkeypatch.setenv("COURSE_HUB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("COURSE_HUB_PORT", "9123")
    monkeypatch.setenv("COURSE_HUB_LEARNERS", "ann, bo")
    monkeypatch.setenv("COURSE_HUB_INSTRUCTORS", "teacher")
    monkeypatch.setenv("COURSE_HUB_ADMIN_TOKEN", "t0ken")
    monkeypatch.setenv("COURSE_HUB_COURSE_ROOT", str(tmp_path / "course"))
    monkeypatch.setenv("COURSE_HUB_GRADE_ON_SUBMIT", "1")
    c = PyFileConfigLoader("jupyterhub_config.py", str(ROOT / "autograder" / "hub")).load_config()
    assert c.JupyterHub.bind_url == "http://127.0.0.1:9123"             # loopback unless COURSE_HUB_IP says
    assert c.Authenticator.allow_existing_users is False
    assert c.Spawner.cmd == [str(BIN / "jupyterhub-singleuser")]
    assert c.Spawner.environment["COURSE_EXCHANGE_ROOT"] == str(tmp_path / "x")
    assert c.Authenticator.allowed_users == {"teacher", "ann", "bo"}
    assert c.JupyterHub.load_groups == {INSTRUCTOR_GROUP: {"users": ["teacher"]}, LEARNER_GROUP: {"users": []}}
    assert [s["name"] for s in c.JupyterHub.services] == ["course-admin", "grade-on-submit"]
    grader = c.JupyterHub.services[1]   # a managed service: the hub runs the on-submit worker
    assert grader["command"] == [str(BIN / "python"), "-P", "-m", "course_grader.on_submit", "--course-root",
                                 str(tmp_path / "course"), "--exchange", str(tmp_path / "x")]
    assert "user" not in grader and "api_token" not in grader and grader["cwd"] == str(tmp_path / "course")
    assert not any("grade-on-submit" in role.get("services", []) for role in c.JupyterHub.load_roles)
    assert (tmp_path / "state").is_dir()
    monkeypatch.setenv("COURSE_HUB_GRADE_ON_SUBMIT", "yes")
    with pytest.raises(ValueError, match="COURSE_HUB_GRADE_ON_SUBMIT: expected 1 .on. or 0 .off., got 'yes'"):
        PyFileConfigLoader("jupyterhub_config.py", str(ROOT / "autograder" / "hub")).load_config()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("hub")
    homes, exchange, state = tmp / "home", tmp / "exchange", tmp / "state"
    for d in (homes, exchange, state):
        d.mkdir()
    os.chmod(exchange, 0o1777)
    course = homes / "instructor" / "course"   # inside the instructor's server root, as formgrader needs
    shutil.copytree(ROOT / "solutions" / LAB, course / "solutions" / LAB)
    port, admin_token = _free_port(), secrets.token_hex(32)
    overlay = tmp / "jupyterhub_config.py"
    overlay.write_text("\n".join([
        "c = get_config()  # noqa: F821",
        f"load_subconfig('jupyterhub_config.py', {str(ROOT / 'autograder' / 'hub')!r})  # noqa: F821",
        "c.JupyterHub.authenticator_class = 'shared-password'",
        f"c.SharedPasswordAuthenticator.user_password = {PASSWORD!r}",
        "c.JupyterHub.spawner_class = 'simple'",
        f"c.SimpleLocalProcessSpawner.home_dir_template = {str(homes / '{username}')!r}",
        # jupyter_server refuses to run as root without --allow-root (the test may run as root)
        f"c.Spawner.args = {['--allow-root'] if os.getuid() == 0 else []!r}",
        "c.Spawner.http_timeout = 120",
        "c.Spawner.start_timeout = 120",
        # quick demonstration sizes and one math thread per kernel, as the grading driver does
        "c.Spawner.environment['COURSE_QUICK'] = '1'",
        "c.Spawner.environment['OMP_NUM_THREADS'] = '1'",
        "c.JupyterHub.log_level = 'INFO'",
        # the grade-on-submit service (COURSE_HUB_GRADE_ON_SUBMIT below): the same kernel settings, a scan a second
        "grader = next(s for s in c.JupyterHub.services if s['name'] == 'grade-on-submit')",
        "grader['environment'].update(COURSE_QUICK='1', OMP_NUM_THREADS='1')",
        "grader['command'] += ['--interval', '1']",
    ]) + "\n")
    from course_grader.sandbox import model_cache_dir   # the cache this checkout's tests use
    env = dict(os.environ,
               COURSE_EXCHANGE_ROOT=str(exchange), COURSE_HUB_STATE=str(state),
               COURSE_HUB_IP="127.0.0.1", COURSE_HUB_PORT=str(port),
               COURSE_HUB_API_PORT=str(_free_port()), COURSE_HUB_PROXY_API_PORT=str(_free_port()),
               COURSE_HUB_INSTRUCTORS="instructor", COURSE_HUB_LEARNERS="learner_a,learner_b",
               COURSE_HUB_COURSE_ROOT=str(course), COURSE_HUB_ADMIN_TOKEN=admin_token, COURSE_HUB_GRADE_ON_SUBMIT="1",
               COURSE_LIB_CACHE=str(model_cache_dir()),
               PATH=os.pathsep.join([str(BIN), os.environ.get("PATH", "")]))
    log = tmp / "jupyterhub.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(overlay)], cwd=tmp, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    h = Hub(f"http://127.0.0.1:{port}", admin_token, proc, log)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"jupyterhub exited {proc.returncode}:\n{h.log_tail()}")
            try:
                if requests.get(f"{h.url}/hub/api/", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"jupyterhub did not answer in 90 s:\n{h.log_tail()}")
            time.sleep(0.5)
        for name in USERS:   # each user's own token, minted by the admin service
            h.tokens[name] = h.api("POST", f"/users/{name}/tokens",
                                   json={"note": "test_hub_exchange", "expires_in": 3600})["token"]
        h.tmp, h.homes, h.exchange, h.course = tmp, homes, exchange, course
        yield h
    finally:
        if getattr(h, "terminal", None) is not None:
            (tmp / "instructor-terminal.log").write_text(h.terminal.transcript)
        proc.send_signal(signal.SIGTERM)   # the hub stops the servers and the proxy it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # anything left of the group this test started
        except ProcessLookupError:
            pass


def _assignments(hub: Hub, name: str) -> list[dict]:
    r = hub.user(name, "GET", "/assignments", params={"course_id": COURSE_ID})
    assert r.ok, f"{name}'s assignment list: {r.status_code} {r.text}"
    body = r.json()
    assert body["success"], f"{name}'s assignment list failed: {body['value']}"
    return body["value"]


def _action(hub: Hub, name: str, action: str) -> list[dict]:
    """What the Assignments panel does: POST /assignments/ACTION on the user's own server."""
    r = hub.user(name, "POST", f"/assignments/{action}", data={"course_id": COURSE_ID, "assignment_id": LAB})
    assert r.ok, f"{name} {action}: {r.status_code} {r.text}\n{hub.log_tail()}"
    body = r.json()
    if isinstance(body, dict):   # submit answers the error itself
        assert body.get("success"), f"{name} {action} failed: {body.get('value')}"
        return body["value"]
    return body


def _status(listing: list[dict]) -> set[str]:
    return {a["status"] for a in listing if a["assignment_id"] == LAB}


@pytest.mark.slow
def test_exchange_cycle_through_the_hub(hub):
    t0 = time.monotonic()
    for name in USERS:
        hub.start_server(name)

    # Roles: the formgrader server extension runs for the instructor only; the learner's lab page
    # turns off the instructor plugins (jupyter/labconfig/page_config.json).
    assert hub.user("instructor", "GET", "/formgrader/api/status").ok
    assert hub.user("learner_a", "GET", "/formgrader/api/status").status_code == 404
    lab_page = hub.user("learner_a", "GET", "/lab").text
    page_config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                       lab_page, re.S).group(1))
    disabled = page_config["disabledExtensions"]
    disabled = {k for k, v in disabled.items() if v} if isinstance(disabled, dict) else set(disabled)
    assert {"@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:formgrader",
            "@jupyter/nbgrader:course-list"} <= disabled, disabled
    groups = {g["name"]: g["users"] for g in hub.api("GET", "/groups")}
    assert groups[INSTRUCTOR_GROUP] == ["instructor"] and groups[LEARNER_GROUP] == []

    # Instructor, in a terminal of their own server: release the lab into the exchange.
    term = Terminal(hub, "instructor")
    hub.terminal = term   # the fixture writes its transcript to instructor-terminal.log
    term.check('[ "$JUPYTERHUB_USER" = instructor ] && [ -n "$JUPYTERHUB_API_TOKEN" ] && echo "$JUPYTERHUB_API_URL"')
    term.check(f"nbgrader generate_assignment {LAB} --force")
    term.check(f"nbgrader release_assignment {LAB}")
    assert (hub.exchange / COURSE_ID / "outbound" / LAB / f"{LAB}.ipynb").is_file()

    # Not yet enrolled: the hub's groups hold no learner, so the released lab is not listed.
    assert _status(_assignments(hub, "learner_a")) == set()
    term.check("nbgrader db student add learner_a && nbgrader db student add learner_b")
    members = hub.api("GET", f"/groups/{LEARNER_GROUP}")["users"]
    assert sorted(members) == ["learner_a", "learner_b"], "nbgrader db student add did not reach the hub's group"

    # Learners: fetch, solve (save the sample notebook over the fetched one), submit; the hub's
    # grade-on-submit service queues each submission as it arrives.
    for name, sample in SUBMISSIONS.items():
        assert _status(_assignments(hub, name)) == {"released"}
        assert _status(_action(hub, name, "fetch")) == {"fetched"}
        fetched = hub.homes / name / COURSE_ID / LAB / f"{LAB}.ipynb"
        assert fetched.is_file(), f"{name}'s fetch left no {fetched}"
        content = json.loads(sample.read_text())
        # a note only this learner wrote: it must reach their own feedback and nobody else's files
        content["cells"].append({"cell_type": "markdown", "id": f"note-{name}", "metadata": {},
                                 "source": f"My own note: {MARKERS[name]}"})
        r = hub.user(name, "PUT", f"/api/contents/{COURSE_ID}/{LAB}/{LAB}.ipynb",
                     json={"type": "notebook", "format": "json", "content": content})
        assert r.ok, f"{name} could not save the notebook: {r.status_code} {r.text}"
        _action(hub, name, "submit")
    inbound = sorted(p.name.split("+")[0] for p in (hub.exchange / COURSE_ID / "inbound").iterdir())
    assert inbound == ["learner_a", "learner_b"]

    # Nobody types collect, autograde (course config: sandbox and judge), generate_feedback or
    # release_feedback: the service runs them for each learner. The learners wait until their
    # Assignments panel offers feedback.
    t_grade, waiting = time.monotonic(), set(SUBMISSIONS)
    while waiting and time.monotonic() < t_grade + 600:
        for name in sorted(waiting):
            submitted = [s for a in _assignments(hub, name) if a["status"] == "submitted" for s in a["submissions"]]
            if any(s.get("has_exchange_feedback") for s in submitted):
                waiting.discard(name)
        time.sleep(1)
    grade_s = time.monotonic() - t_grade
    status = hub.course / "autograder" / "work" / "grade_on_submit.jsonl"
    on_record = status.read_text() if status.exists() else "(no status file)"
    assert not waiting, f"no feedback for {sorted(waiting)} after 600 s:\n{on_record}\n{hub.log_tail(120)}"
    for name in SUBMISSIONS:
        assert (hub.course / "autograder" / "work" / "submitted" / name / LAB / f"{LAB}.ipynb").is_file()
    # The course config's judge reran every graded cell (its verdict file beside each autograded
    # notebook); kernels ran in the sandbox, without which the course config refuses to start them.
    for name in SUBMISSIONS:
        assert (hub.course / "autograder" / "work" / "autograded" / name / LAB / f"{LAB}{VERDICT_SUFFIX}").is_file()
    # The instructor's view of the queue, from their terminal: one graded job per learner, with its score.
    shown = term.check("python -m course_grader.on_submit --show")
    jobs = {json.loads(line)["learner"]: json.loads(line) for line in status.read_text().splitlines()}
    assert {name: (r["state"], r["score"]) for name, r in jobs.items()} == {
        name: ("graded", _expected()[SAMPLE_OF[name], "total"]) for name in SUBMISSIONS}, on_record
    assert shown.count(" graded ") == 2 and "2 submission(s)" in shown, shown

    # Scores, through the instructor's formgrader API and from the gradebook, against the samples' table.
    expected = _expected()
    r = hub.user("instructor", "GET", f"/formgrader/api/submissions/{LAB}")
    assert r.ok, r.text
    formgrader = {s["student"]: s["score"] for s in r.json()}
    from nbgrader.api import Gradebook
    with Gradebook("sqlite:///" + str(hub.course / "autograder" / "work" / "gradebook.db")) as gb:
        book = {}
        for name in SUBMISSIONS:
            sub = gb.find_submission(LAB, name)
            book[name, "total"] = sub.score
            for nb in sub.notebooks:
                for grade in nb.grades:
                    book[name, grade.name] = grade.score
    for name, sample in SAMPLE_OF.items():
        assert formgrader[name] == expected[sample, "total"], (name, formgrader, term.transcript[-6000:])
        rows = {cell: score for (s, cell), score in expected.items() if s == sample}
        assert {cell: book[name, cell] for cell in rows} == rows, name

    # Feedback: each learner fetches exactly their own page, the one generated for them.
    released = sorted((hub.exchange / COURSE_ID / "feedback").iterdir())
    assert len(released) == 2, released
    pages = {}
    for name in SUBMISSIONS:
        listing = _action(hub, name, "fetch_feedback")
        got = sorted((hub.homes / name / COURSE_ID / LAB / "feedback").glob("*/*"))
        assert [p.name for p in got] == [f"{LAB}.html"], (name, got)
        pages[name] = got[0].read_bytes()
        mine = hub.course / "autograder" / "work" / "feedback" / name / LAB / f"{LAB}.html"
        assert pages[name] == mine.read_bytes(), f"{name} fetched a feedback page that is not theirs"
        total = expected[SAMPLE_OF[name], "total"]
        assert f"Score: {total:.1f} / {expected['solution', 'total']:.1f}".encode() in pages[name]
        # What the exchange hands the learner mentions no other learner.
        other, assignments = next(n for n in SUBMISSIONS if n != name), _assignments(hub, name)
        assert other not in json.dumps(listing) and other not in json.dumps(assignments)
        assert MARKERS[other] not in json.dumps(listing) + json.dumps(assignments)
        submitted = [a for a in assignments if a["status"] == "submitted"]
        assert submitted and all(s["student_id"] == name for a in submitted for s in a["submissions"]), submitted
        assert MARKERS[name].encode() in pages[name], f"{name}'s feedback does not show their own notebook"
    assert pages["learner_a"] != pages["learner_b"]
    # Nothing of learner_b's (their note, in their notebook and feedback) is in any file of learner_a's
    # home, and vice versa (what the exchange lists to each was checked above).
    for name, other in (("learner_a", "learner_b"), ("learner_b", "learner_a")):
        theirs = MARKERS[other].encode()
        for p in (hub.homes / name).rglob("*"):
            if p.is_file():
                assert theirs not in p.read_bytes(), f"{name}'s home holds {other}'s work in {p}"
    print(f"hub exchange cycle: {time.monotonic() - t0:.0f} s, of which waiting for feedback {grade_s:.0f} s")
