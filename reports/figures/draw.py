"""The leaderboard's figures: embedded in the page as PNG, written as PNG (and, for a paper, PDF).

Each draw function returns a :class:`~matplotlib.figure.Figure`, or None when its data is absent;
:func:`render_figures` encodes every figure as a base64 PNG for the page and keeps the figure so
:func:`write_figure_files` can save it as ``<id>.png`` and, for a paper, ``<id>.pdf``.

Every figure function takes the per-cell frame of :func:`reports.records.results.records_to_frame`
(done cells are used, failed ones ignored), aggregates over seeds itself (error bars are the
sample std over seeds), and draws its panels once per (dataset, backbone) with one legend.
Lines, bars and scatter plots are seaborn's (``lineplot``/``barplot``/``scatterplot`` with
``errorbar="sd"``); the τ frontier (a colour scale with its colour bar) and the reliability
diagrams (ratios of summed bins, no statistic for seaborn to compute; their own module,
:mod:`reports.figures.reliability`) are drawn with matplotlib.
Figures are built on :class:`matplotlib.figure.Figure` objects (Agg, no pyplot state); a ``$``
in labels taken from config values is escaped, so they are drawn literally, never as math text.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from reports.columns import declared_diagnostics, format_number
from reports.figures.base import (
    FIGURES,
    FigureSpec,
    RenderedFigure,
    _done,
    _figure_legend,
    _finite,
    _hatch_bars,
    _labels,
    _lines,
    _literal,
    _m_text,
    _panels,
    _png,
    _settings,
    _style,
    _styles,
    _tau,
    line_style,
    pareto_front,
    register_figure,
)
from reports.figures.colors import method_color
from reports.figures.reliability import reliability

log = logging.getLogger(__name__)


def tau_frontier(cells: pd.DataFrame) -> Figure | None:
    """σN-Ens accuracy vs ECE, one point per τ (mean over seeds), with the Pareto front per M."""
    d = _finite(_tau(_done(cells)), "tau", "acc", "ece")
    if d["tau"].nunique() < 2:
        return None
    pts = (
        d.groupby(["setting", "M", "hparams"], dropna=False)
        .agg(
            tau=("tau", "first"),
            acc=("acc", "mean"),
            ece=("ece", "mean"),
            acc_sd=("acc", "std"),
            ece_sd=("ece", "std"),
        )
        .reset_index()
    )
    taus = pts["tau"]
    norm = (
        LogNorm(taus.min(), taus.max()) if (taus > 0).all() else Normalize(taus.min(), taus.max())
    )
    settings = _settings(pts)
    with _style():
        fig, panels = _panels(len(settings), 1, width=5.0, height=4.0)
        sc = None
        for (ax,), (title, p) in zip(panels, settings):
            for i, (M, pm) in enumerate(p.groupby("M", dropna=False)):
                x, y = 100 * pm["ece"], 100 * pm["acc"]
                ax.errorbar(
                    x,
                    y,
                    xerr=100 * pm["ece_sd"].fillna(0),
                    yerr=100 * pm["acc_sd"].fillna(0),
                    fmt="none",
                    ecolor="0.75",
                    elinewidth=0.8,
                    zorder=1,
                )
                sc = ax.scatter(
                    x,
                    y,
                    c=pm["tau"],
                    cmap="viridis",
                    norm=norm,
                    s=46,
                    zorder=3,
                    marker="os^Dv<>p"[i % 8],
                    edgecolors="k",
                    linewidths=0.4,
                    label=_m_text(M),
                )
                front = pm.iloc[pareto_front(pm["acc"], pm["ece"])]
                ax.plot(
                    100 * front["ece"],
                    100 * front["acc"],
                    "--",
                    color=f"C{i % 10}",
                    lw=1.2,
                    zorder=2,
                    label=f"Pareto front {_m_text(M)}",
                )
                for _, r in (pm if len(pm) <= 12 else front).iterrows():  # many τ: the front
                    ax.annotate(
                        f"τ={r['tau']:g}",
                        (100 * r["ece"], 100 * r["acc"]),
                        fontsize=6.5,
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
            ax.set(title=title, xlabel="ECE (%)  ↓ better", ylabel="Accuracy (%)  ↑ better")
        axes = [row[0] for row in panels]
        fig.colorbar(sc, ax=axes, label="τ", shrink=0.8)
        _figure_legend(fig, axes)
        return fig


def quality_vs_members(cells: pd.DataFrame) -> Figure | None:
    """Accuracy and NLL vs ensemble size M, one line per method (and hparams)."""
    d = _finite(_done(cells), "M", "acc", "nll")
    if d.empty:
        return None
    d = d.assign(label=_labels(d, with_m=False), acc100=100 * d["acc"])
    if d.groupby("label")["M"].nunique().max() < 2:
        return None
    settings = _settings(d)
    ys = (("acc100", "Accuracy (%)  ↑"), ("nll", "NLL  ↓"))
    with _style():
        fig, panels = _panels(len(settings), 2)
        _lines(panels, settings, "M", ys, _styles(d["label"], d["method"]), "ensemble size M")
        ms = sorted(d["M"].unique())
        for ax in (ax for row in panels for ax in row):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ms, [f"{m:g}" for m in ms])
            ax.minorticks_off()
        _figure_legend(fig, (ax for row in panels for ax in row))
        return fig


def corruption_severity(cells: pd.DataFrame) -> Figure | None:
    """Accuracy and ECE vs corruption severity (0 = clean), one line per configuration."""
    d = _done(cells)
    rows = []
    for s in range(6):
        acc, ece = ("acc", "ece") if s == 0 else (f"sev{s}_acc", f"sev{s}_ece")
        if acc in d and ece in d:
            part = d[["setting", "label", "method", acc, ece]].set_axis(
                ["setting", "label", "method", "acc", "ece"], axis=1
            )
            rows.append(part.assign(severity=s))
    if len(rows) < 2:
        return None
    long = _finite(pd.concat(rows, ignore_index=True), "acc", "ece")
    if long.empty or long["severity"].max() < 1:
        return None
    long = long.assign(acc100=100 * long["acc"], ece100=100 * long["ece"])
    settings = _settings(long)
    ys = (("acc100", "Accuracy (%)  ↑"), ("ece100", "ECE (%)  ↓"))
    with _style():
        fig, panels = _panels(len(settings), 2)
        styles = _styles(long["label"], long["method"])
        _lines(panels, settings, "severity", ys, styles, "corruption severity")
        for ax in (ax for row in panels for ax in row):
            ax.set_xticks(range(6), ["clean", "1", "2", "3", "4", "5"])
        _figure_legend(fig, (ax for row in panels for ax in row))
        return fig


def ood_auroc(cells: pd.DataFrame) -> Figure | None:
    """OOD AUROC (ID positive) per configuration and OOD set; a panel per score (MSP, ...)."""
    d = _done(cells)
    cols = [c for c in d.columns if c.startswith("ood/") and c.endswith("/auroc")]
    if not cols:
        return None
    long = d.melt(
        id_vars=["setting", "label", "method"], value_vars=cols, var_name="col", value_name="auroc"
    )
    long = _finite(long, "auroc")
    if long.empty:
        return None
    parts = long["col"].str.split("/")
    long = long.assign(
        ood_set=_literal(parts.str[1]), score=_literal(parts.str[2]), auroc100=100 * long["auroc"]
    )
    order = {"msp": 0, "entropy": 1, "mi": 2}
    scores = sorted(long["score"].unique(), key=lambda s: (order.get(s, 9), s))
    styles = _styles(long["label"], long["method"])
    pal = {label: colour for label, (colour, _) in styles.items()}
    settings = _settings(long)
    with _style():
        fig, panels = _panels(len(settings), len(scores), width=4.0)
        for row, (title, s) in zip(panels, settings):
            for ax, score in zip(row, scores):
                sc = s[s["score"] == score]
                if sc.empty:
                    ax.set_axis_off()
                    continue
                drawn = set(sc["label"])
                order = [h for h in pal if h in drawn]
                sns.barplot(data=sc, x="ood_set", y="auroc100", hue="label", hue_order=order,
                            palette=pal, saturation=1, errorbar="sd", ax=ax)  # fmt: skip
                _hatch_bars(ax, styles, order)
                ax.axhline(50, ls=":", color="0.4", lw=1)
                ax.set_ylim(max(0.0, sc["auroc100"].min() - 10), 100)
                ax.set(title=f"{title} · {score}", xlabel="OOD set", ylabel="AUROC (%)  ↑")
        _figure_legend(fig, (ax for row in panels for ax in row))
        return fig


def quality_vs_cost(cells: pd.DataFrame) -> Figure | None:
    """Accuracy vs parameters and vs eval throughput, one point per configuration."""
    d = _finite(_done(cells), "acc")
    costs = [
        (c, n)
        for c, n in (("params", "parameters  ↓"), ("eval_ips", "eval images/s  ↑"))
        if c in d and np.isfinite(d[c].astype(float)).any()
    ]
    if d.empty or not costs:
        return None
    agg = {"acc": ("acc", "mean"), **{c: (c, "mean") for c, _ in costs}}
    pts = d.groupby(["setting", "method", "M", "hparams"], dropna=False).agg(**agg).reset_index()
    pal = {lit: method_color(m) for m, lit in sorted(zip(pts["method"], _literal(pts["method"])))}
    pts = pts.assign(
        acc100=100 * pts["acc"], size=pts["M"].map(_m_text), method=_literal(pts["method"])
    )
    sizes = [_m_text(m) for m in sorted(pts["M"].unique())]
    settings = _settings(pts)
    with _style():
        fig, panels = _panels(len(settings), len(costs))
        for row, (title, s) in zip(panels, settings):
            for ax, (c, name) in zip(row, costs):
                sc = _finite(s, c)
                if len(sc):
                    sns.scatterplot(data=sc, x=c, y="acc100", hue="method", hue_order=list(pal),
                                    palette=pal, style="size", style_order=sizes, s=60,
                                    ax=ax)  # fmt: skip
                if len(sc) and (sc[c] > 0).all():
                    ax.set_xscale("log")
                    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                    ax.xaxis.set_major_formatter(
                        FuncFormatter(lambda v, _: format_number(v, "count"))
                    )
                    ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set(title=title, xlabel=name, ylabel="Accuracy (%)  ↑")
        _figure_legend(fig, (ax for row in panels for ax in row))
        return fig


#: The training-curves panels: (column key, axis label, scale to show).
_CURVES = (
    ("val_acc", "Validation accuracy (%)  ↑", 100.0),
    ("val_nll", "Validation NLL  ↓", 1.0),
    ("k_eff", "k_eff on σ(γ)", 1.0),
)


def training_curves(cells: pd.DataFrame) -> Figure | None:
    """Validation accuracy and NLL, and σN-Ens's k_eff, after every epoch: one line per
    configuration (mean ± std over seeds). Where a schedule has flattened (the plateau)."""
    from reports.records.flatten import SINGLE_TS

    d = _done(cells)
    d = d[d["method"] != SINGLE_TS]  # the derived row repeats single's training
    cols = [c for c in d.columns if c.startswith("curve/")]
    if d.empty or not cols:
        return None
    long = d[["setting", "label", "method", "seed", *cols]].melt(
        id_vars=["setting", "label", "method", "seed"], var_name="column", value_name="value"
    )
    long = long[np.isfinite(pd.to_numeric(long["value"], errors="coerce"))]
    parts = long["column"].str.split("/", expand=True)
    long = long.assign(key=parts[1], epoch=parts[2].astype(int))
    shown = [c for c in _CURVES if c[0] in set(long["key"])]
    if long["epoch"].nunique() < 2 or not shown:
        return None
    wide = long.pivot_table(
        index=["setting", "label", "method", "seed", "epoch"], columns="key", values="value"
    ).reset_index()
    for key, _, scale in shown:
        wide[key] = wide[key] * scale
    settings = _settings(wide)
    ys = [(key, name) for key, name, _ in shown]
    styles = _styles(wide["label"], wide["method"])  # the method's colour in every panel
    with _style():
        fig, panels = _panels(len(settings), len(ys))
        for row, (title, s) in zip(panels, settings):
            for ax, (y, name) in zip(row, ys):
                part = s[s[y].notna()]
                sns.lineplot(data=part, x="epoch", y=y, errorbar="sd", ax=ax,
                             **line_style(styles, part["label"]))  # fmt: skip
                ax.set(title=title, xlabel="epoch", ylabel=name)
        _figure_legend(fig, (ax for row in panels for ax in row))
        return fig


# The built-in figures, in the page's order (plugins' follow): reports.figures.base.FIGURES.
for _spec in (
    FigureSpec(
        "fig-tau-frontier",
        "Accuracy vs calibration across τ (σN-Ens)",
        "Mean over seeds per τ (bars: std); dashed: the Pareto front (higher accuracy, "
        "lower ECE) per M.",
        "σN-Ens (sigma_ens) cells at two or more values of τ",
        tau_frontier,
    ),
    FigureSpec(
        "fig-quality-vs-m",
        "Quality vs ensemble size M",
        "Mean ± std over seeds, per method and hyper-parameters.",
        "a method run at two or more values of M",
        quality_vs_members,
    ),
    FigureSpec(
        "fig-corruption",
        "Accuracy and ECE vs corruption severity",
        "Severity 0 is the clean test set; mean over corruptions, ± std over seeds.",
        "corruption results (metrics.corruption.per_severity)",
        corruption_severity,
    ),
    FigureSpec(
        "fig-ood",
        "OOD detection AUROC per method and OOD set",
        "ID is the positive class; dotted line: chance (50%). Bars: mean ± std over seeds.",
        "OOD results (metrics.ood)",
        ood_auroc,
    ),
    FigureSpec(
        "fig-cost",
        "Quality vs cost",
        "One point per configuration (mean over seeds).",
        "accuracy with parameter counts or eval throughput",
        quality_vs_cost,
    ),
    FigureSpec(
        "fig-curves",
        "Training curves: validation metrics and k_eff after every epoch",
        "Measured on the validation split after each epoch (never the test set); mean ± std "
        "over seeds. k_eff: σN-Ens's sharing on σ(γ) (4 = every member uses every feature).",
        "per-epoch validation metrics (recipe.validation) or σN-Ens's per-epoch k_eff",
        training_curves,
    ),
    FigureSpec(
        "fig-reliability",
        "Reliability diagrams: members and ensemble, raw and temperature-scaled",
        "Accuracy vs mean confidence per equal-width bin (15 bins, the ECE's), seeds pooled; "
        "the diagonal is perfect calibration. Under each diagram: the number of test images in "
        "each bin (the ensemble's raw confidence, seeds added), so that a point standing for a "
        "handful of images reads as such. Temperature scaling is fitted on held-out images, "
        "never the test set.",
        "reliability bins (metrics.clean.reliability)",
        reliability,
    ),
):
    register_figure(_spec)


def render_one(spec: FigureSpec, cells: pd.DataFrame) -> RenderedFigure:
    """One figure (skipped or failed: why in ``note``), of the cells :func:`figure_cells` gives
    it (a sweep figure: every cell)."""
    from reports.figures.base import figure_cells

    fig = None
    data, restricted = (cells, "") if spec.sweep else figure_cells(cells, spec.id)
    try:
        with _style():
            fig = spec.draw(data) if len(data) else None
            png = _png(fig) if fig is not None else None
            if fig is not None:  # laid out once, for the PNG: the PDF keeps that layout
                fig.set_layout_engine("none")  # (a third of its cost at 1,000 configurations)
        note = "" if png else f"skipped: needs {spec.needs}"
    except Exception as e:  # one broken plot must not cost the whole report; it is shown
        first = (str(e).strip().splitlines() or [""])[0][:300]
        fn = spec.draw
        drawn_by = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
        # One line on the terminal (and the page's note), not a traceback: the rest of the
        # report is still made. The traceback goes to the DEBUG level, for whoever enables it.
        log.warning(
            "figure %s (%s) failed: %s: %s; the rest of the report is made without it",
            spec.id, drawn_by, type(e).__name__, first,
        )  # fmt: skip
        log.debug("figure %s failed", spec.id, exc_info=True)
        fig, png, note = None, None, f"failed: {type(e).__name__}: {first}"
    return RenderedFigure(spec.id, spec.title, spec.caption + restricted, png, note, fig)


def render_figures(cells: pd.DataFrame) -> list[RenderedFigure]:
    """Every figure of :func:`figure_specs`, drawn; and, where records were written before
    methods declared their diagnostics, a note saying how to get the figures they declare."""
    out = [render_one(spec, cells) for spec in figure_specs(cells)]
    if note := undeclared_note(cells):
        out.append(RenderedFigure("fig-diagnostics", "Figures of the methods' diagnostics", "",
                                  None, note))  # fmt: skip
    return out


def undeclared_note(cells: pd.DataFrame) -> str:
    """Why a diagnostic's figure (σN-Ens's k_eff vs τ) is absent: done records that keep
    per-epoch diagnostics but no declarations (an older harness wrote them); empty otherwise."""
    from reports.records.flatten import UNDECLARED

    if UNDECLARED not in cells or cells.empty:
        return ""
    done = cells[cells["status"] == "done"] if "status" in cells else cells
    n = int((done[UNDECLARED] == "undeclared").sum())
    if not n:
        return ""
    return (
        f"skipped: {n} record(s) keep per-epoch diagnostics without their methods' "
        "declarations (written by an older harness); `harness upgrade <results folder>` adds "
        "them, and the figures they declare (k_eff vs τ)"
    )


def figure_specs(cells: pd.DataFrame) -> list[FigureSpec]:
    """Every registered figure (:data:`reports.figures.base.FIGURES`: the built-ins, then the
    plugins') and a figure per diagnostic the records declare with one."""
    registered = [spec for _, spec in FIGURES.registered()]
    return [*registered, *(FigureSpec(*f, sweep=True) for f in declared_figures(cells))]


def write_figure_files(
    figures: Sequence[RenderedFigure], out_dir: Path, pdf: bool = False
) -> list[Path]:
    """Save every drawn figure as ``<id>.png`` (150 dpi) and, with ``pdf``, ``<id>.pdf`` (vector)
    in ``out_dir``.

    Returns the paths written, in figure order; skipped figures write nothing. File names are the
    figure ids, so a paper's ``\\includegraphics{fig-ood}`` keeps working across reports. The PDFs
    are a paper's (``harness report --format latex``): a fifth of a report's time at 1,000
    records, for files a report refreshed during a study never needs. Without ``pdf``, a PDF an
    earlier report left for a figure drawn now is removed: it would show older data than its PNG.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for f in figures:
        if f.figure is None:
            continue
        path = out_dir / f"{f.id}.png"
        path.write_bytes(base64.b64decode(f.png))  # the page's PNG, drawn once at 150 dpi
        written.append(path)
        path = out_dir / f"{f.id}.pdf"
        if not pdf:
            path.unlink(missing_ok=True)
            continue
        with _style():
            # No timestamps in the metadata: identical data give identical files.
            f.figure.savefig(path, format="pdf", metadata={"CreationDate": None})
            written.append(path)
    return written


# The figures a method declares for its diagnostics (``Diagnostic.figure``, read from the
# records by :func:`reports.columns.declared_diagnostics`): the diagnostic against a
# hyper-parameter, per M. The reporter names no method: title, axes and reference lines are the
# declaration's.


def _text(label: object) -> str:
    """A declared label drawn literally: a ``$`` would start matplotlib math text."""
    return str(label).replace("$", r"\$")


def diagnostic_vs_hparam(cells: pd.DataFrame, declared: dict) -> Figure | None:
    """A declared diagnostic (its column) against the hyper-parameter its figure names, one line
    per M (± std over seeds), with the declared reference lines ("M": each ensemble size)."""
    fig_spec, column = declared["figure"], str(declared.get("column") or declared["key"])
    x = str(fig_spec["x"])
    if f"hp_{x}" not in cells or column not in cells:
        return None
    d = _done(cells)
    d = _finite(d.assign(**{x: pd.to_numeric(d[f"hp_{x}"], errors="coerce")}), x, column)
    if d[x].nunique() < 2:
        return None
    d = d.assign(size=d["M"].map(_m_text))
    sizes = [_m_text(m) for m in sorted(d["M"].unique())]
    pal = dict(zip(sizes, sns.color_palette("tab10", len(sizes))))
    settings = _settings(d)
    with _style():
        fig, panels = _panels(len(settings), 1, width=4.6, height=3.4)
        for (ax,), (title, s) in zip(panels, settings):
            sns.lineplot(data=s, x=x, y=column, hue="size", hue_order=sizes, palette=pal,
                         marker="o", errorbar="sd", ax=ax)  # fmt: skip
            for ref in fig_spec.get("reference_lines") or ():
                for level in sorted(s["M"].dropna().unique()) if ref == "M" else [ref]:
                    ax.axhline(float(level), ls=":", color="0.5", lw=0.8)
            if (s[x] > 0).all():
                ax.set_xscale("log")
            ylabel = fig_spec.get("y_label") or declared.get("label") or column
            ax.set(title=title, xlabel=fig_spec.get("x_label") or x, ylabel=_text(ylabel))
        _figure_legend(fig, (row[0] for row in panels))
        return fig


def declared_figures(cells: pd.DataFrame) -> list[tuple[str, str, str, str, Callable]]:
    """``(id, title, caption, needs, draw)`` of a figure for each diagnostic the records declare
    with one (:class:`harness.contract.DiagnosticFigure`), for :class:`FigureSpec`."""
    return [
        (
            str(d["figure"]["id"]),
            str(d["figure"].get("title") or d["key"]),
            str(d["figure"].get("caption") or ""),
            f"{d.get('label') or d['key']} at two or more values of {d['figure']['x']}",
            lambda frame, d=d: diagnostic_vs_hparam(frame, d),
        )
        for d in declared_diagnostics(cells)
        if isinstance(d.get("figure"), dict) and d["figure"].get("x") and d["figure"].get("id")
    ]
