"""Lab 1 roofline library and the speculative-decoding bounds: the reference figures of
docs/roofline.md#reference-figures.

Expected numbers are typed in from docs/roofline.md (or hand arithmetic written out here), never
obtained by calling the code under test.
"""
import math

import numpy as np
import pandas as pd
import pytest

from course_lib import hardware, roofline
from course_lib.hardware import DEVICES, REFERENCE_DEVICES, Device
from course_lib.models import ModelConfig, smollm2_135m_config
from course_lib.roofline import (
    attention_flops,
    CASE_WEIGHT_BYTES, capacity_table, case_model, decode_attention_intensity, decode_step, decode_step_bound,
    decode_step_flops, gemm_intensity, gemv_intensity, kv_bytes_per_sequence, kv_bytes_per_token, n_matmul,
    prefill_flops, prefill_time, requests_that_fit, serving_file_bytes, smallest_compute_bound_batch, step_time, step_time_bound,
    weight_bytes_for_format,
)
from course_lib.speculative import expected_tokens_per_step, speculative_speedup, verification_cost_ratio

N_70B = 70_000_000_000
BW_70B, PEAK_70B = 3.0e12, 1000e12
#: The 70B model in bf16 on the 3.0 TB/s, 1,000 TFLOP/s device (docs/roofline.md#cost-calculator).
BF16_70B = dict(n_params=N_70B, bandwidth=BW_70B, peak_flops=PEAK_70B)
W = CASE_WEIGHT_BYTES


def sig(x, digits):
    """Round to ``digits`` significant figures."""
    return float(f"{x:.{digits - 1}e}")


# -- hardware ------------------------------------------------------------------------------
def test_reference_devices_exact_figures():
    expected = {"24GB-1.0": (24, 1.0, 165), "24GB-0.3": (24, 0.30, 121), "48GB": (48, 0.864, 362),
                "80GB-2.039": (80, 2.039, 312), "80GB-3.35": (80, 3.35, 989)}
    assert list(REFERENCE_DEVICES) == list(expected)
    for name, (cap, bw, tflops) in expected.items():
        d = REFERENCE_DEVICES[name]
        assert (d.memory, d.bandwidth, d.peak_flops) == (cap * 1e9, bw * 1e12, tflops * 1e12)
        assert d.source


def test_ridge_points_match_the_reference_figures():
    expected = {"24GB-1.0": 165.0, "24GB-0.3": 403.3, "48GB": 419.0, "80GB-2.039": 153.0, "80GB-3.35": 295.2}
    assert {k: round(d.ridge_point, 1) for k, d in REFERENCE_DEVICES.items()} == expected


def test_devices_include_vendor_gpus_dense_figures():
    assert set(DEVICES) == set(REFERENCE_DEVICES) | {"H100 SXM", "H200"}
    h100, h200 = DEVICES["H100 SXM"], DEVICES["H200"]
    assert (h100.memory, h100.bandwidth, h100.peak_flops) == (80e9, 3.35e12, 989e12)
    assert (h200.memory, h200.bandwidth, h200.peak_flops) == (141e9, 4.8e12, 989e12)
    assert "2026-11" in h100.source and "2026-11" in h200.source


def test_device_holds_si_units_converted_from_the_datasheet():
    d = REFERENCE_DEVICES["24GB-1.0"]
    assert d.memory == 24e9  # decimal GB, not GiB
    assert d.bandwidth == 1e12
    assert d.peak_flops == 165e12
    assert d == Device("24GB-1.0", 24e9, 1e12, 165e12, d.source)
    assert Device.from_datasheet("x", 80, 3.35, 989) == Device("x", 80e9, 3.35e12, 989e12)


@pytest.mark.parametrize("field, kwargs", [
    ("memory", dict(memory=0, bandwidth=1, peak_flops=1)),
    ("bandwidth", dict(memory=1, bandwidth=-1, peak_flops=1)),
    ("peak_flops", dict(memory=1, bandwidth=1, peak_flops=float("nan"))),
])
def test_device_validation(field, kwargs):
    with pytest.raises(ValueError, match=f"Device.{field}"):
        Device("x", **kwargs)
    with pytest.raises(ValueError, match="name"):
        Device("", 1, 1, 1)


