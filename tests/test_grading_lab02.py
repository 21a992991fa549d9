"""Lab 2 checkers beyond the declared tables (tests/test_lab_tables.py runs the solution and every
fault of lab02.FAULTS): faults that are not samples (slot 0, RoPE variants, recomputation hidden
from the counters) and untrustworthy return values fail with a message that names the symptom."""
import math

import pytest
import torch

from course_lib.grading import ContractError, check_bytes, check_logits_close, check_tensor, lab02

import solutions

ref = solutions.solution_functions("02_kv_cache")


def test_attention_writing_slot_zero_is_named():
    def attend(q, k_new, v_new, k_cache, v_cache, start):
        return ref.attend_with_cache(q, k_new, v_new, k_cache, v_cache, 0)
    with pytest.raises(ContractError, match="slot 0"):
        lab02.check_attention_step(attend, seed=0)


def _sdpa_step(mask):
    """A cached attention step written with PyTorch's fused attention; MASK(T, S, start) gives its
    keyword arguments."""
    def attend(q, k_new, v_new, k_cache, v_cache, start):
        T = q.shape[-2]
        k_cache[:, :, start:start + T], v_cache[:, :, start:start + T] = k_new, v_new
        group = q.shape[1] // k_cache.shape[1]
        k = k_cache[:, :, :start + T].repeat_interleave(group, dim=1)
        v = v_cache[:, :, :start + T].repeat_interleave(group, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **mask(T, start + T, start))
    return attend


def test_a_causal_mask_aligned_top_left_is_named():
    """is_causal=True aligns the mask to the top-left corner (query i sees keys 0..i) whatever the
    cache holds; the mask the diagnosis suggests (key position <= start + query position) passes."""
    top_left = _sdpa_step(lambda T, S, start: {"is_causal": True})
    for seed in (0, 1, 2, 3):
        with pytest.raises(ContractError, match=r"(?s)Diagnosis:.*causal mask aligned top-left.*attn_mask"):
            lab02.check_attention_step(top_left, seed=seed)
    aligned = _sdpa_step(lambda T, S, start: {"attn_mask": torch.arange(S)[None, :] <= torch.arange(T)[:, None]
                                                           + start})
    lab02.check_attention_step(aligned, seed=0, cases=8)
    # a step with no mask at all is a different fault, and named as such
    with pytest.raises(ContractError, match="no causal mask") as caught:
        lab02.check_attention_step(_sdpa_step(lambda T, S, start: {}), seed=0)
    assert "top-left" not in str(caught.value)


def test_rope_faults_are_named():
    with pytest.raises(ContractError, match="off by one"):
        lab02.check_apply_rope(lambda x, p, t: ref.apply_rope(x, p + 1, t), seed=1)
    with pytest.raises(ContractError, match="interleaved"):
        lab02.check_apply_rope(lambda x, p, t: lab02.interleaved_rope(x, p, t), seed=1)


def test_full_recompute_is_not_a_cache():
    from course_lib.models import generate_full_recompute
    with pytest.raises(ContractError, match="token ids went through the model"):
        lab02.check_generation(lambda m, p, n: generate_full_recompute(m, p, n), seed=1, max_new_tokens=16)


def _hooks_cleared(fn):
    """FN run with the model's embedding hooks (where the checkers count token ids) removed."""
    def run(model, *args):
        saved = dict(model.embed_tokens._forward_hooks)
        model.embed_tokens._forward_hooks.clear()
        try:
            return fn(model, *args)
        finally:
            model.embed_tokens._forward_hooks.update(saved)
    return run


def test_a_recompute_hidden_from_the_token_counter_is_caught():
    """Removing the counting hook during the call leaves too few counted token ids: that fails too."""
    from course_lib.models import generate_full_recompute
    with pytest.raises(ContractError, match="only 0 token ids"):
        lab02.check_generation(_hooks_cleared(lambda m, p, n: generate_full_recompute(m, p, n)), seed=1,
                               max_new_tokens=16)
    with pytest.raises(ContractError, match="only 0 token ids"):
        lab02.check_suffix_scores(_hooks_cleared(ref.score_suffixes), seed=2)


