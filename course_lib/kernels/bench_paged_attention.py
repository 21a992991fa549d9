"""Benchmark the Triton paged-attention decode kernel against the PyTorch path: achieved GB/s and fraction of peak.

Run: ``python -m course_lib.kernels.bench_paged_attention [--batches 1,8,32] [--contexts 1024,4096]
[--heads 9/3/64,32/8/128] [--block-size 16] [--dtype bfloat16] [--peak-gbps 4800]``.

On a CUDA device, for each head layout Hq/Hkv/D (SmolLM2-135M's 9/3/64, and 32/8/128 as in 8B-class
models), each batch size B and each context length L (every sequence of the batch holds L positions):
build a block pool of exactly B * ceil(L / block_size) blocks, hand them to the sequences in a random
order (the physical blocks of a sequence are neither consecutive nor sorted, as after the pool has
churned), check ``paged_decode_kernel_unchecked`` against ``reference_paged_decode_attention`` (a
shape that disagrees is reported and not timed), then time the kernel and the PyTorch path
(``paged_decode_attention_unchecked``: gather the blocks, then PyTorch's fused attention) with
warm-up and the median of repeats timed with CUDA events (``timing.median_ms``), and report

    achieved GB/s = bytes / median time
    bytes = 2 * B * L * Hkv * D * e (K and V, read once) + 2 * B * Hq * D * e (q in, output out)

(``paged_attention.decode_attention_bytes``; a *measurement*) and its fraction of the device's peak
memory bandwidth (a vendor *bound*, ``bench_gemv.peak_gbps_for`` by device name, or ``--peak-gbps``).
Decode attention's arithmetic intensity is 2 (Hq / Hkv) / e FLOP/byte (3 for SmolLM2 in bfloat16),
far below any GPU's ridge point, so bandwidth is the roof that applies (``paged_attention`` module
docstring). Both calls are timed as an engine's decode step makes them, without argument checks
(which read ``context_lens`` back to the host); the PyTorch path's bytes are the same minimum,
although its gather copies K and V once more.

Without a CUDA device it says that nothing is measured (the kernel is checked for correctness only,
by tests/test_kernels_paged_attention.py under TRITON_INTERPRET=1) and exits 0.
"""
from __future__ import annotations

import argparse
import sys

import torch

DEFAULT_BATCHES = (1, 8, 32)
DEFAULT_CONTEXTS = (1024, 4096)
#: (Hq, Hkv, D): SmolLM2-135M's layout, and a 32 / 8 / 128 one (Llama-3-8B's attention).
DEFAULT_HEADS = ((9, 3, 64), (32, 8, 128))
DEFAULT_BLOCK_SIZE = 16


