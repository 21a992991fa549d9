"""The explorers compute what they draw without a browser (Lab 2 RoPE widget, Lab 4 quantisation widget)."""
import math
import struct

import matplotlib
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection

from course_lib.widgets import (quant_explorer, quant_explorer_figure, quant_numbers, rope_explorer,
                                rope_explorer_figure, rope_explorer_state, rope_frequency_figure, scaled_frequencies)

matplotlib.use("Agg")


def test_state_angles_follow_the_formula():
    s = rope_explorer_state(position=5, n_pairs=4, base=10000.0)
    expected = torch.tensor([5 * 10000.0 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
    assert torch.allclose(s["angles"], expected)
    assert torch.allclose(s["turns"], expected / (2 * math.pi))
    assert s["rotated"].shape == (4, 2)
    assert s["norm_after"] == pytest.approx(s["norm_before"], rel=1e-6)


def test_position_zero_is_identity_and_pairs_rotate_by_their_angle():
    s0 = rope_explorer_state(position=0, n_pairs=3)
    assert torch.allclose(s0["rotated"], s0["original"], atol=1e-6)
    s = rope_explorer_state(position=7, n_pairs=3, base=100.0)
    for i in range(3):
        o, r, a = s["original"][i], s["rotated"][i], float(s["angles"][i])
        turned = torch.tensor([o[0] * math.cos(a) - o[1] * math.sin(a), o[1] * math.cos(a) + o[0] * math.sin(a)],
                              dtype=torch.float64)
        assert torch.allclose(r, turned, atol=1e-5)


@pytest.mark.parametrize("bad", [dict(position=-1, n_pairs=2), dict(position=1, n_pairs=0),
                                 dict(position=1, n_pairs=2, base=1.0)])
def test_state_refuses_bad_settings(bad):
    with pytest.raises(ValueError):
        rope_explorer_state(**bad)


def test_widget_update_follows_the_sliders():
    panel = rope_explorer(position=3, n_pairs=2)
    position, pairs, base = panel.children[0].children
    position.value, pairs.value = 40, 5            # observers redraw on each change
    state = panel.update()
    assert state["angles"].shape == (5,) and float(state["angles"][0]) == pytest.approx(40.0)
    base.value = 100.0
    assert float(panel.update()["angles"][1]) == pytest.approx(40 * 100.0 ** (-2 / 10))


def test_widget_draws_a_png_for_each_setting():
    panel = rope_explorer(position=3, n_pairs=2)
    first = panel.children[1].value
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    panel.children[0].children[0].value = 300
    assert panel.children[1].value != first


def _png_width_height(png: bytes):
    """The PNG's own size, read from its IHDR chunk (bytes 16-24 after the signature)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


@pytest.mark.parametrize("n_pairs", [1, 4, 8, 16])
def test_widget_shows_the_picture_at_its_natural_size(n_pairs):
    """One image pixel per CSS pixel: the layout width is the PNG's width (the height follows its
    aspect ratio), and the panel does not stretch its children to the notebook's width."""
    panel = rope_explorer(position=3, n_pairs=n_pairs)
    image = panel.children[1]
    width, height = _png_width_height(image.value)
    assert image.layout.width == f"{width}px"
    assert image.layout.height in (None, "auto")
    assert panel.layout.align_items == "flex-start"
    panel.children[0].children[1].value = 1 if n_pairs > 1 else 9     # a new picture gets its own width
    width, _ = _png_width_height(image.value)
    assert image.layout.width == f"{width}px"


@pytest.mark.parametrize("n_pairs", [1, 2, 3, 8, 9, 16])
@pytest.mark.parametrize("position, base", [(0, 10.0), (4096, 1e6)])
def test_every_title_fits_inside_the_picture(n_pairs, position, base):
    fig, _ = rope_explorer_figure(position, n_pairs, base)
    renderer = FigureCanvasAgg(fig).get_renderer()
    box = fig.bbox
    for text in list(fig.texts) + [ax.title for ax in fig.axes if ax.title.get_text()]:   # suptitle, pair titles
        extent = text.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, (
            f"{text.get_text()!r} is cut: {extent} outside the figure {box}")


@pytest.mark.parametrize("factor", [2.0, 8.0])
def test_scalings_keep_or_stretch_the_pairs_they_should(factor):
    """8 pairs, base 1e4, pre-training context 2,048 (pair i turns 326, 103, 32.6, 10.3, 3.3, 1.0, 0.33,
    0.10 times over it). Position interpolation slows every pair by the factor; NTK keeps pair 0 and
    slows the last by the factor; YaRN keeps the pairs with more than 32 turns (0 to 2) and slows the
    two with under one turn (6, 7) by the factor."""
    plain = scaled_frequencies(8, 10000.0)
    expected = torch.tensor([10000.0 ** (-i / 8) for i in range(8)])
    torch.testing.assert_close(plain, expected, rtol=1e-6, atol=0)
    ratio = {kind: plain / scaled_frequencies(8, 10000.0, kind, factor) for kind in ("linear", "ntk", "yarn")}
    torch.testing.assert_close(ratio["linear"], torch.full((8,), factor), rtol=1e-6, atol=0)
    assert float(ratio["ntk"][0]) == 1.0 and float(ratio["ntk"][-1]) == pytest.approx(factor, rel=1e-5)
    assert ratio["ntk"].diff().gt(0).all()                        # slower and slower towards the last pair
    torch.testing.assert_close(ratio["yarn"][:3], torch.ones(3), rtol=0, atol=0)
    torch.testing.assert_close(ratio["yarn"][6:], torch.full((2,), factor), rtol=1e-6, atol=0)
    assert ((ratio["yarn"][3:6] > 1) & (ratio["yarn"][3:6] < factor)).all()


def test_state_rotates_by_the_scaled_frequencies():
    s = rope_explorer_state(position=1000, n_pairs=4, base=100.0, scaling="linear", factor=4.0)
    torch.testing.assert_close(s["omega"], s["omega_unscaled"] / 4, rtol=1e-6, atol=0)
    torch.testing.assert_close(s["angles"], 1000 * s["omega"])
    assert s["norm_after"] == pytest.approx(s["norm_before"], rel=1e-6) and s["attention_factor"] == 1.0
    y = rope_explorer_state(position=10, n_pairs=4, scaling="yarn", factor=math.e)
    assert y["attention_factor"] == pytest.approx(1.1)             # 0.1 ln(e) + 1
    with pytest.raises(ValueError, match="scaling must be one of"):
        rope_explorer_state(position=1, n_pairs=2, scaling="dynamic")
    with pytest.raises(ValueError, match="factor must be >= 1"):
        rope_explorer_state(position=1, n_pairs=2, scaling="ntk", factor=0.5)


def test_widget_scaling_controls_redraw_the_frequency_plot():
    panel = rope_explorer(position=300, n_pairs=8)
    position, pairs, base = panel.children[0].children
    scaling, factor = panel.children[2].children
    assert (scaling.value, factor.value) == ("none", 4.0)
    before, plot = panel.children[1].value, panel.children[3].value
    scaling.value = "yarn"
    state = panel.update()
    assert state["scaling"] == "yarn" and panel.children[3].value != plot and panel.children[1].value != before
    factor.value = 8.0
    assert panel.update()["factor"] == 8.0
    width, _ = _png_width_height(panel.children[3].value)
    assert panel.children[3].layout.width == f"{width}px"


@pytest.mark.parametrize("n_pairs", [1, 16])
def test_a_scaled_title_fits_inside_the_picture(n_pairs):
    fig, _ = rope_explorer_figure(4096, n_pairs, 1e6, scaling="yarn", factor=16.0)
    renderer = FigureCanvasAgg(fig).get_renderer()
    extent = fig.texts[0].get_window_extent(renderer)
    assert fig.bbox.x0 <= extent.x0 and extent.x1 <= fig.bbox.x1, fig.texts[0].get_text()


@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn"])
def test_frequency_plot_draws_both_series(scaling):
    fig = rope_frequency_figure(rope_explorer_state(5, 8, scaling=scaling, factor=4.0))
    ax = fig.axes[0]
    markers = [line for line in ax.get_lines() if line.get_marker() in ("o", "x")]
    assert len(markers) == 2 and all(len(line.get_xdata()) == 8 for line in markers)
    assert len(ax.get_lines()) == (3 if scaling == "none" else 4)   # plus one or two reference lines


# -- quantisation explorer (Lab 4) ---------------------------------------------------------
@pytest.mark.parametrize("group_size, symmetric, bits_per_weight", [
    (128, True, 4 + 16 / 128), (64, True, 4 + 16 / 64), (32, True, 4 + 16 / 32),
    (128, False, 4 + 32 / 128)])                   # docs/quantization.md#bits-per-weight
def test_quant_bits_per_weight_are_the_reference_figures(group_size, symmetric, bits_per_weight):
    numbers = quant_numbers(bits=4, group_size=group_size, symmetric=symmetric, scale_dtype="fp16")
    assert numbers["storage"].bits_per_weight == bits_per_weight
    chosen = numbers["table"].iloc[0]
    assert chosen["bits per weight"] == bits_per_weight and "(chosen)" in chosen["format"]


def test_quant_bytes_of_the_down_proj_shape():
    numbers = quant_numbers(bits=4, group_size=64, symmetric=True, scale_dtype="fp16")
    assert numbers["shape"] == (576, 1536) and numbers["synthetic"]
    storage = numbers["storage"]
    assert storage.payload == 576 * 768                    # two 4-bit codes per byte
    assert storage.scales == 576 * 24 * 2                  # 1536 / 64 = 24 fp16 scales per row
    assert storage.zeros == 0
    assert numbers["table"].iloc[0]["bytes"] == 576 * 768 + 576 * 24 * 2
    by_name = numbers["table"].set_index("format")
    assert by_name.loc["fp32", "bytes"] == 576 * 1536 * 4
    assert by_name.loc["GGUF Q4_0", "bytes"] == 576 * 1536 // 32 * 18     # 16 B of nibbles + fp16 d per 32
    assert by_name.loc["MXFP4", "bits per weight"] == 4.25
    asym = quant_numbers(bits=8, group_size="channel", symmetric=False, scale_dtype="fp32")["storage"]
    assert (asym.payload, asym.scales, asym.zeros) == (576 * 1536, 576 * 4, 576 * 4)


def test_quant_error_of_a_hand_quantised_row():
    """2-bit symmetric per tensor on [1, 0.5, 0.25, -1]: s = 1/1, grid {-1, 0, 1}; 0.5 rounds
    half to even (to 0), 0.25 to 0, so the errors are 0, 0.5, 0.25, 0."""
    w = torch.tensor([[1.0, 0.5, 0.25, -1.0]])
    numbers = quant_numbers(bits=2, group_size="tensor", weight=w)
    assert not numbers["synthetic"] and numbers["shape"] == (1, 4)
    assert numbers["max_error"] == pytest.approx(0.5)
    assert numbers["rmse"] == pytest.approx(math.sqrt((0.5 ** 2 + 0.25 ** 2) / 4))
    assert numbers["grid"].tolist() == [-1.0, 0.0, 1.0]
    assert numbers["values"].tolist() == [1.0, 0.5, 0.25, -1.0]
    assert numbers["values_hat"].tolist() == [1.0, 0.0, 0.0, -1.0]
    assert w.tolist() == [[1.0, 0.5, 0.25, -1.0]]              # the tensor passed in is left alone


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group_size", [64, "channel"])
def test_quant_error_shrinks_as_bits_grow(symmetric, group_size):
    rmse = [quant_numbers(bits=b, group_size=group_size, symmetric=symmetric, seed=3)["rmse"] for b in range(2, 9)]
    assert all(a > b for a, b in zip(rmse, rmse[1:])), rmse
    assert rmse[-1] < rmse[0] / 30                      # six more bits: a grid 2^6 times finer, roughly


def test_quant_outlier_stretches_a_per_tensor_grid():
    """One large weight sets the per-tensor scale, so every other weight rounds more coarsely;
    groups of 64 confine it to the few groups that hold an outlier."""
    plain = quant_numbers(bits=4, group_size="tensor", outlier=0.0)
    spiky = quant_numbers(bits=4, group_size="tensor", outlier=20.0)
    assert spiky["rmse"] > 3 * plain["rmse"]
    assert spiky["step"] > 10 * plain["step"]
    grouped = [quant_numbers(bits=4, group_size=64, outlier=o)["rmse"] for o in (0.0, 20.0)]
    assert grouped[1] < 1.2 * grouped[0]
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    big = quant_numbers(group_size="tensor", outlier=9.0, weight=w)
    row, col = int(big["outlier_rows"][0]), int(big["outlier_cols"][0])
    assert row == 0 and col == int(w[0].abs().argmax())
    assert big["values"][col] == pytest.approx(10 * float(w[0, col]))
    assert len(set(big["outlier_rows"].tolist())) == 8                 # eight distinct rows


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [32, "channel", "tensor"])
def test_quant_grid_has_one_point_per_code(bits, group_size):
    sym = quant_numbers(bits=bits, group_size=group_size, symmetric=True, outlier=2.0)
    grid, step = sym["grid"].double(), sym["step"]
    assert len(grid) == 2 ** bits - 1                                  # codes -qmax..qmax
    assert torch.allclose(grid, -grid.flip(0))                          # symmetric about 0
    assert torch.allclose(grid.diff(), torch.full((len(grid) - 1,), step, dtype=torch.float64))
    if group_size != "tensor":                                         # the shown group sets its own scale
        assert float(grid[-1]) == pytest.approx(float(sym["values"].abs().max()), rel=2 ** -10)
    asym = quant_numbers(bits=bits, group_size=group_size, symmetric=False, outlier=2.0)
    grid = asym["grid"].double()
    assert len(grid) == 2 ** bits                                      # codes 0..2^bits - 1
    assert 0.0 in grid.tolist()                                        # the zero point is exact
    assert torch.allclose(grid.diff(), torch.full((len(grid) - 1,), asym["step"], dtype=torch.float64))
    for numbers, points in ((sym, 2 ** bits - 1), (asym, 2 ** bits)):
        ax = quant_explorer_figure(numbers).axes[0]
        lines = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(lines) == 1 and len(lines[0].get_segments()) == points


