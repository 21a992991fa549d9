"""course_lib.engine.calibrate: the seeded CPU trace, the least-squares fit of the cost model's two rates, and
the simulator-against-engine table (the real-model comparison is measured in docs/engine.md)."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from course_lib.engine import Engine, StepReport
from course_lib.engine.calibrate import COMPARED, compare, engine_trace, fit_device, iteration_totals, \
    simulate_engine_policy
from course_lib.engine.scheduler import scheduling_deployment
from course_lib.hardware import Device
from course_lib.models.decoder import toy_decoder
from course_lib.scheduling.cost import iteration_time


def test_engine_trace_is_seeded_and_in_range():
    ids = list(range(1000))
    a, b = engine_trace(ids, count=12, seed=3), engine_trace(ids, count=12, seed=3)
    assert a == b and a != engine_trace(ids, count=12, seed=4)
    assert all(16 <= len(t.prompt_ids) <= 128 and 8 <= t.max_new_tokens <= 48 for t in a)
    assert [t.arrival for t in a] == sorted(t.arrival for t in a)
    # each prompt is a window of the text
    assert all(t.prompt_ids == ids[t.prompt_ids[0]:t.prompt_ids[0] + len(t.prompt_ids)] for t in a)
    with pytest.raises(ValueError, match="prompt_range"):
        engine_trace(ids, prompt_range=(10, 5))
    with pytest.raises(ValueError, match="more"):
        engine_trace(ids[:127])
    with pytest.raises(TypeError, match="pair"):
        engine_trace(ids, prompt_range=(10, 20, 30))
    # a text exactly as long as the longest prompt is enough: that prompt is the whole text
    assert all(len(t.prompt_ids) == 128 for t in engine_trace(ids[:128], count=3, prompt_range=(128, 128)))


def test_fit_recovers_the_device_that_priced_the_iterations():
    model = toy_decoder()
    truth = Device("truth", memory=1e12, bandwidth=2.5e9, peak_flops=4e10)
    deployment = scheduling_deployment(model.config, 4096, device=truth)
    rng = np.random.default_rng(0)
    history = []
    for i in range(60):
        chunks = tuple((int(k), int(c)) for k, c in zip(rng.integers(1, 200, rng.integers(1, 6)),
                                                        rng.integers(0, 400, 6)))
        history.append(StepReport(0.0, iteration_time([], list(chunks), deployment), chunks, (), (), (), (), 0))
    totals = iteration_totals(history)
    assert totals.shape == (60, 3) and (totals[:, 0] == [sum(k for k, _ in r.chunks) for r in history]).all()
    fit = fit_device(history, deployment)
    assert fit.device.bandwidth == pytest.approx(2.5e9, rel=0.06)
    assert fit.device.peak_flops == pytest.approx(4e10, rel=0.06)
    assert fit.median_error < 0.06 and 0 < fit.memory_bound < 1
    np.testing.assert_allclose(fit.predicted, [r.duration for r in history], rtol=0.12)
    with pytest.raises(ValueError, match="at least 2"):
        fit_device(history[:1], deployment)
    with pytest.raises(ValueError, match="steps_per_decade"):
        fit_device(history, deployment, steps_per_decade=0)


def test_a_rate_the_iterations_cannot_determine_is_flagged_and_mfu_is_honoured():
    model = toy_decoder()
    # decodes alone at a slow bandwidth: every iteration is memory-bound, so no compute rate is pinned down
    slow = Device("slow", memory=1e12, bandwidth=1e9, peak_flops=1e13)
    deployment = scheduling_deployment(model.config, 4096, device=slow)
    history = [StepReport(0.0, iteration_time([], [(1, c)] * b, deployment), ((1, c),) * b, (), (), (), (), 0)
               for b, c in itertools.product((1, 2, 4), (10, 50, 200))]
    with pytest.warns(UserWarning, match="no iteration is priced by compute"):
        fit = fit_device(history, deployment)
    assert fit.device.bandwidth == pytest.approx(1e9, rel=0.06) and fit.memory_bound == 1.0
    # with mfu 0.5 the fitted device's peak is twice the rate the iterations reached
    truth = Device("truth", memory=1e12, bandwidth=2.5e9, peak_flops=8e10)
    half = replace(scheduling_deployment(model.config, 4096, device=truth), mfu=0.5)
    history = [StepReport(0.0, iteration_time([], [(k, c)], half), ((k, c),), (), (), (), (), 0)
               for k, c in itertools.product((1, 8, 64, 200), (0, 100, 300))]
    fit = fit_device(history, half)
    assert fit.device.peak_flops == pytest.approx(8e10, rel=0.06)
    np.testing.assert_allclose([iteration_time([], list(r.chunks), replace(half, device=fit.device)) for r in history],
                               [r.duration for r in history], rtol=0.12)


@pytest.mark.filterwarnings("ignore:fit_device")  # the fake timer's equal durations pin down no compute rate
def test_the_simulator_with_the_engines_policy_and_the_comparison_table():
    model = toy_decoder()
    counter = itertools.count()
    engine = Engine(model, num_blocks=64, block_size=4, budget=32, max_running=4, timer=lambda: next(counter) * 0.01)
    trace = engine_trace(list(range(model.config.vocab_size)) * 2, count=8, rate=20.0, seed=0,
                         prompt_range=(4, 30), output_range=(2, 10))
    measured = engine.run(trace)
    fit = fit_device(engine.history, engine.deployment)
    assert fit.measured.shape == fit.predicted.shape == fit.decode_only.shape == (len(engine.history),)
    assert fit.decode_only.any() and not fit.decode_only.all()
    simulated = simulate_engine_policy(trace, engine, fit.device)
    assert [r.output for r in simulated] == [r.output for r in measured]
    table = compare(simulated, measured)
    assert list(table["metric"]) == list(COMPARED)
    row = table.set_index("metric").loc["ttft50"]
    # the columns are the right runs: medians straight from each run's records
    assert row["engine"] == pytest.approx(float(np.median([r.ttft for r in measured])))
    assert row["simulator"] == pytest.approx(float(np.median([r.ttft for r in simulated])))
    # the simulator prices with the device it is given: ten times faster rates, every request sooner
    fast = replace(fit.device, bandwidth=10 * fit.device.bandwidth, peak_flops=10 * fit.device.peak_flops)
    quicker = simulate_engine_policy(trace, engine, fast)
    assert all(q.e2e < s.e2e for q, s in zip(quicker, simulated))
