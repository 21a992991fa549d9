"""course_lib.quant.formats and .packing: grids, error bounds, edge cases, byte accounting, nibbles.

Expected values are worked out by hand in the tests (bits per weight, bytes, packed bytes) or are
properties any correct quantiser has (codes in range, |w - w_hat| <= s/2 where nothing is
clipped), checked with float64 arithmetic independent of the code under test."""
import math

import numpy as np
import pytest
import torch

from course_lib.quant import (FORMATS, PackedInt4, QuantizedTensor, QuantScheme, bits_per_weight, dequantize,
                              fake_quantize, pack_int4, pack_weight, qmax, quantize, storage_bytes, unpack_int4)

FLT_MAX = float(np.finfo(np.float32).max)
SMALLEST = 2.0 ** -149          # the smallest positive float32
SCHEMES = [(bits, gran, sym) for bits in range(2, 9) for gran in ("tensor", "channel", "group")
           for sym in (True, False)]


def scheme_of(bits, gran, sym, scale_dtype="fp16", g=16):
    return QuantScheme(bits, gran, g if gran == "group" else None, sym, scale_dtype)


def weights(seed=0, shape=(6, 64)):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen) * torch.logspace(-2, 1, shape[0]).unsqueeze(1)
    w[0, 3] = 0.0                               # exact zeros must stay exact
    w[2, 40:44] = 0.0
    return w


def per_weight(t, scheme, shape):
    """Scales or zeros (tensor/channel/group shape) broadcast to one value per weight, float64."""
    t = t.double()
    if scheme.granularity == "tensor":
        return t.expand(shape)
    return t.repeat_interleave(shape[1] // t.shape[1], dim=1)


def levels(scheme):
    return 2 ** scheme.bits - 1


# -- qmax and QuantScheme ---------------------------------------------------------------------
def test_qmax_by_hand_and_refusals():
    assert [qmax(b) for b in range(2, 9)] == [1, 3, 7, 15, 31, 63, 127]
    for bad in (1, 9, 0):
        with pytest.raises(ValueError, match="bits"):
            qmax(bad)
    for bad in (4.0, True, "4"):
        with pytest.raises(TypeError, match="bits"):
            qmax(bad)


def test_scheme_names_and_validation():
    assert QuantScheme().name == "int4 g64"
    assert QuantScheme(symmetric=False).name == "int4 g64 +zero"
    assert QuantScheme(8, "channel", None).name == "int8 channel"
    assert QuantScheme(4, "tensor", None).name == "int4 tensor"
    assert QuantScheme(4, "group", 128, False, "fp32").name == "int4 g128 +zero fp32"
    bad = [dict(bits=9), dict(bits=1), dict(granularity="row"), dict(granularity="group", group_size=None),
           dict(granularity="channel", group_size=64), dict(group_size=0), dict(scale_dtype="bf16")]
    fields = ["bits", "bits", "granularity", "group_size", "group_size", "group_size", "scale_dtype"]
    for kwargs, field in zip(bad, fields):
        with pytest.raises(ValueError, match=f"QuantScheme.{field}"):
            QuantScheme(**kwargs)
    for kwargs, field in ((dict(symmetric=1), "symmetric"), (dict(bits=4.0), "bits"),
                          (dict(group_size=64.0), "group_size")):
        with pytest.raises(TypeError, match=f"QuantScheme.{field}"):
            QuantScheme(**kwargs)


def test_group_size_that_does_not_divide_is_refused():
    scheme = QuantScheme(4, "group", 48)
    with pytest.raises(ValueError, match="48.*64"):
        scheme.n_groups(64)
    with pytest.raises(ValueError, match="48.*64"):
        quantize(torch.randn(4, 64), scheme)
    with pytest.raises(ValueError, match="48.*64"):
        storage_bytes((4, 64), scheme)
    assert scheme.n_groups(96) == 2 and QuantScheme(4, "channel", None).n_groups(96) == 1


def test_bad_weights_are_refused_with_the_index():
    w = torch.randn(3, 8)
    w[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"w\[1, 2\]"):
        quantize(w, QuantScheme(4, "group", 4))
    w[1, 2] = 0.0
    w[2, 7] = float("inf")
    with pytest.raises(ValueError, match=r"w\[2, 7\]"):
        fake_quantize(w, QuantScheme(4, "channel", None))
    with pytest.raises(ValueError, match=r"w\[0, 1\]"):   # finite in float64, not in float32
        quantize(torch.tensor([[1.0, 1e300]], dtype=torch.float64), QuantScheme(4, "channel", None))
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.randn(8), QuantScheme(4, "channel", None))
    with pytest.raises(TypeError, match="floating"):
        quantize(torch.ones(2, 8, dtype=torch.int32), QuantScheme(4, "channel", None))
    with pytest.raises(TypeError, match="scheme"):
        quantize(torch.randn(2, 8), "int4 g64")


