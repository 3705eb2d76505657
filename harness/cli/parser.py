"""The ``harness`` argument parser: one sub-command per module of :mod:`harness.cli`.

Each command's function is named as ``"module:function"`` and imported only when that command
runs, so ``harness --help`` (and a mistyped flag) costs no import of torch or pandas.
"""

from __future__ import annotations

import argparse

from harness.cli.checks import Parser, gpu_ids, non_negative_int, positive_int, tag_pair

DESCRIPTION = """The ``harness`` command line: ls, validate, run, status, cancel, evaluate, report,
upgrade, bench, data."""


def _add_override_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="override suite entries, e.g. recipe.epochs=2 grid.seeds=[0,1] evaluation.ood=[] "
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
    """The ``harness`` parser: global flags, then one sub-command per module of harness.cli."""

    p = Parser(prog="harness", description=DESCRIPTION)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an unexpected error (also: HARNESS_DEBUG=1)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_ls(sub)
    _add_validate(sub)
    _add_run(sub)
    _add_status(sub)
    _add_cancel(sub)
    _add_evaluate(sub)
    _add_report(sub)
    _add_upgrade(sub)
    _add_bench(sub)
    data = _add_data(sub)
    for command in [*sub.choices.values(), *data.choices.values()]:
        # After the command too (`harness run SUITE --debug`), where the error line's hint
        # puts it; SUPPRESS keeps a sub-command's default from undoing `harness --debug run`.
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of an unexpected error")  # fmt: skip
    return p


def _add_ls(sub) -> None:
    """``harness ls``."""
    ls = sub.add_parser(
        "ls", help="list methods, backbones, datasets, corruption sets, metrics and executors"
    )
    _add_plugin_argument(ls)
    ls.set_defaults(fn="harness.cli.ls:cmd_ls")


def _add_validate(sub) -> None:
    """``harness validate``."""
    v = sub.add_parser("validate", help="check a suite without training")
    v.add_argument("suite")
    _add_override_arguments(v)
    _add_plugin_argument(v)
    v.add_argument("--data-root")
    v.add_argument(
        "--results",
        help="results root whose free space is checked (default: results/, as for run)",
    )
    v.add_argument(
        "--skip-data",
        action="store_true",
        help="do not check that data exists (nor the data root, weights files, free space)",
    )
    v.add_argument("-v", "--verbose", action="store_true", help="list the cells")
    v.add_argument("--tensorboard", action="store_true", help="check run --tensorboard can work")

    v.add_argument(
        "--logger",
        action="append",
        default=[],
        metavar="NAME",
        help="check that run --logger NAME can work (tensorboard, wandb, mlflow)",
    )
    v.set_defaults(fn="harness.cli.validate:cmd_validate")


