"""GGUF's 32-weight block formats Q4_0, Q4_1 and Q8_0, written with the course's pieces.

Sources: llama.cpp ``ggml/src/ggml-quants.c`` (``quantize_row_q4_0_ref``, ``quantize_row_q4_1_ref``,
``quantize_row_q8_0_ref`` and the matching ``dequantize_row_*``) and the gguf Python package's
``gguf/quants.py`` (its numpy port). The functions here return the same bytes as
``gguf.quants.quantize(array, GGMLQuantizationType.Q4_0 / Q4_1 / Q8_0)`` and the same floats as
``gguf.quants.dequantize`` (tests/test_quant_gguf.py checks both, and checks that the course's
SmolLM2 weights are exactly the dequantised Q4_1 tensors of the GGUF file they come from).

Each row of ``n * 32`` weights is cut into blocks of 32 consecutive weights; a block is stored as

============ ================================================ ======== ================
format       bytes                                            per 32   bits per weight
============ ================================================ ======== ================
Q4_0         fp16 ``d``, 16 bytes of nibbles                  18 B     4.5
Q4_1         fp16 ``d``, fp16 ``m``, 16 bytes of nibbles      20 B     5.0
Q8_0         fp16 ``d``, 32 int8                              34 B     8.5
============ ================================================ ======== ================

(fp16 values little-endian.) Where GGUF's conventions differ from the lab's (``formats``):

- **Q4_0** is absmax but not symmetric: ``d = x_max / -8`` where ``x_max`` is the *signed* value
  of largest magnitude (the first one on ties), codes ``q = min(trunc(x / d + 8.5), 15)``, i.e.
  ``round(x / d)`` with halves rounded up, offset by 8 and stored unsigned; ``x = d * (q - 8)``.
  The largest-magnitude weight lands exactly on code -8 (``x_max`` itself), so all 16 codes are
  used but the grid reaches ``7 |d|`` on the other side: the lab's symmetric int4 uses 15 codes
  (``s = absmax / 7``) and reaches ``absmax`` both ways.
- **Q4_1** is min-max with a *float* minimum ``m`` (the block's minimum, not widened to contain
  0) instead of an integer zero point: ``d = (max - min) / 15``,
  ``q = min(trunc((x - m) / d + 0.5), 15)``, ``x = d * q + m``. Zero is generally not on the
  grid; the lab's asymmetric scheme (Jacob et al. 2018) widens the range to contain 0 and makes
  it exact.
- Codes are computed with the **float32** ``d`` (through ``1 / d``), and ``d`` (and ``m``) are
  rounded to fp16 only for storage: the dequantised weight uses the fp16 values. The lab rounds
  the scale to its storage dtype first and quantises with the rounded scale.
- Q8_0: ``d = absmax / 127``, ``q = round(x / d)`` with halves away from zero (C ``roundf``); the
  lab's symmetric int8 rounds halves to even.
- Nibble order is ``"halves"`` (byte ``j`` of a block holds weights ``j`` and ``j + 16``), the
  lab's is ``"pairs"`` (``packing``).
- A block of zeros gets ``d = 0`` (``1/d`` taken as 0): codes 8 (Q4_0), 0 (Q4_1, Q8_0).
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable

import numpy as np
import torch

from ..validation import ArgumentTypeError, instance, materialized, nonnegative_integer, one_of
from .packing import pack_int4, unpack_int4

__all__ = ["GGML_BLOCK", "GGML_BLOCK_BYTES", "quantize_q4_0", "quantize_q4_1", "quantize_q8_0",
           "dequantize_ggml", "read_gguf_tensor"]

#: Weights per block (QK4_0 = QK4_1 = QK8_0 = 32 in ggml-common.h).
GGML_BLOCK: int = 32
#: Bytes per block of each format (sizeof(block_q4_0) etc.; F32/F16 per element).
GGML_BLOCK_BYTES: dict[str, int] = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
_FLOAT_KINDS = {"F32": torch.float32, "F16": torch.float16}


def _blocks(w, name: str = "w") -> tuple[torch.Tensor, tuple[int, int]]:
    """w (rows, n*32) numpy or torch float -> float32 blocks (rows, n, 32) and the 2-D shape."""
    if isinstance(w, np.ndarray):
        if not np.issubdtype(w.dtype, np.floating):
            raise ArgumentTypeError(f"{name} must be a floating-point array, got dtype {w.dtype}")
        w = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    instance(name, w, (torch.Tensor, np.ndarray))
    materialized(name, w)
    if not w.dtype.is_floating_point:
        raise ArgumentTypeError(f"{name} must be a floating-point tensor, got dtype {w.dtype}")
    if w.dim() != 2 or w.shape[1] == 0 or w.shape[1] % GGML_BLOCK:
        raise ValueError(f"{name} must be 2-D (rows, n * {GGML_BLOCK}) with n >= 1 (GGUF blocks of "
                         f"{GGML_BLOCK} along the row), got shape {tuple(w.shape)}")
    w = w.detach().to("cpu", torch.float32)
    finite = torch.isfinite(w)
    if not bool(finite.all()):
        r, c = (int(i) for i in torch.nonzero(~finite)[0])
        raise ValueError(f"{name} must hold finite float32 values; {name}[{r}, {c}] = {w[r, c].item()!r}")
    rows, cols = w.shape
    return w.reshape(rows, cols // GGML_BLOCK, GGML_BLOCK), (rows, cols)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """``1 / d``, with 0 where d == 0 (ggml: ``id = d ? 1.0f/d : 0.0f``)."""
    return torch.where(d == 0, torch.zeros_like(d), 1 / torch.where(d == 0, torch.ones_like(d), d))


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 (rows, n, 1) -> the little-endian fp16 bytes, uint8 (rows, n, 2)."""
    return torch.from_numpy(x.to(torch.float16).numpy().astype("<f2").view(np.uint8))


