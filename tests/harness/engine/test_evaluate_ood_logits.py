"""The OOD pass computes the energy and max-logit scores from the member logits it already has
(issue 60 item 7): equal to the scores of the logits the model returned, and left out for a
model whose outputs are probabilities."""

from __future__ import annotations

import pytest
import torch

import harness.metrics as hm
from harness.contract import Evaluation, Recipe
from harness.engine.evaluate import evaluate_ood
from harness.engine.external import ExternalEnsemble


def _setup():
    from harness.data._machinery.base import default_data_root, training_splits
    from harness.registry import DATASETS

    spec = DATASETS.get("digits_hard")
    root = default_data_root(None)
    splits = training_splits(spec.load(root), 0)
    features = spec.in_shape[0] * spec.in_shape[1] * spec.in_shape[2]
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(2, features, spec.num_classes, generator=g)  # two members
    return spec, root, splits["test"], weights


def test_energy_and_max_logit_are_scored_on_the_models_logits_and_left_out_for_probs():
    spec, root, test, weights = _setup()
    seen: list[torch.Tensor] = []

    def logits_of(x: torch.Tensor) -> torch.Tensor:
        z = torch.einsum("bf,mfk->mbk", x.flatten(1), weights)  # (2, B, K)
        seen.append(z)
        return z

    evaluation = Evaluation(ood=("digits_hard_heldout",), cost=False)
    cpu = torch.device("cpu")
    raw, _ = evaluate_ood(ExternalEnsemble(logits_of, spec.num_classes), test, spec, evaluation,
                          Recipe(), cpu, root)  # fmt: skip
    got = raw["digits_hard_heldout"]
    assert list(got) == ["msp", "entropy", "mi", "energy", "max_logit"]
    z = torch.cat(seen, dim=1)  # the test set's batches, then the OOD set's
    id_z, ood_z = z[:, : len(test)], z[:, len(test) :]
    assert ood_z.shape[1] > 0
    for name, fn in hm.LOGIT_OOD_SCORES.items():
        assert got[name] == hm.ood_metrics(fn(id_z), fn(ood_z)), name
    assert 0.0 < got["energy"]["auroc"] < 1.0 and got["energy"] != got["max_logit"]

    # The same distributions from a model that gives probabilities: the probability scores are
    # the same (to float32 rounding of the softmax), the logit scores are left out.
    def probs_of(x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bf,mfk->mbk", x.flatten(1), weights).softmax(-1)

    probs_raw, _ = evaluate_ood(ExternalEnsemble(probs_of, spec.num_classes, outputs="probs"),
                                test, spec, evaluation, Recipe(), cpu, root)  # fmt: skip
    only = probs_raw["digits_hard_heldout"]
    assert list(only) == ["msp", "entropy", "mi"]
    for name in only:
        assert only[name]["auroc"] == pytest.approx(got[name]["auroc"], abs=1e-4), name


def test_add_only_gives_an_older_records_ood_sets_the_logit_scores_and_keeps_its_values():
    """``harness evaluate --add-only`` merges with :func:`add_missing`: a record written before
    these scores keeps every number it has and gains ``energy`` and ``max_logit``."""
    from harness.engine.reevaluate import add_missing

    old = {"ood": {"svhn": {"msp": {"auroc": 0.9}, "mi": {"auroc": 0.7}}}}
    new = {"ood": {"svhn": {"msp": {"auroc": 0.1}, "mi": {"auroc": 0.2},
                            "energy": {"auroc": 0.8}, "max_logit": {"auroc": 0.85}}}}  # fmt: skip
    assert add_missing(old, new) == {
        "ood": {"svhn": {"msp": {"auroc": 0.9}, "mi": {"auroc": 0.7},
                         "energy": {"auroc": 0.8}, "max_logit": {"auroc": 0.85}}}
    }  # fmt: skip
