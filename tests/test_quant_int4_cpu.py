"""course_lib.quant.int4_cpu: GGUF Q4_1 blocks as packed int4 through PyTorch's CPU int4 matmul.

The mapping is checked against the gguf package's own dequantisation on the course's GGUF file, the
kernel's product against a float64 product with an error bound written out per element, the fallback
against the kernel, and the int4 decoder against a float32 decoder on the same file's weights (a toy
GGUF file written here, and, marked slow, the course's model)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize

from course_lib.models import Decoder, toy_config
from course_lib.quant import quantize_q4_1, quantize_q8_0
from course_lib.quant.int4_cpu import (CastLinear, Int4Linear, gguf_rope_rows, int4_kernel_error, int4_streamed_bytes,
                                       load_int4_decoder, q4_1_codes, q4_1_to_int4)
from test_quant_gguf import gguf_file

KERNEL_MISSING = int4_kernel_error()
needs_kernel = pytest.mark.skipif(KERNEL_MISSING is not None, reason=f"no CPU int4 kernel: {KERNEL_MISSING}")
U_BF16 = 2.0 ** -8          # unit roundoff of bfloat16 (8 significant bits): |round(v) - v| <= U_BF16 * |v|
FILE_TENSORS = ["blk.0.attn_v.weight", "blk.3.ffn_down.weight", "blk.17.attn_q.weight", "blk.29.ffn_gate.weight"]


def random_int4(n: int, k: int, g: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    scales = torch.rand(n, k // g, generator=gen) * 0.02 + 1e-3
    zeros = torch.randn(n, k // g, generator=gen) * 0.05
    return codes, scales, zeros


# -- the mapping, on the course's file ----------------------------------------------------------------
@pytest.mark.slow                      # parsing the 98 MB file's header takes seconds
@pytest.mark.parametrize("name", FILE_TENSORS)
def test_the_int4_form_of_the_files_q4_1_blocks_is_exactly_what_gguf_dequantises(name):
    from course_lib.quant import read_gguf_tensor

    raw, kind, shape = read_gguf_tensor(gguf_file(), name)
    assert kind == "Q4_1"
    want = gguf_dequantize(np.asarray(raw), GGMLQuantizationType.Q4_1).reshape(tuple(shape))   # float32
    codes, d, m = q4_1_codes(raw, shape)
    assert codes.dtype == torch.uint8 and tuple(codes.shape) == tuple(shape) and int(codes.max()) <= 15
    g = lambda t: t.double().repeat_interleave(32, dim=1)                                        # noqa: E731
    assert np.array_equal((g(d) * codes.double() + g(m)).float().numpy().view(np.uint32), want.view(np.uint32))
    scales, zeros = q4_1_to_int4(d, m)
    assert torch.equal(scales, d)
    int4_form = (codes.double() - 8) * g(scales) + g(zeros)            # what the kernel's format means
    assert np.array_equal(int4_form.float().numpy().view(np.uint32), want.view(np.uint32)), name


@pytest.mark.slow
@needs_kernel
def test_the_kernel_product_is_the_files_weights_within_bfloat16_rounding():
    from course_lib.quant import read_gguf_tensor

    raw, _, shape = read_gguf_tensor(gguf_file(), "blk.3.ffn_down.weight")            # (576, 1536)
    layer = Int4Linear.from_q4_1(raw, shape)
    assert layer.kernel and layer.weight_int4.dtype == torch.uint8 and tuple(layer.weight_int4.shape) == (576, 768)
    w = torch.from_numpy(gguf_dequantize(np.asarray(raw), GGMLQuantizationType.Q4_1)).reshape(576, 1536).double()
    x = torch.randn(3, 1536, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (3, 576)
    xb = x.to(torch.bfloat16).double()                                   # the activations the kernel reads
    exact = xb @ w.T
    # Bound, per output: the scale and zero of each group rounded to bfloat16 move a weight by at most
    # U * (|q - 8| * |d| + |zero|), summed over |x|; the product is then rounded once to bfloat16.
    codes, d, m = q4_1_codes(raw, shape)
    scales, zeros = (t.double().repeat_interleave(32, dim=1) for t in q4_1_to_int4(d, m))
    weight_error = U_BF16 * ((codes.double() - 8).abs() * scales.abs() + zeros.abs())
    bound = xb.abs() @ weight_error.T
    bound = bound + U_BF16 * (exact.abs() + bound) + 1e-6
    assert bool(((y.double() - exact).abs() <= bound).all()), float(((y.double() - exact).abs() / bound).max())
    assert float((y.double() - exact).abs().max()) > 0          # bfloat16 did round something: not bitwise


# -- the layer and its fallback -----------------------------------------------------------------------
@pytest.mark.parametrize("g", [32, 64])
def test_fallback_weight_is_the_formula_and_its_product_matches_the_kernel(g):
    codes, scales, zeros = random_int4(48, 128, g)
    slow = Int4Linear(codes, scales, zeros, g, kernel=False)
    assert not slow.kernel
    sb, zb = (t.to(torch.bfloat16).float().repeat_interleave(g, dim=1) for t in (scales, zeros))
    assert torch.equal(slow.dequantize(), (codes.float() - 8) * sb + zb)
    x = torch.randn(2, 5, 128, generator=torch.Generator().manual_seed(g))
    y = slow(x)
    assert y.shape == (2, 5, 48) and y.dtype == torch.float32
    assert slow(x.to(torch.bfloat16)).dtype == torch.bfloat16
    exact = x.to(torch.bfloat16).double() @ slow.dequantize().double().T
    assert torch.allclose(y.double(), exact, rtol=U_BF16, atol=1e-6)           # one bfloat16 rounding
    if KERNEL_MISSING is None:
        fast = Int4Linear(codes, scales, zeros, g, kernel=True)
        assert torch.allclose(fast(x), y, rtol=2 * U_BF16, atol=1e-5)          # summation order, then bf16
        with pytest.raises(ValueError, match="kernel's packed layout"):
            fast.dequantize()


def test_a_shape_the_kernel_cannot_take_falls_back_with_one_notice(capsys):
    codes, scales, zeros = random_int4(40, 64, 32, seed=3)                  # N = 40: not a multiple of 16
    layer = Int4Linear(codes, scales, zeros)
    Int4Linear(codes, scales, zeros)
    assert not layer.kernel
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[int4]")]
    assert len(notices) == 1 and "multiple of 16" in notices[0] and "dequantising" in notices[0]
    with pytest.raises(ValueError, match="kernel=True"):
        Int4Linear(codes, scales, zeros, kernel=True)
    x = torch.randn(3, 64)
    assert torch.allclose(layer(x).double(), x.to(torch.bfloat16).double() @ layer.dequantize().double().T,
                          rtol=U_BF16, atol=1e-6)


@pytest.mark.parametrize("make, error, pattern", [
    (lambda c, s, z: Int4Linear(c[0], s, z), ValueError, "codes"),                              # 1-D codes
    (lambda c, s, z: Int4Linear(c + 1, s, z), ValueError, "codes"),                             # a 16
    (lambda c, s, z: Int4Linear(c.float(), s, z), TypeError, "codes"),
    (lambda c, s, z: Int4Linear(c, s[:, :1], z), ValueError, r"scales must be \(N, K / group_size\)"),
    (lambda c, s, z: Int4Linear(c, s, z.to(torch.int32)), TypeError, "zeros must be a float"),
    (lambda c, s, z: Int4Linear(c, s, z, group_size=48), ValueError, "group_size 48 must divide K"),
    (lambda c, s, z: Int4Linear(c, s * float("nan"), z), ValueError, "scales must be finite"),
    (lambda c, s, z: Int4Linear(c, s, z, kernel="yes"), TypeError, "kernel"),
])
def test_the_layer_refuses_bad_input(make, error, pattern):
    codes, scales, zeros = random_int4(32, 64, 32)
    codes[0, 0] = 15
    with pytest.raises(error, match=pattern):
        make(codes, scales, zeros)


def test_forward_refuses_another_width_and_integer_input():
    layer = Int4Linear(*random_int4(32, 64, 32), kernel=False)
    with pytest.raises(ValueError, match=r"\(\.\.\., 64\)"):
        layer(torch.zeros(2, 32))
    with pytest.raises(TypeError, match="float"):
        layer(torch.zeros(2, 64, dtype=torch.int64))


def test_q4_1_codes_refuses_bytes_that_do_not_fit_the_shape():
    raw = quantize_q4_1(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
    codes, d, m = q4_1_codes(raw, (4, 64))
    assert codes.shape == (4, 64) and d.shape == m.shape == (4, 2)
    with pytest.raises(ValueError, match="Q4_1 blocks of 20 bytes"):
        q4_1_codes(raw, (8, 64))
    with pytest.raises(ValueError, match="multiple of the Q4_1 block of 32"):
        q4_1_codes(raw, (5, 48))
    with pytest.raises(TypeError, match="uint8"):
        q4_1_codes(raw.astype(np.int16), (4, 64))
    with pytest.raises(ValueError, match="rows"):
        gguf_rope_rows(torch.zeros(6, 4), 2)


# -- the int4 decoder, on a toy GGUF file written here --------------------------------------------------
TOY = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128, vocab_size=96,
           tie_embeddings=True, max_seq_len=64)
NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
         "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: q/k rows interleaved for llama.cpp's RoPE."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_toy_gguf(path, seed: int = 0, v_kind: str = "Q4_1") -> Decoder:
    """A GGUF file of the toy model (Q4_1 projections, Q8_0 embedding, F32 norms, q/k permuted as llama.cpp's
    converter stores them) and the float32 Decoder holding exactly the file's dequantised weights."""
    config = toy_config(**TOY)
    model = Decoder.random(config, seed)
    state = {}
    writer = GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(seed)

    def put(name: str, w: np.ndarray, kind: str) -> np.ndarray:
        if kind == "F32":
            writer.add_tensor(name, w.astype(np.float32))
            return w.astype(np.float32)
        raw = {"Q4_1": quantize_q4_1, "Q8_0": quantize_q8_0}[kind](w)
        writer.add_tensor(name, raw, raw_dtype=getattr(GGMLQuantizationType, kind))   # shape from the byte rows
        return gguf_dequantize(raw, getattr(GGMLQuantizationType, kind)).reshape(w.shape)

    state["embed_tokens.weight"] = put("token_embd.weight", model.embed_tokens.weight.numpy(), "Q8_0")
    for i, block in enumerate(model.layers):
        for norm, stem in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm")):
            w = 1 + 0.1 * rng.standard_normal(config.d_model)
            state[f"layers.{i}.{norm}.weight"] = put(f"blk.{i}.{stem}.weight", w, "F32")
        for attr, stem in NAMES.items():
            w = getattr(block, attr).weight.numpy()
            heads = {"q_proj": config.n_heads, "k_proj": config.n_kv_heads}.get(attr)
            stored = w if heads is None else llama_cpp_permute(w, heads)
            back = put(f"blk.{i}.{stem}.weight", stored, v_kind if attr == "v_proj" else "Q4_1")
            if heads is not None:               # undo by the permutation's own row indices, not by the module
                rows = llama_cpp_permute(np.arange(w.shape[0])[:, None], heads)[:, 0]
                back = back[np.argsort(rows)]
            state[f"layers.{i}.{attr}.weight"] = back
    state["norm.weight"] = put("output_norm.weight", 1 + 0.1 * rng.standard_normal(config.d_model), "F32")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Decoder.from_hf_state_dict(config, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})


