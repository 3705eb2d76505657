"""What the command line checks before anything runs, and how it answers: one line per problem.

- :class:`Parser`: argparse, with its error printed as one line (argparse prints the usage block
  first) and exit status 2; the sub-command parsers inherit it.
- Argument types with the valid range in their message (:func:`positive_int`, :func:`gpu_ids`).
- :func:`unexpected_error`: the last resort of ``harness``'s ``main``: an exception no layer
  turned into a message becomes one line naming it and how to see the traceback (``--debug`` or
  ``HARNESS_DEBUG=1``), never a traceback by default.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

#: harness.contract.env.DEBUG (its allowed values); named here for the messages, without the import.
DEBUG_ENV = "HARNESS_DEBUG"


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line: ``harness run: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type: a whole number ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def tag_pair(text: str) -> tuple[str, str]:
    """argparse type: ``key=value`` → ``(key, value)`` (a tracker tag)."""
    from harness.storage.tracker_options import parse_tag

    try:
        return parse_tag(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_int(text: str) -> int:
    """argparse type: a whole number ≥ 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# CUDA_VISIBLE_DEVICES accepts indices and the GPU-/MIG- UUIDs nvidia-smi -L prints.
_GPU_ID = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z/-]+)$")


def gpu_ids(text: str) -> tuple[str, ...]:
    """argparse type: ``0,2`` → ``("0", "2")``; every id a device index or a GPU/MIG UUID."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"{text!r} names no GPU; give ids such as 0,1")
    if "" in parts:
        raise argparse.ArgumentTypeError(f"{text!r} has an empty id between commas")
    bad = [p for p in parts if not _GPU_ID.match(p)]
    if bad:
        shown = ", ".join(repr(p) for p in bad)
        raise argparse.ArgumentTypeError(
            f"{shown}: not a GPU id (a device index such as 0, or a GPU-/MIG- UUID)"
        )
    return tuple(dict.fromkeys(parts))


def debug_wanted(args: Any = None) -> bool:
    """``--debug`` or ``$HARNESS_DEBUG`` set to a yes value (1, true, yes, on). Asked while an
    error is being reported, so never raising: a value :mod:`harness.contract.env` does not
    allow (refused at start-up) counts as yes, as any value but empty/0 did before."""
    from harness.contract.env import DEBUG, EnvError

    if getattr(args, "debug", False):
        return True
    try:
        return bool(DEBUG.read(False))
    except EnvError:
        return True


def unexpected_error(exc: BaseException) -> int:
    """Print one line for an exception nothing else handled; exit status 1."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    detail = f": {first}" if first else ""
    print(
        f"error: {type(exc).__name__}{detail} (an unexpected error; run again with --debug or "
        f"{DEBUG_ENV}=1 for the traceback)",
        file=sys.stderr,
    )
    return 1


def weights_errors() -> tuple[type[BaseException], ...]:
    """The weights-file errors (a user's file, exit 2) of the modules loaded so far: those
    modules import torch, which ``status``, ``ls`` and ``report`` must not pay for, and an
    exception of a module never imported cannot have been raised."""
    found = []
    for module, name in (
        ("harness.backbones._weights", "WeightsError"),
        ("harness.storage.checkpoint", "UnsafeWeightsError"),
    ):
        if module in sys.modules:
            found.append(getattr(sys.modules[module], name))
    return tuple(found)
