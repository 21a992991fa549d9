"""RoPE explorer: how each 2-D pair of a head vector turns with position (course Lab 2).

Pair i turns by the angle position * omega_i with omega_i = base^(-2i/d) (d = 2 * pairs):
the first pair spins fastest, the last barely moves, so nearby positions differ in
the fast pairs and distant ones in the slow pairs. ``rope_explorer_state`` computes
what the widget draws (testable without a browser), ``rope_explorer_figure`` the picture, and
``rope_explorer`` wires them to ipywidgets sliders.
"""
from __future__ import annotations

import math

import torch

from ..models.rope import apply_rope


def rope_explorer_state(position: int, n_pairs: int, base: float = 10000.0, seed: int = 0) -> dict:
    """What the RoPE widget shows for one setting.

    Args:
        position: absolute position (int >= 0).
        n_pairs: number of 2-D pairs, head_dim = 2 * n_pairs (int >= 1).
        base: RoPE base theta (> 1).
        seed: seed of the example vector.

    Returns:
        dict with ``omega`` (n_pairs,) rad/position, ``angles`` (n_pairs,) rad (position * omega,
        not wrapped), ``turns`` (n_pairs,) full turns, ``original`` and ``rotated`` (n_pairs, 2)
        pair coordinates (x_i, x_{i+d/2}) before and after rotation, and ``norm_before`` /
        ``norm_after`` of the whole vector (equal: a rotation preserves length).

    Raises:
        ValueError: position < 0, n_pairs < 1 or base <= 1.
    """
    if not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be an int >= 0, got {position!r}")
    if not isinstance(n_pairs, int) or n_pairs < 1:
        raise ValueError(f"n_pairs must be an int >= 1, got {n_pairs!r}")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base!r}")
    d = 2 * n_pairs
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    x = torch.randn(1, 1, 1, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rotated = apply_rope(x, torch.tensor([position]), base)[0, 0, 0]
    pairs = lambda v: torch.stack([v[:n_pairs], v[n_pairs:]], dim=-1)  # noqa: E731
    angles = position * omega
    return {"omega": omega, "angles": angles, "turns": angles / (2 * math.pi),
            "original": pairs(x[0, 0, 0]), "rotated": pairs(rotated),
            "norm_before": float(x.norm()), "norm_after": float(rotated.norm())}


#: Resolution of the widget's picture (dots per inch); it is shown at this size, one image pixel
#: per CSS pixel, never stretched to the notebook's width.
DPI: int = 100
#: Smallest figure width (inches): wide enough for the two title lines when there are few pairs.
MIN_WIDTH_IN: float = 4.0


def rope_explorer_figure(position: int, n_pairs: int, base: float = 10000.0, seed: int = 0):
    """The picture the RoPE widget shows: one small plot per pair, the example vector's pair
    before (grey) and after (blue) rotation, titled with its angle in turns.

    Args:
        position, n_pairs, base, seed: as ``rope_explorer_state``.

    Returns:
        ``(figure, state)``: a ``matplotlib.figure.Figure`` drawn off-screen (pyplot's backend is
        left alone), at most 8 plots per row and at least ``MIN_WIDTH_IN`` inches wide, and the
        ``rope_explorer_state`` dict it draws.

    Raises:
        ValueError: as ``rope_explorer_state``.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle

    state = rope_explorer_state(position, n_pairs, base, seed)
    cols = min(n_pairs, 8)
    rows = math.ceil(n_pairs / cols)
    fig = Figure(figsize=(max(1.4 * cols, MIN_WIDTH_IN), 1.7 * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if i >= n_pairs:
            continue
        o, r = state["original"][i], state["rotated"][i]
        radius = float(o.norm())
        lim = 1.1 * radius + 1e-9
        ax.add_patch(Circle((0, 0), radius, fill=False, lw=0.5, color="0.8"))
        ax.arrow(0, 0, float(o[0]), float(o[1]), color="0.6", width=0.01 * lim)
        ax.arrow(0, 0, float(r[0]), float(r[1]), color="C0", width=0.01 * lim)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.set_title(f"pair {i}\n{float(state['turns'][i]):.3g} turns", fontsize=8)
    fig.suptitle(f"position {position}, base {base:.3g}\n|x| {state['norm_before']:.4f} "
                 f"-> {state['norm_after']:.4f}", fontsize=9)
    fig.tight_layout()
    return fig, state


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels of a PNG image, read from its header (the IHDR chunk).
    Raises: ValueError if ``png`` is not a PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG image")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def picture_widget():
    """An ``ipywidgets.Image`` for a PNG shown at its own size. ipywidgets' stylesheet caps an image at
    its container's width (``max-width: 100%``), which squeezes a wide picture in a narrow notebook;
    this one is never capped, and the panels around it scroll instead (``PANEL_LAYOUT``)."""
    import ipywidgets as widgets

    return widgets.Image(format="png", layout=widgets.Layout(height="auto", max_width="none"))


#: Layout of an explorer panel: children at their own width, a horizontal scroll bar when the
#: notebook is narrower than the picture.
PANEL_LAYOUT = {"align_items": "flex-start", "overflow": "auto"}


def show_figure(image, fig) -> None:
    """Put FIG into IMAGE (``picture_widget``) as a PNG at ``DPI``, its layout width the PNG's width in
    pixels, set before the picture arrives so it is never shown stretched."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    png = buffer.getvalue()
    image.layout.width = f"{png_size(png)[0]}px"
    image.value = png


def rope_explorer(position: int = 5, n_pairs: int = 8, base: float = 10000.0):
    """An ipywidgets panel: sliders for position, pairs and base, and the picture of
    ``rope_explorer_figure`` for their values. Returns the widget; its ``update()`` attribute
    redraws for the current slider values and returns the state (tests).

    The picture is a PNG in an ``ipywidgets.Image`` whose layout width is the PNG's own width in
    pixels (height follows the aspect ratio), so it is shown at its natural resolution, neither
    stretched nor squeezed to the notebook's width (the panel scrolls in a narrow one). Updating it is one widget-state message, with no output
    capture, so the panel behaves the same in JupyterLab and in headless runs (nbconvert, nbval,
    nbgrader). Like every widget it lives in the kernel: a notebook reopened later shows it again
    only when its cell is rerun (or when JupyterLab saved the widget state with the notebook)."""
    import ipywidgets as widgets

    pos = widgets.IntSlider(value=position, min=0, max=4096, description="position")
    pairs = widgets.IntSlider(value=n_pairs, min=1, max=16, description="pairs")
    base_w = widgets.FloatLogSlider(value=base, base=10, min=1, max=6, description="base")
    image = picture_widget()

    def update(*_):
        fig, state = rope_explorer_figure(int(pos.value), int(pairs.value), float(base_w.value))
        show_figure(image, fig)
        return state

    for w in (pos, pairs, base_w):
        w.observe(update, names="value")
    panel = widgets.VBox([widgets.HBox([pos, pairs, base_w]), image], layout=widgets.Layout(**PANEL_LAYOUT))
    panel.update = update
    update()
    return panel
