"""When loading a saved KV prefix beats recomputing it: the tiered-cache inequality.

A prefix of ``L`` positions whose K/V were saved to a slower tier (host memory, an SSD, another machine)
can be brought back in two ways. Recomputing it is a prefill of ``L`` positions at ``T`` positions/s:
``L / T`` seconds. Loading it moves ``S_kv`` bytes per position over a link of ``B`` bytes/s:
``L * S_kv / B`` seconds. Both grow linearly in ``L``, so the comparison does not depend on it:

    loading wins  <=>  L * S_kv / B < L / T  <=>  T * S_kv < B.

``T * S_kv`` is the *break-even bandwidth*: the bytes per second a link must carry to keep up with the
prefill. A model with a small cache per position (grouped-query attention, a compressed latent cache
as in DeepSeek-V2's multi-head latent attention) or a slow prefill makes loading pay over slower links.
What the inequality leaves out: the prefill rate falls at long contexts (attention's cost grows with the
context, so loading gains there), a load can overlap the compute of other layers or requests, a link
rarely reaches its rated bandwidth, and the saved bytes must be found and fetched first (latency, not
bandwidth).

Sources: the comparison is the one LMCache-style systems make (CachedAttention: Gao et al., "Cost-Efficient
Large Language Model Serving for Multi-turn Conversations with CachedAttention", USENIX ATC 2024,
arXiv:2403.19708; CacheGen: Liu et al., SIGCOMM 2024, arXiv:2310.07240); 2 FLOPs per parameter per
position for a forward (Kaplan et al., "Scaling Laws for Neural Language Models", 2020); the link figures
are the rated bounds their ``source`` names. docs/kv_cache.md describes the course's use.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..validation import positive_number

__all__ = ["Link", "LINKS", "KVLayout", "KV_LAYOUTS_70B", "load_seconds", "recompute_seconds", "break_even_bandwidth", "load_beats_recompute",
           "prefill_rate_bound"]


@dataclass(frozen=True)
class Link:
    """A tier's link: ``bandwidth`` in bytes/s, a rated bound (what ``source`` says), not a measurement."""

    name: str
    bandwidth: float
    source: str


#: Rated bandwidths of the usual tiers below a GPU's memory, one direction (bounds, not measurements).
LINKS: tuple[Link, ...] = (
    Link("host memory over PCIe 4.0 x16", 32e9, "PCI-SIG PCIe 4.0: 16 GT/s per lane x 16 lanes, 128b/130b "
         "encoding: about 31.5 GB/s each way"),
    Link("host memory over PCIe 5.0 x16", 64e9, "PCI-SIG PCIe 5.0: 32 GT/s per lane x 16 lanes: about 63 GB/s "
         "each way"),
    Link("host DDR5-4800, 8 channels (a CPU reading its own memory)", 307.2e9, "JEDEC DDR5-4800: 4800 MT/s x 8 "
         "bytes per 64-bit channel = 38.4 GB/s per channel, x 8 channels"),
    Link("NVMe SSD on PCIe 4.0 x4", 7e9, "a PCIe 4.0 x4 NVMe drive's rated sequential read, about 7 GB/s (the "
         "link itself carries about 7.9 GB/s)"),
)


@dataclass(frozen=True)
class KVLayout:
    """What one position of a model's KV cache holds: ``bytes_per_position`` over every layer."""

    name: str
    bytes_per_position: int
    source: str


#: A 70B-class model (80 layers, 64 query heads of width 128, bf16) with three caches. Full attention keeps
#: K and V of all 64 heads; grouped-query attention of 8 KV heads (Llama 2/3 70B's layout); a compressed
#: latent cache as DeepSeek-V2's multi-head latent attention keeps per layer one 512-wide latent and one
#: 64-wide rotary key instead (DeepSeek-AI, "DeepSeek-V2", 2024, arXiv:2405.04434, section 2.1).
KV_LAYOUTS_70B: tuple[KVLayout, ...] = (
    KVLayout("full attention (64 KV heads)", 2 * 80 * 64 * 128 * 2, "2 (K and V) x 80 layers x 64 heads x 128 x 2 bytes"),
    KVLayout("grouped-query attention (8 KV heads)", 2 * 80 * 8 * 128 * 2,
             "2 (K and V) x 80 layers x 8 KV heads x 128 x 2 bytes (Ainslie et al., arXiv:2305.13245)"),
    KVLayout("latent cache (MLA-like, 512 + 64 per layer)", 80 * (512 + 64) * 2,
             "80 layers x (512 latent + 64 rotary key) x 2 bytes (arXiv:2405.04434)"),
)


def _positive(name: str, value) -> float:
    return float(positive_number(name, value))


def load_seconds(positions, kv_bytes_per_position, bandwidth) -> float:
    """Seconds to move POSITIONS positions of KV_BYTES_PER_POSITION bytes over BANDWIDTH bytes/s.

    Raises: ArgumentTypeError / ValueError for an argument that is not a positive number."""
    return _positive("positions", positions) * _positive("kv_bytes_per_position", kv_bytes_per_position) \
        / _positive("bandwidth", bandwidth)


def recompute_seconds(positions, prefill_rate) -> float:
    """Seconds to recompute POSITIONS positions at PREFILL_RATE positions/s.

    Raises: ArgumentTypeError / ValueError for an argument that is not a positive number."""
    return _positive("positions", positions) / _positive("prefill_rate", prefill_rate)


def break_even_bandwidth(prefill_rate, kv_bytes_per_position) -> float:
    """T * S_kv in bytes/s: the link bandwidth above which loading a saved prefix beats recomputing it.

    Raises: ArgumentTypeError / ValueError for an argument that is not a positive number."""
    return _positive("prefill_rate", prefill_rate) * _positive("kv_bytes_per_position", kv_bytes_per_position)


def load_beats_recompute(prefill_rate, kv_bytes_per_position, bandwidth) -> bool:
    """Whether loading is faster than recomputing, for any prefix length: T * S_kv < B (module docstring).

    Raises: ArgumentTypeError / ValueError for an argument that is not a positive number."""
    return break_even_bandwidth(prefill_rate, kv_bytes_per_position) < _positive("bandwidth", bandwidth)


def prefill_rate_bound(parameters, peak_flops, mfu=0.5) -> float:
    """Positions/s a compute-bound prefill reaches: MFU * peak FLOP/s / (2 FLOPs per parameter per
    position). Attention's own FLOPs are left out (a short context); at long contexts the rate is lower.

    Raises: ArgumentTypeError / ValueError for a parameter count or peak that is not a positive number, an
        MFU outside (0, 1]."""
    mfu = float(positive_number("mfu", mfu))
    if mfu > 1:
        raise ValueError(f"mfu must be a fraction in (0, 1], got {mfu!r}")
    return mfu * _positive("peak_flops", peak_flops) / (2 * _positive("parameters", parameters))