def test_the_int4_decoder_of_a_gguf_file_computes_what_its_float32_weights_do(tmp_path):
    reference = write_toy_gguf(tmp_path / "toy.gguf")
    model = load_int4_decoder(tmp_path / "toy.gguf", reference.config)
    slow = load_int4_decoder(tmp_path / "toy.gguf", reference.config, kernel=False, head_dtype=torch.float32)
    assert isinstance(model.layers[1].k_proj, Int4Linear) and isinstance(model.lm_head, CastLinear)
    assert model.lm_head.weight.dtype == torch.float16 and model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(model.embed_tokens.weight, reference.embed_tokens.weight)      # Q8_0, kept as the file says
    assert torch.equal(model.layers[0].input_layernorm.weight, reference.layers[0].input_layernorm.weight)
    # the fallback's weights are the file's, up to the bfloat16 rounding of each group's scale and zero
    for attr in NAMES:
        w = getattr(reference.layers[1], attr).weight
        assert torch.allclose(getattr(slow.layers[1], attr).dequantize(), w, rtol=0, atol=float(w.abs().max()) / 32)
    ids = torch.randint(0, TOY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12)
    want = reference(ids, positions)
    for int4 in (model, slow):
        got = int4(ids, positions)
        assert got.dtype == torch.float32 and got.shape == want.shape
        # bfloat16 activations (2^-8) into every projection, bfloat16 scales and zeros: a relative error
        # of about 1 % per product on this random model; 5 % of the logits' range leaves room, and a
        # missing RoPE un-permutation or a wrong zero point moves the logits by their whole range.
        assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max())
    assert torch.allclose(model(ids, positions), slow(ids, positions), rtol=0, atol=0.01 * float(want.abs().max()))
    # a cached decode runs too: prefill then one step equals the full forward's last position
    cache = model.new_cache(1, 13)
    model.prefill(ids[:1, :11], cache)
    step = model.decode(ids[:1, 11:12], cache)
    assert torch.allclose(step, model(ids[:1], positions)[0, -1:], atol=1e-4)


