"""Plain-data calls between the trusted grading judge and a learner's kernel.

The judge (``course_grader.judge``) runs the unchanged ``course_lib.grading`` checkers in
its own process and hands them *proxies* in place of the learner's functions. Calling a
proxy encodes the arguments with this module, asks the learner's kernel to call the real
function (looked up by name in the kernel's namespace) on the decoded arguments, and
decodes what comes back. Only data crosses: JSON for the structure, tensors and arrays as
their raw bytes (base64 in the JSON). There is no pickle anywhere, so nothing the kernel
sends can make the judge run code; the worst a tampered kernel can do is send wrong data,
which the checker then judges like any other wrong answer.

Node format (every JSON object is a tagged node, so a plain dict never looks like one):

    null, true/false, int, float (NaN/Infinity allowed), str    themselves
    [a, b, ...]                                                 a list
    {"$": "tuple" | "deque", "items": [...]} (deque: "maxlen")  a tuple / collections.deque
    {"$": "dict", "items": [[key, value], ...]}                 a dict (any hashable keys)
    {"$": "tensor", "dtype": "float32", "shape": [..], "data": b64}   a plain torch.Tensor
    {"$": "ndarray", "dtype": "<f8", "shape": [..], "data": b64, "writeable": bool}
    {"$": "npscalar", "dtype": "<f8", "data": b64}             numpy scalar (np.float64 ...)
    {"$": "value", "type": "StepPlan", "fields": [[name, node], ...]}  frozen course_lib records
    {"$": "state", "type": "BlockPool", "fields": [[name, node], ...]} mutable course_lib objects
    {"$": "decoder", "config": node, "params": [[name, tensor node], ...]}   a Decoder (rebuilt)
    {"$": "ref", "id": n}        the n-th object of the call (aliasing, in-place writes)
    {"$": "callback", "id": n}   the n-th judge-side callable (the kernel calls back)
    {"$": "opaque", "type": "module.Qualname"}   something that cannot cross (refused)

Values: ``value`` types are ModelConfig, hardware Device, scheduling Deployment (whose
``device`` field is a Device value node), Request, RequestRecord and StepPlan (rebuilt field
by field); ``state`` types are BlockPool, PagedSequence, PagedKVCache and KVCache (rebuilt
without their constructor from the attributes the class names in its ``WIRE_STATE``, written
back after the call); a Decoder is rebuilt kernel-side from its config and state dict.

Direction judge -> kernel (``CallEncoder``): every mutable argument (tensor, array, list,
dict, deque, state object, decoder) becomes an entry of an object table and is referred
to by ``ref``; callables become ``callback`` nodes. Direction kernel -> judge
(``ResultEncoder`` in the kernel, ``ResultDecoder`` in the judge): only exact types are
encoded (a torch.Tensor subclass, an int subclass, an object with a rigged ``__eq__``...
becomes ``opaque`` and is decoded as a stand-in object that equals nothing); an argument
object returned or kept in a container comes back as a ``ref`` to the judge's own object.
After each call the kernel sends the new state of every argument object that changed, and
the judge applies it to those of its own objects the checker expects to change
(``ResultDecoder.apply_state``; the contract's ``writes`` in the lab's CONTRACTS table), so a checker sees in-place
writes (attend_with_cache's cache, paged_append's pool and sequence) as it would in-process,
while a change to any other argument (a checker's input or reference data) is not applied. Tokens fed through a Decoder's ``embed_tokens`` are counted kernel-side and
replayed on the judge's model, so a checker's forward hook sees the same counts.

A call may carry ``watch`` (``course_grader.provenance.watch_spec``: the code of the contract's
reference functions); the kernel then profiles that call and answers with ``reached`` (the
references whose code ran) and ``observed`` (``provenance.Observer``).

Kernel side: ``serve()`` is the loop the judge's harness cell runs (see
``course_grader.judge``); messages travel on the Jupyter stdin channel as input_request
prompts (kernel -> judge, prefixed by ``PROMPT``) and input_reply values (judge -> kernel).
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections import deque
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["PROTOCOL", "PROMPT", "RemoteDataError", "Opaque", "opaque_class", "CallEncoder", "CallDecoder",
           "ResultEncoder", "ResultDecoder", "dumps", "loads", "encode_value", "decode_value", "encode_bytes",
           "serve", "answer_call", "BUILTIN_ERRORS", "LIMITS"]

PROTOCOL = "course-judge/1"
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


def _value_types() -> dict[str, type]:
    from course_lib.hardware import Device
    from course_lib.models.config import ModelConfig
    from course_lib.scheduling.cost import Deployment
    from course_lib.scheduling.step import StepPlan
    from course_lib.scheduling.workload import Request, RequestRecord
    return {"ModelConfig": ModelConfig, "Device": Device, "Deployment": Deployment, "Request": Request,
            "RequestRecord": RequestRecord, "StepPlan": StepPlan}


def _state_types() -> dict[str, tuple[type, tuple[str, ...]]]:
    """Mutable course_lib classes that cross, each with the attributes its ``WIRE_STATE`` names
    (declared next to the class, so renaming a field there cannot silently break grading)."""
    from course_lib.cache.contiguous import KVCache
    from course_lib.cache.paged import BlockPool, PagedKVCache, PagedSequence
    return {cls.__name__: (cls, tuple(cls.WIRE_STATE)) for cls in (BlockPool, PagedSequence, PagedKVCache, KVCache)}


_TABLES: dict[str, Any] = {}


def _tables():
    if not _TABLES:
        from course_lib.models.decoder import Decoder
        values = _value_types()
        states = _state_types()
        _TABLES.update(values=values, states=states, decoder=Decoder,
                       value_names={cls: name for name, cls in values.items()},
                       state_names={cls: name for name, (cls, _) in states.items()})
    return _TABLES


def _field_names(cls) -> tuple[str, ...]:
    return tuple(cls.__dataclass_fields__)


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
    """A subclass of ``Opaque`` whose module and qualname spell ``kernel_type`` (sanitised)."""
    name = _SAFE_NAME.sub("_", str(kernel_type))[:120] or "unknown"
    cls = _OPAQUE_CLASSES.get(name)
    if cls is None:
        if len(_OPAQUE_CLASSES) > 512:
            name = "unknown"
            cls = _OPAQUE_CLASSES.get(name)
    if cls is None:
        module, _, qual = name.rpartition(".")
        cls = type(qual or "unknown", (Opaque,), {"__slots__": (), "kernel_type": name,
                                                  "__module__": module or "builtins",
                                                  "__qualname__": qual or "unknown"})
        _OPAQUE_CLASSES[name] = cls
    return cls


def _type_name(obj) -> str:
    try:
        kind = type(obj)
        module = kind.__module__ if type(kind.__module__) is str else "?"
        qual = kind.__qualname__ if type(kind.__qualname__) is str else "?"
        return qual if module == "builtins" else f"{module}.{qual}"
    except Exception:  # a hostile metaclass
        return "unknown"


def _opaque_node(obj, why: str = "") -> dict:
    node = {"$": "opaque", "type": _type_name(obj)}
    if why:
        node["why"] = why
    return node


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


def _unb64(text, expected: int) -> bytes:
    if type(text) is not str:
        raise RemoteDataError("tensor data must be a base64 str")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RemoteDataError("tensor data is not valid base64") from None
    if len(data) != expected:
        raise RemoteDataError(f"tensor data holds {len(data)} bytes, its dtype and shape need {expected}")
    return data


def _tensor_node(t: torch.Tensor) -> dict:
    """Node of a tensor's values (detached, on the CPU, contiguous); dtype must be in TORCH_DTYPES."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.resolve_conj().resolve_neg().contiguous()
    name = _TORCH_NAMES[t.dtype]
    if t.numel() == 0:
        data = b""
    else:
        flat = t.reshape(-1)
        data = (flat.view(torch.uint8) if t.dtype != torch.bool else flat.to(torch.uint8)).numpy().tobytes()
    return {"$": "tensor", "dtype": name, "shape": list(t.shape), "data": encode_bytes(data)}


