"""The simulated int8 KV cache (course_lib.quant.kv_cache; docs/quantization.md#int8-kv-cache)."""
from __future__ import annotations

import pytest
import torch

from course_lib.models import smollm2_135m_config, toy_decoder
from course_lib.quant import QuantScheme
from course_lib.quant.kv_cache import (KV_INT8, QuantizedKVDecoder, fake_quantize_kv, kv_cache_bytes_per_token,
                                       quantized_kv_attention)


def test_one_scale_per_token_and_head_by_hand():
    x = torch.zeros(1, 2, 2, 4)
    x[0, 0, 0] = torch.tensor([31.75, 0.3, -1.0, 0.1])     # absmax 31.75: scale 0.25 (exact in fp16)
    x[0, 1, 0] = torch.tensor([0.5, 0.0, 0.0, 0.0])        # another head: its own scale 0.5 / 127
    x[0, 0, 1] = torch.tensor([-2.54, 1.0, 0.0, 0.0])      # another token: scale 0.02 (rounded to fp16)
    got = fake_quantize_kv(x)
    assert got[0, 0, 0].tolist() == [31.75, 0.25, -1.0, 0.0]          # codes 127, 1, -4, 0
    assert got[0, 1, 0, 0].item() == pytest.approx(0.5, rel=1e-3)
    assert got[0, 1, 1].tolist() == [0.0] * 4                         # a zero vector stays zero
    s = torch.tensor(2.54 / 127).to(torch.float16).float()
    assert torch.allclose(got[0, 0, 1], torch.round(x[0, 0, 1] / s) * s)


def test_error_bound_and_independence_of_vectors():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)
    got = fake_quantize_kv(x)
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    assert bool(((x - got).abs() <= scale / 2 * (1 + 1e-3)).all())
    y = x.clone()
    y[1, 2, 4] *= 100                                      # one vector changes: no other one moves
    other = fake_quantize_kv(y)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, 2, 4] = False
    assert torch.equal(other[mask], got[mask])


def test_bytes_per_token_of_smollm2():
    config = smollm2_135m_config()
    # 2 (K, V) * 30 layers * 3 KV heads * (64 int8 codes + a 2-byte fp16 scale)
    assert kv_cache_bytes_per_token(config) == 2 * 30 * 3 * 66 == 11_880
    assert config.kv_bytes_per_token(2) == 23_040
    assert kv_cache_bytes_per_token(config, QuantScheme(4, "channel", None, symmetric=False)) == 2 * 30 * 3 * 36


def test_prefill_then_decode_sees_the_values_of_one_prefill():
    """A token is rounded once, when written: decode steps read the same cache as one prefill."""
    model = toy_decoder(seed=0)
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    fn = quantized_kv_attention()
    whole = model(ids, torch.arange(12), model.new_cache(1, 12), attention_fn=fn)
    cache = model.new_cache(1, 12)
    model(ids[:, :9], torch.arange(9), cache, attention_fn=fn)
    steps = [model(ids[:, t:t + 1], torch.tensor([t]), cache, attention_fn=fn)[0, -1] for t in range(9, 12)]
    assert torch.allclose(torch.stack(steps), whole[0, 9:], atol=1e-5)
    plain = QuantizedKVDecoder(model, None)(ids, torch.arange(12))
    rounded = QuantizedKVDecoder(model)(ids, torch.arange(12))
    assert torch.allclose(rounded, whole, atol=1e-6)
    assert not torch.equal(rounded, plain) and torch.allclose(rounded, plain, atol=0.05)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="granularity"):
        fake_quantize_kv(torch.ones(1, 1, 1, 4), QuantScheme(8, "tensor", None))
    with pytest.raises(ValueError, match=r"\(B, H, T, D\)"):
        fake_quantize_kv(torch.ones(4, 4))
    with pytest.raises(TypeError, match="new_cache"):
        QuantizedKVDecoder(torch.nn.Linear(2, 2))
    assert KV_INT8.bits == 8
