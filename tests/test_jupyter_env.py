"""The course's Jupyter environment: which kernel runs the notebooks, and the learner's JupyterLab.

* Kernel choice. A ``python3`` kernelspec of the user's (here: one on ``JUPYTER_PATH`` that
  runs another environment's Python and sets a marker variable) must not be used by any
  notebook execution: nbval and nbconvert as the Makefile runs them, and grading (the
  sandboxed ``SandboxKernelManager``, the driver's ``--unsafe-no-sandbox`` configuration, stock
  ``nbgrader autograde`` with the course config). A probe notebook reports ``sys.prefix``,
  ``sys.executable`` and the marker from inside the kernel.
* ``make lab``: the command line it builds (``make -n``), ``LAB_ARGS`` and ``--allow-root``.
* The learner's JupyterLab (``jupyter/``): nbgrader's instructor plugins and server extensions
  off as Jupyter itself reads the settings (``jupyter labextension list``, the server's
  extension table), and only under ``make lab``'s environment.

The Makefile's lines are run through ``make`` itself, with a one-rule makefile added after the
course's (``make -f Makefile -f probe.mk probe``), so they see the variables and the exported
environment ``make run`` / ``make test-notebooks`` / ``make lab`` see.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
COURSE_VENV = ROOT / ".venv"
MARKER = "COURSE_TEST_FOREIGN_KERNELSPEC"  # COURSE_* passes the sandbox's environment filter too
PROBE = ("import json, os, sys\n"
         f"print(json.dumps({{'prefix': sys.prefix, 'executable': sys.executable, 'marker': os.environ.get({MARKER!r})}}))")
# nbgrader's plugin and server-extension names (nbgrader's installation guide, "nbgrader extensions in Jupyter Lab")
LEARNER_PLUGINS_OFF = {"@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:formgrader",
                       "@jupyter/nbgrader:course-list"}
LEARNER_PLUGINS_ON = {"@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:validate-assignment"}
SERVER_EXTENSIONS_OFF = {"nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list"}
SERVER_EXTENSIONS_ON = {"nbgrader.server_extensions.assignment_list", "nbgrader.server_extensions.validate_assignment"}

needs_make = pytest.mark.skipif(shutil.which("make") is None or not (COURSE_VENV / "bin" / "python").exists(),
                                reason="needs make and the course venv (.venv, `make setup`)")


def _same_dir(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def run_make(lines: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run LINES as the recipe of a rule added after the course Makefile, so they expand its
    variables and run with its exported environment."""
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe.mk"
        probe.write_text("probe:\n" + "".join(f"\t{line}\n" for line in lines))
        return subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", str(probe), "probe"],
                              cwd=ROOT, env=env if env is not None else dict(os.environ),
                              capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------------------
