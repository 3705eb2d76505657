"""The figures are drawn without seaborn (its import was ~1.4 s of a report's CPU) and draw what
seaborn drew: each replaced call is drawn both ways on the same data and compared — the drawn
geometry and properties, value for value, the merged figure legend, and the pixels."""

from __future__ import annotations

import os
import subprocess
import sys

import matplotlib as mpl
import numpy as np
import pandas as pd
import pytest
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba

from reports.figure_base import (
    WHITEGRID,
    _desaturate,
    _figure_legend,
    _husl,
    _mean_sd_lines,
    _palette,
    _panels,
    _style,
    _styled_points,
    _tab10,
)
from tests.conftest import REPO


def _same(a, b, path="") -> None:
    """``a == b``, floats (and arrays of them) to 1e-12: the means and sds are pandas' grouped
    ones here, seaborn's per-group ones there (the same sums, possibly in another order)."""
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple) and not (a and isinstance(a[0], float | int | np.number)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray | float | np.floating | list | tuple):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), 1e-12, 1e-12, True,
                                   err_msg=path)  # fmt: skip
    else:
        assert a == b, (path, a, b)


def _line(ln) -> dict:
    return {
        "x": np.asarray(ln.get_xdata(), float), "y": np.asarray(ln.get_ydata(), float),
        "color": to_rgba(ln.get_color()), "alpha": ln.get_alpha(), "ls": ln.get_linestyle(),
        "lw": ln.get_linewidth(), "marker": ln.get_marker(), "ms": float(ln.get_markersize()),
        "mfc": to_rgba(ln.get_markerfacecolor()), "mec": to_rgba(ln.get_markeredgecolor()),
        "mew": float(ln.get_markeredgewidth()), "z": ln.get_zorder(), "visible": ln.get_visible(),
    }  # fmt: skip


def _drawn(ax) -> dict:
    """Everything drawn in ``ax`` that shows: lines with data (seaborn also adds empty legend
    lines), collections with a path (it also adds a band of NaNs where x has one value), in
    drawing order; and the axis limits."""
    lines = [_line(ln) for ln in ax.lines if len(ln.get_xdata())]
    colls = []
    for c in ax.collections:
        paths = [p for p in c.get_paths() if len(p.vertices)]
        if not paths:
            continue
        colls.append({
            "type": type(c).__name__, "z": c.get_zorder(), "alpha": c.get_alpha(),
            "paths": [p.vertices for p in paths], "codes": [str(p.codes) for p in paths],
            "fc": c.get_facecolor(), "ec": c.get_edgecolor(), "lw": np.asarray(c.get_linewidth()),
            "sizes": c.get_sizes(), "offsets": np.asarray(c.get_offsets()),
        })  # fmt: skip
    return {"lines": lines, "collections": colls, "xlim": ax.get_xlim(), "ylim": ax.get_ylim()}


def _legend(fig) -> dict:
    (leg,) = fig.legends
    return {t.get_text(): _line(h) for t, h in zip(leg.get_texts(), leg.legend_handles)}


def _pixels(fig) -> np.ndarray:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()


def _both(draw_ours, draw_seaborn, k: int = 2):
    """The same panels drawn our way and seaborn's, each figure with its merged legend."""
    out = []
    for draw, ours in ((draw_ours, True), (draw_seaborn, False)):
        with _style():
            fig, ((*axes,),) = _panels(1, k)
            legend = {}  # ours: what the drawing returns; seaborn's: in each axes' legend
            for i, ax in enumerate(axes):
                drawn = draw(ax, i)
                legend = (drawn or legend) if ours else None
                ax.set(title=f"panel {i}", xlabel="x", ylabel="y")
            _figure_legend(fig, axes, legend)
            out.append((fig, axes, _pixels(fig)))
    return out


def test_the_style_is_seaborn_whitegrid_with_fixed_title_positions():
    assert dict(sns.axes_style("whitegrid")) == {**WHITEGRID, "image.cmap": "rocket"}
    before = dict(mpl.rcParams)
    with _style():
        ours = dict(mpl.rcParams)
    with sns.axes_style("whitegrid"), mpl.rc_context({"font.size": 9}):
        theirs = dict(mpl.rcParams)
    assert dict(mpl.rcParams) == before
    assert {k for k in ours if ours[k] != theirs[k]} == {"image.cmap", "axes.titley"}
    assert ours["axes.titley"] == 1.0 and theirs["image.cmap"] == "rocket"