@pytest.mark.parametrize("argument, figures", [
    ("capacity_gb", (0, 1, 1)), ("bandwidth_tbps", (1, -1, 1)), ("dense_tflops", (1, 1, float("inf"))),
])
def test_from_datasheet_names_the_datasheet_argument(argument, figures):
    with pytest.raises(ValueError, match=argument):
        Device.from_datasheet("x", *figures)


def test_from_datasheet_reads_gib_capacity_and_sparse_peaks():
    # 24 GiB = 24 * 2**30 = 25,769,803,776 bytes = 25.77 GB; a peak quoted with 2:4 sparsity is twice the dense one
    gib = Device.from_datasheet("x", 24, 1.0, 165, capacity_unit="GiB")
    assert gib.memory == 25_769_803_776 and round(gib.memory / 1e9, 2) == 25.77
    assert Device.from_datasheet("x", 24, 1.0, 165, capacity_unit="GB").memory == 24e9
    h100 = Device.from_datasheet("H100 SXM", 80, 3.35, 1979, sparse=True)
    assert h100.peak_flops == 989.5e12
    assert Device.from_datasheet("x", 80, 3.35, 67, sparse=False).peak_flops == 67e12


def test_h100_peaks_per_precision_and_their_ridge_points():
    dense = {p: Device.from_datasheet(p, 80, 3.35, tflops, sparse=sparse).peak_flops
             for p, tflops, sparse in hardware.H100_SXM_PEAKS}
    assert dense == {"FP32": 67e12, "TF32 tensor core": 494.5e12, "BF16 tensor core": 989.5e12,
                     "FP8 tensor core": 1979e12}
    # ridge = dense peak / 3.35e12 B/s: FP32 20.0, BF16 295.4, FP8 590.7 FLOP/byte
    assert [round(v / 3.35e12, 1) for v in dense.values()] == [20.0, 147.6, 295.4, 590.7]


@pytest.mark.parametrize("kwargs, match", [
    (dict(capacity_unit="TB"), "capacity_unit"), (dict(capacity_unit="gib"), "capacity_unit"),
    (dict(sparse="yes"), "sparse"), (dict(sparse=1), "sparse"),
])
def test_from_datasheet_refuses_unknown_readings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Device.from_datasheet("x", 24, 1.0, 165, **kwargs)


def test_get_device_by_name_and_unknown():
    assert hardware.get_device("48GB") is REFERENCE_DEVICES["48GB"]
    with pytest.raises(ValueError, match="unknown"):
        hardware.get_device("A100")


# -- model accounting ----------------------------------------------------------------------
def test_case_model_accounting():
    m = case_model()
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff, m.vocab_size,
            m.tie_embeddings) == (36, 4096, 32, 8, 128, 15360, 152064, False)
    assert m.parameters() == 9_550_729_216
    assert n_matmul(m) == 8_927_875_072
    assert CASE_WEIGHT_BYTES == 5.5e9


def test_case_serving_file():
    b = serving_file_bytes(case_model())
    assert isinstance(b, float)
    assert round(b / 1e9, 6) == 5.528429


def test_case_kv_bytes():
    m = case_model()
    assert kv_bytes_per_token(m) == 147_456
    assert kv_bytes_per_token(m, 1) == 73_728
    assert kv_bytes_per_token(m) * 6000 / 1e9 == pytest.approx(0.884736, abs=0)


def test_tied_model_n_matmul_equals_parameters():
    m = smollm2_135m_config()
    assert m.tie_embeddings
    assert n_matmul(m) == m.parameters() == 134_515_008


def test_untied_n_matmul_drops_only_input_embedding():
    m = case_model()
    tied = ModelConfig(36, 4096, 32, 8, 128, 15360, 152064, tie_embeddings=True)
    assert m.parameters() - n_matmul(m) == 152064 * 4096
    assert n_matmul(tied) == n_matmul(m)  # the head stays, counted once


def test_model_accounting_errors():
    with pytest.raises(ValueError, match="config"):
        n_matmul({"n_layers": 36})
    with pytest.raises(ValueError, match="bytes_per_value"):
        kv_bytes_per_token(case_model(), 0)
    with pytest.raises(ValueError, match="linear_bits"):
        serving_file_bytes(case_model(), linear_bits=-4)


