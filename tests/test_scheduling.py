"""Lab 3 scheduling library (``docs/scheduling.md``).

Expected numbers are typed in from the reference figures of ``docs/scheduling.md`` or derived
here by hand arithmetic written out in the test, never obtained by calling the simulator under
test. The fast simulator (``run_trace``) is also compared bit for bit with the readable
per-iteration one (``run_reference``) on many seeded traces.
"""
from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

import course_lib.scheduling.capacity_search as capacity_module
from course_lib.hardware import DEVICES, REFERENCE_DEVICES, Device
from course_lib.roofline import CASE_WEIGHT_BYTES, case_model, n_matmul
from course_lib.scheduling import (
    CHUNK_BUDGET, MAX_RUNNING, POLICIES, PROFILES, Deployment, Request, RequestRecord, RequestTooLargeError,
    StepPlan, admit, break_even_tokens_per_day, capacity, chunked_step, cost_per_million_tokens, evictions,
    iteration_time, iteration_work, joules_per_token, make_bursty_workload, make_workload, meets_targets, metrics,
    owned_dollars_per_hour, plan_chunks, run_reference, run_trace, run_with_step, simulate, static_batch,
    utilisation_for_volume,
)

APPROX = dict(rel=1e-12, abs=1e-12)

# The default deployment: the case model on 24GB-1.0 at 50 % MFU, 16e9 B of KV budget.
CASE = Deployment()


def small(kv_budget: float, *, bandwidth: float, peak_flops: float, **model) -> Deployment:
    """A deployment on a small device with just the memory its weights and KV budget take, used at
    full peak (mfu 1); ``model``: n_matmul, n_layers, d_model, attention_width (default d_model),
    kv_bytes_per_token, weight_bytes."""
    device = Device("small", memory=model["weight_bytes"] + kv_budget, bandwidth=bandwidth, peak_flops=peak_flops)
    return Deployment(device=device, mfu=1.0, kv_budget=kv_budget, **model)


# A small deployment whose times are easy to write out: 1 KV byte per token, so the KV budget is
# a token count; time = max((1000 + context) / 1000, (2 * positions + 4 * attention) / 10000).
# Decodes (one-position chunks (1, c): attention c + 1, context c) are memory-bound on their
# own, long prefill chunks compute-bound.
def tiny(kv_budget: float) -> Deployment:
    return small(kv_budget, bandwidth=1000.0, peak_flops=10000.0, kv_bytes_per_token=1, n_matmul=1, n_layers=1,
                 d_model=1, weight_bytes=1000.0)


def times_of(records):
    return [list(r.token_times) for r in records]


def assert_times(records, expected):
    got = times_of(records)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == pytest.approx(e, **APPROX), f"request {i}: got {g}, expected {e}"


# -- cost model ------------------------------------------------------------------------------
def test_deployment_defaults_are_the_case_model_on_24gb_1():
    d = Deployment()
    assert d.device is REFERENCE_DEVICES["24GB-1.0"] and d.mfu == 0.5
    assert (d.kv_budget, d.device.bandwidth, d.usable_flops, d.kv_bytes_per_token) == (16e9, 1e12, 0.5 * 165e12,
                                                                                       147_456)
    assert (d.n_matmul, d.n_layers, d.d_model, d.weight_bytes) == (8_927_875_072, 36, 4096, 5.5e9)
    assert d.attention_width == 32 * 128 == 4096   # the case model's n_h * d_head, equal to its d
    # and they are the roofline module's case model and Lab 1's free memory, not retyped copies
    assert d.n_matmul == n_matmul(case_model()) and d.weight_bytes == CASE_WEIGHT_BYTES
    assert d.kv_budget == d.device.memory - d.weight_bytes - 2.5e9
    assert d.kv_tokens == 108_506  # floor(16e9 / 147456)


def test_profiles_match_the_lab():
    assert list(PROFILES) == ["24GB-bf16", "24GB-int8", "H100-bf16", "L4-bf16"]
    base = PROFILES["24GB-bf16"]
    assert base.deployment == Deployment() and base.dollars_per_hour == 1.00
    int8 = PROFILES["24GB-int8"]
    assert int8.deployment.kv_bytes_per_token == 73_728 and int8.dollars_per_hour == 1.00
    assert int8.deployment.kv_budget == 16e9
    h100 = PROFILES["H100-bf16"].deployment
    assert h100.device is DEVICES["H100 SXM"]
    assert (h100.kv_budget, h100.device.bandwidth, h100.usable_flops) == (72e9, 3.35e12, 0.5 * 989e12)
    assert PROFILES["H100-bf16"].dollars_per_hour == 2.50
    l4 = PROFILES["L4-bf16"].deployment
    assert l4.device is REFERENCE_DEVICES["24GB-0.3"]
    assert (l4.kv_budget, l4.device.bandwidth, l4.usable_flops, l4.kv_bytes_per_token) == (16e9, 0.30e12,
                                                                                           0.5 * 121e12, 147_456)
    assert PROFILES["L4-bf16"].dollars_per_hour == 0.80


def test_reference_figures_of_the_cost_model():
    assert round(iteration_time([], [(4000, 0)], CASE), 3) == 0.923
    assert round(iteration_time([5000] * 18, [], CASE) * 1e3, 2) == 18.77
    assert round(iteration_time([5000] * 17, [(512, 0)], CASE) * 1e3, 2) == 116.04
    assert round(iteration_time([5000] * 17, [(512, 2000)], CASE) * 1e3, 2) == 123.36
    assert round(iteration_time([5000] * 17, [(128, 0)], CASE) * 1e3, 2) == 32.05
    assert round(iteration_time([5000] * 17, [(128, 2000)], CASE) * 1e3, 2) == 33.88


