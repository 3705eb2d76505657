"""Figures drawn once per input: a report redraws only the figures whose data changed.

Drawing is most of a report's cost (matplotlib lays out and renders each figure twice: the PNG the
page embeds and writes as ``<id>.png``, and ``<id>.pdf``). So :func:`report_figures` keys each
figure by a SHA-256 of everything its picture depends on — its id, the code that draws it (the
figure modules' bytes), the matplotlib and seaborn versions, its caption note, and the values of
the rows and columns it reads (:data:`READS`: pandas' hash of every value, in order; a figure not
listed there reads every column) — and keeps, in ``.report-figures.json`` in the output folder, per
figure: that key, the page's base64 PNG, its title, caption and note, and the SHA-256 of the two
files written beside the page. A figure whose key and files still match is taken from there; when
every figure matches, matplotlib is not even imported. The file is a cache, never a source: one
that cannot be read, names another format or code, or disagrees with the files is ignored and
rewritten (``tests/test_figure_cache.py`` also checks, per figure, that changing what :data:`READS`
leaves out changes no pixel). A figure a method's diagnostic declares is keyed on its declaration
and the two columns it draws (the hyper-parameter and the diagnostic).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from harness.contract import fastjson
from reports.figure_selection import (
    FIGURE_IDS,
    RenderedFigure,
    declared_figure_meta,
    figure_cells,
)

CACHE_FILE = ".report-figures.json"
FORMAT = "harness-report-figures/1"
SIGMA_METHOD = "sigma_ens"  # = reports.figure_base.SIGMA_METHOD (not imported: it loads matplotlib)
_CODE = ("figures.py", "figure_base.py", "figure_selection.py", "figure_cache.py", "columns.py",
         "figure_diagnostics.py")  # fmt: skip
_LABELS = ("status", "dataset", "backbone", "method", "M", "hparams")  # every figure's labels


def _ood_auroc(columns: list[str]) -> list[str]:
    return [c for c in columns if c.startswith("ood/") and c.endswith("/auroc")]


_SEVERITY = tuple(f"sev{s}_{k}" for s in range(1, 6) for k in ("acc", "ece"))
#: Per figure id: (the columns it reads besides the labels, or a callable picking them from the
#: frame's columns; whether it reads only σN-Ens rows). Read off the draw functions of
#: :mod:`reports.figures`; a figure that is not here is keyed on every column and row.
READS: dict[str, tuple[Any, bool]] = {
    "fig-tau-frontier": (("hp_tau", "acc", "ece"), True),
    "fig-quality-vs-m": (("acc", "nll"), False),
    "fig-corruption": (("acc", "ece", *_SEVERITY), False),
    "fig-ood": (_ood_auroc, False),
    "fig-cost": (("acc", "params", "eval_ips"), False),
    "fig-reliability": (lambda columns: [c for c in columns if c.startswith("rel/")], False),
}


__all__ = [
    "CACHE_FILE",
    "READS",
    "FigurePlan",
    "RenderedFigure",
    "draw_figure",
    "figure_key",
    "plan_figures",
    "report_figures",
]


def code_stamp() -> str:
    """The figure code and the plotting libraries' versions: another one redraws everything."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _CODE:
        h.update((here / name).read_bytes())
    for lib in ("matplotlib", "seaborn"):
        h.update(f"{lib}={metadata.version(lib)};".encode())
    return h.hexdigest()


def figure_key(
    figure_id: str, data: pd.DataFrame, note: str, stamp: str, declared: dict | None = None
) -> str:
    """The key of one figure drawn from ``data`` (the cells :func:`figure_cells` gave it);
    ``declared``: the diagnostic declaration of a declared figure (it reads the hyper-parameter
    and the column its figure names, of every row, and the declaration's texts)."""
    if declared is not None:
        column = str(declared.get("column") or declared["key"])
        reads, sigma_only = (f"hp_{declared['figure']['x']}", column), False
    else:
        reads, sigma_only = READS.get(figure_id, (None, False))
    if reads is None:
        cols = list(data.columns)
    else:
        wanted = reads(list(data.columns)) if callable(reads) else reads
        cols = [c for c in (*_LABELS, *wanted) if c in data]
    frame = data[data["method"] == SIGMA_METHOD] if sigma_only and "method" in data else data
    frame = frame[cols]
    h = hashlib.sha256()
    meta = [figure_id, note, stamp, len(frame), [[str(c), str(frame[c].dtype)] for c in cols]]
    h.update(json.dumps([meta, declared], sort_keys=True, default=str).encode("utf-8"))
    if len(frame) and cols:
        try:
            values = pd.util.hash_pandas_object(frame, index=False).to_numpy()
            h.update(values.tobytes())
        except (TypeError, ValueError):  # unhashable values (a list in a cell): their text
            h.update(frame.to_csv(index=False).encode("utf-8"))
    return h.hexdigest()


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _load(path: Path, stamp: str) -> tuple[list[str] | None, list[dict[str, Any]]]:
    """(the ids of :data:`reports.figures.FIGURES`, the cached entries), or (None, []) for
    anything this code did not write."""
    try:
        data = fastjson.loads(path.read_bytes())
        if data.get("format") != FORMAT or data.get("code") != stamp:
            return None, []
        static, entries = data["static"], data["figures"]
        if not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in entries):
            return None, []
        if not all(isinstance(i, str) for i in static):
            return None, []
        return static, entries
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None, []