def _ndarray_node(a: np.ndarray) -> dict:
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    b = np.ascontiguousarray(a, dtype=dt)
    return {"$": "ndarray", "dtype": b.dtype.str, "shape": list(b.shape), "data": encode_bytes(b.tobytes()),
            "writeable": bool(a.flags.writeable)}


def _npscalar_node(x) -> dict:
    arr = np.asarray(x)
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    return {"$": "npscalar", "dtype": np.dtype(dt).str, "data": encode_bytes(arr.astype(dt).tobytes())}


def _tensor_ok(t) -> bool:
    """A plain dense tensor of a dtype that can cross."""
    try:
        return (t.layout == torch.strided and not t.is_quantized and not t.is_nested
                and t.dtype in _TORCH_NAMES and t.device.type in ("cpu", "cuda", "mps"))
    except Exception:
        return False


class _Budget:
    """Counts bytes and items decoded from one message."""

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


def _shape(node) -> tuple[int, ...]:
    shape = node.get("shape")
    if type(shape) is not list or len(shape) > LIMITS.max_dims or any(type(s) is not int or s < 0 for s in shape):
        raise RemoteDataError(f"bad shape {str(shape)[:80]}")
    return tuple(shape)


def _decode_tensor(node: dict, budget: _Budget) -> torch.Tensor:
    _keys(node, {"$", "dtype", "shape", "data"})
    dtype = TORCH_DTYPES.get(node.get("dtype")) if type(node.get("dtype")) is str else None
    if dtype is None:
        raise RemoteDataError(f"tensor dtype {str(node.get('dtype'))[:40]!r} cannot cross")
    shape = _shape(node)
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    budget.take_bytes(numel * itemsize)
    data = _unb64(node.get("data"), numel * itemsize)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if dtype == torch.bool:
        return raw.ne(0).reshape(shape)   # any nonzero byte is True (no invalid bool storage)
    return raw.view(dtype).reshape(shape)   # owns its fresh bytearray: no copy needed


