"""course_lib.quant.ggml_blocks against the gguf package (byte for byte) and against the course's
model, whose float32 weights are the dequantised Q4_1 blocks of the GGUF file they come from."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from course_lib.quant import (QuantScheme, dequantize_ggml, fake_quantize, quantize_q4_0, quantize_q4_1,
                              quantize_q8_0, read_gguf_tensor)

KINDS = {"Q4_0": quantize_q4_0, "Q4_1": quantize_q4_1, "Q8_0": quantize_q8_0}
BLOCK_BYTES = {"Q4_0": 2 + 16, "Q4_1": 2 + 2 + 16, "Q8_0": 2 + 32}   # block_q4_0 / q4_1 / q8_0 of ggml-common.h


def special_rows(seed: int) -> np.ndarray:
    """(12, 128) float32: random rows of several magnitudes with hard blocks planted."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((12, 128)) * rng.choice([1e-4, 0.02, 1.0, 300.0], size=(12, 1))
    x[0, :32] = 0.0                                  # a block of zeros
    x[1, :32] = 0.3                                  # all equal, positive
    x[1, 32:64] = -0.7                               # all equal, negative
    x[2, :32] *= 0.01
    x[2, 7] = 1e4                                    # one large outlier
    x[3, 64:96] = np.round(x[3, 64:96])              # ties: values on the grid's half steps
    x[4, :32] = np.linspace(-8, 7, 32) / 2           # x / d lands on .5 exactly
    x[5, :32] = 1e-7                                 # fp16 d underflows
    x[6, 100] = -x[6, 96:128].max() * 3               # the largest magnitude is negative
    x[7, 32:64] = np.abs(x[7, 32:64])                # all positive: Q4_1's minimum is not 0
    x[8, :32] = rng.choice([0.0, -0.0], size=32)     # signed zeros: the sign of d and m is in the bytes
    x[8, 32:64] = -0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", list(KINDS))
def test_blocks_are_byte_identical_to_gguf(seed, kind):
    x = special_rows(seed)
    qtype = getattr(GGMLQuantizationType, kind)
    ours = KINDS[kind](x)
    theirs = gguf_quantize(x, qtype)
    assert ours.dtype == np.uint8 and ours.shape == theirs.shape == (12, 4 * BLOCK_BYTES[kind])
    assert np.array_equal(ours, theirs)
    assert np.array_equal(KINDS[kind](torch.from_numpy(x)), theirs)        # torch input, same bytes
    back = dequantize_ggml(ours, kind, x.shape)
    assert back.dtype == torch.float32 and tuple(back.shape) == x.shape
    assert np.array_equal(back.numpy().view(np.uint32), gguf_dequantize(theirs, qtype).view(np.uint32))  # bits
    assert torch.equal(dequantize_ggml(torch.from_numpy(ours), kind, x.shape), back)


def test_one_block_by_hand():
    fp16_one = [0x00, 0x3C]                                       # 1.0 in fp16, little-endian
    # Q4_0: the largest magnitude is -8, so d = -8 / -8 = 1 and the code of x is x + 8
    x = np.array([j - 8 for j in range(16)] * 2, dtype=np.float32).reshape(1, 32)
    assert quantize_q4_0(x).tolist() == [fp16_one + [0x11 * j for j in range(16)]]
    # Q4_1: min 0, max 15: d = 1, m = 0, code = x
    x = np.array(list(range(16)) * 2, dtype=np.float32).reshape(1, 32)
    assert quantize_q4_1(x).tolist() == [fp16_one + [0, 0] + [0x11 * j for j in range(16)]]
    # Q8_0: absmax 127 gives d = 1; halves round away from zero (0.5 -> 1, 2.5 -> 3, -0.5 -> -1)
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, :6] = [127, -127, 0.5, 2.5, -0.5, -2.5]
    codes = [127, -127, 1, 3, -1, -3] + [0] * 26
    assert quantize_q8_0(x).tolist() == [fp16_one + [c & 0xFF for c in codes]]
    assert dequantize_ggml(quantize_q8_0(x), "Q8_0", (1, 32))[0, :6].tolist() == [127, -127, 1, 3, -1, -3]


