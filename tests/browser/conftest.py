"""The learner's view in a real browser (``make test-browser``): JupyterLab started as ``make lab``
starts it, on throwaway copies of labs/ and solutions/, driven by Playwright in Debian's chromium.

These tests start a Jupyter server, a browser and one kernel per notebook, so the normal runs
(``make test-lib``: ``pytest tests -q``; ``make test-fast``) leave this folder out: it is collected
only when ``COURSE_BROWSER_TESTS=1`` (``make test-browser`` sets it) or when a path inside it is
named on the command line (``pytest tests/browser``).

Fixtures (one of each for the whole run): ``lab_server`` (JupyterLab on a free loopback port with a
token), ``browser_context`` (chromium, headless, fresh profile) and ``page`` (a new tab per test;
on failure it saves a screenshot, the page's text and the server log's tail under build/browser/).

Skips, each with its reason, only where the browser cannot run: chromium missing (``make
test-browser`` installs it with apt as root on Debian) or Playwright not importable.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SHOTS = ROOT / "build" / "browser"
CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags chromium keeps calling Google's services, which a closed
# network answers with a flood of failures; the profile is a fresh folder of the run's.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# A laptop's window (the tighter case for the widget pictures); COURSE_BROWSER_VIEWPORT=WxH tries another.
VIEWPORT = dict(zip(("width", "height"), map(int, os.environ.get("COURSE_BROWSER_VIEWPORT", "1280x800").split("x"))))
SERVER_START_S = 90


def _selected(config) -> bool:
    if os.environ.get("COURSE_BROWSER_TESTS") == "1":
        return True
    for arg in config.invocation_params.args:
        path = Path(config.invocation_params.dir, str(arg).split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """Leave tests/browser out of `pytest tests` unless asked for (see the module docstring)."""
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return None if _selected(config) else True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


# --------------------------------------------------------------------------------------------------
# JupyterLab, the README's way


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jupyter_path() -> str:
    """The Makefile's JUPYTER_PATH: the venv's share/jupyter first (its python3 kernelspec runs the
    course venv's Python whatever other kernelspecs the machine holds)."""
    first = str(Path(sys.prefix) / "share" / "jupyter")
    rest = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])


class LabServer:
    """A running `jupyter lab` (url, token, root folder holding labs/ and solutions/ copies)."""

    def __init__(self, url: str, token: str, root: Path, log: Path, process: subprocess.Popen):
        self.url, self.token, self.root, self.log, self.process = url, token, root, log, process

    def api(self, method: str, path: str) -> bytes:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    def status(self, path: str) -> int:
        """HTTP status of GET path (authenticated)."""
        try:
            self.api("GET", path)
            return 200
        except urllib.error.HTTPError as exc:
            return exc.code

    def shut_down_kernels(self) -> None:
        import json

        for session in json.loads(self.api("GET", "/api/sessions")):
            self.api("DELETE", f"/api/sessions/{session['id']}")
        for kernel in json.loads(self.api("GET", "/api/kernels")):
            self.api("DELETE", f"/api/kernels/{kernel['id']}")

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@pytest.fixture(scope="session")
def shots() -> Path:
    """build/browser/, emptied once per run (screenshots, page texts, the server log)."""
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    return SHOTS


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory, shots):
    """`make lab`'s JupyterLab: the course venv's `jupyter lab`, JUPYTER_CONFIG_PATH=jupyter/ (the
    learner settings), --allow-root as root, --no-browser, on a free loopback port with a token,
    COURSE_QUICK=1 and HF_HUB_OFFLINE=1, serving throwaway copies of labs/ and solutions/. The
    user's own Jupyter config, settings and workspaces are replaced by empty folders of the run's."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "course"
    for folder in ("labs", "solutions"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    settings = base / "lab-user-settings"
    # Jupyter's own "official Jupyter news?" prompt would cover part of every screenshot.
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        '{"checkForUpdates": false, "fetchNews": "false"}')
    own_config_path = os.environ.get("JUPYTER_CONFIG_PATH")
    env = dict(os.environ,
               JUPYTER_CONFIG_PATH=os.pathsep.join([str(ROOT / "jupyter"), *([own_config_path] if own_config_path else [])]),
               JUPYTER_CONFIG_DIR=str(base / "user-config"), JUPYTER_RUNTIME_DIR=str(base / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
               JUPYTER_PATH=_jupyter_path(), COURSE_QUICK="1", HF_HUB_OFFLINE="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    port, token = _free_port(), secrets.token_hex(24)
    command = [str(Path(sys.executable).parent / "jupyter"), "lab", str(root), "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", "--port-retries=0", f"--IdentityProvider.token={token}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = shots / "jupyter-server.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    server = LabServer(f"http://127.0.0.1:{port}", token, root, log, process)
    deadline = time.monotonic() + SERVER_START_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"jupyter lab exited with {process.returncode}:\n{server.log_tail()}")
        try:
            server.api("GET", "/api/status")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"jupyter lab did not answer within {SERVER_START_S} s:\n{server.log_tail()}")
            time.sleep(0.25)
    yield server
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --------------------------------------------------------------------------------------------------
# The browser


@pytest.fixture(scope="session")
def playwright_api():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.skip(f"Playwright does not import ({exc}); it is pinned in pyproject.toml's dev extra (make setup)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"chromium is not installed at {CHROMIUM} (COURSE_CHROMIUM): `make test-browser` installs it "
                    "with `apt-get install -y chromium` as root on Debian/Ubuntu; elsewhere install it yourself")
    with sync_playwright() as api:
        yield api


@pytest.fixture(scope="session")
def browser_context(playwright_api, tmp_path_factory):
    context = playwright_api.chromium.launch_persistent_context(
        str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
        args=CHROMIUM_ARGS, viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    yield context
    context.close()


@pytest.fixture()
def page(browser_context, lab_server, request, shots):
    """A fresh tab. On failure: build/browser/FAILED-<test>.png and .txt (the page's text, the
    browser console's errors and the server log's tail). Afterwards every kernel is shut down."""
    tab = browser_context.new_page()
    console: list[str] = []
    tab.on("console", lambda m: console.append(f"[{m.type}] {m.text}") if m.type in ("error", "warning") else None)
    tab.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
    yield tab
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        name = "FAILED-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)
        try:
            tab.screenshot(path=str(shots / f"{name}.png"), full_page=False)
            text = tab.inner_text("body", timeout=5_000)
        except Exception as exc:  # noqa: BLE001 (the failure itself is what matters)
            text = f"(could not read the page: {exc})"
        (shots / f"{name}.txt").write_text(f"{text}\n\n== browser console\n" + "\n".join(console[-80:])
                                           + f"\n\n== jupyter server log (tail)\n{lab_server.log_tail()}\n")
    tab.close()
    lab_server.shut_down_kernels()
