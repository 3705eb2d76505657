"""``harness validate SUITE [KEY=VALUE…]``: every problem knowable before training, no cell run.

The checks are :func:`harness.session.validate_suite` (which :func:`harness.api.validate` calls
too); this module turns the flags into its options and prints the result. Checking changes
nothing: no environment variable, no file (the trackers asked for are options the run hands to
its cells, :func:`tracker_options_of`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.storage.tracker_options import TrackerOptions


def tracker_options_of(args: Any) -> TrackerOptions:
    """The trackers ``--logger`` (repeatable), ``--tensorboard``, ``--tag key=value``,
    ``--mlflow-experiment``, ``--wandb-project`` and ``--log-model`` ask for (those of the flags
    the command has), as the options the executor hands to every cell's process."""
    from harness.storage.tracker_options import TrackerOptions

    return TrackerOptions.of(
        getattr(args, "logger", None) or (),
        getattr(args, "tag", None) or (),
        tensorboard=getattr(args, "tensorboard", False),
        mlflow_experiment=getattr(args, "mlflow_experiment", None),
        wandb_project=getattr(args, "wandb_project", None),
        log_model=getattr(args, "log_model", False),
    )


def cmd_validate(args: Any) -> int:
    """``harness validate``: :func:`harness.session.validate_suite`, then one line for the suite
    (``--verbose``: one per cell) and one per method ``methods: [all]`` leaves out."""
    from harness.session import ValidateOptions, validate_suite

    options = ValidateOptions(
        overrides=tuple(args.overrides),
        only=tuple(args.only),
        check_data=not args.skip_data,
        data_root=Path(args.data_root) if args.data_root else None,
        results=Path(args.results or "results"),
        trackers=tracker_options_of(args),
    )
    checked = validate_suite(args.suite, options)  # SuiteError: every problem, exit 2
    grid = checked.definition.grid
    shape = (
        f"{len(grid.datasets)} datasets × {len(grid.backbones)} backbones × "
        f"{len(grid.methods)} methods × M {sorted({c.M for c in checked.cells})} × "
        f"{len(grid.seeds)} seeds"  # the Ms the cells have (a method's own M, single's 1)
    )
    # With --only the count is of the selected cells; the grid they are taken from says so.
    if len(checked.cells) != checked.grid_cells:
        shape = f"of the grid's {checked.grid_cells}: {shape}"
    print(f"{args.suite}: OK — suite {checked.suite!r}, {len(checked.cells)} cells ({shape})")
    for name, why in checked.left_out:  # a new backbone family must not drop methods silently
        print(f"  methods: [all] leaves out {name}: {why}")
    if args.verbose:
        for c in checked.cells:
            print(f"  {c.cell_id}  {c.label}")
    return 0
