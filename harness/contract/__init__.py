"""The contract layer: the types and formats every other layer agrees on.

Configuration (:class:`Recipe`, :class:`Evaluation`, :class:`Cell` with its id and JSON form), the
result record (construction, keys, metric names, conventions, label), and the results folder's
manifest. It imports only the standard library — never torch, never the rest of the project — so
the YAML parser produces it, and the engine, the executors and the reporter all consume it
(``tests/test_import_graph.py`` holds every layer to that).
"""

from harness.contract.build import build_dataclass, closest, field_doc, parse_name_values
from harness.contract.config import (
    SPEED_ONLY_RECIPE,
    BackboneEntry,
    Cell,
    Evaluation,
    ExternalCell,
    MethodEntry,
    Recipe,
    cell_label,
    expand_values,
    format_hparams,
    hparam_defaults,
    hparams_json,
    hparams_values,
    shown_hparams,
)
from harness.contract.diagnostics import Diagnostic, DiagnosticFigure, shown_diagnostics
from harness.contract.manifest import SUITE_FILE, build_manifest, expected_cells, read_manifest
from harness.contract.record import (
    CONVENTIONS,
    ENSEMBLE_METRIC_KEYS,
    OOD_CONVENTION,
    RECORD_FILE,
    SCHEMA_VERSION,
    DamagedRecord,
    RecordError,
    check_record_file,
    identity,
    is_cell_dir,
    iter_records,
    label_of,
    new_record,
    read_record,
    set_aside,
    usable_record,
    validate_record,
)

__all__ = [
    "CONVENTIONS",
    "ENSEMBLE_METRIC_KEYS",
    "OOD_CONVENTION",
    "RECORD_FILE",
    "SCHEMA_VERSION",
    "SPEED_ONLY_RECIPE",
    "SUITE_FILE",
    "BackboneEntry",
    "Cell",
    "DamagedRecord",
    "Diagnostic",
    "DiagnosticFigure",
    "Evaluation",
    "ExternalCell",
    "MethodEntry",
    "Recipe",
    "RecordError",
    "build_dataclass",
    "build_manifest",
    "cell_label",
    "check_record_file",
    "closest",
    "expand_values",
    "expected_cells",
    "field_doc",
    "format_hparams",
    "hparam_defaults",
    "hparams_json",
    "hparams_values",
    "identity",
    "is_cell_dir",
    "iter_records",
    "label_of",
    "new_record",
    "parse_name_values",
    "read_manifest",
    "read_record",
    "set_aside",
    "shown_diagnostics",
    "shown_hparams",
    "usable_record",
    "validate_record",
]
