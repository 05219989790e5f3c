"""The online guard on a GPU: a predicted kernel that is in truth slow is compared with the served
cuBLAS on the user's first calls, dropped for the process, and remembered in the user cache."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.gpu

# 16x16 tiles, one stage, scalar loads: several times slower than cuBLAS on 2048^3 FP32
SLOW = dict(bm=16, bn=16, bk=8, wm=16, wn=8, tm=2, tn=2, vec=1, vec_frag=1, stages=1, smem="pad", group_m=1,
            split_k=1, min_blocks=1)


def _claimed_win(problem, config, device):
    """A record of a nearby shape, under the current protocol, that claims `config` beats cuBLAS
    by 1.5x: what a prediction would carry from a record that lies, or from a model that errs."""
    from autogemm.results.cache import Record
    from autogemm.kernels.render import kernel_digest, kernel_template_hash
    from autogemm.measure.timing import PROTOCOL

    cublas_ms = problem.flops / 40e12 * 1e3
    return Record(problem=problem.key, family=config.family,
                  config={k: v for k, v in config.to_dict().items() if k != "family"}, config_name=config.name,
                  time_ms=cublas_ms / 1.5, tflops=60.0, cublas_ms=cublas_ms, cublas_tflops=40.0, ratio=1.5,
                  rel_error=1e-7, template_hash=kernel_template_hash(config.template), device=device.name,
                  date="2026-11-25T00:00:00+00:00", source_digest=kernel_digest(config, problem), protocol=PROTOCOL)


def test_the_guard_drops_a_slow_predicted_kernel_within_its_first_calls():
    import cupy

    import autogemm
    from autogemm.measure.bench import random_uniform, reference_gemm, relative_error
    from autogemm.results.cache import TuningCache
    from autogemm.families import SimtConfig
    from autogemm.serving.guard import GUARD_CALLS
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem

    device = current_device()
    config = SimtConfig(**SLOW)
    cache = TuningCache()
    cache.store(_claimed_win(Problem(2048, 2048, 1792), config, device), device.slug)
    autogemm.reset()
    a, b = random_uniform((2048, 2048), seed=1), random_uniform((2048, 2048), seed=2)
    before = autogemm.explain(a, b)
    assert (before["source"], before["config"], before["guarded"]) == ("predicted", config.name, True)

    reference = reference_gemm(a, b)
    # Up to three processes' worth of guarding (autogemm.reset between). Under the GPU tier other workers
    # share the card (the isolation tests' hanging kernel holds it for 8 s at a time): the GPU time-slices
    # between processes, and either side's timed calls can hold slices of another's kernels. One tier
    # run ended with the slow kernel still serving after its deciding call. A guard that never drops the
    # slow kernel still fails all three.
    verdicts = []
    for _ in range(3):
        for _ in range(2 * GUARD_CALLS):  # guarded calls: the kernel and cuBLAS take turns, every result right
            assert relative_error(autogemm.matmul(a, b), reference) <= 1e-5
        cupy.cuda.Device().synchronize()
        assert relative_error(autogemm.matmul(a, b), reference) <= 1e-5  # the call that decides
        after = autogemm.explain(a, b)
        if after["config"] is None:
            break
        verdicts.append(after["guard"])
        assert after["guard"] is not None and after["guard"]["kernel_won"], after  # decided, not pending
        autogemm.reset()
    assert after["config"] is None, verdicts  # cuBLAS serves from the deciding call on
    # explained by the verdict in this process, or, once the guard's thread has written the loss to
    # the user cache (sooner on a loaded machine), by that record, which the cache lookup finds first
    # (the ratio is only said to be below 1: under the GPU tier, six workers share the card, their kernels
    # interleave with both sides' timed calls and pull the ratio of a kernel several times slower towards 1;
    # one run measured 0.937)
    if after["source"] == "guard":
        assert after["guard"]["kernel_won"] is False and after["guard"]["ratio"] < 1.0
    else:
        assert after["source"] == "cache" and "under the online guard" in after["reason"], after

    for thread in threading.enumerate():  # the loss is written to the user cache from a thread
        if thread.name == "autogemm-guard":
            thread.join(30)
    record, source = cache.lookup(Problem(2048, 2048, 2048), device.slug)
    assert (source, record.is_cublas, record.study) == ("user", True, "guard")
    assert record.best_generated["config_name"] == config.name and record.best_generated["ratio"] < 1.0
    autogemm.reset()  # a new process, as far as plans go: the record serves cuBLAS, unguarded
    fresh = autogemm.explain(a, b)
    assert (fresh["source"], fresh["config"], fresh["guarded"]) == ("cache", None, False)
    assert "under the online guard" in fresh["reason"]


def test_a_kernel_that_wins_under_the_guard_keeps_serving():
    """The guard's other verdict, on the guard itself with two launchers of known speed: the kernel
    side is cuBLAS, the fallback side cuBLAS three times over; the kernel side wins and serves."""
    import cupy

    from autogemm.measure.bench import random_uniform
    from autogemm.gpu.cublas_gemm import cublas_launcher
    from autogemm.serving.guard import Guard
    from autogemm.gpu.operands import describe
    from autogemm.problem import Problem

    a, b = random_uniform((1024, 1024), seed=3), random_uniform((1024, 1024), seed=4)
    c = cupy.empty((1024, 1024), dtype=a.dtype)
    layouts = [describe(x, name).layout() for x, name in ((a, "a"), (b, "b"), (c, "out"))]
    fast = cublas_launcher(Problem(1024, 1024, 1024), *layouts)

    def slow(*args):
        for _ in range(3):
            fast(*args)

    verdicts = []
    guard = Guard(fast, slow, lambda winner, verdict: verdicts.append((winner, verdict)))
    for _ in range(20):
        guard(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)
        cupy.cuda.Device().synchronize()
    (winner, verdict), = verdicts
    # (the fallback does three times the work; the ratio measured it 1.59x slower once, with six test
    # workers sharing the GPU: the verdict is what this checks, the figure only that it saw the difference)
    assert winner is fast and verdict["kernel_won"] and verdict["ratio"] > 1.2