def test_reference_figures_hold_with_decodes_as_one_position_chunks():
    # The continuous policies run a decode as a chunk (1, c): one more attention pair, the same
    # bytes (KV/token * its cached length c). Every figure keeps its rounded value.
    decodes = [(1, 5000)] * 17
    assert round(iteration_time([], [(1, 5000)] * 18, CASE) * 1e3, 2) == 18.77   # memory-bound: bytes unchanged
    assert iteration_time([], [(1, 5000)] * 18, CASE) == iteration_time([5000] * 18, [], CASE)
    for chunk, figure in [((512, 0), 116.04), ((512, 2000), 123.36), ((128, 0), 32.05), ((128, 2000), 33.88)]:
        assert round(iteration_time([], decodes + [chunk], CASE) * 1e3, 2) == figure
    # by hand: 17 more attention pairs, 4 * 36 * 4096 * 17 FLOPs at 0.5 * 165e12 FLOP/s
    assert iteration_time([], decodes + [(512, 2000)], CASE) - iteration_time([5000] * 17, [(512, 2000)], CASE) == \
        pytest.approx(4 * 36 * 4096 * 17 / (0.5 * 165e12), rel=1e-6)


def test_iteration_time_formula_by_hand():
    d = tiny(1e6)
    # 2 decodes at 100 and 50, one chunk of 10 on 20 cached: positions 12,
    # attention 150 + 10*20 + 55 = 405, context 150 + 20 = 170
    assert iteration_time([100, 50], [(10, 20)], d) == max((1000 + 170) / 1000, (2 * 12 + 4 * 405) / 10000)
    # a compute-bound chunk: positions 300, attention 300*301/2 = 45150
    assert iteration_time([], [(300, 0)], d) == (2 * 300 + 4 * 45150) / 10000
    # max of the two times, never their sum
    assert iteration_time([7], [], d) == (1000 + 7) / 1000


def test_iteration_time_counts_attention_with_the_attention_width():
    # attention_width (n_h * d_head) 3 on a model of width d 1: the attention term is 4 * L * 3 * attention
    d = small(1e6, bandwidth=1000.0, peak_flops=10000.0, kv_bytes_per_token=1, n_matmul=1, n_layers=2,
              d_model=1, attention_width=3, weight_bytes=1000.0)
    # one chunk of 300 on 0 cached: positions 300, attention 300*301/2 = 45150, compute-bound
    assert iteration_time([], [(300, 0)], d) == (2 * 300 + 4 * 2 * 3 * 45150) / 10000
    assert iteration_time([], [(300, 0)], d) != (2 * 300 + 4 * 2 * 1 * 45150) / 10000   # not with d_model
    # left out, it takes d_model
    assert tiny(1e6).attention_width == 1 and Deployment(d_model=1024).attention_width == 1024
    # the Qwen3-0.6B-shaped model of docs/roofline.md#flops-per-token (28 layers, d 1,024, 16 heads of 128,
    # N_matmul 596,042,752): one decode at context 4,096 is 2 * 596,042,752 + 4 * 28 * 2048 * 4096 FLOPs
    qwen = Deployment(n_matmul=596_042_752, n_layers=28, d_model=1024, attention_width=16 * 128,
                      kv_bytes_per_token=2 * 28 * 8 * 128 * 2, weight_bytes=1.2e9)
    assert iteration_work(positions=1, attention=4096, context=4096, deployment=qwen)[1] == 2_131_609_600


def test_fast_matches_reference_when_the_attention_width_differs_from_d_model():
    for width, policy in [(3, "chunked"), (5, "paged"), (2, "static")]:
        deployment = small(3000.0, bandwidth=1e3, peak_flops=1e5, kv_bytes_per_token=1, n_matmul=2, n_layers=1,
                           d_model=1, attention_width=width, weight_bytes=1000.0)
        reqs = random_trace(random.Random(width), 12)
        assert_identical(run_trace(reqs, policy, deployment), run_reference(reqs, policy, deployment))


@pytest.mark.parametrize("decodes, chunks, error", [
    ([-1], [], ValueError), ([], [(0, 5)], ValueError), ([], [(5, -1)], ValueError), ([], [], ValueError),
    ([1.5], [], TypeError), (["3"], [], TypeError), ([], [(5,)], TypeError), ([], [(5.0, 1)], TypeError),
    (5, [], TypeError), ([], "ab", TypeError), ([True], [], TypeError),
])
def test_iteration_time_rejects_bad_input(decodes, chunks, error):
    with pytest.raises(error):
        iteration_time(decodes, chunks, CASE)


def test_iteration_time_rejects_bad_deployment():
    with pytest.raises(TypeError, match="Deployment"):
        iteration_time([1], [], deployment="24GB")
    with pytest.raises(TypeError):
        iteration_time([1], [])   # the deployment is required, as in the lab's exercise
    with pytest.raises(ValueError, match="kv_budget"):
        Deployment(kv_budget=-1)
    with pytest.raises(TypeError, match="kv_bytes_per_token"):
        Deployment(kv_bytes_per_token="big")
    with pytest.raises(ValueError, match="mfu"):
        Deployment(mfu=1.5)
    with pytest.raises(ValueError, match="attention_width"):
        Deployment(attention_width=0)
    with pytest.raises(TypeError, match="attention_width"):
        Deployment(attention_width="2048")
    with pytest.raises(TypeError, match="device"):
        Deployment(device="24GB-1.0")
    with pytest.raises(ValueError, match="exceed the memory"):
        Deployment(kv_budget=20e9)   # 5.5e9 B of weights + 20e9 B > 24e9 B


def test_cost_per_million_tokens():
    assert cost_per_million_tokens(500.0, 1.00) == pytest.approx(1.00 / 3600 / 500 * 1e6)
    with pytest.raises(ValueError, match="tokens_per_s"):
        cost_per_million_tokens(0.0, 1.0)


def test_cost_per_million_tokens_divides_by_the_utilisation():
    # $1.80/h = $0.0005/s; 500 tok/s busy a quarter of the time = 125 tok/s paid for: $4 per million
    assert cost_per_million_tokens(500.0, 1.80, 0.25) == pytest.approx(4.0, **APPROX)
    assert cost_per_million_tokens(500.0, 1.80, 1.0) == pytest.approx(1.0, **APPROX)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="utilisation"):
            cost_per_million_tokens(500.0, 1.80, bad)