def _decode_ndarray(node: dict, budget: _Budget) -> np.ndarray:
    _keys(node, {"$", "dtype", "shape", "data", "writeable"})
    if node.get("dtype") not in NUMPY_DTYPES:
        raise RemoteDataError(f"array dtype {str(node.get('dtype'))[:40]!r} cannot cross")
    dt = np.dtype(node["dtype"])
    shape = _shape(node)
    numel = math.prod(shape)
    budget.take_bytes(numel * dt.itemsize)
    data = _unb64(node.get("data"), numel * dt.itemsize)
    if dt.kind == "b":
        arr = (np.frombuffer(data, dtype=np.uint8) != 0).reshape(shape)
    else:
        arr = np.frombuffer(data, dtype=dt).reshape(shape).astype(dt.newbyteorder("="), copy=True)
    writeable = node.get("writeable")
    if type(writeable) is not bool:
        raise RemoteDataError("array 'writeable' must be a bool")
    arr.flags.writeable = writeable
    return arr


def _decode_npscalar(node: dict, budget: _Budget):
    _keys(node, {"$", "dtype", "data"})
    if node.get("dtype") not in NUMPY_DTYPES:
        raise RemoteDataError(f"numpy scalar dtype {str(node.get('dtype'))[:40]!r} cannot cross")
    dt = np.dtype(node["dtype"])
    data = _unb64(node.get("data"), dt.itemsize)
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


# -- judge -> kernel: the call ---------------------------------------------------------------------
_MUTABLE = (list, dict, deque, torch.Tensor, np.ndarray)


