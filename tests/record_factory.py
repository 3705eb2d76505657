"""Valid fake result records for the report tests.

``make_record`` builds a record that passes :func:`harness.contract.record.validate_record`, with
metrics
derived from a few knobs (``acc``, ``nll``, ``ece``, ...) so a test can state exactly the numbers it
later checks. ``overrides`` is deep-merged last, for anything the knobs do not cover (a NaN metric,
a hostile string, a missing section: a value of ``DELETE`` removes the key).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.contract.record import validate_record
from harness.storage.records import write_record

DELETE = object()

CONVENTIONS = {
    "ood": "AUROC, AUPR-In, AUPR-Out, FPR@95%TPR with ID as the positive class (OpenOOD)",
    "ece": "15 equal-width bins, L1",
    "ensemble": "mean of member softmax probabilities",
}

ENVIRONMENT = {
    "python": "3.11.9",
    "torch": "2.11.0",
    "torch_uncertainty": "0.13.0",
    "platform": "Linux-6.1-x86_64",
    "device": "cpu",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "hostname": "node-a",
    "cpu": "AMD EPYC 9654",
}


def cell_id_for(config: Mapping[str, Any]) -> str:
    """A content hash of a config, like the harness's cell ids (safe as a folder name)."""
    blob = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _deep_update(target: dict[str, Any], changes: Mapping[str, Any]) -> None:
    for key, value in changes.items():
        if value is DELETE:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _ood_groups(dataset: str, ood_sets: Sequence[str]) -> dict[str, Any]:
    """``{"ood_groups": …}`` as the engine writes it (the sets' near/far groups its registered
    dataset declares), or nothing for a dataset that is not registered or declares none."""
    from harness.registry import DATASETS

    declared = DATASETS.get(dataset).ood_groups if dataset in DATASETS else {}
    groups = {s: declared[s] for s in ood_sets if s in declared}
    return {"ood_groups": groups} if groups else {}


