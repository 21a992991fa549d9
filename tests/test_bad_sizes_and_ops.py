"""Bad input to the batch-invariant PyTorch ops, and sizes refused before they reach an allocator or
Triton's block limit (``validation.fits_memory``, ``kernels.check_tile``): each names the argument
and what it would need, and a valid size still works."""
from __future__ import annotations

import pytest
import torch

from course_lib.kernels import MAX_TILE_ELEMENTS
from course_lib.kernels.batch_invariant import torch_ops as ops
from course_lib.validation import ArgumentTypeError, fits_memory, memory_bytes

HUGE = 2 ** 40


# ---------------------------------------------------------------- the batch-invariant ops
@pytest.mark.parametrize("eps, error", [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), ("1e-5", ArgumentTypeError),
                                        (torch.tensor(1e-5), ArgumentTypeError), (None, ArgumentTypeError)])
def test_rms_norm_refuses_an_eps_that_is_not_a_positive_number(eps, error):
    with pytest.raises(error, match=r"eps must be a finite number > 0"):
        ops.rms_norm(torch.zeros(2, 4), torch.ones(4), eps)
    assert torch.isfinite(ops.rms_norm(torch.zeros(2, 4), torch.ones(4), 1e-6)).all()


@pytest.mark.parametrize("allowed, error, match", [
    (torch.ones(2, 5, dtype=torch.int64), ArgumentTypeError, "allowed must be a bool tensor"),
    (torch.ones(2, 5), ArgumentTypeError, "allowed must be a bool tensor"),
    (torch.ones(3, dtype=torch.bool), ValueError, r"shape \(3,\) does not broadcast to the scores' shape \(2, 5\)"),
    (torch.ones(2, 2, 5, dtype=torch.bool), ValueError, "does not broadcast"),
    ("abc", ArgumentTypeError, "allowed must be a Tensor"),
    (torch.ones(2, 5, dtype=torch.bool, device="meta"), ValueError, "allowed is on meta"),
])
def test_softmax_refuses_a_mask_that_is_not_a_bool_tensor_of_the_scores_shape(allowed, error, match):
    with pytest.raises(error, match=match):
        ops.softmax(torch.randn(2, 5), allowed)


def test_softmax_takes_a_broadcast_mask_and_an_empty_axis():
    scores = torch.randn(2, 5)
    row = torch.tensor([True, True, False, True, False])
    assert torch.equal(ops.softmax(scores, row), ops.softmax(scores, row.expand(2, 5)))
    assert ops.softmax(torch.randn(2, 0)).shape == (2, 0)


def test_attention_with_no_keys_gives_zeros_and_no_kv_head_is_refused():
    q = torch.randn(1, 2, 3, 4)
    out = ops.attention(q, torch.randn(1, 2, 0, 4), torch.randn(1, 2, 0, 4), torch.ones(1, 3, 0, dtype=torch.bool))
    assert out.shape == (1, 2, 3, 4) and not out.any()
    with pytest.raises(ValueError, match="Hkv dividing Hq"):
        ops.attention(q, torch.randn(1, 0, 5, 4), torch.randn(1, 0, 5, 4), torch.ones(1, 3, 5, dtype=torch.bool))


# ---------------------------------------------------------------- sizes that cannot fit
def test_fits_memory_names_the_argument_and_the_bytes():
    total = memory_bytes("cpu")
    assert total is None or total > 2 ** 20
    fits_memory("n", 3, 1024)                                  # fits: nothing happens
    with pytest.raises(ValueError, match=r"n = 7 needs 1,024\.0 GiB \(1,099,511,627,776 bytes\) for a test, more than"):
        fits_memory("n", 7, HUGE, what="a test")


def test_engine_and_pools_refuse_blocks_that_cannot_fit_before_allocating():
    from course_lib.cache.contiguous import KVCache
    from course_lib.cache.paged import BlockAllocator, BlockPool
    from course_lib.engine import Engine
    from course_lib.models.decoder import toy_decoder

    model = toy_decoder()
    with pytest.raises(ValueError, match=r"\(num_blocks, block_size\) = \(1099511627776, 16\) needs .* GiB .* for the K/V blocks of 4 layers"):
        Engine(model, num_blocks=HUGE)
    with pytest.raises(ValueError, match=r"BlockPool \(num_blocks, block_size, n_kv_heads, head_dim\) = \(1099511627776, 16, 3, 64\) needs"):
        BlockPool(HUGE, 16, 3, 64)
    with pytest.raises(ValueError, match="BlockAllocator num_blocks = 1099511627776 needs .* per-block lists"):
        BlockAllocator(HUGE, 16)
    with pytest.raises(ValueError, match=r"KVCache \(n_layers, batch, n_kv_heads, max_len, head_dim\) = \(30, 1, 3, 1099511627776, 64\) needs"):
        KVCache(30, 1, 3, HUGE, 64)
    assert Engine(model, num_blocks=32).blocks.num_free == 32   # a size that fits still works


