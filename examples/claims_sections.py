"""The reviewed Fashion-MNIST study's marks, Holm-corrected within each section of docs/claims.md.

    python examples/claims_sections.py docs/results/claims_fmnist_study
    python examples/claims_sections.py docs/results/claims_fmnist_study_corruption
    python examples/claims_sections.py docs/results/claims_fmnist_study_corruption --severities
    python examples/claims_sections.py docs/results/claims_fmnist_endpoints --describe \
        --variant recipe.epochs=40
    python examples/claims_sections.py docs/results/claims_fmnist_conversion_select --select \
        --k-eff-max 3.5

`harness report --holm` adjusts over its whole paired table (every configuration × metric against
one reference). A study asks its questions in families instead — "σN-Ens against the deep
ensemble", "the conversion against its control" — and corrects within each (Holm, 1979). The
families are not in this script: `suites/claims_fmnist/families.yaml` names each section's results
folder, comparisons, metrics and test, and this script computes them through the public API
(:func:`harness.api.paired`, the report's own pairing and paired test, unadjusted) and adjusts
here. It prints one Markdown table per section whose folder is the one given (by its name, so a
copy elsewhere reads the same): the mean paired difference (configuration − reference) over the
seeds both ran, its 95% paired t-interval, and ▲/▼ where the Holm-adjusted p ≤ 0.05 (▲ better, by
the metric's direction).

The study's own sections (S2–S9) are marked `retrospective: true` there: they were coded after
the S2–S4 cells were committed (at 61f22c0, after 0a2a0c2), not before the final rows ran; only
the test (paired t, Holm within each section) was stated before. The sections without the mark
are registered by their commit before any of their cells run, which
``tests/test_claims_study.py`` checks against the records' ``finished_at`` (:func:`early_records`)
and ``started_at`` (:func:`registration_times`), and refuses a record trained from a modified tree
(``+dirty``) unless its folder's ``disclosed.json`` names that run.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

import harness.api as h
from harness.cli.checks import Parser
from harness.contract.errors import DamagedFile, UsageError
from reports.stats.significance import holm

REPO = Path(__file__).resolve().parent.parent
#: The families: every section's folder, comparisons, metrics and test.
FAMILIES = REPO / "suites" / "claims_fmnist" / "families.yaml"

#: Metrics where lower is better; every other one is higher-is-better.
LOWER = {"nll", "ece", "ts/nll", "ts/ece", "cNLL", "cECE", "ts/cNLL", "ts/cECE"}
#: Column headings (Δ: configuration − reference; pp: percentage points).
HEADINGS = {"acc": "Acc (pp)", "nll": "NLL", "ece": "ECE (pp)", "ts/nll": "NLL (TS)",
            "ts/ece": "ECE (TS, pp)", "cAcc": "cAcc (pp)", "cNLL": "cNLL", "cECE": "cECE (pp)",
            "ts/cNLL": "cNLL (TS)", "ts/cECE": "cECE (TS, pp)"}  # fmt: skip
#: Shown ×100 (percentage points), besides every AUROC.
PERCENT = {"acc", "ece", "ts/ece", "cAcc", "cECE", "ts/cECE"}


def _heading(metric: str) -> str:
    if metric.startswith("ood/"):
        _, dataset, score, _ = metric.split("/")
        return f"AUROC {dataset} {score.upper()} (pp)"
    return HEADINGS.get(metric, metric)


def _percent(metric: str) -> bool:
    return metric in PERCENT or (metric.startswith("ood/") and metric.endswith("/auroc"))


@dataclass(frozen=True)
class Section:
    """One family of comparisons: each configuration minus its reference, on ``metrics``, in the
    cells of ``results`` whose paired-table variant is ``variant`` (a section of
    :data:`FAMILIES`)."""

    title: str
    pairs: tuple[tuple[str, str], ...]  # (configuration, reference), as `method[:k=v,...]`
    metrics: tuple[str, ...]
    id: str = ""
    results: str = ""  # the folder, relative to the repository root
    variant: str = ""
    test: str = "t"
    level: float = 0.95
    alpha: float = 0.05
    retrospective: bool = False
    reuse: str = ""  # a folder whose records may be copied in unchanged
    selection: str = ""  # the folder of the section's selection runs (all of its records count)
    substance: str = ""  # what registers the section (JSON): everything but its title and notes


class FamiliesError(ValueError):
    """The families file is not one this script reads: ``str()`` is one line naming the file and
    the line (YAML that does not parse) or the key (YAML whose structure is wrong)."""


def load_families(path: Path | str = FAMILIES) -> tuple[dict[str, str], tuple[Section, ...]]:
    """The file's configuration names (``select`` → ``name``) and its sections, in file order.

    Raises:
        FamiliesError: the file is unreadable, not YAML, or not laid out as families.yaml is.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise FamiliesError(f"{path}: unreadable ({exc.__class__.__name__}: {exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = getattr(exc, "problem", None) or exc
        raise FamiliesError(f"{path}: {where}not valid YAML ({what}); fix that line") from None
    try:
        return _parse(data)
    except FamiliesError as exc:
        raise FamiliesError(f"{path}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a level or alpha that is not a number, say
        raise FamiliesError(f"{path}: a value of the wrong kind ({exc})") from None


def _get(mapping: Any, key: Any, where: str, kind: type | tuple[type, ...] = object) -> Any:
    """``mapping[key]``, checked to be a ``kind``; else a :class:`FamiliesError` naming
    ``where`` (and, for a missing key, the keys ``mapping`` does hold)."""
    if not isinstance(mapping, dict):
        found = "empty" if mapping is None else f"a {type(mapping).__name__}"
        raise FamiliesError(f"{where} is {found}, not a mapping")
    if key not in mapping:
        held = ", ".join(map(str, mapping)) or "nothing"
        raise FamiliesError(f"{where} has no {key!r} (it has: {held})")
    value = mapping[key]
    if not isinstance(value, kind):
        wanted = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise FamiliesError(f"{where}: {key} is a {type(value).__name__}, not a {wanted}")
    return value


def _parse(data: Any) -> tuple[dict[str, str], tuple[Section, ...]]:
    """:func:`load_families` on the parsed YAML; a wrong structure names its key or entry."""
    configs = _get(data, "configurations", "the file", dict)
    names = {}
    for key in configs:
        config = _get(configs, key, "configurations", dict)
        select = _get(config, "select", f"configurations.{key}", str)
        names[select] = config.get("name", select)
    sections = []
    for index, raw in enumerate(_get(data, "sections", "the file", list), 1):
        sid = raw.get("id") if isinstance(raw, dict) else None
        where = f"section {sid or f'#{index}'}"
        test = _get(raw, "test", where, (str, dict))
        if isinstance(test, str):
            test = _get(_get(data, "tests", "the file", dict), test, f"{where}: tests", dict)
        if test.get("adjust", "holm") != "holm" or test.get("test") not in ("t", "signflip"):
            raise FamiliesError(f"{where}: only a paired t or sign-flip test with Holm")
        metrics = _get(raw, "metrics", where, (str, list))
        if isinstance(metrics, str):
            metrics = _get(data.get("metrics"), metrics, f"{where}: metrics", list)
        metrics = tuple(metrics)
        pairs = []
        for pair in _get(raw, "comparisons", where, list):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise FamiliesError(
                    f"{where}: comparison {pair!r} is not [configuration, reference]"
                )
            pairs.append(
                tuple(_get(configs, c, f"{where}: configurations")["select"] for c in pair)
            )
        pairs = tuple(pairs)
        selection = raw.get("selection") or {}
        substance = {k: raw.get(k) for k in ("results", "variant", "reuse", "selection")}
        substance.update(pairs=pairs, metrics=metrics, test=test)
        sections.append(Section(
            title=_get(raw, "title", where, str), pairs=pairs, metrics=metrics,
            id=_get(raw, "id", where, str), results=_get(raw, "results", where, str),
            variant=raw.get("variant") or "", test=test["test"],
            level=float(test.get("level", 0.95)), alpha=float(test.get("alpha", 0.05)),
            retrospective=bool(raw.get("retrospective", False)), reuse=raw.get("reuse") or "",
            selection=selection.get("results", ""),
            substance=json.dumps(substance, sort_keys=True, ensure_ascii=False),
        ))  # fmt: skip
    return names, tuple(sections)


@functools.cache
def study() -> tuple[dict[str, str], tuple[Section, ...], dict[str, Any]]:
    """:data:`FAMILIES` as read on first use: its names, sections and configurations."""
    names, sections = load_families()
    return names, sections, yaml.safe_load(FAMILIES.read_text(encoding="utf-8"))["configurations"]


#: Read on first use (PEP 562), not on import: a broken families file is then one line from
#: :func:`main`, not a traceback before it. NAMES: how the tables name the configurations;
#: SECTIONS: every section of the file; SEP: the selected configuration whose members separate;
#: SHARE: the sharing end (the validation NLL's own choice); CONVERTED: the converted one.
_LAZY = {
    "NAMES": lambda: study()[0],
    "SECTIONS": lambda: study()[1],
    "_CONFIGS": lambda: study()[2],
    "SEP": lambda: study()[2]["sep"]["select"],
    "SHARE": lambda: study()[2]["share"]["select"],
    "CONVERTED": lambda: study()[2]["converted"]["select"],
}


def __getattr__(name: str) -> Any:
    """The module's constants of :data:`FAMILIES` (``_LAZY``), read when first asked for."""
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sections_for(path: str, sections: Iterable[Section] | None = None) -> list[Section]:
    """The sections (of :data:`FAMILIES` unless given) whose results folder has the name of
    ``path``'s."""
    sections = study()[1] if sections is None else sections
    return [s for s in sections if Path(s.results).name == Path(path).name]


def _matches(frame: pd.DataFrame, config: str, variant: str = "") -> pd.Series:
    """Rows of a paired table (or of the cells) whose configuration is ``config``
    (``method[:k=v,...]``) and whose variant is ``variant``."""
    method, _, rest = config.partition(":")
    mask = (frame["method"] == method) & (frame["variant"].fillna("") == variant)
    for item in filter(None, rest.split(",")):
        key, value = item.split("=")
        hp = frame["hparams"].fillna("")
        if key == "M":  # the ensemble size, a column of its own (section M3)
            mask &= frame["M"].astype(str) == value
        elif key == "pretrain_epochs" and value == "0":
            mask &= ~hp.str.contains("pretrain_epochs=")
        else:
            mask &= hp.str.contains(rf"(?:^|, ){key}={value}(?:,|$)", regex=True)
    return mask


class NotRun(LookupError):
    """A section whose cells have not run yet (a grid that runs across sessions)."""


def section_rows(path: str, section: Section) -> pd.DataFrame:
    """The section's comparisons with raw and Holm-adjusted p-values."""
    if not Path(path).is_dir():  # a registered section whose grid has not started (C9)
        raise NotRun(f"{path}: no records yet (the folder does not exist)")
    rows = []
    for config, reference in section.pairs:
        try:
            table = h.paired(
                path, reference, list(section.metrics), test=section.test, level=section.level
            )
        except h.HarnessError as exc:  # the reference's cells still to run (a grid in progress)
            if "no done cells of that method" not in str(exc):
                raise
            raise NotRun(f"{config} vs {reference}: no done {reference} records yet") from None
        table = table[_matches(table, config, section.variant)]
        found = len(table[["method", "hparams"]].drop_duplicates())
        if found == 0:
            raise NotRun(f"{config} vs {reference}: no paired records yet")
        if found != 1:
            raise SystemExit(f"{path}: {config} vs {reference}: not one configuration in the table")
        for metric in section.metrics:
            row = table[table["metric"] == metric]
            if len(row) != 1:
                raise SystemExit(f"{path}: {config} vs {reference}: no {metric}")
            rows.append({**row.iloc[0].to_dict(), "config": config, "reference": reference})
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p_value"].to_numpy(float))
    out["marked"] = out["p_holm"] <= section.alpha
    return out


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def registration_times(
    path: Path | str = FAMILIES, repo: Path = REPO
) -> dict[str, datetime | None]:
    """Per section id of the file as it is on disk: the commit time (``%cI``) from which its
    substance (:attr:`Section.substance`) is unchanged through every later commit of the file
    and the working tree; None when that form is not committed. Never before the file's first
    commit (``git log --diff-filter=A``)."""
    path = Path(path).resolve()
    rel = path.relative_to(repo.resolve()).as_posix()
    current = {s.id: s.substance for s in load_families(path)[1]}
    commits = [line.split(" ", 1) for line in _git("log", "--format=%H %cI", "--", rel,
                                                    cwd=repo).splitlines()]  # fmt: skip
    times: dict[str, datetime | None] = dict.fromkeys(current)
    open_ids = set(current)
    for sha, when in commits:  # newest first
        try:
            text = _git("show", f"{sha}:{rel}", cwd=repo)
            then = {s.id: s.substance for s in _parse(yaml.safe_load(text))[1]}
        except (subprocess.CalledProcessError, KeyError, TypeError, ValueError, yaml.YAMLError):
            then = {}  # deleted, or a form this parser does not read: nothing registered there
        for sid in list(open_ids):
            if then.get(sid) == current[sid]:
                times[sid] = datetime.fromisoformat(when)
            else:
                open_ids.discard(sid)
        if not open_ids:
            break
    return times


def section_records(section: Section, repo: Path = REPO) -> list[dict]:
    """The records the section stands on: those of its results folder whose configuration (and
    variant) one of its comparisons names, and every record of its selection folder."""
    found: list[dict] = []
    folder = repo / section.results
    if folder.is_dir():
        cells = h.load_results(folder)
        configs = {c for pair in section.pairs for c in pair}
        mask = pd.Series(False, index=cells.index)
        for config in configs:
            mask |= _matches(cells, config, section.variant)
        ids = set(cells.loc[mask, "cell_id"])
        found += [r for r in h.load_records(folder) if r.get("cell_id") in ids]
    if section.selection and (repo / section.selection).is_dir():
        found += list(h.load_records(repo / section.selection))
    return found


def early_records(
    records: Iterable[dict], registered: datetime, reused: Iterable[dict] = ()
) -> list[str]:
    """The records finished before ``registered`` (their ``finished_at``), each as
    ``"cell_id finished_at"``, except verbatim copies of a ``reused`` record (same cell id and
    ``finished_at``): a row carried over unchanged from an earlier folder, which its section
    names. A record without ``finished_at`` counts as early: nothing dates it."""
    copies = {(r.get("cell_id"), r.get("finished_at")) for r in reused}
    early = []
    for record in records:
        finished = record.get("finished_at")
        if (record.get("cell_id"), finished) in copies:
            continue
        if not finished or datetime.fromisoformat(finished) < registered:
            early.append(f"{record.get('cell_id')} {finished}")
    return sorted(early)


def _cell(row: pd.Series) -> str:
    scale = 100 if _percent(row["metric"]) else 1
    fmt = "{:+.2f}" if scale == 100 else "{:+.3f}"
    mean, lo, hi = (scale * row[k] for k in ("mean_diff", "ci_lo", "ci_hi"))
    text = f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]"
    if math.isfinite(row["p_holm"]) and row["marked"]:
        better = (row["mean_diff"] < 0) == (row["metric"] in LOWER)
        text += " ▲" if better else " ▼"
    return text


def markdown(section: Section, rows: pd.DataFrame) -> str:
    """One table: a row per comparison, a column per metric (Δ [95% CI] and the mark)."""
    head = ["comparison", "n", *(f"Δ {_heading(m)}" for m in section.metrics)]
    lines = [f"#### {section.title}", "", "| " + " | ".join(head) + " |",
             "|---|---:|" + "---:|" * len(section.metrics)]  # fmt: skip
    for (config, reference), group in rows.groupby(["config", "reference"], sort=False):
        cells = [_cell(group[group["metric"] == m].iloc[0]) for m in section.metrics]
        n = int(group["n_pairs"].min())
        names = study()[0]
        name = f"{names.get(config, config)} − {names.get(reference, reference)}"
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    lines += ["", f"Holm over the {len(rows)} comparisons of this table; smallest adjusted p "
              f"{rows['p_holm'].min():.2g}.", ""]  # fmt: skip
    return "\n".join(lines)


#: The per-configuration description: (column of harness.api.load_results, heading, scale,
#: decimals; docs/results.md).
DESCRIBE = (
    ("acc", "Acc (%)", 100, 2),
    ("nll", "NLL", 1, 3),
    ("ece", "ECE (%)", 100, 2),
    ("nll_ts", "NLL (TS)", 1, 3),
    ("ece_ts", "ECE (TS, %)", 100, 2),
    ("temperature", "T", 1, 2),
    ("member_acc", "member Acc (%)", 100, 2),
    ("disagreement", "disagreement (%)", 100, 2),
    ("mi", "MI (nats)", 1, 4),
    ("k_eff", "k_eff", 1, 3),
    ("k_eff_scale", "k_eff (scale)", 1, 3),
    ("cpu_s", "CPU-s", 1, 0),
    ("params", "parameters", 1, 0),
)


def _done_cells(path: str) -> pd.DataFrame:
    """The done cells of a results folder (:func:`harness.api.load_results`), at least one."""
    cells = h.load_results(path)
    cells = cells[cells["status"] == "done"]
    if cells.empty:
        raise UsageError(f"results {path}: no done cell (not a results folder, or none finished)")
    return cells


def describe(path: str, variant: str = "") -> str:
    """Mean ± std over seeds of :data:`DESCRIBE` per configuration (done cells of the paired
    table's ``variant``, e.g. ``recipe.epochs=24``; "" the suite's own recipe), as Markdown;
    ``cpu_s`` is the records' ``timings.cpu_s``. Raises :class:`UsageError` when no done cell
    has that variant."""
    records = h.load_records(path)
    cpu = {r["cell_id"]: (r.get("timings") or {}).get("cpu_s") for r in records}
    cells = _done_cells(path)  # one raw row per cell: the TS numbers are its _ts columns
    variants = cells["variant"].fillna("")
    if variant not in set(variants):
        shown = ", ".join(sorted(v or "'' (the suite's own recipe)" for v in set(variants)))
        raise UsageError(f"--variant {variant or repr('')}: no done cell of {path} has it; "
                         f"its variants: {shown}")  # fmt: skip
    cells = cells[variants == variant]
    cells = cells.assign(cpu_s=cells["cell_id"].map(cpu))
    cols = [c for c in DESCRIBE if c[0] in cells.columns]
    lines = ["| configuration | n | " + " | ".join(c[1] for c in cols) + " |",
             "|---|---:|" + "---:|" * len(cols)]  # fmt: skip
    by_m = cells["M"].nunique() > 1  # a folder of several ensemble sizes (section M3): a row each
    keys = ["method", "hparams", "M"] if by_m else ["method", "hparams"]
    cells = cells.sort_values(["method", "M"], kind="stable") if by_m else cells
    for key, group in cells.groupby(keys, dropna=False, sort=False):
        method, hparams = key[0], key[1]
        values = []
        for col, _, scale, digits in cols:
            v = pd.to_numeric(group[col], errors="coerce").dropna() * scale
            values.append("–" if v.empty else f"{v.mean():.{digits}f} ± {v.std():.{digits}f}")
        name = f"{method} ({hparams})" if isinstance(hparams, str) and hparams else method
        name += f", M = {key[2]}" if by_m else ""
        lines.append(f"| {name} | {len(group)} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def selection(path: str, k_eff_max: float | None = None) -> str:
    """A selection folder's choice, as Markdown: per configuration (method, hyper-parameters,
    recipe variant) the seeds, the mean validation NLL (``metrics.val.nll``) and, for σN-Ens, the
    final epoch's k_eff per seed (``diagnostics.per_epoch[-1].k_eff``). Per method, the
    configuration with the lowest mean validation NLL among those run at every seed of the folder
    (and, with ``k_eff_max``, whose k_eff is ≤ it at every seed: members that separate) is marked
    **selected** — the rule of families.yaml's selections; with ``k_eff_max``, a single model's
    row (no k_eff) with the selected recipe is marked **control**. No test number is read.
    Raises :class:`UsageError` for a folder without done cells."""
    cells = _done_cells(path)
    by_id = {r["cell_id"]: r for r in h.load_records(path)}
    seeds = sorted(cells["seed"].unique())
    rows = []
    for (method, hparams, variant), group in cells.groupby(
        ["method", "hparams", "variant"], dropna=False, sort=False
    ):
        records = [by_id[c] for c in group.sort_values("seed")["cell_id"]]
        nll = [r["metrics"]["val"]["nll"] for r in records]
        keff = [((r.get("diagnostics") or {}).get("per_epoch") or [{}])[-1].get("k_eff")
                for r in records]  # fmt: skip
        keff = [k for k in keff if k is not None]
        # the k_eff bound is on the ensembles' members; a single model's row (C9's controls)
        # is not chosen under it but by the recipe of the chosen ensemble (marked below)
        eligible = sorted(group["seed"]) == seeds and (
            k_eff_max is None or (len(keff) == len(records) > 0 and max(keff) <= k_eff_max)
        )
        rows.append({"method": method, "hparams": hparams if isinstance(hparams, str) else "",
                     "variant": variant if isinstance(variant, str) else "",
                     "n": len(records), "nll": sum(nll) / len(nll), "keff": keff,
                     "eligible": eligible})  # fmt: skip
    frame = pd.DataFrame(rows)
    chosen = {
        method: group.loc[group["nll"].idxmin()].name
        for method, group in frame[frame["eligible"]].groupby("method")
    }
    lines = ["| method | hyper-parameters | recipe | n | val NLL | final k_eff per seed | |",
             "|---|---|---|---:|---:|---|---|"]  # fmt: skip
    recipes = {frame.loc[i, "variant"] for i in chosen.values()} if k_eff_max else set()
    for index, row in frame.sort_values(["method", "nll"]).iterrows():
        keff = ", ".join(f"{k:.2f}" for k in row["keff"]) or "–"
        if chosen.get(row["method"]) == index:
            mark = "**selected**"
        elif not row["keff"] and k_eff_max is not None:
            mark = "**control** (the selected recipe)" if row["variant"] in recipes else ""
        else:
            mark = "" if row["eligible"] else "not eligible"
        lines.append(f"| {row['method']} | {row['hparams']} | {row['variant']} | {row['n']} "
                     f"| {row['nll']:.4f} | {keff} | {mark} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _config(record: dict) -> str:
    """The name the tables give a record's configuration."""
    hp, method = record["config"].get("hparams") or {}, record["config"]["method"]
    return f"σN-Ens τ = {hp['tau']:g}" if "tau" in hp else study()[0].get(method, method)


def severities(path: str) -> str:
    """ECE per corruption severity (mean over the corruptions, then mean ± std over seeds), its
    slope (``ece_slope``, pp per level), the same after temperature scaling (the clean-fitted
    temperature applied to the corrupted sets) and accuracy at severities 1 and 5, as Markdown;
    from the records' ``metrics.corruption`` and ``metrics.calibration.ts.corruption``. Raises
    :class:`UsageError` for a folder without them."""
    groups: dict[str, list[dict]] = {}
    for record in h.load_records(path):
        if record.get("status") == "done" and "corruption" in record.get("metrics", {}):
            groups.setdefault(_config(record), []).append(record)

    def stat(values: list[float], digits: int = 2) -> str:
        s = pd.Series(values) * 100
        return f"{s.mean():.{digits}f} ± {s.std():.{digits}f}"

    if not groups:
        raise UsageError(f"results {path}: no done record with corruption metrics; give a "
                         "corruption folder (evaluation.corruptions set), such as "
                         "docs/results/claims_fmnist_study_corruption")  # fmt: skip
    lines = ["| configuration | n | clean ECE (%) raw / TS | ECE (%) severity 1 | 2 | 3 | 4 | 5 "
             "| slope (pp / level) | TS: severity 1 → 5 | TS slope | corrupted Acc (%), "
             "severity 1 → 5 |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]  # fmt: skip
    for name, records in sorted(groups.items(), key=lambda kv: kv[0] != "single"):
        raw = [r["metrics"]["corruption"] for r in records]
        ts = [r["metrics"]["calibration"]["ts"]["corruption"] for r in records]
        sev = [stat([m["per_severity"][str(k)]["ece"] for m in raw]) for k in range(1, 6)]
        ts_ends = [stat([m["per_severity"][str(k)]["ece"] for m in ts], 1) for k in (1, 5)]
        acc = [pd.Series([m["per_severity"][str(k)]["acc"] for m in raw]).mean() * 100
               for k in (1, 5)]  # fmt: skip
        clean = [pd.Series([r["metrics"]["clean"]["ece"] for r in records]).mean() * 100,
                 pd.Series([r["metrics"]["calibration"]["ts"]["clean"]["ece"]
                            for r in records]).mean() * 100]  # fmt: skip
        lines.append(
            f"| {name} | {len(records)} "
            f"| {clean[0]:.2f} / {clean[1]:.2f} | "
            + " | ".join(sev)
            + f" | {stat([m['ece_slope'] for m in raw])} | {ts_ends[0]} → {ts_ends[1]} "
            f"| {stat([m['ece_slope'] for m in ts])} | {acc[0]:.1f} → {acc[1]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _k_eff_bound(text: str) -> float:
    """argparse type of ``--k-eff-max``: a number ≥ 1 (k_eff runs from 1, every feature owned by
    one member, to M); below 1 no configuration could be eligible."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(
            f"expected a number >= 1 such as 3.5 (k_eff runs from 1 to M), got {text!r}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    """The command line; its own mistakes (a bad number, two tables at once) are one line."""
    parser = Parser(prog=Path(__file__).name, description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the study's results folder")
    parser.add_argument("--corruption", action="store_true",
                        help="accepted, unused: the folder picks the sections")  # fmt: skip
    table = parser.add_mutually_exclusive_group()  # one table per call
    table.add_argument("--describe", action="store_true", help="only the per-configuration table")
    table.add_argument("--select", action="store_true",
                       help="only a selection folder's table (lowest validation NLL)")  # fmt: skip
    table.add_argument("--severities", action="store_true",
                       help="only the ECE-by-severity table (a corruption folder)")  # fmt: skip
    parser.add_argument("--variant",
                        help="--describe: a recipe variant's cells (recipe.epochs=24)")  # fmt: skip
    parser.add_argument("--k-eff-max", type=_k_eff_bound,
                        help="--select: eligible if each seed's final k_eff is ≤ this")  # fmt: skip
    parser.add_argument("--csv", help="also write every comparison (raw and adjusted p) here")
    return parser


def _refuse_mistakes(args: argparse.Namespace) -> None:
    """Every mistake the arguments alone show, refused before anything is read or written:
    raises :class:`UsageError` with the line to print."""
    results = Path(args.results)
    if not results.is_dir():
        what = "is a file" if results.exists() else "does not exist"
        nearby = [p.name for p in results.parent.glob("*/")] if results.parent.is_dir() else []
        close = difflib.get_close_matches(results.name, nearby, n=1)
        hint = f" (did you mean {results.parent / close[0]}?)" if close else ""
        raise UsageError(f"results {args.results}: {what}{hint}; give a results folder (a "
                         "suite's, such as docs/results/claims_fmnist_study)")  # fmt: skip
    table = "--describe" if args.describe else "--select" if args.select else ""
    table = table or ("--severities" if args.severities else "")
    for flag, value, wanted in (("--variant", args.variant, "--describe"),
                                ("--k-eff-max", args.k_eff_max, "--select")):  # fmt: skip
        if value is not None and table != wanted:
            raise UsageError(f"{flag} {value}: only with {wanted}; add {wanted} or leave it out")
    if args.csv is not None:
        csv = Path(args.csv)
        if table:
            raise UsageError(f"--csv {args.csv}: only with the sections' tables, not {table}")
        if csv.is_dir() or not csv.parent.is_dir():
            what = "is a folder" if csv.is_dir() else f"its folder {csv.parent} does not exist"
            raise UsageError(f"--csv {args.csv}: {what}; give a file in an existing folder")
    if not table and not sections_for(args.results):
        raise UsageError(_no_section(results))


def _no_section(results: Path) -> str:
    """The line for a folder no section names: the closest name, and every known one."""
    known: dict[str, list[str]] = {}
    for section in study()[1]:
        known.setdefault(Path(section.results).name, []).append(section.id)
    close = difflib.get_close_matches(results.name, known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    listed = "; ".join(f"{name} ({', '.join(ids)})" for name, ids in known.items())
    return (f"results {results}: {FAMILIES.relative_to(REPO)} has no section for a folder named "
            f"{results.name!r}; {hint}known: {listed} (--describe, --select and --severities "
            "read any results folder)")  # fmt: skip


def _sections(results: str, csv: str | None) -> None:
    """Print every section of ``results``'s folder (a pending one says so); ``csv``: also write
    every comparison there."""
    frames = []
    for section in sections_for(results):
        try:
            rows = section_rows(results, section)
        except NotRun as exc:  # said, not skipped silently: the table is still to come
            print(f"#### {section.title}\n\npending: {exc}\n")
            continue
        print(markdown(section, rows))
        frames.append(rows.assign(section=section.title))
    if csv and frames:
        pd.concat(frames).to_csv(csv, index=False)
    elif csv:
        print(f"--csv {csv}: not written, every section is pending", file=sys.stderr)


#: The errors a user's input can cause, each printed as one line with exit status 2; any other
#: exception is a bug and keeps its traceback.
MISTAKES = (UsageError, FamiliesError, h.HarnessError, DamagedFile, FileNotFoundError)


def main(argv: list[str] | None = None) -> int:
    """The command line: 0, or 2 with one line on stderr for a mistake (nothing written)."""
    args = _parser().parse_args(argv)
    try:
        _refuse_mistakes(args)
        if args.select:
            print(selection(args.results, args.k_eff_max))
        elif args.describe:
            print(describe(args.results, args.variant or ""))
        elif args.severities:
            print(severities(args.results))
        else:
            _sections(args.results, args.csv)
    except MISTAKES as exc:
        print("error: " + "; ".join(str(exc).splitlines()), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
