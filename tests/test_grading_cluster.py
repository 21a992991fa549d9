"""Grading fanned out on Dask (course_grader.cluster, `grade.py --cluster ADDRESS`).

A LocalCluster of 2 worker processes stands in for an instructor's cluster: it grades Lab 1's sample
submissions to their expected scores and to byte-identical CSVs as `--jobs 2`; a worker killed in the
middle of a task has its submission graded again elsewhere (or, with no retry allowed, reported as an
error row), and the merged gradebook holds each submission once. The worker check refuses a worker with
other course code or no sandbox, naming it.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from course_grader import cluster, grade
from test_grading_pipeline import LAB, REPO, read_grades, stock_release, write_source

SAMPLES = REPO / "autograder" / "samples"
LAB1 = "01_roofline"
LAB1_LEARNERS = ("solution", "fault_gib_for_gb")
SEED = 11


def local_cluster(tmp_path: Path, **kwargs):
    from distributed import LocalCluster

    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                        local_directory=str(tmp_path / "dask"), **kwargs)


def expected_totals() -> dict[tuple[str, str], float]:
    table = pd.read_csv(SAMPLES / "expected_scores.csv", dtype=str, keep_default_na=False)
    totals = table[table["cell"] == "total"]
    return {(r.learner, r.lab): float(r.score) for r in totals.itertuples()}


def submissions_in_gradebook(work: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(work / "course" / "gradebook.db")
    try:
        return sorted(con.execute("SELECT student.id, assignment.name FROM submitted_assignment "
                                  "JOIN student ON student.id = submitted_assignment.student_id "
                                  "JOIN assignment ON assignment.id = submitted_assignment.assignment_id"))
    finally:
        con.close()


@pytest.mark.slow
def test_a_local_cluster_grades_the_samples_like_two_local_jobs(tmp_path):
    batch = tmp_path / "batch"
    for learner in LAB1_LEARNERS:
        shutil.copytree(SAMPLES / learner / LAB1, batch / learner / LAB1)
    expected = pd.read_csv(SAMPLES / "expected_scores.csv", dtype=str, keep_default_na=False)
    expected[expected.learner.isin(LAB1_LEARNERS) & (expected.lab == LAB1)].to_csv(tmp_path / "expected.csv", index=False)
    common = ["--per-test", "--seed", str(SEED), "--expected", str(tmp_path / "expected.csv")]
    with local_cluster(tmp_path) as lc:
        code = grade.main([str(batch), "--cluster", lc.scheduler_address, "--work", str(tmp_path / "on_cluster"),
                           *common])
    assert code == grade.EXIT_OK
    assert grade.main([str(batch), "--jobs", "2", "--work", str(tmp_path / "local"), *common]) == grade.EXIT_OK
    on_cluster, local = read_grades(tmp_path / "on_cluster"), read_grades(tmp_path / "local")
    totals = expected_totals()
    assert {(r.learner, r.lab): r.score for r in on_cluster.itertuples()} == {(l, LAB1): totals[(l, LAB1)]
                                                                              for l in LAB1_LEARNERS}
    for name in ("grades.csv", "grades_per_test.csv", "judge_disagreements.csv"):
        assert (tmp_path / "on_cluster" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert submissions_in_gradebook(tmp_path / "on_cluster") == sorted((l, LAB1) for l in LAB1_LEARNERS)
    for learner in LAB1_LEARNERS:
        assert (tmp_path / "on_cluster" / "course" / "feedback" / learner / LAB1 / f"{LAB1}.html").is_file()


def tiny_batch(root: Path) -> Path:
    """The grading pipeline's tiny lab, with three learners; `slow` sleeps 20 s in its answer so a
    worker can be killed while its task runs."""
    write_source(root)
    release = stock_release(root)
    answers = {"quick": "def add(a, b):\n    return a + b",
               "slow": "import time\ntime.sleep(20)\ndef add(a, b):\n    return a + b",
               "wrong": "def add(a, b):\n    return a - b"}
    for learner, body in answers.items():
        nb = nbformat.read(release, as_version=4)
        (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "add"]
        cell.source = body
        path = root / "batch" / learner / LAB / f"{LAB}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    return root / "batch"


def kill_the_worker_grading(learner: str, scratch: Path, timeout: float = 120) -> int:
    """Wait until a worker's shard folder for LEARNER has its kernel running, then SIGKILL that worker
    process and everything it started (nbgrader, the kernel); returns the worker's pid."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:        # other tasks' folders come and go while this looks
            tasks = list(scratch.rglob(f"course-grading-*/{cluster.TASK_FILE}"))
        except OSError:
            tasks = []
        for task in tasks:
            folder = task.parent
            log = folder / "nbgrader.log"
            try:
                started = (folder / "submitted" / learner).is_dir() and "Autograding" in log.read_text()
                pid = json.loads(task.read_text())["pid"]
            except (OSError, ValueError):
                continue
            if started:
                time.sleep(2)                                     # the kernel is in the sleeping cell
                worker = psutil.Process(pid)
                for proc in worker.children(recursive=True) + [worker]:
                    try:
                        proc.kill()
                    except psutil.NoSuchProcess:
                        pass
                worker.wait(timeout=30)
                assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                return pid
        time.sleep(0.2)
    raise AssertionError(f"no worker started grading {learner} within {timeout} s")