@pytest.mark.parametrize("bad, message", [
    (dict(bits=1), "bits"), (dict(bits=9), "bits"), (dict(bits=4.0), "bits"),
    (dict(group_size=0), "group_size"), (dict(group_size=100), "100"), (dict(group_size="row"), "group_size"),
    (dict(group_size=None), "group_size"), (dict(symmetric="yes"), "symmetric"),
    (dict(outlier=-1.0), "outlier"), (dict(outlier=float("nan")), "outlier"),
    (dict(scale_dtype="bf16"), "scale_dtype"), (dict(seed=-1), "seed"),
    (dict(weight=torch.ones(8)), "weight"), (dict(weight=torch.ones(2, 4, dtype=torch.int64)), "weight"),
    (dict(weight=torch.ones(0, 64)), "weight"),
    (dict(weight=torch.tensor([[1.0, float("nan")]]), group_size="tensor"), r"w\[0, 1\]"),
    (dict(weight=torch.full((2, 64), 1e6)), "fp32")])           # the fp16 scale 1e6/7 overflows
def test_quant_numbers_refuses_bad_settings(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        quant_numbers(**bad)


def test_quant_widget_update_follows_the_controls():
    panel = quant_explorer()
    controls = panel.controls
    image = panel.children[-1]
    first = image.value
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.layout.width == f"{_png_width_height(first)[0]}px"
    assert "synthetic" in panel.children[2].value and "576 x 1536" in panel.children[2].value
    controls["outlier"].value = 20.0                    # the observer redraws without update()
    assert image.value != first
    controls["group_size"].value = "tensor"
    controls["bits"].value = 3
    numbers = panel.update()
    assert numbers["scheme"].granularity == "tensor" and numbers["scheme"].bits == 3
    assert len(numbers["grid"]) == 7 and numbers["outlier"] == 20.0
    controls["symmetric"].value = False
    controls["scale_dtype"].value = "fp32"
    numbers = panel.update()
    assert not numbers["scheme"].symmetric and numbers["scheme"].scale_dtype == "fp32"
    assert len(numbers["grid"]) == 8
    assert f"{numbers['storage'].total:,}" in panel.children[3].value


def test_quant_widget_with_a_real_weight():
    w = torch.randn(8, 96, generator=torch.Generator().manual_seed(0)) * 1e6     # fp16 scales overflow
    panel = quant_explorer(group_size=32, scale_dtype="fp32", weight=w)
    options = [value for _, value in panel.controls["group_size"].options]
    assert options == [16, 32, "channel", "tensor"]                  # the sizes that divide 96
    assert "passed in" in panel.children[2].value and "8 x 96" in panel.children[2].value
    picture = panel.children[-1].value
    panel.controls["scale_dtype"].value = "fp16"
    assert panel.update() is None
    assert "Refused" in panel.children[3].value and "fp32" in panel.children[3].value
    assert panel.children[-1].value == picture                      # the last picture stays
    with pytest.raises(ValueError, match="group_size"):
        quant_explorer(group_size=64, weight=w)                      # 64 does not divide 96
