"""RoPE explorer: how each 2-D pair of a head vector turns with position (course Lab 2).

Pair i turns by the angle position * omega_i with omega_i = base^(-2i/d) (d = 2 * pairs):
the first pair spins fastest, the last barely moves, so nearby positions differ in
the fast pairs and distant ones in the slow pairs. ``rope_explorer_state`` computes
what the widget draws (testable without a browser), ``rope_explorer_figure`` the picture, and
``rope_explorer`` wires them to ipywidgets sliders.

A scaling control stretches the context: position interpolation divides every frequency by the
factor, NTK-aware scaling raises the base, YaRN splits the pairs into three bands by how many
turns they make over the pre-training context (``course_lib.models.rope``);
``rope_frequency_figure`` plots the frequencies before and after.
"""
from __future__ import annotations

import math

import torch

from ..models.rope import CONTEXT, SCALINGS, rope_frequencies, rotate_pairs, scaled_frequencies, yarn_attention_factor

def rope_explorer_state(position: int, n_pairs: int, base: float = 10000.0, seed: int = 0,
                        scaling: str = "none", factor: float = 1.0, context: int = CONTEXT) -> dict:
    """What the RoPE widget shows for one setting.

    Args:
        position: absolute position (int >= 0).
        n_pairs: number of 2-D pairs, head_dim = 2 * n_pairs (int >= 1).
        base: RoPE base theta (> 1).
        seed: seed of the example vector.
        scaling, factor, context: the frequency scaling, as ``scaled_frequencies``.

    Returns:
        dict with ``omega_unscaled`` (n_pairs,) rad/position (base^(-2i/d)), ``omega`` (n_pairs,) the
        frequencies after scaling (float64 copies), ``angles`` (n_pairs,) rad (position * omega, not
        wrapped), ``turns`` (n_pairs,) full turns, ``original`` and ``rotated`` (n_pairs, 2) pair
        coordinates (x_i, x_{i+d/2}) before and after rotation, ``norm_before`` / ``norm_after`` of
        the whole vector (equal: a rotation preserves length), ``attention_factor`` (YaRN's
        temperature on cos and sin, not applied to the drawn vectors; 1 otherwise) and the settings
        ``scaling``, ``factor``, ``context``.

    Raises:
        ValueError: position < 0, n_pairs < 1, base <= 1, or a bad scaling as ``scaled_frequencies``.
    """
    if not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be an int >= 0, got {position!r}")
    if not isinstance(n_pairs, int) or n_pairs < 1:
        raise ValueError(f"n_pairs must be an int >= 1, got {n_pairs!r}")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base!r}")
    d = 2 * n_pairs
    unscaled = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    omega = unscaled if scaling == "none" else scaled_frequencies(n_pairs, base, scaling, factor,
                                                                   context).to(torch.float64)
    x = torch.randn(1, 1, 1, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    angles = position * omega
    rotated = rotate_pairs(x, angles.cos(), angles.sin())[0, 0, 0]
    pairs = lambda v: torch.stack([v[:n_pairs], v[n_pairs:]], dim=-1)  # noqa: E731
    return {"omega_unscaled": unscaled, "omega": omega, "angles": angles, "turns": angles / (2 * math.pi),
            "original": pairs(x[0, 0, 0]), "rotated": pairs(rotated),
            "norm_before": float(x.norm()), "norm_after": float(rotated.norm()),
            "attention_factor": yarn_attention_factor(factor) if scaling == "yarn" else 1.0,
            "scaling": scaling, "factor": float(factor), "context": context}


#: Resolution of the widget's picture (dots per inch); it is shown at this size, one image pixel
#: per CSS pixel, never stretched to the notebook's width.
DPI: int = 100
#: Smallest figure width (inches): wide enough for the two title lines when there are few pairs.
MIN_WIDTH_IN: float = 4.0


def rope_explorer_figure(position: int, n_pairs: int, base: float = 10000.0, seed: int = 0,
                         scaling: str = "none", factor: float = 1.0, context: int = CONTEXT):
    """The picture the RoPE widget shows: one small plot per pair, the example vector's pair
    before (grey) and after (blue) rotation, titled with its angle in turns.

    Args:
        position, n_pairs, base, seed, scaling, factor, context: as ``rope_explorer_state``.

    Returns:
        ``(figure, state)``: a ``matplotlib.figure.Figure`` drawn off-screen (pyplot's backend is
        left alone), at most 8 plots per row and at least ``MIN_WIDTH_IN`` inches wide, and the
        ``rope_explorer_state`` dict it draws.

    Raises:
        ValueError: as ``rope_explorer_state``.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle

    state = rope_explorer_state(position, n_pairs, base, seed, scaling, factor, context)
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
    stretch = "" if scaling == "none" else f", {scaling} x{factor:g}"
    fig.suptitle(f"position {position}, base {base:.3g}{stretch}\n|x| {state['norm_before']:.4f} "
                 f"-> {state['norm_after']:.4f}", fontsize=9)
    fig.tight_layout()
    return fig, state


def rope_frequency_figure(state: dict):
    """The frequencies of a ``rope_explorer_state``, before (grey) and after (blue) its scaling, on a
    log axis against the pair index, with the frequency of one turn over the pre-training context
    (2 pi / context, dotted) and, when a scaling is chosen, over the stretched one (2 pi / (factor * context),
    dashed): a pair
    above the dotted line turns many times within the context (short range), one below it less than
    once. Returns a ``matplotlib.figure.Figure`` drawn off-screen, 4.8 x 2.6 inches."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.8, 2.6))
    ax = fig.subplots()
    i = range(len(state["omega"]))
    ax.semilogy(i, state["omega_unscaled"].tolist(), "o", color="0.6", label="before")
    ax.semilogy(i, state["omega"].tolist(), "x", color="C0", label=f"after ({state['scaling']})")
    one_turn = 2 * math.pi / state["context"]
    ax.axhline(one_turn, color="0.3", ls=":", lw=0.8, label=f"1 turn in {state['context']}")
    if state["scaling"] != "none" and state["factor"] > 1:
        ax.axhline(one_turn / state["factor"], color="0.3", ls="--", lw=0.8,
                   label=f"1 turn in {state['factor'] * state['context']:g}")
    ax.set_xlabel("pair i", fontsize=8)
    ax.set_ylabel("omega (rad/position)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    return fig


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


def rope_explorer(position: int = 5, n_pairs: int = 8, base: float = 10000.0, scaling: str = "none",
                  factor: float = 4.0):
    """An ipywidgets panel: sliders for position, pairs and base, the picture of
    ``rope_explorer_figure`` for their values, then a scaling menu (``SCALINGS``) with a factor
    slider and the frequency plot of ``rope_frequency_figure`` (children: the slider row, the
    picture, the scaling row, the frequency plot). Returns the widget; its ``update()`` attribute
    redraws for the current values and returns the state (tests). The factor is used only when a
    scaling is chosen.

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
    scaling_w = widgets.Dropdown(options=SCALINGS, value=scaling, description="scaling")
    factor_w = widgets.FloatSlider(value=factor, min=1, max=16, step=0.5, description="factor")
    image, frequencies = picture_widget(), picture_widget()

    def update(*_):
        fig, state = rope_explorer_figure(int(pos.value), int(pairs.value), float(base_w.value),
                                          scaling=scaling_w.value, factor=float(factor_w.value))
        show_figure(image, fig)
        show_figure(frequencies, rope_frequency_figure(state))
        return state

    for w in (pos, pairs, base_w, scaling_w, factor_w):
        w.observe(update, names="value")
    panel = widgets.VBox([widgets.HBox([pos, pairs, base_w]), image, widgets.HBox([scaling_w, factor_w]), frequencies],
                         layout=widgets.Layout(**PANEL_LAYOUT))
    panel.update = update
    update()
    return panel
