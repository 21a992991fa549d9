#!/usr/bin/env python
"""Trusted judge for graded test cells: verdicts from a process learner code cannot reach.

Today a graded cell runs ``lab01.check_prefill_time(prefill_time, seed=...)`` inside the
learner's kernel, where learner code can patch the checker, ``math.isclose`` or
``torch.allclose`` and pass. The judge runs the *same, unchanged* checkers in the grading
process instead, with its own untouched ``course_lib``, and gives them proxies in place of
the learner's functions. Calling a proxy sends the arguments as plain data to the kernel,
calls the learner's function there (looked up by name in the kernel's namespace) and
decodes the plain-data result strictly (``course_grader.remote``: JSON plus raw tensor
bytes, no pickle). Inputs are drawn and references computed in the judge, from the judge's
own seed; the comparison happens in the judge. Only data crosses; whatever the kernel
sends is at worst a wrong answer.

Pieces
    HARNESS                 the code string the judge executes in the kernel; it imports
                            ``course_grader.remote`` and runs ``serve()``, a loop that
                            answers describe/call requests over the stdin channel
                            (input_request prompts carry the kernel's messages, input_reply
                            values the judge's), so one execute_request serves a whole cell
                            and a callback (lab03 find_capacity's ``run(rate)``) is one more
                            round trip inside a call.
    KernelSession           that transport, over a jupyter_client BlockingKernelClient of
                            its own (shell + stdin channels), with per-call timeouts
                            (interrupt, then give up), death detection and strict decoding.
    parse_test_cell         the checker calls of a test cell's source (``ast``): only
                            ``labNN.check_xxx(fn_name, ..., seed=..., cases=..., literal kwargs)``
                            statements, optionally inside ``for _ in range(N):``.
    judge_cell              runs them with proxies; returns a verdict dict (passed / failed /
                            error / unjudged, message; hidden checks' messages redacted).
                            In-place changes the kernel reports are applied to the judge's
                            objects only for the arguments a checker expects to change
                            (the contract's ``writes``), so learner code cannot rewrite a checker's inputs.
    CourseJudge             an nbgrader ``Execute`` mixin: after each graded cell has run
                            normally, judges it against the same live kernel, stores the
                            verdict in the cell metadata and ``{notebook}.judge.json`` next
                            to the autograded notebook and (``enforce``) adds an error output
                            to a cell the kernel passed but the judge did not, so stock
                            SaveAutoGrades scores it 0 and the feedback says why. It also
                            flags a cell whose learner functions reach the exercise's
                            reference (``course_grader.provenance``; ``reference_reuse``).
    configure_nbgrader(c)   swaps Execute (or the sandbox's SandboxExecute) for its judged
                            subclass in ``c.Autograde.autograde_preprocessors``.
    apply_verdicts          for the driver after autograde: writes the judge's verdicts into
                            the gradebook and lists every cell where kernel and judge disagree.

Command line (measurement and debugging): ``python -m course_grader.judge NOTEBOOK... [--source
solutions] [--seed N] [--json FILE]`` runs each notebook in a plain local kernel (no sandbox, no
gradebook; with --source the test cells, hidden tests included, come from the source notebook
as in ``nbgrader autograde``), judges every graded cell and prints kernel and judge verdicts
and timings.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import json
import os
import re
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .sandbox import blocking, breach_message, iopub_ready, protocol_breach
from .text import encodable_tree, parse_python
from . import provenance


class _Lazy:
    """A module imported on first attribute access. nbgrader loads this file with the course
    config for every command (generate_assignment, export, ...); course_lib.grading imports
    torch (about a second), which only the judging during autograde needs."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


remote = _Lazy("course_grader.remote")
contracts = _Lazy("course_lib.grading.contracts")

__all__ = ["HARNESS", "JudgeError", "KernelDied", "KernelWedged", "ProtocolError", "LearnerFault",
           "LearnerRaised", "CallTimeout", "KernelSession", "RemoteFunction", "CheckCall", "UnsupportedCell",
           "parse_test_cell", "judge_cell", "redact", "judge_seed", "derived_seed", "sha256_seed", "learner_exception",
           "make_judge_execute", "configure_nbgrader", "nbgrader_config_lines", "apply_verdicts", "read_verdicts",
           "VERDICT_SUFFIX"]

#: Code executed in the learner's kernel for a judging session. Names stay local to a function
#: (learner globals such as ``json = 3`` cannot shadow them); ``import`` resolves through the
#: frame's builtins, not globals. Anything the kernel then says is checked by the judge.
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
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
# What a checker lets the learner's functions change in place, and which notebook objects the
# judge rebuilds on its side (``model=toy``: the kernel's own object is never used), are declared
# once, in each lab's CONTRACTS table (course_lib.grading.tables.Contract): see declared_contract.


# == errors ======================================================================================
class JudgeError(RuntimeError):
    """The judgement could not be made (infrastructure, not a wrong answer): verdict "error"."""


class KernelDied(JudgeError):
    """The learner's kernel died."""


class KernelWedged(JudgeError):
    """The kernel ignored an interrupt after a timeout; it cannot be used any more."""


class ProtocolError(JudgeError):
    """The kernel sent something that is not the harness protocol (malformed or out of order)."""


class LearnerFault(Exception):
    """The learner's side failed a call: function missing, timed out, result or argument state
    that cannot be sent as data. Verdict "failed"."""


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
    message = str(message)[:2000]
    cls = _RAISED_CLASSES.get(kernel_type)
    if cls is None:
        base: type | None = None
        if kernel_type in remote.BUILTIN_ERRORS:
            import builtins

            base = getattr(builtins, kernel_type, None)
        elif kernel_type.startswith("course_lib.") and re.fullmatch(r"[A-Za-z0-9_.]+", kernel_type):
            module, _, name = kernel_type.rpartition(".")
            # only modules the judge has imported already: a name from the kernel never makes it run new code
            candidate = getattr(sys.modules.get(module), name, None)
            if isinstance(candidate, type) and issubclass(candidate, Exception):
                base = candidate
        bases = (LearnerRaised, base) if base is not None else (LearnerRaised,)
        cls = type("Learner" + (kernel_type.rpartition(".")[2] or "Exception"), bases,
                   {"kernel_type": kernel_type})
        if len(_RAISED_CLASSES) < 256:
            _RAISED_CLASSES[kernel_type] = cls
    exc = cls(f"{fn_name} raised {kernel_type}: {message}")
    return exc


