"""Evaluate a model you already have with the benchmark's evaluation, and see it beside a suite's
cells. Trains nothing.

Two ways to get a model, both real:

- ``--from-cells`` (default when the suite's results exist): the suite's finished ``single`` cells
  (one per seed) loaded with ``harness.api.load_model`` and put together as an ensemble of
  independently trained models (a deep ensemble assembled after the fact);
- ``--scratch``: a nearest-class-mean classifier this script builds from the suite's training
  split (``harness.api.data``: the images the suite's cells train on, normalised as they get
  them; class means, softmax of minus the squared distances): one model.

Either goes through ``harness.api.evaluate`` on the suite's own splits and evaluation (clean test
set, corruptions, OOD sets, temperature scaling and conformal sets on the held-out images) and is
written beside the suite's cells:

    harness run suites/smoke.yaml                 # once: the cells to stand beside
    python examples/evaluate_your_model.py        # → results/smoke/<id>/record.json
    harness report results/smoke                  # the page now has a row "singles_ensemble"

Only ``harness.api`` is imported from the harness.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

import torch
from torch import nn

import harness.api as h
from harness.api import evaluate, load_model


class UsageError(ValueError):
    """An argument this script cannot use: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose error is one line (argparse prints the usage block first), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Stacked(nn.Module):
    """Several models as one ensemble: input (B, C, H, W) → logits (M, B, K), M = Σ members."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.models = nn.ModuleList(models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m(x) for m in self.models], dim=0)


class NearestClassMean(nn.Module):
    """p(k | x) ∝ exp(−‖x − μ_k‖² / d): a classifier built from class means, no training."""

    def __init__(self, means: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("means", means)  # (K, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        return -torch.cdist(flat, self.means).square() / flat.shape[1]  # (B, K) logits


def from_cells(folder: Path, suite: h.Validation, method: str = "single") -> nn.Module:
    """The finished ``method`` cells of the suite as it is now, stacked (one member per seed).
    Cells of another recipe in the same folder (an override such as ``recipe.epochs=2``, an
    earlier version of the suite) are left out: their ids are not the suite's.

    Raises:
        UsageError: the folder holds no finished ``method`` cell of the suite with its weights.
    """
    ids = {c.cell_id for c in suite.cells if c.method == method}
    cells = sorted(
        folder / r["cell_id"]
        for r in h.load_records(folder)  # damaged records are left out (harness status names them)
        if r.get("status") == "done"
        and r.get("cell_id") in ids
        and (folder / r["cell_id"] / "final.pt").is_file()
    )
    if not cells:
        raise UsageError(f"--results: {folder} holds no finished {method} cell with weights; run "
                         "the suite first or pass --scratch")  # fmt: skip
    print(f"stacking {len(cells)} {method} cells: {' '.join(c.name for c in cells)}")
    return Stacked([load_model(c) for c in cells])


def scratch(suite: str, dataset: str) -> nn.Module:
    """A nearest-class-mean classifier from the suite's training split of ``dataset``."""
    train = h.data(dataset, "train", suite=suite)
    x, y = train.tensors()  # float32 (N, C, H, W) normalised as the model's input, int64 (N,)
    x = x.flatten(1)
    means = torch.stack([x[y == k].mean(0) for k in range(train.num_classes)])
    return NearestClassMean(means)


def checked(args: argparse.Namespace) -> tuple[h.Validation, Path]:
    """The suite's cells and its results folder, once every argument is known to be usable
    (nothing is loaded or evaluated before).

    Raises:
        HarnessError: the suite does not load, or its data is not on this machine.
        UsageError: anything else about the arguments, in one line naming it.
    """
    try:
        validation = h.validate(args.suite, check_data=True)
    except h.HarnessError as exc:
        raise h.HarnessError([f"--suite: {line}" for line in exc.problems]) from None
    datasets = sorted({c.dataset for c in validation.cells})
    if len(datasets) != 1:
        raise UsageError(f"--suite {args.suite}: its cells use {len(datasets)} datasets "
                         f"({', '.join(datasets) or 'none'}); give a suite with one")  # fmt: skip
    folder = Path(args.results) / validation.suite
    for path in (Path(args.results), folder):
        if path.exists() and not path.is_dir():
            raise UsageError(f"--results {args.results}: {path} is a file, not a folder")
    if not args.scratch and not folder.is_dir():
        raise UsageError(f"--results {args.results}: no folder {folder} with the suite's cells; "
                         f"run `harness run {args.suite}` first or pass --scratch")  # fmt: skip
    return validation, folder


def main(argv: list[str] | None = None) -> Path:
    """Evaluate, write the record and return its folder. A mistake in the arguments is one line
    on stderr and exit status 2 (``SystemExit``), before anything is evaluated."""
    parser = Parser(prog=Path(__file__).name, description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="suites/smoke.yaml")
    parser.add_argument("--results", default="results", help="the results root")
    parser.add_argument("--scratch", action="store_true", help="the nearest-class-mean model")
    args = parser.parse_args(argv)
    try:
        validation, folder = checked(args)
        dataset = validation.cells[0].dataset
        if args.scratch:
            model, name, backbone = scratch(args.suite, dataset), "nearest_class_mean", "external"
        else:
            backbone = validation.cells[0].backbone  # the cells' own network, so the same table
            model, name = from_cells(folder, validation), "singles_ensemble"
        out = evaluate(model, suite=args.suite, name=name, backbone=backbone,
                       results=args.results, progress=True)  # fmt: skip
    except (ValueError, FileNotFoundError) as exc:  # HarnessError, UsageError, damaged weights
        parser.exit(2, "error: " + "; ".join(str(exc).splitlines()) + "\n")
    clean = out.record["metrics"]["clean"]
    print(f"{name}: M={out.record['config']['M']} acc {clean['acc']:.4f} nll {clean['nll']:.4f} "
          f"ece {clean['ece']:.4f} → {out.path}")  # fmt: skip
    print(f"next: harness report {folder}")
    return out.path


if __name__ == "__main__":
    main()