# A foreign `python3` kernelspec on JUPYTER_PATH


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """A folder for JUPYTER_PATH holding kernels/python3 that runs *another* Python environment
    (a venv whose site-packages link to this one's, so ipykernel starts) with MARKER set, and
    a probe notebook whose kernelspec names ``python3``, as the course notebooks do."""
    base = tmp_path_factory.mktemp("foreign")
    other = base / "other-env"
    venv.create(other, with_pip=False, symlinks=True)
    site = next((other / "lib").glob("python*/site-packages"))
    (site / "course-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    spec = base / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(other / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "env": {MARKER: "1"}, "display_name": "Python 3 (another environment)", "language": "python"}))
    nb = new_notebook(cells=[new_code_cell(PROBE)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, base / "probe.ipynb")
    return {"jupyter_path": str(base / "jupyter"), "other": other, "notebook": base / "probe.ipynb", "base": base}


def foreign_env(foreign, **extra) -> dict[str, str]:
    return dict(os.environ, JUPYTER_PATH=foreign["jupyter_path"], **extra)


def reported(cell) -> dict:
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"the probe cell printed no report: {cell.outputs}"
    return json.loads(lines[-1])


def assert_course_python(report: dict, prefix: str | Path, where: str) -> None:
    assert report["marker"] is None and _same_dir(report["prefix"], prefix), (
        f"{where} ran the kernel {report['executable']} (prefix {report['prefix']}, foreign kernelspec marker "
        f"{report['marker']!r}); expected the Python of {prefix}")


def test_the_foreign_kernelspec_would_be_chosen(foreign):
    """The set-up is real: plain jupyter_client resolves `python3` to the foreign kernelspec."""
    env = foreign_env(foreign)
    code = "from jupyter_client.kernelspec import KernelSpecManager as K; print(K().get_kernel_spec('python3').argv[0])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(foreign["other"] / "bin" / "python")


@pytest.mark.slow
@needs_make
def test_make_run_executes_notebooks_in_the_course_venv(foreign, tmp_path):
    out = tmp_path / "executed"
    proc = run_make([f"$(EXECUTE_NOTEBOOK) {foreign['notebook']} --output-dir {out}"], env=foreign_env(foreign))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nb = nbformat.read(out / "probe.ipynb", as_version=4)
    assert_course_python(reported(nb.cells[0]), COURSE_VENV, "make run (nbconvert --execute)")


@pytest.mark.slow
@needs_make
def test_make_test_notebooks_runs_nbval_in_the_course_venv(foreign, tmp_path):
    nb = new_notebook(cells=[new_code_cell(
        PROBE + "\nimport os as _os\n"
        f"assert os.environ.get({MARKER!r}) is None and _os.path.realpath(sys.prefix) == {os.path.realpath(COURSE_VENV)!r}, "
        "('wrong kernel', sys.executable)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, tmp_path / "check_kernel.ipynb")
    proc = run_make([f"$(NBVAL) {tmp_path / 'check_kernel.ipynb'}"], env=foreign_env(foreign))
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_sandbox_kernel_manager_runs_this_python(foreign, monkeypatch):
    from nbclient import NotebookClient
    from traitlets.config import Config

    from course_grader import sandbox as sb

    ok, reason = sb.sandbox_status()
    if not ok:
        pytest.skip(f"sandbox unavailable: {reason}")
    monkeypatch.setenv("JUPYTER_PATH", foreign["jupyter_path"])
    c = Config()
    assert sb.configure_nbgrader(c) == ""
    nb = nbformat.read(foreign["notebook"], as_version=4)
    NotebookClient(nb, config=c, kernel_manager_class=sb.SandboxKernelManager, timeout=120).execute()
    assert_course_python(reported(nb.cells[0]), sys.prefix, "SandboxKernelManager (sandboxed)")


# Grading through nbgrader: a one-lab course whose config loads the course's
# (autograder/nbgrader_config.py), as the driver's generated config and the stock commands do.

LAB = "01_kernel_probe"


@pytest.fixture(scope="module")
def probe_course(foreign):
    from course_grader.grade import nbgrader_env, write_course_config

    course = foreign["base"] / "course"
    (course / "source" / LAB).mkdir(parents=True)
    write_course_config(course, 120)
    test_cell = new_code_cell("assert True")
    test_cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "test_ok",
                                      "points": 1, "schema_version": 3}
    nb = new_notebook(cells=[new_markdown_cell("# which kernel"), new_code_cell(PROBE), test_cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, course / "source" / LAB / f"{LAB}.ipynb")
    env = nbgrader_env(1)
    for args in (["generate_assignment", LAB, "--force"], ["db", "student", "add", "alice"]):
        nbgrader(args, course, env)
    shutil.copytree(course / "release" / LAB, course / "submitted" / "alice" / LAB)
    return course


def nbgrader(args: list[str], course: Path, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def autograde_report(course: Path, env: dict[str, str]) -> dict:
    nbgrader(["autograde", LAB, "--student", "alice", "--force"], course, env)
    graded = nbformat.read(course / "autograded" / "alice" / LAB / f"{LAB}.ipynb", as_version=4)
    return reported(graded.cells[1])


# The sandbox made unavailable (bwrap "missing"), as on macOS or a machine without bubblewrap.
NO_SANDBOX = {"COURSE_SANDBOX_BWRAP": "/nonexistent/bwrap"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sandboxed", "unsafe"])
def test_stock_nbgrader_autograde_with_the_course_config(foreign, probe_course, mode):
    from course_grader import sandbox as sb
    from course_grader.grade import write_course_config

    if mode == "sandboxed" and not sb.sandbox_status()[0]:
        pytest.skip(f"sandbox unavailable: {sb.sandbox_status()[1]}")
    write_course_config(probe_course, 120)  # the course settings alone, as `cd autograder; nbgrader autograde` reads them
    env = foreign_env(foreign, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                      TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR="1")
    if mode == "unsafe":
        env.update(NO_SANDBOX, COURSE_UNSAFE_NO_SANDBOX="1")
    assert_course_python(autograde_report(probe_course, env), sys.prefix, f"stock nbgrader autograde ({mode})")


@pytest.mark.slow
def test_driver_unsafe_no_sandbox_config(foreign, probe_course):
    """The configuration `python -m course_grader.grade --unsafe-no-sandbox` writes and the
    environment it runs nbgrader in, where the sandbox is unavailable."""
    from course_grader import sandbox as sb
    from course_grader.grade import nbgrader_env, write_course_config

    write_course_config(probe_course, 120, sb.nbgrader_config_lines(allow_unsafe=True))
    env = dict(nbgrader_env(1), JUPYTER_PATH=foreign["jupyter_path"], **NO_SANDBOX)
    assert_course_python(autograde_report(probe_course, env), sys.prefix, "course_grader.grade --unsafe-no-sandbox")


# --------------------------------------------------------------------------------------
# make lab: options and root


def lab_command(make_args: list[str], user: list[str] = ()) -> tuple[list[str], list[str]]:
    """(the `jupyter lab` command line of `make -n lab`, the other lines it prints)."""
    proc = subprocess.run([*user, "make", "-n", "--no-print-directory", "lab", *make_args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    command = [line for line in lines if "/jupyter lab " in line]
    assert len(command) == 1, proc.stdout
    words = shlex.split(command[0])
    return words[words.index(next(w for w in words if w.endswith("/jupyter"))):], [l for l in lines if l != command[0]]


def as_nobody() -> list[str]:
    """A prefix that runs a command as an unprivileged user (we are root), or skip."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run make as another user")
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if subprocess.run([*prefix, "test", "-r", str(ROOT / "Makefile")]).returncode != 0:
        pytest.skip("the checkout is not readable by other users")
    return prefix


LAB_ARGS = "--port 8899 --no-browser --ip 0.0.0.0"


@needs_make
def test_make_lab_passes_lab_args():
    words, _ = lab_command([f"LAB_ARGS={LAB_ARGS}"])
    assert words[1:3] == ["lab", "labs"]
    assert words[-len(LAB_ARGS.split()):] == LAB_ARGS.split()


@needs_make
def test_make_lab_as_root_adds_allow_root_and_says_so():
    root = os.geteuid() == 0
    words, others = lab_command([f"LAB_ARGS={LAB_ARGS}"])
    assert ("--allow-root" in words) == root
    said = [line for line in others if "--allow-root" in line]
    assert len(said) == (1 if root else 0), others
    if root:
        assert said[0].startswith("echo ") and "root" in said[0]


@needs_make
def test_make_lab_as_another_user_has_no_allow_root():
    words, others = lab_command([f"LAB_ARGS={LAB_ARGS}"], user=as_nobody())
    assert "--allow-root" not in words and not any("--allow-root" in line for line in others)
    assert words[-len(LAB_ARGS.split()):] == LAB_ARGS.split()


# --------------------------------------------------------------------------------------
# The learner's JupyterLab: nbgrader's instructor tools off


ANSI = re.compile(r"\x1b\[[0-9;]*m")
SERVER_EXTENSIONS = ("import json; from jupyter_server.serverapp import ServerApp; app = ServerApp(); "
                     "app.load_config_file(); app.find_server_extensions(); print(json.dumps(app.jpserver_extensions))")


@pytest.fixture()
def clean_user_config(tmp_path):
    """An empty user config folder: the user's own ~/.jupyter neither helps nor hinders."""
    folder = tmp_path / "user-jupyter-config"
    folder.mkdir()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(folder))
    env.pop("JUPYTER_CONFIG_PATH", None)
    return folder, env


def written(folder: Path) -> list[str]:
    """Files in a user config folder, less the "migrated" stamp every jupyter command leaves in a
    fresh one (jupyter_core.migrate)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name != "migrated")


def disabled_lab_plugins(prefix: str, env: dict[str, str]) -> set[str]:
    proc = run_make([f"{prefix}$(BIN)/jupyter labextension list"], env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = ANSI.sub("", proc.stdout + proc.stderr)
    assert re.search(r"@jupyter/nbgrader v\S+ enabled", text), text  # the package itself stays on
    section = text.split("Disabled extensions:", 1)[1] if "Disabled extensions:" in text else ""
    return {line.strip().split()[0] for line in section.splitlines()
            if line.strip().startswith("@") and not line.startswith("Config dir")}


def server_extensions(prefix: str, env: dict[str, str]) -> dict[str, bool]:
    proc = run_make([f"{prefix}$(BIN)/python -c {shlex.quote(SERVER_EXTENSIONS)}"], env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_make
def test_learner_lab_has_only_the_learner_nbgrader_plugins(clean_user_config):
    folder, env = clean_user_config
    disabled = disabled_lab_plugins("$(LAB_ENV) ", env)
    assert LEARNER_PLUGINS_OFF <= disabled and not (LEARNER_PLUGINS_ON & disabled), disabled
    # outside make lab nothing changed: the same Jupyter, without the target's environment
    assert not (LEARNER_PLUGINS_OFF & disabled_lab_plugins("", env))
    assert written(folder) == []  # nothing written to the user's config folder


@needs_make
def test_learner_server_has_no_formgrader_or_course_list(clean_user_config):
    folder, env = clean_user_config
    learner = server_extensions("$(LAB_ENV) ", env)
    assert all(learner.get(name) is False for name in SERVER_EXTENSIONS_OFF), learner
    assert all(learner.get(name) is True for name in SERVER_EXTENSIONS_ON), learner
    assert learner.get("jupyterlab") is True
    plain = server_extensions("", env)
    assert all(plain.get(name) is True for name in SERVER_EXTENSIONS_OFF | SERVER_EXTENSIONS_ON), plain
    assert written(folder) == []


@needs_make
def test_learner_settings_keep_the_users_own_jupyter_config_path(clean_user_config, tmp_path):
    """make lab puts jupyter/ first on JUPYTER_CONFIG_PATH and keeps the user's own entries."""
    _, env = clean_user_config
    env["JUPYTER_CONFIG_PATH"] = str(tmp_path / "users-own")
    proc = run_make(['$(LAB_ENV) sh -c \'echo "$$JUPYTER_CONFIG_PATH"\''], env=env)
    assert proc.stdout.strip() == f"{ROOT / 'jupyter'}{os.pathsep}{tmp_path / 'users-own'}", proc.stdout


@needs_make
def test_learner_assignment_list_reads_an_exchange_it_can_use(clean_user_config, tmp_path):
    """The Assignments panel (nbgrader list) under the learner settings: a working, empty
    exchange inside the checkout, not nbgrader's unwritable system default. Run on a copy of
    jupyter/ so the exchange lands in the temporary folder."""
    _, env = clean_user_config
    shutil.copytree(ROOT / "jupyter", tmp_path / "jupyter")
    nbgrader = [str(COURSE_VENV / "bin" / "nbgrader"), "list"]
    plain = subprocess.run(nbgrader, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    learner = subprocess.run(nbgrader, cwd=tmp_path, env=dict(env, JUPYTER_CONFIG_PATH=str(tmp_path / "jupyter")),
                             capture_output=True, text=True, timeout=120)
    exchange = tmp_path / "autograder" / "work" / "exchange"
    if not Path("/usr/local/share/nbgrader/exchange").is_dir():   # the stock default is unusable here
        assert plain.returncode != 0 and "exchange" in plain.stdout + plain.stderr
    assert learner.returncode == 0, learner.stdout + learner.stderr
    assert exchange.is_dir() and (exchange.stat().st_mode & 0o1777) == 0o1777
