"""Trusted judge for graded test cells: verdicts from a process learner code cannot reach.

A graded cell runs ``lab01.check_prefill_time(prefill_time, seed=...)`` in the learner's kernel,
where learner code can patch the checker, ``math.isclose`` or ``torch.allclose`` and pass. The
judge reruns the *same, unchanged* checkers in the grading process, with its own ``course_lib``,
and hands them proxies for the learner's functions: a proxy call sends its arguments as plain data
to the kernel, calls the learner's function there and decodes the result strictly
(``course_grader.remote``). Inputs, seeds and references stay in the judge.

Pieces
    HARNESS           the code the judge runs in the kernel: ``remote.serve()``, which answers
                      describe/call requests over the stdin channel for a whole cell (a callback,
                      lab03 find_capacity's ``run(rate)``, is one more round trip inside a call).
    KernelSession     that transport, on a client of its own (shell + stdin), with per-call
                      timeouts (interrupt, then give up), death detection and strict decoding; a
                      kernel exercise's calls go to a process of the judge's own instead
                      (``kernel_runner``), given the kernel's source that the learner's kernel
                      exports as data.
    parse_test_cell   a test cell's ``labNN.check_xxx(fn_name, ..., seed=..., literal kwargs)``
                      statements (``ast``), optionally inside ``for _ in range(N):``.
    judge_cell        runs them under the checker's declared ``Contract`` (writes, objects, probes,
                      references); returns a verdict (hidden checks' messages redacted).
    CourseJudge       the sandbox's nbgrader ``Execute`` step that judges each graded cell after it
                      ran, records the verdict, fails in the notebook a cell only the kernel passed
                      and flags reference reuse (``course_grader.provenance``).

Defends against: learner code patching checkers, course_lib, comparisons or exception hooks in
its kernel (the comparison happens here); rigged return values (decoded by exact type); a function
rewriting a checker's inputs (only the contract's ``writes`` are mirrored); a kernel learning the
hidden inputs (the judge's seed never enters it); a notebook that patches what a kernel launch
uses (numpy, torch.Tensor, Triton's compiler: the launch runs elsewhere); hanging calls (timeout, interrupt, then the
kernel counts as wedged); a kernel that dies or breaks the Jupyter protocol (HMAC, framing);
oversized answers (``remote.LIMITS``); input requests during a call (answered with "", the call
failed). Does not defend against: a function that wraps course_lib's reference (it passes;
provenance flags it); test-cell statements other than checker calls (kernel only: a cell scores
only if both pass, so they can only take points away); learner code feeding dummy calls to a probed
submodule, or replacing the kernel half of the protocol (its answers are still only data); learner
code printing the running cell's source (the feedback redacts its hidden lines).
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import hashlib
import importlib
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from traitlets import Enum, Float, Integer, Unicode

from .kernel_runner import MAX_KERNEL_CHARS, KernelRunner, RunnerDied, RunnerError, RunnerTimeout
from .preprocessors import hidden_regions, redact
from .sandbox import Sandbox, SandboxExecute, SandboxLimits, add_error, blocking, breach_message, protocol_breach, replace_execute_step
from .text import encodable_tree, parse_python
from . import provenance


class _Lazy:
    """A module imported on first attribute access: nbgrader loads this file with the course config
    for every command, and torch (about a second to import) is needed only to judge."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


remote = _Lazy("course_grader.remote")
contracts = _Lazy("course_lib.grading.contracts")

__all__ = ["HARNESS", "JudgeError", "KernelDied", "KernelWedged", "ProtocolError", "LearnerFault",
           "LearnerRaised", "CallTimeout", "KernelSession", "RemoteFunction", "CheckCall", "UnsupportedCell",
           "parse_test_cell", "judge_cell", "judge_seed", "derived_seed", "sha256_seed", "learner_exception",
           "CourseJudge", "configure_nbgrader", "kernel_speed", "nbgrader_config_lines", "disagreements",
           "read_verdicts", "VERDICT_SUFFIX"]

#: Code the judge runs in the learner's kernel: names stay local to a function (learner globals such
#: as ``json = 3`` cannot shadow them), and whatever the kernel then says is checked by the judge.
HARNESS = """\
def __course_judge_session():
    from course_grader import remote
    remote.serve()
try:
    __course_judge_session()
finally:
    del __course_judge_session
"""

VERDICT_SUFFIX = ".judge.json"
PASSED, FAILED, ERROR, UNJUDGED, SKIPPED = "passed", "failed", "error", "unjudged", "skipped"
NOT_DEFINED = "{} is not defined in the notebook (its cell did not run, or raised)"


# == errors ======================================================================================
class JudgeError(RuntimeError):
    """The judgement could not be made (infrastructure, not a wrong answer): verdict "error"."""
    grader_error = True     # a checker passes it on as it is (course_lib.grading.contracts.is_grader_error)


class KernelDied(JudgeError):
    """The learner's kernel died."""


class KernelWedged(JudgeError):
    """The kernel ignored an interrupt after a timeout; it cannot be used any more."""


class ProtocolError(JudgeError):
    """The kernel sent something that is not the harness protocol (malformed or out of order)."""


class LearnerFault(Exception):
    """The learner's side failed a call: function missing, timed out, asked for input, result or
    argument state that cannot be sent as data. Verdict "failed"."""
    grader_error = True     # its message already says what happened: a checker passes it on as it is


class CallTimeout(LearnerFault):
    """A call into the kernel ran past its time limit (the kernel was interrupted)."""


class LearnerRaised(Exception):
    """The learner's function raised in the kernel. Raised judge-side as a subclass that also
    derives from the same builtin (or course_lib) exception class, so a checker's ``except
    ValueError`` treats it as it would in-process; never a ContractError subclass unless the
    kernel's exception was one."""

    kernel_type = "Exception"


class _SessionEnded(Exception):
    def __init__(self, content: dict):
        super().__init__("the harness cell ended")
        self.content = content if isinstance(content, dict) else {}


_RAISED_CLASSES: dict[str, type] = {}


def learner_exception(fn_name: str, kernel_type, message) -> LearnerRaised:
    """The judge-side exception for a learner's function that raised ``kernel_type`` in the kernel:
    a ``LearnerRaised`` that is also the built-in (``remote.BUILTIN_ERRORS``) or course_lib
    exception class of that name, so a checker's ``except ValueError`` still catches it."""
    kernel_type = str(kernel_type)[:120]
    cls = _RAISED_CLASSES.get(kernel_type)
    if cls is None:
        base: type | None = None
        if kernel_type in remote.BUILTIN_ERRORS:
            base = getattr(builtins, kernel_type, None)
        elif kernel_type.startswith("course_lib.") and re.fullmatch(r"[A-Za-z0-9_.]+", kernel_type):
            module, _, name = kernel_type.rpartition(".")
            # only modules the judge has imported already: a name from the kernel never makes it run new code
            candidate = getattr(sys.modules.get(module), name, None)
            if isinstance(candidate, type) and issubclass(candidate, Exception):
                base = candidate
        cls = type("Learner" + (kernel_type.rpartition(".")[2] or "Exception"),
                   (LearnerRaised, base) if base is not None else (LearnerRaised,), {"kernel_type": kernel_type})
        if len(_RAISED_CLASSES) < 256:
            _RAISED_CLASSES[kernel_type] = cls
    return cls(f"{fn_name} raised {kernel_type}: {str(message)[:2000]}")