def test_volume_break_even_and_owned_device_by_hand():
    assert utilisation_for_volume(43.2e6, 1000.0) == pytest.approx(0.5, **APPROX)   # 1,000 tok/s: 86.4e6 a day
    with pytest.raises(ValueError, match="more than one device"):
        utilisation_for_volume(90e6, 1000.0)
    # $1/h is $24 a day; at $0.20 per million that buys 120 million tokens a day
    assert break_even_tokens_per_day(1.0, 0.20) == pytest.approx(120e6, **APPROX)
    # $26,280 over one year of 8,760 h is $3/h; 1 kW at $0.10/kWh is $0.10/h
    assert owned_dollars_per_hour(purchase_dollars=26_280, watts=1000, dollars_per_kwh=0.10, years=1) == \
        pytest.approx(3.1, **APPROX)
    assert owned_dollars_per_hour(purchase_dollars=26_280, watts=500, dollars_per_kwh=0.0) == pytest.approx(
        1.0 + 0.0, **APPROX)   # three years by default
    assert joules_per_token(700, 3500) == pytest.approx(0.2, **APPROX)
    with pytest.raises(ValueError, match="watts"):
        joules_per_token(0, 10)
    with pytest.raises(ValueError, match="dollars_per_kwh"):
        owned_dollars_per_hour(purchase_dollars=1, watts=1, dollars_per_kwh=-1)


# -- static batching with a memory check -----------------------------------------------------------
def test_static_batch_counts_what_fits():
    assert static_batch([10] * 20, limit=None) == 16
    assert static_batch([10] * 3, limit=None) == 3
    # charges prompt + 4000: 6000 fits in 15,000, 6000 + 10,000 does not
    assert static_batch([2000, 6000, 1000], limit=15_000) == 1
    assert static_batch([7000], limit=10_000) == 0
    assert static_batch([100] * 20, limit=10 ** 9) == 16


def test_golden_static_checked_dispatches_what_fits():
    # KV budget 10,000 positions: admission limit 9,900; each request is charged 10 + 4000 = 4010,
    # so two fit and the third does not. At 0.2 s the queue holds three: the batch is full (C does
    # not fit), A and B leave at once; C runs alone at its own deadline 0.2 + 2 = 2.2 s.
    reqs = [Request(0.0, 10, 1), Request(0.1, 10, 1), Request(0.2, 10, 1)]
    prefill2 = max(1000 / 1000, (2 * 20 + 4 * 2 * 55) / 10000)   # 1.0 s, memory-bound
    expected = [[0.2 + prefill2], [0.2 + prefill2], [2.2 + 1.0]]
    assert_times(run_trace(reqs, "static-checked", tiny(10_000)), expected)
    assert_times(run_reference(reqs, "static-checked", tiny(10_000)), expected)
    # unchecked, the three wait for A's 2 s deadline and go together
    assert_times(run_trace(reqs, "static", tiny(10_000)), [[3.0]] * 3)


def test_static_checked_refuses_a_request_that_can_never_fit():
    reqs = [Request(0.0, 10, 1)]   # 4010 positions > 0.99 * 4000
    for run in (run_trace, run_reference):
        with pytest.raises(RequestTooLargeError, match="static-checked"):
            run(reqs, "static-checked", tiny(4000))


# -- bursty arrivals ----------------------------------------------------------------------------------
def test_bursty_workload_keeps_the_requests_and_the_mean_rate():
    smooth, bursty = make_workload(0.2), make_bursty_workload(0.2)
    assert [(r.prompt, r.output) for r in bursty] == [(r.prompt, r.output) for r in smooth]
    assert [r.arrival for r in bursty] == sorted(r.arrival for r in bursty)
    # short on periods (2 s, 4 requests each on average): 15,000 on/off cycles, so the mean rate is
    # within a few standard errors (about 0.7 %) of its expectation
    many = make_bursty_workload(0.5, count=60_000, seed=1, on_seconds=2.0)
    assert len(many) / many[-1].arrival == pytest.approx(0.5, rel=0.03)
    gaps = np.diff([0.0] + [r.arrival for r in make_bursty_workload(0.5, count=20_000, seed=1)])
    assert gaps.std() / gaps.mean() > 2           # bursty: a Poisson process has a coefficient of variation of 1
    poisson = np.diff([0.0] + [r.arrival for r in make_bursty_workload(0.5, count=20_000, on_fraction=1.0)])
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, abs=0.05)


def test_bursty_workload_draw_order_by_hand():
    rng = random.Random("on-off 0")
    end = rng.expovariate(1 / 20.0)                 # the first on period
    first = rng.expovariate(0.2 / 0.25)             # a gap at four times the mean rate
    assert first < end                              # (true for this seed)
    assert make_bursty_workload(0.2)[0].arrival == first
    for bad in (0.0, 1.01):
        with pytest.raises(ValueError, match="on_fraction"):
            make_bursty_workload(0.2, on_fraction=bad)


def test_simulate_serves_the_bursty_workload():
    assert simulate(0.2, "chunked", count=40, arrivals="on-off") == metrics(
        run_trace(make_bursty_workload(0.2, 40), "chunked"))
    with pytest.raises(ValueError, match="arrivals"):
        simulate(0.2, "chunked", arrivals="bursty")


# -- workload ----------------------------------------------------------------------------------
def test_workload_matches_the_reference_figures():
    w = make_workload(0.20)
    assert len(w) == 300
    assert round(statistics.mean(r.output for r in w), 1) == 1737.4
    assert round(300 / w[-1].arrival, 3) == 0.224
    assert all(2000 <= r.prompt <= 6000 and 16 <= r.output <= 4000 for r in w)
    assert [r.arrival for r in w] == sorted(r.arrival for r in w)


def test_workload_draw_order_by_hand():
    rng = random.Random(0)
    a = rng.expovariate(0.5)
    p = rng.randint(2000, 6000)
    o = min(4000, max(16, int(rng.lognormvariate(math.log(1500), 0.6))))
    assert make_workload(0.5, count=1)[0] == Request(a, p, o)


