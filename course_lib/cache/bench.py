"""The tiered-cache inequality measured on this machine: recompute a prefix, or load its saved K/V?

Run: ``python -m course_lib.cache.bench [--lengths 256,1024,2048] [--repeats 3] [--folder DIR]``.

For each prefix length L, on SmolLM2-135M (float32, this CPU), in one run:

1. **Recompute**: the prefill of L positions into a fresh ``KVCache`` (median of ``--repeats`` after one
   warm-up): the prefill rate T = L / time.
2. **Load from memory**: copy the prefix's K and V (every layer, S_kv * L bytes) into a second buffer,
   as a host tier returns them: B = bytes / time.
3. **Load from a file**: read the same bytes back from a file written in ``--folder`` after asking the
   kernel to drop the file's cached pages (``os.posix_fadvise(..., POSIX_FADV_DONTNEED)`` after an
   ``fsync``), so the read comes from the storage device where the kernel honours it (a virtual disk may
   still be cached by its host: the figure is what this machine gave).

The loaded K/V are checked to serve: the next-token logits computed on top of them equal those of the
full prefill within float32 rounding. Each row sets the inequality's prediction (``tiers.load_beats_
recompute``: T * S_kv < B, with B measured) beside what the clocks said (load time < recompute time).
The inequality leaves out the fixed costs of a call (a small L pays them) and that T falls as L grows
(attention): where the two disagree, those are why. Every figure is a measurement of this run.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ..models.bench import count_argument
from ..timing import load_note, measure
from .tiers import break_even_bandwidth, load_beats_recompute

__all__ = ["measure_tiers", "main"]


def _read_cold(path: Path, nbytes: int) -> np.ndarray:
    """The file's bytes, after asking the kernel to drop its cached pages (where it can)."""
    with open(path, "rb") as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        data = np.fromfile(f, dtype=np.uint8, count=nbytes)
    return data