# -- time bounds ---------------------------------------------------------------------------
# -- the roofline step time -----------------------------------------------------------------
def test_step_time_is_the_max_of_memory_and_compute_time():
    assert step_time(bytes_moved=2e9, flops=1e12, bandwidth=1e12, peak_flops=1e15) == 2e-3     # memory-bound
    assert step_time(bytes_moved=2e9, flops=4e12, bandwidth=1e12, peak_flops=1e15) == 4e-3     # compute-bound
    assert type(step_time(bytes_moved=1, flops=1, bandwidth=1, peak_flops=1)) is float


def test_step_time_works_element_wise_on_arrays():
    times = step_time(bytes_moved=np.array([2e9, 2e9]), flops=np.array([1e12, 4e12]), bandwidth=1e12, peak_flops=1e15)
    assert isinstance(times, np.ndarray) and times.tolist() == [2e-3, 4e-3]


def test_step_time_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        step_time(2e9, 1e12, 1e12, 1e15)


def test_prefill_time_case_on_24gb_1():
    # (2 * 8,927,875,072 * 4000 + 2 * 36 * 4096 * 4000^2) / (0.5 * 165e12)
    flops = 2 * 8_927_875_072 * 4000 + 2 * 36 * 4096 * 4000 ** 2
    assert flops == 76_141_592_576_000
    expected = 76_141_592_576_000 / 82.5e12
    t = prefill_time(case_model(), REFERENCE_DEVICES["24GB-1.0"], 4000)
    assert sig(t, 4) == sig(expected, 4) == 0.9229
    assert round(t, 3) == 0.923  # Lab 3's reference "a 4,000-token prefill alone 0.923 s"


def test_prefill_time_errors():
    m, d = case_model(), REFERENCE_DEVICES["24GB-1.0"]
    for mfu in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="mfu"):
            prefill_time(m, d, 100, mfu=mfu)
    with pytest.raises(ValueError, match="tokens"):
        prefill_time(m, d, 0)
    with pytest.raises(ValueError, match="device"):
        prefill_time(m, "no-such-device", 10)


def test_decode_step_bound_case_batch1():
    # docs/roofline.md#decode-step-bound: (5.5e9 + 5,000 * 147,456) / 1e12 = 6.23728 ms, memory-bound
    t = decode_step_bound(case_model(), "24GB-1.0", batch=1, context=5000, weight_bytes=5.5e9)
    assert type(t) is float and round(t * 1e3, 3) == 6.237


def test_decode_step_bound_batch18_matches_lab3_reference():
    # Lab 3: 18 decodes at context 5,000 on the 24GB-1.0 device: 18.77 ms (memory-bound).
    s = decode_step(case_model(), "24GB-1.0", batch=18, context=5000, weight_bytes=W)
    memory = (5.5e9 + 18 * 147_456 * 5000) / 1e12
    compute = (2 * 8_927_875_072 * 18 + 4 * 36 * 4096 * 18 * 5000) / 165e12
    assert s.memory_s == pytest.approx(memory, rel=1e-12)
    assert s.compute_s == pytest.approx(compute, rel=1e-12)
    assert s.bound_s == s.memory_s and s.binding == "memory"
    assert round(s.bound_s * 1e3, 2) == 18.77
    assert decode_step_bound(case_model(), "24GB-1.0", batch=18, context=5000, weight_bytes=W) == s.bound_s


def test_decode_step_bound_is_max_not_sum():
    s = decode_step(case_model(), "24GB-1.0", batch=4096, context=5000, weight_bytes=W)
    assert s.binding in ("memory", "compute")
    assert s.bound_s == max(s.memory_s, s.compute_s) < s.memory_s + s.compute_s


# -- the attention width n_h * d_head where it differs from d (docs/roofline.md#flops-per-token) ----
#: Qwen3-0.6B-shaped: 28 layers, d 1,024, 16 query / 8 KV heads of 128 (n_h * d_head = 2,048 = 2 d),
#: SwiGLU 3,072, vocabulary 151,936, tied.
QWEN3_SHAPED = ModelConfig(n_layers=28, d_model=1024, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=3072,
                           vocab_size=151936, tie_embeddings=True)
