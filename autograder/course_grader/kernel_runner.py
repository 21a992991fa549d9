"""A process of its own that launches a learner's Triton kernel for the grading judge.

The judge grades a kernel exercise (a checker whose contract names a ``launcher``) by launching the
learner's ``@triton.jit`` function many times. Launched in the learner's kernel, the launch would run
beside whatever the notebook changed there: a cell can replace ``numpy`` functions, ``torch.Tensor``
methods or Triton's compiler, which the interpreter and the launcher call, and write the expected
answer. So the judge asks the learner's kernel only for the kernel as data
(``course_lib.kernels.exercise.export_kernel``: its source, its helpers' and the constants it reads)
and launches it here: a fresh Python that imported torch, triton and course_lib itself, rebuilds the
kernel from that data (``rebuild_kernel``, which checks the data's form before any of it runs) and
answers the judge's call request as the learner's kernel would (``remote.answer_call``: the same
decoding, the same launcher, the same report). The learner's process never touches this one.

It runs in a sandbox of its own (``course_grader.sandbox.Sandbox``, the learner kernel's limits, no
seed files) where the learner's kernel has one, and as a plain child process where grading runs
unsafe (no sandbox).

Protocol: one JSON message per line (``remote.dumps``) on the process's stdin and stdout. The process
says ``{"op": "ready", "protocol": PROTOCOL}`` first; then each request is a judge's "call" request
with the exported kernel under ``"kernel"`` and its answer ``answer_call``'s reply; ``{"op": "end"}``
(or the end of stdin) stops it. The kernel's own output (``print`` in a kernel, Triton's warnings)
goes to stderr, never into the protocol's stream.

Defends against: a notebook that changed its own process (nothing of it is here); a kernel that
prints (stdout is not the channel); data that is not a kernel (``rebuild_kernel`` refuses it); a
launch that hangs or kills the process (the judge's deadline, then a new process for the next call).
Does not defend against: a kernel source that escapes the kernel rule (``_check_kernel_source``):
it would run Python here, and this process's answers are what the judge decodes (still only data).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

__all__ = ["RunnerError", "RunnerTimeout", "RunnerDied", "KernelRunner", "main", "MAX_KERNEL_CHARS"]

#: The most characters of an exported kernel (its sources and globals as JSON) the judge sends on: what
#: ``course_lib.kernels.exercise.KERNEL_DATA_LIMITS`` allows, with room to spare.
MAX_KERNEL_CHARS = 1 << 22


class RunnerError(RuntimeError):
    """The kernel runner could not be started or broke the protocol (infrastructure)."""


class RunnerTimeout(RunnerError):
    """A launch did not answer before its deadline (the process was killed)."""


class RunnerDied(RunnerError):
    """The runner's process ended during a launch (the kernel crashed it, or it ran out of memory)."""


def _send(channel, message: dict) -> None:
    from course_grader import remote

    channel.write(remote.dumps(message) + "\n")
    channel.flush()