# -- the grids ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bits,gran,sym", SCHEMES)
@pytest.mark.parametrize("scale_dtype", ["fp16", "fp32"])
def test_codes_scales_and_error_bound(bits, gran, sym, scale_dtype):
    w = weights(bits)
    scheme = scheme_of(bits, gran, sym, scale_dtype)
    qt = quantize(w, scheme)
    rows = {"tensor": (1, 1), "channel": (6, 1), "group": (6, 4)}[gran]
    assert tuple(qt.scales.shape) == rows and qt.scales.dtype == torch.float32
    codes = qt.codes.to(torch.int64)
    if sym:
        assert qt.codes.dtype == torch.int8 and qt.zeros is None
        assert codes.abs().max() <= 2 ** (bits - 1) - 1
    else:
        assert qt.codes.dtype == torch.uint8 and tuple(qt.zeros.shape) == rows
        assert codes.min() >= 0 and codes.max() <= levels(scheme)
        z = qt.zeros.double()
        assert torch.equal(z, z.round()) and z.min() >= 0 and z.max() <= levels(scheme)
    s = per_weight(qt.scales, scheme, w.shape)
    z = per_weight(qt.zeros, scheme, w.shape) if not sym else torch.zeros_like(s)
    # the scale is the float32 formula rounded to the storage dtype (relative error <= 2**-11)
    g = w.double().reshape(rows[0], rows[1], -1)
    if sym:
        expected = g.abs().amax(-1) / (2 ** (bits - 1) - 1)
    else:
        expected = (g.amax(-1).clamp(min=0) - g.amin(-1).clamp(max=0)) / levels(scheme)
    tol = 2.0 ** -11 if scale_dtype == "fp16" else 2.0 ** -22
    assert torch.allclose(qt.scales.double(), expected, rtol=tol, atol=0)
    if scale_dtype == "fp16":
        assert torch.equal(qt.scales, qt.scales.half().float())
    # dequantisation is (q - z) * s, one float32 rounding of an exact float64 product
    w_hat = fake_quantize(w, scheme)
    assert torch.equal(w_hat, ((codes.double() - z) * s).float())
    assert torch.equal(dequantize(qt), w_hat) and w_hat.dtype == torch.float32
    # error bound where the code is not clipped; symmetric codes are never clipped
    t = w.double() / s + z
    if sym:
        clipped = t.abs() > 2 ** (bits - 1) - 1 + 0.5
    else:
        clipped = (t < -0.5) | (t > levels(scheme) + 0.5)
    err = (w.double() - w_hat.double()).abs()
    slack = 2.0 ** -23 * w.double().abs()
    assert torch.all((err <= s / 2 + slack) | clipped)
    if sym:
        assert not clipped.any()
    assert torch.all(err <= s + slack)                       # a clipped code is off by at most one step
    assert torch.all(w_hat[w == 0] == 0)                     # 0 is on both grids


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("scale_dtype", ["fp16", "fp32"])
def test_zero_range_groups_are_exact(sym, scale_dtype):
    w = torch.randn(3, 32)
    w[1] = 0.0                  # a whole row: one channel, two groups
    w[2, 16:] = 0.0             # one group of row 2
    for gran in ("channel", "group"):
        scheme = QuantScheme(4, gran, 16 if gran == "group" else None, sym, scale_dtype)
        qt = quantize(w, scheme)
        w_hat = qt.dequantize()
        assert torch.isfinite(w_hat).all() and torch.isfinite(qt.scales).all()
        assert torch.all(w_hat[1] == 0) and torch.all(qt.codes[1] == 0) and torch.all(qt.scales[1] == 1)
        if not sym:
            assert torch.all(qt.zeros[1] == 0)
        if gran == "group":
            assert torch.all(w_hat[2, 16:] == 0) and qt.scales[2, 1] == 1
    allzero = quantize(torch.zeros(2, 8), QuantScheme(4, "tensor", None, sym, scale_dtype))
    assert torch.equal(allzero.dequantize(), torch.zeros(2, 8)) and allzero.scales.item() == 1