def test_byte_count_names_the_differing_term():
    with pytest.raises(ContractError, match="'K and V' = 1 instead of 2"):
        lab02.check_kv_cache_bytes(lambda c, p, b: ref.kv_cache_bytes(c, p, b) // 2, ref.measured_kv_bytes, seed=1)
    with pytest.raises(ContractError, match="expected 24 = a 2 \\* b 3 \\* c 4, got 48"):
        check_bytes(48, {"a": 2, "b": 3, "c": 4})


class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __bool__(self):
        return True

    __hash__ = object.__hash__


class SneakyTensor(torch.Tensor):
    def __eq__(self, other):
        return True


def test_untrustworthy_return_values_fail():
    with pytest.raises(ContractError, match="expected None, got"):
        lab02.check_first_divergence(lambda a, b: AlwaysEqual(), seed=0)
    with pytest.raises(ContractError, match="must be an int"):
        lab02.check_kv_cache_bytes(lambda c, p, b: AlwaysEqual(), ref.measured_kv_bytes)
    with pytest.raises(ContractError, match="must be an int"):
        lab02.check_kv_cache_bytes(lambda c, p, b: float(ref.kv_cache_bytes(c, p, b)), ref.measured_kv_bytes)
    with pytest.raises(ContractError, match="must be a torch.Tensor"):
        lab02.check_apply_rope(lambda x, p, t: AlwaysEqual())
    with pytest.raises(ContractError, match="must be a torch.Tensor"):
        lab02.check_apply_rope(lambda x, p, t: ref.apply_rope(x, p, t).as_subclass(SneakyTensor))
    with pytest.raises(ContractError, match="dtype"):
        lab02.check_apply_rope(lambda x, p, t: ref.apply_rope(x, p, t).double())
    with pytest.raises(ContractError, match="shape"):
        lab02.check_attention_step(lambda *a: ref.attend_with_cache(*a)[:, :1])
    with pytest.raises(ContractError, match="tuple"):
        lab02.check_generation(lambda m, p, n: AlwaysEqual(), seed=0, max_new_tokens=4)
    with pytest.raises(ContractError, match="NaN"):
        check_tensor("x", torch.tensor([float("nan")]))


def test_logit_contract_reports_step_gap_and_hidden_token_agreement():
    expected = torch.tensor([[0.0, 1.0, 3.0], [0.0, 2.0, 2.5]])
    actual = expected.clone()
    actual[1, 0] += 0.01
    with pytest.raises(ContractError) as err:
        check_logits_close(actual, expected, tokens_actual=[2, 2], tokens_expected=[2, 2], position_offset=10)
    message = str(err.value)
    assert "step 1 (position 11)" in message and "top-2 gap there is 0.5" in message
    assert "tokens are identical" in message
    # after the tokens diverge only the common prefix (through the first differing step) is compared
    late = expected.clone()
    late[1] += 5.0
    assert check_logits_close(late[:1], expected[:1]) == 0.0
    assert check_logits_close(torch.stack([expected[0], late[1]]), expected, tokens_actual=[1, 0],
                              tokens_expected=[2, 2]) == 0.0


def test_course_lib_reference_is_not_accepted_as_the_learners_function():
    from course_lib.models import apply_rope, attend_with_cache
    with pytest.raises(ContractError, match="course_lib's reference"):
        lab02.check_apply_rope(apply_rope)
    with pytest.raises(ContractError, match="course_lib's reference"):
        lab02.check_attention_step(attend_with_cache)
    with pytest.raises(ContractError, match="must be a function"):
        lab02.check_first_divergence(None)


def test_rope_accepts_any_correct_float32_formula():
    def literal(x, positions, theta=10000.0):           # omega_i = theta^(-2i/D), written as in the notebook
        D = x.shape[-1]
        omega = theta ** (-2.0 * torch.arange(D // 2) / D)
        a = positions.to(torch.float32)[..., None] * omega
        a = a[None, None] if positions.dim() == 1 else a[:, None]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin()], -1)
    for seed in range(10):
        lab02.check_apply_rope(literal, seed, cases=8)
        lab02.check_apply_rope(lambda x, p, t: lab02.rope_float64(x, p, t).float(), seed, cases=8)


def test_mutating_the_inputs_a_checker_reads_does_not_pass():
    """Rewriting cache.length inside measured_fn, or zeroing the K/V handed to paged_append, once
    fooled the checkers (they read those objects after the call); now they fail."""
    def measured_length_trick(cache):
        cache.length = 0
        return 0

    with pytest.raises(ContractError):
        lab02.check_kv_cache_bytes(ref.kv_cache_bytes, measured_length_trick, seed=0)

    def append_zeroing(pool, seq, k, v):
        seq.length += k.shape[0]
        k.zero_()
        v.zero_()

    def read_zeros(pool, seq):
        shape = (seq.length, pool.n_kv_heads, pool.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    with pytest.raises((ContractError, ValueError)):  # refused by the checker or by the pool's own checks
        lab02.check_paged(append_zeroing, read_zeros, seed=0)


# -- the decoder's blocks (exercises 1-4) ---------------------------------------------------------
def _rms_without_weight(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_blocks_forward_names_the_rms_norm_faults():
    """On SmolLM2's real weights: the weight left out and eps outside the square root are named; an
    answer in another dtype or shape is refused before any value is compared."""
    with pytest.raises(ContractError, match=r"(?s)embedded tokens.*Diagnosis:.*weight \(the learned per-channel "
                                            r"scale\) not applied"):
        lab02.check_blocks_forward(_rms_without_weight, ref.swiglu, seed=1)
    with pytest.raises(ContractError, match="eps added outside the square root"):
        lab02.check_blocks_forward(lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w,
                                   ref.swiglu, seed=1)
    with pytest.raises(ContractError, match="must have dtype torch.float32, got torch.float64"):
        lab02.check_blocks_forward(lambda x, w, eps: ref.rms_norm(x, w, eps).double(), ref.swiglu, seed=0)
    with pytest.raises(ContractError, match=r"swiglu\(case 0.*must have shape"):
        lab02.check_blocks_forward(ref.rms_norm, lambda x, g, u, d: torch.nn.functional.silu(x @ g.T) * (x @ u.T),
                                   seed=0)


def test_blocks_forward_names_swiglu_faults_and_refuses_what_is_not_a_model():
    silu = torch.nn.functional.silu
    with pytest.raises(ContractError, match="silu applied to the up projection"):
        lab02.check_blocks_forward(ref.rms_norm, lambda x, g, u, d: (silu(x @ u.T) * (x @ g.T)) @ d.T, seed=2)
    with pytest.raises(ContractError, match="no silu"):
        lab02.check_blocks_forward(ref.rms_norm, lambda x, g, u, d: ((x @ g.T) * (x @ u.T)) @ d.T, seed=2)
    with pytest.raises(TypeError, match="model"):
        lab02.check_blocks_forward(ref.rms_norm, ref.swiglu, seed=0, model="smollm2")


def test_blocks_forward_accepts_another_correct_float32_order():
    """Another correct order of the same float32 sums (a norm through torch.linalg.vector_norm, the
    projections through einsum) stays inside the tolerance."""
    def rms(x, w, eps):
        d = x.shape[-1]
        return x / torch.sqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 / d + eps) * w

    def ffn(x, g, u, d):
        a, b = torch.einsum("...i,fi->...f", x, g), torch.einsum("...i,fi->...f", x, u)
        return torch.einsum("...f,of->...o", torch.nn.functional.silu(a) * b, d)
    for seed in (0, 3):
        lab02.check_blocks_forward(rms, ffn, seed=seed)


def test_blocks_backward_names_its_faults_and_checks_the_returned_tuple():
    def rms_constant_r(x, w, eps, gy):
        grad_x, grad_w = ref.rms_norm_backward(x, w, eps, gy)
        return gy * w * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), grad_w
    with pytest.raises(ContractError, match="1 / rms treated as a constant"):
        lab02.check_blocks_backward(rms_constant_r, ref.swiglu_backward, seed=0)

    def swiglu_gate_path_only(x, wg, wu, wd, gy):
        grads = ref.swiglu_backward(x, wg, wu, wd, gy)
        g, s = x @ wg.T, torch.sigmoid(x @ wg.T)
        grad_gate = (gy @ wd) * (x @ wu.T) * s * (1 + g * (1 - s))
        return (grad_gate @ wg,) + grads[1:]
    with pytest.raises(ContractError, match="grad_x only through the gate"):
        lab02.check_blocks_backward(ref.rms_norm_backward, swiglu_gate_path_only, seed=0)
    with pytest.raises(ContractError, match=r"must return a tuple \(grad_x, grad_weight\), got a tuple of 3"):
        lab02.check_blocks_backward(lambda *a: ref.rms_norm_backward(*a) + (None,), ref.swiglu_backward, seed=0)
    with pytest.raises(ContractError, match="grad_weight must have shape"):
        lab02.check_blocks_backward(lambda x, w, eps, gy: (ref.rms_norm_backward(x, w, eps, gy)[0], gy * x),
                                    ref.swiglu_backward, seed=0)
    with pytest.raises(ContractError, match="grad_x must have dtype torch.float64, got torch.float32"):
        lab02.check_blocks_backward(ref.rms_norm_backward,
                                    lambda *a: tuple(t.float() for t in ref.swiglu_backward(*a)), seed=0)


def test_layer_norm_names_its_faults():
    def unbiased(x, w, b, eps):
        centred = x - x.mean(-1, keepdim=True)
        return centred / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b
    with pytest.raises(ContractError, match=r"unbiased variance \(divided by d - 1"):
        lab02.check_layer_norm(unbiased, seed=0)
    with pytest.raises(ContractError, match=r"(?s)constant row gave NaN.*eps missing"):
        lab02.check_layer_norm(lambda x, w, b, eps: ref.layer_norm(x, w, b, 0.0), seed=0)
    with pytest.raises(ContractError, match="the mean not subtracted"):
        lab02.check_layer_norm(lambda x, w, b, eps: ref.rms_norm(x, w, eps) + b, seed=1)


def test_tied_embedding_grad_names_overwritten_repeats_and_a_transposed_head():
    def overwrite(ids, grad_embedded, hidden, grad_logits, vocab_size):
        d = hidden.shape[-1]
        grad = torch.zeros(vocab_size, d, dtype=hidden.dtype)
        for i, g in zip(ids.reshape(-1).tolist(), grad_embedded.reshape(-1, d)):
            grad[i] = g                                            # the last occurrence wins
        return grad + grad_logits.reshape(-1, vocab_size).T @ hidden.reshape(-1, d)
    with pytest.raises(ContractError, match="repeated ids overwrite each other"):
        lab02.check_tied_embedding_grad(overwrite, seed=0)
    with pytest.raises(ContractError, match="lookup's gradient .* is missing"):
        lab02.check_tied_embedding_grad(lambda ids, ge, h, gl, v: gl.reshape(-1, v).T @ h.reshape(-1, h.shape[-1]),
                                        seed=1)
    with pytest.raises(ContractError, match=r"output must have shape \(\d+, \d+\)"):
        lab02.check_tied_embedding_grad(lambda *a: ref.tied_embedding_grad(*a).T.contiguous(), seed=0)


# -- the paged cache past its context (exercise 11) -------------------------------------------------
def no_policy(pool, seq, k, v):
    """The solution's append with the pool's limit switched off for the call: a cache with no policy."""
    saved, pool.max_seq_len = pool.max_seq_len, None
    try:
        ref.paged_append(pool, seq, k, v)
    finally:
        pool.max_seq_len = saved


def test_paged_context_policy_accepts_the_boundary_and_names_a_cache_that_grows():
    """The solution passes every seed's context case (the last append ends exactly on max_seq_len);
    an append that never refuses is named ('grew past its context'); one that refuses only after
    writing, or that refuses the append ending on the boundary, is told so."""
    for seed in range(6):
        lab02.check_paged(ref.paged_append, ref.paged_read, seed=seed, cases=1)

    with pytest.raises(ContractError, match="the cache grew past its context"):
        lab02.check_paged(no_policy, ref.paged_read, seed=0)

    def refuses_late(pool, seq, k, v):
        no_policy(pool, seq, k, v)
        if pool.max_seq_len is not None and seq.length > pool.max_seq_len:
            raise ValueError("too long")

    with pytest.raises(ContractError, match="changed the sequence or the pool first"):
        lab02.check_paged(refuses_late, ref.paged_read, seed=0)

    def off_by_one(pool, seq, k, v):
        if pool.max_seq_len is not None and seq.length + k.shape[0] >= pool.max_seq_len:
            raise ValueError("full")
        no_policy(pool, seq, k, v)

    with pytest.raises(ContractError, match="fits, but paged_append raised ValueError"):
        lab02.check_paged(off_by_one, ref.paged_read, seed=0)


def test_paged_context_policy_names_the_newcomers_variants():
    """Found by a newcomer: an append that starts below the limit and crosses it, a refusal only once the
    sequence already sits on the limit, a position-by-position refusal after a partial write, a pool with
    no limit (max_seq_len None), and another exception type than ValueError."""
    def only_at_the_limit(pool, seq, k, v):
        if pool.max_seq_len is not None and seq.length >= pool.max_seq_len:
            raise ValueError("full")
        no_policy(pool, seq, k, v)

    with pytest.raises(ContractError, match="not only one that starts on it"):
        lab02.check_paged(only_at_the_limit, ref.paged_read, seed=0)

    def position_by_position(pool, seq, k, v):
        for i in range(k.shape[0]):
            if pool.max_seq_len is not None and seq.length + 1 > pool.max_seq_len:
                raise ValueError("full")
            no_policy(pool, seq, k[i:i + 1], v[i:i + 1])

    with pytest.raises(ContractError, match="changed the sequence or the pool first"):
        lab02.check_paged(position_by_position, ref.paged_read, seed=0)

    def none_unhandled(pool, seq, k, v):
        if seq.length + k.shape[0] > pool.max_seq_len:      # TypeError when the pool sets no limit
            raise ValueError("full")
        no_policy(pool, seq, k, v)

    with pytest.raises(TypeError):
        lab02.check_paged(none_unhandled, ref.paged_read, seed=0, cases=2)

    def index_error(pool, seq, k, v):
        if pool.max_seq_len is not None and seq.length + k.shape[0] > pool.max_seq_len:
            raise IndexError("past the context")
        no_policy(pool, seq, k, v)

    with pytest.raises(ContractError, match="raised IndexError: past the context; past the context paged_append "
                                            "must raise ValueError"):
        lab02.check_paged(index_error, ref.paged_read, seed=0)
