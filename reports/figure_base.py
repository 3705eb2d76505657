"""Shared plumbing of the leaderboard's figures: style, labels, panel grids, legend, PNG encoding.

Figures are built on :class:`matplotlib.figure.Figure` objects (Agg, no pyplot state); a ``$`` in
labels taken from config values is escaped, so they are drawn literally, never as math text.
"""

from __future__ import annotations

import base64
import colorsys
import io
import itertools
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle

from reports.columns import m_text

log = logging.getLogger("reports.figures")

SIGMA_METHOD = "sigma_ens"
MAX_SETTINGS = 8  # (dataset, backbone) settings per figure
MAX_PANELS_PER_ROW = 4


#: What seaborn's ``axes_style("whitegrid")`` sets (seaborn 0.13, ``seaborn/rcmod.py``), as
#: matplotlib rc values: the figures are drawn the way seaborn drew them without importing it
#: (its import, which imports scipy.stats, was ~1.4 s of a report's CPU). Left out: its
#: ``"image.cmap": "rocket"``, a colormap only seaborn registers (no figure uses the default map).
WHITEGRID = {
    "axes.facecolor": "white", "axes.edgecolor": ".8", "axes.grid": True, "axes.axisbelow": True,
    "axes.labelcolor": ".15", "figure.facecolor": "white", "grid.color": ".8",
    "grid.linestyle": "-", "text.color": ".15", "xtick.color": ".15", "ytick.color": ".15",
    "xtick.direction": "out", "ytick.direction": "out", "lines.solid_capstyle": "round",
    "patch.edgecolor": "w", "patch.force_edgecolor": True, "font.family": ["sans-serif"],
    "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans",
                        "sans-serif"],
    "xtick.bottom": False, "xtick.top": False, "ytick.left": False, "ytick.right": False,
    "axes.spines.left": True, "axes.spines.bottom": True, "axes.spines.right": True,
    "axes.spines.top": True,
}  # fmt: skip


@contextmanager
def _style() -> Iterator[None]:
    """seaborn's whitegrid style, 9 pt text, and titles at the top of their axes: matplotlib would
    re-place every title at each draw, measuring the x axis's tick labels first (hidden tick marks
    leave it unsure of their side) — a second of CPU over a report's figures at 1,000
    configurations — and move none: only a y-axis offset text can be above an axes here, and
    :func:`_titles` gives matplotlib's placement back to the axes that may show one."""
    with mpl.rc_context({**WHITEGRID, "font.size": 9, "axes.titley": 1.0}):
        yield


def _titles(ax) -> None:
    """Panel titles at 9 pt, placed as matplotlib places them by default: at the top of the axes,
    or above a y-axis offset text ("1e6", "+8.5e1") they would overlap. That text needs ticks
    sharing ≥ 4 leading digits (a view under 1/166 of its largest value) or values ≥ 1e6 or
    < 1e-4: axes that may show one (and a few more) keep matplotlib's automatic placement."""
    ax.title.set_fontsize(9)
    if not ax.get_title():
        return
    lo, hi = ax.get_ylim()
    top = max(abs(lo), abs(hi))
    if not (1e-3 <= top < 1e5 and abs(hi - lo) * 100 >= top):
        ax._autotitlepos = True  # matplotlib's switch, set by axes.titley=None (not public)


def _literal(text: pd.Series) -> pd.Series:
    """Config strings drawn as text: a ``$`` would start matplotlib math text, so escape it."""
    return text.astype(str).str.replace("$", r"\$", regex=False)


def _done(cells: pd.DataFrame) -> pd.DataFrame:
    d = cells[cells["status"] == "done"] if "status" in cells else cells
    setting = _literal(d["dataset"].astype(str) + " / " + d["backbone"].astype(str))
    return d.assign(label=_labels(d), setting=setting)


def _labels(d: pd.DataFrame, with_m: bool = True) -> pd.Series:
    """``method (hparams) M=4``: one line/bar per configuration, seeds pooled."""
    hp = d["hparams"].fillna("").astype(str).map(lambda h: f" ({h})" if h else "")
    label = _literal(d["method"].astype(str) + hp)
    if with_m:
        label = label + d["M"].map(lambda m: "" if pd.isna(m) else f" M={m:g}")
    return label


