"""The CuPy fast path's last output, written again by the next call once nothing else holds it
(serving/plan.py `Plan.call_fast`): on the CPU, with stand-ins for CuPy's array, stream and device."""

from __future__ import annotations

import gc
import itertools
from types import SimpleNamespace

import pytest

from autogemm.serving import plan as plan_module

_ADDRESSES = itertools.count(1 << 20, 1 << 12)


class _Pointer:
    def __init__(self):
        self.ptr = next(_ADDRESSES)
        self.device_id = 0


class _Array:
    """A stand-in for cupy.ndarray: a memory pointer of its own; a view holds its base, as CuPy's do."""

    made = 0

    def __init__(self, shape=None, dtype=None, base=None):
        self.data = base.data if base is not None else _Pointer()
        self.base = base
        _Array.made += base is None


@pytest.fixture
def fast_plan(monkeypatch):
    streams = {"current": SimpleNamespace(ptr=7)}
    monkeypatch.setattr(plan_module, "_NDARRAY", _Array)
    monkeypatch.setattr(plan_module, "_current_device", lambda: 0)
    monkeypatch.setattr(plan_module, "_current_stream", lambda: streams["current"])
    monkeypatch.setattr(plan_module, "_capturing", lambda pointer: False)
    written = []
    plan = plan_module.Plan(choice=None, problem=None, shape=(4, 4), dtype="float32", device=0,
                            launch=lambda pa, pb, pc, alpha, beta, stream: written.append(pc))
    plan.spares, plan.recycled = plan_module.collections.deque(maxlen=1), plan_module.collections.deque(maxlen=1)
    b = SimpleNamespace(data=_Pointer())

    def call():
        return plan.call_fast(None, b, 0, 1.0)

    return SimpleNamespace(call=call, written=written, streams=streams)


def test_an_output_the_caller_dropped_is_written_again_without_an_allocation(fast_plan):
    fast_plan.call()  # (dropped at once, as a loop that consumes each result before the next call does)
    fast_plan.call()
    made = _Array.made
    for _ in range(5):
        fast_plan.call()
    assert len(set(fast_plan.written[1:])) == 1  # one output, the same lines of L2 each call
    assert _Array.made == made  # and nothing allocated before or after the launch


@pytest.mark.parametrize("holder", ["the array", "a view", "its memory pointer"])
def test_an_output_still_held_is_never_written_again(fast_plan, holder):
    kept = fast_plan.call()
    held = {"the array": kept, "a view": _Array(base=kept), "its memory pointer": kept.data}[holder]
    del kept
    gc.collect()
    for _ in range(3):
        fast_plan.call()
    first = fast_plan.written[0]
    assert fast_plan.written.count(first) == 1, holder  # the held output's memory was written once only
    assert held is not None


def test_another_stream_takes_a_buffer_of_its_own(fast_plan):
    fast_plan.call()
    fast_plan.streams["current"] = SimpleNamespace(ptr=8)
    fast_plan.call()
    assert fast_plan.written[0] != fast_plan.written[1]
