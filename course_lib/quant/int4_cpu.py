"""Int4 decode on the CPU: the GGUF file's own Q4_1 codes through PyTorch's int4 weight-only matmul (Lab 4).

Why: a batch-1 decode step streams every weight once (docs/roofline.md#decode-step-bound), so 4-bit
weights move about 6x fewer bytes than float32. The course's W4A16 Triton kernel (``kernels.w4a16``)
needs a GPU; on a CPU its reference dequantises to float and multiplies, which is slower than float32.
This module uses the CPU kernel PyTorch ships for the same job, the one gpt-fast and torchao's
int4 CPU layout call: ``torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, inner_k_tiles)`` and
``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)``
(PyTorch ``aten/src/ATen/native/cpu/int4mm_kernel.cpp``; gpt-fast ``quantize.py``,
``WeightOnlyInt4Linear``; torchao ``Int4CPULayout``). As this torch (2.13) defines them:

- ``codes``: int32 (N, K), values 0..15, one per weight of an (out_features N, in_features K) weight;
  ``inner_k_tiles`` is ignored on the CPU; the result is an opaque uint8 (N, K / 2);
- ``x``: (M, K) bfloat16 (float16 and float32 are accepted too, but the float32 path is 20x slower);
- ``scales_and_zeros``: (K / group_size, N, 2) of x's dtype, ``[..., 0]`` the scale and ``[..., 1]`` the
  zero of each (group, output row); the weight the kernel multiplies is ``(q - 8) * scale + zero``;
- the result: (M, N) in x's dtype (float32 accumulation, rounded once to x's dtype).

The Q4_1 mapping (GGUF block ``block_q4_1``, llama.cpp ``ggml/src/ggml-common.h`` and ggml's
``docs/gguf.md``; gguf-py ``gguf/quants.py``, class ``Q4_1``; ``course_lib.quant.ggml_blocks``): each
block of 32 consecutive weights of a row stores fp16 ``d``, fp16 ``m`` and 32 codes ``q`` in 0..15, and
means ``w = d * q + m``. Since ``d * q + m = (q - 8) * d + (m + 8 d)``, the int4 weight with
``group_size = 32``, ``scale = d`` and ``zero = m + 8 d`` holds the file's codes as they are, without
quantising again. What changes is the rounding of ``scale`` and ``zero`` to bfloat16 (8 significant
bits; fp16 has 11) and of the activations to bfloat16: ``Int4Linear`` computes within bfloat16
rounding of the float32 product with the file's weights, not bitwise.

Where the kernel is missing (an old torch, a CPU build without it), refuses the shape (``kernel_shape_error``)
or when asked (``kernel=False``), ``Int4Linear`` dequantises its codes to float32 and multiplies
(``F.linear``): the same weights, the product rounded to bfloat16 as the kernel's is, at float32 speed or
slower; a one-line notice on stderr says so once per process and reason. Either path runs on the CPU only
(a tensor on another device is refused, naming it).

Loading: the first ``load_int4_decoder`` of a process spends about 2 s in PyTorch's first random
initialisation on the meta device (the decoder is built there, then every tensor is set from the file).

``load_int4_decoder`` builds a ``course_lib.models.Decoder`` from a GGUF file of a Llama-style model
(SmolLM2's ``SmolLM2-135M-Instruct.Q4_1.gguf``): the 7 projections of every block become
``Int4Linear`` (the file's Q4_1 tensors); everything else keeps the file's values in float32 (RMSNorm
weights, F32 in the file; the token embedding, Q8_0 in the file, dequantised by
``ggml_blocks.dequantize_ggml``), and the output head, tied to that embedding, is a copy in
``head_dtype`` (float16 by default: half the bytes of float32; ``CastLinear``). The rest of the decoder
(residual stream, RMSNorm, attention, KV cache, logits) stays float32. ``int4_streamed_bytes`` counts
what a decode step reads of such a model.

Not covered: batch-invariant mode (``Decoder.batch_invariant_mode``) does not reach the int4 products
(PyTorch's kernel decides their summation order), so the int4 model is not batch-invariant; the graded
contracts of every lab use the float32 model.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..kernels import notice_once
from ..models import Decoder, ModelConfig
from ..validation import ArgumentTypeError, boolean, instance, integer, integer_tensor, materialized, one_of
from .ggml_blocks import GGML_BLOCK, GGML_BLOCK_BYTES, dequantize_ggml, read_gguf_tensor
from .packing import pack_int4, unpack_int4

__all__ = ["INT4_GROUP_SIZE", "HEAD_DTYPES", "KERNEL_GROUP_SIZES", "KERNEL_N_MULTIPLE", "int4_kernel_error",
           "kernel_shape_error", "q4_1_codes", "q4_1_to_int4",
           "Int4Linear", "CastLinear", "gguf_rope_rows", "GGUF_PROJECTIONS", "load_int4_decoder",
           "int4_streamed_bytes"]

#: Weights per group of the int4 weight built from Q4_1: one Q4_1 block (QK4_1 = 32 in ggml-common.h).
INT4_GROUP_SIZE: int = GGML_BLOCK
#: The dtypes ``load_int4_decoder`` accepts for the output head's copy.
HEAD_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
#: The activation dtype of the kernel path (and of the fallback's rounding of x).
ACTIVATION_DTYPE = torch.bfloat16
#: Decoder projection name -> GGUF tensor name stem (llama.cpp's ``LLM_TENSOR_NAMES``, "blk.{i}." prefix).
GGUF_PROJECTIONS: dict[str, str] = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
                                    "o_proj": "attn_output", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
                                    "down_proj": "ffn_down"}


@functools.lru_cache(maxsize=1)
def int4_kernel_error() -> str | None:
    """Why PyTorch's CPU int4 matmul cannot run in this process, or None when it can.

    Probed once per process with a 64 x 64 weight: the two ops must exist and their product must equal
    ``x @ ((q - 8) * scale + zero).T`` within bfloat16 rounding (a kernel that runs but computes
    another layout would be a silent wrong answer)."""
    ops = torch.ops.aten
    if not (hasattr(ops, "_convert_weight_to_int4pack_for_cpu") and hasattr(ops, "_weight_int4pack_mm_for_cpu")):
        return f"torch {torch.__version__} has no _weight_int4pack_mm_for_cpu"
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (64, 64), generator=gen, dtype=torch.int32)
    sz = (torch.rand(2, 64, 2, generator=gen) - 0.5).to(ACTIVATION_DTYPE)
    x = torch.randn(2, 64, generator=gen).to(ACTIVATION_DTYPE)
    try:
        packed = ops._convert_weight_to_int4pack_for_cpu(codes, 1)
        got = ops._weight_int4pack_mm_for_cpu(x, packed, 32, sz).float()
    except Exception as exc:          # RuntimeError where the CPU or the build lacks the kernel
        return f"torch's int4 CPU kernel fails here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    w = (codes.float() - 8) * sz[..., 0].float().t().repeat_interleave(32, 1) \
        + sz[..., 1].float().t().repeat_interleave(32, 1)
    want = x.float() @ w.t()
    if not torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max())):
        return "torch's int4 CPU kernel computes another weight than (q - 8) * scale + zero here"
    return None


#: Group sizes PyTorch's CPU int4 kernel takes (``_weight_int4pack_mm_for_cpu`` refuses others).
KERNEL_GROUP_SIZES: tuple[int, ...] = (32, 64, 128, 256)
#: The kernel's packing needs out_features (N) to be a multiple of this.
KERNEL_N_MULTIPLE: int = 16


def kernel_shape_error(n: int, k: int, group_size: int) -> str | None:
    """Why PyTorch's CPU int4 kernel refuses an (N, K) weight with this group size, or None: N must be a
    multiple of 16 and the group size one of 32, 64, 128, 256 (as torch 2.13's kernel checks them)."""
    if n % KERNEL_N_MULTIPLE:
        return f"the CPU int4 kernel needs out_features to be a multiple of {KERNEL_N_MULTIPLE}, got {n}"
    if group_size not in KERNEL_GROUP_SIZES:
        return f"the CPU int4 kernel takes group sizes {KERNEL_GROUP_SIZES}, got {group_size}"
    return None


def q4_1_codes(raw, shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The codes, scales and minima of a GGUF Q4_1 tensor, as stored (module docstring).

    Args:
        raw: the tensor's bytes (``read_gguf_tensor``'s raw data, or ``ggml_blocks.quantize_q4_1``'s
            output): a uint8 numpy array or torch tensor of ``N * K / 32`` blocks of 20 bytes, row order.
        shape: (N, K) (``nn.Linear.weight``'s shape), ints with N >= 1 and K a multiple of 32.

    Returns:
        (codes, d, m): codes uint8 (N, K) in 0..15 (each block's "halves" nibble order undone), and
        ``d``, ``m`` float32 (N, K / 32), the blocks' fp16 values; ``d * q + m`` per block is the weight
        ``gguf.quants.dequantize`` gives.

    Raises:
        ArgumentTypeError: raw not uint8. ValueError: a shape that is not (N, K) with K a multiple of 32,
        or a byte count that does not match it.
    """
    if isinstance(raw, torch.Tensor):
        materialized("raw", raw)
        raw = raw.detach().cpu().numpy()
    instance("raw", raw, np.ndarray, note="uint8 Q4_1 blocks")
    if raw.dtype != np.uint8:
        raise ArgumentTypeError(f"raw must hold uint8 Q4_1 blocks, got dtype {raw.dtype}")
    n, k = _shape2(shape)
    size = GGML_BLOCK_BYTES["Q4_1"]
    if raw.size != n * k // GGML_BLOCK * size:
        raise ValueError(f"raw must hold {n} x {k // GGML_BLOCK} Q4_1 blocks of {size} bytes "
                         f"= {n * k // GGML_BLOCK * size} bytes for shape {(n, k)}, got {raw.size}")
    blocks = np.ascontiguousarray(raw).reshape(n, k // GGML_BLOCK, size)
    d = torch.from_numpy(blocks[..., 0:2].copy().view("<f2").astype(np.float32)[..., 0])
    m = torch.from_numpy(blocks[..., 2:4].copy().view("<f2").astype(np.float32)[..., 0])
    codes = unpack_int4(torch.from_numpy(blocks[..., 4:].copy()), GGML_BLOCK, signed=False, order="halves")
    return codes.reshape(n, k).to(torch.uint8), d, m


def _shape2(shape) -> tuple[int, int]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) != 2:
        raise ValueError(f"shape must be (N, K), the weight's (out_features, in_features), got {shape!r}")
    n = integer("shape[0]", shape[0], minimum=1)
    k = integer("shape[1]", shape[1], minimum=GGML_BLOCK)
    if k % GGML_BLOCK:
        raise ValueError(f"shape[1] (K, in_features) must be a multiple of the Q4_1 block of {GGML_BLOCK}, got {k}")
    return n, k


def q4_1_to_int4(d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_1's ``w = d * q + m`` as the int4 kernel's ``w = (q - 8) * scale + zero``: ``scale = d``,
    ``zero = m + 8 d`` (computed in float32, where ``8 d`` is exact), group size 32. The codes are unchanged.

    Args:
        d, m: float (N, K / 32), the blocks' scales and minima (``q4_1_codes``).

    Returns:
        (scales, zeros): float32 (N, K / 32).

    Raises:
        ArgumentTypeError: not float tensors. ValueError: shapes that differ or are not 2-D.
    """
    for name, t in (("d", d), ("m", m)):
        instance(name, t, torch.Tensor)
        materialized(name, t)
        if not t.dtype.is_floating_point or t.dim() != 2:
            raise ArgumentTypeError(f"{name} must be a 2-D float tensor (N, K / 32), got {t.dtype} {tuple(t.shape)}")
    if d.shape != m.shape:
        raise ValueError(f"d and m must have one shape (N, K / 32), got {tuple(d.shape)} and {tuple(m.shape)}")
    d32 = d.to(torch.float32)
    return d32, m.to(torch.float32) + 8 * d32


class Int4Linear(nn.Module):
    """A bias-free linear layer with int4 weights: ``y = x @ W.T``, ``W = (q - 8) * scale + zero`` per group.

    Args:
        codes: integer (N, K), values 0..15 (N = out_features, K = in_features).
        scales, zeros: float (N, K / group_size); stored as bfloat16, the kernel's dtype (the rounding
            this layer adds to the weight).
        group_size: consecutive input columns per scale, an int >= 1 dividing K (32 for Q4_1).
        kernel: True to require PyTorch's CPU int4 kernel (ValueError where ``int4_kernel_error()``
            says it cannot run, or ``kernel_shape_error`` refuses the shape: N a multiple of 16, group
            size 32, 64, 128 or 256), False for the fallback (dequantise to float32 and ``F.linear``; for
            tests and comparisons), None (default) for the kernel where it runs, else the fallback with
            a one-line notice on stderr, once per process.

    Attributes:
        weight_int4: uint8 (N, K / 2) parameter (no gradient): the kernel's packed layout
            (``_convert_weight_to_int4pack_for_cpu``) with the kernel, the course's "pairs" nibble
            layout (``quant.packing``) in the fallback.
        scales_and_zeros: bfloat16 (K / group_size, N, 2) parameter (no gradient), the kernel's layout.
        kernel: whether this layer calls the kernel.

    ``forward(x)``: x float (..., K) (float32, bfloat16 or float16) on the CPU -> (..., N) in x's dtype:
    x rounded to bfloat16, the product accumulated in float32, rounded to bfloat16 (as the kernel
    returns it), then cast to x's dtype. Raises ValueError for another last dimension or device,
    ArgumentTypeError for a non-float x.

    Raises:
        ArgumentTypeError / ValueError: codes not integers in 0..15 or not 2-D; scales/zeros of another
        shape or not float, or non-finite; a group_size that does not divide K; kernel not a bool or None;
        kernel=True where the kernel cannot run.
    """

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int = INT4_GROUP_SIZE, kernel: bool | None = None) -> None:
        super().__init__()
        integer_tensor("codes", codes, ranks=(2,), layout="(N, K)", minimum=0, maximum=15, note="unsigned int4 codes")
        n, k = codes.shape
        group_size = integer("group_size", group_size, minimum=1)
        if k == 0 or n == 0 or k % group_size:
            raise ValueError(f"group_size {group_size} must divide K = in_features = {k} (codes (N, K) = {(n, k)}, "
                             f"N, K >= 1)")
        if k % 2:
            raise ValueError(f"K = in_features must be even (two codes per byte), got {k}")
        for name, t in (("scales", scales), ("zeros", zeros)):
            instance(name, t, torch.Tensor)
            materialized(name, t)
            if not t.dtype.is_floating_point:
                raise ArgumentTypeError(f"{name} must be a float tensor, got dtype {t.dtype}")
            if tuple(t.shape) != (n, k // group_size):
                raise ValueError(f"{name} must be (N, K / group_size) = {(n, k // group_size)}, got {tuple(t.shape)}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} must be finite")
        if kernel is not None:
            boolean("kernel", kernel, note="or None: the kernel where it runs")
        why = int4_kernel_error() or kernel_shape_error(n, k, group_size)
        if kernel and why is not None:
            raise ValueError(f"kernel=True but PyTorch's CPU int4 kernel cannot run: {why}")
        if kernel is None and why is not None:
            notice_once(f"int4-cpu-fallback {why}", f"[int4] {why}: dequantising to float32 and multiplying "
                                                    f"instead (correct, not faster than float32)")
        self.kernel = why is None if kernel is None else kernel
        self.in_features, self.out_features, self.group_size = k, n, group_size
        codes = codes.detach().cpu()
        if self.kernel:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
        else:
            packed = pack_int4(codes.to(torch.uint8), signed=False, order="pairs")
        sz = torch.stack([scales.detach().cpu().t(), zeros.detach().cpu().t()], dim=-1)
        self.weight_int4 = nn.Parameter(packed, requires_grad=False)
        self.scales_and_zeros = nn.Parameter(sz.to(ACTIVATION_DTYPE).contiguous(), requires_grad=False)

    @classmethod
    def from_q4_1(cls, raw, shape, kernel: bool | None = None) -> "Int4Linear":
        """The layer of a GGUF Q4_1 tensor (``q4_1_codes``, then ``q4_1_to_int4``; group size 32).

        Raises: as ``q4_1_codes`` and the constructor."""
        codes, d, m = q4_1_codes(raw, shape)
        scales, zeros = q4_1_to_int4(d, m)
        return cls(codes, scales, zeros, INT4_GROUP_SIZE, kernel)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight (N, K) the fallback multiplies: ``(q - 8) * scale + zero`` with the stored
        bfloat16 scales and zeros. Fallback layers only (the kernel's packed layout is opaque).

        Raises: ValueError on a kernel layer."""
        if self.kernel:
            raise ValueError("dequantize reads the fallback's codes; this layer holds the kernel's packed layout "
                             "(build it with kernel=False to read its weight)")
        q = unpack_int4(self.weight_int4, self.in_features, signed=False, order="pairs").to(torch.float32)
        sz = self.scales_and_zeros.to(torch.float32).repeat_interleave(self.group_size, dim=0)   # (K, N, 2)
        return (q - 8) * sz[..., 0].t() + sz[..., 1].t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must be (..., {self.in_features}), got {tuple(x.shape)}")
        if not x.dtype.is_floating_point:
            raise ArgumentTypeError(f"x must be a float tensor, got dtype {x.dtype}")
        if x.device.type != "cpu":
            raise ValueError(f"Int4Linear runs on the CPU (PyTorch's CPU int4 kernel), x is on {x.device}")
        rows = x.reshape(-1, self.in_features).to(ACTIVATION_DTYPE)
        if self.kernel:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight_int4, self.group_size,
                                                           self.scales_and_zeros)
        else:
            y = F.linear(rows.to(torch.float32), self.dequantize()).to(ACTIVATION_DTYPE)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        path = "PyTorch's CPU int4 kernel" if self.kernel else "fallback: dequantise and multiply"
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"{path}")


class CastLinear(nn.Module):
    """A bias-free linear layer whose weight is stored in another dtype: ``y = (x in dtype) @ W.T``,
    returned in x's dtype. The int4 decoder's output head (float16 by default: 2 bytes per weight).

    Args:
        weight: float (N, K), copied in ``dtype``. dtype: one of ``HEAD_DTYPES``.

    Raises: ArgumentTypeError for a weight that is not a 2-D float tensor; ValueError for another dtype."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        instance("weight", weight, torch.Tensor)
        materialized("weight", weight)
        if not weight.dtype.is_floating_point or weight.dim() != 2:
            raise ArgumentTypeError(f"weight must be a 2-D float tensor, got {weight.dtype} {tuple(weight.shape)}")
        one_of("dtype", dtype, HEAD_DTYPES)
        self.weight = nn.Parameter(weight.detach().to(dtype, copy=True), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)


def gguf_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation of ``attn_q``/``attn_k`` (its converter interleaves each head's
    rows for the interleaved RoPE pairing; the decoder pairs split halves, as transformers does):
    ``w.reshape(heads, head_dim / 2, 2, ...)`` with the middle axes swapped, as transformers' GGUF loader
    (``modeling_gguf_pytorch_utils``, ``reverse_permute_weights``) does. Works on any tensor whose first
    axis is the rows (codes, per-block scales). docs/kv_cache.md and ``models.rope``.

    Args:
        w: (rows, ...) with rows = n_heads * head_dim, head_dim even. n_heads: an int >= 1.

    Raises: ValueError for rows that n_heads * 2 does not divide."""
    n_heads = integer("n_heads", n_heads, minimum=1)
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"w has {rows} rows, not n_heads * head_dim with an even head_dim (n_heads {n_heads})")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _tensor(path, name: str, shape: tuple[int, ...]):
    raw, kind, stored = read_gguf_tensor(path, name)
    if tuple(stored) != tuple(shape):
        raise ValueError(f"{path}: tensor {name} has shape {tuple(stored)}, the model needs {tuple(shape)}")
    return raw, kind


def load_int4_decoder(path: str | os.PathLike, config: ModelConfig, *, head_dtype: torch.dtype = torch.float16,
                      kernel: bool | None = None) -> Decoder:
    """A ``Decoder`` whose projections are ``Int4Linear`` built from a GGUF file's Q4_1 tensors.

    Args:
        path: a GGUF file of a Llama-style model (llama.cpp's tensor names: ``token_embd``,
            ``blk.{i}.attn_norm``, ``blk.{i}.attn_q`` ...; ``output.weight`` only when untied).
        config: the model's ``ModelConfig`` (``models.config_from_hf``; the float32 model's config).
        head_dtype: the output head's dtype, one of ``HEAD_DTYPES`` (a ``CastLinear``).
        kernel: as ``Int4Linear`` (None: the kernel where it runs).

    Returns:
        The decoder in eval mode without gradients: float32 embedding and norms (the file's values, Q8_0 or
        F32 dequantised), ``Int4Linear`` projections (group 32), the head in ``head_dtype``; its KV cache
        and logits are float32. q/k rows are put back in the decoder's RoPE order (``gguf_rope_rows``).

    Raises:
        ArgumentTypeError: config not a ModelConfig, kernel not a bool or None.
        ValueError: head_dtype not one of HEAD_DTYPES; a projection that is not Q4_1 in the file; a tensor of
            another shape than the config says. FileNotFoundError / KeyError: as ``read_gguf_tensor``.
    """
    instance("config", config, ModelConfig)
    one_of("head_dtype", head_dtype, HEAD_DTYPES)
    if kernel is not None:
        boolean("kernel", kernel)
    c = config
    with torch.device("meta"):                      # no allocation: every tensor is set below
        model = Decoder(c)
    embed_raw, embed_kind = _tensor(path, "token_embd.weight", (c.vocab_size, c.d_model))
    embedding = dequantize_ggml(embed_raw, embed_kind, (c.vocab_size, c.d_model))
    model.embed_tokens.weight = nn.Parameter(embedding, requires_grad=False)

    def norm(name: str, size: int) -> nn.Parameter:
        raw, kind = _tensor(path, name, (size,))
        return nn.Parameter(dequantize_ggml(raw, kind, (size,)), requires_grad=False)

    heads = {"q_proj": c.n_heads, "k_proj": c.n_kv_heads}
    for i, block in enumerate(model.layers):
        block.input_layernorm.weight = norm(f"blk.{i}.attn_norm.weight", c.d_model)
        block.post_attention_layernorm.weight = norm(f"blk.{i}.ffn_norm.weight", c.d_model)
        for attr, stem in GGUF_PROJECTIONS.items():
            old = getattr(block, attr)
            name = f"blk.{i}.{stem}.weight"
            raw, kind = _tensor(path, name, (old.out_features, old.in_features))
            if kind != "Q4_1":
                raise ValueError(f"{path}: {name} is {kind}, not Q4_1; the int4 decoder maps Q4_1 blocks only")
            codes, d, m = q4_1_codes(raw, (old.out_features, old.in_features))
            if attr in heads:
                codes, d, m = (gguf_rope_rows(t, heads[attr]) for t in (codes, d, m))
            setattr(block, attr, Int4Linear(codes, *q4_1_to_int4(d, m), INT4_GROUP_SIZE, kernel))
    model.norm.weight = norm("output_norm.weight", c.d_model)
    if c.tie_embeddings:
        head = embedding
    else:
        raw, kind = _tensor(path, "output.weight", (c.vocab_size, c.d_model))
        head = dequantize_ggml(raw, kind, (c.vocab_size, c.d_model))
    model.lm_head = CastLinear(head, head_dtype)
    return model.eval().requires_grad_(False)


def int4_streamed_bytes(model: nn.Module) -> int:
    """Bytes a batch-1 decode step of an int4 decoder reads from its weights: every parameter once
    (packed codes, bfloat16 scales and zeros, norms, the output head in its dtype), except the token
    embedding when the head is not the same tensor (a step looks up one row of it, it does not stream it).
    For a float32 ``Decoder`` with a tied head this equals ``models.config.weight_bytes``.

    Args:
        model: a decoder with an ``embed_tokens`` embedding and an ``lm_head``.

    Raises: ArgumentTypeError for a model without ``embed_tokens``/``lm_head``."""
    embedding = getattr(getattr(model, "embed_tokens", None), "weight", None)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if not isinstance(embedding, torch.Tensor) or not isinstance(head, torch.Tensor):
        raise ArgumentTypeError(f"model must have embed_tokens and lm_head weights (a Decoder), "
                                f"got {type(model).__qualname__}")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total if head is embedding else total - embedding.numel() * embedding.element_size()
