"""Batched decoding in the reference decoder (course Lab 6): left padding, positions from the mask, pad
rows that stay finite and isolated, chunked prefill, and the batch-invariant mode's bitwise contract.

Runs on the toy decoder (random weights, 4 layers); the real model's versions are in
tests/test_reference_model.py. Both attention paths are tested: PyTorch's fused attention (the default)
and the fixed-order attention of ``batch_invariant_mode``.
"""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from course_lib.models.decoder import (generate_batch, generate_cached, left_pad, positions_from_mask,
                                       toy_decoder)
from course_lib.validation import ArgumentTypeError

# Padded against unpadded logits (float32, 4 layers): measured differences are about 1e-6.
ATOL = 2e-5
MODES = pytest.mark.parametrize("invariant", [False, True], ids=["default", "batch_invariant"])


@pytest.fixture(scope="module")
def model():
    return toy_decoder(seed=0)


def prompts(model, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, model.config.vocab_size, (n,), generator=g) for n in lengths]


def test_positions_from_mask_start_each_row_at_zero():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    assert positions_from_mask(mask.bool()).tolist() == positions_from_mask(mask).tolist()


@pytest.mark.parametrize("mask, error, match", [
    ([[1, 1, 0]], ValueError, "row 0 is not left-padded"),
    ([[0, 1, 1], [1, 0, 1]], ValueError, "row 1 is not left-padded"),
    ([[0, 2, 1]], ValueError, "only 0"),
    ([1, 1, 1], ValueError, r"\(B, S\)"),
])
def test_bad_masks_are_refused(mask, error, match):
    with pytest.raises(error, match=match):
        positions_from_mask(torch.tensor(mask))


def test_float_mask_is_a_type_error():
    with pytest.raises(ArgumentTypeError, match="bool or int64"):
        positions_from_mask(torch.ones(2, 3))


