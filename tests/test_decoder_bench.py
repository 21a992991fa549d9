"""The decoder benchmark's pieces (course_lib.models.bench), the shared timing helper and the
streaming-bandwidth measurement, on the toy decoder; the real-model run is marked slow."""
from __future__ import annotations

import pytest
import torch

from course_lib import roofline
from course_lib.models import causal_attention, repeat_kv, toy_decoder
from course_lib.models import bench
from course_lib.models.config import weight_bytes
from course_lib.models.attention import attend
from course_lib.timing import Timing, measure
from course_lib.validation import ArgumentTypeError


def test_measure_counts_warmup_and_repeats_and_orders_its_summary():
    calls = []
    t = measure(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and (t.repeats, t.warmup) == (5, 2)
    assert 0 <= t.min_s <= t.median_s <= t.max_s
    assert t.spread(1.0, 3).count("-") == 1


@pytest.mark.parametrize("kwargs, error", [({"warmup": -1}, ValueError), ({"repeats": 0}, ValueError),
                                           ({"repeats": 1.5}, ArgumentTypeError)])
def test_measure_refuses_bad_counts(kwargs, error):
    with pytest.raises(error):
        measure(lambda: None, **kwargs)


def test_gemv_bandwidth_streams_at_least_the_bytes_asked_for():
    got = roofline.measure_gemv_bandwidth(total_bytes=3 * 4 * 256 * 256 + 1, d=256, warmup=0, repeats=2)
    assert got.matrices == 4 and got.d == 256                 # three of 256 x 256, then one column more
    assert got.streamed_bytes == 4 * 256 * (3 * 256 + 1)
    assert got.bandwidth == pytest.approx(got.streamed_bytes / got.timing.median_s)
    assert got.floor_s(2 * got.streamed_bytes) == pytest.approx(2 * got.timing.median_s)
    with pytest.raises(ValueError):
        roofline.measure_gemv_bandwidth(total_bytes=0)
    with pytest.raises(ValueError):
        got.floor_s(-1)


def test_estimate_roof_takes_bandwidth_from_the_streaming_measurement():
    import pandas as pd

    table = pd.DataFrame({"gb_s": [55.0, 3.0], "gflop_s": [10.0, 200.0]})
    stream = roofline.GemvBandwidth(30e9, 1, 1, 1, 2, None)
    assert roofline.estimate_roof(table).bandwidth == 55e9               # the table's B = 1 row
    roof = roofline.estimate_roof(table, stream)
    assert (roof.bandwidth, roof.peak_flops) == (30e9, 200e9)
    with pytest.raises(ArgumentTypeError):
        roofline.estimate_roof(table, 30e9)


@pytest.mark.parametrize("T, start, masked", [(1, 7, False), (5, 0, False), (3, 4, False), (1, 7, True), (3, 4, True)])
def test_attend_without_copies_equals_attention_over_repeated_heads(T, start, masked):
    """enable_gqa reads KV head h // group for query head h: the same numbers as repeating the heads."""
    gen = torch.Generator().manual_seed(T + start)
    B, Hq, Hkv, D, S = 2, 6, 2, 8, start + T
    q, k, v = torch.randn(B, Hq, T, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen), \
        torch.randn(B, Hkv, S, D, generator=gen)
    mask = None
    if masked:
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[1, :2] = False                                              # row 1 left-padded by 2
    got = attend(q, k, v, start, mask)
    want = causal_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), start, key_mask=mask)
    assert torch.allclose(got, want, atol=1e-6)
    # and against a plain softmax written out here
    scores = q @ repeat_kv(k, 3).transpose(-1, -2) / D ** 0.5
    allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + start
    if mask is not None:
        allowed = allowed[None] & mask[:, None, :]
        allowed = (allowed | ~allowed.any(-1, keepdim=True))[:, None]
    naive = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ repeat_kv(v, 3)
    assert torch.allclose(got, naive, atol=1e-5)


def test_attend_with_cache_refuses_kv_heads_that_do_not_divide_query_heads():
    from course_lib.models import attend_with_cache

    q, k = torch.zeros(1, 5, 1, 4), torch.zeros(1, 2, 1, 4)
    with pytest.raises(ValueError, match="must divide"):
        attend_with_cache(q, k, k, torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4), 0)


@pytest.mark.parametrize("tied", [False, True])
def test_weight_bytes_counts_a_tied_head_once(tied):
    model = toy_decoder(tie_embeddings=tied)
    table = 4 * model.config.vocab_size * model.config.d_model
    every = sum(4 * p.numel() for p in model.state_dict().values())     # state_dict lists a tied head twice
    assert weight_bytes(model) == every - (table if tied else 0) == 4 * model.config.parameters()
    with pytest.raises(TypeError, match="model must be"):
        weight_bytes(model.config)                                       # a config, not a built model


