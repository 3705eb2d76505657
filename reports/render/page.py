"""The leaderboard page's context: header, rows and cells, column picker, interval view, notes.

Everything the Jinja2 template shows is computed here; the template only lays it out. A metric cell
carries both texts, ``mean ± std`` and ``mean ± 95% CI half-width``; the page's interval toggle
swaps them and the report's ``interval`` option picks the default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from markupsafe import Markup, escape

from reports.columns import (
    CALIBRATED_GROUP,
    COLLAPSE_NOTE,
    CORRUPTION,
    COST,
    THROUGHPUT,
    cell_text,
    collapsed,
    directions,
    iter_rows,
    leaderboard_columns,
    limit_text,
    limits_note,
    m_text,
    metric_columns,
    ood_score_labels,
    without_ensemble_only,
)
from reports.records.flatten import CONVENTION as OOD_GROUP_CONVENTION
from reports.records.flatten import SINGLE_TS
from reports.records.results import Results
from reports.render.paired import (
    PairedStats,
    bold_cells,
    group_key,
    paired_context,
    significance_marks,
    unbolded_note,
)
from reports.render.tables import corruption_table, selection_context
from reports.stats.bolding import config_key
from reports.stats.significance import TEST_NAMES, check_test

INTERVALS = ("std", "ci")
PAGE_SIZE = 100  # leaderboard rows per page (the filters still select among all rows)
AGGREGATION = (
    "cells that differ only in seed are one configuration; each cell shows the mean ± sample "
    "standard deviation (ddof=1) or ± the 95% t-interval half-width over its seeds and, in "
    "parentheses, n = the number of seeds with a finite value (NaN/inf from a diverged run are "
    "left out and counted in the n column); failed cells are listed below and not averaged"
)
IDENTITY = (
    ("dataset", "dataset", "text"),
    ("backbone", "backbone", "text"),
    ("method", "method", "text"),
    ("M", "M", "num"),
    ("hparams", "hparams", "text"),
    ("variant", "variant", "text"),
    ("n", "n", "num"),
)
GROUP_TITLES = {
    "OOD": "OOD detection (ID positive; near/far: OpenOOD means)",
    "Corruption": "Corruption (mean over corruptions × severities)",
}


@dataclass(frozen=True)
class ReportOptions:
    """How a report presents its statistics (CLI: ``harness report --interval/--test/--holm``).

    ``interval``: ``std`` (mean ± sample std) or ``ci`` (mean ± 95% t-interval half-width) as the
    default text of every cell (``latex_interval``: of the LaTeX tables, ``ci`` unless set);
    ``test``/``holm``: the paired test behind the marks and the bold
    cells; ``mce_baseline``: the method the mCE column is relative to.
    """

    interval: str = "std"
    test: str = "signflip"
    holm: bool = False
    mce_baseline: str | None = "single"
    latex_interval: str = "ci"  # a paper table shows the uncertainty of the mean

    def __post_init__(self) -> None:
        for value in (self.interval, self.latex_interval):
            if value not in INTERVALS:
                raise ValueError(f"unknown interval {value!r}; expected one of: std, ci")
        check_test(self.test)


def interval_words(interval: str) -> str:
    if interval == "ci":
        return "mean ± half-width of the 95% t-interval of the mean (t_{n−1,0.975}·s/√n)"
    return "mean ± sample std (ddof=1)"


def _n_text(row: pd.Series) -> str:
    extra = []
    if row.get("n_nonfinite", 0):
        extra.append(f"{int(row['n_nonfinite'])} diverged")
    if row.get("n_failed", 0):
        extra.append(f"{int(row['n_failed'])} failed")
    return f"{int(row['n'])}" + (f" ({', '.join(extra)})" if extra else "")


def _devices(summary: pd.DataFrame) -> str:
    """``cuda:0 NVIDIA H200, bf16`` or ``several: ...``: what the cost columns were measured on."""
    pairs = []
    blank = [""] * len(summary)  # two columns, not every row as a dict
    for dev, prec in zip(summary.get("cost_device", blank), summary.get("cost_precision", blank)):
        dev, prec = str(dev or ""), str(prec or "")
        pairs.append(", ".join(x for x in (dev, prec) if x) or "device not recorded")
    uniq = list(dict.fromkeys(pairs))
    return uniq[0] if len(uniq) == 1 else "several: " + " | ".join(uniq)


def _shared_note(row: pd.Series, key: str) -> str:
    """Why a throughput cell is greyed: some of its seeds measured on a shared device."""
    if key not in THROUGHPUT:
        return ""
    frac, n = row.get("shared_device_mean", math.nan), row.get("shared_device_n", 0)
    if pd.isna(frac) or float(frac) <= 0:
        return ""
    k = round(float(frac) * int(n))
    return (
        f"measured while other cells shared the device ({k} of {int(n)} seeds): "
        "throughput under contention, not comparable"
    )


def header_columns(summary: pd.DataFrame, show_variant: bool) -> list[dict[str, Any]]:
    identity = [i for i in IDENTITY if i[0] != "variant" or show_variant]
    devices = _devices(summary) if len(summary) else ""
    out = [
        {
            "key": k,
            "label": label,
            "type": t,
            "group": "Configuration",
            "better": None,
            "hidden": False,
            "title": "seeds: done cells averaged" if k == "n" else k,
            "calib": "",
        }
        for k, label, t in identity
    ]
    kinds = {str(d).split(":")[0] for d in summary.get("cost_device", []) if d}
    columns = leaderboard_columns(summary)
    # The raw/calibrated view: each calibrated column, and each raw column with one beside it.
    twins = {c.key.split("/", 1)[1] for c in columns if c.group == CALIBRATED_GROUP}
    for c in columns:
        title = f"{c.key}; {c.better} is better" if c.better else f"{c.key}; diagnostic"
        label = c.label
        if c.key == "train_device_h" and kinds in ({"cuda"}, {"cpu"}):  # one kind: name it
            label = "Train GPU-h" if kinds == {"cuda"} else "Train CPU-h"
        if c.group == "Cost":
            title += f"; measured on {devices}"
        out.append(
            {
                "key": c.key,
                "label": label,
                "type": "num",
                "group": c.group,
                "better": c.better,
                "hidden": c.hidden,
                "title": title,
                "calib": "ts" if c.group == CALIBRATED_GROUP else "raw" if c.key in twins else "",
            }
        )
    return out


def header_groups(header: list[dict[str, Any]], devices: str) -> list[dict[str, Any]]:
    """Consecutive runs of one group, each a ``run`` index the picker recounts its colspan by."""
    groups: list[dict[str, Any]] = []
    for h in header:
        if not groups or groups[-1]["name"] != h["group"]:
            title = GROUP_TITLES.get(h["group"], h["group"])
            if h["group"] == "Cost":
                title = f"Cost (measured on {devices})"
            if h["group"] == "OOD":  # each score the table holds, named
                keys = (x["key"] for x in header if x["group"] == "OOD")
                title = f"{title[:-1]}; scores: {', '.join(ood_score_labels(keys))})"
            groups.append({"name": h["group"], "span": 0, "title": title, "run": len(groups)})
        h["run"] = groups[-1]["run"]
        groups[-1]["span"] += 0 if h["hidden"] else 1
    return groups


def is_collapsed(r: Mapping[str, Any]) -> bool:
    """Whether a summary row is a collapsed ensemble: M > 1 and a mean disagreement below
    :data:`reports.columns.COLLAPSE_DISAGREEMENT`."""
    return collapsed(r.get("disagreement_mean", math.nan), r.get("M", math.nan))


def _identity_cell(r: dict[str, Any], h: dict[str, Any], flag: bool = False) -> dict[str, Any]:
    """A configuration cell (dataset … n) of one leaderboard row; ``flag``: the method cell of a
    collapsed ensemble, marked."""
    k = h["key"]
    if k == "M":
        text = value = m_text(r["M"])
    elif k == "n":
        text, value = _n_text(r), str(int(r["n"]))
    else:
        text = value = str(r[k])
    return {"key": k, "text": text, "value": value, "group": "Configuration",
            "num": h["type"] == "num", "best": False, "n": None, "title": "", "sig": [],
            "hidden": False, "alt": None, "shared": "",
            "flag": "collapsed" if flag and k == "method" else "",
            "limited": limit_text(r.get("limit")) if k == "method" else ""}  # fmt: skip


def _metric_cell(
    r: dict[str, Any], c, h: dict[str, Any], best: bool, sig: list, interval: str
) -> dict[str, Any]:
    """A metric cell: both interval texts, the raw mean, bold, marks and the tooltip."""
    mean, std, n = r[f"{c.key}_mean"], r[f"{c.key}_std"], r[f"{c.key}_n"]
    ci = r.get(f"{c.key}_ci", math.nan)
    texts = {"std": cell_text(mean, std, n, c.kind), "ci": cell_text(mean, ci, n, c.kind)}
    finite = isinstance(mean, float | int) and math.isfinite(mean)
    tip = "" if not finite else f"mean {mean:.6g}, std {std:.3g}, 95% CI ± {ci:.3g}, n {int(n)}"
    shared = _shared_note(r, c.key)
    return {
        "key": c.key,
        "text": texts[interval],
        "alt": texts,
        "value": repr(float(mean)) if finite else "",
        "group": c.group,
        "num": True,
        "best": best,
        "n": int(n) if texts["std"] != "–" else None,
        "title": "; ".join([tip, shared, *(t for _, _, t in sig)]).strip("; "),
        "sig": [{"cls": cls, "symbol": sym} for cls, sym, _ in sig],
        "hidden": h["hidden"],
        "shared": shared,
    }


def leaderboard_rows(
    results: Results,
    header: list[dict[str, Any]],
    paired: PairedStats,
    options: ReportOptions,
) -> list[dict[str, Any]]:
    """One entry per configuration of ``table#leaderboard``: its filter attributes and its cells'
    HTML (:func:`leaderboard_cells`)."""
    summary = results.summary
    columns = leaderboard_columns(summary)
    identity = [h for h in header if h["group"] == "Configuration"]
    best = bold_cells(paired, results)
    significance = significance_marks(paired, columns)
    metric_headers = list(zip(columns, header[len(identity) :], strict=True))

    rows = []
    for idx, r in iter_rows(summary):
        key = group_key(r)
        flag = is_collapsed(r)
        cells = [_identity_cell(r, h, flag) for h in identity]
        cells += [
            _metric_cell(r, c, h, idx in best.get(c.key, ()),
                         significance.get((*key, c.key), []), options.interval)
            for c, h in metric_headers
        ]  # fmt: skip
        # Markup: the template writes the cells as they are (each value was escaped here).
        rows.append({"dataset": r["dataset"], "backbone": r["backbone"], "m": m_text(r["M"]),
                     "config": " | ".join(config_key(r)), "collapsed": flag,
                     "cells_html": leaderboard_cells(cells)})  # fmt: skip
    return rows


def _filters(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The dataset, backbone and M selects above the leaderboard, with every value present."""
    has = bool(len(summary))
    m_values = sorted({float(m) for m in summary["M"] if pd.notna(m)}) if has else []
    return [
        {"id": "filter-dataset", "label": "Dataset", "attr": "dataset",
         "options": sorted(set(summary["dataset"])) if has else []},
        {"id": "filter-backbone", "label": "Backbone", "attr": "backbone",
         "options": sorted(set(summary["backbone"])) if has else []},
        {"id": "filter-M", "label": "M", "attr": "m", "options": [f"{m:g}" for m in m_values]},
    ]  # fmt: skip


