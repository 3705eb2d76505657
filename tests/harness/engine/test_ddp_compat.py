"""``DistributedDataParallel`` is built alike on every torch ``pyproject.toml`` allows.

torch 2.13 added ``forward_sync_buffers`` (buffers broadcast once at construction, never before
a forward) and deprecated ``broadcast_buffers``; torch 2.4 to 2.12 know only the latter, whose
``False`` also leaves the buffers out of the construction broadcast. :func:`wrap_ddp` picks the
argument from DDP's signature and does that broadcast itself on the older signature. The older
torch is stood in for by a DDP subclass whose ``__init__`` has the 2.4 keyword set.
"""

from __future__ import annotations

import inspect
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness.engine import distributed
from harness.engine.distributed import wrap_ddp

DDP = nn.parallel.DistributedDataParallel


class DDPWithoutForwardSyncBuffers(DDP):
    """DDP as torch < 2.13 spells it: ``broadcast_buffers``, no ``forward_sync_buffers``."""

    def __init__(self, module, device_ids=None, broadcast_buffers=True):
        super().__init__(module, device_ids=device_ids, broadcast_buffers=broadcast_buffers)


@pytest.fixture
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))


@pytest.mark.parametrize("ddp_class", [DDP, DDPWithoutForwardSyncBuffers])
def test_buffers_are_broadcast_once_and_never_before_a_forward(
    one_rank_group, monkeypatch, ddp_class
):
    monkeypatch.setattr(nn.parallel, "DistributedDataParallel", ddp_class)
    new_signature = "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters
    assert new_signature == (ddp_class is DDP)  # the stand-in really has the old keyword set
    broadcasts: list[tuple[int, ...]] = []
    real_broadcast = dist.broadcast

    def recording_broadcast(tensor, src, *args, **kwargs):
        broadcasts.append(tuple(tensor.shape))
        return real_broadcast(tensor, src, *args, **kwargs)

    monkeypatch.setattr(distributed.dist, "broadcast", recording_broadcast)
    net = bn_net()
    ddp = wrap_ddp(net, None)
    assert isinstance(ddp, ddp_class)
    # Both spellings end in the same state: no buffer sync before any forward ...
    assert ddp.broadcast_buffers is False and ddp.forward_sync_buffers is False
    # ... and rank 0's buffers sent once at construction: by DDP's own init sync on the new
    # signature, by wrap_ddp on the old one (running mean, running var, batch count).
    assert broadcasts == ([] if new_signature else [(3,), (3,), ()])
    out = ddp(torch.randn(8, 4))
    out.sum().backward()
    assert net[0].weight.grad is not None and torch.isfinite(net[0].weight.grad).all()
    assert int(net[1].num_batches_tracked) == 1  # the forward ran in training mode
