"""The radix prefix cache (course_lib.cache.radix): match with split, locks, LRU leaf eviction with folding,
no leaks under a seeded random workload, and bad input refused with nothing changed."""
from __future__ import annotations

import random

import pytest

from course_lib.cache.radix import RadixCache
from course_lib.validation import ArgumentTypeError


def shape(cache: RadixCache) -> list:
    """The tree as data (edges, blocks, locks, children), for comparing states."""
    def node(n):
        return (n.key, tuple(n.blocks), n.lock, sorted((node(c) for c in n.children.values()), key=repr))
    return [node(cache.root), cache.cached_blocks, cache.evictable_blocks, cache.evicted_blocks]


def test_a_partial_match_splits_the_edge_at_a_block_boundary_and_keeps_every_block():
    cache = RadixCache(block_size=2)
    assert cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12]) == [10, 11, 12]
    found = cache.match([1, 2, 3, 4, 7, 8, 9])           # two blocks agree, the third differs; 9 is a partial block
    assert found.blocks == (10, 11) and found.length == 4 and found.node.blocks == [10, 11]
    (child,) = found.node.children.values()
    assert child.key == (5, 6) and child.blocks == [12] and child.parent is found.node
    assert cache.match([1, 2, 3]).length == 2             # rounded down to whole blocks
    assert cache.match([1]).length == 0 and cache.match([1]).node is cache.root
    assert cache.insert([1, 2, 3, 4, 7, 8], [20, 21, 22]) == [22]     # the cached part keeps the tree's blocks
    assert cache.match([1, 2, 3, 4, 7, 8]).blocks == (10, 11, 22)
    cache.check()
    assert cache.cached_blocks == 4


def test_a_locked_path_is_never_evicted_and_a_release_makes_it_evictable():
    cache = RadixCache(block_size=1)
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([7, 8], [3, 4])
    held = cache.match([1, 2, 3]).node
    cache.acquire(held)
    cache.match([7, 8])                                   # the unlocked path is now the more recent one
    assert cache.evictable_blocks == 2
    before = shape(cache)
    with pytest.raises(ValueError, match="2 of the 5 cached blocks"):
        cache.evict(3)
    assert shape(cache) == before
    assert sorted(cache.evict(2)) == [3, 4]               # the least recent path was held
    cache.check()
    with pytest.raises(ValueError, match=r"in \[0, 0\] \(0 of the 3 cached"):
        cache.evict(1)
    cache.release(held)
    assert sorted(cache.evict(3)) == [0, 1, 2] and cache.cached_blocks == 0
    with pytest.raises(ValueError, match="not in this radix cache"):
        cache.acquire(held)                               # evicted


def test_eviction_takes_least_recently_used_leaves_bottom_up_and_folds_a_parent_left_with_one_child():
    cache = RadixCache(block_size=1)
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([1, 2, 4], [3, 4, 5])                    # splits after [1, 2]: a parent with two children
    cache.insert([9], [6])
    cache.match([1, 2, 3])                                # most recent
    cache.match([9])
    assert cache.evict(1) == [5]                          # the leaf [4] is the least recent
    node = cache.root.children[(1,)]
    assert node.key == (1, 2, 3) and node.blocks == [0, 1, 2] and not node.children   # folded back into one edge
    cache.check()
    assert cache.evict(1) == [0, 1, 2]                    # a whole leaf goes, even when fewer blocks were asked
    assert cache.evict(1) == [6] and cache.evicted_blocks == 5


def test_no_block_is_lost_or_shared_under_a_random_workload():
    rng = random.Random(0)
    cache, next_id, adopted, evicted, held = RadixCache(block_size=2), 0, set(), set(), []
    for step in range(400):
        tokens = [rng.choice([1, 2, 3]) for _ in range(rng.randrange(0, 13))]
        op = rng.random()
        if op < 0.45:
            n = len(tokens) // 2
            ids = list(range(next_id, next_id + n))
            next_id += n
            adopted.update(cache.insert(tokens[:2 * n], ids))
        elif op < 0.7:
            found = cache.match(tokens)
            cache.acquire(found.node)
            held.append(found.node)
        elif op < 0.85 and held:
            cache.release(held.pop(rng.randrange(len(held))))
        else:
            got = cache.evict(rng.randrange(0, cache.evictable_blocks + 1))
            assert not set(got) & evicted
            evicted.update(got)
        cache.check()
        in_tree = {b for n in cache.nodes() for b in n.blocks}
        assert in_tree | evicted == adopted and not in_tree & evicted, step
    for node in held:
        cache.release(node)
    evicted.update(cache.evict(cache.evictable_blocks))
    assert cache.cached_blocks == 0 and evicted == adopted      # every adopted block comes back exactly once
    cache.check()


