"""End-to-end tests of the grading pipeline (autograder/) on a tiny throwaway lab.

The lab `01_tiny` is built in a temporary course root: one solution cell `add(a, b)` and
two graded test cells (1 and 2 points), the second with hidden tests. Its release comes
from stock `nbgrader generate_assignment` with the course's nbgrader_config.py; the
submissions are edits of that release. The grading driver then runs twice on the same
submissions (`--jobs 1`, each nbgrader command forked from the warm process, and `--jobs 2
--cold-start`, each a new Python process) and every test reads those two runs.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_grader.preprocessors import SKIP_TAG, SKIPPED_NOTE

# Runs notebooks through nbgrader (about 100 s on 2 cores). The module-scoped fixture
# below grades once per process: under pytest-xdist use `--dist loadgroup` (or
# loadscope/loadfile) so one worker runs all of these tests instead of each grading.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grading_pipeline")]

REPO = Path(__file__).resolve().parents[1]
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")
DRIVER = [sys.executable, "-m", "course_grader.grade"]
CONFIG = REPO / "autograder" / "nbgrader_config.py"
LAB = "01_tiny"
COMMA_LEARNER = "smith, john"
CELL_TIMEOUT = 5  # seconds; frank's hidden test sleeps past it
RUN_SEED = 7  # --seed of both runs: the per-submission hidden-test seeds are then the same

SOLUTION = "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"
VISIBLE_TEST = "assert add(1, 2) == 3"
HIDDEN_TEST = "assert add(0, 0) == 0\n### BEGIN HIDDEN TESTS\nassert add(-1, 5) == 4\n### END HIDDEN TESTS"

# learner -> body of the solution cell (None: the release left as it is)
ANSWERS = {
    "alice": "def add(a, b):\n    return a + b",
    "bob": None,
    "carol": "def add(a, b):\n    return a + b if a >= 0 else 0",  # fails the hidden test only
    "dave": ("import sys, warnings\n"
             "def add(a, b):\n"
             "    print('debug: adding', file=sys.stderr)\n"
             "    warnings.warn('this add is old')\n"
             "    return a + b"),
    COMMA_LEARNER: "def add(a, b):\n    return a + b",
    "frank": ("import time\n"
              "def add(a, b):\n"
              "    if a < 0:\n"
              "        time.sleep(3600)  # hangs in the hidden test only\n"
              "    return a + b"),
    "gina": "import os\ndef add(a, b):\n    os._exit(1)  # kills the kernel",
    "hank": "import os\ndef add(a, b):\n    if a < 0:\n        os._exit(1)  # dies in the hidden test only\n    return a + b",
    "ivy": "def add(a, b):\n    return a + b + OFFSET - OFFSET   # OFFSET: defined by the demonstration only",
    "jack": "def add(a, b):\n    return a + b",     # and edits the demonstration (EDITED_DEMONSTRATION)
}
EXPECTED_TOTALS = {"alice": 3, "bob": 0, "carol": 1, "dave": 3, "eve": 0, COMMA_LEARNER: 3, "frank": 1, "gina": 0,
                   "hank": 1, "ivy": 0, "jack": 3}
# A demonstration cell (skipped by the grader: course_grader.preprocessors.SkipDemonstrations)
DEMONSTRATION = "OFFSET = 100\nprint('the demonstration ran:', add(OFFSET, 1))"
# The course file both runs use: a deadline, alice's 48 h extension, 10 % a started day late.
# timestamp.txt: alice 36 h late (inside her extension), jack 1 h late (one day: 10 % of 3 points),
# dave none (flagged), everyone else an hour early.
COURSE_FILE = f'''roster = "roster.csv"
[deadlines]
"{LAB}" = 2020-01-01T00:00:00Z
[extensions]
alice = {{ "{LAB}" = 48 }}
[late_policy]
method = "percent_per_day"
percent_per_day = 10
'''
TIMESTAMPS = {"alice": "2020-01-02 12:00:00 UTC", "jack": "2020-01-01 01:00:00 UTC"}
ON_TIME = "2019-12-31 23:00:00 UTC"
PENALTIES = {"jack": 0.3}
FINAL_TOTALS = {k: v - PENALTIES.get(k, 0) for k, v in EXPECTED_TOTALS.items()}
EDITED_DEMONSTRATION = "print('the edited demonstration ran:', add(1, 1))"   # jack's: a cell of his own, run


def load_driver():
    from course_grader import grade

    return grade


def nbgrader_meta(grade=False, solution=False, locked=False, grade_id="", points=None):
    meta = {"grade": grade, "solution": solution, "locked": locked, "task": False,
            "schema_version": 3, "grade_id": grade_id}
    if grade:
        meta["points"] = points
    return {"nbgrader": meta, "tags": ["exercise" if solution else "check"]}


def write_source(root: Path) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_markdown_cell("# A tiny lab\nWrite `add(a, b)`."),
        new_code_cell(SOLUTION, metadata=nbgrader_meta(solution=True, grade_id="add")),
        new_code_cell(VISIBLE_TEST, metadata=nbgrader_meta(grade=True, locked=True, grade_id="test_visible", points=1)),
        new_code_cell(HIDDEN_TEST, metadata=nbgrader_meta(grade=True, locked=True, grade_id="test_hidden", points=2)),
        new_code_cell(DEMONSTRATION, metadata={"tags": ["demonstration"]}),
    ]
    path = root / "solutions" / LAB / f"{LAB}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path


def env_with_venv_path() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # nbgrader runs alembic
    return env


def stock_release(root: Path) -> Path:
    """Stock `nbgrader generate_assignment` with the course config, paths overridden to ROOT."""
    cmd = [sys.executable, "-m", "nbgrader", "generate_assignment", LAB,
           f"--NbGrader.config_file={CONFIG.with_suffix('')}",
           f"--CourseDirectory.root={root}", "--CourseDirectory.release_directory=release",
           f"--CourseDirectory.db_url=sqlite:///{root / 'stock_gradebook.db'}"]
    done = subprocess.run(cmd, cwd=root, env=env_with_venv_path(), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "release" / LAB / f"{LAB}.ipynb"


def write_submissions(release: Path, folder: Path) -> None:
    for learner, body in ANSWERS.items():
        nb = nbformat.read(release, as_version=4)
        if body is not None:
            (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "add"]
            cell.source = body
        if learner == "jack":
            (demo,) = [c for c in nb.cells if c.source == DEMONSTRATION]
            demo.source = EDITED_DEMONSTRATION
        path = folder / learner / LAB / f"{LAB}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
        if learner != "dave":
            (path.parent / "timestamp.txt").write_text(TIMESTAMPS.get(learner, ON_TIME))
    corrupt = folder / "eve" / LAB / f"{LAB}.ipynb"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_text('{"cells": [')


def write_expected(path: Path, totals: dict[str, float], cells: list[tuple[str, str, float]]) -> None:
    rows = [{"learner": k, "lab": LAB, "cell": "total", "score": v} for k, v in totals.items()]
    rows += [{"learner": k, "lab": LAB, "cell": cell, "score": v} for k, cell, v in cells]
    pd.DataFrame(rows).to_csv(path, index=False)


def snapshot(*folders: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def run_driver(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*DRIVER, *map(str, args)], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Build the tiny course, then grade it serially (expecting a match) and with 2 jobs, each
    nbgrader command a new process (against an expected file with one wrong row, expecting exit 1)."""
    root = tmp_path_factory.mktemp("course")
    write_source(root)
    release = stock_release(root)
    submissions = root / "submitted_batch"
    write_submissions(release, submissions)
    before = snapshot(submissions, root / "solutions", root / "release")
    cell_rows = [("carol", "test_visible", 1), ("carol", "test_hidden", 0),
                 ("frank", "test_visible", 1), ("frank", "test_hidden", 0), ("dave", "test_hidden", 2)]
    good, bad = root / "expected.csv", root / "expected_wrong.csv"
    write_expected(good, FINAL_TOTALS, cell_rows)
    write_expected(bad, {**FINAL_TOTALS, "carol": 3}, cell_rows)
    # both runs read a course file (COURSE_FILE) with a roster of every learner but hank
    roster = [f'"{k}",{100 + i},Name {i}' for i, k in enumerate(EXPECTED_TOTALS) if k != "hank"]
    (root / "roster.csv").write_text("learner,canvas_id,name\n" + "\n".join(roster) + "\n")
    (root / "course.toml").write_text(COURSE_FILE)
    common = ["--root", root, "--per-test", "--cell-timeout", CELL_TIMEOUT, "--seed", RUN_SEED,
              "--course", root / "course.toml"]
    serial = run_driver(submissions, "--work", root / "work1", "--expected", good, *common)
    parallel = run_driver(submissions, "--work", root / "work2", "--expected", bad, "--jobs", 2, "--cold-start",
                          *common)
    return {"root": root, "release": release, "submissions": submissions, "before": before,
            "serial": serial, "parallel": parallel, "work1": root / "work1", "work2": root / "work2"}


