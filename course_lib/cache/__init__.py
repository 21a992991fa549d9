"""KV caches: contiguous (preallocated) and paged (block pool + block tables)."""
from .contiguous import KVCache

__all__ = ["KVCache"]