def grade_in_thread(args: list[str]) -> tuple[threading.Thread, dict]:
    result = {}
    thread = threading.Thread(target=lambda: result.update(code=grade.main(args)), daemon=True)
    thread.start()
    return thread, result


@pytest.mark.slow
def test_a_worker_killed_mid_task_has_its_submission_graded_elsewhere_once(tmp_path):
    batch = tiny_batch(tmp_path)
    work = tmp_path / "work"
    with local_cluster(tmp_path) as lc:
        thread, result = grade_in_thread([str(batch), "--root", str(tmp_path), "--cluster", lc.scheduler_address,
                                          "--work", str(work), "--seed", str(SEED)])
        killed = kill_the_worker_grading("slow", tmp_path / "dask")
        thread.join(timeout=300)
        assert not thread.is_alive(), "the driver did not finish after the worker was killed"
    assert result["code"] == grade.EXIT_OK
    grades = read_grades(work).set_index("learner")
    assert grades.loc["slow", "score"] == 3 and grades.loc["slow", "error"] == ""
    assert grades.loc["quick", "score"] == 3 and grades.loc["wrong", "score"] == 0
    assert submissions_in_gradebook(work) == sorted((l, LAB) for l in ("quick", "slow", "wrong"))
    timings = read_grades(work, "timings.csv").set_index("learner")
    # graded again by another worker process than the one killed, and listed once
    assert timings.loc["slow", "graded_on"].endswith(")") and f"(pid {killed})" not in timings.loc["slow", "graded_on"]
    assert sorted(timings.index) == ["quick", "slow", "wrong"]


@pytest.mark.slow
def test_with_no_retry_allowed_a_killed_task_is_an_error_row_not_a_lost_one(tmp_path):
    import dask

    batch = tiny_batch(tmp_path)
    work = tmp_path / "work"
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with local_cluster(tmp_path) as lc:
            thread, result = grade_in_thread([str(batch), "--root", str(tmp_path), "--cluster",
                                              lc.scheduler_address, "--work", str(work), "--seed", str(SEED)])
            kill_the_worker_grading("slow", tmp_path / "dask")
            thread.join(timeout=300)
            assert not thread.is_alive()
    assert result["code"] == grade.EXIT_OK
    grades = read_grades(work).set_index("learner")
    assert "KilledWorker" in grades.loc["slow", "error"] and grades.loc["slow", "score"] == 0
    assert grades.loc["quick", "score"] == 3 and grades.loc["wrong", "score"] == 0
    assert submissions_in_gradebook(work) == [("quick", LAB), ("wrong", LAB)]


# -- the worker check (no cluster: a stand-in client) -----------------------------------------------


class FakeFuture:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value

    def release(self):
        pass


class FakeClient:
    """Answers each worker's check task with that worker's report (an exception: the task failed)."""

    def __init__(self, reports):
        self.reports = reports

    def scheduler_info(self, n_workers=-1):
        return {"workers": {address: {"nthreads": 1} for address in self.reports}}

    def submit(self, function, *args, workers, allow_other_workers, pure, key):
        assert function is cluster.worker_report and args == (False,)
        assert len(workers) == 1 and not allow_other_workers and not pure
        return FakeFuture(self.reports[workers[0]])


