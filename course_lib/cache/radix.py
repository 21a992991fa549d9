"""A radix prefix cache: the KV blocks of token prefixes kept in a tree, shared and evicted by leaf.

The hash-chain cache of ``cache/paged.py`` (vLLM's first design) finds a block by the hash of its whole
prefix and forgets it when the last sequence holding it ends. A radix tree (SGLang's RadixAttention:
Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs", NeurIPS 2024,
arXiv:2312.07104) keeps every cached prefix as a path from the root: each edge holds a run of token ids
and the ids of the physical blocks that hold their K/V. A request finds its longest cached prefix by
walking down from the root, holds the path while it runs (a *lock* count on every node of the path), and
when blocks run out the cache evicts the least recently used leaves nobody holds, bottom up. A finished
request's blocks stay cached until they are evicted, so the next turn of a conversation finds them.

Block granularity. The engine shares only full blocks (a partly filled block is still being written),
so every edge holds a whole number of blocks: its key is ``block_size * len(blocks)`` token ids, a match
is rounded down to whole blocks, and an edge is split only at a block boundary (as SGLang's paged tree
does). Children are keyed by the token ids of their first block.

Who owns what. The tree keeps block ids, never their storage or reference counts: :meth:`RadixCache.insert`
returns the ids it adopted (the caller takes a reference for the tree) and :meth:`RadixCache.evict` the
ids it dropped (the caller releases them). Nodes carry a lock count (how many running requests hold a
path through them) and a last-access tick (a counter, not a clock: runs are reproducible).

Invariants (``check``): every edge but the root's holds at least one block; a node's lock count is at
least the sum of its children's (a path locked through a child is locked through its parent); no block id
appears twice; the blocks recorded as cached are the tree's; ``evictable_blocks`` is the number of blocks
in unlocked nodes.

Source of the design: SGLang's ``RadixCache`` (``match_prefix`` with split, ``inc_lock_ref`` /
``dec_lock_ref`` along the path, ``evict`` by LRU leaf); docs/kv_cache.md describes the course's use.
"""
from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from ..validation import ArgumentTypeError, integer, nonnegative_integer, positive_integer, token_ids

__all__ = ["RadixNode", "RadixMatch", "RadixCache", "PLAIN_FIELDS"]

#: The fields of a node in the tree's plain-data form (:meth:`RadixCache.to_plain`).
PLAIN_FIELDS = ("key", "blocks", "lock", "last_access", "children")


@dataclass(eq=False)
class RadixNode:
    """One node: the edge from its parent (``key``: token ids, ``blocks``: the ids of the blocks holding
    them, ``len(key) == block_size * len(blocks)``), its children by their first block's token ids, its
    lock count and last-access tick. The root has an empty key."""

    key: tuple[int, ...] = ()
    blocks: list[int] = field(default_factory=list)
    parent: "RadixNode | None" = None
    children: dict[tuple[int, ...], "RadixNode"] = field(default_factory=dict)
    lock: int = 0
    last_access: int = 0

    def __repr__(self) -> str:
        return f"RadixNode(blocks={self.blocks}, lock={self.lock}, children={len(self.children)})"


@dataclass(frozen=True)
class RadixMatch:
    """What :meth:`RadixCache.match` found: the node the cached prefix ends at (the root for none), the
    ids of its blocks in order and the positions they hold (``len(blocks) * block_size``)."""

    node: RadixNode
    blocks: tuple[int, ...]
    length: int


