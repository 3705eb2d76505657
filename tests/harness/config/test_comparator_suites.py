"""mCE over the severities a cell and its baseline share, and the suites that compare like with
like: the UB WRN-28-10 reproduction (no dropout where UB has none, UB's recipes) and
cifar100_wrn's MC Dropout (single's dropout kept on at test)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.registry import METHODS
from methods._base import BuildContext

# --- mCE over the common severities ------------------------------------------------------------

# baseline error per severity 1..5 on two corruptions (rising with severity, as on CIFAR-C)
BASE_ERR = {"gaussian_noise": [0.1, 0.2, 0.4, 0.6, 0.8], "contrast": [0.05, 0.1, 0.3, 0.5, 0.7]}


def test_mce_uses_the_severities_both_models_have():
    from reports.stats.summary import mean_corruption_error

    base = {c: dict(enumerate(e, start=1)) for c, e in BASE_ERR.items()}
    mine = {c: {s: 0.8 * base[c][s] for s in (1, 2)} for c in base}  # 0.8×, fewer severities
    assert mean_corruption_error(mine, base) == pytest.approx(0.80)
    # CE_c = Σ_s E / Σ_s E_base (Hendrycks & Dietterich), not the mean of per-severity ratios
    mine = {"contrast": {1: 0.1, 2: 0.1}}
    assert mean_corruption_error(mine, base) == pytest.approx(0.2 / 0.15)
    assert math.isnan(mean_corruption_error({"fog": {1: 0.3}}, base))


def test_mce_warns_on_a_zero_baseline_corruption():
    from reports.stats.summary import mean_corruption_error

    base = {"gaussian_noise": {1: 0.5}, "contrast": {1: 0.0}}
    mine = {"gaussian_noise": {1: 0.4}, "contrast": {1: 0.1}}
    with pytest.warns(UserWarning, match=r"baseline's error is 0 on contrast .*left out"):
        value = mean_corruption_error(mine, base)
    assert value == pytest.approx(0.8)


def test_report_mce_with_mismatched_severities_is_0_80():
    """A method with exactly 0.8× the baseline's error, evaluated at severities 1–2 only, against
    a baseline evaluated at 1–5: mCE 0.80 in the report."""
    from record_factory import make_record

    from reports.records.results import from_records

    def record(method, m, seed, sevs, factor):
        cells = [
            {"corruption": c, "severity": s, "acc": 1 - factor * e[s - 1], "nll": 1.0, "ece": 0.1}
            for c, e in BASE_ERR.items()
            for s in sevs
        ]
        return make_record(
            method=method,
            M=m,
            seed=seed,
            acc=0.9,
            dataset="cifar10",
            backbone="wrn28_10",
            overrides={"metrics": {"corruption": {"cells": cells}}},
        )

    recs = [record("single", 1, s, (1, 2, 3, 4, 5), 1.0) for s in (0, 1)]
    recs += [record("deep_ensemble", 4, s, (1, 2), 0.8) for s in (0, 1)]
    summary = from_records(recs).summary.set_index("method")
    assert summary.loc["deep_ensemble", "mCE_mean"] == pytest.approx(0.80)
    assert summary.loc["single", "mCE_mean"] == pytest.approx(1.0)


# --- the UB reproduction and cifar100_wrn compare like with like --------------------------------


def _live_dropouts(cell) -> dict[str, tuple[type, float]]:
    """{module name: (type, p)} of the dropout modules with p > 0 in the cell's model (built on
    the meta device: only the structure is read)."""
    from torch.nn.modules.dropout import _DropoutNd

    spec = METHODS.get(cell.method)
    ctx = BuildContext(cell.backbone, (3, 32, 32), 100, cell.M, dict(cell.backbone_kwargs))
    with torch.device("meta"):
        model = spec.build(ctx, spec.make_hparams(cell.hparams))
    return {
        n: (type(m), m.p) for n, m in model.named_modules() if isinstance(m, _DropoutNd) and m.p > 0
    }


def test_ub_reproduction_rows_without_dropout_in_ub_have_none():
    from harness.config.parse import load_suite

    cells = load_suite("suites/reproduce/ub_wrn28_10.yaml").cells()
    by = {(c.dataset, c.method): c for c in cells}
    for method in ("single", "deep_ensemble", "batch_ensemble", "mimo"):
        cell = by[("cifar10", method)]
        assert cell.backbone_kwargs == {"dropout_rate": 0.0}, method
        assert _live_dropouts(cell) == {}, method
    mc = _live_dropouts(by[("cifar10", "mc_dropout")])  # UB: element-wise, residual branch
    assert len(mc) == 12 and set(mc.values()) == {(torch.nn.Dropout, 0.1)}
    assert by[("cifar10", "batch_ensemble")].hparams["fast_weight_lr_multiplier"] == 0.5


def test_cifar100_wrn_mc_dropout_trains_with_singles_dropout():
    """MC Dropout there is `single`'s network and dropout kept on at test: the same dropout
    modules at the same rates (not 0.1 in place of the backbone's 0.3)."""
    from harness.config.parse import load_suite

    cells = load_suite("suites/cifar100_wrn.yaml").cells()
    single = next(c for c in cells if c.method == "single")
    mc = next(c for c in cells if c.method == "mc_dropout")
    ours = {n.removeprefix("net.core_model."): v for n, v in _live_dropouts(mc).items()}
    theirs = {n.removeprefix("net."): v for n, v in _live_dropouts(single).items()}
    assert theirs and ours == theirs
    assert {p for _, p in theirs.values()} == {0.3}