# == transport ===================================================================================
class KernelSession:
    """Judge-side end of the harness protocol; make one with ``KernelSession.connect``.

    Args:
        client: a started BlockingKernelClient (shell and stdin) of its own for the learner's
            kernel, which routes input requests to the client that sent the execute_request.
        interrupt: callable that interrupts the kernel (``km.interrupt_kernel``), for timeouts.
        is_alive: callable that says whether the kernel process lives (``km.is_alive``).
        poll_interval: seconds between liveness checks while waiting.
        interrupt_grace: seconds a timed-out call gets to stop after the interrupt.
        runner: the ``kernel_runner.KernelRunner`` that launches the learner's kernels (a kernel
            exercise's calls: the learner's kernel only exports the kernel's source); default one
            without a sandbox. ``shutdown`` stops it.

    An input_request during a request whose prompt is not the protocol's (learner code that wrote
    to the stdin channel itself, e.g. ``get_ipython().kernel.raw_input``) is answered with "" so the
    kernel goes on, and the request fails with a ``LearnerFault`` that says so."""

    def __init__(self, client, *, interrupt: Callable | None = None, is_alive: Callable | None = None,
                 poll_interval: float = 0.5, interrupt_grace: float = 10.0, runner=None):
        import zmq

        self.client, self.poll_interval, self.interrupt_grace = client, poll_interval, interrupt_grace
        self.interrupt, self.is_alive = blocking(interrupt), blocking(is_alive)
        self.msg_id: str | None = None     # the open harness execute_request
        self.pending = False                # a harness input_request awaits our reply
        self.dead = self.wedged = False
        self.refused: str | None = None     # the first non-protocol prompt of the current request
        self.answered_after_end = False     # a second answer came (``_drain``): forged answers
        self.calls = self.callbacks = 0
        self.observations: list[tuple[str, tuple[str, ...], bool]] = []   # watched calls (provenance)
        self.launches: list[dict] = []       # each kernel launch's speed fields (kernel_speed)
        self.runner = runner if runner is not None else KernelRunner()
        self._stdin, self._shell = client.stdin_channel, client.shell_channel
        self._poller = zmq.Poller()
        self._poller.register(self._stdin.socket, zmq.POLLIN)
        self._poller.register(self._shell.socket, zmq.POLLIN)

    @classmethod
    def connect(cls, connection_info: dict, *, max_message_bytes: int = 1 << 30, ready_timeout: float = 60.0,
                **kwargs) -> "KernelSession":
        """A session with a client of its own (shell + stdin) for the kernel ``connection_info``
        describes (``km.get_connection_info()``)."""
        import zmq
        from jupyter_client.blocking.client import BlockingKernelClient

        context = zmq.Context()
        context.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)   # a larger message drops the connection
        client = BlockingKernelClient(context=context)
        client.load_connection_info(dict(connection_info))
        client.start_channels(shell=True, iopub=False, stdin=True, hb=False, control=False)
        session = cls(client, **kwargs)
        session._handshake(ready_timeout)
        return session

    def _handshake(self, timeout: float) -> None:
        """kernel_info round trip: the shell (and, started with it, stdin) is connected before the
        first harness input request, which the kernel would drop for an unconnected client."""
        msg_id = self.client.kernel_info()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JudgeError("the kernel did not answer kernel_info")
            if not self._shell.socket.poll(int(1000 * max(0.05, min(self.poll_interval, remaining)))):
                self._check_alive()
                continue
            msg = self._get(self._shell)   # KernelDied on a message that fails verification
            if msg is not None and msg.get("parent_header", {}).get("msg_id") == msg_id:
                break
        time.sleep(0.05)

    # -- low level ---------------------------------------------------------------------------
    def _lost(self, error: JudgeError) -> JudgeError:
        self.dead, self.msg_id, self.pending = True, None, False
        return error

    def _check_alive(self) -> None:
        if self.is_alive is not None:
            try:
                alive = self.is_alive()
            except Exception:
                alive = False
            if not alive:
                raise self._lost(KernelDied("the learner's kernel died"))

    def _reply(self, message: dict | str) -> None:
        self.client.input(message if type(message) is str else remote.dumps(message))
        self.pending = False

    def _get(self, channel):
        """The next message on CHANNEL, or None when there is none. A message that fails
        jupyter_client's checks (HMAC signature, framing, JSON) means the kernel's side of the
        protocol is broken: the session is dead (KernelDied) at once, not after a timeout."""
        from queue import Empty

        try:
            return channel.get_msg(timeout=0)
        except Empty:
            return None
        except Exception as exc:
            raise self._lost(KernelDied(breach_message(protocol_breach(exc) or f"{type(exc).__name__}: {exc}"))) \
                from None

    def _next(self, deadline: float) -> dict:
        """The next harness message (a dict); a prompt that is not the protocol's is answered
        with "" and remembered in ``refused``.

        Raises: CallTimeout, KernelDied, _SessionEnded (the execute_reply came), ProtocolError."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CallTimeout("timed out")
            events = dict(self._poller.poll(int(1000 * min(remaining, self.poll_interval))))
            if not events:
                self._check_alive()
                continue
            msg = self._get(self._stdin) if self._stdin.socket in events else None
            if msg is not None and msg.get("msg_type") == "input_request" \
                    and msg.get("parent_header", {}).get("msg_id") == self.msg_id:
                self.pending = True
                prompt = msg.get("content", {}).get("prompt")
                if type(prompt) is not str or not prompt.startswith(remote.PROMPT):
                    self.refused = self.refused or (prompt if type(prompt) is str else "?")
                    self._reply("")
                    continue
                try:
                    message = remote.loads(prompt[len(remote.PROMPT):])
                except remote.RemoteDataError as exc:
                    raise ProtocolError(f"harness message: {exc}") from None
                if type(message) is not dict or type(message.get("op")) is not str:
                    raise ProtocolError("harness message without an op")
                return message
            msg = self._get(self._shell) if self._shell.socket in events else None
            if msg is not None and msg.get("msg_type") == "execute_reply" and self.msg_id \
                    and msg.get("parent_header", {}).get("msg_id") == self.msg_id:
                self.msg_id, self.pending = None, False
                raise _SessionEnded(msg.get("content", {}))

    # -- session -------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return not (self.dead or self.wedged)

    def open(self, deadline: float) -> None:
        if self.msg_id is not None:
            return
        if not self.usable:
            raise (KernelDied if self.dead else KernelWedged)("the learner's kernel is unusable")
        self.msg_id = self.client.execute(HARNESS, silent=True, store_history=False, allow_stdin=True,
                                          stop_on_error=False)
        try:
            message = self._next(deadline)
        except _SessionEnded as end:
            c = end.content
            raise ProtocolError(f"the harness cell ended at once ({c.get('status')}: {c.get('ename', '')} "
                                f"{str(c.get('evalue', ''))[:200]}); course_grader.remote is missing or "
                                "broken in the kernel") from None
        except CallTimeout:
            self._abort()
            raise JudgeError("the harness did not start in time") from None
        if message.get("op") != "ready" or message.get("protocol") != remote.PROTOCOL:
            raise ProtocolError(f"unexpected first harness message {str(message)[:200]}")

    def close(self, timeout: float = 30.0) -> None:
        """End the harness cell (the kernel is idle again afterwards)."""
        if self.msg_id is None or not self.usable:
            self.msg_id, self.pending = None, False
            return
        try:
            self._drain(time.monotonic() + timeout)
        except CallTimeout:
            self._abort()
        except JudgeError:
            pass

    def _drain(self, deadline: float) -> None:
        """Ask the harness to end (answering any pending request with "end") until the cell
        finishes; returns then, and raises what ``_next`` raises (a timeout, a dead kernel). A
        harness message after an "end" sets ``answered_after_end``: the harness never sends one,
        so something else in the kernel answered the judge in its place."""
        ended = False
        try:
            while True:
                if self.pending:
                    self.answered_after_end |= ended
                    self._reply({"op": "end"})
                    ended = True
                self._next(deadline)
        except _SessionEnded:
            return

    def shutdown(self) -> None:
        """End the harness cell and close this session's client."""
        for step in (lambda: self.close(timeout=10.0), self.runner.close, self.client.stop_channels,
                     lambda: self.client.context.destroy(linger=0)):
            with contextlib.suppress(Exception):
                step()

    def _abort(self) -> None:
        """After a timeout: interrupt, let the harness end, or mark the kernel wedged."""
        if self.interrupt is not None:
            with contextlib.suppress(Exception):
                self.interrupt()
        try:
            self._drain(time.monotonic() + self.interrupt_grace)
        except (CallTimeout, ProtocolError):
            self.wedged, self.msg_id, self.pending = True, None, False
        except KernelDied:
            pass

    def _exchange(self, request: dict, deadline: float, what: str, callbacks: list | None = None,
                  objects: list | None = None) -> dict:
        """Send a request to the open harness; serve callbacks; return its answer. Raises what
        ``_next`` raises, and LearnerFault when learner code asked for input meanwhile."""
        self.open(deadline)
        if not self.pending:
            raise ProtocolError("the harness is not waiting for a request")
        self.refused = None
        self._reply(request)
        while True:
            try:
                message = self._next(deadline)
            except _SessionEnded as end:
                c = end.content
                raise ProtocolError(f"the harness cell ended during a request ({c.get('status')}: "
                                    f"{c.get('ename', '')})") from None
            if message.get("op") != "callback":
                break
            self.callbacks += 1
            self._reply(self.answer_callback(message, callbacks or [], objects or []))
        if self.refused is not None:
            raise LearnerFault(f"{what} asked for input ({self.refused[:80]!r}) while the grader called it; a graded "
                               "function gets its inputs as arguments and must not read stdin")
        return message

    @staticmethod
    def answer_callback(message: dict, callbacks: list, objects: list) -> dict:
        """The judge's reply to a kernel's "callback" message: call ``callbacks[id]`` on the
        strictly decoded arguments and encode what it returns (or the error it raised)."""
        cid = message.get("id")
        if type(cid) is not int or not 0 <= cid < len(callbacks):
            return {"op": "error", "message": "unknown callback"}
        decoder = remote.ResultDecoder(objects)
        try:
            args = decoder.decode(message.get("args", []))
            pairs = message.get("kwargs", [])
            if type(args) is not list or type(pairs) is not list \
                    or any(type(p) is not list or len(p) != 2 or type(p[0]) is not str for p in pairs):
                raise remote.RemoteDataError("bad callback arguments")
            kwargs = {k: decoder.decode(v) for k, v in pairs}
        except remote.RemoteDataError as exc:
            return {"op": "error", "message": f"the grader could not read the arguments: {exc}"}
        try:
            return {"op": "return", "value": remote.CallEncoder(register=False).encode(callbacks[cid](*args, **kwargs))}
        except Exception as exc:
            return {"op": "error", "message": f"{type(exc).__name__}: {exc}"[:500]}

    # -- requests ------------------------------------------------------------------------------
    def describe(self, names: list[str], deadline: float) -> dict[str, dict]:
        """What each name is in the kernel: {name: {defined, callable, module, qualname, type}}."""
        answer = self._exchange({"op": "describe", "names": names}, deadline, ", ".join(names))
        info = answer.get("names") if answer.get("op") == "described" else None
        if type(info) is not dict:
            raise ProtocolError("bad describe answer")
        described = {}
        for n in names:
            entry, described[n] = info.get(n), {"defined": False}
            if type(entry) is dict and entry.get("defined") is True:
                described[n] = {"defined": True, "callable": entry.get("callable") is True,
                                **{key: entry[key][:200] if type(entry.get(key)) is str else ""
                                   for key in ("module", "qualname", "type")}}
        return described

    def call(self, name: str, args: tuple, kwargs: dict, deadline: float, contract=None, watch: list | None = None):
        """Call the kernel's ``name`` on plain-data copies of ``args``/``kwargs`` under the checker's
        ``contract`` (``course_lib.grading.tables.Contract``; None: nothing written back, no probes):
        mirror the in-place changes its ``writes`` allow, replay its ``probes``, and return the
        strictly decoded result. With ``watch`` (``provenance.watch_spec``) the kernel also says
        which of those references' code ran; that is appended to ``observations``. A kernel
        exercise's contract (its ``launcher``) makes the kernel launch ``name`` through the course's
        launcher of that exercise (``course_lib.kernels.exercise.LAUNCHERS``) instead of calling it.

        Raises: LearnerRaised (the function raised), LearnerFault (missing, timeout, input asked,
        result that cannot come back), JudgeError (kernel died/wedged, protocol)."""
        import torch

        encoder = remote.CallEncoder()
        arg_nodes = [encoder.encode(a) for a in args]
        kw_nodes = [[k, encoder.encode(v)] for k, v in kwargs.items()]
        probes = remote.probe_request(encoder.objects, contract.probes if contract is not None else ())
        launcher = contract.launcher if contract is not None else ""
        request = {"op": "call", "fn": name, "args": arg_nodes, "kwargs": kw_nodes, "objects": encoder.table,
                   "grad": bool(torch.is_grad_enabled()), "threads": torch.get_num_threads(), "probes": probes,
                   **({"watch": watch} if watch else {}), **({"via": launcher} if launcher else {})}
        self.calls += 1
        try:
            answer = self._launch(name, request, deadline) if launcher else \
                self._exchange(request, deadline, name, encoder.callbacks, encoder.objects)
        except CallTimeout:
            self._abort()
            raise CallTimeout(f"{name} did not return within the time limit") from None
        if watch:
            reached, watched = answer.get("reached"), {w["reference"] for w in watch}
            valid = type(reached) is list and all(type(r) is str and r in watched for r in reached)
            self.observations.append((name, tuple(sorted(set(reached))) if valid else (),
                                      valid and answer.get("observed") is True))
        decoder = remote.ResultDecoder(encoder.objects)
        try:
            kept = decoder.apply_state(answer.get("state", []), _writable_oids(
                encoder, arg_nodes, kw_nodes, contract.writes if contract is not None else None))
            remote.replay_probes(answer.get("probed", []), encoder.objects, probes)
        except TypeError as exc:
            raise LearnerFault(f"{name}: {exc}") from None
        except remote.RemoteDataError as exc:
            raise ProtocolError(f"{name}: argument state: {exc}") from None
        changed = [oid for oid in kept if isinstance(encoder.objects[oid], torch.Tensor)]
        if changed:
            # course_lib.grading.contracts.call_on_copies: the same rule, in the learner's kernel
            where = next((f"argument {i + 1}" for i, node in enumerate(arg_nodes)
                          if node == {"$": "ref", "id": changed[0]}), "a tensor argument")
            raise LearnerFault(f"{name}: your function changed its tensor {where} in place; a function must leave "
                               "the tensors it is given as they were: work on a copy (x.clone(), torch.cat, "
                               "torch.nn.functional.pad)")
        result = _outcome(name, answer, decoder)
        if launcher and type(result) is tuple and result and type(result[-1]) is dict:     # (outputs..., report)
            self.launches.append({k: result[-1].get(k) for k in ("mode", "bytes", "seconds", "bandwidth_gbps")})
        return result

    def _launch(self, name: str, request: dict, deadline: float) -> dict:
        """A kernel exercise's call: the learner's kernel exports ``name`` as data (``remote.answer_export``)
        and the runner process launches it (``kernel_runner``), so nothing the notebook changed in its own
        process runs at the launch. Returns the call's answer (the export's, when it refused). Raises
        CallTimeout (the export was too slow), LearnerFault (the launch was too slow: the runner is
        stopped, not the learner's kernel; or the launch ended the runner), JudgeError (the runner
        would not start)."""
        exported = self._exchange({"op": "export", "fn": name}, deadline, name)
        op = exported.get("op")
        if op in ("raised", "missing"):     # refused (or missing): no launch ran, so no reference ran either
            answer = {"op": op} if op == "missing" else {"op": op, "type": exported.get("type"),
                                                         "message": exported.get("message")}
            return {**answer, **({"reached": [], "observed": True} if request.get("watch") else {})}
        if op != "exported":      # only the runner's launch answers a kernel exercise's call
            raise ProtocolError(f"the kernel answered the export of {name} with {str(op)[:40]!r}")
        if len(remote.dumps(exported.get("kernel"))) > MAX_KERNEL_CHARS:
            raise LearnerFault(f"{name}: the kernel's source and its helpers' are over {MAX_KERNEL_CHARS:,} characters")
        try:
            return self.runner.call({**request, "kernel": exported.get("kernel")}, deadline)
        except RunnerTimeout:
            raise LearnerFault(f"{name} did not return within the time limit (its launch was stopped)") from None
        except RunnerDied as exc:
            raise LearnerFault(f"{name}: the launch of your kernel ended the process that ran it ({exc})") from None
        except RunnerError as exc:
            raise JudgeError(f"{name}: {exc}") from None