@pytest.mark.parametrize("kwargs, error", [
    (dict(rate=-0.1), ValueError), (dict(rate=0), ValueError), (dict(rate=math.inf), ValueError),
    (dict(rate=0.2, count=0), ValueError), (dict(rate=0.2, count=2.5), TypeError),
])
def test_workload_rejects_bad_input(kwargs, error):
    with pytest.raises(error):
        make_workload(**kwargs)


# -- golden traces, one per policy ------------------------------------------------------------
def test_golden_static():
    # A and B queue; the oldest (A, t=0) waits 2 s, so the batch [A, B] leaves at t=2.0.
    # C arrives during the batch, waits until its own 2 s deadline at 7.0, and runs alone.
    reqs = [Request(0.0, 100, 3), Request(0.5, 50, 2), Request(5.0, 20, 1)]
    t1 = 2.0 + max((1000 + 0) / 1000, (2 * 150 + 4 * (5050 + 1275)) / 10000)   # prefill 100 + 50: 2.56 s
    t2 = t1 + max((1000 + 150) / 1000, (2 * 2 + 4 * 150) / 10000)              # decode at 100, 50: 1.15 s
    t3 = t2 + max((1000 + 152) / 1000, (2 * 2 + 4 * 152) / 10000)              # B finished but its slot
    #                                                                            still decodes (101 + 51)
    t4 = 7.0 + max((1000 + 0) / 1000, (2 * 20 + 4 * 210) / 10000)              # C's prefill: memory-bound 1.0 s
    assert_times(run_trace(reqs, "static", tiny(1e6)), [[t1, t2, t3], [t1, t2], [t4]])
    assert (t1, t2, t3, t4) == pytest.approx((4.56, 5.71, 6.862, 8.0))


def test_golden_static_full_batch_dispatches_at_once():
    # 16 requests 0.1 s apart: the 16th (t=1.5) fills the batch before the 2 s deadline.
    # The 17th waits for the batch (it is static), then for its own deadline 1.6 + 2 = 3.6.
    reqs = [Request(0.1 * i, 10, 1) for i in range(17)]
    prefill16 = max(1000 / 1000, (2 * 160 + 4 * 16 * 55) / 10000)   # 1.0 s, memory-bound
    prefill1 = max(1000 / 1000, (2 * 10 + 4 * 55) / 10000)          # 1.0 s
    records = run_trace(reqs, "static", tiny(1e6))
    assert_times(records, [[0.1 * 15 + prefill16]] * 16 + [[0.1 * 16 + 2.0 + prefill1]])