def _directions(summary: pd.DataFrame) -> dict[str, str]:
    """Every known direction (:func:`reports.columns.directions`) and those of the metric
    columns only the records declare (a plugin's, not loaded here)."""
    declared = {c.key: c.better for c in metric_columns(None, summary) if c.better}
    return {**declared, **directions()}


def shown_results(results: Results) -> Results:
    """``results`` as the tables and figures show them: a single model's (M = 1) scores only an
    ensemble has (MI, disagreement: :func:`reports.columns.without_ensemble_only`) left blank;
    the same object when there are none (so a report's bold cells are computed once)."""
    cells, summary = without_ensemble_only(results.cells), without_ensemble_only(results.summary)
    if cells is results.cells and summary is results.summary:
        return results
    return dataclasses.replace(results, cells=cells, summary=summary)


def counts(results: Results) -> dict[str, int]:
    """The header's counts: configurations (and how many are post-hoc), trained cells that are
    done (not the ``single+TS`` rows derived from them), post-hoc rows, problems by status."""
    cells, summary = results.cells, results.summary
    done = cells[cells["status"] == "done"] if len(cells) else cells
    posthoc = int((done["method"] == SINGLE_TS).sum()) if len(done) else 0
    status = [p.status for p in results.problems]
    return {
        "groups": len(summary),
        "posthoc_groups": int((summary["method"] == SINGLE_TS).sum()) if len(summary) else 0,
        "done": len(done) - posthoc,
        "posthoc": posthoc,
        "failed": status.count("failed"),
        "invalid": status.count("invalid"),
        "missing": status.count("missing"),
    }


