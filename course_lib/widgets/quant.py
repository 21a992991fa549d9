"""Quantisation explorer: what bit width, group size, zero point and one outlier do to a weight
matrix (course Lab 4).

A b-bit scheme rounds every weight of a group to one of a few evenly spaced values, the *grid*:
``s * q`` for the codes ``q = -qmax .. qmax`` (symmetric absmax, ``2^b - 1`` points) or
``s * (q - z)`` for ``q = 0 .. 2^b - 1`` (asymmetric min-max with a zero point, ``2^b`` points).
One large weight stretches its group's grid, so every other weight of the group rounds more
coarsely; a smaller group confines the damage and costs more scales per weight.

``quant_numbers`` computes what the widget shows (testable without a browser),
``quant_explorer_figure`` the histogram, and ``quant_explorer`` wires them to ipywidgets
controls. Every figure comes from ``course_lib.quant``: bytes from ``storage_bytes`` and
``FORMATS``, errors and the grid from ``quantize`` and ``dequantize`` (``fake_quantize``); the
formulas are in docs/quantization.md (#fake-quantisation, #bits-per-weight).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from .. import validation as check
from ..models.config import smollm2_135m_config
from ..quant.formats import FORMATS, QuantizedTensor, QuantScheme, fake_quantize, qmax, quantize, storage_bytes
from .rope import PANEL_LAYOUT, picture_widget, show_figure

_SMOLLM2 = smollm2_135m_config()
#: Shape (out_features, in_features) of the synthetic weight matrix: SmolLM2-135M's MLP
#: ``down_proj`` (d_model x d_ff = 576 x 1536).
SHAPE: tuple[int, int] = (_SMOLLM2.d_model, _SMOLLM2.d_ff)
#: Standard deviation of the synthetic Gaussian weights. The errors scale with it, so only the
#: relative RMSE and the shape of the histogram carry meaning.
WEIGHT_STD: float = 0.02
#: Rows that receive an outlier (row 0, the row shown, and seeded others).
N_OUTLIER_ROWS: int = 8
#: Group sizes the widget offers, then the two coarser granularities.
GROUP_CHOICES: tuple = (16, 32, 64, 128, 256, "channel", "tensor")


def _scheme(bits, group_size, symmetric, scale_dtype) -> QuantScheme:
    """The QuantScheme for the widget's controls; group_size is an int, "channel" or "tensor"."""
    if isinstance(group_size, str):
        check.one_of("group_size", group_size, ("channel", "tensor"),
                     note="or an int >= 1 for groups along the input dimension")
        return QuantScheme(bits=bits, granularity=group_size, group_size=None, symmetric=symmetric,
                           scale_dtype=scale_dtype)
    group_size = check.positive_integer("group_size", group_size,
                                        note='or "channel" / "tensor" for one scale per row / per matrix')
    return QuantScheme(bits=bits, granularity="group", group_size=group_size, symmetric=symmetric,
                       scale_dtype=scale_dtype)