def _usable(entry: dict[str, Any], key: str, out_dir: Path) -> bool:
    """The entry is for this key and the files it wrote are still there, unchanged."""
    if not entry.get("key") or entry.get("key") != key:
        return False
    files = entry.get("files") or {}
    return all(_sha(out_dir / f"{entry['id']}.{ext}") == sha for ext, sha in files.items())


def _entry(f: RenderedFigure, key: str, out_dir: Path) -> dict[str, Any]:
    files = {ext: _sha(out_dir / f"{f.id}.{ext}") for ext in ("png", "pdf")} if f.png else {}
    return {"id": f.id, "key": key, "title": f.title, "caption": f.caption, "png": f.png,
            "note": f.note, "files": files}  # fmt: skip


def report_figures(
    cells: pd.DataFrame, out_dir: Path, *, cache: bool = True
) -> list[RenderedFigure]:
    """Every figure of :func:`reports.figures.figure_specs` for the page, each also written as
    ``<id>.png`` and ``<id>.pdf`` in ``out_dir``; with ``cache``, only those whose key or files
    changed are drawn (see the module docstring). A failed figure is never cached."""
    plan = plan_figures(cells, out_dir, cache=cache)
    return plan.finish({fid: draw_figure(fid, cells, out_dir) for fid in plan.todo})


@dataclass
class FigurePlan:
    """A report's figures before drawing: those the cache holds, and ``todo``, the ids to draw
    (:func:`draw_figure`, here or in a worker) and hand to :meth:`finish`."""

    out_dir: Path
    cache: bool
    stamp: str
    static: list[str]
    ids: list[str]
    keys: dict[str, str]
    cached: dict[str, RenderedFigure]
    todo: list[str]

    def finish(self, drawn: dict[str, RenderedFigure]) -> list[RenderedFigure]:
        """The page's figures in order, the cached ones and ``drawn`` (every id of ``todo``);
        the cache rewritten when something was drawn."""
        out = {**self.cached, **drawn}
        figures = [out[fid] for fid in self.ids if fid in out]
        if self.cache and self.todo:
            # A failed figure stays in the list (the next report keeps showing it) but never
            # matches.
            entries = [
                _entry(f, "" if f.note.startswith("failed") else self.keys[f.id], self.out_dir)
                for f in figures
            ]
            data = {"format": FORMAT, "code": self.stamp, "static": self.static,
                    "figures": entries}  # fmt: skip
            _write(self.out_dir / CACHE_FILE, data)
        return figures


def plan_figures(cells: pd.DataFrame, out_dir: Path, *, cache: bool = True) -> FigurePlan:
    """Which figures of ``cells`` the cache in ``out_dir`` holds and which to draw (all of them
    without ``cache``); no plotting library imported."""
    stamp = code_stamp()
    static, entries = _load(out_dir / CACHE_FILE, stamp) if cache else (None, [])
    by_id = {e["id"]: e for e in entries}
    if static is None:  # the stamp covers figures.py: a cached list of its figures is its list
        static = list(FIGURE_IDS)
    declared = {fid: d for fid, *_, d in declared_figure_meta(cells)}
    ids = [*static, *(fid for fid in declared if fid not in static)]
    keys, cached, todo = {}, {}, []
    for fid in ids:
        if fid in declared:  # a sweep: every cell
            keys[fid] = figure_key(fid, cells, "", stamp, declared[fid])
        else:
            data, note = figure_cells(cells, fid)
            keys[fid] = figure_key(fid, data, note, stamp)
        e = by_id.get(fid)
        if e is not None and _usable(e, keys[fid], out_dir):
            cached[fid] = RenderedFigure(fid, e["title"], e["caption"], e["png"], e["note"])
        else:
            todo.append(fid)
    return FigurePlan(out_dir, cache, stamp, static, ids, keys, cached, todo)


def draw_figure(fid: str, cells: pd.DataFrame, out_dir: Path) -> RenderedFigure:
    """Draw the figure ``fid`` of ``cells`` and write its ``<id>.png`` and ``<id>.pdf``; the page's
    part of it (the matplotlib figure itself is not kept: it may come back from a worker)."""
    from reports.figures import figure_specs, render_one, write_figure_files

    spec = next(s for s in figure_specs(cells) if s.id == fid)
    drawn = render_one(spec, cells)
    write_figure_files([drawn], out_dir)
    return replace(drawn, figure=None)


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write the cache atomically; a folder that cannot take it just goes without one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(fastjson.dumps(data))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
