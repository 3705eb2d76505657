"""The evaluation's progress: its passes (held-out fit, clean test set, validation, each
corruption × severity, each OOD set) and the batches of the pass that runs.

A bar over the passes, on a terminal when asked (redirected to a file, a bar would fill the
log), whose postfix names the pass and its batches (``clean 3/10 batches``); and, for the cell's
heartbeat (:class:`harness.storage.live.Heartbeat`, which the executors' per-cell lines and
``harness status`` read), the same pass and batch, whichever process evaluates. The batches are
counted where the evaluation iterates its loader (:func:`counted`), through the passes open in
this context: the functions between them take no extra argument.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from harness.contract import Evaluation
    from harness.data._machinery.base import DatasetSpec, Split
    from harness.storage.live import Heartbeat

T = TypeVar("T")

#: The passes of the evaluation running in this context (None: none, or not counted).
_OPEN: ContextVar[_Passes | None] = ContextVar("evaluation_passes", default=None)


class _Passes:
    """The evaluation's progress bar over its passes, and its heartbeat (``live``). The bar is
    shown only when asked and when standard error is a terminal."""

    def __init__(
        self,
        splits: dict[str, Split],
        evaluation: Evaluation,
        spec: DatasetSpec,
        progress: bool,
        live: Heartbeat | None = None,
    ) -> None:
        from tqdm.auto import tqdm

        total = int(evaluation.calibrate) + 1 + int("val" in splits)
        if evaluation.corruptions:
            from harness.data._machinery.corruption_sets import resolve_corruptions

            names = resolve_corruptions(spec.name, evaluation.corruptions)
            total += len(names) * len(evaluation.severities)
        if evaluation.ood:
            total += 1 + len(evaluation.ood)
        shown = progress and sys.stderr.isatty()
        self.bar = tqdm(total=total, desc="  evaluating", unit="pass", leave=False,
                        disable=not shown)  # fmt: skip
        self.live = live
        self.open = False  # a pass has started and not yet been counted
        self.label = ""
        self.done = 0  # passes over
        self._token: Any = None

    def step(self, label: str) -> None:
        """Count the pass that ran and name the next (``""``: none follows)."""
        if self.open:
            self.bar.update(1)
            self.done += 1
        self.open = bool(label)
        self.label = label
        if label:
            self.bar.set_postfix_str(label, refresh=False)
            if self.live is not None:
                self.live.evaluating(label, 0, None, self.done, int(self.bar.total))

    def batch(self, i: int, n: int | None) -> None:
        """``i`` batches of ``n`` (None: unknown) of the open pass are evaluated."""
        if not self.open:
            return
        of = f"/{n}" if n else ""
        if not self.bar.disable:
            self.bar.set_postfix_str(f"{self.label} {i}{of} batches")
        if self.live is not None:
            self.live.evaluating(self.label, i, n, self.done, int(self.bar.total))

    def __enter__(self) -> _Passes:
        self._token = _OPEN.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _OPEN.reset(self._token)
        self.bar.close()


def _step(bar: _Passes | None, label: str) -> None:
    """:meth:`_Passes.step` when there is a bar (the corruption and OOD functions are also
    called on their own, without one)."""
    if bar is not None:
        bar.step(label)


def counted(loader: Iterable[T]) -> Iterator[T]:
    """``loader``'s batches, each counted by the evaluation's open passes once evaluated."""
    passes = _OPEN.get()
    if passes is None:
        yield from loader
        return
    try:
        n: int | None = len(loader)  # type: ignore[arg-type]
    except TypeError:
        n = None
    for i, item in enumerate(loader, 1):
        yield item
        passes.batch(i, n)
