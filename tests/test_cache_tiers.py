"""The tiered-cache inequality (course_lib.cache.tiers): loading L saved positions beats recomputing them
exactly when T * S_kv < B, whatever L; worked figures for a 70B-class model on an H100-class device."""
from __future__ import annotations

import random

import pytest

from course_lib.cache.tiers import (KV_LAYOUTS_70B, LINKS, break_even_bandwidth, load_beats_recompute, load_seconds,
                                    prefill_rate_bound, recompute_seconds)
from course_lib.validation import ArgumentTypeError


def test_the_verdict_is_the_same_for_every_prefix_length():
    rng = random.Random(0)
    for _ in range(200):
        rate, kv, bandwidth = 10 ** rng.uniform(2, 5), 10 ** rng.uniform(4, 7), 10 ** rng.uniform(8, 12)
        verdict = load_beats_recompute(rate, kv, bandwidth)
        for positions in (1, 37, 4096, 131072):
            assert (load_seconds(positions, kv, bandwidth) < recompute_seconds(positions, rate)) == verdict


def test_a_70b_class_model_on_an_h100_class_device():
    # 2 FLOPs per parameter per position at MFU 0.5 of 989 TFLOP/s: 0.5 * 989e12 / 140e9 positions/s
    rate = prefill_rate_bound(70e9, 989e12, 0.5)
    assert rate == pytest.approx(3532.142857, rel=1e-9)
    full, gqa, latent = (layout.bytes_per_position for layout in KV_LAYOUTS_70B)
    assert (full, gqa, latent) == (2_621_440, 327_680, 92_160)     # bytes per position, bf16, worked by hand
    assert break_even_bandwidth(rate, gqa) == pytest.approx(3532.142857 * 327_680, rel=1e-9)     # about 1.16 GB/s
    ssd, pcie4 = next(l for l in LINKS if "SSD" in l.name), next(l for l in LINKS if "PCIe 4.0 x16" in l.name)
    assert load_beats_recompute(rate, gqa, ssd.bandwidth) and load_beats_recompute(rate, latent, ssd.bandwidth)
    assert not load_beats_recompute(rate, full, ssd.bandwidth)          # 9.26 GB/s needed, the drive gives 7
    assert load_beats_recompute(rate, full, pcie4.bandwidth)


@pytest.mark.parametrize("call, error, name", [
    (lambda: load_seconds(0, 1, 1), ValueError, "positions"),
    (lambda: recompute_seconds(10, -1.0), ValueError, "prefill_rate"),
    (lambda: break_even_bandwidth("fast", 1), ArgumentTypeError, "prefill_rate"),
    (lambda: load_beats_recompute(1, 1, float("nan")), ValueError, "bandwidth"),
    (lambda: prefill_rate_bound(1e9, 1e12, 1.5), ValueError, "mfu"),
    (lambda: prefill_rate_bound(True, 1e12), ArgumentTypeError, "parameters"),
])
def test_bad_input_is_refused_by_name(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_the_measurement_serves_the_loaded_kv_and_sets_the_prediction_beside_the_clocks(tmp_path):
    """On the toy model (timings here are not the point: the lab runs the real model): each row's loaded K/V give
    the full prefill's next-token logits, its bytes are the cache's, and both verdicts are there."""
    from course_lib.cache.bench import measure_tiers
    from course_lib.models.decoder import toy_decoder

    model = toy_decoder()
    rows = measure_tiers(model, lengths=(8, 33), repeats=1, folder=tmp_path)
    assert [r["length"] for r in rows] == [8, 33] and not list(tmp_path.iterdir())    # the files are removed
    for r in rows:
        assert r["kv_bytes"] == r["length"] * model.config.kv_bytes_per_token(4)
        assert r["max_abs_logit_diff"] <= 1e-3 and r["prefill_rate"] > 0 and r["file_gbps"] > 0
        assert r["memory_predicted"] == (r["needed_gbps"] < r["memory_gbps"])
        assert type(r["memory_measured"]) is bool and type(r["file_measured"]) is bool
    with pytest.raises(ValueError, match="prefix length"):
        measure_tiers(model, lengths=(1,), folder=tmp_path)