@pytest.mark.parametrize("sym", [True, False])
def test_one_huge_outlier_spoils_its_group_only(sym):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(2, 64, generator=gen) * 0.01
    w[0, 5] = 1000.0
    scheme = QuantScheme(4, "group", 32, sym)
    qt = quantize(w, scheme)
    w_hat = qt.dequantize()
    s = qt.scales.double()
    step = 1000.0 / (7 if sym else 15)                     # the outlier sets the step of its group
    assert abs(s[0, 0].item() - step) <= step * 2 ** -10
    assert abs(w_hat[0, 5].item() - 1000.0) <= s[0, 0].item() / 2
    small = torch.ones(32, dtype=torch.bool)
    small[5] = False
    assert torch.all(w_hat[0, :32][small] == 0)            # 0.01-sized weights all round to 0
    assert torch.all((w - w_hat)[0, 32:].abs() <= s[0, 1] / 2 + 1e-9)   # the neighbour group is unharmed
    assert s[0, 1] < 0.05 / (7 if sym else 15) * 2


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("sym", [True, False])
def test_weights_near_the_float32_limits(bits, sym):
    rows = [[3e38, -3e38, 1e38, -2e37], [FLT_MAX, -FLT_MAX, 1.0, 0.0], [FLT_MAX, 0.5 * FLT_MAX, 0.0, 1.0],
            [-FLT_MAX, 0.0, 1.0, 2.0], [-3e38, -3e38, -3e38, -3e38], [3e38, 1e-30, -1e-30, 0.0]]
    w = torch.tensor(rows, dtype=torch.float32).repeat(1, 2)
    scheme = QuantScheme(bits, "group", 4, sym, "fp32")
    qt = quantize(w, scheme)
    w_hat = qt.dequantize()
    assert torch.isfinite(qt.scales).all() and torch.isfinite(w_hat).all()
    s = per_weight(qt.scales, scheme, w.shape)
    err = (w.double() - w_hat.double()).abs()
    assert torch.all(err <= s * (1 + 2.0 ** -20))
    # rows that stay 2 steps inside the limit are within half a step
    inner = (w.double().abs() < FLT_MAX - 2 * s).all(dim=1) & (w.double().abs().amax(1) <= 3e38)
    if sym:
        assert torch.all(err[inner] <= s[inner] / 2 * (1 + 2.0 ** -20))
    with pytest.raises(ValueError, match="scale_dtype='fp32'"):
        quantize(w, QuantScheme(bits, "group", 4, sym, "fp16"))


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("sym", [True, False])
def test_subnormal_weights(bits, sym):
    gen = torch.Generator().manual_seed(bits)
    w = torch.randn(4, 32, generator=gen) * 1e-39            # below the smallest normal float32, 1.18e-38
    w[1, :8] = torch.tensor([1e-44, 0, 0, 0, 0, 0, 0, 0])    # a few ulps: the scale underflows to 0
    w[1, 8:16] = torch.tensor([1e-44, -1e-44, 3e-45, 0, 0, 0, 0, 0])
    w[2, :8] = SMALLEST
    assert w.abs().max() < np.finfo(np.float32).tiny
    scheme = QuantScheme(bits, "group", 8, sym, "fp32")
    qt = quantize(w, scheme)
    w_hat = qt.dequantize()
    assert torch.isfinite(w_hat).all() and (qt.scales > 0).all()
    s = per_weight(qt.scales, scheme, w.shape)
    top = 2 ** (bits - 1) - 1 if sym else levels(scheme)
    err = (w.double() - w_hat.double()).abs()
    assert torch.all(err <= s / 2 + top * SMALLEST)           # the documented subnormal bound
    g = w.double().reshape(4, 4, 8)                           # the scale is the formula, up to its rounding
    span = g.abs().amax(-1) if sym else g.amax(-1).clamp(min=0) - g.amin(-1).clamp(max=0)
    assert torch.all((qt.scales.double() - (span / top).clamp(min=SMALLEST)).abs() <= 2 * SMALLEST)
    assert torch.all(w_hat[2, :8] == SMALLEST) and torch.all(w_hat[w == 0] == 0)


