"""Grading fanned out on a Dask distributed cluster: ``python -m course_grader.grade DIR --cluster ADDRESS``.

The driver builds the course, stages one shard per submission and merges the grades, tables and
feedback as it does for ``--jobs``; only where a shard is graded changes. The staged shard goes to a
worker as a tar archive (``grade_task``); the worker writes the shard's ``nbgrader_config.py`` from
*its* checkout plus the driver's sandbox and judge lines, runs ``grade.autograde_shard`` (the
sandboxed ``nbgrader autograde`` and the judge, as a local job) and returns the row's results and
the graded shard, which the driver unpacks into ``shards/NNNN`` (links and devices refused).

What it defends against: a worker with other course code, Python or package versions, no working
sandbox, or no usable default model (the driver checks every worker before the first task, and a
late worker checks itself before its first: ``WorkerUnfit`` names it in the row); a worker that dies
mid-task (Dask runs the task again elsewhere, up to ``distributed.scheduler.allowed-failures``; then
the row is a ``KilledWorker`` error: never lost, never graded twice, since only the driver writes the
gradebook). What it does not: Dask's ``tcp://`` is unauthenticated and the driver unpickles results,
so the scheduler must stay on a private network or use TLS (the autograder README).

Workers: a checkout of the same commit with ``make setup model sandbox`` done, then ``dask worker
ADDRESS --nthreads 1`` from its venv (``--nworkers N`` for N on one machine), or dask-jobqueue /
dask-kubernetes workers with the same venv.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import io
import os
import platform
import shutil
import socket
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

from . import grade
from .paths import BASE_CONFIG, REPO_ROOT

#: Submission fields a worker fills in; the driver copies exactly these back (the rest is its own).
RESULT_FIELDS = ("error", "score", "max_score", "cells", "comments", "graded", "timestamp", "penalty", "seconds_late",
                 "deadline", "notebook_penalties", "reuse", "judge_flags", "seconds", "speeds")
#: Installed packages whose versions can change a grade (nbgrader's pipeline; the numerics of the
#: reference model and of the learner's code).
PACKAGES = ("nbgrader", "torch", "numpy", "transformers")
#: What a worker's report must agree on with the driver's.
MATCHED = ("fingerprint", "python", *PACKAGES)
#: Environment variables of the driver that the worker's nbgrader processes get too (the thread
#: counts the instructor set; the seeds travel in the row).
FORWARDED_ENV = grade.THREAD_VARS
#: The shard's config is the worker's own (its paths); the driver's copy stays home.
CONFIG = "nbgrader_config.py"
#: The driver has these already: the worker sends back only what grading wrote.
STAGED_ONLY = ("source", "submitted", CONFIG)
TASK_FILE = "task.json"  # in a worker's shard folder while it grades: which process, for logs and tests


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the course code a grade depends on: every .py file of course_lib and course_grader
    (path relative to its package, then bytes) and the course's nbgrader_config.py."""
    import course_lib

    h = hashlib.sha256()
    for package in (Path(course_lib.__file__).parent, Path(__file__).parent):
        for path in sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts):
            h.update(f"{package.name}/{path.relative_to(package).as_posix()}\0".encode())
            h.update(path.read_bytes())
    h.update(BASE_CONFIG.read_bytes())
    return h.hexdigest()


def versions() -> dict[str, str]:
    """This process's Python and ``PACKAGES`` versions (what ``MATCHED`` compares besides the
    fingerprint); a package that is not installed reads "missing"."""
    import importlib.metadata

    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "missing"
    return found


def worker_report(allow_unsafe: bool = False) -> dict:
    """What a worker can grade with (run on each worker by ``Cluster.check``): host, cores, the code
    fingerprint, versions, a list of problems (no sandbox, a sandboxed kernel importing another
    course_lib, the default model not usable without a download), and ``unsafe``: the sandbox's warning
    when it is missing and ALLOW_UNSAFE let it pass ("" otherwise)."""
    from course_lib.data import model_status
    from course_lib.doctor import DEFAULT_MODEL

    problems, unsafe = [], ""
    try:
        unsafe = grade.check_sandbox(allow_unsafe)
    except grade.InfrastructureError as exc:
        problems.append(str(exc))
    try:
        status, _, usable = model_status(DEFAULT_MODEL)
    except Exception as exc:  # a broken manifest or cache: the worker cannot grade
        status, usable = f"{type(exc).__name__}: {exc}", False
    if not usable:
        problems.append(f"default model {DEFAULT_MODEL} not usable: {status} (run `make model` there)")
    return {"host": socket.gethostname(), "cpus": os.cpu_count() or 1, "root": str(REPO_ROOT),
            "fingerprint": code_fingerprint(), **versions(), "problems": problems, "unsafe": unsafe}


