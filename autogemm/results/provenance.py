"""Where a measurement comes from: the date, the host and the versions of everything that can change
a kernel's behaviour. Tuned records carry them (`cache.Record`), so that results merged from many
hosts and runs (`results/merge.py`) still say where each came from."""

from __future__ import annotations

import datetime
import socket
from typing import Any

from ..kernels import nvrtc
from ..version import __version__


def host() -> str:
    return socket.gethostname()


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def runtime_versions() -> dict[str, Any]:
    """autogemm, CuPy, CUDA runtime, driver and NVRTC versions (a change can break a kernel). NVRTC's is the
    release that compiles autogemm's kernels (kernels/nvrtc.py), which need not be CuPy's own."""
    versions = {"autogemm": __version__}
    try:
        import cupy  # (lazy: CuPy)

        versions["cupy"] = cupy.__version__
        runtime = cupy.cuda.runtime.runtimeGetVersion()
        driver = cupy.cuda.runtime.driverGetVersion()
        versions["cuda_runtime"] = f"{runtime // 1000}.{runtime % 1000 // 10}"
        versions["driver_api"] = f"{driver // 1000}.{driver % 1000 // 10}"
    except Exception:  # no GPU runtime here: record what is known
        pass
    compiler = nvrtc_release()
    if compiler:
        versions["nvrtc"] = compiler
    return versions


def nvrtc_release() -> str:
    """The release ("13.0") of the NVRTC that compiles kernels in this process; "" where it cannot be loaded."""
    try:
        major, minor = nvrtc.version()
    except nvrtc.NvrtcError:
        return ""
    return f"{major}.{minor}"