# N_matmul by the counting rule, written out: block = 2*d*(n_h*d_head) + 2*d*(n_kv*d_head) + 3*d*d_ff + 2*d;
# tied, so the table counts once (as the head) plus the final norm.
QWEN3_BLOCK = 2 * 1024 * 2048 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024
QWEN3_N_MATMUL = 28 * QWEN3_BLOCK + 1024 + 151936 * 1024


def test_attention_width_is_query_heads_times_head_dim():
    assert QWEN3_N_MATMUL == 596_042_752
    assert QWEN3_SHAPED.attention_width == 2048 != QWEN3_SHAPED.d_model
    assert n_matmul(QWEN3_SHAPED) == QWEN3_N_MATMUL
    assert case_model().attention_width == case_model().d_model == 4096
    assert smollm2_135m_config().attention_width == smollm2_135m_config().d_model == 576


def test_decode_flops_count_attention_with_n_heads_times_head_dim():
    # context 4,096, batch 1: attention 4 * L * (n_h * d_head) * batch * context
    attention = 4 * 28 * (16 * 128) * 1 * 4096
    expected = 2 * QWEN3_N_MATMUL * 1 + attention
    assert (attention, expected) == (939_524_096, 2_131_609_600)
    assert (sig(attention, 4), sig(expected, 5)) == (9.395e8, 2.1316e9)
    got = decode_step_flops(QWEN3_SHAPED, batch=1, context=4096)
    assert got == expected
    assert got != 2 * QWEN3_N_MATMUL + 4 * 28 * 1024 * 4096           # d_model in the attention term: 1.6618e9
    step = decode_step(QWEN3_SHAPED, "24GB-1.0", batch=1, context=4096, weight_bytes=1.2e9)
    assert step.flops == expected and step.compute_s == pytest.approx(expected / 165e12, rel=1e-12)


def test_prefill_flops_count_attention_with_n_heads_times_head_dim():
    t = 4096
    expected = 2 * QWEN3_N_MATMUL * t + 2 * 28 * (16 * 128) * t * t
    assert expected == 6_806_927_572_992 and sig(expected, 4) == 6.807e12
    got = prefill_flops(QWEN3_SHAPED, t)
    assert type(got) is int and got == expected
    assert sig(got, 4) != sig(2 * QWEN3_N_MATMUL * t + 2 * 28 * 1024 * t * t, 4)   # with d_model: 5.845e12
    assert prefill_time(QWEN3_SHAPED, "24GB-1.0", t, 0.5) == pytest.approx(expected / (0.5 * 165e12), rel=1e-12)


def test_decode_step_bound_errors():
    m = case_model()
    with pytest.raises(ValueError, match="batch"):
        decode_step_bound(m, "24GB-1.0", batch=0, context=10, weight_bytes=W)
    with pytest.raises(ValueError, match="context"):
        decode_step_bound(m, "24GB-1.0", batch=1, context=-5, weight_bytes=W)
    with pytest.raises(ValueError, match="weight_bytes"):
        decode_step_bound(m, "24GB-1.0", batch=1, context=5, weight_bytes=0)
    with pytest.raises(ValueError, match="bytes_per_value"):
        decode_step_bound(m, "24GB-1.0", batch=1, context=5, weight_bytes=W, kv_bytes_per_value=0)
    with pytest.raises(TypeError):
        decode_step_bound(m, "24GB-1.0", 1, 5, W)   # the numbers are keyword-only


def test_requests_that_fit_case_on_24gb_1():
    # docs/roofline.md#capacity: floor((24e9 - 5.5e9 - 2.5e9) / (147,456 * 6,000)) = floor(18.08) = 18
    fit = dict(weight_bytes=5.5e9, prompt_tokens=4000, output_tokens=2000)
    assert requests_that_fit(case_model(), "24GB-1.0", **fit) == 18
    assert requests_that_fit(case_model(), "24GB-1.0", **fit, kv_bytes_per_value=1) == 36   # floor(36.17)
    assert requests_that_fit(case_model(), "24GB-1.0", **{**fit, "weight_bytes": 30e9}) == 0