@pytest.mark.parametrize("sym", [True, False])
def test_fp16_scale_out_of_range_is_refused(sym):
    w = torch.randn(2, 16)
    w[1, 3] = 1e6                                 # scale ~1e5 > 65504
    with pytest.raises(ValueError, match=r"float16.*scale_dtype='fp32'"):
        quantize(w, QuantScheme(4, "group", 8, sym))
    assert torch.isfinite(fake_quantize(w, QuantScheme(4, "group", 8, sym, "fp32"))).all()
    tiny = torch.full((1, 8), 1e-9)                 # scale ~1e-10 rounds to 0 in float16
    with pytest.raises(ValueError, match="scale_dtype='fp32'"):
        quantize(tiny, QuantScheme(4, "channel", None, sym))
    out = fake_quantize(tiny, QuantScheme(4, "channel", None, sym, "fp32"))
    assert torch.allclose(out, tiny, rtol=0.1)


# -- storage ------------------------------------------------------------------------------------
def test_reference_bits_per_weight():
    # int4 payload 4 bits + one 16-bit scale per g weights (+ one 16-bit zero point)
    for g, expected in ((128, 4 + 16 / 128), (64, 4 + 16 / 64), (32, 4 + 16 / 32)):
        assert bits_per_weight((4096, 4096), QuantScheme(4, "group", g)) == expected
    assert (4.125, 4.25, 4.5) == (4 + 16 / 128, 4 + 16 / 64, 4 + 16 / 32)
    assert bits_per_weight((4096, 4096), QuantScheme(4, "group", 128, False)) == 4.25
    assert bits_per_weight((8, 128), QuantScheme(8, "channel", None, True, "fp32")) == 8 + 32 / 128
    assert bits_per_weight((8, 128), QuantScheme(4, "tensor", None)) == 4 + 16 / (8 * 128)


def test_reference_fixture_bytes():
    shape = (8, 12)                               # 96 weights
    assert 96 * 4 == 384                          # the float32 fixture
    sb = storage_bytes(shape, QuantScheme(4, "group", 4, True, "fp32"))
    assert (sb.payload, sb.scales, sb.zeros, sb.permutation, sb.numel) == (48, 96, 0, 0, 96)
    assert sb.total == 144 and sb.bits_per_weight == 144 * 8 / 96
    sb = storage_bytes(shape, QuantScheme(4, "group", 4, False, "fp32"), permutation=True)
    assert (sb.payload, sb.scales, sb.zeros, sb.permutation, sb.total) == (48, 96, 96, 48, 288)
    # each row is packed on its own: 5 int4 codes take 3 bytes, 10 int3 codes 4 bytes
    assert storage_bytes((3, 5), QuantScheme(4, "channel", None)).payload == 9
    assert storage_bytes((2, 10), QuantScheme(3, "channel", None)).payload == 8
    assert storage_bytes((2, 10), QuantScheme(3, "channel", None)).scales == 4
    with pytest.raises(ValueError, match="shape"):
        storage_bytes((4,), QuantScheme())


def test_format_table_against_hand_arithmetic():
    table = {f.name: f.bits_per_weight for f in FORMATS}
    expected = {
        "fp32": 32.0, "bf16": 16.0,
        "int4 g128 fp16": 4.125, "int4 g64 fp16": 4.25, "int4 g32 fp16": 4.5,
        "int4 g128 fp16 +zero": 4.25,
        "MXFP4": (32 * 4 + 8) / 32,                  # 32 E2M1 elements + one E8M0 byte
        "GGUF Q4_0": (2 + 16) * 8 / 32,              # fp16 d + 16 bytes of nibbles
        "GGUF Q4_1": (2 + 2 + 16) * 8 / 32,          # fp16 d, fp16 m + nibbles
        "GGUF Q8_0": (2 + 32) * 8 / 32,              # fp16 d + 32 int8
    }
    assert (expected["MXFP4"], expected["GGUF Q4_0"], expected["GGUF Q4_1"], expected["GGUF Q8_0"]) == (
        4.25, 4.5, 5.0, 8.5)
    for name, bpw in expected.items():
        assert table[name] == bpw, name
    assert all(f.source for f in FORMATS)


