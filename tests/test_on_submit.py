"""The on-submit worker without a hub (course_grader.on_submit): the queue, the rate limit, the status
file, the course file's [grade_on_submit] section, the command line and the Dask path, with stub jobs.
Grading itself through the worker is tested end to end on a real hub (tests/test_hub_exchange.py)."""
import json
import logging
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from course_grader import on_submit
from course_grader.config import COURSE_ID
from course_grader.term import GradeOnSubmit, TermError, load

LAB, OTHER_LAB = "01_roofline", "02_kv_cache"


def hand_in(exchange: Path, learner: str, lab: str = LAB, stamp: str = "2027-01-10 10:00:00.000001 UTC",
            complete: bool = True) -> str:
    """An inbound folder as `nbgrader submit` leaves it (timestamp.txt written last)."""
    name = f"{learner}+{lab}+{stamp}+{abs(hash((learner, stamp))) % 10**6}"
    folder = exchange / COURSE_ID / "inbound" / name
    folder.mkdir(parents=True)
    (folder / f"{lab}.ipynb").write_text("{}")
    if complete:
        (folder / "timestamp.txt").write_text(stamp)
    return name


class ManualJobs:
    """A `submit` whose futures the test ends by hand: nothing runs on its own."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, function, *args):
        future = Future()
        self.calls.append((args, future))
        return future


def states(worker) -> dict[str, str]:
    return {name: r["state"] for name, r in worker.records.items()}


def test_rate_limit_skips_submissions_over_the_limit_and_logs_why(tmp_path, caplog):
    exchange = tmp_path / "exchange"
    first, second, third = (hand_in(exchange, "ann", stamp=f"2027-01-10 10:00:0{i}.000001 UTC") for i in range(3))
    bo = hand_in(exchange, "bo")
    jobs = ManualJobs()
    worker = on_submit.Worker(tmp_path / "course", exchange, per_learner=2, jobs=1, submit=jobs, labs=(LAB,))
    with caplog.at_level(logging.WARNING, logger="course_grader.on_submit"):
        worker.step()
    assert states(worker) == {first: "running", second: "queued", third: "skipped", bo: "queued"}
    assert [args[2:] for args, _ in jobs.calls] == [("ann", LAB)]            # one job at a time (jobs=1)
    assert "2 job(s) already queued or running (per_learner = 2)" in worker.records[third]["reason"]
    assert third in caplog.text and "ann" in caplog.text and "per_learner = 2" in caplog.text
    assert (exchange / COURSE_ID / "inbound" / third).is_dir()                # left for the batch

    # ann's first job ends: she is below the limit again, and a new submission is queued
    jobs.calls[0][1].set_result({"score": 13.0, "max_score": 13.0})
    fourth = hand_in(exchange, "ann", stamp="2027-01-10 11:00:00.000001 UTC")
    worker.step()
    assert states(worker)[first] == "graded" and states(worker)[fourth] == "queued"
    assert states(worker)[second] == "running" and states(worker)[third] == "skipped"


def test_status_file_records_each_job_and_a_restart_grades_nothing_twice(tmp_path):
    exchange, status = tmp_path / "exchange", tmp_path / "status.jsonl"
    ann, bo = hand_in(exchange, "ann"), hand_in(exchange, "bo")
    ran = []

    def job(course_root, exchange_root, learner, lab):
        ran.append(learner)
        if learner == "bo":
            raise on_submit.JobError("`nbgrader autograde` exited 1:\nno kernel")
        return {"started": "s", "finished": "f", "score": 11.0, "max_score": 13.0, "graded_timestamp": "t"}

    worker = on_submit.Worker(tmp_path / "course", exchange, job=job, status=status, labs=(LAB,))
    worker.run(interval=0.01, once=True)
    worker.close()
    lines = [json.loads(line) for line in status.read_text().splitlines()]
    assert [(r["learner"], r["state"]) for r in lines] == [("ann", "queued"), ("bo", "queued"), ("ann", "running"),
                                                           ("ann", "graded"), ("bo", "running"), ("bo", "failed")]
    latest = on_submit.read_status(status)
    assert (latest[ann]["score"], latest[ann]["max_score"], latest[ann]["lab"]) == (11.0, 13.0, LAB)
    assert latest[bo]["error"].startswith("JobError: `nbgrader autograde` exited 1") and latest[bo]["score"] is None
    assert ran == ["ann", "bo"]

    # A new worker reads the file: nothing finished is graded again; a job left running is queued again.
    again = on_submit.Worker(tmp_path / "course", exchange, job=job, status=status, labs=(LAB,))
    again.run(interval=0.01, once=True)
    assert ran == ["ann", "bo"]
    with open(status, "a") as f:   # a line cut short, then a job left running by a worker that stopped
        f.write('{"inbound": "cut sh\n' + json.dumps(dict(latest[ann], state="running")) + "\n")
    third = on_submit.Worker(tmp_path / "course", exchange, job=job, status=status, labs=(LAB,))
    assert list(third.waiting) == [ann]
    third.run(interval=0.01, once=True)
    assert ran == ["ann", "bo", "ann"] and on_submit.read_status(status)[ann]["state"] == "graded"

    table = on_submit.show(status)
    assert "graded" in table and "failed" in table and "11 / 13" in table and "2 submission(s)" in table


def test_only_complete_submissions_of_plain_learners_and_known_labs_are_graded(tmp_path):
    exchange = tmp_path / "exchange"
    writing = hand_in(exchange, "ann", complete=False)
    dots = hand_in(exchange, "..")
    escape = hand_in(exchange, "eve\x1b[2J")
    unknown = hand_in(exchange, "bo", lab=OTHER_LAB)
    (exchange / COURSE_ID / "inbound" / "stray-folder").mkdir()
    (exchange / COURSE_ID / "inbound" / "stray-folder" / "timestamp.txt").write_text("x")
    jobs = ManualJobs()
    worker = on_submit.Worker(tmp_path / "course", exchange, submit=jobs, labs=(LAB,))
    worker.step()
    assert writing not in worker.records          # no timestamp.txt yet: nbgrader is still copying it
    assert states(worker) == {dots: "skipped", escape: "skipped", unknown: "skipped", "stray-folder": "skipped"}
    assert "not a plain name" in worker.records[dots]["reason"] and OTHER_LAB in worker.records[unknown]["reason"]
    assert "not an nbgrader submission name" in worker.records["stray-folder"]["reason"]
    (exchange / COURSE_ID / "inbound" / writing / "timestamp.txt").write_text("2027-01-10 10:00:00.000001 UTC")
    worker.step()
    assert states(worker)[writing] == "running" and jobs.calls[0][0][2:] == ("ann", LAB)


def test_parse_inbound_splits_from_the_right_as_nbgrader_collect_does():
    assert on_submit.parse_inbound("a+b+01_roofline+2027-01-10 10:00:00 UTC+123") == on_submit.Submission(
        "a+b+01_roofline+2027-01-10 10:00:00 UTC+123", "a+b", "01_roofline", "2027-01-10 10:00:00 UTC")
    assert on_submit.parse_inbound("ann+01_roofline+2027") == on_submit.Submission(
        "ann+01_roofline+2027", "ann", "01_roofline", "2027")
    assert on_submit.parse_inbound("ann+01_roofline") is None


@pytest.mark.parametrize("text, message", [
    ("[grade_on_submit]\nper_learner = 0", "[grade_on_submit] per_learner: expected a positive integer, got 0"),
    ("[grade_on_submit]\njobs = \"2\"", "[grade_on_submit] jobs: expected a positive integer, got '2'"),
    ("[grade_on_submit]\ncluster = \"host:8786\"", "[grade_on_submit] cluster: expected a Dask scheduler address"),
    ("[grade_on_submit]\nper_lerner = 3", "[grade_on_submit] has unknown field(s) ['per_lerner']"),
    ("grade_on_submit = 3", "[grade_on_submit] must be a table"),
])
def test_course_file_refuses_bad_grade_on_submit_settings_by_name(tmp_path, text, message):
    course = tmp_path / "course.toml"
    course.write_text(text + "\n")
    with pytest.raises(TermError) as err:
        load(course)
    assert message in str(err.value) and str(course) in str(err.value)


def test_course_file_grade_on_submit_settings_and_defaults(tmp_path):
    course = tmp_path / "course.toml"
    course.write_text('[grade_on_submit]\nper_learner = 3\njobs = 2\ncluster = "tcp://10.0.0.5:8786"\n')
    assert load(course).grade_on_submit == GradeOnSubmit(per_learner=3, jobs=2, cluster="tcp://10.0.0.5:8786")
    assert load(tmp_path / "missing.toml").grade_on_submit == GradeOnSubmit(per_learner=2, jobs=1, cluster=None)
    with pytest.raises(ValueError, match="per_learner must be a positive integer"):
        on_submit.Worker(tmp_path, tmp_path, per_learner=0, submit=ManualJobs(), labs=(LAB,))


def test_command_line_help_and_refusals_write_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        on_submit.main(["--help"])
    assert done.value.code == 0 and "--per-learner" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        on_submit.parse_args(["--per-learner", "0"])
    assert done.value.code == 2 and "--per-learner: expected a positive integer, got '0'" in capsys.readouterr().err

    root, exchange = tmp_path / "course", tmp_path / "exchange"
    (root / "solutions" / LAB).mkdir(parents=True)
    (root / "solutions" / LAB / f"{LAB}.ipynb").write_text("{}")
    (root / "autograder").mkdir()
    (root / "autograder" / "course.toml").write_text("[grade_on_submit]\nper_learner = -1\n")
    hand_in(exchange, "ann")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert on_submit.main(["--course-root", str(root), "--exchange", str(exchange), "--once"]) == 2
    assert "[grade_on_submit] per_learner: expected a positive integer, got -1" in capsys.readouterr().err
    assert on_submit.main(["--course-root", str(root), "--exchange", str(tmp_path / "none"), "--once"]) == 2
    assert f"--exchange {tmp_path / 'none'}: no such folder" in capsys.readouterr().err
    assert on_submit.main(["--course-root", str(tmp_path), "--exchange", str(exchange), "--once"]) == 2
    assert "no solutions/LAB/LAB.ipynb" in capsys.readouterr().err
    assert on_submit.main(["--course-root", str(root), "--exchange", str(exchange), "--grade-one", "../ann", LAB]) == 2
    assert "--grade-one ../ann 01_roofline: expected a plain learner id" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before   # no status file, nothing else


def job_in_a_dask_thread(course_root, exchange, learner, lab):
    """A stub job that says where it ran."""
    return {"score": 1.0, "max_score": 2.0, "where": threading.current_thread().name}


def test_jobs_run_as_tasks_on_a_dask_scheduler(tmp_path):
    distributed = pytest.importorskip("distributed")
    exchange = tmp_path / "exchange"
    ann, bo = hand_in(exchange, "ann"), hand_in(exchange, "bo")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    with cluster, distributed.Client(cluster) as client:
        worker = on_submit.Worker(tmp_path / "course", exchange, jobs=2, job=job_in_a_dask_thread, labs=(LAB,),
                                  submit=lambda function, *a: client.submit(function, *a, pure=False))
        worker.run(interval=0.05, once=True)
    assert states(worker) == {ann: "graded", bo: "graded"}
    records = worker.records.values()
    assert all("Dask-Default-Threads" in r["where"] and r["score"] == 1.0 for r in records), worker.records


def test_show_gives_the_score_after_the_late_penalty_and_a_failures_cause(tmp_path):
    """--show: the score the learner's feedback shows (after the penalty), with the raw score and the
    penalty beside it; a failed job's first line and the line of the child's output that says why."""
    status = tmp_path / "status.jsonl"
    late = {"inbound": "ann+lab+t", "learner": "ann", "lab": LAB, "timestamp": "t", "state": "graded",
            "queued": "q", "finished": "f", "score": 8.0, "raw_score": 16.0, "penalty": 8.0, "max_score": 16.0}
    failed = {"inbound": "bo+lab+t", "learner": "bo", "lab": LAB, "timestamp": "t", "state": "failed", "queued": "r",
              "error": "JobError: grading bo lab exited 1:\nTraceback (most recent call last):\n  File x\n"
                       "nbgrader.api.MissingEntry: No assignment with ID 'lab' exists\n[AutogradeApp | INFO] done"}
    status.write_text(json.dumps(late) + "\n" + json.dumps(failed) + "\n")
    table = on_submit.show(status).splitlines()
    assert "8 / 16" in table[1] and "late penalty 8 (raw 16)" in table[1]
    assert "exited 1: ... nbgrader.api.MissingEntry: No assignment with ID 'lab' exists" in table[2]
    assert on_submit.error_summary("") == "" and on_submit.error_summary("one line") == "one line"


def test_a_job_does_not_import_the_course_roots_own_packages(tmp_path):
    """A course root that holds its own course_grader (a clone of the course) must not shadow this
    venv's in the job's child, which runs in that folder: the sandboxed kernel imports the venv's,
    and a mismatch scores every learner 0 (the child runs with ``python -P``)."""
    root = tmp_path / "course"
    shadow = root / "course_grader"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "on_submit.py").write_text("import sys\nprint('SHADOW course_grader ran')\nsys.exit(3)\n")
    with pytest.raises(on_submit.JobError) as caught:
        on_submit.grade_submission(str(root), str(tmp_path / "exchange"), "ann", LAB)
    # this venv's on_submit ran, and refused: the folder is no course (no solutions/LAB)
    assert "SHADOW" not in str(caught.value) and "exited 2" in str(caught.value), caught.value
    assert "expected a plain learner id and a lab" in str(caught.value)
    from course_grader.hub import grade_on_submit_service
    assert grade_on_submit_service()["command"][1:4] == ["-P", "-m", "course_grader.on_submit"]


def test_hostile_inbound_entries_are_skipped_saying_why_and_never_stop_the_worker(tmp_path, monkeypatch):
    """Hostile review: an inbound entry is the learner's to shape. A notebook linked to solutions/ was
    collected (nbgrader copies what a link points to) and shown in the learner's feedback; a huge (sparse)
    timestamp.txt was read whole; a fifo named timestamp.txt blocked the scan; an unreadable folder raised
    PermissionError out of scan (the worker stopped for everyone); a time in the name that is not a date
    was queued though nbgrader collect refuses it."""
    import os
    exchange, inbound = tmp_path / "exchange", tmp_path / "exchange" / COURSE_ID / "inbound"
    linked = hand_in(exchange, "eve")
    notebook = inbound / linked / f"{LAB}.ipynb"
    notebook.unlink()
    notebook.symlink_to(tmp_path / "solutions.ipynb")
    huge = hand_in(exchange, "hal", complete=False)
    with open(inbound / huge / "timestamp.txt", "wb") as f:
        f.write(b"2027-01-10 10:00:00.000001 UTC\n")
        f.truncate(1 << 40)                                       # 1 TiB, sparse
    fifo = hand_in(exchange, "fay", complete=False)
    os.mkfifo(inbound / fifo / "timestamp.txt")
    locked = hand_in(exchange, "lou")
    not_a_date = hand_in(exchange, "dan", stamp="yesterday")
    fine = hand_in(exchange, "ann")
    real_walk = os.walk
    monkeypatch.setattr(on_submit.os, "walk", lambda top, **kw: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")) if Path(top).name == locked else real_walk(top, **kw))
    jobs = ManualJobs()
    worker = on_submit.Worker(tmp_path / "course", exchange, per_learner=2, jobs=5, submit=jobs, labs=(LAB,))
    worker.step()
    assert states(worker) == {linked: "skipped", huge: "running", fifo: "skipped", locked: "skipped",
                              not_a_date: "skipped", fine: "running"}
    assert "symbolic links or special files in the submission (01_roofline.ipynb)" in worker.records[linked]["reason"]
    assert "(timestamp.txt)" in worker.records[fifo]["reason"]
    assert "cannot be read: PermissionError" in worker.records[locked]["reason"]
    assert "the time in the folder name is not a date" in worker.records[not_a_date]["reason"]
    # the job checks every entry collect would copy, not only the one that queued it: a later-named
    # linked entry of the same learner and lab is refused there
    assert on_submit.collect_problem(inbound, "ann", LAB) == ""
    assert "symbolic links or special files" in on_submit.collect_problem(inbound, "eve", LAB)
    assert "not a date" in on_submit.collect_problem(inbound, "dan", LAB)
    (inbound / f"ann+{LAB}+2027-01-11 10:00:00.000001 UTC+1").write_text("")   # a file collect would copy
    assert "not a folder (a file or a link)" in on_submit.collect_problem(inbound, "ann", LAB)


def test_with_a_roster_made_up_learner_ids_are_skipped(tmp_path, capsys):
    """Hostile review: the per-learner limit counted the id in the folder name, so one learner posting as
    fake1, fake2, ... queued a job for each (and nbgrader autograde added each to the gradebook). With a
    roster in the course file, an id not in it is skipped; a roster that cannot be read stops the worker."""
    exchange = tmp_path / "exchange"
    ann, fakes = hand_in(exchange, "ann"), [hand_in(exchange, f"fake{i}") for i in range(5)]
    worker = on_submit.Worker(tmp_path / "course", exchange, jobs=9, submit=ManualJobs(), labs=(LAB,),
                              learners={"ann", "bo"})
    worker.step()
    assert states(worker) == {ann: "running", **{f: "skipped" for f in fakes}}
    assert worker.records[fakes[0]]["reason"] == "the learner id is not in the course file's roster"
    root = tmp_path / "root"
    (root / "solutions" / LAB).mkdir(parents=True)
    (root / "solutions" / LAB / f"{LAB}.ipynb").write_text("{}")
    (root / "autograder").mkdir()
    (root / "autograder" / "course.toml").write_text('roster = "missing.csv"\n')
    assert on_submit.main(["--course-root", str(root), "--exchange", str(exchange), "--once"]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
    assert not (root / "autograder" / "work").exists()
