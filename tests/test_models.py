import math
"""Toy decoder, RoPE, cached attention and the contiguous KV cache (course Lab 2)."""
import pytest
import torch

from course_lib.cache import KVCache
from course_lib.validation import ContextLengthError
from course_lib.models import (Decoder, ModelConfig, apply_rope, attend_with_cache, causal_attention,
                               generate_cached, generate_full_recompute, smollm2_135m_config, toy_config,
                               toy_decoder)


def test_parameter_counts_match_the_spec():
    assert toy_config().parameters() == 3_033_344
    assert sum(p.numel() for p in toy_decoder().parameters()) == 3_033_344
    assert smollm2_135m_config().parameters() == 134_515_008


@pytest.mark.parametrize("bad", [dict(n_kv_heads=3), dict(head_dim=31), dict(n_layers=0), dict(vocab_size=True)])
def test_config_refuses_bad_shapes(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        toy_config(**bad)


def test_rope_properties():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 64, generator=gen), torch.randn(1, 1, 1, 64, generator=gen)
    at = lambda v, p: apply_rope(v, torch.tensor([p]), 10000.0)  # noqa: E731
    assert torch.equal(at(q, 0), q)
    assert torch.allclose(at(q, 777).norm(), q.norm(), rtol=1e-6)
    d1 = (at(q, 10) * at(k, 7)).sum()
    d2 = (at(q, 1010) * at(k, 1007)).sum()
    assert torch.allclose(d1, d2, atol=1e-4)
    assert not torch.allclose(d1, (at(q, 10) * at(k, 9)).sum(), atol=1e-3)


def test_rope_split_half_pairs_by_hand():
    x = torch.zeros(1, 1, 1, 4)
    x[..., 0] = 1.0                                  # pair 0 = (x_0, x_2)
    out = apply_rope(x, torch.tensor([1]), theta=10000.0)
    assert torch.allclose(out[0, 0, 0], torch.tensor([torch.cos(torch.tensor(1.0)), 0, torch.sin(torch.tensor(1.0)), 0]))


def test_rope_refuses_bad_positions():
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(1, 1, 3, 4), torch.arange(2))
    with pytest.raises(ValueError, match="integer"):
        apply_rope(torch.randn(1, 1, 3, 4), torch.arange(3.0))


def test_cached_attention_equals_full_attention_in_pieces():
    gen = torch.Generator().manual_seed(1)
    B, Hq, Hkv, S, D = 2, 6, 2, 11, 8
    q, k, v = torch.randn(B, Hq, S, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen)
    full = causal_attention(q, k, v, 0)
    kc, vc = torch.zeros(B, Hkv, 16, D), torch.zeros(B, Hkv, 16, D)
    parts, start = [], 0
    for T in (4, 1, 6):
        parts.append(attend_with_cache(q[:, :, start:start + T], k[:, :, start:start + T], v[:, :, start:start + T], kc, vc, start))
        start += T
    assert torch.allclose(torch.cat(parts, dim=2), full, atol=1e-6)
    assert torch.equal(kc[:, :, :S], k) and kc[:, :, S:].abs().sum() == 0


def test_gqa_grouping_is_repeat_interleave():
    # query heads 0,1 must read KV head 0 and heads 2,3 KV head 1
    q = torch.randn(1, 4, 1, 4)
    k = torch.stack([torch.zeros(1, 4), torch.ones(1, 4)])[None]          # (1, 2, 1, 4)
    v = torch.stack([torch.zeros(1, 4), torch.ones(1, 4)])[None]
    out = causal_attention(q, k, v, 0)
    assert out[0, :2].abs().sum() == 0 and torch.allclose(out[0, 2:], torch.ones(2, 1, 4))


@pytest.mark.slow
def test_cached_generation_equals_full_recompute():
    model = toy_decoder(seed=0)
    prompt = torch.randint(0, 512, (16,), generator=torch.Generator().manual_seed(1))
    full_t, full_l = generate_full_recompute(model, prompt, 64)
    cache = model.new_cache(1, 16 + 64)
    cached_t, cached_l = generate_cached(model, prompt, 64, cache)
    assert torch.equal(full_t, cached_t)
    assert (full_l - cached_l).abs().max() < 1e-5
    assert cache.length == 16 + 64 - 1
    assert cache.filled_bytes() == 2 * 4 * 2 * 32 * 4 * (16 + 63)


def test_cache_crop_clone_and_overflow():
    model = toy_decoder(seed=0)
    cache = model.new_cache(1, 8)
    model(torch.arange(6).view(1, -1), torch.arange(6), cache)
    copy = cache.clone()
    cache.crop(3)
    assert cache.length == 3 and copy.length == 6
    assert torch.equal(copy.k[:, :, :, :3], cache.k[:, :, :, :3])
    with pytest.raises(ValueError, match="overflow"):
        model(torch.arange(6).view(1, -1), torch.arange(3, 9), cache)
    with pytest.raises(ValueError, match="crop"):
        cache.crop(4)