def read_grades(work: Path, name: str = "grades.csv") -> pd.DataFrame:
    return pd.read_csv(work / name, dtype={"learner": str, "lab": str, "cell": str, "error": str},
                       keep_default_na=False)


def test_release_hides_solutions_and_hidden_tests(pipeline):
    text = pipeline["release"].read_text()
    for hidden in ("return a + b", "BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS",
                   "add(-1, 5)", "END HIDDEN TESTS"):
        assert hidden not in text
    assert "raise NotImplementedError()" in text and VISIBLE_TEST in text


def test_serial_run_matches_expected_scores(pipeline):
    done = pipeline["serial"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All scores match" in done.stdout
    grades = read_grades(pipeline["work1"]).set_index("learner")
    assert grades["score"].to_dict() == pytest.approx({k: float(v) for k, v in FINAL_TOTALS.items()})
    assert set(grades["max_score"]) == {3.0}
    ok = [k for k in EXPECTED_TOTALS if k not in ("eve", "gina", "hank")]
    assert (grades.loc[ok, "error"] == "").all()


def test_a_course_roster_gives_the_lms_gradebooks(pipeline):
    """With a roster in the course file the run writes the plain and the Canvas gradebooks
    (course_grader.lms); a graded learner missing from the roster keeps an error row."""
    book = read_grades(pipeline["work1"], "gradebook.csv").set_index("learner")
    assert book["score"].to_dict() == pytest.approx({k: float(v) for k, v in FINAL_TOTALS.items()})
    assert book.loc["hank", "error"].startswith("not in the roster")
    assert not book.drop(index="hank")["error"].str.startswith("not in the roster").any()
    canvas = pd.read_csv(pipeline["work1"] / "canvas_gradebook.csv", dtype=str, keep_default_na=False)
    assert list(canvas.columns) == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", LAB]
    assert canvas.iloc[0]["Student"] == "Points Possible" and canvas.iloc[0][LAB] == "3"
    ids = {k: str(100 + i) for i, k in enumerate(EXPECTED_TOTALS)}
    got = dict(zip(canvas["ID"][1:], canvas[LAB][1:]))
    assert got == {ids[k]: f"{v:g}" for k, v in FINAL_TOTALS.items() if k != "hank"}
    assert "graded row(s) not in it: hank" in pipeline["serial"].stdout.replace("1 graded", "graded")


def test_deadlines_extensions_and_the_late_policy(pipeline):
    """The course file's deadline, alice's extension and 10 % a started day, applied by nbgrader's
    late-submission plugin in each shard (course_grader.late): grades.csv shows the raw score, the
    penalty, the seconds late and the timestamp used; a submission without one is flagged; the merged
    gradebook and nbgrader's own export agree."""
    grades = read_grades(pipeline["work1"]).set_index("learner")
    assert grades.loc["jack", ["raw_score", "penalty", "late"]].tolist() == pytest.approx([3.0, 0.3, 3600])
    assert grades.loc["jack", "timestamp"] == "2020-01-01T01:00:00+00:00"
    assert grades.loc["jack", "deadline"] == "2020-01-01T00:00:00+00:00"
    assert grades.loc["alice", ["score", "penalty", "late"]].tolist() == [3.0, 0.0, 0]   # inside her extension
    assert grades.loc["alice", "deadline"] == "2020-01-03T00:00:00+00:00"
    assert grades.loc["dave", "timestamp"] == "" and "no timestamp.txt" in grades.loc["dave", "flags"]
    assert "timestamp" not in grades.loc["carol", "flags"]
    export = pd.read_csv(pipeline["work1"] / "course" / "nbgrader_export.csv", dtype={"student_id": str},
                         keep_default_na=False, on_bad_lines="skip").set_index("student_id")   # unquoted: 'smith, john'

    assert export.loc["jack", ["raw_score", "late_submission_penalty", "score"]].astype(float).tolist() == \
        pytest.approx([3.0, 0.3, 2.7])
    assert float(export.loc["alice", "late_submission_penalty"] or 0) == 0.0


def test_stock_autograde_applies_the_course_file(tmp_path):
    """Stock `nbgrader autograde` with the course config (as `cd autograder; nbgrader autograde`)
    charges the same penalty: ApplyDeadlines and CourseLatePolicy are in the course's pipeline."""
    from course_grader.grade import nbgrader_env, write_course_config

    course = tmp_path / "course"
    source = write_source(tmp_path)
    (course / "source").mkdir(parents=True)
    shutil.copytree(source.parent, course / "source" / LAB)
    write_course_config(course, 60)
    (tmp_path / "roster.csv").write_text("learner,canvas_id\njack,1\nalice,2\n")
    (tmp_path / "course.toml").write_text(COURSE_FILE)
    env = nbgrader_env(1)
    files = [f"--ApplyDeadlines.course_file={tmp_path / 'course.toml'}",
             f"--CourseLatePolicy.course_file={tmp_path / 'course.toml'}"]

    def nbgrader(*args):
        done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr

    nbgrader("generate_assignment", LAB, "--force")
    for learner in ("jack", "alice"):
        nbgrader("db", "student", "add", learner)
        sub = course / "submitted" / learner / LAB
        shutil.copytree(course / "source" / LAB, sub)     # the solution: 3 points before any penalty
        (sub / "timestamp.txt").write_text(TIMESTAMPS[learner])
        nbgrader("autograde", LAB, "--student", learner, *files)
    nbgrader("export")
    export = pd.read_csv(course / "nbgrader_export.csv", dtype={"student_id": str}).set_index("student_id")
    assert export.loc["jack", ["raw_score", "late_submission_penalty", "score"]].tolist() == pytest.approx([3, 0.3, 2.7])
    assert export.loc["alice", ["raw_score", "late_submission_penalty", "score"]].tolist() == pytest.approx([3, 0, 3])


def test_a_bad_course_file_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "course.toml").write_text('roster = "missing.csv"\n')
    (tmp_path / "batch").mkdir()
    write_source(tmp_path)
    done = run_driver(tmp_path / "batch", "--root", tmp_path, "--work", tmp_path / "w", "--course",
                      tmp_path / "course.toml")
    assert done.returncode == 2 and "missing.csv: no such file" in done.stderr, done.stderr
    assert not (tmp_path / "w").exists()