def report(**changes):
    good = {"host": "node1", "cpus": 2, "root": "/srv/course", "fingerprint": cluster.code_fingerprint(),
            **cluster.versions(), "problems": [], "unsafe": ""}
    return {**good, **changes}


def stand_in(reports) -> cluster.Cluster:
    c = object.__new__(cluster.Cluster)
    c.client, c.allow_unsafe = FakeClient(reports), False
    return c


def test_the_worker_check_names_each_worker_that_differs_or_cannot_grade():
    assert set(stand_in({"tcp://a:1": report(), "tcp://b:1": report(host="node2")}).check()) == {"tcp://a:1",
                                                                                                 "tcp://b:1"}
    bad = {"tcp://a:1": report(), "tcp://b:1": report(host="node2", fingerprint="0" * 64),
           "tcp://c:1": report(host="node3", problems=["no sandbox: bubblewrap is not installed"]),
           "tcp://d:1": report(host="node4", nbgrader="0.9.5")}
    with pytest.raises(grade.InfrastructureError) as info:
        stand_in(bad).check()
    message = str(info.value)
    assert "tcp://a:1" not in message
    assert "tcp://b:1 on node2" in message and "fingerprint 000000000000" in message
    assert "tcp://c:1 on node3" in message and "bubblewrap is not installed" in message
    assert "tcp://d:1 on node4" in message and "nbgrader 0.9.5" in message


def test_the_worker_check_names_a_worker_with_other_numerics_or_a_check_that_failed():
    from types import SimpleNamespace

    from distributed import KilledWorker

    bad = {"tcp://a:1": report(), "tcp://b:1": report(host="node2", torch="2.12.0"),
           "tcp://c:1": KilledWorker("course-worker-check-x", SimpleNamespace(address="tcp://c:1"), 3)}
    with pytest.raises(grade.InfrastructureError) as info:
        stand_in(bad).check()
    message = str(info.value)
    assert "tcp://a:1" not in message
    assert "tcp://b:1 on node2" in message and "torch 2.12.0" in message
    assert "worker tcp://c:1: its check did not finish: KilledWorker" in message


def test_a_task_from_a_driver_with_other_code_is_refused_by_the_worker():
    with pytest.raises(cluster.WorkerUnfit, match="other course code"):
        cluster.grade_task({"fingerprint": "f" * 64})


@pytest.mark.parametrize("address, message", [("http://host:8786", "give the scheduler's address"),
                                              ("/nowhere/scheduler.json", "no such scheduler file")])
def test_a_cluster_address_that_cannot_work_is_refused_at_once(capsys, address, message):
    with pytest.raises(SystemExit):
        grade.parse_args(["somewhere", "--cluster", address])
    assert message in capsys.readouterr().err


def test_the_shard_archive_keeps_files_and_refuses_links_out(tmp_path):
    import io
    import tarfile

    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "sub" / "x.txt").write_text("x")
    (tmp_path / "a" / "nbgrader_config.py").write_text("c = 1")
    data = cluster.pack(tmp_path / "a", leave_out=("nbgrader_config.py",))
    cluster.unpack(data, tmp_path / "b")
    assert (tmp_path / "b" / "sub" / "x.txt").read_text() == "x" and not (tmp_path / "b" / "nbgrader_config.py").exists()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("escape")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(tarfile.TarError):
        cluster.unpack(buffer.getvalue(), tmp_path / "c")
    # a relative link that stays inside the folder is refused too: the merge would follow it
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("autograded")
        info.type, info.linkname = tarfile.SYMTYPE, "source"
        tar.addfile(info)
    with pytest.raises(tarfile.TarError, match="not a regular file"):
        cluster.unpack(buffer.getvalue(), tmp_path / "d")
    assert not (tmp_path / "d" / "autograded").exists()


def test_cluster_and_jobs_do_not_go_together(capsys):
    with pytest.raises(SystemExit):
        grade.parse_args(["somewhere", "--cluster", "tcp://x:1", "--jobs", "2"])
    assert "--cluster and --jobs" in capsys.readouterr().err