def test_decoder_refuses_bad_inputs():
    model = toy_decoder(seed=0)
    with pytest.raises(ValueError, match="int64"):
        model(torch.arange(4, dtype=torch.int32).view(1, -1), torch.arange(4))
    with pytest.raises(ValueError, match="batch"):
        model(torch.zeros(2, 3, dtype=torch.long), torch.arange(3), model.new_cache(1, 8))


def test_state_dict_round_trip_and_shape_errors():
    model = toy_decoder(seed=3)
    hf_names = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("layers."):
            i, rest = name.split(".", 2)[1:]
            kind = "self_attn" if rest[0] in "qkvo" else "mlp" if rest.split("_")[0] in ("gate", "up", "down") else None
            name = f"model.layers.{i}.{kind}.{rest}" if kind else f"model.layers.{i}.{rest}"
        elif not name.startswith("lm_head"):
            name = "model." + name
        hf_names[name] = tensor
    again = Decoder.from_hf_state_dict(model.config, hf_names)
    ids = torch.arange(5).view(1, -1)
    assert torch.equal(again(ids, torch.arange(5)), model(ids, torch.arange(5)))
    hf_names["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="norm.weight"):
        Decoder.from_hf_state_dict(model.config, hf_names)


def test_kvcache_refuses_bad_sizes():
    with pytest.raises(ValueError, match="max_len"):
        KVCache(1, 1, 1, 0, 4)
    assert KVCache.for_model(toy_config(), 1, 10).allocated_bytes() == 2 * 4 * 1 * 2 * 10 * 32 * 4


def test_config_refuses_gqa_mismatch():
    with pytest.raises(ValueError, match="divide"):
        ModelConfig(n_layers=1, d_model=8, n_heads=3, n_kv_heads=2, head_dim=4, d_ff=8, vocab_size=10)


def test_decoder_refuses_positions_of_the_wrong_rank_or_length():
    model = toy_decoder(seed=0)
    ids = torch.arange(4).view(1, -1)
    with pytest.raises(ValueError, match=r"\(T,\) or \(B, T\)"):
        model(ids, torch.tensor(3))
    with pytest.raises(ValueError, match="entries for T=4"):
        model(ids, torch.arange(3))


# -- inputs are checked once, at the boundary (course_lib.validation) --------------------
# Each bad input raises TypeError (wrong type/dtype) or ValueError (wrong value) with a message
# that names the argument; ArgumentTypeError is both, so older `except ValueError` still works.
from course_lib.models.config import MAX_POSITIONS, config_from_hf  # noqa: E402
from course_lib.validation import ArgumentTypeError  # noqa: E402


@pytest.fixture(scope="module")
def toy():
    return toy_decoder(seed=0)


@pytest.mark.parametrize("bad_id", [512, -1])
def test_forward_refuses_token_ids_outside_the_vocabulary(toy, bad_id):
    ids = torch.tensor([[3, bad_id, 7]])
    with pytest.raises(ValueError, match=r"input_ids must hold values in \[0, 511\].*vocab_size 512"):
        toy(ids, torch.arange(3))


@pytest.mark.parametrize("positions", [torch.arange(-4, 0), torch.arange(522, 526),
                                       torch.arange(10 ** 9, 10 ** 9 + 4)])
def test_forward_refuses_positions_outside_0_to_max_seq_len(toy, positions):
    with pytest.raises(ValueError, match=r"positions must hold values in \[0, 511\].*max_seq_len is 512") as info:
        toy(torch.zeros(1, 4, dtype=torch.long), positions)
    # past the context the policy is to refuse: a ContextLengthError; a negative position is a plain ValueError
    assert isinstance(info.value, ContextLengthError) == bool(positions[0] > 0)


def test_forward_accepts_the_last_position_and_a_cache_of_exactly_max_seq_len(toy):
    cache = toy.new_cache(1)                           # max_len = max_seq_len = 512
    assert cache.max_len == 512
    toy(torch.zeros(1, 512, dtype=torch.long), torch.arange(512), cache)
    assert cache.length == 512


@pytest.mark.parametrize("generate", [generate_cached, generate_full_recompute])
def test_generation_refuses_an_empty_prompt(toy, generate):
    with pytest.raises(ValueError, match="prompt must hold at least one token"):
        generate(toy, torch.tensor([], dtype=torch.long), 4)


@pytest.mark.parametrize("generate", [generate_cached, generate_full_recompute])
def test_generation_of_zero_tokens_is_empty_with_the_right_shape_and_dtype(toy, generate):
    tokens, logits = generate(toy, torch.arange(5), 0)
    assert tokens.shape == (0,) and tokens.dtype == torch.int64
    assert logits.shape == (0, 512) and logits.dtype == torch.float32


def test_generation_of_zero_tokens_leaves_a_given_cache_unchanged(toy):
    cache = toy.new_cache(1, 8)
    generate_cached(toy, torch.arange(5), 0, cache)
    assert cache.length == 0


@pytest.mark.parametrize("generate", [generate_cached, generate_full_recompute])
@pytest.mark.parametrize("bad, error", [(-1, ValueError), (2.0, TypeError), (True, TypeError),
                                        (torch.tensor(3), TypeError)])
def test_generation_refuses_bad_max_new_tokens(toy, generate, bad, error):
    with pytest.raises(error, match="max_new_tokens must be an int"):
        generate(toy, torch.arange(5), bad)


@pytest.mark.parametrize("generate", [generate_cached, generate_full_recompute])
def test_generation_refuses_to_run_past_max_seq_len_before_computing(toy, generate):
    tokens, _ = generate(toy, torch.arange(500), 13)    # positions 0 .. 511: the last one fits
    assert tokens.shape == (13,)
    with pytest.raises(ContextLengthError, match=r"max_new_tokens must be an int in \[0, 13\].*refuses"):
        generate(toy, torch.arange(500), 14)
    with pytest.raises(ContextLengthError, match="prompt must hold at most max_seq_len = 512"):
        generate(toy, torch.zeros(513, dtype=torch.long), 1)
    with pytest.raises(ValueError, match=r"max_new_tokens must be an int in \[0, 13\]") as info:
        generate(toy, torch.arange(500), -1)
    assert not isinstance(info.value, ContextLengthError)             # a bad count, not a context limit


@pytest.mark.parametrize("generate", [generate_cached, generate_full_recompute])
@pytest.mark.parametrize("prompt, error, pattern", [
    (torch.tensor([3, 512]), ValueError, r"prompt must hold values in \[0, 511\]"),
    (torch.tensor([-1, 3]), ValueError, r"prompt must hold values in \[0, 511\]"),
    (torch.tensor([1.0, 2.0]), TypeError, "prompt must be an int64 tensor"),
    ([1, 2, 3], TypeError, "prompt must be an int64 tensor"),
    (torch.zeros(2, 3, dtype=torch.long), ValueError, "prompt must have shape"),
])
def test_generation_refuses_bad_prompts(toy, generate, prompt, error, pattern):
    with pytest.raises(error, match=pattern):
        generate(toy, prompt, 2)


def test_generate_cached_refuses_a_cache_that_is_not_empty_or_too_short(toy):
    used = toy.new_cache(1, 32)
    toy(torch.arange(3).view(1, -1), torch.arange(3), used)
    with pytest.raises(ValueError, match=r"cache must be empty \(length 0\)"):
        generate_cached(toy, torch.arange(4), 4, used)
    with pytest.raises(ValueError, match="cache must have at least T0 \\+ max_new_tokens - 1 = 7 slots"):
        generate_cached(toy, torch.arange(4), 4, toy.new_cache(1, 6))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        generate_cached(toy, torch.arange(4), 4, cache=(used.k, used.v))
    generate_cached(toy, torch.arange(4), 4, toy.new_cache(1, 7))   # exactly enough


@pytest.mark.parametrize("bad", [2.5, True, torch.tensor(2)])
def test_kvcache_crop_refuses_non_int_lengths(bad):
    cache = KVCache(1, 1, 1, 8, 4)
    cache.advance(6)
    with pytest.raises(TypeError, match=r"crop length must be an int in \[0, 6\]"):
        cache.crop(bad)
    assert cache.length == 6 and type(cache.length) is int


def test_kvcache_crop_accepts_numpy_ints_and_stores_an_int():
    import numpy as np
    cache = KVCache(1, 1, 1, 8, 4)
    cache.advance(6)
    cache.crop(np.int64(2))
    assert cache.length == 2 and type(cache.length) is int


@pytest.mark.parametrize("bad, error", [(-3, ValueError), (1.0, TypeError), (False, TypeError)])
def test_kvcache_advance_refuses_negative_or_non_int_counts(bad, error):
    cache = KVCache(1, 1, 1, 8, 4)
    cache.advance(2)
    with pytest.raises(error, match="n_new must be an int >= 0"):
        cache.advance(bad)
    assert cache.length == 2


@pytest.mark.parametrize("bad, error", [(2.5, TypeError), (-1, ValueError), (9, ValueError)])
def test_kvcache_length_assignment_is_checked(bad, error):
    cache = KVCache(1, 1, 1, 8, 4)
    with pytest.raises(error, match=r"KVCache.length must be an int in \[0, 8\]"):
        cache.length = bad
    cache.length = 8
    assert cache.filled_bytes() == 2 * 1 * 1 * 1 * 8 * 4 * 4


@pytest.mark.parametrize("max_len, error", [(0, ValueError), (-5, ValueError), (513, ValueError),
                                            (8.0, TypeError), (True, TypeError)])
def test_new_cache_refuses_bad_max_len(toy, max_len, error):
    with pytest.raises(error, match=r"max_len must be an int in \[1, 512\]"):
        toy.new_cache(1, max_len)


def test_new_cache_refuses_bad_batch(toy):
    with pytest.raises(ValueError, match="KVCache batch must be an int >= 1"):
        toy.new_cache(0, 8)


@pytest.mark.parametrize("sizes, what", [
    (dict(n_kv_heads=4), "n_kv_heads"), (dict(head_dim=16), "head_dim"),
    (dict(n_layers=3), "n_layers"), (dict(n_layers=5), "n_layers"),
])
def test_forward_refuses_a_cache_built_for_another_shape(toy, sizes, what):
    shape = dict(n_layers=4, batch=1, n_kv_heads=2, max_len=16, head_dim=32) | sizes
    cache = KVCache(**shape)
    with pytest.raises(ValueError, match=f"cache {what} is {sizes[what]} but the model needs"):
        toy(torch.arange(3).view(1, -1), torch.arange(3), cache)
    assert cache.length == 0


def test_kvcache_refuses_integer_dtypes():
    for dtype in (torch.int64, torch.int8, torch.bool):
        with pytest.raises(TypeError, match="KVCache dtype must be a floating torch dtype"):
            KVCache(4, 1, 2, 16, 32, dtype=dtype)
    with pytest.raises(TypeError, match="KVCache dtype must be a dtype"):
        KVCache(4, 1, 2, 16, 32, dtype="float32")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_forward_refuses_a_cache_of_another_dtype(toy, dtype):
    cache = KVCache.for_model(toy.config, 1, 16, dtype=dtype)
    with pytest.raises(TypeError, match=f"cache dtype must be the model's dtype torch.float32, got {dtype}"):
        toy(torch.arange(3).view(1, -1), torch.arange(3), cache)


def test_kvcache_layer_index_is_checked():
    cache = KVCache(2, 1, 1, 4, 4)
    assert cache.layer(1)[0].shape == (1, 1, 4, 4)
    with pytest.raises(ValueError, match=r"index must be an int in \[0, 1\]"):
        cache.layer(2)
    with pytest.raises(TypeError, match="index must be an int"):
        cache.layer(torch.tensor(0))


def test_kvcache_for_model_needs_a_model_config():
    with pytest.raises(TypeError, match="config must be a ModelConfig"):
        KVCache.for_model({"n_layers": 4})


@pytest.mark.parametrize("call, error, pattern", [
    (lambda m: m([[1, 2]], torch.arange(2)), TypeError, "input_ids must be an int64 tensor"),
    (lambda m: m(torch.zeros(1, 0, dtype=torch.long), torch.arange(0)), ValueError, "at least one token"),
    (lambda m: m(torch.zeros(3, dtype=torch.long), torch.arange(3)), ValueError, r"input_ids must be .*\(B, T\)"),
    (lambda m: m(torch.zeros(1, 2, dtype=torch.long), [0, 1]), TypeError, "positions must be an int64 tensor"),
    (lambda m: m(torch.zeros(1, 2, dtype=torch.long), torch.arange(2, dtype=torch.int32)), TypeError,
     "positions must be an int64 tensor"),
    (lambda m: m(torch.zeros(2, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long)), ValueError,
     r"positions must be \(B, T\) with B=2"),
    (lambda m: m(torch.zeros(1, 2, dtype=torch.long), torch.arange(2), cache="cache"), TypeError,
     "cache must be a KVCache"),
    (lambda m: m(torch.zeros(1, 2, dtype=torch.long), torch.arange(2), m.new_cache(1, 4), attention_fn=3),
     TypeError, "attention_fn must be callable"),
    (lambda m: m(torch.zeros(1, 2, dtype=torch.long), torch.arange(2), last_only=1), TypeError,
     "last_only must be a bool"),
    (lambda m: m.decode(torch.zeros(1, 2, dtype=torch.long), m.new_cache(1, 4)), ValueError, r"\(B, 1\)"),
    (lambda m: m.prefill(torch.zeros(1, 2, dtype=torch.long), None), TypeError, "cache must be a KVCache"),
])
def test_forward_refuses_bad_arguments_naming_them(toy, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(toy)


def test_forward_checks_leave_the_cache_unchanged(toy):
    cache = toy.new_cache(1, 8)
    toy(torch.arange(2).view(1, -1), torch.arange(2), cache)
    before = cache.k.clone()
    with pytest.raises(ValueError, match="positions"):
        toy(torch.arange(2).view(1, -1), torch.tensor([2, 600]), cache)
    with pytest.raises(ValueError, match="input_ids"):
        toy(torch.tensor([[2, 600]]), torch.arange(2, 4), cache)
    assert cache.length == 2 and torch.equal(cache.k, before)


def test_type_errors_are_also_value_errors_for_older_callers(toy):
    with pytest.raises(ArgumentTypeError) as info:
        KVCache(1, 1, 1, 8, 4).crop(2.5)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_decoder_constructors_check_their_arguments():
    with pytest.raises(TypeError, match="config must be a ModelConfig"):
        Decoder({"n_layers": 2})
    with pytest.raises(TypeError, match="seed must be an int"):
        Decoder.random(toy_config(n_layers=1), seed=1.5)
    model = toy_decoder(seed=0, n_layers=1)
    state = {k: v for k, v in model.state_dict().items()}
    state["norm.weight"] = [1.0] * 256
    with pytest.raises(TypeError, match=r"state_dict\['norm.weight'\] must be a Tensor"):
        Decoder.from_hf_state_dict(model.config, state)


@pytest.mark.parametrize("bad, error, pattern", [
    (dict(max_seq_len=MAX_POSITIONS + 1), ValueError, r"max_seq_len must be an int in \[1, 16777216\]"),
    (dict(max_seq_len=512.0), TypeError, "max_seq_len must be an int"),
    (dict(d_ff=-1), ValueError, "d_ff must be an int >= 1"),
    (dict(norm_eps=0.0), ValueError, "norm_eps must be a finite number > 0"),
    (dict(rope_theta=float("nan")), ValueError, "rope_theta must be a finite number > 0"),
    (dict(rope_theta="10000"), TypeError, "rope_theta must be a finite number"),
    (dict(tie_embeddings=1), TypeError, "tie_embeddings must be a bool"),
    (dict(n_heads=None), TypeError, "n_heads must be an int"),
])
def test_config_fields_are_checked_with_type_and_range(bad, error, pattern):
    with pytest.raises(error, match=pattern):
        toy_config(**bad)


def test_config_stores_numpy_sizes_as_ints():
    import numpy as np
    c = toy_config(n_layers=np.int64(2), max_seq_len=np.int32(64))
    assert type(c.n_layers) is int and type(c.max_seq_len) is int and c == toy_config(n_layers=2, max_seq_len=64)


def test_config_from_hf_names_missing_keys():
    with pytest.raises(ValueError, match="hf_config lacks num_hidden_layers, vocab_size"):
        config_from_hf({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128})
    with pytest.raises(TypeError, match="hf_config must be a transformers config or a dict"):
        config_from_hf("HuggingFaceTB/SmolLM2-135M")
    with pytest.raises(ValueError, match="n_heads must be an int >= 1"):
        config_from_hf({"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 0,
                        "intermediate_size": 128, "vocab_size": 10})


def test_kv_bytes_per_token_checks_bytes_per_value():
    with pytest.raises(ValueError, match="bytes_per_value must be a finite number > 0"):
        toy_config().kv_bytes_per_token(0)


def test_apply_rope_accepts_negative_positions_but_not_beyond_float32_exactness():
    x = torch.randn(1, 1, 2, 8)
    back = apply_rope(apply_rope(x, torch.tensor([5, 9])), torch.tensor([-5, -9]))
    assert torch.allclose(back, x, atol=1e-5)                       # a negative angle turns back
    with pytest.raises(ValueError, match=r"positions must hold values in \[-16777216, 16777216\]"):
        apply_rope(x, torch.tensor([10 ** 9, 10 ** 9 + 3]))


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: apply_rope([[1.0]], torch.arange(1)), TypeError, "x must be a Tensor"),
    (lambda: apply_rope(torch.zeros(1, 1, 2, 4, dtype=torch.long), torch.arange(2)), TypeError,
     "x must be a floating tensor"),
    (lambda: apply_rope(torch.zeros(1, 1, 2, 4), torch.arange(2), theta=0), ValueError, "theta must be"),
    (lambda: apply_rope(torch.zeros(1, 1, 2, 4), torch.tensor([True, False])), TypeError,
     "positions must be an integer tensor"),
])
def test_rope_refuses_bad_arguments(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


@pytest.mark.parametrize("start, error", [(1.0, TypeError), (True, TypeError), (torch.tensor(1), TypeError),
                                          (-1, ValueError)])
def test_attention_refuses_a_bad_start(start, error):
    q, k = torch.randn(1, 2, 1, 4), torch.randn(1, 1, 2, 4)
    with pytest.raises(error, match="start must be an int >= 0"):
        causal_attention(q, k, k, start)
    kc = torch.zeros(1, 1, 8, 4)
    with pytest.raises(error, match="start must be an int >= 0"):
        attend_with_cache(q, k[:, :, :1], k[:, :, :1], kc, kc.clone(), start)


def test_attend_with_cache_refuses_a_cache_of_another_shape():
    q, kn = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8)
    for kc in (torch.zeros(1, 4, 16, 8), torch.zeros(1, 2, 16, 4), torch.zeros(2, 2, 16, 8)):
        with pytest.raises(ValueError, match="k_cache and v_cache must both be"):
            attend_with_cache(q, kn, kn, kc, kc.clone(), 0)
    with pytest.raises(TypeError, match="k_cache must be a floating tensor"):
        attend_with_cache(q, kn, kn, torch.zeros(1, 2, 16, 8, dtype=torch.long), torch.zeros(1, 2, 16, 8), 0)


