"""The built-in metric columns, registered as a plugin's are (``register_metric``): the clean
test set's ensemble metrics that the engine's metric collection computes
(``harness.contract.record.ENSEMBLE_METRIC_KEYS``; the KL divergence has no column). Imported
by ``METRICS`` on its first lookup, before any plugin."""

from __future__ import annotations

from harness.contract.metric_spec import MetricSpec
from harness.registry import register_metric

for spec in (
    MetricSpec("acc", "Acc (%)", "Quality", "pct", "higher"),
    MetricSpec("nll", "NLL", "Quality", "f3", "lower"),
    MetricSpec("ece", "ECE (%)", "Quality", "pct", "lower"),
    MetricSpec("brier", "Brier", "Quality", "f3", "lower"),
    MetricSpec("aece", "aECE (%)", "Quality", "pct", "lower", hidden=True),
    MetricSpec("aurc", "AURC (%)", "Quality", "pct", "lower"),
    # Diversity has no better direction: never highlighted.
    MetricSpec("disagreement", "Disagr. (%)", "Diversity", "pct"),
    MetricSpec("mi", "MI", "Diversity", "f3", hidden=True),
):
    register_metric(spec)