def paged_case(B: int, context: int, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int = DEFAULT_BLOCK_SIZE,
               dtype: torch.dtype = torch.bfloat16, device: str = "cuda", seed: int = 0):
    """Random inputs of one decode step: (q, k_cache, v_cache, block_tables, context_lens).

    q (B, Hq, D) and the caches (B * ceil(context / block_size), block_size, Hkv, D) in ``dtype``;
    block_tables (B, ceil(context / block_size)) int32, a random permutation of the pool's blocks;
    context_lens (B,) int64, all ``context``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    width = -(-context // block_size)
    num_blocks = B * width
    k_cache = torch.randn(num_blocks, block_size, n_kv_heads, head_dim, device=device, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, n_kv_heads, head_dim, device=device, generator=gen).to(dtype)
    q = torch.randn(B, n_heads, head_dim, device=device, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, device=device, generator=gen).view(B, width).to(torch.int32)
    lens = torch.full((B,), context, dtype=torch.int64, device=device)
    return q, k_cache, v_cache, tables, lens


def measure_paged_attention(batches=DEFAULT_BATCHES, contexts=DEFAULT_CONTEXTS, heads=DEFAULT_HEADS, *,
                            block_size: int = DEFAULT_BLOCK_SIZE, dtype: torch.dtype = torch.bfloat16,
                            block_n: int | None = None, num_splits: int | None = None,
                            num_warps: int | None = None, warmup: int = 10, repeats: int = 50,
                            device: str = "cuda", timer=None):
    """Time the Triton kernel and the PyTorch path at each (heads, B, context).

    Args:
        batches, contexts: batch sizes B and context lengths L; heads: (Hq, Hkv, D) triples.
        block_size: positions per KV block (the engine's 16). dtype: float32, bfloat16 or float16.
        block_n, num_splits, num_warps: the kernel's launch options (its defaults when None).
        warmup, repeats: passed to ``timing.median_ms``.
        device: where the tensors live ("cuda" for a measurement).
        timer: ``timer(fn) -> milliseconds``; default ``median_ms(fn, warmup, repeats)`` (CUDA events).
            Tests pass a stand-in to check the plumbing on a CPU; its numbers are not measurements.

    Yields:
        One dict per row with keys kernel ("paged_attention"), impl ("triton" or "torch"), shape
        ("B=8 L=1024 9/3/64 bs16"), B, context, Hq, Hkv, D, dtype (name), ms, bytes
        (``decode_attention_bytes``), flops (``decode_attention_flops``), err (the kernel's max relative
        error against the reference) and note: None for a timed row; for a kernel that disagrees with
        the reference (relative error above 1e-5 for float32, 2e-2 otherwise), one row with the reason
        in note and ms None (not timed).
    """
    from . import triton_mode
    from .timing import median_ms
    from .paged_attention import (
        KERNEL_INTERPRETED,
        decode_attention_bytes,
        decode_attention_flops,
        paged_decode_attention,
        paged_decode_attention_unchecked,
        paged_decode_kernel_unchecked,
        reference_paged_decode_attention,
    )

    if timer is None:
        def timer(fn):
            return median_ms(fn, warmup, repeats)
    options = dict(block_n=block_n, num_splits=num_splits, num_warps=num_warps)
    compiled = triton_mode() == "native" and not KERNEL_INTERPRETED and device == "cuda"

    def kernel(args, context):
        if compiled:
            return paged_decode_kernel_unchecked(*args, context, **options)
        return paged_decode_attention(*args, **options)  # off a GPU (tests): interpreter or reference
    name = str(dtype).removeprefix("torch.")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for Hq, Hkv, D in heads:
        for context in contexts:
            for B in batches:
                base = dict(kernel="paged_attention", shape=f"B={B} L={context} {Hq}/{Hkv}/{D} bs{block_size}", B=B,
                            context=context, Hq=Hq, Hkv=Hkv, D=D, dtype=name)
                args = paged_case(B, context, Hq, Hkv, D, block_size, dtype, device)
                out = kernel(args, context)
                ref = reference_paged_decode_attention(*args)
                err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
                if not err <= tol:
                    yield dict(base, impl="triton", ms=None, bytes=None, flops=None, err=err,
                               note=f"MISMATCH: max rel err vs reference {err:.1e}; not timed")
                    continue
                nbytes = decode_attention_bytes([context] * B, Hq, Hkv, D, args[0].element_size())
                flops = decode_attention_flops([context] * B, Hq, D)
                impls = {
                    "triton": lambda: kernel(args, context),
                    "torch": lambda: paged_decode_attention_unchecked(*args, context),
                }
                for impl, fn in impls.items():
                    yield dict(base, impl=impl, ms=timer(fn), bytes=nbytes, flops=flops,
                               err=err if impl == "triton" else None, note=None)
                del args, out, ref


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",")]


def parse_heads(text: str) -> list[tuple[int, int, int]]:
    """"9/3/64,32/8/128" -> [(9, 3, 64), (32, 8, 128)]: the --heads option (Hq/Hkv/D)."""
    heads = []
    for item in text.split(","):
        hq, hkv, d = (int(t) for t in item.split("/"))
        heads.append((hq, hkv, d))
    return heads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="batch sizes B")
    parser.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)), help="context lengths L")
    parser.add_argument("--heads", default=",".join("/".join(map(str, h)) for h in DEFAULT_HEADS),
                        help="head layouts Hq/Hkv/D, comma-separated")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="device peak memory bandwidth in GB/s (default: bench_gemv's vendor table by device name)")
    parser.add_argument("--block-n", type=int, default=None)
    parser.add_argument("--num-splits", type=int, default=None)
    parser.add_argument("--num-warps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)

    from . import triton_mode
    from .bench_gemv import peak_gbps_for
    from .paged_attention import KERNEL_INTERPRETED

    mode = triton_mode()
    if mode != "native" or KERNEL_INTERPRETED:
        print(f"No native Triton on a CUDA device here ({mode}: {mode.reason}).")
        print("Nothing is measured: the paged-attention kernel is checked for correctness only "
              "(tests/test_kernels_paged_attention.py under TRITON_INTERPRET=1).")
        return 0

    name = torch.cuda.get_device_name(0)
    peak = args.peak_gbps if args.peak_gbps is not None else peak_gbps_for(name)
    print(f"device: {name}; peak bandwidth (vendor bound): "
          + (f"{peak:.0f} GB/s" if peak else "unknown (pass --peak-gbps)"))
    print(f"paged decode attention, {args.dtype}, block size {args.block_size}, random block order; kernel options "
          f"block_n={args.block_n}, num_splits={args.num_splits}, num_warps={args.num_warps} (None: defaults); "
          f"median of {args.repeats} after {args.warmup} warm-up; GB/s are measurements")
    header = f"{'shape':>28} {'impl':>7} {'us':>9} {'GB/s':>8} {'of peak':>8}"
    print(header)
    print("-" * len(header))
    rows = measure_paged_attention(_ints(args.batches), _ints(args.contexts), parse_heads(args.heads),
                                   block_size=args.block_size, dtype=getattr(torch, args.dtype),
                                   block_n=args.block_n, num_splits=args.num_splits, num_warps=args.num_warps,
                                   warmup=args.warmup, repeats=args.repeats)
    for row in rows:
        if row["note"] is not None:
            print(f"{row['shape']:>28}  {row['note']}")
            continue
        gbps = row["bytes"] / (row["ms"] * 1e-3) / 1e9
        frac = f"{gbps / peak:8.1%}" if peak else f"{'n/a':>8}"
        print(f"{row['shape']:>28} {row['impl']:>7} {row['ms'] * 1e3:9.1f} {gbps:8.0f} {frac}"
              + (f"   (max rel err vs reference {row['err']:.1e})" if row["impl"] == "triton" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