def make_record(
    *,
    suite: str = "toy",
    cell_id: str | None = None,
    dataset: str = "digits",
    backbone: str = "mlp",
    method: str = "deep_ensemble",
    M: int = 4,
    hparams: Mapping[str, Any] | None = None,
    seed: int = 0,
    status: str = "done",
    acc: float = 0.9,
    nll: float = 0.35,
    ece: float = 0.03,
    brier: float | None = None,
    corruption: bool = True,
    ood_sets: Sequence[str] = ("svhn",),
    auroc: float = 0.85,
    fpr95: float = 0.45,
    k_eff: float | None = None,
    params: int = 1_000_000,
    eval_ips: float = 5000.0,
    error: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A valid schema-1 record for one cell; see the module docstring."""
    hparams = dict(hparams or {})
    config = {
        "dataset": dataset,
        "backbone": backbone,
        "backbone_kwargs": {},
        "method": method,
        "M": M,
        "hparams": hparams,
        "seed": seed,
        "recipe": {"epochs": 2, "lr": 0.1, "batch_size": 64},
    }
    brier = (1.0 - acc) * 1.2 if brier is None else brier
    metrics: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    if status == "done":
        metrics["clean"] = {
            "acc": acc,
            "nll": nll,
            "brier": brier,
            "ece": ece,
            "aece": ece * 1.1,
            "aurc": (1.0 - acc) * 0.5,
            "disagreement": 0.05 if M > 1 else 0.0,
            "mi": 0.02 if M > 1 else 0.0,
            "kl": 0.03 if M > 1 else 0.0,
            "members": {
                "acc": [acc - 0.01 * (m + 1) for m in range(M)],
                "nll": [nll + 0.02 * (m + 1) for m in range(M)],
                "brier": [brier + 0.01 for _ in range(M)],
                "ece": [ece + 0.005 for _ in range(M)],
            },
        }
        metrics["val"] = {"acc": acc + 0.005, "nll": nll - 0.01, "ece": ece}
        if corruption:
            per_sev = {
                str(s): {"acc": acc - 0.08 * s, "nll": nll + 0.3 * s, "ece": ece + 0.01 * s}
                for s in range(1, 6)
            }
            cells = [
                {"corruption": c, "severity": s, **per_sev[str(s)]}
                for c in ("gaussian_noise", "contrast")
                for s in range(1, 6)
            ]
            mean = {k: sum(v[k] for v in per_sev.values()) / 5 for k in ("acc", "nll", "ece")}
            metrics["corruption"] = {"cells": cells, "per_severity": per_sev, "mean": mean}
        if ood_sets:
            metrics["ood"] = {
                name: {
                    score: {
                        "auroc": auroc - 0.01 * i,
                        "aupr_in": auroc + 0.02,
                        "aupr_out": auroc - 0.03,
                        "fpr95": fpr95 + 0.01 * i,
                    }
                    for i, score in enumerate(("msp", "entropy", "mi"))
                }
                for name in ood_sets
            }
        if k_eff is not None:
            # The layout of methods/sigma_diversity.sharing_diagnostics plus τ, λ and L_div,
            # as the runner records it (docs/records.md).
            diagnostics["per_epoch"] = [
                {
                    "epoch": e,
                    "k_eff": k_eff + (1 - e) * 0.3,
                    "k_eff_scale": k_eff + 0.1 + (1 - e) * 0.3,
                    "grad_ratio": 4.0 / (e + 1),  # shrinks as γ settles
                    "importance": 0.5,
                    "num_features": 192,
                    "layers": {
                        "layer1.bn": {"k_eff": k_eff, "importance": 0.5, "num_features": 64},
                        "layer2.bn": {
                            "k_eff": k_eff + (1 - e) * 0.6,
                            "importance": 0.5,
                            "num_features": 128,
                        },
                    },
                    "tau": 1.0,
                    "lam": 0.01,
                    "l_div": -5.0,
                }
                for e in range(2)
            ]
            from harness.registry import METHODS  # what the runner writes: the declarations

            diagnostics["declared"] = [d.to_json() for d in METHODS.get("sigma_ens").diagnostics]
    elif error is None:
        error = {
            "type": "RuntimeError",
            "message": "CUDA out of memory",
            "traceback": 'Traceback (most recent call last):\n  File "runner.py"\nRuntimeError',
        }
    rec: dict[str, Any] = {
        "schema_version": 1,
        "suite": suite,
        "cell_id": cell_id or cell_id_for({**config, "suite": suite}),
        "status": status,
        "config": config,
        "evaluation": {
            "corruptions": ["gaussian_noise", "contrast"],
            "ood": list(ood_sets),
            **_ood_groups(dataset, ood_sets),
        },
        "metrics": metrics,
        "cost": {
            "params_total": params,
            "params_trainable": params,
            "params_single": params // max(M, 1),
            "params_overhead": params - params // max(M, 1),
            "flops_per_image": params * 2,
            "train_images_per_s": eval_ips / 3,
            "eval_images_per_s": eval_ips,
            "peak_train_mem_mib": None,
            "peak_eval_mem_mib": None,
            "train_time_s": 12.5,
            "epoch_time_s": 6.25,
        },
        "history": [
            {"epoch": e, "train_loss": 1.0 / (e + 1), "val_acc": acc, "val_nll": nll, "time_s": 6.0}
            for e in range(2)
        ],
        "diagnostics": diagnostics,
        "timings": {"total_s": 20.0, "train_s": 12.5, "eval_s": 7.5},
        "environment": dict(ENVIRONMENT),
        "conventions": dict(CONVENTIONS),
        "error": dict(error) if status == "failed" else None,
        "started_at": f"2026-12-01T10:{seed % 60:02d}:00+00:00",
        "finished_at": f"2026-12-01T11:{seed % 60:02d}:00+00:00",
    }
    if overrides:
        _deep_update(rec, overrides)
    validate_record(rec)
    return rec


def write_records(results_dir: Path, records: Iterable[Mapping[str, Any]]) -> list[Path]:
    """Write each record to ``results_dir/<cell_id>/record.json`` (validated, atomic)."""
    return [write_record(Path(results_dir) / r["cell_id"], dict(r)) for r in records]


def tau_sweep_records(*, single_acc: float | None = None, seed_step: float = 0.0) -> list[dict]:
    """A τ × M sweep of σN-Ens (τ ∈ {0.05, 0.5, 3}, M ∈ {2, 4}, seeds 0–1) with a deep ensemble
    at each M and, when ``single_acc`` is given, a single model: what the figure tests draw.
    σN-Ens's accuracy grows with τ (and by ``seed_step`` per seed), its ECE falls, and its k_eff
    follows τ/(1 + τ) between 1 and M."""
    recs = []
    for s in (0, 1):
        if single_acc is not None:
            recs.append(make_record(method="single", M=1, seed=s, acc=single_acc))
        for M in (2, 4):
            recs.append(make_record(method="deep_ensemble", M=M, seed=s, acc=0.8 + 0.02 * M))
            for tau in (0.05, 0.5, 3.0):
                recs.append(
                    make_record(
                        method="sigma_ens",
                        M=M,
                        seed=s,
                        hparams={"tau": tau},
                        acc=0.85 + 0.01 * tau + seed_step * s,
                        ece=0.05 - 0.01 * tau,
                        k_eff=1 + tau / (1 + tau) * (M - 1),
                    )
                )
    return recs