def test_each_graded_submission_gets_a_report_and_the_run_a_similarity_csv(pipeline):
    """report.json beside each feedback page (what a regrade is checked against) and similarity.csv
    (every pair of graded learners; the tiny lab's one-line answers hold no fingerprint, copydetect's
    25-character noise threshold, so none is flagged)."""
    from course_grader import similarity

    work, feedback = pipeline["work1"], pipeline["work1"] / "course" / "feedback"
    grades = read_grades(work).set_index("learner")
    pairs = pd.read_csv(work / "similarity.csv", dtype=str, keep_default_na=False)
    graded = [k for k in EXPECTED_TOTALS if k != "eve"]           # eve's notebook is not JSON: never graded
    assert list(pairs.columns) == similarity.COLUMNS and len(pairs) == len(graded) * (len(graded) - 1) // 2
    assert "eve" not in set(pairs["learner_a"]) | set(pairs["learner_b"])
    assert "0 similar pair(s) of learners" in pipeline["serial"].stdout

    report = json.loads((feedback / "carol" / LAB / "report.json").read_text())
    seed = int(grades.loc["carol", "seed"])
    assert report["schema_version"] == 1 and (report["learner"], report["lab"]) == ("carol", LAB)
    assert [(t["name"], t["points"], t["score"], t["outcome"], t["seed"]) for t in report["tests"]] == [
        ("test_visible", 1.0, 1.0, "passed", seed), ("test_hidden", 2.0, 0.0, "AssertionError", seed)]
    assert report["tests"][0]["diagnosis"] == "" and report["tests"][1]["diagnosis"].startswith("AssertionError")
    notebook = pipeline["submissions"] / "carol" / LAB / f"{LAB}.ipynb"
    assert report["notebook_sha256"] == hashlib.sha256(notebook.read_bytes()).hexdigest()
    assert (report["score"], report["run_seed"], report["seed"]) == (1.0, RUN_SEED, seed)
    assert report["sandbox"] == grades.loc["carol", "sandbox"] and report["course"]["commit"] == "unknown"
    assert report["versions"]["nbgrader"] == "0.9.6" and report["flags"]["similarity"] == []
    jack = json.loads((feedback / "jack" / LAB / "report.json").read_text())
    assert jack["flags"]["late"] is True and jack["penalty"] == pytest.approx(0.3) and jack["late_seconds"] == 3600
    dave = json.loads((feedback / "dave" / LAB / "report.json").read_text())
    assert any("no timestamp.txt" in note for note in dave["flags"]["notes"])
    assert not (feedback / "eve").exists()


def test_regrade_replaces_one_learners_rows_and_leaves_the_others_as_they_were(pipeline, tmp_path):
    """--regrade --learner carol into a copy of the serial run: the previous run's seed, so the same
    scores and the same report.json; no other learner's table line, gradebook row, feedback page or
    report changes. Refused, with nothing written, without a previous run or from another root."""
    driver = load_driver()
    root, work = pipeline["root"], tmp_path / "work"
    shutil.copytree(pipeline["work1"], work, symlinks=True)
    before = snapshot(work)
    gradebook = work / "course" / "gradebook.db"
    others = driver.gradebook_rows(gradebook, "carol")
    common = ["--root", root, "--cell-timeout", CELL_TIMEOUT, "--course", root / "course.toml"]   # no --seed
    done = run_driver(pipeline["submissions"], "--work", work, "--regrade", "--learner", "carol", "--labs", LAB,
                      *common)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Regrading 1 submission(s)" in done.stdout and f"run seed {RUN_SEED} " in done.stdout
    assert [p.name for p in (work / "regrade" / "shards").iterdir()] == ["0000"]     # carol's alone
    after = snapshot(work)
    changed = {str(p.relative_to(work)) for p in set(before) | set(after) if before.get(p) != after.get(p)}
    changed = {c for c in changed if not c.startswith(("regrade/", "logs/"))}
    assert changed <= {"course/gradebook.db", "timings.csv", f"course/autograded/carol/{LAB}/{LAB}.ipynb",
                       f"course/feedback/carol/{LAB}/{LAB}.html", f"course/feedback/carol/{LAB}/report.json",
                       "course/nbgrader_export.csv"}, changed        # grades.csv: the same seed, the same row
    assert "timings.csv" in changed                                    # carol's line was written anew...
    old = (pipeline["work1"] / "timings.csv").read_text().splitlines()
    new = (work / "timings.csv").read_text().splitlines()
    assert [line for line in new if not line.startswith("carol,")] == \
        [line for line in old if not line.startswith("carol,")]       # ...and only hers
    assert driver.gradebook_rows(gradebook, "carol") == others
    report = work / "course" / "feedback" / "carol" / LAB / "report.json"
    assert json.loads(report.read_text()) == json.loads((pipeline["work1"] / report.relative_to(work)).read_text())

    shutil.copytree(root / "solutions", tmp_path / "other" / "solutions")
    for extra, message in ((["--work", tmp_path / "empty"], "--regrade: no previous grading run"),
                           (["--work", work, "--root", tmp_path / "other"], "--regrade: the run in")):
        kept = snapshot(work)
        args = driver.parse_args([str(a) for a in (pipeline["submissions"], "--regrade", "--learner", "carol",
                                                   *common, *extra)])
        with pytest.raises(driver.InfrastructureError, match=message):
            driver.run(args)               # in this process: main() would take over its signals
        assert snapshot(work) == kept and not (tmp_path / "empty").exists()
    with pytest.raises(SystemExit):
        driver.parse_args([str(pipeline["submissions"]), "--work", str(work), "--regrade"])   # whose rows?


