"""Toy decoder, RoPE, cached attention and the contiguous KV cache (course Lab 2)."""
import pytest
import torch

from course_lib.cache import KVCache
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
