"""Paged attention for decode: one query per sequence over K/V kept in fixed-size blocks.

Source: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023 (the block table); course Lab 2 ("Paged KV") for the pool layout;
nano-vllm's ``store_kvcache`` / ``flash_attn_with_kvcache`` for the slot mapping and the block
tables padded to the batch's widest row. ``docs/engine.md`` describes how the serving engine uses it;
``docs/kernels.md`` lists the course's Triton kernels and their benchmark.

Shapes and dtypes (every public function):
    q: (B, Hq, D) rotated queries, one per sequence (the decode step), float32 / bfloat16 / float16.
    k_cache, v_cache: (num_blocks, block_size, Hkv, D), one layer's block storage (Lab 2's
        ``BlockPool.k`` layout), the dtype of q. Hkv divides Hq; query head h reads KV head
        h // (Hq // Hkv) (consecutive query heads share a KV head, as in ``models.attention``).
    block_tables: (B, W) int32 or int64: row b lists the physical blocks of sequence b in logical
        order; W is the widest row of the batch. Its first ceil(context_lens[b] / block_size)
        entries are read and must be blocks of the pool (0 .. num_blocks - 1); the entries past them
        are padding (any value: they are never read).
    context_lens: (B,) int32 or int64, cached positions of each sequence including the newest,
        1 <= context_lens[b] <= W * block_size.
    returns: (B, Hq, D) in q's dtype; scores, softmax and the weighted sum in float32, scale
        1 / sqrt(D).

``reference_paged_decode_attention`` is the PyTorch path (it gathers each sequence's blocks into a
contiguous tensor and calls PyTorch's fused attention); the serving engine runs it on CPU.
``paged_decode_attention`` has the same signature and contract and runs a Triton kernel that reads
the blocks in place (dispatch as ``course_lib.kernels.gemv``: compiled on CUDA tensors, interpreted
on CPU tensors under ``TRITON_INTERPRET=1``, otherwise the PyTorch path with a one-line notice).

Roofline (sources: Williams, Waterman, Patterson, "Roofline", CACM 2009; ``docs/roofline.md#decode-attention``;
``docs/kernels.md#paged-attention-decode``). For sequence b with L_b = context_lens[b] cached
positions, every query head does one dot product q.k (2 D FLOP) and one weighted add p v (2 D FLOP)
per position, so

    FLOP  = 4 * sum_b(L_b) * Hq * D                      (the exponentials are not counted)
    bytes = 2 * sum_b(L_b) * Hkv * D * e   (K and V of every cached position, read once)
            + 2 * B * Hq * D * e           (q in, the output out; e = bytes per element)

(the block-table entries and context lengths, 4 or 8 bytes per block and sequence, are left out:
0.03 % of the K/V bytes for SmolLM2's heads in blocks of 16 positions). The arithmetic intensity is therefore
about 4 L Hq D / (2 L Hkv D e) = 2 (Hq / Hkv) / e FLOP/byte, independent of the batch size and the
context: 3 FLOP/byte for SmolLM2-135M (Hq / Hkv = 9 / 3) in bfloat16, 1.5 in float32, 4 for a
32 / 8 head layout in bfloat16. Ridge points are tens to hundreds of FLOP/byte (about 206 for an
H200: 989 TFLOP/s dense BF16 over 4.8 TB/s, ``course_lib.hardware.DEVICES``), so decode attention
is memory-bound and its time bound is bytes / bandwidth. Unlike a weight matrix, a cache is not
shared between sequences: batching brings more caches, not more reuse, so it never raises the
intensity. ``decode_attention_bytes`` and ``decode_attention_flops`` compute the two counts;
``python -m course_lib.kernels.bench`` divides the bytes by the measured time.

Kernel design (after vLLM's paged attention v1, Kwon et al. 2023, with the online softmax of
FlashAttention, Dao et al. 2022; the split of long contexts is Flash-Decoding, Dao, Haziza, Massa
and Sizov 2023, as in vLLM's paged attention v2). One program per (sequence, KV head, split). It
holds the queries of the KV head's whole group, query heads kvh * G .. kvh * G + G - 1 with
G = Hq / Hkv, as one (G, D) tile padded to powers of two with masks (so any G and any D work), and
every key and value it loads serves all G heads: the cache is read from memory once. It walks its
positions in tiles of ``block_n`` (a power of two, independent of the block size, which may be any
int >= 1): position p lives in physical block ``block_tables[b, p // block_size]`` at slot
``p % block_size``, so each tile gathers its rows through the table, with int64 offsets (a block id
times the block stride overflows int32 in a large pool). Every table, key and value load is masked
by p < context_lens[b]: the slots past the context in the last block and the padding entries of the
table are never read, whatever they hold (a freed block's stale values, NaN, -1 or an id past the
pool). Per tile it forms the float32 scores s = (q . k) / sqrt(D) as elementwise products summed
over D, not ``tl.dot`` (G is a handful of rows, below the 16 a tensor-core tile needs, and the
kernel is memory-bound anyway), and updates the online softmax: running max m, running sum l and a
float32 (G, D) accumulator, both rescaled by exp(m_old - m_new) whenever the max grows (in base 2,
with log2(e) folded into the scale). With one split the program writes acc / l in q's dtype. With
S > 1 splits (``num_splits``; by default enough for about ``PROGRAMS_PER_SM`` = 4 programs per
streaming multiprocessor when B * Hkv programs alone would leave part of a GPU idle, each split at
least ``MIN_SPLIT_POSITIONS`` = 256 positions: a guess, not tuned on a GPU) each split writes its
normalised partial output o_s and its log-sum-exp lse_s, and a second small kernel combines them:
out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max_s lse_s); a split that starts past a
sequence's context has lse_s = -inf and weight 0.
"""
from __future__ import annotations

