#!/usr/bin/env python
"""Benchmark: what grading costs on top of running the notebooks, and what a second job buys.

    python -m course_grader.bench_grading [--labs 01_roofline 03_scheduling] [--copies 4] [--stock]
                                          [--cold-start] [--class-size N --workers W] [--check-cluster]

Makes COPIES submissions of each LAB by cycling through the lab's sample submissions
(autograder/samples/{learner}/{lab}), then, one after the other on this machine:

1. plain: each submission executed alone, every cell (demonstrations included, at their quick
   sizes: COURSE_QUICK=1) by ``jupyter nbconvert --execute``, with every core's math threads, no
   sandbox, no judge, no nbgrader; one at a time;
2. driver, ``--jobs 1``: ``python -m course_grader.grade`` on the batch (course build, a shard per
   submission with the sandboxed autograde, which also runs the hidden tests, and the judge, then
   the merge, feedback and export); its ``timings.csv`` gives each submission's grading time;
3. driver, ``--jobs 2``: the same batch, two submissions at a time;
4. with ``--cold-start``: driver, ``--jobs 1 --cold-start``, every nbgrader command a new Python
   process instead of a fork of the warm one (``course_grader.warm``): the per-submission table
   gets a ``cold_s`` column, so the fork server's gain is a ratio measured in one run;
5. with ``--stock``: one stock serial ``nbgrader autograde`` over the batch (the course's
   nbgrader_config.py without the sandbox and the judge), for comparison.

It prints one row per submission (plain seconds, driver seconds, their ratio), then the totals: the
overhead of the driver at ``--jobs 1`` over plain execution (per-submission grading time against
plain time, and the whole run, which adds the course build, the merge and the feedback pages), and
the throughput of ``--jobs 2`` over ``--jobs 1``. It exits 1 unless every submission scores the same
in every driver run (and the stock run). With ``--class-size N --workers W`` it also prints a
projection (``class_projection``): the grading time of N learners times the measured labs on W
workers of this machine's size, from the measured per-submission times and the ``--jobs 2``
throughput; ``--check-cluster`` grades the batch once more on a Dask LocalCluster of two one-thread
workers, as a check of that rate on the cluster path. Nothing is asserted about time: the figures
are this machine's, for the autograder README.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from . import grade
from .paths import REPO_ROOT as ROOT
from .paths import SAMPLES

WORK = ROOT / "build" / "bench-grading"
# The course config sandboxes and judges every Execute step; the stock run puts nbgrader's own back.
STOCK_LINES = [
    "from nbgrader.preprocessors import Execute as _StockExecute",
    "c.Autograde.autograde_preprocessors = [_StockExecute if isinstance(s, type) and issubclass(s, _StockExecute)"
    " else s for s in c.Autograde.autograde_preprocessors]",
]
SEED = 20261129  # --seed of every driver run: the same hidden inputs each time


def make_batch(labs: list[str], copies: int, folder: Path) -> list[tuple[str, str]]:
    """COPIES submissions of each lab under FOLDER/{learner}/{lab}, cycling through its samples
    (the solution first); returns the (learner, lab) pairs."""
    pairs = []
    for lab in labs:
        samples = sorted(p.parent.name for p in SAMPLES.glob(f"*/{lab}"))
        if not samples:
            raise SystemExit(f"no samples of {lab} under autograder/samples")
        samples.sort(key=lambda name: name != "solution")
        for k in range(copies):
            learner = f"{k:02d}_{samples[k % len(samples)]}"
            shutil.copytree(SAMPLES / samples[k % len(samples)] / lab, folder / learner / lab)
            pairs.append((learner, lab))
    return pairs


def plain_run(batch: Path, pairs: list[tuple[str, str]], out: Path) -> dict[tuple[str, str], float]:
    """Each submission executed by nbconvert, one at a time; seconds per submission. A notebook whose
    cells raise (an unsolved release, a fault's failing check) still runs to the end
    (--allow-errors), as autograde runs every cell."""
    env = {**grade.nbgrader_env(1), "COURSE_QUICK": "1"}
    seconds = {}
    for learner, lab in pairs:
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                        "--allow-errors", "--ExecutePreprocessor.timeout=900", "--log-level=ERROR",
                        str(batch / learner / lab / f"{lab}.ipynb"), "--output-dir", str(out / learner / lab)],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        seconds[(learner, lab)] = time.monotonic() - start
    return seconds


def driver_run(batch: Path, work: Path, jobs: int, cluster: str | None = None,
               cold: bool = False) -> tuple[float, pd.DataFrame]:
    """The grading driver on BATCH, with JOBS jobs or on the Dask scheduler at CLUSTER (COLD: with
    ``--cold-start``); (wall seconds, grades.csv merged with timings.csv)."""
    where = (["--jobs", str(jobs)] if cluster is None else ["--cluster", cluster]) + (["--cold-start"] if cold else [])
    start = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "course_grader.grade", str(batch), *where,
                            "--work", str(work), "--seed", str(SEED)], stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"the driver exited with {code} (see {work})")
    grades = grade.read_csv_text(work / "grades.csv")
    grades = grades[grades["error"] != grade.NOT_SUBMITTED]     # the table lists every learner x lab pair
    timings = grade.read_csv_text(work / "timings.csv")
    timings["seconds"] = timings["seconds"].astype(float)
    return seconds, grades.merge(timings, on=["learner", "lab"], how="left")


def stock_run(labs: list[str], batch: Path, work: Path) -> tuple[float, dict[tuple[str, str], float]]:
    """One stock serial `nbgrader autograde` per lab over the batch (no sandbox, no judge)."""
    env = {**grade.nbgrader_env(1), "COURSE_GRADING_SEED": str(SEED)}
    grade.prepare_work(work, ROOT, batch)
    course = grade.build_course(work, ROOT, batch, labs, None, env, sandbox_lines=STOCK_LINES)
    course_id = grade.course_id_of(course / "gradebook.db")
    start = time.monotonic()
    for lab in labs:
        code, why = grade.run_nbgrader(["autograde", lab], course, work / "logs" / f"autograde_{lab}.log", env)
        if code != 0:
            raise SystemExit(f"stock nbgrader autograde {lab} failed: {why} (logs: {work / 'logs'})")
    seconds = time.monotonic() - start
    scores = {}
    for learner in sorted(p.name for p in batch.iterdir()):
        for lab in labs:
            if (batch / learner / lab).is_dir():
                row = grade.Submission(learner, lab)
                grade.read_scores(course / "gradebook.db", course_id, row)
                scores[(learner, lab)] = row.score
    return seconds, scores


def class_projection(per_lab_seconds: dict[str, float], throughput: float, learners: int,
                     workers: int) -> pd.DataFrame:
    """A projection, not a measurement: seconds to grade LEARNERS submissions of each lab of
    PER_LAB_SECONDS (the median grading time of one submission at ``--jobs 1``, from ``timings.csv``)
    on WORKERS machines like this one, each grading with two jobs at THROUGHPUT times the rate of
    one (the measured ``--jobs 2`` whole-run ratio): learners x seconds / (workers x throughput) per
    lab, and a "class" row with the sum. The course build, the merge and the feedback pages, which
    run once on the driver, are not in it.

    Raises: ValueError for a count or a rate that is not positive."""
    if learners < 1 or workers < 1 or throughput <= 0 or any(t <= 0 for t in per_lab_seconds.values()):
        raise ValueError("learners, workers, the throughput and every lab's seconds must be positive")
    rows = [(lab, t, learners * t / (workers * throughput)) for lab, t in sorted(per_lab_seconds.items())]
    rows.append(("class", sum(t for _, t, _ in rows), sum(w for _, _, w in rows)))
    return pd.DataFrame(rows, columns=["lab", "seconds_per_submission", "projected_wall_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_grader.bench_grading", description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="+", default=["01_roofline", "03_scheduling"],
                        help="labs to grade (default: 01_roofline 03_scheduling)")
    parser.add_argument("--copies", type=int, default=4, help="submissions per lab (default 4)")
    parser.add_argument("--stock", action="store_true", help="also time stock serial nbgrader autograde")
    parser.add_argument("--cold-start", action="store_true",
                        help="also time the driver at --jobs 1 with --cold-start (a new process per nbgrader command)")
    parser.add_argument("--class-size", type=int, metavar="N", help="also project the grading time of N learners")
    parser.add_argument("--workers", type=int, default=1, metavar="W",
                        help="... on W machines like this one (default 1)")
    parser.add_argument("--check-cluster", action="store_true",
                        help="also grade the batch on a Dask LocalCluster of two one-thread workers (this machine "
                             "as a one-worker class), to check the projection's --jobs 2 rate")
    args = parser.parse_args(argv)
    if args.copies < 1:
        parser.error("--copies must be at least 1")
    if (args.class_size is not None and args.class_size < 1) or args.workers < 1:
        parser.error("--class-size and --workers must be at least 1")
    if (args.class_size is not None or args.check_cluster) and len(args.labs) * args.copies < 2:
        parser.error("the projection's --jobs 2 rate needs at least two submissions (more --copies or --labs)")
    if WORK.exists():
        shutil.rmtree(WORK)
    batch = WORK / "submissions"
    batch.mkdir(parents=True)
    pairs = make_batch(args.labs, args.copies, batch)
    print(f"{len(pairs)} submissions ({args.copies} of each of {', '.join(args.labs)}); {os.cpu_count()} cores",
          flush=True)

    print("plain: nbconvert --execute, quick mode, one at a time ...", flush=True)
    plain = plain_run(batch, pairs, WORK / "plain")
    print(f"  {sum(plain.values()):.1f} s", flush=True)
    runs = {}
    for jobs in (1, 2):
        print(f"driver: course_grader.grade --jobs {jobs} ...", flush=True)
        runs[jobs] = driver_run(batch, WORK / f"driver_jobs{jobs}", jobs)
        print(f"  {runs[jobs][0]:.1f} s", flush=True)
    cold = None
    if args.cold_start:
        print("driver: course_grader.grade --jobs 1 --cold-start ...", flush=True)
        cold = driver_run(batch, WORK / "driver_jobs1_cold", 1, cold=True)
        print(f"  {cold[0]:.1f} s", flush=True)
    stock = stock_run(args.labs, batch, WORK / "stock") if args.stock else None
    local = None
    if args.check_cluster:
        from distributed import LocalCluster

        print("driver: course_grader.grade --cluster on a LocalCluster (2 workers, 1 thread each) ...", flush=True)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            local = driver_run(batch, WORK / "driver_local_cluster", 1, cluster=cluster.scheduler_address)
        print(f"  {local[0]:.1f} s", flush=True)

    wall1, table1 = runs[1]
    wall2, table2 = runs[2]
    throughput = wall1 / wall2         # of --jobs 2 over --jobs 1, whole runs
    rows = table1.set_index(["learner", "lab"])
    per = pd.DataFrame({"plain_s": pd.Series(plain), "driver_s": rows["seconds"], "score": rows["score"]})
    per.index.names = ["learner", "lab"]
    per["ratio"] = per.driver_s / per.plain_s
    if cold is not None:
        per["cold_s"] = cold[1].set_index(["learner", "lab"])["seconds"]
    print("\nPer submission (driver --jobs 1: its shard's grading time):")
    print(per.reset_index().to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    plain_total, graded_total = sum(plain.values()), float(per.driver_s.sum())
    print(f"\nplain execution, sum:                       {plain_total:.1f} s")
    print(f"driver --jobs 1, sum of submissions:         {graded_total:.1f} s "
          f"(overhead {graded_total / plain_total - 1:+.0%}: sandbox, hidden tests, judge)")
    print(f"driver --jobs 1, whole run:                  {wall1:.1f} s "
          f"(overhead {wall1 / plain_total - 1:+.0%}: also the course build, merge, feedback, export)")
    print(f"driver --jobs 2, whole run:                  {wall2:.1f} s "
          f"(throughput {throughput:.2f}x that of --jobs 1)")
    if cold is not None:
        print(f"driver --jobs 1 --cold-start, whole run:     {cold[0]:.1f} s (sum of submissions "
              f"{float(per.cold_s.sum()):.1f} s: the warm fork server saves {1 - graded_total / float(per.cold_s.sum()):.0%})")
    if stock is not None:
        print(f"stock serial nbgrader autograde:             {stock[0]:.1f} s (no sandbox, no judge)")
    if args.class_size is not None:
        per_lab = per.reset_index().groupby("lab").driver_s.median().to_dict()
        projection = class_projection(per_lab, throughput, args.class_size, args.workers)
        print(f"\nProjection (not a measurement): {args.class_size} learners x {len(per_lab)} lab(s) on "
              f"{args.workers} worker(s) of this size, two jobs each at {throughput:.2f}x one job's rate; "
              "the course build, merge and feedback are not in it:")
        print(projection.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
        print(f"projected wall time: {projection.projected_wall_s.iloc[-1] / 60:.1f} min")
    if local is not None:
        predicted = float(per.driver_s.sum()) / throughput
        print(f"check: this batch on a LocalCluster, whole run {local[0]:.1f} s; the projection's rate predicts "
              f"{predicted:.1f} s of grading for it (the --jobs 2 whole run took {wall2:.1f} s)")

    scores = {"jobs1": table1.set_index(["learner", "lab"]).score.astype(float),
              "jobs2": table2.set_index(["learner", "lab"]).score.astype(float)}
    if cold is not None:
        scores["jobs1_cold"] = cold[1].set_index(["learner", "lab"]).score.astype(float)
    if local is not None:
        scores["local_cluster"] = local[1].set_index(["learner", "lab"]).score.astype(float)
    if stock is not None:
        scores["stock"] = pd.Series(stock[1])
    compared = pd.DataFrame(scores)
    differ = compared[compared.nunique(axis=1, dropna=False) > 1]
    if not differ.empty or len(compared) != len(pairs) or compared.isna().any().any():
        print("Scores differ between runs:\n" + compared.to_string())
        return 1
    print(f"scores: the same in every run for all {len(pairs)} submissions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
