"""One colour per method, the same in every figure of every report.

:func:`method_color` is the only place a figure gets a method's colour from: the built-in
methods have fixed colours (:data:`METHOD_COLORS`, matplotlib's tab10 and greys: σN-Ens red,
the deep ensemble blue, the single model grey, its temperature-scaled row a darker grey); any
other method (a plugin's) takes the colour of :data:`FALLBACK` its name hashes to, so it keeps
its colour from one figure and one report to the next whatever else ran (two such methods share
one in 1 case of 20: their configurations are then told apart as one method's are).

Configurations of one method share its colour; a figure tells them apart by line style, marker
or hatch (:func:`config_styles`), never by another colour.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

RGB = tuple[float, float, float]


def _rgb(hex_colour: str) -> RGB:
    h = hex_colour.lstrip("#")
    return (int(h[0:2], 16) / 255, int(h[2:4], 16) / 255, int(h[4:6], 16) / 255)


#: The built-in methods' colours (the harness's methods/ and the derived ``single+TS`` rows).
METHOD_COLORS: dict[str, RGB] = {
    name: _rgb(code)
    for name, code in (
        ("deep_ensemble", "#1f77b4"),  # tab:blue
        ("sigma_ens", "#d62728"),  # tab:red
        ("batch_ensemble", "#ff7f0e"),  # tab:orange
        ("packed_ensemble", "#2ca02c"),  # tab:green
        ("film_ensemble", "#9467bd"),  # tab:purple
        ("mimo", "#8c564b"),  # tab:brown
        ("masksembles", "#e377c2"),  # tab:pink
        ("mc_dropout", "#bcbd22"),  # tab:olive
        ("single_continued", "#17becf"),  # tab:cyan
        ("single", "#7f7f7f"),  # tab:gray
        ("single+TS", "#3a3a3a"),  # darker grey: the single model, temperature-scaled
    )
}
#: Colours for methods without one of their own (matplotlib's tab20b and Dark2, none of which
#: is a colour of :data:`METHOD_COLORS`).
FALLBACK: tuple[RGB, ...] = tuple(
    _rgb(code)
    for code in (
        "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39",
        "#ad494a", "#a55194", "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd", "#1b9e77",
        "#d95f02", "#7570b3", "#66a61e", "#e6ab02",
    )
)  # fmt: skip
#: Line styles, markers and hatches of a method's 1st, 2nd, … configuration (then round again).
DASHES: tuple[tuple[float, ...] | str, ...] = (
    "", (4, 1.5), (1, 1), (3, 1.25, 1.5, 1.25), (5, 1, 1, 1, 1, 1)
)  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p")
HATCHES = ("", "///", "...", "xxx", "\\\\\\", "ooo", "---", "+++")


def _slot(method: str) -> int:
    return int(hashlib.sha1(method.encode()).hexdigest(), 16) % len(FALLBACK)


def method_color(method: str) -> RGB:
    """The colour of ``method`` in every figure: its own (:data:`METHOD_COLORS`), else the
    :data:`FALLBACK` colour its name hashes to (the same in every report)."""
    return METHOD_COLORS.get(method) or FALLBACK[_slot(method)]


def method_colors(methods: Iterable[str]) -> dict[str, RGB]:
    """``{method: method_color(method)}`` of each distinct method, sorted: a figure's palette."""
    return {m: method_color(m) for m in sorted({str(m) for m in methods})}


def config_styles(methods: Mapping[str, str]) -> dict[str, tuple[RGB, int]]:
    """``{label: (its method's colour, its rank among that method's labels)}`` for a figure's
    ``{label: method}``: the colour says the method, the rank picks the line style, marker or
    hatch (:data:`DASHES`, :data:`MARKERS`, :data:`HATCHES`) that tells its configurations
    apart. Labels in sorted order (the legend's); ranked by colour, so that two methods whose
    names hash to one fallback colour are told apart the same way."""
    rank: dict[RGB, int] = {}
    out = {}
    for label in sorted(methods):
        colour = method_color(methods[label])
        out[label] = (colour, rank.get(colour, 0))
        rank[colour] = rank.get(colour, 0) + 1
    return out