def test_replace_csv_rows_keeps_every_other_line_byte_for_byte(tmp_path):
    driver = load_driver()
    table = tmp_path / "grades.csv"
    table.write_text('learner,lab,score\nann,01_a,1.0\n"smith, john",01_a,2.50\ncy,01_a,3\n')
    driver.replace_csv_rows(table, "learner,lab,score\nann,01_a,0.5\ndan,01_a,4.0\n", ("learner", "lab"),
                            {("ann", "01_a"), ("dan", "01_a")})
    assert table.read_text() == 'learner,lab,score\nann,01_a,0.5\n"smith, john",01_a,2.50\ncy,01_a,3\ndan,01_a,4.0\n'
    with pytest.raises(driver.InfrastructureError, match="--regrade: .* has the columns"):
        driver.replace_csv_rows(table, "learner,lab,total\nann,01_a,1\n", ("learner", "lab"), {("ann", "01_a")})


def test_bad_submissions_become_row_errors(pipeline):
    grades = read_grades(pipeline["work1"]).set_index("learner")
    assert "not valid JSON" in grades.loc["eve", "error"]
    # os._exit in the first test cell: graded, that cell and every later one 0, the death reported
    assert "kernel died in cell" in grades.loc["gina", "error"] and "test_visible" in grades.loc["gina", "error"]
    # dying in the hidden test keeps the visible test's point
    assert "kernel died in cell" in grades.loc["hank", "error"] and "test_hidden" in grades.loc["hank", "error"]


def test_cell_timeout_fails_only_that_cell(pipeline):
    cells = read_grades(pipeline["work1"], "grades_per_test.csv")
    frank = cells[cells.learner == "frank"].set_index("cell")["score"].to_dict()
    assert frank == {"test_visible": 1.0, "test_hidden": 0.0}
    # the per-test table says why a cell lost its points, without opening the feedback
    outcome = cells[cells.learner == "frank"].set_index("cell")["outcome"].to_dict()
    assert outcome["test_visible"] == "passed" and outcome["test_hidden"].startswith("CellTimeoutError: "), outcome
    gina = cells[cells.learner == "gina"].set_index("cell")["outcome"].to_dict()
    assert all(text.startswith("KernelDied: ") for text in gina.values()), gina
    autograded = pipeline["work1"] / "course" / "autograded" / "frank" / LAB / f"{LAB}.ipynb"
    assert "CellTimeoutError" in autograded.read_text()


def test_stderr_does_not_zero_a_correct_answer(pipeline):
    grades = read_grades(pipeline["work1"]).set_index("learner")
    assert grades.loc["dave", "score"] == 3.0
    nb = json.loads((pipeline["work1"] / "course" / "autograded" / "dave" / LAB / f"{LAB}.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not any(o.get("name") == "stderr" for o in outputs)
    assert any("[stderr]" in "".join(o.get("text", "")) and "debug: adding" in "".join(o.get("text", ""))
               for o in outputs)


def test_parallel_cold_run_gives_the_same_scores(pipeline):
    for name in ("grades.csv", "grades_per_test.csv"):
        serial, parallel = read_grades(pipeline["work1"], name), read_grades(pipeline["work2"], name)
        pd.testing.assert_frame_equal(serial, parallel)


def test_learner_code_ran_in_the_sandbox(pipeline):
    grades = read_grades(pipeline["work1"])
    assert set(grades.sandbox) == {"bubblewrap"}
    assert "sandboxed with bubblewrap" in pipeline["serial"].stdout


def test_grading_refuses_without_a_sandbox_unless_told(tmp_path):
    """Without bwrap (COURSE_SANDBOX_BWRAP names a missing binary) the driver exits 2 before
    running any learner code, and names the flag that would override it."""
    write_source(tmp_path)
    batch = tmp_path / "batch" / "alice" / LAB
    batch.mkdir(parents=True)
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), batch / f"{LAB}.ipynb")
    bare = {**os.environ, "COURSE_SANDBOX_BWRAP": str(tmp_path / "no-bwrap-here")}
    refused = run_driver(tmp_path / "batch", "--root", tmp_path, "--work", tmp_path / "w1", env=bare)
    assert refused.returncode == 2 and "refusing to grade" in refused.stderr
    assert "--unsafe-no-sandbox" in refused.stderr
    assert not (tmp_path / "w1" / "course").exists()
    unsafe = run_driver(tmp_path / "batch", "--root", tmp_path, "--work", tmp_path / "w2", "--unsafe-no-sandbox",
                        env=bare)
    assert unsafe.returncode == 0, unsafe.stdout + unsafe.stderr
    assert unsafe.stdout.count("UNSAFE") >= 2  # at the start and at the end of the run
    assert set(read_grades(tmp_path / "w2").sandbox) == {"NONE (unsafe: --unsafe-no-sandbox)"}


def test_each_graded_submission_records_its_replayable_seed(pipeline):
    driver = load_driver()
    grades = read_grades(pipeline["work1"])
    graded = grades[grades.seed.fillna("").astype(str) != ""]
    assert not graded.empty
    for row in graded.itertuples():
        assert int(row.seed) == driver.submission_seed(RUN_SEED, row.learner, row.lab)
    assert len(set(graded.seed)) == len(graded)  # every submission its own inputs
    assert driver.submission_seed(RUN_SEED, "alice", LAB) != driver.submission_seed(RUN_SEED + 1, "alice", LAB)


def test_expected_mismatch_exits_1_and_prints_the_row(pipeline):
    done = pipeline["parallel"]
    assert done.returncode == 1, done.stdout + done.stderr
    tail = done.stdout.split("Scores differ from", 1)[1]
    assert "carol" in tail and "alice" not in tail


def test_learner_id_with_comma_round_trips(pipeline):
    raw = (pipeline["work1"] / "grades.csv").read_text()
    assert f'"{COMMA_LEARNER}"' in raw  # quoted by pandas
    grades = read_grades(pipeline["work1"])
    assert grades[grades.learner == COMMA_LEARNER]["score"].tolist() == [3.0]


