"""The reviewed Fashion-MNIST study's marks, Holm-corrected within each section of docs/claims.md.

    python examples/claims_sections.py docs/results/claims_fmnist_study
    python examples/claims_sections.py docs/results/claims_fmnist_study_corruption --corruption
    python examples/claims_sections.py docs/results/claims_fmnist_study_corruption --severities

`harness report --holm` adjusts over its whole paired table (every configuration × metric against
one reference). A study asks its questions in families instead — "σN-Ens against the deep
ensemble", "the conversion against its control" — and corrects within each (Holm, 1979): this
script is those families, computed through the public API (:func:`harness.api.paired`, the
report's own pairing and paired t-test, unadjusted) and adjusted here. It prints one Markdown
table per section: the mean paired difference (configuration − reference) over the seeds both
ran, its 95% paired t-interval, and ▲/▼ where the Holm-adjusted p ≤ 0.05 (▲ better, by the
metric's direction). The families are fixed below, as they were stated in docs/claims.md §S
before the final rows ran.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import pandas as pd

import harness.api as h
from reports.stats.significance import holm

SEP = "sigma_ens:tau=0.2,pretrain_epochs=0"  # the selected configuration whose members separate
SHARE = "sigma_ens:tau=2.0"  # the sharing end (the validation NLL's own choice)
CONVERTED = "sigma_ens:tau=0.2,pretrain_epochs=12"
#: How the tables name the configurations.
NAMES = {SEP: "σN-Ens τ = 0.2", SHARE: "σN-Ens τ = 2", CONVERTED: "converted σN-Ens τ = 0.2",
         "deep_ensemble": "deep ensemble", "single_continued": "single + 2 epochs"}  # fmt: skip
CALIBRATION = ("acc", "nll", "ece", "ts/nll", "ts/ece")
OOD = tuple(f"ood/{s}/{score}/auroc" for score in ("msp", "mi") for s in
            ("digits_28", "letters_28", "photos_28"))  # fmt: skip
CORRUPTION = ("cAcc", "cNLL", "cECE", "ts/cNLL", "ts/cECE")
#: Metrics where lower is better; every other one is higher-is-better.
LOWER = {"nll", "ece", "ts/nll", "ts/ece", "cNLL", "cECE", "ts/cNLL", "ts/cECE"}
#: Column headings (Δ: configuration − reference; pp: percentage points).
HEADINGS = {"acc": "Acc (pp)", "nll": "NLL", "ece": "ECE (pp)", "ts/nll": "NLL (TS)",
            "ts/ece": "ECE (TS, pp)", "cAcc": "cAcc (pp)", "cNLL": "cNLL", "cECE": "cECE (pp)",
            "ts/cNLL": "cNLL (TS)", "ts/cECE": "cECE (TS, pp)"}  # fmt: skip
HEADINGS.update({m: f"AUROC {m.split('/')[1]} {m.split('/')[2].upper()} (pp)" for m in OOD})
#: Shown ×100 (percentage points).
PERCENT = {"acc", "ece", "ts/ece", "cAcc", "cECE", "ts/cECE", *OOD}


@dataclass(frozen=True)
class Section:
    """One family of comparisons: each configuration minus its reference, on ``metrics``."""

    title: str
    pairs: tuple[tuple[str, str], ...]  # (configuration, reference)
    metrics: tuple[str, ...]


SECTIONS = (
    Section(
        "S2. The frontier: separating (τ = 0.2) against sharing (τ = 2)",
        ((SEP, SHARE),),
        CALIBRATION,
    ),
    Section(
        "S3. Against the deep ensemble (M = 4)",
        ((SEP, "deep_ensemble"), (SHARE, "deep_ensemble")),
        CALIBRATION,
    ),
    Section(
        "S4. Against the single model",
        ((SEP, "single"), (SHARE, "single"), ("deep_ensemble", "single")),
        CALIBRATION,
    ),
    Section(
        "S6. The gate and the comparators (reference: σN-Ens τ = 0.2)",
        (("film_ensemble", SEP), ("batch_ensemble", SEP), ("packed_ensemble", SEP)),
        CALIBRATION,
    ),
    Section(
        "S8. OOD detection against the deep ensemble (AUROC)",
        ((SEP, "deep_ensemble"), (SHARE, "deep_ensemble")),
        OOD,
    ),
    Section(
        "S9. Conversion (12-epoch single → σN-Ens τ = 0.2, 2 epochs) and its control",
        ((CONVERTED, "single_continued"), (CONVERTED, SEP), ("single_continued", "single")),
        CALIBRATION,
    ),
)

CORRUPTION_SECTIONS = (
    Section(
        "S7. Corruption (13 corruptions × 5 severities)",
        ((SEP, "deep_ensemble"), (SEP, "single"), ("deep_ensemble", "single")),
        CORRUPTION,
    ),
)


def _matches(frame: pd.DataFrame, config: str) -> pd.Series:
    """Rows of a paired table whose configuration is ``config`` (``method[:k=v,...]``)."""
    method, _, rest = config.partition(":")
    mask = (frame["method"] == method) & (frame["variant"].fillna("") == "")
    for item in filter(None, rest.split(",")):
        key, value = item.split("=")
        hp = frame["hparams"].fillna("")
        if key == "pretrain_epochs" and value == "0":
            mask &= ~hp.str.contains("pretrain_epochs=")
        else:
            mask &= hp.str.contains(rf"(?:^|, ){key}={value}(?:,|$)", regex=True)
    return mask


def section_rows(path: str, section: Section) -> pd.DataFrame:
    """The section's comparisons with raw and Holm-adjusted p-values."""
    rows = []
    for config, reference in section.pairs:
        table = h.paired(path, reference, list(section.metrics), test="t")
        table = table[_matches(table, config)]
        if len(table[["method", "hparams"]].drop_duplicates()) != 1:
            raise SystemExit(f"{path}: {config} vs {reference}: not one configuration in the table")
        for metric in section.metrics:
            row = table[table["metric"] == metric]
            if len(row) != 1:
                raise SystemExit(f"{path}: {config} vs {reference}: no {metric}")
            rows.append({**row.iloc[0].to_dict(), "config": config, "reference": reference})
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p_value"].to_numpy(float))
    return out


