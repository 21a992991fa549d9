"""The engine's block manager: Lab 2's block accounting for every layer at once.

The ``BlockAllocator`` of ``cache/paged.py`` keeps ids, ref counts, a free list and the chained
prefix hashes (Lab 2's ``BlockPool`` is that allocator with one layer's K/V storage); here it is
used alone, while the K/V of all layers live in the model runner's storage (``runner.py``),
indexed by the same block ids (nano-vllm splits ``BlockManager`` and the ``ModelRunner``'s cache
the same way). What the engine adds on top of Lab 2:

- ``admit``: a sequence joining the running set reuses the cached full blocks of its tokens
  (``BlockAllocator.acquire_prefix``), at most up to its next-to-last token, so its last position
  is always computed (the logits of the next token come from it);
- ``reserve``: before a forward, grow a sequence's block table for its chunk and return the flat
  slots (block_id * block_size + offset) its new K/V go to;
- ``commit``: after the forward, mark the positions filled and hash the blocks that became full;
- ``free``: drop a finished or preempted sequence's references;
- ``audit``: check the invariants (ref counts equal the table entries of live sequences, none
  negative, the free list holds exactly the blocks nobody references).

Blocks are shared only through prefix hits, which reuse full blocks, and full blocks are never
written again, so the engine never needs Lab 2's copy-on-write (``reserve`` refuses a shared
partial block, which would be a bug).

Two prefix caches (``prefix_cache``):

- ``"hash"``: the allocator's chained block hashes (vLLM's first design). A block is found only while
  some live sequence holds it: at ref count 0 it is freed and forgotten.
- ``"radix"``: a ``cache.radix.RadixCache`` (SGLang's). The tree holds one reference on every block it
  caches, so a finished request's full blocks stay cached (the next turn of a conversation finds them);
  each running sequence locks its cached path (``admit``, and again after each ``commit`` that fills a
  block, which the tree adopts); ``reserve`` evicts the least recently used unlocked leaves when the free
  list is short. A block is then referenced by the sequences' tables plus, once, by the tree.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from ..cache.paged import BlockAllocator, BlockPoolExhaustedError, PagedSequence
from ..cache.radix import RadixCache, RadixNode
from ..validation import instance, integer, nonnegative_integer, one_of, positive_integer
from .sequence import Sequence

__all__ = ["BlockManager", "PREFIX_CACHES"]

#: The prefix caches the engine can use (module docstring).
PREFIX_CACHES = ("hash", "radix")


class BlockManager:
    """Block ids, ref counts and the prefix index of the engine's paged cache.

    Args:
        num_blocks: physical blocks (int >= 1). block_size: positions per block (int >= 1).
        prefix_cache: ``"hash"`` or ``"radix"`` (module docstring).

    Attributes:
        allocator: the ``BlockAllocator`` doing the accounting (the K/V are in the model runner).
        radix: the ``RadixCache`` (None with the hash cache).
        prefix_hits: positions reused from the prefix cache so far (an int).
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_cache: str = "hash") -> None:
        num_blocks = positive_integer("num_blocks", num_blocks)
        block_size = positive_integer("block_size", block_size)
        prefix_cache = one_of("prefix_cache", prefix_cache, PREFIX_CACHES)
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.radix = RadixCache(block_size) if prefix_cache == "radix" else None
        self._locked: dict[int, RadixNode] = {}      # request id -> the radix node its path lock ends at
        self.prefix_hits = 0

    @property
    def block_size(self) -> int:
        return self.allocator.block_size

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def admit(self, seq: Sequence) -> int:
        """Give a waiting sequence its block table, reusing cached full blocks of its tokens up to its
        next-to-last one (incref'd). Returns the positions reused (a multiple of block_size, >= 0).

        Raises: ArgumentTypeError for a seq that is not a ``Sequence``."""
        seq = instance("seq", seq, Sequence)
        tokens = list(seq.token_ids[:seq.target - 1])
        if self.radix is None:
            reused = self.allocator.acquire_prefix(tokens)
        else:
            found = self.radix.match(tokens)
            reused = list(found.blocks)
            for block_id in reused:
                self.allocator.incref(block_id)
            self.radix.acquire(found.node)
            self._locked[seq.rid] = found.node
        length = len(reused) * self.block_size
        seq.paged = PagedSequence(block_table=reused, length=length, token_ids=tokens[:length])
        seq.reused += length
        self.prefix_hits += length
        return length

    def reserve(self, seq: Sequence, n_new: int) -> list[int]:
        """Allocate the blocks positions filled .. filled + n_new - 1 need; return their flat slots.

        Raises: BlockPoolExhaustedError when the allocator lacks blocks (nothing is allocated then; the
        scheduler's capacity rule keeps this from happening, see ``Scheduler``); ArgumentTypeError for a
        seq that is not a ``Sequence``, ValueError for n_new that is not an int >= 0."""
        seq = instance("seq", seq, Sequence)
        n_new = nonnegative_integer("n_new", n_new)
        paged, bs = seq.paged, self.block_size
        start = paged.length
        need = -(-(start + n_new) // bs) - len(paged.block_table)
        if start % bs and self.allocator.ref_counts[paged.block_table[-1]] > 1:
            raise RuntimeError(f"sequence {seq.rid} would write into shared block {paged.block_table[-1]}: "
                               "only full blocks are shared in the engine")
        evictable = self.radix.evictable_blocks if self.radix is not None else 0
        if need > self.allocator.num_free + evictable:
            raise BlockPoolExhaustedError(f"sequence {seq.rid} needs {need} more blocks for {n_new} positions; "
                                          f"{self.allocator.num_free} of {self.num_blocks} are free"
                                          + (f" and {evictable} cached ones can be evicted" if self.radix else ""))
        if need > self.allocator.num_free:
            self.evict(need - self.allocator.num_free)
        for _ in range(need):
            paged.block_table.append(self.allocator.allocate())
        table = paged.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, start + n_new)]

    def commit(self, seq: Sequence, n_new: int) -> None:
        """After the forward wrote them: positions filled .. filled + n_new - 1 are cached; every block
        that became full is registered under its chained hash (for later prefix hits).

        Raises (before changing anything): ArgumentTypeError for a seq that is not a ``Sequence``;
        ValueError for n_new that is not an int in 0 .. the positions ``reserve`` gave blocks for and
        the sequence has tokens for."""
        seq = instance("seq", seq, Sequence)
        paged, bs = seq.paged, self.block_size
        start = paged.length
        room = min(len(paged.block_table) * bs, len(seq.token_ids)) - start
        n_new = integer("n_new", n_new, minimum=0, maximum=max(room, 0),
                        note=f"sequence {seq.rid} has {len(paged.block_table)} blocks of {bs} for {start} cached "
                             f"positions and {len(seq.token_ids)} tokens: reserve the positions first")
        paged.token_ids.extend(seq.token_ids[start:start + n_new])
        paged.length = start + n_new
        if self.radix is not None:
            if paged.length // bs > start // bs:        # blocks became full: the tree adopts them, the lock moves down
                full = paged.length // bs
                for block_id in self.radix.insert(paged.token_ids[:full * bs], paged.block_table[:full]):
                    self.allocator.incref(block_id)     # the tree's reference
                node = self.radix.match(paged.token_ids[:full * bs]).node
                self.radix.acquire(node)
                self.radix.release(self._locked[seq.rid])
                self._locked[seq.rid] = node
            return
        for index in range(start // bs, paged.length // bs):
            prefix = self.allocator.block_hashes[paged.block_table[index - 1]] if index else None
            self.allocator.register_full_block(paged.block_table[index],
                                               paged.token_ids[index * bs:(index + 1) * bs], prefix)

    def evict(self, n_blocks: int) -> list[int]:
        """Radix cache: evict at least N_BLOCKS cached blocks no running sequence holds (least recently used
        leaves first) and return them to the free list; returns their ids. The hash cache keeps no unheld
        blocks: nothing to evict.

        Raises: ValueError for N_BLOCKS below 0 or above the evictable blocks (nothing changes)."""
        if self.radix is None:
            nonnegative_integer("n_blocks", n_blocks, maximum=0, note="the hash cache holds no unreferenced blocks")
            return []
        evicted = self.radix.evict(n_blocks)
        for block_id in evicted:
            self.allocator.decref(block_id)
        return evicted

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references (blocks at ref count 0 return to the free list).

        Raises: ValueError for a table entry that is already free (a double free); ArgumentTypeError for
        a seq that is not a ``Sequence``."""
        seq = instance("seq", seq, Sequence)
        for block_id in seq.paged.block_table:
            self.allocator.decref(block_id)
        if seq.rid in self._locked:
            self.radix.release(self._locked.pop(seq.rid))
        seq.paged = PagedSequence()

    def audit(self, live: Iterable[Sequence]) -> None:
        """Check the accounting against the live sequences' block tables (and the radix tree's blocks and
        locks, with that cache).

        Raises: RuntimeError naming the first broken invariant (a leak, a negative or wrong ref count,
        a block both free and referenced)."""
        live = list(live)
        uses = Counter(b for seq in live for b in seq.paged.block_table)
        if self.radix is not None:
            self.radix.check()
            uses.update(b for node in self.radix.nodes() for b in node.blocks)      # the tree's own reference
            if set(self._locked) != {seq.rid for seq in live}:
                raise RuntimeError(f"radix locks held for requests {sorted(self._locked)}, running: "
                                   f"{sorted(seq.rid for seq in live)}")
        blocks = self.allocator
        for block_id, count in enumerate(blocks.ref_counts):
            if count < 0 or count != uses.get(block_id, 0):
                raise RuntimeError(f"block {block_id}: ref count {count} but {uses.get(block_id, 0)} table entries"
                                   + (" and radix nodes" if self.radix is not None else ""))
        free = set(blocks.free_block_ids)
        if len(free) != len(blocks.free_block_ids) or free != {b for b, c in enumerate(blocks.ref_counts) if c == 0}:
            raise RuntimeError(f"free list {sorted(blocks.free_block_ids)} is not the set of unreferenced blocks")
