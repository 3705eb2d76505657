"""Cells that span several processes: DistributedDataParallel within one cell.

A cell whose recipe sets ``processes: N`` (N > 1) trains on N processes, one GPU each on a GPU
machine (NCCL), or N CPU processes (gloo) elsewhere. ``batch_size`` stays the global batch B of
one step: every rank builds the same seeded model, takes the contiguous block
``[rank·B/N, (rank+1)·B/N)`` of every global batch (the loader's ``shard``; the global order and
augmentation do not depend on N), and ``DistributedDataParallel`` averages the gradients, so for
a method without batch statistics a step is the one-process step up to float summation order.

What differs from one process, by design (docs/distributed.md):

* BatchNorm batch statistics are per rank (per GPU, over B/N images), for plain BatchNorm and for
  σN-Ens's per-member BatchNorm alike. Nothing is synchronised across ranks during a step, so no
  statistic ever mixes members (a ``SyncBatchNorm`` over the whole M·B batch would). At the end
  of every epoch the running statistics are averaged over the ranks (timm's ``distribute_bn``),
  so the checkpoint and the evaluated model hold one set, estimated from all ranks' batches.
* Random draws during training (dropout masks) come from a per-rank stream on ranks > 0,
  reseeded from (seed, epoch, rank) at every epoch, so ranks do not repeat each other's masks
  and a resumed cell draws what an uninterrupted one draws; rank 0 keeps the checkpointed stream.

Who does what: rank 0 alone holds the cell's lease, writes ``cell.json``, checkpoints,
``progress.csv``, ``final.pt``, ``trained.json``, ``events.jsonl`` and the record (once), and
evaluates alone after training; the other ranks train, then exit. Every rank resumes from the
same ``checkpoint.pt``.

Launch: locally, :func:`launch_cell` spawns the N ranks (``torch.multiprocessing`` spawn, the
``env://`` rendezvous on a free local port) and waits for them; it is what
:func:`harness.runner.run_cell` does for such a cell, in any local executor. On Slurm, the cell's
job has N tasks (``tasks_per_node``) and each task calls :func:`run_slurm_rank`, which exports
the rendezvous with ``submitit.helpers.TorchDistributedEnvironment``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from harness.contract import Cell
from harness.lease import Lease, LeaseHeld, acquire

log = logging.getLogger("harness")

#: Set in every rank of a multi-process cell to that cell's id: run_cell then trains as a rank
#: instead of launching ranks (any other cell, e.g. a pre-training cell, is launched normally).
RANK_ENV = "HARNESS_CELL_RANK"
#: Seconds a collective may wait (rank 0 evaluating the validation split while others wait).
TIMEOUT_ENV = "HARNESS_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0
#: Seconds the launcher lets the other ranks finish after rank 0 has exited.
FOLLOWER_GRACE_S = 60.0

__all__ = [
    "RANK_ENV",
    "Ranks",
    "acquire_lease",
    "barrier",
    "end_epoch",
    "follow",
    "launch_cell",
    "leave",
    "needs_launch",
    "ranks",
    "run_slurm_rank",
    "slurm_parameters",
    "training_module",
]


class DistributedError(RuntimeError):
    """A multi-process cell cannot run as asked (e.g. fewer GPUs than processes)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in its cell: ``rank`` of ``world`` (0 of 1 for a plain cell)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that holds the lease and writes the cell's files."""
        return self.rank == 0

    @property
    def shard(self) -> tuple[int, int]:
        """``(rank, world)`` for :class:`harness.data.base.LoaderOptions`."""
        return self.rank, self.world

    def event_fields(self) -> dict[str, int]:
        """What ``events.jsonl`` adds for a multi-process cell (nothing for one process)."""
        return {"processes": self.world} if self.world > 1 else {}


def ranks(cell: Cell) -> Ranks:
    """This process's ranks for ``cell``: the process group's when this process is a rank of
    this very cell, else one process (a cell run from inside a rank, e.g. its pre-training
    cell, is not part of the group)."""
    if os.environ.get(RANK_ENV) != cell.cell_id or not dist.is_initialized():
        return Ranks()
    return Ranks(dist.get_rank(), dist.get_world_size())


def needs_launch(cell: Cell) -> bool:
    """Whether ``cell`` wants several processes and this process is not already one of them."""
    return cell.recipe.processes > 1 and os.environ.get(RANK_ENV) != cell.cell_id


# ------------------------------------------------------------------------ inside the ranks


def _timeout() -> dt.timedelta:
    return dt.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))


def _uses_cuda(cell: Cell) -> bool:
    device = cell.recipe.device
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