class RadixCache:
    """A radix tree of cached, block-aligned token prefixes (module docstring).

    Args:
        block_size: positions per block (int >= 1).

    Attributes:
        root: the root node (empty key, never evicted).
        cached_blocks: blocks the tree holds. evictable_blocks: those in nodes no request holds.
        evicted_blocks: blocks evicted so far.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = positive_integer("block_size", block_size)
        self.root = RadixNode()
        self.evictable_blocks = self.evicted_blocks = 0
        self._held: set[int] = set()          # every block id in the tree (insert's check reads it)
        self._tick = itertools.count(1)

    @property
    def cached_blocks(self) -> int:
        return len(self._held)

    # -- reading -------------------------------------------------------------------------------
    def _blocks_of(self, tokens: list[int]) -> list[tuple[int, ...]]:
        bs = self.block_size
        return [tuple(tokens[i:i + bs]) for i in range(0, len(tokens) - len(tokens) % bs, bs)]

    def match(self, tokens) -> RadixMatch:
        """The longest cached prefix of TOKENS in whole blocks. An edge matched only in part is split at
        the last matched block boundary (its blocks are divided between the two nodes, none lost), so the
        match ends exactly at a node; every node of the path gets a new last-access tick.

        Raises: ArgumentTypeError / ValueError for TOKENS that are not token ids (nothing changes)."""
        return self._matched(*self._walk(self._blocks_of(token_ids("tokens", tokens))))

    def _matched(self, path: list[RadixNode], cut: int) -> RadixMatch:
        """The match a walk (``_walk``) found, its partly matched edge split and its path's ticks renewed."""
        if cut:
            path[-1] = self._split(path[-1], cut)
        tick = next(self._tick)
        self.root.last_access = tick
        for node in path:
            node.last_access = tick
        blocks = tuple(b for node in path for b in node.blocks)
        return RadixMatch(path[-1] if path else self.root, blocks, len(blocks) * self.block_size)

    def _walk(self, chunks: list[tuple[int, ...]]) -> tuple[list[RadixNode], int]:
        """The nodes from the root's child down along CHUNKS (token ids per block), changing nothing; and
        how many blocks of the last node's edge matched when that edge matched only in part (else 0)."""
        node, path, i = self.root, [], 0
        while i < len(chunks) and chunks[i] in node.children:
            node = node.children[chunks[i]]
            edge = self._blocks_of(list(node.key))
            same = next((k for k, (a, b) in enumerate(zip(edge, chunks[i:])) if a != b), min(len(edge), len(chunks) - i))
            path.append(node)
            if same < len(edge):
                return path, same
            i += same
        return path, 0

    def _split(self, child: RadixNode, blocks: int) -> RadixNode:
        """Split CHILD's edge after its first BLOCKS blocks (0 < BLOCKS < its blocks): a new node takes the
        first part and becomes CHILD's parent; CHILD keeps the rest, its children and its blocks. The new
        node is held by every request that holds CHILD (the same lock count)."""
        bs, parent = self.block_size, child.parent
        middle = RadixNode(key=child.key[:blocks * bs], blocks=child.blocks[:blocks], parent=parent,
                           lock=child.lock, last_access=child.last_access)
        parent.children[middle.key[:bs]] = middle
        child.key, child.blocks, child.parent = child.key[blocks * bs:], child.blocks[blocks:], middle
        middle.children[child.key[:bs]] = child
        return middle

    def find(self, tokens) -> RadixNode | None:
        """The node whose path from the root holds exactly TOKENS (the root for none), or None when no node
        ends there (a prefix that is not cached, ends inside an edge or is not whole blocks). Changes nothing:
        no split, no tick.

        Raises: ArgumentTypeError / ValueError for TOKENS that are not token ids."""
        tokens = token_ids("tokens", tokens)
        if len(tokens) % self.block_size:
            return None
        path, cut = self._walk(self._blocks_of(tokens))
        if cut or sum(len(n.blocks) for n in path) * self.block_size != len(tokens):
            return None
        return path[-1] if path else self.root

    def nodes(self) -> Iterator[RadixNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # -- writing -------------------------------------------------------------------------------
    def insert(self, tokens, blocks: Sequence[int]) -> list[int]:
        """Cache the prefix TOKENS (``len(BLOCKS) * block_size`` token ids) held in BLOCKS. The part already
        cached keeps the tree's blocks (the caller's duplicates stay the caller's); the rest is added under
        the caller's block ids. Returns the ids the tree adopted (take a reference for the tree on each).

        Raises (nothing changes): ArgumentTypeError / ValueError for TOKENS that are not token ids, block
        ids that are not ints >= 0, a length that is not ``len(BLOCKS) * block_size``, or a new block id the
        tree already holds."""
        tokens = token_ids("tokens", tokens)
        blocks = [nonnegative_integer(f"blocks[{i}]", b) for i, b in enumerate(blocks)]
        if len(tokens) != len(blocks) * self.block_size:
            raise ValueError(f"insert takes whole blocks: {len(blocks)} blocks of {self.block_size} positions hold "
                             f"{len(blocks) * self.block_size} token ids, got {len(tokens)}")
        path, cut = self._walk(self._blocks_of(tokens))
        present = sum(len(n.blocks) for n in path) - (len(path[-1].blocks) - cut if cut else 0)
        new = blocks[present:]
        clash = sorted(set(new) & self._held) or sorted(b for b, n in Counter(new).items() if n > 1)
        if clash:
            raise ValueError(f"block {clash[0]} is already in the radix cache (or given twice): a block holds one "
                             "prefix's positions")
        found = self._matched(path, cut)
        if new:
            node = RadixNode(key=tuple(tokens[found.length:]), blocks=list(new), parent=found.node,
                             last_access=found.node.last_access)
            found.node.children[node.key[:self.block_size]] = node
            self._held.update(new)
            self.evictable_blocks += len(new)
        return list(new)

    def acquire(self, node: RadixNode) -> None:
        """Hold the path root .. NODE for a running request: add one to the lock count of every node on it
        (a locked node is never evicted).

        Raises: ValueError for a node that is not in this tree (nothing changes)."""
        path = self._path(node)
        for n in path:
            if n.lock == 0:
                self.evictable_blocks -= len(n.blocks)
            n.lock += 1

    def release(self, node: RadixNode) -> None:
        """Let go of the path root .. NODE (what :meth:`acquire` held).

        Raises: ValueError for a node not in this tree, or a path with a node nobody holds (a release
        without its acquire): nothing changes."""
        path = self._path(node)
        free = next((n for n in path if n.lock == 0), None)
        if free is not None:
            raise ValueError(f"release of a path nobody holds ({free!r} has lock count 0): each release needs "
                             "its acquire")
        for n in path:
            n.lock -= 1
            if n.lock == 0:
                self.evictable_blocks += len(n.blocks)

    def _path(self, node: RadixNode) -> list[RadixNode]:
        if not isinstance(node, RadixNode):
            raise ValueError(f"expected a RadixNode of this cache, got {type(node).__name__}")
        path = []
        while node is not self.root:
            if node.parent is None or node.parent.children.get(node.key[:self.block_size]) is not node:
                raise ValueError(f"{node!r} is not in this radix cache (evicted, or another cache's)")
            path.append(node)
            node = node.parent
        return path

    def evict(self, n_blocks: int) -> list[int]:
        """Evict at least N_BLOCKS blocks: the least recently used leaves that no request holds, one leaf at a
        time, bottom up (a parent left a leaf, unlocked, joins the candidates); a parent left with one child
        and the same lock count is folded into it. Returns the evicted block ids (release them).

        Raises (nothing changes): ArgumentTypeError / ValueError for N_BLOCKS that is not an int >= 0, or
        one larger than ``evictable_blocks``."""
        n_blocks = integer("n_blocks", n_blocks, minimum=0, maximum=self.evictable_blocks,
                           note=f"{self.evictable_blocks} of the {self.cached_blocks} cached blocks are in nodes no "
                                "request holds")
        order = itertools.count()
        heap = [(n.last_access, next(order), n) for n in self.nodes() if not n.children and n.lock == 0]
        heapq.heapify(heap)
        evicted: list[int] = []
        while len(evicted) < n_blocks:
            tick, _, leaf = heapq.heappop(heap)
            if tick != leaf.last_access:      # a fold moved its tick up since it was pushed: queue it again
                heapq.heappush(heap, (leaf.last_access, next(order), leaf))
                continue
            parent = leaf.parent
            del parent.children[leaf.key[:self.block_size]]
            leaf.parent = None
            evicted.extend(leaf.blocks)
            self._held.difference_update(leaf.blocks)
            self.evictable_blocks -= len(leaf.blocks)
            if parent is self.root:
                continue
            if not parent.children and parent.lock == 0:
                heapq.heappush(heap, (parent.last_access, next(order), parent))
            elif len(parent.children) == 1:
                self._fold(parent)
        self.evicted_blocks += len(evicted)
        return evicted

    def _fold(self, parent: RadixNode) -> None:
        """Merge PARENT into its only child when no request ends at PARENT (same lock count): the child
        object stays (a request may hold it) and takes PARENT's key and blocks in front of its own."""
        (child,) = parent.children.values()
        if child.lock != parent.lock:
            return
        grand = parent.parent
        del grand.children[parent.key[:self.block_size]]
        child.key, child.blocks, child.parent = parent.key + child.key, parent.blocks + child.blocks, grand
        child.last_access = max(child.last_access, parent.last_access)
        grand.children[child.key[:self.block_size]] = child
        parent.parent, parent.children = None, {}

    # -- the tree as plain data ----------------------------------------------------------------
    def to_plain(self) -> dict:
        """The tree as nested dicts (what Lab 3's radix exercises take): every node, the root included,
        is ``{"key": [token ids], "blocks": [block ids], "lock": int, "last_access": int, "children":
        {tuple of the child's first block's token ids: child node}}`` (``PLAIN_FIELDS``); the root's key and
        blocks are empty. Nothing is shared with the cache."""
        def plain(node: RadixNode) -> dict:
            return {"key": list(node.key), "blocks": list(node.blocks), "lock": node.lock,
                    "last_access": node.last_access, "children": {}}

        root = plain(self.root)
        stack = [(self.root, root)]
        while stack:
            node, out = stack.pop()
            for first, child in node.children.items():
                out["children"][first] = plain(child)
                stack.append((child, out["children"][first]))
        return root

    @classmethod
    def from_plain(cls, root, block_size: int) -> "RadixCache":
        """A cache holding the tree ROOT in the form :meth:`to_plain` gives; its next last-access tick is one
        past the largest in the tree, so a :meth:`match` stamps the path with ``max last_access + 1``.

        Raises: ArgumentTypeError / ValueError naming the node (by the token ids of its path) whose form is
        wrong: not a dict of exactly ``PLAIN_FIELDS``, token or block ids that are not ints >= 0, a key that
        is not ``block_size`` token ids per block, a non-root node without blocks, a child filed under other
        tokens than its first block's, a negative count or tick, a block id held twice, a lock count below
        the sum of its children's, a dict reached twice (a cycle or a node under two parents). Nothing else is
        read from ROOT, which is left unchanged."""
        cache = cls(block_size)
        bs = cache.block_size
        ticks = [0]
        seen: set[int] = set()     # ids of the dicts read: a dict reached twice is a cycle or a shared subtree
        stack: list[tuple[object, RadixNode | None, tuple, tuple[int, ...]]] = [(root, None, (), ())]
        while stack:
            plain, parent, first, path = stack.pop()
            where = "the root" if parent is None else f"the node filed under {list(first)} after tokens {list(path)}"
            if id(plain) in seen:
                raise ValueError(f"{where} is reached twice from the root (a cycle, or one node under two parents): "
                                 "a tree holds each node once")
            seen.add(id(plain))
            if type(plain) is not dict or set(plain) != set(PLAIN_FIELDS):
                raise ArgumentTypeError(f"{where} must be a dict with exactly the keys {', '.join(PLAIN_FIELDS)}, got "
                                        f"{sorted(map(str, plain)) if type(plain) is dict else type(plain).__name__}")
            key = tuple(token_ids(f"{where}: key", plain["key"]))
            where = "the root" if parent is None else f"the node at tokens {list(path + key)}"
            if type(plain["blocks"]) not in (list, tuple):
                raise ArgumentTypeError(f"{where}: blocks must be a list of block ids, got "
                                        f"{type(plain['blocks']).__name__}")
            blocks = [nonnegative_integer(f"{where}: blocks[{i}]", b) for i, b in enumerate(plain["blocks"])]
            if len(key) != bs * len(blocks) or (parent is not None and not blocks):
                raise ValueError(f"{where}: its key holds {len(key)} token ids for {len(blocks)} blocks of {bs} "
                                 "positions (every edge but the root's holds one or more whole blocks)")
            if parent is not None and key[:bs] != first:
                raise ValueError(f"{where}: filed under {list(first)}, but its first block's tokens are "
                                 f"{list(key[:bs])}")
            node = cache.root if parent is None else RadixNode(key=key, blocks=blocks, parent=parent)
            if parent is None and key:
                raise ValueError(f"the root's key and blocks must be empty, got {len(key)} token ids")
            node.lock = nonnegative_integer(f"{where}: lock", plain["lock"])
            node.last_access = nonnegative_integer(f"{where}: last_access", plain["last_access"])
            ticks.append(node.last_access)
            if parent is not None:
                parent.children[first] = node
            children = plain["children"]
            if type(children) is not dict:
                raise ArgumentTypeError(f"{where}: children must be a dict, got {type(children).__name__}")
            for child_first, child in children.items():
                if type(child_first) is not tuple:
                    raise ArgumentTypeError(f"{where}: children are filed under tuples of token ids, got "
                                            f"{type(child_first).__name__}")
                stack.append((child, node, child_first, path + key))
        held: set[int] = set()
        for node in cache.nodes():
            clash = held.intersection(node.blocks) or (len(set(node.blocks)) < len(node.blocks) and node.blocks)
            if clash:
                raise ValueError(f"block {sorted(clash)[0]} is held twice in the tree")
            held.update(node.blocks)
            below = sum(c.lock for c in node.children.values())
            if node.lock < below:
                path, up = [], node
                while up is not cache.root:
                    path[:0], up = up.key, up.parent
                raise ValueError(f"the node at tokens {list(path)}: its lock count {node.lock} is below the sum of its "
                                 f"children's, {below} (a path held through a child is held through its parent, and "
                                 "a split's new parent takes the count of the node it splits)")
        cache._held = held
        cache.evictable_blocks = sum(len(n.blocks) for n in cache.nodes() if n.lock == 0)
        cache._tick = itertools.count(max(ticks) + 1)
        cache.check()
        return cache

    # -- checking ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise RuntimeError naming the first broken invariant (module docstring)."""
        seen: dict[int, RadixNode] = {}
        evictable = 0
        for node in self.nodes():
            if not node.blocks or len(node.key) != len(node.blocks) * self.block_size:
                raise RuntimeError(f"{node!r}: its key has {len(node.key)} token ids for {len(node.blocks)} blocks of "
                                   f"{self.block_size}")
            if node.parent.children.get(node.key[:self.block_size]) is not node:
                raise RuntimeError(f"{node!r} is not its parent's child under its first block's tokens")
            if node.lock < sum(c.lock for c in node.children.values()) or node.lock < 0:
                raise RuntimeError(f"{node!r}: lock count below its children's")
            for b in node.blocks:
                if b in seen:
                    raise RuntimeError(f"block {b} is in two nodes")
                seen[b] = node
            evictable += len(node.blocks) if node.lock == 0 else 0
        if set(seen) != self._held or evictable != self.evictable_blocks:
            raise RuntimeError(f"the cache records {self.cached_blocks} cached / {self.evictable_blocks} evictable "
                               f"blocks, the tree holds {len(seen)} / {evictable}")