def test_repeat_kv_refuses_a_bad_group_size():
    with pytest.raises(ValueError, match="group_size must be an int >= 1"):
        from course_lib.models import repeat_kv
        repeat_kv(torch.zeros(1, 1, 1, 1), 0)


def test_inputs_and_cache_on_another_device_are_refused_before_any_work(toy):
    # the meta device stands in for "another device" on a CPU-only machine; a meta tensor holds no
    # values, and inputs say so (validation.materialized) before any device comparison
    ids = torch.zeros(1, 2, dtype=torch.long)
    meta = "must be a tensor with data, on the cpu or cuda device, got one on the meta device"
    with pytest.raises(ValueError, match=f"positions {meta}"):
        toy(ids, torch.arange(2, device="meta"))
    with pytest.raises(ValueError, match=f"input_ids {meta}"):
        toy(ids.to("meta"), torch.arange(2))
    with pytest.raises(ValueError, match=f"prompt {meta}"):
        generate_full_recompute(toy, torch.arange(3, device="meta"), 2)
    cache = KVCache(4, 1, 2, 8, 32, device="meta")
    with pytest.raises(ValueError, match="cache is on meta but the model is on cpu"):
        toy(ids, torch.arange(2), cache)


def test_from_hf_state_dict_needs_a_mapping():
    with pytest.raises(TypeError, match="state_dict must be a Mapping"):
        Decoder.from_hf_state_dict(toy_config(n_layers=1), [("norm.weight", torch.ones(256))])