def test_refusals():
    with pytest.raises(ValueError, match="32"):
        quantize_q4_0(np.zeros((2, 48), dtype=np.float32))
    with pytest.raises(ValueError, match=r"w\[1, 3\]"):
        x = np.zeros((2, 32), dtype=np.float32)
        x[1, 3] = np.nan
        quantize_q4_1(x)
    with pytest.raises(TypeError, match="floating"):
        quantize_q8_0(np.zeros((1, 32), dtype=np.int32))
    with pytest.raises(ValueError, match="kind"):
        dequantize_ggml(np.zeros(18, dtype=np.uint8), "Q5_0", (1, 32))
    with pytest.raises(ValueError, match="bytes"):
        dequantize_ggml(np.zeros(18, dtype=np.uint8), "Q4_1", (1, 32))


def test_dequantize_takes_bytes_bytearray_and_memoryview():
    w = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    for quantize, kind in ((quantize_q4_0, "Q4_0"), (quantize_q4_1, "Q4_1"), (quantize_q8_0, "Q8_0")):
        raw = quantize(w)
        expected = dequantize_ggml(raw, kind, (2, 64))
        for data in (raw.tobytes(), bytearray(raw.tobytes()), memoryview(raw.tobytes()), memoryview(raw),
                     torch.from_numpy(raw), raw.reshape(-1)):
            assert torch.equal(dequantize_ggml(data, kind, (2, 64)), expected), (kind, type(data))
    floats = np.arange(6, dtype=np.float32)
    assert dequantize_ggml(floats.tobytes(), "F32", (2, 3)).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert dequantize_ggml(memoryview(floats), "F32", [6]).tolist() == [0, 1, 2, 3, 4, 5]  # its raw bytes
    assert dequantize_ggml(floats.astype(np.float16).tobytes(), "F16", torch.Size([3, 2])).shape == (3, 2)
    with pytest.raises(ValueError, match="contiguous"):
        dequantize_ggml(memoryview(floats.tobytes())[::2], "F16", (6,))
    with pytest.raises(TypeError, match="data must be"):
        dequantize_ggml(list(floats.tobytes()), "F32", (6,))


@pytest.mark.parametrize("shape, error, pattern", [
    ((2.9, 64), TypeError, r"shape\[0\] must be an int >= 0, got 2.9 of type float"),
    ((2, 64.0), TypeError, r"shape\[1\] must be an int"),
    ("64", TypeError, r"shape must be a tuple of ints, e.g. \(rows, n \* 32\), got '64' of type str"),
    (128, TypeError, "shape must be a tuple of ints"),
    (None, TypeError, "shape must be a tuple of ints"),
    (torch.tensor([2, 64]), TypeError, "shape must be a tuple of ints"),
    ((4, -32), ValueError, r"shape\[1\] must be an int >= 0, got -32"),
])
def test_dequantize_refuses_a_shape_that_is_not_a_tuple_of_ints(shape, error, pattern):
    raw = quantize_q4_1(np.ones((2, 64), dtype=np.float32))
    with pytest.raises(error, match=pattern):
        dequantize_ggml(raw, "Q4_1", shape)
    assert dequantize_ggml(raw, "Q4_1", (np.int64(2), 64)).shape == (2, 64)      # numpy ints are ints


def test_ggml_blocks_refuse_meta_tensors():
    meta = "must be a tensor with data, on the cpu or cuda device, got one on the meta device"
    with pytest.raises(ValueError, match="data " + meta):
        dequantize_ggml(torch.zeros(36, dtype=torch.uint8, device="meta"), "Q4_0", (1, 64))
    for quantize in (quantize_q4_0, quantize_q4_1, quantize_q8_0):
        with pytest.raises(ValueError, match="w " + meta):
            quantize(torch.zeros(1, 32, device="meta"))


