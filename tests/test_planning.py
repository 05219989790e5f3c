"""`matmul`'s per-process state without a GPU: many threads asking for one new plan build it once;
the plan memo is bounded (least recently used go first); tunes asked for by many threads run one at
a time and once per problem; a tune running in another process is waited for, never raised."""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

import autogemm.serving.planning as planning
import autogemm.tuning.tuner as tuner
from autogemm.results.cache import TuningCache
from autogemm.serving.planning import Dispatcher
from autogemm.problem import Device, Problem
from test_cache import SLUG, make_record

DEVICE = Device(name="Test GPU", compute_capability=(9, 0), sm_count=132, smem_per_block_optin=227 * 1024,
                smem_per_sm=228 * 1024)


class Plan:
    provisional_until = None
    fast_key = None

    def __init__(self, key):
        self.key = key

    def expired(self):
        return False


def test_one_thread_builds_a_new_plan_while_the_others_wait():
    """Each thread used to build the plan (cache lookups, compilation, a tune) itself."""
    dispatcher = Dispatcher(cache=object())
    builds: dict[int, int] = {}
    lock = threading.Lock()

    def build(key):
        with lock:
            builds[key] = builds.get(key, 0) + 1
        time.sleep(0.05)  # long enough for every thread to arrive while it is being built
        return Plan(key)

    def call(i):
        key = i % 10
        plan = dispatcher.plan_for(key, lambda: build(key))
        assert plan.key == key

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(call, range(8 * 50)))
    assert builds == {key: 1 for key in range(10)}


def test_when_a_build_fails_each_waiting_thread_tries_in_turn():
    dispatcher = Dispatcher(cache=object())
    attempts = []

    def build():
        attempts.append(threading.get_ident())
        time.sleep(0.02)
        if len(attempts) == 1:
            raise RuntimeError("compile worker lost")
        return Plan("k")

    def call(_):
        try:
            return dispatcher.plan_for("k", build).key
        except RuntimeError:
            return "failed"

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(call, range(6)))
    assert results.count("failed") == 1 and results.count("k") == 5 and len(attempts) == 2


def test_the_plan_memo_is_bounded_and_keeps_the_recently_used(monkeypatch):
    """A program with many shapes grew the memo without limit."""
    monkeypatch.setattr(planning, "MAX_PLANS", 3)
    dispatcher = Dispatcher(cache=object())
    for key in range(3):
        dispatcher.plan_for(key, lambda key=key: Plan(key), fast_key=("fast", key))
    dispatcher.plan_for(0, lambda: pytest.fail("plan 0 is memoized"))  # 0 is now the most recent
    for key in (3, 4):
        dispatcher.plan_for(key, lambda key=key: Plan(key), fast_key=("fast", key))
    assert list(dispatcher.plans) == [0, 3, 4]
    assert set(dispatcher.fast) == {("fast", 0), ("fast", 3), ("fast", 4)}  # evicted plans leave the fast path


@pytest.fixture
def cache(tmp_path):
    return TuningCache(tmp_path, shipped=False)


def test_tunes_asked_for_by_many_threads_run_once_per_problem_one_at_a_time(cache, monkeypatch):
    """The second thread to tune a problem got TuneError from the study lock; tunes of different
    problems ran at once on one GPU, timing each other."""
    running, most, tuned = [0], [0], []
    lock = threading.Lock()

    def fake_tune(problem, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            tuned.append(problem.key)
        time.sleep(0.05)
        cache.store(make_record(problem.m), SLUG)
        with lock:
            running[0] -= 1
        return type("Result", (), {"valid": 3, "ratio": 1.1, "kept_cublas": False})()

    monkeypatch.setattr(tuner, "tune", fake_tune)
    dispatcher = Dispatcher(cache)
    problems = [Problem(m, 64, 64) for m in (96, 160, 224, 288, 352)]

    def call(i):
        return dispatcher.select(problems[i % len(problems)], DEVICE, tune=True)

    with ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(call, range(40)))
    assert sorted(tuned) == sorted(p.key for p in problems) and most[0] == 1
    assert all(choice.source in ("autotune", "cache") and not choice.provisional for choice in choices)


def test_a_tune_running_in_another_process_is_waited_for_not_raised(cache, monkeypatch):
    """With the study lock held elsewhere, the call waits for that tune; when it outlasts the wait,
    the call is served without tuning (a provisional choice, planned again later)."""
    from autogemm.tuning.study import lock_study

    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(cache.directory))
    monkeypatch.setattr(planning, "WAIT_FOR_TUNE_S", 0.5)
    name = "float32-elsewhere"

    def fake_tune(problem, **kwargs):
        raise tuner.TuneRunning(f"another autogemm tune is already running study {name}", name)

    monkeypatch.setattr(tuner, "tune", fake_tune)
    held = lock_study(name)
    try:
        started = time.monotonic()
        choice = Dispatcher(cache).select(Problem(96, 64, 64), DEVICE, tune=True)
        assert choice.provisional and choice.source in ("cublas", "predicted") and time.monotonic() - started >= 0.5
    finally:
        held.release()

    locked = threading.Event()

    def finish_elsewhere():  # the other tuner holds the study, caches its result and ends
        held_elsewhere = lock_study(name)
        locked.set()
        time.sleep(0.2)
        cache.store(make_record(96), SLUG)
        held_elsewhere.release()

    monkeypatch.setattr(planning, "WAIT_FOR_TUNE_S", 10.0)
    threading.Thread(target=finish_elsewhere).start()
    locked.wait()
    choice = Dispatcher(cache).select(Problem(96, 64, 64), DEVICE, tune=True)
    assert choice.source == "cache" and not choice.provisional


