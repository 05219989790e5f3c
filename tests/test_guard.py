"""The online guard's decision and its memory, without a GPU: CUDA events replaced by a stand-in
whose elapsed times are given, the user cache a temporary one."""

from __future__ import annotations

import sys
import types

import pytest

from autogemm.results.cache import TuningCache
from autogemm.families import SimtConfig
from autogemm.problem import Device, Problem
from autogemm.serving.select import choose

CONFIG = SimtConfig(64, 128, 16, 32, 64, 8, 8, 4, 4, 3, "swizzle", 8, 1, 1)


class _Event:
    clock = 0.0

    def __init__(self):
        self.at, self.done = None, True

    def record(self, stream=None):
        self.at = _Event.clock


@pytest.fixture
def fake_cupy(monkeypatch):
    """A CuPy whose events read a clock that each launcher advances by its own cost."""
    import autogemm.serving.guard

    cuda = types.SimpleNamespace(Event=_Event, get_current_stream=lambda: types.SimpleNamespace(ptr=0),
                                 get_elapsed_time=lambda start, stop: stop.at - start.at)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(autogemm.serving.guard, "capturing", lambda stream_pointer: False)  # no graph is captured
    return cuda


def _launcher(cost_ms, calls):
    def launch(pa, pb, pc, alpha, beta, stream=None):
        _Event.clock += cost_ms
        calls.append(cost_ms)
    return launch


@pytest.mark.parametrize("kernel_ms,won", [(2.0, False), (0.5, True), (0.995, False)])
def test_the_guard_alternates_then_hands_the_plan_to_the_winner(fake_cupy, kernel_ms, won):
    from autogemm.serving.guard import GUARD_CALLS, Guard

    calls, settled = [], []
    guard = Guard(_launcher(kernel_ms, calls), _launcher(1.0, calls), lambda winner, v: settled.append(v))
    for _ in range(2 * GUARD_CALLS):
        guard(0, 0, 0, 1.0, 0.0)
    assert calls == [kernel_ms, 1.0] * GUARD_CALLS and not settled
    guard(0, 0, 0, 1.0, 0.0)  # the events are done: this call decides, then serves the winner
    (verdict,) = settled
    assert verdict["kernel_won"] is won and verdict["ratio"] == pytest.approx(1.0 / kernel_ms)
    assert calls[-1] == (kernel_ms if won else 1.0)


def test_while_the_events_are_pending_the_fallback_serves(fake_cupy):
    from autogemm.serving.guard import GUARD_CALLS, Guard

    calls, settled = [], []
    guard = Guard(_launcher(0.5, calls), _launcher(1.0, calls), lambda winner, v: settled.append(v))
    for _ in range(2 * GUARD_CALLS):
        guard(0, 0, 0, 1.0, 0.0)
    guard._events[-1][1].done = False
    guard(0, 0, 0, 1.0, 0.0)
    assert calls[-1] == 1.0 and not settled


def test_a_loss_is_remembered_as_a_cublas_record_that_is_no_evidence(tmp_path):
    """remember_loss files a cuBLAS record naming the kernel that lost: the next process serves cuBLAS
    for that problem (and says why), and the predictor does not learn from the guard's figures."""
    from autogemm.serving.guard import remember_loss
    from autogemm.results.predict import candidates

    device = Device.for_arch("sm_90")
    problem = Problem(2048, 2048, 2048)
    cache = TuningCache(tmp_path, shipped=False)
    remember_loss(cache, device, problem, CONFIG, {"kernel_ms": 2.0, "fallback_ms": 1.0, "ratio": 0.5,
                                                    "kernel_won": False})
    record, source = cache.lookup(problem, device.slug)
    assert (source, record.is_cublas, record.study, record.protocol) == ("user", True, "guard", 1)
    choice = choose(problem, device, (record, source), [record])
    assert choice.config is None and "0.500x" in choice.reason and "under the online guard" in choice.reason
    assert candidates(Problem(2048, 2048, 2000), device, [record]) == []


def test_remember_loss_on_a_cache_that_cannot_be_written_warns(tmp_path):
    from autogemm.results.cache import CacheWarning
    from autogemm.serving.guard import remember_loss

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(CacheWarning, match="cannot remember"):
        remember_loss(TuningCache(blocker / "cache", shipped=False), Device.for_arch("sm_90"), Problem(64, 64, 64),
                      CONFIG, {"kernel_ms": 2.0, "fallback_ms": 1.0, "ratio": 0.5, "kernel_won": False})


def test_under_a_graph_capture_the_fallback_serves_untimed(fake_cupy, monkeypatch):
    """A call captured into a CUDA graph is replayed later, where no event of the guard's would
    time it: the fallback serves it, and the guard neither counts nor decides."""
    import autogemm.serving.guard
    from autogemm.serving.guard import GUARD_CALLS, Guard

    monkeypatch.setattr(autogemm.serving.guard, "capturing", lambda stream_pointer: True)
    calls, settled = [], []
    guard = Guard(_launcher(0.5, calls), _launcher(1.0, calls), lambda winner, v: settled.append(v))
    for _ in range(2 * GUARD_CALLS + 1):
        guard(0, 0, 0, 1.0, 0.0)
    assert calls == [1.0] * (2 * GUARD_CALLS + 1) and not settled
    assert all(start.at is None and stop.at is None for start, stop in guard._events)
