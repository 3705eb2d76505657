"""One colour per method in every figure, and no score a method cannot have (issue 60 item 8).

Before: each figure coloured its own sorted labels (σN-Ens grey in one figure, lavender in
another), and the single model's MI-AUROC was drawn as a bar at 50%."""

from __future__ import annotations

import math

import pytest
from matplotlib.collections import PathCollection
from matplotlib.lines import Line2D

from reports.figures.base import FIGURES
from reports.figures.colors import FALLBACK, METHOD_COLORS, method_color, method_colors
from reports.figures.draw import ood_auroc, render_figures
from reports.records.results import from_records
from tests.reports.smoke_like import smoke_like_records

#: The figures that draw several methods; the others colour by something else: the τ frontier
#: draws σN-Ens alone (colour: τ), the reliability diagrams one configuration a panel (colour:
#: members, ensemble, temperature-scaled).
BY_METHOD = {"fig-quality-vs-m", "fig-corruption", "fig-ood", "fig-cost", "fig-curves"}


def _rgb(artist) -> tuple[float, float, float]:
    if isinstance(artist, Line2D):
        colour = artist.get_color()
    elif isinstance(artist, PathCollection):
        colour = artist.get_facecolor()[0]
    else:
        colour = artist.get_facecolor()
    from matplotlib.colors import to_rgb

    return tuple(round(v, 6) for v in to_rgb(colour))


def _round(rgb) -> tuple[float, float, float]:
    return tuple(round(v, 6) for v in rgb)


@pytest.fixture(scope="module")
def results():
    return from_records(smoke_like_records())


@pytest.fixture(scope="module")
def figures(results):
    return {f.id: f for f in render_figures(results.cells)}


def test_the_map_is_fixed_for_built_in_methods_and_a_hash_for_the_rest():
    assert method_color("sigma_ens") == (214 / 255, 39 / 255, 40 / 255)  # tab:red
    assert method_color("deep_ensemble") == (31 / 255, 119 / 255, 180 / 255)  # tab:blue
    assert method_color("single") == (127 / 255, 127 / 255, 127 / 255)  # tab:gray
    assert len(set(METHOD_COLORS.values())) == len(METHOD_COLORS)  # no two built-ins alike
    assert not set(FALLBACK) & set(METHOD_COLORS.values())
    # a plugin's method: a fallback colour of its name, whatever else the results hold
    mine = method_color("my_plugin_ensemble")
    assert mine in FALLBACK
    assert method_colors(["my_plugin_ensemble"])["my_plugin_ensemble"] == mine
    assert method_colors(["zz", "my_plugin_ensemble", "aa", "sigma_ens"]) == {
        "aa": method_color("aa"),
        "my_plugin_ensemble": mine,
        "sigma_ens": METHOD_COLORS["sigma_ens"],
        "zz": method_color("zz"),
    }


def test_every_figure_that_draws_methods_gives_each_its_colour(results, figures):
    methods = set(results.cells["method"])
    assert methods >= {"single", "single+TS", "sigma_ens", "deep_ensemble", "mimo"}
    named: dict[str, set[str]] = {}
    for fid, f in figures.items():
        if f.figure is None:
            continue
        for legend in f.figure.legends:
            for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
                method = text.get_text().split(" ")[0]
                if method in methods:
                    named.setdefault(fid, set()).add(method)
                    assert _rgb(handle) == _round(method_color(method)), (fid, text.get_text())
    assert set(named) == BY_METHOD, sorted(named)
    for fid in BY_METHOD:  # every method each figure draws is in its legend
        assert named[fid] >= {"deep_ensemble", "sigma_ens", "mimo"}, fid
    # the drawn lines, bars and points too, not only the legend: only the methods' colours
    palette = {_round(method_color(m)) for m in methods}
    for fid in BY_METHOD:
        drawn = set()
        for ax in figures[fid].figure.axes:
            if fid != "fig-ood":  # there: error bars and the chance line, grey
                drawn |= {_rgb(line) for line in ax.get_lines() if len(line.get_xdata()) > 1}
            drawn |= {_rgb(bar) for c in ax.containers for bar in c.patches}
            drawn |= {_rgb(p) for p in ax.collections if isinstance(p, PathCollection)}
        assert drawn and drawn <= palette, (fid, drawn - palette)


def test_a_methods_configurations_share_its_colour_and_differ_in_style(figures):
    legend = figures["fig-corruption"].figure.legends[0]
    entries = {t.get_text(): h for h, t in zip(legend.legend_handles, legend.get_texts())}
    sigma = [h for label, h in entries.items() if label.startswith("sigma_ens ")]
    assert len(sigma) == 2  # τ = 0.2 and τ = 2
    assert {_rgb(h) for h in sigma} == {_round(METHOD_COLORS["sigma_ens"])}
    assert len({(h.get_linestyle(), h.get_marker()) for h in sigma}) == 2
    ood = figures["fig-ood"].figure.legends[0]
    hatches = {t.get_text(): h.get_hatch() for h, t in zip(ood.legend_handles, ood.get_texts())}
    assert sorted(h or "" for k, h in hatches.items() if k.startswith("deep_ensemble ")) == [
        "",
        "///",
    ]  # M = 2 and M = 4: one blue, one hatched


def _panel(fig, score: str):
    (ax,) = [ax for ax in fig.axes if ax.get_title().endswith(f"· {score}")]
    return ax


def test_the_single_models_mi_auroc_is_not_drawn(results):
    cells = results.cells
    single = cells[cells["method"] == "single"]
    assert (single["ood/digits_hard_heldout/mi/auroc"] == 0.5).all()  # what the record holds
    fig = ood_auroc(cells)
    grey = {_round(method_color(m)) for m in ("single", "single+TS")}
    mi = _panel(fig, "mi")
    bars = [bar for c in mi.containers for bar in c.patches]
    heights = [bar.get_height() for bar in bars if not math.isnan(bar.get_height())]
    assert not {_rgb(bar) for bar in bars} & grey  # no single-model bar at all
    assert 50.0 not in heights and min(heights) == pytest.approx(79.0)  # deep_ensemble M=2
    assert len(mi.containers) == 10  # one per ensemble configuration
    msp = _panel(fig, "msp")  # the single model's MSP is its own: drawn
    assert {_rgb(bar) for c in msp.containers for bar in c.patches} >= grey
    assert len(msp.containers) == 12


def test_the_figure_registry_still_lists_every_figure_by_method():
    assert set(FIGURES.names()) >= BY_METHOD