class CallEncoder:
    """Encodes a call's arguments on the judge side (trusted values).

    Mutable objects go to ``table`` (``[[oid, node], ...]``) and are referred to by ``ref``
    nodes, so aliasing survives and the kernel can send their new state back; ``objects[oid]``
    is the judge's object. Callables become ``callback`` nodes (``callbacks[cid]``).
    With ``register=False`` everything is inlined (used for callback return values).

    Raises:
        TypeError: a value of a type the protocol does not carry (a grader bug).
    """

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
        if value is None or t in (bool, int, str):
            return value
        if t is float:
            return value
        tables = _tables()
        if t is tuple:
            return {"$": "tuple", "items": [self.encode(v, depth + 1) for v in value]}
        if t in tables["value_names"]:
            return {"$": "value", "type": tables["value_names"][t],
                    "fields": [[f, self.encode(getattr(value, f), depth + 1)] for f in _field_names(t)]}
        if isinstance(value, NUMPY_SCALARS) and t in NUMPY_SCALARS:
            return _npscalar_node(value)
        mutable = (isinstance(value, _MUTABLE) or t in tables["state_names"] or isinstance(value, tables["decoder"]))
        if mutable:
            if not self.register:
                return self._node(value, depth)
            oid = self._ids.get(id(value))
            if oid is None:
                oid = len(self.objects)
                self._ids[id(value)] = oid
                self.objects.append(value)
                entry = [oid, None]
                self.table.append(entry)
                entry[1] = self._node(value, depth)
            return {"$": "ref", "id": oid}
        if callable(value):
            self.callbacks.append(value)
            return {"$": "callback", "id": len(self.callbacks) - 1}
        raise TypeError(f"the judge cannot send a {_type_name(value)} to the kernel")

    def _node(self, value, depth: int):
        tables = _tables()
        t = type(value)
        if isinstance(value, torch.Tensor):
            if not _tensor_ok(value):
                raise TypeError(f"the judge cannot send a tensor of dtype {value.dtype}")
            return _tensor_node(value)
        if isinstance(value, np.ndarray):
            if not _ndarray_ok(value):
                raise TypeError(f"the judge cannot send an array of dtype {value.dtype}")
            return _ndarray_node(value)
        if isinstance(value, list):
            return [self.encode(v, depth + 1) for v in value]
        if isinstance(value, deque):
            return {"$": "deque", "items": [self.encode(v, depth + 1) for v in value], "maxlen": value.maxlen}
        if isinstance(value, dict):
            return {"$": "dict", "items": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                                           for k, v in value.items()]}
        if t in tables["state_names"]:
            name = tables["state_names"][t]
            return {"$": "state", "type": name,
                    "fields": [[f, self.encode(getattr(value, f), depth + 1)] for f in tables["states"][name][1]]}
        if isinstance(value, tables["decoder"]):
            params = value.state_dict()
            return {"$": "decoder", "config": self.encode(value.config, depth + 1),
                    "params": [[k, _tensor_node(v)] for k, v in params.items()]}
        raise TypeError(f"the judge cannot send a {_type_name(value)} to the kernel")


class CallDecoder:
    """Decodes a call on the kernel side: builds the object table lazily (aliasing kept) and
    turns ``callback`` nodes into functions made by ``make_callback(cid)``."""

    def __init__(self, table, make_callback: Callable[[int], Callable] | None = None):
        self.nodes: dict[int, Any] = {}
        for entry in table or []:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int:
                raise RemoteDataError("bad object table entry")
            self.nodes[entry[0]] = entry[1]
        self.memo: dict[int, Any] = {}
        self.make_callback = make_callback
        self.budget = _Budget()

    def object(self, oid: int):
        if oid in self.memo:
            return self.memo[oid]
        if oid not in self.nodes:
            raise RemoteDataError(f"reference to unknown object {oid}")
        return self._build(oid, self.nodes[oid])

    def _build(self, oid: int, node):
        tables = _tables()
        if type(node) is list:
            obj: Any = []
            self.memo[oid] = obj
            obj.extend(self.decode(v, 1) for v in node)
            return obj
        tag = node.get("$") if type(node) is dict else None
        if tag == "dict":
            obj = {}
            self.memo[oid] = obj
            for k, v in _pairs(node, "items"):
                obj[self.decode(k, 1)] = self.decode(v, 1)
            return obj
        if tag == "deque":
            maxlen = node.get("maxlen")
            obj = deque(maxlen=maxlen)
            self.memo[oid] = obj
            obj.extend(self.decode(v, 1) for v in node.get("items", []))
            return obj
        if tag == "state":
            name = node.get("type")
            if name not in tables["states"]:
                raise RemoteDataError(f"unknown state type {name!r}")
            cls, names = tables["states"][name]
            obj = cls.__new__(cls)
            self.memo[oid] = obj
            for f, v in _field_pairs(node, names):
                object.__setattr__(obj, f, self.decode(v, 1))
            return obj
        if tag == "decoder":
            config = self.decode(node.get("config"), 1)
            model = tables["decoder"](config)
            state = {k: _decode_tensor(v, self.budget) for k, v in _pairs(node, "params")}
            model.load_state_dict(state, assign=True)        # strict: every parameter, right shapes
            if getattr(config, "tie_embeddings", False):
                model.lm_head.weight = model.embed_tokens.weight
            model = model.eval().requires_grad_(False)
            self.memo[oid] = model
            return model
        obj = self.decode(node, 1)
        self.memo[oid] = obj
        return obj

    def decode(self, node, depth: int = 0):
        if depth > LIMITS.max_depth:
            raise RemoteDataError("nesting too deep")
        t = type(node)
        if node is None or t in (bool, int, float, str):
            return node
        if t is list:
            return [self.decode(v, depth + 1) for v in node]
        if t is not dict:
            raise RemoteDataError(f"bad node of type {_type_name(node)}")
        tag = node.get("$")
        if tag == "ref":
            return self.object(node.get("id"))
        if tag == "callback":
            if self.make_callback is None:
                raise RemoteDataError("callback where none is allowed")
            return self.make_callback(node.get("id"))
        return _decode_common(node, depth, self.decode, self.budget)


