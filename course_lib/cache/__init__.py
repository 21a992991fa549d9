"""KV caches: contiguous (preallocated) and paged (block pool + block tables)."""
from .contiguous import KVCache
from .paged import BlockPool, BlockPoolExhaustedError, PagedKVCache, PagedSequence, compute_block_hash
from .radix import RadixCache, RadixMatch, RadixNode

__all__ = ["KVCache", "BlockPool", "BlockPoolExhaustedError", "PagedKVCache", "PagedSequence", "compute_block_hash",
           "RadixCache", "RadixMatch", "RadixNode"]
