"""Shared plumbing of the leaderboard's figures: style, labels, panel grids, legend, PNG encoding.

Figures are built on :class:`matplotlib.figure.Figure` objects (Agg, no pyplot state); a ``$`` in
labels taken from config values is escaped, so they are drawn literally, never as math text.
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from reports.columns import m_text

log = logging.getLogger("reports.figures")

SIGMA_METHOD = "sigma_ens"
MAX_SETTINGS = 8  # (dataset, backbone) settings per figure
MAX_PANELS_PER_ROW = 4


@contextmanager
def _style() -> Iterator[None]:
    with sns.axes_style("whitegrid"), mpl.rc_context({"font.size": 9}):
        yield


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


def _figure_legend(fig: Figure, axes: Iterable) -> None:
    """One legend for the whole figure, below the panels, entries merged from every panel.

    Below, not to the right: a configuration's label can be 100 characters long, and a legend
    beside the panels took the width from them (titles ran into the next panel). The figure
    grows by the legend's rows, in as many columns as the longest label allows; panel titles
    are set a little smaller than matplotlib's default for the same reason.
    """
    entries: dict[str, object] = {}
    axes = list(axes)
    for ax in axes:
        ax.title.set_fontsize(9)
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
    colors = sns.color_palette("tab10" if len(uniq) <= 10 else "husl", len(uniq))
    return dict(zip(uniq, colors))


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


def _lines(panels, settings, x: str, ys, pal, xlabel: str) -> None:
    for row, (title, s) in zip(panels, settings):
        for ax, (y, name) in zip(row, ys):
            sns.lineplot(
                data=s,
                x=x,
                y=y,
                hue="label",
                hue_order=list(pal),
                palette=pal,
                marker="o",
                errorbar="sd",
                ax=ax,
            )
            ax.set(title=title, xlabel=xlabel, ylabel=name)


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
    for j, label in enumerate(hue_order):
        rows = [(i, stats.loc[(c, label)]) for i, c in enumerate(cats) if (c, label) in stats.index]
        if not rows:
            continue
        left = np.array([i - 0.4 + j * width for i, _ in rows])
        mean = np.array([r["mean"] for _, r in rows])
        sd = np.array([r["std"] for _, r in rows])
        color = sns.desaturate(pal[label], 0.75)
        ax.bar(left, mean, width=width, align="edge", color=color, label=label)
        ok = np.isfinite(sd)
        ax.vlines(
            left[ok] + width / 2, (mean - sd)[ok], (mean + sd)[ok], colors=".26", linewidth=lw
        )
    ax.set_xticks(range(len(cats)), cats)
    ax.xaxis.grid(False)
    ax.set_xlim(-0.5, len(cats) - 0.5)
