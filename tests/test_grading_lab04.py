"""Lab 4 checkers beyond what tests/test_lab_tables.py runs (the solution and every fault of
lab04.FAULTS on a few seeds): the table's faults on more seeds, further faults the checkers name,
equivalent solutions accepted (round half up, other dtypes of the same values where allowed), and
rigged or malformed results refused."""
import math

import pytest
import torch

from course_lib import quant
from course_lib.grading import ContractError, lab04
from course_lib.grading.tables import Edit

import solutions

LAB = "04_quantization"
ref = solutions.solution_functions(LAB)
SEEDS = [0, 1, 2, 12345, 2**31 - 1]
CHECKS = {c.test: c for c in lab04.CONTRACTS}


def _run(contract, namespace, seed):
    contract.checker(*(namespace[name] for name in contract.functions), seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_solution_passes(seed):
    namespace = solutions.solution_namespace(LAB)
    for contract in lab04.CONTRACTS:
        _run(contract, namespace, seed)


@pytest.mark.parametrize("fault", [f.name for f in lab04.FAULTS])
@pytest.mark.parametrize("seed", SEEDS[1:])
def test_each_table_fault_fails_with_its_symptom(fault, seed):
    declared = next(f for f in lab04.FAULTS if f.name == fault)
    namespace = solutions.solution_namespace(LAB, declared.edits)
    for test, symptom in declared.fails.items():
        with pytest.raises(ContractError, match=symptom):
            _run(CHECKS[test], namespace, seed)


# faults the checkers name that have no sample submission: (cell, find, replace, test, symptom)
MORE_FAULTS = {
    "truncated codes": ("quantize_symmetric", "torch.round(groups / scales[..., None])",
                        "torch.trunc(groups / scales[..., None])", "test_quantize_symmetric", "truncated toward zero"),
    "range without zero": ("quantize_asymmetric", "lo = groups.amin(dim=-1).clamp(max=0)\n    hi = groups.amax(dim=-1).clamp(min=0)",
                           "lo = groups.amin(dim=-1)\n    hi = groups.amax(dim=-1)",
                           "test_quantize_asymmetric", "not extended to include 0"),
    "payload as one stream": ("int4_nbytes", "payload = out_features * math.ceil(in_features / 2)",
                              "payload = math.ceil(out_features * in_features / 2)", "test_int4_nbytes",
                              "one stream"),
    "payload rounded down": ("int4_nbytes", "payload = out_features * math.ceil(in_features / 2)",
                             "payload = out_features * (in_features // 2)", "test_int4_nbytes", "rounded down"),
    "sign and magnitude": ("pack_int4", "nibbles = codes.to(torch.int16) & 0xF",
                           "nibbles = torch.where(codes < 0, 8 | (-codes.to(torch.int16)).clamp(max=7), "
                           "codes.to(torch.int16))", "test_pack_int4", "sign and magnitude"),
    "T predictions per window": ("perplexity", "counts.append(T - 1)", "counts.append(T)", "test_perplexity",
                                 "T predictions counted"),
    "log base 2": ("perplexity", "return math.exp(sum(nlls) / sum(counts))", "return 2 ** (sum(nlls) / sum(counts))",
                   "test_perplexity", "2 \\*\\* mean loss"),
    "floor codes, symmetric": ("quantize_symmetric", "torch.round(groups / scales[..., None])",
                               "torch.floor(groups / scales[..., None])", "test_quantize_symmetric",
                               r"rounded down \(floor\)"),
    "floor codes, asymmetric": ("quantize_asymmetric", "torch.round(groups / scales[..., None])",
                                "torch.floor(groups / scales[..., None])", "test_quantize_asymmetric",
                                r"codes rounded down \(floor"),
    # strided groups with the codes back in place (the table's fault, groups_strided, returns them permuted)
    "strided groups, codes in place": ("quantize_symmetric",
                                       "groups = w.reshape(out_f, in_f // group_size, group_size)\n"
                                       "    absmax = groups.abs().amax(dim=-1)\n"
                                       "    scales = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))\n"
                                       "    codes = torch.clamp(torch.round(groups / scales[..., None]), -qmax, qmax)",
                                       "groups = w.reshape(out_f, group_size, in_f // group_size)\n"
                                       "    absmax = groups.abs().amax(dim=1)\n"
                                       "    scales = torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))\n"
                                       "    codes = torch.clamp(torch.round(groups / scales[:, None, :]), -qmax, qmax)",
                                       "test_quantize_symmetric", "groups taken strided"),
    "strided groups, asymmetric": ("quantize_asymmetric", "groups = w.reshape(out_f, in_f // group_size, group_size)",
                                   "groups = w.reshape(out_f, group_size, in_f // group_size).transpose(1, 2)",
                                   "test_quantize_asymmetric", "groups taken strided"),
    "shift reversed": ("perplexity", "logp = torch.log_softmax(logits[:-1], dim=-1)\n"
                       "        nlls.append(-float(logp.gather(1, ids[1:, None]).double().sum()))",
                       "logp = torch.log_softmax(logits[1:], dim=-1)\n"
                       "        nlls.append(-float(logp.gather(1, ids[:-1, None]).double().sum()))",
                       "test_perplexity", "shift reversed"),
    "windows concatenated": ("perplexity", "    for ids in windows:\n", "    for ids in [windows.flatten()]:\n",
                             "test_perplexity", "windows concatenated into one sequence"),
    "inverted ratio": ("smoothquant_scales", "return x_max ** alpha / w_max ** (1 - alpha)",
                       "return w_max ** (1 - alpha) / x_max ** alpha", "test_smoothquant_scales", "ratio inverted"),
    "weight maxima unclamped": ("smoothquant_scales", "w_max = weight.abs().amax(dim=0).clamp(min=1e-5)",
                                "w_max = weight.abs().amax(dim=0)", "test_smoothquant_scales",
                                "weight maxima not clamped"),
}


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_smoothquant_diagnoses_name_only_what_happened(seed):
    """Neither clamp is named "neither"; a wrong finite value in the zero-weight column (an inf
    there is what a missing clamp gives) is not diagnosed as a missing clamp."""
    neither = solutions.solution_namespace(LAB, (
        Edit("smoothquant_scales", "x_max = act_absmax.clamp(min=1e-5)", "x_max = act_absmax"),
        Edit("smoothquant_scales", "w_max = weight.abs().amax(dim=0).clamp(min=1e-5)", "w_max = weight.abs().amax(dim=0)")))
    with pytest.raises(ContractError, match="neither maximum clamped"):
        lab04.check_smoothquant_scales(neither["smoothquant_scales"], seed=seed)

    def one_in_zero_columns(act, weight, alpha):
        s = ref.smoothquant_scales(act, weight, alpha)
        return torch.where(weight.abs().amax(dim=0) == 0, torch.ones_like(s), s)
    with pytest.raises(ContractError) as caught:
        lab04.check_smoothquant_scales(one_in_zero_columns, seed=seed)
    assert "Diagnosis" not in str(caught.value)


@pytest.mark.parametrize("fault", MORE_FAULTS)
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_more_faults_fail_with_their_symptom(fault, seed):
    cell, old, new, test, symptom = MORE_FAULTS[fault]
    namespace = solutions.solution_namespace(LAB, (Edit(cell, old, new),))
    with pytest.raises(ContractError, match=symptom):
        _run(CHECKS[test], namespace, seed)


def test_round_half_up_is_accepted_at_ties():
    """floor(x + 0.5) differs from round-half-to-even only at exact ties, where the contract takes
    either neighbour; the hand case has a tie (2.5) to prove the tolerance is exercised."""
    def quantize(w, bits, group_size):
        codes, scales = ref.quantize_symmetric(w, bits, group_size)
        groups = w.reshape(w.shape[0], -1, group_size) / scales[..., None]
        qmax = 2 ** (bits - 1) - 1
        up = torch.clamp(torch.floor(groups + 0.5), -qmax, qmax)
        return up.reshape(w.shape).to(torch.int8), scales
    w = torch.tensor([[2.5, 7.0, 0.0, -1.0]])
    assert quantize(w, 4, 4)[0].tolist() != ref.quantize_symmetric(w, 4, 4)[0].tolist()   # a tie, rounded apart
    for seed in SEEDS:
        lab04.check_quantize_symmetric(quantize, ref.dequantize_symmetric, seed=seed)


def test_a_zero_group_may_have_any_positive_scale():
    def quantize(w, bits, group_size):
        codes, scales = ref.quantize_symmetric(w, bits, group_size)
        zero = w.reshape(w.shape[0], -1, group_size).abs().amax(dim=-1) == 0
        return codes, torch.where(zero, torch.full_like(scales, 1e-8), scales)
    lab04.check_quantize_symmetric(quantize, ref.dequantize_symmetric, seed=0)

    def no_scale(w, bits, group_size):
        codes, scales = ref.quantize_symmetric(w, bits, group_size)
        zero = w.reshape(w.shape[0], -1, group_size).abs().amax(dim=-1) == 0
        return codes, torch.where(zero, torch.zeros_like(scales), scales)
    with pytest.raises(ContractError, match="positive scale"):
        lab04.check_quantize_symmetric(no_scale, ref.dequantize_symmetric, seed=0)


class Rigged(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__


class Tensorish(torch.Tensor):
    pass


@pytest.mark.parametrize("call, message", [
    (lambda: lab04.check_quantize_symmetric(lambda w, b, g: ref.quantize_symmetric(w, b, g)[0],
                                            ref.dequantize_symmetric), "must return a tuple"),
    (lambda: lab04.check_quantize_symmetric(
        lambda w, b, g: tuple(t.to(torch.int32) if t.dtype == torch.int8 else t for t in ref.quantize_symmetric(w, b, g)),
        ref.dequantize_symmetric), "dtype torch.int8"),
    (lambda: lab04.check_quantize_symmetric(
        lambda w, b, g: tuple(t.as_subclass(Tensorish) for t in ref.quantize_symmetric(w, b, g)),
        ref.dequantize_symmetric), "must be a torch.Tensor"),
    (lambda: lab04.check_quantize_asymmetric(
        lambda w, b, g: (*ref.quantize_asymmetric(w, b, g)[:2], ref.quantize_asymmetric(w, b, g)[2][:, :1]),
        ref.dequantize_asymmetric), "shape"),
    (lambda: lab04.check_int4_nbytes(lambda *a, **k: 144.0), "int"),
    (lambda: lab04.check_pack_int4(lambda c: ref.pack_int4(c).to(torch.int16), ref.unpack_int4), "dtype torch.uint8"),
    (lambda: lab04.check_pack_int4(ref.pack_int4, lambda p, n: ref.unpack_int4(p, n).to(torch.uint8)),
     "dtype torch.int8"),
    (lambda: lab04.check_split_windows(lambda ids, w, e, c: [x for x in ref.split_windows(ids, w, e, c)]),
     "must return a tuple"),
    (lambda: lab04.check_perplexity(lambda m, w: Rigged(1.0)), "must be a number"),
    (lambda: lab04.check_perplexity(lambda m, w: float("nan")), "finite|NaN|number"),
    (lambda: lab04.check_smoothquant_scales(lambda a, w, al: ref.smoothquant_scales(a, w, al).double()),
     "dtype torch.float32"),
    (lambda: lab04.check_smoothquant_scales(quant.smoothing_scales), "course_lib's reference"),
    (lambda: lab04.check_pack_int4(quant.pack_int4, quant.unpack_int4), "course_lib's reference"),
])
def test_rigged_and_malformed_results_are_refused(call, message):
    with pytest.raises(ContractError, match=message):
        call()


def test_unpack_reading_nibbles_as_unsigned_is_caught():
    def unpack(packed, n):
        p = packed.to(torch.int16)
        return torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2)[..., :n].to(torch.int8)
    with pytest.raises(ContractError, match="nibble above 7 is negative"):
        lab04.check_pack_int4(ref.pack_int4, unpack, seed=0)


def test_the_perplexity_case_separates_the_two_means():
    """The sharpened toy model's windows differ enough that the mean of per-window perplexities
    is more than 1 % off exp of the mean loss (what check_perplexity redraws for)."""
    model = lab04.sharp_toy_model(3)
    windows = torch.randint(0, model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    right = ref.perplexity(model, windows)
    nlls = []
    with torch.no_grad():
        for ids in windows:
            logp = torch.log_softmax(model(ids[None], torch.arange(32))[0][:-1].double(), dim=-1)
            nlls.append(-float(logp.gather(1, ids[1:, None]).sum()) / 31)
    assert math.isclose(right, math.exp(sum(nlls) / 4), rel_tol=1e-6)   # the solution takes a float32 log-softmax
    assert abs(sum(math.exp(x) for x in nlls) / 4 / right - 1) > 0.01


def test_an_all_zero_group_must_dequantise_to_zeros():
    """A zero point of L with a huge scale in an all-zero group turns zeros into -L * scale."""
    def quantize(w, bits, group_size):
        codes, scales, zeros = ref.quantize_asymmetric(w, bits, group_size)
        zero = w.reshape(w.shape[0], -1, group_size).abs().amax(dim=-1) == 0
        return codes, torch.where(zero, torch.full_like(scales, 1e30), scales), torch.where(
            zero, torch.full_like(zeros, 2 ** bits - 1), zeros)
    with pytest.raises(ContractError, match="all-zero group must come back as zeros"):
        lab04.check_quantize_asymmetric(quantize, ref.dequantize_asymmetric, seed=0)


def test_split_windows_cannot_pass_by_recognising_distinct_ids():
    """A split that is right only when every id is distinct (as a permutation's are) fails the
    cases drawn from a small vocabulary."""
    def split(ids, window, n_eval, n_calib):
        evaluation, calib = ref.split_windows(ids, window, n_eval, n_calib)
        if len(set(ids.tolist())) == ids.numel():
            return evaluation, calib
        return evaluation, ids[:n_calib * window].reshape(n_calib, window)
    with pytest.raises(ContractError, match="calibration windows overlap the evaluation windows"):
        lab04.check_split_windows(split, seed=0)


@pytest.mark.parametrize("seed", range(6))
def test_odd_sizes_are_always_drawn(seed):
    """Wrong answers that only odd sizes show fail on every seed (they passed on some): Python's
    round(in / 2) (half to even), an odd row padded at the front or with a copy of its last code, an
    unpack that ignores n."""
    bankers = solutions.solution_namespace(LAB, (Edit("int4_nbytes", "payload = out_features * math.ceil(in_features / 2)",
                                                      "payload = out_features * round(in_features / 2)"),))
    with pytest.raises(ContractError):
        lab04.check_int4_nbytes(bankers["int4_nbytes"], seed=seed)
    for old, new in (("torch.nn.functional.pad(nibbles, (0, 1))", "torch.nn.functional.pad(nibbles, (1, 0))"),
                     ("torch.nn.functional.pad(nibbles, (0, 1))", "torch.cat([nibbles, nibbles[..., -1:]], -1)"),
                     ("flatten(-2)[..., :n]", "flatten(-2)")):
        cell = "pack_int4"
        namespace = solutions.solution_namespace(LAB, (Edit(cell, old, new),))
        with pytest.raises(ContractError):
            lab04.check_pack_int4(namespace["pack_int4"], namespace["unpack_int4"], seed=seed)


def test_split_windows_must_refuse_a_text_too_short():
    def unfolded(ids, window, n_eval, n_calib):
        w = ids.unfold(0, window, window)
        return w[:n_eval], w[n_eval:n_eval + n_calib]

    with pytest.raises(ContractError, match=r"returned \[\(2, 4\), \(0, 4\)\] instead of raising ValueError"):
        lab04.check_split_windows(unfolded, seed=0)


def test_split_windows_must_accept_exactly_enough_tokens_and_a_rounded_down_stream_is_named():
    namespace = solutions.solution_namespace(LAB, (Edit("split_windows", "if ids.numel() < needed:",
                                                        "if ids.numel() <= needed:"),))
    for seed in range(3):
        with pytest.raises(ContractError, match="raised ValueError"):
            lab04.check_split_windows(namespace["split_windows"], seed=seed)
    floor = solutions.solution_namespace(LAB, (Edit("int4_nbytes", "payload = out_features * math.ceil(in_features / 2)",
                                                    "payload = out_features * in_features // 2"),))
    with pytest.raises(ContractError, match=r"one stream and rounded down \(\(out \* in\) // 2\)"):
        lab04.check_int4_nbytes(floor["int4_nbytes"], seed=0)