def test_feedback_and_inputs(pipeline):
    feedback = pipeline["work1"] / "course" / "feedback"
    assert str(feedback) in pipeline["serial"].stdout
    for learner in ("alice", "bob", "carol", "dave", COMMA_LEARNER, "frank"):
        assert (feedback / learner / LAB / f"{LAB}.html").is_file()
    # the learner sees their code and the visible test, not the hidden one (its result stays)
    text = html.unescape(re.sub(r"<[^>]+>", "", (feedback / "carol" / LAB / f"{LAB}.html").read_text()))
    assert "a + b if a >= 0 else 0" in text and "assert add(0, 0) == 0" in text
    assert "add(-1, 5)" not in text and "HIDDEN TESTS" not in text
    assert "AssertionError" in text
    root = pipeline["root"]
    # the driver never writes into the submissions, the source or the committed release
    assert snapshot(pipeline["submissions"], root / "solutions", root / "release") == pipeline["before"]


def _outputs_text(cell) -> str:
    return "".join(o.get("text", "") + o.get("evalue", "") for o in cell.outputs)


def test_demonstrations_are_not_run_and_a_solution_that_needs_one_is_told(pipeline):
    """The source's demonstration cell is not run (alice's autograded copy shows the grader's note
    in its place); one the learner edited runs as their own cell (jack's); and ivy's add, which reads
    a name only the demonstration binds, fails with an error that names it and that cell, in the
    notebook and in the feedback."""
    course = pipeline["work1"] / "course"

    def autograded(learner):
        return nbformat.read(course / "autograded" / learner / LAB / f"{LAB}.ipynb", as_version=4)

    (demo,) = [c for c in autograded("alice").cells if c.source == DEMONSTRATION]
    assert _outputs_text(demo) == SKIPPED_NOTE
    (edited,) = [c for c in autograded("jack").cells if c.source == EDITED_DEMONSTRATION]
    assert "the edited demonstration ran: 2" in _outputs_text(edited)
    named = "`OFFSET` is defined by a demonstration cell, at its line `OFFSET = 100`, which grading does not run"
    tests = [c for c in autograded("ivy").cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(tests) == 2 and all(named in _outputs_text(c) for c in tests)
    page = html.unescape(re.sub(r"<[^>]+>", "", (course / "feedback" / "ivy" / LAB / f"{LAB}.html").read_text()))
    assert named in page and "must not depend on demonstration cells" in page


# ---- fast checks, no notebook execution ----------------------------------------------


def test_hidden_lines_are_redacted_from_tracebacks():
    from course_grader import preprocessors as module
    frame = ("\x1b[0;32m      1\x1b[0m assert add(0, 0) == 0\n"
             "\x1b[0;32m      2\x1b[0m ### BEGIN HIDDEN TESTS\n"
             "\x1b[0;32m----> 3\x1b[0m assert add(-1, 5) == 4\n"
             "      4 ### END HIDDEN TESTS\n      5 print('done')")
    out = module.redact_hidden_lines(frame)
    assert "add(-1, 5)" not in out and "HIDDEN" not in out
    assert "add(0, 0)" in out and "print('done')" in out and module.REDACTED in out
    assert "secret" not in module.redact_hidden_lines("### BEGIN HIDDEN TESTS\nsecret")  # unterminated


def test_a_failing_hidden_check_loses_its_drawn_inputs_in_feedback():
    """The message of an error raised by a hidden line is cut down to the contract and the size of
    the error; an error raised by a visible line keeps its message."""
    from course_grader import preprocessors as module
    message = ("prefill_time(case 0: L 2, d 768, 6 query / 2 KV heads of 128; 230 tokens, mfu 0.75): expected "
               "1.70376e-05, got 1 (must agree to 4 significant figures, relative error <= 0.0005)")

    def failing(arrow_line: int):
        lines = ["lab01.check_prefill_time(prefill_time, seed=0)", "### BEGIN HIDDEN TESTS",
                 "lab01.check_prefill_time(prefill_time, seed=fresh_seed(), cases=12)", "### END HIDDEN TESTS"]
        frame = "\n".join(f"\x1b[0;32m{'---->' if i == arrow_line else '     '} {i}\x1b[0m {text}"
                          for i, text in enumerate(lines, 1))
        cell = new_code_cell("\n".join(lines), metadata=nbgrader_meta(grade=True, locked=True, grade_id="t", points=2))
        cell.outputs = [nbformat.v4.new_output("error", ename="ContractError", evalue=message,
                                               traceback=["Traceback", frame, f"\x1b[31mContractError\x1b[39m: {message}"])]
        cell, _ = module.RedactHiddenTracebacks().preprocess_cell(cell, {}, 0)
        return cell.outputs[0]

    hidden = failing(3)
    shown = hidden["evalue"] + "\n".join(hidden["traceback"])
    assert "768" not in shown and "1.70376e-05" not in shown and "230 tokens" not in shown
    assert "prefill_time (case 0)" in hidden["evalue"] and "4 significant figures" in hidden["evalue"]
    assert "fresh_seed" not in shown and hidden["traceback"][-1].startswith("ContractError: prefill_time (case 0)")
    visible = failing(1)
    assert visible["evalue"] == message and message in visible["traceback"][-1]


def test_stderr_preprocessor_changes_the_stock_grade():
    from nbgrader.utils import determine_grade

    from course_grader import preprocessors as module
    cell = new_code_cell(VISIBLE_TEST, metadata=nbgrader_meta(grade=True, locked=True, grade_id="t", points=2))
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="UserWarning: old\n")]
    assert determine_grade(cell)[0] == 0  # stock nbgrader: stderr zeroes the cell
    cell, _ = module.StderrToStdout().preprocess_cell(cell, {}, 0)
    assert determine_grade(cell)[0] == 2
    assert cell.outputs[0]["name"] == "stdout" and cell.outputs[0]["text"] == "[stderr]\nUserWarning: old\n"
    cell.outputs.append(nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[]))
    assert determine_grade(cell)[0] == 0  # an exception still fails it


def test_course_config_points_at_the_repository(tmp_path, monkeypatch):
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.chdir(tmp_path)  # the root must not depend on the working directory
    config = PyFileConfigLoader(CONFIG.name, str(CONFIG.parent)).load_config()
    course = config.CourseDirectory
    assert course.root == str(REPO)
    assert (course.source_directory, course.release_directory) == ("solutions", "labs")
    assert course.db_url == f"sqlite:///{REPO / 'autograder' / 'work' / 'gradebook.db'}"
    assert config.Execute.timeout == 300 and config.Execute.interrupt_on_timeout is True
    names = [cls.__name__ for cls in config.Autograde.autograde_preprocessors]
    assert names.index("IgnorePattern") < names.index("StderrToStdout") < names.index("SaveAutoGrades")