def context(
    results: Results,
    figures: list,
    title: str,
    paired: PairedStats,
    options: ReportOptions,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything ``leaderboard.html.j2`` renders."""
    results = shown_results(results)
    summary = results.summary
    columns = leaderboard_columns(summary)
    show_variant = bool(len(summary)) and summary["variant"].astype(bool).any()
    header = header_columns(summary, show_variant)
    groups = header_groups(header, _devices(summary) if len(summary) else "")
    shown = {c.key for c in columns}
    known = (*metric_columns("Quality"), *COST, *CORRUPTION, *metric_columns("Diversity"))
    dropped = [c.label for c in known if c.key not in shown]
    return {
        "title": title,
        "source": results.source,
        "counts": counts(results),
        "filters": _filters(summary),
        "header": header,
        "header_groups": groups,
        "picker": [h for h in header if h["group"] != "Configuration"],
        "picker_groups": [
            {"name": g, "columns": [h for h in header if h["group"] == g]}
            for g in dict.fromkeys(h["group"] for h in header if h["group"] != "Configuration")
        ],
        "rows": leaderboard_rows(results, header, paired, options),
        "page_size": PAGE_SIZE,
        "dropped": dropped,
        "figures": figures,
        "problems": results.problems,
        "provenance": results.provenance,
        "conventions": results.conventions,
        "report_conventions": report_conventions(results, paired, options),
        "aggregation": AGGREGATION,
        "collapse_note": COLLAPSE_NOTE,
        "limits_note": limits_note(summary),
        "calibrated": any(h["calib"] == "ts" for h in header),
        "interval": options.interval,
        "interval_words": {k: interval_words(k) for k in INTERVALS},
        "bold_rule": bold_rule(paired),
        "bold_note": unbolded_note(paired, results),
        "paired": paired_context(paired, summary),
        "corruption_table": corruption_table(results, options),
        "selection": selection_context(summary),
        "directions": {
            d: sorted(k for k, v in _directions(summary).items() if v == d)
            for d in ("higher", "lower")
        },
        **(extra or {}),
    }


def bold_rule(paired: PairedStats) -> str:
    return (
        f"bold: the best mean per column within each dataset, and every configuration the "
        f"{TEST_NAMES[paired.test]} cannot tell apart from it at p ≤ {paired.alpha:g} (paired "
        "by seed on the same backbone and variant, otherwise unpaired); a column whose "
        "comparisons all have too few seeds for the test to reach that level carries no bold, "
        "and a sentence above the table says so; over all rows, whatever the filters show"
    )


#: What the conformal columns hold (docs/methods.md, "Post-hoc calibration and conformal sets").
CONFORMAL_CONVENTION = (
    "split-conformal THR, APS and RAPS sets at each α of the suite (in the column header), "
    "threshold the ⌈(n+1)(1−α)⌉-th smallest of n calibration scores: on exchangeable data "
    "coverage is between 1 − α and 1 − α + 1/(n+1) (Vovk et al. 2005; Angelopoulos & Bates "
    "2021); under corruption it is not guaranteed. cov./size: the sets as defined (empty sets "
    'count as size 0 and miss); "+fb": torch-uncertainty\'s sets, the top class added to an '
    "empty set, covering more as accuracy grows; records written before these were separated "
    "hold the +fb numbers alone"
)


def report_conventions(
    results: Results, paired: PairedStats, options: ReportOptions
) -> dict[str, str]:
    """The report's own conventions (the records' are listed apart)."""
    baseline = results.mce_baseline
    ood_labels = ood_score_labels(results.cells.columns) or ["MSP", "entropy", "MI"]
    over = sorted({str(x) for x in results.cells.get("corruption_mean_over", []) if x})
    out = {
        "cells": interval_words(options.interval) + " (toggle above the table)",
        "bold": bold_rule(paired),
        "marks": paired.rule,
        "AURC": "area under the risk–coverage curve of the ensemble's max probability, in % "
        "(Geifman & El-Yaniv 2017; lower is better)",
        "mCE": (
            f"corruption error relative to {baseline}: mean over corruptions c of "
            f"Σ_s E_c,s / Σ_s E_c,s({baseline}), E = 1 − accuracy, {baseline} averaged over its "
            "seeds on the same dataset, backbone and variant (Hendrycks & Dietterich 2019); "
            f"100% = as robust as {baseline}"
            if baseline
            else "mCE not computed (no baseline)"
        ),
        "cAcc over": "; ".join(over) if over else "the corruptions evaluated (see the records)",
        "OOD": "AUROC, AUPR-In, AUPR-Out, FPR95 (OOD positive, OpenOOD) and FPR95-ID (ID "
        f"positive, Hendrycks & Gimpel 2017) for the {_words(ood_labels)} scores; "
        + OOD_GROUP_CONVENTION,
        "device-hours": "training wall time × 1 device per cell, on the device named in the "
        "Cost header (GPU-hours on a GPU)",
        "throughput": "greyed when measured while other cells shared the device "
        "(cost.shared_device): under contention the number is not the method's",
        "collapsed": COLLAPSE_NOTE,
    }
    if any(str(c).startswith("cp/") for c in results.cells.columns):
        out["conformal sets"] = CONFORMAL_CONVENTION
    return out


def _words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


# Cells as HTML, written in Python rather than in the template: at 1,000 configurations the page
# has about 100,000 cells, and Jinja2 looking up each attribute of each cell was most of a
# report's time. Every value is escaped with ``markupsafe.escape``, as autoescape would.


def leaderboard_cells(cells: Iterable[Mapping[str, Any]]) -> Markup:
    """The ``<td>`` elements of one leaderboard row (see :func:`reports.render.page.context`)."""
    out = []
    for c in cells:
        attrs = f'data-col="{escape(c["key"])}" data-value="{escape(c["value"])}"'
        if c["alt"]:
            attrs += f' data-std="{escape(c["alt"]["std"])}" data-ci="{escape(c["alt"]["ci"])}"'
        cls = f"g-{escape(c['group'])}"
        cls += " num" if c["num"] else ""
        cls += " best" if c["best"] else ""
        cls += " shared" if c["shared"] else ""
        cls += "".join(f" sig sig-{escape(s['cls'])}" for s in c["sig"])
        attrs += f' class="{cls}"'
        attrs += f' title="{escape(c["title"])}"' if c["title"] else ""
        attrs += " hidden" if c["hidden"] else ""
        body = f'<span class="v">{escape(c["text"])}</span>'
        if c.get("flag"):
            body += (f' <span class="flag flag-{escape(c["flag"])}" '
                     f'title="{escape(COLLAPSE_NOTE)}">{escape(c["flag"])}</span>')  # fmt: skip
        if c.get("limited"):  # scored on a subset of the test set (evaluation.limit)
            body += f' <span class="flag flag-limited">{escape(c["limited"])}</span>'

        if c["shared"]:
            body += '<span class="shared-mark" aria-label="shared device">⚠</span>'
        body += "".join(
            f'<span class="sig-mark {escape(s["cls"])}">{escape(s["symbol"])}</span>'
            for s in c["sig"]
        )
        if c["n"] is not None:
            body += f' <span class="n">({escape(c["n"])})</span>'
        out.append(f"<td {attrs}>{body}</td>")
    return Markup("".join(out))