def _decode_common(node: dict, depth: int, decode, budget: _Budget):
    """Decode the node kinds both sides read the same way (no refs, callbacks or decoders)."""
    tag = node.get("$")
    tables = _tables()
    if tag == "tuple":
        _keys(node, {"$", "items"})
        items = node.get("items")
        if type(items) is not list:
            raise RemoteDataError("tuple items must be a list")
        budget.take_items(len(items))
        return tuple(decode(v, depth + 1) for v in items)
    if tag == "dict":
        _keys(node, {"$", "items"})
        pairs = _pairs(node, "items")
        budget.take_items(len(pairs))
        out = {}
        for k, v in pairs:
            key, value = decode(k, depth + 1), decode(v, depth + 1)
            try:
                out[key] = value
            except TypeError:
                raise RemoteDataError(f"unhashable dict key of type {_type_name(key)}") from None
        return out
    if tag == "deque":
        _keys(node, {"$", "items", "maxlen"})
        items, maxlen = node.get("items"), node.get("maxlen")
        if type(items) is not list or not (maxlen is None or (type(maxlen) is int and maxlen >= 0)):
            raise RemoteDataError("bad deque node")
        budget.take_items(len(items))
        return deque((decode(v, depth + 1) for v in items), maxlen=maxlen)
    if tag == "tensor":
        return _decode_tensor(node, budget)
    if tag == "ndarray":
        return _decode_ndarray(node, budget)
    if tag == "npscalar":
        return _decode_npscalar(node, budget)
    if tag == "value":
        _keys(node, {"$", "type", "fields"})
        name = node.get("type")
        if type(name) is not str or name not in tables["values"]:
            raise RemoteDataError(f"unknown value type {str(name)[:40]!r}")
        cls = tables["values"][name]
        obj = cls.__new__(cls)   # mirror the fields exactly; no constructor runs
        for f, v in _field_pairs(node, _field_names(cls)):
            object.__setattr__(obj, f, decode(v, depth + 1))
        return obj
    if tag == "opaque":
        _keys(node, {"$", "type", "why"})
        return opaque_class(str(node.get("type")))()
    raise RemoteDataError(f"unknown node tag {str(tag)[:40]!r}")


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
        if id(value) in self.known and (t in (list, dict, deque, torch.Tensor, np.ndarray)
                                        or t in _tables()["state_names"] or t is _tables()["decoder"]):
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
            self._active.add(id(value))
            try:
                return self._container(value, t, depth, tables)
            finally:
                self._active.discard(id(value))
        if t is float or t is int or t is bool or t is str or value is None:
            return self.encode(value, depth)
        return _opaque_node(value)

    def _container(self, value, t, depth, tables):
        if t in (list, tuple, deque, dict):
            self.items += len(value)
            if self.items > LIMITS.max_items:
                return _opaque_node(value, "too many items")
        if t is list:
            return [self.encode(v, depth + 1) for v in list(value)]
        if t is tuple:
            return {"$": "tuple", "items": [self.encode(v, depth + 1) for v in tuple.__iter__(value)]}
        if t is deque:
            return {"$": "deque", "items": [self.encode(v, depth + 1) for v in list(value)], "maxlen": value.maxlen}
        if t is dict:
            return {"$": "dict", "items": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                                           for k, v in list(dict.items(value))]}
        if t in tables["value_names"]:
            name = tables["value_names"][t]
            return {"$": "value", "type": name,
                    "fields": [[f, self.encode(object.__getattribute__(value, f), depth + 1)]
                               for f in _field_names(t)]}
        name = tables["state_names"][t]
        fields = []
        for f in tables["states"][name][1]:
            try:
                fields.append([f, self.encode(object.__getattribute__(value, f), depth + 1)])
            except AttributeError:
                return _opaque_node(value, f"missing attribute {f}")
        return {"$": "state", "type": name, "fields": fields}