import math

import torch

from ..validation import ArgumentTypeError, instance, materialized, positive_integer, power_of_two
from . import check_tile, fallback_notice, import_triton, kernel_interpreted, notice_once, triton_mode

__all__ = ["reference_paged_decode_attention", "paged_decode_attention_unchecked", "gather_blocks",
           "check_paged_decode_inputs", "write_slots", "paged_decode_attention", "paged_decode_kernel_unchecked",
           "decode_attention_bytes", "decode_attention_flops", "default_num_splits", "SUPPORTED_DTYPES",
           "MIN_SPLIT_POSITIONS", "PROGRAMS_PER_SM", "KERNEL_INTERPRETED"]

#: dtypes of q and the caches that ``paged_decode_attention`` runs (the reference takes any floating dtype).
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: The default split never gives a split fewer positions than this (module docstring, "Kernel design").
MIN_SPLIT_POSITIONS = 256
#: The default split aims at this many programs per streaming multiprocessor (a guess, not tuned on a GPU).
PROGRAMS_PER_SM = 4
#: Largest elementwise product tile (G * block_n * D, padded) the default ``block_n`` allows: the
#: scores and the weighted sum each form one such float32 tile in registers.
_MAX_PRODUCT_TILE = 8192
_LOG2E = 1.4426950408889634  # log2(e): exp(x) = 2 ** (x * log2(e))

triton, tl = import_triton()

