"""Tests of the learner-code sandbox (course_grader.sandbox).

Notebooks run through nbclient (and once through stock ``nbgrader autograde``) with
kernels from SandboxKernelManager; the checks run *inside* the kernel and print JSON
that the tests read back. Skipped, with the reason, where the sandbox cannot run
(no bubblewrap, not Linux). About 30-40 s on 2 cores (25 s of it in the two tests
marked slow).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from traitlets.config import Config

from course_grader import sandbox as sb

pytestmark = pytest.mark.slow  # starts sandboxed kernels: not in `make test-fast`

REPO = Path(__file__).resolve().parents[1]

AVAILABLE, REASON = sb.sandbox_status()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"sandbox unavailable: {REASON}")
MiB, GiB = sb.MiB, sb.GiB


class RecordingKernelManager(sb.SandboxKernelManager):
    """SandboxKernelManager that remembers its instances (to read uid / wall-clock flags)."""

    instances: list = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        RecordingKernelManager.instances.append(self)
        self.seen_uid = None
        self.seen_host_dir = None

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        self.seen_uid = self.sandbox.uid_inside if self.sandbox else None
        self.seen_host_dir = self.sandbox.host_dir if self.sandbox else None
        await super()._async_launch_kernel(kernel_cmd, **kw)


def make_client(cells, limits=None, cwd=None, timeout=60, **kwargs) -> NotebookClient:
    """A NotebookClient for CELLS (sources) whose kernel starts in the sandbox."""
    nb = new_notebook(cells=[new_code_cell(src) for src in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = (limits or sb.SandboxLimits()).to_dict()
    resources = {"metadata": {"path": str(cwd)}} if cwd else {}
    return NotebookClient(nb, kernel_manager_class=RecordingKernelManager, config=config, timeout=timeout,
                          allow_errors=True, resources=resources, **kwargs)


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def json_of(cell) -> dict:
    """The JSON object a check cell printed last (fails the test with the cell's outputs if none)."""
    lines = [line for line in text_of(cell).splitlines() if line.startswith("{")]
    assert lines, f"cell printed no JSON; outputs: {cell.outputs}"
    return json.loads(lines[-1])


def uid_processes(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def wait_no_processes(uid: int, seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := uid_processes(uid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# --------------------------------------------------------------------------------------
# The main isolation notebook: one kernel, every check as a cell


LIMITS = sb.SandboxLimits(memory_bytes=3 * GiB, processes=64, file_bytes=8 * MiB,
                          scratch_bytes=48 * MiB, tmp_bytes=32 * MiB, cpu_seconds=600, wall_seconds=300)


def isolation_cells(paths: dict[str, str], host_port: int) -> list[str]:
    return [
        # 0: who and where
        """
        import errno, json, os, socket
        print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "cwd": os.getcwd(),
                          "files": sorted(os.listdir(".")), "seed": open("data.txt").read(),
                          "env": sorted(os.environ), "pids": len([p for p in os.listdir("/proc") if p.isdigit()]),
                          "repo_listing": sorted(os.listdir(%r))}))
        """ % paths["repo"],
        # 1: what is visible
        """
        paths = %r
        print(json.dumps({k: os.path.exists(v) for k, v in paths.items()}))
        """ % paths,
        # 2: network
        """
        def attempt(host, port):
            try:
                socket.create_connection((host, port), timeout=3).close()
                return "connected"
            except OSError as exc:
                return type(exc).__name__
        def can_listen():
            s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); port = s.getsockname()[1]
            c = socket.create_connection(("127.0.0.1", port), timeout=3); c.close(); s.close()
            return True
        print(json.dumps({"pypi_by_name": attempt("pypi.org", 443), "pypi_by_ip": attempt("151.101.0.223", 443),
                          "host_loopback_service": attempt("127.0.0.1", %d), "own_loopback": can_listen(),
                          "interfaces": [n for _, n in socket.if_nameindex()]}))
        """ % host_port,
        # 3: writing outside the scratch folders
        """
        def write(path):
            try:
                with open(path, "w") as f:
                    f.write("x")
                return "written"
            except OSError as exc:
                return errno.errorcode.get(exc.errno, str(exc.errno))
        targets = {"course_lib": %r, "course_grader": %r, "venv": %r, "etc": "/etc/evil", "usr": "/usr/evil",
                   "root": "/evil",
                   "repo": %r + "/evil",
                   "runtime_dir": %r + "/evil",
                   "home": "ok_home.txt", "tmp": "/tmp/ok.txt"}
        print(json.dumps({k: write(v) for k, v in targets.items()}))
        """ % (paths["course_lib"] + "/evil.py", paths["course_grader"] + "/judge.py", paths["venv"] + "/evil",
               paths["repo"], str(sb.runtime_root())),
        # 4: the course stack works
        """
        import torch, course_lib, course_grader.remote
        a = torch.arange(6.0).reshape(2, 3)
        print(json.dumps({"matmul": (a @ a.T).tolist(), "course_lib": course_lib.__file__,
                          "course_grader": course_grader.remote.__file__}))
        """,
        # 5: file-size bomb and tmpfs cap
        """
        res = {}
        try:
            with open("big.bin", "wb") as f:
                f.write(b"x" * (%d + 1024 * 1024))
            res["big"] = "written"
        except OSError as exc:
            res["big"] = errno.errorcode.get(exc.errno)
        res["big_size"] = os.path.getsize("big.bin")
        os.remove("big.bin")
        n, err = 0, None
        try:
            for n in range(100):
                with open(f"fill{n}.bin", "wb") as f:
                    f.write(b"y" * (%d - 1))
        except OSError as exc:
            err = errno.errorcode.get(exc.errno)
        res["fill_error"], res["fill_files"] = err, n
        res["fill_bytes"] = sum(os.path.getsize(p) for p in os.listdir(".") if p.startswith("fill"))
        for p in os.listdir("."):
            if p.startswith("fill"):
                os.remove(p)
        print(json.dumps(res))
        """ % (LIMITS.file_bytes, LIMITS.file_bytes),
        # 6: memory bombs
        """
        res = {}
        try:
            huge = bytearray(%d)
            res["one_shot"] = "allocated"
        except MemoryError:
            res["one_shot"] = "MemoryError"
        chunks = []
        try:
            while True:
                chunks.append(b"z" * (64 * 1024 * 1024))
        except MemoryError:
            res["gradual"] = "MemoryError"
        res["gradual_mib"] = 64 * len(chunks)
        del chunks
        print(json.dumps(res))
        """ % (2 * LIMITS.memory_bytes),
        # 7: fork bomb (in a child, so that this kernel keeps answering)
        """
        import subprocess, sys, time
        BOMB = "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass"
        bomb = subprocess.Popen([sys.executable, "-c", BOMB])
        time.sleep(3)
        def my_tasks():  # tasks (threads included) of this uid: what RLIMIT_NPROC counts
            n = 0
            for p in os.listdir("/proc"):
                try:
                    if p.isdigit() and os.stat(f"/proc/{p}").st_uid == os.getuid():
                        n += len(os.listdir(f"/proc/{p}/task"))
                except OSError:
                    pass
            return n
        print(json.dumps({"tasks": my_tasks(), "bomb_running": bomb.poll() is None}))
        """,
        # 8: the kernel still answers
        """
        print(json.dumps({"alive": True}))
        """,
    ]


@pytest.mark.slow
@needs_sandbox
def test_isolation_limits_and_course_stack(tmp_path):
    # a fake grading tree: this kernel's shard (notebook + a data file) and a sibling shard
    shards = tmp_path / "build" / "grading" / "shards"
    own = shards / "0001" / "autograded" / "alice" / "lab"
    other = shards / "0002" / "autograded" / "bob" / "lab"
    for folder in (own, other):
        folder.mkdir(parents=True)
        (folder / "lab.ipynb").write_text("{}  # stands for the notebook with hidden tests\n")
    (own / "data.txt").write_text("seed data")
    (other / "secret.txt").write_text("bob's work")
    (own / "link_to_other").symlink_to(other / "secret.txt")
    os.environ["SANDBOX_TEST_HOST_SECRET"] = "must not be passed"
    paths = {
        "repo": str(REPO), "solutions": str(REPO / "solutions"), "samples": str(REPO / "autograder" / "samples"),
        "hostile": str(REPO / "autograder" / "hostile"), "config": str(REPO / "autograder" / "nbgrader_config.py"),
        "course_grader": str(REPO / "autograder" / "course_grader"),
        "build": str(REPO / "build"), "gradebook": str(REPO / "autograder" / "work" / "gradebook.db"),
        "git": str(REPO / ".git"), "own_shard": str(own), "own_notebook": str(own / "lab.ipynb"),
        "sibling_shard": str(other), "sibling_file": str(other / "secret.txt"), "tmp_path": str(tmp_path),
        "root_home_ssh": "/root/.ssh", "host_etc_shadow": "/etc/shadow", "course_lib": str(REPO / "course_lib"),
        "venv": sys.prefix,
    }
    assert (REPO / "solutions").is_dir() and (REPO / "autograder").is_dir()

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host_checks = {}

    def after_cell(cell, cell_index, execute_reply):
        if cell_index == 7:  # the fork bomb is running now: the host must still work
            host_checks["true"] = subprocess.run(["/bin/true"]).returncode
            host_checks["python"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                                                   capture_output=True, text=True).stdout.strip()

    cells = [textwrap.dedent(c) for c in isolation_cells(paths, listener.getsockname()[1])]
    client = make_client(cells, limits=LIMITS, cwd=own, on_cell_executed=after_cell, timeout=120)
    RecordingKernelManager.instances.clear()
    try:
        nb = client.execute()
    finally:
        listener.close()
        os.environ.pop("SANDBOX_TEST_HOST_SECRET", None)
    km = RecordingKernelManager.instances[-1]
    outs = [json_of(cell) for cell in nb.cells]

    who = outs[0]
    assert who["uid"] != 0 and who["euid"] != 0 and who["gid"] != 0
    assert who["uid"] == km.seen_uid
    assert who["cwd"] == sb.SANDBOX_HOME
    assert who["seed"] == "seed data"
    assert "lab.ipynb" not in who["files"] and "link_to_other" not in who["files"]
    assert "SANDBOX_TEST_HOST_SECRET" not in who["env"] and "JPY_PARENT_PID" not in who["env"]
    assert who["pids"] < 20, "the kernel sees host processes"
    assert set(who["repo_listing"]) <= {".venv", "course_lib", "data_manifests", "autograder"}

    visible = outs[1]
    # the repository folder exists only as a skeleton holding .venv, course_lib, data_manifests and
    # autograder/course_grader (the judge's kernel half); not the samples, the config or solutions/
    assert visible.pop("course_lib") and visible.pop("venv") and visible.pop("repo") and visible.pop("course_grader")
    assert not any(visible.values()), f"visible in the sandbox: {[k for k, v in visible.items() if v]}"

    net = outs[2]
    assert net["pypi_by_name"] != "connected" and net["pypi_by_ip"] != "connected"
    assert net["host_loopback_service"] == "ConnectionRefusedError"
    assert net["own_loopback"] is True and net["interfaces"] == ["lo"]

    writes = outs[3]
    assert writes.pop("home") == "written" and writes.pop("tmp") == "written"
    assert all(v in ("EROFS", "EACCES", "ENOENT") for v in writes.values()), writes

    stack = outs[4]
    assert stack["matmul"] == [[5.0, 14.0], [14.0, 50.0]]
    assert stack["course_lib"].startswith(str(REPO / "course_lib"))
    assert stack["course_grader"].startswith(str(REPO / "autograder" / "course_grader"))

    sizes = outs[5]
    assert sizes["big"] == "EFBIG" and sizes["big_size"] <= LIMITS.file_bytes
    assert sizes["fill_error"] == "ENOSPC" and sizes["fill_bytes"] <= LIMITS.scratch_bytes

    memory = outs[6]
    assert memory["one_shot"] == "MemoryError" and memory["gradual"] == "MemoryError"
    assert memory["gradual_mib"] * MiB < LIMITS.memory_bytes

    assert outs[7]["bomb_running"] and LIMITS.processes - 8 <= outs[7]["tasks"] <= LIMITS.processes
    assert outs[8] == {"alive": True}
    assert host_checks == {"true": 0, "python": "42"}
    # the whole sandbox (bomb included) is gone, and its host folder too
    assert wait_no_processes(who["uid"]) == []
    assert km.sandbox is None and not km.seen_host_dir.exists()


@needs_sandbox
def test_os_exit_gives_dead_kernel_error():
    client = make_client(["import os\nos._exit(3)", "print('never')"], timeout=30)
    RecordingKernelManager.instances.clear()
    start = time.monotonic()
    with pytest.raises(DeadKernelError):
        client.execute()
    assert time.monotonic() - start < 20
    km = RecordingKernelManager.instances[-1]
    assert km.sandbox is None  # cleaned up: folder removed, uid returned
    assert wait_no_processes(km.seen_uid) == []


@needs_sandbox
def test_wall_clock_cap_kills_the_kernel():
    limits = sb.SandboxLimits(wall_seconds=3)
    client = make_client(["import time\ntime.sleep(60)"], limits=limits, timeout=60)
    RecordingKernelManager.instances.clear()
    start = time.monotonic()
    with pytest.raises(DeadKernelError):
        client.execute()
    assert time.monotonic() - start < 20
    assert RecordingKernelManager.instances[-1].wall_clock_expired


@needs_sandbox
def test_interrupt_on_timeout_and_output_cap():
    """nbgrader's Execute flow: a cell past its timeout is interrupted (message-mode
    interrupt) and the next cells still run; one cell's output is capped."""
    nb = new_notebook(cells=[new_code_cell("import time\ntime.sleep(60)"),
                             new_code_cell("for _ in range(50):\n    print('x' * 10000)"),
                             new_code_cell("print('after')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = sb.SandboxLimits(wall_seconds=120).to_dict()
    pre = sb.SandboxExecute(config=config, timeout=3, max_output_bytes=50_000)
    assert pre.kernel_manager_class is sb.SandboxKernelManager
    start = time.monotonic()
    nb, _ = pre.preprocess(nb, {})
    assert time.monotonic() - start < 30
    assert any(o.output_type == "error" and o.ename == "CellTimeoutError" for o in nb.cells[0].outputs)
    printed = text_of(nb.cells[1])
    assert "[sandbox] output truncated" in printed and len(printed) < 70_000
    assert text_of(nb.cells[2]).strip() == "after"


WEDGE = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"


@needs_sandbox
def test_cell_ignoring_the_interrupt_and_stray_input_request():
    """A cell that ignores the timeout interrupt gets CellTimeoutError, its kernel is killed
    and restarted with the earlier cells replayed, so later cells still see their state; a
    second such cell (past max_kernel_restarts=1) leaves the rest not run. An input_request
    sent behind nbclient's back (stdin is off) interrupts its cell within seconds."""
    ask = ("k = get_ipython().kernel\n"
           "k._input_request('answer?', k._parent_ident['shell'], k.get_parent('shell'))\nprint('answered')")
    sources = ["x = 41", WEDGE, "print(x + 1)", ask, "print('after input')", WEDGE, "print('never')"]
    nb = new_notebook(cells=[new_code_cell(src) for src in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = sb.SandboxLimits(wall_seconds=300).to_dict()
    pre = sb.SandboxExecute(config=config, timeout=4, iopub_timeout=3)
    start = time.monotonic()
    nb, _ = pre.preprocess(nb, {})
    assert time.monotonic() - start < 120   # two 4 s timeouts, 3 s iopub waits, one restart

    def errors(cell):
        return [o.ename for o in cell.outputs if o.output_type == "error"]

    assert errors(nb.cells[1]) == ["CellTimeoutError"]
    assert text_of(nb.cells[2]) == "42\n"                      # replayed state in the new kernel
    assert "StdinNotImplementedError" in errors(nb.cells[3]) and "answered" not in text_of(nb.cells[3])
    assert text_of(nb.cells[4]) == "after input\n"
    assert errors(nb.cells[5]) == ["CellTimeoutError"]
    assert errors(nb.cells[6]) == [sb.KERNEL_DIED] and "cell 5" in nb.cells[6].outputs[0].evalue


@needs_sandbox
def test_concurrent_sandboxes_get_their_own_uid():
    if sb.sandbox_mode() != "root":
        pytest.skip("uid leases are used in root mode only")
    with sb.Sandbox() as a, sb.Sandbox() as b:
        assert a.uid != b.uid and a.uid is not None and b.uid is not None
        assert a.host_dir != b.host_dir
    assert not a.host_dir.exists() and not b.host_dir.exists()


def test_refuses_without_sandbox_unless_unsafe_flag():
    real_find = sb.find_tool
    sb.find_tool = lambda name: None if name == "bwrap" else real_find(name)
    try:
        ok, reason = sb.sandbox_status(refresh=True)
        assert not ok and "bwrap" in reason and sb.INSTALL_COMMAND in reason
        with pytest.raises(sb.SandboxUnavailableError, match="refusing to grade"):
            sb.require_sandbox()
        warning = sb.require_sandbox(allow_unsafe=True)
        assert "UNSAFE" in warning and "bwrap" in warning
        # config without the flag: kernels refuse to start
        c = Config()
        assert sb.configure_nbgrader(c) == ""
        assert sb.SandboxExecute in c.Autograde.autograde_preprocessors
        client = NotebookClient(new_notebook(cells=[new_code_cell("1")]), config=c,
                                kernel_manager_class=sb.SandboxKernelManager, timeout=30)
        with pytest.raises(sb.SandboxUnavailableError, match="refusing to start a kernel"):
            client.execute()
        # with the flag: a plain kernel runs, and the warning comes back for the driver
        c = Config()
        assert "UNSAFE" in sb.configure_nbgrader(c, allow_unsafe=True)
        client = NotebookClient(new_notebook(cells=[new_code_cell("import os\nprint(os.getuid())")]), config=c,
                                kernel_manager_class=sb.SandboxKernelManager, timeout=30)
        nb = client.execute()
        assert text_of(nb.cells[0]).strip() == str(os.getuid())
    finally:
        sb.find_tool = real_find
        sb.sandbox_status(refresh=True)


def test_limits_validation_and_the_missing_tool_advice():
    with pytest.raises(ValueError):
        sb.SandboxLimits(memory_bytes=0)
    with pytest.raises(ValueError):
        sb.SandboxLimits.from_dict({"memory": 1})
    assert sb.SandboxLimits.from_dict({"cpu_seconds": 5}).cpu_seconds == 5
    with pytest.raises(sb.SandboxError, match="refusing to bind"):
        sb.default_ro_binds(extra=[REPO])  # would expose solutions/ and autograder/
    real_find = sb.find_tool
    sb.find_tool = lambda name: None
    try:
        assert "install bubblewrap: apt-get install -y bubblewrap" in sb.missing_tools()
    finally:
        sb.find_tool = real_find


# --------------------------------------------------------------------------------------
# Stock `nbgrader autograde` with the config lines the driver appends


LAB = "01_sbx"
SOLUTION = "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"
VISIBLE_TEST = "assert add(1, 2) == 3"
HIDDEN_TEST = (
    "import os\n"
    "assert add(2, 2) == 4\n"
    "### BEGIN HIDDEN TESTS\n"
    "assert not [f for f in os.listdir('.') if f.endswith('.ipynb')], 'the notebook file is visible'\n"
    "assert os.getuid() != 0\n"
    "### END HIDDEN TESTS"
)
PEEK = ("import json, os\n"
        "print(json.dumps({'uid': os.getuid(), 'cwd': os.getcwd(),\n"
        "                  'files': sorted(f for f in os.listdir('.') if not f.startswith('.')),\n"
        "                  'repo_root': sorted(os.listdir(%r)), 'autograder': sorted(os.listdir(%r))}))"
        % (str(REPO), str(REPO / "autograder")))


def _nbgrader(args, cwd):
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR="1")
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.slow
@needs_sandbox
def test_nbgrader_autograde_runs_in_the_sandbox(tmp_path):
    course = tmp_path / "course"
    (course / "source" / LAB).mkdir(parents=True)
    # the course settings with every folder in this course, as the driver writes them for a run
    from course_grader.grade import write_course_config

    write_course_config(course, 60, sb.nbgrader_config_lines(sb.SandboxLimits(wall_seconds=300)))

    def grade_cell(source, cell_id, points=None):
        cell = new_code_cell(source)
        meta = {"grade": points is not None, "solution": points is None, "locked": points is not None,
                "grade_id": cell_id, "schema_version": 3}
        if points is not None:
            meta["points"] = points
        cell.metadata["nbgrader"] = meta
        return cell

    nb = new_notebook(cells=[new_markdown_cell("# sandbox lab"), grade_cell(SOLUTION, "add"),
                             grade_cell(VISIBLE_TEST, "test_visible", 1), grade_cell(HIDDEN_TEST, "test_hidden", 2),
                             new_code_cell(PEEK)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, course / "source" / LAB / f"{LAB}.ipynb")

    _nbgrader(["generate_assignment", LAB, "--force"], course)
    _nbgrader(["db", "student", "add", "alice"], course)
    submitted = course / "submitted" / "alice" / LAB
    shutil.copytree(course / "release" / LAB, submitted)
    answer = nbformat.read(submitted / f"{LAB}.ipynb", as_version=4)
    answer.cells[1].source = "def add(a, b):\n    return a + b"  # the learner's solution
    nbformat.write(answer, submitted / f"{LAB}.ipynb")
    (submitted / "notes.txt").write_text("alice's extra file")
    log = _nbgrader(["autograde", LAB, "--student", "alice"], course)

    graded = nbformat.read(course / "autograded" / "alice" / LAB / f"{LAB}.ipynb", as_version=4)
    peek = json_of(graded.cells[-1])
    assert peek["uid"] != 0 and peek["cwd"] == sb.SANDBOX_HOME
    assert peek["files"] == ["notes.txt"]
    assert set(peek["repo_root"]) <= {".venv", "course_lib", "data_manifests", "autograder"}
    assert peek["autograder"] == ["course_grader"]  # not the config, the samples or the work folder
    assert not any(o.output_type == "error" for cell in graded.cells if cell.cell_type == "code"
                   for o in cell.outputs), log
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "llm-inference-lab") as gb:
        submission = gb.find_submission(LAB, "alice")
        assert (submission.score, submission.max_score) == (3.0, 3.0)


def test_protocol_breach_names_a_message_that_fails_verification_and_nothing_else():
    """The grader's test for "this kernel stopped speaking the protocol": an error raised while
    jupyter_client reads a message (a forged signature, a replayed one, a malformed frame), not
    an error raised anywhere else."""
    from jupyter_client.session import Session

    session = Session(key=b"secret")
    parts = session.serialize(session.msg("execute_reply", content={"status": "ok"}))
    _, frames = session.feed_identities(parts)
    signed = list(frames)
    session.deserialize(list(signed))                      # a good message reads
    problems = {"forged": [b"0" * 64, *signed[1:]], "replayed": signed, "malformed": signed[:3]}
    for name, msg in problems.items():
        with pytest.raises(Exception) as info:
            session.deserialize(list(msg))
        detail = sb.protocol_breach(info.value)
        assert detail is not None and type(info.value).__name__ in detail, name
    try:
        raise ValueError("Invalid Signature: raised by the grader itself")
    except ValueError as exc:
        assert sb.protocol_breach(exc) is None


@needs_sandbox
def test_a_kernel_that_stops_speaking_the_protocol_is_stopped_without_waiting_for_the_timeout():
    """Learner code that replaces builtins the kernel's messaging relies on: the cell never gets an
    execute_reply (or its messages fail verification). With a 300 s cell timeout, the kernel is
    stopped as broken (KernelDied naming why), not timed out; earlier cells keep their output and
    later cells are recorded as not run."""
    from course_grader.hostile import BREAK_THE_KERNEL

    sources = ["print('before')", BREAK_THE_KERNEL, "print('never')"]
    nb = new_notebook(cells=[new_code_cell(src) for src in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = sb.SandboxLimits(wall_seconds=900).to_dict()
    pre = sb.SandboxExecute(config=config, timeout=300, reply_grace=5)
    nb, _ = pre.preprocess(nb, {})
    assert text_of(nb.cells[0]) == "before\n"
    broken = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    assert [o.ename for o in broken] == [sb.KERNEL_DIED], broken
    assert sb.PROTOCOL_BROKEN in broken[0].evalue
    assert [o.ename for o in nb.cells[2].outputs] == [sb.KERNEL_DIED]
    assert "not run" in nb.cells[2].outputs[0].evalue and "cell 1" in nb.cells[2].outputs[0].evalue


@needs_sandbox
def test_output_caps_count_every_field_and_the_whole_notebook():
    """The per-cell cap counts what a viewer does not show too (display metadata, an error's
    ename), and a notebook-wide cap bounds the sum of cells that each stay under theirs."""
    in_metadata = ("from IPython.display import publish_display_data\n"
                   "publish_display_data({'text/plain': 'x'}, metadata={'junk': 'm' * 200_000})")
    in_ename = ("from IPython.core.interactiveshell import InteractiveShell\n"
                "shell = InteractiveShell.instance()\n"
                "shell.displayhook.flush()\n"
                "shell.kernel.session.send(shell.kernel.iopub_socket, 'error', "
                "{'ename': 'E' * 200_000, 'evalue': '', 'traceback': []}, parent=shell.kernel.get_parent())")
    nb = new_notebook(cells=[new_code_cell(in_metadata), new_code_cell(in_ename)]
                      + [new_code_cell("print('y' * 40_000)") for _ in range(3)] + [new_code_cell("print('z')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = sb.SandboxLimits(wall_seconds=120).to_dict()
    pre = sb.SandboxExecute(config=config, timeout=30, max_output_bytes=50_000, max_notebook_output_bytes=100_000)
    nb, _ = pre.preprocess(nb, {})
    for cell in nb.cells[:2]:
        assert len(json.dumps(cell.outputs)) < 10_000, cell.outputs
        assert "this cell printed more than 50000 bytes" in text_of(cell)
    assert [("truncated" in text_of(cell)) for cell in nb.cells[2:5]] == [False, False, True]
    assert "the notebook's cells printed more than 100000 bytes" in text_of(nb.cells[4])


@needs_sandbox
def test_a_message_that_would_balloon_in_the_grader_is_refused_unparsed():
    """One display message of many empty lists (small as text, huge once parsed by the grader's
    unsandboxed client) is refused before parsing, and its kernel stopped as broken."""
    balloon = ("from IPython.display import publish_display_data\n"
               "publish_display_data({'text/plain': 'x'}, metadata={'junk': [[]] * 300_000})")
    nb = new_notebook(cells=[new_code_cell("print('before')"), new_code_cell(balloon), new_code_cell("print('z')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = sb.SandboxLimits(wall_seconds=120).to_dict()
    config.SandboxKernelManager.max_message_elements = 100_000
    pre = sb.SandboxExecute(config=config, timeout=60)
    nb, _ = pre.preprocess(nb, {})
    assert text_of(nb.cells[0]) == "before\n"
    died = [o.evalue for o in nb.cells[1].outputs if o.output_type == "error" and o.ename == sb.KERNEL_DIED]
    assert died and sb.PROTOCOL_BROKEN in died[0] and "JSON elements" in died[0], nb.cells[1].outputs
    assert [o.ename for o in nb.cells[2].outputs] == [sb.KERNEL_DIED]


@needs_sandbox
def test_the_connection_folder_is_closed_to_the_kernel_once_it_is_ready():
    """The kernel's connection folder is a host folder bound read-write (its IPC sockets live
    there), outside the size-capped tmpfs: once the kernel is ready, and again after a restart,
    sandboxed code cannot create files in it (so it cannot fill the host's disk through it)."""
    if sb.sandbox_mode() != "root":
        pytest.skip("only root mode runs the kernel under a uid other than the folder's owner")
    probe = ("import os, json\nfrom ipykernel.kernelapp import IPKernelApp\nfolder = os.path.dirname(IPKernelApp.instance().connection_file)\n"
             "try:\n    open(os.path.join(folder, 'filler'), 'wb').write(b'x')\n    print(json.dumps({'wrote': True}))\n"
             "except OSError as exc:\n    print(json.dumps({'wrote': False, 'errno': exc.errno}))")
    nb = new_notebook(cells=[new_code_cell(probe), new_code_cell(WEDGE), new_code_cell(probe)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = sb.SandboxLimits(wall_seconds=300).to_dict()
    pre = sb.SandboxExecute(config=config, timeout=4, iopub_timeout=3)
    nb, _ = pre.preprocess(nb, {})
    import errno

    assert json_of(nb.cells[0]) == {"wrote": False, "errno": errno.EACCES}
    assert [o.ename for o in nb.cells[1].outputs if o.output_type == "error"] == ["CellTimeoutError"]
    assert json_of(nb.cells[2]) == {"wrote": False, "errno": errno.EACCES}      # after the restart too


@needs_sandbox
def test_a_display_update_is_charged_for_every_output_it_rewrites():
    """update_display_data rewrites every earlier output with its display id: 100 small displays
    then one 100 kB update would add 10 MB past a 50 kB cap; the update is dropped instead."""
    grow = ("from IPython.display import display, update_display\n"
            "for _ in range(100):\n    display({'text/plain': '.'}, raw=True, display_id='grow')\n"
            "update_display({'text/plain': 'U' * 100_000}, raw=True, display_id='grow')")
    nb = new_notebook(cells=[new_code_cell(grow), new_code_cell("print('after')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxKernelManager.limits = sb.SandboxLimits(wall_seconds=120).to_dict()
    pre = sb.SandboxExecute(config=config, timeout=60, max_output_bytes=50_000)
    nb, _ = pre.preprocess(nb, {})
    assert len(json.dumps(nb.cells[0].outputs)) < 50_000
    assert "a display update would rewrite" in text_of(nb.cells[0])
    assert text_of(nb.cells[1]) == "after\n"