# -- capacity table ------------------------------------------------------------------------
def test_capacity_table_shape():
    df = capacity_table()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["device", "free_gb", "batch", "ttft_s", "solo_tok_s", "batch_tok_s"]
    assert list(df["device"]) == ["24GB-1.0", "24GB-0.3", "48GB", "80GB-2.039", "80GB-3.35"]
    assert len(capacity_table(devices=["H200"])) == 1


def test_capacity_table_24gb_row_by_hand():
    row = capacity_table().iloc[0]
    # free = 24 GB - 5.5 GB weights - 2.5 GB overhead = 16 GB
    free = 24e9 - 5.5e9 - 2.5e9
    assert row["free_gb"] == pytest.approx(16.0)
    # each full request holds 147,456 B/token * (4000 + 2000) tokens = 884,736,000 B
    per_request = 147_456 * 6000
    assert per_request == 884_736_000
    assert math.floor(16e9 / 884_736_000) == 18  # 18.08...
    assert row["batch"] == 18
    # TTFT: (2*N_matmul*4000 + 2*36*4096*4000^2) / (0.5*165e12)
    ttft = (2 * 8_927_875_072 * 4000 + 2 * 36 * 4096 * 16_000_000) / (0.5 * 165e12)
    assert row["ttft_s"] == pytest.approx(ttft, rel=1e-9)
    # decode context = 4000 + 2000/2 = 5000; batch 1: memory (5.5e9 + 737,280,000)/1e12
    # = 6.23728 ms vs compute (17,855,750,144 + 2,949,120,000)/165e12 = 0.1261 ms
    solo_step = max((5.5e9 + 147_456 * 5000) / 1e12,
                    (2 * 8_927_875_072 + 4 * 36 * 4096 * 5000) / 165e12)
    assert solo_step == pytest.approx(6.23728e-3, rel=1e-12)
    assert row["solo_tok_s"] == pytest.approx(1 / 6.23728e-3, rel=1e-9)
    # batch 18: memory (5.5e9 + 18*737,280,000)/1e12 = 18.77104 ms
    # vs compute 18*20,804,870,144/165e12 = 2.2696 ms
    batch_step = max((5.5e9 + 18 * 737_280_000) / 1e12, 18 * 20_804_870_144 / 165e12)
    assert batch_step == pytest.approx(18.77104e-3, rel=1e-12)
    assert row["batch_tok_s"] == pytest.approx(18 / 18.77104e-3, rel=1e-9)
    assert sig(row["solo_tok_s"], 4) == 160.3 and sig(row["batch_tok_s"], 4) == 958.9


def test_capacity_table_weight_override_and_no_fit():
    m = case_model()
    bf16 = capacity_table(devices=["24GB-1.0"], weight_bytes=2 * m.parameters()).iloc[0]
    # 24e9 - 19,101,458,432 - 2.5e9 = 2,398,541,568 B -> floor(2.3985e9 / 884,736,000) = 2
    assert bf16["free_gb"] == pytest.approx(2.398541568)
    assert bf16["batch"] == 2
    too_big = capacity_table(devices=["24GB-0.3"], weight_bytes=30e9).iloc[0]
    assert too_big["batch"] == 0 and too_big["batch_tok_s"] == 0 and too_big["free_gb"] < 0


def test_capacity_table_errors():
    with pytest.raises(ValueError, match="mfu"):
        capacity_table(mfu=0)
    with pytest.raises(ValueError, match="prompt_tokens"):
        capacity_table(prompt_tokens=0)
    with pytest.raises(ValueError, match="overhead_gb"):
        capacity_table(overhead_gb=-1)
    with pytest.raises(ValueError, match="devices"):
        capacity_table(devices=[])


# -- 70B per-token cost calculator ---------------------------------------------------------
def test_70b_kv_and_weights():
    assert kv_bytes_per_sequence(n_layers=80, n_kv_heads=8, head_dim=128, context=2048) == 671_088_640
    assert weight_bytes_for_format(N_70B, "bf16") / 1e9 == pytest.approx(140.0, abs=0)
    assert weight_bytes_for_format(N_70B, "fp8") / 1e9 == pytest.approx(70.0, abs=0)
    assert weight_bytes_for_format(N_70B, "int4-g128") / 1e9 == pytest.approx(36.3125, rel=1e-15)


