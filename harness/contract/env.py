"""Every ``HARNESS_*`` environment variable the harness reads: its allowed values, and the one
reader each place that reads it goes through (issue 58, item 6).

Why one table: a variable read deep inside a cell (``int(os.environ[...])`` in the data loader,
``float(...)`` in the lease) turned a typo into a traceback, or an "unexpected error", minutes
into a run, or was silently ignored (``HARNESS_DEBUG=false`` switched debugging *on*). Here each
variable is one :class:`Variable` with a parser and the words for its allowed values, so that

- ``harness``'s ``main`` checks every variable that is set before any command runs
  (:func:`check_environment`): a bad value is one line naming the variable, the value and what
  is allowed, exit status 2, nothing read or written;
- a read site (``LOADER_WORKERS.read(None)``) raises :class:`EnvError` (a ``UsageError``) with
  the same line, for the processes that do not start through ``main`` (workers, Slurm tasks,
  the Python API);
- the tests can check that no module reads a ``HARNESS_*`` name this table lacks.

A variable set to the empty string (or blanks) counts as unset, as every read site treated it,
except ``HARNESS_FASHION_MNIST_DIR``, whose empty value means "do not look in Debian's folder".

Standard library only (the contract layer): checking the environment imports nothing heavy.
"""

from __future__ import annotations

import math
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from harness.contract.errors import UsageError

T = TypeVar("T")
D = TypeVar("D")