@contextlib.contextmanager
def process_group(cell: Cell) -> Iterator[Ranks]:
    """Join the cell's process group from the ``env://`` variables (MASTER_ADDR, MASTER_PORT,
    RANK, WORLD_SIZE, LOCAL_RANK): NCCL with this rank's GPU as the current device on CUDA,
    gloo on the CPU. Marks the process as a rank of ``cell`` (:data:`RANK_ENV`)."""
    cuda = _uses_cuda(cell)
    if cuda:
        # Locally each rank sees only its GPU; a Slurm task may see the node's: LOCAL_RANK picks.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", timeout=_timeout())
    os.environ[RANK_ENV] = cell.cell_id
    try:
        yield ranks(cell)
    finally:
        os.environ.pop(RANK_ENV, None)
        if dist.is_initialized():
            dist.destroy_process_group()


def leave(cell: Cell) -> None:
    """Leave the cell's process group once training is over (a no-op in one process).

    Rank 0 then evaluates alone: torchmetrics synchronises its states over any initialised
    default group, which would wait for ranks that have already exited.
    """
    if ranks(cell).world > 1:
        dist.destroy_process_group()


def pretrain_first(cell: Cell, results_dir: Path, data_root: Path | None) -> None:
    """Train the `single` cell that ``cell`` converts (``pretrain_epochs``) before the ranks
    join their group, so that inside the group every rank finds it done and only loads it."""
    from harness.registries import METHODS

    epochs = int(cell.hparams.get("pretrain_epochs") or 0)
    if not METHODS.get(cell.method).pretrained_conversion or cell.hparams.get("pretrained"):
        return
    if not epochs:
        return
    from harness.pretrain import pretraining_cell, train_once
    from harness.runner import run_cell

    single = pretraining_cell(cell, results_dir, epochs)
    train_once(single, results_dir, lambda c: run_cell(c, results_dir, data_root, False, False))


class _FollowerLease:
    """What a rank other than 0 holds: nothing (rank 0 holds the cell's lease)."""

    def release(self) -> None:
        """Nothing to release."""


def acquire_lease(cell: Cell, cell_dir: Path) -> Lease | _FollowerLease:
    """The cell's lease (:func:`harness.lease.acquire`), taken by rank 0 alone; every rank
    learns the outcome.

    Raises:
        LeaseHeld: on every rank, when another live process holds the lease.
    """
    r = ranks(cell)
    if r.world == 1:
        return acquire(cell_dir)
    lease, owner = None, None
    if r.main:
        try:
            lease = acquire(cell_dir)
        except LeaseHeld as exc:
            owner = exc.owner
    box = [owner]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise LeaseHeld(box[0])
    return lease if lease is not None else _FollowerLease()


def barrier(cell: Cell) -> None:
    """Wait for every rank of ``cell`` (a no-op in a one-process cell)."""
    if ranks(cell).world > 1:
        dist.barrier()


def follow(cell: Cell, cell_dir: Path, data_root: Path, progress: bool) -> dict[str, Any]:
    """A rank other than 0: wait until rank 0 has prepared the cell's folder, build the same
    model, train (writing nothing), exit. Evaluation and the record are rank 0's.

    Returns:
        ``{"cell_id", "status": "trained" | "failed" | "evaluate_only", "rank"}`` (not a record).
    """
    from harness import runner

    r = ranks(cell)
    barrier(cell)  # rank 0 has cleared stale files (force, divergence) and written cell.json
    out = {"cell_id": cell.cell_id, "rank": r.rank}
    if (cell_dir / runner.TRAINED_FILE).exists() and (cell_dir / "final.pt").exists():
        return {**out, "status": "evaluate_only"}  # rank 0 evaluates the trained weights alone
    try:
        device = runner.pick_device(cell.recipe.device)
        spec, splits = runner.load_data(cell, data_root)
        pre = runner.pretrained_state(cell, cell_dir, spec, splits, device, False, data_root)
        model, _ = runner.build_model(cell, spec, pre)
        model.to(device)
        if cell.recipe.channels_last and device.type == "cuda":
            model.to(memory_format=torch.channels_last)
        if cell.recipe.compile:
            model.compile()
        runner.train_cell(cell, cell_dir, model, spec, splits, device, False)
    except Exception as exc:  # rank 0 records the cell's failure; this rank only says why
        log.warning("rank %d of %s failed: %s: %s", r.rank, cell.label, type(exc).__name__, exc)
        return {**out, "status": "failed"}
    return {**out, "status": "trained"}