def test_streamed_bytes_are_the_files_q4_1_bytes_plus_the_head_and_norms(tmp_path):
    reference = write_toy_gguf(tmp_path / "toy.gguf", seed=1)
    model = load_int4_decoder(tmp_path / "toy.gguf", reference.config)
    c = reference.config
    q4_1 = c.n_layers * (2 * c.d_model * c.d_model + 2 * c.n_kv_heads * c.head_dim * c.d_model
                         + 3 * c.d_ff * c.d_model) // 32 * 20          # 20 bytes per block of 32, as in the file
    assert int4_streamed_bytes(model) == q4_1 + 2 * c.vocab_size * c.d_model + 4 * (2 * c.n_layers + 1) * c.d_model
    assert int4_streamed_bytes(reference) == 4 * c.parameters()          # float32, tied head counted once


def test_the_loader_refuses_a_projection_that_is_not_q4_1_and_a_bad_head_dtype(tmp_path):
    reference = write_toy_gguf(tmp_path / "mixed.gguf", v_kind="Q8_0")
    with pytest.raises(ValueError, match=r"blk.0.attn_v.weight is Q8_0, not Q4_1"):
        load_int4_decoder(tmp_path / "mixed.gguf", reference.config)
    with pytest.raises(ValueError, match="head_dtype"):
        load_int4_decoder(tmp_path / "mixed.gguf", reference.config, head_dtype=torch.int8)
    with pytest.raises(ValueError, match="shape"):
        load_int4_decoder(tmp_path / "mixed.gguf", toy_config(**{**TOY, "d_model": 128}))


