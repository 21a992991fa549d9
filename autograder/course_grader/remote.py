"""Plain-data calls between the trusted grading judge and a learner's kernel.

The judge (``course_grader.judge``) runs the unchanged ``course_lib.grading`` checkers in its own
process and hands them proxies for the learner's functions. Calling a proxy encodes the arguments
with this module, asks the learner's kernel to call the real function (looked up by name in the
kernel's namespace) on the decoded arguments, and decodes what comes back. Only data crosses: JSON
for the structure, tensors and arrays as their raw bytes (base64 in the JSON).

Node format (every JSON object is a tagged node, so a plain dict never looks like one):

    null, true/false, int, float (NaN/Infinity allowed), str    themselves
    [a, b, ...]                                                 a list
    {"$": "tuple" | "deque", "items": [...]} (deque: "maxlen")  a tuple / collections.deque
    {"$": "dict", "items": [[key, value], ...]}                 a dict (any hashable keys)
    {"$": "tensor", "dtype": "float32", "shape": [..], "data": b64}   a plain torch.Tensor
    {"$": "ndarray", "dtype": "<f8", "shape": [..], "data": b64, "writeable": bool}
    {"$": "npscalar", "dtype": "<f8", "data": b64}             numpy scalar (np.float64 ...)
    {"$": "value", "type": "StepPlan", "fields": [[name, node], ...]}  frozen records (ModelConfig ...)
    {"$": "state", "type": "BlockPool", "fields": [[name, node], ...]} objects with a WIRE_STATE
    {"$": "decoder", "config": node, "params": [[name, tensor node], ...]}   a Decoder (rebuilt)
    {"$": "ref", "id": n}        the n-th object of the call (aliasing, in-place writes)
    {"$": "callback", "id": n}   the n-th judge-side callable (the kernel calls back)
    {"$": "opaque", "type": "module.Qualname"}   something that cannot cross (refused)

Judge -> kernel (``CallEncoder``, ``CallDecoder``): mutable arguments go to an object table and
are sent as ``ref``s, so aliasing survives. Kernel -> judge (``ResultEncoder``, ``ResultDecoder``):
only exact types are encoded, an argument comes back as a ``ref`` to the judge's own object, and
the new state of changed arguments is applied only where the checker's contract lets the learner
write (``apply_state``). A call may carry ``watch`` (``provenance.watch_spec``: the kernel says
which references' code ran) and ``probes`` (the contract's ``Probe``s: a rebuilt argument's
submodule whose forward calls the kernel records by input shape and dtype and ``replay_probes``
replays on the judge's object, where a checker's hooks count them) and ``via`` (a kernel exercise:
the kernel launches the learner's ``@triton.jit`` function through the course launcher of that name,
``course_lib.kernels.exercise.LAUNCHERS``, whose report of the launch comes back with the outputs).
The judge sends such a request not to the learner's kernel but to a process of its own
(``course_grader.kernel_runner``, which answers it with ``answer_call`` too); the learner's kernel
answers an ``export`` request instead (``answer_export``: the kernel's source as data).
``serve()`` is the kernel's
loop: input_request prompts (``PROMPT`` + JSON) through the ``input`` ipykernel installs for the
harness's execute_request (its public ``raw_input``), taken before learner code runs; replies are
input_reply values.

Defends against: code run by data (no pickle or eval: a tampered kernel can only send wrong data,
which the checker judges like any wrong answer); malformed or oversized messages (``Limits``,
counted before JSON is parsed); rigged values (a subclass of a known type, a rigged ``__eq__``, a
cycle: an ``Opaque`` stand-in that equals nothing); a learner function rewriting a checker's
inputs (``apply_state``); the learner's ``input()``/``getpass`` during a call (they raise, as in a
graded cell with stdin off). Does not defend against anything inside the kernel: its half runs in
the learner's process, so learner code can replace it, forge answers, fake or hide a probe's calls
(hiding shows as too few) or write to the stdin channel itself (``kernel.raw_input``; the judge
refuses prompts that are not the protocol's). Probed inputs cross as shapes, not values.
"""
from __future__ import annotations

import base64
import binascii
import builtins
import contextlib
import functools
import getpass
import json
import math
import re
from collections import deque
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["PROTOCOL", "PROMPT", "RemoteDataError", "Opaque", "opaque_class", "CallEncoder", "CallDecoder",
           "ResultEncoder", "ResultDecoder", "dumps", "loads", "decode_value", "encode_bytes",
           "probe_request", "replay_probes", "serve", "answer_call", "answer_export", "BUILTIN_ERRORS", "LIMITS"]

PROTOCOL = "course-judge/2"
#: The most intra-op threads a call request may ask the kernel for (its "threads": the judge's count).
MAX_THREADS = 64
#: Every harness message (an input_request prompt) starts with this.
PROMPT = "\x1e" + PROTOCOL + " "


class Limits:
    """Caps on what one message may hold (both sides check what they decode)."""
    max_depth = 64               # nesting of containers
    max_dims = 16                # tensor / array rank
    max_tensor_bytes = 1 << 26   # one tensor or array: 64 MiB
    max_total_bytes = 1 << 27    # all tensors and arrays of one message: 128 MiB
    max_items = 1 << 20          # container elements in one message
    max_str = 1 << 20            # characters of one str value
    max_message = 3 << 26        # characters of one JSON message (192 Mi; base64 of 128 MiB fits)
    max_probed_calls = 100_000   # forward calls replayed for one learner call
    max_probed_elements = 1_000_000   # input elements of those calls together