class _TrainingStep(nn.Module):
    """``forward(x, y) = model.training_outputs(x, y)``: DistributedDataParallel hooks only
    ``forward``, so the method's training step must be the wrapped module's forward for the
    reducer to expect this step's gradients."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, y: Tensor) -> Any:
        return self.model.training_outputs(x, y)


class DistributedTraining(nn.Module):
    """The training interface :func:`harness.train.train_epoch` uses (``training_outputs``,
    ``regularizer``, ``parameters``, ``train``), with the step going through DDP.

    The regularizer (σN-Ens's L_div over its γ) is computed outside DDP's forward from
    parameters the forward also uses: its gradient joins theirs in the same backward, before
    DDP's per-parameter hook fires, and is the same on every rank, so averaging keeps it.
    """

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.ddp = nn.parallel.DistributedDataParallel(
            _TrainingStep(model),
            device_ids=[device.index if device.index is not None else torch.cuda.current_device()]
            if device.type == "cuda"
            else None,
            # Running statistics stay per rank during the epoch and are averaged at its end
            # (end_epoch); syncing rank 0's before every forward would discard the others'.
            forward_sync_buffers=False,
        )
        self.model = model

    def training_outputs(self, x: Tensor, y: Tensor) -> Any:
        """Args: the rank's block of the step (x (B/N, ...) or (M, B/N, ...)); see
        :meth:`methods.base.EnsembleModel.training_outputs`."""
        return self.ddp(x, y)

    def regularizer(self) -> Tensor | None:
        return self.model.regularizer()


def training_module(cell: Cell, model: nn.Module, device: torch.device) -> nn.Module:
    """What ``train_epoch`` trains: the model itself, or in a multi-process cell the model
    behind DDP (call after loading a checkpoint: DDP starts from rank 0's weights)."""
    if ranks(cell).world == 1:
        return model
    return DistributedTraining(model, device)


def end_epoch(
    cell: Cell, model: nn.Module, stats: dict[str, float], epoch: int
) -> dict[str, float]:
    """Epoch-end agreement of the ranks; returns the epoch's statistics over all ranks.

    Averages the training loss, regularizer and accuracy (every rank has the same number of
    rows per step, so the mean of rank means is the global mean), averages BatchNorm running
    statistics (timm's ``distribute_bn``: the buffers named ``running_mean``/``running_var``,
    per member for σN-Ens), and reseeds ranks > 0 for the next epoch. A no-op in one process.
    """
    r = ranks(cell)
    if r.world == 1:
        return stats
    from timm.utils import distribute_bn

    keys = ("train_loss", "train_reg", "train_acc")
    values = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        values = values.cuda()
    dist.all_reduce(values)
    distribute_bn(model, r.world, reduce=True)
    seed_rank(cell, epoch + 1)
    return {**stats, **dict(zip(keys, (values / r.world).tolist()))}


def seed_rank(cell: Cell, epoch: int) -> None:
    """Ranks > 0 draw from their own stream in ``epoch``, a function of (seed, epoch, rank):
    a resumed cell draws what an uninterrupted one does. Rank 0 keeps its checkpointed state."""
    r = ranks(cell)
    if r.world > 1 and not r.main:
        torch.manual_seed((cell.seed * 1_000_003 + epoch) * 1_009 + r.rank)


# ------------------------------------------------------------------------ launching locally


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous of the ranks binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_devices(cell: Cell) -> list[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` entry of each rank (one GPU each), or None per rank on CPU.

    Raises:
        DistributedError: a CUDA cell with fewer visible GPUs than processes (NCCL refuses two
            ranks on one GPU).
    """
    n = cell.recipe.processes
    if not _uses_cuda(cell):
        return [None] * n
    from harness.executors.devices import visible_gpus

    gpus = visible_gpus()
    if len(gpus) < n:
        raise DistributedError(
            f"{cell.label} needs {n} GPUs (recipe processes: {n}), this process sees "
            f"{len(gpus)} ({', '.join(gpus) or 'none'}); run it with --executor inprocess on a "
            f"machine with {n} GPUs, or on Slurm"
        )
    return gpus[:n]


def _watch_parent(parent: int) -> None:
    """End this rank when its launcher is gone (killed): an orphaned rank would go on writing."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="launcher-watch").start()


def _rank_main(
    rank: int,
    world: int,
    port: int,
    gpu: str | None,
    parent: int,
    threads: int,
    cell_json: dict[str, Any],
    results_dir: str,
    data_root: str,
    force: bool,
    progress: bool,
    shared_device: bool,
    results: Any,
) -> None:
    """One spawned rank: the env:// variables, its GPU, then :func:`harness.runner.run_cell`."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before CUDA initialises: cuda:0 is this GPU
    _watch_parent(parent)
    torch.set_num_threads(threads)
    from harness.runner import run_cell

    cell = Cell.from_json(cell_json)
    with process_group(cell):
        out = run_cell(cell, Path(results_dir), Path(data_root), force, progress, shared_device)
    if rank == 0:
        results.put(out)


def launch_cell(
    cell: Cell,
    results_dir: Path,
    data_root: Path,
    force: bool = False,
    progress: bool = True,
    shared_device: bool = False,
) -> dict[str, Any]:
    """Run ``cell`` on ``cell.recipe.processes`` spawned local ranks and wait for them.

    Returns:
        Rank 0's :func:`harness.runner.run_cell` result (the record, or ``leased``), or, when
        rank 0 died without one, the record on disk or a ``failed`` stub naming its exit code.
    """
    from harness.records import read_record

    n = cell.recipe.processes
    try:
        devices = rank_devices(cell)
    except DistributedError as exc:
        return record_launch_failure(cell, Path(results_dir), exc)
    pretrain_first(cell, results_dir, data_root)
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    port, parent = free_port(), os.getpid()
    threads = max(1, torch.get_num_threads() // n) if devices[0] is None else 1
    args = (cell.to_json(), str(results_dir), str(data_root), force, progress, shared_device)
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, n, port, devices[r], parent, threads, *args, results),
            name=f"rank{r}",
        )
        for r in range(n)
    ]
    for p in procs:
        p.start()
    try:
        while procs[0].is_alive():
            procs[0].join(timeout=1.0)
            if any(p.exitcode not in (None, 0) for p in procs[1:]) and procs[0].is_alive():
                # A rank crashed: rank 0 fails at its next collective and records why.
                procs[0].join(timeout=_timeout().total_seconds())
                break
        deadline = time.monotonic() + FOLLOWER_GRACE_S
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():  # Ctrl-C, or a rank stuck in a collective rank 0 never joins
                p.terminate()
                p.join(timeout=10)
    if not results.empty():
        return results.get()
    rec = read_record(Path(results_dir) / cell.cell_id)
    if rec:
        return rec
    return {
        "cell_id": cell.cell_id,
        "status": "failed",
        "error": {
            "type": DistributedError.__name__,
            "message": f"rank 0 exited with code {procs[0].exitcode} and wrote no record",
        },
    }


def record_launch_failure(cell: Cell, results_dir: Path, exc: Exception) -> dict[str, Any]:
    """A ``failed`` record (phase ``setup``) for a cell whose ranks cannot be started, written
    under the cell's lease like any record, so the grid goes on and the reason is reported."""
    import dataclasses

    from harness.checkpoint import log_event
    from harness.contract import new_record
    from harness.environment import environment
    from harness.records import write_record
    from harness.registries import method_defaults
    from harness.runner import now

    cell_dir = results_dir / cell.cell_id
    try:
        lease = acquire(cell_dir)
    except LeaseHeld as held:
        return {"cell_id": cell.cell_id, "status": "leased", "lease": held.owner}
    try:
        cell = dataclasses.replace(cell, defaults=method_defaults(cell.method))
        rec = new_record(cell, environment(torch.device("cpu")), now())
        rec["status"] = "failed"
        rec["error"] = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "",
            "data_missing": False,
            "phase": "setup",
        }
        rec["timings"]["total_s"] = 0.0
        rec["finished_at"] = now()
        write_record(cell_dir, rec)
        log_event(cell_dir, "failed", phase="setup", error=type(exc).__name__)
        log.warning("cell %s failed: %s", cell.label, exc)
        return rec
    finally:
        lease.release()


# ------------------------------------------------------------------------ Slurm


def slurm_parameters(params: dict[str, Any], processes: int) -> dict[str, Any]:
    """submitit ``update_parameters`` for a cell of ``processes`` tasks: the profile's per-cell
    ``gpus_per_node`` becomes per task (one GPU per rank), ``tasks_per_node`` = processes."""
    if processes == 1:
        return dict(params)
    out = {**params, "tasks_per_node": processes, "nodes": 1}
    if params.get("gpus_per_node"):
        out["gpus_per_node"] = params["gpus_per_node"] * processes
    return out


def run_slurm_rank(cell: Cell, results_dir: Path, data_root: Path | None) -> dict[str, Any]:
    """One task of a multi-task Slurm job: export the rendezvous (submitit), join the group,
    run the cell as that rank."""
    import submitit

    from harness.runner import run_cell

    submitit.helpers.TorchDistributedEnvironment().export(
        set_cuda_visible_devices=False,
        overwrite=True,  # LOCAL_RANK picks the GPU instead
    )
    pretrain_first(cell, results_dir, data_root)  # one task trains it, the others wait
    with process_group(cell):
        return run_cell(cell, results_dir, data_root, progress=False)