def kernel_speed(launches: list[dict]) -> dict | None:
    """What a graded cell's kernel launches (``KernelSession.launches``: each report's mode, bytes, seconds
    and bandwidth_gbps) say of the kernel's speed, beside its score and never part of it: on a GPU the
    achieved bandwidth (bytes / seconds) of the launch that moved the most bytes, against the device's
    measured copy bandwidth; otherwise that it was not measured (``NOT_MEASURED``). None when the cell
    launched no kernel."""
    from course_lib.kernels.exercise import NOT_MEASURED, SPEED_REPEATS

    if not launches:
        return None

    def number(value) -> bool:
        return type(value) in (int, float) and math.isfinite(value) and value > 0

    timed = [launch for launch in launches if all(number(launch.get(k)) for k in ("bytes", "seconds", "bandwidth_gbps"))]
    if not timed:
        return {"measured": False, "text": NOT_MEASURED}
    largest = max(timed, key=lambda launch: launch["bytes"])
    gbps, peak = largest["bytes"] / largest["seconds"] / 1e9, largest["bandwidth_gbps"]
    return {"measured": True, "gbps": round(gbps, 1), "bandwidth_gbps": round(peak, 1), "bytes": largest["bytes"],
            "seconds": largest["seconds"],
            "text": f"{gbps:.0f} GB/s, {gbps / peak:.0%} of the {peak:.0f} GB/s measured (its largest case, the "
                    f"median of {SPEED_REPEATS} launches)"}