LIMITS = Limits()


class RemoteDataError(ValueError):
    """Data from the other side does not fit the protocol (malformed, too large, wrong kind)."""


# -- type tables --------------------------------------------------------------------------------
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}
_TORCH_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
NUMPY_DTYPES = ("|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8")
NUMPY_SCALARS = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                 np.float16, np.float32, np.float64)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.<>]")
_TABLES: dict[str, Any] = {}


def _tables() -> dict[str, Any]:
    """The course_lib classes that cross, imported on first use: ``values`` (frozen records),
    ``states`` (mutable objects, each with the attributes its ``WIRE_STATE`` names, declared next
    to the class so that renaming a field there cannot silently break grading) and ``decoder``."""
    if not _TABLES:
        from course_lib.cache.contiguous import KVCache
        from course_lib.cache.paged import BlockPool, PagedKVCache, PagedSequence
        from course_lib.hardware import Device
        from course_lib.models.config import ModelConfig
        from course_lib.models.decoder import Decoder
        from course_lib.scheduling.cost import Deployment
        from course_lib.scheduling.step import StepPlan
        from course_lib.scheduling.workload import Request, RequestRecord

        values = {cls.__name__: cls for cls in (ModelConfig, Device, Deployment, Request, RequestRecord, StepPlan)}
        states = {cls.__name__: (cls, tuple(cls.WIRE_STATE))
                  for cls in (BlockPool, PagedSequence, PagedKVCache, KVCache)}
        _TABLES.update(values=values, states=states, decoder=Decoder,
                       value_names={cls: name for name, cls in values.items()},
                       state_names={cls: name for name, (cls, _) in states.items()})
    return _TABLES


def _record_fields(cls, tables: dict) -> tuple[str, str, tuple[str, ...]]:
    """(tag, type name, field names) of a value or state class."""
    if cls in tables["value_names"]:
        return "value", tables["value_names"][cls], tuple(cls.__dataclass_fields__)
    name = tables["state_names"][cls]
    return "state", name, tables["states"][name][1]


# -- stand-ins for what cannot cross -------------------------------------------------------------
class Opaque:
    """Stand-in for a kernel value that cannot be sent as data (an unknown type, a subclass of a
    known one, a cycle). Its class is named after the kernel's type, so a checker's message says
    "got mymodule.EvilTensor"; it equals only itself and supports no arithmetic."""

    __slots__ = ()
    kernel_type = "?"

    def __repr__(self) -> str:
        return f"<{self.kernel_type} from the learner's kernel (not plain data)>"

    def __bool__(self) -> bool:
        return True


_OPAQUE_CLASSES: dict[str, type] = {}


def opaque_class(kernel_type: str) -> type:
    """A subclass of ``Opaque`` whose module and qualname spell ``kernel_type`` (sanitised; at most
    512 distinct names, then "unknown")."""
    name = _SAFE_NAME.sub("_", str(kernel_type))[:120] or "unknown"
    if name not in _OPAQUE_CLASSES and len(_OPAQUE_CLASSES) > 512:
        name = "unknown"
    if name not in _OPAQUE_CLASSES:
        module, _, qual = name.rpartition(".")
        _OPAQUE_CLASSES[name] = type(qual or "unknown", (Opaque,), {"__slots__": (), "kernel_type": name,
                                     "__module__": module or "builtins", "__qualname__": qual or "unknown"})
    return _OPAQUE_CLASSES[name]


def _type_name(obj) -> str:
    try:
        kind = type(obj)
        module = kind.__module__ if type(kind.__module__) is str else "?"
        qual = kind.__qualname__ if type(kind.__qualname__) is str else "?"
        return qual if module == "builtins" else f"{module}.{qual}"
    except Exception:  # a hostile metaclass
        return "unknown"


def _opaque_node(obj, why: str = "") -> dict:
    return {"$": "opaque", "type": _type_name(obj), **({"why": why} if why else {})}


# -- JSON ------------------------------------------------------------------------------------------
def dumps(obj) -> str:
    """JSON text of a node tree (NaN and infinities allowed)."""
    return json.dumps(obj, allow_nan=True, separators=(",", ":"))


def loads(text) -> Any:
    """Parse JSON text from the other side; any failure is a RemoteDataError."""
    if type(text) is not str:
        raise RemoteDataError(f"expected JSON text, got {_type_name(text)}")
    if len(text) > LIMITS.max_message:
        raise RemoteDataError(f"message of {len(text):,} characters is over the limit")
    # Parsed JSON costs far more memory than its text (a list per "[]", an object per number):
    # count the elements before parsing, so a message cannot blow up the judge's memory.
    elements = text.count(",") + text.count("[") + text.count("{")
    if elements > 2 * LIMITS.max_items:
        raise RemoteDataError(f"message with about {elements:,} JSON elements is over the limit")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RemoteDataError(f"malformed JSON: {str(exc)[:200]}") from None


# -- raw bytes -------------------------------------------------------------------------------------
def encode_bytes(data: bytes) -> str:
    """Raw bytes as the protocol's base64 text (the ``data`` of tensor, ndarray and npscalar nodes)."""
    return base64.b64encode(data).decode("ascii")