def pack(folder: Path, leave_out: tuple[str, ...] = ()) -> bytes:
    """FOLDER's files as a gzip'd tar (paths relative to it), without the top-level names LEAVE_OUT."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in sorted(folder.iterdir()):
            if entry.name not in leave_out:
                tar.add(entry, arcname=entry.name)
    return buffer.getvalue()


def _files_and_folders_only(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """tarfile's "data" filter (no absolute paths, nothing outside the folder), and then no links,
    devices or fifos at all: a relative link inside the archive could still point the driver's merge
    at the staged solution."""
    member = tarfile.data_filter(member, path)
    if not (member.isfile() or member.isdir()):
        raise tarfile.FilterError(f"{member.name!r} is not a regular file or folder")
    return member


def unpack(data: bytes, folder: Path) -> None:
    """Extract an archive made by ``pack`` into FOLDER. Raises tarfile.TarError (FilterError) for a
    member that is a link, a device or a fifo, or whose path leaves FOLDER."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter=_files_and_folders_only)


@functools.lru_cache(maxsize=None)
def _fitness(allow_unsafe: bool) -> tuple[str, ...]:
    """This worker process's problems (``worker_report``), checked once per process: a worker that
    joined after the driver's check (a restart, adaptive scaling, a batch job starting late)."""
    return tuple(worker_report(allow_unsafe)["problems"])


class WorkerUnfit(RuntimeError):
    """A worker that cannot grade (no sandbox, no model, other course code): the driver records the
    row as an error naming it, never as a score."""