def test_70b_batch1_bounds_are_weight_streaming_floors():
    # docs/roofline.md: batch-1 bounds 46.667 / 23.333 / 12.104 ms. They equal weights / bandwidth, i.e. the
    # one sequence's 671 MB of KV is not in them (with it: 46.890 / 23.557 / 12.328 ms).
    for fmt, ms in (("bf16", 46.667), ("fp8", 23.333), ("int4-g128", 12.104)):
        w = weight_bytes_for_format(N_70B, fmt)
        s = step_time_bound(weight_bytes=w, **BF16_70B, batch=1, kv_bytes_per_sequence=0)
        assert round(s.bound_s * 1e3, 3) == ms and s.binding == "memory"
    for fmt, ms in (("bf16", 46.890), ("fp8", 23.557), ("int4-g128", 12.328)):
        s = step_time_bound(weight_bytes=weight_bytes_for_format(N_70B, fmt), **BF16_70B, batch=1,
                            kv_bytes_per_sequence=671_088_640)
        assert round(s.bound_s * 1e3, 3) == ms


def test_70b_batch32_bounds():
    for fmt, ms in (("bf16", 53.825), ("fp8", 30.492), ("int4-g128", 19.262)):
        w = weight_bytes_for_format(N_70B, fmt)
        s = step_time_bound(weight_bytes=w, **BF16_70B, batch=32, kv_bytes_per_sequence=671_088_640)
        assert round(s.bound_s * 1e3, 3) == ms
        assert s.binding == "memory"
        assert s.compute_s == pytest.approx(2 * 70e9 * 32 / 1e15)  # 4.48 ms


def test_verification_cost_and_speedup():
    w = weight_bytes_for_format(N_70B, "bf16")
    # batch 32, gamma 4: compute 2*70e9*32*5/1e15 = 22.4 ms < memory 53.825 ms -> ratio 1
    assert verification_cost_ratio(weight_bytes=w, **BF16_70B, batch=32, kv_bytes_per_sequence=671_088_640,
                                   gamma=4) == 1.0
    # int4 at batch 32: compute 22.4 ms vs memory 19.262 ms -> 22.4 / 19.26244549 = 1.16288
    r = verification_cost_ratio(weight_bytes=weight_bytes_for_format(N_70B, "int4-g128"), **BF16_70B, batch=32,
                                kv_bytes_per_sequence=671_088_640, gamma=4)
    assert r == pytest.approx(22.4 / 19.26244549333, rel=1e-9)
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)  # 3.3616
    assert speculative_speedup(0.8, 4) == pytest.approx(3.3616)
    assert speculative_speedup(0.8, 4, verification_ratio=r) == pytest.approx(3.3616 / r)
    assert speculative_speedup(0.8, 4, draft_cost=0.05) == pytest.approx(3.3616 / 1.2)


