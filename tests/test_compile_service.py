"""The campaign's one compile pool, served to worker processes over pipes: results and compile
errors come back as a local pool's would, a dying compile process fails only what it held, and
the pool outlives each tune's evaluator."""

from __future__ import annotations

import multiprocessing
from concurrent.futures.process import BrokenProcessPool

import pytest

from autogemm.kernels.compile import CompileError
from autogemm.kernels.compile_service import CompileService, RemoteCompilePool
from autogemm.families import SimtConfig
from autogemm.problem import Problem
from autogemm.kernels.render import render

import compile_stubs


def _sources(count: int):
    return [render(SimtConfig(group_m=g), Problem(256, 256, 256)) for g in range(1, count + 1)]


def _use_remote(conn, names, queue) -> None:
    """A worker process: compiles through the service, reports what came back."""
    pool = RemoteCompilePool(conn)
    futures = [pool.submit(compile_stubs.compile_or_die, source, "sm_90") for source in _sources(len(names))]
    queue.put([f.result(timeout=60) for f in futures])


def test_two_worker_processes_compile_in_one_shared_pool():
    service = CompileService(2)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    names = ["a", "b"]  # group_m 1 and 2: neither kills its compile process
    workers = [context.Process(target=_use_remote, args=(service.connect(), names, queue)) for _ in range(2)]
    for w in workers:
        w.start()
    results = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join()
    service.close()
    expected = [f"/nonexistent/{s.kernel}.cubin" for s in _sources(2)]
    assert results == [expected, expected]


def test_errors_and_a_dying_compile_process_come_back_as_a_local_pool_gives_them():
    service = CompileService(2)
    pool = RemoteCompilePool(service.connect())
    sources = _sources(4)  # group_m 3 kills its compile process
    futures = [pool.submit(compile_stubs.compile_or_die, source, "sm_90") for source in sources]
    outcomes = []
    for future in futures:
        try:
            outcomes.append(future.result(timeout=60))
        except BrokenProcessPool:
            outcomes.append("broken")
    assert outcomes[2] == "broken"
    # the next request gets a fresh pool
    again = pool.submit(compile_stubs.compile_or_die, sources[0], "sm_90").result(timeout=60)
    assert again == f"/nonexistent/{sources[0].kernel}.cubin"
    failing = pool.submit(compile_stubs.compile_error, sources[0], "sm_90")
    with pytest.raises(CompileError, match="made-up error"):
        failing.result(timeout=60)
    pool.shutdown()  # a tune's evaluator closing: the shared pool goes on
    assert pool.submit(compile_stubs.compile_or_die, sources[1], "sm_90").result(timeout=60).endswith(".cubin")
    service.close()


def test_a_gone_service_fails_what_was_pending_and_what_comes_after():
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    pool = RemoteCompilePool(theirs)
    pending = pool.submit(compile_stubs.compile_or_die, _sources(1)[0], "sm_90")
    ours.close()
    with pytest.raises(BrokenProcessPool):
        pending.result(timeout=30)
    with pytest.raises(BrokenProcessPool):
        pool.submit(compile_stubs.compile_or_die, _sources(1)[0], "sm_90")


def test_an_evaluator_of_a_campaign_worker_compiles_in_the_shared_pool_and_leaves_it_open():
    from autogemm.kernels.compile import share_compile_pool, shared_compile_pool
    from autogemm.measure.evaluate import CompileAheadEvaluator

    service = CompileService(1)
    remote = RemoteCompilePool(service.connect())
    share_compile_pool(remote)
    try:
        evaluator = CompileAheadEvaluator.__new__(CompileAheadEvaluator)
        evaluator._start_pool(4)
        assert evaluator._pool is remote
        evaluator.close()
        assert shared_compile_pool() is remote and not remote._broken
    finally:
        share_compile_pool(None)
        service.close()
