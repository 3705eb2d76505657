"""The Slurm executor: one job array through submitit, one task per cell (``submit.py`` beside
it holds the task and the submitit glue; this adapts it to the executor protocol)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.contract import Cell, usable_record
from harness.executors.base import ExecutorOptions, RunOutcome


class SlurmExecutor:
    """Submits the cells as a job array; with ``wait``, returns once every task has ended.

    Args:
        options: ``profile``, ``slurm_overrides``, ``wait``, ``progress`` and ``trackers``
            (in each task's payload) are used; the profile and its overrides are read here, so
            a bad one stops the run before anything is submitted.
    """

    name = "slurm"
    reads = ("profile", "slurm_overrides", "wait", "progress", "trackers")
    runs_here = False  # tasks resolve their own data root (a profile setup line may set it)

    def __init__(self, options: ExecutorOptions) -> None:
        from harness.executors.slurm.profile import load_profile

        self.options = options
        self.profile = with_plugins(load_profile(options.profile, list(options.slurm_overrides)))
        self.array_id: str | None = None

    def describe(self, n_cells: int) -> str:
        return f"submitting {n_cells} cells as one Slurm job array"

    def run(
        self, cells: list[Cell], results_dir: Path, data_root: Path | None, force: bool
    ) -> RunOutcome:
        from harness.executors.slurm.submit import submit_cells, wait_jobs

        jobs = submit_cells(
            cells, results_dir, data_root, self.profile, force=force, trackers=self.options.trackers
        )
        if not jobs:
            return RunOutcome(finished=True, messages=["nothing to submit: every cell is done"])
        self.array_id = jobs[0].job_id.split("_")[0]
        message = (
            f"submitted job array {self.array_id} with {len(jobs)} tasks; follow it with "
            f"`harness status {results_dir}`, stop it with `harness cancel {results_dir}`"
        )
        if not self.options.wait:
            return RunOutcome(finished=False, messages=[message])
        wait_jobs(jobs, progress=self.options.progress, cells=cells, results_dir=results_dir)
        # The tasks wrote the records; a cell whose task died before writing one has none.
        records = [usable_record(Path(results_dir) / c.cell_id) for c in cells]
        return RunOutcome(finished=True, records=[r for r in records if r], messages=[message])


def with_plugins(profile):
    """The profile with a setup line exporting ``$HARNESS_PLUGINS`` (``--plugin`` modules), so
    every task imports them whatever the cluster's environment propagation (``--export``)."""
    import dataclasses
    import os
    import shlex

    from harness.registry.core import PLUGINS_ENV

    modules = os.environ.get(PLUGINS_ENV)
    if not modules:
        return profile
    line = f"export {PLUGINS_ENV}={shlex.quote(modules)}"
    return dataclasses.replace(profile, setup=(*profile.setup, line))


def cancel_suite(results_dir: Path) -> int:
    """``harness cancel``: scancel every unfinished job of the suite (here, not in
    ``harness.executors.slurm.submit``, so that ``harness.executors.status`` →
    ``harness.executors.slurm.submit`` stays one-way)."""
    from harness.executors.status import cell_states

    active = sorted(
        {
            s.job_id
            for s in cell_states(results_dir)
            if s.state in ("running", "queued") and s.job_id
        }
    )
    if not active:
        print("no running or queued jobs")
        return 0
    out = subprocess.run(["scancel", *active], capture_output=True, text=True)
    if out.returncode:
        print(out.stderr.strip(), file=sys.stderr)
        return 1
    print(f"cancelled {len(active)} tasks: {' '.join(active)}")
    return 0
