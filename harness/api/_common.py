"""What every part of the API shares: the path type and the error that carries problems."""

from __future__ import annotations

import os
from collections.abc import Sequence

PathLike = str | os.PathLike


class HarnessError(ValueError):
    """A suite, an override or the data is not right; ``problems`` holds one line each (the
    lines ``harness validate`` prints)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def argument_problems(
    paths: dict[str, object] | None = None,
    strings: dict[str, object] | None = None,
    counts: dict[str, object] | None = None,
) -> list[str]:
    """What the command line's parser refuses, for the keyword arguments that stand for its
    flags: ``paths`` a file or folder (str or ``os.PathLike``), ``strings`` a list of strings
    (one bare string would be taken a character at a time: ``"recipe.epochs=2"`` as 16
    overrides), ``counts`` None or a whole number >= 1 (``workers="2"``, ``0``, ``True``)."""
    out = []
    for name, value in (paths or {}).items():
        if not isinstance(value, str | os.PathLike):
            out.append(f"{name}: {value!r}: pass a path (str or pathlib.Path)")
    for name, value in (strings or {}).items():
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            example = f"[{value!r}]" if isinstance(value, str) else '["..."]'
            out.append(f"{name}: {value!r}: pass a list of strings, e.g. {name}={example}")
        elif bad := [v for v in value if not isinstance(v, str)]:
            out.append(f"{name}: {bad[0]!r} is not a string")
    for name, value in (counts or {}).items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            out.append(f"{name}: {value!r}: pass a whole number >= 1, or None for the default")
    return out
