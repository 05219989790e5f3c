"""The order of latency rounds (autogemm/measure/timing.py `latency_orders`): every competitor follows every
other about equally often. A single call's time can depend on what ran before it (a GEMM reading a weight
larger than L2 finds part of it there or not), so a competitor always timed after the same other one is
measured in that one's wake."""

from __future__ import annotations

import collections

import pytest

from autogemm.measure.timing import latency_orders

NAMES = ["autogemm", "torch eager", "GEMM alone", "torch.compile", "cuBLASLt"]


def predecessors(orders: list[list[str]]) -> dict[str, collections.Counter]:
    """For each competitor, how often each other one ran just before it (across rounds too: the sequence
    of calls is one)."""
    sequence = [name for order in orders for name in order]
    seen: dict[str, collections.Counter] = {name: collections.Counter() for name in NAMES}
    for before, name in zip(sequence, sequence[1:]):
        if before != name:
            seen[name][before] += 1
    return seen


def test_each_round_times_every_competitor_once():
    orders = latency_orders(NAMES, 50, seed=1)
    assert len(orders) == 50
    assert all(sorted(order) == sorted(NAMES) for order in orders)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_competitor_follows_every_other_about_equally_often(seed):
    rounds = 200
    seen = predecessors(latency_orders(NAMES, rounds, seed=seed))
    for name in NAMES:
        counts = [seen[name][other] for other in NAMES if other != name]
        # about rounds / len(NAMES) each (40 here); a rotating order gave one predecessor ~160 of 200
        assert min(counts) >= 20 and max(counts) <= 65, (name, seen[name])


def test_the_seed_repeats_a_draw_and_none_draws_afresh():
    assert latency_orders(NAMES, 20, seed=7) == latency_orders(NAMES, 20, seed=7)
    assert latency_orders(NAMES, 20) != latency_orders(NAMES, 20)  # (5!^20 draws: equal by chance never)