def test_where_gguf_differs_from_the_lab():
    """The same 32 weights through GGUF's blocks and the lab's int4 g32 (both stated, both tested)."""
    # Q4_1 keeps a float minimum; the lab's asymmetric scheme widens the range to contain 0.
    positive = np.linspace(1.0, 2.5, 32, dtype=np.float32).reshape(1, 32)
    q41 = dequantize_ggml(quantize_q4_1(positive), "Q4_1", (1, 32))
    lab = fake_quantize(torch.from_numpy(positive), QuantScheme(4, "group", 32, False))
    d, m = 1.5 / 15, 1.0                                  # Q4_1: (max - min) / 15, min
    s = 2.5 / 15                                          # lab: (hi - lo) / 15 with lo = 0
    err_q41 = (q41 - torch.from_numpy(positive)).abs().max().item()
    err_lab = (lab - torch.from_numpy(positive)).abs().max().item()
    assert err_q41 <= d / 2 * 1.01 and err_lab <= s / 2 * 1.01
    assert err_q41 < err_lab                              # Q4_1's grid spans only [1, 2.5]
    assert q41[0, 0].item() == m                          # the minimum is on Q4_1's grid
    # ... but 0 is exact only on the lab's grid
    mixed = np.linspace(-0.3, 1.0, 32, dtype=np.float32).reshape(1, 32)
    mixed[0, 10] = 0.0
    assert dequantize_ggml(quantize_q4_1(mixed), "Q4_1", (1, 32))[0, 10].item() != 0.0
    assert fake_quantize(torch.from_numpy(mixed), QuantScheme(4, "group", 32, False))[0, 10].item() == 0.0
    # Q4_0 puts the signed extreme on code -8 (d = x_max / -8): the other side reaches only 7 |d|
    sym = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(1, 32)
    q40 = dequantize_ggml(quantize_q4_0(sym), "Q4_0", (1, 32))
    assert q40[0, 0].item() == -1.0                       # x_max = -1 (first on ties) -> d = 1/8, code -8
    assert q40[0, 31].item() == 7 / 8                     # +1 clipped to code 7: 7 |d|
    lab_sym = fake_quantize(torch.from_numpy(sym), QuantScheme(4, "group", 32, True))
    assert abs(lab_sym[0, 0].item() + 1) < 1e-3 and abs(lab_sym[0, 31].item() - 1) < 1e-3   # 7 * absmax / 7
    # Q8_0 rounds halves away from zero, the lab rounds them to even
    halves = np.zeros((1, 32), dtype=np.float32)
    halves[0, :2] = [127.0, 2.5]
    assert dequantize_ggml(quantize_q8_0(halves), "Q8_0", (1, 32))[0, 1].item() == 3.0
    assert fake_quantize(torch.from_numpy(halves), QuantScheme(8, "group", 32, True, "fp32"))[0, 1].item() == 2.0


# -- the course's model ------------------------------------------------------------------------
def gguf_file() -> Path:
    from course_lib.data import load_manifest

    fallback = load_manifest("smollm2-135m")["fallback"]
    spec = importlib.util.find_spec(fallback["module"])      # located, never imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{fallback['package']} is not installed ({fallback['install']}): no GGUF file to read")
    path = Path(list(spec.submodule_search_locations)[0]) / fallback["file"]
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves the rows of attn_q/attn_k per head for its RoPE; undo it
    (w.reshape(heads, head_dim / 2, 2, in) with the middle axes swapped), as transformers does."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


@pytest.mark.slow
def test_the_course_weights_are_the_dequantised_gguf_blocks():
    path = gguf_file()
    from course_lib.data import load_smollm2

    model, _, provenance = load_smollm2()
    if not provenance.is_fallback:
        pytest.skip("the model came from the hub (bf16 weights), not from the Q4_1 GGUF fallback")
    params = dict(model.named_parameters())
    pairs = {"blk.3.ffn_down.weight": "layers.3.down_proj.weight",
             "blk.0.attn_v.weight": "layers.0.v_proj.weight",
             "blk.5.attn_output.weight": "layers.5.o_proj.weight",
             "blk.11.ffn_gate.weight": "layers.11.gate_proj.weight"}
    for gguf_name, name in pairs.items():
        raw, kind, shape = read_gguf_tensor(path, gguf_name)
        assert kind == "Q4_1" and shape == params[name].shape
        assert torch.equal(dequantize_ggml(raw, kind, shape), params[name].detach()), gguf_name
    # attn_k: equal only after undoing the RoPE row interleave (3 KV heads)
    raw, kind, shape = read_gguf_tensor(path, "blk.2.attn_k.weight")
    k = dequantize_ggml(raw, kind, shape)
    assert not torch.equal(k, params["layers.2.k_proj.weight"].detach())
    assert torch.equal(unpermute_rope_rows(k, 3), params["layers.2.k_proj.weight"].detach())
    # the Q4_1 blocks re-encode to the same bytes
    raw, kind, shape = read_gguf_tensor(path, "blk.3.ffn_down.weight")
    assert np.array_equal(quantize_q4_1(params["layers.3.down_proj.weight"].detach()), raw)
    with pytest.raises(KeyError, match="blk.99"):
        read_gguf_tensor(path, "blk.99.ffn_down.weight")
