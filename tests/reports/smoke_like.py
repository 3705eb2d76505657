"""A results folder like the smoke suite's at two seeds (issue 60 item 8): every built-in method
on digits_hard with the digits CNN, two OOD sets, corruptions, post-hoc temperature scaling and
APS sets, σN-Ens at τ = 0.2 and τ = 2 with every other setting the same, and the single model's
MI scores as the engine writes them (MI is 0 for one model: its MI-AUROC is 50%)."""

from __future__ import annotations

from typing import Any

from record_factory import make_record

OOD_SETS = ("digits_hard_heldout", "sklearn_photos_hard")
SIGMA = {"gamma_init_mean": 0.0, "gate_fold": "constant", "lam": 0.01}
#: (method, M, hparams, accuracy): 11 configurations, 22 trained cells at two seeds.
CONFIGS: tuple[tuple[str, int, dict[str, Any], float], ...] = (
    ("single", 1, {}, 0.937),
    ("deep_ensemble", 2, {}, 0.948),
    ("deep_ensemble", 4, {}, 0.953),
    ("sigma_ens", 4, {**SIGMA, "tau": 0.2}, 0.943),
    ("sigma_ens", 4, {**SIGMA, "tau": 2.0}, 0.951),
    ("film_ensemble", 4, {}, 0.673),
    ("batch_ensemble", 4, {}, 0.917),
    ("packed_ensemble", 4, {"alpha": 2, "gamma": 1}, 0.858),
    ("mc_dropout", 4, {"dropout_rate": 0.2}, 0.921),
    ("mimo", 4, {}, 0.905),
    ("masksembles", 4, {}, 0.899),
)


def _calibration(acc: float, nll: float, ece: float) -> dict[str, Any]:
    """A post-hoc calibration block as the evaluator writes it (docs/records.md), APS at α 0.1."""
    sets = {"coverage": 0.9, "size": 1.4, "coverage_fallback": 0.93, "size_fallback": 1.45,
            "empty_rate": 0.03}  # fmt: skip
    return {
        "method": "temperature_scaling",
        "fitted_on": "calibration",
        "n": 500,
        "temperature": 1.3,
        "alpha": 0.1,
        "quantiles": {"thr": 0.9, "aps": 0.9, "raps": 0.9},
        "quantile_rule": "ceil((n+1)(1-alpha))-th smallest",
        "time_s": 0.1,
        "ts": {
            "clean": {
                "acc": acc,
                "nll": nll - 0.01,
                "ece": ece / 2,
                "brier": 1 - acc,
                "aece": ece,
                "aurc": (1 - acc) / 2,
            },
            "corruption": {"mean": {"acc": acc - 0.2, "nll": nll + 1, "ece": ece + 0.1}},
            "ood": {s: {"msp": {"auroc": 0.84}, "entropy": {"auroc": 0.85}} for s in OOD_SETS},
        },
        "conformal": {
            m: {"clean": dict(sets), "corruption": {"mean": dict(sets)}}
            for m in ("thr", "aps", "raps")
        },
    }


def smoke_like_records(seeds: tuple[int, ...] = (0, 1)) -> list[dict[str, Any]]:
    """One valid record per configuration of :data:`CONFIGS` and seed; accuracy moves by 0.2
    points from seed to seed (the same for every method), NLL and ECE follow accuracy; OOD AUROC
    and throughput differ by configuration (no column ties)."""
    recs = []
    for i, (method, m, hparams, acc) in enumerate(CONFIGS):
        for seed in seeds:
            a = acc + 0.002 * seed
            nll, ece = 2.0 * (1 - a), 0.5 * (1 - a)
            overrides: dict[str, Any] = {"metrics": {"calibration": _calibration(a, nll, ece)}}
            if m == 1:  # MI is 0 for one model: its scores tie, AUROC 50%
                mi = {"auroc": 0.5, "aupr_in": 0.5, "aupr_out": 0.5, "fpr95": 1.0}
                overrides["metrics"]["ood"] = {s: {"mi": mi} for s in OOD_SETS}
            recs.append(
                make_record(
                    suite="smoke", dataset="digits_hard", backbone="digits_cnn", method=method,
                    M=m, hparams=hparams, seed=seed, acc=a, nll=nll, ece=ece, ood_sets=OOD_SETS,
                    k_eff=(1.5 if hparams.get("tau") == 0.2 else 3.0) if method == "sigma_ens"
                    else None, params=58_000 * m, eval_ips=900.0 + 50 * i + 10 * seed,
                    auroc=0.80 + 0.01 * i, fpr95=0.5 - 0.01 * i,
                    overrides=overrides,
                )
            )  # fmt: skip
    return recs
