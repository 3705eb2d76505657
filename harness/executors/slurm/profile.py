"""Cluster profiles: YAML files in ``slurm/profiles/`` validated into a frozen dataclass.

The dataclass is the source of truth for valid keys (unknown keys are rejected with the list of
valid ones), as for suites; ``--slurm KEY=VALUE`` overrides an entry from the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.includes import SuiteError, read_yaml_file
from harness.config.overrides import parse_assignment
from harness.contract.build import build_dataclass

# The named profiles stay in the checkout's slurm/ folder, beside the local test cluster.
PROFILES = Path(__file__).resolve().parents[3] / "slurm" / "profiles"


@dataclass(frozen=True)
class SlurmProfile:
    """Where and how cells run on a Slurm cluster (one array task per cell)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpus_per_node: int = field(default=0, metadata={"ge": 0})
    cpus_per_task: int = field(default=4, metadata={"ge": 1})
    mem_gb: float | None = field(default=None, metadata={"gt": 0})
    timeout_min: int = field(default=240, metadata={"ge": 1, "help": "time limit per task"})
    array_parallelism: int = field(default=64, metadata={"ge": 1})
    signal_delay_s: int = field(
        default=120,
        metadata={
            "ge": 1,
            "help": "seconds before the time limit that the job is told to checkpoint",
        },
    )
    max_num_timeout: int = field(
        default=10, metadata={"ge": 0, "help": "requeues after time limits"}
    )
    setup: tuple[str, ...] = field(
        default=(),
        metadata={"help": "shell lines run before each task (module load ..., source venv)"},
    )
    additional: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "extra sbatch options, e.g. {exclude: node01}"}
    )

    def executor_parameters(self) -> dict[str, Any]:
        """Keyword arguments of submitit's ``AutoExecutor.update_parameters``."""
        params: dict[str, Any] = {
            "timeout_min": self.timeout_min,
            "cpus_per_task": self.cpus_per_task,
            "slurm_array_parallelism": self.array_parallelism,
            "slurm_signal_delay_s": self.signal_delay_s,
        }
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        if self.mem_gb:
            params["mem_gb"] = self.mem_gb
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(self, key):
                params[f"slurm_{key}"] = getattr(self, key)
        if self.setup:
            params["slurm_setup"] = list(self.setup)
        if self.additional:
            params["slurm_additional_parameters"] = dict(self.additional)
        return params


def load_profile(path: str | Path | None, overrides: list[str] = ()) -> SlurmProfile:
    """Read a profile (a path, or a name in ``slurm/profiles/``) and apply KEY=VALUE overrides.

    Raises:
        SuiteError: naming the file, the key and the valid keys.
    """
    data: dict[str, Any] = {}
    where = "profile"
    if path:
        p = Path(path)
        if not p.exists() and (PROFILES / f"{path}.yaml").exists():
            p = PROFILES / f"{path}.yaml"
        if not p.exists():
            names = ", ".join(sorted(x.stem for x in PROFILES.glob("*.yaml")))
            raise SuiteError([f"{path}: profile not found (shipped profiles: {names})"])
        data = read_yaml_file(p, "profile")
        where = str(p)
    problems = []
    for item in overrides:
        try:  # the suite overrides' parser: KEY=VALUE, non-empty key, value read as YAML
            key, value = parse_assignment(item, "--slurm")
        except SuiteError as exc:
            problems += exc.problems
            continue
        data[key] = value
    if problems:
        raise SuiteError(problems)
    errors: list[str] = []
    profile = build_dataclass(SlurmProfile, data, "", errors)
    if errors:
        raise SuiteError([f"{where}: {e}" for e in errors])
    return profile