def _add_run(sub) -> None:
    """``harness run``."""
    r = sub.add_parser("run", help="run a suite's pending cells")
    r.add_argument("suite")
    _add_override_arguments(r)
    _add_plugin_argument(r)
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="list every cell that would run, and why the others would not (done, leased, "
        "--only); run nothing and check no data (harness validate does). Above 50 cells: "
        "the cells that would run or are leased (the first 50), and the count per reason",
    )
    r.add_argument(
        "--list",
        action="store_true",
        help="with --dry-run: one line for every cell of the suite, whatever its size",
    )
    # No `choices=`: a --plugin module or an entry point may add an executor, known only once
    # plugins are imported (after parsing); `harness run` checks the name then, worded as here.
    r.add_argument(
        "--executor",
        default="auto",
        metavar="NAME",
        help="auto (default), inprocess, local, slurm, or a plugin's (harness ls lists them). "
        "auto: in-process for one cell or on a one-GPU machine, else local worker processes "
        "(one per GPU, or one per core without a GPU)",
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
    r.add_argument(
        "--force", action="store_true",
        help="redo finished cells (their earlier files are set aside as NAME.replaced-<time>, "
        "and put back if the redo is interrupted)",
    )  # fmt: skip
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    _add_tracker_options(r)
    r.set_defaults(fn="harness.cli.run:cmd_run")


def _add_tracker_options(r) -> None:
    """``harness run``'s trackers: ``--tensorboard``, ``--logger``, tags, experiment, project,
    weights."""
    r.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard events per epoch to <cell>/tensorboard/ (progress.csv is "
        "always written); needs the [tensorboard] extra",
    )
    r.add_argument(
        "--logger",
        action="append",
        default=[],
        metavar="NAME",
        help="also send each cell's configuration, epochs and final metrics to NAME: tensorboard, "
        "wandb (offline, <cell>/wandb/) or mlflow ($MLFLOW_TRACKING_URI's server, else the file "
        "store <results>/mlruns); repeatable; needs the package's extra",
    )
    r.add_argument(
        "--tag",
        action="append",
        default=[],
        type=tag_pair,
        metavar="KEY=VALUE",
        help="tag every tracker run with KEY=VALUE (MLflow tag, W&B tag KEY:VALUE, TensorBoard "
        "hparam tag.KEY); repeatable; needs --logger",
    )
    r.add_argument(
        "--mlflow-experiment",
        metavar="NAME",
        help="the MLflow experiment (default: $MLFLOW_EXPERIMENT_NAME, else the suite's name)",
    )
    r.add_argument(
        "--wandb-project",
        metavar="NAME",
        help="the W&B project (default: $WANDB_PROJECT, else implicit-ensemble-harness)",
    )
    r.add_argument(
        "--log-model",
        action="store_true",
        help="also send each finished cell's final weights (final.pt) as an artifact to MLflow "
        "and W&B (off by default: weights can be large)",
    )


def _add_status(sub) -> None:
    """``harness status``."""
    s = sub.add_parser("status", help="show each cell: pending/running/done/failed")
    s.add_argument("results_dir")
    s.set_defaults(fn="harness.cli.status:cmd_status")


def _add_cancel(sub) -> None:
    """``harness cancel``."""
    c = sub.add_parser("cancel", help="cancel a suite's running Slurm jobs")
    c.add_argument("results_dir")
    c.set_defaults(fn="harness.cli.status:cmd_cancel")


def _add_evaluate(sub) -> None:
    """``harness evaluate``."""
    e = sub.add_parser("evaluate", help="re-evaluate finished cells from their saved weights")
    e.add_argument("results_dir")
    _add_plugin_argument(e)
    e.add_argument(
        "--suite",
        help="suite file whose evaluation block to apply (default: the one recorded in suite.json)",
    )
    e.add_argument("--data-root")
    e.add_argument(
        "--add-only",
        action="store_true",
        help="keep every value the records hold and add only the metrics they lack (post-hoc "
        "calibration, reliability bins, a new OOD set); finished_at is kept",
    )
    e.set_defaults(fn="harness.cli.evaluate:cmd_evaluate")


def _add_report(sub) -> None:
    """``harness report``."""
    rep = sub.add_parser("report", help="write leaderboard.html, CSV and Markdown")
    # Optional to argparse, required by the command: without it argparse would name the
    # KEY=VALUE list as missing too; cmd_report says what it needs in one line.
    rep.add_argument("results_dir", nargs="?", help="a results folder, e.g. results/smoke")
    rep.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="expect the cells of the recorded suite file with these overrides",
    )
    _add_plugin_argument(rep)
    rep.add_argument(
        "-o",
        "--output",
        help="output folder (default: the results folder); the record index still goes beside "
        "the results (--no-index writes nothing there)",
    )
    _add_report_options(rep)
    rep.set_defaults(fn="harness.cli.report:cmd_report")


def _add_report_options(parser) -> None:
    """Add ``--reference --format --interval --test --holm --mce-baseline --no-figures
    --no-index --published``."""
    parser.add_argument(
        "--reference",
        help="reference for the paired differences: a method, or method:key=value,... "
        "(default: deep_ensemble, else single)",
    )
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        choices=("html", "csv", "md", "latex"),  # reports.render.leaderboard.FORMATS
        help="also write this format (repeatable; leaderboard.html, the CSVs and leaderboard.md "
        "are always written): latex writes leaderboard.tex, one booktabs table per dataset, "
        "and every figure as a PDF beside its PNG (fig-ood.pdf, ...)",
    )
    parser.add_argument(
        "--interval",
        choices=("std", "ci"),
        help="the ± part of every cell: std over seeds, or the 95%% t-interval of the mean "
        "(default: std on the page, CSV and Markdown; ci in LaTeX)",
    )
    parser.add_argument(
        "--test",
        choices=("signflip", "t"),
        default="signflip",
        help="the paired test behind the ▲/▼ marks and the bold cells: the exact sign-flip "
        "permutation test (no normality needed, but symmetric per-seed differences; marks from "
        "6 seeds) or the paired t-test "
        "(default: signflip)",
    )
    parser.add_argument(
        "--holm",
        action="store_true",
        help="Holm-adjust the paired p-values across the whole paired table",
    )
    parser.add_argument(
        "--images",
        action="store_true",
        help="also compare counting the test set's sampling: the seeds × images interval of "
        "accuracy, NLL, ECE and Brier (raw and after TS) from each cell's outcomes.npz, printed "
        "beside the t-interval and written to paired_images.csv (docs/methods.md)",
    )
    parser.add_argument(
        "--mce-baseline",
        default="single",
        help="method the mCE column is relative to (default: single); 'none' drops mCE",
    )
    parser.add_argument(
        "--no-figures",
        action="store_true",
        help="draw no figures (the tables, statistics and CSVs are written as always)",
    )
    parser.add_argument(
        "--no-index",
        action="store_true",
        help="read every record, neither using nor writing the record index (.report-index.npz "
        "beside the results, which keeps the flattened records so that the next report reads "
        "only those that changed)",
    )
    parser.add_argument(
        "--published",
        help="CSV of published values (dataset,backbone,method,M,hparams,metric,value,source) "
        "to show next to the measured ones (default: <suite>.published.csv beside the suite)",
    )