# -- transformers configs: RoPE scaling implemented, unsupported fields refused ---------------------
from course_lib.models.config import ROPE_SCALING_TYPES, RopeScaling  # noqa: E402
from course_lib.models.rope import rope_cos_sin, rope_frequencies  # noqa: E402

#: Llama 3.2's RoPE scaling (its config.json).
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
#: Llama-3.2-1B-shaped sizes, as LlamaConfig keyword arguments.
LLAMA32_1B = dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                  intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=True)


def _llama32_1b_forms():
    """The same Llama-3.2-1B-shaped config three ways: a transformers LlamaConfig, its to_dict()
    (transformers >= 5: theta and scaling in rope_parameters) and a config.json written by
    transformers < 5 (rope_theta beside rope_scaling)."""
    from transformers import LlamaConfig
    hf = LlamaConfig(**LLAMA32_1B, rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING))
    old_json = {**LLAMA32_1B, "model_type": "llama", "hidden_act": "silu", "attention_bias": False,
                "mlp_bias": False, "rope_theta": 500000.0, "rope_scaling": dict(LLAMA3_SCALING)}
    return hf, {"LlamaConfig": hf, "to_dict()": hf.to_dict(), "config.json (transformers < 5)": old_json}


def test_llama3_rope_scaling_is_loaded_and_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf, forms = _llama32_1b_forms()
    for name, form in forms.items():
        config = config_from_hf(form)
        assert config.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192), name
        assert (config.rope_theta, config.head_dim, config.max_seq_len) == (500000.0, 64, 131072), name
    scaling = config_from_hf(hf).rope_scaling
    want, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](hf)
    assert attention_factor == 1.0
    torch.testing.assert_close(rope_frequencies(64, 500000.0, scaling), want, rtol=1e-6, atol=0)
    # cos and sin against transformers' rotary embedding (cat(freqs, freqs): the first half is ours)
    positions = torch.tensor([0, 1, 100, 4095, 8192, 65536, 131071])
    cos_want, sin_want = LlamaRotaryEmbedding(hf)(torch.zeros(1, dtype=torch.float32), positions[None])
    cos, sin = rope_cos_sin(positions, 64, 500000.0, scaling=scaling)
    torch.testing.assert_close(cos[0, 0], cos_want[0, :, :32], rtol=0, atol=1e-5)
    torch.testing.assert_close(sin[0, 0], sin_want[0, :, :32], rtol=0, atol=1e-5)
    # and plain RoPE would turn by other angles: mean cos of the angle difference at 8,192 is far from 1
    plain, _ = rope_cos_sin(torch.tensor([8192]), 64, 500000.0)
    assert (plain - cos).abs().max() > 0.5