# == transport ===================================================================================
class KernelSession:
    """Judge-side end of the harness protocol over a BlockingKernelClient.

    Args:
        client: a started BlockingKernelClient (shell and stdin channels) of the learner's kernel.
            Use ``KernelSession.connect(connection_info)`` to make one next to another client
            (nbclient's): the kernel routes input requests to the client that sent the request.
        interrupt: callable that interrupts the kernel (``km.interrupt_kernel``), for timeouts.
        is_alive: callable that says whether the kernel process lives (``km.is_alive``).
        poll_interval: seconds between liveness checks while waiting.
        interrupt_grace: seconds a timed-out call gets to stop after the interrupt.
    """

    def __init__(self, client, *, interrupt: Callable | None = None, is_alive: Callable | None = None,
                 poll_interval: float = 0.5, interrupt_grace: float = 10.0, owns_client: bool = False):
        import zmq

        self.client = client
        self.interrupt = blocking(interrupt)
        self.is_alive = blocking(is_alive)
        self.poll_interval = poll_interval
        self.interrupt_grace = interrupt_grace
        self.owns_client = owns_client
        self.msg_id: str | None = None     # the open harness execute_request
        self.pending = False                # a harness input_request awaits our reply
        self.dead = False
        self.wedged = False
        self.calls = 0
        self.callbacks = 0
        self.call_seconds = 0.0
        self.observations: list[tuple[str, tuple[str, ...], bool]] = []   # watched calls (provenance)
        self._poller = zmq.Poller()
        self._stdin = client.stdin_channel
        self._shell = client.shell_channel
        self._poller.register(self._stdin.socket, zmq.POLLIN)
        self._poller.register(self._shell.socket, zmq.POLLIN)
        self._described: dict[str, dict] = {}

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
        session = cls(client, owns_client=True, **kwargs)
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
    def _check_alive(self) -> None:
        if self.is_alive is not None:
            try:
                alive = self.is_alive()
            except Exception:
                alive = False
            if not alive:
                self.dead = True
                self.msg_id, self.pending = None, False
                raise KernelDied("the learner's kernel died")

    def _reply(self, message: dict) -> None:
        self.client.input(remote.dumps(message))
        self.pending = False

    def _next(self, deadline: float) -> dict:
        """The next harness message (a dict), answering a learner's own input() with ''.

        Raises: CallTimeout, KernelDied, _SessionEnded (the execute_reply came), ProtocolError."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CallTimeout("timed out")
            events = dict(self._poller.poll(int(1000 * min(remaining, self.poll_interval))))
            got = False
            if self._stdin.socket in events:
                got = True
                msg = self._get(self._stdin)
                if msg is not None and msg.get("msg_type") == "input_request" \
                        and msg.get("parent_header", {}).get("msg_id") == self.msg_id:
                    self.pending = True
                    prompt = msg.get("content", {}).get("prompt")
                    if type(prompt) is not str or not prompt.startswith(remote.PROMPT):
                        self._reply_raw("")
                        continue
                    try:
                        message = remote.loads(prompt[len(remote.PROMPT):])
                    except remote.RemoteDataError as exc:
                        raise ProtocolError(f"harness message: {exc}") from None
                    if type(message) is not dict or type(message.get("op")) is not str:
                        raise ProtocolError("harness message without an op")
                    return message
            if self._shell.socket in events:
                got = True
                msg = self._get(self._shell)
                if msg is not None and msg.get("msg_type") == "execute_reply" \
                        and msg.get("parent_header", {}).get("msg_id") == self.msg_id and self.msg_id:
                    self.msg_id, self.pending = None, False
                    raise _SessionEnded(msg.get("content", {}))
            if not got:
                self._check_alive()

    def _reply_raw(self, text: str) -> None:
        self.client.input(text)
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
            detail = protocol_breach(exc) or f"{type(exc).__name__}: {exc}"
            self.dead = True
            self.msg_id, self.pending = None, False
            raise KernelDied(breach_message(detail)) from None

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
        finishes; returns then, and raises what ``_next`` raises (a timeout, a dead kernel)."""
        try:
            while True:
                if self.pending:
                    self._reply({"op": "end"})
                self._next(deadline)
        except _SessionEnded:
            return

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.close(timeout=10.0)
        if self.owns_client:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
            with contextlib.suppress(Exception):
                self.client.context.destroy(linger=0)

    def _abort(self) -> None:
        """After a timeout: interrupt, let the harness end, or mark the kernel wedged."""
        if self.interrupt is not None:
            with contextlib.suppress(Exception):
                self.interrupt()
        try:
            self._drain(time.monotonic() + self.interrupt_grace)
        except CallTimeout:
            self.wedged = True
            self.msg_id, self.pending = None, False
        except KernelDied:
            pass
        except ProtocolError:
            self.wedged = True
            self.msg_id, self.pending = None, False

    def _exchange(self, request: dict, deadline: float, callbacks: list | None = None,
                  objects: list | None = None) -> dict:
        """Send a request to the open harness; serve callbacks; return its answer."""
        self.open(deadline)
        if not self.pending:
            raise ProtocolError("the harness is not waiting for a request")
        self._reply(request)
        while True:
            try:
                message = self._next(deadline)
            except _SessionEnded as end:
                c = end.content
                raise ProtocolError(f"the harness cell ended during a request ({c.get('status')}: "
                                    f"{c.get('ename', '')})") from None
            if message.get("op") != "callback":
                return message
            self.callbacks += 1
            self._reply(self.answer_callback(message, callbacks or [], objects or []))

    @staticmethod
    def answer_callback(message: dict, callbacks: list, objects: list) -> dict:
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
            value = callbacks[cid](*args, **kwargs)
            return {"op": "return", "value": remote.CallEncoder(register=False).encode(value)}
        except Exception as exc:
            return {"op": "error", "message": f"{type(exc).__name__}: {exc}"[:500]}

    # -- requests ------------------------------------------------------------------------------
    def describe(self, names: list[str], deadline: float) -> dict[str, dict]:
        """What each name is in the kernel: {name: {defined, callable, module, qualname, type}}."""
        todo = [n for n in names if n not in self._described]
        if todo:
            answer = self._exchange({"op": "describe", "names": todo}, deadline)
            info = answer.get("names") if answer.get("op") == "described" else None
            if type(info) is not dict:
                raise ProtocolError("bad describe answer")
            for n in todo:
                entry = info.get(n)
                clean = {"defined": False}
                if type(entry) is dict and entry.get("defined") is True:
                    clean = {"defined": True, "callable": entry.get("callable") is True}
                    for key in ("module", "qualname", "type"):
                        value = entry.get(key)
                        clean[key] = value[:200] if type(value) is str else ""
                self._described[n] = clean
        return {n: self._described[n] for n in names}

    def forget(self) -> None:
        """Drop cached descriptions (between cells: the learner may redefine names)."""
        self._described.clear()

    def call(self, name: str, args: tuple, kwargs: dict, deadline: float, writable: dict | None = None,
             watch: list | None = None):
        """Call the kernel's ``name`` on plain-data copies of ``args``/``kwargs``; mirror the
        in-place changes ``writable`` allows (``writable_spec``; None: none); return the strictly
        decoded result. With ``watch`` (``provenance.watch_spec``) the kernel also says which of
        those references' code ran during the call; it is appended to ``observations``.

        Raises: LearnerRaised (the function raised), LearnerFault (missing, timeout, result
        that cannot come back), JudgeError (kernel died/wedged, protocol)."""
        import torch

        encoder = remote.CallEncoder()
        arg_nodes = [encoder.encode(a) for a in args]
        kw_nodes = [[k, encoder.encode(v)] for k, v in kwargs.items()]
        allowed = _writable_oids(encoder, arg_nodes, kw_nodes, writable or {})
        request = {"op": "call", "fn": name, "args": arg_nodes, "kwargs": kw_nodes,
                   "objects": encoder.table, "grad": bool(torch.is_grad_enabled())}
        if watch:
            request["watch"] = watch
        start = time.monotonic()
        self.calls += 1
        try:
            answer = self._exchange(request, deadline, encoder.callbacks, encoder.objects)
        except CallTimeout:
            self._abort()
            raise CallTimeout(f"{name} did not return within the time limit") from None
        finally:
            self.call_seconds += time.monotonic() - start
        op = answer.get("op")
        if watch:
            reached, watched = answer.get("reached"), {w["reference"] for w in watch}
            valid = type(reached) is list and all(type(r) is str and r in watched for r in reached)
            self.observations.append((name, tuple(sorted(set(reached))) if valid else (),
                                      valid and answer.get("observed") is True))
        decoder = remote.ResultDecoder(encoder.objects)
        try:
            decoder.apply_state(answer.get("state", []), allowed)
            self._replay_embeddings(answer.get("embed", []), encoder.objects)
        except TypeError as exc:
            raise LearnerFault(f"{name}: {exc}") from None
        except remote.RemoteDataError as exc:
            raise ProtocolError(f"{name}: argument state: {exc}") from None
        if op == "returned":
            try:
                return decoder.decode(answer.get("value"))
            except remote.RemoteDataError as exc:
                raise ProtocolError(f"{name}: result: {exc}") from None
        if op == "raised":
            raise learner_exception(name, answer.get("type"), answer.get("message"))
        if op == "missing":
            raise LearnerFault(f"{name} is not defined in the notebook (its cell did not run, or raised)")
        if op == "unencodable":
            raise LearnerFault(f"{name} returned a value that cannot be sent as plain data")
        if op == "undecodable":
            raise ProtocolError(f"the kernel could not rebuild the arguments of {name}: "
                                f"{str(answer.get('message'))[:300]}")
        raise ProtocolError(f"unexpected harness answer {str(op)[:40]!r}")

    @staticmethod
    def _replay_embeddings(entries, objects: list) -> None:
        """Feed the judge's model the same number of token ids per embed_tokens call as the
        kernel's copy saw, so forward hooks on it (the checkers' token counters) count them."""
        import torch
        from course_lib.models.decoder import Decoder

        if type(entries) is not list:
            raise remote.RemoteDataError("embed counts must be a list")
        total = 0
        for entry in entries:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int \
                    or not 0 <= entry[0] < len(objects) or not isinstance(objects[entry[0]], Decoder):
                raise remote.RemoteDataError("bad embed count entry")
            counts = entry[1]
            if type(counts) is not list or any(type(n) is not int or n < 0 for n in counts) or len(counts) > 100_000:
                raise remote.RemoteDataError("bad embed counts")
            total += sum(counts)
            if total > 1_000_000:
                raise remote.RemoteDataError("embed counts over the limit")
            model = objects[entry[0]]
            if model.embed_tokens._forward_hooks or model.embed_tokens._forward_pre_hooks:
                with torch.no_grad():
                    for n in counts:
                        model.embed_tokens(torch.zeros(n, dtype=torch.long))