def _rows(blocks: list[torch.Tensor], shape: tuple[int, int]) -> np.ndarray:
    rows, cols = shape
    return torch.cat(blocks, dim=-1).reshape(rows, -1).numpy()


def quantize_q4_0(w) -> np.ndarray:
    """GGUF Q4_0 blocks of ``w``.

    Args:
        w: float (rows, n * 32), numpy or torch (computed in float32).

    Returns:
        numpy uint8 (rows, n * 18): per block fp16 ``d = x_max / -8`` then the 32 codes
        ``min(trunc(x * (1/d) + 8.5), 15)`` in "halves" nibble order (module docstring).

    Raises:
        ArgumentTypeError: not a float array/tensor. ValueError: not 2-D, a row length that is not a
        multiple of 32, a non-finite value, a tensor on the meta device.
    """
    x, shape = _blocks(w)
    index = x.abs().argmax(dim=-1, keepdim=True)   # first maximum on ties, as numpy's argmax
    d = torch.gather(x, -1, index) / -8
    q = torch.clamp(torch.trunc(x * _inverse(d) + 8.5), 0, 15).to(torch.uint8)
    return _rows([_fp16_bytes(d), pack_int4(q, signed=False, order="halves")], shape)


def quantize_q4_1(w) -> np.ndarray:
    """GGUF Q4_1 blocks of ``w``.

    Args:
        w: float (rows, n * 32), numpy or torch (computed in float32).

    Returns:
        numpy uint8 (rows, n * 20): per block fp16 ``d = (max - min) / 15``, fp16 ``m = min``, then
        the codes ``min(trunc((x - min) * (1/d) + 0.5), 15)`` in "halves" nibble order.

    Raises:
        As ``quantize_q4_0``.
    """
    x, shape = _blocks(w)
    # numpy's reductions, as gguf's: in a block of signed zeros they pick the same zero as it does
    # (torch's may pick the other), and the sign of d and m is part of the bytes
    flat = x.numpy().reshape(-1, GGML_BLOCK)
    hi = torch.from_numpy(flat.max(axis=-1, keepdims=True)).reshape(*x.shape[:2], 1)
    lo = torch.from_numpy(flat.min(axis=-1, keepdims=True)).reshape(*x.shape[:2], 1)
    d = (hi - lo) / 15
    q = torch.clamp(torch.trunc((x - lo) * _inverse(d) + 0.5), 0, 15).to(torch.uint8)
    return _rows([_fp16_bytes(d), _fp16_bytes(lo), pack_int4(q, signed=False, order="halves")], shape)