def _settings(d: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    groups = [(str(k), g) for k, g in d.groupby("setting", sort=True)]
    if len(groups) > MAX_SETTINGS:
        log.warning("figure shows the first %d of %d settings", MAX_SETTINGS, len(groups))
    return groups[:MAX_SETTINGS]


def _panels(n_settings: int, k: int, width: float = 4.2, height: float = 3.2):
    """A figure with ``k`` panels per setting, settings wrapped so a row holds ≤ 4 panels.

    Returns the figure and, per setting, its list of ``k`` axes; unused axes are hidden.
    """
    per_row = max(1, min(MAX_PANELS_PER_ROW // k, n_settings))
    nrows = -(-n_settings // per_row)
    fig = Figure(figsize=(width * per_row * k + 0.4, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, per_row * k, squeeze=False)
    out = [[axes[i // per_row, (i % per_row) * k + j] for j in range(k)] for i in range(n_settings)]
    used = {id(ax) for row in out for ax in row}
    for ax in axes.flat:
        if id(ax) not in used:
            ax.set_axis_off()
    return fig, out


def _png(fig: Figure) -> str:
    """The figure as base64 PNG at 150 dpi: the page shows it scaled to its width and the same
    bytes are ``<id>.png`` beside it (one render, not one per resolution)."""
    buf = io.BytesIO()
    # No timestamps/software in the metadata: identical data give identical files.
    fig.savefig(buf, format="png", dpi=150, metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


#: Legend text size (points) and the width of one of its characters there (inches, DejaVu Sans).
LEGEND_PT, LEGEND_CHAR_IN = 7.5, 0.058


def _figure_legend(fig: Figure, axes: Iterable, legend: dict | None = None) -> None:
    """One legend for the whole figure, below the panels, entries merged from every panel.

    Below, not to the right: a configuration's label can be 100 characters long, and a legend
    beside the panels took the width from them (titles ran into the next panel). The figure
    grows by the legend's rows, in as many columns as the longest label allows; panel titles
    are set a little smaller than matplotlib's default for the same reason. ``legend``: entries
    (label → handle) of the panels drawn without a legend of their own, first.
    """
    entries: dict[str, object] = dict(legend or {})
    axes = list(axes)
    for ax in axes:
        _titles(ax)
        leg = ax.get_legend()
        if leg is not None:
            pairs = zip(leg.legend_handles, [t.get_text() for t in leg.get_texts()])
            leg.remove()
        else:
            pairs = zip(*ax.get_legend_handles_labels())
        for handle, label in pairs:
            entries.setdefault(label, handle)
    if entries:
        width = fig.get_figwidth()
        longest = max(len(label) for label in entries) * LEGEND_CHAR_IN + 0.5  # + marker, gap
        ncols = max(1, min(len(entries), int(width // longest)))
        rows = -(-len(entries) // ncols)
        fig.set_figheight(fig.get_figheight() + rows * LEGEND_PT * 1.6 / 72 + 0.1)
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="outside lower center",
            ncols=ncols,
            fontsize=LEGEND_PT,
            frameon=False,
        )


def _palette(labels: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    uniq = sorted(set(labels))
    return dict(zip(uniq, _tab10(len(uniq)) if len(uniq) <= 10 else _husl(len(uniq))))


def _tab10(n: int) -> list[tuple[float, float, float]]:
    """seaborn's ``color_palette("tab10", n)``: matplotlib's tab10, cycled past 10 colours."""
    colors = [tuple(c) for c in mpl.colormaps["tab10"](np.linspace(0, 1, 10))[:, :3]]
    return [colors[i % 10] for i in range(n)]


_HUSL_M = ((3.2406, -1.5372, -0.4986), (-0.9689, 1.8758, 0.0415), (0.0557, -0.2040, 1.0570))


def _husl(n: int) -> list[tuple[float, float, float]]:
    """seaborn's ``color_palette("husl", n)`` (``husl_palette``: hues from 0.01, s=.9, l=.65),
    with the HUSL 2.1.0 conversion seaborn bundles (``seaborn/external/husl.py``), step for step."""
    hues = (np.linspace(0, 1, n + 1)[:-1] + 0.01) % 1 * 359
    sat, light = 0.9 * 99, 0.65 * 99
    out = []
    for hue in hues:
        hrad = math.radians(hue)
        sin_h, cos_h = math.sin(hrad), math.cos(hrad)
        sub = math.pow(light + 16, 3.0) / 1560896.0
        sub = sub if sub > 0.008856 else light / 903.3
        chroma = float("inf")  # max_chroma: the largest chroma in the sRGB gamut
        for m1, m2, m3 in _HUSL_M:
            top = (0.99915 * m1 + 1.05122 * m2 + 1.14460 * m3) * sub
            right, left = 0.86330 * m3 - 0.17266 * m2, 0.12949 * m3 - 0.38848 * m1
            bottom = (right * sin_h + left * cos_h) * sub
            for t in (0.0, 1.0):
                c = light * (top - 1.05122 * t) / (bottom + 0.17266 * sin_h * t)
                if 0.0 < c < chroma:
                    chroma = c
        c = chroma / 100.0 * sat
        u, v = math.cos(hrad) * c, math.sin(hrad) * c  # LCh → Luv → XYZ (D65) → sRGB
        y = math.pow((light + 16.0) / 116.0, 3.0)
        y = y if y > 0.008856 else (116.0 * ((light + 16.0) / 116.0) - 16.0) / 903.3
        var_u, var_v = u / (13.0 * light) + 0.19784, v / (13.0 * light) + 0.46834
        x = 0.0 - (9.0 * y * var_u) / ((var_u - 4.0) * var_v - var_u * var_v)
        z = (9.0 * y - (15.0 * var_v * y) - (var_v * x)) / (3.0 * var_v)
        lin = [m1 * x + m2 * y + m3 * z for m1, m2, m3 in _HUSL_M]
        rgb = [12.92 * c if c <= 0.0031308 else 1.055 * math.pow(c, 1 / 2.4) - 0.055 for c in lin]
        out.append(tuple(float(c) for c in np.clip(rgb, 0, 1)))
    return out


def _desaturate(color, prop: float) -> tuple[float, float, float]:
    """seaborn's ``desaturate``: the HLS saturation of ``color`` times ``prop``."""
    h, lum, sat = colorsys.rgb_to_hls(*mpl.colors.to_rgb(color))
    return colorsys.hls_to_rgb(h, lum, sat * prop)


def _finite(d: pd.DataFrame, *cols: str) -> pd.DataFrame:
    if any(c not in d for c in cols):
        return d.iloc[0:0]
    values = d[list(cols)].apply(pd.to_numeric, errors="coerce").astype(float)
    return d[np.isfinite(values).all(axis=1)]


def pareto_front(acc: Sequence[float], ece: Sequence[float]) -> list[int]:
    """Positions of the points no other point beats on both accuracy (↑) and ECE (↓), by ECE."""
    acc, ece = np.asarray(acc, dtype=float), np.asarray(ece, dtype=float)
    front, best = [], -np.inf
    for i in np.lexsort((-acc, ece)):  # ECE ascending, ties broken by accuracy descending
        if np.isfinite(acc[i]) and np.isfinite(ece[i]) and acc[i] > best:
            front.append(int(i))
            best = acc[i]
    return front


#: What ``seaborn.lineplot(marker="o")`` gives a line and its legend entry.
_LINE = {"linestyle": "-", "marker": "o", "markeredgewidth": 0.75, "markeredgecolor": "w"}


def _mean_sd_lines(ax, data: pd.DataFrame, x: str, y: str, hue: str, pal: dict) -> dict:
    """What ``seaborn.lineplot(data=data, x=x, y=y, hue=hue, hue_order=list(pal), palette=pal,
    marker="o", errorbar="sd")`` draws, drawn directly (seaborn's overhead per line, and its
    import, were most of these figures' time): per ``hue`` level, in ``pal``'s order, the mean of
    ``y`` per ``x`` (ascending) with markers, then its mean ± sample sd as a band of alpha 0.2
    (none at an ``x`` with one value). Returns the legend seaborn gives the axes: label → handle,
    every level of ``pal``, drawn here or not."""
    d = data[[hue, x, y]].dropna()
    d = d.assign(**{x: d[x].astype(float), y: d[y].astype(float)}).sort_values([x, y])
    stats = d.groupby([hue, x])[y].agg(["mean", "std"])
    levels = np.asarray(stats.index.get_level_values(0))
    xs = stats.index.get_level_values(1).to_numpy(float)
    mean, sd = stats["mean"].to_numpy(float), stats["std"].to_numpy(float)
    cuts = np.r_[0, np.flatnonzero(levels[1:] != levels[:-1]) + 1, len(levels)]
    spans = {levels[a]: slice(a, b) for a, b in itertools.pairwise(cuts) if b > a}
    for level, color in pal.items():
        if (at := spans.get(level)) is None:
            continue
        ax.plot(xs[at], mean[at], color=color, **_LINE)
        if np.isfinite(sd[at]).any():
            ax.fill_between(xs[at], mean[at] - sd[at], mean[at] + sd[at], color=color, alpha=0.2)
    return {level: Line2D([], [], color=color, **_LINE) for level, color in pal.items()}


def _lines(panels, settings, x: str, ys, pal, xlabel: str) -> dict:
    """Mean ± sd lines per label (:func:`_mean_sd_lines`) in each panel; returns their legend."""
    legend: dict = {}
    for row, (title, s) in zip(panels, settings):
        for ax, (y, name) in zip(row, ys):
            legend = _mean_sd_lines(ax, s, x, y, "label", pal)
            ax.set(title=title, xlabel=xlabel, ylabel=name)
    return legend


def _unique_markers(n: int) -> list:
    """seaborn's markers for ``n`` style levels (``seaborn._base.unique_markers``)."""
    markers: list = ["o", "X", (4, 0, 45), "P", (4, 0, 0), (4, 1, 0), "^", (4, 1, 45), "v"]
    sides = 5
    while len(markers) < n:
        a = 360 / (sides + 1) / 2
        markers.extend([(sides + 1, 1, a), (sides + 1, 0, a), (sides, 1, 0), (sides, 0, 0)])
        sides += 1
    return markers[:n]


def _styled_points(
    ax, data, x: str, y: str, hue: str, pal: dict, style: str, styles: list, s: float = 60
) -> dict:
    """What ``seaborn.scatterplot(data=data, x=x, y=y, hue=hue, hue_order=list(pal), palette=pal,
    style=style, style_order=styles, s=s)`` draws, drawn directly: one collection, a point per
    row in the data's order, coloured by ``hue``, its marker by ``style`` (seaborn's), white edges
    0.08·√s wide. Returns seaborn's legend for it (none when no point is drawn): a heading named
    ``hue`` (blank marker), its levels, a heading named ``style``, its levels."""
    d = data[[x, y, hue, style]].dropna()
    if d.empty:
        return {}
    markers = dict(zip(styles, _unique_markers(len(styles))))
    first, lw = markers[styles[0]], 0.08 * np.sqrt(s)
    colors = [pal[v] for v in d[hue]]
    xy = d[x].astype(float), d[y].astype(float)
    points = ax.scatter(*xy, s=s, marker=first, facecolors=colors, edgecolors="w", linewidths=lw)
    paths = {}
    for level, marker in markers.items():
        ms = MarkerStyle(marker)
        paths[level] = ms.get_path().transformed(ms.get_transform())
    points.set_paths([paths[v] for v in d[style]])
    dot = {"linestyle": "", "markersize": np.sqrt(s), "markeredgewidth": lw, "markeredgecolor": "w"}
    blank = {"linestyle": "", "marker": "", "markersize": 0.0, "markerfacecolor": "w",
             "markeredgewidth": 0, "color": "w", "markeredgecolor": "w"}  # fmt: skip
    pairs = [(hue, Line2D([], [], **blank)),
             *((v, Line2D([], [], marker=first, markerfacecolor=c, color=c, **dot))
               for v, c in pal.items()),
             (style, Line2D([], [], **blank)),
             *((v, Line2D([], [], marker=m, markerfacecolor=".2", color=".2", **dot))
               for v, m in markers.items())]  # fmt: skip
    legend: dict = {}
    for label, handle in pairs:
        legend.setdefault(label, handle)
    return legend


def _tau(d: pd.DataFrame) -> pd.DataFrame:
    if "hp_tau" not in d:
        return d.iloc[0:0].assign(tau=[])
    d = d[d["method"] == SIGMA_METHOD]
    return d.assign(tau=pd.to_numeric(d["hp_tau"], errors="coerce"))


def _m_text(m: float) -> str:
    return f"M={m_text(m, '?')}"


def _bars(ax, data: pd.DataFrame, x: str, y: str, pal: dict, hue_order: list[str]) -> None:
    """Mean ± sd bars of ``y`` per ``x`` category, dodged by ``label`` in ``hue_order``: what
    ``seaborn.barplot(errorbar="sd")`` draws (its geometry, 0.75 saturation, error-bar colour
    and width, categorical axis), drawn directly — seaborn's per-bar overhead was most of a
    1,000-configuration report's figure time."""
    cats = list(data[x].dropna().unique())  # seaborn's categorical order: first appearance
    stats = data.groupby([x, "label"], sort=False)[y].agg(["mean", "std"])
    n = max(1, len(hue_order))
    width = 0.8 / n
    lw = 1.5 * mpl.rcParams["lines.linewidth"]
    errs = []  # every error bar, in drawing order, in one collection: the same pixels, cheaper
    for j, label in enumerate(hue_order):
        rows = [(i, stats.loc[(c, label)]) for i, c in enumerate(cats) if (c, label) in stats.index]
        if not rows:
            continue
        left = np.array([i - 0.4 + j * width for i, _ in rows])
        mean = np.array([r["mean"] for _, r in rows])
        sd = np.array([r["std"] for _, r in rows])
        color = _desaturate(pal[label], 0.75)
        ax.bar(left, mean, width=width, align="edge", color=color, label=label)
        ok = np.isfinite(sd)
        errs.append((left[ok] + width / 2, (mean - sd)[ok], (mean + sd)[ok]))
    if errs:
        segments = map(np.concatenate, zip(*errs))  # round caps: seaborn's lines (whitegrid rc)
        ax.vlines(*segments, colors=".26", linewidth=lw, capstyle="round")
    ax.set_xticks(range(len(cats)), cats)
    ax.xaxis.grid(False)
    ax.set_xlim(-0.5, len(cats) - 0.5)
