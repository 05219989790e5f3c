"""Hardening on a GPU (issue 14): memory stays flat over many measured candidates, verification
catches a few wrong elements, out-of-memory and Python errors are candidate failures, a tune goes
on when compiled kernels cannot be stored, a hung kernel does not outlive a killed tuner, and many
threads calling `matmul` with tune=True on new shapes get correct results from one tune each."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_isolate import gone, wait_until_gone

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent
MiB = 2**20


def _free_bytes() -> int:
    import cupy

    cupy.cuda.Device().synchronize()
    return cupy.cuda.runtime.memGetInfo()[0]


@pytest.mark.exhaustive  # 200 compilations and measurements: ~20 s, too long for the quick tier
def test_memory_stays_flat_over_200_measured_candidates():
    """Every measured candidate's module stayed loaded (cupy.RawModule memoizes them all)."""
    from autogemm.kernels.compile import compile_many
    from autogemm.measure.evaluate import GpuMeasurer
    from autogemm.families import SimtConfig
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem
    from autogemm.kernels.render import render

    device = current_device()
    problem = Problem(256, 256, 256)
    configs = []
    for group_m, smem, stages in itertools.product(range(1, 35), ("plain", "pad", "swizzle"), (2, 3)):
        config = SimtConfig(64, 64, 8, 32, 32, 4, 8, 4, 4, stages, smem, group_m, 1)
        if not config.check(problem, device):
            configs.append(config)
    configs = configs[:200]
    assert len({c.name for c in configs}) == 200
    compile_many([render(c, problem) for c in configs], device.arch, jobs=max(1, (os.cpu_count() or 2) - 1))
    measurer = GpuMeasurer(problem, device)
    free = {0: _free_bytes()}
    for i, config in enumerate(configs, 1):
        result = measurer.measure(config, None, repeats=1)
        assert result.ok, (config.name, result.kind, result.message)
        if i in (1, 20, 100, 200):
            free[i] = _free_bytes()
    grown = (free[20] - free[200]) / MiB
    print("device memory in use after n candidates (MiB):",
          {i: round((free[0] - f) / MiB, 1) for i, f in free.items()})
    # The driver takes device memory for modules in 2 MiB steps (about 60 SIMT modules each on an
    # H100): kept modules grew it by 4 MiB over these 180 candidates, unloaded ones by nothing.
    assert grown < 2, f"{grown:.1f} MiB more in use after 180 more candidates"


def test_a_few_wrong_elements_fail_verification(monkeypatch):
    """Six zeroed outputs of 1024x1024 FP16 stay under the 1e-2 norm-wise tolerance; the
    element-wise bound fails the candidate."""
    import autogemm.gpu.launch as launch
    from autogemm.measure.evaluate import GpuMeasurer
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem
    from autogemm.serving.select import default_config

    device = current_device()
    problem = Problem(1024, 1024, 256, dtype="float16")
    config = default_config(problem, device)
    measurer = GpuMeasurer(problem, device)
    assert measurer.measure(config, None, repeats=1).ok
    real_bind = launch.bind

    def corrupting_bind(config, a, b, c=None, **kwargs):
        run, c = real_bind(config, a, b, c, **kwargs)

        def run_and_corrupt(stream=None):
            run(stream)
            c[3, 5] = c[100, 1000] = c[511, 0] = c[512, 512] = c[1000, 3] = c[1023, 1023] = 0

        return run_and_corrupt, c

    monkeypatch.setattr(launch, "bind", corrupting_bind)
    result = measurer.measure(config, None, repeats=1)
    assert not result.ok and result.kind == "wrong", result
    assert "6 element(s) outside the error bound" in result.message and result.rel_error <= 1e-2


def test_out_of_memory_and_python_errors_are_candidate_failures(monkeypatch):
    import cupy

    import autogemm.gpu.launch as launch
    from autogemm.measure.evaluate import GpuMeasurer
    from autogemm.families import SimtConfig
    from autogemm.gpu.launch import current_device
    from autogemm.problem import Problem

    device = current_device()
    measurer = GpuMeasurer(Problem(128, 128, 128), device)

    def allocate_too_much(*args, **kwargs):
        cupy.empty(2**50, dtype=cupy.uint8)  # a petabyte

    monkeypatch.setattr(launch, "bind", allocate_too_much)
    result = measurer.measure(SimtConfig(), None, repeats=1)
    assert result.kind == "oom" and "OutOfMemoryError" in result.message

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(launch, "bind", broken)
    result = measurer.measure(SimtConfig(), None, repeats=1)
    assert result.kind == "error" and "TypeError: unsupported operand" in result.message
    monkeypatch.undo()
    assert measurer.measure(SimtConfig(), None, repeats=1).ok  # the measurer is still good


