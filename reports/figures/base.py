"""Shared plumbing of the leaderboard's figures: style, labels, panel grids, legend, PNG encoding,
and which configurations a figure draws (:func:`figure_cells`).

Figures are drawn with seaborn on :class:`matplotlib.figure.Figure` objects (Agg, no pyplot
state); a ``$`` in labels taken from config values is escaped, so they are drawn literally, never
as math text.
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from harness.registry.core import Registry
from reports.columns import m_text, without_ensemble_only
from reports.figures.colors import DASHES, HATCHES, MARKERS, RGB, config_styles

log = logging.getLogger("reports.figures.draw")

SIGMA_METHOD = "sigma_ens"
MAX_SETTINGS = 8  # (dataset, backbone) settings per figure
MAX_PANELS_PER_ROW = 4


@contextmanager
def _style() -> Iterator[None]:
    """seaborn's whitegrid style, 9 pt text, and titles at the top of their axes: matplotlib would
    re-place every title at each draw, measuring the x axis's tick labels first — a second of CPU
    over a report's figures at 1,000 configurations — and move none: only a y-axis offset text
    can be above an axes here, and :func:`_titles` gives matplotlib's placement back to the axes
    that may show one."""
    with sns.axes_style("whitegrid"), mpl.rc_context({"font.size": 9, "axes.titley": 1.0}):
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
    """The done cells, labelled, without the scores a single model cannot have (its MI-AUROC,
    disagreement: :func:`reports.columns.without_ensemble_only`), so no figure draws them."""
    d = cells[cells["status"] == "done"] if "status" in cells else cells
    d = without_ensemble_only(d)
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


def _styles(labels: Iterable[str], methods: Iterable[str]) -> dict[str, tuple[RGB, int]]:
    """:func:`reports.figures.colors.config_styles` of ``labels`` and their ``methods`` (two
    series of one frame, row by row)."""
    return config_styles(dict(zip(labels, methods, strict=True)))


def _hatch_bars(ax, styles: dict[str, tuple[RGB, int]], order: Sequence[str]) -> None:
    """Bars of one method's second, third, … configuration hatched (:data:`HATCHES`), in the
    bars and in the legend: the colour says the method, the hatch the configuration. Bars are
    seaborn's containers, one per hue level of ``order``."""
    hatch = {label: HATCHES[styles[label][1] % len(HATCHES)] for label in order}
    for container, label in zip(ax.containers, order, strict=False):
        for bar in container.patches:
            bar.set_hatch(hatch[label])
            bar.set_edgecolor("white")
    handles, names = ax.get_legend_handles_labels()
    for handle, name in zip(handles, names, strict=True):
        if name in hatch and hasattr(handle, "set_hatch"):
            handle.set_hatch(hatch[name])
            handle.set_edgecolor("white")
    if ax.get_legend() is not None:  # the figure's legend is made from the handles above
        ax.get_legend().remove()


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


def line_style(styles: dict[str, tuple[RGB, int]], drawn: Iterable[str]) -> dict:
    """seaborn ``lineplot`` keyword arguments for the ``drawn`` labels (hue and style both the
    ``label`` column): its method's colour, and the dashes and marker of its rank among that
    method's labels (``styles``: :func:`_styles`)."""
    drawn = set(drawn)
    order = [label for label in styles if label in drawn]
    return {
        "hue": "label", "hue_order": order, "style": "label", "style_order": order,
        "palette": {label: styles[label][0] for label in order},
        "dashes": {label: DASHES[styles[label][1] % len(DASHES)] for label in order},
        "markers": {label: MARKERS[styles[label][1] % len(MARKERS)] for label in order},
    }  # fmt: skip


def _lines(panels, settings, x: str, ys, styles: dict[str, tuple[RGB, int]], xlabel: str) -> None:
    """Per panel, the mean of each y over the seeds per ``x``, one line per label with its ± sd
    band (seaborn's lineplot), styled by :func:`line_style`."""
    for row, (title, s) in zip(panels, settings):
        for ax, (y, name) in zip(row, ys):
            sns.lineplot(data=s, x=x, y=y, errorbar="sd", ax=ax,
                         **line_style(styles, s["label"]))  # fmt: skip
            ax.set(title=title, xlabel=xlabel, ylabel=name)