def _weights(weight, outlier: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights with outliers, outlier rows, outlier columns). The outliers sit at the largest
    |w| of ``N_OUTLIER_ROWS`` rows (row 0 and seeded others) and are multiplied by 1 + outlier."""
    gen = torch.Generator().manual_seed(seed)
    if weight is None:
        w = torch.randn(SHAPE, generator=gen, dtype=torch.float32) * WEIGHT_STD
    else:
        check.instance("weight", weight, torch.Tensor)
        if weight.ndim != 2 or weight.numel() == 0 or not weight.is_floating_point():
            raise ValueError("weight must be a non-empty 2-D floating tensor (out_features, in_features), got "
                             f"shape {tuple(weight.shape)} and dtype {weight.dtype}")
        w = weight.detach().to("cpu", torch.float32).clone()
    out = w.shape[0]
    others = torch.randperm(max(out - 1, 0), generator=gen)[:N_OUTLIER_ROWS - 1] + 1
    rows = torch.cat([torch.zeros(1, dtype=torch.int64), others])
    cols = w[rows].abs().argmax(dim=1)
    w[rows, cols] *= 1.0 + outlier
    return w, rows, cols


def quant_numbers(bits: int = 4, group_size: int | str = 64, symmetric: bool = True, outlier: float = 0.0,
                  seed: int = 0, scale_dtype: str = "fp16", weight: torch.Tensor | None = None) -> dict:
    """What the quantisation explorer shows for one setting.

    Args:
        bits: code width, an int in 2..8.
        group_size: weights per scale along the input dimension (an int that divides in_features),
            or "channel" (one scale per output row) or "tensor" (one scale for the matrix).
        symmetric: True for absmax codes -qmax..qmax, False for min-max codes 0..2^bits - 1 with an
            integer zero point (docs/quantization.md#symmetric-absmax, #asymmetric-min-max).
        outlier: outlier strength >= 0: the largest-|w| weight of each of ``N_OUTLIER_ROWS`` rows
            (row 0 and seeded others) is multiplied by 1 + outlier; 0 leaves the weights as they are.
        seed: seed of the synthetic weights and of the outlier rows (int).
        scale_dtype: "fp16" or "fp32", the storage dtype of scales and zero points.
        weight: a real weight matrix (out_features, in_features), any floating dtype (computed in
            float32 on the CPU, the tensor itself is not modified); None: seeded Gaussian weights of
            shape ``SHAPE`` with standard deviation ``WEIGHT_STD``.

    Returns:
        dict with
        ``scheme`` (QuantScheme), ``shape`` (out, in), ``synthetic`` (bool);
        ``storage``: ``storage_bytes(shape, scheme)`` (payload, scales, zeros, total, bits per weight);
        ``table``: pandas DataFrame, one row for the chosen scheme then one per entry of ``FORMATS``,
        columns ``format``, ``bits per weight``, ``bytes`` (for ``shape``: numel * bits per weight
        / 8, exact, as pandas' nullable Int64: <NA> where a format's block does not divide
        in_features) and ``source``;
        ``rmse``, ``relative_rmse`` (rmse / RMS of the weights), ``max_error`` (max |w - w_hat|),
        floats over the whole matrix, w_hat = dequantize(quantize(w)) (what ``fake_quantize``
        returns);
        ``outlier`` (float), ``outlier_rows``, ``outlier_cols`` (int64 tensors, the outlier positions);
        ``shown``: text naming the weights of the histogram (row 0's group holding its largest
        weight, or the whole of row 0 for "channel" and "tensor"), ``values`` and ``values_hat``
        (float32 1-D: those weights and their fake-quantised values), ``grid`` (float32 1-D, sorted:
        the value of every code under that group's stored scale and zero point, by ``dequantize``;
        2^bits - 1 points when symmetric, 2^bits otherwise; points may coincide when an fp16 scale
        is tiny), ``step`` (the stored scale s, the distance between grid points) and ``outlier_at``
        (the index in ``values`` of row 0's outlier weight).

    Raises:
        ValueError / TypeError: a setting ``QuantScheme`` refuses (bits outside 2..8, a scale dtype
        other than fp16/fp32, a non-bool ``symmetric``), a group size that is not an int >= 1,
        "channel" or "tensor" or that does not divide in_features, a negative or non-finite
        ``outlier``, a non-int seed, a weight that is not a 2-D floating tensor or holds
        non-finite values, or an fp16 scale that overflows or underflows (use scale_dtype="fp32").
    """
    import pandas as pd

    scheme = _scheme(bits, group_size, symmetric, scale_dtype)
    outlier = check.nonnegative_number("outlier", outlier)
    seed = check.integer("seed", seed, minimum=0)
    w, rows, cols = _weights(weight, float(outlier), seed)
    shape = tuple(w.shape)
    out_features, in_features = shape
    storage = storage_bytes(shape, scheme)

    qt = quantize(w, scheme)
    w_hat = qt.dequantize()                    # = fake_quantize(w, scheme), quantised once
    err = (w.double() - w_hat.double())
    rmse = float(err.square().mean().sqrt())
    rms = float(w.double().square().mean().sqrt())

    # The histogram: row 0's group that holds its largest weight (or all of row 0).
    col = int(cols[0])
    if scheme.granularity == "group":
        g = scheme.group_size
        k = col // g
        span = slice(k * g, (k + 1) * g)
        shown = f"row 0, columns {k * g}..{(k + 1) * g - 1} (group {k}, holding the row's largest weight)"
        index = (0, k)
    else:
        span = slice(0, in_features)
        shown = ("row 0 (every weight shares the tensor's one scale)" if scheme.granularity == "tensor"
                 else "row 0 (one scale per row)")
        index = (0, 0)
    scale = qt.scales[index].reshape(1, 1)
    zero = None if qt.zeros is None else qt.zeros[index].reshape(1, 1)
    if scheme.symmetric:
        m = qmax(scheme.bits)
        codes = torch.arange(-m, m + 1, dtype=torch.int16).to(torch.int8)
    else:
        codes = torch.arange(0, 2 ** scheme.bits, dtype=torch.int16).to(torch.uint8)
    one_row = dataclasses.replace(scheme, granularity="channel", group_size=None)
    grid = QuantizedTensor(codes=codes.reshape(1, -1), scales=scale, zeros=zero, scheme=one_row).dequantize()

    numel = out_features * in_features
    table = [{"format": f"{scheme.name} (chosen)", "bits per weight": storage.bits_per_weight,
              "bytes": storage.total,
              "source": f"storage_bytes: payload {storage.payload:,} B + scales {storage.scales:,} B"
                        f" + zeros {storage.zeros:,} B"}]
    for fmt in FORMATS:
        exact = in_features % fmt.block == 0
        table.append({"format": fmt.name, "bits per weight": fmt.bits_per_weight,
                      "bytes": round(numel * fmt.bits_per_weight / 8) if exact else None,
                      "source": fmt.source})
    return {"scheme": scheme, "shape": shape, "synthetic": weight is None, "storage": storage,
            "table": pd.DataFrame(table).astype({"bytes": "Int64"}), "rmse": rmse, "relative_rmse": rmse / rms if rms > 0 else math.nan,
            "max_error": float(err.abs().max()), "outlier_rows": rows, "outlier_cols": cols,
            "outlier": float(outlier), "shown": shown, "values": w[0, span].clone(),
            "values_hat": w_hat[0, span].clone(), "outlier_at": col - span.start,
            "grid": grid.reshape(-1).sort().values, "step": float(scale)}


def quant_explorer_figure(numbers: dict):
    """The histogram the quantisation widget shows: the shown weights (grey bars) and the grid
    of values they round to (one thin vertical line per code).

    Args:
        numbers: a ``quant_numbers`` dict.

    Returns:
        a ``matplotlib.figure.Figure`` drawn off-screen (pyplot's backend is left alone); its one
        axes holds the grid as a single ``LineCollection`` with one segment per grid point, and a
        red marker under row 0's outlier weight when the outlier strength is > 0.
    """
    from matplotlib.figure import Figure

    values, grid = numbers["values"].numpy(), numbers["grid"].numpy()
    fig = Figure(figsize=(7.0, 3.4))
    ax = fig.subplots()
    ax.hist(values, bins=min(80, max(10, values.size // 4)), color="0.6")
    ax.vlines(grid, 0, 1, transform=ax.get_xaxis_transform(), colors="C0", linewidth=0.6, alpha=0.8)
    if numbers["outlier"] > 0:      # one weight among hundreds: its histogram bar is too small to see
        ax.plot([values[numbers["outlier_at"]]], [0], marker="v", markersize=9, color="C3", linestyle="none",
                transform=ax.get_xaxis_transform(), clip_on=False,
                label=f"outlier (x{1 + numbers['outlier']:.3g})")
        ax.legend(loc="upper left", fontsize=8)
    lo, hi = min(values.min(), grid.min()), max(values.max(), grid.max())
    pad = 0.03 * (hi - lo) if hi > lo else 1e-3
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_xlabel("weight value (blue lines: the values the codes can take)")
    ax.set_ylabel("weights")
    ax.set_title(f"{numbers['scheme'].name}: {numbers['shown']}\n{grid.size} grid points, step "
                 f"{numbers['step']:.3g}; matrix RMSE {numbers['rmse']:.3g} "
                 f"({100 * numbers['relative_rmse']:.2f} % of RMS), max error {numbers['max_error']:.3g}",
                 fontsize=8)
    fig.tight_layout()
    return fig


def _html(numbers: dict) -> str:
    """The table and the error figures as HTML."""
    import pandas as pd

    table = numbers["table"].copy()
    table["bytes"] = ["-" if b is pd.NA else f"{b:,}" for b in table["bytes"]]
    table = table.to_html(index=False, float_format=lambda x: f"{x:.4g}")
    out, in_ = numbers["shape"]
    return (f"<b>Bytes for a {out} x {in_} weight matrix</b>{table}"
            f"<p>Reconstruction over the whole matrix ({numbers['scheme'].name}): RMSE "
            f"{numbers['rmse']:.4g} ({100 * numbers['relative_rmse']:.2f} % of the weights' RMS), "
            f"max |w - w_hat| {numbers['max_error']:.4g}.</p>")


def quant_explorer(bits: int = 4, group_size: int | str = 64, symmetric: bool = True, outlier: float = 0.0,
                   scale_dtype: str = "fp16", seed: int = 0, weight: torch.Tensor | None = None):
    """An ipywidgets panel: controls for bits (2..8), group size (``GROUP_CHOICES``, only those
    that divide in_features, plus per channel / per tensor), symmetric or asymmetric, outlier
    strength (0..50, or up to the initial value) and scale dtype (sliders update on release); it shows which weights are used (seeded synthetic ones unless
    ``weight`` is given), the bytes table and errors of ``quant_numbers``, and the histogram of
    ``quant_explorer_figure`` as a PNG at its natural size (as the RoPE explorer does).

    Args: as ``quant_numbers``; ``group_size`` must be one of the offered choices.

    Returns:
        the widget (a VBox: controls row, second controls row, weights note, table, picture); its
        ``update()`` attribute recomputes for the current controls and returns the
        ``quant_numbers`` dict, or None when the setting is refused (the message replaces the table);
        its ``controls`` attribute maps "bits", "group_size", "symmetric", "outlier", "scale_dtype"
        to their widgets.

    Raises:
        ValueError / TypeError: as ``quant_numbers`` for the initial setting.
    """
    import html

    import ipywidgets as widgets

    first = quant_numbers(bits, group_size, symmetric, outlier, seed, scale_dtype, weight)   # refuses bad input
    scheme = first["scheme"]
    bits, group_size = scheme.bits, scheme.group_size or scheme.granularity               # as plain ints / str
    in_features = first["shape"][1]
    choices = [(str(g), g) for g in GROUP_CHOICES if isinstance(g, int) and in_features % g == 0]
    if isinstance(group_size, int) and group_size not in dict(choices).values():
        choices = sorted(choices + [(str(group_size), group_size)], key=lambda c: c[1])
    choices += [("per channel", "channel"), ("per tensor", "tensor")]

    style = {"description_width": "initial"}
    bits_w = widgets.IntSlider(value=bits, min=2, max=8, description="bits", continuous_update=False, style=style)
    group_w = widgets.Dropdown(options=choices, value=group_size, description="group size", style=style)
    outlier_w = widgets.FloatSlider(value=outlier, min=0.0, max=max(50.0, float(outlier)), step=0.5,
                                    description="outlier strength", continuous_update=False, style=style)
    sym_w = widgets.ToggleButtons(options=[("symmetric", True), ("asymmetric (zero point)", False)],
                                  value=symmetric, style={"button_width": "auto"})
    dtype_w = widgets.ToggleButtons(options=["fp16", "fp32"], value=scale_dtype, description="scale dtype",
                                    style={"button_width": "auto", "description_width": "initial"})
    out, in_ = first["shape"]
    source = (f"seeded synthetic Gaussian weights (std {WEIGHT_STD}, seed {seed}), shape {out} x {in_} "
              "like SmolLM2-135M's down_proj" if first["synthetic"] else
              f"the weight tensor passed in, shape {out} x {in_}")
    note = widgets.HTML(f"<i>Weights: {html.escape(source)}. Outlier strength s multiplies the largest weight "
                        f"of {min(N_OUTLIER_ROWS, out)} rows (row 0 included) by 1 + s.</i>")
    table = widgets.HTML()
    image = picture_widget()
    controls = {"bits": bits_w, "group_size": group_w, "symmetric": sym_w, "outlier": outlier_w,
                "scale_dtype": dtype_w}

    def update(*_):
        try:
            numbers = quant_numbers(int(bits_w.value), group_w.value, bool(sym_w.value), float(outlier_w.value),
                                    seed, dtype_w.value, weight)
        except ValueError as exc:              # e.g. an fp16 scale out of range: say so, keep the controls
            table.value = f"<b>Refused:</b> {html.escape(str(exc))}"
            return None
        table.value = _html(numbers)
        show_figure(image, quant_explorer_figure(numbers))
        return numbers

    for w in controls.values():
        w.observe(update, names="value")
    panel = widgets.VBox([widgets.HBox([bits_w, group_w, outlier_w]), widgets.HBox([sym_w, dtype_w]),
                          note, table, image], layout=widgets.Layout(**PANEL_LAYOUT))
    panel.update = update
    panel.controls = controls
    update()
    return panel
