"""``methods: [all]``: every registered method that fits the grid, and the ones it leaves out."""

from __future__ import annotations

from typing import Any

from harness.contract.config import BackboneEntry
from harness.registry import BACKBONES, METHODS


def expand_all(
    items: list[Any], backbones: list[BackboneEntry], grid_m: tuple[int, ...]
) -> tuple[list[Any], list[tuple[str, str]]]:
    """Replace ``all`` in a method list by every registered method, at its defaults, that runs on
    every backbone of the grid and accepts the grid's M (fixed-size methods always do); methods
    also listed by name keep only their explicit entry.

    Returns:
        The method list, and each registered method ``all`` left out with the reason (a backbone
        family it declares no support for, or M outside its range).
    """
    if "all" not in items:
        return items, []
    named = {i if isinstance(i, str) else i.get("name") for i in items if isinstance(i, str | dict)}
    ms = [m for m in grid_m if isinstance(m, int)]
    eligible, left_out = [], []
    for name, spec in METHODS.items():
        if name in named:
            continue
        if why := _not_for_all(spec, backbones, ms):
            left_out.append((name, why))
        else:
            eligible.append(name)
    out: list[Any] = []
    for item in items:
        out.extend(eligible if item == "all" else [item])
    return out, left_out


def _not_for_all(spec: Any, backbones: list[BackboneEntry], ms: list[int]) -> str | None:
    """Why ``methods: [all]`` leaves the method ``spec`` out of this grid (None: it does not)."""
    for b in backbones:
        if spec.families is not None and BACKBONES.get(b.name).family not in spec.families:
            family = BACKBONES.get(b.name).family
            return (
                f"backbone {b.name!r} is of family {family!r}; the method builds on the "
                f"families {', '.join(spec.families)} only"
            )
    if spec.max_members == 1:
        return None
    bad = [m for m in ms if m < spec.min_members or (spec.max_members and m > spec.max_members)]
    if bad:
        hi = spec.max_members or "any"
        return f"grid.M has {bad}; the method allows M in [{spec.min_members}, {hi}]"
    return None