def test_a_failed_tune_is_a_warning_and_the_call_is_served(cache, monkeypatch):
    def fake_tune(problem, **kwargs):
        raise tuner.TuneError("no configuration was measured")

    monkeypatch.setattr(tuner, "tune", fake_tune)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = Dispatcher(cache).select(Problem(96, 64, 64), DEVICE, tune=True)
    assert choice.source in ("cublas", "predicted")
    assert any("tuning" in str(w.message) and "no configuration was measured" in str(w.message) for w in caught)


def test_a_race_runs_once_per_problem_and_its_winner_becomes_the_choice(monkeypatch):
    """The first-call race (autogemm.serving.race) is memoized per problem for the process: other plans of
    the same problem (strides, alignment) reuse its winner; reset() forgets it."""
    import autogemm.serving.race as race
    from autogemm.serving.select import choose
    from test_select import OTHER, TUNED, _record

    races = []

    def fake_run(entrants, check):
        races.append(sorted(entrants))
        return race.RaceResult(TUNED.name, {race.CUBLAS: 2.0, TUNED.name: 1.0, OTHER.name: 1.5})

    monkeypatch.setattr(race, "run_race", fake_run)
    records = [_record(Problem(512, 512, 512), TUNED, ratio=0.9), _record(Problem(600, 600, 600), OTHER, ratio=0.8)]
    problem = Problem(500, 500, 500)
    choice = choose(problem, DEVICE, None, records)
    assert choice.source == "cublas" and [c.config for c in choice.ranked] == [TUNED, OTHER]  # the model says cuBLAS

    dispatcher = Dispatcher(cache=object())
    entrants = {race.CUBLAS: None, TUNED.name: None, OTHER.name: None}
    raced = dispatcher.race(problem, DEVICE, choice, lambda: (entrants, None))
    again = dispatcher.race(problem, DEVICE, choice, lambda: pytest.fail("raced twice"))
    assert len(races) == 1 and races[0] == sorted(entrants)
    for c in (raced, again):
        assert (c.source, c.config) == ("race", TUNED) and "2.000x cuBLAS" in c.reason
        assert c.details["race"]["times_ms"][race.CUBLAS] == 2.0 and c.details["candidates"]
    dispatcher.clear()
    dispatcher.race(problem, DEVICE, choice, lambda: (entrants, None))
    assert len(races) == 2


def test_a_race_cublas_wins_is_served_by_cublas():
    import autogemm.serving.race as race
    from autogemm.serving.select import choose
    from test_select import TUNED, _record

    choice = choose(Problem(500, 500, 500), DEVICE, None, [_record(Problem(512, 512, 512), TUNED, ratio=0.9)])
    result = race.RaceResult(race.CUBLAS, {race.CUBLAS: 1.0, TUNED.name: 1.2}, {"x": "differs from cuBLAS"})
    raced = race.race_choice(choice, result)
    assert (raced.source, raced.config) == ("race", None) and "cuBLAS won" in raced.reason
    assert "raced 3 entrants" in raced.reason and result.margin == 1.0


def test_binding_reaches_the_names_each_fast_path_reads(monkeypatch):
    """matmul's fast paths read CuPy's and PyTorch's names as module globals of the module they run
    in (dispatch.matmul: the operand types; plan.Plan.call_fast and call_torch: the device, stream and
    allocation functions): binding them once must reach both modules."""
    import sys
    import types

    cupy = pytest.importorskip("cupy")
    from autogemm.serving import dispatch, plan

    for module, names in ((dispatch, ("_NDARRAY", "_TENSOR")),
                          (plan, ("_NDARRAY", "_current_device", "_current_stream", "_torch_raw_stream",
                                  "_torch_empty_like"))):
        for name in names:
            monkeypatch.setattr(module, name, None)
    torch = types.SimpleNamespace(Tensor=type("Tensor", (), {}), empty_like=lambda template: template,
                                  _C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 1234))
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert dispatch._bind_cupy() is cupy
    dispatch._bind_torch()
    assert dispatch._NDARRAY is plan._NDARRAY is cupy.ndarray and dispatch._TENSOR is torch.Tensor
    assert (plan._current_device, plan._current_stream) == (cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream)
    assert plan._torch_empty_like is torch.empty_like and plan._torch_raw_stream(0) == 1234
