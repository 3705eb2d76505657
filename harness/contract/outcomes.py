"""The per-image outcomes file beside a record (``outcomes.npz``): its name and fields, the one
definition the engine (which writes it, :mod:`harness.metrics.outcomes`) and the reporter (which
reads it, :mod:`reports.records.outcomes`) share.

NumPy's compressed archive (``.npz``) of plain arrays, no pickled objects, one value per test
image in the split's order; the raw ensemble mean's arrays under their field names, the
pool-then-calibrate prediction's under ``ts/<field>`` (``correct`` only once: a temperature does
not change the top label). 10,000 test images take about 220 KB (float32 noise does not
compress).
"""

from __future__ import annotations

#: The file beside ``record.json``.
OUTCOMES_FILE = "outcomes.npz"

#: The per-image quantities of one view and their NumPy dtypes: ``correct`` (argmax of p̄ equals
#: the label), ``nll`` (−log max(p̄[y], 1e-12), nats), ``brier`` (Σ_k (p̄_k − 1[k = y])²),
#: ``confidence`` (max_k p̄_k).
FIELDS = {"correct": "bool", "nll": "float32", "brier": "float32", "confidence": "float32"}