def test_linear_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(**LLAMA32_1B, rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0})
    config = config_from_hf(hf)
    assert config.rope_scaling == RopeScaling("linear", 4.0)
    want, _ = ROPE_INIT_FUNCTIONS["linear"](hf)
    torch.testing.assert_close(rope_frequencies(64, 10000.0, config.rope_scaling), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("head_dim, theta, factor", [(64, 10000.0, 4.0), (16, 500.0, 8.0), (128, 500000.0, 2.0)])
def test_ntk_frequencies_match_transformers_dynamic_ntk(head_dim, theta, factor):
    """transformers' dynamic NTK changes the base to theta * (f L / C - (f - 1)) ** (d / (d - 2)) for a
    sequence of L > C positions (config factor f). With f = 2 and L = C (factor + 1) / 2 the bracket
    is ``factor``: the static NTK-aware base change of bloc97's post."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from course_lib.models.rope import ntk_frequencies

    C = 1024
    hf = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=C,
                     rope_theta=theta, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    want, attention_factor = ROPE_INIT_FUNCTIONS["dynamic"](hf, seq_len=int(C * (factor + 1) / 2))
    assert attention_factor == 1.0
    got = ntk_frequencies(head_dim, theta, factor)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0)
    plain = rope_frequencies(head_dim, theta)
    # by hand: pair 0 kept, the slowest pair divided by exactly the factor
    assert got[0] == 1.0 and float(plain[-1] / got[-1]) == pytest.approx(factor, rel=1e-5)


@pytest.mark.parametrize("head_dim, theta, factor, context", [(64, 10000.0, 4.0, 2048), (16, 10000.0, 8.0, 512),
                                                              (128, 500000.0, 16.0, 4096), (8, 100.0, 2.0, 64)])
def test_yarn_frequencies_match_transformers(head_dim, theta, factor, context):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from course_lib.models.rope import yarn_attention_factor, yarn_frequencies

    hf = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                     max_position_embeddings=int(context * factor), rope_theta=theta,
                     rope_scaling={"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": context})
    want, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    got = yarn_frequencies(head_dim, theta, factor, context)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0)
    assert yarn_attention_factor(factor) == pytest.approx(attention_factor, rel=1e-12)


def test_yarn_bands_by_hand():
    """head_dim 16, theta 1e4, C 2048: pair i turns 2048 / (2 pi 1e4 ** (i / 8)) times over C, i.e.
    326, 103, 32.6, 10.3, 3.26, 1.03, 0.33, 0.10. Band edges: floor(16 ln(2048 / (2 pi 32)) / (2 ln 1e4))
    = floor(2.02) = 2 and ceil(16 ln(2048 / (2 pi)) / (2 ln 1e4)) = ceil(5.03) = 6: pairs 0 to 2 (more than
    32 turns) kept, 6 and 7 divided by the factor, pair i between blended with weight (i - 2) / 4 on
    omega / factor."""
    from course_lib.models.rope import yarn_attention_factor, yarn_frequencies

    plain = rope_frequencies(16, 10000.0)
    got = yarn_frequencies(16, 10000.0, 4.0, 2048)
    torch.testing.assert_close(got[:3], plain[:3], rtol=0, atol=0)
    torch.testing.assert_close(got[6:], plain[6:] / 4, rtol=1e-6, atol=0)
    for i in range(3, 6):
        w = (i - 2) / 4
        assert float(got[i]) == pytest.approx(float(plain[i]) * ((1 - w) + w / 4), rel=1e-6)
    assert yarn_attention_factor(4.0) == pytest.approx(1 + 0.1 * math.log(4.0))
    assert yarn_attention_factor(1.0) == 1.0


@pytest.mark.parametrize("call, match", [
    (lambda f: f["ntk"](15, 10000.0, 2.0), "head_dim"),
    (lambda f: f["ntk"](16, 10000.0, 0.0), "factor"),
    (lambda f: f["yarn"](16, 1.0, 2.0, 512), "theta must be > 1"),
    (lambda f: f["yarn"](16, 10000.0, 2.0, 0), "original_max_position_embeddings"),
    (lambda f: f["yarn"](16, 10000.0, 2.0, 512, beta_fast=1.0, beta_slow=32.0), "beta_slow"),
])
def test_ntk_and_yarn_refuse_bad_arguments(call, match):
    from course_lib.models.rope import ntk_frequencies, yarn_frequencies

    with pytest.raises(ValueError, match=match):
        call({"ntk": ntk_frequencies, "yarn": yarn_frequencies})


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 512},
    {"rope_type": "linear", "factor": 4.0},
])
@torch.no_grad()
def test_decoder_with_rope_scaling_matches_transformers(scaling):
    # head_dim 16, theta 1e4: wavelengths 6.3 .. 19,869 positions, so with a 512-position pre-training
    # context (kept below 128, scaled above 512) llama3 meets all three of its bands. RoPE scores depend
    # on the distance between positions, so the sequence is long (distances up to 399).
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
                     rope_theta=10000.0, rope_scaling=dict(scaling), tie_word_embeddings=False)
    peer = LlamaForCausalLM(hf).eval()
    gen = torch.Generator().manual_seed(0)
    for name, p in peer.named_parameters():   # weights large enough that attention is far from uniform
        if not name.endswith("norm.weight"):
            p.data = torch.randn(p.shape, generator=gen) * (1.0 if "embed" in name else 0.5 / p.shape[1] ** 0.5)
    ours = Decoder.from_hf_state_dict(config_from_hf(hf), peer.state_dict())
    ids = torch.randint(0, 64, (1, 400), generator=gen)
    positions = torch.arange(1000, 1400)
    want = peer(ids, position_ids=positions[None]).logits
    assert (ours(ids, positions) - want).abs().max() <= 1e-4
    unscaled = Decoder.from_hf_state_dict(ModelConfig(**{**ours.config.to_dict(), "rope_scaling": None}),
                                          peer.state_dict())
    assert (unscaled(ids, positions) - want).abs().max() > 1e-3    # dropping the scaling shows (10x the bound)


_SMALL = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=100, max_position_embeddings=256)


def _qwen3():
    from transformers import Qwen3Config
    return Qwen3Config(**{k: v for k, v in _SMALL.items() if k != "model_type"})


def _mistral(**kw):
    from transformers import MistralConfig
    return MistralConfig(**{k: v for k, v in _SMALL.items() if k not in ("model_type", "max_position_embeddings")},
                         **kw)


@pytest.mark.parametrize("make, pattern", [
    (_qwen3, r"model_type='qwen3' is not supported.*QK norm"),
    (lambda: {**_SMALL, "model_type": "qwen2"}, r"model_type='qwen2' is not supported.*biases"),
    (lambda: {**_SMALL, "model_type": "gemma2"}, r"model_type='gemma2' is not supported"),
    (lambda: {**_SMALL, "attention_bias": True}, r"attention_bias=True is not supported.*biases"),
    (lambda: {**_SMALL, "mlp_bias": True}, r"mlp_bias=True is not supported"),
    (lambda: {**_SMALL, "use_qk_norm": True}, r"use_qk_norm=True is not supported.*QK norm"),
    (lambda: {**_SMALL, "hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
    (lambda: _mistral(), r"sliding_window=4096 is not supported.*sliding-window"),
    (lambda: {**_SMALL, "sliding_window": 128}, r"sliding_window=128 is not supported"),
    (lambda: {**_SMALL, "layer_types": ["full_attention", "sliding_attention"]}, r"layer_types=.* is not supported"),
    (lambda: {**_SMALL, "partial_rotary_factor": 0.5}, r"partial_rotary_factor=0.5 is not supported"),
    (lambda: {**_SMALL, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
     r"rope_scaling .*rope_type 'yarn'.*implements linear, llama3"),
    (lambda: {**_SMALL, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rope_scaling .*rope_type 'dynamic'"),
    (lambda: {**_SMALL, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
     r"rope_scaling .*rope_type 'longrope'"),
    (lambda: {**_SMALL, "rope_scaling": {"factor": 2.0}}, r"rope_scaling .*rope_type None"),
    (lambda: {**_SMALL, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     r"rope_scaling: RopeScaling: rope_type 'llama3' needs low_freq_factor, high_freq_factor, "
     r"original_max_position_embeddings"),
    (lambda: {**_SMALL, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     r"rope_parameters=.* is not supported.*per-layer"),
])
def test_config_from_hf_refuses_what_the_reference_decoder_does_not_compute(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        config_from_hf(make())


@pytest.mark.parametrize("make", [
    lambda: _mistral(sliding_window=None),                                     # Mistral without a window is Llama
    lambda: {**_SMALL, "sliding_window": 4096, "use_sliding_window": False},   # a window switched off
    lambda: {**_SMALL, "sliding_window": 256},                                 # a window as long as the context
    lambda: {**_SMALL, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "pretraining_tp": 2,
             "attention_dropout": 0.1, "layer_types": ["full_attention"] * 2},
    lambda: {k: v for k, v in _SMALL.items() if k != "model_type"},            # a hand-written dict
])
def test_config_from_hf_accepts_llama_equivalent_configs(make):
    config = config_from_hf(make())
    assert (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads, config.head_dim) == (2, 64, 4, 2, 16)
    assert config.rope_scaling is None


def test_rope_scaling_is_checked_and_round_trips_through_to_dict():
    assert ROPE_SCALING_TYPES == ("linear", "llama3")
    with pytest.raises(ValueError, match=r"rope_type must be one of \['linear', 'llama3'\]"):
        RopeScaling("yarn", 2.0)
    with pytest.raises(ValueError, match="factor must be a finite number > 0"):
        RopeScaling("linear", 0.0)
    with pytest.raises(ValueError, match="'linear' takes only a factor, got low_freq_factor"):
        RopeScaling("linear", 2.0, low_freq_factor=1.0)
    with pytest.raises(ValueError, match=r"low_freq_factor \(4.0\) must be below high_freq_factor \(1.0\)"):
        RopeScaling("llama3", 8.0, 4.0, 1.0, 8192)
    with pytest.raises(TypeError, match="original_max_position_embeddings must be an int"):
        RopeScaling("llama3", 8.0, 1.0, 4.0, 8192.0)
    with pytest.raises(TypeError, match="rope_scaling must be None, a RopeScaling or a dict"):
        toy_config(rope_scaling="llama3")
    config = toy_config(rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 256))
    assert ModelConfig(**config.to_dict()) == config and hash(config) == hash(ModelConfig(**config.to_dict()))
    assert toy_config(rope_scaling={"rope_type": "linear", "factor": 2.0}).rope_scaling == RopeScaling("linear", 2.0)