def _outcome(name: str, answer: dict, decoder) -> Any:
    """The decoded result of a call's answer, or the exception that stands for how it failed."""
    op = answer.get("op")
    if op == "returned":
        try:
            return decoder.decode(answer.get("value"))
        except remote.RemoteDataError as exc:
            raise ProtocolError(f"{name}: result: {exc}") from None
    if op == "raised":
        raise learner_exception(name, answer.get("type"), answer.get("message"))
    faults = {"missing": NOT_DEFINED.format(name),
              "unencodable": f"{name} returned a value that cannot be sent as plain data"}
    if op in faults:
        raise LearnerFault(faults[op])
    if op == "undecodable":
        raise ProtocolError(f"the kernel could not rebuild the arguments of {name}: {str(answer.get('message'))[:300]}")
    raise ProtocolError(f"unexpected harness answer {str(op)[:40]!r}")


def _writable_oids(encoder, arg_nodes: list, kw_nodes: list, writes) -> set[int]:
    """Object ids the learner's function may change: the arguments the contract's ``writes``
    (``Writes``; None: none) names or whose class it lists, and every object their nodes refer to."""
    if not writes:
        return set()
    roots = [n for i, n in enumerate(arg_nodes) if i in writes.args] + [n for k, n in kw_nodes if k in writes.kwargs]
    todo = _refs(roots) + [oid for oid, obj in enumerate(encoder.objects) if isinstance(obj, writes.types)]
    nodes, allowed = dict(encoder.table), set()
    while todo:
        oid = todo.pop()
        if oid not in allowed:
            allowed.add(oid)
            todo.extend(_refs(nodes[oid]))
    return allowed