def test_benchmark_rows_on_the_toy_model():
    model = toy_decoder()
    table, facts = bench.benchmark(model, None, context=16, batches=(1, 2), prefill_tokens=32, warmup=0, repeats=2)
    assert list(table.columns) == ["measurement", "median (ms)", "min-max (ms)", "calls", "x B=1 floor"]
    assert list(table.measurement) == [bench.FLOOR_ROW, "matrix-vector products alone (B=1)",
                                       "ours: decode step B=1", "ours: decode step B=2", "ours: prefill 32 tokens"]
    ratio = table["x B=1 floor"]
    assert ratio.iloc[0] == 1.0 and ratio.iloc[:-1].notna().all() and ratio.isna().iloc[-1]   # no ratio for prefill
    assert (table["median (ms)"] > 0).all() and list(table.calls[2:4]) == ["0+2", "0+2"]
    assert facts["weight_bytes"] == weight_bytes(model) and facts["threads"] == torch.get_num_threads()
    assert facts["floor_ms"] == pytest.approx(table["median (ms)"].iloc[0])


def test_decode_step_leaves_the_cache_at_the_context_and_refuses_bad_sizes():
    model = toy_decoder()
    t = bench.decode_step(model, batch=2, context=9, warmup=1, repeats=2)
    assert isinstance(t, Timing) and t.repeats == 2
    with pytest.raises(ValueError):
        bench.decode_step(model, batch=0)
    with pytest.raises(ValueError):
        bench.decode_step(model, context=model.config.max_seq_len)


def test_batch_argument_parser():
    import argparse

    assert bench.parse_batches("1,8,16") == (1, 8, 16)
    for bad in ("", "1,x", "0,2", "1,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_batches(bad)


@pytest.mark.slow
def test_bench_runs_on_the_real_model_beside_transformers_and_the_int4_model(capsys):
    assert bench.main(["--quick", "--perplexity", "0"]) == 0      # perplexity: tests/test_quant_int4_cpu.py
    out = capsys.readouterr().out
    for line in (bench.FLOOR_ROW, "ours: decode step B=1", "transformers: decode step B=1",
                 "ours: prefill 128 tokens", "at B=1 ours is", bench.INT4_FLOOR_ROW, "int4: decode step B=1",
                 "at B=1 the int4 step is"):
        assert line in out
    assert "perplexity on Lab 4's windows" not in out
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        assert "llama.cpp rows skipped: the optional llama_cpp package does not import" in out
    else:
        assert "llama.cpp: decode step B=1" in out


class FakeLlama:
    """What llama_cpp_decode_step uses of llama_cpp.Llama (n_vocab, reset, eval, n_tokens), recording the
    positions each eval writes, as llama-cpp-python's eval does from n_tokens on."""

    def __init__(self):
        self.n_tokens, self.writes = 0, []

    def n_vocab(self) -> int:
        return 50

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens) -> None:
        assert all(0 <= t < 50 for t in tokens)
        self.writes.append((self.n_tokens, len(tokens)))
        self.n_tokens += len(tokens)


def test_benchmark_int4_and_llama_rows_each_against_their_own_floor(tmp_path):
    from test_quant_int4_cpu import write_toy_gguf

    from course_lib.quant.int4_cpu import int4_streamed_bytes, load_int4_decoder

    model = write_toy_gguf(tmp_path / "toy.gguf")
    int4 = load_int4_decoder(tmp_path / "toy.gguf", model.config)
    llama = FakeLlama()
    table, facts = bench.benchmark(model, None, int4=int4, llama=llama, llama_bytes=12345, context=8, batches=(1, 2),
                                   prefill_tokens=16, warmup=0, repeats=2)
    assert list(table.measurement) == [
        bench.FLOOR_ROW, "matrix-vector products alone (B=1)", "ours: decode step B=1", "ours: decode step B=2",
        bench.INT4_FLOOR_ROW, "int4: products alone (B=1)", "int4: decode step B=1", "int4: decode step B=2",
        bench.LLAMA_FLOOR_ROW, "llama.cpp: decode step B=1",
        "ours: prefill 16 tokens", "int4: prefill 16 tokens"]
    rows = table.set_index("measurement")
    assert facts["int4_weight_bytes"] == int4_streamed_bytes(int4) < facts["weight_bytes"]
    bandwidth = facts["bandwidth_gb_s"] * 1e9
    assert facts["int4_floor_ms"] == pytest.approx(facts["int4_weight_bytes"] / bandwidth * 1e3)
    assert facts["llama_floor_ms"] == pytest.approx(12345 / bandwidth * 1e3)
    for floor, step in ((bench.INT4_FLOOR_ROW, "int4: decode step B=1"),
                        (bench.LLAMA_FLOOR_ROW, "llama.cpp: decode step B=1")):
        assert rows.loc[floor, "x B=1 floor"] == 1.0
        ratio = rows.loc[step, "median (ms)"] / rows.loc[floor, "median (ms)"]
        assert rows.loc[step, "x B=1 floor"] == pytest.approx(ratio)
    assert llama.writes == [(0, 8)] + [(8, 1)] * 2                 # one prefill, then the same step each call
    with pytest.raises(ValueError, match="llama_bytes"):
        bench.benchmark(model, None, llama=llama, context=8, batches=(1,), prefill_tokens=0, warmup=0, repeats=1)