def _tensor_node(t: torch.Tensor) -> dict:
    """Node of a tensor's values (detached, on the CPU, contiguous); dtype must be in TORCH_DTYPES."""
    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    flat = t.reshape(-1)
    data = b"" if t.numel() == 0 else \
        (flat.view(torch.uint8) if t.dtype != torch.bool else flat.to(torch.uint8)).numpy().tobytes()
    return {"$": "tensor", "dtype": _TORCH_NAMES[t.dtype], "shape": list(t.shape), "data": encode_bytes(data)}


def _little_endian(dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def _ndarray_node(a: np.ndarray) -> dict:
    b = np.ascontiguousarray(a, dtype=_little_endian(a.dtype))
    return {"$": "ndarray", "dtype": b.dtype.str, "shape": list(b.shape), "data": encode_bytes(b.tobytes()),
            "writeable": bool(a.flags.writeable)}


def _npscalar_node(x) -> dict:
    arr = np.asarray(x)
    dt = _little_endian(arr.dtype)
    return {"$": "npscalar", "dtype": np.dtype(dt).str, "data": encode_bytes(arr.astype(dt).tobytes())}


def _tensor_ok(t) -> bool:
    """A plain dense tensor of a dtype that can cross."""
    try:
        return (t.layout == torch.strided and not t.is_quantized and not t.is_nested
                and t.dtype in _TORCH_NAMES and t.device.type in ("cpu", "cuda", "mps"))
    except Exception:
        return False


def _ndarray_ok(a) -> bool:
    try:
        return np.dtype(_little_endian(a.dtype)).str in NUMPY_DTYPES
    except Exception:
        return False


def _shape(shape) -> tuple[int, ...]:
    if type(shape) is not list or len(shape) > LIMITS.max_dims or any(type(s) is not int or s < 0 for s in shape):
        raise RemoteDataError(f"bad shape {str(shape)[:80]}")
    return tuple(shape)


def _data(node: dict, nbytes: int, budget: "_Decoder | None" = None) -> bytes:
    """The ``data`` of a node: base64 of exactly NBYTES bytes (counted against BUDGET)."""
    if budget is not None:
        budget.take_bytes(nbytes)
    text = node.get("data")
    if type(text) is not str:
        raise RemoteDataError("tensor data must be a base64 str")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RemoteDataError("tensor data is not valid base64") from None
    if len(data) != nbytes:
        raise RemoteDataError(f"tensor data holds {len(data)} bytes, its dtype and shape need {nbytes}")
    return data


def _decode_tensor(node: dict, budget: "_Decoder") -> torch.Tensor:
    _keys(node, {"$", "dtype", "shape", "data"})
    dtype = TORCH_DTYPES.get(node.get("dtype")) if type(node.get("dtype")) is str else None
    if dtype is None:
        raise RemoteDataError(f"tensor dtype {str(node.get('dtype'))[:40]!r} cannot cross")
    shape = _shape(node.get("shape"))
    data = _data(node, math.prod(shape) * torch.empty((), dtype=dtype).element_size(), budget)
    if not data:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)   # owns its fresh bytearray: no copy needed
    return raw.ne(0).reshape(shape) if dtype == torch.bool else raw.view(dtype).reshape(shape)   # no invalid bools


def _numpy_dtype(node: dict, what: str) -> np.dtype:
    if node.get("dtype") not in NUMPY_DTYPES:
        raise RemoteDataError(f"{what} dtype {str(node.get('dtype'))[:40]!r} cannot cross")
    return np.dtype(node["dtype"])


def _decode_ndarray(node: dict, budget: "_Decoder") -> np.ndarray:
    _keys(node, {"$", "dtype", "shape", "data", "writeable"})
    dt, shape = _numpy_dtype(node, "array"), _shape(node.get("shape"))
    data = _data(node, math.prod(shape) * dt.itemsize, budget)
    if dt.kind == "b":
        arr = (np.frombuffer(data, dtype=np.uint8) != 0).reshape(shape)
    else:
        arr = np.frombuffer(data, dtype=dt).reshape(shape).astype(dt.newbyteorder("="), copy=True)
    if type(node.get("writeable")) is not bool:
        raise RemoteDataError("array 'writeable' must be a bool")
    arr.flags.writeable = node["writeable"]
    return arr


def _decode_npscalar(node: dict):
    _keys(node, {"$", "dtype", "data"})
    dt = _numpy_dtype(node, "numpy scalar")
    data = _data(node, dt.itemsize)
    if dt.kind == "b":
        return np.bool_(data != b"\x00")
    return np.frombuffer(data, dtype=dt).astype(dt.newbyteorder("="))[0]


def _keys(node: dict, allowed: set[str]) -> None:
    extra = set(node) - allowed
    if extra:
        raise RemoteDataError(f"unexpected keys {sorted(extra)[:5]} in a {node.get('$')!r} node")


def _pairs(node: dict, key: str) -> list:
    items = node.get(key)
    if type(items) is not list or any(type(p) is not list or len(p) != 2 for p in items):
        raise RemoteDataError(f"{node.get('$')!r} node: {key!r} must be a list of pairs")
    return items


def _field_pairs(node: dict, expected: tuple[str, ...]) -> list:
    pairs = _pairs(node, "fields")
    names = [p[0] for p in pairs]
    if sorted(names, key=str) != sorted(expected) or len(set(names)) != len(names):
        raise RemoteDataError(f"{node.get('type')!r} node: fields {names[:12]} differ from {list(expected)}")
    return pairs


