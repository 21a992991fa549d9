#!/usr/bin/env python
"""Benchmark: stock serial `nbgrader autograde` against the parallel driver (course_grader.grade).

    python -m course_grader.bench [--copies 40] [--jobs 2] [--lab 02_kv_cache]

Makes COPIES submissions of LAB by cycling through the lab's sample submissions
(autograder/samples/{learner}/{lab}), then grades them twice on this machine, one after the
other:

1. stock: one `nbgrader autograde LAB` over all of them (nbgrader grades its students one at a
   time), with the course's nbgrader_config.py but no sandbox and no judge, in a plain nbgrader
   course made under build/bench-grading/stock;
2. driver: `python -m course_grader.grade --jobs JOBS` (sandboxed kernels, the judge, one shard per
   submission, JOBS at a time, merged gradebook, feedback and export).

It prints both wall times, the throughput ratio (driver submissions per second over stock) and
fails (exit 1) unless every submission got the same score both ways. Nothing is asserted
about time: the figures are measurements of this machine, for the notes.
"""
from __future__ import annotations

import argparse
import math
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


def make_batch(lab: str, copies: int, folder: Path) -> list[str]:
    samples = sorted(p.parent.name for p in SAMPLES.glob(f"*/{lab}"))
    if not samples:
        raise SystemExit(f"no samples of {lab} under autograder/samples")
    learners = []
    for k in range(copies):
        sample = samples[k % len(samples)]
        learner = f"{k:02d}_{sample}"
        shutil.copytree(SAMPLES / sample / lab, folder / learner / lab)
        learners.append(learner)
    return learners


def stock_run(lab: str, batch: Path, work: Path, env: dict) -> tuple[float, dict[str, float]]:
    grade.prepare_work(work, ROOT, batch)
    course = grade.build_course(work, ROOT, batch, [lab], None, env, sandbox_lines=STOCK_LINES)
    course_id = grade.course_id_of(course / "gradebook.db")
    start = time.monotonic()
    code, why = grade.run_nbgrader(["autograde", lab], course, work / "logs" / "autograde.log", env)
    seconds = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"stock nbgrader autograde failed: {why} (log: {work / 'logs' / 'autograde.log'})")
    scores = {}
    for learner in sorted(p.name for p in batch.iterdir()):
        row = grade.Submission(learner, lab)
        grade.read_scores(course / "gradebook.db", course_id, row)
        scores[learner] = row.score
    return seconds, scores


def driver_run(lab: str, batch: Path, work: Path, jobs: int) -> tuple[float, dict[str, float]]:
    start = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "course_grader.grade", str(batch), "--jobs", str(jobs),
                            "--work", str(work)], stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"the driver exited with {code}")
    table = grade.read_csv_text(work / "grades.csv")
    return seconds, {r.learner: float(r.score) for r in table.itertuples() if r.lab == lab}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--lab", default="02_kv_cache")
    args = parser.parse_args(argv)
    if WORK.exists():
        shutil.rmtree(WORK)
    batch = WORK / "submissions"
    batch.mkdir(parents=True)
    learners = make_batch(args.lab, args.copies, batch)
    env = grade.nbgrader_env(1)
    env["COURSE_GRADING_SEED"] = "20261129"
    print(f"{len(learners)} submissions of {args.lab}; {os.cpu_count()} cores", flush=True)
    print("stock: one serial `nbgrader autograde` (no sandbox, no judge) ...", flush=True)
    stock_s, stock = stock_run(args.lab, batch, WORK / "stock", env)
    print(f"  {stock_s:.1f} s", flush=True)
    print(f"driver: course_grader.grade --jobs {args.jobs} (sandbox, judge, shards, merge, feedback, export) ...", flush=True)
    driver_s, driver = driver_run(args.lab, batch, WORK / "driver", args.jobs)
    print(f"  {driver_s:.1f} s", flush=True)
    table = pd.DataFrame({"stock": stock, "driver": driver})
    differ = table[(table.stock - table.driver).abs() > 1e-6]
    n = len(learners)
    print(f"\nstock serial nbgrader: {stock_s:.1f} s, {n / stock_s * 60:.2f} submissions/min")
    print(f"parallel driver ({args.jobs} jobs): {driver_s:.1f} s, {n / driver_s * 60:.2f} submissions/min")
    print(f"throughput ratio driver/stock: {stock_s / driver_s:.2f}")
    print(f"scores: {len(table) - len(differ)} of {len(table)} the same; mean {table.driver.mean():.2f}")
    if not differ.empty or len(table) != n or table.isna().any().any():
        print("Scores differ:\n" + differ.to_string())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