@pytest.mark.long(seconds=8)
def test_a_tune_goes_on_when_compiled_kernels_cannot_be_stored(tmp_path, monkeypatch):
    """A cubin directory that cannot be written (here: below a regular file, which fails even
    for root) failed every candidate, then the tune."""
    from autogemm.results.cache import TuningCache
    from autogemm.problem import Problem
    from autogemm.tuning.tuner import tune

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(blocker / "cubins"))
    cache = TuningCache(tmp_path / "cache", shipped=False)
    result = tune(Problem(192, 160, 128), trials=6, timeout=120, storage=":memory:", cache=cache,
                  space=str(HERE / "data" / "simt_small.toml"))
    assert result.valid >= 1 and result.unstored_kernels >= result.valid
    assert "cannot store compiled kernels" in result.storage_error and result.cache_path
    assert result.rel_error <= 1e-5


HANG_SCRIPT = """
import os, sys
from autogemm.families import SimtConfig
from autogemm.measure.isolate import IsolatedEvaluator
from autogemm.gpu.launch import current_device
from autogemm.problem import Problem

evaluator = IsolatedEvaluator(Problem(512, 512, 512), current_device(), jobs=2, timeout=600)
evaluator.cublas_ms  # started
print(evaluator._process.pid, flush=True)
evaluator.verify(SimtConfig(64, 64, 8, 32, 32, 4, 8, 4, 4, 2, "pad", 5, 1))  # group_m 5: spins forever
"""


@pytest.mark.long(seconds=14)
def test_a_killed_tuner_leaves_no_hung_kernel_behind(tmp_path):
    """A tuner killed outright while its measuring process waited on a spinning kernel left that
    process, and the kernel, running."""
    env = dict(os.environ, AUTOGEMM_TEMPLATE_DIR=str(HERE / "broken_templates"))
    tuner = subprocess.Popen([sys.executable, "-c", HANG_SCRIPT], stdout=subprocess.PIPE, text=True, env=env)
    try:
        measuring = int(tuner.stdout.readline())
        time.sleep(8)  # compiled and spinning by now
        assert tuner.poll() is None and not gone(measuring)
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
        deadline = time.monotonic() + 60
        assert wait_until_gone(measuring, 60), "the measuring process outlived the killed tuner"
        while str(measuring) in _gpu_processes() and time.monotonic() < deadline:
            time.sleep(0.5)  # the driver tears the context (and the spinning kernel) down
        assert str(measuring) not in _gpu_processes(), "its context is still on the GPU"
    finally:
        tuner.kill()


def _gpu_processes() -> list[str]:
    return subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()


SHAPES = [(97, 131, 64), (128, 96, 200), (33, 257, 129), (255, 255, 255), (64, 300, 17), (300, 64, 96),
          (1, 512, 256), (512, 1, 256), (160, 160, 160), (7, 7, 7), (211, 97, 301), (96, 211, 128),
          (256, 128, 64), (128, 256, 320), (77, 333, 91), (333, 77, 45), (144, 176, 208), (48, 400, 100),
          (400, 48, 100), (257, 129, 65)]


@pytest.mark.exhaustive  # 20 tunes one after another: about 2 minutes on an H100
def test_many_threads_on_new_shapes_with_tune_get_correct_results_from_one_tune_each(monkeypatch):
    """4 threads x 50 calls of matmul(tune=True) over 20 shapes nobody tuned: the second thread to
    need a tune got TuneError from the study lock, and every thread built its own plan."""
    import cupy

    import autogemm
    import autogemm.serving.planning as planning
    import autogemm.tuning.tuner as tuner
    from autogemm.measure.bench import check_result, random_uniform
    from autogemm.problem import Problem

    monkeypatch.setattr(planning, "AUTOTUNE_TRIALS", 2)
    monkeypatch.setattr(planning, "AUTOTUNE_TIMEOUT_S", 5.0)
    tunes: list[str] = []
    real_tune = tuner.tune

    def counted_tune(problem, **kwargs):
        tunes.append(problem.key)
        return real_tune(problem, **kwargs)

    monkeypatch.setattr(tuner, "tune", counted_tune)
    operands = {shape: (random_uniform(shape[::2], seed=i), random_uniform(shape[2:0:-1], seed=i + 100))
                for i, shape in enumerate(SHAPES)}  # a: m x k, b: k x n
    autogemm.reset()
    errors: list[str] = []

    def worker(offset: int) -> None:
        try:
            for call in range(50):
                m, n, k = shape = SHAPES[(offset * 5 + call) % len(SHAPES)]
                a, b = operands[shape]
                result = autogemm.matmul(a, b, tune=True)
                cupy.cuda.get_current_stream().synchronize()
                verdict = check_result(result, a, b, Problem(m, n, k))
                if not verdict.ok:
                    errors.append(f"{shape}: {verdict.message}")
        except Exception as exc:  # collected: every thread must finish without one
            errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    autogemm.reset()
    print(f"4 threads x 50 calls over {len(SHAPES)} new shapes, tune=True: {time.perf_counter() - started:.1f} s, "
          f"{len(tunes)} tunes")
    assert not errors, errors[:5]
    assert sorted(tunes) == sorted(Problem(*shape).key for shape in SHAPES)  # one tune per problem