def _ndarray_ok(a) -> bool:
    try:
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        return np.dtype(dt).str in NUMPY_DTYPES
    except Exception:
        return False


class ResultDecoder:
    """Decodes kernel data on the judge side, strictly: only the node kinds above, exact
    sizes, and refs only to the call's own argument objects (``objects[oid]``)."""

    def __init__(self, objects: list | None = None):
        self.objects = objects or []
        self.budget = _Budget()

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
            self.budget.take_items(len(node))
            return [self.decode(v, depth + 1) for v in node]
        if t is not dict:
            raise RemoteDataError(f"bad node of type {_type_name(node)}")
        tag = node.get("$")
        if tag == "ref":
            _keys(node, {"$", "id"})
            oid = node.get("id")
            if type(oid) is not int or not 0 <= oid < len(self.objects):
                raise RemoteDataError(f"reference to unknown object {str(oid)[:20]}")
            return self.objects[oid]
        if tag == "state":
            raise RemoteDataError("a new course_lib object cannot come back from the kernel (only its arguments)")
        return _decode_common(node, depth, self.decode, self.budget)

    # -- in-place writes ---------------------------------------------------------------------
    def apply_state(self, entries, allowed: set[int] | None = None) -> dict[int, Any]:
        """Apply the kernel's post-call state of argument objects to the judge's objects.

        ``entries``: ``[[oid, node], ...]`` where node is the object's own node (its elements
        may be refs). ``allowed``: the oids the caller lets the learner's function change
        (None: all). A changed argument outside ``allowed`` is left as it was in the judge (a
        checker's inputs and reference data cannot be rewritten from the kernel); a fresh copy
        holding the kernel's state stands for it when the result refers to it. Afterwards
        ``decode`` resolves refs to that view. Returns {oid: copy} of those copies.

        Raises:
            RemoteDataError: malformed entries.
            TypeError: an argument's new state cannot be mirrored (e.g. a tensor argument
                replaced by something that is not a tensor); the call counts as failed.
        """
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
            if type(node) is not dict or node.get("$") != "state" or node.get("type") != tables["state_names"][t]:
                raise TypeError(f"the {tables['state_names'][t]} argument came back as something else")
            _keys(node, {"$", "type", "fields"})
            names = tables["states"][tables["state_names"][t]][1]
            return {f: self.decode(v, 1) for f, v in _field_pairs(node, names)}
        value = self.decode(node, 0)
        expected = torch.Tensor if isinstance(orig, torch.Tensor) else np.ndarray if isinstance(orig, np.ndarray) \
            else deque if isinstance(orig, deque) else dict if isinstance(orig, dict) else list
        if type(value) is not expected:
            raise TypeError(f"an argument of type {_type_name(orig)} came back as {_type_name(value)}")
        return value