def main() -> int:
    """The runner's loop (``python -m course_grader.kernel_runner``): answer call requests until "end"."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")   # the protocol's stream: the original stdout
    os.dup2(2, 1)                                            # print (and C code writing to fd 1) goes to stderr
    from course_grader import remote
    from course_lib.kernels.exercise import rebuild_kernel

    def no_callbacks(message: dict) -> dict:
        return {"op": "error", "message": "a kernel launch has no grader callbacks"}

    folder = Path(tempfile.mkdtemp(prefix="course-kernels-"))
    rebuilt: dict[str, object] = {}
    _send(channel, {"op": "ready", "protocol": remote.PROTOCOL})
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline(remote.LIMITS.max_message + 1)
        if not line:
            return 0
        if not line.endswith(b"\n"):       # over the limit: the rest of it would read as another request
            return 1
        try:
            request = remote.loads(line.decode("utf-8"))
        except (remote.RemoteDataError, UnicodeDecodeError) as exc:
            _send(channel, {"op": "undecodable", "message": f"the request: {str(exc)[:200]}"})
            continue
        op = request.get("op") if type(request) is dict else None
        if op == "end":
            return 0
        name = request.get("fn") if op == "call" else None
        if type(name) is not str:
            _send(channel, {"op": "bad-request"})
            continue
        key = hashlib.sha256(remote.dumps(request.get("kernel")).encode()).hexdigest()
        try:
            if key not in rebuilt:
                target = folder / str(len(rebuilt))
                target.mkdir()
                rebuilt[key] = rebuild_kernel(request.get("kernel"), target)
        except Exception as exc:     # KernelSourceError: data that is not a kernel (the learner's answer)
            _send(channel, {"op": "raised", "type": type(exc).__name__, "message": str(exc)[:2000]})
            continue
        _send(channel, remote.answer_call({name: rebuilt[key]}, request, no_callbacks))


class KernelRunner:
    """The judge's end: starts the runner process on first use (in a sandbox from SANDBOX, a callable
    returning a ``Sandbox``, or, when SANDBOX is None, as a plain child process without the judge's
    secrets in its environment), sends a request, reads the answer before a deadline, and stops it.
    A timed-out or dead runner is killed, and the next call starts a new one."""

    def __init__(self, sandbox: Callable | None = None, *, start_timeout: float = 120.0):
        self._sandbox_factory, self.start_timeout = sandbox, start_timeout
        self._proc: subprocess.Popen | None = None
        self._box = None
        self._log = None
        self.started = 0          # processes started (a test reads it)

    def _start(self) -> None:
        from course_grader import remote

        command = [sys.executable, "-m", "course_grader.kernel_runner"]
        box = self._sandbox_factory() if self._sandbox_factory is not None else None
        self._box = box
        self._log = tempfile.TemporaryFile()
        if box is not None:
            argv, cwd, env = box.argv(command), str(box.host_dir), None
        else:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_JUDGE_", "COURSE_SANDBOX_"))}
            argv, cwd = command, tempfile.gettempdir()
        self._proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, bufsize=0)
        self.started += 1
        self._buffer = b""
        try:
            ready = self._read(time.monotonic() + self.start_timeout)
        except RunnerError as exc:
            self.close()
            raise RunnerError(f"the kernel runner did not start: {exc}") from None
        if ready.get("op") != "ready" or ready.get("protocol") != remote.PROTOCOL:
            self.close()
            raise RunnerError(f"the kernel runner said {str(ready)[:200]} instead of ready")

    def _tail(self) -> str:
        if self._log is None:
            return ""
        with contextlib.suppress(Exception):
            self._log.seek(0, 2)
            size = self._log.tell()
            self._log.seek(max(0, size - 1500))
            return self._log.read().decode(errors="replace").strip()
        return ""

    def _read(self, deadline: float) -> dict:
        """The next message from the runner. Raises RunnerTimeout, RunnerDied, RunnerError."""
        from course_grader import remote

        proc = self._proc
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RunnerTimeout("no answer before the deadline")
                if not selector.select(min(remaining, 1.0)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
                    tail = self._tail().splitlines()[-3:]
                    raise RunnerDied(f"exit status {proc.returncode}" + (f"; its last output: {' | '.join(tail)[:600]}"
                                                                          if tail else ""))
                self._buffer += chunk
                if len(self._buffer) > remote.LIMITS.max_message:
                    raise RunnerError("an answer over the size limit")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = remote.loads(line.decode("utf-8"))
        except (remote.RemoteDataError, UnicodeDecodeError) as exc:
            raise RunnerError(f"an answer that is not the protocol's: {str(exc)[:200]}") from None
        if type(message) is not dict:
            raise RunnerError("an answer that is not a message")
        return message

    def call(self, request: dict, deadline: float) -> dict:
        """Send REQUEST (a judge's call request with the exported kernel under "kernel") and return the
        answer. Raises RunnerTimeout (the process is killed), RunnerDied, RunnerError (not started)."""
        from course_grader import remote

        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        try:
            self._proc.stdin.write((remote.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
            return self._read(deadline)
        except BrokenPipeError:
            self.close()
            raise RunnerDied("it ended before reading the request") from None
        except RunnerError:
            self.close()
            raise

    def close(self) -> None:
        """Stop the process (``end``, then kill), remove its sandbox. Idempotent."""
        proc, box, log, self._proc, self._box, self._log = self._proc, self._box, self._log, None, None, None
        if proc is not None:
            with contextlib.suppress(Exception):
                if proc.poll() is None:
                    proc.stdin.write(b'{"op":"end"}\n')
                    proc.stdin.flush()
                    proc.wait(timeout=2)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(Exception):
                    stream.close()
        if box is not None:
            box.close()
        if log is not None:
            log.close()


if __name__ == "__main__":
    sys.exit(main())