def _writable_oids(encoder, arg_nodes: list, kw_nodes: list, spec: dict) -> set[int]:
    """Object ids the learner's function may change: the arguments ``spec`` names and everything
    reachable from them through containers and course_lib state objects."""
    def oid_of(node):
        return node.get("id") if isinstance(node, dict) and node.get("$") == "ref" else None

    roots = {oid_of(n) for i, n in enumerate(arg_nodes) if i in spec.get("args", ())}
    roots |= {oid_of(n) for k, n in kw_nodes if k in spec.get("kwargs", ())}
    types = set(spec.get("types", ()))
    roots |= {oid for oid, obj in enumerate(encoder.objects) if type(obj).__name__ in types}
    roots.discard(None)
    ids = {id(obj): oid for oid, obj in enumerate(encoder.objects)}
    allowed, todo = set(), list(roots)
    while todo:
        oid = todo.pop()
        if oid in allowed:
            continue
        allowed.add(oid)
        obj = encoder.objects[oid]
        if isinstance(obj, dict):
            children = [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, deque)):
            children = list(obj)
        elif hasattr(obj, "__dict__") and not hasattr(obj, "forward"):
            children = list(vars(obj).values())
        else:
            children = []
        todo.extend(ids[id(c)] for c in children if id(c) in ids)
    return allowed


