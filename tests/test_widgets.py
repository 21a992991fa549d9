"""The RoPE explorer computes what it draws without a browser (course Lab 2 widget)."""
import math
import struct

import matplotlib
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from course_lib.widgets import rope_explorer, rope_explorer_figure, rope_explorer_state

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