# -- packing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("order", ["pairs", "halves"])
def test_all_sixteen_codes_round_trip(signed, order):
    codes = torch.arange(-8, 8) if signed else torch.arange(16)
    for dtype in (torch.int8, torch.int32, torch.int64, torch.uint8) if not signed else (
            torch.int8, torch.int16, torch.int64):
        packed = pack_int4(codes.to(dtype), signed, order)
        assert packed.dtype == torch.uint8 and packed.shape == (8,)
        back = unpack_int4(packed, 16, signed, order)
        assert back.dtype == torch.int8 and torch.equal(back.to(torch.int64), codes)
    # all 256 bytes decode to distinct code pairs
    every = torch.arange(256, dtype=torch.uint8)
    pairs = unpack_int4(every.reshape(256, 1), 2, signed, "pairs")
    assert len({tuple(p) for p in pairs.tolist()}) == 256


def test_packed_bytes_by_hand():
    def as_list(codes, signed=True, order="pairs"):
        return pack_int4(torch.tensor(codes), signed, order).tolist()

    assert as_list([1, -1]) == [0xF1]                      # 1 low, -1 = 0b1111 high
    assert as_list([-8, 7]) == [0x78]
    assert as_list([0, -8, 3]) == [0x80, 0x03]             # odd n: the last high nibble is 0
    assert as_list([15, 0, 2], signed=False) == [0x0F, 0x02]
    assert as_list([0, 1, 2, 3], order="halves") == [0x20, 0x31]        # byte j = e[j] | e[j + 2] << 4
    block = [j % 16 for j in range(32)]                                  # a GGML block, h = 16
    assert as_list(block, signed=False, order="halves") == [0x11 * j for j in range(16)]
    assert as_list(block, signed=False) == [(2 * j % 16) | ((2 * j + 1) % 16) << 4 for j in range(16)]
    assert unpack_int4(torch.tensor([0xF1], dtype=torch.uint8), 2).tolist() == [1, -1]
    assert unpack_int4(torch.tensor([0xF1], dtype=torch.uint8), 2, signed=False).tolist() == [1, 15]
    assert unpack_int4(torch.tensor([0x80, 0x03], dtype=torch.uint8), 3).tolist() == [0, -8, 3]