if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, cl_ptr, o_ptr, lse_ptr,
        qk_scale, positions_per_split,
        stride_qb, stride_qh, stride_qd,
        stride_kb, stride_ks, stride_kh, stride_kd,
        stride_vb, stride_vs, stride_vh, stride_vd,
        stride_tb, stride_tw, stride_cl,
        stride_ob, stride_oh, stride_os, stride_od,
        stride_lb, stride_lh, stride_ls,
        GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1).to(tl.int64)
        split = tl.program_id(2)
        g = tl.arange(0, GROUP_P)
        d = tl.arange(0, HEAD_DIM_P)
        g_ok = g < GROUP
        d_ok = d < HEAD_DIM
        heads = kvh * GROUP + g  # the query heads that read KV head kvh (int64)
        gd_ok = g_ok[:, None] & d_ok[None, :]
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                    mask=gd_ok, other=0.0).to(tl.float32)
        q = q * qk_scale  # 1/sqrt(D) and log2(e) folded in once: the scores are in base 2

        context = tl.load(cl_ptr + b * stride_cl).to(tl.int32)
        start = split * positions_per_split
        end = tl.minimum(start + positions_per_split, context)
        bt_row = bt_ptr + b * stride_tb
        k_head = k_ptr + kvh * stride_kh
        v_head = v_ptr + kvh * stride_vh

        m_i = tl.zeros((GROUP_P,), dtype=tl.float32) - float("inf")  # running max (base-2 scores)
        l_i = tl.zeros((GROUP_P,), dtype=tl.float32)                   # running sum of 2^(s - m)
        acc = tl.zeros((GROUP_P, HEAD_DIM_P), dtype=tl.float32)        # running sum of 2^(s - m) v
        for t0 in range(start, end, BLOCK_N):
            pos = t0 + tl.arange(0, BLOCK_N)
            p_ok = pos < end
            # Only the table entries of blocks that hold a position < context are read: padding never is.
            block = tl.load(bt_row + (pos // BLOCK_SIZE).to(tl.int64) * stride_tw, mask=p_ok, other=0)
            block = block.to(tl.int64)
            slot = (pos % BLOCK_SIZE).to(tl.int64)
            kv_ok = p_ok[:, None] & d_ok[None, :]
            k = tl.load(k_head + (block * stride_kb + slot * stride_ks)[:, None] + d[None, :] * stride_kd,
                        mask=kv_ok, other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)         # (GROUP_P, BLOCK_N)
            s = tl.where(p_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))                 # finite: the tile has a position
            alpha = tl.exp2(m_i - m_new)                               # 0 on the first tile (m_i = -inf)
            p = tl.exp2(s - m_new[:, None])                            # 0 at masked positions
            v = tl.load(v_head + (block * stride_vb + slot * stride_vs)[:, None] + d[None, :] * stride_vd,
                        mask=kv_ok, other=0.0).to(tl.float32)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new

        nonempty = l_i > 0.0  # false only for a split that starts past the context (SPLIT only)
        out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
        o_off = b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :] * stride_od
        tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=gd_ok)
        if SPLIT:
            lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
            tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=g_ok)

    @triton.jit
    def _combine_splits_kernel(
        po_ptr, lse_ptr, o_ptr,
        num_splits,
        stride_pb, stride_ph, stride_ps, stride_pd,
        stride_lb, stride_lh, stride_ls,
        stride_ob, stride_oh, stride_od,
        HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, SPLITS_P: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        sp = tl.arange(0, SPLITS_P)
        d = tl.arange(0, HEAD_DIM_P)
        s_ok = sp < num_splits
        d_ok = d < HEAD_DIM
        lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + sp.to(tl.int64) * stride_ls,
                      mask=s_ok, other=float("-inf"))
        w = tl.exp2(lse - tl.max(lse, axis=0))  # split 0 is never empty, so the max is finite
        po = tl.load(po_ptr + b * stride_pb + h * stride_ph + sp.to(tl.int64)[:, None] * stride_ps
                     + d[None, :] * stride_pd, mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        out = tl.sum(w[:, None] * po, axis=0) / tl.sum(w, axis=0)
        tl.store(o_ptr + b * stride_ob + h * stride_oh + d * stride_od, out.to(o_ptr.dtype.element_ty), mask=d_ok)
else:
    _paged_decode_kernel = None
    _combine_splits_kernel = None

#: Whether ``@triton.jit`` built the kernels for the interpreter (TRITON_INTERPRET at this module's import).
KERNEL_INTERPRETED = kernel_interpreted(_paged_decode_kernel)


def check_paged_decode_inputs(q, k_cache, v_cache, block_tables, context_lens) -> None:
    """Check the arguments of the paged decode functions (module docstring), without reading the cache.

    Raises:
        ArgumentTypeError: a non-tensor; q or the caches not floating, or of different dtypes;
            block_tables or context_lens not int32 / int64.
        ValueError: wrong ranks; B, D or Hkv that disagree; no KV head or a block size of 0; Hkv not
            dividing Hq; a context length < 1 or longer than the table row holds; a block id outside
            the pool (< 0 or >= num_blocks) among the first ceil(context_lens[b] / block_size) entries
            of row b, the entries the functions read (the rest is padding and may hold anything); a
            tensor on another device than q, or on the meta device (no values to check).

    The checks read ``context_lens`` and ``block_tables`` back to the host (one synchronisation on
    a GPU): a bad id would otherwise be read as block 0 by the PyTorch path and outside the pool by
    the kernel.
    """
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
                    ("context_lens", context_lens)):
        materialized(name, instance(name, x, torch.Tensor))
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
    if not q.dtype.is_floating_point or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ArgumentTypeError(f"q, k_cache and v_cache must share one floating dtype, got {q.dtype}, "
                                f"{k_cache.dtype}, {v_cache.dtype}")
    for name, x in (("block_tables", block_tables), ("context_lens", context_lens)):
        if x.dtype not in (torch.int32, torch.int64):
            raise ArgumentTypeError(f"{name} must be int32 or int64, got {x.dtype}")
    if q.dim() != 3:
        raise ValueError(f"q must be (B, Hq, D): one query per sequence, got shape {tuple(q.shape)}")
    B, Hq, D = q.shape
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[3] != D:
        raise ValueError(f"k_cache and v_cache must both be (num_blocks, block_size, Hkv, D={D}), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    num_blocks, block_size, Hkv = k_cache.shape[:3]
    if Hkv < 1 or block_size < 1:
        raise ValueError(f"k_cache and v_cache need at least one KV head and a block size >= 1, got shape "
                         f"{tuple(k_cache.shape)} (num_blocks, block_size, Hkv, D)")
    if Hq % Hkv:
        raise ValueError(f"KV heads ({Hkv}) must divide query heads ({Hq})")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or block_tables.shape[1] < 1:
        raise ValueError(f"block_tables must be (B={B}, W >= 1), got {tuple(block_tables.shape)}")
    if tuple(context_lens.shape) != (B,):
        raise ValueError(f"context_lens must be (B={B},), got {tuple(context_lens.shape)}")
    width = block_tables.shape[1] * block_size
    if B and (int(context_lens.min()) < 1 or int(context_lens.max()) > width):
        raise ValueError(f"context_lens must be in 1 .. W * block_size = {width}, got "
                         f"{context_lens.min().item()} .. {context_lens.max().item()}")
    read = (torch.arange(block_tables.shape[1], device=q.device)[None, :]
            < (context_lens[:, None].to(torch.int64) + block_size - 1) // block_size)
    outside = read & ((block_tables < 0) | (block_tables >= num_blocks))
    if bool(outside.any()):
        b, j = (int(i) for i in outside.nonzero()[0])
        raise ValueError(f"block_tables[{b}, {j}] is {int(block_tables[b, j])}, not a block of the pool "
                         f"(0 .. {num_blocks - 1}); row {b} has {int(context_lens[b])} positions, so its first "
                         f"{-(-int(context_lens[b]) // block_size)} entries are read (entries past them are padding "
                         "and may hold anything)")


def gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of each row's blocks, in logical order: (B, length, Hkv, D).

    Args:
        cache: (num_blocks, block_size, Hkv, D) storage. block_tables: (B, W) block ids; only the
            first ceil(length / block_size) columns are read, so padding past them may hold any value.
        length: positions to return (1 .. W * block_size), the same for every row; positions past a
            row's own context hold whatever its blocks (or block 0, for padding) hold: mask them.
    No checks (callers check once with ``check_paged_decode_inputs``)."""
    block_size = cache.shape[1]
    n = -(-length // block_size)
    ids = block_tables[:, :n].to(torch.int64)
    in_range = (ids >= 0) & (ids < cache.shape[0])
    ids = torch.where(in_range, ids, torch.zeros_like(ids))           # padding reads block 0, then is masked
    # index_select copies whole blocks (block_size * Hkv * D contiguous values each): faster than cache[ids]
    return cache.index_select(0, ids.flatten()).view(ids.shape[0], n * block_size, *cache.shape[2:])[:, :length]


def reference_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                     block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """Decode attention over paged K/V, by gathering the blocks (module docstring for shapes).

    Query b reads positions 0 .. context_lens[b] - 1 of its own blocks; the padded rest of the
    widest row is masked out. Returns (B, Hq, D) in q's dtype.

    Raises: as ``check_paged_decode_inputs``."""
    check_paged_decode_inputs(q, k_cache, v_cache, block_tables, context_lens)
    return paged_decode_attention_unchecked(q, k_cache, v_cache, block_tables, context_lens)


def paged_decode_attention_unchecked(q, k_cache, v_cache, block_tables, context_lens,
                                     max_context: int | None = None) -> torch.Tensor:
    """``reference_paged_decode_attention`` without its checks: the engine's inner path, called once
    per layer with inputs its step builder made. ``max_context`` (an int) saves reading it back from
    ``context_lens`` when the caller knows it."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    S = int(context_lens.max()) if max_context is None else max_context
    keys = gather_blocks(k_cache, block_tables, S).transpose(1, 2)          # (B, Hkv, S, D)
    values = gather_blocks(v_cache, block_tables, S).transpose(1, 2)
    f32 = torch.float32
    mask = None
    if bool((context_lens != S).any()):
        mask = (torch.arange(S, device=q.device)[None, :] < context_lens[:, None].to(torch.int64))[:, None, None]
        # slots past a row's context hold another sequence's data or anything at all (even NaN, which a zero
        # weight would still spread): read them as zeros
        values = values.masked_fill(~mask[:, :, 0, :, None], 0.0)
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None].to(f32), keys.to(f32), values.to(f32), attn_mask=mask, scale=1.0 / math.sqrt(q.shape[-1]),
        enable_gqa=keys.shape[1] != q.shape[1])
    return out[:, :, 0].to(q.dtype)