def test_speculative_sampling_refuses_samples_that_cannot_fit():
    from course_lib.speculative.exact import MarkovLM, TokenCache, sample_speculative

    target = MarkovLM.random(6, seed=0)
    with pytest.raises(ValueError, match=r"\(n_samples, prompt \+ n_tokens \+ gamma\) = \(1099511627776, 8\) needs .* GiB"):
        sample_speculative(target, target, [1, 2], 4, 2, HUGE, 0)
    with pytest.raises(ValueError, match="TokenCache batch \\* max_len"):
        TokenCache(HUGE, 8)
    assert sample_speculative(target, target, [1, 2], 4, 2, 3, 0).shape == (3, 4)


def test_linear_refuses_a_tile_that_cannot_fit():
    x, w = torch.randn(3, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"\(rows of x padded to whole tiles, K, N\) = \(1099511627776, 8, 4\) needs .* float32 rows in tiles"):
        ops.linear(x, w, tile=HUGE)
    assert torch.equal(ops.linear(x, w, tile=5), ops.linear(x, w, tile=5))


def test_kernel_blocks_past_tritons_tile_limit_are_refused():
    from course_lib.kernels.gemv import gemv
    from course_lib.kernels.paged_attention import paged_decode_attention
    from course_lib.kernels.w4a16 import w4a16_matmul
    from course_lib.quant.packing import pack_int4

    limit = f"more than the {MAX_TILE_ELEMENTS:,} a Triton block may hold"
    with pytest.raises(ValueError, match=rf"gemv: a tile of block_m 1073741824 x block_n 256 .*{limit}"):
        gemv(torch.randn(4, 4), torch.randn(4), block_m=2 ** 30)
    x = torch.randn(2, 64)
    packed = pack_int4(torch.zeros(16, 64, dtype=torch.int8))
    with pytest.raises(ValueError, match=rf"w4a16_matmul: a tile of block_m 65536 x block_k 128 .*{limit}"):
        w4a16_matmul(x, packed, torch.ones(16, 2, dtype=torch.float16), 32, block_m=2 ** 16)
    q, cache = torch.randn(1, 4, 64), torch.zeros(2, 4, 2, 64)
    with pytest.raises(ValueError, match=rf"paged_decode_attention: a tile of group 2 x block_n 16384 x head_dim 64 .*{limit}"):
        paged_decode_attention(q, cache, cache, torch.tensor([[0]]), torch.tensor([3]), block_n=2 ** 14)


def test_meta_tensors_are_refused_by_the_paged_kernels_and_the_engine():
    from course_lib.engine import Engine
    from course_lib.kernels.paged_attention import decode_attention_bytes, paged_decode_attention
    from course_lib.models.decoder import toy_decoder

    args = (torch.randn(1, 2, 4), torch.zeros(2, 4, 2, 4), torch.zeros(2, 4, 2, 4), torch.zeros(1, 1, dtype=torch.int64),
            torch.ones(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="q must be a tensor with data, .* got one on the meta device"):
        paged_decode_attention(*(t.to("meta") for t in args))
    with pytest.raises(ValueError, match="context_lens must be a tensor with data"):
        decode_attention_bytes(torch.ones(2, dtype=torch.int64, device="meta"), 4, 2, 8, 2)
    with pytest.raises(ValueError, match="the model's embed_tokens.weight must be a tensor with data"):
        Engine(toy_decoder().to("meta"), num_blocks=32)


def test_sizes_name_what_is_multiplied_and_none_is_the_default_device():
    from course_lib.cache.contiguous import KVCache
    from course_lib.cache.paged import BlockPool
    from course_lib.engine import Engine
    from course_lib.models.decoder import toy_decoder

    assert KVCache(1, 1, 1, 16, 64, device=None).k.shape == (1, 1, 1, 16, 64)
    assert BlockPool(4, 16, 1, 64, device=None).k.shape == (4, 16, 1, 64)
    with pytest.raises(ValueError, match=r"KVCache \(n_layers, batch, .*\) = \(1, 1000000000, 1, 16, 64\)"):
        KVCache(1, 10 ** 9, 1, 16, 64)
    with pytest.raises(ValueError, match=r"\(num_blocks, block_size\) = \(32, 1000000000\)"):
        Engine(toy_decoder(), num_blocks=32, block_size=10 ** 9)


def test_the_engine_refuses_a_model_with_any_weight_on_meta():
    from course_lib.engine import Engine
    from course_lib.models.decoder import toy_decoder

    model = toy_decoder()
    model.layers[0].v_proj.weight = torch.nn.Parameter(torch.empty_like(model.layers[0].v_proj.weight, device="meta"))
    with pytest.raises(ValueError, match="the model's layers.0.v_proj.weight must be a tensor with data"):
        Engine(model, num_blocks=32)


def test_the_default_paged_block_is_tile_checked_too():
    from course_lib.kernels.paged_attention import paged_decode_attention

    q, cache = torch.randn(1, 64, 16384), torch.zeros(1, 1, 1, 16384)
    with pytest.raises(ValueError, match="group 64 x block_n 16 x head_dim 16384 holds 16,777,216 elements"):
        paged_decode_attention(q, cache, cache, torch.tensor([[0]]), torch.tensor([1]))
