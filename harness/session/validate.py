"""Validate a suite: :func:`validate_suite`, what ``harness validate`` and
:func:`harness.api.validate` call. Every problem knowable before training, no cell run, nothing
changed (no environment variable, no file)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.config.includes import SuiteError
from harness.session.options import ValidateOptions
from harness.session.result import Validation


def validate_suite(suite: str | os.PathLike, options: ValidateOptions) -> Validation:
    """Load and check a suite once: the suite and its overrides, then what this machine must
    have (the trackers; with ``check_data`` the data, the ``pretrained:`` weight files and,
    when ``results`` is given, the results folder).

    Args:
        suite: the suite YAML file.
        options: the overrides, ``only`` filters and what else to check
            (:class:`~harness.session.ValidateOptions`).

    Returns:
        The suite's name, its cells (after ``only``) and the methods ``methods: [all]`` left out.

    Raises:
        SuiteError: every problem, each naming its file and key, the override, the path looked
            in or the tracker.
    """
    from harness.config.overrides import CellFilter
    from harness.registry.core import load_plugins
    from harness.session.checks import default_root, load_suite_arg, preflight

    if options.plugins:
        load_plugins(options.plugins)
    # Without data, weight files are not checked either: weights are data too.
    loaded = load_suite_arg(suite, options.overrides, check_files=options.check_data)
    root = default_root(options.data_root) if options.check_data else None
    results = Path(options.results) / loaded.name if options.results is not None else None
    if problems := preflight(loaded, str(suite), options.trackers, root, results):
        raise SuiteError(problems)
    every = loaded.cells()
    cells = CellFilter(list(options.only)).select(every)
    return Validation(loaded.name, cells, list(loaded.left_out), len(every), loaded)