def _structure(value, kind: type, item: Callable, tables: dict):
    """The node of ``value`` read as ``kind`` (list, tuple, deque, dict, or a value or state class),
    each element encoded by ``item``. Reads through the base types, so an override cannot run."""
    if kind is list:
        return [item(v) for v in list.copy(value)]
    if kind is tuple:
        return {"$": "tuple", "items": [item(v) for v in tuple.__iter__(value)]}
    if kind is deque:
        return {"$": "deque", "items": [item(v) for v in deque.copy(value)], "maxlen": value.maxlen}
    if kind is dict:
        return {"$": "dict", "items": [[item(k), item(v)] for k, v in list(dict.items(value))]}
    tag, name, fields = _record_fields(kind, tables)
    return {"$": tag, "type": name, "fields": [[f, item(object.__getattribute__(value, f))] for f in fields]}


class _Decoder:
    """What both sides' decoders share: the limits of one message (depth, bytes, items, str
    length) and the node kinds without refs; ``_tagged`` of a subclass adds its own kinds."""

    def __init__(self):
        self.bytes = 0
        self.items = 0

    def take_bytes(self, n: int) -> None:
        if n > LIMITS.max_tensor_bytes:
            raise RemoteDataError(f"a tensor or array of {n:,} bytes is over the limit")
        self.bytes += n
        if self.bytes > LIMITS.max_total_bytes:
            raise RemoteDataError("the tensors and arrays of one message are over the size limit")

    def take_items(self, n: int) -> None:
        self.items += n
        if self.items > LIMITS.max_items:
            raise RemoteDataError("too many container elements in one message")

    def decode(self, node, depth: int = 0):
        if depth > LIMITS.max_depth:
            raise RemoteDataError("nesting too deep")
        t = type(node)
        if node is None or t in (bool, int, float):
            return node
        if t is str:
            if len(node) > LIMITS.max_str:
                raise RemoteDataError("str value over the length limit")
            return node
        if t is list:
            self.take_items(len(node))
            return [self.decode(v, depth + 1) for v in node]
        if t is not dict:
            raise RemoteDataError(f"bad node of type {_type_name(node)}")
        return self._tagged(node, node.get("$"), depth)

    def _tagged(self, node: dict, tag, depth: int):
        if tag in ("tuple", "deque"):
            _keys(node, {"$", "items", "maxlen"} if tag == "deque" else {"$", "items"})
            items, maxlen = node.get("items"), node.get("maxlen")
            if type(items) is not list or not (maxlen is None or (type(maxlen) is int and maxlen >= 0)):
                raise RemoteDataError(f"bad {tag} node")
            self.take_items(len(items))
            values = (self.decode(v, depth + 1) for v in items)
            return tuple(values) if tag == "tuple" else deque(values, maxlen=maxlen)
        if tag == "dict":
            _keys(node, {"$", "items"})
            pairs = _pairs(node, "items")
            self.take_items(len(pairs))
            out = {}
            for k, v in pairs:
                key, value = self.decode(k, depth + 1), self.decode(v, depth + 1)
                try:
                    out[key] = value
                except TypeError:
                    raise RemoteDataError(f"unhashable dict key of type {_type_name(key)}") from None
            return out
        if tag in ("tensor", "ndarray"):
            return (_decode_tensor if tag == "tensor" else _decode_ndarray)(node, self)
        if tag == "npscalar":
            return _decode_npscalar(node)
        if tag == "value":
            _keys(node, {"$", "type", "fields"})
            cls = _tables()["values"].get(node.get("type")) if type(node.get("type")) is str else None
            if cls is None:
                raise RemoteDataError(f"unknown value type {str(node.get('type'))[:40]!r}")
            obj = cls.__new__(cls)   # mirror the fields exactly; no constructor runs
            for f, v in _field_pairs(node, tuple(cls.__dataclass_fields__)):
                object.__setattr__(obj, f, self.decode(v, depth + 1))
            return obj
        if tag == "opaque":
            _keys(node, {"$", "type", "why"})
            return opaque_class(str(node.get("type")))()
        raise RemoteDataError(f"unknown node tag {str(tag)[:40]!r}")


# -- judge -> kernel: the call ---------------------------------------------------------------------
class CallEncoder:
    """Encodes a call's arguments on the judge side (trusted values). Mutable objects go to
    ``table`` (``[[oid, node], ...]``; ``objects[oid]`` is the judge's object) and are sent as
    ``ref`` nodes, so aliasing survives and the kernel can send their new state back; callables
    become ``callback`` nodes (``callbacks[cid]``). With ``register=False`` everything is inlined
    (callback return values). Raises TypeError for a type the protocol does not carry (a grader bug)."""

    def __init__(self, register: bool = True):
        self.register = register
        self.table: list[list] = []
        self.objects: list[Any] = []
        self.callbacks: list[Callable] = []
        self._ids: dict[int, int] = {}

    def encode(self, value, depth: int = 0):
        if depth > LIMITS.max_depth:
            raise TypeError("argument nested too deeply")
        t = type(value)
        if value is None or t in (bool, int, float, str):
            return value
        tables = _tables()
        if t is tuple or t in tables["value_names"]:
            return _structure(value, t, lambda v: self.encode(v, depth + 1), tables)
        if t in NUMPY_SCALARS:
            return _npscalar_node(value)
        if isinstance(value, (list, dict, deque, torch.Tensor, np.ndarray, tables["decoder"])) \
                or t in tables["state_names"]:
            if not self.register:
                return self._node(value, depth, tables)
            oid = self._ids.get(id(value))
            if oid is None:
                oid = self._ids[id(value)] = len(self.objects)
                self.objects.append(value)
                entry = [oid, None]
                self.table.append(entry)
                entry[1] = self._node(value, depth, tables)
            return {"$": "ref", "id": oid}
        if callable(value):
            self.callbacks.append(value)
            return {"$": "callback", "id": len(self.callbacks) - 1}
        raise TypeError(f"the judge cannot send a {_type_name(value)} to the kernel")

    def _node(self, value, depth: int, tables: dict):
        if isinstance(value, torch.Tensor):
            if not _tensor_ok(value):
                raise TypeError(f"the judge cannot send a tensor of dtype {value.dtype}")
            return _tensor_node(value)
        if isinstance(value, np.ndarray):
            if not _ndarray_ok(value):
                raise TypeError(f"the judge cannot send an array of dtype {value.dtype}")
            return _ndarray_node(value)
        if isinstance(value, tables["decoder"]):
            return {"$": "decoder", "config": self.encode(value.config, depth + 1),
                    "params": [[k, _tensor_node(v)] for k, v in value.state_dict().items()]}
        kind = type(value) if type(value) in tables["state_names"] else \
            next(k for k in (list, deque, dict) if isinstance(value, k))
        return _structure(value, kind, lambda v: self.encode(v, depth + 1), tables)


