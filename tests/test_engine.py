"""The serving engine's contract (course_lib.engine): every request's tokens equal its solo greedy run,
whatever is served beside it, through forced preemptions and prefix hits; bitwise logits in batch-invariant
mode; no block leaks; the budget and the pool respected in every iteration; bad input refused without loss.

Toy model, small blocks and a fake timer (each read of the clock advances it 10 ms), so the schedules are
reproducible and the tests fast."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from course_lib.engine import Engine, TraceRequest
from course_lib.models.decoder import generate_cached, toy_decoder
from course_lib.scheduling import RequestTooLargeError, metrics
from course_lib.scheduling.workload import RequestRecord


@pytest.fixture(scope="module")
def model():
    return toy_decoder()


def fake_timer(step: float = 0.01):
    counter = itertools.count()
    return lambda: next(counter) * step


def prompts_of(model, lengths, seed=0, prefix=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        p = torch.randint(0, model.config.vocab_size, (n,), generator=g)
        out.append(p if prefix is None else torch.cat([prefix, p]))
    return out


def solo(model, prompt, n):
    return generate_cached(model, prompt, n)


def serve(model, prompts, news, arrivals=None, **kwargs):
    kwargs.setdefault("timer", fake_timer())
    engine = Engine(model, audit=True, **kwargs)
    arrivals = arrivals or [0.0] * len(prompts)
    records = engine.run([(a, p, n) for a, p, n in zip(arrivals, prompts, news)])
    return engine, records


def assert_tokens_equal_solo(model, engine, prompts, news):
    for rid, (p, n) in enumerate(zip(prompts, news)):
        tokens, _ = solo(model, p, n)
        assert torch.equal(engine.output_ids(rid), tokens), f"request {rid} differs from its solo run"


def assert_accounting(engine):
    blocks = engine.blocks
    if blocks.radix is not None:        # the tree keeps finished requests' full blocks, one reference each
        cached = {b for node in blocks.radix.nodes() for b in node.blocks}
        assert blocks.num_free + len(cached) == engine.num_blocks, "blocks leaked after the trace"
        assert all(c == (b in cached) for b, c in enumerate(blocks.allocator.ref_counts))
        assert blocks.radix.evictable_blocks == len(cached), "a finished request still locks its path"
        assert sorted(blocks.evict(len(cached))) == sorted(cached)
    assert engine.blocks.num_free == engine.num_blocks, "blocks leaked after the trace"
    assert all(c == 0 for c in engine.blocks.allocator.ref_counts)
    for report in engine.history:
        if engine.budget is not None:
            assert report.tokens <= engine.budget
    # every block back on the free list exactly once (a double free would list one twice)
    assert sorted(engine.blocks.allocator.free_block_ids) == list(range(engine.num_blocks))


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_a_mixed_trace_with_preemptions_gives_every_request_its_solo_tokens(model, prefix_cache):
    prompts = prompts_of(model, [5, 17, 33, 1, 40, 16, 3, 29])
    news = [7, 12, 5, 9, 20, 3, 15, 8]
    engine, records = serve(model, prompts, news, arrivals=[0.02 * i for i in range(8)], num_blocks=20, block_size=4,
                            budget=24, max_running=4, prefix_cache=prefix_cache)
    preemptions = sum(r.preemptions for r in records)
    assert preemptions >= 3, "the pool is meant to be too small: preemptions must happen"
    assert sum(len(r.preempted) for r in engine.history) == preemptions
    assert_tokens_equal_solo(model, engine, prompts, news)
    assert_accounting(engine)
    assert max(r.tokens for r in engine.history) == 24          # the budget was the binding limit somewhere


def test_records_are_lab3_records_and_metrics_read_them(model):
    prompts = prompts_of(model, [6, 9, 4])
    news = [5, 1, 8]
    engine, records = serve(model, prompts, news, arrivals=[0.0, 0.05, 0.3], num_blocks=16, block_size=4,
                            budget=16, max_running=4)
    assert all(isinstance(r, RequestRecord) for r in records)
    assert [r.output for r in records] == news and [r.prompt for r in records] == [6, 9, 4]
    for r in records:
        assert len(r.token_times) == r.output and np.all(np.diff(r.token_times) > 0) and r.ttft > 0
    m = metrics(records)
    assert m["throughput"] > 0 and m["ttft50"] > 0
    # the third request arrives after the others finished: the idle engine jumps to its arrival
    assert records[2].token_times[0] > 0.3


def test_decode_and_prefill_share_iterations_and_each_chunk_yields_tokens_right(model):
    prompts = prompts_of(model, [3, 30])
    engine, _ = serve(model, prompts, [12, 4], arrivals=[0.0, 0.035], num_blocks=24, block_size=4, budget=8,
                      max_running=4)
    mixed = [r for r in engine.history if any(k == 1 for k, _ in r.chunks) and any(k > 1 for k, _ in r.chunks)]
    assert mixed, "a decode and a prefill chunk must have run in the same iteration"
    assert_tokens_equal_solo(model, engine, prompts, [12, 4])


def test_prefix_hits_reuse_full_blocks_and_keep_tokens_equal(model):
    system = prompts_of(model, [12], seed=1)[0]
    prompts = prompts_of(model, [5, 9, 4, 13, 2], seed=2, prefix=system) + [system.clone()]
    news = [6, 4, 7, 5, 8, 9]
    engine, _ = serve(model, prompts, news, arrivals=[0.0] * 3 + [0.05] * 3, num_blocks=24, block_size=4, budget=16,
                      max_running=4)
    # the requests admitted once the system prompt's blocks are written and still live find them (those
    # admitted beside the first compute their own); the one whose prompt is exactly the system prompt
    # reuses only 8 of its 12 positions (its last position is always computed)
    assert engine.blocks.prefix_hits >= 2 * 12
    assert_tokens_equal_solo(model, engine, prompts, news)
    assert_accounting(engine)


def test_a_prompt_that_is_all_cached_blocks_still_computes_its_last_position(model):
    system = prompts_of(model, [8], seed=3)[0]
    prompts = [torch.cat([system, system[:3]]), system.clone()]
    engine, _ = serve(model, prompts, [3, 3], arrivals=[0.0, 0.005], num_blocks=12, block_size=4, budget=64,
                      max_running=2)
    assert engine.blocks.prefix_hits == 4                       # 2 full blocks cached, only the first reused
    assert_tokens_equal_solo(model, engine, prompts, [3, 3])


def test_preempted_requests_are_recomputed_from_prompt_and_generated_tokens(model):
    prompts = prompts_of(model, [10, 10, 10], seed=4)
    news = [30, 30, 30]
    engine, records = serve(model, prompts, news, num_blocks=16, block_size=4, budget=None, max_running=3)
    assert any(r.preemptions for r in records)
    readmitted = {rid for r in engine.history for rid in r.preempted}
    # a re-prefill chunk is longer than the prompt: prompt + tokens generated before the preemption
    assert any(k > 10 for r in engine.history for (k, _), rid in zip(r.chunks, r.rids) if rid in readmitted)
    assert_tokens_equal_solo(model, engine, prompts, news)
    assert_accounting(engine)


@pytest.mark.parametrize("budget", [7, None])
def test_batch_invariant_mode_gives_bitwise_solo_logits(model, budget):
    system = prompts_of(model, [8], seed=5)[0]
    prompts = prompts_of(model, [3, 11], seed=6, prefix=system) + prompts_of(model, [1, 19], seed=7)
    news = [6, 3, 9, 4]
    with model.batch_invariant_mode():
        engine, records = serve(model, prompts, news, arrivals=[0.0, 0.005, 0.01, 0.03], num_blocks=11, block_size=4,
                                budget=budget, max_running=3, keep_logits=True)
        for rid, (p, n) in enumerate(zip(prompts, news)):
            tokens, logits = solo(model, p, n)
            assert torch.equal(engine.output_ids(rid), tokens)
            assert torch.equal(torch.stack(engine.sequences[rid].logits), logits), f"request {rid} not bitwise"
    assert engine.blocks.prefix_hits > 0
    assert sum(r.preemptions for r in records) > 0, "the pool is meant to be too small: preemptions must happen"
    assert_accounting(engine)


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_prefix_hits_and_preemptions_in_one_trace_keep_tokens_equal(model, prefix_cache):
    system = prompts_of(model, [12], seed=1)[0]
    prompts = prompts_of(model, [5, 9, 4, 13, 2], seed=2, prefix=system) + [system.clone()]
    news = [6, 14, 7, 15, 8, 9]
    engine, records = serve(model, prompts, news, arrivals=[0.0] * 3 + [0.05] * 3, num_blocks=20, block_size=4,
                            budget=16, max_running=4, prefix_cache=prefix_cache)
    assert sum(r.preemptions for r in records) >= 2 and engine.blocks.prefix_hits >= 2 * 12
    assert_tokens_equal_solo(model, engine, prompts, news)
    assert_accounting(engine)


def test_the_radix_cache_keeps_a_finished_turns_blocks_for_the_next_and_evicts_when_the_pool_is_short(model):
    """A conversation: each turn's prompt extends the previous turn's, and arrives after it finished. The hash
    cache has forgotten the finished turn's blocks (nobody held them); the radix tree still has them. A small
    pool then makes the tree evict (least recently used first) while every request keeps its solo tokens."""
    first = prompts_of(model, [13], seed=11)[0]
    second = torch.cat([first, prompts_of(model, [6], seed=12)[0]])
    third = torch.cat([second, prompts_of(model, [5], seed=13)[0]])
    prompts, news, arrivals = [first, second, third], [3, 3, 3], [0.0, 1.0, 2.0]
    hits = {}
    for cache in ("hash", "radix"):
        engine, _ = serve(model, prompts, news, arrivals=arrivals, num_blocks=24, block_size=4, budget=None,
                          max_running=2, prefix_cache=cache)
        assert_tokens_equal_solo(model, engine, prompts, news)
        hits[cache] = engine.blocks.prefix_hits
    assert hits == {"hash": 0, "radix": 12 + 16}           # the second turn reuses 3 blocks, the third 4
    others = prompts_of(model, [17, 18, 19], seed=14)      # unrelated requests: the pool must make room for them
    engine, _ = serve(model, prompts + others, news + [3, 3, 3], arrivals=arrivals + [3.0, 4.0, 5.0], num_blocks=8,
                      block_size=4, budget=None, max_running=1, prefix_cache="radix")
    assert engine.blocks.radix.evicted_blocks > 0
    assert_tokens_equal_solo(model, engine, prompts + others, news + [3, 3, 3])
    assert_accounting(engine)


def test_without_batch_invariance_logits_are_close_not_necessarily_bitwise(model):
    prompts = prompts_of(model, [9, 14, 5], seed=8)
    engine, _ = serve(model, prompts, [5, 5, 5], num_blocks=16, block_size=4, budget=12, max_running=3,
                      keep_logits=True)
    for rid, p in enumerate(prompts):
        _, logits = solo(model, p, 5)
        torch.testing.assert_close(torch.stack(engine.sequences[rid].logits), logits, rtol=1e-4, atol=1e-4)


def test_blocks_freed_by_one_request_are_reused_by_the_next(model):
    prompts = prompts_of(model, [14, 14, 14], seed=9)
    engine, _ = serve(model, prompts, [4, 4, 4], arrivals=[0.0, 1.0, 2.0], num_blocks=6, block_size=4, budget=None,
                      max_running=1)
    # each request alone needs 5 of the 6 blocks: the second and third run in the blocks the first freed
    assert_tokens_equal_solo(model, engine, prompts, [4, 4, 4])
    assert_accounting(engine)


def test_step_reports_and_add_request_queue_a_later_arrival(model):
    engine = Engine(model, num_blocks=8, block_size=4, budget=16, max_running=2, timer=fake_timer())
    rid = engine.add_request([1, 2, 3], 2, arrival=0.5)
    assert engine.has_work
    report = engine.step()                                       # idle: the clock jumps to 0.5, then it prefills
    assert report.start == 0.5 and report.chunks == ((3, 0),) and report.emitted[0][0] == rid
    report = engine.step()
    assert report.chunks == ((1, 3),)
    assert engine.step() is None and not engine.has_work
    assert engine.output_ids(rid).shape == (2,)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_blocks=4, max_running=4), ValueError, "num_blocks"),
    (dict(num_blocks=8, block_size=0), ValueError, "block_size"),
    (dict(num_blocks=8, budget=0), ValueError, "budget"),
    (dict(num_blocks=8, max_running=1.5), TypeError, "max_running"),
    (dict(num_blocks=8, timer=3), TypeError, "timer"),
    (dict(num_blocks=8, prefix_cache="lru"), ValueError, r"prefix_cache must be one of \['hash', 'radix'\]"),
])
def test_engine_arguments_are_checked(model, kwargs, error, match):
    kwargs.setdefault("max_running", 2)
    with pytest.raises(error, match=match):
        Engine(model, **kwargs)


def test_bad_requests_are_refused_and_a_refused_trace_leaves_the_engine_unchanged(model):
    engine = Engine(model, num_blocks=6, block_size=4, budget=16, max_running=2, timer=fake_timer())
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request([], 3)
    with pytest.raises(ValueError, match="prompt_ids"):
        engine.add_request([vocab], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.add_request([1], 0)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.add_request([1] * (model.config.max_seq_len + 1), 1)
    with pytest.raises(ValueError, match="arrival"):
        engine.add_request([1], 2, arrival=-1.0)
    with pytest.raises(RequestTooLargeError, match="more blocks"):
        engine.add_request(list(range(16)), 4)                   # 19 positions > 0.99 * (6 - 2) * 4
    with pytest.raises(TypeError, match="trace"):
        engine.run([(0.0, [1, 2], 2), "oops"])
    with pytest.raises(ValueError):
        engine.run([TraceRequest(0.0, [1, 2], 2), TraceRequest(0.0, [1], -1)])
    assert engine.sequences == [] and not engine.has_work
    records = engine.run([TraceRequest(0.0, [1, 2], 2)])
    assert len(records) == 1 and engine.output_ids(0).shape == (2,)


@pytest.mark.parametrize("readings, error", [([0.0, -1.0], ValueError), ([0.0, "1"], TypeError),
                                             ([0.0, float("nan")], TypeError)])
def test_a_timer_that_goes_backwards_or_returns_a_non_number_stops_the_run(model, readings, error):
    clock = iter(readings)
    engine = Engine(model, num_blocks=8, block_size=4, budget=16, max_running=2, timer=lambda: next(clock))
    engine.add_request([1, 2, 3], 2)
    with pytest.raises(error, match="timer"):
        engine.step()


# -- the Triton paged-attention kernel inside the engine (Triton's interpreter on CPU) -------------------------
from kernel_interpreter import run_kernel_tests_in_interpreter  # noqa: E402

from course_lib.kernels import triton_mode  # noqa: E402

MODE = triton_mode()


@pytest.mark.skipif(MODE not in ("native", "interpreter"),
                    reason=f"triton mode here is {str(MODE)!r}; runs in test_interpreter_subprocess")
def test_triton_kernel_engine_decodes_give_solo_tokens():
    from course_lib.kernels.paged_attention import paged_decode_kernel_unchecked

    model = toy_decoder(n_layers=2)
    prompts = prompts_of(model, [5, 18, 9], seed=10)
    news = [6, 4, 7]
    engine, _ = serve(model, prompts, news, arrivals=[0.0, 0.0, 0.02], num_blocks=16, block_size=4, budget=12,
                      max_running=3, decode_attention=paged_decode_kernel_unchecked)
    assert sum(len(r.chunks) for r in engine.history if all(k == 1 for k, _ in r.chunks)) > 5
    assert_tokens_equal_solo(model, engine, prompts, news)
    assert_accounting(engine)


@pytest.mark.slow
def test_interpreter_subprocess():
    run_kernel_tests_in_interpreter(__file__)


# ---------------------------------------------------------------- bad input loses nothing
def test_block_manager_refuses_a_commit_past_its_reserved_blocks_and_keeps_the_sequence(model):
    from course_lib.engine.block_manager import BlockManager
    from course_lib.engine.sequence import Sequence

    manager = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(0, list(range(10)), 3, 0.0)
    manager.admit(seq)
    manager.reserve(seq, 5)                       # 2 blocks: room for 8 positions
    table, length = list(seq.paged.block_table), seq.paged.length
    for n, match in ((9, r"n_new must be an int in \[0, 8\]"), (-1, r"n_new must be an int in \[0, 8\]"),
                     (2.0, "n_new must be an int")):
        with pytest.raises(ValueError, match=match):
            manager.commit(seq, n)
        assert seq.paged.block_table == table and seq.paged.length == length and seq.paged.token_ids == []
    manager.commit(seq, 5)
    assert seq.paged.length == 5
    with pytest.raises(ValueError, match="n_new must be an int >= 0"):
        manager.reserve(seq, -3)
    for call in (manager.reserve, manager.commit):
        with pytest.raises(TypeError, match="seq must be a Sequence"):
            call("not a sequence", 1)
    for call in (manager.admit, manager.free):
        with pytest.raises(TypeError, match="seq must be a Sequence"):
            call(object())
    manager.audit([seq])


def test_engine_refuses_an_arrival_in_the_past_and_a_decode_attention_that_is_not_callable(model):
    with pytest.raises(TypeError, match="decode_attention must be None or a callable"):
        Engine(model, num_blocks=32, decode_attention="x")
    ticks = itertools.count()
    engine = Engine(model, num_blocks=32, block_size=4, timer=lambda: next(ticks) * 0.5)
    engine.run([(0.0, [1, 2, 3], 2)])
    assert engine.clock > 0
    for early in (0.0, engine.clock - 0.1):
        with pytest.raises(ValueError, match="cannot arrive before now"):
            engine.add_request([1, 2], 2, early)
    before = len(engine.sequences)
    with pytest.raises(ValueError, match="cannot arrive before now"):
        engine.run([(engine.clock + 1, [1, 2], 2), (0.0, [3, 4], 2)])
    assert len(engine.sequences) == before          # the refused trace left nothing behind
    rid = engine.add_request([1, 2], 2, engine.clock)
    assert engine.sequences[rid].arrival == engine.clock



def test_the_shared_prefix_trace_shows_where_the_two_prefix_caches_differ(model):
    from course_lib.engine.prefix_trace import KINDS, compare_prefix_caches, shared_prefix_trace

    trace = shared_prefix_trace(model, seed=0, conversations=1, questions=2, branches=2, branch_gap=0.02)
    assert [k for *_, k in trace].count("conversation") == 3
    rows = {(r["cache"], r["kind"]): r for r in compare_prefix_caches(model, trace, timer=fake_timer)}
    # a later turn or question arrives after the earlier one finished: only the radix tree still has its blocks
    for kind in ("conversation", "few-shot"):
        assert rows["hash", kind]["reused"] == 0 < rows["radix", kind]["reused"]
    # branches arrive while the first still runs: both caches find the shared blocks
    assert rows["hash", "branch"]["reused"] == rows["radix", "branch"]["reused"] > 0
    for kind in KINDS:          # what is not reused is computed (no preemption here)
        assert rows["hash", kind]["reused"] + rows["hash", kind]["computed"] == \
            rows["radix", kind]["reused"] + rows["radix", kind]["computed"]
    small = compare_prefix_caches(model, trace, num_blocks=18, max_running=2, timer=fake_timer)
    assert [r["evicted_blocks"] for r in small if r["cache"] == "radix"][0] > 0