def test_smallest_compute_bound_batch():
    kv = 671_088_640
    w = weight_bytes_for_format(N_70B, "bf16")
    # per sequence: compute 2*70e9/1e15 = 0.14 ms < KV read 671,088,640/3e12 = 0.2237 ms: never
    served = dict(weight_bytes=w, **BF16_70B)
    assert smallest_compute_bound_batch(**served, kv_bytes_per_sequence=kv) is None
    # 1-byte KV: 46.667 ms / (0.14 - 0.111848) ms = 1657.7 -> 1658
    assert smallest_compute_bound_batch(**served, kv_bytes_per_sequence=kv // 2) == 1658
    # verifying gamma+1 = 5 positions: 46.667 / (0.7 - 0.223696) = 97.98 -> 98
    assert smallest_compute_bound_batch(**served, kv_bytes_per_sequence=kv, positions_per_sequence=5) == 98
    # the returned batch is the first one whose compute reaches memory
    for b, binding in ((97, "memory"), (98, "compute")):
        s = step_time_bound(**served, batch=b, kv_bytes_per_sequence=kv, positions_per_sequence=5)
        assert s.binding == binding


def test_calculator_errors():
    with pytest.raises(ValueError, match="fmt"):
        weight_bytes_for_format(N_70B, "int3")
    with pytest.raises(ValueError, match="n_params"):
        weight_bytes_for_format(0, "bf16")
    with pytest.raises(ValueError, match="batch"):
        step_time_bound(weight_bytes=1e9, **BF16_70B, batch=0, kv_bytes_per_sequence=0)
    with pytest.raises(ValueError, match="kv_bytes_per_sequence"):
        step_time_bound(weight_bytes=1e9, **BF16_70B, batch=1, kv_bytes_per_sequence=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        step_time_bound(weight_bytes=1e9, **{**BF16_70B, "bandwidth": 0}, batch=1, kv_bytes_per_sequence=0)
    with pytest.raises(TypeError):
        step_time_bound(1e9, N_70B, 1, 0, BW_70B, PEAK_70B)   # keyword-only
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(1.2, 4)
    with pytest.raises(ValueError, match="gamma"):
        expected_tokens_per_step(0.5, -1)
    with pytest.raises(ValueError, match="context"):
        kv_bytes_per_sequence(n_layers=80, n_kv_heads=8, head_dim=128, context=0)
    with pytest.raises(ValueError, match="verification_ratio"):
        speculative_speedup(0.5, 3, verification_ratio=0)


def test_attention_flops_by_hand():
    # docs/roofline.md#flops-per-token: 4 * 28 * 2048 * 4096 = 939,524,096 (Qwen3-0.6B-shaped, context 4,096)
    assert attention_flops(n_layers=28, width=2048, context=4096) == 939_524_096
    assert decode_step_flops(QWEN3_SHAPED, batch=3, context=4096) == 3 * (2 * QWEN3_N_MATMUL + 939_524_096)
    for name, kwargs in (("n_layers", dict(n_layers=0, width=1, context=1)),
                         ("width", dict(n_layers=1, width=-2, context=1)),
                         ("context", dict(n_layers=1, width=1, context=0))):
        with pytest.raises(ValueError, match=name):
            attention_flops(**kwargs)


def test_step_time_bound_with_attention_flops():
    # 70B bf16, batch 32, 2,048 positions: attention 4 * 80 * 8192 * 2048 = 5,368,709,120 FLOPs per sequence;
    # compute (2 * 70e9 * 32 + 32 * 5,368,709,120) / 1e15 = 4.65179869184 ms; memory unchanged (53.825 ms)
    w = weight_bytes_for_format(N_70B, "bf16")
    a = attention_flops(n_layers=80, width=8192, context=2048)
    assert a == 5_368_709_120
    s = step_time_bound(weight_bytes=w, **BF16_70B, batch=32, kv_bytes_per_sequence=671_088_640,
                        attention_flops_per_sequence=a)
    assert s.compute_s == pytest.approx(4.65179869184e-3, rel=1e-12)
    assert round(s.bound_s * 1e3, 3) == 53.825 and s.binding == "memory"
    assert s.flops == 2 * N_70B * 32 + 32 * a
    with pytest.raises(ValueError, match="attention_flops_per_sequence"):
        step_time_bound(weight_bytes=w, **BF16_70B, batch=1, kv_bytes_per_sequence=0, attention_flops_per_sequence=-1)


TP_70B = dict(weight_bytes=140e9, n_params=N_70B, batch=1, kv_bytes_per_sequence=0, n_layers=80, d_model=8192,
              bandwidth=BW_70B, peak_flops=PEAK_70B)


def test_tensor_parallel_one_device_is_the_single_device_bound():
    one = roofline.tensor_parallel_step(devices=1, **TP_70B, link_bandwidth=450e9, link_latency_s=1e-6)
    assert one.communication_s == 0 and one.sent_bytes == 0
    assert one.bound_s == step_time_bound(weight_bytes=140e9, **BF16_70B, batch=1,
                                          kv_bytes_per_sequence=0).bound_s   # 46.667 ms


def test_tensor_parallel_step_by_hand():
    # two devices, 450 GB/s each way, no latency: each reads 70 GB at 3 TB/s = 23.333 ms; one all-reduce holds
    # 1 * 8192 * 2 = 16,384 B; 160 all-reduces each send 2 * (1/2) * 16,384 B: 2,621,440 B / 450e9 = 5.8254 us
    two = roofline.tensor_parallel_step(devices=2, **TP_70B, link_bandwidth=450e9)
    assert two.all_reduce_bytes == 16_384 and two.sent_bytes == 2_621_440
    assert two.per_device.bound_s == pytest.approx(70e9 / 3e12, rel=1e-12)
    assert two.communication_s == pytest.approx(2_621_440 / 450e9, rel=1e-12)
    assert two.bound_s == pytest.approx(70e9 / 3e12 + 2_621_440 / 450e9, rel=1e-12)
    # eight devices, 1 us per ring step: 160 * 14 * 1e-6 = 2.24 ms of latency, 160 * 2 * 7/8 * 16,384 =
    # 4,587,520 B sent, 17.5 GB read per device: 5.8333 + 2.24 + 0.0101945 = 8.0836 ms
    eight = roofline.tensor_parallel_step(devices=8, **TP_70B, link_bandwidth=450e9, link_latency_s=1e-6)
    assert eight.sent_bytes == 4_587_520
    assert eight.bound_s == pytest.approx(17.5e9 / 3e12 + 2.24e-3 + 4_587_520 / 450e9, rel=1e-12)


def test_tensor_parallel_splits_kv_and_attention_too():
    # batch 4 with 1 GB of cache and 1 TFLOP of attention per sequence, over 4 devices: each reads
    # (140 + 4 * 1) / 4 GB and does (2 * 70e9 * 4 + 4e12) / 4 FLOPs
    four = roofline.tensor_parallel_step(devices=4, **{**TP_70B, "batch": 4, "kv_bytes_per_sequence": 1e9},
                                         attention_flops_per_sequence=1e12, link_bandwidth=64e9)
    assert four.per_device.bytes_moved == pytest.approx(36e9, rel=1e-12)
    assert four.per_device.flops == pytest.approx(1.14e12, rel=1e-12)
    assert four.all_reduce_bytes == 4 * 8192 * 2


def test_tp_links_are_one_direction_rated_bounds():
    by_name = {link.name: link.bandwidth for link in roofline.TP_LINKS}
    assert by_name == {"host memory over PCIe 4.0 x16": 32e9, "host memory over PCIe 5.0 x16": 64e9,
                       "NVLink 4 (H100 SXM)": 450e9}


@pytest.mark.parametrize("name, override", [
    ("devices", dict(devices=0)), ("link_latency_s", dict(link_latency_s=-1e-6)), ("d_model", dict(d_model=0)),
    ("link_bandwidth", dict(link_bandwidth=0)), ("n_layers", dict(n_layers=1.5)),
    ("weight_bytes", dict(weight_bytes=0)), ("kv_bytes_per_sequence", dict(kv_bytes_per_sequence=-1)),
])
def test_tensor_parallel_errors_name_the_argument(name, override):
    kwargs = {**TP_70B, "devices": 2, "link_bandwidth": 450e9, **override}
    with pytest.raises(ValueError, match=name):
        roofline.tensor_parallel_step(**kwargs)


# -- arithmetic intensity ------------------------------------------------------------------
def test_intensities():
    # 4096 x 4096 bf16 GEMV: 2*4096^2 / (2*(4096^2 + 8192)) = 16,777,216 / 16,785,408
    assert gemv_intensity(4096, 4096, 2) == pytest.approx(16_777_216 / 16_785_408, rel=1e-15)
    # GEMM with B = 16 columns, bf16: 2*4096^2*16 / (2*(4096^2 + 2*4096*16))
    assert gemm_intensity(4096, 4096, 16, 2) == pytest.approx(268_435_456 / 16_908_288, rel=1e-15)
    assert gemm_intensity(64, 32, 1, 4) == pytest.approx(gemv_intensity(64, 32, 4))
    assert decode_attention_intensity(4, 2) == 4.0  # docs: 4 FLOP/byte, 4 q heads per KV head, bf16


def test_intensity_errors():
    with pytest.raises(ValueError, match="m"):
        gemv_intensity(0, 4, 2)
    with pytest.raises(ValueError, match="bytes_per_element"):
        gemm_intensity(4, 4, 4, 0)
    with pytest.raises(ValueError, match="batch"):
        gemm_intensity(4, 4, -1, 2)