class EnvError(UsageError):
    """An environment variable holds a value the harness cannot use. ``str()`` is the one line a
    command prints: the variable, its value, why, and the allowed values."""

    def __init__(self, name: str, value: str, why: str, allowed: str) -> None:
        self.name, self.value, self.why, self.allowed = name, value, why, allowed
        super().__init__(
            f"environment variable {name}={value!r}: {why}; allowed: {allowed}; give an "
            f"allowed value or unset {name}"
        )


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One ``HARNESS_*`` variable.

    Attributes:
        name: the variable (``HARNESS_LOADER_WORKERS``).
        allowed: its allowed values in words, for messages and the docs.
        parse: the value's text (stripped, never empty) → the typed value; raises ``ValueError``
            saying why the text is not allowed.
        empty_is_value: the empty string is a value of its own (passed to ``parse``), not
            "unset".
        internal: set by the harness for its own processes (a user has no reason to set it):
            listed here so that the table names every variable, never checked.
    """

    name: str
    allowed: str
    parse: Callable[[str], T]
    empty_is_value: bool = False
    internal: bool = False

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The text to parse: None when unset (or empty, unless ``empty_is_value``)."""
        value = (os.environ if environ is None else environ).get(self.name)
        if value is None or (not value.strip() and not self.empty_is_value):
            return None
        return value.strip()

    def read(self, default: D, environ: Mapping[str, str] | None = None) -> T | D:
        """The variable's value, or ``default`` when it is unset.

        Raises:
            EnvError: the value is not allowed (naming the variable, the value, the allowed).
        """
        text = self.raw(environ)
        if text is None:
            return default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise EnvError(self.name, text, str(exc), self.allowed) from None

    def problem(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The one line :meth:`read` would raise, or None when the value is fine or unset."""
        if self.internal:
            return None
        try:
            self.read(None, environ)
        except EnvError as exc:
            return str(exc)
        return None


# --------------------------------------------------------------------------- the parsers


def whole(lo: int) -> Callable[[str], int]:
    """A whole number ≥ ``lo``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError("not a whole number") from None
        if value < lo:
            raise ValueError(f"below {lo}")
        return value

    return parse


def seconds(above: float) -> Callable[[str], float]:
    """A finite number of seconds > ``above``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("not a number of seconds") from None
        if not math.isfinite(value) or value <= above:
            raise ValueError(f"not a finite number above {above:g}")
        return value

    return parse


def choice(*choices: str) -> Callable[[str], str]:
    """One of ``choices`` (exactly)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError("not a known value")
        return text

    return parse


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def flag(text: str) -> bool:
    """A yes/no switch: 1/true/yes/on or 0/false/no/off, any case."""
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("not a yes/no value")


_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def module_names(text: str) -> list[str]:
    """Comma-separated importable names (``pkg.mod,other``); empty items are skipped."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not _DOTTED.match(n)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a module name (dotted identifiers, no spaces)")
    return names


def files(text: str) -> list[Path]:
    """``os.pathsep``-separated file paths (a folder is refused: it would trust nothing inside
    it); empty items are skipped. A path where no file is yet trusts nothing until one is."""
    paths = [Path(p.strip()).expanduser() for p in text.split(os.pathsep) if p.strip()]
    for path in paths:
        if path.is_dir():
            raise ValueError(f"{str(path)!r} is a folder, not a file")
    return paths


def folder(text: str) -> Path:
    """A folder: one that exists, or a path where nothing is yet (created when needed)."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError("a file, not a folder")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ValueError(f"it cannot be created: {str(above)!r} is a file")
    return path


def existing_folder(text: str) -> Path:
    """A folder that exists."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise ValueError("a file, not a folder" if path.exists() else "no such folder")
    return path


def optional_folder(text: str) -> Path | None:
    """:func:`folder`, or None for the empty value (the variable switches a place off)."""
    return folder(text) if text else None


_SCHEMES = ("http", "https", "ftp", "file")


def base_url(text: str) -> str:
    """A base URL a file name is appended to: http(s)://host/…, ftp://host/… or file:///…."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in _SCHEMES or not (parts.netloc or parts.scheme == "file"):
        raise ValueError("not a base URL")
    return text


# ------------------------------------------------------------------------------ the table

#: The built-in values of ``HARNESS_SIGMA_KERNELS`` (methods._triton).
SIGMA_KERNEL_MODES = ("auto", "triton", "reference")
#: The values of ``HARNESS_PROGRESS``: how a run shows each running cell beneath the bar over
#: cells (harness.executors.live): ``auto`` a live line per cell on a terminal and a line per
#: finished epoch otherwise, ``live`` and ``epochs`` either one wherever the output goes, ``off``
#: none (``harness run -q`` shows none whatever it says).
PROGRESS_MODES = ("auto", "live", "epochs", "off")
#: The lease's heartbeat interval (harness.storage.lease.HEARTBEAT_S): a timeout at or below it
#: would take over the lease of a process that is alive and between two heartbeats.
LEASE_HEARTBEAT_S = 30.0

SIGMA_KERNELS: Variable[str] = Variable(
    "HARNESS_SIGMA_KERNELS", ", ".join(SIGMA_KERNEL_MODES), choice(*SIGMA_KERNEL_MODES)
)
PROGRESS: Variable[str] = Variable(
    "HARNESS_PROGRESS", ", ".join(PROGRESS_MODES), choice(*PROGRESS_MODES)
)
CONCURRENT_CELLS: Variable[int] = Variable(
    "HARNESS_CONCURRENT_CELLS", "a whole number >= 1", whole(1)
)
LOADER_WORKERS: Variable[int] = Variable(
    "HARNESS_LOADER_WORKERS", "a whole number >= 0 (0: decode in the main process)", whole(0)
)
LEASE_TIMEOUT_S: Variable[float] = Variable(
    "HARNESS_LEASE_TIMEOUT_S",
    f"a number of seconds above {LEASE_HEARTBEAT_S:g} (the lease's heartbeat interval)",
    seconds(LEASE_HEARTBEAT_S),
)
DIST_TIMEOUT_S: Variable[float] = Variable(
    "HARNESS_DIST_TIMEOUT_S", "a number of seconds above 0", seconds(0.0)
)
TRUST_PICKLE: Variable[list[Path]] = Variable(
    "HARNESS_TRUST_PICKLE", f"paths of files (not folders) separated by {os.pathsep!r}", files
)
DEBUG: Variable[bool] = Variable("HARNESS_DEBUG", "1, true, yes, on or 0, false, no, off", flag)
DATA_ROOT: Variable[Path] = Variable(
    "HARNESS_DATA_ROOT", "a folder (it may not exist yet), not a file", folder
)
CACHE_DIR: Variable[Path] = Variable(
    "HARNESS_CACHE_DIR", "a folder (it may not exist yet), not a file", folder
)
FASHION_MNIST_DIR: Variable[Path | None] = Variable(
    "HARNESS_FASHION_MNIST_DIR",
    "a folder, not a file, or the empty string (do not look in Debian's folder)",
    optional_folder,
    empty_is_value=True,
)
FONT_DIR: Variable[Path] = Variable("HARNESS_FONT_DIR", "an existing folder", existing_folder)
DOWNLOAD_MIRROR: Variable[str] = Variable(
    "HARNESS_DOWNLOAD_MIRROR", "a base URL: http(s)://…, ftp://… or file:///…", base_url
)
_MODULES = "comma-separated importable module names (pkg.mod,other)"
PLUGINS: Variable[list[str]] = Variable("HARNESS_PLUGINS", _MODULES, module_names)
METHOD_PACKAGES: Variable[list[str]] = Variable("HARNESS_METHOD_PACKAGES", _MODULES, module_names)
BACKBONE_PACKAGES: Variable[list[str]] = Variable(
    "HARNESS_BACKBONE_PACKAGES", _MODULES, module_names
)
DATASET_PACKAGES: Variable[list[str]] = Variable("HARNESS_DATASET_PACKAGES", _MODULES, module_names)
CELL_RANK: Variable[str] = Variable(
    "HARNESS_CELL_RANK", "set by the harness in a cell's ranks", str, internal=True
)

#: Every variable, by name.
VARIABLES: dict[str, Variable[Any]] = {
    v.name: v
    for v in (
        SIGMA_KERNELS,
        PROGRESS,
        CONCURRENT_CELLS,
        LOADER_WORKERS,
        LEASE_TIMEOUT_S,
        DIST_TIMEOUT_S,
        TRUST_PICKLE,
        DEBUG,
        DATA_ROOT,
        CACHE_DIR,
        FASHION_MNIST_DIR,
        FONT_DIR,
        DOWNLOAD_MIRROR,
        PLUGINS,
        METHOD_PACKAGES,
        BACKBONE_PACKAGES,
        DATASET_PACKAGES,
        CELL_RANK,
    )
}


def check_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per variable of :data:`VARIABLES` set to a value it does not allow (what
    ``harness``'s ``main`` prints, then exits 2, before any command runs)."""
    return [p for v in VARIABLES.values() if (p := v.problem(environ)) is not None]


def misspelled_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per ``HARNESS_*`` variable that is set, is not in :data:`VARIABLES`,
    and is one letter or so from one that is (``HARNESS_LOADER_WORKER``): set, it would be
    ignored without a word. Names far from every known one (a test's own switches) pass."""
    import difflib

    env = os.environ if environ is None else environ
    known = list(VARIABLES)
    out = []
    for name in sorted(n for n in env if n.startswith("HARNESS_") and n not in VARIABLES):
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            out.append(f"environment variable {name} is not one the harness reads (did you mean "
                       f"{close[0]}?); it is ignored")  # fmt: skip
    return out