def _add_upgrade(sub) -> None:
    """``harness upgrade``."""
    u = sub.add_parser(
        "upgrade",
        help="add to old records what this harness records (diagnostic declarations)",
    )
    u.add_argument("results_dir")
    _add_plugin_argument(u)
    u.add_argument("-n", "--dry-run", action="store_true", help="say what would change")
    u.set_defaults(fn="harness.cli.upgrade:cmd_upgrade")


def _add_bench(sub) -> None:
    """``harness bench``."""
    # Length: one declaration per flag, each with the help text it must carry.
    b = sub.add_parser("bench", help="throughput and memory side by side with the bound")
    b.add_argument(
        "--backbone",
        default="resnet18",
        help="registered backbone to build every method on (default resnet18)",
    )
    b.add_argument("--M", type=positive_int, default=4, help="ensemble members (default 4)")
    b.add_argument(
        "--batch",
        type=positive_int,
        default=128,
        help="input images per step, B (default 128); the bound runs M·B",
    )
    b.add_argument(
        "--image-size",
        type=positive_int,
        default=32,
        help="input height and width in pixels (default 32)",
    )
    b.add_argument(
        "--channels",
        type=positive_int,
        default=None,
        help="input channels (default: 1 for digits_cnn, else 3: pass 1 for Fashion-MNIST's "
        "fmnist_cnn)",
    )
    b.add_argument(
        "--classes", type=positive_int, default=100, help="output classes K (default 100)"
    )
    b.add_argument(
        "--steps", type=positive_int, default=20, help="timed steps per row and loop (default 20)"
    )
    b.add_argument(
        "--warmup", type=non_negative_int, default=5, help="untimed steps before them (default 5)"
    )
    b.add_argument(
        "--compile", action="store_true", help="torch.compile every model and its training step"
    )
    b.add_argument(
        "--cuda-graph",
        choices=["auto", "off"],
        default="auto",
        help="the real loop's training step: auto = a replayed CUDA graph on CUDA (eager on "
        "the CPU or with --compile); off = eager steps",
    )
    b.add_argument(
        "--loop",
        choices=["synthetic", "real"],
        default="synthetic",
        help="real: also time the cell's own loop (train_epoch with the recipe's optimizer, "
        "device loader and augmentation, L_div) and the rest of its epoch (diagnostics, "
        "evaluation), and print them per phase",
    )
    b.add_argument(
        "--augment",
        choices=["crop_flip", "none"],
        default=None,
        help="--loop real: the training augmentation, as the suite's recipe (default crop_flip, "
        "CIFAR's; none for Fashion-MNIST)",
    )
    b.add_argument(
        "--val-images",
        type=positive_int,
        default=None,
        help="--loop real: images of the synthetic split whose evaluation is timed (default 1000)",
    )
    b.add_argument(
        "--epoch-steps",
        type=positive_int,
        default=None,
        help="--loop real: also estimate one epoch of this many steps plus the "
        "validation of --epoch-val images (e.g. 78 and 0: Fashion-MNIST 10k at B=128)",
    )
    b.add_argument(
        "--epoch-val",
        type=non_negative_int,
        default=0,
        help="--loop real, with --epoch-steps: validation images per epoch (default 0)",
    )
    b.add_argument(
        "--methods",
        nargs="*",
        metavar="NAME[:K=V,...]",
        help="methods to time, with hyper-parameters (default: σN-Ens, FiLM, the deep "
        "ensemble as a loop and on streams, BatchEnsemble, Packed, MC Dropout)",
    )
    b.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    b.add_argument(
        "-o",
        "--output",
        default="bench.json",
        help="the JSON written, with provenance, after every row (default bench.json)",
    )
    b.set_defaults(fn="harness.cli.bench:main")


def _add_data(sub) -> argparse._SubParsersAction:
    """``harness data``; returns its own sub-commands."""
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
    _add_plugin_argument(dl)  # a plugin dataset declares its own download
    dl.set_defaults(fn="harness.cli.data:cmd_data")
    return dsub