class RemoteFunction:
    """Stands in, judge-side, for a learner function in the kernel. ``__module__``/``__qualname__``
    are what the kernel reported (so ``check_own_function`` refuses course_lib's own reference as
    it would in-process)."""

    def __init__(self, session: KernelSession, name: str, info: dict, deadline: Callable[[], float],
                 writable: dict | None = None, watch: list | None = None):
        self._session, self._deadline, self._writable, self._watch = session, deadline, writable, watch
        self.__name__ = name
        self.__qualname__ = info.get("qualname") or name
        self.__module__ = info.get("module") or ""

    def __call__(self, *args, **kwargs):
        return self._session.call(self.__name__, args, kwargs, self._deadline(), self._writable, self._watch)

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


def _hidden_lines(source: str) -> set[int]:
    hidden, inside = set(), False
    for number, line in enumerate(source.splitlines(), 1):
        if HIDDEN_BEGIN in line:
            inside = True
        elif HIDDEN_END in line:
            inside = False
        elif inside:
            hidden.add(number)
    return hidden


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
    hidden = _hidden_lines(source)
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


# == redaction ===================================================================================
_NUMBER = re.compile(r"(?<![\w])(?<!\d\.)[-+]?(?:\d[\d_]*(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w])")
#: Phrases of a failing message whose numbers say *how* it failed, not what the inputs or the
#: reference were: they survive redaction.
_KEEP = [
    re.compile(r"max \|diff\|(?: over the compared steps)? [-+0-9.eE]+(?:inf|nan)?"),
    re.compile(r"\|diff\| [-+0-9.eE]+"),
    re.compile(r"\d+ of \d+ values over"),
    re.compile(r"ratio got/expected = [-+0-9.eE]+(?:inf|nan)?"),
    re.compile(r"first over tolerance at (?:index \([\d, ]*\)|step \d+)"),
    re.compile(r"\bcase \d+"),
    re.compile(r"\d+ significant figures"),
    re.compile(r"relative error (?:must be )?<= [-+0-9.eE]+"),
    re.compile(r"\b[ar]tol [-+0-9.eE]+"),
    re.compile(r"top-2"),
    re.compile(r"torch\.\w+"),
]
_HINT = re.compile(r"; your number is what the formula gives with .*$")
_CONSTANTS: set[str] = set()


