"""Test setup: GPU tests (marked `gpu`) are skipped automatically where no CUDA GPU is usable."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def gpu_available() -> tuple[bool, str]:
    try:
        import cupy
    except ImportError as exc:
        return False, f"CuPy is not installed ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device, insufficient driver: all mean "no GPU here"
        return False, f"no usable CUDA GPU ({type(exc).__name__}: {exc})"
    return (count > 0, "no CUDA GPU found") if count == 0 else (True, "")


def pytest_collection_modifyitems(config, items):
    ok, why = gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test reads and writes tuned results, studies and compiled kernels in a cache
    directory of its own, never the user's."""
    monkeypatch.setenv("AUTOGEMM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