def test_golden_reserve():
    # memory 5000 tokens: each request is charged prompt + 4000, so B (4040) cannot join A
    # (4300) under 0.99 * 5000 = 4950 and waits until A has finished. Each decode is a chunk
    # (1, c): attention c + 1, memory-bound here.
    reqs = [Request(0.0, 300, 3), Request(0.0, 40, 2)]
    a1 = max(1000 / 1000, (2 * 300 + 4 * (300 * 301 // 2)) / 10000)   # 18.12 s
    a2 = a1 + (1000 + 300) / 1000
    a3 = a2 + (1000 + 301) / 1000
    b1 = a3 + max(1000 / 1000, (2 * 40 + 4 * 820) / 10000)           # 1.0 s
    b2 = b1 + (1000 + 40) / 1000
    records = run_trace(reqs, "reserve", tiny(5000))
    assert_times(records, [[a1, a2, a3], [b1, b2]])
    assert [r.preemptions for r in records] == [0, 0]
    # paged charges what is used: both run together from the start
    assert run_trace(reqs, "paged", tiny(5000))[1].token_times[0] == pytest.approx(
        max(1000 / 1000, (2 * 340 + 4 * (45150 + 820)) / 10000), **APPROX)


def test_golden_paged_decode_attends_over_its_context_plus_itself():
    # A (100, 2) prefills alone; B (300 tokens, arrives at 0.5) joins beside A's decode. Paged has
    # no budget: the iteration runs A's one-position chunk (1, 100) and B's whole prompt (300, 0),
    # compute-bound, so A's attention term c + 1 = 101 shows in the time (c alone: 18.1602 s).
    reqs = [Request(0.0, 100, 2), Request(0.5, 300, 1)]
    t1 = max(1000 / 1000, (2 * 100 + 4 * 5050) / 10000)                          # 2.04
    t2 = t1 + max((1000 + 100) / 1000, (2 * 301 + 4 * (101 + 45150)) / 10000)    # 18.1606
    assert_times(run_trace(reqs, "paged", tiny(10_000)), [[t1, t2], [t2]])
    assert (t1, t2 - t1) == pytest.approx((2.04, 18.1606))


def test_golden_paged_preemption_reprefills_generated_tokens():
    # memory 395 tokens (admission 0.99 * 395 = 391.05): A (200) and B (190) both join.
    reqs = [Request(0.0, 200, 6), Request(0.0, 190, 5)]
    t1 = max(1000 / 1000, (2 * 390 + 4 * (20100 + 18145)) / 10000)   # both prefills: 15.376 s
    t2 = t1 + (1000 + 390) / 1000                                    # contexts 200 + 190 -> 392 <= 395
    t3 = t2 + (1000 + 392) / 1000                                    # -> 394 <= 395
    # iteration 4: 394 + 2 = 396 > 395: preempt B (the newest; it has generated 3); A decodes alone
    t4 = t3 + (1000 + 202) / 1000
    t5 = t4 + (1000 + 203) / 1000  # B waits: 204 + 193 > 391.05
    t6 = t5 + (1000 + 204) / 1000  # A's 6th token: A leaves
    # B is re-admitted and re-prefills prompt + generated = 193 positions, emitting its 4th token
    t7 = t6 + max(1000 / 1000, (2 * 193 + 4 * (193 * 194 // 2)) / 10000)   # 7.527 s
    t8 = t7 + (1000 + 193) / 1000
    records = run_trace(reqs, "paged", tiny(395))
    assert_times(records, [[t1, t2, t3, t4, t5, t6], [t1, t2, t3, t7, t8]])
    assert [r.preemptions for r in records] == [0, 1]
    assert metrics(records)["preemptions"] == 1


def test_golden_chunked_prefill_split():
    # A's 600-token prompt is prefilled in chunks of 256, 256, 88. B (arrives at 1.0) is
    # admitted at once but gets no budget (a chunk of 0 is skipped) until A's last chunk
    # leaves 168 positions: then both chunks run in one iteration and both emit a token.
    # Afterwards both decode as one-position chunks (1, 600) and (1, 100): memory-bound.
    reqs = [Request(0.0, 600, 3), Request(1.0, 100, 2)]
    t1 = max((1000 + 0) / 1000, (2 * 256 + 4 * (256 * 257 // 2)) / 10000)                  # 13.2096
    t2 = t1 + max((1000 + 256) / 1000, (2 * 256 + 4 * (256 * 256 + 32896)) / 10000)        # 39.424
    t3 = t2 + max((1000 + 512 + 0) / 1000, (2 * 188 + 4 * (88 * 512 + 3916 + 5050)) / 10000)   # 21.6464
    t4 = t3 + max((1000 + 700) / 1000, (2 * 2 + 4 * 700) / 10000)                          # decode 600, 100
    t5 = t4 + (1000 + 601) / 1000
    assert_times(run_trace(reqs, "chunked", tiny(10_000)), [[t3, t4, t5], [t3, t4]])
    assert (t1, t2 - t1, t3 - t2) == pytest.approx((13.2096, 39.424, 21.6464))


def test_golden_chunked_decodes_share_the_budget():
    # A (100, 3) prefills alone, then decodes. B (600 tokens, arrives at 0.5) joins in the second
    # iteration. Walking in admission order, A's one-position chunk takes 1 of the 256 positions
    # first, so B's chunks are 255, 255 and then the 90 left (not 256, 256, 88); A's decode
    # attends over its context plus itself (c + 1) in these compute-bound iterations.
    reqs = [Request(0.0, 100, 3), Request(0.5, 600, 2)]
    t1 = max(1000 / 1000, (2 * 100 + 4 * 5050) / 10000)                                            # 2.04
    t2 = t1 + max((1000 + 100) / 1000, (2 * 256 + 4 * (101 + 255 * 256 // 2)) / 10000)             # 13.1476
    t3 = t2 + max((1000 + 101 + 255) / 1000, (2 * 256 + 4 * (102 + 255 * 255 + 32640)) / 10000)   # 39.158
    t4 = t3 + max((1000 + 510) / 1000, (2 * 90 + 4 * (90 * 510 + 90 * 91 // 2)) / 10000)           # 20.016
    t5 = t4 + max((1000 + 600) / 1000, (2 * 1 + 4 * 601) / 10000)                                  # 1.6
    records = run_trace(reqs, "chunked", tiny(10_000))
    assert_times(records, [[t1, t2, t3], [t4, t5]])
    assert (t2 - t1, t3 - t2, t4 - t3) == pytest.approx((13.1476, 39.158, 20.016))
    assert_times(run_reference(reqs, "chunked", tiny(10_000)), [[t1, t2, t3], [t4, t5]])


def test_golden_chunked_preemption():
    # memory 365 (admission 361.35): A (300) and B (60) join at t=0; B waits for budget.
    # Decodes are one-position chunks (1, c), memory-bound here; each takes 1 of the 256.
    reqs = [Request(0.0, 300, 4), Request(0.0, 60, 5)]
    t1 = max(1000 / 1000, (2 * 256 + 4 * 32896) / 10000)                        # A: 256 of 300
    t2 = t1 + max((1000 + 256) / 1000, (2 * 104 + 4 * (44 * 256 + 990 + 1830)) / 10000)   # A: 44, B: 60
    t3 = t2 + (1000 + 360) / 1000   # contexts 300 + 60 -> 362 <= 365
    t4 = t3 + (1000 + 362) / 1000   # -> 364
    # iteration 5: 364 + 2 > 365: preempt B (newest, 3 tokens generated); A decodes alone
    t5 = t4 + (1000 + 302) / 1000   # A's 4th token: A leaves
    t6 = t5 + max(1000 / 1000, (2 * 63 + 4 * (63 * 64 // 2)) / 10000)   # B re-prefills 60 + 3 = 63
    t7 = t6 + (1000 + 63) / 1000
    records = run_trace(reqs, "chunked", tiny(365))
    assert_times(records, [[t2, t3, t4, t5], [t2, t3, t4, t6, t7]])
    assert [r.preemptions for r in records] == [0, 1]


# -- the chunked policy's scheduling step --------------------------------------------------------
def test_rules_by_hand():
    # admission: FIFO while used + required <= limit and there is room; the head blocks the rest
    assert admit(500, [300, 100, 50], limit=900, room=10) == 2      # 800, 900; then 950 > 900
    assert admit(500, [500, 10], limit=900, room=10) == 0           # the head blocks the 10
    assert admit(0, [10, 10, 10], limit=900, room=2) == 2
    # chunk planning: min(remaining, budget left) in admission order; decodes (1 left) take 1
    assert plan_chunks([1, 1, 300, 50], 256) == [1, 1, 254, 0]
    assert plan_chunks([300, 1], 256) == [256, 0]                   # a decode behind a prefill waits
    assert plan_chunks([300, 1], None) == [300, 1]
    # preemption: the newest go while cached + planned > capacity, re-planning the rest
    assert evictions([600, 399], [1, 1], budget=256, capacity=1000) == 1            # 999 + 2 > 1000; 600 + 1 fits
    assert evictions([600, 390], [1, 1], budget=256, capacity=1000) == 0            # 990 + 2 <= 1000
    assert evictions([1000], [1], budget=256, capacity=1000) == 1                   # not even alone


def test_step_admission_budget_and_skipped_chunk():
    d = tiny(1000)  # admission limit 990 positions, capacity 1000
    # one request decoding at 520 (target 521); the queue holds 400 and 10: both fit (920, 930 <= 990).
    # The decode takes 1 position of the budget, the first newcomer the other 255, the second a
    # chunk of 0 (skipped).
    plan = chunked_step([(520, 521)], [(400, 0), (10, 0)], d)
    assert plan == StepPlan(admitted=2, preempted=(), decodes=(), chunks=((0, 1), (1, 255)))
    # FIFO: a head that does not fit blocks the ones behind it
    assert chunked_step([(520, 521)], [(500, 0), (10, 0)], d) == StepPlan(0, (), (), ((0, 1),))
    # budget=None is the paged step: whole prefills (a re-prefill includes the generated tokens)
    assert chunked_step([], [(400, 0), (290, 10)], d, budget=None) == StepPlan(2, (), (), ((0, 400), (1, 300)))
    # the budget is walked in admission order and shared
    assert chunked_step([(100, 300), (0, 200)], [], d) == StepPlan(0, (), (), ((0, 200), (1, 56)))
    # decodes take a position each, in admission order, like any chunk
    assert chunked_step([(50, 51), (60, 61), (0, 300)], [], d, budget=3) == \
        StepPlan(0, (), (), ((0, 1), (1, 1), (2, 1)))
    assert chunked_step([(0, 300), (50, 51)], [], d, budget=3) == StepPlan(0, (), (), ((0, 3),))
    # max_running caps admission
    assert chunked_step([(5, 6)], [(10, 0)], d, max_running=1) == StepPlan(0, (), (), ((0, 1),))


def test_step_preempts_the_newest():
    d = tiny(1000)
    assert chunked_step([(600, 601), (390, 391)], [], d) == StepPlan(0, (), (), ((0, 1), (1, 1)))   # 992 <= 1000
    # 600 + 399 + 2 = 1001 > 1000: the newest (index 1) goes, not the oldest
    assert chunked_step([(600, 601), (399, 400)], [], d) == StepPlan(0, (1,), (), ((0, 1),))
    # preemption may need several victims, newest first: the newest (no cache yet, a 50-token
    # chunk) goes first, 999 + 2 > 1000 still, so the decoding one at 399 goes too
    assert chunked_step([(600, 601), (399, 400), (0, 50)], [], d) == StepPlan(0, (1, 2), (), ((0, 1),))


def test_step_cannot_fit():
    d = tiny(1000)
    with pytest.raises(RequestTooLargeError, match="queue head"):
        chunked_step([], [(981, 10)], d)
    with pytest.raises(RequestTooLargeError, match="outgrow"):
        chunked_step([(1000, 1001)], [], d)
    with pytest.raises(ValueError, match="nothing to schedule"):
        chunked_step([], [], d)
    with pytest.raises(TypeError):
        chunked_step([(1.5, 2)], [], d)
    with pytest.raises(ValueError, match="below its target"):   # a running request always has a position left
        chunked_step([(500, 500)], [], d)


# -- metrics --------------------------------------------------------------------------------
def record(arrival, times, preemptions=0):
    return RequestRecord(arrival, 10, len(times), np.array(times, dtype=np.float64), preemptions)


def test_metrics_by_hand():
    records = [
        record(0.0, [1.0, 1.05, 1.25]),          # TTFT 1.0, gaps 0.05 0.2, TPOT 0.25 / 2
        record(0.5, [2.0]),                      # TTFT 1.5, one token: no gap, TPOT undefined
        record(1.0, [5.0, 5.08, 5.16, 5.24], 1),  # TTFT 4.0, gaps 0.08 x 3, TPOT 0.24 / 3
        record(2.0, [2.5, 2.59]),                # TTFT 0.5, gap 0.09, TPOT 0.09
    ]
    m = metrics(records)
    # TTFT sorted 0.5 1.0 1.5 4.0; linear quantiles at positions 3q
    assert m["ttft50"] == pytest.approx(1.0 + 0.5 * (1.5 - 1.0))
    assert m["ttft99"] == pytest.approx(1.5 + 0.97 * (4.0 - 1.5))
    # ITL pooled over every gap: 0.05 0.08 0.08 0.08 0.09 0.2; positions 5q
    assert m["itl50"] == pytest.approx(0.08)
    assert m["itl99"] == pytest.approx(0.09 + 0.95 * (0.2 - 0.09))   # not the mean of per-request p99s
    assert m["itlmax"] == pytest.approx(0.2)
    assert m["tpot50"] == pytest.approx(0.09)                          # median of 0.125, 0.08, 0.09
    assert m["e2e50"] == pytest.approx((1.25 + 1.5) / 2)              # 0.59 1.25 1.5 4.24
    assert m["throughput"] == pytest.approx(10 / 5.24)                 # tokens / final clock
    assert m["goodput"] == pytest.approx(2 / 5.24)                     # the one-token answer and the last
    assert m["preemptions"] == 1
    assert m["realised"] == pytest.approx(4 / 2.0)
    assert list(m) == ["ttft50", "ttft99", "itl50", "itl99", "itlmax", "tpot50", "e2e50", "throughput",
                       "goodput", "preemptions", "realised"]


def test_metrics_one_token_answers_only():
    m = metrics([record(0.0, [1.0]), record(1.0, [3.0])])
    assert math.isnan(m["tpot50"]) and math.isnan(m["itl99"])
    assert m["ttft50"] == pytest.approx(1.5) and m["goodput"] == pytest.approx(2 / 3.0)


def test_metrics_rejects_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        metrics([])
    with pytest.raises(TypeError):
        metrics([(0.0, [1.0])])
    with pytest.raises(ValueError, match="token_times"):
        metrics([RequestRecord(0.0, 10, 3, np.array([1.0, 2.0]), 0)])
    with pytest.raises(ValueError, match="non-decreasing"):
        metrics([record(0.0, [2.0, 1.0])])
    with pytest.raises(ValueError, match="targets"):
        metrics([record(0.0, [1.0])], targets=(3.0,))


# -- bad input to the simulator -------------------------------------------------------------
def test_unknown_policy_names_the_valid_ones():
    for bad in ("fifo", "Chunked", None):
        with pytest.raises(ValueError, match="'static', 'reserve', 'paged', 'chunked'"):
            simulate(0.2, bad)
    with pytest.raises(ValueError, match="policy"):
        run_trace([Request(0.0, 10, 1)], "sjf")


def test_negative_rate():
    with pytest.raises(ValueError, match="rate"):
        simulate(-0.1, "chunked")


@pytest.mark.parametrize("policy, request_", [
    ("paged", Request(0.0, 1000, 5)),      # prompt alone exceeds 0.99 * 1000
    ("chunked", Request(0.0, 1000, 5)),
    ("reserve", Request(0.0, 10, 5)),      # 10 + 4000 reserved exceeds 990
    ("chunked", Request(0.0, 900, 200)),   # fits at admission, outgrows memory alone
    ("paged", Request(0.0, 900, 200)),
])
def test_request_that_cannot_fit(policy, request_):
    with pytest.raises(RequestTooLargeError, match="never"):
        run_trace([request_], policy, tiny(1000))


def test_bad_traces():
    with pytest.raises(ValueError, match="empty"):
        run_trace([], "paged")
    with pytest.raises(ValueError, match="arrival order"):
        run_trace([Request(1.0, 10, 2), Request(0.5, 10, 2)], "paged")
    with pytest.raises(ValueError, match="output"):
        Request(0.0, 10, 0)
    with pytest.raises(ValueError, match="output"):
        Request(0.0, 10, 4001)
    with pytest.raises(TypeError):
        run_trace([Request(0.0, 10, 2)], "paged", deployment=3)
    with pytest.raises(ValueError, match="profile"):
        run_trace([Request(0.0, 10, 2)], "paged", deployment="A100")


# -- the figures checked against an independent implementation -----------------------------------
def test_chunked_at_0_30_preempts_280_times():
    reqs = make_workload(0.30)
    assert simulate(0.30, "chunked")["preemptions"] == 280
    assert sum(r.preemptions for r in run_reference(reqs, "chunked")) == 280


def test_h100_capacity_is_2_196_nominal(monkeypatch):
    probes = []
    real = capacity_module.simulate

    def spy(rate, policy, deployment, count):
        result = real(rate, policy, deployment, count)
        probes.append((rate, meets_targets(result)))
        return result

    monkeypatch.setattr(capacity_module, "simulate", spy)
    rate, m = capacity("H100-bf16")
    assert round(rate, 3) == 2.196 and rate == pytest.approx(0.01 + 3.99 * 561 / 1024, abs=1e-12)
    # the probes, in order, as docs/scheduling.md lists them for implementers tracing a mismatch
    assert [round(r, 7) for r, _ in probes] == [2.005, 3.0025, 2.50375, 2.254375, 2.1296875, 2.1920313,
                                                2.2232031, 2.2076172, 2.1998242, 2.1959277]
    assert [ok for _, ok in probes] == [True, False, False, False, True, True, False, False, False, True]
    assert meets_targets(m)


# -- fast simulator == readable per-iteration reference, bit for bit ------------------------------
def assert_identical(fast, ref):
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref):
        assert a.preemptions == b.preemptions
        np.testing.assert_array_equal(a.token_times, b.token_times)   # bit for bit


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", POLICIES)
def test_fast_matches_reference_on_seeded_workloads(policy, seed):
    # three loads per seed: light, saturated (preemptions) and far beyond capacity
    for rate in (0.1, 0.4, 2.0):
        reqs = make_workload(rate, count=30, seed=seed)
        ref = run_reference(reqs, policy)
        fast = run_trace(reqs, policy)
        assert_identical(fast, ref)
        assert metrics(fast) == metrics(ref)


def test_fast_matches_reference_with_preemptions_on_other_devices():
    # the 24GB-int8 and H100 profiles, and a small budget, at rates where preemption happens
    cases = [("24GB-int8", 1.0, 40, "chunked"), ("H100-bf16", 3.0, 40, "paged"), ("L4-bf16", 0.3, 30, "chunked"),
             (Deployment(kv_budget=2.5e9), 0.5, 30, "chunked"), (Deployment(kv_budget=2.5e9), 0.5, 30, "paged"),
             (Deployment(kv_budget=2.5e9), 0.5, 30, "reserve"),
             # float model sizes: the simulator's stretches take the per-iteration path
             (Deployment(n_matmul=8.9e9, d_model=4096.0), 0.4, 20, "chunked")]
    total = 0
    for deployment, rate, count, policy in cases:
        deployment = PROFILES[deployment].deployment if isinstance(deployment, str) else deployment
        reqs = make_workload(rate, count=count)
        ref = run_reference(reqs, policy, deployment)
        assert_identical(run_trace(reqs, policy, deployment), ref)
        total += sum(r.preemptions for r in ref)
    assert total > 100


@pytest.mark.parametrize("policy, rate", [("chunked", 0.4), ("static", 0.2), ("paged", 0.3)])
def test_fast_matches_reference_on_the_full_workload(policy, rate):
    # 300 requests: long decode-only and chunk stretches (chunked at 0.4 preempts thousands of times)
    reqs = make_workload(rate)
    ref = run_reference(reqs, policy)
    fast = run_trace(reqs, policy)
    assert_identical(fast, ref)
    assert metrics(fast) == metrics(ref) == simulate(rate, policy)


@pytest.mark.parametrize("memory", [1e7, 4e4])
def test_fast_matches_reference_with_hundreds_of_decodes_in_the_budget(memory):
    # 400 short requests in bursts on a tiny deployment: up to 256 run at once and dozens of them
    # decode beside a prefill, so the prefill chunk is what the one-position chunks leave of the
    # 256 (the fast path's stretches take k = 256 - decodes); with 4e4 positions it preempts.
    rng = random.Random(2)
    arrival, reqs = 0.0, []
    for _ in range(400):
        arrival += rng.choice([0.0, 0.0, 0.01, 0.5])
        reqs.append(Request(arrival, rng.randint(1, 600), rng.randint(50, 400)))
    deployment = small(memory, bandwidth=1e3, peak_flops=1e5, kv_bytes_per_token=1, n_matmul=1, n_layers=1,
                       d_model=1, weight_bytes=1000.0)
    most = 0

    def spy(running, queue, deployment, **kw):
        nonlocal most
        most = max(most, sum(1 for filled, target in running if target - filled == 1))
        return chunked_step(running, queue, deployment, **kw)

    ref = run_reference(reqs, "chunked", deployment)
    assert_identical(run_trace(reqs, "chunked", deployment), ref)
    assert_identical(run_with_step(reqs, deployment, step=spy), ref)
    assert_identical(run_trace(reqs, "paged", deployment), run_reference(reqs, "paged", deployment))
    assert most > 80
    assert (sum(r.preemptions for r in ref) > 0) == (memory < 1e5)


def random_trace(rng, n):
    arrival, reqs = 0.0, []
    for _ in range(n):
        arrival += rng.expovariate(rng.choice([0.01, 0.1, 1.0]))
        reqs.append(Request(arrival, rng.randint(1, 900), rng.randint(1, 300)))
    return reqs


def test_fast_matches_reference_on_random_tiny_devices():
    rng = random.Random(7)
    seen = {"preemptions": 0, "errors": 0, "runs": 0}
    for _ in range(80):
        kv = rng.choice([1, 3])
        deployment = small(rng.randint(400, 5000) * kv * rng.choice([1, 1.0003]),
                           bandwidth=rng.choice([1e3, 3.3e3]), peak_flops=rng.choice([7e3, 1e5]),
                           kv_bytes_per_token=kv, n_matmul=rng.randint(1, 5), n_layers=1, d_model=rng.randint(1, 3),
                           weight_bytes=rng.choice([1000.0, 333.3]))
        reqs = random_trace(rng, rng.randint(1, 15))
        for policy in POLICIES:
            try:
                ref = run_reference(reqs, policy, deployment)
            except RequestTooLargeError:
                with pytest.raises(RequestTooLargeError):
                    run_trace(reqs, policy, deployment)
                seen["errors"] += 1
                continue
            assert_identical(run_trace(reqs, policy, deployment), ref)
            if policy in ("paged", "chunked"):   # the step-driven loop with the library's step: the same run
                assert_identical(run_with_step(reqs, deployment, budget=CHUNK_BUDGET if policy == "chunked" else None),
                                 ref)
            seen["preemptions"] += sum(r.preemptions for r in ref)
            seen["runs"] += 1
    assert seen["preemptions"] > 20 and seen["errors"] > 0 and seen["runs"] > 100


def test_run_with_step_uses_the_given_step():
    reqs = make_workload(0.3, count=12)
    calls = []

    def spy(running, queue, deployment, *, budget, max_running):
        calls.append(len(running))
        return chunked_step(running, queue, deployment, budget=budget, max_running=max_running)

    assert_identical(run_with_step(reqs, step=spy), run_trace(reqs, "chunked"))
    assert calls and MAX_RUNNING == 256
    with pytest.raises(ValueError, match="empty iteration"):
        run_with_step(reqs, step=lambda running, queue, deployment, **kw: StepPlan(len(queue), (), (), ()))
    with pytest.raises(ValueError, match="one-position chunk"):   # a separate decode: not in these semantics
        run_with_step(reqs, step=lambda running, queue, deployment, **kw: StepPlan(len(queue), (), (0,), ()))
    with pytest.raises(ValueError, match="chunk"):
        run_with_step(reqs, step=lambda running, queue, deployment, **kw: StepPlan(1, (), (), ((0, 10**6),)))
    with pytest.raises(ValueError, match="preempted"):
        run_with_step(reqs, step=lambda running, queue, deployment, **kw: StepPlan(1, (0,), (), ()))


def test_run_with_step_requeues_any_victims_in_admission_order():
    """A step that evicts the *oldest* request (a fault of the lab) still drives a valid run:
    the victim returns to the queue head and its later tokens come after a re-prefill."""
    reqs = [Request(0.0, 60, 5), Request(0.0, 60, 5)]

    def evict_oldest(running, queue, deployment, **kw):
        plan = chunked_step(running, queue, deployment, **kw)
        p, n = len(plan.preempted), len(running) + plan.admitted
        if not p:
            return plan
        # evict the first p instead of the last p; the survivors shift up by p
        return StepPlan(plan.admitted, tuple(range(p)), (),
                        tuple((i + p, k) for i, k in plan.chunks if i + p < n))

    newest = run_with_step(reqs, tiny(125), step=chunked_step, budget=None)
    oldest = run_with_step(reqs, tiny(125), step=evict_oldest, budget=None)
    assert [r.preemptions for r in newest] == [0, 1]
    assert [r.preemptions for r in oldest][0] >= 1


# -- capacity ---------------------------------------------------------------------------------
def test_capacity_bisection_logic(monkeypatch):
    calls = []

    def fake(rate, policy, deployment, count):
        calls.append((rate, policy))
        ok = rate <= 0.3
        return {"ttft99": 1.0 if ok else 9.0, "itl99": 0.05, "rate": rate}

    monkeypatch.setattr(capacity_module, "simulate", fake)
    rate, m = capacity(Deployment())
    assert len(calls) == 10 and all(p == "chunked" for _, p in calls)
    lo, hi = 0.01, 4.0
    for _ in range(10):   # the same bisection written out: keep the lower bound when it passes
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid <= 0.3 else (lo, mid)
    assert rate == lo and m["rate"] == lo and 0.3 - 3.99 / 1024 < rate <= 0.3


def test_capacity_on_the_default_deployment():
    rate, m = capacity("24GB-bf16")
    assert meets_targets(m) and m == simulate(rate, "chunked")
    step = 3.99 / 1024
    assert 0.01 <= rate < 4.0 and abs((rate - 0.01) / step - round((rate - 0.01) / step)) < 1e-6
    with pytest.raises(ValueError, match="targets"):
        capacity(Deployment(), targets=(3.0, -1.0))