@pytest.mark.parametrize("n", [1, 2, 7, 32, 33, 128])
def test_random_codes_round_trip(n):
    gen = torch.Generator().manual_seed(n)
    for signed in (True, False):
        low = -8 if signed else 0
        codes = torch.randint(low, low + 16, (3, 5, n), generator=gen, dtype=torch.int8)
        packed = pack_int4(codes, signed)
        assert packed.shape == (3, 5, math.ceil(n / 2))
        assert torch.equal(unpack_int4(packed, n, signed), codes)
        if n % 2 == 0:
            halves = pack_int4(codes, signed, "halves")
            assert torch.equal(unpack_int4(halves, n, signed, "halves"), codes)
            nibbles = codes.to(torch.int64) & 0xF           # two's complement nibbles
            assert torch.equal(halves.to(torch.int64) & 0xF, nibbles[..., : n // 2])
            assert torch.equal(halves.to(torch.int64) >> 4, nibbles[..., n // 2:])
            assert torch.equal(packed.to(torch.int64) & 0xF, nibbles[..., 0::2])


def test_packing_refusals():
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_int4(torch.tensor([8]))
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_int4(torch.tensor([-9, 0]))
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack_int4(torch.tensor([-1, 0]), signed=False)
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack_int4(torch.tensor([16]), signed=False)
    with pytest.raises(TypeError, match="integer"):
        pack_int4(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.tensor([1, 2, 3]), order="halves")
    with pytest.raises(ValueError, match="order"):
        pack_int4(torch.tensor([1, 2]), order="nibbles")
    with pytest.raises(ValueError, match="ceil"):
        unpack_int4(torch.zeros(2, 3, dtype=torch.uint8), 8)
    with pytest.raises(TypeError, match="uint8"):
        unpack_int4(torch.zeros(4, dtype=torch.int8), 8)


# -- PackedInt4 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("scale_dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("g", [8, 32, 96])
def test_packed_weight_dequantizes_exactly_like_fake_quantize(sym, scale_dtype, g):
    w = weights(g, (5, 96))
    packed = pack_weight(w, g, sym, scale_dtype)
    assert packed.packed.dtype == torch.uint8 and packed.packed.shape == (5, 48)
    assert packed.scales.dtype == (torch.float16 if scale_dtype == "fp16" else torch.float32)
    assert packed.scales.shape == (5, 96 // g)
    assert (packed.zeros is None) == sym
    expected = fake_quantize(w, QuantScheme(4, "group", g, sym, scale_dtype))
    assert torch.equal(packed.dequantize(), expected)
    channel = PackedInt4.from_quantized(quantize(w, QuantScheme(4, "channel", None, sym, scale_dtype)))
    assert channel.group_size == 96
    assert torch.equal(channel.dequantize(), fake_quantize(w, QuantScheme(4, "channel", None, sym, scale_dtype)))


def test_packed_weight_with_a_column_permutation():
    w = weights(5, (4, 64))
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    scheme = QuantScheme(4, "group", 16, False)
    packed = PackedInt4.from_quantized(quantize(w[:, perm], scheme), perm=perm)
    restored = fake_quantize(w[:, perm], scheme)[:, torch.argsort(perm)]
    assert torch.equal(packed.dequantize(), restored)
    assert not torch.equal(packed.dequantize(), fake_quantize(w, scheme))   # groups follow stored columns
    with pytest.raises(ValueError, match="permutation"):
        PackedInt4.from_quantized(quantize(w, scheme), perm=torch.zeros(64, dtype=torch.int64))


def test_packed_nbytes_by_hand():
    w = torch.randn(16, 64)
    # 16 rows * 32 bytes of codes + 16 * 2 fp16 scales (g = 32)
    assert pack_weight(w, 32).nbytes == 16 * 32 + 16 * 2 * 2 == 576
    assert pack_weight(w, 32, symmetric=False).nbytes == 576 + 16 * 2 * 2 == 640
    assert pack_weight(w, 32, scale_dtype="fp32").nbytes == 512 + 16 * 2 * 4
    scheme = QuantScheme(4, "group", 32)
    identity = PackedInt4.from_quantized(quantize(w, scheme), perm=torch.arange(64))
    assert identity.nbytes == 576                           # an identity permutation is not stored
    perm = torch.arange(64).flip(0)
    shuffled = PackedInt4.from_quantized(quantize(w[:, perm], scheme), perm=perm)
    assert shuffled.nbytes == 576 + 64 * 4                  # int32 index per column
    assert shuffled.nbytes == storage_bytes(w.shape, scheme, permutation=True).total
    assert pack_weight(torch.randn(3, 10), 10).nbytes == 3 * 5 + 3 * 2


def test_packed_int4_refusals():
    w = torch.randn(4, 32)
    with pytest.raises(ValueError, match="4-bit"):
        PackedInt4.from_quantized(quantize(w, QuantScheme(8, "group", 16)))
    with pytest.raises(ValueError, match="channel"):
        PackedInt4.from_quantized(quantize(w, QuantScheme(4, "tensor", None)))
    with pytest.raises(ValueError, match="48.*32|32.*48"):
        pack_weight(w, 48)
    good = pack_weight(w, 16)
    with pytest.raises(ValueError, match="scales"):
        PackedInt4(good.packed, good.scales[:, :1], None, 16, 32)
    with pytest.raises(ValueError, match="zeros"):
        PackedInt4(good.packed, good.scales, torch.full_like(good.scales, 16.0), 16, 32)
    with pytest.raises(ValueError, match="divide"):
        PackedInt4(good.packed, good.scales, None, 12, 32)
    with pytest.raises(ValueError, match="QuantizedTensor.codes"):
        QuantizedTensor(torch.zeros(2, 4, dtype=torch.uint8), torch.ones(2, 1), None, QuantScheme(4, "channel", None))