def _refs(node) -> list[int]:
    """The object ids of the ``ref`` nodes inside NODE (a CallEncoder node tree)."""
    if isinstance(node, list):
        return [oid for item in node for oid in _refs(item)]
    if isinstance(node, dict):
        return [node["id"]] if node.get("$") == "ref" else [oid for value in node.values() for oid in _refs(value)]
    return []


class RemoteFunction:
    """Stands in, judge-side, for a learner function in the kernel. ``__module__``/``__qualname__``
    are what the kernel reported (so ``check_own_function`` refuses course_lib's own reference as
    it would in-process). For a kernel exercise, ``launches`` names the exercise whose launcher its
    calls go through (``course_lib.kernels.exercise.launcher`` returns it as it is)."""

    def __init__(self, session: KernelSession, name: str, info: dict, deadline: Callable[[], float],
                 contract=None, watch: list | None = None):
        self._session, self._deadline, self._contract, self._watch = session, deadline, contract, watch
        self.launches = (contract.launcher if contract is not None else "") or None
        self.__name__ = name
        self.__qualname__ = info.get("qualname") or name
        self.__module__ = info.get("module") or ""

    def __call__(self, *args, **kwargs):
        return self._session.call(self.__name__, args, kwargs, self._deadline(), self._contract, self._watch)

    def __repr__(self) -> str:
        return f"<learner function {self.__name__} (in the kernel)>"


# == test cells ==================================================================================
class UnsupportedCell(ValueError):
    """A test cell whose checker calls the judge cannot read (a course-authoring problem)."""


class _Fresh:
    def __repr__(self) -> str:
        return "fresh_seed()"


FRESH = _Fresh()


@dataclass(frozen=True)
class KernelName:
    """A keyword argument that names a kernel object (``model=toy``)."""
    name: str


@dataclass
class CheckCall:
    """One checker call of a test cell."""
    module: str                    # "lab01"
    checker: str                   # "check_prefill_time"
    functions: list[str]           # learner function names, in order
    kwargs: dict[str, Any]         # literals, FRESH, or KernelName
    hidden: bool                   # inside the hidden-tests block, or drawing fresh_seed()
    line: int
    repeat: int = 1

    @property
    def label(self) -> str:
        return f"{self.module}.{self.checker}({', '.join(self.functions)})"


_CHECKER_MODULE = re.compile(r"lab\d\d")


def _checker_target(node) -> tuple[str, str] | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and isinstance(node.func.value, ast.Name) and _CHECKER_MODULE.fullmatch(node.func.value.id) \
            and node.func.attr.startswith("check_"):
        return node.func.value.id, node.func.attr
    return None


def parse_test_cell(source: str) -> tuple[list[CheckCall], int]:
    """Checker calls of a test cell's source, and the number of other top-level statements
    (asserts, prints, set-up: they run in the kernel only and are not judged).

    Raises:
        UnsupportedCell: a ``labNN.check_*`` call the judge cannot evaluate (inside an if/with/def,
            with a non-name positional argument, ``*args``/``**kwargs``, or a keyword value that is
            neither a literal, ``fresh_seed()`` nor a plain name), or a syntax error.
    """
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        raise UnsupportedCell(f"test cell does not parse: {exc}") from None
    hidden = {number for number, (_, _, inside, _) in enumerate(hidden_regions(source), 1) if inside}
    calls: list[CheckCall] = []
    other = 0

    def checker_call(node: ast.Call, target, repeat: int) -> CheckCall:
        module, checker = target
        names = []
        for arg in node.args:
            if not isinstance(arg, ast.Name):
                raise UnsupportedCell(f"line {node.lineno}: {module}.{checker} takes learner functions by name; "
                                      f"got {ast.unparse(arg)!r}")
            names.append(arg.id)
        kwargs: dict[str, Any] = {}
        fresh = False
        for kw in node.keywords:
            if kw.arg is None:
                raise UnsupportedCell(f"line {node.lineno}: **kwargs in a checker call")
            value = kw.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "fresh_seed" \
                    and not value.args and not value.keywords:
                kwargs[kw.arg] = FRESH
                fresh = True
            elif isinstance(value, ast.Name):
                kwargs[kw.arg] = KernelName(value.id)
            else:
                try:
                    kwargs[kw.arg] = ast.literal_eval(value)
                except (ValueError, SyntaxError, TypeError):
                    raise UnsupportedCell(f"line {node.lineno}: keyword {kw.arg}={ast.unparse(value)!r} is not a "
                                          "literal, fresh_seed() or a name") from None
        lines = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        return CheckCall(module, checker, names, kwargs, hidden=fresh or bool(lines & hidden), line=node.lineno,
                         repeat=repeat)

    def walk(statements, repeat: int) -> None:
        nonlocal other
        for stmt in statements:
            if isinstance(stmt, ast.Expr) and _checker_target(stmt.value):
                calls.append(checker_call(stmt.value, _checker_target(stmt.value), repeat))
                continue
            if isinstance(stmt, ast.For) and not stmt.orelse and isinstance(stmt.target, ast.Name) \
                    and isinstance(stmt.iter, ast.Call) and isinstance(stmt.iter.func, ast.Name) \
                    and stmt.iter.func.id == "range" and len(stmt.iter.args) == 1 and not stmt.iter.keywords \
                    and isinstance(stmt.iter.args[0], ast.Constant) and type(stmt.iter.args[0].value) is int \
                    and any(_checker_target(n) for n in ast.walk(stmt)):
                walk(stmt.body, repeat * max(0, stmt.iter.args[0].value))
                continue
            if any(_checker_target(n) for n in ast.walk(stmt)):
                raise UnsupportedCell(f"line {stmt.lineno}: a checker call inside "
                                      f"{type(stmt).__name__.lower()} (only plain statements and "
                                      "'for _ in range(N):' are judged)")
            other += 1

    walk(tree.body, 1)
    return calls, other


# == seeds =======================================================================================
def judge_seed(explicit: int | None = None) -> int:
    """The judge's base seed: ``explicit``; else $COURSE_JUDGE_SEED; else one derived from
    $COURSE_GRADING_SEED (so ``grade.py --seed N`` replays the judge too, yet the kernel's
    ``fresh_seed()`` draws different inputs); else 32 fresh random bits."""
    if explicit is not None:
        return int(explicit)
    for var, derive in (("COURSE_JUDGE_SEED", False), ("COURSE_GRADING_SEED", True)):
        value = os.environ.get(var)
        if value:
            try:
                number = int(value)
            except ValueError:
                continue
            return derived_seed(number, "judge") if derive else number
    return int.from_bytes(os.urandom(4), "little")