def _cell(row: pd.Series) -> str:
    scale = 100 if row["metric"] in PERCENT else 1
    fmt = "{:+.2f}" if scale == 100 else "{:+.3f}"
    mean, lo, hi = (scale * row[k] for k in ("mean_diff", "ci_lo", "ci_hi"))
    text = f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]"
    if math.isfinite(row["p_holm"]) and row["p_holm"] <= 0.05:
        better = (row["mean_diff"] < 0) == (row["metric"] in LOWER)
        text += " ▲" if better else " ▼"
    return text


def markdown(section: Section, rows: pd.DataFrame) -> str:
    """One table: a row per comparison, a column per metric (Δ [95% CI] and the mark)."""
    head = ["comparison", "n", *(f"Δ {HEADINGS.get(m, m)}" for m in section.metrics)]
    lines = [f"#### {section.title}", "", "| " + " | ".join(head) + " |",
             "|---|---:|" + "---:|" * len(section.metrics)]  # fmt: skip
    for (config, reference), group in rows.groupby(["config", "reference"], sort=False):
        cells = [_cell(group[group["metric"] == m].iloc[0]) for m in section.metrics]
        n = int(group["n_pairs"].min())
        name = f"{NAMES.get(config, config)} − {NAMES.get(reference, reference)}"
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    lines += ["", f"Holm over the {len(rows)} comparisons of this table; smallest adjusted p "
              f"{rows['p_holm'].min():.2g}.", ""]  # fmt: skip
    return "\n".join(lines)