def _empty_like(orig):
    """An empty object of ``orig``'s kind to receive a kernel state (None for tensors/arrays)."""
    if isinstance(orig, (torch.Tensor, np.ndarray)):
        return None
    if isinstance(orig, deque):
        return deque(maxlen=orig.maxlen)
    if isinstance(orig, dict):
        return {}
    if isinstance(orig, list):
        return []
    return type(orig).__new__(type(orig))


def _mirror(orig, new) -> None:
    """Make the judge's object ``orig`` hold ``new`` (decoded kernel state), in place."""
    if isinstance(orig, torch.Tensor):
        with torch.no_grad():
            if new.dtype == orig.dtype and new.shape == orig.shape:
                orig.copy_(new)
            elif new.dtype == orig.dtype:
                orig.resize_(new.shape)
                orig.copy_(new)
            else:
                orig.data = new
        return
    if isinstance(orig, np.ndarray):
        if new.dtype != orig.dtype or new.shape != orig.shape:
            raise TypeError("an array argument changed its dtype or shape, which cannot happen in place")
        was = orig.flags.writeable
        if not was:
            orig.flags.writeable = True
        np.copyto(orig, new)
        orig.flags.writeable = was
        return
    if isinstance(orig, deque):
        orig.clear()
        orig.extend(new)
        return
    if isinstance(orig, dict):
        orig.clear()
        orig.update(new)
        return
    if isinstance(orig, list):
        orig[:] = new
        return
    for f, v in new.items():   # a state object: its fields
        object.__setattr__(orig, f, v)


# -- convenience ------------------------------------------------------------------------------------
def encode_value(value) -> str:
    """JSON text of a judge-side value, everything inlined (tests and callbacks)."""
    return dumps(CallEncoder(register=False).encode(value))


def decode_value(text: str, objects: list | None = None):
    """Strictly decode JSON text from a kernel (``ResultDecoder``)."""
    return ResultDecoder(objects).decode(loads(text))


# == kernel side: the serve loop the judge's harness cell runs ====================================
#: Built-in exception types a learner's function may raise that the judge re-raises as such.
BUILTIN_ERRORS = ("ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError",
                   "ZeroDivisionError", "NotImplementedError", "AssertionError", "ArithmeticError",
                   "OverflowError", "LookupError", "NameError", "UnboundLocalError", "RecursionError")


def serve(namespace: dict | None = None) -> None:
    """Answer the judge until it says "end" (runs in the learner's kernel, inside one
    execute_request that the judge sent with allow_stdin=True).

    Every message to the judge is an input_request whose prompt is ``PROMPT`` + JSON; the
    judge's input_reply is the next request. Requests: ``describe`` (what the names are),
    ``call`` (call a function on decoded arguments), ``end``. During a call the learner's
    ``input()`` raises as it does under nbgrader (stdin is off for learner code).
    """
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    ns = shell.user_ns if namespace is None else namespace
    private = kernel is not None and hasattr(kernel, "_input_request") and hasattr(kernel, "_allow_stdin")
    if private:
        ident = kernel._get_shell_context_var(kernel._shell_parent_ident) \
            if hasattr(kernel, "_get_shell_context_var") else kernel._parent_ident["shell"]
        parent = kernel.get_parent("shell")

        def ask(message: dict) -> dict:
            return json.loads(kernel._input_request(PROMPT + dumps(message), ident, parent, password=False))
        allow = kernel._allow_stdin
        kernel._allow_stdin = False
    else:  # pragma: no cover - a kernel without ipykernel's private API
        import builtins

        def ask(message: dict) -> dict:
            return json.loads(builtins.input(PROMPT + dumps(message)))
    try:
        out: dict = {"op": "ready", "protocol": PROTOCOL}
        while True:
            request = ask(out)
            op = request.get("op") if type(request) is dict else None
            if op == "end":
                return
            if op == "describe":
                out = {"op": "described", "names": {n: _describe(ns, n) for n in request.get("names", [])}}
            elif op == "call":
                out = answer_call(ns, request, ask)
            else:
                out = {"op": "bad-request"}
    finally:
        if private:
            kernel._allow_stdin = allow