def sha256_seed(*parts, sep: str = "\0") -> int:
    """A 32-bit seed derived from ``parts``: the first 4 bytes (little-endian) of the sha256 of
    their text joined by ``sep``. Every seed the grader derives from another (the judge's per-cell
    seeds here, the driver's per-submission seeds in ``grade``) goes through it."""
    text = sep.join(str(p) for p in parts)   # surrogatepass: text with lone surrogates (undecodable file names)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:4], "little")


def derived_seed(base: int, *parts) -> int:
    """32 bits of sha256("course-judge:base:parts"): one seed per (cell, fresh_seed() occurrence)."""
    return sha256_seed("course-judge", base, *parts, sep=":")


# == judging a cell ==============================================================================
def declared_contract(module: str, checker: str):
    """The ``Contract`` of ``course_lib.grading.MODULE.CONTRACTS`` whose checker is CHECKER (a
    function of that module): the checker the judge runs, what the learner's functions may write,
    the notebook objects the judge rebuilds, the probes it replays and the references it watches.

    Raises:
        UnsupportedCell: MODULE is not a lab module name (``labNN``), or the lab declares no
            contract for CHECKER (a graded cell may call only declared checkers).
    """
    if not _CHECKER_MODULE.fullmatch(module) or not checker.startswith("check_"):
        raise UnsupportedCell(f"{module}.{checker} is not a course checker")
    mod = importlib.import_module(f"course_lib.grading.{module}")
    for contract in getattr(mod, "CONTRACTS", ()):
        if contract.checker.__name__ == checker and contract.checker.__module__ == mod.__name__:
            return contract
    raise UnsupportedCell(f"course_lib.grading.{module}.CONTRACTS declares no contract for {checker}")


def _substitute(name: str, contract, cache: dict):
    """The judge's own copy of the notebook object NAME, built as the contract's ``objects`` say."""
    if name not in contract.objects:
        raise UnsupportedCell(f"keyword value {name!r} names a kernel object the judge has no substitute for")
    if name not in cache:
        cache[name] = contract.build_object(name)
    return cache[name]


def _plan(calls: list[CheckCall], seed: int, grade_id: str) -> list[tuple[CheckCall, dict, dict]]:
    """One (call, fresh seeds, record) per checker run; ``fresh_seed()`` occurrence k of the cell
    (repeats counted) becomes ``derived_seed(seed, grade_id, k)``."""
    plan, fresh = [], 0
    for call in calls:
        for repeat in range(call.repeat):
            seeds = {}
            for key, value in call.kwargs.items():
                if value is FRESH:
                    seeds[key] = derived_seed(seed, grade_id, fresh)
                    fresh += 1
            plan.append((call, seeds, {
                "checker": f"{call.module}.{call.checker}", "functions": list(call.functions), "line": call.line,
                "hidden": call.hidden, "repeat": repeat, "status": SKIPPED, "message": "", "seconds": 0.0,
                "calls": 0, "callbacks": 0}))
    return plan


def _run_check(session: KernelSession, call: CheckCall, seeds: dict, record: dict, deadline: Callable[[], float],
               cache: dict) -> None:
    """Run one checker with proxies for the learner's functions; raises what the check raises."""
    if deadline() <= time.monotonic():
        raise CallTimeout("the judge's time for this cell ran out")
    contract = declared_contract(call.module, call.checker)
    watch = provenance.watch_spec(contract.references)
    if contract.references:
        record["references"] = list(contract.references)
    kwargs = {key: seeds[key] if value is FRESH else
              _substitute(value.name, contract, cache) if isinstance(value, KernelName) else value
              for key, value in call.kwargs.items()}
    info = session.describe(call.functions, deadline())
    proxies = []
    for name in call.functions:
        if not info[name].get("defined"):
            raise LearnerFault(NOT_DEFINED.format(name))
        proxies.append(RemoteFunction(session, name, info[name], deadline, contract, watch) if info[name]["callable"]
                       else remote.opaque_class(info[name].get("type") or "object")())
    contract.checker(*proxies, **kwargs)


def _judged(session: KernelSession, call: CheckCall, seeds: dict, record: dict, **kwargs) -> None:
    """``_run_check`` with its outcome written into ``record``: status (a contract broken, the
    learner's exception or fault: failed; the judge unable to judge: error), message (redacted when
    the check is hidden), seconds, calls, callbacks and what the reference watch saw."""
    start, calls, callbacks, seen = time.monotonic(), session.calls, session.callbacks, len(session.observations)
    status, message = PASSED, ""
    try:
        _run_check(session, call, seeds, record, **kwargs)
    except UnsupportedCell as exc:
        status, message = ERROR, f"the judge cannot run this check: {exc}"
    except JudgeError as exc:
        status, message = ERROR, f"{type(exc).__name__}: {exc}"
    except (contracts.ContractError, LearnerRaised, LearnerFault) as exc:
        status, message = FAILED, str(exc)
    except Exception as exc:  # the checker could not go on with what came back (e.g. a stand-in)
        status, message = FAILED, f"the check stopped: {type(exc).__name__}: {str(exc)[:500]}"
    record.update(status=status, seconds=round(time.monotonic() - start, 4), calls=session.calls - calls,
                  callbacks=session.callbacks - callbacks, message=redact(message) if call.hidden else message)
    if record.get("references"):
        record.update(provenance.runtime_summary(session.observations[seen:]))