def test_left_pad_puts_pads_first():
    ids, mask = left_pad([torch.tensor([5, 6, 7]), torch.tensor([9])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="empty"):
        left_pad([torch.tensor([1]), torch.tensor([], dtype=torch.int64)])
    with pytest.raises(ValueError, match="at least one"):
        left_pad([])


@MODES
@pytest.mark.parametrize("pads", [0, 1, 7])
def test_padded_row_equals_unpadded_in_prefill_and_32_decode_steps(model, invariant, pads):
    short, long = prompts(model, (9, 9 + pads))
    with model.batch_invariant_mode(invariant):
        alone_tokens, alone_logits = generate_batch(model, [short], 32)
        tokens, logits = generate_batch(model, [long, short], 32)
    diff = (logits[1] - alone_logits[0]).abs().amax(-1)
    assert torch.equal(tokens[1], alone_tokens[0])
    assert float(diff.max()) <= ATOL, f"step {int(diff.argmax())} differs by {float(diff.max()):.3g}"
    reference, _ = generate_cached(model, short, 32)
    assert torch.equal(alone_tokens[0], reference)


@MODES
def test_pad_rows_stay_finite(model, invariant):
    """Pad queries have no real key at or before them: every position's logits must still be finite."""
    ids, mask = left_pad(prompts(model, (3, 11)))
    with torch.no_grad(), model.batch_invariant_mode(invariant):
        logits = model(ids, positions_from_mask(mask), model.new_cache(2, 16), attention_mask=mask)
        plain = model(ids, positions_from_mask(mask), attention_mask=mask)         # no cache: the other entry
    assert torch.isfinite(logits).all() and torch.isfinite(plain).all()


@MODES
def test_nan_in_a_pad_slot_does_not_reach_real_rows(model, invariant):
    ids, mask = left_pad(prompts(model, (4, 12)))
    positions = positions_from_mask(mask)
    results = []
    for poison in (False, True):
        cache = model.new_cache(2, 20)
        with torch.no_grad(), model.batch_invariant_mode(invariant):
            step = model(ids, positions, cache, attention_mask=mask)[:, -1]
            if poison:
                cache.v[:, 0, :, :8] = float("nan")          # row 0's eight pad slots, every layer
                cache.k[:, 0, :, 3] = float("nan")
            out, m, pos = [step], mask, positions[:, -1:]
            for _ in range(4):
                m, pos = torch.cat([m, m.new_ones(2, 1)], 1), pos + 1
                out.append(model(out[-1].argmax(-1)[:, None], pos, cache, attention_mask=m)[:, -1])
        results.append(torch.stack(out, 1))
    clean, poisoned = results
    assert torch.isfinite(poisoned).all()
    assert torch.equal(clean, poisoned)


@MODES
@pytest.mark.parametrize("chunk", [1, 3, 64, None])
def test_chunked_prefill_equals_one_pass(model, invariant, chunk):
    batch = prompts(model, (40, 23, 31))
    with model.batch_invariant_mode(invariant):
        one_tokens, one_logits = generate_batch(model, batch, 4)
        tokens, logits = generate_batch(model, batch, 4, prefill_chunk=chunk)
    assert torch.equal(tokens, one_tokens)
    if invariant:
        assert torch.equal(logits, one_logits)
    else:
        assert float((logits - one_logits).abs().max()) <= ATOL


@pytest.mark.parametrize("B", [1, 2, 3, 4, 8, 16])
def test_batch_invariant_mode_is_bitwise_solo_equals_batched(model, B):
    """The contract: with the switch on, a row's logits are bitwise its solo logits, prefill and every
    decode step, whatever the batch size, the row's place in it and the other rows' lengths."""
    row = prompts(model, (10,), seed=1)[0]
    others = prompts(model, [5 + (3 * i) % 13 for i in range(B)], seed=2)
    with model.batch_invariant_mode():
        solo_tokens, solo_logits = generate_batch(model, [row], 8)
        for place in sorted({0, B // 2, B - 1}):
            batch = others[:place] + [row] + others[place + 1:B]
            tokens, logits = generate_batch(model, batch, 8)
            assert torch.equal(logits[place], solo_logits[0]), f"B={B}, row at {place}"
            assert torch.equal(tokens[place], solo_tokens[0])


def test_the_switch_restores_itself_and_refuses_a_custom_attention(model):
    with model.batch_invariant_mode():
        assert model.batch_invariant
        with model.batch_invariant_mode(False):
            assert not model.batch_invariant
        with pytest.raises(ValueError, match="batch_invariant mode"):
            model(torch.tensor([[1, 2]]), torch.arange(2), model.new_cache(1, 4), attention_fn=lambda *a: None)
    assert not model.batch_invariant
    with pytest.raises(ArgumentTypeError):
        with model.batch_invariant_mode(1):
            pass


def test_the_mode_comes_back_after_an_exception_and_is_read_only(model):
    with pytest.raises(RuntimeError, match="inside the mode"):
        with model.batch_invariant_mode():
            raise RuntimeError("inside the mode")
    assert not model.batch_invariant
    with model.batch_invariant_mode():
        with pytest.raises(KeyError):
            with model.batch_invariant_mode(False):
                raise KeyError("inside the nested switch")
        assert model.batch_invariant
    with pytest.raises(AttributeError):
        model.batch_invariant = True
    assert not model.batch_invariant


def test_the_mode_belongs_to_the_context_every_model_in_it_and_no_thread_started_in_it(model):
    """As documented in course_lib.models.ops: one switch for every model of the context; a thread starts
    with the mode off (it computes with the default ops), and its own switch never reaches the caller."""
    other = toy_decoder(seed=1)
    ids, positions = torch.tensor([[3, 1, 4, 1, 5]]), torch.arange(5)
    with torch.no_grad():
        default = model(ids, positions)
        with model.batch_invariant_mode():
            assert other.batch_invariant
            assert not torch.equal(model(ids, positions), default)     # the two paths differ in the last bits
    seen, entered, release = {}, threading.Event(), threading.Event()

    def worker():
        seen["mode at start"] = model.batch_invariant
        with torch.no_grad():
            seen["logits"] = model(ids, positions)
        with model.batch_invariant_mode():
            entered.set()
            release.wait(timeout=30)

    with model.batch_invariant_mode():
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(timeout=60)
    assert seen["mode at start"] is False and torch.equal(seen["logits"], default)
    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert entered.wait(timeout=60)
        assert not model.batch_invariant, "a thread's switch must not reach the thread that started it"
    finally:
        release.set()
        thread.join(timeout=60)


def test_an_asyncio_task_keeps_the_mode_it_was_created_in(model):
    async def scenario():
        started, release = asyncio.Event(), asyncio.Event()

        async def task_body():
            started.set()
            await release.wait()
            return model.batch_invariant

        with model.batch_invariant_mode():
            task = asyncio.create_task(task_body())
        await started.wait()
        caller = model.batch_invariant
        release.set()
        return caller, await task

    assert asyncio.run(scenario()) == (False, True)

def test_forward_hooks_on_the_projections_run_in_both_modes(model):
    """course_lib.quant observes and rewrites the projections' inputs with forward pre-hooks."""
    calls = []
    handle = model.layers[0].q_proj.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    try:
        with torch.no_grad():
            for mode in (False, True):
                with model.batch_invariant_mode(mode):
                    model(torch.tensor([[1, 2, 3]]), torch.arange(3))
    finally:
        handle.remove()
    assert calls == [torch.Size([1, 3, model.config.d_model])] * 2


def test_a_mask_reaches_a_custom_attention_function(model):
    """Lab 2's plug-in point gets the key mask as a keyword when the batch is padded."""
    from course_lib.models.attention import attend_with_cache

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("key_mask"))
        return attend_with_cache(*args, **kwargs)

    ids, mask = left_pad(prompts(model, (2, 5)))
    with torch.no_grad():
        model(ids, positions_from_mask(mask), model.new_cache(2, 8), attention_fn=spy, attention_mask=mask)
    assert seen and all(m is not None and m.shape == (2, 5) for m in seen)


def test_mask_of_the_wrong_width_is_refused(model):
    ids, mask = left_pad(prompts(model, (2, 5)))
    with pytest.raises(ValueError, match=r"attention_mask must be \(B, S\)"):
        model(ids, positions_from_mask(mask), model.new_cache(2, 8), attention_mask=mask[:, 1:])


# -- the Lab 6 measurements of course_lib.batching, on the toy decoder ----------------------------------
def test_batch_sweep_sets_both_bounds_beside_the_measured_step(model):
    """By hand, with a made-up roof of 1 GB/s and 1 GFLOP/s: the toy decoder holds 3,033,344 float32
    parameters (12,133,376 B); a row caches 2 * 4 layers * 2 KV heads * 32 * 4 B = 2,048 B and its attention
    does 4 * 4 layers * 256 = 4,096 FLOPs per position of context (the longest prompt + new_tokens // 2)."""
    from course_lib.batching import batch_sweep
    from course_lib.roofline import MeasuredRoof

    table = batch_sweep(model, prompts(model, (5, 7)), MeasuredRoof(bandwidth=1e9, peak_flops=1e9),
                        batches=(1, 2), new_tokens=2, progress=False)
    w, flops = 12_133_376, 2 * 3_033_344
    # B = 1, context 6: weights max(12,133,376 B, 6,066,688 FLOP); with attention 12,133,376 + 2,048 * 6 B
    # B = 2, context 8: weights 12,133,376 B = 12,133,376 FLOP; with attention 2 * 6,066,688 + 2 * 4,096 * 8
    #   = 12,198,912 FLOP against 12,133,376 + 2 * 2,048 * 8 = 12,166,144 B: compute binds
    assert table.weights_bound_s.tolist() == pytest.approx([w / 1e9, 2 * flops / 1e9], rel=1e-12)
    assert table.predicted_step_s.tolist() == pytest.approx([(w + 2048 * 6) / 1e9, 12_198_912 / 1e9], rel=1e-12)
    assert table.binding.tolist() == ["memory", "compute"]
    assert table.measured_over_predicted.tolist() == pytest.approx(
        (table.decode_step_s / table.predicted_step_s).tolist())


def test_padding_divergence_in_invariant_mode_is_the_solo_run_bit_for_bit(model):
    from course_lib.batching import REPORT_KEYS, padding_divergence

    prompt, filler = prompts(model, (6, 20), seed=3)
    with model.batch_invariant_mode():
        table = padding_divergence(model, prompt, filler, pads=(0, 9), new_tokens=3)
    assert list(table.columns) == ["pads", *REPORT_KEYS] and table.pads.tolist() == [0, 9]
    assert table.tokens_equal.all() and table.first_difference.isna().all()
    assert (table.max_logit_difference == 0).all() and (table.compared_steps == 3).all()
    assert table.attrs["batch_invariant"] is True and table.attrs["new_tokens"] == 3


def test_padding_divergence_default_kernels_stay_within_float32_rounding(model):
    from course_lib.batching import padding_divergence

    prompt, filler = prompts(model, (6, 20), seed=3)
    table = padding_divergence(model, prompt, filler, pads=(0, 9), new_tokens=4)
    assert (table.max_logit_difference < ATOL).all() and table.attrs["batch_invariant"] is False


@pytest.mark.parametrize("change, match", [
    (dict(pads=(0, 20)), "filler holds 20 tokens"), (dict(pads=(-1,)), "pads"), (dict(pads=()), "pads"),
    (dict(new_tokens=0), "new_tokens"), (dict(prompt=torch.ones(2, 3, dtype=torch.int64)), "prompt"),
    (dict(filler=torch.ones(30)), "filler"), (dict(filler=torch.ones(30, dtype=torch.int64).to("meta")), "filler"),
])
def test_padding_divergence_refuses_bad_arguments(model, change, match):
    from course_lib.batching import padding_divergence

    prompt, filler = prompts(model, (6, 20), seed=3)
    kwargs = {**dict(prompt=prompt, filler=filler, pads=(0,), new_tokens=2), **change}
    with pytest.raises(ValueError, match=match):
        padding_divergence(model, **kwargs)


def test_context_sweep_times_a_step_over_a_random_cache_against_both_bounds(model):
    """Toy decoder, 2 rows, made-up roof of 1 GB/s and 1 GFLOP/s: the weights alone bound the step at
    12,133,376 B = 2 * 2 * 3,033,344 FLOP (12.133376 ms); with attention compute binds at
    (12,133,376 + 2 * 4,096 * context) FLOP (the cache adds only 2 * 2,048 * context bytes)."""
    from course_lib.batching import context_sweep
    from course_lib.roofline import MeasuredRoof

    table = context_sweep(model, MeasuredRoof(bandwidth=1e9, peak_flops=1e9), batch=2, contexts=(4, 16),
                          warmup=0, repeats=1)
    assert table.context.tolist() == [4, 16] and table.attrs["batch"] == 2
    assert table.weights_bound_s.tolist() == pytest.approx([12_133_376 / 1e9] * 2, rel=1e-12)
    assert table.predicted_step_s.tolist() == pytest.approx([12_166_144 / 1e9, 12_264_448 / 1e9], rel=1e-12)
    assert (table.binding == "compute").all() and (table.decode_step_s > 0).all()
    with pytest.raises(ValueError, match="contexts"):
        context_sweep(model, MeasuredRoof(bandwidth=1e9, peak_flops=1e9), contexts=(model.config.max_seq_len,))