# -- the course's model ----------------------------------------------------------------------------------
@pytest.mark.slow
@needs_kernel
def test_the_int4_smollm2_decodes_as_the_float32_one_within_bfloat16_rounding():
    from course_lib.data import load_smollm2

    reference, tokenizer, provenance = load_smollm2()
    if not provenance.is_fallback:
        pytest.skip("the float32 model came from the hub, not from the GGUF file the int4 model reads")
    model, _, _ = load_smollm2(weights="int4")                           # the Decoder option: same file
    assert isinstance(model.layers[29].down_proj, Int4Linear) and model.config == reference.config
    ids = torch.tensor([tokenizer.encode("The capital of France is Paris, and the capital of Germany is")])
    positions = torch.arange(ids.shape[1])
    want, got = reference(ids, positions), model(ids, positions)
    # bfloat16 activations into 210 projections over 30 residual blocks, bfloat16 scales, a float16 head:
    # measured 2.5 % of the largest logit; 6 % allows for it, a wrong mapping moves logits by their range
    assert float((got - want).abs().max()) <= 0.06 * float(want.abs().max())
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean()
    assert agree >= 0.8 and tokenizer.decode(got[0, -1].argmax()) == tokenizer.decode(want[0, -1].argmax())
    # the target (docs/decoder_performance.md): perplexity within 1 % of float32 on Lab 4's windows
    # (one window here; on four: -0.16 %)
    from course_lib.models.bench import perplexities

    values, _ = perplexities({"float32": reference, "int4": model}, tokenizer, n_windows=1)
    assert abs(values["int4"] / values["float32"] - 1) < 0.01, values


def test_load_smollm2_refuses_weights_it_does_not_know_before_loading_anything():
    from course_lib.data import load_smollm2

    with pytest.raises(ValueError, match="weights"):
        load_smollm2(weights="int8")


def test_the_engine_and_speculative_decoding_serve_the_int4_model(tmp_path):
    from course_lib.engine import Engine
    from course_lib.models import generate_cached
    from course_lib.speculative import PromptLookupDraft, generate_speculative, truncated_draft

    reference = write_toy_gguf(tmp_path / "toy.gguf", seed=2)
    model = load_int4_decoder(tmp_path / "toy.gguf", reference.config)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, TOY["vocab_size"], (n,), generator=gen) for n in (5, 9, 3)]
    solo = [generate_cached(model, p, 6)[0] for p in prompts]
    engine = Engine(model, num_blocks=16, block_size=4, budget=32, max_running=3)
    engine.run([(0.0, p, 6) for p in prompts])
    for rid, tokens in enumerate(solo):
        assert torch.equal(engine.output_ids(rid), tokens), rid
    repeated = torch.cat([prompts[1], prompts[1]])                       # something for prompt lookup to find
    want = generate_cached(model, repeated, 8)[0]
    for draft in (PromptLookupDraft(), truncated_draft(model, 1)):
        got, _ = generate_speculative(model, draft, repeated, 8, gamma=3)
        assert torch.equal(got, want)
