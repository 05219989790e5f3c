"""Test setup: GPU tests (marked `gpu`) are skipped automatically where no CUDA GPU is usable; the
exhaustive GPU samples (marked `exhaustive`) run only with `--exhaustive`. Every test keeps tuned
results and studies in a cache directory of its own; compiled kernels, which are keyed by their
source digest, are shared by the whole run, all pytest-xdist workers (so that kernels compiled ahead
in parallel serve every test)."""

from __future__ import annotations

import functools
import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--exhaustive", action="store_true",
                     help="also run the exhaustive GPU samples (tests marked exhaustive; minutes on an H100)")


def pytest_configure(config):
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("quick", max_examples=20, derandomize=True)
    settings.register_profile("exhaustive", max_examples=80)
    settings.load_profile("exhaustive" if config.getoption("--exhaustive") else "quick")


@functools.lru_cache(maxsize=1)
def gpu_available() -> tuple[bool, str]:
    """Whether a CUDA GPU is usable, and where not, why: in the words the command line uses."""
    from autogemm.gpu.runtime import GpuUnavailable, require_gpu

    try:
        require_gpu()
    except GpuUnavailable as exc:  # no CuPy, no driver, no device, an insufficient driver
        return False, str(exc)
    return True, ""


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--exhaustive"):
        skip = pytest.mark.skip(reason="an exhaustive sample: run with --exhaustive")
        for item in items:
            if "exhaustive" in item.keywords:
                item.add_marker(skip)
    ok, why = gpu_available()
    if not ok:
        skip = pytest.mark.skip(reason=why)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _shared_cubins(tmp_path_factory):
    """One cubin directory for the run, shared by pytest-xdist's workers too (the parent of a worker's
    base temporary directory is the run's): a kernel one worker compiled is found by the others. Cubins
    are stored atomically with their digests (kernels/compile.py), so concurrent compilers are safe."""
    before = os.environ.get("AUTOGEMM_CUBIN_DIR")
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # (not under pytest-xdist)
        shared = tmp_path_factory.mktemp("cubin")
    else:
        shared = tmp_path_factory.getbasetemp().parent / "cubin"
        shared.mkdir(exist_ok=True)
    os.environ["AUTOGEMM_CUBIN_DIR"] = str(shared)
    yield
    if before is None:
        os.environ.pop("AUTOGEMM_CUBIN_DIR", None)
    else:
        os.environ["AUTOGEMM_CUBIN_DIR"] = before


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch, request):
    """Every test reads and writes tuned results and studies in a cache directory of its own,
    never the user's; and sees no shipped results (cache/ holds records for the GPUs the GPU tests
    run on, which would answer problems a test means to be untuned) unless it is marked
    `shipped_results`."""
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    if "shipped_results" not in request.keywords:
        monkeypatch.setattr("autogemm.results.cache.shipped_cache_dir", lambda: None)