def write_slots(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                slot_mapping: torch.Tensor) -> None:
    """Write N new positions into the block storage: position i goes to flat slot slot_mapping[i]
    = block_id * block_size + offset (nano-vllm's slot mapping).

    Args: k_cache, v_cache: (num_blocks, block_size, Hkv, D); k, v: (N, Hkv, D); slot_mapping: (N,)
    int64 of distinct slots. No checks: the engine's step builder computes the slots from live
    block tables."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _context_total(context_lens) -> tuple[int, int]:
    """(number of sequences, sum of their context lengths) from a sequence of ints or a 1-D tensor."""
    if isinstance(context_lens, torch.Tensor):
        materialized("context_lens", context_lens)
        if context_lens.dim() != 1 or context_lens.dtype.is_floating_point or context_lens.dtype == torch.bool:
            raise ArgumentTypeError(f"context_lens must be a 1-D integer tensor, got {context_lens.dtype} of shape "
                                    f"{tuple(context_lens.shape)}")
        lens = [int(n) for n in context_lens.tolist()]
    else:
        lens = list(context_lens)
    return len(lens), sum(positive_integer("context_lens[i]", n) for n in lens)


def decode_attention_bytes(context_lens, n_heads: int, n_kv_heads: int, head_dim: int, element_size: int) -> int:
    """Bytes one paged decode-attention call must move at least (module docstring, "Roofline").

    2 * sum(context_lens) * n_kv_heads * head_dim * element_size (K and V of every cached position,
    read once) + 2 * B * n_heads * head_dim * element_size (q read, the output written). The table
    entries and context lengths are left out (0.03 % for SmolLM2's heads in blocks of 16 positions).

    Args:
        context_lens: the B context lengths (ints >= 1, or a 1-D integer tensor).
        n_heads, n_kv_heads, head_dim, element_size: Hq, Hkv, D, and bytes per element of q and the cache.

    Returns: an int (exact).

    Raises: ArgumentTypeError / ValueError for a length or size that is not an int >= 1."""
    B, total = _context_total(context_lens)
    hq, hkv, dim, e = (positive_integer(name, x) for name, x in
                       (("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("element_size", element_size)))
    return 2 * total * hkv * dim * e + 2 * B * hq * dim * e


def decode_attention_flops(context_lens, n_heads: int, head_dim: int) -> int:
    """FLOPs of one decode-attention call: 4 * sum(context_lens) * n_heads * head_dim (a q.k dot product
    and a p v update, 2 * head_dim FLOPs each, per query head and cached position; exponentials not
    counted). Raises as :func:`decode_attention_bytes`."""
    _, total = _context_total(context_lens)
    return 4 * total * positive_integer("n_heads", n_heads) * positive_integer("head_dim", head_dim)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _default_block_n(group_p: int, dim_p: int) -> int:
    """Positions per loop step: as many as keep the (G, block_n, D) product tile (padded sizes) within
    ``_MAX_PRODUCT_TILE`` floats, clamped to 16 .. 128 (a power of two, as its arguments are)."""
    return max(16, min(128, _MAX_PRODUCT_TILE // (group_p * dim_p)))


def default_num_splits(programs: int, max_context: int, sm_count: int | None) -> int:
    """Splits per sequence when ``num_splits`` is not given (module docstring, "Kernel design").

    1 off a GPU (``sm_count`` None) or when ``programs`` = B * Hkv already gives every streaming
    multiprocessor ``PROGRAMS_PER_SM`` programs; otherwise enough splits for about that many, but never
    more than keep ``MIN_SPLIT_POSITIONS`` of ``max_context`` per split. Returns an int >= 1.

    Raises: ArgumentTypeError / ValueError for an argument that is not an int >= 1 (or None for sm_count)."""
    programs = positive_integer("programs", programs)
    max_context = positive_integer("max_context", max_context)
    if sm_count is None:
        return 1
    sm_count = positive_integer("sm_count", sm_count)
    if programs >= PROGRAMS_PER_SM * sm_count:
        return 1
    wanted = -(-PROGRAMS_PER_SM * sm_count // programs)
    return max(1, min(wanted, max_context // MIN_SPLIT_POSITIONS))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, *,
                           block_n: int | None = None, num_splits: int | None = None,
                           num_warps: int | None = None) -> torch.Tensor:
    """Decode attention over paged K/V with the Triton kernel; same contract as
    :func:`reference_paged_decode_attention` (module docstring for shapes, "Kernel design" for the kernel).

    Args:
        q: (B, Hq, D) float32, bfloat16 or float16, any strides.
        k_cache, v_cache: (num_blocks, block_size, Hkv, D), q's dtype and device, any strides (a view of
            one layer of a larger pool works).
        block_tables: (B, W) int32 or int64; entries past a row's ceil(context_lens[b] / block_size)
            blocks are never read (any value).
        context_lens: (B,) int32 or int64, 1 .. W * block_size.
        block_n: positions per loop step (a power of two; default 16 .. 128 from the padded G and D).
        num_splits: splits of each sequence's positions (int >= 1; default 1 off a GPU, and on a GPU
            enough to occupy it when B * Hkv programs are few, see the module docstring).
        num_warps: passed to the launch on a GPU (Triton's default when None).

    Returns:
        (B, Hq, D) in q's dtype on q's device (float32 scores, softmax and sums, scale 1 / sqrt(D)).

    Dispatch (see :func:`course_lib.kernels.triton_mode`): the kernel runs compiled on CUDA tensors in
    ``"native"`` mode and interpreted on CPU tensors in ``"interpreter"`` mode; in every other case (no
    triton, no GPU, CPU tensors without the interpreter) the result comes from
    :func:`reference_paged_decode_attention` and a one-line notice is printed once. The checks read
    ``context_lens`` back to the host (its min and max); :func:`paged_decode_kernel_unchecked` is the
    same kernel without them, for callers that built their inputs themselves.

    Raises:
        ArgumentTypeError / ValueError: as :func:`check_paged_decode_inputs`; ArgumentTypeError for a dtype
        other than float32, bfloat16 and float16; ValueError for a ``block_n`` that is not a power of two
        or whose (group, block_n, head_dim) product tile, padded, exceeds ``MAX_TILE_ELEMENTS``, or a
        ``num_splits`` below 1.
    """
    check_paged_decode_inputs(q, k_cache, v_cache, block_tables, context_lens)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ArgumentTypeError(f"paged_decode_attention runs float32, bfloat16 and float16, got {q.dtype} "
                                "(reference_paged_decode_attention takes any floating dtype)")
    B, Hq, D = q.shape
    group_p, dim_p = _next_power_of_two(Hq // k_cache.shape[2]), _next_power_of_two(D)
    if block_n is None:
        block_n = _default_block_n(group_p, dim_p)
    else:
        block_n = power_of_two("block_n", block_n, note="tl.arange needs one")
    check_tile("paged_decode_attention", group=group_p, block_n=block_n, head_dim=dim_p)
    if num_splits is not None:
        num_splits = positive_integer("num_splits", num_splits)
    if q.numel() == 0:  # no sequence (or no head): nothing to read
        return torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)

    fallback = fallback_notice("course_lib.kernels.paged_attention", "paged-attention", _paged_decode_kernel,
                               triton_mode(), q)
    if fallback is not None:
        notice_once(*fallback)
        return paged_decode_attention_unchecked(q, k_cache, v_cache, block_tables, context_lens)

    return paged_decode_kernel_unchecked(q, k_cache, v_cache, block_tables, context_lens, block_n=block_n,
                                         num_splits=num_splits, num_warps=num_warps)


def paged_decode_kernel_unchecked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  max_context: int | None = None, *, block_n: int | None = None,
                                  num_splits: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """The Triton kernel of :func:`paged_decode_attention` without its checks, its dispatch or any read of
    ``context_lens`` on the host: the inner path for a caller that built its inputs itself (an engine's
    decode step, ``bench_paged_attention``), with the arguments of ``paged_decode_attention_unchecked``.

    Args: as :func:`paged_decode_attention`, already valid (``check_paged_decode_inputs``, a supported
        dtype, a power-of-two ``block_n``, ``num_splits`` >= 1), on CUDA when the kernel is compiled and on
        the CPU when it is interpreted (``KERNEL_INTERPRETED``). ``max_context``: an upper bound of
        ``context_lens`` that sizes the splits (default W * block_size, the table's width); a bound below
        the longest context gives a wrong result.

    Returns: (B, Hq, D) in q's dtype.

    Raises: RuntimeError when triton does not import here (no fallback: see :func:`paged_decode_attention`).
    """
    if _paged_decode_kernel is None:
        raise RuntimeError("paged_decode_kernel_unchecked needs triton; paged_decode_attention falls back to the "
                           "PyTorch reference instead")
    B, Hq, D = q.shape
    block_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    # The interpreter's float32 -> bfloat16 cast truncates where the GPU rounds to nearest even
    # (triton_ops module docstring): interpreted, the kernel writes float32 and torch rounds.
    out_dtype = torch.float32 if KERNEL_INTERPRETED else q.dtype
    out = torch.empty(B, Hq, D, dtype=out_dtype, device=q.device)
    if out.numel() == 0:
        return out.to(q.dtype)
    group = Hq // Hkv
    group_p, dim_p = _next_power_of_two(group), _next_power_of_two(D)
    if block_n is None:
        block_n = _default_block_n(group_p, dim_p)
    if max_context is None:
        max_context = block_tables.shape[1] * block_size
    tiles = -(-max_context // block_n)
    if num_splits is None:
        sm_count = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else None
        num_splits = default_num_splits(B * Hkv, max_context, sm_count)
    tiles_per_split = -(-tiles // min(num_splits, tiles))
    num_splits = -(-tiles // tiles_per_split)              # no split past max_context
    positions_per_split = tiles_per_split * block_n
    split = num_splits > 1
    if split:
        partial = torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
        o, o_strides, lse_strides = partial, partial.stride(), lse.stride()
    else:
        o, lse = out, out                                   # lse is never touched when SPLIT is False
        o_strides = (out.stride(0), out.stride(1), 0, out.stride(2))
        lse_strides = (0, 0, 0)
    kwargs = {} if num_warps is None or KERNEL_INTERPRETED else {"num_warps": num_warps}
    _paged_decode_kernel[(B, Hkv, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, o, lse,
        _LOG2E / math.sqrt(D), positions_per_split,
        *q.stride(), *k_cache.stride(), *v_cache.stride(),
        *block_tables.stride(), context_lens.stride(0),
        *o_strides, *lse_strides,
        GROUP=group, GROUP_P=group_p, HEAD_DIM=D, HEAD_DIM_P=dim_p,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, SPLIT=split,
        **kwargs,
    )
    if split:
        _combine_splits_kernel[(B, Hq)](
            partial, lse, out,
            num_splits,
            *partial.stride(), *lse.stride(), *out.stride(),
            HEAD_DIM=D, HEAD_DIM_P=dim_p, SPLITS_P=_next_power_of_two(num_splits),
        )
    return out.to(q.dtype)
