"""Reliability diagrams (Guo et al., 2017) with each bin's count: the leaderboard's
``fig-reliability`` (:data:`reports.figures.draw.FIGURES`).

One panel per configuration, seeds pooled by adding their bins (``rel/<view>/<stat>/<bin>``
sums of :func:`reports.records.flatten.calibration_columns`): accuracy against mean confidence
for the members (pooled), the ensemble and the ensemble after temperature scaling, drawn with
matplotlib (ratios of summed bins, no statistic for seaborn to compute), and under each diagram
a strip with the number of test images in each bin, so that a point standing for one image is
not read as a failure of calibration.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from reports.figures.base import _done, _figure_legend, _style

#: How each reliability view is drawn: (label, colour, line style, marker).
_RELIABILITY_VIEWS = (
    ("members", "members (pooled), raw", "0.55", ":", "."),
    ("raw", "ensemble, raw", "C0", "-", "o"),
    ("ts", "ensemble, temperature-scaled", "C3", "--", "s"),
)
_MAX_RELIABILITY_PANELS = 24


def _rel_columns(d: pd.DataFrame) -> list[str]:
    return [c for c in d.columns if c.startswith("rel/")]


#: The gid of each panel's count strip (tests find it by this).
COUNT_STRIP = "reliability-counts"


def _count_strip(ax, count: np.ndarray) -> None:
    """Under a reliability diagram: the number of test images in each bin (seeds pooled), as
    bars with the count written above each non-empty one, so that a bin of one image is not
    read as a failure of calibration."""
    n = len(count)
    centers = (np.arange(n) + 0.5) / n
    ax.bar(centers, count, width=1 / n, color="C0", alpha=0.35, edgecolor="C0", lw=0.5)
    top = float(count.max()) if len(count) and count.max() > 0 else 1.0
    for x, c in zip(centers, count):
        if c > 0:
            ax.text(x, c + 0.04 * top, f"{int(c)}", ha="center", va="bottom", fontsize=5.5,
                    rotation=90 if c >= 1000 else 0)  # fmt: skip
    ax.set(xlim=(0, 1), ylim=(0, 1.45 * top), xlabel="confidence", ylabel="images")
    ax.set_yticks([])
    ax.set_gid(COUNT_STRIP)


def reliability(cells: pd.DataFrame) -> Figure | None:
    """Reliability diagrams (Guo et al., 2017): accuracy vs mean confidence in each of the 15
    equal-width bins, one panel per configuration (seeds pooled by adding their bins), for the
    members (pooled), the ensemble, and the ensemble after temperature scaling. Bins with no
    sample are not drawn; the diagonal is perfect calibration. Under each diagram, a strip with
    the number of test images in each of the ensemble's raw bins (:func:`_count_strip`)."""
    d = _done(cells)
    bins = [f"{i:02d}" for i in range(15)]
    if not any(f"rel/raw/count/{b}" in d for b in bins):
        return None
    d = d.loc[d[f"rel/raw/count/{bins[0]}"].notna(), ["setting", "label", *_rel_columns(d)]]
    if d.empty:
        return None
    # A panel is 3 inches wide: the configuration wrapped to its width (a σN-Ens label with its
    # hyper-parameters ran into the next panel's title), then the dataset/backbone.
    wrap = d["label"].map(lambda s: "\n".join(textwrap.wrap(s, 40, break_on_hyphens=False)))
    d = d.assign(panel=wrap + "\n" + d["setting"])
    panels = list(d.groupby("panel", sort=True))[:_MAX_RELIABILITY_PANELS]
    per_row = min(4, len(panels))
    nrows = -(-len(panels) // per_row)
    with _style():
        fig = Figure(figsize=(3.0 * per_row + 0.4, 3.8 * nrows + 0.3), layout="constrained")
        # Each panel: the diagram over its count strip (a quarter of its height).
        grid = fig.add_gridspec(2 * nrows, per_row, height_ratios=[3.0, 0.8] * nrows)
        axes = np.array([[fig.add_subplot(grid[2 * (i // per_row) + k, i % per_row])
                          for k in (0, 1)] for i in range(nrows * per_row)])  # fmt: skip
        for ax in axes[len(panels) :].flat:
            ax.set_axis_off()
        for (ax, strip), (title, g) in zip(axes, panels):
            ax.plot([0, 1], [0, 1], color="0.3", lw=0.8, ls="-", label="perfect calibration")
            for view, label, color, ls, marker in _RELIABILITY_VIEWS:
                cols = [
                    f"rel/{view}/{stat}/{b}" for stat in ("count", "conf", "correct") for b in bins
                ]
                if not all(c in g for c in cols) or g[cols[0]].isna().all():
                    continue
                count = np.array([g[f"rel/{view}/count/{b}"].sum() for b in bins])
                conf = np.array([g[f"rel/{view}/conf/{b}"].sum() for b in bins])
                correct = np.array([g[f"rel/{view}/correct/{b}"].sum() for b in bins])
                keep = count > 0
                ax.plot(
                    conf[keep] / count[keep],
                    correct[keep] / count[keep],
                    color=color,
                    ls=ls,
                    marker=marker,
                    ms=3,
                    lw=1.2,
                    label=label,
                )
                if view == "raw":
                    _count_strip(strip, count)
            ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
            ax.tick_params(labelbottom=False)
            ax.set_title(title, fontsize=8)
            ax.set_aspect("equal")
        _figure_legend(fig, axes[:, 0])
        return fig
