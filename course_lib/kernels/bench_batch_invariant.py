"""Benchmark the batch-invariant Triton matmul against torch.matmul (cuBLAS) at SmolLM2-135M decode shapes.

Run: ``python -m course_lib.kernels.bench_batch_invariant [--m 1,8,16] [--dtype bfloat16]
[--shapes 576x576,1536x576,576x1536,49152x576] [--interpret-check]``.

On a CUDA device, for each weight shape N x K (out_features x in_features: SmolLM2-135M's q/o
projections 576x576, gate/up 1536x576, down 576x1536 and the tied LM head 49152x576) and each
number of decode rows M: check ``batch_invariant.triton_ops.matmul`` against ``reference_matmul``
(a shape that disagrees is reported and not timed), check bitwise whether the last row of the
M-row product equals that row computed alone (for the Triton kernel and for cuBLAS), then time
``matmul(x, w)`` and ``torch.matmul(x, w.T)`` (warm-up, then the median of repeats timed with CUDA
events, ``timing.median_ms``) and report

    TFLOP/s = 2*M*N*K / median time
    GB/s    = bytes / median time, bytes = weight N*K*b + x M*K*b + y M*N*(4 for Triton's float32
              output, b for cuBLAS, which returns the input dtype)

(*measurements*, of the call as a caller makes it: Python-side checks and the launch are inside
the timed region, and at M = 1 they can be a large share), the fraction of the device's peak
memory bandwidth (a vendor *bound*, from ``course_lib.hardware.DEVICES`` by device name) and the
time ratio t_triton / t_cublas (above 1: the fixed-order kernel is slower). At decode sizes the
product is memory-bound, so GB/s is the figure that matters; the price of batch invariance is that
the kernel may not split K or retune its tiles for small M (``triton_ops`` module docstring).

Without a CUDA device it prints that the GPU benchmark was not run and why, measures nothing and
exits 0. ``--interpret-check`` also runs one tiny shape through Triton's interpreter on the CPU
(in a child process with TRITON_INTERPRET=1) and checks correctness and bitwise invariance there;
interpreter timings are not speed measurements, so none are printed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

from . import triton_import_error

DEFAULT_SHAPES = "576x576,1536x576,576x1536,49152x576"


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _run_interpret_check() -> int:
    """Tiny shapes through the interpreted kernels (this process must have TRITON_INTERPRET=1 from
    the start). Returns 0 when every check passes, 1 otherwise."""
    from .batch_invariant import triton_ops as t

    if not t.KERNEL_INTERPRETED:
        print("interpreter check not run: the kernels were not built by Triton's interpreter in this process")
        return 1
    ok = True
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        N, K, D = 40, 100, 300
        w = torch.randn(N, K, generator=g).to(dtype)
        v = torch.randn(1, K, generator=g).to(dtype)
        gamma = torch.randn(D, generator=g)
        r = torch.randn(1, D, generator=g).to(dtype)
        alone, r_alone = t.matmul(v, w)[0], t.rms_norm(r, gamma, 1e-5)[0]
        err = _rel_err(alone[None], t.reference_matmul(v, w))
        r_err = _rel_err(r_alone[None].float(), t.reference_rms_norm(r, gamma, 1e-5).float())
        same = r_same = True
        for M in (1, 2, 3, 4):
            for pos in range(M):
                x = torch.randn(M, K, generator=g).to(dtype)
                x[pos] = v[0]
                same &= torch.equal(t.matmul(x, w)[pos], alone)
                xr = torch.randn(M, D, generator=g).to(dtype)
                xr[pos] = r[0]
                r_same &= torch.equal(t.rms_norm(xr, gamma, 1e-5)[pos], r_alone)
        tol = 1e-5
        name = str(dtype).removeprefix("torch.")
        print(f"interpreter check {name}: matmul (M<=4, N={N}, K={K}) max rel err {err:.1e}, "
              f"row bitwise equal at every position: {'yes' if same else 'NO'}; rms_norm (D={D}) "
              f"max rel err {r_err:.1e}, bitwise: {'yes' if r_same else 'NO'}")
        ok &= same and r_same and err <= tol and r_err <= (tol if dtype == torch.float32 else 2 ** -7)
    print("interpreter check: " + ("passed" if ok else "FAILED") + " (correctness only; not a speed measurement)")
    return 0 if ok else 1


def _interpret_check_in_child() -> int:
    error = triton_import_error()
    if error is not None:
        print(f"interpreter check not run: triton does not import here ({error})")
        return 0
    # TRITON_INTERPRET must be set before the kernels are defined, so the check runs in a fresh
    # process; course_lib's parent folder goes on its path in case course_lib is not installed.
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-m", "course_lib.kernels.bench_batch_invariant",
                           "--interpret-check", "--skip-gpu"],
                          env=env, capture_output=True, text=True, timeout=600)
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    return proc.returncode


def measure_batch_invariant(shapes, ms=(1, 8, 16), *, dtype: torch.dtype = torch.bfloat16, warmup: int = 10,
                            repeats: int = 100, device: str = "cuda", timer=None):
    """Time the batch-invariant ``matmul(x, w)`` and ``torch.matmul(x, w.T)`` for each weight shape (N, K)
    and row count M, after checking the kernel against ``reference_matmul`` and both for batch invariance.

    Args:
        shapes: (N, K) pairs (out_features x in_features); ms: row counts M.
        dtype: torch.bfloat16 or torch.float32 inputs.
        warmup, repeats: passed to ``timing.median_ms``.
        device: where the tensors live ("cuda" for a measurement).
        timer: ``timer(fn) -> milliseconds``; default ``median_ms(fn, warmup, repeats)`` (CUDA events).
            Tests pass a stand-in to check the plumbing on a CPU; its numbers are not measurements.

    Yields:
        One dict per row with keys kernel ("batch_invariant_matmul"), impl ("triton" or "cublas"), shape
        ("NxK"), N, K, M, dtype (name), ms, flops (2*M*N*K), bytes (the module docstring's formula), err
        (the kernel's max relative error against ``reference_matmul``), invariant (the last row of the
        M-row product bitwise equal to that row alone), ratio (t_triton / t_cublas, on the triton row)
        and note: None for a timed row; for a kernel that disagrees with the reference, one row with
        the reason in note and ms None (not timed).
    """
    from .batch_invariant import triton_ops as t
    from .timing import median_ms

    if timer is None:
        def timer(fn):
            return median_ms(fn, warmup, repeats)
    b = torch.tensor([], dtype=dtype).element_size()
    name = str(dtype).removeprefix("torch.")
    for N, K in shapes:
        gen = torch.Generator(device=device).manual_seed(0)
        w = torch.randn(N, K, device=device, generator=gen).to(dtype)
        for M in ms:
            base = dict(kernel="batch_invariant_matmul", shape=f"{N}x{K}", N=N, K=K, M=M, dtype=name)
            x = torch.randn(M, K, device=device, generator=gen).to(dtype)
            y = t.matmul(x, w)
            err = _rel_err(y, t.reference_matmul(x, w))
            tol = 1e-4 if dtype == torch.float32 else 1e-3
            if not err <= tol:
                yield dict(base, impl="triton", ms=None, flops=None, bytes=None, err=err, invariant=None,
                           ratio=None, note=f"MISMATCH: max rel err vs reference {err:.1e}; not timed")
                continue
            invariant = {
                "triton": torch.equal(y[-1], t.matmul(x[-1:], w)[0]),
                "cublas": torch.equal(torch.matmul(x, w.T)[-1], torch.matmul(x[-1:], w.T)[0]),
            }
            impls = {
                "triton": (lambda: t.matmul(x, w), N * K * b + M * K * b + M * N * 4),
                "cublas": (lambda: torch.matmul(x, w.T), N * K * b + M * K * b + M * N * b),
            }
            times = {impl: timer(fn) for impl, (fn, _) in impls.items()}
            for impl, (_, nbytes) in impls.items():
                yield dict(base, impl=impl, ms=times[impl], flops=2 * M * N * K, bytes=nbytes,
                           err=err if impl == "triton" else None, invariant=invariant[impl],
                           ratio=times["triton"] / times["cublas"] if impl == "triton" else None, note=None)
            del x, y
        del w


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES,
                        help="weight shapes NxK (out_features x in_features), comma-separated")
    parser.add_argument("--m", default="1,8,16", help="decode rows M (tokens in the batch), comma-separated")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="device peak memory bandwidth in GB/s (default: course_lib.hardware by device name)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--interpret-check", action="store_true",
                        help="also run one tiny shape in Triton's interpreter on the CPU (correctness only)")
    parser.add_argument("--skip-gpu", action="store_true", help="do not run (or report on) the GPU benchmark")
    args = parser.parse_args(argv)

    from . import triton_mode
    from .batch_invariant import triton_ops as t

    rc = 0
    if args.interpret_check:
        rc = _run_interpret_check() if t.KERNEL_INTERPRETED else _interpret_check_in_child()
    if args.skip_gpu:
        return rc

    mode = triton_mode()
    if mode != "native" or t.KERNEL_INTERPRETED:
        why = (f"{mode}: {mode.reason}" if mode != "native"
               else "the kernels were built by Triton's interpreter (TRITON_INTERPRET=1 at import)")
        print(f"The GPU benchmark was not run: it needs native Triton on a CUDA device ({why}).")
        print("Nothing was timed. The kernels are checked for correctness and bitwise batch invariance by "
              "tests/test_kernels_batch_invariant.py under TRITON_INTERPRET=1 (or --interpret-check).")
        return rc

    from .bench_w4a16 import parse_pairs, peak_bandwidth

    name = torch.cuda.get_device_name(0)
    peak, peak_source = peak_bandwidth(name, args.peak_gbps)
    print(f"device: {name}; peak bandwidth (vendor bound): "
          + (f"{peak:.0f} GB/s ({peak_source})" if peak else "unknown (pass --peak-gbps)"))
    print(f"batch-invariant matmul, {args.dtype} inputs, float32 accumulation; fixed tile BLOCK_M={t.BLOCK_M}, "
          f"BLOCK_N={t.BLOCK_N}, BLOCK_K={t.BLOCK_K}, num_warps={t.NUM_WARPS}; median of {args.repeats} after "
          f"{args.warmup} warm-up; TFLOP/s and GB/s are measurements")
    print("'invariant': the last row of the M-row product equals that row computed alone, bit for bit")
    header = (f"{'N x K':>12} {'M':>4} {'impl':>7} {'us':>9} {'TFLOP/s':>8} {'GB/s':>8} {'of peak':>8} "
              f"{'t_tri/t_cub':>11} {'invariant':>9}")
    print(header)
    print("-" * len(header))
    rows = measure_batch_invariant(parse_pairs(args.shapes), [int(m) for m in args.m.split(",")],
                                   dtype=getattr(torch, args.dtype), warmup=args.warmup, repeats=args.repeats)
    for row in rows:
        if row["note"] is not None:
            print(f"{row['shape']:>12} {row['M']:>4}  {row['note']}")
            continue
        s = row["ms"] * 1e-3
        tflops = row["flops"] / s / 1e12
        gbps = row["bytes"] / s / 1e9
        frac = f"{gbps / peak:8.1%}" if peak else f"{'n/a':>8}"
        ratio = f"{row['ratio']:11.2f}" if row["impl"] == "triton" else f"{'':>11}"
        print(f"{row['shape']:>12} {row['M']:>4} {row['impl']:>7} {s * 1e6:9.1f} {tflops:8.3f} {gbps:8.0f} {frac} "
              f"{ratio} {'yes' if row['invariant'] else 'no':>9}"
              + (f"   (max rel err vs reference {row['err']:.1e})" if row["impl"] == "triton" else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