class CallDecoder(_Decoder):
    """Decodes a call on the kernel side: builds the object table lazily (aliasing kept) and
    turns ``callback`` nodes into functions made by ``make_callback(cid)``."""

    def __init__(self, table, make_callback: Callable[[int], Callable] | None = None):
        super().__init__()
        self.nodes: dict[int, Any] = {}
        for entry in table or []:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int:
                raise RemoteDataError("bad object table entry")
            self.nodes[entry[0]] = entry[1]
        self.memo: dict[int, Any] = {}
        self.make_callback = make_callback

    def object(self, oid: int):
        if oid in self.memo:
            return self.memo[oid]
        if oid not in self.nodes:
            raise RemoteDataError(f"reference to unknown object {oid}")
        node = self.nodes[oid]
        tag = node.get("$") if type(node) is dict else None
        tables = _tables()
        if tag == "state":
            if node.get("type") not in tables["states"]:
                raise RemoteDataError(f"unknown state type {node.get('type')!r}")
            cls, names = tables["states"][node["type"]]
            obj = self.memo[oid] = cls.__new__(cls)
            for f, v in _field_pairs(node, names):
                object.__setattr__(obj, f, self.decode(v, 1))
            return obj
        if tag == "decoder":
            config = self.decode(node.get("config"), 1)
            model = tables["decoder"](config)
            model.load_state_dict({k: _decode_tensor(v, self) for k, v in _pairs(node, "params")},
                                  assign=True)        # strict: every parameter, right shapes
            if getattr(config, "tie_embeddings", False):
                model.lm_head.weight = model.embed_tokens.weight
            self.memo[oid] = model = model.eval().requires_grad_(False)
            return model
        if type(node) is list or tag in ("dict", "deque"):   # known before its items: they may refer to it
            shell = [] if type(node) is list else {} if tag == "dict" else deque(maxlen=node.get("maxlen"))
            self.memo[oid] = shell
            _mirror(shell, self.decode(node, 1))
            return shell
        obj = self.memo[oid] = self.decode(node, 1)
        return obj

    def _tagged(self, node: dict, tag, depth: int):
        if tag == "ref":
            return self.object(node.get("id"))
        if tag == "callback":
            if self.make_callback is None:
                raise RemoteDataError("callback where none is allowed")
            return self.make_callback(node.get("id"))
        return super()._tagged(node, tag, depth)


# -- kernel -> judge: results and argument state ---------------------------------------------------
class ResultEncoder:
    """Encodes learner values on the kernel side. Only exact types cross; anything else (a
    subclass, a rigged object, a cycle, a Decoder the learner built) becomes ``opaque``.
    ``known`` maps id(object) -> oid for the call's argument objects: they are sent as refs."""

    def __init__(self, known: dict[int, int] | None = None):
        self.known = known or {}
        self._active: set[int] = set()
        self.items = 0

    def encode(self, value, depth: int = 0):
        t = type(value)
        if value is None or t is bool or t is int or t is float:
            return value
        if t is str:
            return value if len(value) <= LIMITS.max_str else _opaque_node(value, "str too long")
        if id(value) in self.known:              # one of the call's (live) argument objects
            return {"$": "ref", "id": self.known[id(value)]}
        return self.inline(value, depth)

    def inline(self, value, depth: int = 0):
        """The node of ``value`` itself (never a ref to it; its elements may be refs)."""
        if depth >= LIMITS.max_depth:
            return _opaque_node(value, "nested too deeply")
        t = type(value)
        tables = _tables()
        if t is torch.Tensor:
            return _tensor_node(value) if _tensor_ok(value) else _opaque_node(value, "tensor kind")
        if t is np.ndarray:
            return _ndarray_node(value) if _ndarray_ok(value) else _opaque_node(value, "array dtype")
        if t in NUMPY_SCALARS:
            return _npscalar_node(value)
        if t in (list, tuple, dict, deque) or t in tables["state_names"] or t in tables["value_names"]:
            if id(value) in self._active:
                return _opaque_node(value, "cycle")
            if t in (list, tuple, dict, deque):
                self.items += len(value)
                if self.items > LIMITS.max_items:
                    return _opaque_node(value, "too many items")
            self._active.add(id(value))
            try:
                return _structure(value, t, lambda v: self.encode(v, depth + 1), tables)
            except AttributeError as exc:     # a record without one of its fields
                return _opaque_node(value, f"missing attribute: {_safe_str(exc)[:100]}")
            finally:
                self._active.discard(id(value))
        return _opaque_node(value)