def _tau(d: pd.DataFrame) -> pd.DataFrame:
    if "hp_tau" not in d:
        return d.iloc[0:0].assign(tau=[])
    d = d[d["method"] == SIGMA_METHOD]
    return d.assign(tau=pd.to_numeric(d["hp_tau"], errors="coerce"))


def _m_text(m: float) -> str:
    return f"M={m_text(m, '?')}"


# Which configurations the figures draw when a study has too many for a readable legend: a
# figure with one line or bar per configuration is unreadable past a few dozen (a 1,000-entry
# legend). Above MAX_CONFIGS configurations, the figures draw, per dataset, backbone, method, M
# and variant, the one hyper-parameter setting with the lowest mean validation NLL (the test NLL
# where no cell has a validation split) — the setting a practitioner would pick, as in
# :mod:`reports.render.tables` — and say so in their caption. The tables keep every one.
MAX_CONFIGS = 24
SWEEPS = ("fig-tau-frontier", "fig-keff")  # drawn along τ: one point per setting, no legend
_SWEEP = ["dataset", "backbone", "method", "M", "variant"]
_CONFIG = [*_SWEEP, "hparams"]


def figure_cells(cells: pd.DataFrame, figure: str = "") -> tuple[pd.DataFrame, str]:
    """(the cells ``figure`` draws, a caption note; empty when every configuration is drawn).

    The τ figures (:data:`SWEEPS`) always draw every setting: their points are the sweep."""
    keys = [k for k in _CONFIG if k in cells]
    if cells.empty or len(keys) < len(_CONFIG) or figure in SWEEPS:
        return cells, ""
    done = cells[cells["status"] == "done"] if "status" in cells else cells
    n_configs = len(done.groupby(keys, dropna=False)) if len(done) else 0
    if n_configs <= MAX_CONFIGS:
        return cells, ""
    metric = "val_nll" if "val_nll" in done and done["val_nll"].notna().any() else "nll"
    means = done.groupby(keys, dropna=False)[metric].mean().reset_index()
    means = means.sort_values(metric, kind="stable", na_position="last")
    chosen = means.drop_duplicates(_SWEEP, keep="first")[keys]
    kept = cells.merge(chosen, on=keys, how="inner")
    note = (
        f" {n_configs} configurations: drawn is the hyper-parameter setting with the lowest "
        f"mean {'validation' if metric == 'val_nll' else 'test'} NLL per dataset, backbone, "
        f"method, M and variant ({len(chosen)} of them); every configuration is in the tables."
    )
    return kept, note


@dataclass(frozen=True)
class RenderedFigure:
    """One figure for the page, and its matplotlib figure for the files."""

    id: str
    title: str
    caption: str
    png: str | None  # base64 PNG, or None when skipped
    note: str = ""  # why it was skipped
    figure: Figure | None = field(default=None, repr=False, compare=False)  # for the files


@dataclass(frozen=True)
class FigureSpec:
    """A figure of the leaderboard page.

    Attributes:
        id: its anchor on the page and its file name (``fig-…``).
        title, caption: shown above and below it.
        needs: what the results must hold for it, shown when it is skipped.
        draw: ``draw(cells) -> Figure | None`` from the reporter's per-cell frame (None: nothing
            to draw).
        sweep: one point per setting, so every configuration is drawn (not only the ones
            :func:`figure_cells` keeps).
    """

    id: str
    title: str
    caption: str
    needs: str
    draw: Callable[[pd.DataFrame], Figure | None]
    sweep: bool = False


#: The page's figures by id, in registration order (the built-ins of
#: :mod:`reports.figures.draw`, then a ``--plugin`` module's or an installed distribution's in
#: the entry-point group ``harness.figures``): the registry type methods use.
FIGURES: Registry[FigureSpec] = Registry(
    "figure", group="harness.figures", modules=("reports.figures.draw",)
)


def register_figure(spec: FigureSpec) -> FigureSpec:
    """Add ``spec`` to the page (what a plugin module calls at import). Raises
    ``DuplicateNameError`` when its id is taken."""
    FIGURES.load_modules()  # the built-ins first on the page, whichever module is imported first
    return FIGURES.register(spec.id, spec)
