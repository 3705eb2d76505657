"""Figures drawn once per input: a report redraws only the figures whose data changed.

Drawing is most of a report's cost (matplotlib lays out and renders each figure three times: the
page's PNG, ``<id>.png`` and ``<id>.pdf``). So :func:`report_figures` keys each figure by a
SHA-256 of everything its picture depends on — its id, the code that draws it (the figure
modules' bytes), the matplotlib and seaborn versions, its caption note, and the values of the rows
and columns it reads (:data:`READS`: pandas' hash of every value, in order; a figure not listed
there reads every column) — and keeps, in ``.report-figures.json`` in the output folder, per
figure: that key, the page's base64 PNG, its title, caption and note, and the SHA-256 of the two
files written beside the page. A figure whose key and files still match is taken from there; when
every figure matches, matplotlib is not even imported. The file is a cache, never a source: one
that cannot be read, names another format or code, or disagrees with the files is ignored and
rewritten (``tests/test_figure_cache.py`` also checks, per figure, that changing what
:data:`READS` leaves out changes no pixel).
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from reports.figure_selection import RenderedFigure, figure_cells

CACHE_FILE = ".report-figures.json"
FORMAT = "harness-report-figures/1"
SIGMA_METHOD = "sigma_ens"  # = reports.figure_base.SIGMA_METHOD (not imported: it loads matplotlib)
_CODE = ("figures.py", "figure_base.py", "figure_selection.py", "figure_cache.py", "columns.py")
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
    "fig-keff": (("hp_tau", "k_eff"), True),
}


__all__ = ["CACHE_FILE", "READS", "RenderedFigure", "figure_key", "report_figures"]


def code_stamp() -> str:
    """The figure code and the plotting libraries' versions: another one redraws everything."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _CODE:
        h.update((here / name).read_bytes())
    for lib in ("matplotlib", "seaborn"):
        h.update(f"{lib}={metadata.version(lib)};".encode())
    return h.hexdigest()


def figure_key(figure_id: str, data: pd.DataFrame, note: str, stamp: str) -> str:
    """The key of one figure drawn from ``data`` (the cells :func:`figure_cells` gave it)."""
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
    h.update(json.dumps(meta).encode("utf-8"))
    if len(frame) and cols:
        try:
            values = pd.util.hash_pandas_object(frame, index=False).to_numpy()
            h.update(values.tobytes())
        except TypeError:  # unhashable values (a list in a cell): their text
            h.update(frame.to_csv(index=False).encode("utf-8"))
    return h.hexdigest()


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _load(path: Path, stamp: str) -> list[dict[str, Any]]:
    """The cached entries, or none for anything this code did not write."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or data.get("code") != stamp:
            return []
        entries = data["figures"]
        if not all(isinstance(e, dict) and isinstance(e.get("id"), str) for e in entries):
            return []
        return entries
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


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
    """Every figure of :data:`reports.figures.FIGURES` for the page, each also written as
    ``<id>.png`` and ``<id>.pdf`` in ``out_dir``; with ``cache``, only those whose key or files
    changed are drawn (see the module docstring). A failed figure is never cached."""
    path = out_dir / CACHE_FILE
    stamp = code_stamp()
    cached = {e["id"]: e for e in _load(path, stamp)} if cache else {}
    if cached:  # the stamp covers figures.py: its list of figures is the cached one
        ids = list(cached)
    else:
        from reports.figures import FIGURES

        ids = [spec.id for spec in FIGURES]
    out: list[RenderedFigure | None] = []
    keys, todo = {}, []
    for fid in ids:
        data, note = figure_cells(cells, fid)
        keys[fid] = figure_key(fid, data, note, stamp)
        e = cached.get(fid)
        if e is not None and _usable(e, keys[fid], out_dir):
            out.append(RenderedFigure(fid, e["title"], e["caption"], e["png"], e["note"]))
        else:
            out.append(None)
            todo.append(fid)
    if todo:
        from reports.figures import FIGURES, render_one, write_figure_files

        specs = {spec.id: spec for spec in FIGURES}
        drawn = {fid: render_one(specs[fid], cells) for fid in todo}
        write_figure_files(list(drawn.values()), out_dir)
        out = [f if f is not None else drawn[fid] for f, fid in zip(out, ids, strict=True)]
    figures = [f for f in out if f is not None]
    if cache and todo:
        # A failed figure stays in the list (the next report keeps showing it) but never matches.
        entries = [_entry(f, "" if f.note.startswith("failed") else keys[f.id], out_dir)
                   for f in figures]  # fmt: skip
        _write(path, {"format": FORMAT, "code": stamp, "figures": entries})
    return figures


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write the cache atomically; a folder that cannot take it just goes without one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
