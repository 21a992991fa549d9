"""Tests for the paged KV cache (course Lab 2, "Paged KV")."""
from __future__ import annotations

import random

import pytest
import torch

from course_lib.cache.paged import (BlockAllocator, BlockPool, BlockPoolExhaustedError, PagedKVCache,
                                    PagedSequence, compute_block_hash)

H, D = 2, 3


def make(num_blocks=16, block_size=16, dtype=torch.float32):
    pool = BlockPool(num_blocks, block_size, H, D, dtype=dtype)
    return pool, PagedKVCache(pool)


def rand_kv(t, gen=None):
    return torch.randn(t, H, D, generator=gen), torch.randn(t, H, D, generator=gen)


def kv_of_tokens(tokens, start):
    """K/V that depend only on (token, position): equal token prefixes give equal K/V,
    as in a real model, so blocks found by prefix hashing hold the right data."""
    t = torch.tensor(tokens, dtype=torch.float32)[:, None, None]
    pos = torch.arange(start, start + len(tokens), dtype=torch.float32)[:, None, None]
    base = torch.arange(H * D, dtype=torch.float32).reshape(1, H, D)
    return t * 1000 + pos + base / 10, -(t * 1000 + pos) - base / 10


def check_invariants(cache, seqs):
    pool = cache.pool
    entries = sum(len(s.block_table) for s in seqs)
    assert sum(pool.ref_counts) == entries
    live = {b for s in seqs for b in s.block_table}
    assert pool.num_free == pool.num_blocks - len(live)
    assert set(pool.free_block_ids) == set(range(pool.num_blocks)) - live
    assert len(pool.free_block_ids) == len(set(pool.free_block_ids))
    for s in seqs:
        assert len(s.block_table) == -(-s.length // pool.block_size)
        assert 0 <= cache.waste(s) <= pool.block_size - 1
    for h, b in pool.hash_to_block_id.items():
        assert pool.ref_counts[b] > 0 and pool.block_hashes[b] == h


# -- append / read ---------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [16, 1, 3, 5, 7])
@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 33])
@pytest.mark.parametrize("chunked", [False, True])
def test_append_read_equals_concatenation(block_size, length, chunked):
    pool, cache = make(num_blocks=40, block_size=block_size)
    gen = torch.Generator().manual_seed(length * 100 + block_size)
    k, v = rand_kv(length, gen)
    seq = cache.new_sequence()
    if chunked:  # uneven chunks: 1, 2, 3, ... positions
        start, step = 0, 1
        while start < length:
            cache.append(seq, k[start:start + step], v[start:start + step])
            start, step = start + step, step + 1
    else:
        cache.append(seq, k, v)
    rk, rv = cache.read(seq)
    assert rk.shape == (length, H, D) and rv.shape == (length, H, D)
    assert torch.equal(rk, k) and torch.equal(rv, v)
    assert seq.length == length
    assert len(seq.block_table) == -(-length // block_size)
    assert cache.waste(seq) <= block_size - 1
    for p in range(length):
        b, off = cache.slot(seq, p)
        assert b == seq.block_table[p // block_size] and off == p % block_size
        assert torch.equal(pool.k[b, off], k[p])
    check_invariants(cache, [seq])


def test_read_keeps_dtype_and_shapes_are_validated():
    pool, cache = make(dtype=torch.float16)
    seq = cache.new_sequence()
    k, v = rand_kv(5)
    cache.append(seq, k, v)
    rk, _ = cache.read(seq)
    assert rk.dtype == torch.float16 and torch.equal(rk, k.half())
    with pytest.raises(ValueError, match="k must have shape"):
        cache.append(seq, torch.zeros(2, H + 1, D), torch.zeros(2, H + 1, D))
    with pytest.raises(ValueError, match="v must have the shape"):
        cache.append(seq, torch.zeros(2, H, D), torch.zeros(3, H, D))
    with pytest.raises(ValueError, match="token_ids must hold T=2"):
        cache.append(seq, torch.zeros(2, H, D), torch.zeros(2, H, D), token_ids=[1])
    assert seq.length == 5


def test_slot_refuses_positions_outside_length():
    _, cache = make()
    seq = cache.new_sequence()
    cache.append(seq, *rand_kv(3))
    for bad in (3, 4, -1):
        with pytest.raises(ValueError, match=rf"position must be an int in \[0, 2\] .*got {bad}"):
            cache.slot(seq, bad)
    with pytest.raises(TypeError, match="position must be an int"):
        cache.slot(seq, True)


# -- fork / copy-on-write --------------------------------------------------------------
def test_fork_shares_full_blocks_and_copies_partial_block_on_write():
    pool, cache = make(num_blocks=10, block_size=16)
    k, v = rand_kv(20)  # one full block + 4 positions in a second block
    a = cache.new_sequence()
    cache.append(a, k, v)
    b = cache.fork(a)
    assert b.block_table == a.block_table
    assert [pool.ref_counts[i] for i in a.block_table] == [2, 2]
    full_id, partial_id = a.block_table

    ka, va = rand_kv(3)
    kb, vb = rand_kv(5)
    cache.append(a, ka, va)  # a copies the shared partial block
    assert a.block_table[0] == full_id and a.block_table[1] != partial_id
    assert b.block_table == [full_id, partial_id]
    assert pool.ref_counts[full_id] == 2
    assert pool.ref_counts[partial_id] == 1 and pool.ref_counts[a.block_table[1]] == 1
    # b's data is untouched by a's write
    rk, rv = cache.read(b)
    assert torch.equal(rk, k) and torch.equal(rv, v)

    cache.append(b, kb, vb)  # b is now the only owner of partial_id: writes in place
    assert b.block_table == [full_id, partial_id]
    assert pool.ref_counts[full_id] == 2

    rk, rv = cache.read(a)
    assert torch.equal(rk, torch.cat([k, ka])) and torch.equal(rv, torch.cat([v, va]))
    rk, rv = cache.read(b)
    assert torch.equal(rk, torch.cat([k, kb])) and torch.equal(rv, torch.cat([v, vb]))
    check_invariants(cache, [a, b])


def test_fork_of_full_last_block_allocates_without_copy():
    pool, cache = make(num_blocks=6, block_size=4)
    a = cache.new_sequence()
    cache.append(a, *rand_kv(8))
    b = cache.fork(a)
    cache.append(b, *rand_kv(1))
    assert b.block_table[:2] == a.block_table and len(b.block_table) == 3
    assert cache.blocks_needed(a, 1) == 1
    check_invariants(cache, [a, b])


# -- release ---------------------------------------------------------------------------
def test_release_returns_blocks_and_ref_counts():
    pool, cache = make(num_blocks=8, block_size=4)
    a = cache.new_sequence()
    cache.append(a, *rand_kv(10), token_ids=list(range(10)))
    b = cache.fork(a)
    cache.append(b, *rand_kv(3))
    c = cache.new_sequence(list(range(10)))
    assert c.length == 8
    cache.release(a)
    assert a.block_table == [] and a.length == 0 and a.token_ids == []
    check_invariants(cache, [b, c])
    cache.release(b)
    cache.release(c)
    assert pool.num_free == 8 and pool.ref_counts == [0] * 8
    assert pool.hash_to_block_id == {} and pool.block_hashes == [None] * 8
    # a released (empty) sequence reads as empty and can be reused
    rk, _ = cache.read(a)
    assert rk.shape == (0, H, D)


def test_release_twice_of_a_stale_copy_is_refused():
    pool, cache = make(num_blocks=4, block_size=4)
    a = cache.new_sequence()
    cache.append(a, *rand_kv(5))
    stale = PagedSequence(list(a.block_table), a.length, [])
    cache.release(a)
    with pytest.raises(ValueError, match=r"block_id \d+ is free"):
        cache.release(stale)
    with pytest.raises(ValueError, match=r"block_id \d+ is free"):
        cache.read(stale)
    assert pool.num_free == 4 and pool.ref_counts == [0] * 4


# -- block id validation ---------------------------------------------------------------
@pytest.mark.parametrize("method", ["incref", "decref", "check_id"])
@pytest.mark.parametrize("bad, pattern", [
    (8, r"block_id must be an int in \[0, 7\] .*got 8"),
    (-1, r"block_id must be an int in \[0, 7\] .*got -1"),
    (True, "block_id must be an int .*True"),
    (1.0, "block_id must be an int .*1.0"),
    (torch.tensor(1), "block_id must be an int"),
])
def test_bad_block_ids_are_refused(method, bad, pattern):
    pool, _ = make(num_blocks=8, block_size=4)
    pool.allocate()
    before = (list(pool.ref_counts), list(pool.free_block_ids))
    with pytest.raises(ValueError, match=pattern):
        getattr(pool, method)(bad)
    assert (pool.ref_counts, list(pool.free_block_ids)) == before


@pytest.mark.parametrize("method", ["incref", "decref", "check_id"])
def test_free_block_ids_are_refused(method):
    pool, _ = make(num_blocks=4, block_size=4)
    b = pool.allocate()
    assert pool.decref(b) == 0
    with pytest.raises(ValueError, match=f"block_id {b} is free"):
        getattr(pool, method)(b)
    assert pool.ref_counts == [0] * 4 and pool.num_free == 4
    pool.check_id(b, live=False)  # in range is enough when a free block is acceptable


def test_bad_ids_in_a_block_table_are_refused():
    _, cache = make(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match=r"block_id must be an int in \[0, 3\] .*got 9"):
        cache.read(PagedSequence([9], 1, []))
    with pytest.raises(ValueError, match="block_table has 1 blocks but length 5"):
        cache.read(PagedSequence([0], 5, []))


def test_pool_sizes_are_validated():
    for args, name in (((0, 4, H, D), "num_blocks"), ((4, 0, H, D), "block_size"),
                       ((4, 4, True, D), "n_kv_heads"), ((4, 4, H, 2.0), "head_dim")):
        with pytest.raises(ValueError, match=name):
            BlockPool(*args)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_pool_refuses_integer_dtypes(dtype):
    with pytest.raises(TypeError, match="BlockPool dtype must be a floating torch dtype"):
        BlockPool(4, 4, H, D, dtype=dtype)


def test_block_id_type_errors_are_type_errors_and_numpy_ids_work():
    import numpy as np
    pool, _ = make(num_blocks=8, block_size=4)
    b = pool.allocate()
    with pytest.raises(TypeError, match=r"block_id must be an int in \[0, 7\]"):
        pool.incref(2.0)
    assert pool.incref(np.int64(b)) == 2 and type(pool.check_id(np.int64(b))) is int
    with pytest.raises(TypeError, match="live must be a bool"):
        pool.check_id(b, live=None)


@pytest.mark.parametrize("fields, error, pattern", [
    (dict(length=-1), ValueError, r"PagedSequence.length must be an int >= 0"),
    (dict(length=2.0), TypeError, r"PagedSequence.length must be an int"),
    (dict(block_table=[0, True], length=5), TypeError, r"PagedSequence.block_table\[1\] must be an int"),
    (dict(block_table=[-1], length=1), ValueError, r"PagedSequence.block_table\[0\] must be an int >= 0"),
    (dict(block_table="01", length=2), TypeError, "PagedSequence.block_table must be a list of ints"),
    (dict(token_ids=[1, 2], length=1), ValueError, "PagedSequence.token_ids must hold at most length=1 ids"),
    (dict(token_ids=[-3], length=1), ValueError, r"PagedSequence.token_ids\[0\] must be an int in \[0, "),
    (dict(token_ids=[1.0], length=1), TypeError, r"PagedSequence.token_ids\[0\] must be an int"),
])
def test_paged_sequence_fields_are_checked_on_construction(fields, error, pattern):
    with pytest.raises(error, match=pattern):
        PagedSequence(**fields)


def test_paged_sequence_stores_lists_of_ints():
    import numpy as np
    seq = PagedSequence((0, np.int64(1)), np.int64(5), (7,))
    assert seq.block_table == [0, 1] and type(seq.block_table[1]) is int and type(seq.length) is int
    assert seq.token_ids == [7] and isinstance(seq.token_ids, list)


def test_a_table_that_names_a_block_twice_is_refused():
    pool, cache = make(num_blocks=4, block_size=2)
    a = cache.new_sequence()
    cache.append(a, *rand_kv(2))
    twice = PagedSequence([a.block_table[0], a.block_table[0]], 4)
    for method in (cache.fork, cache.release, cache.read, cache.waste):
        with pytest.raises(ValueError, match="seq.block_table must name each block once"):
            method(twice)
    assert pool.ref_counts[a.block_table[0]] == 1


def test_a_seq_mutated_into_bad_fields_is_refused_before_any_change():
    pool, cache = make(num_blocks=4, block_size=2)
    a = cache.new_sequence()
    cache.append(a, *rand_kv(3))
    a.length = 3.0
    with pytest.raises(TypeError, match="seq.length must be an int"):
        cache.fork(a)
    a.length = 3
    a.block_table = tuple(a.block_table)
    with pytest.raises(TypeError, match="seq.block_table and seq.token_ids must be lists"):
        cache.append(a, *rand_kv(1))
    with pytest.raises(TypeError, match="seq must be a PagedSequence"):
        cache.fork([0, 1])
    assert pool.ref_counts[:2] == [1, 1]


@pytest.mark.parametrize("token_ids, error, pattern", [
    ([1, -1], ValueError, r"token_ids\[1\] must be an int in \[0, "),
    ([1, 2.0], TypeError, r"token_ids\[1\] must be an int"),
    ("ab", TypeError, "token_ids must be a sequence of int token ids"),
    (torch.tensor([1.0, 2.0]), TypeError, "token_ids must be an integer tensor"),
    (torch.tensor([[1, 2]]), ValueError, r"token_ids must be an integer tensor of shape \(T,\)"),
    (torch.tensor([1, -2]), ValueError, r"token_ids must hold values in \[0, "),
])
def test_append_refuses_bad_token_ids_without_writing(token_ids, error, pattern):
    pool, cache = make(num_blocks=4, block_size=2)
    seq = cache.new_sequence()
    with pytest.raises(error, match=pattern):
        cache.append(seq, *rand_kv(2), token_ids=token_ids)
    assert seq.length == 0 and pool.num_free == 4


def test_token_ids_from_a_tensor_or_numpy_array_hash_like_a_list():
    import numpy as np
    _, cache = make(num_blocks=8, block_size=2)
    a = cache.new_sequence()
    cache.append(a, *kv_of_tokens([4, 5, 6, 7], 0), token_ids=torch.tensor([4, 5, 6, 7]))
    assert cache.new_sequence(np.array([4, 5, 6, 7])).block_table == a.block_table
    assert compute_block_hash(torch.tensor([4, 5])) == compute_block_hash([4, 5]) == compute_block_hash((4, 5))


@pytest.mark.parametrize("call, error, pattern", [
    (lambda c, s: c.new_sequence("abc"), TypeError, "prefix_token_ids must be a sequence"),
    (lambda c, s: c.new_sequence([0, -1]), ValueError, r"prefix_token_ids\[1\] must be an int in \[0, "),
    (lambda c, s: c.pool.lookup_prefix([None]), TypeError, r"token_ids\[0\] must be an int"),
    (lambda c, s: c.blocks_needed(s, -1), ValueError, "n_new must be an int >= 0"),
    (lambda c, s: c.blocks_needed(s, 1.5), TypeError, "n_new must be an int"),
    (lambda c, s: c.append(s, torch.zeros(1, H, D, dtype=torch.long), torch.zeros(1, H, D)), TypeError,
     "k must be a floating tensor"),
    (lambda c, s: c.append(s, torch.zeros(1, H, D), None), TypeError, "v must be a Tensor"),
    (lambda c, s: c.slot(s, torch.tensor(0)), TypeError, "position must be an int"),
    (lambda c, s: c.pool.register_full_block(s.block_table[0], [1, 2, 3, 4], prefix_hash=-1), ValueError,
     r"prefix_hash must be an int in \[0, 18446744073709551615\]"),
    (lambda c, s: compute_block_hash([1], prefix_hash="abc"), TypeError, "prefix_hash must be an int"),
    (lambda c, s: compute_block_hash([2 ** 63]), ValueError,
     r"token_ids\[0\] must be an int in \[0, 9223372036854775807\]"),
    (lambda c, s: PagedKVCache("pool"), TypeError, "pool must be a BlockPool"),
])
def test_paged_arguments_are_checked_naming_them(call, error, pattern):
    _, cache = make(num_blocks=4, block_size=4)
    seq = cache.new_sequence()
    cache.append(seq, *rand_kv(2))
    with pytest.raises(error, match=pattern):
        call(cache, seq)
    assert seq.length == 2


def test_slot_of_an_empty_sequence_names_the_empty_sequence():
    _, cache = make()
    with pytest.raises(ValueError, match=r"position 0 does not exist: seq is empty"):
        cache.slot(cache.new_sequence(), 0)


# -- exhaustion ------------------------------------------------------------------------
def test_allocate_exhaustion_is_clear_and_leaks_nothing():
    pool, _ = make(num_blocks=2, block_size=4)
    pool.allocate(), pool.allocate()
    with pytest.raises(BlockPoolExhaustedError, match="exhausted"):
        pool.allocate()
    assert pool.num_free == 0 and pool.ref_counts == [1, 1]


def test_append_exhaustion_leaves_everything_unchanged():
    pool, cache = make(num_blocks=4, block_size=4)
    a = cache.new_sequence()
    k, v = rand_kv(6)
    cache.append(a, k, v, token_ids=list(range(6)))  # 2 blocks
    b = cache.fork(a)
    storage = pool.k.clone(), pool.v.clone()
    state = (list(pool.ref_counts), list(pool.free_block_ids), dict(pool.hash_to_block_id))
    seq_state = (list(b.block_table), b.length, list(b.token_ids))
    # 2 free blocks; b needs a copy of the shared partial block + 2 new blocks = 3
    with pytest.raises(BlockPoolExhaustedError, match="needs 3 free blocks, the pool has 2"):
        cache.append(b, *rand_kv(7), token_ids=list(range(7)))
    assert (list(pool.ref_counts), list(pool.free_block_ids), dict(pool.hash_to_block_id)) == state
    assert (list(b.block_table), b.length, list(b.token_ids)) == seq_state
    assert torch.equal(pool.k, storage[0]) and torch.equal(pool.v, storage[1])
    assert pool.num_free == 2
    # an append that fits still works afterwards
    kb, vb = rand_kv(6)
    cache.append(b, kb, vb)
    assert torch.equal(cache.read(b)[0], torch.cat([k, kb]))
    assert torch.equal(cache.read(a)[0], k)
    check_invariants(cache, [a, b])


def test_append_past_the_pools_max_seq_len_is_refused_and_changes_nothing():
    """The policy past the context: refuse (ContextLengthError, a ValueError) before writing; an append
    that ends exactly at max_seq_len fits. A pool without max_seq_len sets no limit of its own."""
    from course_lib.validation import ContextLengthError

    pool = BlockPool(8, 4, 2, 3, max_seq_len=10)
    cache = PagedKVCache(pool)
    a = cache.new_sequence()
    k, v = rand_kv(9)
    cache.append(a, k, v)
    state = (list(pool.ref_counts), list(pool.free_block_ids), pool.k.clone(), list(a.block_table), a.length)
    with pytest.raises(ContextLengthError, match=r"from 9 to 11 positions, past the pool's max_seq_len 10"):
        cache.append(a, *rand_kv(2))
    assert (list(pool.ref_counts), list(pool.free_block_ids), list(a.block_table), a.length) == \
        (state[0], state[1], state[3], state[4]) and torch.equal(pool.k, state[2])
    cache.append(a, *rand_kv(1))                                  # position 9, the last one, fits
    assert a.length == 10
    with pytest.raises(ValueError, match="max_seq_len"):
        cache.append(a, *rand_kv(1))
    unbounded = PagedKVCache(BlockPool(8, 4, 2, 3))
    b = unbounded.new_sequence()
    unbounded.append(b, *rand_kv(30))
    assert b.length == 30 and unbounded.pool.max_seq_len is None
    with pytest.raises(ValueError, match="BlockPool max_seq_len"):
        BlockPool(8, 4, 2, 3, max_seq_len=0)


# -- prefix hashing --------------------------------------------------------------------
def test_prefix_hashing_reuses_full_blocks_of_identical_prefix():
    pool, cache = make(num_blocks=16, block_size=4)
    tokens = [5, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # 2 full blocks + 2
    a = cache.new_sequence()
    cache.append(a, *kv_of_tokens(tokens, 0), token_ids=tokens)
    assert len(pool.hash_to_block_id) == 2

    assert pool.lookup_prefix(tokens) == a.block_table[:2]
    assert pool.lookup_prefix(tokens[:7]) == a.block_table[:1]  # only whole blocks
    assert pool.lookup_prefix(tokens[:3]) == []

    b = cache.new_sequence(tokens + [7, 7])
    assert b.block_table == a.block_table[:2] and b.length == 8 and b.token_ids == tokens[:8]
    assert [pool.ref_counts[i] for i in a.block_table] == [2, 2, 1]
    rest = (tokens + [7, 7])[8:]
    cache.append(b, *kv_of_tokens(rest, 8), token_ids=rest)
    rk, rv = cache.read(b)
    ek, ev = kv_of_tokens(tokens + [7, 7], 0)
    assert torch.equal(rk, ek) and torch.equal(rv, ev)
    # b's third block became full: registered under a hash chained to a's blocks
    assert len(pool.hash_to_block_id) == 3
    assert pool.lookup_prefix(tokens[:8] + rest) == b.block_table
    check_invariants(cache, [a, b])


def test_prefix_hash_chains_earlier_blocks():
    pool, cache = make(num_blocks=16, block_size=4)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    a = cache.new_sequence()
    cache.append(a, *kv_of_tokens(tokens, 0), token_ids=tokens)
    # same second block, different first block: no match at all (not even block 2)
    other = [9, 2, 3, 4, 5, 6, 7, 8]
    assert pool.lookup_prefix(other) == []
    c = cache.new_sequence(other)
    assert c.block_table == [] and c.length == 0
    # second block differs: the first still matches
    assert pool.lookup_prefix([1, 2, 3, 4, 5, 6, 7, 0]) == a.block_table[:1]
    assert compute_block_hash(tokens[4:], compute_block_hash(tokens[:4])) != \
        compute_block_hash(tokens[4:], compute_block_hash(other[:4]))


def test_prefix_entries_disappear_when_blocks_are_freed():
    pool, cache = make(num_blocks=8, block_size=4)
    tokens = list(range(8))
    a = cache.new_sequence()
    cache.append(a, *kv_of_tokens(tokens, 0), token_ids=tokens)
    b = cache.new_sequence(tokens)
    assert b.length == 8
    cache.release(a)
    assert len(pool.hash_to_block_id) == 2  # b still holds both blocks
    cache.release(b)
    assert pool.hash_to_block_id == {} and pool.lookup_prefix(tokens) == []
    # the freed ids are reused for other data and must not be found by the old prefix
    c = cache.new_sequence()
    cache.append(c, *kv_of_tokens([0] * 8, 0), token_ids=[0] * 8)
    assert pool.lookup_prefix(tokens) == []


def test_hash_collision_is_not_a_prefix_hit(monkeypatch):
    import course_lib.cache.paged as paged
    monkeypatch.setattr(paged, "compute_block_hash", lambda token_ids, prefix_hash=None: 0)
    pool, cache = make(num_blocks=8, block_size=4)
    a = cache.new_sequence()
    cache.append(a, *kv_of_tokens([1, 2, 3, 4], 0), token_ids=[1, 2, 3, 4])
    assert pool.hash_to_block_id == {0: a.block_table[0]}
    assert pool.lookup_prefix([5, 6, 7, 8]) == []  # same hash, other tokens
    assert pool.lookup_prefix([1, 2, 3, 4]) == a.block_table


def test_no_hashing_without_token_ids_and_no_mixing():
    pool, cache = make(num_blocks=8, block_size=4)
    a = cache.new_sequence()
    cache.append(a, *rand_kv(8))
    assert pool.hash_to_block_id == {}
    with pytest.raises(ValueError, match="token_ids given"):
        cache.append(a, *rand_kv(1), token_ids=[1])
    assert a.length == 8
    with pytest.raises(ValueError, match=r"prefix_token_ids\[1\]"):
        cache.new_sequence([1, True])


def test_waste_bound_for_many_lengths():
    for bs in (1, 2, 5, 16):
        pool, cache = make(num_blocks=64, block_size=bs)
        seq = cache.new_sequence()
        for n in range(40):
            assert cache.waste(seq) == len(seq.block_table) * bs - n <= bs - 1
            cache.append(seq, *rand_kv(1))
        cache.release(seq)


# -- randomized model check ------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_against_list_model(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    block_size = rng.choice([1, 2, 3, 4, 16])
    pool, cache = make(num_blocks=rng.choice([8, 32, 64]), block_size=block_size)
    seqs: dict[int, PagedSequence] = {}
    model: dict[int, dict] = {}  # id -> {"k": [rows], "v": [rows], "tokens": list | None}
    next_id = 0

    def new_entry(seq, k_rows, v_rows, tokens):
        nonlocal next_id
        seqs[next_id] = seq
        model[next_id] = {"k": k_rows, "v": v_rows, "tokens": tokens}
        next_id += 1

    for _ in range(300):
        op = rng.choices(["new", "prefix", "append", "fork", "release"], [2, 2, 8, 3, 3])[0]
        if len(seqs) > 6:  # keep the pool mostly usable: exhaustion is tested, not the norm
            op = "release"
        if op == "new" or (op != "prefix" and not seqs):
            new_entry(cache.new_sequence(), [], [], [] if rng.random() < 0.7 else None)
        elif op == "prefix":
            donors = [m["tokens"] for m in model.values() if m["tokens"]]
            prefix = list(rng.choice(donors)) if donors and rng.random() < 0.8 else []
            prefix = prefix[:rng.randint(0, len(prefix))] + [rng.randint(0, 2) for _ in range(rng.randint(0, 4))]
            seq = cache.new_sequence(prefix)
            n = seq.length
            assert n % block_size == 0 and n <= len(prefix) and seq.token_ids == prefix[:n]
            k, v = kv_of_tokens(prefix[:n], 0) if n else (torch.zeros(0, H, D),) * 2
            new_entry(seq, list(k), list(v), prefix[:n])
        elif op == "append":
            i = rng.choice(list(seqs))
            t = rng.randint(0, 2 * block_size + 1)
            tokens = model[i]["tokens"]
            if tokens is not None and rng.random() < 0.95:
                new_tokens = [rng.randint(0, 2) for _ in range(t)]  # small vocab: many shared prefixes
                k, v = kv_of_tokens(new_tokens, len(model[i]["k"]))
            else:
                new_tokens = None
                k, v = rand_kv(t)
            before = (list(pool.ref_counts), list(pool.free_block_ids))
            try:
                cache.append(seqs[i], k, v, token_ids=new_tokens)
            except BlockPoolExhaustedError:
                assert (list(pool.ref_counts), list(pool.free_block_ids)) == before
                assert cache.blocks_needed(seqs[i], t) > pool.num_free
                continue
            model[i]["k"] += list(k)
            model[i]["v"] += list(v)
            model[i]["tokens"] = tokens + new_tokens if new_tokens is not None and tokens is not None else None
        elif op == "fork":
            i = rng.choice(list(seqs))
            m = model[i]
            new_entry(cache.fork(seqs[i]), list(m["k"]), list(m["v"]),
                      None if m["tokens"] is None else list(m["tokens"]))
        else:
            i = rng.choice(list(seqs))
            cache.release(seqs.pop(i))
            del model[i]

        check_invariants(cache, list(seqs.values()))
        for i, seq in seqs.items():
            rk, rv = cache.read(seq)
            m = model[i]
            assert seq.length == len(m["k"])
            if m["k"]:
                assert torch.equal(rk, torch.stack(m["k"])) and torch.equal(rv, torch.stack(m["v"]))
            if m["tokens"] is not None:
                assert seq.token_ids == m["tokens"]

    for seq in list(seqs.values()):
        cache.release(seq)
    assert pool.num_free == pool.num_blocks and sum(pool.ref_counts) == 0
    assert pool.hash_to_block_id == {}


def test_the_allocator_alone_keeps_ids_counts_free_list_and_prefix_index_without_storage():
    alloc = BlockAllocator(3, 2)
    assert not hasattr(alloc, "k") and isinstance(BlockPool(3, 2, H, D), BlockAllocator)
    a, b = alloc.allocate(), alloc.allocate()
    assert (a, b, alloc.num_free, alloc.ref_counts) == (0, 1, 1, [1, 1, 0])
    h = alloc.register_full_block(a, [5, 6], None)
    alloc.register_full_block(b, [7, 8], h)
    assert alloc.lookup_prefix([5, 6, 7, 8, 9]) == [a, b] and alloc.ref_counts == [1, 1, 0]
    assert alloc.acquire_prefix([5, 6, 7]) == [a] and alloc.ref_counts == [2, 1, 0]
    assert alloc.decref(a) == 1 and alloc.decref(b) == 0
    assert list(alloc.free_block_ids) == [2, 1] and alloc.lookup_prefix([5, 6, 7, 8]) == [a]
    assert (alloc.allocate(), alloc.allocate()) == (2, 1)
    with pytest.raises(BlockPoolExhaustedError, match="BlockAllocator exhausted: all 3 blocks of 2 positions"):
        alloc.allocate()
    with pytest.raises(ValueError, match="BlockAllocator num_blocks"):
        BlockAllocator(0, 2)
    with pytest.raises(ValueError, match="block_id 2 is free"):
        BlockAllocator(3, 2).incref(2)


def test_new_sequence_takes_its_prefix_blocks_through_the_allocator():
    pool, cache = make(num_blocks=4, block_size=2)
    a = cache.new_sequence()
    cache.append(a, *kv_of_tokens([1, 2, 3, 4, 5], 0), token_ids=[1, 2, 3, 4, 5])
    b = cache.new_sequence([1, 2, 3, 4, 9])
    assert b.block_table == a.block_table[:2] and b.length == 4 and b.token_ids == [1, 2, 3, 4]
    assert [pool.ref_counts[i] for i in a.block_table] == [2, 2, 1]
