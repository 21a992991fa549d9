"""nbgrader commands started from a warm process: each command a fresh fork, its imports done once.

Every ``nbgrader`` command the driver runs (one autograde per submission, a generate_assignment and
a generate_feedback per lab, the export) used to be a new Python process that spent about 2 s
importing nbgrader (its jsonschema formats build a parser at import) and, to judge, about 1.5 s
more importing torch and the course's checkers, before it graded anything. Here a
``multiprocessing`` fork server imports them once (``PRELOAD``); each command is then a fork of it,
a new process with its own memory from the first instruction, that runs the same entry point as
``python -m nbgrader`` (``nbgrader.apps.nbgraderapp.main``) with the command's arguments, working
folder, environment and log file.

One command's process never outlives it and never sees another's: a fork starts from the fork
server's state (imported modules, nothing graded), not from an earlier command's, so no learner's
values can reach another's kernel or verdict through the grading process. A command that runs past
its time is killed with its whole process group, as before.

Import-time settings: a module the fork server imported read its environment then, not the
command's. Of what ``PRELOAD`` imports, only traitlets reads one that matters here
(``TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR``: a config file that raises must stop nbgrader);
``start`` sets it before the server imports anything, and each command checks it took effect.

Where a fork server cannot run (not Linux, or a daemonic process such as a Dask worker, which may
not have children), ``available()`` is false and the driver starts ``python -m nbgrader`` as before.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from pathlib import Path

__all__ = ["PRELOAD", "available", "start", "started", "run"]

#: Imported once by the fork server: nbgrader's command line, the course's preprocessors and judge,
#: torch and every lab's checkers (the judge imports a lab's module on its first graded cell).
PRELOAD = ("nbgrader.apps.nbgraderapp", "nbclient", "course_grader.preprocessors", "course_grader.sandbox",
           "course_grader.judge", "course_grader.remote", "course_grader.provenance", "torch",
           "course_lib.grading.contracts", *(f"course_lib.grading.lab{n:02d}" for n in range(1, 7)))
RAISE_CONFIG_ERRORS = "TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR"

_lock = threading.Lock()
_context = None


def available() -> bool:
    """Whether this process can start forks: a fork server exists on this platform and this
    process may have children (a daemonic multiprocessing process, like a Dask worker's, may not)."""
    return ("forkserver" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon)


def started() -> bool:
    return _context is not None


def start() -> None:
    """Start the fork server (once per process) and import ``PRELOAD`` in it.

    Raises: RuntimeError where ``available()`` is false."""
    global _context
    with _lock:
        if _context is not None:
            return
        if not available():
            raise RuntimeError("no fork server here: nbgrader commands run as new processes")
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))
        saved = os.environ.get(RAISE_CONFIG_ERRORS)
        os.environ[RAISE_CONFIG_ERRORS] = "1"      # the server inherits it, and imports traitlets with it
        try:
            from multiprocessing import forkserver
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ[RAISE_CONFIG_ERRORS]
            else:
                os.environ[RAISE_CONFIG_ERRORS] = saved
        _context = context


def _command(args: list[str], cwd: str, log: str, env: dict[str, str]) -> None:
    """The body of one forked command: its own process group (so a timeout kills the kernel with
    it), output to LOG, ENV as its whole environment, then nbgrader's own entry point."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[0:0] = [cwd]                          # as `python -m nbgrader` run in CWD would have it
    from traitlets.config import application
    if not application.TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR:
        print("error: the fork server's traitlets does not stop on a config file that raises", flush=True)
        sys.exit(70)
    sys.argv = ["nbgrader", *args]
    from nbgrader.apps.nbgraderapp import main
    main()


def run(args: list[str], cwd: Path, log: Path, env: dict[str, str], timeout: float | None,
        running: set | None = None) -> int | None:
    """Run ``nbgrader ARGS`` as a fork, in CWD, appending its output to LOG; return its exit code,
    or None when it ran past TIMEOUT seconds (its process group was killed). While it runs, the
    process is in RUNNING (the driver's set of what to kill on SIGTERM)."""
    if _context is None:
        start()
    process = _context.Process(target=_command, args=(list(args), str(cwd), str(log), dict(env)),
                               name=f"nbgrader {args[0] if args else ''}")
    with _lock:
        process.start()
    running = set() if running is None else running
    running.add(process)
    try:
        process.join(timeout)
        timed_out = process.exitcode is None
        if timed_out:
            kill_group(process)
            process.join()
    finally:
        running.discard(process)
    code = process.exitcode
    process.close()                            # its pipe and sentinel now, not at garbage collection
    return None if timed_out else code


def kill_group(process) -> None:
    """SIGKILL PROCESS's group (it leads one from its first instruction), or PROCESS alone when
    it has not made its group yet; nothing for a Process already closed."""
    try:
        pid = process.pid
    except ValueError:                          # a closed multiprocessing Process: it has ended
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
