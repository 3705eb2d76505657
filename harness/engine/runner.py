"""Run one cell end to end: data → method → train (checkpointed) → evaluate → cost → record.

Each cell lives in ``<results>/<cell_id>/``: ``cell.json`` (the resolved config), ``checkpoint.pt``
(training state after the last finished epoch, written atomically), ``final.pt`` (final weights,
for ``harness evaluate``), ``trained.json`` (history, written after ``final.pt``: training is
over), ``record.json`` (the result, written last and atomically), ``events.jsonl`` (who trained,
resumed, evaluated, when), ``progress.csv``/``progress.json`` (one row per epoch as it trains,
harness.storage.progress) and, while a process works on it, ``lease.json`` (harness.storage.lease)
and ``live.json`` (the epoch, step, loss and ETA, or the evaluation's pass and batch, rewritten
every few seconds: harness.storage.live).

A cell whose recipe has ``processes: N`` trains on N ranks with DistributedDataParallel
(harness.engine.distributed, docs/distributed.md): rank 0 does all of the above, the others only
train.

A finished cell is skipped; a cell leased by another live process is skipped and reported. A cell
that raises or diverges gets a ``failed`` record with the reason and the phase (setup, train,
evaluate), and the grid goes on. Nothing trained is thrown away on a retry: a failure after
training (evaluation, cost, record) re-evaluates ``final.pt`` without training; a failure or kill
during training resumes from the last epoch checkpoint, unless the cause was divergence (resuming
would diverge again); ``force`` redoes everything. Every file is written atomically with the
mode a plain ``open()`` gives; weights are loaded without running code (harness.storage.checkpoint).

This module holds the control flow of one cell (lease → train or resume → evaluate → record,
with the failure classification that ties those phases together); building the model and data
and loading trained weights live in harness.engine.build, the loader and cost measurement in
harness.engine.cell_setup, checkpoints in harness.storage.checkpoint, the choice of the
pre-trained model in harness.engine.pretrain.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.contract import (
    Cell,
    new_record,
    set_aside,
    usable_record,
)
from harness.contract.errors import DamagedFile
from harness.data._machinery.base import (
    DatasetSpec,
    Split,
    default_data_root,
)
from harness.engine import distributed, pretrain
from harness.engine.build import (
    build_model,
    load_data,
    load_trained,
    now,
    record_evaluation,
    seed_everything,
)
from harness.engine.cell_setup import measure_cost, run_conditions, train_loader
from harness.engine.environment import device_name, environment, resolve_device
from harness.engine.evaluate import evaluate_all, evaluate_split
from harness.engine.faults import lease_failure, record_failure, write_if_room, write_record_if_room
from harness.engine.graphed import (
    cell_step,
    learning_rate,
    portable_optimizer_state,
    step_mode,
)
from harness.engine.train import (
    DivergenceError,
    make_optimizer,
    make_scheduler,
    train_epoch,
)
from harness.registry import METHODS, resolved
from harness.storage.checkpoint import (
    load_checkpoint,
    log_event,
    rng_state,
    save_atomic,
    set_rng_state,
)
from harness.storage.lease import LeaseHeld
from harness.storage.live import Heartbeat, heartbeat_s
from harness.storage.loggers import CellTrackers
from harness.storage.progress import ProgressLog, epoch_images, executor_name
from harness.storage.records import atomic_write_text, record_or_set_aside
from harness.storage.space import OutOfSpace
from harness.storage.tracked import TrackedCell
from harness.storage.tracker_options import TrackerOptions
from methods._base import EnsembleModel

log = logging.getLogger("harness")

TRAINED_FILE = "trained.json"  # written after final.pt: training is over, evaluation may retry


@dataclass(frozen=True)
class CellJob:
    """What the training phases of one cell share in this process: the (resolved) cell, its
    folder, its data, the device, whether to show a progress bar and, in the process holding
    the cell's lease (rank 0), the cell's heartbeat (``live.json``, harness.storage.live)."""

    cell: Cell
    cell_dir: Path
    spec: DatasetSpec
    splits: dict[str, Split]
    device: torch.device
    progress: bool
    live: Heartbeat | None = None


def _save_atomic(obj: Any, path: Path) -> None:
    save_atomic(obj, path)  # unique temp name, fsync, umask-honouring mode


def pretrained_state(
    cell: Cell,
    cell_dir: Path,
    spec: DatasetSpec,
    progress: bool,
    data_root: Path | None = None,
    trackers: TrackerOptions | None = None,
) -> dict[str, torch.Tensor] | None:
    """:func:`harness.engine.pretrain.pretrained_state`, after training here the suite's
    `single` cell that :func:`harness.engine.pretrain.single_to_train` names, when it is not
    done yet (:func:`train_single`, with the run's ``trackers``)."""
    results_dir = cell_dir.parent
    single = pretrain.single_to_train(cell, results_dir)
    if single is not None:
        rec = train_single(single, results_dir, data_root, progress, trackers)
        pretrain.check_trained(single, rec)
    return pretrain.pretrained_state(cell, results_dir, spec)


def train_single(
    single: Cell,
    results_dir: Path,
    data_root: Path | None,
    progress: bool = False,
    trackers: TrackerOptions | None = None,
) -> dict[str, Any]:
    """The record of ``single`` (the cell a conversion starts from) once it is done, training it
    here unless another live process is: that process's record is waited for, and if its lease
    disappears without one (it was killed), the cell is run again here under its own lease."""
    while True:
        rec = run_cell(single, results_dir, data_root, False, progress, trackers=trackers)
        if rec["status"] != "leased":
            return rec
        rec = pretrain.wait_for_record(single, results_dir)
        if rec is not None:
            return rec


def train_cell(
    job: CellJob, model: EnsembleModel, trackers: CellTrackers | None = None
) -> tuple[list[dict], list[dict], float]:
    """Train with a checkpoint after every epoch; resume from it if present. ``trackers``
    (rank 0's) get every epoch and stay open for the record."""
    # Length: resume, the epoch loop, the per-epoch checkpoint and the progress row share the
    # optimizer, scheduler, loader, history and timers; split, each part would take them all.
    from tqdm.auto import tqdm

    cell, cell_dir, spec, splits, device = job.cell, job.cell_dir, job.spec, job.splits, job.device
    recipe = cell.recipe
    ranks = distributed.ranks(cell)  # rank 0 of 1 unless the cell spans several processes
    loader = train_loader(cell, spec, splits["train"], device, shard=ranks.shard)
    opt = make_optimizer(model, recipe)
    sched = make_scheduler(opt, recipe, len(loader))
    history: list[dict] = []
    diagnostics: list[dict] = []
    start_epoch, train_s = 0, 0.0
    ckpt_path = cell_dir / "checkpoint.pt"
    ckpt = load_checkpoint(ckpt_path, map_location=device)  # None: none, or damaged (set aside)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        history, diagnostics = ckpt["history"], ckpt["diagnostics"]
        start_epoch, train_s = ckpt["epoch"] + 1, ckpt["train_s"]
        if "rng" in ckpt:
            set_rng_state(ckpt["rng"])
        else:  # a checkpoint written before every random state was saved: CPU only
            torch.set_rng_state(ckpt["rng_cpu"].cpu())
        log.info("%s: resuming after epoch %d", cell.label, ckpt["epoch"] + 1)
    mode, why = step_mode(recipe, device)  # eager, compiled or a replayed CUDA graph
    if ranks.main:  # rank 0 writes the cell's files (harness.engine.distributed)
        log_event(cell_dir, "train", from_epoch=start_epoch, step_mode=mode, why=why,
                  **ranks.event_fields())  # fmt: skip
        plog = ProgressLog(
            cell_dir, start_epoch, recipe.epochs, device_name(device), trackers=trackers
        )
    trainee = distributed.training_module(cell, model, device)  # DDP when several processes
    # the cell's one training step, after the checkpoint's optimizer state is loaded: a CUDA
    # graph is captured once and replayed every epoch (harness.engine.graphed)
    step = cell_step(trainee, opt, recipe, device, mode)
    distributed.seed_rank(cell, start_epoch)
    bar = tqdm(
        total=recipe.epochs * len(loader),
        initial=start_epoch * len(loader),
        desc=f"  {cell.method} M={cell.M} s{cell.seed}",
        leave=False,
        unit="step",
        disable=not job.progress or not ranks.main,
    )
    live = job.live if ranks.main else None  # epoch, step, loss, ETA in live.json
    if live is not None:
        live.training(start_epoch, recipe.epochs, len(loader))
    steps = _Steps(bar, live)
    for epoch in range(start_epoch, recipe.epochs):
        model.set_progress(epoch, recipe.epochs)
        loader.set_epoch(epoch)
        if live is not None:
            live.begin_epoch(epoch)
        t0 = time.perf_counter()
        stats = train_epoch(trainee, loader, opt, sched, recipe, device, progress=steps, step=step)
        failed = getattr(step, "failed", None)
        if failed and mode == "graphed":
            mode = "eager"  # capture failed this epoch: said once, in the log and the events
            if ranks.main:
                log_event(cell_dir, "train_step", step_mode=mode, why=failed)
        stats = distributed.end_epoch(cell, model, stats, epoch)  # all ranks' stats, BN stats
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_s = time.perf_counter() - t0
        train_s += epoch_s
        # Validation metrics only when the recipe holds out a split (`validation: n`): the test
        # set is never looked at during training.
        # what the epoch cost besides its steps, phase by phase (docs/records.md: history)
        phases = {"train": epoch_s}
        t = time.perf_counter()
        val: dict[str, float] = {}
        if "val" in splits and ranks.main:
            m = evaluate_split(model, splits["val"], spec, recipe, device)
            val = {"val_acc": m["acc"], "val_nll": m["nll"], "val_ece": m["ece"]}
        phases["validation"] = _since(t, device)
        t = time.perf_counter()
        diag = model.diagnostics()
        phases["diagnostics"] = _since(t, device)
        history.append(
            {
                "epoch": epoch + 1,
                **stats,
                **val,
                "time_s": epoch_s,
                "phases_s": phases,
                "lr": learning_rate(opt),
                "step_mode": mode,  # eager | graphed | compiled (harness.engine.graphed)
            }
        )
        if diag:
            diagnostics.append({"epoch": epoch + 1, **diag})
        if not ranks.main:
            continue  # the checkpoint and progress rows are rank 0's
        # Before the checkpoint: a kill in between leaves a row the resumed run drops.
        t = time.perf_counter()
        images = epoch_images(loader, stats["steps"])
        plog.write({**history[-1], "elapsed_s": train_s}, diag, images)
        if live is not None:
            live.end_epoch(stats["train_loss"])
        _save_atomic(
            {
                "model": model.state_dict(),
                "optimizer": portable_optimizer_state(opt),  # as an eager optimizer saves it
                "scheduler": sched.state_dict(),
                "epoch": epoch,
                "history": history,
                "diagnostics": diagnostics,
                "train_s": train_s,
                "rng": rng_state(),  # CPU, CUDA, NumPy, Python: resume is bit-identical
            },
            ckpt_path,
        )
        # measured after it is written: the checkpoint's own history lacks its last epoch's
        # figure, the record has every epoch's
        phases["checkpoint"] = _since(t, device)
    bar.close()
    if ranks.main:
        plog.close()
    return history, diagnostics, train_s


class _Steps:
    """What the training loop reports its steps and loss to (the calls of a tqdm bar): the
    epoch bar and the cell's heartbeat."""

    def __init__(self, bar: Any, live: Heartbeat | None) -> None:
        self.sinks = [bar] if live is None else [bar, live]

    def update(self, n: int = 1) -> None:
        for sink in self.sinks:
            sink.update(n)

    def set_postfix(self, **values: Any) -> None:
        for sink in self.sinks:
            sink.set_postfix(**values)


def _since(start: float, device: torch.device) -> float:
    """Seconds since ``start`` (``time.perf_counter``), after the device's queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run_cell(
    cell: Cell,
    results_dir: Path,
    data_root: Path | None = None,
    force: bool = False,
    progress: bool = True,
    shared_device: bool = False,
    trackers: TrackerOptions | None = None,
) -> dict[str, Any]:
    """Train and evaluate one cell; always leaves a record unless interrupted.

    Args:
        cell: the resolved configuration.
        results_dir: the suite's results folder (``results/<suite>``).
        data_root: where datasets live (defaults: $HARNESS_DATA_ROOT, then the user cache).
        force: redo a finished cell from scratch.
        progress: show a progress bar for the epochs.
        shared_device: other cells run on the same device at the same time (recorded in
            ``cost.shared_device``: throughput measured under contention).
        trackers: the experiment trackers the run asked for (None: none); the executor hands
            them over, from the options the run was started with.

    Returns:
        The result record (also written to ``<results_dir>/<cell_id>/record.json``), or, when
        another live process holds the cell's lease, ``{"cell_id", "status": "leased", "lease":
        owner}`` (nothing written: the cell is that process's).
    """
    data_root = default_data_root(data_root)
    cell = resolved(cell)  # typed hyper-parameters: carried from the suite, or built once here
    cell_dir = Path(results_dir) / cell.cell_id
    existing = usable_record(cell_dir)  # a damaged one is set aside below, under the lease
    if existing and existing["status"] == "done" and not force:
        return existing
    if distributed.needs_launch(cell):  # `processes: N`: this process must be one of N ranks
        raise distributed.DistributedError(
            f"{cell.label} trains on {cell.recipe.processes} processes (recipe processes): "
            "run_cell runs as one of its ranks, inside the cell's process group; an executor "
            "starts them (harness.executors.ranks.run_one)"
        )
    try:
        lease = distributed.acquire_lease(cell, cell_dir)  # rank 0's in a multi-process cell
    except LeaseHeld as exc:
        log.warning("cell %s skipped: %s", cell.label, exc)
        return {"cell_id": cell.cell_id, "status": "leased", "lease": exc.owner}
    except OutOfSpace as exc:  # not even the lease fits: a failure the executor can act on
        return lease_failure(cell, exc)
    try:
        if not distributed.ranks(cell).main:
            return distributed.follow(cell, lambda: _train_as_follower(cell, cell_dir, data_root))
        return _run_leased(cell, cell_dir, data_root, force, progress, shared_device, trackers)
    finally:
        lease.release()


#: What a run of a cell leaves in its folder (``force`` sets each aside before redoing it).
PRODUCTS = ("record.json", "outcomes.npz", "final.pt", TRAINED_FILE, "checkpoint.pt", "pretrain")


def _clear_for_run(
    cell_dir: Path, existing: dict[str, Any] | None, force: bool
) -> list[tuple[Path, Path]]:
    """What a (re)run of the cell must not find: a killed writer's temporary files; with
    ``force`` every product of an earlier run, set aside as ``NAME.replaced-<time>`` (never
    deleted: the redo may not finish); after a failure its record (and the checkpoint of a
    diverged run, which would diverge again from the same state).

    Returns:
        ``(where it was, where it is now)`` for each product ``force`` set aside.
    """
    for tmp in cell_dir.glob(".*.tmp"):  # left by a killed writer; under the lease, ours to clear
        tmp.unlink(missing_ok=True)
    if force:
        stamp = _utc_stamp()
        return [(p, set_aside(p, stamp, "replaced")) for p in map(cell_dir.joinpath, PRODUCTS)
                if p.exists()]  # fmt: skip
    if existing:  # a failed cell: keep what its training produced (final.pt, checkpoint.pt)
        (cell_dir / "record.json").unlink(missing_ok=True)
        if (existing.get("error") or {}).get("type") == DivergenceError.__name__:
            (cell_dir / "checkpoint.pt").unlink(missing_ok=True)
    return []


def _utc_stamp() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _put_back(replaced: list[tuple[Path, Path]]) -> None:
    """A forced redo stopped before its record (Ctrl-C, a termination signal): the earlier
    run's products return, whole; what the redo had written is set aside as
    ``NAME.interrupted-<time>``, so the cell's record and weights stay one run's."""
    if not replaced:
        return
    stamp = _utc_stamp()
    for original, _ in replaced:
        if original.exists():
            set_aside(original, stamp, "interrupted")
    for original, aside in replaced:
        aside.rename(original)
    for name in PRODUCTS:  # the redo's own files the earlier run did not have
        if (new := replaced[0][0].parent / name).exists() and new not in dict(replaced):
            set_aside(new, stamp, "interrupted")


def _run_leased(
    cell: Cell,
    cell_dir: Path,
    data_root: Path,
    force: bool,
    progress: bool,
    shared_device: bool,
    trackers: TrackerOptions | None = None,
) -> dict[str, Any]:
    """:func:`run_cell`'s work, done while holding the cell's lease."""
    existing = record_or_set_aside(cell_dir)  # under the lease: another run may just have finished
    if existing and existing["status"] == "done" and not force:
        return existing
    replaced = _clear_for_run(cell_dir, existing, force)
    try:
        return _train_and_record(cell, cell_dir, data_root, progress, shared_device, trackers)
    except BaseException:  # interrupted before a record (a failure is recorded, not raised)
        _put_back(replaced)
        raise


def _train_and_record(
    cell: Cell,
    cell_dir: Path,
    data_root: Path,
    progress: bool,
    shared_device: bool,
    trackers: TrackerOptions | None,
) -> dict[str, Any]:
    """Train (or resume) and evaluate the cell, and write its record, done or failed."""
    # A full disk here is recorded below as the setup's failure, once the ranks are let go.
    setup_error = write_if_room(cell_dir / "cell.json", json.dumps(cell.to_json(), indent=1))
    distributed.barrier(cell)  # the other ranks of a multi-process cell start from here
    device = resolve_device(cell.recipe.device)
    started, t0, cpu0 = now(), time.perf_counter(), time.process_time()
    # The label and shown hparams are fixed from the defaults the cell carries (run_cell
    # resolved it) and written into the record (the reporter never re-derives them).
    rec = new_record(cell, environment(device), started)
    rec["evaluation"] = record_evaluation(cell)
    rec["cost"] = run_conditions(cell, device, shared_device)
    # Opened when training starts (or, when it was over, with the record), finished with the
    # record: one tracker run holds the epochs and the final metrics. They are told the commit
    # the record's provenance names.
    commit = rec["environment"].get("git_commit")
    opened = CellTrackers(
        cell_dir, trackers or TrackerOptions(), TrackedCell.from_record(rec, cell_dir), commit
    )
    # live.json: an earlier attempt's goes now, this one's at the end
    live = Heartbeat(cell_dir, heartbeat_s(executor_name()))
    phase = "setup"  # setup → train → evaluate: the record says where a failure happened
    try:
        if setup_error is not None:
            raise setup_error
        spec, splits = load_data(cell, data_root)
        pre = pretrained_state(cell, cell_dir, spec, progress, data_root, trackers)
        model, ctx = build_model(cell, spec, pre, device)
        phase = "train"
        job = CellJob(cell, cell_dir, spec, splits, device, progress, live)
        history, diag, train_s = trained_model(job, model, opened)
        distributed.leave(cell)  # rank 0 of a multi-process cell evaluates alone
        rec["history"], rec["diagnostics"] = history, {"per_epoch": diag} if diag else {}
        rec["diagnostics"]["batch_feeding"] = (  # images each member saw per training step
            METHODS.get(cell.method)
            .batch_feeding(cell.typed_hparams)
            .to_json(cell.recipe.batch_size, cell.M)
        )
        # How the reporter shows them: it reads the record, never the method.
        rec["diagnostics"]["declared"] = [d.to_json() for d in METHODS.get(cell.method).diagnostics]
        phase = "evaluate"
        seed_everything(cell.seed)  # evaluation draws (MC Dropout) do not depend on the path here
        t_eval = time.perf_counter()
        rec["metrics"] = evaluated(job, model, data_root)
        eval_s = time.perf_counter() - t_eval
        rec["cost"].update(measure_cost(model, ctx, cell, spec, splits, device))
        rec["cost"]["train_time_s"] = train_s
        rec["cost"]["epoch_time_s"] = train_s / max(len(history), 1)
        rec["timings"] = {"train_s": train_s, "eval_s": eval_s}
        rec["status"] = "done"
    except Exception as exc:  # recorded, not swallowed: the record carries type, message, trace
        # One line for the machine's faults (memory, a full disk), the exception's text otherwise.
        record_failure(rec, exc, cell, cell_dir, phase, device)
    rec["timings"]["total_s"] = time.perf_counter() - t0
    rec["timings"]["cpu_s"] = time.process_time() - cpu0  # a shared machine inflates wall time
    rec["finished_at"] = now()
    rec = write_record_if_room(cell, cell_dir, rec, phase)  # failed when it does not fit
    opened.finish(rec)  # after the record: a tracker's failure never changes the result
    live.finish()
    if rec["status"] == "done":
        log_event(cell_dir, "done")
        (cell_dir / "checkpoint.pt").unlink(missing_ok=True)
    return rec


def evaluated(job: CellJob, model: EnsembleModel, data_root: Path) -> dict[str, Any]:
    """The record's ``metrics`` of the trained ``model``, with its per-image outcomes written
    beside the record first (a done record's ``outcomes.npz`` is on disk before it)."""
    # harness.metrics loads torchmetrics (and scipy): when a cell first evaluates, not when the
    # runner is imported (test_startup.py, under the command line's tests).
    from harness.metrics.outcomes import OutcomeAccumulator, save_outcomes

    cell = job.cell
    outcomes = OutcomeAccumulator()
    metrics = evaluate_all(
        model, job.splits, job.spec, cell.evaluation, cell.recipe, job.device, data_root,
        outcomes, progress=job.progress,  # the evaluation's bar, on a terminal only
        cell=cell.label,  # named by a plugin metric's error
        live=job.live,  # its pass and batch in live.json
    )  # fmt: skip
    save_outcomes(job.cell_dir, outcomes.arrays())
    return metrics


def _train_as_follower(cell: Cell, cell_dir: Path, data_root: Path) -> str:
    """A rank > 0 of a multi-process cell: build and train the model rank 0 trains (rank 0
    writes every file). Returns ``"evaluate_only"`` when training is already over."""
    if (cell_dir / TRAINED_FILE).exists() and (cell_dir / "final.pt").exists():
        return "evaluate_only"  # rank 0 evaluates the trained weights alone
    device = resolve_device(cell.recipe.device)
    spec, splits = load_data(cell, data_root)
    pre = pretrained_state(cell, cell_dir, spec, False, data_root)
    model, _ = build_model(cell, spec, pre, device)
    train_cell(CellJob(cell, cell_dir, spec, splits, device, False), model)
    return "trained"


def trained_model(
    job: CellJob, model: EnsembleModel, trackers: CellTrackers | None = None
) -> tuple[list[dict], list[dict], float]:
    """Train the model, or, when an earlier attempt finished training (``final.pt`` and
    ``trained.json`` exist: it failed or was killed later, in evaluation, cost or reporting),
    load its weights so that only the evaluation is redone.

    ``final.pt`` is written before ``trained.json``, both atomically: ``trained.json`` present
    means the weights are whole.

    Returns:
        history, per-epoch diagnostics, training seconds (of the run that trained).
    """
    cell_dir = job.cell_dir
    trained_path = cell_dir / TRAINED_FILE
    if trained_path.exists() and (cell_dir / "final.pt").exists():
        try:
            done = json.loads(trained_path.read_text())
            load_trained(job.cell, cell_dir, model, job.device)
            log_event(cell_dir, "evaluate_only")
            return done["history"], done["diagnostics"], done["train_s"]
        except (DamagedFile, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError: ValueError
            # Set both aside and train again, resuming from checkpoint.pt if it is whole.
            moved = [set_aside(p).name for p in (cell_dir / "final.pt", trained_path)]
            log.warning("%s: damaged trained weights (%s); moved to %s", cell_dir, exc, moved)
            log_event(cell_dir, "trained_damaged", reason=str(exc)[:300], moved_to=moved)
    history, diag, train_s = train_cell(job, model, trackers)
    _save_atomic(model.state_dict(), cell_dir / "final.pt")
    atomic_write_text(
        trained_path,
        json.dumps({"history": history, "diagnostics": diag, "train_s": train_s}) + "\n",
    )
    log_event(cell_dir, "trained")
    return history, diag, train_s
