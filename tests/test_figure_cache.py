"""The figure cache: a report redraws only the figures whose data changed, and what each figure
is keyed on (:data:`reports.figure_cache.READS`) is everything its picture depends on."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from record_factory import tau_sweep_records, write_records

import reports.figures as figures_module
from reports.aggregate import records_to_frame
from reports.figure_base import SIGMA_METHOD
from reports.figure_cache import CACHE_FILE, READS
from reports.figure_cache import SIGMA_METHOD as CACHE_SIGMA
from reports.figures import FIGURES
from reports.leaderboard import write_report


def _sweep(acc_single: float = 0.8) -> list[dict]:
    return tau_sweep_records(single_acc=acc_single, seed_step=0.001)


@pytest.fixture
def drawn(monkeypatch):
    """The ids of the figures drawn, call after call (render_one records each)."""
    calls: list[str] = []
    real = figures_module.render_one

    def spy(spec, cells):
        calls.append(spec.id)
        return real(spec, cells)

    monkeypatch.setattr(figures_module, "render_one", spy)
    return calls


def _figures_in(page: str) -> dict[str, str]:
    """figure id → the base64 PNG the page embeds (the page's only data: URIs)."""
    out = {}
    for spec in FIGURES:
        at = page.find(f'id="{spec.id}"')
        if at >= 0 and (src := page.find("data:image/png;base64,", at)) >= 0:
            out[spec.id] = page[src : page.index('"', src)]
    return out


@pytest.mark.slow
def test_second_report_draws_nothing_and_a_change_redraws_only_its_figures(tmp_path, drawn):
    results, out = tmp_path / "toy", tmp_path / "page"
    write_records(results, _sweep())
    write_report(results, out)
    first = sorted(drawn)
    # The built-in figures and the one σN-Ens's k_eff diagnostic declares (its records say so).
    assert {"fig-tau-frontier", "fig-quality-vs-m", "fig-keff"} <= set(first)
    page = (out / "leaderboard.html").read_text(encoding="utf-8")
    files = {p.name: p.read_bytes() for p in out.glob("fig-*")}
    drawn.clear()
    write_report(results, out)  # nothing changed: every figure from the cache
    assert drawn == []
    assert _figures_in((out / "leaderboard.html").read_text(encoding="utf-8")) == _figures_in(page)
    assert {p.name: p.read_bytes() for p in out.glob("fig-*")} == files
    # single's accuracy changes: the figures that draw single (clean accuracy is severity 0 of
    # the corruption figure) are redrawn, the σN-Ens τ figures
    # (σN-Ens rows only) and the OOD figure (AUROC only) are not.
    for d in results.iterdir():
        if d.is_dir():
            d.joinpath("record.json").unlink()
    write_records(results, _sweep(acc_single=0.7))
    write_report(results, out)
    assert sorted(drawn) == ["fig-corruption", "fig-cost", "fig-quality-vs-m"]
    # A figure file removed or replaced beside the page: that figure is drawn again.
    drawn.clear()
    (out / "fig-ood.pdf").unlink()
    (out / "fig-cost.png").write_bytes(b"not the figure")
    write_report(results, out)
    assert sorted(drawn) == ["fig-cost", "fig-ood"]
    assert (out / "fig-ood.pdf").read_bytes()[:5] == b"%PDF-"
    # A damaged or foreign cache is rebuilt, never trusted; --no-index draws everything.
    for bad in ("{not json", json.dumps({"format": "other", "figures": []})):
        drawn.clear()
        (out / CACHE_FILE).write_text(bad, encoding="utf-8")
        write_report(results, out)
        assert sorted(drawn) == first
    drawn.clear()
    write_report(results, out, index=False)
    assert sorted(drawn) == first


def _perturbed(cells: pd.DataFrame, figure_id: str) -> pd.DataFrame:
    """``cells`` with every value its figure is declared not to read changed."""
    reads, sigma_only = READS[figure_id]
    cols = list(cells.columns)
    read = set(reads(cols) if callable(reads) else reads)
    read |= {"status", "dataset", "backbone", "method", "M", "hparams"}
    out = cells.copy()
    rows = out["method"] != SIGMA_METHOD if sigma_only else np.zeros(len(out), bool)
    for c in cols:
        numeric = pd.api.types.is_numeric_dtype(out[c]) and not pd.api.types.is_bool_dtype(out[c])
        changed = out[c] * 0.5 + 0.01 if numeric else out[c].astype(str) + "~"
        if c in read:  # σN-Ens-only figures: every column of the other rows may change
            if c not in ("status", "method") and numeric:
                out[c] = out[c].where(~rows, changed)
        else:
            out[c] = changed
    return out


@pytest.mark.parametrize("figure_id", sorted(READS))
def test_what_a_figure_is_not_keyed_on_changes_no_pixel(figure_id):
    spec = next(s for s in FIGURES if s.id == figure_id)
    recs = _sweep()
    if figure_id == "fig-reliability":  # the factory's records hold no bins: give them some
        for i, rec in enumerate(recs):
            count = [0] * 14 + [100]
            conf = [None] * 14 + [0.9 + 0.001 * i]
            acc = [None] * 14 + [rec["metrics"]["clean"]["acc"]]
            rec["metrics"]["clean"]["reliability"] = {
                "count": count,
                "confidence": conf,
                "accuracy": acc,
            }
    cells = records_to_frame(recs)
    before = figures_module.render_one(spec, cells)
    assert before.png is not None, before.note
    after = figures_module.render_one(spec, _perturbed(cells, figure_id))
    assert after.png == before.png


def test_every_figure_has_its_reads_and_the_sigma_name_matches():
    assert set(READS) == {s.id for s in FIGURES}
    assert CACHE_SIGMA == SIGMA_METHOD


def test_bars_draw_what_seaborn_barplot_draws():
    """The OOD figure's bars (drawn directly, for speed) are seaborn.barplot's: positions,
    widths, heights, colours, error bars, ticks and limits, and the pixels."""
    import seaborn as sns
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    from reports.figure_base import _bars, _palette, _style

    rows = [("svhn", "a", 80.0), ("svhn", "a", 84.0), ("svhn", "b", 70.0), ("cifar", "b", 60.0),
            ("cifar", "b", 66.0), ("cifar", "c", 90.0), ("svhn", "c", 91.0)]  # fmt: skip
    data = pd.DataFrame(rows, columns=["ood_set", "label", "auroc100"])
    pal = _palette(data["label"])
    order = ["c", "a", "b"]

    def drawn(draw):
        with _style():
            ax = Figure().subplots()
            draw(ax)
            # Drawn bars (seaborn adds empty legend patches) and drawn error bars (seaborn
            # draws a NaN line where one seed has no spread); -0.0 and 0.0 are one position.
            bars = [(round(p.get_x(), 9) + 0.0, round(p.get_width(), 9), p.get_height(),
                     tuple(p.get_facecolor())) for p in ax.patches if p.get_width()]  # fmt: skip
            segs = [s for c in ax.collections if isinstance(c, LineCollection)
                    for s in c.get_segments()] + [ln.get_xydata() for ln in ax.lines]  # fmt: skip
            segs = [(np.round(s, 9) + 0.0).tolist() for s in segs if np.isfinite(s).all()]
            ticks = [(t, lbl.get_text()) for t, lbl in zip(ax.get_xticks(), ax.get_xticklabels())]
            if ax.get_legend() is not None:  # seaborn's, merged into the figure's legend
                ax.get_legend().remove()
            ax.set(xlabel="OOD set", ylabel="AUROC")  # seaborn's column names, set over
            canvas = FigureCanvasAgg(ax.figure)
            canvas.draw()
            pixels = np.asarray(canvas.buffer_rgba()).tobytes()
            return sorted(bars), sorted(segs), ticks, ax.get_xlim(), pixels

    ours = drawn(lambda ax: _bars(ax, data, "ood_set", "auroc100", pal, order))
    theirs = drawn(
        lambda ax: sns.barplot(
            data=data,
            x="ood_set",
            y="auroc100",
            hue="label",
            palette=pal,
            hue_order=order,
            errorbar="sd",
            ax=ax,
        )
    )
    assert ours == theirs


def test_a_declared_figure_is_keyed_on_its_declaration_and_its_two_columns():
    from reports.figure_cache import figure_key
    from reports.figure_selection import declared_figure_meta

    cells = records_to_frame(_sweep())
    ((fid, *_, declared),) = declared_figure_meta(cells)
    key = figure_key(fid, cells, "", "stamp", declared)
    other = cells.assign(acc=cells["acc"] * 0.5, ece=0.2)  # not drawn by the k_eff figure
    assert figure_key(fid, other, "", "stamp", declared) == key
    sigma = cells["method"] == "sigma_ens"
    moved = cells.assign(k_eff=cells["k_eff"].where(~sigma, cells["k_eff"] + 0.1))
    assert figure_key(fid, moved, "", "stamp", declared) != key
    relabelled = {**declared, "label": "another label"}
    assert figure_key(fid, cells, "", "stamp", relabelled) != key