def test_notebook_validation(tmp_path):
    driver = load_driver()
    folder = tmp_path / "lab"
    folder.mkdir()
    assert "missing 01_tiny.ipynb; no notebook" in driver.notebook_problem(folder, LAB)
    (folder / "other.ipynb").write_text("{}")
    # one notebook under another name is the one graded (and flagged); its own problems are reported
    assert driver.submitted_notebook(folder, LAB) == (folder / "other.ipynb", "")
    assert "other.ipynb has nbformat None" in driver.notebook_problem(folder, LAB)
    (folder / "draft.ipynb").write_text("{}")
    assert "found draft.ipynb, other.ipynb" in driver.notebook_problem(folder, LAB)
    path = folder / f"{LAB}.ipynb"
    path.write_text(json.dumps({"nbformat": 3, "cells": []}))
    assert "nbformat 3" in driver.notebook_problem(folder, LAB)
    path.write_bytes(b"\xff\xfe")
    assert "not UTF-8" in driver.notebook_problem(folder, LAB)
    path.write_text("[" * 100_000)   # json.loads raised RecursionError, which stopped the whole batch
    assert "nested too deep" in driver.notebook_problem(folder, LAB)
    nbformat.write(new_notebook(), path)
    assert driver.notebook_problem(folder, LAB) == ""
    assert "glob" in driver.learner_id_problem("a*b")
    assert driver.learner_id_problem(COMMA_LEARNER) == ""


def test_infrastructure_failures_exit_2(tmp_path):
    write_source(tmp_path)
    missing = run_driver(tmp_path / "nowhere", "--root", tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    batch = tmp_path / "batch" / "alice" / LAB
    batch.mkdir(parents=True)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not yours")
    refused = run_driver(tmp_path / "batch", "--root", tmp_path, "--work", foreign)
    assert refused.returncode == 2 and "not made by this driver" in refused.stderr
    assert (foreign / "keep.txt").exists()


def test_expected_file_needs_totals_only_for_submitted_pairs(tmp_path):
    driver = load_driver()
    totals = pd.DataFrame([
        {"learner": "ann", "lab": "01_a", "score": 3.0, "max_score": 3.0, "error": ""},
        {"learner": "ann", "lab": "02_b", "score": 0.0, "max_score": 5.0, "error": driver.NOT_SUBMITTED},
        {"learner": "ben", "lab": "01_a", "score": 1.0, "max_score": 3.0, "error": ""},
    ])
    cells = pd.DataFrame(columns=["learner", "lab", "cell", "score"])
    expected = tmp_path / "expected.csv"
    expected.write_text("learner,lab,cell,score\nann,01_a,total,3\n")
    diff = driver.compare_expected(expected, totals, cells)
    # ben was graded without an expectation: reported; ann's missing 02_b is not
    assert list(zip(diff["learner"], diff["lab"], diff["note"])) == [("ben", "01_a", "no expected total")]
    expected.write_text("learner,lab,cell,score\nann,01_a,total,3\nann,02_b,total,5\nben,01_a,total,1\n")
    diff = driver.compare_expected(expected, totals, cells)
    # a named sample that vanished fails on its total
    assert list(zip(diff["learner"], diff["lab"], diff["expected"], diff["actual"])) == [("ann", "02_b", 5.0, 0.0)]


def test_learners_option_grades_only_those_folders_and_checks_only_their_rows(tmp_path):
    driver = load_driver()
    for learner in ("ann", "ben", "cy"):
        (tmp_path / "batch" / learner / "01_a").mkdir(parents=True)
    rows = driver.find_submissions(tmp_path / "batch", {"01_a"}, ["cy", "ann"])
    assert [r.learner for r in rows] == ["ann", "cy"]
    with pytest.raises(driver.InfrastructureError, match="names no folder in .*: dan"):
        driver.find_submissions(tmp_path / "batch", {"01_a"}, ["ann", "dan"])
    totals = pd.DataFrame([{"learner": "ann", "lab": "01_a", "score": 3.0, "max_score": 3.0, "error": ""}])
    expected = tmp_path / "expected.csv"
    expected.write_text("learner,lab,cell,score\nann,01_a,total,3\nben,01_a,total,1\n")
    cells = pd.DataFrame(columns=["learner", "lab", "cell", "score"])
    assert driver.compare_expected(expected, totals, cells, ["ann"]).empty
    assert list(driver.compare_expected(expected, totals, cells)["learner"]) == ["ben"]   # without the option
    assert driver.parse_args(["x", "--learners", " ann, cy ,"]).learners == ["ann", "cy"]
    assert driver.parse_args(["x", "--learners", "ann", "--learner", "bo, with a comma", "--learner", "ann"]
                             ).learners == ["ann", "bo, with a comma"]
    assert driver.parse_args(["x", "--learner", "bo, with a comma"]).learners == ["bo, with a comma"]
    assert driver.parse_args(["x"]).learners is None
    with pytest.raises(SystemExit):
        driver.parse_args(["x", "--learners", " , "])


def test_labs_option_grades_only_those_labs_and_checks_only_their_rows(tmp_path):
    driver = load_driver()
    for learner, lab in (("ann", "01_a"), ("ann", "02_b"), ("ben", "02_b")):
        (tmp_path / "batch" / learner / lab).mkdir(parents=True)
    rows = driver.find_submissions(tmp_path / "batch", {"01_a", "02_b"}, None, ["01_a"])
    assert [(r.learner, r.lab) for r in rows] == [("ann", "01_a"), ("ben", "01_a")]
    assert rows[1].error == driver.NOT_SUBMITTED
    with pytest.raises(driver.InfrastructureError, match="names no lab of the course: 09_z"):
        driver.find_submissions(tmp_path / "batch", {"01_a", "02_b"}, None, ["01_a", "09_z"])
    (tmp_path / "only_b" / "ann" / "02_b").mkdir(parents=True)
    with pytest.raises(driver.InfrastructureError, match="no lab folders for --labs 01_a"):
        driver.find_submissions(tmp_path / "only_b", {"01_a", "02_b"}, None, ["01_a"])
    totals = pd.DataFrame([{"learner": "ann", "lab": "01_a", "score": 3.0, "max_score": 3.0, "error": ""}])
    expected = tmp_path / "expected.csv"
    expected.write_text("learner,lab,cell,score\nann,01_a,total,3\nann,02_b,total,1\n")
    cells = pd.DataFrame(columns=["learner", "lab", "cell", "score"])
    assert driver.compare_expected(expected, totals, cells, None, ["01_a"]).empty
    assert list(driver.compare_expected(expected, totals, cells)["lab"]) == ["02_b"]   # without the option
    assert driver.parse_args(["x", "--labs", "01_a, 02_b,"]).labs == ["01_a", "02_b"]
    with pytest.raises(SystemExit):
        driver.parse_args(["x", "--labs", ","])


def _processes_of(work: Path, seed: int) -> list[str]:
    """Processes working in WORK (nbgrader runs in its shard) or carrying the submission's
    COURSE_GRADING_SEED in their environment (nbgrader and the sandboxed kernel)."""
    found = []
    marker = f"COURSE_GRADING_SEED={seed}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(work)) or marker in environ.split(b"\0"):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def test_sigterm_stops_the_driver_and_its_nbgrader_processes(tmp_path):
    """SIGTERM while a submission is being graded: the driver exits 2 saying so, and no nbgrader
    process of that run (nor its kernel) is left behind."""
    import signal
    import time

    write_source(tmp_path)
    release = stock_release(tmp_path)
    nb = nbformat.read(release, as_version=4)
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "add"]
    cell.source = "import time\ntime.sleep(600)\ndef add(a, b):\n    return a + b"
    path = tmp_path / "batch" / "slow" / LAB / f"{LAB}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    work = tmp_path / "work"
    proc = subprocess.Popen([*DRIVER, str(tmp_path / "batch"), "--root", str(tmp_path),
                             "--work", str(work), "--seed", "4242"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seed = load_driver().submission_seed(4242, "slow", LAB)
    log = work / "shards" / "0000" / "nbgrader.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "Autograding" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    assert "Autograding" in log.read_text(), "the shard never started"
    time.sleep(3)   # the kernel is running the sleeping cell
    assert len(_processes_of(work, seed)) >= 2   # nbgrader and the kernel: what must not outlive the driver
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, out + err
    assert "stopped by SIGTERM" in err
    time.sleep(2)
    assert _processes_of(work, seed) == []


def test_learners_validate_runs_what_grading_runs(pipeline, tmp_path):
    """`nbgrader validate` with the learner's settings (jupyter/, as `make lab` reads them) skips the
    demonstration, as grading does: alice passes and ivy, who needs the demonstration's OFFSET,
    fails (stock Validate runs the demonstration, which defines OFFSET for the checks after it)."""
    import shutil

    env = {**env_with_venv_path(), "JUPYTER_CONFIG_PATH": str(REPO / "jupyter")}
    results = {}
    for learner in ("alice", "ivy"):
        path = tmp_path / learner / f"{LAB}.ipynb"
        path.parent.mkdir()
        shutil.copy(pipeline["submissions"] / learner / LAB / f"{LAB}.ipynb", path)
        done = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)], cwd=tmp_path / learner,
                              env=env, capture_output=True, text=True, timeout=300)
        results[learner] = done.stdout + done.stderr
    assert "Success! Your notebook passes all the tests." in results["alice"], results["alice"]
    ivy = ANSI_CODES.sub("", results["ivy"])
    assert "VALIDATION FAILED" in ivy and "name 'OFFSET' is not defined" in ivy, ivy


