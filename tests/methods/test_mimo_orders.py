"""MIMO's member orders (methods.mimo.member_orders): uncertainty-baselines' input repetition,
drawn on the device so that a CUDA graph draws them anew at every replay."""

from __future__ import annotations

import pytest
import torch

from methods.mimo import member_orders


@pytest.mark.parametrize("rho", [0.0, 0.25, 0.5, 1.0])
def test_each_member_sees_every_image_r_times_and_shares_the_rho_tail(rho):
    torch.manual_seed(0)
    b, m, r = 6, 3, 4
    orders = member_orders(b, m, r, rho, torch.device("cpu"))  # (M, B·R)
    assert orders.shape == (m, b * r) and orders.dtype == torch.long
    for row in orders:  # a permutation of the batch tiled R times
        assert torch.bincount(row, minlength=b).tolist() == [r] * b
    k = int(b * r * (1 - rho))
    assert (orders[:, k:] == orders[0, k:]).all()  # the rows every member keeps, in one order
    # the shuffled heads hold the same multiset for every member, each in its own order
    heads = orders[:, :k].sort(dim=1).values
    assert (heads == heads[0]).all()
    if k > 4:
        assert not (orders[:, :k] == orders[0, :k]).all()


def test_orders_follow_the_device_generator_and_differ_between_draws():
    torch.manual_seed(3)
    a = member_orders(8, 2, 4, 0.0)
    b = member_orders(8, 2, 4, 0.0)
    torch.manual_seed(3)
    assert torch.equal(member_orders(8, 2, 4, 0.0), a)  # seeded by the cell's generator
    assert not torch.equal(a, b)