def grade_task(payload: dict) -> dict:
    """A worker's half: grade one staged shard (see the module docstring); returns the row with its
    results and the graded shard's archive. Raises WorkerUnfit when this worker's course code is not the
    driver's or it cannot grade (``worker_report``'s problems, checked once per worker process: a worker
    may have joined after the driver's check)."""
    mine, here = code_fingerprint(), f"worker on {socket.gethostname()} ({REPO_ROOT})"
    if payload["fingerprint"] != mine:
        raise WorkerUnfit(f"{here} runs other course code (fingerprint {mine[:12]}, "
                          f"driver {payload['fingerprint'][:12]})")
    problems = _fitness(bool(payload.get("allow_unsafe", False)))
    if problems:
        raise WorkerUnfit(f"{here} cannot grade: {'; '.join(problems)}")
    row: grade.Submission = payload["row"]
    try:
        from distributed import get_worker

        base = get_worker().local_directory
    except (ImportError, ValueError):  # not inside a Dask worker (a direct call)
        base = None
    folder = Path(tempfile.mkdtemp(prefix="course-grading-", dir=base))
    try:
        unpack(payload["archive"], folder)
        (folder / TASK_FILE).write_text(f'{{"pid": {os.getpid()}, "host": "{socket.gethostname()}"}}\n')
        grade.write_course_config(folder, payload["cell_timeout"], payload["sandbox_lines"])
        # a share of this machine's cores per kernel, set even where the environment has a value, since
        # Dask's nanny sets these to 1 in every worker; the instructor's own setting comes in the payload
        share = str(max(1, (os.cpu_count() or 1) // max(1, payload["threads_on_host"].get(socket.gethostname(), 1))))
        env = {**grade.nbgrader_env(1), **dict.fromkeys(grade.THREAD_VARS, share), **payload["env"]}
        row.shard = folder
        start = time.monotonic()
        try:
            grade.autograde_shard(row, payload["course_id"], env, payload["timeout"])
        finally:
            row.seconds = time.monotonic() - start
        (folder / TASK_FILE).unlink()
        archive = pack(folder, leave_out=STAGED_ONLY)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"results": {name: getattr(row, name) for name in RESULT_FIELDS}, "archive": archive,
            "where": f"{socket.gethostname()} (pid {os.getpid()})"}


class Cluster:
    """A connection to a Dask scheduler that grades shards (``grade.grade_all(..., cluster=...)``).

    Args:
        address: the scheduler's address (``tcp://host:8786``) or a scheduler file (``.json``, as
            ``dask scheduler --scheduler-file`` writes).
        sandbox_lines: the driver's sandbox and judge lines for each shard's nbgrader_config.py.
        cell_timeout: seconds per cell, or None for the course's ``Execute.timeout``.
        allow_unsafe: workers may grade without the sandbox (``--unsafe-no-sandbox``).
        connect_timeout: seconds to wait for the scheduler and for at least one worker.

    Raises: InfrastructureError when the scheduler cannot be reached or has no worker.
    """

    def __init__(self, address: str, sandbox_lines: list[str], cell_timeout: int | None,
                 allow_unsafe: bool = False, connect_timeout: float = 60.0) -> None:
        try:
            from distributed import Client
        except ImportError as exc:
            raise grade.InfrastructureError(f"--cluster needs Dask's distributed ({exc}); it is in the course's "
                                            "dev extra (make setup installs it)") from None
        self.sandbox_lines, self.cell_timeout, self.allow_unsafe = list(sandbox_lines), cell_timeout, allow_unsafe
        try:
            where = {"scheduler_file": address} if address.endswith(".json") else {"address": address}
            self.client = Client(**where, timeout=connect_timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise grade.InfrastructureError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
        try:
            self.client.wait_for_workers(1, timeout=connect_timeout)
        except (TimeoutError, OSError) as exc:
            self.client.close()
            raise grade.InfrastructureError(f"the Dask scheduler at {address} has no worker after "
                                            f"{connect_timeout:.0f} s ({exc}); start some with `dask worker {address}`")

    def close(self) -> None:
        self.client.close()

    def workers(self) -> dict[str, dict]:
        return self.client.scheduler_info(n_workers=-1)["workers"]

    def run_on_each_worker(self, function, *args, timeout: float = 600.0) -> tuple[dict, dict]:
        """FUNCTION(*ARGS) once on every worker, as a task held to that worker: it runs in a worker
        thread, not on the worker's event loop (``Client.run``), so heartbeats go on while it starts a
        sandboxed kernel. Returns ({address: result}, {address: why it failed}); waits at most TIMEOUT
        seconds in all."""
        token = uuid.uuid4().hex[:12]
        futures = {address: self.client.submit(function, *args, workers=[address], allow_other_workers=False,
                                               pure=False, key=f"course-worker-check-{token}-{address}")
                   for address in self.workers()}
        deadline = time.monotonic() + timeout
        results, failed = {}, {}
        for address, future in futures.items():
            try:
                results[address] = future.result(timeout=max(1.0, deadline - time.monotonic()))
            except Exception as exc:      # the worker died, the function raised, the wait ran out
                failed[address] = f"{type(exc).__name__}: {exc}"
            finally:
                future.release()
        return results, failed

    def check(self) -> dict[str, dict]:
        """Every worker's ``worker_report``; InfrastructureError naming each worker that differs from
        this driver or has a problem."""
        reports, failed = self.run_on_each_worker(worker_report, self.allow_unsafe)
        mine = {"fingerprint": code_fingerprint(), **versions()}
        bad = [f"worker {address}: its check did not finish: {why}" for address, why in sorted(failed.items())]
        for address, report in sorted(reports.items()):
            where = f"worker {address} on {report['host']} ({report['root']})"
            differs = [f"{key} {str(report.get(key, 'missing'))[:12]} (driver {mine[key][:12]})"
                       for key in MATCHED if report.get(key) != mine[key]]
            if differs:
                bad.append(f"{where}: other course code or versions: {', '.join(differs)}; check out the driver's "
                           "commit there and run `make setup`")
            bad.extend(f"{where}: {problem}" for problem in report["problems"])
        if bad:
            raise grade.InfrastructureError("refusing to grade on this cluster:\n  " + "\n  ".join(bad))
        return reports

    def grade(self, course: Path, rows: list, course_id: str, timeout: float):
        """Stage, submit and collect every row's shard; yields (row, exception or None, worker) as each
        ends (``grade.report_outcomes`` reads them). At most as many tasks are out as the workers have
        threads, so a worker that dies takes down only the task it was running (Dask marks every task
        held by a dead worker as suspect), and each result is released once it is unpacked. A row whose
        staging, task or unpacking fails gets that error; the batch goes on. Cancels what is left if the
        driver stops."""
        from distributed import as_completed

        names, workers = self.client.run(socket.gethostname), self.workers()
        hosts: dict[str, int] = collections.Counter()   # threads on each machine: each gets a share of its cores
        for address, info in workers.items():
            hosts[names.get(address, "")] += int(info.get("nthreads", 1))
        env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
        slots = max(1, sum(hosts.values()))
        waiting = list(rows)
        out: dict = {}
        running = as_completed()

        def submit_next() -> tuple | None:
            """Stage and submit the next row; a row that cannot be staged comes back as (row, error)."""
            row = waiting.pop(0)
            try:
                grade.stage_shard(course, row)
                payload = {"archive": pack(row.shard, leave_out=(CONFIG,)),
                           "row": dataclasses.replace(row, folder=None, shard=None), "course_id": course_id,
                           "timeout": timeout, "cell_timeout": self.cell_timeout, "sandbox_lines": self.sandbox_lines,
                           "env": env, "fingerprint": code_fingerprint(), "threads_on_host": hosts,
                           "allow_unsafe": self.allow_unsafe}
            except Exception as exc:          # an unreadable file of the learner's, a full disk
                return row, exc
            future = self.client.submit(grade_task, payload, key=f"grade-{row.shard.name}-{uuid.uuid4().hex[:8]}",
                                        pure=False, retries=0)
            out[future] = row
            running.add(future)
            return None

        try:
            while waiting or out:
                while waiting and len(out) < slots:
                    failed = submit_next()
                    if failed is not None:
                        yield failed[0], failed[1], ""
                if not out:
                    continue
                future = next(running)
                row = out.pop(future)
                graded = row.shard.with_name(row.shard.name + ".graded")
                try:
                    answer = future.result()
                    unpack(answer["archive"], graded)      # all or nothing: then it replaces the staged shard
                    shutil.rmtree(row.shard)
                    graded.rename(row.shard)
                except Exception as exc:      # KilledWorker, WorkerUnfit, a lost connection, a bad archive
                    shutil.rmtree(graded, ignore_errors=True)
                    yield row, exc, ""
                    continue
                finally:
                    future.release()
                for name, value in answer["results"].items():
                    setattr(row, name, value)
                yield row, None, answer["where"]
        finally:
            self.client.cancel([f for f in out if not f.done()])
