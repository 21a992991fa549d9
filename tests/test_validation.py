"""course_lib.validation: the one set of argument checks every public entry point uses."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_lib import validation as v
from course_lib.validation import ArgumentTypeError


def test_argument_type_error_is_a_type_error_and_a_value_error():
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)


# -- integers ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, 7, -3, np.int64(5), np.int8(-2), np.uint16(9)])
def test_integer_accepts_ints_and_numpy_integers_and_returns_a_python_int(value):
    got = v.integer("n", value)
    assert got == int(value) and type(got) is int


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 2.0, 2.5, float("nan"), "3", None,
                                   torch.tensor(2), torch.tensor([2]), [2], 2 + 0j])
def test_integer_refuses_other_types_with_a_type_error_naming_the_argument(value):
    with pytest.raises(ArgumentTypeError, match=r"^block_size must be an int >= 1"):
        v.integer("block_size", value, minimum=1)


def test_integer_type_error_suggests_int_for_tensors_and_numpy_in_strict_mode():
    with pytest.raises(TypeError, match=r"got a tensor of shape \(\) and dtype torch.int64 \(convert it with int"):
        v.integer("n", torch.tensor(3))
    with pytest.raises(TypeError, match=r"convert it with int"):
        v.integer("n", np.int64(3), strict=True)
    assert v.integer("n", 3, strict=True) == 3


@pytest.mark.parametrize("value, minimum, maximum, text", [
    (0, 1, None, r"n must be an int >= 1, got 0"),
    (9, 0, 7, r"n must be an int in \[0, 7\], got 9"),
    (-1, 0, 7, r"n must be an int in \[0, 7\], got -1"),
    (5, None, 4, r"n must be an int <= 4, got 5"),
])
def test_integer_range_errors_are_value_errors_naming_the_range(value, minimum, maximum, text):
    with pytest.raises(ValueError, match=text) as info:
        v.integer("n", value, minimum=minimum, maximum=maximum)
    assert not isinstance(info.value, TypeError)


def test_integer_bounds_are_inclusive_and_the_note_is_shown():
    assert v.integer("n", 0, minimum=0, maximum=0) == 0
    with pytest.raises(ValueError, match=r"n must be an int in \[0, 3\] \(the filled slots\), got 4"):
        v.integer("n", 4, minimum=0, maximum=3, note="the filled slots")


def test_positive_and_nonnegative_integer():
    assert v.positive_integer("n", 1) == 1 and v.nonnegative_integer("n", 0) == 0
    with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
        v.positive_integer("n", 0)
    with pytest.raises(ValueError, match="n must be an int >= 0, got -1"):
        v.nonnegative_integer("n", -1)
    with pytest.raises(ValueError, match=r"n must be an int in \[1, 4\]"):
        v.positive_integer("n", 5, maximum=4)


def test_is_integer():
    assert v.is_integer(3) and v.is_integer(np.int32(3)) and not v.is_integer(np.int32(3), strict=True)
    assert not any(v.is_integer(x) for x in (True, 3.0, "3", torch.tensor(3), None))


@pytest.mark.parametrize("value, error", [(1, None), (64, None), (np.int64(16), None), (0, ValueError),
                                          (-16, ValueError), (24, ValueError), (1.5, TypeError),
                                          (True, TypeError)])
def test_power_of_two(value, error):
    if error is None:
        assert v.power_of_two("block_m", value) == value
    else:
        with pytest.raises(error, match="block_m must be a positive power of two"):
            v.power_of_two("block_m", value)


# -- numbers -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1, 2.5, np.float32(0.5), np.int64(3)])
def test_number_returns_the_value_unchanged(value):
    assert v.number("x", value) is value


def test_number_keeps_ints_exact():
    assert type(v.positive_number("bytes", 2)) is int


@pytest.mark.parametrize("value", [True, "1.0", None, torch.tensor(1.0), 1j])
def test_number_refuses_non_numbers(value):
    with pytest.raises(ArgumentTypeError, match="x must be a finite number"):
        v.number("x", value)


@pytest.mark.parametrize("value", [float("nan"), math.inf, -math.inf])
def test_number_refuses_nan_and_infinities(value):
    with pytest.raises(ValueError, match="x must be a finite number"):
        v.number("x", value)
    if not math.isnan(value):
        assert v.number("x", value, finite=False) == value
    else:
        with pytest.raises(ValueError, match="x must be a number"):
            v.number("x", value, finite=False)


def test_number_open_and_closed_bounds():
    assert v.number("mfu", 1, minimum=0, maximum=1, open_minimum=True) == 1
    with pytest.raises(ValueError, match=r"mfu must be a finite number in \(0, 1\], got 0"):
        v.number("mfu", 0, minimum=0, maximum=1, open_minimum=True)
    with pytest.raises(ValueError, match=r"p must be a finite number in \[0, 1\), got 1"):
        v.number("p", 1, minimum=0, maximum=1, open_maximum=True)
    with pytest.raises(ValueError, match="t must be a finite number > 0, got 0"):
        v.positive_number("t", 0)
    with pytest.raises(ValueError, match="t must be a finite number >= 0, got -0.5"):
        v.nonnegative_number("t", -0.5)
    assert v.nonnegative_number("t", 0.0) == 0.0


# -- other kinds ---------------------------------------------------------------------------
def test_boolean():
    assert v.boolean("flag", True) is True and v.boolean("flag", False) is False
    for bad in (0, 1, None, "True", np.bool_(True)):
        with pytest.raises(ArgumentTypeError, match=r"flag must be a bool \(True or False\)"):
            v.boolean("flag", bad)


def test_instance():
    assert v.instance("t", torch.zeros(1), torch.Tensor) is not None
    with pytest.raises(ArgumentTypeError, match="config must be a dict, got 3 of type int"):
        v.instance("config", 3, dict)
    with pytest.raises(ArgumentTypeError, match="x must be an int or a str"):
        v.instance("x", 1.0, (int, str))


def test_one_of():
    assert v.one_of("fmt", "bf16", ["bf16", "fp8"]) == "bf16"
    with pytest.raises(ValueError, match=r"fmt must be one of \['bf16', 'fp8'\], got 'int3'"):
        v.one_of("fmt", "int3", ["bf16", "fp8"])
    with pytest.raises(ValueError, match="mode must be one of"):
        v.one_of("mode", True, [1, 2])                      # True is not the int 1 here
    with pytest.raises(ValueError, match="fmt must be one of"):
        v.one_of("fmt", np.array([1, 2]), ["bf16"])


# -- token ids -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [[1, 2, 3], (1, 2, 3), np.array([1, 2, 3]), torch.tensor([1, 2, 3]),
                                   torch.tensor([1, 2, 3], dtype=torch.int32), range(1, 4)])
def test_token_ids_accepts_sequences_arrays_and_1d_integer_tensors(value):
    got = v.token_ids("ids", value)
    assert got == [1, 2, 3] and all(type(t) is int for t in got)


def test_token_ids_allows_empty_and_checks_the_vocabulary():
    assert v.token_ids("ids", []) == []
    assert v.token_ids("ids", [0, 9], vocab_size=10) == [0, 9]
    with pytest.raises(ValueError, match=r"ids\[1\] must be an int in \[0, 9\] \(vocab_size 10\), got 10"):
        v.token_ids("ids", [0, 10], vocab_size=10)
    pattern = r"ids must hold values in \[0, 9\] \(vocab_size 10\), got values from -1 to 3$"
    with pytest.raises(ValueError, match=pattern):
        v.token_ids("ids", torch.tensor([-1, 3]), vocab_size=10)


@pytest.mark.parametrize("value, error, pattern", [
    ("abc", ArgumentTypeError, "ids must be a sequence of int token ids"),
    (b"ab", ArgumentTypeError, "ids must be a sequence of int token ids"),
    (5, ArgumentTypeError, "ids must be a sequence of int token ids"),
    ([1, True], ArgumentTypeError, r"ids\[1\] must be an int"),
    ([1, -1], ValueError, r"ids\[1\] must be an int in \[0, "),
    (torch.tensor([1.0]), ArgumentTypeError, "ids must be an integer tensor"),
    (torch.tensor([[1]]), ValueError, r"ids must be an integer tensor of shape \(T,\)"),
])
def test_token_ids_refuses(value, error, pattern):
    with pytest.raises(error, match=pattern):
        v.token_ids("ids", value)


# -- integer tensors -----------------------------------------------------------------------
def test_integer_tensor_checks_type_dtype_rank_and_range():
    t = torch.arange(4)
    assert v.integer_tensor("p", t, ranks=(1,), dtype=torch.int64, minimum=0, maximum=3) is t
    pattern = r"p must be an int64 tensor of shape \(T,\), got \[0, 1\] of type list"
    with pytest.raises(ArgumentTypeError, match=pattern):
        v.integer_tensor("p", [0, 1], ranks=(1,), layout="(T,)", dtype=torch.int64)
    with pytest.raises(ArgumentTypeError, match="p must be an int64 tensor, got dtype torch.int32"):
        v.integer_tensor("p", t.int(), dtype=torch.int64)
    for dtype in (torch.float32, torch.bool, torch.complex64):
        with pytest.raises(ArgumentTypeError, match="p must be an integer tensor"):
            v.integer_tensor("p", torch.zeros(2, dtype=dtype))
    with pytest.raises(ValueError, match=r"p must be an integer tensor of rank 1 or 2, got shape \(\)"):
        v.integer_tensor("p", torch.tensor(3), ranks=(1, 2))
    with pytest.raises(ValueError, match=r"p must hold values in \[0, 2\], got values from 0 to 3"):
        v.integer_tensor("p", t, minimum=0, maximum=2)
    with pytest.raises(ValueError, match=r"p must hold values >= 1, got 0"):
        v.integer_tensor("p", torch.tensor([0]), minimum=1)


def test_integer_tensor_skips_the_range_of_an_empty_tensor():
    assert v.integer_tensor("p", torch.zeros(0, dtype=torch.long), minimum=1).numel() == 0


def test_token_ids_fast_path_gives_what_the_element_checks_give():
    ids = list(range(100))
    got = v.token_ids("ids", ids, vocab_size=100)
    assert got == ids and got is not ids
    with pytest.raises(ValueError, match=r"ids\[99\] must be an int in \[0, 98\] \(vocab_size 99\), got 99"):
        v.token_ids("ids", ids, vocab_size=99)
    with pytest.raises(ArgumentTypeError, match=r"ids\[1\] must be an int"):
        v.token_ids("ids", [1, True])


# -- meta tensors --------------------------------------------------------------------------
def test_materialized_refuses_a_meta_tensor_naming_the_argument_and_the_device():
    t = torch.zeros(3)
    assert v.materialized("w", t) is t
    assert v.materialized("w", [1, 2]) == [1, 2]           # not a tensor: the caller's type check decides
    pattern = (r"w must be a tensor with data, on the cpu or cuda device, got one on the meta device "
               r"\(shape \(8, 64\), dtype torch.float32")
    with pytest.raises(ValueError, match=pattern):
        v.materialized("w", torch.zeros(8, 64, device="meta"))
    with pytest.raises(ValueError, match="meta device"):
        v.materialized("p", torch.nn.Parameter(torch.zeros(2, device="meta")))


@pytest.mark.parametrize("check", [
    lambda t: v.integer_tensor("ids", t, minimum=0, maximum=9),
    lambda t: v.integer_tensor("ids", t),
    lambda t: v.token_ids("ids", t, vocab_size=10),
])
def test_integer_tensor_and_token_ids_refuse_meta_tensors_before_reading_them(check):
    for shape in ((1,), (4,)):
        with pytest.raises(ValueError, match="ids must be a tensor with data, on the cpu or cuda device, got one on "
                                             "the meta device"):
            check(torch.zeros(shape, dtype=torch.int64, device="meta"))


# -- the library's modules use them ----------------------------------------------------------
def test_roofline_hardware_and_gemv_use_the_shared_checks():
    from course_lib import roofline, speculative
    from course_lib.hardware import Device
    from course_lib.kernels.gemv import gemv

    with pytest.raises(ArgumentTypeError, match="batch must be an int >= 1"):
        roofline.decode_step_bound(roofline.case_model(), "24GB-1.0", batch=True, context=10, weight_bytes=5.5e9)
    with pytest.raises(ArgumentTypeError, match="config must be a ModelConfig"):
        roofline.n_matmul({"n_layers": 36})
    with pytest.raises(ValueError, match=r"mfu must be a finite number in \(0, 1\]"):
        roofline.prefill_time(roofline.case_model(), "24GB-1.0", 10, mfu=1.5)
    with pytest.raises(ValueError, match=r"alpha must be a finite number in \[0, 1\]"):
        speculative.expected_tokens_per_step(1.2, 4)
    with pytest.raises(ArgumentTypeError, match="Device.memory must be a finite number > 0"):
        Device("x", "80e9", 1, 1)
    with pytest.raises(ArgumentTypeError, match="capacity_gb must be a finite number > 0"):
        Device.from_datasheet("x", "80", 1, 1)
    with pytest.raises(ArgumentTypeError, match=r"block_m must be a positive power of two .*\(tl.arange needs one\)"):
        gemv(torch.zeros(2, 2), torch.zeros(2), block_m=1.5)
    with pytest.raises(ArgumentTypeError, match="W must be a Tensor"):
        gemv([[1.0]], torch.zeros(1))


def test_no_private_validators_are_left_in_the_migrated_modules():
    import course_lib.cache.paged as paged
    import course_lib.hardware as hardware
    import course_lib.kernels.gemv as gemv_module
    import course_lib.roofline as roofline

    for module, names in ((roofline, ("_pos_int", "_nonneg_int", "_pos_num", "_nonneg_num", "_model", "_mfu")),
                          (hardware, ("_positive",)), (gemv_module, ("_check_block",)),
                          (paged, ("_is_int", "_token_list"))):
        assert not [n for n in names if hasattr(module, n)], module.__name__


# -- meta tensors reaching the library's entry points ----------------------------------------
def _meta_cases():
    """(label, call, the argument the error must name): each call hands one public entry point a
    tensor on the meta device where a real one belongs (found by calling every public entry point of
    quant, speculative, batching, models, cache and engine so)."""
    from course_lib import batching, divergence
    from course_lib.cache.paged import PagedKVCache, BlockPool, compute_block_hash
    from course_lib.engine import Engine
    from course_lib.models.decoder import (check_attention_mask, generate_batch, generate_cached, left_pad,
                                           toy_decoder, Decoder)
    from course_lib.models.rope import rope_cos_sin
    from course_lib.quant import (PackedInt4, QuantScheme, damp_hessian, dequantize_ggml, fake_quantize,
                                  fake_quantize_activation, gptq_quantize, hessian, outlier_table, pack_int4,
                                  pack_weight, quantize, quantize_q8_0, smoothing_scales, token_windows, unpack_int4)
    from course_lib.quant.perplexity import window_nll
    from course_lib.speculative import (MarkovLM, ModelDraft, PromptLookupDraft, accept_or_resample, chi_square_test,
                                        generate_speculative, noisy_copy, sample_categorical, sampling_probs,
                                        speculative_step, total_variation, verify_block)

    def M(t):
        return t.to("meta")

    model = toy_decoder(0)
    w = torch.randn(8, 64)
    p = torch.full((2, 4), 0.25, dtype=torch.float64)
    pk = pack_weight(torch.randn(4, 64), 32, symmetric=False, scale_dtype="fp32")
    ids = torch.tensor([[1, 2, 3]])
    tokens = torch.tensor([1, 2, 3])
    mlm = MarkovLM.random(4)
    scheme = QuantScheme(4, "group", 32)

    class MetaDraft:
        def propose(self, tokens, gamma):
            return M(torch.tensor([1]))

        def rollback(self, length):
            pass

    def step_with(draft):
        cache = model.new_cache(1, 16)
        model.prefill(ids[:, :2], cache)
        return speculative_step(model, draft, [1, 2, 3], cache, 2)

    meta_model = toy_decoder(0).to("meta")
    return [
        ("quantize", lambda: quantize(M(w), scheme), "w"),
        ("fake_quantize", lambda: fake_quantize(M(w), scheme), "w"),
        ("pack_weight", lambda: pack_weight(M(w), 32), "w"),
        ("pack_int4", lambda: pack_int4(M(torch.zeros(2, 4, dtype=torch.int8))), "codes"),
        ("unpack_int4", lambda: unpack_int4(M(torch.zeros(2, 2, dtype=torch.uint8)), 4), "packed"),
        ("PackedInt4 zeros", lambda: PackedInt4(pk.packed, pk.scales, M(pk.zeros), 32, 64), "PackedInt4.zeros"),
        ("PackedInt4 perm", lambda: PackedInt4(pk.packed, pk.scales, pk.zeros, 32, 64, M(torch.arange(64))),
         "PackedInt4.perm"),
        ("quantize_q8_0", lambda: quantize_q8_0(M(torch.zeros(1, 32))), "w"),
        ("dequantize_ggml", lambda: dequantize_ggml(M(torch.zeros(34, dtype=torch.uint8)), "Q8_0", (1, 32)), "data"),
        ("token_windows", lambda: token_windows(M(torch.arange(600)), 64, 2, 2), "ids"),
        ("window_nll", lambda: window_nll(model, M(ids)), "windows"),
        ("outlier_table", lambda: outlier_table({"a": M(torch.ones(4))}), r"absmax\['a'\]"),
        ("smoothing_scales", lambda: smoothing_scales(M(torch.ones(64)), w, 0.5), "act_absmax"),
        ("fake_quantize_activation", lambda: fake_quantize_activation(M(w)), "x"),
        ("hessian", lambda: hessian(M(w)), "x"),
        ("damp_hessian", lambda: damp_hessian(M(torch.eye(4))), "gram"),
        ("gptq_quantize", lambda: gptq_quantize(w, M(torch.eye(64)), scheme), "H"),
        ("sampling_probs", lambda: sampling_probs(M(p)), "logits"),
        ("sample_categorical", lambda: sample_categorical(M(p), 0), "probs"),
        ("accept_or_resample", lambda: accept_or_resample(p, M(p), torch.tensor([0, 1]), 0), "q"),
        ("verify_block", lambda: verify_block(p[:, None], p[:, :0][:, None].reshape(2, 0, 4), M(torch.zeros(2, 0,
                                              dtype=torch.int64)), 0), "drafted"),
        ("total_variation", lambda: total_variation(M(p), M(p)), "p"),
        ("MarkovLM", lambda: MarkovLM(M(mlm.probabilities)), "probabilities"),
        ("MarkovLM.forward", lambda: mlm(M(ids), torch.arange(3)), "input_ids"),
        ("chi_square_test", lambda: chi_square_test(tokens[None, :1], M(torch.full((4,), 0.25,
                                                    dtype=torch.float64))), "probabilities"),
        ("PromptLookupDraft.propose", lambda: PromptLookupDraft().propose(M(tokens), 2), "tokens"),
        ("ModelDraft.propose", lambda: ModelDraft(model, model.new_cache(1, 16)).propose(M(tokens), 2), "tokens"),
        ("speculative_step proposals", lambda: step_with(MetaDraft()), r"draft MetaDraft.propose\(tokens, 2\)"),
        ("generate_speculative", lambda: generate_speculative(model, PromptLookupDraft(), M(tokens), 2, 2), "prompt"),
        ("generate_speculative meta models", lambda: generate_speculative(meta_model, meta_model, tokens, 2, 2),
         r"the model's weights \(embed_tokens.weight\)"),
        ("noisy_copy", lambda: noisy_copy(meta_model, 0.1), "model.embed_tokens.weight"),
        ("divergence_report", lambda: batching.divergence_report(M(tokens), tokens, torch.zeros(3, 4),
                                                                 torch.zeros(3, 4)), "solo_tokens"),
        ("first_divergence", lambda: divergence.first_divergence(M(tokens), tokens), "a"),
        ("Decoder.forward input_ids", lambda: model(M(ids), torch.arange(3)), "input_ids"),
        ("Decoder.forward attention_mask", lambda: model(ids, torch.arange(3), attention_mask=M(torch.ones(1, 3))),
         "attention_mask"),
        ("Decoder.forward meta model", lambda: meta_model(M(ids), M(torch.arange(3))),
         r"the model's weights \(embed_tokens.weight\)"),
        ("check_attention_mask", lambda: check_attention_mask(M(torch.ones(1, 3, dtype=torch.bool)), 1, 3),
         "attention_mask"),
        ("left_pad", lambda: left_pad([M(tokens)]), r"prompts\[0\]"),
        ("generate_cached", lambda: generate_cached(model, M(tokens), 2), "prompt"),
        ("generate_batch meta model", lambda: generate_batch(meta_model, [tokens], 2),
         r"the model's weights \(embed_tokens.weight\)"),
        ("from_hf_state_dict", lambda: Decoder.from_hf_state_dict(model.config, meta_model.state_dict()),
         r"state_dict\['embed_tokens.weight'\]"),
        ("rope_cos_sin", lambda: rope_cos_sin(M(torch.arange(3)), 8, 10000.0), "positions"),
        ("compute_block_hash", lambda: compute_block_hash(M(tokens)), "token_ids"),
        ("PagedKVCache.new_sequence", lambda: PagedKVCache(BlockPool(4, 4, 2, 8)).new_sequence(M(tokens)),
         "prefix_token_ids"),
        ("Engine.add_request", lambda: Engine(model, 32, 4).add_request(M(tokens), 2), "prompt_ids"),
    ]


def test_meta_tensors_are_refused_where_they_enter_naming_the_argument_and_the_device():
    failures = []
    for label, call, name in _meta_cases():
        try:
            call()
            failures.append(f"{label}: no error")
        except ValueError as error:
            pattern = rf"^{name} must be a tensor with data, on the cpu or cuda device.*got one on the meta device"
            if not __import__("re").search(pattern, str(error)):
                failures.append(f"{label}: {type(error).__name__}: {error}")
        except Exception as error:                               # noqa: BLE001 - reported below
            failures.append(f"{label}: {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)


def test_a_zero_dimensional_array_is_not_a_sequence_of_token_ids():
    import numpy as np

    from course_lib.validation import ArgumentTypeError, token_ids
    with pytest.raises(ArgumentTypeError, match="sequence of int token ids"):
        token_ids("key", np.array(5))
    assert token_ids("key", np.array([1, 2])) == [1, 2]
