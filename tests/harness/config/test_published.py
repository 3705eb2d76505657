"""The reproduction suite's expected values: uncertainty-baselines' published WRN-28-10 numbers.

Source: google/uncertainty-baselines, baselines/cifar/README.md at commit
b3b38ee3a14161de02bfd1df34432c576a983b57 (tables "CIFAR-10" and "CIFAR-100"). The numbers below
are copied from that README by hand, independently of the CSV, so a typo in either fails here.
README units: accuracy and cA in percent, NLL and cNLL in nats, calibration error (ECE) as a
fraction; the CSV stores accuracies as fractions, the unit of our records' ``acc`` / ``cAcc``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from harness.config.parse import load_suite

SUITE = Path(__file__).resolve().parents[3] / "suites" / "reproduce" / "ub_wrn28_10.yaml"
CSV = SUITE.with_name("ub_wrn28_10.published.csv")
COLUMNS = ["dataset", "backbone", "method", "M", "hparams", "metric", "value", "source"]
SOURCE = (
    "https://github.com/google/uncertainty-baselines/blob/"
    "b3b38ee3a14161de02bfd1df34432c576a983b57/baselines/cifar/README.md"
)

# README row → (method, M): "Deterministic", "Ensemble (size=4)", "BatchEnsemble (size=4)",
# "MIMO" (M=3 in mimo.py), "Monte Carlo Dropout (size=30)".
# Values: (Test NLL, Test Accuracy %, Test Cal. Error, cNLL, cA %, cCE), as printed.
README = {
    ("cifar10", "single", 1): (0.159, 96.0, 0.0231, 1.05, 76.1, 0.153),
    ("cifar10", "deep_ensemble", 4): (0.114, 96.6, 0.010, 0.81, 77.9, 0.087),
    ("cifar10", "batch_ensemble", 4): (0.136, 96.3, 0.0177, 0.97, 77.8, 0.124),
    ("cifar10", "mimo", 3): (0.123, 96.4, 0.010, 0.927, 76.6, 0.112),
    ("cifar10", "mc_dropout", 30): (0.145, 96.1, 0.019, 1.27, 70.0, 0.167),
    ("cifar100", "single", 1): (0.875, 79.8, 0.0857, 2.70, 51.37, 0.239),
    ("cifar100", "deep_ensemble", 4): (0.666, 82.7, 0.021, 2.27, 54.1, 0.138),
    ("cifar100", "batch_ensemble", 4): (0.690, 81.9, 0.0265, 2.56, 53.1, 0.149),
    ("cifar100", "mimo", 3): (0.690, 82.0, 0.022, 2.28, 53.7, 0.129),
    ("cifar100", "mc_dropout", 30): (0.785, 80.7, 0.0487, 2.73, 46.2, 0.207),
}


def _rows() -> list[dict[str, str]]:
    with CSV.open(newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        return list(reader)


def _hparams(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split(";")) if text else {}


def test_csv_has_exactly_the_readme_numbers_in_record_units():
    got = {}
    for row in _rows():
        key = (row["dataset"], row["method"], int(row["M"]), row["metric"])
        assert key not in got, f"duplicate row {key}"
        assert row["backbone"] == "wrn28_10" and row["source"] == SOURCE
        got[key] = float(row["value"])
    expected = {}
    for (ds, method, m), (nll, acc, ece, cnll, cacc, cece) in README.items():
        for metric, value in zip(
            ("nll", "acc", "ece", "cNLL", "cAcc", "cECE"),
            (nll, acc / 100, ece, cnll, cacc / 100, cece),
        ):
            expected[(ds, method, m, metric)] = value
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    assert all(0 < v < 1 for k, v in got.items() if k[3] in ("acc", "cAcc"))


def test_every_published_row_is_a_cell_of_the_suite_and_every_cell_has_rows():
    suite = load_suite(SUITE)
    cells = suite.cells()
    published = {
        (r["dataset"], r["backbone"], r["method"], int(r["M"]), r["hparams"]) for r in _rows()
    }
    for ds, bb, method, m, hp in published:
        matching = [
            c
            for c in cells
            if (c.dataset, c.backbone, c.method, c.M) == (ds, bb, method, m)
            and all(str(c.hparams.get(k)) == v for k, v in _hparams(hp).items())
        ]
        assert len(matching) == 1, (ds, method, m, hp)
    assert {(c.dataset, c.method, c.M) for c in cells} == {(k[0], k[2], k[3]) for k in published}
    assert suite.evaluation.corruptions == ("all",)
    # UB's configuration: members see the whole batch; MIMO repeats each image 4 times.
    by_method = {c.method: c for c in cells if c.dataset == "cifar10"}
    assert by_method["batch_ensemble"].hparams["batch"] == "repeat"
    assert by_method["mimo"].hparams["batch_repetitions"] == 4
    assert by_method["mc_dropout"].hparams["dropout_rate"] == 0.1
    assert by_method["deep_ensemble"].hparams["independent_data"] is True
