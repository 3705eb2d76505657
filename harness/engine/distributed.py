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

Launch is the executors' (:mod:`harness.executors.ranks`): locally, N spawned processes with the
``env://`` rendezvous on a free port; on Slurm, an array task of N Slurm tasks whose rendezvous
submitit exports. Each rank calls :func:`harness.engine.runner.run_cell` inside the group.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from harness.contract import Cell
from harness.contract.env import DIST_TIMEOUT_S
from harness.storage.lease import Lease, LeaseHeld, acquire

log = logging.getLogger("harness")

#: Set in every rank of a multi-process cell to that cell's id: the runner then trains as a rank
#: (any other cell, e.g. a pre-training cell, runs in one process or needs its own ranks).
RANK_ENV = "HARNESS_CELL_RANK"
#: Seconds a collective may wait (rank 0 evaluating the validation split while others wait).
TIMEOUT_ENV = DIST_TIMEOUT_S.name
DEFAULT_TIMEOUT_S = 1800.0

__all__ = [
    "RANK_ENV",
    "Ranks",
    "acquire_lease",
    "barrier",
    "end_epoch",
    "follow",
    "leave",
    "needs_launch",
    "ranks",
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
        """``(rank, world)`` for :class:`harness.data._machinery.base.LoaderOptions`."""
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


def collective_timeout() -> dt.timedelta:
    """How long a collective may wait for the other ranks (``$HARNESS_DIST_TIMEOUT_S``)."""
    return dt.timedelta(seconds=DIST_TIMEOUT_S.read(DEFAULT_TIMEOUT_S))


def uses_cuda(cell: Cell) -> bool:
    """Whether the cell's ranks train on GPUs (NCCL) rather than the CPU (gloo): the device
    its ranks resolve (:func:`harness.engine.environment.resolve_device`)."""
    from harness.engine.environment import resolve_device

    return resolve_device(cell.recipe.device).type == "cuda"


@contextlib.contextmanager
def process_group(cell: Cell) -> Iterator[Ranks]:
    """Join the cell's process group from the ``env://`` variables (MASTER_ADDR, MASTER_PORT,
    RANK, WORLD_SIZE, LOCAL_RANK): NCCL with this rank's GPU as the current device on CUDA,
    gloo on the CPU. Marks the process as a rank of ``cell`` (:data:`RANK_ENV`)."""
    cuda = uses_cuda(cell)
    if cuda:
        # Locally each rank sees only its GPU; a Slurm task may see the node's: LOCAL_RANK picks.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method="env://", timeout=collective_timeout()
    )
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


class _FollowerLease:
    """What a rank other than 0 holds: nothing (rank 0 holds the cell's lease)."""

    def release(self) -> None:
        """Nothing to release."""


def acquire_lease(cell: Cell, cell_dir: Path) -> Lease | _FollowerLease:
    """The cell's lease (:func:`harness.storage.lease.acquire`), taken by rank 0 alone; every rank
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


def follow(cell: Cell, train: Callable[[], str]) -> dict[str, Any]:
    """A rank other than 0: wait until rank 0 has prepared the cell's folder, then ``train``
    (the runner's: build the same model and train it, writing nothing). Evaluation and the
    record are rank 0's; this rank then exits.

    Args:
        train: returns ``"trained"``, or ``"evaluate_only"`` when training was already over.

    Returns:
        ``{"cell_id", "status": "trained" | "evaluate_only" | "failed", "rank"}`` (not a record).
    """
    r = ranks(cell)
    barrier(cell)  # rank 0 has cleared stale files (force, divergence) and written cell.json
    out = {"cell_id": cell.cell_id, "rank": r.rank}
    try:
        return {**out, "status": train()}
    except Exception as exc:  # rank 0 records the cell's failure; this rank only says why
        log.warning("rank %d of %s failed: %s: %s", r.rank, cell.label, type(exc).__name__, exc)
        return {**out, "status": "failed"}


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
    """The training interface :func:`harness.engine.train.train_epoch` uses (``training_outputs``,
    ``regularizer``, ``parameters``, ``train``), with the step going through DDP.

    The regularizer (σN-Ens's L_div over its γ) is computed outside DDP's forward from
    parameters the forward also uses: its gradient joins theirs in the same backward, before
    DDP's per-parameter hook fires, and is the same on every rank, so averaging keeps it.
    """

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__()
        device_ids = (
            [device.index if device.index is not None else torch.cuda.current_device()]
            if device.type == "cuda"
            else None
        )
        self.ddp = wrap_ddp(_TrainingStep(model), device_ids)
        self.model = model

    def training_outputs(self, x: Tensor, y: Tensor) -> Any:
        """Args: the rank's block of the step (x (B/N, ...) or (M, B/N, ...)); see
        :meth:`methods._base.EnsembleModel.training_outputs`."""
        return self.ddp(x, y)

    def regularizer(self) -> Tensor | None:
        return self.model.regularizer()


def wrap_ddp(module: nn.Module, device_ids: list[int] | None) -> nn.Module:
    """``DistributedDataParallel`` that broadcasts rank 0's buffers once, at construction, and
    never before a forward: running statistics stay per rank during the epoch and are averaged
    at its end (:func:`end_epoch`); syncing rank 0's before every forward would discard the
    others'.

    torch >= 2.13 says this as ``forward_sync_buffers=False``. Older torch (``pyproject.toml``
    allows 2.4) has only ``broadcast_buffers``, whose ``False`` also skips the buffers in the
    construction-time broadcast, so that broadcast is done here, from rank 0, as the newer
    argument does it.
    """
    ddp_class = nn.parallel.DistributedDataParallel
    if "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters:
        return ddp_class(module, device_ids=device_ids, forward_sync_buffers=False)
    ddp = ddp_class(module, device_ids=device_ids, broadcast_buffers=False)
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)
    return ddp


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
