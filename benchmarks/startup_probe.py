"""A ``--plugin`` module for ``benchmarks/startup.py``: at the process's first optimizer step it
writes the seconds since the process started and its CPU seconds (user + system) to
``$STARTUP_PROBE_OUT`` and exits the process at once.

Imported as a plugin, it runs wherever the cell runs: in this process (``--executor
inprocess``) or in a spawned worker (``--executor local``), which imports ``$HARNESS_PLUGINS``
before its first registry lookup. The start is the kernel's start time of the process
(``/proc/self/stat``), so the interpreter's own start-up is counted.
"""

from __future__ import annotations

import os
import resource

from torch.optim.optimizer import register_optimizer_step_pre_hook


def process_age() -> float:
    """Seconds since this process started, from ``/proc`` (clock-tick resolution)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _first_step(optimizer, args, kwargs) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["STARTUP_PROBE_OUT"], "w") as f:
        f.write(f"{process_age():.3f} {usage.ru_utime + usage.ru_stime:.3f}\n")
    os._exit(0)


register_optimizer_step_pre_hook(_first_step)