class ResultDecoder(_Decoder):
    """Decodes kernel data on the judge side, strictly: only the node kinds above, exact
    sizes, and refs only to the call's own argument objects (``objects[oid]``)."""

    def __init__(self, objects: list | None = None):
        super().__init__()
        self.objects = objects or []

    def _tagged(self, node: dict, tag, depth: int):
        if tag == "ref":
            _keys(node, {"$", "id"})
            oid = node.get("id")
            if type(oid) is not int or not 0 <= oid < len(self.objects):
                raise RemoteDataError(f"reference to unknown object {str(oid)[:20]}")
            return self.objects[oid]
        if tag == "state":
            raise RemoteDataError("a new course_lib object cannot come back from the kernel (only its arguments)")
        return super()._tagged(node, tag, depth)

    # -- in-place writes ---------------------------------------------------------------------
    def apply_state(self, entries, allowed: set[int] | None = None) -> dict[int, Any]:
        """Apply the kernel's post-call state of argument objects (``[[oid, node], ...]``, the node's
        elements may be refs) to the judge's objects whose oids are in ``allowed`` (None: all).
        Any other changed argument stays as it was (a checker's inputs cannot be rewritten from the
        kernel); a fresh copy holding the kernel's state stands for it where the result refers to
        it (``decode`` resolves refs to that view afterwards). Returns {oid: copy} of those copies.

        Raises: RemoteDataError (malformed entries); TypeError (an argument's new state cannot be
        mirrored, e.g. a tensor argument replaced by a list: the call counts as failed)."""
        if type(entries) is not list:
            raise RemoteDataError("state must be a list")
        pairs = []
        for entry in entries:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int \
                    or not 0 <= entry[0] < len(self.objects):
                raise RemoteDataError("bad state entry")
            pairs.append((entry[0], entry[1]))
        view = list(self.objects)
        copies: dict[int, Any] = {}
        for oid, _ in pairs:
            if allowed is not None and oid not in allowed:
                copies[oid] = _empty_like(self.objects[oid])
                if copies[oid] is not None:
                    view[oid] = copies[oid]
        originals, self.objects = self.objects, view     # refs inside the new states see the copies
        decoded = [(oid, self._state_value(originals[oid], node)) for oid, node in pairs]
        for oid, new in decoded:
            if oid not in copies:
                _mirror(originals[oid], new)
            elif copies[oid] is None:                       # a tensor or array: the decoded value
                copies[oid] = view[oid] = new
            else:
                _mirror(copies[oid], new)
        return copies

    def _state_value(self, orig, node):
        tables = _tables()
        t = type(orig)
        if isinstance(orig, tables["decoder"]):
            raise RemoteDataError("a Decoder's state is never sent back")
        if t in tables["state_names"]:
            name = tables["state_names"][t]
            if type(node) is not dict or node.get("$") != "state" or node.get("type") != name:
                raise TypeError(f"the {name} argument came back as something else")
            _keys(node, {"$", "type", "fields"})
            return {f: self.decode(v, 1) for f, v in _field_pairs(node, tables["states"][name][1])}
        value = self.decode(node, 0)
        expected = next((k for k in (torch.Tensor, np.ndarray, deque, dict) if isinstance(orig, k)), list)
        if type(value) is not expected:
            raise TypeError(f"an argument of type {_type_name(orig)} came back as {_type_name(value)}")
        return value


def _empty_like(orig):
    """An empty object of ``orig``'s kind to receive a kernel state (None for tensors/arrays)."""
    if isinstance(orig, (torch.Tensor, np.ndarray)):
        return None
    if isinstance(orig, deque):
        return deque(maxlen=orig.maxlen)
    return {} if isinstance(orig, dict) else [] if isinstance(orig, list) else type(orig).__new__(type(orig))


def _mirror(orig, new) -> None:
    """Make the object ``orig`` hold ``new`` (decoded state of the same kind), in place."""
    if isinstance(orig, torch.Tensor):
        with torch.no_grad():
            if new.dtype != orig.dtype:
                orig.data = new
            else:
                if new.shape != orig.shape:
                    orig.resize_(new.shape)
                orig.copy_(new)
    elif isinstance(orig, np.ndarray):
        if new.dtype != orig.dtype or new.shape != orig.shape:
            raise TypeError("an array argument changed its dtype or shape, which cannot happen in place")
        was = orig.flags.writeable
        orig.flags.writeable = True
        np.copyto(orig, new)
        orig.flags.writeable = was
    elif isinstance(orig, dict):
        orig.clear()
        orig.update(new)
    elif isinstance(orig, deque):
        orig.clear()
        orig.extend(new)
    elif isinstance(orig, list):
        orig[:] = new
    else:
        for f, v in new.items():   # a state object: its fields
            object.__setattr__(orig, f, v)


# -- probes: forward calls mirrored from the kernel's objects onto the judge's -----------------------
def probe_request(objects: list, probes) -> list[list]:
    """The ``probes`` of a call request: ``[[oid, path], ...]``, one per argument object (``objects``,
    the CallEncoder's) that is an instance of a probe's ``owner`` (``course_lib.grading.tables.Probe``
    entries of the checker's contract), with that probe's submodule path."""
    return [[oid, probe.submodule] for probe in probes
            for oid, obj in enumerate(objects) if isinstance(obj, probe.owner)]


