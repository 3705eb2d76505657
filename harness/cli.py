"""The ``harness`` command line: ls, validate, run, status, cancel, evaluate, report, bench, data.

Over 400 lines as one responsibility: the argument parser and one thin function per command that
parses, checks and hands over to the layer that does the work (suite parser, executors, reporter,
bench, data); no command logic of its own beyond printing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from harness.cli_checks import (
    Parser,
    debug_wanted,
    gpu_ids,
    non_negative_int,
    positive_int,
    run_flag_problems,
    unexpected_error,
    weights_errors,
)
from harness.suite_io import SuiteError


def _suite(path: str, overrides: list[str] | tuple[str, ...] = ()):
    from harness.suite import load_suite

    if Path(path).is_dir():
        raise SuiteError(
            [f"{path}: is a directory; give a suite YAML file (e.g. suites/smoke.yaml)"]
        )
    return load_suite(path, overrides)


def _preflight(suite, args, data_root: Path | None) -> int:
    """Print every problem knowable before training (suite, recipe, files, data); 2 if any."""
    from harness.preflight import suite_problems

    # Without a data root (validate --skip-data) weight files are not checked either.
    problems = suite_problems(suite, check_files=data_root is not None)
    problems += _tensorboard_problems(args)
    if data_root is not None:
        problems += [f"{args.suite}: {p}" for p in check_data(suite, data_root)]
    for p in problems:
        print(p, file=sys.stderr)
    return 2 if problems else 0


def _tensorboard_problems(args) -> list[str]:
    """``--tensorboard`` asks every cell for TensorBoard events through the environment, which
    local worker processes and Slurm tasks inherit; the package must be installed."""
    from harness.progress import TENSORBOARD_ENV, tensorboard_problems

    if getattr(args, "tensorboard", False):
        os.environ[TENSORBOARD_ENV] = "1"
    return tensorboard_problems()


def _results_dir(args, suite) -> Path:
    return Path(args.results or "results") / suite.name


def check_data(suite, data_root: Path) -> list[str]:
    """Problems with data a suite needs: each names the path looked in and the fetch command."""
    from harness.data.base import DataMissingError
    from harness.registries import DATASETS

    problems = []
    names = list(dict.fromkeys([*suite.grid.datasets, *suite.evaluation.ood]))
    for name in names:
        try:
            DATASETS.get(name).require(data_root)
        except DataMissingError as exc:
            problems.append(str(exc))
    if suite.evaluation.corruptions:
        from harness.data.corruption_sets import check_corruptions

        for name in suite.grid.datasets:  # only the files this suite's list needs
            problems.extend(check_corruptions(name, suite.evaluation.corruptions, data_root))
    return problems


def cmd_ls(args) -> int:
    from harness.registries import BACKBONES, DATASETS, METHODS
    from harness.schema import field_doc

    print("methods:")
    for name, spec in METHODS.items():
        bbs = ", ".join(spec.backbones) if spec.backbones else "any backbone"
        hps = ", ".join(f"{n}={d!r}" for n, _, d, _ in field_doc(spec.hparams)) or "-"
        print(f"  {name:16s} {spec.reference}\n  {'':16s} backbones: {bbs}; hparams: {hps}")
    print("backbones:")
    for name, spec in BACKBONES.items():
        print(f"  {name:16s} {spec.description}")
    print("datasets:")
    for name, spec in DATASETS.items():
        kind = f"K={spec.num_classes}" if spec.num_classes else "OOD only"
        print(f"  {name:16s} {kind:9s} {spec.description}")
    from harness.data.corruption_sets import corruption_listing

    print("corruption sets:")
    for name, description in corruption_listing():
        print(f"  {name:16s} {description}")
    return 0


def cmd_validate(args) -> int:
    from harness.overrides import CellFilter

    suite = _suite(args.suite, args.overrides)
    data_root = None
    if not args.skip_data:  # the data layer imports torch: only when the data is checked
        from harness.data.base import default_data_root

        data_root = default_data_root(args.data_root)
    if _preflight(suite, args, data_root):
        return 2
    cells = CellFilter(args.only).select(suite.cells())
    print(
        f"{args.suite}: OK — suite {suite.name!r}, {len(cells)} cells "
        f"({len(suite.grid.datasets)} datasets × {len(suite.grid.backbones)} backbones × "
        f"{len(suite.grid.methods)} methods × M {list(suite.grid.M)} × "
        f"{len(suite.grid.seeds)} seeds)"
    )
    if args.verbose:
        for c in cells:
            print(f"  {c.cell_id}  {c.label}")
    return 0


def cmd_run(args) -> int:
    from harness.data.base import default_data_root
    from harness.executors import ExecutorOptions, make_executor, pending, write_manifest
    from harness.overrides import CellFilter
    from reports.terminal import print_summary

    if flag_problems := run_flag_problems(args):  # before the suite: nothing has run yet
        raise SuiteError([f"harness run: {p}" for p in flag_problems])
    if args.executor == "slurm":  # the profile and --slurm overrides, before anything runs
        from slurm.profile import load_profile

        load_profile(args.profile, args.slurm)
    suite = _suite(args.suite, args.overrides)
    data_root = default_data_root(args.data_root)
    cells = CellFilter(args.only).select(suite.cells())
    results = _results_dir(args, suite)
    # Slurm tasks resolve their own data root (the profile's setup lines may set
    # HARNESS_DATA_ROOT there): the data is not checked on the submitting node.
    problems = _preflight(suite, args, None if args.executor == "slurm" else data_root)
    if args.dry_run:
        return print_plan(suite.cells(), cells, results, args.force) or problems
    if problems:
        return 2
    try:
        results.mkdir(parents=True, exist_ok=True)
        write_manifest(suite, results, tuple(args.only))
    except OSError as exc:  # its path, not that of the temporary file the write failed on
        problem = f"{results}: cannot write the results folder: {exc.strerror or exc}"
        raise SuiteError([problem]) from None
    todo = pending(cells, results, args.force)
    print(
        f"suite {suite.name!r}: {len(cells)} cells, {len(cells) - len(todo)} already done, "
        f"{len(todo)} to run → {results}"
    )
    t0 = time.perf_counter()
    options = ExecutorOptions(
        workers=args.workers,
        threads=args.threads,
        profile=args.profile,
        slurm_overrides=tuple(args.slurm),
        wait=args.wait,
        progress=not args.quiet,
        gpus=args.gpus,
        cells_per_gpu=args.cells_per_gpu or 1,
    )
    executor = make_executor(args.executor, options, len(todo))
    if executor.name == "local":
        print(executor.describe(len(todo)))
    if executor.name == "slurm":
        task_root = Path(args.data_root).expanduser().resolve() if args.data_root else None
        return print_summary(results) if executor.run(todo, results, task_root, False) else 0
    executor.run(todo, results, data_root, args.force)
    print(f"finished in {time.perf_counter() - t0:.1f} s")
    report_leased(executor.records)
    code = print_summary(results)
    # A cell that failed on its data or weights (missing, damaged) is the user's to fix: exit 2,
    # as for the same problem found before the run.
    missing = any((r.get("error") or {}).get("data_missing") for r in executor.records)
    return 2 if missing else code


def print_plan(all_cells: list, selected: list, results: Path, force: bool) -> int:
    """``--dry-run``: one line per cell of the suite, ``run`` or ``skip``, and why."""
    from harness.contract import DamagedRecord
    from harness.contract.done_index import DoneIndex
    from harness.lease import describe, live_leases

    chosen = {c.cell_id for c in selected}
    leases = live_leases(results) if results.is_dir() else {}
    index = DoneIndex(results) if results.is_dir() else None  # done: one stat per cell
    n_run = 0
    for c in all_cells:
        try:
            done = index is not None and index.is_done(c.cell_id)
            rec = {"status": "done"} if done else index and index.record(c.cell_id)
        except DamagedRecord as exc:
            rec = {"status": "damaged", "reason": exc.reason}
        status = (rec or {}).get("status")
        if c.cell_id not in chosen:
            verdict, why = "skip", "not selected by --only"
        elif c.cell_id in leases:
            verdict, why = "skip", f"leased by {describe(leases[c.cell_id])}"
        elif status == "done" and not force:
            verdict, why = "skip", "done"
        elif status == "done":
            verdict, why = "run", "done, redone (--force)"
        elif status == "damaged":
            verdict, why = "run", f"damaged record.json, set aside and redone: {rec['reason']}"
        elif status == "failed":
            err = (rec or {}).get("error") or {}
            where = f" in {err['phase']}" if err.get("phase") else ""
            verdict, why = "run", f"failed{where} ({err.get('type', '?')}), retried"
        else:
            verdict, why = "run", "pending"
        n_run += verdict == "run"
        print(f"{verdict:4s}  {c.cell_id}  {c.label}  ({why})")
    if index is not None:
        index.save()
    print(f"dry run: {n_run} of {len(all_cells)} cells would run → {results}")
    return 0


def report_leased(ran: list[dict]) -> None:
    """Name the cells this run skipped because another live process holds them."""
    from harness.lease import describe

    for r in ran:
        if r.get("status") == "leased":
            print(f"skipped {r['cell_id']}: leased by {describe(r['lease'])}")


def cmd_status(args) -> int:
    from harness.preflight import require_results
    from slurm.status import print_status

    return print_status(require_results(Path(args.results_dir), records=False))


def cmd_cancel(args) -> int:
    from harness.executors.slurm import cancel_suite

    return cancel_suite(Path(args.results_dir))


def cmd_evaluate(args) -> int:
    from harness.preflight import require_results
    from harness.reevaluate import reevaluate

    return reevaluate(require_results(Path(args.results_dir)), args.suite, args.data_root)


def cmd_report(args) -> int:
    from harness.preflight import require_results
    from reports.cli_options import report_kwargs
    from reports.leaderboard import write_report
    from reports.terminal import expected_of

    # The manifest's cells, never-started = missing; with overrides, the cells of the recorded
    # suite file with those overrides applied.
    expected = expected_of(args.results_dir)
    if args.overrides:
        from harness.contract import read_manifest

        expected = _suite(read_manifest(Path(args.results_dir))["source"], args.overrides).cells()
    out = write_report(
        require_results(Path(args.results_dir)),
        Path(args.output) if args.output else None,
        expected=expected,
        **report_kwargs(args),
    )
    print(f"wrote {out}")
    return 0


def cmd_bench(args) -> int:
    from harness.bench import main as bench_main

    return bench_main(args)


def cmd_data(args) -> int:
    from harness.data.base import default_data_root
    from harness.data.download import DownloadError, download

    root = default_data_root(args.data_root)
    for name in args.names:
        try:  # one line and exit 2, never a traceback (offline, bad checksum, unknown name)
            where = download(name, root)  # the data root, or the weights' cached file
        except (DownloadError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: ready in {where}")
    return 0


def _add_override_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="override suite entries, e.g. recipe.epochs=1 grid.seeds=[0,1] evaluation.ood=[] "
        "grid.methods.sigma_ens.hparams.tau=0.5 (values read as YAML)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="keep the cells matching every condition: method, M, seed, dataset, backbone or a "
        "hyper-parameter, e.g. --only method=sigma_ens,seed=0",
    )


def _add_plugin_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers methods, backbones or datasets); repeatable; "
        "worker processes and Slurm tasks import it too",
    )


def build_parser() -> argparse.ArgumentParser:
    from harness.executors import EXECUTORS  # the names to pick from: one registry
    from reports.cli_options import add_report_arguments  # argparse only, nothing heavy

    p = Parser(prog="harness", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an unexpected error (also: HARNESS_DEBUG=1)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("ls", help="list methods, backbones and datasets")
    _add_plugin_argument(ls)
    ls.set_defaults(fn=cmd_ls)

    v = sub.add_parser("validate", help="check a suite without training")
    v.add_argument("suite")
    _add_override_arguments(v)
    _add_plugin_argument(v)
    v.add_argument("--data-root")
    v.add_argument("--skip-data", action="store_true", help="do not check that data exists")
    v.add_argument("-v", "--verbose", action="store_true", help="list the cells")
    v.add_argument("--tensorboard", action="store_true", help="check run --tensorboard can work")
    v.set_defaults(fn=cmd_validate)

    r = sub.add_parser("run", help="run a suite's pending cells")
    r.add_argument("suite")
    _add_override_arguments(r)
    _add_plugin_argument(r)
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="list every cell that would run, and why the others would not (done, leased, "
        "--only); run nothing",
    )
    r.add_argument(
        "--executor",
        choices=["auto", *EXECUTORS],
        default="auto",
        help="auto: in-process for one cell or on a one-GPU machine, else local worker "
        "processes (one per GPU, or one per core without a GPU)",
    )
    r.add_argument(
        "--workers",
        type=positive_int,
        help="worker processes, >= 1 (default: one per GPU, else one per core)",
    )
    r.add_argument(
        "--gpus",
        type=gpu_ids,
        metavar="IDS",
        help="local executor: the GPUs to place cells on, e.g. 0,2 (default: every visible one)",
    )
    r.add_argument(
        "--cells-per-gpu",
        type=positive_int,
        metavar="N",
        help="local executor: cells running at once on each GPU, >= 1 (default 1)",
    )
    r.add_argument("--threads", type=positive_int, help="torch threads per process, >= 1")
    r.add_argument("--profile", help="Slurm cluster profile YAML (--executor slurm)")
    r.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a profile entry, e.g. --slurm partition=gpu",
    )
    r.add_argument("--wait", action="store_true", help="wait for Slurm jobs to finish")
    r.add_argument("--results", help="results root (default: results/)")
    r.add_argument(
        "--data-root",
        help="where datasets live (default: $HARNESS_DATA_ROOT or "
        "~/.cache/implicit-ensemble-harness/data)",
    )
    r.add_argument("--force", action="store_true", help="redo finished cells")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    r.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard events per epoch to <cell>/tensorboard/ (progress.csv is "
        "always written); needs the [tensorboard] extra",
    )
    r.set_defaults(fn=cmd_run)

    s = sub.add_parser("status", help="show each cell: pending/running/done/failed")
    s.add_argument("results_dir")
    s.set_defaults(fn=cmd_status)

    c = sub.add_parser("cancel", help="cancel a suite's running Slurm jobs")
    c.add_argument("results_dir")
    c.set_defaults(fn=cmd_cancel)

    e = sub.add_parser("evaluate", help="re-evaluate finished cells from their saved weights")
    e.add_argument("results_dir")
    _add_plugin_argument(e)
    e.add_argument(
        "--suite",
        help="suite file whose evaluation block to apply (default: the one recorded in suite.json)",
    )
    e.add_argument("--data-root")
    e.set_defaults(fn=cmd_evaluate)

    rep = sub.add_parser("report", help="write leaderboard.html, CSV and Markdown")
    rep.add_argument("results_dir")
    rep.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="expect the cells of the recorded suite file with these overrides",
    )
    _add_plugin_argument(rep)
    rep.add_argument("-o", "--output", help="output folder (default: the results folder)")
    add_report_arguments(rep)  # reports/cli_options.py: --reference --format --interval ...
    rep.set_defaults(fn=cmd_report)

    b = sub.add_parser("bench", help="throughput and memory side by side with the bound")
    b.add_argument("--backbone", default="resnet18")
    b.add_argument("--M", type=positive_int, default=4)
    b.add_argument("--batch", type=positive_int, default=128)
    b.add_argument("--image-size", type=positive_int, default=32)
    b.add_argument("--classes", type=positive_int, default=100)
    b.add_argument("--steps", type=positive_int, default=20)
    b.add_argument("--warmup", type=non_negative_int, default=5)
    b.add_argument("--compile", action="store_true")
    b.add_argument(
        "--loop",
        choices=["synthetic", "real"],
        default="synthetic",
        help="real: also time the real training loop (train_epoch, device loader, augmentation)",
    )
    b.add_argument("--methods", nargs="*")
    b.add_argument("--device", default="auto")
    b.add_argument("-o", "--output", default="bench.json")
    b.set_defaults(fn=cmd_bench)

    d = sub.add_parser("data", help="fetch datasets (needs internet)")
    dsub = d.add_subparsers(dest="data_command", required=True)
    dl = dsub.add_parser("download")
    dl.add_argument(
        "names",
        nargs="+",
        help="datasets and corruption sets (see harness ls), or weights timm:NAME / "
        "torchvision:ENUM.VALUE (into the library's own cache)",
    )
    dl.add_argument("--data-root")
    dl.set_defaults(fn=cmd_data)
    return p


def main(argv: list[str] | None = None) -> int:
    from harness.contract.errors import DamagedFile
    from harness.executors.devices import ExecutorError
    from harness.registry import RegistryError, load_plugins

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE after an option (`run s.yaml --force recipe.epochs=1`) lands in `extra`:
    # overrides wherever they stand on the line.
    if hasattr(args, "overrides"):
        args.overrides += [e for e in extra if "=" in e and not e.startswith("-")]
        extra = [e for e in extra if e not in args.overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        if getattr(args, "plugin", None):
            load_plugins(args.plugin)
        return int(args.fn(args) or 0)
    except SuiteError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    except (RegistryError, FileNotFoundError, ExecutorError, DamagedFile) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        return 0
    except KeyboardInterrupt:
        print(
            "\ninterrupted: finished cells are kept; re-run the same command to resume",
            file=sys.stderr,
        )
        return 130
    except OSError as exc:  # the file system refused: one line naming the path
        if debug_wanted(args):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug or an input no layer names yet: one line, not a traceback
        if isinstance(exc, weights_errors()):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if debug_wanted(args):
            raise
        return unexpected_error(exc)


if __name__ == "__main__":
    sys.exit(main())