def _checker_constants() -> set[str]:
    """Numbers written literally in the checkers' message strings (fault names such as
    "k(k+1)/2" or "binary GiB (2^30 bytes)"): constants, not drawn inputs."""
    if not _CONSTANTS:
        import course_lib.grading as grading

        folder = Path(grading.__file__).parent
        for path in sorted(folder.glob("*.py")):
            for node in ast.walk(parse_python(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    _CONSTANTS.update(m.group(0) for m in _NUMBER.finditer(node.value))
        _CONSTANTS.add("")
    return _CONSTANTS


def _collapse_case(head: str) -> str:
    """Every "(case N: <drawn inputs>)" becomes "(case N)"; a call label "name(<args>) (case N)"
    becomes "name (case N)"; "case N: <inputs>: ..." (check_paged) becomes "case N: ..."."""
    out, i = [], 0
    while True:
        j = head.find("(case ", i)
        if j < 0:
            out.append(head[i:])
            break
        depth, k = 0, j
        while k < len(head):
            depth += head[k] == "("
            depth -= head[k] == ")"
            if depth == 0:
                break
            k += 1
        m = re.match(r"\(case \d+", head[j:])
        out.append(head[i:j] + m.group(0) + ")")
        i = k + 1
    head = "".join(out)
    head = re.sub(r"^(\w+)\([^()]*(?:\([^()]*\)[^()]*)*\) \((case \d+)\)", r"\1 (\2)", head)
    head = re.sub(r"^(\w+)\((?!case)[^:]*?\)(?=: )", r"\1 (a hidden case)", head)
    head = re.sub(r"^(case \d+): [^:]*?(?=: )", r"\1", head)
    return re.sub(r"^(\w+)\((case \d+)\)", r"\1 (\2)", head)


def redact(message: str) -> str:
    """A hidden check's message without its drawn inputs or reference values.

    Kept: the function and case number, the kind of failure (type, dtype, contract), error
    magnitudes (max |diff|, how many values over, the got/expected ratio), the first failing
    index or step, tolerances, and the Diagnosis naming the fault (numbers in it only where the
    checker's own text has them, never a bare "(N)"). Dropped: the case's drawn inputs, expected
    and got values, shapes, formula terms, and the lines that print reference values ("(reference:",
    "expected ...", "got ..."); other numbers become '#'."""
    lines = str(message).splitlines() or [""]
    kept: list[str] = []
    diagnosis = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("Diagnosis:"):
            diagnosis = True
        if i > 0 and not diagnosis:
            continue           # reference values, expected/got plans, and the like
        if i == 0:
            line = _collapse_case(_HINT.sub("", line))
            if line.rstrip().endswith(":"):
                line = line.rstrip() + " the result differs from the reference"
            kept.append(_mask_numbers(line, constants=False))
        else:
            kept.append(_mask_numbers(line, constants=True))
    return "\n".join(kept)


def _mask_numbers(line: str, constants: bool) -> str:
    spans: list[tuple[int, int]] = []
    for pattern in _KEEP:
        spans.extend(m.span() for m in pattern.finditer(line))
    bare = [m.span(1) for m in re.finditer(r"\((\s*[-+]?[\d.,]+\s*)\)", line)]   # "(24)": an input
    allowed = _checker_constants() if constants else set()
    out, last = [], 0
    for m in _NUMBER.finditer(line):
        if any(a <= m.start() and m.end() <= b for a, b in spans):
            continue
        if m.group(0) in allowed and not any(a <= m.start() and m.end() <= b for a, b in bare):
            continue
        out.append(line[last:m.start()])
        out.append("#")
        last = m.end()
    out.append(line[last:])
    text = "".join(out)
    text = re.sub(r"\(#(?:, #)+\)", "(…)", text)
    return re.sub(r"\[#?(?:, #)*\]", "[…]", text)


# == judging a cell ==============================================================================
def declared_contract(module: str, checker: str):
    """The ``Contract`` of ``course_lib.grading.MODULE.CONTRACTS`` whose checker is CHECKER (a
    function of that module): the checker the judge runs and what it may let the learner write.

    Raises:
        UnsupportedCell: MODULE is not a lab module name (``labNN``), or the lab declares no
            contract for CHECKER (a graded cell may call only
            declared checkers: the table says what their learner functions may write).
    """
    if not _CHECKER_MODULE.fullmatch(module) or not checker.startswith("check_"):
        raise UnsupportedCell(f"{module}.{checker} is not a course checker")
    mod = importlib.import_module(f"course_lib.grading.{module}")
    for contract in getattr(mod, "CONTRACTS", ()):
        if contract.checker.__name__ == checker and contract.checker.__module__ == mod.__name__:
            return contract
    raise UnsupportedCell(f"course_lib.grading.{module}.CONTRACTS declares no contract for {checker}")


def writable_spec(contract) -> dict | None:
    """The contract's ``Writes`` as RemoteFunction takes it (None: nothing may change)."""
    writes = contract.writes
    if not writes:
        return None
    return {"args": tuple(writes.args), "kwargs": tuple(writes.kwargs),
            "types": tuple(t.__name__ for t in writes.types)}


def _substitute(name: str, substitutes: dict, cache: dict):
    if name not in substitutes:
        raise UnsupportedCell(f"keyword value {name!r} names a kernel object the judge has no substitute for")
    if name not in cache:
        module, factory, kwargs = substitutes[name]
        cache[name] = getattr(importlib.import_module(module), factory)(**kwargs)
    return cache[name]


def _check_record(call: CheckCall, repeat_index: int) -> dict:
    return {"checker": f"{call.module}.{call.checker}", "functions": list(call.functions), "line": call.line,
            "hidden": call.hidden, "repeat": repeat_index, "status": SKIPPED, "message": "", "seconds": 0.0,
            "calls": 0, "callbacks": 0}


def judge_cell(session: KernelSession, source: str, *, grade_id: str = "", seed: int = 0,
               cell_timeout: float = 300.0, call_timeout: float = 60.0,
               substitutes: dict | None = None, keep_going: bool = False, log: Callable | None = None) -> dict:
    """Judge one graded test cell against a live kernel in which the learner's cells have run.

    Args:
        session: a KernelSession of that kernel.
        source: the test cell's trusted source (with its hidden tests).
        grade_id, seed: the cell's id and the judge's base seed; ``fresh_seed()`` occurrence k
            of the cell becomes ``derived_seed(seed, grade_id, k)``.
        cell_timeout, call_timeout: seconds for the whole cell and for one call into the kernel.
        substitutes: kernel-object keyword values -> judge-side factories ``(module, factory, kwargs)``,
            over those the checker's contract declares (``Contract.objects``).
        keep_going: run the remaining checks after a failure (default: stop, like the cell does).

    Returns:
        A JSON-able dict: grade_id, status (passed / failed / error / unjudged), message (the
        first non-passing check's; redacted when that check is hidden), checks (one record per
        checker run: status, message, seconds, calls), kernel_only (statements not judged),
        seconds.
    """
    start = time.monotonic()
    cell_deadline = start + cell_timeout
    substitutes = dict(substitutes or {})
    verdict: dict[str, Any] = {"grade_id": grade_id, "status": UNJUDGED, "message": "", "checks": [],
                               "kernel_only": 0, "seconds": 0.0}
    try:
        calls, other = parse_test_cell(source)
    except UnsupportedCell as exc:
        verdict.update(status=ERROR, message=f"the judge cannot read this test cell: {exc}")
        return verdict
    verdict["kernel_only"] = other
    if not calls:
        verdict["message"] = "no labNN.check_* call in this cell: judged in the kernel only"
        return verdict
    records = []
    fresh_count = 0
    plan = []
    for call in calls:
        for r in range(call.repeat):
            seeds = {}
            for key, value in call.kwargs.items():
                if value is FRESH:
                    seeds[key] = derived_seed(seed, grade_id, fresh_count)
                    fresh_count += 1
            plan.append((call, r, seeds))
            records.append(_check_record(call, r))
    verdict["checks"] = records
    cache: dict = {}
    session.forget()
    stop = False
    for (call, r, seeds), record in zip(plan, records):
        if stop:
            continue
        t0 = time.monotonic()
        calls0, cb0, obs0 = session.calls, session.callbacks, len(session.observations)
        status, message = PASSED, ""
        try:
            if not session.usable:
                raise (KernelDied if session.dead else KernelWedged)("the learner's kernel is unusable")
            if time.monotonic() > cell_deadline:
                raise CallTimeout("the judge's time for this cell ran out")
            contract = declared_contract(call.module, call.checker)
            objects = {**contract.objects, **substitutes}
            watch = provenance.watch_spec(contract.references)
            if contract.references:
                record["references"] = list(contract.references)
            kwargs = {}
            for key, value in call.kwargs.items():
                if value is FRESH:
                    kwargs[key] = seeds[key]
                elif isinstance(value, KernelName):
                    kwargs[key] = _substitute(value.name, objects, cache)
                else:
                    kwargs[key] = value
            info = session.describe(call.functions, min(cell_deadline, time.monotonic() + call_timeout))
            proxies = []
            for name in call.functions:
                entry = info[name]
                if not entry.get("defined"):
                    raise LearnerFault(f"{name} is not defined in the notebook (its cell did not run, or raised)")
                if entry.get("callable"):
                    proxies.append(RemoteFunction(session, name, entry,
                                                  lambda: min(cell_deadline, time.monotonic() + call_timeout),
                                                  writable_spec(contract), watch))
                else:
                    proxies.append(remote.opaque_class(entry.get("type") or "object")())
            contract.checker(*proxies, **kwargs)
        except contracts.ContractError as exc:
            status, message = FAILED, str(exc)
        except LearnerRaised as exc:
            status, message = FAILED, str(exc)
        except LearnerFault as exc:
            status, message = FAILED, str(exc)
        except UnsupportedCell as exc:
            status, message = ERROR, f"the judge cannot run this check: {exc}"
        except JudgeError as exc:
            status, message = ERROR, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # the checker could not go on with what came back (e.g. a stand-in)
            status, message = FAILED, f"the check stopped: {type(exc).__name__}: {str(exc)[:500]}"
        record.update(status=status, seconds=round(time.monotonic() - t0, 4), calls=session.calls - calls0,
                      callbacks=session.callbacks - cb0,
                      message=redact(message) if (call.hidden and message) else message)
        if record.get("references"):
            record.update(provenance.runtime_summary(session.observations[obs0:]))
        if log is not None:
            log(f"judge {grade_id} {call.label}{' [hidden]' if call.hidden else ''}: {status} "
                f"({record['seconds']:.2f} s, {record['calls']} calls)")
        if status != PASSED and (not keep_going or status == ERROR):
            stop = True
    with contextlib.suppress(Exception):
        session.close()
    done = [r for r in records if r["status"] != SKIPPED]
    worst = next((r for r in done if r["status"] == ERROR), None) or next(
        (r for r in done if r["status"] == FAILED), None)
    if worst is None:
        verdict["status"] = PASSED
    else:
        verdict["status"] = worst["status"]
        where = f"{worst['checker']}{' (hidden test)' if worst['hidden'] else ''}"
        verdict["message"] = f"{where}: {worst['message']}"
    verdict["seconds"] = round(time.monotonic() - start, 4)
    return verdict


# == nbgrader ====================================================================================
def _in_kernel_passed(cell) -> bool:
    """The course rule: a test cell fails in the kernel only with an error output."""
    return not any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def _cell_seconds(cell) -> float | None:
    """How long the cell ran in the kernel (nbclient's timing metadata), if recorded."""
    from datetime import datetime

    timing = cell.get("metadata", {}).get("execution", {})
    try:
        start = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
        return round((end - start).total_seconds(), 4)
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


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


def _make_mixin():
    from traitlets import Bool, Dict, Enum, Float, Integer, Unicode
    from traitlets.config import LoggingConfigurable

    class CourseJudge(LoggingConfigurable):
        """Mixin for nbgrader's Execute (or a subclass such as the sandbox's SandboxExecute):
        judge every graded test cell right after it ran, against the same kernel.
        Configure as ``c.CourseJudge.<trait>``."""

        enabled_judge = Bool(True, help="Judge graded test cells outside the kernel").tag(config=True)
        seed = Integer(None, allow_none=True, help="Base seed of the judge's hidden tests (default: "
                       "$COURSE_JUDGE_SEED, else derived from $COURSE_GRADING_SEED, else random)").tag(config=True)
        call_timeout = Float(60.0, help="Seconds one call into the kernel may take").tag(config=True)
        cell_timeout = Float(None, allow_none=True, help="Seconds the judge may spend on one cell (default: "
                             "Execute.timeout, else 300)").tag(config=True)
        enforce = Bool(True, help="Add an error output to a graded cell the kernel passed and the judge did "
                       "not, so SaveAutoGrades scores it 0 and the feedback shows the judge's message"
                       ).tag(config=True)
        restart_dead_kernel = Bool(True, help="Restart a kernel that died during judging so the notebook "
                                   "goes on (later cells then fail in a fresh kernel). Under the sandbox's "
                                   "SandboxExecute its own rule applies instead: later cells are not run and "
                                   "get a KernelDied error").tag(config=True)
        verdict_path = Unicode("", help="Where to write the verdicts JSON (default: "
                               "{notebook}.judge.json next to the notebook; '-': nowhere)").tag(config=True)
        substitutes = Dict(help="Kernel-object keyword values -> [module, factory, kwargs] the judge "
                           "builds itself").tag(config=True)
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
                if self._judge_session is not None:
                    self._judge_session.shutdown()
                    self._judge_session = None
                self._judge_write()

        def preprocess_cell(self, cell, resources, index):
            self._judge_index = index
            restarts = getattr(self, "kernel_restarts", 0)
            cell, resources = super().preprocess_cell(cell, resources, index)
            if getattr(self, "kernel_restarts", 0) != restarts and self._judge_session is not None:
                self._judge_session.shutdown()     # SandboxExecute restarted a wedged kernel: reconnect
                self._judge_session = None
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if self.enabled_judge and cell.get("cell_type") == "code" and meta.get("grade") \
                    and not meta.get("solution"):
                died_in = getattr(self, "kernel_died_in", None)   # SandboxExecute: the kernel is gone
                timed_out = any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError"
                                for o in cell.get("outputs", []))
                if died_in is not None or timed_out:
                    # the cell scores 0 already; judging it again would only spend another timeout
                    self._judge_verdicts.append({
                        "grade_id": meta.get("grade_id", ""), "status": ERROR, "checks": [], "kernel_only": 0,
                        "seconds": 0.0, "points": float(meta.get("points", 0) or 0),
                        "in_kernel_passed": _in_kernel_passed(cell), "kernel_seconds": None, "disagrees": False,
                        "message": f"not judged: the kernel died in cell {died_in}" if died_in is not None
                        else "not judged: the cell timed out in the kernel"})
                else:
                    self._judge(cell, resources or self._judge_resources)
            return cell, resources

        def _judge(self, cell, resources):
            meta = cell.metadata.nbgrader
            grade_id = meta.get("grade_id", f"cell{len(self._judge_verdicts)}")
            in_kernel = _in_kernel_passed(cell)
            source = _trusted_source(cell, resources)
            if source is None:
                verdict = {"grade_id": grade_id, "status": ERROR, "checks": [], "kernel_only": 0, "seconds": 0.0,
                           "message": "no trusted source for this test cell (not in the gradebook and not locked)"}
            else:
                try:
                    session = self._judge_connect()
                    timeout = self.cell_timeout or float(getattr(self, "timeout", None) or 300)
                    subs = {k: tuple(v) for k, v in self.substitutes.items()}
                    verdict = judge_cell(session, source, grade_id=grade_id, seed=self._judge_base,
                                         cell_timeout=timeout, call_timeout=self.call_timeout,
                                         substitutes=subs, log=self.log.info)
                except Exception as exc:  # JudgeError, or a judge bug: never crash the notebook's grading
                    if not isinstance(exc, JudgeError):
                        self.log.exception("judge: crashed on %s", grade_id)
                    verdict = {"grade_id": grade_id, "status": ERROR, "checks": [], "kernel_only": 0,
                               "seconds": 0.0, "message": f"{type(exc).__name__}: {exc}"}
                session = self._judge_session
                if session is not None and session.dead:
                    verdict["message"] += " (the kernel died while being judged)"
                    self._judge_restart()
                self._judge_reuse(cell, verdict)
            verdict.update(points=float(meta.get("points", 0) or 0), in_kernel_passed=in_kernel,
                           kernel_seconds=_cell_seconds(cell))
            verdict["disagrees"] = verdict["status"] != UNJUDGED and (verdict["status"] == PASSED) != in_kernel
            self._judge_verdicts.append(verdict)
            cell.metadata["course_judge"] = {"status": verdict["status"], "message": verdict["message"],
                                             "in_kernel_passed": in_kernel}
            if self.enforce and in_kernel and verdict["status"] in (FAILED, ERROR):
                from nbformat.v4 import new_output

                what = "failed" if verdict["status"] == FAILED else "could not judge"
                text = f"the trusted judge {what} this test: {verdict['message']}"
                cell.outputs.append(new_output("error", ename="JudgeVerdict", evalue=text,
                                               traceback=[f"JudgeVerdict: {text}"]))

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
            if reuse["zeroed"] and self.enforce and not any(o.get("output_type") == "error" for o in cell.outputs):
                from nbformat.v4 import new_output

                text = (f"this test scores 0: the course does not accept course_lib's own reference "
                        f"({', '.join(reuse['references'])}) as the exercise's answer")
                cell.outputs.append(new_output("error", ename="ReferenceReuse", evalue=text,
                                               traceback=[f"ReferenceReuse: {text}"]))

        def _judge_connect(self) -> KernelSession:
            if self._judge_session is None or not self._judge_session.usable:
                if self._judge_session is not None:
                    self._judge_session.shutdown()
                km = self.km
                self._judge_session = KernelSession.connect(
                    km.get_connection_info(session=False), interrupt=km.interrupt_kernel, is_alive=km.is_alive)
            return self._judge_session

        def _judge_restart(self) -> None:
            if self._judge_session is not None:
                self._judge_session.shutdown()
                self._judge_session = None
            if hasattr(self, "kernel_died_in"):
                # SandboxExecute's rule for a dead kernel: later cells are not run and get a
                # KernelDied error; follow it rather than start a second kernel. A kernel the judge
                # found dead may still run (its messages failed verification): stop it now.
                with contextlib.suppress(Exception):
                    blocking(self.km.shutdown_kernel)(now=True)
                self.kernel_died_in = getattr(self, "_judge_index", None)
                return
            if self.restart_dead_kernel:
                try:
                    blocking(self.km.restart_kernel)(now=True)
                    blocking(self.kc.wait_for_ready)(timeout=60)
                    self._judge_iopub_ready()
                    self.log.warning("judge: the kernel died while being judged; restarted it")
                except Exception as exc:  # nbclient will report the dead kernel at the next cell
                    self.log.error("judge: could not restart the dead kernel: %s", exc)

        def _judge_iopub_ready(self, tries: int = 20) -> None:
            if not iopub_ready(self.kc, tries):
                raise JudgeError("the restarted kernel's output channel did not come back")

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
            with contextlib.suppress(Exception):   # exec, eval, computed imports: beyond the reuse check
                record["dynamic_code"] = provenance.analyse(provenance.notebook_cells(self._judge_nb.cells)).dynamic
            encodable_tree(record)         # learner text in messages: UTF-8 writers must not fail on it
            resources["course_judge"] = record
            if path == "-":                # keep the verdicts in memory only
                return
            text = json.dumps(record, indent=1)
            if os.path.exists(path) and not os.path.islink(path) and not os.path.isfile(path):
                Path(path).write_text(text)    # a device or pipe (never rename over /dev/null)
                return
            tmp = f"{path}.{os.getpid()}.tmp"
            Path(tmp).write_text(text)
            os.replace(tmp, path)          # replaces a planted symlink instead of writing through it

    return CourseJudge


_MIXIN = None
_JUDGED: dict[type, type] = {}


def make_judge_execute(base: type | None = None) -> type:
    """``base`` (nbgrader's Execute by default, or a subclass) with the judge mixed in; its
    settings are ``c.CourseJudge.*`` and everything ``c.Execute.*`` still applies."""
    global _MIXIN
    if base is None:
        from nbgrader.preprocessors import Execute as base
    if base not in _JUDGED:
        if _MIXIN is None:
            _MIXIN = _make_mixin()
        _JUDGED[base] = type("Judged" + base.__name__, (_MIXIN, base), {"__module__": __name__})
    return _JUDGED[base]


def configure_nbgrader(c) -> type:
    """Judge every graded cell during ``nbgrader autograde``: replace the Execute step of
    ``c.Autograde.autograde_preprocessors`` (Execute or SandboxExecute; call this after the
    sandbox's ``configure_nbgrader``) by its judged subclass. Returns that class."""
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    if "autograde_preprocessors" in c.Autograde:
        steps = list(c.Autograde.autograde_preprocessors)
    else:
        steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    for i, step in enumerate(steps):
        if isinstance(step, type) and issubclass(step, Execute):
            if _MIXIN is not None and issubclass(step, _MIXIN):
                return step
            steps[i] = make_judge_execute(step)
            c.Autograde.autograde_preprocessors = steps
            return steps[i]
    raise RuntimeError("no Execute step in Autograde.autograde_preprocessors")


def nbgrader_config_lines() -> list[str]:
    """Lines for a (generated) nbgrader_config.py, after the course config and the sandbox lines."""
    return [
        "# Trusted judge of graded cells (course_grader.judge)",
        "from course_grader import judge as _jd",
        "_jd.configure_nbgrader(c)",
    ]


# == after autograde ==============================================================================
def read_verdicts(folder: str | os.PathLike, student: str | None = None, assignment: str | None = None) -> list[dict]:
    """The verdict records under ``folder`` (nbgrader's autograded folder, or one learner's or one
    assignment's folder in it): ``{student}/{assignment}/{notebook}.judge.json`` whose recorded
    student, assignment and notebook match its path (and STUDENT / ASSIGNMENT when given).
    Without a sandbox the learner's kernel can write files there, so the driver should rely on
    the in-notebook enforcement (``CourseJudge.enforce``) and use these records for the report."""
    records = []
    for path in sorted(Path(folder).rglob("*" + VERDICT_SUFFIX)):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            record = encodable_tree(json.loads(path.read_text()))  # the kernel could write it, unsandboxed
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not isinstance(record.get("cells"), list):
            continue
        notebook = path.name[:-len(VERDICT_SUFFIX)]
        if (record.get("notebook"), record.get("assignment"), record.get("student")) != \
                (notebook, path.parent.name, path.parent.parent.name):
            continue
        if (student is not None and record["student"] != student) or \
                (assignment is not None and record["assignment"] != assignment):
            continue
        record["path"] = str(path)
        records.append(record)
    return records


def apply_verdicts(db_url: str, records: list[dict], policy: str = "min", course_id: str | None = None) -> list[dict]:
    """Write the judge's verdicts into an nbgrader gradebook; return the disagreements.

    For every judged graded cell (status passed / failed / error) the grade's auto_score becomes
    ``points if passed else 0`` (policy "judge"), or the smaller of that and the kernel's score
    (policy "min", the default: a test the kernel failed stays failed, e.g. a spec-figure
    assert the judge does not evaluate, and a pass the judge refuses is 0). Unjudged cells keep
    the kernel's score. A cell whose verdict says it reuses its exercise's reference and is to
    score 0 (``reference_reuse.zeroed``, ``CourseJudge.reference_reuse = "zero"``) gets 0.

    Returns one dict per cell where the kernel's result and the judge's differ: learner, lab
    (assignment), notebook, cell, points, in_kernel (passed/failed), judge (status), score (new
    auto_score), message.
    """
    if policy not in ("min", "judge"):
        raise ValueError("policy must be 'min' or 'judge'")
    from nbgrader.api import Gradebook, MissingEntry

    flagged = []
    kwargs = {"course_id": course_id} if course_id else {}
    with Gradebook(db_url, **kwargs) as gb:
        for record in records:
            for verdict in record.get("cells", []):
                status = verdict.get("status")
                if status not in (PASSED, FAILED, ERROR):
                    continue
                try:
                    grade = gb.find_grade(verdict["grade_id"], record["notebook"], record["assignment"],
                                          record["student"])
                except (MissingEntry, KeyError):
                    continue
                points = float(grade.max_score)
                judged = points if status == PASSED else 0.0
                in_kernel = bool(verdict.get("in_kernel_passed"))
                kernel_score = points if in_kernel else 0.0
                score = judged if policy == "judge" else min(judged, kernel_score)
                if (verdict.get("reference_reuse") or {}).get("zeroed") is True:
                    score = 0.0            # reference_reuse='zero': not a disagreement, the course's rule
                grade.auto_score = score
                if in_kernel != (status == PASSED):
                    flagged.append({"learner": record["student"], "lab": record["assignment"],
                                    "notebook": record["notebook"], "cell": verdict["grade_id"],
                                    "points": points, "in_kernel": PASSED if in_kernel else FAILED,
                                    "judge": status, "score": score, "message": verdict.get("message", "")})
        gb.db.commit()
    return flagged


# == command line ================================================================================
def judge_notebook(path: str | os.PathLike, *, source: str | os.PathLike | None = None, seed: int | None = None,
                   timeout: int = 300, call_timeout: float = 60.0, cwd: str | None = None) -> tuple[list[dict], float]:
    """Run a notebook in a plain local kernel with nbgrader's Execute plus the judge (no
    gradebook: test-cell sources come from the notebook, whose graded cells must be locked, or,
    like ``nbgrader autograde`` does, from the graded cells of the SOURCE notebook with the same
    grade_id, hidden tests included). Returns (verdicts, seconds)."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    if source is not None:
        tests = {c.metadata.nbgrader["grade_id"]: c.source for c in nbformat.read(str(source), as_version=4).cells
                 if c.get("metadata", {}).get("nbgrader", {}).get("grade")
                 and not c.metadata.nbgrader.get("solution")}
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("grade_id") in tests and not meta.get("solution"):
                cell.source = tests[meta["grade_id"]]
    cls = make_judge_execute()
    folder = cwd or str(Path(path).resolve().parent)
    pre = cls(timeout=timeout, call_timeout=call_timeout, seed=seed, enforce=False,
              verdict_path="-", kernel_name="python3")
    resources = {"metadata": {"path": folder}}
    start = time.monotonic()
    pre.preprocess(nb, resources)
    return pre._judge_verdicts, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--json", help="write all verdicts to this file")
    parser.add_argument("--source", help="source notebook (or a folder like solutions/ holding LAB/LAB.ipynb) "
                        "whose test cells replace the notebook's, hidden tests included")
    args = parser.parse_args(argv)
    everything = {}
    failed = 0
    for path in args.notebooks:
        source = None
        if args.source:
            source = args.source if args.source.endswith(".ipynb") else \
                str(Path(args.source) / Path(path).parent.name / Path(path).name)
        verdicts, seconds = judge_notebook(path, source=source, seed=args.seed, timeout=args.timeout)
        everything[path] = {"seconds": seconds, "cells": verdicts}
        print(f"{path}: {seconds:.1f} s (kernel + judge)")
        for v in verdicts:
            calls = sum(c["calls"] for c in v["checks"])
            kernel_s = v.get("kernel_seconds")
            print(f"  {v['grade_id']:28s} {v['status']:8s} kernel {'passed' if v['in_kernel_passed'] else 'FAILED'}"
                  f" {kernel_s if kernel_s is not None else float('nan'):6.2f} s  judge {v['seconds']:6.2f} s "
                  f"{calls:5d} calls  {v['message'][:150]}")
            failed += v["status"] != PASSED
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