@pytest.mark.parametrize("n", [1, 3, 10, 11, 12, 40, 257])
def test_palettes_and_desaturation_are_seaborns(n):
    labels = [f"label {i:03d}" for i in range(n)]
    pal = _palette(reversed(labels))
    assert list(pal) == labels
    theirs = sns.color_palette("tab10" if n <= 10 else "husl", n)
    np.testing.assert_allclose(list(pal.values()), theirs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(_husl(n), sns.color_palette("husl", n), rtol=0, atol=1e-12)
    np.testing.assert_allclose(_tab10(n), sns.color_palette("tab10", n), rtol=0, atol=1e-12)
    for color in [*pal.values(), "C3", ".26", "#123456", (0.2, 0.9, 0.4)]:
        np.testing.assert_allclose(_desaturate(color, 0.75), sns.desaturate(color, 0.75), 0, 1e-12)


def _line_data() -> pd.DataFrame:
    """Label b: three seeds per x (unsorted), one at x=8 (no band there), a NaN; label a: one
    value per x (seaborn draws it unaggregated); label c: in the palette, not in the data."""
    rows = [("b", 4, 60.0), ("b", 1, 50.0), ("b", 2, 55.0), ("b", 1, 52.5), ("b", 4, 63.0),
            ("b", 2, 54.0), ("b", 1, 49.0), ("b", 2, 58.0), ("b", 4, 61.0), ("b", 8, 66.0),
            ("b", 8, np.nan), ("a", 2, 70.0), ("a", 1, 72.0), ("a", 4, 71.0),
            ("d", 1, 40.0), ("d", 1, 44.0)]  # fmt: skip
    return pd.DataFrame(rows, columns=["label", "M", "acc"])


def test_lines_draw_what_seaborn_lineplot_draws():
    data = _line_data()
    pal = _palette([*data["label"], "c"])

    def seaborn(ax, i):
        kw = {"hue": "label", "hue_order": list(pal), "palette": pal}
        sns.lineplot(data=data, x="M", y="acc", **kw, marker="o", errorbar="sd", ax=ax)

    ours, theirs = _both(lambda ax, i: _mean_sd_lines(ax, data, "M", "acc", "label", pal), seaborn)
    for a, b in zip(ours[1], theirs[1]):
        _same(_drawn(a), _drawn(b))
    drawn = _drawn(ours[1][0])
    # The values themselves: label b's means and its band (mean ± sample sd; none at x=8).
    b = data[data["label"] == "b"].dropna().groupby("M")["acc"]
    line_b = drawn["lines"][1]
    _same((line_b["x"], line_b["y"]), (np.array([1.0, 2, 4, 8]), b.mean().to_numpy()))
    assert line_b["color"] == to_rgba(pal["b"]) and line_b["marker"] == "o"
    band_b = drawn["collections"][0]
    mean, sd = b.mean().to_numpy()[:3], b.std().to_numpy()[:3]
    corners = {(x, round(v, 9)) for x, m, d in zip([1.0, 2, 4], mean, sd) for v in (m - d, m + d)}
    assert {(x, round(v, 9)) for x, v in band_b["paths"][0]} == corners
    _same({k: band_b[k] for k in ("alpha", "fc")}, {"alpha": 0.2, "fc": [to_rgba(pal["b"], 0.2)]})
    assert [ln["x"].tolist() for ln in drawn["lines"]] == [[1.0, 2, 4], [1.0, 2, 4, 8], [1.0]]
    assert len(drawn["collections"]) == 2  # b and d; a has one value per x
    _same(_legend(ours[0]), _legend(theirs[0]))
    assert list(_legend(ours[0])) == ["a", "b", "c", "d"]
    assert np.array_equal(ours[2], theirs[2])


def test_points_draw_what_seaborn_scatterplot_draws():
    rows = [("mimo", "M=4", 2.0e5, 91.0), ("single", "M=1", 5.0e4, 88.0),
            ("deep", "M=4", 2.0e5, 93.5), ("deep", "M=2", 1.0e5, 92.0),
            ("mimo", "M=2", 1.0e5, 90.0), ("single", "M=1", 5.0e4, np.nan)]  # fmt: skip
    data = pd.DataFrame(rows, columns=["method", "size", "params", "acc100"])
    pal = _palette([*data["method"], "unused"])
    sizes = ["M=1", "M=2", "M=4", "M=8"]

    def seaborn(ax, i):
        kw = {"hue": "method", "hue_order": list(pal), "palette": pal}
        kw |= {"style": "size", "style_order": sizes}
        sns.scatterplot(data=data, x="params", y="acc100", **kw, s=60, ax=ax)

    ours, theirs = _both(
        lambda ax, i: _styled_points(ax, data, "params", "acc100", "method", pal, "size", sizes),
        seaborn,
    )
    for a, b in zip(ours[1], theirs[1]):
        _same(_drawn(a), _drawn(b))
    (points,) = _drawn(ours[1][0])["collections"]
    shown = data.dropna()
    _same(points["offsets"], shown[["params", "acc100"]].to_numpy())
    _same(points["fc"], np.array([to_rgba(pal[m]) for m in shown["method"]]))
    _same((points["sizes"], points["lw"]), (np.array([60.0]), np.array([0.08 * np.sqrt(60)])))
    assert [tuple(c) for c in points["ec"]] == [to_rgba("w")]
    legend = _legend(ours[0])
    _same(legend, _legend(theirs[0]))
    assert list(legend) == ["method", *pal, "size", *sizes]
    assert [legend[s]["marker"] for s in sizes] == ["o", "X", (4, 0, 45), "P"]
    assert np.array_equal(ours[2], theirs[2])


def test_nothing_to_scatter_draws_nothing_and_no_legend():
    empty = pd.DataFrame({"method": [], "size": [], "params": [], "acc100": []})
    with _style():
        _, ((ax,),) = _panels(1, 1)
        assert _styled_points(ax, empty, "params", "acc100", "method", {}, "size", ["M=1"]) == {}
        assert not ax.collections


def _titled(style, y, title):
    with style():
        fig, ((ax,),) = _panels(1, 1)
        ax.plot([1, 2, 3], y, marker="o")
        ax.set(title=title)
        _figure_legend(fig, [ax])
        pixels = _pixels(fig)
        boxes = [a.get_window_extent().bounds for a in (ax, ax.title, ax.yaxis.offsetText)]
        return boxes, ax.yaxis.offsetText.get_text(), pixels, ax


@pytest.mark.parametrize("title", ["short", "a title as long as a setting's, over the offset text"])
@pytest.mark.parametrize(
    "y", [[80.0, 85.0, 90.0], [1000.0001, 1000.0002, 1000.0003], [2e6, 3e6, 4e6], [1e-6, 2e-6, 0]]
)
def test_titles_are_where_matplotlibs_automatic_placement_puts_them(y, title):
    """Titles are placed at the top of the axes, not measured around the tick labels on every
    draw; an axes that may show a y offset text keeps matplotlib's placement (a title over that
    text is moved above it, and the axes shrinks to make room)."""

    def automatic():  # what the figures were drawn with: seaborn's style, titles placed by mpl
        return mpl.rc_context({**WHITEGRID, "font.size": 9})

    ours, offset, pixels, ax = _titled(_style, y, title)
    theirs, their_offset, their_pixels, _ = _titled(automatic, y, title)
    assert offset == their_offset
    _same(ours, theirs)
    assert np.array_equal(pixels, their_pixels)
    assert ax._autotitlepos is (offset != "")  # the cheap path where no title can move


def test_drawing_the_figures_imports_no_seaborn():
    code = (
        "import sys\n"
        "from record_factory import tau_sweep_records\n"
        "from reports.aggregate import records_to_frame\n"
        "from reports.figures import render_figures\n"
        "figs = render_figures(records_to_frame(tau_sweep_records()))\n"
        # the factory's records hold no reliability bins: that figure is skipped here
        "drawn = [f for f in figs if f.id != 'fig-reliability']\n"
        "assert len(drawn) > 5 and all(f.png for f in drawn), [f.note for f in drawn]\n"
        "print('seaborn' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