def quantize_q8_0(w) -> np.ndarray:
    """GGUF Q8_0 blocks of ``w``.

    Args:
        w: float (rows, n * 32), numpy or torch (computed in float32).

    Returns:
        numpy uint8 (rows, n * 34): per block fp16 ``d = absmax / 127`` then 32 int8 codes
        ``roundf(x * (1/d))`` (halves away from zero).

    Raises:
        As ``quantize_q4_0``.
    """
    x, shape = _blocks(w)
    d = x.abs().amax(dim=-1, keepdim=True) / 127
    y = x * _inverse(d)
    a = y.abs()
    whole = torch.floor(a)
    q = (torch.sign(y) * (whole + torch.floor(2 * (a - whole)))).to(torch.int8)   # C roundf, as gguf's np_roundf
    return _rows([_fp16_bytes(d), q.view(torch.uint8)], shape)


def _kind(kind) -> str:
    if not isinstance(kind, str):
        raise ArgumentTypeError(f"kind must be a str, one of {list(GGML_BLOCK_BYTES)}, got {kind!r}")
    return one_of("kind", kind, [*GGML_BLOCK_BYTES, *_FLOAT_KINDS])


def _shape(shape) -> tuple[int, ...]:
    """A weight's shape as a tuple of Python ints >= 0 (a tuple, list or torch.Size of ints)."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable) or isinstance(shape, torch.Tensor):
        raise ArgumentTypeError(f"shape must be a tuple of ints, e.g. (rows, n * {GGML_BLOCK}), got {shape!r} "
                                f"of type {type(shape).__qualname__}")
    return tuple(nonnegative_integer(f"shape[{i}]", s) for i, s in enumerate(shape))


def _raw_bytes(data) -> np.ndarray:
    """``data`` as a flat numpy uint8 array: a uint8 tensor or array, or bytes/bytearray/memoryview."""
    if isinstance(data, torch.Tensor):
        materialized("data", data)
        if data.dtype != torch.uint8:
            raise ArgumentTypeError(f"data must hold uint8 bytes, got dtype {data.dtype}")
        return data.detach().cpu().contiguous().numpy().reshape(-1)
    instance("data", data, (np.ndarray, bytes, bytearray, memoryview))
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise ArgumentTypeError(f"data must hold uint8 bytes, got dtype {data.dtype}")
        return np.ascontiguousarray(data).reshape(-1)
    try:                                                   # bytes, bytearray, memoryview: the raw buffer
        return np.frombuffer(data, dtype=np.uint8)
    except (BufferError, ValueError) as error:
        raise ValueError(f"data must be a contiguous buffer of bytes, got a {type(data).__qualname__} numpy cannot "
                         f"read as uint8 ({error}); pass bytes(data)") from None


def dequantize_ggml(data, kind: str, shape) -> torch.Tensor:
    """The float32 weights of GGUF blocks, as ``gguf.quants.dequantize`` computes them.

    Args:
        data: the bytes holding ``rows * n`` blocks in row order (``quantize_q4_0`` output, or the
            raw data of ``read_gguf_tensor``): a uint8 numpy array or torch tensor of any shape,
            or ``bytes``/``bytearray``/``memoryview`` (a memoryview's raw buffer, whatever its
            format; it must be contiguous).
        kind: ``"Q4_0"``, ``"Q4_1"`` or ``"Q8_0"`` (also ``"F32"``/``"F16"``: plain little-endian
            floats, for the unquantised tensors of a GGUF file).
        shape: the weight's shape (rows, n * 32) (or any shape for F32/F16): a tuple (or list,
            or torch.Size) of ints >= 0.

    Returns:
        torch float32 of ``shape``: Q4_0 ``d * (q - 8)``, Q4_1 ``d * q + m``, Q8_0 ``d * q``
        with the fp16 ``d`` and ``m`` of each block, in float32.

    Raises:
        ArgumentTypeError: data neither uint8 nor a bytes-like object; kind not a str; shape not
            a tuple of ints (a str such as ``"64"``, an int, a float such as ``2.9`` in it).
        ValueError: an unknown kind; a negative dimension; a byte count that does not match
            the shape; a row length that is not a multiple of 32; a non-contiguous memoryview;
            a tensor on the meta device.
    """
    kind = _kind(kind)
    raw = _raw_bytes(data)
    shape = _shape(shape)
    numel = math.prod(shape)              # Python ints: np.prod would wrap around past 2**63
    if kind in _FLOAT_KINDS:
        dtype = np.float32 if kind == "F32" else np.float16
        width = np.dtype(dtype).itemsize
        if raw.size != numel * width:
            raise ValueError(f"{kind} data of shape {shape} must hold {numel * width} bytes, got {raw.size}")
        return torch.from_numpy(raw.view("<f4" if kind == "F32" else "<f2").astype(np.float32)).reshape(shape)
    if len(shape) < 1 or shape[-1] % GGML_BLOCK:
        raise ValueError(f"a {kind} weight's rows must be multiples of {GGML_BLOCK} weights, got shape {shape}")
    n_blocks = numel // GGML_BLOCK
    size = GGML_BLOCK_BYTES[kind]
    if raw.size != n_blocks * size:
        raise ValueError(f"{kind} data for shape {shape} must hold {n_blocks} blocks of {size} bytes = "
                         f"{n_blocks * size} bytes, got {raw.size}")
    blocks = torch.from_numpy(raw.copy()).reshape(n_blocks, size)
    d = torch.from_numpy(blocks[:, 0:2].numpy().copy().view("<f2").astype(np.float32))   # (n_blocks, 1)
    if kind == "Q8_0":
        q = blocks[:, 2:].view(torch.int8).to(torch.float32)
        w = d * q
    elif kind == "Q4_0":
        q = unpack_int4(blocks[:, 2:], GGML_BLOCK, signed=False, order="halves").to(torch.float32)
        w = d * (q - 8)
    else:
        m = torch.from_numpy(blocks[:, 2:4].numpy().copy().view("<f2").astype(np.float32))
        q = unpack_int4(blocks[:, 4:], GGML_BLOCK, signed=False, order="halves").to(torch.float32)
        w = d * q + m
    return w.reshape(shape)


@functools.lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int):
    """A memory-mapped GGUFReader, kept for the next call on the same unchanged file (parsing the
    header and metadata of the course's model takes seconds)."""
    from gguf import GGUFReader

    return GGUFReader(path)


def read_gguf_tensor(path: str | os.PathLike, name: str) -> tuple[np.ndarray, str, torch.Size]:
    """One tensor of a GGUF file, as stored (``gguf.GGUFReader``, memory-mapped; the reader is
    kept for later calls on the same unchanged file).

    Args:
        path: the .gguf file.
        name: the GGUF tensor name, e.g. ``"blk.3.ffn_down.weight"``.

    Returns:
        (raw, kind, shape): the stored bytes, numpy uint8 (rows, bytes per row) (read-only,
        memory-mapped), ``kind`` the GGML type name ("Q4_1", "Q8_0", "F32", ...; ``dequantize_ggml``
        reads Q4_0/Q4_1/Q8_0/F32/F16), and the torch shape (GGUF lists dimensions innermost
        first; this is the reverse, so ``blk.3.ffn_down.weight`` is (576, 1536) like
        ``nn.Linear.weight``).

    Raises:
        FileNotFoundError: no such file. KeyError: no tensor of that name (the message lists a few).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file at {path}")
    stat = os.stat(path)
    reader = _reader(os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    for tensor in reader.tensors:
        if tensor.name == name:
            shape = torch.Size(int(s) for s in reversed(tensor.shape.tolist()))
            raw = np.asarray(tensor.data)
            if raw.dtype != np.uint8:   # F32/F16 tensors come typed: the same bytes, as uint8 rows
                raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(*shape[:-1], -1)
            return raw, tensor.tensor_type.name, shape
    names = [t.name for t in reader.tensors]
    raise KeyError(f"no tensor {name!r} in {path} ({len(names)} tensors, e.g. {names[:4]})")