def _describe(ns: dict, name) -> dict:
    if type(name) is not str or name not in ns:
        return {"defined": False}
    obj = ns[name]
    info = {"defined": True, "callable": False, "module": "", "qualname": "", "type": _type_name(obj)}
    try:
        info["callable"] = bool(callable(obj))
        module = getattr(obj, "__module__", "")
        info["module"] = module if type(module) is str else ""
        qual = getattr(obj, "__qualname__", "")
        info["qualname"] = qual if type(qual) is str else ""
    except Exception:
        pass
    return info


def answer_call(ns: dict, request: dict, ask) -> dict:
    """The kernel's answer to one "call" request of the judge: look ``request["fn"]`` up in the
    namespace ``ns``, call it on the decoded arguments (``ask`` carries its callbacks back to the
    judge) and return the reply message ("return" with the encoded value and the changed argument
    state, "raised", "missing" or "error"). ``serve`` runs it for every call."""
    name = request.get("fn")
    if type(name) is not str or name not in ns:
        return {"op": "missing", "name": str(name)[:100]}
    fn = ns[name]
    stale = {"flag": False}

    def make_callback(cid):
        def callback(*args, **kwargs):
            if stale["flag"]:
                raise RuntimeError("this grader callback is no longer available (its call has ended)")
            enc = ResultEncoder(known)
            reply = ask({"op": "callback", "id": cid, "args": [enc.encode(a) for a in args],
                         "kwargs": [[k, enc.encode(v)] for k, v in kwargs.items()]})
            if type(reply) is dict and reply.get("op") == "return":
                return CallDecoder([], None).decode(reply.get("value"))
            raise RuntimeError(f"the grader's callback failed: {str(reply.get('message', '?'))[:500]}")
        callback.__name__ = callback.__qualname__ = "grader_callback"
        return callback

    try:
        decoder = CallDecoder(request.get("objects"), make_callback)
        args = [decoder.decode(a) for a in request.get("args", [])]
        kwargs = {k: decoder.decode(v) for k, v in request.get("kwargs", [])}
        for oid in decoder.nodes:          # build every table object (some may be unreferenced)
            decoder.object(oid)
    except Exception as exc:  # e.g. a course_lib in the kernel that differs from the judge's
        return {"op": "undecodable", "message": f"{_type_name(exc)}: {_safe_str(exc)}"}
    known = {id(obj): oid for oid, obj in decoder.memo.items()}
    counts: dict[int, list[int]] = {}
    handles = []
    tables = _tables()
    for oid, obj in decoder.memo.items():
        if isinstance(obj, tables["decoder"]):
            counts[oid] = []

            def hook(module, inputs, output, _sink=counts[oid]):
                try:
                    _sink.append(int(inputs[0].numel()))
                except Exception:
                    pass
            handles.append(obj.embed_tokens.register_forward_hook(hook))
    grad = request.get("grad") is True
    from course_grader.provenance import Observer    # which declared references' code runs (if asked)
    observer = Observer(request.get("watch"))
    try:
        with torch.set_grad_enabled(grad), observer:
            result = fn(*args, **kwargs)
        out: dict = {"op": "returned"}
    except BaseException as exc:  # the learner's exception (KeyboardInterrupt included) is the answer
        result = None
        out = {"op": "raised", "type": _type_name(exc), "message": _safe_str(exc)}
    finally:
        stale["flag"] = True
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass
    enc = ResultEncoder(known)
    if out["op"] == "returned":
        try:
            out["value"] = enc.encode(result)
        except Exception as exc:
            out = {"op": "unencodable", "message": _safe_str(exc)}
    state = []
    for oid, obj in decoder.memo.items():
        if isinstance(obj, tables["decoder"]):
            continue
        try:
            node = enc.inline(obj)
        except Exception:
            node = _opaque_node(obj, "state")
        if node != decoder.nodes.get(oid):
            state.append([oid, node])
    out["state"] = state
    out["embed"] = [[oid, c] for oid, c in counts.items()]
    out.update(observer.report())
    return out


def _safe_str(exc) -> str:
    try:
        return str(exc)[:2000]
    except Exception:
        return "<message unavailable>"