def test_the_learners_skip_tag_never_reaches_grading(tmp_path):
    """With the learner's settings on JUPYTER_CONFIG_PATH (an instructor who ran `make lab` in the same
    shell), Validate skips `demonstration` cells, but autograde with the course config still skips
    only its own tag: a tag the learner controls never leaves a cell unrun in grading."""
    probe = ("import sys\nfrom nbgrader.apps.{0} import {1}\napp = {1}.instance()\napp.initialize([])\n"
             "print(app.config.Execute.get('skip_cells_with_tag'), app.config.Execute.timeout)")
    env = {**env_with_venv_path(), "JUPYTER_CONFIG_PATH": str(REPO / "jupyter"),
           "TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR": "1"}
    seen = {}
    for app, module, cwd in (("ValidateApp", "validateapp", tmp_path), ("AutogradeApp", "autogradeapp", CONFIG.parent)):
        done = subprocess.run([sys.executable, "-c", probe.format(module, app)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        seen[app] = done.stdout.split()[-2:]
    assert seen == {"ValidateApp": ["demonstration", "300"], "AutogradeApp": [SKIP_TAG, "300"]}


def test_submission_timeout_kills_only_that_submission(tmp_path):
    """A submission past --submission-timeout: its forked nbgrader and its kernel are killed, its
    row says so, the other submission is graded, and nothing of the killed one is left running."""
    import time

    write_source(tmp_path)
    release = stock_release(tmp_path)
    nb = nbformat.read(release, as_version=4)
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "add"]
    for learner, body in (("slow", "import time\ntime.sleep(600)\ndef add(a, b):\n    return a + b"),
                          ("quick", ANSWERS["alice"])):
        cell.source = body
        path = tmp_path / "batch" / learner / LAB / f"{LAB}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    work = tmp_path / "work"
    started = time.monotonic()
    done = run_driver(tmp_path / "batch", "--root", tmp_path, "--work", work, "--seed", 4243,
                      "--submission-timeout", 25)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 300
    grades = read_grades(work).set_index("learner")
    assert grades.loc["slow", "error"] == "autograde failed: killed after 25 s (--submission-timeout)"
    (log,) = [p for p in work.glob("shards/*/nbgrader.log") if "--student slow" in p.read_text()]
    assert log.read_text().rstrip().endswith("[course_grader.grade] killed after 25 s (--submission-timeout)")
    assert "(each nbgrader command forked from the warm process)" in done.stdout
    assert grades.loc["quick", "score"] == 3.0 and grades.loc["quick", "error"] == ""
    time.sleep(2)
    assert _processes_of(work, load_driver().submission_seed(4243, "slow", LAB)) == []


def test_a_forked_command_stops_on_a_config_file_that_raises(tmp_path):
    """The warm fork server imported traitlets once; a config file that raises must still stop the
    command (were it skipped, nbgrader would grade with default paths and no sandbox)."""
    from course_grader import warm

    if not warm.available():
        pytest.skip("no fork server on this platform")
    (tmp_path / "nbgrader_config.py").write_text("raise RuntimeError('config says no')\n")
    log = tmp_path / "log.txt"
    code = warm.run(["autograde", "x"], tmp_path, log, env_with_venv_path(), timeout=120)
    assert code not in (0, None)
    text = log.read_text()
    assert text.rstrip().endswith("RuntimeError: config says no"), text[-2000:]
    assert "No notebooks were matched" not in text      # what a skipped config file leads to
    assert warm.run(["--version"], tmp_path, log, env_with_venv_path(), timeout=120) == 0


def test_links_are_not_copied_and_control_characters_are_shown_escaped(tmp_path):
    driver = load_driver()
    folder = tmp_path / "learner" / LAB
    folder.mkdir(parents=True)
    (folder / f"{LAB}.ipynb").write_text("{}")
    (folder / "notes.txt").write_text("mine")
    os.symlink("/etc/shadow", folder / "shadow.txt")
    os.symlink("../../elsewhere", folder / "dir_link")
    os.mkfifo(folder / "pipe")
    assert driver.links_and_special_files(folder) == ["dir_link", "pipe", "shadow.txt"]
    import shutil
    shutil.copytree(folder, tmp_path / "copy", ignore=driver.copy_ignoring_links)
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == [f"{LAB}.ipynb", "notes.txt"]
    os.symlink(tmp_path / "copy" / f"{LAB}.ipynb", tmp_path / "linked.ipynb")
    (folder / f"{LAB}.ipynb").unlink()
    os.symlink(tmp_path / "copy" / f"{LAB}.ipynb", folder / f"{LAB}.ipynb")
    assert "symbolic link" in driver.notebook_problem(folder, LAB)
    assert driver.printable("a\x1b[2Kb\r\n\x07") == "a\\x1b[2Kb\\x0d\\x0a\\x07"


def test_one_slow_feedback_page_costs_only_its_own_learner(tmp_path):
    """generate_feedback for a lab runs once for every learner under a time limit; when that batch
    is killed, each learner still without a page gets a run of its own, and only the one whose page
    cannot be made in time gets a row error."""
    driver = load_driver()
    course, work = tmp_path / "course", tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    rows = [driver.Submission(name, "01_x", graded=True) for name in ("ann", "bob", "cat")]
    calls = []

    def page(learner):
        path = course / "feedback" / learner / "01_x" / "01_x.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("<html></html>")

    def fake_run(args, cwd, log, env, timeout=None):
        calls.append((args, timeout))
        if "--student" not in args:       # the batch: made ann's page, then stalled on cat's
            page("ann")
            return -9, "killed"
        learner = args[args.index("--student") + 1]
        if learner == "cat":
            return -9, "killed"
        page(learner)
        return 0, ""

    driver.generate_feedback(course, work, rows, ["01_x"], {}, run=fake_run)
    assert [r.error for r in rows][:2] == ["", ""]
    assert "feedback not generated" in rows[2].error and str(driver.FEEDBACK_SECONDS) in rows[2].error
    assert [a for a, _ in calls] == [["generate_feedback", "01_x"],
                                     ["generate_feedback", "01_x", "--student", "bob", "--force"],
                                     ["generate_feedback", "01_x", "--student", "cat", "--force"]]
    assert calls[0][1] == driver.FEEDBACK_SECONDS + 3 * driver.FEEDBACK_SECONDS_PER_LEARNER


def test_a_learner_folder_whose_name_is_not_utf8_is_a_row_error(tmp_path):
    """A folder name with bytes UTF-8 cannot decode (Python reads it with lone surrogates) is an
    error row; the others are graded and every table of the batch can be written."""
    driver = load_driver()
    lab = "01_roofline"
    release = REPO / "labs" / lab / f"{lab}.ipynb"
    bad = os.fsdecode(b"bad\xffname")
    for learner in (bad, "good"):
        folder = tmp_path / "submitted" / learner / lab
        folder.mkdir(parents=True)
        (folder / f"{lab}.ipynb").write_bytes(release.read_bytes())
    rows = {r.learner: r for r in driver.find_submissions(tmp_path / "submitted", {lab})}
    assert "not UTF-8" in rows[bad].error and rows["good"].error == ""
    table = driver.totals_table(list(rows.values()))
    table.to_csv(tmp_path / "grades.csv", index=False)          # no UnicodeEncodeError
    assert "bad\\udcffname" in set(table.learner)
    assert driver.judge.sha256_seed(7, bad, lab) != driver.judge.sha256_seed(7, "good", lab)


def test_the_class_projection_divides_the_measured_work_among_the_workers():
    from course_grader.bench_grading import class_projection

    table = class_projection({"04_quantization": 70.0, "01_roofline": 10.0}, throughput=1.4, learners=300,
                             workers=10)
    assert table.lab.tolist() == ["01_roofline", "04_quantization", "class"]
    # 300 submissions of 10 s and of 70 s over 10 workers that each grade at 1.4x one job's rate
    assert table.projected_wall_s.tolist() == pytest.approx([3000 / 14, 21000 / 14, 24000 / 14])
    assert table.seconds_per_submission.iloc[-1] == 80.0
    for bad in ({"throughput": 0.0}, {"learners": 0}, {"workers": 0}):
        with pytest.raises(ValueError, match="positive"):
            class_projection({"01_roofline": 10.0}, **{"throughput": 1.0, "learners": 1, "workers": 1, **bad})


def test_regrade_refuses_a_tampered_run_json_or_table_before_changing_anything(tmp_path):
    """Hostile review: a run.json whose graded was a list (or its names one string) passed previous_run and
    crashed the regrade after grading (AttributeError), or was split into letters; a grades.csv with a blank
    or cut line raised IndexError in replace_csv_rows after the previous run's course had been changed."""
    driver = load_driver()
    work, root = tmp_path / "work", tmp_path / "root"
    (work / "course").mkdir(parents=True)
    (work / driver.WORK_MARKER).write_text("")
    (work / "course" / "gradebook.db").write_text("")
    good = {"seed": 5, "root": str(root), "labs": [LAB], "graded": {LAB: ["ann"]}}
    (work / "grades.csv").write_text("learner,lab,score\nann,01_tiny,1\n")
    (work / driver.RUN_FILE).write_text(json.dumps(good))
    assert driver.previous_run(work, root, [LAB])["seed"] == 5
    for tampered in ({"graded": [LAB]}, {"graded": {LAB: "ann"}}, {"labs": LAB}):
        (work / driver.RUN_FILE).write_text(json.dumps({**good, **tampered}))
        with pytest.raises(driver.InfrastructureError, match="labs must be a list of labs and graded a table"):
            driver.previous_run(work, root, [LAB])
    (work / driver.RUN_FILE).write_text(json.dumps(good))
    for text, why in (("learner,lab,score\nann,01_tiny,1\n\n", "line 3 is not one record of 3 fields"),
                      ("learner,lab,score\nann,01_tiny\n", "line 2 is not one record of 3 fields"),
                      ('learner,lab,score\n"ann\n', "line 2 is not")):
        (work / "grades.csv").write_text(text)
        with pytest.raises(driver.InfrastructureError, match=why):
            driver.previous_run(work, root, [LAB])