def _probe_hooks(decoder: CallDecoder, requested) -> tuple[list, list]:
    """Kernel side: a forward hook on each requested submodule that records the shape and dtype of
    its first input, per call. Returns (one list of ``[shape, dtype]`` per probe, the hooks' handles)."""
    records, handles = [], []
    for oid, path in requested:
        calls: list = []

        def hook(module, inputs, output, _calls=calls):
            x = inputs[0] if type(inputs) is tuple and inputs else None
            if type(x) is torch.Tensor and x.dtype in _TORCH_NAMES:
                _calls.append([list(x.shape), _TORCH_NAMES[x.dtype]])
        handles.append(decoder.object(oid).get_submodule(path).register_forward_hook(hook))
        records.append(calls)
    return records, handles


def replay_probes(records, objects: list, requested: list) -> None:
    """Judge side: replay the forward calls the kernel recorded (``records``, one list per entry of
    ``requested``, the call's ``probe_request``) on the judge's own objects: the judge's submodule
    runs once per recorded call, without gradients, on zeros of the recorded shape and dtype, so
    that forward hooks a checker put there (``lab02``'s token counters) see the learner's calls.

    Raises: RemoteDataError for records that are malformed, over ``LIMITS.max_probed_calls`` calls
    or ``max_probed_elements`` input elements, or a replayed call that fails."""
    if type(records) is not list or len(records) != len(requested) or any(type(r) is not list for r in records):
        raise RemoteDataError("bad probed calls")
    n_calls = n_elements = 0
    for (oid, path), calls in zip(requested, records):
        module = objects[oid].get_submodule(path)
        for call in calls:
            if type(call) is not list or len(call) != 2 or type(call[1]) is not str or call[1] not in TORCH_DTYPES:
                raise RemoteDataError("bad probed call")
            shape = _shape(call[0])
            n_calls, n_elements = n_calls + 1, n_elements + math.prod(shape)
            if n_calls > LIMITS.max_probed_calls or n_elements > LIMITS.max_probed_elements:
                raise RemoteDataError("probed calls over the limit")
            try:
                with torch.no_grad():
                    module(torch.zeros(shape, dtype=TORCH_DTYPES[call[1]]))
            except Exception as exc:
                raise RemoteDataError(f"replaying a probed call failed: {type(exc).__name__}") from None


# -- convenience ------------------------------------------------------------------------------------
def decode_value(text: str, objects: list | None = None):
    """Strictly decode JSON text from a kernel (``ResultDecoder``)."""
    return ResultDecoder(objects).decode(loads(text))


# == kernel side: the serve loop the judge's harness cell runs ====================================
#: Built-in exception types a learner's function may raise that the judge re-raises as such.
BUILTIN_ERRORS = ("ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError",
                   "ZeroDivisionError", "NotImplementedError", "AssertionError", "ArithmeticError",
                   "OverflowError", "LookupError", "NameError", "UnboundLocalError", "RecursionError")


def serve(namespace: dict | None = None) -> None:
    """Answer the judge until it says "end" (in the learner's kernel, inside the harness's
    execute_request, sent with allow_stdin=True). Each message to the judge is an input_request
    whose prompt is ``PROMPT`` + JSON, sent through the ``input`` ipykernel installed for that
    request (``Kernel.raw_input``), taken before any learner code runs; the input_reply is the
    next request: ``describe``, ``call`` (``answer_call``) or ``end``. While a request is answered
    the learner's ``input()`` and ``getpass`` raise StdinNotImplementedError, as in a graded cell."""
    from IPython import get_ipython

    ns = get_ipython().user_ns if namespace is None else namespace
    channel = builtins.input

    def ask(message: dict) -> dict:
        return json.loads(channel(PROMPT + dumps(message)))

    out: dict = {"op": "ready", "protocol": PROTOCOL}
    while True:
        request = ask(out)
        op = request.get("op") if type(request) is dict else None
        if op == "end":
            return
        with _stdin_refused():
            if op == "describe":
                out = {"op": "described", "names": {n: _describe(ns, n) for n in request.get("names", [])}}
            elif op == "export":
                out = answer_export(ns, request)
            else:
                out = answer_call(ns, request, ask) if op == "call" else {"op": "bad-request"}


@contextlib.contextmanager
def _stdin_refused():
    """``input()`` and ``getpass.getpass`` raise inside the block (the stdin channel is the judge's)."""
    def refuse(*args, **kwargs):
        from IPython.core.error import StdinNotImplementedError   # what ipykernel raises with stdin off

        raise StdinNotImplementedError("input() is not available while the grader calls your function: "
                                       "a graded function gets its inputs as arguments")
    saved = builtins.input, getpass.getpass
    builtins.input = getpass.getpass = refuse
    try:
        yield
    finally:
        builtins.input, getpass.getpass = saved


def _describe(ns: dict, name) -> dict:
    if type(name) is not str or name not in ns:
        return {"defined": False}
    obj = ns[name]
    info = {"defined": True, "callable": False, "module": "", "qualname": "", "type": _type_name(obj)}
    with contextlib.suppress(Exception):   # learner attributes may raise
        info["callable"] = bool(callable(obj))
        for key in ("module", "qualname"):
            value = getattr(obj, f"__{key}__", "")
            info[key] = value if type(value) is str else ""
    return info