@pytest.mark.parametrize("call, error, message", [
    (lambda c, n: c.match([1, "2"]), ArgumentTypeError, r"tokens\[1\]"),
    (lambda c, n: c.match([1, -2]), ValueError, r"tokens\[1\]"),
    (lambda c, n: c.insert([1, 2, 3], [5, 6]), ValueError, "whole blocks"),
    (lambda c, n: c.insert([5, 6, 7, 8], [0, 9]), ValueError, "block 0 is already"),
    (lambda c, n: c.insert([5, 6, 7, 8], [9, 9]), ValueError, "given twice"),
    (lambda c, n: c.insert([5, 6], [-1]), ValueError, r"blocks\[0\]"),
    (lambda c, n: c.release(n), ValueError, "nobody holds"),
    (lambda c, n: c.acquire("node"), ValueError, "expected a RadixNode"),
    (lambda c, n: c.evict(-1), ValueError, "n_blocks"),
    (lambda c, n: c.evict(True), ArgumentTypeError, "n_blocks"),
    (lambda c, n: c.evict(3), ValueError, "2 of the 2 cached"),
])
def test_bad_input_is_refused_by_name_and_changes_nothing(call, error, message):
    cache = RadixCache(block_size=2)
    cache.insert([1, 2, 3, 4], [0, 1])
    node = cache.match([1, 2, 3, 4]).node
    before = shape(cache)
    with pytest.raises(error, match=message):
        call(cache, node)
    assert shape(cache) == before


def test_the_plain_form_round_trips_and_find_changes_nothing():
    rng = random.Random(1)
    cache, next_id = RadixCache(block_size=3), 0
    for _ in range(40):
        tokens = [rng.choice([1, 2]) for _ in range(3 * rng.randrange(1, 5))]
        n = len(tokens) // 3
        cache.insert(tokens, list(range(next_id, next_id + n)))
        next_id += n
        if rng.random() < 0.3:
            cache.acquire(cache.match(tokens).node)
    plain = cache.to_plain()
    copy = RadixCache.from_plain(plain, 3)
    assert shape(copy) == shape(cache) and copy.to_plain() == plain
    tick = max(n.last_access for n in cache.nodes())
    some = next(iter(copy.root.children.values()))
    assert copy.find(list(some.key)) is some and copy.find([]) is copy.root
    assert copy.find(list(some.key[:2])) is None                    # not whole blocks
    assert copy.to_plain() == plain                                  # find splits nothing and stamps nothing
    copy.match(list(some.key))
    assert some.last_access == tick + 1                              # the next tick is one past the tree's largest


def _tree():
    cache = RadixCache(block_size=2)
    cache.insert([1, 2, 3, 4], [0, 1])
    cache.insert([1, 2, 5, 6], [0, 2])
    return cache.to_plain()


@pytest.mark.parametrize("change, error, message", [
    (lambda t: t.update(extra=1), ArgumentTypeError, "exactly the keys"),
    (lambda t: t["children"][(1, 2)].update(blocks=[0, 7]), ValueError, r"at tokens \[1, 2\]: its key holds 2 token ids for 2"),
    (lambda t: t["children"][(1, 2)]["children"][(3, 4)].update(blocks=[2]), ValueError, "block 2 is held twice"),
    (lambda t: t["children"][(1, 2)].update(lock=-1), ValueError, "lock"),
    (lambda t: t["children"][(1, 2)]["children"][(3, 4)].update(lock=1), ValueError, "below the sum"),
    (lambda t: t["children"].update({(9, 9): t["children"].pop((1, 2))}), ValueError, r"filed under \[9, 9\]"),
    (lambda t: t["children"].update({"12": t["children"].pop((1, 2))}), ArgumentTypeError, "tuples of token ids"),
    (lambda t: t["children"][(1, 2)].update(key=[1, 2.0]), ArgumentTypeError, r"key\[1\]"),
    (lambda t: t["children"][(1, 2)].update(blocks=5), ArgumentTypeError, "list of block ids"),
    (lambda t: t.update(key=[1, 2], blocks=[9]), ValueError, "root's key and blocks must be empty"),
])
def test_a_malformed_plain_tree_is_refused_by_name_and_left_unchanged(change, error, message):
    tree = _tree()
    change(tree)
    before = repr(tree)
    with pytest.raises(error, match=message):
        RadixCache.from_plain(tree, 2)
    assert repr(tree) == before


def test_a_tree_with_a_cycle_or_a_shared_node_is_refused_at_once():
    tree = _tree()
    node = tree["children"][(1, 2)]
    node["children"][(1, 2)] = node                                  # a node filed under itself
    with pytest.raises(ValueError, match="reached twice"):
        RadixCache.from_plain(tree, 2)
    tree = _tree()
    shared = tree["children"][(1, 2)]["children"][(3, 4)]
    tree["children"][(3, 4)] = shared                                # one node under two parents
    with pytest.raises(ValueError, match="reached twice"):
        RadixCache.from_plain(tree, 2)


def test_a_folded_leaf_is_evicted_by_its_new_tick_within_one_eviction():
    """A fold gives the merged node the parent's later tick; a leaf queued before the fold must wait for it."""
    cache = RadixCache(block_size=1)
    cache.insert([1, 0, 3], [10, 11, 12])       # tick 1
    cache.insert([1, 3, 0], [10, 13, 14])       # tick 2: [1] is split off, [3, 0] hangs under it
    cache.insert([0, 2, 0], [20, 21, 22])       # tick 3
    cache.match([1])                            # tick 4: [1] used again
    # [0, 3] (tick 1) goes first; [1] is left with one child and folds into [1, 3, 0] with tick 4, so the
    # leaf [0, 2, 0] (tick 3) is older than it now
    assert cache.evict(3) == [11, 12, 20, 21, 22]
    cache.check()
    assert cache.find([1, 3, 0]).blocks == [10, 13, 14]