def judge_cell(session: KernelSession, source: str, *, grade_id: str = "", seed: int = 0,
               cell_timeout: float = 300.0, call_timeout: float = 60.0, log: Callable | None = None) -> dict:
    """Judge one graded test cell against a live kernel (a KernelSession) in which the learner's
    cells have run. ``source`` is the cell's trusted source (with its hidden tests); ``fresh_seed()``
    occurrence k of the cell draws ``derived_seed(seed, grade_id, k)``; ``cell_timeout`` and
    ``call_timeout`` are seconds for the whole cell and for one call; ``log`` gets a line per check.

    Returns a JSON-able dict: grade_id, status (passed / failed / error / unjudged), message (the
    first non-passing check's; redacted when that check is hidden), checks (one record per checker
    run: status, message, seconds, calls; like the cell, the rest are "skipped" after the first that
    does not pass), kernel_only (statements not judged), seconds and, when the cell launched a kernel,
    speed (``kernel_speed``)."""
    start = time.monotonic()
    verdict: dict[str, Any] = {"grade_id": grade_id, "status": UNJUDGED, "message": "", "checks": [],
                               "kernel_only": 0, "seconds": 0.0}
    try:
        calls, verdict["kernel_only"] = parse_test_cell(source)
    except UnsupportedCell as exc:
        return dict(verdict, status=ERROR, message=f"the judge cannot read this test cell: {exc}")
    if not calls:
        return dict(verdict, message="no labNN.check_* call in this cell: judged in the kernel only")
    plan = _plan(calls, seed, grade_id)
    verdict["checks"] = [record for _, _, record in plan]
    session.answered_after_end = False
    launched = len(session.launches)
    cache: dict = {}

    def deadline() -> float:          # of the next call: its own timeout, within the cell's
        return min(start + cell_timeout, time.monotonic() + call_timeout)

    for call, seeds, record in plan:
        _judged(session, call, seeds, record, cache=cache, deadline=deadline)
        if log is not None:
            log(f"judge {grade_id} {call.label}{' [hidden]' if call.hidden else ''}: {record['status']} "
                f"({record['seconds']:.2f} s, {record['calls']} calls)")
        if record["status"] != PASSED:
            break
    with contextlib.suppress(Exception):
        session.close()
    if session.answered_after_end:    # the verdict rests on answers the harness did not give
        verdict["checks"].append({"checker": "the judge's session", "hidden": False, "status": FAILED,
                                  "message": "the kernel answered again after the judge ended the session: code "
                                  "in the kernel answered the judge in the harness's place"})
    worst = next((r for r in verdict["checks"] if r["status"] in (ERROR, FAILED)), None)   # the last one run
    verdict["status"] = PASSED if worst is None else worst["status"]
    if worst is not None:
        verdict["message"] = f"{worst['checker']}{' (hidden test)' if worst['hidden'] else ''}: {worst['message']}"
    speed = kernel_speed(session.launches[launched:])
    if speed is not None:
        verdict["speed"] = speed
    verdict["seconds"] = round(time.monotonic() - start, 4)
    return verdict


# == nbgrader ====================================================================================
def _in_kernel_passed(cell) -> bool:
    """The course rule: a test cell fails in the kernel only with an error output."""
    return not any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def _trusted_source(cell, resources: dict) -> str | None:
    """The test cell's source from the gradebook (what generate_assignment recorded), else the
    cell's own source when the cell is locked (OverwriteCells restored it from the gradebook)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    info = (resources or {}).get("nbgrader") or {}
    if info.get("db_url") and meta.get("grade_id"):
        try:
            from nbgrader.api import Gradebook

            with Gradebook(info["db_url"]) as gb:
                return gb.find_source_cell(meta["grade_id"], info["notebook"], info["assignment"]).source
        except Exception:
            pass
    return cell.get("source") if meta.get("locked") else None


def _error_verdict(grade_id: str, message: str) -> dict:
    return {"grade_id": grade_id, "status": ERROR, "checks": [], "kernel_only": 0, "seconds": 0.0, "message": message}


def _write_record(path: str, record: dict) -> None:
    """Write a verdict record as JSON to PATH: through a device or pipe as it is (never renamed over
    /dev/null), else to a temporary file renamed over PATH, which replaces a planted symlink
    instead of writing through it."""
    text = json.dumps(record, indent=1)
    if os.path.exists(path) and not os.path.islink(path) and not os.path.isfile(path):
        Path(path).write_text(text)
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


class CourseJudge(SandboxExecute):
    """The course's Execute step: the sandbox's ``SandboxExecute`` (its kernels, output caps and
    rules for timeouts and dead kernels) that judges every graded test cell right after it ran,
    against the same kernel. A cell the kernel passed and the judge did not gets an error output
    (``JudgeVerdict``; ``ReferenceReuse`` under ``reference_reuse="zero"``), so nbgrader's
    SaveAutoGrades scores it 0 and the feedback says why; the verdict records only explain.
    Configure as ``c.CourseJudge.<trait>``; ``c.SandboxExecute.*`` and ``c.Execute.*`` apply too."""

    seed = Integer(None, allow_none=True, help="Base seed of the judge's hidden tests (default: "
                   "$COURSE_JUDGE_SEED, else derived from $COURSE_GRADING_SEED, else random)").tag(config=True)
    call_timeout = Float(60.0, help="Seconds one call into the kernel may take").tag(config=True)
    cell_timeout = Float(None, allow_none=True, help="Seconds the judge may spend on one cell (default: "
                         "Execute.timeout, else 300)").tag(config=True)
    verdict_path = Unicode("", help="Where to write the verdicts JSON (default: "
                           "{notebook}.judge.json next to the notebook; '-': nowhere)").tag(config=True)
    reference_reuse = Enum(["flag", "zero"], "flag", help="A graded test whose learner functions reach "
                           "course_lib's reference for that exercise (its contract's references; "
                           "course_grader.provenance) is flagged in its verdict; 'zero' also scores it 0 "
                           "(a ReferenceReuse error output in the cell)").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._judge_session = None
        self._judge_verdicts: list[dict] = []
        self._judge_base = judge_seed(self.seed)
        self._judge_resources = resources or {}
        self._judge_nb = nb
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._judge_disconnect()
            self._judge_write()

    def preprocess_cell(self, cell, resources, index):
        self._judge_index = index
        restarts = self.kernel_restarts
        cell, resources = super().preprocess_cell(cell, resources, index)
        if self.kernel_restarts != restarts:
            self._judge_disconnect()          # a wedged kernel was restarted: reconnect
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution"):
            self._judge(cell, resources or self._judge_resources)
        return cell, resources

    def _judge(self, cell, resources) -> None:
        meta = cell.metadata.nbgrader
        grade_id = meta.get("grade_id", f"cell{len(self._judge_verdicts)}")
        in_kernel = _in_kernel_passed(cell)
        died_in = self.kernel_died_in                        # the kernel is gone
        timed_out = any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError"
                        for o in cell.get("outputs", []))
        skipped = died_in is not None or timed_out           # scores 0 already: no second timeout
        if skipped:
            verdict = _error_verdict(grade_id, f"not judged: the kernel died in cell {died_in}"
                                     if died_in is not None else "not judged: the cell timed out in the kernel")
        else:
            verdict = self._judge_verdict(cell, resources, grade_id)
        verdict.update(points=float(meta.get("points", 0) or 0), in_kernel_passed=in_kernel)
        verdict["disagrees"] = verdict["status"] != UNJUDGED and (verdict["status"] == PASSED) != in_kernel
        self._judge_verdicts.append(verdict)
        if not skipped and in_kernel and verdict["status"] in (FAILED, ERROR):
            what = "failed" if verdict["status"] == FAILED else "could not judge"
            add_error(cell, "JudgeVerdict", f"the trusted judge {what} this test: {verdict['message']}")

    def _judge_verdict(self, cell, resources, grade_id: str) -> dict:
        source = _trusted_source(cell, resources)
        if source is None:
            return _error_verdict(grade_id, "no trusted source for this test cell (not in the gradebook, not locked)")
        try:
            verdict = judge_cell(self._judge_connect(), source, grade_id=grade_id, seed=self._judge_base,
                                 cell_timeout=self.cell_timeout or float(getattr(self, "timeout", None) or 300),
                                 call_timeout=self.call_timeout, log=self.log.info)
        except Exception as exc:  # JudgeError, or a judge bug: never crash the notebook's grading
            if not isinstance(exc, JudgeError):
                self.log.exception("judge: crashed on %s", grade_id)
            verdict = _error_verdict(grade_id, f"{type(exc).__name__}: {exc}")
        if self._judge_session is not None and self._judge_session.dead:
            # the sandbox's rule for a dead kernel: later cells are not run and get a KernelDied
            # error. A kernel the judge found dead may still run (its messages failed verification).
            verdict["message"] += " (the kernel died while being judged)"
            self._judge_disconnect()
            self._stop_kernel(self._judge_index, f"not run: the kernel died in cell {self._judge_index} "
                              "while the judge called its functions")
        self._judge_reuse(cell, verdict)
        return verdict

    def _judge_reuse(self, cell, verdict: dict) -> None:
        """Flag (and under reference_reuse='zero', fail) a cell whose learner functions reach
        their exercise's reference, from the notebook's code before the cell and from what the
        kernel observed during the judge's calls (course_grader.provenance)."""
        try:
            reuse = provenance.assess(self._judge_nb.cells[:self._judge_index], verdict,
                                      zero=self.reference_reuse == "zero")
        except Exception:  # a bug in the analysis must not stop the grading
            self.log.exception("judge: the reference-reuse check crashed on %s", verdict.get("grade_id"))
            return
        if not reuse:
            return
        verdict["reference_reuse"] = reuse
        self.log.warning("judge: %s reaches course_lib's reference %s%s", verdict.get("grade_id"),
                         ", ".join(reuse["references"]) or "(call-time check switched off)",
                         " (scored 0)" if reuse["zeroed"] else "")
        if reuse["zeroed"] and _in_kernel_passed(cell):
            add_error(cell, "ReferenceReuse", f"this test scores 0: the course does not accept course_lib's own "
                      f"reference ({', '.join(reuse['references'])}) as the exercise's answer")

    def _judge_connect(self) -> KernelSession:
        if self._judge_session is None or not self._judge_session.usable:
            self._judge_disconnect()
            self._judge_session = KernelSession.connect(self.km.get_connection_info(session=False),
                                                        interrupt=self.km.interrupt_kernel, is_alive=self.km.is_alive,
                                                        runner=KernelRunner(self._runner_sandbox()))
        return self._judge_session

    def _runner_sandbox(self) -> Callable | None:
        """What makes the kernel runner's sandbox: one like the learner kernel's (its limits, binds, devices
        and environment, no seed files); None when the kernel has none (grading runs unsafe)."""
        km = self.km
        if getattr(km, "sandbox", None) is None:
            return None
        return functools.partial(Sandbox, SandboxLimits.from_dict(km.limits), extra_ro_binds=km.extra_ro_binds,
                                 devices=km.devices, env_passthrough=km.env_passthrough)

    def _judge_disconnect(self) -> None:
        if self._judge_session is not None:
            self._judge_session.shutdown()
            self._judge_session = None

    def _judge_write(self) -> None:
        resources = self._judge_resources or {}
        info = resources.get("nbgrader") or {}
        path = self.verdict_path
        if not path:
            folder = (resources.get("metadata") or {}).get("path")
            name = info.get("notebook") or (resources.get("metadata") or {}).get("name")
            if not folder or not name:
                return
            path = os.path.join(folder, name + VERDICT_SUFFIX)
        record = {"protocol": remote.PROTOCOL, "student": info.get("student"),
                  "assignment": info.get("assignment"), "notebook": info.get("notebook"),
                  "judge_seed": self._judge_base, "cells": self._judge_verdicts}
        with contextlib.suppress(Exception):   # code that may hide calls from the reference check
            record["dynamic_code"] = provenance.analyse(provenance.notebook_cells(self._judge_nb.cells)).dynamic
        encodable_tree(record)         # learner text in messages: UTF-8 writers must not fail on it
        resources["course_judge"] = record
        if path != "-":                # "-": keep the verdicts in memory only
            _write_record(path, record)


