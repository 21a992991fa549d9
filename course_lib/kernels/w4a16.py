"""W4A16 matmul, y = x @ W_hat^T with packed int4 weights: a Triton kernel beside its PyTorch reference (Lab 4).

The weight format is the course's packed int4 layout (``docs/quantization.md#int4-packing``,
``course_lib.quant.packing``): ``W_hat`` of shape (N, K) (``nn.Linear.weight``: out_features by
in_features) is stored as

- ``packed``: uint8 (N, ceil(K/2)); element 2j of a row in the LOW nibble (bits 0-3) of byte j,
  element 2j+1 in the HIGH nibble (bits 4-7); for odd K the last high nibble is padding;
- ``scales``: (N, K // g), float16 or float32, one per (row, group of ``g = group_size``
  consecutive input columns);
- ``zeros``: None for symmetric codes, which are then signed two's-complement nibbles (-8..7),
  ``w_hat = q * s``; or (N, K // g) zero points (float16, float32 or uint8, integers 0..15) for
  asymmetric codes, which are then unsigned (0..15), ``w_hat = (q - z) * s``
  (Jacob et al. 2018, arXiv:1712.05877; ``docs/quantization.md#asymmetric-min-max``).

Shapes and dtypes (both functions):
    x: (M, K), float32, float16 or bfloat16, any strides.
    y: (M, N), float32; ``w_hat`` is formed in float32 as ``(q - z) * s`` (one rounding, as
    ``PackedInt4.dequantize``), every product x * w_hat is accumulated in float32.

Why it pays (``docs/quantization.md#w4a16-kernel``, ``docs/roofline.md``): a decode step with
few rows M is memory-bound, and its time is the bytes moved over the bandwidth. Reading 4-bit
codes plus a 16-bit scale per group (4.25 bits per weight at g = 64) instead of 16-bit weights
moves about 3.8x fewer weight bytes. The weights must therefore be dequantised in registers,
never written back to memory as floats; ``bench_w4a16`` measures the bandwidth reached.

Kernel design: each program owns a (block_m, block_n) tile of y. It walks K in steps of
``block_k`` columns (``block_k / 2`` bytes of each of its block_n weight rows). For each step it
loads the packed bytes, splits them in registers into low nibbles (even columns, ``byte & 0xF``)
and high nibbles (odd columns, ``byte >> 4``), sign-extends them for signed codes
(``(q ^ 8) - 8``), gathers the scale (and zero point) of each column's group, forms
``w_hat = (q - z) * s`` in float32, and adds two float32 dot products (even columns of x with
the low-nibble weights, odd columns with the high-nibble ones) into a float32 accumulator.
Every load is masked: rows of x beyond M, rows of W beyond N and columns beyond K (the padding
nibble of odd K included) are never read, so sizes need not be multiples of the blocks. A
group may straddle a byte (odd g), since the group index is computed per column.
"""
from __future__ import annotations

import torch

from ..quant.packing import PackedInt4, check_int4_zero_points, unpack_int4
from ..validation import ArgumentTypeError, instance, positive_integer, power_of_two
from . import check_tile, fallback_notice, import_triton, kernel_interpreted, notice_once, triton_mode

__all__ = [
    "reference_w4a16", "w4a16_matmul", "check_w4a16_inputs", "X_DTYPES", "SCALE_DTYPES", "ZERO_DTYPES",
    "DEFAULT_BLOCK_M", "DEFAULT_BLOCK_N", "DEFAULT_BLOCK_K",
]

X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALE_DTYPES = (torch.float16, torch.float32)
ZERO_DTYPES = (torch.float16, torch.float32, torch.uint8)
DEFAULT_BLOCK_M = 16
DEFAULT_BLOCK_N = 32
DEFAULT_BLOCK_K = 128
#: ``tl.dot`` needs every tile dimension to be at least 16 when compiled; block_k counts
#: columns, two per byte, so its byte tile is block_k / 2 >= 16.
MIN_BLOCK = {"block_m": 16, "block_n": 16, "block_k": 32}

triton, tl = import_triton()

