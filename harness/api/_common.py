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