#: The per-configuration description: (column, heading, scale, decimals).
DESCRIBE = (
    ("acc", "Acc (%)", 100, 2),
    ("nll", "NLL", 1, 3),
    ("ece", "ECE (%)", 100, 2),
    ("ts/nll", "NLL (TS)", 1, 3),
    ("ts/ece", "ECE (TS, %)", 100, 2),
    ("ts/temperature", "T", 1, 2),
    ("member_acc", "member Acc (%)", 100, 2),
    ("disagreement", "disagreement (%)", 100, 2),
    ("mi", "MI (nats)", 1, 4),
    ("k_eff", "k_eff", 1, 3),
    ("k_eff_scale", "k_eff (scale)", 1, 3),
    ("cp/aps/coverage", "APS cov. (%)", 100, 2),
    ("cp/aps/size", "APS size", 1, 2),
    ("cpu_s", "CPU-s", 1, 0),
)


def describe(path: str) -> str:
    """Mean ± std over seeds of :data:`DESCRIBE` per configuration (done cells), as Markdown;
    ``cpu_s`` is the records' ``timings.cpu_s``."""
    records = h.load_records(path)
    cpu = {r["cell_id"]: (r.get("timings") or {}).get("cpu_s") for r in records}
    cells = h.load_results(path)
    # single+TS is single's own cells, recalibrated: its numbers are single's TS columns
    plain = (cells["variant"].fillna("") == "") & ~cells["method"].str.endswith("+TS")
    cells = cells[(cells["status"] == "done") & plain].assign(cpu_s=lambda f: f["cell_id"].map(cpu))
    cols = [c for c in DESCRIBE if c[0] in cells.columns]
    lines = ["| configuration | n | " + " | ".join(c[1] for c in cols) + " |",
             "|---|---:|" + "---:|" * len(cols)]  # fmt: skip
    for (method, hparams), group in cells.groupby(["method", "hparams"], dropna=False, sort=False):
        values = []
        for col, _, scale, digits in cols:
            v = pd.to_numeric(group[col], errors="coerce").dropna() * scale
            values.append("–" if v.empty else f"{v.mean():.{digits}f} ± {v.std():.{digits}f}")
        name = f"{method} ({hparams})" if isinstance(hparams, str) and hparams else method
        lines.append(f"| {name} | {len(group)} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def _config(record: dict) -> str:
    """The name the tables give a record's configuration."""
    hp, method = record["config"].get("hparams") or {}, record["config"]["method"]
    return f"σN-Ens τ = {hp['tau']:g}" if "tau" in hp else NAMES.get(method, method)


def severities(path: str) -> str:
    """ECE per corruption severity (mean over the corruptions, then mean ± std over seeds), its
    slope (``ece_slope``, pp per level), the same after temperature scaling (the clean-fitted
    temperature applied to the corrupted sets) and accuracy at severities 1 and 5, as Markdown;
    from the records' ``metrics.corruption`` and ``metrics.calibration.ts.corruption``."""
    groups: dict[str, list[dict]] = {}
    for record in h.load_records(path):
        if record.get("status") == "done" and "corruption" in record.get("metrics", {}):
            groups.setdefault(_config(record), []).append(record)

    def stat(values: list[float], digits: int = 2) -> str:
        s = pd.Series(values) * 100
        return f"{s.mean():.{digits}f} ± {s.std():.{digits}f}"

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the study's results folder")
    parser.add_argument("--corruption", action="store_true", help="the corruption section")
    parser.add_argument("--describe", action="store_true", help="only the per-configuration table")
    parser.add_argument("--severities", action="store_true",
                        help="only the ECE-by-severity table (a corruption folder)")  # fmt: skip
    parser.add_argument("--csv", help="also write every comparison (raw and adjusted p) here")
    args = parser.parse_args()
    if args.describe or args.severities:
        print(describe(args.results) if args.describe else severities(args.results))
        return
    sections = CORRUPTION_SECTIONS if args.corruption else SECTIONS
    frames = []
    for section in sections:
        rows = section_rows(args.results, section)
        print(markdown(section, rows))
        frames.append(rows.assign(section=section.title))
    if args.csv:
        pd.concat(frames).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