def measure_tiers(model, lengths=(256, 1024, 2048), repeats: int = 3, folder: str | os.PathLike | None = None,
                  seed: int = 0) -> list[dict]:
    """One row per prefix length (module docstring): ``length``, ``kv_bytes`` (S_kv * L), ``recompute_s``,
    ``prefill_rate`` (positions/s), ``memory_s``, ``memory_gbps``, ``file_s``, ``file_gbps``, the
    break-even bandwidth ``needed_gbps`` (T * S_kv), and per tier the prediction and the measured verdict
    (``memory_predicted``, ``memory_measured``, ``file_predicted``, ``file_measured``: True when loading
    wins), and ``max_abs_logit_diff`` of the logits computed on the loaded K/V against the full prefill's.

    Raises: ValueError for a length outside 2 .. the model's max_seq_len - 1; RuntimeError when the
        loaded K/V do not give the full prefill's logits (within 1e-3)."""
    rows = []
    g = torch.Generator().manual_seed(seed)
    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="kv-tier-"))
    for L in lengths:
        if not 2 <= L < model.config.max_seq_len:
            raise ValueError(f"a prefix length must be in 2 .. {model.config.max_seq_len - 1}, got {L}")
        ids = torch.randint(0, model.config.vocab_size, (1, L), generator=g)

        def prefill():
            cache = model.new_cache(1, L)
            return model.prefill(ids, cache), cache

        recompute = measure(prefill, warmup=1, repeats=repeats)
        logits, cache = prefill()
        k, v = cache.k[:, :, :, :L].contiguous(), cache.v[:, :, :, :L].contiguous()
        nbytes = 2 * k.numel() * k.element_size()
        dst_k, dst_v = torch.empty_like(k), torch.empty_like(v)
        memory = measure(lambda: (dst_k.copy_(k), dst_v.copy_(v)), warmup=1, repeats=repeats)
        path = folder / f"kv-{L}.bin"
        with open(path, "wb") as f:
            f.write(k.numpy().tobytes())
            f.write(v.numpy().tobytes())
            f.flush()
            os.fsync(f.fileno())
        file_times = []
        for _ in range(repeats):
            start = time.perf_counter()
            data = _read_cold(path, nbytes)
            file_times.append(time.perf_counter() - start)
        half = nbytes // 2
        loaded_k = torch.from_numpy(data[:half].view(np.float32).reshape(k.shape).copy())
        loaded_v = torch.from_numpy(data[half:].view(np.float32).reshape(v.shape).copy())
        served = model.new_cache(1, L)
        served.k[:, :, :, :L - 1] = loaded_k[:, :, :, :L - 1]
        served.v[:, :, :, :L - 1] = loaded_v[:, :, :, :L - 1]
        served.length = L - 1
        last = model.prefill(ids[:, L - 1:], served)[0, -1]
        diff = float((last - logits[0, -1]).abs().max())
        if diff > 1e-3:
            raise RuntimeError(f"the K/V loaded from the file give logits {diff:.2e} away from the full prefill's")
        path.unlink()
        file_s = sorted(file_times)[len(file_times) // 2]
        rate = L / recompute.median_s
        per_position = nbytes / L
        rows.append({
            "length": L, "kv_bytes": nbytes, "recompute_s": recompute.median_s, "prefill_rate": rate,
            "memory_s": memory.median_s, "memory_gbps": nbytes / memory.median_s / 1e9,
            "file_s": file_s, "file_gbps": nbytes / file_s / 1e9,
            "needed_gbps": break_even_bandwidth(rate, per_position) / 1e9,
            "memory_predicted": load_beats_recompute(rate, per_position, nbytes / memory.median_s),
            "memory_measured": memory.median_s < recompute.median_s,
            "file_predicted": load_beats_recompute(rate, per_position, nbytes / file_s),
            "file_measured": file_s < recompute.median_s,
            "max_abs_logit_diff": diff})
    return rows


def _lengths(text: str) -> tuple[int, ...]:
    """``--lengths``: comma-separated prefix lengths >= 2. Raises: argparse.ArgumentTypeError."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated prefix lengths such as 256,1024, got {text!r}")
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"prefix lengths must be >= 2, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.cache.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=_lengths, default=(256, 1024, 2048), help="prefix lengths, e.g. 256,1024")
    parser.add_argument("--repeats", type=count_argument(1), default=3, help="timed calls per figure (median)")
    parser.add_argument("--folder", default=None, help="where the K/V file is written (default: a temporary folder)")
    args = parser.parse_args(argv)
    from ..data import load_smollm2

    model, _, _ = load_smollm2()
    print(f"SmolLM2-135M float32, {torch.get_num_threads()} threads, cpu; S_kv = "
          f"{model.config.kv_bytes_per_token(4):,} bytes per position; every figure measured in this run")
    print(f"{'L':>6} {'KV MB':>7} {'recompute s':>12} {'T pos/s':>8} {'T*S GB/s':>9} {'memory GB/s':>12} "
          f"{'load wins?':>11} {'file GB/s':>10} {'load wins?':>11}")
    for r in measure_tiers(model, args.lengths, args.repeats, args.folder):
        def verdict(tier: str) -> str:
            p, m = r[f"{tier}_predicted"], r[f"{tier}_measured"]
            return f"{'yes' if m else 'no'}{'' if p == m else ' (!)'}"
        print(f"{r['length']:>6} {r['kv_bytes'] / 1e6:>7.1f} {r['recompute_s']:>12.3f} {r['prefill_rate']:>8.0f} "
              f"{r['needed_gbps']:>9.3f} {r['memory_gbps']:>12.2f} {verdict('memory'):>11} {r['file_gbps']:>10.2f} "
              f"{verdict('file'):>11}")
    print("'load wins?' is what the clocks said; (!) marks a row where T * S_kv < B predicted otherwise.")
    print("\n" + load_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