def answer_export(ns: dict, request: dict) -> dict:
    """The kernel's answer to an "export" request: the learner's ``@triton.jit`` function ``request["fn"]``
    as plain data (``course_lib.kernels.exercise.export_kernel``), which the judge launches in a process of
    its own (``course_grader.kernel_runner``): "exported" with it under "kernel", "raised" when a launch
    would refuse the function (not a kernel, the kernel rule), or "missing"."""
    name = request.get("fn")
    if type(name) is not str or name not in ns:
        return {"op": "missing", "name": str(name)[:100]}
    from course_lib.kernels.exercise import export_kernel

    try:
        return {"op": "exported", "kernel": export_kernel(ns[name], name)}
    except BaseException as exc:  # the learner's kernel refused, as a launch refuses it
        return {"op": "raised", "type": _type_name(exc), "message": _safe_str(exc)}


def answer_call(ns: dict, request: dict, ask) -> dict:
    """The kernel's answer to one "call" request of the judge: look ``request["fn"]`` up in the
    namespace ``ns``, call it on the decoded arguments (``ask`` carries its callbacks back to the
    judge) with the judge's grad mode and intra-op thread count (``grad``, ``threads``: a checker
    that runs its calls on several threads, as Lab 6's does, gets them in the kernel too) and
    return the reply message: "returned" (with the encoded value), "raised",
    "missing", "undecodable" or "unencodable", with the changed argument state (``state``), the
    probed forward calls (``probed``) and, when the request has ``watch``, which references ran.
    With ``via`` (a key of ``course_lib.kernels.exercise.LAUNCHERS``) the function is a learner's
    kernel, launched through that launcher on the arguments."""
    name = request.get("fn")
    if type(name) is not str or name not in ns:
        return {"op": "missing", "name": str(name)[:100]}
    fn = ns[name]
    via = request.get("via")
    if via is not None:         # a kernel exercise: launch the learner's kernel through the course's launcher
        from course_lib.kernels.exercise import LAUNCHERS

        if type(via) is not str or via not in LAUNCHERS:
            return {"op": "undecodable", "message": f"no kernel launcher {str(via)[:40]!r}"}
        fn = functools.partial(LAUNCHERS[via], fn)
    call: dict = {"known": {}, "ended": False}     # what the call's callbacks need
    try:
        decoder = CallDecoder(request.get("objects"), lambda cid: _callback(cid, ask, call))
        args = [decoder.decode(a) for a in request.get("args", [])]
        kwargs = {k: decoder.decode(v) for k, v in request.get("kwargs", [])}
        for oid in decoder.nodes:          # build every table object (some may be unreferenced)
            decoder.object(oid)
        probed, handles = _probe_hooks(decoder, request.get("probes", []))
    except Exception as exc:  # e.g. a course_lib in the kernel that differs from the judge's
        return {"op": "undecodable", "message": f"{_type_name(exc)}: {_safe_str(exc)}"}
    call["known"] = {id(obj): oid for oid, obj in decoder.memo.items()}
    from course_grader.provenance import Observer    # which declared references' code runs (if asked)
    observer = Observer(request.get("watch"))
    threads, kernel_threads = request.get("threads"), torch.get_num_threads()
    try:
        if type(threads) is int and 1 <= threads <= MAX_THREADS:
            torch.set_num_threads(threads)      # as the checker runs in the judge (it may ask for several)
        with torch.set_grad_enabled(request.get("grad") is True), observer:
            result = fn(*args, **kwargs)
        out: dict = {"op": "returned"}
    except BaseException as exc:  # the learner's exception (KeyboardInterrupt included) is the answer
        result, out = None, {"op": "raised", "type": _type_name(exc), "message": _safe_str(exc)}
    finally:
        call["ended"] = True
        torch.set_num_threads(kernel_threads)
        for handle in handles:
            with contextlib.suppress(Exception):
                handle.remove()
    enc = ResultEncoder(call["known"])
    if out["op"] == "returned":
        try:
            out["value"] = enc.encode(result)
        except Exception as exc:
            out = {"op": "unencodable", "message": _safe_str(exc)}
    out.update(state=_changed_state(decoder, enc), probed=probed, **observer.report())
    return out


def _callback(cid, ask, call: dict) -> Callable:
    """The kernel-side function for the judge's callable number CID (valid while its call runs)."""
    def grader_callback(*args, **kwargs):
        if call["ended"]:
            raise RuntimeError("this grader callback is no longer available (its call has ended)")
        enc = ResultEncoder(call["known"])
        reply = ask({"op": "callback", "id": cid, "args": [enc.encode(a) for a in args],
                     "kwargs": [[k, enc.encode(v)] for k, v in kwargs.items()]})
        if type(reply) is dict and reply.get("op") == "return":
            return CallDecoder([], None).decode(reply.get("value"))
        raise RuntimeError(f"the grader's callback failed: {str(reply.get('message', '?'))[:500]}")
    grader_callback.__qualname__ = "grader_callback"
    return grader_callback


def _changed_state(decoder: CallDecoder, enc: ResultEncoder) -> list[list]:
    """``[[oid, node], ...]`` of the argument objects whose node differs from the one sent."""
    state = []
    for oid, obj in decoder.memo.items():
        if isinstance(obj, _tables()["decoder"]):
            continue
        try:
            node = enc.inline(obj)
        except Exception:
            node = _opaque_node(obj, "state")
        if node != decoder.nodes.get(oid):
            state.append([oid, node])
    return state


def _safe_str(exc) -> str:
    try:
        return str(exc)[:2000]
    except Exception:
        return "<message unavailable>"