def configure_nbgrader(c) -> type:
    """Judge every graded cell during ``nbgrader autograde``: ``CourseJudge`` becomes the Execute
    step of ``c.Autograde.autograde_preprocessors`` (``sandbox.replace_execute_step``). Returns it."""
    replace_execute_step(c, CourseJudge)
    return CourseJudge


def nbgrader_config_lines() -> list[str]:
    """Lines for a (generated) nbgrader_config.py, after the course config and the sandbox lines."""
    return [
        "# Trusted judge of graded cells (course_grader.judge)",
        "from course_grader import judge as _jd",
        "_jd.configure_nbgrader(c)",
    ]


# == after autograde ==============================================================================
def read_verdicts(folder: str | os.PathLike, student: str | None = None, assignment: str | None = None) -> list[dict]:
    """The verdict records ``{student}/{assignment}/{notebook}.judge.json`` under ``folder`` (nbgrader's
    autograded folder, or a learner's or assignment's folder in it) whose recorded student,
    assignment and notebook match their path (and STUDENT / ASSIGNMENT when given). No score rests on
    them (``CourseJudge``'s error outputs do), but unsandboxed the learner's kernel could write there."""
    records = []
    for path in sorted(Path(folder).rglob("*" + VERDICT_SUFFIX)):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            record = encodable_tree(json.loads(path.read_text()))  # the kernel could write it, unsandboxed
        except (OSError, ValueError):
            continue
        where = (path.name[:-len(VERDICT_SUFFIX)], path.parent.name, path.parent.parent.name)
        if isinstance(record, dict) and isinstance(record.get("cells"), list) \
                and (record.get("notebook"), record.get("assignment"), record.get("student")) == where \
                and student in (None, where[2]) and assignment in (None, where[1]):
            records.append(dict(record, path=str(path)))
    return records


def disagreements(records: list[dict]) -> list[dict]:
    """The judged cells of verdict RECORDS (``read_verdicts``) where the kernel's result and the
    judge's differ, one dict each: learner, lab (assignment), notebook, cell, points, in_kernel
    (passed/failed), judge (status), score, message. The score is 0: either the kernel failed the
    cell, or the judge did not pass it and ``CourseJudge`` put an error output in it. Scores come
    from the autograded notebook alone; these records only explain them (the driver's flags). The
    rule is ``CourseJudge``'s, stored in each verdict as ``disagrees``."""
    return [{"learner": record.get("student"), "lab": record.get("assignment"), "notebook": record.get("notebook"),
             "cell": verdict.get("grade_id"), "points": verdict.get("points"),
             "in_kernel": PASSED if verdict.get("in_kernel_passed") else FAILED, "judge": verdict.get("status"),
             "score": 0.0, "message": verdict.get("message", "")}
            for record in records for verdict in record.get("cells", [])
            if isinstance(verdict, dict) and verdict.get("disagrees") is True]