if triton is not None:

    @triton.jit
    def _w4a16_kernel(
        x_ptr, p_ptr, s_ptr, z_ptr, y_ptr,
        M, N, K, KB, G,
        stride_xm, stride_xk,
        stride_pn, stride_pb,
        stride_sn, stride_sg,
        stride_zn, stride_zg,
        stride_ym, stride_yn,
        SIGNED: tl.constexpr, HAS_ZEROS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of x and y
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # rows of W = columns of y
        row_mask = rows < M
        col_mask = cols < N
        # int64 offsets: index * stride overflows int32 for tensors of more than 2**31 elements.
        x_row = rows.to(tl.int64) * stride_xm
        p_col = cols.to(tl.int64) * stride_pn
        s_col = cols.to(tl.int64) * stride_sn
        z_col = cols.to(tl.int64) * stride_zn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for b0 in range(0, KB, BLOCK_B):
            byte_idx = b0 + tl.arange(0, BLOCK_B)  # byte j of a row holds columns 2j and 2j+1
            k_lo = (2 * byte_idx).to(tl.int64)
            k_hi = k_lo + 1
            lo_ok = k_lo < K  # same as byte_idx < KB
            hi_ok = k_hi < K  # false only for the padding nibble of odd K (and beyond)
            # Weight tiles are (BLOCK_B, BLOCK_N): the transpose of W's (N, K) orientation.
            w_mask_lo = lo_ok[:, None] & col_mask[None, :]
            w_mask_hi = hi_ok[:, None] & col_mask[None, :]
            byte = tl.load(p_ptr + byte_idx.to(tl.int64)[:, None] * stride_pb + p_col[None, :],
                           mask=w_mask_lo, other=0).to(tl.int32)
            q_lo = byte & 0xF
            q_hi = (byte >> 4) & 0xF
            if SIGNED:  # two's-complement nibble: 8..15 stand for -8..-1
                q_lo = (q_lo ^ 8) - 8
                q_hi = (q_hi ^ 8) - 8
            g_lo = (k_lo // G)[:, None] * stride_sg
            g_hi = (k_hi // G)[:, None] * stride_sg
            s_lo = tl.load(s_ptr + g_lo + s_col[None, :], mask=w_mask_lo, other=0.0).to(tl.float32)
            s_hi = tl.load(s_ptr + g_hi + s_col[None, :], mask=w_mask_hi, other=0.0).to(tl.float32)
            f_lo = q_lo.to(tl.float32)
            f_hi = q_hi.to(tl.float32)
            if HAS_ZEROS:
                zg_lo = (k_lo // G)[:, None] * stride_zg
                zg_hi = (k_hi // G)[:, None] * stride_zg
                f_lo -= tl.load(z_ptr + zg_lo + z_col[None, :], mask=w_mask_lo, other=0).to(tl.float32)
                f_hi -= tl.load(z_ptr + zg_hi + z_col[None, :], mask=w_mask_hi, other=0).to(tl.float32)
            w_lo = f_lo * s_lo
            w_hi = f_hi * s_hi
            x_lo = tl.load(x_ptr + x_row[:, None] + k_lo[None, :] * stride_xk,
                           mask=row_mask[:, None] & lo_ok[None, :], other=0.0).to(tl.float32)
            x_hi = tl.load(x_ptr + x_row[:, None] + k_hi[None, :] * stride_xk,
                           mask=row_mask[:, None] & hi_ok[None, :], other=0.0).to(tl.float32)
            # "ieee": true float32 products (the default would round inputs to TF32 on a GPU).
            acc = tl.dot(x_lo, w_lo, acc, input_precision="ieee")
            acc = tl.dot(x_hi, w_hi, acc, input_precision="ieee")
        y_off = rows.to(tl.int64)[:, None] * stride_ym + cols.to(tl.int64)[None, :] * stride_yn
        tl.store(y_ptr + y_off, acc, mask=row_mask[:, None] & col_mask[None, :])
else:
    _w4a16_kernel = None

#: Whether ``@triton.jit`` built the kernel for the interpreter (TRITON_INTERPRET at this module's import).
KERNEL_INTERPRETED = kernel_interpreted(_w4a16_kernel)


def _dtype_error(name: str, tensor: torch.Tensor, allowed) -> ArgumentTypeError:
    names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
    return ArgumentTypeError(f"{name}.dtype must be one of {names}, got {tensor.dtype}")


def _unpack_arguments(packed, scales, group_size, zeros):
    """(packed, scales, group_size, zeros, perm, in_features) from raw tensors or a PackedInt4."""
    if isinstance(packed, PackedInt4):
        if scales is not None or group_size is not None or zeros is not None:
            raise ValueError("pass either a PackedInt4 alone or the raw tensors (packed, scales, group_size, "
                             "zeros), not both")
        return packed.packed, packed.scales, packed.group_size, packed.zeros, packed.perm, packed.in_features
    if scales is None or group_size is None:
        raise ValueError("scales and group_size are required when packed is a tensor (or pass a PackedInt4)")
    return packed, scales, group_size, zeros, None, None


def check_w4a16_inputs(x, packed, scales, group_size, zeros, in_features=None) -> tuple[int, int, int]:
    """Validate the raw arguments of :func:`reference_w4a16` (its Raises); return (M, N, K)."""
    instance("x", x, torch.Tensor)
    instance("packed", packed, torch.Tensor)
    instance("scales", scales, torch.Tensor)
    if zeros is not None:
        instance("zeros", zeros, torch.Tensor)
    g = positive_integer("group_size", group_size)
    if x.dim() != 2:
        raise ValueError(f"x must have rank 2 (M, K), got shape {tuple(x.shape)}")
    if x.dtype not in X_DTYPES:
        raise _dtype_error("x", x, X_DTYPES)
    M, K = x.shape
    if in_features is not None and K != in_features:
        raise ValueError(f"x has K={K} columns but the PackedInt4 has in_features={in_features}")
    if packed.dim() != 2:
        raise ValueError(f"packed must have rank 2 (N, ceil(K/2)), got shape {tuple(packed.shape)}")
    if packed.dtype != torch.uint8:
        raise ArgumentTypeError(f"packed.dtype must be uint8 (two int4 codes per byte), got {packed.dtype}")
    N = packed.shape[0]
    if packed.shape[1] != (K + 1) // 2:
        raise ValueError(f"packed has {packed.shape[1]} bytes per row but x has K={K} columns; expected "
                         f"ceil(K/2) = {(K + 1) // 2} (shape ({N}, {(K + 1) // 2}))")
    if K % g != 0:
        raise ValueError(f"group_size={g} does not divide K={K}; groups must tile the input dimension exactly")
    n_groups = K // g
    for name, t, allowed in (("scales", scales, SCALE_DTYPES), ("zeros", zeros, ZERO_DTYPES)):
        if t is None:
            continue
        if tuple(t.shape) != (N, n_groups):
            raise ValueError(f"{name} must have shape (N, K // group_size) = ({N}, {n_groups}), "
                             f"got {tuple(t.shape)}")
        if t.dtype not in allowed:
            raise _dtype_error(name, t, allowed)
    for name, t in (("packed", packed), ("scales", scales), ("zeros", zeros)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; expected the same device")
    if zeros is not None:
        check_int4_zero_points("zeros", zeros)
    return M, N, K


def _check_perm(x, perm):
    if perm is not None and perm.device != x.device:
        raise ValueError(f"the PackedInt4's perm is on {perm.device} but x is on {x.device}; expected the same device")


def reference_w4a16(
    x: torch.Tensor,
    packed,
    scales: torch.Tensor | None = None,
    group_size: int | None = None,
    zeros: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = x @ W_hat^T in plain PyTorch, unpacking with ``course_lib.quant.packing.unpack_int4``.

    The specification the Triton kernel is tested against: the weights are dequantised in full,
    ``W_hat = (q - z) * s`` in float32 (``docs/quantization.md#int4-packing``), then multiplied.

    Args:
        x: (M, K) float32, float16 or bfloat16 activations, any strides.
        packed: (N, ceil(K/2)) uint8, the "pairs" nibble layout (element 2j low, 2j+1 high);
            or a ``PackedInt4`` (then scales, group_size and zeros must be omitted; its column
            permutation, if any, is applied to x).
        scales: (N, K // group_size) float16 or float32.
        group_size: int >= 1 dividing K.
        zeros: None (codes are signed, -8..7) or (N, K // group_size) float16, float32 or uint8
            zero points, whole numbers in 0..15 (codes are unsigned, 0..15).

    Returns:
        y: (M, N) float32 on x's device.

    Raises:
        TypeError (``ArgumentTypeError``, also a ValueError): an argument that is not a tensor,
            or a tensor of the wrong dtype.
        ValueError: wrong ranks or shapes, a group size that does not divide K, tensors on
            different devices, a PackedInt4 mixed with raw tensors, a zero point that is not a whole
            number in 0..15 (``quant.packing.check_int4_zero_points``).
    """
    packed, scales, group_size, zeros, perm, in_features = _unpack_arguments(packed, scales, group_size, zeros)
    M, N, K = check_w4a16_inputs(x, packed, scales, group_size, zeros, in_features)
    _check_perm(x, perm)
    if perm is not None:
        x = x[:, perm]  # stored column j holds W column perm[j]
    if K == 0:  # unpack_int4 needs at least one code per row; an empty sum is 0
        return torch.zeros(M, N, dtype=torch.float32, device=x.device)
    q = unpack_int4(packed, K, signed=zeros is None).to(torch.float32)
    if zeros is not None:
        q = q - zeros.to(torch.float32).repeat_interleave(group_size, dim=1)
    w_hat = q * scales.to(torch.float32).repeat_interleave(group_size, dim=1)
    return x.to(torch.float32) @ w_hat.T


def w4a16_matmul(
    x: torch.Tensor,
    packed,
    scales: torch.Tensor | None = None,
    group_size: int | None = None,
    zeros: torch.Tensor | None = None,
    *,
    block_m: int = DEFAULT_BLOCK_M,
    block_n: int = DEFAULT_BLOCK_N,
    block_k: int = DEFAULT_BLOCK_K,
    num_warps: int | None = None,
) -> torch.Tensor:
    """y = x @ W_hat^T with the Triton kernel, dequantising in registers; same contract as :func:`reference_w4a16`.

    Args:
        x, packed, scales, group_size, zeros: as :func:`reference_w4a16` (a ``PackedInt4`` works too).
        block_m: rows of x per program (power of two >= 16).
        block_n: rows of W (columns of y) per program (power of two >= 16).
        block_k: input columns per loop step (power of two >= 32; block_k / 2 bytes per row).
        num_warps: passed to the launch on a GPU (Triton's default when None).

    Returns:
        y: (M, N) float32 on x's device.

    Dispatch (see :func:`course_lib.kernels.triton_mode`): the kernel runs compiled on CUDA
    tensors in ``"native"`` mode and interpreted on CPU tensors in ``"interpreter"`` mode; in
    every other case (no triton, no GPU, CPU tensors without the interpreter) the result comes
    from :func:`reference_w4a16` and a one-line notice is printed once.

    Raises:
        TypeError / ValueError: as :func:`reference_w4a16`; ValueError for a block that is not a
        power of two or is below its minimum (``tl.dot`` tiles are at least 16 wide), or two blocks
        whose tile exceeds ``MAX_TILE_ELEMENTS``.
    """
    packed, scales, group_size, zeros, perm, in_features = _unpack_arguments(packed, scales, group_size, zeros)
    M, N, K = check_w4a16_inputs(x, packed, scales, group_size, zeros, in_features)
    _check_perm(x, perm)
    blocks = {}
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        value = power_of_two(name, value, note="tl.arange needs one")
        if value < MIN_BLOCK[name]:
            raise ValueError(f"{name} must be at least {MIN_BLOCK[name]} (tl.dot tiles are at least 16 wide), "
                             f"got {value}")
        blocks[name] = value
    check_tile("w4a16_matmul", block_m=blocks["block_m"], block_k=blocks["block_k"])
    check_tile("w4a16_matmul", block_k=blocks["block_k"], block_n=blocks["block_n"])
    check_tile("w4a16_matmul", block_m=blocks["block_m"], block_n=blocks["block_n"])

    fallback = fallback_notice("course_lib.kernels.w4a16", "w4a16", _w4a16_kernel, triton_mode(), x)
    if fallback is not None:
        notice_once(*fallback)
        return reference_w4a16(x[:, perm] if perm is not None else x, packed, scales, group_size, zeros)

    if perm is not None:
        x = x[:, perm]  # stored column j holds W column perm[j]
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    z = zeros if zeros is not None else scales  # a valid pointer; never read when HAS_ZEROS is False
    grid = (triton.cdiv(M, blocks["block_m"]), triton.cdiv(N, blocks["block_n"]))
    kwargs = {} if num_warps is None or KERNEL_INTERPRETED else {"num_warps": num_warps}
    _w4a16_kernel[grid](
        x, packed, scales, z, y,
        M, N, K, packed.shape[1], group_size,
        x.stride(0), x.stride(1),
        packed.stride(0), packed.stride(1),
        scales.stride(0), scales.stride(1),
        z.stride(0), z.stride(1),
        y.stride(0), y.stride(1),
        SIGNED=zeros is None, HAS_ZEROS=zeros is not None,
        BLOCK_M=blocks["block_m"], BLOCK_N=blocks["block_n"], BLOCK_B=blocks["block_k"] // 2,
        **kwargs,
    )
    return y
